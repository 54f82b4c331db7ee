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

use comm::{Communicator, Group, Pending, Topology};

use crate::{wire, Qgz, Result};

/// A reduction in flight.
pub(crate) enum Reduction {
    Plain {
        unit: usize,
        pending: Pending<Vec<f32>>,
    },
    QgzHop1 {
        unit: usize,
        pending: Pending<Vec<u8>>,
    },
    QgzHop2 {
        unit: usize,
        pending: Pending<Vec<u8>>,
    },
}

impl Reduction {
    pub(crate) fn unit(&self) -> usize {
        match self {
            Reduction::Plain { unit, .. }
            | Reduction::QgzHop1 { unit, .. }
            | Reduction::QgzHop2 { unit, .. } => *unit,
        }
    }
}

/// `parts` equal INT4 messages: part j holds the j-th share of `packed` and of `scales`.
fn int4_messages(packed: &[u8], scales: &[f32], parts: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(packed.len() + 4 * scales.len());
    let (p, s) = (packed.len() / parts, scales.len() / parts);
    for j in 0..parts {
        wire::push(
            &mut out,
            packed[j * p..(j + 1) * p].iter().copied(),
            &scales[j * s..(j + 1) * s],
        );
    }
    out
}

/// Splits equal INT4 messages of `elems` values each into (packed, scales) pairs.
fn split_int4_messages(bytes: &[u8], elems: usize, block: usize) -> Vec<(&[u8], Vec<f32>)> {
    wire::split(bytes, elems / 2, elems / block).collect()
}

/// The pieces as `dequantize_sum*` takes them.
fn as_pieces<'a>(pieces: &'a [(&'a [u8], Vec<f32>)]) -> Vec<(&'a [u8], &'a [f32])> {
    pieces.iter().map(|(p, s)| (*p, &s[..])).collect()
}

/// Starts reducing `grad` (the unit's full padded gradient).
pub(crate) fn start(
    comm: &dyn Communicator,
    unit: usize,
    grad: Vec<f32>,
    qgz: Option<Qgz>,
) -> Result<Reduction> {
    let Some(q) = qgz else {
        return Ok(Reduction::Plain {
            unit,
            pending: comm.reduce_scatter(Group::World, grad),
        });
    };
    let Topology {
        nodes,
        ranks_per_node: d,
    } = comm.topology();
    let (packed, scales) = quant::quantize_int4_swizzled(&grad, nodes, d, q.block)?;
    // Chunk j (N slices) goes to local rank j.
    let send = int4_messages(&packed, &scales, d);
    Ok(Reduction::QgzHop1 {
        unit,
        pending: comm.all_to_all(Group::IntraNode, send),
    })
}

/// Moves a hop-1 reduction to hop 2: waits for hop 1, sums the node's pieces in the fused
/// dequantise-sum-requantise, and sends slice n' to node n'. Other reductions pass through.
pub(crate) fn advance(
    comm: &dyn Communicator,
    r: Reduction,
    qgz: Qgz,
    shard: usize,
) -> Result<Reduction> {
    let Reduction::QgzHop1 { unit, pending } = r else {
        return Ok(r);
    };
    let nodes = comm.topology().nodes;
    let received = pending.wait()?;
    let pieces = split_int4_messages(&received, nodes * shard, qgz.block);
    let (packed, scales) = quant::dequantize_sum_requantize_int4(&as_pieces(&pieces), qgz.block)?;
    // Slice n' (of my N node sums) goes to node n'.
    let send = int4_messages(&packed, &scales, nodes);
    Ok(Reduction::QgzHop2 {
        unit,
        pending: comm.all_to_all(Group::InterNode, send),
    })
}

/// Waits for a reduction; returns the unit and the world sum of my slice.
pub(crate) fn finish(
    comm: &dyn Communicator,
    r: Reduction,
    qgz: Option<Qgz>,
    shard: usize,
) -> Result<(usize, Vec<f32>)> {
    match r {
        Reduction::Plain { unit, pending } => Ok((unit, pending.wait()?)),
        Reduction::QgzHop1 { .. } => {
            let q = qgz.expect("a qgZ reduction has a qgZ plan");
            finish(comm, advance(comm, r, q, shard)?, qgz, shard)
        }
        Reduction::QgzHop2 { unit, pending } => {
            let q = qgz.expect("a qgZ reduction has a qgZ plan");
            let received = pending.wait()?;
            let pieces = split_int4_messages(&received, shard, q.block);
            Ok((
                unit,
                quant::dequantize_sum_int4(&as_pieces(&pieces), q.block)?,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: usize = 16;
    const SHARD: usize = 4 * BLOCK;

    /// Rank r's gradient: W x SHARD values of mixed sign and magnitude.
    fn gradient(r: usize, w: usize) -> Vec<f32> {
        (0..w * SHARD)
            .map(|i| (((i * 37 + r * 101) % 97) as f32 - 48.0) * 0.01 * (1.0 + (i % 5) as f32))
            .collect()
    }

    /// Each rank's reduced slice (the world sum / W) by qgZ, and by the plain reduce-scatter.
    fn reduce_both(
        topology: Topology,
        grad: impl Fn(usize) -> Vec<f32> + Sync,
    ) -> Vec<(Vec<f32>, Vec<f32>)> {
        let q = Qgz {
            block: BLOCK,
            until_step: 1,
        };
        let w = topology.world() as f32;
        comm::run_local(topology, |c| -> crate::Result<_> {
            let g = grad(c.rank());
            let quantised = finish(&c, start(&c, 0, g.clone(), Some(q))?, Some(q), SHARD)?.1;
            let plain = finish(&c, start(&c, 0, g, None)?, None, SHARD)?.1;
            Ok((
                quantised.iter().map(|v| v / w).collect(),
                plain.iter().map(|v| v / w).collect(),
            ))
        })
        .unwrap()
    }

    #[test]
    fn two_hop_mean_is_within_the_int4_bound_of_the_exact_mean() {
        for (w, d) in [(8, 4), (6, 2)] {
            let topology = Topology::new(w, d).unwrap();
            let nodes = topology.nodes;
            let out = reduce_both(topology, |r| gradient(r, w));
            // Hop 1: each rank's value is off by at most half its block's step (absmax / 7 / 2);
            // the node sums are then requantised with steps at most (node absmax + hop-1 error) / 7.
            let a = (0..w)
                .flat_map(|r| gradient(r, w))
                .fold(0.0f32, |m, v| m.max(v.abs()));
            let hop1 = a / 14.0;
            let hop2 = (d as f32 * (a + hop1)) / 14.0;
            let bound = (w as f32 * hop1 + nodes as f32 * hop2) / w as f32 * 1.0001;
            for (rank, (q, exact)) in out.iter().enumerate() {
                let expected: Vec<f32> = (0..SHARD)
                    .map(|i| {
                        (0..w)
                            .map(|r| gradient(r, w)[rank * SHARD + i])
                            .sum::<f32>()
                            / w as f32
                    })
                    .collect();
                for i in 0..SHARD {
                    assert!((exact[i] - expected[i]).abs() < 1e-5);
                    assert!(
                        (q[i] - expected[i]).abs() <= bound,
                        "W={w} rank {rank} element {i}: {} vs {}",
                        q[i],
                        expected[i]
                    );
                }
            }
        }
    }

    #[test]
    fn a_constant_gradient_reduces_exactly_to_the_reduce_scatter_scale() {
        // 0.875 = 7/8: every partial sum (x4 in a node, x2 over nodes) is exact in INT4.
        let out = reduce_both(Topology::new(8, 4).unwrap(), |_| vec![0.875; 8 * SHARD]);
        for (q, plain) in out {
            assert!(
                q.iter().all(|&v| v == 0.875),
                "a mean over nodes only would give 3.5: {q:?}"
            );
            assert_eq!(q, plain);
        }
    }
}
