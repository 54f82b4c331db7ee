#!/usr/bin/env python3
"""Writes the Parquet fixtures of crates/data/tests/parquet.rs with pyarrow, a real writer.

crates/data/tests/fixtures/
  docs.snappy.parquet, docs.zstd.parquet  columns `id` (int64) and `text` (string), row groups
                                          of 4 rows; one snappy-, one zstd-compressed
  docs.jsonl                              the same documents, one {"text": ...} a line: what
                                          the tests expect to read from both
Run from the repository root: pip install pyarrow && python3 scripts/parquet-fixture.py
"""

import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq

OUT = pathlib.Path("crates/data/tests/fixtures")

TEXTS = [
    "The first document.",
    "Ünïcödé: naïve café, 東京, emoji 🙂.",
    "",  # empty: prepare-data skips it, but it counts as a document for the held-out split
    "Line one\nline two\n\ttabbed",
    "A quote \" and a backslash \\ inside.",
] + [f"Document number {i}: " + " ".join(f"word{i * j % 17}" for j in range(i % 9 + 1)) for i in range(5, 23)]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "id": pa.array(range(len(TEXTS)), type=pa.int64()),
            "text": pa.array(TEXTS, type=pa.string()),
        }
    )
    for codec in ["snappy", "zstd"]:
        pq.write_table(table, OUT / f"docs.{codec}.parquet", row_group_size=4, compression=codec)
    with open(OUT / "docs.jsonl", "w", encoding="utf-8") as f:
        for text in TEXTS:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
