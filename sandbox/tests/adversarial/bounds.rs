//! Resource bounds and privileges in every mode: the full sandbox, the bare one (no Landlock, no
//! tmpfs) and the fallback one (no uid drop, cgroup, user namespace or tmpfs: as root, a run
//! stays root; unprivileged, it shares kiln's uid), and where it matters one without seccomp.

use std::time::Duration;

use kiln_sandbox::{Limits, RunLimits, Sandbox, Verdict};

use super::{assert_verdict, common, grade_in, probe, short, stdin};

/// The three sandboxes whose modes differ in what bounds a run.
fn modes() -> [&'static Sandbox; 3] {
    [
        common::sandbox(),
        common::bare_sandbox(),
        common::fallback_sandbox(),
    ]
}

/// Starts threads (small stacks) until one fails, at most 3000, holds them 1.5 s, then prints
/// "bounded" if fewer than MOST started.
const THREAD_BOMB: &str = "import threading, time\nthreading.stack_size(1 << 16)\nstop = threading.Event()\nn = 0\n\
try:\n    while n < 3000:\n        threading.Thread(target=stop.wait).start()\n        n += 1\n\
except RuntimeError:\n    pass\ntime.sleep(1.5)\nstop.set()\nprint('bounded' if n < MOST else 'unbounded %d' % n)";

/// As an unprivileged user, lowers this process's own `RLIMIT_NPROC` to its uid's tasks + 400
/// (so a bomb that used kiln's uid up would stop kiln's threads too); returns the old limit.
fn tight_nproc() -> Option<libc::rlimit> {
    if common::is_root() {
        return None; // root's tasks are not limited by RLIMIT_NPROC
    }
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with locals.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NPROC, &mut old);
        let uid = libc::getuid();
        let mut mine = 0u64;
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
            let field = |k: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(k))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            };
            if field("Uid:") == Some(u64::from(uid)) {
                mine += field("Threads:").unwrap_or(1);
            }
        }
        let new = libc::rlimit {
            rlim_cur: (mine + 400).min(old.rlim_max),
            rlim_max: old.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NPROC, &new), 0);
    }
    Some(old)
}

#[test]
fn thread_bombs_are_contained_and_kiln_still_starts_threads() {
    let _alone = common::exclusive();
    let old = tight_nproc();
    for sandbox in modes() {
        let p = sandbox.protections();
        if !p.tasks.active {
            // only the host's root without the uid drop and a cgroup: said, not hidden
            assert!(
                common::is_root() && !p.uid.active && !p.cgroup.active,
                "{p}"
            );
            assert!(p.tasks.detail.contains("exempt from RLIMIT_NPROC"), "{p}");
            continue;
        }
        std::thread::scope(|s| {
            let limits = Limits {
                per_test: Duration::from_secs(4),
                ..short()
            };
            // 64 tasks per run; on kiln's shared uid the run also gets the room of tasks that
            // end while it runs (kiln's own threads, other runs)
            let most = if p.tasks.detail.contains("shared uid") {
                80
            } else {
                64
            };
            let code = THREAD_BOMB.replace("MOST", &most.to_string());
            let bomb = s.spawn(move || grade_in(sandbox, &code, &stdin("", "bounded"), &limits));
            std::thread::sleep(Duration::from_millis(700)); // the bomb holds its threads now
            let kiln: Vec<_> = (0..32)
                .map(|_| {
                    std::thread::Builder::new()
                        .spawn(|| std::thread::sleep(Duration::from_millis(50)))
                })
                .collect();
            let started = kiln.iter().filter(|t| t.is_ok()).count();
            for t in kiln.into_iter().flatten() {
                t.join().unwrap();
            }
            let g = bomb.join().unwrap();
            assert_eq!(started, 32, "kiln could not start its threads under {p}");
            assert_verdict(&g, Verdict::Accepted);
        });
    }
    if let Some(old) = old {
        // SAFETY: setrlimit with a local (restoring the soft limit is always allowed).
        unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &old) };
    }
}

/// A thread bomb in one slot while another slot's program starts sixteen threads: the second
/// passes in every mode. (Where runs share kiln's uid, runs go one at a time, since one run's
/// threads would take another's room under `RLIMIT_NPROC`.)
#[test]
fn a_thread_bomb_never_takes_another_runs_threads() {
    let _alone = common::exclusive();
    let benign = "import threading, time\ntime.sleep(0.5)\nres = [0] * 16\ndef work(i):\n    res[i] = i\n\
                  ts = [threading.Thread(target=work, args=(i,)) for i in range(16)]\n\
                  for t in ts: t.start()\nfor t in ts: t.join()\nprint(sum(res))";
    for sandbox in modes() {
        let p = sandbox.protections();
        if !p.tasks.active {
            continue; // (the host's root without the uid drop and a cgroup: refused for tasks)
        }
        if p.tasks.detail.contains("shared uid") {
            assert_eq!(sandbox.slots(), 1, "{p}");
        }
        let limits = Limits { per_test: Duration::from_secs(4), ..short() };
        let bomb = THREAD_BOMB.replace("MOST", "3001");
        std::thread::scope(|s| {
            let first = s.spawn(|| sandbox.grade(benign, &stdin("", "120"), &limits).unwrap());
            std::thread::sleep(Duration::from_millis(100)); // the benign run has its limits now
            let g = sandbox.grade(&bomb, &stdin("", "bounded"), &limits).unwrap();
            assert_verdict(&g, Verdict::Accepted);
            assert_verdict(&first.join().unwrap(), Verdict::Accepted);
        });
        let left = common::leftovers_of(sandbox);
        assert!(left.is_empty(), "processes left behind: {left:?}");
    }
}

/// Creates memory files until that fails, each grown 1 MiB at a time until that fails, then
/// prints the total ("denied" if the first one is refused).
const MEMFD_GROWTH: &str = "import os\nfds, total = [], 0\n\
try:\n    while len(fds) < 1000:\n        fds.append(os.memfd_create('m'))\n        \
try:\n            while True:\n                total += os.write(fds[-1], b'x' * (1 << 20))\n        \
except OSError:\n            pass\nexcept PermissionError:\n    pass\nexcept OSError:\n    pass\n\
print('denied' if not fds else total)";

#[test]
fn memfd_growth_is_denied_or_bounded() {
    let _alone = common::exclusive();
    for sandbox in modes() {
        let g = grade_in(sandbox, MEMFD_GROWTH, &stdin("", "denied"), &short());
        assert_verdict(&g, Verdict::Accepted);
    }
    // without seccomp (and a cgroup): each memory file ≤ RLIMIT_FSIZE, ≤ RLIMIT_NOFILE of them
    let sandbox = common::no_seccomp_sandbox();
    let limits = RunLimits {
        wall: Duration::from_secs(10),
        file_bytes: 8 << 20,
        open_files: 24,
        ..RunLimits::default()
    };
    let out = sandbox
        .run_python(&["-c", MEMFD_GROWTH], b"", &limits)
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let total: u64 = text.trim().parse().unwrap_or_else(|_| panic!("{out:?}"));
    assert!(total > 0 && total <= 24 * (8 << 20), "memfd total {total}");
}

/// RLIMIT_NOFILE bounds descriptor numbers, and a run's process starts with every descriptor
/// kiln holds (closed only at exec): with kiln holding more descriptors than a run's limit, the
/// sandbox's own setup still opens what it needs, and so does the program.
#[test]
fn kiln_holding_many_descriptors_does_not_break_a_low_open_files_limit() {
    let _alone = common::exclusive();
    let held: Vec<std::fs::File> = (0..64).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
    let limits = RunLimits { open_files: 16, ..RunLimits::default() };
    for sandbox in modes() {
        let out = sandbox
            .run_python(&["-c", "f = open('probe', 'w'); f.write('x'); f.close(); print('ok')"], b"", &limits)
            .unwrap_or_else(|e| panic!("{e}\n{}", sandbox.protections()));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok", "{out:?}\n{}", sandbox.protections());
    }
    drop(held);
}

pub(super) fn free_bytes() -> u64 {
    let p = std::ffi::CString::new(std::env::temp_dir().to_str().unwrap()).unwrap();
    // SAFETY: statvfs into a local.
    unsafe {
        let mut s: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(p.as_ptr(), &mut s), 0);
        s.f_bavail as u64 * s.f_frsize as u64
    }
}

#[test]
fn many_files_in_a_plain_scratch_directory_are_stopped() {
    let _alone = common::exclusive();
    // fallocate is refused; writing file after file is stopped near the tmpfs's size
    let fallocate = "import os\nfor i in range(1000):\n    fd = os.open('f%d' % i, os.O_WRONLY | os.O_CREAT)\n    \
                     print(attempt(lambda: os.posix_fallocate(fd, 0, 64 << 20)))\n    break";
    let write = "i = 0\nwhile True:\n    open('f%d' % i, 'wb').write(b'x' * (1 << 20))\n    i += 1";
    let empty = "import os\nfor i in range(100000):\n    os.close(os.open('e%d' % i, os.O_WRONLY | os.O_CREAT))";
    for sandbox in [common::bare_sandbox(), common::fallback_sandbox()] {
        let p = sandbox.protections();
        assert!(
            !p.scratch.active && p.disk.detail.contains("measured"),
            "{p}"
        );
        let g = grade_in(sandbox, &probe(fallocate), &stdin("", "denied"), &short());
        assert_verdict(&g, Verdict::Accepted);
        // (4096 empty files take this machine's ext4 about 2 s)
        let slow = Limits {
            per_test: Duration::from_secs(8),
            ..short()
        };
        for code in [write, empty] {
            let before = free_bytes();
            let g = grade_in(sandbox, code, &stdin("", "1"), &slow);
            let after = free_bytes();
            assert_verdict(&g, Verdict::RuntimeError);
            assert!(g.tests[0].detail.contains("scratch directory"), "{g:#?}");
            assert!(
                after + (160 << 20) > before,
                "free space fell from {before} to {after} under {p}"
            );
        }
    }
}

/// Removing a file's name, or replacing it by a rename, and `O_TMPFILE`: each would leave blocks
/// that no directory shows (through the C library: LiveCodeBench's guard nulls `os.unlink`,
/// `os.rename` and the like). Removing an empty directory stays allowed.
const HIDING: &str = "open('f', 'w').close()\nopen('g', 'w').close()\nos.mkdir('d')\n\
def c(r):\n    if r != 0:\n        raise OSError(ctypes.get_errno(), 'failed')\n\
AT_FDCWD = -100\n\
print(attempt(lambda: c(libc.unlink(b'f'))), attempt(lambda: c(libc.unlinkat(AT_FDCWD, b'f', 0))), \
attempt(lambda: c(libc.rename(b'f', b'g'))), attempt(lambda: c(libc.renameat2(AT_FDCWD, b'f', AT_FDCWD, b'h', 0))), \
attempt(lambda: os.close(os.open('.', os.O_TMPFILE | os.O_WRONLY))), attempt(lambda: c(libc.rmdir(b'd'))))";

#[test]
fn files_cannot_be_hidden_from_the_scratch_measure() {
    let _alone = common::exclusive();
    let want = "denied denied denied denied denied allowed";
    for sandbox in modes() {
        let g = grade_in(sandbox, &probe(HIDING), &stdin("", want), &short());
        assert_verdict(&g, Verdict::Accepted);
    }
    // writing on into files whose names it tried to remove is stopped like any other
    let hidden = "files = []\nfor i in range(16):\n    f = open('h%d' % i, 'wb')\n    \
                  libc.unlink(b'h%d' % i)\n    files.append(f)\nwhile True:\n    for f in files:\n        \
                  f.write(b'x' * (1 << 20))\n        f.flush()";
    let slow = Limits { per_test: Duration::from_secs(8), ..short() };
    for sandbox in [common::bare_sandbox(), common::fallback_sandbox()] {
        let p = sandbox.protections();
        assert!(!p.scratch.active, "{p}");
        let before = free_bytes();
        let g = grade_in(sandbox, &probe(hidden), &stdin("", "1"), &slow);
        let after = free_bytes();
        assert_verdict(&g, Verdict::RuntimeError);
        assert!(g.tests[0].detail.contains("scratch directory"), "{g:#?}\n{p}");
        assert!(after + (160 << 20) > before, "free space fell from {before} to {after} under {p}");
    }
}

/// Capability words (permitted + effective + inheritable), bounding-set members when the run is
/// root (only root's `execve` draws on them), `no_new_privs`
/// (by `capget` and `prctl`: Landlock hides `/proc`), then `CapEff` from `/proc/self/status`
/// where it can be read.
const CAPS: &str = "hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)\ndata = (ctypes.c_uint32 * 6)()\n\
assert libc.capget(hdr, data) == 0\n\
bounding = sum(libc.prctl(23, c, 0, 0, 0) == 1 for c in range(64)) if os.getuid() == 0 else 0\n\
try:\n    eff = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0]\n\
except OSError:\n    eff = '0000000000000000'\n\
print(sum(data), bounding, libc.prctl(39, 0, 0, 0, 0), eff)";

#[test]
fn a_run_has_no_capabilities_even_as_root() {
    let _alone = common::exclusive();
    let want = "0 0 1 0000000000000000";
    for sandbox in modes() {
        let g = grade_in(sandbox, &probe(CAPS), &stdin("", want), &short());
        assert_verdict(&g, Verdict::Accepted);
    }
    // the fallback's run keeps kiln's uid: root itself when kiln is
    // SAFETY: plain getter.
    let me = unsafe { libc::getuid() }.to_string();
    let uid = grade_in(
        common::fallback_sandbox(),
        "import os\nprint(os.getuid())",
        &stdin("", &me),
        &short(),
    );
    assert_verdict(&uid, Verdict::Accepted);
    for sandbox in modes() {
        let p = sandbox.protections();
        assert!(p.capabilities.active, "{p}");
    }
}

#[test]
fn a_forged_fast_result_frame_does_not_hide_a_slow_run() {
    let _alone = common::exclusive();
    // the frame says 1 ms and the right answer; the program then sleeps past the limit (1 s)
    // but inside the kill deadline (1 s + 1 s of grace) and exits without the harness's frame
    let code = "import json, os, sys, time\nm = sys.modules['kiln_lcb']\n\
head = json.dumps({'status': 'ok', 'exc': None, 'msg': '', 'time': 0.001, 'len': 2}).encode()\n\
os.write(m._out_fd, m.RESULT_MAGIC + head + b'\\n' + b'1\\n')\ntime.sleep(1.5)\nos._exit(0)";
    for sandbox in [common::sandbox(), common::fallback_sandbox()] {
        let g = grade_in(sandbox, code, &stdin("", "1"), &short());
        assert_verdict(&g, Verdict::TimeLimit);
        assert!(g.tests[0].time_s > 1.4, "{g:#?}");
    }
    // the same frame from a fast program passes: the forgery itself is not what fails
    let fast = code.replace("time.sleep(1.5)", "pass");
    let g = grade_in(
        common::sandbox(),
        &fast,
        &stdin("", "1"),
        &Limits::default(),
    );
    assert_verdict(&g, Verdict::Accepted);
}
