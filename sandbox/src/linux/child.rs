//! What the forked child does before it becomes the interpreter.
//!
//! Everything is prepared in the parent (strings, pointer arrays, the seccomp programs, open
//! descriptors); after `fork` the child only makes system calls and writes into memory it already
//! owns, so it is async-signal-safe even though the parent has other threads. The order matters:
//!
//! 1. join the slot's cgroups (needs root's rights on the cgroup files);
//! 2. `setsid` — a new session and process group that kiln kills as a whole;
//! 3. namespaces: a user namespace first when not root (it grants the right to create the
//!    others), then network + mount (+ IPC/UTS) namespaces;
//! 4. a private, size-limited tmpfs over the scratch directory (mounts made private first, so
//!    nothing propagates to the host);
//! 4½. with a PID namespace (see [`ChildPlan::pid_namespace`]) this process stays outside as a
//!    proxy and forks the namespace's init (pid 1), which mounts a fresh `/proc` and forks the
//!    process that goes on with the steps below (pid 2, in a new session of its own);
//! 5. as root: drop to the slot's unprivileged uid/gid, no supplementary groups, then a user
//!    namespace;
//! 6. `PR_SET_PDEATHSIG(SIGKILL)` (after the uid change, which clears it), then check that kiln
//!    did not already die;
//! 7. resource limits, `chdir` into the scratch directory, every inherited descriptor above 2
//!    marked close-on-exec;
//! 8. every capability dropped (bounding, ambient, permitted, effective, inheritable; root's
//!    `execve` grants none), `PR_SET_NO_NEW_PRIVS`, Landlock, seccomp (the pid patched into the filter), `execve` with an
//!    empty environment.
//!
//! A failing step writes its number to the diagnostics pipe, so the parent can say which one.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use super::seccomp::Filters;

/// The steps, in order (their number goes to the diagnostics pipe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Step {
    Cgroup = 1,
    Session,
    UserNamespace,
    Namespaces,
    Tmpfs,
    PidNamespace,
    DropUid,
    DeathSignal,
    Rlimit,
    Chdir,
    CloseFds,
    DropCaps,
    NoNewPrivs,
    Landlock,
    Seccomp,
    Exec,
}

impl Step {
    pub(crate) fn from_u8(b: u8) -> Option<Step> {
        use Step::*;
        [
            Cgroup,
            Session,
            UserNamespace,
            Namespaces,
            Tmpfs,
            PidNamespace,
            DropUid,
            DeathSignal,
            Rlimit,
            Chdir,
            CloseFds,
            DropCaps,
            NoNewPrivs,
            Landlock,
            Seccomp,
            Exec,
        ]
        .into_iter()
        .find(|s| *s as u8 == b)
    }
}

/// The type of `setrlimit`'s resource argument (glibc has its own).
#[cfg(target_env = "gnu")]
pub(crate) type Resource = libc::__rlimit_resource_t;
#[cfg(not(target_env = "gnu"))]
pub(crate) type Resource = libc::c_int;

/// The contents of `/proc/self/{uid,gid}_map` for a user namespace that maps ids to themselves.
pub(crate) struct IdMaps {
    pub uid_map: Vec<u8>,
    pub gid_map: Vec<u8>,
}

impl IdMaps {
    pub(crate) fn identity(uid: u32, gid: u32) -> Self {
        Self {
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
        }
    }
}

/// Everything the child needs, allocated before the fork.
pub(crate) struct ChildPlan {
    /// The interpreter path; the seccomp filter allows `execve` only with this pointer.
    pub exec_path: *const libc::c_char,
    /// Owns the strings `argv_ptrs` points to.
    #[allow(dead_code)]
    pub argv: Vec<CString>,
    pub argv_ptrs: Vec<*const libc::c_char>,
    pub parent: libc::pid_t,
    pub cgroup_fds: Vec<RawFd>,
    /// A user namespace before the other namespaces (not root).
    pub userns_first: Option<IdMaps>,
    /// `unshare` flags for the other namespaces (0 for none).
    pub unshare_flags: libc::c_int,
    /// Mount point and mount options of the private tmpfs.
    pub tmpfs: Option<(CString, CString)>,
    /// A PID namespace (`unshare_flags` has `CLONE_NEWPID | CLONE_NEWNS`): the run is forked into
    /// it under a minimal init.
    pub pid_ns: bool,
    /// Unprivileged (uid, gid) to switch to (root only).
    pub drop_to: Option<(libc::uid_t, libc::gid_t)>,
    /// A user namespace after dropping the uid (root).
    pub userns_after: Option<IdMaps>,
    /// (resource, soft, hard).
    pub rlimits: Vec<(Resource, u64, u64)>,
    pub workdir: CString,
    /// The Landlock ruleset and the access bits for the scratch directory's rule.
    pub landlock: Option<(RawFd, u64)>,
    pub seccomp: Option<Filters>,
    /// Write end of the diagnostics pipe (close-on-exec).
    pub diag_fd: RawFd,
}

// SAFETY: the raw pointers point into `argv` (owned) and into the sandbox's interpreter path,
// which outlives every spawn; the plan is only used by the child after the fork.
unsafe impl Send for ChildPlan {}
unsafe impl Sync for ChildPlan {}

type StepResult = Result<(), (Step, io::Error)>;

fn check(step: Step, rc: libc::c_long) -> StepResult {
    if rc < 0 {
        Err((step, io::Error::last_os_error()))
    } else {
        Ok(())
    }
}

impl ChildPlan {
    /// Runs in the forked child: sets up the confinement and execs the interpreter. Returns only
    /// on failure.
    pub(crate) fn exec(&mut self) -> io::Error {
        let Err((step, err)) = self.setup() else {
            unreachable!("setup only returns on failure")
        };
        let b = step as u8;
        // SAFETY: writing one byte from the stack to an open descriptor.
        unsafe { libc::write(self.diag_fd, (&raw const b).cast(), 1) };
        err
    }

    fn setup(&mut self) -> StepResult {
        // SAFETY: only system calls on memory and descriptors prepared by the parent.
        unsafe {
            for &fd in &self.cgroup_fds {
                check(
                    Step::Cgroup,
                    libc::write(fd, c"0".as_ptr().cast(), 1) as libc::c_long,
                )?;
            }
            check(Step::Session, libc::setsid().into())?;
            if let Some(maps) = &self.userns_first {
                user_namespace(maps)?;
            }
            if self.unshare_flags != 0 {
                check(Step::Namespaces, libc::unshare(self.unshare_flags).into())?;
            }
            if self.tmpfs.is_some() || self.pid_ns {
                let private = libc::MS_REC | libc::MS_PRIVATE;
                let none = std::ptr::null::<libc::c_char>();
                let step = if self.tmpfs.is_some() {
                    Step::Tmpfs
                } else {
                    Step::PidNamespace
                };
                check(
                    step,
                    libc::mount(none, c"/".as_ptr(), none, private, std::ptr::null()).into(),
                )?;
            }
            if let Some((target, options)) = &self.tmpfs {
                let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                let rc = libc::mount(
                    c"tmpfs".as_ptr(),
                    target.as_ptr(),
                    c"tmpfs".as_ptr(),
                    flags,
                    options.as_ptr().cast(),
                );
                check(Step::Tmpfs, rc.into())?;
            }
            if self.pid_ns {
                self.pid_namespace()?;
            }
            if let Some((uid, gid)) = self.drop_to {
                check(Step::DropUid, libc::setgroups(0, std::ptr::null()).into())?;
                check(Step::DropUid, libc::setresgid(gid, gid, gid).into())?;
                check(Step::DropUid, libc::setresuid(uid, uid, uid).into())?;
                // The uid change made the process non-dumpable, which makes /proc/self/* root's;
                // the user namespace step must write /proc/self/uid_map. (ptrace stays denied.)
                check(
                    Step::DropUid,
                    libc::prctl(libc::PR_SET_DUMPABLE, 1 as libc::c_ulong).into(),
                )?;
            }
            if let Some(maps) = &self.userns_after {
                user_namespace(maps)?;
            }
            check(
                Step::DeathSignal,
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong).into(),
            )?;
            if libc::getppid() != self.parent {
                return Err((Step::DeathSignal, io::Error::from_raw_os_error(libc::ESRCH)));
            }
            // The scratch rule's descriptor is opened before the limits: RLIMIT_NOFILE bounds
            // descriptor numbers, and this child holds every descriptor kiln had open (closed
            // only at exec), so under a low limit no new one could be opened after them.
            let scratch_fd = match self.landlock {
                Some(_) => {
                    let fd = libc::open(
                        self.workdir.as_ptr(),
                        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    );
                    check(Step::Landlock, fd.into())?;
                    fd
                }
                None => -1,
            };
            for &(resource, soft, hard) in &self.rlimits {
                let r = libc::rlimit {
                    rlim_cur: soft,
                    rlim_max: hard,
                };
                check(Step::Rlimit, libc::setrlimit(resource, &r).into())?;
            }
            check(Step::Chdir, libc::chdir(self.workdir.as_ptr()).into())?;
            mark_fds_cloexec()?;
            super::caps::drop_all().map_err(|e| (Step::DropCaps, e))?;
            check(
                Step::NoNewPrivs,
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0).into(),
            )?;
            if let Some((ruleset, access)) = self.landlock {
                add_scratch_rule(ruleset, access, scratch_fd)?;
                check(
                    Step::Landlock,
                    libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0),
                )?;
            }
            if let Some(filters) = &mut self.seccomp {
                filters.patch_pid(libc::getpid() as u32);
                for prog in &filters.programs {
                    let fprog = libc::sock_fprog {
                        len: prog.len() as libc::c_ushort,
                        filter: prog.as_ptr() as *mut libc::sock_filter,
                    };
                    let rc = libc::syscall(
                        libc::SYS_seccomp,
                        libc::SECCOMP_SET_MODE_FILTER,
                        0 as libc::c_ulong,
                        &raw const fprog,
                    );
                    check(Step::Seccomp, rc)?;
                }
            }
            let envp: [*const libc::c_char; 1] = [std::ptr::null()];
            libc::execve(self.exec_path, self.argv_ptrs.as_ptr(), envp.as_ptr());
            Err((Step::Exec, io::Error::last_os_error()))
        }
    }
}

impl ChildPlan {
    /// Enters the PID namespace made by `unshare(CLONE_NEWPID)`: only children are born in it, so
    /// this process (P, kiln's child, outside) forks its init Q (pid 1), and Q forks R (pid 2),
    /// which returns to go on with the remaining steps and become the interpreter. Only R returns.
    ///
    /// - P keeps the host's view: it waits for Q and ends as R did (exit code, or the same signal
    ///   raised on itself, non-dumpable and without a core), so kiln sees R's status and, through
    ///   `wait4`, the CPU time of everything the namespace reaped. kiln kills a run with `SIGTERM`
    ///   to P (`Kill::Proxy`), whose handler kills Q; Q's death kills everything in the namespace
    ///   (the kernel's rule for an init), whatever sessions it made, and P's `waitpid` returns
    ///   only after that, so nothing is left once kiln has reaped P.
    /// - Q mounts a fresh `/proc` (only the namespace's processes; `hidepid=2`, `subset=pid` where
    ///   the kernel has them), or, where the kernel refuses, hides `/proc` under an empty
    ///   read-only tmpfs; then forks R, drops every capability, and reaps until R ends, when it
    ///   hands R's status to P and exits, taking every other process of the namespace with it.
    ///   Signals from inside reach Q only with a handler, and it has none.
    /// - R starts a new session, so its process group (the one `kill(0)` reaches) holds only R
    ///   and its own children, never P or Q.
    ///
    /// P and Q close every descriptor they do not need at once (std's exec-status pipe among
    /// them, so `spawn` returns when R execs), reset every signal handler inherited from kiln,
    /// and are non-dumpable (their memory is a copy of kiln's). Q dies with P
    /// (`PR_SET_PDEATHSIG`, checked through a pipe P holds).
    ///
    /// # Safety
    /// Only system calls on memory prepared before the fork.
    unsafe fn pid_namespace(&mut self) -> StepResult {
        // SAFETY: system calls on stack memory and prepared descriptors only.
        unsafe {
            // P: dies with kiln (it keeps its credentials, so this stays set)
            check(
                Step::DeathSignal,
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong).into(),
            )?;
            if libc::getppid() != self.parent {
                return Err((Step::DeathSignal, io::Error::from_raw_os_error(libc::ESRCH)));
            }
            default_signals();
            // kiln's SIGTERM: kill the init (see `on_term`), held until the init's pid is known
            let mut term: libc::sigaction = std::mem::zeroed();
            term.sa_sigaction = on_term as *const () as libc::sighandler_t;
            term.sa_flags = libc::SA_RESTART;
            check(
                Step::PidNamespace,
                libc::sigaction(libc::SIGTERM, &term, std::ptr::null_mut()).into(),
            )?;
            let mut held: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut held);
            libc::sigaddset(&mut held, libc::SIGTERM);
            libc::sigprocmask(libc::SIG_BLOCK, &held, std::ptr::null_mut());
            check(
                Step::PidNamespace,
                libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong).into(),
            )?;
            let mut alive: [RawFd; 2] = [-1; 2];
            let mut status: [RawFd; 2] = [-1; 2];
            check(
                Step::PidNamespace,
                libc::pipe2(alive.as_mut_ptr(), libc::O_CLOEXEC).into(),
            )?;
            check(
                Step::PidNamespace,
                libc::pipe2(status.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK).into(),
            )?;
            let q = libc::fork();
            check(Step::PidNamespace, q.into())?;
            if q > 0 {
                INIT.store(q, Ordering::Relaxed);
                libc::sigprocmask(libc::SIG_UNBLOCK, &held, std::ptr::null_mut());
                proxy(q, alive[1], status[0]);
            }
            // Q, pid 1 of the namespace: no handler of P's
            default_signals();
            libc::close(alive[1]);
            libc::close(status[0]);
            check(
                Step::PidNamespace,
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong).into(),
            )?;
            let mut p = libc::pollfd {
                fd: alive[0],
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&mut p, 1, 0) != 0 {
                // P is gone (all write ends closed) before the death signal was set
                libc::_exit(1);
            }
            libc::close(alive[0]);
            mount_proc()?;
            let r = libc::fork();
            check(Step::PidNamespace, r.into())?;
            if r > 0 {
                init(r, status[1]);
            }
            // R, pid 2
            libc::close(status[1]);
            check(Step::Session, libc::setsid().into())?;
            // the interpreter's own files in /proc stay its own (the uid drop relies on it)
            check(
                Step::PidNamespace,
                libc::prctl(libc::PR_SET_DUMPABLE, 1 as libc::c_ulong).into(),
            )?;
            self.parent = 1;
            Ok(())
        }
    }
}

/// The namespace's init, in the proxy (P) only.
static INIT: AtomicI32 = AtomicI32::new(0);

/// The proxy's `SIGTERM` handler: kiln's kill. The init's death kills every process of the
/// namespace; the proxy's `waitpid` returns once they are all gone.
extern "C" fn on_term(_: libc::c_int) {
    let q = INIT.load(Ordering::Relaxed);
    if q > 0 {
        // SAFETY: kill is async-signal-safe; `q` is our unreaped child.
        unsafe { libc::kill(q, libc::SIGKILL) };
    }
}

/// Every signal handler back to the default, none blocked (kiln's handlers are not for its
/// forks).
unsafe fn default_signals() {
    // SAFETY: sigaction/sigprocmask with structures on the stack.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::sigaction(sig, &action, std::ptr::null_mut());
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}

/// A fresh `/proc` for the PID namespace (only its processes; other uids' hidden; no system
/// files where the kernel has `subset=pid`), else an empty read-only tmpfs over it (a kernel that
/// refuses proc in a user namespace, e.g. under a container's masked `/proc`).
unsafe fn mount_proc() -> StepResult {
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: mount with static strings.
    unsafe {
        for options in [c"subset=pid,hidepid=2", c"hidepid=2", c""] {
            let rc = libc::mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                flags,
                options.as_ptr().cast(),
            );
            if rc == 0 {
                return Ok(());
            }
        }
        let rc = libc::mount(
            c"tmpfs".as_ptr(),
            c"/proc".as_ptr(),
            c"tmpfs".as_ptr(),
            flags | libc::MS_RDONLY,
            c"size=4096,nr_inodes=16,mode=0555".as_ptr().cast(),
        );
        check(Step::PidNamespace, rc.into())
    }
}

/// P, outside the namespace: waits for Q and ends as R did (R's status from Q, else Q's own).
unsafe fn proxy(q: libc::pid_t, alive: RawFd, status: RawFd) -> ! {
    // SAFETY: system calls on stack memory; never returns.
    unsafe {
        close_all_but(&[alive, status]);
        let mut st: libc::c_int = 0;
        loop {
            let rc = libc::waitpid(q, &mut st, 0);
            if rc == q {
                break;
            }
            if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                libc::_exit(1);
            }
        }
        let mut buf = [0u8; 4];
        if libc::read(status, buf.as_mut_ptr().cast(), 4) == 4 {
            st = libc::c_int::from_ne_bytes(buf);
        }
        if libc::WIFSIGNALED(st) {
            let sig = libc::WTERMSIG(st);
            // die of the same signal, leaving no core (this memory is kiln's)
            libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong);
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            default_signals();
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(if libc::WIFEXITED(st) {
            libc::WEXITSTATUS(st)
        } else {
            1
        })
    }
}

/// Q, pid 1: reaps every process of the namespace until R ends, then hands R's status to P and
/// exits (the kernel then kills what is left in the namespace).
unsafe fn init(r: libc::pid_t, status: RawFd) -> ! {
    // SAFETY: system calls on stack memory; never returns.
    unsafe {
        close_all_but(&[status]);
        let _ = super::caps::drop_all();
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0);
        let mut st: libc::c_int = 0;
        loop {
            let rc = libc::waitpid(-1, &mut st, libc::__WALL);
            if rc == r {
                libc::write(status, (&raw const st).cast(), 4);
                libc::_exit(0);
            }
            if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                libc::_exit(1);
            }
        }
    }
}

/// Closes every descriptor but those in `keep` (`close_range`, or one by one on old kernels).
unsafe fn close_all_but(keep: &[RawFd]) {
    let mut keep: [RawFd; 2] = [
        keep.first().copied().unwrap_or(-1),
        keep.get(1).copied().unwrap_or(-1),
    ];
    keep.sort_unstable();
    // SAFETY: closing descriptors of this process only.
    unsafe {
        let close = |from: RawFd, to: RawFd| {
            if from > to {
                return;
            }
            let rc = libc::syscall(
                libc::SYS_close_range,
                from as libc::c_uint,
                to as libc::c_uint,
                0 as libc::c_uint,
            );
            if rc != 0 {
                let mut lim = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
                let end = (lim.rlim_cur.min(65536) as RawFd).min(to.saturating_add(1));
                for fd in from..end.max(from) {
                    libc::close(fd);
                }
            }
        };
        let mut from = 0;
        for k in keep.into_iter().filter(|&k| k >= 0) {
            close(from, k - 1);
            from = k + 1;
        }
        close(from, RawFd::MAX);
    }
}

/// `struct landlock_path_beneath_attr` (packed, as in the kernel's uapi header).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// Adds the rule "everything but execute beneath the scratch directory" (opened as `dir_fd`,
/// `O_PATH`) to the ruleset, and closes `dir_fd`. Done here because the directory is the tmpfs
/// this child just mounted.
unsafe fn add_scratch_rule(ruleset: RawFd, access: u64, dir_fd: RawFd) -> StepResult {
    const LANDLOCK_RULE_PATH_BENEATH: libc::c_long = 1;
    // SAFETY: landlock_add_rule/close with a descriptor of ours and an attribute on the stack.
    unsafe {
        let attr = PathBeneathAttr {
            allowed_access: access,
            parent_fd: dir_fd,
        };
        let rc = libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            LANDLOCK_RULE_PATH_BENEATH,
            &raw const attr,
            0,
        );
        let result = check(Step::Landlock, rc);
        libc::close(dir_fd);
        result
    }
}

/// `unshare(CLONE_NEWUSER)` and identity id maps (so files keep their owner).
unsafe fn user_namespace(maps: &IdMaps) -> StepResult {
    // SAFETY: plain system calls on static paths and prepared buffers.
    unsafe {
        check(
            Step::UserNamespace,
            libc::unshare(libc::CLONE_NEWUSER).into(),
        )?;
        write_file(c"/proc/self/setgroups", b"deny")?;
        write_file(c"/proc/self/uid_map", &maps.uid_map)?;
        write_file(c"/proc/self/gid_map", &maps.gid_map)
    }
}

unsafe fn write_file(path: &CStr, data: &[u8]) -> StepResult {
    // SAFETY: open/write/close on a static path and a prepared buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        check(Step::UserNamespace, fd.into())?;
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        let result = if n == data.len() as isize {
            Ok(())
        } else {
            Err((Step::UserNamespace, io::Error::last_os_error()))
        };
        libc::close(fd);
        result
    }
}

/// Marks every descriptor above 2 close-on-exec (`close_range`, or one by one on old kernels).
unsafe fn mark_fds_cloexec() -> StepResult {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: descriptor flag changes only.
    unsafe {
        if libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        ) == 0
        {
            return Ok(());
        }
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        for fd in 3..lim.rlim_cur.min(65536) as libc::c_int {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
        Ok(())
    }
}
