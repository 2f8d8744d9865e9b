//! `kiln eval code`: the code task's side of checkpoint evaluation ([`Evaluation`]), driven by
//! the generic, resumable runner [`crate::eval::evaluate`]. Each shard's completions are graded
//! in the sandbox as soon as they are sampled, so a killed run keeps its graded shards and
//! resumes after them.
//!
//! Files under the output directory, for a model named `m`:
//! - `m_code_generations.jsonl`: one line per sample, in problem order —
//!   `{"question_id", "index", "difficulty", "platform", "verdict", "passed", "total", "tokens",
//!   "tests": [{"verdict", "time_s", "detail"?}, …], "code", "completion"}` (`code` is what
//!   extraction found, `""` for `no_code`; `time_s` is the program's own run time);
//! - `m_code_summary.json` (written last: it marks a finished model):
//!   `{"model", "pass@1", …, "overall", "by_difficulty", "by_platform", "per_problem",
//!   "settings", "grading", "protections"}` — pass@k is LiveCodeBench's unbiased estimator
//!   averaged over problems; `per_problem` lists every problem's `n`, `correct` and `no_code` in
//!   problem order, which is what standard errors and paired comparisons of two runs need;
//!   `protections` are the sandbox layers the programs ran under;
//! - `m_code_lcb_custom_output.json`: LiveCodeBench's custom-evaluator input,
//!   `[{"question_id", "code_list": [code, …]}, …]` (problem order, sample order; see
//!   [`super::lcb_files`]): `python -m lcb_runner.runner.custom_evaluator --custom_output_file
//!   m_code_lcb_custom_output.json` grades the same programs with LiveCodeBench's own evaluator;
//! - `summary.json`: one record per model of the run (`model` and its overall figures).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_sandbox::{Limits, Protections, Sandbox, Verdict};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::code_problem::CodeProblem;
use super::extract::Extraction;
use super::grade::{Submission, TestRecord, grade_submissions};
use super::lcb_files::{CustomOutput, custom_output_path, custom_output_text};
use super::summary::{CodeSummary, ProblemOutcome, SampleOutcome, summarize};
use crate::error::{Error, Result};
use crate::io::pyjson::{self, Json, Style};
use crate::io::{jsonl_records, remove_file, write_atomic};
use crate::tasks::{Completion, Evaluation, FinishedRun, Item, Part, Source};

/// The one part's name: files are `<model>_code_generations.jsonl`.
const PART: &str = "code";

/// Grading progress within a shard: `(graded, of)`.
pub type GradeProgress = dyn Fn(usize, usize) + Send + Sync;

/// A code evaluation: problems with their prompts, graded in `sandbox` (see the module docs).
pub struct CodeEvaluation {
    problems: Vec<CodeProblem>,
    items: Vec<Item>,
    sandbox: Arc<Sandbox>,
    limits: Limits,
    extraction: Extraction,
    ks: Vec<u64>,
    settings: Value,
    progress: Option<Box<GradeProgress>>,
}

/// One sample's line in `<model>_code_generations.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    pub question_id: String,
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub difficulty: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    pub verdict: Verdict,
    pub passed: usize,
    pub total: usize,
    /// Generated tokens.
    pub tokens: usize,
    pub tests: Vec<TestRecord>,
    pub code: String,
    pub completion: String,
}

impl CodeEvaluation {
    /// `problems` asked with `prompts` (finished prompt texts, one per problem) and read at
    /// `sources`; programs run in `sandbox` under `limits`, found by `extraction`; pass@k for
    /// `ks`. `settings` (the problem selection, template, sampling, …) is recorded in the
    /// summaries.
    pub fn new(
        problems: Vec<(CodeProblem, Source)>,
        prompts: Vec<String>,
        sandbox: Arc<Sandbox>,
        limits: Limits,
        extraction: Extraction,
        ks: Vec<u64>,
        settings: Value,
    ) -> Result<Self> {
        if problems.len() != prompts.len() {
            return Err(Error::InvalidInput(format!("{} problems but {} prompts", problems.len(), prompts.len())));
        }
        if problems.is_empty() {
            return Err(Error::InvalidInput("no problems to evaluate (check the release or the date window)".into()));
        }
        let items = problems.iter().zip(prompts).map(|((problem, source), prompt)| problem.item(prompt, source.clone())).collect();
        let problems = problems.into_iter().map(|(problem, _)| problem).collect();
        Ok(Self { problems, items, sandbox, limits, extraction, ks, settings, progress: None })
    }

    /// Reports grading progress within each shard.
    pub fn with_progress(mut self, progress: impl Fn(usize, usize) + Send + Sync + 'static) -> Self {
        self.progress = Some(Box::new(progress));
        self
    }

    /// The problems, in order.
    pub fn problems(&self) -> &[CodeProblem] {
        &self.problems
    }

    /// `<out>/<model>_code_summary.json`.
    pub fn summary_path(out: &Path, model: &str) -> PathBuf {
        out.join(format!("{model}_code_summary.json"))
    }

    /// How programs are graded, as recorded.
    fn grading(&self) -> Value {
        json!({
            "per_test_timeout_s": self.limits.per_test.as_secs_f64(),
            "memory_bytes": self.limits.memory_bytes,
            "output_bytes": self.limits.output_bytes,
            "stop_at_first_failure": self.limits.stop_at_first_failure,
            "extraction": self.extraction,
        })
    }

    /// The outcomes per problem, in problem order, from a generations file, and each problem's
    /// extracted codes in sample order (LiveCodeBench's custom-evaluator input).
    fn outcomes(&self, path: &Path, samples: usize) -> Result<(Vec<ProblemOutcome>, Vec<CustomOutput>)> {
        let position: HashMap<&str, usize> = self.problems.iter().enumerate().map(|(i, p)| (p.id.as_str(), i)).collect();
        let mut outcomes: Vec<ProblemOutcome> = self
            .problems
            .iter()
            .map(|p| ProblemOutcome { question_id: p.id.clone(), difficulty: p.difficulty.clone(), platform: p.platform.clone(), samples: Vec::new() })
            .collect();
        let mut codes: Vec<Vec<Option<String>>> = vec![vec![None; samples]; self.problems.len()];
        for record in jsonl_records(path)? {
            let record = record?;
            let sample = SampleRecord::deserialize(Value::Object(record.fields)).map_err(|e| Error::json(path, Some(record.line), e))?;
            let i = *position
                .get(sample.question_id.as_str())
                .ok_or_else(|| Error::data(path, Some(record.line), format!("question_id {:?} is not a problem of this run", sample.question_id)))?;
            outcomes[i].samples.push(SampleOutcome { verdict: sample.verdict });
            match codes[i].get_mut(sample.index) {
                Some(slot @ None) => *slot = Some(sample.code),
                _ => return Err(Error::data(path, Some(record.line), format!("{} sample {} is repeated or beyond {samples}", sample.question_id, sample.index))),
            }
        }
        if let Some(o) = outcomes.iter().find(|o| o.samples.len() != samples) {
            return Err(Error::data(path, None, format!("{} has {} samples, not {samples}", o.question_id, o.samples.len())));
        }
        let custom = self
            .problems
            .iter()
            .zip(codes)
            .map(|(p, codes)| CustomOutput { question_id: p.id.clone(), code_list: codes.into_iter().map(Option::unwrap_or_default).collect() })
            .collect();
        Ok((outcomes, custom))
    }
}

/// `<model>_code_summary.json`, in this key order.
#[derive(Serialize)]
struct SummaryFile<'a> {
    model: &'a str,
    #[serde(flatten)]
    pass_at_k: PassAtK<'a>,
    #[serde(flatten)]
    summary: &'a CodeSummary,
    settings: &'a Value,
    grading: Value,
    /// The problems' and grading's hash ([`Evaluation::fingerprint`]).
    data_sha256: String,
    protections: &'a Protections,
}

/// `"pass@1": …, "pass@5": …` in k order.
struct PassAtK<'a>(&'a [(u64, f64)]);

impl Serialize for PassAtK<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, value) in self.0 {
            map.serialize_entry(&format!("pass@{k}"), value)?;
        }
        map.end()
    }
}

impl Evaluation for CodeEvaluation {
    fn parts(&self) -> Vec<Part<'_>> {
        vec![Part { name: PART, items: &self.items }]
    }

    /// The problems, their prompts and tests, and how they are graded.
    fn fingerprint(&self) -> String {
        let mut hash = Sha256::new();
        for item in &self.items {
            for text in [item.id.as_str(), item.prompt.as_str(), &item.gold.to_string()] {
                hash.update((text.len() as u64).to_le_bytes());
                hash.update(text.as_bytes());
            }
        }
        hash.update(self.grading().to_string().as_bytes());
        hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Grades the shard's completions (parallel over the sandbox's slots).
    fn records(&self, _part: usize, start: usize, samples: &[Vec<Completion>]) -> Result<Vec<String>> {
        let mut submissions = Vec::new();
        let mut owners = Vec::new();
        for (i, completions) in samples.iter().enumerate() {
            let problem = self.problems.get(start + i).ok_or_else(|| Error::InvalidInput(format!("no problem {}", start + i)))?;
            for (j, completion) in completions.iter().enumerate() {
                submissions.push(Submission { completion: &completion.text, tests: &problem.tests });
                owners.push((problem, j, completion));
            }
        }
        let count = std::sync::atomic::AtomicUsize::new(0);
        let total = submissions.len();
        let graded = grade_submissions(&self.sandbox, &submissions, &self.limits, self.extraction, |_, _| {
            let done = count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if let Some(progress) = &self.progress {
                progress(done, total);
            }
        })?;
        let lines = owners
            .into_iter()
            .zip(graded)
            .map(|((problem, index, completion), sample)| {
                let record = SampleRecord {
                    question_id: problem.id.clone(),
                    index,
                    difficulty: problem.difficulty.clone(),
                    platform: problem.platform.clone(),
                    verdict: sample.graded.verdict,
                    passed: sample.graded.passed,
                    total: sample.graded.total,
                    tokens: completion.tokens,
                    tests: sample.graded.tests.iter().map(TestRecord::from).collect(),
                    code: sample.code,
                    completion: completion.text.clone(),
                };
                serde_json::to_string(&record).expect("a record serialises")
            })
            .collect();
        Ok(lines)
    }

    fn loss_text(&self, _part: usize, _index: usize) -> Option<&str> {
        None
    }

    fn finished_marker(&self, out: &Path, model: &str) -> PathBuf {
        Self::summary_path(out, model)
    }

    fn skip_special_tokens(&self) -> bool {
        true
    }

    fn finish(&self, model: &str, out: &Path, run: &FinishedRun<'_>, stage: &mut dyn FnMut(&'static str)) -> Result<()> {
        stage("summary");
        let generations = run.generations.first().ok_or_else(|| Error::InvalidInput("no generations file".into()))?;
        let (outcomes, custom) = self.outcomes(generations, run.samples)?;
        let summary = summarize(&outcomes, &self.ks);
        write_atomic(&custom_output_path(out, model), &custom_output_text(&custom))?;
        let file = SummaryFile {
            model,
            pass_at_k: PassAtK(&summary.overall.pass_at_k),
            summary: &summary,
            settings: &self.settings,
            grading: self.grading(),
            data_sha256: self.fingerprint(),
            protections: self.sandbox.protections(),
        };
        if !run.keep_generations {
            remove_file(generations)?;
        }
        let text = serde_json::to_string_pretty(&file).expect("a summary serialises") + "\n";
        write_atomic(&Self::summary_path(out, model), &text)
    }

    /// The summary's recorded `settings` (each key), `grading` and `data_sha256` against this
    /// run's; a key one side lacks (a summary written before it was recorded) is not compared.
    fn check_finished(&self, out: &Path, model: &str) -> Result<()> {
        let path = Self::summary_path(out, model);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let recorded: Value = serde_json::from_str(&text).map_err(|e| Error::data(&path, None, e.to_string()))?;
        let now = json!({ "settings": self.settings, "grading": self.grading(), "data_sha256": self.fingerprint() });
        let mut differ = Vec::new();
        for (section, value) in now.as_object().expect("an object") {
            let Some(old) = recorded.get(section) else { continue };
            match (old.as_object(), value.as_object()) {
                (Some(old), Some(value)) => differ.extend(
                    value.iter().filter(|(k, v)| old.get(*k).is_some_and(|o| o != *v)).map(|(k, v)| (format!("{section}.{k}"), old[k].clone(), v.clone())),
                ),
                _ if old != value => differ.push((section.clone(), old.clone(), value.clone())),
                _ => {}
            }
        }
        // The same problems read from another path are the same evaluation.
        if recorded.get("data_sha256") == now.get("data_sha256") {
            differ.retain(|(k, _, _)| k != "settings.problems");
        }
        let Some((key, old, value)) = differ.first() else { return Ok(()) };
        let short = |v: &Value| {
            let text = v.to_string();
            if text.chars().count() > 60 { format!("{}…", text.chars().take(60).collect::<String>()) } else { text }
        };
        let keys = differ.iter().map(|(k, _, _)| k.as_str()).collect::<Vec<_>>().join(", ");
        Err(Error::data(
            &path,
            None,
            format!(
                "model {model} was evaluated with other settings or problems than this run's ({keys}; {key}: {} then, {} now): pass --overwrite to evaluate it again, or another --out",
                short(old),
                short(value)
            ),
        ))
    }

    fn summary(&self, out: &Path, model: &str) -> Result<Json> {
        let path = Self::summary_path(out, model);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        pyjson::parse(&text).map_err(|e| Error::data(&path, None, e))
    }

    /// `summary.json`: `[{"model", "pass@1", …, "problems", "samples", "correct", "no_code", …}]`.
    fn write_summaries(&self, out: &Path, models: &[String]) -> Result<()> {
        let mut rows = Vec::new();
        for model in models {
            let mut row = vec![("model".to_owned(), Json::from(model.as_str()))];
            if let Some(Json::Object(overall)) = self.summary(out, model)?.get("overall") {
                row.extend(overall.iter().cloned());
            }
            rows.push(Json::Object(row));
        }
        write_atomic(&out.join("summary.json"), &(Json::Array(rows).dumps(Style::INDENT2_UTF8) + "\n"))
    }
}
