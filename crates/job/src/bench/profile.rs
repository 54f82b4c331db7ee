//! `trainer bench --profile`: the step's GPU time by kernel family, and each unit's forward and
//! backward timed whole (the [`PhaseTimes`] that `trainer plan --calibrate` scales to a cluster,
//! in the format `plan` owns).

use std::collections::BTreeMap;

use kernels::profile::{Family, Phase, ShapeTime};
use serde::Serialize;

use plan::calibration_file::{PhaseTimes, UnitTime};

/// One row of the `--profile` table.
#[derive(Debug, Serialize)]
pub struct FamilyTime {
    pub family: &'static str,
    /// Mean seconds per step.
    pub seconds: f64,
}

/// One GEMM shape's row of the `--profile` table of GEMMs ([`kernels::profile::take_shapes`]).
#[derive(Debug, Serialize)]
pub struct GemmTime {
    /// Its shape as `model::gemm` names it: `m n k`, the transposes, the dtypes, the epilogue.
    pub gemm: String,
    /// Mean seconds and calls per step.
    pub seconds: f64,
    pub calls: f64,
    /// FLOPs over seconds, in TFLOP/s.
    pub tflops: f64,
}

/// The GEMMs' times by shape summed over the timed steps.
#[derive(Default)]
pub struct ShapeSums(BTreeMap<String, ShapeTime>);

impl ShapeSums {
    pub fn add(&mut self, shapes: Vec<(String, ShapeTime)>) {
        for (name, t) in shapes {
            let e = self.0.entry(name).or_default();
            e.seconds += t.seconds;
            e.flops += t.flops;
            e.calls += t.calls;
        }
    }

    /// Per step over `steps`, the slowest first.
    pub fn rows(self, steps: f64) -> Vec<GemmTime> {
        let mut rows: Vec<GemmTime> = self
            .0
            .into_iter()
            .map(|(gemm, t)| GemmTime {
                gemm,
                seconds: t.seconds / steps,
                calls: t.calls as f64 / steps,
                tflops: t.flops / t.seconds.max(1e-12) / 1e12,
            })
            .collect();
        rows.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        rows
    }
}

/// Phase seconds summed over the timed micro-batches.
#[derive(Default)]
pub struct PhaseSums(BTreeMap<Phase, f64>);

impl PhaseSums {
    pub fn add(&mut self, phases: &[(Phase, f64)]) {
        for (p, s) in phases {
            *self.0.entry(*p).or_default() += s;
        }
    }

    /// The sums over `micro_batches` micro-batches as [`PhaseTimes`], with the step's family
    /// times `families` (summed over `steps`).
    #[allow(clippy::too_many_arguments)]
    pub fn times(
        &self,
        model: &model::Model,
        micro_batch_tokens: usize,
        recompute: model::Recompute,
        world: usize,
        optimizer_params: usize,
        families: &[(Family, f64)],
        steps: f64,
        micro_batches: f64,
    ) -> PhaseTimes {
        let get = |p| self.0.get(&p).copied().unwrap_or(0.0) / micro_batches;
        let family = |f| {
            families
                .iter()
                .find(|(g, _)| *g == f)
                .map_or(0.0, |(_, s)| s / steps)
        };
        PhaseTimes {
            model: model.config().into(),
            micro_batch_tokens,
            recompute,
            linears: Some(model.linears().key().to_string()),
            world,
            optimizer_params,
            optimizer_seconds: family(Family::Optimizer),
            shard_pass_seconds: family(Family::ShardPasses),
            units: model
                .units()
                .iter()
                .enumerate()
                .map(|(u, unit)| UnitTime {
                    unit: u,
                    kind: match unit.kind {
                        model::UnitKind::Embedding => "embedding",
                        model::UnitKind::Block(_) => "block",
                        model::UnitKind::FinalNorm => "final_norm",
                    }
                    .to_string(),
                    forward_seconds: get(Phase::Forward(u)),
                    backward_seconds: get(Phase::Backward(u)),
                })
                .collect(),
            head_seconds: get(Phase::Head),
        }
    }
}

/// How many GEMM shapes the table prints (`--json` has them all).
const GEMM_ROWS: usize = 24;

/// The `--profile` table: milliseconds per step and share of the step by family, then the time
/// no family's span covered (host gaps, candle's own ops outside any span); then the phases.
pub fn print(
    families: &[FamilyTime],
    gemms: &[GemmTime],
    phases: Option<&PhaseTimes>,
    step_seconds: f64,
) {
    println!("GPU time by kernel family (rank 0, CUDA events, per step):");
    let mut covered = 0.0;
    for f in families {
        covered += f.seconds;
        println!(
            "  {:<16} {:>9.2} ms {:>6.1}%",
            f.family,
            f.seconds * 1e3,
            100.0 * f.seconds / step_seconds
        );
    }
    let rest = step_seconds - covered;
    println!(
        "  {:<16} {:>9.2} ms {:>6.1}%",
        "not in a span",
        rest * 1e3,
        100.0 * rest / step_seconds
    );
    if !gemms.is_empty() {
        println!("GEMMs by shape (rank 0, per step, the slowest first; m n k column-major):");
        for g in gemms.iter().take(GEMM_ROWS) {
            println!(
                "  {:>8.2} ms {:>6.1} calls {:>6.0} TFLOP/s  {}",
                g.seconds * 1e3,
                g.calls,
                g.tflops,
                g.gemm
            );
        }
    }
    let Some(p) = phases else { return };
    let sum = |kind: &str, f: fn(&UnitTime) -> f64| -> (usize, f64) {
        let of: Vec<_> = p.units.iter().filter(|u| u.kind == kind).collect();
        (of.len(), of.iter().map(|u| f(u)).sum())
    };
    println!(
        "units per micro-batch of {} tokens (rank 0, forward / backward):",
        p.micro_batch_tokens
    );
    for kind in ["embedding", "block", "final_norm"] {
        let (n, fwd) = sum(kind, |u| u.forward_seconds);
        let (_, bwd) = sum(kind, |u| u.backward_seconds);
        if n > 0 {
            println!(
                "  {:<16} {:>9.2} / {:.2} ms ({n} of them)",
                kind,
                fwd * 1e3,
                bwd * 1e3
            );
        }
    }
    println!("  {:<16} {:>9.2} ms", "loss head", p.head_seconds * 1e3);
}
