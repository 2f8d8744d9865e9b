//! Grading throughput and per-test overhead:
//! `cargo run --release -p kiln-sandbox --example throughput [-- N]`.
//!
//! Prints medians over 7 interleaved rounds of N runs each (so load changes hit every line
//! alike): a bare `python3 -I -S -c pass`; the harness without the sandbox (interpreter start plus
//! LCB's imports, one trivial test); a bare `-c pass` under every sandbox layer; one graded test
//! of a trivial accepted program (everything); and tests per second on all slots. Figures taken
//! while other work runs on the machine are only indicative.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use kiln_sandbox::{Limits, RunLimits, Sandbox, SandboxOptions, TestCase, Verdict};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Milliseconds per call of `f`, over `n` calls.
fn time_ms(n: usize, f: &dyn Fn()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() * 1e3 / n as f64
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let sandbox = Sandbox::new(SandboxOptions::default()).expect("sandbox");
    println!("{}", sandbox.protections().summary());
    let python = sandbox.python().to_path_buf();
    let tests = [TestCase::Stdin {
        input: "1 2\n".into(),
        output: "3\n".into(),
    }];
    let code = "a, b = map(int, input().split())\nprint(a + b)";
    let limits = Limits::default();
    let jobs: Vec<(&str, &[TestCase])> = (0..n * sandbox.slots())
        .map(|_| (code, &tests[..]))
        .collect();

    let bare = || {
        let s = Command::new(&python)
            .args(["-I", "-S", "-c", "pass"])
            .stdin(Stdio::null())
            .status();
        assert!(s.unwrap().success());
    };
    // The harness unconfined: our own trivial program, so safe to run this way.
    let harness_dir = sandbox.directory().join("harness");
    let header = format!(
        "{{\"mode\": \"stdin\", \"fn_name\": null, \"check_only\": false, \"code_len\": {}, \"cap\": 1024}}\n",
        code.len()
    );
    let harness_input = format!("{header}{code}1 2\n");
    let harness = || {
        let mut child = Command::new(&python)
            .args([
                "-I",
                "-S",
                "-B",
                "-c",
                "import sys; sys.path.insert(0, sys.argv[1]); import kiln_lcb",
            ])
            .arg(&harness_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(harness_input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.stdout.ends_with(b"3\n"),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    };
    let confined = || {
        let out = sandbox
            .run_python(&["-c", "pass"], b"", &RunLimits::default())
            .unwrap();
        assert_eq!(out.exit, kiln_sandbox::Exit::Code(0));
    };
    let graded = || {
        assert_eq!(
            sandbox.grade(code, &tests, &limits).unwrap().verdict,
            Verdict::Accepted
        )
    };

    let mut t: [Vec<f64>; 5] = Default::default();
    for _ in 0..7 {
        t[0].push(time_ms(n, &bare));
        t[1].push(time_ms(n, &harness));
        t[2].push(time_ms(n, &confined));
        t[3].push(time_ms(n, &graded));
        let start = Instant::now();
        let g = sandbox.grade_many(&jobs, &limits).unwrap();
        assert!(g.iter().all(|g| g.verdict == Verdict::Accepted));
        t[4].push(jobs.len() as f64 / start.elapsed().as_secs_f64());
    }
    let [bare, harness, confined, graded, rate] = t.map(median);
    println!("bare python3 -I -S -c pass             {bare:6.1} ms");
    println!(
        "harness unconfined (LCB's imports)     {harness:6.1} ms  (+{:.1} ms)",
        harness - bare
    );
    println!(
        "bare -c pass, confined (all layers)    {confined:6.1} ms  (+{:.1} ms)",
        confined - bare
    );
    println!(
        "one graded test (trivial, accepted)    {graded:6.1} ms  (+{:.1} ms over bare)",
        graded - bare
    );
    println!(
        "throughput on {} slots                  {rate:6.1} tests/s",
        sandbox.slots()
    );
}
