//! Model sizes ([`GptConfig`]) and the named presets.

use crate::error::{ModelError, Result};

/// Shape of a GPT-2 style model.
///
/// Size letters used throughout the crate: `L` = `n_layer`, `C` = `n_embd`, `NH` = `n_head`,
/// `hs` = `C / NH`, `T` = `seq_len` (the longest sequence, i.e. the rows of `wpe`), `V` = `vocab_size`.
#[derive(Clone, Debug, PartialEq)]
pub struct GptConfig {
    /// Number of transformer blocks (L).
    pub n_layer: usize,
    /// Width of the residual stream (C).
    pub n_embd: usize,
    /// Number of attention heads (NH); must divide `n_embd`.
    pub n_head: usize,
    /// Maximum sequence length (T), the number of learned positions.
    pub seq_len: usize,
    /// Vocabulary size (V), rows of the tied token embedding / LM head.
    pub vocab_size: usize,
}

impl GptConfig {
    /// Per-head width `hs = C / NH`.
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }

    /// Checks that every size is positive and that `n_head` divides `n_embd`.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("n_layer", self.n_layer),
            ("n_embd", self.n_embd),
            ("n_head", self.n_head),
            ("seq_len", self.seq_len),
            ("vocab_size", self.vocab_size),
        ] {
            if v == 0 {
                return Err(ModelError::ZeroSize { field });
            }
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(ModelError::HeadsDoNotDivide {
                n_embd: self.n_embd,
                n_head: self.n_head,
            });
        }
        Ok(())
    }

    /// Number of unique parameters (the tied LM head is counted once):
    /// `V*C + T*C + L*(12*C^2 + 13*C) + 2*C`.
    pub fn num_params(&self) -> usize {
        let (l, c) = (self.n_layer, self.n_embd);
        self.vocab_size * c + self.seq_len * c + l * (12 * c * c + 13 * c) + 2 * c
    }
}

/// GPT-2's 50257-token vocabulary padded up to a multiple of 128, as Megatron does.
pub const PADDED_GPT2_VOCAB: usize = 50304;

/// Names accepted by [`preset`], smallest first.
pub const PRESET_NAMES: &[&str] = &[
    "tiny", "gpt125m", "gpt350m", "gpt1.3b", "gpt6.7b", "gpt18b", "gpt49b", "gpt91b", "gpt138b",
];

/// The named model shapes. All use `vocab_size` 50304.
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
/// ```
/// let cfg = model::preset("gpt350m").unwrap();
/// assert_eq!(cfg.num_params(), 354_871_296);
/// assert!(model::preset("gpt7b").is_none());
/// ```
pub fn preset(name: &str) -> Option<GptConfig> {
    let (n_layer, n_embd, n_head, seq_len) = match name {
        "tiny" => (2, 64, 4, 64),
        "gpt125m" => (12, 768, 12, 1024),
        "gpt350m" => (24, 1024, 16, 1024),
        "gpt1.3b" => (24, 2048, 16, 1024),
        "gpt6.7b" => (32, 4096, 32, 2048),
        "gpt18b" => (40, 6144, 32, 2048),
        "gpt49b" => (60, 8192, 64, 2048),
        "gpt91b" => (72, 10240, 80, 2048),
        "gpt138b" => (100, 10752, 84, 2048),
        _ => return None,
    };
    Some(GptConfig {
        n_layer,
        n_embd,
        n_head,
        seq_len,
        vocab_size: PADDED_GPT2_VOCAB,
    })
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
        ];
        assert_eq!(nominal.len(), PRESET_NAMES.len());
        for (name, size) in nominal {
            let cfg = preset(name).unwrap();
            cfg.validate().unwrap();
            let n = cfg.num_params() as f64;
            assert!((n / size - 1.0).abs() < 0.03, "{name}: {n} vs {size}");
            assert!(PRESET_NAMES.contains(&name));
            if cfg.n_embd >= 8192 {
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
    }
}
