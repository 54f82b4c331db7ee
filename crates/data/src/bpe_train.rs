//! `trainer tokenizer`: trains a byte-level BPE on the user's text files and writes it as a
//! `tokenizer.json`.
//!
//! The tokenizer is GPT-2's kind: the byte-level pre-tokenizer with GPT-2's regex (no prefix
//! space), the 256 byte tokens as the initial alphabet (any text encodes), BPE merges learnt
//! by `tokenizers`' `BpeTrainer` up to `vocab_size` tokens in all, the byte-level
//! post-processor and decoder, and `<|endoftext|>` as a special token (id 0), which
//! [`crate::Tokenizer`] takes as the end-of-document token. More special tokens follow it.
//!
//! ```
//! # fn main() -> data::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let input = dir.path().join("in.jsonl");
//! std::fs::write(&input, "{\"text\": \"low lower lowest\"}\n{\"text\": \"new newer\"}\n").unwrap();
//! let output = dir.path().join("tokenizer.json");
//! data::train_tokenizer(&data::TrainTokenizerOptions {
//!     inputs: vec![input],
//!     output: output.clone(),
//!     vocab_size: 300,
//!     special: vec![],
//!     text_column: data::TEXT_COLUMN.into(),
//!     progress: false,
//! })?;
//! let tok = data::Tokenizer::open(&output, None)?;
//! assert_eq!(tok.eod_id(), 0);
//! assert_eq!(tok.decode(&tok.encode("lowest newer")?)?, "lowest newer");
//! # Ok(())
//! # }
//! ```

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    TokenizerImpl,
};

use crate::documents::{input_kind, read_documents_counted};
use crate::error::{DataError, Result};
use crate::indexed::with_suffix;
use crate::tokenizer::EOT_TOKEN;

/// What to train.
#[derive(Clone, Debug)]
pub struct TrainTokenizerOptions {
    /// `.jsonl` / `.jsonl.zst` / `.jsonl.gz` / `.parquet` files, read in this order.
    pub inputs: Vec<PathBuf>,
    /// The `tokenizer.json` to write.
    pub output: PathBuf,
    /// Tokens in all: the 256 bytes, the special tokens and the merges. At least 256 + the
    /// special tokens (`<|endoftext|>` and `special`).
    pub vocab_size: usize,
    /// Special tokens after `<|endoftext|>`.
    pub special: Vec<String>,
    /// The JSON field or Parquet column holding each document's text.
    pub text_column: String,
    /// Show a progress bar (on stderr) over the input bytes.
    pub progress: bool,
}

/// What [`train_tokenizer`] read and wrote.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrainTokenizerStats {
    /// Tokens of the tokenizer written (at most the `vocab_size` asked for: a small corpus may
    /// run out of pairs to merge).
    pub vocab_size: usize,
    pub documents: u64,
    /// UTF-8 bytes of document text read.
    pub text_bytes: u64,
    pub seconds: f64,
}

/// The largest vocabulary [`train_tokenizer`] trains: 2^22 tokens, 16 times the largest of
/// today's open models (Gemma's 262,144).
pub const MAX_VOCAB: usize = 1 << 22;

/// Trains a byte-level BPE on `opts.inputs` and writes it to `opts.output` (see the module
/// doc).
///
/// The arguments, the inputs (each opened) and the output (created) are checked before the
/// inputs are read; the output is written whole at the end, through a temporary file beside it.
pub fn train_tokenizer(opts: &TrainTokenizerOptions) -> Result<TrainTokenizerStats> {
    let start = Instant::now();
    let mut special: Vec<String> = vec![EOT_TOKEN.to_string()];
    for s in &opts.special {
        if !special.contains(s) {
            special.push(s.clone());
        }
    }
    if opts.vocab_size < 256 + special.len() {
        return Err(DataError::VocabTooSmall {
            vocab_size: opts.vocab_size,
            specials: special.len(),
        });
    }
    // The trainer allocates per token asked for, before reading a byte: a typo such as
    // 2000000000 would abort on allocation rather than say so.
    if opts.vocab_size > MAX_VOCAB {
        return Err(DataError::VocabTooLarge {
            vocab_size: opts.vocab_size,
            max: MAX_VOCAB,
        });
    }
    if opts.inputs.is_empty() {
        return Err(DataError::Empty {
            what: "no input files given to train a tokenizer on".into(),
        });
    }
    let mut total_bytes = 0u64;
    for path in &opts.inputs {
        if input_kind(path).is_none() {
            return Err(DataError::UnsupportedInput { path: path.clone() });
        }
        let meta = std::fs::metadata(path).map_err(|e| DataError::io(path, e))?;
        total_bytes += meta.len();
        read_documents_counted(path, &opts.text_column, None)?;
    }
    let temp = with_suffix(&opts.output, ".tmp");
    std::fs::File::create(&temp).map_err(|e| DataError::io(&opts.output, e))?;
    let result = train(opts, &special, total_bytes, start);
    match result {
        Ok((json, stats)) => {
            std::fs::write(&temp, json)
                .and_then(|()| std::fs::rename(&temp, &opts.output))
                .map_err(|e| {
                    let _ = std::fs::remove_file(&temp);
                    DataError::io(&opts.output, e)
                })?;
            Ok(stats)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&temp);
            Err(e)
        }
    }
}

type Bpe = TokenizerImpl<
    BPE,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// The training itself: the tokenizer's JSON and the stats.
fn train(
    opts: &TrainTokenizerOptions,
    special: &[String],
    total_bytes: u64,
    start: Instant,
) -> Result<(String, TrainTokenizerStats)> {
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(opts.vocab_size)
        .min_frequency(0)
        .show_progress(false)
        .special_tokens(
            special
                .iter()
                .map(|s| AddedToken::from(s.clone(), true))
                .collect(),
        )
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect::<HashSet<char>>())
        .build();
    let mut tokenizer: Bpe = TokenizerImpl::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tokenizer.with_post_processor(Some(ByteLevel::new(true, false, true)));
    tokenizer.with_decoder(Some(ByteLevel::new(false, true, true)));

    let bar = if opts.progress {
        let style = ProgressStyle::with_template(
            "{msg} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        ProgressBar::new(total_bytes)
            .with_style(style)
            .with_message("counting words")
    } else {
        ProgressBar::hidden()
    };
    let counter = Arc::new(AtomicU64::new(0));
    // The first error met reading the inputs; the documents stop there.
    let failed: Mutex<Option<DataError>> = Mutex::new(None);
    let (mut documents, mut text_bytes) = (0u64, 0u64);
    let mut files = opts.inputs.iter();
    let mut current: Option<crate::documents::Documents> = None;
    let docs = std::iter::from_fn(|| loop {
        if let Some(docs) = current.as_mut() {
            match docs.next() {
                Some(Ok(text)) => {
                    documents += 1;
                    text_bytes += text.len() as u64;
                    bar.set_position(counter.load(Ordering::Relaxed));
                    return Some(text);
                }
                Some(Err(e)) => {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    return None;
                }
                None => current = None,
            }
        }
        let path = files.next()?;
        match read_documents_counted(path, &opts.text_column, Some(counter.clone())) {
            Ok(d) => current = Some(d),
            Err(e) => {
                *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                return None;
            }
        }
    });
    let trained = tokenizer.train(&mut trainer, docs).map(|_| ());
    if let Some(e) = failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(e);
    }
    let tok_err = |e: tokenizers::Error| DataError::Tokenizer {
        path: opts.output.clone(),
        msg: format!("training failed: {e}"),
    };
    trained.map_err(tok_err)?;
    bar.set_position(total_bytes);
    bar.finish_and_clear();
    let json = tokenizer.to_string(true).map_err(tok_err)?;
    let stats = TrainTokenizerStats {
        vocab_size: tokenizer.get_vocab_size(true),
        documents,
        text_bytes,
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok((json, stats))
}
