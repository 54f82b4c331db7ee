//! Documents from text files of any supported kind, streaming: JSON lines (`.jsonl`, and
//! compressed `.jsonl.zst`, `.jsonl.gz`) and Parquet (`.parquet`). The kind is decided by the
//! file name. Each document is the value of the text column (`text` unless told otherwise): a
//! JSON line's field of that name, or a Parquet file's string column of that name.
//!
//! ```
//! # fn main() -> data::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("tiny.jsonl");
//! std::fs::write(&path, "{\"text\": \"Hello\", \"meta\": {}}\n{\"text\": \"world\"}\n").unwrap();
//! let docs: Vec<String> = data::read_documents(&path)?.collect::<data::Result<_>>()?;
//! assert_eq!(docs, ["Hello", "world"]);
//! std::fs::write(&path, "{\"body\": \"Hi\", \"text\": 3}\n").unwrap();
//! let docs: Vec<String> = data::read_documents_with(&path, "body")?.collect::<data::Result<_>>()?;
//! assert_eq!(docs, ["Hi"]);
//! # Ok(())
//! # }
//! ```

use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{DataError, Result};
use crate::jsonl::JsonlDocuments;
use crate::parquet_input::ParquetDocuments;

/// The text column (JSON field, Parquet column) read unless another is named.
pub const TEXT_COLUMN: &str = "text";

/// Compression of a JSON-lines input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Zstd,
    Gzip,
}

/// The kind of a text input, decided by its file name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InputKind {
    Jsonl(Compression),
    Parquet,
}

/// `Some(kind)` when `path` names a `.jsonl`, `.jsonl.zst`, `.jsonl.gz` or `.parquet` file (by
/// its name only).
pub(crate) fn input_kind(path: &Path) -> Option<InputKind> {
    let name = path.file_name()?.to_string_lossy();
    if name.ends_with(".jsonl.zst") {
        Some(InputKind::Jsonl(Compression::Zstd))
    } else if name.ends_with(".jsonl.gz") {
        Some(InputKind::Jsonl(Compression::Gzip))
    } else if name.ends_with(".jsonl") {
        Some(InputKind::Jsonl(Compression::None))
    } else if name.ends_with(".parquet") {
        Some(InputKind::Parquet)
    } else {
        None
    }
}

/// Whether `path` names a text input [`read_documents`] reads (by its name only): what needs a
/// tokenizer, as opposed to a Megatron `.bin`/`.idx` prefix.
pub fn is_text_input(path: &Path) -> bool {
    input_kind(path).is_some()
}

/// Iterates the `text` of each document of a `.jsonl`, `.jsonl.zst`, `.jsonl.gz` or
/// `.parquet` file, streaming. See [`read_documents_with`].
pub fn read_documents(path: &Path) -> Result<impl Iterator<Item = Result<String>> + Send> {
    read_documents_counted(path, TEXT_COLUMN, None)
}

/// Iterates the text column `column` of each document of a text file, streaming.
///
/// Opening errors (missing file, unsupported extension, bad zstd or gzip header, a Parquet
/// file without the column) are returned at once; an error in a document is yielded by the
/// iterator (with the line, or row, number), after which it stops. A null Parquet value is an
/// empty document.
pub fn read_documents_with(
    path: &Path,
    column: &str,
) -> Result<impl Iterator<Item = Result<String>> + Send> {
    read_documents_counted(path, column, None)
}

/// As [`read_documents_with`], adding the number of (compressed) file bytes read to `counter`.
pub(crate) fn read_documents_counted(
    path: &Path,
    column: &str,
    counter: Option<Arc<AtomicU64>>,
) -> Result<Documents> {
    match input_kind(path) {
        Some(InputKind::Jsonl(compression)) => Ok(Documents::Jsonl(JsonlDocuments::open(
            path,
            compression,
            column,
            counter,
        )?)),
        Some(InputKind::Parquet) => Ok(Documents::Parquet(ParquetDocuments::open(
            path, column, counter,
        )?)),
        None => Err(DataError::UnsupportedInput {
            path: path.to_path_buf(),
        }),
    }
}

/// The iterator returned by [`read_documents`].
pub(crate) enum Documents {
    Jsonl(JsonlDocuments),
    Parquet(ParquetDocuments),
}

impl Iterator for Documents {
    type Item = Result<String>;

    fn next(&mut self) -> Option<Result<String>> {
        match self {
            Documents::Jsonl(d) => d.next(),
            Documents::Parquet(d) => d.next(),
        }
    }
}

/// Counts the bytes read from the file, for progress bars over compressed input.
pub(crate) struct CountingReader<R> {
    pub(crate) inner: R,
    pub(crate) counter: Option<Arc<AtomicU64>>,
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

/// Adds `n` to `counter`, if any.
pub(crate) fn count(counter: &Option<Arc<AtomicU64>>, n: u64) {
    if let Some(c) = counter {
        c.fetch_add(n, Ordering::Relaxed);
    }
}
