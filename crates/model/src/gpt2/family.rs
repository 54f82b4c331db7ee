//! GPT-2 in the registry ([`crate::family`]): `GPT2LMHeadModel`, whose shape is its sizes
//! alone (the MLP, the heads and the tied head are fixed).

use crate::config::{Arch, ModelConfig};
use crate::error::{ModelError, Result};
use crate::family::{Family, HfTensor, Sizes};
use crate::layout::ParamSpec;

/// The GPT-2 family.
pub struct Gpt2;

impl Family for Gpt2 {
    fn arch(&self) -> Arch {
        Arch::Gpt2
    }

    fn name(&self) -> &'static str {
        "gpt2"
    }

    fn hf_class(&self) -> &'static str {
        "GPT2LMHeadModel"
    }

    /// GPT-2 fixes `n_kv_head`, `ffn_hidden` and the tied head: `sizes`' are not read (a
    /// config that sets them is checked by [`ModelConfig::validate`], not ignored).
    fn config(&self, s: &Sizes) -> Result<ModelConfig> {
        Ok(ModelConfig::gpt2(
            s.n_layer,
            s.n_embd,
            s.n_head,
            s.seq_len,
            s.vocab_size,
        ))
    }

    /// GPT-2 fixes its heads, MLP and head: a config that sets them otherwise is refused.
    fn validate(&self, cfg: &ModelConfig) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(ModelError::Shape { field, reason });
        if cfg.n_kv_head != cfg.n_head {
            return bad(
                "n_kv_head",
                "GPT-2 has no grouped-query attention: leave it unset".into(),
            );
        }
        if cfg.ffn_hidden != 4 * cfg.n_embd {
            return bad(
                "ffn_hidden",
                format!("GPT-2's MLP is 4 x n_embd = {}", 4 * cfg.n_embd),
            );
        }
        if !cfg.tie_embeddings {
            return bad(
                "tie_embeddings",
                "GPT-2's LM head is the token embedding".into(),
            );
        }
        Ok(())
    }

    /// `V*C + T*C + L*(12*C^2 + 13*C) + 2*C`.
    fn num_params(&self, cfg: &ModelConfig) -> usize {
        let (l, c, v) = (cfg.n_layer, cfg.n_embd, cfg.vocab_size);
        v * c + cfg.seq_len * c + l * (12 * c * c + 13 * c) + 2 * c
    }

    /// Korthikanti et al. 2022: `s b h (34 + 5 a s / h)` at 16 bits.
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
        b * s * (34 * h + 5 * a * s) * bytes as u64 / 2
    }

    /// None beyond the common sizes, as trainers before the Llama family recorded.
    fn trajectory(&self, _: &ModelConfig) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// Nothing: a GPT-2 manifest holds the common sizes alone, as before the registry.
    fn record(&self, _: &ModelConfig) -> Option<serde_json::Value> {
        None
    }

    fn from_record(&self, sizes: &Sizes, _: Option<&serde_json::Value>) -> Result<ModelConfig> {
        self.config(sizes)
    }

    /// `transformer.` + our name (checkpoints on the hub often leave the prefix out); Conv1D
    /// weights are stored `(in, out)`, as ours.
    fn hf_tensor(&self, p: &ParamSpec) -> HfTensor {
        HfTensor {
            name: format!("transformer.{}", p.name),
            alias: Some(p.name.clone()),
            transpose: false,
            vocab_rows: p.name == "wte.weight",
        }
    }

    /// The attention's causal mask, which older transformers saved with the weights.
    fn hf_buffer(&self, name: &str, _: &ModelConfig) -> bool {
        name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")
    }

    fn hf_config(&self, cfg: &ModelConfig, eod: Option<u32>) -> serde_json::Value {
        serde_json::json!({
            "architectures": [self.hf_class()],
            "model_type": self.name(),
            "vocab_size": cfg.vocab_size,
            "n_positions": cfg.seq_len,
            "n_ctx": cfg.seq_len,
            "n_embd": cfg.n_embd,
            "n_layer": cfg.n_layer,
            "n_head": cfg.n_head,
            "n_inner": null,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": cfg.norm_eps,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "initializer_range": 0.02,
            "tie_word_embeddings": true,
            "bos_token_id": eod.unwrap_or(50256),
            "eos_token_id": eod.unwrap_or(50256),
            "torch_dtype": "float32"
        })
    }

    /// Nothing beyond the tensors' shapes: GPT-2's settings are fixed.
    fn check_hf_config(
        &self,
        _: &serde_json::Value,
        _: &ModelConfig,
    ) -> std::result::Result<(), String> {
        Ok(())
    }
}
