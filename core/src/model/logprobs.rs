//! Per-token log-probabilities of given sequences (teacher scoring, RL old/ref log-probs, NLL).

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Int, Tensor, backend::Backend};

use super::head_loss;
use super::inputs::HostBatch;
use super::qwen2::Qwen2;
use crate::error::{Error, Result};

/// `log p(targets[b, t])` under `logits[b, t, :]`, computed in f32: `[B, T, V]` → `[B, T]`.
pub fn token_logprobs<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 2> {
    if super::fused::available::<B>() && logits.dtype() == burn::tensor::DType::F32 {
        let host: Vec<u32> = targets.clone().into_data().convert::<i64>().iter::<i64>().map(|t| t as u32).collect();
        if let Some(out) = super::fused::token_logprobs(logits.clone(), &host) {
            return out;
        }
    }
    log_softmax(logits.cast(DType::F32), 2).gather(2, targets.unsqueeze_dim(2)).squeeze_dim(2)
}

/// Whether `model` on backend `B` scores hidden states of `dtype` through the LM head and
/// the fused CPU kernel on whole `[B, T, V]` logits (Flex in f32, where memory is the host's and
/// that kernel is faster) rather than [`head_loss`]'s chunks.
fn whole_logits<B: Backend>(model: &Qwen2<B>, dtype: DType) -> bool {
    (super::fused::available::<B>() && dtype == DType::F32) || model.head(dtype).1.is_some()
}

/// `log p(targets[b, t])` `[B, T]` (f32) for final hidden states `[B, T, D]`, with gradients
/// (training): the LM head, log-softmax and gather fused and chunked over tokens
/// ([`head_loss`]), so no `[B, T, V]` logits exist; on Flex in f32, [`token_logprobs`] of the
/// logits.
pub fn target_logprobs<B: AutodiffBackend>(model: &Qwen2<B>, hidden: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 2> {
    if whole_logits(model, hidden.dtype()) {
        return token_logprobs(model.logits(hidden), targets);
    }
    let [batch, seq, _] = hidden.dims();
    let (weight, _) = model.head(hidden.dtype());
    let rows = head_loss::chunk_rows::<B>(&hidden.device(), batch * seq, model.config().vocab_size);
    head_loss::head_logprobs(hidden.flatten(0, 1), weight, targets.flatten(0, 1), rows).reshape([batch, seq])
}

/// `log p(targets[b, t])` `[B, T]` (f32) for final hidden states `[B, T, D]` without gradients
/// (evaluation, RL's old, reference and teacher log-probs), and with `entropy` each position's
/// entropy `[B, T]`; chunked as [`target_logprobs`].
pub fn target_scores<B: Backend>(model: &Qwen2<B>, hidden: Tensor<B, 3>, targets: Tensor<B, 2, Int>, entropy: bool) -> (Tensor<B, 2>, Option<Tensor<B, 2>>) {
    let [batch, seq, _] = hidden.dims();
    if whole_logits(model, hidden.dtype()) {
        let logits = model.logits(hidden);
        let entropy = entropy.then(|| self::entropy(logits.clone()));
        return (token_logprobs(logits, targets), entropy);
    }
    let (weight, _) = model.head(hidden.dtype());
    let rows = head_loss::chunk_rows::<B>(&hidden.device(), batch * seq, model.config().vocab_size);
    let out = head_loss::scores(hidden.flatten(0, 1), weight, targets.flatten(0, 1), rows, entropy);
    (out.logprobs.reshape([batch, seq]), out.entropy.map(|e| e.reshape([batch, seq])))
}

/// Per-position entropy of the softmax of `logits` `[B, T, V]`, in f32 (f64 logits in f64).
pub fn entropy<B: Backend>(logits: Tensor<B, 3>) -> Tensor<B, 2> {
    let logits = match logits.dtype() {
        DType::F16 | DType::BF16 => logits.cast(DType::F32),
        _ => logits,
    };
    let log_p = log_softmax(logits, 2);
    -(log_p.clone().exp() * log_p).sum_dim(2).squeeze_dim(2)
}

/// For each sequence, `[None, log p(ids[1] | ids[..1]), …, log p(ids[n-1] | ids[..n-1])]`.
/// The LM head runs over `chunk` positions at a time, so `[B, T, V]` logits never exist at once.
/// A sequence that is empty, longer than the model's context or holds an id outside its
/// vocabulary is an error naming the sequence.
pub fn sequence_logprobs<B: Backend>(model: &Qwen2<B>, sequences: &[Vec<u32>], chunk: usize) -> Result<Vec<Vec<Option<f32>>>> {
    check_sequences(model, sequences)?;
    let device = model.device();
    let batch = HostBatch::right_padded(sequences, 0)?;
    let hidden = model.forward_hidden(&batch.to_device::<B>(&device), None);
    let (rows, seq) = (batch.batch, batch.seq);
    // Targets: the next token at every position (the last position's target is unused).
    let next: Vec<u32> = batch.ids.chunks(seq).flat_map(|r| r[1..].iter().copied().chain([0])).collect();
    let targets = HostBatch { batch: rows, seq, ids: next, valid: batch.valid.clone() }.to_device::<B>(&device).ids;
    let mut columns = Vec::new();
    for start in (0..seq).step_by(chunk.max(1)) {
        let len = chunk.max(1).min(seq - start);
        let logits = model.logits(hidden.clone().narrow(1, start, len));
        columns.push(token_logprobs(logits, targets.clone().narrow(1, start, len)));
    }
    let values: Vec<f32> = Tensor::cat(columns, 1).into_data().convert::<f32>().into_vec().expect("f32");
    Ok(sequences
        .iter()
        .enumerate()
        .map(|(r, ids)| std::iter::once(None).chain((1..ids.len()).map(|t| Some(values[r * seq + t - 1]))).collect())
        .collect())
}

/// Every sequence fits the model: non-empty, at most its context long, ids below `vocab_size`.
pub fn check_sequences<B: Backend>(model: &Qwen2<B>, sequences: &[Vec<u32>]) -> Result<()> {
    let (context, vocab) = (model.context_len(), model.config().vocab_size);
    for (i, ids) in sequences.iter().enumerate() {
        if ids.is_empty() {
            return Err(Error::InvalidInput(format!("sequence {i} is empty")));
        }
        if ids.len() > context {
            return Err(Error::InvalidInput(format!("sequence {i} has {} tokens; the model's context is {context}", ids.len())));
        }
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::InvalidInput(format!("sequence {i} has token id {bad} >= vocab_size {vocab}")));
        }
    }
    Ok(())
}
