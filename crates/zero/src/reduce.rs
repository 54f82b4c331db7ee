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

use candle_core::{Device, Tensor};
use comm::{Communicator, Group, Pending, Topology};
use kernels::profile::{scope, Family};

use crate::{Qgz, Result};

/// One hop of qgZ in flight: the packed INT4 codes and their scales, two all-to-alls on the same
/// group issued back to back.
pub(crate) struct Hop {
    packed: Pending<Tensor>,
    scales: Pending<Tensor>,
}

impl Hop {
    fn issue(comm: &dyn Communicator, group: Group, packed: Tensor, scales: Tensor) -> Hop {
        Hop {
            packed: comm.all_to_all(group, packed),
            scales: comm.all_to_all(group, scales),
        }
    }

    fn wait(self) -> Result<(Tensor, Tensor)> {
        Ok((self.packed.wait()?, self.scales.wait()?))
    }
}

/// A reduction in flight.
pub(crate) enum Reduction {
    Plain {
        unit: usize,
        pending: Pending<Tensor>,
    },
    QgzHop1 {
        unit: usize,
        hop: Hop,
    },
    QgzHop2 {
        unit: usize,
        hop: Hop,
    },
}

/// Starts reducing `grad` (the unit's full padded f32 gradient).
pub(crate) fn start(
    comm: &dyn Communicator,
    unit: usize,
    grad: Tensor,
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
    // Swizzled so that chunk j (N slices, of codes and of scales) goes to local rank j.
    let (packed, scales) = {
        let _span = scope(grad.device(), Family::Quantisation);
        quant::tensor::quantize_int4_swizzled(&grad, nodes, d, q.block)?
    };
    Ok(Reduction::QgzHop1 {
        unit,
        hop: Hop::issue(comm, Group::IntraNode, packed, scales),
    })
}

/// Moves a hop-1 reduction to hop 2: waits for hop 1, sums the node's D pieces in the fused
/// dequantise-sum-requantise, and sends slice n' to node n'. Other reductions pass through.
pub(crate) fn advance(
    comm: &dyn Communicator,
    r: Reduction,
    qgz: Qgz,
    device: &Device,
) -> Result<Reduction> {
    let Reduction::QgzHop1 { unit, hop } = r else {
        return Ok(r);
    };
    let d = comm.topology().ranks_per_node;
    let (packed, scales) = {
        let _span = scope(device, Family::Communication);
        hop.wait()?
    };
    let (packed, scales) = {
        let _span = scope(packed.device(), Family::Quantisation);
        quant::tensor::dequantize_sum_requantize_int4(&packed, &scales, d, qgz.block)?
    };
    Ok(Reduction::QgzHop2 {
        unit,
        hop: Hop::issue(comm, Group::InterNode, packed, scales),
    })
}

/// Waits for a reduction; returns the unit and the world sum of my slice (f32).
pub(crate) fn finish(
    comm: &dyn Communicator,
    r: Reduction,
    qgz: Option<Qgz>,
    device: &Device,
) -> Result<(usize, Tensor)> {
    match r {
        Reduction::Plain { unit, pending } => {
            let _span = scope(device, Family::Communication);
            Ok((unit, pending.wait()?))
        }
        Reduction::QgzHop1 { .. } => {
            let q = qgz.expect("a qgZ reduction has a qgZ plan");
            finish(comm, advance(comm, r, q, device)?, qgz, device)
        }
        Reduction::QgzHop2 { unit, hop } => {
            let q = qgz.expect("a qgZ reduction has a qgZ plan");
            let nodes = comm.topology().nodes;
            let (packed, scales) = {
                let _span = scope(device, Family::Communication);
                hop.wait()?
            };
            let _span = scope(packed.device(), Family::Quantisation);
            Ok((
                unit,
                quant::tensor::dequantize_sum_int4(&packed, &scales, nodes, q.block)?,
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
            let g = Tensor::from_vec(g.clone(), g.len(), &candle_core::Device::Cpu)?;
            let quantised = finish(
                &c,
                start(&c, 0, g.clone(), Some(q))?,
                Some(q),
                &candle_core::Device::Cpu,
            )?
            .1;
            let plain = finish(&c, start(&c, 0, g, None)?, None, &candle_core::Device::Cpu)?.1;
            let mean = |t: Tensor| -> crate::Result<Vec<f32>> {
                Ok(t.to_vec1::<f32>()?.iter().map(|v| v / w).collect())
            };
            Ok((mean(quantised)?, mean(plain)?))
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
