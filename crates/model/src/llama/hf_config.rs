//! A Llama-style family's config.json, as transformers writes and reads it: the export's
//! config ([`LlamaStyle::write_hf_config`]), the shape an import builds from one
//! ([`LlamaStyle::read_hf_config`]) and the check of one against a run's shape
//! ([`LlamaStyle::check_against_hf_config`]), which the family's trait methods call.

use super::rope_config::Rope;
use super::style::{LlamaStyle, Window, HF_SEQ_LEN};
use crate::config::ModelConfig;
use crate::family::{Family, Sizes};
use crate::layers::RopeScaling;

/// transformers' defaults of every Llama-style config when config.json leaves the key out.
const HF_RMS_NORM_EPS: f64 = 1e-6;

/// `j[key]` as a count; `None` when absent or null.
fn count(j: &serde_json::Value, key: &str) -> std::result::Result<Option<usize>, String> {
    match &j[key] {
        serde_json::Value::Null => Ok(None),
        v => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or(format!("has {key} = {v}, not a count")),
    }
}

/// `j[key]` as a count, which must be there.
fn required(j: &serde_json::Value, key: &str) -> std::result::Result<usize, String> {
    count(j, key)?.ok_or(format!("has no {key}"))
}

impl LlamaStyle {
    /// The config.json of the family's class: every key the four classes read; each ignores
    /// those it does not have (Qwen2 always has q/k/v biases and reads no `attention_bias`).
    pub(super) fn write_hf_config(&self, cfg: &ModelConfig, eod: Option<u32>) -> serde_json::Value {
        let mut j = serde_json::json!({
            "architectures": [self.hf_class()],
            "model_type": self.name(),
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.n_embd,
            "intermediate_size": cfg.ffn_hidden,
            "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.n_kv_head,
            "head_dim": cfg.head_dim,
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
        });
        match self.window {
            Window::None => {}
            Window::Mistral => j["sliding_window"] = serde_json::json!(cfg.sliding_window),
            Window::Qwen => {
                j["use_sliding_window"] = false.into();
                j["sliding_window"] = serde_json::Value::Null;
                j["max_window_layers"] = cfg.n_layer.into();
            }
        }
        j
    }

    /// The shape as transformers builds it from `j`, `seq_len` its `max_position_embeddings`
    /// up to [`HF_SEQ_LEN`]; what the block does not implement (another activation, biases
    /// Llama's block does not have, a sliding window under `seq_len`, a rope type) refused.
    pub(super) fn read_hf_config(
        &self,
        j: &serde_json::Value,
    ) -> std::result::Result<ModelConfig, String> {
        let act = j["hidden_act"].as_str().unwrap_or("silu");
        if act != "silu" {
            return Err(format!(
                "has hidden_act = {act:?}; the block's MLP is SwiGLU (\"silu\")"
            ));
        }
        for key in ["mlp_bias", "attention_bias"] {
            if j[key].as_bool() == Some(true) {
                return Err(format!(
                    "sets {key} = true: a {} block has no such biases",
                    self.name
                ));
            }
        }
        let rope = Rope::of(j)?;
        let (n_embd, n_head) = (
            required(j, "hidden_size")?,
            required(j, "num_attention_heads")?,
        );
        if n_head == 0 {
            return Err("has num_attention_heads = 0".into());
        }
        let head_dim = match count(j, "head_dim")? {
            Some(h) => h,
            // Qwen3Config's default; the others' is hidden_size / num_attention_heads.
            None if self.qk_norm => 128,
            None => n_embd / n_head,
        };
        let seq_len = count(j, "max_position_embeddings")?
            .unwrap_or(HF_SEQ_LEN)
            .min(HF_SEQ_LEN);
        let sizes = Sizes {
            n_layer: required(j, "num_hidden_layers")?,
            n_embd,
            n_head,
            seq_len,
            vocab_size: required(j, "vocab_size")?,
            n_kv_head: Some(count(j, "num_key_value_heads")?.unwrap_or(n_head)),
            head_dim: Some(head_dim),
            ffn_hidden: Some(required(j, "intermediate_size")?),
            tie_embeddings: Some(j["tie_word_embeddings"].as_bool().unwrap_or(false)),
        };
        let cfg = ModelConfig {
            norm_eps: j["rms_norm_eps"].as_f64().unwrap_or(HF_RMS_NORM_EPS),
            rope_theta: rope.theta,
            rope_scaling: rope.scaling,
            sliding_window: self.hf_window(j)?,
            ..self.config(&sizes).map_err(|e| e.to_string())?
        };
        Ok(cfg)
    }

    /// The rope's theta and scaling (either spelling, [`Rope::of`]), `rms_norm_eps`, the head
    /// width, the window and `tie_word_embeddings` against the run's.
    pub(super) fn check_against_hf_config(
        &self,
        j: &serde_json::Value,
        cfg: &ModelConfig,
    ) -> std::result::Result<(), String> {
        let theirs = self.read_hf_config(j)?;
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
        close(
            "rms_norm_eps",
            theirs.norm_eps,
            cfg.norm_eps,
            "model.norm_eps",
        )?;
        if theirs.tie_embeddings != cfg.tie_embeddings {
            return Err(format!(
                "has tie_word_embeddings = {}, this run model.tie_embeddings = {}",
                theirs.tie_embeddings, cfg.tie_embeddings
            ));
        }
        let differs = |key: &str, theirs: String, ours: String| match theirs == ours {
            true => Ok(()),
            false => Err(format!(
                "has {key} = {theirs}, this run model.{key} = {ours}"
            )),
        };
        differs(
            "head_dim",
            theirs.head_dim.to_string(),
            cfg.head_dim.to_string(),
        )?;
        let window = |w: Option<usize>| w.map_or("null".into(), |w| w.to_string());
        differs(
            "sliding_window",
            window(theirs.sliding_window),
            window(cfg.sliding_window),
        )?;
        Ok(())
    }

    /// The window config.json sets, as transformers reads it for this family.
    fn hf_window(&self, j: &serde_json::Value) -> std::result::Result<Option<usize>, String> {
        match self.window {
            Window::None => Ok(None),
            Window::Mistral => match j.get("sliding_window") {
                // transformers' MistralConfig default.
                None => Ok(Some(4096)),
                Some(_) => count(j, "sliding_window"),
            },
            Window::Qwen => {
                let layers = j["layer_types"].as_array();
                let sliding = layers.is_some_and(|l| l.iter().any(|t| t == "sliding_attention"));
                if j["use_sliding_window"].as_bool() == Some(true) || sliding {
                    return Err(format!(
                        "sets use_sliding_window (sliding_window = {}), which zeropp's {} does \
                         not implement",
                        j["sliding_window"], self.name
                    ));
                }
                Ok(None)
            }
        }
    }
}
