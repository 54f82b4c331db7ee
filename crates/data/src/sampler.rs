//! Seeded, resumable sampling of fixed-length training samples from a flat token stream.
//!
//! Sample `s` covers `tokens[s*T .. s*T + T + 1]`: the inputs are its first `T` tokens, the
//! targets its last `T` (shifted by one). There are `(len - 1) / T` samples; the tail is unused.
//!
//! Training order: global sample index `g = step * global_batch + j` (`j` = position in the
//! global batch) lies in epoch `e = g / num_samples` and reads sample `perm_e[g % num_samples]`,
//! where `perm_e` is a Fisher-Yates shuffle driven by splitmix64 seeded with `(seed, e)`. The
//! order is a pure function of `(seed, step)`, so resuming at a step resumes at the exact sample.
//! Rank `r` of `W` owns global-batch positions `r*(B/W) .. (r+1)*(B/W)`, split into micro-batches:
//! the global batch is the same set of samples for every world size.
//!
//! ```
//! # fn main() -> data::Result<()> {
//! let tokens: Vec<u32> = (0..41).collect();
//! let s = data::Sampler::new(tokens.len(), 4, 7)?; // 10 samples of 4 tokens
//! assert_eq!(s.num_samples(), 10);
//! // Global batch 4 over 2 ranks, micro-batch 1: rank 1's second micro-batch is position 3.
//! let ids = s.micro_batch_ids(0, 4, 2, 1, 1, 1)?;
//! assert_eq!(ids, [s.sample_id(3)]);
//! let (x, y) = s.gather(&tokens, &[2])?;
//! assert_eq!((x, y), (vec![8, 9, 10, 11], vec![9, 10, 11, 12]));
//! # Ok(())
//! # }
//! ```

use std::sync::Mutex;

use crate::error::{DataError, Result};

/// One step of splitmix64 (Steele, Lea, Flood 2014): advances `state` and returns a mixed value.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The shuffled order of epoch `epoch`: a Fisher-Yates permutation of `0..n`.
///
/// The RNG is splitmix64 started from `splitmix64(seed) ^ epoch`-derived state; a draw in
/// `0..=i` is the high 64 bits of `r * (i + 1)` (Lemire), whose bias (< n / 2^64) is negligible.
pub fn epoch_permutation(n: usize, seed: u64, epoch: u64) -> Vec<u32> {
    let mut key = seed;
    let mut state = splitmix64(&mut key) ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut perm: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let r = splitmix64(&mut state);
        let j = ((r as u128 * (i as u128 + 1)) >> 64) as usize;
        perm.swap(i, j);
    }
    perm
}

/// Fixed-length samples over a token stream, in a seeded, resumable order.
pub struct Sampler {
    num_samples: usize,
    seq_len: usize,
    seed: u64,
    /// The permutation of the most recently used epoch (recomputed when the epoch changes).
    cache: Mutex<Option<(u64, Vec<u32>)>>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("num_samples", &self.num_samples)
            .field("seq_len", &self.seq_len)
            .field("seed", &self.seed)
            .finish()
    }
}

impl Sampler {
    /// A sampler over `num_tokens` tokens. Errors with [`DataError::Empty`] if there are fewer
    /// than `seq_len + 1` tokens (not one sample), and [`DataError::BadBatch`] if `seq_len` is 0
    /// or there are more than `u32::MAX` samples.
    pub fn new(num_tokens: usize, seq_len: usize, seed: u64) -> Result<Self> {
        if seq_len == 0 {
            return Err(DataError::BadBatch {
                reason: "seq_len must be at least 1".into(),
            });
        }
        if num_tokens < seq_len + 1 {
            return Err(DataError::Empty {
                what: format!(
                    "{num_tokens} tokens are not enough for one sample of seq_len {seq_len} \
                     (needs {} tokens)",
                    seq_len + 1
                ),
            });
        }
        let num_samples = (num_tokens - 1) / seq_len;
        if num_samples > u32::MAX as usize {
            return Err(DataError::BadBatch {
                reason: format!("{num_samples} samples exceed the sampler's limit of 2^32 - 1"),
            });
        }
        Ok(Sampler {
            num_samples,
            seq_len,
            seed,
            cache: Mutex::new(None),
        })
    }

    /// Number of samples: `(num_tokens - 1) / seq_len`.
    pub fn num_samples(&self) -> usize {
        self.num_samples
    }

    /// Tokens per sample (`T`).
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Checks a batch layout: `global_batch` divisible by `world`, and the per-rank share
    /// divisible by `micro_batch`. Returns the number of micro-batches per rank per step.
    /// Call it once with the run's config; [`Sampler::micro_batch_ids`] checks it again.
    pub fn check_batch(global_batch: usize, world: usize, micro_batch: usize) -> Result<usize> {
        let bad = |reason: String| Err(DataError::BadBatch { reason });
        if global_batch == 0 || world == 0 || micro_batch == 0 {
            return bad(format!(
                "global_batch ({global_batch}), world size ({world}) and micro_batch \
                 ({micro_batch}) must all be at least 1"
            ));
        }
        if !global_batch.is_multiple_of(world) {
            return bad(format!(
                "global_batch {global_batch} is not divisible by the world size {world}"
            ));
        }
        let per_rank = global_batch / world;
        if !per_rank.is_multiple_of(micro_batch) {
            return bad(format!(
                "global_batch / world = {per_rank} samples per rank is not divisible by \
                 micro_batch {micro_batch}"
            ));
        }
        Ok(per_rank / micro_batch)
    }

    /// The sample read at global sample index `g` (see the module doc).
    pub fn sample_id(&self, g: u64) -> usize {
        self.sample_ids(std::iter::once(g))[0]
    }

    fn sample_ids(&self, gs: impl Iterator<Item = u64>) -> Vec<usize> {
        let n = self.num_samples as u64;
        // A poisoned lock only means another thread panicked mid-shuffle; recompute.
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        gs.map(|g| {
            let (epoch, i) = (g / n, (g % n) as usize);
            match cache.as_ref() {
                Some((e, perm)) if *e == epoch => perm[i] as usize,
                _ => {
                    let perm = epoch_permutation(self.num_samples, self.seed, epoch);
                    let id = perm[i] as usize;
                    *cache = Some((epoch, perm));
                    id
                }
            }
        })
        .collect()
    }

    /// Sample ids of rank `rank`'s micro-batch `micro` at `step`: global-batch positions
    /// `j = rank*(global_batch/world) + micro*micro_batch + b` for `b` in `0..micro_batch`.
    ///
    /// Errors on a layout that [`Sampler::check_batch`] rejects ([`DataError::BadBatch`]),
    /// `rank >= world` ([`DataError::RankOutOfRange`]), or `micro` past the rank's last
    /// micro-batch ([`DataError::MicroBatchOutOfRange`]).
    pub fn micro_batch_ids(
        &self,
        step: u64,
        global_batch: usize,
        world: usize,
        rank: usize,
        micro: usize,
        micro_batch: usize,
    ) -> Result<Vec<usize>> {
        let micros = Self::check_batch(global_batch, world, micro_batch)?;
        if rank >= world {
            return Err(DataError::RankOutOfRange { rank, world });
        }
        if micro >= micros {
            return Err(DataError::MicroBatchOutOfRange { micro, micros });
        }
        let first = (rank * (global_batch / world) + micro * micro_batch) as u64;
        let base = step * global_batch as u64 + first;
        Ok(self.sample_ids((0..micro_batch as u64).map(|b| base + b)))
    }

    /// Evaluation order: samples `0..min(n, num_samples)`, sequential, not shuffled.
    pub fn eval_ids(&self, n: usize) -> Vec<usize> {
        (0..n.min(self.num_samples)).collect()
    }

    /// `(inputs, targets)` of the samples `ids`, each `ids.len() * T` tokens in row-major
    /// `(B, T)` order.
    ///
    /// Errors with [`DataError::SampleOutOfRange`] if a sample reaches past the end of
    /// `tokens` (a token stream shorter than the one the sampler was built for).
    pub fn gather(&self, tokens: &[u32], ids: &[usize]) -> Result<(Vec<u32>, Vec<u32>)> {
        let t = self.seq_len;
        let mut inputs = Vec::with_capacity(ids.len() * t);
        let mut targets = Vec::with_capacity(ids.len() * t);
        for &id in ids {
            let start = id.saturating_mul(t);
            let end = start.saturating_add(t + 1);
            if end > tokens.len() {
                return Err(DataError::SampleOutOfRange {
                    id,
                    start,
                    end,
                    len: tokens.len(),
                });
            }
            inputs.extend_from_slice(&tokens[start..end - 1]);
            targets.extend_from_slice(&tokens[start + 1..end]);
        }
        Ok((inputs, targets))
    }
}
