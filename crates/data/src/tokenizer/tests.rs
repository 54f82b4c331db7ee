use super::*;

fn gpt2() -> Tokenizer {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/gpt2");
    Tokenizer::open(&dir, None).unwrap()
}

fn split(tok: &Tokenizer) -> &SysRegex {
    match &tok.kind {
        Kind::Gpt2 { split, .. } => split,
        Kind::Json { .. } => panic!("not GPT-2's files"),
    }
}

/// The pre-tokens `pretokens` gives with windows of `window` bytes.
fn windowed(tok: &Tokenizer, text: &str, window: usize) -> Vec<String> {
    let mut out = Vec::new();
    pretokens(split(tok), text, window, |w| out.push(w.to_string()));
    out
}

#[test]
fn windows_end_at_character_boundaries() {
    assert_eq!(window_end("abcdef", 0, 4), 4);
    assert_eq!(window_end("abcdef", 3, 4), 6);
    // "é" is 2 bytes: a window of 3 would split the second one.
    assert_eq!(window_end("ééé", 0, 3), 2);
    assert_eq!(window_end("€€€", 3, 4), 6);
    assert_eq!(
        window_end("€€€", 0, 2),
        3,
        "a window holds at least one character"
    );
}

#[test]
fn small_windows_give_the_pre_tokens_of_the_whole_text() {
    let tok = gpt2();
    let mut text = String::new();
    for i in 0..40 {
        text.push_str(&format!(
            "Hello world{i}!  It's 3.14 \t\n\n   tabs\t\tand      spaces, naïve café 東京 \
             ---- 's 'll <|endoftext|>{}",
            " ".repeat(i % 7)
        ));
    }
    let whole: Vec<String> = split(&tok)
        .find_iter(&text)
        .map(|(a, b)| text[a..b].to_string())
        .collect();
    assert_eq!(whole.concat(), text, "the pattern matches every character");
    let longest = whole.iter().map(String::len).max().unwrap();
    for window in [longest + LOOKAHEAD_BYTES, 64, 100, 1000] {
        assert_eq!(windowed(&tok, &text, window), whole, "window {window}");
    }
    // A pre-token longer than the window is cut into pieces of at most the window.
    let long = format!("x {} y", "é".repeat(100));
    let pieces = windowed(&tok, &long, 64);
    assert_eq!(pieces.concat(), long);
    assert!(
        pieces.len() > 4 && pieces.iter().all(|p| p.len() <= 64),
        "{pieces:?}"
    );
}

#[test]
fn a_pre_token_longer_than_the_limit_is_encoded_piece_by_piece() {
    let tok = gpt2();
    // Letters only: one pre-token. Not periodic, so that pieces meet inside tokens.
    let mut state = 1u64;
    let word: String = (0..3 * MAX_PRETOKEN_BYTES + 1000)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (b'a' + (state >> 59) as u8 % 26) as char
        })
        .collect();
    let ids = tok.encode(&word).unwrap();
    let pieces = windowed(&tok, &word, MAX_PRETOKEN_BYTES);
    assert!(pieces.len() == 4 && pieces.iter().all(|p| p.len() <= MAX_PRETOKEN_BYTES));
    let by_piece: Vec<u32> = pieces
        .iter()
        .flat_map(|p| tok.encode_with_pipeline(p).unwrap())
        .collect();
    assert_eq!(ids, by_piece);
    assert_eq!(tok.decode(&ids).unwrap(), word, "nothing is lost at a cut");
    // Up to the limit, a word is merged whole, as the full pipeline does.
    let whole = &word[..MAX_PRETOKEN_BYTES - LOOKAHEAD_BYTES];
    assert_eq!(
        tok.encode(whole).unwrap(),
        tok.encode_with_pipeline(whole).unwrap()
    );
}

#[test]
fn the_fingerprint_is_of_the_vocabulary_and_merges_not_of_the_files() {
    let base = gpt2();
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/gpt2");
    let merges = std::fs::read_to_string(src.join("merges.txt")).unwrap();
    let vocab: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(src.join("vocab.json")).unwrap()).unwrap();
    std::fs::write(dir.path().join("merges.txt"), &merges).unwrap();
    // Pretty-printed with its keys sorted (the file has them in id order): the same
    // tokenizer.
    let pretty = serde_json::to_string_pretty(&vocab).unwrap();
    std::fs::write(dir.path().join("vocab.json"), pretty).unwrap();
    let same = Tokenizer::open(dir.path(), None).unwrap();
    assert_eq!(same.fingerprint(), base.fingerprint());
    // Two entries swapped: the ids differ, the counts agree.
    let mut swapped = vocab.clone();
    let (the, and) = (vocab["Ġthe"].clone(), vocab["Ġand"].clone());
    swapped.insert("Ġthe".into(), and);
    swapped.insert("Ġand".into(), the);
    let text = serde_json::to_string(&swapped).unwrap();
    std::fs::write(dir.path().join("vocab.json"), text).unwrap();
    let other = Tokenizer::open(dir.path(), None).unwrap();
    assert_eq!(other.vocab_size(), base.vocab_size());
    assert_ne!(other.fingerprint(), base.fingerprint());
    // One merge fewer.
    std::fs::write(
        dir.path().join("vocab.json"),
        serde_json::to_string(&vocab).unwrap(),
    )
    .unwrap();
    let fewer: Vec<&str> = merges.lines().filter(|l| *l != "Ġ t").collect();
    std::fs::write(dir.path().join("merges.txt"), fewer.join("\n")).unwrap();
    let pruned = Tokenizer::open(dir.path(), None).unwrap();
    assert_ne!(pruned.fingerprint(), base.fingerprint());
}
