//! Token sampling from one row of logits: greedy, temperature, top-k, top-p (in that order, as
//! `transformers` and vLLM apply them), returning the sampled token's log-probability both under
//! the distribution actually sampled from and under the model's unmodified distribution.

use rand::Rng;

/// Sampling knobs for one sequence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1 disables.
    pub top_p: f32,
}

/// One sampled token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// log p(token) under the distribution sampled from (temperature, top-k and top-p applied;
    /// 0 for greedy, a point mass). This is the behaviour policy of importance sampling.
    pub logprob: f32,
    /// log p(token) under the model's own softmax (temperature 1, no truncation).
    pub raw_logprob: f32,
}

impl Default for Sampler {
    fn default() -> Self {
        Self { temperature: 1.0, top_k: 0, top_p: 1.0 }
    }
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
        Self { temperature: 0.0, top_k: 0, top_p: 1.0 }
    }

    /// Checks the knobs: a finite temperature of at least 0 and `top_p` in (0, 1].
    pub fn check(&self) -> crate::Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(crate::Error::InvalidInput(format!("temperature must be a finite number >= 0 (got {})", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(crate::Error::InvalidInput(format!("top_p must be in (0, 1] (got {})", self.top_p)));
        }
        Ok(())
    }

    /// Whether this sampler is greedy.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Samples one token from `logits` (one row, length = vocabulary).
    pub fn sample(&self, logits: &[f32], rng: &mut impl Rng) -> Sampled {
        if self.is_greedy() {
            let token = argmax(logits);
            return Sampled { token: token as u32, logprob: 0.0, raw_logprob: log_softmax_at(logits, token) };
        }
        let (candidates, probs) = self.distribution(logits);
        let u: f64 = rng.random();
        let mut acc = 0.0;
        let mut chosen = candidates.len() - 1;
        for (i, &p) in probs.iter().enumerate() {
            acc += p;
            if u < acc {
                chosen = i;
                break;
            }
        }
        let token = candidates[chosen];
        Sampled { token: token as u32, logprob: probs[chosen].ln() as f32, raw_logprob: log_softmax_at(logits, token) }
    }

    /// The tokens that may be sampled and their probabilities (summing to 1).
    pub fn distribution(&self, logits: &[f32]) -> (Vec<usize>, Vec<f64>) {
        let t = self.temperature as f64;
        let vocab = logits.len();
        let top_k = if self.top_k == 0 { vocab } else { self.top_k.min(vocab) };
        let truncate = top_k < vocab || self.top_p < 1.0;
        let mut candidates: Vec<usize> = (0..vocab).collect();
        if truncate {
            let by_logit_desc = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
            // Sort only as many leading candidates as top-p needs: grow the sorted prefix
            // until its mass reaches `top_p` (or `top_k` is reached).
            let max = logits[argmax(logits)] as f64;
            let total: f64 = logits.iter().map(|&l| ((l as f64 - max) / t).exp()).sum();
            let mut keep = top_k.min(64);
            loop {
                if keep < vocab {
                    candidates.select_nth_unstable_by(keep, by_logit_desc);
                }
                candidates[..keep].sort_unstable_by(by_logit_desc);
                let mass: f64 = candidates[..keep].iter().map(|&i| ((logits[i] as f64 - max) / t).exp()).sum::<f64>() / total;
                if keep == top_k || mass >= self.top_p as f64 {
                    break;
                }
                keep = (keep * 2).min(top_k);
            }
            candidates.truncate(keep);
        }
        let max = candidates.iter().map(|&i| logits[i]).fold(f32::NEG_INFINITY, f32::max) as f64;
        let weights: Vec<f64> = candidates.iter().map(|&i| ((logits[i] as f64 - max) / t).exp()).collect();
        let sum: f64 = weights.iter().sum();
        let mut probs: Vec<f64> = weights.into_iter().map(|w| w / sum).collect();
        if self.top_p < 1.0 {
            // Keep token i while the mass before it is below top_p (at least one token).
            let mut before = 0.0;
            let kept = probs.iter().take_while(|&&p| {
                let keep = before < self.top_p as f64;
                before += p;
                keep
            });
            let kept = kept.count().max(1);
            candidates.truncate(kept);
            probs.truncate(kept);
            let sum: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= sum);
        }
        (candidates, probs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

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

    fn counts(sampler: Sampler, draws: usize, seed: u64) -> Vec<usize> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut counts = vec![0; LOGITS.len()];
        for _ in 0..draws {
            counts[sampler.sample(&LOGITS, &mut rng).token as usize] += 1;
        }
        counts
    }

    #[test]
    fn temperature_sampling_matches_softmax_frequencies() {
        let sampler = Sampler { temperature: 0.7, top_k: 0, top_p: 1.0 };
        let counts = counts(sampler, 30_000, 7);
        // 5 degrees of freedom: P(chi2 > 20.52) = 0.001.
        let chi2 = chi_square(&counts, &softmax(&LOGITS, 0.7));
        assert!(chi2 < 20.52, "chi2 = {chi2}, counts = {counts:?}");
    }

    #[test]
    fn top_k_and_top_p_truncate_then_renormalise() {
        // top-k 3 keeps logits 2.0, 1.5, 1.0 (tokens 0, 5, 1).
        let sampler = Sampler { temperature: 1.0, top_k: 3, top_p: 1.0 };
        let c = counts(sampler, 30_000, 11);
        assert_eq!(c[2] + c[3] + c[4], 0);
        let p = softmax(&[2.0, 1.5, 1.0], 1.0);
        let chi2 = chi_square(&[c[0], c[5], c[1]], &p);
        assert!(chi2 < 13.82, "chi2 = {chi2}"); // 2 dof, p = 0.001

        // top-p: at T=1 the sorted probabilities are .420 (token 0), .255 (5), .154 (1), ...;
        // p = 0.7 keeps tokens 0, 5, 1 (mass before token 1 is .674 < .7, before the next .829).
        let sampler = Sampler { temperature: 1.0, top_k: 0, top_p: 0.7 };
        let (tokens, probs) = sampler.distribution(&LOGITS);
        assert_eq!(tokens, vec![0, 5, 1]);
        assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let c = counts(sampler, 30_000, 13);
        assert_eq!(c[2] + c[3] + c[4], 0);
        assert!(chi_square(&[c[0], c[5], c[1]], &probs) < 13.82);
    }

    #[test]
    fn logprobs_are_reported_under_both_distributions() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let s = Sampler { temperature: 0.5, top_k: 0, top_p: 1.0 }.sample(&LOGITS, &mut rng);
        let raw = softmax(&LOGITS, 1.0)[s.token as usize].ln();
        let tempered = softmax(&LOGITS, 0.5)[s.token as usize].ln();
        assert!((s.raw_logprob as f64 - raw).abs() < 1e-6);
        assert!((s.logprob as f64 - tempered).abs() < 1e-6);

        let g = Sampler::greedy().sample(&LOGITS, &mut rng);
        assert_eq!((g.token, g.logprob), (0, 0.0));
        assert!((g.raw_logprob as f64 - softmax(&LOGITS, 1.0)[0].ln()).abs() < 1e-6);
    }

    #[test]
    fn same_seed_same_samples() {
        let sampler = Sampler { temperature: 1.0, top_k: 0, top_p: 0.9 };
        assert_eq!(counts(sampler, 500, 5), counts(sampler, 500, 5));
    }
}
