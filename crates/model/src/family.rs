//! The model families, one registry, so that nothing outside a family's own module names it.
//! A [`Family`] is everything about one architecture: its name (`model.arch`, config.json's
//! `model_type`) and presets, the shape it builds from a run config's sizes and checks, its
//! parameter rows, its units' forward and backward and its head, its decode step, its
//! parameter count, FLOPs and activation bytes, the settings a checkpoint records of it, and
//! its Hugging Face mapping both ways (config.json, tensor names, the class transformers loads
//! it as). Each family's implementation lives beside its layers (`gpt2/`, `llama/`);
//! [`FAMILIES`] registers it, and the schedule ([`crate::Model`]), the layout and the
//! [`crate::Decoder`] ask it (docs/design.md, "Adding a family").

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;
use crate::decode::LayerCache;
use crate::error::{ModelError, Result};
use crate::layers::{Loss, RopeTables, TokenIndex};
use crate::layout::{ParamSpec, UnitKind, UnitLayout, UnitTable};
use crate::linears::LinearFormat;
use crate::recompute::Recompute;
use crate::schedule::{Saved, UnitParams};

/// An input of a block's linear layers (see [`Family::block_linear_inputs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearInput {
    /// Its width, the IN of the layers that read it.
    pub width: usize,
    /// What the block keeps of it for the weight gradient under FP8.
    pub fp8: Fp8Kept,
}

/// What a block keeps of a linear layer's input for its backward under FP8
/// ([`crate::SavedInput`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Kept {
    /// The input itself (in the compute dtype): another layer's backward reads it too
    /// (attention's output, before the o projection).
    Input,
    /// Its transpose's FP8 codes in 128 x 128 tiles, made in the forward's read: where the
    /// weight gradient is all the backward reads it for (1 byte an element and a scale a tile).
    Codes,
    /// Its columns' absmax alone: the kernel that makes it makes it again in the backward from
    /// what the block keeps anyway, and encodes it there with one scale a whole column (SwiGLU's
    /// output into down). `dout_width` is the layer's output gradient, which is read once more
    /// for its own columns' absmax.
    ColumnAbsmax { dout_width: usize },
}

/// A model family: one architecture, everything about it.
///
/// Units: every family's model is `[embedding, block 0, .., block L-1, final norm]`, each a
/// flat parameter buffer laid out by [`Family::rows`]; the head reads the embedding's buffer
/// when tied, else the final norm's ([`crate::Model::head_unit`]). A forward returns what its
/// backward reads as a [`Saved`] of the family's own type; a backward returns the unit's flat
/// gradient (its numel elements, never accumulated) and the gradient of its input.
pub trait Family: Sync {
    /// Its name: `model.arch`, the manifest's `arch`, and config.json's `model_type`.
    fn name(&self) -> &'static str;

    /// The transformers class an export loads as (`GPT2LMHeadModel`).
    fn hf_class(&self) -> &'static str;

    /// Its named shapes (`model.preset`), smallest first.
    fn presets(&self) -> Vec<(&'static str, ModelConfig)>;

    /// The shape a run config's sizes give, the family's defaults where `sizes` leaves a
    /// setting unset; [`ModelError::Required`] for a size the family has no default for.
    fn config(&self, sizes: &Sizes) -> Result<ModelConfig>;

    /// What the family's shape must satisfy beyond every family's checks (positive sizes,
    /// heads that divide, a finite epsilon), which [`ModelConfig::validate`] makes first.
    fn validate(&self, cfg: &ModelConfig) -> Result<()>;

    /// Unique parameters, a tied LM head counted once.
    fn num_params(&self, cfg: &ModelConfig) -> usize;

    /// Elements a token that a block keeps beyond its input under [`Recompute::Attention`]
    /// (the MLP half's activations, from which its backward recomputes only the attention
    /// half's), or `None` where the family's blocks do not take it.
    fn mlp_kept_width(&self, cfg: &ModelConfig) -> Option<usize> {
        let _ = cfg;
        None
    }

    /// The linear layers' parameters that a [`Recompute::Attention`] backward multiplies again
    /// (Llama: q|k|v's projection; the attention itself runs again too), or `None` where the
    /// family's blocks do not take it.
    fn attention_half_params(&self, cfg: &ModelConfig) -> Option<usize> {
        let _ = cfg;
        None
    }

    /// Bytes of activations one block keeps for its backward for `batch` sequences of
    /// `seq_len`, at `bytes` per element (2 for bf16), its linear layers multiplying in
    /// `linears` (under FP8 a block may keep a projection's input as FP8 column blocks,
    /// [`crate::SavedInput`]).
    fn block_activation_bytes(
        &self,
        cfg: &ModelConfig,
        batch: usize,
        seq_len: usize,
        bytes: usize,
        linears: LinearFormat,
    ) -> u64;

    /// The inputs a block's linear layers read, one an input: the layers of a packed
    /// projection (q|k|v, gate|up) share theirs. FP8 quantises each input once a pass, or both
    /// ways in the forward for one the block keeps as codes ([`crate::Model::fp8_cast_bytes`],
    /// [`Family::block_activation_bytes`]).
    fn block_linear_inputs(&self, cfg: &ModelConfig) -> Vec<LinearInput>;

    /// The settings beyond [`Sizes`]' common ones that fix a run's trajectory, as
    /// `(config key, value)`: a resume that changes one is refused by key.
    fn trajectory(&self, cfg: &ModelConfig) -> Vec<(&'static str, String)>;

    /// What the manifest records of `cfg` beyond the common sizes, under the family's name;
    /// `None` for a family whose checkpoints predate the registry and record nothing more.
    fn record(&self, cfg: &ModelConfig) -> Option<serde_json::Value>;

    /// The shape a manifest recorded (the common sizes, and the family's [`Family::record`]).
    fn from_record(&self, sizes: &Sizes, own: Option<&serde_json::Value>) -> Result<ModelConfig>;

    /// Where parameter `p` of `cfg`'s model lives in the family's Hugging Face checkpoint: one
    /// tensor, or one for each block of its columns (a packed projection).
    fn hf_tensors(&self, cfg: &ModelConfig, p: &ParamSpec) -> Vec<HfTensor>;

    /// Whether a manifest's record of this family (`own`, [`Family::record`]) was written by a
    /// trainer whose parameter table [`Family::repack_legacy`] converts from.
    fn legacy_record(&self, _own: Option<&serde_json::Value>) -> bool {
        false
    }

    /// A unit's whole flat buffer as a [`Family::legacy_record`] checkpoint holds it,
    /// rewritten in place in this trainer's table (`unit`); the same numel and, for every
    /// parameter, the same range of the buffer.
    fn repack_legacy(&self, _cfg: &ModelConfig, _unit: &UnitLayout, _data: &mut [f32]) {}

    /// Whether a tensor of a Hugging Face checkpoint that is none of our parameters may be
    /// passed over: a buffer transformers saves (a causal mask, a rotary table), or a tied head
    /// saved anyway.
    fn hf_buffer(&self, name: &str, cfg: &ModelConfig) -> bool;

    /// The `config.json` of its Hugging Face class; `eod` the end-of-document token (written
    /// as BOS and EOS).
    fn hf_config(&self, cfg: &ModelConfig, eod: Option<u32>) -> serde_json::Value;

    /// The shape a `config.json` of this family's `model_type` describes, as transformers
    /// builds it (its defaults where a key is absent), or what in it the family does not
    /// implement, as the rest of a one-line message that names the key. `seq_len` is the
    /// context where positions are learned (GPT-2's `n_positions`), else the
    /// `max_position_embeddings` up to 2048, the length a run trains at unless it sets its own.
    fn from_hf_config(&self, j: &serde_json::Value) -> std::result::Result<ModelConfig, String>;

    /// Checks a `config.json` of this family's `model_type` against `cfg`: the settings the
    /// tensors' shapes do not show (a rope's theta, a norm's epsilon, a tied head). The error
    /// is the rest of a one-line message that names the key.
    fn check_hf_config(
        &self,
        j: &serde_json::Value,
        cfg: &ModelConfig,
    ) -> std::result::Result<(), String>;

    // ---- compute: the units' parameters, forward and backward, and the head ----

    /// Unit `kind`'s table: its name, its parameters' name prefix, and a row per parameter
    /// (short name, shape, init, weight decay), the single list of the family's tensors.
    fn rows(&self, cfg: &ModelConfig, kind: UnitKind) -> UnitTable;

    /// The embedding unit's forward: `tokens (B, T)` u32 to `(B, T, C)`.
    fn embedding_forward(
        &self,
        cfg: &ModelConfig,
        params: &Tensor,
        tokens: &Tensor,
    ) -> Result<Tensor>;

    /// The embedding unit's flat gradient from `dout (B, T, C)`, scattered by `tokens`, added
    /// onto `onto` where given: another flat gradient of the unit (a tied LM head's), which
    /// the GPU's kernel adds the token rows into in place ([`crate::layers::embedding_backward_onto`]).
    fn embedding_backward(
        &self,
        cfg: &ModelConfig,
        tokens: &TokenIndex,
        dout: &Tensor,
        onto: Option<Tensor>,
    ) -> Result<Tensor>;

    /// A block's forward of `x (B, T, C)`: its output, and what its backward reads (what
    /// `recompute` keeps: the backward recomputes the rest, to the same bits).
    /// `lin` is the format its linear layers multiply in.
    fn block_forward(
        &self,
        cfg: &ModelConfig,
        lin: LinearFormat,
        params: &UnitParams,
        x: &Tensor,
        recompute: Recompute,
    ) -> Result<(Tensor, Saved)>;

    /// A block's backward: `(dx, flat gradient)`.
    fn block_backward(
        &self,
        cfg: &ModelConfig,
        lin: LinearFormat,
        params: &UnitParams,
        saved: &Saved,
        dout: &Tensor,
    ) -> Result<(Tensor, Tensor)>;

    /// The final norm unit's forward.
    fn final_norm_forward(
        &self,
        cfg: &ModelConfig,
        params: &Tensor,
        x: &Tensor,
    ) -> Result<(Tensor, Saved)>;

    /// The final norm unit's backward: `(dx, flat gradient)`.
    fn final_norm_backward(
        &self,
        cfg: &ModelConfig,
        params: &Tensor,
        saved: &Saved,
        dout: &Tensor,
    ) -> Result<(Tensor, Tensor)>;

    /// The LM head and mean cross-entropy of `x (B, T, C)` against `targets (B, T)`,
    /// reading the head unit's buffer; with `grad`, also `dx` and the head unit's flat
    /// gradient (only the head's matrix nonzero).
    fn head_loss(
        &self,
        cfg: &ModelConfig,
        head_params: &Tensor,
        x: &Tensor,
        targets: &Tensor,
        grad: bool,
    ) -> Result<(Loss, Option<(Tensor, Tensor)>)>;

    /// Training FLOPs per token at sequence length `seq_len`, in the llm.c / PaLM convention
    /// the PyTorch anchors print: `6 N + 6 L C T` (every parameter's multiply-add forward and
    /// twice backward, causal attention counted once).
    fn flops_per_token(&self, cfg: &ModelConfig, seq_len: usize) -> f64 {
        6.0 * cfg.num_params() as f64 + 6.0 * (cfg.n_layer * cfg.n_embd * seq_len) as f64
    }

    // ---- decode: one sequence's next positions against a KV cache ----

    /// The rotary tables of every position of the context, made once per decoder; `None`
    /// for a family whose positions are learned.
    fn rope(&self, cfg: &ModelConfig, dtype: DType, device: &Device) -> Result<Option<RopeTables>>;

    /// The embedding of `tokens (1, T)` fed after `start` cached positions: `(1, T, C)`.
    fn embedding_decode(
        &self,
        cfg: &ModelConfig,
        params: &Tensor,
        tokens: &Tensor,
        start: usize,
    ) -> Result<Tensor>;

    /// A block for `x (1, T, C)`, the next `T` positions after those in `cache` (which this
    /// extends), `rope` what [`Family::rope`] made: `(1, T, C)`, nothing kept.
    fn block_decode(
        &self,
        cfg: &ModelConfig,
        params: &Tensor,
        x: &Tensor,
        cache: &mut LayerCache,
        rope: Option<&RopeTables>,
    ) -> Result<Tensor>;

    /// The logits `(V)` of the last position of `x (1, T, C)`, the blocks' output, from
    /// every unit's buffer (`units`, in unit order): the final norm, then the head.
    fn logits_decode(&self, cfg: &ModelConfig, units: &[Tensor], x: &Tensor) -> Result<Tensor>;
}

/// Every family, in the order their names are listed to a user.
pub static FAMILIES: &[&dyn Family] = &[
    &crate::gpt2::family::Gpt2,
    &crate::llama::family::LLAMA,
    &crate::qwen2::QWEN2,
    &crate::qwen3::QWEN3,
    &crate::mistral::MISTRAL,
];

/// The family named `name` (`model.arch`, `model_type`).
pub fn family(name: &str) -> Option<&'static dyn Family> {
    FAMILIES.iter().copied().find(|f| f.name() == name)
}

/// The shape a Hugging Face `config.json` describes, by its `model_type`
/// ([`Family::from_hf_config`]); the error is the rest of a one-line message.
pub fn from_hf_config(j: &serde_json::Value) -> std::result::Result<ModelConfig, String> {
    let model_type = j["model_type"]
        .as_str()
        .ok_or("has no model_type".to_string())?;
    let family = family(model_type).ok_or_else(|| {
        format!(
            "has model_type = {model_type:?}, not one of {}",
            family_names().join(", ")
        )
    })?;
    family.from_hf_config(j)
}

/// The registered families' names, for a message that lists them.
pub fn family_names() -> Vec<&'static str> {
    FAMILIES.iter().map(|f| f.name()).collect()
}

/// Every family's shape of `sizes` with a tied head, and with an untied one where the family
/// has it, named (`"llama untied"`). The properties every family must hold (the ZeRO
/// engine's, decoding's, the Hugging Face round trip) are tested over these, so that a family
/// added to [`FAMILIES`] is tested without a line written for it.
pub fn every_family(sizes: &Sizes) -> Vec<(String, ModelConfig)> {
    let mut shapes = Vec::new();
    for family in FAMILIES {
        for tied in [true, false] {
            let sizes = Sizes {
                tie_embeddings: Some(tied),
                ..sizes.clone()
            };
            let Ok(cfg) = family.config(&sizes) else {
                continue;
            };
            if cfg.tie_embeddings == tied && cfg.validate().is_ok() {
                let name = match tied {
                    true => family.name().to_string(),
                    false => format!("{} untied", family.name()),
                };
                shapes.push((name, cfg));
            }
        }
    }
    shapes
}

/// The named shapes of every family ([`Family::presets`]).
pub fn preset(name: &str) -> Option<ModelConfig> {
    FAMILIES
        .iter()
        .flat_map(|f| f.presets())
        .find(|(n, _)| *n == name)
        .map(|(_, cfg)| cfg)
}

/// Every preset's name, family by family in the registry's order, smallest first.
pub fn preset_names() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .flat_map(|f| f.presets())
        .map(|(n, _)| n)
        .collect()
}

impl ModelConfig {
    /// The family of this shape.
    pub fn family(&self) -> &'static dyn Family {
        self.arch.family()
    }
}

/// The sizes every family has, and the three a family may fix or default (`None`: unset, the
/// family's default applies, or [`ModelError::Required`] where it has none).
#[derive(Clone, Debug, PartialEq)]
pub struct Sizes {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub seq_len: usize,
    pub vocab_size: usize,
    pub n_kv_head: Option<usize>,
    /// A head width of its own (Qwen3); unset, `n_embd / n_head`.
    pub head_dim: Option<usize>,
    pub ffn_hidden: Option<usize>,
    pub tie_embeddings: Option<bool>,
}

/// Where a parameter, or a block of its columns, lives in a Hugging Face checkpoint
/// ([`Family::hf_tensors`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfTensor {
    /// The tensor's name in `model.safetensors`.
    pub name: String,
    /// Another name checkpoints in the wild give it (GPT-2's without `transformer.`).
    pub alias: Option<String>,
    /// HF stores it transposed from ours (`(out, in)` where we keep `(in, out)`).
    pub transpose: bool,
    /// Its rows are the vocabulary: a checkpoint with fewer (GPT-2's 50,257 against our
    /// 50,304) is read into the first rows, the rest zero.
    pub vocab_rows: bool,
    /// The columns of our parameter (its last dimension) this tensor holds: all of them, or
    /// one projection's block of a packed one (q|k|v, gate|up).
    pub columns: std::ops::Range<usize>,
}

impl HfTensor {
    /// Its shape in the Hugging Face checkpoint, for parameter `p`: `p`'s with the last
    /// dimension its [`HfTensor::columns`], reversed where it is stored transposed.
    pub fn shape(&self, p: &ParamSpec) -> Vec<usize> {
        let mut shape = p.shape.clone();
        if let Some(last) = shape.last_mut() {
            *last = self.columns.len();
        }
        if self.transpose {
            shape.reverse();
        }
        shape
    }
}

/// A model shape as a checkpoint's manifest records it: the family's name (absent for GPT-2,
/// as trainers before the registry wrote it), the common sizes, and what the family adds under
/// its own name (`"llama": {"n_kv_head": 2, ...}`), which it serialises itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShapeRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub seq_len: usize,
    pub vocab_size: usize,
    /// The family's own record, keyed by its name.
    #[serde(flatten)]
    pub family: BTreeMap<String, serde_json::Value>,
}

impl From<&ModelConfig> for ShapeRecord {
    fn from(c: &ModelConfig) -> Self {
        let family = c.family();
        let own = family.record(c);
        ShapeRecord {
            arch: own.as_ref().map(|_| family.name().to_string()),
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            n_head: c.n_head,
            seq_len: c.seq_len,
            vocab_size: c.vocab_size,
            family: own
                .map(|v| BTreeMap::from([(family.name().to_string(), v)]))
                .unwrap_or_default(),
        }
    }
}

impl ShapeRecord {
    /// Whether the checkpoint was written in a parameter table older than this trainer's
    /// ([`Family::legacy_record`]): its units' buffers are [`Family::repack_legacy`]'s input.
    pub fn legacy_layout(&self) -> bool {
        let name = self.arch.as_deref().unwrap_or(FAMILIES[0].name());
        family(name).is_some_and(|f| f.legacy_record(self.family.get(name)))
    }

    /// The model this record describes, checked ([`ModelConfig::validate`]).
    pub fn config(&self) -> Result<ModelConfig> {
        let name = self.arch.as_deref().unwrap_or(FAMILIES[0].name());
        let family = family(name).ok_or_else(|| ModelError::Shape {
            field: "arch",
            reason: format!("{name:?} is not one of {}", family_names().join(", ")),
        })?;
        let sizes = Sizes {
            n_layer: self.n_layer,
            n_embd: self.n_embd,
            n_head: self.n_head,
            seq_len: self.seq_len,
            vocab_size: self.vocab_size,
            n_kv_head: None,
            head_dim: None,
            ffn_hidden: None,
            tie_embeddings: None,
        };
        let cfg = family.from_record(&sizes, self.family.get(name))?;
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every arch has its family, found by its name; every preset's shape records and reads
    /// back as itself, through the JSON a manifest holds.
    #[test]
    fn every_family_is_registered_and_its_shapes_round_trip() {
        for f in FAMILIES {
            let arch = crate::Arch::from_name(f.name()).unwrap();
            assert_eq!(arch.name(), f.name());
            assert_eq!(family(f.name()).map(|f| f.name()), Some(f.name()));
        }
        let names = preset_names();
        let unique: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(
            unique.len(),
            names.len(),
            "a preset name is given twice: {names:?}"
        );
        for name in names {
            let cfg = crate::preset(name).unwrap();
            let json = serde_json::to_string(&ShapeRecord::from(&cfg)).unwrap();
            let back: ShapeRecord = serde_json::from_str(&json).unwrap();
            assert_eq!(back.config().unwrap(), cfg, "{name}: {json}");
        }
    }

    /// Every family's linear inputs are the IN sides of its blocks' linear weights, each once:
    /// every weight reads one of them, and none is listed that no weight reads.
    #[test]
    fn block_linear_inputs_are_the_ins_of_the_linear_weights() {
        for name in preset_names() {
            let cfg = crate::preset(name).unwrap();
            let layout = crate::ModelLayout::new(&cfg);
            let ins: std::collections::BTreeSet<usize> = layout
                .block(0)
                .linear_weights()
                .map(|p| p.shape[0])
                .collect();
            let listed = cfg.family().block_linear_inputs(&cfg);
            let set: std::collections::BTreeSet<usize> = listed.iter().map(|i| i.width).collect();
            assert_eq!(set, ins, "{name}: {listed:?}");
            assert!(listed.len() <= layout.block(0).linear_weights().count());
        }
    }

    /// Under FP8 a Llama block keeps n1 and n2 (2 C an element) as codes and scales, 4097/4096
    /// bytes an element (a scale a 128 x 128 tile) instead of 2, and of silu(gate)*up (F) its
    /// columns' absmax alone (4 F bytes a block): 320 MiB less a block at Llama 3.2 1B's shape
    /// and 8 sequences of 2048;
    /// GPT-2's upper-end estimate is the same in both formats.
    #[test]
    fn an_fp8_llama_block_keeps_its_projection_inputs_as_codes() {
        let llama = crate::Model::new(crate::preset("llama3.2-1b").unwrap()).unwrap();
        let dense = llama.block_activation_bytes(8, 2048, 2);
        let fp8 = llama
            .with_linears(LinearFormat::Fp8)
            .block_activation_bytes(8, 2048, 2);
        assert_eq!(
            dense - fp8,
            16_384 * (2 * 12_288 - 4096 * 4097 / 4096) - 4 * 8192
        );
        let gpt2 = crate::Model::new(crate::preset("gpt350m").unwrap()).unwrap();
        assert_eq!(
            gpt2.block_activation_bytes(8, 1024, 2),
            gpt2.with_linears(LinearFormat::Fp8)
                .block_activation_bytes(8, 1024, 2)
        );
    }

    /// FP8's casts in a small Llama block, counted by hand: inputs C + C = 256 kept as codes
    /// (cast both ways in the forward, 4 bytes, none in the backward), NH hs = 128 and F = 256
    /// not (3 bytes each way; F is kept as its columns' absmax, and down's dout, C = 128, read
    /// once more for its own: 2 bytes), outputs 128 + 64 + 64 (q|k|v) + 128 (o) + 256 + 256
    /// (gate|up) + 128 (down) = 1024, 147,456 weights; nothing for the embedding, nor for a
    /// dense model.
    #[test]
    fn fp8_cast_bytes_of_a_llama_block() {
        let cfg = ModelConfig::llama(2, 128, 4, 2, 256, 64, 320, true);
        let model = crate::Model::new(cfg).unwrap();
        assert_eq!(model.fp8_cast_bytes(1, 10, false), (0, 0));
        let fp8 = model.with_linears(LinearFormat::Fp8);
        let weights = 147_456;
        let inputs = 10 * (4 * 256 + 3 * (128 + 256));
        let gradients = 10 * (3 * (128 + 256) + 4 * 1024 + 2 * 128);
        assert_eq!(
            fp8.fp8_cast_bytes(1, 10, false),
            (inputs + 3 * weights, gradients + 3 * weights)
        );
        // FP8 qwZ's codes: transposed in the forward, read as they are in the backward.
        assert_eq!(
            fp8.fp8_cast_bytes(1, 10, true),
            (inputs + 2 * weights, gradients)
        );
        assert_eq!(fp8.fp8_cast_bytes(0, 10, false), (0, 0));
    }

    /// GPT-2 records what trainers before the registry wrote (no `arch`, nothing more), and
    /// a Llama the same fields as before under `"llama"`: old manifests read as they did.
    #[test]
    fn records_keep_the_manifests_of_earlier_trainers() {
        let gpt2 = serde_json::to_value(ShapeRecord::from(&crate::preset("tiny").unwrap()));
        assert_eq!(
            gpt2.unwrap(),
            serde_json::json!({"n_layer": 2, "n_embd": 64, "n_head": 4, "seq_len": 64,
                               "vocab_size": 50304})
        );
        let old = r#"{"arch": "llama", "n_layer": 2, "n_embd": 64, "n_head": 4, "seq_len": 64,
            "vocab_size": 1024, "llama": {"n_kv_head": 2, "ffn_hidden": 192, "norm_eps": 1e-5,
            "rope_theta": 500000.0, "tie_embeddings": true}}"#;
        let cfg = serde_json::from_str::<ShapeRecord>(old)
            .unwrap()
            .config()
            .unwrap();
        assert_eq!(
            cfg,
            crate::ModelConfig::llama(2, 64, 4, 2, 192, 64, 1024, true)
        );
        let unknown = r#"{"arch": "mamba", "n_layer": 2, "n_embd": 64, "n_head": 4,
            "seq_len": 64, "vocab_size": 1024}"#;
        let e = serde_json::from_str::<ShapeRecord>(unknown)
            .unwrap()
            .config()
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("\"mamba\" is not one of gpt2, llama"),
            "{e}"
        );
    }
}
