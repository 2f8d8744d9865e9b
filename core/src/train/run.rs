//! `kiln pretrain` and `kiln sft`: a [`RunConfig`] run with the next-token loss — the model to
//! start from, the data (a mixture of the task's rows, or chat rows), the optimizer and
//! schedule, saving and held-out evaluation. The config schema is the one of every run
//! ([`super::config`]).

use std::path::Path;
use std::time::Duration;

use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::config::{
    DataSection, Defaults, EvalSection, Family, MixtureData, ModelSection, OptimizerSection, OutputSection, ScheduleSection,
    TrainSection, TokenCount, Typo, base_dir, read_config, resolve_shared,
};
use super::heldout::HeldOut;
use super::objective::NextTokenLoss;
use super::trainer::{LoopConfig, Record, RunSummary, Start, train};
use crate::data::Sample;
use crate::data::chat::{QWEN_DEFAULT_SYSTEM, sft_samples};
use crate::data::corpus::pretrain_samples;
use crate::data::mixture::{Preset, TypoPolicy, readable_to_number};
use crate::error::{Error, Result};
use crate::model::{Qwen2, Qwen2Config, hf};
use crate::tasks::{Task, TaskConfig};
use crate::tokenizer::Tokenizer;

/// A pre-training or SFT run (see [`super::config`] for the sections).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub model: ModelSection,
    /// The task of the mixture's rows and of the held-out evaluation (Interplay if absent).
    #[serde(default)]
    pub task: TaskConfig,
    /// `kind = "mixture"` (`kiln pretrain`) or `"sft"` (`kiln sft`).
    pub data: DataSection,
    #[serde(default)]
    pub train: TrainSection,
    #[serde(default)]
    pub optimizer: OptimizerSection,
    #[serde(default)]
    pub schedule: ScheduleSection,
    pub output: OutputSection,
    #[serde(default)]
    pub eval: EvalSection,
}

/// Batches and seed when a config leaves them out.
const GRAD_ACCUM: usize = 1;
const SEED: u64 = 42;

impl RunConfig {
    /// Reads a TOML run config (old forms included, [`super::config::legacy`]); relative paths
    /// become relative to its directory. Inconsistent settings are errors naming the file.
    pub fn from_toml(path: &Path, text: &str) -> Result<Self> {
        let mut config: RunConfig = read_config(path, text, Family::NextToken)?;
        resolve_shared(base_dir(path), &mut config.model, &mut config.data, &mut config.output, &mut config.eval);
        config.check().map_err(|message| Error::config(path, message))?;
        Ok(config)
    }

    /// Settings that cannot work together.
    pub fn check(&self) -> std::result::Result<(), String> {
        let (d, t) = (Defaults::NEXT_TOKEN, &self.train);
        if let DataSection::Prompts(_) = self.data {
            return Err("[data] kind = \"prompts\" is for `kiln rl` and `kiln opd`; pretrain takes \"mixture\", sft \"sft\"".into());
        }
        if self.model.dtype.is_some() {
            return Err("[model] dtype is for rl and opd (rollouts, reference, teacher); training precision is [train] precision".into());
        }
        if self.model.init.is_some() == self.model.from.is_some() {
            return Err("[model] needs exactly one of `init` (a config.json) or `from` (a model directory)".into());
        }
        for (key, given) in [("prompts_per_step", t.prompts_per_step.is_some()), ("mini_batch", t.mini_batch.is_some())] {
            if given {
                return Err(format!("[train] {key} is for `kiln rl` and `kiln opd`"));
            }
        }
        if self.micro_batch()? == 0 || t.grad_accum == Some(0) {
            return Err("[train] micro_batch and grad_accum must be positive".into());
        }
        t.total_steps(|_| 0)?;
        let lr = self.optimizer.lr(&d)?;
        self.schedule.build(&d, lr, 1)?;
        Ok(())
    }

    /// Sequences per micro-batch.
    fn micro_batch(&self) -> std::result::Result<usize, String> {
        self.train.micro_batch.or(Defaults::NEXT_TOKEN.micro_batch).ok_or_else(|| "[train] needs `micro_batch`".into())
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
    config.check().map_err(Error::InvalidInput)?;
    let d = Defaults::NEXT_TOKEN;
    let tokenizer_dir = tokenizer_dir(&config.model)?;
    let tokenizer = Tokenizer::from_file(&tokenizer_dir)?;
    let pad_id = tokenizer.pad_id().or_else(|| tokenizer.eos_id()).unwrap_or(0);
    let task = config.task.build()?;
    let t = &config.train;
    let seed = t.seed.unwrap_or(SEED);
    let (samples, data_report) = training_samples(task.as_ref(), &config.data, &tokenizer, seed)?;

    let (micro_batch, grad_accum) = (config.micro_batch().map_err(Error::InvalidInput)?, t.grad_accum.unwrap_or(GRAD_ACCUM));
    let samples_per_step = micro_batch * grad_accum;
    let total_steps = t
        .total_steps(|epochs| ((samples.len() as f64 * epochs) / samples_per_step as f64).ceil() as u64)
        .map_err(Error::InvalidInput)?;
    on_data(&json!({ "data": data_report, "samples": samples.len(), "total_steps": total_steps }));
    let mut loop_config = loop_config(
        &d,
        Sections { optimizer: &config.optimizer, schedule: &config.schedule, output: &config.output },
        total_steps,
        config.eval.every,
        Some(tokenizer_dir.clone()),
        json!({ "config": config, "data": data_report, "samples": samples.len() }),
    )
    .map_err(Error::InvalidInput)?;
    loop_config.precision = t.precision;
    let mut objective = NextTokenLoss::new(samples, micro_batch, grad_accum, pad_id, seed)?;
    let start = Start::<B>::new(&loop_config, resume, &mut objective, device, || fresh_model(&config.model, device))?;
    let mut held_out = HeldOut::load(task, &config.eval, config.cutoff_len(), &tokenizer, pad_id)?;
    let (_, summary) = train(start, &mut objective, &loop_config, |model| held_out.evaluate(model), on_record)?;
    Ok(summary)
}

/// The sections every run builds its loop from.
#[derive(Debug, Clone, Copy)]
pub struct Sections<'a> {
    pub optimizer: &'a OptimizerSection,
    pub schedule: &'a ScheduleSection,
    pub output: &'a OutputSection,
}

/// The loop settings of a run of `total_steps` updates: the schedule and optimizer, saving, the
/// evaluation cadence and the time budget; `companions` (the tokenizer directory) are copied
/// into every checkpoint, and `run_config` recorded in it.
pub fn loop_config(
    defaults: &Defaults,
    sections: Sections<'_>,
    total_steps: u64,
    eval_every: Option<u64>,
    companions: Option<std::path::PathBuf>,
    run_config: Value,
) -> std::result::Result<LoopConfig, String> {
    let Sections { optimizer, schedule, output } = sections;
    let lr = optimizer.lr(defaults)?;
    Ok(LoopConfig {
        total_steps,
        schedule: schedule.build(defaults, lr, total_steps)?,
        optimizer: optimizer.adamw(defaults),
        out_dir: output.dir.clone(),
        save: output.save_policy(defaults),
        eval_every,
        time_budget: output.time_budget_s.map(Duration::from_secs_f64),
        companions,
        run_config,
        precision: Default::default(),
    })
}

fn fresh_model<B: Backend>(model: &ModelSection, device: &B::Device) -> Result<Qwen2<B>> {
    match (&model.init, &model.from) {
        (Some(init), None) => Qwen2::random(&Qwen2Config::from_file(init)?, model.seed, device),
        (None, Some(from)) => hf::load(from, device),
        _ => Err(Error::InvalidInput("[model] needs exactly one of `init` or `from`".into())),
    }
}

fn training_samples(task: &dyn Task, data: &DataSection, tokenizer: &Tokenizer, seed: u64) -> Result<(Vec<Sample>, Value)> {
    match data {
        DataSection::Mixture(mixture) => {
            let (preset, budget) = mixture_of(mixture)?;
            let (samples, report) = pretrain_samples(task, &mixture.root, &preset, budget, tokenizer, mixture.cutoff_len, seed)?;
            Ok((samples, json!({ "mixture": report })))
        }
        DataSection::Sft(sft) => {
            let system = match sft.system_prompt.as_deref() {
                None => Some(QWEN_DEFAULT_SYSTEM),
                Some("") => None,
                Some(s) => Some(s),
            };
            let (samples, report) = sft_samples(&sft.path, tokenizer, system, sft.max_length)?;
            Ok((samples, json!({ "sft": report })))
        }
        DataSection::Prompts(_) => Err(Error::InvalidInput("[data] kind = \"prompts\" is for `kiln rl` and `kiln opd`".into())),
    }
}

/// The PRESET mixture and its token budget.
fn mixture_of(data: &MixtureData) -> Result<(Preset, f64)> {
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
    Ok((preset, budget))
}
