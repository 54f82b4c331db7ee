//! The Llama family in the registry ([`crate::family`]): `LlamaForCausalLM`, with its
//! grouped-query heads, MLP width, norm epsilon, rotary base and tied or untied head recorded
//! and checked, and its rope read from config.json as transformers 4 and 5 write it.

use candle_core::{DType, Device, Tensor};

use super::rope_config::Rope;
use crate::config::{Arch, ModelConfig};
use crate::decode::LayerCache;
use crate::error::{ModelError, Result};
use crate::family::{Family, HfTensor, Sizes};
use crate::layers::{rope_tables, Loss, RopeScaling, RopeTables, TokenIndex};
use crate::layout::{init_stds, ParamInit, ParamSpec, UnitKind, UnitTable};
use crate::schedule::Saved;

/// The Llama family (Llama 2 and 3).
pub struct Llama;

/// Llama 3's RMSNorm epsilon and rotary base.
pub const LLAMA_NORM_EPS: f64 = 1e-5;
pub const LLAMA_ROPE_THETA: f64 = 500_000.0;

/// Llama 3's 128,256-token vocabulary (already a multiple of 128): the Llama presets' size,
/// which a run replaces with its tokenizer's, padded to a multiple of 128.
pub const LLAMA3_VOCAB: usize = 128_256;

impl ModelConfig {
    /// A Llama shape with Llama 3's epsilon and rotary base.
    #[allow(clippy::too_many_arguments)]
    pub fn llama(
        n_layer: usize,
        n_embd: usize,
        n_head: usize,
        n_kv_head: usize,
        ffn_hidden: usize,
        seq_len: usize,
        vocab_size: usize,
        tie_embeddings: bool,
    ) -> Self {
        ModelConfig {
            arch: Arch::of(&Llama),
            n_layer,
            n_embd,
            n_head,
            n_kv_head,
            ffn_hidden,
            seq_len,
            vocab_size,
            norm_eps: LLAMA_NORM_EPS,
            rope_theta: LLAMA_ROPE_THETA,
            rope_scaling: RopeScaling::Default,
            tie_embeddings,
        }
    }
}

/// The Llama tables. Names follow HF `LlamaForCausalLM` without the `model.` prefix; linear
/// weights are stored `(in, out)` as GPT-2's are (export transposes them to HF's `(out, in)`),
/// the embedding and LM head `(V, C)`. Untied, `lm_head.weight` lives in the final norm's
/// unit: the head reads that unit.
pub(crate) fn rows(cfg: &ModelConfig, kind: UnitKind) -> UnitTable {
    let (c, v, f) = (cfg.n_embd, cfg.vocab_size, cfg.ffn_hidden);
    let kv = cfg.n_kv_head * cfg.head_dim();
    let (std, resid_std) = init_stds(cfg);
    use ParamInit::{Normal, Ones};
    #[rustfmt::skip]
    let table = match kind {
        UnitKind::Embedding => ("embedding".into(), String::new(), vec![
            ("embed_tokens.weight", vec![v, c], Normal { std }, true),
        ]),
        UnitKind::Block(l) => (format!("layers.{l}"), format!("layers.{l}."), vec![
            ("input_layernorm.weight",          vec![c],     Ones,                      false),
            ("self_attn.q_proj.weight",         vec![c, c],  Normal { std },            true),
            ("self_attn.k_proj.weight",         vec![c, kv], Normal { std },            true),
            ("self_attn.v_proj.weight",         vec![c, kv], Normal { std },            true),
            ("self_attn.o_proj.weight",         vec![c, c],  Normal { std: resid_std }, true),
            ("post_attention_layernorm.weight", vec![c],     Ones,                      false),
            ("mlp.gate_proj.weight",            vec![c, f],  Normal { std },            true),
            ("mlp.up_proj.weight",              vec![c, f],  Normal { std },            true),
            ("mlp.down_proj.weight",            vec![f, c],  Normal { std: resid_std }, true),
        ]),
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

/// What a Llama manifest records beyond the common sizes, under `"llama"`. A rope without
/// scaling records none, as manifests before scaling did.
#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    n_kv_head: usize,
    ffn_hidden: usize,
    norm_eps: f64,
    rope_theta: f64,
    #[serde(default, skip_serializing_if = "is_default")]
    rope_scaling: RopeScaling,
    tie_embeddings: bool,
}

fn is_default(s: &RopeScaling) -> bool {
    *s == RopeScaling::Default
}

/// Llama 3.1's rope scaling (8B, 70B, 405B): factor 8, low and high frequency factors 1 and 4,
/// from Llama 3's context of 8192.
pub const LLAMA3_1_SCALING: RopeScaling = RopeScaling::Llama3 {
    factor: 8.0,
    low_freq_factor: 1.0,
    high_freq_factor: 4.0,
    original_max_position_embeddings: 8192,
};

/// Llama 3.2's (1B, 3B): factor 32, otherwise as 3.1's.
pub const LLAMA3_2_SCALING: RopeScaling = RopeScaling::Llama3 {
    factor: 32.0,
    low_freq_factor: 1.0,
    high_freq_factor: 4.0,
    original_max_position_embeddings: 8192,
};

impl Family for Llama {
    fn name(&self) -> &'static str {
        "llama"
    }

    /// The published shapes (`vocab_size` 128,256 until the tokenizer sets it; rope_theta
    /// 500,000, RMSNorm eps 1e-5; seq_len 2048, the length of the PyTorch anchor), with their
    /// published rope scaling (3.1: [`LLAMA3_1_SCALING`], factor 8; 3.2:
    /// [`LLAMA3_2_SCALING`], factor 32; Llama 3: none), and ours for tests and the CPU demo,
    /// `llama-tiny` (seq_len 64):
    ///
    /// | name           | n_layer | n_embd | n_head | n_kv_head | ffn_hidden | tied | scaling | num_params     |
    /// |----------------|--------:|-------:|-------:|----------:|-----------:|:----:|--------:|---------------:|
    /// | `llama-tiny`   |       2 |     64 |      4 |         2 |        192 | yes  |         |  (vocab) 8,395,840 |
    /// | `llama3.2-1b`  |      16 |   2048 |     32 |         8 |       8192 | yes  |      32 |  1,235,814,400 |
    /// | `llama3.2-3b`  |      28 |   3072 |     24 |         8 |       8192 | yes  |      32 |  3,212,749,824 |
    /// | `llama3-8b`    |      32 |   4096 |     32 |         8 |      14336 | no   |         |  8,030,261,248 |
    /// | `llama3.1-8b`  |      32 |   4096 |     32 |         8 |      14336 | no   |       8 |  8,030,261,248 |
    /// | `llama3-70b`   |      80 |   8192 |     64 |         8 |      28672 | no   |         | 70,553,706,496 |
    /// | `llama3.1-70b` |      80 |   8192 |     64 |         8 |      28672 | no   |       8 | 70,553,706,496 |
    fn presets(&self) -> Vec<(&'static str, ModelConfig)> {
        let llama =
            |l, c, h, kv, f, t, tied| ModelConfig::llama(l, c, h, kv, f, t, LLAMA3_VOCAB, tied);
        let scaled = |scaling, cfg: ModelConfig| ModelConfig {
            rope_scaling: scaling,
            ..cfg
        };
        vec![
            ("llama-tiny", llama(2, 64, 4, 2, 192, 64, true)),
            (
                "llama3.2-1b",
                scaled(LLAMA3_2_SCALING, llama(16, 2048, 32, 8, 8192, 2048, true)),
            ),
            (
                "llama3.2-3b",
                scaled(LLAMA3_2_SCALING, llama(28, 3072, 24, 8, 8192, 2048, true)),
            ),
            ("llama3-8b", llama(32, 4096, 32, 8, 14336, 2048, false)),
            (
                "llama3.1-8b",
                scaled(LLAMA3_1_SCALING, llama(32, 4096, 32, 8, 14336, 2048, false)),
            ),
            ("llama3-70b", llama(80, 8192, 64, 8, 28672, 2048, false)),
            (
                "llama3.1-70b",
                scaled(LLAMA3_1_SCALING, llama(80, 8192, 64, 8, 28672, 2048, false)),
            ),
        ]
    }

    fn hf_class(&self) -> &'static str {
        "LlamaForCausalLM"
    }

    /// Unset, the key/value heads are the query heads and the head is tied; the MLP's width
    /// has no default.
    fn config(&self, s: &Sizes) -> Result<ModelConfig> {
        let ffn = s.ffn_hidden.ok_or(ModelError::Required {
            field: "ffn_hidden",
        })?;
        Ok(ModelConfig::llama(
            s.n_layer,
            s.n_embd,
            s.n_head,
            s.n_kv_head.unwrap_or(s.n_head),
            ffn,
            s.seq_len,
            s.vocab_size,
            s.tie_embeddings.unwrap_or(true),
        ))
    }

    /// Rotary positions rotate pairs of a head's channels, and turn by a base above 1.
    fn validate(&self, cfg: &ModelConfig) -> Result<()> {
        if !cfg.head_dim().is_multiple_of(2) {
            return Err(ModelError::OddHeadDim {
                n_embd: cfg.n_embd,
                n_head: cfg.n_head,
            });
        }
        if !(cfg.rope_theta > 1.0 && cfg.rope_theta.is_finite()) {
            return Err(ModelError::Shape {
                field: "rope_theta",
                reason: format!("{} is not a base above 1", cfg.rope_theta),
            });
        }
        if let Some(reason) = cfg.rope_scaling.problem() {
            return Err(ModelError::Shape {
                field: "rope_scaling",
                reason,
            });
        }
        Ok(())
    }

    /// `V*C (x2 untied) + L*(2*C*C + 2*C*KV*hs + 3*C*F + 2*C) + C`.
    fn num_params(&self, cfg: &ModelConfig) -> usize {
        let (l, c, v, f) = (cfg.n_layer, cfg.n_embd, cfg.vocab_size, cfg.ffn_hidden);
        let kv = cfg.n_kv_head * cfg.head_dim();
        let head = if cfg.tie_embeddings { 0 } else { v * c };
        v * c + head + l * (2 * c * c + 2 * c * kv + 3 * c * f + 2 * c) + c
    }

    /// What its block saves: the inputs of the two norms and their outputs, q, k, v, the
    /// attention output, the MLP's gate, up and product, `s b (6 C + 2 KV hs + 3 F)`, plus the
    /// attention's row statistics.
    fn block_activation_bytes(
        &self,
        cfg: &ModelConfig,
        batch: usize,
        seq_len: usize,
        bytes: usize,
    ) -> u64 {
        let (b, s, h, a) = (
            batch as u64,
            seq_len as u64,
            cfg.n_embd as u64,
            cfg.n_head as u64,
        );
        let kv = (cfg.n_kv_head * cfg.head_dim()) as u64;
        let f = cfg.ffn_hidden as u64;
        b * s * (6 * h + 2 * kv + 3 * f) * bytes as u64 + 4 * b * a * s
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
        // Recorded only when set, so that checkpoints from before scaling compare equal.
        if cfg.rope_scaling != RopeScaling::Default {
            keys.push(("model.rope_scaling", cfg.rope_scaling.to_string()));
        }
        keys
    }

    fn record(&self, cfg: &ModelConfig) -> Option<serde_json::Value> {
        serde_json::to_value(Record {
            n_kv_head: cfg.n_kv_head,
            ffn_hidden: cfg.ffn_hidden,
            norm_eps: cfg.norm_eps,
            rope_theta: cfg.rope_theta,
            rope_scaling: cfg.rope_scaling,
            tie_embeddings: cfg.tie_embeddings,
        })
        .ok()
    }

    fn from_record(&self, sizes: &Sizes, own: Option<&serde_json::Value>) -> Result<ModelConfig> {
        let bad = |reason: String| ModelError::Shape {
            field: "arch",
            reason,
        };
        let own = own.ok_or_else(|| bad("a Llama shape without its \"llama\" record".into()))?;
        let r: Record = serde_json::from_value(own.clone())
            .map_err(|e| bad(format!("the \"llama\" record: {e}")))?;
        let sizes = Sizes {
            n_kv_head: Some(r.n_kv_head),
            ffn_hidden: Some(r.ffn_hidden),
            tie_embeddings: Some(r.tie_embeddings),
            ..sizes.clone()
        };
        Ok(ModelConfig {
            norm_eps: r.norm_eps,
            rope_theta: r.rope_theta,
            rope_scaling: r.rope_scaling,
            ..self.config(&sizes)?
        })
    }

    /// `model.` + our name (`lm_head.weight` as it is); nn.Linear weights are `(out, in)` in
    /// HF, the embedding and the LM head `(V, C)` in both.
    fn hf_tensor(&self, p: &ParamSpec) -> HfTensor {
        HfTensor {
            name: match p.name.starts_with("lm_head.") {
                true => p.name.clone(),
                false => format!("model.{}", p.name),
            },
            alias: None,
            transpose: p.shape.len() == 2
                && !p.name.starts_with("embed_tokens.")
                && !p.name.starts_with("lm_head."),
            vocab_rows: ["embed_tokens.weight", "lm_head.weight"].contains(&p.name.as_str()),
        }
    }

    /// The rotary table older transformers saved, and a tied head saved anyway (some exports
    /// write it): it is the embedding.
    fn hf_buffer(&self, name: &str, cfg: &ModelConfig) -> bool {
        name.ends_with("rotary_emb.inv_freq") || (name == "lm_head.weight" && cfg.tie_embeddings)
    }

    fn hf_config(&self, cfg: &ModelConfig, eod: Option<u32>) -> serde_json::Value {
        serde_json::json!({
            "architectures": [self.hf_class()],
            "model_type": self.name(),
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.n_embd,
            "intermediate_size": cfg.ffn_hidden,
            "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.n_kv_head,
            "head_dim": cfg.head_dim(),
            "hidden_act": "silu",
            "max_position_embeddings": cfg.seq_len,
            "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta,
            // transformers 4's spelling, which 5 reads too.
            "rope_scaling": match cfg.rope_scaling {
                RopeScaling::Default => serde_json::Value::Null,
                s => serde_json::to_value(s).unwrap_or_default(),
            },
            "attention_bias": false,
            "mlp_bias": false,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "tie_word_embeddings": cfg.tie_embeddings,
            "bos_token_id": eod,
            "eos_token_id": eod,
            "torch_dtype": "float32"
        })
    }

    /// The rope's theta (either spelling, [`Rope::of`]), `rms_norm_eps` and
    /// `tie_word_embeddings` against the run's.
    fn check_hf_config(
        &self,
        j: &serde_json::Value,
        cfg: &ModelConfig,
    ) -> std::result::Result<(), String> {
        let rope = Rope::of(j)?;
        let close = |key: &str, theirs: f64, ours: f64, ours_key: &str| match (theirs - ours).abs()
            > 1e-9 * ours.abs().max(1.0)
        {
            true => Err(format!(
                "has {key} = {theirs}, this run {ours_key} = {ours}: set {ours_key} = {theirs}"
            )),
            false => Ok(()),
        };
        close(
            rope.theta_key,
            rope.theta,
            cfg.rope_theta,
            "model.rope_theta",
        )?;
        if rope.scaling != cfg.rope_scaling {
            return Err(format!(
                "has {} = {}, this run model.rope_scaling = {}: set model.rope_scaling = {}",
                rope.scaling_key, rope.scaling, cfg.rope_scaling, rope.scaling
            ));
        }
        // transformers' Llama default.
        let eps = j["rms_norm_eps"].as_f64().unwrap_or(1e-6);
        close("rms_norm_eps", eps, cfg.norm_eps, "model.norm_eps")?;
        let tied = j["tie_word_embeddings"].as_bool().unwrap_or(false);
        if tied != cfg.tie_embeddings {
            return Err(format!(
                "has tie_word_embeddings = {tied}, this run model.tie_embeddings = {}",
                cfg.tie_embeddings
            ));
        }
        Ok(())
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
    ) -> Result<Tensor> {
        super::embedding_backward(cfg, tokens, dout)
    }

    fn block_forward(
        &self,
        cfg: &ModelConfig,
        params: &Tensor,
        x: &Tensor,
        recompute: bool,
    ) -> Result<(Tensor, Saved)> {
        let (y, s) = super::block_forward(cfg, params, x, recompute)?;
        Ok((y, Saved::new(s)))
    }

    fn block_backward(
        &self,
        cfg: &ModelConfig,
        params: &Tensor,
        saved: &Saved,
        dout: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        super::block_backward(cfg, params, saved.get(self.name())?, dout)
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
        let (t, hs) = (cfg.seq_len, cfg.head_dim());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_near_nominal_size() {
        crate::config::tests::check_presets(
            &Llama,
            &[
                ("llama-tiny", 8.4e6),
                ("llama3.2-1b", 1.24e9),
                ("llama3.2-3b", 3.21e9),
                ("llama3-8b", 8.03e9),
                ("llama3.1-8b", 8.03e9),
                ("llama3-70b", 70.55e9),
                ("llama3.1-70b", 70.55e9),
            ],
        );
    }
}
