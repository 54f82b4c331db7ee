//! `trainer plot`: loss and val_loss against tokens, one colour per run, as a PNG.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use plotters::prelude::*;

use crate::metrics;
use crate::units;

/// DejaVu Sans Mono (Bitstream Vera licence, data/fonts/LICENSE.DejaVu), embedded so plots
/// render the same on a cluster node without fonts.
const FONT: &[u8] = include_bytes!("../../../data/fonts/DejaVuSansMono.ttf");

struct Series {
    label: String,
    train: Vec<(f64, f64)>,
    valid: Vec<(f64, f64)>,
}

/// The label of a run: its folder's name (`runs/abc/metrics.jsonl` -> `abc`).
fn label_of(path: &Path) -> String {
    let stem = if path.file_name().is_some_and(|n| n == "metrics.jsonl") {
        path.parent()
    } else {
        Some(path)
    };
    stem.and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// What a plot shows, for the line that says it was written.
pub struct Drawn {
    pub runs: usize,
    /// The right end of the token axis: the most tokens of any run.
    pub tokens: f64,
    pub loss_min: f64,
    pub loss_max: f64,
}

/// Draws every run of `inputs` into the PNG `output`; the token axis reads 20K, 1.5M, 2.1B.
pub fn plot(inputs: &[PathBuf], output: &Path) -> Result<Drawn> {
    if inputs.is_empty() {
        bail!("plot: name at least one metrics.jsonl");
    }
    let mut runs = Vec::new();
    for path in inputs {
        let lines = metrics::read(path)?;
        let train = lines
            .iter()
            .filter_map(|l| l.loss.map(|v| (l.tokens as f64, v)))
            .collect();
        let valid = lines
            .iter()
            .filter_map(|l| l.val_loss.map(|v| (l.tokens as f64, v)))
            .collect();
        runs.push(Series {
            label: label_of(path),
            train,
            valid,
        });
    }
    let points = || runs.iter().flat_map(|r| r.train.iter().chain(&r.valid));
    if points().next().is_none() {
        bail!("plot: the metrics files hold no loss values");
    }
    let x_max = points().map(|p| p.0).fold(1.0, f64::max);
    let y_min = points().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let y_max = points().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let pad = ((y_max - y_min) * 0.05).max(1e-3);

    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow::anyhow!("plot: the embedded font is invalid"))?;
    let root = BitMapBackend::new(output, (1024, 640)).into_drawing_area();
    let draw = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("plot {}: {e:?}", output.display());
    root.fill(&WHITE).map_err(draw)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("loss (solid) and val_loss (dashed)", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, (y_min - pad)..(y_max + pad))
        .map_err(draw)?;
    chart
        .configure_mesh()
        .x_desc("tokens")
        .y_desc("loss (nats)")
        .x_label_formatter(&|x| units::count(*x))
        .draw()
        .map_err(draw)?;
    for (i, run) in runs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                run.train.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(draw)?
            .label(&run.label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        if !run.valid.is_empty() {
            chart
                .draw_series(DashedLineSeries::new(
                    run.valid.iter().copied(),
                    8,
                    5,
                    color.stroke_width(2),
                ))
                .map_err(draw)?;
            chart
                .draw_series(run.valid.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(draw)?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw)?;
    root.present()
        .with_context(|| format!("cannot write {}", output.display()))?;
    Ok(Drawn {
        runs: runs.len(),
        tokens: x_max,
        loss_min: y_min,
        loss_max: y_max,
    })
}
