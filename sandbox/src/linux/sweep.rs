//! After a run that could fork (seccomp off), whatever of it is left is killed: a child in a new
//! session escapes the kill of the run's process group. With a cgroup, every process in the
//! slot's group; else, with the uid drop, every process of the slot's uid (`kill(-1)` from a
//! helper under that uid). With a PID namespace nothing is left to find (its init's exit killed
//! it all before kiln reaped the run). Without any of these, nothing finds them: the refusal rule
//! then counts the run's tasks as not contained.

use super::{Layers, SlotResources};

/// Kills what is left of the last run in `slot` (nothing to do when seccomp denies fork).
pub(crate) fn sweep(layers: &Layers, slot: &SlotResources) {
    if layers.seccomp {
        return;
    }
    match slot.cgroup.as_ref().filter(|_| layers.cgroup) {
        Some(g) => g.kill_all(),
        None if layers.drop_uid => kill_uid(slot.uid, slot.gid),
        None => {}
    }
}

/// Every process of `uid`, killed by a helper that becomes `uid` and calls `kill(-1, SIGKILL)`
/// (twice: a fork under way during the first is refused a fatal signal pending).
fn kill_uid(uid: u32, gid: u32) {
    // SAFETY: the child makes only raw system calls on its own thread and exits.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>());
            libc::syscall(libc::SYS_setresgid, gid, gid, gid);
            if libc::syscall(libc::SYS_setresuid, uid, uid, uid) == 0 {
                libc::kill(-1, libc::SIGKILL);
                libc::kill(-1, libc::SIGKILL);
            }
            libc::_exit(0);
        }
        if pid > 0 {
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
}
