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
    (super::kernels::kernels::<B>().token_logprobs)(logits, targets)
}

/// Whether `model` on backend `B` scores hidden states of `dtype` through the LM head and
/// the fused CPU kernel on whole `[B, T, V]` logits (Flex in f32, where memory is the host's and
/// that kernel is faster) rather than [`head_loss`]'s chunks.
fn whole_logits<B: Backend>(model: &Qwen2<B>, dtype: DType) -> bool {
    (super::kernels::kernels::<B>().host_memory && dtype == DType::F32) || model.head_has_bias()
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

/// Per-position reverse KL `Σ_v p_S(v) (log p_S(v) − log p_T(v))` `[B, T]` (f32) of `model` on
/// final hidden states `[B, T, D]` against `teacher` on its own `[B, T, D_T]` (over the vocabulary
/// both share), with gradients for the student, chunked as [`target_logprobs`]; `None` where
/// whole logits are used instead (Flex in f32, a head with a bias).
pub fn target_reverse_kl<B: AutodiffBackend>(
    model: &Qwen2<B>,
    hidden: Tensor<B, 3>,
    teacher: &Qwen2<B::InnerBackend>,
    teacher_hidden: Tensor<B::InnerBackend, 3>,
) -> Option<Tensor<B, 2>> {
    if whole_logits(model, hidden.dtype()) || whole_logits(teacher, teacher_hidden.dtype()) {
        return None;
    }
    let [batch, seq, _] = hidden.dims();
    let vocab = model.config().vocab_size.min(teacher.config().vocab_size);
    let weight = model.head(hidden.dtype()).0.narrow(1, 0, vocab);
    let teacher_weight = teacher.head(teacher_hidden.dtype()).0.narrow(1, 0, vocab);
    let rows = head_loss::chunk_rows::<B>(&hidden.device(), batch * seq, vocab);
    let kl = head_loss::head_reverse_kl(hidden.flatten(0, 1), weight, teacher_hidden.flatten(0, 1), teacher_weight, rows);
    Some(kl.reshape([batch, seq]))
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
    let targets = HostBatch { batch: rows, seq, ids: next, valid: batch.valid.clone(), documents: None }.to_device::<B>(&device).ids;
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

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::module::AutodiffModule;
    use burn::tensor::{ElementConversion, Int, Tensor, TensorData};

    use super::{target_logprobs, target_reverse_kl, token_logprobs};
    use crate::model::{Dtype, HostBatch, Qwen2, Qwen2Config};

    type B = Autodiff<Flex>;

    fn model(vocab: usize, hidden: usize, seed: u64) -> Qwen2<B> {
        let config: Qwen2Config = serde_json::from_str(&format!(
            r#"{{"vocab_size": {vocab}, "hidden_size": {hidden}, "intermediate_size": 32, "num_hidden_layers": 1,
                "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64, "tie_word_embeddings": {}}}"#,
            seed % 2 == 0
        ))
        .unwrap();
        let mut model = Qwen2::random(&config, seed, &Default::default()).unwrap().with_compute_dtype(Dtype::BF16);
        // bf16 activations even where the CPU has bf16 products (which keep them in f32).
        model.set_products(None);
        model
    }

    fn max_diff(a: Tensor<B, 2>, b: Tensor<B, 2>) -> f32 {
        (a - b).abs().max().into_scalar().elem::<f32>()
    }

    /// In bf16 (so the chunked head, not the CPU's whole-logit kernel): the model-level log-probs
    /// and the reverse KL to a teacher with a larger (padded) vocabulary and another width equal
    /// those computed from whole logits.
    #[test]
    fn chunked_log_probs_and_reverse_kl_match_whole_logits_through_the_model() {
        let (student, teacher) = (model(61, 16, 2), model(64, 24, 3));
        let device = Default::default();
        let batch = HostBatch::right_padded(&[vec![5, 9, 3, 7, 1], vec![2, 8]], 0).unwrap().to_device::<B>(&device);
        let targets = Tensor::<B, 2, Int>::from_data(TensorData::new(vec![9i64, 3, 7, 1, 0, 8, 0, 0, 0, 0], [2, 5]), &device);
        let hidden = student.forward_hidden(&batch, None);
        let teacher = teacher.valid();
        let teacher_hidden = teacher.forward_hidden(&HostBatch::right_padded(&[vec![5, 9, 3, 7, 1], vec![2, 8]], 0).unwrap().to_device(&device), None);
        let chunked = target_logprobs(&student, hidden.clone(), targets.clone());
        let whole = token_logprobs(student.logits(hidden.clone()), targets);
        assert!(max_diff(chunked, whole) < 1e-4);
        let kl = target_reverse_kl(&student, hidden.clone(), &teacher, teacher_hidden.clone()).expect("chunked in bf16");
        let reference = crate::rl::loss::reverse_kl(student.logits(hidden), Tensor::from_inner(teacher.logits(teacher_hidden)));
        assert!(max_diff(kl, reference) < 1e-4);
    }
}
