//! Hostile programs: each gets the verdict it must get, and the test checks that nothing
//! happened on the host (no process left, no file written, no connection made, nothing killed).
//! Where a program probes the sandbox itself, it prints what happened and the expected output is
//! "denied", so `accepted` proves the denial. Network tests only talk to listeners they start on
//! 127.0.0.1. Benign programs at the end must still pass.

#[path = "adversarial/bounds.rs"]
mod bounds;
mod common;
#[path = "adversarial/degraded.rs"]
mod degraded;
#[path = "adversarial/pid_namespace.rs"]
mod pid_namespace;
#[path = "adversarial/unprivileged.rs"]
mod unprivileged;

use std::net::{TcpListener, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::{Duration, Instant};

use kiln_sandbox::{Graded, Limits, Sandbox, TestCase, Verdict};

fn stdin(input: &str, output: &str) -> Vec<TestCase> {
    vec![TestCase::Stdin {
        input: input.into(),
        output: output.into(),
    }]
}

/// Short limits for programs that must be stopped.
fn short() -> Limits {
    Limits {
        per_test: Duration::from_secs(1),
        startup_grace: Duration::from_secs(1),
        memory_bytes: 256 << 20,
        output_bytes: 1 << 20,
        ..Limits::default()
    }
}

/// Grades, then checks that no process of the sandbox is left.
fn grade(code: &str, tests: &[TestCase], limits: &Limits) -> Graded {
    grade_timed(code, tests, limits).0
}

/// `grade`, also returning how long grading took (without waiting for other tests).
fn grade_timed(code: &str, tests: &[TestCase], limits: &Limits) -> (Graded, Duration) {
    let _alone = common::exclusive();
    let t = Instant::now();
    let g = common::sandbox().grade(code, tests, limits).unwrap();
    let took = t.elapsed();
    let left = common::leftovers();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    (g, took)
}

/// `grade` in another sandbox (the caller holds `common::exclusive()`).
fn grade_in(sandbox: &Sandbox, code: &str, tests: &[TestCase], limits: &Limits) -> Graded {
    let g = sandbox.grade(code, tests, limits).unwrap();
    let left = common::leftovers_of(sandbox);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    g
}

fn assert_verdict(g: &Graded, want: Verdict) {
    assert_eq!(g.verdict, want, "{g:#?}");
}

/// The program prelude used by the probing programs: `attempt(f)` prints "denied" when `f` raises
/// PermissionError (or another OSError), else "allowed"; `libc` is the C library via ctypes.
const PRELUDE: &str = "import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n\
def attempt(f):\n    try:\n        f()\n        return 'allowed'\n    except OSError:\n        return 'denied'\n";

fn probe(body: &str) -> String {
    format!("{PRELUDE}{body}")
}

#[test]
fn infinite_loop_is_time_limit() {
    let (g, took) = grade_timed("while True:\n    pass", &stdin("", "1"), &short());
    assert_verdict(&g, Verdict::TimeLimit);
    assert!(took < Duration::from_secs(4), "took {took:?}");
}

#[test]
fn sleep_is_time_limit() {
    let (g, took) = grade_timed("import time\ntime.sleep(100)", &stdin("", "1"), &short());
    assert_verdict(&g, Verdict::TimeLimit);
    assert!(took < Duration::from_secs(4), "took {took:?}");
}

#[test]
fn reading_past_the_input_does_not_hang() {
    // LCB's stdin mock: input() past the end raises EOFError (runtime error)
    let (g, a) = grade_timed(
        "for _ in range(3):\n    input()",
        &stdin("1\n", "1"),
        &short(),
    );
    assert_verdict(&g, Verdict::RuntimeError);
    // the real descriptor 0 is at end of file, so a raw read returns at once
    let (g, b) = grade_timed(
        "import os\nprint(len(os.read(0, 1 << 20)))",
        &stdin("1\n", "0"),
        &short(),
    );
    assert_verdict(&g, Verdict::Accepted);
    assert!(a + b < Duration::from_secs(2), "took {:?}", a + b);
}

#[test]
fn memory_hog_is_memory_limit() {
    let g = grade(
        "a = []\nwhile True:\n    a.append(' ' * 10**7)",
        &stdin("", "1"),
        &short(),
    );
    assert_verdict(&g, Verdict::MemoryLimit);
}

#[test]
fn mmap_and_touch_is_memory_limit() {
    // Shared anonymous memory is not data (RLIMIT_DATA): the cgroup (or, without one, the
    // address-space bound) must stop it. Private mappings hit RLIMIT_DATA.
    for flags in ["mmap.MAP_SHARED", "mmap.MAP_PRIVATE"] {
        let code = format!(
            "import mmap\nn = 3 << 30\nm = mmap.mmap(-1, n, flags={flags} | mmap.MAP_ANONYMOUS)\n\
             for i in range(0, n, 4096):\n    m[i] = 1\nprint('touched')"
        );
        let g = grade(&code, &stdin("", "1"), &short());
        assert_verdict(&g, Verdict::MemoryLimit);
    }
}

#[test]
fn fork_bombs_are_denied() {
    // os.fork is None after LCB's reliability_guard: TypeError
    let g = grade(
        "import os\nwhile True:\n    os.fork()",
        &stdin("", "1"),
        &short(),
    );
    assert_verdict(&g, Verdict::RuntimeError);
    // ctypes straight to the C library and to the system calls: every one fails
    let mut body = String::from("print(libc.fork(), libc.vfork())\n");
    if cfg!(target_arch = "x86_64") {
        body += "print(libc.syscall(57), libc.syscall(58), libc.syscall(56, 17, 0, 0, 0, 0))\n"; // fork, vfork, clone(SIGCHLD)
        body += "print(libc.syscall(435, 0, 0))\n"; // clone3 -> ENOSYS
    } else {
        body += "print(-1, -1, -1)\nprint(-1)\n";
    }
    let g = grade(&probe(&body), &stdin("", "-1 -1\n-1 -1 -1\n-1"), &short());
    assert_verdict(&g, Verdict::Accepted);
}

#[test]
fn tcp_and_udp_to_a_loopback_listener_are_denied() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let (tp, up) = (
        tcp.local_addr().unwrap().port(),
        udp.local_addr().unwrap().port(),
    );
    let body = format!(
        "import socket\n\
         def tcp():\n    s = socket.create_connection(('127.0.0.1', {tp}), timeout=1)\n    s.sendall(b'x')\n\
         def udp():\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    s.sendto(b'x', ('127.0.0.1', {up}))\n\
         print(attempt(tcp), attempt(udp))\n\
         print(libc.socket(2, 1, 0), libc.socket(2, 2, 0), libc.socket(10, 1, 0))\n"
    );
    let g = grade(
        &probe(&body),
        &stdin("", "denied denied\n-1 -1 -1"),
        &short(),
    );
    assert_verdict(&g, Verdict::Accepted);
    assert!(tcp.accept().is_err(), "the TCP listener saw a connection");
    let mut buf = [0u8; 16];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "the UDP socket received a datagram"
    );
}

#[test]
fn unix_sockets_are_denied() {
    let dir = std::env::temp_dir().join(common::unique("unix"));
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("s.sock");
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let body = format!(
        "import socket\n\
         def connect():\n    s = socket.socket(socket.AF_UNIX)\n    s.connect({path:?})\n\
         def pair():\n    socket.socketpair()\n\
         def abstract():\n    s = socket.socket(socket.AF_UNIX)\n    s.connect('\\0kiln-test')\n\
         print(attempt(connect), attempt(pair), attempt(abstract), libc.socket(1, 1, 0))\n"
    );
    let g = grade(
        &probe(&body),
        &stdin("", "denied denied denied -1"),
        &short(),
    );
    assert_verdict(&g, Verdict::Accepted);
    assert!(
        listener.accept().is_err(),
        "the unix listener saw a connection"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn writes_outside_the_scratch_directory_are_denied() {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let targets = [
        Path::new("/etc").join(common::unique("etc")),
        Path::new(&home).join(common::unique("home")),
        Path::new("/tmp").join(common::unique("tmp")),
        std::env::temp_dir().join(common::unique("tmpdir")),
    ];
    let harness = common::sandbox().directory().join("harness/kiln_lcb.py");
    let before = std::fs::read(&harness).unwrap();
    let mut body = String::new();
    for t in &targets {
        body += &format!(
            "print(attempt(lambda: open({:?}, 'w').write('x')))\n",
            t.to_str().unwrap()
        );
    }
    body += &format!(
        "print(attempt(lambda: open({:?}, 'a').write('x')))\n",
        harness.to_str().unwrap()
    );
    body += "print(attempt(lambda: open('scratch.txt', 'w').write('x')))\n";
    let want = "denied\n".repeat(targets.len() + 1) + "allowed";
    let g = grade(&probe(&body), &stdin("", &want), &short());
    assert_verdict(&g, Verdict::Accepted);
    for t in &targets {
        assert!(!t.exists(), "{} was written", t.display());
    }
    assert_eq!(
        std::fs::read(&harness).unwrap(),
        before,
        "the harness was changed"
    );
}

#[test]
fn disk_fill_is_stopped() {
    let free = || {
        let p = std::ffi::CString::new(std::env::temp_dir().to_str().unwrap()).unwrap();
        // SAFETY: statvfs into a local.
        unsafe {
            let mut s: libc::statvfs = std::mem::zeroed();
            assert_eq!(libc::statvfs(p.as_ptr(), &mut s), 0);
            s.f_bavail as u64 * s.f_frsize as u64
        }
    };
    let before = free();
    // one growing file, then many files: the file size limit, then the scratch size
    let one = "f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))";
    let many = "i = 0\nwhile True:\n    open('f%d' % i, 'wb').write(b'x' * (1 << 20))\n    i += 1";
    for code in [one, many] {
        let g = grade(code, &stdin("", "1"), &short());
        assert_verdict(&g, Verdict::RuntimeError);
    }
    let after = free();
    assert!(
        after + (32 << 20) > before,
        "free space fell from {before} to {after}"
    );
    for slot in std::fs::read_dir(common::sandbox().directory())
        .unwrap()
        .flatten()
    {
        if slot.file_name().to_string_lossy().starts_with("slot") {
            let n = std::fs::read_dir(slot.path())
                .map(|d| d.count())
                .unwrap_or(0);
            assert_eq!(n, 0, "{} is not empty", slot.path().display());
        }
    }
}

#[test]
fn secrets_and_other_processes_are_unreadable() {
    let dir = std::env::temp_dir().join(common::unique("secret"));
    std::fs::create_dir(&dir).unwrap();
    let secret = dir.join("secret.txt");
    std::fs::write(&secret, "hunter2").unwrap();
    let mut sibling = std::process::Command::new("sleep")
        .arg("30")
        .env("KILN_TEST_SECRET", "hunter2")
        .spawn()
        .unwrap();
    let body = format!(
        "print(attempt(lambda: open({:?}).read()))\n\
         print(attempt(lambda: open('/proc/%d/environ' % os.getppid(), 'rb').read()))\n\
         print(attempt(lambda: open('/proc/{}/environ', 'rb').read()))\n\
         print(attempt(lambda: open('/proc/self/environ', 'rb').read()))\n\
         print(sorted(k for k in os.environ if k not in ('OMP_NUM_THREADS', 'LC_CTYPE')))\n",
        secret.to_str().unwrap(),
        sibling.id()
    );
    let g = grade(
        &probe(&body),
        &stdin("", "denied\ndenied\ndenied\ndenied\n[]"),
        &short(),
    );
    sibling.kill().unwrap();
    sibling.wait().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_verdict(&g, Verdict::Accepted);
}

#[test]
fn killing_the_parent_or_others_is_denied() {
    let mut sibling = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    // os.kill is None after LCB's reliability_guard
    let g = grade(
        "import os\nos.kill(os.getppid(), 9)",
        &stdin("", "1"),
        &short(),
    );
    assert_verdict(&g, Verdict::RuntimeError);
    let body = format!(
        "print(libc.kill(os.getppid(), 9), libc.kill({}, 9), libc.kill(-1, 9), libc.kill(1, 9))\n",
        sibling.id()
    );
    let g = grade(&probe(&body), &stdin("", "-1 -1 -1 -1"), &short());
    assert_verdict(&g, Verdict::Accepted);
    // its own process group: only itself dies
    let g = grade(
        &probe("libc.kill(0, 9)\nprint('alive')"),
        &stdin("", "alive"),
        &short(),
    );
    assert_verdict(&g, Verdict::RuntimeError);
    assert!(
        sibling.try_wait().unwrap().is_none(),
        "the sibling process was killed"
    );
    sibling.kill().unwrap();
    sibling.wait().unwrap();
}

#[test]
fn running_other_programs_is_denied() {
    // os.system and subprocess.Popen are None (LCB); exec and spawn reach the kernel and are
    // refused
    let g = grade(
        "import os\nos.system('touch /tmp/x')",
        &stdin("", "1"),
        &short(),
    );
    assert_verdict(&g, Verdict::RuntimeError);
    let body = "import subprocess\n\
                try:\n    subprocess.run(['true'])\nexcept TypeError:\n    print('nulled')\n\
                print(attempt(lambda: os.execv('/bin/sh', ['sh', '-c', 'true'])))\n\
                print(attempt(lambda: os.execv(sys.executable, ['python', '-c', 'print(1)'])))\n\
                print(attempt(lambda: os.posix_spawn('/bin/true', ['true'], {})))\n\
                print(libc.execve(b'/bin/sh', None, None))\n";
    let g = grade(
        &probe(body),
        &stdin("", "nulled\ndenied\ndenied\ndenied\n-1"),
        &short(),
    );
    assert_verdict(&g, Verdict::Accepted);
}

#[test]
fn huge_output_is_wrong_answer_and_huge_stderr_is_dropped() {
    let (g, took) = grade_timed(
        "while True:\n    print('x' * 1000)",
        &stdin("", "1"),
        &short(),
    );
    assert_verdict(&g, Verdict::WrongAnswer);
    assert!(
        took < Duration::from_secs(1),
        "the output cap took {took:?}"
    );
    // writing around the capture, straight to the harness's descriptor
    let raw = "import os\nwhile True:\n    for fd in range(3, 10):\n        try:\n            os.write(fd, b'x' * 65536)\n        except OSError:\n            pass";
    let g = grade(raw, &stdin("", "1"), &short());
    assert!(
        matches!(g.verdict, Verdict::WrongAnswer | Verdict::RuntimeError),
        "{g:#?}"
    );
    let g = grade(
        "import sys\nwhile True:\n    sys.stderr.write('x' * 100000)",
        &stdin("", "1"),
        &short(),
    );
    assert_verdict(&g, Verdict::TimeLimit);
    assert!(g.tests[0].detail.len() < 1000);
}

#[test]
fn ignored_signals_and_setsid_do_not_escape_the_kill() {
    let code = "import signal\nfor s in (signal.SIGTERM, signal.SIGXCPU, signal.SIGINT, signal.SIGHUP):\n    \
                signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass";
    let (g, took) = grade_timed(code, &stdin("", "1"), &short());
    assert_verdict(&g, Verdict::TimeLimit);
    assert!(took < Duration::from_secs(4), "took {took:?}");
    // a new session is refused (it already leads one), and sleeping on is killed all the same
    let g = grade(
        &probe("print(attempt(os.setsid), libc.setsid())\nimport time\ntime.sleep(60)"),
        &stdin("", "1"),
        &short(),
    );
    assert_verdict(&g, Verdict::TimeLimit);
}

#[test]
fn sixteen_threads_pass() {
    let code = "import threading\nres = [0] * 16\ndef work(i):\n    res[i] = sum(range(i * 1000))\n\
                ts = [threading.Thread(target=work, args=(i,)) for i in range(16)]\n\
                for t in ts: t.start()\nfor t in ts: t.join()\nprint(sum(res))";
    let want: u64 = (0..16u64).map(|i| (0..i * 1000).sum::<u64>()).sum();
    let g = grade(code, &stdin("", &want.to_string()), &Limits::default());
    assert_verdict(&g, Verdict::Accepted);
}

#[test]
fn deep_recursion_with_a_raised_limit_passes() {
    let code = "import sys, threading\nsys.setrecursionlimit(10 ** 6)\nthreading.stack_size(512 << 20)\n\
                def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\n\
                def main():\n    print(f(200000))\nt = threading.Thread(target=main)\nt.start()\nt.join()";
    let g = grade(code, &stdin("", "200000"), &Limits::default());
    assert_verdict(&g, Verdict::Accepted);
}

#[test]
fn exit_after_output_and_reading_all_input_pass() {
    let g = grade(
        "import sys\nprint(42)\nsys.exit(0)",
        &stdin("", "42"),
        &Limits::default(),
    );
    assert_verdict(&g, Verdict::Accepted);
    let n: u64 = 200_000;
    let input: String = (1..=n).map(|i| format!("{i}\n")).collect();
    let code = "import sys\nprint(sum(map(int, sys.stdin.read().split())))";
    let g = grade(
        code,
        &stdin(&input, &(n * (n + 1) / 2).to_string()),
        &Limits::default(),
    );
    assert_verdict(&g, Verdict::Accepted);
}

/// Throwaway `sleep 30` processes that hostile programs try to signal, each leading its own
/// process group: one per slot uid where runs drop to one (a program runs under its slot's uid,
/// so nothing but the sandbox stands between it and them), else one under kiln's own uid.
struct Targets(Vec<std::process::Child>);

impl Targets {
    fn spawn(sandbox: &Sandbox) -> Targets {
        use std::os::unix::process::CommandExt;
        let uids: Vec<Option<u32>> = match sandbox.slot_uids() {
            [] => vec![None],
            slots => slots.iter().copied().map(Some).collect(),
        };
        let spawn = |uid: Option<u32>| {
            let mut c = std::process::Command::new("sleep");
            c.arg("30").process_group(0);
            if let Some(u) = uid {
                c.uid(u).gid(u);
            }
            c.spawn().unwrap()
        };
        Targets(uids.into_iter().map(spawn).collect())
    }

    /// Their pids as a Python list.
    fn pids(&self) -> String {
        let pids: Vec<String> = self.0.iter().map(|c| c.id().to_string()).collect();
        format!("[{}]", pids.join(", "))
    }

    fn assert_alive(&mut self, when: &str) {
        for c in &mut self.0 {
            let status = c.try_wait().unwrap();
            assert!(
                status.is_none(),
                "{when}: target {} died: {status:?}",
                c.id()
            );
        }
    }
}

impl Drop for Targets {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The probing prelude plus `rc(v)`: "denied" when a libc call returned -1 with `EPERM` (what the
/// seccomp filter answers; `ENOTTY`, `EACCES`, `ESRCH` … mean it was not consulted), else the
/// result; and `SYS`, the system call numbers of this architecture.
fn errno_probe(body: &str) -> String {
    let sys = [
        ("tkill", libc::SYS_tkill),
        ("tgkill", libc::SYS_tgkill),
        ("rt_sigqueueinfo", libc::SYS_rt_sigqueueinfo),
        ("rt_tgsigqueueinfo", libc::SYS_rt_tgsigqueueinfo),
        ("pidfd_open", libc::SYS_pidfd_open),
        ("pidfd_send_signal", libc::SYS_pidfd_send_signal),
        ("fchmodat", libc::SYS_fchmodat),
        ("fchmodat2", 452),
        ("utimensat", libc::SYS_utimensat),
    ];
    let sys: Vec<String> = sys.iter().map(|(n, v)| format!("'{n}': {v}")).collect();
    probe(&format!(
        "import struct\nSYS = {{{}}}\n\
         def rc(v):\n    e = ctypes.get_errno()\n    return 'denied' if v == -1 and e == 1 else 'rc=%d errno=%d' % (v, e)\n\
         {body}",
        sys.join(", ")
    ))
}

/// Every way to signal another process, at each pid in `PIDS`: `kill` (the process and its
/// group), `tkill`, `tgkill`, `rt_(tg)sigqueueinfo`, pidfds, and a pipe whose `SIGIO` — made
/// `SIGKILL` with `F_SETSIG` — goes to the pid through `F_SETOWN`, `F_SETOWN_EX` or the
/// `FIOSETOWN`/`SIOCSPGRP`/`TIOCSPGRP` ioctls. Prints one word per attempt.
const SIGNAL_OUT: &str = "import time\n\
info = ctypes.create_string_buffer(struct.pack('iii', 9, 0, -1), 128)\n\
def sigio_pipe(set_owner):\n    r, w = os.pipe()\n    res = set_owner(r)\n    libc.fcntl(r, 10, 9)\n    \
libc.fcntl(r, 4, libc.fcntl(r, 3) | 0o20000)\n    os.write(w, b'x')\n    os.close(r)\n    os.close(w)\n    return res\n\
out = []\n\
for pid in PIDS:\n    \
out.append(rc(libc.kill(pid, 9)))\n    \
out.append(rc(libc.kill(-pid, 9)))\n    \
out.append(rc(libc.syscall(SYS['tkill'], pid, 9)))\n    \
out.append(rc(libc.syscall(SYS['tgkill'], pid, pid, 9)))\n    \
out.append(rc(libc.syscall(SYS['rt_sigqueueinfo'], pid, 9, info)))\n    \
out.append(rc(libc.syscall(SYS['rt_tgsigqueueinfo'], pid, pid, 9, info)))\n    \
out.append(rc(libc.syscall(SYS['pidfd_open'], pid, 0)))\n    \
try:\n        fd = os.open('/proc/%d' % pid, os.O_RDONLY | os.O_DIRECTORY)\n    except OSError:\n        fd = -1\n    \
out.append(rc(libc.syscall(SYS['pidfd_send_signal'], fd, 9, None, 0)))\n    \
for owner in (pid, -pid):\n        out.append(sigio_pipe(lambda r: rc(libc.fcntl(r, 8, owner))))\n    \
for kind in (0, 1, 2):\n        ex = ctypes.create_string_buffer(struct.pack('ii', kind, pid))\n        \
out.append(sigio_pipe(lambda r: rc(libc.fcntl(r, 15, ex))))\n    \
for req in (0x8901, 0x8902, TIOCSPGRP):\n        v = ctypes.c_int(pid)\n        \
out.append(sigio_pipe(lambda r: rc(libc.ioctl(r, req, ctypes.byref(v)))))\n\
time.sleep(0.3)\n\
print(' '.join(out))\n";

#[test]
fn signalling_other_processes_is_denied_every_way() {
    let _alone = common::exclusive();
    for sandbox in [common::bare_sandbox(), common::sandbox()] {
        let mut targets = Targets::spawn(sandbox);
        let body = format!(
            "PIDS = {}\nTIOCSPGRP = {}\n{SIGNAL_OUT}",
            targets.pids(),
            libc::TIOCSPGRP
        );
        let attempts = 16 * targets.0.len();
        let want = vec!["denied"; attempts].join(" ");
        // on every slot (each runs under its own uid when kiln is root)
        let tests = vec![stdin("", &want).remove(0); 2 * sandbox.slots()];
        let limits = Limits {
            stop_at_first_failure: false,
            ..short()
        };
        let g = grade_in(sandbox, &errno_probe(&body), &tests, &limits);
        targets.assert_alive(&sandbox.protections().summary());
        assert_verdict(&g, Verdict::Accepted);
    }
}

#[test]
fn signalling_itself_still_works() {
    let _alone = common::exclusive();
    // raise, kill of its pid, its group (0 and -pgid), pthread_kill (also from a thread), sigqueue,
    // a timer, and SIGIO (plain and F_SETSIG) from a pipe it owns: each must reach the handler
    let body = "import signal, threading, time\n\
got = []\n\
for s in (signal.SIGUSR1, signal.SIGALRM, signal.SIGIO):\n    signal.signal(s, lambda s, f: got.append(s))\n\
me = os.getpid()\n\
info = ctypes.create_string_buffer(struct.pack('iii', signal.SIGUSR1, 0, -1), 128)\n\
def from_thread():\n    t = threading.Thread(target=signal.pthread_kill, args=(threading.main_thread().ident, signal.SIGUSR1))\n    t.start()\n    t.join()\n\
def sigio(sig):\n    r, w = os.pipe()\n    libc.fcntl(r, 8, me)\n    libc.fcntl(r, 10, sig)\n    libc.fcntl(r, 4, libc.fcntl(r, 3) | 0o20000)\n    os.write(w, b'x')\n\
steps = [\n\
    ('raise', lambda: signal.raise_signal(signal.SIGUSR1)),\n\
    ('kill', lambda: libc.kill(me, signal.SIGUSR1)),\n\
    ('group', lambda: libc.kill(0, signal.SIGUSR1)),\n\
    ('pgid', lambda: libc.kill(-os.getpgid(0), signal.SIGUSR1)),\n\
    ('pthread_kill', lambda: signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)),\n\
    ('thread', from_thread),\n\
    ('sigqueue', lambda: libc.syscall(SYS['rt_sigqueueinfo'], me, signal.SIGUSR1, info)),\n\
    ('alarm', lambda: signal.setitimer(signal.ITIMER_REAL, 0.01)),\n\
    ('sigio', lambda: sigio(0)),\n\
    ('setsig', lambda: sigio(signal.SIGUSR1)),\n\
]\n\
out = []\n\
for name, f in steps:\n    n = len(got)\n    f()\n    end = time.time() + 1\n    \
while len(got) == n and time.time() < end:\n        time.sleep(0.01)\n    out.append(name if len(got) > n else name + ':missed')\n\
print(' '.join(out))\n";
    let want = "raise kill group pgid pthread_kill thread sigqueue alarm sigio setsig";
    for sandbox in [common::sandbox(), common::bare_sandbox()] {
        let g = grade_in(sandbox, &errno_probe(body), &stdin("", want), &short());
        assert_verdict(&g, Verdict::Accepted);
    }
}

/// Mode, owner, size and modification time of each path.
fn stamps(paths: &[std::path::PathBuf]) -> Vec<(u32, u32, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    paths
        .iter()
        .map(|p| {
            let m = std::fs::symlink_metadata(p).unwrap();
            (m.mode(), m.uid(), m.size(), m.mtime(), m.mtime_nsec())
        })
        .collect()
}

/// A normal program run on every slot (`2 × slots` tests, none stopping the others): each must
/// pass and find its scratch directory empty.
fn assert_slots_work(sandbox: &Sandbox) {
    let code =
        "import os\nopen('mine', 'w').write(input())\nprint(os.listdir('.'), open('mine').read())";
    let tests = vec![stdin("kiln\n", "['mine'] kiln").remove(0); 2 * sandbox.slots()];
    let limits = Limits {
        stop_at_first_failure: false,
        ..Limits::default()
    };
    let g = grade_in(sandbox, code, &tests, &limits);
    assert_verdict(&g, Verdict::Accepted);
    assert_eq!(g.passed, tests.len(), "{g:#?}");
}

/// Changing the harness directory (named in `sys.argv[1]`) or the scratch directory so that later
/// runs fail: chmod, utime and truncation by every system call, then directories the slot's
/// cleanup cannot read. Prints one word per attempt.
const POISON: &str = "h = sys.argv[1].encode()\n\
f = h + b'/kiln_lcb.py'\n\
fd = os.open(f, os.O_RDONLY)\n\
out = [\n\
    rc(libc.chmod(h, 0)), rc(libc.chmod(f, 0)), rc(libc.fchmod(fd, 0)),\n\
    rc(libc.syscall(SYS['fchmodat'], -100, h, 0, 0)), rc(libc.syscall(SYS['fchmodat2'], -100, h, 0, 0)),\n\
    rc(libc.utimes(f, None)), rc(libc.futimens(fd, None)),\n\
    rc(libc.syscall(SYS['utimensat'], -100, h, None, 0)),\n\
    rc(libc.truncate(f, 0)), rc(libc.open(f, os.O_RDONLY | os.O_TRUNC)),\n\
]\n\
os.mkdir('d')\n\
out += [rc(libc.chmod(b'd', 0)), rc(libc.chmod(b'.', 0))]\n\
os.mkdir('wx', 0o300)\n\
open('wx/f', 'w').write('x')\n\
os.mkdir('wx/none', 0)\n\
os.umask(0o777)\n\
os.mkdir('none')\n\
print(' '.join(out))\n";

/// A sandbox that cannot set a run up even after rebuilding (here its directory replaced by a
/// file) fails the grading with its error; no program is given a verdict for it.
#[test]
fn a_broken_sandbox_is_an_error_never_a_programs_verdict() {
    let _alone = common::exclusive();
    let sandbox = Sandbox::new(kiln_sandbox::SandboxOptions {
        slots: 1,
        uid_base: 2_000_000_800,
        ..kiln_sandbox::SandboxOptions::default()
    })
    .unwrap();
    let tests = stdin("", "ok");
    let g = sandbox.grade("print('ok')", &tests, &short()).unwrap();
    assert_verdict(&g, Verdict::Accepted);
    let dir = sandbox.directory().to_path_buf();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, "not a directory").unwrap();
    let jobs: Vec<(&str, &[TestCase])> = vec![("print('ok')", &tests); 3];
    let err = sandbox
        .grade_many(&jobs, &short())
        .expect_err("graded in a sandbox whose directory is a file");
    assert!(err.to_string().contains(&*dir.to_string_lossy()), "{err}");
    std::fs::remove_file(&dir).unwrap();
}

#[test]
fn poisoning_the_harness_or_the_scratch_directory_is_denied_and_slots_stay_usable() {
    let _alone = common::exclusive();
    for sandbox in [common::bare_sandbox(), common::sandbox()] {
        let dir = sandbox.directory().join("harness");
        let paths = [dir.clone(), dir.join("kiln_lcb.py")];
        let before = stamps(&paths);
        let tests = vec![stdin("", &["denied"; 12].join(" ")).remove(0); 2 * sandbox.slots()];
        let limits = Limits {
            stop_at_first_failure: false,
            ..short()
        };
        let g = grade_in(sandbox, &errno_probe(POISON), &tests, &limits);
        assert_verdict(&g, Verdict::Accepted);
        assert_eq!(stamps(&paths), before, "the harness changed");
        assert_slots_work(sandbox);
    }
}

#[test]
fn a_harness_or_slot_changed_behind_the_sandbox_is_rebuilt() {
    use std::os::unix::fs::PermissionsExt;
    // what a program that got around the filters could have done: the next ones still pass
    let _alone = common::exclusive();
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    };
    for sandbox in [common::bare_sandbox(), common::sandbox()] {
        let dir = sandbox.directory().join("harness");
        let file = dir.join("kiln_lcb.py");
        let source = std::fs::read(&file).unwrap();
        mode(&dir, 0);
        assert_slots_work(sandbox);
        std::fs::write(&file, "raise SystemExit(3)\n").unwrap();
        assert_slots_work(sandbox);
        assert_eq!(std::fs::read(&file).unwrap(), source);
        let old = std::fs::FileTimes::new().set_modified(std::time::UNIX_EPOCH);
        std::fs::File::options()
            .append(true)
            .open(&file)
            .unwrap()
            .set_times(old)
            .unwrap();
        assert_slots_work(sandbox);
    }
    // plain scratch directories left unreadable, not empty, and (as root) owned by root
    let sandbox = common::bare_sandbox();
    for i in 0..sandbox.slots() {
        let slot = sandbox.directory().join(format!("slot{i}"));
        let sub = slot.join("locked");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("f"), "x").unwrap();
        mode(&sub, 0);
        mode(&slot, 0);
        std::os::unix::fs::chown(&slot, Some(0), Some(0)).ok();
    }
    assert_slots_work(sandbox);
}
