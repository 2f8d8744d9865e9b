//! `kiln pretrain` / `kiln sft`: run a training config (TOML), with a progress bar.

use kiln::train::metrics::{self as metric, Metric};
use std::path::PathBuf;

use anyhow::{Context, Result};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use kiln::backends::{DeviceSpec, ReplicaJob};
use kiln::dist::NodeSpec;
use kiln::train::RunConfig;
use kiln::train::run::Command;
use serde_json::Value;

use super::dist::DistArgs;
use super::progress;

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The run's TOML config (see examples/configs/).
    #[arg(long)]
    config: PathBuf,
    /// Continue from the latest checkpoint of the output directory.
    #[arg(long)]
    resume: bool,
    /// With --resume: continue even where the config differs from the checkpoint's run (the
    /// changed settings are listed in a warning); without it such a resume is refused.
    #[arg(long, requires = "resume")]
    allow_config_change: bool,
    /// The device (default cpu; see --devices for several).
    #[arg(long, value_parser = super::parse_backend)]
    backend: Option<DeviceSpec>,
    #[command(flatten)]
    dist: DistArgs,
}

/// Which kind of run the subcommand expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Pretrain,
    Sft,
}

pub fn run(kind: Kind, args: TrainArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.config).with_context(|| format!("{}", args.config.display()))?;
    let command = match kind {
        Kind::Pretrain => Command::Pretrain,
        Kind::Sft => Command::Sft,
    };
    let mut config = RunConfig::load(&args.config, &text, command)?;
    config.output.allow_config_change |= args.allow_config_change;
    let devices = args.dist.devices(args.backend, config.train.devices.as_deref())?;
    let nodes = args.dist.nodes()?;
    let run_kind = match kind {
        Kind::Pretrain => kiln::config_import::RunKind::Pretrain,
        Kind::Sft => kiln::config_import::RunKind::Sft,
    };
    let note = super::config::legacy_note(&args.config, &text, run_kind);
    let recompute = config.train.recompute;
    let job = RunJob { config, resume: args.resume, nodes, note };
    super::on_cpu_pool(&devices, || kiln::backends::run_replicas_with(&devices, recompute, job))?
}

struct RunJob {
    config: RunConfig,
    resume: bool,
    nodes: Option<NodeSpec>,
    /// Earlier names in the config ([`super::config::legacy_note`]), printed with the data line.
    note: Option<String>,
}

impl ReplicaJob for RunJob {
    type Output = Result<()>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<()> {
        let bar = progress::with_eta(0, "steps");
        // The ETA is measured from the first step reported (not the setup, nor a resumed run's
        // earlier steps).
        let mut first = true;
        // The latest held-out loss stays on the line until the next evaluation: `eval 1.2345@60`.
        let mut last_eval: Option<(f64, u64)> = None;
        let summary = kiln::train::run::run_replicated::<B>(
            &self.config,
            &devices,
            self.nodes.as_ref(),
            self.resume,
            |data| {
                bar.set_length(data["total_steps"].as_u64().unwrap_or(0));
                bar.suspend(|| {
                    if let Some(note) = &self.note {
                        eprintln!("{note}");
                    }
                    eprintln!("data: {}", compact(data));
                });
            },
            |record| {
                let step = record.get(metric::STEP.key()).and_then(Value::as_u64);
                match step {
                    Some(step) if std::mem::take(&mut first) => bar.restart_at(step),
                    Some(step) => bar.set_position(step),
                    None => {}
                }
                let number = |m: Metric| m.get(record);
                let mut message = String::new();
                if let Some(loss) = number(metric::LOSS) {
                    message += &format!("loss {loss:.4} ");
                }
                if let Some(loss) = number(metric::EVAL_LOSS) {
                    last_eval = Some((loss, step.unwrap_or(0)));
                }
                if let Some((loss, at)) = last_eval {
                    message += &format!("eval {loss:.4}@{at} ");
                }
                if let Some(acc) = number(metric::EVAL_ACCURACY) {
                    message += &format!("acc {acc:.3} ");
                }
                if let Some(changed) = number(metric::WEIGHTS_CHANGED) {
                    message += &format!("changed {:.1}% ", 100.0 * changed);
                }
                if let Some(tps) = number(metric::TOKENS_PER_S) {
                    message += &format!("{tps:.0} tok/s");
                }
                bar.set_message(message);
            },
        )?;
        bar.finish_and_clear();
        eprintln!("{summary}");
        Ok(())
    }
}

/// A one-line summary of the data report.
fn compact(data: &Value) -> String {
    let mut text = format!("{} samples, {} steps", data["samples"], data["total_steps"]);
    if let Some(ops) = data["data"]["mixture"]["ops"].as_array() {
        let shares: Vec<String> = ops
            .iter()
            .map(|o| format!("op{} {:.1}%", o["op"], o["share"].as_f64().unwrap_or(0.0) * 100.0))
            .collect();
        text += &format!("; mixture {}", shares.join(", "));
    }
    if let Some(sft) = data["data"]["sft"].as_object() {
        let template = sft.get("chat_template").and_then(Value::as_str).unwrap_or("chatml");
        text += &format!("; {} rows rendered by {template}, {} truncated ({} lost their final code block)", sft["rows"], sft["truncated"], sft["final_code_lost"]);
        if sft["no_targets"].as_u64().is_some_and(|n| n > 0) {
            text += &format!(", {} with no response token left (they train nothing)", sft["no_targets"]);
        }
    }
    if let Some(split) = data["data"]["source"]["split"].as_str() {
        let source = &data["data"]["source"];
        text += &format!("; {} train + {} held out ({split})", source["train"], source["heldout"]);
    }
    text
}
