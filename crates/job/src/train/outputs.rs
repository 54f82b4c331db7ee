//! What rank 0 writes into the run directory while it trains: `config.toml`, `metrics.jsonl`,
//! TensorBoard's event file (`[log] tensorboard`) and the text samples (`samples.jsonl`,
//! `[log] sample_interval`). The other ranks hold an [`Outputs`] that writes nothing.
//!
//! On resume every file continues where the checkpoint is: the metrics and the TensorBoard
//! events after its step are dropped, so that no step is there twice.

use std::path::Path;

use anyhow::{Context, Result};

use report::metrics::{self, Damaged, EvalLine, MetricsWriter, StepLine};
use report::tensorboard::{EventWriter, Keep};
use run::config::RunConfig;

/// The files rank 0 appends to; none on the other ranks.
#[derive(Default)]
pub(super) struct Outputs {
    metrics: Option<MetricsWriter>,
    tensorboard: Option<EventWriter>,
    samples: Option<MetricsWriter>,
}

/// The TensorBoard folder of a run.
fn tensorboard_dir(run_dir: &Path) -> std::path::PathBuf {
    run_dir.join("tensorboard")
}

impl Outputs {
    /// Rank 0's outputs of a run that starts after step `start` (0: a new run) having trained
    /// on `start_tokens`: the run folder, the config copy, the metrics file cut after `start`
    /// (with the damaged lines it dropped, for the caller to report), and, as `[log]` asks, the
    /// TensorBoard events cut alike and the samples file.
    pub(super) fn open(
        config: &RunConfig,
        start: u64,
        start_tokens: u64,
    ) -> Result<(Outputs, Option<Damaged>)> {
        let run_dir = &config.log.dir;
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("cannot create {}", run_dir.display()))?;
        let metrics_path = run_dir.join("metrics.jsonl");
        let samples_path = run_dir.join("samples.jsonl");
        if start == 0 {
            // A restart with no checkpoint yet: the curve starts again at step 0.
            for path in [&metrics_path, &samples_path] {
                if path.exists() {
                    std::fs::remove_file(path)
                        .with_context(|| format!("cannot replace {}", path.display()))?;
                }
            }
        }
        let damaged = metrics::truncate_after(&metrics_path, start)?;
        let config_path = run_dir.join("config.toml");
        std::fs::write(&config_path, config.to_toml()?)
            .with_context(|| format!("cannot write {}", config_path.display()))?;
        let tensorboard = match config.log.tensorboard {
            true => {
                let keep = (start > 0).then_some(Keep {
                    step: start,
                    tokens: start_tokens,
                });
                Some(EventWriter::open(&tensorboard_dir(run_dir), keep)?)
            }
            false => None,
        };
        let samples = match config.log.sample_interval {
            0 => None,
            _ => {
                metrics::truncate_after(&samples_path, start)?;
                Some(MetricsWriter::append(&samples_path)?)
            }
        };
        let outputs = Outputs {
            metrics: Some(MetricsWriter::append(&metrics_path)?),
            tensorboard,
            samples,
        };
        Ok((outputs, damaged))
    }

    /// A training line: to the metrics, and its scalars to TensorBoard at its step (the loss
    /// also at its token count).
    pub(super) fn step(&mut self, line: &StepLine) -> Result<()> {
        if let Some(m) = self.metrics.as_mut() {
            m.write(line)?;
        }
        if let Some(tb) = self.tensorboard.as_mut() {
            let mut values = vec![
                ("train/loss", line.loss),
                ("train/lr", line.lr),
                ("train/grad_norm", line.grad_norm),
                ("train/tokens_per_s", line.tokens_per_s),
                ("comm/intra_node_bytes", line.comm_intra_bytes as f64),
                ("comm/inter_node_bytes", line.comm_inter_bytes as f64),
                ("train/skipped", if line.skipped { 1.0 } else { 0.0 }),
            ];
            if let Some(mfu) = line.mfu {
                values.push(("train/mfu", mfu));
            }
            if let Some(peak) = line.peak_memory_bytes {
                values.push(("train/peak_memory_gib", peak as f64 / (1u64 << 30) as f64));
            }
            tb.scalars(line.step, &values)?;
            tb.scalar("by_tokens/train_loss", line.tokens, line.loss)?;
            tb.flush()?;
        }
        Ok(())
    }

    /// An evaluation line: to the metrics, and `val/loss` to TensorBoard at its step and its
    /// token count.
    pub(super) fn eval(&mut self, line: &EvalLine) -> Result<()> {
        if let Some(m) = self.metrics.as_mut() {
            m.write(line)?;
        }
        if let Some(tb) = self.tensorboard.as_mut() {
            tb.scalar("val/loss", line.step, line.val_loss)?;
            tb.scalar("by_tokens/val_loss", line.tokens, line.val_loss)?;
            tb.flush()?;
        }
        Ok(())
    }

    /// A text sample: one line of `samples.jsonl`.
    pub(super) fn sample(&mut self, line: &metrics::SampleLine) -> Result<()> {
        match self.samples.as_mut() {
            Some(s) => Ok(s.write(line)?),
            None => Ok(()),
        }
    }

    /// Fsyncs what was written: before a checkpoint commits, so that after a crash the
    /// outputs reach at least the newest checkpoint's step.
    pub(super) fn sync(&self) -> Result<()> {
        if let Some(m) = &self.metrics {
            m.sync()?;
        }
        if let Some(tb) = &self.tensorboard {
            tb.sync()?;
        }
        if let Some(s) = &self.samples {
            s.sync()?;
        }
        Ok(())
    }
}
