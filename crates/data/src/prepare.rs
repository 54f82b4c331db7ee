//! `trainer prepare-data`: text files (`.jsonl`, `.jsonl.zst`, `.jsonl.gz`, `.parquet`) to
//! Megatron `.bin`/`.idx` token files.
//!
//! Documents are read in input order (a reader thread decompresses and parses the next batch
//! while the current one is tokenised), tokenised in batches of up to [`BATCH_DOCS`] documents
//! (or [`BATCH_BYTES`] of text) with [`Tokenizer::encode_batch`] in parallel, each followed by
//! the end-of-document token (GPT-2's `<|endoftext|>`), and appended to `OUTPUT.{bin,idx}`. Documents with empty text are skipped,
//! as Megatron's `preprocess_data.py` does.
//!
//! Held-out split: document `j` (0-based, counted over all inputs in order, empty ones included)
//! goes to `OUTPUT_valid.{bin,idx}` iff [`is_held_out`]`(j, valid_fraction)`: the top 53 bits of
//! `splitmix64(j)` read as a number in `[0, 1)` fall below `valid_fraction`. The split is
//! deterministic, independent of batching and threads, and near `valid_fraction` of documents.
//!
//! ```
//! # fn main() -> data::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let input = dir.path().join("in.jsonl");
//! std::fs::write(&input, "{\"text\": \"Hello world\"}\n{\"text\": \"\"}\n").unwrap();
//! let stats = data::prepare(&data::PrepareOptions {
//!     inputs: vec![input],
//!     output: dir.path().join("out"),
//!     tokenizer: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/gpt2"),
//!     eod_token: None,
//!     text_column: data::TEXT_COLUMN.into(),
//!     valid_fraction: 0.0,
//!     progress: false,
//! })?;
//! assert_eq!((stats.documents, stats.tokens, stats.text_bytes), (1, 3, 11));
//! let ds = data::IndexedDataset::open(&dir.path().join("out"))?;
//! assert_eq!(ds.document(0), [15496, 995, 50256]); // "Hello", " world", <|endoftext|>
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use crate::documents::{input_kind, read_documents_counted};
use crate::error::{DataError, Result};
use crate::indexed::{with_suffix, IndexedDatasetWriter};
use crate::sampler::splitmix64;
use crate::tokenizer::Tokenizer;

/// Most documents tokenised in one parallel batch.
pub const BATCH_DOCS: usize = 256;
/// Most text bytes in one batch (bounds memory on very long documents).
pub const BATCH_BYTES: usize = 8 << 20;

/// What to prepare.
#[derive(Clone, Debug)]
pub struct PrepareOptions {
    /// `.jsonl` / `.jsonl.zst` / `.jsonl.gz` / `.parquet` files, read in this order.
    pub inputs: Vec<PathBuf>,
    /// Output prefix: writes `PREFIX.bin` and `PREFIX.idx`.
    pub output: PathBuf,
    /// Folder with GPT-2's `vocab.json` and `merges.txt`, or a `tokenizer.json` (or a folder
    /// with one): see [`Tokenizer::open`].
    pub tokenizer: PathBuf,
    /// The end-of-document token; `None`: the tokenizer's own.
    pub eod_token: Option<String>,
    /// The JSON field or Parquet column holding each document's text ([`crate::TEXT_COLUMN`]).
    pub text_column: String,
    /// Fraction of documents held out into `PREFIX_valid.{bin,idx}`; 0 = none. In `[0, 1)`.
    pub valid_fraction: f64,
    /// Show a progress bar (on stderr) over the input bytes.
    pub progress: bool,
}

/// What [`prepare`] wrote. Token counts include the end-of-document token after each document.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrepareStats {
    /// Training documents written.
    pub documents: usize,
    /// Training tokens written.
    pub tokens: usize,
    /// UTF-8 bytes of document text read (both splits).
    pub text_bytes: u64,
    pub valid_documents: usize,
    pub valid_tokens: usize,
    pub seconds: f64,
}

/// The prefix of the held-out split: `PREFIX_valid`.
pub fn valid_prefix(output: &Path) -> PathBuf {
    with_suffix(output, "_valid")
}

/// Whether document `j` is held out for validation at `fraction` (see the module doc).
pub fn is_held_out(j: u64, fraction: f64) -> bool {
    if fraction <= 0.0 {
        return false;
    }
    let mut state = j;
    let h = splitmix64(&mut state);
    ((h >> 11) as f64) * (1.0 / (1u64 << 53) as f64) < fraction
}

/// Checks that a fraction lies in `[0, 1)`.
pub(crate) fn check_fraction(what: &'static str, value: f64) -> Result<()> {
    if (0.0..1.0).contains(&value) {
        Ok(())
    } else {
        Err(DataError::BadFraction { what, value })
    }
}

/// Tokenises `opts.inputs` into Megatron indexed datasets (see the module doc).
///
/// Inputs and the tokenizer are checked before anything is written. On any error no output
/// files are left in place of the new ones (only the writers' temp files are touched).
pub fn prepare(opts: &PrepareOptions) -> Result<PrepareStats> {
    let start = Instant::now();
    check_fraction("valid_fraction", opts.valid_fraction)?;
    if opts.inputs.is_empty() {
        return Err(DataError::Empty {
            what: "no input files given to prepare-data".into(),
        });
    }
    let mut total_bytes = 0u64;
    for path in &opts.inputs {
        if input_kind(path).is_none() {
            return Err(DataError::UnsupportedInput { path: path.clone() });
        }
        let meta = std::fs::metadata(path).map_err(|e| DataError::io(path, e))?;
        total_bytes += meta.len();
        // Opening reads a compressed header or a Parquet footer: a missing column is said now.
        read_documents_counted(path, &opts.text_column, None)?;
    }
    let tok = Tokenizer::open(&opts.tokenizer, opts.eod_token.as_deref())?;
    let eot = tok.eod_id();

    let mut train = IndexedDatasetWriter::create(&opts.output, tok.vocab_size())?;
    let mut valid = if opts.valid_fraction > 0.0 {
        Some(IndexedDatasetWriter::create(
            &valid_prefix(&opts.output),
            tok.vocab_size(),
        )?)
    } else {
        None
    };

    let bar = if opts.progress {
        let style = ProgressStyle::with_template(
            "{msg} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        ProgressBar::new(total_bytes)
            .with_style(style)
            .with_message("tokenising")
    } else {
        ProgressBar::hidden()
    };
    let counter = Arc::new(AtomicU64::new(0));
    let mut text_bytes = 0u64;
    let mut j = 0u64;

    std::thread::scope(|scope| -> Result<()> {
        let (tx, rx) = sync_channel::<Result<Vec<String>>>(2);
        let inputs = &opts.inputs;
        let column = opts.text_column.as_str();
        let reader_counter = counter.clone();
        scope.spawn(move || {
            let mut batch = Vec::with_capacity(BATCH_DOCS);
            let mut bytes = 0usize;
            for path in inputs {
                let docs = match read_documents_counted(path, column, Some(reader_counter.clone()))
                {
                    Ok(d) => d,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                for doc in docs {
                    match doc {
                        Ok(text) => {
                            bytes += text.len();
                            batch.push(text);
                            if batch.len() >= BATCH_DOCS || bytes >= BATCH_BYTES {
                                bytes = 0;
                                let full =
                                    std::mem::replace(&mut batch, Vec::with_capacity(BATCH_DOCS));
                                if tx.send(Ok(full)).is_err() {
                                    return; // the consumer stopped (an error downstream)
                                }
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    }
                }
            }
            if !batch.is_empty() {
                let _ = tx.send(Ok(batch));
            }
        });

        let mut doc_tokens = Vec::new();
        for batch in rx {
            let batch = batch?;
            let encoded = tok.encode_batch(&batch)?;
            for (text, ids) in batch.iter().zip(encoded) {
                text_bytes += text.len() as u64;
                let held_out = is_held_out(j, opts.valid_fraction);
                j += 1;
                if text.is_empty() {
                    continue;
                }
                doc_tokens.clear();
                doc_tokens.extend_from_slice(&ids);
                doc_tokens.push(eot);
                match (&mut valid, held_out) {
                    (Some(v), true) => v.add_document(&doc_tokens)?,
                    _ => train.add_document(&doc_tokens)?,
                }
            }
            bar.set_position(counter.load(Ordering::Relaxed));
        }
        Ok(())
    })?;

    if train.num_documents() == 0 {
        return Err(DataError::Empty {
            what: format!(
                "no documents for the training split ({j} documents read, {} held out)",
                valid.as_ref().map_or(0, |v| v.num_documents())
            ),
        });
    }
    let train_stats = train.finish()?;
    let valid_stats = valid.map(IndexedDatasetWriter::finish).transpose()?;
    bar.set_position(total_bytes);
    bar.finish();
    Ok(PrepareStats {
        documents: train_stats.documents,
        tokens: train_stats.tokens,
        text_bytes,
        valid_documents: valid_stats.as_ref().map_or(0, |s| s.documents),
        valid_tokens: valid_stats.as_ref().map_or(0, |s| s.tokens),
        seconds: start.elapsed().as_secs_f64(),
    })
}
