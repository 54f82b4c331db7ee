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
//! default [`DEFAULT_TIMEOUT`]), or [`Communicator::abort`] was called, it prints one line to
//! stderr and calls `MPI_Abort` on the world, and OpenMPI ends every process of the job with a
//! non-zero exit. MPI cannot tell a rank that issued a different *number* of collectives on a
//! group, or collectives on different groups in an inconsistent order, from a slow one: such a
//! program hangs until the watchdog fires. A rank that dies (a crash, `kill -9`, `exit`
//! without finalising) is seen by `mpirun`, which kills the rest of the job at once.
//!
//! [`LocalComm`]: crate::LocalComm

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use mpi::request::{LocalScope, Request};
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};
use mpi::Threading;

use crate::counters::AtomicCounters;
use crate::op::Op;
use crate::{
    ByteCounters, CommError, Communicator, Group, Pending, Result, Topology, DEFAULT_TIMEOUT,
};

/// The exit code of the job when a rank aborts it or its watchdog fires.
const ABORT_CODE: i32 = 1;

/// How long [`Communicator::abort`] waits for the communication thread to call `MPI_Abort`
/// before ending the process itself.
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

/// The op as a header's first two words: a code and the root.
fn encode(op: Op) -> [u64; 2] {
    match op {
        Op::AllGather => [0, 0],
        Op::AllToAll => [1, 0],
        Op::ReduceScatter => [2, 0],
        Op::AllReduce => [3, 0],
        Op::Broadcast { root } => [4, root as u64],
        Op::Barrier => [5, 0],
    }
}

/// A header as the local backend words its call in [`CommError::Mismatch`].
fn describe(header: &[u64]) -> String {
    let (len, dtype) = (header[2] as usize, DTYPES.get(header[3] as usize).copied());
    let op = match header[0] {
        0 => Op::AllGather,
        1 => Op::AllToAll,
        2 => Op::ReduceScatter,
        3 => Op::AllReduce,
        4 => Op::Broadcast {
            root: header[1] as usize,
        },
        5 => Op::Barrier,
        _ => return format!("an unknown collective of {len} elements"),
    };
    op.describe(len, dtype)
}

/// The dtypes a buffer may have; a header names one by its index (none: a barrier).
const DTYPES: [DType; 10] = [
    DType::U8,
    DType::U32,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::BF16,
    DType::F16,
    DType::F32,
    DType::F64,
    DType::F8E4M3,
];

/// Words of a header: op code, root, length in elements, dtype index.
const HEADER: usize = 4;

impl MpiComm {
    /// Initialises MPI on a new communication thread and reads this process's rank and the
    /// world size from `MPI_COMM_WORLD`.
    ///
    /// Ranks per node are `ranks_per_node` if given (so that 4 processes on one host can stand
    /// for 2 nodes x 2), else the number of ranks sharing my host (`MPI_Comm_split_type`
    /// shared), which must be the same on every host, with each host's ranks consecutive
    /// (OpenMPI fills one host after another unless told otherwise; `--map-by node` is an
    /// error). Every rank reaches the same verdict, so a bad topology fails on all of them with
    /// [`CommError::BadTopology`]; so does a second `init` in one process ([`CommError::Mpi`]).
    pub fn init(ranks_per_node: Option<usize>) -> Result<MpiComm> {
        let counters = Arc::new(AtomicCounters::default());
        let control = Arc::new(Control {
            timeout_ms: AtomicU64::new(DEFAULT_TIMEOUT.as_millis() as u64),
            aborting: AtomicBool::new(false),
        });
        let (ready_tx, ready_rx) = mpsc::channel();
        let (jobs, rx) = mpsc::channel::<Msg>();
        let (c, k) = (counters.clone(), control.clone());
        let thread = std::thread::Builder::new()
            .name("comm-mpi".into())
            .spawn(move || communication_thread(ranks_per_node, c, k, ready_tx, rx))
            .map_err(|e| mpi_error("spawn the communication thread", e))?;
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
        let _ = ready.send(Err(CommError::Mpi {
            op: "MPI_Init_thread",
            message: "MPI is already initialised in this process".into(),
        }));
        return;
    };
    if provided == Threading::Single {
        let _ = ready.send(Err(CommError::Mpi {
            op: "MPI_Init_thread",
            message: "the MPI library offers no thread support (MPI_THREAD_SINGLE); \
                      the backend needs MPI_THREAD_FUNNELED"
                .into(),
        }));
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
                .ok_or_else(|| CommError::Mpi {
                    op: "MPI_Comm_split",
                    message: "no communicator came back".into(),
                })
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
            start: Instant::now(),
            control: &self.control,
            world: &self.world,
        };
        let members = self.topology.members(group, self.rank);
        let (n, me) = (members.len(), self.topology.group_rank(group, self.rank));
        let tensor_error = |e: candle_core::Error| CommError::Tensor {
            op: op.name(),
            message: e.to_string(),
        };
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
                    return Err(CommError::Tensor {
                        op: op.name(),
                        message: format!("the MPI backend does not move {d:?} buffers"),
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
            return Err(CommError::Mpi {
                op: op.name(),
                message: format!(
                    "a buffer of {largest} bytes is over MPI's count limit of 2^31 - 1"
                ),
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
            return Err(CommError::BadTopology(format!(
                "hosts run different numbers of ranks: rank {rank}'s host runs {d}, rank {r}'s \
                 runs {}; give ranks per node explicitly",
                pair[0]
            )));
        }
        if pair[1] == 0 {
            return Err(CommError::BadTopology(format!(
                "rank {r}'s host does not run consecutive ranks (rank = node x {d} + local \
                 rank); launch with mpirun --map-by slot"
            )));
        }
    }
    Ok(d as usize)
}

/// One collective's wait for its requests: polls, and aborts the job on timeout or abort.
struct Watch<'a> {
    rank: usize,
    op: &'static str,
    group: Group,
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
                eprintln!(
                    "error: rank {}: {} on {:?} waited {} s for its peers; aborting",
                    self.rank,
                    self.op,
                    self.group,
                    waited.as_secs()
                );
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

/// What a collective's exchange gave this member, for its `finish`.
struct Exchanged {
    /// My input.
    mine: Option<Tensor>,
    /// The bytes received: every member's contribution (or the slice for me), in group-rank
    /// order; for a broadcast, the root's buffer (empty at the root itself).
    received: Vec<u8>,
    dtype: DType,
    parts: usize,
    me: usize,
}

impl Exchanged {
    /// The received bytes as one CPU tensor.
    fn tensor(&self) -> candle_core::Result<Tensor> {
        let len = self.received.len() / self.dtype.size_in_bytes();
        Tensor::from_raw_buffer(&self.received, self.dtype, &[len], &Device::Cpu)
    }

    /// The received bytes split into one tensor per member, summed in group-rank order as the
    /// local backend does (`p0 + p1 + ...`, candle's add in the buffer's dtype).
    fn sum_in_order(&self) -> candle_core::Result<Tensor> {
        let all = self.tensor()?;
        let chunk = all.elem_count() / self.parts;
        let mut out = all.narrow(0, 0, chunk)?;
        for j in 1..self.parts {
            out = (out + all.narrow(0, j * chunk, chunk)?)?;
        }
        Ok(out)
    }

    /// `result`, moved back to the device my input was on.
    fn on_my_device(&self, result: Tensor) -> candle_core::Result<Tensor> {
        match &self.mine {
            Some(t) if !t.device().is_cpu() => result.to_device(t.device()),
            _ => Ok(result),
        }
    }
}

/// A tensor's elements as bytes (native order), copied to the CPU first if need be.
fn tensor_bytes(t: &Tensor) -> candle_core::Result<Vec<u8>> {
    let t = t.flatten_all()?.to_device(&Device::Cpu)?.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let range = layout.start_offset()..layout.start_offset() + t.elem_count();
    fn raw<T>(v: &[T]) -> Vec<u8> {
        // SAFETY: plain numbers without padding, read as the bytes they are made of.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
            .to_vec()
    }
    let Storage::Cpu(cpu) = &*storage else {
        candle_core::bail!("the tensor was copied to the CPU")
    };
    Ok(match cpu {
        CpuStorage::U8(v) => raw(&v[range]),
        CpuStorage::U32(v) => raw(&v[range]),
        CpuStorage::I16(v) => raw(&v[range]),
        CpuStorage::I32(v) => raw(&v[range]),
        CpuStorage::I64(v) => raw(&v[range]),
        CpuStorage::BF16(v) => raw(&v[range]),
        CpuStorage::F16(v) => raw(&v[range]),
        CpuStorage::F32(v) => raw(&v[range]),
        CpuStorage::F64(v) => raw(&v[range]),
        CpuStorage::F8E4M3(v) => raw(&v[range]),
        _ => candle_core::bail!("the MPI backend does not move {:?} buffers", t.dtype()),
    })
}

fn mpi_error(op: &'static str, e: impl std::fmt::Display) -> CommError {
    CommError::Mpi {
        op,
        message: e.to_string(),
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

    /// Ends the whole job: prints `error: rank R aborts the MPI job: REASON` to stderr, and the
    /// communication thread calls `MPI_Abort` on the world (at once, even while it waits in a
    /// collective). Does not return in practice: OpenMPI kills this process and every other one
    /// of the job, and `mpirun` exits non-zero. Only the first abort prints.
    fn abort(&self, reason: String) {
        if !self.control.aborting.swap(true, Ordering::SeqCst) {
            eprintln!("error: rank {} aborts the MPI job: {reason}", self.rank);
        }
        let woken = self
            .jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(Msg::Abort).is_ok());
        if woken {
            std::thread::sleep(ABORT_GRACE);
        }
        // The communication thread is gone or stuck outside MPI: an exit without finalising
        // makes mpirun end the job all the same.
        eprintln!(
            "error: rank {}: MPI_Abort did not end the process; exiting",
            self.rank
        );
        std::process::exit(ABORT_CODE);
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
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
