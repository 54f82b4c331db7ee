//! What the CLI tests share: the repository root, the `trainer` binary started there without
//! the fault-injection variables a test may set for itself, and a slice of the bundled corpus.
// Each test crate uses its own subset of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The repository's root, where configs/ and data/ are.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The `trainer` binary, run from the repository's root.
pub fn trainer() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trainer"));
    c.current_dir(repo())
        .env_remove("ZEROPP_KILL_AT_STEP")
        .env_remove("ZEROPP_STEP_DELAY_MS")
        .env_remove("ZEROPP_HANG_RANK")
        .env_remove("ZEROPP_CHECKPOINT_DELAY");
    c
}

/// The first `docs` addresses of the bundled corpus as a plain .jsonl file in `dir`.
pub fn small_corpus(dir: &Path, docs: usize) -> PathBuf {
    let file = std::fs::File::open(repo().join("data/corpus/sotu.jsonl.zst")).unwrap();
    let text = String::from_utf8(zstd::decode_all(file).unwrap()).unwrap();
    let lines: Vec<&str> = text.lines().take(docs).collect();
    let path = dir.join("small.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// Set to run every training command of the tests with `checkpoint.async = true` (checkpoints
/// written in the background): `.ci/run` runs the checkpoint tests once each way.
pub const ASYNC_ENV: &str = "ZEROPP_TEST_CHECKPOINT_ASYNC";

/// `trainer --config configs/tiny.toml` with `--set` for each of `sets`, then of `extra` (and
/// `checkpoint.async = true` first where [`ASYNC_ENV`] is set).
pub fn command(sets: &[String], extra: &[&str]) -> Command {
    let mut c = trainer();
    c.args(["--config", "configs/tiny.toml"]);
    if std::env::var_os(ASYNC_ENV).is_some() {
        c.args(["--set", "checkpoint.async=true"]);
    }
    for s in sets.iter().map(String::as_str).chain(extra.iter().copied()) {
        c.args(["--set", s]);
    }
    c
}

/// `trainer ARGS...` (a subcommand, or flags alone), run to its end.
pub fn subcommand(args: &[&str]) -> Output {
    trainer().args(args).output().unwrap()
}

/// [`command`], run to its end.
pub fn run_with(sets: &[String], extra: &[&str]) -> Output {
    command(sets, extra).output().unwrap()
}

/// What a run printed on stderr.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Fails the test, with the run's stderr, unless the run succeeded.
pub fn assert_ok(out: &Output) {
    assert!(out.status.success(), "trainer failed: {}", stderr(out));
}

/// The one `error:` line of a run that failed with exit status 1 (not a panic, an abort or a
/// usage error): it must have failed so, with exactly one such line.
pub fn error_line(out: &Output) -> String {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a one-line failure expected: {err}"
    );
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "one error line expected: {err}");
    assert!(!err.contains("panicked"), "{err}");
    lines[0].to_string()
}

/// [`error_line`], of a command whose stderr is that one line and nothing else.
pub fn only_error_line(out: &Output) -> String {
    let line = error_line(out);
    let err = stderr(out);
    assert_eq!(err.trim_end().lines().count(), 1, "one line only: {err}");
    line
}

/// Sends SIGTERM to a running trainer and returns its output once it has ended, which must be
/// a clean stop (exit status 75).
pub fn stop_with_sigterm(child: std::process::Child) -> Output {
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    out
}

/// What every small end-to-end run shares: a 2-layer, 32-wide model with 2 heads over
/// 32 positions, trained on `train` with a fifth held out, logging every step into `run`
/// without a progress bar. Each test adds its batch, world and schedule.
pub fn small_model_run(run: &Path, train: &Path) -> Vec<String> {
    vec![
        "model.n_layer=2".into(),
        "model.n_embd=32".into(),
        "model.n_head=2".into(),
        "model.seq_len=32".into(),
        format!("data.train=[{:?}]", train.to_str().unwrap()),
        "data.valid_fraction=0.2".into(),
        "log.interval=1".into(),
        "log.progress=false".into(),
        format!("log.dir={:?}", run.to_str().unwrap()),
    ]
}

/// `p` as text (the tests' paths are UTF-8), for a `--set` value or an argument.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Starts [`command`]`(sets, extra)` with every step taking at least `delay_ms`, its stdout
/// dropped and its stderr captured.
pub fn spawn_slow(sets: &[String], extra: &[&str], delay_ms: u64) -> Child {
    command(sets, extra)
        .env("ZEROPP_STEP_DELAY_MS", delay_ms.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until `run`'s metrics.jsonl shows training step `step`; fails the test if the run
/// ends first or no such step comes within 300 s.
pub fn wait_for_step(child: &mut Child, run: &Path, step: u64) {
    let start = Instant::now();
    loop {
        let reached = std::fs::read_to_string(run.join("metrics.jsonl"))
            .map(|t| {
                t.lines()
                    .any(|l| l.contains(&format!("\"step\":{step},\"tokens\"")))
            })
            .unwrap_or(false);
        if reached {
            return;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before step {step}"
        );
        assert!(start.elapsed() < Duration::from_secs(300), "no step {step}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Copies the folder `from`, everything in it and below, to `to` (created if missing).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The `step_*` names in checkpoint folder `dir` (complete, `.tmp` or other), sorted: its lock
/// file and anything else left out.
pub fn step_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step_"))
        .collect();
    names.sort();
    names
}

/// Every line of `<run>/metrics.jsonl`, parsed; a line that is not JSON, or a half last line,
/// fails the test.
pub fn metrics_lines(run: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(text.is_empty() || text.ends_with('\n'), "a half last line");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// `(step, value)` of every metrics line of `run` that has `key`, in order (a line with `key`
/// whose step or value is not a number fails the test).
pub fn metric(run: &Path, key: &str) -> Vec<(u64, f64)> {
    metrics_lines(run)
        .iter()
        .filter(|v| v.get(key).is_some())
        .map(|v| (v["step"].as_u64().unwrap(), v[key].as_f64().unwrap()))
        .collect()
}

/// `(step, loss)` of every training line of `run`.
pub fn losses(run: &Path) -> Vec<(u64, f64)> {
    metric(run, "loss")
}

/// `(step, val_loss)` of every evaluation line of `run`.
pub fn val_losses(run: &Path) -> Vec<(u64, f64)> {
    metric(run, "val_loss")
}

/// `(step, loss or val_loss as written)` of every metrics line of `run`: equal strings are
/// equal bits.
pub fn curve(run: &Path) -> Vec<(u64, String)> {
    metrics_lines(run)
        .iter()
        .map(|v| {
            let loss = v.get("loss").or_else(|| v.get("val_loss")).unwrap();
            (v["step"].as_u64().unwrap(), loss.to_string())
        })
        .collect()
}
