//! Runs a [`PgConfig`] (`kiln rl`, `kiln opd`) with the training loop: the policy starts from
//! `[model] from`, which also serves as the frozen reference; checkpoints are HF directories
//! named like the release (`rl/op11_14_step20`) and resumable.

use std::path::Path;
use std::time::Duration;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use serde_json::{Value, json};

use super::config::PgConfig;
use super::objective::{PolicyGradient, Signal};
use super::prompts::{PromptSet, op_files};
use super::validate::{ValidationSettings, Validator};
use crate::error::{Error, Result};
use crate::generate::model_eos_ids;
use crate::model::{Qwen2, Qwen2Config, hf};
use crate::io::jsonl_files;
use crate::tokenizer::Tokenizer;
use crate::train::schedule::{Decay, Schedule};
use crate::train::trainer::{LoopConfig, Record, RunSummary, SavePolicy, Start, train};
use crate::train::AdamWConfig;

/// Which method a config is run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GRPO with a verifiable reward (`[reward]`, outcome by default; no `[teacher]`).
    Grpo,
    /// On-policy distillation from `[teacher]` (no `[reward]`).
    Opd,
}

/// Runs `config` as `method` on `device`; `resume` continues from the latest checkpoint of the
/// run. `on_data` sees the prompt report and step count before training, `on_record` every
/// metrics record.
pub fn run<B: AutodiffBackend>(
    config: &PgConfig,
    method: Method,
    device: &B::Device,
    resume: bool,
    on_data: impl FnOnce(&Value),
    on_record: impl FnMut(&Record),
) -> Result<RunSummary> {
    match (method, config.reward.is_some(), config.teacher.is_some()) {
        (Method::Grpo, _, false) | (Method::Opd, false, true) => {}
        (Method::Grpo, _, true) => return Err(Error::InvalidInput("GRPO takes a [reward], not a [teacher] (use `kiln opd`)".into())),
        (Method::Opd, _, false) => return Err(Error::InvalidInput("on-policy distillation needs a [teacher] section".into())),
        (Method::Opd, true, true) => return Err(Error::InvalidInput("on-policy distillation takes no [reward]".into())),
    }
    let from = &config.model.from;
    let tokenizer_dir = config.model.tokenizer.clone().unwrap_or_else(|| from.clone());
    let tokenizer = Tokenizer::from_file(&tokenizer_dir)?;
    let eos_ids = model_eos_ids(from, &Qwen2Config::from_file(from.join("config.json"))?, Some(&tokenizer))?;

    let task = config.task.build()?;
    let files = match (&config.data.dir, config.data.ops.is_empty()) {
        (Some(dir), false) => op_files(dir, &config.data.ops)?,
        (Some(dir), true) => jsonl_files(dir)?,
        (None, _) => config.data.files.clone(),
    };
    let prompts = PromptSet::from_task(task.as_ref(), &files, &tokenizer, config.data.max_prompt_length, config.data.rows_per_op)?;
    let settings = config.settings();
    let t = &config.train;
    let per_epoch = prompts.steps_per_epoch(settings.prompts_per_step);
    let total_steps = match (t.steps, t.epochs) {
        (Some(steps), _) => steps,
        (None, Some(epochs)) => (per_epoch as f64 * epochs).floor() as u64,
        (None, None) => return Err(Error::InvalidInput("[train] needs `steps` or `epochs`".into())),
    };
    on_data(&json!({ "prompts": prompts.report, "steps_per_epoch": per_epoch, "total_steps": total_steps }));

    let signal = match (&config.reward, &config.teacher) {
        (_, Some(teacher)) => {
            check_same_tokenizer(&tokenizer_dir, &teacher.path)?;
            Signal::Teacher { model: Box::new(frozen::<B>(&teacher.path, device)?), coef: teacher.coef, full_vocab: teacher.full_vocab }
        }
        (reward, None) => Signal::Rewards {
            reward: task.reward(&reward.clone().unwrap_or_default())?,
            scaling: config.loss.reward_scaling,
            epsilon: config.loss.epsilon,
        },
    };
    let reference = match settings.kl {
        Some(_) => Some(frozen::<B>(from, device)?),
        None => None,
    };
    let warmup_steps = Schedule::warmup_from_ratio(total_steps, t.warmup_ratio);
    let decay = match t.schedule.as_str() {
        "cosine" => Decay::CosineWithMinLr { min_lr_rate: t.min_lr_ratio },
        _ => Decay::Constant,
    };
    let loop_config = LoopConfig {
        total_steps,
        schedule: Schedule { base_lr: t.lr, warmup_steps, total_steps, decay },
        optimizer: AdamWConfig { beta1: t.beta1, beta2: t.beta2, eps: t.eps, weight_decay: t.weight_decay, max_grad_norm: Some(t.max_grad_norm) },
        out_dir: config.output.dir.clone(),
        save: SavePolicy { every: Some(config.output.save_freq as f64), run_name: config.output.name.clone(), ..Default::default() },
        eval_every: config.validation.as_ref().map(|v| v.every),
        time_budget: config.output.time_budget_s.map(Duration::from_secs_f64),
        companions: Some(tokenizer_dir.clone()),
        run_config: json!({ "config": config, "prompts": prompts.report }),
    };
    let validator = match &config.validation {
        Some(v) => {
            let validation = ValidationSettings {
                id_max_op: v.id_max_op,
                rows_per_op: v.rows_per_op,
                max_prompt_length: config.data.max_prompt_length,
                max_new_tokens: v.max_new_tokens.unwrap_or(settings.rollout.max_response_length),
                batch_size: settings.rollout.batch_size,
            };
            Some(Validator::from_task(task.clone(), &v.dir, &tokenizer, eos_ids.clone(), &validation)?)
        }
        None => None,
    };
    let mut objective = PolicyGradient::<B>::new(settings, prompts, signal, reference, tokenizer, eos_ids)?;
    let start = Start::<B>::new(&loop_config, resume, &mut objective, device, || hf::load::<B>(from, device))?;
    let evaluate = |model: &Qwen2<B::InnerBackend>| match &validator {
        Some(v) => v.evaluate(model),
        None => Ok(Record::new()),
    };
    let (_, summary) = train(start, &mut objective, &loop_config, evaluate, on_record)?;
    Ok(summary)
}

/// A frozen model (reference or teacher) in the learner's weight layout, without gradients.
fn frozen<B: AutodiffBackend>(dir: &Path, device: &B::Device) -> Result<Qwen2<B::InnerBackend>> {
    Ok(hf::load::<B>(dir, device)?.valid())
}

/// Refuses a teacher whose tokenizer differs from the student's: OPD feeds the student's token
/// ids to the teacher, so a different vocabulary would score the wrong tokens (TRL #4562).
pub fn check_same_tokenizer(student: &Path, teacher: &Path) -> Result<()> {
    let vocab = |dir: &Path| -> Result<std::collections::HashMap<String, u32>> {
        let file = dir.join("tokenizer.json");
        if !file.is_file() {
            return Err(Error::Tokenizer {
                path: file,
                message: "the teacher needs its tokenizer files to prove it shares the student's tokenizer".into(),
            });
        }
        let tokenizer = tokenizers::Tokenizer::from_file(&file).map_err(|e| Error::Tokenizer { path: file.clone(), message: e.to_string() })?;
        Ok(tokenizer.get_vocab(true))
    };
    let (ours, theirs) = (vocab(student)?, vocab(teacher)?);
    if ours != theirs {
        let differing = ours.iter().filter(|(token, id)| theirs.get(*token) != Some(id)).count() + theirs.len().saturating_sub(ours.len());
        return Err(Error::Tokenizer {
            path: teacher.join("tokenizer.json"),
            message: format!(
                "the teacher's tokenizer differs from the student's ({} vs {} tokens, {differing} differing); \
                 on-policy distillation scores the student's token ids with the teacher, so both must share one tokenizer",
                theirs.len(),
                ours.len()
            ),
        });
    }
    let (student_eos, teacher_eos) = (Tokenizer::from_file(student)?.eos_id(), Tokenizer::from_file(teacher)?.eos_id());
    if student_eos != teacher_eos {
        return Err(Error::Tokenizer {
            path: teacher.join("tokenizer.json"),
            message: format!("the teacher's EOS token ({teacher_eos:?}) differs from the student's ({student_eos:?})"),
        });
    }
    Ok(())
}
