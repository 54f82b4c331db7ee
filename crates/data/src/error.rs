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
    /// A `.jsonl` line that parses but has no string field named the text column (`text`).
    #[error("{}: line {line}: no \"{field}\" field", path.display())]
    MissingText {
        path: PathBuf,
        line: u64,
        field: String,
    },
    /// An input whose name ends in none of `.jsonl`, `.jsonl.zst`, `.jsonl.gz`, `.parquet`.
    #[error(
        "{}: unsupported input: expected a .jsonl, .jsonl.zst, .jsonl.gz or .parquet file",
        path.display()
    )]
    UnsupportedInput { path: PathBuf },
    /// A training source that is neither a text file of a known kind nor an indexed-dataset prefix.
    #[error(
        "{}: data source not found: neither an existing .jsonl/.jsonl.zst/.jsonl.gz/.parquet file nor a prefix with {}.idx",
        path.display(),
        path.display()
    )]
    UnknownSource { path: PathBuf },
    /// A text source was given but no tokenizer to tokenise it.
    #[error("{}: a text source needs a tokenizer, but none was given", path.display())]
    NeedsTokenizer { path: PathBuf },

    // ---- Parquet ----
    /// A Parquet file that cannot be read (bad footer, page, codec).
    #[error("{}: cannot read Parquet", path.display())]
    Parquet {
        path: PathBuf,
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// A Parquet file without the text column.
    #[error(
        "{}: no column \"{column}\" (its columns: {}); set the text column (data.text_column, --text-column)",
        path.display(),
        columns.join(", ")
    )]
    MissingColumn {
        path: PathBuf,
        column: String,
        columns: Vec<String>,
    },
    /// A Parquet text column that does not hold strings (or is nested).
    #[error("{}: column \"{column}\" is {found}, not a string column", path.display())]
    NotStringColumn {
        path: PathBuf,
        column: String,
        found: String,
    },
    /// A Parquet string value that is not UTF-8.
    #[error("{}: row {row}: column \"{column}\" is not valid UTF-8", path.display())]
    NotUtf8 {
        path: PathBuf,
        column: String,
        row: u64,
    },

    // ---- tokenizer ----
    /// The tokenizer (folder or tokenizer.json) or one of its files is missing or invalid.
    #[error("tokenizer {}: {msg}", path.display())]
    Tokenizer { path: PathBuf, msg: String },
    /// A tokenizer.json with none of the usual end-of-document tokens, and none named.
    #[error(
        "tokenizer {}: no end-of-document token (none of {} is a special token of it): set data.eod_token (prepare-data: --eod-token)",
        path.display(),
        crate::tokenizer::EOD_CANDIDATES.join(" ")
    )]
    NoEodToken { path: PathBuf },
    /// The end-of-document token named is not in the vocabulary.
    #[error("tokenizer {}: the end-of-document token {token:?} is not in its vocabulary", path.display())]
    UnknownEodToken { path: PathBuf, token: String },
    /// A token id outside the vocabulary was given to `decode` or to a dataset writer.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfRange { id: u32, vocab_size: usize },
    /// A vocabulary size for tokenizer training below the byte alphabet plus the special tokens.
    #[error(
        "vocab size {vocab_size} is too small: a byte-level BPE needs at least 256 byte tokens + {specials} special tokens = {}",
        256 + specials
    )]
    VocabTooSmall { vocab_size: usize, specials: usize },
    #[error("vocab size {vocab_size} is too large: at most {max} tokens are trained")]
    VocabTooLarge { vocab_size: usize, max: usize },

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
    /// A rank past the world size.
    #[error("rank {rank} is out of range for world size {world}")]
    RankOutOfRange { rank: usize, world: usize },
    /// A micro-batch past the rank's last.
    #[error("micro-batch {micro} is out of range: {micros} micro-batches per rank")]
    MicroBatchOutOfRange { micro: usize, micros: usize },
    /// A sample past the end of the token stream (a stream shorter than the sampler's).
    #[error("sample {id} needs tokens {start}..{end} but the stream has {len}")]
    SampleOutOfRange {
        id: usize,
        start: usize,
        end: usize,
        len: usize,
    },
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
