//! The policy-gradient [`Objective`] shared by GRPO and on-policy distillation. One step, as
//! named stages (each a function of its own, in this order in `updates` and `loss`):
//!
//! 1. **rollout** (`draw`, `generate`): the replica's share of the step's prompts, `n`
//!    responses each from the current policy;
//! 2. **score** (`rewarded`): rewards (DAPO's overlong shaping if set), optionally DAPO's dynamic
//!    sampling (groups whose rewards all agree are dropped and more prompts are rolled out, at
//!    most `max_num_gen_batches` generations); OPD has no rewards;
//! 3. **advantage**: the named estimator ([`AdvEstimator`], `sequence_advantages`) over each
//!    prompt's group, or the teacher's per-token signal (OPD, `distilled`) — the only
//!    difference between the two;
//! 4. **lay-out** (`lay_out`): mini-batches of `mini_batch` prompts (one optimizer update each)
//!    split into micro-batches, whose losses are scaled by 1 / (micro-batches in the mini-batch)
//!    as verl's `dp_actor.update_policy` does, with old log-probs (the policy before this
//!    step's updates), reference log-probs (when β > 0), the teacher's and entropies computed
//!    once with the learner's own forward pass;
//! 5. **policy loss and aggregation** ([`Objective::loss`]): the named policy loss
//!    ([`PolicyLossMode`]) aggregated by the named mode ([`LossAgg`]), its per-token losses
//!    weighted by truncated importance sampling when `tis_imp_ratio_cap` is set; the tokens
//!    rollout rejection sampling rejects (`rollout_rs`, [`super::rejection`]) leave every term
//!    of the loss.

use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::advantage::{AdvEstimator, AdvParams, Outcomes, RewardScaling, distillation_advantages, zero_std_fraction};
use super::batch::{ResponseBatch, ResponseLayout, response_hidden};
use super::loss::{Clip, KlEstimator, LossAgg, PolicyLossConfig, PolicyLossInputs, PolicyLossMode, aggregate, kl_penalty, masked_mean, reverse_kl, tis_weights};
use super::prompts::{Prompt, PromptSet};
use super::reward::Reward;
use super::rollout::{Response, RolloutSettings, rollout};
use crate::train::metrics as metric;
use crate::error::{Error, Result};
use crate::generate::StepTimes;
use crate::model::Qwen2;
use crate::model::logprobs::{target_logprobs, target_reverse_kl, target_scores};
use crate::tasks::Item;
use crate::tokenizer::Tokenizer;
use crate::train::Objective;

/// Where advantages come from.
pub enum Signal<B: Backend> {
    /// GRPO: a verifiable reward per response, centred (and scaled) within its prompt's group.
    Rewards { reward: Box<dyn Reward>, estimator: AdvEstimator, scaling: RewardScaling, epsilon: f64 },
    /// OPD: a teacher scores the sampled tokens; advantage `−coef · (log π − log π_teacher)`.
    /// With `full_vocab`, the loss is instead the full-vocabulary reverse KL to the teacher.
    Teacher { model: Box<Qwen2<B>>, coef: f64, full_vocab: bool },
}

/// DAPO's overlong reward shaping (verl's `reward_model.overlong_buffer`, TOML
/// `[loss.overlong_buffer]`): a response of `L` tokens beyond `max_response_length − len` gets
/// `min(−(L − (max_response_length − len)) / len · penalty_factor, 0)` added to its reward.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlongBuffer {
    /// verl's `enable` (the section's presence enables it unless `enable = false`).
    #[serde(default = "yes")]
    pub enable: bool,
    /// The buffer's length in tokens (verl's `len`), at most `max_response_length`.
    pub len: usize,
    /// The penalty at `max_response_length` (verl's `penalty_factor`, default 1).
    #[serde(default = "one")]
    pub penalty_factor: f64,
}

impl OverlongBuffer {
    /// The penalty (≤ 0) of a response of `length` tokens.
    pub fn penalty(&self, length: usize, max_response_length: usize) -> f64 {
        let expected = max_response_length as f64 - self.len as f64;
        let exceed = length as f64 - expected;
        (-exceed / self.len as f64 * self.penalty_factor).min(0.0)
    }
}

/// DAPO's dynamic sampling (verl's `algorithm.filter_groups`, TOML `[rollout.filter_groups]`):
/// groups whose rewards all agree (no signal for group baselines) are dropped and further
/// batches of the step's prompts (another shuffle of the prompt set each) are rolled out until
/// the step has `prompts_per_step` informative groups, for at most `max_num_gen_batches`
/// generations in all; past that bound the step is filled up with the dropped groups (verl
/// raises an error instead) and trains anyway. Groups of one response are kept, as in verl. The
/// filter reads the rewards the advantages see (after the overlong shaping). The rule is verl
/// 0.9.1's (`trainer/ppo/v1/replay_buffer.py`, `_dapo_filtered_keys`: a group of more than one
/// whose `np.std` is 0 is evicted); verl refills through its asynchronous replay buffer, kiln by
/// further synchronous generations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterGroups {
    #[serde(default = "yes")]
    pub enable: bool,
    /// Generations per step at most (verl's `max_num_gen_batches`; here ≥ 1, default 10).
    #[serde(default = "ten")]
    pub max_num_gen_batches: usize,
}

fn yes() -> bool {
    true
}
fn one() -> f64 {
    1.0
}
fn ten() -> usize {
    10
}

/// The step's shape and the loss settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PgSettings {
    pub rollout: RolloutSettings,
    /// Prompts per step (verl's `train_batch_size`).
    pub prompts_per_step: usize,
    /// Prompts per optimizer update (verl's `ppo_mini_batch_size`).
    pub mini_batch: usize,
    /// Responses per micro-batch (verl's `ppo_micro_batch_size_per_gpu`).
    pub micro_batch: usize,
    pub clip: Clip,
    pub agg: LossAgg,
    /// The policy loss by name (`vanilla`: the seed's clipped surrogate).
    pub policy_loss: PolicyLossMode,
    /// Truncated importance sampling's cap (`None`: off).
    pub tis_imp_ratio_cap: Option<f64>,
    /// Rollout rejection sampling (masked importance sampling; `None`: off).
    pub rejection: Option<super::rejection::Rejection>,
    /// DAPO's overlong reward shaping (`None`: off).
    pub overlong_buffer: Option<OverlongBuffer>,
    /// DAPO's dynamic sampling (`None`: off).
    pub filter_groups: Option<FilterGroups>,
    /// The KL term to the reference and its coefficient β; `None` for β = 0.
    pub kl: Option<(KlEstimator, f64)>,
    /// Prompt order and rollout sampling.
    pub seed: u64,
}

impl PgSettings {
    /// Whether a step splits over `world` data-parallel replicas (whole prompt groups and whole
    /// micro-batches on each), as a message; `kiln rl`, `kiln opd` and `kiln release run` check
    /// it before loading anything.
    pub fn check_world(&self, world: usize) -> std::result::Result<(), String> {
        if world == 0 || !self.prompts_per_step.is_multiple_of(world) || !self.mini_batch.is_multiple_of(world) {
            return Err(format!("[train] prompts_per_step ({}) and mini_batch ({}) must be multiples of the {world} replicas", self.prompts_per_step, self.mini_batch));
        }
        if world > 1 && self.filter_groups.is_some_and(|f| f.enable) {
            return Err("[rollout.filter_groups] (dynamic sampling) runs on one replica only".into());
        }
        if !(self.mini_batch / world * self.rollout.n).is_multiple_of(self.micro_batch) {
            return Err(format!(
                "a replica's share of a mini-batch (mini_batch {} / {world} replicas × n {}) must be a multiple of micro_batch ({})",
                self.mini_batch, self.rollout.n, self.micro_batch
            ));
        }
        Ok(())
    }

    /// Settings that cannot work together, as a message.
    pub fn check(&self) -> std::result::Result<(), String> {
        let (r, c) = (&self.rollout, &self.clip);
        if r.n == 0 || r.max_response_length == 0 || r.batch_size == 0 || self.prompts_per_step == 0 || self.mini_batch == 0 || self.micro_batch == 0 {
            return Err("n, max_response_length, batch_size, prompts_per_step, mini_batch and micro_batch must be positive".into());
        }
        if !self.prompts_per_step.is_multiple_of(self.mini_batch) {
            return Err(format!("prompts_per_step ({}) must be a multiple of mini_batch ({})", self.prompts_per_step, self.mini_batch));
        }
        let max = crate::train::config::MAX_SEQUENCES_PER_STEP;
        if self.prompts_per_step.checked_mul(r.n).is_none_or(|n| n > max) {
            return Err(format!("a step's responses (prompts_per_step {} × n {}) are more than {max}", self.prompts_per_step, r.n));
        }
        if !(self.mini_batch * r.n).is_multiple_of(self.micro_batch) {
            return Err(format!(
                "a mini-batch's responses (mini_batch {} × n {}) must be a multiple of micro_batch ({})",
                self.mini_batch, r.n, self.micro_batch
            ));
        }
        r.sampler.check().map_err(|e| format!("[rollout] {e}"))?;
        if r.kv_memory == Some(0) {
            return Err("[rollout] kv_memory must be more than 0 GiB".into());
        }
        if r.max_prefill_tokens == 0 {
            return Err("[rollout] max_prefill_tokens must be at least 1".into());
        }
        // Written so that NaN fails too (it compares false with everything).
        if !(c.dual > 1.0 && c.low >= 0.0 && c.high >= 0.0) {
            return Err(format!("clip ratios must be non-negative and the dual clip must exceed 1 (got {c:?})"));
        }
        if self.kl.is_some_and(|(_, beta)| !(beta.is_finite() && beta > 0.0)) {
            return Err("a KL term needs a positive coefficient".into());
        }
        if let Some(cap) = self.tis_imp_ratio_cap.filter(|c| !(c.is_finite() && *c > 0.0)) {
            return Err(format!("[loss] tis_imp_ratio_cap must be positive (got {cap})"));
        }
        if let Some(o) = self.overlong_buffer.filter(|o| o.enable) {
            if o.len == 0 || o.len > r.max_response_length || !(o.penalty_factor.is_finite() && o.penalty_factor >= 0.0) {
                return Err(format!(
                    "[loss.overlong_buffer] needs 0 < len <= max_response_length ({}) and a finite penalty_factor >= 0 (got len {}, penalty_factor {})",
                    r.max_response_length, o.len, o.penalty_factor
                ));
            }
        }
        if self.filter_groups.is_some_and(|f| f.enable && f.max_num_gen_batches == 0) {
            return Err("[rollout.filter_groups] max_num_gen_batches must be at least 1".into());
        }
        Ok(())
    }
}

/// GRPO or OPD as an [`Objective`]; see the module docs.
pub struct PolicyGradient<B: AutodiffBackend> {
    settings: PgSettings,
    prompts: PromptSet,
    signal: Signal<B::InnerBackend>,
    reference: Option<Qwen2<B::InnerBackend>>,
    tokenizer: Tokenizer,
    eos_ids: Vec<u32>,
    pad_id: u32,
    step_metrics: Map<String, Value>,
    /// Data-parallel replica `rank` of `world` (see [`PolicyGradient::shard`]).
    rank: usize,
    world: usize,
}

/// One micro-batch: the responses' layout and the per-token tensors of the loss.
pub struct PgMicro<B: AutodiffBackend> {
    layout: ResponseLayout,
    batch: ResponseBatch<B>,
    old: Tensor<B, 2>,
    advantages: Tensor<B, 2>,
    reference: Option<Tensor<B, 2>>,
    /// The rollout engine's log-probs of the sampled tokens (for truncated importance sampling).
    rollout: Option<Tensor<B, 2>>,
    /// 1 / micro-batches of its update (the loss scale).
    scale: f64,
    /// 1 / micro-batches of the step (metrics add up to step means).
    weight: f64,
}

/// Per-token values of one micro-batch computed before the updates, `[rows · R]` each.
struct Scored {
    old: Vec<f32>,
    entropy: Vec<f32>,
    reference: Option<Vec<f32>>,
}

/// The id responses and prompts are padded with: the tokenizer's pad token, else its EOS, else 0.
pub(crate) fn pad_id(tokenizer: &Tokenizer) -> u32 {
    tokenizer.pad_id().or_else(|| tokenizer.eos_id()).unwrap_or(0)
}

impl<B: AutodiffBackend> PolicyGradient<B> {
    /// The objective over `prompts`. `reference` is the frozen initial policy (required when
    /// `settings.kl` is set, and not loaded otherwise).
    pub fn new(
        settings: PgSettings,
        prompts: PromptSet,
        signal: Signal<B::InnerBackend>,
        reference: Option<Qwen2<B::InnerBackend>>,
        tokenizer: Tokenizer,
        eos_ids: Vec<u32>,
    ) -> Result<Self> {
        settings.check().map_err(Error::InvalidInput)?;
        let s = &settings;
        if s.kl.is_some() != reference.is_some() {
            return Err(Error::InvalidInput("a reference model is needed exactly when the KL coefficient is positive".into()));
        }
        if prompts.steps_per_epoch(s.prompts_per_step) == 0 {
            return Err(Error::InvalidInput(format!(
                "{} prompts do not fill one step of [train] prompts_per_step = {} ({} longer than max_prompt_length dropped)",
                prompts.len(),
                s.prompts_per_step,
                prompts.report.filtered_overlong
            )));
        }
        let pad_id = pad_id(&tokenizer);
        Ok(Self { settings, prompts, signal, reference, tokenizer, eos_ids, pad_id, step_metrics: Map::new(), rank: 0, world: 1 })
    }

    /// This objective as data-parallel replica `rank` of `world`: of every mini-batch of the
    /// step's prompts it rolls out its consecutive share (`mini_batch / world` prompts, whole
    /// groups, so group advantages are unchanged) with its own sampling seed, so that the
    /// replicas' mean gradient is the one of the mini-batch on one device (verl's
    /// `ppo_mini_batch_size` is global, `ppo_micro_batch_size_per_gpu` per replica).
    pub fn shard(mut self, rank: usize, world: usize) -> Result<Self> {
        self.settings.check_world(world).map_err(Error::InvalidInput)?;
        (self.rank, self.world) = (rank, world);
        Ok(self)
    }

    /// The prompts.
    pub fn prompts(&self) -> &PromptSet {
        &self.prompts
    }

    /// Old and reference log-probs and entropies of one micro-batch (no gradients).
    fn score(&self, policy: &Qwen2<B::InnerBackend>, layout: &ResponseLayout) -> Scored {
        let device = policy.device();
        let batch = layout.to_device::<B::InnerBackend>(&device);
        let t = self.settings.rollout.sampler.temperature;
        let scores = |model: &Qwen2<B::InnerBackend>, entropy| target_scores(model, response_hidden(model, &batch, t), batch.targets.clone(), entropy);
        let (old, entropy) = scores(policy, true);
        let (old, entropy) = (host(old), host(entropy.expect("asked for")));
        Scored { old, entropy, reference: self.reference.as_ref().map(|r| host(scores(r, false).0)) }
    }
}

fn host<BB: Backend>(tensor: Tensor<BB, 2>) -> Vec<f32> {
    tensor.into_data().convert::<f32>().into_vec().expect("f32")
}

/// The rollout seed of `step`: a draw from the run seed's stream `step`.
fn step_seed(seed: u64, step: u64) -> u64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(step);
    rng.next_u64()
}

/// The rollout's log-probs of a micro-batch's responses that truncated importance sampling and
/// rejection compare with the learner's, `[rows · R]`, 0 on padding: under the sampling
/// distribution (temperature and top-k/top-p applied: vLLM's `processed_logprobs`, which verl
/// reads), since the learner scores the tempered distribution; the raw ones for greedy rollouts.
fn rollout_logprobs(layout: &ResponseLayout, chunk: &[Response], greedy: bool) -> Vec<f32> {
    let width = layout.response_width;
    let mut out = vec![0.0; layout.rows() * width];
    for (row, response) in chunk.iter().enumerate() {
        let values = if greedy { &response.raw_logprobs } else { &response.sampler_logprobs };
        out[row * width..row * width + values.len()].copy_from_slice(values);
    }
    out
}

/// Dynamic sampling's groups: informative ones (rewards differ, or a group of one) and dropped
/// ones, each with its prompt, responses and scores.
#[derive(Default)]
struct Groups<'p> {
    kept: Vec<(&'p Prompt, Vec<Response>, Vec<f64>)>,
    dropped: Vec<(&'p Prompt, Vec<Response>, Vec<f64>)>,
}

impl<'p> Groups<'p> {
    fn add(&mut self, prompts: &[&'p Prompt], responses: Vec<Response>, scores: Vec<f64>) {
        let mut by_group: Vec<(Vec<Response>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); prompts.len()];
        for (response, score) in responses.into_iter().zip(scores) {
            let entry = &mut by_group[response.group];
            entry.0.push(response);
            entry.1.push(score);
        }
        for (prompt, (responses, scores)) in prompts.iter().zip(by_group) {
            let informative = scores.len() == 1 || scores.iter().any(|&x| x != scores[0]);
            let target = if informative { &mut self.kept } else { &mut self.dropped };
            target.push((*prompt, responses, scores));
        }
    }

    /// `count` groups (informative first, then dropped ones), renumbered in order.
    fn take(self, count: usize) -> (Vec<&'p Prompt>, Vec<Response>, Vec<f64>) {
        let (mut prompts, mut responses, mut scores) = (Vec::new(), Vec::new(), Vec::new());
        for (group, (prompt, rs, ss)) in self.kept.into_iter().chain(self.dropped).take(count).enumerate() {
            prompts.push(prompt);
            responses.extend(rs.into_iter().map(|r| Response { group, ..r }));
            scores.extend(ss);
        }
        (prompts, responses, scores)
    }
}

/// Running sums of the step's per-token statistics.
#[derive(Default)]
struct TokenStats {
    tokens: f64,
    entropy: f64,
    teacher_kl: f64,
    advantage: f64,
    advantage_min: f64,
    advantage_max: f64,
    logprob_diff_max: f64,
    logprob_diff: f64,
}

impl<B: AutodiffBackend> Objective<B> for PolicyGradient<B> {
    type Micro = PgMicro<B>;

    /// One RL step as named stages: rollout → score → advantage → lay-out (the policy loss and
    /// its aggregation follow in [`Objective::loss`]).
    fn updates(&mut self, model: &Qwen2<B>, step: u64) -> Result<Vec<Vec<Self::Micro>>> {
        let began = Instant::now();
        let policy = model.valid();
        let mut metrics = Map::new();
        // rollout: this replica's share of the step's prompts, `n` responses each
        let (prompts, seed) = self.draw(step)?;
        let (responses, mut engine) = self.generate(&policy, &prompts, seed)?;
        let mut rollout_s = began.elapsed().as_secs_f64();
        // score and advantage: a reward per response and the estimator's advantage (GRPO), or
        // the teacher, whose per-token advantages come with each micro-batch's scores (OPD)
        let (prompts, responses, advantages) = match &self.signal {
            Signal::Rewards { reward, estimator, scaling, epsilon } => {
                let rewarded = self.rewarded(reward.as_ref(), &policy, step, seed, prompts, responses)?;
                rollout_s += rewarded.rollout_s;
                engine.add(&rewarded.engine);
                metrics.extend(rewarded.metrics);
                let params = AdvParams { epsilon: *epsilon, scaling: *scaling };
                let sequence = sequence_advantages(*estimator, &params, &rewarded.responses, &rewarded.scores, &mut metrics)?;
                (rewarded.prompts, rewarded.responses, StepAdvantages::Sequence(sequence))
            }
            Signal::Teacher { model, coef, .. } => (prompts, responses, StepAdvantages::Teacher { model, coef: *coef }),
        };
        // lay-out: mini-batches (one optimizer update each) of micro-batches, with their old,
        // reference and teacher log-probs from the learner's own forward pass
        let scoring_began = Instant::now();
        let (updates, stats) = self.lay_out(model, &policy, &prompts, &responses, &advantages)?;
        let scoring_s = scoring_began.elapsed().as_secs_f64();

        metric::PROMPTS.set(&mut metrics, prompts.len());
        metrics.insert("updates".into(), json!(updates.len()));
        metrics.extend(token_metrics(&responses, &stats, matches!(advantages, StepAdvantages::Teacher { .. })));
        metrics.insert("rollout_s".into(), json!(rollout_s));
        // The generation engine's prefill passes (`[rollout] max_prefill_tokens`; the mean over
        // replicas) and the most KV-cache memory its blocks took at once (0 on the batch-shaped
        // cache; `_max`: the largest replica's).
        metrics.insert("rollout_prefill_passes".into(), json!(engine.prefills));
        metrics.insert("rollout_kv_mib_max".into(), json!(engine.kv_bytes_peak as f64 / (1u64 << 20) as f64));
        metric::ROLLOUT_TOKENS_PER_S.set(&mut metrics, stats.tokens / rollout_s);
        metrics.insert("logprob_s".into(), json!(scoring_s));
        self.step_metrics = metrics;
        Ok(updates)
    }

    fn loss(&mut self, model: &Qwen2<B>, micro: &Self::Micro) -> Result<(Tensor<B, 1>, Map<String, Value>)> {
        let s = &self.settings;
        let batch = &micro.batch;
        // The targets' log-probabilities and OPD's full-vocabulary reverse KL, both through the
        // chunked head (no `[rows, R, V]` logits) where the backend takes it.
        let t = s.rollout.sampler.temperature;
        // (The hidden states are divided by it: exact for a head without a bias, Qwen2's.)
        let tempered = t != 1.0 && !s.rollout.sampler.is_greedy();
        let teacher_biased = matches!(&self.signal, Signal::Teacher { model, .. } if model.head_has_bias());
        if tempered && (model.head_has_bias() || teacher_biased || self.reference.as_ref().is_some_and(Qwen2::head_has_bias)) {
            return Err(Error::InvalidInput(format!("[rollout] temperature {t}: a model whose LM head has a bias trains at temperature 1 only")));
        }
        let hidden = response_hidden(model, batch, t);
        let log_prob = target_logprobs(model, hidden.clone(), batch.targets.clone());
        let max_length = s.rollout.max_response_length;
        let mut metrics = Map::new();
        let weighted = |metrics: &mut Map<String, Value>, key: &str, value: Tensor<B, 1>| {
            metrics.insert(key.into(), json!(value.into_scalar().elem::<f64>() * micro.weight));
        };
        // Rejected tokens leave every term of the loss and its aggregation's counts, as verl
        // drops them from the response mask the actor update reads.
        let mask = match (&s.rejection, &micro.rollout) {
            (Some(rejection), Some(rollout)) => {
                let kept = rejection.apply(micro.old.clone(), rollout.clone(), &batch.mask);
                weighted(&mut metrics, "rollout_rs_masked_fraction", masked_mean(batch.mask.clone() - kept.clone(), &batch.mask));
                kept
            }
            _ => batch.mask.clone(),
        };
        let mut loss = match &self.signal {
            Signal::Teacher { model: teacher, full_vocab: true, .. } => {
                let inner = micro.layout.to_device::<B::InnerBackend>(&teacher.device());
                let teacher_hidden = response_hidden(teacher, &inner, t);
                // (The whole-logits fallback reuses the student's hidden states: a second forward
                // pass doubled its compute and activations.)
                let per_token = match target_reverse_kl(model, hidden.clone(), teacher, teacher_hidden.clone()) {
                    Some(kl) => kl,
                    None => reverse_kl(model.logits(hidden), Tensor::from_inner(teacher.logits(teacher_hidden))),
                };
                let kl = aggregate(per_token, &mask, s.agg, max_length);
                weighted(&mut metrics, "teacher_kl_full", kl.clone().detach());
                kl
            }
            _ => {
                let is_weights = match (s.tis_imp_ratio_cap, &micro.rollout) {
                    (Some(cap), Some(rollout)) => {
                        let w = tis_weights(micro.old.clone(), rollout.clone(), &batch.mask, cap);
                        weighted(&mut metrics, "tis_weight_mean", masked_mean(w.clone(), &batch.mask));
                        Some(w)
                    }
                    _ => None,
                };
                let inputs = PolicyLossInputs {
                    log_prob: log_prob.clone(),
                    old_log_prob: micro.old.clone(),
                    advantages: micro.advantages.clone(),
                    mask: mask.clone(),
                    is_weights,
                };
                let pg = s.policy_loss.compute(inputs, &PolicyLossConfig { clip: s.clip, agg: s.agg, max_response_length: max_length });
                weighted(&mut metrics, "pg_loss", pg.loss.clone().detach());
                weighted(&mut metrics, "clipfrac", pg.clipfrac);
                weighted(&mut metrics, "clipfrac_low", pg.clipfrac_low);
                weighted(&mut metrics, "clipfrac_high", pg.clipfrac_high);
                weighted(&mut metrics, "clipfrac_dual", pg.clipfrac_dual);
                weighted(&mut metrics, "ppo_kl", pg.ppo_kl);
                pg.loss
            }
        };
        if let (Some((estimator, beta)), Some(reference)) = (s.kl, &micro.reference) {
            let kl = aggregate(kl_penalty(log_prob, reference.clone(), estimator), &mask, s.agg, max_length);
            weighted(&mut metrics, metric::KL_REF.key(), kl.clone().detach());
            loss = loss + kl * beta;
        }
        metric::TOKENS.set(&mut metrics, micro.layout.tokens());
        Ok((loss * micro.scale, metrics))
    }

    fn step_metrics(&mut self) -> Map<String, Value> {
        std::mem::take(&mut self.step_metrics)
    }

    fn state(&self) -> Value {
        json!({ "seed": self.settings.seed, "prompts": self.prompts.len() })
    }

    fn restore(&mut self, state: &Value) -> Result<()> {
        if state["prompts"].as_u64() != Some(self.prompts.len() as u64) || state["seed"].as_u64() != Some(self.settings.seed) {
            return Err(Error::InvalidInput(format!(
                "the checkpoint was trained on other prompts ({} prompts in the order of seed {}; now {} prompts, seed {}): the prompts' order follows them and the seed, so not even --allow-config-change continues it; resume with the same data and seed, or start a new run",
                state["prompts"], state["seed"], self.prompts.len(), self.settings.seed
            )));
        }
        Ok(())
    }
}

impl<B: AutodiffBackend> PolicyGradient<B> {
    /// `n` responses to each of `prompts` from the current policy (in the rollout dtype), and
    /// where the engine spent its time.
    fn generate(&self, policy: &Qwen2<B::InnerBackend>, prompts: &[&Prompt], seed: u64) -> Result<(Vec<Response>, StepTimes)> {
        let s = &self.settings;
        let sampler = policy.clone().in_dtype(s.rollout.dtype.unwrap_or(policy.compute_dtype()));
        rollout(&sampler, &self.tokenizer, &self.eos_ids, prompts, &s.rollout, seed, |_| {})
    }

    /// The responses' rewards, with DAPO's overlong penalty when set.
    fn scores(&self, reward: &dyn Reward, prompts: &[&Prompt], responses: &[Response]) -> Result<Vec<f64>> {
        let batch: Vec<(&str, &Item)> = responses.iter().map(|r| (r.text.as_str(), &prompts[r.group].item)).collect();
        let mut scores = reward.score_batch(&batch)?;
        if let Some(buffer) = self.settings.overlong_buffer.filter(|o| o.enable) {
            let max = self.settings.rollout.max_response_length;
            scores.iter_mut().zip(responses).for_each(|(score, r)| *score += buffer.penalty(r.tokens.len(), max));
        }
        Ok(scores)
    }

    /// This replica's share of step `step`'s prompts (consecutive within each mini-batch: whole
    /// groups) and its sampling seed.
    fn draw(&self, step: u64) -> Result<(Vec<&Prompt>, u64)> {
        let s = &self.settings;
        let share = s.mini_batch / self.world;
        let step_prompts = self.prompts.batch(step, s.prompts_per_step, s.seed)?;
        let prompts = step_prompts.chunks(s.mini_batch).flat_map(|update| update[self.rank * share..(self.rank + 1) * share].iter().copied()).collect();
        let seed = step_seed(s.seed, step) ^ (self.rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Ok((prompts, seed))
    }

    /// The responses' rewards; with DAPO's dynamic sampling, groups whose rewards all agree are
    /// replaced by informative groups of further generations (at most `max_num_gen_batches`).
    fn rewarded<'p>(
        &'p self,
        reward: &dyn Reward,
        policy: &Qwen2<B::InnerBackend>,
        step: u64,
        seed: u64,
        prompts: Vec<&'p Prompt>,
        responses: Vec<Response>,
    ) -> Result<Rewarded<'p>> {
        let s = &self.settings;
        let scores = self.scores(reward, &prompts, &responses)?;
        let mut out = Rewarded { prompts, responses, scores, rollout_s: 0.0, engine: StepTimes::default(), metrics: Map::new() };
        let Some(filter) = s.filter_groups.filter(|f| f.enable) else { return Ok(out) };
        let wanted = out.prompts.len();
        let mut groups = Groups::default();
        groups.add(&out.prompts, out.responses, out.scores);
        let mut generations = 1;
        while groups.kept.len() < wanted && generations < filter.max_num_gen_batches {
            let began = Instant::now();
            let more = self.prompts.batch(step, s.prompts_per_step, s.seed ^ step_seed(s.seed, step).wrapping_add(generations as u64))?;
            let (more_responses, engine) = self.generate(policy, &more, step_seed(seed, generations as u64))?;
            out.rollout_s += began.elapsed().as_secs_f64();
            out.engine.add(&engine);
            let more_scores = self.scores(reward, &more, &more_responses)?;
            groups.add(&more, more_responses, more_scores);
            generations += 1;
        }
        out.metrics.insert("filter_groups_generations".into(), json!(generations));
        out.metrics.insert("filter_groups_informative".into(), json!(groups.kept.len()));
        (out.prompts, out.responses, out.scores) = groups.take(wanted);
        Ok(out)
    }

    /// The step's micro-batches by optimizer update, each with its log-probs (old, reference,
    /// teacher), entropies and per-token advantages, and the step's token statistics.
    fn lay_out(
        &self,
        model: &Qwen2<B>,
        policy: &Qwen2<B::InnerBackend>,
        prompts: &[&Prompt],
        responses: &[Response],
        advantages: &StepAdvantages<'_, B::InnerBackend>,
    ) -> Result<(Vec<Vec<PgMicro<B>>>, TokenStats)> {
        let s = &self.settings;
        let per_update = s.mini_batch / self.world * s.rollout.n;
        let micros_per_update = per_update.div_ceil(s.micro_batch);
        let total_micros = responses.len().div_ceil(per_update) * micros_per_update;
        let device = model.device();
        let mut stats = TokenStats { advantage_min: f64::INFINITY, advantage_max: f64::NEG_INFINITY, ..Default::default() };
        let mut updates = Vec::new();
        for (u, update) in responses.chunks(per_update).enumerate() {
            let mut micros = Vec::new();
            let count = update.len().div_ceil(s.micro_batch);
            for (m, chunk) in update.chunks(s.micro_batch).enumerate() {
                let first = u * per_update + m * s.micro_batch;
                let pairs: Vec<(&[u32], &[u32])> = chunk.iter().map(|r| (prompts[r.group].ids.as_slice(), r.tokens.as_slice())).collect();
                let layout = ResponseLayout::new(&pairs, self.pad_id)?;
                let scored = self.score(policy, &layout);
                let (token_advantages, teacher) = match advantages {
                    StepAdvantages::Sequence(sequence) => (spread(&layout, chunk, &sequence[first..first + chunk.len()]), None),
                    StepAdvantages::Teacher { model, coef } => {
                        let teacher = logprobs_of(model, &layout, self.settings.rollout.sampler.temperature);
                        (distilled(&layout, chunk, &scored.old, &teacher, *coef), Some(teacher))
                    }
                };
                stats.add(&layout, chunk, &scored, teacher.as_deref(), &token_advantages);
                micros.push(PgMicro {
                    batch: layout.to_device::<B>(&device),
                    old: layout.tensor(scored.old, &device),
                    advantages: layout.tensor(token_advantages.iter().map(|&a| a as f32).collect(), &device),
                    reference: scored.reference.map(|r| layout.tensor(r, &device)),
                    rollout: (s.tis_imp_ratio_cap.is_some() || s.rejection.is_some())
                        .then(|| layout.tensor(rollout_logprobs(&layout, chunk, s.rollout.sampler.is_greedy()), &device)),
                    scale: 1.0 / count as f64,
                    weight: 1.0 / total_micros as f64,
                    layout,
                });
            }
            updates.push(micros);
        }
        Ok((updates, stats))
    }
}

/// The rewarded responses of a GRPO step (after dynamic sampling), the extra rollout time it
/// took and its metrics.
struct Rewarded<'p> {
    prompts: Vec<&'p Prompt>,
    responses: Vec<Response>,
    scores: Vec<f64>,
    rollout_s: f64,
    /// The further generations' engine times.
    engine: StepTimes,
    metrics: Map<String, Value>,
}

/// Where a step's per-token advantages come from.
enum StepAdvantages<'t, BB: Backend> {
    /// GRPO: one per response (the estimator's), on each of its tokens.
    Sequence(Vec<f64>),
    /// OPD: `−coef · (log π_old − log π_teacher)` per token.
    Teacher { model: &'t Qwen2<BB>, coef: f64 },
}

/// The advantage stage of GRPO: `estimator` over the responses' `scores` within their prompts'
/// groups, one per response; adds the reward's mean, std and the share of groups without signal
/// to `metrics`.
fn sequence_advantages(estimator: AdvEstimator, params: &AdvParams, responses: &[Response], scores: &[f64], metrics: &mut Map<String, Value>) -> Result<Vec<f64>> {
    let groups: Vec<usize> = responses.iter().map(|r| r.group).collect();
    let lengths: Vec<usize> = responses.iter().map(|r| r.tokens.len()).collect();
    let (mean, std) = mean_and_std(scores);
    metric::REWARD_MEAN.set(metrics, mean);
    metrics.insert("reward_std".into(), json!(std));
    metric::FRAC_ZERO_STD_GROUPS.set(metrics, zero_std_fraction(scores, &groups));
    let outcomes = Outcomes::new(scores, &groups, &lengths)?;
    Ok(estimator.compute(&outcomes, params))
}

/// A micro-batch's per-token advantages, `[rows · R]` (zero on padding): each response's
/// sequence advantage on each of its tokens.
fn spread(layout: &ResponseLayout, chunk: &[Response], sequence: &[f64]) -> Vec<f64> {
    let width = layout.response_width;
    let mut out = vec![0.0; layout.rows() * width];
    for (row, response) in chunk.iter().enumerate() {
        out[row * width..row * width + response.tokens.len()].fill(sequence[row]);
    }
    out
}

/// A micro-batch's per-token distillation advantages, `[rows · R]` (zero on padding).
fn distilled(layout: &ResponseLayout, chunk: &[Response], old: &[f32], teacher: &[f32], coef: f64) -> Vec<f64> {
    let width = layout.response_width;
    let mut out = vec![0.0; layout.rows() * width];
    for (row, response) in chunk.iter().enumerate() {
        let span = row * width..row * width + response.tokens.len();
        out[span.clone()].copy_from_slice(&distillation_advantages(&old[span.clone()], &teacher[span], coef));
    }
    out
}

/// `model`'s log-probs of a micro-batch's sampled tokens, `[rows · R]` (no gradients).
fn logprobs_of<BB: Backend>(model: &Qwen2<BB>, layout: &ResponseLayout, temperature: f32) -> Vec<f32> {
    let batch = layout.to_device::<BB>(&model.device());
    host(target_scores(model, response_hidden(model, &batch, temperature), batch.targets.clone(), false).0)
}

impl TokenStats {
    fn add(&mut self, layout: &ResponseLayout, chunk: &[Response], scored: &Scored, teacher: Option<&[f32]>, advantages: &[f64]) {
        let width = layout.response_width;
        for (row, response) in chunk.iter().enumerate() {
            for (t, &sampled) in response.sampler_logprobs.iter().enumerate() {
                let i = row * width + t;
                self.tokens += 1.0;
                self.entropy += f64::from(scored.entropy[i]);
                if let Some(teacher) = teacher {
                    self.teacher_kl += f64::from(scored.old[i]) - f64::from(teacher[i]);
                }
                self.advantage += advantages[i];
                self.advantage_min = self.advantage_min.min(advantages[i]);
                self.advantage_max = self.advantage_max.max(advantages[i]);
                let diff = (f64::from(sampled) - f64::from(scored.old[i])).abs();
                self.logprob_diff += diff;
                self.logprob_diff_max = self.logprob_diff_max.max(diff);
            }
        }
    }
}

/// Response lengths and the per-token statistics of a step.
fn token_metrics(responses: &[Response], stats: &TokenStats, teacher: bool) -> Map<String, Value> {
    let lengths: Vec<f64> = responses.iter().map(|r| r.tokens.len() as f64).collect();
    let truncated = responses.iter().filter(|r| r.truncated).count();
    let tokens = stats.tokens.max(1.0);
    let mut metrics = Map::new();
    metric::RESPONSES.set(&mut metrics, responses.len());
    metric::RESPONSE_LENGTH_MEAN.set(&mut metrics, mean_and_std(&lengths).0);
    metrics.insert("response_length_max".into(), json!(lengths.iter().copied().fold(0.0, f64::max)));
    metrics.insert("response_length_min".into(), json!(lengths.iter().copied().fold(f64::INFINITY, f64::min)));
    metrics.insert("response_clip_frac".into(), json!(truncated as f64 / responses.len().max(1) as f64));
    metric::ROLLOUT_TOKENS.set(&mut metrics, stats.tokens);
    metrics.insert("advantage_mean".into(), json!(stats.advantage / tokens));
    metrics.insert("advantage_min".into(), json!(stats.advantage_min));
    metrics.insert("advantage_max".into(), json!(stats.advantage_max));
    metrics.insert("entropy".into(), json!(stats.entropy / tokens));
    if teacher {
        metric::TEACHER_KL.set(&mut metrics, stats.teacher_kl / tokens);
    }
    metric::LOGPROB_DIFF_MAX.set(&mut metrics, stats.logprob_diff_max);
    metrics.insert("logprob_diff_mean".into(), json!(stats.logprob_diff / tokens));
    metrics
}

/// Mean and population standard deviation.
fn mean_and_std(values: &[f64]) -> (f64, f64) {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    (mean, (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use burn::backend::{Autodiff, Flex};
    use burn::optim::GradientsParams;

    use super::*;
    use crate::generate::Sampler;
    use crate::model::Qwen2Config;
    use crate::model::logprobs::token_logprobs;
    use crate::rl::batch::response_logits;
    use crate::rl::reward::Task;
    use crate::train::{AdamW, AdamWConfig};

    type B = Autodiff<Flex>;

    /// The share of digits in a response: varied enough on a random model to give advantages.
    struct Digits;

    impl Reward for Digits {
        fn score(&self, response: &str, _task: &Task) -> f64 {
            response.chars().filter(char::is_ascii_digit).count() as f64 / response.chars().count().max(1) as f64
        }
    }

    /// DAPO's overlong penalty (verl's `DAPORewardManager`): 0 up to `max − len` tokens, then
    /// linear down to `−penalty_factor` at `max`.
    #[test]
    fn overlong_penalty_is_linear_in_the_buffer() {
        let buffer = OverlongBuffer { enable: true, len: 4, penalty_factor: 0.5 };
        let penalties: Vec<f64> = [3, 12, 13, 14, 16].iter().map(|&n| buffer.penalty(n, 16)).collect();
        assert_eq!(penalties, vec![0.0, 0.0, -0.125, -0.25, -0.5]);
    }

    /// Dynamic sampling keeps groups whose rewards differ (and groups of one), informative first,
    /// renumbered; dropped groups only fill a short step.
    #[test]
    fn filter_groups_keeps_informative_groups_first() {
        let item = Item { id: String::new(), group: String::new(), level: None, prompt: String::new(), reference: None, gold: Value::Null, source: Default::default() };
        let prompt = |id: u32| Prompt { ids: vec![id], item: item.clone() };
        let owned = [prompt(0), prompt(1), prompt(2)];
        let prompts: Vec<&Prompt> = owned.iter().collect();
        let response = |group| Response { group, tokens: vec![1], sampler_logprobs: vec![0.0], raw_logprobs: vec![0.0], text: String::new(), truncated: false };
        let responses = vec![response(0), response(0), response(1), response(1), response(2)];
        let mut groups = Groups::default();
        groups.add(&prompts, responses, vec![1.0, 1.0, 0.0, 1.0, 0.5]);
        assert_eq!(groups.kept.len(), 2);
        let (kept, responses, scores) = groups.take(3);
        assert_eq!(kept.iter().map(|p| p.ids[0]).collect::<Vec<_>>(), vec![1, 2, 0]);
        assert_eq!(responses.iter().map(|r| r.group).collect::<Vec<_>>(), vec![0, 0, 1, 2, 2]);
        assert_eq!(scores, vec![0.0, 1.0, 0.5, 1.0, 1.0]);
    }

    fn settings() -> PgSettings {
        PgSettings {
            rollout: RolloutSettings { n: 4, sampler: Sampler::default(), max_response_length: 6, batch_size: 64, kv_memory: None, max_prefill_tokens: crate::generate::MAX_PREFILL_TOKENS, dtype: None },
            prompts_per_step: 4,
            mini_batch: 2,
            micro_batch: 4,
            clip: Clip { low: 0.2, high: 0.2, dual: 3.0 },
            agg: LossAgg::TokenMean,
            policy_loss: PolicyLossMode::default(),
            tis_imp_ratio_cap: None,
            rejection: None,
            overlong_buffer: None,
            filter_groups: None,
            kl: None,
            seed: 3,
        }
    }

    /// Settings built in code (not read from a config, whose keys are checked to be finite) with
    /// a NaN clip ratio or KL coefficient are refused, not run with clipping or KL undefined.
    #[test]
    fn nan_clip_ratios_and_kl_coefficients_are_refused() {
        assert!(settings().check().is_ok());
        for clip in [Clip { dual: f64::NAN, ..settings().clip }, Clip { low: f64::NAN, ..settings().clip }, Clip { high: f64::NAN, ..settings().clip }] {
            assert!(PgSettings { clip, ..settings() }.check().is_err_and(|e| e.contains("clip ratios")), "{clip:?}");
        }
        for beta in [f64::NAN, f64::INFINITY, 0.0] {
            let kl = Some((KlEstimator::K3, beta));
            assert!(PgSettings { kl, ..settings() }.check().is_err_and(|e| e.contains("KL")), "{beta}");
        }
        // An infinite overlong penalty (a reward of −inf, NaN advantages for its group).
        let overlong = Some(OverlongBuffer { enable: true, len: 2, penalty_factor: f64::INFINITY });
        assert!(PgSettings { overlong_buffer: overlong, ..settings() }.check().is_err_and(|e| e.contains("a finite penalty_factor")));
        // A step's responses past the bound (the product overflowed in the checks below).
        let (prompts_per_step, n) = (1 << 40, 1 << 30);
        let huge = PgSettings { prompts_per_step, mini_batch: prompts_per_step, rollout: RolloutSettings { n, ..settings().rollout }, ..settings() };
        assert!(huge.check().is_err_and(|e| e.contains("a step's responses (prompts_per_step 1099511627776 × n 1073741824)")));
    }

    /// One optimizer update on the step's first mini-batch raises `Σ A · log π` over its tokens:
    /// the surrogate, the scaling and the optimizer agree on the direction of improvement.
    #[test]
    fn an_update_moves_the_policy_towards_positive_advantages() {
        let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/interplay");
        let tokenizer = Tokenizer::from_file(fixtures.join("qwen2_100M")).unwrap();
        let prompts = PromptSet::load(&[fixtures.join("rows/op2.jsonl")], &tokenizer, 512, Some(4)).unwrap();
        let settings = settings();
        let signal = Signal::Rewards { reward: Box::new(Digits), estimator: AdvEstimator::default(), scaling: RewardScaling::Group, epsilon: 1e-6 };
        let mut objective = PolicyGradient::<B>::new(settings, prompts, signal, None, tokenizer, vec![3]).unwrap();
        let config: Qwen2Config = serde_json::from_str(
            r#"{"vocab_size": 2200, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": true,
                "max_position_embeddings": 512, "rope_theta": 1000000.0, "eos_token_id": 3}"#,
        )
        .unwrap();
        let device = Default::default();
        let model = Qwen2::<B>::random(&config, 2, &device).unwrap();
        let updates = objective.updates(&model, 0).unwrap();
        assert_eq!(updates.len(), 2);
        let micros = &updates[0];
        let objective_value = |model: &Qwen2<B>| -> f64 {
            micros
                .iter()
                .map(|m| {
                    let log_prob = token_logprobs(response_logits(model, &m.batch), m.batch.targets.clone());
                    (log_prob * m.advantages.clone() * m.batch.mask.clone()).sum().into_scalar().elem::<f64>()
                })
                .sum()
        };
        let before = objective_value(&model);
        let names = model.param_names();
        let mut accumulator = burn::optim::GradientsAccumulator::new();
        for micro in micros {
            let (loss, _) = objective.loss(&model, micro).unwrap();
            accumulator.accumulate(&model, GradientsParams::from_grads(loss.backward(), &model));
        }
        let mut optimizer = AdamW::<Flex>::new(AdamWConfig::default());
        let (model, _) = optimizer.update(model, &names, accumulator.grads(), 1e-3);
        let after = objective_value(&model);
        assert!(before.abs() > 0.0, "the rewards should differ within groups");
        assert!(after > before, "Σ A·log π should rise: {before} -> {after}");
    }
}
