//! `release.toml`: the runs of a release and how to make its data, evaluate it and shrink it.
//!
//! ```toml
//! [release]   # out: the release root (full scale; a smaller scale adds "-<scale>")
//! [data]      # seed; splits = [{ split, ops = "2-20", per_op }], made by `kiln data interplay`
//! [eval]      # samples, temperature, top_p, top_k, min_p, max_new_tokens, seed, id_op_threshold,
//!             # batch_size, shard_prompts, models = "final" | "all"
//! [[batch]]   # name; pretrain, rl = [...], opd: run configs; teacher: the OPD teacher's RL run
//! [scale.cpu], [scale.mini], [scale.tiny]   # what a smaller scale changes ([`ScaleProfile`]):
//!             # model, ops, batches, runs, splits, pretrain, rl, opd, eval
//! ```
//!
//! Run configs are ordinary `kiln pretrain` / `kiln rl` / `kiln opd` configs; paths are relative
//! to the file that names them. Errors name the file and the line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::tasks::interplay::dataset::Split;
use crate::tasks::interplay::generator::op_max_for;
use crate::train::config::{base_dir, resolve};

/// A release: batches of runs, the data they need, the evaluation and the scales.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseConfig {
    pub release: ReleaseSection,
    pub data: DataSection,
    #[serde(default)]
    pub eval: EvalSection,
    /// The checkpoint batches (`020305`, `050302`), in order.
    #[serde(rename = "batch")]
    pub batches: Vec<BatchSection>,
    /// Smaller versions by name (`mini`, `tiny`); `full` is the configs as written.
    #[serde(default)]
    pub scale: BTreeMap<String, ScaleProfile>,
}

/// `[release]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseSection {
    /// The release root at full scale; a smaller scale writes to `<out>-<scale>` unless told.
    pub out: PathBuf,
}

/// `[data]`: the splits `kiln data interplay` writes into `<root>/data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    pub seed: u64,
    pub splits: Vec<SplitSpec>,
}

/// One `kiln data interplay --split S --ops OPS --per-op N` call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitSpec {
    /// `test`, `val`, `heldout` or `train`.
    pub split: String,
    /// A range `2-20` or a list `2,5,7`.
    pub ops: String,
    pub per_op: usize,
}

impl SplitSpec {
    /// The split.
    pub fn split(&self) -> std::result::Result<Split, String> {
        Split::from_name(&self.split).ok_or_else(|| format!("unknown split {:?} (expected test, val, heldout or train)", self.split))
    }

    /// The ops, in order.
    pub fn op_list(&self) -> std::result::Result<Vec<u32>, String> {
        parse_ops(&self.ops)
    }

    /// The files this split writes under `data`, one per op.
    pub fn paths(&self, data: &Path) -> std::result::Result<Vec<PathBuf>, String> {
        let split = self.split()?;
        Ok(self.op_list()?.into_iter().map(|op| split.path(data, op, self.per_op)).collect())
    }

    /// The command that writes this split into `data`.
    pub fn command(&self, data: &Path, seed: u64) -> String {
        format!("kiln data interplay --split {} --ops {} --per-op {} --seed {seed} --out {}", self.split, self.ops, self.per_op, data.display())
    }
}

/// Parses `2-20`, `2,5,7` or `7` (ops 2..=20, each once).
pub fn parse_ops(text: &str) -> std::result::Result<Vec<u32>, String> {
    let bad = || format!("not an op list: {text:?} (expected e.g. 2-20 or 2,5,7)");
    let mut ops = Vec::new();
    for part in text.split(',') {
        let number = |s: &str| s.trim().parse::<u32>().map_err(|_| bad());
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (number(lo)?, number(hi)?),
            None => (number(part)?, number(part)?),
        };
        if lo > hi {
            return Err(format!("empty op range {part:?} in {text:?}"));
        }
        for op in lo..=hi {
            if op_max_for(op).is_none() {
                return Err(format!("op {op} is outside 2..=20 in {text:?}"));
            }
            if !ops.contains(&op) {
                ops.push(op);
            }
        }
    }
    Ok(ops)
}

/// Which checkpoints the evaluation stage evaluates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvalModels {
    /// The last checkpoint of every run (the release's summary table).
    #[default]
    Final,
    /// Every checkpoint of the layout (`kiln eval interplay --release`).
    All,
}

/// `[eval]`: `kiln eval interplay`'s settings; the defaults are the reference's
/// (docs/interplay.md §8.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSection {
    pub samples: usize,
    pub temperature: f32,
    pub top_p: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 0 disables.
    pub min_p: f32,
    pub max_new_tokens: usize,
    pub seed: u64,
    pub id_op_threshold: i64,
    /// Sequences decoded together.
    pub batch_size: usize,
    /// Prompts per shard (the unit kept on disk for resuming).
    pub shard_prompts: usize,
    pub models: EvalModels,
    /// Keep the generations files.
    pub keep_generations: bool,
}

impl Default for EvalSection {
    fn default() -> Self {
        Self {
            samples: 128,
            temperature: 0.7,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            max_new_tokens: 1024,
            seed: 0,
            id_op_threshold: 10,
            batch_size: 256,
            shard_prompts: 32,
            models: EvalModels::Final,
            keep_generations: false,
        }
    }
}

/// `[[batch]]`: one checkpoint batch and its runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSection {
    /// The batch's directory under the root (`020305`).
    pub name: String,
    /// `kiln pretrain` config.
    pub pretrain: PathBuf,
    /// `kiln rl` configs (their `[output] name` is the run: `op11_14`).
    #[serde(default)]
    pub rl: Vec<PathBuf>,
    /// `kiln opd` config, whose `[teacher]` is the last checkpoint of the RL run `teacher`.
    pub opd: Option<PathBuf>,
    /// The OPD teacher's RL run; it also names the final OPD checkpoint
    /// (`opd_refkl/<teacher>_step<last>`).
    pub teacher: Option<String>,
}

/// The model a smaller scale trains: the tiny Qwen2 of the minute-scale pipelines
/// (`tasks/interplay/tiny_model.rs`, 1.3M parameters) with the paper's tokenizer and 2048
/// positions, optionally narrower or shallower. It is written to `<root>/model/<name>/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleModel {
    /// Its directory name (`tiny`).
    pub name: String,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
}

impl ScaleModel {
    /// Its `config.json`.
    pub fn config_json(&self) -> serde_json::Value {
        let mut config: serde_json::Value = serde_json::from_str(crate::tasks::interplay::tiny_model::TINY_CONFIG).expect("TINY_CONFIG is JSON");
        config["max_position_embeddings"] = 2048.into();
        let overrides = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ];
        for (key, value) in overrides {
            if let Some(value) = value {
                config[key] = value.into();
            }
        }
        config
    }
}

/// `[scale.<name>]`: what a smaller scale changes; everything left out stays as configured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleProfile {
    /// The model it trains instead of the configs' (`[scale.<name>.model]`).
    pub model: Option<ScaleModel>,
    /// The scale's op for each release op (`{ "2-4" = 2, "5-7" = 3, … }`, [`super::ops::OpMap`]):
    /// the configs' op lists, mixtures and thresholds are mapped; without it they are kept.
    pub ops: Option<BTreeMap<String, u32>>,
    /// Only these `[[batch]]`es, by name (default: every batch).
    pub batches: Option<Vec<String>>,
    /// Only these runs of each batch besides its pre-training, by name: an RL run's `[output]
    /// name` (`op11_14`), `opd_refkl` for OPD (which needs its teacher's run too). Default: all.
    pub runs: Option<Vec<String>>,
    /// Replaces `[data] splits`.
    pub splits: Option<Vec<SplitSpec>>,
    #[serde(default)]
    pub pretrain: PretrainScale,
    #[serde(default)]
    pub rl: PgScale,
    #[serde(default)]
    pub opd: PgScale,
    /// Replaces `[eval]` (left-out keys take the reference's values).
    pub eval: Option<EvalSection>,
}

/// Pre-training at a smaller scale.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PretrainScale {
    pub steps: Option<u64>,
    pub micro_batch: Option<usize>,
    pub grad_accum: Option<usize>,
    pub cutoff_len: Option<usize>,
    /// The mixture's token budget.
    pub tokens: Option<f64>,
    pub lr: Option<f64>,
    pub min_lr: Option<f64>,
    pub warmup_ratio: Option<f64>,
}

/// A GRPO or OPD run at a smaller scale.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgScale {
    pub steps: Option<u64>,
    /// `[output] save_freq`.
    pub save_every: Option<f64>,
    pub prompts_per_step: Option<usize>,
    pub mini_batch: Option<usize>,
    pub micro_batch: Option<usize>,
    pub n: Option<usize>,
    pub max_prompt_length: Option<usize>,
    pub max_response_length: Option<usize>,
    /// `[rollout] batch_size`.
    pub rollout_batch: Option<usize>,
    pub lr: Option<f64>,
    /// Greedy validation: every n steps (0: none), on the first rows of each op, this long.
    pub validation_every: Option<u64>,
    pub validation_rows_per_op: Option<usize>,
    pub validation_max_new_tokens: Option<usize>,
}

impl ReleaseConfig {
    /// Reads `release.toml` (its text); relative paths become relative to its directory.
    pub fn from_toml(path: &Path, text: &str) -> Result<Self> {
        let mut config: ReleaseConfig = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
            Error::data(path, line, e.message().to_string())
        })?;
        let base = base_dir(path);
        resolve(base, &mut config.release.out);
        for batch in &mut config.batches {
            resolve(base, &mut batch.pretrain);
            batch.rl.iter_mut().chain(batch.opd.iter_mut()).for_each(|p| resolve(base, p));
        }
        config.check().map_err(|message| Error::config(path, message))?;
        Ok(config)
    }

    /// Reads the file at `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_toml(path, &text)
    }

    /// Settings that cannot work together.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.batches.is_empty() {
            return Err("a release needs at least one [[batch]]".into());
        }
        let mut names = std::collections::HashSet::new();
        for batch in &self.batches {
            let plain = !batch.name.is_empty() && batch.name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)) && batch.name != "data";
            if !plain {
                return Err(format!("[[batch]] name {:?} must be a plain directory name (letters, digits, _ - .; not \"data\")", batch.name));
            }
            if !names.insert(&batch.name) {
                return Err(format!("[[batch]] {:?} is given twice", batch.name));
            }
            if batch.opd.is_some() != batch.teacher.is_some() {
                return Err(format!("[[batch]] {}: `opd` and `teacher` go together", batch.name));
            }
        }
        let splits = std::iter::once(&self.data.splits).chain(self.scale.values().filter_map(|s| s.splits.as_ref()));
        for spec in splits.flatten() {
            spec.split()?;
            spec.op_list()?;
            if spec.per_op == 0 {
                return Err(format!("split {}: per_op must be at least 1", spec.split));
            }
        }
        for (name, profile) in &self.scale {
            if name == "full" || name.is_empty() {
                return Err(format!("[scale.{name}]: `full` is the configs as written; name smaller scales otherwise"));
            }
            if let Some(unknown) = profile.batches.iter().flatten().find(|b| !self.batches.iter().any(|c| &c.name == *b)) {
                return Err(format!("[scale.{name}] batches: no [[batch]] named {unknown:?}"));
            }
            if profile.batches.as_ref().is_some_and(Vec::is_empty) {
                return Err(format!("[scale.{name}] batches: name at least one"));
            }
            if profile.runs.as_ref().is_some_and(Vec::is_empty) {
                return Err(format!("[scale.{name}] runs: name at least one (leave it out for every run)"));
            }
            if let Some(ops) = &profile.ops {
                super::ops::OpMap::parse(ops).map_err(|e| format!("[scale.{name}] {e}"))?;
            }
            if let Some(model) = &profile.model {
                let plain = !model.name.is_empty() && model.name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
                if !plain {
                    return Err(format!("[scale.{name}.model] name {:?} must be a plain directory name", model.name));
                }
            }
        }
        let evals = std::iter::once(&self.eval).chain(self.scale.values().filter_map(|s| s.eval.as_ref()));
        for eval in evals {
            if eval.samples == 0 || eval.shard_prompts == 0 || eval.batch_size == 0 || eval.max_new_tokens == 0 {
                return Err("[eval] samples, shard_prompts, batch_size and max_new_tokens must be at least 1".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_lists() {
        assert_eq!(parse_ops("2-4").unwrap(), [2, 3, 4]);
        assert_eq!(parse_ops("11-14, 3").unwrap(), [11, 12, 13, 14, 3]);
        assert!(parse_ops("1-3").unwrap_err().contains("outside"));
        assert!(parse_ops("5-4").unwrap_err().contains("empty"));
        assert!(parse_ops("x").unwrap_err().contains("not an op list"));
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let text = "[release]\nout = \"r\"\n[data]\nseed = 1\nsplits = []\n[[batch]]\nname = \"a\"\npretrain = \"p.toml\"\nbogus = 3\n";
        let e = ReleaseConfig::from_toml(Path::new("cfg/release.toml"), text).unwrap_err().to_string();
        assert!(e.contains("cfg/release.toml") && e.contains("line 9") && e.contains("bogus"), "{e}");
        let text = text.replace("bogus = 3\n", "opd = \"o.toml\"\n");
        let e = ReleaseConfig::from_toml(Path::new("cfg/release.toml"), &text).unwrap_err().to_string();
        assert!(e.contains("`opd` and `teacher` go together"), "{e}");
        let ok = ReleaseConfig::from_toml(Path::new("cfg/release.toml"), &text.replace("opd = \"o.toml\"\n", "")).unwrap();
        assert_eq!(ok.batches[0].pretrain, Path::new("cfg/p.toml"));
        assert_eq!(ok.eval, EvalSection::default());
    }
}
