//! The Linux confinement: which layers a run gets, and starting a process under them.

mod bounds;
mod caps;
pub(crate) mod cgroup;
mod child;
pub(crate) mod landlock;
pub(crate) mod probe;
pub(crate) mod seccomp;
pub(crate) mod sweep;
pub(crate) mod tasks;
pub(crate) mod uids;

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use child::{ChildPlan, IdMaps, Step};

use crate::SandboxError;
use crate::run::RunLimits;

/// The layers every run of a sandbox gets (decided by the probe).
#[derive(Clone, Default)]
pub(crate) struct Layers {
    /// A user namespace (before the others when not root, after the uid drop when root).
    pub user_ns: bool,
    pub net_ns: bool,
    /// A mount namespace with a private tmpfs as scratch directory.
    pub tmpfs: bool,
    /// A PID namespace (and a mount namespace for its `/proc`), the run under a minimal init.
    pub pid_ns: bool,
    /// Switch to the slot's uid/gid (root only).
    pub drop_uid: bool,
    pub landlock: bool,
    pub seccomp: bool,
    pub cgroup: bool,
}

impl Layers {
    /// Whether runs count their tasks against kiln's own uid (neither the uid drop nor a user
    /// namespace; the host's root is exempt from `RLIMIT_NPROC`): one run's threads would then
    /// take the room of another's, so runs go one at a time.
    pub(crate) fn share_task_count(&self, is_root: bool) -> bool {
        !self.drop_uid && !self.user_ns && !is_root
    }
}

/// Per-slot resources used by the layers.
pub(crate) struct SlotResources {
    /// The scratch directory (and tmpfs mount point).
    pub work: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub cgroup: Option<cgroup::SlotGroup>,
}

/// Everything shared by all runs.
pub(crate) struct Platform {
    /// The interpreter path, at a stable address (the seccomp rule names the pointer).
    pub exec_path: CString,
    pub filters: Option<seccomp::Filters>,
    /// What Landlock lets a run read and execute (the scratch rule is added by the child).
    pub landlock: Option<landlock::Paths>,
    /// Access bits of the scratch rule.
    pub scratch_access: u64,
    pub is_root: bool,
}

impl Platform {
    /// The uid and gid a run has: the slot's when the uid is dropped, else kiln's own.
    pub(crate) fn run_ids(&self, layers: &Layers, slot: &SlotResources) -> (u32, u32) {
        if layers.drop_uid {
            (slot.uid, slot.gid)
        } else {
            // SAFETY: plain getters.
            unsafe { (libc::getuid(), libc::getgid()) }
        }
    }

    /// Starts `exec_path args...` under `layers` in `slot`, with piped stdio.
    pub(crate) fn spawn(
        &self,
        layers: &Layers,
        slot: &SlotResources,
        args: &[&OsStr],
        limits: &RunLimits,
    ) -> Result<Child, SandboxError> {
        let spawn_err = |m: String| SandboxError::Spawn(m);
        let cstr =
            |b: &[u8]| CString::new(b).map_err(|_| spawn_err("NUL byte in an argument".into()));
        let mut argv = vec![self.exec_path.clone()];
        for a in args {
            argv.push(cstr(a.as_bytes())?);
        }
        let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let (diag_read, diag_write) = pipe().map_err(|e| spawn_err(format!("pipe: {e}")))?;
        // SAFETY: flag change on our own descriptor (a sibling fork may hold the write end briefly).
        unsafe { libc::fcntl(diag_read.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };

        let (run_uid, run_gid) = self.run_ids(layers, slot);
        let maps = || IdMaps::identity(run_uid, run_gid);
        let own = || {
            // SAFETY: plain getters.
            unsafe { IdMaps::identity(libc::getuid(), libc::getgid()) }
        };
        let mut unshare_flags = 0;
        if layers.net_ns {
            unshare_flags |= libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
        }
        if layers.tmpfs {
            unshare_flags |= libc::CLONE_NEWNS;
        }
        if layers.pid_ns {
            unshare_flags |= libc::CLONE_NEWPID | libc::CLONE_NEWNS;
        }
        let tmpfs = if layers.tmpfs {
            let mut opts = format!(
                "size={},nr_inodes={},mode=0700",
                limits.file_bytes.max(1 << 20),
                crate::sandbox::TMPFS_INODES
            );
            if layers.drop_uid {
                opts += &format!(",uid={},gid={}", slot.uid, slot.gid);
            }
            Some((
                cstr(slot.work.as_os_str().as_bytes())?,
                cstr(opts.as_bytes())?,
            ))
        } else {
            None
        };
        let mut rlimits = vec![
            (
                libc::RLIMIT_CPU,
                secs_up(limits.cpu),
                secs_up(limits.cpu) + 1,
            ),
            (libc::RLIMIT_DATA, limits.memory_bytes, limits.memory_bytes),
            (libc::RLIMIT_STACK, limits.stack_bytes, limits.stack_bytes),
            (libc::RLIMIT_FSIZE, limits.file_bytes, limits.file_bytes),
            (libc::RLIMIT_NOFILE, limits.open_files, limits.open_files),
            (libc::RLIMIT_CORE, 0, 0),
            (libc::RLIMIT_MSGQUEUE, 0, 0),
        ];
        // counted per uid: the slot's own, or in the run's own user namespace; else kiln's, shared
        let nproc = if layers.drop_uid || layers.user_ns {
            limits.tasks
        } else {
            tasks::shared_uid_limit(limits.tasks)
        };
        rlimits.push((libc::RLIMIT_NPROC, nproc, nproc));
        if !layers.cgroup {
            // Without a cgroup, shared mappings are not bounded by RLIMIT_DATA: bound the address
            // space too, generously (thread stacks and malloc arenas reserve much more than they use).
            let space = limits.memory_bytes.saturating_add(2 << 30);
            rlimits.push((libc::RLIMIT_AS, space, space));
        }
        let ruleset = match (&self.landlock, layers.landlock) {
            (Some(paths), true) => {
                Some(landlock::ruleset(paths).map_err(|e| spawn_err(format!("landlock: {e}")))?)
            }
            _ => None,
        };
        let mut plan = ChildPlan {
            exec_path: self.exec_path.as_ptr(),
            argv,
            argv_ptrs,
            // SAFETY: plain getter.
            parent: unsafe { libc::getpid() },
            cgroup_fds: slot
                .cgroup
                .as_ref()
                .filter(|_| layers.cgroup)
                .map(|g| g.procs_fds())
                .unwrap_or_default(),
            userns_first: (layers.user_ns && !self.is_root).then(own),
            unshare_flags,
            tmpfs,
            pid_ns: layers.pid_ns,
            drop_to: layers.drop_uid.then_some((slot.uid, slot.gid)),
            userns_after: (layers.user_ns && self.is_root).then(maps),
            rlimits,
            workdir: cstr(slot.work.as_os_str().as_bytes())?,
            landlock: ruleset
                .as_ref()
                .map(|f| (f.as_raw_fd(), self.scratch_access)),
            seccomp: self.filters.clone().filter(|_| layers.seccomp),
            diag_fd: diag_write.as_raw_fd(),
        };
        let mut cmd = Command::new(OsStr::from_bytes(self.exec_path.as_bytes()));
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: the closure only makes system calls on memory prepared before the fork.
        unsafe { cmd.pre_exec(move || Err(plan.exec())) };
        let spawned = cmd.spawn();
        drop(diag_write);
        drop(ruleset);
        spawned.map_err(|e| {
            let mut b = [0u8; 1];
            // SAFETY: reading one byte into a local from our own non-blocking pipe.
            let n = unsafe { libc::read(diag_read.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
            let step = if n == 1 { Step::from_u8(b[0]) } else { None };
            match step {
                Some(s) => spawn_err(format!("sandbox setup failed at {s:?}: {e}")),
                None => spawn_err(format!(
                    "cannot start {}: {e}",
                    self.exec_path.to_string_lossy()
                )),
            }
        })
    }
}

fn secs_up(d: std::time::Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds: [RawFd; 2] = [-1; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
