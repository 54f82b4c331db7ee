//! The `local` backend: the W ranks of a world as threads of one process.
//!
//! Each [`LocalComm`] owns one communication thread that executes its rank's collectives in
//! issue order, like one CUDA stream or NCCL communicator, so every call returns a [`Pending`]
//! at once and the caller overlaps compute with communication. Ranks meet in a table shared by
//! the world, one slot per (group instance, sequence number on that instance): each member
//! deposits its contribution, waits for all, computes its own result outside the lock, and the
//! last one out removes the slot. Results are built with tensor operations on the buffers' own
//! device (on a GPU: device-to-device copies and adds, the ranks sharing one device and stream).
//! Reductions add the members' contributions in group-rank order, so results are bitwise
//! identical whatever the thread timing.

mod job;
mod rendezvous;
mod run;

use std::sync::{mpsc, Arc};
use std::time::Duration;

use candle_core::Tensor;

use crate::counters::AtomicCounters;
use crate::job::{Job, JobClock};
use crate::op::Op;
use crate::{ByteCounters, CommError, Communicator, Group, Pending, Result, Topology};
use rendezvous::{Payload, Seat, Shared};

pub use run::{run_local, run_local_with_timeout, LocalRunError};

/// How long a collective waits for its peers before failing with [`CommError::Timeout`]: a last
/// resort, generous enough for any step; failures of a rank are reported at once by abort.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// One rank of a local world; implements [`Communicator`]. Create with [`local_world`], or
/// let [`run_local`] create them and run one closure per rank.
///
/// Dropping it lets its communication thread finish the collectives already issued, then exit;
/// a peer still waiting for a collective this rank never issued then fails with
/// [`CommError::Aborted`] naming this rank, instead of hanging.
pub struct LocalComm {
    handle: Arc<Handle>,
}

struct Handle {
    rank: usize,
    shared: Arc<Shared>,
    counters: Arc<AtomicCounters>,
    tasks: mpsc::Sender<Task>,
    /// This rank's job timing, once started.
    timing: job::SharedTiming,
}

/// What the communication thread runs: a collective, or a [`Job`].
type Task = Box<dyn FnOnce(&mut Worker) + Send>;

/// The communication thread's state: its rank and its sequence number on each group.
struct Worker {
    rank: usize,
    shared: Arc<Shared>,
    counters: Arc<AtomicCounters>,
    /// Collectives issued so far on [`Group::World`], [`Group::IntraNode`], [`Group::InterNode`].
    seq: [u64; 3],
}

/// One communicator per rank of `topology`, in rank order, with [`DEFAULT_TIMEOUT`].
pub fn local_world(topology: Topology) -> Vec<LocalComm> {
    local_world_with_timeout(topology, DEFAULT_TIMEOUT)
}

/// As [`local_world`], with collectives failing after waiting `timeout` for their peers.
///
/// # Panics
/// If the operating system cannot start a thread.
pub fn local_world_with_timeout(topology: Topology, timeout: Duration) -> Vec<LocalComm> {
    let shared = Arc::new(Shared::new(topology, timeout));
    (0..topology.world())
        .map(|rank| {
            let counters = Arc::new(AtomicCounters::default());
            let (tasks, rx) = mpsc::channel::<Task>();
            let mut worker = Worker {
                rank,
                shared: shared.clone(),
                counters: counters.clone(),
                seq: [0; 3],
            };
            // Detached: it ends once the handle is dropped and the queue is drained.
            std::thread::Builder::new()
                .name(format!("comm-local-{rank}"))
                .spawn(move || {
                    while let Ok(task) = rx.recv() {
                        task(&mut worker);
                    }
                    worker.shared.mark_gone(rank);
                })
                .expect("the OS starts a communication thread");
            LocalComm {
                handle: Arc::new(Handle {
                    rank,
                    shared: shared.clone(),
                    counters,
                    tasks,
                    timing: Default::default(),
                }),
            }
        })
        .collect()
}

/// An all-to-all's result on the host from every member's payload (in group-rank order): the
/// `me`-th of each one's equal chunks, concatenated.
fn all_to_all_result(ps: &[Arc<Payload>], me: usize) -> candle_core::Result<Tensor> {
    let chunk = ps[0].len() / ps.len();
    let parts = ps
        .iter()
        .map(|p| p.tensor().narrow(0, me * chunk, chunk))
        .collect::<candle_core::Result<Vec<_>>>()?;
    Tensor::cat(&parts, 0)
}

impl LocalComm {
    /// Queues a collective on this rank's communication thread; `finish` computes my result from
    /// every member's payload (in group-rank order) and my group rank.
    fn submit<T, F>(&self, group: Group, op: Op, payload: Payload, finish: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnOnce(&[Arc<Payload>], usize) -> candle_core::Result<T> + Send + 'static,
    {
        let (done, pending) = Pending::channel(self.handle.rank);
        let task: Task = Box::new(move |worker: &mut Worker| {
            done.complete(worker.run(group, op, payload, finish));
        });
        match self.handle.tasks.send(task) {
            Ok(()) => pending,
            Err(_) => Pending::failed(CommError::WorkerGone {
                rank: self.handle.rank,
            }),
        }
    }

    /// A plain collective of a GPU tensor: on the world's communication stream (`job.rs`),
    /// since the ranks' tensors may live on streams and candle devices of their own.
    #[cfg(feature = "cuda")]
    fn submit_gpu(&self, group: Group, op: Op, send: Tensor) -> Pending<Tensor> {
        let plain = match job::PlainOnGpu::prepare(op, group, send, self.handle.shared.topology) {
            Ok(p) => p,
            Err(e) => return Pending::failed(e),
        };
        let (done, pending) = Pending::channel(self.handle.rank);
        let task: Task = Box::new(move |worker: &mut Worker| {
            done.complete(worker.run_plain_gpu(plain));
        });
        if self.handle.tasks.send(task).is_err() {
            return Pending::failed(CommError::WorkerGone {
                rank: self.handle.rank,
            });
        }
        Pending::deferred(move || {
            let finished: job::Finished = pending.wait()?;
            let mut results = finished.results.into_iter();
            if let Some(fence) = finished.fence {
                fence.release()?;
            }
            Ok(results.next().expect("one result"))
        })
    }

    /// Routes `op` on a GPU tensor to [`LocalComm::submit_gpu`]: `Some` of its result there.
    fn on_gpu(&self, group: Group, op: Op, send: &Tensor) -> Option<Pending<Tensor>> {
        #[cfg(feature = "cuda")]
        if send.device().is_cuda() {
            return Some(self.submit_gpu(group, op, send.clone()));
        }
        let _ = (group, op, send);
        None
    }

    /// A second handle on the same rank, keeping its communication thread alive.
    fn keepalive(&self) -> Arc<Handle> {
        self.handle.clone()
    }
}

impl Worker {
    /// Meets the group for my next collective on it: deposits my payload, waits for every
    /// member's, checks that they agree, counts my bytes; the payloads in group-rank order.
    fn meet(&mut self, group: Group, op: Op, payload: Payload) -> Result<Vec<Arc<Payload>>> {
        let topology = self.shared.topology;
        let members = topology.members(group, self.rank);
        let me = topology.group_rank(group, self.rank);
        let n = members.len();
        let g = group.index();
        let seq = self.seq[g];
        self.seq[g] += 1;
        let seat = Seat {
            key: (group, topology.group_instance(group, self.rank), seq),
            members: &members,
            me,
        };
        let (len, size) = (payload.len(), payload.elem_size());
        let payloads = self.shared.meet(&seat, op, payload)?;
        let bytes = op.bytes_per_peer(len, size, n, me);
        self.counters
            .count(&topology, self.rank, &members, |_| bytes);
        Ok(payloads)
    }

    /// One collective: [`Worker::meet`], then `finish` computes my result from every member's
    /// payload (in group-rank order) and my group rank.
    fn run<T>(
        &mut self,
        group: Group,
        op: Op,
        payload: Payload,
        finish: impl FnOnce(&[Arc<Payload>], usize) -> candle_core::Result<T>,
    ) -> Result<T> {
        let me = self.shared.topology.group_rank(group, self.rank);
        let payloads = self.meet(group, op, payload)?;
        finish(&payloads, me).map_err(|e| CommError::tensor(op.name(), e))
    }
}

/// `p[0][range] + p[1][range] + ...`, added in group-rank order.
fn sum_in_order(
    payloads: &[Arc<Payload>],
    start: usize,
    len: usize,
) -> candle_core::Result<Tensor> {
    let mut out = payloads[0].tensor().narrow(0, start, len)?;
    for p in &payloads[1..] {
        out = (out + p.tensor().narrow(0, start, len)?)?;
    }
    Ok(out)
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.handle.rank
    }

    fn topology(&self) -> Topology {
        self.handle.shared.topology
    }

    fn all_gather(&self, group: Group, send: Tensor) -> Pending<Tensor> {
        if let Some(p) = self.on_gpu(group, Op::AllGather, &send) {
            return p;
        }
        self.submit(group, Op::AllGather, Payload::Tensor(send), |ps, _| {
            let parts: Vec<&Tensor> = ps.iter().map(|p| p.tensor()).collect();
            Tensor::cat(&parts, 0)
        })
    }

    fn all_to_all(&self, group: Group, send: Tensor) -> Pending<Tensor> {
        if let Some(p) = self.on_gpu(group, Op::AllToAll, &send) {
            return p;
        }
        self.submit(
            group,
            Op::AllToAll,
            Payload::Tensor(send),
            all_to_all_result,
        )
    }

    fn reduce_scatter(&self, group: Group, send: Tensor) -> Pending<Tensor> {
        if let Some(p) = self.on_gpu(group, Op::ReduceScatter, &send) {
            return p;
        }
        self.submit(group, Op::ReduceScatter, Payload::Tensor(send), |ps, me| {
            let chunk = ps[0].len() / ps.len();
            sum_in_order(ps, me * chunk, chunk)
        })
    }

    fn all_reduce(&self, group: Group, buf: Tensor) -> Pending<Tensor> {
        if let Some(p) = self.on_gpu(group, Op::AllReduce, &buf) {
            return p;
        }
        self.submit(group, Op::AllReduce, Payload::Tensor(buf), |ps, _| {
            sum_in_order(ps, 0, ps[0].len())
        })
    }

    fn broadcast(&self, group: Group, root: usize, buf: Tensor) -> Pending<Tensor> {
        if let Some(p) = self.on_gpu(group, Op::Broadcast { root }, &buf) {
            return p;
        }
        self.submit(
            group,
            Op::Broadcast { root },
            Payload::Tensor(buf),
            move |ps, _| Ok(ps[root].tensor().clone()),
        )
    }

    fn barrier(&self, group: Group) -> Pending<()> {
        self.submit(group, Op::Barrier, Payload::Empty, |_, _| Ok(()))
    }

    fn counters(&self) -> ByteCounters {
        self.handle.counters.snapshot()
    }

    fn abort(&self, reason: String) {
        self.handle.shared.abort(self.handle.rank, reason);
    }

    /// Runs `job` on this rank's communication thread (see `job.rs` here): the rank's thread
    /// only allocates the outputs (and on a GPU records the event the job waits for).
    fn submit(&self, job: Job) -> Pending<Vec<Tensor>> {
        let label = job.label;
        let queued = match job::prepare(job, self.handle.timing.clone()) {
            Ok(q) => q,
            Err(e) => return Pending::failed(e),
        };
        let (done, pending) = Pending::channel(self.handle.rank);
        let task: Task = Box::new(move |worker: &mut Worker| {
            done.complete(worker.run_job(queued));
        });
        if self.handle.tasks.send(task).is_err() {
            return Pending::failed(CommError::WorkerGone {
                rank: self.handle.rank,
            });
        }
        let timing = self.handle.timing.clone();
        Pending::deferred(move || {
            let start = std::time::Instant::now();
            let finished = pending.wait()?;
            #[cfg(feature = "cuda")]
            if let Some(fence) = finished.fence {
                // On a GPU the host waited only for the job to be queued: the exposed time is
                // the compute stream's, timed by the fence.
                fence.release()?;
                return Ok(finished.results);
            }
            job::host_waited(&timing, label, start.elapsed().as_secs_f64());
            Ok(finished.results)
        })
    }

    fn job_clock(&self) -> Option<JobClock> {
        Some(job::clock(&self.handle.timing))
    }
}

impl std::fmt::Debug for LocalComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalComm")
            .field("rank", &self.handle.rank)
            .field("topology", &self.handle.shared.topology)
            .finish()
    }
}
