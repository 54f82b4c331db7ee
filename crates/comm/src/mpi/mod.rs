//! The MPI backend: one rank per process, on the CPU, under `mpirun` (feature `mpi`).
//!
//! [`MpiComm`] owns a *communication thread* that initialises MPI (thread level
//! `MPI_THREAD_FUNNELED`: every MPI call of the process is made on that thread), builds the
//! intra-node and inter-node communicators with `MPI_Comm_split`, then executes the rank's
//! collectives in issue order, like the local backend's thread, so each call returns a
//! [`Pending`] at once.
//!
//! Each collective runs in two exchanges on the group's communicator:
//! 1. a *header* all-gather (op, root, length, dtype of every member), so that members which
//!    disagree fail alike with [`CommError::Mismatch`] (and bad lengths or roots with
//!    [`CommError::Indivisible`] or [`CommError::BadRoot`]) instead of corrupting memory;
//! 2. the data, as bytes: `MPI_Iallgather` (all_gather, all_reduce), `MPI_Ialltoall`
//!    (all_to_all, reduce_scatter) or `MPI_Ibcast`; a barrier is the header exchange alone.
//!
//! Reductions do not use MPI's reduction: reduce_scatter moves slice j of every member to
//! member j (an all-to-all) and all_reduce gathers every member's buffer, then each member adds
//! the contributions in group-rank order with candle's CPU add, exactly as [`LocalComm`]
//! does, so the results are bitwise identical to the local backend's for every dtype
//! (bf16 included). The price: all_reduce holds n buffers and sends (n - 1) x its buffer, where
//! a ring would send about twice the buffer; fine for the CPU worlds this backend is for. The
//! byte counters count the logical bytes of [`ByteCounters`], as the local backend does, not
//! what MPI moves.
//!
//! # Failures
//! The requests are polled (`MPI_Test`), so the communication thread keeps control while it
//! waits: if a collective has not completed within the timeout ([`MpiComm::set_timeout`],
//! default [`DEFAULT_TIMEOUT`]), or [`Communicator::abort`] was called, it hands a
//! [`FailureReport`] to the program's handler ([`MpiComm::set_failure_handler`]; the library
//! prints nothing) and calls `MPI_Abort` on the world, and OpenMPI ends every process of the job
//! with a non-zero exit. `MPI_Abort` is the only way out: MPI cannot cancel a collective. MPI cannot tell a rank that issued a different *number* of collectives on a
//! group, or collectives on different groups in an inconsistent order, from a slow one: such a
//! program hangs until the watchdog fires. A rank that dies (a crash, `kill -9`, `exit`
//! without finalising) is seen by `mpirun`, which kills the rest of the job at once.
//!
//! [`LocalComm`]: crate::LocalComm

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod wire;

use std::sync::{Mutex, PoisonError};

use candle_core::{DType, Tensor};
use mpi::request::{LocalScope, Request};
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};
use mpi::Threading;

use crate::counters::AtomicCounters;
use crate::op::Op;
use crate::{
    ByteCounters, CommError, Communicator, FailureHandler, FailureReport, Group, Pending, Result,
    Topology, DEFAULT_TIMEOUT,
};
use wire::{describe, encode, tensor_bytes, Exchanged, DTYPES, DTYPE_NAMES, HEADER};

/// The exit code of the job when a rank aborts it or its watchdog fires.
const ABORT_CODE: i32 = 1;

/// How long [`Communicator::abort`] waits for the communication thread's `MPI_Abort` to end the
/// process before it returns, for the program to exit by itself.
const ABORT_GRACE: Duration = Duration::from_secs(10);

/// One rank of an MPI job; implements [`Communicator`] with CPU buffers (tensors on another
/// device are copied to the CPU and the results back).
///
/// Create one per process with [`MpiComm::init`], and drop it before the process exits: dropping
/// lets the communication thread finish the collectives already issued, then finalises MPI
/// (`MPI_Finalize` waits for the other ranks to finalise too). A process that exits without it
/// is taken by `mpirun` for a failed rank.
pub struct MpiComm {
    rank: usize,
    topology: Topology,
    counters: Arc<AtomicCounters>,
    control: Arc<Control>,
    jobs: Option<mpsc::Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
}

/// What the caller's threads tell the communication thread besides the jobs.
struct Control {
    timeout_ms: AtomicU64,
    aborting: AtomicBool,
    /// The program's handler of [`FailureReport`]s.
    handler: Mutex<Option<FailureHandler>>,
}

impl Control {
    /// Hands `report` to the program's handler, if it set one.
    fn report(&self, report: FailureReport) {
        let handler = self
            .handler
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(handler) = handler {
            handler(&report);
        }
    }
}

enum Msg {
    Job(Job),
    /// Wake up and look at `Control::aborting`.
    Abort,
}

type Job = Box<dyn FnOnce(&mut Worker) + Send>;

/// The communication thread's state: the MPI communicators and the sequence numbers.
struct Worker {
    rank: usize,
    topology: Topology,
    world: SimpleCommunicator,
    intra: SimpleCommunicator,
    inter: SimpleCommunicator,
    control: Arc<Control>,
    counters: Arc<AtomicCounters>,
    /// Collectives issued so far on [`Group::World`], [`Group::IntraNode`], [`Group::InterNode`].
    seq: [u64; 3],
}

impl MpiComm {
    /// Initialises MPI on a new communication thread and reads this process's rank and the
    /// world size from `MPI_COMM_WORLD`.
    ///
    /// Ranks per node are `ranks_per_node` if given (so that 4 processes on one host can stand
    /// for 2 nodes x 2), else the number of ranks sharing my host (`MPI_Comm_split_type`
    /// shared), which must be the same on every host, with each host's ranks consecutive
    /// (OpenMPI fills one host after another unless told otherwise; `--map-by node` is an
    /// error). Every rank reaches the same verdict, so a bad topology fails on all of them with
    /// [`CommError::BadTopology`] (or [`CommError::UnevenHosts`],
    /// [`CommError::HostNotConsecutive`]); a second `init` in one process fails with
    /// [`CommError::MpiInitialised`].
    pub fn init(ranks_per_node: Option<usize>) -> Result<MpiComm> {
        let counters = Arc::new(AtomicCounters::default());
        let control = Arc::new(Control {
            timeout_ms: AtomicU64::new(DEFAULT_TIMEOUT.as_millis() as u64),
            aborting: AtomicBool::new(false),
            handler: Mutex::new(None),
        });
        let (ready_tx, ready_rx) = mpsc::channel();
        let (jobs, rx) = mpsc::channel::<Msg>();
        let (c, k) = (counters.clone(), control.clone());
        let thread = std::thread::Builder::new()
            .name("comm-mpi".into())
            .spawn(move || communication_thread(ranks_per_node, c, k, ready_tx, rx))
            .map_err(|e| CommError::spawn("MPI communication", e))?;
        match ready_rx.recv() {
            Ok(Ok((rank, topology))) => Ok(MpiComm {
                rank,
                topology,
                counters,
                control,
                jobs: Some(jobs),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                // The thread has finalised MPI (every rank failed alike) and ends.
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(CommError::WorkerGone { rank: 0 }),
        }
    }

    /// How long a collective may wait for its peers before this rank aborts the job (default
    /// [`DEFAULT_TIMEOUT`]); applies to collectives from now on, and to the one in progress.
    pub fn set_timeout(&self, timeout: Duration) {
        self.control
            .timeout_ms
            .store(timeout.as_millis() as u64, Ordering::Relaxed);
    }

    /// Where the communication thread reports a timeout or an abort before it calls `MPI_Abort`
    /// (see the module doc); `None` (the default): nowhere.
    pub fn set_failure_handler(&self, handler: Option<FailureHandler>) {
        *self
            .control
            .handler
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = handler;
    }

    /// Queues a collective on the communication thread; `finish` computes my result from what
    /// the exchange received.
    fn submit<T: Send + 'static>(
        &self,
        group: Group,
        op: Op,
        send: Option<Tensor>,
        finish: impl FnOnce(Exchanged) -> candle_core::Result<T> + Send + 'static,
    ) -> Pending<T> {
        let (done, pending) = Pending::channel(self.rank);
        let job: Job = Box::new(move |worker: &mut Worker| {
            done.complete(worker.run(group, op, send, finish));
        });
        match self.jobs.as_ref().map(|jobs| jobs.send(Msg::Job(job))) {
            Some(Ok(())) => pending,
            _ => Pending::failed(CommError::WorkerGone { rank: self.rank }),
        }
    }
}

/// The communication thread: initialises MPI, reports the topology, runs jobs until every
/// sender is gone, then frees the communicators and finalises MPI.
fn communication_thread(
    ranks_per_node: Option<usize>,
    counters: Arc<AtomicCounters>,
    control: Arc<Control>,
    ready: mpsc::Sender<Result<(usize, Topology)>>,
    rx: mpsc::Receiver<Msg>,
) {
    let Some((universe, provided)) = mpi::initialize_with_threading(Threading::Funneled) else {
        let _ = ready.send(Err(CommError::MpiInitialised));
        return;
    };
    if provided == Threading::Single {
        let _ = ready.send(Err(CommError::MpiNoThreads));
        return;
    }
    let mut worker = match Worker::new(universe.world(), ranks_per_node, counters, control) {
        Ok(worker) => worker,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    if ready.send(Ok((worker.rank, worker.topology))).is_err() {
        return;
    }
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Job(job) => job(&mut worker),
            Msg::Abort => worker.check_abort(),
        }
    }
    drop(worker);
    drop(universe); // MPI_Finalize
}

impl Worker {
    /// Finds the topology and splits the world into the node and inter-node communicators.
    fn new(
        world: SimpleCommunicator,
        ranks_per_node: Option<usize>,
        counters: Arc<AtomicCounters>,
        control: Arc<Control>,
    ) -> Result<Worker> {
        let rank = world.rank() as usize;
        let size = world.size() as usize;
        let per_node = match ranks_per_node {
            Some(d) => d,
            None => host_ranks_per_node(&world)?,
        };
        let topology = Topology::new(size, per_node)?;
        let split = |color: usize| {
            world
                .split_by_color_with_key(Color::with_value(color as i32), rank as i32)
                .ok_or(CommError::MpiSplit)
        };
        let intra = split(topology.node_of(rank))?;
        let inter = split(topology.local_rank(rank))?;
        Ok(Worker {
            rank,
            topology,
            world,
            intra,
            inter,
            control,
            counters,
            seq: [0; 3],
        })
    }

    fn comm(&self, group: Group) -> &SimpleCommunicator {
        match group {
            Group::World => &self.world,
            Group::IntraNode => &self.intra,
            Group::InterNode => &self.inter,
        }
    }

    /// One collective: header exchange and checks, data exchange, my result, counters.
    fn run<T>(
        &mut self,
        group: Group,
        op: Op,
        send: Option<Tensor>,
        finish: impl FnOnce(Exchanged) -> candle_core::Result<T>,
    ) -> Result<T> {
        self.check_abort();
        let g = group.index();
        let seq = self.seq[g];
        self.seq[g] += 1;
        let watch = Watch {
            rank: self.rank,
            op: op.name(),
            group,
            seq,
            start: Instant::now(),
            control: &self.control,
            world: &self.world,
        };
        let members = self.topology.members(group, self.rank);
        let (n, me) = (members.len(), self.topology.group_rank(group, self.rank));
        let tensor_error = |e| CommError::tensor(op.name(), e);
        // Bytes of my buffer, and its length and dtype.
        let (bytes, len, dtype) = match &send {
            Some(t) => (
                tensor_bytes(t).map_err(tensor_error)?,
                t.elem_count(),
                Some(t.dtype()),
            ),
            None => (Vec::new(), 0, None),
        };
        let dtype_index = match dtype {
            None => u64::MAX,
            Some(d) => match DTYPES.iter().position(|&x| x == d) {
                Some(i) => i as u64,
                None => {
                    return Err(CommError::UnsupportedDType {
                        op: op.name(),
                        dtype: d,
                        takes: DTYPE_NAMES,
                    })
                }
            },
        };
        let [code, root] = encode(op);
        let mine = [code, root, len as u64, dtype_index];
        let comm = self.comm(group);

        let mut headers = vec![0u64; n * HEADER];
        mpi::request::scope(|scope| {
            watch.poll(comm.immediate_all_gather_into(scope, &mine[..], &mut headers[..]))
        });
        if let Some(j) = (0..n).find(|&j| headers[j * HEADER..(j + 1) * HEADER] != mine) {
            return Err(CommError::Mismatch {
                group,
                seq,
                rank: self.rank,
                ours: describe(&mine),
                peer: members[j],
                theirs: describe(&headers[j * HEADER..(j + 1) * HEADER]),
            });
        }
        match op {
            Op::AllToAll | Op::ReduceScatter if len % n != 0 => {
                return Err(CommError::Indivisible {
                    op: op.name(),
                    len,
                    parts: n,
                })
            }
            Op::Broadcast { root } if root >= n => {
                return Err(CommError::BadRoot { root, size: n })
            }
            _ => {}
        }
        // rsmpi counts in i32: the largest buffer, the all-gather's result, must fit.
        let largest = match op {
            Op::AllGather | Op::AllReduce => bytes.len() * n,
            _ => bytes.len(),
        };
        if largest > i32::MAX as usize {
            return Err(CommError::TooLarge {
                op: op.name(),
                bytes: largest,
                limit: i32::MAX as usize,
            });
        }

        let received = match op {
            Op::AllGather | Op::AllReduce => {
                let mut out = vec![0u8; bytes.len() * n];
                mpi::request::scope(|scope| {
                    watch.poll(comm.immediate_all_gather_into(scope, &bytes[..], &mut out[..]))
                });
                out
            }
            Op::AllToAll | Op::ReduceScatter => {
                let mut out = vec![0u8; bytes.len()];
                mpi::request::scope(|scope| {
                    watch.poll(comm.immediate_all_to_all_into(scope, &bytes[..], &mut out[..]))
                });
                out
            }
            Op::Broadcast { root } if root != me => {
                let mut out = vec![0u8; bytes.len()];
                mpi::request::scope(|scope| {
                    let root = comm.process_at_rank(root as i32);
                    watch.poll(root.immediate_broadcast_into(scope, &mut out[..]))
                });
                out
            }
            Op::Broadcast { .. } => {
                let mut out = bytes;
                mpi::request::scope(|scope| {
                    let root = comm.process_at_rank(me as i32);
                    watch.poll(root.immediate_broadcast_into(scope, &mut out[..]))
                });
                Vec::new()
            }
            Op::Barrier => Vec::new(),
        };
        let result = finish(Exchanged {
            mine: send,
            received,
            dtype: dtype.unwrap_or(DType::U8),
            parts: n,
            me,
        })
        .map_err(tensor_error)?;
        let size = dtype.map_or(1, |d| d.size_in_bytes());
        let bytes = op.bytes_per_peer(len, size, n, me);
        self.counters
            .count(&self.topology, self.rank, &members, |_| bytes);
        Ok(result)
    }

    /// Aborts the job if [`Communicator::abort`] was called.
    fn check_abort(&self) {
        if self.control.aborting.load(Ordering::SeqCst) {
            self.world.abort(ABORT_CODE);
        }
    }
}

/// The ranks per node of the hosts: the size of my `MPI_Comm_split_type` shared communicator,
/// checked to be the same on every host and to hold consecutive world ranks.
fn host_ranks_per_node(world: &SimpleCommunicator) -> Result<usize> {
    let rank = world.rank();
    let host = world.split_shared(rank);
    let mut host_ranks = vec![0i32; host.size() as usize];
    host.all_gather_into(&rank, &mut host_ranks[..]);
    let d = host_ranks.len() as i32;
    let consecutive = host_ranks[0] % d == 0
        && host_ranks
            .iter()
            .enumerate()
            .all(|(i, &r)| r == host_ranks[0] + i as i32);
    let mine = [d, consecutive as i32];
    let mut all = vec![0i32; 2 * world.size() as usize];
    world.all_gather_into(&mine[..], &mut all[..]);
    for (r, pair) in all.chunks_exact(2).enumerate() {
        if pair[0] != d {
            return Err(CommError::UnevenHosts {
                rank: rank as usize,
                ranks: d as usize,
                other: r,
                other_ranks: pair[0] as usize,
            });
        }
        if pair[1] == 0 {
            return Err(CommError::HostNotConsecutive {
                rank: r,
                per_host: d as usize,
            });
        }
    }
    Ok(d as usize)
}

/// One collective's wait for its requests: polls, and aborts the job on timeout or abort.
struct Watch<'a> {
    rank: usize,
    op: &'static str,
    group: Group,
    seq: u64,
    start: Instant,
    control: &'a Control,
    world: &'a SimpleCommunicator,
}

impl Watch<'_> {
    /// Tests `request` until it completes, yielding then sleeping (up to 1 ms) between tests so
    /// that oversubscribed ranks leave the cores to their peers.
    fn poll<'a, D: ?Sized>(&self, mut request: Request<'a, D, &LocalScope<'a>>) {
        let mut tries: u64 = 0;
        loop {
            request = match request.test() {
                Ok(_) => return,
                Err(request) => request,
            };
            if self.control.aborting.load(Ordering::SeqCst) {
                self.world.abort(ABORT_CODE);
            }
            let waited = self.start.elapsed();
            let timeout = Duration::from_millis(self.control.timeout_ms.load(Ordering::Relaxed));
            if waited >= timeout {
                self.control.report(FailureReport::TimedOut {
                    backend: "MPI",
                    rank: self.rank,
                    op: self.op,
                    group: self.group,
                    seq: self.seq,
                    waited,
                });
                self.world.abort(ABORT_CODE);
            }
            tries += 1;
            if tries < 100 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros((tries - 100).min(1000)));
            }
        }
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn topology(&self) -> Topology {
        self.topology
    }

    fn all_gather(&self, group: Group, send: Tensor) -> Pending<Tensor> {
        self.submit(group, Op::AllGather, Some(send), |x| {
            x.on_my_device(x.tensor()?)
        })
    }

    fn all_to_all(&self, group: Group, send: Tensor) -> Pending<Tensor> {
        self.submit(group, Op::AllToAll, Some(send), |x| {
            x.on_my_device(x.tensor()?)
        })
    }

    fn reduce_scatter(&self, group: Group, send: Tensor) -> Pending<Tensor> {
        self.submit(group, Op::ReduceScatter, Some(send), |x| {
            x.on_my_device(x.sum_in_order()?)
        })
    }

    fn all_reduce(&self, group: Group, buf: Tensor) -> Pending<Tensor> {
        self.submit(group, Op::AllReduce, Some(buf), |x| {
            x.on_my_device(x.sum_in_order()?)
        })
    }

    fn broadcast(&self, group: Group, root: usize, buf: Tensor) -> Pending<Tensor> {
        self.submit(group, Op::Broadcast { root }, Some(buf), move |x| {
            if x.me == root {
                Ok(x.mine.clone().expect("a broadcast has a buffer"))
            } else {
                x.on_my_device(x.tensor()?)
            }
        })
    }

    fn barrier(&self, group: Group) -> Pending<()> {
        self.submit(group, Op::Barrier, None, |_| Ok(()))
    }

    fn counters(&self) -> ByteCounters {
        self.counters.snapshot()
    }

    /// Ends the whole job: reports [`FailureReport::AbortingJob`] to the program's handler
    /// (the first abort only), and the communication thread calls `MPI_Abort` on the world (at
    /// once, even while it waits in a collective). Does not return in practice: OpenMPI kills
    /// this process and every other one of the job, and `mpirun` exits non-zero. Should
    /// `MPI_Abort` not have ended the process after [`ABORT_GRACE`] (the communication thread is
    /// gone or stuck outside MPI), it returns, for the program to exit: an exit without
    /// finalising makes mpirun end the job all the same.
    fn abort(&self, reason: String) {
        if !self.control.aborting.swap(true, Ordering::SeqCst) {
            self.control.report(FailureReport::AbortingJob {
                rank: self.rank,
                reason,
            });
        }
        let woken = self
            .jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(Msg::Abort).is_ok());
        if woken {
            std::thread::sleep(ABORT_GRACE);
        }
    }

    /// At once on the caller's thread, each collective waited (MPI ranks are CPU processes).
    fn submit(&self, job: crate::Job) -> Pending<Vec<Tensor>> {
        crate::job::run_direct(self, job)
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        drop(self.jobs.take());
        // After an abort that did not end the process, the thread may be stuck: not joined.
        let aborting = self.control.aborting.load(Ordering::SeqCst);
        if let Some(thread) = self.thread.take().filter(|_| !aborting) {
            // The thread finalises MPI once the queue is drained.
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("topology", &self.topology)
            .finish()
    }
}
