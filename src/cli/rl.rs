//! `kiln rl` / `kiln opd`: run a GRPO or on-policy distillation config (TOML), with a progress
//! bar showing reward or teacher KL and the latest validation accuracy.

use kiln::train::metrics::{self as metric, Metric};
use std::path::PathBuf;

use anyhow::{Context, Result};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use kiln::backends::{DeviceSpec, ReplicaJob};
use kiln::dist::NodeSpec;
use kiln::rl::{Method, PgConfig};
use serde_json::Value;

use super::dist::DistArgs;
use super::progress;

#[derive(Debug, Args)]
pub struct RlArgs {
    /// The run's TOML config (see examples/configs/).
    #[arg(long)]
    config: PathBuf,
    /// Continue from the latest checkpoint of the run.
    #[arg(long)]
    resume: bool,
    /// With --resume: continue even where the config differs from the checkpoint's run (the
    /// changed settings are listed in a warning); without it such a resume is refused.
    #[arg(long, requires = "resume")]
    allow_config_change: bool,
    /// The device (default cpu; see --devices for several).
    #[arg(long, value_parser = super::parse_backend)]
    backend: Option<DeviceSpec>,
    /// Code tasks: sandbox layers to leave off as if the kernel lacked them (added to `[task]
    /// sandbox_without`; recorded in environment.json). kiln still refuses when the layers left
    /// cannot contain a run.
    #[cfg(feature = "code")]
    #[arg(long, value_name = "LAYER[,LAYER...]", value_delimiter = ',', value_parser = super::code::parse_layer)]
    sandbox_without: Vec<String>,
    /// Code tasks: enforce Landlock as a kernel of this ABI (1-6) would (`[task]
    /// sandbox_landlock_abi`).
    #[cfg(feature = "code")]
    #[arg(long, value_name = "ABI")]
    sandbox_landlock_abi: Option<u32>,
    #[command(flatten)]
    dist: DistArgs,
}

pub fn run(method: Method, args: RlArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.config).with_context(|| format!("{}", args.config.display()))?;
    let mut config = PgConfig::load(&args.config, &text, method)?;
    config.output.allow_config_change |= args.allow_config_change;
    #[cfg(feature = "code")]
    sandbox_flags(&mut config.task, args.sandbox_without, args.sandbox_landlock_abi, &args.config)?;
    let devices = args.dist.devices(args.backend, config.train.devices.as_deref())?;
    let nodes = args.dist.nodes()?;
    // The replicas' split of a step, before any model or data is loaded.
    let Some(world) = devices.len().checked_mul(nodes.as_ref().map_or(1, |n| n.nnodes)) else { anyhow::bail!("--devices × --nnodes is too large") };
    config.check_world(world).map_err(|e| anyhow::anyhow!("{}: {e}", args.config.display()))?;
    let run_kind = match method {
        Method::Grpo => kiln::config_import::RunKind::Rl,
        Method::Opd => kiln::config_import::RunKind::Opd,
    };
    let note = super::config::legacy_note(&args.config, &text, run_kind);
    let recompute = config.train.recompute;
    let job = RlJob { config, method, resume: args.resume, path: args.config, nodes, note };
    super::on_cpu_pool(&devices, || kiln::backends::run_replicas_with(&devices, recompute, job))?
}

/// `--sandbox-without` and `--sandbox-landlock-abi` into the code task's config (an error for
/// other tasks, which run no programs).
#[cfg(feature = "code")]
fn sandbox_flags(task: &mut kiln::tasks::TaskConfig, without: Vec<String>, abi: Option<u32>, path: &std::path::Path) -> Result<()> {
    if without.is_empty() && abi.is_none() {
        return Ok(());
    }
    match task {
        kiln::tasks::TaskConfig::Code(code) => {
            for layer in without {
                if !code.sandbox_without.contains(&layer) {
                    code.sandbox_without.push(layer);
                }
            }
            code.sandbox_landlock_abi = abi.or(code.sandbox_landlock_abi);
            Ok(())
        }
        #[allow(unreachable_patterns)]
        _ => anyhow::bail!(
            "--sandbox-without and --sandbox-landlock-abi are for code tasks ([task] kind = \"code\"); {} runs no programs",
            path.display()
        ),
    }
}

struct RlJob {
    config: PgConfig,
    method: Method,
    resume: bool,
    path: PathBuf,
    nodes: Option<NodeSpec>,
    /// Earlier names in the config ([`super::config::legacy_note`]), printed with the data line.
    note: Option<String>,
}

impl ReplicaJob for RlJob {
    type Output = Result<()>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<()> {
        let bar = progress::with_eta(0, "steps");
        // The ETA is measured from the first step reported (not the setup and the first
        // validation, nor a resumed run's earlier steps).
        let mut first = true;
        let mut validation = String::new();
        let summary = kiln::rl::run::run_replicated::<B>(
            &self.config,
            self.method,
            &devices,
            self.nodes.as_ref(),
            self.resume,
            |data| {
                bar.set_length(data["total_steps"].as_u64().unwrap_or(0));
                let say = |line: String| bar.println(line);
                if let Some(note) = &self.note {
                    say(note.clone());
                }
                if let Some(environment) = data["environment"].as_str() {
                    say(format!("rewards graded under {environment}"));
                }
                let report = &data["prompts"];
                say(format!(
                    "prompts: {} kept, {} longer than max_prompt_length dropped; {} steps ({} per epoch)",
                    report["prompts"], report["filtered_overlong"], data["total_steps"], data["steps_per_epoch"]
                ));
            },
            |record| {
                let number = |m: Metric| m.get(record);
                match record.get(metric::STEP.key()).and_then(Value::as_u64) {
                    Some(step) if std::mem::take(&mut first) => bar.restart_at(step),
                    Some(step) => bar.set_position(step),
                    None => {}
                }
                if let (Some(id), ood) = (number(metric::VAL_ACCURACY_ID), number(metric::VAL_ACCURACY_OOD)) {
                    validation = format!("val id {id:.3}{} ", ood.map(|o| format!(" ood {o:.3}")).unwrap_or_default());
                }
                let mut message = validation.clone();
                if let Some(reward) = number(metric::REWARD_MEAN) {
                    message += &format!("reward {reward:.3} ");
                }
                if let Some(kl) = number(metric::TEACHER_KL) {
                    message += &format!("teacher KL {kl:.4} ");
                }
                if let Some(tps) = number(metric::ROLLOUT_TOKENS_PER_S) {
                    message += &format!("rollout {tps:.0} tok/s");
                }
                bar.set_message(message);
            },
        )
        .with_context(|| format!("{}", self.path.display()))?;
        bar.finish_and_clear();
        eprintln!("{summary}");
        Ok(())
    }
}
