//! Megatron-LM `MMapIndexedDataset` files: `PREFIX.bin` (raw tokens) and `PREFIX.idx` (index).
//!
//! The layout is exactly Megatron's (`megatron/core/datasets/indexed_dataset.py`), all
//! little-endian:
//!
//! | field | type |
//! |---|---|
//! | magic | 9 bytes `MMIDIDX\x00\x00` |
//! | version | u64 = 1 |
//! | dtype code | u8: 8 = uint16 (vocabularies under 65500), 4 = int32 |
//! | sequence count S | u64 |
//! | document index count D | u64 = documents + 1 |
//! | sizes | S x i32, tokens per sequence |
//! | pointers | S x i64, byte offset of each sequence in `.bin` |
//! | doc_idx | D x i64, first sequence of each document, then S |
//!
//! We write one sequence per document, so `doc_idx = [0, 1, .., S]`; the reader accepts
//! Megatron's general multi-sequence documents. [`IndexedDatasetWriter`] writes the tokens it is
//! given (the caller ends each document with `<|endoftext|>`; [`crate::prepare`] does).
//!
//! ```
//! # fn main() -> data::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let prefix = dir.path().join("tiny");
//! let mut w = data::IndexedDatasetWriter::create(&prefix, 50257)?;
//! w.add_document(&[15496, 995, 50256])?;
//! w.add_document(&[50256])?;
//! let stats = w.finish()?;
//! assert_eq!((stats.documents, stats.tokens), (2, 4));
//! // header + 2 sizes (i32) + 2 pointers (i64) + 3 doc_idx (i64); 4 uint16 tokens
//! assert_eq!(std::fs::metadata(dir.path().join("tiny.idx")).unwrap().len(), 34 + 8 + 16 + 24);
//! assert_eq!(std::fs::metadata(dir.path().join("tiny.bin")).unwrap().len(), 8);
//! let ds = data::IndexedDataset::open(&prefix)?;
//! assert_eq!(ds.document(0), [15496, 995, 50256]);
//! assert_eq!(ds.tokens(), [15496, 995, 50256, 50256]);
//! # Ok(())
//! # }
//! ```

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{DataError, Result};

/// The 9 magic bytes that open a Megatron `.idx` file.
pub const MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
/// The `.idx` format version we read and write.
pub const VERSION: u64 = 1;
/// Bytes before the `sizes` array: magic, version, dtype code, two counts.
pub const HEADER_LEN: usize = 9 + 8 + 1 + 8 + 8;

/// Token storage type of a `.bin` file, with Megatron's dtype codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenDType {
    /// `numpy.uint16`, code 8: used when the vocabulary has fewer than 65500 tokens.
    U16,
    /// `numpy.int32`, code 4.
    I32,
}

impl TokenDType {
    /// Megatron's choice for a vocabulary size.
    pub fn for_vocab(vocab_size: usize) -> Self {
        if vocab_size < 65500 {
            TokenDType::U16
        } else {
            TokenDType::I32
        }
    }
    /// Megatron's dtype code.
    pub fn code(self) -> u8 {
        match self {
            TokenDType::U16 => 8,
            TokenDType::I32 => 4,
        }
    }
    /// `Some` for the codes we support (8, 4).
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            8 => Some(TokenDType::U16),
            4 => Some(TokenDType::I32),
            _ => None,
        }
    }
    /// Bytes per token.
    pub fn bytes(self) -> usize {
        match self {
            TokenDType::U16 => 2,
            TokenDType::I32 => 4,
        }
    }
    fn name(self) -> &'static str {
        match self {
            TokenDType::U16 => "uint16",
            TokenDType::I32 => "int32",
        }
    }
    fn decode_into(self, bytes: &[u8], out: &mut Vec<u32>) {
        match self {
            TokenDType::U16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32),
            ),
            TokenDType::I32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32),
            ),
        }
    }
}

/// `PREFIX` + `suffix`, keeping any dots already in the prefix (`a/b.v1` -> `a/b.v1.bin`).
pub(crate) fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut s = OsString::from(prefix.as_os_str());
    s.push(suffix);
    PathBuf::from(s)
}

/// What [`IndexedDatasetWriter::finish`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexStats {
    pub documents: usize,
    pub tokens: usize,
    pub dtype: TokenDType,
    pub bin_path: PathBuf,
    pub idx_path: PathBuf,
}

/// Writes a `.bin`/`.idx` pair, one sequence per document.
///
/// Data goes to `PREFIX.bin.tmp` and `PREFIX.idx.tmp`; `finish` syncs them, removes any old
/// `PREFIX.idx`, then renames the `.bin` and last the `.idx`. An interrupted run therefore never
/// leaves a valid-looking pair, and a writer dropped without `finish` deletes its temp files.
pub struct IndexedDatasetWriter {
    bin_path: PathBuf,
    idx_path: PathBuf,
    bin_tmp: PathBuf,
    idx_tmp: PathBuf,
    bin: Option<BufWriter<File>>,
    dtype: TokenDType,
    vocab_size: usize,
    sizes: Vec<i32>,
    tokens: usize,
    scratch: Vec<u8>,
}

impl IndexedDatasetWriter {
    /// Starts `PREFIX.bin.tmp`; the dtype is Megatron's choice for `vocab_size`.
    pub fn create(prefix: &Path, vocab_size: usize) -> Result<Self> {
        let bin_tmp = with_suffix(prefix, ".bin.tmp");
        let file = File::create(&bin_tmp).map_err(|e| DataError::io(&bin_tmp, e))?;
        Ok(IndexedDatasetWriter {
            bin_path: with_suffix(prefix, ".bin"),
            idx_path: with_suffix(prefix, ".idx"),
            idx_tmp: with_suffix(prefix, ".idx.tmp"),
            bin_tmp,
            bin: Some(BufWriter::with_capacity(1 << 20, file)),
            dtype: TokenDType::for_vocab(vocab_size),
            vocab_size,
            sizes: Vec::new(),
            tokens: 0,
            scratch: Vec::new(),
        })
    }

    /// Appends one document (one sequence) of exactly these tokens.
    pub fn add_document(&mut self, tokens: &[u32]) -> Result<()> {
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(DataError::TokenOutOfRange {
                id,
                vocab_size: self.vocab_size,
            });
        }
        let size = i32::try_from(tokens.len()).map_err(|_| DataError::BadIndex {
            path: self.idx_path.clone(),
            reason: format!(
                "document {} has {} tokens, more than the format's i32 size limit",
                self.sizes.len(),
                tokens.len()
            ),
        })?;
        self.scratch.clear();
        match self.dtype {
            // `vocab_size < 65500` was checked above, so every token fits.
            TokenDType::U16 => {
                for &t in tokens {
                    self.scratch.extend_from_slice(&(t as u16).to_le_bytes());
                }
            }
            TokenDType::I32 => {
                for &t in tokens {
                    self.scratch.extend_from_slice(&(t as i32).to_le_bytes());
                }
            }
        }
        let bin = self.bin.as_mut().ok_or_else(|| DataError::BadBin {
            path: self.bin_tmp.clone(),
            reason: "writer already finished".into(),
        })?;
        bin.write_all(&self.scratch)
            .map_err(|e| DataError::io(&self.bin_tmp, e))?;
        self.sizes.push(size);
        self.tokens += tokens.len();
        Ok(())
    }

    /// Documents added so far.
    pub fn num_documents(&self) -> usize {
        self.sizes.len()
    }

    /// Tokens added so far.
    pub fn num_tokens(&self) -> usize {
        self.tokens
    }

    /// Writes the index and moves both files into place.
    pub fn finish(mut self) -> Result<IndexStats> {
        let Some(bin) = self.bin.take() else {
            return Err(DataError::BadBin {
                path: self.bin_tmp.clone(),
                reason: "writer already finished".into(),
            });
        };
        let file = bin
            .into_inner()
            .map_err(|e| DataError::io(&self.bin_tmp, e.into_error()))?;
        file.sync_all()
            .map_err(|e| DataError::io(&self.bin_tmp, e))?;
        drop(file);

        let idx = index_bytes(self.dtype, &self.sizes);
        let mut f = File::create(&self.idx_tmp).map_err(|e| DataError::io(&self.idx_tmp, e))?;
        f.write_all(&idx)
            .and_then(|_| f.sync_all())
            .map_err(|e| DataError::io(&self.idx_tmp, e))?;
        drop(f);

        match std::fs::remove_file(&self.idx_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(DataError::io(&self.idx_path, e)),
        }
        std::fs::rename(&self.bin_tmp, &self.bin_path)
            .map_err(|e| DataError::io(&self.bin_path, e))?;
        std::fs::rename(&self.idx_tmp, &self.idx_path)
            .map_err(|e| DataError::io(&self.idx_path, e))?;
        Ok(IndexStats {
            documents: self.sizes.len(),
            tokens: self.tokens,
            dtype: self.dtype,
            bin_path: self.bin_path.clone(),
            idx_path: self.idx_path.clone(),
        })
    }
}

impl Drop for IndexedDatasetWriter {
    fn drop(&mut self) {
        // Not finished (an error or an early return upstream): leave nothing behind.
        if self.bin.take().is_some() {
            let _ = std::fs::remove_file(&self.bin_tmp);
            let _ = std::fs::remove_file(&self.idx_tmp);
        }
    }
}

/// The `.idx` bytes for one sequence per document.
fn index_bytes(dtype: TokenDType, sizes: &[i32]) -> Vec<u8> {
    let n = sizes.len();
    let mut out = Vec::with_capacity(HEADER_LEN + n * 12 + (n + 1) * 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.push(dtype.code());
    out.extend_from_slice(&(n as u64).to_le_bytes());
    out.extend_from_slice(&(n as u64 + 1).to_le_bytes());
    for &s in sizes {
        out.extend_from_slice(&s.to_le_bytes());
    }
    let mut pointer: i64 = 0;
    for &s in sizes {
        out.extend_from_slice(&pointer.to_le_bytes());
        pointer += s as i64 * dtype.bytes() as i64;
    }
    for d in 0..=n as i64 {
        out.extend_from_slice(&d.to_le_bytes());
    }
    out
}

/// A read-only, validated `.bin`/`.idx` pair; the `.bin` is memory-mapped.
pub struct IndexedDataset {
    bin_path: PathBuf,
    dtype: TokenDType,
    sizes: Vec<i32>,
    pointers: Vec<i64>,
    doc_idx: Vec<i64>,
    num_tokens: usize,
    bin: Option<Mmap>,
}

impl std::fmt::Debug for IndexedDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexedDataset")
            .field("bin_path", &self.bin_path)
            .field("dtype", &self.dtype)
            .field("sequences", &self.sizes.len())
            .field("documents", &self.num_documents())
            .field("tokens", &self.num_tokens)
            .finish()
    }
}

impl IndexedDataset {
    /// Opens `PREFIX.idx` and `PREFIX.bin` and checks that they are consistent: magic, version,
    /// dtype code, counts against the `.idx` length, non-negative sizes, `.bin` length equal to
    /// the sum of sizes times the dtype width, every pointer within the `.bin` and contiguous,
    /// `doc_idx` starting at 0, monotone and ending at the sequence count.
    ///
    /// The `.bin` is memory-mapped: it must not be modified while the dataset is open.
    pub fn open(prefix: &Path) -> Result<Self> {
        let idx_path = with_suffix(prefix, ".idx");
        let bin_path = with_suffix(prefix, ".bin");
        let idx = std::fs::read(&idx_path).map_err(|e| DataError::io(&idx_path, e))?;
        let bad = |reason: String| DataError::BadIndex {
            path: idx_path.clone(),
            reason,
        };

        if idx.len() < HEADER_LEN {
            return Err(bad(format!(
                "truncated: the file holds {} bytes, less than the {HEADER_LEN}-byte header",
                idx.len()
            )));
        }
        if &idx[..9] != MAGIC {
            return Err(bad(format!(
                "bad magic {:?}, expected {:?}: not a Megatron MMIDIDX index",
                String::from_utf8_lossy(&idx[..9]),
                String::from_utf8_lossy(MAGIC)
            )));
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&idx[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let version = u64_at(9);
        if version != VERSION {
            return Err(bad(format!(
                "unsupported version {version}, expected {VERSION}"
            )));
        }
        let code = idx[17];
        let dtype = TokenDType::from_code(code).ok_or_else(|| {
            bad(format!(
                "unsupported dtype code {code} (supported: 8 = uint16, 4 = int32)"
            ))
        })?;
        let n_seq = u64_at(18);
        let n_doc_idx = u64_at(26);
        if n_doc_idx == 0 {
            return Err(bad(
                "document index count is 0; it must be documents + 1 >= 1".into(),
            ));
        }
        let expected = (|| {
            let s = usize::try_from(n_seq).ok()?;
            let d = usize::try_from(n_doc_idx).ok()?;
            HEADER_LEN
                .checked_add(s.checked_mul(12)?)?
                .checked_add(d.checked_mul(8)?)
        })()
        .ok_or_else(|| {
            bad(format!(
                "impossible counts in header: {n_seq} sequences, {n_doc_idx} document indices"
            ))
        })?;
        if idx.len() < expected {
            let fit = (idx.len() - HEADER_LEN) / 12;
            return Err(bad(format!(
                "truncated: header says {n_seq} sequences and {n_doc_idx} document indices \
                 ({expected} bytes) but the file holds {} bytes (room for at most {fit} sequences)",
                idx.len()
            )));
        }
        if idx.len() > expected {
            return Err(bad(format!(
                "{} unexpected bytes after the end: header says {n_seq} sequences and \
                 {n_doc_idx} document indices ({expected} bytes)",
                idx.len() - expected
            )));
        }
        let n = n_seq as usize;
        let d = n_doc_idx as usize;
        let sizes_end = HEADER_LEN + 4 * n;
        let pointers_end = sizes_end + 8 * n;
        let sizes: Vec<i32> = idx[HEADER_LEN..sizes_end]
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let read_i64s = |bytes: &[u8]| -> Vec<i64> {
            bytes
                .chunks_exact(8)
                .map(|c| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(c);
                    i64::from_le_bytes(b)
                })
                .collect()
        };
        let pointers = read_i64s(&idx[sizes_end..pointers_end]);
        let doc_idx = read_i64s(&idx[pointers_end..pointers_end + 8 * d]);
        drop(idx);

        if let Some((i, s)) = sizes.iter().enumerate().find(|(_, &s)| s < 0) {
            return Err(bad(format!("sequence {i} has negative size {s}")));
        }
        if doc_idx[0] != 0 {
            return Err(bad(format!("doc_idx starts at {}, expected 0", doc_idx[0])));
        }
        if let Some(i) = (1..d).find(|&i| doc_idx[i] < doc_idx[i - 1]) {
            return Err(bad(format!(
                "doc_idx is not monotone: entry {i} = {} is less than entry {} = {}",
                doc_idx[i],
                i - 1,
                doc_idx[i - 1]
            )));
        }
        if doc_idx[d - 1] != n as i64 {
            return Err(bad(format!(
                "doc_idx ends at {} but there are {n} sequences",
                doc_idx[d - 1]
            )));
        }

        let num_tokens: usize = sizes.iter().map(|&s| s as usize).sum();
        let width = dtype.bytes();
        let bin_expected = num_tokens as u64 * width as u64;
        let bin_file = File::open(&bin_path).map_err(|e| DataError::io(&bin_path, e))?;
        let bin_len = bin_file
            .metadata()
            .map_err(|e| DataError::io(&bin_path, e))?
            .len();
        if bin_len != bin_expected {
            let what = if bin_len < bin_expected {
                "truncated"
            } else {
                "too long"
            };
            return Err(DataError::BadBin {
                path: bin_path,
                reason: format!(
                    "{what}: the index describes {num_tokens} {} tokens ({bin_expected} bytes) \
                     but the file holds {bin_len} bytes",
                    dtype.name()
                ),
            });
        }
        let mut running: i64 = 0;
        for (i, (&p, &s)) in pointers.iter().zip(&sizes).enumerate() {
            let end = p.checked_add(s as i64 * width as i64);
            if p < 0 || end.is_none_or(|e| e as u64 > bin_len) {
                return Err(bad(format!(
                    "pointer out of range: sequence {i} starts at byte {p} with {s} tokens, \
                     but {} holds {bin_len} bytes",
                    bin_path.display()
                )));
            }
            if p != running {
                return Err(bad(format!(
                    "inconsistent pointers: sequence {i} starts at byte {p}, expected {running} \
                     (the sum of the sizes before it)"
                )));
            }
            running += s as i64 * width as i64;
        }

        let bin = if bin_len == 0 {
            None
        } else {
            // SAFETY: the map is read-only; the file is not modified while the dataset is open
            // (documented on `open`). Reads are bounds-checked against the validated length.
            Some(unsafe { Mmap::map(&bin_file) }.map_err(|e| DataError::io(&bin_path, e))?)
        };
        Ok(IndexedDataset {
            bin_path,
            dtype,
            sizes,
            pointers,
            doc_idx,
            num_tokens,
            bin,
        })
    }

    /// Number of documents (`doc_idx` entries - 1).
    pub fn num_documents(&self) -> usize {
        self.doc_idx.len() - 1
    }

    /// Number of sequences (equal to documents in files we write).
    pub fn num_sequences(&self) -> usize {
        self.sizes.len()
    }

    /// Total tokens in the `.bin`.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Token storage type.
    pub fn dtype(&self) -> TokenDType {
        self.dtype
    }

    /// Tokens per sequence, as stored.
    pub fn sizes(&self) -> &[i32] {
        &self.sizes
    }

    fn bin_bytes(&self) -> &[u8] {
        self.bin.as_deref().unwrap_or(&[])
    }

    /// Tokens of document `i`: its sequences concatenated.
    ///
    /// # Panics
    /// If `i >= num_documents()`.
    pub fn document(&self, i: usize) -> Vec<u32> {
        assert!(
            i < self.num_documents(),
            "document {i} out of range: {} holds {} documents",
            self.bin_path.display(),
            self.num_documents()
        );
        // Sequences are contiguous (checked in `open`), so a document is one byte range.
        let (first, last) = (self.doc_idx[i] as usize, self.doc_idx[i + 1] as usize);
        let mut out = Vec::new();
        if first < last {
            let start = self.pointers[first] as usize;
            let end = self.pointers[last - 1] as usize
                + self.sizes[last - 1] as usize * self.dtype.bytes();
            self.dtype
                .decode_into(&self.bin_bytes()[start..end], &mut out);
        }
        out
    }

    /// All tokens, in file order (documents concatenated).
    pub fn tokens(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.num_tokens);
        self.dtype.decode_into(self.bin_bytes(), &mut out);
        out
    }

    /// Token count of each document.
    pub fn document_lengths(&self) -> Vec<usize> {
        self.doc_idx
            .windows(2)
            .map(|w| {
                self.sizes[w[0] as usize..w[1] as usize]
                    .iter()
                    .map(|&s| s as usize)
                    .sum()
            })
            .collect()
    }
}
