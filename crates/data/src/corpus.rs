//! A flat token stream loaded from training sources.
//!
//! A source is a text file, `.jsonl` / `.jsonl.zst` / `.jsonl.gz` / `.parquet` (its text column
//! tokenised at load, the end-of-document token after each non-empty document) or a Megatron indexed-dataset prefix `PREFIX` with `PREFIX.idx` and
//! `PREFIX.bin` (a path ending in `.bin` or `.idx` is taken as its prefix). Sources are
//! concatenated in the order given. Every source is resolved before any is read, so a wrong
//! path fails at once, naming it.
//!
//! ```
//! # fn main() -> data::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let prefix = dir.path().join("ds");
//! let mut w = data::IndexedDatasetWriter::create(&prefix, 50257)?;
//! for doc in [&[1, 2, 50256][..], &[3, 50256], &[4, 5, 6, 50256]] {
//!     w.add_document(doc)?;
//! }
//! w.finish()?;
//! let all = data::TokenCorpus::load(&[prefix.clone()], None, "text")?;
//! assert_eq!((all.tokens.len(), all.documents), (9, 3));
//! let (train, valid) = data::TokenCorpus::load_split(&[prefix], None, "text", 0.34)?;
//! assert_eq!(valid.tokens, [4, 5, 6, 50256]); // the last document
//! assert_eq!((train.documents, valid.documents), (2, 1));
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};

use crate::documents::{input_kind, read_documents_counted};
use crate::error::{DataError, Result};
use crate::indexed::{with_suffix, IndexedDataset};
use crate::prepare::{check_fraction, BATCH_DOCS};
use crate::tokenizer::Tokenizer;

/// All tokens of some sources, concatenated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenCorpus {
    pub tokens: Vec<u32>,
    pub documents: usize,
}

enum Source {
    Text(PathBuf),
    Indexed(PathBuf),
}

fn resolve(path: &Path) -> Result<Source> {
    if input_kind(path).is_some() && path.is_file() {
        return Ok(Source::Text(path.to_path_buf()));
    }
    if with_suffix(path, ".idx").is_file() {
        return Ok(Source::Indexed(path.to_path_buf()));
    }
    if matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("bin" | "idx")
    ) {
        let prefix = path.with_extension("");
        if with_suffix(&prefix, ".idx").is_file() {
            return Ok(Source::Indexed(prefix));
        }
    }
    Err(DataError::UnknownSource {
        path: path.to_path_buf(),
    })
}

/// Tokens of all sources and the end offset of each document.
fn load_with_ends(
    sources: &[PathBuf],
    tokenizer: Option<&Tokenizer>,
    text_column: &str,
) -> Result<(Vec<u32>, Vec<usize>)> {
    if sources.is_empty() {
        return Err(DataError::Empty {
            what: "no data sources given".into(),
        });
    }
    let resolved = sources
        .iter()
        .map(|s| resolve(s))
        .collect::<Result<Vec<_>>>()?;
    let mut tokens = Vec::new();
    let mut ends = Vec::new();
    for source in resolved {
        match source {
            Source::Text(path) => {
                let tok =
                    tokenizer.ok_or_else(|| DataError::NeedsTokenizer { path: path.clone() })?;
                let mut docs = read_documents_counted(&path, text_column, None)?.peekable();
                while docs.peek().is_some() {
                    let batch = docs
                        .by_ref()
                        .take(BATCH_DOCS)
                        .filter(|d| !matches!(d, Ok(t) if t.is_empty()))
                        .collect::<Result<Vec<String>>>()?;
                    for ids in tok.encode_batch(&batch)? {
                        tokens.extend_from_slice(&ids);
                        tokens.push(tok.eod_id());
                        ends.push(tokens.len());
                    }
                }
            }
            Source::Indexed(prefix) => {
                let ds = IndexedDataset::open(&prefix)?;
                let base = tokens.len();
                tokens.extend(ds.tokens());
                let mut end = base;
                for len in ds.document_lengths() {
                    end += len;
                    ends.push(end);
                }
            }
        }
    }
    if tokens.is_empty() {
        return Err(DataError::Empty {
            what: format!("the data sources hold no tokens: {sources:?}"),
        });
    }
    Ok((tokens, ends))
}

impl TokenCorpus {
    /// [`token_fingerprint`] of the tokens: what the trainer records to know, on resume, that
    /// it reads the same stream, in the same order (whatever files or paths it came from).
    ///
    /// [`token_fingerprint`]: crate::token_fingerprint
    pub fn fingerprint(&self) -> u32 {
        crate::fingerprint::token_fingerprint(&self.tokens)
    }

    /// Loads and concatenates `sources`. `tokenizer` is needed iff a source is a text file,
    /// whose documents are its `text_column` ([`crate::TEXT_COLUMN`] unless told otherwise).
    /// Errors if a source cannot be resolved or read, or all together hold no tokens.
    pub fn load(
        sources: &[PathBuf],
        tokenizer: Option<&Tokenizer>,
        text_column: &str,
    ) -> Result<Self> {
        let (tokens, ends) = load_with_ends(sources, tokenizer, text_column)?;
        Ok(TokenCorpus {
            tokens,
            documents: ends.len(),
        })
    }

    /// Loads `sources` and splits off the last `fraction` of the documents (rounded, at least
    /// one and at most all but one) as validation: returns `(train, valid)`. With a single
    /// document the split falls inside it, at the last `fraction` of the tokens (each side
    /// then counts one document). `fraction = 0` gives an empty validation corpus.
    pub fn load_split(
        sources: &[PathBuf],
        tokenizer: Option<&Tokenizer>,
        text_column: &str,
        valid_fraction: f64,
    ) -> Result<(Self, Self)> {
        check_fraction("valid_fraction", valid_fraction)?;
        let (mut tokens, ends) = load_with_ends(sources, tokenizer, text_column)?;
        let docs = ends.len();
        if valid_fraction == 0.0 {
            return Ok((
                TokenCorpus {
                    tokens,
                    documents: docs,
                },
                TokenCorpus::default(),
            ));
        }
        let (cut, valid_docs) = if docs >= 2 {
            let n_valid = ((docs as f64 * valid_fraction).round() as usize).clamp(1, docs - 1);
            (ends[docs - n_valid - 1], n_valid)
        } else {
            let n = tokens.len();
            let n_valid =
                ((n as f64 * valid_fraction).round() as usize).clamp(1, n.saturating_sub(1).max(1));
            (n - n_valid, 1)
        };
        let valid = tokens.split_off(cut);
        Ok((
            TokenCorpus {
                tokens,
                documents: docs.saturating_sub(valid_docs).max(1),
            },
            TokenCorpus {
                tokens: valid,
                documents: valid_docs,
            },
        ))
    }
}
