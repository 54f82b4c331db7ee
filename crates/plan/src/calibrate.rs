//! `trainer plan --throughput --calibrate FILE`: the compute of a GPU as one GPU measured it,
//! instead of its peak times a fraction. FILE is the `--json` of `trainer bench --profile` at
//! W = 1 (docs/plan.md, "Calibrated from a bench"): each unit's forward and backward and the loss
//! head timed whole on the GPU ([`PhaseTimes`]), and the optimizer's time a step.
//!
//! Scaling: a unit's time is taken as proportional to the tokens of a micro-batch (the cluster's
//! `micro_batch x seq_len` over the bench's), at the same sequence length (attention's share grows
//! with it, so another `seq_len` is refused). A bench with recomputation measured each block's
//! backward with its forward inside; one without it did not: the forward is taken out or added
//! to match the config (with `model.recompute = "attention"`, the attention half's share of its
//! FLOPs). The optimizer's time is per parameter of the shard. The memory-bound
//! kernels of the communication side (qwZ's dequantiser, qgZ's) run at the rate AdamW moved its
//! bytes in the bench.

use std::path::Path;

use anyhow::{bail, Context, Result};
use model::Recompute;
use serde::Deserialize;

use super::calibration_file::PhaseTimes;

/// AdamW's bytes a parameter, with its working copy, and the squares' read of the gradient
/// (the same count as [`super::throughput::predict`]'s optimizer at bf16).
const OPTIMIZER_BYTES: f64 = 32.0 + 2.0;

/// One GPU's measured compute, scaled to a workload's micro-batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    /// Seconds a micro-batch: each unit's forward, its backward (recomputation as the config
    /// says), and the loss head's forward and backward.
    pub forward_s: Vec<f64>,
    pub backward_s: Vec<f64>,
    pub head_s: f64,
    /// Seconds of the optimizer step a parameter of the shard.
    pub optimizer_s_per_param: f64,
    /// GB/s AdamW moved in the bench: the rate of the memory-bound kernels.
    pub mem_bw_gbs: f64,
    /// Adjustments made, for the report's notes.
    pub notes: Vec<String>,
}

/// The part of `trainer bench --json` a calibration reads.
#[derive(Deserialize)]
struct BenchJson {
    phases: Option<PhaseTimes>,
}

/// Reads `path` and scales it to `model` at `micro_batch_tokens` a micro-batch, `recompute` as
/// given.
pub fn load(
    path: &Path,
    model: &model::Model,
    micro_batch_tokens: usize,
    recompute: Recompute,
) -> Result<Calibration> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--calibrate {}: cannot read it", path.display()))?;
    let bench: BenchJson = serde_json::from_str(&text).with_context(|| {
        format!(
            "--calibrate {}: not the --json of trainer bench",
            path.display()
        )
    })?;
    let Some(phases) = bench.phases else {
        bail!(
            "--calibrate {}: no unit times in it; write it with trainer bench --profile --json \
             (train.device = \"cuda\")",
            path.display()
        );
    };
    scale(&phases, model, micro_batch_tokens, recompute)
        .with_context(|| format!("--calibrate {}", path.display()))
}

/// `phases` scaled to `model` at `micro_batch_tokens`, `recompute` (module doc).
pub fn scale(
    phases: &PhaseTimes,
    model: &model::Model,
    micro_batch_tokens: usize,
    recompute: Recompute,
) -> Result<Calibration> {
    let shape: super::calibration_file::ModelShape = model.config().into();
    if phases.model != shape {
        bail!(
            "measured on another model ({:?}) than this config's ({:?})",
            phases.model,
            shape
        );
    }
    // A file from before the format was recorded measured the dense layers.
    let measured = phases.linears.as_deref().unwrap_or("dense");
    if measured != model.linears().key() {
        bail!(
            "measured with the blocks' linear layers in {measured}, this config multiplies them in \
             {}: bench at the config's train.precision",
            model.linears().key()
        );
    }
    if phases.world != 1 {
        bail!(
            "measured at world size {}: a calibration wants W = 1, where no rank shares the GPU \
             or waits for another",
            phases.world
        );
    }
    let units = model.units();
    if phases.units.len() != units.len() {
        bail!(
            "{} units measured, the model has {}",
            phases.units.len(),
            units.len()
        );
    }
    let positive = |what: &str, v: f64| -> Result<f64> {
        match v.is_finite() && v > 0.0 {
            true => Ok(v),
            false => bail!("its {what} is {v}, not a positive time"),
        }
    };
    positive("head_seconds", phases.head_seconds)?;
    positive("optimizer_seconds", phases.optimizer_seconds)?;
    if phases.micro_batch_tokens == 0 || phases.optimizer_params == 0 {
        bail!("its micro-batch or optimizer parameters are 0");
    }
    let r = micro_batch_tokens as f64 / phases.micro_batch_tokens as f64;
    let mut notes = Vec::new();
    if phases.micro_batch_tokens != micro_batch_tokens {
        notes.push(format!(
            "--calibrate: measured at {} tokens a micro-batch, scaled by {r:.3} to {}; kernels \
             are less efficient on fewer tokens, so a bench at the config's micro-batch predicts \
             better",
            phases.micro_batch_tokens, micro_batch_tokens
        ));
    }
    let (mut forward_s, mut backward_s) = (Vec::new(), Vec::new());
    for (u, (m, unit)) in phases.units.iter().zip(units).enumerate() {
        let f = m.forward_seconds;
        if !(f.is_finite() && f >= 0.0) {
            bail!("unit {u}'s forward_seconds is {f}");
        }
        let mut b = positive(&format!("unit {u}'s backward_seconds"), m.backward_seconds)?;
        if matches!(unit.kind, model::UnitKind::Block(_)) {
            // The forward's share each mode runs again, out of the measured and into the asked.
            let again = |mode| recomputed_share(model, mode);
            b = (b - f * again(phases.recompute)).max(0.0) + f * again(recompute);
        }
        forward_s.push(f * r);
        backward_s.push(b * r);
    }
    if phases.recompute != recompute {
        notes.push(format!(
            "--calibrate: measured with model.recompute = {}, this config has {}: each block's \
             backward time was moved by the share of its forward time that each reruns",
            phases.recompute.key(),
            recompute.key()
        ));
    }
    let per_param = phases.optimizer_seconds / phases.optimizer_params as f64;
    Ok(Calibration {
        forward_s,
        backward_s,
        head_s: phases.head_seconds * r,
        optimizer_s_per_param: per_param,
        mem_bw_gbs: OPTIMIZER_BYTES / per_param / 1e9,
        notes,
    })
}

/// The share of a block's forward time that its backward runs again under `mode`: the share of
/// its forward FLOPs (`throughput::recomputed_flops_split`): 0, all of it, or the attention
/// half's.
fn recomputed_share(model: &model::Model, mode: Recompute) -> f64 {
    let Some(u) = (0..model.units().len())
        .find(|&u| matches!(model.units()[u].kind, model::UnitKind::Block(_)))
    else {
        return 0.0;
    };
    let (linear, rest) = super::throughput::forward_flops_split(model, u);
    let (again_linear, again_rest) = super::throughput::recomputed_flops_split(model, u, mode);
    (again_linear + again_rest) / (linear + rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration_file::{ModelShape, UnitTime};

    fn tiny() -> model::Model {
        model::Model::new(model::ModelConfig::gpt2(3, 64, 4, 16, 100)).unwrap()
    }

    fn phases(m: &model::Model, recompute: Recompute) -> PhaseTimes {
        PhaseTimes {
            model: ModelShape::from(m.config()),
            micro_batch_tokens: 64,
            recompute,
            linears: Some("dense".into()),
            world: 1,
            optimizer_params: 1000,
            optimizer_seconds: 1e-3,
            shard_pass_seconds: 0.0,
            units: m
                .units()
                .iter()
                .enumerate()
                .map(|(u, _)| UnitTime {
                    unit: u,
                    kind: "block".into(),
                    forward_seconds: 1.0 + u as f64,
                    backward_seconds: 10.0 + u as f64,
                })
                .collect(),
            head_seconds: 0.5,
        }
    }

    #[test]
    fn times_scale_with_the_tokens_of_a_micro_batch() {
        let m = tiny();
        let c = scale(&phases(&m, Recompute::Off), &m, 128, Recompute::Off).unwrap();
        for (u, (f, b)) in c.forward_s.iter().zip(&c.backward_s).enumerate() {
            assert_eq!(*f, 2.0 * (1.0 + u as f64));
            assert_eq!(*b, 2.0 * (10.0 + u as f64));
        }
        assert_eq!(c.head_s, 1.0);
        assert_eq!(c.optimizer_s_per_param, 1e-6);
        // 34 bytes a parameter in a microsecond: 34 MB/s.
        assert!((c.mem_bw_gbs - 0.034).abs() < 1e-12);
        assert_eq!(c.notes.len(), 1, "the scaling is noted: {:?}", c.notes);
    }

    #[test]
    fn recomputation_adds_or_removes_a_blocks_forward() {
        let m = tiny();
        let blocks: Vec<usize> = (0..m.units().len())
            .filter(|&u| matches!(m.units()[u].kind, model::UnitKind::Block(_)))
            .collect();
        assert!(!blocks.is_empty());
        let with = scale(&phases(&m, Recompute::Off), &m, 64, Recompute::Full).unwrap();
        let without = scale(&phases(&m, Recompute::Full), &m, 64, Recompute::Off).unwrap();
        for u in 0..m.units().len() {
            let (f, b) = (1.0 + u as f64, 10.0 + u as f64);
            let block = blocks.contains(&u);
            assert_eq!(with.backward_s[u], if block { b + f } else { b });
            assert_eq!(without.backward_s[u], if block { b - f } else { b });
        }
    }

    /// The attention half's recomputation moves a Llama block's backward by its share of the
    /// forward: q|k|v's projection and the attention, out of the whole block's.
    #[test]
    fn the_attention_half_moves_a_share_of_the_forward() {
        let m =
            model::Model::new(model::ModelConfig::llama(3, 64, 4, 2, 192, 16, 100, true)).unwrap();
        let share = recomputed_share(&m, Recompute::Attention);
        let (c, t) = (64.0, 16.0);
        let expected = (2.0 * c * (4.0 + 2.0 * 2.0) * 16.0 + 2.0 * t * c)
            / (2.0 * m.units()[1].numel as f64 + 2.0 * t * c);
        assert!((share - expected).abs() < 1e-12 && share > 0.0 && share < 0.5);
        let half = scale(&phases(&m, Recompute::Full), &m, 64, Recompute::Attention).unwrap();
        let (f, b) = (2.0, 11.0); // block 1's times in phases()
        assert!((half.backward_s[1] - (b - f + f * share)).abs() < 1e-12);
    }

    #[test]
    fn another_model_or_world_is_refused() {
        let m = tiny();
        let mut p = phases(&m, Recompute::Off);
        p.model.n_layer += 1;
        let e = scale(&p, &m, 64, Recompute::Off).unwrap_err().to_string();
        assert!(e.contains("another model"), "{e}");
        let mut p = phases(&m, Recompute::Off);
        p.world = 2;
        let e = scale(&p, &m, 64, Recompute::Off).unwrap_err().to_string();
        assert!(e.contains("W = 1"), "{e}");
        let mut p = phases(&m, Recompute::Off);
        p.units[0].backward_seconds = f64::NAN;
        assert!(scale(&p, &m, 64, Recompute::Off).is_err());
    }

    /// A bench of the dense layers does not calibrate an FP8 plan, nor one of FP8 a dense plan;
    /// a file that predates the record measured the dense layers.
    #[test]
    fn another_linear_format_is_refused() {
        let m = tiny();
        let fp8 = tiny().with_linears(model::LinearFormat::Fp8);
        let e = scale(&phases(&m, Recompute::Off), &fp8, 64, Recompute::Off)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("in dense, this config multiplies them in fp8"),
            "{e}"
        );
        let mut p = phases(&m, Recompute::Off);
        p.linears = Some("fp8".into());
        assert!(scale(&p, &fp8, 64, Recompute::Off).is_ok());
        let e = scale(&p, &m, 64, Recompute::Off).unwrap_err().to_string();
        assert!(
            e.contains("in fp8, this config multiplies them in dense"),
            "{e}"
        );
        let mut old: serde_json::Value = serde_json::to_value(phases(&m, Recompute::Off)).unwrap();
        old.as_object_mut().unwrap().remove("linears");
        let old: PhaseTimes = serde_json::from_value(old).unwrap();
        assert_eq!(old.linears, None);
        assert!(scale(&old, &m, 64, Recompute::Off).is_ok());
        assert!(scale(&old, &fp8, 64, Recompute::Off).is_err());
    }
}
