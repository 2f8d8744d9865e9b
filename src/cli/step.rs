//! `kiln step`: one AdamW step of the training loop on given token sequences, for parity checks
//! against another trainer (`scripts/gpu_parity.py` compares it with PyTorch): prints the loss
//! and the gradient norm, and writes the model after the step.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use kiln::backends::{DeviceSpec, TrainJob};
use kiln::data::Sample;
use kiln::model::Qwen2Config;
use kiln::model::hf::{self, SaveDtype};
use kiln::train::{AdamWConfig, LoopConfig, NextTokenLoss, Precision, SavePolicy, Start, train};
use serde::Deserialize;

#[derive(Debug, Args)]
pub struct StepArgs {
    /// Hugging Face model directory to start from.
    #[arg(long)]
    model: PathBuf,
    /// JSONL file, one `{"input_ids": [ids]}` per line: one micro-batch of all of them (right
    /// padded, or packed with `--padding-free`), every next token a target, the loss their mean
    /// next-token cross-entropy.
    #[arg(long)]
    data: PathBuf,
    /// Where the model after the step is written (f32; must not exist or be empty).
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value = "cpu", value_parser = super::parse_backend)]
    backend: DeviceSpec,
    /// f32, bf16-mixed, f16-mixed or bf16-pure (as `[train] precision`).
    #[arg(long, default_value = "f32")]
    precision: Precision,
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f64,
    /// Gradient norm clipped to this (0: no clipping).
    #[arg(long, default_value_t = 1.0)]
    max_grad_norm: f64,
    /// The sequences packed into one row without padding (`[train] padding_free`): positions
    /// restarting and attention within each sequence, the same loss as padded.
    #[arg(long)]
    padding_free: bool,
    /// Print `{"loss", "grad_norm", ...}` (the step's metrics record) as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    input_ids: Vec<u32>,
}

/// The sequences of `path`, each checked against the model (`config`, read from `model`): ids
/// inside its vocabulary, lengths within its context.
fn read_sequences(path: &Path, config: &Qwen2Config, model: &Path) -> Result<Vec<Vec<u32>>> {
    let (vocab, context) = (config.vocab_size, config.max_position_embeddings);
    let file = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    let mut sequences = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| path.display().to_string())?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Line = serde_json::from_str(&line).with_context(|| format!("{} line {}", path.display(), i + 1))?;
        if parsed.input_ids.len() < 2 {
            bail!("{} line {}: a sequence needs at least 2 tokens (one target)", path.display(), i + 1);
        }
        if let Some(&bad) = parsed.input_ids.iter().find(|&&id| id as usize >= vocab) {
            bail!("{} line {}: token id {bad} is outside the model's vocabulary ({} has vocab_size {vocab})", path.display(), i + 1, model.join("config.json").display());
        }
        if parsed.input_ids.len() > context {
            bail!("{} line {}: {} tokens, more than the model's context ({context})", path.display(), i + 1, parsed.input_ids.len());
        }
        sequences.push(parsed.input_ids);
    }
    if sequences.is_empty() {
        bail!("{}: no sequences", path.display());
    }
    Ok(sequences)
}

pub fn run(args: StepArgs) -> Result<()> {
    if args.out.read_dir().is_ok_and(|mut d| d.next().is_some()) {
        bail!("--out {} exists and is not empty", args.out.display());
    }
    // The run configs' optimizer checks, named by flag (a NaN --lr wrote a NaN model).
    let flags = [("--lr", args.lr), ("--weight-decay", args.weight_decay), ("--max-grad-norm", args.max_grad_norm)];
    if let Some((flag, value)) = flags.into_iter().find(|(flag, v)| v.is_nan() || v.is_infinite() || (*flag != "--max-grad-norm" && *v < 0.0)) {
        bail!("{flag} must be a finite number{} (got {value})", if flag == "--max-grad-norm" { " (0 or less: no clipping)" } else { " >= 0" });
    }
    let backend = args.backend;
    super::on_cpu_pool(&[backend], || kiln::backends::run_training(backend, StepJob(args)))?
}

struct StepJob(StepArgs);

impl TrainJob for StepJob {
    type Output = Result<()>;

    fn run<B: AutodiffBackend>(self, device: B::Device) -> Result<()> {
        let args = self.0;
        let config = Qwen2Config::from_file(args.model.join("config.json"))?;
        let sequences = read_sequences(&args.data, &config, &args.model)?;
        let batch = sequences.len();
        let scratch = tempfile_dir()?;
        let config = LoopConfig {
            optimizer: AdamWConfig {
                lr: args.lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: args.weight_decay,
                max_grad_norm: (args.max_grad_norm > 0.0).then_some(args.max_grad_norm),
            },
            save: SavePolicy::never(),
            precision: args.precision,
            ..LoopConfig::new(&scratch, 1, args.lr)
        };
        let mut objective = NextTokenLoss::new(sequences.into_iter().map(Sample::all_targets).collect(), batch, 1, 0, 0)?.padding_free(args.padding_free);
        let dir = args.model.clone();
        let start = Start::<B>::new(&config, false, &mut objective, &device, || hf::load::<B>(&dir, &device));
        let mut record = None;
        let trained = start.and_then(|start| train(start, &mut objective, &config, |_| Ok(Default::default()), |r| record = Some(r.clone())));
        std::fs::remove_dir_all(&scratch).ok();
        let (model, _) = trained?;
        // Nothing written from a step the device failed in.
        kiln::backends::device::check::<B>(&device)?;
        hf::save(&model, &args.out, SaveDtype::F32, Some(&args.model)).with_context(|| format!("writing {}", args.out.display()))?;
        let record = record.context("the step wrote no metrics record")?;
        if args.json {
            println!("{}", serde_json::Value::Object(record));
        } else {
            let number = |key: &str| record.get(key).and_then(serde_json::Value::as_f64).unwrap_or(f64::NAN);
            println!("loss {:.6}  grad_norm {:.6}  -> {}", number("loss"), number("grad_norm"), args.out.display());
        }
        Ok(())
    }
}

/// A fresh directory for the loop's own files (metrics, lock), removed after the step.
fn tempfile_dir() -> Result<PathBuf> {
    // (this user's of killed steps go, as far as they can)
    for entry in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name.strip_prefix("kiln-step-").and_then(|rest| rest.split_once('-')).and_then(|(pid, _)| pid.parse::<u32>().ok());
        if pid.is_some_and(kiln::io::pid_is_gone) && kiln::io::owned_by_this_user(&entry.path()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let dir = std::env::temp_dir().join(format!("kiln-step-{}-{}", std::process::id(), std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())));
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    Ok(dir)
}
