//! `kiln quickstart`: the tiny end-to-end pipeline on the CPU, nothing downloaded.
//!
//! 1. generate Interplay problems (op 2–4: train, val and test splits),
//! 2. write a tiny Qwen2 config with the paper's tokenizer,
//! 3. pre-train it for a fixed number of steps (packed next-token loss, AdamW, cosine schedule),
//!    checkpointing at 20/40/…/100 % like the release (`release/pretrain/checkpoint-N`); the same
//!    work on every machine (about 5 minutes on 2 cores), with a warning and an estimate up front
//!    when a machine would need more than 15 minutes (`--minutes` sets a wall-clock budget),
//! 4. evaluate the final checkpoint as `kiln eval interplay` does (answer accuracy and pass@k
//!    per op, strict graph scores) and print the summary.
//!
//! Every stage is resumable: run it again and finished work is kept.

use kiln::train::metrics as metric;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use kiln::backends::{DeviceSpec, TrainJob};
use kiln::eval::{EvalSettings, evaluate, named_models};
use kiln::generate::Sampler;
use kiln::tasks::interplay::dataset::{Split, write_split};
use kiln::tasks::interplay::eval::{EvalData, metrics_path};
use kiln::tasks::interplay::tiny_model::write_tiny_model;
use kiln::train::RunConfig;
use serde_json::Value;

use super::progress;

#[derive(Debug, Args)]
pub struct QuickstartArgs {
    /// Working directory (data, model, release, evals).
    #[arg(long, default_value = "kiln-quickstart")]
    out: PathBuf,
    /// Pre-training steps (8 packed 512-token blocks each).
    #[arg(long, default_value_t = DEFAULT_STEPS, value_parser = clap::value_parser!(u64).range(1..))]
    steps: u64,
    /// Wall-clock budget for pre-training, in minutes (it stops cleanly and saves); none by
    /// default, so every machine does the same work.
    #[arg(long, value_parser = minutes)]
    minutes: Option<f64>,
    #[arg(long, default_value = "cpu", value_parser = super::parse_backend)]
    backend: DeviceSpec,
}

/// A finite, non-negative number of minutes, at most 1e9 (its seconds go into the generated
/// config, where a larger number overflowed after the data and model were written).
fn minutes(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(m) if (0.0..=1e9).contains(&m) => Ok(m),
        _ => Err(format!("expected a finite number of minutes >= 0 (at most 1e9), got {text:?}")),
    }
}

/// Steps of the default run: about 5 minutes of pre-training on 2 cores of a current x86 CPU
/// (see `benches/README.md`), enough for a clearly non-zero test accuracy.
const DEFAULT_STEPS: u64 = 400;

/// Pre-training longer than this (estimated from the first steps) is announced with the estimate.
const SLOW_WARNING_S: f64 = 15.0 * 60.0;

/// Steps timed before the estimate (the first one, which warms up, is not counted).
const TIMED_STEPS: u64 = 3;

pub fn run(args: QuickstartArgs) -> Result<()> {
    let backend = args.backend;
    super::on_cpu_pool(&[backend], || kiln::backends::run_training(backend, QuickstartJob(args)))?
}

struct QuickstartJob(QuickstartArgs);

impl TrainJob for QuickstartJob {
    type Output = Result<()>;

    fn run<B: AutodiffBackend>(self, device: B::Device) -> Result<()> {
        let args = self.0;
        let out = &args.out;
        // What is already in `out` and not the quickstart's is refused before anything is written.
        kiln::tasks::interplay::tiny_model::check_tiny_model(&out.join("model"))?;
        let config_path = out.join("pretrain.toml");
        if std::fs::read_to_string(&config_path).is_ok_and(|text| !text.starts_with(CONFIG_HEADER)) {
            anyhow::bail!("{}: exists and was not written by `kiln quickstart`; choose another --out", config_path.display());
        }
        std::fs::create_dir_all(out).with_context(|| out.display().to_string())?;

        eprintln!("[1/4] data: Interplay problems, op 2-4, in {}", out.join("data").display());
        let data = out.join("data");
        for (split, per_op) in [(Split::Train, 2000), (Split::Val, 40), (Split::Test, 30)] {
            // (a split an interrupted run left without all its files is written again)
            if ![2, 3, 4].iter().all(|&op| split.path(&data, op, per_op).is_file()) {
                let bar = progress::with_eta((3 * per_op) as u64, "rows");
                let report = write_split(&data, split, &[2, 3, 4], per_op, 1, false, || bar.inc(1))?;
                bar.finish_and_clear();
                eprintln!("      {}: {} rows", split.name(), report.rows);
            }
        }

        eprintln!("[2/4] model: tiny Qwen2 with the paper's tokenizer in {}", out.join("model").display());
        write_tiny_model(&out.join("model"))?;

        let budget = args.minutes.map(|m| format!(" or {m} minutes")).unwrap_or_default();
        eprintln!("[3/4] pre-training ({} steps{budget}) into {}", args.steps, out.join("release/pretrain").display());
        let toml = pretrain_toml(args.steps, args.minutes);
        kiln::io::write_atomic(&config_path, &toml)?;
        let config = RunConfig::from_toml(&config_path, &toml)?;
        let bar = progress::steps(args.steps);
        bar.set_message("loss -");
        let mut accuracy: Vec<(u64, f64)> = Vec::new();
        let mut clock = StepClock::default();
        let summary = kiln::train::run::<B>(
            &config,
            &device,
            true,
            |data| bar.suspend(|| eprintln!("      {} packed blocks; mixture {}", data["samples"], shares(&data["data"]["mixture"]))),
            |record| {
                let step = record.get(metric::STEP.key()).and_then(Value::as_u64).unwrap_or(0);
                bar.set_position(step);
                if let Some(estimate) = clock.estimate(step, kiln::train::metrics::STEP_S.get(record), args.steps)
                    && estimate > SLOW_WARNING_S
                    && args.minutes.is_none()
                {
                    bar.suspend(|| {
                        eprintln!(
                            "      warning: this machine needs about {:.0} minutes for {} steps (Ctrl-C and rerun with \
                             --steps N or --minutes M for a shorter run; a rerun resumes from the last checkpoint)",
                            estimate / 60.0,
                            args.steps
                        )
                    });
                }
                if let Some(loss) = metric::LOSS.get(record) {
                    bar.set_message(format!("loss {loss:.3}"));
                }
                if let Some(acc) = metric::EVAL_ACCURACY.get(record) {
                    let loss = metric::EVAL_LOSS.get(record).unwrap_or(f64::NAN);
                    bar.suspend(|| eprintln!("      step {step:>4}: held-out loss {loss:.3}, greedy accuracy on op 2-3 {acc:.3}"));
                    accuracy.push((step, acc));
                }
            },
        )?;
        bar.finish_and_clear();
        let last = latest_checkpoint(&out.join("release/pretrain"))?;
        eprintln!(
            "      {} steps in {:.0}s{}; final checkpoint {}",
            summary.steps,
            summary.elapsed.as_secs_f64(),
            if summary.stopped_early { " (time budget)" } else { "" },
            last.display()
        );

        eprintln!("[4/4] evaluation of the final checkpoint on the test split (2 samples per prompt, T = 0.7)");
        let evals = out.join("release/evals");
        let models = named_models(&[last])?;
        let data = EvalData::load(&data.join("test"), Some(10))?;
        let settings = EvalSettings {
            samples: 2,
            sampler: Sampler { temperature: 0.7, top_k: 0, top_p: 1.0, min_p: 0.0 },
            max_new_tokens: 384,
            batch_size: 128,
            ..EvalSettings::default()
        };
        let bar = progress::with_eta((data.id.len() * settings.samples) as u64, "samples");
        let outcomes = evaluate::<B::InnerBackend>(&models, &data, &evals, &settings, &device, |event| {
            if let kiln::eval::EvalEvent::Generating { done, .. } = event {
                bar.set_position(done as u64);
            }
        })?;
        bar.finish_and_clear();
        let metrics_file = metrics_path(&evals, &outcomes[0].name);
        let metrics: Value = serde_json::from_str(&std::fs::read_to_string(&metrics_file)?)?;
        let id = &metrics["id"];
        println!("kiln quickstart: a {}-step tiny Qwen2 on Interplay op 2-4", summary.steps.max(accuracy.last().map_or(0, |a| a.0)));
        if let (Some(first), Some(final_)) = (accuracy.first(), accuracy.last()) {
            println!("  greedy accuracy on held-out op 2-3: {:.3} at step {} -> {:.3} at step {}", first.1, first.0, final_.1, final_.0);
        }
        println!("  test answer accuracy (T=0.7): {:.3}", id["answer_accuracy"].as_f64().unwrap_or(f64::NAN));
        if let Some(per_op) = id["per_op_accuracy"].as_object() {
            let mut ops: Vec<(&String, &Value)> = per_op.iter().collect();
            ops.sort_by_key(|(op, _)| op.parse::<u32>().unwrap_or(0));
            for (op, acc) in ops {
                println!("    op {op}: {:.3}", acc.as_f64().unwrap_or(f64::NAN));
            }
        }
        println!("  files: {} (metrics, strict-graph results, summary.csv)", evals.display());
        Ok(())
    }
}

/// Estimates the pre-training time from the durations of the first steps.
#[derive(Default)]
struct StepClock {
    times: Vec<f64>,
    announced: bool,
}

impl StepClock {
    /// After [`TIMED_STEPS`] steps past the first one, once: the estimated seconds for `total`
    /// steps (held-out evaluations not included).
    fn estimate(&mut self, step: u64, step_s: Option<f64>, total: u64) -> Option<f64> {
        if self.announced {
            return None;
        }
        if let Some(s) = step_s.filter(|_| step > 1) {
            self.times.push(s);
        }
        if (self.times.len() as u64) < TIMED_STEPS {
            return None;
        }
        self.announced = true;
        let mean = self.times.iter().sum::<f64>() / self.times.len() as f64;
        Some(mean * total as f64)
    }
}

/// The pre-training config; without `minutes` it has no `time_budget_s` line (no wall-clock stop).
fn pretrain_toml(steps: u64, minutes: Option<f64>) -> String {
    let toml = pretrain_template(steps, minutes.unwrap_or(0.0));
    match minutes {
        Some(_) => toml,
        None => toml.lines().filter(|l| !l.starts_with("time_budget_s")).map(|l| format!("{l}\n")).collect(),
    }
}

/// The first line of the quickstart's `pretrain.toml` (a rerun rewrites only such a file).
const CONFIG_HEADER: &str = "# Written by `kiln quickstart`";

fn pretrain_template(steps: u64, minutes: f64) -> String {
    format!(
        r#"# Written by `kiln quickstart`; rerun with `kiln pretrain --config pretrain.toml --resume`.
# `kiln config show --config pretrain.toml` lists every setting with its default.
[model]
init = "model/config.json"
seed = 0

[data]
kind = "mixture"
root = "data"
ops = [2, 3, 4]
probs = [0.3, 0.3, 0.4]
tokens = 1e6
cutoff_len = 512

[train]
steps = {steps}
micro_batch = 8
seed = 42

[optimizer]
lr = 3e-3
weight_decay = 0.1

[schedule]
kind = "cosine_with_min_lr"
warmup_ratio = 0.05
min_lr_rate = 0.5

[output]
dir = "release/pretrain"
save_steps = 0.2
time_budget_s = {budget}

[eval]
every = {every}
rows = "data/val"
ops = [2, 3]
rows_per_op = 20
"#,
        budget = minutes * 60.0,
        every = (steps / 4).max(1),
    )
}

fn shares(mixture: &Value) -> String {
    mixture["ops"]
        .as_array()
        .map(|ops| {
            ops.iter()
                .map(|o| format!("op{} {:.0}%", o["op"], o["share"].as_f64().unwrap_or(0.0) * 100.0))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

fn latest_checkpoint(dir: &Path) -> Result<PathBuf> {
    kiln::train::checkpoint::latest(dir)?
        .map(|(_, path)| path)
        .with_context(|| format!("{}: no checkpoint", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln::config_import::{RunKind, effective, legacy_notes};

    /// The config earlier quickstarts wrote (users have such files; they keep working).
    const EARLIER: &str = r#"[model]
init = "model/config.json"
seed = 0

[data]
interplay = "data"
ops = [2, 3, 4]
probs = [0.3, 0.3, 0.4]
tokens = 1e6
cutoff_len = 512

[train]
steps = 100
micro_batch = 8
lr = 3e-3
schedule = "cosine_with_min_lr"
min_lr_rate = 0.5
warmup_ratio = 0.05
weight_decay = 0.1
seed = 42

[output]
dir = "release/pretrain"
save_steps = 0.2
time_budget_s = 60.0

[eval]
every = 25
heldout = "data/val"
accuracy_ops = [2, 3]
accuracy_rows = 20
"#;

    #[test]
    fn the_config_is_in_the_current_schema_and_means_what_the_earlier_one_did() {
        let text = pretrain_toml(100, Some(1.0));
        assert_eq!(legacy_notes(&text, RunKind::Pretrain), Vec::<String>::new(), "{text}");
        assert!(!legacy_notes(EARLIER, RunKind::Pretrain).is_empty());
        let path = Path::new("pretrain.toml");
        assert_eq!(effective(path, &text, RunKind::Pretrain).unwrap(), effective(path, EARLIER, RunKind::Pretrain).unwrap());
        let untimed = pretrain_toml(100, None);
        assert!(!untimed.contains("time_budget_s") && untimed.contains("[schedule]"), "{untimed}");
    }
}
