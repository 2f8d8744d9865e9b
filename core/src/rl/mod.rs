//! Reinforcement learning and on-policy distillation on the training loop: GRPO with
//! verifiable rewards and OPD with a teacher share one policy-gradient path and differ only in
//! how advantages are produced ([`advantage`]).
//!
//! - [`prompts`], [`rollout`]: prompts from a task's items, `n` responses each from the
//!   generation engine (the only sampler, so rollout and learner share kernels).
//! - [`reward`]: verifiable rewards, built by the run's task from `[reward]`
//!   ([`Task`](crate::tasks::Task); nothing here names a concrete task).
//! - [`advantage`], [`loss`]: verl's GRPO advantages, clipped surrogate, loss aggregation and
//!   KL estimators (`docs/interplay.md` §6.2), the OPD advantage and full-vocabulary KL.
//! - [`batch`], [`objective`]: the learner's layout and the [`Objective`](crate::train::Objective)
//!   that rolls out, scores and splits a step into optimizer updates.
//! - [`validate`], [`config`], [`run`](mod@run): greedy per-group and ID/OOD validation, the TOML config
//!   and the run.

pub mod advantage;
pub mod batch;
#[cfg(feature = "tasks")]
pub mod config;
#[cfg(test)]
mod gradcheck_tests;
pub mod loss;
#[cfg(feature = "tasks")]
pub mod objective;
#[cfg(feature = "tasks")]
pub mod prompts;
pub mod rejection;
#[cfg(feature = "tasks")]
pub mod reward;
#[cfg(feature = "tasks")]
pub mod rollout;
#[cfg(feature = "tasks")]
pub mod run;
#[cfg(feature = "tasks")]
pub mod validate;

#[cfg(feature = "tasks")]
pub use config::PgConfig;
#[cfg(feature = "tasks")]
pub use objective::{PgSettings, PolicyGradient, Signal};
#[cfg(feature = "tasks")]
pub use run::{Method, run};
