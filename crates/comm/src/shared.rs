//! A communicator shared between its user and a supervisor: the trainer hands one handle to the
//! engine and keeps another to abort the world when the rank fails.

use std::sync::Arc;

use candle_core::Tensor;

use crate::{ByteCounters, Communicator, DeviceWaitClock, Group, Job, JobClock, Pending, Topology};

impl<C: Communicator + ?Sized> Communicator for Arc<C> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn topology(&self) -> Topology {
        (**self).topology()
    }
    fn all_gather(&self, group: Group, send: Tensor) -> Pending<Tensor> {
        (**self).all_gather(group, send)
    }
    fn all_to_all(&self, group: Group, send: Tensor) -> Pending<Tensor> {
        (**self).all_to_all(group, send)
    }
    fn reduce_scatter(&self, group: Group, send: Tensor) -> Pending<Tensor> {
        (**self).reduce_scatter(group, send)
    }
    fn all_reduce(&self, group: Group, buf: Tensor) -> Pending<Tensor> {
        (**self).all_reduce(group, buf)
    }
    fn broadcast(&self, group: Group, root: usize, buf: Tensor) -> Pending<Tensor> {
        (**self).broadcast(group, root, buf)
    }
    fn barrier(&self, group: Group) -> Pending<()> {
        (**self).barrier(group)
    }
    fn counters(&self) -> ByteCounters {
        (**self).counters()
    }
    fn abort(&self, reason: String) {
        (**self).abort(reason)
    }
    fn device_wait_clock(&self) -> Option<DeviceWaitClock> {
        (**self).device_wait_clock()
    }
    fn submit(&self, job: Job) -> Pending<Vec<Tensor>> {
        (**self).submit(job)
    }
    fn job_clock(&self) -> Option<JobClock> {
        (**self).job_clock()
    }
}
