//! `kiln::eval` end to end on tiny models: the metrics files against an independent
//! recomputation from the generations files, the strict scorer path against the reference's
//! golden files, resuming after an interruption, and bad input.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::module::Param;
use burn::tensor::{Tensor, TensorData};
use common::fixture;
use kiln::backends::Cpu;
use kiln::eval::runner::{generations_path, write_model_files};
use kiln::eval::{EvalData, EvalEvent, EvalSettings, ModelEntry, Subset, evaluate};
use kiln::generate::Sampler;
use kiln::model::hf::{self, SaveDtype};
use kiln::model::{Proj, Qwen2, Qwen2Config};
use kiln::tasks::interplay::dataset::{Split, write_split};
use serde_json::Value;

const TOKENIZER: &str = "interplay/qwen2_100M";

fn tiny_config(tied: bool) -> Qwen2Config {
    serde_json::from_str(&format!(
        r#"{{"vocab_size": 2200, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": {tied},
            "max_position_embeddings": 1024, "rope_theta": 10000.0, "eos_token_id": 3}}"#
    ))
    .unwrap()
}

/// A model that answers `<answer>d</answer>` with a digit d drawn uniformly from 1–9: its layers
/// add nothing (zero output projections), so it is a bigram model. Token → state (one hidden
/// dimension each): `<solution>` 0, `<answer>` 1, digits 2, anything else 3; the head maps
/// state 0 to `<answer>`, 1 to the digits, 2 to `</answer>`, 3 to `[EOS]`.
fn digit_answer_model(dir: &Path) {
    let config = tiny_config(false);
    let device = Default::default();
    let mut model: Qwen2<Cpu> = Qwen2::random(&config, 0, &device).unwrap();
    let (v, d) = (config.vocab_size, config.hidden_size);
    let digits = 26..=34; // "1".."9"
    let state = |t: usize| match t {
        6 => 0,
        8 => 1,
        t if digits.contains(&t) => 2,
        _ => 3,
    };
    let mut embed = vec![0f32; v * d];
    for t in 0..v {
        embed[t * d + state(t)] = 1.0;
    }
    // RMSNorm turns the one-hot row into sqrt(d) in its dimension: logit = 8 · weight.
    let mut head = vec![0f32; d * v]; // burn layout [d, v]
    head[8] = 2.5;
    for t in digits.clone() {
        head[v + t] = 2.5;
    }
    head[2 * v + 9] = 2.5;
    head[3 * v + 3] = 2.5;
    let matrix = |values: Vec<f32>, shape: [usize; 2]| Param::from_tensor(Tensor::from_data(TensorData::new(values, shape), &device));
    model.embed_tokens.weight = matrix(embed, [v, d]);
    model.lm_head = Some(Proj { weight: matrix(head, [d, v]), bias: None, products: None });
    for layer in &mut model.layers {
        let [i, o] = layer.self_attn.o_proj.weight.dims();
        layer.self_attn.o_proj.weight = matrix(vec![0.0; i * o], [i, o]);
        let [i, o] = layer.mlp.down_proj.weight.dims();
        layer.mlp.down_proj.weight = matrix(vec![0.0; i * o], [i, o]);
    }
    hf::save(&model, dir, SaveDtype::F32, Some(&fixture(TOKENIZER))).unwrap();
}

/// A tiny random model (it rambles until the length limit).
fn random_model(dir: &Path, seed: u64) {
    let model: Qwen2<Cpu> = Qwen2::random(&tiny_config(true), seed, &Default::default()).unwrap();
    hf::save(&model, dir, SaveDtype::F32, Some(&fixture(TOKENIZER))).unwrap();
}

/// Tests use ops 2 and 3 (the shortest prompts, which keeps debug builds fast), op 3 as OOD.
const THRESHOLD: Option<i64> = Some(2);

/// A test split with `per_op` rows for each of `ops`, in `<root>/test`.
fn test_split(root: &Path, ops: &[u32], per_op: usize) -> PathBuf {
    write_split(root, Split::Test, ops, per_op, 11, false, || {}).unwrap();
    root.join("test")
}

fn settings(samples: usize, max_new_tokens: usize) -> EvalSettings {
    EvalSettings {
        samples,
        max_new_tokens,
        sampler: Sampler { temperature: 0.7, top_k: 0, top_p: 1.0, min_p: 0.0 },
        shard_prompts: 2,
        batch_size: 64,
        keep_generations: true,
        ..EvalSettings::default()
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn close(a: f64, b: f64, what: &str) {
    assert!((a - b).abs() <= 1e-12 * a.abs().max(1.0), "{what}: {a} vs {b}");
}

/// Unbiased pass@k by the product form, independent of the library's exact binomials.
fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if n - c < k {
        return 1.0;
    }
    1.0 - (0..k).map(|i| (n - c - i) as f64 / (n - i) as f64).product::<f64>()
}

/// Every file under `dir` (relative path → bytes), hidden work directories excluded.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            if rel.starts_with('.') {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else {
                files.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

#[test]
fn metrics_agree_with_a_recomputation_from_the_generations() {
    let tmp = tempfile::tempdir().unwrap();
    let model_dir = tmp.path().join("digits");
    digit_answer_model(&model_dir);
    let data_dir = test_split(tmp.path(), &[2, 3], 3);
    let data = EvalData::load(&data_dir, THRESHOLD).unwrap();
    let out = tmp.path().join("out");
    let n = 8;
    let settings = EvalSettings { loss: true, id_op_threshold: THRESHOLD, ..settings(n, 8) };
    let models = [ModelEntry { name: "digits".into(), path: model_dir }];
    evaluate::<Cpu>(&models, &data, &out, &settings, &Default::default(), |_| {}).unwrap();

    let metrics = read_json(&out.join("digits_metrics.json"));
    assert_eq!(metrics["checkpoint"], "digits");
    let mut all: Vec<(String, Value)> = Vec::new();
    for subset in Subset::BOTH {
        let records = read_lines(&generations_path(&out, "digits", subset));
        let rows = data.rows(subset);
        assert_eq!(records.len(), rows.len() * n);
        // Per prompt: n samples, in __idx order, each `<answer>d` with d in 1-9.
        let mut per_prompt: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
        let mut per_op: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for (i, r) in records.iter().enumerate() {
            let row = &rows[i / n];
            assert_eq!(r["__idx"].as_u64().unwrap() as usize, row.idx);
            assert_eq!(r["op"], Value::String(row.op.to_string()));
            assert_eq!(r["prompt"].as_str().unwrap(), row.prompt);
            let text = r["gen_solution_answer"].as_str().unwrap();
            let digit = text.strip_prefix("<answer>").unwrap_or_else(|| panic!("unexpected sample {text:?}"));
            assert!(digit.len() == 1 && ("1"..="9").contains(&digit), "{text:?}");
            assert_eq!(r["gen_answer"].as_str().unwrap(), digit);
            assert_eq!(r["resp_tokens"], 3, "<answer>, the digit, </answer>");
            let em = usize::from(digit == row.gold_answer);
            assert_eq!(r["exact_match"].as_u64().unwrap() as usize, em);
            let p = per_prompt.entry(row.idx as u64).or_default();
            *p = (p.0 + 1, p.1 + em);
            let o = per_op.entry(row.op.to_string()).or_default();
            *o = (o.0 + 1, o.1 + em);
        }
        let block = &metrics[subset.name()];
        let correct: usize = per_prompt.values().map(|p| p.1).sum();
        close(block["answer_accuracy"].as_f64().unwrap(), correct as f64 / records.len() as f64, "accuracy");
        assert_eq!(block["count"].as_u64().unwrap() as usize, records.len());
        close(block["avg_response_len"].as_f64().unwrap(), 3.0, "response length");
        for k in [1usize, 2, 4, 8] {
            let expected = per_prompt.values().map(|&(n, c)| pass_at_k(n, c, k)).sum::<f64>() / per_prompt.len() as f64;
            close(block["pass_at_k"][format!("pass@{k}")].as_f64().unwrap(), expected, &format!("{} pass@{k}", subset.name()));
        }
        for (op, (total, correct)) in &per_op {
            close(block["per_op_accuracy"][op].as_f64().unwrap(), *correct as f64 / *total as f64, op);
            assert!(block["per_op_avg_loss"][op].as_f64().unwrap() > 0.0, "loss of op {op}");
        }
        assert!(block["avg_loss"].as_f64().unwrap() > 0.0);
        all.extend(records.into_iter().map(|r| (subset.name().to_string(), r)));
    }
    let total_correct = all.iter().filter(|(_, r)| r["exact_match"] == 1).count();
    assert!(total_correct > 0 && total_correct < all.len(), "the test needs both outcomes ({total_correct}/{})", all.len());
    close(metrics["total"]["answer_accuracy"].as_f64().unwrap(), total_correct as f64 / all.len() as f64, "total");

    // summary.csv / summary.json carry the same numbers.
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(summary[0]["checkpoint"], "digits");
    assert_eq!(summary[0]["id_acc"], metrics["id"]["answer_accuracy"]);
    assert_eq!(summary[0]["template_metrics"], metrics["total"]["per_template"]);
    let csv = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    let lines: Vec<&str> = csv.split("\r\n").collect();
    assert_eq!(lines[0], "checkpoint,id_acc,ood_acc,total_acc,id_avg_loss,ood_avg_loss,total_avg_loss,id_avg_resp_len,ood_avg_resp_len,count_id,count_ood,count_total");
    assert!(lines[1].starts_with("digits,"));
    assert_eq!(lines[1].split(',').nth(9).unwrap(), (data.id.len() * n).to_string());

    // Strict scoring ran on every sample: none is a correct reasoning graph.
    let results = read_json(&out.join("digits/results.json"));
    let id_results = &results["files"]["digits_id_generations.jsonl.graph_results.jsonl"];
    assert_eq!(id_results["total"]["total_pass_at_k"]["pass@1"], 0.0);
    let weighting = read_json(&out.join("summary_id_weighting.json"));
    // One ID op: the uniform mean is its accuracy; the paper's bands 5-7 and 8-10 are empty.
    assert_eq!(weighting[0]["answer_accuracy"]["uniform"], metrics["id"]["per_op_accuracy"]["2"]);
    assert_eq!(weighting[0]["answer_accuracy"]["paper"], Value::Null);
}

#[test]
fn strict_scoring_and_metrics_reproduce_the_golden_files() {
    // The reference's generations file holds the ID records, then the OOD ones.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path();
    let golden = std::fs::read_to_string(fixture("interplay/scoring/generations.jsonl")).unwrap();
    let (mut id, mut ood) = (String::new(), String::new());
    for line in golden.lines() {
        let op: i64 = serde_json::from_str::<Value>(line).unwrap()["op"].as_str().unwrap().parse().unwrap();
        let part = if op > 10 { &mut ood } else { &mut id };
        part.push_str(line);
        part.push('\n');
    }
    let name = "checkpoint-golden";
    std::fs::write(generations_path(out, name, Subset::Id), &id).unwrap();
    std::fs::write(generations_path(out, name, Subset::Ood), &ood).unwrap();
    let settings = EvalSettings { samples: 5, keep_generations: true, ..EvalSettings::default() };
    write_model_files(name, out, &fixture("interplay/gold"), &settings, None, &mut |_| {}).unwrap();

    let metrics = std::fs::read_to_string(out.join(format!("{name}_metrics.json"))).unwrap();
    assert_eq!(metrics, std::fs::read_to_string(fixture("interplay/scoring/answer_metrics.json")).unwrap());
    let results = |subset: &str| std::fs::read_to_string(out.join(format!("{name}/{name}_{subset}_generations.jsonl.graph_results.jsonl"))).unwrap();
    assert_eq!(
        results("id") + &results("ood"),
        std::fs::read_to_string(fixture("interplay/scoring/generations.jsonl.graph_results.jsonl")).unwrap()
    );
    let golden_report = read_json(&fixture("interplay/scoring/generations.jsonl_score_report.jsonl"));
    for key in ["total", "missing_solution", "perfect", "value_mismatch", "dependency_mismatch", "answer_mismatch", "missing_nodes"] {
        let ours: i64 = ["id", "ood"]
            .iter()
            .map(|s| read_json(&out.join(format!("{name}/{name}_{s}_generations.jsonl_score_report.jsonl")))["aggregate"][key].as_i64().unwrap())
            .sum();
        assert_eq!(ours, golden_report["aggregate"][key].as_i64().unwrap(), "{key}");
    }
    assert!(out.join(format!("{name}/results.json")).is_file());
}

#[test]
fn an_interrupted_run_resumes_to_identical_files() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = test_split(tmp.path(), &[2, 3], 2);
    let data = EvalData::load(&data_dir, THRESHOLD).unwrap();
    let models: Vec<ModelEntry> = ["a", "b"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let path = tmp.path().join(name);
            random_model(&path, i as u64);
            ModelEntry { name: name.to_string(), path }
        })
        .collect();
    let settings = EvalSettings { shard_prompts: 1, id_op_threshold: THRESHOLD, ..settings(2, 4) };
    let out = tmp.path().join("out");
    let run = |stop_after: Option<usize>| {
        std::panic::catch_unwind(|| {
            evaluate::<Cpu>(&models, &data, &out, &settings, &Default::default(), |event| {
                if let (EvalEvent::Generating { name, new_samples, .. }, Some(limit)) = (event, stop_after) {
                    // Dies in the middle of model b's second shard.
                    if name == "b" && new_samples >= limit {
                        panic!("simulated kill");
                    }
                }
            })
            .unwrap()
        })
    };
    run(None).unwrap();
    let complete = snapshot(&out);
    assert!(complete.contains_key("a_metrics.json") && complete.contains_key("b/results.json"));
    assert!(!out.join(".shards").exists(), "shards are removed once a model is finished");
    std::fs::remove_dir_all(&out).unwrap();

    assert!(run(Some(3)).is_err());
    let shards = out.join(".shards/b/id");
    let kept: Vec<_> = std::fs::read_dir(&shards).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(kept.len(), 1, "the finished shard of b is kept: {kept:?}");
    assert!(out.join("a_metrics.json").is_file() && !out.join("b_metrics.json").exists());

    let mut resumed_from = None;
    let outcomes = evaluate::<Cpu>(&models, &data, &out, &settings, &Default::default(), |event| {
        if let EvalEvent::Generating { name: "b", done, .. } = event {
            resumed_from.get_or_insert(done);
        }
    })
    .unwrap();
    assert!(outcomes[0].skipped && !outcomes[1].skipped);
    assert_eq!(resumed_from, Some(2), "b restarts after its kept shard");
    assert_eq!(snapshot(&out), complete);

    // A finished run is skipped entirely; --overwrite redoes it identically.
    let outcomes = evaluate::<Cpu>(&models, &data, &out, &settings, &Default::default(), |_| {}).unwrap();
    assert!(outcomes.iter().all(|o| o.skipped));
    assert_eq!(snapshot(&out), complete);
    let overwrite = EvalSettings { overwrite: true, ..settings.clone() };
    evaluate::<Cpu>(&models[1..], &data, &out, &overwrite, &Default::default(), |_| {}).unwrap();
    let mut redone = snapshot(&out);
    // The summaries of that run list model b only.
    for file in ["summary.json", "summary.csv", "summary_id_weighting.json", "summary_id_weighting.csv"] {
        redone.insert(file.into(), complete[file].clone());
    }
    assert_eq!(redone, complete);
}

#[test]
fn bad_data_names_file_and_line_and_leaves_outputs_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let e = EvalData::load(&tmp.path().join("missing"), Some(10)).unwrap_err().to_string();
    assert!(e.contains("missing") && e.contains("not found"), "{e}");

    let data_dir = test_split(tmp.path(), &[2, 11], 2);
    let bad = data_dir.join("op2-2.jsonl");
    let good = std::fs::read_to_string(&bad).unwrap();
    let first = good.lines().next().unwrap();
    for (contents, expected) in [
        (format!("{first}\n{{\"problem\": \"p\"\n"), "op2-2.jsonl line 2"),
        (format!("{first}\n{}\n", first.replace("\"op\": 2", "\"op\": \"two\"")), "op2-2.jsonl line 2"),
        (format!("{}\n", first.replace("\"solution\"", "\"nosolution\"")), "op2-2.jsonl line 1: missing field \"solution\""),
    ] {
        std::fs::write(&bad, contents).unwrap();
        let e = EvalData::load(&data_dir, Some(10)).unwrap_err().to_string();
        assert!(e.contains(expected), "{e}");
    }
    std::fs::write(&bad, &good).unwrap();

    // A prompt longer than the model's context: the error names the row; nothing is written.
    let model_dir = tmp.path().join("m");
    let mut config = tiny_config(true);
    config.max_position_embeddings = 16;
    let model: Qwen2<Cpu> = Qwen2::random(&config, 0, &Default::default()).unwrap();
    hf::save(&model, &model_dir, SaveDtype::F32, Some(&fixture(TOKENIZER))).unwrap();
    let data = EvalData::load(&data_dir, Some(10)).unwrap();
    let out = tmp.path().join("out");
    let models = [ModelEntry { name: "m".into(), path: model_dir }];
    let e = evaluate::<Cpu>(&models, &data, &out, &settings(1, 4), &Default::default(), |_| {}).unwrap_err().to_string();
    assert!(e.contains("op2-2.jsonl line 1") && e.contains("context is 16"), "{e}");
    assert!(!out.join("m_metrics.json").exists() && !out.join(".shards/m").exists());
}

/// `--out` the folder a checkpoint is in, the model named like the checkpoint (as a lone model
/// is): the scores would replace `<out>/<name>`, the checkpoint itself. Refused before anything
/// is generated, and the checkpoint is left as it was.
#[test]
fn an_out_whose_model_directory_is_a_checkpoint_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data = EvalData::load(&test_split(tmp.path(), &[2, 3], 1), THRESHOLD).unwrap();
    let runs = tmp.path().join("runs");
    let checkpoint = runs.join("checkpoint-1");
    random_model(&checkpoint, 3);
    let before = snapshot(&checkpoint);
    let models = [ModelEntry { name: "checkpoint-1".into(), path: checkpoint.clone() }];
    let e = evaluate::<Cpu>(&models, &data, &runs, &settings(1, 4), &Default::default(), |_| {}).unwrap_err().to_string();
    assert!(e.contains("checkpoint-1") && e.contains("choose another --out"), "{e}");
    assert_eq!(snapshot(&checkpoint), before, "the checkpoint is untouched");
    assert!(!runs.join(".shards").exists() && !runs.join("checkpoint-1_metrics.json").exists(), "nothing generated");
}

fn kiln(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().unwrap()
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn the_cli_evaluates_a_release_resumes_after_a_kill_and_plots() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("release");
    random_model(&root.join("pretrain/checkpoint-1"), 1);
    random_model(&root.join("rl/op11_14_step20"), 2);
    let data_dir = test_split(tmp.path(), &[2, 3], 2);
    let args = [
        "eval", "interplay", "--release", s(&root), "--data", s(&data_dir), "--samples", "2", "--max-new-tokens", "8",
        "--shard-prompts", "1", "--id-op-threshold", "2", "--keep-generations",
    ];
    let out = kiln(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let evals = root.join("evals");
    let complete = snapshot(&evals);
    for file in ["summary.csv", "pretrain_checkpoint-1_metrics.json", "rl_op11_14_step20/results.json", "rl_op11_14_step20_ood_generations.jsonl"] {
        assert!(complete.contains_key(file), "{file} in {:?}", complete.keys());
    }
    std::fs::rename(&evals, root.join("evals_first")).unwrap();

    // Killed once the first shard is on disk, then run again: the same files.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let first_shard = evals.join(".shards/pretrain_checkpoint-1/id/generations-00000.jsonl");
    let started = std::time::Instant::now();
    while !first_shard.exists() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before it could be killed");
        assert!(started.elapsed().as_secs() < 120, "no shard after two minutes");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap();
    assert!(!child.wait().unwrap().success());
    assert!(!evals.join("pretrain_checkpoint-1_metrics.json").exists(), "killed before the first model finished");
    let out = kiln(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("resuming: ") && stderr.contains(" of 8 samples are on disk"), "{stderr}");
    assert_eq!(snapshot(&evals), complete);

    // Finished models and other sampling settings: refused, naming the recorded settings and
    // what differs (they were skipped, their old results reported as the new run's).
    let mut more = args.to_vec();
    more[7] = "3";
    let out = kiln(&more);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(!out.status.success() && last.contains("pretrain_checkpoint-1_eval_settings.json") && last.contains("(samples differ)") && last.contains("--overwrite"), "{stderr}");
    assert_eq!(snapshot(&evals), complete);

    // Bad data: one line naming file and line; the finished evaluation is untouched.
    let bad = tmp.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("op2-1.jsonl"), "{\"op\": 2, \"solution\": \"Answer: 3.\"}\nnot json\n").unwrap();
    let mut bad_args = args.to_vec();
    bad_args[5] = s(&bad);
    bad_args.push("--overwrite");
    let out = kiln(&bad_args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.lines().count() == 1, "{stderr}");
    assert!(stderr.contains("op2-1.jsonl line 2"), "{stderr}");
    let nowhere = tmp.path().join("nowhere");
    bad_args[5] = s(&nowhere);
    let stderr = String::from_utf8_lossy(&kiln(&bad_args).stderr).into_owned();
    assert!(stderr.contains("nowhere") && stderr.contains("not found"), "{stderr}");
    assert_eq!(snapshot(&evals), complete);

    let plots = tmp.path().join("plots");
    let out = kiln(&["plot", "eval", "--metrics", s(&evals), "--out", s(&plots)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let svg = std::fs::read_to_string(plots.join("rl_op11_14_step20_pass_at_k.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("ID strict") && svg.contains("OOD answer"));
    for file in ["pretrain_checkpoint-1_per_op_accuracy.svg", "id_pass_at_k.svg", "ood_pass_at_k.svg", "per_op_accuracy.svg"] {
        assert!(plots.join(file).is_file(), "{file}");
    }

    // A model named after a compared subset would write its chart over the comparison chart.
    let named_id = tmp.path().join("named_id");
    std::fs::create_dir_all(&named_id).unwrap();
    for (from, to) in [("rl_op11_14_step20", "id"), ("pretrain_checkpoint-1", "pretrain_checkpoint-1")] {
        std::fs::copy(evals.join(format!("{from}_metrics.json")), named_id.join(format!("{to}_metrics.json"))).unwrap();
    }
    let id_plots = tmp.path().join("id_plots");
    let out = kiln(&["plot", "eval", "--metrics", s(&named_id), "--out", s(&id_plots)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.lines().count() == 1, "{stderr}");
    assert!(stderr.contains("id_metrics.json") && stderr.contains("ID comparison chart"), "{stderr}");
    assert!(!id_plots.exists());
}
