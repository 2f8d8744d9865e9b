//! GRPO end to end on the CPU backend, with nothing downloaded:
//!
//! 1. Interplay problems: train op 2–4 (pre-training), heldout op 3–5 (RL prompts) and val
//!    op 2–6 (validation, the fixed held-out set: greedy accuracy before and after);
//! 2. a tiny Qwen2 (1.3M parameters, the paper's tokenizer) pre-trained briefly on op 2–4 with
//!    `kiln pretrain`'s recipe, or an existing checkpoint given with `--base`;
//! 3. GRPO on op 3–5 prompts with `kiln rl`'s recipe (verl's clipped surrogate, outcome reward,
//!    k3 KL to the initial policy), checkpoints `release/rl/op3_5_step<N>` as in the release;
//! 4. the mean reward per step and the validation accuracy before and after.
//!
//! ```text
//! cargo run --release --example rl -- [--work DIR] [--base CHECKPOINT] [--steps 30]
//! ```
//!
//! Every stage resumes: run it again and finished work is kept. `examples/opd.rs` then distils
//! the GRPO model into the pre-trained one.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use burn::backend::Autodiff;
use clap::Parser;
use kiln::backends::Cpu;
use kiln::rl::{Method, PgConfig};
use kiln::tasks::interplay::dataset::{Split, write_split};
use kiln::tasks::interplay::tiny_model::write_tiny_model;
use kiln::train::checkpoint::latest_named;
use kiln::train::RunConfig;
use kiln::train::metrics as metric;
use kiln::train::trainer::read_metrics;
use serde_json::Value;

#[derive(Debug, Parser)]
struct Args {
    /// Working directory (data, model, release).
    #[arg(long, default_value_os_t = std::env::temp_dir().join("kiln-rl-example"))]
    work: PathBuf,
    /// Start GRPO from this HF checkpoint instead of pre-training one.
    #[arg(long)]
    base: Option<PathBuf>,
    /// Pre-training steps (8 packed 512-token blocks each).
    #[arg(long, default_value_t = 200)]
    pretrain_steps: u64,
    /// GRPO steps (8 prompts × 8 responses each, two optimizer updates).
    #[arg(long, default_value_t = 30)]
    steps: u64,
    /// GRPO learning rate (the seed's 1e-6 is for a 100M model and 1024 prompts per step).
    #[arg(long, default_value_t = 1e-4)]
    lr: f64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let work = &args.work;
    std::fs::create_dir_all(work).with_context(|| work.display().to_string())?;
    let data = work.join("data");
    eprintln!("[1/4] data in {}", data.display());
    for (split, ops, per_op) in [(Split::Train, &[2, 3, 4][..], 2000), (Split::Val, &[2, 3, 4, 5, 6][..], 20), (Split::Heldout, &[3, 4, 5][..], 500)] {
        if args.base.is_some() && split == Split::Train {
            continue;
        }
        if !data.join(split.name()).is_dir() {
            let report = write_split(&data, split, ops, per_op, 1, false, || {})?;
            eprintln!("      {}: {} rows", split.name(), report.rows);
        }
    }

    let base = match &args.base {
        Some(base) => base.clone(),
        None => pretrain(work, args.pretrain_steps)?,
    };

    eprintln!("[3/4] GRPO on op 3-5 from {} into {}", base.display(), work.join("release/rl").display());
    let path = work.join("rl.toml");
    let text = rl_toml(&base, args.steps, args.lr);
    std::fs::write(&path, &text)?;
    let config = PgConfig::from_toml(&path, &text)?;
    let summary = kiln::rl::run::<Autodiff<Cpu>>(&config, Method::Grpo, &Default::default(), true, |_| {}, |record| {
        if let Some(reward) = record.get("reward_mean").and_then(Value::as_f64) {
            eprintln!("      step {:>3}: reward {reward:.3}, {:.0} s", record["step"], metric::STEP_S.get(record).unwrap_or(0.0));
        }
    })?;
    eprintln!("      {} steps in {:.0} s", summary.steps, summary.elapsed.as_secs_f64());

    eprintln!("[4/4] results");
    let records = read_metrics(&work.join("release/rl/op3_5_metrics.jsonl"))?;
    print_curve(&records);
    Ok(())
}

/// Pre-trains the tiny model (resuming if interrupted); returns its final checkpoint.
fn pretrain(work: &Path, steps: u64) -> Result<PathBuf> {
    write_tiny_model(&work.join("model"))?;
    eprintln!("[2/4] pre-training a tiny Qwen2 on op 2-4 ({steps} steps) into {}", work.join("release/pretrain").display());
    let path = work.join("pretrain.toml");
    let text = format!(
        r#"[model]
init = "model/config.json"

[data]
interplay = "data"
ops = [2, 3, 4]
probs = [0.3, 0.3, 0.4]
tokens = 2e6
cutoff_len = 512

[train]
steps = {steps}
micro_batch = 8
lr = 3e-3
schedule = "cosine_with_min_lr"
min_lr_rate = 0.1
warmup_ratio = 0.05
weight_decay = 0.1

[output]
dir = "release/pretrain"
save_steps = 0.5
"#
    );
    std::fs::write(&path, &text)?;
    let config = RunConfig::from_toml(&path, &text)?;
    kiln::train::run::<Autodiff<Cpu>>(&config, &Default::default(), true, |_| {}, |record| {
        if let (Some(step), Some(loss)) = (record["step"].as_u64(), record.get("loss").and_then(Value::as_f64))
            && step % 25 == 0
        {
            eprintln!("      step {step:>4}: loss {loss:.3}");
        }
    })?;
    let (_, last) = latest_named(&work.join("release/pretrain"), None)?.context("pre-training left no checkpoint")?;
    Ok(last)
}

/// GRPO on op 3–5: 8 prompts × 8 responses per step in two updates, validation every 10 steps
/// on 20 rows per op of op 2–6 (ID: op ≤ 4, the pre-training range).
fn rl_toml(base: &Path, steps: u64, lr: f64) -> String {
    format!(
        r#"# Written by examples/rl.rs; rerun with `kiln rl --config rl.toml --resume`.
[model]
from = {base:?}

[data]
dir = "data/heldout"
ops = [3, 4, 5]
max_prompt_length = 512

[rollout]
n = 8
max_response_length = 256
batch_size = 128

[train]
steps = {steps}
prompts_per_step = 8
mini_batch = 4
micro_batch = 16
lr = {lr:e}

[loss]
kl_coef = 0.001
kl_estimator = "low_var_kl"

[reward]
kind = "outcome"

[output]
dir = "release/rl"
name = "op3_5"
save_freq = 10

[validation]
dir = "data/val"
every = 10
id_max_op = 4
"#
    )
}

/// The run's curve: per step reward, KL and lengths; validation accuracy where measured.
fn print_curve(records: &[serde_json::Map<String, Value>]) {
    let number = |r: &serde_json::Map<String, Value>, k: &str| r.get(k).and_then(Value::as_f64);
    let cell = |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    println!("| step | reward mean | frac. zero-std groups | KL to ref | response length | val acc ID (op 2-4) | val acc OOD (op 5-6) | op 3 | op 4 | op 5 |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in records {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r["step"],
            cell(number(r, "reward_mean"), 3),
            cell(metric::FRAC_ZERO_STD_GROUPS.get(r), 2),
            cell(number(r, "kl_ref"), 5),
            cell(metric::RESPONSE_LENGTH_MEAN.get(r), 0),
            cell(number(r, "val_accuracy_id"), 3),
            cell(number(r, "val_accuracy_ood"), 3),
            cell(number(r, "val_accuracy_op3"), 2),
            cell(number(r, "val_accuracy_op4"), 2),
            cell(number(r, "val_accuracy_op5"), 2),
        );
    }
    let rewards: Vec<f64> = records.iter().filter_map(|r| number(r, "reward_mean")).collect();
    if rewards.len() >= 10 {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let fifth = rewards.len() / 5;
        println!(
            "mean reward, first {fifth} steps {:.3} -> last {fifth} steps {:.3}",
            mean(&rewards[..fifth]),
            mean(&rewards[rewards.len() - fifth..])
        );
    }
    let diff = records.iter().filter_map(|r| metric::LOGPROB_DIFF_MAX.get(r)).fold(0.0, f64::max);
    println!("max |sampler log-prob - learner log-prob| over the run: {diff:.2e}");
}
