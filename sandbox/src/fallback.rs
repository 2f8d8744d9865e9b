//! Other Unix systems: no confinement layers, only rlimits, a process group and an empty
//! environment. A [`Sandbox`](crate::Sandbox) refuses to run here unless unsafe mode is asked for.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::SandboxError;
use crate::run::{RunLimits, RunOutput, supervise};

/// Runs `python -I -S -B args` in `work` with rlimits only.
pub(crate) fn run(
    python: &Path,
    work: &Path,
    args: &[&str],
    stdin: &[u8],
    limits: &RunLimits,
) -> Result<RunOutput, SandboxError> {
    crate::fresh::renew_scratch(work, None).map_err(|e| SandboxError::io(work, e))?;
    let cpu = limits.cpu.as_secs() + 1;
    let (data, stack, fsize, nofile) = (
        limits.memory_bytes,
        limits.stack_bytes,
        limits.file_bytes,
        limits.open_files,
    );
    let mut cmd = Command::new(python);
    cmd.args(["-I", "-S", "-B"])
        .args(args)
        .env_clear()
        .current_dir(work)
        .process_group(0);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit only, on values computed before the fork.
    unsafe {
        cmd.pre_exec(move || {
            for (res, v) in [
                (libc::RLIMIT_CPU, cpu),
                (libc::RLIMIT_DATA, data),
                (libc::RLIMIT_STACK, stack),
                (libc::RLIMIT_FSIZE, fsize),
                (libc::RLIMIT_NOFILE, nofile),
                (libc::RLIMIT_CORE, 0),
            ] {
                let r = libc::rlimit {
                    rlim_cur: v as libc::rlim_t,
                    rlim_max: v as libc::rlim_t,
                };
                if libc::setrlimit(res, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
    };
    let start = Instant::now();
    let child = cmd
        .spawn()
        .map_err(|e| SandboxError::Spawn(format!("{}: {e}", python.display())))?;
    supervise(child, stdin, limits, start, None, crate::run::Kill::Group)
        .map_err(|e| SandboxError::Spawn(e.to_string()))
}
