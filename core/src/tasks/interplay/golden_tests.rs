//! Checks against the golden outputs of the reference implementation
//! (`tests/fixtures/interplay/`, described in its README).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::answer::{exact_match, extract_tagged_answer};
use super::answer_metrics::{answer_metrics, read_samples};
use super::files::read_jsonl;
use super::gold::{build_gold_dir, jsonl_files};
use super::graph::parse;
use super::graph_passk::{DEFAULT_PASS_AT, aggregate};
use super::pyjson::Style;
use super::rewards::{ProcessRewardConfig, outcome_reward, process_reward, rl_gold_answer};
use super::row::{Row, gold_answer};
use super::scoring::{ScoreOptions, score};
use super::text::TaskText;

pub(super) fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/interplay")
        .join(rel)
}

fn json_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The golden rows by `(op, line_index)`.
pub(super) fn golden_rows() -> Vec<(u32, Vec<Row>)> {
    (2..=20)
        .map(|op| {
            let rows = std::fs::read_to_string(fixture(&format!("rows/op{op}.jsonl")))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<Row>(l).unwrap())
                .collect();
            (op, rows)
        })
        .collect()
}

#[test]
fn text_format_matches_text_jsonl() {
    let rows = golden_rows();
    let tokenizer = crate::tokenizer::Tokenizer::from_file(fixture("qwen2_100M")).unwrap();
    let lines = json_lines(&fixture("text.jsonl"));
    assert_eq!(lines.len(), 456);
    for line in lines {
        let op = line["op"].as_u64().unwrap() as u32;
        let row = &rows[(op - 2) as usize].1[line["line_index"].as_u64().unwrap() as usize];
        let text = TaskText::of(row).unwrap();
        assert_eq!(text.text, line["text"].as_str().unwrap());
        assert_eq!(text.prompt, line["prompt"].as_str().unwrap());
        assert_eq!(text.completion, line["completion"].as_str().unwrap());
        let ids: Vec<u32> = line["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tokenizer.encode(&text.text).unwrap(), ids);
    }
}

/// Checks that `order` lists every node once, each after its in-graph dependencies.
fn assert_topological(nodes: &[Value], order: &[Value]) {
    let names: Vec<&str> = nodes.iter().map(|n| n["name"].as_str().unwrap()).collect();
    let position = |name: &str| order.iter().position(|o| o.as_str() == Some(name));
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(order.len(), unique.len());
    for node in nodes {
        let me = position(node["name"].as_str().unwrap()).expect("node in order");
        for dep in node["dependencies"].as_array().unwrap() {
            if let Some(at) = position(dep.as_str().unwrap()) {
                assert!(at < me, "{dep} must come before {}", node["name"]);
            }
        }
    }
}

#[test]
fn gold_graphs_match_reference() {
    let out = tempfile::tempdir().unwrap();
    let mut written = build_gold_dir(&fixture("rows"), out.path()).unwrap();
    written.sort();
    assert_eq!(written.len(), 19);
    let golden = jsonl_files(&fixture("gold")).unwrap();
    assert_eq!(
        written
            .iter()
            .map(|p| p.file_name().unwrap())
            .collect::<Vec<_>>(),
        golden
            .iter()
            .map(|p| p.file_name().unwrap())
            .collect::<Vec<_>>()
    );
    for (ours, theirs) in written.iter().zip(&golden) {
        let (ours, theirs) = (json_lines(ours), json_lines(theirs));
        assert_eq!(ours.len(), theirs.len());
        for (mut a, mut b) in ours.into_iter().zip(theirs) {
            let order = a["graph"]["topological_order"].take();
            assert_topological(
                a["graph"]["nodes"].as_array().unwrap(),
                order.as_array().unwrap(),
            );
            b["graph"]["topological_order"].take();
            assert_eq!(a, b);
        }
    }
}

#[test]
fn scoring_reproduces_graph_results_report_and_results_json() {
    let out = tempfile::tempdir().unwrap();
    let generations = fixture("scoring/generations.jsonl");
    let report = score(
        &fixture("gold"),
        &generations,
        out.path(),
        &ScoreOptions::default(),
    )
    .unwrap();

    let ours =
        std::fs::read_to_string(out.path().join("generations.jsonl.graph_results.jsonl")).unwrap();
    let theirs =
        std::fs::read_to_string(fixture("scoring/generations.jsonl.graph_results.jsonl")).unwrap();
    assert_eq!(ours.lines().count(), 2204);
    for (i, (a, b)) in ours.lines().zip(theirs.lines()).enumerate() {
        assert_eq!(a, b, "graph_results line {}", i + 1);
    }
    assert_eq!(ours, theirs);

    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("scoring/generations.jsonl_score_report.jsonl")).unwrap(),
    )
    .unwrap();
    let ours: Value = serde_json::from_str(&report.report.dumps(Style::COMPACT)).unwrap();
    let strip_paths = |mut v: Value| {
        for key in ["gold_dir", "generated_path", "results_dir"] {
            v[key].take();
        }
        v["aggregate"]["report_path"].take();
        for f in v["per_file"].as_array_mut().unwrap() {
            f["file"].take();
            f["results_path"].take();
        }
        v
    };
    assert_eq!(strip_paths(ours), strip_paths(golden));

    let written = aggregate(out.path(), &DEFAULT_PASS_AT, false).unwrap();
    assert_eq!(written, vec![out.path().join("results.json")]);
    let ours = std::fs::read_to_string(&written[0]).unwrap();
    let theirs = std::fs::read_to_string(fixture("scoring/results.json")).unwrap();
    assert_numbers_close(
        &serde_json::from_str(&ours).unwrap(),
        &serde_json::from_str(&theirs).unwrap(),
        1e-12,
        "results.json",
    );
    assert_eq!(ours, theirs);
}

/// Structural equality with numbers compared to `tol`.
fn assert_numbers_close(a: &Value, b: &Value, tol: f64, at: &str) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= tol, "{at}: {x} vs {y}");
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{at}"
            );
            for (k, v) in x {
                assert_numbers_close(v, &y[k], tol, &format!("{at}.{k}"));
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}");
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                assert_numbers_close(p, q, tol, &format!("{at}[{i}]"));
            }
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

#[test]
fn answer_metrics_match_reference() {
    let samples = read_samples(&fixture("scoring/generations.jsonl")).unwrap();
    let ours = answer_metrics("checkpoint-golden", &samples, 10, 5).dumps(Style::INDENT2_UTF8);
    let theirs = std::fs::read_to_string(fixture("scoring/answer_metrics.json")).unwrap();
    assert_numbers_close(
        &serde_json::from_str(&ours).unwrap(),
        &serde_json::from_str(&theirs).unwrap(),
        1e-9,
        "metrics",
    );
    assert_eq!(ours, theirs);
}

/// Every generation record's answer fields, recomputed from its sample text and row.
#[test]
fn generation_records_recompute() {
    let rows = golden_rows();
    let generations = read_jsonl(&fixture("scoring/generations.jsonl")).unwrap();
    assert_eq!(generations.len(), 2242);
    let str_of = |r: &super::files::Record, k: &str| r.fields[k].as_str().unwrap().to_owned();
    for record in &generations {
        let op: u32 = str_of(record, "op").parse().unwrap();
        let idx = record.fields["__idx"].as_u64().unwrap() as usize;
        let row = &rows[(op - 2) as usize].1[idx % 24];
        assert_eq!(str_of(record, "prompt"), TaskText::of(row).unwrap().prompt);
        assert_eq!(str_of(record, "gold_answer"), gold_answer(&row.solution));
        let sample = str_of(record, "gen_solution_answer");
        assert_eq!(str_of(record, "gen_answer"), extract_tagged_answer(&sample));
        let em = exact_match(
            &str_of(record, "gen_answer"),
            &str_of(record, "gold_answer"),
        );
        assert_eq!(
            i64::from(em),
            record.fields["exact_match"].as_i64().unwrap(),
            "line {}",
            record.line
        );
    }
}

/// The RL rewards on the golden cases: the strict process reward is the outcome reward gated on
/// a graph-perfect sample without extra nodes, and the process reward follows the graph counts.
#[test]
fn rewards_on_golden_cases() {
    let rows = golden_rows();
    let results = json_lines(&fixture("scoring/generations.jsonl.graph_results.jsonl"));
    let generations: Vec<_> = read_jsonl(&fixture("scoring/generations.jsonl"))
        .unwrap()
        .into_iter()
        .filter(|r| {
            !r.fields["gen_solution_answer"]
                .as_str()
                .unwrap()
                .trim()
                .is_empty()
        })
        .collect();
    assert_eq!(generations.len(), results.len());
    let mut strict_ones = 0;
    for (record, result) in generations.iter().zip(&results) {
        let op: u32 = record.fields["op"].as_str().unwrap().parse().unwrap();
        let row = &rows[(op - 2) as usize].1[result["index"].as_u64().unwrap() as usize];
        let response = record.fields["gen_solution_answer"].as_str().unwrap();
        let gold = rl_gold_answer(&row.solution);
        assert_eq!(gold, gold_answer(&row.solution));
        let tagged_match = extract_tagged_answer(response).trim_end_matches('.') == gold;
        let perfect = result["perfect"].as_bool().unwrap();
        let extra = result["extra_nodes"].as_u64().unwrap();
        let strict = process_reward(
            response,
            &gold,
            Some(&row.solution),
            &ProcessRewardConfig::STRICT,
        );
        assert_eq!(
            strict.score,
            f64::from(u8::from(tagged_match && perfect && extra == 0))
        );
        strict_ones += usize::from(strict.score == 1.0);

        let gold_nodes = parse(&row.solution).graph().nodes().len() as u64;
        let count = |k: &str| {
            result[k]
                .as_u64()
                .unwrap_or_else(|| u64::from(result[k].as_bool().unwrap()))
        };
        let penalty = count("value_mismatch_count")
            + count("dependency_mismatch_count")
            + count("missing_nodes")
            + extra.min(gold_nodes)
            + count("answer_mismatch");
        let mixed = process_reward(
            response,
            &gold,
            Some(&row.solution),
            &ProcessRewardConfig::PROCESS,
        );
        let process = (1.0 - penalty as f64 / gold_nodes as f64).max(0.0);
        assert!((mixed.process_reward - process).abs() < 1e-12);
        let want = if tagged_match {
            0.2 + 0.8 * process
        } else {
            0.0
        };
        assert!((mixed.score - want).abs() < 1e-12);

        // The pure outcome reward also reads a bare `Answer:` line.
        let marker = response.contains("<answer>") || !response.contains("Answer:");
        assert_eq!(
            outcome_reward(response, &gold) == 1.0,
            if marker { tagged_match } else { true }
        );
    }
    assert!(strict_ones > 500, "{strict_ones}");
}

/// Step-by-step parser output against `scoring/parsed.jsonl` (the reference parser's steps,
/// graph and comparison for every generated sample; see the fixtures' README).
#[test]
fn parser_matches_parsed_jsonl() {
    let path = fixture("scoring/parsed.jsonl");
    let generations = read_jsonl(&fixture("scoring/generations.jsonl")).unwrap();
    let lines = json_lines(&path);
    assert_eq!(lines.len(), generations.len(), "one parsed line per generation");
    assert!(lines.iter().filter(|l| l["scored"].as_bool().unwrap()).count() > 2000);
    for (line, record) in lines.iter().zip(&generations) {
        if !line["scored"].as_bool().unwrap() {
            continue;
        }
        let parsed = parse(record.fields["gen_solution_answer"].as_str().unwrap());
        let steps = line["steps"].as_array().unwrap();
        assert_eq!(parsed.steps.len(), steps.len(), "line {}", line["gen_line"]);
        for (ours, theirs) in parsed.steps.iter().zip(steps) {
            assert_eq!(
                ours.name,
                theirs["name"].as_str().unwrap(),
                "line {}",
                line["gen_line"]
            );
            assert_eq!(ours.variable, theirs["variable"].as_str().unwrap());
            assert_eq!(
                ours.value,
                theirs["value"].as_f64(),
                "line {} step {}",
                line["gen_line"],
                ours.name
            );
            let deps: Vec<&str> = theirs["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_str().unwrap())
                .collect();
            assert_eq!(
                ours.dependencies
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
                deps
            );
            let exprs: Vec<&str> = theirs["expressions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_str().unwrap())
                .collect();
            assert_eq!(
                ours.expressions
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
                exprs
            );
        }
        assert_eq!(parsed.answer, line["graph"]["answer"].as_f64());
        assert_eq!(parsed.preamble, line["preamble"].as_str().unwrap());
    }
}

/// Regenerates the golden `shared` rows the way the README's driver did (seed 1234 for both
/// streams; op 2→20, mode, template, k; each row retried until the generator succeeds) and
/// checks the retry count of every cell against `generation_log.json`, the solutions up to
/// parameter names, and that many rows come out byte-identical. (The reference itself is not
/// reproducible beyond that: see `Structure::adjacent`.)
#[test]
fn generator_replays_the_golden_driver() {
    use super::generator::{Mode, Rngs, Template, draw_problem};
    let log: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("generation_log.json")).unwrap())
            .unwrap();
    let cells = log["cells"].as_array().unwrap();
    let rows: Vec<Row> = golden_rows()
        .into_iter()
        .flat_map(|(_, rows)| rows)
        .collect();
    let mut rngs = Rngs::seeded(1234);
    let mut seen = std::collections::HashSet::new();
    let (mut identical, mut i) = (0, 0);
    let strip_names = |s: &str| {
        regex::Regex::new(r"Define (.*?) as ")
            .unwrap()
            .replace_all(s, "Define _ as ")
            .into_owned()
    };
    for op in 2..=20u32 {
        for mode in Mode::ALL {
            for template in Template::ALL {
                for _k in 0..4 {
                    let mut tries = 0;
                    let problem = loop {
                        tries += 1;
                        if let Ok(p) = draw_problem(&mut rngs, mode, template, op)
                            && seen.insert((p.problem.clone(), p.question.clone(), p.solution.clone()))
                        {
                            break p;
                        }
                    };
                    assert_eq!(
                        tries,
                        cells[i]["tries"].as_u64().unwrap(),
                        "cell {i}: {}",
                        cells[i]
                    );
                    let golden = &rows[i];
                    assert_eq!(
                        (golden.op, golden.mode.as_str(), golden.template.as_str()),
                        (op, mode.name(), template.name())
                    );
                    assert_eq!(
                        strip_names(&problem.solution),
                        strip_names(&golden.solution),
                        "cell {i}"
                    );
                    if (&problem.problem, &problem.question, &problem.solution)
                        == (&golden.problem, &golden.question, &golden.solution)
                    {
                        identical += 1;
                    }
                    i += 1;
                }
            }
        }
    }
    assert!(identical >= 100, "{identical} byte-identical rows");
}
