//! The divergence policy (docs/operations.md, "Divergence"): a step whose gradient norm is not
//! finite is skipped by the engine on every rank; `train.max_skipped_steps` of them in a row
//! stop the run; a non-finite validation loss stops it; a state holding a NaN or inf is never
//! checkpointed, and neither is the state after a step whose loss or gradient norm was not
//! finite ([`withheld`]), so the run's newest checkpoint is always its last good one. Every
//! stop is one line naming the step and that checkpoint, to resume from. Every rank sees the
//! same numbers (all-reduced), so every rank stops alike.

use std::path::Path;

use anyhow::{bail, Result};
use zero::{Engine, NamedShard};

use checkpoint;

/// What the stopping lines advise.
const ADVICE: &str = "lower train.lr or check the data";

/// "the last checkpoint is DIR", or that there is none, for the stopping lines: `last` is the
/// run's last good checkpoint (the newest it wrote or resumed from), `None` if it has none in
/// `dir`.
fn last_checkpoint(last: Option<&Path>, dir: &Path) -> String {
    match last {
        Some(path) => format!("the last checkpoint is {}", path.display()),
        None => format!("no checkpoint was written to {}", dir.display()),
    }
}

/// [`last_checkpoint`] where the caller does not track the run's checkpoints: the newest
/// complete one in `dir`. The same one, since no checkpoint follows a non-finite step and the
/// lock on `checkpoint.dir` keeps other runs out.
fn newest_checkpoint(dir: &Path) -> String {
    match checkpoint::newest(dir) {
        Ok(Some(path)) => format!("the last checkpoint is {}", path.display()),
        Ok(None) => format!("no checkpoint was written to {}", dir.display()),
        Err(e) => format!(
            "the checkpoints in {} cannot be listed ({e:#})",
            dir.display()
        ),
    }
}

/// Counts skipped steps in a row; a finite step resets the count. Not checkpointed: a resumed
/// run starts counting from 0.
pub struct SkipCounter {
    in_row: u64,
    max: u64,
}

impl SkipCounter {
    /// Stops the run at `max` (`train.max_skipped_steps`, at least 1) skips in a row.
    pub fn new(max: u64) -> Self {
        SkipCounter { in_row: 0, max }
    }

    /// Records whether step `step` was skipped. For a skip, returns rank 0's plain-text line
    /// (`step 12: non-finite gradient norm (NaN), step skipped (1 in a row)`).
    pub fn record(&mut self, step: u64, skipped: bool, grad_norm: f64) -> Option<String> {
        if !skipped {
            self.in_row = 0;
            return None;
        }
        self.in_row += 1;
        Some(format!(
            "step {step}: non-finite gradient norm ({grad_norm}), step skipped ({} in a row)",
            self.in_row
        ))
    }

    /// The error that stops the run once `max` steps in a row were skipped, the last at `step`,
    /// naming `last`, the run's newest checkpoint in `checkpoints`: the one written before the
    /// streak (none is written during one).
    pub fn check(&self, step: u64, last: Option<&Path>, checkpoints: &Path) -> Result<()> {
        if self.in_row >= self.max {
            bail!(
                "stopping: {} steps in a row had a non-finite gradient norm (last at step {step}); \
                 {} — {ADVICE}",
                self.in_row,
                last_checkpoint(last, checkpoints)
            );
        }
        Ok(())
    }
}

/// Stops the run on a NaN or infinite validation loss at `step` (before that step is
/// checkpointed).
pub fn check_val_loss(step: u64, val_loss: f64, checkpoints: &Path) -> Result<()> {
    if !val_loss.is_finite() {
        bail!(
            "stopping: the validation loss at step {step} is {val_loss}; {} — {ADVICE}",
            newest_checkpoint(checkpoints)
        );
    }
    Ok(())
}

/// Stops the run, before anything of checkpoint `step` is written, if `state` (this rank's) or
/// any other rank's holds a NaN or inf ([`Engine::check_finite_state`], a collective: every
/// rank calls it); the line names `last`, the run's newest checkpoint in `checkpoints`.
pub fn check_state(
    engine: &Engine,
    state: &[NamedShard],
    step: u64,
    last: Option<&Path>,
    checkpoints: &Path,
) -> Result<()> {
    if let Err(e) = engine.check_finite_state(state) {
        bail!(
            "stopping: {e}, so step {step} is not checkpointed; {} — {ADVICE}",
            last_checkpoint(last, checkpoints)
        );
    }
    Ok(())
}

/// Rank 0's line for a checkpoint of `step` that is due but not written, because that step's
/// loss or gradient norm was not finite (the step was skipped): its state is the one before,
/// whose checkpoint `last` (in `checkpoints`) stays the run's last good one. "Last good" means
/// written after a step with a finite loss and gradient norm, of a finite state: the weights of
/// that very step may still have grown huge (docs/operations.md, "Divergence").
pub fn withheld(step: u64, last: Option<&Path>, checkpoints: &Path) -> String {
    format!(
        "step {step}: no checkpoint, its loss or gradient norm was not finite; {}",
        last_checkpoint(last, checkpoints)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_in_a_row_stop_the_run_and_a_finite_step_resets_the_count() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = SkipCounter::new(2);
        assert_eq!(c.record(1, false, 0.5), None);
        assert_eq!(
            c.record(2, true, f64::NAN).as_deref(),
            Some("step 2: non-finite gradient norm (NaN), step skipped (1 in a row)")
        );
        c.check(2, None, dir.path()).unwrap();
        assert_eq!(c.record(3, false, 0.5), None);
        c.record(4, true, f64::INFINITY);
        c.check(4, None, dir.path()).unwrap();
        c.record(5, true, f64::NAN);
        let e = c.check(5, None, dir.path()).unwrap_err().to_string();
        assert!(
            e.starts_with("stopping: 2 steps in a row had a non-finite gradient norm (last at step 5); no checkpoint was written")
                && e.ends_with("lower train.lr or check the data")
                && !e.contains('\n'),
            "{e}"
        );
        // The checkpoint named is the one the run says is its last good one, not the newest
        // folder on disk.
        let good = dir.path().join("step_00000003");
        std::fs::create_dir_all(dir.path().join("step_00000009")).unwrap();
        let e = c.check(5, Some(&good), dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(&format!("the last checkpoint is {} — ", good.display())),
            "{e}"
        );
        assert_eq!(
            withheld(5, Some(&good), dir.path()),
            format!(
                "step 5: no checkpoint, its loss or gradient norm was not finite; the last \
                 checkpoint is {}",
                good.display()
            )
        );
    }

    #[test]
    fn a_non_finite_validation_loss_stops_the_run() {
        let dir = tempfile::tempdir().unwrap();
        check_val_loss(3, 4.5, dir.path()).unwrap();
        let e = check_val_loss(3, f64::NAN, dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("stopping: the validation loss at step 3 is NaN"),
            "{e}"
        );
    }
}
