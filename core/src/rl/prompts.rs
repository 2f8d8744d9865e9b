//! RL prompts (verl's `CustomRLHFDataset` in the seed, `docs/interplay.md` §6.3): the items a task
//! reads from JSONL files (for Interplay, the prompt `compose_text(row)` up to and including
//! `<solution>` and the RL ground truth), tokenized; prompts longer than `max_prompt_length` tokens
//! are dropped and counted (`filter_overlong_prompts`). Steps draw consecutive batches from a
//! seeded shuffle of all prompts, reshuffled every epoch, with the incomplete last batch dropped
//! (`RandomSampler`, `drop_last=True`). One file per op of equal length makes the draw uniform over
//! ops, as in the release's `op11-14_uniform` runs.

use std::path::PathBuf;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::tasks::{Item, Task, TaskConfig};
use crate::tokenizer::Tokenizer;

/// One prompt: its token ids and the item they came from (what the reward needs).
#[derive(Debug, Clone)]
pub struct Prompt {
    pub ids: Vec<u32>,
    pub item: Item,
}

/// What was read.
#[derive(Debug, Clone, Serialize)]
pub struct PromptReport {
    pub files: Vec<FileReport>,
    /// Prompts kept.
    pub prompts: usize,
    /// Prompts dropped for being longer than `max_prompt_length`.
    pub filtered_overlong: usize,
}

/// One file's share.
#[derive(Debug, Clone, Serialize)]
pub struct FileReport {
    pub path: PathBuf,
    pub rows: usize,
    pub kept: usize,
}

/// The prompts of a run.
#[derive(Debug, Clone)]
pub struct PromptSet {
    prompts: Vec<Prompt>,
    pub report: PromptReport,
}

/// Interplay's per-op files, now [`crate::tasks::Task::files`] of the Interplay task; kept here
/// for existing code.
pub use crate::tasks::interplay::task::op_files;

impl PromptSet {
    /// Reads the rows of `files` as the default task reads them ([`TaskConfig::default`]:
    /// Interplay); see [`PromptSet::from_task`].
    pub fn load(files: &[PathBuf], tokenizer: &Tokenizer, max_prompt_length: usize, rows_per_file: Option<usize>) -> Result<Self> {
        Self::from_task(TaskConfig::default().build()?.as_ref(), files, tokenizer, max_prompt_length, rows_per_file)
    }

    /// Reads the items `task` makes of `files` (the first `rows_per_file` of each if given),
    /// keeping prompts of at most `max_prompt_length` tokens. A row the task cannot use is an
    /// error naming file and line.
    pub fn from_task(task: &dyn Task, files: &[PathBuf], tokenizer: &Tokenizer, max_prompt_length: usize, rows_per_file: Option<usize>) -> Result<Self> {
        let mut prompts = Vec::new();
        let mut report = PromptReport { files: Vec::new(), prompts: 0, filtered_overlong: 0 };
        for file in files {
            let mut entry = FileReport { path: file.clone(), rows: 0, kept: 0 };
            for item in task.items(file)?.take(rows_per_file.unwrap_or(usize::MAX)) {
                let item = item?;
                let ids = tokenizer.encode(&item.prompt)?;
                entry.rows += 1;
                if ids.len() > max_prompt_length {
                    report.filtered_overlong += 1;
                    continue;
                }
                entry.kept += 1;
                prompts.push(Prompt { ids, item });
            }
            report.files.push(entry);
        }
        report.prompts = prompts.len();
        if prompts.is_empty() {
            let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            let why = match report.filtered_overlong {
                0 => "they hold no rows".to_owned(),
                n => format!("all {n} are longer than max_prompt_length ({max_prompt_length} tokens)"),
            };
            return Err(Error::InvalidInput(format!("no usable prompts in {}: {why}", names.join(", "))));
        }
        Ok(Self { prompts, report })
    }

    /// Number of prompts.
    pub fn len(&self) -> usize {
        self.prompts.len()
    }

    /// Whether there are no prompts (never true for a loaded set).
    pub fn is_empty(&self) -> bool {
        self.prompts.is_empty()
    }

    /// The prompts in file order.
    pub fn iter(&self) -> impl Iterator<Item = &Prompt> {
        self.prompts.iter()
    }

    /// Full batches of `batch` prompts per epoch.
    pub fn steps_per_epoch(&self, batch: usize) -> u64 {
        (self.prompts.len() / batch.max(1)) as u64
    }

    /// The prompts of step `step` (0-based) for batches of `batch`: a slice of the epoch's
    /// shuffle (seeded by `seed` and the epoch).
    pub fn batch(&self, step: u64, batch: usize, seed: u64) -> Result<Vec<&Prompt>> {
        let per_epoch = self.steps_per_epoch(batch);
        if per_epoch == 0 {
            return Err(Error::InvalidInput(format!("{} prompts do not fill one batch of {batch}", self.prompts.len())));
        }
        let mut order: Vec<usize> = (0..self.prompts.len()).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(step / per_epoch);
        order.shuffle(&mut rng);
        let start = (step % per_epoch) as usize * batch;
        Ok(order[start..start + batch].iter().map(|&i| &self.prompts[i]).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/interplay")
    }

    #[test]
    fn overlong_prompts_are_counted_and_batches_cover_each_epoch_once() {
        let tokenizer = Tokenizer::from_file(fixtures().join("qwen2_100M")).unwrap();
        let files = op_files(&fixtures().join("rows"), &[2, 11]).unwrap();
        assert!(files[1].ends_with("op11.jsonl"));
        let all = PromptSet::load(&files, &tokenizer, usize::MAX, Some(10)).unwrap();
        let longest = all.iter().map(|p| p.ids.len()).max().unwrap();
        let set = PromptSet::load(&files, &tokenizer, longest - 1, Some(10)).unwrap();
        assert_eq!(all.len(), 20);
        assert_eq!(set.report.filtered_overlong, all.iter().filter(|p| p.ids.len() == longest).count());
        assert_eq!(set.len() + set.report.filtered_overlong, 20);
        assert_eq!(set.iter().next().unwrap().item.level, Some(2));

        // 20 prompts, batches of 6: three per epoch, the last two prompts of each shuffle dropped.
        let batch = |step| all.batch(step, 6, 1).unwrap().iter().map(|p| p.ids.clone()).collect::<Vec<_>>();
        assert_eq!(all.steps_per_epoch(6), 3);
        let epoch: Vec<Vec<u32>> = (0..3).flat_map(batch).collect();
        let mut distinct = epoch.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 18, "an epoch never repeats a prompt");
        assert_ne!(batch(3), batch(0), "the next epoch is reshuffled");
        assert_eq!(batch(4), batch(4), "batches are a function of the step");
        assert!(op_files(&fixtures().join("rows"), &[21]).unwrap_err().to_string().contains("no file for op 21"));
    }
}
