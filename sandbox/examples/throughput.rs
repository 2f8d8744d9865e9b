//! Grading throughput and per-test overhead:
//! `cargo run --release -p kiln-sandbox --example throughput [-- N]`.
//!
//! Prints, as medians over 5 rounds of N runs each: a bare `python3 -I -S -c pass` (no sandbox),
//! the same under every sandbox layer, one graded test of a trivial accepted program (harness,
//! LCB's imports, comparison), and tests per second on all slots. Figures taken while other work
//! runs on the machine are only indicative.

use std::process::{Command, Stdio};
use std::time::Instant;

use kiln_sandbox::{Limits, RunLimits, Sandbox, SandboxOptions, TestCase, Verdict};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(40);
    let sandbox = Sandbox::new(SandboxOptions::default()).expect("sandbox");
    println!("{}", sandbox.protections().summary());
    let python = sandbox.python().to_path_buf();
    let tests = [TestCase::Stdin {
        input: "1 2\n".into(),
        output: "3\n".into(),
    }];
    let code = "a, b = map(int, input().split())\nprint(a + b)";
    let limits = Limits::default();
    // Interleaved rounds (bare, confined, graded, parallel), so load changes hit all alike.
    let time_ms = |f: &dyn Fn()| {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        t.elapsed().as_secs_f64() * 1e3 / n as f64
    };
    let jobs: Vec<(&str, &[TestCase])> = (0..n * sandbox.slots())
        .map(|_| (code, &tests[..]))
        .collect();
    let (mut bare, mut confined, mut graded, mut rate) = (vec![], vec![], vec![], vec![]);
    for _ in 0..7 {
        bare.push(time_ms(&|| {
            let s = Command::new(&python)
                .args(["-I", "-S", "-c", "pass"])
                .stdin(Stdio::null())
                .status()
                .unwrap();
            assert!(s.success());
        }));
        confined.push(time_ms(&|| {
            let out = sandbox
                .run_python(&["-c", "pass"], b"", &RunLimits::default())
                .unwrap();
            assert_eq!(out.exit, kiln_sandbox::Exit::Code(0));
        }));
        graded.push(time_ms(&|| {
            assert_eq!(
                sandbox.grade(code, &tests, &limits).verdict,
                Verdict::Accepted
            );
        }));
        let t = Instant::now();
        let g = sandbox.grade_many(&jobs, &limits);
        assert!(g.iter().all(|g| g.verdict == Verdict::Accepted));
        rate.push(jobs.len() as f64 / t.elapsed().as_secs_f64());
    }
    let (bare, confined, graded, rate) =
        (median(bare), median(confined), median(graded), median(rate));
    println!("bare python3 -I -S -c pass            {bare:6.1} ms");
    println!(
        "same, confined (all layers)           {confined:6.1} ms  (+{:.1} ms)",
        confined - bare
    );
    println!(
        "one graded test (trivial, accepted)   {graded:6.1} ms  (+{:.1} ms over bare)",
        graded - bare
    );
    println!(
        "throughput on {} slots                 {rate:6.1} tests/s",
        sandbox.slots()
    );
}
