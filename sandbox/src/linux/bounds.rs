//! What the probe reports about capabilities and resource bounds under the layers it found: the
//! capabilities and the task bound are checked by runs (a layer that does not enforce is reported
//! off); memory and disk name the mechanism that bounds them in this mode. [`containment`] says
//! which working layers contain each property the refusal rule asks for.

use super::probe::run_check;
use super::{Layers, Platform, SlotResources};
use crate::protections::{Containment, Layer};
use crate::run::RunLimits;

/// Capabilities (permitted + effective + inheritable words), bounding-set members when the run is
/// root (only root's `execve` draws on it; a non-root kiln cannot empty it) and `no_new_privs`,
/// read with `capget` and `prctl` (`/proc` may be hidden by Landlock).
const CAPS_CHECK: &str = "import ctypes, os\nlibc = ctypes.CDLL(None)\n\
hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)\ndata = (ctypes.c_uint32 * 6)()\n\
assert libc.capget(hdr, data) == 0\n\
bounding = sum(libc.prctl(23, c, 0, 0, 0) == 1 for c in range(64)) if os.getuid() == 0 else 0\n\
print(sum(data), bounding, libc.prctl(39, 0, 0, 0, 0))";

/// Starts threads (small stacks) until one fails, at most 400; prints how many started.
const TASKS_CHECK: &str = "import threading\nthreading.stack_size(1 << 18)\nstop = threading.Event()\nn = 0\n\
try:\n    while n < 400:\n        threading.Thread(target=stop.wait).start()\n        n += 1\n\
except RuntimeError:\n    pass\nstop.set()\nprint(n)";

/// The capabilities a run has: none, and `no_new_privs`.
pub(crate) fn capabilities(platform: &Platform, layers: &Layers, slot: &SlotResources) -> Layer {
    match run_check(platform, layers, slot, CAPS_CHECK) {
        Ok(out) if out == "0 0 1" => Layer::on(
            "none: permitted, effective, inheritable and ambient sets emptied; as root also the \
             bounding set, with SECBIT_NOROOT locked; no_new_privs",
        ),
        Ok(out) => Layer::off(format!(
            "not enforced (capability words, bounding set, no_new_privs: {out})"
        )),
        Err(e) => Layer::off(e),
    }
}

/// The bound on a run's tasks: the mechanisms in force, checked by a run that starts threads
/// until one fails.
pub(crate) fn tasks(platform: &Platform, layers: &Layers, slot: &SlotResources) -> Layer {
    let limit = RunLimits::default().tasks;
    let mut how = Vec::new();
    if layers.cgroup {
        how.push("cgroup pids.max".to_string());
    }
    if layers.drop_uid {
        how.push("RLIMIT_NPROC under the slot's own uid".into());
    } else if layers.user_ns {
        how.push("RLIMIT_NPROC counted in the run's own user namespace".into());
    } else if !platform.is_root {
        how.push(format!(
            "RLIMIT_NPROC on kiln's shared uid (its tasks at the start + {limit}, at most {} \
             below kiln's own limit; one run at a time, so that no run takes another's room)",
            super::tasks::KILN_RESERVE
        ));
    }
    match run_check(platform, layers, slot, TASKS_CHECK) {
        Ok(out) if out.parse::<u64>().is_ok_and(|n| n < limit) => Layer::on(format!(
            "{limit} per run: {} (a run started {out} threads)",
            how.join(", ")
        )),
        Ok(out) => {
            let why = if platform.is_root && !layers.drop_uid {
                "; the host's root is exempt from RLIMIT_NPROC: needs the uid drop or a cgroup"
            } else {
                ""
            };
            let how = if how.is_empty() {
                "no mechanism".to_string()
            } else {
                how.join(", ")
            };
            Layer::off(format!(
                "not bounded: a run started {out} threads ({how}{why})"
            ))
        }
        Err(e) => Layer::off(e),
    }
}

/// Allocates 256 MiB of private data (run under a 96 MiB limit: it must fail).
const MEMORY_CHECK: &str = "try:\n    b = bytearray(256 << 20)\n    print('allocated')\nexcept MemoryError:\n    print('bounded')";

/// What bounds a run's memory (by mechanism; the memory tests check them all), tried by a run
/// whose private allocation over its limit must fail.
pub(crate) fn memory(platform: &Platform, layers: &Layers, slot: &SlotResources) -> Layer {
    let limits = RunLimits { memory_bytes: 96 << 20, wall: std::time::Duration::from_secs(20), ..RunLimits::default() };
    match super::probe::run_check_with(platform, layers, slot, MEMORY_CHECK, &limits) {
        Ok(out) if out == "bounded" => {}
        Ok(out) => return Layer::off(format!("not bounded: 256 MiB of data under a 96 MiB limit was {out}")),
        Err(e) => return Layer::off(e),
    }
    let mut parts = vec!["private data: RLIMIT_DATA".to_string()];
    if layers.cgroup {
        parts.push("shared mappings, tmpfs and memfd pages: the cgroup's memory limit".into());
    } else {
        parts.push("shared mappings: RLIMIT_AS (data + 2 GiB)".into());
    }
    if layers.seccomp {
        parts.push("memfd_create denied (seccomp)".into());
    } else if !layers.cgroup {
        parts.push(
            "memfd (seccomp off): each file ≤ RLIMIT_FSIZE, at most RLIMIT_NOFILE open, \
             RLIMIT_AS once mapped"
                .into(),
        );
    }
    Layer::on(parts.join("; ") + " (256 MiB under a 96 MiB limit tried: refused)")
}

/// What bounds a run's disk use.
pub(crate) fn disk(layers: &Layers) -> Layer {
    if layers.tmpfs {
        return Layer::on("private tmpfs: the file-size limit in all, 4096 entries");
    }
    let mut how = "plain directory measured every 20 ms, the run killed over the file-size limit \
                   in all or 4096 entries; each file ≤ RLIMIT_FSIZE"
        .to_string();
    if layers.seccomp {
        how += "; fallocate denied, so a check can be overshot only by what write() adds in 20 ms";
    } else {
        how += "; fallocate allowed (seccomp off): a check can be overshot by fallocate";
    }
    if !layers.landlock {
        how += "; without Landlock, world-writable host directories are bounded only per file";
    }
    Layer::on(how)
}

/// The working layers that contain each property, from what the probe's runs showed: `tasks`
/// whether the task bound held, `memory` whether the memory bound did, `signal_scope` whether
/// Landlock stopped a signal out.
pub(crate) fn containment(
    platform: &Platform,
    layers: &Layers,
    tasks: bool,
    memory: bool,
    signal_scope: bool,
) -> Containment {
    let pick =
        |v: &[(bool, &'static str)]| v.iter().filter(|(on, _)| *on).map(|(_, n)| *n).collect();
    let root = platform.is_root;
    let task_layers = pick(&[
        (layers.cgroup, "cgroup"),
        (layers.drop_uid, "uid"),
        (!root && layers.user_ns, "user_namespace"),
        (!root && !layers.user_ns, "rlimits"),
        (layers.seccomp, "seccomp"),
        (layers.pid_ns, "pid_namespace"),
    ]);
    // writes stay in the scratch (Landlock), which a tmpfs bounds, or a measurement that only
    // fallocate (denied by seccomp) could overshoot in one call
    let scratch_bounded = layers.tmpfs || layers.seccomp;
    Containment {
        signals: pick(&[
            (layers.seccomp, "seccomp"),
            (layers.landlock && signal_scope, "landlock"),
            (layers.pid_ns, "pid_namespace"),
        ]),
        // Landlock governs reads, writes and (ABI 3) truncation, but not chmod, chown or utime:
        // those need seccomp's filters, or a run under a uid that owns none of kiln's files
        filesystem: if layers.landlock && (layers.seccomp || layers.drop_uid) {
            pick(&[
                (true, "landlock"),
                (layers.seccomp, "seccomp"),
                (layers.drop_uid, "uid"),
            ])
        } else {
            Vec::new()
        },
        // bounded, and nothing left after a run: no fork (seccomp), a sweep (`sweep`), or the
        // namespace's init gone
        tasks: if tasks && (layers.seccomp || layers.cgroup || layers.drop_uid || layers.pid_ns) {
            task_layers
        } else {
            Vec::new()
        },
        memory: if memory {
            pick(&[(true, "rlimits"), (layers.cgroup, "cgroup"), (layers.seccomp, "seccomp")])
        } else {
            Vec::new()
        },
        // only seccomp denies every socket: a unix socket by path (a world-writable one: D-Bus,
        // X11) is reachable from any network namespace, and Landlock does not govern it
        network: if layers.seccomp {
            pick(&[(true, "seccomp"), (layers.net_ns, "net_namespace")])
        } else {
            Vec::new()
        },
        disk: if layers.landlock && scratch_bounded {
            pick(&[
                (true, "landlock"),
                (layers.tmpfs, "scratch"),
                (!layers.tmpfs, "seccomp"),
            ])
        } else {
            Vec::new()
        },
    }
}
