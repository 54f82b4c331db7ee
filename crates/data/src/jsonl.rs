//! Streaming reader for Pile-format JSON-lines files (see [`crate::read_documents`]).
//!
//! Each line is one JSON object with a string field named the text column (`text`; other
//! fields, like the Pile's `meta`, are skipped without being built). Files ending in
//! `.jsonl.zst` are zstd-decompressed on the fly, `.jsonl.gz` gzip-decompressed (all members,
//! as Dolma's files have; bytes after the last member that start no other are an error that
//! says so), `.jsonl` read as they are. Blank lines are skipped. Line numbers in errors count
//! from 1.

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
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
                let decoder = GzipMembers::new(BufReader::with_capacity(1 << 20, counted));
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
        // A null text is an empty document, as a Parquet null is.
        text.map(Option::unwrap_or_default)
            .ok_or_else(|| DataError::MissingText {
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

/// The concatenated members of a gzip file, as `gzip -d` reads them. flate2's `MultiGzDecoder`
/// reads bytes after the last member as a truncated header ("unexpected end of file"); here
/// they are named for what they are.
struct GzipMembers<R: BufRead> {
    /// The member being read; `None` once the stream has ended.
    member: Option<flate2::bufread::GzDecoder<R>>,
}

impl<R: BufRead> GzipMembers<R> {
    fn new(inner: R) -> Self {
        GzipMembers {
            member: Some(flate2::bufread::GzDecoder::new(inner)),
        }
    }
}

impl<R: BufRead> Read for GzipMembers<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while let Some(member) = &mut self.member {
            let n = member.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // This member ended: another starts with gzip's magic bytes, or nothing follows.
            let Some(ended) = self.member.take() else {
                break;
            };
            let mut inner = ended.into_inner();
            let rest = inner.fill_buf()?;
            match rest {
                [] => return Ok(0),
                [0x1f] | [0x1f, 0x8b, ..] => {
                    self.member = Some(flate2::bufread::GzDecoder::new(inner));
                }
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "trailing data after the gzip stream",
                    ))
                }
            }
        }
        Ok(0)
    }
}

/// Reads a JSON object, keeping only the string (or null) field named `.0`: `Some(Some(text))`,
/// `Some(None)` when it is null, `None` when it is absent. Other fields are skipped unbuilt.
struct TextField<'a>(&'a str);

impl<'de> DeserializeSeed<'de> for TextField<'_> {
    type Value = Option<Option<String>>;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TextField<'_> {
    type Value = Option<Option<String>>;

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
                text = Some(map.next_value::<Option<String>>()?);
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
