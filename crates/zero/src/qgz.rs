//! qgZ's reduction of one unit's gradient inside a reduction job ([`crate::reduce`]):
//! quantised 2-hop all-to-all, with or without error feedback.
//!
//! docs/design.md section 3. World W = N nodes x D ranks, slice p of the gradient is owned by
//! rank p. The gradient is quantised with its slices swizzled (p to position (p % D) x N + p / D)
//! so that the D chunks of N slices are contiguous; hop 1 is an all-to-all over my node (local
//! rank d receives, from each local peer, the slices {n' x D + d}); the D pieces are dequantised,
//! summed in f32 and requantised in one fused pass; hop 2 is an all-to-all over the ranks with
//! my local index (slice n' x D + d goes to node n'); the N pieces are dequantised and summed.
//! With one rank a node (D = 1) hop 1 has nothing to exchange or sum and is left out; with one
//! node, hop 2 exchanges nothing. The two hops of a unit follow each other on the one
//! communication stream; the hops of consecutive units do too (they could overlap only on
//! separate streams per group).
//!
//! Error feedback (`zero.qgz_error_feedback`, [`QgzError`]): each rank keeps, for every unit (in
//! its [`crate::codec::GradState`], by [`crate::codec::Int4TwoHop`]),
//! what its two quantisers dropped the last time: `hop1` (the padded gradient's length, in the
//! swizzled order) and `hop2` (its node sum's, P / D, with D > 1). Before quantising, the
//! rank adds the kept error to what it quantises, and keeps the new difference between the
//! compensated values and their dequantised INT4 (classic error feedback: nothing the quantiser
//! drops is lost, it is sent a step later). The swizzle is then a copy of the W slices, and the
//! node sum is dequantised, compensated and requantised by separate kernels instead of the fused
//! requantiser: with no error yet the first hop's codes are those of the fused swizzle.

use candle_core::{DType, Tensor};
use comm::{Group, Lane, Topology};

use crate::{shard_passes, Result};

/// What a rank's qgZ quantisers of one unit dropped the last time (error feedback): buffers of
/// the communication side, f32.
#[derive(Clone, Debug)]
pub(crate) struct QgzError {
    /// The first quantisation's, over the padded gradient in the swizzled order.
    pub hop1: Tensor,
    /// The requantisation's, over the node sum (P / D); `None` with one rank a node.
    pub hop2: Option<Tensor>,
}

/// qgZ's two hops of the padded, scaled gradient `full` into `target`, in INT4 blocks of
/// `block`; with `feedback`, compensated by `error` (none before the first), whose new
/// values come back.
pub(crate) fn two_hops(
    lane: &mut dyn Lane,
    topology: Topology,
    full: Tensor,
    block: usize,
    feedback: bool,
    target: &Tensor,
    error: Option<QgzError>,
) -> Result<(Tensor, Option<QgzError>)> {
    let place = lane.place().clone();
    let Topology {
        nodes,
        ranks_per_node: d,
    } = topology;
    let (hop1_error, hop2_error) = match error {
        Some(e) => (Some(e.hop1), e.hop2),
        None => (None, None),
    };
    let (mut kept_hop1, mut kept_hop2) = (None, None);
    let (mut packed, mut scales) = if feedback {
        let swizzled = swizzle(lane, &full, nodes, d)?;
        drop(full);
        let (p, s, e) = quantize_compensated(lane, &swizzled, hop1_error, block)?;
        kept_hop1 = Some(e);
        (p, s)
    } else {
        quant::tensor::quantize_int4_swizzled_on(&full, nodes, d, block, &place)?
    };
    if d > 1 {
        let p = lane.all_to_all(Group::IntraNode, &packed)?;
        let s = lane.all_to_all(Group::IntraNode, &scales)?;
        (packed, scales) = if feedback {
            let node_sum = lane.alloc(DType::F32, 2 * p.elem_count() / d)?;
            quant::tensor::dequantize_sum_int4_into(&p, &s, d, block, &node_sum, &place)?;
            let (p, s, e) = quantize_compensated(lane, &node_sum, hop2_error, block)?;
            kept_hop2 = Some(e);
            (p, s)
        } else {
            quant::tensor::dequantize_sum_requantize_int4_on(&p, &s, d, block, &place)?
        };
    }
    if nodes > 1 {
        packed = lane.all_to_all(Group::InterNode, &packed)?;
        scales = lane.all_to_all(Group::InterNode, &scales)?;
    }
    let sum =
        quant::tensor::dequantize_sum_int4_into(&packed, &scales, nodes, block, target, &place)?;
    let kept = kept_hop1.map(|hop1| QgzError {
        hop1,
        hop2: kept_hop2,
    });
    Ok((sum, kept))
}

/// `full`'s W slices in qgZ's swizzled order (slice p at position (p % D) x N + p / D), a new
/// buffer of the communication side.
fn swizzle(lane: &mut dyn Lane, full: &Tensor, nodes: usize, d: usize) -> Result<Tensor> {
    let place = lane.place().clone();
    let w = nodes * d;
    let s = full.elem_count() / w;
    let out = lane.alloc(DType::F32, full.elem_count())?;
    for p in 0..w {
        shard_passes::copy_into(&place, full, p * s, s, &out, ((p % d) * nodes + p / d) * s)?;
    }
    Ok(out)
}

/// Error feedback around one INT4 quantisation: `x + error` (in place in `x`, a buffer of the
/// job's own) quantised in blocks, and the new error `x + error - dequantised` (in place in
/// `error`, or a new buffer before the first).
fn quantize_compensated(
    lane: &mut dyn Lane,
    x: &Tensor,
    error: Option<Tensor>,
    block: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    let place = lane.place().clone();
    if let Some(e) = &error {
        shard_passes::add_into(&place, x, e)?;
    }
    let (packed, scales) = quant::tensor::quantize_int4_swizzled_on(x, 1, 1, block, &place)?;
    let dequantised = lane.alloc(DType::F32, x.elem_count())?;
    let dequantised =
        quant::tensor::dequantize_sum_int4_into(&packed, &scales, 1, block, &dequantised, &place)?;
    let error = match error {
        Some(e) => e,
        None => lane.alloc(DType::F32, x.elem_count())?,
    };
    shard_passes::sub_into(&place, x, &dequantised, &error)?;
    Ok((packed, scales, error))
}
