//! Training: the optimizer, learning-rate schedules, objectives, checkpoints, metrics and the
//! loop that ties them together; the one run-config schema ([`config`]) and the pre-training
//! and SFT runs ([`run`](mod@run), beside [`crate::rl::run`](mod@crate::rl::run)), both on one
//! run skeleton ([`launch`]). Nothing here names a concrete task: the run's `[task]` is built
//! through [`crate::tasks::TaskConfig`].

pub mod adamw;
pub mod checkpoint;
pub mod config;
#[cfg(feature = "tasks")]
pub mod heldout;
pub mod launch;
pub mod metrics;
pub mod objective;
pub mod precision;
#[cfg(feature = "tasks")]
pub mod run;
pub mod schedule;
pub mod trainer;

/// The old name of [`run`](mod@run) (the pre-training and SFT runs), kept for existing code.
#[cfg(feature = "tasks")]
pub mod recipes {
    pub use super::config::{DataSection, ModelSection, NextTokenEval, NextTokenTrain, OutputSection};
    pub use super::run::{RunConfig, run, tokenizer_dir};
}

pub use adamw::{AdamW, AdamWConfig};

pub use objective::{NextTokenLoss, Objective};
pub use precision::Precision;
#[cfg(feature = "tasks")]
pub use run::{RunConfig, run};
pub use schedule::{Decay, Schedule};
pub use trainer::{LoopConfig, SavePolicy, Start, train};
