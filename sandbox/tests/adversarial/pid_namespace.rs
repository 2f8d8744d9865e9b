//! The PID namespace alone (seccomp and Landlock left off, so nothing else stands in the way): a
//! program sees only its own namespace's processes, signals nothing outside it — `kill(-1,
//! SIGKILL)` included — and a daemon it double-forks dies when the run ends.

use std::path::Path;
use std::time::{Duration, Instant};

use kiln_sandbox::{RunLimits, Sandbox, SandboxOptions};

use super::{Targets, common};

/// Uid bases of the sandboxes here (`+ 10` each).
const UID_BASE: u32 = 2_000_000_500;

/// A sandbox with `skip` left off (unsafe mode: without Landlock nothing contains the file
/// system), whose PID namespace must be on.
fn sandbox(skip: &[&str], uid_base: u32) -> Sandbox {
    let s = Sandbox::new(SandboxOptions {
        allow_unsafe: true,
        slots: 1,
        uid_base,
        skip_layers: skip.iter().map(|l| l.to_string()).collect(),
        ..SandboxOptions::default()
    })
    .unwrap_or_else(|e| panic!("cannot set up the sandbox without {skip:?}: {e}"));
    let p = s.protections();
    if !skip.contains(&"pid_namespace") {
        assert!(
            p.pid_namespace.active,
            "the PID namespace is off: {}\nThese tests need root, or unprivileged user namespaces \
             (sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone = 1, \
             kernel.apparmor_restrict_unprivileged_userns = 0).\n{p}",
            p.pid_namespace.detail
        );
    }
    s
}

/// `python -c code` in `sandbox`: its stdout (it must exit 0).
fn run(sandbox: &Sandbox, code: &str) -> String {
    let limits = RunLimits {
        wall: Duration::from_secs(10),
        ..RunLimits::default()
    };
    let out = sandbox.run_python(&["-c", code], b"", &limits).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.exit,
        kiln_sandbox::Exit::Code(0),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Lists `/proc`, forks a child, then signals (0) a sentinel outside under the run's uid (pid and
/// group), this test's own process, and its parent (`SIGTERM`, `SIGKILL`: the namespace's init);
/// only if none of those outside is reachable, `kill(-1, SIGKILL)` (without the namespace it could
/// kill every process of the run's uid), whose only victim must be its own child. Prints JSON;
/// each signal's result is 0 or the errno.
const HOSTILE: &str = "import ctypes, json, os, signal\n\
libc = ctypes.CDLL(None, use_errno=True)\n\
def k(pid, sig):\n    return 0 if libc.kill(pid, sig) == 0 else ctypes.get_errno()\n\
out = {'pid': os.getpid(), 'ppid': os.getppid()}\n\
child = os.fork()\n\
if child == 0:\n    signal.pause()\n    os._exit(0)\n\
out['child'] = child\n\
out['procs'] = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n\
out['outside'] = [k(p, 0) for p in OUTSIDE] + [k(-p, 0) for p in OUTSIDE]\n\
out['parent'] = [k(os.getppid(), signal.SIGTERM), k(os.getppid(), signal.SIGKILL)]\n\
if os.getppid() == 1 and all(e == 3 for e in out['outside']):\n    \
out['all'] = k(-1, signal.SIGKILL)\n    _, st = os.waitpid(child, 0)\n    \
out['child_killed_by'] = os.WTERMSIG(st) if os.WIFSIGNALED(st) else None\n    \
out['after'] = k(-1, 0)\n\
print(json.dumps(out))\n";

#[test]
fn a_program_sees_and_signals_only_its_own_pid_namespace() {
    let _alone = common::exclusive();
    let uid_base = UID_BASE;
    let sandbox = sandbox(&["seccomp", "landlock"], uid_base);
    // a sentinel under the run's own uid (as root the slot's): only the namespace keeps it safe
    let mut targets = Targets::spawn(&sandbox);
    let outside: Vec<u32> = targets
        .0
        .iter()
        .map(|c| c.id())
        .chain([std::process::id()])
        .collect();
    let code = HOSTILE.replace("OUTSIDE", &format!("{outside:?}"));
    let text = run(&sandbox, &code);
    targets.assert_alive("after kill(-1, SIGKILL) in the namespace");
    let out: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    let ints = |k: &str| -> Vec<i64> {
        out[k]
            .as_array()
            .unwrap_or_else(|| panic!("{k} missing: {out}"))
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect()
    };
    // pid 2 under the namespace's init
    assert_eq!(
        (out["pid"].as_i64(), out["ppid"].as_i64()),
        (Some(2), Some(1)),
        "{out}"
    );
    let (pid, child) = (2, out["child"].as_i64().unwrap());
    // /proc: only the namespace (its init hidden when it runs under another uid), or nothing
    let procs = ints("procs");
    assert!(
        procs.is_empty()
            || (procs.contains(&pid) && procs.iter().all(|p| [1, pid, child].contains(p))),
        "/proc lists more than the namespace: {out}"
    );
    // nothing outside is found (ESRCH), not even denied: it is not there
    assert!(
        ints("outside").iter().all(|&e| e == libc::ESRCH as i64),
        "{out}"
    );
    // kill(-1, SIGKILL) reached its own child only (and the init, signalled from inside, lived:
    // else this program would have died with it)
    assert_eq!(out["all"].as_i64(), Some(0), "{out}");
    assert_eq!(
        out["child_killed_by"].as_i64(),
        Some(libc::SIGKILL as i64),
        "{out}"
    );
    assert_eq!(out["after"].as_i64(), Some(libc::ESRCH as i64), "{out}");
    println!("{out}");
}

/// Double-forks a daemon (new session, stdio closed) that renames a counter into `DIR/beat` every
/// 50 ms for 20 s, waits until the first beat is there, and exits. The command line (which the
/// daemon keeps) names `MARK`.
const DAEMON: &str = "import os, time\nDIR = 'THE_DIR'\nMARK = 'THE_MARK'\n\
pid = os.fork()\n\
if pid == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.closerange(0, 1024)\n        \
n, end = 0, time.time() + 20\n        while time.time() < end:\n            n += 1\n            \
with open(DIR + '/beat.tmp', 'w') as f:\n                f.write(str(n))\n            \
os.replace(DIR + '/beat.tmp', DIR + '/beat')\n            time.sleep(0.05)\n    os._exit(0)\n\
os.waitpid(pid, 0)\n\
t = time.time()\n\
while not os.path.exists(DIR + '/beat') and time.time() < t + 5:\n    time.sleep(0.01)\n\
print('daemon', os.path.exists(DIR + '/beat'))\n";

/// The host pids whose command line contains `mark`.
fn marked(mark: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).contains(mark) {
            found.push(pid);
        }
    }
    found
}

/// The beat counter, if written.
fn beat(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("beat")).ok()
}

/// Whether the beat changes within `within`.
fn beating(dir: &Path, within: Duration) -> bool {
    let first = beat(dir);
    let t = Instant::now();
    while t.elapsed() < within {
        std::thread::sleep(Duration::from_millis(20));
        if beat(dir) != first {
            return true;
        }
    }
    false
}

#[test]
fn a_daemon_that_would_outlive_its_run_dies_with_the_pid_namespace() {
    use std::os::unix::fs::PermissionsExt;
    let _alone = common::exclusive();
    // nothing else that finds what a run left: no seccomp (so it can fork), no cgroup, no uid
    let skip = ["seccomp", "landlock", "cgroup", "uid"];
    let cases = [
        (sandbox(&skip, UID_BASE + 10), true),
        // the control: without the namespace the same daemon outlives the run
        (
            sandbox(&[&skip[..], &["pid_namespace"]].concat(), UID_BASE + 20),
            false,
        ),
    ];
    for (sandbox, pid_ns) in cases {
        let dir = std::env::temp_dir().join(common::unique("daemon"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mark = common::unique("daemon-mark");
        let code = DAEMON
            .replace("THE_DIR", &dir.to_string_lossy())
            .replace("THE_MARK", &mark);
        let out = run(&sandbox, &code);
        assert_eq!(out.trim(), "daemon True", "the daemon did not start");
        let alive = beating(&dir, Duration::from_millis(600));
        let left = marked(&mark);
        for &pid in &left {
            // SAFETY: a process this test's program started (its command line names the mark).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&dir);
        if pid_ns {
            assert!(
                !alive && left.is_empty(),
                "the daemon outlived its run: pids {left:?}"
            );
        } else {
            assert!(
                alive && !left.is_empty(),
                "without the PID namespace (and with nothing else to kill it) the daemon should \
                 have outlived its run, so the check above could not fail: beating {alive}, pids \
                 {left:?}"
            );
        }
    }
}
