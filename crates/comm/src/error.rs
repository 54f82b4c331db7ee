/// Errors of a collective.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// A buffer's length does not fit the collective and the group size.
    #[error("{op}: buffer of {got} elements, expected {expected}")]
    BadLength {
        op: &'static str,
        got: usize,
        expected: usize,
    },
    /// A topology that cannot exist.
    #[error("invalid topology: {0}")]
    BadTopology(String),
}

pub type Result<T> = std::result::Result<T, CommError>;
