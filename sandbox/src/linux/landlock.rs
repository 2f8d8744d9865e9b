//! The Landlock ruleset (file system, TCP ports, signals and abstract unix sockets), built with
//! the `landlock` crate in the parent for every run. The child adds one rule — its scratch
//! directory, which is a tmpfs it mounts itself (a rule on the mount point would not reach into
//! the mount: Landlock skips hidden mount points) — and calls `landlock_restrict_self` right
//! before `execve`; three system calls, safe after fork.
//!
//! Allowed: reading the system library directories and the interpreter's own directories;
//! executing only the interpreter and its dynamic loader; reading and writing the run's scratch
//! directory; `/dev/null` (read/write), `/dev/zero`, `/dev/urandom`, `/etc/ld.so.cache`,
//! `/etc/localtime` (read). Denied: everything else — `/proc` (so no other process's environment
//! or memory), `/home`, `/root`, `/tmp`, `/etc` writes, truncation (ABI 3), any TCP bind or
//! connect (ABI 4), any signal to a process outside the run and connecting to abstract unix
//! sockets outside it (ABI 6, kernel 6.12). The ruleset is best effort: an older kernel enforces
//! what its ABI knows, and [`covers`] says which (the signal scope as the probe found it by
//! trying; seccomp keeps signals in on any kernel).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};

/// The newest ABI whose access rights kiln knows how to grant (newer kernels enforce it fully).
const TARGET: i64 = 6;

/// The Landlock ABI version of the running kernel; 0 or less when Landlock is unavailable.
pub(crate) fn kernel_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute and size 0 this only returns the version.
    unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    }
}

/// What the probe's Landlock trials showed, beyond reads and writes outside the scratch: each
/// `Some(denied)` when tried, `None` when the trial could not tell. TCP and abstract unix
/// sockets are tried in kiln's own network namespace, where nothing else refuses them first.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tried {
    pub signal_scope: bool,
    pub truncate: Option<bool>,
    pub tcp: Option<bool>,
    pub abstract_unix: Option<bool>,
}

/// What Landlock enforces here, in words (the probe's report): each right came with an ABI, and
/// what the kernel does not know is not enforced (the ruleset is best effort). Truncation, TCP
/// and signals out are reported as tried where the trial could tell.
pub(crate) fn covers(abi: i64, tried: Tried) -> String {
    let mut on = vec![
        "read-only system and interpreter paths, scratch read-write, no /proc, home or /tmp"
            .to_string(),
    ];
    let mut off = Vec::new();
    for (min, kernel, what, trial) in [
        (2, "5.19", "no links or renames across directories", None),
        (3, "6.2", "no truncation outside scratch", tried.truncate),
        (4, "6.7", "no TCP bind or connect", tried.tcp),
        (6, "6.12", "no abstract unix sockets out", tried.abstract_unix),
    ] {
        match trial {
            Some(true) => on.push(format!("{what} (tried)")),
            Some(false) => off.push(format!("{what} (ABI {min}, kernel {kernel}: tried, allowed)")),
            None if abi >= min => on.push(what.to_string()),
            None => off.push(format!("{what} (ABI {min}, kernel {kernel})")),
        }
    }
    if tried.signal_scope {
        on.push("no signals out (tried)".into());
    } else {
        off.push(
            "no signals out (ABI 6, kernel 6.12: a signal to a process outside the run reached it)"
                .into(),
        );
    }
    let mut s = format!("ABI {abi}: {}", on.join(", "));
    if !off.is_empty() {
        s += &format!("; not enforced by this kernel: {}", off.join(", "));
    }
    s
}

/// What one run may touch.
pub(crate) struct Paths {
    /// Directories readable (with everything beneath).
    pub read_dirs: Vec<PathBuf>,
    /// Single files readable.
    pub read_files: Vec<PathBuf>,
    /// Files that may be executed (and read).
    pub exec_files: Vec<PathBuf>,
    /// Device files readable and writable.
    pub rw_files: Vec<PathBuf>,
    /// The ABI whose rights are asked for: the kernel's, or lower on request
    /// (`SandboxOptions::landlock_abi`, as an older kernel would enforce).
    pub abi: i64,
}

/// The rights kiln asks for at `abi` (at most those of [`TARGET`]).
fn rights_abi(abi: i64) -> ABI {
    ABI::from(abi.clamp(0, TARGET) as i32)
}

/// The system directories every interpreter needs to read (those that exist).
pub(crate) fn system_read_dirs() -> Vec<PathBuf> {
    [
        "/usr",
        "/lib",
        "/lib64",
        "/lib32",
        "/libx32",
        "/bin",
        "/etc/ssl/certs",
    ]
    .iter()
    .map(PathBuf::from)
    .filter(|p| p.exists())
    .collect()
}

/// The access rights of the scratch directory (everything but execution), as the raw bits the
/// child passes to `landlock_add_rule`: only rights handled at `abi` (the kernel's or lower).
pub(crate) fn scratch_access(abi: i64) -> u64 {
    (AccessFs::from_all(rights_abi(abi)) & !AccessFs::Execute).bits()
}

/// Builds the ruleset (without the scratch rule) and returns its descriptor (close-on-exec).
pub(crate) fn ruleset(paths: &Paths) -> Result<OwnedFd, String> {
    let err = |e: landlock::RulesetError| e.to_string();
    let read_dir: BitFlags<AccessFs> = AccessFs::ReadFile | AccessFs::ReadDir;
    let target = rights_abi(paths.abi);
    let handled = AccessFs::from_all(target);
    let mut ruleset = Ruleset::default().handle_access(handled).map_err(err)?;
    // (an ABI without network rights or scopes has none to handle: an empty set is an error)
    let net = AccessNet::from_all(target);
    if !net.is_empty() {
        ruleset = ruleset.handle_access(net).map_err(err)?;
    }
    let scopes = Scope::from_all(target);
    if !scopes.is_empty() {
        ruleset = ruleset.scope(scopes).map_err(err)?;
    }
    let mut rs = ruleset.create().map_err(err)?;
    let mut rules: Vec<(&Path, BitFlags<AccessFs>)> = Vec::new();
    rules.extend(paths.read_dirs.iter().map(|d| (d.as_path(), read_dir)));
    rules.extend(
        paths
            .read_files
            .iter()
            .map(|f| (f.as_path(), AccessFs::ReadFile.into())),
    );
    rules.extend(
        paths
            .exec_files
            .iter()
            .map(|f| (f.as_path(), AccessFs::ReadFile | AccessFs::Execute)),
    );
    let rw_file = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate;
    rules.extend(paths.rw_files.iter().map(|f| (f.as_path(), rw_file)));
    for (path, access) in rules {
        let fd = PathFd::new(path).map_err(|e| format!("{}: {e}", path.display()))?;
        // only rights the ruleset handles (truncation from ABI 3)
        rs = rs.add_rule(PathBeneath::new(fd, access & handled)).map_err(err)?;
    }
    let fd: Option<OwnedFd> = rs.into();
    fd.ok_or_else(|| "the kernel does not support Landlock".to_string())
}

#[cfg(test)]
mod tests {
    use super::{Tried, covers};

    #[test]
    fn the_report_names_only_what_the_abi_enforces_or_the_trial_showed() {
        let untried = |signal_scope| Tried { signal_scope, ..Tried::default() };
        let old = covers(5, untried(false));
        let (on, off) = old.split_once("not enforced").unwrap();
        assert!(on.contains("no TCP") && !on.contains("signals"), "{old}");
        assert!(
            off.contains("no signals out") && off.contains("kernel 6.12"),
            "{old}"
        );
        let new = covers(7, untried(true));
        assert!(
            new.contains("no signals out (tried)") && !new.contains("not enforced"),
            "{new}"
        );
        // an ABI that should scope signals but did not when tried: said so
        let unscoped = covers(7, untried(false));
        let (on, off) = unscoped.split_once("not enforced").unwrap();
        assert!(
            !on.contains("signals") && off.contains("no signals out"),
            "{unscoped}"
        );
        assert!(covers(1, untried(false)).contains("not enforced by this kernel: no links"));
        // truncation and TCP as tried, whatever the ABI number says
        let tried = covers(7, Tried { signal_scope: true, truncate: Some(true), tcp: Some(false), abstract_unix: Some(false) });
        let (on, off) = tried.split_once("not enforced").unwrap();
        assert!(on.contains("no truncation outside scratch (tried)"), "{tried}");
        assert!(off.contains("no TCP bind or connect (ABI 4, kernel 6.7: tried, allowed)"), "{tried}");
        assert!(off.contains("no abstract unix sockets out (ABI 6, kernel 6.12: tried, allowed)"), "{tried}");
        let scoped = covers(5, Tried { abstract_unix: Some(true), ..untried(true) });
        assert!(scoped.split_once("not enforced").is_none() && scoped.contains("no abstract unix sockets out (tried)"), "{scoped}");
    }
}
