//! Picking each token of [`super::Decoder::generate`] from the logits: greedy (argmax) or a
//! seeded draw from the tempered softmax, optionally restricted to the `k` most likely tokens.

use rand::Rng;

use crate::error::{ModelError, Result};

/// How [`Decoder::generate`](super::Decoder::generate) picks each token.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// Tokens to generate at most (fewer when `stop` comes, `on_token` says stop, or the
    /// context fills `seq_len`).
    pub max_new_tokens: usize,
    /// Softmax temperature: `0` is greedy (argmax, the lowest id among ties, as
    /// `torch.argmax`), otherwise tokens are drawn from `softmax(logits / temperature)`.
    pub temperature: f64,
    /// Draw only among the `k` most likely tokens (exactly `k`: ties at the boundary go to the
    /// lower ids, so `Some(1)` is greedy); `None`: the whole vocabulary.
    pub top_k: Option<usize>,
    /// Seed of the sampler's RNG (rand's `StdRng`): the same seed, model and options give the
    /// same tokens (with the same rand version). Unused when greedy.
    pub seed: u64,
    /// A token that ends generation (e.g. `<|endoftext|>`), returned as the last token.
    pub stop: Option<u32>,
}

impl Sampling {
    /// Greedy decoding of up to `max_new_tokens` tokens, no stop token.
    pub fn greedy(max_new_tokens: usize) -> Self {
        Sampling {
            max_new_tokens,
            temperature: 0.0,
            top_k: None,
            seed: 0,
            stop: None,
        }
    }

    /// An error unless the temperature is finite and `>= 0` and `top_k` is not `Some(0)`.
    pub(super) fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(ModelError::BadSampling { reason });
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!(
                "temperature {} is not a number >= 0",
                self.temperature
            ));
        }
        if self.top_k == Some(0) {
            return bad("top_k = 0 keeps no token".into());
        }
        Ok(())
    }

    /// The next token after `logits`: [`argmax`] at temperature 0, else a [`sample`] of `rng`.
    pub(super) fn pick(&self, logits: &[f32], rng: &mut impl Rng) -> u32 {
        if self.temperature == 0.0 {
            argmax(logits)
        } else {
            sample(logits, self.temperature, self.top_k, rng)
        }
    }
}

/// The index of the largest logit, the lowest among ties (`torch.argmax`); NaNs never win.
fn argmax(logits: &[f32]) -> u32 {
    let mut best = (0, f32::NEG_INFINITY);
    for (i, &x) in logits.iter().enumerate() {
        if x > best.1 {
            best = (i, x);
        }
    }
    best.0 as u32
}

/// A draw from `softmax(logits / temperature)` restricted to the `top_k` largest logits
/// (exactly `k`, ties at the boundary to the lower ids), by inverting the CDF over the
/// candidates in id order at one uniform draw of `rng`. `temperature > 0`.
fn sample(logits: &[f32], temperature: f64, top_k: Option<usize>, rng: &mut impl Rng) -> u32 {
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &x)| (i as u32, x))
        .collect();
    if let Some(k) = top_k.filter(|&k| k < cand.len()) {
        // Larger logit first, then lower id: a total order, so the k kept are well defined.
        cand.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        cand.truncate(k);
        cand.sort_unstable_by_key(|c| c.0);
    }
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max) as f64;
    let weights: Vec<f64> = cand
        .iter()
        .map(|c| ((c.1 as f64 - max) / temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let u = rng.random::<f64>() * total;
    let mut acc = 0.0;
    for (c, w) in cand.iter().zip(&weights) {
        acc += w;
        if u < acc {
            return c.0;
        }
    }
    // Rounding left u at the very end: the last candidate of positive weight.
    cand.iter()
        .zip(&weights)
        .rev()
        .find(|(_, &w)| w > 0.0)
        .map_or(cand[0].0, |(c, _)| c.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn argmax_takes_the_lowest_id_among_ties() {
        assert_eq!(argmax(&[0.5, 2.0, -1.0, 2.0]), 1);
        assert_eq!(argmax(&[3.0, 3.0]), 0);
        assert_eq!(argmax(&[f32::NAN, 1.0, 0.0]), 1);
    }

    #[test]
    fn sample_follows_the_tempered_top_k_softmax() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0, 0.5];
        let draws = 40_000;
        for (temperature, top_k) in [(1.0, None), (0.5, Some(3)), (2.0, Some(4))] {
            let mut rng = StdRng::seed_from_u64(7);
            let mut counts = [0usize; 6];
            for _ in 0..draws {
                counts[sample(&logits, temperature, top_k, &mut rng) as usize] += 1;
            }
            // The expected distribution, written independently.
            let mut order: Vec<usize> = (0..6).collect();
            order.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap().then(a.cmp(&b)));
            let kept = &order[..top_k.unwrap_or(6)];
            let w: Vec<f64> = (0..6)
                .map(|i| {
                    if kept.contains(&i) {
                        (logits[i] as f64 / temperature).exp()
                    } else {
                        0.0
                    }
                })
                .collect();
            let total: f64 = w.iter().sum();
            for i in 0..6 {
                let p = w[i] / total;
                let f = counts[i] as f64 / draws as f64;
                // 5 standard deviations of a binomial frequency
                let tol = 5.0 * (p * (1.0 - p) / draws as f64).sqrt() + 1e-9;
                assert!(
                    (f - p).abs() <= tol,
                    "T {temperature} k {top_k:?} id {i}: {f} vs {p}"
                );
            }
        }
    }

    #[test]
    fn top_1_is_the_argmax_and_ties_at_the_boundary_go_to_lower_ids() {
        let mut rng = StdRng::seed_from_u64(1);
        let logits = [0.0f32, 5.0, 1.0, 5.0];
        let boundary = [0.0f32, 5.0, 4.0, 4.0];
        let mut seen = [0; 4];
        for _ in 0..200 {
            assert_eq!(sample(&logits, 3.0, Some(1), &mut rng), 1);
            seen[sample(&boundary, 3.0, Some(2), &mut rng) as usize] += 1;
        }
        assert_eq!((seen[0], seen[3]), (0, 0), "{seen:?}");
        assert!(seen[1] > 0 && seen[2] > 0, "{seen:?}");
    }
}
