//! `kiln data interplay` and `kiln eval score|answers|gold` against the golden outputs of the
//! reference implementation (`tests/fixtures/interplay/`), and their handling of bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/interplay").join(rel)
}

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("kiln runs")
}

fn ok(args: &[&str]) -> Output {
    let out = kiln(args);
    assert!(out.status.success(), "kiln {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn failure(args: &[&str]) -> String {
    let out = kiln(args);
    assert!(!out.status.success(), "kiln {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).map(|d| d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default();
    names.sort();
    names
}

#[test]
fn eval_score_reproduces_the_reference_files() {
    let out = tempfile::tempdir().unwrap();
    ok(&["eval", "score", "--gold", s(&fixture("gold")), "--generations", s(&fixture("scoring/generations.jsonl")), "--out", s(out.path())]);
    assert_eq!(
        read(&out.path().join("generations.jsonl.graph_results.jsonl")),
        read(&fixture("scoring/generations.jsonl.graph_results.jsonl"))
    );
    assert_eq!(read(&out.path().join("results.json")), read(&fixture("scoring/results.json")));
    let report: serde_json::Value = serde_json::from_str(&read(&out.path().join("generations.jsonl_score_report.jsonl"))).unwrap();
    let golden: serde_json::Value = serde_json::from_str(&read(&fixture("scoring/generations.jsonl_score_report.jsonl"))).unwrap();
    for key in ["total", "missing_solution", "missing_gold", "parse_fail", "perfect", "value_mismatch", "dependency_mismatch", "answer_mismatch", "extra_nodes", "missing_nodes", "perfect_with_extra", "unused_gold_entries", "template_stats"] {
        assert_eq!(report["aggregate"][key], golden["aggregate"][key], "{key}");
        assert_eq!(report["per_file"][0][key], golden["per_file"][0][key], "{key}");
    }

    // Existing results are kept (the reference's behaviour) unless --overwrite.
    let again = ok(&["eval", "score", "--gold", s(&fixture("gold")), "--generations", s(&fixture("scoring/generations.jsonl")), "--out", s(out.path())]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("1 skipped"));
    assert_eq!(read(&out.path().join("generations.jsonl_score_report.jsonl")).lines().count(), 2);
}

#[test]
fn eval_answers_reproduces_answer_metrics() {
    let out = tempfile::tempdir().unwrap();
    ok(&["eval", "answers", "--generations", s(&fixture("scoring/generations.jsonl")), "--out", s(out.path()), "--checkpoint", "checkpoint-golden"]);
    assert_eq!(read(&out.path().join("checkpoint-golden_metrics.json")), read(&fixture("scoring/answer_metrics.json")));
    // The metrics file is also what `kiln eval interplay` writes (and skips a model for): kept
    // unless --overwrite.
    let path = out.path().join("checkpoint-golden_metrics.json");
    std::fs::write(&path, "{}\n").unwrap();
    let generations = fixture("scoring/generations.jsonl");
    let args = ["eval", "answers", "--generations", s(&generations), "--out", s(out.path()), "--checkpoint", "checkpoint-golden"];
    let err = failure(&args);
    assert!(err.contains("checkpoint-golden_metrics.json exists; pass --overwrite") && err.lines().count() == 1, "{err}");
    assert_eq!(read(&path), "{}\n");
    ok(&[&args[..], &["--overwrite"]].concat());
    assert_eq!(read(&path), read(&fixture("scoring/answer_metrics.json")));
}

#[test]
fn eval_gold_reproduces_gold_graphs() {
    let out = tempfile::tempdir().unwrap();
    ok(&["eval", "gold", "--rows", s(&fixture("rows")), "--out", s(out.path())]);
    assert_eq!(files_in(out.path()), files_in(&fixture("gold")));
    // Existing gold files are kept unless --overwrite; the rows' own directory is refused.
    let err = failure(&["eval", "gold", "--rows", s(&fixture("rows")), "--out", s(out.path())]);
    assert!(err.contains("_graphs.jsonl exists; pass --overwrite") && err.lines().count() == 1, "{err}");
    ok(&["eval", "gold", "--rows", s(&fixture("rows")), "--out", s(out.path()), "--overwrite"]);
    let err = failure(&["eval", "gold", "--rows", s(&fixture("rows")), "--out", s(&fixture("rows"))]);
    assert!(err.contains("is the rows directory"), "{err}");
    for name in files_in(out.path()) {
        let (ours, theirs) = (read(&out.path().join(&name)), read(&fixture("gold").join(&name)));
        for (a, b) in ours.lines().zip(theirs.lines()) {
            let (mut a, mut b): (serde_json::Value, serde_json::Value) = (serde_json::from_str(a).unwrap(), serde_json::from_str(b).unwrap());
            let (oa, ob) = (a["graph"]["topological_order"].take(), b["graph"]["topological_order"].take());
            let (mut oa, mut ob) = (oa.as_array().unwrap().clone(), ob.as_array().unwrap().clone());
            oa.sort_by_key(|v| v.to_string());
            ob.sort_by_key(|v| v.to_string());
            assert_eq!(oa, ob, "{name}: the same nodes, in some valid order");
            assert_eq!(a, b, "{name}");
        }
        assert_eq!(ours.lines().count(), theirs.lines().count());
    }
}

#[test]
fn data_interplay_is_deterministic_and_splits_are_disjoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("data");
    ok(&["data", "interplay", "--ops", "2-4,9", "--per-op", "12", "--seed", "3", "--out", s(&out)]);
    assert_eq!(files_in(&out.join("test")), vec!["op2-12.jsonl", "op3-12.jsonl", "op4-12.jsonl", "op9-12.jsonl"]);
    let first = read(&out.join("test/op9-12.jsonl"));
    let op2 = read(&out.join("test/op2-12.jsonl"));
    assert_eq!(first.lines().count(), 12);
    for line in first.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(row["op"], 9);
        for key in ["problem", "question", "solution", "template", "mode", "id"] {
            assert!(row[key].is_string(), "{key}");
        }
    }
    ok(&["data", "interplay", "--ops", "9", "--per-op", "12", "--seed", "3", "--out", s(&out)]);
    assert_eq!(read(&out.join("test/op9-12.jsonl")), first, "same seed, same bytes");
    // Another seed into the same split is refused, the files kept, unless --overwrite.
    let err = failure(&["data", "interplay", "--ops", "2,9", "--per-op", "12", "--seed", "4", "--out", s(&out)]);
    assert!(err.contains("op2-12.jsonl already exists with other rows (2 of the split's 2 files differ") && err.contains("--overwrite"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(read(&out.join("test/op9-12.jsonl")), first);
    assert_eq!(read(&out.join("test/op2-12.jsonl")), op2, "nothing of the split is written");
    ok(&["data", "interplay", "--ops", "9", "--per-op", "12", "--seed", "4", "--out", s(&out), "--overwrite"]);
    assert_ne!(read(&out.join("test/op9-12.jsonl")), first);
    ok(&["data", "interplay", "--ops", "9", "--per-op", "12", "--seed", "3", "--out", s(&out), "--overwrite"]);
    assert_eq!(read(&out.join("test/op9-12.jsonl")), first);

    ok(&["data", "interplay", "--ops", "2", "--per-op", "40", "--seed", "3", "--out", s(&out), "--split", "heldout"]);
    let test_prompts: std::collections::HashSet<String> = read(&out.join("test/op2-12.jsonl"))
        .lines()
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l).unwrap();
            format!("{}{}", r["problem"], r["question"])
        })
        .collect();
    for line in read(&out.join("heldout/op2-40.jsonl")).lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(!test_prompts.contains(&format!("{}{}", r["problem"], r["question"])));
    }

    // The generated rows score perfectly against their own gold graphs.
    let gold = dir.path().join("gold");
    ok(&["eval", "gold", "--rows", s(&out.join("test")), "--out", s(&gold)]);
    assert_eq!(files_in(&gold).len(), 4);

    assert!(failure(&["data", "interplay", "--ops", "1-3", "--per-op", "2", "--out", s(&out)]).contains("op 1 is outside 2..=20"));
}

#[test]
fn bad_input_names_file_and_line_and_leaves_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let generations = read(&fixture("scoring/generations.jsonl"));
    let mut lines: Vec<&str> = generations.lines().collect();

    // A malformed JSONL line.
    lines[99] = "{\"op\": \"10\", \"__idx\": ";
    let bad = dir.path().join("bad_generations.jsonl");
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let out = dir.path().join("out1");
    let err = failure(&["eval", "score", "--gold", s(&fixture("gold")), "--generations", s(&bad), "--out", s(&out)]);
    assert!(err.contains("bad_generations.jsonl line 100"), "{err}");
    assert!(files_in(&out).is_empty(), "{:?}", files_in(&out));
    let err = failure(&["eval", "answers", "--generations", s(&bad), "--out", s(&out)]);
    assert!(err.contains("bad_generations.jsonl line 100"), "{err}");
    assert!(files_in(&out).is_empty());

    // A record without a field the answer metrics need.
    let record = lines[5].replace("\"exact_match\": 1, ", "").replace("\"exact_match\": 0, ", "");
    lines[99] = generations.lines().nth(99).unwrap();
    lines[5] = &record;
    let missing = dir.path().join("missing.jsonl");
    std::fs::write(&missing, lines.join("\n")).unwrap();
    let err = failure(&["eval", "answers", "--generations", s(&missing), "--out", s(&out)]);
    assert!(err.contains("missing.jsonl line 6") && err.contains("exact_match"), "{err}");
    assert!(files_in(&out).is_empty());

    // Gold built from 12 rows per op while the generations index 24 per op.
    let rows = dir.path().join("rows");
    std::fs::create_dir(&rows).unwrap();
    for op in 2..=20 {
        let text = read(&fixture(&format!("rows/op{op}.jsonl")));
        std::fs::write(rows.join(format!("op{op}.jsonl")), text.lines().take(12).collect::<Vec<_>>().join("\n")).unwrap();
    }
    let gold = dir.path().join("gold12");
    ok(&["eval", "gold", "--rows", s(&rows), "--out", s(&gold)]);
    let out = dir.path().join("out2");
    let err = failure(&["eval", "score", "--gold", s(&gold), "--generations", s(&fixture("scoring/generations.jsonl")), "--out", s(&out)]);
    assert!(err.contains("generations.jsonl line") && err.contains("the gold has 12 rows for op 10"), "{err}");
    assert!(files_in(&out).is_empty(), "{:?}", files_in(&out));

    // A rows file with a bad line: no gold file is written at all.
    std::fs::write(rows.join("op7.jsonl"), "{\"solution\": \"x\"}\nnot json\n").unwrap();
    let gold = dir.path().join("gold_bad");
    let err = failure(&["eval", "gold", "--rows", s(&rows), "--out", s(&gold)]);
    assert!(err.contains("op7.jsonl line 2"), "{err}");
    assert!(files_in(&gold).is_empty());
}
