//! Names this module had before evaluation went through the [`Evaluation`] interface, kept so
//! that existing code keeps compiling: the Interplay rows ([`EvalData`], [`EvalRow`],
//! [`Subset`]), its metrics path and the writer of its files. They live in
//! [`crate::tasks::interplay::eval`]; this is the one place in `eval/` that names a concrete
//! task, and nothing in `eval/` uses it.
//!
//! [`Evaluation`]: crate::tasks::Evaluation

use std::path::Path;

use super::runner::{EvalEvent, EvalSettings};
use crate::error::Result;
use crate::tasks::interplay::answer_metrics::Losses;
use crate::tasks::interplay::eval::ModelFiles;
pub use crate::tasks::interplay::eval::{EvalData, EvalRow, Subset, metrics_path};

/// Interplay: the files of a model whose `<out>/<name>_{id,ood}_generations.jsonl` exist —
/// strict scoring against the gold graphs in `gold_dir` into `<out>/<name>/` (per-sample
/// results, score reports, `results.json`), then `<out>/<name>_metrics.json`, written last. The
/// generations files are removed afterwards unless `settings.keep_generations`.
pub fn write_model_files(
    name: &str,
    out: &Path,
    gold_dir: &Path,
    settings: &EvalSettings,
    losses: Option<&Losses>,
    on_event: &mut impl FnMut(EvalEvent),
) -> Result<()> {
    let files = ModelFiles { name, out, gold_dir, samples: settings.samples, id_op_threshold: settings.id_op_threshold };
    files.write(losses, settings.keep_generations, &mut |stage| on_event(EvalEvent::Stage { name, stage }))
}
