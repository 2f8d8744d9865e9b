//! The probe: which layers work on this machine. Each layer is added on top of those that
//! already work and kept only if a process starts under them AND a check run inside shows the
//! layer's effect (an empty network namespace, the slot's uid, a denied read of `/etc/passwd`, a
//! denied `socket()` and `fork()`, …) — a layer that starts but does not enforce is reported off.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{Layers, Platform, SlotResources, cgroup, landlock, seccomp};
use crate::SandboxError;
use crate::protections::Layer;
use crate::python::Interpreter;
use crate::run::{RunLimits, supervise};

/// What the probe found.
pub(crate) struct Probed {
    pub platform: Platform,
    pub layers: Layers,
    pub slots: Vec<SlotResources>,
    pub user_ns: Layer,
    pub net_ns: Layer,
    pub scratch: Layer,
    pub uid: Layer,
    pub cgroup: Layer,
    pub landlock: Layer,
    pub seccomp: Layer,
}

/// Probes the layers for slots whose scratch directories are `work_dirs` (existing, empty).
pub(crate) fn probe(
    interp: &Interpreter,
    read_dirs: &[PathBuf],
    work_dirs: &[PathBuf],
    uid_base: u32,
    name: &str,
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
    let abi = landlock::kernel_abi();
    let mut landlock_err =
        (abi < 1).then(|| "the kernel has no Landlock (or it is disabled)".to_string());
    if landlock_err.is_none() {
        let paths = landlock_paths(interp, read_dirs);
        match landlock::ruleset(&paths) {
            Ok(_) => {
                platform.landlock = Some(paths);
                platform.scratch_access = landlock::scratch_access();
            }
            Err(e) => landlock_err = Some(e),
        }
    }
    let mut slots = Vec::new();
    for (i, work) in work_dirs.iter().enumerate() {
        let (uid, gid) = (uid_base + i as u32, uid_base + i as u32);
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

    let mut layers = Layers::default();
    let report = |layers: &mut Layers,
                  set: &dyn Fn(&mut Layers),
                  check: &str,
                  expect: &dyn Fn(&str) -> bool,
                  slots: &[SlotResources]|
     -> Result<(), String> {
        let mut trial = layers.clone();
        set(&mut trial);
        let out = run_check(&platform, &trial, &slots[0], check)?;
        if !expect(&out) {
            return Err(format!("not enforced (check printed {out:?})"));
        }
        *layers = trial;
        Ok(())
    };
    let verdict = |r: Result<(), String>, on: String| match r {
        Ok(()) => Layer::on(on),
        Err(e) => Layer::off(e),
    };
    let base_ok = run_check(&platform, &layers, &slots[0], "print('ok')");
    if let Err(e) = base_ok {
        return Err(SandboxError::Spawn(format!(
            "{} does not run even unconfined: {e}",
            interp.path.display()
        )));
    }

    let uid_check = "import os; print(os.getuid(), os.getgid(), os.getgroups())";
    let mut uid = Layer::off("kiln does not run as root (programs run under its own uid)");
    let mut user_ns = Layer::off("not tried");
    if !is_root {
        let r = report(
            &mut layers,
            &|l| l.user_ns = true,
            "print(open('/proc/self/uid_map').read().split()[2])",
            &|o| o == "1",
            &slots,
        );
        user_ns = verdict(r, "own user namespace (ids mapped to themselves)".into());
    }
    let needs_userns = !is_root && !layers.user_ns;
    let net_ns = if needs_userns {
        Layer::off("needs a user namespace (not root)")
    } else {
        let check = "import socket; print(','.join(n for _, n in socket.if_nameindex()))";
        let r = report(
            &mut layers,
            &|l| l.net_ns = true,
            check,
            &|o| o == "lo",
            &slots,
        );
        verdict(
            r,
            "empty network namespace (loopback only, down); IPC and UTS namespaces".into(),
        )
    };
    let scratch_bytes = RunLimits::default().file_bytes;
    let scratch = if needs_userns {
        Layer::off(
            "plain directory, emptied after each run (a private tmpfs needs a user namespace)",
        )
    } else {
        let check = format!(
            "import os; s = os.statvfs('.'); open('w', 'w').write('x'); print(s.f_blocks * s.f_frsize <= {scratch_bytes})"
        );
        let r = report(
            &mut layers,
            &|l| l.tmpfs = true,
            &check,
            &|o| o == "True",
            &slots,
        );
        match r {
            Ok(()) => Layer::on(
                "private tmpfs per run (size = the file-size limit, 4096 inodes), in a mount namespace",
            ),
            Err(e) => Layer::off(format!(
                "plain directory, emptied after each run (tmpfs: {e})"
            )),
        }
    };
    if is_root {
        let expect = format!("{} {} []", slots[0].uid, slots[0].gid);
        let r = report(
            &mut layers,
            &|l| l.drop_uid = true,
            uid_check,
            &|o| o == expect,
            &slots,
        );
        uid = verdict(r, format!("uid/gid {}+slot, no groups", uid_base));
        user_ns = if layers.drop_uid {
            let r = report(
                &mut layers,
                &|l| l.user_ns = true,
                "print(open('/proc/self/uid_map').read().split()[2])",
                &|o| o == "1",
                &slots,
            );
            verdict(r, "user namespace entered after the uid drop".into())
        } else {
            Layer::off("needs the uid drop")
        };
    }
    let cgroup = match cgroup::hierarchy() {
        Err(e) => Layer::off(e),
        Ok(h) => {
            let mut err = None;
            for (i, s) in slots.iter_mut().enumerate() {
                match cgroup::SlotGroup::create(
                    &h,
                    &format!("{name}-slot{i}"),
                    RunLimits::default().tasks,
                ) {
                    Ok(g) => s.cgroup = Some(g),
                    Err(e) => err = Some(e),
                }
            }
            let r = match err {
                Some(e) => Err(e),
                None => {
                    let want = format!("{name}-slot0");
                    report(
                        &mut layers,
                        &|l| l.cgroup = true,
                        "print(open('/proc/self/cgroup').read())",
                        &|o| o.contains(&want),
                        &slots,
                    )
                }
            };
            let kind = if matches!(h, cgroup::Hierarchy::V1 { .. }) {
                "v1"
            } else {
                "v2"
            };
            verdict(
                r,
                format!(
                    "cgroup {kind} per slot: memory (limit + 128 MiB, OOM kill = memory_limit) and pids"
                ),
            )
        }
    };
    if !layers.cgroup {
        for s in &mut slots {
            s.cgroup = None;
        }
    }
    let landlock = match landlock_err {
        Some(e) => Layer::off(e),
        None => {
            let check = "try:\n    open('/etc/passwd').read(); print('read')\nexcept PermissionError:\n    open('probe', 'w').write('x'); print('denied')";
            let r = report(
                &mut layers,
                &|l| l.landlock = true,
                check,
                &|o| o == "denied",
                &slots,
            );
            verdict(
                r,
                format!(
                    "ABI {abi}: read-only system and interpreter paths, scratch read-write, no /proc, no TCP, no signals out"
                ),
            )
        }
    };
    let seccomp = match seccomp_err {
        Some(e) => Layer::off(e),
        None => {
            // exec of the interpreter itself: Landlock allows it, only seccomp can refuse
            // (and threads must still start)
            let check = "import os, socket, sys, threading\nout = []\nfor f in (socket.socket, os.fork, lambda: os.execv(sys.executable, ['python', '-c', ''])):\n    try:\n        f(); out.append('allowed')\n    except PermissionError:\n        out.append('denied')\nt = threading.Thread(target=out.append, args=('thread',))\nt.start()\nt.join()\nprint(' '.join(out))";
            let r = report(
                &mut layers,
                &|l| l.seccomp = true,
                check,
                &|o| o == "denied denied denied thread",
                &slots,
            );
            verdict(r, "allow-list: no sockets, no fork/clone of processes, no exec, no ptrace/mount/unshare/setns, signals only to itself".into())
        }
    };
    Ok(Probed {
        platform,
        layers,
        slots,
        user_ns,
        net_ns,
        scratch,
        uid,
        cgroup,
        landlock,
        seccomp,
    })
}

/// What one slot may touch (see `landlock`).
fn landlock_paths(interp: &Interpreter, read_dirs: &[PathBuf]) -> landlock::Paths {
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
    }
}

/// Runs `python -I -S -B -c check` under `layers` and returns its trimmed stdout.
fn run_check(
    platform: &Platform,
    layers: &Layers,
    slot: &SlotResources,
    check: &str,
) -> Result<String, String> {
    if !layers.tmpfs {
        crate::sandbox::empty_dir(&slot.work).map_err(|e| e.to_string())?;
    }
    let limits = RunLimits {
        wall: Duration::from_secs(20),
        ..RunLimits::default()
    };
    let args: Vec<&OsStr> = ["-I", "-S", "-B", "-c", check]
        .into_iter()
        .map(OsStr::new)
        .collect();
    let start = Instant::now();
    let child = platform
        .spawn(layers, slot, &args, &limits)
        .map_err(|e| e.to_string())?;
    let out = supervise(child, b"", &limits, start).map_err(|e| e.to_string())?;
    if out.exit != crate::run::Exit::Code(0) {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.trim().lines().last().unwrap_or("").to_string();
        return Err(format!("the check exited with {:?}: {last}", out.exit));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
