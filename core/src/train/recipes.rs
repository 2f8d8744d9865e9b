//! Runs described by a config file (`kiln pretrain --config run.toml`, `kiln sft --config …`):
//! the model to start from, the data, the optimizer and schedule, saving and evaluation.
//! Paths in a config are relative to the config file's directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::objective::{NextTokenLoss, evaluate_loss};
use super::schedule::{Decay, Schedule};
use super::trainer::{LoopConfig, Record, RunSummary, SavePolicy, Start, train};
use super::AdamWConfig;
use crate::data::chat::{QWEN_DEFAULT_SYSTEM, sft_samples};
use crate::data::interplay::pretrain_samples;
use crate::data::mixture::{Preset, TypoPolicy, readable_to_number};
use crate::data::Sample;
use crate::error::{Error, Result};
use crate::generate::{Engine, Sampler, SamplingParams, StopCriteria};
use crate::model::{Qwen2, Qwen2Config, hf};
use crate::tasks::interplay::answer::{exact_match, extract_tagged_answer};
use crate::tasks::interplay::files::jsonl_records;
use crate::tasks::interplay::row::gold_answer;
use crate::tasks::interplay::text::{EOS, compose_text, prompt_of};
use crate::tokenizer::Tokenizer;

/// A whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub model: ModelSection,
    pub data: DataSection,
    pub train: TrainSection,
    pub output: OutputSection,
    #[serde(default)]
    pub eval: EvalSection,
}

/// Where the model comes from.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A `config.json` to initialise from scratch (HF's `_init_weights`, seeded) ...
    pub init: Option<PathBuf>,
    /// ... or an HF model directory to continue from.
    pub from: Option<PathBuf>,
    /// Directory with `tokenizer.json` (default: that of `init` or `from`).
    pub tokenizer: Option<PathBuf>,
    #[serde(default)]
    pub seed: u64,
}

/// The training data: an Interplay mixture (pre-training) or an SFT file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// Root of an Interplay composition layout (`train/<op>/*.jsonl`).
    pub interplay: Option<PathBuf>,
    /// PRESET.json and the setting to use (e.g. `id2-10_0.2easy_0.3medium_0.5hard`) ...
    pub preset: Option<PathBuf>,
    #[serde(default = "default_task")]
    pub task: String,
    pub setting: Option<String>,
    /// ... or the mixture inline: ops and their probabilities.
    pub ops: Option<Vec<u32>>,
    pub probs: Option<Vec<f64>>,
    /// The mixture's token budget (`task_token_count`), e.g. `"10B"` or `2e6`.
    pub tokens: Option<TokenCount>,
    /// `reproduce` or `fix` the 020305 preset typo.
    #[serde(default)]
    pub typo: Typo,
    /// Packed block length.
    #[serde(default = "default_cutoff")]
    pub cutoff_len: usize,
    /// SFT rows (`{"messages": …}` or `{"prompt", "completion"}` per line).
    pub sft: Option<PathBuf>,
    /// Keep the first `max_length` tokens of each SFT row.
    pub max_length: Option<usize>,
    /// System prompt inserted when a row has none (default: Qwen's; `""` for none).
    pub system_prompt: Option<String>,
}

fn default_task() -> String {
    "composition-10B/op_level".into()
}
fn default_cutoff() -> usize {
    2048
}

/// A token count as a number or a readable string (`"10B"`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenCount {
    Number(f64),
    Text(String),
}

/// The 020305 typo policy, as written in configs.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Typo {
    #[default]
    Reproduce,
    Fix,
}

/// Optimizer, schedule and batch.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSection {
    /// Optimizer updates; or give `epochs`.
    pub steps: Option<u64>,
    pub epochs: Option<f64>,
    pub micro_batch: usize,
    #[serde(default = "one")]
    pub grad_accum: usize,
    pub lr: f64,
    /// constant, constant_with_warmup, linear, cosine, cosine_with_min_lr, cosine_then_floor.
    #[serde(default = "default_schedule")]
    pub schedule: String,
    #[serde(default)]
    pub warmup_ratio: f64,
    pub warmup_steps: Option<u64>,
    pub min_lr: Option<f64>,
    pub min_lr_rate: Option<f64>,
    /// `cosine_then_floor`: cosine length and the floor rate.
    pub decay_steps: Option<u64>,
    pub floor_lr: Option<f64>,
    #[serde(default)]
    pub weight_decay: f64,
    #[serde(default = "default_clip")]
    pub max_grad_norm: f64,
    #[serde(default = "default_beta1")]
    pub beta1: f64,
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    #[serde(default = "default_eps")]
    pub eps: f64,
    #[serde(default = "default_seed")]
    pub seed: u64,
}

fn one() -> usize {
    1
}
fn default_schedule() -> String {
    "linear".into()
}
fn default_clip() -> f64 {
    1.0
}
pub(crate) fn default_beta1() -> f64 {
    0.9
}
pub(crate) fn default_beta2() -> f64 {
    0.999
}
pub(crate) fn default_eps() -> f64 {
    1e-8
}
fn default_seed() -> u64 {
    42
}

/// Output directory, checkpoints and the wall-clock budget.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSection {
    /// Checkpoints (`checkpoint-<step>`) and `metrics.jsonl` go here.
    pub dir: PathBuf,
    /// Every n steps, or a fraction of the run (`0.2` → 5 checkpoints).
    pub save_steps: Option<f64>,
    #[serde(default)]
    pub milestones: Vec<u64>,
    /// Stop cleanly and save after this many seconds.
    pub time_budget_s: Option<f64>,
}

/// Evaluation during training.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSection {
    /// Evaluate every n steps (and before and after training).
    pub every: Option<u64>,
    /// Held-out Interplay rows (a JSONL file or a directory of them): loss on their full text.
    pub heldout: Option<PathBuf>,
    /// Greedy answer accuracy on the held-out rows of these ops (pre-training only).
    #[serde(default)]
    pub accuracy_ops: Vec<u32>,
    /// Rows per op for the accuracy (default 20).
    pub accuracy_rows: Option<usize>,
    /// Generation length for the accuracy (default 320).
    pub max_new_tokens: Option<usize>,
}

impl RunConfig {
    /// Reads a TOML run config; relative paths become relative to its directory.
    pub fn from_toml(path: &Path, text: &str) -> Result<Self> {
        let mut config: RunConfig = toml_from_str(path, text)?;
        let base = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let fix = |p: &mut Option<PathBuf>| {
            if let Some(p) = p.as_mut().filter(|p| p.is_relative()) {
                *p = base.join(&*p);
            }
        };
        fix(&mut config.model.init);
        fix(&mut config.model.from);
        fix(&mut config.model.tokenizer);
        fix(&mut config.data.interplay);
        fix(&mut config.data.preset);
        fix(&mut config.data.sft);
        fix(&mut config.eval.heldout);
        if config.output.dir.is_relative() {
            config.output.dir = base.join(&config.output.dir);
        }
        Ok(config)
    }
}

fn toml_from_str(path: &Path, text: &str) -> Result<RunConfig> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| text[..s.start].matches('\n').count() + 1);
        Error::data(path, line, e.message().to_string())
    })
}

/// The tokenizer directory of a run.
pub fn tokenizer_dir(model: &ModelSection) -> Result<PathBuf> {
    model
        .tokenizer
        .clone()
        .or_else(|| model.from.clone())
        .or_else(|| model.init.as_ref().and_then(|p| p.parent().map(Path::to_path_buf)))
        .ok_or_else(|| Error::InvalidInput("[model] needs `init` (a config.json) or `from` (a model directory)".into()))
}

/// Runs a pre-training or SFT config on `device`; `resume` continues from the latest checkpoint
/// of the output directory. `on_record` sees every metrics record (for progress bars), and
/// `on_data` the data report (mixture shares or SFT truncation counts, sample and step counts)
/// before training starts.
pub fn run<B: AutodiffBackend>(
    config: &RunConfig,
    device: &B::Device,
    resume: bool,
    on_data: impl FnOnce(&Value),
    on_record: impl FnMut(&Record),
) -> Result<RunSummary> {
    let tokenizer_dir = tokenizer_dir(&config.model)?;
    let tokenizer = Tokenizer::from_file(&tokenizer_dir)?;
    let pad_id = tokenizer.pad_id().or_else(|| tokenizer.eos_id()).unwrap_or(0);
    let (samples, data_report) = training_samples(&config.data, &tokenizer, config.train.seed)?;

    let t = &config.train;
    let samples_per_step = t.micro_batch * t.grad_accum;
    let total_steps = match (t.steps, t.epochs) {
        (Some(steps), None) => steps,
        (None, Some(epochs)) => ((samples.len() as f64 * epochs) / samples_per_step as f64).ceil() as u64,
        _ => return Err(Error::InvalidInput("[train] needs exactly one of `steps` or `epochs`".into())),
    };
    let schedule = schedule(t, total_steps)?;
    on_data(&json!({ "data": data_report, "samples": samples.len(), "total_steps": total_steps }));
    let loop_config = LoopConfig {
        total_steps,
        schedule,
        optimizer: AdamWConfig {
            beta1: t.beta1,
            beta2: t.beta2,
            eps: t.eps,
            weight_decay: t.weight_decay,
            max_grad_norm: Some(t.max_grad_norm),
        },
        out_dir: config.output.dir.clone(),
        save: SavePolicy { every: config.output.save_steps, milestones: config.output.milestones.clone(), ..Default::default() },
        eval_every: config.eval.every,
        time_budget: config.output.time_budget_s.map(Duration::from_secs_f64),
        companions: Some(tokenizer_dir.clone()),
        run_config: json!({ "config": config, "data": data_report, "samples": samples.len() }),
    };
    let mut objective = NextTokenLoss::new(samples, t.micro_batch, t.grad_accum, pad_id, t.seed)?;
    let start = Start::<B>::new(&loop_config, resume, &mut objective, device, || fresh_model(&config.model, device))?;
    let mut evaluator = Evaluator::new(config, &tokenizer, pad_id)?;
    let (_, summary) = train(start, &mut objective, &loop_config, |model| evaluator.evaluate(model), on_record)?;
    Ok(summary)
}

fn fresh_model<B: Backend>(model: &ModelSection, device: &B::Device) -> Result<Qwen2<B>> {
    match (&model.init, &model.from) {
        (Some(init), None) => Qwen2::random(&Qwen2Config::from_file(init)?, model.seed, device),
        (None, Some(from)) => hf::load(from, device),
        _ => Err(Error::InvalidInput("[model] needs exactly one of `init` or `from`".into())),
    }
}

fn training_samples(data: &DataSection, tokenizer: &Tokenizer, seed: u64) -> Result<(Vec<Sample>, Value)> {
    match (&data.interplay, &data.sft) {
        (Some(root), None) => {
            let typo = match data.typo {
                Typo::Reproduce => TypoPolicy::Reproduce,
                Typo::Fix => TypoPolicy::Fix,
            };
            let preset = match (&data.preset, &data.setting, &data.ops, &data.probs) {
                (Some(path), Some(setting), None, None) => Preset::load(path, &data.task, setting, typo)?,
                (None, None, Some(ops), Some(probs)) if ops.len() == probs.len() && !ops.is_empty() => {
                    Preset { name: "inline".into(), ops: ops.clone(), probs: probs.clone() }
                }
                _ => {
                    return Err(Error::InvalidInput(
                        "[data] interplay needs a mixture: `preset` + `setting`, or `ops` + `probs` of equal length".into(),
                    ));
                }
            };
            let budget = match &data.tokens {
                Some(TokenCount::Number(n)) => *n,
                Some(TokenCount::Text(t)) => readable_to_number(t).ok_or_else(|| Error::InvalidInput(format!("[data] tokens: cannot read {t:?}")))?,
                None => return Err(Error::InvalidInput("[data] interplay needs `tokens` (the mixture's token budget)".into())),
            };
            let (samples, report) = pretrain_samples(root, &preset, budget, tokenizer, data.cutoff_len, seed)?;
            Ok((samples, json!({ "mixture": report })))
        }
        (None, Some(path)) => {
            let system = match data.system_prompt.as_deref() {
                None => Some(QWEN_DEFAULT_SYSTEM),
                Some("") => None,
                Some(s) => Some(s),
            };
            let (samples, report) = sft_samples(path, tokenizer, system, data.max_length)?;
            Ok((samples, json!({ "sft": report })))
        }
        _ => Err(Error::InvalidInput("[data] needs exactly one of `interplay` (pre-training) or `sft`".into())),
    }
}

/// HF `get_scheduler` by name.
fn schedule(t: &TrainSection, total_steps: u64) -> Result<Schedule> {
    let warmup_steps = t.warmup_steps.unwrap_or_else(|| Schedule::warmup_from_ratio(total_steps, t.warmup_ratio));
    let decay = match t.schedule.as_str() {
        "constant" | "constant_with_warmup" => Decay::Constant,
        "linear" => Decay::Linear,
        "cosine" => Decay::Cosine,
        "cosine_with_min_lr" => Decay::CosineWithMinLr {
            min_lr_rate: match (t.min_lr, t.min_lr_rate) {
                (Some(min_lr), None) => min_lr / t.lr,
                (None, Some(rate)) => rate,
                _ => return Err(Error::InvalidInput("cosine_with_min_lr needs exactly one of `min_lr` or `min_lr_rate`".into())),
            },
        },
        "cosine_then_floor" => Decay::CosineThenFloor {
            steps: t.decay_steps.unwrap_or(total_steps),
            floor: t.floor_lr.ok_or_else(|| Error::InvalidInput("cosine_then_floor needs `floor_lr`".into()))?,
        },
        other => return Err(Error::InvalidInput(format!("unknown schedule {other:?}"))),
    };
    Ok(Schedule { base_lr: t.lr, warmup_steps, total_steps, decay })
}

/// Held-out loss and greedy answer accuracy during pre-training.
struct Evaluator {
    heldout: Vec<Sample>,
    prompts: Vec<(u32, Vec<u32>, String)>,
    tokenizer: Tokenizer,
    pad_id: u32,
    max_new_tokens: usize,
}

impl Evaluator {
    fn new(config: &RunConfig, tokenizer: &Tokenizer, pad_id: u32) -> Result<Self> {
        let mut evaluator = Self {
            heldout: Vec::new(),
            prompts: Vec::new(),
            tokenizer: tokenizer.clone(),
            pad_id,
            max_new_tokens: config.eval.max_new_tokens.unwrap_or(320),
        };
        let Some(path) = &config.eval.heldout else { return Ok(evaluator) };
        let files: Vec<PathBuf> = if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| Error::io(path, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
                .collect();
            files.sort();
            files
        } else {
            vec![path.clone()]
        };
        let per_op = config.eval.accuracy_rows.unwrap_or(20);
        let cutoff = config.data.cutoff_len;
        for file in files {
            for record in jsonl_records(&file)? {
                let record = record?;
                let field = |k: &str| record.str_field(&file, k);
                let (problem, question, solution) = (field("problem")?, field("question")?, field("solution")?);
                let op = record.int_field(&file, "op")? as u32;
                let Some(text) = compose_text(problem, question, solution) else { continue };
                let mut ids = tokenizer.encode(&format!("{text}{EOS}"))?;
                ids.truncate(cutoff);
                evaluator.heldout.push(Sample::all_targets(ids));
                let taken = evaluator.prompts.iter().filter(|(o, _, _)| *o == op).count();
                if config.eval.accuracy_ops.contains(&op) && taken < per_op {
                    evaluator.prompts.push((op, tokenizer.encode(&prompt_of(&text))?, gold_answer(solution)));
                }
            }
        }
        Ok(evaluator)
    }

    fn evaluate<B: Backend>(&mut self, model: &Qwen2<B>) -> Result<Record> {
        let mut record = Record::new();
        if !self.heldout.is_empty() {
            record.insert("eval_loss".into(), json!(evaluate_loss(model, &self.heldout, 16, self.pad_id)?));
        }
        if !self.prompts.is_empty() {
            let params = SamplingParams {
                sampler: Sampler::greedy(),
                max_new_tokens: self.max_new_tokens,
                stop: StopCriteria { token_ids: self.tokenizer.eos_id().into_iter().collect(), strings: vec!["</answer>".into()] },
                ignore_eos: true, // the training texts' EOS (above), not the config's
                ..Default::default()
            };
            let prompts: Vec<Vec<u32>> = self.prompts.iter().map(|(_, ids, _)| ids.clone()).collect();
            let outputs = Engine::new(model, Some(&self.tokenizer)).generate(&prompts, &params, |_| {})?;
            let mut per_op: std::collections::BTreeMap<u32, (usize, usize)> = Default::default();
            for ((op, _, gold), samples) in self.prompts.iter().zip(outputs) {
                let correct = exact_match(&extract_tagged_answer(&samples[0].text), gold);
                let entry = per_op.entry(*op).or_default();
                entry.0 += correct as usize;
                entry.1 += 1;
            }
            let (correct, total) = per_op.values().fold((0, 0), |(c, t), (a, b)| (c + a, t + b));
            record.insert("eval_accuracy".into(), json!(correct as f64 / total as f64));
            for (op, (c, t)) in per_op {
                record.insert(format!("eval_accuracy_op{op}"), json!(c as f64 / t as f64));
            }
        }
        Ok(record)
    }
}
