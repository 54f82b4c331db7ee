//! Resuming a run: the newest checkpoint, checked against this run's config.
//!
//! Each checkpoint records the settings that fix the run's trajectory ([`trajectory`]): the
//! model, the data, the seed, the batch, the optimizer and its schedule, and the ZeRO++
//! quantisation. A resume that changes one is refused with a line naming the key, unless
//! `checkpoint.allow_changes` lists it; the world size may change freely (the shards are
//! re-sliced, [`crate::reshard`]), as may anything that only moves float rounding.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::checkpoint::{self, Manifest};
use crate::config::RunConfig;

/// The trajectory's keys, as config keys. `model.*` can never change on resume: the shards
/// would not fit.
pub const TRAJECTORY_KEYS: [&str; 21] = [
    "model.n_layer",
    "model.n_embd",
    "model.n_head",
    "model.seq_len",
    "model.vocab_size",
    "data.train",
    "data.valid",
    "train.seed",
    "train.global_batch",
    "train.lr",
    "train.min_lr",
    "train.warmup_steps",
    "train.decay_steps",
    "train.weight_decay",
    "train.beta1",
    "train.beta2",
    "train.eps",
    "train.grad_clip",
    "train.precision",
    "zero.quantized_weights",
    "zero.quantized_gradients",
];

/// Keys of the quantisation that only matter while it is on, checked beside [`TRAJECTORY_KEYS`].
const QUANT_KEYS: [&str; 4] = [
    "zero.qgz_until",
    "zero.qgz_error_feedback",
    "zero.weight_quant_block",
    "zero.grad_quant_block",
];

/// Whether `key` may be listed in `checkpoint.allow_changes`.
pub fn may_change(key: &str) -> bool {
    !key.starts_with("model.") && (TRAJECTORY_KEYS.contains(&key) || QUANT_KEYS.contains(&key))
}

/// What the data is, for [`trajectory`]: its token counts (paths may move between launches).
#[derive(Clone, Copy, Debug)]
pub struct DataSize {
    pub train_tokens: usize,
    pub valid_tokens: Option<usize>,
}

/// The settings that fix this run's trajectory, each as a config key and its value's text.
/// Values are as resolved: the model's sizes after its preset, the decay after its default.
pub fn trajectory(config: &RunConfig, data: DataSize) -> Result<BTreeMap<String, String>> {
    let model = config.model_config()?;
    let t = &config.train;
    let z = &config.zero;
    let mut s = BTreeMap::new();
    let mut put = |key: &str, value: String| s.insert(key.to_string(), value);
    put("model.n_layer", model.n_layer.to_string());
    put("model.n_embd", model.n_embd.to_string());
    put("model.n_head", model.n_head.to_string());
    put("model.seq_len", model.seq_len.to_string());
    put("model.vocab_size", model.vocab_size.to_string());
    put("data.train", format!("{} tokens", data.train_tokens));
    put(
        "data.valid",
        match data.valid_tokens {
            Some(n) => format!("{n} tokens"),
            None => "none".into(),
        },
    );
    put("train.seed", t.seed.to_string());
    put("train.global_batch", t.global_batch.to_string());
    put("train.lr", t.lr.to_string());
    put("train.min_lr", t.min_lr.to_string());
    put("train.warmup_steps", t.warmup_steps.to_string());
    // Unset, the decay follows train.steps: lengthening such a run changes its schedule.
    put(
        "train.decay_steps",
        t.decay_steps.unwrap_or(t.steps).to_string(),
    );
    put("train.weight_decay", t.weight_decay.to_string());
    put("train.beta1", t.beta1.to_string());
    put("train.beta2", t.beta2.to_string());
    put("train.eps", t.eps.to_string());
    put("train.grad_clip", t.grad_clip.to_string());
    put(
        "train.precision",
        format!("{:?}", t.precision).to_lowercase(),
    );
    put("zero.quantized_weights", z.quantized_weights.to_string());
    put(
        "zero.quantized_gradients",
        z.quantized_gradients.to_string(),
    );
    if z.quantized_weights {
        put("zero.weight_quant_block", z.weight_quant_block.to_string());
    }
    if z.quantized_gradients {
        put("zero.grad_quant_block", z.grad_quant_block.to_string());
        let until = (z.qgz_until * t.steps as f64).round() as u64;
        put(
            "zero.qgz_until",
            format!("{} (through step {until})", z.qgz_until),
        );
        put("zero.qgz_error_feedback", z.qgz_error_feedback.to_string());
    }
    Ok(s)
}

/// A checkpoint to resume from: its manifest, checked against this run; each rank reads its
/// part of it.
pub struct Resume {
    pub path: PathBuf,
    pub manifest: Manifest,
    /// The allowed changes of trajectory settings, as `key: old -> new`.
    pub changes: Vec<String>,
}

/// The newest checkpoint of the run, if it should resume from one, checked against `settings`
/// (this run's [`trajectory`]).
pub fn find(config: &RunConfig, settings: &BTreeMap<String, String>) -> Result<Option<Resume>> {
    if !config.checkpoint.resume {
        return Ok(None);
    }
    let Some(path) = checkpoint::newest(&config.checkpoint_dir())? else {
        return Ok(None);
    };
    let manifest = checkpoint::read_manifest(&path)?;
    let model_cfg = config.model_config()?;
    if manifest.model != (&model_cfg).into() {
        bail!(
            "checkpoint {} is of another model shape: {:?}",
            path.display(),
            manifest.model
        );
    }
    // Checkpoints written before settings were recorded are checked for their model only.
    let changes = if manifest.settings.is_empty() {
        Vec::new()
    } else {
        changes(
            &manifest.settings,
            settings,
            &config.checkpoint.allow_changes,
        )
        .map_err(|refused| {
            anyhow::anyhow!(
                "checkpoint {} was trained with other settings: {}; resuming would change \
                     the run's trajectory (list the key in checkpoint.allow_changes to accept)",
                path.display(),
                refused.join("; ")
            )
        })?
    };
    Ok(Some(Resume {
        path,
        manifest,
        changes,
    }))
}

/// The differences between a checkpoint's settings and this run's, as `key: old -> new`; the
/// ones `allowed` does not list are the error.
fn changes(
    saved: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
    allowed: &[String],
) -> std::result::Result<Vec<String>, Vec<String>> {
    let (mut accepted, mut refused) = (Vec::new(), Vec::new());
    for (key, old) in saved {
        // A key one side lacks belongs to a technique that side has off (qgZ's block): turning
        // the technique on or off is the change, under the technique's own key.
        let Some(new) = now.get(key) else {
            continue;
        };
        if old == new {
            continue;
        }
        let change = format!("{key}: {old} -> {new}");
        if allowed.iter().any(|a| a == key) {
            accepted.push(change);
        } else {
            refused.push(change);
        }
    }
    match refused.is_empty() {
        true => Ok(accepted),
        false => Err(refused),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_change_is_refused_unless_allowed() {
        let saved = settings(&[("train.lr", "0.0003"), ("train.seed", "1")]);
        let now = settings(&[("train.lr", "0.001"), ("train.seed", "1")]);
        assert_eq!(
            changes(&saved, &now, &[]),
            Err(vec!["train.lr: 0.0003 -> 0.001".to_string()])
        );
        assert_eq!(
            changes(&saved, &now, &["train.lr".into()]),
            Ok(vec!["train.lr: 0.0003 -> 0.001".to_string()])
        );
        assert_eq!(changes(&saved, &saved, &[]), Ok(vec![]));
        // Turning qgZ on is one change, not one for each of its keys.
        let off = settings(&[("zero.quantized_gradients", "false")]);
        let on = settings(&[
            ("zero.quantized_gradients", "true"),
            ("zero.grad_quant_block", "512"),
        ]);
        let e = changes(&off, &on, &[]).unwrap_err();
        assert_eq!(
            e,
            vec!["zero.quantized_gradients: false -> true".to_string()]
        );
        let with_other_block = settings(&[
            ("zero.quantized_gradients", "true"),
            ("zero.grad_quant_block", "256"),
        ]);
        let e = changes(&on, &with_other_block, &[]).unwrap_err();
        assert_eq!(e, vec!["zero.grad_quant_block: 512 -> 256".to_string()]);
    }

    #[test]
    fn the_decay_is_compared_as_resolved() {
        let data = DataSize {
            train_tokens: 100,
            valid_tokens: None,
        };
        let mut config = RunConfig::default();
        config.model.preset = Some("tiny".into());
        config.train.steps = 2000;
        let unset = trajectory(&config, data).unwrap();
        config.train.decay_steps = Some(2000);
        let set = trajectory(&config, data).unwrap();
        assert_eq!(changes(&unset, &set, &[]), Ok(vec![]));
        config.train.steps = 2050;
        assert_eq!(
            changes(&set, &trajectory(&config, data).unwrap(), &[]),
            Ok(vec![])
        );
    }

    #[test]
    fn only_trajectory_keys_other_than_the_model_may_change() {
        assert!(may_change("train.lr") && may_change("zero.qgz_until"));
        assert!(!may_change("model.n_embd") && !may_change("train.lrr"));
        assert!(
            !may_change("dist.world_size"),
            "not a trajectory key: needs no allowing"
        );
    }
}
