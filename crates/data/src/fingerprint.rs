//! Content fingerprints: a CRC-32 of a token stream ([`token_fingerprint`]) and of a
//! tokenizer's vocabulary and merges ([`tokenizer_fingerprint`]).
//!
//! The trainer records them in each checkpoint, so that a resume on other documents, on the
//! same documents in another order, or with another tokenizer is noticed even when the token
//! counts agree. A fingerprint is of the content, not of the files: the same tokens read from
//! a `.jsonl` file or from the `.bin`/`.idx` pair that `prepare-data` made of it, from any
//! path, give the same fingerprint, and a `vocab.json` written with other whitespace or key
//! order gives the same tokenizer fingerprint.
//!
//! CRC-32 detects every change of one token and every burst of changes up to 32 bits long; any
//! other change goes unnoticed with probability 2^-32. It is not a defence against someone
//! crafting a collision, only against mistakes.
//!
//! ```
//! let tokens = [15496u32, 995, 50256];
//! let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
//! assert_eq!(data::token_fingerprint(&tokens), crc32fast::hash(&bytes));
//! assert_ne!(data::token_fingerprint(&[995, 15496, 50256]), crc32fast::hash(&bytes)); // order
//! ```

use rayon::prelude::*;

/// Tokens hashed by one task: big enough that a task's overhead is nothing beside it (4 MiB of
/// bytes), small enough that the stream of a large corpus spreads over every core.
const TASK_TOKENS: usize = 1 << 20;
/// Tokens converted to bytes at a time inside a task (a 64 KiB buffer on the stack).
const BLOCK_TOKENS: usize = 1 << 14;

/// CRC-32 (IEEE, as `crc32fast::hash`) of `tokens` written as little-endian `u32`s.
///
/// Computed in parallel over chunks (rayon's global pool) and combined, so that it costs a
/// small fraction of loading the tokens: the trainer hashes every token it trains on rather
/// than a sample, and no fingerprint file is needed beside a Megatron dataset.
pub fn token_fingerprint(tokens: &[u32]) -> u32 {
    let parts: Vec<crc32fast::Hasher> = tokens
        .par_chunks(TASK_TOKENS)
        .map(|chunk| {
            let mut hasher = crc32fast::Hasher::new();
            let mut bytes = [0u8; 4 * BLOCK_TOKENS];
            for block in chunk.chunks(BLOCK_TOKENS) {
                for (out, t) in bytes.chunks_exact_mut(4).zip(block) {
                    out.copy_from_slice(&t.to_le_bytes());
                }
                hasher.update(&bytes[..4 * block.len()]);
            }
            hasher
        })
        .collect();
    let mut all = crc32fast::Hasher::new();
    for part in &parts {
        all.combine(part);
    }
    all.finalize()
}

/// CRC-32 of a tokenizer's meaning: each vocabulary entry in id order (id, then the token's
/// length and bytes), then each merge in rank order (both tokens, each as length and bytes).
/// Two vocabularies whose entries agree but whose ids differ (two entries swapped) differ.
pub(crate) fn tokenizer_fingerprint<'a>(
    vocab_by_id: impl IntoIterator<Item = (u32, &'a str)>,
    merges: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> u32 {
    let mut h = crc32fast::Hasher::new();
    let mut text = |s: &str| {
        h.update(&(s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    };
    for (id, token) in vocab_by_id {
        text(&id.to_string());
        text(token);
    }
    // The two lists cannot run into each other: a vocabulary entry is two fields, a merge two,
    // and this marker, an odd field, sits between them.
    text("merges");
    for (a, b) in merges {
        text(a);
        text(b);
    }
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sequential(tokens: &[u32]) -> u32 {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        crc32fast::hash(&bytes)
    }

    #[test]
    fn the_parallel_hash_is_the_crc_of_the_little_endian_stream() {
        for n in [
            0,
            1,
            BLOCK_TOKENS - 1,
            BLOCK_TOKENS + 3,
            2 * TASK_TOKENS + 17,
        ] {
            let tokens: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2654435761)).collect();
            assert_eq!(
                token_fingerprint(&tokens),
                sequential(&tokens),
                "{n} tokens"
            );
        }
    }

    #[test]
    fn one_changed_or_moved_token_changes_the_fingerprint() {
        let tokens: Vec<u32> = (0..3 * TASK_TOKENS as u32).map(|i| i % 50257).collect();
        let base = token_fingerprint(&tokens);
        let mut changed = tokens.clone();
        changed[TASK_TOKENS + 5] ^= 1;
        assert_ne!(token_fingerprint(&changed), base);
        let mut swapped = tokens.clone();
        swapped.swap(10, 2 * TASK_TOKENS + 10);
        assert_ne!(token_fingerprint(&swapped), base);
        assert_ne!(token_fingerprint(&tokens[1..]), base);
    }

    #[test]
    fn swapping_two_vocabulary_ids_or_two_merges_changes_the_tokenizer_fingerprint() {
        let vocab = [(0, "a"), (1, "b"), (2, "ab")];
        let merges = [("a", "b")];
        let base = tokenizer_fingerprint(vocab, merges);
        assert_eq!(tokenizer_fingerprint(vocab, merges), base);
        let swapped = [(0, "b"), (1, "a"), (2, "ab")];
        assert_ne!(tokenizer_fingerprint(swapped, merges), base);
        let two = [("a", "b"), ("b", "a")];
        let other_order = [("b", "a"), ("a", "b")];
        assert_ne!(
            tokenizer_fingerprint(vocab, two),
            tokenizer_fingerprint(vocab, other_order)
        );
    }
}
