//! The crate's one error type, [`CommError`], with the launcher's and the bootstrap's errors
//! ([`LaunchError`](crate::launch::LaunchError), [`BootstrapError`](crate::bootstrap::BootstrapError))
//! nested in it.
//!
//! A variant's message says what failed and carries its data; the cause underneath (an io,
//! candle or CUDA error) is its `source`, never repeated in the message, so a program that
//! prints the whole chain (`anyhow`'s `{:#}`) prints each cause once. Sources are behind an
//! `Arc` so that the error stays `Clone`: a collective's error goes to every waiter.

use std::sync::Arc;

use candle_core::{DType, DeviceLocation};

use crate::bootstrap::BootstrapError;
use crate::launch::LaunchError;
use crate::Group;

/// A cause of any type behind an `Arc` (a CUDA driver error, which exists only in a `cuda` build).
pub type SharedSource = Arc<dyn std::error::Error + Send + Sync>;

/// Errors of a collective, of a backend, and of launching a world.
///
/// A collective fails on *every* member or on none: backends check lengths and arguments only
/// once all members have arrived, so no rank is left waiting for a partner that has given up.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    // ---- a collective's arguments ----
    /// A buffer's length does not fit the collective and the group size.
    #[error("{op}: buffer of {got} elements, expected {expected}")]
    BadLength {
        op: &'static str,
        got: usize,
        expected: usize,
    },
    /// A buffer that must split into one equal chunk per group member does not.
    #[error("{op}: buffer of {len} elements does not split into {parts} equal chunks")]
    Indivisible {
        op: &'static str,
        len: usize,
        parts: usize,
    },
    /// A broadcast root that is not a member of the group.
    #[error("broadcast: root {root} is not a group rank of a group of {size}")]
    BadRoot { root: usize, size: usize },
    /// Members of a group issued different collectives (or different lengths or roots) at the
    /// same place in their sequence of collectives on that group: a program bug.
    #[error(
        "collective #{seq} on {group:?}: rank {rank} issued {ours}, rank {peer} issued {theirs}"
    )]
    Mismatch {
        group: Group,
        seq: u64,
        rank: usize,
        ours: String,
        peer: usize,
        theirs: String,
    },
    /// A buffer of a dtype the collective does not take (`takes` lists those it does).
    #[error("{op}: takes {takes} buffers, got {dtype:?}")]
    UnsupportedDType {
        op: &'static str,
        dtype: DType,
        takes: &'static str,
    },
    /// A buffer on another device than the communicator's.
    #[error("{op}: the buffer is on {buffer:?}, the communicator on {comm:?}")]
    WrongDevice {
        op: &'static str,
        buffer: DeviceLocation,
        comm: DeviceLocation,
    },
    /// A buffer larger than the backend's count type can address (MPI counts in `i32`).
    #[error("{op}: a buffer of {bytes} bytes is over the backend's count limit of {limit}")]
    TooLarge {
        op: &'static str,
        bytes: usize,
        limit: usize,
    },

    // ---- the world gives up ----
    /// The world was aborted: `rank` failed (or dropped its communicator while peers still
    /// expected it), so every pending and future collective fails.
    #[error("rank {rank} failed: {reason}")]
    Aborted { rank: usize, reason: String },
    /// A collective waited longer than the backend's limit for its peers: a last resort against
    /// hangs, when no rank reported a failure.
    #[error("{op} #{seq} on {group:?}: rank {rank} waited {waited_s} s for its peers")]
    Timeout {
        op: &'static str,
        group: Group,
        seq: u64,
        rank: usize,
        waited_s: u64,
    },
    /// The thread executing this rank's collectives is gone (it panicked): an internal bug.
    #[error("rank {rank}: the communication thread is gone")]
    WorkerGone { rank: usize },
    /// A thread the backend needs (`what`) could not be started.
    #[error("cannot start the {what} thread")]
    Spawn {
        what: &'static str,
        #[source]
        source: Arc<std::io::Error>,
    },

    /// The caller's own work inside a job ([`crate::Job`] `label`) failed: a kernel, a tensor
    /// operation.
    #[error("job {label}")]
    Job {
        label: &'static str,
        #[source]
        source: SharedSource,
    },

    // ---- the layers underneath ----
    /// A tensor operation of a collective (`op`) failed: a copy, an add, a device error.
    #[error("{op}: tensor operation failed")]
    Tensor {
        op: &'static str,
        #[source]
        source: Arc<candle_core::Error>,
    },
    /// An NCCL call failed with result `code` (NCCL's name for it, e.g. `ncclSystemError`).
    #[error("NCCL {op}: {code}")]
    Nccl { op: &'static str, code: String },
    /// A CUDA driver call of a collective failed (stream, event or context).
    #[error("CUDA {op}")]
    Cuda {
        op: &'static str,
        #[source]
        source: SharedSource,
    },
    /// A CUDA kernel of a backend (`op` names what it is for) could not be compiled (NVRTC) or
    /// loaded (`kernels::loader`).
    #[error("{op}: CUDA kernel")]
    Kernel {
        op: &'static str,
        #[source]
        source: Arc<kernels::KernelError>,
    },
    /// `MPI_Init_thread` was called before in this process (one `MpiComm` a process).
    #[error("MPI_Init_thread: MPI is already initialised in this process")]
    MpiInitialised,
    /// The MPI library offers no thread support; the MPI backend needs `MPI_THREAD_FUNNELED`.
    #[error(
        "MPI_Init_thread: the MPI library offers no thread support (MPI_THREAD_SINGLE); \
         the backend needs MPI_THREAD_FUNNELED"
    )]
    MpiNoThreads,
    /// `MPI_Comm_split` gave no communicator back.
    #[error("MPI_Comm_split: no communicator came back")]
    MpiSplit,

    // ---- topology ----
    /// A world that does not split into nodes of `ranks_per_node`.
    #[error(
        "invalid topology: world size {world} is not a positive multiple of {ranks_per_node} \
         ranks per node"
    )]
    BadTopology { world: usize, ranks_per_node: usize },
    /// A rank outside its world.
    #[error("invalid topology: rank {rank} in a world of {world}")]
    RankOutsideWorld { rank: usize, world: usize },
    /// The hosts of an MPI job run different numbers of ranks (`rank`'s host `ranks`, `other`'s
    /// host `other_ranks`).
    #[error(
        "invalid topology: hosts run different numbers of ranks: rank {rank}'s host runs {ranks}, \
         rank {other}'s runs {other_ranks}; give ranks per node explicitly"
    )]
    UnevenHosts {
        rank: usize,
        ranks: usize,
        other: usize,
        other_ranks: usize,
    },
    /// A host of an MPI job whose ranks are not consecutive (rank = node x D + local rank).
    #[error(
        "invalid topology: rank {rank}'s host does not run consecutive ranks (rank = node x \
         {per_host} + local rank); launch with mpirun --map-by slot"
    )]
    HostNotConsecutive { rank: usize, per_host: usize },
    /// An emulated link ([`crate::link`]) whose rate is not finite and positive, or shared by
    /// no rank.
    #[error(
        "an emulated link of {gbit_per_s} Gb/s shared by {ranks_per_node} ranks: the rate must \
         be finite and positive"
    )]
    BadLink {
        gbit_per_s: f64,
        ranks_per_node: usize,
    },

    // ---- launching a world ----
    /// The launcher's environment is incomplete, malformed, or disagrees with the configuration.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The TCP rendezvous that bootstraps a multi-process world failed.
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
}

impl CommError {
    /// A failed tensor operation of `op`.
    pub(crate) fn tensor(op: &'static str, source: candle_core::Error) -> Self {
        CommError::Tensor {
            op,
            source: Arc::new(source),
        }
    }

    /// A thread (`what`) the OS would not start.
    #[cfg_attr(not(any(feature = "mpi", feature = "cuda")), allow(dead_code))]
    pub(crate) fn spawn(what: &'static str, source: std::io::Error) -> Self {
        CommError::Spawn {
            what,
            source: Arc::new(source),
        }
    }
}

/// `Result` with [`CommError`] unless told otherwise.
pub type Result<T, E = CommError> = std::result::Result<T, E>;

/// `error` and its causes on one line, `outer: cause: cause`, as a program prints them: what
/// rank 0 of the bootstrap sends the peers, so that every process fails with the same line.
pub(crate) fn one_line(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        line.push_str(": ");
        line.push_str(&e.to_string());
        cause = e.source();
    }
    line
}
