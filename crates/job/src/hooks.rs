//! The tests' failure hooks (README, "Environment hooks"): environment variables that make a
//! run die, fail or hang at a given step, so that the tests can check what a job does then.
//! They are read once, when the run starts, into [`TestHooks`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// After completing (and checkpointing) step N, rank 0's process kills itself with SIGKILL, as
/// a crash or a preempted job would. Used by the kill-and-resume tests.
pub const KILL_AT_STEP_ENV: &str = "ZEROPP_KILL_AT_STEP";

/// `R@S`: rank R fails with an error at step S, to check that one rank's failure ends the whole
/// run promptly with that rank's error.
pub const FAIL_RANK_ENV: &str = "ZEROPP_FAIL_RANK";

/// `R@S`: rank R's process SIGKILLs itself at the start of step S, as a crashed node would
/// (multi-process backends).
pub const KILL_RANK_ENV: &str = "ZEROPP_KILL_RANK";

/// `R@S`: rank R stops at the start of step S and issues no further collective, as a hung
/// process would: its peers must give up after `dist.timeout_s`. A launched rank never comes
/// back; a rank of the `local` backend (a thread, which the process must join to exit) comes
/// back with an error once another rank has failed.
pub const HANG_RANK_ENV: &str = "ZEROPP_HANG_RANK";

/// `S@MS`: the write of step S's checkpoint files sleeps MS milliseconds first, on every rank:
/// a checkpoint still being written in the background (`checkpoint.async`) when a test kills
/// or stops the run.
pub const CHECKPOINT_DELAY_ENV: &str = "ZEROPP_CHECKPOINT_DELAY";
/// Milliseconds every rank sleeps before each step: a run slow enough for a test to signal it,
/// or launch a second run into its directory, while it is in progress.
pub const STEP_DELAY_ENV: &str = "ZEROPP_STEP_DELAY_MS";

/// Where a hook of the form `R@S` acts: rank R, at step S.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RankStep {
    rank: usize,
    step: u64,
}

/// The hooks this run was started with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TestHooks {
    /// [`KILL_AT_STEP_ENV`].
    kill_at_step: Option<u64>,
    /// [`FAIL_RANK_ENV`].
    fail: Option<RankStep>,
    /// [`KILL_RANK_ENV`].
    kill_rank: Option<RankStep>,
    /// [`HANG_RANK_ENV`].
    hang: Option<RankStep>,
    /// [`STEP_DELAY_ENV`].
    step_delay: Option<Duration>,
    /// [`CHECKPOINT_DELAY_ENV`]: (step, milliseconds).
    checkpoint_delay: Option<(u64, u64)>,
}

impl TestHooks {
    /// Reads the hooks from the environment; a malformed value is an error naming the variable.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        // `A@B`, two whole numbers; `shape` names them in the error, e.g. "RANK@STEP".
        let pair = |name: &str, shape: &str| -> Result<Option<(u64, u64)>> {
            let Some(value) = var(name) else {
                return Ok(None);
            };
            let parsed = value
                .split_once('@')
                .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
            match parsed {
                Some(p) => Ok(Some(p)),
                None => bail!("{name}={value:?}: expected {shape}, e.g. 2@3"),
            }
        };
        let rank_step = |name: &str| -> Result<Option<RankStep>> {
            Ok(pair(name, "RANK@STEP")?.map(|(rank, step)| RankStep {
                rank: rank as usize,
                step,
            }))
        };
        let number = |name: &str| -> Result<Option<u64>> {
            match var(name) {
                None => Ok(None),
                Some(v) => {
                    Ok(Some(v.trim().parse().with_context(|| {
                        format!("{name}={v:?}: expected a whole number")
                    })?))
                }
            }
        };
        let kill_at_step = number(KILL_AT_STEP_ENV)?;
        let checkpoint_delay = pair(CHECKPOINT_DELAY_ENV, "STEP@MILLISECONDS")?;
        Ok(TestHooks {
            kill_at_step,
            fail: rank_step(FAIL_RANK_ENV)?,
            kill_rank: rank_step(KILL_RANK_ENV)?,
            hang: rank_step(HANG_RANK_ENV)?,
            step_delay: number(STEP_DELAY_ENV)?.map(Duration::from_millis),
            checkpoint_delay,
        })
    }

    /// Refuses a hook aimed at a rank outside a world of `world` ranks: it would never act, and a
    /// fault test relying on it would pass without its fault.
    pub fn check_world(&self, world: usize) -> Result<()> {
        for (name, hook) in [
            (FAIL_RANK_ENV, self.fail),
            (KILL_RANK_ENV, self.kill_rank),
            (HANG_RANK_ENV, self.hang),
        ] {
            if let Some(RankStep { rank, step }) = hook {
                if rank >= world {
                    bail!(
                        "{name}={rank}@{step}: rank {rank} is outside the world of {world} (ranks 0 to {})",
                        world - 1
                    );
                }
            }
        }
        Ok(())
    }

    /// At the start of step `step` on `rank`: fails, dies or hangs as the hooks say. A hang
    /// ends (with an error) only once `given_up` is set.
    pub fn before_step(&self, rank: usize, step: u64, given_up: &AtomicBool) -> Result<()> {
        if let Some(delay) = self.step_delay {
            std::thread::sleep(delay);
        }
        let here = |hook: Option<RankStep>| hook == Some(RankStep { rank, step });
        if here(self.fail) {
            bail!("injected failure at step {step} ({FAIL_RANK_ENV})");
        }
        if here(self.kill_rank) {
            kill_self();
        }
        if here(self.hang) {
            while !given_up.load(Ordering::SeqCst) {
                std::thread::park_timeout(Duration::from_millis(100));
            }
            // The failing rank records its error just after it sets `given_up`: let it be the
            // run's first failure, which the run reports.
            std::thread::sleep(Duration::from_millis(500));
            bail!("injected hang at step {step} ({HANG_RANK_ENV}): the run has failed");
        }
        Ok(())
    }

    /// After step `step` and its checkpoint: rank 0 (`lead`) dies if [`KILL_AT_STEP_ENV`] says.
    /// Whether [`TestHooks::after_step`] kills the process after `step`: the run first waits
    /// for that step's checkpoint, as the hook's contract says, even when it is written in the
    /// background.
    pub fn kills_after(&self, step: u64) -> bool {
        self.kill_at_step == Some(step)
    }

    /// The delay of the write of step `step`'s checkpoint files ([`CHECKPOINT_DELAY_ENV`]).
    pub fn checkpoint_delay(&self, step: u64) -> Option<Duration> {
        match self.checkpoint_delay {
            Some((s, ms)) if s == step => Some(Duration::from_millis(ms)),
            _ => None,
        }
    }

    pub fn after_step(&self, step: u64, lead: bool) {
        if lead && self.kill_at_step == Some(step) {
            kill_self();
        }
    }
}

/// SIGKILL: no destructor, no flush beyond what was written.
fn kill_self() -> ! {
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status();
    std::process::abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_are_read_once_and_checked() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let hooks = TestHooks::from_vars(vars(&[(FAIL_RANK_ENV, "1@3"), (KILL_AT_STEP_ENV, "20")]))
            .unwrap();
        assert_eq!(hooks.kill_at_step, Some(20));
        let never = AtomicBool::new(false);
        assert!(hooks.before_step(1, 2, &never).is_ok());
        assert!(hooks.before_step(0, 3, &never).is_ok());
        let e = hooks.before_step(1, 3, &never).unwrap_err().to_string();
        assert!(e.contains("injected failure at step 3"), "{e}");

        hooks.check_world(2).unwrap();
        let e = hooks.check_world(1).unwrap_err().to_string();
        assert_eq!(
            e,
            "ZEROPP_FAIL_RANK=1@3: rank 1 is outside the world of 1 (ranks 0 to 0)"
        );

        let e = TestHooks::from_vars(vars(&[(HANG_RANK_ENV, "two@3")])).unwrap_err();
        assert!(e.to_string().contains("ZEROPP_HANG_RANK=\"two@3\""), "{e}");
    }
}
