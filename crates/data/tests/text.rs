//! JSON lines, the GPT-2 tokenizer, prepare() and TokenCorpus on small files made here.

use std::io::Write;
use std::path::{Path, PathBuf};

use data::{read_documents, DataError, IndexedDataset, PrepareOptions, TokenCorpus, Tokenizer};

fn gpt2_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/gpt2")
}

fn tok() -> Tokenizer {
    Tokenizer::open(&gpt2_dir(), None).unwrap()
}

fn write_jsonl(path: &Path, lines: &[&str]) {
    let body = lines.join("\n") + "\n";
    if path.to_string_lossy().ends_with(".zst") {
        let f = std::fs::File::create(path).unwrap();
        let mut enc = zstd::stream::write::Encoder::new(f, 3).unwrap();
        enc.write_all(body.as_bytes()).unwrap();
        enc.finish().unwrap();
    } else {
        std::fs::write(path, body).unwrap();
    }
}

fn doc_line(text: &str) -> String {
    serde_json::json!({ "text": text, "meta": { "pile_set_name": "test" } }).to_string()
}

const TEXTS: [&str; 5] = [
    "Hello world",
    "Mr. Speaker, the state of the Union is strong.",
    "Unicode: naïve café, 日本語, emoji 🚀.",
    "",
    "Numbers 1234 and\nnew lines\n\nand   spaces.",
];

// ---- tokenizer ----

#[test]
fn tokenizer_known_ids_and_round_trip() {
    let t = tok();
    assert_eq!(t.encode("Hello world").unwrap(), [15496, 995]);
    assert_eq!(t.encode(" Hello").unwrap(), [18435]);
    assert_eq!(t.eod_id(), 50256);
    assert_eq!(t.vocab_size(), 50257);
    for text in TEXTS {
        let ids = t.encode(text).unwrap();
        assert_eq!(t.decode(&ids).unwrap(), text);
    }
    // "<|endoftext|>" inside text is plain text, never the boundary token.
    let ids = t.encode("a<|endoftext|>b").unwrap();
    assert!(!ids.contains(&50256), "{ids:?}");
    assert_eq!(t.decode(&[50256]).unwrap(), "<|endoftext|>");
    assert!(matches!(
        t.decode(&[50257]),
        Err(DataError::TokenOutOfRange { id: 50257, .. })
    ));
}

/// Strings that exercise every branch of the split regex and every kind of byte.
fn tricky_texts() -> Vec<String> {
    let mut v: Vec<String> = TEXTS.iter().map(|s| s.to_string()).collect();
    v.extend(
        [
            "I'm sure it's they're we've you'll he'd SHE'S 'tis",
            "  leading, trailing   \t\ttabs\r\n\r\nCRLF  \n",
            "x  y   z\u{a0}nbsp \u{2003}em-space",
            "digits 123 ٣٤٥ ½ Ⅻ, and $3.50/kg (approx.) -- ok!!!",
            "combining e\u{301} vs é; Ελληνικά; русский; עברית; हिन्दी",
            "controls \u{0}\u{1}\u{7f}\u{85} and <|endoftext|> in text",
            "",
            " ",
            "   ",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    v.push((0u32..0x800).filter_map(char::from_u32).collect());
    v
}

#[test]
fn fast_encode_matches_tokenizers_pipeline() {
    let t = tok();
    for text in tricky_texts() {
        assert_eq!(
            t.encode(&text).unwrap(),
            t.encode_with_pipeline(&text).unwrap(),
            "{text:?}"
        );
        // Second time through the word cache.
        assert_eq!(
            t.encode(&text).unwrap(),
            t.encode_with_pipeline(&text).unwrap(),
            "{text:?}"
        );
        assert_eq!(t.decode(&t.encode(&text).unwrap()).unwrap(), text);
    }
}

#[test]
fn encode_batch_matches_encode() {
    let t = tok();
    let texts = tricky_texts();
    let batch = t.encode_batch(&texts).unwrap();
    let single: Vec<Vec<u32>> = texts.iter().map(|s| t.encode(s).unwrap()).collect();
    assert_eq!(batch, single);
}

#[test]
fn tokenizer_errors_name_dir_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-tokenizer");
    let err = Tokenizer::open(&missing, None).unwrap_err().to_string();
    assert!(
        err.contains("no-such-tokenizer") && err.contains("not found"),
        "{err}"
    );

    std::fs::copy(gpt2_dir().join("vocab.json"), dir.path().join("vocab.json")).unwrap();
    let err = Tokenizer::open(dir.path(), None).unwrap_err().to_string();
    assert!(err.contains("merges.txt"), "{err}");

    std::fs::write(
        dir.path().join("merges.txt"),
        "#version: 0.2\nĠ t\nnot-a-token x\n",
    )
    .unwrap();
    let err = Tokenizer::open(dir.path(), None).unwrap_err().to_string();
    assert!(err.contains("merges.txt: line 3"), "{err}");

    // Empty, only a header, or a pair whose merge the vocabulary lacks ("q" + "j").
    for (text, want) in [
        ("", "no merges"),
        ("#version: 0.2\n", "no merges"),
        ("#version: 0.2\nĠ t\nq j\n", "line 3"),
    ] {
        std::fs::write(dir.path().join("merges.txt"), text).unwrap();
        let err = Tokenizer::open(dir.path(), None).unwrap_err().to_string();
        assert!(
            err.contains("merges.txt") && err.contains(want),
            "{text:?}: {err}"
        );
    }

    std::fs::write(dir.path().join("vocab.json"), "{\"a\": 0,").unwrap();
    let err = Tokenizer::open(dir.path(), None).unwrap_err().to_string();
    assert!(
        err.contains("vocab.json") && err.contains("invalid vocabulary JSON"),
        "{err}"
    );
}

// ---- jsonl ----

#[test]
fn reads_jsonl_and_zst() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = TEXTS.iter().map(|t| doc_line(t)).collect();
    let mut refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    refs.insert(2, "   "); // blank lines are skipped
    for name in ["a.jsonl", "a.jsonl.zst"] {
        let path = dir.path().join(name);
        write_jsonl(&path, &refs);
        let docs: Vec<String> = read_documents(&path).unwrap().map(|d| d.unwrap()).collect();
        assert_eq!(docs, TEXTS, "{name}");
    }
}

#[test]
fn jsonl_errors_carry_line_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl.zst");
    write_jsonl(
        &path,
        &[&doc_line("ok"), "{\"meta\": {}}", &doc_line("never read")],
    );
    let results: Vec<_> = read_documents(&path).unwrap().collect();
    assert_eq!(results.len(), 2, "stops after the first error");
    match &results[1] {
        Err(DataError::MissingText {
            path: p, line: 2, ..
        }) => assert_eq!(p, &path),
        other => panic!("{other:?}"),
    }

    let path = dir.path().join("bad.jsonl");
    write_jsonl(
        &path,
        &[
            &doc_line("ok"),
            &doc_line("ok"),
            "{\"text\": \"unterminated",
        ],
    );
    let err = read_documents(&path)
        .unwrap()
        .find_map(|d| d.err())
        .unwrap();
    assert!(matches!(err, DataError::Json { line: 3, .. }), "{err:?}");
    assert!(err.to_string().contains("bad.jsonl: line 3"), "{err}");

    let path = dir.path().join("num.jsonl");
    write_jsonl(&path, &["{\"text\": 5}"]);
    let err = read_documents(&path)
        .unwrap()
        .find_map(|d| d.err())
        .unwrap();
    assert!(matches!(err, DataError::Json { line: 1, .. }), "{err:?}");

    let err = read_documents(&dir.path().join("missing.jsonl"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("missing.jsonl"), "{err}");
    let err = read_documents(&dir.path().join("a.txt")).err().unwrap();
    assert!(matches!(err, DataError::UnsupportedInput { .. }), "{err:?}");
}

// ---- prepare ----

fn make_corpus(dir: &Path, n_docs: usize) -> (PathBuf, Vec<String>) {
    let texts: Vec<String> = (0..n_docs)
        .map(|i| format!("{} Document number {i}.", TEXTS[i % TEXTS.len()]))
        .collect();
    let lines: Vec<String> = texts.iter().map(|t| doc_line(t)).collect();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let path = dir.join("corpus.jsonl.zst");
    write_jsonl(&path, &refs);
    (path, texts)
}

fn options(input: &Path, output: &Path, valid_fraction: f64) -> PrepareOptions {
    PrepareOptions {
        inputs: vec![input.to_path_buf()],
        output: output.to_path_buf(),
        tokenizer: gpt2_dir(),
        eod_token: None,
        text_column: data::TEXT_COLUMN.into(),
        valid_fraction,
        progress: false,
    }
}

#[test]
fn prepare_writes_expected_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let (input, texts) = make_corpus(dir.path(), 300); // more than one batch of 256
    let t = tok();
    let expected: Vec<Vec<u32>> = texts
        .iter()
        .map(|s| {
            let mut ids = t.encode(s).unwrap();
            ids.push(50256);
            ids
        })
        .collect();
    let out = dir.path().join("out/sotu_text_document");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let stats = data::prepare(&options(&input, &out, 0.0)).unwrap();
    assert_eq!(stats.documents, 300);
    assert_eq!(stats.tokens, expected.iter().map(Vec::len).sum::<usize>());
    assert_eq!(
        stats.text_bytes,
        texts.iter().map(|s| s.len() as u64).sum::<u64>()
    );
    assert_eq!((stats.valid_documents, stats.valid_tokens), (0, 0));
    let ds = IndexedDataset::open(&out).unwrap();
    assert_eq!(ds.num_documents(), 300);
    for (i, e) in expected.iter().enumerate() {
        assert_eq!(&ds.document(i), e, "document {i}");
    }
    assert!(!dir.path().join("out/sotu_text_document_valid.idx").exists());
}

#[test]
fn prepare_holds_out_a_deterministic_split() {
    let dir = tempfile::tempdir().unwrap();
    let (input, texts) = make_corpus(dir.path(), 400);
    let t = tok();
    let out = dir.path().join("split");
    let stats = data::prepare(&options(&input, &out, 0.1)).unwrap();
    let held: Vec<usize> = (0..texts.len())
        .filter(|&j| data::is_held_out(j as u64, 0.1))
        .collect();
    assert!((20..=60).contains(&held.len()), "{} held out", held.len());
    assert_eq!(stats.valid_documents, held.len());
    assert_eq!(stats.documents + stats.valid_documents, 400);
    let valid = IndexedDataset::open(&data::valid_prefix(&out)).unwrap();
    let train = IndexedDataset::open(&out).unwrap();
    assert_eq!(valid.num_tokens(), stats.valid_tokens);
    assert_eq!(train.num_tokens(), stats.tokens);
    for (k, &j) in held.iter().enumerate() {
        let mut ids = t.encode(&texts[j]).unwrap();
        ids.push(50256);
        assert_eq!(valid.document(k), ids);
    }
    // The same again gives the same files.
    let out2 = dir.path().join("split2");
    data::prepare(&options(&input, &out2, 0.1)).unwrap();
    for suffix in [".bin", ".idx", "_valid.bin", "_valid.idx"] {
        let a = std::fs::read(format!("{}{suffix}", out.display())).unwrap();
        let b = std::fs::read(format!("{}{suffix}", out2.display())).unwrap();
        assert_eq!(a, b, "{suffix}");
    }
}

#[test]
fn prepare_skips_empty_documents_and_rejects_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("e.jsonl");
    write_jsonl(&input, &[&doc_line("a"), &doc_line(""), &doc_line("b")]);
    let stats = data::prepare(&options(&input, &dir.path().join("e"), 0.0)).unwrap();
    assert_eq!((stats.documents, stats.tokens), (2, 4));

    // A bad line: an error naming file and line, and no output files.
    let bad = dir.path().join("bad.jsonl");
    write_jsonl(&bad, &[&doc_line("a"), "not json"]);
    let out = dir.path().join("never");
    let err = data::prepare(&options(&bad, &out, 0.5)).unwrap_err();
    assert!(err.to_string().contains("bad.jsonl: line 2"), "{err}");
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("never"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    let err = data::prepare(&options(&input, &out, 1.0)).unwrap_err();
    assert!(matches!(err, DataError::BadFraction { .. }), "{err:?}");
    let err = data::prepare(&options(&dir.path().join("none.jsonl"), &out, 0.0)).unwrap_err();
    assert!(err.to_string().contains("none.jsonl"), "{err}");
}

// ---- corpus ----

#[test]
fn corpus_mixes_jsonl_and_indexed_sources() {
    let dir = tempfile::tempdir().unwrap();
    let (input, texts) = make_corpus(dir.path(), 10);
    let t = tok();
    let prefix = dir.path().join("ds");
    data::prepare(&options(&input, &prefix, 0.0)).unwrap();

    let from_jsonl = TokenCorpus::load(std::slice::from_ref(&input), Some(&t), "text").unwrap();
    let from_bin = TokenCorpus::load(std::slice::from_ref(&prefix), None, "text").unwrap();
    assert_eq!(from_jsonl, from_bin);
    assert_eq!(from_jsonl.documents, 10);
    let mut expected = Vec::new();
    for s in &texts {
        expected.extend(t.encode(s).unwrap());
        expected.push(50256);
    }
    assert_eq!(from_jsonl.tokens, expected);

    // .bin / .idx paths are taken as their prefix; sources concatenate in order.
    let idx_path = dir.path().join("ds.idx");
    let mixed = TokenCorpus::load(&[idx_path, input.clone()], Some(&t), "text").unwrap();
    assert_eq!(mixed.documents, 20);
    assert_eq!(mixed.tokens, [expected.clone(), expected.clone()].concat());

    let err = TokenCorpus::load(&[dir.path().join("nothing")], Some(&t), "text").unwrap_err();
    assert!(matches!(err, DataError::UnknownSource { .. }), "{err:?}");
    assert!(err.to_string().contains("nothing"), "{err}");
    let err = TokenCorpus::load(std::slice::from_ref(&input), None, "text").unwrap_err();
    assert!(matches!(err, DataError::NeedsTokenizer { .. }), "{err:?}");
    assert!(TokenCorpus::load(&[], Some(&t), "text").is_err());
}

/// What a resume compares: the same documents give one fingerprint whether read from a
/// `.jsonl` file or from the dataset prepare-data made of it; other documents with the same
/// token count, or the same documents in another order, give another.
#[test]
fn corpus_fingerprints_follow_the_tokens_not_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let (input, texts) = make_corpus(dir.path(), 10);
    let t = tok();
    let prefix = dir.path().join("moved/ds");
    std::fs::create_dir_all(prefix.parent().unwrap()).unwrap();
    data::prepare(&options(&input, &prefix, 0.0)).unwrap();
    let from_jsonl = TokenCorpus::load(std::slice::from_ref(&input), Some(&t), "text").unwrap();
    let from_bin = TokenCorpus::load(std::slice::from_ref(&prefix), None, "text").unwrap();
    assert_eq!(from_jsonl.fingerprint(), from_bin.fingerprint());
    assert_eq!(
        from_jsonl.fingerprint(),
        data::token_fingerprint(&from_jsonl.tokens)
    );

    // Documents 0 and 1 swapped: the same tokens, counted alike, in another order.
    let mut swapped = texts.clone();
    swapped.swap(0, 1);
    let lines: Vec<String> = swapped.iter().map(|t| doc_line(t)).collect();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let other = dir.path().join("swapped.jsonl");
    write_jsonl(&other, &refs);
    let reordered = TokenCorpus::load(std::slice::from_ref(&other), Some(&t), "text").unwrap();
    assert_eq!(reordered.tokens.len(), from_jsonl.tokens.len());
    assert_ne!(reordered.fingerprint(), from_jsonl.fingerprint());
    // The same two sources in the other order.
    let ab = TokenCorpus::load(&[input.clone(), other.clone()], Some(&t), "text").unwrap();
    let ba = TokenCorpus::load(&[other, input], Some(&t), "text").unwrap();
    assert_eq!(ab.tokens.len(), ba.tokens.len());
    assert_ne!(ab.fingerprint(), ba.fingerprint());
}

#[test]
fn corpus_split_takes_the_last_documents() {
    let dir = tempfile::tempdir().unwrap();
    let (input, texts) = make_corpus(dir.path(), 20);
    let t = tok();
    let all = TokenCorpus::load(std::slice::from_ref(&input), Some(&t), "text").unwrap();
    let (train, valid) =
        TokenCorpus::load_split(std::slice::from_ref(&input), Some(&t), "text", 0.1).unwrap();
    assert_eq!((train.documents, valid.documents), (18, 2));
    assert_eq!(
        [train.tokens.clone(), valid.tokens.clone()].concat(),
        all.tokens
    );
    let mut last_two = Vec::new();
    for s in &texts[18..] {
        last_two.extend(t.encode(s).unwrap());
        last_two.push(50256);
    }
    assert_eq!(valid.tokens, last_two);

    let (train, valid) =
        TokenCorpus::load_split(std::slice::from_ref(&input), Some(&t), "text", 0.0).unwrap();
    assert_eq!(
        (train.tokens.len(), valid.tokens.len()),
        (all.tokens.len(), 0)
    );
    // Tiny fractions still hold out one document, never all of them.
    let (train, valid) =
        TokenCorpus::load_split(std::slice::from_ref(&input), Some(&t), "text", 0.001).unwrap();
    assert_eq!((train.documents, valid.documents), (19, 1));
    let (train, valid) = TokenCorpus::load_split(&[input], Some(&t), "text", 0.99).unwrap();
    assert_eq!((train.documents, valid.documents), (1, 19));
}

/// Tokenises the whole bundled corpus (slow in debug builds): `cargo test -p data -- --ignored`.
#[test]
#[ignore]
fn bundled_corpus_prepares() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/corpus/sotu.jsonl.zst");
    let dir = tempfile::tempdir().unwrap();
    let stats = data::prepare(&options(&corpus, &dir.path().join("sotu"), 0.05)).unwrap();
    assert_eq!(stats.documents + stats.valid_documents, 233);
    assert!(stats.valid_documents > 0);
    assert!(
        (1_500_000..3_000_000).contains(&(stats.tokens + stats.valid_tokens)),
        "{stats:?}"
    );
    println!("{stats:?}");
}

/// The documents of the bundled corpus longer than one pre-tokenisation window (64 KiB) are
/// split by windows that restart at matches near their ends: the tokens must still be those of
/// `tokenizers`' pipeline, which runs the split regex over the whole text.
#[test]
fn windowed_pre_tokenisation_matches_the_pipeline_on_long_bundled_documents() {
    let t = tok();
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/corpus/sotu.jsonl.zst");
    let long: Vec<String> = read_documents(&corpus)
        .unwrap()
        .map(Result::unwrap)
        .filter(|d| d.len() > 64 << 10)
        .take(6)
        .collect();
    assert_eq!(long.len(), 6);
    for doc in &long {
        assert_eq!(t.encode(doc).unwrap(), t.encode_with_pipeline(doc).unwrap());
    }
}
