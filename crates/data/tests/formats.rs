//! The data people bring: Parquet written by pyarrow (scripts/parquet-fixture.py), `.jsonl.gz`,
//! and the one-line errors on a wrong column or an unknown extension.

use std::io::Write;
use std::path::{Path, PathBuf};

use data::{
    read_documents, read_documents_with, DataError, PrepareOptions, TokenCorpus, Tokenizer,
};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn gpt2_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/gpt2")
}

fn read_all(path: &Path) -> Vec<String> {
    read_documents(path)
        .unwrap()
        .collect::<data::Result<_>>()
        .unwrap()
}

/// The texts the fixture script wrote, from its `.jsonl`.
fn expected() -> Vec<String> {
    read_all(&fixtures().join("docs.jsonl"))
}

#[test]
fn parquet_from_pyarrow_reads_the_documents_it_wrote() {
    let want = expected();
    assert_eq!(want.len(), 23);
    assert!(want.iter().any(|t| t.contains("東京")) && want.iter().any(String::is_empty));
    for codec in ["snappy", "zstd"] {
        let path = fixtures().join(format!("docs.{codec}.parquet"));
        assert_eq!(read_all(&path), want, "{codec}");
        // Six row groups of 4 rows (the last of 3): read one after another.
        let via_column: Vec<String> = read_documents_with(&path, "text")
            .unwrap()
            .map(|d| d.unwrap())
            .collect();
        assert_eq!(via_column, want);
    }
}

#[test]
fn parquet_without_the_column_names_the_file_and_its_columns() {
    let path = fixtures().join("docs.snappy.parquet");
    let err = read_documents_with(&path, "content").err().unwrap();
    assert!(
        matches!(&err, DataError::MissingColumn { column, columns, .. }
            if column == "content" && columns == &["id", "text"]),
        "{err:?}"
    );
    let line = err.to_string();
    assert!(
        line.contains("docs.snappy.parquet")
            && line.contains("no column \"content\" (its columns: id, text)")
            && !line.contains('\n'),
        "{line}"
    );
    let err = read_documents_with(&path, "id").err().unwrap().to_string();
    assert!(
        err.contains("docs.snappy.parquet") && err.contains("\"id\" is INT64"),
        "{err}"
    );
}

#[test]
fn a_file_that_is_not_parquet_is_one_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fake.parquet");
    std::fs::write(&path, "not parquet at all").unwrap();
    let err = read_documents(&path).err().unwrap();
    assert!(matches!(err, DataError::Parquet { .. }), "{err:?}");
    assert!(err.to_string().contains("fake.parquet"), "{err}");
}

#[test]
fn unknown_extensions_are_refused_naming_the_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.csv");
    std::fs::write(&path, "text\nhello\n").unwrap();
    let err = read_documents(&path).err().unwrap().to_string();
    assert!(
        err.contains("docs.csv")
            && err.contains("expected a .jsonl, .jsonl.zst, .jsonl.gz or .parquet file"),
        "{err}"
    );
    let err = TokenCorpus::load(&[path], None, "text")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("docs.csv") && err.contains("not found"),
        "{err}"
    );
}

/// `docs.jsonl` gzip-compressed into `dir`, as two gzip members (as Dolma's files may be).
fn gzipped(dir: &Path) -> PathBuf {
    let text = std::fs::read(fixtures().join("docs.jsonl")).unwrap();
    let cut = text.iter().position(|&b| b == b'\n').unwrap() + 1;
    let path = dir.join("docs.jsonl.gz");
    let mut file = std::fs::File::create(&path).unwrap();
    for part in [&text[..cut], &text[cut..]] {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(part).unwrap();
        file.write_all(&gz.finish().unwrap()).unwrap();
    }
    path
}

#[test]
fn jsonl_gz_reads_every_member() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(read_all(&gzipped(dir.path())), expected());
}

/// Bytes after the last gzip member that start no other member are named as such, not read as
/// a truncated header ("unexpected end of file"); the documents before them are all read.
#[test]
fn jsonl_gz_with_trailing_data_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = gzipped(dir.path());
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    file.write_all(b"junk").unwrap();
    let results: Vec<_> = read_documents(&path).unwrap().collect();
    let (last, docs) = results.split_last().unwrap();
    let docs: Vec<String> = docs.iter().map(|d| d.as_ref().unwrap().clone()).collect();
    assert_eq!(docs, expected());
    let err = last.as_ref().unwrap_err();
    let err = format!("{err}: {}", std::error::Error::source(err).unwrap());
    assert!(
        err.contains("docs.jsonl.gz") && err.contains("trailing data after the gzip stream"),
        "{err}"
    );
}

/// A null text is an empty document, as a Parquet null is; an absent one is still an error.
#[test]
fn jsonl_null_text_is_an_empty_document() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nulls.jsonl");
    std::fs::write(
        &path,
        "{\"text\": \"a\"}\n{\"text\": null}\n{\"text\": \"b\"}\n{}\n",
    )
    .unwrap();
    let results: Vec<_> = read_documents(&path).unwrap().collect();
    let docs: Vec<&str> = results[..3]
        .iter()
        .map(|d| d.as_ref().unwrap().as_str())
        .collect();
    assert_eq!(docs, ["a", "", "b"]);
    let err = results[3].as_ref().unwrap_err().to_string();
    assert!(err.contains("line 4: no \"text\" field"), "{err}");
}

#[test]
fn jsonl_reads_the_text_column_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.jsonl");
    std::fs::write(
        &path,
        "{\"id\": 1, \"content\": \"a\", \"text\": 5}\n{\"content\": \"b\\u00e9\", \"x\": [1, {\"y\": 2}]}\n{\"text\": \"c\"}\n",
    )
    .unwrap();
    let results: Vec<_> = read_documents_with(&path, "content").unwrap().collect();
    assert_eq!(results[0].as_ref().unwrap(), "a");
    assert_eq!(results[1].as_ref().unwrap(), "bé");
    let err = results[2].as_ref().unwrap_err().to_string();
    assert!(err.contains("line 3: no \"content\" field"), "{err}");
}

#[test]
fn prepare_and_corpus_read_parquet_gz_and_jsonl_alike() {
    let dir = tempfile::tempdir().unwrap();
    let tok = Tokenizer::open(&gpt2_dir(), None).unwrap();
    let gz = gzipped(dir.path());
    let jsonl = fixtures().join("docs.jsonl");
    let reference = TokenCorpus::load(std::slice::from_ref(&jsonl), Some(&tok), "text").unwrap();
    assert_eq!(reference.documents, 22, "the empty document is skipped");
    for input in [
        fixtures().join("docs.snappy.parquet"),
        fixtures().join("docs.zstd.parquet"),
        gz,
    ] {
        let corpus = TokenCorpus::load(std::slice::from_ref(&input), Some(&tok), "text").unwrap();
        assert_eq!(corpus, reference, "{}", input.display());
        let output = dir.path().join("out");
        let stats = data::prepare(&PrepareOptions {
            inputs: vec![input.clone()],
            output: output.clone(),
            tokenizer: gpt2_dir(),
            eod_token: None,
            text_column: "text".into(),
            valid_fraction: 0.0,
            progress: false,
        })
        .unwrap();
        assert_eq!(stats.documents, 22);
        let ds = data::IndexedDataset::open(&output).unwrap();
        assert_eq!(ds.tokens(), reference.tokens, "{}", input.display());
    }
}

#[test]
fn prepare_refuses_a_missing_column_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out");
    let err = data::prepare(&PrepareOptions {
        inputs: vec![fixtures().join("docs.zstd.parquet")],
        output: output.clone(),
        tokenizer: gpt2_dir(),
        eod_token: None,
        text_column: "body".into(),
        valid_fraction: 0.0,
        progress: false,
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("docs.zstd.parquet") && err.contains("no column \"body\""),
        "{err}"
    );
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
}
