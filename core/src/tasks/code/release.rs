//! Which LiveCodeBench problems to evaluate: a release (its files) and a contest-date window
//! (spec code-sft.md §8.1).
//!
//! The dataset `livecodebench/code_generation_lite` ships one JSONL file per increment:
//! `test.jsonl` (v1, 400 problems), `test2.jsonl` (111), `test3.jsonl` (101), `test4.jsonl` (101),
//! `test5.jsonl` (167), `test6.jsonl` (175). Its loader names them as LiveCodeBench does:
//! `release_vN` is cumulative (v1 … vN, `release_latest` = `release_v6`), `vN` is the single
//! increment (so **`v6` = `test6.jsonl`, the 175 problems** of the seed's "full175") and `vA_vB`
//! the increments A to B. The date window keeps `from <= contest_date <= to` with the bounds at
//! midnight, as `load_code_generation_dataset(start_date, end_date)` does.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::problem::{ContestDate, Problem, RawProblem};
use crate::error::{Error, Result};
use crate::tasks::Source;

/// The release files in order, with their problem counts.
pub const RELEASE_FILES: [(&str, usize); 6] = [
    ("test.jsonl", 400),
    ("test2.jsonl", 111),
    ("test3.jsonl", 101),
    ("test4.jsonl", 101),
    ("test5.jsonl", 167),
    ("test6.jsonl", 175),
];

/// A release tag and the files it covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Release {
    name: String,
    /// 1-based increments, inclusive.
    first: usize,
    last: usize,
}

impl Release {
    /// `release_v1` … `release_v6`, `release_latest`, `v1` … `v6`, or `vA_vB` (A < B).
    pub fn parse(name: &str) -> Result<Self> {
        let version = |s: &str| s.strip_prefix('v').and_then(|n| n.parse::<usize>().ok()).filter(|n| (1..=RELEASE_FILES.len()).contains(n));
        let (first, last) = if name == "release_latest" {
            (1, RELEASE_FILES.len())
        } else if let Some(v) = name.strip_prefix("release_").and_then(version) {
            (1, v)
        } else if let Some((a, b)) = name.split_once('_') {
            match (version(a), version(b)) {
                (Some(a), Some(b)) if a < b => (a, b),
                _ => (0, 0),
            }
        } else {
            version(name).map_or((0, 0), |v| (v, v))
        };
        if first == 0 {
            return Err(Error::InvalidInput(format!(
                "unknown LiveCodeBench release {name:?}: use release_v1 … release_v6, release_latest, v1 … v6 (one increment, v6 = test6.jsonl) or vA_vB"
            )));
        }
        Ok(Self { name: name.to_owned(), first, last })
    }

    /// The tag as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file names of this release, in order.
    pub fn files(&self) -> Vec<&'static str> {
        RELEASE_FILES[self.first - 1..self.last].iter().map(|(f, _)| *f).collect()
    }

    /// How many problems the official files of this release hold.
    pub fn expected_problems(&self) -> usize {
        RELEASE_FILES[self.first - 1..self.last].iter().map(|(_, n)| n).sum()
    }
}

impl TryFrom<String> for Release {
    type Error = Error;
    fn try_from(name: String) -> Result<Self> {
        Self::parse(&name)
    }
}

impl From<Release> for String {
    fn from(release: Release) -> String {
        release.name
    }
}

/// A contest-date window; either bound may be open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DateWindow {
    pub from: Option<ContestDate>,
    pub to: Option<ContestDate>,
}

impl DateWindow {
    /// A window from `YYYY-MM-DD` strings (bounds at midnight, both inclusive).
    pub fn parse(from: Option<&str>, to: Option<&str>) -> Result<Self> {
        let date = |s: &str| {
            ContestDate::parse(s).ok_or_else(|| Error::InvalidInput(format!("{s:?} is not a date (YYYY-MM-DD)")))
        };
        let window = Self { from: from.map(date).transpose()?, to: to.map(date).transpose()? };
        if let (Some(from), Some(to)) = (window.from, window.to)
            && from > to
        {
            return Err(Error::InvalidInput(format!("the date window is empty: {from} is after {to}")));
        }
        Ok(window)
    }

    /// Whether `date` lies in the window.
    pub fn contains(&self, date: ContestDate) -> bool {
        self.from.is_none_or(|from| from <= date) && self.to.is_none_or(|to| date <= to)
    }
}

/// Which problems to load.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Required when the problems path is a directory of release files; for a single file it
    /// must name that file.
    pub release: Option<Release>,
    pub window: DateWindow,
}

/// Loads the selected problems. `path` is a directory holding the release files (`--release`
/// picks them) or one JSONL file of problem rows. Rows outside the date window are skipped
/// before their tests are decoded. Errors name the file and line; a question id seen twice is
/// an error.
pub fn load_problems(path: &Path, selection: &Selection) -> Result<Vec<Problem>> {
    Ok(load_selected(path, selection)?.into_iter().map(|(problem, _)| problem).collect())
}

/// [`load_problems`], with the file and line each problem was read from.
pub fn load_selected(path: &Path, selection: &Selection) -> Result<Vec<(Problem, Source)>> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let release = selection.release.as_ref().ok_or_else(|| {
            Error::InvalidInput(format!("{} is a directory: name the release to read from it (e.g. --release v6)", path.display()))
        })?;
        release.files().into_iter().map(|f| path.join(f)).collect()
    } else {
        if let Some(release) = &selection.release {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if !release.files().contains(&name) {
                return Err(Error::InvalidInput(format!(
                    "{} is not a file of release {} ({}); give the directory holding the release files, or select by date",
                    path.display(),
                    release.name(),
                    release.files().join(", ")
                )));
            }
        }
        vec![path.to_path_buf()]
    };
    let mut problems: Vec<(Problem, Source)> = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for file in files {
        let reader = BufReader::new(File::open(&file).map_err(|e| Error::io(&file, e))?);
        for (i, line) in reader.lines().enumerate() {
            let line_no = i + 1;
            let line = line.map_err(|e| Error::data(&file, Some(line_no), e.to_string()))?;
            if line.trim().is_empty() {
                continue;
            }
            let at = |message: String| Error::data(&file, Some(line_no), message);
            let raw = RawProblem::parse(&line).map_err(at)?;
            if !selection.window.contains(raw.contest_date().map_err(at)?) {
                continue;
            }
            if let Some((first_file, first_line)) = seen.insert(raw.question_id.clone(), (file.clone(), line_no)) {
                return Err(at(format!("question_id {:?} already appears in {} line {first_line}", raw.question_id, first_file.display())));
            }
            problems.push((raw.decode().map_err(at)?, Source { file: file.clone(), line: line_no }));
        }
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::code::problem::{Difficulty, Platform, TestMode};

    fn mini() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/code/lcb_mini")
    }

    #[test]
    fn release_tags_map_to_files_as_the_loader_does() {
        let files = |n: &str| Release::parse(n).unwrap().files();
        assert_eq!(files("v6"), vec!["test6.jsonl"]);
        assert_eq!(files("v1"), vec!["test.jsonl"]);
        assert_eq!(files("release_v2"), vec!["test.jsonl", "test2.jsonl"]);
        assert_eq!(files("release_latest").len(), 6);
        assert_eq!(files("v4_v5"), vec!["test4.jsonl", "test5.jsonl"]);
        assert_eq!(Release::parse("v6").unwrap().expected_problems(), 175);
        assert_eq!(Release::parse("release_v5").unwrap().expected_problems(), 880);
        assert_eq!(Release::parse("release_v6").unwrap().expected_problems(), 1055);
        for bad in ["v7", "v0", "release_v7", "v5_v5", "v6_v5", "6", "latest", ""] {
            assert!(Release::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn loads_the_mini_release_with_pickled_private_tests() {
        let v6 = load_problems(&mini(), &Selection { release: Some(Release::parse("v6").unwrap()), ..Default::default() }).unwrap();
        let ids: Vec<&str> = v6.iter().map(|p| p.question_id.as_str()).collect();
        assert_eq!(ids, vec!["9001", "9002", "2070B", "abc395_b", "9003"]);
        let two_sum = &v6[0];
        assert_eq!((two_sum.platform, two_sum.difficulty), (Platform::Leetcode, Difficulty::Easy));
        assert_eq!(two_sum.mode(), TestMode::Call { func_name: "twoSum" });
        assert!(two_sum.starter_code.starts_with("class Solution:\n    def twoSum"));
        assert_eq!(two_sum.private_tests[0].input, "[3, 2, 4]\n6");
        assert_eq!(two_sum.private_tests[0].output, "[1, 2]");
        assert_eq!(two_sum.tests().count(), 3);
        // A pickle above the 64 KiB frame size (protocol 4).
        let big = &v6[2];
        assert_eq!(big.mode(), TestMode::Stdin);
        assert!(big.private_tests[0].input.len() > 65536);
        assert!(big.private_tests[0].input.starts_with("25000\n-48 -47 "));

        let both = load_problems(&mini(), &Selection { release: Some(Release::parse("v5_v6").unwrap()), ..Default::default() }).unwrap();
        assert_eq!(both.len(), 8);
        assert_eq!(both[1].private_tests.len(), 2, "plain JSON private tests");
        assert_eq!(both[2].public_tests[0].output, "2.50\n");
    }

    #[test]
    fn date_windows_and_single_files() {
        let window = DateWindow::parse(Some("2025-01-04"), Some("2025-03-01")).unwrap();
        let selected = load_problems(&mini(), &Selection { release: Some(Release::parse("v5_v6").unwrap()), window }).unwrap();
        let ids: Vec<&str> = selected.iter().map(|p| p.question_id.as_str()).collect();
        // 2025-01-04T00:00 is in; 2025-03-01T00:00 is in (midnight bound); later ones are out.
        assert_eq!(ids, vec!["abc901_c", "9001", "9002", "2070B"]);

        let file = mini().join("test6.jsonl");
        assert_eq!(load_problems(&file, &Selection::default()).unwrap().len(), 5);
        let err = load_problems(&file, &Selection { release: Some(Release::parse("v5").unwrap()), ..Default::default() }).unwrap_err();
        assert!(err.to_string().contains("test5.jsonl"), "{err}");
        let err = load_problems(&mini(), &Selection::default()).unwrap_err();
        assert!(err.to_string().contains("--release"), "{err}");
        let err = load_problems(&mini(), &Selection { release: Some(Release::parse("release_v6").unwrap()), ..Default::default() }).unwrap_err();
        assert!(err.to_string().contains("test.jsonl"), "a missing release file is named: {err}");
        assert!(DateWindow::parse(Some("2025-02-01"), Some("2025-01-01")).is_err());
        assert!(DateWindow::parse(Some("2025/02/01"), None).is_err());
    }

    #[test]
    fn bad_rows_name_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let good = std::fs::read_to_string(mini().join("test5.jsonl")).unwrap();
        let first = good.lines().next().unwrap();
        let path = dir.path().join("test6.jsonl");
        std::fs::write(&path, format!("{first}\n\n{first}\n")).unwrap();
        let err = load_problems(&path, &Selection::default()).unwrap_err().to_string();
        assert!(err.contains("test6.jsonl line 3") && err.contains("already appears"), "{err}");
        std::fs::write(&path, format!("{first}\n{}\n", first.replace("eJx", "eJy").replace("abc900_a", "abc900_b"))).unwrap();
        let err = load_problems(&path, &Selection::default()).unwrap_err().to_string();
        assert!(err.contains("test6.jsonl line 2") && err.contains("private_test_cases"), "{err}");
        std::fs::write(&path, "{\"question_id\": \"1\"}\n").unwrap();
        let err = load_problems(&path, &Selection::default()).unwrap_err().to_string();
        assert!(err.contains("line 1") && err.contains("missing field"), "{err}");
    }
}
