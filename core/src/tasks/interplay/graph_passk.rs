//! Strict graph pass@k over `*.graph_results.jsonl` files (`aggregate_graph_pass_results.py`,
//! `docs/interplay.md` §8.5): the ordered empirical estimator, per template × op, per template, per
//! op and overall, written as `results.json`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::io::python::{py_int, py_str};
use crate::io::{jsonl_records, write_atomic};
use crate::metrics::passk::{ordered_ks, ordered_pass_rates};
use crate::io::pyjson::{Json, Style};
use crate::error::{Error, Result};

/// `DEFAULT_PASS_AT`.
pub const DEFAULT_PASS_AT: [u64; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

/// Earliest perfect rank of one prompt.
#[derive(Debug, Clone, Copy, Default)]
struct PromptStats {
    min_success_rank: Option<u64>,
}

impl PromptStats {
    fn update(&mut self, rank: Option<i64>, perfect: bool) {
        let Some(rank) = rank.and_then(|r| u64::try_from(r).ok()) else {
            return;
        };
        if perfect && self.min_success_rank.is_none_or(|m| rank < m) {
            self.min_success_rank = Some(rank);
        }
    }
}

type Prompts = HashMap<String, PromptStats>;

/// The four aggregation views of `ResultAccumulator`.
#[derive(Default)]
struct Accumulator {
    template_op: BTreeMap<String, HashMap<String, Prompts>>,
    template_total: HashMap<String, Prompts>,
    op_total: HashMap<String, Prompts>,
    global: Prompts,
    max_rank: Option<i64>,
}

impl Accumulator {
    fn ingest(&mut self, fields: &serde_json::Map<String, Value>) {
        let Some(op) = fields.get("op").filter(|v| !v.is_null()) else {
            return;
        };
        let op = py_str(Some(op));
        let template = match fields.get("template") {
            None | Some(Value::Null) => "default".to_owned(),
            Some(Value::String(s)) if s.is_empty() => "default".to_owned(),
            Some(v) => py_str(Some(v)),
        };
        let key_type = fields
            .get("prompt_key_type")
            .map_or_else(|| "idx".to_owned(), |v| py_str(Some(v)));
        // Prompt values keep their JSON type: 3 and "3" are different prompts.
        let key_value = fields
            .get("prompt_key_value")
            .map_or_else(|| "null".to_owned(), Value::to_string);
        let key = format!("{key_type}\u{0}{key_value}");
        let rank = fields.get("sample_rank").and_then(py_int);
        let perfect = fields.get("perfect").is_some_and(truthy);
        let entry = self
            .template_op
            .entry(template.clone())
            .or_default()
            .entry(op.clone())
            .or_default();
        entry.entry(key.clone()).or_default().update(rank, perfect);
        self.template_total
            .entry(template.clone())
            .or_default()
            .entry(format!("{op}\u{0}{key}"))
            .or_default()
            .update(rank, perfect);
        self.op_total
            .entry(op.clone())
            .or_default()
            .entry(format!("{template}\u{0}{key}"))
            .or_default()
            .update(rank, perfect);
        self.global
            .entry(format!("{template}\u{0}{op}\u{0}{key}"))
            .or_default()
            .update(rank, perfect);
        if let Some(rank) = rank {
            self.max_rank = Some(self.max_rank.map_or(rank, |m| m.max(rank)));
        }
    }
}

/// Python's `bool(value)` for a JSON value.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// `sort_op_keys`: numeric ops first (by value), then ops starting with digits, then the rest.
fn sort_ops<'a>(ops: impl Iterator<Item = &'a String>) -> Vec<&'a String> {
    let mut ops: Vec<&String> = ops.collect();
    let key = |op: &String| -> (u8, u128, String) {
        let digits: String = op.chars().take_while(char::is_ascii_digit).collect();
        let value = digits.parse().unwrap_or(u128::MAX);
        if !op.is_empty() && digits.len() == op.len() {
            (0, value, op.clone())
        } else if !digits.is_empty() {
            (1, value, op.clone())
        } else {
            (2, 0, op.clone())
        }
    };
    ops.sort_by_key(|op| key(op));
    ops
}

fn rates(prompts: Option<&Prompts>, ks: &[u64]) -> Vec<f64> {
    let earliest: Vec<Option<u64>> = prompts
        .map(|p| p.values().map(|s| s.min_success_rank).collect())
        .unwrap_or_default();
    ordered_pass_rates(&earliest, ks)
}

fn pass_json(values: &[f64], ks: &[u64]) -> Json {
    Json::Object(
        ks.iter()
            .zip(values)
            .map(|(k, v)| (format!("pass@{k}"), Json::Float(*v)))
            .collect(),
    )
}

/// One view's `per_op_pass_at_k`, `per_op_pass_at_columns`, `total_pass_at_k` and counts.
fn view(per_op: &[(&String, &Prompts)], total: Option<&Prompts>, ks: &[u64]) -> (Json, Json) {
    let per_op_rates: Vec<(String, Vec<f64>)> = per_op
        .iter()
        .map(|(op, prompts)| (op.to_string(), rates(Some(prompts), ks)))
        .collect();
    let columns = ks
        .iter()
        .enumerate()
        .map(|(i, k)| {
            (
                format!("pass@{k}"),
                Json::Object(
                    per_op_rates
                        .iter()
                        .map(|(op, r)| (op.clone(), Json::Float(r[i])))
                        .collect(),
                ),
            )
        })
        .collect();
    let metrics = Json::object([
        (
            "per_op_pass_at_k",
            Json::Object(
                per_op_rates
                    .iter()
                    .map(|(op, r)| (op.clone(), pass_json(r, ks)))
                    .collect(),
            ),
        ),
        ("per_op_pass_at_columns", Json::Object(columns)),
        ("total_pass_at_k", pass_json(&rates(total, ks), ks)),
    ]);
    let counts = Json::object([
        (
            "per_op",
            Json::Object(
                per_op
                    .iter()
                    .map(|(op, p)| (op.to_string(), Json::from(p.len())))
                    .collect(),
            ),
        ),
        ("total", Json::from(total.map_or(0, HashMap::len))),
    ]);
    (metrics, counts)
}

/// `process_file`: the metrics of one graph-results file, or `None` when it has no ranked sample.
pub fn file_metrics(path: &Path, candidate_ks: &[u64]) -> Result<Option<Json>> {
    let mut acc = Accumulator::default();
    for record in jsonl_records(path)? {
        acc.ingest(&record?.fields);
    }
    let Some(max_rank) = acc.max_rank.filter(|&m| m >= 0) else {
        return Ok(None);
    };
    let ks = ordered_ks(candidate_ks, max_rank as u64);
    let mut per_template = Vec::new();
    let mut per_template_counts = Vec::new();
    for (template, per_op) in &acc.template_op {
        let ops: Vec<(&String, &Prompts)> = sort_ops(per_op.keys())
            .into_iter()
            .map(|op| (op, &per_op[op]))
            .collect();
        let (metrics, counts) = view(&ops, acc.template_total.get(template), &ks);
        per_template.push((template.clone(), metrics));
        per_template_counts.push((template.clone(), counts));
    }
    let ops: Vec<(&String, &Prompts)> = sort_ops(acc.op_total.keys())
        .into_iter()
        .map(|op| (op, &acc.op_total[op]))
        .collect();
    let (total, total_counts) = view(&ops, Some(&acc.global), &ks);
    Ok(Some(Json::object([
        ("per_template", Json::Object(per_template)),
        ("total", total),
        (
            "ks",
            Json::Array(ks.iter().map(|&k| Json::Int(k as i64)).collect()),
        ),
        (
            "prompt_counts",
            Json::object([
                ("per_template", Json::Object(per_template_counts)),
                ("total", total_counts),
            ]),
        ),
    ])))
}

/// `sort_result_files`: `checkpoint-N` files by N first, then the rest by name.
fn sort_result_files(files: &mut [PathBuf]) {
    let key = |p: &PathBuf| {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let number = name.find("checkpoint-").and_then(|i| {
            let digits: String = name[i + "checkpoint-".len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse::<u128>().ok()
        });
        match number {
            Some(n) => (0, n, name),
            None => (1, 0, name),
        }
    };
    files.sort_by_key(key);
}

/// The directories under `root` holding `*.graph_results.jsonl` files, with those files.
fn run_directories(root: &Path) -> Result<BTreeMap<PathBuf, Vec<PathBuf>>> {
    let mut runs: BTreeMap<PathBuf, Vec<PathBuf>> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))? {
            let path = entry.map_err(|e| Error::io(&dir, e))?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with(".graph_results.jsonl"))
            {
                runs.entry(dir.clone()).or_default().push(path);
            }
        }
    }
    Ok(runs)
}

/// `aggregate_graph_pass_results.py root`: writes `results.json` in every directory under `root`
/// that holds graph results (an existing one is kept unless `overwrite`). Returns the paths written.
pub fn aggregate(root: &Path, candidate_ks: &[u64], overwrite: bool) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for (dir, mut files) in run_directories(root)? {
        sort_result_files(&mut files);
        let mut per_file = Vec::new();
        for file in &files {
            if let Some(metrics) = file_metrics(file, candidate_ks)? {
                per_file.push((
                    file.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    metrics,
                ));
            }
        }
        let output = dir.join("results.json");
        if per_file.is_empty() || (output.exists() && !overwrite) {
            continue;
        }
        let results = Json::object([("files", Json::Object(per_file))]);
        write_atomic(&output, &(results.dumps(Style::INDENT2) + "\n"))?;
        written.push(output);
    }
    Ok(written)
}
