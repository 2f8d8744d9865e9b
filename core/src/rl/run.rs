//! Runs a [`PgConfig`] (`kiln rl`, `kiln opd`) with the training loop: the policy starts from
//! `[model] from`, which also serves as the frozen reference; checkpoints are HF directories
//! named like the release (`rl/op11_14_step20`) and resumable.

use std::path::Path;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use serde_json::{Value, json};

use super::config::PgConfig;
use super::objective::{PolicyGradient, Signal};
use super::prompts::PromptSet;
use super::validate::{ValidationSettings, Validator};
use crate::dist::{NodeSpec, Replica};
use crate::error::{Error, Result};
use crate::generate::model_eos_ids;
use crate::model::{Dtype, Qwen2, Qwen2Config, hf};
use crate::tokenizer::Tokenizer;
use crate::train::checkpoint::{RunRecord, data_fingerprint};
use crate::train::launch::{self, Prepared};
use crate::train::run::{Sections, loop_config};
use crate::train::trainer::{Record, RunSummary};

/// Which method a config is run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GRPO with a verifiable reward (`[reward]`, outcome by default; no `[teacher]`).
    Grpo,
    /// On-policy distillation from `[teacher]` (no `[reward]`).
    Opd,
}

/// Written into the output directory at each start when the task grades under an environment
/// ([`crate::tasks::Task::environment`]: a code task's sandbox layers).
pub const ENVIRONMENT_FILE: &str = "environment.json";

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
    run_replicated::<B>(config, method, std::slice::from_ref(device), None, resume, on_data, on_record)
}

/// [`run`] data-parallel: one replica per device of `devices`, and with `nodes` one process per
/// node (see [`crate::dist`]); each replica rolls out its share of every step's prompts, and
/// rank 0 reports, validates and writes the checkpoints.
pub fn run_replicated<B: AutodiffBackend>(
    config: &PgConfig,
    method: Method,
    devices: &[B::Device],
    nodes: Option<&NodeSpec>,
    resume: bool,
    on_data: impl FnOnce(&Value),
    on_record: impl FnMut(&Record),
) -> Result<RunSummary> {
    let family = format!("{method:?}");
    launch::replicated::<B, _, _>(&family, config, &config.output, devices, nodes, resume, on_data, on_record, |config, replica, device| {
        prepare::<B>(config, method, replica, device)
    })
}

/// One replica of a GRPO or OPD run: its prompts, reward or teacher, reference and validation.
fn prepare<'a, B: AutodiffBackend>(
    config: &'a PgConfig,
    method: Method,
    replica: &Replica,
    device: &'a B::Device,
) -> Result<Prepared<'a, B, PolicyGradient<B>>> {
    // Checked where it was read (PgConfig::from_toml / load, naming the file and line), not
    // again; only the method, which a config read without one was not checked against.
    config.check_method(method).map_err(|r| Error::InvalidInput(r.message))?;
    let from = config.from_dir().map_err(Error::InvalidInput)?;
    let data = config.prompts().map_err(Error::InvalidInput)?;
    let tokenizer_dir = config.model.tokenizer.clone().unwrap_or_else(|| from.to_path_buf());
    let tokenizer = Tokenizer::from_file(&tokenizer_dir)?;
    let model_config = Qwen2Config::from_file(from.join("config.json"))?;
    let eos_ids = model_eos_ids(from, &model_config, Some(&tokenizer))?;
    crate::train::run::check_pad_id(super::objective::pad_id(&tokenizer), &model_config, &from.join("config.json"))?;

    let task = config.task.build()?;
    let files = task.files(data.dir.as_deref(), &data.ops, &data.files)?;
    let prompts = PromptSet::from_task(task.as_ref(), &files, &tokenizer, data.max_prompt_length, data.rows_per_op)?;
    let settings = config.settings();
    let per_epoch = prompts.steps_per_epoch(settings.prompts_per_step);
    let total_steps = config.train.total_steps(|epochs| (per_epoch as f64 * epochs).floor() as u64).map_err(Error::InvalidInput)?;
    if total_steps == 0 {
        return Err(Error::InvalidInput(format!(
            "[train] epochs = {} makes no step: an epoch is {per_epoch} steps of {} prompts",
            config.train.epochs.unwrap_or_default(),
            settings.prompts_per_step
        )));
    }
    let environment = task.environment();
    let report = json!({
        "prompts": prompts.report, "steps_per_epoch": per_epoch, "total_steps": total_steps,
        "environment": environment.as_ref().map(|e| e.summary.clone()),
    });

    let frozen_dtype = config.model.dtype.unwrap_or_default();
    let signal = match (&config.reward, &config.teacher) {
        (_, Some(teacher)) => {
            check_same_tokenizer(&tokenizer_dir, &teacher.path)?;
            // The teacher scores whole rollouts: positions past its context have no rotary angle.
            // (Read from its config.json before its weights are loaded.)
            let teacher_config = teacher.path.join("config.json");
            let teacher_model = Qwen2Config::from_file(&teacher_config)?;
            // The student samples from all its vocab_size logits (padding rows included, as vLLM
            // does); the teacher embeds and scores those ids.
            if teacher_model.vocab_size < model_config.vocab_size {
                return Err(Error::config(teacher_config, format!(
                    "the teacher's vocab_size ({}) is smaller than the student's ({}): the student can sample ids the teacher has no embedding for",
                    teacher_model.vocab_size, model_config.vocab_size
                )));
            }
            let context = teacher_model.max_position_embeddings;
            let longest = data.max_prompt_length.saturating_add(settings.rollout.max_response_length).min(model_config.max_position_embeddings);
            if context < longest {
                return Err(Error::config(teacher_config, format!(
                    "the teacher's context ({context} positions, max_position_embeddings) is shorter than the rollouts it scores (up to {longest}: max_prompt_length + max_response_length, within the student's context)"
                )));
            }
            let model = Box::new(frozen::<B>(&teacher.path, device, frozen_dtype)?);
            Signal::Teacher { model, coef: teacher.coef, full_vocab: teacher.full_vocab }
        }
        (reward, None) => Signal::Rewards {
            reward: task.reward(&reward.clone().unwrap_or_default())?,
            estimator: config.loss.adv_estimator,
            scaling: config.loss.reward_scaling,
            epsilon: config.loss.epsilon,
        },
    };
    let reference = match settings.kl {
        Some(_) => Some(frozen::<B>(from, device, frozen_dtype)?),
        None => None,
    };
    let eval_every = config.eval.as_ref().map(|e| e.every);
    let mut loop_config = loop_config(
        Sections { optimizer: &config.optimizer, schedule: &config.schedule, output: &config.output },
        total_steps,
        eval_every,
        Some(tokenizer_dir.clone()),
        json!({ "config": config, "prompts": prompts.report, RunRecord::DATA: prompts_fingerprint(&prompts) }),
    )
    .map_err(Error::InvalidInput)?;
    loop_config.eval_steps = config.eval.as_ref().map(|e| e.steps.clone()).unwrap_or_default();
    loop_config.precision = config.train.precision;
    loop_config.shard_optimizer = config.train.shard_optimizer;
    loop_config.grad_reduce_dtype = config.train.grad_reduce_dtype;
    loop_config.overlap_grad_reduce = config.train.overlap_grad_reduce;
    let validator = match &config.eval {
        Some(eval) if replica.is_main() => {
            let dir = eval.rows.as_path();
            let validation = ValidationSettings {
                id_max_level: eval.id_max_op.map(i64::from),
                rows_per_op: eval.rows_per_op,
                max_prompt_length: data.max_prompt_length,
                max_new_tokens: eval.max_new_tokens.unwrap_or(settings.rollout.max_response_length),
                batch_size: settings.rollout.batch_size,
                kv_memory: settings.rollout.kv_memory,
                max_prefill_tokens: settings.rollout.max_prefill_tokens,
            };
            let files = task.files(Some(dir), &eval.ops, &[])?;
            Some(Validator::from_files(task.clone(), &files, &tokenizer, eos_ids.clone(), &validation)?)
        }
        _ => None,
    };
    let out_dir = loop_config.out_dir.clone();
    let objective = PolicyGradient::<B>::new(settings, prompts, signal, reference, tokenizer, eos_ids)?.shard(replica.rank(), replica.world())?;
    Ok(Prepared {
        loop_config,
        objective,
        fresh: Box::new(move || hf::load::<B>(from, device)),
        evaluate: Box::new(move |model| match &validator {
            Some(v) => v.evaluate(model),
            None => Ok(Record::new()),
        }),
        // What rewards were graded under (the sandbox's layers), as of this start.
        started: Box::new(move || {
            if let Some(e) = environment {
                crate::io::write_atomic(&out_dir.join(ENVIRONMENT_FILE), &format!("{:#}\n", e.record))?;
            }
            Ok(report)
        }),
    })
}

/// A frozen model (reference or teacher) in the learner's weight layout, without gradients.
fn frozen<B: AutodiffBackend>(dir: &Path, device: &B::Device, dtype: Dtype) -> Result<Qwen2<B::InnerBackend>> {
    Ok(hf::load_as::<B>(dir, device, dtype)?.valid())
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

/// [`data_fingerprint`] of the prompts a run trains on: their ids and what judges their
/// responses (each item's gold).
fn prompts_fingerprint(prompts: &PromptSet) -> String {
    data_fingerprint(prompts.iter().map(|p| {
        let gold = p.item.gold.to_string().into_bytes();
        p.ids.iter().map(|&id| u64::from(id)).chain(gold.into_iter().map(u64::from))
    }))
}
