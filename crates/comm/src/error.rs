//! The crate's one error type, [`CommError`], with the launcher's and the bootstrap's errors
//! ([`LaunchError`](crate::launch::LaunchError), [`BootstrapError`]) nested in it. The bootstrap's
//! error lives here rather than in [`crate::bootstrap`] because the two nest each other (rank 0's
//! payload fails with a [`CommError`]).
//!
//! A variant's message says what failed and carries its data; the cause underneath (an io,
//! candle or CUDA error) is its `source`, never repeated in the message, so a program that
//! prints the whole chain (`anyhow`'s `{:#}`) prints each cause once. Sources are behind an
//! `Arc` so that the error stays `Clone`: a collective's error goes to every waiter.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, DeviceLocation};

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

/// What went wrong in the rendezvous. Rank 0 sends its error to every peer that connected
/// ([`BootstrapError::FromRankZero`] there), so every process of the world fails with the same
/// line.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    // ---- the arguments ----
    /// A rank outside its world.
    #[error("bootstrap: rank {rank} is not below world size {world}")]
    RankOutOfWorld { rank: usize, world: usize },
    /// Rank 0's address is not `HOST:PORT`.
    #[error("bootstrap: {addr:?} is not HOST:PORT (check MASTER_ADDR and MASTER_PORT)")]
    BadAddress { addr: String },

    // ---- rank 0's view ----
    /// Rank 0 cannot listen on its port.
    #[error(
        "bootstrap: rank 0 cannot listen on {addr} (is MASTER_PORT={} used by another job?)",
        addr.port()
    )]
    Listen {
        addr: SocketAddr,
        #[source]
        source: Arc<io::Error>,
    },
    /// Ranks that had not connected at the timeout.
    #[error(
        "bootstrap: only {} of {world} ranks connected to {addr} within {} (missing: {})",
        world - missing.len(),
        seconds(*timeout),
        rank_list(missing)
    )]
    MissingRanks {
        world: usize,
        addr: SocketAddr,
        timeout: Duration,
        missing: Vec<usize>,
    },
    /// A peer of another protocol version (another build of the trainer).
    #[error(
        "bootstrap: rank {rank} speaks bootstrap protocol version {theirs}, rank 0 version \
         {ours} (different trainer builds?)"
    )]
    Version { rank: u64, theirs: u32, ours: u32 },
    /// A peer started with another world size.
    #[error("bootstrap: rank {rank} was started with world size {theirs}, rank 0 with {ours}")]
    WorldSize { rank: u64, theirs: u64, ours: usize },
    /// A peer whose rank is outside the world.
    #[error("bootstrap: a process connected as rank {rank}, outside the world of {world} ranks")]
    RankOutside { rank: u64, world: usize },
    /// Two processes with one rank.
    #[error(
        "bootstrap: two processes were started as rank {rank} (check the launcher's rank \
         variables)"
    )]
    DuplicateRank { rank: u64 },
    /// Rank 0 could not make the payload.
    #[error("bootstrap: rank 0 could not make the payload")]
    Payload {
        #[source]
        source: Box<CommError>,
    },
    /// Rank 0 could not send the payload to a peer.
    #[error("bootstrap: could not send the payload to rank {rank}")]
    Send {
        rank: usize,
        #[source]
        source: Arc<io::Error>,
    },
    /// A peer did not confirm that it holds the payload.
    #[error("bootstrap: rank {rank} did not confirm the payload")]
    NoConfirmation {
        rank: usize,
        #[source]
        source: Arc<io::Error>,
    },

    // ---- a peer's view ----
    /// `MASTER_ADDR` does not resolve.
    #[error("bootstrap: cannot resolve MASTER_ADDR {host:?}")]
    Resolve {
        host: String,
        #[source]
        source: Arc<io::Error>,
    },
    /// `MASTER_ADDR` resolves to no address.
    #[error("bootstrap: cannot resolve MASTER_ADDR {host:?} (no addresses)")]
    NoAddresses { host: String },
    /// Nothing accepted the connection until the timeout.
    #[error(
        "bootstrap: nothing listening at {addr} after {} (is rank 0 running, and are \
         MASTER_ADDR/MASTER_PORT right?)",
        seconds(*timeout)
    )]
    NothingListening { addr: String, timeout: Duration },
    /// Rank 0 sent nothing within `waited` (`what`: the step, e.g. "no reply from").
    #[error("bootstrap: {what} rank 0 at {addr}: rank 0 sent nothing within {}", seconds(*waited))]
    Silent {
        what: &'static str,
        addr: String,
        waited: Duration,
    },
    /// Rank 0 closed the connection.
    #[error("bootstrap: {what} rank 0 at {addr}: rank 0 closed the connection")]
    Closed { what: &'static str, addr: String },
    /// Another socket error talking to rank 0.
    #[error("bootstrap: {what} rank 0 at {addr}")]
    Io {
        what: &'static str,
        addr: String,
        #[source]
        source: Arc<io::Error>,
    },
    /// The reply is not our protocol's.
    #[error(
        "bootstrap: {addr} is not a trainer's rank 0 (unexpected reply; is MASTER_PORT used by \
         another program?)"
    )]
    NotRankZero { addr: String },
    /// A reply longer than any payload.
    #[error("bootstrap: rank 0 at {addr} announced {len} bytes, more than the limit of {limit}")]
    TooLong { addr: String, len: u64, limit: u64 },
    /// A reply status this build does not know.
    #[error("bootstrap: rank 0 at {addr} replied with unknown status {status}")]
    UnknownStatus { addr: String, status: u8 },
    /// Rank 0's error, as rank 0 wrote it (its whole cause chain on one line).
    #[error("{message}")]
    FromRankZero { message: String },

    // ---- the NCCL payload (feature `cuda`) ----
    /// The configured topology against the launched world.
    #[error(
        "bootstrap: the topology of {nodes} nodes x {ranks_per_node} ranks does not match the \
         {world} ranks the launcher ({launcher}) started"
    )]
    TopologyNotLaunch {
        nodes: usize,
        ranks_per_node: usize,
        world: usize,
        launcher: crate::launch::Launcher,
    },
    /// A payload too short to hold rank 0's topology.
    #[error("bootstrap: rank 0 sent {len} bytes, too short for NCCL ids")]
    ShortPayload { len: usize },
    /// Rank 0 and this rank disagree on the topology.
    #[error(
        "bootstrap: rank 0 uses {} nodes x {} ranks, rank {rank} uses {} x {} (is \
         dist.gpus_per_node the same for every rank?)",
        theirs.0, theirs.1, ours.0, ours.1
    )]
    TopologyMismatch {
        rank: usize,
        theirs: (u64, u64),
        ours: (u64, u64),
    },
}

/// The first 16 ranks of `ranks`, then how many more.
fn rank_list(ranks: &[usize]) -> String {
    let mut list: Vec<String> = ranks.iter().take(16).map(|r| r.to_string()).collect();
    if ranks.len() > 16 {
        list.push(format!("... {} more", ranks.len() - 16));
    }
    list.join(", ")
}

/// A duration for messages: `60 s`, `1.5 s`.
fn seconds(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}
