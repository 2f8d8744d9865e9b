//! Data parallelism: one model replica per device, several devices per process, several
//! processes (nodes) per run. Training uses it through [`Replica`] (all-reduce gradients,
//! all-gather ZeRO-1's updated weights, gather metrics, agree on the start); [`launch`] starts
//! the replicas of a process.
//!
//! On CUDA devices every replica, in this process or another, is one rank of an NCCL
//! communicator ([`nccl`], `nccl_cuda.rs`): tensors are summed and gathered device to device, and kiln's
//! rendezvous only hands out NCCL's id. Everywhere else (the CPU, wgpu, and CUDA under
//! `--collective ring`) two levels, each behind one file, carry the sums, the CPU/test transport:
//! - between the replicas (threads) of a process: burn-collective's local all-reduce
//!   ([`engine`]), the engine the issue chose;
//! - between processes: kiln's own rendezvous and control connections ([`group`]) and a TCP
//!   ring all-reduce ([`ring`]). burn-collective 0.21's multi-node level is not used: its ring
//!   never clears its end-of-call barrier (`SyncService::sync` clears a copy of the list), so
//!   the second all-reduce hangs, and on a 2-core machine its blocking local server starves
//!   the tokio workers so the first one can hang too (both reproduced with two processes on
//!   127.0.0.1); its tree and centralized strategies reuse transfer ids (burn #4549), and
//!   multi-node reduce/broadcast are unimplemented. It also binds 0.0.0.0.
//!
//! Ranks are global: node `n`'s local replica `l` is rank `n · devices + l`; rank 0 is the
//! main replica (it logs, evaluates and writes checkpoints). Every replica reaches identical
//! weights: gradients are summed in one order and the result is copied, never re-summed.
//!
//! Other work can be spread the same way, evaluation over rows for instance: [`launch`] one
//! replica per device, let each take its [`Replica::shard`] of the rows and [`Replica::gather`]
//! the results (every replica gets all of them, in rank order):
//!
//! ```
//! use kiln_core::dist::{self, Replica};
//!
//! let rows: Vec<u64> = (1..=10).collect();
//! let score = |replica: Replica, _device: &()| -> kiln_core::Result<u64> {
//!     let mine: u64 = rows[replica.shard(rows.len())].iter().sum();
//!     Ok(replica.gather(mine.into())?.iter().filter_map(|v| v.as_u64()).sum())
//! };
//! assert_eq!(dist::launch(&[(), ()], None, "eval", score, score).unwrap(), 55);
//! ```

#[cfg(not(target_arch = "wasm32"))]
mod engine;
mod group;
mod launcher;
mod local;
#[cfg(not(target_arch = "wasm32"))]
pub mod nccl;
#[cfg(all(feature = "cuda", not(target_arch = "wasm32")))]
mod nccl_cuda;
mod overlap;
mod params;
mod ring;

/// On wasm32 (the browser: one device, no threads) there is no collective engine; burn-collective
/// needs tokio and sockets. Several devices per process are refused at registration.
#[cfg(target_arch = "wasm32")]
mod engine {
    use burn::tensor::{Tensor, backend::Backend};

    use super::local::Abort;
    use crate::error::{Error, Result};

    pub(crate) fn reset<B: Backend>() {}
    pub(crate) fn register<B: Backend>(_local: usize, _size: usize, _device: B::Device, _abort: &Abort) -> Result<()> {
        Err(Error::Distributed("several devices per process are not available on wasm32".into()))
    }
    pub(crate) fn all_reduce_sum<B: Backend>(_local: usize, _tensor: Tensor<B, 1>, _abort: &Abort) -> Result<Tensor<B, 1>> {
        Err(Error::Distributed("several devices per process are not available on wasm32".into()))
    }
    pub(crate) fn finish<B: Backend>(_local: usize) {}
}

use std::cell::RefCell;
use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use serde_json::Value;

pub use group::NodeSpec;
pub use launcher::{DEFAULT_PORT, Launched, Launcher, expand_nodelist};
pub use overlap::Overlap;
pub use params::{OptimizerShard, gather_owned_moments, gather_owned_weights, reduce_gradients, reduce_records, sync_start};

use self::group::Group;
use self::local::{Abort, Rounds, lock};
use crate::error::{Error, Result};

/// How the replicas' values combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    /// The sum: each replica's loss is already scaled for the global batch.
    Sum,
    /// The mean over replicas: each replica's loss is a mean over its own share.
    Mean,
}

/// The dtype gradients are all-reduced in (`[train] grad_reduce_dtype`): f32 (exact sums of
/// the f32 gradients, the default), or bf16, which halves NCCL's traffic at bf16's rounding of
/// each gradient and partial sum (DDP's `bf16_compress_hook`, FSDP's `reduce_dtype`). bf16 needs
/// NCCL: kiln's ring and burn-collective sum in f32.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReduceDtype {
    #[default]
    F32,
    Bf16,
}

/// What carries the replicas' sums (`--collective`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// NCCL on CUDA devices, kiln's engine and TCP ring elsewhere.
    Auto,
    /// NCCL, even for a run of one replica (a one-rank communicator: the GPU check's row);
    /// refused on devices other than CUDA.
    Nccl,
    /// kiln's engine and TCP ring on every backend (through host memory on GPUs).
    Ring,
}

static COLLECTIVE: AtomicU8 = AtomicU8::new(0);

/// Sets this process's [`Collective`] (the CLI's `--collective`); [`Collective::Auto`] until set.
pub fn set_collective(collective: Collective) {
    COLLECTIVE.store(collective as u8, Ordering::Relaxed);
}

/// This process's [`Collective`].
pub fn collective() -> Collective {
    match COLLECTIVE.load(Ordering::Relaxed) {
        1 => Collective::Nccl,
        2 => Collective::Ring,
        _ => Collective::Auto,
    }
}

/// The CUDA device whose sums NCCL carries: `device`, when it is one and `--collective` is not
/// `ring`; `None` elsewhere.
fn nccl_device<B: Backend>(device: &B::Device) -> Option<usize> {
    #[cfg(all(feature = "cuda", not(target_arch = "wasm32")))]
    if collective() != Collective::Ring {
        return nccl_cuda::cuda_ordinal::<B>(device);
    }
    let _ = device;
    None
}

/// Bytes free on `device` now, where it is a CUDA device (`None` elsewhere: wgpu reports no
/// free memory, and host memory is [`crate::model::weights`]'s). The pages cubecl's pools keep
/// unused are given back first (a free page serves only requests no larger than itself, so
/// they are not free to a new large buffer).
pub fn device_free_memory<B: Backend>(device: &B::Device) -> Option<u64> {
    #[cfg(all(feature = "cuda", not(target_arch = "wasm32")))]
    if let Some(ordinal) = nccl_cuda::cuda_ordinal::<B>(device) {
        B::memory_cleanup(device);
        return nccl_cuda::free_memory(ordinal);
    }
    let _ = device;
    None
}

/// The error of `grad_reduce_dtype = "bf16"` without NCCL.
pub const BF16_NEEDS_NCCL: &str = "[train] grad_reduce_dtype = \"bf16\" needs NCCL (CUDA devices): kiln's TCP ring and burn-collective sum in f32; leave it out or set \"f32\"";

/// Elements per all-reduce call: gradients are flattened into buckets of at most this many.
const BUCKET: usize = 1 << 24;

/// Tensors of `lengths` values, in order, cut into buckets of whole tensors of at most
/// [`BUCKET`] values each (a longer tensor alone): each bucket's range of tensors.
fn buckets(lengths: &[usize]) -> Vec<Range<usize>> {
    let (mut out, mut start, mut filled) = (Vec::new(), 0, 0);
    for (i, &length) in lengths.iter().enumerate() {
        filled += length;
        if lengths.get(i + 1).is_none_or(|next| filled + next > BUCKET) {
            out.push(start..i + 1);
            (start, filled) = (i + 1, 0);
        }
    }
    out
}

struct Shared {
    abort: Arc<Abort>,
    rounds: Rounds,
    group: Option<Arc<Group>>,
}

/// One replica's handle on the run: its rank, and the collective operations (every replica
/// must call them in the same order).
pub struct Replica {
    rank: usize,
    world: usize,
    local: usize,
    local_size: usize,
    node: usize,
    shared: Option<Arc<Shared>>,
    /// Unregisters from the engine when the replica ends.
    finish: RefCell<Option<Box<dyn FnOnce() + Send>>>,
    /// This replica's NCCL library and communicator, made on its first all-reduce of CUDA
    /// tensors.
    #[cfg(all(feature = "cuda", not(target_arch = "wasm32")))]
    nccl: RefCell<Option<(&'static nccl::Nccl, nccl_cuda::Communicator)>>,
}

impl Replica {
    /// The only replica of a one-device run (every operation is the identity).
    pub fn single() -> Self {
        Self::new(0, 1, 0, 1, 0, None)
    }

    /// Global replica `rank` of `world`, local replica `local` of `local_size` on node `node`.
    fn new(rank: usize, world: usize, local: usize, local_size: usize, node: usize, shared: Option<Arc<Shared>>) -> Self {
        Self {
            rank,
            world,
            local,
            local_size,
            node,
            shared,
            finish: RefCell::new(None),
            #[cfg(all(feature = "cuda", not(target_arch = "wasm32")))]
            nccl: RefCell::new(None),
        }
    }

    /// Whether this replica is a run's only one with no collective at all (its operations are
    /// the identity). A one-replica run under `--collective nccl` is not: its sums go through a
    /// one-rank NCCL communicator.
    pub fn is_single(&self) -> bool {
        self.shared.is_none()
    }

    /// Global rank, `0..world`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Replicas in the run.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Rank 0: logs, evaluates and writes checkpoints.
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }

    /// This process's node rank.
    pub fn node(&self) -> usize {
        self.node
    }

    /// This replica's contiguous share of `n` items (the first `n % world` ranks take one more):
    /// how evaluation can split rows over replicas.
    pub fn shard(&self, n: usize) -> Range<usize> {
        let (base, extra) = (n / self.world, n % self.world);
        let start = self.rank * base + self.rank.min(extra);
        start..start + base + usize::from(self.rank < extra)
    }

    /// Every replica's `value`, in rank order.
    pub fn gather(&self, value: Value) -> Result<Vec<Value>> {
        let Some(shared) = &self.shared else { return Ok(vec![value]) };
        let group = shared.group.clone();
        let all = shared.rounds.round(self.local, value, move |locals: Vec<Value>| match &group {
            Some(group) => Ok(group.gather(locals)?.into_iter().flatten().collect::<Vec<Value>>()),
            None => Ok(locals),
        })?;
        Ok(all.as_ref().clone())
    }

    /// Rank 0's `value` (the others' are ignored).
    pub fn broadcast(&self, value: Value) -> Result<Value> {
        Ok(self.gather(value)?.swap_remove(0))
    }

    /// Waits until every replica got here.
    pub fn barrier(&self) -> Result<()> {
        self.gather(Value::Null).map(|_| ())
    }

    /// `tensor` summed (or averaged) over all replicas; every replica gets the same values.
    pub fn all_reduce<B: Backend>(&self, tensor: Tensor<B, 1>, op: Reduce) -> Result<Tensor<B, 1>> {
        self.all_reduce_in(tensor, op, ReduceDtype::F32)
    }

    /// Whether this replica's sums of tensors on `device` go through NCCL, device to device.
    pub fn sums_with_nccl<B: Backend>(&self, device: &B::Device) -> bool {
        nccl_device::<B>(device).is_some()
    }

    /// [`Replica::all_reduce`], the values summed in `reduce` (bf16 needs NCCL).
    pub fn all_reduce_in<B: Backend>(&self, tensor: Tensor<B, 1>, op: Reduce, reduce: ReduceDtype) -> Result<Tensor<B, 1>> {
        let Some(shared) = &self.shared else { return Ok(tensor) };
        let device = tensor.device();
        // Reduced in f32 (or `reduce`) whatever the tensor's dtype (bf16-pure weights), handed
        // back in it.
        let dtype = tensor.dtype();
        let mut tensor = crate::model::proj::to_dtype(tensor, burn::tensor::DType::F32);
        #[cfg(all(feature = "cuda", not(target_arch = "wasm32")))]
        if let Some(ordinal) = nccl_device::<B>(&device) {
            let sent = match reduce {
                ReduceDtype::F32 => tensor,
                ReduceDtype::Bf16 => crate::model::proj::to_dtype(tensor, burn::tensor::DType::BF16),
            };
            let summed = crate::model::proj::to_dtype(self.nccl_sum(shared, sent, ordinal, reduce)?, burn::tensor::DType::F32);
            return Ok(crate::model::proj::to_dtype(Self::finish_reduce(summed, op, self.world), dtype));
        }
        if collective() == Collective::Nccl {
            return Err(Error::Distributed("--collective nccl needs CUDA devices (this build or run has none); leave it out for kiln's TCP ring".into()));
        }
        if reduce == ReduceDtype::Bf16 {
            return Err(Error::Distributed(BF16_NEEDS_NCCL.into()));
        }
        if self.local_size > 1 {
            self.register::<B>(shared, &device)?;
            tensor = engine::all_reduce_sum::<B>(self.local, tensor, &shared.abort)?;
        }
        if let Some(group) = &shared.group {
            let n = tensor.dims()[0];
            let host = |t: Tensor<B, 1>| t.into_data().convert::<f32>().into_vec::<f32>().expect("f32 data");
            let summed = if self.local_size == 1 {
                let mut data = host(tensor);
                group.all_reduce_sum(&mut data)?;
                data
            } else {
                let mine = (self.local == 0).then(|| host(tensor));
                let group = group.clone();
                let all = shared.rounds.round(self.local, mine, move |mut inputs: Vec<Option<Vec<f32>>>| {
                    let mut data = inputs[0].take().expect("the leader's buffer");
                    group.all_reduce_sum(&mut data)?;
                    Ok(data)
                })?;
                all.as_ref().clone()
            };
            tensor = Tensor::from_data(TensorData::new(summed, [n]), &device);
        }
        Ok(crate::model::proj::to_dtype(Self::finish_reduce(tensor, op, self.world), dtype))
    }

    /// The sum over `world` replicas as `op` wants it (divided after summing, on every
    /// transport, so that they agree).
    fn finish_reduce<B: Backend>(sum: Tensor<B, 1>, op: Reduce, world: usize) -> Tensor<B, 1> {
        match op {
            Reduce::Sum => sum,
            Reduce::Mean => sum.div_scalar(world as f64),
        }
    }

    /// [`Replica::all_reduce`] of several tensors, flattened into buckets of up to 2^24 values.
    pub fn all_reduce_many<B: Backend>(&self, tensors: Vec<Tensor<B, 1>>, op: Reduce) -> Result<Vec<Tensor<B, 1>>> {
        self.all_reduce_many_in(tensors, op, ReduceDtype::F32)
    }

    /// [`Replica::all_reduce_many`], the values summed in `reduce`.
    pub fn all_reduce_many_in<B: Backend>(&self, tensors: Vec<Tensor<B, 1>>, op: Reduce, reduce: ReduceDtype) -> Result<Vec<Tensor<B, 1>>> {
        if self.shared.is_none() {
            return Ok(tensors);
        }
        let lengths: Vec<usize> = tensors.iter().map(|t| t.dims()[0]).collect();
        let mut out = Vec::with_capacity(lengths.len());
        let mut tensors = tensors.into_iter();
        for range in buckets(&lengths) {
            let bucket: Vec<Tensor<B, 1>> = tensors.by_ref().take(range.len()).collect();
            let reduced = self.all_reduce_in(Tensor::cat(bucket, 0), op, reduce)?;
            let mut start = 0;
            for &length in &lengths[range] {
                out.push(reduced.clone().slice(start..start + length));
                start += length;
            }
        }
        Ok(out)
    }

    /// `data` with every replica's part in its place: `parts` cut `data` end to end in rank
    /// order (maybe with empty parts), each replica fills its own, and every replica gets all of
    /// them, in `data`'s dtype. Values are copied, never summed, so the result is exact in any
    /// dtype; ZeRO-1 hands out the updated weights this way, at half an all-reduce's traffic
    /// when the parts are even. Through NCCL on CUDA devices, in the tensor's dtype (each part
    /// padded to the longest: `ncclAllGather` takes one length); elsewhere the leader of a
    /// process's replicas puts their parts together and kiln's ring passes the processes' chunks
    /// round, in f32.
    pub fn all_gather<B: Backend>(&self, data: Tensor<B, 1>, parts: &[usize]) -> Result<Tensor<B, 1>> {
        let total: usize = parts.iter().sum();
        if parts.len() != self.world || data.dims()[0] != total {
            return Err(Error::Distributed(format!("all-gather: {} values cut into {parts:?} for {} replicas", data.dims()[0], self.world)));
        }
        let Some(shared) = &self.shared else { return Ok(data) };
        if total == 0 {
            return Ok(data);
        }
        let mine = parts[..self.rank].iter().sum::<usize>()..parts[..=self.rank].iter().sum::<usize>();
        let (device, dtype) = (data.device(), data.dtype());
        #[cfg(all(feature = "cuda", not(target_arch = "wasm32")))]
        if let Some(ordinal) = nccl_device::<B>(&device) {
            // At least 1: an all-empty gather returned above.
            let longest = parts.iter().copied().max().unwrap_or_default();
            let short = longest - mine.len();
            let padding = || crate::model::proj::to_dtype(Tensor::zeros([short], &device), dtype);
            let padded = match mine.len() {
                0 => padding(),
                n if n == longest => data.slice(mine),
                _ => Tensor::cat(vec![data.slice(mine), padding()], 0),
            };
            let all = self.nccl_gather(shared, padded, ordinal)?;
            if parts.iter().all(|&n| n == longest) {
                return Ok(all);
            }
            let pieces = parts.iter().enumerate().filter(|(_, n)| **n > 0).map(|(r, n)| all.clone().slice(r * longest..r * longest + n)).collect();
            return Ok(Tensor::cat(pieces, 0));
        }
        if collective() == Collective::Nccl {
            return Err(Error::Distributed("--collective nccl needs CUDA devices (this build or run has none); leave it out for kiln's TCP ring".into()));
        }
        // A node's replicas hold consecutive ranks (`node · local_size + local`), so their parts
        // make one chunk, the node's.
        let mut chunks = Vec::with_capacity(parts.len() / self.local_size);
        let mut end = 0;
        for node in parts.chunks(self.local_size) {
            let start = end;
            end += node.iter().sum::<usize>();
            chunks.push(start..end);
        }
        if self.local_size == 1 {
            // The buffer itself carries this replica's part, in place.
            let mut all = host_f32(data);
            if let Some(group) = &shared.group {
                group.all_gather(&mut all, &chunks)?;
            }
            return Ok(crate::model::proj::to_dtype(Tensor::from_data(TensorData::new(all, [total]), &device), dtype));
        }
        // Several replicas in this process: the leader puts their parts together on its device
        // (and, between nodes, gathers the nodes' chunks into its whole buffer over the ring).
        let own = (!mine.is_empty()).then(|| data.clone().slice(mine));
        let whole = (self.local == 0).then_some(data);
        let (group, start) = (shared.group.clone(), chunks[self.node].start);
        let all = shared.rounds.round(self.local, (own, whole), move |locals: Vec<GatherInput<B>>| {
            let mut locals = locals.into_iter();
            let (leader_part, whole) = locals.next().expect("the leader's input");
            let whole = whole.expect("the leader's buffer");
            let here = whole.device();
            let owned = std::iter::once(leader_part).chain(locals.map(|l| l.0)).flatten();
            let Some(group) = &group else {
                return Ok(Tensor::cat(owned.map(|part| part.to_device(&here)).collect(), 0));
            };
            let mut all = host_f32(whole);
            let mut at = start;
            for part in owned {
                let part = host_f32(part);
                all[at..at + part.len()].copy_from_slice(&part);
                at += part.len();
            }
            group.all_gather(&mut all, &chunks)?;
            Ok(crate::model::proj::to_dtype(Tensor::from_data(TensorData::new(all, [total]), &here), dtype))
        })?;
        Ok(all.as_ref().clone().to_device(&device))
    }

    /// This replica's NCCL communicator on CUDA device `ordinal`, made on first use: every
    /// replica opens NCCL and readies its device, and all learn every replica's status (a
    /// replica that could not, or two replicas of a node on one GPU, stop the run with one
    /// line); then rank 0 makes the id and the rendezvous hands it out.
    #[cfg(all(feature = "cuda", not(target_arch = "wasm32")))]
    fn nccl_communicator(&self, shared: &Shared, ordinal: usize) -> Result<std::cell::Ref<'_, (&'static nccl::Nccl, nccl_cuda::Communicator)>> {
        if self.nccl.borrow().is_none() {
            let ready = nccl::Nccl::load().and_then(|library| Ok((library, nccl_cuda::Prepared::new(ordinal)?)));
            let status = match &ready {
                Ok(_) => serde_json::json!({"node": self.node, "cuda": ordinal}),
                Err(e) => Value::String(e.to_string()),
            };
            let all = self.gather(status)?;
            if let Some((rank, reason)) = all.iter().enumerate().find_map(|(r, v)| v.as_str().map(|s| (r, s))) {
                return Err(Error::Distributed(format!("rank {rank}: {reason}")));
            }
            let mut seen = std::collections::HashSet::new();
            if let Some(twice) = all.iter().find(|v| !seen.insert((v["node"].as_u64(), v["cuda"].as_u64()))) {
                return Err(Error::Distributed(format!(
                    "cuda:{} takes two replicas on node {}: NCCL takes one rank per GPU (name each GPU once, or use --collective ring)",
                    twice["cuda"], twice["node"]
                )));
            }
            let (library, prepared) = ready?;
            let id = if self.is_main() { nccl::id_to_hex(&library.unique_id()?) } else { String::new() };
            let id = self.broadcast(Value::String(id))?;
            let id = nccl::id_from_hex(id.as_str().unwrap_or_default())?;
            let comm = nccl_cuda::Communicator::join(library, prepared, id, self.rank, self.world, shared.abort.clone())?;
            if self.is_main() {
                eprintln!("kiln: NCCL {} ({}): {} rank(s), all-reduce on the devices", library.version_string(), library.path, self.world);
            }
            *self.nccl.borrow_mut() = Some((library, comm));
        }
        let nccl = std::cell::Ref::map(self.nccl.borrow(), |n| n.as_ref().expect("made above"));
        if nccl.1.ordinal() != ordinal {
            return Err(Error::Distributed(format!("NCCL: replica {} used cuda:{ordinal} after joining on cuda:{}", self.rank, nccl.1.ordinal())));
        }
        Ok(nccl)
    }

    /// Every replica's `tensor` (all of one length) end to end through NCCL.
    #[cfg(all(feature = "cuda", not(target_arch = "wasm32")))]
    fn nccl_gather<B: Backend>(&self, shared: &Shared, tensor: Tensor<B, 1>, ordinal: usize) -> Result<Tensor<B, 1>> {
        let nccl = self.nccl_communicator(shared, ordinal)?;
        nccl.1.gather(tensor, self.world).unwrap_or_else(|| Err(Error::Distributed("NCCL all-gather: not a CUDA tensor of f32, f16 or bf16".into())))
    }

    /// The sum of `tensor` over the replicas through NCCL, in `reduce`.
    #[cfg(all(feature = "cuda", not(target_arch = "wasm32")))]
    fn nccl_sum<B: Backend>(&self, shared: &Shared, tensor: Tensor<B, 1>, ordinal: usize, reduce: ReduceDtype) -> Result<Tensor<B, 1>> {
        let nccl = self.nccl_communicator(shared, ordinal)?;
        let (library, comm) = (nccl.0, &nccl.1);
        if reduce == ReduceDtype::Bf16 && library.version < 21000 {
            return Err(Error::Distributed(format!("[train] grad_reduce_dtype = \"bf16\" needs NCCL 2.10 or later (this is {})", library.version_string())));
        }
        comm.sum(tensor).unwrap_or_else(|| Err(Error::Distributed("NCCL all-reduce: not a CUDA tensor of f32, f16 or bf16".into())))
    }

    /// Registers with the engine on first use (a round first resets the engine's server).
    fn register<B: Backend>(&self, shared: &Shared, device: &B::Device) -> Result<()> {
        if self.finish.borrow().is_some() {
            return Ok(());
        }
        shared.rounds.round(self.local, (), |_| {
            engine::reset::<B>();
            Ok(())
        })?;
        engine::register::<B>(self.local, self.local_size, device.clone(), &shared.abort)?;
        let local = self.local;
        *self.finish.borrow_mut() = Some(Box::new(move || engine::finish::<B>(local)));
        Ok(())
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(finish) = self.finish.get_mut().take() {
            finish();
        }
    }
}

/// What a local replica passes to its leader in [`Replica::all_gather`]: its own part (none when
/// empty), and the leader its whole buffer.
type GatherInput<B> = (Option<Tensor<B, 1>>, Option<Tensor<B, 1>>);

/// `tensor`'s values as f32 on the host.
fn host_f32<B: Backend>(tensor: Tensor<B, 1>) -> Vec<f32> {
    crate::model::proj::to_dtype(tensor, burn::tensor::DType::F32).into_data().convert::<f32>().into_vec::<f32>().expect("f32 data")
}

/// One run with several replicas per process at a time (the engine's server is per process).
static LAUNCH: Mutex<()> = Mutex::new(());

/// Runs one replica per device of this process: `main` for local replica 0 on the calling
/// thread, `other` for the rest on their own threads; with `nodes`, this process first joins
/// the other nodes (`fingerprint` must match theirs, see [`fingerprint`]). Returns `main`'s
/// result, or the error that stopped the run (a replica's own error, or one naming the node
/// that failed or was lost).
pub fn launch<D: Sync, T: Send>(
    devices: &[D],
    nodes: Option<&NodeSpec>,
    fingerprint: &str,
    main: impl FnOnce(Replica, &D) -> Result<T>,
    other: impl Fn(Replica, &D) -> Result<T> + Sync,
) -> Result<T> {
    if devices.is_empty() {
        return Err(Error::InvalidInput("a run needs at least one device".into()));
    }
    if devices.len() == 1 && nodes.is_none() && collective() != Collective::Nccl {
        return main(Replica::single(), &devices[0]);
    }
    let _one_run = lock(&LAUNCH);
    let abort = Arc::new(Abort::default());
    let local_size = devices.len();
    // Nodes must agree on the collective too (NCCL on one node, the ring on another would not meet).
    let fingerprint = format!("{fingerprint}/{:?}", collective());
    let group = nodes.map(|spec| Group::join(spec, &fingerprint, local_size, abort.clone())).transpose()?;
    let (node, nnodes) = group.as_ref().map_or((0, 1), |g| (g.node, g.size));
    let shared = Arc::new(Shared { abort: abort.clone(), rounds: Rounds::new(local_size, abort.clone()), group: group.clone() });
    let replica = |local: usize| Replica::new(node * local_size + local, nnodes * local_size, local, local_size, node, Some(shared.clone()));
    // The first replica to fail stops the others; its own error is the run's.
    let first_failure: Mutex<Option<usize>> = Mutex::new(None);
    let failed = |local: usize, error: &Error| {
        let mut first = lock(&first_failure);
        if first.is_none() && abort.reason().is_none() {
            *first = Some(local);
        }
        let prefix = if nnodes > 1 { format!("node {node} failed: ") } else { String::new() };
        abort.raise(format!("{prefix}{error}"));
        shared.rounds.wake();
    };
    let mut results: Vec<Result<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = (1..local_size)
            .map(|local| {
                let (replica, device, other, failed) = (replica(local), &devices[local], &other, &failed);
                s.spawn(move || {
                    // (The first replica reports the stages all of them go through.)
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| crate::progress::silenced(|| other(replica, device))))
                        .unwrap_or_else(|payload| Err(replica_panic(local, payload)));
                    if let Err(e) = &result {
                        failed(local, e);
                    }
                    result
                })
            })
            .collect();
        let main_result = main(replica(0), &devices[0]);
        if let Err(e) = &main_result {
            failed(0, e);
        }
        std::iter::once(main_result).chain(handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::Distributed("a replica panicked".into()))))).collect()
    });
    if let Some(group) = &group {
        match abort.reason() {
            Some(reason) => group.fail(&reason),
            None => group.close(),
        }
    }
    let first = lock(&first_failure).unwrap_or(0);
    results.swap_remove(first)
}

/// The error of a replica thread that panicked: the device failure it stopped with
/// (`kiln_backends::device::ensure_fits` panics with one) or one the device threads recorded,
/// else a panic naming the replica.
fn replica_panic(local: usize, payload: Box<dyn std::any::Any + Send>) -> Error {
    match payload.downcast::<kiln_backends::device::DeviceError>() {
        Ok(err) => (*err).into(),
        Err(_) => match kiln_backends::device::fault() {
            Some(err) => err.into(),
            None => Error::Distributed(format!("replica {local} panicked")),
        },
    }
}

/// A short hash of everything that must agree between the nodes of a run (command, config,
/// devices): nodes whose fingerprints differ are refused at the rendezvous.
pub fn fingerprint(parts: &[&str]) -> String {
    // FNV-1a (64 bit) over each part's length and bytes: stable across builds and machines, and
    // not a security boundary (a mismatch is a configuration mistake, not an attack).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in (part.len() as u64).to_le_bytes().iter().chain(part.as_bytes()) {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests;
