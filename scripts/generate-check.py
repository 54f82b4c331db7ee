#!/usr/bin/env python3
"""Greedy tokens of a `trainer export` folder by Hugging Face transformers' `generate`, to
compare with `trainer generate --temperature 0 --json` on the checkpoint it was exported from.

    generate-check.py DIR --prompt-ids 464,3162 --max-new-tokens 16
    generate-check.py DIR --prompt "The Congress" --max-new-tokens 16   (with the export's tokenizer.json)

Prints one JSON line: {"prompt_ids": [...], "ids": [...], "text": "...", "class": "..."}, the
new token ids after the prompt. The model is loaded with AutoModelForCausalLM (GPT2LMHeadModel or
LlamaForCausalLM, from config.json) in float32 on the CPU, and decodes greedily
(do_sample=False, no early stop at the end-of-text token, as `trainer generate` without
--stop-at-eod).
Needs: pip install torch transformers safetensors numpy
"""
import argparse
import json
import os

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--prompt-ids", help="comma-separated token ids")
    ap.add_argument("--prompt", help="text, tokenised with DIR/tokenizer.json")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    a = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.dir, torch_dtype=torch.float32).eval()
    tok = None
    if os.path.exists(os.path.join(a.dir, "tokenizer.json")):
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(a.dir, "tokenizer.json"))
    if a.prompt_ids:
        ids = [int(x) for x in a.prompt_ids.split(",")]
    elif a.prompt is not None and tok is not None:
        ids = tok.encode(a.prompt)
    else:
        ap.error("give --prompt-ids, or --prompt with a tokenizer.json in DIR")
    x = torch.tensor([ids])
    # No stop at the end-of-text token (and no suppression of it either): exactly N tokens.
    pad = model.config.eos_token_id if model.config.eos_token_id is not None else 0
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=a.max_new_tokens,
            do_sample=False,
            num_beams=1,
            pad_token_id=pad,
        )
    new = out[0, len(ids):].tolist()
    text = tok.decode(new) if tok is not None else None
    print(json.dumps({"prompt_ids": ids, "ids": new, "text": text,
                      "class": type(model).__name__}))


if __name__ == "__main__":
    main()
