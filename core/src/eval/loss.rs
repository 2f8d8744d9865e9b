//! Teacher-forced loss of evaluation texts (`eval_loss_per_op` of `eval_checkpoints.py`): for
//! every text (for Interplay, `compose_text(row)` without `[EOS]`), the mean negative
//! log-likelihood of its tokens after the first, each predicted from the tokens before it.
//!
//! That is exactly the reference's `per_op_avg_loss`. Its `avg_loss` is different: the
//! reference pads every text to 2048 tokens and, because the labels keep the pad ids, averages
//! the loss over the padding positions too. kiln does not reproduce that artifact; its
//! `avg_loss` is the mean of the per-row losses.

use burn::tensor::backend::Backend;

use crate::error::Result;
use crate::model::Qwen2;
use crate::model::logprobs::sequence_logprobs;
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
