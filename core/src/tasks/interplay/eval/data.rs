//! The evaluation rows (`load_eval_rows` of `eval_checkpoints.py`, `docs/interplay.md` §8.1): every
//! `*.jsonl` of a directory of per-op files, read in lexicographic file order (`op10…, op11…, …,
//! op2…, op20…`), split into ID (op ≤ threshold) and OOD lists, each row tagged with `__idx`, its
//! position in its list. The strict scorer finds a row's gold graph through `__idx % rows per op`,
//! which is why the per-op layout with equally long files matters.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::super::task::{InterplayTask, answer, template};
use super::super::text::EOS;
use crate::error::{Error, Result};
use crate::io::jsonl_files;
use crate::tasks::{Item, Task};

/// The two halves of an evaluation: in-distribution and out-of-distribution ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Subset {
    Id,
    Ood,
}

impl AsRef<str> for Subset {
    fn as_ref(&self) -> &str {
        self.name()
    }
}

impl Subset {
    /// Both subsets, ID first (the reference's order).
    pub const BOTH: [Subset; 2] = [Subset::Id, Subset::Ood];

    /// The subset's position in [`Subset::BOTH`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// `id` or `ood`, as in file names and metric keys.
    pub fn name(self) -> &'static str {
        match self {
            Subset::Id => "id",
            Subset::Ood => "ood",
        }
    }
}

/// One task row prepared for evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalRow {
    /// `__idx`: position in the ID or OOD list.
    pub idx: usize,
    /// The row's op.
    pub op: i64,
    /// The row's template (`None` when absent or not a string).
    pub template: Option<String>,
    /// `compose_text(row)` without `[EOS]` (the teacher-forced loss text).
    pub text: String,
    /// `compose_text(row).split("<solution>")[0] + "<solution>"`.
    pub prompt: String,
    /// `solution.split("Answer: ")[-1].strip().rstrip(".")`.
    pub gold_answer: String,
    /// The file and 1-based line the row came from, for error messages.
    pub file: PathBuf,
    pub line: usize,
}

impl EvalRow {
    /// The row of `item` at position `idx` of its subset.
    fn new(idx: usize, item: &Item) -> EvalRow {
        let reference = item.reference.as_deref().unwrap_or_default();
        EvalRow {
            idx,
            op: item.level.unwrap_or_default(),
            template: template(item).map(str::to_owned),
            text: reference.strip_suffix(EOS).unwrap_or(reference).to_owned(),
            prompt: item.prompt.clone(),
            gold_answer: answer(item).to_owned(),
            file: item.source.file.clone(),
            line: item.source.line,
        }
    }
}

/// The rows of an evaluation directory.
#[derive(Debug, Clone)]
pub struct EvalData {
    /// The directory read.
    pub dir: PathBuf,
    /// Rows with op ≤ threshold, in file order.
    pub id: Vec<EvalRow>,
    /// Rows with op > threshold, in file order.
    pub ood: Vec<EvalRow>,
    /// The same rows as the [`InterplayTask`] reads them, ID then OOD.
    pub(super) items: [Vec<Item>; 2],
    /// Ops above this are OOD.
    pub(super) id_op_threshold: Option<i64>,
}

impl EvalData {
    /// Reads every `*.jsonl` directly in `dir` as the [`InterplayTask`] reads rows. Ops above
    /// `id_op_threshold` are OOD; `None` puts every row in ID (the reference's negative
    /// threshold). A row that is not a JSON object, lacks `solution` or `op`, or has no usable
    /// text is an error naming file and line.
    pub fn load(dir: &Path, id_op_threshold: Option<i64>) -> Result<EvalData> {
        if !dir.is_dir() {
            return Err(Error::data(dir, None, "evaluation data directory not found"));
        }
        let files = jsonl_files(dir)?;
        if files.is_empty() {
            return Err(Error::data(dir, None, "no *.jsonl files (expected one file per op, e.g. op2-1k.jsonl)"));
        }
        let mut data = EvalData { dir: dir.to_path_buf(), id: Vec::new(), ood: Vec::new(), items: Default::default(), id_op_threshold };
        for file in &files {
            for item in InterplayTask.items(file)? {
                let item = item?;
                let ood = id_op_threshold.is_some_and(|t| item.level.is_some_and(|op| op > t));
                let (rows, items) = if ood { (&mut data.ood, &mut data.items[1]) } else { (&mut data.id, &mut data.items[0]) };
                rows.push(EvalRow::new(rows.len(), &item));
                items.push(item);
            }
        }
        if data.id.is_empty() && data.ood.is_empty() {
            return Err(Error::data(dir, None, "no rows in the *.jsonl files"));
        }
        Ok(data)
    }

    /// The rows of `subset`.
    pub fn rows(&self, subset: Subset) -> &[EvalRow] {
        match subset {
            Subset::Id => &self.id,
            Subset::Ood => &self.ood,
        }
    }

    /// SHA-256 (hex) of everything evaluation reads from the rows, to tell whether shards on
    /// disk were made from the same data.
    pub fn fingerprint(&self) -> String {
        let mut hash = Sha256::new();
        for row in self.id.iter().chain(&self.ood) {
            for part in [&row.op.to_string(), row.template.as_deref().unwrap_or("\u{0}"), &row.text, &row.gold_answer] {
                hash.update(part.as_bytes());
                hash.update([0xff]);
            }
        }
        hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}
