//! End-to-end tests of the divergence policy (docs/operations.md, "Divergence"): a step with a
//! non-finite gradient norm is skipped and logged, `train.max_skipped_steps` skips in a row stop
//! the run with one clear line, a non-finite validation loss stops it, and no checkpoint on disk
//! ever holds a NaN or inf, so that resuming never fails on load.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use safetensors::tensor::{Dtype, SafeTensors};

mod common;
use common::{error_line, metrics_lines, repo, small_corpus};

/// A small model at learning rate `lr` over 2 ranks on 2 nodes, every path inside `dir`, a
/// checkpoint every step; `extra` overrides on top.
fn run(dir: &Path, corpus: &Path, lr: &str, extra: &[&str]) -> Output {
    let sets = [
        "model.n_layer=2".to_string(),
        "model.n_embd=32".into(),
        "model.n_head=2".into(),
        "model.seq_len=32".into(),
        "train.micro_batch=2".into(),
        "train.global_batch=4".into(),
        "dist.world_size=2".into(),
        "dist.gpus_per_node=1".into(),
        "train.steps=30".into(),
        format!("train.lr={lr}"),
        "train.warmup_steps=0".into(),
        format!("data.train=[{:?}]", corpus.to_str().unwrap()),
        "data.valid_fraction=0.2".into(),
        "log.interval=5".into(),
        "log.eval_interval=0".into(),
        "log.eval_samples=8".into(),
        "log.progress=false".into(),
        "checkpoint.interval=1".into(),
        format!("log.dir={:?}", dir.join("run").to_str().unwrap()),
    ];
    let mut c = Command::new(env!("CARGO_BIN_EXE_trainer"));
    c.current_dir(repo()).env_remove("ZEROPP_KILL_AT_STEP");
    c.args(["--config", "configs/tiny.toml"]);
    for s in sets.iter().map(String::as_str).chain(extra.iter().copied()) {
        c.args(["--set", s]);
    }
    c.output().unwrap()
}

/// The steps of the training lines marked `skipped: true`.
fn skipped_steps(dir: &Path) -> Vec<u64> {
    metrics_lines(&dir.join("run"))
        .iter()
        .filter(|v| v.get("skipped") == Some(&serde_json::Value::Bool(true)))
        .map(|v| v["step"].as_u64().unwrap())
        .collect()
}

/// Checks every value of every checkpoint in the run is finite; returns their step folders.
fn assert_checkpoints_finite(dir: &Path) -> Vec<PathBuf> {
    let ckpts = dir.join("run/checkpoints");
    let mut steps = Vec::new();
    for entry in std::fs::read_dir(&ckpts).into_iter().flatten() {
        let step_dir = entry.unwrap().path();
        if !step_dir.is_dir() {
            // The folder's lock file.
            continue;
        }
        for file in std::fs::read_dir(&step_dir).unwrap() {
            let path = file.unwrap().path();
            if path.extension().is_none_or(|e| e != "safetensors") {
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            let st = SafeTensors::deserialize(&bytes).unwrap();
            for (name, view) in st.tensors() {
                assert_eq!(view.dtype(), Dtype::F32);
                let bad = view
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .position(|v| !v.is_finite());
                assert_eq!(bad, None, "{} {name}", path.display());
            }
        }
        steps.push(step_dir);
    }
    steps.sort();
    steps
}

/// (a) + (b): lr 1e30 blows the weights up to about 1e30 in one step; the next steps' gradient
/// norms are not finite, so they are skipped, logged as skipped (off `log.interval` too) and
/// said on stderr, until `max_skipped_steps` (default 10) in a row stop the run naming the last
/// checkpoint. Every checkpoint is finite, and resuming from the last one loads and stops
/// again the same way instead of failing on load.
#[test]
fn diverging_run_skips_steps_stops_and_leaves_only_finite_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let out = run(dir.path(), &corpus, "1e30", &[]);
    let line = error_line(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        line.contains("stopping: 10 steps in a row had a non-finite gradient norm (last at step ")
            && line.contains("the last checkpoint is ")
            && line.contains("step_000000")
            && line.ends_with("lower train.lr or check the data"),
        "{line}"
    );
    assert!(
        stderr.contains("non-finite gradient norm")
            && stderr.contains("step skipped (10 in a row)"),
        "{stderr}"
    );
    let skipped = skipped_steps(dir.path());
    assert_eq!(skipped.len(), 10, "{skipped:?}");
    assert!(
        skipped.windows(2).all(|w| w[1] == w[0] + 1),
        "ten in a row, each with its line: {skipped:?}"
    );
    let last = *skipped.last().unwrap();
    assert!(line.contains(&format!("(last at step {last})")), "{line}");
    // Healthy lines carry no `skipped` key at all.
    assert!(metrics_lines(&dir.path().join("run"))
        .iter()
        .filter(|v| v.get("loss").is_some() && !skipped.contains(&v["step"].as_u64().unwrap()))
        .all(|v| v.get("skipped").is_none()));
    let ckpts = assert_checkpoints_finite(dir.path());
    assert!(!ckpts.is_empty());
    let newest = ckpts.last().unwrap();
    assert!(
        line.contains(newest.file_name().unwrap().to_str().unwrap()),
        "{line} names {}",
        newest.display()
    );

    let again = run(dir.path(), &corpus, "1e30", &["checkpoint.resume=true"]);
    let line = error_line(&again);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("resumed from"), "{stderr}");
    assert!(line.contains("stopping: 10 steps in a row"), "{line}");
    assert_checkpoints_finite(dir.path());
}

/// (c): with `train.max_skipped_steps = 2` the run stops at the second skip in a row; 0 is
/// refused.
#[test]
fn max_skipped_steps_sets_when_the_run_stops() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let out = run(dir.path(), &corpus, "1e30", &["train.max_skipped_steps=2"]);
    let line = error_line(&out);
    assert!(line.contains("stopping: 2 steps in a row"), "{line}");
    assert_eq!(skipped_steps(dir.path()).len(), 2);
    assert_checkpoints_finite(dir.path());

    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let out = run(&other, &corpus, "1e-3", &["train.max_skipped_steps=0"]);
    assert!(error_line(&out).contains("train.max_skipped_steps"));
}

/// A learning rate past f32's range makes the weights infinite in one step with a finite
/// gradient norm: the checkpoint of that step is refused on every rank, naming the tensor, and
/// nothing of it is written.
#[test]
fn a_non_finite_state_is_never_checkpointed() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let out = run(dir.path(), &corpus, "1e40", &[]);
    let line = error_line(&out);
    assert!(
        line.contains("stopping: state tensor ")
            && line.contains(".master holds a non-finite value on rank 0 after step 1")
            && line.contains("so step 1 is not checkpointed; no checkpoint was written"),
        "{line}"
    );
    assert!(assert_checkpoints_finite(dir.path()).is_empty());
}

/// A non-finite validation loss (here of the infinite weights of lr 1e40) stops the run at its
/// step, before that step's checkpoint is written.
#[test]
fn a_non_finite_validation_loss_stops_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let out = run(dir.path(), &corpus, "1e40", &["log.eval_interval=1"]);
    let line = error_line(&out);
    assert!(
        line.contains("stopping: the validation loss at step 1 is ")
            && line.contains("no checkpoint was written"),
        "{line}"
    );
    assert!(assert_checkpoints_finite(dir.path()).is_empty());
}
