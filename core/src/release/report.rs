//! The release's summary across batches (`<root>/summary.md`, `summary.csv`, `summary.json`): each final
//! model's ID / OOD / total accuracy beside the release's own figures (docs/release-layout.md,
//! "Reference results"), and the effects those figures show, checked on this run: which
//! directions a run reproduces and which it does not.

use std::path::Path;

use serde::Serialize;
use serde_json::{Value, json};

use super::ops::OpMap;
use super::plan::{Plan, PlannedRun, RunKind, model_name};
use crate::error::{Error, Result};
use crate::io::write_atomic;

/// The release's summary table (docs/release-layout.md): batch, role, ID, OOD, total accuracy.
pub const REFERENCE: [(&str, &str, f64, f64, f64); 10] = [
    ("020305", "pretrain", 0.362037, 0.100438, 0.224353),
    ("020305", "rl op11_14", 0.800709, 0.369602, 0.573810),
    ("020305", "rl op13_20", 0.683144, 0.289346, 0.475882),
    ("020305", "rl op15_20", 0.388938, 0.160735, 0.268831),
    ("020305", "opd", 0.801092, 0.365645, 0.571909),
    ("050302", "pretrain", 0.659137, 0.174320, 0.403970),
    ("050302", "rl op11_14", 0.756464, 0.348082, 0.541526),
    ("050302", "rl op13_20", 0.709700, 0.343556, 0.516993),
    ("050302", "rl op15_20", 0.719865, 0.291799, 0.494567),
    ("050302", "opd", 0.709348, 0.342995, 0.516530),
];

/// ID, OOD and total accuracy.
pub type Accuracy = (f64, f64, f64);

/// One final model of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub batch: String,
    /// `pretrain`, `rl op11_14`, `opd`.
    pub role: String,
    /// Its name in the batch's `evals/` files.
    pub model: String,
    pub accuracy: Option<Accuracy>,
    /// The ID and OOD samples behind `accuracy`.
    #[serde(default)]
    pub samples: Option<(u64, u64)>,
    pub reference: Option<Accuracy>,
}

/// The samples behind every row of the release's summary (ID, OOD).
pub const RELEASE_SAMPLES: (u64, u64) = (1_152_000, 1_280_000);

/// An effect of the release and whether this run shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Effect {
    /// The claim, its op ranges as this run's scale names them (`RL on op 5-6 (release 11-14)`).
    pub claim: String,
    /// The compared numbers, as in the release and here.
    pub reference: String,
    pub here: Option<String>,
    /// Whether the release's figures show it (they all do) and this run's; `None` when a model
    /// it needs was not evaluated.
    pub in_release: bool,
    pub holds: Option<bool>,
    /// Every compared accuracy of this run is 0: the run says nothing about the effect.
    pub all_zero: bool,
    /// Whether this run's verdict is beyond sampling noise: every compared difference is more
    /// than two standard errors from the claim's threshold (binomial over samples, which
    /// understates the noise: samples of one prompt are correlated); `None` without counts.
    pub resolved: Option<bool>,
}

/// A role of a planned run (`rl op11_14`).
pub fn role(run: &PlannedRun) -> String {
    match run.kind {
        RunKind::Pretrain => "pretrain".into(),
        RunKind::Grpo => format!("rl {}", run.name),
        RunKind::Opd => "opd".into(),
    }
}

/// The rows of the plan's final models, with accuracies from each batch's `evals/summary.json`.
pub fn rows(plan: &Plan) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for batch in &plan.batches {
        let dir = plan.batch_dir(batch);
        let summary = read_summary(&dir.join("evals").join("summary.json"))?;
        for run in plan.runs.iter().filter(|r| &r.batch == batch) {
            let model = model_name(&dir, &run.published);
            let role = role(run);
            let reference = REFERENCE.iter().find(|r| r.0 == batch && r.1 == role).map(|r| (r.2, r.3, r.4));
            let record = summary.iter().find(|r| r["checkpoint"].as_str() == Some(&model));
            let accuracy = record.and_then(|r| Some((r["id_acc"].as_f64()?, r["ood_acc"].as_f64()?, r["total_acc"].as_f64()?)));
            let samples = record.and_then(|r| Some((r["count_id"].as_u64()?, r["count_ood"].as_u64()?)));
            rows.push(Row { batch: batch.clone(), role, model, accuracy, samples, reference });
        }
    }
    Ok(rows)
}

fn read_summary(path: &Path) -> Result<Vec<Value>> {
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let value: Value = serde_json::from_str(&text).map_err(|e| Error::json(path, None, e))?;
    Ok(value.as_array().cloned().unwrap_or_default())
}

/// Which of ID (0), OOD (1), total (2).
fn pick(a: Accuracy, which: usize) -> f64 {
    [a.0, a.1, a.2][which]
}

/// A model's accuracies and, if known, its ID and OOD sample counts.
type Measured = (Accuracy, Option<(u64, u64)>);

/// One measure of a model: the accuracy and its samples.
fn measure((accuracy, samples): Measured, which: usize) -> (f64, Option<u64>) {
    (pick(accuracy, which), samples.map(|(id, ood)| [id, ood, id + ood][which]))
}

/// The standard error of `a − b` for accuracies over `na` and `nb` samples.
fn standard_error((a, na): (f64, Option<u64>), (b, nb): (f64, Option<u64>)) -> Option<f64> {
    let (na, nb) = (na.filter(|&n| n > 0)?, nb.filter(|&n| n > 0)?);
    Some((a * (1.0 - a) / na as f64 + b * (1.0 - b) / nb as f64).sqrt())
}

/// A claim's verdict on one run: the compared numbers, whether it holds, whether every
/// accuracy is 0, whether the verdict is beyond noise.
type Verdict = (String, bool, bool, Option<bool>);

/// A model: (batch, role).
type Model = (&'static str, &'static str);

/// A claim that in each pair the first model beats the second on one measure.
struct Claim {
    /// Its text; `{11-14}` is an op range of the release ([`render`]).
    claim: &'static str,
    /// ID (0), OOD (1) or total (2).
    which: usize,
    pairs: &'static [(Model, Model)],
}

const CLAIMS: [Claim; 6] = [
    Claim { claim: "050302's base beats 020305's in distribution (op {2-10}: more easy data)", which: 0, pairs: &[(("050302", "pretrain"), ("020305", "pretrain"))] },
    Claim { claim: "RL on op {11-14} raises OOD accuracy over the base (020305)", which: 1, pairs: &[(("020305", "rl op11_14"), ("020305", "pretrain"))] },
    Claim { claim: "RL on op {11-14} raises OOD accuracy over the base (050302)", which: 1, pairs: &[(("050302", "rl op11_14"), ("050302", "pretrain"))] },
    Claim { claim: "RL on op {11-14} raises ID accuracy too (020305)", which: 0, pairs: &[(("020305", "rl op11_14"), ("020305", "pretrain"))] },
    Claim {
        claim: "RL at the edge of competence helps most: OOD accuracy after RL on op {11-14} > {13-20} > {15-20} (020305)",
        which: 1,
        pairs: &[(("020305", "rl op11_14"), ("020305", "rl op13_20")), (("020305", "rl op13_20"), ("020305", "rl op15_20"))],
    },
    Claim {
        claim: "every RL run beats its base in total accuracy (050302)",
        which: 2,
        pairs: &[
            (("050302", "rl op11_14"), ("050302", "pretrain")),
            (("050302", "rl op13_20"), ("050302", "pretrain")),
            (("050302", "rl op15_20"), ("050302", "pretrain")),
        ],
    },
];

/// `template` with each op range `{a-b}` of the release as `map` names it ([`OpMap::range`]).
pub fn render(template: &str, map: Option<&OpMap>) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}').map(|c| open + c) else { break };
        let inner = &rest[open + 1..close];
        let bounds = inner.split_once('-').and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
        out += &rest[..open];
        match bounds {
            Some((lo, hi)) => out += &OpMap::range(map, lo, hi),
            None => out += &rest[open..=close],
        }
        rest = &rest[close + 1..];
    }
    out + rest
}

/// The effects, on the reference's figures and on `rows` (their claims' op ranges as `map` names them).
pub fn effects(rows: &[Row], map: Option<&OpMap>) -> Vec<Effect> {
    let here = |batch: &str, role: &str| -> Option<Measured> {
        rows.iter().find(|r| r.batch == batch && r.role == role).and_then(|r| Some((r.accuracy?, r.samples)))
    };
    let reference = |batch: &str, role: &str| -> Option<Measured> {
        REFERENCE.iter().find(|r| r.0 == batch && r.1 == role).map(|r| ((r.2, r.3, r.4), Some(RELEASE_SAMPLES)))
    };
    let mut out = Vec::new();
    for claim in &CLAIMS {
        let check = |lookup: &dyn Fn(&str, &str) -> Option<Measured>| -> Option<Verdict> {
            let (mut texts, mut holds, mut zero, mut resolved) = (Vec::new(), true, true, Some(true));
            for ((ab, ar), (bb, br)) in claim.pairs {
                let (a, b) = (measure(lookup(ab, ar)?, claim.which), measure(lookup(bb, br)?, claim.which));
                texts.push(format!("{:.3} > {:.3}", a.0, b.0));
                holds &= a.0 > b.0;
                zero &= a.0 == 0.0 && b.0 == 0.0;
                let beyond = standard_error(a, b).map(|se| (a.0 - b.0).abs() > 2.0 * se);
                resolved = resolved.zip(beyond).map(|(r, b)| r && b);
            }
            Some((texts.join(", "), holds, zero, resolved))
        };
        let (reference, in_release, ..) = check(&reference).expect("the reference has every model");
        out.push(effect(render(claim.claim, map), reference, in_release, check(&here)));
    }
    for (batch, teacher) in [("020305", "rl op11_14"), ("050302", "rl op13_20")] {
        let compare = |lookup: &dyn Fn(&str, &str) -> Option<Measured>| -> Option<Verdict> {
            let (opd, teacher) = (measure(lookup(batch, "opd")?, 2), measure(lookup(batch, teacher)?, 2));
            let gap = (opd.0 - teacher.0).abs();
            let resolved = standard_error(opd, teacher).map(|se| (gap - 0.01).abs() > 2.0 * se);
            Some((format!("{:.3} vs {:.3}", opd.0, teacher.0), gap <= 0.01, opd.0 == 0.0 && teacher.0 == 0.0, resolved))
        };
        let claim = if batch == "020305" {
            "OPD matches its teacher's total accuracy within 0.01 (020305, teacher: RL on op {11-14})"
        } else {
            "OPD matches its teacher's total accuracy within 0.01 (050302, teacher: RL on op {13-20})"
        };
        let (reference, in_release, ..) = compare(&reference).expect("the reference has every model");
        out.push(effect(render(claim, map), reference, in_release, compare(&here)));
    }
    out
}

fn effect(claim: String, reference: String, in_release: bool, here: Option<Verdict>) -> Effect {
    let (here, holds, all_zero, resolved) = match here {
        Some((text, holds, zero, resolved)) => (Some(text), Some(holds), zero, resolved),
        None => (None, None, false, None),
    };
    Effect { claim, reference, here, in_release, holds, all_zero, resolved }
}

/// A model's answer accuracy per op (its `total` block) from its `<name>_metrics.json` in the
/// batch's `evals/`; empty where it was not evaluated.
#[cfg(feature = "plot")]
pub fn accuracy_by_op(plan: &Plan, batch: &str, model: &str) -> Result<Vec<(i64, f64)>> {
    let path = plan.batch_dir(batch).join("evals").join(format!("{model}_metrics.json"));
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let value: Value = serde_json::from_str(&text).map_err(|e| Error::json(&path, None, e))?;
    Ok(crate::plot::per_op(&value["total"]["per_op_accuracy"]))
}

/// Per batch, two SVG charts as the paper draws them, next to `summary.md`:
/// `<batch>_accuracy_by_op.svg` (every final model's accuracy by op) and
/// `<batch>_rl_vs_base.svg` (each RL and OPD model's accuracy minus its base's, by op). Returns
/// the markdown that shows them.
#[cfg(feature = "plot")]
fn charts(plan: &Plan, rows: &[Row]) -> Result<String> {
    use crate::plot::{LineChart, Scale, Series, line_chart};
    let mut md = String::new();
    for batch in &plan.batches {
        let mut series = Vec::new();
        for row in rows.iter().filter(|r| &r.batch == batch) {
            let points: Vec<(f64, f64)> = accuracy_by_op(plan, batch, &row.model)?.into_iter().map(|(op, a)| (op as f64, a)).collect();
            if !points.is_empty() {
                series.push(Series { label: row.role.clone(), points });
            }
        }
        let Some(base) = series.iter().find(|s| s.label == "pretrain").cloned() else { continue };
        let id = OpMap::range(plan.ops.as_ref(), 2, 10);
        let title = format!("{batch}: answer accuracy by op (ID = op {id})");
        let by_op = format!("{batch}_accuracy_by_op.svg");
        line_chart(&LineChart { title: &title, x_label: "op", y_label: "accuracy", x_scale: Scale::Linear, y_range: Some((0.0, 1.0)), series: &series }, &plan.root.join(&by_op))?;
        let gains: Vec<Series> = series
            .iter()
            .filter(|s| s.label != "pretrain")
            .map(|s| Series {
                label: format!("{} − base", s.label),
                points: s.points.iter().filter_map(|&(op, a)| base.points.iter().find(|p| p.0 == op).map(|p| (op, a - p.1))).collect(),
            })
            .collect();
        let title = format!("{batch}: accuracy after RL / OPD minus the base's, by op");
        let vs_base = format!("{batch}_rl_vs_base.svg");
        line_chart(&LineChart { title: &title, x_label: "op", y_label: "accuracy − base", x_scale: Scale::Linear, y_range: None, series: &gains }, &plan.root.join(&vs_base))?;
        md += &format!("\n## {batch}\n\n![{batch}: accuracy by op]({by_op})\n\n![{batch}: RL and OPD against the base]({vs_base})\n");
    }
    Ok(md)
}

/// `<root>/summary.csv`: one row per release model, this run's accuracies beside the release's
/// (empty where a model was not evaluated).
fn csv(rows: &[Row]) -> String {
    let f = |a: Option<Accuracy>, which: usize| a.map_or(String::new(), |a| format!("{}", pick(a, which)));
    let mut text = "batch,role,model,id_acc,ood_acc,total_acc,release_id_acc,release_ood_acc,release_total_acc\n".to_owned();
    for r in rows {
        let cells = [r.batch.clone(), r.role.clone(), r.model.clone()]
            .into_iter()
            .chain((0..3).map(|w| f(r.accuracy, w)))
            .chain((0..3).map(|w| f(r.reference, w)))
            .collect::<Vec<_>>();
        text += &(cells.join(",") + "\n");
    }
    text
}

/// Writes `<root>/summary.md`, `summary.csv` and `summary.json`; returns the markdown.
pub fn write(plan: &Plan) -> Result<String> {
    let rows = rows(plan)?;
    let effects = effects(&rows, plan.ops.as_ref());
    let f = |a: Option<Accuracy>, which: usize| a.map_or("—".to_owned(), |a| format!("{:.4}", pick(a, which)));
    let mut md = format!(
        "# Interplay release ({} scale)\n\nFinal models of every run: answer accuracy over all samples (ID = op {}, OOD = op {}), \
         here and in the release (docs/release-layout.md). Written by `kiln release run` from `{}`.\n\n\
         | batch | model | ID | OOD | total | release ID | release OOD | release total |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
        plan.scale,
        OpMap::range(plan.ops.as_ref(), 2, 10),
        OpMap::range(plan.ops.as_ref(), 11, 20),
        plan.config.display()
    );
    for r in &rows {
        md += &format!(
            "| {} | `{}` | {} | {} | {} | {} | {} | {} |\n",
            r.batch,
            r.model,
            f(r.accuracy, 0),
            f(r.accuracy, 1),
            f(r.accuracy, 2),
            f(r.reference, 0),
            f(r.reference, 1),
            f(r.reference, 2)
        );
    }
    md += "\n## The release's effects, on this run\n\n\"Within noise\": some compared difference is within two standard errors of the claim's \
           threshold (binomial over samples; samples of one prompt are correlated, so the noise is larger still).\n\n\
           | effect | release | here | shown here |\n|---|---|---|---|\n";
    for e in &effects {
        let shown = match (e.holds, e.all_zero, e.resolved) {
            (_, true, _) => "no signal (all 0)",
            (None, ..) => "not evaluated",
            (Some(true), false, Some(false)) => "yes, within noise",
            (Some(false), false, Some(false)) => "no, within noise",
            (Some(true), false, _) => "yes",
            (Some(false), false, _) => "no",
        };
        md += &format!("| {} | {} | {} | {shown} |\n", e.claim, e.reference, e.here.as_deref().unwrap_or("—"));
    }
    #[cfg(feature = "plot")]
    {
        md += &charts(plan, &rows)?;
    }
    write_atomic(&plan.root.join("summary.md"), &md)?;
    write_atomic(&plan.root.join("summary.csv"), &csv(&rows))?;
    let json = json!({ "scale": plan.scale, "models": rows, "effects": effects });
    let path = plan.root.join("summary.json");
    let text = serde_json::to_string_pretty(&json).map_err(|e| Error::json(&path, None, e))?;
    write_atomic(&path, &(text + "\n"))?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scale's claims name its op ranges and the release's.
    #[test]
    fn claims_name_the_scaled_ranges() {
        let table = [("2-4", 2), ("5-7", 3), ("8-10", 4), ("11-12", 5), ("13-14", 6), ("15-17", 7), ("18-20", 8)];
        let map = OpMap::parse(&table.iter().map(|(k, v)| (k.to_string(), *v)).collect()).unwrap();
        let scaled = effects(&[], Some(&map));
        assert_eq!(scaled[1].claim, "RL on op 5-6 (release 11-14) raises OOD accuracy over the base (020305)");
        assert_eq!(scaled[4].claim, "RL at the edge of competence helps most: OOD accuracy after RL on op 5-6 (release 11-14) > 6-8 (release 13-20) > 7-8 (release 15-20) (020305)");
        assert_eq!(effects(&[], None)[1].claim, "RL on op 11-14 raises OOD accuracy over the base (020305)");
        assert_eq!(render("{x} and {2-10", None), "{x} and {2-10");
    }

    /// The release's own figures show every effect listed.
    #[test]
    fn every_effect_holds_on_the_release_figures() {
        let rows: Vec<Row> = REFERENCE
            .iter()
            .map(|r| Row {
                batch: r.0.into(),
                role: r.1.into(),
                model: String::new(),
                accuracy: Some((r.2, r.3, r.4)),
                samples: Some(RELEASE_SAMPLES),
                reference: Some((r.2, r.3, r.4)),
            })
            .collect();
        for effect in effects(&rows, None) {
            assert!(effect.in_release, "{effect:?}");
            assert_eq!((effect.holds, effect.all_zero, effect.resolved), (Some(true), false, Some(true)), "{effect:?}");
            assert_eq!(effect.here.as_ref(), Some(&effect.reference));
        }
        // The same accuracies over a mini-sized evaluation (72 ID, 80 OOD samples): the large
        // gaps stay beyond two standard errors, the small ones do not.
        let small: Vec<Row> = rows.iter().map(|r| Row { samples: Some((72, 80)), ..r.clone() }).collect();
        let resolved: Vec<Option<bool>> = effects(&small, None).iter().map(|e| e.resolved).collect();
        // ID 0.659 vs 0.362: a difference of 0.297 against an SE of 0.080; neither step of
        // op11_14 > op13_20 > op15_20 (OOD, 020305: 0.080 against an SE of 0.074, 0.129
        // against 0.065); 050302's op13_20 vs its base in total: 0.1130 against 2 SE = 0.1136;
        // OPD vs teacher, 0.572 vs 0.574: 0.008 from the 0.01 threshold, SE 0.057.
        assert_eq!(resolved, [Some(true), Some(true), Some(true), Some(true), Some(false), Some(false), Some(false), Some(false)]);
        let unknown: Vec<Row> = rows.iter().map(|r| Row { samples: None, ..r.clone() }).collect();
        assert!(effects(&unknown, None).iter().all(|e| e.resolved.is_none()));
        let missing = effects(&rows[..5], None);
        assert_eq!(missing[0].holds, None);
        assert_eq!(missing[1].holds, Some(true));
        let zeros: Vec<Row> = rows.iter().map(|r| Row { accuracy: Some((0.0, 0.0, 0.0)), ..r.clone() }).collect();
        for effect in effects(&zeros, None) {
            assert!(effect.all_zero, "{effect:?}");
        }
        let mut flipped = rows.clone();
        flipped[0].accuracy = Some((0.9, 0.9, 0.9));
        assert_eq!(effects(&flipped, None)[0].holds, Some(false), "020305's base above 050302's");
    }
}
