use std::ops::Range;

/// How one unit's flat buffer of `numel` elements is split over `world` ranks.
///
/// The buffer is padded to `padded` = a multiple of `world x align`, so every shard has the same
/// length and is a whole number of `align`-element quantisation blocks; the padding is zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    pub numel: usize,
    pub padded: usize,
    pub world: usize,
}

impl Partition {
    pub fn new(numel: usize, world: usize, align: usize) -> Self {
        let quantum = world * align.max(1);
        Partition {
            numel,
            padded: numel.div_ceil(quantum) * quantum,
            world,
        }
    }

    /// Elements per shard.
    pub fn shard_len(&self) -> usize {
        self.padded / self.world
    }

    /// The range of the padded buffer owned by `rank`.
    pub fn shard_range(&self, rank: usize) -> Range<usize> {
        let s = self.shard_len();
        rank * s..(rank + 1) * s
    }
}

/// A run of elements that one rank's new shard takes from one old shard, when a checkpoint
/// written under one partition is re-sliced for another (another world size, or the padding of
/// other quantisation blocks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub old_rank: usize,
    /// Elements of the old rank's shard.
    pub old: Range<usize>,
    /// Where they go in the new shard.
    pub new: Range<usize>,
}

/// The pieces of old shards that make up `new_rank`'s shard of `new`, in order. Both partitions
/// are of the same unit (same `numel`); the new shard's elements past `numel` are padding,
/// which stays zero and comes from no piece.
pub fn reslice(old: &Partition, new: &Partition, new_rank: usize) -> Vec<Piece> {
    assert_eq!(
        old.numel, new.numel,
        "re-slicing needs partitions of one unit"
    );
    let range = new.shard_range(new_rank);
    let (start, end) = (range.start, range.end.min(new.numel));
    let mut pieces = Vec::new();
    let mut at = start;
    while at < end {
        let old_rank = at / old.shard_len();
        let old_start = old_rank * old.shard_len();
        let until = end.min(old_start + old.shard_len());
        pieces.push(Piece {
            old_rank,
            old: at - old_start..until - old_start,
            new: at - range.start..until - range.start,
        });
        at = until;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_padded_buffer() {
        let p = Partition::new(1001, 8, 16);
        assert_eq!(p.padded % (8 * 16), 0);
        assert!(p.padded >= 1001 && p.padded < 1001 + 8 * 16);
        assert_eq!(p.shard_range(7).end, p.padded);
        assert_eq!(p.shard_range(3).len(), p.shard_len());
    }

    /// Shards of `p` cut from the buffer `0, 1, ..., numel - 1` (zero padding).
    fn shards(p: &Partition) -> Vec<Vec<f32>> {
        (0..p.world)
            .map(|r| {
                p.shard_range(r)
                    .map(|i| if i < p.numel { i as f32 + 1.0 } else { 0.0 })
                    .collect()
            })
            .collect()
    }

    fn resliced(old: &Partition, new: &Partition) -> Vec<Vec<f32>> {
        let old_shards = shards(old);
        (0..new.world)
            .map(|r| {
                let mut shard = vec![0.0; new.shard_len()];
                for piece in reslice(old, new, r) {
                    shard[piece.new].copy_from_slice(&old_shards[piece.old_rank][piece.old]);
                }
                shard
            })
            .collect()
    }

    #[test]
    fn reslicing_gives_the_shards_the_new_partition_cuts() {
        let numel = 10_007;
        // 4 ranks -> 2, -> 8, and to the padding of qwZ + qgZ blocks, and back.
        let plain4 = Partition::new(numel, 4, 1);
        for new in [
            Partition::new(numel, 2, 1),
            Partition::new(numel, 8, 1),
            Partition::new(numel, 8, 2048),
            Partition::new(numel, 3, 512),
            plain4.clone(),
        ] {
            assert_eq!(resliced(&plain4, &new), shards(&new), "4 -> {new:?}");
            assert_eq!(resliced(&new, &plain4), shards(&plain4), "{new:?} -> 4");
        }
    }

    #[test]
    fn a_shard_of_padding_only_takes_no_piece() {
        let old = Partition::new(100, 2, 1);
        let new = Partition::new(100, 8, 64);
        assert_eq!(new.shard_len(), 64);
        assert!(reslice(&old, &new, 7).is_empty());
        assert_eq!(
            reslice(&old, &new, 1),
            vec![Piece {
                old_rank: 1,
                old: 14..50,
                new: 0..36
            }]
        );
    }
}
