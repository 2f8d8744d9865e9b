//! The code-SFT study's statistics (spec code-sft.md §9): a run's headline figures with the
//! standard error of pass@1 across problems, and the paired per-question comparison of two
//! runs with a bootstrap confidence interval.
//!
//! - **Standard error** of pass@1 = `sd(p_i) / √P`, where `p_i = c_i / n_i` is problem i's pass
//!   rate and `sd` the sample standard deviation (ddof = 1, as lm-evaluation-harness's
//!   `mean_stderr`); it treats the problems as a sample and the samples within a problem as
//!   fixed, so it lies between the binomial and the all-or-nothing extremes of §9.
//! - **Paired differences** `d_i = p_i(B) − p_i(A)` over the questions both runs graded (matched
//!   by `question_id`; the runs must cover the same questions). Their mean is
//!   `pass@1(B) − pass@1(A)`; the paired standard error is `sd(d) / √P` (ddof = 1).
//! - **Bootstrap** over questions: `resamples` times draw P question indices with replacement
//!   and take the mean of their `d_i`; the interval is the `(1 ± level) / 2` percentiles of those
//!   means with numpy's default (linear) interpolation. Indices come from SplitMix64 seeded with
//!   `seed` (`state += 0x9E3779B97F4A7C15`, then the standard mix), one draw `x % P` per index,
//!   resample after resample, so `tests/fixtures/code/study/make_study_fixtures.py` reproduces
//!   the interval exactly with numpy.
//! - **Greedy probe** ([`probe_subset`]): a fixed problem subset, the `count` problems whose
//!   SHA-256 of `question_id` is smallest (the rule of the SFT held-out split), so it does not
//!   depend on file order and is the same for every checkpoint; in Python
//!   `sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())[:count]`.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use kiln_sandbox::Verdict;
use serde::Serialize;

use super::summary::ProblemCount;
use crate::error::{Error, Result};
use crate::io::jsonl_records;

/// Standard error of pass@1 across problems (see the module docs); `None` under 2 problems.
pub fn pass1_stderr(rates: &[f64]) -> Option<f64> {
    let p = rates.len();
    (p >= 2).then(|| sample_sd(rates) / (p as f64).sqrt())
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// Standard deviation with ddof = 1.
fn sample_sd(values: &[f64]) -> f64 {
    let m = mean(values);
    (values.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (values.len() - 1) as f64).sqrt()
}

/// A run's headline figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunFigures {
    pub problems: usize,
    pub samples: usize,
    /// Mean over problems of `c_i / n_i`.
    #[serde(rename = "pass@1")]
    pub pass1: f64,
    /// Passing samples (Σ c_i).
    pub correct: usize,
    /// Samples from which a program was extracted.
    pub extracted: usize,
    /// Standard error of pass@1 across problems.
    pub stderr: Option<f64>,
}

impl RunFigures {
    /// The figures of per-problem counts.
    pub fn of(counts: &[ProblemCount]) -> Self {
        let rates: Vec<f64> = counts.iter().map(rate).collect();
        let samples = counts.iter().map(|c| c.n).sum();
        Self {
            problems: counts.len(),
            samples,
            pass1: if rates.is_empty() { 0.0 } else { mean(&rates) },
            correct: counts.iter().map(|c| c.correct).sum(),
            extracted: samples - counts.iter().map(|c| c.no_code).sum::<usize>(),
            stderr: pass1_stderr(&rates),
        }
    }
}

impl std::fmt::Display for RunFigures {
    /// `pass@1 0.126857, 222 correct, 146 extracted, stderr 0.02290 (175 problems, 1750 samples)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stderr = self.stderr.map_or("-".into(), |s| format!("{s:.5}"));
        write!(
            f,
            "pass@1 {:.6}, {} correct, {} extracted, stderr {stderr} ({} problems, {} samples)",
            self.pass1, self.correct, self.extracted, self.problems, self.samples
        )
    }
}

fn rate(count: &ProblemCount) -> f64 {
    if count.n == 0 { 0.0 } else { count.correct as f64 / count.n as f64 }
}

/// Per-problem counts of a run from its `<model>_code_summary.json` (`per_problem`), its
/// `<model>_code_generations.jsonl`, a `kiln code grade` output (one graded sample per line,
/// `{"question_id", "verdict", …}`; problems in order of first appearance; a `{"summary"}` line
/// is skipped), or LiveCodeBench's `*_eval_all.json` (a JSON list, see
/// [`super::lcb_files::read_eval_all`]). Errors name the file and line or entry.
pub fn read_counts(path: &Path) -> Result<Vec<ProblemCount>> {
    #[derive(serde::Deserialize)]
    struct Graded {
        question_id: String,
        verdict: Verdict,
        #[serde(default)]
        difficulty: Option<String>,
        #[serde(default)]
        platform: Option<String>,
        #[serde(default)]
        index: Option<usize>,
    }
    if path.extension().is_some_and(|e| e == "jsonl") {
        let mut counts: Vec<ProblemCount> = Vec::new();
        let mut position: HashMap<String, usize> = HashMap::new();
        let mut seen: HashSet<(String, usize)> = HashSet::new();
        for record in jsonl_records(path)? {
            let record = record?;
            if record.fields.contains_key("summary") {
                continue;
            }
            let sample: Graded = serde_json::from_value(serde_json::Value::Object(record.fields)).map_err(|e| Error::json(path, Some(record.line), e))?;
            // (The same shard concatenated twice would count its samples twice.)
            if let Some(index) = sample.index
                && !seen.insert((sample.question_id.clone(), index))
            {
                return Err(Error::data(path, Some(record.line), format!("sample {index} of question {:?} appears twice", sample.question_id)));
            }
            let i = *position.entry(sample.question_id.clone()).or_insert_with(|| {
                counts.push(ProblemCount { question_id: sample.question_id.clone(), difficulty: sample.difficulty, platform: sample.platform, n: 0, correct: 0, no_code: 0 });
                counts.len() - 1
            });
            counts[i].n += 1;
            counts[i].correct += (sample.verdict == Verdict::Accepted) as usize;
            counts[i].no_code += (sample.verdict == Verdict::NoCode) as usize;
        }
        return Ok(counts);
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    if super::lcb_files::is_eval_all(&text) {
        return Ok(super::lcb_files::eval_all_counts(&super::lcb_files::parse_eval_all(path, &text)?));
    }
    #[derive(serde::Deserialize)]
    struct Summary {
        per_problem: Vec<ProblemCount>,
    }
    let summary: Summary = serde_json::from_str(&text).map_err(|e| Error::json(path, Some(e.line()), e))?;
    let mut ids = HashSet::new();
    for (i, c) in summary.per_problem.iter().enumerate() {
        if c.correct.checked_add(c.no_code).is_none_or(|used| used > c.n) {
            let message = format!("per_problem[{i}] ({:?}): {} correct and {} without code of {} samples", c.question_id, c.correct, c.no_code, c.n);
            return Err(Error::data(path, None, message));
        }
        if !ids.insert(c.question_id.as_str()) {
            return Err(Error::data(path, None, format!("per_problem[{i}]: question {:?} appears twice", c.question_id)));
        }
    }
    Ok(summary.per_problem)
}

/// The greedy probe's problems: the `count` items whose `id` has the smallest SHA-256 (see the
/// module docs), in their given order; all of them when there are no more than `count`.
pub fn probe_subset<T>(items: Vec<T>, id: impl Fn(&T) -> &str, count: usize) -> Vec<T> {
    let keys: Vec<String> = items.iter().map(|i| id(i).to_owned()).collect();
    let keep = crate::data::sft_source::heldout_mask(&keys, count);
    items.into_iter().zip(keep).filter_map(|(item, keep)| keep.then_some(item)).collect()
}

/// How the bootstrap interval is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bootstrap {
    pub resamples: usize,
    pub seed: u64,
    /// Two-sided coverage, e.g. 0.95.
    pub level: f64,
}

impl Default for Bootstrap {
    /// 10,000 resamples, seed 0, 95 %.
    fn default() -> Self {
        Self { resamples: 10_000, seed: 0, level: 0.95 }
    }
}

/// One question's paired difference.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairedDiff {
    pub question_id: String,
    pub correct_a: usize,
    pub n_a: usize,
    pub correct_b: usize,
    pub n_b: usize,
    /// `p(B) − p(A)`.
    pub diff: f64,
}

/// The paired comparison of run B against run A (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub a: RunFigures,
    pub b: RunFigures,
    /// Mean of the per-question differences: `pass@1(B) − pass@1(A)`.
    pub mean_diff: f64,
    /// `Σ c_i(B) − Σ c_i(A)`.
    pub correct_diff: i64,
    /// Questions B solves more / less often than A.
    pub b_better: usize,
    pub a_better: usize,
    /// `sd(d) / √P` (ddof = 1).
    pub paired_stderr: Option<f64>,
    /// The bootstrap interval of the mean difference.
    pub ci_low: f64,
    pub ci_high: f64,
    pub bootstrap: Bootstrap,
    pub per_question: Vec<PairedDiff>,
}

/// Compares run `b` with run `a` question by question; both must cover the same questions
/// (`a_name` and `b_name` name them in errors).
pub fn compare(a: &[ProblemCount], b: &[ProblemCount], bootstrap: Bootstrap, a_name: &str, b_name: &str) -> Result<Comparison> {
    if a.is_empty() {
        return Err(Error::InvalidInput(format!("{a_name}: no problems")));
    }
    if !(bootstrap.level > 0.0 && bootstrap.level < 1.0) || bootstrap.resamples == 0 {
        return Err(Error::InvalidInput(format!("bootstrap: need 0 < level < 1 and resamples > 0 (got {bootstrap:?})")));
    }
    let in_b: HashMap<&str, &ProblemCount> = b.iter().map(|c| (c.question_id.as_str(), c)).collect();
    if let Some(extra) = b.iter().find(|c| !a.iter().any(|x| x.question_id == c.question_id)) {
        return Err(Error::InvalidInput(format!("{b_name}: question {:?} is not in {a_name}: the runs must cover the same questions", extra.question_id)));
    }
    let mut per_question = Vec::with_capacity(a.len());
    for ca in a {
        let cb = in_b.get(ca.question_id.as_str()).ok_or_else(|| {
            Error::InvalidInput(format!("{a_name}: question {:?} is not in {b_name}: the runs must cover the same questions", ca.question_id))
        })?;
        per_question.push(PairedDiff { question_id: ca.question_id.clone(), correct_a: ca.correct, n_a: ca.n, correct_b: cb.correct, n_b: cb.n, diff: rate(cb) - rate(ca) });
    }
    let diffs: Vec<f64> = per_question.iter().map(|d| d.diff).collect();
    let (ci_low, ci_high) = bootstrap_interval(&diffs, bootstrap);
    let b_ordered: Vec<ProblemCount> = a.iter().map(|ca| (*in_b[ca.question_id.as_str()]).clone()).collect();
    Ok(Comparison {
        a: RunFigures::of(a),
        b: RunFigures::of(&b_ordered),
        mean_diff: mean(&diffs),
        correct_diff: b.iter().map(|c| c.correct as i64).sum::<i64>() - a.iter().map(|c| c.correct as i64).sum::<i64>(),
        b_better: diffs.iter().filter(|d| **d > 0.0).count(),
        a_better: diffs.iter().filter(|d| **d < 0.0).count(),
        paired_stderr: pass1_stderr(&diffs),
        ci_low,
        ci_high,
        bootstrap,
        per_question,
    })
}

/// The percentile interval of bootstrap means of `values` (see the module docs).
pub fn bootstrap_interval(values: &[f64], bootstrap: Bootstrap) -> (f64, f64) {
    let p = values.len();
    let mut rng = SplitMix64(bootstrap.seed);
    let mut means: Vec<f64> = (0..bootstrap.resamples)
        .map(|_| (0..p).map(|_| values[(rng.next() % p as u64) as usize]).sum::<f64>() / p as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    let tail = (1.0 - bootstrap.level) / 2.0;
    (percentile(&means, tail), percentile(&means, 1.0 - tail))
}

/// numpy's default (`linear`) percentile of sorted values at fraction `q`.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let position = q * (sorted.len() - 1) as f64;
    let (lo, frac) = (position.floor() as usize, position - position.floor());
    let (a, b) = (sorted[lo], sorted[(lo + 1).min(sorted.len() - 1)]);
    // numpy's `_lerp`, which interpolates from the nearer end.
    if frac >= 0.5 { b - (b - a) * (1.0 - frac) } else { a + (b - a) * frac }
}

/// SplitMix64 (Steele, Lea and Flood 2014): a documented generator a numpy script reproduces.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests;
