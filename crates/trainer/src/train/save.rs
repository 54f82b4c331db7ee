//! Writing one checkpoint of a run: every rank its file, rank 0 the manifest that commits it,
//! then retention.

use std::path::{Path, PathBuf};

use anyhow::Result;
use zero::Engine;

use super::Shared;
use crate::checkpoint;
use crate::divergence;
use crate::metrics::MetricsWriter;

/// All ranks write their files into the temporary folder rank 0 made and hand rank 0 their
/// checksums; rank 0 syncs the metrics, commits the checkpoint and deletes old ones as
/// `[checkpoint]` says. If any rank fails, rank 0 removes the temporary folder (the failing
/// rank has removed its own partial file), so a full disk keeps room for the checkpoints it has.
/// Returns the checkpoint's folder, once every rank knows it is committed, and (rank 0) what
/// retention did. `last` is the run's last good checkpoint, for the stop line of a state that
/// is not finite.
pub(super) fn save(
    shared: &Shared<'_>,
    engine: &Engine,
    metrics: Option<&MetricsWriter>,
    step: u64,
    tokens: u64,
    last: Option<&Path>,
) -> Result<(PathBuf, Option<checkpoint::Pruned>)> {
    let dir = shared.config.checkpoint_dir();
    let lead = engine.comm().rank() == 0;
    // Every rank agrees that the state is finite before anything is written.
    let state = engine.state()?;
    divergence::check_state(engine, &state, step, last, &dir)?;
    if lead {
        checkpoint::begin(&dir, step, &shared.run_id)?;
    }
    engine.comm().barrier(comm::Group::World).wait()?;
    let tmp = checkpoint::tmp_dir(&dir, step);
    let committed = write_and_commit(shared, engine, metrics, &tmp, step, tokens, &state);
    if committed.is_err() && lead {
        checkpoint::abandon(&tmp);
    }
    committed?;
    let pruned = match lead {
        true => {
            let c = &shared.config.checkpoint;
            let run_id = &shared.run_id;
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
    // Every rank returns once the checkpoint is committed: a stop after it is safe.
    engine.comm().barrier(comm::Group::World).wait()?;
    Ok((checkpoint::step_dir(&dir, step), pruned))
}

/// [`save`]'s writes: this rank's file into `tmp`, then (rank 0) the metrics synced and the
/// manifest, which commits the checkpoint.
fn write_and_commit(
    shared: &Shared<'_>,
    engine: &Engine,
    metrics: Option<&MetricsWriter>,
    tmp: &Path,
    step: u64,
    tokens: u64,
    state: &[zero::NamedShard],
) -> Result<()> {
    let crc = checkpoint::write_rank(tmp, engine.comm().rank(), step, state)?;
    let checksums = checkpoint::exchange_checksums(engine.comm(), crc)?;
    if engine.comm().rank() != 0 {
        return Ok(());
    }
    // The metrics reach this step on disk before the checkpoint does.
    if let Some(m) = metrics {
        m.sync()?;
    }
    let manifest = checkpoint::manifest(
        step,
        tokens,
        shared.topology,
        shared.model_cfg,
        engine.plan().align,
        &shared.settings,
        &checksums,
        &shared.run_id,
    );
    checkpoint::commit(&shared.config.checkpoint_dir(), tmp, &manifest)?;
    Ok(())
}
