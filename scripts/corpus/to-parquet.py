#!/usr/bin/env python3
"""Writes a `.jsonl` / `.jsonl.zst` corpus as a folder of FineWeb-style Parquet files (a string
column `text`, zstd pages), the input of the Llama walkthrough in docs/llama.md.

    pip install pyarrow zstandard
    python3 scripts/corpus/to-parquet.py data/corpus/sotu.jsonl.zst runs/parquet --files 4
"""
import argparse
import io
import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq


def lines(path):
    raw = open(path, "rb").read()
    if path.endswith(".zst"):
        import zstandard

        raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)).read()
    for line in raw.decode("utf-8").splitlines():
        if line.strip():
            yield json.loads(line)["text"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--files", type=int, default=4)
    a = ap.parse_args()
    texts = list(lines(a.input))
    out = pathlib.Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    n = len(texts)
    for f in range(a.files):
        part = texts[f * n // a.files:(f + 1) * n // a.files]
        table = pa.table({"text": pa.array(part, pa.string())})
        pq.write_table(table, out / f"part-{f:05d}.parquet", compression="zstd", row_group_size=256)
    print(f"{n} documents into {a.files} files in {out}")


if __name__ == "__main__":
    main()
