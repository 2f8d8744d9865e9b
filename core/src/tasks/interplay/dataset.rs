//! Writing dataset splits in the reference layout (`test/op{N}-1k.jsonl`, `val/op{N}-200.jsonl`,
//! `heldout/op{N}-50k.jsonl`, `train/{N}/op{N}-….jsonl`), deduplicated like
//! `generate_zero_context_medium.py` (SHA-256 of problem, question and solution) within the
//! split and against every other split already in the output directory. kiln also rejects a
//! repeated prompt (problem + question), which the reference's triple hash lets through when
//! only the variable letters of the solution differ.
//!
//! Each op has its own pair of random streams, derived from the seed, the split and the op,
//! so an op's file does not depend on which other ops are generated.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use sha2::{Digest, Sha256};

use crate::io::{AtomicFile, jsonl_records};
use super::generator::{Mode, NpRandom, PyRandom, Rngs, Template, draw_problem};
use super::row::Row;
use crate::error::{Error, Result};

/// Attempts allowed per row before giving up (the golden driver allowed 50 000).
pub const MAX_TRIES_PER_ROW: u64 = 100_000;

/// A dataset split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// `test/op{N}-1k.jsonl`: final evaluation.
    Test,
    /// `val/op{N}-200.jsonl`: validation.
    Val,
    /// `heldout/op{N}-50k.jsonl`: RL prompts.
    Heldout,
    /// `train/{N}/op{N}-….jsonl`: pre-training shards.
    Train,
}

impl Split {
    /// All splits.
    pub const ALL: [Split; 4] = [Split::Test, Split::Val, Split::Heldout, Split::Train];

    /// The split's directory name.
    pub fn name(self) -> &'static str {
        match self {
            Split::Test => "test",
            Split::Val => "val",
            Split::Heldout => "heldout",
            Split::Train => "train",
        }
    }

    /// The split called `name`.
    pub fn from_name(name: &str) -> Option<Split> {
        Split::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Where the rows of `op` go under `dir`, for `per_op` rows.
    pub fn path(self, dir: &Path, op: u32, per_op: usize) -> PathBuf {
        let file = format!("op{op}-{}.jsonl", count_label(per_op));
        match self {
            Split::Train => dir.join(self.name()).join(op.to_string()).join(file),
            _ => dir.join(self.name()).join(file),
        }
    }
}

/// `1000` → `1k`, `50000` → `50k`, `200` → `200`.
pub fn count_label(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// `compute_sample_hash`: SHA-256 of problem, question and solution joined by `\n--FIELD--\n`.
pub fn sample_hash(problem: &str, question: &str, solution: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    for (i, part) in [problem, question, solution].into_iter().enumerate() {
        if i > 0 {
            h.update(b"\n--FIELD--\n");
        }
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

fn prompt_hash(problem: &str, question: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(problem.as_bytes());
    h.update(b"\n--FIELD--\n");
    h.update(question.as_bytes());
    h.finalize().into()
}

/// Rows already taken: their triple hashes and prompt hashes.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    triples: HashSet<[u8; 32]>,
    prompts: HashSet<[u8; 32]>,
}

impl Seen {
    /// Records a row; `false` if its triple or its prompt was already seen (then nothing changes).
    pub fn insert(&mut self, problem: &str, question: &str, solution: &str) -> bool {
        let (triple, prompt) = (
            sample_hash(problem, question, solution),
            prompt_hash(problem, question),
        );
        if self.triples.contains(&triple) || self.prompts.contains(&prompt) {
            return false;
        }
        self.triples.insert(triple);
        self.prompts.insert(prompt);
        true
    }

    fn contains(&self, problem: &str, question: &str, solution: &str) -> bool {
        self.triples
            .contains(&sample_hash(problem, question, solution))
            || self.prompts.contains(&prompt_hash(problem, question))
    }

    /// Number of rows recorded.
    pub fn len(&self) -> usize {
        self.triples.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.triples.is_empty()
    }

    /// The rows of every `*.jsonl` file under `dir` outside `dir/<skip>` (the split being
    /// written), so that a new split never repeats another.
    pub fn load(dir: &Path, skip: Split) -> Result<Seen> {
        let mut seen = Seen::default();
        if !dir.is_dir() {
            return Ok(seen);
        }
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).map_err(|e| Error::io(&d, e))? {
                let path = entry.map_err(|e| Error::io(&d, e))?.path();
                if path == dir.join(skip.name()) {
                    continue;
                }
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "jsonl") {
                    for record in jsonl_records(&path)? {
                        let record = record?;
                        let field = |k| record.str_field(&path, k);
                        seen.insert(field("problem")?, field("question")?, field("solution")?);
                    }
                }
            }
        }
        Ok(seen)
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The random streams of one op of one split: Python's `random` and NumPy's, seeded from
/// `(seed, split, op)`.
pub fn op_streams(seed: u64, split: Split, op: u32) -> Rngs {
    let split_index = Split::ALL.iter().position(|s| *s == split).expect("listed") as u64;
    let key = splitmix64(splitmix64(seed) ^ (split_index << 32) ^ u64::from(op));
    Rngs {
        py: PyRandom::new(key),
        np: NpRandom::new((splitmix64(key) >> 32) as u32),
    }
}

/// The mode and template of row `index`: both cycled, as the reference driver cycles them.
pub fn cell(index: usize) -> (Mode, Template) {
    (Mode::ALL[index % 2], Template::ALL[(index / 2) % 3])
}

/// Generates `count` rows of `op` for `split`, none repeating a row of `taken` or each other.
/// `on_row` is called after each row. Returns the rows and the number of attempts.
pub fn generate_rows(
    split: Split,
    seed: u64,
    op: u32,
    count: usize,
    taken: &Seen,
    mut on_row: impl FnMut(),
) -> Result<(Vec<Row>, u64)> {
    let mut rngs = op_streams(seed, split, op);
    let mut own = Seen::default();
    let mut rows = Vec::with_capacity(count);
    let mut attempts = 0u64;
    for index in 0..count {
        let (mode, template) = cell(index);
        let mut tries = 0u64;
        let problem = loop {
            tries += 1;
            if tries > MAX_TRIES_PER_ROW {
                return Err(Error::InvalidInput(format!(
                    "op {op}: no new {} / {} problem after {MAX_TRIES_PER_ROW} attempts ({} rows made)",
                    mode.name(),
                    template.name(),
                    rows.len()
                )));
            }
            let Ok(p) = draw_problem(&mut rngs, mode, template, op) else {
                continue;
            };
            if !taken.contains(&p.problem, &p.question, &p.solution)
                && own.insert(&p.problem, &p.question, &p.solution)
            {
                break p;
            }
        };
        attempts += tries;
        rows.push(Row {
            problem: problem.problem,
            question: problem.question,
            solution: problem.solution,
            op,
            id: Some(format!("{}-op{op}-{index}", split.name())),
            template: template.name().to_owned(),
            mode: mode.name().to_owned(),
        });
        on_row();
    }
    Ok((rows, attempts))
}

/// What [`write_split`] wrote.
#[derive(Debug, Clone)]
pub struct SplitReport {
    /// One file per op.
    pub files: Vec<PathBuf>,
    /// Rows written.
    pub rows: usize,
    /// Generator attempts made.
    pub attempts: u64,
}

/// Generates `per_op` rows for every op of `ops` and writes the split under `dir`. The files
/// appear only once every op is done. Ops are generated side by side on the machine's cores
/// (each op has its own random streams, so its file is the same however many run at once);
/// `on_row` is called on this thread after each row. A file already there with other rows (from
/// another seed, or another split's rows taken since) is an error and nothing is written, unless
/// `replace`.
pub fn write_split(
    dir: &Path,
    split: Split,
    ops: &[u32],
    per_op: usize,
    seed: u64,
    replace: bool,
    mut on_row: impl FnMut(),
) -> Result<SplitReport> {
    let taken = Seen::load(dir, split)?;
    // Largest op first: the costliest files start first, the cheap ones fill in behind them.
    let mut queue: Vec<usize> = (0..ops.len()).collect();
    queue.sort_by_key(|&i| std::cmp::Reverse(ops[i]));
    let next = AtomicUsize::new(0);
    let (tick, ticks) = mpsc::channel::<()>();
    let mut written: Vec<(usize, Result<(AtomicFile, u64)>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..crate::par::threads().min(ops.len()))
            .map(|_| {
                let (tick, queue, next, taken) = (tick.clone(), &queue, &next, &taken);
                s.spawn(move || {
                    let mut done = Vec::new();
                    while let Some(&i) = queue.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let file = write_op(dir, split, ops[i], per_op, seed, taken, || {
                            let _ = tick.send(());
                        });
                        let failed = file.is_err();
                        done.push((i, file));
                        if failed {
                            next.store(queue.len(), Ordering::Relaxed);
                        }
                    }
                    done
                })
            })
            .collect();
        drop(tick);
        ticks.iter().for_each(|()| on_row());
        workers.into_iter().flat_map(|w| w.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    written.sort_by_key(|(i, _)| *i);
    let mut pending = Vec::with_capacity(ops.len());
    let mut report = SplitReport {
        files: Vec::new(),
        rows: 0,
        attempts: 0,
    };
    let mut differing = Vec::new();
    for (i, file) in written {
        let (mut file, attempts) = file?;
        let path = split.path(dir, ops[i], per_op);
        if !replace && file.replaces_other_contents()? {
            differing.push(path.clone());
        }
        pending.push(file);
        report.files.push(path);
        report.rows += per_op;
        report.attempts += attempts;
    }
    if let Some(first) = differing.first() {
        return Err(Error::InvalidInput(format!(
            "{} already exists with other rows ({} of the split's {} files differ: another seed, or other splits' rows since); \
             not replacing a split that results may have been computed on: move the files away, or `kiln data interplay --overwrite` replaces them",
            first.display(),
            differing.len(),
            pending.len()
        )));
    }
    for file in pending {
        file.commit()?;
    }
    Ok(report)
}

/// One op's rows, written to its (uncommitted) file; with the generator's attempts.
fn write_op(dir: &Path, split: Split, op: u32, per_op: usize, seed: u64, taken: &Seen, on_row: impl FnMut()) -> Result<(AtomicFile, u64)> {
    let (rows, attempts) = generate_rows(split, seed, op, per_op, taken, on_row)?;
    let mut file = AtomicFile::create(&split.path(dir, op, per_op))?;
    for row in &rows {
        file.write_line(&row.to_json_line())?;
    }
    Ok((file, attempts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_labels() {
        assert_eq!(count_label(1000), "1k");
        assert_eq!(count_label(50_000), "50k");
        assert_eq!(count_label(200), "200");
        assert_eq!(
            Split::Test.path(Path::new("d"), 7, 1000),
            Path::new("d/test/op7-1k.jsonl")
        );
        assert_eq!(
            Split::Train.path(Path::new("d"), 7, 200),
            Path::new("d/train/7/op7-200.jsonl")
        );
        let digest: [u8; 32] = Sha256::digest(b"a\n--FIELD--\nb\n--FIELD--\nc").into();
        assert_eq!(sample_hash("a", "b", "c"), digest);
    }

    #[test]
    fn splits_are_deterministic_and_disjoint() {
        let dir = tempfile::tempdir().unwrap();
        let test = write_split(dir.path(), Split::Test, &[2, 3], 6, 5, false, || {}).unwrap();
        assert_eq!(test.rows, 12);
        let first = std::fs::read_to_string(&test.files[0]).unwrap();
        let again = write_split(dir.path(), Split::Test, &[2, 3], 6, 5, false, || {}).unwrap();
        assert_eq!(std::fs::read_to_string(&again.files[0]).unwrap(), first);

        // Same seed for another split: different streams, and nothing of `test` repeats.
        let val = write_split(dir.path(), Split::Val, &[2], 30, 5, false, || {}).unwrap();
        let seen = Seen::load(dir.path(), Split::Val).unwrap();
        assert_eq!(seen.len(), 12);
        for record in jsonl_records(&val.files[0]).unwrap() {
            let r = record.unwrap();
            let f = |k| r.fields[k].as_str().unwrap();
            assert!(!seen.contains(f("problem"), f("question"), f("solution")));
        }
    }
}
