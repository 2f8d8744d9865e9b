//! n-gram overlap between training rows and evaluation problems (`kiln data decontaminate`),
//! by the rule of OpenR1's `scripts/decontaminate.py` (spec code-sft.md §1 item 8, §10.1 item 10).
//!
//! **Tokenisation.** A text is lower-cased (Rust's `to_lowercase`, Unicode's full lower-case
//! mapping; Python's `str.lower` differs only in a few context-dependent letters such as a final
//! capital sigma) and split on Unicode white space (Python's `str.split()` also splits on the
//! ASCII separators U+001C–U+001F); its n-grams are the runs of n consecutive words, joined by
//! one space. A text with fewer than n words has none.
//!
//! **Overlap.** A training row overlaps a problem when one of the row's n-grams is one of the
//! problem's (OpenR1 flags the row as contaminated: `any(ngram in lookup …)`). The problem's text
//! is LiveCodeBench's `question_content`, which OpenR1 checked (against `v4_v5` only); the row's
//! is one column: a string, or a list of `{role, content}` messages, whose user turns are joined
//! by "\n".

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::data::sft_source::source_files;
use crate::error::{Error, Result};
use crate::io::jsonl_records;

/// OpenR1's n-gram size.
pub const NGRAM: usize = 8;

/// The word n-grams of `text` (see the module docs).
pub fn word_ngrams(text: &str, n: usize) -> Vec<String> {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower.split_whitespace().collect();
    if n == 0 || words.len() < n {
        return Vec::new();
    }
    words.windows(n).map(|w| w.join(" ")).collect()
}

/// A training row's text and where it is.
#[derive(Debug, Clone, PartialEq)]
pub struct TextRow {
    /// `file:line` (JSONL) or `file row N` (Parquet), or the row's id.
    pub name: String,
    pub text: String,
}

/// One training row that shares n-grams with problems.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RowOverlap {
    pub row: String,
    /// `(question_id, shared n-grams)`, most shared first.
    pub problems: Vec<(String, usize)>,
    /// One shared n-gram, to look at.
    pub example: String,
}

/// The overlap report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub ngram: usize,
    pub rows: usize,
    pub problems: usize,
    /// Rows sharing at least one n-gram with a problem.
    pub contaminated_rows: usize,
    /// Problems sharing at least one n-gram with a row.
    pub contaminated_problems: Vec<String>,
    pub overlaps: Vec<RowOverlap>,
}

/// The overlap of `rows` with `problems` (`(question_id, text)`) in `n`-grams.
pub fn overlap(rows: &[TextRow], problems: &[(String, String)], n: usize) -> Report {
    let mut lookup: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, (_, text)) in problems.iter().enumerate() {
        for gram in word_ngrams(text, n).into_iter().collect::<HashSet<_>>() {
            lookup.entry(gram).or_default().push(i);
        }
    }
    let mut overlaps = Vec::new();
    let mut hit = vec![false; problems.len()];
    let stage = crate::progress::stage("decontamination", rows.len() as u64, "rows");
    for (r, row) in rows.iter().enumerate() {
        let mut shared: BTreeMap<usize, usize> = BTreeMap::new();
        let mut example = None;
        for gram in word_ngrams(&row.text, n).into_iter().collect::<HashSet<_>>() {
            if let Some(owners) = lookup.get(&gram) {
                for &p in owners {
                    *shared.entry(p).or_default() += 1;
                    hit[p] = true;
                }
                // The smallest shared n-gram, so the report does not depend on hashing.
                if example.as_ref().is_none_or(|e: &String| gram < *e) {
                    example = Some(gram);
                }
            }
        }
        if let Some(example) = example {
            let mut problems: Vec<(String, usize)> = shared.into_iter().map(|(p, count)| (problems[p].0.clone(), count)).collect();
            problems.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            overlaps.push(RowOverlap { row: row.name.clone(), problems, example });
        }
        stage.set_position(r as u64 + 1);
    }
    drop(stage);
    Report {
        ngram: n,
        rows: rows.len(),
        problems: problems.len(),
        contaminated_rows: overlaps.len(),
        contaminated_problems: problems.iter().zip(&hit).filter(|(_, h)| **h).map(|((id, _), _)| id.clone()).collect(),
        overlaps,
    }
}

/// The texts of `column` of the rows at `path` (a JSONL or Parquet file, a directory of them, or
/// a `train-*.parquet` pattern), named by `id_column` when given; errors name file and row.
pub fn read_text_rows(path: &Path, column: &str, id_column: Option<&str>) -> Result<Vec<TextRow>> {
    let mut rows = Vec::new();
    for file in source_files(path)? {
        let records: Vec<(String, Map<String, Value>)> = if file.extension().is_some_and(|e| e == "parquet") {
            let columns: Vec<&str> = std::iter::once(column).chain(id_column).collect();
            let records = crate::io::parquet::read_parquet_columns(&file, &columns)?;
            records.into_iter().enumerate().map(|(i, r)| (format!("{} row {}", file.display(), i + 1), r)).collect()
        } else {
            jsonl_records(&file)?.map(|r| r.map(|r| (format!("{}:{}", file.display(), r.line), r.fields))).collect::<Result<_>>()?
        };
        for (place, record) in records {
            let bad = |message: String| Error::InvalidInput(format!("{place}: {message}"));
            let text = row_text(record.get(column)).map_err(|e| bad(format!("column {column:?}: {e}")))?;
            let name = match id_column {
                None => place.clone(),
                Some(key) => match record.get(key) {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Number(n)) => n.to_string(),
                    _ => return Err(bad(format!("no string or number id column {key:?}"))),
                },
            };
            rows.push(TextRow { name, text });
        }
    }
    Ok(rows)
}

fn row_text(value: Option<&Value>) -> std::result::Result<String, String> {
    match value {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(messages)) => {
            let user: Vec<&str> = messages
                .iter()
                .filter(|m| m.get("role").and_then(Value::as_str) == Some("user"))
                .filter_map(|m| m.get("content").and_then(Value::as_str))
                .collect();
            if user.is_empty() { Err("a list without user messages".into()) } else { Ok(user.join("\n")) }
        }
        None | Some(Value::Null) => Err("missing".into()),
        Some(_) => Err("expected a string or a list of {role, content} messages".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngrams_lowercase_and_split_on_white_space() {
        assert_eq!(word_ngrams("A  b\tC\nd", 2), ["a b", "b c", "c d"]);
        assert_eq!(word_ngrams("one two", 3), Vec::<String>::new());
        assert_eq!(word_ngrams("Σ X", 2), ["σ x"]);
    }

    #[test]
    fn overlap_finds_the_shared_problem() {
        let problems = vec![
            ("p1".to_owned(), "Given an array of n integers find the maximum sum of a subarray".to_owned()),
            ("p2".to_owned(), "Print hello world".to_owned()),
        ];
        let rows = vec![
            TextRow { name: "r1".into(), text: "You are given: GIVEN AN ARRAY OF N INTEGERS FIND THE MAXIMUM sum please".into() },
            TextRow { name: "r2".into(), text: "print hello world and nothing else at all today".into() },
        ];
        let report = overlap(&rows, &problems, 8);
        assert_eq!((report.rows, report.problems, report.contaminated_rows), (2, 2, 1));
        assert_eq!(report.contaminated_problems, ["p1"]);
        // "given an array of n integers find the" and "… find the maximum", "… the maximum sum".
        assert_eq!(report.overlaps[0].problems, [("p1".to_owned(), 3)]);
        assert_eq!(report.overlaps[0].example, "an array of n integers find the maximum");
    }
}
