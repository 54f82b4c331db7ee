//! The one error type of the quantisers.

/// Errors of a quantiser. Checked in this order: block size, lengths, then the values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    /// A non-finite input would be silently turned into finite numbers; refuse it.
    /// `index` is the first non-finite element of the input, in the caller's indexing.
    #[error("non-finite value {value} at element {index}")]
    NonFinite { index: usize, value: f32 },
    /// Block size zero.
    #[error("block size must be positive")]
    ZeroBlock,
    /// INT4 packs two values a byte and a byte never straddles blocks, so its block must be even.
    #[error("INT4 block size must be even")]
    OddBlock,
    /// A length that does not fit the layout (`what` names which length).
    #[error("bad length of {what}: got {got}, expected {expected}")]
    BadLength {
        what: &'static str,
        got: usize,
        expected: usize,
    },
}
