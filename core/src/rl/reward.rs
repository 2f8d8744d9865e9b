//! Verifiable rewards: a [`Reward`] scores one sampled response against its task. The Interplay
//! rewards of the seed (spec §6.4) are built in; another task (e.g. code tests) implements the
//! trait.

use serde::{Deserialize, Serialize};

use crate::tasks::interplay::rewards::{ProcessRewardConfig, outcome_reward, process_reward};

/// What a reward knows about a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The row's op (difficulty), if it has one.
    pub op: Option<u32>,
    /// The RL ground truth: the gold solution's answer without trailing dots.
    pub gold_answer: String,
    /// The gold solution (for process-verified rewards).
    pub gold_solution: String,
}

/// A reward function of a response's text (decoded with special tokens, as verl's reward
/// manager in the seed does) and its task.
pub trait Reward: Send + Sync {
    /// The reward, usually in `[0, 1]`.
    fn score(&self, response: &str, task: &Task) -> f64;
}

/// The reward of a run config (`[reward]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum RewardConfig {
    /// Exact string match of the extracted answer (`verl/dataset.py::compute_score`).
    #[default]
    Outcome,
    /// The process-verified reward (`verl/reward_fn.py::compute_score_with_step_process`):
    /// `answer_weight`/`step_weight` 0.2/0.8, 0.5/0.5, or 1/0 with `zero_on_process_mismatch`.
    Process {
        answer_weight: f64,
        step_weight: f64,
        #[serde(default)]
        zero_on_process_mismatch: bool,
        #[serde(default = "default_tolerance")]
        value_tolerance: f64,
    },
}

fn default_tolerance() -> f64 {
    1e-6
}

impl RewardConfig {
    /// The reward function.
    pub fn build(&self) -> Box<dyn Reward> {
        match *self {
            Self::Outcome => Box::new(OutcomeReward),
            Self::Process { answer_weight, step_weight, zero_on_process_mismatch, value_tolerance } => {
                Box::new(ProcessVerifiedReward(ProcessRewardConfig { answer_weight, step_weight, value_tolerance, zero_on_process_mismatch }))
            }
        }
    }
}

/// 1 when the extracted answer equals the gold answer as a string, else 0.
#[derive(Debug, Clone, Copy)]
pub struct OutcomeReward;

impl Reward for OutcomeReward {
    fn score(&self, response: &str, task: &Task) -> f64 {
        outcome_reward(response, &task.gold_answer)
    }
}

/// Outcome and reasoning-graph agreement, gated on the answer.
#[derive(Debug, Clone, Copy)]
pub struct ProcessVerifiedReward(pub ProcessRewardConfig);

impl Reward for ProcessVerifiedReward {
    fn score(&self, response: &str, task: &Task) -> f64 {
        process_reward(response, &task.gold_answer, Some(&task.gold_solution), &self.0).score
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOLD: &str = "Define adult wolf in Maple Creek as q; so q = 4. Define total number of adult animals in Maple Creek as W; so W = q = 4. Answer: 4.";

    #[test]
    fn configs_build_the_seed_rewards() {
        let task = Task { op: Some(2), gold_answer: "4".into(), gold_solution: GOLD.into() };
        let right = " Define adult wolf in Maple Creek as q; so q = 4. Define total number of adult animals in Maple Creek as W; so W = q = 4. </solution> <answer> 4 </answer>[EOS]";
        let sloppy = " Define total number of adult animals in Maple Creek as W; so W = 4. </solution> <answer> 4 </answer>[EOS]";
        let outcome: RewardConfig = toml::from_str(r#"kind = "outcome""#).unwrap();
        let strict: RewardConfig = toml::from_str("kind = \"process\"\nanswer_weight = 1.0\nstep_weight = 0.0\nzero_on_process_mismatch = true").unwrap();
        assert_eq!(outcome.build().score(right, &task), 1.0);
        assert_eq!(outcome.build().score(sloppy, &task), 1.0);
        assert_eq!(strict.build().score(right, &task), 1.0);
        assert_eq!(strict.build().score(sloppy, &task), 0.0);
        assert_eq!(outcome.build().score(" </solution> <answer> 5 </answer>", &task), 0.0);
        assert!(toml::from_str::<RewardConfig>("kind = \"process\"\nanswer_weight = 1.0").is_err());
    }
}
