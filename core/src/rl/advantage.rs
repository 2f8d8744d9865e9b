//! Where GRPO and on-policy distillation differ: how advantages are produced. In the style of
//! verl's `core_algos.py`: flat named functions, chosen by name through a registry
//! ([`ADV_ESTIMATORS`], verl's `register_adv_est` / `get_adv_estimator_fn`).
//!
//! Outcome estimators (one verifiable reward per response, `[responses]` in, one advantage per
//! response out, broadcast to every response token; verl places the reward on the last token
//! and returns `[responses, tokens]`, which is the same number on every unmasked token):
//! - `grpo` (verl's `compute_grpo_outcome_advantage`): the reward minus the mean of its prompt's
//!   group, divided by the group's unbiased standard deviation plus ε = 1e-6; a group of one has
//!   mean 0 and standard deviation 1. `[loss] reward_scaling` picks the divisor (group, batch,
//!   none).
//! - `dr_grpo` (the same function with `norm_adv_by_std_in_grpo = false`, Dr. GRPO): the reward
//!   minus the group mean, no division.
//! - `rloo` (`compute_rloo_outcome_advantage`): for a group of `n > 1`,
//!   `(r·n − Σ_group r) / (n − 1)`, the reward minus the mean of the others; a group of one keeps
//!   its reward.
//! - `reinforce_plus_plus` (`compute_reinforce_plus_plus_outcome_advantage`, γ = 1): the return
//!   of every token is the response's reward; returns are whitened over all response tokens of
//!   the batch (token-weighted mean, unbiased variance, `(x − μ) / sqrt(σ² + 1e-8)`), so longer
//!   responses weigh more in μ and σ. The batch is the step's responses on this replica.
//! - `opo` (`compute_opo_outcome_advantage`, OPO): the reward minus the group's mean reward
//!   weighted by response length.
//!
//! Adding an estimator is one `fn(&Outcomes, &AdvParams) -> Vec<f64>` and one line of
//! [`ADV_ESTIMATORS`].
//!
//! OPD (Thinking Machines' on-policy distillation) keeps its own teacher signal: one value per
//! token, `−c · (log π_student − log π_teacher)` on the sampled token, with no discount and no
//! group normalisation ([`distillation_advantages`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

/// How GRPO scales the centred rewards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RewardScaling {
    /// Divide by the group's standard deviation (GRPO; verl `norm_adv_by_std_in_grpo: true`).
    #[default]
    Group,
    /// Divide by the standard deviation of the whole batch (TRL `scale_rewards="batch"`).
    Batch,
    /// Do not divide (Dr. GRPO; verl `norm_adv_by_std_in_grpo: false`).
    None,
}

/// Mean and unbiased standard deviation of `values` (`torch.std`); `None` for fewer than two.
fn mean_std(values: &[f64]) -> Option<(f64, f64)> {
    if values.len() < 2 {
        return None;
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (values.len() - 1) as f64;
    Some((mean, var.sqrt()))
}

/// GRPO advantages of responses with `scores`, where `groups[i]` names response `i`'s prompt.
pub fn grpo_advantages(scores: &[f64], groups: &[usize], scaling: RewardScaling, epsilon: f64) -> Vec<f64> {
    assert_eq!(scores.len(), groups.len(), "one group per score");
    let mut members: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for (&score, &group) in scores.iter().zip(groups) {
        members.entry(group).or_default().push(score);
    }
    let stats: BTreeMap<usize, (f64, f64)> = members.iter().map(|(&g, v)| (g, mean_std(v).unwrap_or((0.0, 1.0)))).collect();
    let batch_std = mean_std(scores).map_or(1.0, |(_, std)| std);
    scores
        .iter()
        .zip(groups)
        .map(|(&score, group)| {
            let (mean, std) = stats[group];
            match scaling {
                RewardScaling::Group => (score - mean) / (std + epsilon),
                RewardScaling::Batch => (score - mean) / (batch_std + epsilon),
                RewardScaling::None => score - mean,
            }
        })
        .collect()
}

/// One outcome per response: the input of every estimator. Response `i` has reward
/// `scores[i]`, belongs to prompt group `groups[i]` and has `lengths[i]` response tokens.
#[derive(Debug, Clone, Copy)]
pub struct Outcomes<'a> {
    scores: &'a [f64],
    groups: &'a [usize],
    lengths: &'a [usize],
}

impl<'a> Outcomes<'a> {
    /// The outcomes of a batch; the three slices must have one entry per response.
    pub fn new(scores: &'a [f64], groups: &'a [usize], lengths: &'a [usize]) -> Result<Self> {
        if scores.len() != groups.len() || scores.len() != lengths.len() {
            return Err(Error::InvalidInput(format!(
                "advantages need one group and one length per score (scores {}, groups {}, lengths {})",
                scores.len(),
                groups.len(),
                lengths.len()
            )));
        }
        Ok(Self { scores, groups, lengths })
    }

    /// Each response's group members' scores.
    fn members(&self) -> BTreeMap<usize, Vec<f64>> {
        let mut members: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
        for (&score, &group) in self.scores.iter().zip(self.groups) {
            members.entry(group).or_default().push(score);
        }
        members
    }
}

/// The estimators' settings (verl's `algorithm.*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdvParams {
    /// ε of GRPO's division by the standard deviation (verl: 1e-6).
    pub epsilon: f64,
    /// GRPO's divisor (`[loss] reward_scaling`).
    pub scaling: RewardScaling,
}

impl Default for AdvParams {
    fn default() -> Self {
        Self { epsilon: 1e-6, scaling: RewardScaling::Group }
    }
}

/// An outcome advantage estimator: one advantage per response.
pub type AdvantageFn = fn(&Outcomes, &AdvParams) -> Vec<f64>;

/// The advantage estimators by name (verl's `ADV_ESTIMATOR_REGISTRY`; TOML `[loss]
/// adv_estimator`).
pub static ADV_ESTIMATORS: &[(&str, AdvantageFn)] = &[
    ("grpo", compute_grpo_outcome_advantage),
    ("dr_grpo", compute_dr_grpo_outcome_advantage),
    ("rloo", compute_rloo_outcome_advantage),
    ("reinforce_plus_plus", compute_reinforce_plus_plus_outcome_advantage),
    ("opo", compute_opo_outcome_advantage),
];

/// `grpo`: see the module docs; `params.scaling` picks the divisor.
pub fn compute_grpo_outcome_advantage(outcomes: &Outcomes, params: &AdvParams) -> Vec<f64> {
    grpo_advantages(outcomes.scores, outcomes.groups, params.scaling, params.epsilon)
}

/// `dr_grpo`: GRPO without the division by the standard deviation.
pub fn compute_dr_grpo_outcome_advantage(outcomes: &Outcomes, params: &AdvParams) -> Vec<f64> {
    grpo_advantages(outcomes.scores, outcomes.groups, RewardScaling::None, params.epsilon)
}

/// `rloo`: each reward minus the mean of its group's other rewards, `(r·n − Σ r) / (n − 1)`.
pub fn compute_rloo_outcome_advantage(outcomes: &Outcomes, _params: &AdvParams) -> Vec<f64> {
    let members = outcomes.members();
    let stats: BTreeMap<usize, (f64, f64)> = members.iter().map(|(&g, v)| (g, (v.iter().sum::<f64>() / v.len() as f64, v.len() as f64))).collect();
    outcomes
        .scores
        .iter()
        .zip(outcomes.groups)
        .map(|(&score, group)| match stats[group] {
            (mean, n) if n > 1.0 => score * n / (n - 1.0) - mean * n / (n - 1.0),
            _ => score,
        })
        .collect()
}

/// `reinforce_plus_plus`: the outcome return (γ = 1) whitened over all response tokens.
pub fn compute_reinforce_plus_plus_outcome_advantage(outcomes: &Outcomes, _params: &AdvParams) -> Vec<f64> {
    // verl_F.masked_whiten: masked_mean divides by Σ mask + 1e-8; the variance is the masked mean
    // of squared deviations times the Bessel factor N / (N − 1) over N tokens.
    let tokens: f64 = outcomes.lengths.iter().map(|&n| n as f64).sum();
    let weighted = |f: &dyn Fn(f64) -> f64| outcomes.scores.iter().zip(outcomes.lengths).map(|(&s, &n)| n as f64 * f(s)).sum::<f64>();
    let mean = weighted(&|s| s) / (tokens + 1e-8);
    let bessel = if tokens > 1.0 { tokens / (tokens - 1.0) } else { 1.0 };
    let var = weighted(&|s| (s - mean).powi(2)) / (tokens + 1e-8) * bessel;
    let scale = 1.0 / (var + 1e-8).sqrt();
    outcomes.scores.iter().map(|&s| (s - mean) * scale).collect()
}

/// `opo` (`compute_opo_outcome_advantage`, OPO: on-policy RL with the optimal reward baseline):
/// each reward minus its group's length-weighted mean reward `Σ |o|·r / Σ |o|`; a group of one
/// keeps its reward.
pub fn compute_opo_outcome_advantage(outcomes: &Outcomes, _params: &AdvParams) -> Vec<f64> {
    let mut groups: BTreeMap<usize, (f64, f64, usize)> = BTreeMap::new(); // (Σ |o|·r, Σ |o|, n)
    for ((&score, &group), &length) in outcomes.scores.iter().zip(outcomes.groups).zip(outcomes.lengths) {
        let g = groups.entry(group).or_default();
        (g.0, g.1, g.2) = (g.0 + length as f64 * score, g.1 + length as f64, g.2 + 1);
    }
    outcomes
        .scores
        .iter()
        .zip(outcomes.groups)
        .map(|(&score, group)| match groups[group] {
            (weighted, lengths, n) if n > 1 => score - weighted / lengths,
            _ => score,
        })
        .collect()
}

/// A registered advantage estimator, by name (TOML `[loss] adv_estimator`, default `grpo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdvEstimator(&'static str);

impl AdvEstimator {
    /// The estimator registered as `name`; else an error listing the valid names.
    pub fn from_name(name: &str) -> std::result::Result<Self, String> {
        registered("adv_estimator", name, ADV_ESTIMATORS).map(|(name, _)| Self(name))
    }

    pub fn name(self) -> &'static str {
        self.0
    }

    /// One advantage per response.
    pub fn compute(self, outcomes: &Outcomes, params: &AdvParams) -> Vec<f64> {
        let (_, function) = registered("adv_estimator", self.0, ADV_ESTIMATORS).expect("constructed from a registered name");
        function(outcomes, params)
    }
}

impl Default for AdvEstimator {
    fn default() -> Self {
        Self("grpo")
    }
}

impl Serialize for AdvEstimator {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for AdvEstimator {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Self::from_name(&name).map_err(serde::de::Error::custom)
    }
}

/// The entry of `table` named `name`, or a message naming the TOML `key` and the valid names.
pub(crate) fn registered<T: Copy>(key: &str, name: &str, table: &'static [(&'static str, T)]) -> std::result::Result<(&'static str, T), String> {
    table.iter().copied().find(|(n, _)| *n == name).ok_or_else(|| {
        let names: Vec<_> = table.iter().map(|(n, _)| *n).collect();
        format!("unknown {key} \"{name}\"; valid names: {}", names.join(", "))
    })
}

/// Fraction of groups whose scores are all equal (they carry no GRPO signal).
pub fn zero_std_fraction(scores: &[f64], groups: &[usize]) -> f64 {
    let mut ranges: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
    for (&score, &group) in scores.iter().zip(groups) {
        let range = ranges.entry(group).or_insert((score, score));
        *range = (range.0.min(score), range.1.max(score));
    }
    let flat = ranges.values().filter(|(lo, hi)| lo == hi).count();
    flat as f64 / ranges.len().max(1) as f64
}

/// OPD per-token advantages `−coef · (student − teacher)` of one response's sampled tokens.
pub fn distillation_advantages(student: &[f32], teacher: &[f32], coef: f64) -> Vec<f64> {
    student.iter().zip(teacher).map(|(&s, &t)| -coef * (f64::from(s) - f64::from(t))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_cases() {
        // A group of one: mean 0, std 1 (not a zero advantage).
        assert_eq!(grpo_advantages(&[0.7], &[3], RewardScaling::Group, 1e-6), vec![0.7 / (1.0 + 1e-6)]);
        assert_eq!(grpo_advantages(&[0.7], &[3], RewardScaling::None, 1e-6), vec![0.7]);
        // Equal rewards: zero advantages, and the group counts as flat.
        let a = grpo_advantages(&[1.0, 1.0, 0.0, 1.0], &[0, 0, 1, 1], RewardScaling::Group, 1e-6);
        assert_eq!(&a[..2], &[0.0, 0.0]);
        assert!((a[2] + 0.70710578).abs() < 1e-7 && (a[3] - 0.70710578).abs() < 1e-7, "{a:?}");
        assert_eq!(zero_std_fraction(&[1.0, 1.0, 0.0, 1.0], &[0, 0, 1, 1]), 0.5);
        assert_eq!(distillation_advantages(&[-1.0, -0.5], &[-2.0, -0.25], 1.0), vec![-1.0, 0.25]);
        // RLOO: a group of one keeps its reward; a pair gets the difference to the other.
        let outcomes = Outcomes::new(&[0.7, 1.0, 0.0], &[3, 1, 1], &[2, 2, 2]).unwrap();
        let rloo = AdvEstimator::from_name("rloo").unwrap().compute(&outcomes, &AdvParams::default());
        assert_eq!(rloo, vec![0.7, 1.0, -1.0]);
        assert!(AdvEstimator::from_name("gae").unwrap_err().contains("valid names: grpo, dr_grpo, rloo, reinforce_plus_plus"));
    }
}
