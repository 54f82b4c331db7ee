//! `[model]`: the section, and the [`model::ModelConfig`] it resolves to.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A vocabulary taken from the tokenizer is padded up to a multiple of this.
pub const VOCAB_MULTIPLE: usize = 128;

/// `[model]`: a preset, optionally with some of its sizes overridden.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// One of `model::preset_names()`; the sizes below override it. Without a preset the five
    /// sizes (and a Llama's `ffn_hidden`) are required.
    pub preset: Option<String>,
    /// `"gpt2"` (the default) or `"llama"`; a preset names its own.
    pub arch: Option<String>,
    pub n_layer: Option<usize>,
    pub n_embd: Option<usize>,
    pub n_head: Option<usize>,
    pub seq_len: Option<usize>,
    /// Rows of the token embedding and LM head. Unset: the tokenizer's vocabulary padded to a
    /// multiple of 128 (a preset's own where no tokenizer is read).
    pub vocab_size: Option<usize>,
    /// Llama: key/value heads of grouped-query attention (default `n_head`).
    pub n_kv_head: Option<usize>,
    /// Llama: the SwiGLU MLP's hidden width.
    pub ffn_hidden: Option<usize>,
    /// Llama: RMSNorm's epsilon (default 1e-5).
    pub norm_eps: Option<f64>,
    /// Llama: the rotary base (default 500,000).
    pub rope_theta: Option<f64>,
    /// Llama: the rescaling of the rotary frequencies, as config.json writes it:
    /// `{ rope_type = "llama3", factor = 32.0, low_freq_factor = 1.0, high_freq_factor = 4.0,
    /// original_max_position_embeddings = 8192 }`, or `{ rope_type = "default" }` for none
    /// (default: the preset's; the Llama 3.1 and 3.2 presets set theirs).
    pub rope_scaling: Option<model::RopeScaling>,
    /// Llama: the LM head reads the token embedding (default: the preset's, else true).
    pub tie_embeddings: Option<bool>,
    /// Activation checkpointing: blocks keep only their input and recompute in backward.
    pub recompute: bool,
    /// Start from the weights of a Hugging Face GPT-2 or Llama safetensors folder (what
    /// `trainer export` writes): continued pretraining or fine-tuning. A resume ignores it.
    pub init_from: Option<PathBuf>,
}

impl ModelSection {
    /// The model this section describes: the preset, then any explicit sizes, checked.
    ///
    /// `tokenizer_vocab` is the vocabulary size of the tokenizer the run reads (`None` where it
    /// reads none). Where `model.vocab_size` is unset it gives the model's vocabulary, padded
    /// to a multiple of [`VOCAB_MULTIPLE`]; without it, the preset's size stands.
    pub fn resolve(&self, tokenizer_vocab: Option<usize>) -> Result<model::ModelConfig> {
        let m = self;
        let base = match &m.preset {
            Some(name) => Some(model::preset(name).with_context(|| {
                format!(
                    "model.preset = {name:?} is not one of {}",
                    model::preset_names().join(", ")
                )
            })?),
            None => None,
        };
        let pick = |key: &str, explicit: Option<usize>, preset: Option<usize>| {
            explicit
                .or(preset)
                .with_context(|| format!("model.{key} is required without model.preset"))
        };
        let arch = match (&m.arch, &base) {
            (Some(name), _) => model::Arch::from_name(name).with_context(|| {
                format!(
                    "model.arch = {name:?} is not one of {}",
                    model::family_names()
                        .iter()
                        .map(|n| format!("{n:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?,
            (None, Some(b)) => b.arch,
            (None, None) => model::Arch::default(),
        };
        if let (Some(b), Some(name)) = (&base, &m.arch) {
            if b.arch != arch {
                bail!(
                    "model.arch = {name:?} contradicts model.preset = {:?}, a {} preset",
                    m.preset.as_deref().unwrap_or_default(),
                    b.arch.name()
                );
            }
        }
        let n_layer = pick("n_layer", m.n_layer, base.as_ref().map(|b| b.n_layer))?;
        let n_embd = pick("n_embd", m.n_embd, base.as_ref().map(|b| b.n_embd))?;
        let n_head = pick("n_head", m.n_head, base.as_ref().map(|b| b.n_head))?;
        let seq_len = pick("seq_len", m.seq_len, base.as_ref().map(|b| b.seq_len))?;
        // The vocabulary: as set, else the tokenizer's padded to a multiple of 128 (as Megatron
        // pads, for the GEMMs), else the preset's.
        let vocab_size = match (m.vocab_size, tokenizer_vocab, &base) {
            (Some(v), _, _) => v,
            (None, Some(t), _) => t.div_ceil(VOCAB_MULTIPLE) * VOCAB_MULTIPLE,
            (None, None, Some(b)) => b.vocab_size,
            (None, None, None) => {
                bail!("model.vocab_size is required without model.preset or a tokenizer")
            }
        };
        // The family builds the shape, with its defaults for what is unset; the sizes a family
        // may take are the config's, else the preset's.
        let sizes = model::Sizes {
            n_layer,
            n_embd,
            n_head,
            seq_len,
            vocab_size,
            n_kv_head: m.n_kv_head.or(base.as_ref().map(|b| b.n_kv_head)),
            ffn_hidden: m.ffn_hidden.or(base.as_ref().map(|b| b.ffn_hidden)),
            tie_embeddings: base.as_ref().map(|b| b.tie_embeddings),
        };
        let mut cfg = arch.family().config(&sizes).map_err(model_error)?;
        // What the sizes do not carry comes from the preset (of this family: checked above).
        if let Some(b) = &base {
            cfg.norm_eps = b.norm_eps;
            cfg.rope_theta = b.rope_theta;
            cfg.rope_scaling = b.rope_scaling;
        }
        // A family that fixes one of these refuses a value given for it (validate), rather
        // than ignoring it.
        if let Some(kv) = m.n_kv_head {
            cfg.n_kv_head = kv;
        }
        if let Some(f) = m.ffn_hidden {
            cfg.ffn_hidden = f;
        }
        if let Some(eps) = m.norm_eps {
            cfg.norm_eps = eps;
        }
        if let Some(theta) = m.rope_theta {
            cfg.rope_theta = theta;
        }
        if let Some(scaling) = m.rope_scaling {
            cfg.rope_scaling = scaling;
        }
        if let Some(tied) = m.tie_embeddings {
            cfg.tie_embeddings = tied;
        }
        cfg.validate().map_err(model_error)?;
        Ok(cfg)
    }
}

/// A model shape error with the config keys it is about (`model.n_embd`), so that
/// [`RunConfig::load`](super::RunConfig::load) blames the `--set` that gave the value rather than the file.
fn model_error(e: model::ModelError) -> anyhow::Error {
    match e {
        model::ModelError::ZeroSize { field } => anyhow::anyhow!("model.{field} must be positive"),
        model::ModelError::HeadsDoNotDivide { n_embd, n_head } => {
            anyhow::anyhow!("model.n_embd = {n_embd} is not a multiple of model.n_head = {n_head}")
        }
        // Messages that name their `model.` keys: the `--set` of either key is blamed.
        e @ (model::ModelError::OddHeadDim { .. }
        | model::ModelError::Shape { .. }
        | model::ModelError::Required { .. }) => {
            anyhow::anyhow!("{e}")
        }
        other => anyhow::anyhow!("[model] {other}"),
    }
}
