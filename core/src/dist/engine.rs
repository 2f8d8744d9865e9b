//! The collective engine between the replicas of one process: burn-collective 0.21's local
//! level (one server per backend type and process; peers are threads, one per device). This is
//! the only file that names the engine, so it can be swapped.
//!
//! The engine's calls block without a timeout, so each runs on a helper thread while the
//! replica waits polling the run's abort flag: a failed replica never leaves the others hanging.
//! (burn-collective's multi-process level is not used: in 0.21 its ring hangs on the second
//! all-reduce, see [`super`]; the processes of a run use kiln's TCP ring instead.)

use std::sync::mpsc;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_collective::{AllReduceStrategy, CollectiveConfig, CollectiveError, PeerId, ReduceOperation};

use super::local::{Abort, POLL, abortable};
use crate::error::{Error, Result};

/// Forgets every peer and operation of backend `B`'s server (a new run starts clean even
/// after an aborted one).
pub(crate) fn reset<B: Backend>() {
    burn_collective::reset_collective::<B>();
}

/// Registers local replica `local` of `size` on `device`; returns once all have registered.
pub(crate) fn register<B: Backend>(local: usize, size: usize, device: B::Device, abort: &Abort) -> Result<()> {
    let config = CollectiveConfig::default().with_num_devices(size).with_local_all_reduce_strategy(AllReduceStrategy::Tree(2));
    abortable(abort, BURN_COLLECTIVE, move || burn_collective::register::<B>(PeerId(local as u32), device, config).map_err(engine_error))
}

/// The element-wise sum of `tensor` over the local replicas (each gets the same result).
pub(crate) fn all_reduce_sum<B: Backend>(local: usize, tensor: Tensor<B, 1>, abort: &Abort) -> Result<Tensor<B, 1>> {
    let primitive = tensor.into_primitive().tensor();
    let reduced = abortable(abort, BURN_COLLECTIVE, move || burn_collective::all_reduce::<B>(PeerId(local as u32), primitive, ReduceOperation::Sum).map_err(engine_error))?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(reduced)))
}

/// Unregisters local replica `local` (best effort: a stopped run may have left the server busy).
pub(crate) fn finish<B: Backend>(local: usize) {
    let (done, wait) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(burn_collective::finish_collective::<B>(PeerId(local as u32)));
    });
    let _ = wait.recv_timeout(POLL * 50);
}

/// The engine's calls, in the message of one that panicked.
const BURN_COLLECTIVE: &str = "burn-collective's call";

fn engine_error(e: CollectiveError) -> Error {
    Error::Distributed(format!("burn-collective: {e:?}"))
}
