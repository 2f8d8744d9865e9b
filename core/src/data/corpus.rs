//! A pre-training corpus in the Interplay release layout: shards of `<root>/train/<op>/*.jsonl`
//! chosen by a PRESET mixture (reference file-count semantics, [`super::mixture`]), each row the
//! reference text its task gives it (for Interplay `compose_text(row) + "[EOS]"`), tokenized,
//! concatenated in op order and packed first-fit-decreasing into `cutoff`-token blocks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::mixture::{Preset, Shard, Take, effective_shares, select, shard_label, sort_shards};
use super::packing::{PACKING_GROUP, pack_ffd, pack_ffd_documents};
use super::sample::Sample;
use crate::error::{Error, Result};
use crate::par::map_in_order;
use crate::tasks::Task;
use crate::tokenizer::Tokenizer;

/// What the mixture took, per op.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MixtureReport {
    pub preset: String,
    pub token_budget: f64,
    /// `(op, requested probability, shards taken fully, fraction of the last, tokens, share)`.
    pub ops: Vec<OpShare>,
    pub total_tokens: f64,
    pub blocks: usize,
}

/// One op's part of a [`MixtureReport`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpShare {
    pub op: u32,
    pub requested: f64,
    pub full_shards: usize,
    pub partial_fraction: f64,
    pub tokens: f64,
    pub share: f64,
}

/// Rows of one shard, tokenized.
struct TokenizedShard {
    rows: Vec<Vec<u32>>,
}

/// Reads the shard's rows in order, then tokenizes them on every core (in order).
fn tokenize_shard(task: &dyn Task, path: &Path, tokenizer: &Tokenizer) -> Result<TokenizedShard> {
    let mut texts = Vec::new();
    for item in task.items(path)? {
        let item = item?;
        let text = item.reference.ok_or_else(|| item.source.error(format!("the {} task gives this row no reference text", task.name())))?;
        texts.push(text);
    }
    let rows = map_in_order(&texts, |text| tokenizer.encode(text)).into_iter().collect::<Result<_>>()?;
    Ok(TokenizedShard { rows })
}

/// The packed blocks of the mixture `preset` at `token_budget` over `<root>/train/<op>/`, rows
/// read by `task`: each block one sample, or with `neat` the block's documents
/// ([`pack_ffd_documents`]: no attention across them).
#[allow(clippy::too_many_arguments)]
pub fn pretrain_samples(
    task: &dyn Task,
    root: &Path,
    preset: &Preset,
    token_budget: f64,
    tokenizer: &Tokenizer,
    cutoff: usize,
    seed: u64,
    neat: bool,
) -> Result<(Vec<Vec<Sample>>, MixtureReport)> {
    let mut shards: BTreeMap<u32, Vec<Shard>> = BTreeMap::new();
    let mut tokenized: BTreeMap<PathBuf, TokenizedShard> = BTreeMap::new();
    let mut listed = Vec::with_capacity(preset.ops.len());
    for &op in &preset.ops {
        let dir = root.join("train").join(op.to_string());
        let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
        let mut list = Vec::new();
        for entry in entries {
            let path = entry.map_err(|e| Error::io(&dir, e))?.path();
            if path.extension().is_some_and(|x| x == "jsonl") {
                list.push(Shard { label_tokens: shard_label(&path), tokens: 0.0, rows: 0, path });
            }
        }
        sort_shards(&mut list);
        listed.push((op, list));
    }
    let stage = crate::progress::stage("tokenizing shards", listed.iter().map(|(_, l)| l.len() as u64).sum(), "shards");
    for (op, mut list) in listed {
        // Shards are sized by their label; unlabelled shards (kiln's own) by their real tokens.
        for shard in &mut list {
            let t = tokenize_shard(task, &shard.path, tokenizer)?;
            shard.tokens = t.rows.iter().map(|r| r.len() as f64).sum();
            shard.rows = t.rows.len();
            tokenized.insert(shard.path.clone(), t);
            stage.set_position(tokenized.len() as u64);
        }
        shards.insert(op, list);
    }
    drop(stage);
    let takes = select(preset, token_budget, &shards)?;
    let mut rows: Vec<Vec<u32>> = Vec::new();
    for take in &takes {
        let shard = &tokenized[&take.path];
        if take.fraction >= 1.0 {
            rows.extend(shard.rows.iter().cloned());
        } else {
            let mut order: Vec<usize> = (0..shard.rows.len()).collect();
            order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
            let keep = (take.fraction * shard.rows.len() as f64).round() as usize;
            rows.extend(order[..keep].iter().map(|&i| shard.rows[i].clone()));
        }
    }
    let blocks: Vec<Vec<Sample>> = match neat {
        true => pack_ffd_documents(rows, cutoff, PACKING_GROUP).into_iter().map(|docs| docs.into_iter().map(Sample::all_targets).collect()).collect(),
        false => pack_ffd(rows, cutoff, PACKING_GROUP).into_iter().map(|block| vec![Sample::all_targets(block)]).collect(),
    };
    let report = report(preset, token_budget, &takes, blocks.len());
    Ok((blocks, report))
}

fn report(preset: &Preset, token_budget: f64, takes: &[Take], blocks: usize) -> MixtureReport {
    let shares = effective_shares(takes);
    let ops = preset
        .ops
        .iter()
        .zip(&preset.probs)
        .map(|(&op, &requested)| {
            let of_op: Vec<&Take> = takes.iter().filter(|t| t.op == op).collect();
            OpShare {
                op,
                requested,
                full_shards: of_op.iter().filter(|t| t.fraction >= 1.0).count(),
                partial_fraction: of_op.iter().find(|t| t.fraction < 1.0).map_or(0.0, |t| t.fraction),
                tokens: of_op.iter().map(|t| t.tokens).sum(),
                share: shares.iter().find(|(o, _)| *o == op).map_or(0.0, |(_, s)| *s),
            }
        })
        .collect();
    MixtureReport {
        preset: preset.name.clone(),
        token_budget,
        ops,
        total_tokens: takes.iter().map(|t| t.tokens).sum(),
        blocks,
    }
}
