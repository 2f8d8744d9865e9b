//! Reinforcement learning and on-policy distillation on the training loop: GRPO with
//! verifiable rewards and OPD with a teacher share one policy-gradient path and differ only in
//! how advantages are produced ([`advantage`]).
//!
//! - [`prompts`], [`rollout`]: prompts from a task's items, `n` responses each from the
//!   generation engine (the only sampler, so rollout and learner share kernels).
//! - [`reward`]: verifiable rewards, built by the run's task from `[reward]`
//!   ([`Task`](crate::tasks::Task); nothing here names a concrete task).
//! - [`advantage`], [`loss`]: verl's GRPO advantages, clipped surrogate, loss aggregation and
//!   KL estimators (spec `interplay.md` §6.2), the OPD advantage and full-vocabulary KL.
//! - [`batch`], [`objective`]: the learner's layout and the [`Objective`](crate::train::Objective)
//!   that rolls out, scores and splits a step into optimizer updates.
//! - [`validate`], [`config`], [`run`](mod@run): greedy per-group and ID/OOD validation, the TOML config
//!   and the run.

pub mod advantage;
pub mod batch;
pub mod config;
#[cfg(test)]
mod gradcheck_tests;
pub mod loss;
pub mod objective;
pub mod prompts;
pub mod reward;
pub mod rollout;
pub mod run;
pub mod validate;

pub use config::PgConfig;
pub use objective::{PgSettings, PolicyGradient, Signal};
pub use run::{Method, run};
