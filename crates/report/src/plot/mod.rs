//! `trainer plot`: the trainer's figures, as PNGs drawn with the embedded font.
//!
//! - Loss curves ([`loss`]): validation and training loss of one or more runs against tokens,
//!   one colour a run, each named by its ZeRO settings ([`label`]), with an optional zoom on the
//!   end of training where ablation runs differ by tenths of a percent.
//! - Throughput against link bandwidth ([`bench`]): tokens/s per GPU of `trainer bench --json`
//!   lines against the emulated link between nodes, one line a set of techniques, with the
//!   NVLink and sockets measurements as horizontal lines (the ZeRO++ paper's figure of
//!   throughput over bandwidth), and its numbers as a Markdown table on stdout.

mod bench;
mod label;
mod loss;
mod text;

// The figure toolkit `trainer plan --sweep` draws with too, so its figure reads like
// `plot --bench`'s.
pub use bench::gbps_label;
pub use label::ZeroSettings;
pub use text::Bitmap;

use std::path::{Path, PathBuf};

use crate::{bail, Result};
use plotters::chart::SeriesAnno;
use plotters::coord::CoordTranslate;
use plotters::prelude::*;

use crate::readable;

/// DejaVu Sans Mono (Bitstream Vera licence, data/fonts/LICENSE.DejaVu), embedded so plots
/// render the same on a cluster node without fonts.
const FONT: &[u8] = include_bytes!("../../../../data/fonts/DejaVuSansMono.ttf");

/// One colour a run or technique: the first eight of matplotlib's `tab10`, whose neighbours
/// differ in hue and lightness (a legend of five runs stays readable in grey too).
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// The colour of series `i`.
pub fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

/// Makes the embedded font the one plotters draws "sans-serif" with.
pub fn register_font() -> Result<()> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| crate::ReportError::Invalid("plot: the embedded font is invalid".into()))
}

/// A drawing error of plotters, naming the output.
pub fn draw_error<E: std::fmt::Debug>(output: &Path) -> impl Fn(E) -> crate::ReportError + '_ {
    move |e| crate::ReportError::Invalid(format!("plot {}: {e:?}", output.display()))
}

/// Draws `points` as a line `width` pixels wide with a dot of radius `dot` at each point, and
/// names it `name` in the legend by its key ([`line_and_dot_key`]): how every figure draws a
/// measured or predicted line.
pub fn draw_dotted_line<'a, CT>(
    chart: &mut ChartContext<'a, Bitmap<'a>, CT>,
    points: &[(f64, f64)],
    c: RGBColor,
    (width, dot): (u32, u32),
    name: impl Into<String>,
    output: &Path,
) -> Result<()>
where
    CT: CoordTranslate<From = (f64, f64)>,
{
    let draw = draw_error(output);
    let series = chart
        .draw_series(LineSeries::new(
            points.iter().copied(),
            c.stroke_width(width),
        ))
        .map_err(&draw)?
        .label(name);
    line_and_dot_key(series, c, width);
    chart
        .draw_series(points.iter().map(|&p| Circle::new(p, dot, c.filled())))
        .map_err(&draw)?;
    Ok(())
}

/// Gives `series` the legend key of a line with dots: a 24-pixel stroke `width` wide with a dot
/// in its middle.
pub fn line_and_dot_key<'a>(series: &mut SeriesAnno<'a, Bitmap<'a>>, c: RGBColor, width: u32) {
    series.legend(move |(x, y)| {
        EmptyElement::at((x, y))
            + PathElement::new(vec![(0, 0), (24, 0)], c.stroke_width(width))
            + Circle::new((12, 0), 4, c.filled())
    });
}

/// Draws the legend box (at `position`, in `font_size` points, white and framed), as every
/// figure does.
pub fn draw_legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, Bitmap<'a>, CT>,
    position: SeriesLabelPosition,
    font_size: u32,
    output: &Path,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font(("sans-serif", font_size))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(draw_error(output))
}

/// Writes the figure drawn on `root` to `output`.
pub fn present<CT: CoordTranslate>(
    root: &DrawingArea<Bitmap<'_>, CT>,
    output: &Path,
) -> Result<()> {
    root.present()
        .map_err(|e| crate::ReportError::Invalid(format!("cannot write {}: {e}", output.display())))
}

/// What `trainer plot` was asked to draw (its command line).
pub struct PlotArgs {
    /// metrics.jsonl files or run folders holding one.
    pub metrics: Vec<PathBuf>,
    /// `trainer bench --json` files (`--bench`).
    pub bench: Vec<PathBuf>,
    pub output: PathBuf,
    /// `--label`, one per metrics input.
    pub labels: Vec<String>,
    /// `--smooth N`: training loss averaged over N steps (default [`loss::DEFAULT_SMOOTH`]).
    pub smooth: Option<u64>,
    /// `--zoom F`: a second panel on the last F of the token axis.
    pub zoom: Option<f64>,
}

/// Draws the figure `args` asks for and says what it drew on stderr; with `--bench`, prints the
/// figure's numbers as a Markdown table on stdout.
pub fn run(args: &PlotArgs) -> Result<()> {
    if !args.bench.is_empty() {
        if let Some(first) = args.metrics.first() {
            bail!(
                "plot: {} is a metrics input, and --bench draws `trainer bench --json` files: \
                 plot loss curves and bench lines in separate calls",
                first.display()
            );
        }
        if !args.labels.is_empty() || args.smooth.is_some() || args.zoom.is_some() {
            bail!("plot --bench: --label, --smooth and --zoom are options of loss plots");
        }
        let drawn = bench::plot(&args.bench, &args.output)?;
        print!("{}", drawn.table);
        eprintln!(
            "wrote {}: {} technique set(s) from {} bench line(s)",
            args.output.display(),
            drawn.techniques,
            drawn.lines
        );
        return Ok(());
    }
    if args.metrics.is_empty() {
        bail!("plot: name at least one metrics.jsonl or run folder, or --bench FILE.json");
    }
    let inputs: Vec<PathBuf> = args
        .metrics
        .iter()
        .map(|p| {
            if p.is_dir() {
                p.join("metrics.jsonl")
            } else {
                p.clone()
            }
        })
        .collect();
    let options = loss::LossOptions {
        smooth: args.smooth.unwrap_or(loss::DEFAULT_SMOOTH),
        zoom: args.zoom,
    };
    options.check()?;
    let labels = label::for_inputs(&inputs, &args.labels)?;
    let drawn = loss::plot(&inputs, &labels, &args.output, &options)?;
    eprintln!(
        "wrote {}: {} run(s) over {} tokens, loss {:.2} to {:.2}; legend: {}",
        args.output.display(),
        drawn.runs,
        readable::count(drawn.tokens),
        drawn.loss_min,
        drawn.loss_max,
        labels.join(", ")
    );
    Ok(())
}
