//! A batch's run index (docs/release-layout.md): `<batch>/runs.json`, one record per run (its
//! checkpoint's path, the run, its config, the model, what it started from, start and end times
//! in UTC), rendered as the batch's `README.md`. A run's start is its first start; a resumed run
//! keeps it. Both files are rewritten whole (atomically) after every change.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::io::write_atomic;

/// One run of a batch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// What the run wrote, relative to the batch (`rl/op11_14_step200`, `evals/summary.csv`).
    pub path: String,
    /// `pretrain`, `rl op11_14`, `opd`, `eval`.
    pub run: String,
    /// The effective config, relative to the batch (`configs/rl_op11_14.toml`).
    pub config: String,
    /// The config it was made from.
    pub source: String,
    /// The model trained or evaluated.
    pub model: String,
    /// The checkpoint it started from, relative to the batch.
    #[serde(default)]
    pub from: Option<String>,
    /// UTC, RFC 3339, to the second.
    pub start: Option<String>,
    pub end: Option<String>,
}

/// The run index of one batch.
#[derive(Debug, Clone, PartialEq)]
pub struct RunIndex {
    dir: PathBuf,
    /// The heading's note (scale, release file).
    pub note: String,
    pub records: Vec<RunRecord>,
}

/// The file names.
pub const INDEX_JSON: &str = "runs.json";
pub const INDEX_README: &str = "README.md";

/// Now, in UTC, as RFC 3339 to the second (`2025-12-01T09:30:16Z`).
pub fn utc_now() -> String {
    let now = time::OffsetDateTime::now_utc().replace_nanosecond(0).unwrap_or_else(|_| time::OffsetDateTime::now_utc());
    now.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

impl RunIndex {
    /// The index of the batch at `dir` (empty if it has none yet).
    pub fn load(dir: &Path, note: &str) -> Result<Self> {
        let path = dir.join(INDEX_JSON);
        let records = if path.is_file() {
            let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
            serde_json::from_str(&text).map_err(|e| Error::json(&path, None, e))?
        } else {
            Vec::new()
        };
        Ok(Self { dir: dir.to_path_buf(), note: note.to_owned(), records })
    }

    /// The record of `run`, if any.
    pub fn get(&self, run: &str) -> Option<&RunRecord> {
        self.records.iter().find(|r| r.run == run)
    }

    /// Records that `record.run` starts now (keeping an earlier start) and saves.
    pub fn started(&mut self, mut record: RunRecord) -> Result<()> {
        let earlier = self.get(&record.run).and_then(|r| r.start.clone());
        record.start = earlier.or_else(|| Some(utc_now()));
        record.end = None;
        self.put(record)
    }

    /// Records that `run` ended now (its record must exist) and saves.
    pub fn ended(&mut self, run: &str) -> Result<()> {
        let mut record = self.get(run).cloned().ok_or_else(|| Error::InvalidInput(format!("no run {run:?} in the index")))?;
        record.end = Some(utc_now());
        self.put(record)
    }

    /// Replaces or appends `record` and saves.
    fn put(&mut self, record: RunRecord) -> Result<()> {
        match self.records.iter_mut().find(|r| r.run == record.run) {
            Some(slot) => *slot = record,
            None => self.records.push(record),
        }
        self.save()
    }

    /// Writes `runs.json` and `README.md`.
    pub fn save(&self) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        let path = self.dir.join(INDEX_JSON);
        let json = serde_json::to_string_pretty(&self.records).map_err(|e| Error::json(&path, None, e))?;
        write_atomic(&path, &(json + "\n"))?;
        write_atomic(&self.dir.join(INDEX_README), &self.readme())
    }

    /// The `README.md` table.
    pub fn readme(&self) -> String {
        let name = self.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let cell = |s: Option<&String>| s.map_or("—".to_owned(), |s| s.replace('|', "\\|"));
        let mut text = format!(
            "# {name}\n\n{}\n\nThe runs of this checkpoint batch (docs/release-layout.md); times are UTC. \
             `runs.json` holds the same records.\n\n\
             | path | run | config | model | from | start | end |\n|---|---|---|---|---|---|---|\n",
            self.note
        );
        for r in &self.records {
            let config = if r.source.is_empty() { format!("`{}`", r.config) } else { format!("`{}` (from `{}`)", r.config, r.source) };
            text += &format!(
                "| `{}` | {} | {} | {} | {} | {} | {} |\n",
                r.path,
                r.run,
                config,
                r.model,
                r.from.as_ref().map_or("—".to_owned(), |f| format!("`{f}`")),
                cell(r.start.as_ref()),
                r.end.as_ref().map_or("running or interrupted".to_owned(), |e| cell(Some(e)))
            );
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_run_keeps_its_start_and_the_readme_lists_every_run() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("020305");
        let mut index = RunIndex::load(&dir, "note").unwrap();
        let record = RunRecord { path: "pretrain/checkpoint-5".into(), run: "pretrain".into(), model: "tiny".into(), ..RunRecord::default() };
        index.started(record.clone()).unwrap();
        let start = index.get("pretrain").unwrap().start.clone().unwrap();
        assert!(start.ends_with('Z') && start.len() == 20, "{start}");
        index.started(record).unwrap();
        assert_eq!(index.get("pretrain").unwrap().start.as_ref(), Some(&start));
        assert!(index.get("pretrain").unwrap().end.is_none());
        index.ended("pretrain").unwrap();
        assert!(index.ended("rl op11_14").is_err());

        let again = RunIndex::load(&dir, "note").unwrap();
        assert_eq!(again.records, index.records);
        let readme = std::fs::read_to_string(dir.join(INDEX_README)).unwrap();
        assert!(readme.starts_with("# 020305\n"), "{readme}");
        assert!(readme.contains(&format!("| `pretrain/checkpoint-5` | pretrain | `` | tiny | — | {start} |")), "{readme}");
    }
}
