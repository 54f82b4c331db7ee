//! The Llama family in the registry ([`crate::family`]): `LlamaForCausalLM` (Llama 2 and 3,
//! 3.1 and 3.2 with their rope scaling), a [`LlamaStyle`] with nothing added to the block; its
//! presets and constants.

use super::style::{LlamaStyle, Window};
use crate::config::ModelConfig;
use crate::layers::RopeScaling;

/// The Llama family (Llama 2 and 3).
pub static LLAMA: LlamaStyle = LlamaStyle {
    name: "llama",
    hf_class: "LlamaForCausalLM",
    qkv_bias: false,
    qk_norm: false,
    window: Window::None,
    norm_eps: LLAMA_NORM_EPS,
    rope_theta: LLAMA_ROPE_THETA,
    presets,
};

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
        LLAMA.shape(
            n_layer,
            n_embd,
            n_head,
            n_kv_head,
            n_embd / n_head,
            ffn_hidden,
            seq_len,
            vocab_size,
            tie_embeddings,
        )
    }
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
fn presets() -> Vec<(&'static str, ModelConfig)> {
    let llama = |l, c, h, kv, f, t, tied| ModelConfig::llama(l, c, h, kv, f, t, LLAMA3_VOCAB, tied);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_near_nominal_size() {
        crate::config::tests::check_presets(
            &LLAMA,
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
