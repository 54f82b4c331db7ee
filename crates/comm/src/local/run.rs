//! Running one closure per rank of a local world, with failures turned into one error.

use std::error::Error;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Mutex, PoisonError};
use std::thread;

use std::time::Duration;

use super::{local_world_with_timeout, LocalComm, DEFAULT_TIMEOUT};
use crate::Topology;

/// The first failure of a [`run_local`] world: the failing rank's own error, not the
/// [`CommError::Aborted`](crate::CommError::Aborted) echoes it caused on the other ranks.
#[derive(Debug, thiserror::Error)]
pub enum LocalRunError {
    /// Rank `rank`'s closure returned an error.
    #[error("rank {rank} failed")]
    Failed {
        rank: usize,
        source: Box<dyn Error + Send + Sync>,
    },
    /// Rank `rank`'s closure panicked with `message`.
    #[error("rank {rank} panicked: {message}")]
    Panicked { rank: usize, message: String },
}

impl LocalRunError {
    /// The rank that failed first.
    pub fn rank(&self) -> usize {
        match self {
            LocalRunError::Failed { rank, .. } | LocalRunError::Panicked { rank, .. } => *rank,
        }
    }
}

/// Runs `f(comm)` for every rank of `topology` on its own thread and returns the results in
/// rank order.
///
/// If a rank returns `Err` or panics, the world is aborted at once (every rank blocked in a
/// collective gets [`CommError::Aborted`](crate::CommError::Aborted)), all rank threads are
/// joined, and the first failing rank's own error is returned. `E` is anything that converts
/// into a boxed error: a typed error enum, `anyhow::Error`, a `String`.
///
/// # Panics
/// If the operating system cannot start a thread.
pub fn run_local<T, E, F>(topology: Topology, f: F) -> Result<Vec<T>, LocalRunError>
where
    T: Send,
    E: Into<Box<dyn Error + Send + Sync>>,
    F: Fn(LocalComm) -> Result<T, E> + Sync,
{
    run_local_with_timeout(topology, DEFAULT_TIMEOUT, f)
}

/// [`run_local`] with collectives that fail with [`CommError::Timeout`](crate::CommError::Timeout)
/// after waiting `timeout` for their peers (a rank that hangs without failing).
///
/// # Panics
/// If the operating system cannot start a thread.
pub fn run_local_with_timeout<T, E, F>(
    topology: Topology,
    timeout: Duration,
    f: F,
) -> Result<Vec<T>, LocalRunError>
where
    T: Send,
    E: Into<Box<dyn Error + Send + Sync>>,
    F: Fn(LocalComm) -> Result<T, E> + Sync,
{
    let first: Mutex<Option<LocalRunError>> = Mutex::new(None);
    let results: Vec<Option<T>> = thread::scope(|scope| {
        let threads: Vec<_> = local_world_with_timeout(topology, timeout)
            .into_iter()
            .map(|comm| {
                let (f, first) = (&f, &first);
                thread::Builder::new()
                    .name(format!("rank-{}", comm.handle.rank))
                    .spawn_scoped(scope, move || run_rank(comm, f, first))
                    .expect("the OS starts a rank thread")
            })
            .collect();
        threads
            .into_iter()
            // `run_rank` catches the closure's panics; a panic outside it leaves a `None`,
            // reported below as a missing result.
            .map(|t| t.join().ok().flatten())
            .collect()
    });
    if let Some(error) = first.into_inner().unwrap_or_else(PoisonError::into_inner) {
        return Err(error);
    }
    results
        .into_iter()
        .enumerate()
        .map(|(rank, r)| {
            r.ok_or_else(|| LocalRunError::Panicked {
                rank,
                message: "the rank thread died outside its closure".into(),
            })
        })
        .collect()
}

/// One rank's thread: runs `f`, and on failure records it (if first) and aborts the world.
fn run_rank<T, E, F>(comm: LocalComm, f: &F, first: &Mutex<Option<LocalRunError>>) -> Option<T>
where
    E: Into<Box<dyn Error + Send + Sync>>,
    F: Fn(LocalComm) -> Result<T, E>,
{
    let rank = comm.handle.rank;
    // Keeps this rank's communication thread alive after `f` drops `comm`, so that peers see
    // this rank's abort (recorded first) rather than a "dropped communicator" echo.
    let keepalive = comm.keepalive();
    let (failure, reason) = match panic::catch_unwind(AssertUnwindSafe(|| f(comm))) {
        Ok(Ok(value)) => return Some(value),
        Ok(Err(error)) => {
            let source = error.into();
            let reason = source.to_string();
            (LocalRunError::Failed { rank, source }, reason)
        }
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic payload".into());
            let reason = format!("panicked: {message}");
            (LocalRunError::Panicked { rank, message }, reason)
        }
    };
    // Record before aborting: every echo of this abort is recorded after it.
    first
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert(failure);
    keepalive.shared.abort(rank, reason);
    None
}
