//! ID aggregates weighted two ways (`docs/interplay.md` §8.5): uniformly over ops (the reference's
//! totals, which weigh ops equally because every op file has as many prompts) and as the paper's ID
//! panel does, by difficulty band: op 2–4 at 20 %, op 5–7 at 30 %, op 8–10 at 50 % (each band the
//! mean of its ops). Written beside the reference's files, never into them.

use super::data::Subset;
use crate::io::pyjson::Json;

/// A band of ops and its weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Band {
    /// First and last op of the band.
    pub ops: (i64, i64),
    pub weight: f64,
}

/// The paper's ID bands.
pub const PAPER_ID_BANDS: [Band; 3] =
    [Band { ops: (2, 4), weight: 0.2 }, Band { ops: (5, 7), weight: 0.3 }, Band { ops: (8, 10), weight: 0.5 }];

/// The mean over ops of `per_op` (`(op, value)`), `None` without ops.
pub fn op_uniform(per_op: &[(i64, f64)]) -> Option<f64> {
    (!per_op.is_empty()).then(|| per_op.iter().map(|(_, v)| v).sum::<f64>() / per_op.len() as f64)
}

/// Σ band weight × mean of the band's ops in `per_op`; `None` when a band has no op.
pub fn paper_weighted(per_op: &[(i64, f64)]) -> Option<f64> {
    let mut total = 0.0;
    for band in PAPER_ID_BANDS {
        let values: Vec<(i64, f64)> =
            per_op.iter().copied().filter(|(op, _)| (band.ops.0..=band.ops.1).contains(op)).collect();
        total += band.weight * op_uniform(&values)?;
    }
    Some(total)
}

/// `{op: value}` of a metrics object as `(op, value)`; keys that are not integers are skipped.
fn per_op_values(object: Option<&Json>, value: impl Fn(&Json) -> Option<f64>) -> Vec<(i64, f64)> {
    match object {
        Some(Json::Object(pairs)) => {
            pairs.iter().filter_map(|(op, v)| Some((op.trim().parse().ok()?, value(v)?))).collect()
        }
        _ => Vec::new(),
    }
}

/// `{"uniform": {pass@k…}, "paper": {pass@k…}}` from `{op: {"pass@k": v}}`; `null` when empty.
fn pass_at_k_both(per_op: Option<&Json>) -> Json {
    let Some(Json::Object(ops)) = per_op else { return Json::Null };
    let Some((_, Json::Object(first))) = ops.first() else { return Json::Null };
    let keys: Vec<&String> = first.iter().map(|(k, _)| k).collect();
    let both = |f: fn(&[(i64, f64)]) -> Option<f64>| {
        Json::Object(
            keys.iter()
                .map(|k| (k.to_string(), Json::from(f(&per_op_values(per_op, |m| m.get(k)?.as_f64())))))
                .collect(),
        )
    };
    Json::object([("uniform", both(op_uniform)), ("paper", both(paper_weighted))])
}

/// The ID weighting record of one model, from its metrics JSON and (when strict scoring ran) the
/// `results.json` entry of its ID generations file:
/// `{"bands", "answer_accuracy": {"uniform", "paper"}, "answer_pass_at_k": {"uniform", "paper"},
/// "strict_pass_at_k": {"uniform", "paper"} | null}`.
pub fn id_weighting(metrics: &Json, strict_id: Option<&Json>) -> Json {
    let id = metrics.get(Subset::Id.name());
    let accuracy = per_op_values(id.and_then(|m| m.get("per_op_accuracy")), Json::as_f64);
    let bands = PAPER_ID_BANDS.iter().map(|b| {
        Json::object([("ops", Json::Array(vec![Json::Int(b.ops.0), Json::Int(b.ops.1)])), ("weight", Json::Float(b.weight))])
    });
    Json::object([
        ("bands", Json::Array(bands.collect())),
        (
            "answer_accuracy",
            Json::object([("uniform", Json::from(op_uniform(&accuracy))), ("paper", Json::from(paper_weighted(&accuracy)))]),
        ),
        ("answer_pass_at_k", pass_at_k_both(id.and_then(|m| m.get("per_op_pass_at_k")))),
        ("strict_pass_at_k", pass_at_k_both(strict_id.and_then(|r| r.get("total")).and_then(|t| t.get("per_op_pass_at_k")))),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_are_weighted_20_30_50() {
        let per_op: Vec<(i64, f64)> = (2..=10).map(|op| (op, if op <= 4 { 1.0 } else { 0.0 })).collect();
        assert!((paper_weighted(&per_op).unwrap() - 0.2).abs() < 1e-12);
        assert!((op_uniform(&per_op).unwrap() - 3.0 / 9.0).abs() < 1e-12);
        assert_eq!(paper_weighted(&[(2, 1.0), (5, 1.0)]), None);
        let metrics = Json::object([(
            "id",
            Json::object([
                ("per_op_accuracy", Json::object([("10", Json::Float(0.5)), ("2", Json::Float(1.0)), ("5", Json::Float(0.0))])),
                (
                    "per_op_pass_at_k",
                    Json::object([
                        ("10", Json::object([("pass@1", Json::Float(0.5))])),
                        ("2", Json::object([("pass@1", Json::Float(1.0))])),
                        ("5", Json::object([("pass@1", Json::Float(0.0))])),
                    ]),
                ),
            ]),
        )]);
        let w = id_weighting(&metrics, None);
        let acc = w.get("answer_accuracy").unwrap();
        assert_eq!(acc.get("uniform"), Some(&Json::Float(0.5)));
        assert_eq!(acc.get("paper"), Some(&Json::Float(0.2 + 0.5 * 0.5)));
        assert_eq!(w.get("answer_pass_at_k").unwrap().get("paper").unwrap().get("pass@1"), Some(&Json::Float(0.45)));
        assert_eq!(w.get("strict_pass_at_k"), Some(&Json::Null));
    }
}
