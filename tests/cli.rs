//! The `kiln` binary end to end: generate / logprobs / init, JSON output, and one-line errors.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{Reference, fixture};
use serde_json::Value;

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().unwrap()
}

fn stdout_json_lines(out: &Output) -> Vec<Value> {
    assert!(out.status.success(), "kiln failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn one_line_error(out: &Output) -> String {
    assert!(!out.status.success(), "expected failure");
    let stderr = String::from_utf8(out.stderr.clone()).unwrap();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_string()
}

fn ids_arg(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[test]
fn generate_greedy_json_matches_transformers() {
    let reference = Reference::load("untied_mha");
    let model = reference.dir.to_str().unwrap();
    let prompt = ids_arg(&reference.expected.sequences[1]);
    let out = kiln(&["generate", "--model", model, "--prompt-ids", &prompt, "--temperature", "0", "--max-new-tokens", "32", "--json"]);
    let lines = stdout_json_lines(&out);
    assert_eq!(lines.len(), 1);
    let ids: Vec<u32> = serde_json::from_value(lines[0]["token_ids"].clone()).unwrap();
    assert_eq!(ids, reference.expected.greedy[1]);
    assert_eq!(lines[0]["logprobs"].as_array().unwrap().len(), 32);
    assert_eq!(lines[0]["finish_reason"], "length");
    // vLLM's `top_k = -1` (off) is taken, as 0; another negative count is one line.
    let off = kiln(&["generate", "--model", model, "--prompt-ids", &prompt, "--temperature", "0", "--max-new-tokens", "32", "--json", "--top-k", "-1"]);
    assert_eq!(stdout_json_lines(&off)[0]["token_ids"], lines[0]["token_ids"]);
    let err = one_line_error(&kiln(&["generate", "--model", model, "--prompt-ids", &prompt, "--top-k", "-2"]));
    assert!(err.contains("\"-2\" is not a count of tokens"), "{err}");

    // The same prompts from a JSONL file come back in file order, batched.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("prompts.jsonl");
    let jsonl: String =
        reference.expected.sequences.iter().map(|s| format!("{{\"prompt_ids\": {s:?}}}\n")).collect();
    std::fs::write(&file, jsonl).unwrap();
    let out = kiln(&["generate", "--model", model, "--prompts", file.to_str().unwrap(), "--temperature", "0", "--max-new-tokens", "32", "--json"]);
    let lines = stdout_json_lines(&out);
    for (i, line) in lines.iter().enumerate() {
        let ids: Vec<u32> = serde_json::from_value(line["token_ids"].clone()).unwrap();
        assert_eq!(ids, reference.expected.greedy[i], "prompt {i}");
    }
    // A KV-cache budget that holds one sequence at a time: the same tokens, one by one. This
    // model's cache takes 2 · 3 layers · 4 KV heads · 16 · 4 bytes = 1,536 bytes a position; on
    // the CPU it is paged in blocks of 64 positions, of which a sample of these prompts may
    // take two (its prompt's and its own copy of it): 2.5 blocks hold one.
    let longest = reference.expected.sequences.iter().map(Vec::len).max().unwrap() + 32;
    let per_row = 1536.0 * 64.0 * 2.5;
    let gib = |bytes: f64| format!("{}", bytes / (1u64 << 30) as f64);
    let out = kiln(&["generate", "--model", model, "--prompts", file.to_str().unwrap(), "--temperature", "0", "--max-new-tokens", "32", "--json", "--kv-memory", &gib(per_row)]);
    let lines = stdout_json_lines(&out);
    assert_eq!(lines.len(), reference.expected.greedy.len());
    for (i, line) in lines.iter().enumerate() {
        let ids: Vec<u32> = serde_json::from_value(line["token_ids"].clone()).unwrap();
        assert_eq!(ids, reference.expected.greedy[i], "prompt {i}, one sequence at a time");
    }
    let err = one_line_error(&kiln(&["generate", "--model", model, "--prompts", file.to_str().unwrap(), "--max-new-tokens", "32", "--kv-memory", &gib(0.6 * per_row)]));
    assert!(err.contains(&format!("does not hold one sequence of {longest} positions")), "{err}");
}

#[test]
fn logprobs_match_transformers() {
    let reference = Reference::load("tied_gqa2");
    let seq = &reference.expected.sequences[0];
    let out = kiln(&["logprobs", "--model", reference.dir.to_str().unwrap(), "--ids", &ids_arg(seq), "--json"]);
    let line = stdout_json_lines(&out).remove(0);
    assert_eq!(line["ids"], serde_json::json!(seq));
    assert_next_token_logprobs(line["logprobs"].as_array().unwrap(), seq, &reference, "single.0.logits", "");
}

/// `ours` (null for the first token) are the log-probs of `seq`'s tokens under transformers'
/// logits `tensor` of the reference, within 1e-4.
fn assert_next_token_logprobs(ours: &[serde_json::Value], seq: &[u32], reference: &Reference, tensor: &str, what: &str) {
    assert_eq!(ours.len(), seq.len());
    assert!(ours[0].is_null());
    let (shape, logits) = reference.tensor(tensor);
    let vocab = shape[1];
    for t in 1..seq.len() {
        let row = &logits[(t - 1) * vocab..t * vocab];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = max + row.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
        let expected = row[seq[t] as usize] as f64 - lse;
        let got = ours[t].as_f64().unwrap();
        assert!((got - expected).abs() < 1e-4, "{what}position {t}: {got} vs {expected}");
    }
}

fn write_tiny_config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tiny.json");
    std::fs::write(
        &path,
        r#"{"vocab_size": 2200, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": true,
            "max_position_embeddings": 256, "rope_theta": 1000000.0, "eos_token_id": 3}"#,
    )
    .unwrap();
    path
}

#[test]
fn init_then_generate_text_with_stop_string() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_tiny_config(tmp.path());
    let model = tmp.path().join("model");
    let tokenizer = fixture("interplay/qwen2_100M");
    let out = kiln(&["init", "--config", config.to_str().unwrap(), "--out", model.to_str().unwrap(), "--seed", "3", "--tokenizer-from", tokenizer.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(model.join("tokenizer.json").is_file());

    let m = model.to_str().unwrap();
    let out = kiln(&["generate", "--model", m, "--prompt", "<question> How many adult owl", "--n", "3", "--temperature", "1.0", "--top-k", "20", "--max-new-tokens", "16", "--stop", " 1", "--seed", "9", "--json"]);
    let lines = stdout_json_lines(&out);
    assert_eq!(lines.len(), 3);
    for line in &lines {
        assert!(!line["text"].as_str().unwrap().contains(" 1"), "stop string excluded: {line}");
    }

    // init refuses to overwrite what exists.
    let again = kiln(&["init", "--config", config.to_str().unwrap(), "--out", m]);
    assert!(one_line_error(&again).contains("already exists"));
    // `--config` naming a model directory copies that directory's tokenizer (was: its parent's,
    // here none).
    let copy = tmp.path().join("copy");
    let out = kiln(&["init", "--config", m, "--out", copy.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(copy.join("tokenizer.json")).unwrap(), std::fs::read(model.join("tokenizer.json")).unwrap());
}

/// `kiln init` of the tiny model (`config_extra`: more keys) with the `bos_tokenizer` fixture and
/// room for its BOS and EOS (2,201 and 2,202), into `dir/model`.
fn init_with_bos_tokenizer(dir: &Path, config_extra: &str, seed: &str) -> std::path::PathBuf {
    let config = write_tiny_config(dir);
    let text = std::fs::read_to_string(&config).unwrap().replace("\"vocab_size\": 2200", &format!("\"vocab_size\": 2240{config_extra}"));
    std::fs::write(&config, text).unwrap();
    let model = dir.join("model");
    let out = kiln(&["init", "--config", config.to_str().unwrap(), "--out", model.to_str().unwrap(), "--seed", seed, "--tokenizer-from", fixture("bos_tokenizer").to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    model
}

/// What stopped a sample, as vLLM's `check_stop` and detokenizer report and cut it: the
/// tokenizer's EOS has `stop_reason` null (an explicit stop id its id); `--min-tokens` keeps the
/// EOS from being sampled until then; `--include-stop-str-in-output` keeps the stop's text.
#[test]
fn stop_reasons_min_tokens_and_included_stops_as_in_vllm() {
    let tmp = tempfile::tempdir().unwrap();
    // (weights large enough for the greedy tokens to vary)
    let model = init_with_bos_tokenizer(tmp.path(), ", \"initializer_range\": 0.5", "1");
    let m = model.to_str().unwrap();
    let greedy = |extra: &[&str]| {
        let args: Vec<&str> = ["generate", "--model", m, "--prompt", "hello world", "--max-new-tokens", "12", "--temperature", "0", "--json"].iter().chain(extra).copied().collect();
        stdout_json_lines(&kiln(&args)).remove(0)
    };
    let free = greedy(&["--ignore-eos"]);
    let ids: Vec<u64> = free["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    // The tokenizer's EOS made the first token of the free run not seen before it.
    let at = (1..ids.len()).find(|&i| !ids[..i].contains(&ids[i])).unwrap();
    let tokenizer: Value = serde_json::from_str(&std::fs::read_to_string(model.join("tokenizer.json")).unwrap()).unwrap();
    let (eos, _) = tokenizer["model"]["vocab"].as_object().unwrap().iter().find(|(_, id)| id.as_u64() == Some(ids[at])).unwrap();
    let config_path = model.join("tokenizer_config.json");
    let mut tokenizer_config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    tokenizer_config["eos_token"] = eos.as_str().into();
    std::fs::write(&config_path, tokenizer_config.to_string()).unwrap();

    let stopped = greedy(&[]);
    assert_eq!(stopped["token_ids"], serde_json::json!(ids[..=at]), "stopped at the EOS");
    assert_eq!((&stopped["finish_reason"], &stopped["stop_reason"]), (&"stop".into(), &Value::Null), "{stopped}");
    let as_stop_id = greedy(&["--ignore-eos", "--stop-token-ids", &ids[at].to_string()]);
    assert_eq!((&as_stop_id["token_ids"], &as_stop_id["stop_reason"]), (&stopped["token_ids"], &ids[at].into()), "{as_stop_id}");
    // The EOS's text is left out, or kept on request.
    let kept = greedy(&["--include-stop-str-in-output"]);
    let (without, with) = (stopped["text"].as_str().unwrap(), kept["text"].as_str().unwrap());
    assert!(with.len() > without.len() && with.starts_with(without), "{without:?} {with:?}");
    // min_tokens: no EOS among the first tokens, whatever the model prefers.
    let min = (at + 3).to_string();
    let late = greedy(&["--min-tokens", &min]);
    let late_ids: Vec<u64> = late["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert!(late_ids.len() > at + 3 && !late_ids[..at + 3].contains(&ids[at]), "{late}");
    assert_eq!(late_ids[..at], ids[..at]);
    let over = kiln(&["generate", "--model", m, "--prompt", "hello world", "--max-new-tokens", "2", "--min-tokens", "3"]);
    assert!(one_line_error(&over).contains("min_tokens (3) must be at most max_new_tokens (2)"));
    // Text output names the finish reason as the JSON does.
    let out = kiln(&["generate", "--model", m, "--prompt", "hello world", "--max-new-tokens", "2", "--n", "2", "--seed", "1", "--ignore-eos"]);
    assert!(String::from_utf8(out.stdout).unwrap().starts_with("--- prompt 0 sample 0 (length)"));
}

/// Text given to `kiln logprobs --text` and `kiln generate --prompt` gets the special tokens the
/// tokenizer adds to a text (transformers' `tokenizer(text)`, vLLM's `LLM.generate(text)`): a BOS
/// for a DeepSeek-R1-Distill-style tokenizer (`make_bos_tokenizer.py`'s cases); none with
/// `--add-special-tokens false`.
#[test]
fn text_inputs_get_the_tokenizer_s_special_tokens_as_in_transformers() {
    let tmp = tempfile::tempdir().unwrap();
    let model = init_with_bos_tokenizer(tmp.path(), "", "3");
    let tokenizer = fixture("bos_tokenizer");

    let cases: Value = serde_json::from_str(&std::fs::read_to_string(tokenizer.join("cases.json")).unwrap()).unwrap();
    let case = &cases["cases"][0];
    let (text, with, without) = (case["text"].as_str().unwrap(), &case["with_special_tokens"], &case["without_special_tokens"]);
    assert_eq!(with[0], cases["bos_token_id"]);
    let m = model.to_str().unwrap();
    for (flag, expected) in [(None, with), (Some("true"), with), (Some("false"), without)] {
        let extra: Vec<&str> = flag.into_iter().flat_map(|f| ["--add-special-tokens", f]).collect();
        let args: Vec<&str> = ["logprobs", "--model", m, "--text", text, "--json"].into_iter().chain(extra.iter().copied()).collect();
        let line = &stdout_json_lines(&kiln(&args))[0];
        assert_eq!(&line["ids"], expected, "logprobs {flag:?}");
        let args: Vec<&str> = ["generate", "--model", m, "--prompt", text, "--max-new-tokens", "1", "--temperature", "0", "--json", "--prompt-logprobs"]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        let sample = &stdout_json_lines(&kiln(&args))[0];
        assert_eq!(sample["prompt_logprobs"].as_array().unwrap().len(), expected.as_array().unwrap().len(), "generate {flag:?}: {sample}");
    }
    // `{"prompt": text}` lines of --prompts too.
    let prompts = tmp.path().join("prompts.jsonl");
    std::fs::write(&prompts, serde_json::json!({ "prompt": text }).to_string() + "\n").unwrap();
    let args = ["generate", "--model", m, "--prompts", prompts.to_str().unwrap(), "--max-new-tokens", "1", "--temperature", "0", "--json", "--prompt-logprobs"];
    let sample = &stdout_json_lines(&kiln(&args))[0];
    assert_eq!(sample["prompt_logprobs"].as_array().unwrap().len(), with.as_array().unwrap().len(), "{sample}");
}

#[test]
fn bad_input_is_one_clear_line() {
    let reference = Reference::load("tied_gqa2");
    let model = reference.dir.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("prompts.jsonl");
    std::fs::write(&file, "{\"prompt_ids\": [1, 2]}\n{\"prompt_ids\": [1, \n").unwrap();
    let err = one_line_error(&kiln(&["generate", "--model", model, "--prompts", file.to_str().unwrap()]));
    assert!(err.contains("prompts.jsonl line 2"), "{err}");

    let err = one_line_error(&kiln(&["generate", "--model", "/no/such/model", "--prompt-ids", "1,2"]));
    assert!(err.contains("/no/such/model"), "{err}");

    let err = one_line_error(&kiln(&["logprobs", "--model", model, "--ids", "1,x"]));
    assert!(err.contains("not a token id list"), "{err}");

    // A model whose activations are not finite (a NaN final norm here; f16 overflow in practice):
    // `--json` wrote its log-probs as null, the first position's "none", and exited 0.
    let broken = tmp.path().join("nan_model");
    std::fs::create_dir(&broken).unwrap();
    std::fs::copy(reference.dir.join("config.json"), broken.join("config.json")).unwrap();
    let mut bytes = std::fs::read(reference.dir.join("model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let norm = &header["model.norm.weight"];
    assert_eq!(norm["dtype"], "F32");
    let (start, end) = (norm["data_offsets"][0].as_u64().unwrap() as usize, norm["data_offsets"][1].as_u64().unwrap() as usize);
    for value in bytes[8 + header_len + start..8 + header_len + end].chunks_mut(4) {
        value.copy_from_slice(&f32::NAN.to_le_bytes());
    }
    std::fs::write(broken.join("model.safetensors"), bytes).unwrap();
    let err = one_line_error(&kiln(&["logprobs", "--model", broken.to_str().unwrap(), "--ids", "1,2,3", "--json"]));
    assert!(err.contains("the log-prob at position 1 is not finite"), "{err}");

    let err = one_line_error(&kiln(&["generate", "--model", model, "--prompt-ids", "1,2", "--backend", "tpu"]));
    assert!(err.contains("unknown backend"), "{err}");
}

/// Run configs through `kiln pretrain` / `kiln sft`: a config error is one line naming the file
/// and the line (an old key beside its new place included), and a config of the wrong kind
/// names what the command needs.
#[test]
fn config_errors_are_one_line_naming_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("run.toml");
    let good = "[model]\ninit = \"c.json\"\n\n[data]\ninterplay = \"d\"\nops = [2]\nprobs = [1.0]\ntokens = 1e3\n\n[train]\nsteps = 1\nmicro_batch = 1\nlr = 1e-3\n\n[output]\ndir = \"o\"\n";
    let p = path.to_str().unwrap();
    for (command, text, expected) in [
        ("pretrain", format!("{good}\n[optimizer]\nlr = 1e-4\n"), "run.toml line 13: [train] lr is the old place of [optimizer] lr"),
        ("pretrain", good.replace("steps = 1", "steps = \"one\""), "run.toml line 11: invalid type"),
        ("sft", good.to_string(), "`kiln sft` needs [data] kind = \"sft\""),
    ] {
        std::fs::write(&path, &text).unwrap();
        let line = one_line_error(&kiln(&[command, "--config", p]));
        assert!(line.contains(p) && line.contains(expected), "{line}");
    }
}

/// `kiln generate --prompt-logprobs`: every prompt token's log-prob, the prompts of different
/// lengths scored together (and, with `--max-prefill-tokens 1`, one per pass), against
/// transformers on each sequence alone.
#[test]
fn generate_prompt_logprobs_match_transformers() {
    let reference = Reference::load("tied_gqa2");
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    let lines: Vec<String> = reference.expected.sequences.iter().map(|s| serde_json::json!({ "prompt_ids": s }).to_string()).collect();
    std::fs::write(&prompts, lines.join("\n")).unwrap();
    let model = reference.dir.to_str().unwrap();
    let args = ["generate", "--model", model, "--prompts", prompts.to_str().unwrap(), "--temperature", "0", "--max-new-tokens", "2", "--json", "--prompt-logprobs"];
    for bound in [None, Some("1")] {
        let args: Vec<&str> = args.iter().copied().chain(bound.into_iter().flat_map(|b| ["--max-prefill-tokens", b])).collect();
        let samples = stdout_json_lines(&kiln(&args));
        assert_eq!(samples.len(), reference.expected.sequences.len());
        for (i, (sample, seq)) in samples.iter().zip(&reference.expected.sequences).enumerate() {
            let logprobs = sample["prompt_logprobs"].as_array().unwrap_or_else(|| panic!("no prompt_logprobs in {sample}"));
            assert_next_token_logprobs(logprobs, seq, &reference, &format!("single.{i}.logits"), &format!("prompt {i}, {bound:?}, "));
        }
    }
    let err = one_line_error(&kiln(&["generate", "--model", model, "--prompt-ids", "1,2", "--prompt-logprobs"]));
    assert!(err.contains("--json"), "{err}");
}

/// `kiln step`: one AdamW step's loss and gradient norm equal PyTorch's first step in f32
/// (`make_precision_fixtures.py`: the same sequences, lr, betas, clipping), the model after it
/// is written, and bad input is one line that touches nothing.
#[test]
fn step_matches_pytorch_and_refuses_bad_input() {
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(fixture("precision/training.json")).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data.jsonl");
    let sequences = reference["sequences"].as_array().unwrap();
    let lines: Vec<String> = sequences.iter().map(|s| serde_json::json!({ "input_ids": s }).to_string()).collect();
    std::fs::write(&data, lines.join("\n")).unwrap();
    let model = fixture("hf/tied_gqa2");
    let out = tmp.path().join("after");
    let args = |out: &Path, data: &Path| {
        let v: Vec<String> = ["step", "--model", model.to_str().unwrap(), "--data", data.to_str().unwrap(), "--out", out.to_str().unwrap(), "--json"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v
    };
    let record = stdout_json_lines(&Command::new(env!("CARGO_BIN_EXE_kiln")).args(args(&out, &data)).output().unwrap()).remove(0);
    let torch = &reference["runs"]["f32"][0];
    for key in ["loss", "grad_norm"] {
        let (ours, theirs) = (record[key].as_f64().unwrap(), torch[key].as_f64().unwrap());
        assert!((ours - theirs).abs() <= 1e-5 * theirs, "{key}: {ours} vs torch's {theirs}");
    }
    let after = kiln::model::hf::read_f32_safetensors(&out.join("model.safetensors")).unwrap();
    let before = kiln::model::hf::read_f32_safetensors(&model.join("model.safetensors")).unwrap();
    let (name, (_, moved)) = after.iter().next().unwrap();
    assert_ne!(moved, &before[name].1, "{name} did not move");

    // The output exists: refused, and left as it was.
    let kept = std::fs::read(out.join("model.safetensors")).unwrap();
    let err = one_line_error(&Command::new(env!("CARGO_BIN_EXE_kiln")).args(args(&out, &data)).output().unwrap());
    assert!(err.contains("exists and is not empty"), "{err}");
    assert_eq!(std::fs::read(out.join("model.safetensors")).unwrap(), kept);
    // A sequence without a target, named by its line.
    std::fs::write(&data, "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [4]}\n").unwrap();
    let err = one_line_error(&Command::new(env!("CARGO_BIN_EXE_kiln")).args(args(&tmp.path().join("b"), &data)).output().unwrap());
    assert!(err.contains("data.jsonl line 2"), "{err}");
    // Token ids outside the vocabulary and sequences past the context, named by their line (they
    // reached the embedding and the RoPE tables and panicked there), writing nothing.
    let config: Value = serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    let (vocab, context) = (config["vocab_size"].as_u64().unwrap(), config["max_position_embeddings"].as_u64().unwrap());
    let long: Vec<u64> = (0..=context).map(|i| i % vocab).collect();
    for (line, expected) in [(serde_json::json!({ "input_ids": [1, vocab] }), "outside the model's vocabulary"), (serde_json::json!({ "input_ids": long }), "more than the model's context")] {
        std::fs::write(&data, format!("{{\"input_ids\": [1, 2, 3]}}\n{line}\n")).unwrap();
        let out = tmp.path().join("c");
        let err = one_line_error(&Command::new(env!("CARGO_BIN_EXE_kiln")).args(args(&out, &data)).output().unwrap());
        assert!(err.contains("data.jsonl line 2") && err.contains(expected), "{err}");
        assert!(!out.exists(), "nothing written");
    }
    // Optimizer flags the run configs refuse (a NaN --lr wrote a NaN model and exited 0).
    for (flag, value) in [("--lr", "NaN"), ("--lr", "-1"), ("--weight-decay", "inf"), ("--max-grad-norm", "NaN")] {
        let out = tmp.path().join("d");
        let mut flagged = args(&out, &data);
        flagged.push(format!("{flag}={value}"));
        let err = one_line_error(&Command::new(env!("CARGO_BIN_EXE_kiln")).args(flagged).output().unwrap());
        assert!(err.contains(flag) && err.contains("must be a finite number"), "{err}");
        assert!(!out.exists(), "nothing written");
    }
}

/// `kiln plot train`: a NaN loss (the trainer writes it as null) is a gap in the line and a
/// warning, not a line drawn across it; a run's `<name>_metrics.jsonl` draws `<name>_*.svg`, so
/// runs sharing a directory keep their own charts.
#[test]
fn plot_train_leaves_gaps_at_non_finite_values_and_names_charts_by_run() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |name: &str, losses: [&str; 5]| {
        let path = tmp.path().join(name);
        let lines: String = (1..=5).zip(losses).map(|(step, loss)| format!("{{\"step\": {step}, \"loss\": {loss}, \"lr\": 0.001}}\n")).collect();
        std::fs::write(&path, lines).unwrap();
        path
    };
    let plot = |path: &Path| {
        let out = kiln(&["plot", "train", "--metrics", path.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let smooth = plot(&write("a_metrics.jsonl", ["2.0", "1.5", "1.2", "1.0", "0.9"]));
    assert!(!smooth.contains("warning"), "{smooth}");
    let diverged = plot(&write("b_metrics.jsonl", ["2.0", "1.5", "null", "null", "0.9"]));
    assert!(diverged.contains("b_metrics.jsonl: loss is not a finite number at step 3, 4 (a gap in b_loss.svg)"), "{diverged}");
    let polylines = |name: &str| std::fs::read_to_string(tmp.path().join(name)).unwrap().matches("<polyline").count();
    assert_eq!(polylines("b_loss.svg"), polylines("a_loss.svg") + 1, "the line breaks at steps 3 and 4");
    for chart in ["a_loss.svg", "a_lr.svg", "b_loss.svg", "b_lr.svg"] {
        assert!(tmp.path().join(chart).is_file(), "{chart}");
    }
}
