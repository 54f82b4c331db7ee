//! A run config resolved once: the [`Run`] that training, `trainer bench` and `trainer plan`
//! hand their parts, so that no part builds the model from `[model]` again.

use anyhow::Result;

use crate::config::RunConfig;

/// A checked [`RunConfig`] and the model it trains.
pub struct Run {
    pub config: RunConfig,
    /// `[model]` resolved ([`ModelSection::resolve`](crate::config::ModelSection::resolve)): the
    /// preset, then the explicit sizes.
    pub model: model::ModelConfig,
    /// Whether `model.vocab_size` is the tokenizer's (the key unset, a tokenizer read), so that
    /// a message about the vocabulary can name the tokenizer that gave it.
    pub vocab_from_tokenizer: bool,
}

impl Run {
    /// `config` (as [`RunConfig::load`] returns it) with its model resolved. `tokenizer_vocab`
    /// is the vocabulary size of the tokenizer the run reads, `None` where it reads none: where
    /// `model.vocab_size` is unset it gives the model's, padded to a multiple of 128.
    pub fn resolve(config: RunConfig, tokenizer_vocab: Option<usize>) -> Result<Run> {
        let model = config.model.resolve(tokenizer_vocab)?;
        let vocab_from_tokenizer = config.model.vocab_size.is_none() && tokenizer_vocab.is_some();
        Ok(Run {
            config,
            model,
            vocab_from_tokenizer,
        })
    }
}
