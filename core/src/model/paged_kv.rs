//! A paged KV cache for decoding on the CPU (the Flex backend's fused path, f32): keys and
//! values live in fixed-size blocks of [`BLOCK`] positions (all layers' in one allocation), and
//! each sequence is a list of blocks, its block table (vLLM's PagedAttention layout). A
//! sequence joins by taking blocks and leaves by giving them back: nothing else is copied, unlike
//! a batch-shaped cache, which is gathered again whenever its rows change. A prompt's blocks are
//! shared by its `n` samples ([`PagedKv::fork`]); the last one, partly filled, is copied when a
//! sample first writes into it (copy on write). A sequence holds no padding, so attention
//! reads exactly its own positions ([`crate::model::fused::attention::decode_paged`]).
//!
//! Layout of a block: for each layer, keys then values, each `[BLOCK, K, d]`.

/// Positions per block: a multiple of 16 (the decoding kernel's groups of keys), large enough
/// that a block's keys are one long stream, small enough that a prompt's last block, copied by
/// each of its samples, is little.
pub const BLOCK: usize = 64;

/// A sequence held by a [`PagedKv`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SeqId(usize);

#[derive(Debug, Clone)]
struct Seq {
    blocks: Vec<usize>,
    len: usize,
}

/// Keys and values of many sequences in shared blocks; see the module docs.
#[derive(Debug)]
pub struct PagedKv {
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    blocks: Vec<Box<[f32]>>,
    /// Sequences holding each block (0: free).
    refs: Vec<u32>,
    free: Vec<usize>,
    seqs: Vec<Option<Seq>>,
    free_seqs: Vec<usize>,
}

impl PagedKv {
    /// An empty cache for a model of `layers` decoder layers with `kv_heads` heads of
    /// `head_dim`; blocks are allocated as sequences need them and reused once freed.
    pub fn new(layers: usize, kv_heads: usize, head_dim: usize) -> Self {
        Self { layers, kv_heads, head_dim, blocks: Vec::new(), refs: Vec::new(), free: Vec::new(), seqs: Vec::new(), free_seqs: Vec::new() }
    }

    /// Values of one layer's keys (or values) in a block: `[BLOCK, K, d]`.
    fn part(&self) -> usize {
        BLOCK * self.kv_heads * self.head_dim
    }

    /// Where layer `layer`'s keys and its values start in a block.
    fn offsets(&self, layer: usize) -> (usize, usize) {
        (2 * layer * self.part(), (2 * layer + 1) * self.part())
    }

    /// Bytes of one block (every layer's keys and values, f32).
    pub fn block_bytes(&self) -> u64 {
        (2 * self.layers * self.part() * 4) as u64
    }

    /// Blocks holding some sequence's positions.
    pub fn blocks_in_use(&self) -> usize {
        self.blocks.len() - self.free.len()
    }

    /// Bytes of the blocks in use.
    pub fn bytes_in_use(&self) -> u64 {
        self.blocks_in_use() as u64 * self.block_bytes()
    }

    fn seq(&self, seq: SeqId) -> &Seq {
        self.seqs[seq.0].as_ref().expect("a live sequence")
    }

    fn alloc(&mut self) -> usize {
        if let Some(b) = self.free.pop() {
            self.refs[b] = 1;
            return b;
        }
        self.blocks.push(vec![0.0; 2 * self.layers * self.part()].into_boxed_slice());
        self.refs.push(1);
        self.blocks.len() - 1
    }

    fn add_seq(&mut self, seq: Seq) -> SeqId {
        match self.free_seqs.pop() {
            Some(i) => {
                self.seqs[i] = Some(seq);
                SeqId(i)
            }
            None => {
                self.seqs.push(Some(seq));
                SeqId(self.seqs.len() - 1)
            }
        }
    }

    /// A new sequence of `len` positions (a prefilled prompt), whose keys and values each layer
    /// then writes with [`PagedKv::fill`].
    pub fn insert(&mut self, len: usize) -> SeqId {
        let blocks: Vec<usize> = (0..len.div_ceil(BLOCK)).map(|_| self.alloc()).collect();
        self.add_seq(Seq { blocks, len })
    }

    /// Writes layer `layer`'s keys and values of all positions of `seq`: `k` and `v` `[len,
    /// K, d]` contiguous (a prefill's cache row, its padding left out).
    pub fn fill(&mut self, seq: SeqId, layer: usize, k: &[f32], v: &[f32]) {
        let ((ko, vo), per_position) = (self.offsets(layer), self.kv_heads * self.head_dim);
        let Seq { blocks, len } = self.seqs[seq.0].as_ref().expect("a live sequence");
        assert!(k.len() == len * per_position && v.len() == k.len(), "layer {layer}: {} keys for {len} positions", k.len());
        for (i, &b) in blocks.iter().enumerate() {
            let (from, to) = (i * BLOCK * per_position, ((i + 1) * BLOCK).min(*len) * per_position);
            let block = &mut self.blocks[b];
            block[ko..][..to - from].copy_from_slice(&k[from..to]);
            block[vo..][..to - from].copy_from_slice(&v[from..to]);
        }
    }

    /// Blocks `seq` has yet to take to hold `end` positions: new blocks past its last, and a
    /// copy of its last block where that is partly filled and shared.
    pub fn blocks_to_grow(&self, seq: SeqId, end: usize) -> usize {
        let seq = self.seq(seq);
        let copy = !seq.len.is_multiple_of(BLOCK) && end > seq.len && seq.blocks.last().is_some_and(|&b| self.refs[b] > 1);
        end.div_ceil(BLOCK).saturating_sub(seq.blocks.len()) + copy as usize
    }

    /// A new sequence sharing every block of `seq` (a prompt's cache fanned out to a sample).
    pub fn fork(&mut self, seq: SeqId) -> SeqId {
        let copy = self.seq(seq).clone();
        for &b in &copy.blocks {
            self.refs[b] += 1;
        }
        self.add_seq(copy)
    }

    /// Ends `seq`, freeing the blocks no other sequence holds.
    pub fn release(&mut self, seq: SeqId) {
        let gone = self.seqs[seq.0].take().expect("a live sequence");
        self.free_seqs.push(seq.0);
        for b in gone.blocks {
            self.refs[b] -= 1;
            if self.refs[b] == 0 {
                self.free.push(b);
            }
        }
    }

    /// Makes room for one more position in each of `seqs`: a new block where the last is full,
    /// a private copy of it where another sequence shares it. Then [`PagedKv::write`] every
    /// layer, and [`PagedKv::advance`].
    pub fn reserve(&mut self, seqs: &[SeqId]) {
        for &s in seqs {
            let (len, last) = {
                let seq = self.seq(s);
                (seq.len, seq.blocks.get(seq.len / BLOCK).copied())
            };
            let block = match last {
                None => self.alloc(),
                Some(b) if self.refs[b] > 1 => {
                    let copy = self.alloc();
                    let (src, dst) = if b < copy {
                        let (lo, hi) = self.blocks.split_at_mut(copy);
                        (&lo[b], &mut hi[0])
                    } else {
                        let (lo, hi) = self.blocks.split_at_mut(b);
                        (&hi[0], &mut lo[copy])
                    };
                    dst.copy_from_slice(src);
                    self.refs[b] -= 1;
                    copy
                }
                Some(_) => continue,
            };
            let seq = self.seqs[s.0].as_mut().expect("a live sequence");
            match seq.blocks.get_mut(len / BLOCK) {
                Some(slot) => *slot = block,
                None => seq.blocks.push(block),
            }
        }
    }

    /// Writes layer `layer`'s keys and values of the next position of each of `seqs`: `k` and
    /// `v` `[seqs, K, d]`. [`PagedKv::reserve`] first.
    pub fn write(&mut self, layer: usize, seqs: &[SeqId], k: &[f32], v: &[f32]) {
        let ((ko, vo), n) = (self.offsets(layer), self.kv_heads * self.head_dim);
        assert!(k.len() == seqs.len() * n && v.len() == k.len());
        for (i, &s) in seqs.iter().enumerate() {
            let seq = self.seqs[s.0].as_ref().expect("a live sequence");
            let (b, at) = (seq.blocks[seq.len / BLOCK], seq.len % BLOCK * n);
            debug_assert_eq!(self.refs[b], 1, "reserve() gives a sequence its own last block");
            let block = &mut self.blocks[b];
            block[ko + at..][..n].copy_from_slice(&k[i * n..(i + 1) * n]);
            block[vo + at..][..n].copy_from_slice(&v[i * n..(i + 1) * n]);
        }
    }

    /// Counts the position written by [`PagedKv::write`] in each of `seqs`.
    pub fn advance(&mut self, seqs: &[SeqId]) {
        for &s in seqs {
            self.seqs[s.0].as_mut().expect("a live sequence").len += 1;
        }
    }

    /// Decoding attention of layer `layer`: each of `seqs` attends with its query (`q`
    /// `[seqs, H, d]`, after RoPE) to its cached positions and the one just written. Returns
    /// `[seqs, H, d]`.
    #[cfg(feature = "flex")]
    pub fn attend(&self, layer: usize, seqs: &[SeqId], q: &[f32], heads: usize) -> Vec<f32> {
        use super::fused::attention::{PagedRow, decode_paged};
        let (part, (ko, vo)) = (self.part(), self.offsets(layer));
        let rows: Vec<PagedRow<'_>> = seqs
            .iter()
            .map(|&s| {
                let seq = self.seq(s);
                let blocks = || seq.blocks.iter().map(|&b| &self.blocks[b][..]);
                PagedRow {
                    len: seq.len + 1,
                    keys: blocks().map(|b| &b[ko..][..part]).collect(),
                    values: blocks().map(|b| &b[vo..][..part]).collect(),
                }
            })
            .collect();
        decode_paged(heads, self.kv_heads, self.head_dim, BLOCK, q, &rows, 1.0 / (self.head_dim as f32).sqrt())
    }

    /// Without the `flex` feature no model hands out a paged cache ([`crate::model::Qwen2::new_paged_kv`]).
    #[cfg(not(feature = "flex"))]
    pub fn attend(&self, _layer: usize, _seqs: &[SeqId], _q: &[f32], _heads: usize) -> Vec<f32> {
        unreachable!("a paged KV cache exists only with the flex feature")
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use crate::model::fused::attention::{Dims, forward};

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2000) as f32 / 1000.0 - 1.0).collect()
    }

    /// Sequences decoded from shared, copied-on-write blocks give the contiguous kernel's
    /// output bit for bit: prompts of 1, 64 and 100 positions (block edges), fanned out to
    /// samples that then diverge for 70 steps.
    #[test]
    fn paged_decoding_equals_contiguous_attention() {
        let (layers, heads, kv_heads, d) = (2, 6, 2, 64);
        let n = kv_heads * d;
        let mut cache = PagedKv::new(layers, kv_heads, d);
        // Per sequence and layer: all keys and values so far, contiguous.
        let mut dense: Vec<Vec<(Vec<f32>, Vec<f32>)>> = Vec::new();
        let mut seqs = Vec::new();
        for (p, len) in [1usize, 64, 100].into_iter().enumerate() {
            let kv: Vec<(Vec<f32>, Vec<f32>)> = (0..layers).map(|l| (values(len * n, (p * 10 + l) as u32), values(len * n, (p * 10 + l + 5) as u32))).collect();
            let prompt = cache.insert(len);
            for (l, (k, v)) in kv.iter().enumerate() {
                cache.fill(prompt, l, k, v);
            }
            // A sample's first write copies a partly filled shared block; a full one it keeps.
            let sample = cache.fork(prompt);
            assert_eq!(cache.blocks_to_grow(sample, len + 70), (len + 70).div_ceil(BLOCK) - len.div_ceil(BLOCK) + (len % BLOCK != 0) as usize);
            cache.release(sample);
            for _ in 0..2 {
                seqs.push(cache.fork(prompt));
                dense.push(kv.clone());
            }
            cache.release(prompt);
        }
        // Shared: 1 + 1 + 2 blocks for the three prompts.
        assert_eq!(cache.blocks_in_use(), 4);
        for step in 0..70u32 {
            cache.reserve(&seqs);
            for layer in 0..layers {
                let (k, v, q) = (values(seqs.len() * n, 100 + step), values(seqs.len() * n, 200 + step + layer as u32), values(seqs.len() * heads * d, 300 + step));
                cache.write(layer, &seqs, &k, &v);
                let got = cache.attend(layer, &seqs, &q, heads);
                for (i, kv) in dense.iter_mut().enumerate() {
                    kv[layer].0.extend_from_slice(&k[i * n..(i + 1) * n]);
                    kv[layer].1.extend_from_slice(&v[i * n..(i + 1) * n]);
                    let keys = kv[layer].0.len() / n;
                    let dims = Dims { batch: 1, queries: 1, keys, heads, kv_heads, head_dim: d };
                    let (want, _) = forward(dims, &q[i * heads * d..(i + 1) * heads * d], &kv[layer].0, &kv[layer].1, &vec![1; keys], 1.0 / (d as f32).sqrt());
                    assert_eq!(got[i * heads * d..(i + 1) * heads * d], want[..], "step {step}, layer {layer}, sequence {i}");
                }
            }
            cache.advance(&seqs);
        }
        // 71, 134 and 170 positions: 2, 3 and 3 blocks for each of the two samples, less the
        // full first blocks of the last two prompts, which their samples still share.
        assert_eq!(cache.blocks_in_use(), 2 * (2 + 3 + 3) - 2);
        for s in seqs {
            cache.release(s);
        }
        assert_eq!(cache.blocks_in_use(), 0);
    }
}
