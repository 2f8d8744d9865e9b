//! NCCL all-reduce and all-gather of burn's CUDA tensors: each replica (a thread of this process or another
//! process) is one NCCL rank on its own device, and a tensor never leaves the devices.
//!
//! The communicator is made on a replica's first collective ([`super::Replica::all_reduce`] or
//! [`super::Replica::all_gather`]):
//! rank 0 makes the NCCL id and kiln's rendezvous hands it to every rank, which then joins on
//! its device's primary context (the one cubecl-cuda runs on). An all-reduce is one operation of
//! burn's fusion stream: when the stream reaches it, it waits for the device's queued work, runs
//! `ncclAllReduce` from the input's buffer into a new one on its own stream, and waits for that,
//! so the kernels after it read the sum. Every wait on NCCL also watches the run's abort flag and
//! the communicator's asynchronous error: a replica or node that failed ends the others' waits
//! (the communicator is then aborted), instead of leaving them in NCCL forever. The sums wait for
//! the backward pass to end: the layer-by-layer backward pass hands each layer's gradients out as
//! they are made ([`super::Overlap`] sums them on kiln's ring meanwhile), but launching NCCL
//! without waiting (the inputs kept alive and the stream waited on when the update ends) is not
//! done: it needs a GPU to be tested on.

use std::any::{Any, TypeId};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, Tensor};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::{CudaDevice, CudaRuntime};
use cudarc::driver::{result as cu, sys};

use super::local::{Abort, abortable};
use super::nccl::{Comm, Nccl, UniqueId, dtype, op};
use crate::error::{Error, Result};
use crate::model::cube::{Fused, custom, retype, wrap};

/// burn's CUDA backend as kiln builds it (fusion on).
type Cuda = Fused<CudaRuntime, u8>;

/// The CUDA device `B`'s `device` is, when `B` is burn's CUDA backend (the tensors the
/// replicas reduce are the inner backend's, never autodiff's).
pub(crate) fn cuda_ordinal<B: Backend>(device: &B::Device) -> Option<usize> {
    if TypeId::of::<B>() != TypeId::of::<Cuda>() {
        return None;
    }
    (device as &dyn Any).downcast_ref::<CudaDevice>().map(|d| d.index)
}

/// Bytes free on CUDA device `ordinal` now (`cuMemGetInfo` in its primary context, the one
/// cubecl-cuda allocates from; memory cubecl's pools reserved counts as used). The calling
/// thread's current context is restored, and the primary context's retain released.
pub(crate) fn free_memory(ordinal: usize) -> Option<u64> {
    cu::init().ok()?;
    let device = cu::device::get(ordinal as i32).ok()?;
    let previous = cu::ctx::get_current().ok()?;
    // SAFETY: `device` is a valid device; its primary context is retained while it is current
    // here (cubecl-cuda retains it too), and the thread's previous context (or none) is made
    // current again before the retain is released.
    unsafe {
        let ctx = cu::primary_ctx::retain(device).ok()?;
        let free = cu::ctx::set_current(ctx).ok().and_then(|_| cu::mem_get_info().ok());
        let _ = cu::ctx::set_current(previous.unwrap_or(std::ptr::null_mut()));
        let _ = cu::primary_ctx::release(device);
        free.map(|(free, _total)| free as u64)
    }
}

/// A replica's CUDA side before it joins: the device's primary context (the one cubecl-cuda
/// runs on) and a stream of it for NCCL. Made before the NCCL id is handed out, so that a
/// failure here is reported with every replica's status instead of stranding the others in
/// `ncclCommInitRank`.
pub(crate) struct Prepared {
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    ordinal: usize,
}

// SAFETY: a context and a stream may be used from any thread once the context is current, which
// every use makes it.
unsafe impl Send for Prepared {}

fn driver(call: &str, e: cudarc::driver::DriverError) -> Error {
    Error::Distributed(format!("CUDA {call} failed for NCCL: {e:?}"))
}

impl Prepared {
    /// CUDA device `ordinal`'s primary context, current on this thread, and a new stream.
    pub(crate) fn new(ordinal: usize) -> Result<Self> {
        cu::init().map_err(|e| driver("cuInit", e))?;
        let device = cu::device::get(ordinal as i32).map_err(|e| driver("cuDeviceGet", e))?;
        // SAFETY: `device` is a valid device; the primary context stays retained for the process
        // (cubecl-cuda retains the same one).
        let ctx = unsafe { cu::primary_ctx::retain(device) }.map_err(|e| driver("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: `ctx` is a valid context.
        unsafe { cu::ctx::set_current(ctx) }.map_err(|e| driver("cuCtxSetCurrent", e))?;
        let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking).map_err(|e| driver("cuStreamCreate", e))?;
        Ok(Self { ctx, stream, ordinal })
    }
}

/// One replica's NCCL communicator on its device.
pub(crate) struct Communicator {
    link: Arc<Link>,
    ordinal: usize,
}

/// What an all-reduce uses: the communicator, its stream and context, and the run's abort flag;
/// shared by the replica and the operation it puts on the fusion stream, and freed with the
/// last of them.
struct Link {
    nccl: &'static Nccl,
    comm: Comm,
    stream: sys::CUstream,
    ctx: sys::CUcontext,
    abort: Arc<Abort>,
    /// Set when a wait gave up (the run aborted, or NCCL reported an error): the communicator
    /// was aborted and must not be used or destroyed again.
    dead: AtomicBool,
}

// SAFETY: the communicator and stream are used by one thread at a time (the replica's, and the
// fusion stream's while the replica waits on it); NCCL and CUDA allow that from any thread once
// the context is current, which every call makes it.
unsafe impl Send for Link {}
// SAFETY: as above.
unsafe impl Sync for Link {}

/// A communicator handle that may cross to the thread that joins it.
struct SendComm(Comm);
// SAFETY: see `Link`.
unsafe impl Send for SendComm {}

impl Communicator {
    /// Joins communicator `id` as `rank` of `world` on the prepared device. `ncclCommInitRank`
    /// blocks until every rank has joined, so it runs on a helper thread while this one watches
    /// `abort`: a run that fails meanwhile returns its error here (the helper is left to NCCL).
    pub(crate) fn join(nccl: &'static Nccl, prepared: Prepared, id: UniqueId, rank: usize, world: usize, abort: Arc<Abort>) -> Result<Self> {
        let Prepared { ctx, stream, ordinal } = prepared;
        let ctx_addr = ctx as usize;
        let comm = abortable(&abort, "NCCL's ncclCommInitRank", move || {
            // SAFETY: the device's primary context, made current on this thread for NCCL.
            unsafe { cu::ctx::set_current(ctx_addr as sys::CUcontext) }
                .map_err(|e| driver("cuCtxSetCurrent", e))
                // SAFETY: the device's primary context is current.
                .and_then(|()| unsafe { nccl.comm_init_rank(id, rank, world) })
                .map(SendComm)
        })?
        .0;
        Ok(Self { link: Arc::new(Link { nccl, comm, stream, ctx, abort, dead: AtomicBool::new(false) }), ordinal })
    }

    /// The device this communicator runs on.
    pub(crate) fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// `tensor` summed over the communicator's ranks; `None` when `B` is not burn's CUDA
    /// backend or the dtype is not f32, f16 or bf16.
    pub(crate) fn sum<B: Backend>(&self, tensor: Tensor<B, 1>) -> Option<Result<Tensor<B, 1>>> {
        self.collective(tensor, Call::AllReduce)
    }

    /// Every rank's `tensor` (all of one length), end to end in rank order (`ncclAllGather`);
    /// `None` as for [`Communicator::sum`].
    pub(crate) fn gather<B: Backend>(&self, tensor: Tensor<B, 1>, world: usize) -> Option<Result<Tensor<B, 1>>> {
        self.collective(tensor, Call::AllGather { world })
    }

    fn collective<B: Backend>(&self, tensor: Tensor<B, 1>, call: Call) -> Option<Result<Tensor<B, 1>>> {
        let nccl_dtype = match tensor.dtype() {
            DType::F32 => dtype::FLOAT32,
            DType::F16 => dtype::FLOAT16,
            DType::BF16 => dtype::BFLOAT16,
            _ => return None,
        };
        let what = call.name();
        if self.link.dead.load(Ordering::Acquire) {
            return Some(Err(Error::Distributed("the NCCL communicator was aborted after an earlier failure".into())));
        }
        let tensor = retype::<B, Cuda, 1>(tensor)?;
        let failure: Arc<Mutex<Option<Error>>> = Arc::default();
        let link = self.link.clone();
        let recorded = failure.clone();
        let out = match call {
            Call::AllReduce => tensor.dims()[0],
            Call::AllGather { world } => tensor.dims()[0] * world,
        };
        let (shape, out_shape) = ((Shape::new([out]), tensor.dtype()), Shape::new([out]));
        let name = match call {
            Call::AllReduce => "nccl_all_reduce",
            Call::AllGather { .. } => "nccl_all_gather",
        };
        let outputs = custom::<CudaRuntime, u8, 1>(name, vec![tensor], std::slice::from_ref(&shape), move |inputs| {
            let input = into_contiguous(inputs.into_iter().next().expect("one input"));
            let output = empty_device_contiguous_dtype(input.client.clone(), input.device.clone(), out_shape.clone(), input.dtype);
            if let Err(e) = link.launch(&input, &output, nccl_dtype, call) {
                *recorded.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            }
            vec![output]
        });
        let result = wrap::<CudaRuntime, u8, 1>(outputs.into_iter().next().expect("one output"));
        // Run it now, so that a failure is this call's error (and the communicator's use ends
        // here).
        if let Err(e) = Cuda::sync(&result.device()) {
            return Some(Err(Error::Distributed(format!("the device failed during an NCCL {what}: {e:?}"))));
        }
        if let Some(e) = failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Some(Err(e));
        }
        Some(retype::<Cuda, B, 1>(result).ok_or_else(|| Error::Distributed(format!("NCCL {what}: backend mismatch"))))
    }
}

/// The NCCL collectives kiln runs.
#[derive(Debug, Clone, Copy)]
enum Call {
    /// `ncclAllReduce` (sum) into a buffer of the input's length.
    AllReduce,
    /// `ncclAllGather` into a buffer of `world` times the input's length.
    AllGather { world: usize },
}

impl Call {
    fn name(self) -> &'static str {
        match self {
            Call::AllReduce => "all-reduce",
            Call::AllGather { .. } => "all-gather",
        }
    }
}

impl Link {
    /// `call` from `input` (of NCCL dtype `dtype`) into `output`, inside the fusion stream.
    fn launch(&self, input: &CubeTensor<CudaRuntime>, output: &CubeTensor<CudaRuntime>, dtype: i32, call: Call) -> Result<()> {
        let client = &input.client;
        let what = call.name();
        // The buffers first (looking one up may queue a wait for its stream on cubecl's stream),
        // then wait for everything queued there: the input's kernels.
        let resource = |t: &CubeTensor<CudaRuntime>| client.get_resource(t.handle.clone()).map_err(|e| Error::Distributed(format!("NCCL {what}: no device buffer ({e:?})")));
        let (src, dst) = (resource(input)?, resource(output)?);
        cubecl::future::block_on(client.sync()).map_err(|e| Error::Distributed(format!("the device failed before an NCCL {what}: {e:?}")))?;
        let count = input.meta.num_elements();
        // SAFETY: `ctx` is the device's primary context; `src` is a live device buffer of `count`
        // values of the tensor's dtype on it and `dst` one of the call's output length (their
        // managed resources keep them allocated until the wait below has seen the operation
        // finish).
        unsafe {
            cu::ctx::set_current(self.ctx).map_err(|e| driver("cuCtxSetCurrent", e))?;
            let (src, dst, stream) = (src.resource().ptr, dst.resource().ptr, self.stream as *mut _);
            match call {
                Call::AllReduce => self.nccl.all_reduce(src, dst, count, dtype, op::SUM, self.comm, stream)?,
                Call::AllGather { .. } => self.nccl.all_gather(src, dst, count, dtype, self.comm, stream)?,
            }
        }
        self.wait()
    }

    /// Waits for the stream, watching the run's abort flag and NCCL's asynchronous error; on
    /// either the communicator is aborted (its kernels stop) and marked dead.
    fn wait(&self) -> Result<()> {
        let event = cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(|e| driver("cuEventCreate", e))?;
        // SAFETY: `event` and `stream` belong to the current context.
        let recorded = unsafe { cu::event::record(event, self.stream) }.map_err(|e| driver("cuEventRecord", e));
        let began = Instant::now();
        let result = recorded.and_then(|()| loop {
            // SAFETY: `event` is live until destroyed below.
            match unsafe { cu::event::query(event) } {
                Ok(()) => break Ok(()),
                Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_READY => {}
                Err(e) => break Err(driver("cuEventQuery", e)),
            }
            // SAFETY: the communicator is live (not yet aborted).
            let failed = unsafe { self.nccl.async_error(self.comm) }.err().or_else(|| self.abort.check().err());
            if let Some(e) = failed {
                // SAFETY: the communicator is not used again (marked dead).
                unsafe { self.nccl.comm_abort(self.comm) };
                self.dead.store(true, Ordering::Release);
                break Err(e);
            }
            // Spin briefly (a bucket takes milliseconds on NVLink), then poll at 100 µs.
            if began.elapsed() < Duration::from_millis(2) {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        });
        // SAFETY: the event is no longer used.
        let _ = unsafe { cu::event::destroy(event) };
        result
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // SAFETY: the communicator and stream are this struct's and no longer used (the last
        // reference is gone); an aborted communicator is already freed.
        unsafe {
            let _ = cu::ctx::set_current(self.ctx);
            if !self.dead.load(Ordering::Acquire) {
                self.nccl.comm_destroy(self.comm);
            }
            let _ = cu::stream::destroy(self.stream);
        }
    }
}
