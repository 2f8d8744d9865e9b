//! The Interplay reasoning task (`docs/interplay.md`): GSM-Infinite "realistic" problems whose
//! difficulty is the number of operations `op`, ported from the reference repository
//! Interplay-LM-Reasoning at `c6676bc`.
//!
//! - [`generator`] and [`dataset`]: the forward and equation-mode generators, seeded and
//!   deterministic, and the split writer with SHA-256 deduplication (§2).
//! - [`text`]: `compose_text`, prompt and completion (§2.5).
//! - [`answer`], [`answer_metrics`]: answer extraction, exact match and the metrics file of
//!   `eval_checkpoints.py` with its unbiased pass@k ([`crate::metrics::passk`], §8.1).
//! - [`graph`], [`gold`], [`scoring`], [`graph_passk`]: the solution parser, gold graphs, strict
//!   scoring and the ordered pass@k of `results.json` (§8.2–8.5).
//! - [`rewards`]: the RL rewards (§6.4).
//! - [`task`]: all of it behind the [`Task`](crate::tasks::Task) interface, and [`eval`]: the
//!   reference's evaluation files behind [`Evaluation`](crate::tasks::Evaluation).
//! - [`tiny_model`]: the tiny Qwen2 with the paper's tokenizer that minute-scale pipelines train.
//!
//! Output files are written byte-for-byte like the reference's ([`crate::io::pyjson`]).

pub mod answer;
pub mod answer_metrics;
pub mod dataset;
pub mod eval;
pub mod generator;
#[cfg(test)]
mod generator_tests;
pub mod gold;
#[cfg(test)]
mod golden_tests;
pub mod graph;
pub mod graph_passk;
pub mod pystr;
pub mod rewards;
pub mod row;
pub mod score_report;
pub mod scoring;
pub mod task;
pub mod text;
pub mod tiny_model;

pub use row::Row;
pub use task::InterplayTask;

/// The JSONL and atomic-file helpers, now in [`crate::io`] (this path is kept for existing code).
pub mod files {
    pub use crate::io::python::{py_int, py_path, py_str};
    pub use crate::io::{AtomicFile, Record, jsonl_records, read_jsonl, write_atomic};
}
pub use crate::io::pyjson;
pub use crate::metrics::passk;
