//! The bound on a run's tasks (processes and threads). `RLIMIT_NPROC` counts the tasks of the
//! caller's real uid, and where it is counted decides what it bounds:
//!
//! - under the slot's own uid (root drops to it): the run's tasks alone;
//! - in the run's own user namespace (kernel 5.14+ counts per namespace): the run's tasks alone,
//!   and the namespace's tasks also count against kiln's uid only up to that limit;
//! - otherwise kiln's uid is shared, so a run gets the uid's task count at its start plus its own
//!   allowance, capped below kiln's own soft limit: the uid never goes past that cap through
//!   sandboxed programs, and kiln — whose own, higher limit is what its thread starts are checked
//!   against — keeps [`KILN_RESERVE`] tasks of room below it.
//!
//! The host's real root is exempt from `RLIMIT_NPROC`: there only the cgroup's `pids.max` bounds
//! tasks (the probe says so).

use std::os::unix::fs::MetadataExt;

/// Tasks kept free for kiln below its own `RLIMIT_NPROC` when a run shares its uid.
pub(crate) const KILN_RESERVE: u64 = 64;

/// `RLIMIT_NPROC` for a run that shares kiln's uid: the uid's tasks now plus `tasks`, at most
/// kiln's soft limit minus [`KILN_RESERVE`].
pub(crate) fn shared_uid_limit(tasks: u64) -> u64 {
    // SAFETY: plain getter.
    let uid = unsafe { libc::getuid() };
    let mut own = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: getrlimit into a local.
    unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut own) };
    let cap = own.rlim_cur.saturating_sub(KILN_RESERVE);
    uid_tasks(uid).saturating_add(tasks).min(cap)
}

/// The tasks (threads) of processes whose real uid is `uid`, from `/proc` (0 where `/proc` cannot
/// be read: the run then gets `tasks` in all, fewer than it may need, never more). Processes
/// whose effective uid differs (set-uid programs) are not counted, which errs the same way.
fn uid_tasks(uid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut n = 0;
    for entry in dir.flatten() {
        let name = entry.file_name();
        if !name.as_encoded_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        if entry.metadata().ok().map(|m| m.uid()) != Some(uid) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        if field("Uid:") == Some(u64::from(uid)) {
            n += field("Threads:").unwrap_or(1);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_limit_counts_this_process_and_leaves_kiln_room() {
        let here = std::thread::spawn(|| shared_uid_limit(0)).join().unwrap();
        // this test binary alone has at least two threads
        assert!(here >= 2, "{here}");
        let mut own = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit into a local.
        unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut own) };
        assert!(shared_uid_limit(u64::MAX) <= own.rlim_cur.saturating_sub(KILN_RESERVE));
    }
}
