//! `kiln release run`: the Interplay release as one command (`kiln::release`), with a line per
//! stage and run, and a progress bar with an ETA for every long one (plain lines with the ETA
//! when stderr is not a terminal).

use kiln::train::metrics as metric;
use std::path::PathBuf;
use std::time::Instant;

use super::progress;

use anyhow::{Context, Result};
use burn::tensor::backend::AutodiffBackend;
use clap::{Args, Subcommand};
use kiln::backends::{DeviceSpec, ReplicaJob};
use kiln::eval::EvalEvent;
use kiln::release::{Event, FULL, Plan, ReleaseConfig, RunKind, Stage};
use serde_json::Value;

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(subcommand)]
    command: ReleaseCommand,
}

#[derive(Debug, Subcommand)]
enum ReleaseCommand {
    /// Run a release's stages in order (data, pretrain, rl, opd, eval), resuming where it stopped.
    Run(RunArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The release file (examples/configs/release/release.toml).
    #[arg(long)]
    config: PathBuf,
    /// `full` (the configs as written), or a smaller scale of the file (`cpu`, `mini`, `tiny`).
    #[arg(long, default_value = FULL)]
    scale: String,
    /// Stages to run, comma-separated (data always runs first and keeps what exists).
    #[arg(long, default_value = "data,pretrain,rl,opd,eval", value_parser = parse_stages)]
    stages: StageList,
    /// The release root (default: the file's `[release] out`, with `-<scale>` below full scale).
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long, default_value = "cpu", value_parser = super::parse_backend)]
    backend: DeviceSpec,
    /// Several devices of this process (`cuda:0,cuda:1,…`): every training run has one
    /// data-parallel replica per device, the evaluation one engine per device.
    #[arg(long, value_delimiter = ',', value_parser = super::parse_backend)]
    devices: Vec<DeviceSpec>,
}

#[derive(Debug, Clone)]
struct StageList(Vec<Stage>);

fn parse_stages(text: &str) -> Result<StageList, String> {
    Stage::parse_list(text).map(StageList)
}

pub fn run(args: ReleaseArgs) -> Result<()> {
    match args.command {
        ReleaseCommand::Run(args) => run_release(args),
    }
}

fn run_release(args: RunArgs) -> Result<()> {
    let config = ReleaseConfig::load(&args.config)?;
    let plan = kiln::release::plan(&config, &args.config, &args.scale, args.out.as_deref())?;
    eprintln!(
        "release {} at {} scale into {}: {} runs in {} batches; stages {}",
        args.config.display(),
        plan.scale,
        plan.root.display(),
        plan.runs.len(),
        plan.batches.len(),
        args.stages.0.iter().map(|s| s.name()).collect::<Vec<_>>().join(",")
    );
    let devices = if args.devices.is_empty() { vec![args.backend] } else { args.devices };
    if devices.len() > 1 {
        eprintln!("on {} devices: {}", devices.len(), devices.iter().map(ToString::to_string).collect::<Vec<_>>().join(","));
    }
    let started = Instant::now();
    kiln::backends::run_replicas(&devices, ReleaseJob { plan, stages: args.stages.0 })??;
    eprintln!("release done in {}", progress::clock(started.elapsed()));
    Ok(())
}

struct ReleaseJob {
    plan: Plan,
    stages: Vec<Stage>,
}

impl ReplicaJob for ReleaseJob {
    type Output = Result<()>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<()> {
        let mut view = View::default();
        kiln::release::run::<B>(&self.plan, &self.stages, &devices, |event| view.show(event))
            .with_context(|| format!("release {}", self.plan.root.display()))?;
        view.finish();
        Ok(())
    }
}

/// The progress of the current long piece of work.
#[derive(Default)]
struct View {
    bar: Option<progress::Bar>,
    /// When the bar's work started (its rate of new tokens).
    started: Option<Instant>,
    run_started: Option<Instant>,
    message: String,
}

impl View {
    fn start_bar(&mut self, total: u64, at: u64, unit: &str) {
        self.finish();
        let bar = progress::with_eta(total, unit);
        bar.restart_at(at);
        self.bar = Some(bar);
        self.started = Some(Instant::now());
    }

    fn advance(&mut self, position: u64) {
        let Some(bar) = &self.bar else { return };
        bar.set_message(self.message.clone());
        bar.set_position(position);
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        self.message.clear();
    }

    fn say(&self, line: String) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    fn show(&mut self, event: Event) {
        match event {
            Event::Stage(stage) => {
                self.finish();
                eprintln!("[{}]", stage.name());
            }
            Event::Split { command, skipped } => {
                self.finish();
                eprintln!("  {}{command}", if skipped { "kept (files exist): " } else { "" });
            }
            Event::SplitProgress { done, total } => {
                if self.bar.is_none() {
                    self.start_bar(total as u64, 0, "rows");
                }
                self.advance(done as u64);
                if done == total {
                    self.finish();
                }
            }
            Event::RunSkipped { run } => eprintln!("  {}: finished ({}), skipped", run.label(), run.published.display()),
            Event::RunStart { run, resumed_from } => {
                self.finish();
                self.run_started = Some(Instant::now());
                let from = resumed_from.map_or(String::new(), |s| format!(", resuming from step {s}"));
                eprintln!("  {}: {} steps into {}{from}", run.label(), run.steps, run.published.display());
                self.start_bar(run.steps, resumed_from.unwrap_or(0), "steps");
            }
            Event::RunData { run, data } => {
                let line = match run.kind {
                    RunKind::Pretrain => format!("    {} packed blocks", data["samples"]),
                    _ => format!("    {} prompts ({} too long, dropped)", data["prompts"]["prompts"], data["prompts"]["filtered_overlong"]),
                };
                self.say(line);
            }
            Event::RunRecord { record, .. } => {
                let mut message = String::new();
                for (key, label) in [(metric::LOSS, "loss"), (metric::REWARD_MEAN, "reward"), (metric::TEACHER_KL, "teacher KL"), (metric::VAL_ACCURACY_OOD, "val OOD")] {
                    if let Some(v) = key.get(record) {
                        message += &format!("{label} {v:.3} ");
                    }
                }
                if !message.is_empty() {
                    self.message = message;
                }
                if let Some(step) = record.get(metric::STEP.key()).and_then(Value::as_u64) {
                    self.advance(step);
                }
            }
            Event::RunDone { run, summary } => {
                self.finish();
                let took = self.run_started.map_or(String::new(), |t| format!(" in {}", progress::clock(t.elapsed())));
                eprintln!("  {}: {} steps{took}; {}", run.label(), summary.steps, run.published.display());
            }
            Event::EvalStart { batch, models, prompts, samples } => {
                eprintln!("  {batch}: {models} models x {prompts} prompts x {samples} samples");
            }
            Event::EvalSkipped { batch } => eprintln!("  {batch}: every model is evaluated, skipped"),
            Event::Eval { batch, event } => self.eval(batch, event),
            Event::Report { markdown } => {
                self.finish();
                println!("{markdown}");
            }
        }
    }

    fn eval(&mut self, batch: &str, event: EvalEvent) {
        match event {
            EvalEvent::Model { index, count, name } => {
                self.finish();
                eprintln!("  [{}/{count}] {batch} {name}", index + 1);
            }
            EvalEvent::Skipped { name } => eprintln!("    {name}: evaluated already, skipped"),
            EvalEvent::Generating { done, total, new_tokens, .. } => {
                if self.bar.is_none() {
                    self.start_bar(total as u64, done as u64, "samples");
                }
                if let Some(t0) = self.started {
                    self.message = format!("{:.0} tokens/s", new_tokens as f64 / t0.elapsed().as_secs_f64().max(1e-9));
                }
                self.advance(done as u64);
            }
            EvalEvent::Stage { .. } => self.finish(),
            EvalEvent::Finished { name, summary } => {
                self.finish();
                let f = |key: &str| summary.get(key).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
                eprintln!("    {name}: ID {:.4} | OOD {:.4} | total {:.4}", f("id_acc"), f("ood_acc"), f("total_acc"));
            }
        }
    }
}
