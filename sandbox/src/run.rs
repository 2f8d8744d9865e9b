//! One sandboxed process from the outside: its limits, feeding stdin from memory, capturing
//! stdout/stderr with caps, the wall-clock deadline and the kill of its whole process group.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::process::Child;
use std::time::{Duration, Instant};

use crate::quota::{CHECK_EVERY, Quota};

/// Limits of one process.
#[derive(Debug, Clone, PartialEq)]
pub struct RunLimits {
    /// Wall-clock time from start to exit; then the process group is killed.
    pub wall: Duration,
    /// CPU time (`RLIMIT_CPU`, whole seconds, rounded up).
    pub cpu: Duration,
    /// Heap and other private data (`RLIMIT_DATA`); the cgroup limit adds 128 MiB for the
    /// interpreter, stacks and page cache.
    pub memory_bytes: u64,
    /// Main-thread stack (`RLIMIT_STACK`; glibc also makes it the default thread stack size).
    pub stack_bytes: u64,
    /// stdout beyond this is not kept and the process is killed.
    pub stdout_bytes: usize,
    /// stderr beyond this is read and dropped.
    pub stderr_bytes: usize,
    /// Largest file the program may write (`RLIMIT_FSIZE`); also the scratch tmpfs size.
    pub file_bytes: u64,
    /// Open descriptors (`RLIMIT_NOFILE`).
    pub open_files: u64,
    /// Threads (`RLIMIT_NPROC` under a slot uid, cgroup `pids.max`).
    pub tasks: u64,
}

impl Default for RunLimits {
    fn default() -> Self {
        Self {
            wall: Duration::from_secs(10),
            cpu: Duration::from_secs(10),
            memory_bytes: 4 << 30,
            stack_bytes: 8 << 20,
            stdout_bytes: 1 << 25,
            stderr_bytes: 4 << 10,
            file_bytes: 64 << 20,
            open_files: 64,
            tasks: 64,
        }
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

/// What a process did.
#[derive(Debug, Clone)]
pub struct RunOutput {
    pub exit: Exit,
    pub stdout: Vec<u8>,
    /// stdout went over the cap (the process was killed then).
    pub stdout_overflow: bool,
    /// The first `stderr_bytes` of stderr.
    pub stderr: Vec<u8>,
    /// Killed at the wall-clock deadline.
    pub timed_out: bool,
    /// The cgroup's OOM killer fired during the run.
    pub oom_killed: bool,
    /// A plain scratch directory went over its quota (the process was killed then).
    pub disk_exceeded: bool,
    pub wall: Duration,
    /// User + system CPU time.
    pub cpu: Duration,
    /// When the first stdout byte arrived, from the start (the host's clock).
    pub first_output: Option<Duration>,
    /// When the process was seen to exit, from the start (the host's clock).
    pub exited: Option<Duration>,
}

/// How the processes of a run are killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kill {
    /// `SIGKILL` to the child and its process group.
    Group,
    /// The child is the proxy outside a PID namespace: `SIGTERM` makes it kill the namespace's
    /// init, and it exits once the kernel has killed and reaped everything in the namespace, so
    /// nothing of the run is left when the child is reaped. Should it not exit within
    /// [`PROXY_GRACE`], its process group (it and the init) is killed.
    Proxy,
}

/// How long a proxy may take to exit after `SIGTERM` before its group is killed.
const PROXY_GRACE: Duration = Duration::from_secs(2);

/// Feeds `input`, collects output and waits, killing the run (see [`Kill`]) at `limits.wall` or
/// when stdout overflows. The child must lead its own process group.
/// With `quota`, the scratch directory is measured every [`CHECK_EVERY`] and the group killed
/// when it is over.
pub(crate) fn supervise(
    mut child: Child,
    input: &[u8],
    limits: &RunLimits,
    start: Instant,
    quota: Option<&Quota>,
    how: Kill,
) -> std::io::Result<RunOutput> {
    let pid = child.id() as libc::pid_t;
    let (mut killed, mut escalated): (Option<Instant>, bool) = (None, false);
    let kill = |killed: &mut Option<Instant>| {
        match how {
            Kill::Group => kill_group(pid),
            // SAFETY: a signal to our own child, not reaped yet.
            Kill::Proxy => unsafe {
                libc::kill(pid, libc::SIGTERM);
            },
        }
        killed.get_or_insert_with(Instant::now);
    };
    let deadline = start + limits.wall;
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    for fd in [
        stdin.as_ref().map(|f| f.as_raw_fd()),
        stdout.as_ref().map(|f| f.as_raw_fd()),
        stderr.as_ref().map(|f| f.as_raw_fd()),
    ]
    .into_iter()
    .flatten()
    {
        set_nonblocking(fd)?;
    }
    let pidfd = pidfd_open(pid);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (mut overflow, mut timed_out, mut exited) = (false, false, false);
    let (mut written, mut seen_out, mut seen_err) = (0usize, 0usize, 0usize);
    if input.is_empty() {
        stdin = None;
    }
    let (mut first_output, mut exited_at) = (None, None);
    let (mut disk_exceeded, mut next_check) = (false, start + CHECK_EVERY);
    let mut buf = vec![0u8; 1 << 16];
    while !(exited && stdout.is_none() && stderr.is_none()) {
        let now = Instant::now();
        if now >= deadline && !timed_out {
            timed_out = true;
            kill(&mut killed);
        }
        if how == Kill::Proxy
            && !exited
            && !escalated
            && killed.is_some_and(|t| now.duration_since(t) >= PROXY_GRACE)
        {
            escalated = true;
            kill_group(pid);
        }
        if let Some(q) = quota.filter(|_| !exited && !disk_exceeded && now >= next_check) {
            next_check = now + CHECK_EVERY;
            if q.exceeded() {
                disk_exceeded = true;
                kill(&mut killed);
            }
        }
        let mut fds = [
            pollfd(stdin.as_ref().map(|f| f.as_raw_fd()), libc::POLLOUT),
            pollfd(stdout.as_ref().map(|f| f.as_raw_fd()), libc::POLLIN),
            pollfd(stderr.as_ref().map(|f| f.as_raw_fd()), libc::POLLIN),
            pollfd(
                if exited {
                    None
                } else {
                    pidfd.as_ref().map(|f| f.as_raw_fd())
                },
                libc::POLLIN,
            ),
        ];
        let wait = if timed_out || killed.is_some() {
            Duration::from_millis(20)
        } else {
            deadline.saturating_duration_since(now)
        };
        let wait = if pidfd.is_none() && !exited {
            wait.min(Duration::from_millis(2))
        } else {
            wait
        };
        let wait = if quota.is_some() && !exited {
            wait.min(next_check.saturating_duration_since(now))
        } else {
            wait
        };
        let ms = wait.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a valid array of pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                kill_group(pid);
                let _ = reap(pid);
                return Err(e);
            }
        }
        let ready = |i: usize| fds[i].fd >= 0 && fds[i].revents != 0;
        if ready(0) {
            let f = stdin.as_mut().expect("polled");
            match f.write(&input[written..]) {
                Ok(k) => written += k,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => written = input.len(), // the program closed its stdin
            }
            if written >= input.len() {
                stdin = None;
            }
        }
        if ready(1) {
            drain(
                &mut stdout,
                &mut out,
                limits.stdout_bytes,
                &mut seen_out,
                &mut buf,
            );
            if seen_out > 0 && first_output.is_none() {
                first_output = Some(start.elapsed());
            }
            if seen_out > limits.stdout_bytes && !overflow {
                overflow = true;
                stdout = None;
                kill(&mut killed);
            }
        }
        if ready(2) {
            drain(
                &mut stderr,
                &mut err,
                limits.stderr_bytes,
                &mut seen_err,
                &mut buf,
            );
        }
        if !exited && (ready(3) || (pidfd.is_none() && has_exited(pid))) {
            exited = true;
            exited_at = Some(start.elapsed());
            // Still a zombie, so the pid (= process group id) cannot be reused: kill anything
            // left in the group (only possible when unconfined), then reap below. (A proxy
            // exits only when its namespace is empty.)
            if how == Kill::Group {
                kill_group(pid);
            }
        }
        if exited && (timed_out || disk_exceeded) {
            // after a kill, give up on pipes a hostile program may have passed on
            stdout = None;
            stderr = None;
        }
    }
    let (status, rusage) = reap(pid)?;
    let wall = start.elapsed();
    let cpu = tv(rusage.ru_utime) + tv(rusage.ru_stime);
    let exit = if libc::WIFSIGNALED(status) {
        Exit::Signal(libc::WTERMSIG(status))
    } else {
        Exit::Code(libc::WEXITSTATUS(status))
    };
    drop(child);
    Ok(RunOutput {
        exit,
        stdout: out,
        stdout_overflow: overflow,
        stderr: err,
        timed_out,
        oom_killed: false,
        disk_exceeded,
        wall,
        cpu,
        first_output,
        exited: exited_at,
    })
}

fn tv(t: libc::timeval) -> Duration {
    Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
}

fn pollfd(fd: Option<i32>, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd: fd.unwrap_or(-1),
        events,
        revents: 0,
    }
}

/// Reads what is available (at most 1 MiB per call, so the caller gets back to its deadline),
/// keeping the first `cap` bytes in `into`; counts every byte in `seen`. At end of file the pipe
/// is dropped.
fn drain<R: Read>(
    pipe: &mut Option<R>,
    into: &mut Vec<u8>,
    cap: usize,
    seen: &mut usize,
    buf: &mut [u8],
) {
    let Some(p) = pipe.as_mut() else { return };
    for _ in 0..16 {
        match p.read(buf) {
            Ok(0) => {
                *pipe = None;
                return;
            }
            Ok(k) => {
                *seen += k;
                let room = cap.saturating_sub(into.len());
                into.extend_from_slice(&buf[..k.min(room)]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(_) => {
                *pipe = None; // broken
                return;
            }
        }
    }
}

fn set_nonblocking(fd: i32) -> std::io::Result<()> {
    // SAFETY: flag change on an open descriptor.
    let rc = unsafe {
        libc::fcntl(
            fd,
            libc::F_SETFL,
            libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Kills the process group led by `pid` (and `pid` itself, should it have left the group).
pub(crate) fn kill_group(pid: libc::pid_t) {
    // SAFETY: signals to our own child's group; the pid is not reaped yet.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
    }
}

#[cfg(target_os = "linux")]
fn pidfd_open(pid: libc::pid_t) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open returns a new descriptor we own, or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: fd is a fresh descriptor.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(not(target_os = "linux"))]
fn pidfd_open(_pid: libc::pid_t) -> Option<std::os::fd::OwnedFd> {
    None
}

/// Whether the child has exited, without reaping it.
fn has_exited(pid: libc::pid_t) -> bool {
    // SAFETY: waitid with WNOWAIT leaves the child waitable.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        #[cfg(target_os = "linux")]
        let waited = info.si_pid();
        #[cfg(not(target_os = "linux"))]
        let waited = info.si_pid;
        rc == 0 && waited != 0
    }
}

fn reap(pid: libc::pid_t) -> std::io::Result<(libc::c_int, libc::rusage)> {
    // SAFETY: wait4 on our own child, writing into owned locals.
    unsafe {
        let mut status = 0;
        let mut rusage: libc::rusage = std::mem::zeroed();
        loop {
            let rc = libc::wait4(pid, &mut status, 0, &mut rusage);
            if rc == pid {
                return Ok((status, rusage));
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}
