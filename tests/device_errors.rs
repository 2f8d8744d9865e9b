//! Device errors reach the user (wgpu on lavapipe): a tensor larger than the device's largest
//! buffer is refused before it is allocated, and a device thread that fails ends the command
//! with one `error:` line and a non-zero exit — never a benchmark figure computed after it.
#![cfg(feature = "wgpu")]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use kiln::backends::Wgpu;
use kiln::backends::device::max_buffer;

/// The device's largest buffer, as kiln reads it from the adapter.
fn limit() -> u64 {
    let device = common::wgpu_device();
    let limit = max_buffer::<Wgpu>(&device).expect("wgpu reports its largest buffer");
    assert!(limit >= 16 << 20, "implausibly small largest buffer: {limit}");
    limit
}

/// A small Qwen2 config.json with the given sizes.
fn config(dir: &Path, name: &str, hidden: usize, heads: usize, intermediate: usize, vocab: usize, positions: usize) -> String {
    let path = dir.join(name);
    let config = serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": 1,
        "num_attention_heads": heads, "num_key_value_heads": heads, "vocab_size": vocab,
        "max_position_embeddings": positions, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": true, "bos_token_id": 0, "eos_token_id": 1, "initializer_range": 0.02,
    });
    std::fs::write(&path, config.to_string()).unwrap();
    path.to_str().unwrap().to_string()
}

fn kiln(args: &[&str]) -> Output {
    // Mesa's Vulkan loader warns on stderr without a runtime directory.
    let runtime = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).env("XDG_RUNTIME_DIR", runtime.path()).output().unwrap()
}

/// The command failed with exactly one line, `error: …`, and printed no figure.
fn one_error_line(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "expected a failure; stdout: {}; stderr: {stderr}", String::from_utf8_lossy(&out.stdout));
    assert!(out.stdout.is_empty(), "a figure was printed after a device error: {}", String::from_utf8_lossy(&out.stdout));
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_string()
}

/// The smallest multiple of 256 tokens whose f32 attention scores over `heads` heads exceed
/// `limit`.
fn tokens_over(limit: u64, heads: u64) -> usize {
    (1..).map(|k| 256 * k).find(|t| heads * 4 * (*t as u64).pow(2) > limit).unwrap()
}

/// Attention whose dense f32 scores would exceed the device's largest buffer (once refused) runs
/// in chunks of queries (`model::chunked_attention`), in a training step and in generation's
/// prefill, and prints its figures.
#[test]
fn attention_scores_over_the_largest_buffer_are_computed_in_chunks() {
    let limit = limit();
    let tmp = tempfile::tempdir().unwrap();
    // 16 heads of 4 (1,536 tokens on lavapipe): the scores are over the limit at a quarter of
    // the tokens and of the products' work that 4 heads would need.
    let tokens = tokens_over(limit, 16);
    let config = config(tmp.path(), "config.json", 64, 16, 128, 97, tokens + 8);
    let len = tokens.to_string();
    for train in [true, false] {
        let mut args = vec!["bench", "--backend", "wgpu", "--config", &config, "--batch", "1", "--prompt-len", &len, "--new-tokens", "2", "--repeats", "1"];
        if train {
            args.push("--train");
        }
        let out = kiln(&args);
        assert!(out.status.success(), "train {train}: {}", String::from_utf8_lossy(&out.stderr));
        let figures: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let rate = if train { "tokens_per_s" } else { "prefill_tokens_per_s" };
        assert!(figures[rate].as_f64().is_some_and(|r| r > 0.0), "train {train}: {figures}");
    }
}

#[test]
fn weights_over_the_largest_buffer_are_refused_before_allocation() {
    let limit = limit();
    let tmp = tempfile::tempdir().unwrap();
    // An embedding [vocab, 64] f32 just over the limit.
    let vocab = (limit / (64 * 4) + 64) as usize;
    let config = config(tmp.path(), "config.json", 64, 4, 128, vocab, 64);
    let line = one_error_line(&kiln(&["bench", "--backend", "wgpu", "--config", &config, "--batch", "1", "--prompt-len", "8", "--new-tokens", "2"]));
    assert!(line.starts_with(&format!("error: weight model.embed_tokens.weight [{vocab}, 64] f32 needs ")), "{line}");
}

#[test]
fn a_failing_device_thread_ends_the_command_with_one_error_line() {
    let limit = limit();
    let tmp = tempfile::tempdir().unwrap();
    // Nothing kiln checks is large (one head of 32, a small vocab and small weights), but the
    // MLP's activations [1, 1024, intermediate] f32 are over the limit: the allocation fails on
    // cubecl's device thread, where kiln cannot see it coming.
    let tokens = 1024;
    let intermediate = (limit / (tokens as u64 * 4) + 256) as usize;
    assert!((intermediate * 32 * 4) as u64 <= limit, "the weights themselves fit");
    let config = config(tmp.path(), "config.json", 32, 1, intermediate, 97, tokens + 8);
    let line = one_error_line(&kiln(&["bench", "--backend", "wgpu", "--config", &config, "--batch", "1", "--prompt-len", "1024", "--new-tokens", "2", "--repeats", "1"]));
    assert!(line.starts_with("error: the device failed on thread DS"), "{line}");
    assert!(line.contains("can't allocate buffer"), "{line}");
}

/// `kiln bench` on wgpu reports the kernels burn's autotune chose (from cubecl's autotune cache):
/// at least one matmul kernel for the model's projections.
#[test]
fn bench_reports_the_kernels_autotune_chose() {
    limit();
    let tmp = tempfile::tempdir().unwrap();
    let config = config(tmp.path(), "config.json", 64, 4, 128, 97, 64);
    let out = kiln(&["bench", "--backend", "wgpu", "--config", &config, "--batch", "2", "--prompt-len", "16", "--new-tokens", "4", "--repeats", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let autotune = figures["autotune"].as_object().unwrap_or_else(|| panic!("no autotune object in {figures}"));
    let matmul = autotune.iter().find(|(op, _)| op.contains("matmul")).unwrap_or_else(|| panic!("no matmul in {autotune:?}"));
    let kernels = matmul.1.as_object().unwrap();
    assert!(kernels.values().all(|n| n.as_u64().unwrap() >= 1) && !kernels.is_empty(), "{kernels:?}");
    assert!(figures["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
}
