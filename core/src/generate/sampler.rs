//! Token sampling from one row of logits: greedy, or temperature, top-k, top-p and min-p (in that
//! order, as `transformers` applies its logits warpers), returning the sampled token's
//! log-probability both under the distribution actually sampled from and under the model's
//! unmodified distribution.
//!
//! The same rule runs in two places: here on the host (the CPU backend, whose logits are host
//! memory; f64 sums) and in burn ops on the backend's tensors ([`super::device_sampler`], for
//! wgpu and CUDA, where only the chosen ids and their two log-probs come back). Both keep the
//! tokens at or above one cut-off logit (so tokens tied at the cut stay in), and both pick
//! by inverse CDF in vocabulary order with one uniform from [`uniform`], a counter-based stream
//! keyed by (seed, prompt, sample, step): a sample depends neither on batching nor on the
//! backend, and the two places agree wherever their logits do (up to rounding at a cut).

use rand::{RngCore, SeedableRng};

use super::processors::RowEdits;
use rand_chacha::ChaCha8Rng;

/// Sampling knobs for one sequence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// 0 (or anything under [`GREEDY_BELOW`]) means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1 disables.
    pub top_p: f32,
    /// Keep only tokens whose probability is at least `min_p` times the most likely one's
    /// (`transformers`' `MinPLogitsWarper`, vLLM's `min_p`); 0 disables.
    pub min_p: f32,
}

/// Temperatures under this decode greedily, as vLLM's (`_SAMPLING_EPS`): dividing by a
/// smaller one overflows the logits to infinity.
pub const GREEDY_BELOW: f32 = 1e-5;

/// One sampled token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// log p(token) under the distribution sampled from (temperature, top-k, top-p and min-p
    /// applied; 0 for greedy, a point mass). This is the behaviour policy of importance sampling.
    pub logprob: f32,
    /// log p(token) under the model's own softmax (temperature 1, no truncation).
    pub raw_logprob: f32,
}

impl Default for Sampler {
    fn default() -> Self {
        Self { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0 }
    }
}

/// The uniform in (0, 1) that picks token `step` of sample `sample` of prompt `prompt`: word
/// `step` of the ChaCha8 stream `(prompt, sample)` under `seed`, so any step of any sample can
/// be drawn in any order. 23 bits, `(k + 0.5) / 2^23`: exact in f32 and never 0 or 1.
pub fn uniform(seed: u64, prompt: usize, sample: usize, step: usize) -> f32 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(((prompt as u64) << 32) ^ sample as u64);
    rng.set_word_pos(2 * step as u128);
    let bits = rng.next_u64() >> 41;
    (bits as f32 + 0.5) / (1u32 << 23) as f32
}

/// `log_softmax(logits)[index]`, accumulated in f64.
pub fn log_softmax_at(logits: &[f32], index: usize) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    (logits[index] as f64 - max - sum.ln()) as f32
}

/// Index of the largest logit (the first one on ties, like `torch.argmax`).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best
}

impl Sampler {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

    /// Checks the knobs: a finite temperature of at least 0, `top_p` in (0, 1] and `min_p` in
    /// [0, 1].
    pub fn check(&self) -> crate::Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(crate::Error::InvalidInput(format!("temperature must be a finite number >= 0 (got {})", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(crate::Error::InvalidInput(format!("top_p must be in (0, 1] (got {})", self.top_p)));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(crate::Error::InvalidInput(format!("min_p must be in [0, 1] (got {})", self.min_p)));
        }
        Ok(())
    }

    /// Whether this sampler is greedy: a temperature under [`GREEDY_BELOW`] (vLLM's rule; a
    /// smaller one would overflow the scaled logits).
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_BELOW
    }

    /// Samples one token from `logits` (one row, length = vocabulary) with the uniform `u` in
    /// (0, 1) (see [`uniform`]).
    pub fn sample(&self, logits: &[f32], u: f32) -> Sampled {
        if self.is_greedy() {
            let token = argmax(logits);
            return Sampled { token: token as u32, logprob: 0.0, raw_logprob: log_softmax_at(logits, token) };
        }
        let (tokens, probs) = self.distribution(logits);
        let Some(last) = tokens.len().checked_sub(1) else {
            // No token to sample: the logits are NaN. NaN log-probs say so to the caller.
            return Sampled { token: argmax(logits) as u32, logprob: f32::NAN, raw_logprob: f32::NAN };
        };
        let target = u as f64;
        let mut acc = 0.0;
        let mut chosen = last;
        for (i, &p) in probs.iter().enumerate() {
            acc += p;
            if acc >= target {
                chosen = i;
                break;
            }
        }
        let token = tokens[chosen];
        Sampled { token: token as u32, logprob: probs[chosen].ln() as f32, raw_logprob: log_softmax_at(logits, token) }
    }

    /// [`Sampler::sample`] from the logits as `edits` leave them (vLLM's logits processors:
    /// min_tokens' bans, the penalties); the raw log-prob stays the model's own.
    pub fn sample_edited(&self, logits: &[f32], u: f32, edits: &RowEdits) -> Sampled {
        if edits.is_identity() {
            return self.sample(logits, u);
        }
        let mut edited = logits.to_vec();
        edits.apply(&mut edited);
        let sampled = self.sample(&edited, u);
        Sampled { raw_logprob: log_softmax_at(logits, sampled.token as usize), ..sampled }
    }

    /// Temperature-scaled logits `logits / temperature`, in f32 as the device computes them.
    fn scaled(&self, logits: &[f32]) -> Vec<f32> {
        logits.iter().map(|&l| l / self.temperature).collect()
    }

    /// The tokens that may be sampled, in vocabulary order, and their probabilities (summing
    /// to 1): those whose scaled logit is at or above the cut of top-k, then top-p (on the
    /// top-k distribution), then min-p.
    pub fn distribution(&self, logits: &[f32]) -> (Vec<usize>, Vec<f64>) {
        let scaled = self.scaled(logits);
        let vocab = scaled.len();
        let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut cut = f32::NEG_INFINITY;
        if self.top_k > 0 && self.top_k < vocab {
            let mut sorted = scaled.clone();
            sorted.select_nth_unstable_by(self.top_k - 1, |a, b| b.total_cmp(a));
            cut = sorted[self.top_k - 1];
        }
        if self.top_p < 1.0 {
            // The largest cut whose kept mass reaches top_p: walk down the kept logits.
            let mut kept: Vec<f32> = scaled.iter().copied().filter(|&s| s >= cut).collect();
            kept.sort_unstable_by(|a, b| b.total_cmp(a));
            let weight = |s: f32| ((s - max) as f64).exp();
            let total: f64 = kept.iter().map(|&s| weight(s)).sum();
            let mut mass = 0.0;
            for (i, &s) in kept.iter().enumerate() {
                mass += weight(s);
                // Ties at the cut are kept together: stop at the last of equal logits.
                if mass >= self.top_p as f64 * total && kept.get(i + 1) != Some(&s) {
                    cut = s;
                    break;
                }
            }
        }
        if self.min_p > 0.0 {
            cut = cut.max(max + self.min_p.ln());
        }
        // (a −∞ logit, a banned token's, is never kept)
        let tokens: Vec<usize> = (0..vocab).filter(|&i| scaled[i] >= cut && scaled[i] > f32::NEG_INFINITY).collect();
        let weights: Vec<f64> = tokens.iter().map(|&i| ((scaled[i] - max) as f64).exp()).collect();
        let sum: f64 = weights.iter().sum();
        (tokens, weights.into_iter().map(|w| w / sum).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOGITS: [f32; 6] = [2.0, 1.0, 0.5, 0.0, -1.0, 1.5];

    fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
        let e: Vec<f64> = logits.iter().map(|&l| (l as f64 / t).exp()).collect();
        let s: f64 = e.iter().sum();
        e.into_iter().map(|x| x / s).collect()
    }

    /// Pearson chi-square statistic of `counts` against `expected` probabilities.
    fn chi_square(counts: &[usize], expected: &[f64]) -> f64 {
        let n: usize = counts.iter().sum();
        counts.iter().zip(expected).map(|(&o, &p)| (o as f64 - n as f64 * p).powi(2) / (n as f64 * p)).sum()
    }

    /// Token counts over `draws` steps of one sample's stream under `seed`.
    fn counts(sampler: Sampler, draws: usize, seed: u64) -> Vec<usize> {
        let mut counts = vec![0; LOGITS.len()];
        for step in 0..draws {
            counts[sampler.sample(&LOGITS, uniform(seed, 0, 0, step)).token as usize] += 1;
        }
        counts
    }

    /// A temperature too small to divide by decodes greedily (vLLM's rule), and a row of NaN
    /// logits gives NaN log-probs (the engine's error) instead of a panic.
    #[test]
    fn tiny_temperatures_are_greedy_and_nan_rows_do_not_panic() {
        for temperature in [1e-40, 1e-6] {
            let sampler = Sampler { temperature, top_p: 0.9, ..Sampler::default() };
            assert!(sampler.is_greedy());
            assert_eq!(sampler.sample(&LOGITS, 0.99), Sampled { token: 0, logprob: 0.0, raw_logprob: log_softmax_at(&LOGITS, 0) });
        }
        assert!(!Sampler { temperature: GREEDY_BELOW, ..Sampler::default() }.is_greedy());
        let nan = Sampler { temperature: 1.0, ..Sampler::default() }.sample(&[f32::NAN; 6], 0.5);
        assert!(nan.logprob.is_nan() && nan.raw_logprob.is_nan(), "{nan:?}");
    }

    #[test]
    fn temperature_sampling_matches_softmax_frequencies() {
        let sampler = Sampler { temperature: 0.7, ..Sampler::default() };
        let counts = counts(sampler, 30_000, 7);
        // 5 degrees of freedom: P(chi2 > 20.52) = 0.001.
        let chi2 = chi_square(&counts, &softmax(&LOGITS, 0.7));
        assert!(chi2 < 20.52, "chi2 = {chi2}, counts = {counts:?}");
    }

    #[test]
    fn top_k_top_p_and_min_p_truncate_then_renormalise() {
        // top-k 3 keeps logits 2.0, 1.5, 1.0 (tokens 0, 5, 1).
        let sampler = Sampler { top_k: 3, ..Sampler::default() };
        let c = counts(sampler, 30_000, 11);
        assert_eq!(c[2] + c[3] + c[4], 0);
        let p = softmax(&[2.0, 1.5, 1.0], 1.0);
        let chi2 = chi_square(&[c[0], c[5], c[1]], &p);
        assert!(chi2 < 13.82, "chi2 = {chi2}"); // 2 dof, p = 0.001

        // top-p: at T=1 the sorted probabilities are .420 (token 0), .255 (5), .154 (1), ...;
        // p = 0.7 keeps tokens 0, 5, 1 (mass before token 1 is .674 < .7, before the next .829).
        let sampler = Sampler { top_p: 0.7, ..Sampler::default() };
        let (tokens, probs) = sampler.distribution(&LOGITS);
        assert_eq!(tokens, vec![0, 1, 5]);
        assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let c = counts(sampler, 30_000, 13);
        assert_eq!(c[2] + c[3] + c[4], 0);
        assert!(chi_square(&[c[0], c[1], c[5]], &probs) < 13.82);

        // min-p 0.3 keeps p >= 0.3 · p_max, logits >= 2 + ln 0.3 = 0.796: tokens 0, 1, 5. At
        // T = 2 the cut is on the scaled logits: 1 + ln 0.3 = -0.204 keeps 0.5 / 2 and 0 / 2 too.
        let sampler = Sampler { min_p: 0.3, ..Sampler::default() };
        assert_eq!(sampler.distribution(&LOGITS).0, vec![0, 1, 5]);
        let sampler = Sampler { temperature: 2.0, min_p: 0.3, ..Sampler::default() };
        assert_eq!(sampler.distribution(&LOGITS).0, vec![0, 1, 2, 3, 5]);

        // Ties at a cut stay in together.
        let tied = [1.0, 3.0, 1.0, 0.0];
        assert_eq!(Sampler { top_k: 2, ..Sampler::default() }.distribution(&tied).0, vec![0, 1, 2]);
        assert_eq!(Sampler { top_p: 0.8, ..Sampler::default() }.distribution(&tied).0, vec![0, 1, 2]);
    }

    #[test]
    fn logprobs_are_reported_under_both_distributions() {
        let s = Sampler { temperature: 0.5, ..Sampler::default() }.sample(&LOGITS, uniform(3, 0, 0, 0));
        let raw = softmax(&LOGITS, 1.0)[s.token as usize].ln();
        let tempered = softmax(&LOGITS, 0.5)[s.token as usize].ln();
        assert!((s.raw_logprob as f64 - raw).abs() < 1e-6);
        assert!((s.logprob as f64 - tempered).abs() < 1e-6);

        let g = Sampler::greedy().sample(&LOGITS, 0.5);
        assert_eq!((g.token, g.logprob), (0, 0.0));
        assert!((g.raw_logprob as f64 - softmax(&LOGITS, 1.0)[0].ln()).abs() < 1e-6);
    }

    #[test]
    fn inverse_cdf_in_vocabulary_order() {
        // Probabilities at T = 1 in vocabulary order: .420, .155, .094, .057, .021, .255.
        let p = softmax(&LOGITS, 1.0);
        let sampler = Sampler::default();
        let mut below = 0.0;
        for (i, &pi) in p.iter().enumerate() {
            for u in [below + 1e-4, below + pi - 1e-4] {
                assert_eq!(sampler.sample(&LOGITS, u as f32).token as usize, i, "u = {u}");
            }
            below += pi;
        }
    }

    #[test]
    fn the_uniform_stream_is_keyed_and_in_range() {
        let a: Vec<f32> = (0..1000).map(|s| uniform(5, 2, 1, s)).collect();
        assert!(a.iter().all(|&u| u > 0.0 && u < 1.0));
        // Any step can be drawn alone, in any order.
        assert_eq!(uniform(5, 2, 1, 737), a[737]);
        // Different keys give different streams.
        for other in [uniform(6, 2, 1, 0), uniform(5, 3, 1, 0), uniform(5, 2, 0, 0), uniform(5, 1, 2, 0)] {
            assert_ne!(other, a[0]);
        }
        let mean = a.iter().map(|&u| u as f64).sum::<f64>() / a.len() as f64;
        assert!((mean - 0.5).abs() < 0.03, "mean {mean}");
    }
}
