//! Packing tokenized samples into fixed-length blocks for pre-training, as LLaMA-Factory's `pt`
//! stage does in the paper's setting: per preprocessing batch of samples, any sample of
//! `cutoff` tokens or more is first cut into full blocks, then the remainders are bin-packed
//! first-fit-decreasing into `cutoff`-token bins. Blocks are padded later, at batch time, and
//! packed samples attend to each other causally (no block-diagonal mask, no position reset).

/// The reference's preprocessing batch (`preprocessing_batch_size` default).
pub const PACKING_GROUP: usize = 1000;

/// Packs `samples` into blocks of at most `cutoff` tokens, `group` samples at a time.
pub fn pack_ffd(samples: Vec<Vec<u32>>, cutoff: usize, group: usize) -> Vec<Vec<u32>> {
    assert!(cutoff > 0 && group > 0, "cutoff and group must be positive");
    let mut blocks = Vec::new();
    let mut samples = samples.into_iter().peekable();
    while samples.peek().is_some() {
        let batch: Vec<Vec<u32>> = samples.by_ref().take(group).collect();
        let mut rest = Vec::with_capacity(batch.len());
        for sample in batch {
            let full = sample.len() / cutoff * cutoff;
            blocks.extend(sample[..full].chunks(cutoff).map(<[u32]>::to_vec));
            if full < sample.len() {
                rest.push(sample[full..].to_vec());
            }
        }
        // First fit decreasing; the stable sort keeps equal lengths in input order.
        rest.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let mut bins: Vec<Vec<u32>> = Vec::new();
        for sample in rest {
            match bins.iter_mut().find(|b| b.len() + sample.len() <= cutoff) {
                Some(bin) => bin.extend(sample),
                None => bins.push(sample),
            }
        }
        blocks.extend(bins);
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_long_samples_then_packs_first_fit_decreasing() {
        let s = |n: usize, v: u32| vec![v; n];
        let blocks = pack_ffd(vec![s(3, 1), s(11, 2), s(6, 3), s(4, 4), s(2, 5)], 8, 1000);
        // 11 → one full block [2;8] + remainder 3; then FFD over [6, 4, 3(1), 3(2), 2].
        assert_eq!(blocks[0], s(8, 2));
        let rest: Vec<Vec<u32>> = blocks[1..].to_vec();
        assert_eq!(rest, vec![[s(6, 3), s(2, 5)].concat(), [s(4, 4), s(3, 1)].concat(), s(3, 2)]);
        assert!(blocks.iter().all(|b| b.len() <= 8));
        let tokens: usize = blocks.iter().map(Vec::len).sum();
        assert_eq!(tokens, 3 + 11 + 6 + 4 + 2, "nothing lost");
    }

    #[test]
    fn packs_each_group_separately() {
        let blocks = pack_ffd(vec![vec![1; 3], vec![2; 3], vec![3; 3]], 8, 2);
        assert_eq!(blocks, vec![vec![1, 1, 1, 2, 2, 2], vec![3, 3, 3]]);
    }
}
