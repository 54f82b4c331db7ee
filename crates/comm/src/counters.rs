use std::sync::atomic::{AtomicU64, Ordering};

use crate::Topology;

/// Logical bytes a rank sent, by whether the peer is on its own node (intra) or not (inter).
///
/// Logical means by each collective's meaning, whatever algorithm a backend uses inside (ring,
/// tree, a shared table), so that the counts equal the paper's volume formulas exactly
/// (docs/design.md section 3). With n group members, `s` the length of my send buffer in bytes
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

    /// What world rank `me` sends in one collective: `bytes_to(j)` to each member j of
    /// `members` (world ranks in group-rank order) other than `me`, split by node.
    pub(crate) fn sent(
        topology: &Topology,
        me: usize,
        members: &[usize],
        bytes_to: impl Fn(usize) -> u64,
    ) -> ByteCounters {
        let mut sent = ByteCounters::default();
        for (j, &peer) in members.iter().enumerate() {
            if peer == me {
                continue;
            }
            if topology.node_of(peer) == topology.node_of(me) {
                sent.intra += bytes_to(j);
            } else {
                sent.inter += bytes_to(j);
            }
        }
        sent
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
    /// Counts [`ByteCounters::sent`] of one collective.
    pub(crate) fn count(
        &self,
        topology: &Topology,
        me: usize,
        members: &[usize],
        bytes_to: impl Fn(usize) -> u64,
    ) {
        self.add(ByteCounters::sent(topology, me, members, bytes_to));
    }

    pub(crate) fn add(&self, sent: ByteCounters) {
        self.intra.fetch_add(sent.intra, Ordering::Relaxed);
        self.inter.fetch_add(sent.inter, Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Group;

    #[test]
    fn sent_splits_peers_by_node_and_skips_me() {
        // 2 nodes x 4: rank 5 is on node 1.
        let t = Topology::new(8, 4).unwrap();
        let sent = |g| ByteCounters::sent(&t, 5, &t.members(g, 5), |_| 10);
        assert_eq!(
            sent(Group::World),
            ByteCounters {
                intra: 30,
                inter: 40
            }
        );
        assert_eq!(
            sent(Group::IntraNode),
            ByteCounters {
                intra: 30,
                inter: 0
            }
        );
        assert_eq!(
            sent(Group::InterNode),
            ByteCounters {
                intra: 0,
                inter: 10
            }
        );
    }
}
