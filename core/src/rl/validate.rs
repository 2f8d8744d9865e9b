//! Validation during RL (verl's `_validate` in the seed): greedy decoding of a task's
//! validation files, scored with the task's outcome reward (for Interplay, exact string match),
//! reported per group (`val_accuracy_op<N>`) and as ID (level ≤ `id_max_op`) and OOD accuracy.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::tensor::backend::Backend;
use serde_json::json;

use super::prompts::{Prompt, PromptSet};
use super::rollout::{RolloutSettings, rollout};
use crate::error::Result;
use crate::generate::Sampler;
use crate::io::jsonl_files;
use crate::model::Qwen2;
use crate::tasks::{GroupScores, Reward, RewardConfig, Task, TaskConfig};
use crate::tokenizer::Tokenizer;
use crate::train::metrics;
use crate::train::trainer::Record;

/// What to validate on and how.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValidationSettings {
    /// Levels (Interplay: ops) up to this are in-distribution; `None`: the task's own split
    /// ([`Task::id_max_level`]).
    pub id_max_level: Option<i64>,
    /// Rows read per file (all if `None`).
    pub rows_per_op: Option<usize>,
    /// Longer prompts are dropped (verl filters validation prompts as training ones).
    pub max_prompt_length: usize,
    pub max_new_tokens: usize,
    /// Sequences decoded together.
    pub batch_size: usize,
    /// Bytes the KV cache may take (the rollout's, `[rollout] kv_memory`).
    pub kv_memory: Option<u64>,
    /// Tokens one prefill pass takes at most (the rollout's, `[rollout] max_prefill_tokens`).
    pub max_prefill_tokens: usize,
}

/// Greedy validation on a directory of per-op files.
pub struct Validator {
    prompts: PromptSet,
    reward: Box<dyn Reward>,
    tokenizer: Tokenizer,
    eos_ids: Vec<u32>,
    id_max_level: Option<i64>,
    rollout: RolloutSettings,
}

impl Validator {
    /// The rows of every `*.jsonl` of `dir`, read as the default task (Interplay) reads them;
    /// `eos_ids` stop generation. See [`Validator::from_task`].
    pub fn load(dir: &Path, tokenizer: &Tokenizer, eos_ids: Vec<u32>, settings: &ValidationSettings) -> Result<Self> {
        Self::from_task(TaskConfig::default().build()?, dir, tokenizer, eos_ids, settings)
    }

    /// The items `task` makes of every `*.jsonl` of `dir`; `eos_ids` stop generation.
    pub fn from_task(task: Arc<dyn Task>, dir: &Path, tokenizer: &Tokenizer, eos_ids: Vec<u32>, settings: &ValidationSettings) -> Result<Self> {
        Self::from_files(task, &jsonl_files(dir)?, tokenizer, eos_ids, settings)
    }

    /// The items `task` makes of `files`; `eos_ids` stop generation.
    pub fn from_files(task: Arc<dyn Task>, files: &[PathBuf], tokenizer: &Tokenizer, eos_ids: Vec<u32>, settings: &ValidationSettings) -> Result<Self> {
        let prompts = PromptSet::from_task(task.as_ref(), files, tokenizer, settings.max_prompt_length, settings.rows_per_op)?;
        let reward = task.reward(&RewardConfig::Outcome)?;
        let rollout = RolloutSettings {
            n: 1,
            sampler: Sampler::greedy(),
            max_response_length: settings.max_new_tokens,
            batch_size: settings.batch_size,
            kv_memory: settings.kv_memory,
            max_prefill_tokens: settings.max_prefill_tokens,
            dtype: None,
        };
        let id_max_level = settings.id_max_level.or_else(|| task.id_max_level());
        Ok(Self { prompts, reward, tokenizer: tokenizer.clone(), eos_ids, id_max_level, rollout })
    }

    /// `val_accuracy_id`, `val_accuracy_ood`, `val_accuracy_<group>` and the mean response length.
    pub fn evaluate<B: Backend>(&self, model: &Qwen2<B>) -> Result<Record> {
        let prompts: Vec<&Prompt> = self.prompts.iter().collect();
        let stage = crate::progress::stage("validation", prompts.len() as u64, "completions");
        let (responses, _) = rollout(model, &self.tokenizer, &self.eos_ids, &prompts, &self.rollout, 0, |p| stage.set_position(p.finished as u64))?;
        drop(stage);
        let batch: Vec<_> = responses.iter().map(|r| (r.text.as_str(), &prompts[r.group].item)).collect();
        let mut scores = GroupScores::new(self.id_max_level);
        for ((_, item), score) in batch.iter().zip(self.reward.score_batch(&batch)?) {
            scores.add(item, score);
        }
        let mut record = Record::new();
        for (metric, mean) in [(metrics::VAL_ACCURACY_ID, scores.id), (metrics::VAL_ACCURACY_OOD, scores.ood)] {
            if let Some(value) = mean.value() {
                metric.set(&mut record, value);
            }
        }
        for (name, value) in scores.per_group("val_accuracy") {
            record.insert(name, json!(value));
        }
        let length: usize = responses.iter().map(|r| r.tokens.len()).sum();
        record.insert("val_response_length".into(), json!(length as f64 / responses.len().max(1) as f64));
        Ok(record)
    }
}
