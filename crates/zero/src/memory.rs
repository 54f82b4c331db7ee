//! What one rank holds in memory for the model's states, in bytes, from the plan and the unit
//! sizes alone: the one estimate that the engine reports ([`Engine::memory_estimate`]) and
//! `trainer plan` prints (docs/plan.md gives every row's formula), so the two always agree.
//! Activations depend on the batch and are the plan's to add.
//!
//! [`Engine::memory_estimate`]: crate::Engine::memory_estimate

use candle_core::DType;
use serde::Serialize;

use crate::codec::GatherSize;
use crate::{GradReduction, ZeroPlan, REDUCTIONS_IN_FLIGHT};

/// Bytes one rank holds for the model's states (see [`rank_memory`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RankMemory {
    /// Elements of every unit this rank owns: the sum over units of padded / W.
    pub shard_elems: u64,
    /// The parameter shard at `param_bytes` an element (in 16 bits: the working copy AdamW
    /// writes beside the fp32 master, which the gathers read).
    pub param_shard: u64,
    /// The gradient shard: f32 and padded, or at W = 1 with one micro-batch the units'
    /// gradients as the backward wrote them (`param_bytes` an element, unpadded).
    pub grad_shard: u64,
    /// Whether `grad_shard` is the gradients as the backward wrote them (W = 1, one
    /// micro-batch a step) rather than the f32 shard.
    pub grad_in_place: bool,
    /// Adam m + v, and the fp32 master where the parameters are not fp32.
    pub optimizer_states: u64,
    /// Whether `optimizer_states` holds the fp32 master (parameters in 16 bits).
    pub optimizer_includes_master: bool,
    /// hpZ's secondary partition: padded / D elements of every unit, as INT8 codes plus their
    /// f32 scales with qwZ (FP8 qwZ: a block's codes and its resolved tile absmax, norms and
    /// biases), else at `param_bytes`; 0 without hpZ.
    pub hpz_secondary: u64,
    /// The 1 + `prefetch_depth` largest gathered units (their full padded buffers at
    /// `param_bytes`, and under FP8 qwZ a block's codes and tile scales beside: the gather's
    /// outputs, [`crate::WeightCodec::outputs`]): the unit computing and those prefetched.
    pub gathered_working_set: u64,
    /// The full gradients of the [`REDUCTIONS_IN_FLIGHT`] largest units, held until their
    /// reduction completes: f32 (qgZ's input, or `reduce_dtype` fp32), bf16 with `reduce_dtype`
    /// bf16 and no qgZ; 0 at W = 1 with one micro-batch, where nothing is reduced.
    pub reductions_in_flight: u64,
    /// qgZ's error feedback: f32 of every unit's padded buffer (the first hop's error) and of its
    /// node sum (padded / D, the second's, with D > 1); 0 without it. This rank's own state, kept
    /// for the whole run and in its checkpoint file.
    pub qgz_error_feedback: u64,
}

impl RankMemory {
    /// The sharded states: parameters, gradient and optimizer.
    pub fn sharded_bytes(&self) -> u64 {
        self.param_shard + self.grad_shard + self.optimizer_states
    }

    /// The transient full-unit buffers: gathered units and gradients in reduction.
    pub fn working_bytes(&self) -> u64 {
        self.gathered_working_set + self.reductions_in_flight
    }

    /// Every row.
    pub fn total(&self) -> u64 {
        self.sharded_bytes() + self.hpz_secondary + self.working_bytes() + self.qgz_error_feedback
    }
}

/// The memory of one rank of `plan` for units of `unit_numels` elements whose parameters are
/// gathered and computed at `param_bytes` bytes an element (4: fp32, which is then its own
/// master; 2: bf16 or fp16 beside an fp32 master), with `micro_batches` micro-batches a step.
///
/// At W = 1 with one micro-batch nothing is reduced: each unit's gradient stays as the backward
/// wrote it, unpadded at `param_bytes`, until the optimizer reads it ([`crate::GradShard`]), so
/// the gradient is `param_bytes` an element and no reduction is in flight. Otherwise the
/// gradient is the padded f32 shard, and reductions hold their inputs.
///
/// ```
/// use comm::Topology;
/// use zero::{memory::rank_memory, ZeroConfig, ZeroPlan};
///
/// // Two units of 1024 and 4096 elements on 2 ranks, fp32, plain ZeRO-3.
/// let plan = ZeroPlan::resolve(&ZeroConfig::default(), Topology::new(2, 2)?, 10)?;
/// let m = rank_memory(&plan, &[1024, 4096], 4, 1);
/// assert_eq!(m.shard_elems, 2560);
/// assert_eq!(m.sharded_bytes(), 16 * 2560); // master + m + v + gradient
/// assert_eq!(m.gathered_working_set, 4 * (1024 + 4096));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn rank_memory(
    plan: &ZeroPlan,
    unit_numels: &[usize],
    param_bytes: usize,
    micro_batches: usize,
) -> RankMemory {
    let w = plan.topology.world();
    let in_place = w == 1 && micro_batches <= 1;
    let d = plan.topology.ranks_per_node;
    let padded: Vec<usize> = unit_numels
        .iter()
        .map(|&n| plan.partition(n).padded)
        .collect();
    let shard: u64 = padded.iter().map(|&p| (p / w) as u64).sum();
    let pb = param_bytes as u64;
    let fp32 = param_bytes == 4;
    let gather = plan.step_plan(1, model::Pass::Train).gather.codec();
    let hpz_secondary = if plan.hpz {
        padded
            .iter()
            .enumerate()
            .map(|(u, &p)| {
                gather.kept_bytes(&GatherSize {
                    n: p / d,
                    param_bytes,
                    world: None,
                    linears: plan.linears(u),
                })
            })
            .sum()
    } else {
        0
    };
    let reductions: Vec<_> = plan
        .grad_reductions()
        .into_iter()
        .map(GradReduction::codec)
        .collect();
    // What the codecs keep between steps, in f32: qgZ's error feedback (resolved off at W = 1).
    let qgz_error_feedback = padded
        .iter()
        .flat_map(|&p| {
            reductions
                .iter()
                .flat_map(move |r| r.kept(p, plan.topology))
        })
        .map(|(_, n)| 4 * n as u64)
        .sum();
    // The widest input of the run's reductions: qgZ quantises an f32 gradient, a plain
    // reduce-scatter reads it in `reduce_dtype`.
    let reduce_bytes = reductions
        .iter()
        .map(|r| r.input_bytes() as u64)
        .max()
        .unwrap_or(4);
    // A gathered unit holds what its gather's outputs are (FP8 qwZ: a block's codes and tile
    // scales beside its buffer at `param_bytes`).
    let dtype = if fp32 { DType::F32 } else { DType::BF16 };
    let mut gathered: Vec<u64> = padded
        .iter()
        .enumerate()
        .map(|(u, &p)| {
            let outputs = gather.outputs(p, dtype, plan.linears(u));
            outputs
                .iter()
                .map(|(t, n)| (t.size_in_bytes() * n) as u64)
                .sum()
        })
        .collect();
    gathered.sort_unstable_by(|a, b| b.cmp(a));
    let mut largest = padded;
    largest.sort_unstable_by(|a, b| b.cmp(a));
    let sum_of =
        |n: usize, bytes: u64| -> u64 { largest.iter().take(n).map(|&p| p as u64 * bytes).sum() };
    RankMemory {
        shard_elems: shard,
        param_shard: pb * shard,
        grad_in_place: in_place,
        grad_shard: match in_place {
            true => pb * unit_numels.iter().map(|&n| n as u64).sum::<u64>(),
            false => 4 * shard,
        },
        optimizer_states: if fp32 { 8 * shard } else { 12 * shard },
        optimizer_includes_master: !fp32,
        hpz_secondary,
        gathered_working_set: gathered.iter().take(1 + plan.prefetch_depth).sum(),
        reductions_in_flight: match in_place {
            true => 0,
            false => sum_of(REDUCTIONS_IN_FLIGHT, reduce_bytes),
        },
        qgz_error_feedback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ZeroConfig;
    use comm::Topology;

    fn plan(zero: ZeroConfig, w: usize, d: usize) -> ZeroPlan {
        ZeroPlan::resolve(&zero, Topology::new(w, d).unwrap(), 100).unwrap()
    }

    #[test]
    fn the_largest_unit_is_counted_once() {
        // The embedding (first) is the largest unit: the working set is it plus the next, with
        // one gather prefetched. (Units are padded to MIN_ALIGN: 960, 320, 256.)
        let zero = ZeroConfig {
            prefetch_depth: 1,
            ..Default::default()
        };
        // Two micro-batches: the gradient is the f32 shard, and reductions are in flight.
        let m = rank_memory(&plan(zero, 1, 1), &[960, 320, 256], 2, 2);
        assert_eq!(m.gathered_working_set, 2 * (960 + 320));
        assert_eq!(m.reductions_in_flight, 4 * (960 + 320));
        assert_eq!(m.sharded_bytes(), (2 + 4 + 12) * 1536);
        // Two prefetched: every unit.
        let m = rank_memory(&plan(ZeroConfig::default(), 1, 1), &[960, 320, 256], 2, 2);
        assert_eq!(m.gathered_working_set, 2 * 1536);
    }

    /// At W = 1 with one micro-batch the gradients stay as the backward wrote them (2 bytes an
    /// element in bf16, unpadded) and nothing is in reduction; a second micro-batch or a second
    /// rank brings back the f32 shard and the reductions.
    #[test]
    fn one_rank_and_one_micro_batch_keep_the_gradient_in_place() {
        let units = [1000, 300, 250];
        let m = rank_memory(&plan(ZeroConfig::default(), 1, 1), &units, 2, 1);
        assert_eq!(m.grad_shard, 2 * 1550);
        assert_eq!(m.reductions_in_flight, 0);
        let two = rank_memory(&plan(ZeroConfig::default(), 1, 1), &units, 2, 2);
        assert_eq!(two.grad_shard, 4 * two.shard_elems);
        assert!(two.shard_elems >= 1550 && two.reductions_in_flight > 0);
        let w2 = rank_memory(&plan(ZeroConfig::default(), 2, 2), &units, 2, 1);
        assert_eq!(w2.grad_shard, 4 * w2.shard_elems);
        assert!(w2.reductions_in_flight > 0);
    }

    #[test]
    fn hpz_secondary_counts_the_int8_scales() {
        let zero = ZeroConfig {
            quantized_weights: true,
            hpz_partition_size: 2,
            ..Default::default()
        };
        let p = plan(zero, 4, 2);
        let q = p.qwz.expect("qwZ is on");
        let units = [8 * q.block * 4, 2 * q.block * 4];
        let m = rank_memory(&p, &units, 4, 1);
        let secondary: usize = units.iter().map(|&u| p.partition(u).padded / 2).sum();
        assert_eq!(
            m.hpz_secondary,
            (secondary + secondary / q.block * 4) as u64
        );
    }

    /// Under FP8 qwZ a gathered block holds its codes (a byte an element) and tile scales
    /// beside its buffer; the embedding and the final norm their buffer alone.
    #[test]
    fn fp8_qwz_counts_a_gathered_blocks_codes_and_scales() {
        let cfg = model::ModelConfig::llama(1, 256, 4, 2, 512, 16, 64, false);
        let layout = model::ModelLayout::new(&cfg);
        let zero = ZeroConfig {
            quantized_weights: true,
            prefetch_depth: 0,
            ..Default::default()
        };
        let p = plan(zero, 2, 2).with_linears(model::LinearFormat::Fp8, &layout);
        let numels: Vec<usize> = layout.units.iter().map(|u| u.numel).collect();
        let block = p.partition(layout.units[1].numel).padded;
        assert!(
            numels.iter().all(|&n| p.partition(n).padded <= block),
            "the block is largest"
        );
        let m = rank_memory(&p, &numels, 2, 1);
        let tiles = p.linears(1).tiles;
        assert!(tiles > 0);
        assert_eq!(
            m.gathered_working_set,
            (2 * block + block + 4 * tiles) as u64
        );
    }
}
