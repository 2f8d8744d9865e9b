//! Data-parallel replicas in one process (two Flex "devices", burn-collective's local level):
//! two replicas with micro-batch b give the weights of one device with micro-batch 2b, for the
//! plain and the token-weighted next-token loss, with clipping and a schedule; every replica
//! ends with the same weights; a resumed replicated run equals an uninterrupted one; sharding
//! the optimizer state (ZeRO-1) changes none of it.

mod common;

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use burn::backend::Autodiff;
use common::fixture;
use kiln::backends::Cpu;
use kiln::data::Sample;
use kiln::data::packing::pack_ffd;
use kiln::dist::{self, Replica};
use kiln::model::{Qwen2, Qwen2Config};
use kiln::train::trainer::{read_metrics, train_replica};
use kiln::train::{AdamWConfig, Decay, LoopConfig, NextTokenLoss, Precision, SavePolicy, Schedule, Start};
use serde_json::Value;

type B = Autodiff<Cpu>;

fn model_config() -> Qwen2Config {
    serde_json::from_str(
        r#"{"vocab_size": 2200, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": true,
            "max_position_embeddings": 128, "rope_theta": 1000000.0, "eos_token_id": 3}"#,
    )
    .unwrap()
}

/// Packed blocks of the reference texts; with `prompts`, the first third of every block is not a
/// target and blocks have different lengths (SFT's completion-only, token-weighted loss).
fn samples(prompts: bool) -> Vec<Sample> {
    let text = std::fs::read_to_string(fixture("interplay/text.jsonl")).unwrap();
    let ids: Vec<Vec<u32>> = text
        .lines()
        .take(40)
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect())
        .collect();
    pack_ffd(ids, 64, 1000)
        .into_iter()
        .enumerate()
        .map(|(i, block)| match prompts {
            false => Sample::all_targets(block),
            true => {
                let block: Vec<u32> = block[..block.len() - (i * 7) % 30].to_vec();
                let targets = (0..block.len()).map(|t| t >= block.len() / 3).collect();
                Sample { ids: block, targets }
            }
        })
        .collect()
}

/// What a sharding test changes: ZeRO-1 on or off, and the training precision.
#[derive(Debug, Clone, Copy, Default)]
struct Options {
    shard: bool,
    precision: Precision,
}

fn loop_config(out: &Path, steps: u64, budget: Option<Duration>, options: Options) -> LoopConfig {
    LoopConfig {
        schedule: Schedule { warmup_steps: 2, total_steps: steps, decay: Decay::Cosine },
        // A low clipping threshold: every step clips.
        optimizer: AdamWConfig { weight_decay: 0.1, max_grad_norm: Some(0.5), ..AdamWConfig::with_lr(3e-3) },
        save: SavePolicy { every: Some(0.5), ..Default::default() },
        time_budget: budget,
        companions: Some(fixture("interplay/qwen2_100M")),
        run_config: serde_json::json!({"test": true}),
        shard_optimizer: options.shard,
        precision: options.precision,
        ..LoopConfig::new(out, steps, 3e-3)
    }
}

/// One replica's run: `micro_batch × 2` samples per step on each of the `replica.world()`
/// replicas. Replicas other than rank 0 start from another seed (rank 0's start must win).
#[allow(clippy::too_many_arguments)]
fn replica_run(replica: Replica, out: &Path, prompts: bool, micro_batch: usize, steps: u64, budget: Option<Duration>, resume: bool, options: Options) -> Qwen2<B> {
    let config = loop_config(out, steps, budget, options);
    let mut objective = NextTokenLoss::new(samples(prompts), micro_batch, 2, 1, 7).unwrap().shard(replica.rank(), replica.world());
    let device = Default::default();
    let start = match replica.is_main() {
        true => Start::new(&config, resume, &mut objective, &device, || Qwen2::random(&model_config(), 11, &device)).unwrap(),
        false => Start::fresh(&config, &device, || Qwen2::random(&model_config(), 99, &device)).unwrap(),
    };
    train_replica(start, &mut objective, &config, &replica, |_| Ok(Default::default()), |_| {}).unwrap().0
}

/// `replicas` replicas (threads) with micro-batch `micro_batch`; rank 0's final model and every
/// other replica's.
fn replicated(out: &Path, replicas: usize, prompts: bool, micro_batch: usize, steps: u64, budget: Option<Duration>, resume: bool) -> (Qwen2<B>, Vec<Qwen2<B>>) {
    replicated_sharded(out, replicas, prompts, micro_batch, steps, budget, resume, Options::default())
}

/// [`replicated`] with `options`: the optimizer state sharded over the replicas (ZeRO-1), the
/// precision.
#[allow(clippy::too_many_arguments)]
fn replicated_sharded(out: &Path, replicas: usize, prompts: bool, micro_batch: usize, steps: u64, budget: Option<Duration>, resume: bool, options: Options) -> (Qwen2<B>, Vec<Qwen2<B>>) {
    let devices = vec![burn::tensor::Device::<B>::default(); replicas];
    let others = Mutex::new(Vec::new());
    let main = dist::launch(
        &devices,
        None,
        "test",
        |replica, _| Ok(replica_run(replica, out, prompts, micro_batch, steps, budget, resume, options)),
        |replica, _| {
            let model = replica_run(replica, out, prompts, micro_batch, steps, budget, resume, options);
            others.lock().unwrap().push(model.clone());
            Ok(model)
        },
    )
    .unwrap();
    (main, others.into_inner().unwrap())
}

fn losses(out: &Path) -> Vec<f64> {
    read_metrics(&out.join("metrics.jsonl")).unwrap().iter().filter_map(|r| r["loss"].as_f64()).collect()
}

/// The largest ‖a − b‖ / ‖b‖ over the tensors, but the attention's key biases: their exact
/// gradient is zero (softmax ignores a shift shared by all keys), so what they get is f32
/// rounding noise that AdamW scales to ±lr steps, and the summation order of any two
/// implementations (one device with gradient accumulation against one without included) sends
/// them elsewhere (about 1e-4 relative after six steps here).
fn max_relative_difference(a: &Qwen2<B>, b: &Qwen2<B>) -> f64 {
    let (a, b) = (a.to_hf_tensors(), b.to_hf_tensors());
    assert_eq!(a.len(), b.len());
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    a.iter()
        .zip(&b)
        .filter(|((spec, _), _)| !spec.name.ends_with("k_proj.bias"))
        .map(|((spec_a, va), (spec_b, vb))| {
            assert_eq!(spec_a.name, spec_b.name);
            let difference = norm(&mut va.iter().zip(vb).map(|(x, y)| f64::from(x - y)));
            difference / norm(&mut vb.iter().map(|&y| f64::from(y)))
        })
        .fold(0.0, f64::max)
}

fn two_replicas_match_one_device_with_twice_the_batch(prompts: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
    let steps = 6;
    let (single, _) = replicated(&one, 1, prompts, 4, steps, None, false);
    let (main, others) = replicated(&two, 2, prompts, 2, steps, None, false);
    let initial = Qwen2::<B>::random(&model_config(), 11, &Default::default()).unwrap();
    assert!(max_relative_difference(&single, &initial) > 1e-2, "training should move the weights");
    let difference = max_relative_difference(&main, &single);
    assert!(difference <= 1e-6, "2 replicas × micro-batch 2 vs 1 device × 4: weights differ by {difference:e} relative");
    assert_eq!(others.len(), 1);
    assert!(main.to_hf_tensors() == others[0].to_hf_tensors(), "the replicas' weights must be identical");
    // Logged losses (rank 0 writes them, summed over the replicas) and clipping.
    let (a, b) = (losses(&one), losses(&two));
    assert_eq!(a.len(), steps as usize);
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5 * x.abs(), "losses {a:?} vs {b:?}");
    }
    let norms: Vec<f64> = read_metrics(&two.join("metrics.jsonl")).unwrap().iter().map(|r| r["grad_norm"].as_f64().unwrap()).collect();
    assert!(norms.iter().all(|&n| n > 0.5), "every step should clip: {norms:?}");
}

#[test]
fn two_replicas_match_one_device_next_token() {
    two_replicas_match_one_device_with_twice_the_batch(false);
}

#[test]
fn two_replicas_match_one_device_token_weighted() {
    two_replicas_match_one_device_with_twice_the_batch(true);
}

#[test]
fn resumed_replicated_run_equals_an_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let (whole, interrupted) = (tmp.path().join("whole"), tmp.path().join("interrupted"));
    let (model_a, _) = replicated(&whole, 2, true, 2, 6, None, false);
    // A zero time budget stops (and saves) after the first step; resuming finishes the run.
    let (_, _) = replicated(&interrupted, 2, true, 2, 6, Some(Duration::ZERO), false);
    assert!(interrupted.join("checkpoint-1").is_dir());
    let (model_b, others) = replicated(&interrupted, 2, true, 2, 6, None, true);
    assert_eq!(losses(&whole), losses(&interrupted), "per-step losses");
    assert!(model_a.to_hf_tensors() == model_b.to_hf_tensors(), "final weights differ");
    assert!(model_b.to_hf_tensors() == others[0].to_hf_tensors(), "the replicas' weights must be identical");
}

/// ZeRO-1 (`[train] shard_optimizer`): two replicas that each keep half the AdamW state reach
/// the weights, losses and checkpoints (moments included) of the unsharded run, and a sharded
/// run stopped after its first step resumes to the same; in f32 and in bf16-pure (bf16 weights
/// and moments).
#[test]
fn a_sharded_optimizer_gives_the_unsharded_run() {
    for precision in [Precision::F32, Precision::Bf16Pure] {
        let tmp = tempfile::tempdir().unwrap();
        let (plain, sharded, interrupted) = (tmp.path().join("plain"), tmp.path().join("sharded"), tmp.path().join("interrupted"));
        let (off, on) = (Options { shard: false, precision }, Options { shard: true, precision });
        let (model_a, plain_others) = replicated_sharded(&plain, 2, true, 2, 6, None, false, off);
        // (bf16-pure replicas once drifted apart: the others took rank 0's weights in f32.)
        assert!(model_a.to_hf_tensors() == plain_others[0].to_hf_tensors(), "{precision:?}: the unsharded replicas' weights must be identical");
        let (model_b, others) = replicated_sharded(&sharded, 2, true, 2, 6, None, false, on);
        assert_eq!(losses(&plain), losses(&sharded), "{precision:?}: per-step losses");
        assert!(model_a.to_hf_tensors() == model_b.to_hf_tensors(), "{precision:?}: final weights differ");
        assert!(model_b.to_hf_tensors() == others[0].to_hf_tensors(), "{precision:?}: the replicas' weights must be identical");
        for checkpoint in ["checkpoint-3", "checkpoint-6"] {
            let moments = |run: &Path| std::fs::read(run.join(checkpoint).join("optimizer.safetensors")).unwrap();
            assert!(moments(&plain) == moments(&sharded), "{precision:?} {checkpoint}: the sharded run saved other optimizer state");
        }
        let held = |run: &Path| -> Vec<f64> { read_metrics(&run.join("metrics.jsonl")).unwrap().iter().filter_map(|r| r["optimizer_state_values"].as_f64()).collect() };
        let (whole, half) = (held(&plain), held(&sharded));
        assert_eq!((whole.len(), half.len()), (6, 6));
        for (w, h) in whole.iter().zip(&half) {
            assert!((h - w / 2.0).abs() <= 2.0, "{precision:?}: a replica held {h} optimizer values, of {w} unsharded");
        }
        let (_, _) = replicated_sharded(&interrupted, 2, true, 2, 6, Some(Duration::ZERO), false, on);
        assert!(interrupted.join("checkpoint-1").is_dir());
        let (model_c, _) = replicated_sharded(&interrupted, 2, true, 2, 6, None, true, on);
        assert_eq!(losses(&plain), losses(&interrupted), "{precision:?}: resumed per-step losses");
        assert!(model_a.to_hf_tensors() == model_c.to_hf_tensors(), "{precision:?}: resumed final weights differ");
    }
}

/// A failing replica stops the others with its error instead of leaving them waiting.
#[test]
fn a_failing_replica_stops_the_others() {
    let devices = vec![burn::tensor::Device::<B>::default(); 2];
    let err = dist::launch(
        &devices,
        None,
        "test",
        |replica, _| {
            replica.barrier()?;
            replica.barrier()
        },
        |replica, _| {
            replica.barrier()?;
            Err(kiln::Error::InvalidInput("replica 1 ran out of data".into()))
        },
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "replica 1 ran out of data");
}

