//! A paged KV cache for decoding: keys and values live in fixed-size blocks of [`BLOCK`]
//! positions, and each sequence is a list of blocks, its block table (vLLM's PagedAttention
//! layout). A sequence joins by taking blocks and leaves by giving them back: nothing else is
//! copied, unlike a batch-shaped cache, which is gathered again whenever its rows change. A
//! prompt's blocks are shared by its `n` samples ([`PagedKv::fork`]); the last one, partly
//! filled, is copied when a sample first writes into it (copy on write). A sequence holds no
//! padding, so attention reads exactly its own positions.
//!
//! The blocks live where decoding reads them:
//! - in host memory ([`PagedKv::new`]) for the CPU's fused path (the Flex backend, f32), one
//!   allocation per block holding, for each layer, keys then values `[BLOCK, K, d]`; attention
//!   is [`crate::model::fused::attention::decode_paged`];
//! - in device memory ([`PagedKv::on_device`]) where the backend has a flash-decoding kernel
//!   ([`crate::model::kernels::Kernels::paged_decode`]: wgpu and CUDA), one pool per layer for
//!   keys and one for values, `[blocks·BLOCK, K, d]` in the activations' dtype, grown by half
//!   when full; new keys are scattered into their slots in place, and only the block tables go
//!   to the device each step.
//!
//! The bookkeeping (tables, reference counts, free lists) is the same for both.

use burn::tensor::activation::softmax;
use burn::tensor::{DType, IndexingUpdateOp, Int, Tensor, TensorData, backend::Backend};

use super::proj::to_dtype;

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

impl Seq {
    /// Where position `p` lies: its row in a device pool, `[blocks·BLOCK]`.
    fn slot(&self, p: usize) -> i64 {
        (self.blocks[p / BLOCK] * BLOCK + p % BLOCK) as i64
    }
}

/// Keys and values of many sequences in shared blocks; see the module docs.
#[derive(Debug)]
pub struct PagedKv<B: Backend> {
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    store: Store<B>,
    /// Sequences holding each block (0: free); its length is the blocks allocated.
    refs: Vec<u32>,
    free: Vec<usize>,
    seqs: Vec<Option<Seq>>,
    free_seqs: Vec<usize>,
}

/// Where the blocks live.
#[derive(Debug)]
enum Store<B: Backend> {
    /// One allocation per block: for each layer, keys then values `[BLOCK, K, d]`, f32.
    Host(Vec<Box<[f32]>>),
    Device(DevicePools<B>),
}

/// Blocks in device memory: per layer, keys and values `[capacity·BLOCK, K, d]`.
#[derive(Debug)]
struct DevicePools<B: Backend> {
    /// `None` before the first block is allocated, and while a layer's pool is being replaced
    /// (written in place).
    pools: Vec<Option<[Tensor<B, 3>; 2]>>,
    /// Blocks the pools hold.
    capacity: usize,
    /// The most blocks a pool may hold (the device's largest buffer).
    max_blocks: Option<usize>,
    dtype: DType,
    device: B::Device,
    /// The running step's tensors, from [`PagedKv::reserve`] to [`PagedKv::advance`].
    step: Option<Step<B>>,
}

/// What every layer of one decoding step reads: the slot each row writes `[R, 1]`, the rows'
/// block tables `[R, W]` (padded with block 0) and keys to read `[R]`, and the most of those.
#[derive(Debug, Clone)]
struct Step<B: Backend> {
    slots: Tensor<B, 2, Int>,
    table: Tensor<B, 2, Int>,
    lens: Tensor<B, 1, Int>,
    max_len: usize,
}

impl<B: Backend> PagedKv<B> {
    /// An empty cache in host memory (the CPU's fused path) for a model of `layers` decoder
    /// layers with `kv_heads` heads of `head_dim`; blocks are allocated as sequences need them
    /// and reused once freed.
    pub fn new(layers: usize, kv_heads: usize, head_dim: usize) -> Self {
        Self::with_store(layers, kv_heads, head_dim, Store::Host(Vec::new()))
    }

    /// An empty cache in the memory of `device`, blocks of `dtype`, decoded by the backend's
    /// [`crate::model::kernels::Kernels::paged_decode`].
    pub fn on_device(layers: usize, kv_heads: usize, head_dim: usize, dtype: DType, device: &B::Device) -> Self {
        let part = (BLOCK * kv_heads * head_dim * dtype.size()) as u64;
        let max_blocks = kiln_backends::device::max_buffer::<B>(device).map(|bytes| (bytes / part.max(1)) as usize);
        let pools = DevicePools { pools: (0..layers).map(|_| None).collect(), capacity: 0, max_blocks, dtype, device: device.clone(), step: None };
        Self::with_store(layers, kv_heads, head_dim, Store::Device(pools))
    }

    fn with_store(layers: usize, kv_heads: usize, head_dim: usize, store: Store<B>) -> Self {
        Self { layers, kv_heads, head_dim, store, refs: Vec::new(), free: Vec::new(), seqs: Vec::new(), free_seqs: Vec::new() }
    }

    /// Allocates device memory for `blocks` blocks at once (the pools otherwise grow by half
    /// when full, copying what they hold); nothing for blocks in host memory.
    pub fn preallocate(&mut self, blocks: usize) {
        let (kv_heads, head_dim) = (self.kv_heads, self.head_dim);
        if let Store::Device(pools) = &mut self.store {
            pools.grow_to(blocks, kv_heads, head_dim);
        }
    }

    /// Whether the blocks live in device memory.
    pub fn is_on_device(&self) -> bool {
        matches!(self.store, Store::Device(_))
    }

    /// The most blocks the cache can hold, where the device bounds it (its largest buffer holds
    /// one layer's keys).
    pub fn max_blocks(&self) -> Option<usize> {
        match &self.store {
            Store::Host(_) => None,
            Store::Device(pools) => pools.max_blocks,
        }
    }

    /// Values of one layer's keys (or values) in a block: `[BLOCK, K, d]`.
    fn part(&self) -> usize {
        BLOCK * self.kv_heads * self.head_dim
    }

    /// Where layer `layer`'s keys and its values start in a block.
    fn offsets(&self, layer: usize) -> (usize, usize) {
        (2 * layer * self.part(), (2 * layer + 1) * self.part())
    }

    /// Bytes of one block (every layer's keys and values).
    pub fn block_bytes(&self) -> u64 {
        let element = match &self.store {
            Store::Host(_) => 4,
            Store::Device(pools) => pools.dtype.size(),
        };
        (2 * self.layers * self.part() * element) as u64
    }

    /// Blocks holding some sequence's positions.
    pub fn blocks_in_use(&self) -> usize {
        self.refs.len() - self.free.len()
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
        let (block, size) = (self.refs.len(), 2 * self.layers * self.part());
        match &mut self.store {
            Store::Host(blocks) => blocks.push(vec![0.0; size].into_boxed_slice()),
            Store::Device(pools) if block == pools.capacity => pools.grow(self.kv_heads, self.head_dim),
            Store::Device(_) => {}
        }
        self.refs.push(1);
        block
    }

    /// Copies each `(src, dst)` block pair, every layer (on the device: one gather and one
    /// scatter per pool, so that the pool is written in place).
    fn copy_blocks(&mut self, pairs: &[(usize, usize)]) {
        if pairs.is_empty() {
            return;
        }
        match &mut self.store {
            Store::Host(blocks) => {
                for &(src, dst) in pairs {
                    let (src, dst) = if src < dst {
                        let (lo, hi) = blocks.split_at_mut(dst);
                        (&lo[src], &mut hi[0])
                    } else {
                        let (lo, hi) = blocks.split_at_mut(src);
                        (&hi[0], &mut lo[dst])
                    };
                    dst.copy_from_slice(src);
                }
            }
            Store::Device(pools) => {
                let rows = |block: usize| (block * BLOCK..(block + 1) * BLOCK).map(|r| r as i64);
                let src: Vec<i64> = pairs.iter().flat_map(|&(src, _)| rows(src)).collect();
                let dst: Vec<i64> = pairs.iter().flat_map(|&(_, dst)| rows(dst)).collect();
                let n = src.len();
                let src = Tensor::<B, 1, Int>::from_data(TensorData::new(src, [n]), &pools.device);
                let dst = Tensor::<B, 2, Int>::from_data(TensorData::new(dst, [n, 1]), &pools.device);
                for layer in 0..self.layers {
                    let [k, v] = pools.take(layer);
                    // `select` writes a new buffer (a slice would be a view of the pool, and the
                    // pool then copied whole to be written).
                    let copy = |t: Tensor<B, 3>| {
                        let blocks = t.clone().select(0, src.clone());
                        t.scatter_nd(dst.clone(), blocks, IndexingUpdateOp::Assign)
                    };
                    pools.pools[layer] = Some([copy(k), copy(v)]);
                }
            }
        }
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

    /// A new sequence of `len` positions (a prompt), whose keys and values the prefill then
    /// writes a layer at a time ([`PagedKv::fill_layer`]).
    pub fn insert(&mut self, len: usize) -> SeqId {
        let blocks: Vec<usize> = (0..len.div_ceil(BLOCK)).map(|_| self.alloc()).collect();
        self.add_seq(Seq { blocks, len })
    }

    /// Writes layer `layer`'s keys and values of all positions of `seq`: `k` and `v` `[len,
    /// K, d]` contiguous (a prefill's row, its padding left out).
    fn fill(&mut self, seq: SeqId, layer: usize, k: &[f32], v: &[f32]) {
        let ((ko, vo), per_position) = (self.offsets(layer), self.kv_heads * self.head_dim);
        let Seq { blocks, len } = self.seqs[seq.0].as_ref().expect("a live sequence");
        let Store::Host(store) = &mut self.store else { unreachable!("fill() is the host store's") };
        assert!(k.len() == len * per_position && v.len() == k.len(), "layer {layer}: {} keys for {len} positions", k.len());
        for (i, &b) in blocks.iter().enumerate() {
            let (from, to) = (i * BLOCK * per_position, ((i + 1) * BLOCK).min(*len) * per_position);
            let block = &mut store[b];
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
        let mut copies = Vec::new();
        for &s in seqs {
            let (len, last) = {
                let seq = self.seq(s);
                (seq.len, seq.blocks.get(seq.len / BLOCK).copied())
            };
            let block = match last {
                None => self.alloc(),
                Some(b) if self.refs[b] > 1 => {
                    let copy = self.alloc();
                    copies.push((b, copy));
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
        self.copy_blocks(&copies);
        if self.is_on_device() {
            let step = self.step_tensors(seqs);
            let Store::Device(pools) = &mut self.store else { unreachable!() };
            pools.step = Some(step);
        }
    }

    /// The device tensors of a step of `seqs` (see [`Step`]).
    fn step_tensors(&self, seqs: &[SeqId]) -> Step<B> {
        let Store::Device(pools) = &self.store else { unreachable!("a device store") };
        let rows = seqs.len();
        let width = seqs.iter().map(|&s| self.seq(s).blocks.len()).max().unwrap_or(0).max(1);
        let (mut slots, mut table, mut lens) = (Vec::with_capacity(rows), vec![0i64; rows * width], Vec::with_capacity(rows));
        for (r, &s) in seqs.iter().enumerate() {
            let seq = self.seq(s);
            slots.push(seq.slot(seq.len));
            for (i, &b) in seq.blocks.iter().enumerate() {
                table[r * width + i] = b as i64;
            }
            lens.push(seq.len as i64 + 1);
        }
        let max_len = lens.iter().copied().max().unwrap_or(0) as usize;
        let device = &pools.device;
        Step {
            slots: Tensor::from_data(TensorData::new(slots, [rows, 1]), device),
            table: Tensor::from_data(TensorData::new(table, [rows, width]), device),
            lens: Tensor::from_data(TensorData::new(lens, [rows]), device),
            max_len,
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
            let Store::Host(store) = &mut self.store else { unreachable!("write() is the host store's") };
            let block = &mut store[b];
            block[ko + at..][..n].copy_from_slice(&k[i * n..(i + 1) * n]);
            block[vo + at..][..n].copy_from_slice(&v[i * n..(i + 1) * n]);
        }
    }

    /// Counts the position written by [`PagedKv::write`] in each of `seqs`.
    pub fn advance(&mut self, seqs: &[SeqId]) {
        for &s in seqs {
            self.seqs[s.0].as_mut().expect("a live sequence").len += 1;
        }
        if let Store::Device(pools) = &mut self.store {
            pools.step = None;
        }
    }

    /// Decoding attention of layer `layer`: each of `seqs` attends with its query (`q`
    /// `[seqs, H, d]`, after RoPE) to its cached positions and the one just written. Returns
    /// `[seqs, H, d]`.
    #[cfg(feature = "flex")]
    pub fn attend(&self, layer: usize, seqs: &[SeqId], q: &[f32], heads: usize) -> Vec<f32> {
        use super::fused::attention::{PagedRow, decode_paged};
        let (part, (ko, vo)) = (self.part(), self.offsets(layer));
        let Store::Host(store) = &self.store else { unreachable!("attend() is the host store's") };
        let rows: Vec<PagedRow<'_>> = seqs
            .iter()
            .map(|&s| {
                let seq = self.seq(s);
                let blocks = || seq.blocks.iter().map(|&b| &store[b][..]);
                PagedRow {
                    len: seq.len + 1,
                    keys: blocks().map(|b| &b[ko..][..part]).collect(),
                    values: blocks().map(|b| &b[vo..][..part]).collect(),
                }
            })
            .collect();
        decode_paged(heads, self.kv_heads, self.head_dim, BLOCK, q, &rows, 1.0 / (self.head_dim as f32).sqrt())
    }

    /// Without the `flex` feature no model hands out a cache in host memory ([`crate::model::Qwen2::new_paged_kv`]).
    #[cfg(not(feature = "flex"))]
    pub fn attend(&self, _layer: usize, _seqs: &[SeqId], _q: &[f32], _heads: usize) -> Vec<f32> {
        unreachable!("a paged KV cache exists only with the flex feature")
    }
}

impl<B: Backend> PagedKv<B> {
    /// The pools' rows `[P, 1]` of every position of the sequences `seqs` (from
    /// [`PagedKv::insert`]), in order, where [`PagedKv::fill_layer`] scatters a prefill's keys
    /// (device store; `None` for blocks in host memory).
    pub fn prefill_slots(&self, seqs: &[SeqId]) -> Option<Tensor<B, 2, Int>> {
        let Store::Device(pools) = &self.store else { return None };
        let slots: Vec<i64> = seqs
            .iter()
            .flat_map(|&s| {
                let seq = self.seq(s);
                (0..seq.len).map(|p| seq.slot(p))
            })
            .collect();
        let n = slots.len();
        Some(Tensor::from_data(TensorData::new(slots, [n, 1]), &pools.device))
    }

    /// Writes one layer of a prefill into its sequences (from [`PagedKv::insert`]): `seqs[r]`
    /// takes the last `len(seqs[r])` positions of row `r` of the layer's keys and values `[B, S,
    /// K, d]` (its left padding left out); `slots` from [`PagedKv::prefill_slots`] with the same
    /// `seqs`.
    pub fn fill_layer(&mut self, layer: usize, k: Tensor<B, 4>, v: Tensor<B, 4>, seqs: &[SeqId], slots: Option<&Tensor<B, 2, Int>>) {
        let [batch, seq, kv_heads, d] = k.dims();
        let Some(slots) = slots else {
            let host = |t: Tensor<B, 4>| t.into_data().into_vec::<f32>().expect("the fused path's cache is f32");
            let (k, v) = (host(k), host(v));
            let per_row = k.len() / batch;
            for (row, &s) in seqs.iter().enumerate() {
                let from = row * per_row + (seq - self.seq(s).len) * kv_heads * d;
                self.fill(s, layer, &k[from..(row + 1) * per_row], &v[from..(row + 1) * per_row]);
            }
            return;
        };
        let positions = |t: &Tensor<B, 4>| -> Vec<Tensor<B, 3>> {
            seqs.iter()
                .enumerate()
                .map(|(row, &s)| {
                    let len = self.seq(s).len;
                    t.clone().narrow(0, row, 1).narrow(1, seq - len, len).reshape([len, kv_heads, d])
                })
                .collect()
        };
        let (k, v) = (Tensor::cat(positions(&k), 0), Tensor::cat(positions(&v), 0));
        let Store::Device(pools) = &mut self.store else { unreachable!("slots are the device store's") };
        pools.scatter(layer, slots.clone(), k, v);
    }

    /// Writes layer `layer`'s keys and values `[R, K, d]` of the step's rows (device store;
    /// [`PagedKv::reserve`] first), then attends: q `[R, H, d]` after RoPE; `[R, H, d]`.
    pub fn write_and_attend(&mut self, layer: usize, q: Tensor<B, 3>, k: Tensor<B, 3>, v: Tensor<B, 3>) -> Tensor<B, 3> {
        let Store::Device(pools) = &mut self.store else { unreachable!("the device store's") };
        let step = pools.step.clone().expect("reserve() before a step");
        pools.scatter(layer, step.slots, k, v);
        let [keys, values] = pools.pools[layer].clone().expect("a pool per layer");
        let kernel = super::kernels::kernels::<B>().paged_decode;
        let fast = kernel.and_then(|decode| decode(q.clone(), keys.clone(), values.clone(), step.table.clone(), step.lens.clone(), step.max_len));
        fast.unwrap_or_else(|| decode_reference(q, keys, values, step.table, step.lens))
    }
}

impl<B: Backend> DevicePools<B> {
    fn take(&mut self, layer: usize) -> [Tensor<B, 3>; 2] {
        self.pools[layer].take().expect("a pool per layer")
    }

    /// Room for half as many blocks again (at least 8 more, at most [`DevicePools::max_blocks`]).
    fn grow(&mut self, kv_heads: usize, head_dim: usize) {
        if let Some(max) = self.max_blocks {
            assert!(self.capacity < max, "the KV cache's blocks exceed the device's largest buffer (the engine bounds them)");
        }
        self.grow_to((self.capacity + self.capacity / 2).max(self.capacity + 8), kv_heads, head_dim);
    }

    /// Room for `blocks` blocks (at most [`DevicePools::max_blocks`]), where the pools hold
    /// fewer.
    fn grow_to(&mut self, blocks: usize, kv_heads: usize, head_dim: usize) {
        let capacity = self.max_blocks.map_or(blocks, |max| blocks.min(max));
        if capacity <= self.capacity {
            return;
        }
        let extra = capacity - self.capacity;
        for layer in 0..self.pools.len() {
            let zeros = || Tensor::<B, 3>::zeros([extra * BLOCK, kv_heads, head_dim], (&self.device, self.dtype));
            self.pools[layer] = Some(match self.pools[layer].take() {
                None => [zeros(), zeros()],
                Some([k, v]) => [Tensor::cat(vec![k, zeros()], 0), Tensor::cat(vec![v, zeros()], 0)],
            });
        }
        self.capacity = capacity;
    }

    /// Writes `k`, `v` `[n, K, d]` into layer `layer`'s slots `[n, 1]` (in place where the pool
    /// is held only here).
    fn scatter(&mut self, layer: usize, slots: Tensor<B, 2, Int>, k: Tensor<B, 3>, v: Tensor<B, 3>) {
        let [kp, vp] = self.take(layer);
        let (k, v) = (to_dtype(k, self.dtype), to_dtype(v, self.dtype));
        let kp = kp.scatter_nd(slots.clone(), k, IndexingUpdateOp::Assign);
        let vp = vp.scatter_nd(slots, v, IndexingUpdateOp::Assign);
        self.pools[layer] = Some([kp, vp]);
    }
}

/// Decoding attention over a paged cache in plain burn operations (what
/// [`crate::model::kernels::Kernels::paged_decode`] is tested against): q `[R, H, d]`, the pools
/// `[N·BLOCK, K, d]`, the block tables `[R, W]`, the keys each row reads `[R]`; each row's keys
/// gathered through its table, scores and softmax in f32, GQA by grouping. `[R, H, d]` in q's
/// dtype.
pub fn decode_reference<B: Backend>(q: Tensor<B, 3>, keys: Tensor<B, 3>, values: Tensor<B, 3>, table: Tensor<B, 2, Int>, lens: Tensor<B, 1, Int>) -> Tensor<B, 3> {
    let ([rows, heads, d], [_, kv_heads, _], width) = (q.dims(), keys.dims(), table.dims()[1]);
    let (span, device, dtype) = (width * BLOCK, q.device(), q.dtype());
    let offsets = Tensor::<B, 1, Int>::arange(0..BLOCK as i64, &device).reshape([1, 1, BLOCK]);
    let slots = (table.reshape([rows, width, 1]) * BLOCK as i64 + offsets).reshape([rows * span]);
    let gather = |pool: Tensor<B, 3>| to_dtype(pool.select(0, slots.clone()), DType::F32).reshape([rows, span, kv_heads, d]).swap_dims(1, 2); // [R, K, S, d]
    let (k, v) = (gather(keys), gather(values));
    let q = to_dtype(q, DType::F32).reshape([rows, kv_heads, heads / kv_heads, d]);
    let scores = q.matmul(k.swap_dims(2, 3)) / (d as f64).sqrt(); // [R, K, G, S]
    let hidden = Tensor::<B, 1, Int>::arange(0..span as i64, &device).reshape([1, 1, 1, span]).greater_equal(lens.reshape([rows, 1, 1, 1]));
    let out = softmax(scores.mask_fill(hidden, f32::NEG_INFINITY), 3).matmul(v); // [R, K, G, d]
    to_dtype(out.reshape([rows, heads, d]), dtype)
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
        let mut cache = PagedKv::<burn::backend::Flex>::new(layers, kv_heads, d);
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
