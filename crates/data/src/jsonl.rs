//! Streaming reader for Pile-format JSON-lines files (see [`crate::read_documents`]).
//!
//! Each line is one JSON object with a string field named the text column (`text`; other
//! fields, like the Pile's `meta`, are skipped without being built). Files ending in
//! `.jsonl.zst` are zstd-decompressed on the fly, `.jsonl.gz` gzip-decompressed (all members,
//! as Dolma's files have), `.jsonl` read as they are. Blank lines are skipped. Line numbers in
//! errors count from 1.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use crate::documents::{Compression, CountingReader};
use crate::error::{DataError, Result};

/// The documents of one JSON-lines file.
pub(crate) struct JsonlDocuments {
    path: PathBuf,
    column: String,
    reader: Box<dyn BufRead + Send>,
    line: u64,
    buf: Vec<u8>,
    done: bool,
}

impl JsonlDocuments {
    pub(crate) fn open(
        path: &Path,
        compression: Compression,
        column: &str,
        counter: Option<Arc<AtomicU64>>,
    ) -> Result<Self> {
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        let counted = CountingReader {
            inner: file,
            counter,
        };
        let reader: Box<dyn BufRead + Send> = match compression {
            Compression::None => Box::new(BufReader::with_capacity(1 << 20, counted)),
            Compression::Zstd => {
                let decoder = zstd::stream::read::Decoder::new(counted)
                    .map_err(|e| DataError::io(path, e))?;
                Box::new(BufReader::with_capacity(1 << 20, decoder))
            }
            Compression::Gzip => {
                let decoder = flate2::read::MultiGzDecoder::new(counted);
                Box::new(BufReader::with_capacity(1 << 20, decoder))
            }
        };
        Ok(JsonlDocuments {
            path: path.to_path_buf(),
            column: column.to_string(),
            reader,
            line: 0,
            buf: Vec::new(),
            done: false,
        })
    }

    fn parse(&self) -> Result<String> {
        let mut de = serde_json::Deserializer::from_slice(&self.buf);
        let json = |source| DataError::Json {
            path: self.path.clone(),
            line: self.line,
            source,
        };
        let text = TextField(&self.column).deserialize(&mut de).map_err(json)?;
        de.end().map_err(json)?;
        text.ok_or_else(|| DataError::MissingText {
            path: self.path.clone(),
            line: self.line,
            field: self.column.clone(),
        })
    }
}

impl Iterator for JsonlDocuments {
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
            let result = self.parse();
            if result.is_err() {
                self.done = true;
            }
            return Some(result);
        }
        None
    }
}

/// Reads a JSON object, keeping only the string (or null) field named `.0`: `Some(text)`, or
/// `None` when the field is absent or null. Other fields are skipped unbuilt.
struct TextField<'a>(&'a str);

impl<'de> DeserializeSeed<'de> for TextField<'_> {
    type Value = Option<String>;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TextField<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a JSON object with a string field {:?}", self.0)
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let mut text = None;
        while let Some(is_text) = map.next_key_seed(KeyIs(self.0))? {
            if is_text {
                text = map.next_value::<Option<String>>()?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(text)
    }
}

/// A map key, read as whether it equals `.0` (without allocating it).
struct KeyIs<'a>(&'a str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a string key")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<bool, E> {
        Ok(v == self.0)
    }
}
