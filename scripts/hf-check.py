#!/usr/bin/env python3
"""Loads a `trainer export` folder with Hugging Face transformers and prints its mean
cross-entropy, so that tests can compare it with zeropp's own loss on the same tokens.

    hf-check.py DIR --tokens FILE.json
        FILE.json: {"inputs": [[...], ...], "targets": [[...], ...]} (B x T token ids)
    hf-check.py DIR --bin PREFIX --seq-len T --samples N
        the first N windows of T + 1 tokens at stride T of PREFIX.bin (Megatron's uint16 or
        int32 tokens, documents concatenated): zeropp's evaluation samples

Prints one JSON line: {"loss": ..., "class": ..., "tokenizer": true/false}. The model is loaded
with AutoModelForCausalLM (GPT2LMHeadModel or LlamaForCausalLM, from config.json) in float32
on the CPU; tokenizer.json, where the export has one, with PreTrainedTokenizerFast.
Needs: pip install torch transformers safetensors numpy
"""
import argparse
import json
import os
import struct

import numpy as np
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast


def windows(prefix, t, n):
    # The .idx header gives the dtype code (Megatron: 8 = uint16, 4 = int32).
    with open(prefix + ".idx", "rb") as f:
        head = f.read(9 + 8 + 1)
    code = head[17]
    dtype = {8: np.uint16, 4: np.int32}[code]
    tokens = np.fromfile(prefix + ".bin", dtype=dtype).astype(np.int64)
    n = min(n, (len(tokens) - 1) // t)
    x = np.stack([tokens[i * t:i * t + t] for i in range(n)])
    y = np.stack([tokens[i * t + 1:i * t + t + 1] for i in range(n)])
    return torch.from_numpy(x), torch.from_numpy(y)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tokens")
    ap.add_argument("--bin")
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--samples", type=int)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32)
    model.eval()
    if a.tokens:
        j = json.load(open(a.tokens))
        x, y = torch.tensor(j["inputs"]), torch.tensor(j["targets"])
    else:
        x, y = windows(a.bin, a.seq_len, a.samples)
    with torch.no_grad():
        logits = model(input_ids=x).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
        )
    tok = os.path.join(a.dir, "tokenizer.json")
    has_tok = os.path.exists(tok)
    if has_tok:
        PreTrainedTokenizerFast(tokenizer_file=tok)
    print(json.dumps({"loss": loss.item(), "class": type(model).__name__, "tokenizer": has_tok}))


if __name__ == "__main__":
    main()
