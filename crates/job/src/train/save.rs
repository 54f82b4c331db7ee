//! Writing the run's checkpoints: every rank its file, rank 0 the manifest that commits it,
//! then retention; in the foreground, or in the background while training goes on
//! (`checkpoint.async`).
//!
//! A checkpoint is begun at a step ([`RankRun::save_if_good`]): every rank agrees that its state
//! is finite, copies it to host memory, and hands it to a writer thread of its own, which writes,
//! checksums and fsyncs the rank's file in the temporary folder. It commits
//! ([`RankRun::finish_checkpoint`]) once every rank's writer is done: the ranks exchange their
//! checksums, rank 0 syncs the metrics, writes the manifest and renames the folder, and applies
//! retention. In the foreground the commit follows the write at once; in the background the
//! ranks ask at each step whether all writers are done ([`RankRun::poll_checkpoint`], one
//! all-reduce of a flag, only while a write is in flight) and commit at the same step. Until
//! the commit the folder is a `.tmp` one that no resume reads, so a crash during the write
//! leaves the previous checkpoint the newest. At most one write is in flight: the next
//! checkpoint, a stop and the end of the run wait for it.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

use super::RankRun;
use crate::divergence;
use checkpoint;
use report::readable;

/// A checkpoint begun and not yet committed: its rank file is being written by `writer`.
pub(super) struct Pending {
    step: u64,
    tokens: u64,
    tmp: PathBuf,
    /// This rank's bytes of state.
    bytes: u64,
    started: Instant,
    /// How long training waited for this checkpoint so far.
    waited: Duration,
    /// Returns the CRC-32 of the file it wrote, and the state it wrote from.
    writer: JoinHandle<Result<(u32, Vec<zero::NamedShard>)>>,
}

impl RankRun<'_> {
    /// Begins the checkpoint of `step` (every rank its part) if the step's loss and gradient
    /// norm were finite; otherwise writes nothing (the state is the one before a skipped step,
    /// or worse) and says so: the last good checkpoint stays the run's newest, which retention
    /// never deletes and the stop lines name. A checkpoint still in flight commits first. In
    /// the foreground the new one commits before this returns.
    pub(super) fn save_if_good(&mut self, step: u64) -> Result<()> {
        self.finish_checkpoint()?;
        let dir = self.shared.config.checkpoint_dir();
        if !self.last_finite {
            self.say(&divergence::withheld(
                step,
                self.last_checkpoint.as_deref(),
                &dir,
            ));
            return Ok(());
        }
        let started = Instant::now();
        // Every rank agrees that the state is finite before anything is written.
        // In the background, into the buffers of the last checkpoint (kept for this).
        let mut state = std::mem::take(&mut self.host_state);
        self.engine.state_into(&mut state)?;
        divergence::check_state(
            &self.engine,
            &state,
            step,
            self.last_checkpoint.as_deref(),
            &dir,
        )?;
        if self.lead {
            checkpoint::begin(&dir, step, &self.shared.run_id)?;
        }
        self.engine.comm().barrier(comm::Group::World).wait()?;
        let tmp = checkpoint::tmp_dir(&dir, step);
        let bytes = state.iter().map(|s| 4 * s.data.len() as u64).sum();
        let (rank, file_dir) = (self.rank, tmp.clone());
        let delay = self.shared.hooks.checkpoint_delay(step);
        let writer = std::thread::Builder::new()
            .name(format!("checkpoint-{step}"))
            .spawn(move || {
                if let Some(delay) = delay {
                    std::thread::sleep(delay);
                }
                checkpoint::write_rank(&file_dir, rank, step, &state).map(|crc| (crc, state))
            })
            .map_err(|e| anyhow!("cannot start the checkpoint writer: {e}"))?;
        self.pending = Some(Pending {
            step,
            tokens: self.tokens_at(step),
            tmp,
            bytes,
            started,
            waited: started.elapsed(),
            writer,
        });
        match self.shared.config.checkpoint_async() {
            true => self.say(&format!(
                "checkpoint of step {step}: {} a rank copied to host memory in {:.2} s, \
                 written in the background",
                readable::bytes(bytes),
                started.elapsed().as_secs_f64()
            )),
            false => self.finish_checkpoint()?,
        }
        Ok(())
    }

    /// At the end of each step while a checkpoint is being written in the background: commits
    /// it if every rank's write is done (every rank asks, so all commit at the same step).
    pub(super) fn poll_checkpoint(&mut self) -> Result<()> {
        let Some(pending) = &self.pending else {
            return Ok(());
        };
        let busy = !pending.writer.is_finished();
        if !self.engine.any_over_world(busy)? {
            self.finish_checkpoint()?;
        }
        Ok(())
    }

    /// Waits for the checkpoint in flight, if any, and commits it: the ranks exchange their
    /// checksums, rank 0 syncs the metrics (they reach the checkpoint's step on disk before it
    /// does), writes the manifest, renames the folder and applies retention, reporting once
    /// each the folders retention left alone. If any rank fails, rank 0 removes the temporary
    /// folder (the failing rank has removed its own partial file), so a full disk keeps room
    /// for the checkpoints it has. Returns once every rank knows the checkpoint is committed:
    /// a stop after it is safe.
    pub(super) fn finish_checkpoint(&mut self) -> Result<()> {
        let Some(pending) = self.pending.take() else {
            return Ok(());
        };
        let Pending {
            step,
            tokens,
            tmp,
            bytes,
            started,
            waited,
            writer,
        } = pending;
        let wait = Instant::now();
        let committed = self.commit(step, tokens, &tmp, writer);
        if committed.is_err() && self.lead {
            checkpoint::abandon(&tmp);
        }
        let path = committed?;
        let pruned = match self.lead {
            true => {
                let c = &self.shared.config.checkpoint;
                let dir = self.shared.config.checkpoint_dir();
                let run_id = &self.shared.run_id;
                Some(checkpoint::prune(
                    &dir,
                    step,
                    c.keep_last,
                    c.keep_every,
                    run_id,
                )?)
            }
            false => None,
        };
        self.engine.comm().barrier(comm::Group::World).wait()?;
        let waited = waited + wait.elapsed();
        self.say(&format!(
            "checkpoint {}: {} a rank, committed in {:.1} s; training waited {:.2} s",
            path.display(),
            readable::bytes(bytes),
            started.elapsed().as_secs_f64(),
            waited.as_secs_f64()
        ));
        for (folder, why) in pruned.map(|p| p.left).unwrap_or_default() {
            if self.reported.insert(folder.clone()) {
                self.say(&format!(
                    "retention leaves {} alone and does not count it in checkpoint.keep_last: \
                     it is {why}",
                    folder.display()
                ));
            }
        }
        self.last_checkpoint = Some(path);
        Ok(())
    }

    /// [`RankRun::finish_checkpoint`]'s writes: this rank's file (waiting for its writer),
    /// the checksums exchanged, then (rank 0) the outputs synced and the manifest, which commits
    /// the checkpoint. Returns the committed folder.
    fn commit(
        &mut self,
        step: u64,
        tokens: u64,
        tmp: &Path,
        writer: JoinHandle<Result<(u32, Vec<zero::NamedShard>)>>,
    ) -> Result<PathBuf> {
        let shared = self.shared;
        let (crc, state) = writer
            .join()
            .map_err(|_| anyhow!("the checkpoint writer of step {step} panicked"))??;
        // Kept for the next checkpoint in the background; in the foreground the memory goes.
        if shared.config.checkpoint_async() {
            self.host_state = state;
        }
        let checksums = checkpoint::exchange_checksums(self.engine.comm(), crc)?;
        let dir = shared.config.checkpoint_dir();
        if !self.lead {
            return Ok(checkpoint::step_dir(&dir, step));
        }
        // The metrics reach this step on disk before the checkpoint does.
        self.outputs.sync()?;
        let manifest = checkpoint::manifest(
            step,
            tokens,
            shared.topology,
            shared.model_cfg,
            self.engine.plan().align,
            &shared.settings,
            &checksums,
            &shared.run_id,
        );
        checkpoint::commit(&dir, tmp, &manifest)
    }
}
