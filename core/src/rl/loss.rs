//! The per-token losses of the policy-gradient step, as verl's `core_algos.py` computes them
//! (`docs/interplay.md` §6.2): the policy losses by name ([`policy_loss_fn`], verl's
//! `register_policy_loss` / `get_policy_loss_fn`: `vanilla` PPO clip with dual clip, `gspo`,
//! `cispo`), truncated importance sampling weights, the loss aggregation modes, the KL
//! estimators to a reference policy; plus the full-vocabulary reverse KL of on-policy
//! distillation and the policy's entropy.
//!
//! Adding a policy loss is one `fn(PolicyLossInputs<B>, &PolicyLossConfig) -> PolicyLoss<B>`
//! and one line of the `policy_loss_registry!` invocation.
//!
//! Every function takes `[responses, tokens]` tensors whose padding is masked out by `mask`
//! (1 for response tokens, 0 for padding); padding may hold anything, even non-finite values.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Bool, DType, Tensor, backend::Backend};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How per-token losses become one number (verl's `loss_agg_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossAgg {
    /// Mean over all response tokens of the micro-batch (verl's default; TRL's "bnpo").
    TokenMean,
    /// Mean over sequences of each sequence's token mean (the GRPO paper; TRL's "grpo").
    SeqMeanTokenMean,
    /// Mean over sequences of each sequence's token sum.
    SeqMeanTokenSum,
    /// Sum over all tokens divided by the fixed maximum response length (verl 0.5.0's
    /// `seq-mean-token-sum-norm`, the seed's).
    SeqMeanTokenSumNorm,
    /// Mean over sequences of each sequence's token sum, divided by the fixed maximum response
    /// length (verl 0.9.1's `seq-mean-token-sum-norm`, Dr. GRPO's normalisation): the seed's
    /// mode divided by the number of sequences.
    SeqMeanTokenSumNormDr,
}

impl LossAgg {
    /// The TOML names (`[loss] agg` or `loss_agg_mode`).
    pub const NAMES: &[&str] = &["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-sum-norm-dr"];
}

/// The clipping of the surrogate (verl's `clip_ratio_low`, `clip_ratio_high`, `clip_ratio_c`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clip {
    /// The ratio is clipped below at `1 - low`.
    pub low: f64,
    /// ... and above at `1 + high` (DAPO's clip-higher uses 0.28).
    pub high: f64,
    /// Dual clip: for negative advantages the loss is capped at `-A · dual` (> 1).
    pub dual: f64,
}

/// KL estimators of `KL(π ‖ π_ref)` on sampled tokens (J. Schulman, "Approximating KL
/// divergence"), with `x = log π − log π_ref`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KlEstimator {
    /// `x`.
    #[serde(rename = "k1", alias = "kl")]
    K1,
    /// `x² / 2`.
    #[serde(rename = "k2", alias = "mse")]
    K2,
    /// `e^{−x} + x − 1` with `−x` clamped to ±20 and the value to ±10 (verl's `low_var_kl`).
    #[serde(rename = "k3", alias = "low_var_kl")]
    K3,
}

/// The values with the mask's padding replaced by 0, then multiplied by the mask (verl's
/// `masked_sum` before summing).
fn zero_padding<B: Backend>(values: Tensor<B, 2>, mask: &Tensor<B, 2>) -> Tensor<B, 2> {
    values.mask_fill(mask.clone().equal_elem(0.0), 0.0) * mask.clone()
}

/// Masked mean over all tokens, `Σ v·m / (Σ m + 1e-8)` (verl's `masked_mean`).
pub fn masked_mean<B: Backend>(values: Tensor<B, 2>, mask: &Tensor<B, 2>) -> Tensor<B, 1> {
    zero_padding(values, mask).sum() / (mask.clone().sum() + 1e-8)
}

/// Aggregates `[responses, tokens]` losses into a scalar; `max_response_length` is the
/// constant divisor of [`LossAgg::SeqMeanTokenSumNorm`] (verl divides by the padded response
/// width, which its rollout pads to `max_response_length`).
///
/// The sequence means leave out responses with no token left (rejection sampling drops whole
/// responses): verl's `agg_loss` takes `masked_mean(seq_losses, seq_mask)` over
/// `seq_mask = (Σ mask > 0)`, and a token mean divides by `Σ mask + 1e-8` (0 / 0 was NaN here).
pub fn aggregate<B: Backend>(losses: Tensor<B, 2>, mask: &Tensor<B, 2>, agg: LossAgg, max_response_length: usize) -> Tensor<B, 1> {
    // (Per-response token counts only for the sequence means.)
    let sequence_mean = |per_sequence: Tensor<B, 2>| {
        let kept = mask.clone().sum_dim(1).greater_elem(0.0).float();
        (per_sequence * kept.clone()).sum() / (kept.sum() + 1e-8)
    };
    match agg {
        LossAgg::TokenMean => masked_mean(losses, mask),
        LossAgg::SeqMeanTokenMean => sequence_mean(zero_padding(losses, mask).sum_dim(1) / (mask.clone().sum_dim(1) + 1e-8)),
        LossAgg::SeqMeanTokenSum => sequence_mean(zero_padding(losses, mask).sum_dim(1)),
        LossAgg::SeqMeanTokenSumNorm => zero_padding(losses, mask).sum() / max_response_length as f64,
        LossAgg::SeqMeanTokenSumNormDr => sequence_mean(zero_padding(losses, mask).sum_dim(1)) / max_response_length as f64,
    }
}

/// The clipped surrogate of one micro-batch and its diagnostics (scalars).
#[derive(Debug, Clone)]
pub struct PolicyLoss<B: Backend> {
    /// The aggregated loss.
    pub loss: Tensor<B, 1>,
    /// Fraction of tokens where clipping is active (verl's `pg_clipfrac`) = low + high.
    pub clipfrac: Tensor<B, 1>,
    /// ... of which the ratio fell below `1 - low` with a negative advantage.
    pub clipfrac_low: Tensor<B, 1>,
    /// ... of which the ratio rose above `1 + high` with a positive advantage.
    pub clipfrac_high: Tensor<B, 1>,
    /// Fraction of tokens where the dual clip caps the loss (verl's `pg_clipfrac_lower`).
    pub clipfrac_dual: Tensor<B, 1>,
    /// Token mean of `log π_old − log π` (verl's `ppo_kl`).
    pub ppo_kl: Tensor<B, 1>,
}

/// The inputs of a policy loss (verl's `PolicyLossFn` arguments), `[responses, tokens]` each.
#[derive(Debug, Clone)]
pub struct PolicyLossInputs<B: Backend> {
    /// `log π` of the sampled tokens under the policy being trained (with gradients).
    pub log_prob: Tensor<B, 2>,
    /// `log π_old`: the learner's log-probs before the step's updates.
    pub old_log_prob: Tensor<B, 2>,
    pub advantages: Tensor<B, 2>,
    /// 1 on response tokens, 0 on padding.
    pub mask: Tensor<B, 2>,
    /// Truncated importance-sampling weights multiplying the per-token losses (verl's
    /// `rollout_is_weights`; [`tis_weights`]); no gradient flows through them.
    pub is_weights: Option<Tensor<B, 2>>,
}

/// The settings a policy loss reads (verl's `ActorConfig` fields and `loss_agg_mode`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyLossConfig {
    pub clip: Clip,
    pub agg: LossAgg,
    /// The constant divisor of the `seq-mean-token-sum-norm` modes.
    pub max_response_length: usize,
}

/// A policy loss: per-token losses aggregated to a scalar, with its diagnostics.
pub type PolicyLossFn<B> = fn(PolicyLossInputs<B>, &PolicyLossConfig) -> PolicyLoss<B>;

/// The registry: `name => function` lines become [`POLICY_LOSS_NAMES`] and [`policy_loss_fn`].
macro_rules! policy_loss_registry {
    ($($name:literal => $function:ident),* $(,)?) => {
        /// The registered policy losses' names (verl's `POLICY_LOSS_REGISTRY` keys; TOML
        /// `[loss] policy_loss`).
        pub const POLICY_LOSS_NAMES: &[&str] = &[$($name),*];

        /// The policy loss registered as `name` (verl's `get_policy_loss_fn`).
        pub fn policy_loss_fn<B: Backend>(name: &str) -> Option<PolicyLossFn<B>> {
            match name {
                $($name => Some($function::<B> as PolicyLossFn<B>),)*
                _ => None,
            }
        }
    };
}

policy_loss_registry! {
    "vanilla" => compute_policy_loss_vanilla,
    "gspo" => compute_policy_loss_gspo,
    "cispo" => compute_policy_loss_cispo,
}

/// A registered policy loss, by name (TOML `[loss] policy_loss`, default `vanilla`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyLossMode(&'static str);

impl PolicyLossMode {
    /// The loss registered as `name`; else an error listing the valid names.
    pub fn from_name(name: &str) -> std::result::Result<Self, String> {
        match POLICY_LOSS_NAMES.iter().find(|n| **n == name) {
            Some(name) => Ok(Self(name)),
            None => Err(format!("unknown policy_loss \"{name}\"; valid names: {}", POLICY_LOSS_NAMES.join(", "))),
        }
    }

    pub fn name(self) -> &'static str {
        self.0
    }

    /// The loss of `inputs` under `config`.
    pub fn compute<B: Backend>(self, inputs: PolicyLossInputs<B>, config: &PolicyLossConfig) -> PolicyLoss<B> {
        policy_loss_fn::<B>(self.0).expect("constructed from a registered name")(inputs, config)
    }
}

impl Default for PolicyLossMode {
    fn default() -> Self {
        Self("vanilla")
    }
}

impl Serialize for PolicyLossMode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for PolicyLossMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Self::from_name(&name).map_err(serde::de::Error::custom)
    }
}

/// The per-token losses times the importance-sampling weights, if any.
fn weighted<B: Backend>(losses: Tensor<B, 2>, is_weights: Option<Tensor<B, 2>>) -> Tensor<B, 2> {
    match is_weights {
        Some(weights) => losses * weights.detach(),
        None => losses,
    }
}

/// `vanilla`, verl's `compute_policy_loss_vanilla`: `ratio = exp(clamp(log π − log π_old, ±20))`,
/// `L = max(−A·ratio, −A·clip(ratio, 1−low, 1+high))`, and for `A < 0` `L = min(L, −A·dual)`;
/// times the IS weights; aggregated with `config.agg`. Inputs `[responses, tokens]`, outputs
/// scalars.
pub fn compute_policy_loss_vanilla<B: Backend>(inputs: PolicyLossInputs<B>, config: &PolicyLossConfig) -> PolicyLoss<B> {
    let PolicyLossInputs { log_prob, old_log_prob, advantages, mask, is_weights } = inputs;
    let clip = config.clip;
    let mask = &mask;
    let log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0);
    let ratio = log_ratio.clone().exp();
    let ppo_kl = masked_mean(-log_ratio, mask);
    let negative_advantages = -advantages.clone();
    let unclipped = negative_advantages.clone() * ratio.clone();
    let clipped = negative_advantages.clone() * ratio.clone().clamp(1.0 - clip.low, 1.0 + clip.high);
    let pessimistic = unclipped.clone().max_pair(clipped.clone());
    let clipfrac = masked_mean(clipped.greater(unclipped).float(), mask);
    let floor = negative_advantages * clip.dual;
    let negative: Tensor<B, 2, Bool> = advantages.clone().lower_elem(0.0);
    let clipfrac_dual = masked_mean(pessimistic.clone().greater(floor.clone()).bool_and(negative.clone()).float(), mask);
    let losses = pessimistic.clone().mask_where(negative.clone(), floor.min_pair(pessimistic));
    let low = ratio.clone().lower_elem(1.0 - clip.low).bool_and(negative);
    let high = ratio.greater_elem(1.0 + clip.high).bool_and(advantages.greater_elem(0.0));
    PolicyLoss {
        loss: aggregate(weighted(losses, is_weights), mask, config.agg, config.max_response_length),
        clipfrac,
        clipfrac_low: masked_mean(low.float(), mask),
        clipfrac_high: masked_mean(high.float(), mask),
        clipfrac_dual,
        ppo_kl,
    }
}

/// `gspo`, verl's `compute_policy_loss_gspo` (GSPO, arXiv 2507.18071): the sequence-level ratio
/// `s_i = exp(mean_t (log π − log π_old))` over each response's tokens, combined per token as
/// `s_i,t = sg[s_i] · π / sg[π]` (value `s_i`, gradient of `log π` per token), its log clamped
/// above at 10; `L = max(−A·s_i,t, −A·clip(s_i,t, 1−low, 1+high))` (no dual clip), times the IS
/// weights, aggregated with `config.agg` (GSPO's paper: `seq-mean-token-mean`). verl's GSPO
/// recipe uses `clip_ratio_low = 3e-4`, `clip_ratio_high = 4e-4`; kiln takes the configured
/// ratios, as verl does. Inputs `[responses, tokens]`, outputs scalars.
pub fn compute_policy_loss_gspo<B: Backend>(inputs: PolicyLossInputs<B>, config: &PolicyLossConfig) -> PolicyLoss<B> {
    let PolicyLossInputs { log_prob, old_log_prob, advantages, mask, is_weights } = inputs;
    let clip = config.clip;
    let mask = &mask;
    let dims = log_prob.dims();
    let negative_approx_kl = log_prob.clone() - old_log_prob;
    let lengths = mask.clone().sum_dim(1).clamp_min(1.0);
    let sequence = (zero_padding(negative_approx_kl.clone(), mask).sum_dim(1) / lengths).detach().expand(dims);
    let log_ratio = (log_prob.clone() - log_prob.detach() + sequence).clamp_max(10.0);
    let ratio = log_ratio.exp();
    let negative_advantages = -advantages.clone();
    let unclipped = negative_advantages.clone() * ratio.clone();
    let clipped = negative_advantages * ratio.clone().clamp(1.0 - clip.low, 1.0 + clip.high);
    let losses = unclipped.clone().max_pair(clipped.clone());
    let clipfrac = masked_mean(clipped.greater(unclipped).float(), mask);
    let low = ratio.clone().lower_elem(1.0 - clip.low).bool_and(advantages.clone().lower_elem(0.0));
    let high = ratio.greater_elem(1.0 + clip.high).bool_and(advantages.greater_elem(0.0));
    PolicyLoss {
        loss: aggregate(weighted(losses, is_weights), mask, config.agg, config.max_response_length),
        clipfrac,
        clipfrac_low: masked_mean(low.float(), mask),
        clipfrac_high: masked_mean(high.float(), mask),
        clipfrac_dual: masked_mean(mask.clone().zeros_like(), mask),
        ppo_kl: masked_mean(-negative_approx_kl, mask),
    }
}

/// `cispo`, verl's `compute_policy_loss_cispo` (CISPO, MiniMax-M1, arXiv 2506.13585): the
/// importance weight `r = exp(clamp(log π − log π_old, ±20))` clipped to `[1−low, 1+high]` and
/// stopped from the gradient, `L = −sg[clip(r)] · A · log π` (every token keeps a gradient), times
/// the IS weights, aggregated with `config.agg`. `clipfrac`: tokens where the clip changed `r`.
/// Inputs `[responses, tokens]`, outputs scalars.
pub fn compute_policy_loss_cispo<B: Backend>(inputs: PolicyLossInputs<B>, config: &PolicyLossConfig) -> PolicyLoss<B> {
    let PolicyLossInputs { log_prob, old_log_prob, advantages, mask, is_weights } = inputs;
    let clip = config.clip;
    let mask = &mask;
    let log_ratio = (log_prob.clone() - old_log_prob).clamp(-20.0, 20.0);
    let ratio = log_ratio.clone().exp().detach();
    let ppo_kl = masked_mean(-log_ratio, mask);
    let clipped = ratio.clone().clamp(1.0 - clip.low, 1.0 + clip.high);
    let losses = -(clipped.clone() * advantages * log_prob);
    let low = ratio.clone().lower_elem(1.0 - clip.low);
    let high = ratio.clone().greater_elem(1.0 + clip.high);
    PolicyLoss {
        loss: aggregate(weighted(losses, is_weights), mask, config.agg, config.max_response_length),
        clipfrac: masked_mean(ratio.not_equal(clipped).float(), mask),
        clipfrac_low: masked_mean(low.float(), mask),
        clipfrac_high: masked_mean(high.float(), mask),
        clipfrac_dual: masked_mean(mask.clone().zeros_like(), mask),
        ppo_kl,
    }
}

/// [`compute_policy_loss_vanilla`] without importance weights (the seed's call).
pub fn policy_loss<B: Backend>(
    log_prob: Tensor<B, 2>,
    old_log_prob: Tensor<B, 2>,
    advantages: Tensor<B, 2>,
    mask: &Tensor<B, 2>,
    clip: Clip,
    agg: LossAgg,
    max_response_length: usize,
) -> PolicyLoss<B> {
    let inputs = PolicyLossInputs { log_prob, old_log_prob, advantages, mask: mask.clone(), is_weights: None };
    compute_policy_loss_vanilla(inputs, &PolicyLossConfig { clip, agg, max_response_length })
}

/// Truncated importance sampling (TIS; verl 0.9.1's `compute_rollout_correction_weights` with
/// `rollout_is = "token"` and one threshold, verl ≤ 0.6's `tis_imp_ratio_cap`): per token
/// `min(exp(clamp(log π_old − log π_rollout, ±20)), cap)`, 0 on padding, without gradient.
/// `old_log_prob` is the learner's (of the tempered distribution), `rollout_log_prob` the rollout
/// engine's under its sampling distribution (vLLM's `processed_logprobs`, as verl reads them);
/// `[responses, tokens]` in and out.
pub fn tis_weights<B: Backend>(old_log_prob: Tensor<B, 2>, rollout_log_prob: Tensor<B, 2>, mask: &Tensor<B, 2>, cap: f64) -> Tensor<B, 2> {
    let raw = zero_padding((old_log_prob - rollout_log_prob).clamp(-20.0, 20.0).exp(), mask);
    raw.clamp_max(cap).detach()
}

/// Per-token KL estimate between the policy and a reference (verl's `kl_penalty`; only k3 is
/// clamped, as there).
pub fn kl_penalty<B: Backend>(log_prob: Tensor<B, 2>, ref_log_prob: Tensor<B, 2>, estimator: KlEstimator) -> Tensor<B, 2> {
    match estimator {
        KlEstimator::K1 => log_prob - ref_log_prob,
        KlEstimator::K2 => (log_prob - ref_log_prob).square() * 0.5,
        KlEstimator::K3 => {
            let d = (ref_log_prob - log_prob).clamp(-20.0, 20.0);
            (d.clone().exp() - d - 1.0).clamp(-10.0, 10.0)
        }
    }
}

/// Per-position reverse KL `Σ_v p_S(v) (log p_S(v) − log p_T(v))` from student and teacher
/// logits `[responses, tokens, vocab]`, over the vocabulary both share (the smaller one, so a
/// padded teacher vocabulary compares on the real ids); computed in f32 (or f64).
pub fn reverse_kl<B: Backend>(student_logits: Tensor<B, 3>, teacher_logits: Tensor<B, 3>) -> Tensor<B, 2> {
    let vocab = student_logits.dims()[2].min(teacher_logits.dims()[2]);
    let student = log_softmax(at_least_f32(student_logits.narrow(2, 0, vocab)), 2);
    let teacher = log_softmax(at_least_f32(teacher_logits.narrow(2, 0, vocab)), 2);
    (student.clone().exp() * (student - teacher)).sum_dim(2).squeeze_dim(2)
}

/// Per-position entropy of the softmax of `logits` `[responses, tokens, vocab]`, in f32 (or
/// f64).
pub use crate::model::logprobs::entropy;

/// Half-precision logits in f32; f32 and f64 as they are.
fn at_least_f32<B: Backend>(logits: Tensor<B, 3>) -> Tensor<B, 3> {
    match logits.dtype() {
        DType::F16 | DType::BF16 => logits.cast(DType::F32),
        _ => logits,
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::NdArray;
    use burn::tensor::TensorData;

    use super::*;

    /// A response that rejection sampling dropped whole (its mask all zeros) leaves the sequence
    /// means, as verl's `agg_loss` leaves it out (`seq_mask`): a NaN and a smaller divisor before.
    #[test]
    fn sequence_means_leave_out_responses_with_no_token() {
        let device = Default::default();
        let tensor = |values: Vec<f64>| Tensor::<NdArray<f64>, 2>::from_data(TensorData::new(values, [3, 2]), &device);
        let losses = tensor(vec![1.0, 3.0, 5.0, 7.0, 9.0, 11.0]);
        let mask = tensor(vec![1.0, 1.0, 0.0, 0.0, 1.0, 0.0]);
        let value = |agg| aggregate(losses.clone(), &mask, agg, 4).into_scalar();
        // Rows: (1 + 3) over 2 tokens, nothing, 9 over 1 token.
        assert!((value(LossAgg::SeqMeanTokenMean) - (2.0 + 9.0) / 2.0).abs() < 1e-6);
        assert!((value(LossAgg::SeqMeanTokenSum) - (4.0 + 9.0) / 2.0).abs() < 1e-6);
        assert!((value(LossAgg::SeqMeanTokenSumNormDr) - (4.0 + 9.0) / 2.0 / 4.0).abs() < 1e-6);
        assert!((value(LossAgg::SeqMeanTokenSumNorm) - 13.0 / 4.0).abs() < 1e-9, "verl's sum over the width, every row");
        assert!((value(LossAgg::TokenMean) - 13.0 / 3.0).abs() < 1e-6);
    }
}
