//! `trainer plan --sweep inter-gbps=12.5,25,...,800 --output FILE.png`: the throughput model
//! ([`super::throughput`]) run at each value of one cluster setting, its tokens/s per GPU for
//! the five variants (ZeRO-3, qwZ, hpZ, qgZ, ZeRO++) as a table, in the JSON (`sweep`), and as a
//! PNG drawn as `trainer plot --bench` draws measured sweeps (log axis of the link, one line a
//! variant), so the two figures read alike.
//!
//! Only `inter-gbps` is swept today: the link between nodes is what ZeRO++ is for. Another
//! variable is one more [`SweepVar`] and the line of [`SweepVar::apply`] that sets it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use serde::Serialize;
use zero::ZeroConfig;

use super::throughput::{throughput, Cluster, Throughput, Workload, VARIANTS};
use report::plot::{self, Bitmap};
use report::readable;

/// The figure's size in pixels: smaller than `plot --bench`'s (its legend is one column of
/// five), so that the PNG in docs/ stays under 100 KB.
const SIZE: (u32, u32) = (880, 520);

/// A cluster setting `--sweep` can vary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepVar {
    /// `--inter-gbps`: Gb/s a node sends to the others.
    InterGbps,
}

impl SweepVar {
    /// The names `--sweep` takes, as the flag is spelled.
    const NAMES: [(&'static str, SweepVar); 1] = [("inter-gbps", SweepVar::InterGbps)];

    pub fn name(self) -> &'static str {
        match self {
            SweepVar::InterGbps => "inter-gbps",
        }
    }

    /// `c` with this setting at `value`.
    fn apply(self, c: &Cluster, value: f64) -> Cluster {
        let mut c = *c;
        match self {
            SweepVar::InterGbps => c.network.inter_gbps = value,
        }
        c
    }
}

/// `--sweep` and `--output` as parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepArgs {
    pub var: SweepVar,
    /// Positive, finite, ascending, no repeats.
    pub values: Vec<f64>,
    /// The PNG to draw.
    pub output: PathBuf,
}

impl SweepArgs {
    /// Parses `VAR=V1,V2,...`; `output` is `--output`, which a sweep needs (it draws).
    pub fn parse(text: &str, output: Option<PathBuf>) -> Result<SweepArgs> {
        let names = || SweepVar::NAMES.map(|(n, _)| n).join(", ");
        let (name, list) = text.split_once('=').with_context(|| {
            format!("--sweep {text}: expected VAR=V1,V2,... (VAR: {})", names())
        })?;
        let var = SweepVar::NAMES
            .iter()
            .find(|(n, _)| *n == name.trim())
            .map(|&(_, v)| v)
            .with_context(|| format!("--sweep: unknown variable {name:?} (one of {})", names()))?;
        let mut values = Vec::new();
        for v in list.split(',') {
            let x: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|x: &f64| x.is_finite() && *x > 0.0)
                .with_context(|| format!("--sweep {name}: {v:?} is not a positive number"))?;
            values.push(x);
        }
        values.sort_by(f64::total_cmp);
        values.dedup();
        let output = output.with_context(|| {
            format!("--sweep {name} draws a figure: name its PNG with --output FILE.png")
        })?;
        if !output
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("png"))
        {
            bail!(
                "--output {}: the figure is a PNG (FILE.png)",
                output.display()
            );
        }
        Ok(SweepArgs {
            var,
            values,
            output,
        })
    }
}

/// One variant's numbers along the sweep.
#[derive(Debug, Serialize)]
pub struct SweepLine {
    pub name: &'static str,
    /// Predicted tokens/s per GPU at each value.
    pub tokens_per_s_per_gpu: Vec<f64>,
    /// ZeRO-3's step over this variant's, at each value.
    pub speedup: Vec<f64>,
}

/// The `sweep` section of the report.
#[derive(Debug, Serialize)]
pub struct Sweep {
    /// The setting varied, as its flag is spelled (`"inter-gbps"`).
    pub variable: &'static str,
    pub values: Vec<f64>,
    /// The five variants, in the throughput table's order.
    pub lines: Vec<SweepLine>,
    /// The PNG drawn.
    #[serde(skip)]
    pub output: PathBuf,
}

/// The predictions of `work` under the variants of `base` at each value of `args` on `c`.
pub fn sweep(
    args: &SweepArgs,
    work: &Workload,
    base: &ZeroConfig,
    steps: u64,
    c: &Cluster,
) -> zero::Result<Sweep> {
    let runs = args
        .values
        .iter()
        .map(|&v| throughput(work, base, steps, &args.var.apply(c, v)))
        .collect::<zero::Result<Vec<Throughput>>>()?;
    let lines = (0..VARIANTS.len())
        .map(|i| SweepLine {
            name: VARIANTS[i].0,
            tokens_per_s_per_gpu: runs
                .iter()
                .map(|t| t.variants()[i].1.tokens_per_s_per_gpu)
                .collect(),
            speedup: runs.iter().map(|t| t.variants()[i].1.speedup).collect(),
        })
        .collect();
    Ok(Sweep {
        variable: args.var.name(),
        values: args.values.clone(),
        lines,
        output: args.output.clone(),
    })
}

/// The sweep as an aligned table: one row a value, tokens/s per GPU of each variant and
/// ZeRO++'s speedup.
pub fn table(s: &Sweep) -> String {
    let mut o = format!(
        "\nsweep, predicted tokens/s per GPU against --{}\n",
        s.variable
    );
    o += &format!("  {:>10}", s.variable);
    for l in &s.lines {
        o += &format!("{:>10}", l.name);
    }
    o += &format!("{:>15}\n", "ZeRO++/ZeRO-3");
    let last = s.lines.len() - 1;
    for (i, v) in s.values.iter().enumerate() {
        o += &format!("  {:>10}", plot::gbps_label(*v));
        for l in &s.lines {
            o += &format!("{:>10.1}", l.tokens_per_s_per_gpu[i]);
        }
        o += &format!("{:>14.2}x\n", s.lines[last].speedup[i]);
    }
    o
}

/// Draws `s` into its PNG: tokens/s per GPU against the swept setting (log axis), one line a
/// variant, ZeRO-3 and ZeRO++ thicker.
pub fn draw(s: &Sweep, title: &str) -> Result<()> {
    let output: &Path = &s.output;
    let (lo, hi) = (s.values[0], s.values[s.values.len() - 1]);
    let (lo, hi) = if lo == hi {
        (lo / 2.0, hi * 2.0)
    } else {
        (lo / 1.3, hi * 1.3)
    };
    let y_max = s
        .lines
        .iter()
        .flat_map(|l| l.tokens_per_s_per_gpu.iter().copied())
        .fold(0.0, f64::max)
        * 1.15;
    plot::register_font()?;
    let draw = plot::draw_error(output);
    let root = Bitmap::new(output, SIZE)?.into_drawing_area();
    root.fill(&WHITE).map_err(&draw)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (lo..hi).log_scale().with_key_points(s.values.clone()),
            0.0..y_max.max(1.0),
        )
        .map_err(&draw)?;
    chart
        .configure_mesh()
        .x_desc(format!(
            "--{} (Gb/s a node to the others, log scale)",
            s.variable
        ))
        .y_desc("predicted tokens/s per GPU")
        .x_label_formatter(&|x| plot::gbps_label(*x))
        .y_label_formatter(&|y| readable::count(*y))
        .draw()
        .map_err(&draw)?;
    let last = s.lines.len() - 1;
    for (i, l) in s.lines.iter().enumerate() {
        let c = plot::colour(i);
        let width = if i == 0 || i == last { 3 } else { 1 };
        let curve: Vec<(f64, f64)> = s
            .values
            .iter()
            .copied()
            .zip(l.tokens_per_s_per_gpu.iter().copied())
            .collect();
        plot::draw_dotted_line(&mut chart, &curve, c, (width, 4), l.name, output)?;
    }
    plot::draw_legend(&mut chart, SeriesLabelPosition::LowerRight, 15, output)?;
    plot::present(&root, output)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm::Topology;
    use model::{Model, ModelConfig, Recompute};

    use crate::throughput::{gpu, Network};

    #[test]
    fn parse_errors_are_one_line() {
        let png = || Some(PathBuf::from("s.png"));
        let ok = SweepArgs::parse("inter-gbps=800,12.5,100,100", png()).unwrap();
        assert_eq!(ok.var, SweepVar::InterGbps);
        assert_eq!(ok.values, vec![12.5, 100.0, 800.0]);
        for (text, output, says) in [
            ("intra-gbps=1,2", png(), "unknown variable \"intra-gbps\""),
            ("inter-gbps=100,0", png(), "\"0\" is not a positive number"),
            (
                "inter-gbps=100,-5",
                png(),
                "\"-5\" is not a positive number",
            ),
            (
                "inter-gbps=fast",
                png(),
                "\"fast\" is not a positive number",
            ),
            ("inter-gbps", png(), "expected VAR=V1,V2"),
            ("inter-gbps=100", None, "--output FILE.png"),
            ("inter-gbps=100", Some("s.jpg".into()), "is a PNG"),
        ] {
            let e = format!("{:#}", SweepArgs::parse(text, output).unwrap_err());
            assert!(e.contains(says) && !e.contains('\n'), "{text}: {e}");
        }
    }

    /// GPT-2 350M-like at 4 nodes x 8 on V100s: every variant gains (or keeps) tokens/s as the
    /// link between nodes gets faster, and ZeRO++ leads ZeRO-3 most on the slowest link.
    #[test]
    fn tokens_per_gpu_do_not_fall_as_the_link_grows() {
        let model = Model::new(ModelConfig::gpt2(8, 1024, 16, 1024, 50304)).unwrap();
        let work = Workload::bf16(&model, 2, 2, Recompute::Full);
        let v100 = gpu("v100").unwrap();
        let c = Cluster {
            gpu: v100,
            mfu_fraction: 0.5,
            network: Network {
                intra_gbps: v100.nvlink_gbps,
                inter_gbps: 100.0,
                latency_us: 5.0,
            },
            topology: Topology::new(32, 8).unwrap(),
            ranks_per_gpu: 1,
            overlap: true,
        };
        let args = SweepArgs::parse(
            "inter-gbps=12.5,25,50,100,200,400,800,1600",
            Some("unused.png".into()),
        )
        .unwrap();
        let s = sweep(&args, &work, &ZeroConfig::default(), 100, &c).unwrap();
        assert_eq!(s.lines.len(), 5);
        for l in &s.lines {
            for w in l.tokens_per_s_per_gpu.windows(2) {
                assert!(w[1] >= w[0], "{}: {:?}", l.name, l.tokens_per_s_per_gpu);
            }
        }
        let zeropp = &s.lines[4].speedup;
        assert!(
            zeropp[0] > 1.5 && zeropp[0] >= zeropp[zeropp.len() - 1],
            "{zeropp:?}"
        );
        let t = table(&s);
        assert!(t.contains("12.5") && t.contains("ZeRO++/ZeRO-3"), "{t}");
    }
}
