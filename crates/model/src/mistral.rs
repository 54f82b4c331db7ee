//! Mistral (`MistralForCausalLM`): Llama's block under its own name, with a sliding window of
//! attention in its config (Mistral 7B v0.1: 4096; v0.2 and v0.3: none). A window no shorter
//! than the run's `seq_len` masks nothing and is kept for the export; a shorter one is refused
//! in one line ([`crate::ModelConfig::validate`]).

use crate::llama::style::{LlamaStyle, Window};
use crate::ModelConfig;

/// The Mistral family (its dense models).
pub static MISTRAL: LlamaStyle = LlamaStyle {
    name: "mistral",
    hf_class: "MistralForCausalLM",
    qkv_bias: false,
    qk_norm: false,
    window: Window::Mistral,
    norm_eps: 1e-5,
    rope_theta: 1_000_000.0,
    presets,
};

/// Mistral 7B v0.3, no window (rope theta 1,000,000, eps 1e-5, vocabulary 32,768, untied;
/// seq_len 2048), and ours for tests and demos, `mistral-tiny` (seq_len 64):
///
/// | name           | n_layer | n_embd | n_head | n_kv_head | ffn_hidden | num_params    |
/// |----------------|--------:|-------:|-------:|----------:|-----------:|--------------:|
/// | `mistral-tiny` |       2 |     64 |      4 |         2 |        192 |     4,292,928 |
/// | `mistral-7b` |      32 |   4096 |     32 |         8 |      14336 | 7,248,023,552 |
fn presets() -> Vec<(&'static str, ModelConfig)> {
    vec![
        (
            "mistral-tiny",
            MISTRAL.shape(2, 64, 4, 2, 16, 192, 64, 32_768, false),
        ),
        (
            "mistral-7b",
            MISTRAL.shape(32, 4096, 32, 8, 128, 14336, 2048, 32_768, false),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_near_nominal_size() {
        crate::config::tests::check_presets(
            &MISTRAL,
            &[("mistral-tiny", 4.29e6), ("mistral-7b", 7.25e9)],
        );
    }
}
