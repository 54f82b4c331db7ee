use crate::{CommError, Result};

/// `nodes` x `ranks_per_node` ranks; rank = node x ranks_per_node + local rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    pub nodes: usize,
    pub ranks_per_node: usize,
}

/// The process groups the engine uses. Each rank is in exactly one instance of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Group {
    /// Every rank.
    World,
    /// The ranks of my node.
    IntraNode,
    /// One rank per node: those with my local index.
    InterNode,
}

impl Group {
    /// 0, 1, 2 for world, intra-node, inter-node: an index into per-group state.
    pub(crate) fn index(self) -> usize {
        match self {
            Group::World => 0,
            Group::IntraNode => 1,
            Group::InterNode => 2,
        }
    }
}

impl Topology {
    /// A topology of `world` ranks with `ranks_per_node` on each node.
    pub fn new(world: usize, ranks_per_node: usize) -> Result<Self> {
        if world == 0 || ranks_per_node == 0 || !world.is_multiple_of(ranks_per_node) {
            return Err(CommError::BadTopology {
                world,
                ranks_per_node,
            });
        }
        Ok(Topology {
            nodes: world / ranks_per_node,
            ranks_per_node,
        })
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.nodes * self.ranks_per_node
    }

    /// The node `rank` runs on.
    pub fn node_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_node
    }

    /// `rank`'s index among the ranks of its node.
    pub fn local_rank(&self, rank: usize) -> usize {
        rank % self.ranks_per_node
    }

    /// Number of members of `group` (the same for every instance).
    pub fn group_size(&self, group: Group) -> usize {
        match group {
            Group::World => self.world(),
            Group::IntraNode => self.ranks_per_node,
            Group::InterNode => self.nodes,
        }
    }

    /// `rank`'s index in its instance of `group` (its group rank).
    pub fn group_rank(&self, group: Group, rank: usize) -> usize {
        match group {
            Group::World => rank,
            Group::IntraNode => self.local_rank(rank),
            Group::InterNode => self.node_of(rank),
        }
    }

    /// Which instance of `group` `rank` belongs to: 0 for the world, its node for
    /// [`Group::IntraNode`], its local rank for [`Group::InterNode`].
    pub fn group_instance(&self, group: Group, rank: usize) -> usize {
        match group {
            Group::World => 0,
            Group::IntraNode => self.node_of(rank),
            Group::InterNode => self.local_rank(rank),
        }
    }

    /// The world ranks of `group` as seen from `rank`, in group-rank order.
    pub fn members(&self, group: Group, rank: usize) -> Vec<usize> {
        let d = self.ranks_per_node;
        match group {
            Group::World => (0..self.world()).collect(),
            Group::IntraNode => (0..d).map(|l| self.node_of(rank) * d + l).collect(),
            Group::InterNode => (0..self.nodes)
                .map(|n| n * d + self.local_rank(rank))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_of_two_nodes_by_four() {
        let t = Topology::new(8, 4).unwrap();
        assert_eq!(t.nodes, 2);
        assert_eq!(t.members(Group::IntraNode, 6), vec![4, 5, 6, 7]);
        assert_eq!(t.members(Group::InterNode, 6), vec![2, 6]);
        assert_eq!(t.members(Group::World, 6).len(), 8);
        assert_eq!(t.group_rank(Group::IntraNode, 6), 2);
        assert_eq!(t.group_rank(Group::InterNode, 6), 1);
        assert_eq!(t.group_instance(Group::InterNode, 6), 2);
        for g in [Group::World, Group::IntraNode, Group::InterNode] {
            for r in 0..8 {
                let m = t.members(g, r);
                assert_eq!(m.len(), t.group_size(g));
                assert_eq!(m[t.group_rank(g, r)], r);
            }
        }
        assert!(Topology::new(6, 4).is_err());
    }
}
