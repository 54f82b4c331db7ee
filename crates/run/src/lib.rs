//! What a run is, resolved once: its config ([`config`]: the TOML file and `--set`, every key
//! checked, one line naming a bad one), the [`Run`] that training, `trainer bench` and `trainer
//! plan` hand their parts (so that no part builds the model from `[model]` again), the engine
//! options it asks for, and the device it runs on ([`device_memory`]).
//!
//! The bottom of the trainer's libraries: `checkpoint`, `plan`, `hf` and `job` read a run
//! from here; this crate reads none of them.

pub mod config;
pub mod device_memory;

use anyhow::Result;
use zero::{AdamW, EngineOptions};

use config::RunConfig;

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

/// The engine options a run config asks for, on `device`.
pub fn engine_options(config: &RunConfig, device: &candle_core::Device) -> EngineOptions {
    let t = &config.train;
    EngineOptions {
        zero: config.zero.clone(),
        total_steps: t.steps,
        seed: t.seed,
        recompute: config.model.recompute,
        optimizer: AdamW {
            beta1: t.beta1,
            beta2: t.beta2,
            eps: t.eps,
            weight_decay: t.weight_decay,
        },
        grad_clip: t.grad_clip,
        device: device.clone(),
        compute_dtype: config.compute_dtype(),
        linears: config.linears(),
    }
}
