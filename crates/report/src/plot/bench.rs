//! Throughput against link bandwidth, from `trainer bench --json` lines: tokens/s per GPU
//! (`tokens_per_s / gpus`) against the emulated link between nodes (`emulated_link_gbps`,
//! Gb/s a node, log axis), one line a `techniques` value; the NVLink measurement (`network` =
//! `nccl`, no emulated link) and the sockets one (`nccl sockets`) as horizontal lines of the
//! same colour. The ZeRO++ paper draws this figure for its 100-400 Gb/s clusters; ours comes
//! from `scripts/gpu-multi.sh sweep` (docs/bench.md, "Link-bandwidth sweep").
//!
//! The same numbers print as a Markdown table, with the ratio of each other set of techniques
//! to plain ZeRO-3, for docs to quote. Repeated measurements of one point are averaged.

use std::path::{Path, PathBuf};

use crate::{bail, Context, Result};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Deserialize;

use super::text::Bitmap;
use super::{colour, draw_dotted_line, draw_error, draw_legend, present, register_font};
use crate::readable;

/// The figure's size in pixels.
pub const SIZE: (u32, u32) = (1024, 640);

/// The techniques value of plain ZeRO-3 (`StepReport::techniques`), the ratios' denominator.
const BASELINE: &str = "ZeRO-3";

/// The fields of `crate::bench::StepReport` the figure reads (the others are ignored).
#[derive(Debug, Deserialize)]
struct BenchLine {
    model: String,
    gpus: usize,
    tokens_per_step: usize,
    techniques: String,
    network: String,
    emulated_link_gbps: Option<f64>,
    tokens_per_s: f64,
}

/// How a measurement's bytes travelled.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Network {
    /// NCCL over NVLink (`network` = `nccl`).
    NvLink,
    /// An emulated link of this many Gb/s a node.
    Emulated(f64),
    /// NCCL's socket transport (`nccl sockets`).
    Sockets,
}

impl Network {
    /// The table's first column.
    fn name(&self) -> String {
        match self {
            Network::NvLink => "NVLink".into(),
            Network::Emulated(gbps) => format!("{gbps}"),
            Network::Sockets => "sockets".into(),
        }
    }

    /// Table order: NVLink, then the emulated links from the fastest down, then sockets.
    fn order(&self) -> f64 {
        match self {
            Network::NvLink => f64::NEG_INFINITY,
            Network::Emulated(gbps) => -gbps,
            Network::Sockets => f64::INFINITY,
        }
    }
}

/// One measured point: the mean over its repeats.
#[derive(Debug)]
struct Point {
    technique: String,
    link: Network,
    sum: f64,
    repeats: usize,
}

impl Point {
    fn per_gpu(&self) -> f64 {
        self.sum / self.repeats as f64
    }
}

/// What the bench files hold: one model and batch, its points.
#[derive(Debug)]
struct Sweep {
    /// `model`, `tokens_per_step`, `gpus` of every line.
    model: String,
    tokens_per_step: usize,
    gpus: usize,
    /// Techniques values, plain ZeRO-3 first, then in the order they first appear.
    techniques: Vec<String>,
    points: Vec<Point>,
    lines: usize,
}

impl Sweep {
    fn value(&self, technique: &str, link: Network) -> Option<f64> {
        self.points
            .iter()
            .find(|p| p.technique == technique && p.link == link)
            .map(Point::per_gpu)
    }

    /// Every link measured, in table order.
    fn links(&self) -> Vec<Network> {
        let mut links: Vec<Network> = Vec::new();
        for p in &self.points {
            if !links.contains(&p.link) {
                links.push(p.link);
            }
        }
        links.sort_by(|a, b| a.order().total_cmp(&b.order()));
        links
    }
}

/// Reads every line of every file; an error names the file and the line.
fn read(files: &[PathBuf]) -> Result<Sweep> {
    let mut sweep: Option<Sweep> = None;
    let mut first = String::new();
    for path in files {
        if path.is_dir() {
            bail!(
                "{}: a folder, not a `trainer bench --json` file (loss curves of run folders \
                 are plotted without --bench)",
                path.display()
            );
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read bench file {}", path.display()))?;
        let mut any = false;
        for (i, text) in text.lines().enumerate() {
            if text.trim().is_empty() {
                continue;
            }
            let at = || format!("{} line {}", path.display(), i + 1);
            let line: BenchLine = serde_json::from_str(text)
                .with_context(|| format!("{}: not a `trainer bench --json` line", at()))?;
            let link = match (line.network.as_str(), line.emulated_link_gbps) {
                (_, Some(gbps)) if gbps > 0.0 && gbps.is_finite() => Network::Emulated(gbps),
                ("nccl", None) => Network::NvLink,
                ("nccl sockets", None) => Network::Sockets,
                (network, _) => bail!(
                    "{}: network {network:?} is not a link the figure draws (an emulated link, \
                     \"nccl\" or \"nccl sockets\")",
                    at()
                ),
            };
            if !(line.tokens_per_s.is_finite() && line.tokens_per_s > 0.0) || line.gpus == 0 {
                bail!(
                    "{}: tokens_per_s = {} on {} GPU(s) is not a measurement",
                    at(),
                    line.tokens_per_s,
                    line.gpus
                );
            }
            any = true;
            let s = sweep.get_or_insert_with(|| {
                first = at();
                Sweep {
                    model: line.model.clone(),
                    tokens_per_step: line.tokens_per_step,
                    gpus: line.gpus,
                    techniques: Vec::new(),
                    points: Vec::new(),
                    lines: 0,
                }
            });
            if (&line.model, line.tokens_per_step, line.gpus)
                != (&s.model, s.tokens_per_step, s.gpus)
            {
                bail!(
                    "{}: {} at {} tokens a step on {} GPU(s), but {first} is {} at {} on {}: \
                     plot one model and batch at a time",
                    at(),
                    line.model,
                    line.tokens_per_step,
                    line.gpus,
                    s.model,
                    s.tokens_per_step,
                    s.gpus
                );
            }
            let per_gpu = line.tokens_per_s / line.gpus as f64;
            if !s.techniques.contains(&line.techniques) {
                s.techniques.push(line.techniques.clone());
            }
            match s
                .points
                .iter_mut()
                .find(|p| p.technique == line.techniques && p.link == link)
            {
                Some(p) => {
                    p.sum += per_gpu;
                    p.repeats += 1;
                }
                None => s.points.push(Point {
                    technique: line.techniques,
                    link,
                    sum: per_gpu,
                    repeats: 1,
                }),
            }
            s.lines += 1;
        }
        if !any {
            bail!("{}: holds no `trainer bench --json` line", path.display());
        }
    }
    let mut sweep = sweep.context("plot --bench: name at least one bench file")?;
    // The baseline first, so that its column comes before the ratios' numerators.
    sweep.techniques.sort_by_key(|t| t != BASELINE);
    Ok(sweep)
}

/// The sweep as a Markdown table: a row a link, tokens/s per GPU of each techniques value, and
/// each other value's ratio to ZeRO-3 (when ZeRO-3 was measured); "-" where a point is missing.
fn markdown(s: &Sweep) -> String {
    let has_base = s.techniques.iter().any(|t| t == BASELINE);
    let others: Vec<&String> = s.techniques.iter().filter(|t| *t != BASELINE).collect();
    let ratios: Vec<&String> = if has_base { others.clone() } else { Vec::new() };
    let mut header = vec!["link (Gb/s a node)".to_string()];
    header.extend(s.techniques.iter().map(|t| format!("{t} tokens/s per GPU")));
    header.extend(ratios.iter().map(|t| match ratios.len() {
        1 => "ratio".to_string(),
        _ => format!("ratio {t}"),
    }));
    let row = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
    let mut out = format!(
        "{}, {} tokens a step on {} GPU(s): tokens/s per GPU{}\n\n",
        s.model,
        s.tokens_per_step,
        s.gpus,
        match ratios.len() {
            0 => String::new(),
            1 => format!("; ratio = {} / {BASELINE}", ratios[0]),
            _ => format!("; ratio X = X / {BASELINE}"),
        }
    );
    out += &row(&header);
    out += &row(&vec!["---".to_string(); header.len()]);
    let cell = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("-".to_string(), f);
    for link in s.links() {
        let mut cells = vec![link.name()];
        for t in &s.techniques {
            cells.push(cell(s.value(t, link), &|v| format!("{v:.0}")));
        }
        let base = s.value(BASELINE, link);
        for t in &ratios {
            let ratio = s.value(t, link).zip(base).map(|(v, b)| v / b);
            cells.push(cell(ratio, &|r| format!("{r:.2}")));
        }
        out += &row(&cells);
    }
    out
}

/// What a bench figure shows.
pub struct Drawn {
    pub techniques: usize,
    pub lines: usize,
    /// The figure's numbers as a Markdown table.
    pub table: String,
}

/// A bandwidth on the axis: `400`, `12.5`.
pub fn gbps_label(x: f64) -> String {
    let text = format!("{x:.1}");
    text.strip_suffix(".0").unwrap_or(&text).to_string()
}

/// Draws the bench lines of `files` into the PNG `output`.
pub fn plot(files: &[PathBuf], output: &Path) -> Result<Drawn> {
    let sweep = read(files)?;
    let emulated: Vec<f64> = sweep
        .links()
        .iter()
        .filter_map(|l| match l {
            Network::Emulated(g) => Some(*g),
            _ => None,
        })
        .collect();
    // Log axis a little beyond the rates measured (10 to 1000 Gb/s with none).
    let lo = emulated.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = emulated.iter().copied().fold(0.0, f64::max);
    let (lo, hi, ticks) = if emulated.is_empty() {
        (10.0, 1000.0, vec![10.0, 100.0, 1000.0])
    } else {
        (lo / 1.5, hi * 1.5, emulated.clone())
    };
    let y_max = sweep.points.iter().map(Point::per_gpu).fold(0.0, f64::max) * 1.15;

    register_font()?;
    let draw = draw_error(output);
    let root = Bitmap::new(output, SIZE)?.into_drawing_area();
    root.fill(&WHITE).map_err(&draw)?;
    let caption = format!(
        "{}: tokens/s per GPU against the link ({} tokens a step, {} GPUs)",
        sweep.model,
        readable::count(sweep.tokens_per_step as f64),
        sweep.gpus
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        // Ticks at the rates measured (the log axis's own crowd near the decades).
        .build_cartesian_2d((lo..hi).log_scale().with_key_points(ticks), 0.0..y_max)
        .map_err(&draw)?;
    chart
        .configure_mesh()
        .x_desc("emulated link between nodes (Gb/s a node, log scale)")
        .y_desc("tokens/s per GPU")
        .x_label_formatter(&|x| gbps_label(*x))
        .y_label_formatter(&|y| readable::count(*y))
        .draw()
        .map_err(&draw)?;
    for (i, technique) in sweep.techniques.iter().enumerate() {
        let c = colour(i);
        let mut curve: Vec<(f64, f64)> = emulated
            .iter()
            .filter_map(|&g| Some((g, sweep.value(technique, Network::Emulated(g))?)))
            .collect();
        curve.sort_by(|a, b| a.0.total_cmp(&b.0));
        if !curve.is_empty() {
            let name = format!("{technique}, emulated link");
            draw_dotted_line(&mut chart, &curve, c, (3, 5), name, output)?;
        }
        // NVLink: long dashes, named at the right; sockets: short ones, named at the left.
        for (link, dash, x, h) in [
            (Network::NvLink, (12, 6), hi, HPos::Right),
            (Network::Sockets, (3, 5), lo, HPos::Left),
        ] {
            let Some(v) = sweep.value(technique, link) else {
                continue;
            };
            chart
                .draw_series(DashedLineSeries::new(
                    [(lo, v), (hi, v)],
                    dash.0,
                    dash.1,
                    c.stroke_width(2),
                ))
                .map_err(&draw)?
                .label(format!("{technique}, {}", link.name()))
                .legend(move |(x, y)| {
                    let (on, off) = (dash.0 / 2 + 1, dash.1 / 2 + 1);
                    DashedPathElement::new(vec![(x, y), (x + 24, y)], on, off, c.stroke_width(2))
                });
            let style = ("sans-serif", 15)
                .into_font()
                .color(&c)
                .pos(Pos::new(h, VPos::Bottom));
            chart
                .draw_series(std::iter::once(Text::new(link.name(), (x, v), style)))
                .map_err(&draw)?;
        }
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight, 15, output)?;
    present(&root, output)?;
    Ok(Drawn {
        techniques: sweep.techniques.len(),
        lines: sweep.lines,
        table: markdown(&sweep),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(techniques: &str, network: &str, gbps: Option<f64>, tokens_per_s: f64) -> String {
        serde_json::json!({
            "model": "gpt350m", "gpus": 2, "tokens_per_step": 32768, "techniques": techniques,
            "network": network, "emulated_link_gbps": gbps, "tokens_per_s": tokens_per_s,
            "step_seconds": 1.0,
        })
        .to_string()
    }

    fn write(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        path
    }

    #[test]
    fn plot_bench_table_has_means_ratios_and_link_order() {
        let dir = tempfile::tempdir().unwrap();
        let zpp = "ZeRO-3 + qwZ+qgZ";
        let a = write(
            dir.path(),
            "a.json",
            &[
                line(zpp, "emulated link", Some(12.5), 30000.0),
                line("ZeRO-3", "nccl", None, 100000.0),
                line("ZeRO-3", "emulated link", Some(12.5), 10000.0),
                line(zpp, "nccl", None, 90000.0),
            ],
        );
        let b = write(
            dir.path(),
            "b.json",
            &[
                line("ZeRO-3", "emulated link", Some(100.0), 40000.0),
                line(zpp, "emulated link", Some(100.0), 60000.0),
                // A repeat: averaged with the first ZeRO-3 point at 12.5 Gb/s.
                line("ZeRO-3", "emulated link", Some(12.5), 14000.0),
                line("ZeRO-3", "nccl sockets", None, 20000.0),
            ],
        );
        let sweep = read(&[a, b]).unwrap();
        assert_eq!(sweep.techniques, ["ZeRO-3", zpp]);
        assert_eq!(sweep.lines, 8);
        let table = markdown(&sweep);
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(
            rows,
            [
                "| link (Gb/s a node) | ZeRO-3 tokens/s per GPU | ZeRO-3 + qwZ+qgZ tokens/s per GPU | ratio |",
                "| --- | --- | --- | --- |",
                "| NVLink | 50000 | 45000 | 0.90 |",
                "| 100 | 20000 | 30000 | 1.50 |",
                "| 12.5 | 6000 | 15000 | 2.50 |",
                "| sockets | 10000 | - | - |",
            ]
        );
        assert!(
            table.starts_with("gpt350m, 32768 tokens a step on 2 GPU(s)"),
            "{table}"
        );
    }

    #[test]
    fn plot_bench_refuses_lines_it_cannot_draw() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            (
                r#"{"model":"gpt350m","gpus":2,"tokens_per_step":8,"techniques":"ZeRO-3","network":"nccl"}"#,
                "tokens_per_s",
            ),
            ("not json", "not a `trainer bench --json` line"),
            (&line("ZeRO-3", "one device", None, 1.0), "\"one device\""),
            (&line("ZeRO-3", "nccl", None, 0.0), "not a measurement"),
        ];
        for (text, want) in cases {
            let path = write(
                dir.path(),
                "bad.json",
                &[line("ZeRO-3", "nccl", None, 5.0), text.to_string()],
            );
            let e = read(&[path]).unwrap_err().line();
            assert!(e.contains("bad.json line 2") && e.contains(want), "{e}");
        }
        let other = line("ZeRO-3", "nccl", None, 5.0).replace("gpt350m", "gpt1.3b");
        let path = write(
            dir.path(),
            "mixed.json",
            &[line("ZeRO-3", "nccl", None, 5.0), other],
        );
        let e = read(&[path]).unwrap_err().line();
        assert!(
            e.contains("mixed.json line 2: gpt1.3b") && e.contains("mixed.json line 1 is gpt350m"),
            "{e}"
        );
        let empty = write(dir.path(), "empty.json", &[]);
        let e = read(&[empty]).unwrap_err().line();
        assert!(e.contains("empty.json: holds no"), "{e}");
        let e = read(&[dir.path().to_path_buf()]).unwrap_err().line();
        assert!(e.contains("a folder"), "{e}");
    }

    #[test]
    fn plot_bench_axis_labels() {
        assert_eq!(gbps_label(400.0), "400");
        assert_eq!(gbps_label(12.5), "12.5");
        assert_eq!(Network::Emulated(12.5).name(), "12.5");
        assert_eq!(Network::Emulated(400.0).name(), "400");
    }
}
