//! Code post-training from outside the library: `kiln code grade` on the committed mini
//! LiveCodeBench release and its right and wrong solutions, `kiln eval code` on a tiny random
//! model (files, counts, a resumed run giving the same files), the evaluation's records on known
//! completions, and the code task driving RL prompts and rewards; LiveCodeBench's own files (the
//! custom-evaluator input kiln writes, `kiln eval code compare` against an `_eval_all.json`, both
//! as `tests/fixtures/code/make_lcb_files.py` writes them from lcb_runner's source) and Parquet
//! rows in each codec (`make_codec_fixtures.py`, pyarrow).
#![cfg(feature = "code")]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::fixture;
use kiln::backends::Cpu;
use kiln::eval::{EvalEvent, EvalSettings, ModelEntry, evaluate};
use kiln::model::hf::{self, SaveDtype};
use kiln::model::{Qwen2, Qwen2Config};
use kiln::rl::prompts::PromptSet;
use kiln::tasks::code::evaluation::SampleRecord;
use kiln::tasks::code::sandbox::{Sandbox, SandboxOptions, Verdict};
use kiln::tasks::code::task::limits;
use kiln::tasks::code::{CodeEvaluation, CodeProblem, CodeTask, CodeTaskConfig, Extraction, PromptTemplate, read_code_problems};
use kiln::tasks::{Completion, Evaluation, FinishedRun, RewardConfig, Task};
use kiln::tokenizer::Tokenizer;
use serde_json::{Value, json};

fn kiln(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().unwrap()
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The mini release's 8 problems in one file.
fn all_problems(dir: &Path) -> PathBuf {
    let mini = fixture("code/lcb_mini");
    let text = std::fs::read_to_string(mini.join("test5.jsonl")).unwrap() + &std::fs::read_to_string(mini.join("test6.jsonl")).unwrap();
    let path = dir.join("problems.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

/// `(question_id, right solution, wrong solution)` of the mini release.
fn solutions() -> Vec<(String, String, String)> {
    lines(&fixture("code/lcb_mini/solutions.jsonl"))
        .into_iter()
        .map(|v| (v["question_id"].as_str().unwrap().into(), v["solution"].as_str().unwrap().into(), v["wrong"].as_str().unwrap().into()))
        .collect()
}

fn fenced(code: &str) -> String {
    format!("The program:\n```python\n{code}```\n")
}

#[test]
fn code_grade_gives_each_solution_its_verdict() {
    let tmp = tempfile::tempdir().unwrap();
    let problems = all_problems(tmp.path());
    let completions = tmp.path().join("completions.jsonl");
    let mut text = String::new();
    for (id, right, wrong) in solutions() {
        text += &(json!({ "question_id": id, "completions": [fenced(&right), fenced(&wrong), "I cannot solve this."] }).to_string() + "\n");
    }
    // Single completions count on after the listed ones; failures of other kinds.
    for (id, code) in [("abc900_a", "while True:\n    pass\n"), ("abc900_a", "raise ValueError('no')\n"), ("9002", "class Solution:\n    def countVowels(self, s\n")] {
        text += &(json!({ "question_id": id, "completion": fenced(code) }).to_string() + "\n");
    }
    std::fs::write(&completions, text).unwrap();
    let out = tmp.path().join("graded.jsonl");
    let args = ["code", "grade", "--problems", s(&problems), "--completions", s(&completions), "--out", s(&out), "--timeout", "1"];
    let run = kiln(&args);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("sandbox: ") && stderr.contains("landlock"), "the probe is printed: {stderr}");
    assert!(stderr.contains("pass@1"), "{stderr}");

    let records = lines(&out);
    assert_eq!(records.len(), 8 * 3 + 3 + 1);
    let verdict = |id: &str, index: u64| -> &Value {
        let r = records.iter().find(|r| r["question_id"] == id && r["index"] == index).unwrap_or_else(|| panic!("{id} {index}"));
        &r["verdict"]
    };
    for (id, _, _) in solutions() {
        let right = records.iter().find(|r| r["question_id"] == id.as_str() && r["index"] == 0).unwrap();
        assert_eq!(right["verdict"], "accepted", "{right}");
        assert_eq!(right["passed"], right["total"]);
        assert_eq!(right["tests"].as_array().unwrap().len() as u64, right["total"].as_u64().unwrap());
        assert!(right["tests"].as_array().unwrap().iter().all(|t| t["verdict"] == "accepted" && t["time_s"].as_f64().unwrap() >= 0.0));
        assert_eq!(verdict(&id, 1), "wrong_answer", "{id}");
        assert_eq!(verdict(&id, 2), "no_code", "{id}");
    }
    assert_eq!(verdict("abc900_a", 3), "time_limit");
    assert_eq!(verdict("abc900_a", 4), "runtime_error");
    assert_eq!(verdict("9002", 3), "compile_error");
    // The wrong 2070B solution fails only the private test (its input is 25,000 numbers).
    let wrong_big = records.iter().find(|r| r["question_id"] == "2070B" && r["index"] == 1).unwrap();
    assert!(wrong_big["passed"].as_u64().unwrap() >= 1 && wrong_big["tests"].as_array().unwrap().last().unwrap()["verdict"] == "wrong_answer");

    let summary = &records.last().unwrap()["summary"];
    assert_eq!((summary["samples"].as_u64(), summary["correct"].as_u64(), summary["no_code"].as_u64()), (Some(27), Some(8), Some(8)));
    // pass@1 is the mean over problems of c/n (abc900_a: 1 of 5, 9002: 1 of 4, the rest 1 of 3);
    // pass@5 needs 5 samples of every problem (LiveCodeBench's rule).
    assert!((summary["pass@1"].as_f64().unwrap() - (1.0 / 5.0 + 1.0 / 4.0 + 6.0 / 3.0) / 8.0).abs() < 1e-12, "{summary}");
    assert_eq!(summary["pass@5"], Value::Null);
    assert_eq!(summary["verdicts"]["time_limit"], 1);
    assert_eq!(summary["per_problem"].as_array().unwrap().len(), 8);
    assert_eq!(summary["by_platform"]["leetcode"]["samples"], 3 * 3 + 1);
    assert!(summary["protections"]["landlock"]["active"].is_boolean(), "{summary}");

    // Equal counts: pass@k. An existing output is kept unless --overwrite.
    let even = tmp.path().join("even.jsonl");
    let first_lines: String = std::fs::read_to_string(&completions).unwrap().lines().take(8).map(|l| format!("{l}\n")).collect();
    std::fs::write(&even, first_lines).unwrap();
    let again = kiln(&args);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("--overwrite"));
    let mut even_args = args.to_vec();
    even_args[5] = s(&even);
    even_args.push("--overwrite");
    assert!(kiln(&even_args).status.success());
    let graded = lines(&out);
    let summary = &graded.last().unwrap()["summary"];
    assert!((summary["pass@1"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-12, "{summary}");
    assert_eq!(summary["pass@5"], Value::Null);
    // --overwrite never replaces an input: the completions file named as --out is refused.
    let mut onto_input = even_args.clone();
    onto_input[7] = s(&even);
    let kept = std::fs::read(&even).unwrap();
    let refused = kiln(&onto_input);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("would replace the input"), "{stderr}");
    assert_eq!(std::fs::read(&even).unwrap(), kept);

    // Bad input: one line naming the file and line.
    std::fs::write(&completions, "{\"question_id\": \"abc900_a\", \"completion\": \"x\"}\n{\"question_id\": \"nope\", \"completion\": \"x\"}\n").unwrap();
    let bad = kiln(&[&args[..8], &["--overwrite"]].concat());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.lines().count() == 1 && stderr.contains("completions.jsonl line 2") && stderr.contains("\"nope\""), "{stderr}");
}

/// A tiny random Qwen2 with a byte-level BPE tokenizer that has Qwen's chat tokens.
fn tiny_model(dir: &Path) {
    let corpus = (0..200).map(|i| format!("def f{i}(x):\n    return x * {i}\nRead the inputs from stdin and print {i}."));
    tiny_model_on(dir, corpus.collect(), 400);
}

/// [`tiny_model`] with a tokenizer of `vocab` tokens trained on `corpus`.
fn tiny_model_on(dir: &Path, corpus: Vec<String>, vocab: usize) {
    let tokenizer = Tokenizer::train_byte_level_bpe(corpus.into_iter(), vocab, &["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        .unwrap()
        .with_special_tokens("<|im_end|>", "<|endoftext|>")
        .unwrap();
    let tokenizer_dir = dir.join("tokenizer");
    std::fs::create_dir_all(&tokenizer_dir).unwrap();
    tokenizer.save(&tokenizer_dir).unwrap();
    let config: Qwen2Config = serde_json::from_value(json!({
        "vocab_size": tokenizer.vocab_size(), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": true,
        "max_position_embeddings": 2048, "rope_theta": 10000.0, "eos_token_id": tokenizer.eos_id(),
    }))
    .unwrap();
    let model = Qwen2::<Cpu>::random(&config, 3, &Default::default()).unwrap();
    hf::save(&model, dir.join("model"), SaveDtype::F32, Some(&tokenizer_dir)).unwrap();
}

/// `value` with every test's `time_s` set to 0.
fn zero_times(mut value: Value) -> Value {
    for test in value["tests"].as_array_mut().into_iter().flatten() {
        test["time_s"] = json!(0);
    }
    value
}

/// The files of `dir` (not `.shards`), times of tests zeroed: runs differ only in those.
fn snapshot(dir: &Path) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let mut text = std::fs::read_to_string(&path).unwrap();
            if path.extension().is_some_and(|e| e == "jsonl") {
                text = text.lines().map(|l| zero_times(serde_json::from_str(l).unwrap()).to_string() + "\n").collect();
            }
            files.insert(path.file_name().unwrap().to_string_lossy().into_owned(), text);
        }
    }
    files
}

#[test]
fn eval_code_writes_records_and_summaries() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_model(tmp.path());
    let model = tmp.path().join("model");
    let mini = fixture("code/lcb_mini");
    let out = tmp.path().join("out");
    let args = [
        "eval", "code", "--model", s(&model), "--problems", s(&mini), "--release", "v6", "--n", "2", "--max-new-tokens", "12",
        "--temperature", "1.0", "--shard-prompts", "2", "--out", s(&out),
    ];
    let run = kiln(&args);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("sandbox: ") && stderr.contains("5 problems") && stderr.contains("pass@1"), "{stderr}");
    let records = lines(&out.join("model_code_generations.jsonl"));
    assert_eq!(records.len(), 5 * 2);
    let ids: Vec<&str> = records.iter().step_by(2).map(|r| r["question_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["9001", "9002", "2070B", "abc395_b", "9003"]);
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r["index"], (i % 2) as u64);
        assert!(r["completion"].is_string() && r["code"].is_string() && r["tests"].is_array() && r["tokens"].as_u64().unwrap() <= 12, "{r}");
        assert_eq!(r["verdict"] == "no_code", r["code"] == "", "{r}");
    }
    // LiveCodeBench's custom-evaluator input: every problem, each sample's code in order.
    let custom: Value = serde_json::from_str(&std::fs::read_to_string(out.join("model_code_lcb_custom_output.json")).unwrap()).unwrap();
    let custom = custom.as_array().unwrap();
    assert_eq!(custom.iter().map(|e| e["question_id"].as_str().unwrap()).collect::<Vec<_>>(), ids);
    for (p, entry) in custom.iter().enumerate() {
        assert_eq!(entry.as_object().unwrap().keys().collect::<Vec<_>>(), ["code_list", "question_id"], "{entry}");
        assert_eq!(entry["code_list"], json!([records[2 * p]["code"], records[2 * p + 1]["code"]]));
    }
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(out.join("model_code_summary.json")).unwrap()).unwrap();
    assert_eq!((summary["overall"]["problems"].as_u64(), summary["overall"]["samples"].as_u64()), (Some(5), Some(10)));
    assert!(summary["pass@1"].is_number() && summary["pass@5"].is_null(), "n = 2: pass@1 only");
    assert_eq!(summary["by_platform"]["leetcode"]["problems"], 3);
    assert_eq!(summary["by_difficulty"]["hard"]["problems"], 2);
    let per_problem = summary["per_problem"].as_array().unwrap();
    assert_eq!(per_problem.iter().map(|p| p["n"].as_u64().unwrap()).sum::<u64>(), 10);
    assert_eq!(per_problem[2]["question_id"], "2070B");
    assert_eq!(summary["settings"]["template"], "lcb-qwen");
    assert_eq!(summary["grading"]["per_test_timeout_s"], 6.0);
    assert!(summary["protections"]["seccomp"]["active"].is_boolean());
    let table: Value = serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(table[0]["model"], "model");
    assert!(!out.join(".shards").exists());

    // Two devices: the problems sharded over two engines, the same files (test times aside).
    let two = tmp.path().join("two");
    let run = kiln(&[&args[..args.len() - 1], &[s(&two), "--devices", "cpu,cpu"]].concat());
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(snapshot(&two), snapshot(&out));

    // `--sandbox-without`, `--sandbox-landlock-abi`: recorded in the summary; the same verdicts.
    let degraded = tmp.path().join("degraded");
    let flags = ["--sandbox-without", "net_namespace", "--sandbox-landlock-abi", "3"];
    let run = kiln(&[&args[..args.len() - 1], &[s(&degraded)], &flags[..]].concat());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success() && stderr.contains("(left off: net_namespace)"), "{stderr}");
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(degraded.join("model_code_summary.json")).unwrap()).unwrap();
    assert_eq!(summary["protections"]["skipped"], json!(["net_namespace"]), "{summary}");
    assert!(summary["protections"]["landlock"]["detail"].as_str().unwrap().starts_with("ABI 3:"), "{summary}");
    let verdicts = |dir: &Path| lines(&dir.join("model_code_generations.jsonl")).into_iter().map(|r| r["verdict"].clone()).collect::<Vec<_>>();
    assert_eq!(verdicts(&degraded), verdicts(&out));

    // A finished model is skipped; bad selections fail in one line.
    let again = kiln(&args);
    assert!(again.status.success() && String::from_utf8_lossy(&again.stderr).contains("skipped"));
    // ... the same problems read from another path too; other settings are refused, naming the
    // summary and what differs, and the finished files stay.
    let copy = tmp.path().join("lcb_copy");
    std::fs::create_dir(&copy).unwrap();
    for entry in std::fs::read_dir(&mini).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    let moved = kiln(&[&args[..5], &[s(&copy)], &args[6..]].concat());
    assert!(moved.status.success() && String::from_utf8_lossy(&moved.stderr).contains("skipped"), "{}", String::from_utf8_lossy(&moved.stderr));
    let summary_text = std::fs::read_to_string(out.join("model_code_summary.json")).unwrap();
    let more_args = [&args[..9], &["3"], &args[10..]].concat();
    let more = kiln(&more_args);
    let stderr = String::from_utf8_lossy(&more.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(!more.status.success() && !stderr.contains("panicked"), "{stderr}");
    assert!(last.contains("model_eval_settings.json") && last.contains("(samples differ)") && last.contains("--overwrite"), "{stderr}");
    // (a summary from before the settings file: its recorded settings decide)
    std::fs::remove_file(out.join("model_eval_settings.json")).unwrap();
    let more = kiln(&more_args);
    let stderr = String::from_utf8_lossy(&more.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.contains("model_code_summary.json") && last.contains("(settings.sampling; settings.sampling: {") && last.contains("--overwrite"), "{stderr}");
    assert_eq!(std::fs::read_to_string(out.join("model_code_summary.json")).unwrap(), summary_text);
    let bad = kiln(&[&args[..6], &["--release", "v9", "--out", s(&out)]].concat());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.lines().count() == 1 && stderr.contains("v9"), "{stderr}");
}

fn code_evaluation(problems: Vec<(CodeProblem, kiln::tasks::Source)>, sandbox: Arc<Sandbox>) -> CodeEvaluation {
    let prompts = problems.iter().map(|(p, _)| p.prompt(PromptTemplate::LcbQwen).render(None).unwrap()).collect();
    CodeEvaluation::new(problems, prompts, sandbox, limits(6.0, true).unwrap(), Extraction::Lcb, vec![1, 2], json!({})).unwrap()
}

#[test]
fn an_interrupted_code_evaluation_resumes_to_the_same_files() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_model(tmp.path());
    let sandbox = Arc::new(Sandbox::new(SandboxOptions::default()).unwrap());
    let evaluation = code_evaluation(read_code_problems(&fixture("code/lcb_mini/test6.jsonl")).unwrap(), sandbox);
    let models = [ModelEntry { name: "m".into(), path: tmp.path().join("model") }];
    let settings = EvalSettings {
        samples: 2,
        max_new_tokens: 8,
        stop: vec!["###".into()],
        id_op_threshold: None,
        shard_prompts: 1,
        keep_generations: true,
        ..EvalSettings::default()
    };
    let out = tmp.path().join("out");
    let run = |stop_after: Option<usize>| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            evaluate::<Cpu>(&models, &evaluation, &out, &settings, &Default::default(), |event| {
                if let (EvalEvent::Generating { new_samples, .. }, Some(limit)) = (event, stop_after)
                    && new_samples >= limit
                {
                    panic!("simulated kill");
                }
            })
            .unwrap()
        }))
    };
    run(None).unwrap();
    let complete = snapshot(&out);
    assert_eq!(
        complete.keys().collect::<Vec<_>>(),
        ["m_code_generations.jsonl", "m_code_lcb_custom_output.json", "m_code_summary.json", "m_eval_settings.json", "summary.json"]
    );
    std::fs::remove_dir_all(&out).unwrap();

    assert!(run(Some(5)).is_err());
    let kept = std::fs::read_dir(out.join(".shards/m/code")).unwrap().count();
    assert_eq!(kept, 2, "two graded shards are kept");
    assert!(!out.join("m_code_summary.json").exists());
    let mut resumed_from = None;
    evaluate::<Cpu>(&models, &evaluation, &out, &settings, &Default::default(), |event| {
        if let EvalEvent::Generating { done, .. } = event {
            resumed_from.get_or_insert(done);
        }
    })
    .unwrap();
    assert_eq!(resumed_from, Some(4));
    assert_eq!(snapshot(&out), complete);
}

#[test]
fn evaluation_records_grade_known_completions() {
    let problems = read_code_problems(&fixture("code/lcb_mini/test6.jsonl")).unwrap();
    let sandbox = Arc::new(Sandbox::new(SandboxOptions::default()).unwrap());
    let evaluation = code_evaluation(problems, sandbox);
    let solutions = solutions();
    let samples: Vec<Vec<Completion>> = evaluation
        .problems()
        .iter()
        .map(|p| {
            let (_, right, wrong) = solutions.iter().find(|(id, _, _)| *id == p.id).unwrap();
            [fenced(right), fenced(wrong), "```\nunclosed".into()].into_iter().map(|text| Completion { text, tokens: 7 }).collect()
        })
        .collect();
    // A shard of the second and third problems.
    let lines = evaluation.records(0, 1, &samples[1..3]).unwrap();
    let records: Vec<SampleRecord> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 6);
    assert_eq!(records.iter().map(|r| r.verdict).collect::<Vec<_>>(), [
        Verdict::Accepted, Verdict::WrongAnswer, Verdict::NoCode, Verdict::Accepted, Verdict::WrongAnswer, Verdict::NoCode
    ]);
    assert_eq!((records[0].question_id.as_str(), records[3].question_id.as_str()), ("9002", "2070B"));
    assert_eq!((records[0].difficulty.as_deref(), records[0].platform.as_deref()), (Some("medium"), Some("leetcode")));
    assert_eq!((records[1].index, records[4].index), (1, 1));
    assert!(records[0].code.starts_with("class Solution:") && records[2].code.is_empty());
    assert_eq!((records[0].tokens, records[0].passed, records[0].total, records[0].tests.len()), (7, 4, 4, 4));
    assert_eq!(records[0].completion, samples[1][0].text);
}

/// `tests/fixtures/code/lcb_files/<name>` (made by `make_lcb_files.py`).
fn lcb_file(name: &str) -> PathBuf {
    let path = fixture("code/lcb_files").join(name);
    assert!(path.exists(), "{} is missing: run `python3 tests/fixtures/code/make_lcb_files.py` from the repository root", path.display());
    path
}

/// The mini v6 problems' fixture completions graded by kiln: `<dir>/m_code_generations.jsonl`
/// and the files `finish` writes.
fn graded_fixture_completions(dir: &Path) -> PathBuf {
    let problems = read_code_problems(&fixture("code/lcb_mini/test6.jsonl")).unwrap();
    let evaluation = code_evaluation(problems, Arc::new(Sandbox::new(SandboxOptions::default()).unwrap()));
    let completions = lines(&lcb_file("completions.jsonl"));
    let samples: Vec<Vec<Completion>> = evaluation
        .problems()
        .iter()
        .map(|p| {
            let row = completions.iter().find(|c| c["question_id"] == p.id.as_str()).unwrap();
            row["completions"].as_array().unwrap().iter().map(|t| Completion { text: t.as_str().unwrap().into(), tokens: 5 }).collect()
        })
        .collect();
    let generations = dir.join("m_code_generations.jsonl");
    std::fs::write(&generations, evaluation.records(0, 0, &samples).unwrap().join("\n") + "\n").unwrap();
    let run = FinishedRun { generations: std::slice::from_ref(&generations), samples: 3, losses: None, keep_generations: true };
    evaluation.finish("m", dir, &run, &mut |_| {}).unwrap();
    generations
}

#[test]
fn the_custom_output_is_what_lcb_runner_reads_and_compare_reads_what_it_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let generations = graded_fixture_completions(tmp.path());
    // The custom-evaluator input equals the one made from lcb_runner's extract_code.
    let ours: Value = serde_json::from_str(&std::fs::read_to_string(tmp.path().join("m_code_lcb_custom_output.json")).unwrap()).unwrap();
    let theirs: Value = serde_json::from_str(&std::fs::read_to_string(lcb_file("m_code_lcb_custom_output.json")).unwrap()).unwrap();
    assert_eq!(ours, theirs);

    // kiln's grading against lcb_runner's _eval_all.json of the same programs.
    let eval_all = lcb_file("m_code_lcb_custom_output_codegeneration_output_eval_all.json");
    let out = tmp.path().join("compare.json");
    let run = kiln(&["eval", "code", "compare", s(&generations), s(&eval_all), "--resamples", "200", "--out", s(&out)]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    // kiln: each problem 1 of 3; LiveCodeBench: 2070B 2 of 3, 9001 and 9003 0 of 3, the rest 1 of 3.
    assert!(stdout.contains("pass@1 0.333333, 5 correct, 10 extracted"), "{stdout}");
    assert!(stdout.contains("pass@1 0.266667, 4 correct, 10 extracted"), "{stdout}");
    for line in ["9001\t1/3\t0/3\t-0.3333", "2070B\t1/3\t2/3\t+0.3333", "9003\t1/3\t0/3\t-0.3333"] {
        assert!(stdout.lines().any(|l| l == line), "{line:?} in {stdout}");
    }
    let sample_lines: Vec<&str> = stdout.lines().skip_while(|l| !l.starts_with("sample\t")).skip(1).take_while(|l| !l.starts_with("B - A")).collect();
    assert_eq!(sample_lines, [
        "9001 #0\taccepted\tTime Limit Exceeded\tsame",
        "2070B #1\twrong_answer\tpassed\tsame",
        "9003 #0\taccepted\tRuntime Error\tsame",
        "samples: 12 of 15 verdicts agree; A passes and B fails 2, B passes and A fails 1; the same code in every sample",
    ]);
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!((report["samples"]["samples"].as_u64(), report["samples"]["differences"].as_array().unwrap().len()), (Some(15), 3));

    assert!(stdout.lines().last().unwrap().starts_with("B - A: pass@1 -0.066667 (-1 correct samples)"), "{stdout}");

    // Two kiln files compare sample by sample with --samples (by default only counts).
    let run = kiln(&["eval", "code", "compare", s(&generations), s(&generations), "--resamples", "200"]);
    assert!(run.status.success() && !String::from_utf8_lossy(&run.stdout).contains("sample\t"));
    let run = kiln(&["eval", "code", "compare", s(&generations), s(&generations), "--resamples", "200", "--samples"]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("samples: 15 of 15 verdicts agree; A passes and B fails 0, B passes and A fails 0; the same code in every sample"), "{stdout}");
    let summary = tmp.path().join("m_code_summary.json");
    let bad = kiln(&["eval", "code", "compare", s(&generations), s(&summary), "--samples"]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.lines().count() == 1 && stderr.contains("--samples needs"), "{stderr}");

    // Another program in one sample: listed, and the summary says so.
    let mut edited: Value = serde_json::from_str(&std::fs::read_to_string(&eval_all).unwrap()).unwrap();
    edited[3]["code_list"][1] = json!("print(0)");
    let other = tmp.path().join("other_eval_all.json");
    std::fs::write(&other, serde_json::to_string_pretty(&edited).unwrap()).unwrap();
    let run = kiln(&["eval", "code", "compare", s(&generations), s(&other), "--resamples", "200"]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success() && stdout.contains("9003 #1\twrong_answer\tWrong Answer\tdiffers") && stdout.contains("DIFFERENT code in 1 samples"), "{stdout}");

    // Another sample count (one sample fewer of 9003): the questions still compare; the samples
    // are skipped with a note (an error with --samples).
    let mut fewer = edited.clone();
    for key in ["output_list", "code_list", "graded_list", "metadata"] {
        fewer[3][key].as_array_mut().unwrap().pop();
    }
    let fewer_path = tmp.path().join("fewer_eval_all.json");
    std::fs::write(&fewer_path, serde_json::to_string_pretty(&fewer).unwrap()).unwrap();
    let run = kiln(&["eval", "code", "compare", s(&generations), s(&fewer_path), "--resamples", "200"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success() && stdout.contains("B - A: pass@1") && !stdout.contains("sample\t"), "{stdout}{stderr}");
    assert!(stderr.contains("note: samples not compared (question \"9003\" has 3 samples") && stderr.contains("--samples makes this an error"), "{stderr}");
    let bad = kiln(&["eval", "code", "compare", s(&generations), s(&fewer_path), "--resamples", "200", "--samples"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("has 3 samples"));

    // Bad input: one line naming the file and the entry.
    edited[2]["graded_list"] = json!([true, false]);
    std::fs::write(&other, serde_json::to_string_pretty(&edited).unwrap()).unwrap();
    let bad = kiln(&["eval", "code", "compare", s(&generations), s(&other)]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && stderr.lines().count() == 1 && stderr.contains("other_eval_all.json") && stderr.contains("entry 3 (question_id \"9002\")") && stderr.contains("graded_list has 2 verdicts but code_list 3"),
        "{stderr}"
    );
}

#[test]
fn parquet_rows_in_each_codec_are_read() {
    for codec in ["zstd", "lz4", "gzip"] {
        let rows = fixture(&format!("code/cots_codecs/cots_{codec}.parquet"));
        assert!(rows.exists(), "{} is missing: run `/tmp/pqenv/bin/python tests/fixtures/code/make_codec_fixtures.py` (pyarrow) from the repository root", rows.display());
        let problems = fixture("code/lcb_mini/test6.jsonl");
        let run = kiln(&["data", "decontaminate", "--rows", s(&rows), "--id-column", "id", "--problems", s(&problems)]);
        let stdout = String::from_utf8_lossy(&run.stdout);
        assert!(run.status.success(), "{codec}: {}", String::from_utf8_lossy(&run.stderr));
        assert!(stdout.contains("0 of 5 rows share a word 8-gram with 0 of 5 problems"), "{codec}: {stdout}");
    }
}

#[test]
fn the_code_task_drives_rl_prompts_and_rewards() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = tmp.path().join("rows.jsonl");
    std::fs::write(
        &rows,
        concat!(
            r#"{"id": "sum", "question": "Read a and b; print a + b.", "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}]}"#,
            "\n",
            r#"{"id": "twice", "question": "Return 2x.", "fn_name": "twice", "difficulty": "easy", "tests": [{"input": "4", "output": "8"}]}"#,
            "\n"
        ),
    )
    .unwrap();
    let task = CodeTask::new(CodeTaskConfig::default()).unwrap();
    let tokenizer = Tokenizer::train_byte_level_bpe((0..50).map(|i| format!("print {i}")), 300, &["<|im_start|>", "<|im_end|>"]).unwrap();
    let prompts = PromptSet::from_task(&task, &[rows], &tokenizer, 4096, None).unwrap();
    let prompts: Vec<_> = prompts.iter().collect();
    assert_eq!(prompts.len(), 2);
    let item = &prompts[1].item;
    assert_eq!((item.id.as_str(), item.group.as_str()), ("twice", "easy"));
    assert!(item.prompt.contains("Question: Return 2x.") && item.prompt.ends_with("<|im_start|>assistant\n"));
    let reward = task.reward(&RewardConfig::Outcome).unwrap();
    let sum = &prompts[0].item;
    let batch = [
        ("```python\na, b = map(int, input().split())\nprint(a + b)\n```<|im_end|>", sum),
        ("```python\nprint(3)\n```", sum),
        ("```python\ndef twice(x):\n    return 2 * x\n```", item),
    ];
    assert_eq!(reward.score_batch(&batch).unwrap(), [1.0, 0.0, 1.0]);
}

#[test]
fn sandbox_layers_left_off_are_recorded_and_unknown_or_uncontained_ones_refused() {
    // RL: `[task] sandbox_without`
    let config: kiln::tasks::TaskConfig = serde_json::from_value(json!({ "kind": "code", "sandbox_without": ["net_namespace"] })).unwrap();
    let kiln::tasks::TaskConfig::Code(code) = config else { panic!("{config:?}") };
    let task = CodeTask::new(code).unwrap();
    let p = task.sandbox().protections();
    assert_eq!(p.skipped, ["net_namespace"]);
    assert!(!p.net_namespace.active && p.net_namespace.detail.contains("left off on request"), "{p}");
    // and an RL run records them: its data report's line and the output directory's
    // environment.json (kiln::rl::run::ENVIRONMENT_FILE) come from the task's environment
    let environment = task.environment().expect("the code task grades under the sandbox");
    assert!(environment.summary.starts_with("sandbox: ") && environment.summary.contains("left off: net_namespace"), "{}", environment.summary);
    assert_eq!(environment.record["protections"]["skipped"], json!(["net_namespace"]));
    let unknown = CodeTask::new(CodeTaskConfig { sandbox_without: vec!["lanlock".into()], ..Default::default() }).err().unwrap().to_string();
    assert!(unknown.contains("\"lanlock\"") && unknown.contains("landlock, seccomp, user_namespace"), "{unknown}");

    // `kiln code grade --sandbox-without`: recorded in the summary line; refusals are one line
    let tmp = tempfile::tempdir().unwrap();
    let problems = all_problems(tmp.path());
    let completions = tmp.path().join("completions.jsonl");
    let (id, right, _) = solutions().remove(0);
    std::fs::write(&completions, json!({ "question_id": id, "completion": fenced(&right) }).to_string() + "\n").unwrap();
    let out = tmp.path().join("graded.jsonl");
    let args = ["code", "grade", "--problems", s(&problems), "--completions", s(&completions), "--out", s(&out), "--sandbox-without"];
    let run = kiln(&[&args[..], &["net_namespace"]].concat());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("(left off: net_namespace)"), "{stderr}");
    let summary = lines(&out).pop().unwrap()["summary"].take();
    assert_eq!(summary["protections"]["skipped"], json!(["net_namespace"]), "{summary}");
    assert_eq!(summary["protections"]["net_namespace"]["active"], false);
    assert_eq!(summary["correct"], 1);
    for (without, says) in [("landlock", "nothing here contains filesystem"), ("seccomp,lanlock", "\"lanlock\"")] {
        let run = kiln(&[&args[..], &[without, "--overwrite"]].concat());
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success() && stderr.lines().count() == 1 && stderr.contains(says), "{stderr}");
    }
    let valid = String::from_utf8_lossy(&kiln(&[&args[..], &["x"]].concat()).stderr).to_string();
    assert!(valid.contains("landlock, seccomp, user_namespace, net_namespace, scratch, uid, cgroup"), "{valid}");
    // `--sandbox-landlock-abi`: Landlock as an older kernel enforces it, recorded; 1 to 6 only
    let abi = ["code", "grade", "--problems", s(&problems), "--completions", s(&completions), "--out", s(&out), "--overwrite", "--sandbox-landlock-abi"];
    let run = kiln(&[&abi[..], &["2"]].concat());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let summary = lines(&out).pop().unwrap()["summary"].take();
    let landlock = summary["protections"]["landlock"]["detail"].as_str().unwrap().to_owned();
    assert!(landlock.starts_with("ABI 2:") && landlock.contains("no truncation outside scratch (ABI 3, kernel 6.2: tried, allowed)"), "{landlock}");
    assert_eq!(summary["correct"], 1);
    let run = kiln(&[&abi[..], &["9"]].concat());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success() && stderr.lines().count() == 1 && stderr.contains("a Landlock ABI to enforce is 1 to 6, not 9"), "{stderr}");
}

#[test]
fn kiln_sft_trains_on_parquet_rows_and_scores_the_held_out_ones() {
    let tmp = tempfile::tempdir().unwrap();
    // A tokenizer fitted to the rows keeps them short.
    let rows = std::fs::read_to_string(fixture("code/cots_mini.jsonl")).unwrap();
    let texts = rows.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).flat_map(|r| [r["prompt"].as_str().unwrap().to_owned(), r["generation"].as_str().unwrap().to_owned()]);
    tiny_model_on(tmp.path(), texts.collect(), 1500);
    let config = tmp.path().join("sft.toml");
    let text = format!(
        "[model]\nfrom = \"model\"\n\n[data]\nkind = \"sft\"\npath = \"{}\"\ncolumns = {{ messages = \"messages\" }}\nheldout = 2\nmax_length = 512\n\n\
         [train]\nsteps = 1\nmicro_batch = 1\n\n[optimizer]\nlr = 1e-3\n\n[output]\ndir = \"run\"\n\n[eval]\nevery = 1\n",
        s(&fixture("code/cots_mini/train-*.parquet"))
    );
    std::fs::write(&config, text).unwrap();
    let run = kiln(&["sft", "--config", s(&config)]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("3 train + 2 held out (the 2 rows with the smallest sha256(id) held out)"), "{stderr}");
    assert!(stderr.contains("3 rows rendered by chatml, 0 truncated"), "{stderr}");
    let metrics = lines(&tmp.path().join("run/metrics.jsonl"));
    let eval_losses: Vec<f64> = metrics.iter().filter_map(|m| m["eval_loss"].as_f64()).collect();
    assert!(eval_losses.len() >= 2 && eval_losses.iter().all(|l| l.is_finite() && *l > 1.0), "{metrics:?}");
    assert!(metrics.iter().any(|m| m["targets"].as_u64().unwrap_or(0) > 50), "assistant turns are targets: {metrics:?}");
    // Again without --resume: refused before the rows are read and rendered again.
    let again = kiln(&["sft", "--config", s(&config)]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success() && stderr.contains("already holds checkpoints") && !stderr.contains("rows rendered by"), "{stderr}");

    // The tokenizer has no template: the rows trained in ChatML, and the checkpoint carries
    // Qwen2.5's template (ChatML's) for chat clients.
    let qwen: Value = serde_json::from_str(&std::fs::read_to_string(fixture("code/qwen2_5/tokenizer_config.json")).unwrap()).unwrap();
    assert_eq!(std::fs::read_to_string(tmp.path().join("run/checkpoint-1/chat_template.jinja")).unwrap(), qwen["chat_template"].as_str().unwrap());

    // A base model (EOS <|endoftext|>) trained on an instruct model's template (`chat_template`
    // naming its directory, TRL's chat_template_path): the checkpoint carries the template and
    // the EOS its turns end with, as TRL's clone_chat_template saves them.
    let model = tmp.path().join("model");
    let tokenizer = Tokenizer::from_file(&model).unwrap();
    let (endoftext, im_end) = (tokenizer.token_id("<|endoftext|>").unwrap(), tokenizer.token_id("<|im_end|>").unwrap());
    std::fs::write(model.join("special_tokens_map.json"), r#"{"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}"#).unwrap();
    let model_config = model.join("config.json");
    let mut base: Value = serde_json::from_str(&std::fs::read_to_string(&model_config).unwrap()).unwrap();
    base["eos_token_id"] = json!(endoftext);
    std::fs::write(&model_config, base.to_string()).unwrap();
    let instruct = tmp.path().join("instruct");
    std::fs::create_dir_all(&instruct).unwrap();
    std::fs::copy(fixture("code/qwen2_5/tokenizer_config.json"), instruct.join("tokenizer_config.json")).unwrap();
    let text = std::fs::read_to_string(&config).unwrap().replace("max_length = 512", "max_length = 512\nchat_template = \"instruct\"").replace("dir = \"run\"", "dir = \"run2\"");
    std::fs::write(&config, text).unwrap();
    let run = kiln(&["sft", "--config", s(&config)]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let checkpoint = tmp.path().join("run2/checkpoint-1");
    let instruct_config: Value = serde_json::from_str(&std::fs::read_to_string(instruct.join("tokenizer_config.json")).unwrap()).unwrap();
    assert_eq!(std::fs::read_to_string(checkpoint.join("chat_template.jinja")).unwrap(), instruct_config["chat_template"].as_str().unwrap());
    let saved = Tokenizer::from_file(&checkpoint).unwrap();
    assert_eq!((saved.eos_token(), saved.eos_id()), (Some("<|im_end|>"), Some(im_end)));
    let saved_config = Qwen2Config::from_file(checkpoint.join("config.json")).unwrap();
    assert_eq!(saved_config.eos_token_ids(), vec![im_end]);
    // The run's own model directory is left as it was.
    assert_eq!(Qwen2Config::from_file(&model_config).unwrap().eos_token_ids(), vec![endoftext]);
}

/// `kiln rl` with code rewards on a tiny random model: one step, graded in the sandbox with the
/// layers `--sandbox-without` leaves off recorded in the output directory's environment.json and
/// printed with the data line; the flag on a task that runs no programs is one error line.
#[test]
fn rl_with_code_rewards_records_the_sandbox_layers_left_off() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_model(tmp.path());
    let config = tmp.path().join("rl.toml");
    std::fs::write(
        &config,
        format!(
            "[model]\nfrom = {model:?}\n\n[task]\nkind = \"code\"\n\n[data]\nkind = \"prompts\"\nfiles = [{problems:?}]\nmax_prompt_length = 2000\n\n\
             [rollout]\nn = 2\nmax_response_length = 8\n\n[train]\nsteps = 1\nprompts_per_step = 2\nmini_batch = 2\nmicro_batch = 4\n\n\
             [optimizer]\nlr = 1e-4\n\n[reward]\nkind = \"code\"\nper_test_timeout_s = 1\nmax_tests = 1\n\n[output]\ndir = {out:?}\n",
            model = tmp.path().join("model"),
            problems = fixture("code/lcb_mini/test5.jsonl"),
            out = tmp.path().join("out"),
        ),
    )
    .unwrap();
    let run = kiln(&["rl", "--config", s(&config), "--sandbox-without", "net_namespace"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("left off: net_namespace"), "{stderr}");
    let environment: Value = serde_json::from_str(&std::fs::read_to_string(tmp.path().join("out/environment.json")).unwrap()).unwrap();
    assert_eq!(environment["protections"]["skipped"], json!(["net_namespace"]), "{environment:#}");
    assert_eq!(environment["protections"]["net_namespace"]["active"], json!(false), "{environment:#}");

    let interplay = tmp.path().join("interplay.toml");
    let text = std::fs::read_to_string(&config).unwrap().replace("[task]\nkind = \"code\"\n", "");
    std::fs::write(&interplay, text).unwrap();
    let refused = kiln(&["rl", "--config", s(&interplay), "--sandbox-without", "net_namespace"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.trim().lines().count() == 1, "{stderr}");
    assert!(stderr.starts_with("error: ") && stderr.contains("--sandbox-without") && stderr.contains("interplay.toml"), "{stderr}");
}

/// Per-test time limits are positive and at most 1e9 s (`--timeout`, `[task] timeout_s`,
/// `[reward] per_test_timeout_s`): a huge one panicked in `Duration::from_secs_f64`, and the
/// sandbox adds a grace to it and sets deadlines from the time now.
#[test]
fn per_test_time_limits_are_bounded() {
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e20] {
        let err = limits(bad, true).err().unwrap_or_else(|| panic!("{bad} s is refused")).to_string();
        assert!(err.contains("per-test time limit") && err.contains("at most 1e9"), "{bad}: {err}");
    }
    assert_eq!(limits(6.0, true).unwrap().per_test, std::time::Duration::from_secs(6));
}
