//! GPT-2 in the registry ([`crate::family`]): `GPT2LMHeadModel`, whose shape is its sizes
//! alone (the MLP, the heads and the tied head are fixed).

use crate::config::{Arch, ModelConfig};
use crate::error::Result;
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
