//! Graceful stop: SIGTERM, SIGINT and SIGUSR1 (slurm's `--signal=USR1@120`) ask the run to end
//! after the step in progress, with a checkpoint; a second signal ends the process at once.
//!
//! A handler only sets a flag. The training loop polls it once per step and the ranks agree
//! through one all-reduce, so every rank stops after the same step even when the signal reached
//! the processes at different moments (or, with the `local` backend, between two ranks' polls).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};

/// The exit status of a run stopped by a signal after writing its checkpoint: sysexits'
/// EX_TEMPFAIL, "try again later". Resuming with the same command continues the run.
pub const EXIT_STOPPED: u8 = 75;

/// The signals that stop a run gracefully.
const SIGNALS: [i32; 3] = [SIGTERM, SIGINT, SIGUSR1];

/// The first stop signal received (0: none yet).
static RECEIVED: OnceLock<Arc<AtomicUsize>> = OnceLock::new();

/// Installs the handlers (once per process; later calls do nothing).
pub fn install() -> Result<()> {
    if RECEIVED.get().is_some() {
        return Ok(());
    }
    let received = Arc::new(AtomicUsize::new(0));
    let armed = Arc::new(AtomicBool::new(false));
    for signal in SIGNALS {
        let cannot = || format!("cannot handle {}", name(signal));
        // signal-hook runs a signal's actions in the order they were registered: the exit
        // comes first, so it sees `armed` as the previous signal left it. The first signal
        // only arms it; a second one exits with the shell's status for death by that signal.
        signal_hook::flag::register_conditional_shutdown(signal, 128 + signal, armed.clone())
            .with_context(cannot)?;
        signal_hook::flag::register(signal, armed.clone()).with_context(cannot)?;
        signal_hook::flag::register_usize(signal, received.clone(), signal as usize)
            .with_context(cannot)?;
    }
    let _ = RECEIVED.set(received);
    Ok(())
}

/// The stop signal this process has received, if any.
pub fn requested() -> Option<i32> {
    let signal = RECEIVED.get()?.load(Ordering::SeqCst);
    (signal != 0).then_some(signal as i32)
}

/// A signal's name for messages.
pub fn name(signal: i32) -> &'static str {
    match signal {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        SIGUSR1 => "SIGUSR1",
        _ => "a signal",
    }
}
