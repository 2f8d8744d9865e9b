//! The run configs of `kiln pretrain` and `kiln sft` ([`crate::train::run::RunConfig`]) and of
//! `kiln rl` and `kiln opd` ([`crate::rl::PgConfig`]) (TOML), built from the sections here:
//!
//! ```toml
//! [model]      # init = "config.json" (from scratch, seeded) | from = "hf-dir"; tokenizer; seed;
//!              # dtype (rl, opd: rollouts, reference, teacher)
//! [task]       # kind = "interplay" (the default)
//! [data]       # kind = "mixture" (pretrain) | "sft" (sft) | "prompts" (rl, opd)
//! [train]      # steps | epochs; precision = "f32" | "bf16-mixed" | "f16-mixed" | "bf16-pure";
//!              # recompute; devices; shard_optimizer; grad_reduce_dtype = "f32" | "bf16";
//!              # overlap_grad_reduce;
//!              # pretrain, sft: micro_batch, grad_accum,
//!              # seed, padding_free
//!              # ([NextTokenTrain]); rl, opd: prompts_per_step, mini_batch, micro_batch
//! [optimizer]  # AdamW: lr, weight_decay, max_grad_norm, beta1, beta2, eps (read straight into
//!              # the optimizer's own `AdamWConfig`)
//! [schedule]   # kind = "constant" | "constant_with_warmup" | "linear" | "cosine"
//!              #      | "cosine_with_min_lr" (min_lr | min_lr_rate) | "cosine_then_floor"
//!              #        (floor_lr, decay_steps); warmup_ratio | warmup_steps
//! [output]     # dir, name, save_steps, milestones, time_budget_s
//! [eval]       # pretrain, sft ([NextTokenEval]): every, steps, rows, ops, rows_per_op,
//!              # max_new_tokens; rl, opd: also id_max_op
//! ```
//!
//! What a file leaves out comes from its family's table in [`defaults`], laid under the file
//! before it is read, so every struct here is read complete. Settings of the other family are
//! refused at load, naming the line. Paths are relative to the config file's directory. Config
//! files written before this schema keep working: their keys are moved to their places before
//! the file is read ([`legacy`]). Errors name the file and the line.

pub mod defaults;
pub mod legacy;
#[cfg(all(test, feature = "tasks"))]
mod code_sft_tests;
#[cfg(all(test, feature = "tasks"))]
mod tests;

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::precision::Precision;
use crate::model::Dtype;
use super::schedule::{Decay, Schedule};
use super::trainer::SavePolicy;
use crate::data::chat::{SftColumns, TemplateChoice};
use crate::error::{Error, Result};

/// Which family of runs a config is read for: their defaults and old forms differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `kiln pretrain`, `kiln sft`: next-token loss.
    NextToken,
    /// `kiln rl`, `kiln opd`: policy gradient.
    PolicyGradient,
}

/// `[model]`: where the model comes from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A `config.json` to initialise from scratch (HF's `_init_weights`, seeded) ...
    pub init: Option<PathBuf>,
    /// ... or an HF model directory to continue from (the policy's start and frozen reference
    /// in rl and opd).
    pub from: Option<PathBuf>,
    /// Directory with `tokenizer.json` (default: that of `from`, or of `init`).
    pub tokenizer: Option<PathBuf>,
    /// Seed of the initialisation.
    #[serde(default)]
    pub seed: u64,
    /// rl, opd: the dtype of rollouts, the reference and the teacher (f32, bf16, f16; default:
    /// the policy's compute dtype for rollouts, f32 for the frozen models). Training precision
    /// is `[train] precision`.
    pub dtype: Option<Dtype>,
}

impl ModelSection {
    /// The tokenizer directory.
    pub fn tokenizer_dir(&self) -> std::result::Result<PathBuf, String> {
        self.tokenizer
            .clone()
            .or_else(|| self.from.clone())
            .or_else(|| self.init.as_ref().and_then(|p| p.parent().map(Path::to_path_buf)))
            .ok_or_else(|| "[model] needs `init` (a config.json) or `from` (a model directory)".into())
    }
}

/// More sequences than this in one optimizer step (micro-batches × accumulation, or an RL step's
/// responses) are refused: 2^24, thousands of times any published recipe's batch (a typo,
/// which would otherwise overflow or copy samples for hours before the first step).
pub const MAX_SEQUENCES_PER_STEP: usize = 1 << 24;

/// `steps`, or the steps of `epochs` by the run's rule; exactly one is needed.
pub fn total_steps(steps: Option<u64>, epochs: Option<f64>, of_epochs: impl FnOnce(f64) -> u64) -> std::result::Result<u64, String> {
    match (steps, epochs) {
        (Some(0), None) => Err("[train] steps must be at least 1".into()),
        (Some(steps), None) => Ok(steps),
        (None, Some(epochs)) if !(epochs.is_finite() && epochs > 0.0) => Err(format!("[train] epochs must be a finite number > 0 (got {epochs})")),
        (None, Some(epochs)) => Ok(of_epochs(epochs)),
        _ => Err("[train] needs exactly one of `steps` or `epochs`".into()),
    }
}

/// `[train]` of `kiln pretrain` and `kiln sft`: steps and batches (`kiln rl`'s is
/// [`crate::rl::config::PgTrain`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NextTokenTrain {
    /// Optimizer updates; or give `epochs`.
    pub steps: Option<u64>,
    pub epochs: Option<f64>,
    /// Sequences per micro-batch (with neat packing: bins). Required.
    pub micro_batch: usize,
    /// Micro-batches per optimizer update.
    pub grad_accum: usize,
    /// Data order.
    pub seed: u64,
    /// Data-parallel devices of each process, one replica each (`["cuda:0", "cuda:1"]`,
    /// `["cpu", "cpu"]`; default: the CPU). Batches are per replica: a step takes
    /// `micro_batch × grad_accum` samples on every replica. `--devices` or `--backend` on the
    /// command line override it.
    pub devices: Option<Vec<String>>,
    /// `"f32"`, `"bf16-mixed"`, `"f16-mixed"` or `"bf16-pure"` ([`crate::train::precision`]).
    pub precision: Precision,
    /// Checkpoint every decoder layer (Hugging Face's `gradient_checkpointing`): keep only each
    /// layer's input and recompute the layer in the backward pass, for the same gradients with
    /// one more forward pass of the layers ([`crate::model::checkpoint`]; the backend is set up
    /// with burn's `BalancedCheckpointing` by `kiln_backends::run_training_with`).
    pub recompute: bool,
    /// Each micro-batch's sequences concatenated into one row without padding, positions
    /// restarting and attention within each sequence (TRL's `padding_free`): the same loss as
    /// the padded micro-batch, without the padding's compute and memory.
    pub padding_free: bool,
    /// ZeRO-1: shard AdamW's moments over the data-parallel replicas (see
    /// [`crate::train::LoopConfig::shard_optimizer`]); the same results as unsharded.
    pub shard_optimizer: bool,
    /// `"f32"` or `"bf16"`: the dtype data-parallel replicas all-reduce gradients in
    /// ([`crate::dist::ReduceDtype`]; bf16 needs NCCL).
    pub grad_reduce_dtype: crate::dist::ReduceDtype,
    /// All-reduce each decoder layer's gradients during the backward pass (Megatron's
    /// `overlap_grad_reduce`), where kiln's ring carries the sums (one replica per process;
    /// [`crate::train::LoopConfig::overlap_grad_reduce`]); default on. The same results.
    pub overlap_grad_reduce: bool,
}

impl NextTokenTrain {
    /// `steps`, or the steps of `epochs` by the run's rule.
    pub fn total_steps(&self, of_epochs: impl FnOnce(f64) -> u64) -> std::result::Result<u64, String> {
        total_steps(self.steps, self.epochs, of_epochs)
    }
}

/// A learning-rate schedule, by `transformers.get_scheduler`'s names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    Constant,
    ConstantWithWarmup,
    Linear,
    Cosine,
    /// Cosine to `min_lr` (or `min_lr_rate` × lr).
    CosineWithMinLr,
    /// Cosine to 0 over `decay_steps`, never below `floor_lr`, then `floor_lr`.
    CosineThenFloor,
}

/// `[schedule]`: the learning rate over the run, as a multiple of `[optimizer] lr`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSection {
    pub kind: ScheduleKind,
    /// Warm-up as a fraction of the steps (`ceil(total · ratio)`), unless `warmup_steps`.
    pub warmup_ratio: f64,
    pub warmup_steps: Option<u64>,
    /// `cosine_with_min_lr`: the floor, absolute or as a fraction of lr.
    pub min_lr: Option<f64>,
    pub min_lr_rate: Option<f64>,
    /// `cosine_then_floor`: the cosine's length (default: the run) and the floor.
    pub decay_steps: Option<u64>,
    pub floor_lr: Option<f64>,
}

impl ScheduleSection {
    /// The schedule of `total_steps` updates peaking at `base_lr` (the optimizer's `lr`, which
    /// a floor given as an absolute rate is divided by).
    pub fn build(&self, base_lr: f64, total_steps: u64) -> std::result::Result<Schedule, String> {
        if !(0.0..=1.0).contains(&self.warmup_ratio) {
            return Err(format!("[schedule] warmup_ratio must be in [0, 1] (got {})", self.warmup_ratio));
        }
        let warmup_steps = self.warmup_steps.unwrap_or_else(|| Schedule::warmup_from_ratio(total_steps, self.warmup_ratio));
        let decay = match self.kind {
            ScheduleKind::Constant | ScheduleKind::ConstantWithWarmup => Decay::Constant,
            ScheduleKind::Linear => Decay::Linear,
            ScheduleKind::Cosine => Decay::Cosine,
            ScheduleKind::CosineWithMinLr => Decay::CosineWithMinLr {
                min_lr_rate: match (self.min_lr, self.min_lr_rate) {
                    // A negative rate would climb the loss, a NaN one (min_lr with lr 0) turn every weight NaN.
                    (Some(min_lr), None) if !(min_lr >= 0.0 && min_lr.is_finite() && (min_lr == 0.0 || base_lr > 0.0)) => {
                        return Err(format!("[schedule] min_lr must be a finite number >= 0, and [optimizer] lr positive for it (got min_lr {min_lr}, lr {base_lr})"));
                    }
                    (Some(min_lr), None) => if min_lr == 0.0 { 0.0 } else { min_lr / base_lr },
                    (None, Some(rate)) if !(rate.is_finite() && rate >= 0.0) => return Err(format!("[schedule] min_lr_rate must be a finite number >= 0 (got {rate})")),
                    (None, Some(rate)) => rate,
                    _ => return Err("[schedule] cosine_with_min_lr needs exactly one of `min_lr` or `min_lr_rate`".into()),
                },
            },
            ScheduleKind::CosineThenFloor => Decay::CosineThenFloor {
                steps: self.decay_steps.unwrap_or(total_steps),
                floor: match self.floor_lr.ok_or("[schedule] cosine_then_floor needs `floor_lr`")? {
                    floor if floor.is_finite() && floor >= 0.0 => floor,
                    floor => return Err(format!("[schedule] floor_lr must be a finite number >= 0 (got {floor})")),
                },
            },
        };
        Ok(Schedule { warmup_steps, total_steps, decay })
    }
}

/// `[output]`: where checkpoints and metrics go.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSection {
    /// E.g. `release/pretrain` or `release/rl`.
    pub dir: PathBuf,
    /// Checkpoints `<name>_step<N>` and `<name>_metrics.jsonl` (e.g. `op11_14`); an empty name
    /// gives `step<N>`; without one, `checkpoint-<N>` and `metrics.jsonl`.
    pub name: Option<String>,
    /// Save every n steps (a whole number), or a fraction of the run (`0.2` → 5 checkpoints);
    /// absent, 0 or less (TRL's `save_strategy = "no"`, verl's `-1`): after the last step only.
    /// (`save_freq` in rl/opd configs.)
    #[serde(alias = "save_freq")]
    pub save_steps: Option<f64>,
    /// Extra steps to save at.
    #[serde(default)]
    pub milestones: Vec<u64>,
    /// Stop cleanly (and save) after this many seconds.
    pub time_budget_s: Option<f64>,
    /// `--resume` continues under settings that differ from the checkpoint's run config (with
    /// a warning listing them) instead of refusing; `--allow-config-change` sets it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_config_change: bool,
}

impl OutputSection {
    /// The time budget, if any; it must be a finite number of seconds, at least 0.
    pub fn time_budget(&self) -> std::result::Result<Option<std::time::Duration>, String> {
        match self.time_budget_s {
            None => Ok(None),
            // (`try_from`: a huge finite budget is an error, not `from_secs_f64`'s panic.)
            Some(s) if s.is_finite() && s >= 0.0 => std::time::Duration::try_from_secs_f64(s)
                .map(Some)
                .map_err(|_| format!("[output] time_budget_s = {s} is more seconds than a duration holds; leave it out for no budget")),
            Some(s) => Err(format!("[output] time_budget_s must be a finite number of seconds >= 0 (got {s})")),
        }
    }

    /// `name`, `save_steps` and `time_budget_s` as a run can use them.
    pub fn check(&self) -> std::result::Result<(), Refusal> {
        self.time_budget()?;
        if let Some(name) = self.name.as_deref().filter(|n| n.contains(['/', '\0'])) {
            let message = format!("[output] name {name:?} must be a plain name: it begins the names of the files in `dir` (no '/')");
            return Err(Refusal::at("output", Some("name"), message));
        }
        if let Some(every) = self.save_steps.filter(|e| e.is_nan() || e.is_infinite() || (*e > 1.0 && e.fract() != 0.0)) {
            let message = format!(
                "[output] save_steps must be a whole number of steps, or a fraction of the run below 1 (got {every}; 0 or less saves the last step only)"
            );
            return Err(Refusal::at("output", Some("save_steps"), message));
        }
        Ok(())
    }

    /// When to save.
    pub fn save_policy(&self) -> SavePolicy {
        SavePolicy {
            every: self.save_steps,
            milestones: self.milestones.clone(),
            run_name: self.name.clone(),
            ..SavePolicy::default()
        }
    }
}

/// `[eval]` of `kiln pretrain` and `kiln sft`: evaluation during training on held-out rows of
/// the run's task — the loss on their reference text and greedy accuracy (`kiln rl`'s is
/// [`crate::rl::config::PgEval`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NextTokenEval {
    /// Every n steps, and before the first and after the last.
    pub every: Option<u64>,
    /// Also after these steps (0: before the first), e.g. a study's checkpoint steps
    /// `[60, 120]`, and then also after the step a time budget stops the run at. With `every`
    /// or `steps` the last step is evaluated too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<u64>,
    /// A JSONL file or a directory of them (`heldout` in earlier configs).
    #[serde(alias = "heldout", alias = "dir")]
    pub rows: Option<PathBuf>,
    /// The ops whose rows are scored for greedy accuracy (none unless given; `accuracy_ops`).
    #[serde(default, alias = "accuracy_ops")]
    pub ops: Vec<u32>,
    /// Rows per op scored (`accuracy_rows`).
    #[serde(alias = "accuracy_rows")]
    pub rows_per_op: usize,
    /// Generation length of the accuracy's greedy answers.
    pub max_new_tokens: usize,
}

/// `[data]`: what a run trains on, by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DataSection {
    /// Pre-training: packed blocks of a PRESET mixture of the task's rows.
    Mixture(MixtureData),
    /// Supervised fine-tuning on chat rows.
    Sft(SftData),
    /// RL prompts: the task's rows.
    Prompts(PromptData),
}

impl DataSection {
    /// The `kind`, as configs spell it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Mixture(_) => "mixture",
            Self::Sft(_) => "sft",
            Self::Prompts(_) => "prompts",
        }
    }
}

/// `[data] kind = "mixture"` (old configs: `interplay = "<root>"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixtureData {
    /// Root of the composition layout (`train/<op>/*.jsonl`).
    pub root: PathBuf,
    /// PRESET.json and the task and setting to use (e.g. `id2-10_0.2easy_0.3medium_0.5hard`) ...
    pub preset: Option<PathBuf>,
    #[serde(default = "default_preset_task")]
    pub task: String,
    pub setting: Option<String>,
    /// ... or the mixture inline: ops and their probabilities.
    pub ops: Option<Vec<u32>>,
    pub probs: Option<Vec<f64>>,
    /// The mixture's token budget (`task_token_count`), e.g. `"10B"` or `2e6`.
    pub tokens: Option<TokenCount>,
    /// `reproduce` or `fix` the 020305 preset typo.
    #[serde(default)]
    pub typo: Typo,
    /// Packed block length (held-out rows are cut to it for the loss).
    #[serde(default = "default_cutoff")]
    pub cutoff_len: usize,
    /// Keep each block's documents apart: no attention across them, positions restarting at
    /// each (LLaMA-Factory's `neat_packing`; the blocks are the same). Off: the paper's packing,
    /// documents attending to earlier ones in their block.
    #[serde(default)]
    pub neat_packing: bool,
}

/// `[data] kind = "sft"` (old configs: `sft = "<file>"`).
///
/// Code SFT on codeforces-cots (spec code-sft.md §2.1, §4.3) reads the Parquet shards with the
/// columns named and the seed's 128 rows held out:
///
/// ```toml
/// [data]
/// kind = "sft"
/// path = "codeforces-cots/data/solutions_py_decontaminated/train-*.parquet"
/// columns = { prompt = "prompt", completion = "generation" }
/// heldout = 128      # the rows with the smallest sha256(id); their loss is `eval_loss`
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftData {
    /// Rows `{"messages": …}` or `{"prompt", "completion"}` per line; or `.parquet` files (a
    /// file, a directory, or a `train-*.parquet` pattern), whose `columns` must be named.
    pub path: PathBuf,
    /// The columns to train on (required for Parquet, and for rows with both `messages` and
    /// `prompt`): `{ messages = "messages" }` or `{ prompt = "prompt", completion = "generation" }`.
    /// (`sft_columns` in earlier configs.)
    #[serde(default, alias = "sft_columns", skip_serializing_if = "Option::is_none")]
    pub columns: Option<SftColumns>,
    /// Hold out this many rows, those with the smallest SHA-256 of `split_key`; their loss is
    /// the `eval_loss` of `[eval] every`. (`sft_heldout`.)
    #[serde(default, alias = "sft_heldout", skip_serializing_if = "Option::is_none")]
    pub heldout: Option<usize>,
    /// The column the held-out split hashes (default `id`). (`sft_split_key`.)
    #[serde(default, alias = "sft_split_key", skip_serializing_if = "Option::is_none")]
    pub split_key: Option<String>,
    /// Keep the first `max_length` tokens of each row.
    pub max_length: Option<usize>,
    /// System prompt inserted when a row has none (default: the chat template's own; in ChatML
    /// Qwen's; `""` for none, which renders in ChatML).
    pub system_prompt: Option<String>,
    /// The chat template rows are rendered with: a model directory or a Jinja file (TRL's
    /// `chat_template_path`), or `"chatml"`. Default: the tokenizer's own (its directory's
    /// `chat_template.jinja` or `tokenizer_config.json`'s), as TRL renders; ChatML when it has
    /// none, when it is Qwen2.5's (which ChatML renders byte for byte) or with
    /// `system_prompt = ""`. Runs before this key rendered ChatML: a checkpoint that does not
    /// record it resumes only as ChatML (`--allow-config-change` for another template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<TemplateChoice>,
    /// The EOS token the checkpoints are saved with (TRL's SFTConfig `eos_token`, for a base
    /// model trained on turns that end with another token): `eos_token` of their tokenizer
    /// configs, `eos_token_id` of `config.json`, first of `generation_config.json`'s. It must be
    /// in the tokenizer. A model directory named by `chat_template` sets its own EOS instead, as
    /// TRL's `clone_chat_template` does after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token: Option<String>,
    /// Held-out rows are cut to this many tokens for the loss; with `neat_packing`, the length
    /// of the bins rows are packed into.
    #[serde(default = "default_cutoff")]
    pub cutoff_len: usize,
    /// Pack rows first-fit-decreasing into bins of `cutoff_len` tokens, each row attending only
    /// to itself with its own positions (LLaMA-Factory's `neat_packing`, TRL's `packing` with
    /// `packing_strategy = "bfd"`): `micro_batch` then counts bins. The loss of a bin is its
    /// rows' padded loss.
    #[serde(default)]
    pub neat_packing: bool,
}

/// `[data] kind = "prompts"` (old configs: `dir = …` or `files = […]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptData {
    /// A directory of per-op files (`heldout/op11-50k.jsonl`, …) ...
    pub dir: Option<PathBuf>,
    /// ... of which these ops (default: every file of `dir`) ...
    #[serde(default)]
    pub ops: Vec<u32>,
    /// ... or explicit files.
    #[serde(default)]
    pub files: Vec<PathBuf>,
    /// Read only the first rows of each file.
    pub rows_per_op: Option<usize>,
    /// Longer prompts are dropped (and counted).
    #[serde(default = "default_prompt_length")]
    pub max_prompt_length: usize,
    /// Prompt order and rollout seeds (verl's `data.seed`).
    #[serde(default = "default_prompt_seed")]
    pub seed: u64,
}

fn default_preset_task() -> String {
    "composition-10B/op_level".into()
}
/// The default `cutoff_len`; a model with a shorter context cuts it to its context.
pub const DEFAULT_CUTOFF: usize = 2048;

fn default_cutoff() -> usize {
    DEFAULT_CUTOFF
}
fn default_prompt_length() -> usize {
    1024
}
fn default_prompt_seed() -> u64 {
    1
}

/// A token count as a number or a readable string (`"10B"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenCount {
    Number(f64),
    Text(String),
}

/// The 020305 typo policy, as written in configs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Typo {
    #[default]
    Reproduce,
    Fix,
}

/// Reads a config of `family` from `text` (the contents of `path`): old forms are moved into
/// the schema first, then the family's [`defaults`] are laid under it; an error names the file
/// and the line.
pub fn read_config<T: DeserializeOwned>(path: &Path, text: &str, family: Family) -> Result<T> {
    let mut doc = migrated(path, text, family)?;
    required(path, text, doc.get_ref(), family)?;
    defaults::lay_under(doc.get_mut(), family);
    T::deserialize(toml::de::Deserializer::from(doc)).map_err(|e| toml_error(path, text, e))
}

/// The keys a family has no default for: (section, key).
const REQUIRED: [(Family, &str, &str); 2] = [(Family::NextToken, "optimizer", "lr"), (Family::NextToken, "train", "micro_batch")];

/// An error naming the first key of [`REQUIRED`] the file leaves out (at its section's line).
fn required(path: &Path, text: &str, doc: &toml::de::DeTable<'_>, family: Family) -> Result<()> {
    for &(f, section, key) in &REQUIRED {
        if f != family {
            continue;
        }
        let table = doc.get_key_value(section);
        let given = table.is_some_and(|(_, v)| matches!(v.get_ref(), toml::de::DeValue::Table(t) if t.contains_key(key)));
        if !given {
            let line = table.map(|(k, _)| line_of(text, k.span().start));
            return Err(Error::data(path, line, format!("[{section}] needs `{key}`")));
        }
    }
    Ok(())
}

/// The document of `text` (the contents of `path`) with its old forms moved into the schema,
/// before it is read as a config: the keys the file gives, each in its current place (serde's
/// aliases, such as `save_freq`, keep their names). `kiln config upgrade` keeps these.
pub fn migrated_table(path: &Path, text: &str, family: Family) -> Result<toml::Table> {
    let doc = migrated(path, text, family)?;
    toml::Table::deserialize(toml::de::Deserializer::from(doc)).map_err(|e| toml_error(path, text, e))
}

/// The line of byte `offset` of `text` (1-based).
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

fn toml_error(path: &Path, text: &str, e: toml::de::Error) -> Error {
    match e.span() {
        Some(span) => Error::data(path, Some(line_of(text, span.start)), e.message().to_string()),
        None => Error::data(path, None, e.message().to_string()),
    }
}

fn migrated<'i>(path: &Path, text: &'i str, family: Family) -> Result<toml::Spanned<toml::de::DeTable<'i>>> {
    let mut doc = toml::de::DeTable::parse(text).map_err(|e| toml_error(path, text, e))?;
    legacy::migrate(doc.get_mut(), family).map_err(|e| Error::data(path, Some(line_of(text, e.span().start)), e.into_inner()))?;
    if family == Family::NextToken {
        for section in POLICY_GRADIENT_SECTIONS {
            if let Some((key, _)) = doc.get_ref().get_key_value(section) {
                let message = format!("[{section}] is for `kiln rl` and `kiln opd` (policy gradient), not `kiln pretrain` or `kiln sft`");
                return Err(Error::data(path, Some(line_of(text, key.span().start)), message));
            }
        }
    }
    for &(f, section, key, message) in &OTHER_FAMILY_KEYS {
        if f != family {
            continue;
        }
        if let Some((_, toml::de::DeValue::Table(table))) = doc.get_ref().get_key_value(section).map(|(k, v)| (k, v.get_ref()))
            && let Some((name, _)) = table.get_key_value(key)
        {
            return Err(Error::data(path, Some(line_of(text, name.span().start)), message));
        }
    }
    Ok(doc)
}

/// The sections only `kiln rl` and `kiln opd` read.
const POLICY_GRADIENT_SECTIONS: [&str; 4] = ["rollout", "loss", "reward", "teacher"];

/// Keys of the other family's sections, refused in a config of the first: (family read, section,
/// key, why).
const OTHER_FAMILY_KEYS: [(Family, &str, &str, &str); 7] = [
    (Family::NextToken, "train", "prompts_per_step", "[train] prompts_per_step is for `kiln rl` and `kiln opd`"),
    (Family::NextToken, "train", "mini_batch", "[train] mini_batch is for `kiln rl` and `kiln opd`"),
    (Family::NextToken, "eval", "id_max_op", "[eval] id_max_op is for `kiln rl` and `kiln opd` (their ID/OOD split)"),
    (Family::NextToken, "model", "dtype", "[model] dtype is for rl and opd (rollouts, reference, teacher); training precision is [train] precision"),
    (Family::PolicyGradient, "train", "grad_accum", "[train] grad_accum is for `kiln pretrain` and `kiln sft` (rl/opd split a step by mini_batch)"),
    (Family::PolicyGradient, "train", "seed", "[train] seed is for `kiln pretrain` and `kiln sft`; rl and opd seed their prompt order with [data] seed"),
    (Family::PolicyGradient, "train", "padding_free", "[train] padding_free is for `kiln pretrain` and `kiln sft`"),
];

/// A setting a run's `check()` refuses, and the key it is about: `[section] key`, or the
/// section itself when `key` is `None`. [`refused`] names the key's line in the file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub section: Option<&'static str>,
    pub key: Option<&'static str>,
    pub message: String,
}

impl Refusal {
    /// A refusal about `[section] key` (or the section).
    pub fn at(section: &'static str, key: Option<&'static str>, message: impl Into<String>) -> Self {
        Self { section: Some(section), key, message: message.into() }
    }
}

impl From<String> for Refusal {
    fn from(message: String) -> Self {
        Self { section: None, key: None, message }
    }
}

impl From<&str> for Refusal {
    fn from(message: &str) -> Self {
        message.to_owned().into()
    }
}

impl From<Refusal> for String {
    fn from(refusal: Refusal) -> Self {
        refusal.message
    }
}

/// The error of `refusal` for the config `text` at `path`: the file and the line of the key it
/// is about (a key moved from an old place keeps its line), or the file alone.
pub fn refused(path: &Path, text: &str, family: Family, refusal: Refusal) -> Error {
    let line = refusal.section.and_then(|section| {
        let doc = migrated(path, text, family).ok()?;
        let (key, value) = doc.get_ref().get_key_value(section)?;
        let span = match (refusal.key, value.get_ref()) {
            (Some(name), toml::de::DeValue::Table(table)) => table.get_key_value(name)?.0.span(),
            _ => key.span(),
        };
        Some(line_of(text, span.start))
    });
    match line {
        Some(line) => Error::data(path, Some(line), refusal.message),
        None => Error::config(path, refusal.message),
    }
}

/// Makes `path` relative to `base` when it is relative.
pub fn resolve(base: &Path, path: &mut PathBuf) {
    if path.is_relative() {
        *path = base.join(&*path);
    }
}

/// The directory relative paths of the config at `path` are relative to.
pub fn base_dir(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Resolves the paths of the shared sections against the config's directory.
#[cfg(feature = "tasks")]
pub(crate) fn resolve_shared(base: &Path, model: &mut ModelSection, data: &mut DataSection, output: &mut OutputSection, eval_rows: Option<&mut PathBuf>) {
    let fix = |p: &mut PathBuf| resolve(base, p);
    model.init.iter_mut().chain(model.from.iter_mut()).chain(model.tokenizer.iter_mut()).for_each(fix);
    match data {
        DataSection::Mixture(m) => {
            fix(&mut m.root);
            m.preset.iter_mut().for_each(fix);
        }
        DataSection::Sft(s) => {
            fix(&mut s.path);
            if let Some(TemplateChoice::Path(p)) = &mut s.chat_template {
                fix(p);
            }
        }
        DataSection::Prompts(p) => p.dir.iter_mut().chain(p.files.iter_mut()).for_each(fix),
    }
    fix(&mut output.dir);
    eval_rows.into_iter().for_each(fix);
}
