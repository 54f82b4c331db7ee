//! Tokenizers in the styles Llama 3 and Qwen (2.5 / 3) ship: our ids against the Python
//! `tokenizers` library's, the end-of-document token, and `prepare` over them.
//!
//! The fixtures (tests/fixtures/tokenizers/{llama3,qwen}/) are written by
//! scripts/tokenizer-fixtures.py: small tokenizers trained on the bundled corpus with the real
//! files' pipelines, and the ids Python gives for edge-case texts and corpus documents
//! (`add_special_tokens=False`, `encode_special_tokens=True`: no BOS, special tokens' text is
//! plain text, as in ours).

use std::path::{Path, PathBuf};

use data::{IndexedDataset, PrepareOptions, Tokenizer};
use serde::Deserialize;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/tokenizers/{name}"))
}

fn corpus() -> Vec<String> {
    data::read_documents(&repo().join("data/corpus/sotu.jsonl.zst"))
        .unwrap()
        .map(|d| d.unwrap())
        .collect()
}

/// `ids.json`: what Python's `tokenizers` gave (see scripts/tokenizer-fixtures.py).
#[derive(Deserialize)]
struct Expected {
    tokenizers_version: String,
    eod_token: String,
    eod_id: u32,
    vocab_size: usize,
    /// What the file's post-processor puts before a document when asked to (Llama 3: BOS).
    bos_added_with_special_tokens: Vec<u32>,
    documents: Vec<Document>,
    corpus: Checksums,
}

/// An edge-case `text`, or the corpus document `corpus_index`, with all its ids.
#[derive(Deserialize)]
struct Document {
    text: Option<String>,
    corpus_index: Option<usize>,
    ids: Vec<u32>,
    /// What Python decodes `ids` to (the corpus documents: their text).
    decoded: Option<String>,
    /// The ids with `encode_special_tokens=False`: special tokens' text matched as them.
    ids_matching_special_tokens: Option<Vec<u32>>,
}

/// The first `documents` corpus documents: each one's count of ids and CRC-32 of its ids as
/// little-endian u32.
#[derive(Deserialize)]
struct Checksums {
    documents: usize,
    crc32: Vec<u32>,
    tokens: Vec<usize>,
    /// Llama 3 style: how many of them have other ids with ignore_merges turned off.
    changed_without_ignore_merges: Option<usize>,
}

fn expected(name: &str) -> Expected {
    let text = std::fs::read_to_string(fixture(name).join("ids.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn crc(ids: &[u32]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for id in ids {
        h.update(&id.to_le_bytes());
    }
    h.finalize()
}

/// Asserts `got == want`, naming the first difference and the tokens around it.
fn assert_ids(got: &[u32], want: &[u32], what: &str) {
    if got == want {
        return;
    }
    let at = got.iter().zip(want).take_while(|(a, b)| a == b).count();
    let around = |ids: &[u32]| ids[at.saturating_sub(3)..(at + 4).min(ids.len())].to_vec();
    panic!(
        "{what}: ids differ from Python's at {at} (ours {} ids, Python's {}): ours ..{:?}.., \
         Python's ..{:?}..",
        got.len(),
        want.len(),
        around(got),
        around(want)
    );
}

/// Our ids equal Python's on the edge cases and on the first 200 corpus documents, and decode
/// back as Python decodes them.
fn same_ids_as_python(name: &str) {
    let want = expected(name);
    let tok = Tokenizer::open(&fixture(name).join("tokenizer.json"), None).unwrap();
    assert_eq!(tok.eod_id(), want.eod_id, "{}", want.eod_token);
    assert_eq!(tok.vocab_size(), want.vocab_size);
    let docs = corpus();
    for (i, d) in want.documents.iter().enumerate() {
        let text = match (&d.text, d.corpus_index) {
            (Some(t), None) => t,
            (None, Some(j)) => &docs[j],
            _ => panic!("document {i}: text or corpus_index"),
        };
        let what = format!("{name} document {i} ({:?}..)", &text[..text.len().min(30)]);
        assert_ids(&tok.encode(text).unwrap(), &d.ids, &what);
        let decoded = d.decoded.as_ref().unwrap_or(text);
        assert_eq!(tok.decode(&d.ids).unwrap(), *decoded, "{what}");
        if let Some(matched) = &d.ids_matching_special_tokens {
            // Python matches the special tokens' text when asked to; we never do, so a
            // document cannot end itself early.
            assert!(matched.contains(&want.eod_id), "{what}");
            assert!(!d.ids.contains(&want.eod_id), "{what}");
        }
    }
    let n = want.corpus.documents;
    assert_eq!((want.corpus.crc32.len(), want.corpus.tokens.len()), (n, n));
    let ours = tok.encode_batch(&docs[..n]).unwrap();
    let differ: Vec<usize> = (0..n)
        .filter(|&i| {
            (crc(&ours[i]), ours[i].len()) != (want.corpus.crc32[i], want.corpus.tokens[i])
        })
        .collect();
    assert!(
        differ.is_empty(),
        "{name}: ids of corpus documents {differ:?} differ from Python's (tokenizers {})",
        want.tokenizers_version
    );
    for (doc, ids) in docs.iter().zip(&ours).take(20) {
        assert_eq!(tok.decode(ids).unwrap(), *doc, "{name}");
    }
}

#[test]
fn llama3_style_ids_are_pythons() {
    same_ids_as_python("llama3");
}

#[test]
fn qwen_style_ids_are_pythons() {
    same_ids_as_python("qwen");
}

#[test]
fn the_end_of_document_token_is_found_or_named() {
    let llama = fixture("llama3").join("tokenizer.json");
    let qwen = fixture("qwen").join("tokenizer.json");
    let id = |path: &Path, eod: Option<&str>| Tokenizer::open(path, eod).unwrap().eod_id();
    // Ids as in the fixtures: the special tokens follow the 1,500 BPE tokens, in the real
    // files' order (Llama 3: <|begin_of_text|> 128000, <|end_of_text|> 128001, <|eot_id|>
    // 128009; Qwen: <|endoftext|> 151643, <|im_start|> 151644, <|im_end|> 151645).
    assert_eq!(id(&llama, None), 1501, "<|end_of_text|>");
    assert_eq!(id(&llama, Some("<|eot_id|>")), 1509);
    assert_eq!(id(&llama, Some("<|begin_of_text|>")), 1500);
    assert_eq!(id(&qwen, None), 1500, "<|endoftext|>, not <|im_end|>");
    assert_eq!(id(&qwen, Some("<|im_end|>")), 1502);
    assert_eq!(
        id(&qwen, Some("<think>")),
        1506,
        "an added token that is not special"
    );
    assert!(Tokenizer::open(&qwen, Some("<|end_of_text|>")).is_err());
    // The end-of-document token is part of the fingerprint.
    let fp = |path: &Path, eod| Tokenizer::open(path, eod).unwrap().fingerprint();
    assert_ne!(fp(&llama, None), fp(&llama, Some("<|eot_id|>")));
    assert_ne!(fp(&qwen, None), fp(&qwen, Some("<|im_end|>")));
}

#[test]
fn llama3_style_adds_no_begin_of_text() {
    // The file's post-processor adds <|begin_of_text|> (Python, add_special_tokens=True);
    // ours never runs it, and the end of document is ours to add.
    let want = expected("llama3");
    assert_eq!(want.bos_added_with_special_tokens, [1500]);
    let tok = Tokenizer::open(&fixture("llama3").join("tokenizer.json"), None).unwrap();
    assert_eq!(
        tok.encode("Hello").unwrap(),
        tok.encode_with_pipeline("Hello").unwrap()
    );
    assert_ne!(tok.encode("Hello").unwrap()[0], 1500);
    assert!(expected("qwen").bos_added_with_special_tokens.is_empty());
}

/// `prepare` writes Python's ids of each document, then the end-of-document id.
fn prepare_ends_documents(name: &str, eod_token: Option<&str>, eod: u32) {
    let want = expected(name);
    let docs = corpus();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let mut lines = String::new();
    for d in &want.documents {
        let text = d
            .text
            .clone()
            .unwrap_or_else(|| docs[d.corpus_index.unwrap()].clone());
        lines += &serde_json::json!({ "text": text }).to_string();
        lines.push('\n');
    }
    std::fs::write(&input, lines).unwrap();
    let output = dir.path().join("out");
    let stats = data::prepare(&PrepareOptions {
        inputs: vec![input],
        output: output.clone(),
        tokenizer: fixture(name).join("tokenizer.json"),
        eod_token: eod_token.map(String::from),
        text_column: data::TEXT_COLUMN.into(),
        valid_fraction: 0.0,
        progress: false,
    })
    .unwrap();
    assert_eq!(stats.documents, want.documents.len());
    let ds = IndexedDataset::open(&output).unwrap();
    assert_eq!(ds.dtype(), data::TokenDType::U16);
    for (i, d) in want.documents.iter().enumerate() {
        let got = ds.document(i);
        let (last, body) = got.split_last().unwrap();
        assert_eq!(*last, eod, "{name} document {i}");
        assert_ids(body, &d.ids, &format!("{name} prepared document {i}"));
    }
}

#[test]
fn prepare_ends_each_document_with_the_end_of_document_id() {
    prepare_ends_documents("llama3", None, 1501);
    prepare_ends_documents("llama3", Some("<|eot_id|>"), 1509);
    prepare_ends_documents("qwen", None, 1500);
    prepare_ends_documents("qwen", Some("<|im_end|>"), 1502);
}

/// `file` with its JSON changed by `edit`, written into `dir`.
fn edited(file: &Path, dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    edit(&mut json);
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    path
}

#[test]
fn the_fixtures_depend_on_ignore_merges_and_nfc() {
    // Were either setting dropped on the way (a fast path of ours, an older tokenizers), the
    // ids would change, and the comparisons above would notice. With ignore_merges off, ours
    // still agree with Python's on how many documents change.
    let dir = tempfile::tempdir().unwrap();
    let want = expected("llama3").corpus;
    let docs = &corpus()[..want.documents];
    let file = fixture("llama3").join("tokenizer.json");
    let plain = edited(&file, dir.path(), |j| {
        j["model"]["ignore_merges"] = false.into()
    });
    let with = Tokenizer::open(&file, None)
        .unwrap()
        .encode_batch(docs)
        .unwrap();
    let without = Tokenizer::open(&plain, None)
        .unwrap()
        .encode_batch(docs)
        .unwrap();
    let changed = with.iter().zip(&without).filter(|(a, b)| a != b).count();
    assert_eq!(Some(changed), want.changed_without_ignore_merges);
    assert!(changed > want.documents / 2, "{changed}");

    let file = fixture("qwen").join("tokenizer.json");
    let raw = edited(&file, dir.path(), |j| {
        j["normalizer"] = serde_json::Value::Null
    });
    let (nfc, raw) = (
        Tokenizer::open(&file, None).unwrap(),
        Tokenizer::open(&raw, None).unwrap(),
    );
    let text = "Cafe\u{301}";
    assert_ne!(nfc.encode(text).unwrap(), raw.encode(text).unwrap());
    assert_eq!(nfc.decode(&nfc.encode(text).unwrap()).unwrap(), "Caf\u{e9}");
}

#[test]
fn a_saved_truncation_or_padding_is_not_applied() {
    // A tokenizer.json keeps the truncation and padding it was saved with (a Llama 3 or Qwen
    // file saved after `enable_truncation`, an encoder's 512). transformers turns them off for
    // each call unless asked; for us a document is always whole and never padded.
    use tokenizers::{PaddingParams, PaddingStrategy, TruncationParams};
    let file = fixture("llama3").join("tokenizer.json");
    let mut hf = tokenizers::Tokenizer::from_file(&file).unwrap();
    hf.with_truncation(Some(TruncationParams {
        max_length: 16,
        ..Default::default()
    }))
    .unwrap();
    hf.with_padding(Some(PaddingParams {
        strategy: PaddingStrategy::Fixed(4096),
        pad_id: 1502,
        pad_token: "<|reserved_special_token_0|>".into(),
        ..Default::default()
    }));
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("tokenizer.json");
    hf.save(&saved, false).unwrap();
    let json = std::fs::read_to_string(&saved).unwrap();
    assert!(json.contains("\"max_length\":16") && json.contains("\"Fixed\":4096"));

    let want = expected("llama3");
    let tok = Tokenizer::open(&saved, None).unwrap();
    for d in &want.documents {
        if let Some(text) = &d.text {
            assert_ids(
                &tok.encode(text).unwrap(),
                &d.ids,
                "truncation and padding saved",
            );
        }
    }
}
