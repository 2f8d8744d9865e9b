//! The run-level files: `summary.json` and `summary.csv` exactly as `eval_checkpoints.py` writes
//! them (one record per checkpoint; `json.dump(indent=2, ensure_ascii=False)` and
//! `csv.DictWriter` with `\r\n` line ends), and kiln's `summary_id_weighting.{json,csv}` with the
//! ID aggregates of [`super::weighting`].

use std::path::Path;

use crate::error::Result;
use crate::io::pyjson::{Json, Style, float_repr};
use crate::io::write_atomic;

/// The columns of `summary.csv`, in order (`summary.json` adds `template_metrics`).
pub const SUMMARY_COLUMNS: [&str; 12] = [
    "checkpoint",
    "id_acc",
    "ood_acc",
    "total_acc",
    "id_avg_loss",
    "ood_avg_loss",
    "total_avg_loss",
    "id_avg_resp_len",
    "ood_avg_resp_len",
    "count_id",
    "count_ood",
    "count_total",
];

/// The `summary.json` record of a checkpoint, from its `<checkpoint>_metrics.json`.
pub fn summary_record(metrics: &Json) -> Json {
    let at = |block: &str, key: &str| metrics.get(block).and_then(|b| b.get(key)).cloned().unwrap_or(Json::Null);
    let float = |block: &str, key: &str| Json::from(at(block, key).as_f64());
    let int = |block: &str, key: &str| match at(block, key) {
        Json::Int(v) => Json::Int(v),
        _ => Json::Null,
    };
    Json::object([
        ("checkpoint", metrics.get("checkpoint").cloned().unwrap_or(Json::Null)),
        ("id_acc", float("id", "answer_accuracy")),
        ("ood_acc", float("ood", "answer_accuracy")),
        ("total_acc", float("total", "answer_accuracy")),
        ("id_avg_loss", float("id", "avg_loss")),
        ("ood_avg_loss", float("ood", "avg_loss")),
        ("total_avg_loss", float("total", "avg_loss")),
        ("id_avg_resp_len", float("id", "avg_response_len")),
        ("ood_avg_resp_len", float("ood", "avg_response_len")),
        ("count_id", int("id", "count")),
        ("count_ood", int("ood", "count")),
        ("count_total", int("total", "count")),
        ("template_metrics", at("total", "per_template")),
    ])
}

/// Writes `<out>/summary.json` and `<out>/summary.csv` for `records` (from [`summary_record`]).
pub fn write_summary(out: &Path, records: &[Json]) -> Result<()> {
    write_atomic(&out.join("summary.json"), &Json::Array(records.to_vec()).dumps(Style::INDENT2_UTF8))?;
    write_atomic(&out.join("summary.csv"), &csv(&SUMMARY_COLUMNS, records))
}

/// Writes `<out>/summary_id_weighting.{json,csv}`: per checkpoint, the ID accuracy and the
/// answer and strict pass@1 and pass@K (K = the largest k) weighted uniformly and as the paper.
/// `records` are `(checkpoint, weighting)` pairs from [`super::weighting::id_weighting`].
pub fn write_weighting_summary(out: &Path, records: &[(String, Json)]) -> Result<()> {
    let listed: Vec<Json> = records
        .iter()
        .map(|(name, w)| {
            let mut pairs = vec![("checkpoint".to_owned(), Json::from(name.as_str()))];
            if let Json::Object(fields) = w {
                pairs.extend(fields.iter().cloned());
            }
            Json::Object(pairs)
        })
        .collect();
    write_atomic(&out.join("summary_id_weighting.json"), &(Json::Array(listed).dumps(Style::INDENT2_UTF8) + "\n"))?;

    // Columns: the accuracy, then pass@1 and pass@K of the answer and the strict metric.
    let largest_k = records
        .iter()
        .filter_map(|(_, w)| match w.get("answer_pass_at_k")?.get("uniform")? {
            Json::Object(pairs) => pairs.last().map(|(k, _)| k.clone()),
            _ => None,
        })
        .next()
        .unwrap_or_else(|| "pass@1".to_owned());
    let mut ks = vec!["pass@1".to_owned()];
    if largest_k != "pass@1" {
        ks.push(largest_k);
    }
    let mut columns = vec!["checkpoint".to_owned(), "id_acc_uniform".to_owned(), "id_acc_paper".to_owned()];
    for k in &ks {
        for metric in ["", "strict_"] {
            for weighting in ["uniform", "paper"] {
                columns.push(format!("id_{metric}{k}_{weighting}"));
            }
        }
    }
    let rows: Vec<Json> = records
        .iter()
        .map(|(name, w)| {
            let mut pairs = vec![("checkpoint".to_owned(), Json::from(name.as_str()))];
            for weighting in ["uniform", "paper"] {
                let v = w.get("answer_accuracy").and_then(|a| a.get(weighting)).cloned().unwrap_or(Json::Null);
                pairs.push((format!("id_acc_{weighting}"), v));
            }
            for k in &ks {
                for (metric, key) in [("", "answer_pass_at_k"), ("strict_", "strict_pass_at_k")] {
                    for weighting in ["uniform", "paper"] {
                        let v = w.get(key).and_then(|m| m.get(weighting)).and_then(|m| m.get(k)).cloned();
                        pairs.push((format!("id_{metric}{k}_{weighting}"), v.unwrap_or(Json::Null)));
                    }
                }
            }
            Json::Object(pairs)
        })
        .collect();
    let columns: Vec<&str> = columns.iter().map(String::as_str).collect();
    write_atomic(&out.join("summary_id_weighting.csv"), &csv(&columns, &rows))
}

/// `csv.DictWriter(fieldnames=columns)`: a header, then one row per record with
/// `record.get(column, "")` written as Python's `str` (floats by `repr`, `None` as empty),
/// quoted only where needed, lines ended by `\r\n`.
pub fn csv(columns: &[&str], records: &[Json]) -> String {
    let mut out = String::new();
    let line = |out: &mut String, cells: Vec<String>| {
        let cells: Vec<String> = cells.into_iter().map(|c| csv_cell(&c)).collect();
        out.push_str(&cells.join(","));
        out.push_str("\r\n");
    };
    line(&mut out, columns.iter().map(|c| c.to_string()).collect());
    for record in records {
        line(&mut out, columns.iter().map(|c| cell_text(record.get(c))).collect());
    }
    out
}

fn cell_text(value: Option<&Json>) -> String {
    match value {
        None | Some(Json::Null) => String::new(),
        Some(Json::Bool(b)) => if *b { "True" } else { "False" }.to_owned(),
        Some(Json::Int(v)) => v.to_string(),
        Some(Json::Float(v)) => match float_repr(*v).as_str() {
            "NaN" => "nan".to_owned(),
            "Infinity" => "inf".to_owned(),
            "-Infinity" => "-inf".to_owned(),
            repr => repr.to_owned(),
        },
        Some(Json::Str(s)) => s.clone(),
        Some(other) => other.dumps(Style::COMPACT_UTF8),
    }
}

/// `QUOTE_MINIMAL`: quoted (with `"` doubled) when it holds a comma, a quote or a line break.
fn csv_cell(text: &str) -> String {
    if text.contains([',', '"', '\r', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_like_python() {
        let records = [Json::object([
            ("checkpoint", Json::from("a,\"b\"")),
            ("id_acc", Json::Float(0.362037)),
            ("count_id", Json::Int(1152000)),
            ("extra", Json::Int(1)),
        ])];
        assert_eq!(
            csv(&["checkpoint", "id_acc", "count_id", "missing"], &records),
            "checkpoint,id_acc,count_id,missing\r\n\"a,\"\"b\"\"\",0.362037,1152000,\r\n"
        );
    }
}
