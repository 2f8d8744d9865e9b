//! The TOML config of `kiln rl` and `kiln opd`: the shared sections ([`crate::train::config`]),
//! their own `[train]` and `[eval]`, and `[rollout]`, `[loss]`, `[reward]` and `[teacher]`. What a
//! file leaves out is the seed's verl settings
//! ([`crate::train::config::defaults::POLICY_GRADIENT`]). Paths are relative to the config
//! file's directory.

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
use crate::train::adamw::AdamWConfig;
use crate::train::config::{
    DataSection, Family, ModelSection, OutputSection, PromptData, Refusal, ScheduleSection, base_dir, read_config, refused, resolve,
    resolve_shared, total_steps,
};
use crate::train::precision::Precision;

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
    pub rollout: RolloutSection,
    pub train: PgTrain,
    /// AdamW, read straight into the optimizer's settings.
    pub optimizer: AdamWConfig,
    pub schedule: ScheduleSection,
    pub loss: LossSection,
    /// GRPO's reward (`kiln rl`; outcome if absent).
    pub reward: Option<RewardConfig>,
    /// OPD's teacher (`kiln opd`).
    pub teacher: Option<TeacherSection>,
    pub output: OutputSection,
    /// Greedy validation on per-op files (`[validation]` in old configs).
    pub eval: Option<PgEval>,
}

/// `[train]` of `kiln rl` and `kiln opd`: verl's batch sizes (pretrain's and sft's is
/// [`crate::train::config::NextTokenTrain`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgTrain {
    /// RL steps; or give `epochs` (of the prompts).
    pub steps: Option<u64>,
    pub epochs: Option<f64>,
    /// Prompts per step (verl's `train_batch_size`; global over the replicas).
    pub prompts_per_step: usize,
    /// Prompts per optimizer update (`ppo_mini_batch_size`).
    pub mini_batch: usize,
    /// Responses per micro-batch (`ppo_micro_batch_size_per_gpu`).
    pub micro_batch: usize,
    /// Data-parallel devices (see [`crate::train::config::NextTokenTrain::devices`]); every
    /// mini-batch of prompts is split over the replicas, whole groups each.
    pub devices: Option<Vec<String>>,
    /// The policy's training precision ([`crate::train::precision`]).
    pub precision: Precision,
    /// Checkpoint every decoder layer (see [`crate::train::config::NextTokenTrain::recompute`]).
    pub recompute: bool,
    /// ZeRO-1 (see [`crate::train::config::NextTokenTrain::shard_optimizer`]).
    pub shard_optimizer: bool,
    /// See [`crate::train::config::NextTokenTrain::grad_reduce_dtype`].
    pub grad_reduce_dtype: crate::dist::ReduceDtype,
    /// See [`crate::train::config::NextTokenTrain::overlap_grad_reduce`].
    pub overlap_grad_reduce: bool,
}

impl PgTrain {
    /// `steps`, or the steps of `epochs` by the run's rule.
    pub fn total_steps(&self, of_epochs: impl FnOnce(f64) -> u64) -> std::result::Result<u64, String> {
        total_steps(self.steps, self.epochs, of_epochs)
    }
}

/// `[eval]` of `kiln rl` and `kiln opd` (`[validation]` in older configs): greedy accuracy per op
/// of held-out rows, and as ID and OOD.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgEval {
    /// Every n steps, and before the first and after the last.
    pub every: u64,
    /// Also after these steps (0: before the first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<u64>,
    /// A directory of per-op files (`dir` in `[validation]`).
    #[serde(alias = "dir")]
    pub rows: PathBuf,
    /// The files of these ops (every file if empty).
    #[serde(default)]
    pub ops: Vec<u32>,
    /// Rows per op scored (all if absent).
    pub rows_per_op: Option<usize>,
    /// Generation length (the rollout's `max_response_length` if absent).
    pub max_new_tokens: Option<usize>,
    /// Ops up to this are in-distribution (the task's own split when absent:
    /// [`crate::tasks::Task::id_max_level`], Interplay's 10).
    pub id_max_op: Option<u32>,
}

/// How responses are sampled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutSection {
    /// Samples per prompt (the group).
    pub n: usize,
    pub temperature: f32,
    pub top_p: f32,
    /// 0 disables (verl's −1).
    pub top_k: usize,
    /// Keep only tokens at least this fraction as likely as the most likely one (vLLM's and
    /// TRL's `min_p`); 0 disables.
    pub min_p: f32,
    pub max_response_length: usize,
    /// Sequences decoded together.
    pub batch_size: usize,
    /// GiB the rollout's KV cache may take (vLLM's memory share): on a paged cache (the CPU in
    /// f32, wgpu, CUDA) a sample joins the batch only while the blocks it may need fit; unset,
    /// the paged cache takes at most half the memory available
    /// ([`crate::generate::Engine::kv_memory`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_memory: Option<f64>,
    /// The most tokens (padding included) one prefill pass takes: the prompts joining the
    /// batch are prefilled in passes within it ([`crate::generate::Engine::max_prefill_tokens`];
    /// verl's `rollout.max_num_batched_tokens`, vLLM's bound on a step's tokens, is carried here).
    pub max_prefill_tokens: usize,
    /// DAPO's dynamic sampling (verl's `algorithm.filter_groups`): `[rollout.filter_groups]`.
    pub filter_groups: Option<FilterGroups>,
}

/// The surrogate, its aggregation, the KL term and GRPO's reward scaling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossSection {
    pub clip_ratio: f64,
    /// Override the lower / upper clip (DAPO's clip-higher: `clip_ratio_high = 0.28`).
    pub clip_ratio_low: Option<f64>,
    pub clip_ratio_high: Option<f64>,
    /// Dual clip for negative advantages (> 1).
    pub clip_ratio_c: f64,
    /// verl's `loss_agg_mode` (either key).
    #[serde(alias = "loss_agg_mode")]
    pub agg: LossAgg,
    /// The advantage estimator by name (verl's `algorithm.adv_estimator`).
    pub adv_estimator: AdvEstimator,
    /// The policy loss by name (verl's `actor.policy_loss.loss_mode`).
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
    pub kl_coef: f64,
    pub kl_estimator: KlEstimator,
    /// GRPO: `group`, `batch` or `none`.
    pub reward_scaling: RewardScaling,
    /// Added to the group's standard deviation before dividing by it.
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

/// OPD's teacher.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeacherSection {
    /// An HF model directory with the student's tokenizer.
    pub path: PathBuf,
    /// `c` in the advantage `−c · (log π − log π_teacher)`.
    pub coef: f64,
    /// Minimise the full-vocabulary reverse KL instead (teacher logits are local).
    pub full_vocab: bool,
}

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
        resolve_shared(base, &mut config.model, &mut config.data, &mut config.output, config.eval.as_mut().map(|e| &mut e.rows));
        config.teacher.iter_mut().for_each(|t| resolve(base, &mut t.path));
        config.task.resolve_paths(base);
        let refusal = |refusal| refused(path, text, Family::PolicyGradient, refusal);
        config.check().map_err(refusal)?;
        method.map(|m| config.check_method(m)).transpose().map_err(refusal)?;
        if method == Some(Method::Grpo) && config.reward.is_none() {
            config.reward = Some(RewardConfig::default()); // outcome
        }
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

    /// What must hold over `world` replicas ([`PgSettings::check_world`]): besides the step's
    /// split, `reward_scaling = "batch"` runs on one replica (each would divide by its own
    /// share's standard deviation; TRL gathers the rewards of every process first).
    pub fn check_world(&self, world: usize) -> std::result::Result<(), String> {
        if world > 1 && self.teacher.is_none() && self.loss.reward_scaling == RewardScaling::Batch {
            return Err(format!(
                "[loss] reward_scaling = \"batch\" runs on one replica only (each of the {world} would divide by its own share's standard deviation)"
            ));
        }
        self.settings().check_world(world)
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
                kv_memory: r.kv_memory.map(crate::generate::gib_bytes),
                max_prefill_tokens: r.max_prefill_tokens,
                dtype: self.model.dtype,
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
        let t = &self.train;
        self.from_dir().map_err(|m| Refusal::at("model", self.model.init.as_ref().map(|_| "init"), m))?;
        self.loss.rejection().map_err(|m| Refusal::at("loss", Some("rollout_rs"), format!("[loss] {m}")))?;
        let prompts = self.prompts().map_err(|m| Refusal::at("data", Some("kind"), m))?;
        t.total_steps(|_| 0)?;
        self.output.check()?;
        if prompts.dir.is_some() != prompts.files.is_empty() {
            return Err("[data] needs exactly one of `dir` (per-op files) or `files`".into());
        }
        if !(self.loss.kl_coef.is_finite() && self.loss.kl_coef >= 0.0) {
            return Err(Refusal::at("loss", Some("kl_coef"), format!("[loss] kl_coef must be a finite number >= 0 (got {})", self.loss.kl_coef)));
        }
        if !(self.loss.epsilon.is_finite() && self.loss.epsilon > 0.0) {
            // A group whose rewards all agree has std 0: 0 / (0 + epsilon) must stay 0, not NaN.
            return Err(Refusal::at("loss", Some("epsilon"), format!("[loss] epsilon must be a finite number > 0 (got {})", self.loss.epsilon)));
        }
        let l = &self.loss;
        for (key, value) in [("clip_ratio", Some(l.clip_ratio)), ("clip_ratio_low", l.clip_ratio_low), ("clip_ratio_high", l.clip_ratio_high)] {
            if let Some(v) = value.filter(|v| !(v.is_finite() && *v >= 0.0)) {
                return Err(Refusal::at("loss", Some(key), format!("[loss] {key} must be a finite number >= 0 (got {v})")));
            }
        }
        if l.clip_ratio_c.is_nan() || l.clip_ratio_c <= 1.0 {
            return Err(Refusal::at("loss", Some("clip_ratio_c"), format!("[loss] clip_ratio_c (the dual clip) must exceed 1 (got {})", l.clip_ratio_c)));
        }
        if let Some(coef) = self.teacher.as_ref().map(|t| t.coef).filter(|c| !(c.is_finite() && *c > 0.0)) {
            // (0 trains on the reference KL alone; below 0 pushes the student away from the teacher.)
            return Err(Refusal::at("teacher", Some("coef"), format!("[teacher] coef must be a finite number > 0 (got {coef})")));
        }
        if let Some(teacher) = self.teacher.as_ref().filter(|t| t.full_vocab) {
            // The full-vocabulary loss is the KL itself: no advantage to scale, no surrogate.
            let ignored = [
                (teacher.coef != 1.0).then_some(("teacher", "coef")),
                (l.policy_loss != PolicyLossMode::default()).then_some(("loss", "policy_loss")),
                l.tis_imp_ratio_cap.is_some().then_some(("loss", "tis_imp_ratio_cap")),
            ];
            if let Some((section, key)) = ignored.into_iter().flatten().next() {
                return Err(Refusal::at(section, Some(key), format!(
                    "[{section}] {key} does not apply with [teacher] full_vocab = true (the loss is the full-vocabulary KL to the teacher; coef, the policy loss and its importance weights shape the sampled-token advantage)"
                )));
            }
        }
        if self.teacher.is_some() && l.reward_scaling != RewardScaling::Group {
            return Err(Refusal::at("loss", Some("reward_scaling"), "[loss] reward_scaling scales GRPO's rewards: OPD's teacher signal takes none"));
        }
        #[cfg(feature = "code")]
        if let Some(crate::tasks::RewardConfig::Code { max_tests: Some(0), .. }) = self.reward {
            return Err(Refusal::at("reward", Some("max_tests"), "[reward] max_tests must be at least 1 (leave it out for every test)"));
        }
        self.optimizer.check().map_err(|(key, m)| Refusal::at("optimizer", Some(key), m))?;
        if self.loss.reward_scaling != RewardScaling::Group && self.loss.adv_estimator.name() != "grpo" {
            return Err(Refusal::at("loss", Some("reward_scaling"), format!("[loss] reward_scaling applies to adv_estimator \"grpo\" only (got \"{}\")", self.loss.adv_estimator.name())));
        }
        if self.teacher.is_some() && (self.loss.adv_estimator != AdvEstimator::default() || self.loss.overlong_buffer.is_some() || self.rollout.filter_groups.is_some()) {
            return Err("[loss] adv_estimator, [loss.overlong_buffer] and [rollout.filter_groups] shape rewards: OPD's teacher signal takes none".into());
        }
        self.settings().check()?;
        self.schedule.build(self.optimizer.lr, 1)?;
        Ok(())
    }
}
