//! The checkpoint folder as a run owns it (issue 24): one run per `checkpoint.dir`, a manifest
//! checked against its folder and its rank files, retention that counts complete checkpoints
//! only, and a diverging run that keeps its last good checkpoint.

use std::path::{Path, PathBuf};

mod common;
use common::{
    assert_ok, copy_dir, error_line, run_with, small_corpus, small_model_run, spawn_slow, stderr,
    step_names, trainer, wait_for_step,
};

/// A small model over `world` ranks (one a node), its run folder `log`, every path in a
/// tempdir; the tests add `train.steps`, the checkpoint keys and whatever else they need.
fn small_run(log: &Path, corpus: &Path, world: usize) -> Vec<String> {
    let mut sets = small_model_run(log, corpus);
    sets.extend([
        "train.micro_batch=2".into(),
        "train.global_batch=4".into(),
        format!("dist.world_size={world}"),
        "dist.gpus_per_node=1".into(),
        "train.lr=1e-3".into(),
        "train.warmup_steps=2".into(),
        "log.eval_interval=0".into(),
        "log.eval_samples=8".into(),
    ]);
    sets
}

/// Item 2: a second run with another `log.dir` and the first's `checkpoint.dir` is refused at
/// once, in one line naming the folder, the holder and the key to change; the first run goes
/// on and ends with the checkpoints it would have had alone.
#[test]
fn a_second_run_into_the_same_checkpoint_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let shared = dir.path().join("shared-checkpoints");
    let ckpt = format!("checkpoint.dir={:?}", shared.to_str().unwrap());
    // 9 steps of at least 250 ms left once the second starts: it meets a running first run.
    let extra = [
        "train.steps=12",
        "checkpoint.interval=2",
        "checkpoint.keep_last=2",
        &ckpt,
    ];
    let first_log = dir.path().join("first");
    let mut first = spawn_slow(&small_run(&first_log, &corpus, 1), &extra, 250);
    wait_for_step(&mut first, &first_log, 3);

    let second_log = dir.path().join("second");
    let second = run_with(&small_run(&second_log, &corpus, 1), &extra);
    let err = stderr(&second);
    assert!(
        err.contains(&format!("{} is in use by another run", shared.display()))
            && err.contains(&format!("pid {}", first.id()))
            && err.trim_end().ends_with("or choose another checkpoint.dir")
            && err.lines().count() == 1,
        "{err}"
    );
    assert!(!second_log.join("metrics.jsonl").exists());

    let out = first.wait_with_output().unwrap();
    assert_ok(&out);
    assert_eq!(step_names(&shared), ["step_00000010", "step_00000012"]);
}

/// Item 3: a manifest is checked against its folder's step, its file list against rank order,
/// and each rank file's own step and rank against the manifest; each disagreement refuses the
/// resume (and `trainer export`) in one line naming the file, before anything is written.
#[test]
fn a_manifest_that_disagrees_with_its_folder_or_its_files_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let log = dir.path().join("run");
    let sets = small_run(&log, &corpus, 2);
    assert_ok(&run_with(
        &sets,
        &[
            "train.steps=4",
            "checkpoint.interval=2",
            "train.decay_steps=6",
        ],
    ));
    let step4 = log.join("checkpoints/step_00000004");
    let manifest_path = step4.join("manifest.json");
    let original = std::fs::read_to_string(&manifest_path).unwrap();
    let metrics = std::fs::read(log.join("metrics.jsonl")).unwrap();
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut json: serde_json::Value = serde_json::from_str(&original).unwrap();
        f(&mut json);
        std::fs::write(&manifest_path, json.to_string()).unwrap();
    };
    let resume = || {
        run_with(
            &sets,
            &[
                "train.steps=6",
                "checkpoint.interval=2",
                "train.decay_steps=6",
            ],
        )
    };
    let export = |from: &Path| {
        trainer()
            .args(["export", "--checkpoint"])
            .arg(from)
            .arg("--output")
            .arg(dir.path().join("model.safetensors"))
            .output()
            .unwrap()
    };

    // The folder of step 4 with a manifest saying step 3.
    edit(&|m| m["step"] = 3.into());
    let line = error_line(&resume());
    assert!(
        line.contains(&format!(
            "{} says step 3, its folder is step 4",
            manifest_path.display()
        )) && line.ends_with("move the folder aside to resume from the checkpoint before it"),
        "{line}"
    );
    assert!(error_line(&export(&step4)).contains("says step 3, its folder is step 4"));

    // The file list reordered, checksums with it: each rank would load the other's shard.
    edit(&|m| {
        m["files"].as_array_mut().unwrap().reverse();
        m["checksums"].as_array_mut().unwrap().reverse();
    });
    let line = error_line(&resume());
    assert!(
        line.contains(
            "lists rank_00001.safetensors as rank 0's file, which is rank_00000.safetensors"
        ),
        "{line}"
    );
    assert!(error_line(&export(&step4)).contains("as rank 0's file"));

    // The rank files swapped on disk, checksums with them: the names are in rank order, the
    // files' own ranks are not.
    edit(&|m| m["checksums"].as_array_mut().unwrap().reverse());
    let (a, b) = (
        step4.join("rank_00000.safetensors"),
        step4.join("rank_00001.safetensors"),
    );
    let aside = dir.path().join("aside.safetensors");
    std::fs::rename(&a, &aside).unwrap();
    std::fs::rename(&b, &a).unwrap();
    std::fs::rename(&aside, &b).unwrap();
    // Both ranks refuse their file; the first to fail is the one reported.
    let line = error_line(&resume());
    let refused = |file: &Path, own: usize, read_as: usize| {
        format!(
            "{} is step 4's file of rank {own}, the manifest reads it as step 4's of rank {read_as}",
            file.display()
        )
    };
    assert!(
        line.contains(&refused(&a, 1, 0)) || line.contains(&refused(&b, 0, 1)),
        "{line}"
    );
    assert!(error_line(&export(&step4)).contains("is step 4's file of rank 1"));

    // Nothing was written by the refused resumes; put right, the checkpoint resumes.
    assert_eq!(std::fs::read(log.join("metrics.jsonl")).unwrap(), metrics);
    assert_eq!(
        step_names(&log.join("checkpoints")),
        ["step_00000002", "step_00000004"]
    );
    std::fs::rename(&a, &aside).unwrap();
    std::fs::rename(&b, &a).unwrap();
    std::fs::rename(&aside, &b).unwrap();
    std::fs::write(&manifest_path, &original).unwrap();
    let out = resume();
    assert_ok(&out);
    assert!(stderr(&out).contains("resumed from"), "{}", stderr(&out));
}

/// Item 6: an empty `step_<N>` folder newer than the run takes no place among the newest
/// `keep_last`, is not deleted, and is reported once.
#[test]
fn retention_counts_complete_checkpoints_only() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let log = dir.path().join("run");
    let checkpoints = log.join("checkpoints");
    let stray = checkpoints.join("step_00000100");
    std::fs::create_dir_all(&stray).unwrap();
    let out = run_with(
        &small_run(&log, &corpus, 1),
        &[
            "train.steps=5",
            "checkpoint.interval=1",
            "checkpoint.keep_last=2",
        ],
    );
    assert_ok(&out);
    assert_eq!(
        step_names(&checkpoints),
        ["step_00000004", "step_00000005", "step_00000100"]
    );
    let err = stderr(&out);
    let reports: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(&stray.display().to_string()))
        .collect();
    assert_eq!(reports.len(), 1, "reported once: {err}");
    assert!(
        reports[0].contains("does not count it in checkpoint.keep_last")
            && reports[0].contains("not a checkpoint (no manifest.json)"),
        "{}",
        reports[0]
    );
}

/// Item 2, the second line of defence: checkpoints of another run copied into a folder (no
/// lock can see that) are neither deleted by this run's retention nor replaced by its commit.
#[test]
fn a_checkpoint_this_run_did_not_write_is_never_deleted_nor_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let other = dir.path().join("other");
    assert_ok(&run_with(
        &small_run(&other, &corpus, 1),
        &[
            "train.steps=4",
            "checkpoint.interval=1",
            "checkpoint.keep_last=0",
        ],
    ));
    let shared = dir.path().join("shared");
    for step in ["step_00000001", "step_00000004"] {
        copy_dir(&other.join("checkpoints").join(step), &shared.join(step));
    }
    let foreign = std::fs::read(shared.join("step_00000004/rank_00000.safetensors")).unwrap();

    let log = dir.path().join("run");
    let out = run_with(
        &small_run(&log, &corpus, 1),
        &[
            "train.steps=6",
            "checkpoint.interval=2",
            "checkpoint.keep_last=1",
            "checkpoint.resume=false",
            &format!("checkpoint.dir={:?}", shared.to_str().unwrap()),
        ],
    );
    let line = error_line(&out);
    let step4 = shared.join("step_00000004");
    assert!(
        line.contains(&format!(
            "cannot write checkpoint {}: the folder exists and is a checkpoint of another run (run id ",
            step4.display()
        )) && line.ends_with("move it aside, or choose another checkpoint.dir"),
        "{line}"
    );
    let err = stderr(&out);
    let step1 = shared.join("step_00000001").display().to_string();
    assert_eq!(
        err.lines().filter(|l| l.contains(&step1)).count(),
        1,
        "the other run's step 1 is reported once: {err}"
    );
    assert_eq!(
        step_names(&shared),
        ["step_00000001", "step_00000002", "step_00000004"]
    );
    assert_eq!(
        std::fs::read(step4.join("rank_00000.safetensors")).unwrap(),
        foreign
    );
}

/// Item 8, the command on the small model: step 1's update takes the weights to about
/// 1e28 with a finite norm, every later step is skipped. Only step 1 is checkpointed; the
/// checkpoints due after a skipped step are withheld, each said on stderr, and the stop line of
/// the NaN validation loss names step 1. Without validation the run ends with no
/// checkpoint of its last step, and a signal in the streak stops it naming step 1.
#[test]
fn a_diverging_run_keeps_its_last_good_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let diverge = [
        "train.steps=8",
        "checkpoint.interval=1",
        "train.lr=1e30",
        "train.min_lr=1e29",
        "train.warmup_steps=0",
        "train.grad_clip=0.0",
    ];
    let log = dir.path().join("run");
    let out = run_with(&small_run(&log, &corpus, 2), &diverge);
    let line = error_line(&out);
    let checkpoints = log.join("checkpoints");
    let step1 = checkpoints.join("step_00000001");
    assert!(
        line.contains("stopping: the validation loss at step 8 is NaN")
            && line.contains(&format!("the last checkpoint is {} — ", step1.display())),
        "{line}"
    );
    assert_eq!(step_names(&checkpoints), ["step_00000001"]);
    let err = stderr(&out);
    for step in 2..=7 {
        let withheld = format!(
            "step {step}: no checkpoint, its loss or gradient norm was not finite; the last \
             checkpoint is {}",
            step1.display()
        );
        assert!(err.contains(&withheld), "{withheld} in {err}");
    }

    // No validation: the run ends, its last step not checkpointed.
    let log = dir.path().join("no-valid");
    let out = run_with(
        &small_run(&log, &corpus, 2),
        &[&diverge[..], &["log.eval_samples=0"]].concat(),
    );
    assert_ok(&out);
    assert!(
        stderr(&out).contains("step 8: no checkpoint"),
        "{}",
        stderr(&out)
    );
    assert_eq!(step_names(&log.join("checkpoints")), ["step_00000001"]);

    // A signal in the streak: no checkpoint of the step it stops after; the line names step 1.
    let log = dir.path().join("signal");
    let mut child = spawn_slow(&small_run(&log, &corpus, 2), &diverge, 300);
    wait_for_step(&mut child, &log, 3);
    let out = common::stop_with_sigterm(child);
    let err = stderr(&out);
    let step1: PathBuf = log.join("checkpoints/step_00000001");
    assert!(
        err.contains(&format!(
            "checkpoint {}; run the same command",
            step1.display()
        )),
        "{err}"
    );
    assert_eq!(step_names(&log.join("checkpoints")), ["step_00000001"]);
}
