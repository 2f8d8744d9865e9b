//! The probe: which layers work on this machine. Each layer is added on top of those that
//! already work and kept only if a process starts under them AND a check run inside shows the
//! layer's effect (an empty network namespace, the slot's uid, a denied read of `/etc/passwd`, a
//! denied `socket()` and `fork()`, …) — a layer that starts but does not enforce is reported off.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{Layers, Platform, SlotResources, bounds, cgroup, landlock, seccomp};
use crate::SandboxError;
use crate::protections::{Containment, Layer};
use crate::python::Interpreter;
use crate::run::{Kill, RunLimits, supervise};

/// What the probe found.
pub(crate) struct Probed {
    pub platform: Platform,
    pub layers: Layers,
    pub slots: Vec<SlotResources>,
    pub user_ns: Layer,
    pub net_ns: Layer,
    pub pid_ns: Layer,
    pub scratch: Layer,
    pub uid: Layer,
    pub cgroup: Layer,
    pub landlock: Layer,
    pub seccomp: Layer,
    pub capabilities: Layer,
    pub tasks: Layer,
    pub memory: Layer,
    pub disk: Layer,
    pub containment: Containment,
}

/// Probes the layers for slots whose scratch directories are `work_dirs` (existing, empty).
pub(crate) fn probe(
    interp: &Interpreter,
    read_dirs: &[PathBuf],
    work_dirs: &[PathBuf],
    uids: &[u32],
    uid_base: u32,
    name: &str,
    skip: &[String],
    landlock_abi: Option<u32>,
) -> Result<Probed, SandboxError> {
    // SAFETY: plain getter.
    let is_root = unsafe { libc::geteuid() } == 0;
    let exec_path = CString::new(interp.path.as_os_str().as_bytes())
        .map_err(|_| SandboxError::NoPython("NUL in the interpreter path".into()))?;
    let filters = seccomp::build(exec_path.as_ptr());
    let mut platform = Platform {
        exec_path,
        filters: None,
        landlock: None,
        scratch_access: 0,
        is_root,
    };
    let seccomp_err = filters.as_ref().err().cloned();
    platform.filters = filters.ok();

    // Landlock: the paths every run may read (each run adds its own scratch directory).
    let kernel_abi = landlock::kernel_abi();
    let abi = landlock_abi.map_or(kernel_abi, |cap| kernel_abi.min(i64::from(cap)));
    let mut landlock_err =
        (abi < 1).then(|| "the kernel has no Landlock (or it is disabled)".to_string());
    if landlock_err.is_none() {
        let paths = landlock_paths(interp, read_dirs, abi);
        match landlock::ruleset(&paths) {
            Ok(_) => {
                platform.landlock = Some(paths);
                platform.scratch_access = landlock::scratch_access(abi);
            }
            Err(e) => landlock_err = Some(e),
        }
    }
    let mut slots = Vec::new();
    for (i, work) in work_dirs.iter().enumerate() {
        let (uid, gid) = (uids[i], uids[i]);
        if is_root {
            std::os::unix::fs::chown(work, Some(uid), Some(gid))
                .map_err(|e| SandboxError::io(work, e))?;
        }
        slots.push(SlotResources {
            work: work.clone(),
            uid,
            gid,
            cgroup: None,
        });
    }

    let mut t = Trials {
        platform: &platform,
        layers: Layers::default(),
        skip,
        last: String::new(),
    };
    let slot0 = &slots[0];
    if let Err(e) = run_check(&platform, &t.layers, slot0, "print('ok')") {
        let python = interp.path.display();
        return Err(SandboxError::Spawn(format!(
            "{python} does not run even unconfined: {e}"
        )));
    }
    let mut uid = Layer::off("kiln does not run as root (programs run under its own uid)");
    let mut user_ns = Layer::off("needs the uid drop");
    if !is_root {
        // (a user namespace first: it grants the right to make the others)
        user_ns = t.add(
            "user_namespace",
            |l| l.user_ns = true,
            slot0,
            USERNS_CHECK,
            |o| o == "1",
            "own user namespace (ids mapped to themselves)",
        );
    }
    let needs_userns = !is_root && !t.layers.user_ns;
    let mut net_ns = if needs_userns {
        Layer::off("needs a user namespace (not root)")
    } else {
        let on = "empty network namespace (loopback only, down); IPC and UTS namespaces";
        t.add(
            "net_namespace",
            |l| l.net_ns = true,
            slot0,
            NETNS_CHECK,
            |o| o == "lo",
            on,
        )
    };
    let plain = "plain directory, emptied after each run";
    let mut scratch = if needs_userns {
        Layer::off(format!("{plain} (a private tmpfs needs a user namespace)"))
    } else {
        let check = TMPFS_CHECK.replace("SIZE", &RunLimits::default().file_bytes.to_string());
        let on =
            "private tmpfs per run (size = the file-size limit, 4096 inodes), in a mount namespace";
        let layer = t.add(
            "scratch",
            |l| l.tmpfs = true,
            slot0,
            &check,
            |o| o == "True",
            on,
        );
        if layer.active {
            layer
        } else {
            Layer::off(format!("{plain} (tmpfs: {})", layer.detail))
        }
    };
    if is_root {
        let want = format!("{} {} []", slot0.uid, slot0.gid);
        uid = t.add(
            "uid",
            |l| l.drop_uid = true,
            slot0,
            UID_CHECK,
            |o| o == want,
            // (the base, not the uids taken: those depend on what else runs, and the record of
            // a run must not)
            &format!(
                "a uid/gid per slot, the first free from {} (reserved against other kiln \
                 processes), no groups",
                uid_base
            ),
        );
        let when = if t.layers.drop_uid {
            "after the uid drop"
        } else {
            "as root (no uid drop; capabilities dropped after it)"
        };
        user_ns = t.add(
            "user_namespace",
            |l| l.user_ns = true,
            slot0,
            USERNS_CHECK,
            |o| o == "1",
            &format!("user namespace entered {when}"),
        );
    }
    let mut cgroup = match cgroup::hierarchy() {
        Err(e) => Layer::off(e),
        Ok(h) => {
            cgroup::remove_stale(&h);
            let tasks = RunLimits::default().tasks;
            let groups: Result<Vec<_>, String> = (0..slots.len())
                .map(|i| cgroup::SlotGroup::create(&h, &format!("{name}-slot{i}"), tasks))
                .collect();
            match groups {
                Err(e) => Layer::off(e),
                Ok(groups) => {
                    for (s, g) in slots.iter_mut().zip(groups) {
                        s.cgroup = Some(g);
                    }
                    let want = format!("{name}-slot0");
                    let kind = if matches!(h, cgroup::Hierarchy::V1 { .. }) {
                        "v1"
                    } else {
                        "v2"
                    };
                    let on = format!(
                        "cgroup {kind} per slot: memory (limit + 128 MiB, an OOM kill is memory_limit) and tasks"
                    );
                    t.add(
                        "cgroup",
                        |l| l.cgroup = true,
                        &slots[0],
                        CGROUP_CHECK,
                        |o| o.contains(&want),
                        &on,
                    )
                }
            }
        }
    };
    if !t.layers.cgroup {
        for s in &mut slots {
            s.cgroup = None;
        }
    }
    let slot0 = &slots[0];
    let mut signal_scope = false;
    let mut landlock = match landlock_err {
        Some(e) => Layer::off(e),
        None => {
            // a process outside the run, under the run's uid: only Landlock's scope can stop a
            // signal to it at this point (seccomp comes later)
            let (uid, gid) = platform.run_ids(&t.layers, slot0);
            let target = Target::spawn(uid, gid, is_root)?;
            let outside = std::env::temp_dir().join(format!("{name}-probe"));
            // a file outside the scratch that the run's uid owns: only Landlock (ABI 3) keeps
            // the run from truncating it at this point
            let keep = std::env::temp_dir().join(format!("{name}-keep"));
            std::fs::write(&keep, "keep").map_err(|e| SandboxError::io(&keep, e))?;
            if is_root {
                std::os::unix::fs::chown(&keep, Some(uid), Some(gid))
                    .map_err(|e| SandboxError::io(&keep, e))?;
            }
            let check = LANDLOCK_CHECK
                .replace("PID", &target.0.to_string())
                .replace("OUTSIDE", &format!("{:?}", outside.to_string_lossy()))
                .replace("KEEP", &format!("{:?}", keep.to_string_lossy()));
            let mut layer = t.add(
                "landlock",
                |l| l.landlock = true,
                slot0,
                &check,
                |o| o.starts_with("denied denied "),
                "",
            );
            let _ = std::fs::remove_file(&outside);
            let kept = std::fs::read_to_string(&keep).is_ok_and(|k| k == "keep");
            let _ = std::fs::remove_file(&keep);
            if layer.active {
                let words: Vec<&str> = t.last.split(' ').collect();
                let trial = |name: &str| match words.iter().find_map(|w| w.strip_prefix(name)) {
                    Some("denied") => Some(true),
                    Some("allowed") => Some(false),
                    _ => None,
                };
                signal_scope = words.get(2) == Some(&"scoped");
                let (tcp, abstract_unix) = net_trial(&platform, &t.layers, slot0, name);
                let tried = landlock::Tried {
                    signal_scope,
                    truncate: trial("truncate-").map(|denied| denied && kept),
                    tcp,
                    abstract_unix,
                };
                layer.detail = landlock::covers(abi, tried);
                if abi < kernel_abi {
                    layer.detail += &format!(" (as ABI {abi} on request; the kernel has {kernel_abi})");
                }
            }
            layer
        }
    };
    // after Landlock's trial, whose signal goes to a process outside (unreachable from inside)
    let mut pid_ns = if needs_userns {
        Layer::off("needs a user namespace (not root)")
    } else {
        let (uid, gid) = platform.run_ids(&t.layers, slot0);
        let target = Target::spawn(uid, gid, is_root)?;
        let check = PIDNS_CHECK.replace("PID", &target.0.to_string());
        let mut layer = t.add(
            "pid_namespace",
            |l| l.pid_ns = true,
            slot0,
            &check,
            |o| o.starts_with("1 none none ") && !o.ends_with("host"),
            "",
        );
        if layer.active {
            let proc_fs = match t.last.rsplit(' ').next() {
                Some("own") => "a fresh /proc with only the namespace's processes",
                Some("hidden") => "/proc hidden (the kernel refused a fresh one here: empty tmpfs)",
                _ => "/proc denied by Landlock (fresh, or hidden where the kernel refuses one)",
            };
            layer.detail = format!(
                "own PID namespace: the run is pid 2 under a minimal init (pid 1), sees and \
                 signals no process outside it (kill(-1) included; a process outside under the \
                 run's uid checked), everything in it killed when the run ends; {proc_fs}"
            );
        }
        layer
    };
    let mut seccomp = match seccomp_err {
        Some(e) => Layer::off(e),
        None => {
            let on = "allow-list: no sockets, no fork/clone of processes, no exec, no \
                      ptrace/mount/unshare/setns; signals only to itself (kill, tgkill, sigqueue, \
                      pidfds, F_SETOWN(_EX), FIOSETOWN/TIOCSPGRP); no chmod, utime, truncate by \
                      path or O_TRUNC without write access; no memfd_create or fallocate; no \
                      unlink, rename or O_TMPFILE (F_SETOWN to kiln, chmod, O_TRUNC, memfd_create, \
                      fallocate and unlink checked)";
            t.add(
                "seccomp",
                |l| l.seccomp = true,
                slot0,
                SECCOMP_CHECK,
                |o| o == "denied denied denied denied denied denied denied denied denied thread",
                on,
            )
        }
    };
    // a layer asked off says so, also where it would not have worked anyway
    for (name, layer) in [
        ("user_namespace", &mut user_ns),
        ("net_namespace", &mut net_ns),
        ("pid_namespace", &mut pid_ns),
        ("scratch", &mut scratch),
        ("uid", &mut uid),
        ("cgroup", &mut cgroup),
        ("landlock", &mut landlock),
        ("seccomp", &mut seccomp),
    ] {
        if skip.iter().any(|s| s == name) && !layer.detail.contains(LEFT_OFF) {
            *layer = Layer::off(format!("{LEFT_OFF}; unavailable anyway: {}", layer.detail));
        }
    }
    let layers = t.layers;
    let capabilities = bounds::capabilities(&platform, &layers, slot0);
    let tasks = bounds::tasks(&platform, &layers, slot0);
    let (memory, disk) = (bounds::memory(&platform, &layers, slot0), bounds::disk(&layers));
    let containment = bounds::containment(&platform, &layers, tasks.active, memory.active, signal_scope);
    Ok(Probed {
        platform,
        layers,
        slots,
        user_ns,
        net_ns,
        pid_ns,
        scratch,
        uid,
        cgroup,
        landlock,
        seccomp,
        capabilities,
        tasks,
        memory,
        disk,
        containment,
    })
}

/// The detail of a layer left off on request.
const LEFT_OFF: &str = "left off on request (--sandbox-without)";

/// Reads the user namespace's uid map: one id mapped (not the whole range of the host's).
const USERNS_CHECK: &str = "print(open('/proc/self/uid_map').read().split()[2])";
/// Lists the network interfaces: only the (down) loopback.
const NETNS_CHECK: &str = "import socket; print(','.join(n for _, n in socket.if_nameindex()))";
/// The working directory is writable and no larger than the file-size limit.
const TMPFS_CHECK: &str = "import os; s = os.statvfs('.'); open('w', 'w').write('x'); print(s.f_blocks * s.f_frsize <= SIZE)";
/// Under a PID namespace: the parent is the namespace's init (1); `kill(-1, 0)` and a signal to
/// PID (a process outside, under the run's uid) find no process ("none"); `/proc` lists only the
/// run (and its init, unless hidden by `hidepid`): "own", is empty ("hidden") or denied.
const PIDNS_CHECK: &str = "import os\n\
def reach(pid):\n    try:\n        os.kill(pid, 0)\n        return 'reached'\n    \
except ProcessLookupError:\n        return 'none'\n    except PermissionError:\n        return 'denied'\n\
try:\n    procs = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n    \
proc = 'own' if procs in ([2], [1, 2]) else 'hidden' if procs == [] else 'host'\n\
except PermissionError:\n    proc = 'denied'\n\
print(os.getppid(), reach(-1), reach(PID), proc)";
const UID_CHECK: &str = "import os; print(os.getuid(), os.getgid(), os.getgroups())";
const CGROUP_CHECK: &str = "print(open('/proc/self/cgroup').read())";
/// Reading /etc/passwd (world-readable) and writing OUTSIDE (in the world-writable temporary
/// directory) must be denied, the scratch directory writable; then whether a signal (0) reaches
/// PID, a process outside the run under the run's own uid ("scoped" when it is denied), and
/// whether KEEP (outside, the run's own file) can be truncated ("truncate-" and denied, allowed or
/// other: failed for another reason).
const LANDLOCK_CHECK: &str = "import os\nout = []\n\
for f in (lambda: open('/etc/passwd').read(), lambda: open(OUTSIDE, 'w').write('x')):\n    \
try:\n        f(); out.append('allowed')\n    except PermissionError:\n        out.append('denied')\n\
open('probe', 'w').write('x')\n\
try:\n    os.kill(PID, 0); out.append('unscoped')\nexcept PermissionError:\n    out.append('scoped')\n\
def tried(f):\n    try:\n        f(); return 'allowed'\n    except PermissionError:\n        return 'denied'\n    \
except OSError:\n        return 'other'\n\
out.append('truncate-' + tried(lambda: os.truncate(KEEP, 0)))\n\
print(' '.join(out))";

/// Binding a TCP socket on the loopback and connecting to NAME, an abstract unix socket kiln
/// listens on: "tcp-"/"abstract-" and denied, allowed or other (failed for another reason).
const NET_CHECK: &str = "import socket\n\
def tried(f):\n    try:\n        f(); return 'allowed'\n    except PermissionError:\n        return 'denied'\n    \
except OSError:\n        return 'other'\n\
print('tcp-' + tried(lambda: socket.socket().bind(('127.0.0.1', 0))), \
'abstract-' + tried(lambda: socket.socket(socket.AF_UNIX).connect('\\0NAME')))";

/// Landlock's TCP rights and abstract unix socket scope, tried under `layers` but in kiln's own
/// network namespace (a fresh one would refuse both before Landlock could): each `Some(denied)`,
/// or `None` where the trial could not tell. A connection that got through is also seen on
/// kiln's side of the socket.
fn net_trial(
    platform: &Platform,
    layers: &Layers,
    slot: &SlotResources,
    name: &str,
) -> (Option<bool>, Option<bool>) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    let socket_name = format!("{name}-probe-{}", std::process::id());
    let listener = SocketAddr::from_abstract_name(socket_name.as_bytes())
        .and_then(|a| UnixListener::bind_addr(&a))
        .and_then(|l| l.set_nonblocking(true).map(|()| l));
    let mut own_netns = layers.clone();
    own_netns.net_ns = false;
    let out = run_check(platform, &own_netns, slot, &NET_CHECK.replace("NAME", &socket_name));
    let out = out.unwrap_or_default();
    let word = |prefix: &str| match out.split(' ').find_map(|w| w.strip_prefix(prefix)) {
        Some("denied") => Some(true),
        Some("allowed") => Some(false),
        _ => None,
    };
    let abstract_unix = match &listener {
        // a connection that reached kiln's socket was allowed, whatever the check printed
        Ok(l) if l.accept().is_ok() => Some(false),
        Ok(_) => word("abstract-"),
        Err(_) => None,
    };
    (word("tcp-"), abstract_unix)
}
/// socket, fork and exec of the interpreter itself (which Landlock allows: only seccomp can
/// refuse it), making kiln the target of a pipe's `SIGIO` (`F_SETOWN`; harmless without
/// `O_ASYNC`), a chmod and an `O_RDONLY | O_TRUNC` open in the scratch directory, `memfd_create`
/// `fallocate` and `unlink` must be denied; threads must still start.
const SECCOMP_CHECK: &str = "import fcntl, os, socket, sys, threading\nout = []\nr, w = os.pipe()\nopen('t', 'w').write('x')\nfor f in (socket.socket, os.fork, lambda: os.execv(sys.executable, ['python', '-c', '']), lambda: fcntl.fcntl(r, fcntl.F_SETOWN, os.getppid()), lambda: os.chmod('t', 0o600), lambda: os.open('t', os.O_RDONLY | os.O_TRUNC), lambda: os.memfd_create('m'), lambda: os.posix_fallocate(os.open('t', os.O_WRONLY), 0, 4096), lambda: os.unlink('t')):\n    try:\n        f(); out.append('allowed')\n    except PermissionError:\n        out.append('denied')\nt = threading.Thread(target=out.append, args=('thread',))\nt.start()\nt.join()\nprint(' '.join(out))";

/// The layers found to work so far; each trial adds one on top.
struct Trials<'a> {
    platform: &'a Platform,
    layers: Layers,
    /// Layers the caller asked to leave off.
    skip: &'a [String],
    /// What the last check printed.
    last: String,
}

impl Trials<'_> {
    /// Tries the current layers plus `set` (the layer `name`): kept (and reported on) if `check`
    /// runs under them in `slot` and its output passes `expect`.
    fn add(
        &mut self,
        name: &str,
        set: impl Fn(&mut Layers),
        slot: &SlotResources,
        check: &str,
        expect: impl Fn(&str) -> bool,
        on: &str,
    ) -> Layer {
        if self.skip.iter().any(|s| s == name) {
            return Layer::off(LEFT_OFF);
        }
        let mut trial = self.layers.clone();
        set(&mut trial);
        match run_check(self.platform, &trial, slot, check) {
            Ok(out) if expect(&out) => {
                self.layers = trial;
                self.last = out;
                Layer::on(on)
            }
            Ok(out) => Layer::off(format!("not enforced (the check printed {out:?})")),
            Err(e) => Layer::off(e),
        }
    }
}

/// A process that waits to be killed, under the given ids, killed when kiln dies and when
/// dropped: the target of the Landlock check's signal.
struct Target(libc::pid_t);

impl Target {
    fn spawn(uid: u32, gid: u32, is_root: bool) -> Result<Target, SandboxError> {
        // SAFETY: the child makes only raw system calls (its own thread's ids) and never returns.
        match unsafe { libc::fork() } {
            -1 => Err(SandboxError::Spawn(format!(
                "fork: {}",
                std::io::Error::last_os_error()
            ))),
            0 => unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if is_root {
                    libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>());
                    libc::syscall(libc::SYS_setresgid, gid, gid, gid);
                    libc::syscall(libc::SYS_setresuid, uid, uid, uid);
                }
                loop {
                    libc::pause();
                }
            },
            pid => Ok(Target(pid)),
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        // SAFETY: our own child, killed and reaped.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

/// What one slot may touch (see `landlock`).
fn landlock_paths(interp: &Interpreter, read_dirs: &[PathBuf], abi: i64) -> landlock::Paths {
    let existing = |v: &[&str]| {
        v.iter()
            .map(PathBuf::from)
            .filter(|p| p.exists())
            .collect::<Vec<_>>()
    };
    let mut dirs = landlock::system_read_dirs();
    dirs.extend(interp.dirs.iter().cloned());
    dirs.extend(read_dirs.iter().cloned());
    let mut exec = vec![interp.path.clone()];
    exec.extend(interp.loader.iter().cloned());
    landlock::Paths {
        read_dirs: dirs,
        read_files: existing(&[
            "/etc/ld.so.cache",
            "/etc/localtime",
            "/dev/zero",
            "/dev/urandom",
            "/dev/random",
        ]),
        exec_files: exec,
        rw_files: existing(&["/dev/null"]),
        abi,
    }
}

/// Runs `python -I -S -B -c check` under `layers` and returns its trimmed stdout.
pub(crate) fn run_check(
    platform: &Platform,
    layers: &Layers,
    slot: &SlotResources,
    check: &str,
) -> Result<String, String> {
    let limits = RunLimits {
        wall: Duration::from_secs(20),
        ..RunLimits::default()
    };
    run_check_with(platform, layers, slot, check, &limits)
}

/// [`run_check`] under `limits`.
pub(crate) fn run_check_with(
    platform: &Platform,
    layers: &Layers,
    slot: &SlotResources,
    check: &str,
    limits: &RunLimits,
) -> Result<String, String> {
    if !layers.tmpfs {
        let owner = platform.is_root.then(|| platform.run_ids(layers, slot));
        crate::fresh::renew_scratch(&slot.work, owner).map_err(|e| e.to_string())?;
    }
    let args: Vec<&OsStr> = ["-I", "-S", "-B", "-c", check]
        .into_iter()
        .map(OsStr::new)
        .collect();
    let start = Instant::now();
    let child = platform
        .spawn(layers, slot, &args, limits)
        .map_err(|e| e.to_string())?;
    let kill = if layers.pid_ns {
        Kill::Proxy
    } else {
        Kill::Group
    };
    let out = supervise(child, b"", limits, start, None, kill).map_err(|e| e.to_string())?;
    if out.exit != crate::run::Exit::Code(0) {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.trim().lines().last().unwrap_or("").to_string();
        return Err(format!("the check exited with {:?}: {last}", out.exit));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
