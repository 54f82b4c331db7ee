//! Resuming a run: the newest checkpoint, checked against this run's config.
//!
//! Each checkpoint records the settings that fix the run's trajectory ([`trajectory`]): the
//! model, the data (each token stream's count and fingerprint, and the tokenizer's), the seed,
//! the batch, the optimizer and its schedule, and the ZeRO++ quantisation. A resume that
//! changes one is refused with a line naming the key, unless
//! `checkpoint.allow_changes` lists it; the world size may change freely (the shards are
//! re-sliced, [`checkpoint::reshard`]), as may anything that only moves float rounding.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Result};

use data::TokenCorpus;

use checkpoint::{self, Manifest};
use run::config::RunConfig;
use run::Run;

/// What the data is, for [`trajectory`]: the token streams' counts and fingerprints, and the
/// tokenizer's fingerprint. Paths are not recorded (data may move between launches); content
/// is, so other documents of the same token count, or another tokenizer, are noticed.
#[derive(Clone, Copy, Debug)]
pub struct DataSize {
    pub train: Tokens,
    /// `None` when the run has no validation data.
    pub valid: Option<Tokens>,
    /// [`data::Tokenizer::fingerprint`], when a `.jsonl` source needed the tokenizer (a run on
    /// Megatron datasets only reads token ids and records none).
    pub tokenizer: Option<u32>,
}

/// One token stream as a checkpoint records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tokens {
    pub count: usize,
    /// [`TokenCorpus::fingerprint`]: a CRC-32 of every token, in order.
    pub fingerprint: u32,
}

impl Tokens {
    /// The count and fingerprint of `corpus` (hashes every token, in parallel).
    pub fn of(corpus: &TokenCorpus) -> Self {
        Tokens {
            count: corpus.tokens.len(),
            fingerprint: corpus.fingerprint(),
        }
    }

    /// The recorded text, `"9344 tokens, fingerprint 1a2b3c4d"`. Checkpoints of older versions
    /// hold the count alone; [`agree`] compares only what both sides recorded.
    fn value(self) -> String {
        format!(
            "{} tokens, fingerprint {:08x}",
            self.count, self.fingerprint
        )
    }
}

/// The settings that fix this run's trajectory, each as a config key and its value's text.
/// Values are as resolved: the model's sizes after its preset, the decay after its default.
pub fn trajectory(run: &Run, data: DataSize) -> BTreeMap<String, String> {
    let (config, model) = (&run.config, &run.model);
    let t = &config.train;
    let z = &config.zero;
    let mut s = BTreeMap::new();
    let mut put = |key: &str, value: String| s.insert(key.to_string(), value);
    put("model.n_layer", model.n_layer.to_string());
    put("model.n_embd", model.n_embd.to_string());
    put("model.n_head", model.n_head.to_string());
    put("model.seq_len", model.seq_len.to_string());
    put("model.vocab_size", model.vocab_size.to_string());
    // Each family adds its own settings (model::Family::trajectory; none for a family whose
    // checkpoints predate the registry, so that they still agree).
    for (key, value) in model.family().trajectory(model) {
        put(key, value);
    }
    put("data.train", data.train.value());
    put(
        "data.valid",
        data.valid.map_or_else(|| "none".into(), Tokens::value),
    );
    if let Some(fingerprint) = data.tokenizer {
        put("data.tokenizer", format!("fingerprint {fingerprint:08x}"));
    }
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
    // A checkpoint from before the key lacks it, and a key one side lacks is not compared: it
    // resumes as the fp32 it was trained with.
    put("zero.reduce_dtype", z.reduce_dtype.name().to_string());
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
    s
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
pub fn find(run: &Run, settings: &BTreeMap<String, String>) -> Result<Option<Resume>> {
    let config = &run.config;
    if !config.checkpoint.resume {
        return Ok(None);
    }
    let Some(path) = checkpoint::newest(&config.checkpoint_dir())? else {
        return Ok(None);
    };
    let manifest = checkpoint::read_manifest(&path)?;
    if manifest.model.legacy_layout() {
        bail!(
            "checkpoint {} holds q, k, v, gate and up as a matrix each, as trainers before the \
             packed projections wrote them: export it (`trainer export --checkpoint {0} --output \
             DIR/model.safetensors` converts it), then start a run from DIR with model.init_from \
             and another checkpoint.dir",
            path.display()
        );
    }
    if manifest.model != (&run.model).into() {
        bail!(
            "checkpoint {} is of another model shape: {}",
            path.display(),
            shape_changes(&manifest.model, run)
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
                     the run's trajectory (list the key in checkpoint.allow_changes to accept){}",
                path.display(),
                refused.join("; "),
                how_to_extend(config, &manifest.settings, settings)
            )
        })?
    };
    Ok(Some(Resume {
        path,
        manifest,
        changes,
    }))
}

/// How this run's model differs from the checkpoint's `saved` one, as the keys a user changes:
/// `model.vocab_size: 50304 -> 50432`, the tokenizer named where it gave the vocabulary.
fn shape_changes(saved: &model::ShapeRecord, run: &Run) -> String {
    let Ok(old) = saved.config() else {
        return format!("{saved:?}");
    };
    let new = &run.model;
    if old.arch != new.arch {
        return format!("model.arch: {} -> {}", old.arch.name(), new.arch.name());
    }
    let keys: [(&str, String, String); 11] = [
        ("n_layer", old.n_layer.to_string(), new.n_layer.to_string()),
        ("n_embd", old.n_embd.to_string(), new.n_embd.to_string()),
        ("n_head", old.n_head.to_string(), new.n_head.to_string()),
        (
            "n_kv_head",
            old.n_kv_head.to_string(),
            new.n_kv_head.to_string(),
        ),
        (
            "ffn_hidden",
            old.ffn_hidden.to_string(),
            new.ffn_hidden.to_string(),
        ),
        ("seq_len", old.seq_len.to_string(), new.seq_len.to_string()),
        (
            "vocab_size",
            old.vocab_size.to_string(),
            new.vocab_size.to_string(),
        ),
        (
            "norm_eps",
            old.norm_eps.to_string(),
            new.norm_eps.to_string(),
        ),
        (
            "rope_theta",
            old.rope_theta.to_string(),
            new.rope_theta.to_string(),
        ),
        (
            "tie_embeddings",
            old.tie_embeddings.to_string(),
            new.tie_embeddings.to_string(),
        ),
        ("arch", old.arch.name().into(), new.arch.name().into()),
    ];
    let mut changed: Vec<String> = keys
        .iter()
        .filter(|(_, a, b)| a != b)
        .map(|(key, a, b)| {
            let from = match (*key, run.vocab_from_tokenizer) {
                ("vocab_size", true) => format!(
                    " (the vocabulary of data.tokenizer = {}, padded to a multiple of 128)",
                    run.config.data.tokenizer.display()
                ),
                _ => String::new(),
            };
            format!("model.{key}: {a} -> {b}{from}")
        })
        .collect();
    if changed.is_empty() {
        changed.push(format!("{saved:?}"));
    }
    changed.join(", ")
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
        if agree(key, old, new) {
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

/// Whether a checkpoint's value of `key` and this run's agree. A `data.train` / `data.valid`
/// value is a token count and, since checkpoints record it, a fingerprint: a checkpoint of an
/// older version (`"9344 tokens"`) agrees with this run's value of the same count. A
/// `zero.qgz_until` value is a fraction and the step it ends qgZ at; the step is what the
/// engine follows, so `0.5 (through step 100)` agrees with `0.333 (through step 100)`.
fn agree(key: &str, old: &str, new: &str) -> bool {
    if old == new {
        return true;
    }
    match key {
        "data.train" | "data.valid" => {
            let ((old_count, old_fp), (new_count, new_fp)) = (data_facts(old), data_facts(new));
            old_count == new_count && (old_fp.is_none() || new_fp.is_none() || old_fp == new_fp)
        }
        "zero.qgz_until" => matches!(
            (qgz_until(old), qgz_until(new)),
            (Some((_, a)), Some((_, b))) if a == b
        ),
        _ => false,
    }
}

/// A recorded `data.train` / `data.valid`, `"9344 tokens, fingerprint 1a2b3c4d"`, as its count
/// and its fingerprint (`None` in the checkpoints of older versions, and for `"none"`).
fn data_facts(value: &str) -> (&str, Option<&str>) {
    match value.split_once(", fingerprint ") {
        Some((count, fingerprint)) => (count, Some(fingerprint)),
        None => (value, None),
    }
}

/// A recorded `zero.qgz_until`, `"0.5 (through step 100)"`, as its fraction's text and step.
fn qgz_until(value: &str) -> Option<(&str, u64)> {
    let (fraction, rest) = value.split_once(" (through step ")?;
    let step = rest.strip_suffix(')')?.parse().ok()?;
    Some((fraction, step))
}

/// For a resume refused because another `train.steps` moved the schedule (`train.decay_steps`
/// left unset follows `train.steps`, `zero.qgz_until` is a fraction of it), typically a
/// finished run asked to train longer: the `--set`s that keep the run's schedule, and the keys
/// to allow to fit it to the new length instead, as `"; to train to step N ..."`. Empty when
/// the refusal has another cause, or when the user asked for the new value.
fn how_to_extend(
    config: &RunConfig,
    saved: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> String {
    let steps = config.train.steps;
    let allowed = |key: &str| config.checkpoint.allow_changes.iter().any(|a| a == key);
    let moved = |key: &str| match (saved.get(key), now.get(key)) {
        (Some(old), Some(new)) => !agree(key, old, new) && !allowed(key),
        _ => false,
    };
    let (mut sets, mut kept, mut keys) = (Vec::new(), Vec::new(), Vec::new());
    if config.train.decay_steps.is_none() && moved("train.decay_steps") {
        let old = &saved["train.decay_steps"];
        sets.push(format!("--set train.decay_steps={old}"));
        kept.push(format!(
            "the learning rate stays at train.min_lr after step {old}"
        ));
        keys.push("train.decay_steps");
    }
    if moved("zero.qgz_until") {
        // The same fraction through another step: the new length moved it. A step past the
        // new end has no fraction that keeps it.
        let old = qgz_until(&saved["zero.qgz_until"]);
        let new = qgz_until(&now["zero.qgz_until"]);
        if let (Some((old_fraction, step)), Some((new_fraction, _))) = (old, new) {
            if old_fraction == new_fraction && step <= steps {
                let fraction = fraction_through(step, steps);
                sets.push(format!("--set zero.qgz_until={fraction}"));
                kept.push(format!("qgZ still ends after step {step}"));
                keys.push("zero.qgz_until");
            }
        }
    }
    if sets.is_empty() {
        return String::new();
    }
    format!(
        "; to train to step {steps} on the schedule it had, add {} ({}); to fit the schedule \
         to train.steps = {steps} instead, list {} in checkpoint.allow_changes",
        sets.join(" "),
        kept.join("; "),
        keys.join(" and "),
    )
}

/// The shortest decimal `f` with `round(f * steps) == step`: the `zero.qgz_until` that ends
/// qgZ after `step` in a run of `steps`.
fn fraction_through(step: u64, steps: u64) -> String {
    let exact = step as f64 / steps.max(1) as f64;
    (1..=17)
        .map(|digits| format!("{exact:.digits$}"))
        .map(|text| text.trim_end_matches('0').trim_end_matches('.').to_string())
        .find(|text| {
            text.parse::<f64>()
                .is_ok_and(|f| (f * steps as f64).round() as u64 == step)
        })
        .unwrap_or_else(|| exact.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use run::config::may_change;

    /// [`trajectory`] of `config`, resolved.
    fn trajectory_of(config: &RunConfig, data: DataSize) -> BTreeMap<String, String> {
        trajectory(&Run::resolve(config.clone(), None).unwrap(), data)
    }

    fn settings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A resume of another model shape names each key that differs; another architecture is
    /// named alone (its other sizes mean other things).
    #[test]
    fn a_shape_change_names_its_keys() {
        let mut config = RunConfig::default();
        config.model.preset = Some("llama-tiny".into());
        let run = Run::resolve(config, None).unwrap();
        let gpt2 = model::ModelConfig::gpt2(2, 64, 4, 64, 50304);
        assert_eq!(
            shape_changes(&(&gpt2).into(), &run),
            "model.arch: gpt2 -> llama"
        );
        let mut llama = run.model.clone();
        llama.n_kv_head = 4;
        llama.rope_theta = 10_000.0;
        assert_eq!(
            shape_changes(&(&llama).into(), &run),
            "model.n_kv_head: 4 -> 2, model.rope_theta: 10000 -> 500000"
        );
    }

    /// A Llama checkpoint of the unpacked projections (its record without `packed`) is refused
    /// in one line that says how to carry it over; this trainer's own resumes.
    #[test]
    fn a_checkpoint_of_unpacked_projections_is_refused_with_its_conversion() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = RunConfig::default();
        config.model.preset = Some("llama-tiny".into());
        config.checkpoint.dir = Some(dir.path().to_path_buf());
        config.checkpoint.resume = true;
        let run = Run::resolve(config, None).unwrap();
        let topology = comm::Topology::new(1, 1).unwrap();
        let m = checkpoint::manifest(1, 0, topology, &run.model, 1, &Default::default(), &[], "r");
        let ckpt = checkpoint::step_dir(dir.path(), 1);
        std::fs::create_dir_all(&ckpt).unwrap();
        let mut json = serde_json::to_value(&m).unwrap();
        std::fs::write(ckpt.join("manifest.json"), json.to_string()).unwrap();
        assert!(find(&run, &BTreeMap::new()).unwrap().is_some());
        json["model"]["llama"]
            .as_object_mut()
            .unwrap()
            .remove("packed");
        std::fs::write(ckpt.join("manifest.json"), json.to_string()).unwrap();
        let Err(e) = find(&run, &BTreeMap::new()) else {
            panic!("resumed");
        };
        let e = format!("{e:#}");
        assert!(
            e.contains("as a matrix each") && e.contains("trainer export") && !e.contains('\n'),
            "{e}"
        );
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

    /// `zero.reduce_dtype` is recorded whatever its value, so a change is refused unless
    /// allowed; a checkpoint from before the key resumes under either.
    #[test]
    fn a_change_of_reduce_dtype_is_refused_unless_allowed() {
        let data = DataSize {
            train: Tokens {
                count: 100,
                fingerprint: 7,
            },
            valid: None,
            tokenizer: None,
        };
        let mut config = RunConfig::default();
        config.model.preset = Some("tiny".into());
        let fp32 = trajectory_of(&config, data);
        assert_eq!(
            fp32.get("zero.reduce_dtype").map(String::as_str),
            Some("fp32")
        );
        config.zero.reduce_dtype = zero::ReduceDtype::Bf16;
        let bf16 = trajectory_of(&config, data);
        let change = vec!["zero.reduce_dtype: fp32 -> bf16".to_string()];
        assert_eq!(changes(&fp32, &bf16, &[]), Err(change.clone()));
        assert!(may_change("zero.reduce_dtype"));
        let allowed = ["zero.reduce_dtype".to_string()];
        assert_eq!(changes(&fp32, &bf16, &allowed), Ok(change));
        let mut old = fp32.clone();
        old.remove("zero.reduce_dtype");
        assert_eq!(changes(&old, &bf16, &[]), Ok(vec![]));
    }

    #[test]
    fn the_decay_is_compared_as_resolved() {
        let data = DataSize {
            train: Tokens {
                count: 100,
                fingerprint: 7,
            },
            valid: None,
            tokenizer: None,
        };
        let mut config = RunConfig::default();
        config.model.preset = Some("tiny".into());
        config.train.steps = 2000;
        let unset = trajectory_of(&config, data);
        config.train.decay_steps = Some(2000);
        let set = trajectory_of(&config, data);
        assert_eq!(changes(&unset, &set, &[]), Ok(vec![]));
        config.train.steps = 2050;
        assert_eq!(
            changes(&set, &trajectory_of(&config, data), &[]),
            Ok(vec![])
        );
    }

    #[test]
    fn data_is_compared_by_count_and_fingerprint_and_old_checkpoints_by_count() {
        let recorded = |train: &str, tokenizer: Option<&str>| {
            let mut s = settings(&[("data.train", train), ("data.valid", "none")]);
            if let Some(t) = tokenizer {
                s.insert("data.tokenizer".into(), t.into());
            }
            s
        };
        let now = recorded(
            "9344 tokens, fingerprint 1a2b3c4d",
            Some("fingerprint 00c0ffee"),
        );
        assert_eq!(changes(&now, &now, &[]), Ok(vec![]));
        // A checkpoint of an older version: the count alone, and no tokenizer.
        assert_eq!(
            changes(&recorded("9344 tokens", None), &now, &[]),
            Ok(vec![])
        );
        assert_eq!(
            changes(&recorded("9345 tokens", None), &now, &[]),
            Err(vec![
                "data.train: 9345 tokens -> 9344 tokens, fingerprint 1a2b3c4d".to_string()
            ])
        );
        let other_documents = recorded(
            "9344 tokens, fingerprint 99999999",
            Some("fingerprint 00c0ffee"),
        );
        assert_eq!(
            changes(&other_documents, &now, &[]),
            Err(vec![
                "data.train: 9344 tokens, fingerprint 99999999 -> 9344 tokens, \
                      fingerprint 1a2b3c4d"
                    .to_string()
            ])
        );
        let other_tokenizer = recorded(
            "9344 tokens, fingerprint 1a2b3c4d",
            Some("fingerprint 12345678"),
        );
        assert_eq!(
            changes(&other_tokenizer, &now, &["data.tokenizer".into()]),
            Ok(vec![
                "data.tokenizer: fingerprint 12345678 -> fingerprint 00c0ffee".to_string()
            ])
        );
        // The same tokens from a Megatron dataset: no tokenizer now, nothing to compare.
        let indexed = recorded("9344 tokens, fingerprint 1a2b3c4d", None);
        assert_eq!(changes(&now, &indexed, &[]), Ok(vec![]));
        assert!(may_change("data.tokenizer"));
    }

    #[test]
    fn a_longer_run_is_told_how_to_keep_or_stretch_its_schedule() {
        let data = DataSize {
            train: Tokens {
                count: 100,
                fingerprint: 7,
            },
            valid: None,
            tokenizer: None,
        };
        let mut config = RunConfig::default();
        config.model.preset = Some("tiny".into());
        config.train.steps = 200;
        config.zero.quantized_gradients = true;
        config.zero.qgz_until = 0.5;
        let saved = trajectory_of(&config, data);
        config.train.steps = 300;
        let now = trajectory_of(&config, data);
        assert_eq!(
            how_to_extend(&config, &saved, &now),
            "; to train to step 300 on the schedule it had, add --set train.decay_steps=200 \
             --set zero.qgz_until=0.333 (the learning rate stays at train.min_lr after step \
             200; qgZ still ends after step 100); to fit the schedule to train.steps = 300 \
             instead, list train.decay_steps and zero.qgz_until in checkpoint.allow_changes"
        );
        // Following the advice resumes.
        config.train.decay_steps = Some(200);
        config.zero.qgz_until = 0.333;
        let kept = trajectory_of(&config, data);
        assert_eq!(changes(&saved, &kept, &[]), Ok(vec![]));
        assert_eq!(how_to_extend(&config, &saved, &kept), "");
        // A decay the user set to another value is a change asked for: no advice about it.
        config.train.decay_steps = Some(250);
        let asked = trajectory_of(&config, data);
        assert_eq!(how_to_extend(&config, &saved, &asked), "");
        // Shorter, with qgZ through step 200 of 200: no fraction keeps that end.
        config.train.decay_steps = None;
        config.train.steps = 200;
        config.zero.qgz_until = 1.0;
        let saved = trajectory_of(&config, data);
        config.train.steps = 150;
        let shorter = trajectory_of(&config, data);
        let advice = how_to_extend(&config, &saved, &shorter);
        assert!(
            advice.contains("add --set train.decay_steps=200 (")
                && !advice.contains("--set zero.qgz_until"),
            "{advice}"
        );
    }

    #[test]
    fn the_fraction_through_a_step_is_the_shortest_that_rounds_back() {
        assert_eq!(fraction_through(100, 300), "0.333");
        assert_eq!(fraction_through(100, 200), "0.5");
        assert_eq!(fraction_through(0, 300), "0");
        assert_eq!(fraction_through(300, 300), "1");
        assert_eq!(fraction_through(1, 7), "0.1");
        assert_eq!(fraction_through(3, 7), "0.4");
    }
}
