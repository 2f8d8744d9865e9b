//! The two pass@k estimators of the reference, which must be kept apart (`docs/interplay.md` §9):
//! the unbiased combinatorial one over answer exact match (`eval_checkpoints.py`, §8.1) and the
//! ordered empirical one over strict graph results (`aggregate_graph_pass_results.py`, §8.5).

use super::exact::uint_ratio_to_f64;

/// `_pass_probability(n, c, k)`: `1 − C(n−c, k) / C(n, k)` (0 if `k > n` or `c = 0`, 1 if
/// `n − c < k`), with the ratio of exact binomials rounded once, as Python does.
pub fn pass_probability(n: u64, successes: u64, k: u64) -> f64 {
    if k == 0 || n < k || successes == 0 {
        return 0.0;
    }
    let failures = n.saturating_sub(successes);
    if failures < k {
        return 1.0;
    }
    match (binomial(failures, k), binomial(n, k)) {
        (Some(num), Some(den)) => 1.0 - uint_ratio_to_f64(num, den),
        // Beyond u128 (n in the hundreds): the product form, rounded per factor.
        _ => {
            1.0 - (0..k)
                .map(|i| (failures - i) as f64 / (n - i) as f64)
                .product::<f64>()
        }
    }
}

fn binomial(n: u64, k: u64) -> Option<u128> {
    let k = k.min(n - k);
    let mut c: u128 = 1;
    for i in 0..k {
        c = c.checked_mul(u128::from(n - i))? / u128::from(i + 1);
    }
    Some(c)
}

/// `_build_k_values(max_samples, max_k)`: 1, 2, 4, … below the target (`max_k`, or
/// `max_samples` when unset), plus the target, keeping those `≤ max_samples`.
pub fn k_values(max_samples: u64, max_k: Option<u64>) -> Vec<u64> {
    if max_samples == 0 {
        return Vec::new();
    }
    let target = max_k.filter(|&k| k > 0).unwrap_or(max_samples).max(1);
    let mut ks = vec![1];
    let mut cur: u64 = 2;
    while cur < target {
        ks.push(cur);
        // Python's ints do not overflow: past 2^63 no further power of two is below a u64 target.
        let Some(next) = cur.checked_mul(2) else { break };
        cur = next;
    }
    if *ks.last().expect("non-empty") != target {
        ks.push(target);
    }
    ks.sort_unstable();
    ks.dedup();
    ks.retain(|&k| k <= max_samples);
    ks
}

/// `_compute_pass_series`: for each k, the mean of [`pass_probability`] over the prompts with at
/// least k samples, summed in the given order. `counts` are `(samples, successes)` per prompt.
pub fn pass_series(counts: &[(u64, u64)], max_k: Option<u64>) -> Vec<(u64, f64)> {
    let Some(max_samples) = counts.iter().map(|&(n, _)| n).max() else {
        return Vec::new();
    };
    k_values(max_samples, max_k)
        .into_iter()
        .map(|k| {
            let eligible: Vec<f64> = counts
                .iter()
                .filter(|&&(n, _)| n >= k)
                .map(|&(n, c)| pass_probability(n, c, k))
                .collect();
            let value = if eligible.is_empty() {
                0.0
            } else {
                eligible.iter().sum::<f64>() / eligible.len() as f64
            };
            (k, value)
        })
        .collect()
}

/// `filter_pass_ks(DEFAULT_PASS_AT, max_rank)`: the ks `≤ max_rank + 1`, with `max_rank + 1`
/// appended when it is not already the last one.
pub fn ordered_ks(candidates: &[u64], max_rank: u64) -> Vec<u64> {
    let mut ks: Vec<u64> = candidates
        .iter()
        .copied()
        .filter(|&k| k > 0 && k <= max_rank + 1)
        .collect();
    ks.sort_unstable();
    ks.dedup();
    if ks.last() != Some(&(max_rank + 1)) {
        ks.push(max_rank + 1);
    }
    ks
}

/// `compute_pass_rates`: for each k, the fraction of prompts whose earliest perfect sample rank
/// is below k (the ordered empirical estimator). `earliest` holds one entry per prompt.
pub fn ordered_pass_rates(earliest: &[Option<u64>], ks: &[u64]) -> Vec<f64> {
    let total = earliest.len();
    ks.iter()
        .map(|&k| {
            if total == 0 {
                return 0.0;
            }
            let hits = earliest
                .iter()
                .filter(|rank| rank.is_some_and(|r| r < k))
                .count();
            hits as f64 / total as f64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unbiased_matches_python() {
        // 1 - comb(120, 64) / comb(128, 64) in Python
        assert_eq!(pass_probability(128, 8, 64), 0.9969041357232079);
        assert_eq!(pass_probability(5, 1, 1), 1.0 - 4.0 / 5.0);
        assert_eq!(pass_probability(5, 0, 2), 0.0);
        assert_eq!(pass_probability(5, 4, 2), 1.0);
        assert_eq!(pass_probability(4, 1, 5), 0.0);
        assert_eq!(k_values(5, Some(5)), vec![1, 2, 4, 5]);
        assert_eq!(k_values(5, Some(128)), vec![1, 2, 4]);
        assert_eq!(k_values(128, Some(128)), vec![1, 2, 4, 8, 16, 32, 64, 128]);
        // `--sample-k` near 2^64: the doubling stops at 2^63 (it wrapped to 0 and never ended).
        assert_eq!(k_values(5, Some(u64::MAX)), vec![1, 2, 4]);
        let all = k_values(u64::MAX, Some(u64::MAX));
        assert_eq!((all.len(), all[63], all[64]), (65, 1 << 63, u64::MAX));
        let series = pass_series(&[(5, 1), (4, 4)], Some(5));
        assert_eq!(
            series.iter().map(|s| s.0).collect::<Vec<_>>(),
            vec![1, 2, 4, 5]
        );
        assert_eq!(series[3].1, 1.0);
    }

    #[test]
    fn ordered() {
        let ks = ordered_ks(&[1, 2, 4, 8, 16, 32, 64, 128], 4);
        assert_eq!(ks, vec![1, 2, 4, 5]);
        assert_eq!(ordered_ks(&[1, 2, 4, 8], 3), vec![1, 2, 4]);
        assert_eq!(
            ordered_pass_rates(&[Some(0), Some(3), None, Some(1)], &[1, 2, 4, 5]),
            vec![0.25, 0.5, 0.75, 0.75]
        );
    }
}
