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
}

pub type Result<T> = std::result::Result<T, KernelError>;
