//! Tasks: what a model is asked, and how its responses are judged.
//!
//! A [`Task`] turns the rows of its files into [`Item`]s — a prompt, what scoring needs (`gold`),
//! a stable id and a reporting group — and turns a response into a verdict
//! ([`Task::evaluate`], batched in [`Task::evaluate_batch`]) or, for RL, into the reward that
//! the run's `[reward]` section asks for ([`Task::reward`]). RL rollouts and validation
//! ([`crate::rl`]), in-training evaluation ([`crate::train`]), the pre-training corpus
//! ([`crate::data`]) and checkpoint evaluation ([`crate::eval`]) see tasks only through this
//! interface; [`TaskConfig`] (a run config's `[task]` section) names the concrete one. For
//! checkpoint evaluation a task also provides an [`Evaluation`]: its items split into parts,
//! the line recorded per sample and the files written from them.
//!
//! - [`interplay`]: the Interplay reasoning task (generator, text format, answers, graph
//!   parser and scorer, rewards, the reference's evaluation files).
//! - `code` (feature `code`): LiveCodeBench-style code generation, graded by running the
//!   programs in kiln's sandbox; its evaluation files and the code reward for RL.
//!
//! A new task implements [`Task`] (and, for RL, a [`Reward`]) and adds a [`TaskConfig`]
//! variant; nothing in `rl/`, `train/` or `eval/` changes. A minimal one:
//!
//! ```
//! use std::path::Path;
//! use std::sync::Arc;
//!
//! use kiln_core::io::jsonl_records;
//! use kiln_core::tasks::{Item, Items, Reward, RewardConfig, Source, Task};
//!
//! /// The model should answer with the row's `word`.
//! struct Echo;
//!
//! impl Task for Echo {
//!     fn name(&self) -> &str {
//!         "echo"
//!     }
//!
//!     fn items(&self, path: &Path) -> kiln_core::Result<Items> {
//!         let file = path.to_path_buf();
//!         Ok(Box::new(jsonl_records(path)?.map(move |record| {
//!             let record = record?;
//!             let word = record.str_field(&file, "word")?.to_owned();
//!             Ok(Item {
//!                 id: format!("echo-{}", record.line),
//!                 group: "all".into(),
//!                 level: None,
//!                 prompt: format!("Say {word}:"),
//!                 reference: Some(format!("Say {word}: {word}")),
//!                 gold: word.into(),
//!                 source: Source { file: file.clone(), line: record.line },
//!             })
//!         })))
//!     }
//!
//!     fn evaluate(&self, response: &str, item: &Item) -> f64 {
//!         f64::from(u8::from(Some(response.trim()) == item.gold.as_str()))
//!     }
//!
//!     fn reward(&self, config: &RewardConfig) -> kiln_core::Result<Box<dyn Reward>> {
//!         match config {
//!             RewardConfig::Outcome => Ok(Box::new(EchoReward)),
//!             other => Err(kiln_core::Error::InvalidInput(format!("echo has no {other:?} reward"))),
//!         }
//!     }
//! }
//!
//! /// The reward is the verdict.
//! struct EchoReward;
//!
//! impl Reward for EchoReward {
//!     fn score(&self, response: &str, item: &Item) -> f64 {
//!         Echo.evaluate(response, item)
//!     }
//! }
//!
//! # fn main() -> kiln_core::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let rows = dir.path().join("rows.jsonl");
//! std::fs::write(&rows, "{\"word\": \"kiln\"}\n{\"word\": \"burn\"}\n").unwrap();
//! let task: Arc<dyn Task> = Arc::new(Echo);
//! let items = kiln_core::tasks::load_items(task.as_ref(), &[rows], None)?;
//! assert_eq!(items[1].prompt, "Say burn:");
//! let verdicts = task.evaluate_batch(&[(" kiln", &items[0]), ("kiln", &items[1])])?;
//! assert_eq!(verdicts, [1.0, 0.0]);
//! let reward = task.reward(&RewardConfig::Outcome)?;
//! assert_eq!(reward.score("burn", &items[1]), 1.0);
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "code")]
pub mod code;
pub mod evaluation;
pub mod interplay;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

pub use evaluation::{Completion, Evaluation, FinishedRun, Part};

/// One thing a model is asked: its prompt and what judging a response needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// Stable identifier (the row's own id where it has one, else `<file name>:<line>`).
    pub id: String,
    /// Reporting group: metrics are given per group (Interplay: `op7`).
    pub group: String,
    /// Difficulty level where the task has an ordered one (Interplay: the op). In-distribution
    /// (ID) and out-of-distribution (OOD) splits are thresholds on it.
    pub level: Option<i64>,
    /// The prompt text the model continues (any chat template already applied).
    pub prompt: String,
    /// The full reference text — prompt, gold completion and the task's end marker — for
    /// teacher-forced losses and pre-training, where the task has one.
    pub reference: Option<String>,
    /// What judging a response needs, in the task's own shape (Interplay: the gold solution
    /// and answers).
    pub gold: Value,
    /// Where the item was read.
    pub source: Source,
}

/// The file and 1-based line an item was read from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Source {
    pub file: PathBuf,
    pub line: usize,
}

impl Source {
    /// A data error at this place.
    pub fn error(&self, message: impl Into<String>) -> Error {
        Error::data(&self.file, Some(self.line), message)
    }
}

impl fmt::Display for Source {
    /// `path line N`, as data errors name places.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} line {}", self.file.display(), self.line)
    }
}

/// The items of a file, read lazily, in file order.
pub type Items = Box<dyn Iterator<Item = Result<Item>>>;

/// A task: rows → prompts; a response → verdict or reward.
///
/// Object-safe: the layers above hold an `Arc<dyn Task>` (from [`TaskConfig::build`]).
pub trait Task: Send + Sync {
    /// Short name, as `[task] kind` spells it.
    fn name(&self) -> &str;

    /// The items of one file, in file order. A row the task cannot use is an error naming the
    /// file and line.
    fn items(&self, path: &Path) -> Result<Items>;

    /// The verdict on one response to `item`: 1.0 when correct, 0.0 when not (partial credit in
    /// between). `response` is the generated text after the prompt.
    fn evaluate(&self, response: &str, item: &Item) -> f64;

    /// Verdicts on many responses, in order. A task whose judging is expensive (running
    /// programs in a sandbox) overrides this to work in parallel; the default maps
    /// [`Task::evaluate`].
    fn evaluate_batch(&self, batch: &[(&str, &Item)]) -> Result<Vec<f64>> {
        Ok(batch.iter().map(|(response, item)| self.evaluate(response, item)).collect())
    }

    /// The RL reward that `config` (a run's `[reward]`) asks for; an error naming the kind when
    /// the task has no such reward.
    fn reward(&self, config: &RewardConfig) -> Result<Box<dyn Reward>>;

    /// Strings that end a response when decoding for evaluation (excluded from the text).
    fn stop_strings(&self) -> Vec<String> {
        Vec::new()
    }

    /// What the task's verdicts depend on besides the responses (the code task: the sandbox's
    /// layers), recorded next to a run's outputs; `None` for tasks that only compare text.
    fn environment(&self) -> Option<TaskEnvironment> {
        None
    }

    /// The row files a run reads (`[data]` or `[eval]`): those of `dir` for `groups` where the
    /// task numbers its files (Interplay: `op{N}-….jsonl` per op), every `*.jsonl` of `dir` when
    /// `groups` is empty, or `files` without a `dir`. A task without numbered files refuses
    /// `groups`.
    fn files(&self, dir: Option<&Path>, groups: &[u32], files: &[PathBuf]) -> Result<Vec<PathBuf>> {
        match (dir, groups) {
            (Some(dir), []) => crate::io::jsonl_files(dir),
            (Some(dir), _) => Err(Error::data(dir, None, format!("the {} task does not number its files; leave `ops` out or list `files`", self.name()))),
            (None, _) => Ok(files.to_vec()),
        }
    }

    /// Items of at most this [`Item::level`] are in-distribution, the others out of it (the
    /// ID/OOD split of validation) when a run does not set it (`[eval] id_max_op`); `None`: no
    /// split.
    fn id_max_level(&self) -> Option<i64> {
        None
    }
}

/// [`Task::environment`]: one line for the console and the JSON record.
#[derive(Debug, Clone)]
pub struct TaskEnvironment {
    pub summary: String,
    pub record: serde_json::Value,
}

/// A reward function for RL: scores one response (decoded with special tokens, as the seed's
/// reward manager does) against its item.
pub trait Reward: Send + Sync {
    /// The reward, usually in `[0, 1]`.
    fn score(&self, response: &str, item: &Item) -> f64;

    /// The rewards of many responses, in order; the default maps [`Reward::score`]. A reward
    /// that runs programs overrides this to grade in parallel.
    fn score_batch(&self, batch: &[(&str, &Item)]) -> Result<Vec<f64>> {
        Ok(batch.iter().map(|(response, item)| self.score(response, item)).collect())
    }
}

/// The reward of a run config (`[reward]`); each task accepts the kinds it knows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum RewardConfig {
    /// The task's outcome reward (Interplay: exact string match of the extracted answer,
    /// `verl/dataset.py::compute_score`).
    #[default]
    Outcome,
    /// Interplay's process-verified reward (`verl/reward_fn.py::compute_score_with_step_process`):
    /// `answer_weight`/`step_weight` 0.2/0.8, 0.5/0.5, or 1/0 with `zero_on_process_mismatch`.
    Process {
        answer_weight: f64,
        step_weight: f64,
        #[serde(default)]
        zero_on_process_mismatch: bool,
        #[serde(default = "default_tolerance")]
        value_tolerance: f64,
    },
    /// The code task's reward ([`code::task`]): 1 when every test passes, or with `partial` the
    /// fraction of tests passed; lines compared exactly; `per_test_timeout_s` (2 s) per test;
    /// the program found by `extraction`; only the first `max_tests` tests if given.
    #[cfg(feature = "code")]
    Code {
        #[serde(default)]
        partial: bool,
        #[serde(default = "default_reward_timeout")]
        per_test_timeout_s: f64,
        #[serde(default)]
        extraction: code::Extraction,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_tests: Option<usize>,
    },
}

#[cfg(feature = "code")]
fn default_reward_timeout() -> f64 {
    2.0
}

fn default_tolerance() -> f64 {
    1e-6
}

impl RewardConfig {
    /// The `kind` as configs spell it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Outcome => "outcome",
            Self::Process { .. } => "process",
            #[cfg(feature = "code")]
            Self::Code { .. } => "code",
        }
    }
}

/// Which task a run uses (`[task]`; Interplay when absent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum TaskConfig {
    /// The Interplay reasoning task ([`interplay::InterplayTask`]).
    #[default]
    Interplay,
    /// LiveCodeBench-style code generation graded in the sandbox ([`code::CodeTask`]).
    #[cfg(feature = "code")]
    Code(code::CodeTaskConfig),
}

impl TaskConfig {
    /// The task. (The code task probes its sandbox here.)
    pub fn build(&self) -> Result<Arc<dyn Task>> {
        match self {
            Self::Interplay => Ok(Arc::new(interplay::InterplayTask)),
            #[cfg(feature = "code")]
            Self::Code(config) => Ok(Arc::new(code::CodeTask::new(config.clone())?)),
        }
    }

    /// Makes the task's paths relative to `base` (the config file's directory).
    pub fn resolve_paths(&mut self, _base: &Path) {
        match self {
            Self::Interplay => {}
            #[cfg(feature = "code")]
            Self::Code(config) => config.resolve_paths(_base),
        }
    }
}

/// The items of `files` in order, the first `limit` of each file if given.
pub fn load_items(task: &dyn Task, files: &[PathBuf], limit: Option<usize>) -> Result<Vec<Item>> {
    let mut items = Vec::new();
    for file in files {
        for item in task.items(file)?.take(limit.unwrap_or(usize::MAX)) {
            items.push(item?);
        }
    }
    Ok(items)
}

/// A running mean.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Mean {
    pub sum: f64,
    pub count: usize,
}

impl Mean {
    /// Adds one value.
    pub fn add(&mut self, value: f64) {
        self.sum += value;
        self.count += 1;
    }

    /// The mean, `None` without values.
    pub fn value(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }
}

/// Per-item scores summed overall, per reporting group and, with a level threshold, in
/// distribution (level ≤ threshold) and out of it. Items without a level are in neither split.
#[derive(Debug, Clone, Default)]
pub struct GroupScores {
    /// Levels up to this are in-distribution.
    pub id_max_level: Option<i64>,
    pub all: Mean,
    /// By group, in the order of their levels (then names).
    pub groups: Vec<(String, Option<i64>, Mean)>,
    pub id: Mean,
    pub ood: Mean,
}

impl GroupScores {
    /// Empty scores splitting ID and OOD at `id_max_level`.
    pub fn new(id_max_level: Option<i64>) -> Self {
        Self { id_max_level, ..Self::default() }
    }

    /// Adds the score of one response to `item`.
    pub fn add(&mut self, item: &Item, score: f64) {
        self.all.add(score);
        match self.groups.iter_mut().find(|(group, _, _)| *group == item.group) {
            Some((_, _, mean)) => mean.add(score),
            None => {
                let mut mean = Mean::default();
                mean.add(score);
                self.groups.push((item.group.clone(), item.level, mean));
                self.groups.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
            }
        }
        if let (Some(level), Some(max)) = (item.level, self.id_max_level) {
            if level <= max { self.id.add(score) } else { self.ood.add(score) }
        }
    }

    /// `(name_<group>, mean)` per group, in order.
    pub fn per_group(&self, name: &str) -> Vec<(String, f64)> {
        self.groups.iter().filter_map(|(group, _, mean)| Some((format!("{name}_{group}"), mean.value()?))).collect()
    }
}
