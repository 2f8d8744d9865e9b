//! LiveCodeBench-style grading on top of the sandbox: one process per test running the harness
//! (`harness/lcb.py`, LCB's `testing_util.py` semantics), the comparison done here, the stop at
//! the first failing test, LCB's per-sample global time limit, parallel over the slots.

use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::compare::{Comparison, compare_stdout};
use crate::pyvalue;
use crate::run::{Exit, RunLimits, RunOutput};
use crate::{Sandbox, SandboxError};

/// The harness every test runs in (written into the sandbox directory).
pub(crate) const HARNESS: &str = include_str!("../harness/lcb.py");
/// Marks the start of the harness's result frame on its stdout.
const RESULT_MAGIC: &[u8] = b"\0KILN-RESULT\0";

/// One test of a problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "testtype", rename_all = "snake_case")]
pub enum TestCase {
    /// The program reads `input` on stdin and must print `output`.
    Stdin { input: String, output: String },
    /// `fn_name` (a method of `class Solution`, or a function) is called with one argument per
    /// line of `input` (each a JSON value) and must return the JSON value `output`. (LCB's
    /// `testtype` "functional".)
    #[serde(rename = "functional")]
    Call {
        fn_name: String,
        input: String,
        output: String,
    },
}

/// Limits of a grading. The default is LiveCodeBench's.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Per test, CPU and wall clock (LCB: 6 s).
    pub per_test: Duration,
    /// Per program over all its tests, counted as if they ran one after another; `None` means
    /// LCB's `(per_test + 1 s) × tests + 5 s`.
    pub global: Option<Duration>,
    /// Data memory per process (LCB sets none; 4 GiB here).
    pub memory_bytes: u64,
    /// Printed output (or encoded return value) beyond this is a wrong answer.
    pub output_bytes: usize,
    /// Stop at the first test that fails, as LCB does. With `false` every test runs (partial
    /// credit for rewards); the verdict is still the first failing test's.
    pub stop_at_first_failure: bool,
    /// Extra wall time per process for starting the interpreter and compiling the program (LCB
    /// gives the compile its own alarm); the program's own run must fit `per_test`.
    pub startup_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            per_test: Duration::from_secs(6),
            global: None,
            memory_bytes: 4 << 30,
            output_bytes: 32 << 20,
            stop_at_first_failure: true,
            startup_grace: Duration::from_secs(1),
        }
    }
}

/// The verdict of a test or a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Accepted,
    WrongAnswer,
    TimeLimit,
    MemoryLimit,
    RuntimeError,
    CompileError,
    /// No code was extracted from a completion (decided by the caller; never produced here).
    NoCode,
}

impl Verdict {
    /// The snake_case name used in output files.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Accepted => "accepted",
            Verdict::WrongAnswer => "wrong_answer",
            Verdict::TimeLimit => "time_limit",
            Verdict::MemoryLimit => "memory_limit",
            Verdict::RuntimeError => "runtime_error",
            Verdict::CompileError => "compile_error",
            Verdict::NoCode => "no_code",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The result of one test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestResult {
    pub verdict: Verdict,
    /// The program's run time on the host's clock: from the harness's start signal (written just
    /// before the timed call, LCB's "execution time") to the process's exit; the process's wall
    /// time when there was none. Nothing the program prints changes it.
    pub time_s: f64,
    /// Why it failed, briefly (exception, differing line, signal); empty when accepted.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// The result of one program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Graded {
    /// `accepted` iff every test passed; else the first failing test's verdict.
    pub verdict: Verdict,
    pub passed: usize,
    pub total: usize,
    /// Results in test order, up to and including the first failure when stopping there.
    pub tests: Vec<TestResult>,
}

impl Graded {
    /// A program for which no code was extracted.
    pub fn no_code(total: usize) -> Graded {
        Graded {
            verdict: Verdict::NoCode,
            passed: 0,
            total,
            tests: vec![],
        }
    }
}

impl Sandbox {
    /// Grades one program on its tests (tests run in parallel over the slots). An `Err` is the
    /// sandbox failing (a slot that could not be set up even when rebuilt), never a program's
    /// verdict.
    pub fn grade(&self, code: &str, tests: &[TestCase], limits: &Limits) -> Result<Graded, SandboxError> {
        Ok(self.grade_many(&[(code, tests)], limits)?.pop().expect("one job"))
    }

    /// Grades many programs, parallel over the slots; results in job order.
    pub fn grade_many(&self, jobs: &[(&str, &[TestCase])], limits: &Limits) -> Result<Vec<Graded>, SandboxError> {
        self.grade_many_with(jobs, limits, |_, _| {})
    }

    /// [`grade_many`](Self::grade_many), calling `done(job index, result)` as each program
    /// finishes (for progress and incremental output; called from worker threads). The first
    /// sandbox failure stops the grading and is returned.
    pub fn grade_many_with(
        &self,
        jobs: &[(&str, &[TestCase])],
        limits: &Limits,
        done: impl Fn(usize, &Graded) + Sync,
    ) -> Result<Vec<Graded>, SandboxError> {
        let sched = Mutex::new(crate::schedule::Scheduler::new(
            jobs.iter().map(|(_, t)| t.len()).collect(),
            limits,
        ));
        let failed: Mutex<Option<SandboxError>> = Mutex::new(None);
        let stopped = || failed.lock().map_or(true, |f| f.is_some());
        std::thread::scope(|s| {
            for _ in 0..self.slots() {
                s.spawn(|| {
                    let next = || sched.lock().unwrap_or_else(|e| e.into_inner()).next();
                    while !stopped() {
                        let Some((job, test)) = next() else { break };
                        let (code, tests) = jobs[job];
                        let result = match self.run_test(code, tests.get(test), limits) {
                            Ok(r) => r,
                            Err(e) => {
                                failed.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                                break;
                            }
                        };
                        let finished = sched
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .record(job, test, result);
                        if let Some(graded) = finished {
                            done(job, &graded);
                        }
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        Ok(sched
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .into_results())
    }

    /// Runs one test (or, with `None`, only the compile check of a program without tests).
    /// A run that fails to start (the slot or harness broken) is tried once more (each run
    /// rebuilds what changed); a second failure is the sandbox's error, not the program's.
    fn run_test(&self, code: &str, test: Option<&TestCase>, limits: &Limits) -> Result<TestResult, SandboxError> {
        let (mode, fn_name, input) = match test {
            None => ("stdin", None, ""),
            Some(TestCase::Stdin { input, .. }) => ("stdin", None, input.as_str()),
            Some(TestCase::Call { fn_name, input, .. }) => {
                ("call", Some(fn_name.as_str()), input.as_str())
            }
        };
        let header = serde_json::json!({
            "mode": mode, "fn_name": fn_name, "check_only": test.is_none(),
            "code_len": code.len(), "cap": limits.output_bytes,
        });
        let mut stdin = header.to_string().into_bytes();
        stdin.push(b'\n');
        stdin.extend_from_slice(code.as_bytes());
        stdin.extend_from_slice(input.as_bytes());
        let run = RunLimits {
            wall: limits.per_test + limits.startup_grace,
            cpu: limits.per_test + limits.startup_grace,
            memory_bytes: limits.memory_bytes,
            stdout_bytes: limits.output_bytes + (64 << 10),
            ..RunLimits::default()
        };
        let args = self.harness_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self
            .run_python(&args, &stdin, &run)
            .or_else(|_| self.run_python(&args, &stdin, &run))?;
        Ok(judge(&out, test, limits))
    }

    /// Grades `print(input())` once: the harness must work under the probed layers.
    pub(crate) fn self_test(&self) -> Result<(), SandboxError> {
        let tests = [TestCase::Stdin {
            input: "kiln\n".into(),
            output: "kiln\n".into(),
        }];
        let g = self.grade("print(input())", &tests, &Limits::default())?;
        if g.verdict != Verdict::Accepted {
            let detail = g
                .tests
                .first()
                .map(|t| t.detail.clone())
                .unwrap_or_default();
            return Err(SandboxError::Spawn(format!(
                "self-test: a trivial program got {} under {} ({detail})",
                g.verdict,
                self.protections().summary()
            )));
        }
        Ok(())
    }
}

/// The harness's result frame.
#[derive(Deserialize)]
struct Frame {
    status: String,
    exc: Option<String>,
    #[serde(default)]
    msg: String,
    /// The harness's own measurement, which the program could forge: never used for verdicts.
    #[allow(dead_code)]
    time: Option<f64>,
    len: usize,
}

/// Finds the frame: the last magic whose header parses and whose payload ends the output.
fn parse_frame(stdout: &[u8]) -> Option<(Frame, &[u8])> {
    let starts: Vec<usize> = stdout
        .windows(RESULT_MAGIC.len())
        .enumerate()
        .filter(|(_, w)| *w == RESULT_MAGIC)
        .map(|(i, _)| i)
        .collect();
    for &s in starts.iter().rev() {
        let rest = &stdout[s + RESULT_MAGIC.len()..];
        let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
            continue;
        };
        let Ok(frame) = serde_json::from_slice::<Frame>(&rest[..nl]) else {
            continue;
        };
        let payload = &rest[nl + 1..];
        if payload.len() == frame.len {
            return Some((frame, payload));
        }
    }
    None
}

/// Turns a finished process into a verdict.
fn judge(out: &RunOutput, test: Option<&TestCase>, limits: &Limits) -> TestResult {
    let wall = out.wall.as_secs_f64();
    let result = |verdict, time_s, detail: String| TestResult {
        verdict,
        time_s,
        detail,
    };
    let stderr_tail = || {
        let s = String::from_utf8_lossy(&out.stderr);
        s.trim()
            .lines()
            .last()
            .unwrap_or("")
            .chars()
            .take(200)
            .collect::<String>()
    };
    if out.timed_out {
        return result(
            Verdict::TimeLimit,
            wall,
            format!("killed after {wall:.2} s wall"),
        );
    }
    if out.oom_killed {
        return result(
            Verdict::MemoryLimit,
            wall,
            "killed by the cgroup memory limit".into(),
        );
    }
    if out.disk_exceeded {
        return result(
            Verdict::RuntimeError,
            wall,
            "the scratch directory went over its size or file count".into(),
        );
    }
    if out.stdout_overflow {
        return result(Verdict::WrongAnswer, wall, "output over the limit".into());
    }
    let cpu_limit = (limits.per_test + limits.startup_grace).as_secs_f64();
    let Some((frame, payload)) = parse_frame(&out.stdout) else {
        return match out.exit {
            Exit::Signal(libc::SIGXCPU) => {
                result(Verdict::TimeLimit, wall, "CPU time limit".into())
            }
            Exit::Signal(libc::SIGKILL) if out.cpu.as_secs_f64() >= cpu_limit.floor() => {
                result(Verdict::TimeLimit, wall, "CPU time limit".into())
            }
            Exit::Signal(s) => result(
                Verdict::RuntimeError,
                wall,
                format!("killed by signal {s} {}", stderr_tail()),
            ),
            Exit::Code(c) => result(
                Verdict::RuntimeError,
                wall,
                format!("exit code {c} without a result: {}", stderr_tail()),
            ),
        };
    };
    // the frame's own time is the program's word: not used
    let time = host_time(out);
    let exc = || format!("{}: {}", frame.exc.clone().unwrap_or_default(), frame.msg);
    match frame.status.as_str() {
        "compile_error" => result(Verdict::CompileError, time, exc()),
        "memory" => result(Verdict::MemoryLimit, time, exc()),
        "error" => result(Verdict::RuntimeError, time, exc()),
        "overflow" => result(Verdict::WrongAnswer, time, frame.msg.clone()),
        "ok" if time > limits.per_test.as_secs_f64() => result(
            Verdict::TimeLimit,
            time,
            format!("ran {time:.2} s (host clock)"),
        ),
        "ok" => {
            let (verdict, detail) = check_answer(payload, test);
            result(verdict, time, detail)
        }
        other => result(
            Verdict::RuntimeError,
            time,
            format!("harness status {other:?}"),
        ),
    }
}

/// The run time on the host's clock: from the first byte on stdout (the harness's start signal,
/// written before any of the timed code runs, so a program can only move it earlier) to the exit
/// of the process (which no program can move earlier); the whole wall time when either is missing.
fn host_time(out: &RunOutput) -> f64 {
    match (out.first_output, out.exited) {
        (Some(start), Some(end)) => end.saturating_sub(start).as_secs_f64(),
        _ => out.wall.as_secs_f64(),
    }
}

/// Compares a finished test's output with the expected one.
fn check_answer(payload: &[u8], test: Option<&TestCase>) -> (Verdict, String) {
    match test {
        None => (Verdict::Accepted, String::new()),
        Some(TestCase::Stdin { output, .. }) => {
            let printed = String::from_utf8_lossy(payload);
            match compare_stdout(&printed, output) {
                (Comparison::Equal, _) => (Verdict::Accepted, String::new()),
                (Comparison::Mismatch, why) => (Verdict::WrongAnswer, why),
                (Comparison::Error, why) => (Verdict::RuntimeError, why),
            }
        }
        Some(TestCase::Call { output, .. }) => {
            let expected = match pyvalue::parse_json(output) {
                Ok(v) => v,
                Err(e) => {
                    return (
                        Verdict::RuntimeError,
                        format!("expected output is not JSON: {e}"),
                    );
                }
            };
            match pyvalue::decode_prediction(payload) {
                Ok(got) if pyvalue::py_eq(&got, &expected) => (Verdict::Accepted, String::new()),
                Ok(got) => (
                    Verdict::WrongAnswer,
                    format!("returned {}", truncate(&format!("{got:?}"), 200)),
                ),
                Err(e) => (
                    Verdict::WrongAnswer,
                    format!("unreadable return value: {e}"),
                ),
            }
        }
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_serialise_as_snake_case() {
        for v in [
            Verdict::Accepted,
            Verdict::WrongAnswer,
            Verdict::TimeLimit,
            Verdict::MemoryLimit,
            Verdict::RuntimeError,
            Verdict::CompileError,
            Verdict::NoCode,
        ] {
            assert_eq!(
                serde_json::to_string(&v).unwrap(),
                format!("\"{}\"", v.as_str())
            );
            assert_eq!(
                serde_json::from_str::<Verdict>(&format!("\"{v}\"")).unwrap(),
                v
            );
        }
        assert_eq!(Verdict::WrongAnswer.as_str(), "wrong_answer");
    }

    #[test]
    fn the_result_frame_is_the_last_one_that_ends_the_output() {
        let mut out = b"junk\0KILN-RESULT\0{bad\n".to_vec();
        out.extend_from_slice(b"\0KILN-RESULT\0{\"status\":\"ok\",\"exc\":null,\"msg\":\"\",\"time\":0.5,\"len\":3}\nabc");
        let (frame, payload) = parse_frame(&out).unwrap();
        assert_eq!(
            (frame.status.as_str(), frame.time, payload),
            ("ok", Some(0.5), &b"abc"[..])
        );
        out.push(b'x'); // payload longer than announced: no frame
        assert!(parse_frame(&out).is_none());
    }
}
