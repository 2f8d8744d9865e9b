//! The sandbox: probed once, then runs Python processes in a pool of slots (one process per slot
//! at a time; each slot has its own scratch directory, uid and cgroup).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use crate::SandboxError;
use crate::fresh::HarnessDir;
use crate::protections::{Layer, Protections};
use crate::python::{self, Interpreter};
#[cfg(target_os = "linux")]
use crate::run::Kill;
use crate::run::{RunLimits, RunOutput, supervise};

#[cfg(target_os = "linux")]
use crate::linux;

/// How to set up a [`Sandbox`].
#[derive(Debug, Clone)]
pub struct SandboxOptions {
    /// Run even when some property of [`Containment`](crate::Containment) is contained by no
    /// working layer (the CLI's `--unsafe-no-sandbox`).
    pub allow_unsafe: bool,
    /// Layers to leave off even where they work, as if the kernel lacked them (the CLI's
    /// `--sandbox-without`): names from [`SKIPPABLE_LAYERS`]; any other name is
    /// [`SandboxError::UnknownLayer`]. The refusal rule still applies to what is left.
    pub skip_layers: Vec<String>,
    /// Processes run in parallel; 0 = the number of available cores.
    pub slots: usize,
    /// The interpreter; `None` finds `python3` (resolving wrappers such as pyenv shims).
    pub python: Option<PathBuf>,
    /// Enforce Landlock as a kernel of this ABI (1–6) would: only the rights that ABI knows (the
    /// CLI's `--sandbox-landlock-abi`; recorded in the Landlock layer's detail). For trying what
    /// older kernels get; it never asks for more than the kernel has. The refusal rule applies.
    pub landlock_abi: Option<u32>,
    /// When kiln runs as root each slot runs as a uid/gid of its own: the first free ones from
    /// `uid_base` up, reserved (a lock per uid) so that other kiln processes on the machine
    /// never share them.
    pub uid_base: u32,
}

impl Default for SandboxOptions {
    fn default() -> Self {
        Self {
            allow_unsafe: false,
            skip_layers: Vec::new(),
            slots: 0,
            python: None,
            uid_base: 2_000_000_000,
            landlock_abi: None,
        }
    }
}

/// The layers [`SandboxOptions::skip_layers`] can leave off, by their [`Protections::layers`] name.
pub const SKIPPABLE_LAYERS: [&str; 8] = [
    "landlock",
    "seccomp",
    "user_namespace",
    "net_namespace",
    "scratch",
    "uid",
    "cgroup",
    "pid_namespace",
];

/// Runs untrusted Python programs confined. See the crate docs for the layers.
pub struct Sandbox {
    protections: Protections,
    interp: Interpreter,
    /// The per-sandbox directory (harness, slot scratch directories); removed on drop.
    root: PathBuf,
    harness: HarnessDir,
    pool: SlotPool,
    #[cfg(target_os = "linux")]
    linux: linux::probe::Probed,
    /// The slots' uids, held for the life of the sandbox.
    #[cfg(target_os = "linux")]
    _uids: linux::uids::UidLease,
    #[cfg(not(target_os = "linux"))]
    work_dirs: Vec<PathBuf>,
}

static SANDBOXES: AtomicUsize = AtomicUsize::new(0);

impl Sandbox {
    /// Finds the interpreter, probes which layers work and prepares the slots. Refuses
    /// ([`SandboxError::Unconfined`]) when some property of
    /// [`Containment`](crate::Containment) is contained by no working layer, unless
    /// `allow_unsafe`.
    pub fn new(opts: SandboxOptions) -> Result<Sandbox, SandboxError> {
        check_layer_names(&opts.skip_layers)?;
        if let Some(abi) = opts.landlock_abi.filter(|a| !(1..=6).contains(a)) {
            return Err(SandboxError::LandlockAbi(abi));
        }
        let mut left_off = opts.skip_layers.clone();
        left_off.sort_unstable_by_key(|l| SKIPPABLE_LAYERS.iter().position(|k| k == l));
        left_off.dedup();
        let slots = match opts.slots {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        // SAFETY: plain getter.
        let is_root = cfg!(unix) && unsafe { libc::geteuid() } == 0;
        let (interp, skipped) = python::find(opts.python.as_deref(), is_root)?;
        let name = format!(
            "kiln-sandbox-{}-{}",
            std::process::id(),
            SANDBOXES.fetch_add(1, Ordering::Relaxed)
        );
        remove_stale_dirs(&std::env::temp_dir());
        let root = std::env::temp_dir().join(&name);
        let dir = |p: &Path, mode: u32| -> Result<(), SandboxError> {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            std::fs::DirBuilder::new()
                .mode(mode)
                .create(p)
                .map_err(|e| SandboxError::io(p, e))?;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
                .map_err(|e| SandboxError::io(p, e))
        };
        dir(&root, 0o711)?;
        let mut sandbox_dirs = RootGuard(Some(root.clone()));
        let harness =
            HarnessDir::create(root.join("harness"), &interp.path, crate::grade::HARNESS)?;
        let work_dirs: Vec<PathBuf> = (0..slots).map(|i| root.join(format!("slot{i}"))).collect();
        for w in &work_dirs {
            dir(w, 0o700)?;
        }
        let mut python = format!("{} ({})", interp.path.display(), interp.version);
        if !skipped.is_empty() {
            python += &format!("; skipped {}", skipped.join("; "));
        }
        let off = |why: &str| Layer::off(why);
        #[cfg(target_os = "linux")]
        let uids = linux::uids::reserve(opts.uid_base, slots, is_root)?;
        #[cfg(target_os = "linux")]
        let (linux, protections) = {
            let p = linux::probe::probe(
                &interp,
                &[harness.dir().to_path_buf()],
                &work_dirs,
                &uids.uids,
                opts.uid_base,
                &name,
                &opts.skip_layers,
                opts.landlock_abi,
            )?;
            let protections = Protections {
                python,
                unsafe_mode: opts.allow_unsafe,
                rlimits: Layer::on(
                    "CPU time, RLIMIT_DATA (AS too without a cgroup), stack, file size, open \
                     files, tasks (RLIMIT_NPROC), no core dumps",
                ),
                process_group: Layer::on(
                    "own session; the whole group is killed; killed when kiln dies (PDEATHSIG)",
                ),
                clean_start: Layer::on(
                    "empty environment, descriptors above 2 closed, python -I -S -B",
                ),
                scratch: p.scratch.clone(),
                landlock: p.landlock.clone(),
                seccomp: p.seccomp.clone(),
                net_namespace: p.net_ns.clone(),
                user_namespace: p.user_ns.clone(),
                pid_namespace: p.pid_ns.clone(),
                uid: p.uid.clone(),
                cgroup: p.cgroup.clone(),
                capabilities: p.capabilities.clone(),
                tasks: p.tasks.clone(),
                memory: p.memory.clone(),
                disk: p.disk.clone(),
                skipped: left_off,
                containment: p.containment.clone(),
            };
            (p, protections)
        };
        #[cfg(not(target_os = "linux"))]
        let protections = Protections {
            python,
            unsafe_mode: opts.allow_unsafe,
            rlimits: Layer::on("CPU time, data size, stack, file size, open files, no core dumps"),
            process_group: Layer::on("own process group, killed as a whole"),
            clean_start: Layer::on("empty environment, python -I -S -B"),
            scratch: off("plain directory, emptied after each run"),
            landlock: off("Linux only"),
            seccomp: off("Linux only"),
            net_namespace: off("Linux only"),
            user_namespace: off("Linux only"),
            pid_namespace: off("Linux only"),
            uid: off("Linux only"),
            cgroup: off("Linux only"),
            capabilities: off("Linux only"),
            tasks: off("Linux only"),
            memory: Layer::on("RLIMIT_DATA"),
            disk: off("plain directory, each file ≤ RLIMIT_FSIZE"),
            skipped: left_off,
            containment: crate::Containment::default(),
        };
        let _ = off;
        refuse_unconfined(&protections, opts.allow_unsafe)?;
        #[cfg(target_os = "linux")]
        let slots = if linux.layers.share_task_count(is_root) { 1 } else { slots };
        sandbox_dirs.0 = None;
        let sandbox = Sandbox {
            protections,
            interp,
            root,
            harness,
            pool: SlotPool::new(slots),
            #[cfg(target_os = "linux")]
            linux,
            #[cfg(target_os = "linux")]
            _uids: uids,
            #[cfg(not(target_os = "linux"))]
            work_dirs,
        };
        sandbox.self_test()?;
        Ok(sandbox)
    }

    /// The layers programs run under (record them next to any results).
    pub fn protections(&self) -> &Protections {
        &self.protections
    }

    /// The number of processes that run in parallel: [`SandboxOptions::slots`], or 1 where runs
    /// share kiln's uid's task count (the tasks layer says so).
    pub fn slots(&self) -> usize {
        self.pool.size
    }

    /// The uid each slot runs under when kiln runs as root and the uid layer is on (the first
    /// free ones from [`SandboxOptions::uid_base`]); empty elsewhere.
    pub fn slot_uids(&self) -> &[u32] {
        #[cfg(target_os = "linux")]
        if self.protections.uid.active {
            return &self._uids.uids;
        }
        &[]
    }

    /// The interpreter programs run with.
    pub fn python(&self) -> &Path {
        &self.interp.path
    }

    /// This sandbox's own directory (the harness and the slots' scratch directories); every
    /// sandboxed process names it on its command line. Removed when the sandbox is dropped.
    pub fn directory(&self) -> &Path {
        &self.root
    }

    /// The arguments that run the harness (imported from its directory, so its bytecode,
    /// compiled once here, is reused).
    pub(crate) fn harness_args(&self) -> [String; 3] {
        let dir = self.harness.dir();
        [
            "-c".to_string(),
            "import sys; sys.path.insert(0, sys.argv[1]); import kiln_lcb".to_string(),
            dir.to_string_lossy().into_owned(),
        ]
    }

    /// Runs `python -I -S -B <args>` confined in a free slot, with `stdin` as its input. The
    /// harness directory and the slot are checked first and rebuilt if an earlier run changed
    /// them.
    pub fn run_python(
        &self,
        args: &[&str],
        stdin: &[u8],
        limits: &RunLimits,
    ) -> Result<RunOutput, SandboxError> {
        let slot = self.pool.acquire();
        self.harness.ensure()?;
        let result = self.run_in_slot(slot.index, args, stdin, limits);
        drop(slot);
        result
    }

    #[cfg(target_os = "linux")]
    fn run_in_slot(
        &self,
        slot: usize,
        args: &[&str],
        stdin: &[u8],
        limits: &RunLimits,
    ) -> Result<RunOutput, SandboxError> {
        let res = &self.linux.slots[slot];
        if !self.linux.layers.tmpfs {
            let platform = &self.linux.platform;
            let owner = platform
                .is_root
                .then(|| platform.run_ids(&self.linux.layers, res));
            crate::fresh::renew_scratch(&res.work, owner)
                .map_err(|e| SandboxError::io(&res.work, e))?;
        }
        let oom_before = match &res.cgroup {
            Some(g) => {
                g.set_memory(limits.memory_bytes.saturating_add(128 << 20))
                    .map_err(SandboxError::Spawn)?;
                g.oom_kills()
            }
            None => 0,
        };
        let mut full: Vec<&OsStr> = vec![OsStr::new("-I"), OsStr::new("-S"), OsStr::new("-B")];
        full.extend(args.iter().map(OsStr::new));
        let start = Instant::now();
        let child = self
            .linux
            .platform
            .spawn(&self.linux.layers, res, &full, limits)?;
        // without a tmpfs, the scratch directory is held to the tmpfs's bounds by measuring it
        let quota = (!self.linux.layers.tmpfs).then(|| crate::quota::Quota {
            dir: res.work.clone(),
            bytes: limits.file_bytes,
            entries: TMPFS_INODES,
        });
        let kill = if self.linux.layers.pid_ns {
            Kill::Proxy
        } else {
            Kill::Group
        };
        let out = supervise(child, stdin, limits, start, quota.as_ref(), kill);
        linux::sweep::sweep(&self.linux.layers, res);
        if !self.linux.layers.tmpfs {
            // the run's files go with it, not when the slot runs next (a private tmpfs goes with
            // its mount namespace); one that cannot be emptied now is renewed before the next run
            let _ = crate::fresh::remove_contents(&res.work);
        }
        let mut out = out.map_err(|e| SandboxError::Spawn(e.to_string()))?;
        if let Some(g) = &res.cgroup {
            out.oom_killed = g.oom_kills() > oom_before;
        }
        Ok(out)
    }

    #[cfg(not(target_os = "linux"))]
    fn run_in_slot(
        &self,
        slot: usize,
        args: &[&str],
        stdin: &[u8],
        limits: &RunLimits,
    ) -> Result<RunOutput, SandboxError> {
        crate::fallback::run(
            &self.interp.path,
            &self.work_dirs[slot],
            args,
            stdin,
            limits,
        )
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = crate::fresh::remove_tree(&self.root);
    }
}

/// Files and directories a scratch directory may hold (the private tmpfs's `nr_inodes`).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) const TMPFS_INODES: usize = 4096;

/// Removes the sandbox directory if `Sandbox::new` fails half-way.
struct RootGuard(Option<PathBuf>);

impl Drop for RootGuard {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = crate::fresh::remove_tree(p);
        }
    }
}

/// The pid in a name `kiln-sandbox-<pid>-...` if that process is gone (a sandbox that was never
/// dropped: killed, or held in a static). Only where `/proc` tells.
pub(crate) fn stale_owner(name: &str) -> Option<u32> {
    let pid: u32 = name
        .strip_prefix("kiln-sandbox-")?
        .split('-')
        .next()?
        .parse()
        .ok()?;
    let proc_fs = Path::new("/proc/self").exists();
    (proc_fs && !Path::new(&format!("/proc/{pid}")).exists()).then_some(pid)
}

/// The rule: no untrusted code unless every property is contained by a working layer, unless
/// asked.
fn refuse_unconfined(p: &Protections, allow_unsafe: bool) -> Result<(), SandboxError> {
    let missing = p.containment.missing();
    if missing.is_empty() || allow_unsafe {
        return Ok(());
    }
    let mut what = missing.join("; ");
    if !p.skipped.is_empty() {
        what += &format!(" (left off on request: {})", p.skipped.join(", "));
    }
    Err(SandboxError::Unconfined(what))
}

/// Every name must be one of [`SKIPPABLE_LAYERS`].
fn check_layer_names(names: &[String]) -> Result<(), SandboxError> {
    match names
        .iter()
        .find(|n| !SKIPPABLE_LAYERS.contains(&n.as_str()))
    {
        Some(n) => Err(SandboxError::UnknownLayer(
            n.clone(),
            SKIPPABLE_LAYERS.join(", "),
        )),
        None => Ok(()),
    }
}

/// Removes the directories of sandboxes whose process is gone.
fn remove_stale_dirs(temp: &Path) {
    for entry in std::fs::read_dir(temp).into_iter().flatten().flatten() {
        if stale_owner(&entry.file_name().to_string_lossy()).is_some() {
            let _ = crate::fresh::remove_tree(&entry.path());
        }
    }
}

/// Free slot indices.
struct SlotPool {
    size: usize,
    free: Mutex<Vec<usize>>,
    ready: Condvar,
}

struct SlotGuard<'a> {
    pool: &'a SlotPool,
    index: usize,
}

impl SlotPool {
    fn new(size: usize) -> Self {
        Self {
            size,
            free: Mutex::new((0..size).rev().collect()),
            ready: Condvar::new(),
        }
    }

    fn acquire(&self) -> SlotGuard<'_> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(index) = free.pop() {
                return SlotGuard { pool: self, index };
            }
            free = self.ready.wait(free).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.pool
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.index);
        self.pool.ready.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protections(containment: crate::Containment) -> Protections {
        let l = |_| Layer::on("x");
        Protections {
            python: "python3".into(),
            unsafe_mode: false,
            rlimits: l(()),
            process_group: l(()),
            clean_start: l(()),
            scratch: l(()),
            landlock: l(()),
            seccomp: l(()),
            net_namespace: l(()),
            user_namespace: l(()),
            pid_namespace: l(()),
            uid: l(()),
            cgroup: l(()),
            capabilities: l(()),
            tasks: l(()),
            memory: l(()),
            disk: l(()),
            skipped: vec!["landlock".into()],
            containment,
        }
    }

    #[test]
    fn refuses_unless_every_property_is_contained_naming_what_is_not() {
        let all = crate::Containment {
            signals: vec!["seccomp"],
            filesystem: vec!["landlock"],
            tasks: vec!["cgroup"],
            memory: vec!["rlimits"],
            disk: vec!["scratch"],
            network: vec!["seccomp"],
        };
        assert!(refuse_unconfined(&protections(all.clone()), false).is_ok());
        for property in ["signals out", "filesystem", "tasks", "memory", "disk", "network"] {
            let mut c = all.clone();
            match property {
                "signals out" => c.signals.clear(),
                "filesystem" => c.filesystem.clear(),
                "tasks" => c.tasks.clear(),
                "memory" => c.memory.clear(),
                "disk" => c.disk.clear(),
                _ => c.network.clear(),
            }
            let p = protections(c);
            assert!(!p.confined());
            let err = refuse_unconfined(&p, false).unwrap_err();
            assert!(matches!(err, SandboxError::Unconfined(_)));
            let line = err.to_string();
            assert!(!line.contains('\n'), "{line}");
            assert!(line.contains(&format!("contains {property}")), "{line}");
            assert_eq!(line.matches("(needs ").count(), 1, "{line}");
            assert!(
                line.contains("--unsafe-no-sandbox")
                    && line.contains("left off on request: landlock"),
                "{line}"
            );
            assert!(refuse_unconfined(&p, true).is_ok());
            assert!(p.summary().contains("left off: landlock"));
        }
        let none = protections(crate::Containment::default());
        let line = refuse_unconfined(&none, false).unwrap_err().to_string();
        assert_eq!(line.matches("(needs ").count(), 6, "{line}");
        assert!(
            line.contains("signals out (needs seccomp, or landlock with signal scoping"),
            "{line}"
        );
    }

    #[test]
    fn unknown_layer_names_are_refused_listing_the_valid_ones() {
        assert!(check_layer_names(&["landlock".into(), "uid".into()]).is_ok());
        let line = check_layer_names(&["seccomp".into(), "lanlock".into()])
            .unwrap_err()
            .to_string();
        assert!(
            line.contains("\"lanlock\"") && !line.contains('\n'),
            "{line}"
        );
        for name in SKIPPABLE_LAYERS {
            assert!(line.contains(name), "{line}");
        }
    }

    #[test]
    fn stale_sandboxes_are_recognised_by_a_dead_pid() {
        assert_eq!(
            stale_owner(&format!("kiln-sandbox-{}-0", std::process::id())),
            None
        );
        assert_eq!(
            stale_owner("kiln-sandbox-4000000000-3-slot1"),
            Some(4_000_000_000)
        );
        assert_eq!(stale_owner("other-123"), None);
    }
}
