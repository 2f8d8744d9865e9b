//! Gold dependency graphs: building them from task rows (`build_gold_dependency_graphs.py`,
//! `docs/interplay.md` §8.3) and loading them for scoring
//! (`score_dependency_graphs.py::load_gold_graphs`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub use crate::io::jsonl_files;
use crate::io::python::{py_int, py_str};
use crate::io::{Record, read_jsonl, write_atomic};
use super::graph::{Graph, parse};
use crate::io::pyjson::{Json, Style};
use crate::error::{Error, Result};

/// The suffix `build_gold_dependency_graphs.py` appends to each input file stem.
pub const GOLD_SUFFIX: &str = "_graphs.jsonl";

/// `maybe_int`: an int when within 1e-9 of one, else the float.
pub fn maybe_int(value: Option<f64>) -> Json {
    match value {
        None => Json::Null,
        Some(v) => {
            let rounded = v.round_ties_even();
            if (v - rounded).abs() < 1e-9 && rounded.abs() < 9.2e18 {
                Json::Int(rounded as i64)
            } else {
                Json::Float(v)
            }
        }
    }
}

/// A JSON value passed through as Python's `json.dumps` would write it.
pub fn passthrough(value: Option<&Value>) -> Json {
    match value {
        None | Some(Value::Null) => Json::Null,
        Some(Value::Bool(b)) => Json::Bool(*b),
        Some(Value::Number(n)) => n
            .as_i64()
            .map_or_else(|| Json::Float(n.as_f64().unwrap_or(f64::NAN)), Json::Int),
        Some(Value::String(s)) => Json::Str(s.clone()),
        Some(Value::Array(items)) => {
            Json::Array(items.iter().map(|v| passthrough(Some(v))).collect())
        }
        Some(Value::Object(map)) => Json::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), passthrough(Some(v))))
                .collect(),
        ),
    }
}

/// `build_graph_record(record, parser, line_index)`: one line of a gold graphs file.
pub fn gold_record(record: &Record, line_index: usize) -> Json {
    let head = |graph: Json| {
        vec![
            ("op".to_owned(), passthrough(record.fields.get("op"))),
            ("id".to_owned(), passthrough(record.fields.get("id"))),
            (
                "template".to_owned(),
                passthrough(record.fields.get("template")),
            ),
            ("graph".to_owned(), graph),
        ]
    };
    let Some(Value::String(solution)) = record.fields.get("solution") else {
        let mut fields = head(Json::Null);
        fields.push(("error".to_owned(), Json::from("missing-solution")));
        return Json::Object(fields);
    };
    let parsed = parse(solution);
    let graph = parsed.graph();
    // One entry per step (duplicates included), each showing the final node of that name.
    let nodes = parsed
        .steps
        .iter()
        .map(|step| {
            let node = graph.get(&step.name).expect("every step is a node");
            Json::object([
                ("name", Json::from(node.name.as_str())),
                ("variable", Json::from(node.variable.clone())),
                ("value", maybe_int(node.value)),
                (
                    "dependencies",
                    Json::Array(
                        node.dependencies
                            .iter()
                            .map(|d| Json::from(d.as_str()))
                            .collect(),
                    ),
                ),
            ])
        })
        .collect();
    let topo = graph
        .topological_order()
        .map(|order| Json::Array(order.into_iter().map(Json::Str).collect()));
    let mut fields = head(Json::object([
        ("nodes", Json::Array(nodes)),
        ("answer", maybe_int(parsed.answer)),
        ("topological_order", topo.unwrap_or(Json::Null)),
    ]));
    fields.push(("line_index".to_owned(), Json::from(line_index)));
    Json::Object(fields)
}

/// `build_gold_dependency_graphs.py rows_dir out_dir`: one `<stem>_graphs.jsonl` per row file.
/// Every input is read and checked before any output is written. Returns the written paths.
pub fn build_gold_dir(rows_dir: &Path, out_dir: &Path) -> Result<Vec<PathBuf>> {
    let inputs = jsonl_files(rows_dir)?;
    if inputs.is_empty() {
        return Err(Error::data(rows_dir, None, "no *.jsonl files found"));
    }
    let mut outputs = Vec::with_capacity(inputs.len());
    for input in &inputs {
        let lines: Vec<String> = read_jsonl(input)?
            .iter()
            .enumerate()
            .map(|(i, record)| gold_record(record, i).dumps(Style::COMPACT_UTF8))
            .collect();
        let stem = input
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        outputs.push((
            out_dir.join(format!("{stem}{GOLD_SUFFIX}")),
            lines.join("\n") + "\n",
        ));
    }
    let mut written = Vec::with_capacity(outputs.len());
    for (path, contents) in outputs {
        write_atomic(&path, &contents)?;
        written.push(path);
    }
    Ok(written)
}

/// Gold graphs keyed the way the scorer looks them up.
#[derive(Debug, Default)]
pub struct GoldIndex {
    /// `(op, str(id))` → graphs with that id, in file order.
    pub by_id: HashMap<(String, String), Vec<Graph>>,
    /// `(op, line_index)` → graph.
    pub by_idx: HashMap<(String, i64), Graph>,
    /// Number of gold graphs per op.
    pub op_counts: HashMap<String, usize>,
    /// Number of gold graphs.
    pub total: usize,
}

impl GoldIndex {
    /// `load_gold_graphs(dir)`: every `*.jsonl` in `dir`; records without a graph are skipped.
    pub fn load(dir: &Path) -> Result<GoldIndex> {
        let mut index = GoldIndex::default();
        for path in jsonl_files(dir)? {
            for (line_index, record) in read_jsonl(&path)?.into_iter().enumerate() {
                let payload = match record.fields.get("graph") {
                    Some(Value::Object(map)) if !map.is_empty() => map,
                    Some(Value::Null) | None => continue,
                    Some(Value::Object(_)) => continue,
                    Some(_) => {
                        return Err(Error::data(
                            &path,
                            Some(record.line),
                            "\"graph\" is not an object",
                        ));
                    }
                };
                let graph = Graph::from_json(payload)
                    .map_err(|m| Error::data(&path, Some(record.line), m))?;
                index.total += 1;
                let op = py_str(record.fields.get("op"));
                *index.op_counts.entry(op.clone()).or_default() += 1;
                if let Some(id) = record.fields.get("id").filter(|v| !v.is_null()) {
                    index
                        .by_id
                        .entry((op.clone(), py_str(Some(id))))
                        .or_default()
                        .push(graph.clone());
                }
                let idx = match record.fields.get("line_index") {
                    None => line_index as i64,
                    Some(v) => py_int(v).ok_or_else(|| {
                        Error::data(&path, Some(record.line), "\"line_index\" is not an integer")
                    })?,
                };
                index.by_idx.insert((op, idx), graph);
            }
        }
        if index.by_id.is_empty() && index.by_idx.is_empty() {
            return Err(Error::data(dir, None, "no gold graphs found"));
        }
        Ok(index)
    }
}
