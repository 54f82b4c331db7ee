//! The ZeRO engine: parameters, gradients and optimizer states partitioned over the ranks.
//!
//! Each of the model's units (whatever its schedule holds: [`model::Model`]) is one flat buffer,
//! padded so every rank owns an equal, aligned shard ([`Partition`]). A training step walks the
//! model's schedule, gathering each unit before its forward and again before its backward,
//! reduces its gradient into the owners' fp32 shards, and the sharded [`AdamW`] updates each
//! rank's fp32 master shard. The training loop talks only to [`Engine`]; the ZeRO++ options
//! are resolved once against the topology into a [`ZeroPlan`], and each step's pass into a
//! [`StepPlan`] (docs/design.md section 5).

pub mod codec;
mod config;
mod engine;
mod error;
mod gather;
mod grad_shard;
pub mod memory;
mod optimizer;
#[cfg(feature = "cuda")]
mod optimizer_cuda;
mod partition;
mod plan;
mod qgz;
mod reduce;
pub mod shard_passes;
mod squares;
mod typed_job;
pub mod volume;

pub use codec::grad::QGZ_ERROR_STATES;
pub use codec::{GradCodec, WeightCodec};
pub use config::{ReduceDtype, ZeroConfig, MAX_PREFETCH_DEPTH};
pub use engine::{
    Engine, EngineOptions, NamedShard, StepStats, REDUCTIONS_IN_FLIGHT, SHARD_STATES,
};
pub use error::{Result, ZeroError};
pub use gather::{BACKWARD_GATHER, FORWARD_GATHER};
pub use grad_shard::GradShard;
pub use memory::{rank_memory, RankMemory};
pub use optimizer::{AdamW, DecayRanges};
pub use partition::{reslice, Partition, Piece};
pub use plan::{
    GatherSlot, GradReduction, Qgz, Qwz, SecondaryPartition, StepPlan, Techniques, WeightGather,
    ZeroPlan, MIN_ALIGN,
};
pub use reduce::GRADIENT_REDUCTION;
pub use squares::sum_of_squares;
