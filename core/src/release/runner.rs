//! Runs a [`Plan`]: its stages in order, each resumable.
//!
//! - **data**: the scale's model directory and the `[data]` splits (`kiln data interplay`),
//!   each made once (a split whose files exist is kept);
//! - **pretrain**, **rl**, **opd**: every run of the stage, batch by batch. A run whose last
//!   checkpoint is in place is finished and skipped; otherwise it starts, or resumes from its
//!   latest checkpoint. Its effective config is written to `<batch>/configs/` and its start
//!   and end to the batch's run index ([`super::index`]). OPD's last checkpoint is then moved
//!   from `opd_refkl/sweep/` to its release name;
//! - **eval**: every batch's final models (or all checkpoints) on `<root>/data/test`, into
//!   `<batch>/evals/` (shards resume, finished models are skipped), then the release summary
//!   across batches ([`super::report`]).
//!
//! A run needs the stages before it: a missing checkpoint or data directory is an error that
//! says which stage makes it.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use serde_json::Value;

use super::index::{RunIndex, RunRecord};
use super::plan::{Plan, PlannedRun, RunKind, RunSpec, Stage};
use super::report;
use crate::error::{Error, Result};
use crate::eval::{EvalEvent, evaluate_on};
use crate::rl::Method;
use crate::tasks::interplay::dataset::write_split;
use crate::tasks::interplay::eval::{EvalData, metrics_path};
use crate::tasks::interplay::tiny_model::PAPER_TOKENIZER_FILES;
use crate::train::checkpoint::latest_named;
use crate::train::trainer::{Record, RunSummary};

/// What a release run reports while it runs.
#[derive(Debug)]
pub enum Event<'a> {
    /// A stage starts.
    Stage(Stage),
    /// A split is written (`skipped`: its files exist), with its command.
    Split { command: &'a str, skipped: bool },
    /// Rows of the split being written.
    SplitProgress { done: usize, total: usize },
    /// A run starts, fresh or from its latest checkpoint's step.
    RunStart { run: &'a PlannedRun, resumed_from: Option<u64> },
    /// A run's last checkpoint is in place.
    RunSkipped { run: &'a PlannedRun },
    /// The run's data report (prompt or mixture counts, total steps).
    RunData { run: &'a PlannedRun, data: &'a Value },
    /// A metrics record of the running run.
    RunRecord { run: &'a PlannedRun, record: &'a Record },
    RunDone { run: &'a PlannedRun, summary: &'a RunSummary },
    /// A batch's evaluation starts: models, prompts and samples per prompt.
    EvalStart { batch: &'a str, models: usize, prompts: usize, samples: usize },
    /// Every model of the batch is evaluated already.
    EvalSkipped { batch: &'a str },
    Eval { batch: &'a str, event: EvalEvent<'a> },
    /// The release summary (`<root>/summary.md`).
    Report { markdown: &'a str },
}

/// Runs `stages` of `plan` (the data stage always comes first) on `devices`: every training run
/// with one data-parallel replica per device ([`crate::train::run::run_replicated`]), the
/// evaluation with one engine per device ([`crate::eval::evaluate_on`]).
pub fn run<B: AutodiffBackend>(plan: &Plan, stages: &[Stage], devices: &[B::Device], mut on_event: impl FnMut(Event)) -> Result<()> {
    // Every RL and OPD run's step splits over the devices, checked before the first stage.
    for stage in [Stage::Rl, Stage::Opd].into_iter().filter(|s| stages.contains(s)) {
        for run in plan.runs_of(stage) {
            if let RunSpec::Pg(c) = &run.spec {
                c.check_world(devices.len()).map_err(|e| run_error(run, e))?;
            }
        }
    }
    std::fs::create_dir_all(&plan.root).map_err(|e| Error::io(&plan.root, e))?;
    on_event(Event::Stage(Stage::Data));
    data(plan, &mut on_event)?;
    for stage in [Stage::Pretrain, Stage::Rl, Stage::Opd] {
        if stages.contains(&stage) {
            on_event(Event::Stage(stage));
            for run in plan.runs_of(stage) {
                train::<B>(plan, run, devices, &mut on_event)?;
            }
        }
    }
    if stages.contains(&Stage::Eval) {
        on_event(Event::Stage(Stage::Eval));
        eval::<B>(plan, devices, &mut on_event)?;
    }
    Ok(())
}

/// The note at the top of every batch's README.
fn note(plan: &Plan) -> String {
    format!("Written by `kiln release run --config {} --scale {}`.", plan.config.display(), plan.scale)
}

fn data(plan: &Plan, on_event: &mut impl FnMut(Event)) -> Result<()> {
    if let Some((model, dir)) = &plan.model {
        write_model_dir(&model.config_json(), dir)?;
    }
    let data = plan.data_dir();
    for spec in &plan.splits {
        let (split, ops) = (spec.split().map_err(Error::InvalidInput)?, spec.op_list().map_err(Error::InvalidInput)?);
        let command = spec.command(&data, plan.seed);
        let present = spec.paths(&data).map_err(Error::InvalidInput)?.iter().all(|p| p.is_file());
        on_event(Event::Split { command: &command, skipped: present });
        if !present {
            let (mut done, total) = (0, ops.len() * spec.per_op);
            write_split(&data, split, &ops, spec.per_op, plan.seed, false, || {
                done += 1;
                if done % 100 == 0 || done == total {
                    on_event(Event::SplitProgress { done, total });
                }
            })?;
        }
    }
    Ok(())
}

/// A scale's model directory: `config` and the paper's tokenizer; kept if present.
fn write_model_dir(config: &Value, dir: &Path) -> Result<()> {
    let config_path = dir.join("config.json");
    if config_path.is_file() {
        let text = std::fs::read_to_string(&config_path).map_err(|e| Error::io(&config_path, e))?;
        let kept: Value = serde_json::from_str(&text).map_err(|e| Error::json(&config_path, None, e))?;
        // (Keys one side lacks are not compared: a config.json written by another kiln version.)
        let differ: Vec<&String> = match (kept.as_object(), config.as_object()) {
            (Some(kept), Some(now)) => now.iter().filter(|(k, v)| kept.get(*k).is_some_and(|old| old != *v)).map(|(k, _)| k).collect(),
            _ => Vec::new(),
        };
        if !differ.is_empty() {
            let keys = differ.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ");
            let message = format!(
                "holds another model than this scale's in the release config ({keys} differ): the runs here were made with it; choose another --out, or remove the directory to start over"
            );
            return Err(Error::data(&config_path, None, message));
        }
        return Ok(());
    }
    for (name, text) in PAPER_TOKENIZER_FILES {
        crate::io::write_atomic(&dir.join(name), text)?;
    }
    let text = serde_json::to_string_pretty(config).map_err(|e| Error::json(&config_path, None, e))?;
    crate::io::write_atomic(&config_path, &(text + "\n"))
}

/// A path relative to the batch directory, for the run index.
fn relative(plan: &Plan, batch: &str, path: &Path) -> String {
    let dir = plan.batch_dir(batch);
    path.strip_prefix(&dir).map_or_else(|_| path.display().to_string(), |p| p.display().to_string())
}

/// The file name of a run's effective config under `<batch>/configs/`.
fn config_file(run: &PlannedRun) -> PathBuf {
    let name = run.source.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| format!("{}.toml", run.name).into());
    PathBuf::from("configs").join(name)
}

fn needs(path: &Path, what: &str, stage: Stage) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    Err(Error::data(path, None, format!("{what} is not there yet: run the {} stage first (`--stages {}`)", stage.name(), stage.name())))
}

/// An error of `run`, named by its label and the config it comes from.
fn run_error(run: &PlannedRun, e: impl std::fmt::Display) -> Error {
    Error::InvalidInput(format!("{} ({}): {e}", run.label(), run.source.display()))
}

fn train<B: AutodiffBackend>(plan: &Plan, run: &PlannedRun, devices: &[B::Device], on_event: &mut impl FnMut(Event)) -> Result<()> {
    if run.finished() {
        on_event(Event::RunSkipped { run });
        return Ok(());
    }
    match &run.spec {
        RunSpec::Pretrain(_) => needs(&plan.data_dir().join("train"), "the pre-training shards (train/<op>/*.jsonl)", Stage::Data)?,
        RunSpec::Pg(c) => {
            needs(run.from.as_deref().unwrap_or(Path::new("")), "the run's base checkpoint", Stage::Pretrain)?;
            if let Some(teacher) = &c.teacher {
                needs(&teacher.path, "the OPD teacher", Stage::Rl)?;
            }
        }
    }
    let batch_dir = plan.batch_dir(&run.batch);
    let config = config_file(run);
    let header = format!(
        "# The effective config of `{}` in {} ({} scale), made from {}.\n# Rerun alone: kiln {} --config {} --resume\n\n",
        run.label(),
        plan.root.display(),
        plan.scale,
        run.source.display(),
        match run.kind {
            RunKind::Pretrain => "pretrain",
            RunKind::Grpo => "rl",
            RunKind::Opd => "opd",
        },
        batch_dir.join(&config).display()
    );
    // An earlier effective config that differs is kept beside it (`.prev`): the run's checkpoints
    // were made with it, and the resume below may refuse the new one.
    // (The settings after the header: the header names paths as this command spelled them.)
    let (config_path, body) = (batch_dir.join(&config), run.config_toml()?);
    if std::fs::read_to_string(&config_path).is_ok_and(|old| old.split_once("\n\n").map(|(_, b)| b) != Some(body.as_str())) {
        crate::train::checkpoint::set_aside_as(&config_path, "prev")?;
    }
    crate::io::write_atomic(&config_path, &(header + &body))?;
    let mut index = RunIndex::load(&batch_dir, &note(plan))?;
    let label = index_label(run);
    index.started(RunRecord {
        path: relative(plan, &run.batch, &run.published),
        run: label.clone(),
        config: config.display().to_string(),
        source: run.source.display().to_string(),
        model: run.model.clone(),
        from: run.from.as_ref().map(|f| relative(plan, &run.batch, f)),
        ..RunRecord::default()
    })?;

    if !run.last.join("config.json").is_file() {
        let out_dir = match &run.spec {
            RunSpec::Pretrain(c) => &c.output,
            RunSpec::Pg(c) => &c.output,
        };
        let resumed_from = latest_named(&out_dir.dir, out_dir.name.as_deref())?.map(|(step, _)| step);
        on_event(Event::RunStart { run, resumed_from });
        let summary = {
            let events = RefCell::new(&mut *on_event);
            let on_data = |data: &Value| (*events.borrow_mut())(Event::RunData { run, data });
            let on_record = |record: &Record| (*events.borrow_mut())(Event::RunRecord { run, record });
            match (&run.spec, run.kind) {
                (RunSpec::Pretrain(c), _) => crate::train::run::run_replicated::<B>(c, devices, None, true, on_data, on_record),
                (RunSpec::Pg(c), RunKind::Opd) => crate::rl::run::run_replicated::<B>(c, Method::Opd, devices, None, true, on_data, on_record),
                (RunSpec::Pg(c), _) => crate::rl::run::run_replicated::<B>(c, Method::Grpo, devices, None, true, on_data, on_record),
            }
            .map_err(|e| run_error(run, e))?
        };
        on_event(Event::RunDone { run, summary: &summary });
        if !run.last.join("config.json").is_file() {
            return Err(Error::checkpoint(&run.last, format!("{} ended at step {} without its last checkpoint", run.label(), summary.steps)));
        }
    }
    if run.published != run.last {
        if run.published.exists() {
            return Err(Error::checkpoint(&run.published, "exists already; it would be replaced by the run's last checkpoint"));
        }
        std::fs::rename(&run.last, &run.published).map_err(|e| Error::io(&run.published, e))?;
        crate::io::atomic::sync_dir(run.published.parent().unwrap_or(Path::new(".")))?;
    }
    index.ended(&label)
}

/// A run's name in the index (`pretrain`, `rl op11_14`, `opd`).
fn index_label(run: &PlannedRun) -> String {
    report::role(run)
}

/// `data/test` holds no `*.jsonl` besides the files of the plan's `test` splits: the evaluation
/// reads every file there, so one left by another scale or per-op count (`op5-50.jsonl` beside
/// `op5-100.jsonl`) would be evaluated too. Without a `test` split in the plan, any files go.
pub fn check_test_split(plan: &Plan) -> Result<()> {
    let (data, test) = (plan.data_dir(), plan.data_dir().join("test"));
    let mut expected = Vec::new();
    for spec in plan.splits.iter().filter(|s| s.split == "test") {
        expected.extend(spec.paths(&data).map_err(Error::InvalidInput)?);
    }
    if expected.is_empty() {
        return Ok(());
    }
    let entries = std::fs::read_dir(&test).map_err(|e| Error::io(&test, e))?;
    for entry in entries {
        let path = entry.map_err(|e| Error::io(&test, e))?.path();
        if path.extension().is_some_and(|x| x == "jsonl") && !expected.contains(&path) {
            let names: Vec<String> = expected.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
            let message = format!("not one of this scale's test files ({}), and the evaluation reads every file here: move it out, or run into a fresh --out", names.join(", "));
            return Err(Error::data(&path, None, message));
        }
    }
    Ok(())
}

fn eval<B: AutodiffBackend>(plan: &Plan, devices: &[B::Device], on_event: &mut impl FnMut(Event)) -> Result<()> {
    let settings = plan.eval_settings();
    let test = plan.data_dir().join("test");
    let mut data: Option<EvalData> = None;
    for batch in &plan.batches {
        let batch_dir = plan.batch_dir(batch);
        let out = batch_dir.join("evals");
        let models = plan.eval_models(batch)?;
        for model in &models {
            needs(&model.path, &format!("checkpoint {}", model.name), Stage::Opd)?;
        }
        let finished = out.join("summary.json").is_file() && models.iter().all(|m| metrics_path(&out, &m.name).is_file());
        if finished {
            on_event(Event::EvalSkipped { batch });
            continue;
        }
        needs(&test, "the evaluation split (data/test)", Stage::Data)?;
        if data.is_none() {
            check_test_split(plan)?;
            data = Some(EvalData::load(&test, settings.id_op_threshold)?);
        }
        let data = data.as_ref().expect("loaded");
        let mut index = RunIndex::load(&batch_dir, &note(plan))?;
        index.started(RunRecord {
            path: "evals/summary.csv".into(),
            run: "eval".into(),
            config: plan.config.display().to_string(),
            source: String::new(),
            model: format!("{} checkpoints", models.len()),
            from: None,
            ..RunRecord::default()
        })?;
        on_event(Event::EvalStart { batch, models: models.len(), prompts: data.id.len() + data.ood.len(), samples: settings.samples });
        evaluate_on::<B::InnerBackend>(&models, data, &out, &settings, devices, None, |event| on_event(Event::Eval { batch, event }))?;
        index.ended("eval")?;
    }
    let markdown = report::write(plan)?;
    on_event(Event::Report { markdown: &markdown });
    Ok(())
}
