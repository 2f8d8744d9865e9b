//! Backend selection for kiln: parses a device name (`cpu`, `wgpu`, `wgpu:1`, `cuda`, `cuda:0`)
//! and runs a job generic over burn's `Backend` on it, wrapped in `Autodiff<_>` when the job
//! trains.
//!
//! Backends are cargo features: `cpu` (default), `wgpu`, `cuda`. A name whose feature was not
//! compiled in is a clear error, not a silent fallback. A device that fails while a job runs
//! ends the job with [`BackendError::Device`] (see [`device`]), never with a result computed
//! after the failure.

use std::str::FromStr;

pub mod device;

use burn::tensor::backend::{AutodiffBackend, Backend};

/// The CPU backend used for tests and the embedded default.
#[cfg(feature = "cpu")]
pub type Cpu = burn::backend::Flex;
/// The wgpu backend (Vulkan/Metal/DX12; Mesa lavapipe on machines without a GPU).
#[cfg(feature = "wgpu")]
pub type Wgpu = burn::backend::Wgpu<f32, i32>;
/// The CUDA backend.
#[cfg(feature = "cuda")]
pub type Cuda = burn::backend::Cuda<f32, i32>;

/// A device chosen by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    Wgpu(usize),
    Cuda(usize),
}

/// Errors of backend selection.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("unknown backend {0:?}: expected cpu, wgpu[:N] or cuda[:N]")]
    Unknown(String),
    #[error("backend {0:?} is not compiled into this build (rebuild with `--features {1}`)")]
    NotCompiled(String, &'static str),
    #[error("the devices of a run must all be of one backend (got {0} and {1})")]
    Mixed(String, String),
    /// The device failed, or a tensor was larger than it allows, while the job ran.
    #[error(transparent)]
    Device(#[from] device::DeviceError),
}

/// Runs `job` on `device` under [`device::guard`].
fn on<B: Backend, T>(device: B::Device, job: impl FnOnce(B::Device) -> T) -> Result<T, BackendError> {
    let first = device.clone();
    Ok(device::guard::<B, _>(&first, || job(device))?)
}

/// [`on`] for replicas (the first device is synchronised; failures are recorded process-wide).
fn on_all<B: Backend, T>(devices: Vec<B::Device>, job: impl FnOnce(Vec<B::Device>) -> T) -> Result<T, BackendError> {
    let first = devices.first().cloned().unwrap_or_default();
    Ok(device::guard::<B, _>(&first, || job(devices))?)
}

impl FromStr for DeviceSpec {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, index) = match s.split_once(':') {
            Some((name, index)) => (name, Some(index.parse::<usize>().map_err(|_| BackendError::Unknown(s.into()))?)),
            None => (s, None),
        };
        match (name, index) {
            ("cpu", None) => Ok(Self::Cpu),
            ("wgpu", i) => Ok(Self::Wgpu(i.unwrap_or(0))),
            ("cuda", i) => Ok(Self::Cuda(i.unwrap_or(0))),
            _ => Err(BackendError::Unknown(s.into())),
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => write!(f, "cpu"),
            Self::Wgpu(i) => write!(f, "wgpu:{i}"),
            Self::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// Work that runs on any backend (inference).
pub trait Job {
    type Output;
    fn run<B: Backend>(self, device: B::Device) -> Self::Output;
}

/// Work that needs gradients (training).
pub trait TrainJob {
    type Output;
    fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output;
}

/// Runs `job` on the device named by `spec`.
pub fn run<J: Job>(spec: DeviceSpec, job: J) -> Result<J::Output, BackendError> {
    match spec {
        #[cfg(feature = "cpu")]
        DeviceSpec::Cpu => on::<Cpu, _>(Default::default(), |d| job.run::<Cpu>(d)),
        #[cfg(feature = "wgpu")]
        DeviceSpec::Wgpu(i) => on::<Wgpu, _>(wgpu_device(i), |d| job.run::<Wgpu>(d)),
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(i) => on::<Cuda, _>(burn::backend::cuda::CudaDevice::new(i), |d| job.run::<Cuda>(d)),
        #[allow(unreachable_patterns)]
        other => Err(not_compiled(other)),
    }
}

/// Runs `job` on the device named by `spec`, with autodiff.
pub fn run_training<J: TrainJob>(spec: DeviceSpec, job: J) -> Result<J::Output, BackendError> {
    run_training_with(spec, false, job)
}

/// [`run_training`]; with `recompute`, autodiff with burn's `BalancedCheckpointing` (burn selects
/// the strategy by the autodiff backend's type, `Autodiff<B, BalancedCheckpointing>`), which
/// recomputes memory-bound operations (elementwise ops, reductions, the softmax) from kept
/// inputs, and for which kiln's model checkpoints every decoder layer
/// (`kiln_core::model::checkpoint`: only the layers' inputs are kept).
pub fn run_training_with<J: TrainJob>(spec: DeviceSpec, recompute: bool, job: J) -> Result<J::Output, BackendError> {
    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing as Recompute;
    match (spec, recompute) {
        #[cfg(feature = "cpu")]
        (DeviceSpec::Cpu, true) => on::<Cpu, _>(Default::default(), |d| job.run::<Autodiff<Cpu, Recompute>>(d)),
        #[cfg(feature = "wgpu")]
        (DeviceSpec::Wgpu(i), true) => on::<Wgpu, _>(wgpu_device(i), |d| job.run::<Autodiff<Wgpu, Recompute>>(d)),
        #[cfg(feature = "cuda")]
        (DeviceSpec::Cuda(i), true) => on::<Cuda, _>(burn::backend::cuda::CudaDevice::new(i), |d| job.run::<Autodiff<Cuda, Recompute>>(d)),
        (spec, false) => run_plain(spec, job),
        #[allow(unreachable_patterns)]
        (other, _) => Err(not_compiled(other)),
    }
}

fn run_plain<J: TrainJob>(spec: DeviceSpec, job: J) -> Result<J::Output, BackendError> {
    use burn::backend::Autodiff;
    match spec {
        #[cfg(feature = "cpu")]
        DeviceSpec::Cpu => on::<Cpu, _>(Default::default(), |d| job.run::<Autodiff<Cpu>>(d)),
        #[cfg(feature = "wgpu")]
        DeviceSpec::Wgpu(i) => on::<Wgpu, _>(wgpu_device(i), |d| job.run::<Autodiff<Wgpu>>(d)),
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(i) => on::<Cuda, _>(burn::backend::cuda::CudaDevice::new(i), |d| job.run::<Autodiff<Cuda>>(d)),
        #[allow(unreachable_patterns)]
        other => Err(not_compiled(other)),
    }
}

/// Work that trains on several devices of one backend (data-parallel replicas).
pub trait ReplicaJob {
    type Output;
    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output;
}

/// Runs `job` on the devices named by `specs` (all of one backend, e.g. `cuda:0, cuda:1` or
/// `cpu, cpu`), with autodiff.
pub fn run_replicas<J: ReplicaJob>(specs: &[DeviceSpec], job: J) -> Result<J::Output, BackendError> {
    run_replicas_with(specs, false, job)
}

/// [`run_replicas`]; with `recompute`, activations are recomputed in the backward pass as in
/// [`run_training_with`].
pub fn run_replicas_with<J: ReplicaJob>(specs: &[DeviceSpec], recompute: bool, job: J) -> Result<J::Output, BackendError> {
    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing as Recompute;
    let first = *specs.first().ok_or_else(|| BackendError::Unknown(String::new()))?;
    if let Some(other) = specs.iter().find(|s| std::mem::discriminant(*s) != std::mem::discriminant(&first)) {
        return Err(BackendError::Mixed(first.to_string(), other.to_string()));
    }
    #[allow(unused_variables)]
    let indices: Vec<usize> = specs.iter().map(|s| match s {
        DeviceSpec::Cpu => 0,
        DeviceSpec::Wgpu(i) | DeviceSpec::Cuda(i) => *i,
    }).collect();
    match (first, recompute) {
        #[cfg(feature = "cpu")]
        (DeviceSpec::Cpu, false) => on_all::<Cpu, _>(vec![Default::default(); specs.len()], |d| job.run::<Autodiff<Cpu>>(d)),
        #[cfg(feature = "cpu")]
        (DeviceSpec::Cpu, true) => on_all::<Cpu, _>(vec![Default::default(); specs.len()], |d| job.run::<Autodiff<Cpu, Recompute>>(d)),
        #[cfg(feature = "wgpu")]
        (DeviceSpec::Wgpu(_), false) => on_all::<Wgpu, _>(indices.into_iter().map(wgpu_device).collect(), |d| job.run::<Autodiff<Wgpu>>(d)),
        #[cfg(feature = "wgpu")]
        (DeviceSpec::Wgpu(_), true) => on_all::<Wgpu, _>(indices.into_iter().map(wgpu_device).collect(), |d| job.run::<Autodiff<Wgpu, Recompute>>(d)),
        #[cfg(feature = "cuda")]
        (DeviceSpec::Cuda(_), false) => on_all::<Cuda, _>(indices.into_iter().map(burn::backend::cuda::CudaDevice::new).collect(), |d| job.run::<Autodiff<Cuda>>(d)),
        #[cfg(feature = "cuda")]
        (DeviceSpec::Cuda(_), true) => {
            on_all::<Cuda, _>(indices.into_iter().map(burn::backend::cuda::CudaDevice::new).collect(), |d| job.run::<Autodiff<Cuda, Recompute>>(d))
        }
        #[allow(unreachable_patterns)]
        (other, _) => Err(not_compiled(other)),
    }
}

#[cfg(feature = "wgpu")]
fn wgpu_device(index: usize) -> burn::backend::wgpu::WgpuDevice {
    if index == 0 { burn::backend::wgpu::WgpuDevice::DefaultDevice } else { burn::backend::wgpu::WgpuDevice::DiscreteGpu(index) }
}

#[allow(dead_code)]
fn not_compiled(spec: DeviceSpec) -> BackendError {
    let feature = match spec {
        DeviceSpec::Cpu => "cpu",
        DeviceSpec::Wgpu(_) => "wgpu",
        DeviceSpec::Cuda(_) => "cuda",
    };
    BackendError::NotCompiled(spec.to_string(), feature)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_names() {
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("wgpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Wgpu(0));
        assert_eq!("cuda:1".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(1));
        assert!("cuda:x".parse::<DeviceSpec>().is_err());
        assert!("tpu".parse::<DeviceSpec>().is_err());
    }

    #[test]
    fn replicas_need_one_backend() {
        struct Count;
        impl ReplicaJob for Count {
            type Output = usize;
            fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> usize {
                devices.len()
            }
        }
        let err = run_replicas(&[DeviceSpec::Cpu, DeviceSpec::Cuda(0)], Count).unwrap_err();
        assert_eq!(err.to_string(), "the devices of a run must all be of one backend (got cpu and cuda:0)");
        #[cfg(feature = "cpu")]
        assert_eq!(run_replicas(&[DeviceSpec::Cpu, DeviceSpec::Cpu], Count).unwrap(), 2);
    }
}
