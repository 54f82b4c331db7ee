/// Logical bytes a rank sent, by whether the peer is on its own node (intra) or not (inter).
///
/// Logical means by each collective's meaning, whatever algorithm a backend uses inside:
/// an all-gather sends my shard once to every peer; a reduce-scatter each slice once to its owner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByteCounters {
    pub intra: u64,
    pub inter: u64,
}

impl std::ops::Sub for ByteCounters {
    type Output = ByteCounters;
    fn sub(self, rhs: ByteCounters) -> ByteCounters {
        ByteCounters {
            intra: self.intra - rhs.intra,
            inter: self.inter - rhs.inter,
        }
    }
}
