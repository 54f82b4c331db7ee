use candle_core::Tensor;

use crate::{ByteCounters, CommError, Communicator, Group, Job, Pending, Topology};

/// The world of one rank: every group is just this rank, so every collective returns its input
/// at once and sends nothing.
///
/// [`Communicator::abort`] does nothing: there is no peer to fail and no collective is ever
/// pending.
#[derive(Clone, Copy, Debug, Default)]
pub struct Solo;

impl Communicator for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn topology(&self) -> Topology {
        Topology {
            nodes: 1,
            ranks_per_node: 1,
        }
    }
    fn all_gather(&self, _: Group, send: Tensor) -> Pending<Tensor> {
        Pending::ready(send)
    }
    fn all_to_all(&self, _: Group, send: Tensor) -> Pending<Tensor> {
        Pending::ready(send)
    }
    fn reduce_scatter(&self, _: Group, send: Tensor) -> Pending<Tensor> {
        Pending::ready(send)
    }
    fn all_reduce(&self, _: Group, buf: Tensor) -> Pending<Tensor> {
        Pending::ready(buf)
    }
    fn broadcast(&self, _: Group, root: usize, buf: Tensor) -> Pending<Tensor> {
        if root == 0 {
            Pending::ready(buf)
        } else {
            Pending::failed(CommError::BadRoot { root, size: 1 })
        }
    }
    fn barrier(&self, _: Group) -> Pending<()> {
        Pending::ready(())
    }
    fn counters(&self) -> ByteCounters {
        ByteCounters::default()
    }
    fn abort(&self, _: String) {}
    /// At once, on the caller's device: every collective of a world of one is the identity.
    fn submit(&self, job: Job) -> Pending<Vec<Tensor>> {
        crate::job::run_direct(self, job)
    }
}
