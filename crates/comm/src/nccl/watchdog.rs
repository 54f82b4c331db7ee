//! The watchdog thread of an [`NcclComm`](super::NcclComm): aborts NCCL when a collective stays
//! incomplete past the timeout (see the module doc of `nccl`).

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use candle_core::cuda_backend::cudarc::driver::{CudaContext, CudaEvent, DriverError};

use super::Shared;
use crate::{FailureHandler, FailureReport, Group};

/// How long the process may live on after the watchdog began to abort NCCL before the
/// watchdog reports [`FailureReport::StillBlocked`] (see the module doc).
pub(super) const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// How often the watchdog looks at the collectives in flight.
pub(super) const POLL: Duration = Duration::from_millis(100);

/// What the watchdog thread shares with the issuing threads.
pub(super) struct Watch {
    rank: usize,
    queue: Mutex<Queue>,
    /// Wakes the watchdog to stop.
    wake: Condvar,
    timeout_ms: AtomicU64,
    /// `u64::MAX`: never report [`FailureReport::StillBlocked`].
    grace_ms: AtomicU64,
    /// The program's handler of [`FailureReport`]s.
    handler: Mutex<Option<FailureHandler>>,
}

#[derive(Default)]
struct Queue {
    /// The collectives in flight, in issue order.
    entries: VecDeque<Watched>,
    /// The next sequence number of each group.
    seq: [u64; 3],
    stop: bool,
}

/// A collective in flight, as the watchdog sees it.
struct Watched {
    op: &'static str,
    group: Group,
    seq: u64,
    issued: Instant,
    done: Arc<CudaEvent>,
}

impl Watch {
    /// Rank `rank`'s watch, with [`DEFAULT_TIMEOUT`](crate::DEFAULT_TIMEOUT), [`DEFAULT_GRACE`]
    /// and no handler.
    pub(super) fn new(rank: usize) -> Self {
        Watch {
            rank,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            timeout_ms: AtomicU64::new(crate::DEFAULT_TIMEOUT.as_millis() as u64),
            grace_ms: AtomicU64::new(DEFAULT_GRACE.as_millis() as u64),
            handler: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Watches a collective just enqueued (called under the state lock, so in stream order).
    pub(super) fn push(&self, op: &'static str, group: Group, done: Arc<CudaEvent>) {
        let mut queue = self.lock();
        let g = group.index();
        let seq = queue.seq[g];
        queue.seq[g] += 1;
        queue.entries.push_back(Watched {
            op,
            group,
            seq,
            issued: Instant::now(),
            done,
        });
    }

    /// Makes the watchdog thread return.
    pub(super) fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_all();
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    pub(super) fn set_timeout(&self, timeout: Duration) {
        self.timeout_ms
            .store(timeout.as_millis() as u64, Ordering::Relaxed);
    }

    fn grace(&self) -> Option<Duration> {
        match self.grace_ms.load(Ordering::Relaxed) {
            u64::MAX => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    pub(super) fn set_grace(&self, grace: Option<Duration>) {
        let ms = grace.map_or(u64::MAX, |g| (g.as_millis() as u64).min(u64::MAX - 1));
        self.grace_ms.store(ms, Ordering::Relaxed);
    }

    fn handler(&self) -> Option<FailureHandler> {
        self.handler
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn set_handler(&self, handler: Option<FailureHandler>) {
        *self.handler.lock().unwrap_or_else(PoisonError::into_inner) = handler;
    }
}

/// The watchdog thread (see the module doc): binds `context`, says so on `bound`, and returns
/// when stopped, or after it has aborted.
///
/// Locks: it holds the queue lock only to look at or pop the front entry, never while querying
/// an event, and never takes the state lock while holding it (issuing threads take the queue
/// lock under the state lock). It takes the state lock only to abort, after arming the
/// last-resort report, so an issuing thread stuck in NCCL under that lock cannot hang the job.
pub(super) fn watchdog(
    watch: &Watch,
    shared: &Shared,
    context: &Arc<CudaContext>,
    bound: mpsc::SyncSender<Result<(), DriverError>>,
) {
    let binding = context.bind_to_thread();
    let failed = binding.is_err();
    let _ = bound.send(binding);
    if failed {
        return;
    }
    // When the front entry became the front: its clock starts then, or at its issue if later.
    let mut front_since = Instant::now();
    let mut queue = watch.lock();
    loop {
        if queue.stop {
            return;
        }
        if shared.aborted.load(Ordering::SeqCst) {
            // Aborted by the caller: the collectives fail anyway; nothing left to watch.
            queue.entries.clear();
        }
        // Drop the completed collectives, front first (they complete in issue order).
        while let Some(done) = queue.entries.front().map(|w| w.done.clone()) {
            drop(queue);
            // A query error (a sticky CUDA error) fails the host thread's next CUDA call
            // anyway: the entry is dropped as complete.
            let complete = done.try_is_complete().unwrap_or(true);
            queue = watch.lock();
            if !complete {
                break;
            }
            // Only this thread pops (or clears, above, on this thread), so the front is `done`.
            queue.entries.pop_front();
            front_since = Instant::now();
        }
        if let Some(front) = queue.entries.front() {
            let waited = front.issued.max(front_since).elapsed();
            if waited > watch.timeout() {
                let timed_out = FailureReport::TimedOut {
                    backend: "NCCL",
                    rank: watch.rank,
                    op: front.op,
                    group: front.group,
                    seq: front.seq,
                    waited,
                };
                let what = format!(
                    "{} #{} on {:?} has not completed after {} s",
                    front.op,
                    front.seq,
                    front.group,
                    waited.as_secs()
                );
                queue.entries.clear();
                drop(queue);
                fire(watch, shared, timed_out, what);
                return;
            }
        }
        queue = watch
            .wake
            .wait_timeout(queue, POLL)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// Reports the timed-out collective, arms the last-resort report, and aborts the communicators.
fn fire(watch: &Watch, shared: &Shared, timed_out: FailureReport, what: String) {
    let rank = watch.rank;
    if shared.aborted.load(Ordering::SeqCst) {
        return;
    }
    let handler = watch.handler();
    if let Some(handler) = &handler {
        handler(&timed_out);
    }
    if let (Some(grace), Some(handler)) = (watch.grace(), handler) {
        // A thread of its own: this one may block below (the state lock, ncclCommAbort).
        let _ = std::thread::Builder::new()
            .name(format!("nccl-watchdog-grace-{rank}"))
            .spawn(move || {
                std::thread::sleep(grace);
                handler(&FailureReport::StillBlocked { rank, after: grace });
            });
    }
    let timeout = watch.timeout().as_secs_f64();
    let reason = format!("NCCL watchdog: {what} (timeout {timeout} s): a peer died or hung");
    if let Some(comms) = shared.abort(rank, reason) {
        // cudarc's drop is `ncclCommAbort`, and panics if it fails: the state is already
        // aborted, so that changes nothing for the host threads; the panic message is printed.
        let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(comms)));
    }
}
