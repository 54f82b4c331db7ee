//! Streaming reader for Pile-format JSON-lines files.
//!
//! Each line is one JSON object with a string field `text` (other fields, like the Pile's `meta`,
//! are ignored). Files ending in `.jsonl.zst` are zstd-decompressed on the fly; files ending in
//! `.jsonl` are read as they are. Blank lines are skipped. Line numbers in errors count from 1.
//!
//! ```
//! # fn main() -> data::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("tiny.jsonl");
//! std::fs::write(&path, "{\"text\": \"Hello\", \"meta\": {}}\n{\"text\": \"world\"}\n").unwrap();
//! let docs: Vec<String> = data::read_documents(&path)?.collect::<data::Result<_>>()?;
//! assert_eq!(docs, ["Hello", "world"]);
//! # Ok(())
//! # }
//! ```

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Deserialize;

use crate::error::{DataError, Result};

/// Compression of a JSON-lines input, decided by its file name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JsonlKind {
    Plain,
    Zstd,
}

/// `Some(kind)` when `path` names a `.jsonl` or `.jsonl.zst` file (by extension only).
pub(crate) fn jsonl_kind(path: &Path) -> Option<JsonlKind> {
    let name = path.file_name()?.to_string_lossy();
    if name.ends_with(".jsonl.zst") {
        Some(JsonlKind::Zstd)
    } else if name.ends_with(".jsonl") {
        Some(JsonlKind::Plain)
    } else {
        None
    }
}

/// Iterate the `text` field of each line of a `.jsonl` or `.jsonl.zst` file, streaming.
///
/// Opening errors (missing file, unsupported extension, bad zstd header) are returned at once;
/// errors in a line are yielded by the iterator with the line number, after which it stops.
pub fn read_documents(path: &Path) -> Result<impl Iterator<Item = Result<String>> + Send> {
    read_documents_counted(path, None)
}

/// As [`read_documents`], adding the number of (compressed) file bytes read to `counter`.
pub(crate) fn read_documents_counted(
    path: &Path,
    counter: Option<Arc<AtomicU64>>,
) -> Result<Documents> {
    let kind = jsonl_kind(path).ok_or_else(|| DataError::UnsupportedInput {
        path: path.to_path_buf(),
    })?;
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    let counted = CountingReader {
        inner: file,
        counter,
    };
    let reader: Box<dyn BufRead + Send> = match kind {
        JsonlKind::Plain => Box::new(BufReader::with_capacity(1 << 20, counted)),
        JsonlKind::Zstd => {
            let decoder =
                zstd::stream::read::Decoder::new(counted).map_err(|e| DataError::io(path, e))?;
            Box::new(BufReader::with_capacity(1 << 20, decoder))
        }
    };
    Ok(Documents {
        path: path.to_path_buf(),
        reader,
        line: 0,
        buf: Vec::new(),
        done: false,
    })
}

/// The iterator returned by [`read_documents`].
pub(crate) struct Documents {
    path: PathBuf,
    reader: Box<dyn BufRead + Send>,
    line: u64,
    buf: Vec<u8>,
    done: bool,
}

#[derive(Deserialize)]
struct Line {
    text: Option<String>,
}

impl Iterator for Documents {
    type Item = Result<String>;

    fn next(&mut self) -> Option<Result<String>> {
        while !self.done {
            self.buf.clear();
            let n = match self.reader.read_until(b'\n', &mut self.buf) {
                Ok(n) => n,
                Err(e) => {
                    self.done = true;
                    return Some(Err(DataError::io(&self.path, e)));
                }
            };
            if n == 0 {
                self.done = true;
                return None;
            }
            self.line += 1;
            if self.buf.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            let parsed: std::result::Result<Line, _> = serde_json::from_slice(&self.buf);
            let result = match parsed {
                Ok(Line { text: Some(text) }) => Ok(text),
                Ok(Line { text: None }) => Err(DataError::MissingText {
                    path: self.path.clone(),
                    line: self.line,
                }),
                Err(source) => Err(DataError::Json {
                    path: self.path.clone(),
                    line: self.line,
                    source,
                }),
            };
            if result.is_err() {
                self.done = true;
            }
            return Some(result);
        }
        None
    }
}

/// Counts the bytes read from the file, for progress bars over compressed input.
struct CountingReader<R> {
    inner: R,
    counter: Option<Arc<AtomicU64>>,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(c) = &self.counter {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(n)
    }
}
