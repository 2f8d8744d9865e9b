//! Which test runs next: the slots take tests of programs that have none running first, then
//! further tests of running programs (so one program with many tests still uses every slot);
//! tests after a known failure are skipped when grading stops at the first failure. Results are
//! the same as running the tests one after another.

use std::time::Duration;

use crate::grade::{Graded, Limits, TestResult, Verdict};

struct Job {
    /// Number of tests (0: one compile-check run).
    total: usize,
    next: usize,
    in_flight: usize,
    results: Vec<Option<TestResult>>,
    first_fail: Option<usize>,
    graded: Option<Graded>,
}

impl Job {
    fn units(&self) -> usize {
        self.total.max(1)
    }

    /// Units that matter: all of them, or those up to the first known failure.
    fn needed(&self, stop: bool) -> usize {
        match (stop, self.first_fail) {
            (true, Some(f)) => f + 1,
            _ => self.units(),
        }
    }
}

pub(crate) struct Scheduler {
    jobs: Vec<Job>,
    /// First job that may still have units to hand out.
    lo: usize,
    stop: bool,
    per_test: Duration,
    global: Option<Duration>,
}

impl Scheduler {
    pub(crate) fn new(totals: Vec<usize>, limits: &Limits) -> Self {
        let jobs = totals
            .into_iter()
            .map(|total| Job {
                total,
                next: 0,
                in_flight: 0,
                results: vec![None; total.max(1)],
                first_fail: None,
                graded: None,
            })
            .collect();
        Self {
            jobs,
            lo: 0,
            stop: limits.stop_at_first_failure,
            per_test: limits.per_test,
            global: limits.global,
        }
    }

    /// The next (job, test) to run, if any.
    pub(crate) fn next(&mut self) -> Option<(usize, usize)> {
        let stop = self.stop;
        while self.lo < self.jobs.len()
            && self.jobs[self.lo].next >= self.jobs[self.lo].needed(stop)
        {
            self.lo += 1;
        }
        let open = |j: &Job| j.next < j.needed(stop);
        let pick = (self.lo..self.jobs.len())
            .find(|&i| open(&self.jobs[i]) && self.jobs[i].in_flight == 0)
            .or_else(|| (self.lo..self.jobs.len()).find(|&i| open(&self.jobs[i])))?;
        let job = &mut self.jobs[pick];
        job.next += 1;
        job.in_flight += 1;
        Some((pick, job.next - 1))
    }

    /// Records a result; returns the program's grade when this completes it.
    pub(crate) fn record(&mut self, job: usize, test: usize, result: TestResult) -> Option<Graded> {
        let (stop, global) = (self.stop, self.global_limit(job));
        let j = &mut self.jobs[job];
        j.in_flight -= 1;
        if result.verdict != Verdict::Accepted {
            j.first_fail = Some(j.first_fail.map_or(test, |f| f.min(test)));
        }
        j.results[test] = Some(result);
        let needed = j.needed(stop);
        if j.graded.is_some() || j.results[..needed].iter().any(Option::is_none) {
            return None;
        }
        let mut tests: Vec<TestResult> = j.results[..needed].iter().flatten().cloned().collect();
        if j.total == 0 && tests.iter().all(|t| t.verdict == Verdict::Accepted) {
            tests.clear(); // the compile check is not a test
        }
        let graded = grade_of(tests, j.total, global);
        j.graded = Some(graded.clone());
        Some(graded)
    }

    fn global_limit(&self, job: usize) -> Duration {
        self.global.unwrap_or_else(|| {
            // LCB: (timeout + 1) * len(inputs) + 5, with the integer timeout in seconds
            let t = self.per_test.as_secs_f64().ceil();
            Duration::from_secs_f64((t + 1.0) * self.jobs[job].total as f64 + 5.0)
        })
    }

    pub(crate) fn into_results(self) -> Vec<Graded> {
        self.jobs
            .into_iter()
            .map(|j| {
                j.graded
                    .expect("every job is graded once the workers are done")
            })
            .collect()
    }
}

/// The program's grade from its test results in order.
fn grade_of(mut tests: Vec<TestResult>, total: usize, global: Duration) -> Graded {
    let mut spent = 0.0;
    for (i, t) in tests.iter_mut().enumerate() {
        spent += t.time_s;
        if spent > global.as_secs_f64() {
            // LCB's global timeout: the sample counts as all tests failed
            t.verdict = Verdict::TimeLimit;
            t.detail = format!(
                "over the per-program limit of {:.0} s",
                global.as_secs_f64()
            );
            tests.truncate(i + 1);
            return Graded {
                verdict: Verdict::TimeLimit,
                passed: 0,
                total,
                tests,
            };
        }
    }
    let passed = tests
        .iter()
        .filter(|t| t.verdict == Verdict::Accepted)
        .count();
    let verdict = tests
        .iter()
        .find(|t| t.verdict != Verdict::Accepted)
        .map_or(Verdict::Accepted, |t| t.verdict);
    Graded {
        verdict,
        passed,
        total,
        tests,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(v: Verdict) -> TestResult {
        TestResult {
            verdict: v,
            time_s: 0.1,
            detail: String::new(),
        }
    }

    #[test]
    fn stops_at_first_failure_and_skips_later_tests() {
        let mut s = Scheduler::new(vec![3], &Limits::default());
        assert_eq!(s.next(), Some((0, 0)));
        assert_eq!(s.next(), Some((0, 1)));
        assert!(s.record(0, 1, r(Verdict::WrongAnswer)).is_none()); // test 0 still running
        assert_eq!(s.next(), None); // test 2 comes after a failure
        let g = s.record(0, 0, r(Verdict::Accepted)).unwrap();
        assert_eq!(
            (g.verdict, g.passed, g.total, g.tests.len()),
            (Verdict::WrongAnswer, 1, 3, 2)
        );
    }

    #[test]
    fn prefers_programs_without_running_tests() {
        let mut s = Scheduler::new(vec![2, 2], &Limits::default());
        assert_eq!(s.next(), Some((0, 0)));
        assert_eq!(s.next(), Some((1, 0)));
        assert_eq!(s.next(), Some((0, 1)));
    }

    #[test]
    fn all_tests_run_without_stopping() {
        let limits = Limits {
            stop_at_first_failure: false,
            ..Limits::default()
        };
        let mut s = Scheduler::new(vec![2], &limits);
        s.next();
        s.next();
        assert!(s.record(0, 0, r(Verdict::TimeLimit)).is_none());
        let g = s.record(0, 1, r(Verdict::Accepted)).unwrap();
        assert_eq!(
            (g.verdict, g.passed, g.tests.len()),
            (Verdict::TimeLimit, 1, 2)
        );
    }

    #[test]
    fn global_limit_fails_everything() {
        let g = grade_of(
            vec![r(Verdict::Accepted); 3],
            3,
            Duration::from_secs_f64(0.25),
        );
        assert_eq!(
            (g.verdict, g.passed, g.tests.len()),
            (Verdict::TimeLimit, 0, 3)
        );
    }
}
