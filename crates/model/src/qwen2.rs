//! Qwen2 and Qwen2.5 (`Qwen2ForCausalLM`): Llama's block with biases on the q, k and v
//! projections (o_proj and the MLP have none), RMSNorm epsilon 1e-6 and rotary base 1,000,000.
//! Their sliding window (`use_sliding_window`) is off in every released checkpoint and refused
//! when on.

use crate::llama::style::{LlamaStyle, Window};
use crate::ModelConfig;

/// The Qwen2 family (Qwen2, Qwen2.5).
pub static QWEN2: LlamaStyle = LlamaStyle {
    name: "qwen2",
    hf_class: "Qwen2ForCausalLM",
    qkv_bias: true,
    qk_norm: false,
    window: Window::Qwen,
    norm_eps: 1e-6,
    rope_theta: 1_000_000.0,
    presets,
};

/// Qwen2.5's vocabulary rows (151,643 tokens and its specials, padded): 0.5B to 3B; 7B has
/// 152,064.
pub const QWEN_VOCAB: usize = 151_936;

/// Qwen2.5's published shapes (seq_len 2048, the length the anchors train at; their
/// config.json's context is 32,768), and ours for tests and demos, `qwen2-tiny` (seq_len 64):
///
/// | name           | n_layer | n_embd | n_head | n_kv_head | ffn_hidden | vocab   | tied | num_params    |
/// |----------------|--------:|-------:|-------:|----------:|-----------:|--------:|:----:|--------------:|
/// | `qwen2-tiny`   |       2 |     64 |      4 |         2 |        192 | 151,936 | yes  |     9,822,784 |
/// | `qwen2.5-0.5b` |      24 |    896 |     14 |         2 |       4864 | 151,936 | yes  |   494,032,768 |
/// | `qwen2.5-1.5b` |      28 |   1536 |     12 |         2 |       8960 | 151,936 | yes  | 1,543,714,304 |
/// | `qwen2.5-7b`   |      28 |   3584 |     28 |         4 |      18944 | 152,064 | no   | 7,615,616,512 |
fn presets() -> Vec<(&'static str, ModelConfig)> {
    let qwen = |l, c, h, kv, f, v, tied| QWEN2.shape(l, c, h, kv, c / h, f, 2048, v, tied);
    vec![
        (
            "qwen2-tiny",
            QWEN2.shape(2, 64, 4, 2, 16, 192, 64, QWEN_VOCAB, true),
        ),
        ("qwen2.5-0.5b", qwen(24, 896, 14, 2, 4864, QWEN_VOCAB, true)),
        (
            "qwen2.5-1.5b",
            qwen(28, 1536, 12, 2, 8960, QWEN_VOCAB, true),
        ),
        ("qwen2.5-7b", qwen(28, 3584, 28, 4, 18944, 152_064, false)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_near_nominal_size() {
        crate::config::tests::check_presets(
            &QWEN2,
            &[
                ("qwen2-tiny", 9.82e6),
                ("qwen2.5-0.5b", 0.494e9),
                ("qwen2.5-1.5b", 1.54e9),
                ("qwen2.5-7b", 7.62e9),
            ],
        );
    }
}
