//! Gradient reduction: a reduce-scatter over the world, or qgZ's 2-hop INT4 all-to-all.
//!
//! qgZ (DESIGN.md section 3), world W = N nodes x D ranks, slice p of the gradient is owned by
//! rank p. The gradient is quantised with its slices swizzled (p to position (p % D) x N + p / D)
//! so that the D chunks of N slices are contiguous; hop 1 is an all-to-all over my node (local
//! rank d receives, from each local peer, the slices {n' x D + d}); the D pieces are dequantised,
//! summed in f32 and requantised in one fused pass; hop 2 is an all-to-all over the ranks with
//! my local index (slice n' x D + d goes to node n'); the N pieces are dequantised and summed,
//! and the caller divides by W, exactly as for the reduce-scatter. Hop 1 of one unit is in
//! flight while hop 2 of the previous one completes: the engine advances every pending hop 1
//! when it starts the next reduction.

use comm::{bytes_to_f32, f32_to_bytes, Communicator, Group, Pending, Topology};

use crate::{Qgz, Result};

/// A reduction in flight.
pub(crate) enum Reduction {
    Plain { unit: usize, pending: Pending<Vec<f32>> },
    QgzHop1 { unit: usize, pending: Pending<Vec<u8>> },
    QgzHop2 { unit: usize, pending: Pending<Vec<u8>> },
}

impl Reduction {
    pub(crate) fn unit(&self) -> usize {
        match self {
            Reduction::Plain { unit, .. } | Reduction::QgzHop1 { unit, .. } | Reduction::QgzHop2 { unit, .. } => *unit,
        }
    }
}

/// One INT4 message: the packed values, then the f32 scales.
fn int4_message(packed: &[u8], scales: &[f32]) -> Vec<u8> {
    let mut m = Vec::with_capacity(packed.len() + 4 * scales.len());
    m.extend_from_slice(packed);
    m.extend_from_slice(&f32_to_bytes(scales));
    m
}

/// Splits `parts` equal INT4 messages of `elems` values each into (packed, scales) pairs.
fn split_int4_messages(bytes: &[u8], parts: usize, elems: usize, block: usize) -> Vec<(Vec<u8>, Vec<f32>)> {
    let packed = elems / 2;
    let len = bytes.len() / parts.max(1);
    bytes.chunks_exact(len).map(|m| (m[..packed].to_vec(), bytes_to_f32(&m[packed..packed + elems / block * 4]))).collect()
}

/// Starts reducing `grad` (the unit's full padded gradient).
pub(crate) fn start(comm: &dyn Communicator, unit: usize, grad: Vec<f32>, qgz: Option<Qgz>) -> Result<Reduction> {
    let Some(q) = qgz else {
        return Ok(Reduction::Plain { unit, pending: comm.reduce_scatter(Group::World, grad) });
    };
    let Topology { nodes, ranks_per_node: d } = comm.topology();
    let (packed, scales) = quant::quantize_int4_swizzled(&grad, nodes, d, q.block)?;
    // Chunk j (N slices) goes to local rank j.
    let chunk = grad.len() / d;
    let mut send = Vec::with_capacity(packed.len() + 4 * scales.len());
    for j in 0..d {
        let (p, s) = (chunk / 2, chunk / q.block);
        send.extend(int4_message(&packed[j * p..(j + 1) * p], &scales[j * s..(j + 1) * s]));
    }
    Ok(Reduction::QgzHop1 { unit, pending: comm.all_to_all(Group::IntraNode, send) })
}

/// Moves a hop-1 reduction to hop 2: waits for hop 1, sums the node's pieces in the fused
/// dequantise-sum-requantise, and sends slice n' to node n'. Other reductions pass through.
pub(crate) fn advance(comm: &dyn Communicator, r: Reduction, qgz: Qgz, shard: usize) -> Result<Reduction> {
    let Reduction::QgzHop1 { unit, pending } = r else { return Ok(r) };
    let Topology { nodes, ranks_per_node: d } = comm.topology();
    let pieces = split_int4_messages(&pending.wait()?, d, nodes * shard, qgz.block);
    let refs: Vec<(&[u8], &[f32])> = pieces.iter().map(|(p, s)| (&p[..], &s[..])).collect();
    let (packed, scales) = quant::dequantize_sum_requantize_int4(&refs, qgz.block)?;
    let (p, s) = (shard / 2, shard / qgz.block);
    let mut send = Vec::with_capacity(packed.len() + 4 * scales.len());
    for n in 0..nodes {
        send.extend(int4_message(&packed[n * p..(n + 1) * p], &scales[n * s..(n + 1) * s]));
    }
    Ok(Reduction::QgzHop2 { unit, pending: comm.all_to_all(Group::InterNode, send) })
}

/// Waits for a reduction; returns the unit and the world sum of my slice.
pub(crate) fn finish(comm: &dyn Communicator, r: Reduction, qgz: Option<Qgz>, shard: usize) -> Result<(usize, Vec<f32>)> {
    match r {
        Reduction::Plain { unit, pending } => Ok((unit, pending.wait()?)),
        Reduction::QgzHop1 { .. } => {
            let q = qgz.expect("a qgZ reduction has a qgZ plan");
            finish(comm, advance(comm, r, q, shard)?, qgz, shard)
        }
        Reduction::QgzHop2 { unit, pending } => {
            let q = qgz.expect("a qgZ reduction has a qgZ plan");
            let nodes = comm.topology().nodes;
            let pieces = split_int4_messages(&pending.wait()?, nodes, shard, q.block);
            let refs: Vec<(&[u8], &[f32])> = pieces.iter().map(|(p, s)| (&p[..], &s[..])).collect();
            Ok((unit, quant::dequantize_sum_int4(&refs, q.block)?))
        }
    }
}
