#!/usr/bin/env python3
"""Checks that a run's TensorBoard events (`[log] tensorboard = true`) agree with its
metrics.jsonl, as TensorBoard itself reads them.

    python scripts/tensorboard-check.py RUN_DIR

Loads RUN_DIR/tensorboard with TensorBoard's EventAccumulator (every scalar kept, and no
purging of steps "orphaned" by a restart, so that a step written twice shows as twice) and
reads RUN_DIR/metrics.jsonl. Then:
  - each training line (one with a `loss` key) has exactly one `train/loss` event at its step,
    whose value is the line's loss as float32 (relative 1e-6); a `"loss": null` line (a NaN or
    infinite loss, which JSON cannot hold) must have a NaN or infinite value there;
  - each evaluation line (one with a `val_loss` key) likewise for `val/loss`;
  - neither tag has a step that metrics.jsonl lacks, or a step twice; nor has metrics.jsonl.
A resumed run must pass too: the events after the checkpoint's step are dropped on resume, as
the metrics lines are. Prints one summary line and exits 0, or prints each difference and
exits 1.

Needs: pip install tensorboard
"""
import argparse
import json
import math
import os
import struct
import sys
from collections import defaultdict

from tensorboard.backend.event_processing import event_accumulator as ea


def float32(x):
    """`x` rounded to float32, as the event file holds it (inf past float32's range)."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def same(logged, got):
    """Whether the event value `got` is the metrics value `logged` (None: NaN or infinite)."""
    if logged is None:
        return not math.isfinite(got)
    want = float32(float(logged))
    if not math.isfinite(want):
        return got == want or (math.isnan(want) and math.isnan(got))
    return abs(got - want) <= 1e-6 * abs(want)


def read_metrics(path, problems):
    """The training and evaluation lines of metrics.jsonl as (line number, step, value)."""
    lines = {"train/loss": [], "val/loss": []}
    with open(path, encoding="utf-8") as f:
        for n, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError:
                problems.append(f"metrics.jsonl line {n} is not JSON: {text.strip()[:80]}")
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("step"), int):
                problems.append(f"metrics.jsonl line {n} has no step: {text.strip()[:80]}")
            elif "val_loss" in obj:
                lines["val/loss"].append((n, obj["step"], obj["val_loss"]))
            elif "loss" in obj:
                lines["train/loss"].append((n, obj["step"], obj["loss"]))
    return lines


def check(tag, lines, events, problems):
    """Appends to `problems` what differs between the metrics `lines` and the `events` of `tag`."""
    at = defaultdict(list)
    for e in events:
        at[e.step].append(e.value)
    where = defaultdict(list)
    for n, step, _ in lines:
        where[step].append(n)
    for step, ns in sorted(where.items()):
        if len(ns) > 1:
            problems.append(f"metrics.jsonl: {tag} step {step} is there {len(ns)} times "
                            f"(lines {', '.join(map(str, ns))})")
    for step, values in sorted(at.items()):
        if len(values) > 1:
            problems.append(f"{tag}: step {step} is there {len(values)} times: {values}")
        if step not in where:
            problems.append(f"{tag}: step {step} ({values[0]}) is not in metrics.jsonl")
    for n, step, logged in lines:
        values = at.get(step, [])
        if not values:
            problems.append(f"{tag}: no event at step {step} (metrics.jsonl line {n})")
        elif len(values) == 1 and not same(logged, values[0]):
            problems.append(f"{tag}: step {step} holds {values[0]!r}, metrics.jsonl line {n} "
                            f"has {json.dumps(logged)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", metavar="RUN_DIR")
    run_dir = ap.parse_args().run_dir
    tb_dir = os.path.join(run_dir, "tensorboard")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    for path in (tb_dir, metrics):
        if not os.path.exists(path):
            print(f"tensorboard-check: {path} does not exist")
            return 1
    problems = []
    lines = read_metrics(metrics, problems)
    acc = ea.EventAccumulator(tb_dir, size_guidance={ea.SCALARS: 0}, purge_orphaned_data=False)
    acc.Reload()
    tags = acc.Tags().get(ea.SCALARS, [])
    for tag, tag_lines in lines.items():
        check(tag, tag_lines, acc.Scalars(tag) if tag in tags else [], problems)
    if problems:
        for p in problems:
            print(p)
        print(f"tensorboard-check: {len(problems)} difference(s) between {tb_dir} and {metrics}")
        return 1
    print(f"tensorboard-check: {len(lines['train/loss'])} train/loss and "
          f"{len(lines['val/loss'])} val/loss steps match metrics.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
