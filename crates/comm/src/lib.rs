//! Collective communication for the ZeRO engine.
//!
//! A [`Communicator`] moves buffers between the ranks of a [`Topology`] of `nodes x
//! ranks_per_node` (rank = node x D + local rank) over three groups: the world, the ranks of my
//! node, and the ranks with my local index on every node. Collectives are asynchronous: each
//! call returns a [`Pending`] at once, the rank's collectives run in issue order, and
//! [`Pending::wait`] gives the result, so the engine overlaps a prefetched gather with compute.
//!
//! Buffers are 1-D candle tensors, on the CPU or a GPU. Backends: [`Solo`] (one rank, every
//! collective returns its input), [`LocalComm`] (W ranks as threads of one process, on the CPU
//! or sharing one GPU, see [`run_local`]), with feature `cuda` NCCL, and with feature `mpi`
//! MPI. Every backend counts the logical bytes it sends per link kind ([`ByteCounters`]), the
//! paper's volume accounting.
//!
//! Failures are [`CommError`]s that keep their causes as sources. The library never prints and
//! never ends the process: a backend that gives up on its world without a caller to return to
//! (a watchdog, an MPI abort) hands a [`FailureReport`] to the program's [`FailureHandler`].
//!
//! ```
//! use comm::{run_local, Communicator, Group, HostCollectives, Topology};
//!
//! // 2 nodes x 2 ranks: sum rank-dependent values over each node.
//! let topology = Topology::new(4, 2)?;
//! let sums = run_local(topology, |comm| {
//!     let mine = vec![comm.rank() as f32, 10.0];
//!     comm.all_reduce_f32(Group::IntraNode, mine).wait()
//! })?;
//! assert_eq!(sums, vec![vec![1.0, 20.0], vec![1.0, 20.0], vec![5.0, 20.0], vec![5.0, 20.0]]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod bootstrap;
mod counters;
mod error;
mod failure;
#[cfg(feature = "cuda")]
mod gpu;
pub mod job;
mod job_time;
pub mod launch;
pub mod link;
mod local;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "cuda")]
mod nccl;
mod op;
mod pending;
mod shared;
mod solo;
mod timed;
mod topology;

pub use counters::ByteCounters;
pub use error::{CommError, Result, SharedSource};
pub use failure::{FailureHandler, FailureReport};
pub use job::{Job, JobClock, JobTime, Lane};
pub use local::{
    local_world, local_world_with_timeout, run_local, run_local_with_timeout, LocalComm,
    LocalRunError, DEFAULT_TIMEOUT,
};
#[cfg(feature = "mpi")]
pub use mpi::MpiComm;
#[cfg(feature = "cuda")]
pub use nccl::{NcclComm, NcclIds};
pub use pending::Pending;
pub use solo::Solo;
pub use timed::{DeviceWaitClock, Timed, WaitClock};
pub use topology::{Group, Topology};

use candle_core::Tensor;

/// Asynchronous collectives over the groups of one rank's [`Topology`].
///
/// Buffers are 1-D candle [`Tensor`]s on the rank's device (CPU, or a GPU: the local backend then
/// moves them with device-to-device copies, NCCL in place). Every member of a group must issue the
/// same collectives on that group in the same order, with the same lengths and dtypes; each call
/// returns at once and the rank's collectives execute in issue order. Implementors must:
/// - make every reduction deterministic: sum in group-rank order, so the same inputs give bitwise
///   the same output whatever the timing (NCCL: whatever its algorithm gives, run to run);
/// - fail a collective on every member alike when the members disagree (op, length, dtype, root),
///   and never hang when one rank fails: after [`Communicator::abort`] every pending and future
///   collective of every rank fails with [`CommError::Aborted`];
/// - count in [`Communicator::counters`] the logical bytes of each collective as documented on
///   [`ByteCounters`] (elements x dtype size), whatever algorithm they use inside.
///
/// They must not reorder a rank's collectives on one group, or block the caller in the issuing
/// call.
///
/// Callers must issue collectives on *different* groups in an order that is consistent across
/// ranks (as with one NCCL stream): a backend may execute all of a rank's collectives one after
/// another, so rank A issuing intra-node then world while rank B issues world then intra-node
/// can deadlock (the local backend then fails with [`CommError::Timeout`]). Any dtype moves
/// (bf16, INT8 codes as `u8`, f32 scales); reductions take float tensors.
pub trait Communicator: Send + Sync {
    /// This rank's world rank.
    fn rank(&self) -> usize;
    /// The nodes x ranks-per-node layout this communicator spans.
    fn topology(&self) -> Topology;
    /// Every member contributes `send` (the same length on all); the result is all
    /// contributions concatenated in group-rank order.
    fn all_gather(&self, group: Group, send: Tensor) -> Pending<Tensor>;
    /// `send` is n equal chunks (n = group size); chunk j goes to member j; result chunk j came
    /// from member j.
    fn all_to_all(&self, group: Group, send: Tensor) -> Pending<Tensor>;
    /// `send` (length divisible by n) is summed over the group; member i gets slice i of the sum.
    fn reduce_scatter(&self, group: Group, send: Tensor) -> Pending<Tensor>;
    /// `buf` summed over the group; every member gets the whole sum.
    fn all_reduce(&self, group: Group, buf: Tensor) -> Pending<Tensor>;
    /// Member `root` (a group rank)'s `buf` to every member; the others pass a buffer of the
    /// same length and dtype, whose contents are ignored.
    fn broadcast(&self, group: Group, root: usize, buf: Tensor) -> Pending<Tensor>;
    /// Completes once every member has issued it.
    fn barrier(&self, group: Group) -> Pending<()>;
    /// Logical bytes this rank has sent so far, split intra/inter node (see [`ByteCounters`]).
    fn counters(&self) -> ByteCounters;
    /// Fails every pending and future collective of every rank of this world with
    /// `CommError::Aborted { rank: self.rank(), reason }`. Only the first abort is kept.
    fn abort(&self, reason: String);
    /// Starts timing on the device how long the compute stream waits for this communicator's
    /// collectives (from now on), and returns the clock that reads it; `None` where waiting
    /// blocks the host instead (CPU backends, the local backend), so that [`Timed`] measures it.
    /// The `nccl` backend's `wait` only makes the compute stream wait, so its exposed
    /// communication is visible on the device alone.
    fn device_wait_clock(&self) -> Option<DeviceWaitClock> {
        None
    }
    /// Queues `job` (collectives and the caller's kernels between them, see [`job`]) on this
    /// rank's communication side, after every collective and job issued before it; `wait` gives
    /// its results once the caller's compute may read them. Backends without a communication
    /// side of their own run it at once with [`job::run_direct`].
    fn submit(&self, job: Job) -> Pending<Vec<Tensor>>;
    /// Starts timing this communicator's jobs by label (from now on) and returns the clock that
    /// reads it: how long the communication side was busy with each label and how long compute
    /// waited for it; `None` where jobs are not timed (they run at once, [`job::run_direct`]).
    fn job_clock(&self) -> Option<JobClock> {
        None
    }
}

/// The collectives on host vectors, for scalars, tests and tools: each wraps the vector in a CPU
/// tensor and reads the result back.
pub trait HostCollectives: Communicator {
    fn all_gather_bytes(&self, group: Group, send: Vec<u8>) -> Pending<Vec<u8>> {
        self.all_gather(group, host_tensor(send)).map(host_vec)
    }
    fn all_to_all_bytes(&self, group: Group, send: Vec<u8>) -> Pending<Vec<u8>> {
        self.all_to_all(group, host_tensor(send)).map(host_vec)
    }
    fn broadcast_bytes(&self, group: Group, root: usize, buf: Vec<u8>) -> Pending<Vec<u8>> {
        self.broadcast(group, root, host_tensor(buf)).map(host_vec)
    }
    fn reduce_scatter_f32(&self, group: Group, send: Vec<f32>) -> Pending<Vec<f32>> {
        self.reduce_scatter(group, host_tensor(send)).map(host_vec)
    }
    fn all_reduce_f32(&self, group: Group, buf: Vec<f32>) -> Pending<Vec<f32>> {
        self.all_reduce(group, host_tensor(buf)).map(host_vec)
    }
}

impl<C: Communicator + ?Sized> HostCollectives for C {}

fn host_tensor<T: candle_core::WithDType>(v: Vec<T>) -> Tensor {
    let n = v.len();
    Tensor::from_vec(v, n, &candle_core::Device::Cpu).expect("a vector is a 1-D tensor")
}

fn host_vec<T: candle_core::WithDType>(t: Tensor) -> Result<Vec<T>> {
    t.to_vec1::<T>()
        .map_err(|e| CommError::tensor("read back", e))
}

/// `f32` values as little-endian bytes, for byte collectives.
pub fn f32_to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes back to `f32` values.
///
/// # Panics
/// If `b.len()` is not a multiple of 4: the bytes did not come from [`f32_to_bytes`].
pub fn bytes_to_f32(b: &[u8]) -> Vec<f32> {
    assert!(
        b.len().is_multiple_of(4),
        "bytes_to_f32: {} bytes are not whole f32 values",
        b.len()
    );
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
