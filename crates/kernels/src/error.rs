//! Errors of the loader.

/// What can go wrong compiling or loading a kernel module.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// NVRTC rejected a source; `log` names the file and line (`#line` marks).
    #[error("NVRTC could not compile {file}: {log}")]
    Compile { file: &'static str, log: String },
    /// The driver could not load a module or find a function in it.
    #[error("loading kernel {function} from {file}")]
    Load {
        file: &'static str,
        function: String,
        #[source]
        source: Box<candle_core::Error>,
    },
    /// The driver refused a launch of `kernel` (or a query about it).
    #[cfg(feature = "cuda")]
    #[error("launching kernel {kernel} of {file}")]
    Launch {
        file: &'static str,
        kernel: String,
        #[source]
        source: candle_core::cuda_backend::cudarc::driver::DriverError,
    },
    /// The driver could not allocate a kernel's output.
    #[cfg(feature = "cuda")]
    #[error("allocating {n} elements of {dtype:?} for a kernel")]
    Alloc {
        dtype: candle_core::DType,
        n: usize,
        #[source]
        source: candle_core::cuda_backend::cudarc::driver::DriverError,
    },
    /// A launcher was handed a dtype it has no kernel for.
    #[error("{op}: no kernel takes {dtype:?}")]
    DType {
        dtype: candle_core::DType,
        op: &'static str,
    },
}

pub type Result<T> = std::result::Result<T, KernelError>;
