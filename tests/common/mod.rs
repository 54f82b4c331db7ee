//! What the CLI tests share: the repository root, the `trainer` binary started there without
//! the fault-injection variables a test may set for itself, and a slice of the bundled corpus.
// Each test crate uses its own subset of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

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
        .env_remove("ZEROPP_HANG_RANK");
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
