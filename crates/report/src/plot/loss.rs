//! Loss curves against tokens: for each run (one colour), the validation loss as a thick line
//! with a dot at each evaluation, and the training loss as a thin, lighter line, a trailing
//! moving average over `--smooth` steps. With `--zoom F`, a second panel to the right
//! shows the last F of the token axis with its y range fitted to the validation losses there,
//! so that runs 0.1% apart are told apart.

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::{bail, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::text::Bitmap;
use super::{colour, draw_error, draw_legend, line_and_dot_key, present, register_font};
use crate::{metrics, readable};

/// `--smooth`'s default, in steps: it takes the step-to-step noise of a small batch off a curve
/// logged every step and lags it by 10 steps; at the configs' `log.interval = 10` it averages
/// two lines.
pub const DEFAULT_SMOOTH: u64 = 20;

/// The figure's size in pixels without `--zoom`.
pub const SIZE: (u32, u32) = (1024, 640);

/// The width `--zoom`'s panel adds to the right of [`SIZE`].
pub const ZOOM_WIDTH: u32 = 576;

/// The loss plot's options.
pub struct LossOptions {
    /// Training loss averaged over this many steps (1 = as logged).
    pub smooth: u64,
    /// The share of the token axis, at its end, that the zoom panel shows.
    pub zoom: Option<f64>,
}

impl LossOptions {
    pub fn check(&self) -> Result<()> {
        if self.smooth == 0 {
            bail!("plot: --smooth 0: average over at least 1 step (1 = as logged)");
        }
        if let Some(f) = self.zoom {
            if !(f > 0.0 && f <= 1.0) {
                bail!("plot: --zoom {f}: give the share of the token axis to zoom on, in (0, 1]");
            }
        }
        Ok(())
    }
}

/// What a plot shows, for the line that says it was written.
pub struct Drawn {
    pub runs: usize,
    /// The right end of the token axis: the most tokens of any run.
    pub tokens: f64,
    /// The lowest and highest loss logged (training or validation, before smoothing).
    pub loss_min: f64,
    pub loss_max: f64,
}

/// One run's curves as drawn: (tokens, loss).
struct Series {
    label: String,
    /// Smoothed training loss.
    train: Vec<(f64, f64)>,
    valid: Vec<(f64, f64)>,
}

/// The trailing mean over `steps` steps of training points (step, tokens, loss) in step order:
/// at each point, the mean loss of the points whose step is in (step - steps, step], drawn at
/// the point's tokens.
fn moving_average(points: &[(u64, f64, f64)], steps: u64) -> Vec<(f64, f64)> {
    let (mut first, mut sum) = (0, 0.0);
    points
        .iter()
        .enumerate()
        .map(|(i, &(step, tokens, loss))| {
            sum += loss;
            while points[first].0 + steps <= step {
                sum -= points[first].2;
                first += 1;
            }
            (tokens, sum / (i + 1 - first) as f64)
        })
        .collect()
}

/// Segment `a`-`b` cut to the rectangle `x` x `y` (Liang-Barsky): the parameters `t0 <= t1` in
/// [0, 1] of its part inside, or `None`.
fn clip_segment(
    a: (f64, f64),
    b: (f64, f64),
    x: &Range<f64>,
    y: &Range<f64>,
) -> Option<(f64, f64)> {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let (mut t0, mut t1) = (0.0f64, 1.0f64);
    for (p, q) in [
        (-dx, a.0 - x.start),
        (dx, x.end - a.0),
        (-dy, a.1 - y.start),
        (dy, y.end - a.1),
    ] {
        if p == 0.0 {
            if q < 0.0 {
                return None;
            }
            continue;
        }
        let r = q / p;
        if p < 0.0 {
            t0 = t0.max(r);
        } else {
            t1 = t1.min(r);
        }
        if t0 > t1 {
            return None;
        }
    }
    Some((t0, t1))
}

/// The pieces of the polyline `points` inside the rectangle `x` x `y`, ending where they cross
/// its border. Plotters clamps a point outside the chart onto its edge, so without this a
/// training curve above the zoom panel's range would be drawn along the panel's top.
fn clip(points: &[(f64, f64)], x: &Range<f64>, y: &Range<f64>) -> Vec<Vec<(f64, f64)>> {
    let inside = |p: &(f64, f64)| x.contains(&p.0) || p.0 == x.end;
    let inside = |p: &(f64, f64)| inside(p) && (y.contains(&p.1) || p.1 == y.end);
    if points.len() == 1 {
        return points
            .iter()
            .filter(|p| inside(p))
            .map(|p| vec![*p])
            .collect();
    }
    let mut pieces = Vec::new();
    let mut piece: Vec<(f64, f64)> = Vec::new();
    let at = |a: (f64, f64), b: (f64, f64), t: f64| (a.0 + t * (b.0 - a.0), a.1 + t * (b.1 - a.1));
    for w in points.windows(2) {
        let (a, b) = (w[0], w[1]);
        let Some((t0, t1)) = clip_segment(a, b, x, y) else {
            if !piece.is_empty() {
                pieces.push(std::mem::take(&mut piece));
            }
            continue;
        };
        // Exact end points where the segment is not cut, so that pieces join.
        if t0 > 0.0 || piece.is_empty() {
            if !piece.is_empty() {
                pieces.push(std::mem::take(&mut piece));
            }
            piece.push(if t0 > 0.0 { at(a, b, t0) } else { a });
        }
        piece.push(if t1 < 1.0 { at(a, b, t1) } else { b });
        if t1 < 1.0 {
            pieces.push(std::mem::take(&mut piece));
        }
    }
    if !piece.is_empty() {
        pieces.push(piece);
    }
    pieces
}

/// Decimals that tell apart the ticks of an axis spanning `span`: about 8 ticks a panel.
fn decimals(span: f64) -> usize {
    if span.is_nan() || span <= 0.0 {
        return 2;
    }
    (-(span / 8.0).log10()).ceil().clamp(0.0, 6.0) as usize
}

/// `range` widened by `share` of its span on each side, and by at least `least`.
fn padded(range: Range<f64>, share: f64, least: f64) -> Range<f64> {
    let pad = ((range.end - range.start) * share).max(least);
    (range.start - pad)..(range.end + pad)
}

/// The smallest range holding every `y`, or `None` for no points.
fn y_range<'a>(points: impl Iterator<Item = &'a (f64, f64)>) -> Option<Range<f64>> {
    points.fold(None, |r: Option<Range<f64>>, p| match r {
        None => Some(p.1..p.1),
        Some(r) => Some(r.start.min(p.1)..r.end.max(p.1)),
    })
}

/// One panel of the figure.
#[derive(Debug)]
struct Panel {
    caption: String,
    x: Range<f64>,
    y: Range<f64>,
    /// The legend goes in the full panel only; the zoom panel's colours are the same.
    legend: bool,
    /// Draw the training curves (the zoom panel fitted to validation losses leaves them out:
    /// their step-to-step noise is larger than the differences it is there to show).
    train: bool,
    /// Shade the token axis from here to the end (the zoom panel's window).
    shade_from: Option<f64>,
}

/// Draws every run of `inputs` (metrics files, named by `labels`) into the PNG `output`; the
/// token axis reads 20K, 1.5M, 2.1B.
pub fn plot(
    inputs: &[PathBuf],
    labels: &[String],
    output: &Path,
    options: &LossOptions,
) -> Result<Drawn> {
    if inputs.is_empty() {
        bail!("plot: name at least one metrics.jsonl");
    }
    let mut runs = Vec::new();
    let (mut x_max, mut loss_min, mut loss_max) = (1.0f64, f64::INFINITY, f64::NEG_INFINITY);
    for (path, label) in inputs.iter().zip(labels) {
        let lines = metrics::read(path)?;
        let train: Vec<(u64, f64, f64)> = lines
            .iter()
            .filter_map(|l| l.loss.map(|v| (l.step, l.tokens as f64, v)))
            .collect();
        let valid: Vec<(f64, f64)> = lines
            .iter()
            .filter_map(|l| l.val_loss.map(|v| (l.tokens as f64, v)))
            .collect();
        let logged = train
            .iter()
            .map(|&(_, x, y)| (x, y))
            .chain(valid.iter().copied());
        for (x, y) in logged {
            x_max = x_max.max(x);
            loss_min = loss_min.min(y);
            loss_max = loss_max.max(y);
        }
        runs.push(Series {
            label: label.clone(),
            train: moving_average(&train, options.smooth),
            valid,
        });
    }
    let drawn = || runs.iter().flat_map(|r| r.train.iter().chain(&r.valid));
    let Some(y) = y_range(drawn()) else {
        bail!("plot: the metrics files hold no loss values");
    };
    let training = match options.smooth {
        1 => "training loss (thin)".to_string(),
        n => format!("training loss (thin, mean of {n} steps)"),
    };
    let full = Panel {
        caption: format!("validation loss (thick, dots) and {training}"),
        x: 0.0..x_max,
        y: padded(y, 0.05, 1e-3),
        legend: true,
        train: true,
        shade_from: None,
    };
    let zoom = match options.zoom {
        None => None,
        Some(f) => Some(zoom_panel(&runs, f, x_max)?),
    };

    register_font()?;
    let width = SIZE.0 + zoom.as_ref().map_or(0, |_| ZOOM_WIDTH);
    let root = Bitmap::new(output, (width, SIZE.1))?.into_drawing_area();
    root.fill(&WHITE).map_err(draw_error(output))?;
    match &zoom {
        None => draw_panel(&root, &runs, &full, output)?,
        Some(zoom) => {
            let (left, right) = root.split_horizontally(SIZE.0);
            let full = Panel {
                shade_from: Some(zoom.x.start),
                ..full
            };
            draw_panel(&left, &runs, &full, output)?;
            draw_panel(&right, &runs, zoom, output)?;
        }
    }
    present(&root, output)?;
    Ok(Drawn {
        runs: runs.len(),
        tokens: x_max,
        loss_min,
        loss_max,
    })
}

/// The zoom panel on the last `share` of the token axis: its y range fits the validation losses
/// in that window (the training curves where no run evaluated there).
fn zoom_panel(runs: &[Series], share: f64, x_max: f64) -> Result<Panel> {
    let x = (x_max * (1.0 - share))..x_max;
    let within = |p: &&(f64, f64)| p.0 >= x.start;
    let valid = y_range(runs.iter().flat_map(|r| r.valid.iter().filter(within)));
    let train = || y_range(runs.iter().flat_map(|r| r.train.iter().filter(within)));
    let (y, fitted, train_drawn) = match valid {
        Some(y) => (y, "validation loss", false),
        None => match train() {
            Some(y) => (y, "training loss", true),
            None => {
                bail!("plot: --zoom {share}: no loss was logged in the last {share} of the tokens")
            }
        },
    };
    // At least 0.01% of the loss on either side: one point, or runs that agree exactly.
    let least = 1e-4 * y.end.abs().max(1e-2);
    let percent = format!("{:.1}", 100.0 * share);
    Ok(Panel {
        caption: format!(
            "last {}% of tokens: {fitted}",
            percent.strip_suffix(".0").unwrap_or(&percent)
        ),
        x,
        y: padded(y, 0.1, least),
        legend: false,
        train: train_drawn,
        shade_from: None,
    })
}

/// Draws `runs` into `area` as `panel` says.
fn draw_panel(
    area: &DrawingArea<Bitmap<'_>, Shift>,
    runs: &[Series],
    panel: &Panel,
    output: &Path,
) -> Result<()> {
    let draw = draw_error(output);
    let places = decimals(panel.y.end - panel.y.start);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.caption, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(panel.x.clone(), panel.y.clone())
        .map_err(&draw)?;
    chart
        .configure_mesh()
        .x_desc("tokens")
        .y_desc("loss (nats)")
        .x_label_formatter(&|x| readable::count(*x))
        .y_label_formatter(&|y| format!("{y:.places$}"))
        .draw()
        .map_err(&draw)?;
    if let Some(from) = panel.shade_from {
        let corners = [(from, panel.y.start), (panel.x.end, panel.y.end)];
        chart
            .draw_series(std::iter::once(Rectangle::new(
                corners,
                BLACK.mix(0.06).filled(),
            )))
            .map_err(&draw)?;
    }
    for (i, run) in runs.iter().enumerate() {
        let c = colour(i);
        let train = if panel.train { &run.train[..] } else { &[] };
        for piece in clip(train, &panel.x, &panel.y) {
            chart
                .draw_series(LineSeries::new(piece, c.mix(0.45).stroke_width(1)))
                .map_err(&draw)?;
        }
        for piece in clip(&run.valid, &panel.x, &panel.y) {
            chart
                .draw_series(LineSeries::new(piece, c.stroke_width(3)))
                .map_err(&draw)?;
        }
        let inside = |p: &&(f64, f64)| {
            panel.x.start <= p.0 && p.0 <= panel.x.end && panel.y.start <= p.1 && p.1 <= panel.y.end
        };
        chart
            .draw_series(
                run.valid
                    .iter()
                    .filter(inside)
                    .map(|&p| Circle::new(p, 4, c.filled())),
            )
            .map_err(&draw)?;
        if panel.legend {
            // An empty series carries the run's legend entry: its validation style, or the
            // training line's for a run that never evaluated.
            let anno = chart
                .draw_series(LineSeries::new(std::iter::empty(), c.stroke_width(3)))
                .map_err(&draw)?
                .label(&run.label);
            if run.valid.is_empty() {
                anno.legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], c.mix(0.45).stroke_width(1))
                });
            } else {
                line_and_dot_key(anno, c, 3);
            }
        }
    }
    if panel.legend {
        draw_legend(&mut chart, SeriesLabelPosition::MiddleRight, 16, output)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_smoothing_is_a_trailing_mean() {
        // Logged every step: a two-step window averages pairs.
        let points = [
            (1, 10.0, 4.0),
            (2, 20.0, 2.0),
            (3, 30.0, 6.0),
            (4, 40.0, 0.0),
        ];
        assert_eq!(
            moving_average(&points, 2),
            [(10.0, 4.0), (20.0, 3.0), (30.0, 4.0), (40.0, 3.0)]
        );
        let raw: Vec<(f64, f64)> = points.iter().map(|p| (p.1, p.2)).collect();
        assert_eq!(moving_average(&points, 1), raw);
        assert_eq!(moving_average(&points, 10)[3], (40.0, 3.0));
        // Logged every 10 steps: a 10-step window is each line alone, 20 steps two lines.
        let sparse = [(10, 1.0, 4.0), (20, 2.0, 2.0), (30, 3.0, 6.0)];
        assert_eq!(moving_average(&sparse, 10)[1], (2.0, 2.0));
        assert_eq!(moving_average(&sparse, 20)[2], (3.0, 4.0));
    }

    #[test]
    fn plot_clipping_cuts_curves_at_the_panel_border() {
        let (x, y) = (0.0..10.0, 0.0..1.0);
        // Inside, out through the top, back in: two pieces, cut where they cross y = 1.
        let points = [(0.0, 0.5), (2.0, 0.5), (4.0, 1.5), (6.0, 0.5), (8.0, 0.5)];
        let pieces = clip(&points, &x, &y);
        assert_eq!(pieces.len(), 2, "{pieces:?}");
        assert_eq!(pieces[0], [(0.0, 0.5), (2.0, 0.5), (3.0, 1.0)]);
        assert_eq!(pieces[1], [(5.0, 1.0), (6.0, 0.5), (8.0, 0.5)]);
        // Starting left of the window: cut where it enters.
        assert_eq!(
            clip(&[(-2.0, 0.2), (2.0, 0.6)], &x, &y),
            [[(0.0, 0.4), (2.0, 0.6)]]
        );
        assert!(clip(&[(-2.0, 2.0), (-1.0, 3.0)], &x, &y).is_empty());
        assert_eq!(clip(&[(1.0, 0.5)], &x, &y), [[(1.0, 0.5)]]);
    }

    #[test]
    fn plot_zoom_fits_the_validation_losses_in_its_window() {
        let run = |d: f64| Series {
            label: String::new(),
            train: vec![(0.0, 10.0), (100.0, 3.5)],
            valid: vec![
                (0.0, 10.8),
                (50.0, 3.3 + d),
                (80.0, 3.1 + d),
                (100.0, 3.000 + d),
            ],
        };
        let panel = zoom_panel(&[run(0.0), run(0.003)], 0.3, 100.0).unwrap();
        assert_eq!(panel.x, 70.0..100.0);
        // 3.000 to 3.103, padded by a tenth: a 0.1% gap is 2.5% of the panel's height.
        assert!(
            (panel.y.start - (3.0 - 0.0103)).abs() < 1e-9,
            "{:?}",
            panel.y
        );
        assert!(
            (panel.y.end - (3.103 + 0.0103)).abs() < 1e-9,
            "{:?}",
            panel.y
        );
        assert!(decimals(panel.y.end - panel.y.start) >= 2);
        assert_eq!(panel.caption, "last 30% of tokens: validation loss");
        assert!(!panel.train);
        // Where no run evaluated, the training curves are drawn and fitted.
        let late = Series {
            label: String::new(),
            train: vec![(0.0, 10.0), (100.0, 3.5)],
            valid: vec![(0.0, 10.8)],
        };
        let panel = zoom_panel(&[late], 0.5, 100.0).unwrap();
        assert!(panel.train && panel.caption.ends_with("training loss"));
        let e = zoom_panel(&[run(0.0)], 0.1, 1000.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--zoom 0.1"), "{e}");
    }

    #[test]
    fn plot_options_are_checked() {
        let ok = LossOptions {
            smooth: 1,
            zoom: Some(1.0),
        };
        assert!(ok.check().is_ok());
        for (smooth, zoom) in [
            (0, None),
            (5, Some(0.0)),
            (5, Some(1.5)),
            (5, Some(f64::NAN)),
        ] {
            assert!(LossOptions { smooth, zoom }.check().is_err());
        }
    }
}
