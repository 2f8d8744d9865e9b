//! The Interplay release as one recipe (`kiln release run`, docs/release-layout.md): the two
//! checkpoint batches `020305` and `050302`, each pre-trained, trained with GRPO on three op
//! ranges and distilled on-policy from one of them, then evaluated, written in the release's
//! layout with a run index per batch and a summary table.
//!
//! - [`config`]: `release.toml` (batches and their run configs, data, evaluation, scales);
//! - [`ops`]: a smaller scale's ops standing for the release's;
//! - [`plan`]: the runs at one scale, pointed into the layout (pure: reads configs only);
//! - [`runner`]: the stages, each resumable;
//! - [`index`]: a batch's run index (`runs.json`, `README.md`);
//! - [`report`]: the summary across batches and the release's effects on this run.
//!
//! The committed release is `examples/configs/release/release.toml`; its `full` scale is the
//! release's own configuration, `mini` a CPU-sized version and `tiny` a seconds-scale one.

pub mod config;
pub mod index;
pub mod ops;
pub mod plan;
pub mod report;
pub mod runner;

pub use config::ReleaseConfig;
pub use plan::{FULL, Plan, PlannedRun, RunKind, RunSpec, Stage, plan};
pub use runner::{Event, run};
