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
                 `apt-get install python3`) and a Linux kernel with Landlock or seccomp."
            )
        })
    })
}

/// Whether a layer must be active here: Linux, and for uid/cgroup, root.
pub fn expect_layer(name: &str) -> bool {
    if !cfg!(target_os = "linux") {
        return matches!(name, "rlimits" | "process_group" | "clean_start");
    }
    // SAFETY: plain getter.
    let root = unsafe { libc::geteuid() } == 0;
    match name {
        "uid" => root,
        "cgroup" => root && std::path::Path::new("/sys/fs/cgroup/memory").exists(),
        _ => true,
    }
}
