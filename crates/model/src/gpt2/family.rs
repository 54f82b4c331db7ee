//! GPT-2 in the registry ([`crate::family`]): `GPT2LMHeadModel`, whose shape is its sizes
//! alone (the MLP, the heads and the tied head are fixed); its presets, its parameter tables,
//! and its units ([`crate::gpt2`]) behind [`Family`].

use candle_core::{DType, Device, Tensor};

use crate::config::{Arch, ModelConfig};
use crate::decode::LayerCache;
use crate::error::{ModelError, Result};
use crate::family::{Family, Fp8Kept, HfTensor, LinearInput, Sizes};
use crate::layers::{Loss, RopeScaling, RopeTables, TokenIndex};
use crate::layout::{init_stds, ParamInit, ParamSpec, UnitKind, UnitTable};
use crate::linears::LinearFormat;
use crate::recompute::Recompute;
use crate::schedule::{Saved, UnitParams};

/// The GPT-2 family.
pub struct Gpt2;

/// GPT-2's LayerNorm epsilon.
pub const GPT2_NORM_EPS: f64 = 1e-5;

/// GPT-2's 50257-token vocabulary padded up to a multiple of 128, as Megatron does.
pub const PADDED_GPT2_VOCAB: usize = 50304;

impl ModelConfig {
    /// A GPT-2 shape: `n_kv_head = n_head`, `ffn_hidden = 4 C`, tied head, LayerNorm eps 1e-5.
    pub fn gpt2(
        n_layer: usize,
        n_embd: usize,
        n_head: usize,
        seq_len: usize,
        vocab_size: usize,
    ) -> Self {
        ModelConfig {
            arch: Arch::of(&Gpt2),
            n_layer,
            n_embd,
            n_head,
            n_kv_head: n_head,
            head_dim: n_embd / n_head,
            ffn_hidden: 4 * n_embd,
            seq_len,
            vocab_size,
            norm_eps: GPT2_NORM_EPS,
            // Unread: GPT-2's positions are learned. The value trainers have always recorded.
            rope_theta: 500_000.0,
            rope_scaling: RopeScaling::Default,
            tie_embeddings: true,
            qkv_bias: false,
            qk_norm: false,
            sliding_window: None,
        }
    }
}

/// GPT-2's tables. Names follow HF GPT2 without the `transformer.` prefix; Conv1D weights are
/// stored `(in, out)`.
pub(crate) fn rows(cfg: &ModelConfig, kind: UnitKind) -> UnitTable {
    let (c, v, t) = (cfg.n_embd, cfg.vocab_size, cfg.seq_len);
    let (std, resid_std) = init_stds(cfg);
    use ParamInit::{Normal, Ones, Zeros};
    #[rustfmt::skip]
    let table = match kind {
        UnitKind::Embedding => ("embedding".into(), String::new(), vec![
            ("wte.weight", vec![v, c], Normal { std }, true),
            ("wpe.weight", vec![t, c], Normal { std }, true),
        ]),
        UnitKind::Block(l) => (format!("h.{l}"), format!("h.{l}."), vec![
            ("ln_1.weight",        vec![c],         Ones,                     false),
            ("ln_1.bias",          vec![c],         Zeros,                    false),
            ("attn.c_attn.weight", vec![c, 3 * c],  Normal { std },           true),
            ("attn.c_attn.bias",   vec![3 * c],     Zeros,                    false),
            ("attn.c_proj.weight", vec![c, c],      Normal { std: resid_std }, true),
            ("attn.c_proj.bias",   vec![c],         Zeros,                    false),
            ("ln_2.weight",        vec![c],         Ones,                     false),
            ("ln_2.bias",          vec![c],         Zeros,                    false),
            ("mlp.c_fc.weight",    vec![c, 4 * c],  Normal { std },           true),
            ("mlp.c_fc.bias",      vec![4 * c],     Zeros,                    false),
            ("mlp.c_proj.weight",  vec![4 * c, c],  Normal { std: resid_std }, true),
            ("mlp.c_proj.bias",    vec![c],         Zeros,                    false),
        ]),
        UnitKind::FinalNorm => ("ln_f".into(), String::new(), vec![
            ("ln_f.weight", vec![c], Ones,  false),
            ("ln_f.bias",   vec![c], Zeros, false),
        ]),
    };
    table
}

impl Family for Gpt2 {
    fn name(&self) -> &'static str {
        "gpt2"
    }

    /// `vocab_size` 50304:
    ///
    /// | name      | n_layer | n_embd | n_head | seq_len | num_params      |
    /// |-----------|--------:|-------:|-------:|--------:|----------------:|
    /// | `tiny`    |       2 |     64 |      4 |      64 |       3,323,648 |
    /// | `gpt125m` |      12 |    768 |     12 |    1024 |     124,475,904 |
    /// | `gpt350m` |      24 |   1024 |     16 |    1024 |     354,871,296 |
    /// | `gpt1.3b` |      24 |   2048 |     16 |    1024 |   1,313,722,368 |
    /// | `gpt6.7b` |      32 |   4096 |     32 |    2048 |   6,658,596,864 |
    /// | `gpt18b`  |      40 |   6144 |     32 |    2048 |  18,444,251,136 |
    /// | `gpt49b`  |      60 |   8192 |     64 |    2048 |  48,753,655,808 |
    /// | `gpt91b`  |      72 |  10240 |     80 |    2048 |  91,142,656,000 |
    /// | `gpt138b` |     100 |  10752 |     84 |    2048 | 139,303,492,608 |
    ///
    /// `gpt18b` is the shape published in the ZeRO++ paper. The three largest are our choice:
    /// head_dim 128 and round widths, with the layer count picked so that the total (dominated
    /// by `12*L*C^2`) lands within 1% of the nominal size.
    fn presets(&self) -> Vec<(&'static str, ModelConfig)> {
        let gpt2 = |l, c, h, t| ModelConfig::gpt2(l, c, h, t, PADDED_GPT2_VOCAB);
        vec![
            ("tiny", gpt2(2, 64, 4, 64)),
            ("gpt125m", gpt2(12, 768, 12, 1024)),
            ("gpt350m", gpt2(24, 1024, 16, 1024)),
            ("gpt1.3b", gpt2(24, 2048, 16, 1024)),
            ("gpt6.7b", gpt2(32, 4096, 32, 2048)),
            ("gpt18b", gpt2(40, 6144, 32, 2048)),
            ("gpt49b", gpt2(60, 8192, 64, 2048)),
            ("gpt91b", gpt2(72, 10240, 80, 2048)),
            ("gpt138b", gpt2(100, 10752, 84, 2048)),
        ]
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
        if cfg.head_dim * cfg.n_head != cfg.n_embd {
            return bad(
                "head_dim",
                format!(
                    "GPT-2's heads are n_embd / n_head = {} wide",
                    cfg.n_embd / cfg.n_head
                ),
            );
        }
        if cfg.qkv_bias || cfg.qk_norm || cfg.sliding_window.is_some() {
            return bad(
                "arch",
                "GPT-2 has no q/k norm or sliding window, and biases on every projection".into(),
            );
        }
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
        if cfg.rope_scaling != RopeScaling::Default {
            return bad(
                "rope_scaling",
                "GPT-2's positions are learned, it has no rope to scale".into(),
            );
        }
        Ok(())
    }

    /// `V*C + T*C + L*(12*C^2 + 13*C) + 2*C`.
    fn num_params(&self, cfg: &ModelConfig) -> usize {
        let (l, c, v) = (cfg.n_layer, cfg.n_embd, cfg.vocab_size);
        v * c + cfg.seq_len * c + l * (12 * c * c + 13 * c) + 2 * c
    }

    /// Korthikanti et al. 2022: `s b h (34 + 5 a s / h)` at 16 bits, in every format: an
    /// upper-end estimate (it counts attention scores and dropout masks this model does not
    /// keep) that does not take off what FP8 saves by keeping three inputs as codes.
    fn block_activation_bytes(
        &self,
        cfg: &ModelConfig,
        batch: usize,
        seq_len: usize,
        bytes: usize,
        _: LinearFormat,
    ) -> u64 {
        let (b, s, h, a) = (
            batch as u64,
            seq_len as u64,
            cfg.n_embd as u64,
            cfg.n_head as u64,
        );
        b * s * (34 * h + 5 * a * s) * bytes as u64 / 2
    }

    /// c_attn's, attn.c_proj's and mlp.c_fc's `C`, mlp.c_proj's `4 C`. Under FP8 `ln_1(x)`,
    /// `ln_2(x2)` and `gelu(h)` are kept as column blocks; attn.c_proj's input is attention's
    /// output, which attention's backward reads, so it stays itself.
    fn block_linear_inputs(&self, cfg: &ModelConfig) -> Vec<LinearInput> {
        let c = cfg.n_embd;
        let (codes, input) = (Fp8Kept::Codes, Fp8Kept::Input);
        [(c, codes), (c, input), (c, codes), (4 * c, codes)]
            .into_iter()
            .map(|(width, fp8)| LinearInput { width, fp8 })
            .collect()
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
    fn hf_tensors(&self, _: &ModelConfig, p: &ParamSpec) -> Vec<HfTensor> {
        vec![HfTensor {
            name: format!("transformer.{}", p.name),
            alias: Some(p.name.clone()),
            transpose: false,
            vocab_rows: p.name == "wte.weight",
            columns: 0..p.shape.last().copied().unwrap_or(0),
        }]
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

    /// `n_layer`, `n_embd`, `n_head`, `n_positions` (the learned positions: `seq_len`) and
    /// `vocab_size` as it is (50,257: the GPU's kernels want `model.vocab_size = 50304`, whose
    /// rows past the checkpoint's start at zero); GPT-2's activation, MLP width and tied head
    /// are fixed, and another is refused.
    fn from_hf_config(&self, j: &serde_json::Value) -> std::result::Result<ModelConfig, String> {
        let count = |key: &str, default: Option<usize>| match &j[key] {
            serde_json::Value::Null => default.ok_or(format!("has no {key}")),
            v => v
                .as_u64()
                .map(|n| n as usize)
                .ok_or(format!("has {key} = {v}, not a count")),
        };
        let act = j["activation_function"].as_str().unwrap_or("gelu_new");
        if act != "gelu_new" {
            return Err(format!(
                "has activation_function = {act:?}; GPT-2's MLP is \"gelu_new\""
            ));
        }
        // GPT-2's LayerNorm epsilon is fixed: another would train another model without a word.
        let eps = j["layer_norm_epsilon"].as_f64().unwrap_or(GPT2_NORM_EPS);
        if (eps - GPT2_NORM_EPS).abs() > 1e-12 {
            return Err(format!(
                "has layer_norm_epsilon = {eps}; GPT-2's LayerNorm here is {GPT2_NORM_EPS}"
            ));
        }
        if j["tie_word_embeddings"].as_bool() == Some(false) {
            return Err("has tie_word_embeddings = false; GPT-2's head is its embedding".into());
        }
        let n_inner = &j["n_inner"];
        let n_embd = count("n_embd", Some(768))?;
        if !n_inner.is_null() && n_inner.as_u64() != Some(4 * n_embd as u64) {
            return Err(format!(
                "has n_inner = {n_inner}; GPT-2's MLP is 4 x n_embd"
            ));
        }
        Ok(ModelConfig::gpt2(
            count("n_layer", Some(12))?,
            n_embd,
            count("n_head", Some(12))?,
            count("n_positions", Some(1024))?,
            count("vocab_size", Some(50257))?,
        ))
    }

    /// What [`Family::from_hf_config`] refuses (another activation, norm epsilon, MLP width
    /// or an untied head); the rest is in the tensors' shapes.
    fn check_hf_config(
        &self,
        j: &serde_json::Value,
        _: &ModelConfig,
    ) -> std::result::Result<(), String> {
        self.from_hf_config(j).map(|_| ())
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
        super::embedding_unit_forward(cfg, params, tokens)
    }

    fn embedding_backward(
        &self,
        cfg: &ModelConfig,
        tokens: &TokenIndex,
        dout: &Tensor,
        onto: Option<Tensor>,
    ) -> Result<Tensor> {
        super::embedding_unit_backward(cfg, tokens, dout, onto)
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

    /// None: GPT-2's positions are learned (`wpe`).
    fn rope(&self, _: &ModelConfig, _: DType, _: &Device) -> Result<Option<RopeTables>> {
        Ok(None)
    }

    fn embedding_decode(
        &self,
        cfg: &ModelConfig,
        params: &Tensor,
        tokens: &Tensor,
        start: usize,
    ) -> Result<Tensor> {
        super::embedding_decode(cfg, params, tokens, start)
    }

    fn block_decode(
        &self,
        cfg: &ModelConfig,
        params: &Tensor,
        x: &Tensor,
        cache: &mut LayerCache,
        _: Option<&RopeTables>,
    ) -> Result<Tensor> {
        super::block_decode(cfg, params, x, cache)
    }

    /// `ln_f`, then the tied head.
    fn logits_decode(&self, cfg: &ModelConfig, units: &[Tensor], x: &Tensor) -> Result<Tensor> {
        let last = units.len() - 1;
        super::logits_decode(cfg, &units[last], &units[0], x)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn presets_are_valid_and_near_nominal_size() {
        crate::config::tests::check_presets(
            &super::Gpt2,
            &[
                ("tiny", 3.32e6),
                ("gpt125m", 125e6),
                ("gpt350m", 350e6),
                ("gpt1.3b", 1.3e9),
                ("gpt6.7b", 6.7e9),
                ("gpt18b", 18e9),
                ("gpt49b", 49e9),
                ("gpt91b", 91e9),
                ("gpt138b", 138e9),
            ],
        );
        for (name, cfg) in crate::Family::presets(&super::Gpt2) {
            if cfg.n_embd >= 8192 {
                // our chosen shapes; gpt18b keeps the published 32 heads of 192
                assert_eq!(cfg.head_dim, 128, "{name}");
            }
        }
    }
}
