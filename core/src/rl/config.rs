//! The TOML config of `kiln rl` and `kiln opd`. Defaults are the seed's verl settings (spec
//! §6.1): n = 6 at temperature 1, 1024 prompts per step in mini-batches of 256 (4 optimizer
//! updates) and micro-batches of 16, AdamW at a constant 1e-6 with weight decay 0.01 and
//! clipping at 1.0, clip ratio 0.2 with dual clip 3.0, token-mean aggregation, k3 KL to the
//! initial policy with β = 0.001, a checkpoint and a validation every 20 steps. Paths are
//! relative to the config file's directory.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::advantage::RewardScaling;
use super::loss::{Clip, KlEstimator, LossAgg};
use super::objective::PgSettings;
use super::rollout::RolloutSettings;
use crate::error::{Error, Result};
use crate::generate::Sampler;
use crate::tasks::{RewardConfig, TaskConfig};
use crate::train::recipes::{default_beta1, default_beta2, default_eps};

/// A GRPO or OPD run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgConfig {
    pub model: ModelSection,
    pub data: DataSection,
    #[serde(default)]
    pub rollout: RolloutSection,
    pub train: TrainSection,
    #[serde(default)]
    pub loss: LossSection,
    /// The task whose rows are the prompts and whose rewards score them (Interplay if absent).
    #[serde(default)]
    pub task: TaskConfig,
    /// GRPO's reward (`kiln rl`; outcome if absent).
    pub reward: Option<RewardConfig>,
    /// OPD's teacher (`kiln opd`).
    pub teacher: Option<TeacherSection>,
    pub output: OutputSection,
    pub validation: Option<ValidationSection>,
}

/// The policy's starting point, which is also the frozen reference of the KL term.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// An HF model directory.
    pub from: PathBuf,
    /// Directory with `tokenizer.json` (default: `from`).
    pub tokenizer: Option<PathBuf>,
}

/// The RL prompts: JSONL rows of the Interplay schema.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// A directory of per-op files (`heldout/op11-50k.jsonl`, …) ...
    pub dir: Option<PathBuf>,
    /// ... of which these ops (default: every file of `dir`) ...
    #[serde(default)]
    pub ops: Vec<u32>,
    /// ... or explicit files.
    #[serde(default)]
    pub files: Vec<PathBuf>,
    /// Read only the first rows of each file.
    pub rows_per_op: Option<usize>,
    /// Longer prompts are dropped (and counted).
    #[serde(default = "default_length")]
    pub max_prompt_length: usize,
    /// Prompt order and rollout seeds (verl's `data.seed`).
    #[serde(default = "one")]
    pub seed: u64,
}

/// How responses are sampled.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutSection {
    #[serde(default = "default_n")]
    pub n: usize,
    #[serde(default = "unit")]
    pub temperature: f32,
    #[serde(default = "unit")]
    pub top_p: f32,
    /// 0 disables (verl's −1).
    #[serde(default)]
    pub top_k: usize,
    #[serde(default = "default_length")]
    pub max_response_length: usize,
    /// Sequences decoded together.
    #[serde(default = "default_decode_batch")]
    pub batch_size: usize,
}

impl Default for RolloutSection {
    fn default() -> Self {
        Self { n: default_n(), temperature: 1.0, top_p: 1.0, top_k: 0, max_response_length: default_length(), batch_size: default_decode_batch() }
    }
}

/// Steps, batches and the optimizer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSection {
    /// RL steps; or give `epochs` over the prompts.
    pub steps: Option<u64>,
    pub epochs: Option<f64>,
    /// Prompts per step (verl's `train_batch_size`).
    #[serde(default = "default_prompts")]
    pub prompts_per_step: usize,
    /// Prompts per optimizer update (`ppo_mini_batch_size`).
    #[serde(default = "default_mini_batch")]
    pub mini_batch: usize,
    /// Responses per micro-batch (`ppo_micro_batch_size_per_gpu`).
    #[serde(default = "default_micro_batch")]
    pub micro_batch: usize,
    #[serde(default = "default_lr")]
    pub lr: f64,
    /// `constant` or `cosine` (verl's `warmup_style`).
    #[serde(default = "default_schedule")]
    pub schedule: String,
    #[serde(default)]
    pub warmup_ratio: f64,
    /// Cosine floor as a fraction of `lr`.
    #[serde(default)]
    pub min_lr_ratio: f64,
    #[serde(default = "default_weight_decay")]
    pub weight_decay: f64,
    #[serde(default = "unit64")]
    pub max_grad_norm: f64,
    #[serde(default = "default_beta1")]
    pub beta1: f64,
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    #[serde(default = "default_eps")]
    pub eps: f64,
}

/// The surrogate, its aggregation, the KL term and GRPO's reward scaling.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossSection {
    #[serde(default = "default_clip")]
    pub clip_ratio: f64,
    /// Override the lower / upper clip (DAPO's clip-higher: `clip_ratio_high = 0.28`).
    pub clip_ratio_low: Option<f64>,
    pub clip_ratio_high: Option<f64>,
    /// Dual clip for negative advantages (> 1).
    #[serde(default = "default_clip_c")]
    pub clip_ratio_c: f64,
    #[serde(default = "default_agg")]
    pub agg: LossAgg,
    /// β; 0 drops the KL term and never loads the reference model.
    #[serde(default = "default_kl_coef")]
    pub kl_coef: f64,
    #[serde(default = "default_kl")]
    pub kl_estimator: KlEstimator,
    /// GRPO: `group`, `batch` or `none`.
    #[serde(default)]
    pub reward_scaling: RewardScaling,
    #[serde(default = "default_epsilon")]
    pub epsilon: f64,
}

impl Default for LossSection {
    fn default() -> Self {
        Self {
            clip_ratio: default_clip(),
            clip_ratio_low: None,
            clip_ratio_high: None,
            clip_ratio_c: default_clip_c(),
            agg: default_agg(),
            kl_coef: default_kl_coef(),
            kl_estimator: default_kl(),
            reward_scaling: RewardScaling::Group,
            epsilon: default_epsilon(),
        }
    }
}

/// OPD's teacher.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeacherSection {
    /// An HF model directory with the student's tokenizer.
    pub path: PathBuf,
    /// `c` in the advantage `−c · (log π − log π_teacher)`.
    #[serde(default = "unit64")]
    pub coef: f64,
    /// Minimise the full-vocabulary reverse KL instead (teacher logits are local).
    #[serde(default)]
    pub full_vocab: bool,
}

/// Where checkpoints and metrics go.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSection {
    /// E.g. `release/rl`.
    pub dir: PathBuf,
    /// Checkpoints `<name>_step<N>` and `<name>_metrics.jsonl` (e.g. `op11_14`); an empty name
    /// gives `step<N>`; without one, `checkpoint-<N>`.
    pub name: Option<String>,
    #[serde(default = "default_freq")]
    pub save_freq: u64,
    /// Stop cleanly (and save) after this many seconds.
    pub time_budget_s: Option<f64>,
}

/// Greedy validation on per-op files.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidationSection {
    /// A directory of per-op files (`val/op2-200.jsonl`, …).
    pub dir: PathBuf,
    /// Every n steps (verl's `test_freq`), and before the first and after the last.
    #[serde(default = "default_freq")]
    pub every: u64,
    /// Ops up to this are in-distribution.
    #[serde(default = "default_id_max_op")]
    pub id_max_op: u32,
    pub rows_per_op: Option<usize>,
    /// Default: the rollout's `max_response_length`.
    pub max_new_tokens: Option<usize>,
}

fn default_length() -> usize {
    1024
}
fn one() -> u64 {
    1
}
fn default_n() -> usize {
    6
}
fn unit() -> f32 {
    1.0
}
fn unit64() -> f64 {
    1.0
}
fn default_decode_batch() -> usize {
    64
}
fn default_prompts() -> usize {
    1024
}
fn default_mini_batch() -> usize {
    256
}
fn default_micro_batch() -> usize {
    16
}
fn default_lr() -> f64 {
    1e-6
}
fn default_schedule() -> String {
    "constant".into()
}
fn default_weight_decay() -> f64 {
    0.01
}
fn default_clip() -> f64 {
    0.2
}
fn default_clip_c() -> f64 {
    3.0
}
fn default_agg() -> LossAgg {
    LossAgg::TokenMean
}
fn default_kl_coef() -> f64 {
    0.001
}
fn default_kl() -> KlEstimator {
    KlEstimator::K3
}
fn default_epsilon() -> f64 {
    1e-6
}
fn default_freq() -> u64 {
    20
}
fn default_id_max_op() -> u32 {
    10
}

impl PgConfig {
    /// Reads a config; relative paths become relative to its directory. Inconsistent settings
    /// are errors naming the file.
    pub fn from_toml(path: &Path, text: &str) -> Result<Self> {
        let mut config: PgConfig = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| text[..s.start].matches('\n').count() + 1);
            Error::data(path, line, e.message().to_string())
        })?;
        let base = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        fix(&mut config.model.from);
        config.model.tokenizer.iter_mut().chain(config.data.dir.iter_mut()).chain(config.data.files.iter_mut()).for_each(fix);
        config.teacher.iter_mut().for_each(|t| fix(&mut t.path));
        config.validation.iter_mut().for_each(|v| fix(&mut v.dir));
        fix(&mut config.output.dir);
        config.check().map_err(|message| Error::config(path, message))?;
        Ok(config)
    }

    /// The step's shape and the loss settings.
    pub fn settings(&self) -> PgSettings {
        let (r, t, l) = (&self.rollout, &self.train, &self.loss);
        PgSettings {
            rollout: RolloutSettings {
                n: r.n,
                sampler: Sampler { temperature: r.temperature, top_k: r.top_k, top_p: r.top_p },
                max_response_length: r.max_response_length,
                batch_size: r.batch_size,
            },
            prompts_per_step: t.prompts_per_step,
            mini_batch: t.mini_batch,
            micro_batch: t.micro_batch,
            clip: Clip {
                low: l.clip_ratio_low.unwrap_or(l.clip_ratio),
                high: l.clip_ratio_high.unwrap_or(l.clip_ratio),
                dual: l.clip_ratio_c,
            },
            agg: l.agg,
            kl: (l.kl_coef > 0.0).then_some((l.kl_estimator, l.kl_coef)),
            seed: self.data.seed,
        }
    }

    /// Settings that cannot work together.
    pub fn check(&self) -> std::result::Result<(), String> {
        let t = &self.train;
        if t.steps.is_some() == t.epochs.is_some() {
            return Err("[train] needs exactly one of `steps` or `epochs`".into());
        }
        if self.data.dir.is_some() != self.data.files.is_empty() {
            return Err("[data] needs exactly one of `dir` (per-op files) or `files`".into());
        }
        if self.loss.kl_coef < 0.0 {
            return Err(format!("[loss] kl_coef must not be negative (got {})", self.loss.kl_coef));
        }
        self.settings().check()?;
        if !["constant", "cosine"].contains(&t.schedule.as_str()) {
            return Err(format!("[train] schedule must be \"constant\" or \"cosine\" (got {:?})", t.schedule));
        }
        Ok(())
    }
}
