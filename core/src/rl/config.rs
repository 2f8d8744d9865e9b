//! The TOML config of `kiln rl` and `kiln opd`: the one run-config schema
//! ([`crate::train::config`]) plus `[rollout]`, `[loss]`, `[reward]` and `[teacher]`. Defaults are
//! the seed's verl settings (`docs/interplay.md` §6.1): n = 6 at temperature 1, 1024 prompts per
//! step in mini-batches of 256 (4 optimizer updates) and micro-batches of 16, AdamW at a constant
//! 1e-6 with weight decay 0.01 and clipping at 1.0, clip ratio 0.2 with dual clip 3.0, token-mean
//! aggregation, k3 KL to the initial policy with β = 0.001, a checkpoint and a validation every 20
//! steps. Paths are relative to the config file's directory.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::advantage::{AdvEstimator, RewardScaling};
use super::loss::{Clip, KlEstimator, LossAgg, PolicyLossMode};
use super::objective::{FilterGroups, OverlongBuffer, PgSettings};
use super::rollout::RolloutSettings;
use crate::error::Result;
use crate::generate::Sampler;
use crate::tasks::{RewardConfig, TaskConfig};
use super::run::Method;
use crate::train::config::{
    DataSection, Defaults, EvalSection, Family, ModelSection, OptimizerSection, OutputSection, PromptData, Refusal, ScheduleSection,
    TrainSection, base_dir, read_config, refused, resolve, resolve_shared,
};

/// A GRPO or OPD run: the sections of every run ([`crate::train::config`]) plus the rollout,
/// the loss and the reward (GRPO) or teacher (OPD).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgConfig {
    /// `from`: the policy's starting point, which is also the frozen reference of the KL term.
    pub model: ModelSection,
    /// The task whose rows are the prompts and whose rewards score them (Interplay if absent).
    #[serde(default)]
    pub task: TaskConfig,
    /// `kind = "prompts"` (old configs: `dir = …` or `files = […]`).
    pub data: DataSection,
    #[serde(default)]
    pub rollout: RolloutSection,
    #[serde(default)]
    pub train: TrainSection,
    #[serde(default)]
    pub optimizer: OptimizerSection,
    #[serde(default)]
    pub schedule: ScheduleSection,
    #[serde(default)]
    pub loss: LossSection,
    /// GRPO's reward (`kiln rl`; outcome if absent).
    pub reward: Option<RewardConfig>,
    /// OPD's teacher (`kiln opd`).
    pub teacher: Option<TeacherSection>,
    pub output: OutputSection,
    /// Greedy validation on per-op files (`[validation]` in old configs).
    pub eval: Option<EvalSection>,
}

/// How responses are sampled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Keep only tokens at least this fraction as likely as the most likely one (vLLM's and
    /// TRL's `min_p`); 0 disables.
    #[serde(default)]
    pub min_p: f32,
    #[serde(default = "default_length")]
    pub max_response_length: usize,
    /// Sequences decoded together.
    #[serde(default = "default_decode_batch")]
    pub batch_size: usize,
    /// DAPO's dynamic sampling (verl's `algorithm.filter_groups`): `[rollout.filter_groups]`.
    pub filter_groups: Option<FilterGroups>,
}

impl Default for RolloutSection {
    fn default() -> Self {
        Self { n: default_n(), temperature: 1.0, top_p: 1.0, top_k: 0, min_p: 0.0, max_response_length: default_length(), batch_size: default_decode_batch(), filter_groups: None }
    }
}

/// The surrogate, its aggregation, the KL term and GRPO's reward scaling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// verl's `loss_agg_mode` (either key).
    #[serde(default = "default_agg", alias = "loss_agg_mode")]
    pub agg: LossAgg,
    /// The advantage estimator by name (verl's `algorithm.adv_estimator`; default `grpo`).
    #[serde(default)]
    pub adv_estimator: AdvEstimator,
    /// The policy loss by name (verl's `actor.policy_loss.loss_mode`; default `vanilla`).
    #[serde(default)]
    pub policy_loss: PolicyLossMode,
    /// Truncated importance sampling: the cap C of `min(π_old / π_rollout, C)` (verl's
    /// `tis_imp_ratio_cap`; absent: off).
    pub tis_imp_ratio_cap: Option<f64>,
    /// Rollout rejection sampling (masked importance sampling; verl's `rollout_rs`): options
    /// such as `"token_k1"` or `"token_k1,seq_mean_k3"` whose out-of-bound tokens or responses
    /// leave the loss, every term of it (absent: off; see `rl::rejection`).
    pub rollout_rs: Option<String>,
    /// Their thresholds (verl's `rollout_rs_threshold`): `"0.5_2.0"` (k1's ratio bounds), `0.15`,
    /// or one per option, comma-separated.
    pub rollout_rs_threshold: Option<RsThreshold>,
    /// DAPO's overlong reward shaping (verl's `reward_model.overlong_buffer`):
    /// `[loss.overlong_buffer]`.
    pub overlong_buffer: Option<OverlongBuffer>,
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

/// `rollout_rs_threshold`: verl takes a string or a number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RsThreshold {
    Number(f64),
    Text(String),
}

impl LossSection {
    /// The rejection criteria of `rollout_rs` / `rollout_rs_threshold`, if set.
    pub fn rejection(&self) -> std::result::Result<Option<super::rejection::Rejection>, String> {
        match (&self.rollout_rs, &self.rollout_rs_threshold) {
            (None, None) => Ok(None),
            (Some(options), Some(threshold)) => {
                let threshold = match threshold {
                    RsThreshold::Number(v) => v.to_string(),
                    RsThreshold::Text(t) => t.clone(),
                };
                super::rejection::Rejection::parse(options, &threshold).map(Some)
            }
            (Some(_), None) => Err("rollout_rs needs rollout_rs_threshold".into()),
            (None, Some(_)) => Err("rollout_rs_threshold needs rollout_rs (the options it bounds)".into()),
        }
    }
}

impl Default for LossSection {
    fn default() -> Self {
        Self {
            clip_ratio: default_clip(),
            clip_ratio_low: None,
            clip_ratio_high: None,
            clip_ratio_c: default_clip_c(),
            agg: default_agg(),
            adv_estimator: AdvEstimator::default(),
            policy_loss: PolicyLossMode::default(),
            tis_imp_ratio_cap: None,
            rollout_rs: None,
            rollout_rs_threshold: None,
            overlong_buffer: None,
            kl_coef: default_kl_coef(),
            kl_estimator: default_kl(),
            reward_scaling: RewardScaling::Group,
            epsilon: default_epsilon(),
        }
    }
}

/// OPD's teacher.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

fn default_length() -> usize {
    1024
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

/// Prompts per step and per optimizer update.
const PROMPTS_PER_STEP: usize = 1024;
const MINI_BATCH: usize = 256;

impl PgConfig {
    /// Reads a config (old forms included, [`crate::train::config::legacy`]); relative paths
    /// become relative to its directory. Inconsistent settings, and settings of `kiln pretrain`
    /// and `kiln sft` (`[train] grad_accum`, `seed`, ...), are errors naming the file and the
    /// line. [`PgConfig::load`] also checks it against the run's method.
    pub fn from_toml(path: &Path, text: &str) -> Result<Self> {
        Self::read(path, text, None)
    }

    /// [`PgConfig::from_toml`] for `method`: a `[teacher]` in a GRPO config, or a `[reward]` or
    /// no `[teacher]` in an OPD one, is an error naming the line. This is where a config is
    /// checked: the run does not check it again.
    pub fn load(path: &Path, text: &str, method: Method) -> Result<Self> {
        Self::read(path, text, Some(method))
    }

    fn read(path: &Path, text: &str, method: Option<Method>) -> Result<Self> {
        let mut config: PgConfig = read_config(path, text, Family::PolicyGradient)?;
        let base = base_dir(path);
        let mut no_eval = EvalSection::default();
        let eval = config.eval.as_mut().unwrap_or(&mut no_eval);
        resolve_shared(base, &mut config.model, &mut config.data, &mut config.output, eval);
        config.teacher.iter_mut().for_each(|t| resolve(base, &mut t.path));
        config.task.resolve_paths(base);
        let refusal = |refusal| refused(path, text, Family::PolicyGradient, refusal);
        config.check().map_err(refusal)?;
        method.map(|m| config.check_method(m)).transpose().map_err(refusal)?;
        Ok(config)
    }

    /// `[teacher]` and `[reward]` against the run: GRPO takes a `[reward]` (outcome if absent)
    /// and no `[teacher]`, OPD a `[teacher]` and no `[reward]`.
    pub fn check_method(&self, method: Method) -> std::result::Result<(), Refusal> {
        match (method, self.reward.is_some(), self.teacher.is_some()) {
            (Method::Grpo, _, false) | (Method::Opd, false, true) => Ok(()),
            (Method::Grpo, _, true) => Err(Refusal::at("teacher", None, "[teacher] is for `kiln opd`; GRPO (`kiln rl`) takes a [reward]")),
            (Method::Opd, _, false) => Err(Refusal::from("on-policy distillation (`kiln opd`) needs a [teacher] section")),
            (Method::Opd, true, true) => Err(Refusal::at("reward", None, "[reward] is for `kiln rl`; on-policy distillation (`kiln opd`) takes none")),
        }
    }

    /// The prompts' section.
    pub fn prompts(&self) -> std::result::Result<&PromptData, String> {
        match &self.data {
            DataSection::Prompts(prompts) => Ok(prompts),
            other => Err(format!("[data] kind = \"{}\" is not for `kiln rl`/`kiln opd`: give kind = \"prompts\" (`dir` or `files`)", other.kind())),
        }
    }

    /// The policy's starting point.
    pub fn from_dir(&self) -> std::result::Result<&Path, String> {
        match (&self.model.from, &self.model.init) {
            (Some(from), None) => Ok(from),
            _ => Err("[model] needs `from` (the policy's starting point), not `init`".into()),
        }
    }

    /// The step's shape and the loss settings.
    pub fn settings(&self) -> PgSettings {
        let (r, t, l) = (&self.rollout, &self.train, &self.loss);
        PgSettings {
            rollout: RolloutSettings {
                n: r.n,
                sampler: Sampler { temperature: r.temperature, top_k: r.top_k, top_p: r.top_p, min_p: r.min_p },
                max_response_length: r.max_response_length,
                batch_size: r.batch_size,
                dtype: self.model.dtype,
            },
            prompts_per_step: t.prompts_per_step.unwrap_or(PROMPTS_PER_STEP),
            mini_batch: t.mini_batch.unwrap_or(MINI_BATCH),
            micro_batch: t.micro_batch.or(Defaults::POLICY_GRADIENT.micro_batch).unwrap_or_default(),
            clip: Clip {
                low: l.clip_ratio_low.unwrap_or(l.clip_ratio),
                high: l.clip_ratio_high.unwrap_or(l.clip_ratio),
                dual: l.clip_ratio_c,
            },
            agg: l.agg,
            policy_loss: l.policy_loss,
            tis_imp_ratio_cap: l.tis_imp_ratio_cap,
            rejection: l.rejection().ok().flatten(),
            overlong_buffer: l.overlong_buffer,
            filter_groups: r.filter_groups,
            kl: (l.kl_coef > 0.0).then_some((l.kl_estimator, l.kl_coef)),
            seed: self.prompts().map_or(1, |p| p.seed),
        }
    }

    /// Settings that cannot work together, or that are for another run family (named by
    /// [`Refusal`]'s key). [`PgConfig::from_toml`] runs it; a config built in code is checked
    /// by calling it before [`super::run::run`].
    pub fn check(&self) -> std::result::Result<(), Refusal> {
        let (d, t) = (Defaults::POLICY_GRADIENT, &self.train);
        self.from_dir().map_err(|m| Refusal::at("model", self.model.init.as_ref().map(|_| "init"), m))?;
        self.loss.rejection().map_err(|m| Refusal::at("loss", Some("rollout_rs"), format!("[loss] {m}")))?;
        let prompts = self.prompts().map_err(|m| Refusal::at("data", Some("kind"), m))?;
        t.total_steps(|_| 0)?;
        self.output.time_budget()?;
        if prompts.dir.is_some() != prompts.files.is_empty() {
            return Err("[data] needs exactly one of `dir` (per-op files) or `files`".into());
        }
        if t.grad_accum.is_some() {
            return Err(Refusal::at("train", Some("grad_accum"), "[train] grad_accum is for `kiln pretrain` and `kiln sft` (rl/opd split a step by mini_batch)"));
        }
        if t.seed.is_some() {
            return Err(Refusal::at("train", Some("seed"), "[train] seed is for `kiln pretrain` and `kiln sft`; rl and opd seed their prompt order with [data] seed"));
        }
        if self.loss.kl_coef < 0.0 {
            return Err(Refusal::at("loss", Some("kl_coef"), format!("[loss] kl_coef must not be negative (got {})", self.loss.kl_coef)));
        }
        if self.loss.reward_scaling != RewardScaling::Group && self.loss.adv_estimator.name() != "grpo" {
            return Err(Refusal::at("loss", Some("reward_scaling"), format!("[loss] reward_scaling applies to adv_estimator \"grpo\" only (got \"{}\")", self.loss.adv_estimator.name())));
        }
        if self.teacher.is_some() && (self.loss.adv_estimator != AdvEstimator::default() || self.loss.overlong_buffer.is_some() || self.rollout.filter_groups.is_some()) {
            return Err("[loss] adv_estimator, [loss.overlong_buffer] and [rollout.filter_groups] shape rewards: OPD's teacher signal takes none".into());
        }
        if self.eval.as_ref().is_some_and(|e| e.rows.is_none()) {
            return Err("[eval] needs `rows` (a directory of per-op files; `dir` in [validation])".into());
        }
        self.settings().check()?;
        self.optimizer.for_adamw(&self.schedule, &d, 1)?;
        Ok(())
    }
}
