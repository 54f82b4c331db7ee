//! Training data for zeropp: Pile-format `.jsonl` / `.jsonl.zst` reading ([`read_documents`]),
//! GPT-2 byte-level BPE ([`Tokenizer`]), Megatron-LM-compatible indexed datasets
//! ([`IndexedDatasetWriter`], [`IndexedDataset`]), the `prepare-data` pipeline ([`prepare`]),
//! flat token streams from mixed sources ([`TokenCorpus`]) and a seeded, resumable sampler that
//! slices each global batch by rank ([`Sampler`]), and content fingerprints of token streams and
//! tokenizers ([`token_fingerprint`], [`Tokenizer::fingerprint`]) that a resume checks.
//!
//! Nothing here knows about models, ranks' communication or ZeRO: the trainer asks for token ids.

mod corpus;
mod error;
mod fingerprint;
mod indexed;
mod jsonl;
mod prepare;
mod sampler;
mod tokenizer;

pub use corpus::TokenCorpus;
pub use error::{DataError, Result};
pub use fingerprint::token_fingerprint;
pub use indexed::{
    IndexStats, IndexedDataset, IndexedDatasetWriter, TokenDType, HEADER_LEN, MAGIC, VERSION,
};
pub use jsonl::read_documents;
pub use prepare::{
    is_held_out, prepare, valid_prefix, PrepareOptions, PrepareStats, BATCH_BYTES, BATCH_DOCS,
};
pub use sampler::{epoch_permutation, splitmix64, Sampler};
pub use tokenizer::{Tokenizer, EOT_TOKEN};
