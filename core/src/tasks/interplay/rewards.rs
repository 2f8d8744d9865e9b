//! RL rewards (`docs/interplay.md` §6.4): the pure outcome reward of
//! `verl/dataset.py::compute_score` and the process-verified reward of
//! `verl/reward_fn.py::compute_score_with_step_process`.
//!
//! Both compare answers as exact strings (not numerically), and the process reward, unlike the
//! evaluation scorer, penalises extra predicted nodes.

use super::answer::{extract_answer_with_marker, extract_tagged_answer};
use crate::metrics::exact::int_ratio_to_f64;
use super::graph::parse;
use super::pystr::strip;

/// `_normalise_answer`: strip, then drop trailing dots.
fn normalise(text: &str) -> &str {
    strip(text).trim_end_matches('.')
}

/// The RL ground-truth answer of a row (`verl/dataset.py::compose_prompt`): the answer
/// extracted from the gold solution (its `Answer:` line) without trailing dots.
pub fn rl_gold_answer(solution: &str) -> String {
    extract_answer_with_marker(strip(solution))
        .trim_end_matches('.')
        .to_owned()
}

/// `verl/dataset.py::compute_score`: 1.0 when the extracted answer (tags, else `Answer:`)
/// equals the gold answer as a string after stripping and dropping trailing dots.
pub fn outcome_reward(response: &str, gold_answer: &str) -> f64 {
    f64::from(u8::from(
        normalise(&extract_answer_with_marker(response)) == normalise(gold_answer),
    ))
}

/// The knobs of the process-verified reward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessRewardConfig {
    /// Weight of the outcome reward.
    pub answer_weight: f64,
    /// Weight of the process reward.
    pub step_weight: f64,
    /// Tolerance for value comparisons.
    pub value_tolerance: f64,
    /// Zero the reward when the answer is right but the process has any mismatch.
    pub zero_on_process_mismatch: bool,
}

impl ProcessRewardConfig {
    /// `op*_uniform_process.yaml`: 0.2 R_out + 0.8 R_pv.
    pub const PROCESS: Self = Self {
        answer_weight: 0.2,
        step_weight: 0.8,
        value_tolerance: 1e-6,
        zero_on_process_mismatch: false,
    };
    /// `op*_uniform_process0.5.yaml`: 0.5 R_out + 0.5 R_pv.
    pub const PROCESS_HALF: Self = Self {
        answer_weight: 0.5,
        step_weight: 0.5,
        value_tolerance: 1e-6,
        zero_on_process_mismatch: false,
    };
    /// `op*_uniform_process_strict.yaml`: R_out if R_pv = 1.
    pub const STRICT: Self = Self {
        answer_weight: 1.0,
        step_weight: 0.0,
        value_tolerance: 1e-6,
        zero_on_process_mismatch: true,
    };
}

/// The process-verified reward and its diagnostics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessReward {
    /// The reward.
    pub score: f64,
    /// 1.0 when the tagged answer matches the gold answer as a string.
    pub outcome_reward: f64,
    /// `max(0, 1 − penalty / |gold nodes|)`.
    pub process_reward: f64,
    /// Whether the gold solution gave a graph.
    pub has_gold: bool,
    /// Whether `zero_on_process_mismatch` zeroed a correct answer.
    pub zeroed_due_to_mismatch: bool,
}

/// `_compute_step_process_reward(response, {answer, solution}, …)`.
pub fn process_reward(
    response: &str,
    gold_answer: &str,
    gold_solution: Option<&str>,
    config: &ProcessRewardConfig,
) -> ProcessReward {
    let outcome = if gold_answer.is_empty() {
        0.0
    } else {
        f64::from(u8::from(
            normalise(&extract_tagged_answer(response)) == normalise(gold_answer),
        ))
    };
    let gold = gold_solution
        .filter(|s| !strip(s).is_empty())
        .map(|s| parse(s).graph());
    let (process, mismatch) = match &gold {
        Some(gold) => {
            let report = gold.compare(&parse(response).graph(), config.value_tolerance);
            let total = gold.nodes().len().max(1);
            let penalty = report.value_mismatches.len()
                + report.dependency_mismatches.len()
                + report.missing_in_pred.len()
                + report.extra_in_pred.len().min(total)
                + usize::from(report.answer_mismatch.is_some());
            let ratio = int_ratio_to_f64(penalty as i128, total as i128).expect("non-zero total");
            ((1.0 - ratio).max(0.0), penalty > 0)
        }
        None => (outcome, false),
    };
    let (mut wa, mut ws) = (config.answer_weight, config.step_weight);
    let mut total = wa + ws;
    if total <= 0.0 {
        (wa, ws, total) = (0.5, 0.5, 1.0);
    }
    let mut score = (wa / total * outcome + ws / total * process).clamp(0.0, 1.0);
    if outcome < 1.0 {
        score = 0.0;
    }
    let zeroed = config.zero_on_process_mismatch && gold.is_some() && outcome >= 1.0 && mismatch;
    if zeroed {
        score = 0.0;
    }
    ProcessReward {
        score,
        outcome_reward: outcome,
        process_reward: process,
        has_gold: gold.is_some(),
        zeroed_due_to_mismatch: zeroed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOLD: &str = "Define adult wolf in Maple Creek as q; so q = 4. Define total number of adult animals in Maple Creek as W; so W = q = 4. Answer: 4.";

    #[test]
    fn outcome_is_a_string_match() {
        assert_eq!(rl_gold_answer(GOLD), "4");
        assert_eq!(outcome_reward(" ... </solution> <answer> 4 ", "4"), 1.0);
        assert_eq!(outcome_reward(" ... </solution> <answer> 4.0 ", "4"), 0.0);
        assert_eq!(outcome_reward(" so W = 4. Answer: 4.", "4"), 1.0);
    }

    #[test]
    fn process_variants() {
        let right = " Define adult wolf in Maple Creek as q; so q = 4. Define total number of adult animals in Maple Creek as W; so W = q = 4. </solution> <answer> 4 ";
        let extra = " Define adult wolf in Maple Creek as q; so q = 4. Define total number of adult animals in Maple Creek as W; so W = q = 4. Define adult fox in Nowhere as Z; so Z = 3. </solution> <answer> 4 ";
        let r = process_reward(right, "4", Some(GOLD), &ProcessRewardConfig::STRICT);
        assert_eq!(
            (r.score, r.process_reward, r.zeroed_due_to_mismatch),
            (1.0, 1.0, false)
        );
        let r = process_reward(extra, "4", Some(GOLD), &ProcessRewardConfig::STRICT);
        assert_eq!(
            (r.score, r.process_reward, r.zeroed_due_to_mismatch),
            (0.0, 0.5, true)
        );
        let r = process_reward(extra, "4", Some(GOLD), &ProcessRewardConfig::PROCESS);
        assert!((r.score - (0.2 + 0.8 * 0.5)).abs() < 1e-12);
        let r = process_reward(extra, "5", Some(GOLD), &ProcessRewardConfig::PROCESS_HALF);
        assert_eq!(r.score, 0.0);
        let r = process_reward(right, "4", None, &ProcessRewardConfig::PROCESS);
        assert_eq!((r.score, r.has_gold), (1.0, false));
    }
}
