//! `[log] sample_interval`: text from the model as it trains, from a fixed prompt with a fixed
//! seed, so that two samples differ only by what the model learnt in between.

use anyhow::{Context, Result};
use model::decode::Sampling;

use super::RankRun;
use crate::generate;
use report::metrics::SampleLine;

/// The samples' sampling: nanoGPT's (temperature 0.8, the 200 likeliest tokens), seeded.
fn sampling(tokens: usize) -> Sampling {
    Sampling {
        max_new_tokens: tokens,
        temperature: 0.8,
        top_k: Some(200),
        seed: 1234,
        stop: None,
    }
}

impl RankRun<'_> {
    /// After `step`, when `log.sample_interval` says: every rank gathers the full weights (a
    /// collective), rank 0 samples from them on its device and writes the text to the log and
    /// to `samples.jsonl`. A sample that fails after the gather is a warning: it never costs
    /// the steps trained since the last checkpoint.
    pub(super) fn sample_if_due(&mut self, step: u64) -> Result<()> {
        let log = &self.shared.config.log;
        if log.sample_interval == 0 || !step.is_multiple_of(log.sample_interval) {
            return Ok(());
        }
        let units = self.engine.gathered_parameters()?;
        if !self.lead {
            return Ok(());
        }
        if let Err(e) = self.sample(step, units) {
            self.say(&format!("step {step} | warning: no sample written: {e:#}"));
        }
        Ok(())
    }

    /// Rank 0's sample from the gathered `units`, to the log and `samples.jsonl`.
    fn sample(&mut self, step: u64, units: hf::export::UnitParameters) -> Result<()> {
        let log = &self.shared.config.log;
        let tokenizer = self
            .shared
            .tokenizer
            .context("log.sample_interval: the run has no tokenizer to write text with")?;
        let cfg = self.shared.model_cfg;
        // The sample decodes in f32, outside the step's kernel plan (bf16 on a GPU): the
        // layers take the reference there, as `trainer generate` does.
        let _f32 = model::unenforced();
        let decoder = generate::decoder(
            cfg,
            units.into_iter().map(|(_, u)| u).collect(),
            &self.device,
        )?;
        let prompt = generate::prompt_ids(tokenizer, &log.sample_prompt)?;
        let ids = decoder.generate(&prompt, &sampling(log.sample_tokens), |_| true)?;
        let text = tokenizer.decode(&ids)?;
        self.say(&format!(
            "step {step} | sample: {:?}",
            format!("{}{text}", log.sample_prompt)
        ));
        let line = SampleLine {
            step,
            tokens: self.tokens_at(step),
            prompt: log.sample_prompt.clone(),
            text,
        };
        self.outputs.sample(&line)
    }
}
