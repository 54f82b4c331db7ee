//! The crate's one error type. Every variant names the file (or source) it is about; a cause
//! underneath (an io or JSON error) is the variant's `source`, not repeated in its message, so
//! a program that prints the cause chain prints it once.

use std::path::PathBuf;

/// Everything that can go wrong while reading, tokenising, writing or sampling data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    // ---- files ----
    /// An operating-system error on a file.
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A `.jsonl` line that is not valid JSON (or whose `text` is not a string).
    #[error("{}: line {line}: invalid JSON", path.display())]
    Json {
        path: PathBuf,
        line: u64,
        #[source]
        source: serde_json::Error,
    },
    /// A `.jsonl` line that parses but has no `text` field.
    #[error("{}: line {line}: no \"text\" field", path.display())]
    MissingText { path: PathBuf, line: u64 },
    /// An input whose name ends in neither `.jsonl` nor `.jsonl.zst`.
    #[error("{}: unsupported input: expected a .jsonl or .jsonl.zst file", path.display())]
    UnsupportedInput { path: PathBuf },
    /// A training source that is neither a `.jsonl`/`.jsonl.zst` file nor an indexed-dataset prefix.
    #[error(
        "{}: data source not found: neither an existing .jsonl/.jsonl.zst file nor a prefix with {}.idx",
        path.display(),
        path.display()
    )]
    UnknownSource { path: PathBuf },
    /// A `.jsonl` source was given but no tokenizer to tokenise it.
    #[error("{}: a .jsonl source needs a tokenizer, but none was given", path.display())]
    NeedsTokenizer { path: PathBuf },

    // ---- tokenizer ----
    /// The tokenizer folder or one of its files is missing or invalid.
    #[error("tokenizer {}: {msg}", dir.display())]
    Tokenizer { dir: PathBuf, msg: String },
    /// A token id outside the vocabulary was given to `decode` or to a dataset writer.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfRange { id: u32, vocab_size: usize },

    // ---- indexed datasets ----
    /// A Megatron `.idx` file that is malformed or inconsistent.
    #[error("{}: bad index: {reason}", path.display())]
    BadIndex { path: PathBuf, reason: String },
    /// A Megatron `.bin` file that does not match its `.idx`.
    #[error("{}: bad data file: {reason}", path.display())]
    BadBin { path: PathBuf, reason: String },

    // ---- arguments ----
    /// Nothing to work with: no inputs, no documents, fewer tokens than one sample.
    #[error("empty: {what}")]
    Empty { what: String },
    /// A fraction outside its allowed range.
    #[error("{what} = {value} is out of range: expected 0 <= {what} < 1")]
    BadFraction { what: &'static str, value: f64 },
    /// A batch layout that does not divide evenly.
    #[error("bad batch layout: {reason}")]
    BadBatch { reason: String },
}

/// `Result` with [`DataError`].
pub type Result<T> = std::result::Result<T, DataError>;

impl DataError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }
}
