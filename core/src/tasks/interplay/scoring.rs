//! Strict graph scoring of generations against gold graphs (`score_dependency_graphs.py`,
//! `docs/interplay.md` §8.4): per-sample `*.graph_results.jsonl` lines and the score report.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::io::python::{py_int, py_path, py_str};
use crate::io::{AtomicFile, jsonl_records_reported};
use super::gold::{GoldIndex, passthrough};
use super::graph::parse;
use crate::io::pyjson::{Json, Style};
use super::score_report::{COUNTERS, Counters, FileReport, TemplateStats};
use crate::error::{Error, Result};

/// Scoring options (the reference's command-line defaults are [`ScoreOptions::default`]).
#[derive(Debug, Clone)]
pub struct ScoreOptions {
    /// Field holding the generated solution text.
    pub solution_key: String,
    /// Numeric tolerance for value and answer comparisons.
    pub tolerance: f64,
    /// Rescore files whose results already exist (the reference skips them).
    pub overwrite: bool,
}

impl Default for ScoreOptions {
    fn default() -> Self {
        Self {
            solution_key: "gen_solution_answer".into(),
            tolerance: 1e-6,
            overwrite: false,
        }
    }
}

/// A gold graph that some sample matched, as the reference counts unused entries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UsedKey {
    /// Matched through `(op, id)` and the slot among duplicates.
    Id(String, String, usize),
    /// Matched through `(op, __idx % op_count)`.
    Idx(String, i64),
}

/// The first record of an op matched by index, to check that every later one falls in the same
/// block of `op_count` consecutive indices (otherwise `__idx % op_count` picks wrong rows).
struct Block {
    block: i64,
    line: usize,
}

/// `score_file`: scores every record of `generations` against `gold`, writing one line per
/// scored sample to `results_path`. The results file appears only if the whole input scores;
/// an existing one is kept and the file reported as skipped, unless `options.overwrite`.
pub fn score_file(
    generations: &Path,
    results_path: &Path,
    gold: &GoldIndex,
    options: &ScoreOptions,
) -> Result<(FileReport, HashSet<UsedKey>)> {
    let mut counters = Counters::default();
    for key in COUNTERS {
        counters.add(key, 0);
    }
    let mut report = FileReport {
        file: py_path(generations),
        counters,
        skipped: false,
        unused_gold_entries: 0,
        template_stats: TemplateStats::default(),
        results_path: py_path(results_path),
    };
    if results_path.exists() && !options.overwrite {
        report.skipped = true;
        return Ok((report, HashSet::new()));
    }
    let mut out = AtomicFile::create(results_path)?;
    let mut id_usage: HashMap<(String, String), usize> = HashMap::new();
    let mut sample_counters: HashMap<String, i64> = HashMap::new();
    let mut blocks: HashMap<String, Block> = HashMap::new();
    let mut used = HashSet::new();

    for record in jsonl_records_reported(generations, "scoring")? {
        let record = record?;
        let fields = &record.fields;
        report.counters.add("total", 1);
        let template = fields.get("template");
        let template_key = match template {
            Some(Value::String(t)) if !t.is_empty() => t.clone(),
            _ => "__none__".to_owned(),
        };
        report.template_stats.add(&template_key, "total", 1);
        let mut count = |key: &str| {
            report.counters.add(key, 1);
            report.template_stats.add(&template_key, key, 1);
        };
        let solution = match fields.get(&options.solution_key) {
            Some(Value::String(s)) if !super::pystr::strip(s).is_empty() => s,
            _ => {
                count("missing_solution");
                continue;
            }
        };

        let op = py_str(fields.get("op"));
        let id = fields
            .get("id")
            .filter(|v| !v.is_null())
            .map(|v| py_str(Some(v)));
        let mut gold_graph = None;
        let mut match_source = "";
        let mut raw_index = None;
        let mut index = None;
        if let Some(id) = &id {
            let key = (op.clone(), id.clone());
            if let Some(queue) = gold.by_id.get(&key).filter(|q| !q.is_empty()) {
                let usage = id_usage.entry(key).or_default();
                let slot = *usage % queue.len();
                *usage += 1;
                gold_graph = Some(&queue[slot]);
                match_source = "id";
                used.insert(UsedKey::Id(op.clone(), id.clone(), slot));
            }
        }
        if gold_graph.is_none()
            && let Some(raw) = fields.get("__idx").and_then(py_int)
        {
            raw_index = Some(raw);
            let mut normalized = raw;
            if let Some(&size) = gold.op_counts.get(&op).filter(|&&s| s > 0) {
                let size = size as i64;
                normalized = raw.rem_euclid(size);
                let block = raw.div_euclid(size);
                let first = blocks.entry(op.clone()).or_insert(Block {
                    block,
                    line: record.line,
                });
                if first.block != block {
                    return Err(Error::data(
                        generations,
                        Some(record.line),
                        format!(
                            "__idx {raw} of op {op} is not in the block of {size} indices of line {} \
                             (the gold has {size} rows for op {op}; do the generations come from the same split?)",
                            first.line
                        ),
                    ));
                }
            }
            index = Some(normalized);
            if let Some(graph) = gold.by_idx.get(&(op.clone(), normalized)) {
                gold_graph = Some(graph);
                match_source = "idx";
                used.insert(UsedKey::Idx(op.clone(), normalized));
            }
        }
        let Some(gold_graph) = gold_graph else {
            count("missing_gold");
            continue;
        };

        let comparison = gold_graph.compare(&parse(solution).graph(), options.tolerance);
        let perfect = comparison.is_perfect();
        for (hit, key) in [
            (!comparison.value_mismatches.is_empty(), "value_mismatch"),
            (
                !comparison.dependency_mismatches.is_empty(),
                "dependency_mismatch",
            ),
            (comparison.answer_mismatch.is_some(), "answer_mismatch"),
            (!comparison.extra_in_pred.is_empty(), "extra_nodes"),
            (!comparison.missing_in_pred.is_empty(), "missing_nodes"),
            (perfect, "perfect"),
            (
                perfect && !comparison.extra_in_pred.is_empty(),
                "perfect_with_extra",
            ),
        ] {
            if hit {
                count(key);
            }
        }

        let (key_type, key_value) = match (match_source, &id) {
            ("id", Some(id)) => ("id", Json::from(id.as_str())),
            _ => ("idx", Json::from(index.or(raw_index))),
        };
        let rank_key = format!(
            "{key_type}\u{0}{op}\u{0}{}",
            key_value.dumps(Style::COMPACT)
        );
        let rank = sample_counters.entry(rank_key).or_default();
        let sample_rank = *rank;
        *rank += 1;

        let mut entry = vec![
            ("op".to_owned(), Json::from(op.as_str())),
            ("id".to_owned(), Json::from(id.clone())),
            ("template".to_owned(), passthrough(template)),
            ("prompt_key_type".to_owned(), Json::from(key_type)),
            ("prompt_key_value".to_owned(), key_value),
            ("raw_index".to_owned(), Json::from(raw_index)),
            ("index".to_owned(), Json::from(index)),
            ("sample_rank".to_owned(), Json::Int(sample_rank)),
            ("match_source".to_owned(), Json::from(match_source)),
            ("perfect".to_owned(), Json::Bool(perfect)),
            (
                "value_mismatch_count".to_owned(),
                Json::from(comparison.value_mismatches.len()),
            ),
            (
                "dependency_mismatch_count".to_owned(),
                Json::from(comparison.dependency_mismatches.len()),
            ),
            (
                "answer_mismatch".to_owned(),
                Json::Bool(comparison.answer_mismatch.is_some()),
            ),
            (
                "extra_nodes".to_owned(),
                Json::from(comparison.extra_in_pred.len()),
            ),
            (
                "missing_nodes".to_owned(),
                Json::from(comparison.missing_in_pred.len()),
            ),
        ];
        if let Some((g, p)) = comparison.answer_mismatch {
            entry.push((
                "answer_mismatch_detail".to_owned(),
                Json::Array(vec![Json::from(g), Json::from(p)]),
            ));
        }
        out.write_line(&Json::Object(entry).dumps(Style::COMPACT))?;
    }
    out.commit()?;
    report.unused_gold_entries = gold.total as i64 - used.len() as i64;
    report.unused_gold_entries = report.unused_gold_entries.max(0);
    Ok((report, used))
}

/// The generation files under `path`: the file itself, or every `*generations.jsonl` below a
/// directory (sorted), as `discover_generation_files` finds them.
pub fn generation_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !path.is_dir() {
        return Err(Error::data(path, None, "generation path not found"));
    }
    let mut files = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))? {
            let p = entry.map_err(|e| Error::io(&dir, e))?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with("generations.jsonl"))
            {
                files.push(p);
            }
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(Error::data(path, None, "no *generations.jsonl files found"));
    }
    Ok(files)
}

/// `resolve_result_path`: `<results_dir>/<path relative to the input>.graph_results.jsonl`.
pub fn results_path_for(generated: &Path, input: &Path, results_dir: &Path) -> PathBuf {
    let base = if input.is_dir() {
        input
    } else {
        generated.parent().unwrap_or(Path::new(""))
    };
    let relative = generated
        .strip_prefix(base)
        .map(Path::to_path_buf)
        .unwrap_or_else(|_| PathBuf::from(generated.file_name().unwrap_or_default()));
    let mut name = relative.file_name().unwrap_or_default().to_os_string();
    name.push(".graph_results.jsonl");
    results_dir.join(relative.with_file_name(name))
}

/// The outcome of [`score`].
#[derive(Debug, Clone)]
pub struct ScoreSummary {
    /// The report line appended to `<name>_score_report.jsonl`.
    pub report: Json,
    /// The aggregate counters: `files`, the [`COUNTERS`] and `skipped`.
    pub aggregate: Counters,
}

/// Scores every generations file under `input` and appends one report line to
/// `<results_dir>/<input name>_score_report.jsonl` (the reference's command).
pub fn score(
    gold_dir: &Path,
    input: &Path,
    results_dir: &Path,
    options: &ScoreOptions,
) -> Result<ScoreSummary> {
    let gold = GoldIndex::load(gold_dir)?;
    let files = generation_files(input)?;
    let mut per_file = Vec::new();
    let mut aggregate = Counters::default();
    for key in ["files"]
        .iter()
        .chain(COUNTERS.iter())
        .chain(["skipped"].iter())
    {
        aggregate.add(key, 0);
    }
    let mut template_stats = TemplateStats::default();
    let mut used_all: HashSet<UsedKey> = HashSet::new();
    for file in &files {
        let (report, used) = score_file(
            file,
            &results_path_for(file, input, results_dir),
            &gold,
            options,
        )?;
        if report.skipped {
            aggregate.add("skipped", 1);
        } else {
            aggregate.add("files", 1);
            for key in COUNTERS {
                aggregate.add(key, report.counters.get(key));
            }
            template_stats.merge(&report.template_stats);
            used_all.extend(used);
        }
        per_file.push(report.to_json());
    }
    let name = input
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let report_path = results_dir.join(format!("{name}_score_report.jsonl"));
    let mut fields: Vec<(String, Json)> = aggregate
        .iter()
        .map(|(k, v)| (k.to_owned(), Json::Int(v)))
        .collect();
    fields.push((
        "unused_gold_entries".into(),
        Json::Int((gold.total as i64 - used_all.len() as i64).max(0)),
    ));
    fields.push(("aggregated".into(), Json::Bool(true)));
    fields.push(("report_path".into(), Json::from(py_path(&report_path))));
    fields.push(("template_stats".into(), template_stats.to_json()));
    let payload = Json::object([
        ("gold_dir", Json::from(py_path(gold_dir))),
        ("generated_path", Json::from(py_path(input))),
        ("results_dir", Json::from(py_path(results_dir))),
        ("per_file", Json::Array(per_file)),
        ("aggregate", Json::Object(fields)),
    ]);
    let mut contents = match std::fs::read_to_string(&report_path) {
        Ok(existing) => existing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(Error::io(&report_path, e)),
    };
    contents.push_str(&payload.dumps(Style::COMPACT));
    contents.push('\n');
    crate::io::write_atomic(&report_path, &contents)?;
    Ok(ScoreSummary {
        report: payload,
        aggregate,
    })
}
