//! The gradient codecs: the plain reduce-scatter, and qgZ's two INT4 hops with error feedback
//! (the algorithm: [`crate::qgz`]).

use candle_core::{DType, Tensor};
use comm::{Group, Lane, Topology};
use kernels::profile::Family;

use super::{GradCodec, GradState, Hop, ReduceInput};
use crate::qgz::{self, QgzError};
use crate::{shard_passes, ReduceDtype, Result};

/// qgZ's error-feedback buffers of a unit, in checkpoint order (`<unit>.<state>`): the first
/// hop's (the padded unit, swizzled) and the second's (the node sum, with several ranks a node).
pub const QGZ_ERROR_STATES: [&str; 2] = ["qgz_error.hop1", "qgz_error.hop2"];

/// A reduce-scatter over the world of the gradient cast to `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlainReduceScatter {
    pub dtype: ReduceDtype,
}

impl GradCodec for PlainReduceScatter {
    fn label(&self) -> String {
        format!("{} reduce-scatter", self.dtype.name())
    }

    fn hops(&self, padded: usize, _topology: Topology) -> Vec<Hop> {
        vec![Hop {
            group: Group::World,
            input: (padded * self.dtype.bytes()) as u64,
        }]
    }

    fn input_bytes(&self) -> usize {
        self.dtype.bytes()
    }

    fn kernel_traffic(&self, _padded: usize, _topology: Topology) -> u64 {
        0
    }

    fn kept(&self, _padded: usize, _topology: Topology) -> Vec<(&'static str, usize)> {
        vec![]
    }

    /// The gradient cast to `dtype` as it is scaled and padded, reduce-scattered over the world;
    /// a bf16 slice widened into the f32 target, unless the add into the shard widens it.
    fn reduce(
        &self,
        lane: &mut dyn Lane,
        input: &ReduceInput<'_>,
        _state: &mut GradState,
    ) -> Result<Tensor> {
        let place = lane.place().clone();
        let full = lane.alloc(self.dtype.dtype(), input.padded)?;
        shard_passes::scale_pad_into(&place, input.grad, input.coef, &full)?;
        match self.dtype {
            ReduceDtype::Fp32 => {
                let t = input.target(lane)?;
                Ok(lane.reduce_scatter_into(Group::World, &full, &t)?)
            }
            ReduceDtype::Bf16 => {
                let reduced = lane.alloc(DType::BF16, input.shard())?;
                let reduced = lane.reduce_scatter_into(Group::World, &full, &reduced)?;
                if input.accumulates() {
                    return Ok(reduced);
                }
                let t = input.target(lane)?;
                // Profile spans time the compute stream: they record only where the job runs there.
                let _span = place.scope(input.grad.device(), Family::ShardPasses);
                shard_passes::widen_into(&place, &reduced, &t)?;
                Ok(t)
            }
        }
    }
}

/// qgZ: the f32 gradient quantised to INT4 (two values a byte, one f32 scale per `block`),
/// all-to-all over my node, summed and requantised, all-to-all over the ranks of my local index;
/// with `error_feedback`, what each quantiser dropped kept for the next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int4TwoHop {
    pub block: usize,
    pub error_feedback: bool,
}

impl Int4TwoHop {
    /// Bytes of `n` INT4 values plus their f32 scales.
    fn int4(&self, n: usize) -> u64 {
        (n / 2 + n / self.block * 4) as u64
    }
}

impl GradCodec for Int4TwoHop {
    fn label(&self) -> String {
        let feedback = match self.error_feedback {
            true => ", error feedback",
            false => "",
        };
        format!("qgZ int4 2-hop (block {}{feedback})", self.block)
    }

    /// Hop 1: my whole gradient, over my node; hop 2: my node sum (padded / D), over the nodes.
    fn hops(&self, padded: usize, topology: Topology) -> Vec<Hop> {
        let d = topology.ranks_per_node;
        vec![
            Hop {
                group: Group::IntraNode,
                input: self.int4(padded),
            },
            Hop {
                group: Group::InterNode,
                input: self.int4(padded / d),
            },
        ]
    }

    /// qgZ quantises the f32 gradient.
    fn input_bytes(&self) -> usize {
        4
    }

    /// Quantise (f32 in, INT4 out); dequantise-sum-requantise (D pieces in, the node sum out);
    /// dequantise-sum (N pieces in, my f32 shard out); with error feedback, both hops' f32
    /// errors read and written (counted at P / D for the second hop even with one rank a node,
    /// where there is none: what `trainer plan --throughput` has always charged).
    fn kernel_traffic(&self, padded: usize, topology: Topology) -> u64 {
        let (w, d) = (topology.world(), topology.ranks_per_node);
        let (hop1, hop2) = (self.int4(padded), self.int4(padded / d));
        let e = padded as u64;
        let mut bytes = 4 * e + 2 * hop1 + 2 * hop2 + 4 * e / w as u64;
        if self.error_feedback {
            bytes += 8 * e + 8 * e / d as u64;
        }
        bytes
    }

    /// With error feedback: the first hop's error over the padded unit, and the second's over
    /// the node sum where a node has several ranks.
    fn kept(&self, padded: usize, topology: Topology) -> Vec<(&'static str, usize)> {
        let d = topology.ranks_per_node;
        match (self.error_feedback, d > 1) {
            (false, _) => vec![],
            (true, false) => vec![(QGZ_ERROR_STATES[0], padded)],
            (true, true) => vec![
                (QGZ_ERROR_STATES[0], padded),
                (QGZ_ERROR_STATES[1], padded / d),
            ],
        }
    }

    /// The gradient scaled and padded in f32, then qgZ's two hops ([`qgz::two_hops`]); with
    /// error feedback, compensated by the errors `state` kept and keeping the new ones.
    fn reduce(
        &self,
        lane: &mut dyn Lane,
        input: &ReduceInput<'_>,
        state: &mut GradState,
    ) -> Result<Tensor> {
        let place = lane.place().clone();
        let full = lane.alloc(DType::F32, input.padded)?;
        shard_passes::scale_pad_into(&place, input.grad, input.coef, &full)?;
        let t = input.target(lane)?;
        let [hop1, hop2] = QGZ_ERROR_STATES;
        // None without the first hop's error, which every kept error has.
        let error = match self.error_feedback {
            true => state.take(hop1).map(|e| QgzError {
                hop1: e,
                hop2: state.take(hop2),
            }),
            false => None,
        };
        let (block, feedback) = (self.block, self.error_feedback);
        let (sum, kept) = qgz::two_hops(lane, input.topology, full, block, feedback, &t, error)?;
        if let Some(e) = kept {
            state.put(hop1, e.hop1);
            if let Some(e) = e.hop2 {
                state.put(hop2, e);
            }
        }
        Ok(sum)
    }
}
