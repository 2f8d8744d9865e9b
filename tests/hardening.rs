//! Bad user input through the `kiln` binary: every case exits non-zero with exactly one line on
//! stderr that names the input, never a panic, and nothing is trained or written first.
//!
//! Inputs: token ids outside the vocabulary or beyond the context (`logprobs`, `generate`, SFT
//! data), `cutoff_len` / `max_length` above the model's context, sampling knobs, time budgets
//! (`time_budget_s`, `--minutes`), `bench` counts, optimizer state that does not match the model
//! on resume, truncated or corrupt safetensors, config.json with wrong types, JSONL with a bad
//! line.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::fixture;
use kiln::backends::Cpu;
use kiln::model::hf::{self, SaveDtype};
use kiln::model::{Qwen2, Qwen2Config};
use kiln::tokenizer::Tokenizer;
use safetensors::SafeTensors;
use safetensors::tensor::TensorView;

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).env_remove("RUST_BACKTRACE").output().unwrap()
}

/// Runs `kiln args`, expecting a failure: a non-zero exit, exactly one line on stderr, no panic,
/// and that line containing every one of `expected`.
fn fails_with(args: &[&str], expected: &[&str]) -> String {
    let out = kiln(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "kiln {args:?} should fail; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "kiln {args:?} panicked: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "kiln {args:?}: one line expected, got: {stderr}");
    assert!(lines[0].starts_with("error:"), "{stderr}");
    for e in expected {
        assert!(lines[0].contains(e), "kiln {args:?}: {:?} should contain {e:?}", lines[0]);
    }
    lines[0].to_string()
}

fn ok(args: &[&str]) -> Output {
    let out = kiln(args);
    assert!(out.status.success(), "kiln {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn ids(range: std::ops::Range<u32>) -> String {
    range.map(|i| (i % 90 + 3).to_string()).collect::<Vec<_>>().join(",")
}

#[test]
fn token_ids_and_sampling_knobs() {
    // tied_gqa2: vocab_size 97, context 256.
    let model = fixture("hf/tied_gqa2");
    let m = s(&model);
    fails_with(&["logprobs", "--model", m, "--ids", "5,97"], &["--ids", "token id 97 >= vocab_size 97"]);
    fails_with(&["logprobs", "--model", m, "--ids", &ids(0..257)], &["--ids", "257 tokens", "context is 256"]);
    fails_with(&["generate", "--model", m, "--prompt-ids", "5,4000000000"], &["token id 4000000000 >= vocab_size 97"]);
    fails_with(&["generate", "--model", m, "--prompt-ids", &ids(0..256)], &["--prompt-ids: the prompt has 256 tokens", "context is 256"]);
    // A prompts file's bad prompt is named by the file and its line (blank lines counted), also
    // when --prompt-logprobs scores the prompts first.
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    std::fs::write(&prompts, "{\"prompt_ids\": [5, 6]}\n\n{\"prompt_ids\": []}\n").unwrap();
    let at = format!("{} line 3: the prompt is empty", s(&prompts));
    fails_with(&["generate", "--model", m, "--prompts", s(&prompts)], &[&at]);
    fails_with(&["generate", "--model", m, "--prompts", s(&prompts), "--json", "--prompt-logprobs"], &[&at]);
    // More samples than memory holds is one line, not an aborted allocation.
    fails_with(&["generate", "--model", m, "--prompt-ids", "5,6", "--n", "100000000000000"], &["1 prompts × n 100000000000000 samples do not fit in memory"]);
    // An empty stop string would stop every sample at its first token (vLLM refuses it too).
    fails_with(&["generate", "--model", m, "--prompt-ids", "5,6", "--stop", ""], &["--stop cannot be an empty string"]);
    // A temperature too small to divide by decodes greedily (vLLM's rule), rather than sampling
    // from infinite logits.
    let greedy = |t: &str| ok(&["generate", "--model", m, "--prompt-ids", "5,6", "--max-new-tokens", "6", "--json", "--temperature", t]).stdout;
    assert_eq!(greedy("1e-40"), greedy("0"));
    for (knob, expected) in [
        ("--temperature=-1", "temperature must be a finite number >= 0"),
        ("--temperature=nan", "temperature must be a finite number >= 0"),
        ("--temperature=inf", "temperature must be a finite number >= 0"),
        ("--top-p=0", "top_p must be in (0, 1]"),
        ("--top-p=nan", "top_p must be in (0, 1]"),
        ("--top-p=1.5", "top_p must be in (0, 1]"),
    ] {
        fails_with(&["generate", "--model", m, "--prompt-ids", "5,6", knob], &[expected]);
    }
    // At the limits, it works: a full-context sequence scores, a prompt one short of it samples.
    ok(&["logprobs", "--model", m, "--ids", &ids(0..256)]);
    ok(&["generate", "--model", m, "--prompt-ids", &ids(0..255), "--max-new-tokens", "4", "--seed", "1"]);
}

#[test]
fn counts_and_time_budgets() {
    let tmp = tempfile::tempdir().unwrap();
    let config = fixture("hf/tied_gqa2/config.json");
    for (flag, value) in [("--repeats", "0"), ("--new-tokens", "0"), ("--batch", "0"), ("--prompt-len", "0")] {
        fails_with(&["bench", "--config", s(&config), flag, value], &[flag, "expected a whole number of at least 1"]);
    }
    fails_with(&["bench", "--matmul", "--model", s(config.parent().unwrap())], &["--matmul needs --config"]);
    // `kiln plan`: an unknown backend (was planned as wgpu), a length past the context, a step's
    // tokens that overflowed.
    let context = serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(&config).unwrap()).unwrap()["max_position_embeddings"].as_u64().unwrap();
    let beyond = (context + 1).to_string();
    fails_with(&["plan", "--config", s(&config), "--batch", "1", "--seq", "8", "--backend", "gpu"], &["--backend \"gpu\": expected cpu, cuda or wgpu"]);
    fails_with(&["plan", "--config", s(&config), "--batch", "1", "--seq", &beyond], &["--seq", "more than the model's context"]);
    fails_with(&["plan", "--config", s(&config), "--batch", "18446744073709551615", "--seq", "8"], &["more than 2^32 tokens a step"]);
    let interplay = tmp.path().join("interplay");
    fails_with(&["data", "interplay", "--ops", "2,3", "--per-op", "18446744073709551615", "--out", s(&interplay)], &["--per-op", "more rows than can be counted"]);
    assert!(!interplay.exists());
    let out = tmp.path().join("quickstart");
    for minutes in ["--minutes=-1", "--minutes=nan", "--minutes=inf", "--minutes=1e300"] {
        fails_with(&["quickstart", "--out", s(&out), minutes], &["--minutes", "expected a finite number of minutes >= 0"]);
    }
    fails_with(&["quickstart", "--out", s(&out), "--steps", "0"], &["--steps"]);
    assert!(!out.exists(), "nothing is written for bad arguments");
    // Another model, or a config the quickstart did not write, where it writes its own: refused
    // before anything is written, and left as they were.
    std::fs::create_dir_all(out.join("model")).unwrap();
    std::fs::write(out.join("model/config.json"), "{\"mine\": 1}").unwrap();
    fails_with(&["quickstart", "--out", s(&out)], &[s(&out.join("model/config.json")), "exists with other contents"]);
    std::fs::remove_dir_all(out.join("model")).unwrap();
    std::fs::write(out.join("pretrain.toml"), "# mine\n").unwrap();
    fails_with(&["quickstart", "--out", s(&out)], &[s(&out.join("pretrain.toml")), "not written by `kiln quickstart`"]);
    assert_eq!(std::fs::read_to_string(out.join("pretrain.toml")).unwrap(), "# mine\n");
    assert_eq!(listing(&out), ["pretrain.toml"], "nothing else written");

    let run = tmp.path().join("run.toml");
    for budget in ["-5.0", "nan", "inf", "-inf"] {
        let text = format!(
            "[model]\ninit = \"c.json\"\n\n[data]\nkind = \"sft\"\npath = \"sft.jsonl\"\n\n[train]\nsteps = 1\nmicro_batch = 1\n\n[optimizer]\nlr = 1e-3\n\n[output]\ndir = \"o\"\ntime_budget_s = {budget}\n"
        );
        std::fs::write(&run, text).unwrap();
        fails_with(&["sft", "--config", s(&run)], &[s(&run), "time_budget_s must be a finite number of seconds >= 0"]);
    }
    // Finite, but more seconds than a duration holds (they panicked in `Duration::from_secs_f64`).
    let text = |budget: &str| format!(
        "[model]\ninit = \"c.json\"\n\n[data]\nkind = \"sft\"\npath = \"sft.jsonl\"\n\n[train]\nsteps = 1\nmicro_batch = 1\n\n[optimizer]\nlr = 1e-3\n\n[output]\ndir = \"o\"\ntime_budget_s = {budget}\n"
    );
    std::fs::write(&run, text("1e20")).unwrap();
    fails_with(&["sft", "--config", s(&run)], &[s(&run), "time_budget_s", "more seconds than a duration holds"]);
    std::fs::write(&run, text("10")).unwrap();
    fails_with(&["sft", "--config", s(&run), "--dist-timeout", "1e20"], &["--dist-timeout", "at most 1e9"]);

    // An `[output] name` with a '/' (its checkpoints would land where resume and the overwrite
    // guard never look), a `save_steps` of a fraction above 1 (was cut to 1: every step saved),
    // batch sizes whose product overflows or that would copy samples for hours before a step.
    let sft = |train: &str, output: &str| {
        format!("[model]\ninit = \"c.json\"\n\n[data]\nkind = \"sft\"\npath = \"sft.jsonl\"\n\n[train]\nsteps = 1\n{train}\n\n[optimizer]\nlr = 1e-3\n\n[output]\ndir = \"o\"\n{output}\n")
    };
    for (train, output, expected) in [
        ("micro_batch = 1", "name = \"a/b\"", "[output] name \"a/b\" must be a plain name"),
        ("micro_batch = 1", "save_steps = 1.5", "[output] save_steps must be a whole number of steps"),
        ("micro_batch = 1", "save_steps = nan", "[output] save_steps must be a whole number of steps"),
        ("micro_batch = 4294967296\ngrad_accum = 4294967296", "", "micro_batch × grad_accum (4294967296 × 4294967296)"),
        ("micro_batch = 100000000000", "", "sequences per step"),
    ] {
        std::fs::write(&run, sft(train, output)).unwrap();
        fails_with(&["sft", "--config", s(&run)], &[s(&run), expected]);
    }
    assert!(!tmp.path().join("o").exists(), "nothing is written for bad configs");
}

/// A chat tokenizer, a small model written for it (`vocab_size`, context and width as given) and
/// six SFT rows, under `dir`; returns the model directory.
fn sft_setup(dir: &Path, vocab_size: Option<usize>, context: usize, hidden: usize) -> PathBuf {
    let texts: Vec<String> = (0..60).map(|i| format!("What is {i} plus {}? It is {}.", i % 7, i + i % 7)).collect();
    let tokenizer = Tokenizer::train_byte_level_bpe(texts.iter().cloned(), 300, &["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        .unwrap()
        .with_special_tokens("<|im_end|>", "<|endoftext|>")
        .unwrap();
    let model_dir = dir.join("model");
    let tokenizer_dir = dir.join("tokenizer");
    std::fs::create_dir_all(&tokenizer_dir).unwrap();
    tokenizer.save(&tokenizer_dir).unwrap();
    let config: Qwen2Config = serde_json::from_value(serde_json::json!({
        "vocab_size": vocab_size.unwrap_or(tokenizer.vocab_size()), "hidden_size": hidden, "intermediate_size": 2 * hidden,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": true,
        "max_position_embeddings": context, "rope_theta": 10000.0, "eos_token_id": tokenizer.eos_id(),
    }))
    .unwrap();
    let model: Qwen2<Cpu> = Qwen2::random(&config, 1, &Default::default()).unwrap();
    hf::save(&model, &model_dir, SaveDtype::F32, Some(&tokenizer_dir)).unwrap();
    let rows: String = (0..6)
        .map(|i| format!("{{\"prompt\": \"What is {i} plus 2?\", \"completion\": \"It is {}.\"}}\n", i + 2))
        .collect();
    std::fs::write(dir.join("sft.jsonl"), rows).unwrap();
    model_dir
}

fn sft_toml(data: &str, train: &str, output: &str) -> String {
    format!(
        "[model]\nfrom = \"model\"\n\n[data]\nkind = \"sft\"\npath = \"sft.jsonl\"\nsystem_prompt = \"\"\n{data}\n\n[train]\n{train}\nmicro_batch = 2\nseed = 3\n\n[optimizer]\nlr = 1e-3\n\n[output]\n{output}\n"
    )
}

#[test]
fn data_that_does_not_fit_the_model_fails_before_any_step() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run.toml");
    let r = s(&run);
    let out = tmp.path().join("out");

    // Ids beyond a model vocabulary smaller than the tokenizer's.
    sft_setup(tmp.path(), Some(40), 128, 32);
    std::fs::write(&run, sft_toml("", "steps = 2", "dir = \"out\"")).unwrap();
    fails_with(&["sft", "--config", r], &["sft.jsonl line 1: the row has token id", "outside the vocabulary", "vocab_size 40"]);
    assert!(!out.exists(), "no step was taken");

    // Rows longer than the context, without max_length; max_length and cutoff_len above it.
    std::fs::remove_dir_all(tmp.path().join("model")).unwrap();
    let model = sft_setup(tmp.path(), None, 16, 32);
    let config = model.join("config.json");
    fails_with(&["sft", "--config", r], &["sft.jsonl line 1: the row has", "more than the model's context (16)", "max_length"]);
    std::fs::write(&run, sft_toml("max_length = 64", "steps = 2", "dir = \"out\"")).unwrap();
    fails_with(&["sft", "--config", r], &[s(&config), "context is 16 tokens", "max_length = 64"]);
    std::fs::write(&run, sft_toml("max_length = 16\ncutoff_len = 64", "steps = 2", "dir = \"out\"")).unwrap();
    fails_with(&["sft", "--config", r], &[s(&config), "context is 16 tokens", "cutoff_len = 64"]);
    let pretrain = format!(
        "[model]\ninit = \"{}\"\n\n[data]\nkind = \"mixture\"\nroot = \"data\"\nops = [2]\nprobs = [1.0]\ntokens = 1e3\ncutoff_len = 512\n\n[train]\nsteps = 1\nmicro_batch = 1\n\n[optimizer]\nlr = 1e-3\n\n[output]\ndir = \"out\"\n",
        s(&config)
    );
    std::fs::write(&run, pretrain).unwrap();
    fails_with(&["pretrain", "--config", r], &[s(&config), "cutoff_len = 512"]);
    assert!(!out.exists(), "no step was taken");

    // A JSONL line that is not a row.
    std::fs::write(tmp.path().join("sft.jsonl"), "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\"\n").unwrap();
    std::fs::write(&run, sft_toml("max_length = 16", "steps = 2", "dir = \"out\"")).unwrap();
    fails_with(&["sft", "--config", r], &["sft.jsonl line 2"]);

    // A row too long is named by its line, not by its place among the rows kept for training (a
    // blank line and a held-out row before it shifted that).
    std::fs::remove_dir_all(tmp.path().join("model")).unwrap();
    sft_setup(tmp.path(), None, 64, 32);
    let row = |i: usize, answer: &str| format!("{{\"id\": \"r{i}\", \"prompt\": \"What is {i} plus 2?\", \"completion\": \"{answer}\"}}\n");
    let text = [row(0, "It is 2."), "\n".into(), row(1, "It is 3."), row(2, "It is 4."), row(3, &"It is 5. ".repeat(40))].concat();
    std::fs::write(tmp.path().join("sft.jsonl"), text).unwrap();
    std::fs::write(&run, sft_toml("heldout = 1", "steps = 2", "dir = \"out\"")).unwrap();
    fails_with(&["sft", "--config", r], &["sft.jsonl line 5: the row has", "more than the model's context (64)"]);
}

#[test]
fn broken_model_files() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for file in ["config.json", "model.safetensors"] {
            std::fs::copy(fixture("hf/tied_gqa2").join(file), dir.join(file)).unwrap();
        }
        dir
    };
    let bytes = std::fs::read(fixture("hf/tied_gqa2/model.safetensors")).unwrap();

    let truncated = copy("truncated");
    std::fs::write(truncated.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let header = copy("bad_header");
    let mut corrupt = bytes.clone();
    corrupt[8..24].copy_from_slice(b"!!!!!!!!!!!!!!!!");
    std::fs::write(header.join("model.safetensors"), corrupt).unwrap();
    let huge = copy("huge_header");
    let mut corrupt = bytes.clone();
    corrupt[..8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    std::fs::write(huge.join("model.safetensors"), corrupt).unwrap();
    let empty = copy("empty");
    std::fs::write(empty.join("model.safetensors"), b"").unwrap();
    for dir in [&truncated, &header, &huge, &empty] {
        let file = dir.join("model.safetensors");
        fails_with(&["logprobs", "--model", s(dir), "--ids", "1,2"], &[s(&file), "not a valid safetensors file"]);
        fails_with(&["generate", "--model", s(dir), "--prompt-ids", "1,2"], &[s(&file), "not a valid safetensors file"]);
    }

    let types = copy("types");
    let config = types.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap().replace("\"hidden_size\": 48", "\"hidden_size\": \"48\"");
    assert!(text.contains("\"48\""));
    std::fs::write(&config, text).unwrap();
    fails_with(&["logprobs", "--model", s(&types), "--ids", "1,2"], &[s(&config), "invalid type"]);
    std::fs::write(&config, "{\"vocab_size\": -3}").unwrap();
    fails_with(&["generate", "--model", s(&types), "--prompt-ids", "1,2"], &[s(&config)]);
}

/// Rewrites the safetensors file at `path` with `edit` applied to its tensors (name → (shape,
/// f32 values)).
fn edit_safetensors(path: &Path, edit: impl FnOnce(&mut HashMap<String, (Vec<usize>, Vec<u8>)>)) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: HashMap<String, (Vec<usize>, Vec<u8>)> =
        st.tensors().into_iter().map(|(n, v)| (n, (v.shape().to_vec(), v.data().to_vec()))).collect();
    edit(&mut tensors);
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, (shape, data))| (n.clone(), TensorView::new(safetensors::Dtype::F32, shape.clone(), data).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// `dir/run.toml`: an SFT run of two steps saving every `save_steps`, run to its end into
/// `dir/out`.
fn two_step_sft_run(dir: &Path, save_steps: u64) -> PathBuf {
    sft_setup(dir, None, 64, 32);
    let run = dir.join("run.toml");
    std::fs::write(&run, sft_toml("max_length = 32", "steps = 2", &format!("dir = \"out\"\nsave_steps = {save_steps}"))).unwrap();
    ok(&["sft", "--config", s(&run)]);
    run
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn resuming_with_optimizer_state_of_another_model() {
    let tmp = tempfile::tempdir().unwrap();
    // Two steps and one checkpoint (with an earlier valid one, resume would fall back to it:
    // the next test); then the run is resumed for a third.
    let run = two_step_sft_run(tmp.path(), 2);
    let r = s(&run);
    let listing = || listing(&tmp.path().join("out"));
    let written = listing();
    assert_eq!(written, [".kiln.lock", "checkpoint-2", "metrics.jsonl"]);
    std::fs::write(&run, sft_toml("max_length = 32", "steps = 3", "dir = \"out\"\nsave_steps = 1")).unwrap();
    let checkpoint = tmp.path().join("out/checkpoint-2");
    let optimizer = checkpoint.join("optimizer.safetensors");
    let original = std::fs::read(&optimizer).unwrap();
    let restore = || std::fs::write(&optimizer, &original).unwrap();

    edit_safetensors(&optimizer, |t| {
        t.retain(|n, _| !n.starts_with("model.norm.weight"));
    });
    fails_with(&["sft", "--config", r, "--resume"], &[s(&optimizer), "missing: model.norm.weight"]);
    restore();
    edit_safetensors(&optimizer, |t| {
        let (shape, data) = t.get_mut("model.norm.weight.exp_avg").unwrap();
        shape[0] -= 1;
        data.truncate(data.len() - 4);
    });
    fails_with(&["sft", "--config", r, "--resume"], &[s(&optimizer), "moments of model.norm.weight have"]);
    restore();
    edit_safetensors(&optimizer, |t| {
        for kind in ["exp_avg", "exp_avg_sq"] {
            t.insert(format!("model.layers.7.mlp.up_proj.weight.{kind}"), (vec![2], vec![0; 8]));
        }
    });
    fails_with(&["sft", "--config", r, "--resume"], &[s(&optimizer), "another model", "model.layers.7"]);
    restore();
    edit_safetensors(&optimizer, |t| {
        let (shape, _) = t.get_mut("model.norm.weight.exp_avg").unwrap();
        *shape = vec![shape[0] / 8, 8];
    });
    fails_with(&["sft", "--config", r, "--resume"], &[s(&optimizer), "moments are stored flat"]);
    std::fs::write(&optimizer, &original[..original.len() / 3]).unwrap();
    fails_with(&["sft", "--config", r, "--resume"], &[s(&optimizer), "not a valid safetensors file"]);
    std::fs::write(checkpoint.join("trainer_state.json"), "{\"step\": \"two\"}").unwrap();
    fails_with(&["sft", "--config", r, "--resume"], &["trainer_state.json", "invalid type"]);

    // Nothing already written was touched by the failed resumes.
    assert_eq!(listing(), written);
}

/// A run that died before its first checkpoint leaves only its `metrics.jsonl`: starting the run
/// again (fresh, there being no checkpoint) keeps those records as `metrics.jsonl.prev` rather
/// than deleting them.
#[test]
fn a_fresh_start_keeps_the_earlier_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let run = two_step_sft_run(tmp.path(), 2);
    let out = tmp.path().join("out");
    std::fs::remove_dir_all(out.join("checkpoint-2")).unwrap();
    let earlier = std::fs::read(out.join("metrics.jsonl")).unwrap();
    assert!(!earlier.is_empty());
    ok(&["sft", "--config", s(&run)]);
    assert_eq!(listing(&out), [".kiln.lock", "checkpoint-2", "metrics.jsonl", "metrics.jsonl.prev"]);
    assert_eq!(std::fs::read(out.join("metrics.jsonl.prev")).unwrap(), earlier, "the earlier records are kept as they were");
    let steps: Vec<u64> = losses(&out.join("metrics.jsonl")).iter().map(|(step, _)| *step).collect();
    assert_eq!(steps, [1, 2], "the new run's log holds its own steps");
    // `--resume` with nothing to resume (a typo in `dir`, a changed name) says so, then starts.
    std::fs::remove_dir_all(out.join("checkpoint-2")).unwrap();
    let resumed = ok(&["sft", "--config", s(&run), "--resume"]);
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(stderr.contains(&format!("note: --resume: no checkpoint in {}; starting from step 0", out.display())), "{stderr}");
}

/// A checkpoint directory without its trainer state is a damaged checkpoint, not no checkpoint:
/// a resume sets it aside and continues from the previous one (it retrained from the start, then
/// failed when saving that step into the directory), and a fresh run is refused.
#[test]
fn a_checkpoint_without_its_trainer_state_is_a_damaged_one() {
    let tmp = tempfile::tempdir().unwrap();
    let run = two_step_sft_run(tmp.path(), 1);
    let out = tmp.path().join("out");
    std::fs::remove_file(out.join("checkpoint-2/trainer_state.json")).unwrap();
    fails_with(&["sft", "--config", s(&run)], &["already holds checkpoints"]);
    std::fs::write(&run, sft_toml("max_length = 32", "steps = 3", "dir = \"out\"\nsave_steps = 1")).unwrap();
    let resumed = ok(&["sft", "--config", s(&run), "--resume"]);
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(stderr.contains("trainer_state.json") && stderr.contains(&format!("resuming from {} instead", s(&out.join("checkpoint-1")))), "{stderr}");
    assert_eq!(listing(&out), [".kiln.lock", "checkpoint-1", "checkpoint-2", "checkpoint-2.corrupt", "checkpoint-3", "metrics.jsonl"]);
}

/// A latest checkpoint that cannot be loaded is kept aside (renamed, not deleted) and the run
/// resumes from the previous one with a warning naming both, then saves that step again.
#[test]
fn a_damaged_latest_checkpoint_falls_back_to_the_previous_one() {
    let tmp = tempfile::tempdir().unwrap();
    let run = two_step_sft_run(tmp.path(), 1);
    let out = tmp.path().join("out");
    let optimizer = out.join("checkpoint-2/optimizer.safetensors");
    let damaged = std::fs::read(&optimizer).unwrap()[..100].to_vec();
    std::fs::write(&optimizer, &damaged).unwrap();
    std::fs::write(&run, sft_toml("max_length = 32", "steps = 3", "dir = \"out\"\nsave_steps = 1")).unwrap();
    let resumed = ok(&["sft", "--config", s(&run), "--resume"]);
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    let warning = stderr.lines().find(|l| l.starts_with("warning:") && l.contains("instead")).unwrap_or_else(|| panic!("no warning in {stderr}"));
    for part in [s(&optimizer), &format!("resuming from {} instead", s(&out.join("checkpoint-1"))), &format!("kept as {}", s(&out.join("checkpoint-2.corrupt")))] {
        assert!(warning.contains(part), "{part:?} missing from {warning:?}");
    }
    assert_eq!(std::fs::read(out.join("checkpoint-2.corrupt/optimizer.safetensors")).unwrap(), damaged, "the damaged checkpoint is kept as it was");
    assert_eq!(listing(&out), [".kiln.lock", "checkpoint-1", "checkpoint-2", "checkpoint-2.corrupt", "checkpoint-3", "metrics.jsonl"]);
    let steps: Vec<u64> = losses(&out.join("metrics.jsonl")).iter().map(|(step, _)| *step).collect();
    assert_eq!(steps, [1, 2, 3], "the log reads as one run");
}

/// `metrics.jsonl` reaches the disk with each checkpoint, before it: traced with `strace`, every
/// rename of a checkpoint into place is preceded by an `fdatasync` of the metrics file written
/// since the previous checkpoint, so no crash (or power loss) leaves a checkpoint whose steps'
/// records are lost.
#[test]
fn metrics_are_synced_to_disk_before_each_checkpoint() {
    let strace = ["/usr/bin/strace", "/bin/strace"].into_iter().map(Path::new).find(|p| p.is_file());
    let strace = strace.expect("strace not found: install it (`apt-get install strace`) to trace the metrics file's fsync");
    let tmp = tempfile::tempdir().unwrap();
    sft_setup(tmp.path(), None, 64, 32);
    let run = tmp.path().join("run.toml");
    std::fs::write(&run, sft_toml("max_length = 32", "steps = 3", "dir = \"out\"\nsave_steps = 1")).unwrap();
    let trace = tmp.path().join("trace.txt");
    let out = Command::new(strace)
        .args(["-f", "-qq", "-y", "-e", "trace=fsync,fdatasync,rename,renameat,renameat2", "-o", s(&trace)])
        .arg(env!("CARGO_BIN_EXE_kiln"))
        .args(["sft", "--config", s(&run)])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kiln sft under strace failed: {stderr}");
    let trace = std::fs::read_to_string(&trace).unwrap();
    let metrics = s(&tmp.path().join("out/metrics.jsonl")).to_string();
    // (the run's events in order: a sync of the metrics file, or a checkpoint renamed into place)
    let mut events = Vec::new();
    for line in trace.lines() {
        if line.contains("sync(") && line.contains(&format!("<{metrics}>")) && line.ends_with("= 0") {
            events.push("sync".to_string());
        } else if line.contains("rename") && line.ends_with("= 0") {
            let target = line.rsplit_once(", \"").and_then(|(_, t)| t.split_once('"')).map(|(t, _)| t);
            if let Some(name) = target.and_then(|t| Path::new(t).file_name()).and_then(|n| n.to_str()) {
                if name.starts_with("checkpoint-") {
                    events.push(name.to_string());
                }
            }
        }
    }
    let expected = ["sync", "checkpoint-1", "sync", "checkpoint-2", "sync", "checkpoint-3"];
    let mut collapsed = events.clone();
    collapsed.dedup();
    assert_eq!(collapsed, expected, "events traced: {events:?}\n{trace}");
    assert_eq!(losses(&tmp.path().join("out/metrics.jsonl")).len(), 3);
}

fn losses(metrics: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|r| Some((r["step"].as_u64()?, r["loss"].as_f64()?)))
        .collect()
}

/// `kiln sft` killed with SIGKILL after its second checkpoint (of six, three steps per epoch)
/// resumes with `--resume` and ends bit-identical to an uninterrupted run: weights, optimizer
/// moments and every step's loss. A partial checkpoint directory left by the kill is swept.
#[test]
fn resume_after_sigkill_is_bit_identical_across_an_epoch_boundary() {
    let tmp = tempfile::tempdir().unwrap();
    // Six rows, two per micro-batch: an epoch is three steps; two epochs are six.
    sft_setup(tmp.path(), None, 64, 128);
    let config = |name: &str| {
        let path = tmp.path().join(format!("{name}.toml"));
        std::fs::write(&path, sft_toml("max_length = 48", "epochs = 2", &format!("dir = \"{name}\"\nsave_steps = 1"))).unwrap();
        path
    };
    let (whole, cut) = (config("whole"), config("cut"));
    ok(&["sft", "--config", s(&whole)]);

    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["sft", "--config", s(&cut)])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = tmp.path().join("cut");
    let began = Instant::now();
    while !out.join("checkpoint-2/trainer_state.json").is_file() {
        assert!(child.try_wait().unwrap().is_none(), "kiln sft exited before its second checkpoint");
        assert!(began.elapsed() < Duration::from_secs(600), "no second checkpoint after 10 minutes");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let latest = kiln::train::checkpoint::latest(&out).unwrap().unwrap().0;
    eprintln!("killed after checkpoint {latest}");
    // Steps take about a second here: the kill lands before the epoch boundary (after step 3).
    assert!((2..=3).contains(&latest), "killed after checkpoint {latest}: the resumed run should cross the epoch boundary");
    // What a kill during a checkpoint's write leaves behind.
    let partial = out.join(format!(".checkpoint-{}.partial-{}", latest + 1, child.id()));
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("model.safetensors"), b"half a file").unwrap();

    let resumed = ok(&["sft", "--config", s(&cut), "--resume"]);
    assert!(String::from_utf8_lossy(&resumed.stderr).contains("6 steps"), "{}", String::from_utf8_lossy(&resumed.stderr));
    let leftovers: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.contains(".partial-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let (a, b) = (tmp.path().join("whole/checkpoint-6").join(file), out.join("checkpoint-6").join(file));
        assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "{file} differs after the resume (killed after step {latest})");
    }
    let (a, b) = (losses(&tmp.path().join("whole/metrics.jsonl")), losses(&out.join("metrics.jsonl")));
    assert_eq!(a.len(), 6);
    assert_eq!(a, b, "per-step losses (killed after step {latest})");
}

/// `--resume` under a config whose settings differ from the checkpoint's run is refused with one
/// line listing each changed setting (optimizer, schedule, seed, the model it starts from), and nothing
/// is written; `--allow-config-change` resumes with a warning; more steps only warn.
#[test]
fn resuming_under_a_changed_config_is_refused_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let run = two_step_sft_run(tmp.path(), 1);
    let r = s(&run);
    let out = tmp.path().join("out");
    let listing = || listing(&out);
    let before = listing();
    let metrics = std::fs::read(out.join("metrics.jsonl")).unwrap();

    // The learning rate, AdamW's beta2, the warm-up, the data seed and the model to start from
    // changed: refused, naming each.
    let changed = sft_toml("max_length = 32", "steps = 3", "dir = \"out\"\nsave_steps = 1")
        .replace("lr = 1e-3", "lr = 1.67e-2\nbeta2 = 0.95\n\n[schedule]\nwarmup_steps = 1")
        .replace("seed = 3", "seed = 4");
    std::fs::write(&run, changed.replace("from = \"model\"", "from = \"model2\"")).unwrap();
    std::fs::rename(tmp.path().join("model"), tmp.path().join("model2")).unwrap();
    let line = fails_with(
        &["sft", "--config", r, "--resume"],
        &["checkpoint-2", "optimizer.lr 0.001 → 0.0167", "optimizer.beta2 0.999 → 0.95", "schedule.warmup_steps (unset) → 1", "train.seed 3 → 4", "model.from", "--allow-config-change"],
    );
    assert!(!line.contains("train.steps"), "more steps are allowed: {line}");
    assert_eq!(listing(), before, "a refused resume writes nothing");
    assert_eq!(std::fs::read(out.join("metrics.jsonl")).unwrap(), metrics);

    // The data order cannot change mid-run: a new seed stays refused when allowed, with its
    // own line, and nothing is written.
    fails_with(&["sft", "--config", r, "--resume", "--allow-config-change"], &["trained on other data", "seed 3"]);
    assert_eq!(listing(), before, "a refused resume writes nothing");
    // Allowed: it resumes, warning once about the settings and once about the new total.
    std::fs::write(&run, changed.replace("from = \"model\"", "from = \"model2\"").replace("seed = 4", "seed = 3")).unwrap();
    let resumed = ok(&["sft", "--config", r, "--resume", "--allow-config-change"]);
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(stderr.contains("warning: resuming") && stderr.contains("with changed settings: model.from"), "{stderr}");
    assert!(stderr.contains("for 3 steps in all (its run planned 2)"), "{stderr}");
    assert!(out.join("checkpoint-3").is_dir());
}

/// A second run writing the output directory of a running one stops before touching it.
/// Without a terminal (a log file, a cluster job) a run still reports its progress: plain lines
/// with the position, the time so far and an ETA (every 30 s; `KILN_PROGRESS_EVERY` here).
#[test]
fn progress_without_a_terminal_is_plain_lines_with_an_eta() {
    let tmp = tempfile::tempdir().unwrap();
    sft_setup(tmp.path(), None, 64, 32);
    let run = tmp.path().join("run.toml");
    std::fs::write(&run, sft_toml("max_length = 32", "steps = 3", "dir = \"out\"")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(["sft", "--config", s(&run)]).env("KILN_PROGRESS_EVERY", "0").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(" steps after ") && l.contains(", ETA ")).collect();
    assert!(lines.iter().any(|l| l.trim_start().starts_with("3/3 steps after")), "{stderr}");
    assert!(lines.iter().any(|l| l.contains("ETA 0s")), "the last step's ETA is nothing left: {stderr}");
    // Data preparation, which has no step, reports as a stage of its own.
    assert!(stderr.lines().any(|l| l.trim_start().starts_with("6/6 rows after") && l.ends_with("rendering chat rows")), "{stderr}");
}

#[test]
fn a_second_writer_of_an_output_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    sft_setup(tmp.path(), None, 64, 32);
    let run = tmp.path().join("run.toml");
    std::fs::write(&run, sft_toml("max_length = 32", "steps = 1", "dir = \"out\"\nsave_steps = 1")).unwrap();
    // The first writer holds the directory's lock (as a running `kiln sft` does).
    let held = kiln::io::lock_dir(&tmp.path().join("out")).unwrap();
    fails_with(&["sft", "--config", s(&run)], &["out is being written by another kiln run", &format!("(pid {})", std::process::id())]);
    assert!(!tmp.path().join("out/metrics.jsonl").exists());
    drop(held);
    ok(&["sft", "--config", s(&run)]);
}

/// A model config whose weights cannot fit in memory is refused before anything is allocated,
/// and a benchmark longer than the model's positions is a one-line error.
#[test]
fn models_too_large_for_memory_and_benchmarks_past_the_context_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    // (Heads of 8: RoPE's tables stay small however wide the model.)
    let config = |name: &str, hidden: u64, positions: u64| {
        let path = tmp.path().join(name);
        let json = serde_json::json!({
            "vocab_size": 97, "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": positions, "tie_word_embeddings": true,
        });
        std::fs::write(&path, json.to_string()).unwrap();
        path
    };
    let huge = config("huge.json", 1 << 40, 64);
    fails_with(&["bench", "--config", s(&huge)], &["the model's weights need", "PiB in f32", "of memory available"]);
    fails_with(&["init", "--config", s(&huge), "--out", s(&tmp.path().join("m"))], &["the model's weights need"]);
    assert!(!tmp.path().join("m").exists());
    // RoPE's tables past 2^32 values (a capacity overflow, or an allocation failure that aborted).
    for positions in [100_000_000_000_000_000u64, 10_000_000_000] {
        let long = config("long.json", 32, positions);
        fails_with(&["bench", "--config", s(&long)], &["long.json", "`max_position_embeddings` 1", "is too large"]);
    }
    // An initializer_range that is not finite in f32 (rand's Normal refused it: a panic).
    let wide = tmp.path().join("wide.json");
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(config("w.json", 32, 64)).unwrap()).unwrap();
    json["initializer_range"] = serde_json::json!(1e39);
    std::fs::write(&wide, json.to_string()).unwrap();
    fails_with(&["init", "--config", s(&wide), "--out", s(&tmp.path().join("m"))], &["`initializer_range` 1", "must be a finite number"]);
    assert!(!tmp.path().join("m").exists());
    let short = config("short.json", 32, 64);
    fails_with(&["bench", "--config", s(&short), "--prompt-len", "60", "--new-tokens", "32"], &["--prompt-len 60 + --new-tokens 32", "64 positions"]);
    // Counts whose sum or product overflows: one line, not an overflow panic.
    let max = usize::MAX.to_string();
    fails_with(&["bench", "--config", s(&short), "--prompt-len", &max, "--new-tokens", "32"], &[&format!("--prompt-len {max}"), "is too large"]);
    fails_with(&["bench", "--matmul", "--config", s(&short), "--batch", "2", "--prompt-len", &max], &["--batch 2 × --prompt-len", "is too large"]);
    fails_with(&["bench", "--train", "--config", s(&short), "--repeats", &max], &[&format!("--repeats {max}"), "is too large"]);
}
