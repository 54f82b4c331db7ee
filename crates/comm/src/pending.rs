use std::sync::{Arc, Condvar, Mutex, PoisonError};

use crate::{CommError, Result};

/// A collective in flight; [`Pending::wait`] blocks until this rank's result is ready.
///
/// Issuing a collective returns at once so the caller can overlap compute with communication
/// (the engine prefetches the next unit's gather). Dropping a `Pending` without waiting is
/// allowed: the collective still runs (peers count on this rank's contribution), and its result
/// is discarded.
#[must_use = "a collective's result (and its error) is only seen through `wait`"]
pub struct Pending<T> {
    state: State<T>,
}

enum State<T> {
    Done(Result<T>),
    InFlight(Arc<Cell<T>>),
    /// Completed by running the closure at `wait` (a result transformed by [`Pending::map`], or
    /// a GPU collective whose completion the caller's stream must wait for).
    /// (In a mutex only so that a `Pending` is `Sync`; it is never contended.)
    Deferred(Mutex<Box<dyn FnOnce() -> Result<T> + Send>>),
}

impl<T> Pending<T> {
    /// A collective that has already completed with `value` (a world of one rank).
    pub fn ready(value: T) -> Self {
        Pending {
            state: State::Done(Ok(value)),
        }
    }

    /// A collective that has already failed with `error`.
    pub fn failed(error: CommError) -> Self {
        Pending {
            state: State::Done(Err(error)),
        }
    }

    /// A collective completed by `finish` when the caller waits: for backends whose
    /// collectives are ordered on a device stream, `finish` makes the caller's stream wait for it.
    pub fn deferred(finish: impl FnOnce() -> Result<T> + Send + 'static) -> Self {
        Pending {
            state: State::Deferred(Mutex::new(Box::new(finish))),
        }
    }

    /// The result passed through `f` once it is ready (for example, a tensor read back to the
    /// host).
    pub fn map<U>(self, f: impl FnOnce(T) -> Result<U> + Send + 'static) -> Pending<U>
    where
        T: Send + 'static,
    {
        match self.state {
            State::Done(result) => Pending {
                state: State::Done(result.and_then(f)),
            },
            _ => Pending::deferred(move || self.wait().and_then(f)),
        }
    }

    /// Blocks until this rank's result of the collective is ready.
    pub fn wait(self) -> Result<T> {
        match self.state {
            State::Done(result) => result,
            State::Deferred(finish) => {
                finish.into_inner().unwrap_or_else(PoisonError::into_inner)()
            }
            State::InFlight(cell) => {
                let mut value = cell.lock();
                loop {
                    if let Some(result) = value.take() {
                        return result;
                    }
                    value = cell
                        .filled
                        .wait(value)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
    }

    /// A pending result and the sender that completes it; `rank` names the rank whose
    /// communication thread holds the sender, for the error if that thread dies.
    pub(crate) fn channel(rank: usize) -> (Completer<T>, Pending<T>) {
        let cell = Arc::new(Cell {
            value: Mutex::new(None),
            filled: Condvar::new(),
        });
        (
            Completer {
                cell: Some(cell.clone()),
                rank,
            },
            Pending {
                state: State::InFlight(cell),
            },
        )
    }
}

impl<T> std::fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Done(Ok(_)) => "ready",
            State::Done(Err(_)) => "failed",
            State::InFlight { .. } | State::Deferred(_) => "in flight",
        };
        f.debug_struct("Pending").field("state", &state).finish()
    }
}

/// Where a result waits for its [`Pending`]: a one-shot channel that is `Sync`, so a
/// `Pending` can sit in a structure shared between threads.
struct Cell<T> {
    value: Mutex<Option<Result<T>>>,
    filled: Condvar,
}

impl<T> Cell<T> {
    // Only `Option::take` and assignment run under the lock, so it is never left half-updated.
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Result<T>>> {
        self.value.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fill(&self, result: Result<T>) {
        *self.lock() = Some(result);
        self.filled.notify_all();
    }
}

/// The sending half of a [`Pending`], held by the thread executing the collective. Dropped
/// without completing (that thread died), it completes with [`CommError::WorkerGone`].
pub(crate) struct Completer<T> {
    cell: Option<Arc<Cell<T>>>,
    rank: usize,
}

impl<T> Completer<T> {
    /// Delivers the result; a `Pending` that was dropped (the caller did not wait) is fine.
    pub(crate) fn complete(mut self, result: Result<T>) {
        if let Some(cell) = self.cell.take() {
            cell.fill(result);
        }
    }
}

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        if let Some(cell) = self.cell.take() {
            cell.fill(Err(CommError::WorkerGone { rank: self.rank }));
        }
    }
}
