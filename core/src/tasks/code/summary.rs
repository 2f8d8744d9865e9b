//! pass@k over graded samples, overall and per difficulty and platform (spec code-sft.md §8.7,
//! LiveCodeBench `lcb_runner/evaluation/pass_k_utils.py:compute_metrics_from_results`).
//!
//! A problem with `n` samples of which `c` pass gets the unbiased estimate
//! `1 − C(n−c, k) / C(n, k)` (the Codex estimator; c/n for k = 1), and pass@k is its mean over
//! problems. As in LiveCodeBench, pass@k is reported only when every problem has at least k
//! samples. `no_code` counts samples from which no program was extracted.

use std::collections::BTreeMap;

use kiln_sandbox::Verdict;
use serde::ser::{Serialize, SerializeMap, Serializer};

use crate::metrics::pass_probability;

/// The pass@k of LiveCodeBench's reports (`k_list = [1, 5]`) and of n = 10 samples.
pub const DEFAULT_KS: [u64; 3] = [1, 5, 10];

/// One graded sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleOutcome {
    pub verdict: Verdict,
}

impl SampleOutcome {
    /// Every test passed.
    pub fn passed(self) -> bool {
        self.verdict == Verdict::Accepted
    }

    /// A program was extracted.
    pub fn has_code(self) -> bool {
        self.verdict != Verdict::NoCode
    }
}

/// A problem's graded samples and its labels.
#[derive(Debug, Clone, PartialEq)]
pub struct ProblemOutcome {
    pub question_id: String,
    pub difficulty: Option<String>,
    pub platform: Option<String>,
    pub samples: Vec<SampleOutcome>,
}

impl ProblemOutcome {
    fn correct(&self) -> usize {
        self.samples.iter().filter(|s| s.passed()).count()
    }
}

/// pass@k and counts over a set of problems.
#[derive(Debug, Clone, PartialEq)]
pub struct PassSummary {
    pub problems: usize,
    pub samples: usize,
    /// Passing samples (Σ c_i).
    pub correct: usize,
    pub no_code: usize,
    /// `(k, pass@k)` for the requested ks that every problem has enough samples for.
    pub pass_at_k: Vec<(u64, f64)>,
    /// Samples per verdict (first failing test's verdict), by name.
    pub verdicts: BTreeMap<&'static str, usize>,
}

impl PassSummary {
    /// pass@`k`, if it was computed.
    pub fn pass_at(&self, k: u64) -> Option<f64> {
        self.pass_at_k.iter().find(|(kk, _)| *kk == k).map(|(_, v)| *v)
    }
}

impl Serialize for PassSummary {
    /// `{"pass@1", "pass@5", …, "problems", "samples", "correct", "no_code", "verdicts"}`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(5 + self.pass_at_k.len()))?;
        for (k, value) in &self.pass_at_k {
            map.serialize_entry(&format!("pass@{k}"), value)?;
        }
        map.serialize_entry("problems", &self.problems)?;
        map.serialize_entry("samples", &self.samples)?;
        map.serialize_entry("correct", &self.correct)?;
        map.serialize_entry("no_code", &self.no_code)?;
        map.serialize_entry("verdicts", &self.verdicts)?;
        map.end()
    }
}

/// A problem's counts: what standard errors and paired comparisons of runs need (spec §9).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProblemCount {
    pub question_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub difficulty: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    /// Samples.
    pub n: usize,
    /// Passing samples.
    pub correct: usize,
    pub no_code: usize,
}

/// The summary of a code evaluation: overall, per difficulty and per platform (problems without
/// the label are in no group), and per problem in problem order.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CodeSummary {
    pub overall: PassSummary,
    pub by_difficulty: BTreeMap<String, PassSummary>,
    pub by_platform: BTreeMap<String, PassSummary>,
    pub per_problem: Vec<ProblemCount>,
}

/// pass@k for `ks` over `outcomes` (see the module docs).
pub fn pass_summary<'a>(outcomes: impl IntoIterator<Item = &'a ProblemOutcome>, ks: &[u64]) -> PassSummary {
    let outcomes: Vec<&ProblemOutcome> = outcomes.into_iter().collect();
    let pass_at_k = ks
        .iter()
        .copied()
        .filter(|&k| k > 0 && !outcomes.is_empty() && outcomes.iter().all(|o| o.samples.len() as u64 >= k))
        .map(|k| {
            let total: f64 = outcomes.iter().map(|o| pass_probability(o.samples.len() as u64, o.correct() as u64, k)).sum();
            (k, total / outcomes.len() as f64)
        })
        .collect();
    let mut verdicts = BTreeMap::new();
    for sample in outcomes.iter().flat_map(|o| &o.samples) {
        *verdicts.entry(sample.verdict.as_str()).or_default() += 1;
    }
    PassSummary {
        problems: outcomes.len(),
        samples: outcomes.iter().map(|o| o.samples.len()).sum(),
        correct: outcomes.iter().map(|o| o.correct()).sum(),
        no_code: outcomes.iter().flat_map(|o| &o.samples).filter(|s| !s.has_code()).count(),
        pass_at_k,
        verdicts,
    }
}

/// The overall, per-difficulty and per-platform summaries and the per-problem counts.
pub fn summarize(outcomes: &[ProblemOutcome], ks: &[u64]) -> CodeSummary {
    let mut by_difficulty: BTreeMap<String, Vec<&ProblemOutcome>> = BTreeMap::new();
    let mut by_platform: BTreeMap<String, Vec<&ProblemOutcome>> = BTreeMap::new();
    for outcome in outcomes {
        if let Some(d) = &outcome.difficulty {
            by_difficulty.entry(d.clone()).or_default().push(outcome);
        }
        if let Some(p) = &outcome.platform {
            by_platform.entry(p.clone()).or_default().push(outcome);
        }
    }
    let group = |groups: BTreeMap<String, Vec<&ProblemOutcome>>| {
        groups.into_iter().map(|(name, members)| (name, pass_summary(members, ks))).collect()
    };
    CodeSummary {
        overall: pass_summary(outcomes, ks),
        by_difficulty: group(by_difficulty),
        by_platform: group(by_platform),
        per_problem: outcomes
            .iter()
            .map(|o| ProblemCount {
                question_id: o.question_id.clone(),
                difficulty: o.difficulty.clone(),
                platform: o.platform.clone(),
                n: o.samples.len(),
                correct: o.correct(),
                no_code: o.samples.iter().filter(|s| !s.has_code()).count(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(id: &str, difficulty: &str, platform: &str, n: usize, c: usize, no_code: usize) -> ProblemOutcome {
        let verdict = |i| match i {
            i if i < c => Verdict::Accepted,
            i if i >= n - no_code => Verdict::NoCode,
            _ => Verdict::WrongAnswer,
        };
        let samples = (0..n).map(|i| SampleOutcome { verdict: verdict(i) }).collect();
        ProblemOutcome { question_id: id.into(), difficulty: Some(difficulty.into()), platform: Some(platform.into()), samples }
    }

    #[test]
    fn the_spec_check_values() {
        // n = 10, c = 3: pass@1 = 0.3, pass@5 = 1 − (3/8)(4/9)(5/10) = 0.916667 (spec §8.7).
        let s = pass_summary(&[outcome("a", "easy", "atcoder", 10, 3, 0)], &[1, 5, 10]);
        assert!((s.pass_at(1).unwrap() - 0.3).abs() < 1e-15);
        assert!((s.pass_at(5).unwrap() - (1.0 - (3.0 / 8.0) * (4.0 / 9.0) * (5.0 / 10.0))).abs() < 1e-12);
        assert_eq!(s.pass_at(10), Some(1.0));

        // 175 problems × 10 samples with 169 passing samples: pass@1 = 169/1750 = 0.0965714 (§9).
        let mut remaining = 169;
        let outcomes: Vec<ProblemOutcome> = (0..175)
            .map(|i| {
                let c = remaining.min(i % 11);
                remaining -= c;
                outcome(&format!("q{i}"), "hard", "leetcode", 10, c, 0)
            })
            .collect();
        assert_eq!(remaining, 0);
        let s = pass_summary(&outcomes, &[1]);
        assert_eq!((s.problems, s.samples, s.correct), (175, 1750, 169));
        assert!((s.pass_at(1).unwrap() - 169.0 / 1750.0).abs() < 1e-15);
    }

    #[test]
    fn groups_counts_and_the_k_rule() {
        let outcomes = vec![
            outcome("e1", "easy", "atcoder", 4, 4, 0),
            outcome("e2", "easy", "leetcode", 4, 0, 3),
            outcome("h1", "hard", "atcoder", 4, 1, 1),
            outcome("m1", "medium", "codeforces", 2, 1, 0),
        ];
        let s = summarize(&outcomes, &[1, 2, 4]);
        assert_eq!((s.overall.problems, s.overall.samples, s.overall.correct, s.overall.no_code), (4, 14, 6, 4));
        // k = 4 is dropped overall because m1 has only 2 samples (LiveCodeBench's rule).
        assert_eq!(s.overall.pass_at_k.iter().map(|p| p.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((s.overall.pass_at(1).unwrap() - (1.0 + 0.0 + 0.25 + 0.5) / 4.0).abs() < 1e-15);
        // pass@2 of h1: 1 − C(3,2)/C(4,2) = 0.5; of m1: 1.
        assert!((s.overall.pass_at(2).unwrap() - (1.0 + 0.0 + 0.5 + 1.0) / 4.0).abs() < 1e-15);
        let easy = &s.by_difficulty["easy"];
        assert_eq!((easy.problems, easy.no_code, easy.pass_at(4)), (2, 3, Some(0.5)));
        assert_eq!(s.by_difficulty.keys().map(String::as_str).collect::<Vec<_>>(), vec!["easy", "hard", "medium"]);
        assert_eq!(s.by_platform["atcoder"].correct, 5);
        let h1 = ProblemCount { question_id: "h1".into(), difficulty: Some("hard".into()), platform: Some("atcoder".into()), n: 4, correct: 1, no_code: 1 };
        assert_eq!(s.per_problem[2], h1);
        assert_eq!(s.overall.verdicts, BTreeMap::from([("accepted", 6), ("no_code", 4), ("wrong_answer", 4)]));
        let json = serde_json::to_string(&s.by_platform["codeforces"]).unwrap();
        assert_eq!(json, r#"{"pass@1":0.5,"pass@2":1.0,"problems":1,"samples":2,"correct":1,"no_code":0,"verdicts":{"accepted":1,"wrong_answer":1}}"#);
        assert!(pass_summary(&[], &[1]).pass_at_k.is_empty());
    }
}
