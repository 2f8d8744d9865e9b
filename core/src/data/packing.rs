//! Packing tokenized samples into fixed-length blocks for pre-training, as LLaMA-Factory's `pt`
//! stage does in the paper's setting: per preprocessing batch of samples, any sample of
//! `cutoff` tokens or more is first cut into full blocks, then the remainders are bin-packed
//! first-fit-decreasing into `cutoff`-token bins. Blocks are padded later, at batch time, and
//! packed samples attend to each other causally (no block-diagonal mask, no position reset).
//!
//! [`pack_ffd_documents`] packs the same bins but keeps each bin's documents apart, for
//! training without attention across documents and with positions restarting at each
//! (LLaMA-Factory's `neat_packing`; see `HostBatch::packed`).

/// The reference's preprocessing batch (`preprocessing_batch_size` default).
pub const PACKING_GROUP: usize = 1000;

/// Packs `samples` into blocks of at most `cutoff` tokens, `group` samples at a time.
pub fn pack_ffd(samples: Vec<Vec<u32>>, cutoff: usize, group: usize) -> Vec<Vec<u32>> {
    pack_ffd_documents(samples, cutoff, group).into_iter().map(|docs| docs.concat()).collect()
}

/// [`pack_ffd`]'s blocks as the documents (pieces of samples) each holds, in block order.
pub fn pack_ffd_documents(samples: Vec<Vec<u32>>, cutoff: usize, group: usize) -> Vec<Vec<Vec<u32>>> {
    assert!(cutoff > 0 && group > 0, "cutoff and group must be positive");
    let mut blocks = Vec::new();
    let mut samples = samples.into_iter().peekable();
    while samples.peek().is_some() {
        let batch: Vec<Vec<u32>> = samples.by_ref().take(group).collect();
        let mut rest = Vec::with_capacity(batch.len());
        for sample in batch {
            let full = sample.len() / cutoff * cutoff;
            blocks.extend(sample[..full].chunks(cutoff).map(|block| vec![block.to_vec()]));
            if full < sample.len() {
                rest.push(sample[full..].to_vec());
            }
        }
        blocks.extend(first_fit_decreasing(rest, Vec::len, cutoff));
    }
    blocks
}

/// Bins of at most `cutoff` length (an item longer than that alone in its own) over `items` of
/// lengths `len`, first fit decreasing; the stable sort keeps equal lengths in input order.
pub fn first_fit_decreasing<T>(mut items: Vec<T>, len: impl Fn(&T) -> usize, cutoff: usize) -> Vec<Vec<T>> {
    items.sort_by_key(|item| std::cmp::Reverse(len(item)));
    let mut bins: Vec<(usize, Vec<T>)> = Vec::new();
    for item in items {
        let n = len(&item);
        match bins.iter_mut().find(|(used, _)| used + n <= cutoff) {
            Some((used, bin)) => {
                *used += n;
                bin.push(item);
            }
            None => bins.push((n, vec![item])),
        }
    }
    bins.into_iter().map(|(_, bin)| bin).collect()
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
    fn documents_are_the_blocks_pieces() {
        let s = |n: usize, v: u32| vec![v; n];
        let samples = vec![s(3, 1), s(11, 2), s(6, 3), s(4, 4), s(2, 5)];
        let docs = pack_ffd_documents(samples.clone(), 8, 1000);
        assert_eq!(docs[0], vec![s(8, 2)]);
        assert_eq!(docs[1], vec![s(6, 3), s(2, 5)]);
        assert_eq!(docs[2], vec![s(4, 4), s(3, 1)]);
        let joined: Vec<Vec<u32>> = docs.into_iter().map(|d| d.concat()).collect();
        assert_eq!(joined, pack_ffd(samples, 8, 1000));
        // Longer than the bin: alone.
        assert_eq!(first_fit_decreasing(vec![s(2, 1), s(9, 2)], Vec::len, 8), vec![vec![s(9, 2)], vec![s(2, 1)]]);
    }

    #[test]
    fn packs_each_group_separately() {
        let blocks = pack_ffd(vec![vec![1; 3], vec![2; 3], vec![3; 3]], 8, 2);
        assert_eq!(blocks, vec![vec![1, 1, 1, 2, 2, 2], vec![3, 3, 3]]);
    }
}
