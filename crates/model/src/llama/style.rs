//! The families built on Llama's decoder block ([`LlamaStyle`]): Llama itself, Qwen2 (biases on
//! q, k and v), Qwen3 (an RMSNorm of each query and key head, a head width of its own) and
//! Mistral (a sliding window in its config). They share the block's forward, backward and decode
//! (`llama/mod.rs`, which reads `cfg.qkv_bias` and `cfg.qk_norm`), the parameter table, the
//! checkpoint record and the Hugging Face mapping; each family's module gives its names, its
//! presets and defaults, and what its config.json may say.

use candle_core::{DType, Device, Tensor};

use crate::config::{Arch, ModelConfig};
use crate::decode::LayerCache;
use crate::error::{ModelError, Result};
use crate::family::{Family, Fp8Kept, HfTensor, LinearInput, Sizes};
use crate::layers::{rope_tables, Loss, RopeScaling, RopeTables, TokenIndex};
use crate::layout::{init_stds, ParamInit, ParamSpec, UnitKind, UnitLayout, UnitTable};
use crate::linears::LinearFormat;
use crate::recompute::Recompute;
use crate::schedule::{Saved, UnitParams};

/// A family of Llama's block: its names, what it adds to the block, its defaults, its presets.
pub struct LlamaStyle {
    /// `model.arch`, the manifest's `arch`, config.json's `model_type`.
    pub name: &'static str,
    /// The transformers class (`Qwen3ForCausalLM`).
    pub hf_class: &'static str,
    /// Every shape of the family has biases on q, k and v (Qwen2).
    pub qkv_bias: bool,
    /// Every shape of the family normalises each query and key head (Qwen3).
    pub qk_norm: bool,
    /// How its config.json sets a sliding window.
    pub window: Window,
    /// RMSNorm's epsilon and the rotary base of a shape made from sizes alone.
    pub norm_eps: f64,
    pub rope_theta: f64,
    /// Its named shapes, smallest first.
    pub presets: fn() -> Vec<(&'static str, ModelConfig)>,
}

/// How a family's config.json sets a sliding window of attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// It has none (Llama).
    None,
    /// `sliding_window`, where absent transformers' default of 4096 (Mistral).
    Mistral,
    /// Only with `use_sliding_window = true` (or a `sliding_attention` layer type), which
    /// zeropp refuses: no released Qwen checkpoint sets it.
    Qwen,
}

/// The longest `seq_len` a shape read from config.json trains at unless `model.seq_len` says:
/// `max_position_embeddings` is the longest context (131,072 for Llama 3.2), not a length to
/// train every sequence at.
pub const HF_SEQ_LEN: usize = 2048;

impl LlamaStyle {
    /// A shape of this family: Llama's block with the family's additions and defaults.
    #[allow(clippy::too_many_arguments)]
    pub fn shape(
        &'static self,
        n_layer: usize,
        n_embd: usize,
        n_head: usize,
        n_kv_head: usize,
        head_dim: usize,
        ffn_hidden: usize,
        seq_len: usize,
        vocab_size: usize,
        tie_embeddings: bool,
    ) -> ModelConfig {
        ModelConfig {
            arch: Arch::of(self),
            n_layer,
            n_embd,
            n_head,
            n_kv_head,
            head_dim,
            ffn_hidden,
            seq_len,
            vocab_size,
            norm_eps: self.norm_eps,
            rope_theta: self.rope_theta,
            rope_scaling: RopeScaling::Default,
            tie_embeddings,
            qkv_bias: self.qkv_bias,
            qk_norm: self.qk_norm,
            sliding_window: None,
        }
    }
}

/// The packed projections' parameters: q|k|v's weight `(C, (NH + 2 KV) hs)` and biases (Qwen2),
/// gate|up's weight `(C, 2F)`, each one matrix so that each projection is one GEMM each way
/// (Phi-3's names; Hugging Face's Llama, Qwen and Mistral keep one matrix a projection, which
/// [`LlamaStyle::hf_tensors`] splits and merges by columns).
pub const QKV: &str = "self_attn.qkv_proj.weight";
pub const QKV_BIAS: &str = "self_attn.qkv_proj.bias";
pub const GATE_UP: &str = "mlp.gate_up_proj.weight";

/// The tables. Names follow HF `LlamaForCausalLM` (and Qwen's, Mistral's, the same) without
/// the `model.` prefix, but for the packed projections ([`QKV`], [`GATE_UP`]); linear weights
/// are stored `(in, out)` as GPT-2's are (export transposes them to HF's `(out, in)`), the
/// embedding and LM head `(V, C)`. Untied, `lm_head.weight` lives in the final norm's unit: the
/// head reads that unit.
pub(crate) fn rows(cfg: &ModelConfig, kind: UnitKind) -> UnitTable {
    let (c, v, f, hs) = (cfg.n_embd, cfg.vocab_size, cfg.ffn_hidden, cfg.head_dim);
    let (q, kv) = (cfg.n_head * hs, cfg.n_kv_head * hs);
    let (std, resid_std) = init_stds(cfg);
    use ParamInit::{Normal, Ones, Zeros};
    let table = match kind {
        UnitKind::Embedding => (
            "embedding".into(),
            String::new(),
            vec![("embed_tokens.weight", vec![v, c], Normal { std }, true)],
        ),
        UnitKind::Block(l) => {
            let mut rows = vec![
                ("input_layernorm.weight", vec![c], Ones, false),
                (QKV, vec![c, q + 2 * kv], Normal { std }, true),
            ];
            if cfg.qkv_bias {
                rows.push((QKV_BIAS, vec![q + 2 * kv], Zeros, false));
            }
            if cfg.qk_norm {
                rows.push(("self_attn.q_norm.weight", vec![hs], Ones, false));
                rows.push(("self_attn.k_norm.weight", vec![hs], Ones, false));
            }
            #[rustfmt::skip]
            rows.extend([
                ("self_attn.o_proj.weight",         vec![q, c],     Normal { std: resid_std }, true),
                ("post_attention_layernorm.weight", vec![c],        Ones,                      false),
                (GATE_UP,                           vec![c, 2 * f], Normal { std },            true),
                ("mlp.down_proj.weight",            vec![f, c],     Normal { std: resid_std }, true),
            ]);
            (format!("layers.{l}"), format!("layers.{l}."), rows)
        }
        UnitKind::FinalNorm => {
            let mut rows = vec![("norm.weight", vec![c], Ones, false)];
            if !cfg.tie_embeddings {
                rows.push(("lm_head.weight", vec![v, c], Normal { std }, true));
            }
            ("norm".into(), String::new(), rows)
        }
    };
    table
}

/// What a manifest records beyond the common sizes, under the family's name. A rope without
/// scaling, the usual head width and no window record nothing, as Llama manifests before them
/// did.
#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    /// The block's parameters are the packed table's ([`QKV`], [`GATE_UP`]); absent in the
    /// manifests of trainers before it, whose q, k, v, gate and up were a matrix each
    /// ([`LlamaStyle::repack_legacy`]).
    #[serde(default)]
    packed: bool,
    n_kv_head: usize,
    ffn_hidden: usize,
    norm_eps: f64,
    rope_theta: f64,
    #[serde(default, skip_serializing_if = "is_default")]
    rope_scaling: RopeScaling,
    tie_embeddings: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    head_dim: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sliding_window: Option<usize>,
}

/// Each packed parameter and the Hugging Face tensors its column blocks are, in order, with
/// their widths.
fn packed_parts(cfg: &ModelConfig) -> [(&'static str, Vec<(&'static str, usize)>); 3] {
    let (q, kv, f) = (
        cfg.n_head * cfg.head_dim,
        cfg.n_kv_head * cfg.head_dim,
        cfg.ffn_hidden,
    );
    [
        (
            QKV,
            vec![
                ("self_attn.q_proj.weight", q),
                ("self_attn.k_proj.weight", kv),
                ("self_attn.v_proj.weight", kv),
            ],
        ),
        (
            QKV_BIAS,
            vec![
                ("self_attn.q_proj.bias", q),
                ("self_attn.k_proj.bias", kv),
                ("self_attn.v_proj.bias", kv),
            ],
        ),
        (
            GATE_UP,
            vec![("mlp.gate_proj.weight", f), ("mlp.up_proj.weight", f)],
        ),
    ]
}

/// `data`, the matrices `(R, w_0)`, `(R, w_1)`, ... one after another, rewritten in place as
/// their columns side by side: one `(R, sum w_i)` matrix (a 1-D `data` is one row).
fn pack_columns(data: &mut [f32], widths: &[usize]) {
    let total: usize = widths.iter().sum();
    if total == 0 {
        return;
    }
    let rows = data.len() / total;
    let old = data.to_vec();
    let (mut from, mut col) = (0, 0);
    for &w in widths {
        for r in 0..rows {
            data[r * total + col..r * total + col + w]
                .copy_from_slice(&old[from + r * w..from + (r + 1) * w]);
        }
        (from, col) = (from + rows * w, col + w);
    }
}

fn is_default(s: &RopeScaling) -> bool {
    *s == RopeScaling::Default
}

impl Family for LlamaStyle {
    fn name(&self) -> &'static str {
        self.name
    }

    fn presets(&self) -> Vec<(&'static str, ModelConfig)> {
        (self.presets)()
    }

    fn hf_class(&self) -> &'static str {
        self.hf_class
    }

    /// Unset, the key/value heads are the query heads, a head is `n_embd / n_head` wide and
    /// the head is tied; the MLP's width has no default.
    fn config(&self, s: &Sizes) -> Result<ModelConfig> {
        let ffn = s.ffn_hidden.ok_or(ModelError::Required {
            field: "ffn_hidden",
        })?;
        if s.head_dim.is_none() && s.n_head > 0 && !s.n_embd.is_multiple_of(s.n_head) {
            return Err(ModelError::HeadsDoNotDivide {
                n_embd: s.n_embd,
                n_head: s.n_head,
            });
        }
        let family = crate::family(self.name).ok_or(ModelError::Shape {
            field: "arch",
            reason: format!("{} is not registered", self.name),
        })?;
        Ok(ModelConfig {
            arch: Arch::of(family),
            n_layer: s.n_layer,
            n_embd: s.n_embd,
            n_head: s.n_head,
            n_kv_head: s.n_kv_head.unwrap_or(s.n_head),
            head_dim: s.head_dim.unwrap_or(s.n_embd / s.n_head.max(1)),
            ffn_hidden: ffn,
            seq_len: s.seq_len,
            vocab_size: s.vocab_size,
            norm_eps: self.norm_eps,
            rope_theta: self.rope_theta,
            rope_scaling: RopeScaling::Default,
            tie_embeddings: s.tie_embeddings.unwrap_or(true),
            qkv_bias: self.qkv_bias,
            qk_norm: self.qk_norm,
            sliding_window: None,
        })
    }

    /// Rotary positions rotate pairs of a head's channels, and turn by a base above 1; the
    /// block's additions are the family's, and only Mistral has a window.
    fn validate(&self, cfg: &ModelConfig) -> Result<()> {
        if !cfg.head_dim.is_multiple_of(2) {
            return Err(ModelError::OddHeadDim {
                head_dim: cfg.head_dim,
            });
        }
        let bad = |field: &'static str, reason: String| Err(ModelError::Shape { field, reason });
        if !(cfg.rope_theta > 1.0 && cfg.rope_theta.is_finite()) {
            return bad(
                "rope_theta",
                format!("{} is not a base above 1", cfg.rope_theta),
            );
        }
        if let Some(reason) = cfg.rope_scaling.problem() {
            return bad("rope_scaling", reason);
        }
        if (cfg.qkv_bias, cfg.qk_norm) != (self.qkv_bias, self.qk_norm) {
            return bad(
                "arch",
                format!(
                    "a {} block has{} q/k/v biases and{} q/k norms",
                    self.name,
                    if self.qkv_bias { "" } else { " no" },
                    if self.qk_norm { "" } else { " no" }
                ),
            );
        }
        if cfg.sliding_window.is_some() && self.window != Window::Mistral {
            return bad(
                "sliding_window",
                format!("a {} has no sliding window", self.name),
            );
        }
        Ok(())
    }

    /// `V*C (x2 untied) + L*(2*C*NH*hs + 2*C*KV*hs + 3*C*F + 2*C [+ (NH + 2 KV) hs] [+ 2 hs])
    /// + C`.
    fn num_params(&self, cfg: &ModelConfig) -> usize {
        let (l, c, v, f, hs) = (
            cfg.n_layer,
            cfg.n_embd,
            cfg.vocab_size,
            cfg.ffn_hidden,
            cfg.head_dim,
        );
        let (q, kv) = (cfg.n_head * hs, cfg.n_kv_head * hs);
        let head = if cfg.tie_embeddings { 0 } else { v * c };
        let bias = if cfg.qkv_bias { q + 2 * kv } else { 0 };
        let norms = if cfg.qk_norm { 2 * hs } else { 0 };
        v * c + head + l * (2 * c * q + 2 * c * kv + 3 * c * f + 2 * c + bias + norms) + c
    }

    /// What its block saves: the inputs of the two norms and their outputs, the residual, q,
    /// k, v, the attention output, the MLP's gate, up and product, `s b (4 C + 2 NH hs + 2 KV
    /// hs + 3 F)` (and q and k again before their norms, with qk-norm), plus the attention's
    /// row statistics. Under FP8 the two norms' outputs (`2 C`) are kept as the codes of
    /// their transposes: a byte an element and an f32 scale a 128 x 128 tile; of the product
    /// (`F`) its columns' absmax alone.
    fn block_activation_bytes(
        &self,
        cfg: &ModelConfig,
        batch: usize,
        seq_len: usize,
        bytes: usize,
        linears: LinearFormat,
    ) -> u64 {
        let (b, s, h, a) = (
            batch as u64,
            seq_len as u64,
            cfg.n_embd as u64,
            cfg.n_head as u64,
        );
        let q = (cfg.n_head * cfg.head_dim) as u64;
        let kv = (cfg.n_kv_head * cfg.head_dim) as u64;
        let f = cfg.ffn_hidden as u64;
        let normed = if cfg.qk_norm { q + kv } else { 0 };
        let stats = 4 * b * a * s;
        let all = 4 * h + 2 * q + 2 * kv + 3 * f + normed;
        match linears {
            LinearFormat::Dense => b * s * all * bytes as u64 + stats,
            LinearFormat::Fp8 => {
                let inputs = self.block_linear_inputs(cfg);
                let width = |keep: fn(&Fp8Kept) -> bool| -> u64 {
                    let w: usize = inputs
                        .iter()
                        .filter(|i| keep(&i.fp8))
                        .map(|i| i.width)
                        .sum();
                    w as u64
                };
                let codes = width(|k| *k == Fp8Kept::Codes);
                let absmax = width(|k| matches!(k, Fp8Kept::ColumnAbsmax { .. }));
                let kept = b * s * ((all - codes - absmax) * bytes as u64 + codes * 4097 / 4096);
                kept + stats + 4 * absmax
            }
        }
    }

    /// The residual after attention and gate|up's output: `C + 2F`.
    fn mlp_kept_width(&self, cfg: &ModelConfig) -> Option<usize> {
        Some(cfg.n_embd + 2 * cfg.ffn_hidden)
    }

    /// q|k|v's weights (and Qwen2's biases): `C (NH + 2 KV) hs [+ (NH + 2 KV) hs]`.
    fn attention_half_params(&self, cfg: &ModelConfig) -> Option<usize> {
        let qkv = (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim;
        Some(cfg.n_embd * qkv + if cfg.qkv_bias { qkv } else { 0 })
    }

    /// q|k|v's and gate|up's `C` (each packed projection reads one input), kept as FP8 codes
    /// under FP8 (`block_forward`); o's `NH hs`, attention's output, which attention's backward
    /// reads too, kept as itself; down's `F`, SwiGLU's output, kept as its columns' absmax
    /// (SwiGLU's backward kernel encodes it again for down's weight gradient, whose `dout` is
    /// `C` wide).
    fn block_linear_inputs(&self, cfg: &ModelConfig) -> Vec<LinearInput> {
        let c = cfg.n_embd;
        let input = |width, fp8| LinearInput { width, fp8 };
        vec![
            input(c, Fp8Kept::Codes),
            input(cfg.n_head * cfg.head_dim, Fp8Kept::Input),
            input(c, Fp8Kept::Codes),
            input(cfg.ffn_hidden, Fp8Kept::ColumnAbsmax { dout_width: c }),
        ]
    }

    /// Attention counted at its real width: `6 N + 6 L NH hs T`.
    fn flops_per_token(&self, cfg: &ModelConfig, seq_len: usize) -> f64 {
        let attn = cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len;
        6.0 * cfg.num_params() as f64 + 6.0 * attn as f64
    }

    fn trajectory(&self, cfg: &ModelConfig) -> Vec<(&'static str, String)> {
        let mut keys = vec![
            ("model.arch", self.name().to_string()),
            ("model.n_kv_head", cfg.n_kv_head.to_string()),
            ("model.ffn_hidden", cfg.ffn_hidden.to_string()),
            ("model.norm_eps", cfg.norm_eps.to_string()),
            ("model.rope_theta", cfg.rope_theta.to_string()),
            ("model.tie_embeddings", cfg.tie_embeddings.to_string()),
        ];
        // Recorded only when set, so that checkpoints from before these settings compare equal.
        if cfg.rope_scaling != RopeScaling::Default {
            keys.push(("model.rope_scaling", cfg.rope_scaling.to_string()));
        }
        if cfg.head_dim * cfg.n_head != cfg.n_embd {
            keys.push(("model.head_dim", cfg.head_dim.to_string()));
        }
        keys
    }

    fn record(&self, cfg: &ModelConfig) -> Option<serde_json::Value> {
        serde_json::to_value(Record {
            packed: true,
            n_kv_head: cfg.n_kv_head,
            ffn_hidden: cfg.ffn_hidden,
            norm_eps: cfg.norm_eps,
            rope_theta: cfg.rope_theta,
            rope_scaling: cfg.rope_scaling,
            tie_embeddings: cfg.tie_embeddings,
            head_dim: (cfg.head_dim * cfg.n_head != cfg.n_embd).then_some(cfg.head_dim),
            sliding_window: cfg.sliding_window,
        })
        .ok()
    }

    fn from_record(&self, sizes: &Sizes, own: Option<&serde_json::Value>) -> Result<ModelConfig> {
        let bad = |reason: String| ModelError::Shape {
            field: "arch",
            reason,
        };
        let own = own.ok_or_else(|| bad(format!("a {} shape without its record", self.name)))?;
        let r: Record = serde_json::from_value(own.clone())
            .map_err(|e| bad(format!("the {:?} record: {e}", self.name)))?;
        let sizes = Sizes {
            n_kv_head: Some(r.n_kv_head),
            ffn_hidden: Some(r.ffn_hidden),
            tie_embeddings: Some(r.tie_embeddings),
            head_dim: r.head_dim,
            ..sizes.clone()
        };
        Ok(ModelConfig {
            norm_eps: r.norm_eps,
            rope_theta: r.rope_theta,
            rope_scaling: r.rope_scaling,
            sliding_window: r.sliding_window,
            ..self.config(&sizes)?
        })
    }

    /// A manifest without `packed` ([`Record`]).
    fn legacy_record(&self, own: Option<&serde_json::Value>) -> bool {
        own.is_some_and(|r| r.get("packed") != Some(&serde_json::Value::Bool(true)))
    }

    /// A block's q, k and v (their biases too) and gate and up were consecutive matrices
    /// `(C, OUT_i)`; they become the packed ones' column blocks. Every other parameter, and
    /// each packed one's range of the buffer, is where it was.
    fn repack_legacy(&self, cfg: &ModelConfig, unit: &UnitLayout, data: &mut [f32]) {
        if !matches!(unit.kind, UnitKind::Block(_)) {
            return;
        }
        for (name, parts) in packed_parts(cfg) {
            if let Some(p) = unit.try_param(name) {
                let widths: Vec<usize> = parts.iter().map(|(_, w)| *w).collect();
                pack_columns(&mut data[p.offset..p.offset + p.numel], &widths);
            }
        }
    }

    /// `model.` + our name (`lm_head.weight` as it is); nn.Linear weights are `(out, in)` in
    /// HF, the embedding and the LM head `(V, C)` in both, biases and norms 1-D in both. The
    /// packed projections are HF's q, k and v (weights and biases), gate and up: one tensor
    /// for each block of their columns.
    fn hf_tensors(&self, cfg: &ModelConfig, p: &ParamSpec) -> Vec<HfTensor> {
        let whole = HfTensor {
            name: match p.name.starts_with("lm_head.") {
                true => p.name.clone(),
                false => format!("model.{}", p.name),
            },
            alias: None,
            transpose: p.shape.len() == 2
                && !p.name.starts_with("embed_tokens.")
                && !p.name.starts_with("lm_head."),
            vocab_rows: ["embed_tokens.weight", "lm_head.weight"].contains(&p.name.as_str()),
            columns: 0..p.shape.last().copied().unwrap_or(0),
        };
        let packed = packed_parts(cfg)
            .into_iter()
            .find_map(|(name, parts)| p.name.strip_suffix(name).map(|prefix| (prefix, parts)));
        let Some((prefix, parts)) = packed else {
            return vec![whole];
        };
        let mut start = 0;
        parts
            .into_iter()
            .map(|(part, width)| {
                let columns = start..start + width;
                start += width;
                HfTensor {
                    name: format!("model.{prefix}{part}"),
                    columns,
                    ..whole.clone()
                }
            })
            .collect()
    }

    /// The rotary table older transformers saved, and a tied head saved anyway (some exports
    /// write it): it is the embedding.
    fn hf_buffer(&self, name: &str, cfg: &ModelConfig) -> bool {
        name.ends_with("rotary_emb.inv_freq") || (name == "lm_head.weight" && cfg.tie_embeddings)
    }

    /// Every key the four classes read; each ignores those it does not have (Qwen2 always has
    /// q/k/v biases and reads no `attention_bias`): [`LlamaStyle::write_hf_config`].
    fn hf_config(&self, cfg: &ModelConfig, eod: Option<u32>) -> serde_json::Value {
        self.write_hf_config(cfg, eod)
    }

    /// [`LlamaStyle::read_hf_config`].
    fn from_hf_config(&self, j: &serde_json::Value) -> std::result::Result<ModelConfig, String> {
        self.read_hf_config(j)
    }

    /// [`LlamaStyle::check_against_hf_config`].
    fn check_hf_config(
        &self,
        j: &serde_json::Value,
        cfg: &ModelConfig,
    ) -> std::result::Result<(), String> {
        self.check_against_hf_config(j, cfg)
    }

    fn rows(&self, cfg: &ModelConfig, kind: UnitKind) -> UnitTable {
        rows(cfg, kind)
    }

    fn embedding_forward(
        &self,
        cfg: &ModelConfig,
        params: &Tensor,
        tokens: &Tensor,
    ) -> Result<Tensor> {
        super::embedding_forward(cfg, params, tokens)
    }

    fn embedding_backward(
        &self,
        cfg: &ModelConfig,
        tokens: &TokenIndex,
        dout: &Tensor,
        onto: Option<Tensor>,
    ) -> Result<Tensor> {
        super::embedding_backward(cfg, tokens, dout, onto)
    }

    fn block_forward(
        &self,
        cfg: &ModelConfig,
        lin: LinearFormat,
        params: &UnitParams,
        x: &Tensor,
        recompute: Recompute,
    ) -> Result<(Tensor, Saved)> {
        let (y, s) = super::block_forward(cfg, lin, params, x, recompute)?;
        Ok((y, Saved::new(s)))
    }

    fn block_backward(
        &self,
        cfg: &ModelConfig,
        lin: LinearFormat,
        params: &UnitParams,
        saved: &Saved,
        dout: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        super::block_backward(cfg, lin, params, saved.get(self.name())?, dout)
    }

    fn final_norm_forward(
        &self,
        cfg: &ModelConfig,
        params: &Tensor,
        x: &Tensor,
    ) -> Result<(Tensor, Saved)> {
        let (y, s) = super::final_norm_forward(cfg, params, x)?;
        Ok((y, Saved::new(s)))
    }

    fn final_norm_backward(
        &self,
        cfg: &ModelConfig,
        params: &Tensor,
        saved: &Saved,
        dout: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        super::final_norm_backward(cfg, params, saved.get(self.name())?, dout)
    }

    fn head_loss(
        &self,
        cfg: &ModelConfig,
        head_params: &Tensor,
        x: &Tensor,
        targets: &Tensor,
        grad: bool,
    ) -> Result<(Loss, Option<(Tensor, Tensor)>)> {
        super::head_loss(cfg, head_params, x, targets, grad)
    }

    /// The tables of every position `0..seq_len`, of `rope_theta` and `rope_scaling`.
    fn rope(&self, cfg: &ModelConfig, dtype: DType, device: &Device) -> Result<Option<RopeTables>> {
        let (t, hs) = (cfg.seq_len, cfg.head_dim);
        let tables = rope_tables(t, hs, cfg.rope_theta, &cfg.rope_scaling, dtype, device)?;
        Ok(Some(tables))
    }

    /// The embedding has no positions: the training forward serves.
    fn embedding_decode(
        &self,
        cfg: &ModelConfig,
        params: &Tensor,
        tokens: &Tensor,
        _: usize,
    ) -> Result<Tensor> {
        super::embedding_forward(cfg, params, tokens)
    }

    fn block_decode(
        &self,
        cfg: &ModelConfig,
        params: &Tensor,
        x: &Tensor,
        cache: &mut LayerCache,
        rope: Option<&RopeTables>,
    ) -> Result<Tensor> {
        let rope = rope.ok_or(ModelError::DecodeMismatch {
            what: "rotary tables",
            reason: "a Llama block decodes with the tables of Family::rope".into(),
        })?;
        super::block_decode(cfg, params, x, cache, rope)
    }

    /// The final norm, then the head: the embedding's matrix when tied, else `lm_head`.
    fn logits_decode(&self, cfg: &ModelConfig, units: &[Tensor], x: &Tensor) -> Result<Tensor> {
        let last = units.len() - 1;
        let head = if cfg.tie_embeddings { 0 } else { last };
        super::logits_decode(cfg, &units[last], &units[head], x)
    }
}
