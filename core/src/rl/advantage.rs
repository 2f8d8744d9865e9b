//! Where GRPO and on-policy distillation differ: how advantages are produced.
//!
//! - GRPO (verl's `compute_grpo_outcome_advantage`): one scalar per response, its reward minus
//!   the mean of its prompt's group, divided by the group's unbiased standard deviation plus
//!   ε = 1e-6; a group of one has mean 0 and standard deviation 1. The scalar is broadcast to
//!   every response token.
//! - OPD (Thinking Machines' on-policy distillation): one value per token,
//!   `−c · (log π_student − log π_teacher)` on the sampled token, with no discount and no group
//!   normalisation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
    }
}
