//! The seccomp filters: an allow-list of the system calls a Python program needs; everything
//! else fails with `EPERM` (so `socket`, `fork`, `ptrace`, `mount`, `unshare`, `bpf`, … raise
//! `PermissionError` in the program). Built with `seccompiler` (pure Rust) in the parent; the
//! child installs them right before `execve`.
//!
//! Conditions:
//! - `clone` only with `CLONE_THREAD` and without namespace flags (threads yes, processes no);
//!   `clone3` (whose flags a filter cannot read) fails with `ENOSYS`, so glibc falls back to `clone`;
//! - `execve` only with the exact path pointer kiln itself passes (the interpreter's start);
//!   `execveat` never;
//! - signals only to itself, whatever else protects them (Landlock's signal scope needs kernel
//!   6.12): `kill`/`tgkill`/`tkill`/`rt_(tg)sigqueueinfo` only on its own pid (`kill` also on 0
//!   and minus its pid: its own process group, of which it is the only member); `fcntl(F_SETOWN)`
//!   (the target of `O_ASYNC`'s `SIGIO` or `F_SETSIG`'s signal) only to 0, itself or its group;
//!   `F_SETOWN_EX` (whose target a filter cannot read) never; `pidfd_open`, `pidfd_send_signal`
//!   never (not on the list); `ioctl` `FIOSETOWN`/`SIOCSPGRP`/`TIOCSPGRP` never;
//!   `prlimit64`/`sched_getaffinity` only on itself. The child's pid is unknown until the fork, so
//!   the filter holds a placeholder that the child patches in place (no allocation after fork).
//! - `ioctl` except `TIOCSTI` (typing into a terminal) and the owner-setting requests above.
//! - no metadata changes that could poison later runs (the harness directory is on every run's
//!   command line): no `chmod`/`fchmod`/`fchmodat(2)`, no `utime(s)`/`utimensat`/`futimesat`, no
//!   `truncate` by path, no `open(O_TRUNC)` without write access (Landlock before ABI 3 does not
//!   see truncation; with write access it checks the open itself), no `openat2` (whose flags a
//!   filter cannot read). `ftruncate` stays: it needs a descriptor open for writing, which
//!   Landlock gives only in the scratch directory.
//! - no `memfd_create`: its pages are shared memory that `RLIMIT_DATA` does not count and that
//!   `RLIMIT_AS` counts only while mapped (Python needs it only for `os.memfd_create`);
//! - no `fallocate`, which reserves a file's blocks at once: a plain scratch directory (no tmpfs)
//!   is measured every 20 ms, and between two checks only `write` can add to it;
//! - no `unlink`, `rename` (which replaces its target) or `open(O_TMPFILE)`: a file written after
//!   its name is gone holds blocks that no directory shows, so a measured scratch directory would
//!   not see them (LiveCodeBench's `reliability_guard` nulls `os.unlink`, `os.rename`,
//!   `os.replace` and `os.remove` too); `rmdir` (`unlinkat(AT_REMOVEDIR)`) of empty directories
//!   stays.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op,
    SeccompCondition as Cond, SeccompFilter, SeccompRule, TargetArch,
};

/// Placeholder for the child's pid in the filter (patched after fork).
const PID_SENTINEL: u32 = 0x7a5e_c0de;
/// Placeholder for minus the child's pid (`kill(-pid, sig)`).
const NEG_PID_SENTINEL: u32 = PID_SENTINEL.wrapping_neg();

/// `fcntl` commands that choose who gets `SIGIO` (and `F_SETSIG`'s signal) for a descriptor.
const F_SETOWN: u64 = libc::F_SETOWN as u64;
const F_SETOWN_EX: u64 = 15;
/// `ioctl` requests that set a descriptor's or a terminal's signal target (through a pointer).
const FIOSETOWN: u64 = 0x8901;
const SIOCSPGRP: u64 = 0x8902;

/// The filters to install, with the places to patch.
#[derive(Clone)]
pub(crate) struct Filters {
    /// Installed in order. The first turns `clone3` into `ENOSYS`, the second is the allow-list.
    pub programs: Vec<BpfProgram>,
    /// (program, instruction, is_negative) for every placeholder.
    pub patches: Vec<(usize, usize, bool)>,
}

impl Filters {
    /// Writes the child's pid into the placeholders. Called in the child: no allocation.
    pub(crate) fn patch_pid(&mut self, pid: u32) {
        for &(p, i, neg) in &self.patches {
            self.programs[p][i].k = if neg { pid.wrapping_neg() } else { pid };
        }
    }
}

fn cond(arg: u8, len: Len, op: Op, value: u64) -> Cond {
    Cond::new(arg, len, op, value).expect("valid seccomp condition")
}

fn rule(conds: Vec<Cond>) -> SeccompRule {
    SeccompRule::new(conds).expect("valid seccomp rule")
}

/// Rules allowing a call when argument `arg` (a pid) is one of `values`.
fn pid_is(arg: u8, values: &[u32]) -> Vec<SeccompRule> {
    values
        .iter()
        .map(|&v| rule(vec![cond(arg, Len::Dword, Op::Eq, u64::from(v))]))
        .collect()
}

/// `O_TMPFILE` without its `O_DIRECTORY` bit.
const O_TMPFILE_BIT: u64 = (libc::O_TMPFILE & !libc::O_DIRECTORY) as u64;

/// Rules allowing an open whose flags (argument `arg`) truncate only with write access and never
/// make an unnamed file (`O_TMPFILE`).
fn open_flags_at(arg: u8) -> Vec<SeccompRule> {
    let (trunc, acc) = (libc::O_TRUNC as u64, libc::O_ACCMODE as u64);
    let masked = |mask, value| {
        rule(vec![
            cond(arg, Len::Dword, Op::MaskedEq(mask), value),
            cond(arg, Len::Dword, Op::MaskedEq(O_TMPFILE_BIT), 0),
        ])
    };
    vec![
        masked(trunc, 0),
        masked(acc, libc::O_WRONLY as u64),
        masked(acc, libc::O_RDWR as u64),
    ]
}

/// Builds the filters. `exec_path` is the address of the interpreter path kiln passes to execve.
pub(crate) fn build(exec_path: *const libc::c_char) -> Result<Filters, String> {
    let arch: TargetArch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| format!("{e:?}"))?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &nr in ALLOWED {
        rules.insert(nr, vec![]);
    }
    // Allowed here so that only the first filter's ENOSYS answers it (with two ERRNO answers
    // the later filter's would win).
    rules.insert(libc::SYS_clone3, vec![]);
    let ns_flags = (libc::CLONE_NEWNS
        | libc::CLONE_NEWUSER
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP) as u64;
    let thread = libc::CLONE_THREAD as u64;
    rules.insert(
        libc::SYS_clone,
        vec![rule(vec![
            cond(0, Len::Qword, Op::MaskedEq(thread), thread),
            cond(0, Len::Qword, Op::MaskedEq(ns_flags), 0),
        ])],
    );
    rules.insert(
        libc::SYS_execve,
        vec![rule(vec![cond(0, Len::Qword, Op::Eq, exec_path as u64)])],
    );
    let denied_ioctls = [libc::TIOCSTI, FIOSETOWN, SIOCSPGRP, libc::TIOCSPGRP];
    rules.insert(
        libc::SYS_ioctl,
        vec![rule(
            denied_ioctls
                .iter()
                .map(|&r| cond(1, Len::Dword, Op::Ne, r))
                .collect(),
        )],
    );
    let mut fcntl = vec![rule(vec![
        cond(1, Len::Dword, Op::Ne, F_SETOWN),
        cond(1, Len::Dword, Op::Ne, F_SETOWN_EX),
    ])];
    for owner in [0, PID_SENTINEL, NEG_PID_SENTINEL] {
        fcntl.push(rule(vec![
            cond(1, Len::Dword, Op::Eq, F_SETOWN),
            cond(2, Len::Dword, Op::Eq, u64::from(owner)),
        ]));
    }
    rules.insert(libc::SYS_fcntl, fcntl);
    // unlinkat only as rmdir (an empty directory holds no blocks)
    let removedir = libc::AT_REMOVEDIR as u64;
    rules.insert(
        libc::SYS_unlinkat,
        vec![rule(vec![cond(2, Len::Dword, Op::MaskedEq(removedir), removedir)])],
    );
    rules.insert(libc::SYS_openat, open_flags_at(2));
    #[cfg(target_arch = "x86_64")]
    rules.insert(libc::SYS_open, open_flags_at(1));
    rules.insert(
        libc::SYS_kill,
        pid_is(0, &[0, PID_SENTINEL, NEG_PID_SENTINEL]),
    );
    let to_self = [
        libc::SYS_tgkill,
        libc::SYS_tkill,
        libc::SYS_rt_sigqueueinfo,
        libc::SYS_rt_tgsigqueueinfo,
    ];
    for nr in to_self {
        rules.insert(nr, pid_is(0, &[PID_SENTINEL]));
    }
    let self_or_zero = [libc::SYS_prlimit64, libc::SYS_sched_getaffinity];
    for nr in self_or_zero {
        rules.insert(nr, pid_is(0, &[0, PID_SENTINEL]));
    }
    let placeholders = 2 + 2 + to_self.len() + self_or_zero.len();
    let allow_list = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        arch,
    )
    .map_err(|e| e.to_string())?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, vec![])]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    let programs: Vec<BpfProgram> = vec![
        clone3
            .try_into()
            .map_err(|e: seccompiler::BackendError| e.to_string())?,
        allow_list
            .try_into()
            .map_err(|e: seccompiler::BackendError| e.to_string())?,
    ];
    let mut patches = Vec::new();
    for (p, prog) in programs.iter().enumerate() {
        for (i, ins) in prog.iter().enumerate() {
            if ins.k == PID_SENTINEL || ins.k == NEG_PID_SENTINEL {
                patches.push((p, i, ins.k == NEG_PID_SENTINEL));
            }
        }
    }
    if patches.len() != placeholders {
        let found = patches.len();
        return Err(format!(
            "expected {placeholders} pid placeholders in the seccomp filter, found {found}"
        ));
    }
    Ok(Filters { programs, patches })
}

/// System calls allowed without conditions.
#[rustfmt::skip]
const ALLOWED: &[i64] = &[
    // files and descriptors (Landlock decides which paths)
    libc::SYS_read, libc::SYS_write, libc::SYS_readv, libc::SYS_writev, libc::SYS_pread64,
    libc::SYS_pwrite64, libc::SYS_preadv, libc::SYS_pwritev, libc::SYS_preadv2, libc::SYS_pwritev2,
    libc::SYS_lseek, libc::SYS_close, libc::SYS_close_range,
    libc::SYS_newfstatat, libc::SYS_fstat, libc::SYS_statx, libc::SYS_statfs, libc::SYS_fstatfs,
    libc::SYS_faccessat, libc::SYS_faccessat2, libc::SYS_readlinkat, libc::SYS_getdents64,
    libc::SYS_getcwd, libc::SYS_chdir, libc::SYS_fchdir, libc::SYS_mkdirat,
    libc::SYS_linkat, libc::SYS_symlinkat,
    libc::SYS_ftruncate, libc::SYS_fsync, libc::SYS_fdatasync,
    libc::SYS_fadvise64, libc::SYS_flock, libc::SYS_dup, libc::SYS_dup3,
    libc::SYS_pipe2, libc::SYS_umask, libc::SYS_copy_file_range, libc::SYS_sendfile,
    libc::SYS_splice, libc::SYS_tee,
    // memory
    libc::SYS_brk, libc::SYS_mmap, libc::SYS_munmap, libc::SYS_mremap, libc::SYS_mprotect,
    libc::SYS_madvise, libc::SYS_mincore, libc::SYS_msync, libc::SYS_membarrier,
    // threads and synchronisation
    libc::SYS_futex, libc::SYS_set_robust_list, libc::SYS_get_robust_list, libc::SYS_rseq,
    libc::SYS_set_tid_address, libc::SYS_gettid, libc::SYS_sched_yield,
    libc::SYS_sched_getparam, libc::SYS_sched_getscheduler, libc::SYS_sched_get_priority_max,
    libc::SYS_sched_get_priority_min, libc::SYS_getcpu,
    // signals (to itself, see the conditional rules) and timers
    libc::SYS_rt_sigaction, libc::SYS_rt_sigprocmask, libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack, libc::SYS_rt_sigsuspend, libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_sigpending, libc::SYS_setitimer, libc::SYS_getitimer, libc::SYS_timer_create,
    libc::SYS_timer_settime, libc::SYS_timer_gettime, libc::SYS_timer_getoverrun,
    libc::SYS_timer_delete, libc::SYS_clock_gettime, libc::SYS_clock_getres,
    libc::SYS_clock_nanosleep, libc::SYS_nanosleep, libc::SYS_gettimeofday, libc::SYS_times,
    // waiting for events on its own descriptors
    libc::SYS_ppoll, libc::SYS_pselect6, libc::SYS_epoll_create1, libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait, libc::SYS_epoll_pwait2, libc::SYS_eventfd2, libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime, libc::SYS_timerfd_gettime, libc::SYS_signalfd4,
    // identity and limits (reading; lowering its own limits)
    libc::SYS_getpid, libc::SYS_getppid, libc::SYS_getuid, libc::SYS_geteuid, libc::SYS_getgid,
    libc::SYS_getegid, libc::SYS_getgroups, libc::SYS_getresuid, libc::SYS_getresgid,
    libc::SYS_getpgid, libc::SYS_getsid, libc::SYS_getrusage, libc::SYS_uname,
    libc::SYS_sysinfo, libc::SYS_getrandom, libc::SYS_capget, libc::SYS_prctl,
    libc::SYS_seccomp,
    // the end
    libc::SYS_exit, libc::SYS_exit_group, libc::SYS_wait4, libc::SYS_waitid,
    #[cfg(target_arch = "x86_64")] libc::SYS_stat,
    #[cfg(target_arch = "x86_64")] libc::SYS_lstat,
    #[cfg(target_arch = "x86_64")] libc::SYS_access,
    #[cfg(target_arch = "x86_64")] libc::SYS_readlink,
    #[cfg(target_arch = "x86_64")] libc::SYS_getdents,
    #[cfg(target_arch = "x86_64")] libc::SYS_mkdir,
    #[cfg(target_arch = "x86_64")] libc::SYS_rmdir,
    #[cfg(target_arch = "x86_64")] libc::SYS_link,
    #[cfg(target_arch = "x86_64")] libc::SYS_symlink,
    #[cfg(target_arch = "x86_64")] libc::SYS_dup2,
    #[cfg(target_arch = "x86_64")] libc::SYS_pipe,
    #[cfg(target_arch = "x86_64")] libc::SYS_poll,
    #[cfg(target_arch = "x86_64")] libc::SYS_select,
    #[cfg(target_arch = "x86_64")] libc::SYS_epoll_create,
    #[cfg(target_arch = "x86_64")] libc::SYS_epoll_wait,
    #[cfg(target_arch = "x86_64")] libc::SYS_eventfd,
    #[cfg(target_arch = "x86_64")] libc::SYS_pause,
    #[cfg(target_arch = "x86_64")] libc::SYS_alarm,
    #[cfg(target_arch = "x86_64")] libc::SYS_time,
    #[cfg(target_arch = "x86_64")] libc::SYS_getpgrp,
    #[cfg(target_arch = "x86_64")] libc::SYS_arch_prctl,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_build_with_every_pid_placeholder_found() {
        let mut f = build(c"/usr/bin/python3".as_ptr()).unwrap();
        assert_eq!(f.patches.len(), 10);
        f.patch_pid(1234);
        let ks: Vec<u32> = f.programs.iter().flatten().map(|i| i.k).collect();
        assert!(!ks.contains(&PID_SENTINEL) && !ks.contains(&NEG_PID_SENTINEL));
        assert!(ks.contains(&1234) && ks.contains(&1234u32.wrapping_neg()));
    }
}
