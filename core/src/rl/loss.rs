//! The per-token losses of the policy-gradient step, as verl's `core_algos.py` computes them
//! (`docs/interplay.md` §6.2): the clipped surrogate with dual clip, the loss aggregation
//! modes, the KL estimators to a reference policy; plus the full-vocabulary reverse KL of
//! on-policy distillation and the policy's entropy.
//!
//! Every function takes `[responses, tokens]` tensors whose padding is masked out by `mask`
//! (1 for response tokens, 0 for padding); padding may hold anything, even non-finite values.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Bool, DType, Tensor, backend::Backend};
use serde::{Deserialize, Serialize};

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
    /// Sum over all tokens divided by the fixed maximum response length (Dr. GRPO).
    SeqMeanTokenSumNorm,
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
pub fn aggregate<B: Backend>(losses: Tensor<B, 2>, mask: &Tensor<B, 2>, agg: LossAgg, max_response_length: usize) -> Tensor<B, 1> {
    match agg {
        LossAgg::TokenMean => masked_mean(losses, mask),
        LossAgg::SeqMeanTokenMean => {
            let per_sequence = zero_padding(losses, mask).sum_dim(1) / mask.clone().sum_dim(1);
            per_sequence.mean()
        }
        LossAgg::SeqMeanTokenSum => zero_padding(losses, mask).sum_dim(1).mean(),
        LossAgg::SeqMeanTokenSumNorm => zero_padding(losses, mask).sum() / max_response_length as f64,
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

/// verl's `compute_policy_loss_vanilla`: `ratio = exp(clamp(log π − log π_old, ±20))`,
/// `L = max(−A·ratio, −A·clip(ratio, 1−low, 1+high))`, and for `A < 0` `L = min(L, −A·dual)`,
/// aggregated with `agg`.
pub fn policy_loss<B: Backend>(
    log_prob: Tensor<B, 2>,
    old_log_prob: Tensor<B, 2>,
    advantages: Tensor<B, 2>,
    mask: &Tensor<B, 2>,
    clip: Clip,
    agg: LossAgg,
    max_response_length: usize,
) -> PolicyLoss<B> {
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
        loss: aggregate(losses, mask, agg, max_response_length),
        clipfrac,
        clipfrac_low: masked_mean(low.float(), mask),
        clipfrac_high: masked_mean(high.float(), mask),
        clipfrac_dual,
        ppo_kl,
    }
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
