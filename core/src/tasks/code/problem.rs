//! One LiveCodeBench `code_generation_lite` problem (spec code-sft.md §8.2; LiveCodeBench
//! `lcb_runner/benchmarks/code_generation.py:CodeGenerationProblem`).
//!
//! A JSONL row holds `question_title`, `question_content`, `platform`, `question_id`,
//! `contest_id`, `contest_date` (ISO), `starter_code`, `difficulty`, `public_test_cases` (a JSON
//! string), `private_test_cases` (a JSON string, or base64 → zlib → pickle → JSON; see
//! [`super::private`]) and `metadata` (a JSON string; `func_name` for call-based problems).
//! Platform, difficulty and test type are checked like LiveCodeBench's enums.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::private::decode_private_tests;

/// Where a problem comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    Leetcode,
    Codeforces,
    Atcoder,
}

/// LiveCodeBench's difficulty label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Difficulty {
    Easy,
    Medium,
    Hard,
}

/// How a test feeds the program: stdin/stdout, or a call of `func_name` (LeetCode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TestType {
    Stdin,
    Functional,
}

impl Platform {
    /// The name used in the files (`leetcode`, `codeforces`, `atcoder`).
    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Leetcode => "leetcode",
            Platform::Codeforces => "codeforces",
            Platform::Atcoder => "atcoder",
        }
    }
}

impl Difficulty {
    /// The name used in the files (`easy`, `medium`, `hard`).
    pub fn as_str(self) -> &'static str {
        match self {
            Difficulty::Easy => "easy",
            Difficulty::Medium => "medium",
            Difficulty::Hard => "hard",
        }
    }
}

/// One test: the input text and the expected output. For functional tests the input is one
/// JSON value per line (the positional arguments) and the output one JSON value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestCase {
    pub input: String,
    pub output: String,
    pub testtype: TestType,
}

/// How a problem's tests run: LiveCodeBench's `fn_name` is None → stdin, otherwise call-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestMode<'a> {
    Stdin,
    Call { func_name: &'a str },
}

/// A contest date as `datetime.fromisoformat` reads LiveCodeBench's `contest_date`
/// (`YYYY-MM-DD` with an optional `THH:MM[:SS[.ffffff]]`); ordered like Python datetimes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContestDate {
    pub year: u16,
    pub month: u8,
    pub day: u8,
    pub hour: u8,
    pub minute: u8,
    pub second: u8,
    pub microsecond: u32,
}

impl ContestDate {
    /// Parses `YYYY-MM-DD`, optionally followed by `T` or a space and `HH:MM`, `HH:MM:SS` or
    /// `HH:MM:SS.ffffff`. Time zones are not accepted (LiveCodeBench's dates are naive).
    pub fn parse(text: &str) -> Option<Self> {
        let b = text.as_bytes();
        let num = |r: std::ops::Range<usize>| -> Option<u32> {
            let s = text.get(r)?;
            s.bytes().all(|c| c.is_ascii_digit()).then(|| s.parse().ok())?
        };
        if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
            return None;
        }
        let mut date = ContestDate {
            year: num(0..4)? as u16,
            month: num(5..7)? as u8,
            day: num(8..10)? as u8,
            hour: 0,
            minute: 0,
            second: 0,
            microsecond: 0,
        };
        let days_in_month = match date.month {
            1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
            4 | 6 | 9 | 11 => 30,
            2 if date.year.is_multiple_of(4) && (!date.year.is_multiple_of(100) || date.year.is_multiple_of(400)) => 29,
            2 => 28,
            _ => return None,
        };
        if date.day == 0 || date.day > days_in_month {
            return None;
        }
        if b.len() == 10 {
            return Some(date);
        }
        if !(b[10] == b'T' || b[10] == b' ') || b.len() < 16 || b[13] != b':' {
            return None;
        }
        date.hour = num(11..13)? as u8;
        date.minute = num(14..16)? as u8;
        match b.len() {
            16 => {}
            19 if b[16] == b':' => date.second = num(17..19)? as u8,
            n if n > 20 && b[16] == b':' && b[19] == b'.' && n <= 26 => {
                date.second = num(17..19)? as u8;
                let frac = &text[20..];
                date.microsecond = num(20..n)? * 10u32.pow(6 - frac.len() as u32);
            }
            _ => return None,
        }
        (date.hour < 24 && date.minute < 60 && date.second < 60).then_some(date)
    }
}

impl fmt::Display for ContestDate {
    /// Python's `datetime.isoformat()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}", self.year, self.month, self.day, self.hour, self.minute, self.second)?;
        if self.microsecond > 0 {
            write!(f, ".{:06}", self.microsecond)?;
        }
        Ok(())
    }
}

/// A problem with its tests decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub question_id: String,
    pub question_title: String,
    pub question_content: String,
    pub platform: Platform,
    pub contest_id: String,
    pub contest_date: ContestDate,
    pub starter_code: String,
    pub difficulty: Difficulty,
    pub public_tests: Vec<TestCase>,
    pub private_tests: Vec<TestCase>,
    /// The parsed `metadata` object.
    pub metadata: Map<String, Value>,
}

impl Problem {
    /// `metadata["func_name"]`, the method a call-based test calls.
    pub fn func_name(&self) -> Option<&str> {
        self.metadata.get("func_name").and_then(Value::as_str)
    }

    /// Stdin or call-based, as LiveCodeBench decides it (from `func_name`).
    pub fn mode(&self) -> TestMode<'_> {
        match self.func_name() {
            Some(func_name) => TestMode::Call { func_name },
            None => TestMode::Stdin,
        }
    }

    /// Public then private tests: LiveCodeBench's evaluation order.
    pub fn tests(&self) -> impl Iterator<Item = &TestCase> {
        self.public_tests.iter().chain(&self.private_tests)
    }
}

/// A row before its tests are decoded (cheap: selection by release and date happens here).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RawProblem {
    question_title: String,
    question_content: String,
    platform: Platform,
    pub(crate) question_id: String,
    contest_id: Value,
    contest_date: String,
    starter_code: String,
    difficulty: Difficulty,
    public_test_cases: String,
    private_test_cases: String,
    metadata: String,
}

impl RawProblem {
    /// Parses one JSONL line; the message says what is wrong (the caller adds file and line).
    pub(crate) fn parse(line: &str) -> Result<Self, String> {
        serde_json::from_str(line).map_err(|e| format!("not a LiveCodeBench problem row: {e}"))
    }

    pub(crate) fn contest_date(&self) -> Result<ContestDate, String> {
        ContestDate::parse(&self.contest_date).ok_or_else(|| format!("contest_date {:?} is not an ISO date", self.contest_date))
    }

    /// Decodes the tests and the metadata.
    pub(crate) fn decode(self) -> Result<Problem, String> {
        let contest_date = self.contest_date()?;
        let public_tests: Vec<TestCase> =
            serde_json::from_str(&self.public_test_cases).map_err(|e| format!("public_test_cases: {e}"))?;
        let private_tests = decode_private_tests(&self.private_test_cases).map_err(|e| format!("private_test_cases: {e}"))?;
        let metadata = match serde_json::from_str(&self.metadata) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Err("metadata is not a JSON object".into()),
            Err(e) => return Err(format!("metadata: {e}")),
        };
        let contest_id = match self.contest_id {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            other => return Err(format!("contest_id {other} is not a string")),
        };
        let problem = Problem {
            question_id: self.question_id,
            question_title: self.question_title,
            question_content: self.question_content,
            platform: self.platform,
            contest_id,
            contest_date,
            starter_code: self.starter_code,
            difficulty: self.difficulty,
            public_tests,
            private_tests,
            metadata,
        };
        if let Some(value) = problem.metadata.get("func_name").filter(|v| !v.is_string() && !v.is_null()) {
            return Err(format!("metadata.func_name {value} is not a string"));
        }
        let want = if problem.func_name().is_some() { TestType::Functional } else { TestType::Stdin };
        if let Some(test) = problem.tests().find(|t| t.testtype != want) {
            return Err(format!("a {:?} test in a problem whose metadata makes it {:?}", test.testtype, want));
        }
        Ok(problem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::code::CodeProblem;

    #[test]
    fn dates_parse_like_fromisoformat_and_order_like_datetimes() {
        let d = ContestDate::parse("2025-01-11T18:30:00").unwrap();
        assert_eq!((d.year, d.month, d.day, d.hour, d.minute, d.second), (2025, 1, 11, 18, 30, 0));
        assert_eq!(d.to_string(), "2025-01-11T18:30:00");
        assert_eq!(ContestDate::parse("2025-01-11").unwrap().to_string(), "2025-01-11T00:00:00");
        assert_eq!(ContestDate::parse("2024-02-29 07:05").unwrap().to_string(), "2024-02-29T07:05:00");
        assert_eq!(ContestDate::parse("2024-02-29T07:05:01.5").unwrap().to_string(), "2024-02-29T07:05:01.500000");
        assert!(ContestDate::parse("2025-01-11") < ContestDate::parse("2025-01-11T00:00:01"));
        assert!(ContestDate::parse("2024-12-31T23:59:59") < ContestDate::parse("2025-01-01"));
        for bad in ["", "2025-1-11", "2025-02-29", "2025-13-01", "2025-01-11T25:00", "2025-01-11Z", "2025-01-11T10:00:00+00:00"] {
            assert_eq!(ContestDate::parse(bad), None, "{bad:?}");
        }
    }

    fn row(metadata: &str, tests: &str) -> String {
        serde_json::json!({
            "question_title": "t", "question_content": "c", "platform": "leetcode", "question_id": "1",
            "contest_id": 7, "contest_date": "2025-01-01T00:00:00", "starter_code": "", "difficulty": "easy",
            "public_test_cases": tests, "private_test_cases": "[]", "metadata": metadata,
        })
        .to_string()
    }

    #[test]
    fn the_mode_comes_from_func_name_and_must_match_the_tests() {
        let functional = r#"[{"input": "1\n2", "output": "3", "testtype": "functional"}]"#;
        let p = RawProblem::parse(&row(r#"{"func_name": "add"}"#, functional)).unwrap().decode().unwrap();
        assert_eq!(p.mode(), TestMode::Call { func_name: "add" });
        assert_eq!(p.contest_id, "7");
        let err = RawProblem::parse(&row("{}", functional)).unwrap().decode().unwrap_err();
        assert!(err.contains("Functional"), "{err}");
        let err = RawProblem::parse(&row("[]", "[]")).unwrap().decode().unwrap_err();
        assert!(err.contains("metadata"), "{err}");
        let err = RawProblem::parse(&row("{}", r#"[{"input": "1"}]"#)).unwrap().decode().unwrap_err();
        assert!(err.contains("public_test_cases") && err.contains("output"), "{err}");
        // No tests at all, and call tests the harness cannot read: the row's error when it is
        // graded, not the model's (decontamination reads only the question).
        let graded = |line: String| CodeProblem::parse(&line).map(|_| ());
        assert!(RawProblem::parse(&row("{}", "[]")).unwrap().decode().is_ok());
        assert!(graded(row("{}", "[]")).is_err_and(|e| e.starts_with("no tests")));
        let unreadable = r#"[{"input": "1 2", "output": "3", "testtype": "functional"}]"#;
        let err = graded(row(r#"{"func_name": "add"}"#, unreadable)).unwrap_err();
        assert!(err.starts_with("test 1: input line 1 is not a JSON value"), "{err}");
    }

    #[test]
    fn unknown_platforms_and_missing_fields_are_errors() {
        let bad = row("{}", "[]").replace("leetcode", "hackerrank");
        assert!(RawProblem::parse(&bad).unwrap_err().contains("hackerrank"));
        let missing = row("{}", "[]").replace("\"difficulty\"", "\"level\"");
        assert!(RawProblem::parse(&missing).unwrap_err().contains("difficulty"));
    }
}
