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
    /// A checkpoint lacks a state tensor this run needs.
    #[error("state tensor {name} is missing")]
    MissingState { name: String },
    /// A saved state tensor has another length than this rank's.
    #[error("state tensor {name}: {got} elements, this rank's {what} has {expected}")]
    StateLength {
        name: String,
        what: &'static str,
        got: usize,
        expected: usize,
    },
    /// A buffer handed to one of the engine's own passes over a shard breaks what the pass
    /// takes (a length, a dtype, an alignment): the partition should have made it so.
    #[error("{what}: {detail}")]
    ShardBuffer { what: &'static str, detail: String },
    /// A gradient was handed to a walk that reduces none (evaluation).
    #[error("a gradient was handed to an evaluation pass")]
    NotTraining,
    /// A state tensor to be checkpointed holds a NaN or inf (`Engine::check_finite_state`).
    #[error("state tensor {name} holds a non-finite value on rank {rank} after step {step}")]
    NonFiniteState {
        name: String,
        rank: usize,
        step: u64,
    },
}

pub type Result<T> = std::result::Result<T, ZeroError>;
