//! [`Sampler`]'s rule in burn ops on the backend's own tensors (wgpu, CUDA): the `[rows, V]`
//! logits never leave the device; one `[rows, 3]` tensor (the chosen ids and their two
//! log-probs) comes back per step.
//!
//! No sort and no O(V²) scan (burn 0.21's CubeCL `cumsum` loops over the whole prefix for each
//! element, and its `sort` reads back to the host):
//! - cut-offs by bisection on the logit value: top-k's is the largest value with at least `k`
//!   logits at or above it, top-p's the largest with at least `top_p` of the mass at or above
//!   it; [`BISECTIONS`] halvings of the logits' range reach the logit itself, so the kept set
//!   is the host's (tokens tied at the cut included) unless two logits lie within 2⁻³² of the
//!   range of each other at the cut;
//! - inverse CDF in two levels: blocks of [`BLOCK`] tokens, a cumulative sum over the blocks'
//!   masses picks the block, one over that block's tokens picks the token;
//! - sums over the vocabulary in the same two levels, so f32 rounding stays near the host's f64
//!   even where top-p keeps a long flat tail.

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, DType, FloatDType, Int, Tensor, TensorData};

use super::processors::{self, RowEdits};
use super::sampler::{Sampled, Sampler};

/// Halvings of the logits' range in a bisection.
pub const BISECTIONS: usize = 32;

/// Tokens per block of the two-level inverse CDF.
pub const BLOCK: usize = 256;

/// Samples one token per row of `logits` `[rows, V]` with the uniforms `u` (one per row, see
/// [`super::sampler::uniform`]); returns `[rows, 3]` f32: the token id, its log-prob under the
/// distribution sampled from (0 for greedy) and under the model's own softmax. `edits`: one per
/// row, what changes its logits first ([`Sampler::sample_edited`]).
pub fn sample<B: Backend>(logits: Tensor<B, 2>, sampler: &Sampler, u: &[f32], edits: Option<&[RowEdits]>) -> Tensor<B, 2> {
    let logits = logits.cast(DType::F32);
    let [rows, vocab] = logits.dims();
    assert_eq!(u.len(), rows, "one uniform per row");
    let device = logits.device();
    let raw = log_softmax(logits.clone(), 1);
    let edits = edits.filter(|rows| rows.iter().any(|r| !r.is_identity()));
    let banned = edits.is_some_and(|rows| rows.iter().any(|r| !r.banned.is_empty()));
    let logits = match edits {
        Some(rows) => processors::apply_on_device(logits, rows),
        None => logits,
    };
    if sampler.is_greedy() {
        let token = logits.argmax(1);
        let raw_lp = raw.gather(1, token.clone());
        return Tensor::cat(vec![token.cast(FloatDType::F32), Tensor::zeros([rows, 1], (&device, DType::F32)), raw_lp], 1);
    }
    let scaled = logits.div_scalar(sampler.temperature);
    let max = scaled.clone().max_dim(1); // [rows, 1]
    // (the lowest logit a row may draw: a banned token's −∞ would leave the bisections nothing to halve)
    let floor = match banned {
        true => scaled.clone().mask_fill(scaled.clone().equal_elem(f32::NEG_INFINITY), f32::INFINITY).min_dim(1),
        false => scaled.clone().min_dim(1),
    };
    let at_or_above = |cut: &Tensor<B, 2>| scaled.clone().greater_equal(cut.clone().expand([rows, vocab]));

    let mut cut = floor.clone();
    if sampler.top_k > 0 && sampler.top_k < vocab {
        let k = sampler.top_k as i64;
        cut = bisect(floor.clone(), max.clone(), |t| at_or_above(t).int().sum_dim(1).greater_equal_elem(k));
    }
    if sampler.top_p < 1.0 {
        let weights = masked_weights(&scaled, &max, at_or_above(&cut));
        let wanted = row_sum(weights.clone()).mul_scalar(sampler.top_p);
        let mass_at_or_above = |t: &Tensor<B, 2>| row_sum(weights.clone().mask_fill(at_or_above(t).bool_not(), 0.0));
        cut = bisect(cut, max.clone(), |t| mass_at_or_above(t).greater_equal(wanted.clone()));
    }
    if sampler.min_p > 0.0 {
        cut = cut.max_pair(max.clone().add_scalar(sampler.min_p.ln()));
    }
    let weights = masked_weights(&scaled, &max, at_or_above(&cut));
    let u = Tensor::<B, 2>::from_data(TensorData::new(u.to_vec(), [rows, 1]), (&device, DType::F32));
    let (token, total) = inverse_cdf(weights, u);
    let logprob = scaled.gather(1, token.clone()) - max - total.log();
    let raw_lp = raw.gather(1, token.clone());
    Tensor::cat(vec![token.cast(FloatDType::F32), logprob, raw_lp], 1)
}

/// Reads back what [`sample`] returned.
pub fn read<B: Backend>(picked: Tensor<B, 2>) -> Vec<Sampled> {
    let host: Vec<f32> = picked.into_data().convert::<f32>().into_vec().expect("f32 samples");
    host.chunks_exact(3).map(|r| Sampled { token: r[0] as u32, logprob: r[1], raw_logprob: r[2] }).collect()
}

/// Row sums `[rows, 1]` of `values` `[rows, V]`, block by block ([`BLOCK`]) and then over the
/// blocks, so the rounding error grows with `BLOCK + V / BLOCK` terms, not `V`, on every backend.
fn row_sum<B: Backend>(values: Tensor<B, 2>) -> Tensor<B, 2> {
    let [rows, _] = values.dims();
    let blocks = pad_to_blocks(values);
    let count = blocks.dims()[1] / BLOCK;
    blocks.reshape([rows, count, BLOCK]).sum_dim(2).reshape([rows, count]).sum_dim(1)
}

/// `values` `[rows, V]` with zeros appended up to a whole number of [`BLOCK`]s.
fn pad_to_blocks<B: Backend>(values: Tensor<B, 2>) -> Tensor<B, 2> {
    let [rows, vocab] = values.dims();
    match vocab.div_ceil(BLOCK) * BLOCK - vocab {
        0 => values,
        pad => {
            let zeros = Tensor::zeros([rows, pad], (&values.device(), DType::F32));
            Tensor::cat(vec![values, zeros], 1)
        }
    }
}

/// `exp(scaled − max)` where `keep`, else 0.
fn masked_weights<B: Backend>(scaled: &Tensor<B, 2>, max: &Tensor<B, 2>, keep: Tensor<B, 2, Bool>) -> Tensor<B, 2> {
    let [rows, vocab] = scaled.dims();
    (scaled.clone() - max.clone().expand([rows, vocab])).exp().mask_fill(keep.bool_not(), 0.0)
}

/// The largest `t` in `[lo, hi]` (per row, `[rows, 1]`) with `holds(t)`, for a `holds` that is
/// true at `lo` and false above some point: [`BISECTIONS`] halvings, then `hi` itself if it holds.
fn bisect<B: Backend>(mut lo: Tensor<B, 2>, mut hi: Tensor<B, 2>, holds: impl Fn(&Tensor<B, 2>) -> Tensor<B, 2, Bool>) -> Tensor<B, 2> {
    for _ in 0..BISECTIONS {
        let mid = (lo.clone() + hi.clone()).mul_scalar(0.5);
        let yes = holds(&mid);
        lo = lo.mask_where(yes.clone(), mid.clone());
        hi = mid.mask_where(yes, hi);
    }
    let top = holds(&hi);
    lo.mask_where(top, hi)
}

/// The first token whose cumulative weight reaches `u ·` total (`weights` `[rows, V]`, `u`
/// `[rows, 1]`), and the total weight `[rows, 1]`; two levels, see the module docs.
fn inverse_cdf<B: Backend>(weights: Tensor<B, 2>, u: Tensor<B, 2>) -> (Tensor<B, 2, Int>, Tensor<B, 2>) {
    let [rows, vocab] = weights.dims();
    let device = weights.device();
    let blocks = vocab.div_ceil(BLOCK);
    let by_block = pad_to_blocks(weights).reshape([rows, blocks, BLOCK]);
    let block_mass = by_block.clone().sum_dim(2).reshape([rows, blocks]);
    let cumulative = block_mass.clone().cumsum(1);
    let total = cumulative.clone().narrow(1, blocks - 1, 1);
    let target = u * total.clone();
    let block = count_below(cumulative.clone(), &target).clamp_max(blocks as i64 - 1);
    let before = (cumulative - block_mass).gather(1, block.clone());
    let within = by_block.gather(1, block.clone().reshape([rows, 1, 1]).expand([rows, 1, BLOCK])).reshape([rows, BLOCK]);
    // Rounding may leave the block's last sum just below the target: never step past its
    // last token of non-zero weight.
    let positions = Tensor::<B, 1, Int>::arange(1..BLOCK as i64 + 1, &device).reshape([1, BLOCK]).expand([rows, BLOCK]);
    let last = (within.clone().greater_elem(0.0).int() * positions).max_dim(1).sub_scalar(1);
    let offset = count_below(within.cumsum(1) + before.expand([rows, BLOCK]), &target).min_pair(last);
    (block.mul_scalar(BLOCK as i64) + offset, total)
}

/// How many entries of each row of `cumulative` are below `target` `[rows, 1]`.
fn count_below<B: Backend>(cumulative: Tensor<B, 2>, target: &Tensor<B, 2>) -> Tensor<B, 2, Int> {
    let [rows, cols] = cumulative.dims();
    cumulative.lower(target.clone().expand([rows, cols])).int().sum_dim(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::processors::Penalties;
    use crate::generate::sampler::uniform;
    use burn::backend::Flex;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Rows of logits spread like a language model's: a few likely tokens over a long tail.
    fn logits(rows: usize, vocab: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..rows * vocab).map(|_| rng.random::<f32>().powi(6) * 14.0 - 3.0).collect()
    }

    /// The device rule gives the host's tokens and log-probs, row by row; also with the most
    /// likely tokens of the first rows banned from every other row (min_tokens) and penalties
    /// over tokens seen.
    fn agree(sampler: Sampler, rows: usize, vocab: usize, seed: u64) {
        let host = logits(rows, vocab, seed);
        let banned: Vec<u32> = (0..3.min(rows)).map(|r| super::super::sampler::argmax(&host[r * vocab..(r + 1) * vocab]) as u32).collect();
        let seen: Vec<u32> = (0..rows).map(|r| super::super::sampler::argmax(&host[r * vocab..(r + 1) * vocab]) as u32).chain([1, 2, 2]).collect();
        let penalties = Penalties { repetition: 1.2, presence: 0.3, frequency: 0.4 };
        let edits: Vec<RowEdits> = (0..rows)
            .map(|r| RowEdits { banned: if r % 2 == 0 { &banned } else { &[] }, penalties, prompt: &seen[..rows / 2], output: &seen[rows / 2..] })
            .collect();
        let off: Vec<RowEdits> = edits.iter().map(|e| RowEdits { penalties: Penalties::default(), ..*e }).collect();
        for edits in [None, Some(off.as_slice()), Some(edits.as_slice())] {
            agree_rows(sampler, &host, rows, vocab, seed, edits);
        }
    }

    fn agree_rows(sampler: Sampler, host: &[f32], rows: usize, vocab: usize, seed: u64, edits: Option<&[RowEdits]>) {
        let u: Vec<f32> = (0..rows).map(|r| uniform(seed, r, 0, 0)).collect();
        let device = Tensor::<Flex, 2>::from_data(TensorData::new(host.to_vec(), [rows, vocab]), &Default::default());
        let picked = read(sample(device, &sampler, &u, edits));
        for (r, got) in picked.iter().enumerate() {
            let none = RowEdits { banned: &[], penalties: Penalties::default(), prompt: &[], output: &[] };
            let row_edits = edits.map_or(none, |e| e[r]);
            let want = sampler.sample_edited(&host[r * vocab..(r + 1) * vocab], u[r], &row_edits);
            assert!(!row_edits.banned.contains(&got.token), "{sampler:?} row {r}: drew a banned token");
            assert_eq!(got.token, want.token, "{sampler:?}, vocab {vocab}, row {r}");
            // f32 sums over the vocabulary against the host's f64.
            let close = |a: f32, b: f32| (a - b).abs() <= 1e-5 + 2e-5 * b.abs();
            assert!(close(got.logprob, want.logprob), "{sampler:?} row {r}: {got:?} vs {want:?}");
            assert!(close(got.raw_logprob, want.raw_logprob), "{sampler:?} row {r}: {got:?} vs {want:?}");
        }
    }

    #[test]
    fn the_device_rule_is_the_hosts() {
        let samplers = [
            Sampler::greedy(),
            Sampler::default(),
            Sampler { temperature: 0.7, ..Sampler::default() },
            Sampler { top_k: 20, ..Sampler::default() },
            Sampler { temperature: 1.3, top_p: 0.9, ..Sampler::default() },
            Sampler { temperature: 0.6, top_p: 0.95, ..Sampler::default() },
            Sampler { min_p: 0.05, ..Sampler::default() },
            Sampler { temperature: 0.8, top_k: 50, top_p: 0.9, min_p: 0.02 },
        ];
        for (i, sampler) in samplers.into_iter().enumerate() {
            // One block, several with a partial last one, and a vocabulary of Qwen's size.
            agree(sampler, 16, 97, i as u64);
            agree(sampler, 16, 1000, 10 + i as u64);
        }
        agree(Sampler { temperature: 1.0, top_p: 0.9, ..Sampler::default() }, 3, 151_936, 99);
    }

    #[test]
    fn every_token_of_a_flat_distribution_is_reachable() {
        // 600 equal logits, 3 blocks: u = (i + 0.5) / 600 picks token i.
        let vocab = 600;
        let device = Tensor::<Flex, 2>::zeros([vocab, vocab], &Default::default());
        let u: Vec<f32> = (0..vocab).map(|i| (i as f32 + 0.5) / vocab as f32).collect();
        let picked = read(sample(device, &Sampler::default(), &u, None));
        let tokens: Vec<u32> = picked.iter().map(|s| s.token).collect();
        assert_eq!(tokens, (0..vocab as u32).collect::<Vec<_>>());
        assert!(picked.iter().all(|s| (s.logprob + (vocab as f32).ln()).abs() < 1e-4));
    }
}
