//! JSONL input with errors that name file and line, and output files that appear whole or not
//! at all (written to a temporary sibling, renamed on commit, removed if dropped uncommitted).

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

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

/// Python's `int(value)` for the JSON values the reference feeds it: ints, floats (truncated),
/// booleans and decimal strings. `None` where Python raises.
pub fn py_int(value: &Value) -> Option<i64> {
    match value {
        Value::Bool(b) => Some(i64::from(*b)),
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite())
                .map(|f| f.trunc() as i64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Python's `str(value)` for a JSON scalar (`10` → `"10"`, `null` → `"None"`, `true` → `"True"`).
pub fn py_str(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => "None".to_owned(),
        Some(Value::Bool(true)) => "True".to_owned(),
        Some(Value::Bool(false)) => "False".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(i) => i.to_string(),
            None => n
                .as_f64()
                .map_or_else(|| n.to_string(), super::pyjson::float_repr),
        },
        Some(other) => other.to_string(),
    }
}

/// `str(pathlib.Path(p))`: drops `.` components, repeated and trailing slashes.
pub fn py_path(path: &Path) -> String {
    let text = path.to_string_lossy();
    let absolute = text.starts_with('/');
    let parts: Vec<&str> = text
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    match (absolute, parts.is_empty()) {
        (true, _) => format!("/{}", parts.join("/")),
        (false, true) => ".".to_owned(),
        (false, false) => parts.join("/"),
    }
}

/// An output file that only appears under its name when [`AtomicFile::commit`] is called.
#[derive(Debug)]
pub struct AtomicFile {
    path: PathBuf,
    tmp: PathBuf,
    writer: Option<BufWriter<File>>,
}

impl AtomicFile {
    /// Starts writing `path` (its parent directory is created).
    pub fn create(path: &Path) -> Result<Self> {
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = parent.join(format!(".{name}.tmp{}", std::process::id()));
        let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            writer: Some(BufWriter::new(file)),
        })
    }

    /// Appends `text`.
    pub fn write_str(&mut self, text: &str) -> Result<()> {
        let writer = self.writer.as_mut().expect("writer present until commit");
        writer
            .write_all(text.as_bytes())
            .map_err(|e| Error::io(&self.tmp, e))
    }

    /// Appends `line` and a newline.
    pub fn write_line(&mut self, line: &str) -> Result<()> {
        self.write_str(line)?;
        self.write_str("\n")
    }

    /// Flushes and moves the file to its final name.
    pub fn commit(mut self) -> Result<()> {
        let writer = self.writer.take().expect("writer present until commit");
        let file = writer
            .into_inner()
            .map_err(|e| Error::io(&self.tmp, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&self.tmp, e))?;
        std::fs::rename(&self.tmp, &self.path).map_err(|e| Error::io(&self.path, e))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.writer.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `contents` to `path` atomically.
pub fn write_atomic(path: &Path, contents: &str) -> Result<()> {
    let mut file = AtomicFile::create(path)?;
    file.write_str(contents)?;
    file.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_conversions() {
        assert_eq!(py_int(&serde_json::json!(12)), Some(12));
        assert_eq!(py_int(&serde_json::json!(12.9)), Some(12));
        assert_eq!(py_int(&serde_json::json!(" 7 ")), Some(7));
        assert_eq!(py_int(&serde_json::json!("x")), None);
        assert_eq!(py_str(Some(&serde_json::json!(10))), "10");
        assert_eq!(py_str(Some(&serde_json::json!("10"))), "10");
        assert_eq!(py_str(None), "None");
        assert_eq!(py_path(Path::new("./scoring//")), "scoring");
        assert_eq!(py_path(Path::new("a/./b")), "a/b");
    }

    #[test]
    fn bad_lines_name_file_and_line_and_uncommitted_files_vanish() {
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

        let out = dir.path().join("out/y.txt");
        let mut file = AtomicFile::create(&out).unwrap();
        file.write_line("partial").unwrap();
        drop(file);
        assert!(!out.exists());
        assert_eq!(
            std::fs::read_dir(dir.path().join("out")).unwrap().count(),
            0
        );
        write_atomic(&out, "whole\n").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "whole\n");
    }
}
