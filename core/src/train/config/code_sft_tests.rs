//! The code-SFT study's configs (`examples/configs/code_sft/`) against the study's numbers
//! (spec code-sft.md §4.3, §5.3, §9): model, data and split, completion-only loss, effective
//! batch 18, the baseline's 60-step cosine, the candidate's cosine through step 120 held at
//! 1e-6, its milestones, safety cap, wall-clock stop and validation steps.

use std::path::Path;

use crate::data::sft_source::SftColumns;
use crate::model::{Dtype, Qwen2Config};
use crate::plan::{PlanRequest, plan};
use crate::train::Precision;
use crate::train::config::{DataSection, ScheduleKind};
use crate::train::run::{RunConfig, Sections, loop_config};

fn study(name: &str) -> RunConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/configs/code_sft").join(name);
    RunConfig::from_toml(&path, &std::fs::read_to_string(&path).unwrap()).unwrap_or_else(|e| panic!("{e}"))
}

/// What both recipes share: model, data, held-out rows, loss columns, batch, optimizer.
fn assert_shared(config: &RunConfig) {
    assert!(config.model.from.as_ref().unwrap().ends_with("Qwen2.5-Coder-1.5B-Instruct"));
    let DataSection::Sft(sft) = &config.data else { panic!("{:?}", config.data) };
    assert!(sft.path.ends_with("codeforces-cots/data/solutions_py_decontaminated/train-*.parquet"));
    // A prompt and a completion column: the loss is on the completion only (§4.3).
    let columns = SftColumns { prompt: Some("prompt".into()), completion: Some("generation".into()), messages: None };
    assert_eq!(sft.columns.as_ref(), Some(&columns));
    assert_eq!((sft.heldout, sft.split_key.as_deref()), (Some(128), None), "128 held out by sha256(id)");
    let (micro, accum) = (config.train.micro_batch, config.train.grad_accum);
    assert_eq!(micro * accum, 18, "effective batch 18");
    assert_eq!((config.optimizer.lr, config.optimizer.max_grad_norm), (1e-5, Some(0.2)));
    // f32 masters and AdamW state (spec §5.5), bf16 compute, recomputation.
    assert_eq!((config.train.precision, config.train.precision.weights(), config.train.recompute), (Precision::Bf16Mixed, Dtype::F32, true));
    // The comment's memory figure: max_length fits one 80 GB GPU (74.5 GiB) with recompute.
    let model = Qwen2Config::from_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/configs/qwen2.5-coder-1.5b/config.json")).unwrap();
    let peak_gib = |seq| {
        let request = PlanRequest { batch: micro, seq, precision: Precision::Bf16Mixed, devices: 1, recompute: true, cpu_kernels: false, gpu_kernels: true };
        plan(&model, request).training_peak / (1u64 << 30) as f64
    };
    let peak = peak_gib(sft.max_length.unwrap());
    assert!((28.1..28.3).contains(&peak) && peak < 74.5, "{peak} GiB");
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1e-12)
}

#[test]
fn the_baseline_is_60_cosine_steps() {
    let config = study("baseline.toml");
    assert_shared(&config);
    assert_eq!(config.train.steps, Some(60));
    assert_eq!(config.schedule.kind, ScheduleKind::Cosine);
    let schedule = config.schedule.build(config.optimizer.lr, 60).unwrap();
    let lr = |k| schedule.lr(config.optimizer.lr, k);
    // Warm-up ceil(0.03 · 60) = 2: HF's λ(0) = 0, λ(1) = 0.5; then cosine over 58 updates.
    assert_eq!((schedule.warmup_steps, lr(0), lr(1), lr(2)), (2, 0.0, 5e-6, 1e-5));
    assert!(close(lr(31), 5e-6), "{}", lr(31));
    assert!(lr(59) < 1e-8, "cosine to 0 at the end: {}", lr(59));
    let policy = config.output.save_policy();
    assert!(policy.saves(60, 60) && !policy.saves(59, 60));
    assert_eq!(config.output.time_budget().unwrap(), None);
}

#[test]
fn the_candidate_holds_1e_6_after_step_120_until_the_clock_stops_it() {
    let config = study("candidate.toml");
    assert_shared(&config);
    assert_eq!(config.train.steps, Some(100_000), "the safety cap");
    let sections = Sections { optimizer: &config.optimizer, schedule: &config.schedule, output: &config.output };
    let l = loop_config(sections, 100_000, config.eval.every, None, serde_json::Value::Null).unwrap();
    let lr = |k| l.schedule.lr(l.optimizer.lr, k);
    assert_eq!((l.schedule.warmup_steps, lr(0), lr(4)), (4, 0.0, 1e-5));
    // Cosine from step 4 to 120: halfway (k = 62) at 5e-6; λ(119) is below the floor.
    assert!(close(lr(62), 5e-6), "{}", lr(62));
    // Reading (i), max(1e-6, cosine): the floor binds once the cosine falls under it (k ≈ 97).
    assert!(lr(90) > 1e-6 && lr(90) < 2e-6, "{}", lr(90));
    for k in [100, 119, 120, 121, 840, 99_999] {
        assert_eq!(lr(k), 1e-6, "held at 1e-6 at step {k}");
    }
    // Milestones 60 and 120, the wall-clock stop saves (the trainer saves when it stops), and
    // no other saves before the cap.
    assert!(l.save.saves(60, 100_000) && l.save.saves(120, 100_000) && l.save.saves(100_000, 100_000));
    assert!(!l.save.saves(841, 100_000) && !l.save.saves(180, 100_000));
    assert!(l.time_budget.is_some_and(|t| t.as_secs() > 0));
    // Validation NLL before the first update and at the milestones (and at the stop step).
    assert_eq!((config.eval.every, config.eval.steps.as_slice()), (None, &[0, 60, 120][..]));
}
