//! Held-out evaluation during pre-training and SFT (`[eval]`): the mean next-token loss on the
//! reference text of the task's held-out rows, and greedy accuracy (the task's verdict) on the
//! rows of chosen ops.

use std::path::PathBuf;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use serde_json::json;

use super::config::EvalSection;
use super::objective::evaluate_loss;
use super::trainer::Record;
use crate::data::Sample;
use crate::error::{Error, Result};
use crate::generate::{Engine, Sampler, SamplingParams, StopCriteria};
use crate::model::Qwen2;
use crate::tasks::{GroupScores, Item, Task};
use crate::tokenizer::Tokenizer;

/// Held-out loss and greedy answer accuracy during pre-training and SFT, on rows of the run's
/// task (`[eval]`).
pub struct HeldOut {
    task: Arc<dyn Task>,
    heldout: Vec<Sample>,
    prompts: Vec<(Vec<u32>, Item)>,
    tokenizer: Tokenizer,
    pad_id: u32,
    max_new_tokens: usize,
}

impl HeldOut {
    /// The rows of `eval.rows` (a file or a directory of `*.jsonl`): every row's reference text
    /// (cut to `cutoff` tokens) for the loss, and the first `eval.rows_per_op` (20) rows of
    /// each op of `eval.ops` for greedy accuracy.
    pub fn load(task: Arc<dyn Task>, eval: &EvalSection, cutoff: usize, tokenizer: &Tokenizer, pad_id: u32) -> Result<Self> {
        let mut evaluator = Self {
            task,
            heldout: Vec::new(),
            prompts: Vec::new(),
            tokenizer: tokenizer.clone(),
            pad_id,
            max_new_tokens: eval.max_new_tokens.unwrap_or(320),
        };
        let Some(path) = &eval.rows else { return Ok(evaluator) };
        let files: Vec<PathBuf> = if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| Error::io(path, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
                .collect();
            files.sort();
            files
        } else {
            vec![path.clone()]
        };
        let per_level = eval.rows_per_op.unwrap_or(20);
        for file in files {
            for item in evaluator.task.items(&file)? {
                let item = item?;
                if let Some(reference) = &item.reference {
                    let mut ids = tokenizer.encode(reference)?;
                    ids.truncate(cutoff);
                    evaluator.heldout.push(Sample::all_targets(ids));
                }
                let level = item.level.and_then(|l| u32::try_from(l).ok());
                let taken = evaluator.prompts.iter().filter(|(_, i)| i.level == item.level).count();
                if level.is_some_and(|l| eval.ops.contains(&l)) && taken < per_level {
                    evaluator.prompts.push((tokenizer.encode(&item.prompt)?, item));
                }
            }
        }
        Ok(evaluator)
    }

    /// Adds rows to the `eval_loss` (the rows an SFT run holds out of its data).
    pub fn add_loss_samples(&mut self, samples: Vec<Sample>) {
        self.heldout.extend(samples);
    }

    /// `eval_loss`, `eval_accuracy` and `eval_accuracy_<group>` of `model`.
    pub fn evaluate<B: Backend>(&mut self, model: &Qwen2<B>) -> Result<Record> {
        let mut record = Record::new();
        if !self.heldout.is_empty() {
            record.insert("eval_loss".into(), json!(evaluate_loss(model, &self.heldout, 16, self.pad_id)?));
        }
        if !self.prompts.is_empty() {
            let params = SamplingParams {
                sampler: Sampler::greedy(),
                max_new_tokens: self.max_new_tokens,
                stop: StopCriteria { token_ids: self.tokenizer.eos_id().into_iter().collect(), strings: self.task.stop_strings() },
                ignore_eos: true, // the training texts' EOS (above), not the config's
                ..Default::default()
            };
            let prompts: Vec<Vec<u32>> = self.prompts.iter().map(|(ids, _)| ids.clone()).collect();
            let outputs = Engine::new(model, Some(&self.tokenizer)).generate(&prompts, &params, |_| {})?;
            let batch: Vec<(&str, &Item)> = self.prompts.iter().zip(&outputs).map(|((_, item), samples)| (samples[0].text.as_str(), item)).collect();
            let mut scores = GroupScores::new(None);
            for ((_, item), verdict) in batch.iter().zip(self.task.evaluate_batch(&batch)?) {
                scores.add(item, verdict);
            }
            record.insert("eval_accuracy".into(), json!(scores.all.value().unwrap_or(0.0)));
            for (name, value) in scores.per_group("eval_accuracy") {
                record.insert(name, json!(value));
            }
        }
        Ok(record)
    }
}
