//! The run's tokens: its tokenizer opened and its training and validation sources read and
//! checked against the model's vocabulary, before anything is written.

use anyhow::{bail, Context, Result};
use data::{TokenCorpus, Tokenizer};

use run::config::RunConfig;

/// Training and validation tokens, and the fingerprint of the tokenizer that made them (when a
/// `.jsonl` source needed one), which checkpoints record.
pub(crate) struct Corpora {
    pub(crate) train: TokenCorpus,
    pub(crate) valid: Option<TokenCorpus>,
    pub(crate) tokenizer: Option<u32>,
}

/// The run's tokenizer: `data.tokenizer`, which text sources need (an error if it cannot be
/// read); for token sources (`.bin`/`.idx`) only where it reads, to give the vocabulary.
pub(super) fn open_tokenizer(config: &RunConfig) -> Result<Option<Tokenizer>> {
    let d = &config.data;
    let open = || Tokenizer::open(&d.tokenizer, d.eod_token.as_deref());
    match needs_tokenizer(config) {
        true => Ok(Some(open().context("data.tokenizer")?)),
        false => Ok(open().ok()),
    }
}

/// Whether a source is text, to be tokenised at start.
fn needs_tokenizer(config: &RunConfig) -> bool {
    let d = &config.data;
    d.train
        .iter()
        .chain(&d.valid)
        .any(|p| data::is_text_input(p))
}

pub(crate) fn load_data(
    config: &RunConfig,
    vocab_size: usize,
    tokenizer: Option<&Tokenizer>,
) -> Result<Corpora> {
    let d = &config.data;
    // Only text sources were made by this tokenizer: only they record its fingerprint.
    let tokenizer = tokenizer.filter(|_| needs_tokenizer(config));
    let (train, valid) = if !d.valid.is_empty() {
        let train = TokenCorpus::load(&d.train, tokenizer, &d.text_column).context("data.train")?;
        let valid = TokenCorpus::load(&d.valid, tokenizer, &d.text_column).context("data.valid")?;
        (train, Some(valid))
    } else if d.valid_fraction > 0.0 {
        let (train, valid) =
            TokenCorpus::load_split(&d.train, tokenizer, &d.text_column, d.valid_fraction)
                .context("data.train")?;
        (train, Some(valid))
    } else {
        (
            TokenCorpus::load(&d.train, tokenizer, &d.text_column).context("data.train")?,
            None,
        )
    };
    for (what, corpus) in [("data.train", Some(&train)), ("data.valid", valid.as_ref())] {
        if let Some(max) = corpus.and_then(|c| c.tokens.iter().max()) {
            if *max as usize >= vocab_size {
                bail!("{what}: token id {max} does not fit model.vocab_size = {vocab_size}");
            }
        }
    }
    Ok(Corpora {
        train,
        valid,
        tokenizer: tokenizer.map(Tokenizer::fingerprint),
    })
}
