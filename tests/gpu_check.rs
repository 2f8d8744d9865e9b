//! `scripts/gpu-check.sh --dry-run` (the GPU acceptance script, exercised without a GPU): it
//! finds the kiln binary, plans within its 360-second budget, computes FLOPs and memory with
//! `kiln plan`, prints every command it would run, and writes its table and JSON file.

use std::process::Command;

#[test]
fn gpu_check_dry_run_prints_its_plan_within_budget() {
    for tool in ["bash", "python3"] {
        let found = Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
        assert!(found, "scripts/gpu-check.sh needs {tool}: install it (e.g. apt-get install {tool})");
    }
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gpu-check.sh"))
        .arg("--dry-run")
        .env("KILN_BIN", env!("CARGO_BIN_EXE_kiln"))
        .env("OUT", out_dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));

    let budget: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("budget ").and_then(|rest| rest.strip_suffix(" s")))
        .unwrap_or_else(|| panic!("no `budget N s` line in:\n{stdout}"))
        .parse()
        .unwrap();
    assert!(budget <= 360, "the plan takes {budget} s of GPU time, over 360");

    for expected in [
        "hf_parity-<hash> cuda",
        "half_precision-<hash> cuda",
        "bench --backend cuda:0 --config tests/fixtures/interplay/qwen2_100M/config.json --dtype bf16 --batch 64",
        "qwen2_100M_vocab151936.json --dtype f32 --batch 64",
        "bench --train --backend cuda:0 --config tests/fixtures/interplay/qwen2_100M/config.json --precision bf16-mixed --batch 8 --prompt-len 2048",
        "--precision bf16-mixed --recompute --batch 1 --prompt-len 4096",
        "libnvrtc",
        "scripts/torch_parity.py --kiln",
        "| train-1.5B-bf16-mixed | - | - | - |",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
    // Every step's limit is printed, and together they are the budget.
    let limits: u64 = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("+ (≤ ").and_then(|rest| rest.split_once("s)")).map(|(n, _)| n.parse::<u64>().unwrap()))
        .sum();
    assert_eq!(limits, budget, "step limits vs budget in:\n{stdout}");

    let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out_dir.path().join("results.json")).unwrap()).unwrap();
    let rows = results["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 7, "{results}");
    // MFU is against the peak of the dtype the matmuls run in, and the planned memory is beside it.
    let train = rows.iter().find(|r| r["name"] == "train-100M-f32").unwrap();
    assert_eq!(train["matmul_dtype"], "f32");
    assert!(train["planned_gib"].as_f64().unwrap() > 0.0);
    let table = std::fs::read_to_string(out_dir.path().join("results.md")).unwrap();
    assert!(table.contains("| gen-100M-v151936-bf16 |"), "{table}");
    // Decoding rows report the host's share of a step (issue 21's goal: under 10%).
    assert!(table.lines().next().unwrap().contains("| host share of a decoding step |"), "{table}");
}
