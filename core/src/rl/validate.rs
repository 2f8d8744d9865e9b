//! Validation during RL (verl's `_validate` in the seed): greedy decoding of per-op validation
//! files, scored with the outcome reward (exact string match), reported per op and as ID
//! (op ≤ `id_max_op`) and OOD accuracy.

use std::collections::BTreeMap;
use std::path::Path;

use burn::tensor::backend::Backend;
use serde_json::json;

use super::prompts::{Prompt, PromptSet};
use super::reward::{OutcomeReward, Reward};
use super::rollout::{RolloutSettings, rollout};
use crate::error::Result;
use crate::generate::Sampler;
use crate::model::Qwen2;
use crate::io::jsonl_files;
use crate::tokenizer::Tokenizer;
use crate::train::trainer::Record;

/// What to validate on and how.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValidationSettings {
    /// Ops up to this are in-distribution.
    pub id_max_op: u32,
    /// Rows read per file (all if `None`).
    pub rows_per_op: Option<usize>,
    /// Longer prompts are dropped (verl filters validation prompts as training ones).
    pub max_prompt_length: usize,
    pub max_new_tokens: usize,
    /// Sequences decoded together.
    pub batch_size: usize,
}

/// Greedy validation on a directory of per-op files.
pub struct Validator {
    prompts: PromptSet,
    tokenizer: Tokenizer,
    eos_ids: Vec<u32>,
    id_max_op: u32,
    rollout: RolloutSettings,
}

impl Validator {
    /// The rows of every `*.jsonl` of `dir`; `eos_ids` stop generation.
    pub fn load(dir: &Path, tokenizer: &Tokenizer, eos_ids: Vec<u32>, settings: &ValidationSettings) -> Result<Self> {
        let prompts = PromptSet::load(&jsonl_files(dir)?, tokenizer, settings.max_prompt_length, settings.rows_per_op)?;
        let rollout = RolloutSettings { n: 1, sampler: Sampler::greedy(), max_response_length: settings.max_new_tokens, batch_size: settings.batch_size };
        Ok(Self { prompts, tokenizer: tokenizer.clone(), eos_ids, id_max_op: settings.id_max_op, rollout })
    }

    /// `val_accuracy_id`, `val_accuracy_ood`, `val_accuracy_op<N>` and the mean response length.
    pub fn evaluate<B: Backend>(&self, model: &Qwen2<B>) -> Result<Record> {
        let prompts: Vec<&Prompt> = self.prompts.iter().collect();
        let responses = rollout(model, &self.tokenizer, &self.eos_ids, &prompts, &self.rollout, 0)?;
        let mut per_op: BTreeMap<u32, (f64, usize)> = BTreeMap::new();
        let (mut id, mut ood) = ((0.0, 0usize), (0.0, 0usize));
        for response in &responses {
            let task = &prompts[response.group].task;
            let score = OutcomeReward.score(&response.text, task);
            let op = task.op.unwrap_or(0);
            let entry = per_op.entry(op).or_default();
            *entry = (entry.0 + score, entry.1 + 1);
            let side = if op <= self.id_max_op { &mut id } else { &mut ood };
            *side = (side.0 + score, side.1 + 1);
        }
        let mut record = Record::new();
        for (name, (sum, count)) in [("val_accuracy_id", id), ("val_accuracy_ood", ood)] {
            if count > 0 {
                record.insert(name.into(), json!(sum / count as f64));
            }
        }
        for (op, (sum, count)) in per_op {
            record.insert(format!("val_accuracy_op{op}"), json!(sum / count as f64));
        }
        let length: usize = responses.iter().map(|r| r.tokens.len()).sum();
        record.insert("val_response_length".into(), json!(length as f64 / responses.len().max(1) as f64));
        Ok(record)
    }
}
