//! The Interplay evaluation files (`docs/interplay.md` §8, `docs/release-layout.md`), written from
//! the samples [`crate::eval`] draws: the reference's `<model>_metrics.json` (answer accuracy
//! and unbiased pass@k, per op and per template), strict reasoning-graph results with
//! `results.json`, `summary.{json,csv}`, and the paper's ID weighting beside them.
//!
//! - [`data`]: the evaluation rows, ID and OOD, with `__idx` ([`EvalData`], which is this
//!   task's [`Evaluation`]).
//! - [`records`]: one line of a generations file.
//! - [`weighting`]: uniform and paper-weighted ID aggregates.
//! - [`summary`]: the run-level summary files.

pub mod data;
pub mod records;
pub mod summary;
pub mod weighting;

use std::path::{Path, PathBuf};

pub use data::{EvalData, EvalRow, Subset};
use records::generation_line;
use summary::{summary_record, write_summary, write_weighting_summary};
use weighting::id_weighting;

use super::answer_metrics::{Losses, answer_metrics_with_loss, read_samples};
use super::gold::build_gold_dir;
use super::graph_passk::{DEFAULT_PASS_AT, aggregate};
use super::scoring::{ScoreOptions, score};
use crate::error::{Error, Result};
use crate::io::pyjson::{self, Json, Style};
use crate::io::{remove_dir, remove_file, write_atomic};
use crate::tasks::evaluation::{Completion, Evaluation, FinishedRun, Part};

/// `<out>/<model>_metrics.json`: written last, it marks a finished model.
pub fn metrics_path(out: &Path, model: &str) -> PathBuf {
    out.join(format!("{model}_metrics.json"))
}

/// `<model>_<subset>_generations.jsonl`.
fn generations_name(model: &str, subset: Subset) -> String {
    format!("{model}_{}_generations.jsonl", subset.name())
}

/// The gold graphs of the data, rebuilt by every run that scores.
fn gold_dir(out: &Path) -> PathBuf {
    out.join(".gold")
}

/// Refuses a `<out>/<model>` that holds anything but the strict scores this module writes there
/// (`*.graph_results.jsonl`, `*_score_report.jsonl`, `results.json`; hidden files aside: partial
/// writes), since scoring replaces that directory: `--out` the folder of the checkpoint being
/// evaluated made it the checkpoint itself.
fn check_results_dir(dir: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for entry in entries {
        let name = entry.map_err(|e| Error::io(dir, e))?.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with('.') || name == "results.json" || name.ends_with(".graph_results.jsonl") || name.ends_with("_score_report.jsonl");
        if !ours {
            return Err(Error::InvalidInput(format!(
                "{}: holds {name}, which kiln's scores did not write, and the model's scores would replace the directory; choose another --out (or name the model otherwise)",
                dir.display()
            )));
        }
    }
    Ok(())
}

impl Evaluation for EvalData {
    fn parts(&self) -> Vec<Part<'_>> {
        Subset::BOTH.iter().map(|s| Part { name: s.name(), items: &self.items[s.index()] }).collect()
    }

    fn fingerprint(&self) -> String {
        EvalData::fingerprint(self)
    }

    fn records(&self, part: usize, start: usize, samples: &[Vec<Completion>]) -> Result<Vec<String>> {
        let rows = &self.rows(Subset::BOTH[part])[start..start + samples.len()];
        Ok(rows
            .iter()
            .zip(samples)
            .flat_map(|(row, completions)| completions.iter().map(move |c| generation_line(row, &c.text, c.tokens)))
            .collect())
    }

    /// `compose_text(row)` without `[EOS]` (`eval_loss_per_op`).
    fn loss_text(&self, part: usize, index: usize) -> Option<&str> {
        Some(&self.rows(Subset::BOTH[part])[index].text)
    }

    fn finished_marker(&self, out: &Path, model: &str) -> PathBuf {
        metrics_path(out, model)
    }

    fn check_out(&self, out: &Path, model: &str) -> Result<()> {
        check_results_dir(&out.join(model))
    }

    fn prepare(&self, out: &Path) -> Result<()> {
        let dir = gold_dir(out);
        remove_dir(&dir)?;
        build_gold_dir(&self.dir, &dir)?;
        Ok(())
    }

    fn finish(&self, model: &str, out: &Path, run: &FinishedRun<'_>, stage: &mut dyn FnMut(&'static str)) -> Result<()> {
        let losses = run.losses.map(|losses| {
            let mut split = Losses::default();
            for subset in Subset::BOTH {
                let into = match subset {
                    Subset::Id => &mut split.id,
                    Subset::Ood => &mut split.ood,
                };
                for (row, loss) in self.rows(subset).iter().zip(&losses[subset.index()]) {
                    into.push(&row.op.to_string(), *loss);
                }
            }
            split
        });
        let files = ModelFiles { name: model, out, gold_dir: &gold_dir(out), samples: run.samples, id_op_threshold: self.id_op_threshold };
        files.write(losses.as_ref(), run.keep_generations, stage)
    }

    fn summary(&self, out: &Path, model: &str) -> Result<Json> {
        Ok(read_outcome(out, model)?.0)
    }

    fn write_summaries(&self, out: &Path, models: &[String]) -> Result<()> {
        let mut records = Vec::with_capacity(models.len());
        let mut weightings = Vec::with_capacity(models.len());
        for name in models {
            let (summary, weighting) = read_outcome(out, name)?;
            records.push(summary);
            weightings.push((name.clone(), weighting));
        }
        write_summary(out, &records)?;
        write_weighting_summary(out, &weightings)
    }
}

/// One model's files: strict scoring and answer metrics.
pub struct ModelFiles<'a> {
    pub name: &'a str,
    pub out: &'a Path,
    /// Directory of the data's gold graphs.
    pub gold_dir: &'a Path,
    /// Samples per prompt (the largest k of pass@k).
    pub samples: usize,
    /// Ops above this are OOD in the metrics; `None` puts every op in ID.
    pub id_op_threshold: Option<i64>,
}

impl ModelFiles<'_> {
    /// The files of a model whose `<out>/<name>_{id,ood}_generations.jsonl` exist: strict
    /// scoring against the gold graphs into `<out>/<name>/` (per-sample results, score reports,
    /// `results.json`), then `<out>/<name>_metrics.json`, written last. The generations files are
    /// removed before the metrics file is written unless `keep_generations`.
    pub fn write(&self, losses: Option<&Losses>, keep_generations: bool, stage: &mut dyn FnMut(&'static str)) -> Result<()> {
        let files: Vec<PathBuf> = Subset::BOTH.iter().map(|&s| self.out.join(generations_name(self.name, s))).collect();
        stage("scoring");
        let results_dir = self.out.join(self.name);
        check_results_dir(&results_dir)?;
        remove_dir(&results_dir)?;
        let options = ScoreOptions { overwrite: true, ..ScoreOptions::default() };
        for file in &files {
            score(self.gold_dir, file, &results_dir, &options)?;
        }
        aggregate(&results_dir, &DEFAULT_PASS_AT, true)?;

        stage("metrics");
        let mut samples = Vec::new();
        for file in &files {
            samples.extend(read_samples(file)?);
        }
        let threshold = self.id_op_threshold.unwrap_or(i64::MAX);
        let metrics = answer_metrics_with_loss(self.name, &samples, threshold, self.samples as u64, losses);
        if !keep_generations {
            for file in &files {
                remove_file(file)?;
            }
        }
        write_atomic(&metrics_path(self.out, self.name), &metrics.dumps(Style::INDENT2_UTF8))
    }
}

/// The summary and ID weighting records of a finished model, from its files.
fn read_outcome(out: &Path, name: &str) -> Result<(Json, Json)> {
    let metrics = read_json(&metrics_path(out, name))?;
    let results_path = out.join(name).join("results.json");
    let strict = if results_path.is_file() { Some(read_json(&results_path)?) } else { None };
    let id_file = format!("{}.graph_results.jsonl", generations_name(name, Subset::Id));
    let strict_id = strict.as_ref().and_then(|r| r.get("files")).and_then(|f| f.get(&id_file));
    Ok((summary_record(&metrics), id_weighting(&metrics, strict_id)))
}

fn read_json(path: &Path) -> Result<Json> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    pyjson::parse(&text).map_err(|m| Error::data(path, None, m))
}
