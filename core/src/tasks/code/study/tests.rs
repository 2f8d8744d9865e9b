//! Against `tests/fixtures/code/study/expected.json`, computed with numpy by
//! `make_study_fixtures.py` from the committed verdict files.

use std::path::PathBuf;

use serde_json::Value;

use super::*;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/code/study").join(name)
}

fn expected() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture("expected.json")).unwrap()).unwrap()
}

fn close(ours: f64, theirs: &Value) {
    let theirs = theirs.as_f64().unwrap();
    assert!((ours - theirs).abs() <= 1e-12, "{ours} vs numpy {theirs}");
}

fn assert_figures(figures: &RunFigures, expected: &Value) {
    close(figures.pass1, &expected["pass@1"]);
    close(figures.stderr.unwrap(), &expected["stderr"]);
    assert_eq!((figures.correct as u64, figures.extracted as u64), (expected["correct"].as_u64().unwrap(), expected["extracted"].as_u64().unwrap()));
    assert_eq!((figures.problems, figures.samples), (40, 400));
}

#[test]
fn run_figures_of_verdict_files_match_numpy() {
    let expected = expected();
    for run in ["base", "cand"] {
        let counts = read_counts(&fixture(&format!("{run}_code_generations.jsonl"))).unwrap();
        assert_figures(&RunFigures::of(&counts), &expected[run]);
    }
    // The summary file's per-problem counts read to the same counts as the verdicts.
    let from_summary = read_counts(&fixture("base_code_summary.json")).unwrap();
    let from_verdicts = read_counts(&fixture("base_code_generations.jsonl")).unwrap();
    let strip = |c: &[ProblemCount]| c.iter().map(|c| (c.question_id.clone(), c.n, c.correct, c.no_code)).collect::<Vec<_>>();
    assert_eq!(strip(&from_summary), strip(&from_verdicts));

    // `kiln code grade`'s output: its lines' other fields and the summary line do not matter.
    let tmp = tempfile::tempdir().unwrap();
    let graded = tmp.path().join("graded.jsonl");
    let mut text: String = std::fs::read_to_string(fixture("base_code_generations.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            serde_json::json!({ "question_id": v["question_id"], "index": v["index"], "verdict": v["verdict"], "passed": 0, "total": 3, "tests": [] }).to_string() + "\n"
        })
        .collect();
    text += "{\"summary\": {\"overall\": {}}}\n";
    std::fs::write(&graded, text).unwrap();
    assert_eq!(strip(&read_counts(&graded).unwrap()), strip(&from_verdicts));
}

#[test]
fn the_spec_line_format() {
    let figures = RunFigures { problems: 175, samples: 1750, pass1: 222.0 / 1750.0, correct: 222, extracted: 146, stderr: Some(0.022904) };
    assert_eq!(figures.to_string(), "pass@1 0.126857, 222 correct, 146 extracted, stderr 0.02290 (175 problems, 1750 samples)");
}

#[test]
fn paired_comparison_matches_numpy() {
    let expected = &expected()["comparison"];
    let a = read_counts(&fixture("base_code_generations.jsonl")).unwrap();
    let b = read_counts(&fixture("cand_code_generations.jsonl")).unwrap();
    let bootstrap = Bootstrap { resamples: 2000, seed: 7, level: 0.95 };
    let c = compare(&a, &b, bootstrap, "base", "cand").unwrap();
    close(c.mean_diff, &expected["mean_diff"]);
    close(c.paired_stderr.unwrap(), &expected["paired_stderr"]);
    assert_eq!(c.correct_diff, expected["correct_diff"].as_i64().unwrap());
    assert_eq!((c.b_better as u64, c.a_better as u64), (expected["b_better"].as_u64().unwrap(), expected["a_better"].as_u64().unwrap()));
    close(c.ci_low, &expected["ci_low"]);
    close(c.ci_high, &expected["ci_high"]);
    assert!(c.ci_low < c.mean_diff && c.mean_diff < c.ci_high);
    for (ours, theirs) in c.per_question.iter().zip(expected["per_question"].as_array().unwrap()) {
        assert_eq!(ours.question_id, theirs["question_id"].as_str().unwrap());
        close(ours.diff, &theirs["diff"]);
    }
    // The generator's first draws, as numpy computes them.
    let mut rng = SplitMix64(7);
    let first: Vec<u64> = (0..5).map(|_| rng.next() % 40).collect();
    let numpy: Vec<u64> = expected["first_indices"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(first, numpy);
    // Another seed gives another interval; the same seed the same one.
    let again = compare(&a, &b, bootstrap, "base", "cand").unwrap();
    assert_eq!((again.ci_low, again.ci_high), (c.ci_low, c.ci_high));
    let other = compare(&a, &b, Bootstrap { seed: 8, ..bootstrap }, "base", "cand").unwrap();
    assert_ne!((other.ci_low, other.ci_high), (c.ci_low, c.ci_high));
}

#[test]
fn runs_over_different_questions_are_refused() {
    let a = read_counts(&fixture("base_code_generations.jsonl")).unwrap();
    let err = compare(&a, &a[1..], Bootstrap::default(), "base.jsonl", "cand.jsonl").unwrap_err().to_string();
    assert!(err.contains("base.jsonl") && err.contains("q00") && err.contains("not in cand.jsonl"), "{err}");
    let err = compare(&a[1..], &a, Bootstrap::default(), "A", "B").unwrap_err().to_string();
    assert!(err.contains("B: question \"q00\" is not in A"), "{err}");
}

#[test]
fn a_bad_verdict_line_names_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m_code_generations.jsonl");
    let good = std::fs::read_to_string(fixture("base_code_generations.jsonl")).unwrap();
    let first = good.lines().next().unwrap();
    std::fs::write(&path, format!("{first}\n{}\n", first.replace("\"accepted\"", "\"maybe\""))).unwrap();
    let err = read_counts(&path).unwrap_err().to_string();
    assert!(err.contains("m_code_generations.jsonl") && err.contains('2'), "{err}");
}

#[test]
fn the_probe_subset_is_the_smallest_sha256_ids_in_order() {
    // sha256 hex digests: "a" ca97…, "b" 3e23…, "c" 2e7d…, "d" 18ac…
    let ids = vec!["a", "b", "c", "d"];
    assert_eq!(probe_subset(ids.clone(), |s| s, 2), ["c", "d"]);
    assert_eq!(probe_subset(ids.clone(), |s| s, 3), ["b", "c", "d"]);
    assert_eq!(probe_subset(vec!["d", "a", "c"], |s| s, 2), ["d", "c"], "the given order is kept");
    assert_eq!(probe_subset(ids, |s| s, 10).len(), 4);
}
