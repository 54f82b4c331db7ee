/// Errors of the ZeRO engine.
#[derive(Debug, thiserror::Error)]
pub enum ZeroError {
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Comm(#[from] comm::CommError),
    #[error(transparent)]
    Quant(#[from] quant::QuantError),
    /// A configuration the engine cannot run, named by its dotted config key (`zero.<key>`), so
    /// that the trainer can blame the `--set` or the file line that gave it.
    #[error("zero.{key}: {reason}")]
    Config { key: &'static str, reason: String },
    /// A saved state that does not fit this run.
    #[error("state tensor {name}: {reason}")]
    BadState { name: String, reason: String },
    /// A state tensor to be checkpointed holds a NaN or inf (`Engine::check_finite_state`).
    #[error("state tensor {name} holds a non-finite value on rank {rank} after step {step}")]
    NonFiniteState {
        name: String,
        rank: usize,
        step: u64,
    },
}

pub type Result<T> = std::result::Result<T, ZeroError>;
