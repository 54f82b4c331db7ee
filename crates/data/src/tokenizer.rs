//! Tokenisation, via the `tokenizers` crate: GPT-2's byte-level BPE from its two files, or
//! any Hugging Face `tokenizer.json`.
//!
//! [`Tokenizer::open`] takes a folder with the two files OpenAI published with GPT-2
//! (`vocab.json`, `merges.txt`), a `tokenizer.json` file (anything `tokenizers` loads:
//! byte-level BPE, Unigram, WordPiece), or a folder holding a `tokenizer.json` (and not the two
//! GPT-2 files, which win when both are there).
//!
//! GPT-2's files: GPT-2's regex pre-tokenisation on raw bytes, no prefix space, BPE merges,
//! byte-level decoding. `<|endoftext|>` (id 50256) is an ordinary vocabulary entry here, not a
//! special token: the text "<|endoftext|>" inside a document is tokenised as plain text, so a
//! document can never forge a document boundary. Only [`Tokenizer::eod_id`] marks boundaries.
//! A `tokenizer.json` runs `tokenizers`' own pipeline (normalizer, pre-tokenizer, model)
//! without the tokens its post-processor adds (no BOS or EOS, like Llama 3's
//! `<|begin_of_text|>`: the end-of-document token is ours to add), with its special tokens
//! encoded as plain text for the same reason, and with any truncation or padding saved in the
//! file turned off (a document is whole). Added tokens that are not special (Qwen's `<think>`,
//! `<tool_call>`) are still matched in the text, as in Python. The ids are the Python
//! `tokenizers` library's with `add_special_tokens=False, encode_special_tokens=True`, checked
//! on tokenizers in the styles of Llama 3 and Qwen (tests/families.rs).
//!
//! End of document: the token named (`data.eod_token`), else GPT-2's `<|endoftext|>`, else the
//! first of [`EOD_CANDIDATES`] that is a special (added) token of the `tokenizer.json`.
//!
//! Speed (GPT-2's files): `tokenizers`' full pipeline allocates several objects per word
//! (normalized strings, alignments, token strings) and spends most of its time in `malloc`.
//! [`Tokenizer::encode`] therefore runs the same steps itself: the same GPT-2 split regex
//! (`tokenizers`' own onig `SysRegex`, same pattern), the byte-to-unicode map, and the
//! `tokenizers` BPE model for words not yet in a shared word -> ids cache. The tests check it
//! against the full pipeline ([`Tokenizer::encode_with_pipeline`]) token for token, on the
//! whole bundled corpus too.
//!
//! Memory (GPT-2's files): onig's match of one pre-token holds about 32 bytes per byte of it
//! (its backtrack stack), and BPE's merge of it about 80 (the symbols, the merge queue, the
//! tokens with their strings), so a 50 MB document without whitespace, one pre-token, took
//! 4 GB. The split regex therefore runs on windows of [`MAX_PRETOKEN_BYTES`], and a pre-token
//! longer than that is cut, at a character boundary, into pieces of at most that length, each
//! merged on its own. The tokens of ordinary text are unchanged (no word, number, or run of
//! spaces or punctuation in prose or code is 64 KiB long), and a 50 MB word takes a few MB.
//! A `tokenizer.json` has no such bound: its pipeline sees each document whole.
//!
//! ```
//! # fn main() -> data::Result<()> {
//! let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/gpt2");
//! let tok = data::Tokenizer::open(&dir, None)?;
//! assert_eq!(tok.encode("Hello world")?, [15496, 995]);
//! assert_eq!(tok.decode(&[15496, 995])?, "Hello world");
//! assert_eq!((tok.eod_id(), tok.vocab_size()), (50256, 50257));
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use rayon::prelude::*;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::utils::SysRegex;
use tokenizers::{AddedToken, Model};

use crate::error::{DataError, Result};
use crate::fingerprint::tokenizer_fingerprint;

/// GPT-2's end-of-text token, which ends every document of a GPT-2 tokenizer.
pub const EOT_TOKEN: &str = "<|endoftext|>";

/// The end-of-document tokens looked for among a `tokenizer.json`'s special (added) tokens,
/// in this order, when none is named: Llama 3's, Llama 2's / T5's / Mistral's, GPT-2's and
/// Qwen's, Gemma's, BERT's. Chat turns' ends (Llama 3's `<|eot_id|>`, Qwen's `<|im_end|>`) are
/// not candidates: they end a turn, not a pretraining document; name them to use them.
pub const EOD_CANDIDATES: [&str; 5] =
    ["<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>", "[SEP]"];

/// GPT-2's pre-tokenisation regex, as in `tokenizers`' ByteLevel pre-tokenizer and OpenAI's
/// `encoder.py`.
const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Longest pre-token, in bytes (see the module doc): the split regex sees at most this much
/// text at a time, and BPE merges at most this much at once. A longer pre-token is cut into
/// pieces, and no token spans two of them; such a token could only be at a cut.
pub const MAX_PRETOKEN_BYTES: usize = 64 << 10;

/// Bytes past a match's end that the split regex may read to decide it (the character after a
/// run of whitespace, one after that for `(?!\S)`; 4 bytes each at most), doubled for safety:
/// a match that ends this close to its window's end may continue past it, so it is found again
/// from a window that starts where it starts.
const LOOKAHEAD_BYTES: usize = 16;

/// Most words kept in the word -> ids cache (a few tens of MB when full; it is never evicted,
/// like `tokenizers`' own cache). Words of `CACHE_MAX_WORD_BYTES` or more are not cached.
const CACHE_WORDS: usize = 1 << 20;
const CACHE_MAX_WORD_BYTES: usize = 256;

/// GPT-2's reversible map from bytes to printable characters (OpenAI `encoder.py`,
/// `bytes_to_unicode`): printable Latin-1 bytes map to themselves, the others to U+0100 upwards.
fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        // Codes are below 0x200: always valid scalar values.
        table[b as usize] = char::from_u32(code).unwrap_or('\0');
    }
    table
}

/// A tokenizer: GPT-2's files through a fast path of our own, or a `tokenizer.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    kind: Kind,
    path: PathBuf,
    eod: u32,
    vocab_size: usize,
    fingerprint: u32,
}

/// What the tokenizer was loaded from.
enum Kind {
    /// `vocab.json` + `merges.txt`: [`Tokenizer::encode`]'s own pipeline (see the module doc).
    Gpt2 {
        split: SysRegex,
        byte_chars: Box<[char; 256]>,
        cache: RwLock<HashMap<String, Box<[u32]>>>,
    },
    /// A `tokenizer.json`, as read (what [`Tokenizer::save_json`] writes back).
    Json { bytes: Vec<u8> },
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size)
            .field("eod", &self.eod)
            .finish()
    }
}

impl Tokenizer {
    /// Loads a tokenizer (see the module doc): `path` is a folder with GPT-2's `vocab.json`
    /// and `merges.txt`, a `tokenizer.json` file, or a folder with a `tokenizer.json`.
    /// `eod_token` names the end-of-document token; `None` takes the tokenizer's own.
    ///
    /// Errors name the folder or file: a missing folder or file, invalid JSON, for GPT-2's
    /// files no merges, a merge line that is not two tokens or names a token (or a merged pair)
    /// outside the vocabulary, a vocabulary without one of the 256 byte tokens; an
    /// end-of-document token that is not in the vocabulary, or none found.
    pub fn open(path: &Path, eod_token: Option<&str>) -> Result<Self> {
        let err = |msg: &str| DataError::Tokenizer {
            path: path.to_path_buf(),
            msg: msg.into(),
        };
        if path.is_dir() {
            let gpt2 = ["vocab.json", "merges.txt"]
                .iter()
                .any(|f| path.join(f).exists());
            if gpt2 {
                Self::from_gpt2_dir(path, eod_token)
            } else if path.join("tokenizer.json").is_file() {
                Self::from_json(&path.join("tokenizer.json"), eod_token)
            } else {
                Err(err(
                    "the folder holds neither vocab.json and merges.txt nor tokenizer.json",
                ))
            }
        } else if path.is_file() {
            Self::from_json(path, eod_token)
        } else {
            Err(err(
                "not found (expected a folder with vocab.json and merges.txt, or a \
                 tokenizer.json file)",
            ))
        }
    }

    /// Loads `dir/vocab.json` and `dir/merges.txt`.
    fn from_gpt2_dir(dir: &Path, eod_token: Option<&str>) -> Result<Self> {
        let err = |msg: String| DataError::Tokenizer {
            path: dir.to_path_buf(),
            msg,
        };
        let vocab_path = dir.join("vocab.json");
        let merges_path = dir.join("merges.txt");
        let read =
            |p: &Path| std::fs::read_to_string(p).map_err(|e| err(format!("{}: {e}", p.display())));
        let vocab_text = read(&vocab_path)?;
        let merges_text = read(&merges_path)?;

        let vocab: std::collections::HashMap<String, u32> = serde_json::from_str(&vocab_text)
            .map_err(|e| {
                err(format!(
                    "{}: invalid vocabulary JSON: {e}",
                    vocab_path.display()
                ))
            })?;
        let eod = match eod_token {
            Some(token) => *vocab.get(token).ok_or_else(|| DataError::UnknownEodToken {
                path: dir.to_path_buf(),
                token: token.to_string(),
            })?,
            None => *vocab.get(EOT_TOKEN).ok_or_else(|| {
                err(format!(
                    "{}: no {EOT_TOKEN} entry (not a GPT-2 vocabulary; name the end-of-document \
                     token with data.eod_token)",
                    vocab_path.display()
                ))
            })?,
        };
        // Every byte must have a token, so that encoding can never fail (see `encode`).
        for c in ByteLevel::alphabet() {
            if !vocab.contains_key(c.encode_utf8(&mut [0; 4]) as &str) {
                return Err(err(format!(
                    "{}: byte token {c:?} missing (not a byte-level BPE vocabulary)",
                    vocab_path.display()
                )));
            }
        }
        let vocab_size = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);

        let mut merges: Merges = Vec::new();
        for (i, line) in merges_text.lines().enumerate() {
            if line.starts_with("#version") || line.trim().is_empty() {
                continue;
            }
            let mut parts = line.split(' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(a), Some(b), None)
                    if vocab.contains_key(a)
                        && vocab.contains_key(b)
                        && vocab.contains_key(&format!("{a}{b}")) =>
                {
                    merges.push((a.to_string(), b.to_string()))
                }
                _ => {
                    return Err(err(format!(
                        "{}: line {}: expected two vocabulary tokens separated by a space, whose \
                         concatenation is in the vocabulary too; found {line:?}",
                        merges_path.display(),
                        i + 1
                    )))
                }
            }
        }

        if merges.is_empty() {
            return Err(err(format!(
                "{}: no merges (an empty or truncated file; GPT-2's has 50,000)",
                merges_path.display()
            )));
        }
        let mut by_id: Vec<(u32, &str)> = vocab.iter().map(|(t, &id)| (id, t.as_str())).collect();
        by_id.sort_unstable();
        let mut fingerprint =
            tokenizer_fingerprint(by_id, merges.iter().map(|(a, b)| (a.as_str(), b.as_str())));
        // Another end-of-document token than GPT-2's own is part of the tokenizer's meaning;
        // GPT-2's own leaves the fingerprint as it always was.
        if vocab.get(EOT_TOKEN) != Some(&eod) {
            let mut h = crc32fast::Hasher::new_with_initial(fingerprint);
            h.update(&eod.to_le_bytes());
            fingerprint = h.finalize();
        }
        let vocab: Vocab = vocab.into_iter().collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| err(format!("building BPE: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        inner.with_decoder(Some(ByteLevel::new(false, true, true)));
        let split = SysRegex::new(GPT2_SPLIT).map_err(|e| err(format!("split regex: {e}")))?;
        Ok(Tokenizer {
            inner,
            kind: Kind::Gpt2 {
                split,
                byte_chars: Box::new(byte_chars()),
                cache: RwLock::new(HashMap::new()),
            },
            path: dir.to_path_buf(),
            eod,
            vocab_size,
            fingerprint,
        })
    }

    /// Loads a `tokenizer.json`.
    fn from_json(file: &Path, eod_token: Option<&str>) -> Result<Self> {
        let err = |msg: String| DataError::Tokenizer {
            path: file.to_path_buf(),
            msg,
        };
        let bytes = std::fs::read(file).map_err(|e| err(e.to_string()))?;
        let mut inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| err(format!("not a tokenizer.json that tokenizers loads: {e}")))?;
        // Special tokens in a document's text are plain text: a document cannot forge a
        // boundary (see the module doc).
        inner.set_encode_special_tokens(true);
        // A document is whole and unpadded: a file saved with truncation or padding on (a
        // `max_length` of 512, padding to a fixed length) would otherwise cut or pad every
        // document. transformers turns both off for each call unless asked, as here.
        inner
            .with_truncation(None)
            .map_err(|e| err(format!("turning truncation off: {e}")))?;
        inner.with_padding(None);
        let eod = match eod_token {
            Some(token) => inner
                .token_to_id(token)
                .ok_or_else(|| DataError::UnknownEodToken {
                    path: file.to_path_buf(),
                    token: token.to_string(),
                })?,
            None => {
                let added = inner.get_added_tokens_decoder();
                EOD_CANDIDATES
                    .iter()
                    .find_map(|c| {
                        added
                            .iter()
                            .filter(|(_, t)| t.content == *c)
                            .map(|(&id, _)| id)
                            .min()
                    })
                    .ok_or_else(|| DataError::NoEodToken {
                        path: file.to_path_buf(),
                    })?
            }
        };
        // Ids are below this: ids may have gaps, and added tokens may repeat model entries.
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0)
            .max(inner.get_vocab_size(true));
        let mut h = crc32fast::Hasher::new();
        h.update(&bytes);
        h.update(&eod.to_le_bytes());
        Ok(Tokenizer {
            inner,
            kind: Kind::Json { bytes },
            path: file.to_path_buf(),
            eod,
            vocab_size,
            fingerprint: h.finalize(),
        })
    }

    /// Token ids of `text` (no end-of-document token added).
    ///
    /// GPT-2's files cannot fail here; a `tokenizer.json` can (a WordPiece or WordLevel
    /// model meeting a word it has no token for, and no unknown token).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let Kind::Gpt2 {
            split,
            byte_chars,
            cache,
        } = &self.kind
        else {
            return self.encode_with_pipeline(text);
        };
        let mut out = Vec::with_capacity(text.len() / 4 + 1);
        let mut mapped = String::new();
        let mut failed = None;
        pretokens(split, text, MAX_PRETOKEN_BYTES, |word| {
            if failed.is_none() {
                let word = Word {
                    word,
                    byte_chars,
                    cache,
                };
                if let Err(e) = self.encode_word(word, &mut mapped, &mut out) {
                    failed = Some(e);
                }
            }
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Appends the ids of one pre-tokenised word, through the cache.
    fn encode_word(&self, w: Word<'_>, mapped: &mut String, out: &mut Vec<u32>) -> Result<()> {
        let word = w.word;
        if word.is_empty() {
            return Ok(());
        }
        // A poisoned lock only means another thread panicked; the map itself is intact.
        let cache = w.cache.read().unwrap_or_else(|p| p.into_inner());
        if let Some(ids) = cache.get(word) {
            out.extend_from_slice(ids);
            return Ok(());
        }
        let full = cache.len() >= CACHE_WORDS;
        drop(cache);
        mapped.clear();
        mapped.extend(word.bytes().map(|b| w.byte_chars[b as usize]));
        // Every byte character is in the vocabulary (checked in `from_gpt2_dir`) and the BPE
        // has no dropout or unknown token: merging does not fail.
        let tokens = self
            .inner
            .get_model()
            .tokenize(mapped)
            .map_err(|e| DataError::Tokenizer {
                path: self.path.clone(),
                msg: format!("byte-level BPE failed on {word:?}: {e}"),
            })?;
        let start = out.len();
        out.extend(tokens.iter().map(|t| t.id));
        if !full && word.len() < CACHE_MAX_WORD_BYTES {
            let ids: Box<[u32]> = out[start..].into();
            let mut cache = w.cache.write().unwrap_or_else(|p| p.into_inner());
            cache.insert(word.to_owned(), ids);
        }
        Ok(())
    }

    /// Encodes many texts in parallel (rayon's global pool; `RAYON_NUM_THREADS` sets its
    /// size), one text per task. The result is in the order of `texts`.
    pub fn encode_batch(&self, texts: &[String]) -> Result<Vec<Vec<u32>>> {
        texts.par_iter().map(|t| self.encode(t)).collect()
    }

    /// Token ids of `text` through `tokenizers`' full pipeline (normalizer, pre-tokenizer,
    /// model; no post-processor, so no special tokens added). For GPT-2's files: the same
    /// result as [`Tokenizer::encode`] on text whose pre-tokens are at most
    /// [`MAX_PRETOKEN_BYTES`] long, several times slower, and unbounded in memory; for tests.
    pub fn encode_with_pipeline(&self, text: &str) -> Result<Vec<u32>> {
        self.inner
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| DataError::Tokenizer {
                path: self.path.clone(),
                msg: format!("encoding failed: {e}"),
            })
    }

    /// Text of `ids`. Special tokens are kept: GPT-2's `eod_id` decodes to the literal
    /// "<|endoftext|>".
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(DataError::TokenOutOfRange {
                id,
                vocab_size: self.vocab_size,
            });
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| DataError::Tokenizer {
                path: self.path.clone(),
                msg: format!("decoding failed: {e}"),
            })
    }

    /// Id of the end-of-document token (50256, `<|endoftext|>`, for GPT-2).
    pub fn eod_id(&self) -> u32 {
        self.eod
    }

    /// Number of token ids: every id is below it (largest id + 1; 50257 for GPT-2; a
    /// `tokenizer.json`'s vocabulary with its added tokens).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// What a checkpoint records to notice a resume with another tokenizer. GPT-2's files: a
    /// CRC-32 of the vocabulary in id order and of the merges in rank order, so two swapped
    /// entries are noticed and the files' formatting (whitespace, key order) is not part of it
    /// (nor is the end-of-document token, unless another than `<|endoftext|>` is named). A
    /// `tokenizer.json`: a CRC-32 of the file's bytes and of the end-of-document id.
    pub fn fingerprint(&self) -> u32 {
        self.fingerprint
    }

    /// The folder or file the tokenizer was loaded from (a folder's `tokenizer.json`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the tokenizer as a `tokenizer.json` that `tokenizers` and transformers'
    /// `PreTrainedTokenizerFast` load, e.g. beside an exported model. A `tokenizer.json` is
    /// copied as it was read. GPT-2's files become what Hugging Face's GPT-2 `tokenizer.json`
    /// holds: their BPE, the byte-level pre-tokenizer (GPT-2's regex, no prefix space),
    /// post-processor and decoder, and the end-of-document token as a special added token. It
    /// encodes as [`Tokenizer::encode`] does (checked on the bundled corpus in the tests).
    pub fn save_json(&self, path: &Path) -> Result<()> {
        let json = self.to_json()?;
        std::fs::write(path, json).map_err(|e| DataError::io(path, e))
    }

    /// The bytes [`Tokenizer::save_json`] writes.
    pub fn to_json(&self) -> Result<Vec<u8>> {
        Ok(match &self.kind {
            Kind::Json { bytes } => bytes.clone(),
            Kind::Gpt2 { .. } => {
                let mut hf = self.inner.clone();
                hf.with_post_processor(Some(ByteLevel::new(true, false, true)));
                let eod = self.inner.id_to_token(self.eod).unwrap_or_default();
                hf.add_special_tokens(&[AddedToken::from(eod, true)]);
                hf.to_string(true)
                    .map_err(|e| DataError::Tokenizer {
                        path: self.path.clone(),
                        msg: format!("cannot write it as tokenizer.json: {e}"),
                    })?
                    .into_bytes()
            }
        })
    }
}

/// One pre-token and the GPT-2 fast path's tables.
#[derive(Clone, Copy)]
struct Word<'a> {
    word: &'a str,
    byte_chars: &'a [char; 256],
    cache: &'a RwLock<HashMap<String, Box<[u32]>>>,
}

/// Calls `f` on each pre-token of `text`, in order: each match of `split`, and any text
/// between matches (there is none: the pattern matches every character; were there some, it
/// would be its own piece, as in `tokenizers`' `SplitDelimiterBehavior::Isolated`).
///
/// `split` runs on windows of at most `window` bytes, which bounds its memory. A match that
/// ends within [`LOOKAHEAD_BYTES`] of its window's end, in a window that is not the text's
/// last, might run on past it: the next window starts where that match starts, so the
/// pre-tokens are the whole text's. Only a match that starts its window and still reaches that
/// margin, a pre-token longer than about `window` bytes, is cut there.
fn pretokens(split: &SysRegex, text: &str, window: usize, mut f: impl FnMut(&str)) {
    let mut pos = 0;
    while pos < text.len() {
        let end = window_end(text, pos, window);
        let last = end == text.len();
        let chunk = &text[pos..end];
        // Bytes of `chunk` given to `f` so far.
        let mut done = 0;
        for (start, stop) in split.find_iter(chunk) {
            if start > done {
                f(&chunk[done..start]);
                done = start;
            }
            if !last && stop + LOOKAHEAD_BYTES > chunk.len() {
                if done == 0 {
                    f(&chunk[..stop]);
                    done = stop;
                }
                break;
            }
            f(&chunk[start..stop]);
            done = stop;
        }
        if done < chunk.len() && (last || done == 0) {
            f(&chunk[done..]);
            done = chunk.len();
        }
        pos += done;
    }
}

/// The end of the window of at most `window` bytes from `pos`: a character boundary, past at
/// least one character.
fn window_end(text: &str, pos: usize, window: usize) -> usize {
    if pos + window >= text.len() {
        return text.len();
    }
    let mut end = pos + window;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    if end > pos {
        return end;
    }
    // A window narrower than the character at `pos` (only in tests): take that character.
    text[pos..]
        .chars()
        .next()
        .map_or(text.len(), |c| pos + c.len_utf8())
}

#[cfg(test)]
mod tests;
