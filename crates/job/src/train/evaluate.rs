//! The validation loss of a run, every rank taking part (each forward pass gathers every unit).

use anyhow::{Context, Result};
use data::{Sampler, TokenCorpus};
use zero::Engine;

/// Mean loss over the first `samples` sequences of `valid` (or all it holds), in order, in
/// micro-batches of `micro`. Rank r evaluates the r-th of `world` contiguous slices of them, so with fewer
/// sequences than ranks some ranks evaluate none; every rank still runs as many forward
/// passes (each gathers every unit, a collective), a rank short of sequences running padding
/// passes whose loss is not counted. The mean is over the sequences, not the ranks.
pub(crate) fn evaluate(
    engine: &Engine,
    valid: &TokenCorpus,
    seq_len: usize,
    samples: usize,
    micro: usize,
) -> Result<f64> {
    let world = engine.comm().topology().world();
    let rank = engine.comm().rank();
    let sampler = Sampler::new(valid.tokens.len(), seq_len, 0).context("validation data")?;
    let samples = samples.min(sampler.num_samples());
    let slice = |r: usize| r * samples / world..(r + 1) * samples / world;
    // The passes of the rank with the most sequences: ceil(samples / world) of them, in micro-batches.
    let passes = samples.div_ceil(world).div_ceil(micro);
    let ids: Vec<usize> = slice(rank).collect();
    let mut total = 0.0;
    for pass in 0..passes {
        match ids.chunks(micro).nth(pass) {
            Some(chunk) => {
                let (inputs, targets) = sampler.gather(&valid.tokens, chunk)?;
                total += engine.eval_loss(&inputs, &targets)? * chunk.len() as f64;
            }
            None => {
                // Padding: the first sequence, so that this rank takes part in the gathers.
                let (inputs, targets) = sampler.gather(&valid.tokens, &[0])?;
                engine.eval_loss(&inputs, &targets)?;
            }
        }
    }
    let sum = engine.mean_over_world(total)? * world as f64;
    Ok(sum / samples as f64)
}
