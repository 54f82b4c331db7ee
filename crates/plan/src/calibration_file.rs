//! The calibration file `trainer plan --calibrate` reads: the `phases` object of `trainer bench
//! --profile --json`. The format is the planner's (it says what a prediction needs); the bench
//! writes it.

use serde::{Deserialize, Serialize};

/// Rank 0's GPU time of each unit's forward and backward and of the loss head, per micro-batch,
/// each inclusive of every kernel family inside it (the gathers' waits are outside). With the
/// model's shape and the micro-batch it was measured at, so that a prediction can check and
/// scale it. Written by `trainer bench --profile --json`, read by `trainer plan --calibrate`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PhaseTimes {
    pub model: ModelShape,
    /// Tokens a micro-batch: micro_batch x seq_len.
    pub micro_batch_tokens: usize,
    /// What the blocks kept for their backward (`model.recompute`: `false`, `true` or
    /// `"attention"`; files before `"attention"` hold a bool).
    pub recompute: model::Recompute,
    /// What the blocks' linear layers multiplied in (`LinearFormat::key`: `dense`, `fp8`): a
    /// calibration holds for that format only. Absent from files written before FP8 ran on
    /// the GPU (2026-12-05), which were all `dense`.
    #[serde(default)]
    pub linears: Option<String>,
    /// The world the bench ran (a calibration wants 1: no rank's time shared with another's).
    pub world: usize,
    /// Parameters the optimizer updated on rank 0 (its shards, padding included).
    pub optimizer_params: usize,
    /// Seconds a step of the optimizer family (gradient norm and AdamW) and of the engine's
    /// shard passes (gradient casts, gather casts).
    pub optimizer_seconds: f64,
    pub shard_pass_seconds: f64,
    /// Seconds a micro-batch, in unit order.
    pub units: Vec<UnitTime>,
    pub head_seconds: f64,
}

/// The shape a calibration is valid for.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ModelShape {
    pub arch: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub ffn_hidden: usize,
    pub vocab_size: usize,
    pub seq_len: usize,
}

impl From<&model::ModelConfig> for ModelShape {
    fn from(c: &model::ModelConfig) -> Self {
        ModelShape {
            arch: c.arch.name().to_string(),
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            ffn_hidden: c.ffn_hidden,
            vocab_size: c.vocab_size,
            seq_len: c.seq_len,
        }
    }
}

/// One unit's forward and backward, seconds a micro-batch.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct UnitTime {
    pub unit: usize,
    /// `embedding`, `block`, `final_norm`.
    pub kind: String,
    pub forward_seconds: f64,
    pub backward_seconds: f64,
}
