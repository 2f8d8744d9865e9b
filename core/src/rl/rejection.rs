//! Rollout rejection sampling, the masking half of masked importance sampling (MIS): tokens, or
//! whole responses, whose learner and rollout log-probs diverge beyond a bound leave the policy
//! loss (verl 0.9.1's `compute_rollout_rejection_mask`, `algorithm.rollout_correction.rollout_rs`
//! and `rollout_rs_threshold`; "When Speed Kills Stability", Yao et al. 2025). Truncated
//! importance sampling ([`super::loss::tis_weights`]) caps the weights instead; both may be on.
//!
//! With `r = clamp(log π_old − log π_rollout, ±20)` per token, the divergences are
//! `k1 = −r`, `k2 = r²/2`, `k3 = eʳ − 1 − r`; an option thresholds one of them per token
//! (`token_k*`) or its masked sum, mean or maximum over each response (`seq_sum_k*`,
//! `seq_mean_k*`, `seq_max_k{2,3}`). k1 keeps `ln lower ≤ k1 ≤ ln upper` (bounds are ratios,
//! written `lower_upper`; one number `u` means `1/u_u`); the others keep `k ≤ upper`. Options
//! chain: a token stays only if every option keeps it.

use burn::tensor::{Tensor, backend::Backend};

use super::loss::KlEstimator;

/// What an option thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Token,
    SeqSum,
    SeqMean,
    SeqMax,
}

/// One rejection criterion (one entry of verl's `rollout_rs`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Criterion {
    pub level: Level,
    pub divergence: KlEstimator,
    /// The ratio bounds of k1 (`lower ≤ π_rollout / π_old ≤ upper`); for k2 and k3 only `upper`.
    pub lower: Option<f64>,
    pub upper: f64,
}

/// Most criteria one run chains (keeps [`Rejection`] `Copy`, as the step's settings are).
pub const MAX_CRITERIA: usize = 4;

/// The chained criteria of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rejection {
    criteria: [Option<Criterion>; MAX_CRITERIA],
}

impl Rejection {
    /// verl's `rollout_rs` (comma-separated options) and `rollout_rs_threshold` (one threshold
    /// for all, or one per option, comma-separated), checked as verl checks them.
    pub fn parse(options: &str, thresholds: &str) -> Result<Self, String> {
        let mut names: Vec<&str> = Vec::new();
        for name in options.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        if names.is_empty() {
            return Err("rollout_rs names no option".into());
        }
        if names.len() > MAX_CRITERIA {
            return Err(format!("rollout_rs chains {} options; kiln takes at most {MAX_CRITERIA}", names.len()));
        }
        let specs: Vec<&str> = thresholds.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        let specs = match specs.len() {
            1 => vec![specs[0]; names.len()],
            n if n == names.len() => specs,
            n => return Err(format!("rollout_rs_threshold gives {n} thresholds for {} options (one for all, or one each)", names.len())),
        };
        let mut criteria = [None; MAX_CRITERIA];
        for (slot, (name, spec)) in criteria.iter_mut().zip(names.iter().zip(specs)) {
            *slot = Some(criterion(name, spec)?);
        }
        Ok(Self { criteria })
    }

    /// The criteria in order.
    pub fn criteria(&self) -> impl Iterator<Item = &Criterion> {
        self.criteria.iter().flatten()
    }

    /// `mask` `[responses, tokens]` with the rejected tokens set to 0 (no gradient).
    pub fn apply<B: Backend>(&self, old_log_prob: Tensor<B, 2>, rollout_log_prob: Tensor<B, 2>, mask: &Tensor<B, 2>) -> Tensor<B, 2> {
        let r = (old_log_prob - rollout_log_prob).clamp(-20.0, 20.0).detach();
        let [rows, cols] = r.dims();
        let mut keep = mask.clone().detach();
        for c in self.criteria() {
            let token = match c.divergence {
                KlEstimator::K1 => r.clone().neg(),
                KlEstimator::K2 => r.clone().square() * 0.5,
                KlEstimator::K3 => r.clone().exp() - r.clone() - 1.0,
            };
            let stat = match c.level {
                Level::Token => token,
                Level::SeqSum => (token * mask.clone()).sum_dim(1).expand([rows, cols]),
                Level::SeqMean => ((token * mask.clone()).sum_dim(1) / (mask.clone().sum_dim(1) + 1e-8)).expand([rows, cols]),
                Level::SeqMax => {
                    let max = token.mask_fill(mask.clone().equal_elem(0.0), f32::NEG_INFINITY).max_dim(1);
                    max.clone().mask_fill(max.equal_elem(f32::NEG_INFINITY), 0.0).expand([rows, cols])
                }
            };
            let kept = match (c.divergence, c.lower) {
                (KlEstimator::K1, Some(lower)) => stat.clone().greater_equal_elem(lower.ln()).float() * stat.lower_equal_elem(c.upper.ln()).float(),
                _ => stat.lower_equal_elem(c.upper).float(),
            };
            keep = keep * kept;
        }
        keep
    }
}

fn criterion(name: &str, spec: &str) -> Result<Criterion, String> {
    let (level, divergence) = match name {
        "token_k1" => (Level::Token, KlEstimator::K1),
        "token_k2" => (Level::Token, KlEstimator::K2),
        "token_k3" => (Level::Token, KlEstimator::K3),
        "seq_sum_k1" => (Level::SeqSum, KlEstimator::K1),
        "seq_sum_k2" => (Level::SeqSum, KlEstimator::K2),
        "seq_sum_k3" => (Level::SeqSum, KlEstimator::K3),
        "seq_mean_k1" => (Level::SeqMean, KlEstimator::K1),
        "seq_mean_k2" => (Level::SeqMean, KlEstimator::K2),
        "seq_mean_k3" => (Level::SeqMean, KlEstimator::K3),
        "seq_max_k2" => (Level::SeqMax, KlEstimator::K2),
        "seq_max_k3" => (Level::SeqMax, KlEstimator::K3),
        other => {
            return Err(format!(
                "unknown rollout_rs option {other:?} (token_k1/2/3, seq_sum_k1/2/3, seq_mean_k1/2/3, seq_max_k2/3)"
            ));
        }
    };
    let number = |s: &str| s.trim().parse::<f64>().ok().filter(|v| v.is_finite() && *v > 0.0);
    let bad = || format!("rollout_rs_threshold {spec:?} for {name}: thresholds are positive numbers");
    let (lower, upper) = match (divergence, spec.split_once('_')) {
        (KlEstimator::K1, Some((lo, hi))) => (Some(number(lo).ok_or_else(bad)?), number(hi).ok_or_else(bad)?),
        (KlEstimator::K1, None) => {
            let upper = number(spec).ok_or_else(bad)?;
            (Some(1.0 / upper), upper)
        }
        (_, Some(_)) => return Err(format!("rollout_rs_threshold {spec:?} for {name}: one upper bound, without '_'")),
        (_, None) => (None, number(spec).ok_or_else(bad)?),
    };
    if lower.is_some_and(|l| l > upper) {
        return Err(format!("rollout_rs_threshold {spec:?} for {name}: lower bound above the upper"));
    }
    Ok(Criterion { level, divergence, lower, upper })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_thresholds_parse_as_verls() {
        let r = Rejection::parse("token_k1, seq_mean_k3,token_k1", "0.5_2.0,0.15").unwrap();
        let c: Vec<_> = r.criteria().copied().collect();
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].lower, c[0].upper, c[1].level, c[1].lower, c[1].upper), (Some(0.5), 2.0, Level::SeqMean, None, 0.15));
        let one = Rejection::parse("token_k1", "2").unwrap();
        assert_eq!(one.criteria().next().unwrap().lower, Some(0.5));
        for (options, thresholds, says) in [
            ("token_k4", "1", "unknown rollout_rs option"),
            ("token_k2", "0.1_0.2", "without '_'"),
            ("token_k1,token_k2", "1,2,3", "3 thresholds for 2 options"),
            ("token_k2", "-1", "positive"),
            ("seq_max_k1", "2", "unknown"),
            ("token_k1", "3_2", "lower bound above"),
            ("", "1", "no option"),
        ] {
            let err = Rejection::parse(options, thresholds).unwrap_err();
            assert!(err.contains(says), "{options} {thresholds}: {err}");
        }
    }
}
