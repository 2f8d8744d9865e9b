//! The unprivileged pass: run as root (as CI does), this binary runs itself again — every test,
//! the degraded modes included — as `nobody` (uid/gid 65534, no groups) through `setpriv`, and
//! that run must pass. Run unprivileged, the test checks that it is.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::common;

/// Set in the re-executed run (so it does not start another).
const PASS: &str = "KILN_SANDBOX_UNPRIVILEGED_PASS";
/// The unprivileged user and group.
const NOBODY: u32 = 65534;

/// The effective capabilities of this process (`CapEff` in `/proc/self/status`).
fn effective_caps() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim();
    u64::from_str_radix(hex, 16).unwrap()
}

fn setpriv() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|d| d.join("setpriv"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "setpriv not found: install util-linux (`apt-get install util-linux`) so that the \
                 adversarial tests also run as an unprivileged user"
            )
        })
}

#[test]
fn the_adversarial_tests_pass_as_an_unprivileged_user() {
    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if std::env::var_os(PASS).is_some() || !common::is_root() {
        assert!(uid != 0 && gid != 0, "uid {uid}, gid {gid}");
        assert_eq!(effective_caps(), 0, "capabilities in an unprivileged run");
        println!(
            "running unprivileged (uid {uid}, gid {gid}, no capabilities): this is the unprivileged pass"
        );
        return;
    }
    // a copy that `nobody` can execute (the build directory may be under /root)
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(common::unique("unprivileged"));
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.join("adversarial");
    // copied by `cp`, so no fork of this process (the sandboxes of the tests running meanwhile)
    // holds it open for writing when it is executed ("Text file busy")
    let copied = Command::new("cp")
        .arg(std::env::current_exe().unwrap())
        .arg(&exe)
        .status()
        .unwrap();
    assert!(copied.success(), "cp: {copied}");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(setpriv())
        .args([
            format!("--reuid={NOBODY}"),
            format!("--regid={NOBODY}"),
            "--clear-groups".into(),
        ])
        .arg(&exe)
        .args(["--test-threads", "4"])
        .env(PASS, "1")
        .current_dir(&dir)
        .output()
        .unwrap();
    remove(&dir);
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = text.lines().rev().take(80).collect();
    let tail = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
    assert!(
        out.status.success(),
        "the unprivileged pass failed:\n{tail}"
    );
    let passed = text
        .lines()
        .find_map(|l| l.strip_prefix("test result: ok. "))
        .and_then(|l| l.split(' ').next()?.parse::<usize>().ok());
    assert!(passed.is_some_and(|n| n >= 28), "{tail}");
    assert!(
        text.contains("the_adversarial_tests_pass_as_an_unprivileged_user ... ok"),
        "{tail}"
    );
}

fn remove(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}
