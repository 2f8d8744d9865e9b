//! Each layer left off in turn (`--sandbox-without LAYER`), as on a kernel without it, and
//! Landlock at every older ABI: the sandbox either refuses, naming what nothing contains then, or
//! the layers left contain every hostile program here — no signal reaches a process outside, no
//! file outside is read or written, tasks, memory and disk stay bounded, no listener on the host
//! (TCP, UDP, unix by path or abstract) is reached, no other program runs, no other process's
//! environment is read, the harness cannot be changed and every slot keeps working, nothing
//! outlives a run.

use std::time::{Duration, Instant};

use kiln_sandbox::{Limits, SKIPPABLE_LAYERS, Sandbox, SandboxError, SandboxOptions, Verdict};

use super::{SIGNAL_OUT, assert_verdict, common, errno_probe, grade_in, probe, short, stdin};

/// Uid bases of the degraded sandboxes: `+ 10 · i` for the `i`-th layer left off.
const UID_BASE: u32 = 2_000_000_400;

/// `sleep 30` under `uid` (when kiln is root), leading its own process group.
fn sleeper(uid: Option<u32>) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut c = std::process::Command::new("sleep");
    c.arg("30").process_group(0);
    if let Some(u) = uid {
        c.uid(u).gid(u);
    }
    c.spawn().unwrap()
}

/// Signals out, every way, to a process under the run's own uid: it must live.
fn signals(sandbox: &Sandbox, run_uid: Option<u32>) {
    let mut target = sleeper(run_uid);
    let body = format!(
        "PIDS = [{}]\nTIOCSPGRP = {}\n{SIGNAL_OUT}",
        target.id(),
        libc::TIOCSPGRP
    );
    grade_in(sandbox, &errno_probe(&body), &stdin("", "-"), &short());
    let status = target.try_wait().unwrap();
    let _ = target.kill();
    let _ = target.wait();
    assert!(status.is_none(), "the target died: {status:?}");
}

/// A world-readable secret read, files written in world-writable directories: neither happens.
fn files(sandbox: &Sandbox) {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(common::unique("degraded"));
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = dir.join("secret.txt");
    std::fs::write(&secret, "hunter2").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let targets = [
        std::path::Path::new("/tmp").join(common::unique("tmp")),
        std::path::Path::new("/dev/shm").join(common::unique("shm")),
    ];
    let stamp = |p: &std::path::Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.permissions().mode(), m.modified().unwrap())
    };
    let before = stamp(&secret);
    let mut body = format!("print(attempt(lambda: print(open({secret:?}).read())))\n");
    for t in &targets {
        body += &format!("print(attempt(lambda: open({t:?}, 'w').write('x')))\n");
    }
    // modes and times, which Landlock does not govern (seccomp or the uid drop must), and
    // truncation, which Landlock governs from ABI 3
    // (through libc: LiveCodeBench's reliability_guard nulls os.chmod and friends)
    body += "def meta(v):\n    return 'denied' if v == -1 and ctypes.get_errno() in (1, 13) else 'allowed'\n";
    body += &format!("print(meta(libc.chmod(os.fsencode({secret:?}), 0o777)))\n");
    body += &format!("print(meta(libc.utimes(os.fsencode({secret:?}), None)))\n");
    body += &format!("print(meta(libc.truncate(os.fsencode({secret:?}), 0)))\n");
    let g = grade_in(
        sandbox,
        &probe(&body),
        &stdin("", "denied\ndenied\ndenied\ndenied\ndenied\ndenied"),
        &short(),
    );
    assert_eq!(stamp(&secret), before, "the secret's mode or time changed");
    let written: Vec<_> = targets.iter().filter(|t| t.exists()).collect();
    for t in &written {
        let _ = std::fs::remove_file(t);
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(written.is_empty(), "written: {written:?}");
    assert_verdict(&g, Verdict::Accepted);
}

/// Threads until one fails, then (all joined) processes until one fails (ctypes `fork`, each
/// child in a new session, its descriptors closed, sleeping): both bounded, and no child outlives
/// the run.
fn tasks(sandbox: &Sandbox) {
    let p = sandbox.protections();
    let most = if p.tasks.detail.contains("shared uid") {
        80
    } else {
        64
    };
    let code = format!(
        "import threading\nthreading.stack_size(1 << 16)\nstop = threading.Event()\nn = 0\n\
         ts = []\n\
         try:\n    while n < 3000:\n        t = threading.Thread(target=stop.wait)\n        t.start()\n        ts.append(t)\n        n += 1\n\
         except RuntimeError:\n    pass\nstop.set()\nfor t in ts:\n    t.join()\n\
         forks = 0\n\
         for _ in range(300):\n    pid = libc.fork()\n    if pid == 0:\n        os.closerange(0, 1024)\n        libc.setsid()\n        \
         libc.sleep(30)\n        os._exit(0)\n    if pid < 0:\n        break\n    forks += 1\n\
         print('bounded' if n < {most} and forks < {most} else 'unbounded %d %d' % (n, forks))"
    );
    let limits = Limits {
        per_test: Duration::from_secs(4),
        ..short()
    };
    let g = grade_in(sandbox, &probe(&code), &stdin("", "bounded"), &limits);
    assert_verdict(&g, Verdict::Accepted);
}

/// Private and shared memory past the limit, and a disk filled by writes and by `fallocate`.
fn memory_and_disk(sandbox: &Sandbox) {
    let hog = "a = []\nwhile True:\n    a.append(' ' * 10**7)";
    assert_verdict(
        &grade_in(sandbox, hog, &stdin("", "1"), &short()),
        Verdict::MemoryLimit,
    );
    let shared = "import mmap\nn = 3 << 30\nm = mmap.mmap(-1, n, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)\n\
                  for i in range(0, n, 4096):\n    m[i] = 1";
    assert_verdict(
        &grade_in(sandbox, shared, &stdin("", "1"), &short()),
        Verdict::MemoryLimit,
    );
    let before = super::bounds::free_bytes();
    let fill = "import ctypes\nlibc = ctypes.CDLL(None)\nfd = os.open('big', os.O_WRONLY | os.O_CREAT)\n\
                libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(64 << 30))\n\
                i = 0\nwhile True:\n    open('f%d' % i, 'wb').write(b'x' * (1 << 20))\n    i += 1";
    let g = grade_in(
        sandbox,
        &format!("import os\n{fill}"),
        &stdin("", "1"),
        &short(),
    );
    let after = super::bounds::free_bytes();
    assert_verdict(&g, Verdict::RuntimeError);
    assert!(
        after + (160 << 20) > before,
        "free space fell from {before} to {after}"
    );
}

/// TCP and UDP to listeners on 127.0.0.1, a world-writable unix socket by its path and an
/// abstract one in kiln's network namespace: each attempt fails and no listener sees anything.
fn network(sandbox: &Sandbox) {
    use std::net::{TcpListener, UdpSocket};
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let dir = std::env::temp_dir().join(common::unique("degraded-unix"));
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.join("s.sock");
    let unix = UnixListener::bind(&path).unwrap();
    unix.set_nonblocking(true).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    let name = common::unique("degraded-abstract");
    let abstract_unix = UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    abstract_unix.set_nonblocking(true).unwrap();
    let (tp, up) = (tcp.local_addr().unwrap().port(), udp.local_addr().unwrap().port());
    let body = format!(
        "import socket\n\
         def tcp():\n    s = socket.create_connection(('127.0.0.1', {tp}), timeout=1)\n    s.sendall(b'x')\n\
         def udp():\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    s.sendto(b'x', ('127.0.0.1', {up}))\n\
         def unix(address):\n    s = socket.socket(socket.AF_UNIX)\n    s.connect(address)\n    s.sendall(b'x')\n\
         print(attempt(tcp), attempt(udp), attempt(lambda: unix({path:?})), attempt(lambda: unix('\\0{name}')))\n"
    );
    let g = grade_in(sandbox, &probe(&body), &stdin("", "denied denied denied denied"), &short());
    let mut buf = [0u8; 16];
    let seen = [
        ("TCP", tcp.accept().is_ok()),
        ("UDP", udp.recv_from(&mut buf).is_ok()),
        ("unix", unix.accept().is_ok()),
        ("abstract unix", abstract_unix.accept().is_ok()),
    ];
    std::fs::remove_dir_all(&dir).unwrap();
    let seen: Vec<_> = seen.iter().filter(|(_, s)| *s).map(|(n, _)| *n).collect();
    assert!(seen.is_empty(), "a listener on the host was reached: {seen:?}\n{g:#?}");
    assert_verdict(&g, Verdict::Accepted);
}

/// Another program run (a shell, by `execv` and by `posix_spawn`) to write a file in the
/// world-writable temporary directory: refused, nothing written.
fn exec(sandbox: &Sandbox) {
    let target = std::path::Path::new("/tmp").join(common::unique("exec"));
    let script = format!("echo x > {}", target.display());
    let body = format!(
        "print(attempt(lambda: os.execv('/bin/sh', ['sh', '-c', {script:?}])))\n\
         print(attempt(lambda: os.waitpid(os.posix_spawn('/bin/sh', ['sh', '-c', {script:?}], {{}}), 0)))\n"
    );
    let g = grade_in(sandbox, &probe(&body), &stdin("", "denied\ndenied"), &short());
    let written = target.exists();
    let _ = std::fs::remove_file(&target);
    assert!(!written, "a shell ran and wrote {}", target.display());
    assert_verdict(&g, Verdict::Accepted);
}

/// kiln's environment and a sibling's (holding a secret) through `/proc`: unreadable.
fn secrets(sandbox: &Sandbox) {
    let mut sibling = std::process::Command::new("sleep").arg("30").env("KILN_TEST_SECRET", "hunter2").spawn().unwrap();
    let body = format!(
        "print(attempt(lambda: open('/proc/%d/environ' % os.getppid(), 'rb').read()))\n\
         print(attempt(lambda: open('/proc/{}/environ', 'rb').read()))\n",
        sibling.id()
    );
    let g = grade_in(sandbox, &probe(&body), &stdin("", "denied\ndenied"), &short());
    sibling.kill().unwrap();
    sibling.wait().unwrap();
    assert_verdict(&g, Verdict::Accepted);
}

/// The harness and scratch directories changed so that later runs would fail: refused, the
/// harness unchanged, and every slot still works.
fn poisoning(sandbox: &Sandbox) {
    let dir = sandbox.directory().join("harness");
    let paths = [dir.clone(), dir.join("kiln_lcb.py")];
    let before = super::stamps(&paths);
    let limits = Limits {
        stop_at_first_failure: false,
        ..short()
    };
    let g = grade_in(sandbox, &errno_probe(super::POISON), &stdin("", &["denied"; 12].join(" ")), &limits);
    assert_eq!(super::stamps(&paths), before, "the harness changed");
    super::assert_slots_work(sandbox);
    assert_verdict(&g, Verdict::Accepted);
}

/// Every hostile program of the degraded passes, in `sandbox`.
fn contained(sandbox: &Sandbox, run_uid: Option<u32>) {
    signals(sandbox, run_uid);
    files(sandbox);
    tasks(sandbox);
    memory_and_disk(sandbox);
    network(sandbox);
    exec(sandbox);
    secrets(sandbox);
    poisoning(sandbox);
}

#[test]
fn each_layer_left_off_is_contained_by_the_others_or_refused() {
    let _alone = common::exclusive();
    let mut report = Vec::new();
    for (i, layer) in SKIPPABLE_LAYERS.iter().enumerate() {
        let t = Instant::now();
        let uid_base = UID_BASE + 10 * i as u32;
        let made = Sandbox::new(SandboxOptions {
            slots: 1,
            uid_base,
            skip_layers: vec![layer.to_string()],
            ..SandboxOptions::default()
        });
        let sandbox = match made {
            Err(SandboxError::Unconfined(why)) => {
                // refused: what it names needs the layer left off
                let (needs, left_off) = why.split_once(" (left off on request: ").unwrap();
                assert!(
                    left_off.starts_with(layer) && needs.contains(layer),
                    "{why}"
                );
                report.push(format!("{layer}: refused in {:?}", t.elapsed()));
                continue;
            }
            Err(e) => panic!("without {layer}: {e}"),
            Ok(s) => s,
        };
        // nothing contains file reads and writes outside the scratch but Landlock
        assert_ne!(*layer, "landlock", "set up without Landlock");
        let p = sandbox.protections();
        assert!(p.confined() && !p.unsafe_mode, "{p}");
        assert_eq!(p.skipped, [layer.to_string()], "{p}");
        let (_, off) = p.layers().into_iter().find(|(n, _)| n == layer).unwrap();
        assert!(
            !off.active && off.detail.contains("left off on request"),
            "{p}"
        );
        contained(&sandbox, sandbox.slot_uids().first().copied());
        report.push(format!("{layer}: contained in {:?}", t.elapsed()));
    }
    println!("{}", report.join("\n"));
}

/// Landlock as older kernels enforce it (`landlock_abi`, ABI 1 up to this kernel's): with every
/// other layer the core hostile programs are contained at each ABI, and the probe reports the
/// rights it tried (truncation from ABI 3) as the capped ruleset enforced them; with seccomp left
/// off too, contained by what is left or refused for what needs seccomp.
#[test]
fn older_landlock_abis_are_contained_by_the_others_or_refused() {
    let _alone = common::exclusive();
    let kernel = common::landlock_abi();
    assert!(kernel >= 1, "this test needs a kernel with Landlock");
    let mut report = Vec::new();
    for abi in 1..=kernel.min(6) as u32 {
        for skip in [&[][..], &["seccomp"][..]] {
            let t = Instant::now();
            let made = Sandbox::new(SandboxOptions {
                slots: 1,
                uid_base: UID_BASE + 100 + abi,
                skip_layers: skip.iter().map(|l| l.to_string()).collect(),
                landlock_abi: Some(abi),
                ..SandboxOptions::default()
            });
            let sandbox = match made {
                Err(SandboxError::Unconfined(why)) if !skip.is_empty() => {
                    assert!(why.contains("seccomp"), "ABI {abi} without seccomp: {why}");
                    report.push(format!("ABI {abi} {skip:?}: refused in {:?}", t.elapsed()));
                    continue;
                }
                Err(e) => panic!("ABI {abi} {skip:?}: {e}"),
                Ok(s) => s,
            };
            let p = sandbox.protections();
            assert!(p.confined() && !p.unsafe_mode, "{p}");
            let detail = &p.landlock.detail;
            assert!(detail.starts_with(&format!("ABI {abi}:")), "{p}");
            assert_eq!(detail.contains("on request"), i64::from(abi) < kernel, "{p}");
            let truncation = if abi >= 3 {
                "no truncation outside scratch (tried)"
            } else {
                "no truncation outside scratch (ABI 3, kernel 6.2: tried, allowed)"
            };
            assert!(detail.contains(truncation), "{p}");
            let tcp = if abi >= 4 {
                "no TCP bind or connect (tried)"
            } else {
                "no TCP bind or connect (ABI 4, kernel 6.7: tried, allowed)"
            };
            let abstract_unix = if abi >= 6 {
                "no abstract unix sockets out (tried)"
            } else {
                "no abstract unix sockets out (ABI 6, kernel 6.12: tried, allowed)"
            };
            assert!(detail.contains(tcp) && detail.contains(abstract_unix), "{p}");
            contained(&sandbox, sandbox.slot_uids().first().copied());
            report.push(format!("ABI {abi} {skip:?}: contained in {:?}", t.elapsed()));
        }
    }
    println!("{}", report.join("\n"));
}

/// Settings met on real machines, several layers missing at once: a user on a distribution that
/// forbids unprivileged user namespaces (Ubuntu 24.04's default) on kernels with Landlock ABI 1
/// to 5 (run as `nobody` by the unprivileged pass, this is that user: no namespaces, no uid
/// drop, a plain scratch directory), and root in a container that allows no mounts, network or
/// PID namespaces and no cgroup of its own (the uid drop stays). Contained, or refused naming
/// what nothing contains.
#[test]
fn several_layers_missing_at_once_are_contained_or_refused() {
    let _alone = common::exclusive();
    let kernel = common::landlock_abi();
    assert!(kernel >= 1, "this test needs a kernel with Landlock");
    let mut settings: Vec<(String, Vec<&str>, Option<u32>)> = (1..=kernel.min(5) as u32)
        .map(|abi| (format!("no user namespaces, Landlock ABI {abi}"), vec!["user_namespace"], Some(abi)))
        .collect();
    settings.push((
        "no mounts, network or PID namespaces, no cgroup".into(),
        vec!["scratch", "net_namespace", "pid_namespace", "cgroup"],
        None,
    ));
    let mut report = Vec::new();
    for (i, (name, skip, abi)) in settings.iter().enumerate() {
        let t = Instant::now();
        let made = Sandbox::new(SandboxOptions {
            slots: 1,
            uid_base: UID_BASE + 200 + 10 * i as u32,
            skip_layers: skip.iter().map(|l| l.to_string()).collect(),
            landlock_abi: *abi,
            ..SandboxOptions::default()
        });
        let sandbox = match made {
            Err(SandboxError::Unconfined(why)) => {
                assert!(why.contains("left off on request"), "{name}: {why}");
                report.push(format!("{name}: refused ({why}) in {:?}", t.elapsed()));
                continue;
            }
            Err(e) => panic!("{name}: {e}"),
            Ok(s) => s,
        };
        let p = sandbox.protections();
        assert!(p.confined() && !p.unsafe_mode, "{name}: {p}");
        for layer in skip {
            let (_, off) = p.layers().into_iter().find(|(n, _)| n == layer).unwrap();
            assert!(!off.active, "{name}: {layer} is on\n{p}");
        }
        contained(&sandbox, sandbox.slot_uids().first().copied());
        report.push(format!("{name}: contained in {:?}", t.elapsed()));
    }
    println!("{}", report.join("\n"));
}
