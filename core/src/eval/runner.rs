//! The evaluation of a list of checkpoints on a task (`eval_checkpoints.py` for Interplay,
//! `docs/interplay.md` §8.1–8.5): for every model, sample `samples` completions of every item of
//! every part with the batched engine, shard by shard, then let the task write its files
//! ([`Evaluation`]). [`evaluate`] runs on one device, [`evaluate_on`] on several (and several
//! processes), with the same files.
//!
//! Files under `out` (the release's `evals/` layout):
//! - `<model>_<part>_generations.jsonl`: the task's line per sample, joined from the shards,
//!   kept when `keep_generations`;
//! - the task's files: for Interplay `<model>_metrics.json` (written last, so it marks a
//!   finished model, which later runs skip unless `overwrite`), `<model>/` with the strict graph
//!   results and `results.json`, and the run summaries `summary.{json,csv}` and
//!   `summary_id_weighting.{json,csv}`, rewritten after each model;
//! - `.shards/<model>/`: finished shards of an unfinished model.

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;

use super::generation::{Progress, Shard, ShardWork, generate_shards};
use super::loss::losses;
use super::release::ModelEntry;
use super::shards::{ShardKind, ShardStore, concatenate, remove_dir};
use crate::dist::{self, NodeSpec, Replica};
use crate::error::{Error, Result};
use crate::generate::{Engine, Sampler};
use crate::io::pyjson::{self, Json, Style};
use crate::io::{remove_file, write_atomic};
use crate::model::{Dtype, hf};
use crate::tasks::{Evaluation, FinishedRun, Item};
use crate::tokenizer::Tokenizer;

pub use super::compat::{metrics_path, write_model_files};

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
    /// Levels (Interplay: ops) above this are OOD; `None` puts everything in ID. Recorded with
    /// the shards; the split itself is the data's.
    pub id_op_threshold: Option<i64>,
    /// Prompts per shard: the unit of work kept on disk.
    pub shard_prompts: usize,
    /// Sequences decoded together.
    pub batch_size: usize,
    /// Bytes the KV cache may take ([`crate::generate::Engine::kv_memory`]).
    pub kv_memory: Option<u64>,
    /// Tokens one prefill pass takes at most ([`crate::generate::Engine::max_prefill_tokens`]).
    pub max_prefill_tokens: usize,
    /// Also compute the teacher-forced loss of every item (Interplay's `avg_loss` fields).
    pub loss: bool,
    /// Rows per teacher-forced forward pass.
    pub loss_batch_size: usize,
    /// Keep `<model>_<part>_generations.jsonl`.
    pub keep_generations: bool,
    /// Re-evaluate finished models and drop unfinished shards.
    pub overwrite: bool,
    /// The dtype models are loaded and sampled in.
    pub dtype: Dtype,
}

impl Default for EvalSettings {
    fn default() -> Self {
        Self {
            samples: 128,
            sampler: Sampler { temperature: 0.7, top_k: 0, top_p: 1.0, min_p: 0.0 },
            max_new_tokens: 1024,
            stop: vec!["</answer>".to_owned()],
            seed: 0,
            id_op_threshold: Some(10),
            shard_prompts: 32,
            batch_size: 256,
            kv_memory: None,
            max_prefill_tokens: crate::generate::MAX_PREFILL_TOKENS,
            loss: false,
            loss_batch_size: 8,
            keep_generations: false,
            overwrite: false,
            dtype: Dtype::F32,
        }
    }
}

impl EvalSettings {
    /// What the generation shards depend on; shards made with anything else are not reused.
    fn shard_settings(&self, evaluation: &dyn Evaluation) -> Json {
        let (fingerprint, skip_special_tokens) = (evaluation.fingerprint(), evaluation.skip_special_tokens());
        let mut fields = vec![
            ("samples", Json::from(self.samples)),
            ("temperature", Json::Float(f64::from(self.sampler.temperature))),
            ("top_p", Json::Float(f64::from(self.sampler.top_p))),
            ("top_k", Json::from(self.sampler.top_k)),
            ("max_new_tokens", Json::from(self.max_new_tokens)),
            ("stop", Json::Array(self.stop.iter().map(|s| Json::from(s.as_str())).collect())),
            ("seed", Json::Str(self.seed.to_string())),
            ("id_op_threshold", Json::from(self.id_op_threshold)),
            ("shard_prompts", Json::from(self.shard_prompts)),
            ("data_sha256", Json::from(fingerprint)),
        ];
        // Shards sampled in f32 and without min-p (written before those settings existed) stay
        // valid.
        if self.sampler.min_p > 0.0 {
            fields.push(("min_p", Json::Float(f64::from(self.sampler.min_p))));
        }
        if self.dtype != Dtype::F32 {
            fields.push(("dtype", Json::from(self.dtype.name())));
        }
        if skip_special_tokens {
            fields.push(("skip_special_tokens", Json::from(true)));
        }
        Json::object(fields)
    }
}

/// What an evaluation reports while it runs.
#[derive(Debug, Clone, Copy)]
pub enum EvalEvent<'a> {
    /// Model `index` (0-based) of `count` starts.
    Model { index: usize, count: usize, name: &'a str },
    /// The model's files are complete: it is finished and skipped.
    Skipped { name: &'a str },
    /// Sampling progress: `done` of `total` samples exist (shards kept from earlier runs
    /// included); `new_samples` and `new_tokens` were generated by this run.
    Generating { name: &'a str, done: usize, total: usize, new_samples: usize, new_tokens: usize },
    /// A later step starts: `"loss"`, then the task's (Interplay: `"scoring"`, `"metrics"`).
    Stage { name: &'a str, stage: &'static str },
    /// The model is finished; its summary record (Interplay: its `summary.json` record).
    Finished { name: &'a str, summary: &'a Json },
}

/// The outcome for one model.
#[derive(Debug, Clone)]
pub struct ModelOutcome {
    pub name: String,
    /// Its summary record (Interplay: its `summary.json` record).
    pub summary: Json,
    /// Whether it was finished before this run.
    pub skipped: bool,
}

/// `<out>/<model>_<part>_generations.jsonl`.
pub fn generations_path(out: &Path, model: &str, part: impl AsRef<str>) -> PathBuf {
    out.join(format!("{model}_{}_generations.jsonl", part.as_ref()))
}


/// Evaluates `models` on a task's `evaluation` on `device`, writing under `out` (see the module
/// docs), and returns one outcome per model, in order. For Interplay, `evaluation` is the
/// [`EvalData`](crate::tasks::interplay::eval::EvalData) of a directory of per-op files.
pub fn evaluate<B: Backend>(
    models: &[ModelEntry],
    evaluation: &dyn Evaluation,
    out: &Path,
    settings: &EvalSettings,
    device: &B::Device,
    mut on_event: impl FnMut(EvalEvent),
) -> Result<Vec<ModelOutcome>> {
    run_replica::<B>(&Replica::single(), device, models, evaluation, out, settings, &mut on_event)
}

/// [`evaluate`] on several devices, one engine each (the replicas of [`dist::launch`]), and with
/// `nodes` on the devices of other processes too. The shards missing on disk are dealt out
/// round-robin over the replicas; each generates its own and sends them to the main replica
/// (global rank 0), which writes every shard file and then the task's files. A shard's samples
/// depend only on its prompts and its seed, so the files are byte-identical to a one-device
/// run's, and an interrupted run resumes from the shards on disk with any number of devices.
///
/// Events come from the main replica only. On the other nodes the outcomes carry no summary
/// (`Json::Null`): node 0 writes every file. Every node reads the models and the data from its
/// own paths (the same files: the nodes' fingerprints must agree).
pub fn evaluate_on<B: Backend>(
    models: &[ModelEntry],
    evaluation: &(dyn Evaluation + Sync),
    out: &Path,
    settings: &EvalSettings,
    devices: &[B::Device],
    nodes: Option<&NodeSpec>,
    on_event: impl FnMut(EvalEvent),
) -> Result<Vec<ModelOutcome>> {
    let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
    let settings_text = settings.shard_settings(evaluation).dumps(Style::COMPACT);
    let fingerprint = dist::fingerprint(&["eval", &names.join("\n"), &settings_text, &devices.len().to_string()]);
    let other = |replica: Replica, device: &B::Device| run_replica::<B>(&replica, device, models, evaluation, out, settings, &mut |_| {});
    let main = |replica: Replica, device: &B::Device| {
        let mut on_event = on_event;
        let mut quiet = |_: EvalEvent| {};
        let events: &mut dyn FnMut(EvalEvent) = if replica.is_main() { &mut on_event } else { &mut quiet };
        run_replica::<B>(&replica, device, models, evaluation, out, settings, events)
    };
    dist::launch(devices, nodes, &fingerprint, main, other)
}

/// One replica's part of an evaluation: every replica walks the models in order; the main one
/// decides what is left to do, reports, and writes.
fn run_replica<B: Backend>(
    replica: &Replica,
    device: &B::Device,
    models: &[ModelEntry],
    evaluation: &dyn Evaluation,
    out: &Path,
    settings: &EvalSettings,
    on_event: &mut dyn FnMut(EvalEvent),
) -> Result<Vec<ModelOutcome>> {
    if settings.samples == 0 || settings.shard_prompts == 0 {
        return Err(Error::InvalidInput("samples and shard size must be at least 1".into()));
    }
    // Every replica, so that all of them stop (read-only: a directory another node lacks is fine).
    for entry in models {
        evaluation.check_out(out, &entry.name)?;
        if !settings.overwrite && evaluation.finished_marker(out, &entry.name).is_file() {
            check_settings(out, &entry.name, &settings.shard_settings(evaluation))?;
            evaluation.check_finished(out, &entry.name)?;
        }
    }
    let main = replica.is_main();
    if main {
        std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    }
    let mut prepared = false;
    let mut outcomes: Vec<ModelOutcome> = Vec::new();
    for (index, entry) in models.iter().enumerate() {
        let name = entry.name.as_str();
        let mut finished = false;
        if main {
            on_event(EvalEvent::Model { index, count: models.len(), name });
            finished = evaluation.finished_marker(out, name).is_file() && !settings.overwrite;
            if finished {
                on_event(EvalEvent::Skipped { name });
                remove_dir(&ShardStore::dir_for(out, name))?;
            }
        }
        let finished = replica.broadcast(finished.into())?.as_bool().unwrap_or(false);
        if !finished {
            if main && !prepared {
                evaluation.prepare(out)?;
                prepared = true;
            }
            evaluate_model::<B>(replica, entry, evaluation, out, settings, device, on_event)?;
        }
        if !main {
            outcomes.push(ModelOutcome { name: name.to_owned(), summary: Json::Null, skipped: finished });
            continue;
        }
        let summary = evaluation.summary(out, name)?;
        if !finished {
            on_event(EvalEvent::Finished { name, summary: &summary });
        }
        outcomes.push(ModelOutcome { name: name.to_owned(), summary, skipped: finished });
        let names: Vec<String> = outcomes.iter().map(|o| o.name.clone()).collect();
        evaluation.write_summaries(out, &names)?;
    }
    Ok(outcomes)
}

/// `<out>/<model>_eval_settings.json`: what a model's samples were drawn with and from (the
/// shards' settings, [`EvalSettings::shard_settings`]), written when its evaluation starts.
pub fn settings_path(out: &Path, model: &str) -> PathBuf {
    out.join(format!("{model}_eval_settings.json"))
}

/// A finished model is skipped only if it was evaluated with `now`'s settings and data (its
/// files from before the settings were recorded are taken as they are).
fn check_settings(out: &Path, model: &str, now: &Json) -> Result<()> {
    let path = settings_path(out, model);
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(()) };
    let recorded = pyjson::parse(text.trim_end()).map_err(|e| Error::data(&path, None, e))?;
    let keys: Vec<&str> = match (&recorded, now) {
        (Json::Object(old), Json::Object(new)) => {
            let value = |fields: &[(String, Json)], key: &str| fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.dumps(Style::COMPACT));
            let mut keys: Vec<&str> = old.iter().chain(new.iter()).map(|(k, _)| k.as_str()).collect();
            keys.sort_unstable();
            keys.dedup();
            keys.into_iter().filter(|k| value(old, k) != value(new, k)).collect()
        }
        _ => vec!["settings"],
    };
    if keys.is_empty() {
        return Ok(());
    }
    Err(Error::data(
        &path,
        None,
        format!("model {model} was evaluated with other settings or data ({} differ): pass --overwrite to evaluate it again, or another --out", keys.join(", ")),
    ))
}

/// Prompt token ids of `items`, checked against the model's context.
fn encode_prompts(items: &[Item], tokenizer: &Tokenizer, context: usize) -> Result<Vec<Vec<u32>>> {
    items
        .iter()
        .map(|item| {
            let ids = tokenizer.encode(&item.prompt)?;
            if ids.len() >= context {
                return Err(item.source.error(format!("the prompt has {} tokens; the model's context is {context}", ids.len())));
            }
            Ok(ids)
        })
        .collect()
}

/// One model on every replica: sampling of the missing shards (see [`evaluate_on`]), then, on
/// the main replica, the losses and the task's files.
fn evaluate_model<B: Backend>(
    replica: &Replica,
    entry: &ModelEntry,
    evaluation: &dyn Evaluation,
    out: &Path,
    settings: &EvalSettings,
    device: &B::Device,
    on_event: &mut dyn FnMut(EvalEvent),
) -> Result<()> {
    let name = entry.name.as_str();
    let model = hf::load_as::<B>(&entry.path, device, settings.dtype)?;
    let tokenizer = Tokenizer::from_file(&entry.path)?;
    let parts = evaluation.parts();
    let prompts: Vec<Vec<Vec<u32>>> = parts.iter().map(|p| encode_prompts(p.items, &tokenizer, model.context_len())).collect::<Result<_>>()?;
    let shards: Vec<Shard> = parts
        .iter()
        .enumerate()
        .flat_map(|(part, p)| (0..p.items.len().div_ceil(settings.shard_prompts)).map(move |index| Shard { part, index }))
        .collect();

    // The main replica opens the store and says which shards are missing.
    let store = if replica.is_main() {
        let shard_dir = ShardStore::dir_for(out, name);
        if settings.overwrite {
            // The finished marker goes first, so that an interrupted re-evaluation is never
            // taken for a finished one.
            remove_file(&evaluation.finished_marker(out, name))?;
            remove_dir(&shard_dir)?;
        }
        let shard_settings = settings.shard_settings(evaluation);
        write_atomic(&settings_path(out, name), &(shard_settings.dumps(Style::COMPACT) + "\n"))?;
        Some(ShardStore::open(&shard_dir, &shard_settings)?)
    } else {
        None
    };
    let missing: Vec<usize> = match &store {
        Some(store) => (0..shards.len()).filter(|&k| !store.path(ShardKind::Generations, parts[shards[k].part].name, shards[k].index).is_file()).collect(),
        None => Vec::new(),
    };
    let missing: Vec<Shard> = replica
        .broadcast(missing.into())?
        .as_array()
        .map(|ks| ks.iter().filter_map(|k| k.as_u64()).filter_map(|k| shards.get(k as usize).copied()).collect())
        .unwrap_or_default();

    let mut engine = Engine::new(&model, Some(&tokenizer));
    engine.max_batch_size = settings.batch_size.max(1);
    engine.kv_memory = settings.kv_memory;
    engine.max_prefill_tokens = settings.max_prefill_tokens;
    let work = ShardWork { evaluation, parts: &parts, prompts: &prompts, settings };
    let progress = Progress::new(name, &parts, &missing, settings);
    generate_shards(replica, &engine, &work, &missing, progress, store.as_ref(), on_event)?;
    let Some(store) = store else { return Ok(()) };

    let losses = if settings.loss {
        on_event(EvalEvent::Stage { name, stage: "loss" });
        Some(losses(&model, &tokenizer, evaluation, &store, settings)?)
    } else {
        None
    };
    let generations: Vec<PathBuf> = parts.iter().map(|p| generations_path(out, name, p.name)).collect();
    for (part, path) in parts.iter().zip(&generations) {
        let shards = part.items.chunks(settings.shard_prompts).len();
        let files: Vec<PathBuf> = (0..shards).map(|i| store.path(ShardKind::Generations, part.name, i)).collect();
        concatenate(&files, path)?;
    }
    let run = FinishedRun { generations: &generations, samples: settings.samples, losses: losses.as_deref(), keep_generations: settings.keep_generations };
    evaluation.finish(name, out, &run, &mut |stage| on_event(EvalEvent::Stage { name, stage }))?;
    store.remove()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An evaluation of nothing, whose texts keep or drop special tokens.
    struct Empty(bool);

    impl Evaluation for Empty {
        fn parts(&self) -> Vec<crate::tasks::Part<'_>> {
            Vec::new()
        }
        fn fingerprint(&self) -> String {
            "x".into()
        }
        fn records(&self, _: usize, _: usize, _: &[Vec<crate::tasks::Completion>]) -> Result<Vec<String>> {
            Ok(Vec::new())
        }
        fn loss_text(&self, _: usize, _: usize) -> Option<&str> {
            None
        }
        fn finished_marker(&self, out: &Path, _: &str) -> PathBuf {
            out.to_path_buf()
        }
        fn finish(&self, _: &str, _: &Path, _: &FinishedRun<'_>, _: &mut dyn FnMut(&'static str)) -> Result<()> {
            Ok(())
        }
        fn summary(&self, _: &Path, _: &str) -> Result<Json> {
            Ok(Json::Null)
        }
        fn write_summaries(&self, _: &Path, _: &[String]) -> Result<()> {
            Ok(())
        }
        fn skip_special_tokens(&self) -> bool {
            self.0
        }
    }

    #[test]
    fn shards_record_skipped_special_tokens_only_when_on() {
        let text = |evaluation: &Empty| EvalSettings::default().shard_settings(evaluation).dumps(Style::COMPACT);
        assert!(!text(&Empty(false)).contains("skip_special_tokens"), "shards written before the setting stay valid: {}", text(&Empty(false)));
        assert!(text(&Empty(true)).contains("skip_special_tokens"), "shards of texts without special tokens are not reused for texts with them");
    }
}
