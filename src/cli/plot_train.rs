//! `kiln plot train`: curves of a training run's `metrics.jsonl` as SVG files.

use kiln::train::metrics::{self as metric, Metric};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use kiln::plot::{LineChart, Scale, Series, line_chart};
use kiln::train::trainer::read_metrics;
use serde_json::Value;

#[derive(Debug, Args)]
pub struct TrainPlotArgs {
    /// A `metrics.jsonl` written by `kiln pretrain`, `kiln sft`, `kiln rl` or `kiln opd`.
    #[arg(long)]
    metrics: PathBuf,
    /// Output directory for the SVG files (default: next to the metrics file); a run's
    /// `<name>_metrics.jsonl` draws `<name>_loss.svg`, …, `metrics.jsonl` draws `loss.svg`, ….
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
    std::fs::create_dir_all(&out).with_context(|| format!("--out {}", out.display()))?;
    // A run's `<name>_metrics.jsonl` (several runs share a directory) draws `<name>_loss.svg`, …
    let file_name = args.metrics.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let prefix = file_name.strip_suffix("metrics.jsonl").filter(|p| p.is_empty() || p.ends_with('_')).unwrap_or("");
    let mut written = Vec::new();
    for (stem, title, y_label, keys) in CHARTS {
        let mut series: Vec<Series> = Vec::new();
        for key in keys.iter() {
            // The trainer writes a NaN or infinite value as null: a gap in the line, and said.
            let mut gaps = Vec::new();
            let points: Vec<(f64, f64)> = records
                .iter()
                .filter_map(|r| {
                    let step = r.get(metric::STEP.key())?.as_f64()?;
                    match r.get(key.key())? {
                        Value::Null => {
                            gaps.push(step);
                            Some((step, f64::NAN))
                        }
                        value => Some((step, value.as_f64()?)),
                    }
                })
                .collect();
            if !gaps.is_empty() {
                let steps = gaps.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ");
                eprintln!("warning: {}: {} is not a finite number at step {steps} (a gap in {prefix}{stem}.svg)", args.metrics.display(), key.key());
            }
            if points.iter().any(|p| p.1.is_finite()) {
                series.push(Series { label: key.key().to_string(), points });
            }
        }
        if series.is_empty() {
            continue;
        }
        let path = out.join(format!("{prefix}{stem}.svg"));
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
