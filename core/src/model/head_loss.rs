//! The LM head fused with log-softmax and the target gather, chunked over tokens so that no
//! `[B, T, V]` logits exist, forward or backward (Liger's fused linear cross-entropy).
//!
//! `N` tokens, `D` hidden size, `V` vocabulary, `c` rows per chunk. For each chunk the forward
//! pass computes logits `[c, V]` (in the activations' dtype, as the unfused head), their
//! log-sum-exp in f32 and the target's log-probability, and keeps only the log-sum-exp `[N]`.
//! The backward pass recomputes each chunk's logits and turns `g · (onehot − softmax)` into the
//! gradients of the hidden states and of the head's weight, so the extra cost is one more
//! `[N, D] × [D, V]` product, and the memory `O(c·V + D·V)` instead of several `[N, V]` tensors.
//!
//! Under autodiff this is one custom operation of burn-autodiff (`Backward`) on the inner
//! backend, so it runs on every backend (Flex, wgpu, CUDA); without gradients the same chunked
//! loop runs directly, and also gives the entropies RL logs.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, IndexingUpdateOp, Int, Tensor};

use super::custom_op::{self, Inner};

/// The largest chunk of f32 logits, in bytes (fewer where the device's buffers are smaller).
const CHUNK_BYTES: u64 = 256 << 20;

/// Rows of `vocab` f32 logits per chunk for `rows` tokens on `device`; see [`rows_per_chunk`].
pub fn chunk_rows<B: Backend>(device: &B::Device, rows: usize, vocab: usize) -> usize {
    rows_per_chunk(rows, vocab, kiln_backends::device::max_buffer::<B>(device))
}

/// Rows of `vocab` f32 logits per chunk for `rows` tokens: as many as fit in [`CHUNK_BYTES`]
/// and half the device's largest buffer `max_buffer`, at least one.
pub fn rows_per_chunk(rows: usize, vocab: usize, max_buffer: Option<u64>) -> usize {
    let budget = max_buffer.map_or(CHUNK_BYTES, |max| CHUNK_BYTES.min(max / 2));
    let fit = (budget / (vocab.max(1) as u64 * 4)).max(1) as usize;
    // Multiples of 64 rows keep the products' tiles full.
    let fit = if fit > 64 { fit / 64 * 64 } else { fit };
    fit.min(rows.max(1))
}

/// Logits `[c, V]` of hidden states `[c, D]` under a head weight `[D, V]`, in f32.
fn chunk_logits<B: Backend>(hidden: Tensor<B, 2>, weight: Tensor<B, 2>) -> Tensor<B, 2> {
    hidden.matmul(weight).cast(DType::F32)
}

/// Log-sum-exp over the last axis of `[c, V]` f32 logits: `[c, 1]`.
fn log_sum_exp<B: Backend>(logits: Tensor<B, 2>) -> Tensor<B, 2> {
    let max = logits.clone().max_dim(1).detach();
    (logits - max.clone()).exp().sum_dim(1).log() + max
}

/// Per-token results of [`scores`]: `[N]` each.
pub struct Scores<B: Backend> {
    /// `log p(target)`.
    pub logprobs: Tensor<B, 1>,
    /// `log Σ exp(logits)` (kept for the backward pass).
    pub lse: Tensor<B, 1>,
    /// The entropy of each token's distribution, when asked for.
    pub entropy: Option<Tensor<B, 1>>,
}

/// Log-probabilities of `targets` `[N]` for hidden states `[N, D]` under the head `weight`
/// `[D, V]` (in the hidden states' dtype), `rows` tokens at a time; f32 results. Any backend;
/// records no gradient of its own (see [`head_logprobs`] for training).
pub fn scores<B: Backend>(hidden: Tensor<B, 2>, weight: Tensor<B, 2>, targets: Tensor<B, 1, Int>, rows: usize, entropy: bool) -> Scores<B> {
    let n = hidden.dims()[0];
    let (mut logprobs, mut lses, mut entropies) = (Vec::new(), Vec::new(), Vec::new());
    for (start, len) in chunks(n, rows) {
        let logits = chunk_logits(hidden.clone().narrow(0, start, len), weight.clone());
        let lse = log_sum_exp(logits.clone());
        let target = logits.clone().gather(1, targets.clone().narrow(0, start, len).unsqueeze_dim(1));
        logprobs.push((target - lse.clone()).squeeze_dim(1));
        if entropy {
            // H = lse − Σ p·logit, p = exp(logit − lse).
            let p = (logits.clone() - lse.clone()).exp();
            entropies.push((lse.clone() - (p * logits).sum_dim(1)).squeeze_dim(1));
        }
        lses.push(lse.squeeze_dim(1));
    }
    Scores {
        logprobs: Tensor::cat(logprobs, 0),
        lse: Tensor::cat(lses, 0),
        entropy: entropy.then(|| Tensor::cat(entropies, 0)),
    }
}

/// `(first token, tokens)` of each chunk of `rows` tokens among `n`.
fn chunks(n: usize, rows: usize) -> impl Iterator<Item = (usize, usize)> {
    let rows = rows.max(1);
    (0..n).step_by(rows).map(move |start| (start, rows.min(n - start)))
}

/// The gradients of hidden states `[N, D]` and head weight `[D, V]` from the gradient of each
/// chunk's f32 logits, `dlogits(first, tokens)` `[c, V]`; `None` where not `wanted`. The weight's
/// gradient is summed over chunks in f32 and returned in the weight's dtype.
fn head_gradients<B: Backend>(
    hidden: &Tensor<B, 2>,
    weight: &Tensor<B, 2>,
    rows: usize,
    wanted: [bool; 2],
    mut dlogits: impl FnMut(usize, usize) -> Tensor<B, 2>,
) -> [Option<Tensor<B, 2>>; 2] {
    let [n, d] = hidden.dims();
    let dtype = hidden.dtype();
    let mut dhidden = Vec::new();
    let mut dweight = wanted[1].then(|| Tensor::<B, 2>::zeros([d, weight.dims()[1]], (&hidden.device(), DType::F32)));
    for (start, len) in chunks(n, rows) {
        let dlogits = dlogits(start, len).cast(dtype);
        if wanted[0] {
            dhidden.push(dlogits.clone().matmul(weight.clone().transpose()));
        }
        if let Some(acc) = dweight.take() {
            dweight = Some(acc + hidden.clone().narrow(0, start, len).transpose().matmul(dlogits).cast(DType::F32));
        }
    }
    [wanted[0].then(|| Tensor::cat(dhidden, 0)), dweight.map(|w| w.cast(weight.dtype()))]
}

/// What the backward pass keeps: the inputs (no logits) and the log-sum-exp.
#[derive(Clone, Debug)]
struct Saved<B: Backend> {
    hidden: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    lse: Tensor<B, 1>,
    rows: usize,
}

#[derive(Debug)]
struct HeadBackward;

impl<B: Backend> Backward<B, 2> for HeadBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Saved<B>, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        custom_op::backward(ops, grads, |s: Saved<B>, grad: Tensor<B, 1>, wanted| {
            head_gradients(&s.hidden, &s.weight, s.rows, wanted, |start, len| {
                let logits = chunk_logits(s.hidden.clone().narrow(0, start, len), s.weight.clone());
                let g = grad.clone().narrow(0, start, len).unsqueeze_dim::<2>(1); // [c, 1]
                let p = (logits - s.lse.clone().narrow(0, start, len).unsqueeze_dim(1)).exp();
                // d log p(t) / d logits = onehot(t) − softmax, times the output's gradient.
                let t = s.targets.clone().narrow(0, start, len).unsqueeze_dim(1);
                (-p * g.clone()).scatter(1, t, g, IndexingUpdateOp::Add)
            })
        });
    }
}

/// The op under burn's `Autodiff` (either checkpointing strategy), `None` on other backends.
fn recorded<B: AutodiffBackend>(hidden: &Tensor<B, 2>, weight: &Tensor<B, 2>, targets: &Tensor<B, 1, Int>, rows: usize) -> Option<Tensor<B, 1>> {
    let inputs = [custom_op::tracked(hidden.clone())?, custom_op::tracked(weight.clone())?];
    let (hidden, weight): (Tensor<Inner<B>, 2>, _) = (custom_op::value(&inputs[0]), custom_op::value(&inputs[1]));
    let targets = targets.clone().inner();
    let out = scores(hidden.clone(), weight.clone(), targets.clone(), rows, false);
    let lse = out.lse;
    custom_op::record(HeadBackward, &inputs, || Saved { hidden, weight, targets, lse, rows }, out.logprobs)
}

/// `log p(targets)` `[N]` (f32) for hidden states `[N, D]` under a head weight `[D, V]`, with
/// gradients for both through the chunked backward pass above; `rows` tokens at a time.
/// On an autodiff backend other than burn's `Autodiff` with its two checkpointing strategies,
/// the same chunked forward pass under that backend's own autodiff.
pub fn head_logprobs<B: AutodiffBackend>(hidden: Tensor<B, 2>, weight: Tensor<B, 2>, targets: Tensor<B, 1, Int>, rows: usize) -> Tensor<B, 1> {
    recorded(&hidden, &weight, &targets, rows)
        .unwrap_or_else(|| scores(hidden, weight, targets, rows, false).logprobs)
}

/// Per-token reverse KL `Σ_v p_S(v) (log p_S(v) − log p_T(v))` `[N]` (f32) of the student's head
/// (hidden `[N, D]`, weight `[D, V]`) against the teacher's (hidden `[N, D_T]`, weight
/// `[D_T, V]`, the same vocabulary), `rows` tokens at a time. Any backend, no gradient of its
/// own (see [`head_reverse_kl`]).
pub fn reverse_kl<B: Backend>(hidden: Tensor<B, 2>, weight: Tensor<B, 2>, teacher_hidden: Tensor<B, 2>, teacher_weight: Tensor<B, 2>, rows: usize) -> Tensor<B, 1> {
    let n = hidden.dims()[0];
    let mut out = Vec::new();
    for (start, len) in chunks(n, rows) {
        let (log_s, log_t) = kl_chunk(&hidden, &weight, &teacher_hidden, &teacher_weight, start, len);
        out.push((log_s.clone().exp() * (log_s - log_t)).sum_dim(1).squeeze_dim(1));
    }
    Tensor::cat(out, 0)
}

/// Student and teacher log-softmax `[c, V]` (f32) of tokens `start..start + len`.
fn kl_chunk<B: Backend>(h: &Tensor<B, 2>, w: &Tensor<B, 2>, th: &Tensor<B, 2>, tw: &Tensor<B, 2>, start: usize, len: usize) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let log_softmax = |logits: Tensor<B, 2>| logits.clone() - log_sum_exp(logits);
    let student = chunk_logits(h.clone().narrow(0, start, len), w.clone());
    let teacher = chunk_logits(th.clone().narrow(0, start, len), tw.clone());
    (log_softmax(student), log_softmax(teacher))
}

/// What the reverse KL's backward pass keeps: the inputs and the per-token KL.
#[derive(Clone, Debug)]
struct KlSaved<B: Backend> {
    hidden: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    teacher_hidden: Tensor<B, 2>,
    teacher_weight: Tensor<B, 2>,
    kl: Tensor<B, 1>,
    rows: usize,
}

#[derive(Debug)]
struct KlBackward;

impl<B: Backend> Backward<B, 2> for KlBackward {
    type State = KlSaved<B>;

    fn backward(self, ops: Ops<KlSaved<B>, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        custom_op::backward(ops, grads, |s: KlSaved<B>, grad: Tensor<B, 1>, wanted| {
            head_gradients(&s.hidden, &s.weight, s.rows, wanted, |start, len| {
                let (log_s, log_t) = kl_chunk(&s.hidden, &s.weight, &s.teacher_hidden, &s.teacher_weight, start, len);
                // d KL / d student logits = p_S ∘ (log p_S − log p_T − KL), times the output's gradient.
                let kl = s.kl.clone().narrow(0, start, len).unsqueeze_dim::<2>(1);
                let g = grad.clone().narrow(0, start, len).unsqueeze_dim::<2>(1);
                log_s.clone().exp() * (log_s - log_t - kl) * g
            })
        });
    }
}

/// The reverse KL op under burn's `Autodiff`, `None` on other backends.
fn kl_recorded<B: AutodiffBackend>(hidden: &Tensor<B, 2>, weight: &Tensor<B, 2>, teacher_hidden: &Tensor<Inner<B>, 2>, teacher_weight: &Tensor<Inner<B>, 2>, rows: usize) -> Option<Tensor<B, 1>> {
    let inputs = [custom_op::tracked(hidden.clone())?, custom_op::tracked(weight.clone())?];
    let (h, w): (Tensor<Inner<B>, 2>, _) = (custom_op::value(&inputs[0]), custom_op::value(&inputs[1]));
    let (th, tw) = (teacher_hidden.clone(), teacher_weight.clone());
    let kl = reverse_kl(h.clone(), w.clone(), th.clone(), tw.clone(), rows);
    let saved = || KlSaved { hidden: h, weight: w, teacher_hidden: th, teacher_weight: tw, kl: kl.clone(), rows };
    custom_op::record(KlBackward, &inputs, saved, kl.clone())
}

/// [`reverse_kl`] with gradients for the student's hidden states and head weight (the teacher's
/// are constants on the inner backend), through the chunked backward pass; on autodiff backends
/// other than burn's `Autodiff`, the same chunks under that backend's own autodiff.
pub fn head_reverse_kl<B: AutodiffBackend>(
    hidden: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    teacher_hidden: Tensor<Inner<B>, 2>,
    teacher_weight: Tensor<Inner<B>, 2>,
    rows: usize,
) -> Tensor<B, 1> {
    let recorded = kl_recorded(&hidden, &weight, &teacher_hidden, &teacher_weight, rows);
    recorded.unwrap_or_else(|| reverse_kl(hidden, weight, Tensor::from_inner(teacher_hidden), Tensor::from_inner(teacher_weight), rows))
}

#[cfg(test)]
mod tests {
    //! The chunked head against log-softmax and gather on whole logits (burn's plain ops), values
    //! and gradients, under both of burn-autodiff's checkpointing strategies.

    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, CheckpointStrategy, NoCheckpointing};
    use burn::tensor::activation::log_softmax;
    use burn::tensor::{DType, Distribution, ElementConversion, Int, Tensor, TensorData};
    use burn::backend::Flex;

    use super::{chunk_rows, recorded, rows_per_chunk, scores};

    fn max_diff<const D: usize>(a: Tensor<Flex, D>, b: Tensor<Flex, D>) -> f32 {
        (a.cast(DType::F32) - b.cast(DType::F32)).abs().max().into_scalar().elem::<f32>()
    }

    /// `max |a − b|` relative to `max |b|` (at least 1).
    fn relative<const D: usize>(a: Tensor<Flex, D>, b: Tensor<Flex, D>) -> f32 {
        let scale = b.clone().cast(DType::F32).abs().max().into_scalar().elem::<f32>().max(1.0);
        max_diff(a, b) / scale
    }

    /// Log-probs of `targets` from whole logits, as the unfused head computes them.
    fn reference<B: burn::tensor::backend::Backend>(h: Tensor<B, 2>, w: Tensor<B, 2>, t: Tensor<B, 1, Int>) -> Tensor<B, 1> {
        log_softmax(h.matmul(w).cast(DType::F32), 1).gather(1, t.unsqueeze_dim(1)).squeeze_dim(1)
    }

    /// Forward values and both gradients of `loss = Σ logp · g` (a random `g`) for the chunked op
    /// and the reference, on `Autodiff<Flex, C>` with inputs in `dtype`: the largest difference
    /// of each relative to the reference's largest magnitude (at least 1).
    fn compare<C: CheckpointStrategy>(n: usize, d: usize, v: usize, rows: usize, dtype: DType) -> [f32; 3] {
        type Ad<C> = Autodiff<Flex, C>;
        let device = Default::default();
        let normal = Distribution::Normal(0.0, 1.0);
        let h0 = Tensor::<Flex, 2>::random([n, d], normal, &device);
        let w0 = Tensor::<Flex, 2>::random([d, v], normal, &device) * 0.5;
        let g = Tensor::<Ad<C>, 1>::random([n], normal, &device);
        let ids: Vec<i64> = (0..n).map(|i| ((i * 7919) % v) as i64).collect();
        let t = Tensor::<Ad<C>, 1, Int>::from_data(TensorData::new(ids, [n]), &device);
        let run = |fused: bool| {
            let h = Tensor::<Ad<C>, 2>::from_inner(h0.clone()).require_grad();
            let w = Tensor::<Ad<C>, 2>::from_inner(w0.clone()).require_grad();
            let (hc, wc) = (h.clone().cast(dtype), w.clone().cast(dtype));
            let logp = match fused {
                true => recorded(&hc, &wc, &t, rows).expect("the custom op on Autodiff<Flex, C>"),
                false => reference(hc, wc, t.clone()),
            };
            let grads = (logp.clone() * g.clone()).sum().backward();
            (logp.inner(), h.grad(&grads).expect("hidden gradient"), w.grad(&grads).expect("weight gradient"))
        };
        let (ours, theirs) = (run(true), run(false));
        [relative(ours.0, theirs.0), relative(ours.1, theirs.1), relative(ours.2, theirs.2)]
    }

    #[test]
    fn chunked_head_matches_whole_logits_in_values_and_gradients() {
        for (n, rows) in [(37, 1), (37, 8), (37, 37), (64, 100)] {
            let err = compare::<NoCheckpointing>(n, 24, 211, rows, DType::F32);
            assert!(err.iter().all(|&e| e < 2e-5), "n {n}, {rows} rows per chunk: relative max |Δ| (logp, dh, dw) = {err:?}");
        }
        let err = compare::<BalancedCheckpointing>(37, 24, 211, 8, DType::F32);
        assert!(err.iter().all(|&e| e < 2e-5), "recomputing autodiff: relative max |Δ| (logp, dh, dw) = {err:?}");
    }

    #[test]
    fn chunked_head_in_bf16_matches_whole_bf16_logits() {
        // Both compute bf16 logits and f32 log-softmax; the weight gradient sums bf16 chunk
        // products in f32 (the reference rounds one product), so gradients may differ by bf16
        // rounding: 2⁻⁷ of their largest magnitude is two of its ulps.
        let err = compare::<NoCheckpointing>(40, 32, 157, 16, DType::BF16);
        assert!(err[0] < 1e-5, "log-probs: relative max |Δ| = {}", err[0]);
        assert!(err[1] < 1.0 / 128.0 && err[2] < 1.0 / 128.0, "gradients: relative max |Δ| (dh, dw) = {:?}", &err[1..]);
    }

    #[test]
    fn chunked_reverse_kl_matches_whole_logits_in_values_and_gradients() {
        type Ad = Autodiff<Flex>;
        let device = Default::default();
        let normal = Distribution::Normal(0.0, 1.0);
        let (n, d, dt, v) = (23, 16, 12, 97);
        let (h0, w0) = (Tensor::<Flex, 2>::random([n, d], normal, &device), Tensor::<Flex, 2>::random([d, v], normal, &device));
        let (th, tw) = (Tensor::<Flex, 2>::random([n, dt], normal, &device), Tensor::<Flex, 2>::random([dt, v], normal, &device));
        let g = Tensor::<Ad, 1>::random([n], normal, &device);
        let run = |fused: bool| {
            let h = Tensor::<Ad, 2>::from_inner(h0.clone()).require_grad();
            let w = Tensor::<Ad, 2>::from_inner(w0.clone()).require_grad();
            let kl = match fused {
                true => super::kl_recorded(&h, &w, &th, &tw, 5).expect("the custom op on Autodiff<Flex>"),
                false => {
                    let student = log_softmax(h.clone().matmul(w.clone()), 1);
                    let teacher = log_softmax(Tensor::<Ad, 2>::from_inner(th.clone().matmul(tw.clone())), 1);
                    (student.clone().exp() * (student - teacher)).sum_dim(1).squeeze_dim(1)
                }
            };
            let grads = (kl.clone() * g.clone()).sum().backward();
            (kl.inner(), h.grad(&grads).unwrap(), w.grad(&grads).unwrap())
        };
        let (ours, theirs) = (run(true), run(false));
        let err = [relative(ours.0, theirs.0), relative(ours.1, theirs.1), relative(ours.2, theirs.2)];
        assert!(err.iter().all(|&e| e < 2e-5), "relative max |Δ| (kl, dh, dw) = {err:?}");
    }

    #[test]
    fn entropy_without_gradients_matches_the_softmax() {
        let device = Default::default();
        let normal = Distribution::Normal(0.0, 1.0);
        let (h, w) = (Tensor::<Flex, 2>::random([9, 16], normal, &device), Tensor::<Flex, 2>::random([16, 53], normal, &device));
        let t = Tensor::<Flex, 1, Int>::from_data(TensorData::new((0..9i64).collect::<Vec<_>>(), [9]), &device);
        let out = scores(h.clone(), w.clone(), t.clone(), 4, true);
        let log_p = log_softmax(h.clone().matmul(w.clone()), 1);
        let entropy = -(log_p.clone().exp() * log_p).sum_dim(1).squeeze_dim(1);
        // Relative to the largest value: f32 rounding of sums over 53 terms.
        assert!(relative(out.entropy.unwrap(), entropy) < 1e-5);
        assert!(relative(out.logprobs, reference(h, w, t)) < 1e-5);
    }

    #[test]
    fn chunks_hold_at_most_256_mib_of_logits() {
        let device = Default::default();
        assert_eq!(chunk_rows::<Flex>(&device, 10, 151_936), 10);
        assert_eq!(chunk_rows::<Flex>(&device, 100_000, 151_936), 384); // 441 rounded down to 64s
        assert_eq!(chunk_rows::<Flex>(&device, 5, 1 << 40), 1);
        assert_eq!(rows_per_chunk(100_000, 151_936, Some(128 << 20)), 64); // lavapipe's 128 MiB buffers
    }
}
