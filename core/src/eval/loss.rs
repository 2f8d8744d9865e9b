//! Teacher-forced loss of evaluation texts (`eval_loss_per_op` of `eval_checkpoints.py`): for
//! every text (for Interplay, `compose_text(row)` without `[EOS]`), the mean negative
//! log-likelihood of its tokens after the first, each predicted from the tokens before it.
//!
//! That is exactly the reference's `per_op_avg_loss`. Its `avg_loss` is different: the
//! reference pads every text to 2048 tokens and, because the labels keep the pad ids, averages
//! the loss over the padding positions too. kiln does not reproduce that artifact; its
//! `avg_loss` is the mean of the per-row losses.

use burn::tensor::backend::Backend;

use super::runner::EvalSettings;
use super::shards::{ShardKind, ShardStore};
use crate::error::{Error, Result};
use crate::io::pyjson::{Json, Style};
use crate::io::{AtomicFile, jsonl_records};
use crate::model::Qwen2;
use crate::model::logprobs::sequence_logprobs;
use crate::tasks::Evaluation;
use crate::tokenizer::Tokenizer;

/// The mean token loss of each of `texts`, in order. Texts are cut to the model's context; they
/// are scored `batch` at a time, shortest first, to keep padding low.
pub fn text_losses<B: Backend>(model: &Qwen2<B>, tokenizer: &Tokenizer, texts: &[&str], batch: usize) -> Result<Vec<f64>> {
    let context = model.context_len();
    let mut sequences = Vec::with_capacity(texts.len());
    for text in texts {
        let mut ids = tokenizer.encode(text)?;
        ids.truncate(context);
        sequences.push(ids);
    }
    let mut order: Vec<usize> = (0..texts.len()).collect();
    order.sort_by_key(|&i| sequences[i].len());
    let mut losses = vec![0.0; texts.len()];
    for chunk in order.chunks(batch.max(1)) {
        let batch: Vec<Vec<u32>> = chunk.iter().map(|&i| sequences[i].clone()).collect();
        for (&i, logprobs) in chunk.iter().zip(sequence_logprobs(model, &batch, 256)?) {
            let scored: Vec<f64> = logprobs.into_iter().flatten().map(|lp| -f64::from(lp)).collect();
            // The reference divides by the number of scored tokens, at least 1.
            losses[i] = scored.iter().sum::<f64>() / scored.len().max(1) as f64;
        }
    }
    Ok(losses)
}

/// The teacher-forced loss of every item of every part, computed shard by shard and kept in
/// loss shards (an item without a loss text scores an empty text: 0).
pub(super) fn losses<B: Backend>(
    model: &Qwen2<B>,
    tokenizer: &Tokenizer,
    evaluation: &dyn Evaluation,
    store: &ShardStore,
    settings: &EvalSettings,
) -> Result<Vec<Vec<f64>>> {
    let mut all = Vec::new();
    let total = evaluation.parts().iter().map(|part| part.items.len() as u64).sum();
    let stage = crate::progress::stage("teacher-forced loss", total, "items");
    let mut done = 0;
    for (p, part) in evaluation.parts().iter().enumerate() {
        let mut part_losses = Vec::with_capacity(part.items.len());
        for index in 0..part.items.len().div_ceil(settings.shard_prompts) {
            let start = index * settings.shard_prompts;
            let end = (start + settings.shard_prompts).min(part.items.len());
            let path = store.path(ShardKind::Loss, part.name, index);
            if !path.is_file() {
                let texts: Vec<&str> = (start..end).map(|i| evaluation.loss_text(p, i).unwrap_or("")).collect();
                let losses = text_losses(model, tokenizer, &texts, settings.loss_batch_size)?;
                let mut file = AtomicFile::create(&path)?;
                for (i, loss) in (start..end).zip(losses) {
                    let line = Json::object([("__idx", Json::from(i)), ("loss", Json::Float(loss))]);
                    file.write_line(&line.dumps(Style::COMPACT))?;
                }
                file.commit()?;
            }
            for record in jsonl_records(&path)? {
                let record = record?;
                let loss = record
                    .fields
                    .get("loss")
                    .and_then(serde_json::Value::as_f64)
                    .ok_or_else(|| Error::data(&path, Some(record.line), "missing \"loss\""))?;
                part_losses.push(loss);
            }
            done += (end - start) as u64;
            stage.set_position(done);
        }
        all.push(part_losses);
    }
    Ok(all)
}
