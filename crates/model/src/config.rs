//! Model shapes ([`ModelConfig`] of a family, its [`Arch`]) and what every shape must satisfy.

use crate::error::{ModelError, Result};
use crate::family::Family;
use crate::layers::RopeScaling;

/// Which family a [`ModelConfig`] is: a handle on its registered [`Family`], compared by
/// name. Open: a family is added by registering it ([`crate::FAMILIES`]), not by a variant.
#[derive(Clone, Copy)]
pub struct Arch(&'static dyn Family);

impl Arch {
    /// The arch of `family`.
    pub fn of(family: &'static dyn Family) -> Self {
        Arch(family)
    }

    /// Its family, which computes, lays out, records and maps its shapes.
    pub fn family(self) -> &'static dyn Family {
        self.0
    }

    /// The name `model.arch` takes in a run config: its family's ([`Family::name`]).
    pub fn name(self) -> &'static str {
        self.0.name()
    }

    /// The arch of the family named `name` (`"gpt2"`, `"llama"`).
    pub fn from_name(name: &str) -> Option<Self> {
        crate::family(name).map(Arch)
    }
}

/// GPT-2, the registry's first family, as trainers before the registry assumed.
impl Default for Arch {
    fn default() -> Self {
        Arch(crate::FAMILIES[0])
    }
}

impl PartialEq for Arch {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Arch {}

impl std::hash::Hash for Arch {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name().hash(state)
    }
}

impl std::fmt::Debug for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Shape of a decoder-only transformer of any family.
///
/// Size letters used throughout the crate: `L` = `n_layer`, `C` = `n_embd`, `NH` = `n_head`,
/// `KV` = `n_kv_head`, `hs` = `head_dim` (`C / NH` but where a family sets its own, as Qwen3
/// does), `F` = `ffn_hidden`, `T` = `seq_len` (the longest sequence), `V` = `vocab_size`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    /// Number of transformer blocks (L).
    pub n_layer: usize,
    /// Width of the residual stream (C).
    pub n_embd: usize,
    /// Number of attention (query) heads (NH); must divide `n_embd`.
    pub n_head: usize,
    /// Key/value heads (KV, grouped-query attention); divides `n_head`. GPT-2: `n_head`.
    pub n_kv_head: usize,
    /// Width of one attention head (hs): `n_embd / n_head` unless the family's config sets its
    /// own (Qwen3 0.6B: 128 with `n_embd / n_head` = 64); q is `NH hs` wide, k and v `KV hs`.
    pub head_dim: usize,
    /// Hidden width of the MLP (F). GPT-2: `4 C`.
    pub ffn_hidden: usize,
    /// Maximum sequence length (T): GPT-2's learned positions, Llama's rotary table.
    pub seq_len: usize,
    /// Vocabulary size (V), rows of the token embedding and of the LM head.
    pub vocab_size: usize,
    /// Epsilon of the norms (GPT-2's LayerNorm 1e-5; Llama's RMSNorm `model.norm_eps`).
    pub norm_eps: f64,
    /// Base of the rotary frequencies (Llama; unused by GPT-2).
    pub rope_theta: f64,
    /// How the rotary frequencies are rescaled (Llama 3.1 and 3.2: `llama3`; unused by GPT-2).
    pub rope_scaling: RopeScaling,
    /// The LM head reads the token embedding (GPT-2 always; Llama 3.2 1B and 3B).
    pub tie_embeddings: bool,
    /// q, k and v projections have biases (Qwen2 / Qwen2.5).
    pub qkv_bias: bool,
    /// Each query and key head is RMS-normalised (its own `hs` weights) before the rotation
    /// (Qwen3).
    pub qk_norm: bool,
    /// Attention sees only the last this-many positions (Mistral 7B v0.1: 4096). Only a window
    /// no shorter than `seq_len` is accepted ([`ModelConfig::validate`]): it then masks nothing
    /// in training, and is kept so that an export says what the checkpoint said.
    pub sliding_window: Option<usize>,
}

impl ModelConfig {
    /// Checks that every size is positive, that `n_head` divides `n_embd` and `n_kv_head`
    /// divides `n_head`, then the family's own checks ([`crate::Family::validate`]: what GPT-2
    /// fixes, a Llama's even head width).
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("n_layer", self.n_layer),
            ("n_embd", self.n_embd),
            ("n_head", self.n_head),
            ("n_kv_head", self.n_kv_head),
            ("head_dim", self.head_dim),
            ("ffn_hidden", self.ffn_hidden),
            ("seq_len", self.seq_len),
            ("vocab_size", self.vocab_size),
        ] {
            if v == 0 {
                return Err(ModelError::ZeroSize { field });
            }
        }
        // The model's layout is built per layer before any memory estimate can refuse it: a
        // typo of 10^8 layers would abort on allocation instead of being named.
        if self.n_layer > MAX_LAYERS {
            return Err(ModelError::Shape {
                field: "n_layer",
                reason: format!("{} is more than {MAX_LAYERS} layers", self.n_layer),
            });
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(ModelError::HeadsDoNotDivide {
                n_embd: self.n_embd,
                n_head: self.n_head,
            });
        }
        let bad = |field: &'static str, reason: String| Err(ModelError::Shape { field, reason });
        if !self.n_head.is_multiple_of(self.n_kv_head) {
            return bad(
                "n_kv_head",
                format!(
                    "{} does not divide n_head = {}",
                    self.n_kv_head, self.n_head
                ),
            );
        }
        if let Some(w) = self.sliding_window.filter(|&w| w < self.seq_len) {
            return bad(
                "sliding_window",
                format!(
                    "{w} is shorter than seq_len = {}: windowed attention is not implemented \
                     (train at seq_len <= {w}, or use a checkpoint without a window)",
                    self.seq_len
                ),
            );
        }
        if !(self.norm_eps > 0.0 && self.norm_eps.is_finite()) {
            return bad(
                "norm_eps",
                format!("{} is not a positive number", self.norm_eps),
            );
        }
        self.family().validate(self)
    }

    /// Number of unique parameters (a tied LM head counted once): the family's count
    /// ([`crate::Family::num_params`]).
    pub fn num_params(&self) -> usize {
        self.family().num_params(self)
    }
}

/// The most layers a model may have: 2^16, hundreds of times the deepest published model.
pub const MAX_LAYERS: usize = 1 << 16;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::preset;

    /// Every family's presets are valid shapes within 3% of their nominal size (each family's
    /// tests list its nominal sizes: `gpt2::family`, `llama::family`).
    pub(crate) fn check_presets(family: &dyn Family, nominal: &[(&str, f64)]) {
        let presets = family.presets();
        assert_eq!(nominal.len(), presets.len(), "{}", family.name());
        for ((name, size), (preset_name, cfg)) in nominal.iter().zip(presets) {
            assert_eq!(*name, preset_name);
            cfg.validate().unwrap();
            assert_eq!(cfg.arch.name(), family.name());
            assert_eq!(crate::preset(name), Some(cfg.clone()));
            let n = cfg.num_params() as f64;
            assert!((n / size - 1.0).abs() < 0.03, "{name}: {n} vs {size}");
        }
    }

    #[test]
    fn validate_rejects_bad_shapes() {
        let mut cfg = preset("tiny").unwrap();
        cfg.n_head = 3;
        assert!(matches!(
            cfg.validate(),
            Err(ModelError::HeadsDoNotDivide { .. })
        ));
        cfg.n_head = 0;
        assert!(matches!(
            cfg.validate(),
            Err(ModelError::ZeroSize { field: "n_head" })
        ));
        let mut gqa = preset("llama-tiny").unwrap();
        gqa.n_kv_head = 3;
        let e = gqa.validate().unwrap_err().to_string();
        assert!(e.contains("n_kv_head"), "{e}");
        let mut untied = preset("tiny").unwrap();
        untied.tie_embeddings = false;
        assert!(untied.validate().is_err(), "GPT-2 is tied");
    }
}
