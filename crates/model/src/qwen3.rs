//! Qwen3 dense (`Qwen3ForCausalLM`): Llama's block with an RMSNorm of each query and key head
//! before the rotation (`q_norm`, `k_norm`: `head_dim` weights each, shared by the heads), and
//! a head width of its own (`head_dim` 128, where `n_embd / n_head` is 64 for 0.6B and 80 for
//! 4B); no biases, RMSNorm epsilon 1e-6, rotary base 1,000,000.

use crate::llama::style::{LlamaStyle, Window};
use crate::qwen2::QWEN_VOCAB;
use crate::ModelConfig;

/// The Qwen3 family (its dense models).
pub static QWEN3: LlamaStyle = LlamaStyle {
    name: "qwen3",
    hf_class: "Qwen3ForCausalLM",
    qkv_bias: false,
    qk_norm: true,
    window: Window::Qwen,
    norm_eps: 1e-6,
    rope_theta: 1_000_000.0,
    presets,
};

/// Qwen3's published dense shapes, `head_dim` 128 (seq_len 2048, the anchors' length; their
/// config.json's context is 40,960), and ours for tests and demos, `qwen3-tiny` (seq_len 64,
/// heads of 32 where `n_embd / n_head` is 16, as 0.6B's are twice theirs):
///
/// | name         | n_layer | n_embd | n_head | n_kv_head | ffn_hidden | tied | num_params    |
/// |--------------|--------:|-------:|-------:|----------:|-----------:|:----:|--------------:|
/// | `qwen3-tiny` |       2 |     64 |      4 |         2 |        192 | no   |    19,571,136 |
/// | `qwen3-0.6b` |      28 |   1024 |     16 |         8 |       3072 | yes  |   596,049,920 |
/// | `qwen3-1.7b` |      28 |   2048 |     16 |         8 |       6144 | yes  | 1,720,574,976 |
/// | `qwen3-4b`   |      36 |   2560 |     32 |         8 |       9728 | yes  | 4,022,468,096 |
/// | `qwen3-8b`   |      36 |   4096 |     32 |         8 |      12288 | no   | 8,190,735,360 |
fn presets() -> Vec<(&'static str, ModelConfig)> {
    let qwen = |l, c, h, f, tied| QWEN3.shape(l, c, h, 8, 128, f, 2048, QWEN_VOCAB, tied);
    vec![
        (
            "qwen3-tiny",
            QWEN3.shape(2, 64, 4, 2, 32, 192, 64, QWEN_VOCAB, false),
        ),
        ("qwen3-0.6b", qwen(28, 1024, 16, 3072, true)),
        ("qwen3-1.7b", qwen(28, 2048, 16, 6144, true)),
        ("qwen3-4b", qwen(36, 2560, 32, 9728, true)),
        ("qwen3-8b", qwen(36, 4096, 32, 12288, false)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_near_nominal_size() {
        crate::config::tests::check_presets(
            &QWEN3,
            &[
                ("qwen3-tiny", 19.6e6),
                ("qwen3-0.6b", 0.596e9),
                ("qwen3-1.7b", 1.72e9),
                ("qwen3-4b", 4.02e9),
                ("qwen3-8b", 8.19e9),
            ],
        );
    }
}
