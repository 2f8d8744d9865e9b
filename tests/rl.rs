//! GRPO and on-policy distillation: parity of the advantage, loss and KL formulas with verl's
//! `core_algos.py` (fixtures from `tests/fixtures/make_rl_fixtures.py`), tiny end-to-end runs
//! with release-style checkpoints and bit-identical resume, and the errors users meet.

mod common;

use std::path::{Path, PathBuf};

use burn::backend::Autodiff;
use burn::tensor::{ElementConversion, Tensor, TensorData};
use common::fixture;
use kiln::backends::Cpu;
use kiln::model::hf::{self, SaveDtype};
use kiln::model::{Qwen2, Qwen2Config};
use kiln::generate::Sampler;
use kiln::rl::advantage::{ADV_ESTIMATORS, AdvEstimator, AdvParams, Outcomes, RewardScaling, grpo_advantages};
use kiln::rl::loss::{
    Clip, KlEstimator, LossAgg, POLICY_LOSS_NAMES, PolicyLossConfig, PolicyLossInputs, PolicyLossMode, aggregate, kl_penalty, policy_loss,
    reverse_kl, tis_weights,
};
use kiln::rl::prompts::PromptSet;
use kiln::rl::reward::{Reward, Task};
use kiln::rl::rollout::RolloutSettings;
use kiln::rl::objective::OverlongBuffer;
use kiln::rl::{Method, PgConfig, PgSettings, PolicyGradient, Signal};
use kiln::tokenizer::Tokenizer;
use kiln::train::trainer::{Record, read_metrics};
use kiln::train::{LoopConfig, SavePolicy, Start, train};
use serde_json::Value;

type B = Autodiff<Cpu>;

fn floats(value: &Value) -> Vec<f32> {
    fn walk(value: &Value, out: &mut Vec<f32>) {
        match value {
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            v => out.push(v.as_f64().expect("a number") as f32),
        }
    }
    let mut out = Vec::new();
    walk(value, &mut out);
    out
}

fn matrix(value: &Value) -> Tensor<B, 2> {
    let rows = value.as_array().unwrap().len();
    let values = floats(value);
    let cols = values.len() / rows;
    Tensor::from_data(TensorData::new(values, [rows, cols]), &Default::default())
}

fn host(tensor: Tensor<impl burn::tensor::backend::Backend, 2>) -> Vec<f32> {
    tensor.into_data().convert::<f32>().into_vec().unwrap()
}

fn scalar(tensor: Tensor<B, 1>) -> f64 {
    tensor.into_scalar().elem::<f64>()
}

/// Agreement to 1e-6 (relative to values above 1, which the k2 estimator reaches).
fn close(a: f64, b: f64, what: &str) {
    assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{what}: {a} vs {b}");
}

fn assert_close(ours: &[f32], expected: &[f32], what: &str) {
    assert_eq!(ours.len(), expected.len(), "{what}: length");
    for (i, (a, b)) in ours.iter().zip(expected).enumerate() {
        close(f64::from(*a), f64::from(*b), &format!("{what}[{i}]"));
    }
}

fn agg(name: &str) -> LossAgg {
    serde_json::from_value(Value::String(name.into())).unwrap()
}

#[test]
fn advantages_losses_and_kl_match_verl() {
    let path = fixture("rl/core_algos.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();

    for case in fixture["advantages"].as_array().unwrap() {
        let scores: Vec<f64> = floats(&case["scores"]).iter().map(|&s| f64::from(s)).collect();
        let groups: Vec<usize> = case["groups"].as_array().unwrap().iter().map(|g| g.as_u64().unwrap() as usize).collect();
        let scaling: RewardScaling = serde_json::from_value(case["scaling"].clone()).unwrap();
        let ours: Vec<f32> = grpo_advantages(&scores, &groups, scaling, 1e-6).iter().map(|&a| a as f32).collect();
        assert_close(&ours, &floats(&case["advantages"]), &format!("advantages ({scaling:?})"));
    }

    let pl = &fixture["policy_loss"];
    let (mask, old, advantages) = (matrix(&pl["mask"]), matrix(&pl["old_log_prob"]), matrix(&pl["advantages"]));
    let width = mask.dims()[1];
    for case in pl["cases"].as_array().unwrap() {
        let clip = Clip {
            low: case["clip_low"].as_f64().unwrap(),
            high: case["clip_high"].as_f64().unwrap(),
            dual: case["clip_c"].as_f64().unwrap(),
        };
        let mode = agg(case["agg"].as_str().unwrap());
        let what = format!("{mode:?} {clip:?}");
        let log_prob = matrix(&pl["log_prob"]).require_grad();
        let out = policy_loss(log_prob.clone(), old.clone(), advantages.clone(), &mask, clip, mode, width);
        let grads = out.loss.clone().backward();
        close(scalar(out.loss), case["pg_loss"].as_f64().unwrap(), &format!("pg_loss {what}"));
        let clipfrac = scalar(out.clipfrac);
        close(clipfrac, case["pg_clipfrac"].as_f64().unwrap(), &format!("pg_clipfrac {what}"));
        close(scalar(out.clipfrac_low) + scalar(out.clipfrac_high), clipfrac, &format!("low + high clip {what}"));
        close(scalar(out.ppo_kl), case["ppo_kl"].as_f64().unwrap(), &format!("ppo_kl {what}"));
        close(scalar(out.clipfrac_dual), case["pg_clipfrac_lower"].as_f64().unwrap(), &format!("pg_clipfrac_lower {what}"));
        let grad = host(log_prob.grad(&grads).unwrap());
        assert_close(&grad, &floats(&case["grad_log_prob"]), &format!("d pg_loss / d log_prob {what}"));
    }

    let kl = &fixture["kl"];
    let (mask, reference) = (matrix(&kl["mask"]), matrix(&kl["ref_log_prob"]));
    for case in kl["cases"].as_array().unwrap() {
        let estimator: KlEstimator = serde_json::from_value(case["kind"].clone()).unwrap();
        let mode = agg(case["agg"].as_str().unwrap());
        let log_prob = matrix(&kl["log_prob"]).require_grad();
        let per_token = kl_penalty(log_prob.clone(), reference.clone(), estimator);
        let loss = aggregate(per_token.clone(), &mask, mode, width);
        let grads = loss.clone().backward();
        assert_close(&host(per_token), &floats(&case["kl"]), &format!("{estimator:?} per token"));
        close(scalar(loss), case["loss"].as_f64().unwrap(), &format!("{estimator:?} {mode:?}"));
        assert_close(&host(log_prob.grad(&grads).unwrap()), &floats(&case["grad_log_prob"]), &format!("d {estimator:?} / d log_prob"));
    }
    // verl's own names select the same estimators.
    assert_eq!(serde_json::from_str::<KlEstimator>("\"low_var_kl\"").unwrap(), KlEstimator::K3);
    assert_eq!(serde_json::from_str::<KlEstimator>("\"mse\"").unwrap(), KlEstimator::K2);

    let rk = &fixture["reverse_kl"];
    let logits = |v: &Value| {
        let dims = [2, 3, v[0][0].as_array().unwrap().len()];
        Tensor::<B, 3>::from_data(TensorData::new(floats(v), dims), &Default::default())
    };
    let ours = reverse_kl(logits(&rk["student_logits"]), logits(&rk["teacher_logits"]));
    assert_close(&host(ours), &floats(&rk["reverse_kl"]), "full-vocabulary reverse KL");
}

/// verl 0.9.1's own `kl_penalty` (k1, k2, k3 and its name low_var_kl, with k3's clamps) and
/// its DAPO reward manager's overlong shaping (`tests/fixtures/make_verl_core_algos.py`,
/// `rl/verl_kl_dapo.json`): kiln's KL terms and gradients, and its shaped rewards.
#[test]
fn kl_penalties_and_dapo_overlong_shaping_match_verl_091() {
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(fixture("rl/verl_kl_dapo.json")).unwrap()).unwrap();
    let kl = &fixture["kl"];
    let reference = matrix(&kl["ref_log_prob"]);
    for (name, case) in kl["cases"].as_object().unwrap() {
        let estimator: KlEstimator = serde_json::from_value(Value::String(name.clone())).unwrap();
        let log_prob = matrix(&kl["log_prob"]).require_grad();
        let per_token = kl_penalty(log_prob.clone(), reference.clone(), estimator);
        let grads = per_token.clone().sum().backward();
        assert_close(&host(per_token), &floats(&case["kl"]), &format!("verl's kl_penalty {name}"));
        assert_close(&host(log_prob.grad(&grads).unwrap()), &floats(&case["grad_log_prob"]), &format!("d kl_penalty {name} / d log_prob"));
    }
    let o = &fixture["overlong"];
    let max = o["max_response_length"].as_u64().unwrap() as usize;
    let scores: Vec<f64> = o["scores"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let lengths: Vec<usize> = o["lengths"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    for case in o["cases"].as_array().unwrap() {
        let buffer = OverlongBuffer { enable: true, len: case["len"].as_u64().unwrap() as usize, penalty_factor: case["penalty_factor"].as_f64().unwrap() };
        let ours: Vec<f64> = scores.iter().zip(&lengths).map(|(&s, &n)| s + buffer.penalty(n, max)).collect();
        let verl: Vec<f64> = case["rewards"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        for (a, b) in ours.iter().zip(&verl) {
            assert!((a - b).abs() < 1e-6, "{buffer:?}: {ours:?} vs verl's {verl:?}");
        }
    }
}

/// Agreement to `tol` relative to values above 1 (f32 arithmetic on both sides).
fn near(a: f64, b: f64, tol: f64, what: &str) {
    assert!((a - b).abs() <= tol * b.abs().max(1.0), "{what}: {a} vs {b}");
}

/// verl 0.9.1's own `core_algos.py` (and `rollout_corr_helper.py`) on fixed inputs
/// (`tests/fixtures/make_verl_core_algos.py`): every registered advantage estimator, every
/// registered policy loss under every aggregation, with and without truncated importance
/// sampling — losses, metrics and gradients with respect to `log_prob`.
#[test]
fn estimators_policy_losses_and_aggregations_match_verl_091() {
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(fixture("rl/verl_core_algos.json")).unwrap()).unwrap();
    let tol = 2e-6;

    // Advantages: kiln's one value per response against verl's [responses, tokens] (the value on
    // every response token, 0 on padding).
    let adv = &fixture["advantages"];
    let scores: Vec<f64> = adv["scores"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let groups: Vec<usize> = adv["groups"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    let lengths: Vec<usize> = adv["lengths"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    let width = adv["width"].as_u64().unwrap() as usize;
    let outcomes = Outcomes::new(&scores, &groups, &lengths).unwrap();
    let estimators = adv["estimators"].as_object().unwrap();
    assert_eq!(estimators.len(), ADV_ESTIMATORS.len(), "every registered estimator has a verl reference");
    for (name, expected) in estimators {
        let estimator = AdvEstimator::from_name(name).unwrap();
        let ours = estimator.compute(&outcomes, &AdvParams::default());
        let expected = floats(expected);
        for (i, (&a, &n)) in ours.iter().zip(&lengths).enumerate() {
            for t in 0..width {
                let want = f64::from(expected[i * width + t]);
                let got = if t < n { a } else { 0.0 };
                near(got, want, tol, &format!("{name} advantage [{i}, {t}]"));
            }
        }
    }
    assert!(Outcomes::new(&scores, &groups[1..], &lengths).is_err(), "mismatched inputs are an error, not a panic");

    // Truncated importance sampling weights.
    let pl = &fixture["policy_loss"];
    let (mask, old, advantages, rollout) = (matrix(&pl["mask"]), matrix(&pl["old_log_prob"]), matrix(&pl["advantages"]), matrix(&pl["rollout_log_prob"]));
    let cap = pl["tis_imp_ratio_cap"].as_f64().unwrap();
    let weights = tis_weights(old.clone(), rollout, &mask, cap);
    let expected = floats(&pl["is_weights"]);
    for (i, (a, b)) in host(weights.clone()).iter().zip(&expected).enumerate() {
        near(f64::from(*a), f64::from(*b), tol, &format!("TIS weight [{i}]"));
    }
    assert!(expected.iter().any(|&w| w == cap as f32) && expected.iter().any(|&w| w > 0.0 && w < 1.0), "the cap and sub-1 weights are exercised");

    // Rollout rejection sampling (MIS): verl's kept-token masks, option by option and chained.
    let rejections = pl["rejection"].as_array().expect("rejection cases: rerun tests/fixtures/make_verl_core_algos.py");
    assert_eq!(rejections.len(), 15);
    for case in rejections {
        let (options, threshold) = (case["rollout_rs"].as_str().unwrap(), case["rollout_rs_threshold"].as_str().unwrap());
        let rejection = kiln::rl::rejection::Rejection::parse(options, threshold).unwrap();
        let kept = host(rejection.apply(old.clone(), matrix(&pl["rollout_log_prob"]), &mask));
        let expected = floats(&case["mask"]);
        assert_eq!(kept, expected, "{options} {threshold}: kept tokens");
        assert!(kept.iter().zip(host(mask.clone())).any(|(k, m)| *k == 0.0 && m == 1.0) && kept.contains(&1.0), "{options}: some tokens rejected, some kept");
    }

    // Policy losses: verl 0.9.1's "seq-mean-token-sum-norm" is kiln's "seq-mean-token-sum-norm-dr".
    let width = mask.dims()[1];
    let mut seen = std::collections::BTreeSet::new();
    for case in pl["cases"].as_array().unwrap() {
        let name = case["policy_loss"].as_str().unwrap();
        let agg_name = match case["loss_agg_mode"].as_str().unwrap() {
            "seq-mean-token-sum-norm" => "seq-mean-token-sum-norm-dr",
            other => other,
        };
        seen.insert(name.to_string());
        let config = PolicyLossConfig {
            clip: Clip { low: case["clip_low"].as_f64().unwrap(), high: case["clip_high"].as_f64().unwrap(), dual: case["clip_c"].as_f64().unwrap() },
            agg: agg(agg_name),
            max_response_length: width,
        };
        let tis = case["tis"].as_bool().unwrap();
        let what = format!("{name} {agg_name} {:?} tis {tis}", config.clip);
        let log_prob = matrix(&pl["log_prob"]).require_grad();
        let inputs = PolicyLossInputs {
            log_prob: log_prob.clone(),
            old_log_prob: old.clone(),
            advantages: advantages.clone(),
            mask: mask.clone(),
            is_weights: tis.then(|| weights.clone()),
        };
        let out = PolicyLossMode::from_name(name).unwrap().compute(inputs, &config);
        let grads = out.loss.clone().backward();
        near(scalar(out.loss), case["pg_loss"].as_f64().unwrap(), tol, &format!("pg_loss {what}"));
        let clipfrac = scalar(out.clipfrac);
        near(clipfrac, case["pg_clipfrac"].as_f64().unwrap(), tol, &format!("pg_clipfrac {what}"));
        near(scalar(out.clipfrac_low) + scalar(out.clipfrac_high), clipfrac, tol, &format!("low + high clip {what}"));
        near(scalar(out.ppo_kl), case["ppo_kl"].as_f64().unwrap(), tol, &format!("ppo_kl {what}"));
        near(scalar(out.clipfrac_dual), case["pg_clipfrac_lower"].as_f64().unwrap(), tol, &format!("pg_clipfrac_lower {what}"));
        let grad = host(log_prob.grad(&grads).unwrap());
        for (i, (a, b)) in grad.iter().zip(&floats(&case["grad_log_prob"])).enumerate() {
            near(f64::from(*a), f64::from(*b), tol, &format!("d pg_loss / d log_prob [{i}] {what}"));
        }
    }
    assert_eq!(seen.len(), POLICY_LOSS_NAMES.len(), "every registered policy loss has a verl reference: {seen:?}");

    // Aggregations alone.
    let ag = &fixture["aggregation"];
    let (losses, mask) = (matrix(&ag["loss_mat"]), matrix(&ag["mask"]));
    for (name, expected) in ag["losses"].as_object().unwrap() {
        let ours = if name == "seq-mean-token-sum-norm" { "seq-mean-token-sum-norm-dr" } else { name.as_str() };
        let value = scalar(aggregate(losses.clone(), &mask, agg(ours), width));
        near(value, expected.as_f64().unwrap(), tol, &format!("agg_loss {name}"));
    }
    // The seed's (verl 0.5.0) seq-mean-token-sum-norm keeps its name: a sum over sequences, the
    // 0.9.1 mode times the number of sequences.
    let seed_norm = scalar(aggregate(losses.clone(), &mask, agg("seq-mean-token-sum-norm"), width));
    let rows = mask.dims()[0] as f64;
    near(seed_norm, ag["losses"]["seq-mean-token-sum-norm"].as_f64().unwrap() * rows, tol, "the seed's seq-mean-token-sum-norm");
}

/// A random tiny Qwen2 with the paper's tokenizer (or none) in `dir`.
fn tiny_model(dir: &Path, seed: u64, tokenizer: Option<&Path>) {
    let config: Qwen2Config = serde_json::from_str(
        r#"{"vocab_size": 2200, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": true,
            "max_position_embeddings": 512, "rope_theta": 1000000.0, "eos_token_id": 3}"#,
    )
    .unwrap();
    let model = Qwen2::<Cpu>::random(&config, seed, &Default::default()).unwrap();
    hf::save(&model, dir, SaveDtype::F32, tokenizer).unwrap();
}

fn paper_tokenizer() -> PathBuf {
    fixture("interplay/qwen2_100M")
}

/// A GRPO (or, with `teacher`, OPD) config over op 2–3 rows: 4 prompts × 2 samples per step in
/// two optimizer updates of two micro-batches each; validation on one row of op 2, 3 and 12.
fn config_text(work: &Path, out: &str, teacher: Option<(&Path, bool)>, extra_output: &str) -> String {
    let rows = fixture("interplay/rows");
    let val = work.join("val");
    std::fs::create_dir_all(&val).unwrap();
    for op in [2, 3, 12] {
        let first = std::fs::read_to_string(rows.join(format!("op{op}.jsonl"))).unwrap().lines().next().unwrap().to_string();
        std::fs::write(val.join(format!("op{op}-1.jsonl")), first + "\n").unwrap();
    }
    let signal = match teacher {
        Some((path, full_vocab)) => format!("[teacher]\npath = {:?}\nfull_vocab = {full_vocab}\n", path),
        None => "[reward]\nkind = \"outcome\"\n".into(),
    };
    format!(
        r#"[model]
from = {model:?}

[data]
files = [{op2:?}, {op3:?}]
max_prompt_length = 300
seed = 3

[rollout]
n = 2
max_response_length = 12

[train]
steps = 3
prompts_per_step = 4
mini_batch = 2
micro_batch = 2
lr = 1e-3

{signal}
[output]
dir = {out:?}
name = "op2_3"
save_freq = 1
{extra_output}

[validation]
dir = {val:?}
every = 2
max_new_tokens = 8
"#,
        model = work.join("base"),
        op2 = rows.join("op2.jsonl"),
        op3 = rows.join("op3.jsonl"),
        out = work.join(out),
    )
}

fn run(work: &Path, text: &str, method: Method, resume: bool) -> kiln::Result<kiln::train::trainer::RunSummary> {
    run_on::<B>(work, text, method, resume)
}

fn run_on<A: burn::tensor::backend::AutodiffBackend>(work: &Path, text: &str, method: Method, resume: bool) -> kiln::Result<kiln::train::trainer::RunSummary>
where
    A::Device: Default,
{
    let path = work.join("run.toml");
    std::fs::write(&path, text).unwrap();
    let config = PgConfig::from_toml(&path, text)?;
    kiln::rl::run::<A>(&config, method, &Default::default(), resume, |_| {}, |_| {})
}

/// The library's progress stages, recorded (the reporter is global: other tests' stages land
/// here too, so each test picks its own by name).
#[derive(Clone, Default)]
struct Stages(std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>, String);

impl Stages {
    fn install() -> Self {
        let stages = Self::default();
        kiln::progress::set_reporter(Some(std::sync::Arc::new(stages.clone())));
        stages
    }

    fn of(&self, what: &str) -> Vec<String> {
        self.0.lock().unwrap().iter().filter(|(w, _)| w == what).map(|(_, e)| e.clone()).collect()
    }
}

impl kiln::progress::Reporter for Stages {
    fn start(&self, what: &str, total: u64, unit: &str) -> Box<dyn kiln::progress::StageSink> {
        self.0.lock().unwrap().push((what.to_owned(), format!("start {total} {unit}")));
        Box::new(Stages(self.0.clone(), what.to_owned()))
    }
}

impl kiln::progress::StageSink for Stages {
    fn set_position(&self, position: u64) {
        self.0.lock().unwrap().push((self.1.clone(), format!("at {position}")));
    }
    fn finish(&self) {
        self.0.lock().unwrap().push((self.1.clone(), "finish".to_owned()));
    }
}

/// Metrics without wall-clock measurements.
fn deterministic(records: Vec<Record>) -> Vec<Record> {
    records
        .into_iter()
        .map(|r| r.into_iter().filter(|(k, _)| !(k.ends_with("_s") || k == "rss_mib")).collect())
        .collect()
}

#[test]
fn grpo_end_to_end_writes_release_checkpoints_and_resumes_bit_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    tiny_model(&work.join("base"), 1, Some(&paper_tokenizer()));

    let stages = Stages::install();
    let summary = run(work, &config_text(work, "whole", None, ""), Method::Grpo, false).unwrap();
    assert_eq!(summary.steps, 3);
    // Validation (before step 1 and after step 2) reports its completions as they finish, to
    // the end (`kiln::progress`; the CLI draws it as a bar with an ETA).
    let events = stages.of("validation");
    assert!(events.iter().filter(|e| e.starts_with("start ")).count() >= 2, "{events:?}");
    let total = events[0].strip_prefix("start ").and_then(|e| e.split(' ').next()).unwrap().to_owned();
    assert!(total != "0" && events.contains(&format!("at {total}")) && events.contains(&"finish".to_owned()), "{events:?}");
    let whole = work.join("whole");
    for step in 1..=3 {
        hf::load::<Cpu>(whole.join(format!("op2_3_step{step}")), &Default::default()).expect("an HF model directory");
    }
    let records = read_metrics(&whole.join("op2_3_metrics.jsonl")).unwrap();
    assert_eq!(records.len(), 4, "validation before training, then one record per step");
    assert!(["val_accuracy_id", "val_accuracy_ood", "val_accuracy_op12"].iter().all(|k| records[0].get(*k).is_some_and(Value::is_number)));
    for key in [
        "reward_mean", "reward_std", "frac_zero_std_groups", "advantage_mean", "clipfrac", "clipfrac_low", "clipfrac_high",
        "clipfrac_dual", "kl_ref", "entropy", "response_length_mean", "rollout_tokens_per_s", "update_tokens_per_s",
        "step_s", "logprob_diff_max",
    ] {
        assert!(records[1].get(key).is_some_and(Value::is_number), "{key} missing: {:?}", records[1]);
    }
    assert_eq!(records[1]["updates"], 2);
    assert_eq!(records[1]["responses"], 8);
    // The step's 4 prompts in one prefill pass (the default bound, 8,192 tokens), their blocks in
    // the paged KV cache.
    assert_eq!(records[1]["rollout_prefill_passes"].as_f64(), Some(1.0), "{:?}", records[1]);
    assert!(records[1]["rollout_kv_mib_max"].as_f64().is_some_and(|m| m > 0.0), "{:?}", records[1]);
    // The first update starts from the rollout policy itself: the ratio is exactly 1.
    let diff = records[1]["logprob_diff_max"].as_f64().unwrap();
    assert!(diff <= 1e-5, "sampler vs learner log-probs differ by {diff}");

    // Stopped by the time budget after one step (and saved), then resumed.
    let interrupted = config_text(work, "interrupted", None, "time_budget_s = 0.0");
    let first = run(work, &interrupted, Method::Grpo, false).unwrap();
    assert!(first.stopped_early && first.steps == 1);
    let err = run(work, &config_text(work, "interrupted", None, ""), Method::Grpo, false).unwrap_err();
    assert!(err.to_string().contains("already holds checkpoints"), "{err}");
    // (refused before the replicas read the data and load the models: a fresh run's rows that
    // do not parse are not reached)
    let bad_rows = work.join("bad_rows.jsonl");
    std::fs::write(&bad_rows, "not json\n").unwrap();
    let op2 = format!("{:?}", fixture("interplay/rows").join("op2.jsonl"));
    let text = config_text(work, "interrupted", None, "").replace(&op2, &format!("{bad_rows:?}"));
    assert!(text.contains("bad_rows.jsonl"));
    let err = run(work, &text, Method::Grpo, false).unwrap_err();
    assert!(err.to_string().contains("already holds checkpoints"), "{err}");
    run(work, &config_text(work, "interrupted", None, ""), Method::Grpo, true).unwrap();
    let resumed = read_metrics(&work.join("interrupted/op2_3_metrics.jsonl")).unwrap();
    assert_eq!(deterministic(records), deterministic(resumed), "metrics of the resumed run");
    let weights = |dir: &str| std::fs::read(work.join(dir).join("op2_3_step3/model.safetensors")).unwrap();
    assert!(weights("whole") == weights("interrupted"), "final weights differ");

    // With recompute (the backend the CLI picks for it: every layer checkpointed), the same run.
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    run_on::<Autodiff<Cpu, BalancedCheckpointing>>(work, &config_text(work, "recomputed", None, ""), Method::Grpo, false).unwrap();
    let recomputed = read_metrics(&work.join("recomputed/op2_3_metrics.jsonl")).unwrap();
    assert_eq!(deterministic(read_metrics(&whole.join("op2_3_metrics.jsonl")).unwrap()), deterministic(recomputed), "metrics with recompute");
    assert!(weights("whole") == weights("recomputed"), "final weights differ with recompute");
}

/// The methods of the named stages together in one tiny GRPO run: GSPO's loss, truncated
/// importance sampling, rollout rejection sampling, DAPO's overlong shaping and dynamic sampling;
/// the metrics file records the TIS weights, the rejected fraction and the filter's generations.
#[test]
fn grpo_with_gspo_tis_overlong_buffer_and_filter_groups_runs_and_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    tiny_model(&work.join("base"), 1, Some(&paper_tokenizer()));
    let text = config_text(work, "dapo", None, "")
        .replace("steps = 3", "steps = 2")
        .replace("max_response_length = 12", "max_response_length = 12\nmax_prefill_tokens = 1\n\n[rollout.filter_groups]\nmax_num_gen_batches = 2")
        .replace(
            "[output]",
            "[loss]\npolicy_loss = \"gspo\"\ntis_imp_ratio_cap = 2.0\nrollout_rs = \"token_k1,seq_max_k3\"\nrollout_rs_threshold = \"0.5_2.0,0.5\"\n\n[loss.overlong_buffer]\nlen = 4\npenalty_factor = 1.0\n\n[output]",
        );
    let config = PgConfig::from_toml(&work.join("run.toml"), &text).unwrap();
    let settings = config.settings();
    assert_eq!((settings.policy_loss.name(), settings.tis_imp_ratio_cap), ("gspo", Some(2.0)));
    assert_eq!(settings.rejection.map(|r| r.criteria().count()), Some(2));
    assert!(settings.overlong_buffer.is_some_and(|o| o.enable && o.len == 4));
    assert!(settings.filter_groups.is_some_and(|f| f.enable && f.max_num_gen_batches == 2));
    assert_eq!(settings.rollout.max_prefill_tokens, 1);
    let summary = run(work, &text, Method::Grpo, false).unwrap();
    assert_eq!(summary.steps, 2);
    let records = read_metrics(&work.join("dapo/op2_3_metrics.jsonl")).unwrap();
    assert_eq!(records.len(), 3, "validation before training, then one record per step");
    for record in &records[1..] {
        let number = |k: &str| record.get(k).and_then(Value::as_f64).unwrap_or_else(|| panic!("{k} missing: {record:?}"));
        // min(pi_old / pi_rollout, 2): positive, at most the cap.
        let tis = number("tis_weight_mean");
        assert!(tis > 0.0 && tis <= 2.0, "tis_weight_mean {tis}");
        // Learner and rollout compute alike here: few tokens, if any, are rejected.
        let rejected = number("rollout_rs_masked_fraction");
        assert!((0.0..=1.0).contains(&rejected), "rollout_rs_masked_fraction {rejected}");
        let generations = number("filter_groups_generations");
        assert!((1.0..=2.0).contains(&generations), "filter_groups_generations {generations}");
        // `max_prefill_tokens = 1` reaches the engine: each generation's 4 prompts are
        // prefilled one per pass (the default bound takes them in one).
        assert_eq!(number("rollout_prefill_passes"), 4.0 * generations, "{record:?}");
        let informative = number("filter_groups_informative");
        assert!((0.0..=8.0).contains(&informative), "filter_groups_informative {informative}");
        assert_eq!(record["prompts"], 4, "the step keeps prompts_per_step groups");
        // The overlong shaping only lowers rewards: the outcome reward is in [0, 1], the
        // penalty in [-1, 0].
        let reward = number("reward_mean");
        assert!((-1.0..=1.0).contains(&reward), "reward_mean {reward}");
    }
}

#[test]
fn opd_distils_and_refuses_a_teacher_with_another_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    tiny_model(&work.join("base"), 1, Some(&paper_tokenizer()));
    tiny_model(&work.join("teacher"), 2, Some(&paper_tokenizer()));
    // The sampled-token objective with the ref-KL term; the full-vocabulary one without (β = 0
    // never loads the reference).
    for full_vocab in [false, true] {
        let out = format!("opd_{full_vocab}");
        let mut text = config_text(work, &out, Some((&work.join("teacher"), full_vocab)), "").replace("steps = 3", "steps = 1");
        if full_vocab {
            text = text.replace("[output]", "[loss]\nkl_coef = 0.0\n\n[output]");
        }
        run(work, &text, Method::Opd, false).unwrap();
        let records = read_metrics(&work.join(out).join("op2_3_metrics.jsonl")).unwrap();
        assert!(records[1]["teacher_kl"].as_f64().unwrap() > 0.0, "{:?}", records[1]);
        assert_eq!(records[1].get("teacher_kl_full").is_some_and(Value::is_number), full_vocab);
        assert_eq!(records[1].get("kl_ref").is_some_and(Value::is_number), !full_vocab);
        assert!(records[1].get("reward_mean").is_none());
    }

    // Two token ids swapped: the same vocabulary size, a different tokenizer.
    let other = work.join("other_tokenizer");
    std::fs::create_dir_all(&other).unwrap();
    for name in ["tokenizer_config.json", "special_tokens_map.json"] {
        std::fs::copy(paper_tokenizer().join(name), other.join(name)).unwrap();
    }
    let mut tokenizer: Value = serde_json::from_str(&std::fs::read_to_string(paper_tokenizer().join("tokenizer.json")).unwrap()).unwrap();
    let vocab = tokenizer["model"]["vocab"].as_object_mut().unwrap();
    let (a, b) = (vocab["{"].clone(), vocab["}"].clone());
    vocab.insert("{".into(), b);
    vocab.insert("}".into(), a);
    std::fs::write(other.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    tiny_model(&work.join("foreign"), 2, Some(&other));
    tiny_model(&work.join("bare"), 2, None);
    for (teacher, message) in [("foreign", "tokenizer differs from the student's"), ("bare", "needs its tokenizer files")] {
        let text = config_text(work, teacher, Some((&work.join(teacher), false)), "");
        let err = run(work, &text, Method::Opd, false).unwrap_err().to_string();
        assert!(err.contains(message) && err.contains(teacher), "{err}");
    }
    // A teacher with a shorter context than the rollouts it scores (its rotary table would be
    // read past its end).
    let short = work.join("short");
    tiny_model(&short, 2, Some(&paper_tokenizer()));
    let config_path = short.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["max_position_embeddings"] = 64.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let err = run(work, &config_text(work, "short", Some((&short, false)), ""), Method::Opd, false).unwrap_err().to_string();
    assert!(err.contains("short/config.json") && err.contains("the teacher's context (64 positions") && err.contains("up to 312"), "{err}");
    // A teacher with fewer vocabulary rows than the student (the student may sample an id past them).
    config["max_position_embeddings"] = 512.into();
    config["vocab_size"] = (config["vocab_size"].as_u64().unwrap() - 1).into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let err = run(work, &config_text(work, "short", Some((&short, false)), ""), Method::Opd, false).unwrap_err().to_string();
    assert!(err.contains("short/config.json") && err.contains("the teacher's vocab_size") && err.contains("smaller than the student's"), "{err}");
    // A GRPO config is not an OPD one, and vice versa.
    let err = run(work, &config_text(work, "x", None, ""), Method::Opd, false).unwrap_err();
    assert!(err.to_string().contains("needs a [teacher]"), "{err}");
}

/// A tokenizer whose pad token lies outside the model's vocabulary (a `[PAD]` added without
/// resizing the model) is one error naming the tokenizer's directory before anything runs, as in
/// pretraining and SFT (it panicked in the embedding lookup once a batch was padded).
#[test]
fn a_pad_token_outside_the_vocabulary_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    let tokenizer = work.join("padded_tokenizer");
    std::fs::create_dir_all(&tokenizer).unwrap();
    std::fs::copy(paper_tokenizer().join("tokenizer.json"), tokenizer.join("tokenizer.json")).unwrap();
    // `<special_token_4>` is id 2200, one past the tiny model's vocabulary.
    std::fs::write(tokenizer.join("tokenizer_config.json"), r#"{"pad_token": "<special_token_4>"}"#).unwrap();
    tiny_model(&work.join("base"), 1, Some(&tokenizer));
    let err = run(work, &config_text(work, "out", None, ""), Method::Grpo, false).unwrap_err().to_string();
    assert!(err.contains("pad id 2200") && err.contains("vocab_size 2200") && err.contains("base"), "{err}");
    assert!(!work.join("out").exists(), "nothing written");
}

/// Prompts too few for a step, or all dropped by `max_prompt_length`, are refused before
/// anything is written, saying how many were dropped and why.
#[test]
fn too_few_prompts_say_why() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    tiny_model(&work.join("base"), 1, Some(&paper_tokenizer()));
    let text = config_text(work, "out", None, "");
    let err = run(work, &text.replace("max_prompt_length = 300", "max_prompt_length = 1"), Method::Grpo, false).unwrap_err().to_string();
    assert!(err.contains("no usable prompts in") && err.contains("all 48 are longer than max_prompt_length (1 tokens)"), "{err}");
    let err = run(work, &text.replace("prompts_per_step = 4", "prompts_per_step = 50"), Method::Grpo, false).unwrap_err().to_string();
    assert!(err.contains("36 prompts do not fill one step of [train] prompts_per_step = 50 (12 longer than max_prompt_length dropped)"), "{err}");
    assert!(!work.join("out").exists(), "nothing written");
}

#[test]
fn bad_configs_are_errors_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    let good = config_text(work, "out", None, "");
    let cases = [
        (good.replace("n = 2", "n = 2\nsamples = 3"), "line 11: unknown field `samples`"),
        (good.replace("prompts_per_step = 4", "prompts_per_step = 5"), "must be a multiple of mini_batch"),
        (good.replace("micro_batch = 2", "micro_batch = 3"), "must be a multiple of micro_batch"),
        (good.replace("steps = 3", "steps = 3\nepochs = 1.0"), "exactly one of `steps` or `epochs`"),
        (good.replace("[output]", "[loss]\nagg = \"token-sum\"\n\n[output]"), "token-sum"),
        (
            good.replace("[output]", "[loss]\nadv_estimator = \"gae\"\n\n[output]"),
            "unknown adv_estimator \"gae\"; valid names: grpo, dr_grpo, rloo, reinforce_plus_plus",
        ),
        (good.replace("[output]", "[loss]\npolicy_loss = \"ppo\"\n\n[output]"), "unknown policy_loss \"ppo\"; valid names: vanilla, gspo, cispo"),
        (good.replace("[output]", "[loss]\nloss_agg_mode = \"token-sum\"\n\n[output]"), "seq-mean-token-sum-norm-dr"),
        (good.replace("[output]", "[loss]\ntis_imp_ratio_cap = 0.0\n\n[output]"), "tis_imp_ratio_cap must be positive"),
        (good.replace("[output]", "[loss]\nrollout_rs = \"token_k1\"\n\n[output]"), "rollout_rs needs rollout_rs_threshold"),
        (good.replace("[output]", "[loss]\nrollout_rs = \"token_k9\"\nrollout_rs_threshold = 2\n\n[output]"), "unknown rollout_rs option"),
        (good.replace("[output]", "[loss]\nadv_estimator = \"rloo\"\nreward_scaling = \"batch\"\n\n[output]"), "reward_scaling applies to"),
        (good.replace("[output]", "[loss.overlong_buffer]\nlen = 13\n\n[output]"), "0 < len <= max_response_length (12)"),
        (good.replace("max_response_length = 12", "max_response_length = 12\n[rollout.filter_groups]\nmax_num_gen_batches = 0"), "at least 1"),
        // Values that would turn the advantages, the loss or the weights NaN, or run no step.
        (good.replace("[output]", "[loss]\nepsilon = 0.0\n\n[output]"), "[loss] epsilon must be a finite number > 0 (got 0)"),
        (good.replace("[output]", "[loss]\nkl_coef = nan\n\n[output]"), "[loss] kl_coef must be a finite number >= 0 (got NaN)"),
        (good.replace("[output]", "[loss]\nclip_ratio_high = nan\n\n[output]"), "[loss] clip_ratio_high must be a finite number >= 0"),
        (good.replace("lr = 1e-3", "lr = 1e-3\nbeta1 = 1.0"), "[optimizer] beta1 must be in [0, 1) (got 1)"),
        (good.replace("lr = 1e-3", "lr = -1e-3"), "[optimizer] lr must be a finite number >= 0 (got -0.001)"),
        (good.replace("steps = 3", "steps = 0"), "[train] steps must be at least 1"),
        (good.replace("steps = 3", "epochs = inf"), "[train] epochs must be a finite number > 0 (got inf)"),
        (good.replace("[output]", "[schedule]\nwarmup_ratio = 2.0\n\n[output]"), "[schedule] warmup_ratio must be in [0, 1] (got 2)"),
    ];
    // OPD: a teacher coefficient that is not positive, settings the full-vocabulary loss or the
    // teacher signal would ignore.
    let opd = config_text(work, "out", Some((&work.join("teacher"), false)), "");
    let full = opd.replace("full_vocab = false", "full_vocab = true");
    let opd_cases = [
        (opd.replace("full_vocab = false", "full_vocab = false\ncoef = 0.0"), "[teacher] coef must be a finite number > 0 (got 0)"),
        (full.replace("full_vocab = true", "full_vocab = true\ncoef = 0.5"), "[teacher] coef does not apply with [teacher] full_vocab = true"),
        (full.replace("[output]", "[loss]\ntis_imp_ratio_cap = 2.0\n\n[output]"), "[loss] tis_imp_ratio_cap does not apply with [teacher] full_vocab"),
        (full.replace("[output]", "[loss]\npolicy_loss = \"gspo\"\n\n[output]"), "[loss] policy_loss does not apply with [teacher] full_vocab"),
        (opd.replace("[output]", "[loss]\nreward_scaling = \"none\"\n\n[output]"), "[loss] reward_scaling scales GRPO's rewards"),
    ];
    let path = work.join("bad.toml");
    for (text, message) in cases.into_iter().chain(opd_cases) {
        let err = PgConfig::from_toml(&path, &text).unwrap_err().to_string();
        assert!(err.starts_with(path.to_str().unwrap()) && err.contains(message), "{err}");
    }
    // Through the binary: one line naming the file.
    std::fs::write(&path, good.replace("prompts_per_step = 4", "prompts_per_step = 5")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln")).args(["rl", "--config", path.to_str().unwrap()]).output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success() && stderr.lines().count() == 1, "{stderr}");
    assert!(stderr.starts_with(&format!("error: {}", path.display())), "{stderr}");
    // A step that does not split over the replicas is refused naming the file, before anything
    // is loaded (there is no model here) or written.
    std::fs::write(&path, &good).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln")).args(["rl", "--config", path.to_str().unwrap(), "--devices", "cpu,cpu,cpu"]).output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success() && stderr.lines().count() == 1, "{stderr}");
    assert!(stderr.starts_with(&format!("error: {}: [train] prompts_per_step (4) and mini_batch", path.display())) && stderr.contains("multiples of the 3 replicas"), "{stderr}");
    // Batch reward scaling over replicas (each divided by its own share's std).
    std::fs::write(&path, good.replace("[output]", "[loss]\nreward_scaling = \"batch\"\n\n[output]")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln")).args(["rl", "--config", path.to_str().unwrap(), "--devices", "cpu,cpu"]).output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success() && stderr.lines().count() == 1, "{stderr}");
    assert!(stderr.contains("reward_scaling = \"batch\" runs on one replica only (each of the 2"), "{stderr}");
    assert!(!work.join("out").exists());
}

#[test]
fn example_configs_spell_out_the_seed_defaults() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/configs");
    let read = |name: &str| {
        let path = dir.join(name);
        PgConfig::from_toml(&path, &std::fs::read_to_string(&path).unwrap()).unwrap()
    };
    let (rl, opd) = (read("rl_op11_14.toml"), read("opd_refkl_op11_14.toml"));
    let settings = rl.settings();
    assert_eq!((settings.rollout.n, settings.prompts_per_step, settings.mini_batch, settings.micro_batch), (6, 1024, 256, 16));
    assert_eq!((settings.clip.low, settings.clip.high, settings.clip.dual), (0.2, 0.2, 3.0));
    assert_eq!((settings.agg, settings.kl), (LossAgg::TokenMean, Some((KlEstimator::K3, 0.001))));
    assert_eq!(opd.settings(), settings, "the OPD config leaves everything else at the defaults");
    assert!(rl.output.dir.ends_with("020305/rl") && rl.output.name.as_deref() == Some("op11_14"));
    assert!(opd.teacher.unwrap().path.ends_with("020305/rl/op11_14_step200"));
}

/// A reward outside the Interplay task: the same score for every response.
struct Constant(f64);

impl Reward for Constant {
    fn score(&self, _response: &str, _task: &Task) -> f64 {
        self.0
    }
}

/// A loop of `steps` steps at a constant LR of 1e-2 that saves nothing, into `out`.
fn loop_config(out: &Path, steps: u64, precision: kiln::train::Precision) -> LoopConfig {
    LoopConfig { save: SavePolicy::never(), precision, ..LoopConfig::new(out, steps, 1e-2) }
}

#[test]
fn a_custom_reward_plugs_in_and_flat_groups_carry_no_signal() {
    let tmp = tempfile::tempdir().unwrap();
    let device = Default::default();
    let tokenizer = Tokenizer::from_file(paper_tokenizer()).unwrap();
    let prompts = PromptSet::load(&[fixture("interplay/rows/op2.jsonl")], &tokenizer, 512, Some(8)).unwrap();
    let settings = PgSettings {
        rollout: RolloutSettings { n: 3, sampler: Sampler::default(), max_response_length: 6, batch_size: 64, kv_memory: None, max_prefill_tokens: kiln::generate::MAX_PREFILL_TOKENS, dtype: None },
        prompts_per_step: 4,
        mini_batch: 2,
        micro_batch: 3,
        clip: Clip { low: 0.2, high: 0.2, dual: 3.0 },
        agg: LossAgg::SeqMeanTokenMean,
        policy_loss: PolicyLossMode::default(),
        tis_imp_ratio_cap: None,
        rejection: None,
        overlong_buffer: None,
        filter_groups: None,
        kl: None,
        seed: 5,
    };
    let signal = Signal::Rewards { reward: Box::new(Constant(0.25)), estimator: AdvEstimator::default(), scaling: RewardScaling::Group, epsilon: 1e-6 };
    let mut objective = PolicyGradient::<B>::new(settings, prompts, signal, None, tokenizer, vec![3]).unwrap();
    let loop_config = loop_config(tmp.path(), 2, Default::default());
    let config: Qwen2Config = serde_json::from_str(
        r#"{"vocab_size": 2200, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": true,
            "max_position_embeddings": 512, "rope_theta": 1000000.0, "eos_token_id": 3}"#,
    )
    .unwrap();
    let start = Start::new(&loop_config, false, &mut objective, &device, || Qwen2::random(&config, 4, &device)).unwrap();
    let mut records = Vec::new();
    let (_, summary) = train(start, &mut objective, &loop_config, |_| Ok(Record::new()), |r| records.push(r.clone())).unwrap();
    assert!(summary.checkpoints.is_empty());
    for r in &records {
        assert_eq!((r["reward_mean"].as_f64(), r["reward_std"].as_f64()), (Some(0.25), Some(0.0)));
        assert_eq!(r["frac_zero_std_groups"].as_f64(), Some(1.0));
        assert_eq!((r["advantage_min"].as_f64(), r["advantage_max"].as_f64()), (Some(0.0), Some(0.0)));
        assert_eq!((r["pg_loss"].as_f64(), r["grad_norm"].as_f64()), (Some(0.0), Some(0.0)), "no signal, no gradient");
        assert_eq!((r["updates"].as_u64(), r["responses"].as_u64()), (Some(2), Some(12)));
    }
}

/// OPD as two data-parallel replicas (threads), each rolling out its half of every mini-batch:
/// with greedy rollouts the replicas' mean gradient is the one device's, so the weights agree
/// (≤ 1e-6 relative per tensor but the key biases, whose exact gradient is zero); counts in the
/// metrics cover both halves; sharding the optimizer state changes nothing; a step that does
/// not split over the replicas is refused.
#[test]
fn opd_on_two_replicas_matches_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    tiny_model(&work.join("base"), 1, Some(&paper_tokenizer()));
    tiny_model(&work.join("teacher"), 2, Some(&paper_tokenizer()));
    let text = |out: &str| {
        config_text(work, out, Some((&work.join("teacher"), false)), "").replace("steps = 3", "steps = 2").replace("n = 2", "n = 2\ntemperature = 0.0")
    };
    run(work, &text("one"), Method::Opd, false).unwrap();
    let path = work.join("two.toml");
    std::fs::write(&path, text("two")).unwrap();
    let config = PgConfig::from_toml(&path, &text("two")).unwrap();
    let devices = vec![burn::tensor::Device::<B>::default(); 2];
    kiln::rl::run::run_replicated::<B>(&config, Method::Opd, &devices, None, false, |_| {}, |_| {}).unwrap();

    let tensors = |dir: &str| hf::load::<Cpu>(work.join(dir).join("op2_3_step2"), &Default::default()).unwrap().to_hf_tensors();
    let (one, two) = (tensors("one"), tensors("two"));
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    for ((spec, a), (_, b)) in one.iter().zip(&two).filter(|((spec, _), _)| !spec.name.ends_with("k_proj.bias")) {
        let relative = norm(&mut a.iter().zip(b).map(|(x, y)| f64::from(x - y))) / norm(&mut a.iter().map(|&x| f64::from(x)));
        assert!(relative <= 1e-6, "{}: {relative:e}", spec.name);
    }
    let (one, two) = (read_metrics(&work.join("one/op2_3_metrics.jsonl")).unwrap(), read_metrics(&work.join("two/op2_3_metrics.jsonl")).unwrap());
    assert_eq!(two.len(), one.len());
    for key in ["responses", "prompts", "updates", "rollout_tokens"] {
        assert_eq!(one[1][key].as_f64(), two[1][key].as_f64(), "{key}");
    }
    let loss = |r: &Record| r["loss"].as_f64().unwrap();
    assert!((loss(&one[1]) - loss(&two[1])).abs() <= 1e-5 * loss(&one[1]).abs().max(1e-3), "{} vs {}", loss(&one[1]), loss(&two[1]));

    // The same with the optimizer state sharded over the two replicas (ZeRO-1, through the
    // config): the same weights exactly, from half the state per replica.
    let sharded_text = text("sharded").replace("steps = 2", "steps = 2\nshard_optimizer = true");
    let sharded_path = work.join("sharded.toml");
    std::fs::write(&sharded_path, &sharded_text).unwrap();
    let sharded = PgConfig::from_toml(&sharded_path, &sharded_text).unwrap();
    assert!(sharded.train.shard_optimizer);
    kiln::rl::run::run_replicated::<B>(&sharded, Method::Opd, &devices, None, false, |_| {}, |_| {}).unwrap();
    assert!(tensors("two") == tensors("sharded"), "sharding the optimizer state changed the weights");
    let held = |dir: &str| read_metrics(&work.join(dir).join("op2_3_metrics.jsonl")).unwrap()[1]["optimizer_state_values"].as_f64().unwrap();
    assert!((held("sharded") - held("two") / 2.0).abs() <= 2.0, "{} of {}", held("sharded"), held("two"));

    // The same two replicas as two processes (`kiln opd --nnodes 2`) over kiln's ring, each
    // layer's gradients averaged while the backward pass goes on: the weights of the two
    // replicas of one process, bit for bit.
    let nodes_path = work.join("nodes.toml");
    std::fs::write(&nodes_path, text("nodes")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let nodes: Vec<_> = (0..2)
        .map(|rank| {
            std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
                .args(["opd", "--config", nodes_path.to_str().unwrap(), "--nnodes", "2", "--node-rank", &rank.to_string()])
                .args(["--master-addr", &format!("127.0.0.1:{port}"), "--dist-timeout", "60"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, node) in nodes.into_iter().enumerate() {
        let out = node.wait_with_output().unwrap();
        assert!(out.status.success(), "node {rank}: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(tensors("two") == tensors("nodes"), "two nodes over the ring changed the weights");
    let overlapped = read_metrics(&work.join("nodes/op2_3_metrics.jsonl")).unwrap()[1]["grad_values_overlapped"].as_f64().unwrap();
    assert!(overlapped > 0.0, "no gradient was averaged during the backward pass");

    // 4 prompts per step do not split over 3 replicas (a fresh directory: "two" holds checkpoints,
    // refused first).
    let three = vec![burn::tensor::Device::<B>::default(); 3];
    let three_path = work.join("three.toml");
    std::fs::write(&three_path, text("three")).unwrap();
    let config = PgConfig::from_toml(&three_path, &text("three")).unwrap();
    let err = kiln::rl::run::run_replicated::<B>(&config, Method::Opd, &three, None, false, |_| {}, |_| {}).unwrap_err();
    assert!(err.to_string().contains("must be multiples of the 3 replicas"), "{err}");
}

/// `[model] dtype` samples the rollouts in that dtype while the policy trains in its own
/// precision: bf16 rollouts of an f32 policy differ from its f32 scores by bf16's rounding
/// (verl's vLLM-versus-FSDP gap, logged as `logprob_diff_*`), f32 rollouts do not; a
/// bf16-mixed policy trains through it.
#[test]
fn rollouts_sample_in_the_configured_dtype() {
    use kiln::model::Dtype;
    use kiln::train::Precision;
    let run = |dtype: Option<Dtype>, precision: Precision, temperature: f32| {
        let tmp = tempfile::tempdir().unwrap();
        let device = Default::default();
        let tokenizer = Tokenizer::from_file(paper_tokenizer()).unwrap();
        let prompts = PromptSet::load(&[fixture("interplay/rows/op2.jsonl")], &tokenizer, 512, Some(4)).unwrap();
        let settings = PgSettings {
            rollout: RolloutSettings {
                n: 2,
                sampler: Sampler { temperature, ..Sampler::default() },
                max_response_length: 6,
                batch_size: 64,
                kv_memory: None,
                max_prefill_tokens: kiln::generate::MAX_PREFILL_TOKENS,
                dtype,
            },
            prompts_per_step: 2,
            mini_batch: 2,
            micro_batch: 4,
            clip: Clip { low: 0.2, high: 0.2, dual: 3.0 },
            agg: LossAgg::TokenMean,
            policy_loss: PolicyLossMode::default(),
            tis_imp_ratio_cap: Some(100.0),
            rejection: None,
            overlong_buffer: None,
            filter_groups: None,
            kl: None,
            seed: 5,
        };
        let signal = Signal::Rewards { reward: Box::new(Constant(0.25)), estimator: AdvEstimator::default(), scaling: RewardScaling::Group, epsilon: 1e-6 };
        let mut objective = PolicyGradient::<B>::new(settings, prompts, signal, None, tokenizer, vec![3]).unwrap();
        let loop_config = loop_config(tmp.path(), 1, precision);
        let config: Qwen2Config = serde_json::from_str(
            r#"{"vocab_size": 2200, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": true,
                "max_position_embeddings": 512, "rope_theta": 1000000.0, "eos_token_id": 3, "initializer_range": 0.2}"#,
        )
        .unwrap();
        let start = Start::new(&loop_config, false, &mut objective, &device, || Qwen2::random(&config, 4, &device)).unwrap();
        let mut records = Vec::new();
        train(start, &mut objective, &loop_config, |_| Ok(Record::new()), |r| records.push(r.clone())).unwrap();
        let tis = records[0]["tis_weight_mean"].as_f64().unwrap();
        assert!(dtype.is_some() || !matches!(precision, Precision::F32) || (tis - 1.0).abs() < 1e-3, "TIS weights of f32 rollouts at temperature {temperature}: {tis}");
        records[0]["logprob_diff_max"].as_f64().unwrap()
    };
    let same = run(None, Precision::F32, 1.0);
    let bf16 = run(Some(Dtype::BF16), Precision::F32, 1.0);
    assert!(same < 1e-4, "f32 rollouts of an f32 policy: {same}");
    assert!(bf16 > 1e-3, "bf16 rollouts of an f32 policy should differ by bf16 rounding: {bf16}");
    assert!(run(None, Precision::Bf16Mixed, 1.0).is_finite());
    // At another temperature the learner scores the tempered distribution the rollouts sampled
    // from (verl's actor divides the logits by it, as TRL does): the same log-probs, and TIS
    // weights of 1 (checked in `run`).
    let tempered = run(None, Precision::F32, 0.7);
    assert!(tempered < 1e-4, "rollouts at temperature 0.7 against the learner's log-probs: {tempered}");
}
