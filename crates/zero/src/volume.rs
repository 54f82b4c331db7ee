//! Communication volume per optimizer step, computed from the plan and the unit sizes alone,
//! in the two accountings of docs/design.md section 3.
//!
//! [`logical_step_bytes`] counts what one rank's collectives send, by each collective's
//! meaning (the byte counters of `comm` count the same way, and tests hold them equal):
//! an all-gather sends my part to every peer, a reduce-scatter or all-to-all each chunk to its
//! owner, an all-reduce my whole buffer to every peer. [`paper_volume`] is the paper's: every
//! all-gather or reduce-scatter counts M (the bf16 bytes of the parameters) cross-node.

use comm::ByteCounters;
use model::Pass;

use crate::codec::{peers, GatherSize};
use crate::{GatherSlot, GradReduction, ZeroPlan};

/// Adds `bytes` sent to each of the `intra` and `inter` peers.
fn send(total: &mut ByteCounters, bytes: u64, intra: usize, inter: usize) {
    total.intra += bytes * intra as u64;
    total.inter += bytes * inter as u64;
}

/// The logical bytes one rank sends in optimizer step `step` (1-based) with `micro_batches`
/// forward/backward passes, for units of `unit_numels` elements whose plain (unquantised)
/// gathers move `param_bytes` bytes an element and whose plain reduce-scatter moves the plan's
/// `reduce_dtype` (4 bytes an element in fp32, 2 in bf16).
///
/// The schedule is the engine's: per micro-batch the gathers of `order`, the training walk's
/// gather order ([`model::Model::gather_order`] of [`Pass::Train`], whose first
/// `unit_numels.len()` gathers are the forward pass's: an untied Llama gathers its embedding
/// and its final norm once), issued `plan.prefetch_depth` ahead as the engine issues them, and
/// each unit's gradient reduced once. Which gathers hpZ serves from the node is hpZ's rule,
/// asked at each gather's place in the order as the engine asks it ([`GatherSlot::at`],
/// [`crate::SecondaryPartition::serves`]): in the step's first micro-batch a gather issued
/// before its unit's forward gather was waited (a deep prefetch) comes from the world. Two
/// one-element all-reduces close the step (the loss, the gradient norm).
pub fn logical_step_bytes(
    plan: &ZeroPlan,
    unit_numels: &[usize],
    order: &[usize],
    param_bytes: usize,
    micro_batches: usize,
    step: u64,
) -> ByteCounters {
    let d = plan.topology.ranks_per_node;
    let w = plan.topology.world();
    let train = plan.step_plan(step, Pass::Train);
    let (secondary, weights) = (train.secondary, train.gather.codec());
    let grads = train.reduction.map(GradReduction::codec);
    let padded = |u: usize| plan.partition(unit_numels[u]).padded;
    let forward = &order[..unit_numels.len().min(order.len())];
    let mut total = ByteCounters::default();
    for micro in 0..micro_batches {
        for (position, &u) in order.iter().enumerate() {
            let forward_position = forward.iter().position(|&v| v == u).unwrap_or(position);
            let depth = plan.prefetch_depth;
            let slot = GatherSlot::at(position, forward_position, depth, micro == 0);
            let size = |n, world| GatherSize {
                n,
                param_bytes,
                world,
                linears: plan.linears(u),
            };
            if secondary.serves(slot) {
                let hpz_gather = weights.wire(&size(padded(u) / d, None)).total();
                send(&mut total, hpz_gather, d - 1, 0);
            } else {
                let world_gather = weights.wire(&size(padded(u) / w, Some(w))).total();
                send(&mut total, world_gather, d - 1, w - d);
            }
        }
        // Each hop sends a peer its input over the group's size (qgZ: hop 1 to each local
        // peer its N slices, hop 2 to each other node one slice).
        for u in 0..unit_numels.len() {
            for hop in grads.iter().flat_map(|g| g.hops(padded(u), plan.topology)) {
                let (size, intra, inter) = peers(hop.group, plan.topology);
                send(&mut total, hop.input / size as u64, intra, inter);
            }
        }
    }
    send(&mut total, 2 * 4, d - 1, w - d);
    total
}

/// The bytes each collective of one unit puts on the wire as a whole: the input of the time
/// model of `trainer plan --throughput`, built from the same byte counts as
/// [`logical_step_bytes`] (a rank's logical bytes to each peer are these divided by the
/// group's size: the gathers' by W (world) or D (hpZ), the reduce-scatter's by W, qgZ's hops'
/// by D and N), so the plan's bytes and its times agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitPayload {
    /// Elements of the unit after padding to a multiple of W x align.
    pub padded: usize,
    /// The gathered buffer: the INT8 codes with qwZ, else the plain parameters at their bytes.
    pub gather_data: u64,
    /// qwZ's f32 scales (FP8 qwZ: its tiles' absmax and the unit's norms and biases),
    /// gathered by a second all-gather; 0 without qwZ.
    pub gather_scales: u64,
    /// The bytes the decode after a gather reads and writes (qwZ's INT8 dequantisation); 0
    /// where the layers read what was gathered.
    pub decode: u64,
    /// The gradient that the reduce-scatter reduces, in the plan's `reduce_dtype`.
    pub reduce_scatter: u64,
    /// qgZ hop 1: each rank's whole gradient in INT4 with its scales, its all-to-all input over
    /// the node; 0 without qgZ.
    pub qgz_hop1: u64,
    /// qgZ hop 2: each rank's node sum (padded / D elements) in INT4 with its scales, its
    /// all-to-all input over the nodes; 0 without qgZ.
    pub qgz_hop2: u64,
}

/// The payloads of unit `u` of `numel` elements under `plan` (qgZ as on, whatever the step),
/// with plain gathers at `param_bytes` bytes an element: a world gather's, whose parts are
/// each rank's (hpZ's gathers over the node are timed with the same payload).
pub fn unit_payload(plan: &ZeroPlan, u: usize, numel: usize, param_bytes: usize) -> UnitPayload {
    let padded = plan.partition(numel).padded;
    let gather = plan.step_plan(1, Pass::Train).gather.codec();
    let w = plan.topology.world();
    let size = |n, world| GatherSize {
        n,
        param_bytes,
        world,
        linears: plan.linears(u),
    };
    let part = gather.wire(&size(padded / w, Some(w)));
    let decode = gather.decode_traffic(&size(padded, Some(w)));
    // The run's reductions, qgZ's first where it is on: each its hops' inputs.
    let inputs: Vec<Vec<u64>> = plan
        .grad_reductions()
        .into_iter()
        .map(|r| {
            let hops = r.codec().hops(padded, plan.topology);
            hops.iter().map(|h| h.input).collect()
        })
        .collect();
    let qgz = match plan.qgz {
        Some(_) => &inputs[0][..],
        None => &[],
    };
    let hop = |i: usize| qgz.get(i).copied().unwrap_or(0);
    UnitPayload {
        padded,
        gather_data: part.data * w as u64,
        gather_scales: part.scales * w as u64,
        decode,
        reduce_scatter: inputs.last().map_or(0, |plain| plain.iter().sum()),
        qgz_hop1: hop(0),
        qgz_hop2: hop(1),
    }
}

/// The paper's accounting of one step's cross-node traffic, in bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PaperVolume {
    /// M: the bf16 bytes of the parameters.
    pub model_bytes: f64,
    /// ZeRO-3: forward gather + backward gather + reduce-scatter = 3M.
    pub zero3: f64,
    /// The configured ZeRO++: qwZ gather 0.5M (else M), hpZ backward 0 (else M or 0.5M with
    /// qwZ), qgZ 0.25M (else M), without scales.
    pub zeropp: f64,
    /// The quantisation scales on top of `zeropp`.
    pub scales: f64,
}

pub fn paper_volume(plan: &ZeroPlan, num_params: usize) -> PaperVolume {
    let m = 2.0 * num_params as f64;
    let forward = if plan.qwz.is_some() { 0.5 * m } else { m };
    let backward = if plan.hpz { 0.0 } else { forward };
    let reduce = if plan.qgz.is_some() { 0.25 * m } else { m };
    let mut scales = 0.0;
    if let Some(q) = plan.qwz {
        let gathers = if plan.hpz { 1.0 } else { 2.0 };
        scales += gathers * num_params as f64 / q.block as f64 * 4.0;
    }
    if let Some(q) = plan.qgz {
        scales += num_params as f64 / q.block as f64 * 4.0;
    }
    PaperVolume {
        model_bytes: m,
        zero3: 3.0 * m,
        zeropp: forward + backward + reduce,
        scales,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ZeroConfig;
    use comm::Topology;

    fn plan(cfg: ZeroConfig) -> ZeroPlan {
        ZeroPlan::resolve(&cfg, Topology::new(8, 4).unwrap(), 100).unwrap()
    }

    /// A tied GPT-2's order of `n` units: each gathered for its forward, then the embedding
    /// for the head, then the others for their backward, in reverse.
    fn order(n: usize) -> Vec<usize> {
        (0..n).chain([0]).chain((1..n).rev()).collect()
    }

    /// [`logical_step_bytes`] of `units` gathered twice each, in one micro-batch of step 1.
    fn bytes(plan: &ZeroPlan, units: &[usize], param_bytes: usize) -> ByteCounters {
        logical_step_bytes(plan, units, &order(units.len()), param_bytes, 1, 1)
    }

    #[test]
    fn hpz_alone_moves_two_thirds_of_zero3_across_nodes() {
        let units = [4096 * 8, 1024 * 8];
        let zero3 = bytes(&plan(ZeroConfig::default()), &units, 2);
        let hpz = bytes(
            &plan(ZeroConfig {
                hpz_partition_size: 4,
                ..Default::default()
            }),
            &units,
            4,
        );
        // Gradients reduce in f32 whatever the parameter bytes: compare at 4 bytes.
        let zero3_f32 = bytes(&plan(ZeroConfig::default()), &units, 4);
        assert_eq!(3 * (hpz.inter - 32), 2 * (zero3_f32.inter - 32));
        assert!(zero3.inter < zero3_f32.inter);
    }

    #[test]
    fn a_bf16_reduce_scatter_sends_half_the_bytes() {
        let units = [4096 * 8, 1024 * 8];
        let (fp32, bf16) = (
            plan(ZeroConfig::default()),
            plan(ZeroConfig {
                reduce_dtype: crate::ReduceDtype::Bf16,
                ..Default::default()
            }),
        );
        let (a, b) = (
            unit_payload(&fp32, 0, units[0], 2),
            unit_payload(&bf16, 0, units[0], 2),
        );
        assert_eq!(a.reduce_scatter, 2 * b.reduce_scatter);
        assert_eq!((a.gather_data, a.padded), (b.gather_data, b.padded));
        // Per step: the gathers (2 bytes, twice) are unchanged and the reduction halves, so
        // ZeRO-3's 2 + 2 + 4 bytes an element become 2 + 2 + 2.
        let (a, b) = (bytes(&fp32, &units, 2), bytes(&bf16, &units, 2));
        assert_eq!(3 * (a.inter - 32), 4 * (b.inter - 32));
        assert_eq!(3 * (a.intra - 24), 4 * (b.intra - 24));
    }

    #[test]
    fn paper_accounting_is_three_m_against_three_quarters_m() {
        let p = plan(ZeroConfig {
            quantized_weights: true,
            hpz_partition_size: 4,
            quantized_gradients: true,
            ..Default::default()
        });
        let v = paper_volume(&p, 1000);
        assert_eq!(v.zero3, 6000.0);
        assert_eq!(v.zeropp, 1500.0);
    }
}
