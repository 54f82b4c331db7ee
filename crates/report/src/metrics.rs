//! `metrics.jsonl`: one JSON object per logged step and per evaluation. Scripts and `trainer
//! plot` read these names; keep them stable.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use crate::{Context, Result};
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
    /// On the first line after a resume that changed trajectory settings (allowed by
    /// `checkpoint.allow_changes`): each as `key: old -> new`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<String>,
    /// The step was skipped for a non-finite gradient norm (its `loss` / `grad_norm` may then
    /// be `null`, JSON's NaN). Written only when true, so the lines of a healthy run are as
    /// they always were and readers that do not know the field are unaffected.
    #[serde(default, skip_serializing_if = "is_false")]
    pub skipped: bool,
    /// Model FLOPs utilisation of rank 0's GPU since the previous line: the model's FLOPs
    /// per token (6N + 6LCT, as `trainer bench` counts) at this throughput, over the GPU's
    /// peak. Absent on the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    /// Rank 0's peak device memory since the previous line, in bytes. Absent on the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
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

/// A text sample of `samples.jsonl` (`[log] sample_interval`): what the model wrote after the
/// fixed prompt at this step.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SampleLine {
    pub step: u64,
    pub tokens: u64,
    pub prompt: String,
    pub text: String,
}

/// Appends lines to `<run>/metrics.jsonl`, each with one write (a killed run keeps every line it
/// wrote, and a failed write leaves no half line).
pub struct MetricsWriter {
    file: File,
    path: PathBuf,
    /// The file's length after the last whole line.
    len: u64,
}

impl MetricsWriter {
    pub fn append(path: &Path) -> Result<Self> {
        let opened = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|file| Ok((file.metadata()?.len(), file)));
        let (len, file) = opened.with_context(|| format!("cannot open {}", path.display()))?;
        Ok(MetricsWriter {
            file,
            path: path.to_path_buf(),
            len,
        })
    }

    /// Appends `line`, whole or not at all; an error names the file.
    pub fn write<T: Serialize>(&mut self, line: &T) -> Result<()> {
        let mut text = serde_json::to_string(line)?;
        text.push('\n');
        self.len = append_whole(&mut self.file, self.len, text.as_bytes())
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        Ok(())
    }

    /// Fsyncs the lines written so far: before a checkpoint commits, so that after a crash the
    /// metrics reach at least the newest checkpoint's step.
    pub fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .with_context(|| format!("cannot sync {}", self.path.display()))
    }
}

/// A file that can be cut back to a length, as [`append_whole`] needs.
trait Truncate: Write {
    fn truncate_to(&mut self, len: u64) -> io::Result<()>;
}

impl Truncate for File {
    fn truncate_to(&mut self, len: u64) -> io::Result<()> {
        self.set_len(len)
    }
}

/// Appends `text` to `sink`, which holds `len` bytes, with one `write_all`; if that fails
/// (a full disk), cuts `sink` back to `len`, so that no half line stays. Returns the new length.
fn append_whole(sink: &mut impl Truncate, len: u64, text: &[u8]) -> io::Result<u64> {
    match sink.write_all(text) {
        Ok(()) => Ok(len + text.len() as u64),
        Err(e) => {
            // Best effort: the write's error is the one to report.
            let _ = sink.truncate_to(len);
            Err(e)
        }
    }
}

/// The lines of a metrics file that [`truncate_after`] dropped because no step could be read
/// from them (half a line left by a crash of an older version, or text a person or another
/// program wrote into the file). Shown as one line, so a resume says what it threw away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damaged {
    /// How many lines were dropped.
    pub lines: usize,
    /// The first one's line number (from 1) in the file as it was.
    pub first_line: usize,
    /// The start of the first one, at most [`Damaged::SHOWN_CHARS`] characters.
    pub first: String,
}

impl Damaged {
    /// Characters of the first damaged line quoted in the message.
    pub const SHOWN_CHARS: usize = 40;
}

impl std::fmt::Display for Damaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = if self.lines == 1 { "" } else { "s" };
        write!(
            f,
            "dropped {} damaged line{s} holding no step (the first is line {}: {:?}); \
             the other lines are kept",
            self.lines, self.first_line, self.first
        )
    }
}

/// Keeps only the lines of `path` with `step <= last_step` (written to a temporary file, then
/// renamed): on resume, the curve continues from the checkpoint without duplicate steps.
/// A line that does not parse, or has no step, is dropped too, and returned as [`Damaged`] for
/// the caller to report; blank lines are dropped without a word.
pub fn truncate_after(path: &Path, last_step: u64) -> Result<Option<Damaged>> {
    if !path.exists() {
        return Ok(None);
    }
    let reader = BufReader::new(
        File::open(path).with_context(|| format!("cannot read {}", path.display()))?,
    );
    let mut kept = String::new();
    let mut damaged: Option<Damaged> = None;
    for (i, line) in reader.split(b'\n').enumerate() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        // Bytes that are not UTF-8 make a line damaged, not the file unreadable.
        let line = String::from_utf8_lossy(&line);
        let line = line.strip_suffix('\r').unwrap_or(&line);
        if line.trim().is_empty() {
            continue;
        }
        let step = serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|v| v.get("step").and_then(|s| s.as_u64()));
        match step {
            Some(s) if s <= last_step => {
                kept.push_str(line);
                kept.push('\n');
            }
            Some(_) => {}
            None => match &mut damaged {
                Some(d) => d.lines += 1,
                None => {
                    damaged = Some(Damaged {
                        lines: 1,
                        first_line: i + 1,
                        first: line.chars().take(Damaged::SHOWN_CHARS).collect(),
                    })
                }
            },
        }
    }
    let tmp = path.with_extension("jsonl.tmp");
    let written = File::create(&tmp).and_then(|mut f| {
        f.write_all(kept.as_bytes())?;
        f.sync_all()
    });
    written.with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
    Ok(damaged)
}

/// One parsed line of a metrics file, either kind.
#[derive(Debug, Deserialize)]
pub struct AnyLine {
    /// The optimizer step (`trainer plot --smooth` averages over a window of steps).
    pub step: u64,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A disk with room for `room` bytes: a write beyond it writes what fits, then fails.
    struct SmallDisk {
        bytes: Vec<u8>,
        room: usize,
    }

    impl Write for SmallDisk {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = buf.len().min(self.room - self.bytes.len());
            if n == 0 {
                return Err(io::Error::from_raw_os_error(28));
            }
            self.bytes.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Truncate for SmallDisk {
        fn truncate_to(&mut self, len: u64) -> io::Result<()> {
            self.bytes.truncate(len as usize);
            Ok(())
        }
    }

    #[test]
    fn a_failed_write_leaves_no_half_line() {
        let mut disk = SmallDisk {
            bytes: Vec::new(),
            room: 30,
        };
        let first = b"{\"step\":1,\"loss\":2.5}\n";
        let len = append_whole(&mut disk, 0, first).unwrap();
        assert_eq!(len, first.len() as u64);
        let e = append_whole(&mut disk, len, b"{\"step\":2,\"loss\":2.4}\n").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(28));
        assert_eq!(disk.bytes, first);
    }

    #[test]
    fn resume_drops_a_half_last_line_and_later_steps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let whole = [
            r#"{"step":1,"tokens":8,"loss":3.0}"#,
            r#"{"step":2,"tokens":16,"loss":2.9}"#,
            r#"{"step":2,"tokens":16,"val_loss":3.1}"#,
            r#"{"step":3,"tokens":24,"loss":2.8}"#,
        ];
        std::fs::write(&path, whole.join("\n") + "\n" + r#"{"step":4,"tok"#).unwrap();
        assert!(read(&path).is_err(), "plot stays strict about a half line");
        let damaged = truncate_after(&path, 10).unwrap();
        assert_eq!(
            damaged,
            Some(Damaged {
                lines: 1,
                first_line: 5,
                first: r#"{"step":4,"tok"#.into()
            })
        );
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            whole.join("\n") + "\n"
        );
        assert_eq!(read(&path).unwrap().len(), 4);
        assert_eq!(
            truncate_after(&path, 2).unwrap(),
            None,
            "later steps are no damage"
        );
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            whole[..3].join("\n") + "\n"
        );
    }

    #[test]
    fn damaged_lines_are_counted_once_and_the_first_is_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut bytes = b"{\"step\":1,\"tokens\":8,\"loss\":3.0}\n\n".to_vec();
        bytes.extend_from_slice("x".repeat(100).as_bytes());
        bytes.extend_from_slice(b"\n{\"no_step\":1}\n\xff\xfe\n");
        bytes.extend_from_slice(b"{\"step\":2,\"tokens\":16,\"loss\":2.9}\n");
        std::fs::write(&path, &bytes).unwrap();
        let damaged = truncate_after(&path, 10).unwrap().unwrap();
        assert_eq!((damaged.lines, damaged.first_line), (3, 3));
        assert_eq!(damaged.first, "x".repeat(Damaged::SHOWN_CHARS));
        assert_eq!(
            damaged.to_string(),
            format!(
                "dropped 3 damaged lines holding no step (the first is line 3: \"{}\"); the \
                 other lines are kept",
                "x".repeat(40)
            )
        );
        assert_eq!(read(&path).unwrap().len(), 2);
    }

    #[test]
    fn writer_appends_whole_lines_after_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        std::fs::write(&path, "{\"step\":0,\"tokens\":0,\"val_loss\":3.5}\n").unwrap();
        let mut w = MetricsWriter::append(&path).unwrap();
        w.write(&EvalLine {
            step: 1,
            tokens: 8,
            val_loss: 3.25,
        })
        .unwrap();
        w.sync().unwrap();
        assert_eq!(w.len, std::fs::metadata(&path).unwrap().len());
        assert_eq!(read(&path).unwrap().len(), 2);
    }
}
