//! `scripts/gpu-check.sh --dry-run` (the GPU acceptance script, exercised without a GPU): it
//! finds the kiln binary, plans the 1.5B step with `kiln plan` (choosing the precision that fits
//! 80 GB), and prints every command it would run and the results table.

use std::process::Command;

#[test]
fn gpu_check_dry_run_prints_its_plan() {
    for tool in ["bash", "python3"] {
        let found = Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
        assert!(found, "scripts/gpu-check.sh needs {tool}: install it (e.g. apt-get install {tool})");
    }
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gpu-check.sh"))
        .arg("--dry-run")
        .env("KILN_BIN", env!("CARGO_BIN_EXE_kiln"))
        .env_remove("OUT")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for expected in [
        "hf_parity-<hash> cuda",
        "half_precision-<hash> cuda",
        "bench --backend cuda:0 --config tests/fixtures/interplay/qwen2_100M/config.json --dtype bf16",
        "bench --train --backend cuda:0 --config tests/fixtures/interplay/qwen2_100M/config.json --precision bf16-mixed",
        "GiB for bf16-mixed; running bf16-pure (",
        "--precision bf16-pure --recompute --batch 1 --prompt-len 4096",
        "| sft-1.5B-bf16-pure | - | - | - |",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
}
