//! Evaluates checkpoints end to end on the CPU, as `kiln eval interplay` does, and prints the
//! summary.
//!
//! ```text
//! cargo run --release --example eval                       # self-contained: see below
//! cargo run --release --example eval -- --release ROOT --data DIR
//! cargo run --release --example eval -- --models DIR... --data DIR --out DIR
//! ```
//!
//! Without `--release` or `--models`, the example builds a miniature release under `--work`
//! (default: a `kiln-eval-example` folder in the system's temp directory): two random tiny models
//! in `pretrain/checkpoint-1` and `rl/op11_14_step20`, and a test split of a few rows per op.
//! Running it again resumes: finished models are skipped.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use kiln::backends::Cpu;
use kiln::eval::{EvalEvent, EvalSettings, evaluate, named_models, release_models};
use kiln::model::hf::{self, SaveDtype};
use kiln::model::{Qwen2, Qwen2Config};
use kiln::tasks::interplay::dataset::{Split, write_split};
use kiln::tasks::interplay::eval::EvalData;
use kiln::tasks::interplay::tiny_model::write_tiny_model;

#[derive(Debug, Parser)]
struct Args {
    /// A release root (pretrain/**, rl/**, opd_refkl/** checkpoints).
    #[arg(long, conflicts_with = "models")]
    release: Option<PathBuf>,
    /// Model directories.
    #[arg(long, num_args = 1..)]
    models: Vec<PathBuf>,
    /// Directory of per-op task files (default: the miniature test split).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Output directory (default: RELEASE/evals).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where the miniature release is built.
    #[arg(long, default_value_os_t = std::env::temp_dir().join("kiln-eval-example"))]
    work: PathBuf,
    #[arg(long, default_value_t = 4)]
    samples: usize,
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
}

/// The paper's tokenizer, written from the library's own data into `work/tokenizer`.
fn tokenizer_dir(work: &std::path::Path) -> Result<PathBuf> {
    let dir = work.join("tokenizer");
    write_tiny_model(&dir)?;
    Ok(dir)
}

/// A miniature release and test split under `work` (kept if already there).
fn miniature(work: &std::path::Path) -> Result<(PathBuf, PathBuf)> {
    let release = work.join("release");
    let tokenizer = tokenizer_dir(work)?;
    let config: Qwen2Config = serde_json::from_str(
        r#"{"vocab_size": 2200, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": true,
            "max_position_embeddings": 2048, "rope_theta": 10000.0, "eos_token_id": 3}"#,
    )?;
    for (seed, dir) in ["pretrain/checkpoint-1", "rl/op11_14_step20"].iter().enumerate() {
        let dir = release.join(dir);
        if !dir.join("config.json").is_file() {
            let model: Qwen2<Cpu> = Qwen2::random(&config, seed as u64, &Default::default())?;
            hf::save(&model, &dir, SaveDtype::F32, Some(&tokenizer))?;
        }
    }
    let data = work.join("data");
    if !data.join("test").is_dir() {
        write_split(&data, Split::Test, &[2, 3, 5, 8, 11, 14], 3, 0, false, || {})?;
    }
    Ok((release, data.join("test")))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let (models, data_dir, out) = if let Some(root) = &args.release {
        let data = args.data.clone().context("--data is needed with --release")?;
        (release_models(root)?, data, args.out.clone().unwrap_or_else(|| root.join("evals")))
    } else if !args.models.is_empty() {
        let data = args.data.clone().context("--data is needed with --models")?;
        (named_models(&args.models)?, data, args.out.clone().context("--out is needed with --models")?)
    } else {
        let (root, data) = miniature(&args.work)?;
        eprintln!("miniature release in {}", root.display());
        (release_models(&root)?, args.data.clone().unwrap_or(data), args.out.clone().unwrap_or_else(|| root.join("evals")))
    };
    let data = EvalData::load(&data_dir, Some(10))?;
    let settings = EvalSettings { samples: args.samples, max_new_tokens: args.max_new_tokens, ..EvalSettings::default() };
    eprintln!("{} models; {} ID and {} OOD prompts; {} samples each", models.len(), data.id.len(), data.ood.len(), settings.samples);

    let start = Instant::now();
    let (mut model_start, mut last) = (start, (0, 0));
    let outcomes = evaluate::<Cpu>(&models, &data, &out, &settings, &Default::default(), |event| match event {
        EvalEvent::Model { name, .. } => {
            eprintln!("{name}");
            model_start = Instant::now();
        }
        EvalEvent::Skipped { .. } => eprintln!("  finished earlier, skipped"),
        EvalEvent::Generating { new_samples, new_tokens, .. } => last = (new_samples, new_tokens),
        EvalEvent::Stage { stage, .. } => eprintln!("  {stage}"),
        EvalEvent::Finished { .. } => {
            let seconds = model_start.elapsed().as_secs_f64();
            eprintln!("  {} samples, {} tokens in {seconds:.1} s (loading and scoring included)", last.0, last.1);
        }
    })?;
    eprintln!("{} models in {:.1} s; files in {}", outcomes.len(), start.elapsed().as_secs_f64(), out.display());
    print!("{}", std::fs::read_to_string(out.join("summary.csv"))?.replace("\r\n", "\n"));
    print!("{}", std::fs::read_to_string(out.join("summary_id_weighting.csv"))?.replace("\r\n", "\n"));
    Ok(())
}
