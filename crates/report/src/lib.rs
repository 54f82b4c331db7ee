//! What a run reports, and how a person reads it afterwards: the metrics file
//! (`metrics.jsonl`, appended a whole line at a time and cut back to a checkpoint on resume),
//! TensorBoard's event files, the progress line, the figures of `trainer plot`, and numbers
//! written for people (`1.23 GiB`, `3.4M tokens`).
//!
//! It knows nothing of models, ZeRO or runs: the trainer hands it lines and values. Every
//! error is a [`ReportError`] naming the file or the argument.

mod error;
pub mod metrics;
pub mod plot;
pub mod progress;
pub mod readable;
pub mod tensorboard;

pub use error::{Context, ReportError, Result};
