//! Grading completions: extract the program ([`super::extract`]), run it on the problem's tests
//! in the sandbox ([`kiln_sandbox::Sandbox::grade_many_with`], parallel over its slots), and
//! record the verdicts. A completion without code is `no_code` and runs nothing.
//!
//! One graded sample is written as
//! `{"question_id", "index", "verdict", "passed", "total", "tests": [{"verdict", "time_s"}, …]}`
//! (a test's `detail` — the exception, the first differing line — is added when it failed);
//! `kiln code grade` writes exactly these lines, `kiln eval code` adds the completion, the
//! extracted code and the token count.

use kiln_sandbox::{Graded, Limits, Sandbox, TestCase, TestResult, Verdict};
use serde::{Deserialize, Serialize};

use super::extract::Extraction;

/// One completion to grade and the tests of its problem.
#[derive(Debug, Clone, Copy)]
pub struct Submission<'a> {
    pub completion: &'a str,
    pub tests: &'a [TestCase],
}

/// A graded completion: the code that ran (`""` when none was found) and its grade.
#[derive(Debug, Clone, PartialEq)]
pub struct GradedSample {
    pub code: String,
    pub graded: Graded,
}

impl GradedSample {
    /// Every test passed.
    pub fn passed(&self) -> bool {
        self.graded.verdict == Verdict::Accepted
    }
}

/// Extracts and grades `submissions`, in parallel; results in order. `done(index, sample)` is
/// called as each finishes (from worker threads), for progress. An error is the sandbox
/// failing, never charged to a program.
pub fn grade_submissions(
    sandbox: &Sandbox,
    submissions: &[Submission<'_>],
    limits: &Limits,
    extraction: Extraction,
    done: impl Fn(usize, &Graded) + Sync,
) -> Result<Vec<GradedSample>, kiln_sandbox::SandboxError> {
    let codes: Vec<String> = submissions.iter().map(|s| extraction.extract(s.completion)).collect();
    let runnable: Vec<usize> = (0..submissions.len()).filter(|&i| !codes[i].is_empty()).collect();
    for (i, s) in submissions.iter().enumerate() {
        if codes[i].is_empty() {
            done(i, &Graded::no_code(s.tests.len()));
        }
    }
    let jobs: Vec<(&str, &[TestCase])> = runnable.iter().map(|&i| (codes[i].as_str(), submissions[i].tests)).collect();
    let mut graded = sandbox.grade_many_with(&jobs, limits, |job, g| done(runnable[job], g))?.into_iter();
    let mut results = Vec::with_capacity(submissions.len());
    for (s, code) in submissions.iter().zip(codes) {
        let graded = if code.is_empty() { Graded::no_code(s.tests.len()) } else { graded.next().expect("one grade per job") };
        results.push(GradedSample { code, graded });
    }
    Ok(results)
}

/// One test's line in the output files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestRecord {
    pub verdict: Verdict,
    /// The program's own run time (s, to the microsecond).
    pub time_s: f64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl From<&TestResult> for TestRecord {
    fn from(t: &TestResult) -> Self {
        Self { verdict: t.verdict, time_s: (t.time_s * 1e6).round() / 1e6, detail: t.detail.clone() }
    }
}

/// The line of one graded completion (`kiln code grade`'s output; see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GradeRecord {
    pub question_id: String,
    /// The completion's index among the problem's completions.
    pub index: usize,
    pub verdict: Verdict,
    pub passed: usize,
    pub total: usize,
    pub tests: Vec<TestRecord>,
}

impl GradeRecord {
    /// The record of `graded`, completion `index` of `question_id`.
    pub fn new(question_id: &str, index: usize, graded: &Graded) -> Self {
        Self {
            question_id: question_id.to_owned(),
            index,
            verdict: graded.verdict,
            passed: graded.passed,
            total: graded.total,
            tests: graded.tests.iter().map(TestRecord::from).collect(),
        }
    }
}
