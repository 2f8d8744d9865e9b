//! `scripts/gpu-check.sh`, the GPU acceptance run, exercised without a GPU: `--dry-run` plans the
//! H200 run within its 400-second budget and prints every command; `--backend wgpu --small` runs
//! every row at small shapes on lavapipe, its parity rows against references torch made on the
//! CPU (`tests/fixtures/gpu_check/small.json`).

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn script(args: &[&str], out: &Path) -> std::process::Output {
    for tool in ["bash", "python3"] {
        let found = Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
        assert!(found, "scripts/gpu-check.sh needs {tool}: install it (e.g. apt-get install {tool})");
    }
    Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gpu-check.sh"))
        .args(args)
        .env("KILN_BIN", env!("CARGO_BIN_EXE_kiln"))
        .env("OUT", out)
        .env("PYTHON", "python3")
        .output()
        .unwrap()
}

fn results(out: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap()
}

#[test]
fn gpu_check_dry_run_prints_its_plan_within_budget() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = script(&["--dry-run"], out_dir.path());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));

    let budget: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("budget ").and_then(|rest| rest.strip_suffix(" s of 400 s")))
        .unwrap_or_else(|| panic!("no `budget N s of 400 s` line in:\n{stdout}"))
        .parse()
        .unwrap();
    assert!(budget <= 400, "the plan takes {budget} s of GPU time, over 400");

    for expected in [
        "scripts/gpu_parity.py reference --shapes full --device cuda --half bf16",
        "scripts/gpu_parity.py compare --reference",
        "--backend cuda:0",
        "bench --backend cuda:0 --config tests/fixtures/interplay/qwen2_100M/config.json --dtype f32 --batch 64 --prompt-len 128 --new-tokens 128",
        "qwen2_100M_vocab151936.json --dtype bf16 --batch 256",
        "bench --backend cuda:0 --config examples/configs/qwen2.5-coder-1.5b/config.json --dtype bf16 --batch 32",
        "bench --train --backend cuda:0 --config tests/fixtures/interplay/qwen2_100M/config.json --precision bf16-mixed --batch 8 --prompt-len 2048",
        "--precision bf16-mixed --batch 1 --prompt-len 4096 --repeats 2 --recompute",
        "benches/torch_rows.py --device cuda",
        "libnvrtc",
        "pretrain --config",
        "--collective nccl",
        "| train-1.5B-bf16-mixed | - | - | - | - | - | - | - |",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
    // Every step's limit is printed, and together they are the budget.
    let limits: u64 = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("+ (≤ ").and_then(|rest| rest.split_once("s)")).map(|(n, _)| n.parse::<u64>().unwrap()))
        .sum();
    assert_eq!(limits, budget, "step limits vs budget in:\n{stdout}");

    let results = results(out_dir.path());
    assert_eq!(results["nccl"], "not run", "the NCCL row is planned: {results}");
    let rows = results["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 7, "{results}");
    // MFU is against the peak of the dtype the matmuls run in, and the planned memory is beside it.
    let train = rows.iter().find(|r| r["name"] == "train-100M-f32").unwrap();
    assert_eq!(train["matmul_dtype"], "f32");
    assert!(train["planned_bytes"].as_f64().unwrap() > 1e9, "{train}");
    let one_five = rows.iter().find(|r| r["name"] == "train-1.5B-bf16-mixed").unwrap();
    assert_eq!(one_five["matmul_dtype"], "bf16");
    let table = std::fs::read_to_string(out_dir.path().join("results.md")).unwrap();
    assert!(table.contains("| gen-100M-v151936-bf16-b256 |"), "{table}");
    let header = table.lines().next().unwrap();
    for column in ["| kiln tok/s | torch tok/s | kiln / torch |", "| host share of a decoding step |", "| device peak: kiln (allocator) |"] {
        assert!(header.contains(column), "{column} in {header}");
    }
}

/// Every row of the acceptance run on wgpu at small shapes: kiln's log-probs, greedy tokens,
/// KV-cached decoding and AdamW steps against torch's (f32 and f16; WGSL has no bf16), and
/// kiln's speed rows with the device allocator's peak.
#[cfg(feature = "wgpu")]
#[test]
fn gpu_check_small_runs_every_row_on_wgpu() {
    common::wgpu_device();
    let out_dir = tempfile::tempdir().unwrap();
    // One of the two small models (CI time): head_dim 128 on wgpu is tests/packing.rs's.
    let out = script(&["--backend", "wgpu", "--small", "--only", "hd64_gqa4"], out_dir.path());
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let results = results(out_dir.path());

    let parity = results["parity"]["rows"].as_array().unwrap_or_else(|| panic!("no parity rows: {results}"));
    for kind in ["logprobs", "greedy", "kv-decode", "train-step"] {
        let found: Vec<&Value> = parity.iter().filter(|r| r["row"] == kind && r["model"] == "hd64_gqa4").collect();
        assert_eq!(found.len(), 2, "{kind}: one row per dtype in {results}");
        assert!(found.iter().all(|r| r["ok"] == true), "{kind}: {found:?}");
    }
    // f32 greedy paths agree to the last token, and decoding compared every one of them.
    for r in parity.iter().filter(|r| r["row"] == "greedy" && r["dtype"] == "f32") {
        assert!(r["agree"].as_array().unwrap().iter().all(|a| *a == r["of"]), "{r}");
    }

    let rows = results["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 7, "{results}");
    for row in rows {
        assert!(row["tokens_per_s"].as_f64().is_some_and(|t| t > 0.0), "no kiln figure: {row}");
        assert!(row["peak_bytes"].as_f64().is_some_and(|b| b > 0.0), "no device memory from the allocator: {row}");
        if row["kind"] == "generate" {
            assert!(row["host_share"].as_f64().is_some_and(|s| (0.0..=1.0).contains(&s)), "{row}");
        }
    }
    assert!(parity.iter().all(|r| r["model"] == "hd64_gqa4"), "--only: {results}");
    assert!(std::fs::read_to_string(out_dir.path().join("results.md")).unwrap().contains("| logprobs | hd64_gqa4 | f16 |"));
}

/// `scripts/multi-gpu-check.sh` on CPU replicas (the TCP ring; its CUDA form takes NCCL): two
/// processes placed by torchrun's environment train as one with twice the micro-batch, with and
/// without ZeRO-1, and `kiln bench --all-reduce` and `--all-gather` give a figure per size. Its
/// dry run plans the same on GPUs.
#[test]
fn multi_gpu_check_runs_on_cpu_replicas() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/multi-gpu-check.sh"))
        .args(["--backend", "cpu"])
        .env("KILN_BIN", env!("CARGO_BIN_EXE_kiln"))
        .env("OUT", out_dir.path())
        .env("PYTHON", "python3")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let results: Value = serde_json::from_str(&std::fs::read_to_string(out_dir.path().join("results.json")).unwrap()).unwrap();
    assert!(results["equivalence"].as_str().unwrap().starts_with("passed: weights within"), "{results}");
    let sharded = results["sharded"].as_str().unwrap();
    assert!(sharded.starts_with("passed: weights within") && sharded.ends_with("and byte for byte the unsharded run's weights and losses"), "{results}");
    for op in ["kiln", "kiln_all_gather"] {
        let rows = results[op].as_array().unwrap();
        assert_eq!(rows.len(), 2, "{op}: {results}");
        assert!(rows.iter().all(|r| r["world"] == 2 && r["busbw_gb_s"].as_f64().unwrap() > 0.0), "{op}: {results}");
    }

    let dry = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/multi-gpu-check.sh"))
        .args(["--dry-run", "--gpus", "8"])
        .env("OUT", out_dir.path().join("dry"))
        .env("PYTHON", "python3")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&dry.stdout);
    assert!(dry.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&dry.stderr));
    for expected in ["WORLD_SIZE=8 LOCAL_RANK=0..7", "pretrain --config", "--backend cuda", "bench --all-reduce --backend cuda --sizes 1048576,16777216,268435456,1073741824 --repeats 20", "bench --all-gather --backend cuda", "sharded.toml"] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
}
