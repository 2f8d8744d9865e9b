//! Grouped-query attention over chunks of queries, so that scores exist for `c` queries at a
//! time (memory-efficient attention, Rabe & Staats; the backward pass is flash attention's):
//! memory linear in the sequence length, in burn's plain operations on every backend.
//!
//! Shapes: `B` batch, `H` query heads, `K` key/value heads, `G = H / K`, `T` queries, `S` keys
//! (the queries are the last `T` keys: a cache of `S − T` before them), `d` head size, `c` queries
//! per chunk. Query head `h = k·G + g` reads KV head `k` (K/V are never repeated: the `G` heads of
//! a group are folded into the rows of one product). A query sees the keys up to its own
//! position that are real and of its own document (`key_valid` labels keys: 0 padding, equal
//! nonzero labels one document of a packed row), and itself always, so no row is empty (as
//! `qwen2::attention_mask`; see [`chunk_mask`]).
//!
//! Forward, per chunk: scores `[B, K, G·c, S]` in f32, masked, their log-sum-exp (kept, `[B, H, T]`)
//! and the output. Backward, per chunk: the scores are recomputed, `P = exp(S − lse)`,
//! `dV += Pᵀ·dO`, `dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O))`, `dQ = dS·K`, `dK += dSᵀ·Q` (times the
//! scale). Under burn's `Autodiff` this is one custom operation ([`super::custom_op`]) that keeps
//! only q, k, v, the output and the log-sum-exp.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Int, Tensor};

use super::custom_op::{self, Inner};

/// The most bytes of one chunk's f32 scores (fewer where the device's buffers are smaller).
const CHUNK_BYTES: u64 = 64 << 20;

/// Bytes of f32 scores `[B, H, T, S]` computed at once without chunks.
pub fn dense_bytes(batch: usize, heads: usize, queries: usize, keys: usize) -> u64 {
    [heads, queries, keys, 4].into_iter().fold(batch as u64, |n, m| n.saturating_mul(m as u64))
}

/// Queries per chunk: as many as keep a chunk's f32 scores within [`CHUNK_BYTES`] and half the
/// device's largest buffer `max_buffer`, at least one.
pub fn rows_per_chunk(batch: usize, heads: usize, queries: usize, keys: usize, max_buffer: Option<u64>) -> usize {
    let budget = max_buffer.map_or(CHUNK_BYTES, |max| CHUNK_BYTES.min(max / 2));
    let fit = (budget / dense_bytes(batch, heads, 1, keys).max(1)).max(1) as usize;
    let fit = if fit > 16 { fit / 16 * 16 } else { fit };
    fit.min(queries.max(1))
}

/// The mask `[B, K, G·c, S]` (true = hidden) of queries `first..first + c` of `T` over the keys
/// `key_valid` `[B, S]`, whose last `T` are the queries' own.
///
/// `key_valid` labels each key: 0 is padding, and equal nonzero labels are one document (a
/// batch without packing labels every real token 1). A query sees the keys up to its own
/// position that carry its label, and itself always; a padding query (label 0) sees every
/// real key before it, so no row is empty and unpacked batches keep their rule.
pub fn chunk_mask<B: Backend>(key_valid: &Tensor<B, 2, Int>, queries: usize, first: usize, c: usize, kv_heads: usize, group: usize) -> Tensor<B, 4, Bool> {
    chunk_mask_before(key_valid, queries, first, c, 0, kv_heads, group)
}

/// [`chunk_mask`] where the queries' own keys are followed by `after` more (padding, which
/// `key_valid` marks 0).
pub fn chunk_mask_before<B: Backend>(
    key_valid: &Tensor<B, 2, Int>,
    queries: usize,
    first: usize,
    c: usize,
    after: usize,
    kv_heads: usize,
    group: usize,
) -> Tensor<B, 4, Bool> {
    let device = key_valid.device();
    let [batch, keys] = key_valid.dims();
    let start = (keys - after - queries + first) as i64;
    let shape = [batch, c, keys];
    let rows = Tensor::<B, 1, Int>::arange(start..start + c as i64, &device).reshape([1, c, 1]).expand(shape);
    let cols = Tensor::<B, 1, Int>::arange(0..keys as i64, &device).reshape([1, 1, keys]).expand(shape);
    let future = cols.clone().greater(rows.clone());
    let not_self = cols.not_equal(rows);
    let key_label = key_valid.clone().reshape([batch, 1, keys]).expand(shape);
    let query_label = key_valid.clone().narrow(1, start as usize, c).reshape([batch, c, 1]).expand(shape);
    // Hidden unless its own: padding keys, and keys of another document than a real query's.
    let other_document = key_label.clone().not_equal(query_label.clone()).bool_and(query_label.not_equal_elem(0));
    let unseen = key_label.equal_elem(0).bool_or(other_document);
    let mask = future.bool_or(unseen.bool_and(not_self)); // [B, c, S]
    mask.reshape([batch, 1, 1, c, keys]).expand([batch, kv_heads, group, c, keys]).reshape([batch, kv_heads, group * c, keys])
}

/// The problem's sizes, read from q `[B, H, T, d]` and k `[B, K, S, d]`.
#[derive(Clone, Copy, Debug)]
struct Dims {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    queries: usize,
    d: usize,
    rows: usize,
}

impl Dims {
    fn new<B: Backend>(q: &Tensor<B, 4>, k: &Tensor<B, 4>, rows: usize) -> Self {
        let [batch, heads, queries, d] = q.dims();
        let kv_heads = k.dims()[1];
        Self { batch, heads, kv_heads, queries, d, rows: rows.max(1) }
    }

    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    fn scale(&self) -> f64 {
        1.0 / (self.d as f64).sqrt()
    }

    /// `(first, c)` of each chunk.
    fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + use<> {
        let (rows, queries) = (self.rows, self.queries);
        (0..queries).step_by(rows).map(move |first| (first, rows.min(queries - first)))
    }

    /// Queries `first..first + c` of `[B, H, T, X]` as `[B, K, G·c, X]`.
    fn take<B: Backend>(&self, x: &Tensor<B, 4>, first: usize, c: usize) -> Tensor<B, 4> {
        let width = x.dims()[3];
        x.clone()
            .reshape([self.batch, self.kv_heads, self.group(), self.queries, width])
            .narrow(3, first, c)
            .reshape([self.batch, self.kv_heads, self.group() * c, width])
    }

    /// Chunks `[B, K, G·c, X]` back into `[B, H, T, X]`.
    fn join<B: Backend>(&self, parts: Vec<Tensor<B, 4>>) -> Tensor<B, 4> {
        let (b, k, g) = (self.batch, self.kv_heads, self.group());
        let parts = parts
            .into_iter()
            .map(|p| {
                let [_, _, rows, width] = p.dims();
                p.reshape([b, k, g, rows / g, width])
            })
            .collect();
        let joined: Tensor<B, 5> = Tensor::cat(parts, 3);
        let width = joined.dims()[4];
        joined.reshape([b, self.heads, self.queries, width])
    }

    /// Masked, scaled f32 scores `[B, K, G·c, S]` of a chunk of queries `[B, K, G·c, d]`.
    fn scores<B: Backend>(&self, q: Tensor<B, 4>, k: &Tensor<B, 4>, key_valid: &Tensor<B, 2, Int>, first: usize, c: usize) -> Tensor<B, 4> {
        let mask = chunk_mask(key_valid, self.queries, first, c, self.kv_heads, self.group());
        (q.matmul(k.clone().swap_dims(2, 3)) * self.scale()).mask_fill(mask, f32::NEG_INFINITY)
    }
}

/// The output `[B, H, T, d]` and log-sum-exp `[B, H, T, 1]` of attention of q `[B, H, T, d]`
/// over k, v `[B, K, S, d]` (f32), `rows` queries at a time. Any backend; as plain operations
/// (differentiable by any autodiff, without the memory savings of [`attention`]'s backward).
pub fn forward<B: Backend>(q: &Tensor<B, 4>, k: &Tensor<B, 4>, v: &Tensor<B, 4>, key_valid: &Tensor<B, 2, Int>, rows: usize) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let dims = Dims::new(q, k, rows);
    let (mut outs, mut lses) = (Vec::new(), Vec::new());
    for (first, c) in dims.chunks() {
        let (out, lse) = softmax_values(dims.scores(dims.take(q, first, c), k, key_valid, first, c), v);
        outs.push(out);
        lses.push(lse);
    }
    (dims.join(outs), dims.join(lses))
}

/// `softmax(scores) · v` and the scores' log-sum-exp: masked f32 scores `[B, K, R, S]`, v
/// `[B, K, S, d]`.
fn softmax_values<B: Backend>(scores: Tensor<B, 4>, v: &Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let max = scores.clone().max_dim(3).detach();
    let p = (scores - max.clone()).exp();
    let sum = p.clone().sum_dim(3);
    (p.matmul(v.clone()) / sum.clone(), sum.log() + max)
}

/// Attention of queries `[B, K, G·T, d]` over k, v `[B, K, S, d]` (f32) under a dense mask
/// `[B, K, G·T, S]` (true = hidden), in the operations of [`forward`], unchunked: the output
/// `[B, K, G·T, d]`. Used instead of burn's attention op, which on wgpu (lavapipe) was measured
/// 8.8e-3 off transformers' f32 log-probs over a 1,098-token row where these operations are
/// 1.9e-5 off (tests/packing.rs).
pub fn masked<B: Backend>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, mask: Tensor<B, 4, Bool>) -> Tensor<B, 4> {
    let scale = 1.0 / (q.dims()[3] as f64).sqrt();
    let scores = (q.matmul(k.swap_dims(2, 3)) * scale).mask_fill(mask, f32::NEG_INFINITY);
    softmax_values(scores, &v).0
}

/// The gradients of q, k, v from the output's gradient `dout` (see the module docs).
#[allow(clippy::too_many_arguments)]
fn backward<B: Backend>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
    key_valid: &Tensor<B, 2, Int>,
    out: &Tensor<B, 4>,
    lse: &Tensor<B, 4>,
    dout: Tensor<B, 4>,
    rows: usize,
) -> [Tensor<B, 4>; 3] {
    let dims = Dims::new(q, k, rows);
    let (mut dk, mut dv) = (k.zeros_like(), v.zeros_like());
    let mut dq = Vec::new();
    for (first, c) in dims.chunks() {
        let qc = dims.take(q, first, c);
        let doc = dims.take(&dout, first, c);
        let delta = (doc.clone() * dims.take(out, first, c)).sum_dim(3); // [B, K, G·c, 1]
        let p = (dims.scores(qc.clone(), k, key_valid, first, c) - dims.take(lse, first, c)).exp();
        dv = dv + p.clone().swap_dims(2, 3).matmul(doc.clone());
        let ds = p * (doc.matmul(v.clone().swap_dims(2, 3)) - delta) * dims.scale();
        dq.push(ds.clone().matmul(k.clone()));
        dk = dk + ds.swap_dims(2, 3).matmul(qc);
    }
    [dims.join(dq), dk, dv]
}

/// What the backward pass keeps.
#[derive(Clone, Debug)]
struct Saved<B: Backend> {
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    key_valid: Tensor<B, 2, Int>,
    out: Tensor<B, 4>,
    lse: Tensor<B, 4>,
    rows: usize,
}

#[derive(Debug)]
struct AttentionBackward;

impl<B: Backend> Backward<B, 3> for AttentionBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Saved<B>, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        custom_op::backward(ops, grads, |s: Saved<B>, dout, _| backward(&s.q, &s.k, &s.v, &s.key_valid, &s.out, &s.lse, dout, s.rows).map(Some));
    }
}

/// Attention `[B, H, T, d]` of q `[B, H, T, d]` over k, v `[B, K, S, d]` (f32) under burn's
/// `Autodiff`, with the chunked backward pass; `None` on other backends.
pub fn attention<B: AutodiffBackend>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, key_valid: &Tensor<B, 2, Int>, rows: usize) -> Option<Tensor<B, 4>> {
    let inputs = [custom_op::tracked(q)?, custom_op::tracked(k)?, custom_op::tracked(v)?];
    let [q, k, v]: [Tensor<Inner<B>, 4>; 3] = [custom_op::value(&inputs[0]), custom_op::value(&inputs[1]), custom_op::value(&inputs[2])];
    let key_valid = key_valid.clone().inner();
    let (out, lse) = forward(&q, &k, &v, &key_valid, rows);
    let saved = || Saved { q, k, v, key_valid, out: out.clone(), lse, rows };
    custom_op::record(AttentionBackward, &inputs, saved, out.clone())
}

#[cfg(test)]
mod tests {
    //! Chunked attention against attention written out with burn ops (K/V repeated per head, a
    //! dense mask from the visibility rule, softmax), values and gradients.

    use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, CheckpointStrategy, NoCheckpointing};
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::activation::softmax;
    use burn::tensor::backend::Backend;
    use burn::tensor::{Bool, Distribution, ElementConversion, Int, Tensor, TensorData};

    use super::{attention, forward, rows_per_chunk};

    /// The reference: key `j` is visible to query `t` (at position `S − T + t`) when it is not
    /// later and is the query itself, or real and of the query's document (a padding query's
    /// being any).
    fn reference<B: Backend>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, valid: &[u8]) -> Tensor<B, 4> {
        let [b, h, t, d] = q.dims();
        let [_, kv, s, _] = k.dims();
        let repeat = |x: Tensor<B, 4>| x.unsqueeze_dim::<5>(2).expand([b, kv, h / kv, s, d]).reshape([b, h, s, d]);
        let scores = q.matmul(repeat(k).swap_dims(2, 3)) / (d as f64).sqrt();
        let hidden: Vec<bool> = (0..b * t * s)
            .map(|i| (i / (t * s), (i / s) % t, i % s))
            .map(|(bi, ti, j)| {
                let (own, key) = (valid[bi * s + s - t + ti], valid[bi * s + j]);
                !(j <= s - t + ti && (j == s - t + ti || (key != 0 && (own == 0 || key == own))))
            })
            .collect();
        let hidden = Tensor::<B, 4, Bool>::from_data(TensorData::new(hidden, [b, 1, t, s]), &scores.device()).expand([b, h, t, s]);
        softmax(scores.mask_fill(hidden, f32::NEG_INFINITY), 3).matmul(repeat(v))
    }

    fn max_diff<const D: usize>(a: Tensor<Flex, D>, b: Tensor<Flex, D>) -> f32 {
        (a - b).abs().max().into_scalar().elem::<f32>()
    }

    /// Batch 3 (row 0 three packed documents, row 1 left-padded by 2, row 2 right-padded by 3
    /// after two packed documents), `h` heads on `kv`, `t` queries
    /// over `s` keys, head size `d`: max |Δ| of the output and of dq, dk, dv (for a random
    /// output gradient) between the custom op at `rows` queries per chunk and the reference.
    fn compare<C: CheckpointStrategy>(h: usize, kv: usize, t: usize, s: usize, d: usize, rows: usize) -> [f32; 4] {
        type Ad<C> = Autodiff<Flex, C>;
        let device = Default::default();
        let b = 3;
        let n = Distribution::Normal(0.0, 1.0);
        let valid: Vec<u8> = (0..b * s)
            .map(|i| match (i / s, i % s) {
                (1, j) => (j >= 2) as u8,
                (2, j) => if j < s - 3 { 1 + (2 * j >= s) as u8 } else { 0 },
                (_, j) => 1 + (3 * j / s) as u8,
            })
            .collect();
        let key_valid = Tensor::<Ad<C>, 2, Int>::from_data(TensorData::new(valid.iter().map(|&x| x as i64).collect::<Vec<_>>(), [b, s]), &device);
        let inputs = [[b, h, t, d], [b, kv, s, d], [b, kv, s, d]].map(|shape| Tensor::<Flex, 4>::random(shape, n, &device));
        let dout = Tensor::<Ad<C>, 4>::random([b, h, t, d], n, &device);
        let run = |chunked: bool| {
            let [q, k, v] = inputs.clone().map(|x| Tensor::<Ad<C>, 4>::from_inner(x).require_grad());
            let out = match chunked {
                true => attention(q.clone(), k.clone(), v.clone(), &key_valid, rows).expect("the custom op on Autodiff<Flex, C>"),
                false => reference(q.clone(), k.clone(), v.clone(), &valid),
            };
            let grads = (out.clone() * dout.clone()).sum().backward();
            [out.inner(), q.grad(&grads).unwrap(), k.grad(&grads).unwrap(), v.grad(&grads).unwrap()]
        };
        let (ours, theirs) = (run(true), run(false));
        let mut err = [0.0; 4];
        for (e, (a, b)) in err.iter_mut().zip(ours.into_iter().zip(theirs)) {
            *e = max_diff(a, b);
        }
        err
    }

    #[test]
    fn chunked_attention_matches_burn_ops_in_values_and_gradients() {
        // (heads, kv heads, queries, keys, head size, rows per chunk): GQA 2:1 and 3:1, chunks
        // that do not divide the queries, a cache before the queries, one query per chunk.
        for (h, kv, t, s, d, rows) in [(4, 2, 13, 13, 8, 4), (6, 2, 7, 12, 16, 3), (4, 4, 5, 5, 8, 1), (6, 2, 130, 130, 64, 48), (4, 1, 1, 9, 32, 16)] {
            let err = compare::<NoCheckpointing>(h, kv, t, s, d, rows);
            assert!(err.iter().all(|&e| e < 2e-4), "h {h} kv {kv} t {t} s {s} d {d} rows {rows}: max |Δ| (out, dq, dk, dv) = {err:?}");
        }
        let err = compare::<BalancedCheckpointing>(6, 2, 13, 13, 8, 4);
        assert!(err.iter().all(|&e| e < 2e-4), "recomputing autodiff: max |Δ| = {err:?}");
    }

    #[test]
    fn forward_without_autodiff_matches_and_chunks_fit_the_budget() {
        let device = Default::default();
        let n = Distribution::Normal(0.0, 1.0);
        let [q, k, v] = [[2, 4, 9, 8], [2, 2, 9, 8], [2, 2, 9, 8]].map(|shape| Tensor::<Flex, 4>::random(shape, n, &device));
        let key_valid = Tensor::<Flex, 2, Int>::ones([2, 9], &device);
        let (out, _) = forward(&q, &k, &v, &key_valid, 2);
        assert!(max_diff(out, reference(q, k, v, &[1; 18])) < 1e-5);
        // 64 MiB of f32 scores: 1 × 12 heads × 16,384 keys is 768 KiB a query → 85, in 16s 80;
        // lavapipe's 128 MiB buffers allow half of that.
        assert_eq!(rows_per_chunk(1, 12, 16_384, 16_384, None), 80);
        assert_eq!(rows_per_chunk(1, 12, 16_384, 16_384, Some(64 << 20)), 32);
        assert_eq!(rows_per_chunk(8, 12, 10, 10, None), 10);
    }
}
