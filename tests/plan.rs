//! `kiln plan` against the peak resident memory of real training steps on the CPU: the tiny
//! model of `kiln quickstart` in f32, bf16-mixed with recomputation and bf16-pure,
//! each measured in a fresh `kiln bench --train` process (its `peak_rss_mib`, the kernel's
//! high-water mark, less `file_rss_mib`, the binary's pages). The process's own memory
//! (libraries, threads, allocator) is measured the same way on a model of a few hundred
//! parameters and taken off. Planned and measured agree within
//! 15% (one worker thread). The 100M model's figures come from `benches/plan_vs_rss.sh` (release build; minutes).

use std::path::Path;
use std::process::Command;

use kiln::model::Qwen2Config;
use kiln::plan::{PlanRequest, plan};
use kiln::tasks::interplay::tiny_model::TINY_CONFIG;
use kiln::train::Precision;

const MIB: f64 = 1024.0 * 1024.0;

/// `(measured peak RSS, planned peak)` in bytes: the smaller peak of two `kiln bench --train`
/// processes (what other work on the machine adds to one of them is not the job's).
fn measure(config_path: &Path, batch: usize, seq: usize, precision: Precision, recompute: bool) -> (f64, f64) {
    let (a, planned) = measure_once(config_path, batch, seq, precision, recompute);
    let (b, _) = measure_once(config_path, batch, seq, precision, recompute);
    (a.min(b), planned)
}

fn measure_once(config_path: &Path, batch: usize, seq: usize, precision: Precision, recompute: bool) -> (f64, f64) {
    // One worker thread (with two, each thread's transient buffers and allocator heap add a
    // varying few MiB that the plan does not model), and freed memory handed back to the system
    // at once (kiln's binary keeps it by default, for speed: its RSS is then the high-water mark
    // of everything ever allocated, not of what was alive together).
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .env("RAYON_NUM_THREADS", "1")
        .env("MIMALLOC_PURGE_DELAY", "0")
        .args(["bench", "--train", "--repeats", "1", "--config"])
        .arg(config_path)
        .args(["--batch", &batch.to_string(), "--prompt-len", &seq.to_string(), "--precision", precision.name()])
        .args(recompute.then_some("--recompute"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Less the pages that map files (the binary): how much of a 200 MB test binary is resident
    // depends on the page cache (the process without a model measured 57–65 MiB with them,
    // 13.2 ± 0.05 without).
    let file = figures["file_rss_mib"].as_f64().expect("file-backed RSS (Linux)");
    let measured = (figures["peak_rss_mib"].as_f64().expect("peak RSS (Linux)") - file) * MIB;
    let config = Qwen2Config::from_file(config_path).unwrap();
    (measured, plan(&config, PlanRequest { batch, seq, precision, devices: 1, recompute, cpu_kernels: true, gpu_kernels: false }).training_peak)
}

#[test]
fn plan_is_within_15_percent_of_measured_peak_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (tiny, empty) = (dir.path().join("tiny.json"), dir.path().join("empty.json"));
    std::fs::write(&tiny, TINY_CONFIG).unwrap();
    std::fs::write(
        &empty,
        r#"{"vocab_size": 16, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 1, "num_key_value_heads": 1, "max_position_embeddings": 16}"#,
    )
    .unwrap();
    let (base_measured, base_planned) = measure(&empty, 1, 4, Precision::F32, false);
    let runtime = base_measured - base_planned;
    eprintln!("process without a model: {:.1} MiB", runtime / MIB);
    for (batch, seq, precision, recompute) in [
        (4, 256, Precision::F32, false),
        // With recompute at 4 × 256 the tiny model's step holds ~30 MiB beyond its weights, and
        // one process measured 51.8 and 59.6 MiB in two runs: at 8 × 256 what the plan models
        // outweighs that spread (78.1–79.5 MiB in four runs, plan 79.1).
        (8, 256, Precision::Bf16Mixed, true),
        (4, 256, Precision::Bf16Pure, false),
    ] {
        let (measured, planned) = measure(&tiny, batch, seq, precision, recompute);
        let ratio = planned / (measured - runtime);
        eprintln!("{batch}×{seq} {precision} recompute={recompute}: planned {:.1} MiB, measured {:.1} MiB ({ratio:.3})", planned / MIB, (measured - runtime) / MIB);
        assert!((0.85..=1.15).contains(&ratio), "{precision} recompute={recompute}: planned {:.1} MiB vs measured {:.1} MiB", planned / MIB, (measured - runtime) / MIB);
    }
}
