//! The code-SFT study's commands from outside: `kiln eval code compare` on fixed verdict files
//! (against numpy, `tests/fixtures/code/study/make_study_fixtures.py`), `kiln data
//! decontaminate` on rows with known overlaps (against OpenR1's n-gram code,
//! `make_decontaminate_fixture.py`), and `kiln eval code` over a run's checkpoints in the greedy
//! probe mode.
#![cfg(feature = "code")]

mod common;

use std::path::Path;

use common::fixture;
use kiln::backends::Cpu;
use kiln::model::hf::{self, SaveDtype};
use kiln::model::{Qwen2, Qwen2Config};
use kiln::tokenizer::Tokenizer;
use serde_json::{Value, json};

fn kiln(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().unwrap()
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn json_file(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn study(name: &str) -> std::path::PathBuf {
    fixture("code/study").join(name)
}

#[test]
fn compare_gives_the_numpy_interval_and_per_question_differences() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("compare.json");
    let (a, b) = (study("base_code_generations.jsonl"), study("cand_code_generations.jsonl"));
    let run = kiln(&["eval", "code", "compare", s(&a), s(&b), "--resamples", "2000", "--seed", "7", "--out", s(&out)]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let expected = json_file(&study("expected.json"));
    let ours = &json_file(&out)["comparison"];
    let theirs = &expected["comparison"];
    for key in ["mean_diff", "paired_stderr", "ci_low", "ci_high"] {
        let (x, y) = (ours[key].as_f64().unwrap(), theirs[key].as_f64().unwrap());
        assert!((x - y).abs() < 1e-12, "{key}: {x} vs numpy {y}");
    }
    assert_eq!(ours["correct_diff"], theirs["correct_diff"]);
    assert_eq!(ours["per_question"].as_array().unwrap().len(), 40);
    assert_eq!(ours["bootstrap"], json!({ "resamples": 2000, "seed": 7, "level": 0.95 }));
    // The printed lines: both runs' figures and the difference.
    let base = &expected["base"];
    let line = format!("pass@1 {:.6}, {} correct, {} extracted, stderr {:.5}", base["pass@1"].as_f64().unwrap(), base["correct"], base["extracted"], base["stderr"].as_f64().unwrap());
    assert!(stdout.contains(&line), "{line} not in\n{stdout}");
    assert!(stdout.contains("B - A: pass@1 +0.007500 (+3 correct samples)"), "{stdout}");

    // A summary file reads like its verdicts; runs over other questions are refused in one line.
    let from_summary = kiln(&["eval", "code", "compare", s(&study("base_code_summary.json")), s(&b), "--resamples", "2000", "--seed", "7"]);
    assert_eq!(String::from_utf8_lossy(&from_summary.stdout).lines().last(), stdout.lines().last());
    let short = tmp.path().join("short_code_generations.jsonl");
    let text = std::fs::read_to_string(&b).unwrap();
    std::fs::write(&short, text.lines().skip(10).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    let bad = kiln(&["eval", "code", "compare", s(&a), s(&short)]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.lines().count() == 1 && stderr.contains("not in") && stderr.contains("short_code_generations.jsonl"), "{stderr}");

    // `--out` naming an input (it replaced run A's file with the report) and resamples past the
    // bound (a capacity-overflow panic) are one line; the input stays.
    let a_copy = tmp.path().join("a_code_generations.jsonl");
    std::fs::copy(&a, &a_copy).unwrap();
    let bad = kiln(&["eval", "code", "compare", s(&a_copy), s(&b), "--out", s(&a_copy)]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.lines().count() == 1 && stderr.contains("would replace the input"), "{stderr}");
    assert_eq!(std::fs::read(&a_copy).unwrap(), std::fs::read(&a).unwrap());
    let bad = kiln(&["eval", "code", "compare", s(&a), s(&b), "--resamples", "18446744073709551615"]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.lines().count() == 1 && stderr.contains("--resamples must be at most 100000000"), "{stderr}");
    // An existing report is kept unless --overwrite.
    let report = std::fs::read(&out).unwrap();
    let again = kiln(&["eval", "code", "compare", s(&a), s(&b), "--resamples", "20", "--out", s(&out)]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success() && stderr.lines().count() == 1 && stderr.contains("exists; pass --overwrite"), "{stderr}");
    assert_eq!(std::fs::read(&out).unwrap(), report);
    assert!(kiln(&["eval", "code", "compare", s(&a), s(&b), "--resamples", "20", "--out", s(&out), "--overwrite"]).status.success());
    assert_ne!(std::fs::read(&out).unwrap(), report);

    // A shard concatenated twice, and summaries whose counts cannot be, are refused naming the
    // place (they were counted: pass@1 above 1, or a subtraction overflow).
    let twice = tmp.path().join("twice_code_generations.jsonl");
    std::fs::write(&twice, std::fs::read_to_string(&a).unwrap().repeat(2)).unwrap();
    let bad = kiln(&["eval", "code", "compare", s(&twice), s(&b)]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.lines().count() == 1 && stderr.contains("twice_code_generations.jsonl") && stderr.contains("sample 0 of question \"q00\" appears twice"), "{stderr}");
    let mut summary = json_file(&study("base_code_summary.json"));
    summary["per_problem"][1]["no_code"] = json!(99);
    let broken = tmp.path().join("broken_code_summary.json");
    std::fs::write(&broken, summary.to_string()).unwrap();
    let bad = kiln(&["eval", "code", "compare", s(&broken), s(&b)]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.lines().count() == 1 && stderr.contains("broken_code_summary.json") && stderr.contains("per_problem[1]"), "{stderr}");
    let mut summary = json_file(&study("base_code_summary.json"));
    summary["per_problem"][1]["question_id"] = summary["per_problem"][0]["question_id"].clone();
    std::fs::write(&broken, summary.to_string()).unwrap();
    let bad = kiln(&["eval", "code", "compare", s(&broken), s(&b)]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.contains("per_problem[1]: question \"q00\" appears twice"), "{stderr}");
    // A sample index past any run's (an overflow, or a vector grown to it) with --samples.
    let huge = tmp.path().join("huge_code_generations.jsonl");
    std::fs::write(&huge, "{\"question_id\": \"q00\", \"index\": 18446744073709551615, \"verdict\": \"accepted\"}\n").unwrap();
    let bad = kiln(&["eval", "code", "compare", s(&huge), s(&huge), "--samples"]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.lines().count() == 1 && stderr.contains("huge_code_generations.jsonl line 1") && stderr.contains("is not below 1000000"), "{stderr}");
}

#[test]
fn decontaminate_reports_the_known_overlaps() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("report.json");
    let problems = fixture("code/lcb_mini/test6.jsonl");
    let rows = study("decontaminate_rows.jsonl");
    let run = kiln(&["data", "decontaminate", "--rows", s(&rows), "--id-column", "id", "--problems", s(&problems), "--out", s(&out)]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let expected = json_file(&study("decontaminate_expected.json"));
    let report = json_file(&out);
    for key in ["rows", "problems", "contaminated_rows"] {
        assert_eq!(report[key], expected[key], "{key}");
    }
    let overlaps: Vec<(Value, Value)> = report["overlaps"].as_array().unwrap().iter().map(|o| (o["row"].clone(), o["problems"].clone())).collect();
    let wanted: Vec<(Value, Value)> = expected["overlaps"].as_array().unwrap().iter().map(|o| (o["row"].clone(), o["problems"].clone())).collect();
    assert_eq!(overlaps, wanted);
    assert_eq!(report["contaminated_problems"], json!(["9001", "abc395_b"]));
    assert!(String::from_utf8_lossy(&run.stdout).contains("2 of 4 rows share a word 8-gram with 2 of 5 problems"));

    // A row without the column: one line naming the file and line.
    let bad_rows = tmp.path().join("bad.jsonl");
    std::fs::write(&bad_rows, "{\"prompt\": \"ok\"}\n{\"text\": \"no prompt\"}\n").unwrap();
    let bad = kiln(&["data", "decontaminate", "--rows", s(&bad_rows), "--problems", s(&problems)]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.lines().count() == 1 && stderr.contains("bad.jsonl:2") && stderr.contains("\"prompt\""), "{stderr}");

    // `--out` naming the problem file (the report replaced it): one line, the file kept.
    let problems_copy = tmp.path().join("test6.jsonl");
    std::fs::copy(&problems, &problems_copy).unwrap();
    let bad = kiln(&["data", "decontaminate", "--rows", s(&rows), "--problems", s(&problems_copy), "--out", s(&problems_copy)]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.lines().count() == 1 && stderr.contains("would replace the input"), "{stderr}");
    assert_eq!(std::fs::read(&problems_copy).unwrap(), std::fs::read(&problems).unwrap());

    // An existing report is kept unless --overwrite.
    std::fs::write(&out, "earlier report\n").unwrap();
    let again = kiln(&["data", "decontaminate", "--rows", s(&rows), "--problems", s(&problems), "--out", s(&out)]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success() && stderr.lines().count() == 1 && stderr.contains("pass --overwrite"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "earlier report\n");
    let again = kiln(&["data", "decontaminate", "--rows", s(&rows), "--id-column", "id", "--problems", s(&problems), "--out", s(&out), "--overwrite"]);
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(json_file(&out)["contaminated_rows"], expected["contaminated_rows"]);
}

/// A tiny random model with a byte-level BPE tokenizer, saved at `path`.
fn tiny_model(path: &Path) {
    let corpus = (0..200).map(|i| format!("def f{i}(x):\n    return x * {i}\nRead the inputs from stdin and print {i}."));
    let tokenizer = Tokenizer::train_byte_level_bpe(corpus, 400, &["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        .unwrap()
        .with_special_tokens("<|im_end|>", "<|endoftext|>")
        .unwrap();
    let tokenizer_dir = path.with_extension("tokenizer");
    std::fs::create_dir_all(&tokenizer_dir).unwrap();
    tokenizer.save(&tokenizer_dir).unwrap();
    let config: Qwen2Config = serde_json::from_value(json!({
        "vocab_size": tokenizer.vocab_size(), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": true,
        "max_position_embeddings": 2048, "rope_theta": 10000.0, "eos_token_id": tokenizer.eos_id(),
    }))
    .unwrap();
    let model = Qwen2::<Cpu>::random(&config, 3, &Default::default()).unwrap();
    hf::save(&model, path, SaveDtype::F32, Some(&tokenizer_dir)).unwrap();
}

#[test]
fn eval_code_probes_several_checkpoints_of_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    tiny_model(&run_dir.join("checkpoint-60"));
    tiny_model(&run_dir.join("checkpoint-120"));
    let (mini, out) = (fixture("code/lcb_mini"), tmp.path().join("evals"));
    let args = [
        "eval", "code", "--run", s(&run_dir), "--checkpoints", "60,120", "--problems", s(&mini), "--release", "v6", "--probe", "2",
        "--max-new-tokens", "8", "--out", s(&out),
    ];
    let run = kiln(&args);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    // sha256 of the v6 ids: 9001 13b7…, 2070B 16a1…, 9003 4023…, 9002 e609…, abc395_b feb1…
    // (`printf 9001 | sha256sum`): the probe takes 9001 and 2070B, in file order.
    for name in ["checkpoint-60", "checkpoint-120"] {
        let records: Vec<Value> = std::fs::read_to_string(out.join(format!("{name}_code_generations.jsonl")))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let ids: Vec<&str> = records.iter().map(|r| r["question_id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["9001", "2070B"], "{name}: one greedy sample per probe problem");
        assert!(records.iter().all(|r| r["total"] == 1), "{name}: graded on the one public test: {records:?}");
        let summary = json_file(&out.join(format!("{name}_code_summary.json")));
        assert_eq!((summary["settings"]["sampling"]["n"].as_u64(), summary["settings"]["sampling"]["temperature"].as_f64()), (Some(1), Some(0.0)));
        assert_eq!(summary["settings"]["probe"]["problems"], 2);
        assert!(summary["overall"]["extracted"].is_number() && summary["overall"]["pass@1_stderr"].is_number(), "{summary}");
        assert!(stderr.contains(&format!("{name}: pass@1 ")) && stderr.contains("extracted, stderr"), "{stderr}");
    }
    assert_eq!(json_file(&out.join("summary.json")).as_array().unwrap().len(), 2);

    // A missing checkpoint is one line naming the run directory and the step.
    let bad = kiln(&[&args[..4], &["--checkpoints", "60,841"], &args[6..]].concat());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.lines().count() == 1 && stderr.contains("no checkpoint of step 841") && stderr.contains("run"), "{stderr}");
}
