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
}
