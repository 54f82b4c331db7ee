//! A resume reads the inputs the run was trained on (issue 24): the data's and the tokenizer's
//! fingerprints in the manifest, the metrics file's damaged lines reported, and prepare-data's
//! memory bounded on documents without whitespace; and a finished run asked to train longer
//! is told how to do it on purpose (docs/operations.md, "Resuming with other settings").

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

mod common;
use common::{
    assert_ok, copy_dir, metrics_lines, repo, run_with, small_corpus, small_model_run, stderr,
    trainer,
};

/// A small model on one rank, trained on `train` into `run`, with a schedule that does not
/// follow `train.steps` (so that only what a test changes is a change).
fn small_run(run: &Path, train: &Path, steps: u64) -> Vec<String> {
    let mut sets = small_model_run(run, train);
    sets.extend([
        "train.micro_batch=4".into(),
        "train.global_batch=8".into(),
        "dist.world_size=1".into(),
        "dist.gpus_per_node=1".into(),
        format!("train.steps={steps}"),
        "train.decay_steps=8".into(),
        "train.lr=1e-3".into(),
        "train.warmup_steps=2".into(),
        "log.eval_interval=10".into(),
        "log.eval_samples=8".into(),
        "checkpoint.resume=true".into(),
    ]);
    sets
}

/// Asserts a refusal: a failed run whose error is one line holding every one of `needles`, and
/// that left the metrics as they were.
fn assert_refused(out: &Output, run: &Path, metrics: &[u8], needles: &[&str]) {
    let err = stderr(out);
    assert!(!out.status.success(), "not refused: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    for needle in needles {
        assert!(err.contains(needle), "no {needle:?} in: {err}");
    }
    assert_eq!(std::fs::read(run.join("metrics.jsonl")).unwrap(), metrics);
}

/// The steps of the training lines.
fn steps(run: &Path) -> Vec<u64> {
    metrics_lines(run)
        .iter()
        .filter(|v| v.get("loss").is_some())
        .map(|v| v["step"].as_u64().unwrap())
        .collect()
}

/// `corpus` with its first two documents swapped: the same tokens, counted alike, in another
/// order (the held-out last document stays last).
fn swapped_corpus(corpus: &Path, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(corpus).unwrap();
    let mut docs: Vec<&str> = text.lines().collect();
    docs.swap(0, 1);
    let path = dir.join("swapped.jsonl");
    std::fs::write(&path, docs.join("\n") + "\n").unwrap();
    path
}

#[test]
fn a_resume_on_other_documents_of_the_same_token_count_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let run = dir.path().join("run");
    assert_ok(&run_with(&small_run(&run, &corpus, 4), &[]));
    let metrics = std::fs::read(run.join("metrics.jsonl")).unwrap();

    // The same documents in another order: the count agrees, the fingerprint does not.
    let swapped = swapped_corpus(&corpus, dir.path());
    let out = run_with(&small_run(&run, &swapped, 6), &[]);
    assert_refused(
        &out,
        &run,
        &metrics,
        &["data.train: ", ", fingerprint ", "checkpoint.allow_changes"],
    );
    let err = stderr(&out);
    let change = err.split("data.train: ").nth(1).unwrap();
    let (old, new) = change.split_once(" -> ").unwrap();
    assert_eq!(
        old.split(", ").next(),
        new.split(", ").next(),
        "the same count: {err}"
    );

    // The same documents under another name: the same tokens, so the resume goes on without
    // a word.
    let moved = dir.path().join("moved.jsonl");
    std::fs::copy(&corpus, &moved).unwrap();
    let out = run_with(&small_run(&run, &moved, 5), &[]);
    assert_ok(&out);
    assert!(!stderr(&out).contains("allowed change"), "{}", stderr(&out));

    // A checkpoint of an older version recorded the count alone, and no tokenizer: it
    // resumes on data of that count.
    let manifest_path = run.join("checkpoints/step_00000005/manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest_path).unwrap()).unwrap();
    let settings = manifest["settings"].as_object_mut().unwrap();
    for key in ["data.train", "data.valid"] {
        let value = settings[key].as_str().unwrap();
        let count = value.split(", fingerprint ").next().unwrap().to_string();
        settings.insert(key.into(), count.into());
    }
    assert!(settings.remove("data.tokenizer").is_some());
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    let out = run_with(&small_run(&run, &corpus, 6), &[]);
    assert_ok(&out);
    assert!(!stderr(&out).contains("allowed change"), "{}", stderr(&out));

    // The dataset prepare-data makes of the same documents holds the same tokens too.
    let prefix = dir.path().join("prepared/small");
    let prepared = trainer()
        .args(["prepare-data", "--quiet", "--input"])
        .arg(&corpus)
        .arg("--output")
        .arg(&prefix)
        .output()
        .unwrap();
    assert_ok(&prepared);
    let out = run_with(&small_run(&run, &prefix, 7), &[]);
    assert_ok(&out);
    assert!(!stderr(&out).contains("allowed change"), "{}", stderr(&out));
    assert_eq!(steps(&run), [1, 2, 3, 4, 5, 6, 7]);
}

/// A copy of data/gpt2 in `dir` with the ids of " the" and " and" swapped: as many entries,
/// as many tokens for any text, other ids.
fn swapped_tokenizer(dir: &Path) -> PathBuf {
    let src = repo().join("data/gpt2");
    let out = dir.join("gpt2-swapped");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(src.join("merges.txt"), out.join("merges.txt")).unwrap();
    let text = std::fs::read_to_string(src.join("vocab.json")).unwrap();
    let mut vocab: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&text).unwrap();
    let (the, and) = (vocab["Ġthe"].clone(), vocab["Ġand"].clone());
    vocab.insert("Ġthe".into(), and);
    vocab.insert("Ġand".into(), the);
    std::fs::write(
        out.join("vocab.json"),
        serde_json::to_string(&vocab).unwrap(),
    )
    .unwrap();
    out
}

#[test]
fn a_resume_with_a_tokenizer_of_two_swapped_entries_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let run = dir.path().join("run");
    let sets = small_run(&run, &corpus, 4);
    assert_ok(&run_with(&sets, &[]));
    let metrics = std::fs::read(run.join("metrics.jsonl")).unwrap();

    let tokenizer = swapped_tokenizer(dir.path());
    let other = format!("data.tokenizer={:?}", tokenizer.to_str().unwrap());
    let out = run_with(&sets, &[&other, "train.steps=6"]);
    assert_refused(
        &out,
        &run,
        &metrics,
        &["data.tokenizer: fingerprint ", "checkpoint.allow_changes"],
    );

    // On purpose: the tokenizer and the token streams it makes.
    let allow = "checkpoint.allow_changes=[\"data.tokenizer\", \"data.train\", \"data.valid\"]";
    let out = run_with(&sets, &[&other, "train.steps=6", allow]);
    assert_ok(&out);
    let err = stderr(&out);
    assert!(
        err.contains("allowed change (checkpoint.allow_changes): data.tokenizer: fingerprint "),
        "{err}"
    );
    assert_eq!(steps(&run), [1, 2, 3, 4, 5, 6]);
}

#[test]
fn a_damaged_metrics_line_is_reported_once_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let run = dir.path().join("run");
    assert_ok(&run_with(&small_run(&run, &corpus, 4), &[]));

    // A line of text in the middle and half a line at the end.
    let path = run.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut damaged: Vec<&str> = text.lines().collect();
    damaged.insert(2, "garbage written by hand");
    let half = "{\"step\":4,\"tok";
    std::fs::write(&path, damaged.join("\n") + "\n" + half).unwrap();

    let out = run_with(&small_run(&run, &corpus, 6), &[]);
    assert_ok(&out);
    let err = stderr(&out);
    let said: Vec<&str> = err.lines().filter(|l| l.contains("damaged")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains("metrics.jsonl: dropped 2 damaged lines")
            && said[0].contains("line 3: \"garbage written by hand\""),
        "{err}"
    );
    // The rest is kept, and the curve goes on.
    assert_eq!(steps(&run), [1, 2, 3, 4, 5, 6]);
}

/// Runs `command` to its end and returns its output (stderr in `dir`) and its peak resident
/// memory in bytes, from `wait4`: this one process, whatever other tests run beside it.
fn peak_memory(mut command: Command, dir: &Path) -> (std::process::ExitStatus, String, u64) {
    let log = dir.join("stderr.txt");
    // Reaped by wait4 below, which Child::wait cannot replace: it returns the rusage.
    #[allow(clippy::zombie_processes)]
    let child = command
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value; wait4 writes into the two out-parameters only.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as libc::pid_t, "wait4 failed");
    use std::os::unix::process::ExitStatusExt;
    let status = std::process::ExitStatus::from_raw(status);
    // Linux reports ru_maxrss in KiB.
    let peak = usage.ru_maxrss as u64 * 1024;
    (status, std::fs::read_to_string(&log).unwrap(), peak)
}

#[test]
fn prepare_data_on_a_50_mb_document_without_whitespace_stays_small() {
    let dir = tempfile::tempdir().unwrap();
    // 50 MB of letters (not periodic, as real junk is not): one pre-token.
    let mut state = 7u64;
    let letters: String = (0..50_000_000)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (b'a' + (state >> 59) as u8 % 26) as char
        })
        .collect();
    let input = dir.path().join("long.jsonl");
    std::fs::write(&input, format!("{{\"text\": \"{letters}\"}}\n")).unwrap();
    drop(letters);

    let mut command = trainer();
    command
        .args(["prepare-data", "--quiet", "--input"])
        .arg(&input)
        .arg("--output")
        .arg(dir.path().join("long"));
    let (status, err, peak) = peak_memory(command, dir.path());
    assert!(status.success(), "{err}");
    assert!(err.contains("1 documents"), "{err}");
    // It took 4.0 GB: onig's match and BPE's merge of one 50 MB pre-token. Now the text, its
    // tokens and the copies on their way to the file, about 7 bytes a byte of text.
    assert!(peak < 1 << 30, "prepare-data peaked at {} MB", peak >> 20);
}

#[test]
fn a_finished_run_asked_to_train_longer_is_told_how() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let run = dir.path().join("run");
    // The decay and qgZ's end both follow train.steps, as when the user sets neither.
    let mut sets: Vec<String> = small_run(&run, &corpus, 4)
        .into_iter()
        .filter(|s| !s.starts_with("train.decay_steps"))
        .collect();
    sets.push("zero.quantized_gradients=true".into());
    sets.push("train.min_lr=1e-4".into());
    assert_ok(&run_with(&sets, &[]));
    let metrics = std::fs::read(run.join("metrics.jsonl")).unwrap();
    let kept = dir.path().join("kept");
    copy_dir(&run, &kept);

    let out = run_with(&sets, &["train.steps=8"]);
    assert_refused(
        &out,
        &run,
        &metrics,
        &[
            "train.decay_steps: 4 -> 8",
            "zero.qgz_until: 1 (through step 4) -> 1 (through step 8)",
            "to train to step 8 on the schedule it had, add --set train.decay_steps=4 --set \
             zero.qgz_until=0.5",
            "list train.decay_steps and zero.qgz_until in checkpoint.allow_changes",
        ],
    );

    // Following the advice: four more steps at train.min_lr, qgZ off, nothing to allow.
    let out = run_with(
        &sets,
        &["train.steps=8", "train.decay_steps=4", "zero.qgz_until=0.5"],
    );
    assert_ok(&out);
    assert!(!stderr(&out).contains("allowed change"), "{}", stderr(&out));
    let after: Vec<(u64, f64, bool)> = metrics_lines(&run)
        .iter()
        .filter(|v| v.get("loss").is_some())
        .map(|v| {
            let step = v["step"].as_u64().unwrap();
            (step, v["lr"].as_f64().unwrap(), v["qgz"].as_bool().unwrap())
        })
        .collect();
    assert_eq!(after.len(), 8);
    for &(step, lr, qgz) in &after[4..] {
        assert!(
            (lr - 1e-4).abs() < 1e-12 && !qgz,
            "step {step}: lr {lr}, qgz {qgz}"
        );
    }

    // The other way: fit the schedule to the new length, as the line says.
    let allow = "checkpoint.allow_changes=[\"train.decay_steps\", \"zero.qgz_until\"]";
    let mut stretched = sets.clone();
    stretched.retain(|s| !s.starts_with("log.dir"));
    stretched.push(format!("log.dir={:?}", kept.to_str().unwrap()));
    let out = run_with(&stretched, &["train.steps=8", allow]);
    assert_ok(&out);
    assert!(
        stderr(&out)
            .contains("allowed change (checkpoint.allow_changes): train.decay_steps: 4 -> 8"),
        "{}",
        stderr(&out)
    );
}
