//! TensorBoard event files: rank 0 writes the run's curves to `<run>/tensorboard` beside
//! `metrics.jsonl`, for `tensorboard --logdir` to show live.
//!
//! Format: TFRecord framing (`u64` length LE, `u32` masked CRC-32C of the length bytes, the
//! data, `u32` masked CRC-32C of the data; masked = rotated right 15 bits plus 0xa282ead8), each
//! record a `tensorflow.Event` protobuf (event.proto): the first with `file_version:
//! "brain.Event:2"`, the others a `Summary` of `simple_value` scalars (summary.proto), which
//! the scalars dashboard and `EventAccumulator.Scalars` read. Only the fields used are declared.
//!
//! Tags: `train/loss`, `train/lr`, `train/grad_norm`, `train/tokens_per_s`, `train/mfu`,
//! `train/peak_memory_gib`, `comm/intra_node_bytes`, `comm/inter_node_bytes`, `train/skipped`,
//! `val/loss` (step = training step); `by_tokens/train_loss`, `by_tokens/val_loss` (step =
//! tokens trained on).
//!
//! Resume: as `metrics.jsonl` is cut after the checkpoint's step, a resumed run continues the
//! same curves with no step twice: [`EventWriter::open`] with a [`Keep`] copies the earlier
//! launches' scalars up to the checkpoint (its step; its tokens for `by_tokens/*` tags) into
//! the new file, then deletes the old files; with `None` (a fresh run) it just deletes them.
//! A damaged old file (a crash mid-record, a bad CRC) is read up to its first bad record.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{Context, Result};
use prost::Message;

/// What every event file name starts with.
const PREFIX: &str = "events.out.tfevents.";
/// Tags whose step counts tokens rather than training steps.
const TOKENS_PREFIX: &str = "by_tokens/";

/// `tensorflow.Event`; `file_version` and `summary` are members of the oneof `what`.
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<Value>,
}

/// `tensorflow.Summary.Value`. `simple_value` is a oneof member: `optional` writes it even when
/// it is 0.0, and a value without it is not a scalar.
#[derive(Clone, PartialEq, prost::Message)]
struct Value {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
}

/// The checkpoint a run resumes from: the old scalars kept are those with step <= `step`, or,
/// for `by_tokens/*` tags, step <= `tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keep {
    pub step: u64,
    pub tokens: u64,
}

impl Keep {
    /// Whether an earlier launch's scalar `tag` at `step` belongs to the resumed run.
    pub fn keeps(&self, tag: &str, step: u64) -> bool {
        let tokens = tag.starts_with(TOKENS_PREFIX);
        step <= if tokens { self.tokens } else { self.step }
    }
}

/// `<dir>/events.out.tfevents.<unix secs>.<hostname>.<pid>.zeropp`, written record by record,
/// each with one `write` (a killed run keeps every whole record it wrote).
pub struct EventWriter {
    file: File,
    path: PathBuf,
    /// The file's length after the last whole record.
    len: u64,
}

impl EventWriter {
    /// Opens a new event file in `dir` (created if missing). With `keep` (a resume), the
    /// scalars of the event files already in `dir` that [`Keep::keeps`] are first copied into
    /// it with their wall times, each (tag, step) once (the newest file's value, should a crash
    /// have left an old file beside its copy); with `None` (a fresh run) none are. Then the old
    /// files are deleted.
    pub fn open(dir: &Path, keep: Option<Keep>) -> Result<EventWriter> {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let old = event_files(dir)?;
        let kept = match keep {
            Some(keep) => kept_events(&old, keep)?,
            None => Vec::new(),
        };
        let path = new_path(dir, &old);
        let file = OpenOptions::new().append(true).create_new(true).open(&path);
        let file = file.with_context(|| format!("cannot create {}", path.display()))?;
        let mut writer = EventWriter { file, path, len: 0 };
        let head = Event {
            wall_time: now(),
            file_version: Some("brain.Event:2".to_string()),
            ..Default::default()
        };
        writer.write_events(std::iter::once(&head).chain(&kept))?;
        writer.sync()?; // the copy is durable before the originals go
        for p in &old {
            fs::remove_file(p).with_context(|| format!("cannot delete {}", p.display()))?;
        }
        // Best effort: the new name and the deletions reach the disk.
        let _ = File::open(dir).and_then(|d| d.sync_all());
        Ok(writer)
    }

    /// One scalar summary value `tag` at `step`, wall time now.
    pub fn scalar(&mut self, tag: &str, step: u64, value: f64) -> Result<()> {
        self.scalars(step, &[(tag, value)])
    }

    /// Several scalars of one step in one Event (one Summary with several values), wall time
    /// now; none writes nothing. Stored as `f32` (`simple_value`), NaN and infinities as such.
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> Result<()> {
        if values.is_empty() {
            return Ok(());
        }
        let step = i64::try_from(step)
            .with_context(|| format!("step {step} is past int64 in {}", self.path.display()))?;
        let value = values.iter().map(|&(tag, x)| (tag.to_string(), x as f32));
        let event = scalar_event(now(), step, value.collect());
        self.write_events(std::iter::once(&event))
    }

    /// Flushes to the OS (after every logged line). Each record already went to the OS with
    /// one `write`, so this only reports an error the file may hold.
    pub fn flush(&mut self) -> Result<()> {
        let path = &self.path;
        self.file
            .flush()
            .with_context(|| format!("cannot write {}", path.display()))
    }

    /// Fsyncs the records written so far: before a checkpoint commits, so that after a crash
    /// the curves reach at least the newest checkpoint's step.
    pub fn sync(&self) -> Result<()> {
        let path = &self.path;
        self.file
            .sync_data()
            .with_context(|| format!("cannot sync {}", path.display()))
    }

    /// The event file being written.
    #[allow(dead_code)] // for messages; the trainer may name the folder instead
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `events` as records with one `write`; if that fails (a full disk), cuts the file
    /// back to its last whole record, so that no half record stays.
    fn write_events<'a>(&mut self, events: impl IntoIterator<Item = &'a Event>) -> Result<()> {
        let mut bytes = Vec::new();
        for e in events {
            push_record(&mut bytes, &e.encode_to_vec());
        }
        if let Err(e) = self.file.write_all(&bytes) {
            let _ = self.file.set_len(self.len); // best effort: the write's error is the one
            return Err(e).with_context(|| format!("cannot write {}", self.path.display()));
        }
        self.len += bytes.len() as u64;
        Ok(())
    }
}

/// Reads back every (tag, step, value) scalar of the event files in `dir` (none if `dir` is
/// missing), in file (launch) then record order; a damaged file up to its first bad record.
#[cfg_attr(not(test), allow(dead_code))] // tests and tools read the curves back
pub fn read_scalars(dir: &Path) -> Result<Vec<(String, u64, f32)>> {
    let scalars = scalars_of(&event_files(dir)?)?.into_iter();
    let known = scalars.filter_map(|(_, step, tag, x)| Some((tag, u64::try_from(step).ok()?, x)));
    Ok(known.collect())
}

/// TensorFlow's masked CRC-32C (Castagnoli) of `data`, as TFRecord framing stores it.
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends `data` to `out` as one TFRecord.
fn push_record(out: &mut Vec<u8>, data: &[u8]) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

/// The `N` bytes of `bytes` at `at`, if it holds them.
fn take<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..at.checked_add(N)?)?.try_into().ok()
}

/// The data of the whole, intact TFRecords at the start of `bytes`: reading stops at the first
/// record that is cut short or whose length or data CRC does not match.
fn records(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(len) = take::<8>(bytes, at) {
        let crc_ok = |at, data| take(bytes, at).map(u32::from_le_bytes) == Some(masked_crc(data));
        let start = at + 12;
        let end = usize::try_from(u64::from_le_bytes(len)).ok();
        let data = end.and_then(|n| bytes.get(start..start.checked_add(n)?));
        let Some(data) = data.filter(|d| crc_ok(at + 8, &len) && crc_ok(start + d.len(), d)) else {
            break;
        };
        out.push(data);
        at = start + data.len() + 4;
    }
    out
}

/// The scalars (wall time, step, tag, value) of `files`, in file then record order, each file
/// up to its first bad record (or one that is not an Event).
fn scalars_of(files: &[PathBuf]) -> Result<Vec<(f64, i64, String, f32)>> {
    let mut out = Vec::new();
    for path in files {
        let bytes = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        for e in records(&bytes).iter().map_while(|r| Event::decode(*r).ok()) {
            for v in e.summary.into_iter().flat_map(|s| s.value) {
                if let Some(x) = v.simple_value {
                    out.push((e.wall_time, e.step, v.tag, x));
                }
            }
        }
    }
    Ok(out)
}

/// The event files (`events.out.tfevents.*`) in `dir`, oldest launch first (by the unix seconds
/// in the name, then by name); none if `dir` is missing.
fn event_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let listed = match fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        listed => listed.with_context(|| format!("cannot list {}", dir.display()))?,
    };
    let mut files = Vec::new();
    for entry in listed {
        let path = entry
            .with_context(|| format!("cannot list {}", dir.display()))?
            .path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let secs = rest.split('.').next().and_then(|s| s.parse::<u64>().ok());
        if path.is_file() {
            files.push((secs.unwrap_or(u64::MAX), name.into_owned(), path));
        }
    }
    files.sort();
    Ok(files.into_iter().map(|(_, _, path)| path).collect())
}

/// The scalars of `files` that `keep` keeps, one per Event, each (tag, step) once: its last.
fn kept_events(files: &[PathBuf], keep: Keep) -> Result<Vec<Event>> {
    let mut seen = HashSet::new();
    let mut kept: Vec<Event> = (scalars_of(files)?.into_iter().rev())
        .filter(|(_, step, tag, _)| u64::try_from(*step).is_ok_and(|s| keep.keeps(tag, s)))
        .filter(|(_, step, tag, _)| seen.insert((tag.clone(), *step)))
        .map(|(wall_time, step, tag, x)| scalar_event(wall_time, step, vec![(tag, x)]))
        .collect();
    kept.reverse();
    Ok(kept)
}

/// An Event holding one Summary of the scalars `values` (tag, value).
fn scalar_event(wall_time: f64, step: i64, values: Vec<(String, f32)>) -> Event {
    let value = values.into_iter().map(|(tag, x)| Value {
        tag,
        simple_value: Some(x),
    });
    let summary = Some(Summary {
        value: value.collect(),
    });
    Event {
        wall_time,
        step,
        summary,
        file_version: None,
    }
}

/// A name for the new file in `dir` that none of `taken` has (a relaunch by the same pid
/// within the same second, as in tests, moves on a second).
fn new_path(dir: &Path, taken: &[PathBuf]) -> PathBuf {
    let raw = fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| fs::read_to_string("/etc/hostname"))
        .unwrap_or_default();
    let odd = |c: char| !(c.is_ascii_alphanumeric() || "-_.".contains(c));
    let host = match raw.trim() {
        "" => "localhost".to_string(),
        name => name.replace(odd, "_"),
    };
    let (mut secs, pid) = (now() as u64, std::process::id());
    loop {
        let path = dir.join(format!("{PREFIX}{secs}.{host}.{pid}.zeropp"));
        if !taken.contains(&path) && !path.exists() {
            return path;
        }
        secs += 1;
    }
}

/// Seconds since the epoch, as `wall_time`.
fn now() -> f64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keep(step: u64, tokens: u64) -> Option<Keep> {
        Some(Keep { step, tokens })
    }

    fn steps(dir: &Path, tag: &str) -> Vec<(u64, f32)> {
        let all = read_scalars(dir).unwrap().into_iter();
        all.filter(|(t, _, _)| t == tag)
            .map(|(_, s, x)| (s, x))
            .collect()
    }

    /// Steps `from..=to`: `train/loss` = step + `off`, `train/lr`, and `by_tokens/train_loss`
    /// at 100 tokens a step.
    fn write(w: &mut EventWriter, from: u64, to: u64, off: f64) {
        for s in from..=to {
            let loss = s as f64 + off;
            w.scalars(s, &[("train/loss", loss), ("train/lr", 0.0)])
                .unwrap();
            w.scalar("by_tokens/train_loss", s * 100, loss).unwrap();
            w.flush().unwrap();
        }
    }

    #[test]
    fn masked_crc_of_known_vector() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        // As tensorboard's masked_crc32c (tensorflow_stub) gives it.
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let tb = dir.path().join("tb");
        let mut w = EventWriter::open(&tb, None).unwrap();
        w.scalar("train/loss", 1, 2.5).unwrap();
        let two = [("train/loss", 2.25), ("val/loss", 0.0), ("x", f64::NAN)];
        w.scalars(2, &two).unwrap();
        w.scalars(3, &[]).unwrap();
        w.sync().unwrap();
        let name = w.path().file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(PREFIX) && name.ends_with(".zeropp"),
            "{name}"
        );
        let got = read_scalars(&tb).unwrap();
        let want = [
            ("train/loss", 1, 2.5),
            ("train/loss", 2, 2.25),
            ("val/loss", 2, 0.0),
        ];
        let want = want.map(|(t, s, x)| (t.to_string(), s, x));
        assert_eq!((got.len(), &got[..3]), (4, &want[..]));
        assert!(got[3].0 == "x" && got[3].1 == 2 && got[3].2.is_nan());
        let bytes = fs::read(w.path()).unwrap();
        let first = Event::decode(records(&bytes)[0]).unwrap();
        assert_eq!(first.file_version.as_deref(), Some("brain.Event:2"));
    }

    #[test]
    fn resume_keeps_steps_and_tokens_up_to_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::open(dir.path(), None).unwrap();
        write(&mut w, 1, 30, 0.0);
        let first = fs::read(w.path()).unwrap();
        let mut w = EventWriter::open(dir.path(), keep(20, 2000)).unwrap();
        write(&mut w, 21, 25, 0.5);
        let want = |per: u64| -> Vec<(u64, f32)> {
            let v = |s: u64| s as f32 + if s > 20 { 0.5 } else { 0.0 };
            (1..=25).map(|s| (s * per, v(s))).collect()
        };
        assert_eq!(steps(dir.path(), "train/loss"), want(1));
        assert_eq!(steps(dir.path(), "train/lr").len(), 25);
        assert_eq!(steps(dir.path(), "by_tokens/train_loss"), want(100));
        assert_eq!(event_files(dir.path()).unwrap(), [w.path().to_path_buf()]);

        // A crash after the new file was written but before the old one went: both files are
        // there; the later launch's values win and no step comes twice.
        fs::write(dir.path().join(format!("{PREFIX}1.host.1.zeropp")), first).unwrap();
        let w = EventWriter::open(dir.path(), keep(25, 2500)).unwrap();
        assert_eq!(steps(dir.path(), "train/loss"), want(1));
        assert_eq!(steps(dir.path(), "by_tokens/train_loss"), want(100));
        assert_eq!(event_files(dir.path()).unwrap(), [w.path().to_path_buf()]);
    }

    #[test]
    fn damaged_old_files_are_read_up_to_the_first_bad_record() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::open(dir.path(), None).unwrap();
        write(&mut w, 1, 10, 0.0);
        // A crash mid-record: the last record (step 10's by_tokens) is cut short.
        w.file.set_len(w.len - 3).unwrap();
        assert_eq!(steps(dir.path(), "train/loss").len(), 10);
        assert_eq!(steps(dir.path(), "by_tokens/train_loss").len(), 9);

        // A flipped byte in step 5's train/loss record: the file is read up to step 4.
        let mut bytes = fs::read(w.path()).unwrap();
        let at = records(&bytes)[1 + 2 * 4].as_ptr() as usize - bytes.as_ptr() as usize;
        bytes[at + 3] ^= 0x40;
        fs::write(w.path(), &bytes).unwrap();
        assert_eq!(steps(dir.path(), "train/loss").len(), 4);

        // Garbage for a length, and an empty file: nothing read, no error.
        fs::write(dir.path().join(format!("{PREFIX}9999999999.x")), [0xff; 40]).unwrap();
        fs::write(dir.path().join(format!("{PREFIX}9999999998.x")), []).unwrap();
        assert_eq!(read_scalars(dir.path()).unwrap().len(), 4 * 3);

        let w = EventWriter::open(dir.path(), keep(100, 10_000)).unwrap();
        assert_eq!(steps(dir.path(), "train/loss").len(), 4);
        assert_eq!(event_files(dir.path()).unwrap(), [w.path().to_path_buf()]);
    }

    #[test]
    fn fresh_start_removes_old_event_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::open(dir.path(), None).unwrap();
        write(&mut w, 1, 5, 0.0);
        fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        let w = EventWriter::open(dir.path(), None).unwrap();
        assert!(read_scalars(dir.path()).unwrap().is_empty());
        assert_eq!(event_files(dir.path()).unwrap(), [w.path().to_path_buf()]);
        assert!(dir.path().join("notes.txt").exists());
        assert!(read_scalars(&dir.path().join("missing"))
            .unwrap()
            .is_empty());
    }
}
