//! Multi-process data parallelism through the `kiln` binary, every process on 127.0.0.1:
//! 2 and 3 nodes with micro-batch b give the weights of one process with micro-batch N·b
//! (steps back to back); a resumed 2-node run equals an uninterrupted one; a killed node stops
//! the others with an error naming it; mismatched configs, a missing node and a master port in
//! use are one-line errors.

mod common;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::fixture;
use serde_json::Value;

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

/// A port of 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A pre-training config of a tiny model on 200 generated op-2 rows (`extra` appended to
/// `[output]`).
fn write_config(dir: &Path, name: &str, micro_batch: usize, steps: u64, extra: &str) -> PathBuf {
    std::fs::create_dir_all(dir.join("model")).unwrap();
    if !dir.join("data/train").is_dir() {
        let out = kiln().args(["data", "interplay", "--ops", "2", "--per-op", "200", "--seed", "1", "--split", "train", "--out"]).arg(dir.join("data")).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    std::fs::write(
        dir.join("model/config.json"),
        r#"{"vocab_size": 2200, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": true,
            "max_position_embeddings": 128, "rope_theta": 1000000.0, "eos_token_id": 3}"#,
    )
    .unwrap();
    let text = format!(
        r#"[model]
init = "model/config.json"
tokenizer = {tokenizer:?}
seed = 3

[data]
kind = "mixture"
root = "data"
ops = [2]
probs = [1.0]
tokens = 20000
cutoff_len = 64

[train]
steps = {steps}
micro_batch = {micro_batch}
grad_accum = 2
seed = 5

[optimizer]
lr = 3e-3
weight_decay = 0.1
max_grad_norm = 0.5

[schedule]
kind = "cosine"
warmup_steps = 1

[output]
dir = "{name}"
{extra}
"#,
        tokenizer = fixture("interplay/qwen2_100M"),
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Starts node `rank` of `nnodes` on `port`.
fn spawn_node(config: &Path, nnodes: usize, rank: usize, port: u16, extra: &[&str]) -> Child {
    kiln()
        .args(["pretrain", "--config", config.to_str().unwrap(), "--nnodes", &nnodes.to_string(), "--node-rank", &rank.to_string()])
        .args(["--master-addr", &format!("127.0.0.1:{port}")])
        .args(if extra.contains(&"--dist-timeout") { &[][..] } else { &["--dist-timeout", "60"][..] })
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs every node to the end (a new port if the first was taken in the meantime).
fn run_nodes(configs: &[&Path], extra: &[&str]) -> Vec<Output> {
    for _ in 0..3 {
        let port = free_port();
        let children: Vec<Child> = configs.iter().enumerate().map(|(rank, config)| spawn_node(config, configs.len(), rank, port, extra)).collect();
        let outputs: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
        if !stderr(&outputs[0]).contains("is in use") {
            return outputs;
        }
    }
    panic!("no free port on 127.0.0.1");
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn last_line(out: &Output) -> String {
    stderr(out).lines().last().unwrap_or_default().to_string()
}

fn succeed(outputs: &[Output]) {
    for (rank, out) in outputs.iter().enumerate() {
        assert!(out.status.success(), "node {rank} failed: {}", stderr(out));
    }
}

/// A checkpoint's tensors by name.
fn weights(checkpoint: &Path) -> HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(checkpoint.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, view)| (name, view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()))
        .collect()
}

/// Largest ‖a − b‖ / ‖b‖ over the tensors but the key biases, whose exact gradient is zero
/// (see tests/data_parallel.rs).
fn max_relative_difference(a: &HashMap<String, Vec<f32>>, b: &HashMap<String, Vec<f32>>) -> f64 {
    assert_eq!(a.len(), b.len());
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    a.iter()
        .filter(|(name, _)| !name.ends_with("k_proj.bias"))
        .map(|(name, va)| {
            let vb = &b[name];
            norm(&mut va.iter().zip(vb).map(|(x, y)| f64::from(x - y))) / norm(&mut vb.iter().map(|&y| f64::from(y)))
        })
        .fold(0.0, f64::max)
}

fn losses(run: &Path) -> Vec<f64> {
    kiln::train::trainer::read_metrics(&run.join("metrics.jsonl")).unwrap().iter().map(|r| r["loss"].as_f64().unwrap()).collect()
}

#[test]
fn two_and_three_nodes_match_one_process_with_the_whole_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let steps = 4;
    for nnodes in [2usize, 3] {
        let single = write_config(dir, &format!("single{nnodes}"), 2 * nnodes, steps, "");
        let out = kiln().args(["pretrain", "--config", single.to_str().unwrap()]).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let multi = write_config(dir, &format!("multi{nnodes}"), 2, steps, "");
        let configs = vec![multi.as_path(); nnodes];
        let outputs = run_nodes(&configs, &[]);
        succeed(&outputs);
        // Only node 0 writes checkpoints and metrics.
        let checkpoint = |name: &str| dir.join(name).join(format!("checkpoint-{steps}"));
        let (a, b) = (weights(&checkpoint(&format!("multi{nnodes}"))), weights(&checkpoint(&format!("single{nnodes}"))));
        let difference = max_relative_difference(&a, &b);
        assert!(difference <= 1e-6, "{nnodes} nodes × micro-batch 2 vs 1 × {}: weights differ by {difference:e} relative", 2 * nnodes);
        let (multi, single) = (losses(&dir.join(format!("multi{nnodes}"))), losses(&dir.join(format!("single{nnodes}"))));
        assert_eq!(multi.len(), steps as usize);
        for (x, y) in multi.iter().zip(&single) {
            assert!((x - y).abs() <= 1e-5 * y.abs(), "losses {multi:?} vs {single:?}");
        }
        assert!(multi[steps as usize - 1] < multi[0], "the loss should fall: {multi:?}");
    }
}

/// Each decoder layer's gradients are summed over the ring while the backward pass goes on to
/// the layers below (`[train] overlap_grad_reduce`, the default), which changes no bit: two
/// processes give the weights and losses of sums taken after the backward pass, with and without
/// recomputation (grad_accum = 2: the layers' sums include the first micro-batch's gradients).
/// The metrics count the values summed during the backward pass: every decoder layer's.
#[test]
fn gradients_summed_during_the_backward_pass_equal_the_sums_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let steps = 3;
    let run = |name: &str, train: &str| {
        let config = write_config(dir, name, 2, steps, "");
        let text = std::fs::read_to_string(&config).unwrap().replace("seed = 5", &format!("seed = 5\n{train}"));
        std::fs::write(&config, text).unwrap();
        succeed(&run_nodes(&[&config, &config], &[]));
        let records = kiln::train::trainer::read_metrics(&dir.join(name).join("metrics.jsonl")).unwrap();
        assert_eq!(records.len(), steps as usize, "{name}");
        let overlapped: Vec<f64> = records.iter().map(|r| r["grad_values_overlapped"].as_f64().unwrap()).collect();
        assert!(records.iter().all(|r| r["grad_reduce_wait_s"].as_f64().is_some_and(|s| s >= 0.0)), "{name}: {records:?}");
        (weights(&dir.join(name).join(format!("checkpoint-{steps}"))), losses(&dir.join(name)), overlapped)
    };
    let (after, after_losses, none) = run("after", "overlap_grad_reduce = false");
    assert!(none.iter().all(|&n| n == 0.0), "nothing is summed during the backward pass when off: {none:?}");
    let layer_values: usize = after.iter().filter(|(name, _)| name.starts_with("model.layers.")).map(|(_, v)| v.len()).sum();
    for (name, train) in [("overlapped", ""), ("overlapped_recompute", "recompute = true"), ("after_recompute", "recompute = true\noverlap_grad_reduce = false")] {
        let (w, l, overlapped) = run(name, train);
        assert!(w == after, "{name}: the weights differ from the sums after the backward pass");
        assert_eq!(l, after_losses, "{name}");
        let want = if name.starts_with("after") { 0.0 } else { layer_values as f64 };
        assert!(overlapped.iter().all(|&n| n == want), "{name}: {overlapped:?} values summed during the backward pass, want {want} each step");
    }
}

/// Two processes of two replicas each (the engine inside a process, the ring between them), and
/// one process of two replicas named in the config, against one device with the whole batch;
/// the optimizer state sharded over the four replicas changes nothing but its size.
#[test]
fn replicas_in_processes_and_from_the_config_match_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let steps = 3;
    let single = write_config(dir, "single", 4, steps, "");
    let out = kiln().args(["pretrain", "--config", single.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let multi = write_config(dir, "multi", 1, steps, "");
    succeed(&run_nodes(&[&multi, &multi], &["--devices", "cpu,cpu"]));
    let listed = write_config(dir, "listed", 2, steps, "").to_str().unwrap().to_string();
    let text = std::fs::read_to_string(&listed).unwrap().replace("seed = 5", "seed = 5\ndevices = [\"cpu\", \"cpu\"]");
    std::fs::write(&listed, text).unwrap();
    let out = kiln().args(["pretrain", "--config", &listed]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let reference = weights(&dir.join(format!("single/checkpoint-{steps}")));
    for run in ["multi", "listed"] {
        let difference = max_relative_difference(&weights(&dir.join(run).join(format!("checkpoint-{steps}"))), &reference);
        assert!(difference <= 1e-6, "{run}: weights differ by {difference:e} relative");
        assert_eq!(losses(&dir.join(run)).len(), steps as usize);
    }
    // ZeRO-1 over the same four replicas (the ring between the processes): the same weights and
    // optimizer state, a quarter of the state per replica.
    let sharded = write_config(dir, "sharded", 1, steps, "");
    let text = std::fs::read_to_string(&sharded).unwrap().replace("seed = 5", "seed = 5\nshard_optimizer = true");
    std::fs::write(&sharded, text).unwrap();
    succeed(&run_nodes(&[&sharded, &sharded], &["--devices", "cpu,cpu"]));
    let checkpoint = |run: &str| dir.join(run).join(format!("checkpoint-{steps}"));
    assert!(weights(&checkpoint("multi")) == weights(&checkpoint("sharded")), "sharded weights differ");
    let moments = |run: &str| std::fs::read(checkpoint(run).join("optimizer.safetensors")).unwrap();
    assert!(moments("multi") == moments("sharded"), "the sharded run saved other optimizer state");
    let held = |run: &str| kiln::train::trainer::read_metrics(&dir.join(run).join("metrics.jsonl")).unwrap()[0]["optimizer_state_values"].as_f64().unwrap();
    assert!((held("sharded") - held("multi") / 4.0).abs() <= 2.0, "a replica held {} optimizer values, of {}", held("sharded"), held("multi"));

    // Devices of two backends do not make one run.
    let out = kiln().args(["pretrain", "--config", &listed, "--devices", "cpu,cuda:0"]).output().unwrap();
    assert!(last_line(&out).contains("must all be of one backend (got cpu and cuda:0)"), "{}", stderr(&out));
}

#[test]
fn a_resumed_two_node_run_equals_an_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let whole = write_config(dir, "whole", 2, 4, "");
    succeed(&run_nodes(&[&whole, &whole], &[]));
    // A zero time budget stops (and saves) after the first step; the resumed run finishes it.
    let first = write_config(dir, "part", 2, 4, "time_budget_s = 0.0");
    succeed(&run_nodes(&[&first, &first], &[]));
    assert!(dir.join("part/checkpoint-1").is_dir() && !dir.join("part/checkpoint-4").exists());
    let rest = write_config(dir, "part", 2, 4, "");
    succeed(&run_nodes(&[&rest, &rest], &["--resume"]));
    assert!(weights(&dir.join("whole/checkpoint-4")) == weights(&dir.join("part/checkpoint-4")), "final weights differ");
}

#[test]
fn a_killed_node_stops_the_others_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let config = write_config(dir, "run", 2, 100_000, "");
    let port = free_port();
    let mut children: Vec<Child> = (0..3).map(|rank| spawn_node(&config, 3, rank, port, &[])).collect();
    // Kill node 2 once training runs (node 0 logged a step).
    let metrics = dir.join("run/metrics.jsonl");
    let began = Instant::now();
    while std::fs::read_to_string(&metrics).map_or(true, |t| t.lines().count() < 2) {
        if began.elapsed() > Duration::from_secs(120) || children[0].try_wait().unwrap().is_some() {
            children.iter_mut().for_each(|c| drop(c.kill()));
            panic!("the run did not start: {}", stderr(&children.remove(0).wait_with_output().unwrap()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    children[2].kill().unwrap();
    children[2].wait().unwrap();
    let killed = Instant::now();
    for (rank, child) in children.iter_mut().enumerate().take(2) {
        while child.try_wait().unwrap().is_none() {
            if killed.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("node {rank} still runs 30 s after node 2 was killed");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for (rank, child) in children.into_iter().enumerate().take(2) {
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "node {rank} should fail");
        let line = last_line(&out);
        assert!(line.starts_with("error: ") && line.contains("node 2"), "node {rank}: {}", stderr(&out));
    }
}

#[test]
fn rendezvous_errors_are_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let a = write_config(dir, "a", 2, 2, "");
    let b = write_config(dir, "b", 2, 2, "save_steps = 1");
    // Different configs: both nodes refuse.
    for out in run_nodes(&[&a, &b], &[]) {
        let line = last_line(&out);
        assert!(!out.status.success() && line.contains("node 1 runs another configuration than node 0"), "{}", stderr(&out));
    }
    // No node 0.
    let port = free_port();
    let out = spawn_node(&a, 2, 1, port, &["--dist-timeout", "1"]).wait_with_output().unwrap();
    assert!(last_line(&out).contains(&format!("cannot reach node 0 at 127.0.0.1:{port} within 1s")), "{}", stderr(&out));
    // The master port is taken.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = spawn_node(&a, 2, 0, port, &[]).wait_with_output().unwrap();
    assert!(last_line(&out).contains(&format!("port {port} of 127.0.0.1 is in use")), "{}", stderr(&out));
    // --nnodes without a master address.
    let out = kiln().args(["pretrain", "--config", a.to_str().unwrap(), "--nnodes", "2"]).output().unwrap();
    assert!(last_line(&out).contains("--nnodes 2 needs --master-addr"), "{}", stderr(&out));
    // A master address without --nnodes: node 0 alone would run the whole job.
    let out = kiln().args(["pretrain", "--config", a.to_str().unwrap(), "--node-rank", "0", "--master-addr", "127.0.0.1:1"]).output().unwrap();
    assert!(last_line(&out).contains("--master-addr 127.0.0.1:1 needs --nnodes above 1"), "{}", stderr(&out));
}

/// `--collective nccl` asks for NCCL even with one device: on the CPU that is one error line
/// before any step (NCCL's own search and its message are core/src/dist/nccl.rs's tests);
/// `--collective ring` is the CPU's transport and trains as without it.
#[test]
fn collective_nccl_on_the_cpu_is_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let a = write_config(dir, "a", 2, 1, "");
    let out = kiln().current_dir(dir).args(["pretrain", "--config", a.to_str().unwrap(), "--collective", "nccl"]).output().unwrap();
    assert!(!out.status.success());
    assert_eq!(last_line(&out), "error: --collective nccl needs CUDA devices (this build or run has none); leave it out for kiln's TCP ring", "{}", stderr(&out));
    assert!(!dir.join("a/metrics.jsonl").exists() || std::fs::read_to_string(dir.join("a/metrics.jsonl")).unwrap().is_empty(), "no step ran");
    let out = kiln().current_dir(dir).args(["pretrain", "--config", a.to_str().unwrap(), "--collective", "ring", "--devices", "cpu,cpu"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(losses(&dir.join("a")).len(), 1);
}

/// `[train] grad_reduce_dtype = "bf16"` is NCCL's (its traffic halved): with replicas on the
/// CPU it is one error line before any step; one device reduces nothing and trains; a bad value
/// names its line.
#[test]
fn bf16_gradient_reduction_needs_nccl() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let a = write_config(dir, "a", 2, 1, "");
    let text = std::fs::read_to_string(&a).unwrap();
    std::fs::write(&a, text.replace("seed = 5", "seed = 5\ngrad_reduce_dtype = \"bf16\"")).unwrap();
    let out = kiln().args(["pretrain", "--config", a.to_str().unwrap(), "--devices", "cpu,cpu"]).output().unwrap();
    assert!(!out.status.success());
    assert_eq!(last_line(&out), format!("error: {}", kiln::dist::BF16_NEEDS_NCCL), "{}", stderr(&out));
    assert!(!dir.join("a/checkpoint-1").exists());
    let out = kiln().args(["pretrain", "--config", a.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(&a, text.replace("seed = 5", "seed = 5\ngrad_reduce_dtype = \"fp8\"")).unwrap();
    let out = kiln().args(["pretrain", "--config", a.to_str().unwrap()]).output().unwrap();
    let line = last_line(&out);
    assert!(!out.status.success() && line.contains("a.toml") && line.contains("a.toml line 19: unknown variant `fp8`, expected `f32` or `bf16`"), "{}", stderr(&out));
}

/// `kiln bench --all-reduce` times the collective per size on the replicas training would use,
/// checking every sum: two replicas in one process (burn-collective's engine), and two
/// processes (the TCP ring).
#[test]
fn bench_all_reduce_times_checked_sums_per_size() {
    let rows = |out: &Output| -> Vec<Value> {
        assert!(out.status.success(), "{}", stderr(out));
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["row"].clone()).collect()
    };
    let check = |rows: &[Value]| {
        assert_eq!(rows.iter().map(|r| r["bytes"].as_u64().unwrap()).collect::<Vec<_>>(), [4096, 1 << 20]);
        for r in rows {
            assert_eq!(r["world"], 2);
            let (alg, bus) = (r["algbw_gb_s"].as_f64().unwrap(), r["busbw_gb_s"].as_f64().unwrap());
            assert!(alg > 0.0 && (bus - alg).abs() <= 1e-12 * alg, "{r}");
        }
    };
    let out = kiln().args(["bench", "--all-reduce", "--devices", "cpu,cpu", "--sizes", "4096,1048576", "--repeats", "2"]).output().unwrap();
    check(&rows(&out));
    // The all-gather (ZeRO-1's weights): checked shares, each link carrying half the buffer.
    let out = kiln().args(["bench", "--all-gather", "--devices", "cpu,cpu", "--sizes", "4096,1048576", "--repeats", "2"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.iter().map(|l| l["row"]["bytes"].as_u64().unwrap()).collect::<Vec<_>>(), [4096, 1 << 20]);
    for line in &lines {
        let (alg, bus) = (line["row"]["algbw_gb_s"].as_f64().unwrap(), line["row"]["busbw_gb_s"].as_f64().unwrap());
        assert!(line["mode"] == "all_gather" && line["row"]["world"] == 2 && alg > 0.0 && (bus - alg / 2.0).abs() <= 1e-12 * alg, "{line}");
    }
    for _ in 0..3 {
        let port = free_port().to_string();
        let node = |rank: &str| {
            kiln()
                .args(["bench", "--all-reduce", "--sizes", "4096,1048576", "--repeats", "2", "--nnodes", "2", "--node-rank", rank])
                .args(["--master-addr", &format!("127.0.0.1:{port}"), "--dist-timeout", "60"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (node("0"), node("1"));
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        if stderr(&a).contains("is in use") {
            continue;
        }
        check(&rows(&a));
        assert!(b.status.success() && b.stdout.is_empty(), "rank 1 prints nothing: {}", stderr(&b));
        let bad = kiln().args(["bench", "--all-reduce", "--sizes", "4095"]).output().unwrap();
        assert_eq!(last_line(&bad), "error: --sizes: 4095 is not a whole number of f32 values (a multiple of 4 bytes)");
        let bad = kiln().args(["bench", "--all-reduce", "--sizes", "18446744073709551612"]).output().unwrap();
        assert_eq!(last_line(&bad), "error: --sizes: 18446744073709551612 bytes is more than 17179869184 (16 GiB) a buffer");
        return;
    }
    panic!("no free port on 127.0.0.1");
}

/// What `launcher` sets for process `rank` of 2 on this machine, rank 0 listening on `port`.
fn launcher_environment(launcher: &str, rank: usize, port: u16) -> Vec<(&'static str, String)> {
    let (rank, port) = (rank.to_string(), port.to_string());
    match launcher {
        "torchrun" => vec![
            ("RANK", rank.clone()),
            ("LOCAL_RANK", rank),
            ("WORLD_SIZE", "2".into()),
            ("LOCAL_WORLD_SIZE", "2".into()),
            ("GROUP_RANK", "0".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port),
        ],
        "Slurm" => vec![
            ("SLURM_STEP_ID", "0".into()),
            ("SLURM_PROCID", rank.clone()),
            ("SLURM_LOCALID", rank),
            ("SLURM_NTASKS", "2".into()),
            ("SLURM_STEP_TASKS_PER_NODE", "2".into()),
            ("SLURM_NODEID", "0".into()),
            ("SLURM_NNODES", "1".into()),
            ("SLURM_JOB_NODELIST", "127.0.0.1".into()),
            ("MASTER_PORT", port),
        ],
        "Open MPI" => vec![
            ("OMPI_COMM_WORLD_RANK", rank.clone()),
            ("OMPI_COMM_WORLD_LOCAL_RANK", rank),
            ("OMPI_COMM_WORLD_SIZE", "2".into()),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2".into()),
            ("MASTER_PORT", port),
        ],
        other => panic!("no launcher {other}"),
    }
}

/// The launchers' variables removed (an outer launcher's would leak into the children), then
/// `env` set.
fn launched_kiln(config: &Path, env: Vec<(&'static str, String)>, extra: &[String]) -> Command {
    let mut command = kiln();
    for name in ["TORCHELASTIC_USE_AGENT_STORE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_STEP_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"] {
        command.env_remove(name);
    }
    command.args(["pretrain", "--config", config.to_str().unwrap(), "--dist-timeout", "60"]).args(extra).envs(env);
    command
}

/// Two processes, each with its environment and flags, run to the end.
fn run_launched(config: &Path, process: impl Fn(usize) -> (Vec<(&'static str, String)>, Vec<String>)) -> Vec<Output> {
    let children: Vec<Child> = (0..2)
        .map(|rank| {
            let (env, extra) = process(rank);
            launched_kiln(config, env, &extra).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap()
        })
        .collect();
    children.into_iter().map(|c| c.wait_with_output().unwrap()).collect()
}

/// Two processes started the way torchrun, Slurm's srun and Open MPI's mpirun start them — no
/// kiln launch flag, only each launcher's environment — equal one process with the whole batch,
/// as the `--nnodes` form does; so do two whose environment is wrong where flags correct it
/// (both told RANK=0 and a master port that is taken: --node-rank and --master-addr win).
#[test]
fn processes_placed_by_each_launchers_environment_match_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let steps = 3;
    let single = write_config(dir, "single", 4, steps, "");
    let out = kiln().args(["pretrain", "--config", single.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let expected = weights(&dir.join(format!("single/checkpoint-{steps}")));
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    // Recent torchrun's agent of rank 0 listens on MASTER_PORT itself (its workers share its
    // store): a listener stands in for it, and kiln takes the port after it.
    let (agent, agent_port) = loop {
        let agent = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = agent.local_addr().unwrap().port();
        if port < u16::MAX && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            break (agent, port);
        }
    };
    for launcher in ["torchrun", "torchrun sharing its store", "Slurm", "Open MPI", "flags over torchrun"] {
        let name = launcher.replace(' ', "_");
        let config = write_config(dir, &name, 2, steps, "");
        let port = free_port();
        let outputs = if launcher == "flags over torchrun" {
            run_launched(&config, |rank| {
                (launcher_environment("torchrun", 0, taken_port), vec!["--node-rank".into(), rank.to_string(), "--master-addr".into(), format!("127.0.0.1:{port}")])
            })
        } else if launcher == "torchrun sharing its store" {
            run_launched(&config, |rank| {
                let mut env = launcher_environment("torchrun", rank, agent_port);
                env.push(("TORCHELASTIC_USE_AGENT_STORE", "True".into()));
                (env, vec![])
            })
        } else {
            run_launched(&config, |rank| (launcher_environment(launcher, rank, port), vec![]))
        };
        succeed(&outputs);
        let (first, second) = (stderr(&outputs[0]), stderr(&outputs[1]));
        if launcher == "flags over torchrun" {
            let line = format!("kiln: rank 1 of 2 from torchrun's environment (local rank 0 of 2, machine 0 of 1; master 127.0.0.1:{port} from --master-addr), rank from --node-rank instead of the environment's 0; rank 0 shows progress");
            assert!(second.contains(&line), "{second}");
        } else if launcher == "torchrun sharing its store" {
            let line = format!(
                "kiln: rank 1 of 2 from torchrun's environment (local rank 1 of 2, machine 0 of 1; master 127.0.0.1:{} from MASTER_ADDR and MASTER_PORT+1 (torchrun's agent serves MASTER_PORT={agent_port}: TORCHELASTIC_USE_AGENT_STORE=True))",
                agent_port + 1
            );
            assert!(second.contains(&line), "{second}");
        } else {
            let master = if launcher == "Slurm" { "SLURM_JOB_NODELIST's first host and MASTER_PORT" } else { "MASTER_ADDR and MASTER_PORT" };
            let master = if launcher == "Open MPI" { "127.0.0.1: all 2 processes are on this machine (OMPI_COMM_WORLD_LOCAL_SIZE) and MASTER_PORT" } else { master };
            assert!(first.contains(&format!("kiln: rank 0 of 2 from {launcher}'s environment (local rank 0 of 2")), "{first}");
            assert!(second.contains(&format!("kiln: rank 1 of 2 from {launcher}'s environment (local rank 1 of 2")), "{second}");
            assert!(second.contains(&format!("master 127.0.0.1:{port} from {master})")), "{second}");
        }
        let difference = max_relative_difference(&weights(&dir.join(format!("{name}/checkpoint-{steps}"))), &expected);
        assert!(difference <= 1e-6, "{launcher}: 2 processes × micro-batch 2 vs 1 × 4: weights differ by {difference:e} relative");
        let (multi, one) = (losses(&dir.join(&name)), losses(&dir.join("single")));
        assert_eq!(multi.len(), steps as usize);
        for (x, y) in multi.iter().zip(&one) {
            assert!((x - y).abs() <= 1e-5 * y.abs(), "{launcher}: losses {multi:?} vs {one:?}");
        }
    }
    drop((taken, agent));
}

/// A launcher's environment that kiln cannot use is one line naming what is wrong, before any
/// work; `--nnodes` makes kiln ignore the environment altogether.
#[test]
fn launcher_environment_errors_are_one_line_and_nnodes_ignores_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let config = write_config(dir, "run", 2, 1, "");
    let half = vec![("RANK", "1".to_string()), ("MASTER_ADDR", "127.0.0.1".to_string())];
    let out = launched_kiln(&config, half.clone(), &[]).output().unwrap();
    assert!(!out.status.success());
    assert_eq!(
        last_line(&out),
        "error: torchrun's environment is incomplete: RANK, MASTER_ADDR set but WORLD_SIZE, LOCAL_RANK unset (a launched process needs all of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR; without a launcher use --nnodes, --node-rank and --master-addr)",
        "{}",
        stderr(&out)
    );
    // Open MPI over several machines needs MASTER_ADDR.
    let mut spread = launcher_environment("Open MPI", 1, 29500);
    spread.retain(|(k, _)| *k != "OMPI_COMM_WORLD_LOCAL_SIZE");
    let out = launched_kiln(&config, spread, &[]).output().unwrap();
    assert!(last_line(&out).starts_with("error: Open MPI's environment names no master: export MASTER_ADDR"), "{}", stderr(&out));
    // Two processes on this machine cannot each drive two devices.
    let out = launched_kiln(&config, launcher_environment("torchrun", 1, 29500), &["--devices".into(), "cpu,cpu".into()]).output().unwrap();
    assert!(last_line(&out).starts_with("error: torchrun started 2 processes on this machine and --devices names 2 devices for each"), "{}", stderr(&out));
    // --nnodes 1: one process, whatever the environment says (it would wait for rank 0 otherwise).
    let out = launched_kiln(&config, half, &["--nnodes".into(), "1".into()]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("kiln: rank"), "{}", stderr(&out));
    assert!(dir.join("run/checkpoint-1").is_dir());
}
