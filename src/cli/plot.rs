//! `kiln plot eval`: charts of evaluation results as SVG files (`kiln plot train`: see
//! [`super::plot_train`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use kiln::eval::release::natural_cmp;
use kiln::plot::{BarChart, LineChart, Scale, Series, bar_chart, line_chart, per_op};
use serde_json::Value;

#[derive(Debug, Args)]
pub struct PlotArgs {
    #[command(subcommand)]
    command: PlotCommand,
}

#[derive(Debug, Subcommand)]
enum PlotCommand {
    /// Pass@k curves (answer and, where scored, strict; ID/OOD/total) and per-op accuracy of
    /// every `<model>_metrics.json` in a directory, and the models side by side.
    Eval(EvalPlotArgs),
    /// Loss, learning-rate, accuracy and reward curves of a training run's `metrics.jsonl`.
    Train(super::plot_train::TrainPlotArgs),
}

#[derive(Debug, Args)]
struct EvalPlotArgs {
    /// Directory of `<model>_metrics.json` files (the output of `kiln eval interplay`).
    #[arg(long)]
    metrics: PathBuf,
    /// Output directory for the SVG files (default: the metrics directory).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: PlotArgs) -> Result<()> {
    match args.command {
        PlotCommand::Eval(args) => eval(args),
        PlotCommand::Train(args) => super::plot_train::run(args),
    }
}

/// One model's metrics file, and its strict `results.json` when there is one.
struct Model {
    name: String,
    metrics: Value,
    strict: Option<Value>,
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    serde_json::from_str(&text).with_context(|| path.display().to_string())
}

fn load_models(dir: &Path) -> Result<Vec<Model>> {
    let mut models = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let path = entry.with_context(|| dir.display().to_string())?.path();
        let file = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let Some(name) = file.strip_suffix("_metrics.json") else { continue };
        let results = dir.join(name).join("results.json");
        let strict = if results.is_file() { Some(read_json(&results)?) } else { None };
        models.push(Model { name: name.to_owned(), metrics: read_json(&path)?, strict });
    }
    if models.is_empty() {
        bail!("{}: no *_metrics.json files", dir.display());
    }
    models.sort_by(|a, b| natural_cmp(&a.name, &b.name));
    Ok(models)
}

/// `{"pass@k": v}` as points `(k, v)`, by k.
fn pass_points(object: &Value) -> Vec<(f64, f64)> {
    let mut points: Vec<(f64, f64)> = object
        .as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.strip_prefix("pass@")?.parse().ok()?, v.as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points
}

/// The strict `total_pass_at_k` of the model's ID or OOD generations file.
fn strict_points(model: &Model, subset: &str) -> Option<Vec<(f64, f64)>> {
    let key = format!("{}_{subset}_generations.jsonl.graph_results.jsonl", model.name);
    let total = model.strict.as_ref()?.get("files")?.get(&key)?.get("total")?;
    Some(pass_points(total.get("total_pass_at_k")?)).filter(|p| !p.is_empty())
}

fn pass_chart(title: &str, series: &[Series], path: &Path) -> Result<()> {
    let chart = LineChart { title, x_label: "k", y_label: "pass@k", x_scale: Scale::Log2, y_range: Some((0.0, 1.0)), series };
    Ok(line_chart(&chart, path)?)
}

/// The subsets compared across models, each in `<block>_pass_at_k.svg`, and their labels.
const COMPARISON_BLOCKS: [(&str, &str); 2] = [("id", "ID"), ("ood", "OOD")];

fn eval(args: EvalPlotArgs) -> Result<()> {
    let models = load_models(&args.metrics)?;
    // Two or more models also get one chart per compared subset: a model named after the subset
    // would write its own chart to the same file.
    if models.len() > 1
        && let Some((model, (_, label))) = models.iter().find_map(|m| Some((m, COMPARISON_BLOCKS.iter().find(|(block, _)| *block == m.name)?)))
    {
        bail!(
            "{}: a model named `{name}` would write {name}_pass_at_k.svg over the {label} comparison chart of the same name; rename its files ({name}_metrics.json, {name}/)",
            args.metrics.join(format!("{}_metrics.json", model.name)).display(),
            name = model.name,
        );
    }
    let out = args.out.unwrap_or_else(|| args.metrics.clone());
    let mut written = Vec::new();
    for model in &models {
        let mut series = Vec::new();
        for (block, label) in [("id", "ID"), ("ood", "OOD"), ("total", "total")] {
            let points = pass_points(&model.metrics[block]["pass_at_k"]);
            if !points.is_empty() {
                series.push(Series { label: format!("{label} answer"), points });
            }
        }
        for (subset, label) in [("id", "ID"), ("ood", "OOD")] {
            if let Some(points) = strict_points(model, subset) {
                series.push(Series { label: format!("{label} strict"), points });
            }
        }
        let path = out.join(format!("{}_pass_at_k.svg", model.name));
        pass_chart(&format!("{}: pass@k", model.name), &series, &path)?;
        written.push(path);

        let (id, ood) = (per_op(&model.metrics["id"]["per_op_accuracy"]), per_op(&model.metrics["ood"]["per_op_accuracy"]));
        let mut ops: Vec<i64> = id.iter().chain(&ood).map(|v| v.0).collect();
        ops.sort_unstable();
        ops.dedup();
        let column = |values: &[(i64, f64)]| ops.iter().map(|op| values.iter().find(|v| v.0 == *op).map(|v| v.1)).collect();
        let bars = [("ID".to_owned(), column(&id)), ("OOD".to_owned(), column(&ood))];
        let categories: Vec<String> = ops.iter().map(i64::to_string).collect();
        let path = out.join(format!("{}_per_op_accuracy.svg", model.name));
        let chart = BarChart {
            title: &format!("{}: answer accuracy per op", model.name),
            x_label: "op",
            y_label: "accuracy",
            categories: &categories,
            series: &bars,
            y_range: Some((0.0, 1.0)),
        };
        bar_chart(&chart, &path)?;
        written.push(path);
    }
    if models.len() > 1 {
        for (block, label) in COMPARISON_BLOCKS {
            let series: Vec<Series> = models
                .iter()
                .map(|m| Series { label: m.name.clone(), points: pass_points(&m.metrics[block]["pass_at_k"]) })
                .collect();
            let path = out.join(format!("{block}_pass_at_k.svg"));
            pass_chart(&format!("{label} answer pass@k"), &series, &path)?;
            written.push(path);
        }
        let series: Vec<Series> = models
            .iter()
            .map(|m| {
                let points = per_op(&m.metrics["total"]["per_op_accuracy"]);
                Series { label: m.name.clone(), points: points.into_iter().map(|(op, v)| (op as f64, v)).collect() }
            })
            .collect();
        let chart = LineChart {
            title: "answer accuracy per op",
            x_label: "op",
            y_label: "accuracy",
            x_scale: Scale::Linear,
            y_range: Some((0.0, 1.0)),
            series: &series,
        };
        let path = out.join("per_op_accuracy.svg");
        line_chart(&chart, &path)?;
        written.push(path);
    }
    for path in written {
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
