//! Causal grouped-query attention on contiguous f32 buffers, forward and backward.
//!
//! Layouts (all row-major): queries, outputs and their gradients `[B, T, H, d]` (the projection's
//! output as it lies, no transposes); keys and values `[B, S, K, d]`; log-sum-exps `[B, T, H]`.
//! Query `t` of a batch row is the key at position `o + t`, `o = S - T` (the cached prefix), and
//! sees key `j` iff `j ≤ o + t` and key `j` is the query itself or a real token of the query's
//! document (`valid` labels keys: 0 padding, equal nonzero labels one document of a packed row;
//! a padding query sees every real key), as `chunked_attention::chunk_mask` describes.
//!
//! Work is split into tasks of one batch row and one KV head (all `G = H / K` query heads that
//! read it, so each key and value is loaded once per group), further split by blocks of queries
//! in the forward pass; tasks run on rayon's pool and write disjoint parts of the outputs. Within
//! a task the scores of a block of queries against all keys they can see are one matrix product
//! (gemm), the masked softmax runs row by row ([`simd_fn!`] dispatch), and the weighted sum of
//! values is a second product. A block of a few query rows (decoding) streams the keys and values
//! instead ([`FEW_ROWS`]), and the forward pass leaves out a row's leading padding. The backward
//! pass recomputes the probabilities from the saved log-sum-exps (FlashAttention-2's recipe)
//! instead of keeping the `T × S` probabilities.

use rayon::prelude::*;

use super::simd::{self, simd_fn};

/// Sizes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub batch: usize,
    /// `T`, new queries per row.
    pub queries: usize,
    /// `S`, keys per row (cached + new).
    pub keys: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl Dims {
    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
    fn offset(&self) -> usize {
        self.keys - self.queries
    }
    fn q_len(&self) -> usize {
        self.batch * self.queries * self.heads * self.head_dim
    }
    fn kv_len(&self) -> usize {
        self.batch * self.keys * self.kv_heads * self.head_dim
    }
}

/// Most query rows (query positions × heads of a group) whose scores one task holds at once.
const BLOCK_ROWS: usize = 256;

/// Blocks of at most this many query rows (decoding: one query × the heads of a group) stream
/// the keys and values once ([`streamed_scores`], [`streamed_values`]) instead of calling gemm,
/// which packs every key and value of the row into a buffer of its own for a product with a few
/// rows. Measured on the tiny model's evaluation (2 cores, Intel Xeon): gemm's packing was 29 %
/// of the decoding time.
const FEW_ROWS: usize = 8;

/// Output and log-sum-exp of every query: `out` `[B, T, H, d]`, `lse` `[B, T, H]`.
/// `valid` `[B, S]` labels the keys (0 padding, else the key's document; see the module docs).
pub fn forward(dims: Dims, q: &[f32], k: &[f32], v: &[f32], valid: &[u32], scale: f32) -> (Vec<f32>, Vec<f32>) {
    forward_strided(dims, q, k, v, dims.keys * dims.kv_heads * dims.head_dim, valid, scale)
}

/// [`forward`] with keys and values read from the first `S` positions of each batch row of a
/// larger buffer, `kv_stride` elements apart (a KV cache's `[B, capacity, K, d]` buffer, read in
/// place instead of copied out every decode step).
pub fn forward_strided(dims: Dims, q: &[f32], k: &[f32], v: &[f32], kv_stride: usize, valid: &[u32], scale: f32) -> (Vec<f32>, Vec<f32>) {
    check_strided(dims, q, k, v, kv_stride, valid);
    // Not zeroed: the tasks write every query row of both (see the end).
    let mut out = simd::unwritten(dims.q_len());
    let mut lse = simd::unwritten(dims.batch * dims.queries * dims.heads);
    let per_block = (BLOCK_ROWS / dims.group()).max(1);
    let blocks = dims.queries.div_ceil(per_block);
    let (out_ptr, lse_ptr) = (Shared(out.as_mut_ptr()), Shared(lse.as_mut_ptr()));
    (0..dims.batch * dims.kv_heads * blocks).into_par_iter().for_each(|task| {
        let (out_ptr, lse_ptr) = (&out_ptr, &lse_ptr);
        let (b, kh, block) = (task / (dims.kv_heads * blocks), task / blocks % dims.kv_heads, task % blocks);
        let mut rows = Rows::new(dims, kv_stride, b, kh, block * per_block, ((block + 1) * per_block).min(dims.queries));
        // Leading padding (a left-padded row: a shorter prompt, or a row that joined a running
        // batch later) is seen by no query but its own: its keys are left out of both products.
        let valid = &valid[b * dims.keys..(b + 1) * dims.keys];
        let valid = &valid[rows.skip_leading(valid)..];
        let mut qp = rows.pack(q);
        let few = rows.count <= FEW_ROWS && dims.head_dim > 0;
        let mut scores = if few { rows.streamed_scores(&qp, k, scale) } else { rows.scores(&qp, k, scale) };
        let mut row_lse = vec![0.0f32; rows.count];
        softmax_rows(&mut scores, rows.width, &rows.limits, valid, &mut row_lse);
        // The packed outputs reuse the packed queries' buffer (the product overwrites it).
        if few {
            streamed_values(&scores, rows.keys(v), kv_row(dims) as usize, rows.width, &mut qp);
        } else {
            // SAFETY: `scores` is `count × width`, `v` holds the keys `< width` of this row/head,
            // `qp` is `count × d`.
            unsafe {
                gemm(rows.count, d(dims), rows.width, qp.as_mut_ptr(), d(dims), false,
                     scores.as_ptr(), rows.width as isize, 1, v.as_ptr().add(rows.kv_base), kv_row(dims), 1, 1.0);
            }
        }
        // SAFETY: tasks own disjoint rows of `out` and `lse`.
        unsafe {
            rows.scatter(&qp, out_ptr.0);
            for (r, &l) in row_lse.iter().enumerate() {
                *lse_ptr.0.add(rows.lse_index(r)) = l;
            }
        }
    });
    // SAFETY: the tasks cover every (batch row, KV head, block of queries), and each wrote all
    // `d` outputs and the log-sum-exp of every query row × head of its block.
    unsafe {
        out.set_len(dims.q_len());
        lse.set_len(dims.batch * dims.queries * dims.heads);
    }
    (out, lse)
}

/// Gradients `(dq, dk, dv)` of [`forward`] given the gradient `dout` of its output.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    dims: Dims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    valid: &[u32],
    scale: f32,
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    check(dims, q, k, v, valid);
    assert!(out.len() == dims.q_len() && dout.len() == dims.q_len() && lse.len() == dims.batch * dims.queries * dims.heads);
    let d = d(dims);
    // Not zeroed: the tasks write every value of all three (see the end).
    let mut dq = simd::unwritten(dims.q_len());
    let mut dk = simd::unwritten(dims.kv_len());
    let mut dv = simd::unwritten(dims.kv_len());
    let per_block = (BLOCK_ROWS / dims.group()).max(1);
    let (dq_ptr, dk_ptr, dv_ptr) = (Shared(dq.as_mut_ptr()), Shared(dk.as_mut_ptr()), Shared(dv.as_mut_ptr()));
    (0..dims.batch * dims.kv_heads).into_par_iter().for_each(|task| {
        let (dq_ptr, dk_ptr, dv_ptr) = (&dq_ptr, &dk_ptr, &dv_ptr);
        let (b, kh) = (task / dims.kv_heads, task % dims.kv_heads);
        let valid = &valid[b * dims.keys..(b + 1) * dims.keys];
        // Packed key and value gradients `[S, d]` of this row and KV head.
        let mut dkp = vec![0.0f32; dims.keys * d];
        let mut dvp = vec![0.0f32; dims.keys * d];
        for t0 in (0..dims.queries).step_by(per_block) {
            let rows = Rows::new(dims, dims.keys * kv_row(dims) as usize, b, kh, t0, (t0 + per_block).min(dims.queries));
            let (n, w) = (rows.count, rows.width);
            let qp = rows.pack(q);
            let dop = rows.pack(dout);
            let op = rows.pack(out);
            let row_lse: Vec<f32> = (0..n).map(|r| lse[rows.lse_index(r)]).collect();
            let delta: Vec<f32> = (0..n).map(|r| simd::dot(&dop[r * d..(r + 1) * d], &op[r * d..(r + 1) * d])).collect();
            let mut probs = rows.scores(&qp, k, scale);
            probabilities(&mut probs, w, &rows.limits, valid, &row_lse);
            // SAFETY: every operand is sized as its product needs (`n × w` probabilities and
            // score gradients, `n × d` packed rows, keys/values `< w` of this row and head).
            unsafe {
                let (kp, vp) = (k.as_ptr().add(rows.kv_base), v.as_ptr().add(rows.kv_base));
                // dV += Pᵀ · dO
                gemm(w, d, n, dvp.as_mut_ptr(), d, true, probs.as_ptr(), 1, w as isize, dop.as_ptr(), d as isize, 1, 1.0);
                // dP = dO · Vᵀ
                let mut grad = product(n, w, d, dop.as_ptr(), d as isize, 1, vp, 1, kv_row(dims), 1.0);
                score_grads(&mut grad, &probs, w, &delta, scale);
                // dQ = dS · K, dK += dSᵀ · Q
                let dqp = product(n, d, w, grad.as_ptr(), w as isize, 1, kp, kv_row(dims), 1, 1.0);
                gemm(w, d, n, dkp.as_mut_ptr(), d, true, grad.as_ptr(), 1, w as isize, qp.as_ptr(), d as isize, 1, 1.0);
                rows.scatter(&dqp, dq_ptr.0);
            }
        }
        // SAFETY: tasks own disjoint (row, KV head) slices of `dk` and `dv`.
        unsafe {
            for j in 0..dims.keys {
                let at = ((b * dims.keys + j) * dims.kv_heads + kh) * d;
                std::ptr::copy_nonoverlapping(dkp[j * d..].as_ptr(), dk_ptr.0.add(at), d);
                std::ptr::copy_nonoverlapping(dvp[j * d..].as_ptr(), dv_ptr.0.add(at), d);
            }
        }
    });
    // SAFETY: the tasks cover every (batch row, KV head); each scattered all its query rows' `dq`
    // (every block of queries) and copied all keys' `dk` and `dv`.
    unsafe {
        dq.set_len(dims.q_len());
        dk.set_len(dims.kv_len());
        dv.set_len(dims.kv_len());
    }
    (dq, dk, dv)
}

fn check(dims: Dims, q: &[f32], k: &[f32], v: &[f32], valid: &[u32]) {
    assert!(k.len() == dims.kv_len() && v.len() == dims.kv_len());
    check_strided(dims, q, k, v, dims.keys * kv_row(dims) as usize, valid);
}

fn check_strided(dims: Dims, q: &[f32], k: &[f32], v: &[f32], kv_stride: usize, valid: &[u32]) {
    assert!(dims.kv_heads > 0 && dims.heads.is_multiple_of(dims.kv_heads) && dims.keys >= dims.queries);
    let row = dims.keys * kv_row(dims) as usize;
    assert!(kv_stride >= row || dims.batch <= 1, "KV rows overlap");
    let kv_len = if dims.batch == 0 { 0 } else { (dims.batch - 1) * kv_stride + row };
    assert!(q.len() == dims.q_len() && k.len() >= kv_len && v.len() >= kv_len);
    assert_eq!(valid.len(), dims.batch * dims.keys);
}

fn d(dims: Dims) -> usize {
    dims.head_dim
}

/// Distance between consecutive keys of one head in `[B, S, K, d]`.
fn kv_row(dims: Dims) -> isize {
    (dims.kv_heads * dims.head_dim) as isize
}

/// A block of query rows of one task: queries `t0..t1` × the `G` heads of KV head `kh`, packed
/// as row `(t - t0)·G + g`.
struct Rows {
    dims: Dims,
    b: usize,
    kh: usize,
    t0: usize,
    count: usize,
    /// Keys any row of the block may see: `0..o + t1`, less the leading ones left out
    /// ([`Rows::skip_leading`]; key numbers below count from the first kept).
    width: usize,
    /// Per row, the position of its own key (the last it may see).
    limits: Vec<usize>,
    /// Offset of key 0 (the first kept) of this batch row and KV head in `k` and `v`.
    kv_base: usize,
}

impl Rows {
    /// `kv_stride`: elements between batch rows of `k` and `v`.
    fn new(dims: Dims, kv_stride: usize, b: usize, kh: usize, t0: usize, t1: usize) -> Self {
        let g = dims.group();
        let limits = (0..(t1 - t0) * g).map(|r| dims.offset() + t0 + r / g).collect();
        let kv_base = b * kv_stride + kh * dims.head_dim;
        Self { dims, b, kh, t0, count: (t1 - t0) * g, width: dims.offset() + t1, limits, kv_base }
    }

    /// Offset of packed row `r` in a `[B, T, H, d]` buffer, divided by `d`.
    fn lse_index(&self, r: usize) -> usize {
        let g = self.dims.group();
        ((self.b * self.dims.queries + self.t0 + r / g) * self.dims.heads) + self.kh * g + r % g
    }

    /// This block's rows of a `[B, T, H, d]` buffer, packed `[count, d]`.
    fn pack(&self, x: &[f32]) -> Vec<f32> {
        let d = self.dims.head_dim;
        let mut out = Vec::with_capacity(self.count * d);
        for r in 0..self.count {
            let at = self.lse_index(r) * d;
            out.extend_from_slice(&x[at..at + d]);
        }
        out
    }

    /// Writes packed rows back into a `[B, T, H, d]` buffer.
    ///
    /// # Safety
    /// `dst` points to a `[B, T, H, d]` buffer that no other thread writes these rows of.
    unsafe fn scatter(&self, packed: &[f32], dst: *mut f32) {
        let d = self.dims.head_dim;
        for r in 0..self.count {
            unsafe { std::ptr::copy_nonoverlapping(packed[r * d..].as_ptr(), dst.add(self.lse_index(r) * d), d) };
        }
    }

    /// Leaves out the leading keys that are padding (label 0) and that no row of the block sees
    /// as its own key: the block then starts at the first key kept. Returns how many were left
    /// out (the labels of the kept keys are `valid[returned..]`).
    fn skip_leading(&mut self, valid: &[u32]) -> usize {
        let own = self.limits.iter().copied().min().unwrap_or(0);
        let skip = valid[..own.min(valid.len())].iter().take_while(|&&l| l == 0).count();
        self.kv_base += skip * kv_row(self.dims) as usize;
        self.width -= skip;
        self.limits.iter_mut().for_each(|l| *l -= skip);
        skip
    }

    /// The keys (or values) `< width` of this row and KV head: key `j` starts at `j · kv_row`.
    fn keys<'a>(&self, k: &'a [f32]) -> &'a [f32] {
        let end = self.kv_base + (self.width.max(1) - 1) * kv_row(self.dims) as usize + self.dims.head_dim;
        &k[self.kv_base..end.max(self.kv_base)]
    }

    /// [`Rows::scores`] by [`streamed_scores`].
    fn streamed_scores(&self, qp: &[f32], k: &[f32], scale: f32) -> Vec<f32> {
        let mut scores = vec![0.0f32; self.count * self.width];
        streamed_scores(&qp[..self.count * self.dims.head_dim], self.keys(k), kv_row(self.dims) as usize, self.dims.head_dim, scale, &mut scores);
        scores
    }

    /// `scale · Q_packed · K[0..width]ᵀ`, `[count, width]`.
    fn scores(&self, qp: &[f32], k: &[f32], scale: f32) -> Vec<f32> {
        let d = self.dims.head_dim;
        assert!(qp.len() >= self.count * d);
        assert!(self.kv_base + (self.width - 1) * kv_row(self.dims) as usize + d <= k.len());
        // SAFETY: sizes checked above.
        unsafe { product(self.count, self.width, d, qp.as_ptr(), d as isize, 1, k.as_ptr().add(self.kv_base), 1, kv_row(self.dims), scale) }
    }
}

simd_fn! {
    /// `scores[r, j] = scale · q[r] · key j`, `[rows, width]` with `rows = qp.len() / d`; key `j`
    /// is `k[j·stride..j·stride + d]`.
    fn streamed_scores(qp: &[f32], k: &[f32], stride: usize, d: usize, scale: f32, scores: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if d % 16 == 0 && simd::level() == simd::Level::Avx512 {
            // SAFETY: AVX-512F is there (the level was detected on this CPU).
            return unsafe { avx512::scores(qp, k, stride, d, scale, scores) };
        }
        match d {
            32 => scores_of::<32>(qp, k, stride, scale, scores),
            64 => scores_of::<64>(qp, k, stride, scale, scores),
            128 => scores_of::<128>(qp, k, stride, scale, scores),
            _ => {
                let width = scores.len() / (qp.len() / d).max(1);
                for (j, key) in k.chunks(stride).take(width).enumerate() {
                    for (r, q) in qp.chunks_exact(d).enumerate() {
                        scores[r * width + j] = scale * simd::dot(q, &key[..d]);
                    }
                }
            }
        }
    }
}

simd_fn! {
    /// `out[r] = Σ_j probs[r, j] · value j`, `out` `[rows, d]`, `probs` `[rows, width]`; value `j`
    /// is `v[j·stride..j·stride + d]`.
    fn streamed_values(probs: &[f32], v: &[f32], stride: usize, width: usize, out: &mut [f32]) {
        let rows = probs.len() / width.max(1);
        match out.len() / rows.max(1) {
            32 => values_of::<32>(probs, v, stride, width, out),
            64 => values_of::<64>(probs, v, stride, width, out),
            128 => values_of::<128>(probs, v, stride, width, out),
            d => {
                out.fill(0.0);
                for (j, value) in v.chunks(stride).take(width).enumerate() {
                    for (r, o) in out.chunks_exact_mut(d).enumerate() {
                        let p = probs[r * width + j];
                        for (o, &x) in o.iter_mut().zip(&value[..d]) {
                            *o += p * x;
                        }
                    }
                }
            }
        }
    }
}

/// [`streamed_scores`] for a head size known at compile time (a multiple of 16): each dot
/// product is `D / 16` vector multiply-adds and one tree of lane sums, not a serial sum.
#[inline(always)]
fn scores_of<const D: usize>(qp: &[f32], k: &[f32], stride: usize, scale: f32, scores: &mut [f32]) {
    let width = scores.len() / (qp.len() / D).max(1);
    for (j, key) in k.chunks(stride).take(width).enumerate() {
        let key: &[f32; D] = key[..D].try_into().expect("a whole key");
        for (r, q) in qp.chunks_exact(D).enumerate() {
            let q: &[f32; D] = q.try_into().expect("a whole query");
            let mut acc = [0.0f32; 16];
            for c in (0..D).step_by(16) {
                for i in 0..16 {
                    acc[i] += q[c + i] * key[c + i];
                }
            }
            scores[r * width + j] = scale * lane_sum(acc);
        }
    }
}

/// [`streamed_values`] for a head size known at compile time: a row's `D` sums stay in
/// registers while the values stream past.
#[inline(always)]
fn values_of<const D: usize>(probs: &[f32], v: &[f32], stride: usize, width: usize, out: &mut [f32]) {
    for (row, o) in probs.chunks_exact(width).zip(out.chunks_exact_mut(D)) {
        let mut acc = [0.0f32; D];
        for (&p, value) in row.iter().zip(v.chunks(stride)) {
            let value: &[f32; D] = value[..D].try_into().expect("a whole value");
            for c in 0..D {
                acc[c] += p * value[c];
            }
        }
        o.copy_from_slice(&acc);
    }
}

/// One decoding query's keys and values in a paged KV cache: `len` positions, position `j` in
/// block `j / block` at `j % block`; each block slice is one layer's `[block, K, d]`.
pub struct PagedRow<'a> {
    pub len: usize,
    pub keys: Vec<&'a [f32]>,
    pub values: Vec<&'a [f32]>,
}

/// Decoding attention over a paged KV cache: row `r`'s one query `q[r]` (`[R, H, d]`, after
/// RoPE) attends to all `rows[r].len` keys (its own the last; a row holds no padding). Returns
/// `[R, H, d]`. Tasks of one row and one KV head run on rayon's pool; the scores and the
/// weighted sum are [`forward_strided`]'s for a streamed block ([`FEW_ROWS`] rows: the same
/// functions, keys in the same order, groups of 16 keys starting at the row's first key as
/// there), so a row decodes to the same bits as from a contiguous cache with `G ≤ FEW_ROWS`.
pub fn decode_paged(heads: usize, kv_heads: usize, head_dim: usize, block: usize, q: &[f32], rows: &[PagedRow<'_>], scale: f32) -> Vec<f32> {
    let (g, d, stride) = (heads / kv_heads, head_dim, kv_heads * head_dim);
    assert!(block.is_multiple_of(16) && heads.is_multiple_of(kv_heads) && q.len() == rows.len() * heads * d);
    let mut out = vec![0.0f32; q.len()];
    if d == 0 {
        return out;
    }
    out.par_chunks_mut(g * d).enumerate().for_each(|(task, out)| {
        let (r, kh) = (task / kv_heads, task % kv_heads);
        let row = &rows[r];
        let width = row.len;
        assert!(width > 0 && row.keys.len() * block >= width && row.values.len() == row.keys.len());
        assert!(row.keys.iter().chain(&row.values).all(|b| b.len() >= block * stride), "whole [block, K, d] slices");
        let qp = &q[(r * heads + kh * g) * d..][..g * d];
        let mut scores = vec![0.0f32; g * width];
        let mut part = vec![0.0f32; g * block];
        for (i, keys) in row.keys.iter().enumerate().take(width.div_ceil(block)) {
            let (start, n) = (i * block, block.min(width - i * block));
            let part = &mut part[..g * n];
            streamed_scores(qp, &keys[kh * d..], stride, d, scale, part);
            for (s, p) in scores.chunks_exact_mut(width).zip(part.chunks_exact(n)) {
                s[start..start + n].copy_from_slice(p);
            }
        }
        let (limits, valid, mut lse) = (vec![width - 1; g], vec![1u32; width], vec![0.0f32; g]);
        softmax_rows(&mut scores, width, &limits, &valid, &mut lse);
        paged_values(&scores, &row.values, kh * d, stride, block, width, out);
    });
    out
}

simd_fn! {
    /// [`streamed_values`] over a paged row: value `j` of `blocks[j / block]` at
    /// `offset + (j % block) · stride`; `out` `[rows, d]` with `probs` `[rows, width]`.
    fn paged_values(probs: &[f32], blocks: &[&[f32]], offset: usize, stride: usize, block: usize, width: usize, out: &mut [f32]) {
        let rows = probs.len() / width.max(1);
        match out.len() / rows.max(1) {
            32 => paged_values_of::<32>(probs, blocks, offset, stride, block, width, out),
            64 => paged_values_of::<64>(probs, blocks, offset, stride, block, width, out),
            128 => paged_values_of::<128>(probs, blocks, offset, stride, block, width, out),
            d => {
                out.fill(0.0);
                for j in 0..width {
                    let value = &blocks[j / block][offset + (j % block) * stride..][..d];
                    for (r, o) in out.chunks_exact_mut(d).enumerate() {
                        let p = probs[r * width + j];
                        for (o, &x) in o.iter_mut().zip(value) {
                            *o += p * x;
                        }
                    }
                }
            }
        }
    }
}

/// [`paged_values`] for a head size known at compile time: [`values_of`]'s sums, in the same
/// order, across the blocks.
#[inline(always)]
fn paged_values_of<const D: usize>(probs: &[f32], blocks: &[&[f32]], offset: usize, stride: usize, block: usize, width: usize, out: &mut [f32]) {
    for (row, o) in probs.chunks_exact(width).zip(out.chunks_exact_mut(D)) {
        let mut acc = [0.0f32; D];
        for (i, values) in blocks.iter().enumerate().take(width.div_ceil(block)) {
            let start = i * block;
            let probs = &row[start..(start + block).min(width)];
            for (&p, value) in probs.iter().zip(values[offset..].chunks(stride)) {
                let value: &[f32; D] = value[..D].try_into().expect("a whole value");
                for c in 0..D {
                    acc[c] += p * value[c];
                }
            }
        }
        o.copy_from_slice(&acc);
    }
}

/// [`streamed_scores`] in AVX-512 for head sizes that are a multiple of 16: the products of 16
/// keys with a query are 16 vectors of partial sums, added across in one transposing tree (15
/// adds, 30 shuffles) instead of 16 separate horizontal sums.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX-512F must be available; `d` is a multiple of 16, `qp` holds whole rows of `d`, key
    /// `j < scores.len() / rows` lies in `k` at `j · stride`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn scores(qp: &[f32], k: &[f32], stride: usize, d: usize, scale: f32, scores: &mut [f32]) {
        let rows = qp.len() / d;
        let width = scores.len() / rows.max(1);
        assert!(d % 16 == 0 && rows * width == scores.len());
        assert!(width == 0 || (width - 1) * stride + d <= k.len());
        // Lane `j` of the tree's result holds key `4·(j % 4) + j / 4`'s sum.
        let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        let full = width / 16 * 16;
        for (r, q) in qp.chunks_exact(d).enumerate() {
            let out = &mut scores[r * width..(r + 1) * width];
            let mut j = 0;
            while j < full {
                let mut acc = [_mm512_setzero_ps(); 16];
                for (i, a) in acc.iter_mut().enumerate() {
                    // SAFETY: key `j + i < width` lies in `k` (asserted above).
                    unsafe { *a = dot(q, k.as_ptr().add((j + i) * stride), d) };
                }
                let sums = _mm512_permutexvar_ps(order, transpose_sum(acc));
                // SAFETY: `j + 16 <= width`.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(j), _mm512_mul_ps(sums, _mm512_set1_ps(scale))) };
                j += 16;
            }
            for (j, o) in out.iter_mut().enumerate().skip(full) {
                // SAFETY: as above.
                *o = scale * _mm512_reduce_add_ps(unsafe { dot(q, k.as_ptr().add(j * stride), d) });
            }
        }
    }

    /// Lane-wise partial sums of `q · key` (`d` values each).
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn dot(q: &[f32], key: *const f32, d: usize) -> __m512 {
        let mut acc = _mm512_setzero_ps();
        let mut c = 0;
        while c < d {
            // SAFETY: the caller's key holds `d` values; `q` holds `d`.
            acc = unsafe { _mm512_fmadd_ps(_mm512_loadu_ps(q.as_ptr().add(c)), _mm512_loadu_ps(key.add(c)), acc) };
            c += 16;
        }
        acc
    }

    /// Sixteen horizontal sums at once: lane `4·(j % 4) + j / 4` of the result is `Σ a[j]`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn transpose_sum(a: [__m512; 16]) -> __m512 {
        let zero = _mm512_setzero_ps();
        // Halves of 256 bits: b[i] quarters 0-1 hold key 2i's 8 partial sums, 2-3 key 2i+1's.
        let mut b = [zero; 8];
        for i in 0..8 {
            let (x, y) = (a[2 * i], a[2 * i + 1]);
            b[i] = _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(x, y), _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y));
        }
        // Quarters: c[i] quarter q holds key 4i+q's 4 partial sums.
        let mut c = [zero; 4];
        for i in 0..4 {
            let (x, y) = (b[2 * i], b[2 * i + 1]);
            c[i] = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(x, y), _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y));
        }
        // Within quarters: d[i] quarter q holds 2 sums of key 8i+q, then 2 of key 8i+4+q.
        let mut d = [zero; 2];
        for i in 0..2 {
            let (x, y) = (c[2 * i], c[2 * i + 1]);
            d[i] = _mm512_add_ps(_mm512_shuffle_ps::<0b10_00_10_00>(x, y), _mm512_shuffle_ps::<0b11_01_11_01>(x, y));
        }
        // Quarter q: the sums of keys q, 4+q, 8+q, 12+q.
        _mm512_add_ps(_mm512_shuffle_ps::<0b10_00_10_00>(d[0], d[1]), _mm512_shuffle_ps::<0b11_01_11_01>(d[0], d[1]))
    }
}

/// The sum of 16 lanes as a tree (halves added in turn), a few vector shuffles and adds.
#[inline(always)]
fn lane_sum(mut a: [f32; 16]) -> f32 {
    for i in 0..8 {
        a[i] += a[i + 8];
    }
    for i in 0..4 {
        a[i] += a[i + 4];
    }
    a[0] + a[2] + (a[1] + a[3])
}

/// Splits a score row at its query's own key: `(seen, later)`, `seen` = keys `0..=limit`; keys
/// in `seen` the query may not see (padding, another document) are set to `-inf`.
#[inline(always)]
fn visible<'a>(row: &'a mut [f32], limit: usize, valid: &[u32]) -> (&'a mut [f32], &'a mut [f32]) {
    let (seen, later) = row.split_at_mut(limit + 1);
    let own = valid[limit];
    let sees = |label: u32| label != 0 && (own == 0 || label == own);
    // Not `all` (an early exit per key is a scalar loop): this folds 16 labels at a time.
    if !valid[..limit].iter().fold(true, |all, &l| all & sees(l)) {
        for (s, &l) in seen[..limit].iter_mut().zip(valid) {
            *s = if sees(l) { *s } else { f32::NEG_INFINITY };
        }
    }
    (seen, later)
}

simd_fn! {
    /// Masked softmax of `[rows, width]` scores in place; `lse[r]` = log Σ exp over row `r`.
    fn softmax_rows(scores: &mut [f32], width: usize, limits: &[usize], valid: &[u32], lse: &mut [f32]) {
        for (r, row) in scores.chunks_exact_mut(width).enumerate() {
            let (seen, later) = visible(row, limits[r], valid);
            later.fill(0.0);
            let max = simd::max(seen);
            let sum = simd::exp_shifted_sum(seen, max);
            let inv = 1.0 / sum;
            seen.iter_mut().for_each(|s| *s *= inv);
            lse[r] = max + sum.ln();
        }
    }
}

simd_fn! {
    /// Scores `[rows, width]` → probabilities `exp(s - lse[r])`, masked ones 0.
    fn probabilities(scores: &mut [f32], width: usize, limits: &[usize], valid: &[u32], lse: &[f32]) {
        for (r, row) in scores.chunks_exact_mut(width).enumerate() {
            let l = lse[r];
            let (seen, later) = visible(row, limits[r], valid);
            later.fill(0.0);
            for s in seen.iter_mut() {
                *s = if *s == f32::NEG_INFINITY { 0.0 } else { simd::exp(*s - l) };
            }
        }
    }
}

simd_fn! {
    /// Probability gradients → score gradients (with the scale of the scores folded in):
    /// `grad = scale · P ∘ (grad − delta[r])`.
    fn score_grads(grad: &mut [f32], probs: &[f32], width: usize, delta: &[f32], scale: f32) {
        for ((g, p), &dr) in grad.chunks_exact_mut(width).zip(probs.chunks_exact(width)).zip(delta) {
            for (g, &p) in g.iter_mut().zip(p) {
                *g = scale * p * (*g - dr);
            }
        }
    }
}

/// `dst[m × n] (+)= beta · lhs[m × k] · rhs[k × n]`, single-threaded (tasks are the parallelism);
/// row strides given, `dst` row-major with row stride `dst_rs`; `accumulate` adds to `dst`.
///
/// # Safety
/// The pointers must be valid for the extents the sizes and strides describe.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    accumulate: bool,
    lhs: *const f32,
    lhs_rs: isize,
    lhs_cs: isize,
    rhs: *const f32,
    rhs_rs: isize,
    rhs_cs: isize,
    beta: f32,
) {
    // With `k` = 0 gemm still sets `dst` (to zero, or leaves it when accumulating).
    if m == 0 || n == 0 {
        return;
    }
    unsafe {
        gemm::gemm(m, n, k, dst, 1, dst_rs as isize, accumulate, lhs, lhs_cs, lhs_rs, rhs, rhs_cs, rhs_rs,
                   1.0, beta, false, false, false, gemm::Parallelism::None);
    }
}

/// `beta · lhs · rhs` as a new row-major `[m, n]` buffer, not zeroed first (gemm writes every
/// value).
///
/// # Safety
/// As [`gemm`]'s.
#[allow(clippy::too_many_arguments)]
unsafe fn product(m: usize, n: usize, k: usize, lhs: *const f32, lhs_rs: isize, lhs_cs: isize, rhs: *const f32, rhs_rs: isize, rhs_cs: isize, beta: f32) -> Vec<f32> {
    // An empty sum is zero here, not left to how gemm treats `k` = 0.
    if k == 0 {
        return vec![0.0; m * n];
    }
    let mut dst = simd::unwritten(m * n);
    unsafe {
        gemm(m, n, k, dst.as_mut_ptr(), n, false, lhs, lhs_rs, lhs_cs, rhs, rhs_rs, rhs_cs, beta);
        dst.set_len(m * n);
    }
    dst
}

/// A pointer shared by tasks that write disjoint elements.
struct Shared(*mut f32);
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}
