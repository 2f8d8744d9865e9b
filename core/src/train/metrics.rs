//! Training metrics: one JSON object per line (`metrics.jsonl`), flushed as written.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Appends metric records to a JSONL file.
pub struct MetricsLog {
    path: PathBuf,
    file: File,
}

impl MetricsLog {
    /// Opens `path` for appending. Records of steps after `resume_step` (left by a run that died
    /// after its last checkpoint) are dropped first, so a resumed run's log reads as one run.
    pub fn open(path: &Path, resume_step: Option<u64>) -> Result<Self> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        match resume_step {
            Some(step) if path.is_file() => {
                let file = File::open(path).map_err(|e| Error::io(path, e))?;
                let mut kept = String::new();
                for line in BufReader::new(file).lines() {
                    let line = line.map_err(|e| Error::io(path, e))?;
                    let record_step = serde_json::from_str::<Value>(&line).ok().and_then(|v| v["step"].as_u64());
                    if record_step.is_some_and(|s| s <= step) {
                        kept.push_str(&line);
                        kept.push('\n');
                    }
                }
                crate::io::write_atomic(path, &kept)?;
            }
            None if path.is_file() => std::fs::remove_file(path).map_err(|e| Error::io(path, e))?,
            _ => {}
        }
        let file = OpenOptions::new().create(true).append(true).open(path).map_err(|e| Error::io(path, e))?;
        Ok(Self { path: path.to_path_buf(), file })
    }

    /// Flushes the records written so far to the disk (with each checkpoint).
    pub fn sync(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| Error::io(&self.path, e))
    }

    /// Writes one record.
    pub fn write(&mut self, record: &Map<String, Value>) -> Result<()> {
        let line = serde_json::to_string(record).map_err(|e| Error::json(&self.path, None, e))?;
        writeln!(self.file, "{line}").map_err(|e| Error::io(&self.path, e))
    }
}

/// Resident set size of this process in MiB (Linux; `None` elsewhere).
pub fn rss_mib() -> Option<f64> {
    status_mib("VmRSS:")
}

/// The largest resident set size this process has had, in MiB (Linux; `None` elsewhere).
pub fn peak_rss_mib() -> Option<f64> {
    status_mib("VmHWM:")
}

fn status_mib(key: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
