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
    /// One of `model::preset_names()`; the sizes below override it. Without a preset or
    /// `init_from` the five sizes (and a Llama-style `ffn_hidden`) are required.
    pub preset: Option<String>,
    /// `"gpt2"` (the default), `"llama"`, `"qwen2"`, `"qwen3"` or `"mistral"`; a preset names
    /// its own, and so does `init_from`'s config.json.
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
    /// Llama-style: the width of one attention head (default `n_embd / n_head`; Qwen3's
    /// presets 128).
    pub head_dim: Option<usize>,
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
    /// Activation checkpointing: `false` (keep every activation), `true` (a block keeps its
    /// input alone and its backward reruns its forward) or `"attention"` (Llama-family blocks
    /// also keep their MLP's activations, and the backward reruns only the attention half).
    pub recompute: model::Recompute,
    /// Start from the weights of a Hugging Face safetensors folder of a registered family
    /// (what `trainer export` writes, or a checkpoint from the hub): continued pretraining or
    /// fine-tuning. Without a preset its config.json gives the family and the shape, as a
    /// preset would (`seq_len` its context up to 2048, the vocabulary its own); a key set here
    /// overrides it, and one that contradicts the checkpoint is refused when the weights are
    /// read. A resume ignores it.
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
        // What the explicit keys override: a preset, else init_from's config.json.
        let (base, base_name) = match (&m.preset, &m.init_from) {
            (Some(name), _) => (
                Some(model::preset(name).with_context(|| {
                    format!(
                        "model.preset = {name:?} is not one of {}",
                        model::preset_names().join(", ")
                    )
                })?),
                format!("model.preset = {name:?}"),
            ),
            (None, Some(dir)) => (
                Some(hf_shape(dir)?),
                format!("model.init_from = {:?}", dir.display().to_string()),
            ),
            (None, None) => (None, String::new()),
        };
        let from_checkpoint = m.preset.is_none() && m.init_from.is_some();
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
                    "model.arch = {name:?} contradicts {base_name}, a {} model",
                    b.arch.name()
                );
            }
        }
        let n_layer = pick("n_layer", m.n_layer, base.as_ref().map(|b| b.n_layer))?;
        let n_embd = pick("n_embd", m.n_embd, base.as_ref().map(|b| b.n_embd))?;
        let n_head = pick("n_head", m.n_head, base.as_ref().map(|b| b.n_head))?;
        let seq_len = pick("seq_len", m.seq_len, base.as_ref().map(|b| b.seq_len))?;
        // The vocabulary: as set, else a checkpoint's own, else the tokenizer's padded to a
        // multiple of 128 (as Megatron pads, for the GEMMs), else the preset's.
        let vocab_size = match (m.vocab_size, tokenizer_vocab, &base) {
            (Some(v), _, _) => v,
            (None, _, Some(b)) if from_checkpoint => b.vocab_size,
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
            // A base's own head width; one that is n_embd / n_head follows a new n_embd.
            head_dim: m.head_dim.or(base
                .as_ref()
                .filter(|b| b.head_dim * b.n_head != b.n_embd)
                .map(|b| b.head_dim)),
            ffn_hidden: m.ffn_hidden.or(base.as_ref().map(|b| b.ffn_hidden)),
            tie_embeddings: base.as_ref().map(|b| b.tie_embeddings),
        };
        let mut cfg = arch.family().config(&sizes).map_err(model_error)?;
        // What the sizes do not carry comes from the preset (of this family: checked above).
        if let Some(b) = &base {
            cfg.norm_eps = b.norm_eps;
            cfg.rope_theta = b.rope_theta;
            cfg.rope_scaling = b.rope_scaling;
            cfg.sliding_window = b.sliding_window;
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
        if m.recompute == model::Recompute::Attention && cfg.family().mlp_kept_width(&cfg).is_none()
        {
            bail!(
                "model.recompute = \"attention\" keeps a Llama-family block's MLP activations; a \
                 {} block takes true or false",
                cfg.family().name()
            );
        }
        Ok(cfg)
    }
}

/// The shape `dir/config.json` describes ([`model::from_hf_config`]), for a run whose
/// `model.init_from` is its base.
fn hf_shape(dir: &std::path::Path) -> Result<model::ModelConfig> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("model.init_from: cannot read {}", path.display()))?;
    let j: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("model.init_from: {} is not JSON", path.display()))?;
    model::from_hf_config(&j)
        .map_err(|e| anyhow::anyhow!("model.init_from: {} {e}", path.display()))
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
