//! What the CLI tests share: the repository root, the `trainer` binary started there without
//! the fault-injection variables a test may set for itself, and a slice of the bundled corpus.
// Each test crate uses its own subset of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

/// The one `error:` line of a run that failed (it must have failed, with exactly one).
pub fn error_line(out: &Output) -> String {
    let err = stderr(out);
    assert!(!out.status.success(), "the run should have failed: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "one error line expected: {err}");
    lines[0].to_string()
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
