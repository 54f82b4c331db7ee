//! The collectives, as every backend names, checks and counts them.

use candle_core::DType;

/// What a collective computes, with the arguments every member must agree on besides the length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    AllGather,
    AllToAll,
    ReduceScatter,
    AllReduce,
    Broadcast { root: usize },
    Barrier,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::AllGather => "all_gather",
            Op::AllToAll => "all_to_all",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllReduce => "all_reduce",
            Op::Broadcast { .. } => "broadcast",
            Op::Barrier => "barrier",
        }
    }

    /// The call as [`crate::CommError::Mismatch`] words it.
    pub(crate) fn describe(self, len: usize, dtype: Option<DType>) -> String {
        let dtype = dtype.map(|d| format!(" {d:?}")).unwrap_or_default();
        match self {
            Op::Broadcast { root } => {
                format!("broadcast of {len}{dtype} elements from root {root}")
            }
            op => format!("{} of {len}{dtype} elements", op.name()),
        }
    }

    /// Logical bytes group rank `me` sends to each other member of a group of `n` for a buffer of
    /// `len` elements of `elem` bytes, as [`crate::ByteCounters`] documents.
    pub(crate) fn bytes_per_peer(self, len: usize, elem: usize, n: usize, me: usize) -> u64 {
        let bytes = match self {
            Op::AllGather | Op::AllReduce => len * elem,
            Op::AllToAll | Op::ReduceScatter => len / n * elem,
            Op::Broadcast { root } if root == me => len * elem,
            Op::Broadcast { .. } | Op::Barrier => 0,
        };
        bytes as u64
    }
}
