//! `metrics.jsonl`: one JSON object per logged step and per evaluation. Scripts and `trainer
//! plot` read these names; keep them stable.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// A training line. Comm bytes are rank 0's, per step, averaged since the previous line.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StepLine {
    pub step: u64,
    /// Tokens trained on so far.
    pub tokens: u64,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub tokens_per_s: f64,
    pub comm_intra_bytes: u64,
    pub comm_inter_bytes: u64,
    /// Which ZeRO++ techniques this step used.
    pub qwz: bool,
    pub hpz: bool,
    pub qgz: bool,
    /// The step was skipped for a non-finite gradient norm (its `loss` / `grad_norm` may then
    /// be `null`, JSON's NaN). Written only when true, so the lines of a healthy run are as
    /// they always were and readers that do not know the field are unaffected.
    #[serde(default, skip_serializing_if = "is_false")]
    pub skipped: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// An evaluation line.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EvalLine {
    pub step: u64,
    pub tokens: u64,
    pub val_loss: f64,
}

/// Appends lines to `<run>/metrics.jsonl`, flushing each one (a killed run keeps every line).
pub struct MetricsWriter {
    file: File,
    path: PathBuf,
}

impl MetricsWriter {
    pub fn append(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        Ok(MetricsWriter {
            file,
            path: path.to_path_buf(),
        })
    }

    pub fn write<T: Serialize>(&mut self, line: &T) -> Result<()> {
        let mut text = serde_json::to_string(line)?;
        text.push('\n');
        self.file
            .write_all(text.as_bytes())
            .with_context(|| format!("cannot write {}", self.path.display()))
    }
}

/// Keeps only the lines of `path` with `step <= last_step` (written to a temporary file, then
/// renamed): on resume, the curve continues from the checkpoint without duplicate steps.
pub fn truncate_after(path: &Path, last_step: u64) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let reader = BufReader::new(
        File::open(path).with_context(|| format!("cannot read {}", path.display()))?,
    );
    let mut kept = String::new();
    for line in reader.lines() {
        let line = line?;
        let step = serde_json::from_str::<serde_json::Value>(&line)
            .ok()
            .and_then(|v| v.get("step").and_then(|s| s.as_u64()));
        if step.is_some_and(|s| s <= last_step) {
            kept.push_str(&line);
            kept.push('\n');
        }
    }
    let tmp = path.with_extension("jsonl.tmp");
    std::fs::write(&tmp, kept)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// One parsed line of a metrics file, either kind.
#[derive(Debug, Deserialize)]
pub struct AnyLine {
    pub tokens: u64,
    pub loss: Option<f64>,
    pub val_loss: Option<f64>,
}

/// Reads every line of a metrics file; a malformed line is an error naming its number.
pub fn read(path: &Path) -> Result<Vec<AnyLine>> {
    let file =
        File::open(path).with_context(|| format!("cannot read metrics file {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(&line).with_context(|| {
                format!("{} line {}: not a metrics line", path.display(), i + 1)
            })?,
        );
    }
    Ok(out)
}
