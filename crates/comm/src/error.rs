use std::sync::Arc;

use crate::Group;

/// Errors of a collective.
///
/// A collective fails on *every* member or on none: backends check lengths and arguments only
/// once all members have arrived, so no rank is left waiting for a partner that has given up.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CommError {
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
    /// A tensor operation of a collective failed (a dtype the collective does not take, or a
    /// device error).
    #[error("{op}: {message}")]
    Tensor { op: &'static str, message: String },
    /// An NCCL call failed (`message` is NCCL's result code).
    #[error("NCCL {op}: {message}")]
    Nccl { op: &'static str, message: String },
    /// A CUDA driver call of a collective failed (stream, event or context).
    #[error("CUDA {op}: {message}")]
    Cuda { op: &'static str, message: String },
    /// A CUDA kernel of a backend (`op` names what it is for) could not be compiled (NVRTC) or
    /// loaded (`kernels::loader`); shared behind an `Arc` so that the error stays `Clone`.
    #[error("{op}: CUDA kernel")]
    Kernel {
        op: &'static str,
        #[source]
        source: Arc<kernels::KernelError>,
    },
    /// An MPI call of the MPI backend failed, or MPI cannot do what was asked (`message` says
    /// why).
    #[error("MPI {op}: {message}")]
    Mpi { op: &'static str, message: String },
    /// A topology that cannot exist.
    #[error("invalid topology: {0}")]
    BadTopology(String),
    /// The launcher's environment (torchrun, mpirun or slurm variables) is incomplete, malformed
    /// or disagrees with the configuration; the message names the variable and its value.
    #[error("{0}")]
    Launch(String),
    /// The TCP rendezvous that bootstraps a multi-process world failed (every process that took
    /// part fails with the same message).
    #[error("bootstrap: {0}")]
    Bootstrap(String),
}

pub type Result<T> = std::result::Result<T, CommError>;
