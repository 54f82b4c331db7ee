//! End-to-end tests of the data people bring: `trainer tokenizer` on a Parquet file written by
//! pyarrow (crates/data/tests/fixtures, scripts/parquet-fixture.py) and the bundled corpus,
//! `prepare-data --tokenizer that.json` on the Parquet file, the `.bin` read back, a short
//! run on the Parquet file with the tokenizer.json, and the one-line errors.

use std::path::{Path, PathBuf};

mod common;
use common::{assert_ok, error_line, repo, run_with, s, stderr, subcommand};

fn fixture(name: &str) -> PathBuf {
    repo().join("crates/data/tests/fixtures").join(name)
}

/// `trainer tokenizer` on the Parquet fixture and the bundled corpus: `dir/tok.json`.
fn train_tokenizer(dir: &Path) -> PathBuf {
    let output = dir.join("tok/tok.json");
    let out = subcommand(&[
        "tokenizer",
        "--quiet",
        "--input",
        s(&fixture("docs.snappy.parquet")),
        "data/corpus/sotu.jsonl.zst",
        "--vocab-size",
        "600",
        "--special",
        "<|pad|>",
        "--output",
        s(&output),
    ]);
    assert_ok(&out);
    assert!(stderr(&out).contains("600 tokens"), "{}", stderr(&out));
    output
}

#[test]
fn tokenizer_then_prepare_data_on_parquet_then_training() {
    let dir = tempfile::tempdir().unwrap();
    let tok_path = train_tokenizer(dir.path());
    let prefix = dir.path().join("ds/docs");
    let out = subcommand(&[
        "prepare-data",
        "--quiet",
        "--tokenizer",
        s(&tok_path),
        "--input",
        s(&fixture("docs.zstd.parquet")),
        "--output",
        s(&prefix),
    ]);
    assert_ok(&out);

    // The .bin holds each non-empty document's tokens, then <|endoftext|> (id 0).
    let tok = data::Tokenizer::open(&tok_path, None).unwrap();
    assert_eq!(tok.eod_id(), 0);
    let want: Vec<String> = data::read_documents(&fixture("docs.jsonl"))
        .unwrap()
        .map(|d| d.unwrap())
        .filter(|t| !t.is_empty())
        .collect();
    let ds = data::IndexedDataset::open(&prefix).unwrap();
    assert_eq!(ds.dtype(), data::TokenDType::U16);
    assert_eq!(ds.num_documents(), want.len());
    for (i, text) in want.iter().enumerate() {
        let ids = ds.document(i);
        assert_eq!(ids.last(), Some(&0), "document {i} ends with <|endoftext|>");
        assert_eq!(ids[..ids.len() - 1], tok.encode(text).unwrap()[..]);
        assert_eq!(tok.decode(&ids[..ids.len() - 1]).unwrap(), *text);
    }

    // Two steps on the Parquet file, read directly with the tokenizer.json.
    let sets = vec![
        "model.n_layer=1".into(),
        "model.n_embd=32".into(),
        "model.n_head=2".into(),
        "model.seq_len=16".into(),
        "train.micro_batch=2".into(),
        "train.global_batch=2".into(),
        "train.steps=2".into(),
        "dist.world_size=1".into(),
        "dist.gpus_per_node=1".into(),
        format!("data.train=[{:?}]", s(&fixture("docs.snappy.parquet"))),
        format!("data.tokenizer={:?}", s(&tok_path)),
        "data.eod_token=\"<|endoftext|>\"".into(),
        "data.valid_fraction=0.2".into(),
        "log.eval_interval=2".into(),
        "log.eval_samples=2".into(),
        "log.progress=false".into(),
        "checkpoint.interval=0".into(),
        format!("log.dir={:?}", s(&dir.path().join("run"))),
    ];
    assert_ok(&run_with(&sets, &[]));
}

#[test]
fn tokenizer_and_prepare_data_errors_are_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let parquet = fixture("docs.snappy.parquet");
    let out_json = dir.path().join("t.json");
    let line = error_line(&subcommand(&[
        "tokenizer",
        "--quiet",
        "--input",
        s(&parquet),
        "--vocab-size",
        "100",
        "--output",
        s(&out_json),
    ]));
    assert!(line.contains("vocab size 100 is too small"), "{line}");
    let line = error_line(&subcommand(&[
        "tokenizer",
        "--quiet",
        "--input",
        s(&dir.path().join("missing.jsonl")),
        "--vocab-size",
        "300",
        "--output",
        s(&out_json),
    ]));
    assert!(line.contains("missing.jsonl"), "{line}");
    // The output's folder cannot be made: a file is in the way.
    std::fs::write(dir.path().join("file"), "x").unwrap();
    let line = error_line(&subcommand(&[
        "tokenizer",
        "--quiet",
        "--input",
        s(&parquet),
        "--vocab-size",
        "300",
        "--output",
        s(&dir.path().join("file/t.json")),
    ]));
    assert!(line.contains("file"), "{line}");

    let prefix = dir.path().join("out");
    let line = error_line(&subcommand(&[
        "prepare-data",
        "--quiet",
        "--input",
        s(&parquet),
        "--text-column",
        "content",
        "--output",
        s(&prefix),
    ]));
    assert!(
        line.contains("docs.snappy.parquet")
            && line.contains("no column \"content\" (its columns: id, text)"),
        "{line}"
    );
    let csv = dir.path().join("docs.csv");
    std::fs::write(&csv, "text\nhi\n").unwrap();
    let line = error_line(&subcommand(&[
        "prepare-data",
        "--quiet",
        "--input",
        s(&csv),
        "--output",
        s(&prefix),
    ]));
    assert!(
        line.contains("docs.csv") && line.contains(".jsonl.gz or .parquet"),
        "{line}"
    );
    let line = error_line(&subcommand(&[
        "prepare-data",
        "--quiet",
        "--input",
        s(&parquet),
        "--eod-token",
        "<|nope|>",
        "--output",
        s(&prefix),
    ]));
    assert!(
        line.contains("\"<|nope|>\" is not in its vocabulary"),
        "{line}"
    );
}
