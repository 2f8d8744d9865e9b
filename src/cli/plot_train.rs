//! `kiln plot train`: curves of a training run's `metrics.jsonl` as SVG files.

use kiln::train::metrics::{self as metric, Metric};
use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;
use kiln::plot::{LineChart, Scale, Series, line_chart};
use kiln::train::trainer::read_metrics;
use serde_json::Value;

#[derive(Debug, Args)]
pub struct TrainPlotArgs {
    /// A `metrics.jsonl` written by `kiln pretrain`, `kiln sft`, `kiln rl` or `kiln opd`.
    #[arg(long)]
    metrics: PathBuf,
    /// Output directory for the SVG files (default: next to the metrics file).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The charts drawn when their metrics are present: file stem, title, y label, metrics.
const CHARTS: &[(&str, &str, &str, &[Metric])] = &[
    ("loss", "Loss", "loss", &[metric::LOSS, metric::EVAL_LOSS]),
    ("lr", "Learning rate", "lr", &[metric::LR]),
    ("accuracy", "Greedy answer accuracy (held out)", "accuracy", &[metric::EVAL_ACCURACY, metric::VAL_ACCURACY_ID, metric::VAL_ACCURACY_OOD]),
    ("reward", "Reward", "mean reward", &[metric::REWARD_MEAN]),
    ("kl", "KL", "KL", &[metric::KL_REF, metric::TEACHER_KL]),
    ("grad_norm", "Gradient norm (before clipping)", "norm", &[metric::GRAD_NORM]),
];

pub fn run(args: TrainPlotArgs) -> Result<()> {
    let records = read_metrics(&args.metrics)?;
    let out = args.out.unwrap_or_else(|| args.metrics.parent().map(PathBuf::from).unwrap_or_default());
    std::fs::create_dir_all(&out)?;
    let mut written = Vec::new();
    for (stem, title, y_label, keys) in CHARTS {
        let series: Vec<Series> = keys
            .iter()
            .map(|key| Series {
                label: key.key().to_string(),
                points: records
                    .iter()
                    .filter_map(|r| Some((r.get(metric::STEP.key())?.as_f64()?, r.get(key.key()).and_then(Value::as_f64)?)))
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        if series.is_empty() {
            continue;
        }
        let path = out.join(format!("{stem}.svg"));
        let chart = LineChart { title, x_label: "step", y_label, x_scale: Scale::Linear, y_range: None, series: &series };
        line_chart(&chart, &path)?;
        written.push(path);
    }
    if written.is_empty() {
        bail!("{}: no plottable metrics", args.metrics.display());
    }
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}
