//! Row-wise kernels of a Qwen2 block on contiguous f32 buffers, forward and backward: SwiGLU's
//! `silu(gate) · up`, rotary embedding, RMSNorm. Work is split into chunks of rows on rayon's
//! pool; each chunk runs a [`simd_fn!`] body. Outputs are written once, never zeroed first
//! ([`simd::written`]): a body writes every element of its output chunks.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::simd::{self, simd_fn};

/// Elements per parallel chunk of the elementwise kernels (large enough to amortise a task).
const CHUNK: usize = 1 << 14;

/// `silu(gate) · up`.
pub fn swiglu(gate: &[f32], up: &[f32]) -> Vec<f32> {
    assert_eq!(gate.len(), up.len());
    // SAFETY: the chunks of `out`, `gate` and `up` pair up one to one, equal in length, and the
    // body writes each element of its chunk of `out`.
    let [out] = unsafe {
        simd::written(gate.len(), |[out]| {
            out.par_chunks_mut(CHUNK).zip(gate.par_chunks(CHUNK).zip(up.par_chunks(CHUNK))).for_each(|(o, (g, u))| swiglu_body(o, g, u))
        })
    };
    out
}

simd_fn! {
    fn swiglu_body(out: &mut [MaybeUninit<f32>], gate: &[f32], up: &[f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            o.write(g * simd::sigmoid(g) * u);
        }
    }
}

/// Gradients `(d gate, d up)` of [`swiglu`] given `dout`.
pub fn swiglu_backward(gate: &[f32], up: &[f32], dout: &[f32]) -> (Vec<f32>, Vec<f32>) {
    assert!(gate.len() == up.len() && up.len() == dout.len());
    // SAFETY: all five are split into the same chunks, and the body writes each element of its
    // chunks of `dgate` and `dup`.
    let [dgate, dup] = unsafe {
        simd::written(gate.len(), |[dgate, dup]| {
            dgate
                .par_chunks_mut(CHUNK)
                .zip(dup.par_chunks_mut(CHUNK))
                .zip(gate.par_chunks(CHUNK).zip(up.par_chunks(CHUNK)).zip(dout.par_chunks(CHUNK)))
                .for_each(|((dg, du), ((g, u), d))| swiglu_backward_body(dg, du, g, u, d))
        })
    };
    (dgate, dup)
}

simd_fn! {
    fn swiglu_backward_body(dgate: &mut [MaybeUninit<f32>], dup: &mut [MaybeUninit<f32>], gate: &[f32], up: &[f32], dout: &[f32]) {
        for i in 0..dgate.len().min(dup.len()).min(gate.len()).min(up.len()).min(dout.len()) {
            let (g, u, d) = (gate[i], up[i], dout[i]);
            let s = simd::sigmoid(g);
            dup[i].write(d * g * s);
            // d silu(g) / dg = s · (1 + g · (1 - s))
            dgate[i].write(d * u * s * (1.0 + g * (1.0 - s)));
        }
    }
}

/// Rotary embedding of `x` `[rows, heads, d]` with `cos`, `sin` `[rows, d]` (one row per token):
/// `x·cos + rotate_half(x)·sin`; with `inverse`, the transposed rotation (`sin` negated), which
/// is also the backward pass.
pub fn rope(x: &[f32], cos: &[f32], sin: &[f32], heads: usize, d: usize, inverse: bool) -> Vec<f32> {
    assert!(heads > 0 && d > 0, "rope: {heads} heads of size {d}");
    let rows = cos.len() / d;
    assert!(x.len() == rows * heads * d && sin.len() == cos.len() && d.is_multiple_of(2));
    let per_chunk = (CHUNK / (heads * d)).max(1);
    // SAFETY: `x` is `rows` whole rows of `heads · d` (asserted), chunked as `out` is, and the body
    // writes both halves of every head of every row of its chunk.
    let [out] = unsafe {
        simd::written(x.len(), |[out]| {
            out.par_chunks_mut(per_chunk * heads * d)
                .zip(x.par_chunks(per_chunk * heads * d))
                .zip(cos.par_chunks(per_chunk * d).zip(sin.par_chunks(per_chunk * d)))
                .for_each(|((o, x), (c, s))| rope_body(o, x, c, s, heads, d, if inverse { -1.0 } else { 1.0 }))
        })
    };
    out
}

simd_fn! {
    fn rope_body(out: &mut [MaybeUninit<f32>], x: &[f32], cos: &[f32], sin: &[f32], heads: usize, d: usize, sign: f32) {
        let half = d / 2;
        // The transpose of the rotation swaps which half of `sin` multiplies which half.
        let (sa, sb) = if sign > 0.0 { (0, half) } else { (half, 0) };
        for ((o, x), (c, s)) in out.chunks_exact_mut(heads * d).zip(x.chunks_exact(heads * d)).zip(cos.chunks_exact(d).zip(sin.chunks_exact(d))) {
            for (o, x) in o.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
                let (x1, x2) = x.split_at(half);
                let (o1, o2) = o.split_at_mut(half);
                let (s1, s2) = (&s[sa..sa + half], &s[sb..sb + half]);
                for i in 0..half {
                    o1[i].write(x1[i] * c[i] - sign * x2[i] * s1[i]);
                    o2[i].write(x2[i] * c[half + i] + sign * x1[i] * s2[i]);
                }
            }
        }
    }
}

/// RMSNorm of rows of width `weight.len()`: `x / √(mean(x²) + eps) · weight`; also returns the
/// per-row `1 / √(mean(x²) + eps)` for the backward pass.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>) {
    let width = weight.len();
    let rows = x.len() / width;
    assert_eq!(x.len(), rows * width, "whole rows");
    let mut inv = vec![0.0f32; rows];
    let per_chunk = (CHUNK / width).max(1);
    // SAFETY: `x` is whole rows (asserted), chunked as `out` is, and the body writes every row.
    let [out] = unsafe {
        simd::written(x.len(), |[out]| {
            out.par_chunks_mut(per_chunk * width)
                .zip(inv.par_chunks_mut(per_chunk))
                .zip(x.par_chunks(per_chunk * width))
                .for_each(|((o, r), x)| rms_norm_body(o, r, x, weight, eps))
        })
    };
    (out, inv)
}

simd_fn! {
    fn rms_norm_body(out: &mut [MaybeUninit<f32>], inv: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
        let width = weight.len();
        for ((o, r), x) in out.chunks_exact_mut(width).zip(inv.iter_mut()).zip(x.chunks_exact(width)) {
            *r = 1.0 / (simd::dot(x, x) / width as f32 + eps).sqrt();
            for ((o, &x), &w) in o.iter_mut().zip(x).zip(weight) {
                o.write(x * *r * w);
            }
        }
    }
}

/// Gradients `(dx, dweight)` of [`rms_norm`] given `dout` and its saved `inv`.
pub fn rms_norm_backward(x: &[f32], weight: &[f32], inv: &[f32], dout: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let width = weight.len();
    let per_chunk = (CHUNK / width).max(1);
    assert!(x.len() == inv.len() * width && dout.len() == x.len(), "whole rows");
    let mut dweight = None;
    // SAFETY: `x`, `dout` and `dx` are whole rows, one per value of `inv` (asserted), chunked
    // alike, and the body writes every row of its chunk of `dx`.
    let [dx] = unsafe {
        simd::written(x.len(), |[dx]| {
            let partials: Vec<Vec<f32>> = dx
                .par_chunks_mut(per_chunk * width)
                .zip(x.par_chunks(per_chunk * width).zip(dout.par_chunks(per_chunk * width)).zip(inv.par_chunks(per_chunk)))
                .map(|(dx, ((x, dout), inv))| {
                    let mut dw = vec![0.0f32; width];
                    rms_norm_backward_body(dx, &mut dw, x, weight, inv, dout);
                    dw
                })
                .collect();
            // Summed in chunk order: rayon's `reduce` groups the partial sums as its threads
            // happened to split the work, so the gradient's rounding followed the timing.
            dweight = partials.into_iter().reduce(|mut a, b| {
                a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
                a
            });
        })
    };
    let dweight = dweight.unwrap_or_else(|| vec![0.0f32; weight.len()]);
    (dx, dweight)
}

simd_fn! {
    /// `dx = r·(g∘w) − x·r³·mean((g∘w)∘x)`, `dw += g∘x·r` per row (`g` = dout, `r` = inv).
    fn rms_norm_backward_body(dx: &mut [MaybeUninit<f32>], dw: &mut [f32], x: &[f32], weight: &[f32], inv: &[f32], dout: &[f32]) {
        let width = weight.len();
        for (((dx, x), g), &r) in dx.chunks_exact_mut(width).zip(x.chunks_exact(width)).zip(dout.chunks_exact(width)).zip(inv) {
            let mut dot = 0.0f32;
            for i in 0..width {
                dot += g[i] * weight[i] * x[i];
            }
            let c = r * r * r * dot / width as f32;
            for i in 0..width {
                dx[i].write(r * g[i] * weight[i] - x[i] * c);
                dw[i] += g[i] * x[i] * r;
            }
        }
    }
}

/// Per row of `logits` `[rows, vocab]`: `log_softmax(row)[target]`, and the row's log-sum-exp
/// (kept for the backward pass). The log-softmax itself is never stored.
pub fn token_logprobs(logits: &[f32], vocab: usize, targets: &[u32]) -> (Vec<f32>, Vec<f32>) {
    assert_eq!(logits.len(), targets.len() * vocab);
    let mut out = vec![0.0f32; targets.len()];
    let mut lse = vec![0.0f32; targets.len()];
    let per_chunk = (CHUNK / vocab).max(1);
    out.par_chunks_mut(per_chunk)
        .zip(lse.par_chunks_mut(per_chunk))
        .zip(logits.par_chunks(per_chunk * vocab).zip(targets.par_chunks(per_chunk)))
        .for_each(|((o, l), (x, t))| token_logprobs_body(o, l, x, vocab, t));
    (out, lse)
}

simd_fn! {
    fn token_logprobs_body(out: &mut [f32], lse: &mut [f32], logits: &[f32], vocab: usize, targets: &[u32]) {
        for (((o, l), row), &t) in out.iter_mut().zip(lse.iter_mut()).zip(logits.chunks_exact(vocab)).zip(targets) {
            let max = simd::max(row);
            let mut acc = [0.0f32; 16];
            let chunks = row.chunks_exact(16);
            let rest: f32 = chunks.remainder().iter().map(|&x| simd::exp(x - max)).sum();
            for c in chunks {
                for i in 0..16 {
                    acc[i] += simd::exp(c[i] - max);
                }
            }
            let sum = acc.iter().sum::<f32>() + rest;
            *l = max + sum.ln();
            *o = row[t as usize] - *l;
        }
    }
}

/// Gradient of [`token_logprobs`]' logits given `grad` `[rows]`:
/// `grad[r] · (onehot(target) − softmax(row))`.
pub fn token_logprobs_backward(logits: &[f32], vocab: usize, targets: &[u32], lse: &[f32], grad: &[f32]) -> Vec<f32> {
    let rows = targets.len();
    assert!(logits.len() == rows * vocab && lse.len() == rows && grad.len() == rows, "one target, lse and gradient per row");
    let per_chunk = (CHUNK / vocab).max(1);
    // SAFETY: `logits` is one whole row per target (asserted), chunked as `dlogits` is, and the
    // body writes every element of every row.
    let [dlogits] = unsafe {
        simd::written(logits.len(), |[dlogits]| {
            dlogits
                .par_chunks_mut(per_chunk * vocab)
                .zip(logits.par_chunks(per_chunk * vocab))
                .zip(targets.par_chunks(per_chunk).zip(lse.par_chunks(per_chunk)).zip(grad.par_chunks(per_chunk)))
                .for_each(|((d, x), ((t, l), g))| token_logprobs_backward_body(d, x, vocab, t, l, g))
        })
    };
    dlogits
}

simd_fn! {
    fn token_logprobs_backward_body(dlogits: &mut [MaybeUninit<f32>], logits: &[f32], vocab: usize, targets: &[u32], lse: &[f32], grad: &[f32]) {
        for ((((d, row), &t), &l), &g) in dlogits.chunks_exact_mut(vocab).zip(logits.chunks_exact(vocab)).zip(targets).zip(lse).zip(grad) {
            for (d, &x) in d.iter_mut().zip(row) {
                d.write(-g * simd::exp(x - l));
            }
            // The target's own gradient, in the same operations (and rounding) as before: the
            // softmax term, plus `g`.
            d[t as usize].write(-g * simd::exp(row[t as usize] - l) + g);
        }
    }
}

/// The scalars of one AdamW update, each rounded to f32 as burn's scalar ops round them.
pub use crate::model::kernels::AdamWStep;

/// One AdamW update in a single pass: `(param, exp_avg, exp_avg_sq)` after the step, each
/// element computed with the same f32 operations in the same order as `train::adamw` runs them
/// with burn's ops (so results are bit-identical).
pub fn adamw(param: &[f32], grad: &[f32], exp_avg: &[f32], exp_avg_sq: &[f32], s: AdamWStep) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let n = param.len();
    assert!(grad.len() == n && exp_avg.len() == n && exp_avg_sq.len() == n);
    // SAFETY: all seven are `n` long (asserted), chunked alike, and the body writes every element
    // of its chunks of `p`, `m` and `v`.
    let [p, m, v] = unsafe {
        simd::written(n, |[p, m, v]| {
            p.par_chunks_mut(CHUNK)
                .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
                .zip(param.par_chunks(CHUNK).zip(grad.par_chunks(CHUNK)).zip(exp_avg.par_chunks(CHUNK).zip(exp_avg_sq.par_chunks(CHUNK))))
                .for_each(|((p, (m, v)), ((p0, g), (m0, v0)))| adamw_body(p, m, v, p0, g, m0, v0, s))
        })
    };
    (p, m, v)
}

simd_fn! {
    fn adamw_body(p: &mut [MaybeUninit<f32>], m: &mut [MaybeUninit<f32>], v: &mut [MaybeUninit<f32>], p0: &[f32], g: &[f32], m0: &[f32], v0: &[f32], s: AdamWStep) {
        for i in 0..p.len().min(m.len()).min(v.len()).min(p0.len()).min(g.len()).min(m0.len()).min(v0.len()) {
            let grad = match s.clip { Some(c) => g[i] * c, None => g[i] };
            let param = match s.decay { Some(d) => p0[i] * d, None => p0[i] };
            let exp_avg = m0[i] + (grad - m0[i]) * s.w;
            let exp_avg_sq = v0[i] * s.beta2 + (grad * s.one_minus_beta2) * grad;
            let denom = exp_avg_sq.sqrt() / s.bias_correction2_sqrt + s.eps;
            p[i].write(param - (exp_avg / denom) * s.step_size);
            m[i].write(exp_avg);
            v[i].write(exp_avg_sq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The weight gradient sums per-chunk partials; their order must not depend on the threads.
    #[test]
    fn rms_norm_weight_gradient_does_not_depend_on_the_threads() {
        let (rows, width) = (4096, 64);
        let value = |i: usize, salt: usize| ((i * 2654435761 + salt * 97) % 1000) as f32 / 1000.0 - 0.5;
        let x: Vec<f32> = (0..rows * width).map(|i| value(i, 1)).collect();
        let dout: Vec<f32> = (0..rows * width).map(|i| value(i, 2) * 1e-3).collect();
        let weight: Vec<f32> = (0..width).map(|i| 1.0 + value(i, 3)).collect();
        let inv: Vec<f32> = (0..rows).map(|i| 1.0 + value(i, 4)).collect();
        let with = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| rms_norm_backward(&x, &weight, &inv, &dout).1)
        };
        let one = with(1);
        for threads in [2, 3, 8] {
            assert_eq!(with(threads), one, "{threads} threads");
        }
    }
}
