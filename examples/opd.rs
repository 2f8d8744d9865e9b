//! On-policy distillation end to end on the CPU backend: the GRPO model of `examples/rl.rs`
//! (the teacher) is distilled into the pre-trained model it started from (the student).
//!
//! The student samples responses to the op 3–5 prompts; the teacher scores the sampled tokens;
//! each token's advantage is `−(log π_student − log π_teacher)` (no discount, no group
//! normalisation) in the same clipped surrogate as GRPO, plus the k3 KL to the frozen initial
//! student (the release's "opd_refkl"). Checkpoints go to `release/opd_refkl/op3_5_step<N>`.
//! Prints the teacher-KL curve and the validation accuracy of student, teacher and result.
//!
//! ```text
//! cargo run --release --example rl            # first: data, pre-training, GRPO
//! cargo run --release --example opd -- [--work DIR] [--teacher DIR --student DIR] [--steps 30]
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use burn::backend::Autodiff;
use clap::Parser;
use kiln::backends::Cpu;
use kiln::generate::model_eos_ids;
use kiln::model::{Qwen2Config, hf};
use kiln::rl::validate::{ValidationSettings, Validator};
use kiln::train::metrics as metric;
use kiln::rl::{Method, PgConfig};
use kiln::tokenizer::Tokenizer;
use kiln::train::checkpoint::latest_named;
use kiln::train::trainer::read_metrics;
use serde_json::Value;

#[derive(Debug, Parser)]
struct Args {
    /// The working directory of `examples/rl.rs`.
    #[arg(long, default_value_os_t = std::env::temp_dir().join("kiln-rl-example"))]
    work: PathBuf,
    /// Teacher checkpoint (default: the last GRPO checkpoint of the work directory).
    #[arg(long)]
    teacher: Option<PathBuf>,
    /// Student checkpoint (default: the last pre-training checkpoint of the work directory).
    #[arg(long)]
    student: Option<PathBuf>,
    /// OPD steps (8 prompts × 4 responses each, two optimizer updates).
    #[arg(long, default_value_t = 30)]
    steps: u64,
    #[arg(long, default_value_t = 1e-4)]
    lr: f64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let work = &args.work;
    let hint = "run `cargo run --release --example rl` first, or pass --teacher and --student";
    let find = |dir: &str, run: Option<&str>| -> Result<PathBuf> {
        let found = latest_named(&work.join(dir), run)?;
        found.map(|(_, path)| path).with_context(|| format!("no checkpoint in {}: {hint}", work.join(dir).display()))
    };
    let teacher = match &args.teacher {
        Some(t) => t.clone(),
        None => find("release/rl", Some("op3_5"))?,
    };
    let student = match &args.student {
        Some(s) => s.clone(),
        None => find("release/pretrain", None)?,
    };
    let data = work.join("data");
    anyhow::ensure!(data.join("heldout").is_dir() && data.join("val").is_dir(), "no data in {}: {hint}", data.display());

    eprintln!("[1/3] OPD: teacher {}, student {}", teacher.display(), student.display());
    let path = work.join("opd.toml");
    let text = opd_toml(&student, &teacher, args.steps, args.lr);
    std::fs::write(&path, &text)?;
    let config = PgConfig::from_toml(&path, &text)?;
    let summary = kiln::rl::run::<Autodiff<Cpu>>(&config, Method::Opd, &Default::default(), true, |_| {}, |record| {
        if let Some(kl) = record.get("teacher_kl").and_then(Value::as_f64) {
            eprintln!("      step {:>3}: teacher KL {kl:.4}, {:.0} s", record["step"], metric::STEP_S.get(record).unwrap_or(0.0));
        }
    })?;
    eprintln!("      {} steps in {:.0} s", summary.steps, summary.elapsed.as_secs_f64());

    eprintln!("[2/3] the teacher on the same validation set");
    let teacher_accuracy = validate(&teacher, &data.join("val"))?;

    eprintln!("[3/3] results");
    let records = read_metrics(&work.join("release/opd_refkl/op3_5_metrics.jsonl"))?;
    print_curve(&records, &teacher_accuracy);
    Ok(())
}

/// OPD on op 3–5: the RL run's prompts, 8 per step with 4 responses each.
fn opd_toml(student: &Path, teacher: &Path, steps: u64, lr: f64) -> String {
    format!(
        r#"# Written by examples/opd.rs; rerun with `kiln opd --config opd.toml --resume`.
[model]
from = {student:?}

[data]
dir = "data/heldout"
ops = [3, 4, 5]
max_prompt_length = 512

[rollout]
n = 4
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

[teacher]
path = {teacher:?}

[output]
dir = "release/opd_refkl"
name = "op3_5"
save_freq = 10

[validation]
dir = "data/val"
every = 10
id_max_op = 4
"#
    )
}

/// Greedy validation accuracy of a checkpoint (the runs' validator).
fn validate(model_dir: &Path, val: &Path) -> Result<serde_json::Map<String, Value>> {
    let device = Default::default();
    let model = hf::load::<Cpu>(model_dir, &device)?;
    let tokenizer = Tokenizer::from_file(model_dir)?;
    let eos = model_eos_ids(model_dir, &Qwen2Config::from_file(model_dir.join("config.json"))?, Some(&tokenizer))?;
    let settings = ValidationSettings { id_max_level: Some(4), rows_per_op: None, max_prompt_length: 512, max_new_tokens: 256, batch_size: 128, kv_memory: None, max_prefill_tokens: kiln::generate::MAX_PREFILL_TOKENS };
    let validator = Validator::load(val, &tokenizer, eos, &settings)?;
    Ok(validator.evaluate(&model)?)
}

fn print_curve(records: &[serde_json::Map<String, Value>], teacher: &serde_json::Map<String, Value>) {
    let number = |r: &serde_json::Map<String, Value>, k: &str| r.get(k).and_then(Value::as_f64);
    let cell = |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    println!("| step | teacher KL (per token) | KL to ref | response length | val acc ID (op 2-4) | val acc OOD (op 5-6) |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for r in records {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r["step"],
            cell(number(r, "teacher_kl"), 4),
            cell(number(r, "kl_ref"), 5),
            cell(metric::RESPONSE_LENGTH_MEAN.get(r), 0),
            cell(number(r, "val_accuracy_id"), 3),
            cell(number(r, "val_accuracy_ood"), 3),
        );
    }
    println!(
        "teacher: val acc ID {} OOD {}",
        cell(number(teacher, "val_accuracy_id"), 3),
        cell(number(teacher, "val_accuracy_ood"), 3)
    );
    let diff = records.iter().filter_map(|r| metric::LOGPROB_DIFF_MAX.get(r)).fold(0.0, f64::max);
    println!("max |sampler log-prob - learner log-prob| over the run: {diff:.2e}");
}
