//! kiln's grading against LiveCodeBench's own: `tests/fixtures/lcb_fixture.json` holds what LCB's
//! `check_correctness` (commit 28fef95) returned for a table of printed outputs and programs
//! (made by `tests/fixtures/make_lcb_fixture.py`); kiln must agree on every entry.

mod common;

use std::time::Duration;

use kiln_sandbox::{Comparison, Limits, TestCase, Verdict, compare_stdout};
use serde_json::Value;

fn fixture() -> Value {
    let text = include_str!("fixtures/lcb_fixture.json");
    serde_json::from_str(text).expect("lcb_fixture.json parses")
}

/// LCB's per-test code as kiln's verdict (`compile` when the program does not compile: LCB
/// reports -4 for it, kiln compile_error).
fn expected_verdict(code: &Value, compile: bool) -> Verdict {
    match code {
        Value::Bool(true) => Verdict::Accepted,
        Value::Bool(false) => Verdict::WrongAnswer,
        v => match v.as_i64() {
            Some(-2) => Verdict::WrongAnswer,
            Some(-3) | Some(-1) => Verdict::TimeLimit,
            Some(-4) if compile => Verdict::CompileError,
            Some(-4) => Verdict::RuntimeError,
            other => panic!("unknown LCB result {other:?}"),
        },
    }
}

#[test]
fn comparison_matches_lcb() {
    let f = fixture();
    let cases = f["compare"].as_array().unwrap();
    assert!(cases.len() >= 30);
    for c in cases {
        let (printed, expected) = (
            c["printed"].as_str().unwrap(),
            c["expected"].as_str().unwrap(),
        );
        let want = match &c["lcb"] {
            Value::Bool(true) => Comparison::Equal,
            v if v.as_i64() == Some(-2) => Comparison::Mismatch,
            v if v.as_i64() == Some(-4) => Comparison::Error,
            v => panic!("unexpected {v}"),
        };
        let (got, why) = compare_stdout(printed, expected);
        assert_eq!(got, want, "{printed:?} vs {expected:?} ({why})");
    }
}

#[test]
fn programs_grade_as_in_lcb() {
    let f = fixture();
    let sandbox = common::sandbox();
    let programs = f["programs"].as_array().unwrap();
    let mut jobs: Vec<(String, Vec<TestCase>, Value, u64, bool)> = Vec::new();
    for p in programs {
        let fn_name = p["fn_name"].as_str();
        let tests = p["tests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let (input, output) = (
                    t["input"].as_str().unwrap().to_string(),
                    t["output"].as_str().unwrap().to_string(),
                );
                match fn_name {
                    Some(f) => TestCase::Call {
                        fn_name: f.to_string(),
                        input,
                        output,
                    },
                    None => TestCase::Stdin { input, output },
                }
            })
            .collect();
        let name = p["name"].as_str().unwrap();
        jobs.push((
            p["code"].as_str().unwrap().to_string(),
            tests,
            p.clone(),
            p["timeout"].as_u64().unwrap(),
            name.contains("syntax"),
        ));
    }
    // One grade_many per time limit (LCB's timeout differs per entry).
    let mut failures = Vec::new();
    for timeout in [2, 6] {
        let group: Vec<&(String, Vec<TestCase>, Value, u64, bool)> =
            jobs.iter().filter(|j| j.3 == timeout).collect();
        let limits = Limits {
            per_test: Duration::from_secs(timeout),
            ..Limits::default()
        };
        let refs: Vec<(&str, &[TestCase])> = group
            .iter()
            .map(|j| (j.0.as_str(), j.1.as_slice()))
            .collect();
        let graded = sandbox.grade_many(&refs, &limits).unwrap();
        for (j, g) in group.iter().zip(&graded) {
            let lcb = j.2["lcb"].as_array().unwrap();
            let name = j.2["name"].as_str().unwrap();
            let want: Vec<Verdict> = lcb.iter().map(|c| expected_verdict(c, j.4)).collect();
            let got: Vec<Verdict> = g.tests.iter().map(|t| t.verdict).collect();
            let want_overall = want
                .iter()
                .copied()
                .find(|v| *v != Verdict::Accepted)
                .unwrap_or(Verdict::Accepted);
            let passed = want.iter().filter(|v| **v == Verdict::Accepted).count();
            if got != want
                || g.verdict != want_overall
                || g.passed != passed
                || g.total != j.1.len()
            {
                let details: Vec<&str> = g.tests.iter().map(|t| t.detail.as_str()).collect();
                failures.push(format!("{name}: LCB {want:?}, kiln {got:?} ({details:?})"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "kiln disagrees with LCB:\n{}",
        failures.join("\n")
    );
    assert!(jobs.len() >= 45);
}

/// LCB's `reliability_guard` nulls these (testing_util.py) and disables `faulthandler`; the
/// harness must too, in both modes, however the program reaches them, in the full sandbox and in
/// the fallback one (a run keeping kiln's uid).
#[test]
fn reliability_guard_nulls_what_lcb_nulls() {
    let nulled = "import os, sys, builtins, shutil, subprocess\nfrom subprocess import Popen\n\
import importlib, faulthandler\nfound = [shutil.rmtree, shutil.move, shutil.chown, subprocess.Popen, Popen, builtins.help, builtins.quit]\n\
found += [getattr(os, n) for n in 'kill system putenv remove removedirs rmdir fchdir setuid fork forkpty killpg rename renames truncate replace unlink fchmod fchown chmod chown chroot lchflags lchmod lchown getcwd chdir'.split()]\n\
found += [sys.modules[m] for m in ('ipdb', 'joblib', 'resource', 'psutil', 'tkinter')]\n\
import asyncio.subprocess\nfound.append(subprocess.Popen)\n\
print(sum(f is not None for f in found), len(found), os.environ['OMP_NUM_THREADS'], faulthandler.is_enabled())";
    let want = "0 39 1 False";
    for sandbox in [common::sandbox(), common::fallback_sandbox()] {
        guarded(sandbox, nulled, want);
    }
}

fn guarded(sandbox: &kiln_sandbox::Sandbox, nulled: &str, want: &str) {
    let g = sandbox.grade(
        nulled,
        &[TestCase::Stdin {
            input: String::new(),
            output: want.into(),
        }],
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(g.verdict, Verdict::Accepted, "{g:#?}");
    let call = format!(
        "def f(x):\n    {}\n    return out\n",
        nulled
            .replace('\n', "\n    ")
            .replace("print(", "out = (")
            .replace(
                "faulthandler.is_enabled())",
                "faulthandler.is_enabled())\n    out = ' '.join(map(str, out))"
            )
    );
    let g = sandbox.grade(
        &call,
        &[TestCase::Call {
            fn_name: "f".into(),
            input: "1".into(),
            output: format!("\"{want}\""),
        }],
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(g.verdict, Verdict::Accepted, "{g:#?}");
}
