//! Evaluation over several devices (`kiln::eval::evaluate_on`, `kiln eval interplay --devices`,
//! `--nnodes`): on the CPU, two replicas in one process and two processes on 127.0.0.1 write
//! files byte-identical to a one-device run, and shards left by an interrupted run resume with
//! another device count to the same files.

mod common;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::fixture;
use kiln::backends::Cpu;
use kiln::eval::{EvalData, EvalEvent, EvalSettings, ModelEntry, evaluate, evaluate_on};
use kiln::generate::Sampler;
use kiln::model::hf::{self, SaveDtype};
use kiln::model::{Qwen2, Qwen2Config};
use kiln::tasks::interplay::dataset::{Split, write_split};

/// A tiny random model (it rambles until the length limit, so every shard has work).
fn random_model(dir: &Path, seed: u64) {
    let config: Qwen2Config = serde_json::from_str(
        r#"{"vocab_size": 2200, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": true,
            "max_position_embeddings": 1024, "rope_theta": 10000.0, "eos_token_id": 3}"#,
    )
    .unwrap();
    let model: Qwen2<Cpu> = Qwen2::random(&config, seed, &Default::default()).unwrap();
    hf::save(&model, dir, SaveDtype::F32, Some(&fixture("interplay/qwen2_100M"))).unwrap();
}

/// Ops 2 (ID) and 3 (OOD), 3 prompts each: with one prompt per shard, 3 shards per part, an
/// odd number for two replicas.
fn setup(root: &Path) -> (Vec<ModelEntry>, PathBuf) {
    write_split(root, Split::Test, &[2, 3], 3, 11, false, || {}).unwrap();
    let models = ["a", "b"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let path = root.join(name);
            random_model(&path, i as u64 + 1);
            ModelEntry { name: name.to_string(), path }
        })
        .collect();
    (models, root.join("test"))
}

fn settings() -> EvalSettings {
    EvalSettings {
        samples: 2,
        max_new_tokens: 6,
        sampler: Sampler { temperature: 0.7, top_k: 0, top_p: 1.0, min_p: 0.0 },
        shard_prompts: 1,
        batch_size: 4,
        id_op_threshold: Some(2),
        keep_generations: true,
        ..EvalSettings::default()
    }
}

/// Every file under `dir` (relative path → bytes).
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.insert(path.strip_prefix(dir).unwrap().to_string_lossy().into_owned(), std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// `a` and `b` hold the same files, byte for byte (the first difference shown as text).
fn assert_same(a: &BTreeMap<String, Vec<u8>>, b: &BTreeMap<String, Vec<u8>>, what: &str) {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "{what}: the same files");
    for (name, bytes) in a {
        if bytes != &b[name] {
            panic!("{what}: {name} differs:\n{}\n---\n{}", String::from_utf8_lossy(bytes), String::from_utf8_lossy(&b[name]));
        }
    }
}

#[test]
fn two_devices_write_the_files_of_one_and_resume_each_others_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let (models, data_dir) = setup(tmp.path());
    let data = EvalData::load(&data_dir, Some(2)).unwrap();
    let settings = settings();

    // Every run writes to `out` (score reports name their paths), moved aside afterwards.
    let out = tmp.path().join("out");
    let set_aside = |name: &str| std::fs::rename(&out, tmp.path().join(name)).unwrap();
    evaluate::<Cpu>(&models, &data, &out, &settings, &Default::default(), |_| {}).unwrap();
    let single = snapshot(&out);
    set_aside("one");
    for file in ["a_metrics.json", "b/results.json", "summary.csv", "a_id_generations.jsonl", "b_ood_generations.jsonl"] {
        assert!(single.contains_key(file), "{file} in {:?}", single.keys());
    }
    assert_eq!(String::from_utf8_lossy(&single["a_id_generations.jsonl"]).lines().count(), 6, "3 prompts x 2 samples");

    let mut progress = Vec::new();
    let outcomes = evaluate_on::<Cpu>(&models, &data, &out, &settings, &[Default::default(), Default::default()], None, |event| {
        if let EvalEvent::Generating { name: "a", done, total, .. } = event {
            progress.push((done, total));
        }
    })
    .unwrap();
    assert_eq!(outcomes.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    assert!(outcomes.iter().all(|o| !o.skipped && o.summary.get("total_acc").is_some()));
    assert_same(&snapshot(&out), &single, "two devices write the files of one");
    set_aside("two");
    assert_eq!(progress.first(), Some(&(0, 12)));
    assert_eq!(progress.last(), Some(&(12, 12)));

    // Interrupted on one device after model b's first shard; resumed on two.
    let killed = std::panic::catch_unwind(|| {
        evaluate::<Cpu>(&models, &data, &out, &settings, &Default::default(), |event| {
            if let EvalEvent::Generating { name: "b", new_samples, .. } = event
                && new_samples >= 3
            {
                panic!("simulated kill");
            }
        })
    });
    assert!(killed.is_err());
    assert!(out.join(".shards/b/id/generations-00000.jsonl").is_file() && !out.join("b_metrics.json").exists());
    let mut resumed_from = None;
    let outcomes = evaluate_on::<Cpu>(&models, &data, &out, &settings, &[Default::default(), Default::default()], None, |event| {
        if let EvalEvent::Generating { name: "b", done, .. } = event {
            resumed_from.get_or_insert(done);
        }
    })
    .unwrap();
    assert!(outcomes[0].skipped && !outcomes[1].skipped);
    assert_eq!(resumed_from, Some(2), "b resumes after its kept shard");
    assert_same(&snapshot(&out), &single, "resumed on two devices");

    // Three devices for six shards of one part and a bad model: the error is the run's, once.
    let bad = vec![ModelEntry { name: "gone".into(), path: tmp.path().join("gone") }];
    let e = evaluate_on::<Cpu>(&bad, &data, &out, &settings, &[Default::default(); 3], None, |_| {}).unwrap_err().to_string();
    assert!(e.contains("gone"), "{e}");
}

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn ok(out: Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "kiln failed:\n{stderr}");
    stderr
}

/// `kiln eval interplay` with `--devices cpu,cpu`, and as two processes (`--nnodes 2`) on
/// 127.0.0.1, gives the one-device files; a run killed after its first shard resumes on the
/// other device count to the same files.
#[test]
fn the_cli_shards_over_devices_and_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, data_dir) = setup(tmp.path());
    let root = tmp.path().join("release");
    std::fs::create_dir_all(root.join("rl")).unwrap();
    std::fs::rename(tmp.path().join("a"), root.join("rl/op11_14_step20")).unwrap();
    std::fs::rename(tmp.path().join("b"), root.join("rl/op13_20_step20")).unwrap();
    let run = |out: &Path, extra: &[&str]| {
        let mut command = kiln();
        command.args(["eval", "interplay", "--release"]).arg(&root).arg("--data").arg(&data_dir).arg("--out").arg(out);
        command.args(["--samples", "2", "--max-new-tokens", "6", "--shard-prompts", "1", "--batch-size", "4", "--id-op-threshold", "2", "--keep-generations"]);
        command.args(extra);
        command
    };

    // Every run writes to `out` (score reports name their paths), moved aside afterwards.
    let out = tmp.path().join("out");
    let set_aside = |name: &str| std::fs::rename(&out, tmp.path().join(name)).unwrap();
    ok(run(&out, &[]).output().unwrap());
    let single = snapshot(&out);
    set_aside("one");
    assert!(single.contains_key("rl_op13_20_step20_metrics.json") && single.contains_key("summary.csv"), "{:?}", single.keys());

    let log = ok(run(&out, &["--devices", "cpu,cpu"]).output().unwrap());
    assert!(log.contains("on 2 devices"), "{log}");
    assert_same(&snapshot(&out), &single, "--devices cpu,cpu");
    set_aside("two");

    // Two processes, one device each.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let master = format!("127.0.0.1:{port}");
    let node = |rank: &str| run(&out, &["--nnodes", "2", "--node-rank", rank, "--master-addr", &master]).stderr(Stdio::piped()).spawn().unwrap();
    let (first, second) = (node("0"), node("1"));
    let (first, second) = (first.wait_with_output().unwrap(), second.wait_with_output().unwrap());
    ok(first);
    let log = ok(second);
    assert!(log.contains("node 0 wrote the files"), "{log}");
    assert_same(&snapshot(&out), &single, "--nnodes 2");
    set_aside("nodes");

    // Killed on two devices once the first shard is on disk, resumed on one.
    let mut child = run(&out, &["--devices", "cpu,cpu"]).stderr(Stdio::null()).spawn().unwrap();
    let first_shard = out.join(".shards/rl_op11_14_step20/id/generations-00000.jsonl");
    let started = std::time::Instant::now();
    while !first_shard.exists() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before it could be killed");
        assert!(started.elapsed().as_secs() < 120, "no shard after two minutes");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap();
    assert!(!child.wait().unwrap().success());
    ok(run(&out, &[]).output().unwrap());
    assert_same(&snapshot(&out), &single, "resumed on one device");
}
