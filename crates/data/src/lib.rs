//! Training data for zeropp: documents from `.jsonl` / `.jsonl.zst` / `.jsonl.gz` / `.parquet`
//! files ([`read_documents`]), tokenisation with GPT-2's byte-level BPE or any `tokenizer.json`
//! ([`Tokenizer`]), training a byte-level BPE on them ([`train_tokenizer`]), Megatron-LM-compatible indexed datasets
//! ([`IndexedDatasetWriter`], [`IndexedDataset`]), the `prepare-data` pipeline ([`prepare`]),
//! flat token streams from mixed sources ([`TokenCorpus`]) and a seeded, resumable sampler that
//! slices each global batch by rank ([`Sampler`]), and content fingerprints of token streams and
//! tokenizers ([`token_fingerprint`], [`Tokenizer::fingerprint`]) that a resume checks.
//!
//! Nothing here knows about models, ranks' communication or ZeRO: the trainer asks for token ids.

mod bpe_train;
mod corpus;
mod documents;
mod error;
mod fingerprint;
mod indexed;
mod jsonl;
mod parquet_input;
mod prepare;
mod sampler;
mod tokenizer;

pub use bpe_train::{train_tokenizer, TrainTokenizerOptions, TrainTokenizerStats};
pub use corpus::TokenCorpus;
pub use documents::{is_text_input, read_documents, read_documents_with, TEXT_COLUMN};
pub use error::{DataError, Result};
pub use fingerprint::token_fingerprint;
pub use indexed::{
    IndexStats, IndexedDataset, IndexedDatasetWriter, TokenDType, HEADER_LEN, MAGIC, VERSION,
};
pub use prepare::{
    is_held_out, prepare, valid_prefix, PrepareOptions, PrepareStats, BATCH_BYTES, BATCH_DOCS,
};
pub use sampler::{epoch_permutation, splitmix64, Sampler};
pub use tokenizer::{Tokenizer, EOD_CANDIDATES, EOT_TOKEN};
