//! The evaluation of a list of checkpoints (`eval_checkpoints.py` plus strict scoring, spec
//! §8.1–8.5): for every model, sample `samples` completions of every prompt with the batched
//! engine, shard by shard, then write the reference's files and the run summaries.
//!
//! Files under `out` (the release's `evals/` layout):
//! - `<model>_metrics.json`: answer accuracy, unbiased pass@k, per op and per template; written
//!   last, so it marks a finished model, which later runs skip (unless `overwrite`);
//! - `<model>_{id,ood}_generations.jsonl` when `keep_generations`;
//! - `<model>/`: strict graph results per sample, the score reports, `results.json`;
//! - `summary.json`, `summary.csv`, `summary_id_weighting.{json,csv}`: one record per model of
//!   the run, rewritten after each model;
//! - `.shards/<model>/`: finished shards of an unfinished model; `.gold/`: the gold graphs of the
//!   data (rebuilt by every run that scores).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;

use super::data::{EvalData, EvalRow, Subset};
use super::loss::row_losses;
use super::records::generation_line;
use super::release::ModelEntry;
use super::shards::{ShardKind, ShardStore, remove_dir, shard_seed};
use super::summary::{summary_record, write_summary, write_weighting_summary};
use super::weighting::id_weighting;
use crate::error::{Error, Result};
use crate::generate::{Engine, Sampler, SamplingParams, StopCriteria};
use crate::model::hf;
use crate::tasks::interplay::answer_metrics::{Losses, answer_metrics_with_loss, read_samples};
use crate::tasks::interplay::files::{AtomicFile, jsonl_records, write_atomic};
use crate::tasks::interplay::gold::build_gold_dir;
use crate::tasks::interplay::graph_passk::{DEFAULT_PASS_AT, aggregate};
use crate::tasks::interplay::pyjson::{self, Json, Style};
use crate::tasks::interplay::scoring::{ScoreOptions, score};
use crate::tokenizer::Tokenizer;

/// How to evaluate. [`EvalSettings::default`] is the reference's setting (`--sample-k 128
/// --temperature 0.7 --top-p 1.0 --max-new-tokens 1024`, stop at `</answer>`, ID = op ≤ 10).
#[derive(Debug, Clone)]
pub struct EvalSettings {
    /// Samples per prompt (`--sample-k`); pass@k goes up to it.
    pub samples: usize,
    pub sampler: Sampler,
    pub max_new_tokens: usize,
    /// Stop strings, excluded from the text (vLLM semantics); the model's EOS ids stop too.
    pub stop: Vec<String>,
    /// Base seed; each shard derives its own.
    pub seed: u64,
    /// Ops above this are OOD; `None` puts everything in ID.
    pub id_op_threshold: Option<i64>,
    /// Prompts per shard: the unit of work kept on disk.
    pub shard_prompts: usize,
    /// Sequences decoded together.
    pub batch_size: usize,
    /// Also compute the teacher-forced loss per op (`avg_loss` fields).
    pub loss: bool,
    /// Rows per teacher-forced forward pass.
    pub loss_batch_size: usize,
    /// Keep `<model>_{id,ood}_generations.jsonl`.
    pub keep_generations: bool,
    /// Re-evaluate finished models and drop unfinished shards.
    pub overwrite: bool,
}

impl Default for EvalSettings {
    fn default() -> Self {
        Self {
            samples: 128,
            sampler: Sampler { temperature: 0.7, top_k: 0, top_p: 1.0 },
            max_new_tokens: 1024,
            stop: vec!["</answer>".to_owned()],
            seed: 0,
            id_op_threshold: Some(10),
            shard_prompts: 32,
            batch_size: 256,
            loss: false,
            loss_batch_size: 8,
            keep_generations: false,
            overwrite: false,
        }
    }
}

impl EvalSettings {
    /// What the generation shards depend on; shards made with anything else are not reused.
    fn shard_settings(&self, data: &EvalData) -> Json {
        Json::object([
            ("samples", Json::from(self.samples)),
            ("temperature", Json::Float(f64::from(self.sampler.temperature))),
            ("top_p", Json::Float(f64::from(self.sampler.top_p))),
            ("top_k", Json::from(self.sampler.top_k)),
            ("max_new_tokens", Json::from(self.max_new_tokens)),
            ("stop", Json::Array(self.stop.iter().map(|s| Json::from(s.as_str())).collect())),
            ("seed", Json::Str(self.seed.to_string())),
            ("id_op_threshold", Json::from(self.id_op_threshold)),
            ("shard_prompts", Json::from(self.shard_prompts)),
            ("data_sha256", Json::from(data.fingerprint())),
        ])
    }

    /// The threshold as the metrics split by it.
    fn metrics_threshold(&self) -> i64 {
        self.id_op_threshold.unwrap_or(i64::MAX)
    }
}

/// What an evaluation reports while it runs.
#[derive(Debug, Clone, Copy)]
pub enum EvalEvent<'a> {
    /// Model `index` (0-based) of `count` starts.
    Model { index: usize, count: usize, name: &'a str },
    /// The model's metrics file exists: it is finished and skipped.
    Skipped { name: &'a str },
    /// Sampling progress: `done` of `total` samples exist (shards kept from earlier runs
    /// included); `new_samples` and `new_tokens` were generated by this run.
    Generating { name: &'a str, done: usize, total: usize, new_samples: usize, new_tokens: usize },
    /// A later step starts: `"loss"`, `"scoring"` or `"metrics"`.
    Stage { name: &'a str, stage: &'static str },
    /// The model is finished; its `summary.json` record.
    Finished { name: &'a str, summary: &'a Json },
}

/// The outcome for one model.
#[derive(Debug, Clone)]
pub struct ModelOutcome {
    pub name: String,
    /// Its `summary.json` record.
    pub summary: Json,
    /// Its ID weighting record (`summary_id_weighting.json`).
    pub id_weighting: Json,
    /// Whether it was finished before this run.
    pub skipped: bool,
}

/// `<out>/<model>_metrics.json`.
pub fn metrics_path(out: &Path, model: &str) -> PathBuf {
    out.join(format!("{model}_metrics.json"))
}

/// `<out>/<model>_<subset>_generations.jsonl`.
pub fn generations_path(out: &Path, model: &str, subset: Subset) -> PathBuf {
    out.join(format!("{model}_{}_generations.jsonl", subset.name()))
}

/// Evaluates `models` on `data` on `device`, writing under `out` (see the module docs), and
/// returns one outcome per model, in order.
pub fn evaluate<B: Backend>(
    models: &[ModelEntry],
    data: &EvalData,
    out: &Path,
    settings: &EvalSettings,
    device: &B::Device,
    mut on_event: impl FnMut(EvalEvent),
) -> Result<Vec<ModelOutcome>> {
    if settings.samples == 0 || settings.shard_prompts == 0 {
        return Err(Error::InvalidInput("samples and shard size must be at least 1".into()));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let mut gold: Option<PathBuf> = None;
    let mut outcomes: Vec<ModelOutcome> = Vec::new();
    for (index, entry) in models.iter().enumerate() {
        let name = entry.name.as_str();
        on_event(EvalEvent::Model { index, count: models.len(), name });
        let finished = metrics_path(out, name).is_file() && !settings.overwrite;
        if finished {
            on_event(EvalEvent::Skipped { name });
            remove_dir(&ShardStore::dir_for(out, name))?;
        } else {
            let gold_dir = match &gold {
                Some(dir) => dir.clone(),
                None => {
                    let dir = out.join(".gold");
                    remove_dir(&dir)?;
                    build_gold_dir(&data.dir, &dir)?;
                    gold = Some(dir.clone());
                    dir
                }
            };
            evaluate_model::<B>(entry, data, out, &gold_dir, settings, device, &mut on_event)?;
        }
        let (summary, weighting) = read_outcome(out, name)?;
        if !finished {
            on_event(EvalEvent::Finished { name, summary: &summary });
        }
        outcomes.push(ModelOutcome { name: name.to_owned(), summary, id_weighting: weighting, skipped: finished });
        let records: Vec<Json> = outcomes.iter().map(|o| o.summary.clone()).collect();
        write_summary(out, &records)?;
        let weightings: Vec<(String, Json)> = outcomes.iter().map(|o| (o.name.clone(), o.id_weighting.clone())).collect();
        write_weighting_summary(out, &weightings)?;
    }
    Ok(outcomes)
}

/// The summary and ID weighting records of a finished model, from its files.
fn read_outcome(out: &Path, name: &str) -> Result<(Json, Json)> {
    let metrics = read_json(&metrics_path(out, name))?;
    let results_path = out.join(name).join("results.json");
    let strict = if results_path.is_file() { Some(read_json(&results_path)?) } else { None };
    let id_file = format!("{}.graph_results.jsonl", generations_path(Path::new(""), name, Subset::Id).display());
    let strict_id = strict.as_ref().and_then(|r| r.get("files")).and_then(|f| f.get(&id_file));
    Ok((summary_record(&metrics), id_weighting(&metrics, strict_id)))
}

fn read_json(path: &Path) -> Result<Json> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    pyjson::parse(&text).map_err(|m| Error::data(path, None, m))
}

/// Prompt token ids of `rows`, checked against the model's context.
fn encode_prompts(rows: &[EvalRow], tokenizer: &Tokenizer, context: usize) -> Result<Vec<Vec<u32>>> {
    rows.iter()
        .map(|row| {
            let ids = tokenizer.encode(&row.prompt)?;
            if ids.len() >= context {
                return Err(Error::data(
                    &row.file,
                    Some(row.line),
                    format!("the prompt has {} tokens; the model's context is {context}", ids.len()),
                ));
            }
            Ok(ids)
        })
        .collect()
}

fn evaluate_model<B: Backend>(
    entry: &ModelEntry,
    data: &EvalData,
    out: &Path,
    gold_dir: &Path,
    settings: &EvalSettings,
    device: &B::Device,
    on_event: &mut impl FnMut(EvalEvent),
) -> Result<()> {
    let name = entry.name.as_str();
    let model = hf::load::<B>(&entry.path, device)?;
    let tokenizer = Tokenizer::from_file(&entry.path)?;
    let context = model.context_len();
    let prompts = [encode_prompts(&data.id, &tokenizer, context)?, encode_prompts(&data.ood, &tokenizer, context)?];
    let shard_dir = ShardStore::dir_for(out, name);
    if settings.overwrite {
        // The metrics file marks a finished model: it goes first, so that an interrupted
        // re-evaluation is never taken for a finished one.
        remove_file(&metrics_path(out, name))?;
        remove_dir(&shard_dir)?;
    }
    let store = ShardStore::open(&shard_dir, &settings.shard_settings(data))?;

    let mut engine = Engine::new(&model, Some(&tokenizer));
    engine.max_batch_size = settings.batch_size.max(1);
    let n = settings.samples;
    let total = (data.id.len() + data.ood.len()) * n;
    let mut done = 0;
    for subset in Subset::BOTH {
        for (index, rows) in data.rows(subset).chunks(settings.shard_prompts).enumerate() {
            if store.path(ShardKind::Generations, subset, index).is_file() {
                done += rows.len() * n;
            }
        }
    }
    let (mut new_samples, mut new_tokens) = (0, 0);
    on_event(EvalEvent::Generating { name, done, total, new_samples, new_tokens });
    for (subset, prompts) in Subset::BOTH.into_iter().zip(&prompts) {
        let rows = data.rows(subset);
        for (index, (rows, prompts)) in
            rows.chunks(settings.shard_prompts).zip(prompts.chunks(settings.shard_prompts)).enumerate()
        {
            let path = store.path(ShardKind::Generations, subset, index);
            if path.is_file() {
                continue;
            }
            let params = SamplingParams {
                n,
                sampler: settings.sampler,
                max_new_tokens: settings.max_new_tokens,
                stop: StopCriteria { token_ids: Vec::new(), strings: settings.stop.clone() },
                ignore_eos: false, // the model's EOS ids stop too
                seed: shard_seed(settings.seed, subset, index),
                skip_special_tokens: false,
            };
            let (base_samples, base_tokens) = (new_samples, new_tokens);
            let results = engine.generate(prompts, &params, |p| {
                on_event(EvalEvent::Generating {
                    name,
                    done: done + p.finished,
                    total,
                    new_samples: base_samples + p.finished,
                    new_tokens: base_tokens + p.tokens,
                });
            })?;
            let mut file = AtomicFile::create(&path)?;
            for (row, samples) in rows.iter().zip(&results) {
                for sample in samples {
                    file.write_line(&generation_line(row, &sample.text, sample.token_ids.len()))?;
                    new_tokens += sample.token_ids.len();
                }
            }
            file.commit()?;
            done += rows.len() * n;
            new_samples += rows.len() * n;
            on_event(EvalEvent::Generating { name, done, total, new_samples, new_tokens });
        }
    }

    if settings.loss {
        on_event(EvalEvent::Stage { name, stage: "loss" });
        for subset in Subset::BOTH {
            for (index, rows) in data.rows(subset).chunks(settings.shard_prompts).enumerate() {
                let path = store.path(ShardKind::Loss, subset, index);
                if path.is_file() {
                    continue;
                }
                let losses = row_losses(&model, &tokenizer, rows, settings.loss_batch_size)?;
                let mut file = AtomicFile::create(&path)?;
                for (row, loss) in rows.iter().zip(losses) {
                    let line = Json::object([
                        ("__idx", Json::from(row.idx)),
                        ("op", Json::Str(row.op.to_string())),
                        ("loss", Json::Float(loss)),
                    ]);
                    file.write_line(&line.dumps(Style::COMPACT))?;
                }
                file.commit()?;
            }
        }
    }
    finish_model(name, data, out, gold_dir, &store, settings, on_event)?;
    store.remove()
}

/// Joins the shards into the generations files, then [`write_model_files`].
fn finish_model(
    name: &str,
    data: &EvalData,
    out: &Path,
    gold_dir: &Path,
    store: &ShardStore,
    settings: &EvalSettings,
    on_event: &mut impl FnMut(EvalEvent),
) -> Result<()> {
    for subset in Subset::BOTH {
        let shards = data.rows(subset).chunks(settings.shard_prompts).len();
        let parts: Vec<PathBuf> = (0..shards).map(|i| store.path(ShardKind::Generations, subset, i)).collect();
        concatenate(&parts, &generations_path(out, name, subset))?;
    }
    let losses = if settings.loss { Some(read_losses(data, store, settings)?) } else { None };
    write_model_files(name, out, gold_dir, settings, losses.as_ref(), on_event)
}

/// The files of a model whose `<out>/<name>_{id,ood}_generations.jsonl` exist: strict scoring
/// against the gold graphs in `gold_dir` into `<out>/<name>/` (per-sample results, score
/// reports, `results.json`), then `<out>/<name>_metrics.json`, written last. The generations
/// files are removed afterwards unless `settings.keep_generations`.
pub fn write_model_files(
    name: &str,
    out: &Path,
    gold_dir: &Path,
    settings: &EvalSettings,
    losses: Option<&Losses>,
    on_event: &mut impl FnMut(EvalEvent),
) -> Result<()> {
    let files: Vec<PathBuf> = Subset::BOTH.iter().map(|&s| generations_path(out, name, s)).collect();
    on_event(EvalEvent::Stage { name, stage: "scoring" });
    let results_dir = out.join(name);
    remove_dir(&results_dir)?;
    let options = ScoreOptions { overwrite: true, ..ScoreOptions::default() };
    for file in &files {
        score(gold_dir, file, &results_dir, &options)?;
    }
    aggregate(&results_dir, &DEFAULT_PASS_AT, true)?;

    on_event(EvalEvent::Stage { name, stage: "metrics" });
    let mut samples = Vec::new();
    for file in &files {
        samples.extend(read_samples(file)?);
    }
    let metrics = answer_metrics_with_loss(name, &samples, settings.metrics_threshold(), settings.samples as u64, losses);
    if !settings.keep_generations {
        for file in &files {
            remove_file(file)?;
        }
    }
    write_atomic(&metrics_path(out, name), &metrics.dumps(Style::INDENT2_UTF8))
}

/// The losses of the loss shards, summed in row order.
fn read_losses(data: &EvalData, store: &ShardStore, settings: &EvalSettings) -> Result<Losses> {
    let mut losses = Losses::default();
    for subset in Subset::BOTH {
        let split = match subset {
            Subset::Id => &mut losses.id,
            Subset::Ood => &mut losses.ood,
        };
        for index in 0..data.rows(subset).chunks(settings.shard_prompts).len() {
            let path = store.path(ShardKind::Loss, subset, index);
            for record in jsonl_records(&path)? {
                let record = record?;
                let op = record.str_field(&path, "op")?.to_owned();
                let loss = record
                    .fields
                    .get("loss")
                    .and_then(serde_json::Value::as_f64)
                    .ok_or_else(|| Error::data(&path, Some(record.line), "missing \"loss\""))?;
                split.push(&op, loss);
            }
        }
    }
    Ok(losses)
}

/// Writes the concatenation of `parts` to `path` (atomically).
fn concatenate(parts: &[PathBuf], path: &Path) -> Result<()> {
    let mut file = AtomicFile::create(path)?;
    for part in parts {
        let reader = BufReader::new(std::fs::File::open(part).map_err(|e| Error::io(part, e))?);
        for line in reader.lines() {
            file.write_line(&line.map_err(|e| Error::io(part, e))?)?;
        }
    }
    file.commit()
}

fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(path, e)),
        _ => Ok(()),
    }
}
