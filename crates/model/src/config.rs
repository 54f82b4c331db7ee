//! Model shapes ([`ModelConfig`], either [`Arch`]) and the named presets.

use crate::error::{ModelError, Result};

/// Which decoder a [`ModelConfig`] describes: the layers of its blocks and its embedding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Arch {
    /// GPT-2: learned positions, pre-LayerNorm blocks with biases, a GELU MLP of `4C`, the LM
    /// head tied to the token embedding.
    #[default]
    Gpt2,
    /// The Llama family (Llama 2 and 3): RMSNorm, rotary positions, a SwiGLU MLP,
    /// grouped-query attention, no biases; the LM head tied or not.
    Llama,
}

impl Arch {
    /// The name `model.arch` takes in a run config: its family's ([`crate::Family::name`]).
    pub fn name(self) -> &'static str {
        self.family().name()
    }

    /// The arch of the family named `name` (`"gpt2"`, `"llama"`).
    pub fn from_name(name: &str) -> Option<Self> {
        crate::family(name).map(|f| f.arch())
    }
}

/// Shape of a decoder-only transformer of either [`Arch`].
///
/// Size letters used throughout the crate: `L` = `n_layer`, `C` = `n_embd`, `NH` = `n_head`,
/// `KV` = `n_kv_head`, `hs` = `C / NH`, `F` = `ffn_hidden`, `T` = `seq_len` (the longest
/// sequence), `V` = `vocab_size`.
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
    /// The LM head reads the token embedding (GPT-2 always; Llama 3.2 1B and 3B).
    pub tie_embeddings: bool,
}

/// GPT-2's LayerNorm epsilon.
pub const GPT2_NORM_EPS: f64 = 1e-5;
/// Llama 3's RMSNorm epsilon and rotary base.
pub const LLAMA_NORM_EPS: f64 = 1e-5;
pub const LLAMA_ROPE_THETA: f64 = 500_000.0;

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
            arch: Arch::Gpt2,
            n_layer,
            n_embd,
            n_head,
            n_kv_head: n_head,
            ffn_hidden: 4 * n_embd,
            seq_len,
            vocab_size,
            norm_eps: GPT2_NORM_EPS,
            rope_theta: LLAMA_ROPE_THETA,
            tie_embeddings: true,
        }
    }

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
            arch: Arch::Llama,
            n_layer,
            n_embd,
            n_head,
            n_kv_head,
            ffn_hidden,
            seq_len,
            vocab_size,
            norm_eps: LLAMA_NORM_EPS,
            rope_theta: LLAMA_ROPE_THETA,
            tie_embeddings,
        }
    }

    /// Per-head width `hs = C / NH`.
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }

    /// Checks that every size is positive, that `n_head` divides `n_embd` and `n_kv_head`
    /// divides `n_head`, then the family's own checks ([`crate::Family::validate`]: what GPT-2
    /// fixes, a Llama's even head width).
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("n_layer", self.n_layer),
            ("n_embd", self.n_embd),
            ("n_head", self.n_head),
            ("n_kv_head", self.n_kv_head),
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

/// GPT-2's 50257-token vocabulary padded up to a multiple of 128, as Megatron does.
pub const PADDED_GPT2_VOCAB: usize = 50304;

/// Llama 3's 128,256-token vocabulary (already a multiple of 128): the Llama presets' size,
/// which a run replaces with its tokenizer's, padded to a multiple of 128.
pub const LLAMA3_VOCAB: usize = 128_256;

/// Names accepted by [`preset`], GPT-2 then Llama, smallest first.
pub const PRESET_NAMES: &[&str] = &[
    "tiny",
    "gpt125m",
    "gpt350m",
    "gpt1.3b",
    "gpt6.7b",
    "gpt18b",
    "gpt49b",
    "gpt91b",
    "gpt138b",
    "llama-tiny",
    "llama3.2-1b",
    "llama3.2-3b",
    "llama3-8b",
    "llama3-70b",
];

/// The most layers a model may have: 2^16, hundreds of times the deepest published model.
pub const MAX_LAYERS: usize = 1 << 16;

/// The named model shapes.
///
/// GPT-2 (`vocab_size` 50304):
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
/// head_dim 128 and round widths, with the layer count picked so that the total (dominated by
/// `12*L*C^2`) lands within 1% of the nominal size.
///
/// Llama, the published shapes (`vocab_size` 128,256 until the tokenizer sets it; rope_theta
/// 500,000, RMSNorm eps 1e-5; seq_len 2048, the length of the PyTorch anchor):
///
/// | name          | n_layer | n_embd | n_head | n_kv_head | ffn_hidden | tied | num_params     |
/// |---------------|--------:|-------:|-------:|----------:|-----------:|:----:|---------------:|
/// | `llama-tiny`  |       2 |     64 |      4 |         2 |        192 | yes  |  (vocab) 8,395,840 |
/// | `llama3.2-1b` |      16 |   2048 |     32 |         8 |       8192 | yes  |  1,235,814,400 |
/// | `llama3.2-3b` |      28 |   3072 |     24 |         8 |       8192 | yes  |  3,212,749,824 |
/// | `llama3-8b`   |      32 |   4096 |     32 |         8 |      14336 | no   |  8,030,261,248 |
/// | `llama3-70b`  |      80 |   8192 |     64 |         8 |      28672 | no   | 70,553,706,496 |
///
/// `llama-tiny` (seq_len 64) is ours, for tests and the CPU demo.
///
/// ```
/// let cfg = model::preset("gpt350m").unwrap();
/// assert_eq!(cfg.num_params(), 354_871_296);
/// assert_eq!(model::preset("llama3.2-1b").unwrap().num_params(), 1_235_814_400);
/// assert!(model::preset("gpt7b").is_none());
/// ```
pub fn preset(name: &str) -> Option<ModelConfig> {
    let gpt2 = |l, c, h, t| Some(ModelConfig::gpt2(l, c, h, t, PADDED_GPT2_VOCAB));
    let llama =
        |l, c, h, kv, f, t, tied| Some(ModelConfig::llama(l, c, h, kv, f, t, LLAMA3_VOCAB, tied));
    match name {
        "tiny" => gpt2(2, 64, 4, 64),
        "gpt125m" => gpt2(12, 768, 12, 1024),
        "gpt350m" => gpt2(24, 1024, 16, 1024),
        "gpt1.3b" => gpt2(24, 2048, 16, 1024),
        "gpt6.7b" => gpt2(32, 4096, 32, 2048),
        "gpt18b" => gpt2(40, 6144, 32, 2048),
        "gpt49b" => gpt2(60, 8192, 64, 2048),
        "gpt91b" => gpt2(72, 10240, 80, 2048),
        "gpt138b" => gpt2(100, 10752, 84, 2048),
        "llama-tiny" => llama(2, 64, 4, 2, 192, 64, true),
        "llama3.2-1b" => llama(16, 2048, 32, 8, 8192, 2048, true),
        "llama3.2-3b" => llama(28, 3072, 24, 8, 8192, 2048, true),
        "llama3-8b" => llama(32, 4096, 32, 8, 14336, 2048, false),
        "llama3-70b" => llama(80, 8192, 64, 8, 28672, 2048, false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_near_nominal_size() {
        let nominal = [
            ("tiny", 3.32e6),
            ("gpt125m", 125e6),
            ("gpt350m", 350e6),
            ("gpt1.3b", 1.3e9),
            ("gpt6.7b", 6.7e9),
            ("gpt18b", 18e9),
            ("gpt49b", 49e9),
            ("gpt91b", 91e9),
            ("gpt138b", 138e9),
            ("llama-tiny", 8.4e6),
            ("llama3.2-1b", 1.24e9),
            ("llama3.2-3b", 3.21e9),
            ("llama3-8b", 8.03e9),
            ("llama3-70b", 70.55e9),
        ];
        assert_eq!(nominal.len(), PRESET_NAMES.len());
        for (name, size) in nominal {
            let cfg = preset(name).unwrap();
            cfg.validate().unwrap();
            let n = cfg.num_params() as f64;
            assert!((n / size - 1.0).abs() < 0.03, "{name}: {n} vs {size}");
            assert!(PRESET_NAMES.contains(&name));
            if cfg.n_embd >= 8192 && cfg.arch == Arch::Gpt2 {
                // our chosen shapes; gpt18b keeps the published 32 heads of 192
                assert_eq!(cfg.head_dim(), 128, "{name}");
            }
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
