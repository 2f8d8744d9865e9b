//! Where SFT rows come from: JSONL or Parquet files (one file, a directory of shards, or a
//! `train-*.parquet` pattern), which columns make a conversation, and the held-out split.
//!
//! **Columns are chosen, never guessed** (spec code-sft.md §4.2–4.3): codeforces-cots rows carry
//! both a string `prompt` and a `messages` list, and TRL ≥ 0.18 trips over exactly that. With
//! [`SftColumns`] the run names either a `messages` column (a list of `{role, content}`) or a
//! `prompt` and a `completion` column (each a string — a user / an assistant turn — or a list of
//! messages); for codeforces-cots `solutions_py_decontaminated` that is `{ messages = "messages" }`
//! or `{ prompt = "prompt", completion = "generation" }`. A row without a chosen column (or with
//! a null there) is an error naming the file and row. Only JSONL files may leave the columns
//! unnamed, for the `{"messages"}` / `{"prompt", "completion"}` rows kiln always accepted.
//!
//! **Held-out split** ([`SplitRule`]): the `heldout` rows whose SHA-256 digests of the key
//! column (`id` by default; the UTF-8 bytes of the string) are smallest are held out, ties (equal
//! ids) broken by row order; the rest train. Taking the k smallest digests, rather than "digest
//! mod N < k", gives exactly k held-out rows for any data (the seed's 8,133 → 8,005 + 128), is
//! independent of file order and shard layout, and is reproducible in one line of Python:
//! `sorted(range(len(ids)), key=lambda i: (hashlib.sha256(ids[i].encode()).hexdigest(), i))[:k]`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

pub use super::chat::SftColumns;
use super::chat::{Message, SftRow, check_row_messages};
use crate::error::{Error, Result};
use crate::io::jsonl_records;

/// How to hold rows out of training.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitRule {
    /// The column whose SHA-256 decides (`id` for codeforces-cots).
    pub key: String,
    /// How many rows to hold out (128 in the seed).
    pub heldout: usize,
}

/// An SFT data source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftSource {
    /// A `.jsonl` or `.parquet` file, a directory of them, or a pattern with `*` in its file name.
    pub path: PathBuf,
    pub columns: Option<SftColumns>,
    pub split: Option<SplitRule>,
}

/// Where a row is, for error messages: a JSONL line or a Parquet row (both 1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Line(usize),
    Row(usize),
}

/// One conversation and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftExample {
    pub messages: Vec<Message>,
    /// Leading messages that are the prompt: context only ([`super::chat::SftRow::prompt_turns`]).
    pub prompt_turns: usize,
    pub file: PathBuf,
    pub place: Place,
}

impl SftExample {
    /// An error about this row, naming its file and line or row.
    pub fn error(&self, message: impl Into<String>) -> Error {
        place_error(&self.file, &self.place, message.into())
    }
}

fn place_error(file: &Path, place: &Place, message: String) -> Error {
    match place {
        Place::Line(line) => Error::data(file, Some(*line), message),
        Place::Row(row) => Error::data(file, None, format!("row {row}: {message}")),
    }
}

/// What was read, for the run's data line.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SourceReport {
    pub files: usize,
    pub rows: usize,
    pub train: usize,
    pub heldout: usize,
    /// The split rule in words, when rows were held out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
    /// SHA-256 of the sorted held-out keys joined by "\n" (to compare splits across runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heldout_keys_sha256: Option<String>,
}

/// The rows of a source, split.
#[derive(Debug, Clone, PartialEq)]
pub struct SftRows {
    pub train: Vec<SftExample>,
    pub heldout: Vec<SftExample>,
    pub report: SourceReport,
}

/// Reads and splits the rows of `source`.
pub fn read_sft_rows(source: &SftSource) -> Result<SftRows> {
    let files = source_files(&source.path)?;
    let columns = source.columns.as_ref().map(SftColumns::names).transpose()?;
    let key = source.split.as_ref().map(|s| s.key.as_str());
    let mut examples = Vec::new();
    let mut keys = Vec::new();
    for file in &files {
        let is_parquet = file.extension().is_some_and(|e| e == "parquet");
        let records: Vec<(Place, Map<String, Value>)> = if is_parquet {
            let Some(names) = &columns else {
                return Err(Error::InvalidInput(format!(
                    "{}: Parquet SFT data needs its columns named (sft_columns = {{ messages = \"messages\" }} or {{ prompt = \"prompt\", completion = \"generation\" }})",
                    file.display()
                )));
            };
            let mut wanted = names.clone();
            wanted.extend(key.filter(|k| !names.contains(k)));
            let rows = read_parquet(file, &wanted)?;
            rows.into_iter().enumerate().map(|(i, row)| (Place::Row(i + 1), row)).collect()
        } else {
            jsonl_records(file)?.map(|r| r.map(|r| (Place::Line(r.line), r.fields))).collect::<Result<_>>()?
        };
        for (place, row) in records {
            let (messages, prompt_turns) = match &source.columns {
                Some(columns) => columns.conversation(&row),
                None if row.contains_key("messages") && row.contains_key("prompt") => Err(
                    "the row has both `messages` and `prompt`: name the columns to train on (sft_columns)".to_owned(),
                ),
                None => check_row_messages(&row).and_then(|()| {
                    serde_json::from_value::<SftRow>(Value::Object(row.clone()))
                        .map(|r| (r.messages(), r.prompt_turns()))
                        .map_err(|e| format!("not an SFT row ({{\"messages\": [...]}} or {{\"prompt\", \"completion\"}} with string `content`s): {e}"))
                }),
            }
            .map_err(|e| place_error(file, &place, e))?;
            if let Some(key) = key {
                match row.get(key) {
                    Some(Value::String(s)) => keys.push(s.clone()),
                    Some(Value::Number(n)) => keys.push(n.to_string()),
                    _ => return Err(place_error(file, &place, format!("no string split key {key:?}"))),
                }
            }
            examples.push(SftExample { messages, prompt_turns, file: file.clone(), place });
        }
    }
    if examples.is_empty() {
        return Err(Error::data(&source.path, None, "no SFT rows"));
    }
    let rows = examples.len();
    let mut report = SourceReport { files: files.len(), rows, train: rows, ..Default::default() };
    let Some(rule) = &source.split else {
        return Ok(SftRows { train: examples, heldout: Vec::new(), report });
    };
    if rule.heldout >= rows {
        return Err(Error::InvalidInput(format!("cannot hold out {} of {rows} SFT rows", rule.heldout)));
    }
    let held = heldout_mask(&keys, rule.heldout);
    let mut held_keys: Vec<&str> = keys.iter().zip(&held).filter(|(_, h)| **h).map(|(k, _)| k.as_str()).collect();
    held_keys.sort_unstable();
    report.heldout = rule.heldout;
    report.train = rows - rule.heldout;
    report.split = Some(format!("the {} rows with the smallest sha256({}) held out", rule.heldout, rule.key));
    report.heldout_keys_sha256 = Some(hex(&Sha256::digest(held_keys.join("\n").as_bytes())));
    let (heldout, train): (Vec<_>, Vec<_>) = examples.into_iter().zip(held).partition(|(_, h)| *h);
    Ok(SftRows { train: train.into_iter().map(|(e, _)| e).collect(), heldout: heldout.into_iter().map(|(e, _)| e).collect(), report })
}

/// The chosen columns of a Parquet file's rows.
#[cfg(feature = "code")]
fn read_parquet(file: &Path, columns: &[&str]) -> Result<Vec<Map<String, Value>>> {
    crate::io::parquet::read_parquet_columns(file, columns)
}

#[cfg(not(feature = "code"))]
fn read_parquet(file: &Path, _columns: &[&str]) -> Result<Vec<Map<String, Value>>> {
    Err(Error::data(file, None, "reading Parquet needs kiln-core's `code` feature (on by default in kiln)"))
}

/// `true` for the `heldout` keys with the smallest SHA-256 digests (ties by position).
pub fn heldout_mask(keys: &[String], heldout: usize) -> Vec<bool> {
    let digests: Vec<[u8; 32]> = keys.iter().map(|k| Sha256::digest(k.as_bytes()).into()).collect();
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| digests[a].cmp(&digests[b]).then(a.cmp(&b)));
    let mut mask = vec![false; keys.len()];
    for &i in order.iter().take(heldout) {
        mask[i] = true;
    }
    mask
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The data files of `path`: itself, the `.parquet` (else `.jsonl`) files of a directory, or the
/// files matching a `*` pattern in the file name; sorted by name.
pub(crate) fn source_files(path: &Path) -> Result<Vec<PathBuf>> {
    let pattern = path.file_name().and_then(|n| n.to_str()).filter(|n| n.contains('*'));
    let dir = match pattern {
        Some(_) => path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")),
        None if path.is_dir() => path,
        None => return Ok(vec![path.to_path_buf()]),
    };
    let matches = |name: &str| pattern.is_none_or(|p| wildcard_match(p, name));
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.file_name().and_then(|n| n.to_str()).is_some_and(matches))
        .collect();
    files.sort();
    let of = |ext: &str| -> Vec<PathBuf> { files.iter().filter(|p| p.extension().is_some_and(|e| e == ext)).cloned().collect() };
    let chosen = if !of("parquet").is_empty() { of("parquet") } else { of("jsonl") };
    if chosen.is_empty() {
        return Err(Error::data(path, None, "no .parquet or .jsonl SFT files here"));
    }
    Ok(chosen)
}

/// Shell-style matching with `*` only.
fn wildcard_match(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return pattern == name;
    }
    if !name.starts_with(first) || !name[first.len()..].ends_with(last) || name.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(all(test, feature = "code"))]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/code").join(name)
    }

    fn messages_columns() -> Option<SftColumns> {
        Some(SftColumns { messages: Some("messages".into()), ..Default::default() })
    }

    #[test]
    fn parquet_shards_jsonl_and_both_column_choices_give_the_same_conversations() {
        let read = |path: PathBuf, columns: Option<SftColumns>| read_sft_rows(&SftSource { path, columns, split: None }).unwrap();
        let parquet = read(fixture("cots_mini"), messages_columns());
        assert_eq!((parquet.report.files, parquet.report.rows), (2, 5));
        let pattern = read(fixture("cots_mini/train-*.parquet"), messages_columns());
        let jsonl = read(fixture("cots_mini.jsonl"), messages_columns());
        let pc = SftColumns { prompt: Some("prompt".into()), completion: Some("generation".into()), ..Default::default() };
        let prompt_generation = read(fixture("cots_mini"), Some(pc));
        let conversations = |rows: &SftRows| rows.train.iter().map(|e| e.messages.clone()).collect::<Vec<_>>();
        assert_eq!(conversations(&parquet), conversations(&pattern));
        assert_eq!(conversations(&parquet), conversations(&jsonl));
        assert_eq!(conversations(&parquet), conversations(&prompt_generation));
        assert_eq!(parquet.train[0].messages[0].role, "user");
        assert!(parquet.train[0].messages[1].content.starts_with("<think>"));
        assert_eq!(parquet.train[4].place, Place::Row(2), "row numbers are per file");
        assert_eq!(jsonl.train[4].place, Place::Line(5));
    }

    #[test]
    fn columns_are_never_guessed() {
        let err = read_sft_rows(&SftSource { path: fixture("cots_mini"), columns: None, split: None }).unwrap_err().to_string();
        assert!(err.contains("columns named"), "{err}");
        // The JSONL rows carry both `prompt` and `messages`: no default shape applies either.
        let err = read_sft_rows(&SftSource { path: fixture("cots_mini.jsonl"), columns: None, split: None }).unwrap_err().to_string();
        assert!(err.contains("cots_mini.jsonl line 1") && err.contains("both `messages` and `prompt`"), "{err}");
        let both = SftColumns { messages: Some("messages".into()), prompt: Some("prompt".into()), completion: None };
        assert!(both.names().is_err());
    }

    #[test]
    fn rows_without_the_chosen_columns_name_file_and_row() {
        let pc = SftColumns { prompt: Some("prompt".into()), completion: Some("generation".into()), ..Default::default() };
        let err = read_sft_rows(&SftSource { path: fixture("cots_bad.parquet"), columns: Some(pc), split: None }).unwrap_err().to_string();
        assert!(err.contains("cots_bad.parquet: row 2: column \"generation\" is null"), "{err}");
        let err = read_sft_rows(&SftSource { path: fixture("cots_bad.parquet"), columns: messages_columns(), split: None }).unwrap_err().to_string();
        assert!(err.contains("no column \"messages\""), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.jsonl");
        std::fs::write(&path, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n{\"messages\": \"oops\"}\n").unwrap();
        let err = read_sft_rows(&SftSource { path: path.clone(), columns: messages_columns(), split: None }).unwrap_err().to_string();
        assert!(err.contains("rows.jsonl line 2") && err.contains("column \"messages\""), "{err}");
    }

    #[test]
    fn the_split_matches_python_and_holds_out_exactly_k() {
        let expected: Value = serde_json::from_str(&std::fs::read_to_string(fixture("cots_mini/expected_split.json")).unwrap()).unwrap();
        let split = SplitRule { key: "id".into(), heldout: 2 };
        let rows = read_sft_rows(&SftSource { path: fixture("cots_mini"), columns: messages_columns(), split: Some(split) }).unwrap();
        let prompt_of = |e: &SftExample| e.messages[0].content.clone();
        let all = read_sft_rows(&SftSource { path: fixture("cots_mini.jsonl"), columns: messages_columns(), split: None }).unwrap();
        let ids: Vec<String> = std::fs::read_to_string(fixture("cots_mini.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["id"].as_str().unwrap().to_owned())
            .collect();
        let held: Vec<&str> = all.train.iter().zip(&ids).filter(|(e, _)| rows.heldout.iter().any(|h| prompt_of(h) == prompt_of(e))).map(|(_, id)| id.as_str()).collect();
        let want: Vec<&str> = expected["heldout_ids"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(held, want);
        assert_eq!((rows.report.train, rows.report.heldout, rows.train.len()), (3, 2, 3));
        assert!(rows.report.split.as_deref().unwrap().contains("sha256(id)"));

        // The seed's sizes: 8,133 rows → 8,005 train + 128 held out, whatever the ids.
        let keys: Vec<String> = (0..8133).map(|i| format!("{}/{}", 1 + i / 7, (b'A' + (i % 7) as u8) as char)).collect();
        let mask = heldout_mask(&keys, 128);
        assert_eq!(mask.iter().filter(|h| **h).count(), 128);
        let mut reversed = keys.clone();
        reversed.reverse();
        let mut back = heldout_mask(&reversed, 128);
        back.reverse();
        assert_eq!(mask, back, "membership does not depend on row order");
        let err = read_sft_rows(&SftSource { path: fixture("cots_mini"), columns: messages_columns(), split: Some(SplitRule { key: "id".into(), heldout: 5 }) }).unwrap_err();
        assert!(err.to_string().contains("cannot hold out 5 of 5"));
    }

    #[test]
    fn wildcards() {
        assert!(wildcard_match("train-*.parquet", "train-00000-of-00003.parquet"));
        assert!(!wildcard_match("train-*.parquet", "test-00000.parquet"));
        assert!(!wildcard_match("a*a", "a"));
        assert!(wildcard_match("*", "x"));
        assert!(wildcard_match("a*b*c", "aXbYc"));
        assert!(!wildcard_match("a*b*c", "aXcYb"));
    }
}
