//! A task's side of checkpoint evaluation (`kiln eval`). [`crate::eval`] samples every item of
//! every part with each model, shard by shard, resumably; the task says which items there are,
//! what line each sample becomes, and which files are written from those lines (for Interplay,
//! the reference's metrics, strict-graph results and summary files).

use std::path::{Path, PathBuf};

use super::Item;
use crate::error::Result;
use crate::io::pyjson::Json;

/// Items sampled and written together: `<model>_<name>_generations.jsonl`.
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    /// `id`, `ood`, …, as in file names.
    pub name: &'a str,
    /// The items, each known by its position (Interplay's `__idx`).
    pub items: &'a [Item],
}

/// One sampled completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The text after the prompt (stop strings excluded).
    pub text: String,
    /// Generated token ids, a stop string's included (as vLLM counts them).
    pub tokens: usize,
}

/// What [`Evaluation::finish`] writes a model's files from.
#[derive(Debug, Clone, Copy)]
pub struct FinishedRun<'a> {
    /// The generations files, one per part, in order.
    pub generations: &'a [PathBuf],
    /// Completions per item.
    pub samples: usize,
    /// The teacher-forced loss of every item of every part, when computed.
    pub losses: Option<&'a [Vec<f64>]>,
    /// Keep the generations files; otherwise they are removed once read, before the finished
    /// marker is written.
    pub keep_generations: bool,
}

/// What a task evaluates and writes; see the module docs.
pub trait Evaluation {
    /// The parts, in order.
    fn parts(&self) -> Vec<Part<'_>>;

    /// Text identifying the data the records depend on (e.g. a hash of it): shards made from
    /// other data are never reused.
    fn fingerprint(&self) -> String;

    /// The generations-file lines of one shard: `samples[i]` are the completions of item
    /// `start + i` of part `part`. A task whose judging is expensive does it here, so that it is
    /// kept with the shard when a run is interrupted.
    fn records(&self, part: usize, start: usize, samples: &[Vec<Completion>]) -> Result<Vec<String>>;

    /// The text whose teacher-forced loss is recorded for item `index` of part `part`, if the
    /// task records losses.
    fn loss_text(&self, part: usize, index: usize) -> Option<&str>;

    /// The file that marks a finished model: [`Evaluation::finish`] writes it last, a finished
    /// model is skipped, and re-evaluating one removes it first.
    fn finished_marker(&self, out: &Path, model: &str) -> PathBuf;

    /// Called for every model before anything is evaluated: refuses an `out` where `model`'s files
    /// would replace something the task did not write (Interplay: a checkpoint directory named
    /// like the model).
    fn check_out(&self, _out: &Path, _model: &str) -> Result<()> {
        Ok(())
    }

    /// Called for every model whose finished marker exists, before anything is evaluated (the
    /// model would be skipped): refuses when its files were made with other settings or data
    /// than this run's, rather than reporting them as this run's results.
    fn check_finished(&self, _out: &Path, _model: &str) -> Result<()> {
        Ok(())
    }

    /// Whether completions drop special tokens from their text (vLLM's `skip_special_tokens`):
    /// code, as LiveCodeBench samples; Interplay keeps them, as its reference does.
    fn skip_special_tokens(&self) -> bool {
        false
    }

    /// Called once per run before the first model is finished (Interplay: the gold graphs).
    fn prepare(&self, _out: &Path) -> Result<()> {
        Ok(())
    }

    /// Writes `model`'s files under `out` from its generations files and losses, the finished
    /// marker last. `stage` announces the steps (`"scoring"`, `"metrics"`, …).
    fn finish(&self, model: &str, out: &Path, run: &FinishedRun<'_>, stage: &mut dyn FnMut(&'static str)) -> Result<()>;

    /// The summary record of a finished model, from its files.
    fn summary(&self, out: &Path, model: &str) -> Result<Json>;

    /// Writes the run-level files (Interplay: `summary.{json,csv}`) for `models`, in order.
    fn write_summaries(&self, out: &Path, models: &[String]) -> Result<()>;
}
