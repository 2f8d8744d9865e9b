//! JSONL input with errors that name file and line: one object per line, blank lines skipped
//! (as the reference's `load_jsonl` does), and the `*.jsonl` files of a directory.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::python::py_int;
use crate::error::{Error, Result};

/// One JSON object of a JSONL file and its 1-based line number.
#[derive(Debug, Clone)]
pub struct Record {
    /// 1-based line number in the file.
    pub line: usize,
    /// The parsed object.
    pub fields: Map<String, Value>,
}

/// Streams the objects of a JSONL file. Blank lines are skipped (as the reference's `load_jsonl`
/// does); a line that is not a JSON object is an error naming the file and line.
pub fn jsonl_records(path: &Path) -> Result<impl Iterator<Item = Result<Record>> + use<>> {
    records(path, |_| {})
}

/// [`jsonl_records`] reported as a progress stage named `verb` and the file's name, over its
/// megabytes (for files of millions of samples: scoring, metrics).
pub fn jsonl_records_reported(path: &Path, verb: &str) -> Result<impl Iterator<Item = Result<Record>> + use<>> {
    const MB: u64 = 1 << 20;
    let size = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
    let stage = crate::progress::file_stage(verb, path, size.div_ceil(MB), "MB");
    let (mut read, mut shown) = (0u64, 0u64);
    records(path, move |bytes| {
        read += bytes as u64 + 1;
        if read / MB != shown {
            shown = read / MB;
            stage.set_position(shown);
        }
    })
}

/// The records of `path`; `on_line` is given each line's length in bytes as it is read.
fn records<F: FnMut(usize)>(path: &Path, mut on_line: F) -> Result<impl Iterator<Item = Result<Record>> + use<F>> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let path = path.to_path_buf();
    Ok(BufReader::new(file)
        .lines()
        .enumerate()
        .filter_map(move |(i, line)| {
            let line_no = i + 1;
            let text = match line {
                Ok(text) => text,
                Err(e) => return Some(Err(Error::data(&path, Some(line_no), e.to_string()))),
            };
            on_line(text.len());
            if text.trim().is_empty() {
                return None;
            }
            Some(match serde_json::from_str::<Value>(&text) {
                Ok(Value::Object(fields)) => Ok(Record {
                    line: line_no,
                    fields,
                }),
                Ok(_) => Err(Error::data(&path, Some(line_no), "expected a JSON object")),
                Err(e) => Err(Error::json(&path, Some(line_no), e)),
            })
        }))
}

/// Reads every object of a JSONL file (see [`jsonl_records`]).
pub fn read_jsonl(path: &Path) -> Result<Vec<Record>> {
    jsonl_records(path)?.collect()
}

impl Record {
    /// The string field `key`, or an error naming file and line.
    pub fn str_field(&self, path: &Path, key: &str) -> Result<&str> {
        match self.fields.get(key) {
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(Error::data(
                path,
                Some(self.line),
                format!("field {key:?} is not a string"),
            )),
            None => Err(Error::data(
                path,
                Some(self.line),
                format!("missing field {key:?}"),
            )),
        }
    }

    /// The integer field `key` (a JSON integer, an integral float, or a decimal string), or an
    /// error naming file and line.
    pub fn int_field(&self, path: &Path, key: &str) -> Result<i64> {
        let value = self
            .fields
            .get(key)
            .ok_or_else(|| Error::data(path, Some(self.line), format!("missing field {key:?}")))?;
        py_int(value).ok_or_else(|| {
            Error::data(
                path,
                Some(self.line),
                format!("field {key:?} is not an integer: {value}"),
            )
        })
    }
}


/// The `*.jsonl` files directly in `dir`, sorted by name (Python's `sorted(dir.glob("*.jsonl"))`).
pub fn jsonl_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        if path.is_file()
            && path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with(".jsonl"))
        {
            files.push(path);
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lines_name_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.jsonl");
        std::fs::write(&path, "{\"a\": 1}\n\n[1]\n{oops\n").unwrap();
        let results: Vec<_> = jsonl_records(&path).unwrap().collect();
        assert_eq!(results.len(), 3);
        assert_eq!(results[0].as_ref().unwrap().line, 1);
        let e = results[1].as_ref().unwrap_err().to_string();
        assert!(e.contains("x.jsonl line 3"), "{e}");
        let e = results[2].as_ref().unwrap_err().to_string();
        assert!(e.contains("x.jsonl line 4"), "{e}");

        let binary = dir.path().join("b.jsonl");
        std::fs::write(&binary, b"{\"a\": 1}\n\xff\n").unwrap();
        let e = read_jsonl(&binary).unwrap_err().to_string();
        assert!(e.contains("b.jsonl line 2"), "{e}");

        std::fs::create_dir(dir.path().join("d.jsonl")).unwrap();
        std::fs::write(dir.path().join("a.txt"), "").unwrap();
        let names: Vec<String> = jsonl_files(dir.path()).unwrap().iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["b.jsonl", "x.jsonl"], "files only, sorted by name");
    }
}
