use std::sync::atomic::{AtomicU64, Ordering};

use crate::Topology;

/// Logical bytes a rank sent, by whether the peer is on its own node (intra) or not (inter).
///
/// Logical means by each collective's meaning, whatever algorithm a backend uses inside (ring,
/// tree, a shared table), so that the counts equal the paper's volume formulas exactly
/// (DESIGN.md section 3). With n group members, `s` the length of my send buffer in bytes
/// (4 bytes per `f32`), a collective adds, for each *other* member j, to `intra` if j is on my
/// node, else to `inter`:
///
/// | collective | bytes to member j |
/// |---|---|
/// | all_gather | `s` (my contribution once to every peer) |
/// | all_to_all | `s / n` (chunk j to member j) |
/// | reduce_scatter | `s / n` (slice j to its owner j) |
/// | all_reduce | `s` (my whole buffer to every peer: a convention, as if by all-gather) |
/// | broadcast | `s` from the root to every peer; non-roots send nothing |
/// | barrier | 0 |
///
/// Only collectives that completed successfully count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByteCounters {
    pub intra: u64,
    pub inter: u64,
}

impl ByteCounters {
    /// Intra plus inter.
    pub fn total(&self) -> u64 {
        self.intra + self.inter
    }
}

impl std::ops::Sub for ByteCounters {
    type Output = ByteCounters;
    fn sub(self, rhs: ByteCounters) -> ByteCounters {
        ByteCounters {
            intra: self.intra - rhs.intra,
            inter: self.inter - rhs.inter,
        }
    }
}

/// A rank's running [`ByteCounters`], shared between the caller and its communication thread.
#[derive(Debug, Default)]
pub(crate) struct AtomicCounters {
    intra: AtomicU64,
    inter: AtomicU64,
}

impl AtomicCounters {
    /// Counts `bytes_to(j)` bytes from world rank `me` to each member j of `members` (world
    /// ranks in group-rank order) other than `me`, split by node.
    pub(crate) fn count(
        &self,
        topology: &Topology,
        me: usize,
        members: &[usize],
        bytes_to: impl Fn(usize) -> u64,
    ) {
        let (mut intra, mut inter) = (0, 0);
        for (j, &peer) in members.iter().enumerate() {
            if peer == me {
                continue;
            }
            if topology.node_of(peer) == topology.node_of(me) {
                intra += bytes_to(j);
            } else {
                inter += bytes_to(j);
            }
        }
        self.intra.fetch_add(intra, Ordering::Relaxed);
        self.inter.fetch_add(inter, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ByteCounters {
        ByteCounters {
            intra: self.intra.load(Ordering::Relaxed),
            inter: self.inter.load(Ordering::Relaxed),
        }
    }
}

impl std::ops::Add for ByteCounters {
    type Output = ByteCounters;
    fn add(self, rhs: ByteCounters) -> ByteCounters {
        ByteCounters {
            intra: self.intra + rhs.intra,
            inter: self.inter + rhs.inter,
        }
    }
}
