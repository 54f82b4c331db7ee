//! A communicator that measures how long its caller waits for collectives: the communication
//! a step fails to hide behind compute (`trainer bench` reports it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use candle_core::Tensor;

use crate::{ByteCounters, Communicator, Group, Job, JobClock, Pending, Topology};

/// Wraps a communicator and adds up the wall time spent inside [`Pending::wait`] of its
/// collectives. On the CPU that is the exposed communication; on a GPU it is the time the host
/// is held up, which excludes collectives queued on the device behind compute.
pub struct Timed {
    inner: Box<dyn Communicator>,
    waited_ns: Arc<AtomicU64>,
}

impl Timed {
    pub fn new(inner: Box<dyn Communicator>) -> Self {
        Timed {
            inner,
            waited_ns: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A handle that reads the waited time after the communicator has moved into an engine.
    pub fn clock(&self) -> WaitClock {
        WaitClock(self.waited_ns.clone())
    }

    fn timed<T: Send + 'static>(&self, pending: Pending<T>) -> Pending<T> {
        let waited = self.waited_ns.clone();
        Pending::deferred(move || {
            let start = Instant::now();
            let result = pending.wait();
            waited.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            result
        })
    }
}

/// Seconds the device's compute stream has spent waiting for a communicator's collectives,
/// timed on the device ([`Communicator::device_wait_clock`]): the communication that compute did
/// not hide, where waiting does not block the host.
#[derive(Clone)]
pub struct DeviceWaitClock(Arc<dyn Fn() -> crate::Result<f64> + Send + Sync>);

impl DeviceWaitClock {
    /// A clock whose reading is `read()`.
    pub fn new(read: impl Fn() -> crate::Result<f64> + Send + Sync + 'static) -> Self {
        DeviceWaitClock(Arc::new(read))
    }

    /// Seconds so far. Blocks until the waits recorded so far have run on the device, so read
    /// it after synchronising the device.
    pub fn seconds(&self) -> crate::Result<f64> {
        (self.0)()
    }
}

impl std::fmt::Debug for DeviceWaitClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceWaitClock")
    }
}

/// Seconds waited so far by the callers of one [`Timed`] communicator.
#[derive(Clone, Debug)]
pub struct WaitClock(Arc<AtomicU64>);

impl WaitClock {
    pub fn seconds(&self) -> f64 {
        self.0.load(Ordering::Relaxed) as f64 * 1e-9
    }
}

impl Communicator for Timed {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn topology(&self) -> Topology {
        self.inner.topology()
    }
    fn all_gather(&self, group: Group, send: Tensor) -> Pending<Tensor> {
        self.timed(self.inner.all_gather(group, send))
    }
    fn all_to_all(&self, group: Group, send: Tensor) -> Pending<Tensor> {
        self.timed(self.inner.all_to_all(group, send))
    }
    fn reduce_scatter(&self, group: Group, send: Tensor) -> Pending<Tensor> {
        self.timed(self.inner.reduce_scatter(group, send))
    }
    fn all_reduce(&self, group: Group, buf: Tensor) -> Pending<Tensor> {
        self.timed(self.inner.all_reduce(group, buf))
    }
    fn broadcast(&self, group: Group, root: usize, buf: Tensor) -> Pending<Tensor> {
        self.timed(self.inner.broadcast(group, root, buf))
    }
    fn barrier(&self, group: Group) -> Pending<()> {
        self.timed(self.inner.barrier(group))
    }
    fn device_wait_clock(&self) -> Option<DeviceWaitClock> {
        self.inner.device_wait_clock()
    }
    fn counters(&self) -> ByteCounters {
        self.inner.counters()
    }
    fn abort(&self, reason: String) {
        self.inner.abort(reason)
    }
    fn submit(&self, job: Job) -> Pending<Vec<Tensor>> {
        self.timed(self.inner.submit(job))
    }
    fn job_clock(&self) -> Option<JobClock> {
        self.inner.job_clock()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use candle_core::Tensor;

    use super::*;
    use crate::Solo;

    /// Solo, with a device wait clock that reads 1.5 s.
    struct Clocked;

    impl Communicator for Clocked {
        fn rank(&self) -> usize {
            Solo.rank()
        }
        fn topology(&self) -> Topology {
            Solo.topology()
        }
        fn all_gather(&self, group: Group, send: Tensor) -> Pending<Tensor> {
            Solo.all_gather(group, send)
        }
        fn all_to_all(&self, group: Group, send: Tensor) -> Pending<Tensor> {
            Solo.all_to_all(group, send)
        }
        fn reduce_scatter(&self, group: Group, send: Tensor) -> Pending<Tensor> {
            Solo.reduce_scatter(group, send)
        }
        fn all_reduce(&self, group: Group, buf: Tensor) -> Pending<Tensor> {
            Solo.all_reduce(group, buf)
        }
        fn broadcast(&self, group: Group, root: usize, buf: Tensor) -> Pending<Tensor> {
            Solo.broadcast(group, root, buf)
        }
        fn barrier(&self, group: Group) -> Pending<()> {
            Solo.barrier(group)
        }
        fn counters(&self) -> ByteCounters {
            Solo.counters()
        }
        fn abort(&self, reason: String) {
            Solo.abort(reason)
        }
        fn device_wait_clock(&self) -> Option<DeviceWaitClock> {
            Some(DeviceWaitClock::new(|| Ok(1.5)))
        }
        fn submit(&self, job: crate::Job) -> Pending<Vec<Tensor>> {
            crate::job::run_direct(self, job)
        }
    }

    /// `trainer bench` reads the device clock through `Timed` around an `Arc`ed communicator:
    /// both pass it on; backends without one (Solo here) give None.
    #[test]
    fn wrappers_pass_the_device_wait_clock_on() {
        let shared: Arc<dyn Communicator> = Arc::new(Clocked);
        let timed = Timed::new(Box::new(shared));
        let clock = timed.device_wait_clock().expect("the inner clock");
        assert_eq!(clock.seconds().unwrap(), 1.5);
        assert!(Timed::new(Box::new(Solo)).device_wait_clock().is_none());
    }
}
