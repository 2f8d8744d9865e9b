//! NCCL, loaded at run time: the collective library CUDA replicas all-reduce their gradients
//! with (device to device, inside a node over NVLink and across nodes over the network), where
//! the CPU uses kiln's TCP ring ([`super::ring`]).
//!
//! kiln is built without CUDA and opens `libnccl` only when a CUDA run needs it, searching, in
//! order:
//! 1. `KILN_NCCL_LIB`, the path of the library file, when set;
//! 2. `libnccl.so.2` and `libnccl.so` on the dynamic loader's path (`LD_LIBRARY_PATH`, the
//!    `ld.so` cache, `/lib`, `/usr/lib`: the distributions' `libnccl2` packages, CUDA images);
//! 3. the lib directory of the `nvidia-nccl-cu*` wheel (what `pip install torch` brings):
//!    under `$VIRTUAL_ENV`, `$CONDA_PREFIX`, `~/.local` and `/usr/local`, and wherever the
//!    first `python3` on the path imports `nvidia.nccl` from.
//!
//! A failure is one line naming libnccl, every name and directory tried, and what to do
//! ([`Nccl::load`]). cudarc's own NCCL module (which cubecl-cuda uses inside one process) is
//! not used for this: it never tries `libnccl.so.2` and panics when the library is missing.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// `ncclUniqueId`: what rank 0 makes and every rank passes to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId(pub [c_char; 128]);

/// `ncclResult_t`; 0 is success.
type NcclResult = c_int;
/// `ncclComm_t`.
pub type Comm = *mut c_void;

/// `ncclDataType_t` values (nccl.h).
pub mod dtype {
    pub const FLOAT16: i32 = 6;
    pub const FLOAT32: i32 = 7;
    pub const BFLOAT16: i32 = 9;
}

/// `ncclRedOp_t` values (nccl.h).
pub mod op {
    pub const SUM: i32 = 0;
    pub const AVG: i32 = 4;
}

/// The library file names tried on the loader's path (and in each directory), in order.
pub const NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

type GetVersion = unsafe extern "C" fn(*mut c_int) -> NcclResult;
type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> NcclResult;
type CommInitRank = unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult;
type AllReduce = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, *mut c_void) -> NcclResult;
type AllGather = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, *mut c_void) -> NcclResult;
type CommDestroy = unsafe extern "C" fn(Comm) -> NcclResult;
type CommAbort = unsafe extern "C" fn(Comm) -> NcclResult;
type CommGetAsyncError = unsafe extern "C" fn(Comm, *mut NcclResult) -> NcclResult;
type GetErrorString = unsafe extern "C" fn(NcclResult) -> *const c_char;

/// The NCCL library this process opened, and the entry points kiln calls.
pub struct Nccl {
    /// The file or name it was opened as.
    pub path: String,
    /// `ncclGetVersion`: 22803 for 2.28.3.
    pub version: i32,
    get_unique_id: GetUniqueId,
    comm_init_rank: CommInitRank,
    all_reduce: AllReduce,
    all_gather: AllGather,
    comm_destroy: CommDestroy,
    comm_abort: CommAbort,
    comm_get_async_error: CommGetAsyncError,
    get_error_string: GetErrorString,
    _lib: libloading::Library,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NCCL {} ({})", self.version_string(), self.path)
    }
}

/// Where the search looks: the names on the loader's path, then these directories.
#[derive(Debug, Clone, Default)]
pub struct Search {
    /// `KILN_NCCL_LIB`.
    pub explicit: Option<PathBuf>,
    /// Directories holding the wheel's library, tried with each of [`NAMES`].
    pub dirs: Vec<PathBuf>,
    /// `LD_LIBRARY_PATH`, for the message (the loader reads it itself).
    pub ld_library_path: Option<String>,
}

impl Search {
    /// This process's search: its environment, and the wheel's directories that exist.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let mut roots: Vec<PathBuf> = Vec::new();
        for name in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
            roots.extend(var(name).map(PathBuf::from));
        }
        if let Some(home) = var("HOME") {
            roots.push(Path::new(&home).join(".local"));
        }
        roots.extend(["/usr/local", "/usr", "/opt/conda"].map(PathBuf::from));
        let mut dirs = Vec::new();
        for root in roots {
            for site in python_site_dirs(&root) {
                dirs.push(site.join("nvidia/nccl/lib"));
            }
        }
        dirs.extend(python_wheel_dir());
        let mut seen = std::collections::HashSet::new();
        dirs.retain(|d| d.is_dir() && seen.insert(d.clone()));
        Self {
            explicit: var("KILN_NCCL_LIB").map(PathBuf::from),
            dirs,
            ld_library_path: std::env::var("LD_LIBRARY_PATH").ok().filter(|v| !v.is_empty()),
        }
    }
}

/// `root/lib/python3.*/{site,dist}-packages` and `root/lib/python3/dist-packages` that exist.
fn python_site_dirs(root: &Path) -> Vec<PathBuf> {
    let lib = root.join("lib");
    let mut out = vec![lib.join("python3/dist-packages")];
    if let Ok(entries) = std::fs::read_dir(&lib) {
        let mut versions: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("python3."))).collect();
        versions.sort();
        for v in versions {
            out.push(v.join("site-packages"));
            out.push(v.join("dist-packages"));
        }
    }
    out.retain(|p| p.is_dir());
    out
}

/// The lib directory of the `nvidia.nccl` package the first `python3` on the path imports.
fn python_wheel_dir() -> Option<PathBuf> {
    let output = std::process::Command::new("python3")
        .args(["-c", "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let line = String::from_utf8(output.stdout).ok()?;
    let dir = PathBuf::from(line.trim());
    (output.status.success() && dir.is_dir()).then_some(dir)
}

static LOADED: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();

impl Nccl {
    /// The process's NCCL, opened on first use: `KILN_NCCL_LIB` and the loader's path first,
    /// and only if those fail the wheel's directories ([`Search::from_env`], which may ask
    /// `python3`).
    pub fn load() -> Result<&'static Nccl> {
        LOADED
            .get_or_init(|| {
                let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
                let quick = Search { explicit: var("KILN_NCCL_LIB").map(PathBuf::from), dirs: Vec::new(), ld_library_path: None };
                Self::open(&quick).or_else(|_| Self::open(&Search::from_env()))
            })
            .as_ref()
            .map_err(|e| Error::Distributed(e.clone()))
    }

    /// Opens the first library `search` finds; the error is the one line described above.
    pub fn open(search: &Search) -> std::result::Result<Nccl, String> {
        let mut failures: Vec<String> = Vec::new();
        let mut candidates: Vec<(String, bool)> = Vec::new();
        if let Some(path) = &search.explicit {
            candidates.push((path.display().to_string(), true));
        }
        candidates.extend(NAMES.iter().map(|n| (n.to_string(), false)));
        for dir in &search.dirs {
            candidates.extend(NAMES.iter().map(|n| (dir.join(n).display().to_string(), true)));
        }
        for (candidate, is_path) in &candidates {
            if *is_path && !Path::new(candidate).exists() {
                continue;
            }
            // SAFETY: opening NCCL runs its initialisers, which only register its symbols.
            match unsafe { libloading::Library::new(candidate) } {
                Ok(lib) => match Self::bind(lib, candidate) {
                    Ok(nccl) => return Ok(nccl),
                    Err(e) => failures.push(e),
                },
                // A file that exists but would not open (wrong architecture, a missing CUDA
                // runtime) is worth its reason; a name the loader did not find is not.
                Err(e) if *is_path => failures.push(format!("{candidate}: {e}")),
                Err(_) => {}
            }
        }
        let explicit = search.explicit.as_ref().map(|p| format!("KILN_NCCL_LIB={} (no such file), ", p.display())).filter(|_| search.explicit.as_ref().is_some_and(|p| !p.exists()));
        let ld = search.ld_library_path.as_deref().map_or("LD_LIBRARY_PATH unset".to_string(), |v| format!("LD_LIBRARY_PATH={v}"));
        let dirs = if search.dirs.is_empty() {
            "no nvidia-nccl wheel found (looked under $VIRTUAL_ENV, $CONDA_PREFIX, ~/.local, /usr/local, /usr, /opt/conda and python3's nvidia.nccl)".to_string()
        } else {
            format!("the nvidia-nccl wheel's {}", search.dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "))
        };
        let failed = if failures.is_empty() { String::new() } else { format!("; {}", failures.join("; ")) };
        Err(format!(
            "NCCL (libnccl) could not be loaded: tried {}{} on the loader's path ({ld}, the ld.so cache, /lib, /usr/lib) and in {dirs}{failed}. \
             Install it (`pip install nvidia-nccl-cu12`, or the distribution's libnccl2), set KILN_NCCL_LIB to libnccl.so.2, or use kiln's TCP ring with --collective ring",
            explicit.unwrap_or_default(),
            NAMES.join(", "),
        ))
    }

    fn bind(lib: libloading::Library, path: &str) -> std::result::Result<Nccl, String> {
        // SAFETY: each symbol is NCCL's function of that name with the C signature of nccl.h
        // (2.x; the ABI kiln calls has not changed since 2.4).
        unsafe {
            fn sym<T: Copy>(lib: &libloading::Library, path: &str, name: &str) -> std::result::Result<T, String> {
                // SAFETY: see above.
                unsafe { lib.get::<T>(name.as_bytes()).map(|s| *s).map_err(|e| format!("{path} has no {name} ({e}): not NCCL 2")) }
            }
            let get_version: GetVersion = sym(&lib, path, "ncclGetVersion")?;
            let mut version = 0;
            let status = get_version(&mut version);
            if status != 0 {
                return Err(format!("{path}: ncclGetVersion failed with {status}"));
            }
            Ok(Nccl {
                path: path.to_string(),
                version,
                get_unique_id: sym(&lib, path, "ncclGetUniqueId")?,
                comm_init_rank: sym(&lib, path, "ncclCommInitRank")?,
                all_reduce: sym(&lib, path, "ncclAllReduce")?,
                all_gather: sym(&lib, path, "ncclAllGather")?,
                comm_destroy: sym(&lib, path, "ncclCommDestroy")?,
                comm_abort: sym(&lib, path, "ncclCommAbort")?,
                comm_get_async_error: sym(&lib, path, "ncclCommGetAsyncError")?,
                get_error_string: sym(&lib, path, "ncclGetErrorString")?,
                _lib: lib,
            })
        }
    }

    /// `2.28.3` for 22803 (versions before 2.9 were `major·1000 + minor·100 + patch`).
    pub fn version_string(&self) -> String {
        let v = self.version;
        if v >= 10_000 { format!("{}.{}.{}", v / 10_000, (v / 100) % 100, v % 100) } else { format!("{}.{}.{}", v / 1000, (v / 100) % 10, v % 100) }
    }

    fn check(&self, call: &str, status: NcclResult) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static C string for any result code.
        let text = unsafe { CStr::from_ptr((self.get_error_string)(status)) }.to_string_lossy().into_owned();
        Err(Error::Distributed(format!("NCCL {call} failed: {text} (ncclResult {status}; NCCL_DEBUG=WARN says more)")))
    }

    /// A new communicator id (rank 0 makes it; every rank gets a copy).
    pub fn unique_id(&self) -> Result<UniqueId> {
        let mut id = UniqueId([0; 128]);
        // SAFETY: `id` is a valid ncclUniqueId to write.
        self.check("ncclGetUniqueId", unsafe { (self.get_unique_id)(&mut id) })?;
        Ok(id)
    }

    /// Joins communicator `id` as `rank` of `world` on the current CUDA device (blocks until all
    /// ranks have joined).
    ///
    /// # Safety
    /// The calling thread's current CUDA context is the device's primary context.
    pub unsafe fn comm_init_rank(&self, id: UniqueId, rank: usize, world: usize) -> Result<Comm> {
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: `comm` is written by NCCL; the caller set the device.
        self.check("ncclCommInitRank", unsafe { (self.comm_init_rank)(&mut comm, world as c_int, id, rank as c_int) })?;
        Ok(comm)
    }

    /// Enqueues the all-reduce of `count` values of `dtype` from `send` into `recv` on `stream`.
    ///
    /// # Safety
    /// `send` and `recv` are device buffers of `count` values of `dtype` on the communicator's
    /// device, `comm` is live, and `stream` is a stream of that device's current context.
    #[allow(clippy::too_many_arguments)] // ncclAllReduce's own arguments
    pub unsafe fn all_reduce(&self, send: u64, recv: u64, count: usize, dtype: i32, op: i32, comm: Comm, stream: *mut c_void) -> Result<()> {
        // SAFETY: the caller's guarantees.
        self.check("ncclAllReduce", unsafe { (self.all_reduce)(send as *const c_void, recv as *mut c_void, count, dtype, op, comm, stream) })
    }

    /// Enqueues the all-gather of `count` values of `dtype` per rank from `send` into `recv`
    /// (rank `r`'s values at `r · count`) on `stream`.
    ///
    /// # Safety
    /// `send` is a device buffer of `count` values of `dtype`, `recv` one of `count` times the
    /// communicator's ranks, both on the communicator's device; `comm` is live, and `stream` is
    /// a stream of that device's current context.
    pub unsafe fn all_gather(&self, send: u64, recv: u64, count: usize, dtype: i32, comm: Comm, stream: *mut c_void) -> Result<()> {
        // SAFETY: the caller's guarantees.
        self.check("ncclAllGather", unsafe { (self.all_gather)(send as *const c_void, recv as *mut c_void, count, dtype, comm, stream) })
    }

    /// Frees a communicator (waiting for its unfinished operations).
    ///
    /// # Safety
    /// `comm` came from [`Nccl::comm_init_rank`] and is not used again.
    pub unsafe fn comm_destroy(&self, comm: Comm) {
        // SAFETY: the caller's guarantee.
        unsafe { (self.comm_destroy)(comm) };
    }

    /// Frees a communicator, stopping its unfinished operations (after a peer failed).
    ///
    /// # Safety
    /// As [`Nccl::comm_destroy`].
    pub unsafe fn comm_abort(&self, comm: Comm) {
        // SAFETY: the caller's guarantee.
        unsafe { (self.comm_abort)(comm) };
    }

    /// The error a communicator met asynchronously (a peer lost, a network failure), if any.
    ///
    /// # Safety
    /// `comm` is live.
    pub unsafe fn async_error(&self, comm: Comm) -> Result<()> {
        let mut status: NcclResult = 0;
        // SAFETY: the caller's guarantee; `status` is written.
        self.check("ncclCommGetAsyncError", unsafe { (self.comm_get_async_error)(comm, &mut status) })?;
        // 7 is ncclInProgress (a non-blocking communicator still initialising): not an error.
        if status == 7 { Ok(()) } else { self.check("a collective (asynchronous error)", status) }
    }
}

/// A [`UniqueId`] as hex, to travel over kiln's rendezvous.
pub fn id_to_hex(id: &UniqueId) -> String {
    id.0.iter().map(|b| format!("{:02x}", *b as u8)).collect()
}

/// The [`UniqueId`] written by [`id_to_hex`].
pub fn id_from_hex(hex: &str) -> Result<UniqueId> {
    let bad = || Error::Distributed(format!("rank 0 sent a malformed NCCL id ({} characters)", hex.len()));
    if hex.len() != 256 {
        return Err(bad());
    }
    let mut id = UniqueId([0; 128]);
    for (i, byte) in id.0.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())? as c_char;
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_nccl_is_one_line_naming_the_library_and_every_place_tried() {
        let dir = tempfile::tempdir().unwrap();
        let search = Search {
            explicit: Some(dir.path().join("nowhere/libnccl.so.2")),
            dirs: vec![dir.path().to_path_buf()],
            ld_library_path: Some("/opt/none".into()),
        };
        let err = Nccl::open(&search).unwrap_err();
        assert!(!err.contains('\n'), "{err}");
        for part in ["NCCL (libnccl)", "KILN_NCCL_LIB=", "(no such file)", "libnccl.so.2, libnccl.so", "LD_LIBRARY_PATH=/opt/none", "nvidia-nccl wheel's", "--collective ring"] {
            assert!(err.contains(part), "{part:?} missing from: {err}");
        }
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
    }

    #[test]
    fn a_file_that_is_not_nccl_is_named_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("libnccl.so.2"), b"not an ELF file").unwrap();
        let search = Search { explicit: None, dirs: vec![dir.path().to_path_buf()], ld_library_path: None };
        let err = Nccl::open(&search).unwrap_err();
        assert!(err.contains(&format!("{}: ", dir.path().join("libnccl.so.2").display())), "{err}");
        assert!(err.contains("LD_LIBRARY_PATH unset"), "{err}");
    }

    /// A stand-in libnccl.so.2 (C, built with the system's `cc`) with NCCL's entry points on
    /// host memory: the search finds it in a wheel directory, and kiln's calls reach it with
    /// NCCL's C signatures (the 128-byte id by value, the result codes and their strings).
    #[test]
    fn the_library_is_found_in_a_wheel_directory_and_called_with_ncclh_signatures() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("stub.c");
        std::fs::write(
            &source,
            r#"
#include <string.h>
#include <stddef.h>
typedef struct { char internal[128]; } ncclUniqueId;
int ncclGetVersion(int *v) { *v = 22803; return 0; }
int ncclGetUniqueId(ncclUniqueId *id) { for (int i = 0; i < 128; i++) id->internal[i] = (char)(i * 3); return 0; }
int ncclCommInitRank(void **comm, int nranks, ncclUniqueId id, int rank) {
    if (nranks != 1 || rank != 0 || id.internal[127] != (char)(127 * 3)) return 4;
    *comm = (void *)0x5eed; return 0;
}
int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, void *comm, void *stream) {
    if (dt != 7 || op != 0 || comm != (void *)0x5eed || stream != (void *)0x77) return 4;
    memcpy(r, s, n * 4); return 0;
}
int ncclAllGather(const void *s, void *r, size_t n, int dt, void *comm, void *stream) {
    if (dt != 9 || comm != (void *)0x5eed || stream != (void *)0x77) return 4;
    memcpy(r, s, n * 2); return 0;
}
int ncclCommDestroy(void *comm) { return 0; }
int ncclCommAbort(void *comm) { return 0; }
int ncclCommGetAsyncError(void *comm, int *e) { *e = comm == (void *)0x5eed ? 0 : 6; return 0; }
const char *ncclGetErrorString(int r) { return r == 4 ? "invalid argument" : "unknown"; }
"#,
        )
        .unwrap();
        let lib = dir.path().join("nvidia/nccl/lib");
        std::fs::create_dir_all(&lib).unwrap();
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(lib.join("libnccl.so.2"))
            .arg(&source)
            .status()
            .expect("this test builds a stand-in libnccl with `cc`: install a C compiler (build-essential)");
        assert!(status.success());
        let nccl = Nccl::open(&Search { explicit: None, dirs: vec![lib.clone()], ld_library_path: None }).unwrap();
        assert_eq!(nccl.path, lib.join("libnccl.so.2").display().to_string());
        assert_eq!((nccl.version, nccl.version_string().as_str()), (22803, "2.28.3"));
        let id = nccl.unique_id().unwrap();
        assert_eq!(id.0[127] as u8, (127 * 3) as u8);
        // SAFETY: the stub touches no device.
        let comm = unsafe { nccl.comm_init_rank(id, 0, 1) }.unwrap();
        let err = unsafe { nccl.comm_init_rank(id, 0, 2) }.unwrap_err().to_string();
        assert_eq!(err, "NCCL ncclCommInitRank failed: invalid argument (ncclResult 4; NCCL_DEBUG=WARN says more)");
        let (send, mut recv) = ([1.5f32, -2.0, 3.25], [0f32; 3]);
        // SAFETY: host buffers of three f32 for the stub, which copies them.
        unsafe { nccl.all_reduce(send.as_ptr() as u64, recv.as_mut_ptr() as u64, 3, dtype::FLOAT32, op::SUM, comm, 0x77 as *mut c_void) }.unwrap();
        assert_eq!(recv, send);
        assert!(unsafe { nccl.all_reduce(send.as_ptr() as u64, recv.as_mut_ptr() as u64, 3, dtype::BFLOAT16, op::SUM, comm, 0x77 as *mut c_void) }.is_err());
        // A one-rank all-gather of bf16 values is a copy (the stub takes bf16 only).
        let (send, mut recv) = ([0x3fc0u16, 0xc000], [0u16; 2]);
        // SAFETY: host buffers of two bf16 for the stub, which copies them.
        unsafe { nccl.all_gather(send.as_ptr() as u64, recv.as_mut_ptr() as u64, 2, dtype::BFLOAT16, comm, 0x77 as *mut c_void) }.unwrap();
        assert_eq!(recv, send);
        let err = unsafe { nccl.all_gather(send.as_ptr() as u64, recv.as_mut_ptr() as u64, 2, dtype::FLOAT32, comm, 0x77 as *mut c_void) }.unwrap_err().to_string();
        assert!(err.starts_with("NCCL ncclAllGather failed: invalid argument"), "{err}");
        // SAFETY: the stub's communicator; any other reports a remote error (6).
        unsafe { nccl.async_error(comm) }.unwrap();
        let remote = unsafe { nccl.async_error(0x1 as Comm) }.unwrap_err().to_string();
        assert!(remote.starts_with("NCCL a collective (asynchronous error) failed: unknown (ncclResult 6"), "{remote}");
        // SAFETY: made above, not used again.
        unsafe { nccl.comm_destroy(comm) };
        // KILN_NCCL_LIB wins over the search.
        let explicit = Nccl::open(&Search { explicit: Some(lib.join("libnccl.so.2")), dirs: vec![], ld_library_path: None }).unwrap();
        assert_eq!(explicit.path, lib.join("libnccl.so.2").display().to_string());
    }

    #[test]
    fn ids_travel_as_hex() {
        let mut id = UniqueId([0; 128]);
        for (i, b) in id.0.iter_mut().enumerate() {
            *b = (i as i32 * 37 - 128) as c_char;
        }
        assert_eq!(id_from_hex(&id_to_hex(&id)).unwrap().0, id.0);
        assert!(id_from_hex("00").is_err());
    }

    /// The values kiln passes agree with cudarc's bindings generated from nccl.h.
    #[cfg(feature = "cuda")]
    #[test]
    fn constants_are_nccl_h_values() {
        use cudarc::nccl::sys::{ncclDataType_t as T, ncclRedOp_t as O};
        assert_eq!(dtype::FLOAT16, T::ncclFloat16 as i32);
        assert_eq!(dtype::FLOAT32, T::ncclFloat32 as i32);
        assert_eq!(dtype::BFLOAT16, T::ncclBfloat16 as i32);
        assert_eq!(op::SUM, O::ncclSum as i32);
        assert_eq!(op::AVG, O::ncclAvg as i32);
    }
}
