//! `trainer tokenizer`: a byte-level BPE trained on the user's files, written as a
//! tokenizer.json that `data.tokenizer` and `prepare-data --tokenizer` then take (the training
//! is `data::train_tokenizer`'s; this prints what it did).

use anyhow::{Context, Result};

use report::readable;

/// Trains and writes the tokenizer, then says what it wrote on stderr.
pub fn run(opts: &data::TrainTokenizerOptions) -> Result<()> {
    let s = data::train_tokenizer(opts).context("trainer tokenizer")?;
    eprintln!(
        "wrote {}: {} tokens (end of document <|endoftext|>, id 0), trained on {} documents, \
         {} of text in {:.1} s",
        opts.output.display(),
        s.vocab_size,
        s.documents,
        readable::bytes(s.text_bytes),
        s.seconds
    );
    Ok(())
}
