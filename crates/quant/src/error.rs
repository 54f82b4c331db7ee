//! The one error type of the quantisers.

use std::sync::Arc;

/// Errors of a quantiser. Checked in this order: block size, then lengths. Values are never
/// refused: a block holding an inf or NaN gets a NaN scale (see `block/mod.rs`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    /// Block size zero.
    #[error("block size must be positive")]
    ZeroBlock,
    /// INT4 packs two values a byte and a byte never straddles blocks, so its block must be even.
    #[error("INT4 block size must be even")]
    OddBlock,
    /// The GPU kernels give one warp per block and load whole lanes: the block must be a
    /// multiple of 32 there.
    #[error("GPU quantisation needs a block size that is a multiple of 32, got {block}")]
    GpuBlock { block: usize },
    /// A length that does not fit the layout (`what` names which length).
    #[error("bad length of {what}: got {got}, expected {expected}")]
    BadLength {
        what: &'static str,
        got: usize,
        expected: usize,
    },
    /// The tensor entry points take 1-D contiguous tensors.
    #[error("{what} must be a 1-D contiguous tensor, got shape {shape:?}")]
    NotVector {
        what: &'static str,
        shape: Vec<usize>,
    },
    /// A tensor (or requested output) of the wrong dtype.
    #[error("{what} must have dtype {expected:?}, got {got:?}")]
    DType {
        what: &'static str,
        got: candle_core::DType,
        expected: candle_core::DType,
    },
    /// Inputs on different devices, or a device this build has no kernels for.
    #[error("{what} is on {got:?}, expected {expected:?}")]
    Device {
        what: &'static str,
        got: candle_core::DeviceLocation,
        expected: candle_core::DeviceLocation,
    },
    /// A quantisation kernel could not be compiled (NVRTC) or loaded (`kernels::loader`).
    #[error(transparent)]
    Kernel(SharedKernelError),
    /// An error of candle or of the CUDA driver underneath (allocation, launch).
    #[error(transparent)]
    Candle(CandleError),
}

/// A candle error, shared behind an `Arc` so that [`QuantError`] stays `Clone` and
/// `PartialEq` (two of these are equal only if they are the same error).
#[derive(Debug, Clone)]
pub struct CandleError(pub Arc<candle_core::Error>);

impl PartialEq for CandleError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Display for CandleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for CandleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl From<candle_core::Error> for QuantError {
    fn from(e: candle_core::Error) -> Self {
        QuantError::Candle(CandleError(Arc::new(e)))
    }
}

/// A [`kernels::KernelError`], shared behind an `Arc` like [`CandleError`] (equal only if it is
/// the same error).
#[derive(Debug, Clone)]
pub struct SharedKernelError(pub Arc<kernels::KernelError>);

impl PartialEq for SharedKernelError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Display for SharedKernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedKernelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl From<kernels::KernelError> for QuantError {
    fn from(e: kernels::KernelError) -> Self {
        QuantError::Kernel(SharedKernelError(Arc::new(e)))
    }
}
