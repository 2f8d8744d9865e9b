//! The training loop on a tiny model: it learns, checkpoints are HF directories with optimizer
//! state, and a resumed run continues bit-identically to an uninterrupted one on the CPU backend.

mod common;

use std::path::Path;
use std::time::Duration;

use burn::backend::Autodiff;
use common::fixture;
use kiln::backends::Cpu;
use kiln::data::Sample;
use kiln::data::packing::pack_ffd;
use kiln::model::{Qwen2, Qwen2Config, hf};
use kiln::train::trainer::{RunSummary, read_metrics};
use kiln::train::{AdamWConfig, Decay, LoopConfig, NextTokenLoss, SavePolicy, Schedule, Start, train};
use serde_json::Value;

type B = Autodiff<Cpu>;

fn config() -> Qwen2Config {
    serde_json::from_str(
        r#"{"vocab_size": 2200, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": true,
            "max_position_embeddings": 128, "rope_theta": 1000000.0, "eos_token_id": 3}"#,
    )
    .unwrap()
}

/// Packed 64-token blocks of the reference texts (token ids from text.jsonl).
fn samples(rows: usize) -> Vec<Sample> {
    let text = std::fs::read_to_string(fixture("interplay/text.jsonl")).unwrap();
    let ids: Vec<Vec<u32>> = text
        .lines()
        .take(rows)
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect())
        .collect();
    pack_ffd(ids, 64, 1000).into_iter().map(Sample::all_targets).collect()
}

fn loop_config(out: &Path, steps: u64, budget: Option<Duration>) -> LoopConfig {
    LoopConfig {
        schedule: Schedule { warmup_steps: 1, total_steps: steps, decay: Decay::Cosine },
        optimizer: AdamWConfig { weight_decay: 0.1, ..AdamWConfig::with_lr(3e-3) },
        save: SavePolicy { every: Some(0.5), ..Default::default() },
        time_budget: budget,
        companions: Some(fixture("interplay/qwen2_100M")),
        run_config: serde_json::json!({"test": true}),
        ..LoopConfig::new(out, steps, 3e-3)
    }
}

fn run(out: &Path, steps: u64, budget: Option<Duration>, resume: bool) -> (Qwen2<B>, RunSummary) {
    run_on::<B>(out, steps, budget, resume)
}

fn run_on<A: burn::tensor::backend::AutodiffBackend>(out: &Path, steps: u64, budget: Option<Duration>, resume: bool) -> (Qwen2<A>, RunSummary) {
    let config = loop_config(out, steps, budget);
    let mut objective = NextTokenLoss::new(samples(40), 2, 2, 1, 7).unwrap();
    let device = Default::default();
    let start = Start::new(&config, resume, &mut objective, &device, || Qwen2::random(&self::config(), 11, &device)).unwrap();
    train(start, &mut objective, &config, |_| Ok(Default::default()), |_| {}).unwrap()
}

/// `[train] recompute` (the backend `run_training_with` picks for it, whose model checkpoints
/// every layer) trains bit-identically: the same losses and final weights.
#[test]
fn recomputed_layers_train_bit_identically() {
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    let tmp = tempfile::tempdir().unwrap();
    let (model_a, _) = run_on::<B>(&tmp.path().join("kept"), 4, None, false);
    let (model_b, _) = run_on::<Autodiff<Cpu, BalancedCheckpointing>>(&tmp.path().join("recomputed"), 4, None, false);
    // The trained model of that backend checkpoints its layers: a forward pass leaves a tape.
    let inputs = kiln::model::HostBatch::right_padded(&[vec![5, 6, 7]], 0).unwrap().to_device(&Default::default());
    let (before, loss) = (kiln::model::checkpoint::taped(), model_b.forward(&inputs).sum());
    assert_eq!(kiln::model::checkpoint::taped(), before + 1, "the forward pass is taped");
    kiln::model::checkpoint::gradients(loss, &model_b);
    assert_eq!(kiln::model::checkpoint::taped(), before);
    let (kept, recomputed) = (losses(&tmp.path().join("kept")), losses(&tmp.path().join("recomputed")));
    assert_eq!(kept.len(), 4);
    assert_eq!(kept, recomputed, "per-step losses");
    let (a, b) = (model_a.to_hf_tensors(), model_b.to_hf_tensors());
    assert!(a.iter().zip(&b).all(|((sa, va), (sb, vb))| sa == sb && va == vb), "final weights differ");
}

fn losses(out: &Path) -> Vec<f64> {
    read_metrics(&out.join("metrics.jsonl")).unwrap().iter().filter_map(|r| r["loss"].as_f64()).collect()
}

#[test]
fn loss_falls_and_checkpoints_are_hf_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pretrain");
    let (_, summary) = run(&out, 30, None, false);
    assert_eq!(summary.steps, 30);
    let losses = losses(&out);
    assert_eq!(losses.len(), 30);
    let (first, last) = (losses[..3].iter().sum::<f64>() / 3.0, losses[27..].iter().sum::<f64>() / 3.0);
    assert!(last < first - 1.0, "loss should fall clearly: {first:.3} → {last:.3}");
    // save_steps 0.5 → checkpoints at 50% and 100%.
    let names: Vec<_> = summary.checkpoints.iter().map(|p| p.file_name().unwrap().to_string_lossy().to_string()).collect();
    assert_eq!(names, ["checkpoint-15", "checkpoint-30"]);
    for file in ["config.json", "model.safetensors", "tokenizer.json", "optimizer.safetensors", "trainer_state.json"] {
        assert!(out.join("checkpoint-30").join(file).is_file(), "{file}");
    }
    hf::load::<Cpu>(out.join("checkpoint-30"), &Default::default()).expect("a checkpoint loads as an HF model");
    // A fresh run never overwrites existing checkpoints.
    let config = loop_config(&out, 30, None);
    let mut objective = NextTokenLoss::new(samples(40), 2, 2, 1, 7).unwrap();
    let err = Start::<B>::new(&config, false, &mut objective, &Default::default(), || unreachable!()).err().unwrap();
    assert!(err.to_string().contains("already holds checkpoints"), "{err}");
}

#[test]
fn resumed_run_is_bit_identical_to_an_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let (whole, interrupted) = (tmp.path().join("whole"), tmp.path().join("interrupted"));
    let (model_a, _) = run(&whole, 8, None, false);

    // A zero time budget stops (and saves) after the first update; resuming finishes the run.
    let (_, first) = run(&interrupted, 8, Some(Duration::ZERO), false);
    assert!(first.stopped_early);
    assert_eq!(first.steps, 1);
    let (model_b, second) = run(&interrupted, 8, None, true);
    assert_eq!(second.steps, 8);

    assert_eq!(losses(&whole), losses(&interrupted), "per-step losses");
    let (a, b) = (model_a.to_hf_tensors(), model_b.to_hf_tensors());
    assert!(a.iter().zip(&b).all(|((sa, va), (sb, vb))| sa == sb && va == vb), "final weights differ");
}

/// Next-token loss whose loss is NaN at one step (index `poisoned`), as a diverging run has.
struct PoisonedStep {
    inner: NextTokenLoss,
    poisoned: u64,
    step: u64,
}

impl kiln::train::Objective<B> for PoisonedStep {
    type Micro = <NextTokenLoss as kiln::train::Objective<B>>::Micro;

    fn updates(&mut self, model: &Qwen2<B>, step: u64) -> kiln::Result<Vec<Vec<Self::Micro>>> {
        self.step = step;
        self.inner.updates(model, step)
    }

    fn loss(&mut self, model: &Qwen2<B>, micro: &Self::Micro) -> kiln::Result<(burn::tensor::Tensor<B, 1>, serde_json::Map<String, Value>)> {
        let (loss, metrics) = self.inner.loss(model, micro)?;
        Ok((if self.step == self.poisoned { loss.mul_scalar(f64::NAN) } else { loss }, metrics))
    }

    fn state(&self) -> Value {
        kiln::train::Objective::<B>::state(&self.inner)
    }

    fn restore(&mut self, state: &Value) -> kiln::Result<()> {
        kiln::train::Objective::<B>::restore(&mut self.inner, state)
    }
}

/// A non-finite gradient norm skips the update (verl's rule): the weights and the optimizer
/// state after that step are those before it, the step is counted in the metrics, and training
/// goes on.
#[test]
fn a_non_finite_gradient_norm_skips_the_update() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let mut config = loop_config(&out, 3, None);
    config.save = SavePolicy { every: Some(1.0), ..Default::default() };
    let mut objective = PoisonedStep { inner: NextTokenLoss::new(samples(40), 2, 2, 1, 7).unwrap(), poisoned: 1, step: 0 };
    let device = Default::default();
    let start = Start::new(&config, false, &mut objective, &device, || Qwen2::random(&self::config(), 11, &device)).unwrap();
    let (model, summary) = train(start, &mut objective, &config, |_| Ok(Default::default()), |_| {}).unwrap();
    assert_eq!(summary.steps, 3);

    let records = read_metrics(&out.join("metrics.jsonl")).unwrap();
    assert_eq!(records[0].get("skipped_updates"), None, "nothing to count before the first skip");
    assert_eq!((records[1]["skipped_updates"].as_u64(), records[1]["grad_norm"].as_f64()), (Some(1), None));
    assert_eq!(records[2]["skipped_updates"].as_u64(), Some(0));
    assert!(records[2]["loss"].as_f64().is_some_and(f64::is_finite));

    let bytes = |step: u64, file: &str| std::fs::read(out.join(format!("checkpoint-{step}")).join(file)).unwrap();
    for file in ["model.safetensors", "optimizer.safetensors"] {
        assert!(bytes(1, file) == bytes(2, file), "{file} changed by the skipped update");
        assert!(bytes(2, file) != bytes(3, file), "{file}: the next update applies");
    }
    let state: Value = serde_json::from_slice(&bytes(2, "trainer_state.json")).unwrap();
    assert_eq!((state["step"].as_u64(), state["optimizer_step"].as_u64()), (Some(2), Some(1)));
    assert!(model.to_hf_tensors().iter().all(|(_, values)| values.iter().all(|v| v.is_finite())));
}

/// `eval_steps` evaluates after the chosen steps, and the step a time budget stops at is
/// evaluated too (its checkpoint's validation signal), while other steps are not.
#[test]
fn chosen_eval_steps_and_the_stop_step_are_evaluated() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("study");
    let mut config = loop_config(&out, 10, None);
    config.eval_steps = vec![2, 3];
    config.save = SavePolicy { milestones: vec![2], last: true, ..Default::default() };
    let device = burn::tensor::Device::<B>::default();
    let mut objective = NextTokenLoss::new(samples(40), 2, 2, 1, 7).unwrap();
    let start = Start::<B>::new(&config, false, &mut objective, &device, || Qwen2::random(&self::config(), 11, &device)).unwrap();
    let mut calls = 0;
    let evaluate = |_: &Qwen2<Cpu>| {
        calls += 1;
        Ok(serde_json::Map::from_iter([("eval_loss".to_owned(), serde_json::json!(calls as f64))]))
    };
    let (_, summary) = train(start, &mut objective, &config, evaluate, |_| {}).unwrap();
    assert_eq!(summary.steps, 10);
    let evaluated: Vec<u64> = read_metrics(&out.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .filter(|r| r.contains_key("eval_loss"))
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(evaluated, [2, 3, 10], "no step-0 evaluation unless 0 is chosen; the last step always");

    // A zero budget stops after the first update: that step is evaluated and saved.
    let out = tmp.path().join("stopped");
    let mut config = loop_config(&out, 100_000, Some(Duration::ZERO));
    config.eval_steps = vec![60, 120];
    let mut objective = NextTokenLoss::new(samples(40), 2, 2, 1, 7).unwrap();
    let start = Start::<B>::new(&config, false, &mut objective, &device, || Qwen2::random(&self::config(), 11, &device)).unwrap();
    let evaluate = |_: &Qwen2<Cpu>| Ok(serde_json::Map::from_iter([("eval_loss".to_owned(), serde_json::json!(1.5))]));
    let (_, summary) = train(start, &mut objective, &config, evaluate, |_| {}).unwrap();
    assert!(summary.stopped_early);
    let records = read_metrics(&out.join("metrics.jsonl")).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!((records[0]["step"].as_u64(), records[0]["eval_loss"].as_f64()), (Some(1), Some(1.5)));
    assert_eq!(summary.checkpoints, [out.join("checkpoint-1")]);
}
