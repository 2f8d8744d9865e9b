//! Line and bar charts written as SVG files, for evaluation results (pass@k curves, per-op
//! accuracy) and training curves (loss, learning rate). Drawn with plotters' SVG backend only:
//! no font or system library is needed, text is left to whatever displays the SVG.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};

/// One named line or set of bars.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    /// `(x, y)` points of a line chart, in drawing order; a y that is not finite (a NaN loss)
    /// is a gap in the line.
    pub points: Vec<(f64, f64)>,
}

/// How the x axis maps values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Linear,
    /// Powers of two evenly spaced (pass@k for k = 1, 2, 4, …); x must be positive.
    Log2,
}

/// A line chart.
#[derive(Debug, Clone)]
pub struct LineChart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub x_scale: Scale,
    /// A fixed y range, or `None` to fit the data.
    pub y_range: Option<(f64, f64)>,
    pub series: &'a [Series],
}

/// A bar chart: one group of bars per category, one bar per series.
#[derive(Debug, Clone)]
pub struct BarChart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub categories: &'a [String],
    /// Per series, a label and one value per category (`None`: no bar).
    pub series: &'a [(String, Vec<Option<f64>>)],
    /// A fixed y range, or `None` to fit the data (and 0).
    pub y_range: Option<(f64, f64)>,
}

/// `{op: value}` of an evaluation's metrics (`per_op_accuracy`) as `(op, value)` sorted by op;
/// keys that are not integers and values that are not numbers are skipped.
pub fn per_op(object: &serde_json::Value) -> Vec<(i64, f64)> {
    let mut values: Vec<(i64, f64)> = object
        .as_object()
        .map(|o| o.iter().filter_map(|(op, v)| Some((op.parse().ok()?, v.as_f64()?))).collect())
        .unwrap_or_default();
    values.sort_by_key(|v| v.0);
    values
}

const SIZE: (u32, u32) = (800, 500);

/// Tableau's ten colours, cycled.
fn color(i: usize) -> RGBColor {
    const PALETTE: [(u8, u8, u8); 10] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
    ];
    let (r, g, b) = PALETTE[i % PALETTE.len()];
    RGBColor(r, g, b)
}

/// The range of `values` padded by 5 %, or `fixed`; never empty.
fn fit(values: impl Iterator<Item = f64>, fixed: Option<(f64, f64)>) -> (f64, f64) {
    if let Some(range) = fixed {
        return range;
    }
    let (lo, hi) = values.filter(|v| v.is_finite()).fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return (0.0, 1.0);
    }
    let pad = if hi > lo { (hi - lo) * 0.05 } else { 0.5 };
    (lo - pad, hi + pad)
}

fn plot_error(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::io(path, std::io::Error::other(e.to_string()))
}

/// Draws `chart` to `path` (an SVG file; its directory is created).
pub fn line_chart(chart: &LineChart, path: &Path) -> Result<()> {
    let map_x = |x: f64| match chart.x_scale {
        Scale::Linear => x,
        Scale::Log2 => x.log2(),
    };
    let all = || chart.series.iter().flat_map(|s| s.points.iter());
    let x_range = fit(all().map(|p| map_x(p.0)), None);
    let x_range = if chart.x_scale == Scale::Log2 { (x_range.0.max(-0.25), x_range.1) } else { x_range };
    let y_range = fit(all().map(|p| p.1), chart.y_range);
    draw(path, |root| {
        let mut ctx = ChartBuilder::on(root)
            .caption(chart.title, ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(x_range.0..x_range.1, y_range.0..y_range.1)?;
        let x_format = |x: &f64| match chart.x_scale {
            Scale::Linear => trim_number(*x),
            Scale::Log2 => trim_number(2f64.powf(*x).round()),
        };
        let mut mesh = ctx.configure_mesh();
        mesh.light_line_style(WHITE)
            .x_desc(chart.x_label)
            .y_desc(chart.y_label)
            .x_label_formatter(&x_format)
            .y_label_formatter(&|y| trim_number(*y));
        if chart.x_scale == Scale::Log2 {
            mesh.x_labels((x_range.1 - x_range.0).ceil() as usize + 1);
        }
        mesh.draw()?;
        for (i, series) in chart.series.iter().enumerate() {
            let style = color(i).stroke_width(2);
            let points: Vec<(f64, f64)> = series.points.iter().map(|&(x, y)| (map_x(x), y)).collect();
            // One line per run of finite values: a gap where a value is not finite.
            let runs: Vec<&[(f64, f64)]> = points.split(|p| !p.1.is_finite()).filter(|run| !run.is_empty()).collect();
            for (r, run) in runs.iter().enumerate() {
                let drawn = ctx.draw_series(LineSeries::new(run.to_vec(), style))?;
                if r == 0 {
                    drawn.label(series.label.as_str()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color(i).stroke_width(2)));
                }
            }
            ctx.draw_series(runs.concat().into_iter().map(|p| Circle::new(p, 3, color(i).filled())))?;
        }
        if chart.series.iter().any(|s| !s.label.is_empty()) {
            ctx.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).position(SeriesLabelPosition::LowerRight).draw()?;
        }
        Ok(())
    })
}

/// Draws `chart` to `path` (an SVG file; its directory is created).
pub fn bar_chart(chart: &BarChart, path: &Path) -> Result<()> {
    let n = chart.categories.len();
    let values = chart.series.iter().flat_map(|(_, v)| v.iter().flatten().copied());
    let y_range = fit(values.chain([0.0]), chart.y_range);
    let groups = chart.series.len().max(1) as f64;
    let width = 0.8 / groups;
    draw(path, |root| {
        let mut ctx = ChartBuilder::on(root)
            .caption(chart.title, ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.5..(n as f64 - 0.5).max(0.5), y_range.0..y_range.1)?;
        let label = |x: &f64| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n { chart.categories[i as usize].clone() } else { String::new() }
        };
        ctx.configure_mesh()
            .disable_x_mesh()
            .light_line_style(WHITE)
            .x_labels(n.max(1))
            .x_label_formatter(&label)
            .y_label_formatter(&|y| trim_number(*y))
            .x_desc(chart.x_label)
            .y_desc(chart.y_label)
            .draw()?;
        for (j, (series_label, values)) in chart.series.iter().enumerate() {
            let left = -0.4 + j as f64 * width;
            let bars = values.iter().enumerate().filter_map(|(i, v)| {
                let v = (*v)?;
                let x0 = i as f64 + left;
                Some(Rectangle::new([(x0, 0f64.max(y_range.0)), (x0 + width * 0.95, v)], color(j).filled()))
            });
            ctx.draw_series(bars)?
                .label(series_label.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color(j).filled()));
        }
        if chart.series.len() > 1 {
            ctx.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).position(SeriesLabelPosition::UpperRight).draw()?;
        }
        Ok(())
    })
}

/// `1`, `0.25`, `1e-05`: a tick label without trailing zeros.
fn trim_number(x: f64) -> String {
    if x != 0.0 && (x.abs() < 1e-3 || x.abs() >= 1e6) {
        return format!("{x:.2e}");
    }
    let text = format!("{x:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" { "0".to_owned() } else { text.to_owned() }
}

type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// Draws the SVG in memory (`body` on its white drawing area), then writes it to `path`
/// atomically: a failed or killed plot leaves the earlier file as it was.
fn draw(path: &Path, body: impl FnOnce(&DrawingArea<SVGBackend, Shift>) -> DrawResult) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_error(path, e))?;
        body(&root).map_err(|e| plot_error(path, e))?;
        root.present().map_err(|e| plot_error(path, e))?;
    }
    crate::io::write_atomic(path, &svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_svg_with_their_labels() {
        let tmp = tempfile::tempdir().unwrap();
        let series = [
            Series { label: "ID".into(), points: vec![(1.0, 0.5), (2.0, 0.7), (4.0, 0.9)] },
            Series { label: "OOD".into(), points: vec![(1.0, 0.1), (2.0, 0.2), (4.0, 0.3)] },
        ];
        let path = tmp.path().join("sub/pass.svg");
        let chart = LineChart { title: "pass@k", x_label: "k", y_label: "pass@k", x_scale: Scale::Log2, y_range: Some((0.0, 1.0)), series: &series };
        line_chart(&chart, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("pass@k") && svg.contains("OOD"));
        assert!(svg.contains(">\n4\n<") || svg.contains(">4<"), "k labels are powers of two");

        let categories: Vec<String> = ["2", "3", "11"].iter().map(|s| s.to_string()).collect();
        let bars = [("ID".to_owned(), vec![Some(0.9), Some(0.8), None]), ("OOD".to_owned(), vec![None, None, Some(0.2)])];
        let path = tmp.path().join("bars.svg");
        let chart = BarChart { title: "accuracy", x_label: "op", y_label: "accuracy", categories: &categories, series: &bars, y_range: None };
        bar_chart(&chart, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.matches("<rect").count() >= 4, "{svg}");
        assert!(svg.contains("11"));
        assert_eq!(trim_number(0.25), "0.25");
        assert_eq!(trim_number(128.0), "128");
    }
}
