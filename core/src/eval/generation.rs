//! Sampling the missing shards of one model over the replicas of an evaluation
//! ([`super::evaluate_on`]): in round `r`, replica `k` generates missing shard `r · world + k`
//! on its own engine; the others send their lines to the main replica, which writes every
//! shard file (whole, atomically) at the end of the round. With one replica this is the
//! shards in order, each written as soon as it is done.
//!
//! A shard's samples depend on its prompts and its seed ([`shard_seed`]) only: which replica
//! made it, and which shards it made before, change nothing.

use serde_json::{Value, json};

use super::runner::{EvalEvent, EvalSettings};
use super::shards::{ShardKind, ShardStore, shard_seed};
use crate::dist::Replica;
use crate::error::{Error, Result};
use crate::generate::{Engine, SamplingParams, StopCriteria};
use crate::io::AtomicFile;
use crate::tasks::{Completion, Evaluation, Part};
use burn::tensor::backend::Backend;

/// Shard `index` of part `part`: items `index · shard_prompts ..` of the part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shard {
    pub part: usize,
    pub index: usize,
}

/// What generating a shard needs: the task, its parts and their encoded prompts, the settings.
pub(super) struct ShardWork<'a> {
    pub evaluation: &'a dyn Evaluation,
    pub parts: &'a [Part<'a>],
    pub prompts: &'a [Vec<Vec<u32>>],
    pub settings: &'a EvalSettings,
}

impl ShardWork<'_> {
    /// The prompts of `shard`.
    fn prompts(&self, shard: Shard) -> &[Vec<u32>] {
        let part = &self.prompts[shard.part];
        let start = shard.index * self.settings.shard_prompts;
        &part[start..(start + self.settings.shard_prompts).min(part.len())]
    }

    /// The lines of `shard`'s file and the tokens generated; `progress(samples, tokens)` while
    /// it runs.
    fn generate<B: Backend>(&self, engine: &Engine<B>, shard: Shard, mut progress: impl FnMut(usize, usize)) -> Result<(Vec<String>, usize)> {
        let settings = self.settings;
        let params = SamplingParams {
            n: settings.samples,
            sampler: settings.sampler,
            max_new_tokens: settings.max_new_tokens,
            stop: StopCriteria { token_ids: Vec::new(), strings: settings.stop.clone(), ..StopCriteria::default() },
            ignore_eos: false, // the model's EOS ids stop too
            seed: shard_seed(settings.seed, shard.part, shard.index),
            skip_special_tokens: self.evaluation.skip_special_tokens(),
            penalties: Default::default(),
        };
        let results = engine.generate(self.prompts(shard), &params, |p| progress(p.finished, p.tokens))?;
        let completions: Vec<Vec<Completion>> = results
            .into_iter()
            .map(|samples| samples.into_iter().map(|s| Completion { tokens: s.token_ids.len(), text: s.text }).collect())
            .collect();
        let tokens = completions.iter().flatten().map(|c| c.tokens).sum();
        let lines = self.evaluation.records(shard.part, shard.index * settings.shard_prompts, &completions)?;
        Ok((lines, tokens))
    }
}

/// Sampling progress of one model, as the main replica reports it.
pub(super) struct Progress<'a> {
    name: &'a str,
    done: usize,
    total: usize,
    new_samples: usize,
    new_tokens: usize,
}

impl<'a> Progress<'a> {
    /// Before sampling: everything but the `missing` shards is on disk.
    pub fn new(name: &'a str, parts: &[Part<'_>], missing: &[Shard], settings: &EvalSettings) -> Self {
        let n = settings.samples;
        let total = parts.iter().map(|p| p.items.len()).sum::<usize>().saturating_mul(n);
        let left = missing.iter().fold(0usize, |left, s| left.saturating_add(shard_len(parts, *s, settings).saturating_mul(n)));
        Self { name, done: total.saturating_sub(left), total, new_samples: 0, new_tokens: 0 }
    }

    /// The event, with `samples` and `tokens` of a shard under way added.
    fn event(&self, samples: usize, tokens: usize) -> EvalEvent<'a> {
        EvalEvent::Generating {
            name: self.name,
            done: self.done + samples,
            total: self.total,
            new_samples: self.new_samples + samples,
            new_tokens: self.new_tokens + tokens,
        }
    }
}

/// Items in `shard`.
fn shard_len(parts: &[Part<'_>], shard: Shard, settings: &EvalSettings) -> usize {
    let items = parts[shard.part].items.len();
    items.saturating_sub(shard.index * settings.shard_prompts).min(settings.shard_prompts)
}

/// Generates the `missing` shards over the replicas (see the module docs). `store` is the main
/// replica's (the others have none); events are the main replica's.
pub(super) fn generate_shards<B: Backend>(
    replica: &Replica,
    engine: &Engine<B>,
    work: &ShardWork,
    missing: &[Shard],
    mut progress: Progress,
    store: Option<&ShardStore>,
    on_event: &mut dyn FnMut(EvalEvent),
) -> Result<()> {
    let (world, rank, parts) = (replica.world(), replica.rank(), work.parts);
    if store.is_some() {
        on_event(progress.event(0, 0));
    }
    for round in 0..missing.len().div_ceil(world) {
        let mut own = match missing.get(round * world + rank) {
            Some(&shard) => Some(work.generate(engine, shard, |samples, tokens| {
                if store.is_some() {
                    on_event(progress.event(samples, tokens));
                }
            })?),
            None => None,
        };
        let Some(store) = store else {
            // A helper replica: its shard goes to the main one.
            let sent = own.map_or(Value::Null, |(lines, tokens)| json!({ "lines": lines, "tokens": tokens }));
            replica.gather(sent)?;
            continue;
        };
        let received = replica.gather(Value::Null)?;
        for (from, value) in received.into_iter().enumerate() {
            let Some(&shard) = missing.get(round * world + from) else { continue };
            let (lines, tokens) = match from == rank {
                true => own.take().expect("the main replica's shard"),
                false => received_shard(value, from)?,
            };
            let path = store.path(ShardKind::Generations, parts[shard.part].name, shard.index);
            let mut file = AtomicFile::create(&path)?;
            for line in &lines {
                file.write_line(line)?;
            }
            file.commit()?;
            let samples = shard_len(parts, shard, work.settings) * work.settings.samples;
            progress.done += samples;
            progress.new_samples += samples;
            progress.new_tokens += tokens;
        }
        on_event(progress.event(0, 0));
    }
    Ok(())
}

/// The lines and token count replica `from` sent.
fn received_shard(value: Value, from: usize) -> Result<(Vec<String>, usize)> {
    let bad = || Error::Distributed(format!("replica {from} sent no shard where one was due"));
    let tokens = value.get("tokens").and_then(Value::as_u64).ok_or_else(bad)? as usize;
    let Some(Value::Array(lines)) = value.get("lines") else { return Err(bad()) };
    let lines = lines.iter().map(|l| l.as_str().map(str::to_owned).ok_or_else(bad)).collect::<Result<_>>()?;
    Ok((lines, tokens))
}
