#!/usr/bin/env python3
"""Writes tokenizer.json files in the styles of Llama 3 and Qwen (2.5 / 3), and the ids the Python
`tokenizers` library gives for them, for crates/data/tests/families.rs.

No hub is reachable, and the real files are 9 MB (Llama 3) and 7 MB (Qwen), so each tokenizer is
trained here on a slice of the bundled corpus with a small vocabulary, then given the pipeline
of the real file: the same normalizer, pre-tokenizer, model flags, decoder, post-processor and
special tokens (placed after the BPE vocabulary, as the real ones are).

OUTDIR/llama3/tokenizer.json  Llama 3 (Meta-Llama-3-8B, also 3.1 / 3.2):
  no normalizer; Sequence[Split(Llama 3's regex, digits in runs of 1-3, isolated),
  ByteLevel(add_prefix_space=False, use_regex=False)]; BPE with ignore_merges=True,
  byte_fallback=False, whose vocabulary is 1,300 tokens trained on the first 40 documents
  with 200 of a second training appended (as Llama 3's is cl100k_base with 28K tokens
  appended), and whose merges are derived from the ranks (ids) as transformers'
  TikTokenConverter derives them from Meta's tiktoken file (every split of a token into two
  tokens, by the rank of the token, then of the halves), so that ignore_merges changes the
  ids of most documents (the script prints how many); ByteLevel decoder; post-processor
  Sequence[ByteLevel(trim_offsets=False), TemplateProcessing adding <|begin_of_text|>];
  special tokens in Meta's order: <|begin_of_text|>, <|end_of_text|>, reserved 0-3,
  <|start_header_id|>, <|end_header_id|>, reserved 4, <|eot_id|> (Llama 3's 128000-128009).
OUTDIR/qwen/tokenizer.json  Qwen2.5 / Qwen3:
  1,500 tokens trained on the first 40 documents; NFC normalizer; Sequence[Split(Qwen's
  regex, one digit a pre-token, isolated), ByteLevel(add_prefix_space=False,
  use_regex=False)]; BPE without ignore_merges,
  continuing_subword_prefix and end_of_word_suffix "" ; ByteLevel decoder; post-processor
  ByteLevel(trim_offsets=False), which adds no token; added tokens in Qwen's order:
  <|endoftext|>, <|im_start|>, <|im_end|>, <|vision_start|> (special), then <tool_call>,
  </tool_call> (Qwen2.5) and <think>, </think> (Qwen3), which Qwen marks special=false.
OUTDIR/{llama3,qwen}/ids.json  the Python library's ids, encoded with add_special_tokens=False
  (no BOS: ours never adds BOS or EOS) and encode_special_tokens=True (special tokens' text in a
  document is plain text, as in ours): full id lists for the edge-case texts below and the three
  shortest corpus documents, with what Python decodes them to; the CRC-32 (of the ids as
  little-endian u32) and the count of the ids of each of the first 200 corpus documents, and
  (Llama 3) how many of them have other ids when ignore_merges is turned off; and,
  for the text with special tokens in it, the ids with encode_special_tokens=False (where the
  special tokens are matched), to show what the setting changes.

Where the settings come from: transformers' convert_slow_tokenizer.py (TikTokenConverter:
Llama 3's regex, Split isolated + ByteLevel without regex, ignore_merges, the merges from
ranks; Qwen2Converter: NFC, Qwen's regex, the ByteLevel post-processor),
models/llama/convert_llama_weights_to_hf.py in transformers 4.x (Llama3Converter: Meta's special
tokens and their order, the TemplateProcessing with <|begin_of_text|>), and the published
tokenizer.json files' added_tokens (Qwen2.5-*/Qwen3-*).

The corpus is read by piping it through `zstd -dc` (the zstd command-line tool; the
`zstandard` module is not needed). Training is deterministic: the same library version writes
the same files.

Regenerate from the repository root (any tokenizers 0.2x; these came from 0.23.3):
  python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers
  /tmp/tokvenv/bin/python scripts/tokenizer-fixtures.py crates/data/tests/fixtures/tokenizers
"""

import json
import pathlib
import subprocess
import sys
import unicodedata
import zlib

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import AddedToken

CORPUS = pathlib.Path("data/corpus/sotu.jsonl.zst")
TRAIN_DOCS = 40  # the slice trained on (the first 40 documents, 1.3 MB of text)
EXTRA_DOCS = slice(100, 180)  # Llama 3 style's second slice (see `llama3`)
CHECKED_DOCS = 200  # corpus documents whose ids are checksummed
FULL_DOCS = 3  # shortest corpus documents (of the checked ones) stored with all their ids

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

LLAMA3_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|reserved_special_token_2|>",
    "<|reserved_special_token_3|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|reserved_special_token_4|>",
    "<|eot_id|>",
]
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>"]
QWEN_NOT_SPECIAL = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

# Texts that reach what the corpus does not (it has no newline, no digit run over 5, no
# decomposed character, no CJK): each branch of the split regexes, NFC, and special tokens' text.
EDGE_TEXTS = [
    "One document.<|endoftext|>Another<|end_of_text|> and <|begin_of_text|><|eot_id|>"
    "<|im_start|>user\nHi<|im_end|>\n<think>x</think> <tool_call>{}</tool_call>",
    "Numbers: 1776, 1234567890, 3.14159, 0x1F, 10,000,000 and 2nd 42nd.",
    "DON'T YOU'LL I'M it's We'Re they'VE he'd SHE'LL",
    "line one\r\nline two\n\n\n  indented\ttab   \n \n\rend   ",
    "Caf\u0065\u0301 cafe\u0301 na\u0131\u0308ve \u212b \u00c5 A\u030a \ufb01 \u2460",
    "日本語のテキスト、中文。 Ελληνικά Привет мир 🙂👍🏽 \u200d \u00a0nbsp",
    "    def f(x):\n        return x**2  # squared\n\n\n",
    "!!!??? ...--- ((( ))) $$$ ''' \"\"\" `code` a'b 'quoted' ''",
]


def corpus():
    """The corpus's documents, in order (Pile-format JSONL, zstd)."""
    out = subprocess.run(["zstd", "-dc", str(CORPUS)], check=True, capture_output=True).stdout
    # Split at "\n" only: str.splitlines would also split at U+2028 inside a JSON string.
    return [json.loads(line)["text"] for line in out.decode("utf-8").split("\n") if line.strip()]


def byte_level_pre_tokenizer(split):
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def train(docs, split, normalizer, vocab_size):
    """A byte-level BPE trained on `docs` with the pre-tokenizer of `split`: (vocab, merges)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = byte_level_pre_tokenizer(split)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer, length=len(docs))
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return model["vocab"], merges


def byte_decoder():
    """GPT-2's printable character of each byte, reversed."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # The table is fixed: printable Latin-1 bytes are themselves, the rest from U+0100 in order.
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + n)] = b
            n += 1
    assert sorted(table) == sorted(alphabet)
    return table


def merges_from_ranks(vocab):
    """Merges as a tiktoken file implies them, the way transformers' TikTokenConverter writes
    them for Llama 3: for each token (rank = id), every split into two tokens, ordered by the
    token's rank, then by the ranks of the left and right halves."""
    dec = byte_decoder()
    show = {bytes(dec[c] for c in t): t for t in vocab}
    raw = {b: vocab[t] for b, t in show.items()}
    found = []
    for token, rank in raw.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in raw and right in raw:
                found.append((rank, raw[left], raw[right], show[left], show[right]))
    found.sort()
    return [(left, right) for _, _, _, left, right in found]


def llama3(docs):
    # Llama 3's vocabulary is tiktoken's cl100k_base (100K tokens) with 28K more appended
    # (Llama 3 paper, 3.1.1); merges derived from the ranks of such a vocabulary cannot reach
    # some of the appended tokens, which is why its file sets ignore_merges. Likewise here: 1,300
    # tokens trained on one slice, then the first 200 new ones of a training on another.
    base, _ = train(docs[:TRAIN_DOCS], LLAMA3_SPLIT, None, 1300)
    more, _ = train(docs[EXTRA_DOCS], LLAMA3_SPLIT, None, 1500)
    vocab = dict(base)
    for token in sorted(more, key=more.get):
        if len(vocab) == 1500:
            break
        vocab.setdefault(token, len(vocab))
    merges = merges_from_ranks(vocab)
    model = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=True)
    tok = Tokenizer(model)
    tok.pre_tokenizer = byte_level_pre_tokenizer(LLAMA3_SPLIT)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in LLAMA3_SPECIAL])
    bos = LLAMA3_SPECIAL[0]
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos}:0 $A:0",
                pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                special_tokens=[(bos, tok.token_to_id(bos))],
            ),
        ]
    )
    return tok


def qwen(docs):
    vocab, merges = train(docs[:TRAIN_DOCS], QWEN_SPLIT, normalizers.NFC(), 1500)
    model = models.BPE(
        vocab=vocab,
        merges=merges,
        dropout=None,
        unk_token=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
        byte_fallback=False,
    )
    tok = Tokenizer(model)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = byte_level_pre_tokenizer(QWEN_SPLIT)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    added = [AddedToken(t, normalized=False, special=True) for t in QWEN_SPECIAL]
    added += [AddedToken(t, normalized=False, special=False) for t in QWEN_NOT_SPECIAL]
    # Qwen's file lists them all as added tokens; add_tokens keeps special=False.
    tok.add_special_tokens(added[: len(QWEN_SPECIAL)])
    tok.add_tokens(added[len(QWEN_SPECIAL) :])
    return tok


def crc(ids):
    return zlib.crc32(b"".join(i.to_bytes(4, "little") for i in ids))


def dump(record):
    """JSON with one top-level key, and one document, a line: small, and a diff shows which
    document changed."""
    lines = []
    for key, value in record.items():
        if key == "documents":
            docs = ",\n".join("  " + json.dumps(d, ensure_ascii=False) for d in value)
            lines.append(f"{json.dumps(key)}: [\n{docs}\n ]")
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    return "{\n " + ",\n ".join(lines) + "\n}\n"


def write(name, tok, eod, docs, outdir):
    folder = outdir / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path), pretty=True)
    # What the tests load: the file as written, with our encoding settings.
    tok = Tokenizer.from_file(str(path))
    tok.encode_special_tokens = True

    def encode(text):
        return tok.encode(text, add_special_tokens=False).ids

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=False)

    checked = docs[:CHECKED_DOCS]
    ids = [e.ids for e in tok.encode_batch(checked, add_special_tokens=False)]
    for text, got in zip(checked, ids):
        assert decode(got) == text, "the corpus round-trips"
    shortest = sorted(range(len(checked)), key=lambda i: len(checked[i]))[:FULL_DOCS]
    documents = []
    for text in EDGE_TEXTS:
        got = encode(text)
        documents.append({"text": text, "ids": got, "decoded": decode(got)})
    tok.encode_special_tokens = False
    documents[0]["ids_matching_special_tokens"] = tok.encode(EDGE_TEXTS[0], add_special_tokens=False).ids
    tok.encode_special_tokens = True
    for i in sorted(shortest):
        documents.append({"corpus_index": i, "ids": ids[i]})
    with_bos = tok.encode(checked[0], add_special_tokens=True).ids
    record = {
        "note": "written by scripts/tokenizer-fixtures.py; the Python tokenizers library's ids, "
        "add_special_tokens=False, encode_special_tokens=True",
        "tokenizers_version": tokenizers.__version__,
        "eod_token": eod,
        "eod_id": tok.token_to_id(eod),
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "bos_added_with_special_tokens": with_bos[: len(with_bos) - len(ids[0])],
        "documents": documents,
        "corpus": {
            "path": str(CORPUS),
            "documents": len(checked),
            "crc32": [crc(x) for x in ids],
            "tokens": [len(x) for x in ids],
        },
    }
    # How much the fixture leans on ignore_merges: the corpus documents whose ids change
    # without it.
    config = json.loads(tok.to_str())
    if config["model"].get("ignore_merges"):
        config["model"]["ignore_merges"] = False
        other = Tokenizer.from_str(json.dumps(config))
        other.encode_special_tokens = True
        plain = other.encode_batch(checked, add_special_tokens=False)
        changed = sum(o.ids != i for o, i in zip(plain, ids))
        record["corpus"]["changed_without_ignore_merges"] = changed
        print(f"{name}: ignore_merges changes the ids of {changed} of {len(checked)} documents")
    ids_path = folder / "ids.json"
    ids_path.write_text(dump(record), encoding="utf-8")
    for p in (path, ids_path):
        print(f"{p}: {p.stat().st_size:,} bytes")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    outdir = pathlib.Path(sys.argv[1])
    docs = corpus()
    assert all(unicodedata.is_normalized("NFC", d) for d in docs)
    write("llama3", llama3(docs), "<|end_of_text|>", docs, outdir)
    write("qwen", qwen(docs), "<|endoftext|>", docs, outdir)


if __name__ == "__main__":
    main()
