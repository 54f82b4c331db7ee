//! Decoder-only transformers for zeropp, GPT-2 and the families of Llama's block (Llama, Qwen2,
//! Qwen3, Mistral): sizes and presets
//! ([`ModelConfig`]), the flat parameter layout of each unit with named views ([`ModelLayout`]),
//! partition-independent initialisation, each layer's forward and backward as plain functions
//! written with candle [`candle_core::Tensor`] ops ([`layers`]), each architecture's units
//! ([`gpt2`], [`llama`]), and the model as a schedule of units ([`Model`]) that the ZeRO engine
//! and the one-device reference both walk; and incremental decoding with a KV cache, to sample
//! text from a model ([`decode`], [`Decoder`]).
//!
//! It computes one device's math and knows nothing of ranks or communication: the `zero`
//! crate gathers a unit's flat buffer, hands it to [`Model`]'s walk, and reduces the returned
//! flat gradient.

mod config;
#[cfg(feature = "cuda")]
mod cudnn;
pub mod decode;
mod error;
mod family;
#[cfg(feature = "cuda")]
mod gemm;
pub mod gpt2;
#[cfg(feature = "cuda")]
mod gpu;
mod init;
mod kernel_plan;
pub mod layers;
mod layout;
mod linears;
pub mod llama;
pub mod mistral;
pub mod qwen2;
pub mod qwen3;
mod recompute;
mod schedule;
mod units;

pub use config::{Arch, ModelConfig, MAX_LAYERS};
pub use decode::{Decoder, KvCache, Sampling};
pub use error::{ModelError, Result};
pub use family::{
    every_family, family, family_names, from_hf_config, preset, preset_names, Family, Fp8Kept,
    HfTensor, LinearInput, ShapeRecord, Sizes, FAMILIES,
};
pub use gpt2::family::{GPT2_NORM_EPS, PADDED_GPT2_VOCAB};
pub use init::init_unit_range;
pub use kernel_plan::{unenforced, AttentionPath, Enforced, KernelPlan};
pub use layers::{Fp8Input, Fp8Weight, RopeScaling};
pub use layout::{ModelLayout, ParamInit, ParamSpec, TableRow, UnitKind, UnitLayout, UnitTable};
pub use linears::{LinearFormat, LinearWeight, MlpForward, NormedProjection, SavedInput};
pub use llama::family::{
    LLAMA3_1_SCALING, LLAMA3_2_SCALING, LLAMA3_VOCAB, LLAMA_NORM_EPS, LLAMA_ROPE_THETA,
};
pub use llama::rope_config::Rope;
pub use llama::style::{LlamaStyle, Window, HF_SEQ_LEN};
pub use recompute::Recompute;
pub use schedule::{BackwardParams, Model, Pass, Saved, UnitParams, UnitSource};
