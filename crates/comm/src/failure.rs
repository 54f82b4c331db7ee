//! How a multi-process backend tells the program that it is giving up on its world.
//!
//! The library never prints and never ends the process on its own. Where a backend must act
//! without a caller to return an error to (a watchdog thread, an abort that ends the job), it
//! hands a [`FailureReport`] to the [`FailureHandler`] the program set
//! (`NcclComm::set_failure_handler`, `MpiComm::set_failure_handler`), and the program decides:
//! print it, and, for [`FailureReport::StillBlocked`], exit. Without a handler the reports are
//! dropped.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::Group;

/// What a backend reports as it gives up on its world.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum FailureReport {
    /// Rank `rank`'s collective `op` #`seq` on `group` has waited `waited` for its peers, past
    /// the timeout: a peer died or hung. The backend now aborts: NCCL its communicators (the
    /// waiting host threads then fail with [`CommError::Aborted`](crate::CommError::Aborted)),
    /// MPI the whole job (`MPI_Abort`: no MPI collective can be cancelled).
    TimedOut {
        backend: &'static str,
        rank: usize,
        op: &'static str,
        group: Group,
        seq: u64,
        waited: Duration,
    },
    /// Rank `rank` aborts the MPI job (`Communicator::abort`) for `reason`: `MPI_Abort` ends
    /// every process of the job next.
    AbortingJob { rank: usize, reason: String },
    /// Rank `rank` is still alive `after` its NCCL watchdog began to abort: a host thread is
    /// stuck in a CUDA or NCCL call that the abort did not release, which nothing inside the
    /// process can interrupt. Only ending the process helps.
    StillBlocked { rank: usize, after: Duration },
}

impl fmt::Display for FailureReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureReport::TimedOut {
                backend,
                rank,
                op,
                group,
                seq,
                waited,
            } => write!(
                f,
                "rank {rank}: {op} #{seq} on {group:?} waited {} s for its peers (a peer died \
                 or hung); aborting {backend}",
                waited.as_secs()
            ),
            FailureReport::AbortingJob { rank, reason } => {
                write!(f, "rank {rank} aborts the MPI job: {reason}")
            }
            FailureReport::StillBlocked { rank, after } => write!(
                f,
                "rank {rank}: still blocked {} s after aborting NCCL",
                after.as_secs()
            ),
        }
    }
}

/// The program's answer to a [`FailureReport`]; called on the backend's own threads.
pub type FailureHandler = Arc<dyn Fn(&FailureReport) + Send + Sync>;
