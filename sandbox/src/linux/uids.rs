//! The slots' uids, reserved against other kiln processes on the machine. As root every slot runs
//! under a uid of its own, and after a run whatever is left under that uid is killed
//! (`kill(-1)` from a helper under it, [`super::sweep`]); two kiln processes with the same slot
//! uids (two evaluations at once, or evaluation shards on one node) would kill each other's
//! runs. Each uid is held by an exclusive `flock` on a lock file for the life of the sandbox; a
//! uid another process holds is skipped. The kernel drops the locks when a process dies, so a
//! crash never strands a uid.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::SandboxError;

/// How many uids past the base are tried before giving up.
const SEARCH: u32 = 1 << 16;

/// The uids a sandbox's slots run under, and the locks that reserve them.
pub(crate) struct UidLease {
    pub uids: Vec<u32>,
    _locks: Vec<File>,
}

/// Where the lock files live: `/run/lock` (a tmpfs only root and lock-taking programs write),
/// else `/tmp`; the same directory for every kiln process whatever its `TMPDIR`.
fn lock_dir() -> PathBuf {
    let run_lock = Path::new("/run/lock");
    if run_lock.is_dir() { run_lock.into() } else { "/tmp".into() }
}

/// Reserves `n` uids from `base` up (not necessarily consecutive). Without root the uids are
/// never used (runs keep kiln's own), so nothing is locked.
pub(crate) fn reserve(base: u32, n: usize, is_root: bool) -> Result<UidLease, SandboxError> {
    if !is_root {
        return Ok(UidLease { uids: (0..n as u32).map(|i| base.saturating_add(i)).collect(), _locks: Vec::new() });
    }
    reserve_in(&lock_dir(), base, n)
}

fn reserve_in(dir: &Path, base: u32, n: usize) -> Result<UidLease, SandboxError> {
    let mut lease = UidLease { uids: Vec::with_capacity(n), _locks: Vec::with_capacity(n) };
    for uid in (0..SEARCH).filter_map(|i| base.checked_add(i)) {
        if lease.uids.len() == n {
            break;
        }
        if let Some(lock) = try_lock(&dir.join(format!("kiln-sandbox-uid-{uid}")))? {
            lease.uids.push(uid);
            lease._locks.push(lock);
        }
    }
    if lease.uids.len() < n {
        return Err(SandboxError::Spawn(format!(
            "no {n} free slot uids from {base}: other kiln processes hold the locks in {}",
            dir.display()
        )));
    }
    Ok(lease)
}

/// The lock on one uid's file, or `None` when another process holds it (or the path is not a
/// regular file of ours: a file planted there is skipped, never followed).
fn try_lock(path: &Path) -> Result<Option<File>, SandboxError> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        // a symlink (ELOOP) or a file another user planted in a sticky directory (EACCES)
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::EACCES | libc::ENXIO)) => return Ok(None),
        Err(e) => return Err(SandboxError::io(path, e)),
    };
    let meta = file.metadata().map_err(|e| SandboxError::io(path, e))?;
    // SAFETY: plain getter.
    if !meta.file_type().is_file() || meta.uid() != unsafe { libc::geteuid() } {
        return Ok(None);
    }
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Ok(None),
            _ => Err(SandboxError::io(path, e)),
        };
    }
    Ok(Some(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_leases_never_share_a_uid_and_a_dropped_one_is_free_again() {
        let dir = std::env::temp_dir().join(format!("kiln-uid-locks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = reserve_in(&dir, 5000, 3).unwrap();
        let b = reserve_in(&dir, 5000, 2).unwrap();
        assert_eq!(a.uids, [5000, 5001, 5002]);
        assert_eq!(b.uids, [5003, 5004], "the second sandbox skips the first's uids");
        drop(a);
        let c = reserve_in(&dir, 5000, 4).unwrap();
        assert_eq!(c.uids, [5000, 5001, 5002, 5005], "released uids are taken again");
        // a symlink planted where a lock file would be is skipped, not followed
        std::os::unix::fs::symlink("/etc/hostname", dir.join("kiln-sandbox-uid-6000")).unwrap();
        let d = reserve_in(&dir, 6000, 1).unwrap();
        assert_eq!(d.uids, [6001]);
        drop((b, c, d));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn too_few_free_uids_is_an_error_naming_the_directory() {
        let dir = std::env::temp_dir().join(format!("kiln-uid-locks-full-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let held = reserve_in(&dir, u32::MAX - 2, 3).unwrap();
        let err = reserve_in(&dir, u32::MAX - 2, 1).err().expect("no uid left");
        assert!(err.to_string().contains(&dir.display().to_string()), "{err}");
        drop(held);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
