//! The crate's error type.

use candle_core::DType;

/// Everything that can go wrong in the model crate.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    // ---- configuration ----
    /// A configuration field that must be positive is zero.
    #[error("config field `{field}` must be > 0")]
    ZeroSize { field: &'static str },
    /// `n_embd` is not a multiple of `n_head`.
    #[error("n_embd {n_embd} is not divisible by n_head {n_head}")]
    HeadsDoNotDivide { n_embd: usize, n_head: usize },
    /// Rotary positions rotate pairs of a head's channels: the head width must be even.
    #[error("model.head_dim = {head_dim} (model.n_embd / model.n_head unless set): rotary positions rotate pairs, so it must be even")]
    OddHeadDim { head_dim: usize },
    /// A size the family has no default for, and that neither the config nor a preset gives.
    #[error("model.{field} is required without model.preset")]
    Required { field: &'static str },
    /// A size or setting the architecture does not take, named by its `model.` key.
    #[error("model.{field}: {reason}")]
    Shape { field: &'static str, reason: String },

    // ---- shapes and dtypes of arguments ----
    /// A unit's flat parameter buffer is shorter than its layout (or not 1-D).
    #[error("flat params of unit `{unit}`: need a 1-D tensor of >= {expected} elements, got shape {got:?}")]
    ParamsTooShort {
        unit: &'static str,
        expected: usize,
        got: Vec<usize>,
    },
    /// An activation or token tensor has the wrong shape.
    #[error("{what}: expected shape {expected:?}, got {got:?}")]
    ShapeMismatch {
        what: &'static str,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// A sequence is longer than the positional embedding table.
    #[error("sequence length {got} exceeds seq_len {max}")]
    SequenceTooLong { got: usize, max: usize },
    /// Token or target ids must be u32.
    #[error("{what}: expected dtype u32, got {got:?}")]
    TokenDType { what: &'static str, got: DType },
    /// `model_loss*` got a different number of unit buffers than the layout has units.
    #[error("expected {expected} unit parameter buffers, got {got}")]
    UnitCount { expected: usize, got: usize },
    /// A unit's backward reads its parameters, and was given none.
    #[error("unit `{unit}`: its backward needs its parameters")]
    NoParams { unit: String },
    /// A unit's backward was given what another architecture's forward saved.
    #[error("unit `{unit}`: the saved activations are not a {arch} unit's")]
    SavedMismatch { unit: String, arch: &'static str },

    // ---- incremental decoding ----
    /// A decode call was given no tokens (an empty prompt).
    #[error("{what}: no tokens (decoding needs at least one)")]
    NoTokens { what: &'static str },
    /// Feeding `new` more tokens to a KV cache holding `len` would pass its `capacity`
    /// positions (at most `seq_len`: the model has no positions beyond it).
    #[error(
        "the KV cache holds {len} positions and has room for {capacity}: {new} more do not fit"
    )]
    ContextFull {
        len: usize,
        new: usize,
        capacity: usize,
    },
    /// A token id is not below the vocabulary size.
    #[error("token id {token} is not in the vocabulary of {vocab_size}")]
    TokenOutOfVocab { token: u32, vocab_size: usize },
    /// A decoder's parameters or KV cache do not match its config (or each other): layer
    /// count, heads, dtype or device.
    #[error("decode: {what}: {reason}")]
    DecodeMismatch { what: &'static str, reason: String },
    /// Sampling options that select no distribution (a negative temperature, `top_k = 0`).
    #[error("sampling: {reason}")]
    BadSampling { reason: String },

    /// A setting the GPU kernels cannot run, found when the step's kernel plan is resolved
    /// (`KernelPlan::resolve`).
    #[error("{setting} on a GPU: {reason}")]
    GpuUnsupported {
        setting: String,
        reason: &'static str,
    },
    /// A GPU older than the kernels' PTX target, which its driver cannot load.
    #[error(
        "this GPU has compute capability {major}.{minor}: the kernels are PTX for compute \
         capability 9.0 (Hopper: H100, H200) and later; run there, or set train.device = \"cpu\""
    )]
    GpuTooOld { major: i32, minor: i32 },
    /// A layer's GPU kernel declined a CUDA tensor under an enforced kernel plan that said it
    /// takes it: an internal invariant, not a setting.
    #[error(
        "{op}: the {precision} GPU kernel declined a CUDA tensor of {dtype:?} {dims:?} that the \
         step's kernel plan said it takes (an internal invariant; the reference path is not \
         taken silently on the GPU)"
    )]
    KernelDeclined {
        op: &'static str,
        precision: kernels::Precision,
        dtype: candle_core::DType,
        dims: Vec<usize>,
    },

    // ---- wrapped ----
    /// A CUDA kernel could not be compiled or loaded.
    #[error(transparent)]
    Kernel(#[from] kernels::KernelError),
    /// A cuDNN call failed (the attention graphs, feature `cuda`).
    #[error("cuDNN: {what}: {message}")]
    Cudnn { what: String, message: String },
    /// An error from a candle tensor operation.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result with [`ModelError`].
pub type Result<T> = std::result::Result<T, ModelError>;
