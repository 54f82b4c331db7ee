//! Any tokenizer: GPT-2's folder unchanged, a `tokenizer.json` (saved from GPT-2's, trained by
//! `train_tokenizer`, or built here with a large vocabulary), and the end-of-document token.

use std::path::{Path, PathBuf};

use data::{DataError, IndexedDataset, PrepareOptions, Tokenizer, TrainTokenizerOptions};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn gpt2() -> Tokenizer {
    Tokenizer::open(&repo().join("data/gpt2"), None).unwrap()
}

fn corpus() -> Vec<String> {
    data::read_documents(&repo().join("data/corpus/sotu.jsonl.zst"))
        .unwrap()
        .map(|d| d.unwrap())
        .collect()
}

#[test]
fn the_gpt2_folder_keeps_its_ids_and_fingerprint() {
    let t = gpt2();
    assert_eq!((t.eod_id(), t.vocab_size()), (50256, 50257));
    // The CRC of the vocabulary in id order and the merges, as before tokenizer.json came.
    assert_eq!(t.fingerprint(), 0xe957_df12);
    assert_eq!(t.encode("Hello world").unwrap(), [15496, 995]);
    // Naming its own end-of-document token changes nothing; naming another one changes the
    // fingerprint.
    let same = Tokenizer::open(&repo().join("data/gpt2"), Some("<|endoftext|>")).unwrap();
    assert_eq!(same.fingerprint(), t.fingerprint());
    let other = Tokenizer::open(&repo().join("data/gpt2"), Some("Ġthe")).unwrap();
    assert_eq!(other.eod_id(), 262);
    assert_ne!(other.fingerprint(), t.fingerprint());
}

#[test]
fn gpt2_saved_as_tokenizer_json_encodes_the_corpus_identically() {
    let dir = tempfile::tempdir().unwrap();
    let ours = gpt2();
    let file = dir.path().join("tokenizer.json");
    ours.save_json(&file).unwrap();
    // Through our loader, and through tokenizers itself, as transformers would load it.
    let json = Tokenizer::open(&file, None).unwrap();
    assert_eq!((json.eod_id(), json.vocab_size()), (50256, 50257));
    let hf = tokenizers::Tokenizer::from_file(&file).unwrap();
    let docs = corpus();
    assert!(docs.len() > 100);
    for doc in &docs {
        let want = ours.encode(doc).unwrap();
        assert_eq!(json.encode(doc).unwrap(), want);
        let got = hf.encode_fast(doc.as_str(), false).unwrap();
        assert_eq!(got.get_ids(), want);
        assert_eq!(json.decode(&want).unwrap(), *doc);
    }
    // The end of document is a special token there; in a document's text it is plain text,
    // for both loaders of ours.
    assert_eq!(hf.token_to_id("<|endoftext|>"), Some(50256));
    let forged = "a<|endoftext|>b";
    assert_eq!(json.encode(forged).unwrap(), ours.encode(forged).unwrap());
    // A folder holding only the tokenizer.json loads it; saving it again copies it.
    let again = dir.path().join("again.json");
    json.save_json(&again).unwrap();
    assert_eq!(
        std::fs::read(&again).unwrap(),
        std::fs::read(&file).unwrap()
    );
    let from_dir = Tokenizer::open(dir.path(), None).unwrap();
    assert_eq!(from_dir.fingerprint(), json.fingerprint());
    assert_eq!(from_dir.path(), file);
}

/// A WordLevel tokenizer.json of `words` words `w0`.. plus `[UNK]`, with `specials` added.
fn word_level(dir: &Path, words: usize, specials: &[&str]) -> PathBuf {
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::WhitespaceSplit;
    let mut vocab: std::collections::HashMap<String, u32> =
        (0..words).map(|i| (format!("w{i}"), i as u32)).collect();
    vocab.insert("[UNK]".into(), words as u32);
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(WhitespaceSplit));
    let added: Vec<_> = specials
        .iter()
        .map(|s| tokenizers::AddedToken::from(s.to_string(), true))
        .collect();
    tok.add_special_tokens(&added);
    let path = dir.join("tokenizer.json");
    tok.save(&path, false).unwrap();
    path
}

#[test]
fn the_end_of_document_token_is_found_named_or_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    // `</s>` comes before `[SEP]` in the candidates, whatever the ids.
    let path = word_level(dir.path(), 10, &["[SEP]", "</s>"]);
    let t = Tokenizer::open(&path, None).unwrap();
    assert_eq!((t.eod_id(), t.vocab_size()), (12, 13));
    assert_eq!(Tokenizer::open(&path, Some("[SEP]")).unwrap().eod_id(), 11);
    assert_eq!(Tokenizer::open(&path, Some("w3")).unwrap().eod_id(), 3);
    let err = Tokenizer::open(&path, Some("<eot>")).unwrap_err();
    assert!(matches!(err, DataError::UnknownEodToken { .. }), "{err:?}");
    assert!(err
        .to_string()
        .contains("\"<eot>\" is not in its vocabulary"));

    let bare = tempfile::tempdir().unwrap();
    let path = word_level(bare.path(), 10, &[]);
    let err = Tokenizer::open(&path, None).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.json")
            && err.contains("no end-of-document token")
            && err.contains("set data.eod_token")
            && !err.contains('\n'),
        "{err}"
    );
    let err = Tokenizer::open(&bare.path().join("nothing.json"), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nothing.json") && err.contains("not found"),
        "{err}"
    );
    std::fs::write(bare.path().join("bad.json"), "{\"model\": 3}").unwrap();
    let err = Tokenizer::open(&bare.path().join("bad.json"), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bad.json") && err.contains("not a tokenizer.json"),
        "{err}"
    );
}

#[test]
fn a_vocabulary_of_65536_or_more_writes_int32_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let tok_path = word_level(dir.path(), 70_000, &["</s>"]);
    let t = Tokenizer::open(&tok_path, None).unwrap();
    assert_eq!((t.eod_id(), t.vocab_size()), (70_001, 70_002));
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"text\": \"w1 w65535 w65536 w69999\"}\n{\"text\": \"w0 nope\"}\n",
    )
    .unwrap();
    let output = dir.path().join("big");
    data::prepare(&PrepareOptions {
        inputs: vec![input],
        output: output.clone(),
        tokenizer: tok_path,
        eod_token: None,
        text_column: "text".into(),
        valid_fraction: 0.0,
        progress: false,
    })
    .unwrap();
    let idx = std::fs::read(dir.path().join("big.idx")).unwrap();
    assert_eq!(idx[9 + 8], 4, "Megatron's dtype code of int32");
    let ds = IndexedDataset::open(&output).unwrap();
    assert_eq!(ds.dtype(), data::TokenDType::I32);
    assert_eq!(ds.document(0), [1, 65_535, 65_536, 69_999, 70_001]);
    assert_eq!(ds.document(1), [0, 70_000, 70_001], "[UNK], then </s>");
}

#[test]
fn a_trained_bpe_round_trips_and_ends_documents_with_endoftext() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("tok.json");
    let parquet = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/docs.zstd.parquet");
    let opts = TrainTokenizerOptions {
        inputs: vec![repo().join("data/corpus/sotu.jsonl.zst"), parquet],
        output: output.clone(),
        vocab_size: 1000,
        special: vec!["<|pad|>".into()],
        text_column: "text".into(),
        progress: false,
    };
    let stats = data::train_tokenizer(&opts).unwrap();
    assert_eq!(stats.vocab_size, 1000);
    let t = Tokenizer::open(&output, None).unwrap();
    assert_eq!((t.eod_id(), t.vocab_size()), (0, 1000));
    let hf = tokenizers::Tokenizer::from_file(&output).unwrap();
    assert_eq!(hf.token_to_id("<|pad|>"), Some(1));
    for doc in corpus().iter().take(20) {
        let ids = t.encode(doc).unwrap();
        assert!(ids.len() < doc.len() / 2, "merges learnt");
        assert_eq!(t.decode(&ids).unwrap(), *doc);
    }
    // Any bytes encode: the alphabet is all 256.
    let odd = "ẞ 🙂 \u{7f}";
    assert_eq!(t.decode(&t.encode(odd).unwrap()).unwrap(), odd);

    // Too small a vocabulary, before anything is read or written.
    let small = TrainTokenizerOptions {
        vocab_size: 257,
        output: dir.path().join("small.json"),
        ..opts.clone()
    };
    let err = data::train_tokenizer(&small).unwrap_err().to_string();
    assert!(
        err.contains("vocab size 257 is too small") && err.contains("= 258"),
        "{err}"
    );
    assert!(!dir.path().join("small.json").exists());
    // An unreadable input, an unwritable output.
    let missing = TrainTokenizerOptions {
        inputs: vec![dir.path().join("gone.jsonl")],
        ..opts.clone()
    };
    let err = data::train_tokenizer(&missing).unwrap_err().to_string();
    assert!(err.contains("gone.jsonl"), "{err}");
    let unwritable = TrainTokenizerOptions {
        output: dir.path().join("no/such/dir/tok.json"),
        ..opts
    };
    let err = data::train_tokenizer(&unwritable).unwrap_err().to_string();
    assert!(err.contains("no/such/dir/tok.json"), "{err}");
}
