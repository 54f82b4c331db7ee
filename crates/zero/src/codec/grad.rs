//! The gradient codecs: the plain reduce-scatter, and qgZ's two INT4 hops with error feedback
//! (the algorithm: [`crate::qgz`]).

use comm::{Group, Topology};

use super::{GradCodec, Hop};
use crate::ReduceDtype;

/// qgZ's error-feedback buffers of a unit, in checkpoint order (`<unit>.<state>`): the first
/// hop's (the padded unit, swizzled) and the second's (the node sum, with several ranks a node).
pub const QGZ_ERROR_STATES: [&str; 2] = ["qgz_error.hop1", "qgz_error.hop2"];

/// A reduce-scatter over the world of the gradient cast to `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlainReduceScatter {
    pub dtype: ReduceDtype,
}

impl GradCodec for PlainReduceScatter {
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
}
