//! Collective communication for the ZeRO engine.
//!
//! A [`Communicator`] moves `f32` buffers between the ranks of a [`Topology`] of `nodes x
//! ranks_per_node` (rank = node x D + local rank) over three groups: the world, the ranks of my
//! node, and the ranks with my local index on every node. Backends: [`Solo`] (one rank, every
//! collective a copy); the threaded `local` backend and NCCL arrive with ZeRO-3 over N ranks.
//! Every backend counts the logical bytes it sends per link kind ([`ByteCounters`]).

mod counters;
mod error;
mod solo;
mod topology;

pub use counters::ByteCounters;
pub use error::{CommError, Result};
pub use solo::Solo;
pub use topology::{Group, Topology};

/// Collectives over the groups of one rank's [`Topology`].
///
/// Implementors must make every reduction deterministic (the same inputs give bitwise the same
/// output whatever the timing), and must return an error on every rank, never hang, when one
/// rank fails. Buffers are `f32`: the engine's gradient shards and master weights.
pub trait Communicator: Send {
    /// This rank's place in the topology.
    fn rank(&self) -> usize;
    /// The nodes x ranks-per-node layout this communicator spans.
    fn topology(&self) -> Topology;
    /// Each member contributes `send`; `recv` (len = group size x send.len()) receives all
    /// contributions in group-rank order.
    fn all_gather(&self, group: Group, send: &[f32], recv: &mut [f32]) -> Result<()>;
    /// `send` (len = group size x recv.len()) is summed over the group; member i receives
    /// slice i of the sum in `recv`.
    fn reduce_scatter(&self, group: Group, send: &[f32], recv: &mut [f32]) -> Result<()>;
    /// Sums `buf` over the group, in place, on every member.
    fn all_reduce(&self, group: Group, buf: &mut [f32]) -> Result<()>;
    /// Bytes this rank has sent since it was created, split by link kind.
    fn counters(&self) -> ByteCounters;
}
