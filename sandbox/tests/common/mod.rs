//! Shared helpers of the sandbox tests.
#![allow(dead_code)]

use std::sync::OnceLock;

use kiln_sandbox::{Sandbox, SandboxOptions};

/// One sandbox per test binary (the probe takes a few hundred milliseconds).
pub fn sandbox() -> &'static Sandbox {
    static S: OnceLock<Sandbox> = OnceLock::new();
    S.get_or_init(|| {
        Sandbox::new(SandboxOptions {
            slots: 2,
            ..SandboxOptions::default()
        })
        .unwrap_or_else(|e| {
            panic!(
                "cannot set up the sandbox: {e}\nThese tests need Python 3.9+ as `python3` (e.g. \
                 `apt-get install python3`) and a Linux kernel with Landlock and seccomp."
            )
        })
    })
}

/// The uid base of [`bare_sandbox`] (its slots must not share uids with [`sandbox`]'s).
pub const BARE_UID_BASE: u32 = 2_000_000_100;

/// A second sandbox with Landlock and the private tmpfs left off: seccomp's filters (signals
/// among them, which Landlock's signal scope would otherwise also stop) and the plain scratch
/// directory are tested on their own, as on kernels without those. (Without Landlock nothing
/// contains file reads and writes outside the scratch, so only unsafe mode sets it up.)
pub fn bare_sandbox() -> &'static Sandbox {
    static S: OnceLock<Sandbox> = OnceLock::new();
    S.get_or_init(|| {
        let s = Sandbox::new(SandboxOptions {
            allow_unsafe: true,
            slots: 2,
            uid_base: BARE_UID_BASE,
            skip_layers: vec!["landlock".into(), "scratch".into()],
            ..SandboxOptions::default()
        })
        .unwrap_or_else(|e| panic!("cannot set up the sandbox without Landlock: {e}"));
        let p = s.protections();
        assert!(!p.landlock.active && !p.scratch.active, "{p}");
        s
    })
}

/// The uid base of [`fallback_sandbox`].
pub const FALLBACK_UID_BASE: u32 = 2_000_000_200;

/// A sandbox without the uid drop, the cgroup, the user namespace (so no network namespace) and
/// the private tmpfs: as root, a run stays root (capabilities dropped) with its scratch a plain
/// directory; unprivileged, a run shares kiln's uid. What bounds resources there is the fallback
/// alone (Landlock and seccomp stay on). (As root nothing bounds its tasks, so only unsafe mode
/// sets it up.)
pub fn fallback_sandbox() -> &'static Sandbox {
    static S: OnceLock<Sandbox> = OnceLock::new();
    S.get_or_init(|| {
        let skip = ["uid", "cgroup", "user_namespace", "scratch"];
        let s = Sandbox::new(SandboxOptions {
            allow_unsafe: is_root(),
            slots: 2,
            uid_base: FALLBACK_UID_BASE,
            skip_layers: skip.iter().map(|l| l.to_string()).collect(),
            ..SandboxOptions::default()
        })
        .unwrap_or_else(|e| panic!("cannot set up the sandbox without uid, cgroup, userns: {e}"));
        let p = s.protections();
        assert!(
            !p.uid.active && !p.cgroup.active && !p.user_namespace.active && !p.scratch.active,
            "{p}"
        );
        s
    })
}

/// The uid base of [`no_seccomp_sandbox`].
pub const NO_SECCOMP_UID_BASE: u32 = 2_000_000_300;

/// A sandbox without seccomp and the cgroup (Landlock confines it): memory that seccomp and the
/// cgroup would bound is left to the rlimits. Only unsafe mode sets it up: nothing but seccomp
/// keeps a run off unix sockets by path (and unprivileged nothing finds what a fork left; below
/// Landlock ABI 6 nothing keeps its signals in).
pub fn no_seccomp_sandbox() -> &'static Sandbox {
    static S: OnceLock<Sandbox> = OnceLock::new();
    S.get_or_init(|| {
        let s = Sandbox::new(SandboxOptions {
            allow_unsafe: true,
            slots: 1,
            uid_base: NO_SECCOMP_UID_BASE,
            skip_layers: vec!["seccomp".into(), "cgroup".into()],
            ..SandboxOptions::default()
        })
        .unwrap_or_else(|e| panic!("cannot set up the sandbox without seccomp: {e}"));
        let p = s.protections();
        assert!(!p.seccomp.active && !p.cgroup.active, "{p}");
        s
    })
}

/// Whether the tests run as root.
pub fn is_root() -> bool {
    // SAFETY: plain getter.
    unsafe { libc::geteuid() == 0 }
}

/// Whether a layer must be active here, from what the kernel and kiln's privileges allow
/// (on the development machine — root, Landlock ABI 7, cgroup v1 — all of them).
pub fn expect_layer(name: &str) -> bool {
    if !cfg!(target_os = "linux") {
        return matches!(name, "rlimits" | "process_group" | "clean_start");
    }
    // SAFETY: plain getter.
    let root = unsafe { libc::geteuid() } == 0;
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let userns = root
        || (read("/proc/sys/user/max_user_namespaces")
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
            > 0
            && read("/proc/sys/kernel/unprivileged_userns_clone").trim() != "0"
            && read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").trim() != "1");
    match name {
        "landlock" => landlock_abi() >= 1,
        "seccomp" => read("/proc/self/status").contains("Seccomp:"),
        "net_namespace" | "user_namespace" | "pid_namespace" | "scratch" => userns,
        "uid" => root,
        "cgroup" => root && std::path::Path::new("/sys/fs/cgroup/memory/tasks").exists(),
        _ => true,
    }
}

/// The kernel's Landlock ABI version (0 or less without Landlock).
pub fn landlock_abi() -> i64 {
    #[cfg(target_os = "linux")]
    // SAFETY: with a null attribute and size 0 this only returns the ABI version.
    return unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    #[cfg(not(target_os = "linux"))]
    0
}

/// Processes still running that belong to [`sandbox`] (their command line names its directory).
pub fn leftovers() -> Vec<String> {
    leftovers_of(sandbox())
}

/// Processes still running that belong to `sandbox`.
pub fn leftovers_of(sandbox: &Sandbox) -> Vec<String> {
    let marker = sandbox.directory().to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(&marker) {
            found.push(format!("{name}: {cmd}"));
        }
    }
    found
}

/// A unique name for files a test plants or checks.
pub fn unique(tag: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "kiln-test-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Serialises tests that check for leftover processes (tests of one binary run in parallel and
/// share the sandbox).
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
