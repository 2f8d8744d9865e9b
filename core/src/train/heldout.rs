//! Held-out evaluation during pre-training and SFT (`[eval]`): the mean next-token loss on the
//! reference text of the task's held-out rows, and greedy accuracy (the task's verdict) on the
//! rows of chosen ops.

use std::path::PathBuf;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use serde_json::json;

use super::metrics;
use super::config::NextTokenEval;
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
    /// (cut to `cutoff` tokens) for the loss, and the first `eval.rows_per_op` rows of each op
    /// of `eval.ops` for greedy accuracy.
    pub fn load(task: Arc<dyn Task>, eval: &NextTokenEval, cutoff: usize, tokenizer: &Tokenizer, pad_id: u32) -> Result<Self> {
        let mut evaluator = Self {
            task,
            heldout: Vec::new(),
            prompts: Vec::new(),
            tokenizer: tokenizer.clone(),
            pad_id,
            max_new_tokens: eval.max_new_tokens,
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
        let per_level = eval.rows_per_op;
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
            metrics::EVAL_LOSS.set(&mut record, evaluate_loss(model, &self.heldout, 16, self.pad_id)?);
        }
        if !self.prompts.is_empty() {
            let params = SamplingParams {
                sampler: Sampler::greedy(),
                max_new_tokens: self.max_new_tokens,
                stop: StopCriteria { token_ids: self.tokenizer.eos_id().into_iter().collect(), strings: self.task.stop_strings(), ..StopCriteria::default() },
                ignore_eos: true, // the training texts' EOS (above), not the config's
                ..Default::default()
            };
            let prompts: Vec<Vec<u32>> = self.prompts.iter().map(|(ids, _)| ids.clone()).collect();
            let stage = crate::progress::stage("held-out generation", prompts.len() as u64, "completions");
            let outputs = Engine::new(model, Some(&self.tokenizer)).generate(&prompts, &params, |p| stage.set_position(p.finished as u64))?;
            drop(stage);
            let batch: Vec<(&str, &Item)> = self.prompts.iter().zip(&outputs).map(|((_, item), samples)| (samples[0].text.as_str(), item)).collect();
            let mut scores = GroupScores::new(None);
            for ((_, item), verdict) in batch.iter().zip(self.task.evaluate_batch(&batch)?) {
                scores.add(item, verdict);
            }
            metrics::EVAL_ACCURACY.set(&mut record, scores.all.value().unwrap_or(0.0));
            for (name, value) in scores.per_group(metrics::EVAL_ACCURACY.key()) {
                record.insert(name, json!(value));
            }
        }
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;
    use crate::model::hf;
    use crate::tasks::TaskConfig;

    /// `eval_loss` of held-out SFT rows is Hugging Face's completion-only NLL: prompt labels
    /// -100, token-weighted over all rows (`tests/fixtures/code/study/make_heldout_nll.py`,
    /// transformers on the reference model `hf/tied_gqa2`), rows of different lengths batched.
    #[test]
    fn eval_loss_is_the_completion_only_nll_of_transformers() {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        let expected: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixtures.join("code/study/heldout_nll.json")).unwrap()).unwrap();
        let samples: Vec<Sample> = expected["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                let ids: Vec<u32> = row["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
                let prompt = row["prompt_len"].as_u64().unwrap() as usize;
                Sample { targets: (0..ids.len()).map(|i| i >= prompt).collect(), ids }
            })
            .collect();
        assert_eq!(samples.iter().map(Sample::num_targets).sum::<usize>() as u64, expected["targets"].as_u64().unwrap());
        let model = hf::load::<Flex>(&fixtures.join("hf/tied_gqa2"), &Default::default()).unwrap();
        let tokenizer = Tokenizer::train_byte_level_bpe((0..50).map(|i| format!("row {i}")), 280, &["<|endoftext|>"]).unwrap();
        let task = TaskConfig::default().build().unwrap();
        let eval = NextTokenEval { every: None, steps: Vec::new(), rows: None, ops: Vec::new(), rows_per_op: 20, max_new_tokens: 320 };
        let mut held_out = HeldOut::load(task, &eval, 64, &tokenizer, 0).unwrap();
        held_out.add_loss_samples(samples);
        let record = held_out.evaluate(&model).unwrap();
        let (ours, theirs) = (record["eval_loss"].as_f64().unwrap(), expected["eval_loss"].as_f64().unwrap());
        assert!((ours - theirs).abs() < 1e-5, "eval_loss {ours} vs transformers {theirs}");
        // Not the mean of per-row means (which differs here by 0.08).
        assert!((ours - expected["mean_of_row_means"].as_f64().unwrap()).abs() > 0.01);
    }
}
