//! GPT-2 for zeropp: sizes and presets, the flat parameter layout of each unit (embedding,
//! each transformer block, final LayerNorm) with named views, partition-independent
//! initialisation, and explicit forward and backward passes of every unit and of the tied
//! LM head's cross-entropy, written with plain candle [`candle_core::Tensor`] ops.
//!
//! It computes one device's math and knows nothing of ranks or communication: the `zero`
//! crate gathers a unit's flat buffer, calls its forward/backward here, and reduces the
//! returned flat gradient.

mod config;
#[cfg(feature = "cuda")]
mod cudnn;
mod error;
#[cfg(feature = "cuda")]
mod gemm;
#[cfg(feature = "cuda")]
mod gpu;
mod init;
pub mod layers;
mod layout;
pub mod llama;
mod units;

pub use config::{
    preset, Arch, ModelConfig, GPT2_NORM_EPS, LLAMA3_VOCAB, LLAMA_NORM_EPS, LLAMA_ROPE_THETA,
    PADDED_GPT2_VOCAB, PRESET_NAMES,
};
pub use error::{ModelError, Result};
pub use init::init_unit_range;
pub use layout::{ModelLayout, ParamInit, ParamSpec, UnitKind, UnitLayout};
pub use units::{
    block_backward, block_forward, embedding_unit_backward, embedding_unit_forward,
    final_norm_backward, final_norm_forward, lm_head_loss, lm_head_loss_backward, model_loss,
    model_loss_and_grads, BlockSaved, NormSaved,
};
