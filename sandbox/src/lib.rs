//! kiln-sandbox: runs model-written Python programs confined and grades them the way
//! LiveCodeBench does.
//!
//! ```no_run
//! use kiln_sandbox::{Limits, Sandbox, SandboxOptions, TestCase, Verdict};
//!
//! let sandbox = Sandbox::new(SandboxOptions::default())?; // probes the layers once
//! println!("{}", sandbox.protections()); // record this next to the results
//! let tests = [
//!     TestCase::Stdin { input: "1 2\n".into(), output: "3\n".into() },
//!     TestCase::Call { fn_name: "add".into(), input: "1\n2".into(), output: "3".into() },
//! ];
//! let code = "def add(a, b):\n    return a + b\nprint(sum(map(int, input().split())))";
//! let graded = sandbox.grade(code, &tests, &Limits::default())?;
//! assert_eq!(graded.verdict, Verdict::Accepted);
//! # Ok::<(), kiln_sandbox::SandboxError>(())
//! ```
//!
//! # The layers
//!
//! A [`Sandbox`] probes at start which of these work (see [`Protections`]; each is checked by a
//! run that must show its effect) and refuses to run anything ([`SandboxError::Unconfined`],
//! naming what is missing) unless every property of [`Containment`] — signals out, file reads
//! and writes outside the scratch, tasks, memory, disk, network and unix sockets out — is
//! contained by a working layer, unless [`SandboxOptions::allow_unsafe`] is set.
//! [`SandboxOptions::skip_layers`] leaves layers off as if the kernel lacked them.
//!
//! - **The interpreter itself**: `python3` is resolved through wrappers (pyenv shims) and symlinks
//!   to the ELF binary, started with `-I -S -B` (no environment variables, no site-packages, no
//!   user directories, no bytecode writes) and an empty environment; every inherited descriptor
//!   above stdin/stdout/stderr is closed.
//! - **rlimits**: CPU time, `RLIMIT_DATA` (not `RLIMIT_AS`, which breaks threaded programs —
//!   `RLIMIT_AS` is added generously only when no cgroup bounds shared memory), stack, file size,
//!   open files, no core dumps, tasks (`RLIMIT_NPROC`: under the slot's uid, in the run's own user
//!   namespace, or else on kiln's shared uid as its count at the start plus the run's allowance,
//!   kept below kiln's own limit; the host's root is exempt, so there only the cgroup bounds
//!   tasks and the probe says so). Protects the host's memory, CPU and disk.
//! - **Process group**: each run leads a new session; the whole group is killed at the deadline
//!   and after the run; `PR_SET_PDEATHSIG` kills it if kiln dies. Nothing outlives a test.
//! - **Scratch**: the only writable directory is the run's own — a private tmpfs (size = the file
//!   limit, 4096 inodes) in a mount namespace, gone when the run ends; else a plain directory
//!   emptied when the run ends and again before the next (made anew if it cannot be), measured
//!   every 20 ms during the run and the run killed over the same bounds (`fallocate` denied, so
//!   only `write` can overshoot). Protects the disk and isolates runs from each other. The
//!   harness directory is checked before every run and written again if a run changed it, so no
//!   program can make a later one fail.
//! - **Landlock** (file system, TCP, signals, abstract unix sockets): read-only system library and
//!   interpreter paths, execute only the interpreter and its loader, no `/proc` (so no other
//!   process's environment or memory), nothing under home directories or `/tmp`, no TCP bind or
//!   connect, no signals to processes outside the run. Each right needs its ABI (truncation 3,
//!   TCP 4, signals 6, i.e. kernel 6.12); the report names those this kernel lacks. Protects the
//!   host's files and secrets.
//! - **seccomp** (allow-list, `EPERM` otherwise): no sockets of any family (so no TCP, UDP or unix
//!   socket; the only layer that keeps a run off unix sockets by path, which a network namespace
//!   does not separate and Landlock does not govern), no fork or clone of processes (threads are fine), no exec after the interpreter
//!   starts, no ptrace, mount, unshare, setns, bpf, keyrings; signals only to itself, on every
//!   path (`kill`, `tgkill`, `sigqueue`, pidfds, `F_SETOWN`/`O_ASYNC`, `FIOSETOWN`), whatever the
//!   kernel's Landlock; no `chmod`, `utime` or truncation by path (nothing that could poison the
//!   harness for later runs); no `memfd_create` (shared memory no rlimit counts) or `fallocate`.
//!   Protects the network, the process table and the kernel's attack
//!   surface.
//! - **Namespaces**: an empty network namespace (plus IPC and UTS) and a user namespace, where the
//!   kernel allows them (as root directly; otherwise inside a user namespace).
//! - **PID namespace** (same condition): the program is pid 2 under a minimal init (pid 1, which
//!   only reaps), with a fresh `/proc` (`hidepid=2`, `subset=pid` where the kernel has them; an
//!   empty read-only one where the kernel refuses proc, as under a container's masked `/proc`).
//!   It cannot name any process outside, so no signal reaches one (`kill(-1)` included), and it
//!   leads a session of its own, so its process group holds only itself and its children. When
//!   the program ends, the init hands its status to a proxy outside (kiln's child, which ends the
//!   same way) and exits, and the kernel kills everything left in the namespace: nothing outlives
//!   a run even without seccomp, a cgroup or a uid to sweep. kiln's kill at the deadline is a
//!   `SIGTERM` to the proxy, which kills the init and exits once the namespace is empty.
//!   Protects other processes and the process table.
//! - **Unprivileged uid per slot** when kiln runs as root (the first free uids from `uid_base`,
//!   no groups), so a run has no root rights even if every other layer failed. Each uid is
//!   reserved by a lock (`/run/lock/kiln-sandbox-uid-N`, `flock`) for the sandbox's life, so two
//!   kiln processes on one machine never share one (the sweep after a run kills everything under
//!   the slot's uid).
//! - **No capabilities**: every run drops them all (as root also the bounding set, with
//!   `SECBIT_NOROOT` locked) and sets `no_new_privs`, so a run that stays root (no uid to drop
//!   to) has no root rights beyond owning root's files.
//! - **cgroup** (v1 or delegated v2) per slot: memory (what `RLIMIT_DATA` does not count, such as
//!   shared mappings and tmpfs pages; an OOM kill is `memory_limit`) and number of tasks.
//!
//! # Grading, and how it differs from LiveCodeBench
//!
//! [`Sandbox::grade`] follows LiveCodeBench's `lcb_runner/evaluation/testing_util.py` (commit
//! 28fef95). Each test is one sandboxed process running the harness (`harness/lcb.py`, embedded
//! and written, with its bytecode, into the sandbox's own read-only directory); it reads the
//! program and the test input from stdin, compiles the program with `compile()` before running
//! any of it (a failure is `compile_error`) and reports what the program printed or returned.
//! `tests/lcb_parity.rs` checks the verdicts against LCB's own grader on a table of programs.
//! The harness applies `reliability_guard`, for stdin
//! problems `clean_if_name` + `make_function` (code wrapped into `wrapped_function`, imports
//! hoisted, LCB's `import_string` prepended) and the same stdin patches (so LCB's quirks stay:
//! `sys.stdin.readlines()` returns `input.split("\n")`, `for line in sys.stdin` fails,
//! `from sys import stdout` writes are lost), for call-based problems `import_string` + exec,
//! `Solution()` when the code contains `class Solution`, one `json.loads` per input line and a
//! returned tuple turned into a list. The comparison is LCB's (see [`compare_stdout`]): strip,
//! split lines, equal line counts, each line equal as text or as whitespace-separated `Decimal`s;
//! call-based results must be `==` the `json.loads`-ed output. Tests stop at the first failure;
//! LCB's per-sample limit `(timeout + 1) · tests + 5 s` applies. Differences:
//!
//! - **One process per test** instead of LCB's `exec` of all tests in one process: no state
//!   leaks between tests (LCB reuses one `Solution()` instance and the module's globals), and a
//!   crash or a kill affects only its test.
//! - **The comparison runs outside the sandbox**, in Rust, so the program never sees the expected
//!   output; Python's `Decimal` grammar and equality and its whitespace set are reproduced
//!   exactly. A returned value of a type other than None/bool/int/float/str/list/tuple/dict (or
//!   an exact `Fraction`/`Decimal`) is never equal (LCB would call its `__eq__`).
//! - **Verdicts**: a program that does not compile is `compile_error` (LCB: -4, runtime error);
//!   `MemoryError` or a cgroup OOM kill is `memory_limit` (LCB: -4); printed output over
//!   [`Limits::output_bytes`] is `wrong_answer` (LCB: unbounded). Whether a sample passes is the
//!   same.
//! - **Time**: the host kills a test at `per_test + startup_grace` wall or CPU time, and a test
//!   whose run exceeds `per_test` on the host's clock (from the harness's start signal, sent just
//!   before the timed call as LCB's timer starts, to the process's exit) is `time_limit`; the
//!   harness's own measurement is not used, so no forged result frame shortens a run. LCB uses
//!   `signal.alarm`, which a program can catch or block.
//! - **Parallelism**: tests of one program may run at the same time on different slots;
//!   results are cut at the first failure as if they had run in order
//!   ([`Limits::stop_at_first_failure`] `= false` runs them all, for partial-credit rewards).
//! - **Environment**: only the standard library is importable (`-S`: no site-packages; LCB's
//!   process has whatever is installed, e.g. numpy); no network, no files outside the scratch
//!   directory, no child processes (so `multiprocessing`, `subprocess` and `asyncio`, which needs
//!   a socket pair, fail where LCB lets them run). `reliability_guard` nulls what LCB's does;
//!   `shutil.rmtree/move/chown` and `subprocess.Popen` when the program imports those modules
//!   (LCB imports them up front, ~4 ms per test).
//! - **Memory**: 4 GiB of data per test by default (LCB sets none).

mod compare;
mod dirfd;
mod error;
#[cfg(all(unix, not(target_os = "linux")))]
mod fallback;
mod fresh;
mod grade;
#[cfg(target_os = "linux")]
mod linux;
mod protections;
mod python;
mod pyvalue;
mod quota;
mod run;
mod sandbox;
mod schedule;
mod unicode_tables;

pub use compare::{Comparison, compare_stdout};
pub use error::SandboxError;
pub use grade::{Graded, Limits, TestCase, TestResult, Verdict};
pub use protections::{Containment, Layer, Protections};
pub use run::{Exit, RunLimits, RunOutput};
pub use sandbox::{SKIPPABLE_LAYERS, Sandbox, SandboxOptions};
