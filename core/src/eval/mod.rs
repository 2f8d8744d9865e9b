//! Evaluation of checkpoints on the Interplay task (spec `interplay.md` §8,
//! `release-layout.md`): the release walker, sharded and resumable sampling with the batched
//! engine, and the reference's artifact files (`<model>_metrics.json`, generations, strict graph
//! results, `results.json`, `summary.{json,csv}`), plus the paper's ID weighting beside them.
//!
//! - [`data`]: the evaluation rows, ID and OOD, with `__idx`.
//! - [`release`]: which checkpoints, and their names.
//! - [`records`]: one line of a generations file.
//! - [`shards`]: finished work kept on disk.
//! - [`loss`]: the teacher-forced loss per row.
//! - [`weighting`]: uniform and paper-weighted ID aggregates.
//! - [`summary`]: the run-level summary files.
//! - [`runner`]: the evaluation itself.

pub mod data;
pub mod loss;
pub mod records;
pub mod release;
pub mod runner;
pub mod shards;
pub mod summary;
pub mod weighting;

pub use data::{EvalData, EvalRow, Subset};
pub use release::{ModelEntry, named_models, release_models};
pub use runner::{EvalEvent, EvalSettings, ModelOutcome, evaluate};
