//! cgroup memory and process-count limits, one group per slot, under kiln's own cgroup.
//! cgroup v1 (separate `memory` and `pids` hierarchies) and v2 (a delegated subtree with the
//! `memory` and `pids` controllers enabled) are handled; elsewhere the layer is off.
//!
//! The memory limit catches what `RLIMIT_DATA` does not count (shared mappings, tmpfs pages,
//! stacks); the kernel then kills the program (counted via `oom_kill`, verdict memory_limit).

use std::fs;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// Which cgroup version is mounted and where kiln's groups go.
#[derive(Debug, Clone)]
pub(crate) enum Hierarchy {
    V1 { memory: PathBuf, pids: PathBuf },
    V2 { base: PathBuf },
}

/// Finds a writable place for kiln's groups, or says why there is none.
pub(crate) fn hierarchy() -> Result<Hierarchy, String> {
    let own =
        fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let root = Path::new("/sys/fs/cgroup");
    let v1 = |controller: &str| {
        own.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
            ctrls
                .split(',')
                .any(|c| c == controller)
                .then(|| root.join(controller).join(path.trim_start_matches('/')))
        })
    };
    if let (Some(memory), Some(pids)) = (v1("memory"), v1("pids")) {
        for d in [&memory, &pids] {
            if !d.join("cgroup.procs").exists() {
                return Err(format!("cgroup v1: {} is not mounted", d.display()));
            }
        }
        return Ok(Hierarchy::V1 { memory, pids });
    }
    let path = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("no cgroup v1 memory/pids hierarchy and no cgroup v2")?;
    let base = root.join(path.trim_start_matches('/'));
    let ctrl = fs::read_to_string(base.join("cgroup.subtree_control")).unwrap_or_default();
    if !(ctrl.split_whitespace().any(|c| c == "memory")
        && ctrl.split_whitespace().any(|c| c == "pids"))
    {
        // (a cgroup that holds processes cannot enable controllers for its children; kiln does not
        // move itself into a child group to make room for its slots' groups)
        return Err(format!(
            "cgroup v2: {} does not enable memory and pids for its child groups (its \
             cgroup.subtree_control lacks them; kiln's slots would need groups there); memory and \
             tasks are left to the rlimits",
            base.display()
        ));
    }
    Ok(Hierarchy::V2 { base })
}

/// Removes the groups of sandboxes whose process is gone (they were never dropped).
pub(crate) fn remove_stale(h: &Hierarchy) {
    let bases: Vec<&PathBuf> = match h {
        Hierarchy::V1 { memory, pids } => vec![memory, pids],
        Hierarchy::V2 { base } => vec![base],
    };
    for base in bases {
        for entry in fs::read_dir(base).into_iter().flatten().flatten() {
            if crate::sandbox::stale_owner(&entry.file_name().to_string_lossy()).is_some() {
                let _ = fs::remove_dir(entry.path());
            }
        }
    }
}

/// The groups of one slot. Dropping removes them.
#[derive(Debug)]
pub(crate) struct SlotGroup {
    /// Group directories, removed (innermost first) on drop.
    dirs: Vec<PathBuf>,
    /// The files the child writes "0" into to join: v1 `tasks` (moving only the calling thread —
    /// the whole child right after fork — skips the global threadgroup lock, whose RCU grace
    /// period costs ~10 ms per move via `cgroup.procs`), v2 `cgroup.procs`.
    procs: Vec<OwnedFd>,
    /// Where the memory limit goes.
    limit_file: PathBuf,
    /// Where the `oom_kill` counter is read.
    events_file: PathBuf,
}

impl SlotGroup {
    /// Creates the groups `<name>` (a flat name, unique to this sandbox and slot) with a limit
    /// on the number of tasks (threads included).
    pub(crate) fn create(h: &Hierarchy, name: &str, max_tasks: u64) -> Result<Self, String> {
        let mk = |dir: PathBuf| -> Result<PathBuf, String> {
            fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            Ok(dir)
        };
        let mut g = match h {
            Hierarchy::V1 { memory, pids } => {
                let m = mk(memory.join(name))?;
                let p = mk(pids.join(name))?;
                Self {
                    limit_file: m.join("memory.limit_in_bytes"),
                    events_file: m.join("memory.oom_control"),
                    dirs: vec![m, p],
                    procs: vec![],
                }
            }
            Hierarchy::V2 { base } => {
                let d = mk(base.join(name))?;
                let _ = write(&d.join("memory.swap.max"), "0");
                Self {
                    limit_file: d.join("memory.max"),
                    events_file: d.join("memory.events"),
                    dirs: vec![d],
                    procs: vec![],
                }
            }
        };
        let pids_dir = g.dirs.last().expect("a group").clone();
        write(&pids_dir.join("pids.max"), &max_tasks.to_string())?;
        let join = if matches!(h, Hierarchy::V1 { .. }) {
            "tasks"
        } else {
            "cgroup.procs"
        };
        for d in &g.dirs {
            let f = fs::OpenOptions::new()
                .write(true)
                .open(d.join(join))
                .map_err(|e| format!("{}: {e}", d.display()))?;
            g.procs.push(f.into());
        }
        Ok(g)
    }

    /// Sets the memory limit (bytes).
    pub(crate) fn set_memory(&self, bytes: u64) -> Result<(), String> {
        write(&self.limit_file, &bytes.to_string())
    }

    /// How many times the kernel's OOM killer fired in this group so far.
    pub(crate) fn oom_kills(&self) -> u64 {
        let text = fs::read_to_string(&self.events_file).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Kills every process in the group, until none is listed (at most 100 rounds).
    pub(crate) fn kill_all(&self) {
        for _ in 0..100 {
            let mut any = false;
            for d in &self.dirs {
                let list = fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                for pid in list
                    .lines()
                    .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
                {
                    any = true;
                    // SAFETY: a signal to a process of this slot's group.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            if !any {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Descriptors of the `cgroup.procs` files (the child joins by writing "0").
    pub(crate) fn procs_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }
}

impl Drop for SlotGroup {
    fn drop(&mut self) {
        self.procs.clear();
        for d in &self.dirs {
            let _ = fs::remove_dir(d);
        }
    }
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|e| format!("{}: {e}", path.display()))
}
