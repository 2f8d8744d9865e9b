//! Which confinement layers are active, as found by the probe, and which of them contain each
//! property a run must be kept to ([`Containment`]). Output files record this.

use std::fmt;

use serde::Serialize;

/// One confinement layer: whether it is active, and what it does or why it is off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layer {
    pub active: bool,
    pub detail: String,
}

impl Layer {
    pub(crate) fn on(detail: impl Into<String>) -> Self {
        Self {
            active: true,
            detail: detail.into(),
        }
    }

    pub(crate) fn off(why: impl Into<String>) -> Self {
        Self {
            active: false,
            detail: why.into(),
        }
    }
}

/// The protections a [`Sandbox`](crate::Sandbox) runs programs under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Protections {
    /// The interpreter programs run with (the real binary, not a wrapper) and its version.
    pub python: String,
    /// True when the caller allowed running without file-system and syscall confinement.
    pub unsafe_mode: bool,
    /// CPU time, data size, stack, file size, open files, core dumps (and processes with a uid).
    pub rlimits: Layer,
    /// New session and process group, killed as a whole; killed when kiln dies.
    pub process_group: Layer,
    /// Empty environment, no inherited descriptors, `-I -S`.
    pub clean_start: Layer,
    /// A private size-limited tmpfs as the only writable directory (else a plain directory).
    pub scratch: Layer,
    /// Landlock: read-only system and interpreter paths, no network ports, no signals out (as far
    /// as the kernel's ABI goes; the detail says).
    pub landlock: Layer,
    /// seccomp: an allow-list of system calls (no sockets, processes, exec, ptrace, mounts,
    /// signals out, chmod or utime).
    pub seccomp: Layer,
    /// A network namespace with no interfaces.
    pub net_namespace: Layer,
    /// A user namespace.
    pub user_namespace: Layer,
    /// A PID namespace: the run sees and signals only its own processes, all killed when it ends.
    pub pid_namespace: Layer,
    /// An unprivileged uid/gid per slot (when kiln runs as root).
    pub uid: Layer,
    /// cgroup memory and process limits per slot.
    pub cgroup: Layer,
    /// No capabilities and `no_new_privs` (also when the run stays root).
    pub capabilities: Layer,
    /// The bound on a run's processes and threads, and its mechanism in this mode (off: none).
    pub tasks: Layer,
    /// What bounds a run's memory in this mode (private data, shared mappings, memfd).
    pub memory: Layer,
    /// What bounds a run's disk use in this mode (tmpfs, or a measured plain directory).
    pub disk: Layer,
    /// Layers left off on request (`--sandbox-without`), as if the kernel lacked them.
    pub skipped: Vec<String>,
    /// The working layers that contain each property (the refusal rule's input).
    pub containment: Containment,
}

/// What must be contained for kiln to run untrusted code: for each property, the working layers
/// that contain it here (empty: nothing does).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Containment {
    /// Signals (every path: kill, sigqueue, pidfds, SIGIO owners) to processes outside the run.
    pub signals: Vec<&'static str>,
    /// Reads and writes of files outside the scratch directory and the read-only system paths.
    pub filesystem: Vec<&'static str>,
    /// The number of processes and threads, and that none outlives its run.
    pub tasks: Vec<&'static str>,
    /// Memory, private and shared.
    pub memory: Vec<&'static str>,
    /// Disk space.
    pub disk: Vec<&'static str>,
    /// Connections out: TCP and UDP, unix sockets by path (which a network namespace does not
    /// separate) and abstract ones.
    pub network: Vec<&'static str>,
}

impl Containment {
    /// The properties, their containing layers and the layers that would contain them.
    pub fn properties(&self) -> [(&'static str, &[&'static str], &'static str); 6] {
        [
            (
                "signals out",
                &self.signals,
                "seccomp, or landlock with signal scoping (ABI 6, kernel 6.12), or pid_namespace",
            ),
            (
                "filesystem reads and writes outside the scratch",
                &self.filesystem,
                "landlock, with seccomp (no chmod, chown, utime or truncate by path) or uid (the \
                 run owns none of kiln's files): Landlock does not govern file modes and times",
            ),
            (
                "tasks",
                &self.tasks,
                "a bound: cgroup or uid as root, user_namespace, cgroup or RLIMIT_NPROC on \
                 kiln's uid unprivileged; and none left after a run: seccomp (no fork), cgroup, \
                 uid or pid_namespace",
            ),
            ("memory", &self.memory, "rlimits, cgroup, seccomp"),
            (
                "disk",
                &self.disk,
                "landlock with scratch (a private tmpfs), or with seccomp (no fallocate) over a \
                 measured plain directory",
            ),
            (
                "network and unix sockets out",
                &self.network,
                "seccomp (no sockets): an empty network namespace leaves unix sockets by path \
                 reachable, and Landlock governs neither those nor UDP",
            ),
        ]
    }

    /// What nothing contains, each with the layers that would: empty when all is contained.
    pub fn missing(&self) -> Vec<String> {
        self.properties()
            .iter()
            .filter(|(_, by, _)| by.is_empty())
            .map(|(what, _, needs)| format!("{what} (needs {needs})"))
            .collect()
    }
}

impl Protections {
    /// The layers by name, in a fixed order.
    pub fn layers(&self) -> [(&'static str, &Layer); 15] {
        [
            ("rlimits", &self.rlimits),
            ("process_group", &self.process_group),
            ("clean_start", &self.clean_start),
            ("scratch", &self.scratch),
            ("landlock", &self.landlock),
            ("seccomp", &self.seccomp),
            ("net_namespace", &self.net_namespace),
            ("user_namespace", &self.user_namespace),
            ("pid_namespace", &self.pid_namespace),
            ("uid", &self.uid),
            ("cgroup", &self.cgroup),
            ("capabilities", &self.capabilities),
            ("tasks", &self.tasks),
            ("memory", &self.memory),
            ("disk", &self.disk),
        ]
    }

    /// Whether every property of [`Containment`] is contained by a working layer.
    pub fn confined(&self) -> bool {
        self.containment.missing().is_empty()
    }

    /// One line: the names of the active layers.
    pub fn summary(&self) -> String {
        let on: Vec<&str> = self
            .layers()
            .iter()
            .filter(|(_, l)| l.active)
            .map(|(n, _)| *n)
            .collect();
        let mut mode = String::new();
        if !self.skipped.is_empty() {
            mode += &format!(" (left off: {})", self.skipped.join(", "));
        }
        let missing = self.containment.missing();
        if self.unsafe_mode && !missing.is_empty() {
            mode += &format!(" (UNSAFE: nothing contains {})", missing.join("; "));
        }
        format!(
            "sandbox: {}{mode}",
            if on.is_empty() {
                "none".to_string()
            } else {
                on.join(", ")
            }
        )
    }
}

impl fmt::Display for Protections {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.summary())?;
        writeln!(f, "  python          {}", self.python)?;
        for (name, layer) in self.layers() {
            let state = if layer.active { "on " } else { "off" };
            writeln!(f, "  {name:<15} {state} {}", layer.detail)?;
        }
        for (what, by, _) in self.containment.properties() {
            let by = if by.is_empty() {
                "NOTHING".to_string()
            } else {
                by.join(", ")
            };
            writeln!(f, "  contains {what}: {by}")?;
        }
        Ok(())
    }
}
