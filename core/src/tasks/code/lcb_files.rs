//! LiveCodeBench's own files (`lcb_runner`, github.com/LiveCodeBench/LiveCodeBench), so that a
//! kiln evaluation can be graded by LiveCodeBench's evaluator and the two gradings compared.
//!
//! - **The custom evaluator's input**, `<model>_code_lcb_custom_output.json`, written by
//!   `kiln eval code` ([`custom_output_path`]): `[{"question_id": …, "code_list": [code, …]}, …]`,
//!   one entry per problem in problem order, each sample's extracted code in sample order (`""`
//!   where no code was found, as `lcb_runner/utils/extraction_utils.py:extract_code` returns).
//!   This is the format of LiveCodeBench's README ("Custom Evaluation") that
//!   `lcb_runner/runner/custom_evaluator.py` reads with `--custom_output_file`: it sorts the
//!   entries by `str(question_id)` and asserts one per problem of the benchmark it loads (the
//!   same `--release_version`, `--start_date` and `--end_date` as kiln's `--release`, `--from`
//!   and `--to`; a `--limit` or `--probe` run is a subset it refuses).
//! - **Its output**, `<custom output minus .json>_codegeneration_output_eval_all.json` (and
//!   `lcb_runner.runner.main`'s `output/<model>/Scenario.codegeneration_<n>_<T>_eval_all.json`),
//!   read by [`read_eval_all`]: a list of
//!   `CodeGenerationProblem.insert_output_evaluation` dicts (`lcb_runner/benchmarks/
//!   code_generation.py`), of which kiln uses `question_id`, `code_list`, `graded_list` (one bool
//!   per sample), `pass@1` (`graded_list.count(True) / len(graded_list)`, checked),
//!   `difficulty`, `platform` and `metadata` (one JSON string per sample; its `error_message`
//!   names a failure).
//! - [`read_sample_verdicts`] and [`compare_samples`]: sample-by-sample verdicts of two gradings
//!   (kiln's `<model>_code_generations.jsonl` or `kiln code grade` output, or an `_eval_all.json`)
//!   and where they differ, for `kiln eval code compare`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kiln_sandbox::Verdict;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::summary::ProblemCount;
use crate::error::{Error, Result};
use crate::io::jsonl_records;

/// `<out>/<model>_code_lcb_custom_output.json`: lcb_runner's `--custom_output_file`.
pub fn custom_output_path(out: &Path, model: &str) -> PathBuf {
    out.join(format!("{model}_code_lcb_custom_output.json"))
}

/// One problem of the custom evaluator's input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CustomOutput {
    pub question_id: String,
    pub code_list: Vec<String>,
}

/// The custom-output file's text: a JSON list of [`CustomOutput`] (4-space indents, as
/// lcb_runner's own `json.dump(…, indent=4)`).
pub fn custom_output_text(entries: &[CustomOutput]) -> String {
    let mut bytes = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut serializer = serde_json::Serializer::with_formatter(&mut bytes, formatter);
    entries.serialize(&mut serializer).expect("custom outputs serialise");
    String::from_utf8(bytes).expect("JSON is UTF-8") + "\n"
}

/// One problem of an lcb_runner `*_eval_all.json` (the fields kiln reads).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EvalAllEntry {
    pub question_id: String,
    pub code_list: Vec<String>,
    pub graded_list: Vec<bool>,
    #[serde(rename = "pass@1")]
    pub pass1: f64,
    #[serde(default)]
    pub difficulty: Option<String>,
    #[serde(default)]
    pub platform: Option<String>,
    /// One JSON string per sample (absent in files lcb_runner wrote without metadata).
    #[serde(default)]
    pub metadata: Vec<String>,
}

impl EvalAllEntry {
    /// Sample `i`'s verdict: `passed`, else the metadata's `error_message` (e.g. `Wrong
    /// Answer`, `Time Limit Exceeded`), else `failed`.
    pub fn verdict(&self, i: usize) -> String {
        if self.graded_list[i] {
            return "passed".into();
        }
        self.metadata
            .get(i)
            .and_then(|m| serde_json::from_str::<Value>(m).ok())
            .and_then(|m| m.get("error_message").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| "failed".into())
    }
}

/// `true` for a file that holds a JSON list (an lcb_runner `_eval_all.json`; kiln's own JSON
/// files are objects).
pub fn is_eval_all(text: &str) -> bool {
    text.trim_start().starts_with('[')
}

/// Whether `path` is an lcb_runner `_eval_all.json` (not `.jsonl`, and a JSON list).
pub fn is_eval_all_file(path: &Path) -> Result<bool> {
    if path.extension().is_some_and(|e| e == "jsonl") {
        return Ok(false);
    }
    Ok(is_eval_all(&std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?))
}

/// The problems of lcb_runner's `*_eval_all.json` at `path`, checked: one verdict per code,
/// at least one sample, `pass@1` the share of passing samples, no question twice. Errors name the
/// file and the entry (`entry 3 (question_id "abc395_b")`), or the line of a JSON syntax error.
pub fn read_eval_all(path: &Path) -> Result<Vec<EvalAllEntry>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    parse_eval_all(path, &text)
}

/// [`read_eval_all`] of a file's text.
pub fn parse_eval_all(path: &Path, text: &str) -> Result<Vec<EvalAllEntry>> {
    let value: Value = serde_json::from_str(text).map_err(|e| Error::json(path, Some(e.line()), e))?;
    let Value::Array(items) = value else {
        return Err(Error::data(path, None, "not an lcb_runner *_eval_all.json: expected a JSON list of problems"));
    };
    if items.is_empty() {
        return Err(Error::data(path, None, "no problems (an empty list)"));
    }
    let mut entries: Vec<EvalAllEntry> = Vec::with_capacity(items.len());
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, item) in items.into_iter().enumerate() {
        let place = match item.get("question_id") {
            Some(Value::String(id)) => format!("entry {} (question_id {id:?})", i + 1),
            _ => format!("entry {}", i + 1),
        };
        let bad = |message: String| Error::data(path, None, format!("{place}: {message}"));
        let entry = EvalAllEntry::deserialize(item).map_err(|e| bad(e.to_string()))?;
        let n = entry.code_list.len();
        if entry.graded_list.len() != n {
            return Err(bad(format!("graded_list has {} verdicts but code_list {n} codes", entry.graded_list.len())));
        }
        if n == 0 {
            return Err(bad("no samples (code_list is empty)".into()));
        }
        let share = entry.graded_list.iter().filter(|g| **g).count() as f64 / n as f64;
        if (entry.pass1 - share).abs() > 1e-9 {
            return Err(bad(format!("pass@1 is {} but graded_list passes {share}", entry.pass1)));
        }
        if !entry.metadata.is_empty() && entry.metadata.len() != n {
            return Err(bad(format!("metadata has {} items but code_list {n} codes", entry.metadata.len())));
        }
        if let Some(first) = seen.insert(entry.question_id.clone(), i + 1) {
            return Err(bad(format!("the question also appears as entry {first}")));
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// Per-problem counts of an `_eval_all.json` (no-code samples: empty codes), in file order.
pub fn eval_all_counts(entries: &[EvalAllEntry]) -> Vec<ProblemCount> {
    entries
        .iter()
        .map(|e| ProblemCount {
            question_id: e.question_id.clone(),
            difficulty: e.difficulty.clone(),
            platform: e.platform.clone(),
            n: e.code_list.len(),
            correct: e.graded_list.iter().filter(|g| **g).count(),
            no_code: e.code_list.iter().filter(|c| c.is_empty()).count(),
        })
        .collect()
}

/// One sample's verdict in one grading.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SampleVerdict {
    pub passed: bool,
    /// kiln's verdict (`accepted`, `wrong_answer`, …) or LiveCodeBench's (see
    /// [`EvalAllEntry::verdict`]).
    pub verdict: String,
    /// The extracted code, where the file records it.
    pub code: Option<String>,
}

/// A problem's samples, in sample order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProblemSamples {
    pub question_id: String,
    pub samples: Vec<SampleVerdict>,
}

/// Per-sample verdicts of `path`: an lcb_runner `_eval_all.json`, or a `.jsonl` of kiln's graded
/// samples (`<model>_code_generations.jsonl` or `kiln code grade` output: `question_id`,
/// `verdict`, `index` and `code` where present; a `{"summary"}` line is skipped). `None` for a
/// kiln summary file, which has counts only. Problems in order of first appearance.
pub fn read_sample_verdicts(path: &Path) -> Result<Option<Vec<ProblemSamples>>> {
    if path.extension().is_some_and(|e| e == "jsonl") {
        return read_graded_samples(path).map(Some);
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    if !is_eval_all(&text) {
        return Ok(None);
    }
    let entries = parse_eval_all(path, &text)?;
    Ok(Some(
        entries
            .iter()
            .map(|e| ProblemSamples {
                question_id: e.question_id.clone(),
                samples: (0..e.code_list.len())
                    .map(|i| SampleVerdict { passed: e.graded_list[i], verdict: e.verdict(i), code: Some(e.code_list[i].clone()) })
                    .collect(),
            })
            .collect(),
    ))
}

fn read_graded_samples(path: &Path) -> Result<Vec<ProblemSamples>> {
    #[derive(Deserialize)]
    struct Graded {
        question_id: String,
        verdict: Verdict,
        #[serde(default)]
        index: Option<usize>,
        #[serde(default)]
        code: Option<String>,
    }
    let mut problems: Vec<(String, Vec<Option<SampleVerdict>>)> = Vec::new();
    let mut position: HashMap<String, usize> = HashMap::new();
    for record in jsonl_records(path)? {
        let record = record?;
        if record.fields.contains_key("summary") {
            continue;
        }
        let line = record.line;
        let sample: Graded = serde_json::from_value(Value::Object(record.fields)).map_err(|e| Error::json(path, Some(line), e))?;
        let p = *position.entry(sample.question_id.clone()).or_insert_with(|| {
            problems.push((sample.question_id.clone(), Vec::new()));
            problems.len() - 1
        });
        let samples = &mut problems[p].1;
        let index = sample.index.unwrap_or(samples.len());
        // Indices run 0..n without gaps (checked below): a huge one is a broken file, not a
        // vector to grow to it.
        if index >= MAX_SAMPLE_INDEX {
            return Err(Error::data(path, Some(line), format!("{} sample index {index} is not below {MAX_SAMPLE_INDEX}", sample.question_id)));
        }
        if samples.len() <= index {
            samples.resize(index + 1, None);
        }
        if samples[index].is_some() {
            return Err(Error::data(path, Some(line), format!("{} sample {index} appears twice", sample.question_id)));
        }
        samples[index] = Some(SampleVerdict { passed: sample.verdict == Verdict::Accepted, verdict: sample.verdict.as_str().into(), code: sample.code });
    }
    problems
        .into_iter()
        .map(|(question_id, samples)| {
            let samples = samples
                .into_iter()
                .enumerate()
                .map(|(i, s)| s.ok_or_else(|| Error::data(path, None, format!("{question_id} has no sample {i}"))))
                .collect::<Result<Vec<_>>>()?;
            Ok(ProblemSamples { question_id, samples })
        })
        .collect()
}

/// A sample whose verdicts (or codes) differ between the two gradings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SampleDiff {
    pub question_id: String,
    pub index: usize,
    pub a: String,
    pub b: String,
    pub a_passed: bool,
    pub b_passed: bool,
    /// Whether both files' extracted codes are equal (`None` where one does not record code).
    pub same_code: Option<bool>,
}

/// Sample-by-sample comparison of two gradings of the same samples.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SampleComparison {
    /// Samples compared (every sample of every question).
    pub samples: usize,
    /// Samples both pass or both fail.
    pub agree: usize,
    /// Samples A passes and B fails, and the reverse.
    pub only_a_passes: usize,
    pub only_b_passes: usize,
    /// Samples whose codes both files record, and those of them whose codes differ (the files
    /// grade different programs there).
    pub code_compared: usize,
    pub code_differs: usize,
    /// Samples whose pass/fail differs or whose codes differ, in A's question order.
    pub differences: Vec<SampleDiff>,
}

/// Sample indices at or above this are refused when reading per-sample files.
const MAX_SAMPLE_INDEX: usize = 1_000_000;

/// Compares per-sample verdicts: both must have the same questions with as many samples each
/// (`a_name`, `b_name` name them in errors).
pub fn compare_samples(a: &[ProblemSamples], b: &[ProblemSamples], a_name: &str, b_name: &str) -> Result<SampleComparison> {
    let in_b: HashMap<&str, &ProblemSamples> = b.iter().map(|p| (p.question_id.as_str(), p)).collect();
    if let Some(extra) = b.iter().find(|p| !a.iter().any(|x| x.question_id == p.question_id)) {
        return Err(Error::InvalidInput(format!("{b_name}: question {:?} is not in {a_name}: the runs must cover the same questions", extra.question_id)));
    }
    let mut c = SampleComparison { samples: 0, agree: 0, only_a_passes: 0, only_b_passes: 0, code_compared: 0, code_differs: 0, differences: Vec::new() };
    for pa in a {
        let pb = in_b.get(pa.question_id.as_str()).ok_or_else(|| {
            Error::InvalidInput(format!("{a_name}: question {:?} is not in {b_name}: the runs must cover the same questions", pa.question_id))
        })?;
        if pa.samples.len() != pb.samples.len() {
            return Err(Error::InvalidInput(format!(
                "question {:?} has {} samples in {a_name} but {} in {b_name}: not the same run",
                pa.question_id,
                pa.samples.len(),
                pb.samples.len()
            )));
        }
        for (index, (sa, sb)) in pa.samples.iter().zip(&pb.samples).enumerate() {
            c.samples += 1;
            let same_code = match (&sa.code, &sb.code) {
                (Some(x), Some(y)) => Some(x == y),
                _ => None,
            };
            c.code_compared += same_code.is_some() as usize;
            c.code_differs += (same_code == Some(false)) as usize;
            match (sa.passed, sb.passed) {
                (true, false) => c.only_a_passes += 1,
                (false, true) => c.only_b_passes += 1,
                _ => c.agree += 1,
            }
            if sa.passed != sb.passed || same_code == Some(false) {
                c.differences.push(SampleDiff {
                    question_id: pa.question_id.clone(),
                    index,
                    a: sa.verdict.clone(),
                    b: sb.verdict.clone(),
                    a_passed: sa.passed,
                    b_passed: sb.passed,
                    same_code,
                });
            }
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/code/lcb_files").join(name)
    }

    const EVAL_ALL: &str = "m_code_lcb_custom_output_codegeneration_output_eval_all.json";

    #[test]
    fn reads_an_eval_all_file_as_lcb_runner_writes_it() {
        let entries = read_eval_all(&fixture(EVAL_ALL)).unwrap();
        let ids: Vec<&str> = entries.iter().map(|e| e.question_id.as_str()).collect();
        assert_eq!(ids, ["2070B", "9001", "9002", "9003", "abc395_b"], "sorted by question_id, as lcb_runner writes them");
        let counts = eval_all_counts(&entries);
        assert_eq!(counts.iter().map(|c| (c.n, c.correct, c.no_code)).collect::<Vec<_>>(), [(3, 2, 1), (3, 0, 1), (3, 1, 1), (3, 0, 1), (3, 1, 1)]);
        assert_eq!((counts[0].difficulty.as_deref(), counts[0].platform.as_deref()), (Some("hard"), Some("codeforces")));
        assert_eq!((entries[1].verdict(0).as_str(), entries[0].verdict(1).as_str(), entries[1].verdict(1).as_str()), ("Time Limit Exceeded", "passed", "Wrong Answer"));
    }

    #[test]
    fn bad_eval_all_files_name_the_file_and_entry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x_eval_all.json");
        let good: Value = serde_json::from_str(&std::fs::read_to_string(fixture(EVAL_ALL)).unwrap()).unwrap();
        let with = |edit: &dyn Fn(&mut Value)| {
            let mut v = good.clone();
            edit(&mut v);
            parse_eval_all(&path, &serde_json::to_string_pretty(&v).unwrap()).unwrap_err().to_string()
        };
        let err = with(&|v| v[2]["graded_list"].as_array_mut().unwrap().push(Value::Bool(true)));
        assert!(err.starts_with(&path.display().to_string()) && err.contains("entry 3 (question_id \"9002\")") && err.contains("graded_list has 4 verdicts but code_list 3"), "{err}");
        let err = with(&|v| v[1]["pass@1"] = serde_json::json!(0.5));
        assert!(err.contains("entry 2 (question_id \"9001\")") && err.contains("pass@1 is 0.5"), "{err}");
        let err = with(&|v| v[4]["graded_list"][0] = serde_json::json!(1));
        assert!(err.contains("entry 5 (question_id \"abc395_b\")") && err.contains("boolean"), "{err}");
        let err = with(&|v| v[0].as_object_mut().unwrap().retain(|k, _| k != "code_list"));
        assert!(err.contains("entry 1 (question_id \"2070B\")") && err.contains("code_list"), "{err}");
        let err = with(&|v| v[3]["question_id"] = v[0]["question_id"].clone());
        assert!(err.contains("entry 4 (question_id \"2070B\")") && err.contains("also appears as entry 1"), "{err}");
        let err = parse_eval_all(&path, "[\n{\"question_id\": \"1\",\n").unwrap_err().to_string();
        assert!(err.contains("x_eval_all.json line 3"), "{err}");
        let err = parse_eval_all(&path, "{\"per_problem\": []}").unwrap_err().to_string();
        assert!(err.contains("expected a JSON list"), "{err}");
    }

    #[test]
    fn sample_comparison_lists_the_disagreements() {
        let verdict = |passed: bool, code: &str| SampleVerdict { passed, verdict: if passed { "accepted" } else { "wrong_answer" }.into(), code: Some(code.into()) };
        let a = vec![ProblemSamples { question_id: "p".into(), samples: vec![verdict(true, "x"), verdict(false, "y"), verdict(false, "z")] }];
        let mut b = a.clone();
        b[0].samples[1] = verdict(true, "y");
        b[0].samples[2].code = Some("other".into());
        let c = compare_samples(&a, &b, "A", "B").unwrap();
        assert_eq!((c.samples, c.agree, c.only_a_passes, c.only_b_passes, c.code_compared, c.code_differs), (3, 2, 0, 1, 3, 1));
        assert_eq!(c.differences.iter().map(|d| (d.index, d.same_code)).collect::<Vec<_>>(), [(1, Some(true)), (2, Some(false))]);
        b[0].samples.pop();
        let err = compare_samples(&a, &b, "A", "B").unwrap_err().to_string();
        assert!(err.contains("3 samples in A but 2 in B"), "{err}");
    }
}
