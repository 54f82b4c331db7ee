//! What `trainer plan` reports: the [`Report`] its table and `--json` print (docs/plan.md
//! names every field), in one place apart from the arithmetic that fills it.

use comm::ByteCounters;
use run::config::Precision;
use serde::Serialize;
use zero::RankMemory;

use crate::advise::Advice;
use crate::sweep::Sweep;
use crate::throughput::Throughput;

#[derive(Debug, Serialize)]
pub struct Report {
    pub model: ModelInfo,
    pub topology: TopologyInfo,
    pub train: TrainInfo,
    pub zero: ZeroInfo,
    pub memory: Memory,
    pub comm: Comm,
    pub paper: Paper,
    /// The predicted step times with `--throughput` (or `--sweep`, `--advise`), else null.
    pub throughput: Option<Throughput>,
    /// The predictions along `--sweep`, else null.
    pub sweep: Option<Sweep>,
    /// Which techniques to turn on, with `--advise`, else null.
    pub advice: Option<Advice>,
    /// Adjustments made to fit the config to the planned topology.
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct ModelInfo {
    pub preset: Option<String>,
    /// `"gpt2"` or `"llama"`.
    pub arch: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    /// Key/value heads (grouped-query attention; `n_head` for GPT-2).
    pub n_kv_head: usize,
    /// The MLP's hidden width.
    pub ffn_hidden: usize,
    pub tie_embeddings: bool,
    pub seq_len: usize,
    pub vocab_size: usize,
    pub num_params: u64,
    /// Sum over units of the padded flat buffers.
    pub padded_params: u64,
    pub units: usize,
    /// M = 2 x num_params (bf16 bytes).
    pub model_bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct TopologyInfo {
    pub world_size: usize,
    pub gpus_per_node: usize,
    pub nodes: usize,
}

#[derive(Debug, Serialize)]
pub struct TrainInfo {
    pub precision: Precision,
    pub param_bytes: usize,
    pub micro_batch: usize,
    pub accumulation: usize,
    pub global_batch: usize,
    pub steps: u64,
    /// `model.recompute`: `false`, `true` or `"attention"`.
    pub recompute: model::Recompute,
}

#[derive(Debug, Serialize)]
pub struct ZeroInfo {
    pub qwz: bool,
    pub weight_quant_block: Option<usize>,
    pub hpz: bool,
    pub hpz_partition_size: usize,
    pub qgz: bool,
    pub grad_quant_block: Option<usize>,
    /// qgZ is on for optimizer steps 1..=qgz_until_step.
    pub qgz_until_step: Option<u64>,
    pub qgz_error_feedback: bool,
    /// Gathers in flight ahead of the unit computing.
    pub prefetch_depth: usize,
    /// The plain reduce-scatter's dtype, `"fp32"` or `"bf16"` (`zero.reduce_dtype`).
    pub reduce_dtype: &'static str,
    /// Every shard is a whole number of this many elements.
    pub align: usize,
    /// The codecs' labels for the table ([`zero::WeightCodec::label`], [`zero::GradCodec::label`];
    /// the reductions' with qgZ's first where it is on), not in the JSON.
    #[serde(skip)]
    pub weight_codec: String,
    #[serde(skip)]
    pub grad_codecs: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Memory {
    /// The states, as the engine counts them: `shard_elems`, `param_shard`, `grad_shard`,
    /// `grad_in_place`, `optimizer_states`, `optimizer_includes_master`, `hpz_secondary`,
    /// `gathered_working_set`, `reductions_in_flight`, `qgz_error_feedback` (docs/plan.md).
    #[serde(flatten)]
    pub states: RankMemory,
    pub activations_saved_inputs: u64,
    pub activations_block_working: u64,
    pub activations_logits_chunk: u64,
    /// The blocks' linear weights in FP8 kept from the forward for the backward (W = 1 under
    /// FP8 compute: `model::Model::kept_fp8_weight_bytes`).
    pub activations_kept_fp8_weights: u64,
    pub activations: u64,
    pub total: u64,
}

#[derive(Debug, Serialize)]
pub struct Bytes {
    pub intra: u64,
    pub inter: u64,
}

impl From<ByteCounters> for Bytes {
    fn from(c: ByteCounters) -> Self {
        Bytes {
            intra: c.intra,
            inter: c.inter,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct AfterQgz {
    /// The first step without qgZ.
    pub step: u64,
    pub zeropp: Bytes,
    pub inter_ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct Comm {
    /// The step these are for (1) and its micro-batches (= accumulation).
    pub step: u64,
    pub micro_batches: usize,
    pub zero3: Bytes,
    pub zeropp: Bytes,
    /// zeropp.inter / zero3.inter.
    pub inter_ratio: f64,
    /// The same after the qgZ window (qgz_until < 1), else null.
    pub after_qgz: Option<AfterQgz>,
}

#[derive(Debug, Serialize)]
pub struct Paper {
    pub model_bytes: f64,
    pub zero3: f64,
    pub zeropp: f64,
    pub scales: f64,
    /// zeropp / zero3 (without scales).
    pub ratio: f64,
    /// M / gpus_per_node when hpZ is on, else 0.
    pub hpz_memory: f64,
}
