//! `kiln pretrain` and `kiln sft`: a [`RunConfig`] run with the next-token loss — the model to
//! start from, the data (a mixture of the task's rows, or chat rows), the optimizer and
//! schedule, saving and held-out evaluation. The config schema is the one of every run
//! ([`super::config`]).

use std::path::{Path, PathBuf};

use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::adamw::AdamWConfig;
use super::config::{
    DEFAULT_CUTOFF, DataSection, Family, MAX_SEQUENCES_PER_STEP, MixtureData, ModelSection, NextTokenEval, NextTokenTrain, OutputSection, Refusal,
    ScheduleSection, SftData, TokenCount, Typo, base_dir, read_config, refused, resolve_shared,
};
use super::heldout::HeldOut;
use super::objective::NextTokenLoss;
use super::checkpoint::{RunRecord, data_fingerprint};
use super::launch::{self, Prepared};
use super::trainer::{LoopConfig, Record, RunSummary};
use crate::data::Sample;
use crate::data::chat::{ChatFormat, NO_SYSTEM_TURN_IS_CHATML, TemplateChoice, render_examples};
use crate::data::sft_source::{SftSource, SplitRule, read_sft_rows};
use crate::data::corpus::pretrain_samples;
use crate::data::packing::first_fit_decreasing;
use crate::data::mixture::{Preset, TypoPolicy, readable_to_number};
use crate::dist::{NodeSpec, Replica};
use crate::error::{Error, Result};
use crate::model::{Qwen2, Qwen2Config, hf};
use crate::tasks::{Task, TaskConfig};
use crate::tokenizer::Tokenizer;

/// A pre-training or SFT run (see [`super::config`] for the sections; what a file leaves out:
/// [`super::config::defaults::NEXT_TOKEN`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub model: ModelSection,
    /// The task of the mixture's rows and of the held-out evaluation (Interplay if absent).
    #[serde(default)]
    pub task: TaskConfig,
    /// `kind = "mixture"` (`kiln pretrain`) or `"sft"` (`kiln sft`).
    pub data: DataSection,
    pub train: NextTokenTrain,
    /// AdamW, read straight into the optimizer's settings.
    pub optimizer: AdamWConfig,
    pub schedule: ScheduleSection,
    pub output: OutputSection,
    pub eval: NextTokenEval,
}

/// `kiln pretrain` or `kiln sft`: which `[data] kind` each reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Pretrain,
    Sft,
}

impl Command {
    fn name(self) -> &'static str {
        match self {
            Self::Pretrain => "pretrain",
            Self::Sft => "sft",
        }
    }

    fn data_kind(self) -> &'static str {
        match self {
            Self::Pretrain => "mixture",
            Self::Sft => "sft",
        }
    }
}

impl RunConfig {
    /// Reads a TOML run config (old forms included, [`super::config::legacy`]); relative paths
    /// become relative to its directory. Inconsistent settings, and settings of `kiln rl` and
    /// `kiln opd` (`[rollout]`, `[train] prompts_per_step`, ...), are errors naming the file and
    /// the line. [`RunConfig::load`] also checks the data against the command.
    pub fn from_toml(path: &Path, text: &str) -> Result<Self> {
        Self::read(path, text, None)
    }

    /// [`RunConfig::from_toml`] for `command`: `kiln pretrain` reads `[data] kind = "mixture"`,
    /// `kiln sft` `"sft"` (another kind is an error naming its line). This is where a config is
    /// checked: the run does not check it again.
    pub fn load(path: &Path, text: &str, command: Command) -> Result<Self> {
        Self::read(path, text, Some(command))
    }

    fn read(path: &Path, text: &str, command: Option<Command>) -> Result<Self> {
        let mut config: RunConfig = read_config(path, text, Family::NextToken)?;
        resolve_shared(base_dir(path), &mut config.model, &mut config.data, &mut config.output, config.eval.rows.as_mut());
        config.task.resolve_paths(base_dir(path));
        let refusal = |refusal| refused(path, text, Family::NextToken, refusal);
        config.check().map_err(refusal)?;
        if let Some(command) = command
            && config.data.kind() != command.data_kind()
        {
            let (name, want, got) = (command.name(), command.data_kind(), config.data.kind());
            return Err(refusal(Refusal::at("data", Some("kind"), format!("`kiln {name}` needs [data] kind = \"{want}\" (got \"{got}\")"))));
        }
        Ok(config)
    }

    /// Settings that cannot work together (named by [`Refusal`]'s key). [`RunConfig::from_toml`]
    /// runs it; a config built in code is checked by calling it before [`run`].
    pub fn check(&self) -> std::result::Result<(), Refusal> {
        let t = &self.train;
        if let DataSection::Prompts(_) = self.data {
            return Err(Refusal::at("data", Some("kind"), "[data] kind = \"prompts\" is for `kiln rl` and `kiln opd`; pretrain takes \"mixture\", sft \"sft\""));
        }
        if self.model.dtype.is_some() {
            return Err(Refusal::at("model", Some("dtype"), "[model] dtype is for rl and opd (rollouts, reference, teacher); training precision is [train] precision"));
        }
        if self.model.init.is_some() == self.model.from.is_some() {
            return Err(Refusal::at("model", None, "[model] needs exactly one of `init` (a config.json) or `from` (a model directory)"));
        }
        if t.micro_batch == 0 || t.grad_accum == 0 {
            return Err("[train] micro_batch and grad_accum must be positive".into());
        }
        if t.micro_batch.checked_mul(t.grad_accum).is_none_or(|n| n > MAX_SEQUENCES_PER_STEP) {
            let message = format!(
                "[train] micro_batch × grad_accum ({} × {}) is more than {MAX_SEQUENCES_PER_STEP} sequences per step",
                t.micro_batch, t.grad_accum
            );
            return Err(Refusal::at("train", Some("micro_batch"), message));
        }
        if self.cutoff_len() == 0 || matches!(&self.data, DataSection::Sft(s) if s.max_length == Some(0)) {
            return Err("[data] cutoff_len and max_length must be positive".into());
        }
        if let DataSection::Sft(SftData { chat_template: Some(TemplateChoice::Path(_)), system_prompt: Some(s), .. }) = &self.data
            && s.is_empty()
        {
            return Err(Refusal::at("data", Some("system_prompt"), NO_SYSTEM_TURN_IS_CHATML));
        }
        t.total_steps(|_| 0)?;
        self.output.check()?;
        self.optimizer.check().map_err(|(key, m)| Refusal::at("optimizer", Some(key), m))?;
        self.schedule.build(self.optimizer.lr, 1)?;
        Ok(())
    }

    /// The data's block length (held-out rows are cut to it).
    fn cutoff_len(&self) -> usize {
        match &self.data {
            DataSection::Mixture(m) => m.cutoff_len,
            DataSection::Sft(s) => s.cutoff_len,
            DataSection::Prompts(_) => usize::MAX,
        }
    }
}

/// The tokenizer directory of a run.
pub fn tokenizer_dir(model: &ModelSection) -> Result<std::path::PathBuf> {
    model.tokenizer_dir().map_err(Error::InvalidInput)
}

/// Runs a pre-training or SFT config on `device`; `resume` continues from the latest checkpoint
/// of the output directory. `on_record` sees every metrics record (for progress bars), and
/// `on_data` the data report (mixture shares or SFT truncation counts, sample and step counts)
/// before training starts.
pub fn run<B: AutodiffBackend>(
    config: &RunConfig,
    device: &B::Device,
    resume: bool,
    on_data: impl FnOnce(&Value),
    on_record: impl FnMut(&Record),
) -> Result<RunSummary> {
    run_replicated::<B>(config, std::slice::from_ref(device), None, resume, on_data, on_record)
}

/// [`run`] data-parallel: one replica per device of `devices`, and with `nodes` one process
/// per node (see [`crate::dist`]). A step takes `micro_batch × grad_accum` samples per replica;
/// rank 0 reports, evaluates and writes the checkpoints.
pub fn run_replicated<B: AutodiffBackend>(
    config: &RunConfig,
    devices: &[B::Device],
    nodes: Option<&NodeSpec>,
    resume: bool,
    on_data: impl FnOnce(&Value),
    on_record: impl FnMut(&Record),
) -> Result<RunSummary> {
    launch::replicated::<B, _, _>("next-token", config, &config.output, devices, nodes, resume, on_data, on_record, prepare::<B>)
}

/// One replica of a pre-training or SFT run: its data, objective and held-out evaluation.
fn prepare<'a, B: AutodiffBackend>(config: &'a RunConfig, replica: &Replica, device: &'a B::Device) -> Result<Prepared<'a, B, NextTokenLoss>> {
    // Checked where it was read (RunConfig::from_toml, naming the file and line), not again.
    let tokenizer_dir = tokenizer_dir(&config.model)?;
    let tokenizer = Tokenizer::from_file(&tokenizer_dir)?;
    let pad_id = tokenizer.pad_id().or_else(|| tokenizer.eos_id()).unwrap_or(0);
    let task = config.task.build()?;
    let t = &config.train;
    let seed = t.seed;
    let model = start_config(&config.model)?;
    let cutoff_len = fit_cutoff(&config.data, &model)?;
    check_pad_id(pad_id, &model.0, &model.1)?;
    let fits = |sample: &Sample| sample_fits(sample, &model);
    let prepare_data = || training_samples(task.as_ref(), &config.data, &tokenizer, seed, cutoff_len, &fits);
    // (Every replica prepares the same data; the first one reports it.)
    let TrainingData { samples, heldout: heldout_rows, report: data_report, edits } =
        if replica.is_main() { prepare_data()? } else { crate::progress::silenced(prepare_data)? };

    let (micro_batch, grad_accum) = (t.micro_batch, t.grad_accum);
    let samples_per_step = (micro_batch * grad_accum).saturating_mul(replica.world());
    let total_steps = t
        .total_steps(|epochs| ((samples.len() as f64 * epochs) / samples_per_step as f64).ceil() as u64)
        .map_err(Error::InvalidInput)?;
    let data_summary = json!({ "data": data_report, "samples": samples.len(), "total_steps": total_steps });
    let mut loop_config = loop_config(
        Sections { optimizer: &config.optimizer, schedule: &config.schedule, output: &config.output },
        total_steps,
        config.eval.every,
        Some(tokenizer_dir.clone()),
        recorded_config(config, &data_report, &samples, replica.world()),
    )
    .map_err(Error::InvalidInput)?;
    // (a file the edits cannot parse is found now, not at the first checkpoint)
    edits.check(&tokenizer_dir)?;
    loop_config.companion_edits = edits;
    loop_config.eval_steps = config.eval.steps.clone();
    loop_config.precision = t.precision;
    loop_config.shard_optimizer = t.shard_optimizer;
    loop_config.grad_reduce_dtype = t.grad_reduce_dtype;
    loop_config.overlap_grad_reduce = t.overlap_grad_reduce;
    let objective = NextTokenLoss::packed(samples, micro_batch, grad_accum, pad_id, seed)?.padding_free(t.padding_free).shard(replica.rank(), replica.world());
    let mut held_out = match replica.is_main() {
        true => {
            let mut held_out = HeldOut::load(task, &config.eval, cutoff_len, &tokenizer, pad_id)?;
            held_out.add_loss_samples(heldout_rows);
            Some(held_out)
        }
        false => None,
    };
    Ok(Prepared {
        loop_config,
        objective,
        fresh: Box::new(move || fresh_model(&config.model, device)),
        evaluate: Box::new(move |model| held_out.as_mut().map_or_else(|| Ok(Record::new()), |h| h.evaluate(model))),
        started: Box::new(move || Ok(data_summary)),
    })
}

/// What a checkpoint records of the run: its config, the data report, the sample count, the
/// number of replicas and the data's fingerprint ([`RunRecord`]). An SFT config records the
/// chat template its rows were rendered with, as resolved (the tokenizer's own by default), so
/// that resuming under another is a changed setting.
fn recorded_config(config: &RunConfig, data_report: &Value, samples: &[Vec<Sample>], replicas: usize) -> Value {
    let words = samples.iter().flatten().map(|s| s.ids.iter().map(|&id| u64::from(id)).chain(s.targets.iter().map(|&t| u64::from(t))));
    let mut recorded = json!({
        "config": config,
        "data": data_report,
        "samples": samples.len(),
        RunRecord::REPLICAS: replicas,
        RunRecord::DATA: data_fingerprint(words),
    });
    if let Some(template) = data_report.pointer("/sft/chat_template") {
        recorded["config"]["data"]["chat_template"] = template.clone();
    }
    recorded
}

/// The sections every run builds its loop from.
#[derive(Debug, Clone, Copy)]
pub struct Sections<'a> {
    pub optimizer: &'a AdamWConfig,
    pub schedule: &'a ScheduleSection,
    pub output: &'a OutputSection,
}

/// The loop settings of a run of `total_steps` updates: the optimizer as `[optimizer]` was read,
/// the schedule's shape, saving, the evaluation cadence and the time budget; `companions` (the
/// tokenizer directory) are copied into every checkpoint, and `run_config` recorded in it.
pub fn loop_config(
    sections: Sections<'_>,
    total_steps: u64,
    eval_every: Option<u64>,
    companions: Option<std::path::PathBuf>,
    run_config: Value,
) -> std::result::Result<LoopConfig, String> {
    let Sections { optimizer, schedule, output } = sections;
    Ok(LoopConfig {
        total_steps,
        schedule: schedule.build(optimizer.lr, total_steps)?,
        optimizer: *optimizer,
        out_dir: output.dir.clone(),
        save: output.save_policy(),
        eval_every,
        eval_steps: Vec::new(),
        time_budget: output.time_budget()?,
        companions,
        companion_edits: Default::default(),
        run_config,
        allow_config_change: output.allow_config_change,
        precision: Default::default(),
        shard_optimizer: false,
        grad_reduce_dtype: Default::default(),
        overlap_grad_reduce: true,
    })
}

fn fresh_model<B: Backend>(model: &ModelSection, device: &B::Device) -> Result<Qwen2<B>> {
    match (&model.init, &model.from) {
        (Some(init), None) => Qwen2::random(&Qwen2Config::from_file(init)?, model.seed, device),
        (None, Some(from)) => hf::load(from, device),
        _ => Err(Error::InvalidInput("[model] needs exactly one of `init` or `from`".into())),
    }
}

/// The config of the model a run starts from (`init`, or `from`'s `config.json`) and its path.
fn start_config(model: &ModelSection) -> Result<(Qwen2Config, PathBuf)> {
    let path = match (&model.init, &model.from) {
        (Some(init), None) => init.clone(),
        (None, Some(from)) => from.join("config.json"),
        _ => return Err(Error::InvalidInput("[model] needs exactly one of `init` or `from`".into())),
    };
    Ok((Qwen2Config::from_file(&path)?, path))
}

/// The run's `cutoff_len`: at most the model's context. The default (2048) is cut to a shorter
/// context; a value given above it is an error, before any step.
fn fit_cutoff(data: &DataSection, (model, path): &(Qwen2Config, PathBuf)) -> Result<usize> {
    let context = model.max_position_embeddings;
    let (cutoff, max_length) = match data {
        DataSection::Mixture(m) => (m.cutoff_len, None),
        DataSection::Sft(s) => (s.cutoff_len, s.max_length),
        DataSection::Prompts(_) => return Ok(context),
    };
    if let Some(max_length) = max_length.filter(|&m| m > context) {
        return Err(Error::config(path, format!("the model's context is {context} tokens; [data] max_length = {max_length} exceeds it")));
    }
    match cutoff {
        c if c <= context => Ok(c),
        DEFAULT_CUTOFF => Ok(context),
        c => Err(Error::config(path, format!("the model's context is {context} tokens; [data] cutoff_len = {c} exceeds it"))),
    }
}

/// The pad id is looked up in the embedding: it must lie inside the model's vocabulary (`model`,
/// read from `path`); pretraining, SFT and RL check it before anything runs.
pub(crate) fn check_pad_id(pad_id: u32, model: &Qwen2Config, path: &Path) -> Result<()> {
    let vocab = model.vocab_size;
    if pad_id as usize >= vocab {
        return Err(Error::config(path, format!(
            "the tokenizer's pad id {pad_id} is outside the model's vocabulary (vocab_size {vocab}); name a pad_token inside it in tokenizer_config.json"
        )));
    }
    Ok(())
}

/// Why `sample` does not fit the model (its ids below `vocab_size`, at most its context long),
/// said of the sample ("has 17 tokens, …"), if it does not.
fn sample_fits(sample: &Sample, (model, path): &(Qwen2Config, PathBuf)) -> std::result::Result<(), String> {
    let (vocab, context) = (model.vocab_size, model.max_position_embeddings);
    if let Some(&bad) = sample.ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(format!("has token id {bad}, outside the vocabulary of the model ({} has vocab_size {vocab}); is the tokenizer the model's?", path.display()));
    }
    if sample.ids.len() > context {
        return Err(format!("has {} tokens, more than the model's context ({context}); set [data] max_length", sample.ids.len()));
    }
    Ok(())
}

/// What a pre-training or SFT run trains on ([`training_samples`]).
#[derive(Debug)]
struct TrainingData {
    /// The training rows: each one sample, or the documents of a neatly packed bin.
    samples: Vec<Vec<Sample>>,
    /// The rows held out for the loss (SFT `heldout`).
    heldout: Vec<Sample>,
    /// The data report.
    report: Value,
    /// What the checkpoints change in the tokenizer's files (SFT: the template and EOS trained with).
    edits: hf::CompanionEdits,
}

/// The data a run trains on. A sample that does not `fit` the model is an error naming its SFT
/// row's file and line (or row), or its packed block.
fn training_samples(
    task: &dyn Task,
    data: &DataSection,
    tokenizer: &Tokenizer,
    seed: u64,
    cutoff_len: usize,
    fits: &dyn Fn(&Sample) -> std::result::Result<(), String>,
) -> Result<TrainingData> {
    match data {
        DataSection::Mixture(mixture) => {
            let (preset, budget) = mixture_of(mixture)?;
            if !(budget.is_finite() && budget > 0.0) {
                return Err(Error::InvalidInput(format!("[data] tokens must be a positive number of tokens (got {budget})")));
            }
            let (samples, report) = pretrain_samples(task, &mixture.root, &preset, budget, tokenizer, cutoff_len, seed, mixture.neat_packing)?;
            for (i, block) in samples.iter().enumerate() {
                block.iter().try_for_each(fits).map_err(|e| Error::data(&mixture.root, None, format!("packed block {} {e}", i + 1)))?;
            }
            Ok(TrainingData { samples, heldout: Vec::new(), report: json!({ "mixture": report }), edits: hf::CompanionEdits::default() })
        }
        DataSection::Sft(sft) => {
            let (format, edits) = ChatFormat::for_sft(sft.chat_template.as_ref(), sft.system_prompt.as_deref(), sft.eos_token.as_deref(), tokenizer)?;
            let split = sft.heldout.map(|heldout| SplitRule { key: sft.split_key.clone().unwrap_or_else(|| "id".into()), heldout });
            let rows = read_sft_rows(&SftSource { path: sft.path.clone(), columns: sft.columns.clone(), split })?;
            let (samples, report) = render_examples(&rows.train, tokenizer, &format, sft.max_length)?;
            if report.targets == 0 {
                // Every loss would be 0 / 0, taken as 0: the run would train nothing and succeed.
                return Err(Error::data(&sft.path, None, format!(
                    "none of the {} training rows keeps a response token within [data] max_length = {} (their prompts fill it); raise max_length",
                    report.rows,
                    sft.max_length.map_or("none".into(), |m| m.to_string())
                )));
            }
            let (heldout, _) = render_examples(&rows.heldout, tokenizer, &format, sft.max_length)?;
            for (sample, row) in samples.iter().zip(&rows.train).chain(heldout.iter().zip(&rows.heldout)) {
                fits(sample).map_err(|e| row.error(format!("the row {e}")))?;
            }
            let samples = match sft.neat_packing {
                true => first_fit_decreasing(samples, |s| s.ids.len(), cutoff_len),
                false => samples.into_iter().map(|s| vec![s]).collect(),
            };
            let report = json!({ "sft": report, "source": rows.report, "bins": samples.len() });
            Ok(TrainingData { samples, heldout, report, edits })
        }
        DataSection::Prompts(_) => Err(Error::InvalidInput("[data] kind = \"prompts\" is for `kiln rl` and `kiln opd`".into())),
    }
}

/// The PRESET mixture and its token budget.
pub(crate) fn mixture_of(data: &MixtureData) -> Result<(Preset, f64)> {
    let typo = match data.typo {
        Typo::Reproduce => TypoPolicy::Reproduce,
        Typo::Fix => TypoPolicy::Fix,
    };
    let preset = match (&data.preset, &data.setting, &data.ops, &data.probs) {
        (Some(path), Some(setting), None, None) => Preset::load(path, &data.task, setting, typo)?,
        (None, None, Some(ops), Some(probs)) if ops.len() == probs.len() && !ops.is_empty() => {
            Preset { name: "inline".into(), ops: ops.clone(), probs: probs.clone() }
        }
        _ => {
            return Err(Error::InvalidInput(
                "[data] a mixture needs `preset` + `setting`, or `ops` + `probs` of equal length".into(),
            ));
        }
    };
    let budget = match &data.tokens {
        Some(TokenCount::Number(n)) => *n,
        Some(TokenCount::Text(t)) => readable_to_number(t).ok_or_else(|| Error::InvalidInput(format!("[data] tokens: cannot read {t:?}")))?,
        None => return Err(Error::InvalidInput("[data] a mixture needs `tokens` (its token budget)".into())),
    };
    // An empty mixture would reach the trainer as "no samples", blaming nothing in particular.
    if preset.probs.iter().any(|p| !(p.is_finite() && *p >= 0.0)) || !preset.probs.iter().any(|&p| p > 0.0) {
        return Err(Error::InvalidInput(format!("[data] the mixture's probs must be finite, at least 0 and not all 0 (got {:?})", preset.probs)));
    }
    Ok((preset, budget))
}

#[cfg(all(test, feature = "code"))]
mod tests {
    use super::*;
    use crate::data::sft_source::SftColumns;

    fn fixtures() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/code")
    }

    const PARQUET_SFT: &str = r#"
[model]
from = "model"
[data]
kind = "sft"
path = "cots_mini/train-*.parquet"
columns = { prompt = "prompt", completion = "generation" }
heldout = 2
max_length = 4096
[train]
steps = 1
micro_batch = 1
[optimizer]
lr = 1e-5
[output]
dir = "out"
"#;

    #[test]
    fn an_sft_config_reads_parquet_with_named_columns_and_reports_the_split() {
        let config = RunConfig::from_toml(&fixtures().join("run.toml"), PARQUET_SFT).unwrap();
        let DataSection::Sft(sft) = &config.data else { panic!("{:?}", config.data) };
        assert_eq!(sft.path, fixtures().join("cots_mini/train-*.parquet"));
        let pc = SftColumns { prompt: Some("prompt".into()), completion: Some("generation".into()), ..Default::default() };
        assert_eq!((sft.columns.as_ref(), sft.heldout), (Some(&pc), Some(2)));
        let corpus = (0..100).map(|i| format!("def f{i}(x):\n    return x * {i}\nthink about the problem {i}"));
        let tokenizer = Tokenizer::train_byte_level_bpe(corpus, 300, &["<|endoftext|>", "<|im_start|>", "<|im_end|>"]).unwrap();
        let task = config.task.build().unwrap();
        let TrainingData { samples: train, heldout, report, .. } = training_samples(task.as_ref(), &config.data, &tokenizer, 0, 4096, &|_| Ok(())).unwrap();
        assert_eq!((train.len(), heldout.len()), (3, 2));
        assert_eq!((report["source"]["train"].as_u64(), report["source"]["heldout"].as_u64()), (Some(3), Some(2)));
        assert_eq!((report["sft"]["rows"].as_u64(), report["sft"]["max_length"].as_u64()), (Some(3), Some(4096)));
        assert!(report["source"]["split"].as_str().unwrap().contains("sha256(id)"));
        assert_eq!(report["sft"]["no_targets"].as_u64(), Some(0));
        // A max_length that the prompts fill leaves no response token: refused, not a run that
        // trains nothing (every loss 0 / 0, taken as 0) and succeeds.
        let short = RunConfig::from_toml(&fixtures().join("run.toml"), &PARQUET_SFT.replace("max_length = 4096", "max_length = 4")).unwrap();
        let err = training_samples(task.as_ref(), &short.data, &tokenizer, 0, 4096, &|_| Ok(())).unwrap_err().to_string();
        assert!(err.contains("none of the 3 training rows keeps a response token within [data] max_length = 4"), "{err}");

        // Columns are never guessed for Parquet.
        let unnamed = PARQUET_SFT.replace("columns = { prompt = \"prompt\", completion = \"generation\" }\n", "");
        let config = RunConfig::from_toml(&fixtures().join("run.toml"), &unnamed).unwrap();
        let err = training_samples(task.as_ref(), &config.data, &tokenizer, 0, 4096, &|_| Ok(())).unwrap_err().to_string();
        assert!(err.contains("columns named"), "{err}");
        let err = RunConfig::from_toml(&fixtures().join("run.toml"), &PARQUET_SFT.replace("heldout", "held")).unwrap_err().to_string();
        assert!(err.contains("unknown field `held`"), "{err}");
    }

    /// `[data] chat_template`: by default the tokenizer's own template (TRL renders with it),
    /// ChatML with `"chatml"` or `system_prompt = ""` (how configs before the key rendered), a
    /// model directory relative to the config; `""` with a named template is refused at its line.
    #[cfg(feature = "code")]
    #[test]
    fn sft_rows_render_with_the_tokenizer_s_own_chat_template_unless_told_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = (0..100).map(|i| format!("def f{i}(x):\n    return x * {i}\nthink about the problem {i}"));
        Tokenizer::train_byte_level_bpe(corpus, 300, &["<|endoftext|>", "<|im_start|>", "<|im_end|>"]).unwrap().save(dir.path()).unwrap();
        std::fs::copy(fixtures().join("sft_templates/deepseek_r1_distill_training.jinja"), dir.path().join("chat_template.jinja")).unwrap();
        let tokenizer = Tokenizer::from_file(dir.path()).unwrap();
        let config = |extra: &str| RunConfig::from_toml(&fixtures().join("run.toml"), &PARQUET_SFT.replace("heldout = 2\n", &format!("heldout = 2\n{extra}\n")));
        let rendered = |extra: &str| {
            let config = config(extra).unwrap();
            let TrainingData { samples: train, report, .. } = training_samples(config.task.build().unwrap().as_ref(), &config.data, &tokenizer, 0, 4096, &|_| Ok(())).unwrap();
            (report["sft"]["chat_template"].as_str().unwrap().to_owned(), tokenizer.decode(&train[0][0].ids, false).unwrap())
        };
        let (name, text) = rendered("");
        assert!(name.ends_with("chat_template.jinja") && text.contains("<｜User｜>") && !text.contains("<|im_start|>"), "{name}: {text}");
        for chatml in ["chat_template = \"chatml\"", "system_prompt = \"\""] {
            let (name, text) = rendered(chatml);
            assert!(name == "chatml" && text.starts_with("<|im_start|>"), "{chatml}: {name}");
        }
        // Qwen2.5's template is ChatML (the same text, without Jinja).
        let (name, text) = rendered("chat_template = \"qwen2_5\"");
        assert!(name == "chatml" && text.contains("You are Qwen"), "{name}");
        let err = config("chat_template = \"qwen2_5\"\nsystem_prompt = \"\"").unwrap_err().to_string();
        assert!(err.contains("run.toml") && err.contains("system_prompt = \"\" (no system turn) renders in ChatML"), "{err}");
    }

    /// A mixture that selects nothing is refused naming the key, not left to the trainer's
    /// "training needs samples".
    #[test]
    fn an_empty_mixture_is_refused() {
        let text = "[model]\nfrom = \"m\"\n[data]\nkind = \"mixture\"\nroot = \"d\"\nops = [1, 2]\nprobs = [0.0, 0.0]\ntokens = 1000\n[train]\nsteps = 1\nmicro_batch = 1\n[optimizer]\nlr = 1e-3\n[output]\ndir = \"o\"\n";
        let mixture = |text: &str| match RunConfig::from_toml(Path::new("/work/run.toml"), text).unwrap().data {
            DataSection::Mixture(m) => mixture_of(&m).map(|_| ()).unwrap_err().to_string(),
            other => panic!("{other:?}"),
        };
        assert!(mixture(text).contains("[data] the mixture's probs must be finite, at least 0 and not all 0"));
        let zero = RunConfig::from_toml(Path::new("/work/run.toml"), &text.replace("probs = [0.0, 0.0]\ntokens = 1000", "probs = [0.5, 0.5]\ntokens = 0")).unwrap();
        let tokenizer = Tokenizer::train_byte_level_bpe(["a b c"].into_iter().map(String::from), 260, &["<|endoftext|>"]).unwrap();
        let err = training_samples(zero.task.build().unwrap().as_ref(), &zero.data, &tokenizer, 0, 64, &|_| Ok(())).unwrap_err().to_string();
        assert!(err.contains("[data] tokens must be a positive number"), "{err}");
    }

    #[test]
    fn the_codeforces_cots_example_config_reads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/configs/sft_codeforces_cots.toml");
        let config = RunConfig::from_toml(&path, &std::fs::read_to_string(&path).unwrap()).unwrap();
        let DataSection::Sft(sft) = &config.data else { panic!("{:?}", config.data) };
        assert!(sft.path.ends_with("codeforces-cots/data/solutions_py_decontaminated/train-*.parquet"));
        assert_eq!((sft.columns.as_ref().and_then(|c| c.completion.as_deref()), sft.heldout), (Some("generation"), Some(128)));
        assert_eq!((config.train.micro_batch, config.train.grad_accum, config.eval.every), (1, 18, Some(20)));
        let schedule = config.schedule.build(config.optimizer.lr, 120).unwrap();
        assert_eq!((schedule.warmup_steps, schedule.lr(config.optimizer.lr, 119)), (4, 1e-6));
    }

    #[test]
    fn the_first_spellings_of_the_sft_keys_still_read() {
        let old = PARQUET_SFT
            .replace("kind = \"sft\"\npath", "sft")
            .replace("columns =", "sft_columns =")
            .replace("heldout = 2", "sft_heldout = 2\nsft_split_key = \"id\"");
        let old = RunConfig::from_toml(&fixtures().join("run.toml"), &old).unwrap();
        let mut new = RunConfig::from_toml(&fixtures().join("run.toml"), PARQUET_SFT).unwrap();
        if let DataSection::Sft(sft) = &mut new.data {
            sft.split_key = Some("id".into());
        }
        assert_eq!(old, new);
    }
}
