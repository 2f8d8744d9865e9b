//! Problems as the code task grades them: an id, the question, and the tests in the sandbox's
//! form, read from LiveCodeBench rows or from plain code-problem rows.
//!
//! A file of problems holds one JSON object per line, of either shape (they may be mixed):
//!
//! - a LiveCodeBench `code_generation_lite` row ([`super::problem`]: `question_id`,
//!   `question_content`, `public_test_cases`, `private_test_cases`, `metadata`, …);
//! - a code-problem row, for RL data and problems made in place:
//!
//! ```json
//! {"id": "add", "question": "Read a and b, print a + b.", "tests": [{"input": "1 2\n", "output": "3\n"}]}
//! {"id": "twice", "question": "…", "fn_name": "twice", "starter_code": "def twice(x):",
//!  "tests": [{"input": "4", "output": "8"}], "difficulty": "easy", "platform": "made"}
//! ```
//!
//!   Without `fn_name` a test feeds `input` on stdin and expects `output` on stdout; with it, the
//!   function (or `Solution` method) `fn_name` is called with one JSON argument per line of
//!   `input` and must return the JSON value `output` — LiveCodeBench's two modes.
//!   `difficulty` and `platform` are optional labels for the per-group summaries.

use std::path::{Path, PathBuf};

use kiln_sandbox::TestCase;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::problem::{Problem, RawProblem, TestMode};
use super::prompt::{CodePrompt, PromptTemplate, code_prompt_parts};
use crate::error::{Error, Result};
use crate::io::{jsonl_records, pyjson};
use crate::tasks::{Item, Source};

/// A problem with its tests in the sandbox's form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeProblem {
    pub id: String,
    pub question: String,
    /// Code the answer starts from (LiveCodeBench's LeetCode stubs); may be empty.
    #[serde(default)]
    pub starter_code: String,
    /// Public then private tests, in LiveCodeBench's order.
    pub tests: Vec<TestCase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub difficulty: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
}

/// What an [`Item`] of the code task carries in `gold`: the tests and the labels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeGold {
    pub tests: Vec<TestCase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub difficulty: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
}

impl CodeGold {
    /// The gold of a code-task item; an error naming the item's place when it is not one.
    pub fn of(item: &Item) -> Result<Self> {
        Self::deserialize(&item.gold).map_err(|e| item.source.error(format!("not a code-task item (gold: {e})")))
    }
}

/// A code-problem row (see the module docs).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    id: Value,
    question: String,
    #[serde(default)]
    starter_code: String,
    #[serde(default)]
    fn_name: Option<String>,
    tests: Vec<RowTest>,
    #[serde(default)]
    difficulty: Option<String>,
    #[serde(default)]
    platform: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RowTest {
    input: String,
    output: String,
}

impl CodeProblem {
    /// The problem of a LiveCodeBench row, its tests in LiveCodeBench's mode (stdin or a call of
    /// `metadata.func_name`).
    pub fn from_lcb(problem: &Problem) -> Self {
        let tests = problem
            .tests()
            .map(|t| match problem.mode() {
                TestMode::Stdin => TestCase::Stdin { input: t.input.clone(), output: t.output.clone() },
                TestMode::Call { func_name } => {
                    TestCase::Call { fn_name: func_name.to_owned(), input: t.input.clone(), output: t.output.clone() }
                }
            })
            .collect();
        Self {
            id: problem.question_id.clone(),
            question: problem.question_content.clone(),
            starter_code: problem.starter_code.clone(),
            tests,
            difficulty: Some(problem.difficulty.as_str().to_owned()),
            platform: Some(problem.platform.as_str().to_owned()),
        }
    }

    /// The problem of one line of a problems file (either shape); the message says what is wrong.
    pub fn parse(line: &str) -> std::result::Result<Self, String> {
        let value: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
        if value.get("question_id").is_some() {
            let problem = Self::from_lcb(&RawProblem::parse(line)?.decode()?);
            return problem.check_tests().map(|()| problem);
        }
        let row: Row = serde_json::from_value(value)
            .map_err(|e| format!("neither a LiveCodeBench row (no question_id) nor a code-problem row {{id, question, tests}}: {e}"))?;
        let id = match row.id {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            other => return Err(format!("id {other} is not a string")),
        };
        let tests = row
            .tests
            .into_iter()
            .map(|t| match &row.fn_name {
                None => TestCase::Stdin { input: t.input, output: t.output },
                Some(f) => TestCase::Call { fn_name: f.clone(), input: t.input, output: t.output },
            })
            .collect();
        let problem = Self { id, question: row.question, starter_code: row.starter_code, tests, difficulty: row.difficulty, platform: row.platform };
        problem.check_tests().map(|()| problem)
    }

    /// Whether the tests can grade a program ([`check_tests`]).
    pub fn check_tests(&self) -> std::result::Result<(), String> {
        let call = self.tests.iter().any(|t| matches!(t, TestCase::Call { .. }));
        check_tests(self.tests.iter().map(|t| match t {
            TestCase::Stdin { input, output } | TestCase::Call { input, output, .. } => (input.as_str(), output.as_str()),
        }), call)
    }

    /// The prompt under `template` (as [`super::code_prompt`] builds it for LiveCodeBench).
    pub fn prompt(&self, template: PromptTemplate) -> CodePrompt {
        code_prompt_parts(template, &self.question, &self.starter_code)
    }

    /// What a code-task item carries in `gold`.
    pub fn gold(&self) -> CodeGold {
        CodeGold { tests: self.tests.clone(), difficulty: self.difficulty.clone(), platform: self.platform.clone() }
    }

    /// The item asking `prompt` (the finished prompt text) of this problem, read at `source`.
    /// Its group is the difficulty (`all` without one).
    pub fn item(&self, prompt: String, source: Source) -> Item {
        Item {
            id: self.id.clone(),
            group: self.difficulty.clone().unwrap_or_else(|| "all".into()),
            level: None,
            prompt,
            reference: None,
            gold: serde_json::to_value(self.gold()).expect("tests serialise"),
            source,
        }
    }
}

/// Tests (input, output) a problem can be graded by: at least one (a problem without tests would
/// accept any program), and in call mode every line of an input one JSON value (an argument) and
/// the output one JSON value, read as the sandbox's harness reads them (Python's `json.loads`
/// of `input.split("\n")`): a test that cannot be read is the file's error, not the model's.
fn check_tests<'a>(tests: impl Iterator<Item = (&'a str, &'a str)>, call: bool) -> std::result::Result<(), String> {
    let mut count = 0;
    for (i, (input, output)) in tests.enumerate() {
        count += 1;
        if !call {
            continue;
        }
        for (l, line) in input.split('\n').enumerate() {
            pyjson::parse(line).map_err(|e| {
                format!("test {}: input line {} is not a JSON value (a call test passes one JSON argument per line): {e}", i + 1, l + 1)
            })?;
        }
        pyjson::parse(output).map_err(|e| format!("test {}: the output is not a JSON value (a call test's expected return value): {e}", i + 1))?;
    }
    if count == 0 {
        return Err("no tests: a problem without tests would accept any program".into());
    }
    Ok(())
}

/// The problems of a file, in order, with their places; a row that is neither shape is an error
/// naming the file and line, and so is an id seen twice.
pub fn read_code_problems(path: &Path) -> Result<Vec<(CodeProblem, Source)>> {
    let file: PathBuf = path.to_path_buf();
    let mut problems: Vec<(CodeProblem, Source)> = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for record in jsonl_records(path)? {
        let record = record?;
        let source = Source { file: file.clone(), line: record.line };
        let line = serde_json::to_string(&record.fields).expect("a JSON object serialises");
        let problem = CodeProblem::parse(&line).map_err(|e| source.error(e))?;
        if let Some(first) = seen.insert(problem.id.clone(), record.line) {
            return Err(source.error(format!("id {:?} already appears on line {first}", problem.id)));
        }
        problems.push((problem, source));
    }
    if problems.is_empty() {
        return Err(Error::data(path, None, "no problems"));
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_row_shapes_read_and_lcb_modes_carry_over() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/code/lcb_mini");
        let problems = read_code_problems(&fixtures.join("test6.jsonl")).unwrap();
        let call = problems.iter().find(|(p, _)| p.id == "9002").unwrap();
        assert!(matches!(&call.0.tests[0], TestCase::Call { fn_name, .. } if fn_name == "countVowels"));
        assert_eq!((call.0.difficulty.as_deref(), call.0.platform.as_deref()), (Some("medium"), Some("leetcode")));
        let stdin = problems.iter().find(|(p, _)| p.id == "2070B").unwrap();
        assert!(stdin.0.tests.len() > 1 && stdin.0.tests.iter().all(|t| matches!(t, TestCase::Stdin { .. })));

        let made = CodeProblem::parse(r#"{"id": 7, "question": "q", "fn_name": "f", "tests": [{"input": "1", "output": "2"}]}"#).unwrap();
        assert_eq!(made.id, "7");
        assert_eq!(made.tests, vec![TestCase::Call { fn_name: "f".into(), input: "1".into(), output: "2".into() }]);
        let item = made.item("p".into(), Source::default());
        assert_eq!((item.group.as_str(), CodeGold::of(&item).unwrap()), ("all", made.gold()));
    }

    #[test]
    fn bad_rows_name_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        let good = r#"{"id": "a", "question": "q", "tests": [{"input": "1\n", "output": "1\n"}]}"#;
        let call = |input: &str, output: &str| {
            let test = serde_json::json!({ "input": input, "output": output });
            format!("{good}\n{}\n", serde_json::json!({ "id": "b", "question": "q", "fn_name": "f", "tests": [{ "input": "1", "output": "2" }, test] }))
        };
        for (text, expected) in [
            (format!("{good}\n{{\"id\": \"b\", \"question\": \"q\"}}\n"), "p.jsonl line 2: neither a LiveCodeBench row"),
            (format!("{good}\n{{\"id\": \"b\", \"question\": \"q\", \"tests\": [], \"extra\": 1}}\n"), "unknown field `extra`"),
            (format!("{good}\n{{\"id\": \"b\", \"question\": \"q\", \"tests\": []}}\n"), "p.jsonl line 2: no tests: a problem without tests would accept any program"),
            (call("1 2", "3"), "p.jsonl line 2: test 2: input line 1 is not a JSON value"),
            (call("[1, 2]\n", "3"), "p.jsonl line 2: test 2: input line 2 is not a JSON value"),
            (call("[1, 2]\n3", "eight"), "p.jsonl line 2: test 2: the output is not a JSON value"),
            (format!("{good}\n{good}\n"), "p.jsonl line 2: id \"a\" already appears on line 1"),
            ("{\"question_id\": \"x\"}\n".to_owned(), "p.jsonl line 1: not a LiveCodeBench problem row"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = read_code_problems(&path).unwrap_err().to_string();
            assert!(e.contains(expected), "{e}");
        }
        // Python's json.loads reads NaN and surrounding spaces: such tests are fine.
        std::fs::write(&path, call(" [1, 2] \nNaN", "[3]")).unwrap();
        assert_eq!(read_code_problems(&path).unwrap().len(), 2);
    }
}
