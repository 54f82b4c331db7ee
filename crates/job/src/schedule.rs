//! Learning rate: linear warm-up from 0 to `lr`, then a cosine from `lr` to `min_lr`.

use run::config::TrainSection;

/// The learning rate of optimizer step `step` (1-based).
pub fn learning_rate(t: &TrainSection, step: u64) -> f64 {
    if step <= t.warmup_steps {
        return t.lr * step as f64 / t.warmup_steps as f64;
    }
    let decay = t.decay_steps.unwrap_or(t.steps).max(t.warmup_steps + 1);
    let progress = ((step - t.warmup_steps) as f64 / (decay - t.warmup_steps) as f64).min(1.0);
    t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_then_decays_to_min() {
        let t = TrainSection {
            lr: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 10,
            steps: 110,
            ..Default::default()
        };
        assert!((learning_rate(&t, 5) - 5e-4).abs() < 1e-12);
        assert!((learning_rate(&t, 10) - 1e-3).abs() < 1e-12);
        assert!((learning_rate(&t, 60) - 5.5e-4).abs() < 1e-12);
        assert!((learning_rate(&t, 110) - 1e-4).abs() < 1e-12);
        assert!((learning_rate(&t, 500) - 1e-4).abs() < 1e-12);
    }
}
