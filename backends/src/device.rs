//! Device failures made visible, and the device's limits asked before a tensor is built.
//!
//! cubecl runs each GPU device on threads of its own (`DSU-…`, `DSD-…`): a failed allocation
//! panics there, the panic is caught, and the caller goes on with an unbound tensor: a figure
//! or a checkpoint computed after it would be silently wrong. [`watch`] records such panics
//! (the first one and a count) instead of printing each, [`check`] turns a recorded failure or
//! an error the device reports on `sync` into a [`DeviceError`], and [`crate::run`] and its
//! siblings return it as the job's error. Code that is about to build a tensor larger than the
//! device's largest buffer ([`max_buffer`]) calls [`ensure_fits`], which stops the job with the
//! sizes instead of letting the device thread fail.

use std::any::Any;
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};

use burn::tensor::backend::Backend;

/// A device that failed, or a tensor it cannot hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// One tensor needs more than the device's largest buffer.
    #[error("{what} needs {} in one buffer, more than {device} allows ({} largest buffer){hint}", bytes_text(*bytes as f64), bytes_text(*limit as f64))]
    TooLarge {
        /// The device, e.g. `wgpu`.
        device: String,
        /// The tensor and its shape, e.g. `attention scores [1, 4, 4096, 4096] f32`.
        what: String,
        bytes: u64,
        limit: u64,
        /// What to change, starting with "; " (or empty).
        hint: String,
    },
    /// A device thread panicked (an allocation, a kernel launch or a lost device).
    #[error("the device failed on thread {thread}: {message}{}", more_text(*more))]
    Fault {
        thread: String,
        /// The first failure's message (its first line) and where it was raised.
        message: String,
        /// How many more failures followed.
        more: usize,
    },
    /// The device reported an error when the work queued on it was synchronised.
    #[error("the device reported an error: {0}")]
    Execution(String),
}

/// `bytes` for a person: PiB, TiB, GiB or MiB with two decimals (bytes below a MiB).
pub fn bytes_text(bytes: f64) -> String {
    let units = [("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20)];
    match units.iter().find(|(_, shift)| bytes >= (1u64 << shift) as f64) {
        Some((unit, shift)) => format!("{:.2} {unit}", bytes / (1u64 << shift) as f64),
        None => format!("{bytes} bytes"),
    }
}

fn more_text(more: usize) -> String {
    match more {
        0 => String::new(),
        n => format!(" (and {n} more failures)"),
    }
}

static FIRST_FAULT: Mutex<Option<(String, String)>> = Mutex::new(None);
static FAULTS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether a [`DeviceError`] panic on this thread is caught by [`guard`] (and so is not
    /// printed by the hook).
    static GUARDED: Cell<bool> = const { Cell::new(false) };
}

/// Whether `name` is one of cubecl's device threads (`DS{U|D}-<type>-<index>`,
/// cubecl-common's `device::handle::channel`).
fn is_device_thread(name: &str) -> bool {
    (name.starts_with("DSU-") || name.starts_with("DSD-")) && name.matches('-').count() == 2
}

/// Installs the panic hook that records device-thread failures (once per process; other
/// panics go to the hook that was installed before).
pub fn watch() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(err) = info.payload().downcast_ref::<DeviceError>() {
                if !GUARDED.get() {
                    eprintln!("error: {err}");
                }
                return;
            }
            if GUARDED.get() && FAULTS.load(Ordering::SeqCst) > 0 {
                // A consequence of the device failure (e.g. a call to the failed device thread
                // that returns no answer): `guard` reports the failure itself.
                return;
            }
            let thread = std::thread::current();
            let name = thread.name().unwrap_or_default();
            if is_device_thread(name) {
                let message = payload_text(info.payload());
                let first_line = message.lines().next().unwrap_or_default().trim().to_string();
                let place = info.location().map(|l| format!(" (at {}:{})", l.file(), l.line())).unwrap_or_default();
                let mut first = FIRST_FAULT.lock().unwrap_or_else(|e| e.into_inner());
                if first.is_none() {
                    *first = Some((name.to_string(), format!("{first_line}{place}")));
                }
                FAULTS.fetch_add(1, Ordering::SeqCst);
                return;
            }
            previous(info);
        }));
    });
}

fn payload_text(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "(no message)".into(),
    }
}

/// The first device failure recorded by [`watch`] since the process started, if any.
pub fn fault() -> Option<DeviceError> {
    let count = FAULTS.load(Ordering::SeqCst);
    if count == 0 {
        return None;
    }
    let first = FIRST_FAULT.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (thread, message) = first.unwrap_or_default();
    Some(DeviceError::Fault { thread, message, more: count - 1 })
}

/// Waits for the work queued on `device` and returns the first failure: one recorded by
/// [`watch`], or an error the device reports. Call it before writing a result computed there.
pub fn check<B: Backend>(device: &B::Device) -> Result<(), DeviceError> {
    if let Some(err) = fault() {
        return Err(err);
    }
    let synced = catch_unwind(AssertUnwindSafe(|| B::sync(device)));
    if let Some(err) = fault() {
        return Err(err);
    }
    match synced {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(DeviceError::Execution(err.to_string().replace('\n', " "))),
        Err(payload) => Err(DeviceError::Execution(payload_text(payload.as_ref()))),
    }
}

/// The largest buffer, in bytes, one tensor may occupy on `device` (for wgpu the adapter's
/// largest storage-buffer binding; for CUDA cubecl's largest memory page); `None` where no
/// limit applies (the CPU).
pub fn max_buffer<B: Backend>(device: &B::Device) -> Option<u64> {
    limit_of::<B>(device).map(|(_, limit)| limit)
}

/// The device's name and its largest buffer, for the devices that have one.
fn limit_of<B: Backend>(device: &B::Device) -> Option<(String, u64)> {
    #[allow(unused_variables)]
    let any = device as &dyn Any;
    #[cfg(feature = "wgpu")]
    if let Some(device) = any.downcast_ref::<burn::backend::wgpu::WgpuDevice>() {
        use burn::cubecl::Runtime;
        let limit = burn::backend::wgpu::WgpuRuntime::client(device).properties().memory.max_page_size;
        return Some((format!("the wgpu device ({device:?})"), limit));
    }
    #[cfg(feature = "cuda")]
    if let Some(device) = any.downcast_ref::<burn::backend::cuda::CudaDevice>() {
        use burn::cubecl::Runtime;
        let limit = burn::cubecl::cuda::CudaRuntime::client(device).properties().memory.max_page_size;
        return Some((format!("the CUDA device {}", device.index), limit));
    }
    None
}

/// What the device's allocator holds now (cubecl's memory pools), for the GPU backends; `None`
/// on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Bytes of live tensors (without padding).
    pub in_use: u64,
    /// Bytes the pools have reserved from the device (what `nvidia-smi` sees of the process,
    /// less the context). Pools keep pages, so after a step this bounds its peak from above.
    pub reserved: u64,
}

/// The device allocator's [`MemoryUsage`] (waits for the work queued so far).
pub fn memory_usage<B: Backend>(device: &B::Device) -> Option<MemoryUsage> {
    #[allow(unused_variables)]
    let any = device as &dyn Any;
    #[cfg(feature = "wgpu")]
    if let Some(device) = any.downcast_ref::<burn::backend::wgpu::WgpuDevice>() {
        use burn::cubecl::Runtime;
        let usage = burn::backend::wgpu::WgpuRuntime::client(device).memory_usage().ok()?;
        return Some(MemoryUsage { in_use: usage.bytes_in_use, reserved: usage.bytes_reserved });
    }
    #[cfg(feature = "cuda")]
    if let Some(device) = any.downcast_ref::<burn::backend::cuda::CudaDevice>() {
        use burn::cubecl::Runtime;
        let usage = burn::cubecl::cuda::CudaRuntime::client(device).memory_usage().ok()?;
        return Some(MemoryUsage { in_use: usage.bytes_in_use, reserved: usage.bytes_reserved });
    }
    None
}

/// Stops the job with [`DeviceError::TooLarge`] when a tensor of `bytes` would not fit in one
/// buffer of `device`, before anything is allocated; `what` names the tensor and `hint` says
/// what to change. [`crate::run`] and its siblings return it as the job's error (other callers
/// see a panic whose payload is the error; [`guard`] catches it).
pub fn ensure_fits<B: Backend>(device: &B::Device, bytes: u64, what: impl FnOnce() -> String, hint: &str) {
    if let Some(err) = too_large::<B>(device, bytes, what, hint) {
        watch();
        std::panic::panic_any(err);
    }
}

/// The [`DeviceError::TooLarge`] of a tensor of `bytes` on `device`, if it does not fit (for
/// code that returns errors instead of stopping the job).
pub fn too_large<B: Backend>(device: &B::Device, bytes: u64, what: impl FnOnce() -> String, hint: &str) -> Option<DeviceError> {
    let (name, limit) = limit_of::<B>(device)?;
    (bytes > limit).then(|| DeviceError::TooLarge {
        device: name,
        what: what(),
        bytes,
        limit,
        hint: if hint.is_empty() { String::new() } else { format!("; {hint}") },
    })
}

/// Settles cubecl's configuration before a GPU device is first used (once per process), from
/// what cubecl itself reads (`cubecl.toml`, `burn.toml`'s `[cubecl]`, `CUBECL_*`), adding
/// what kiln wants and the user did not set: `KILN_KERNEL_CACHE=DIR` keeps the autotune results
/// in DIR instead of the nearest Cargo project's `target/`, and compiled kernels are cached on
/// disk beside them (CUDA's PTX; wgpu's WGSL pipelines have no disk cache in cubecl 0.10), so
/// that a second process does not compile them again. A configuration the embedding program
/// set itself is left as it is.
pub fn configure_kernels() {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            if CubeClRuntimeConfig::storage().lock().is_some() {
                return;
            }
            let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
            if let Some(dir) = std::env::var_os("KILN_KERNEL_CACHE").filter(|d| !d.is_empty()) {
                config.autotune.cache = burn::cubecl::config::cache::CacheConfig::File(dir.into());
            }
            if config.compilation.cache.is_none() {
                config.compilation.cache = Some(config.autotune.cache.clone());
            }
            if CubeClRuntimeConfig::storage().lock().is_none() {
                CubeClRuntimeConfig::set(config);
            }
        });
    }
}

/// The kernels burn's autotune chose on this machine, from cubecl's autotune cache (every shape
/// tuned so far, on any device): for each tuned operation (the cache file's name, e.g.
/// `burn_cubecl-kernel-matmul-tune-base`), how many shapes each kernel won. Empty without a
/// GPU backend or before anything was tuned.
pub fn autotune_choices() -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, usize>> {
    #[allow(unused_mut)]
    let mut choices = std::collections::BTreeMap::<String, std::collections::BTreeMap<String, usize>>::new();
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
        let root = CubeClRuntimeConfig::get().autotune.cache.root().join("autotune");
        let mut files = Vec::new();
        let mut dirs = vec![root];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.to_string_lossy().ends_with(".json.log") {
                    files.push(path);
                }
            }
        }
        for path in files {
            let name = path.file_name().map(|n| n.to_string_lossy().trim_end_matches(".json.log").to_string()).unwrap_or_default();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            // Entries `{"key": …, "value": {"fastest_index": i, "results": [fastest first]}}`.
            for entry in serde_json::Deserializer::from_str(&text).into_iter::<serde_json::Value>().flatten() {
                if let Some(kernel) = entry.pointer("/value/results/0/outcome/Ok/name").and_then(|n| n.as_str()) {
                    *choices.entry(name.clone()).or_default().entry(kernel.to_string()).or_default() += 1;
                }
            }
        }
    }
    choices
}

/// Runs `job` and returns its output, or the device's failure: a [`DeviceError`] it stopped
/// with, a failure [`watch`] recorded while it ran (also when the job panicked because of it),
/// or an error the device reports when synchronised afterwards. Other panics go on unwinding.
pub fn guard<B: Backend, T>(device: &B::Device, job: impl FnOnce() -> T) -> Result<T, DeviceError> {
    watch();
    configure_kernels();
    let was = GUARDED.replace(true);
    let result = catch_unwind(AssertUnwindSafe(job));
    GUARDED.set(was);
    match result {
        Ok(out) => check::<B>(device).map(|()| out),
        Err(payload) => match (payload.downcast::<DeviceError>(), fault()) {
            (Ok(err), _) => Err(*err),
            (Err(_), Some(err)) => Err(err),
            (Err(payload), None) => resume_unwind(payload),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_threads_by_name() {
        assert!(is_device_thread("DSD-2-0"));
        assert!(is_device_thread("DSU-5-1"));
        assert!(!is_device_thread("main"));
        assert!(!is_device_thread("DSD-worker"));
    }

    #[test]
    fn sizes_read_as_a_person_would() {
        let err = DeviceError::TooLarge {
            device: "the wgpu device (DefaultDevice)".into(),
            what: "attention scores [1, 4, 4096, 4096] f32".into(),
            bytes: 256 << 20,
            limit: 128 << 20,
            hint: "; shorten the sequence".into(),
        };
        assert_eq!(
            err.to_string(),
            "attention scores [1, 4, 4096, 4096] f32 needs 256.00 MiB in one buffer, more than the wgpu device (DefaultDevice) allows (128.00 MiB largest buffer); shorten the sequence"
        );
    }
}
