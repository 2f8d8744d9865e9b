//! The probe on this machine: prints the layers and checks that every layer the kernel and the
//! privileges allow is active.

mod common;

#[test]
fn probe_reports_layers() {
    let sandbox = common::sandbox();
    let p = sandbox.protections();
    println!("{p}");
    assert!(p.confined(), "something is contained by no layer:\n{p}");
    // what contains each property follows from the layers found (Landlock's signal scope as
    // tried: the kernel's ABI says whether it exists)
    let c = &p.containment;
    // Landlock alone leaves file modes and times (chmod, utime) to seccomp or the uid drop
    let metadata = p.seccomp.active || p.uid.active;
    assert_eq!(c.filesystem.contains(&"landlock"), p.landlock.active && metadata, "{p}");
    assert_eq!(c.filesystem.contains(&"seccomp"), p.landlock.active && p.seccomp.active, "{p}");
    assert_eq!(c.signals.contains(&"seccomp"), p.seccomp.active, "{p}");
    let scoped = p.landlock.active && common::landlock_abi() >= 6;
    assert_eq!(c.signals.contains(&"landlock"), scoped, "{p}");
    assert_eq!(c.tasks.contains(&"cgroup"), p.cgroup.active, "{p}");
    // unix sockets by path are kept out by seccomp alone; the network namespace adds to it
    assert_eq!(c.network.contains(&"seccomp"), p.seccomp.active, "{p}");
    assert_eq!(c.network.contains(&"net_namespace"), p.seccomp.active && p.net_namespace.active, "{p}");
    // the PID namespace keeps signals in and leaves nothing after a run
    assert_eq!(
        c.signals.contains(&"pid_namespace"),
        p.pid_namespace.active,
        "{p}"
    );
    assert_eq!(
        c.tasks.contains(&"pid_namespace"),
        p.pid_namespace.active,
        "{p}"
    );
    assert!(p.skipped.is_empty(), "{p}");
    for (name, layer) in p.layers() {
        if common::expect_layer(name) {
            assert!(
                layer.active,
                "layer {name} is off on this machine: {}\n{p}",
                layer.detail
            );
        }
    }
    // what keeps signals in is said truthfully: seccomp's filter, and Landlock's scope only where
    // the kernel's ABI has it (6, kernel 6.12)
    if p.seccomp.active {
        assert!(p.seccomp.detail.contains("signals only to itself"), "{p}");
    }
    if p.landlock.active {
        let enforced = p.landlock.detail.split("not enforced").next().unwrap();
        let scoped = common::landlock_abi() >= 6;
        assert_eq!(enforced.contains("no signals out"), scoped, "{p}");
        assert!(p.landlock.detail.contains("no signals out"), "{p}");
        assert_eq!(enforced.contains("no signals out (tried)"), scoped, "{p}");
        // truncation of a file of the run's own outside the scratch, and TCP, as tried
        let abi = common::landlock_abi();
        assert_eq!(enforced.contains("no truncation outside scratch (tried)"), abi >= 3, "{p}");
        assert!(abi < 4 || !p.landlock.detail.contains("TCP bind or connect (ABI 4, kernel 6.7: tried, allowed)"), "{p}");
        assert_eq!(enforced.contains("no TCP bind or connect (tried)"), abi >= 4, "{p}");
        // an abstract unix socket of kiln's, connected to from kiln's own network namespace
        assert_eq!(enforced.contains("no abstract unix sockets out (tried)"), abi >= 6, "{p}");
    }
    let json = serde_json::to_value(p).unwrap();
    assert_eq!(
        json["seccomp"]["active"],
        serde_json::json!(p.seccomp.active)
    );
    assert_eq!(json["skipped"], serde_json::json!([]));
    assert_eq!(
        json["containment"]["filesystem"],
        serde_json::json!(c.filesystem)
    );
    assert_eq!(json["containment"]["filesystem"][0], "landlock", "{p}");
}

/// Two sandboxes at once (two evaluations, or evaluation shards on one node) never share a slot
/// uid: after a run everything left under the slot's uid is killed, so a shared uid would let one
/// kill the other's runs. As root the second takes the next free uids and its runs are under
/// them; unprivileged, runs keep kiln's uid and no slot uids are reserved.
#[test]
fn two_sandboxes_at_once_never_share_a_slot_uid() {
    use kiln_sandbox::{RunLimits, Sandbox, SandboxOptions};
    let _alone = common::exclusive();
    let make = || {
        Sandbox::new(SandboxOptions { slots: 2, uid_base: 2_000_000_900, ..SandboxOptions::default() })
            .unwrap_or_else(|e| panic!("cannot set up the sandbox: {e}"))
    };
    let (a, b) = (make(), make());
    if !(common::is_root() && a.protections().uid.active) {
        assert!(a.slot_uids().is_empty() && b.slot_uids().is_empty(), "{}", a.protections());
        return;
    }
    assert_eq!(a.slot_uids(), [2_000_000_900, 2_000_000_901]);
    assert_eq!(b.slot_uids(), [2_000_000_902, 2_000_000_903], "the second takes the next free uids");
    // the record names the base, not the uids taken (which depend on what else runs)
    assert_eq!(a.protections().uid.detail, b.protections().uid.detail);
    assert!(b.protections().uid.detail.contains("the first free from 2000000900"), "{}", b.protections());
    let out = b.run_python(&["-c", "import os; print(os.getuid())"], b"", &RunLimits::default()).unwrap();
    let uid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(b.slot_uids().contains(&uid), "a run of the second sandbox ran as {uid}");
    // once the first is gone its uids are free again
    drop(a);
    assert_eq!(make().slot_uids(), [2_000_000_900, 2_000_000_901]);
}
