//! Evaluation of checkpoints on a task: the release walker, sharded and resumable sampling with
//! the batched engine, and teacher-forced losses. What is sampled and which files are written
//! from the samples is the task's ([`Evaluation`](crate::tasks::Evaluation)); for Interplay
//! (`docs/interplay.md` §8, `docs/release-layout.md`) those are the reference's artifact files
//! (`<model>_metrics.json`, generations, strict graph results, `results.json`,
//! `summary.{json,csv}`) plus the paper's ID weighting beside them
//! ([`crate::tasks::interplay::eval`]).
//!
//! - [`release`]: which checkpoints, and their names.
//! - [`shards`]: finished work kept on disk.
//! - [`loss`]: the teacher-forced loss per text.
//! - [`runner`]: the evaluation itself, on one device or several ([`evaluate_on`]).
//! - `generation`: the shards dealt out over the devices.

mod compat;
mod generation;
pub mod loss;
pub mod release;
pub mod runner;
pub mod shards;

pub use compat::{EvalData, EvalRow, Subset};
pub use release::{ModelEntry, named_models, release_models};
pub use runner::{EvalEvent, EvalSettings, ModelOutcome, evaluate, evaluate_on};
