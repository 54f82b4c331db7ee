#!/usr/bin/env python3
"""Writes the rotary frequencies transformers computes for Llama 3.1/3.2 scaling, as a fixture
that crates/model's rope tests compare our inv_freq with (tests/fixtures/rope/llama3.json).

Each case: head_dim, rope_theta, the rope_parameters, and transformers' inv_freq (float32, as
its rotary embedding holds it), from ROPE_INIT_FUNCTIONS["llama3"] of modeling_rope_utils.

Regenerate from the repository root with a python that has torch and transformers 5:
  python3 -m venv /tmp/t5 && /tmp/t5/bin/pip install torch 'transformers>=5,<6'
  /tmp/t5/bin/python scripts/rope-fixture.py tests/fixtures/rope/llama3.json
"""

import json
import sys

import torch
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

CASES = [
    # Llama 3.2 1B's heads and scaling, 3.1 8B's, and a small context that puts every
    # frequency band (kept, blended, divided) inside a head of 16.
    dict(head_dim=64, theta=500000.0, factor=32.0, low=1.0, high=4.0, original=8192),
    dict(head_dim=128, theta=500000.0, factor=8.0, low=1.0, high=4.0, original=8192),
    dict(head_dim=16, theta=10000.0, factor=4.0, low=1.0, high=4.0, original=64),
]

out = {"transformers": transformers.__version__, "cases": []}
for c in CASES:
    params = {
        "rope_type": "llama3",
        "rope_theta": c["theta"],
        "factor": c["factor"],
        "low_freq_factor": c["low"],
        "high_freq_factor": c["high"],
        "original_max_position_embeddings": c["original"],
    }
    config = LlamaConfig(
        hidden_size=c["head_dim"] * 4,
        num_attention_heads=4,
        head_dim=c["head_dim"],
        rope_parameters=params,
    )
    inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))
    assert attention_scaling == 1.0
    out["cases"].append(
        {
            "head_dim": c["head_dim"],
            "rope_parameters": params,
            "inv_freq": [float(x) for x in inv_freq.to(torch.float32).tolist()],
        }
    )
json.dump(out, open(sys.argv[1], "w"), indent=1)
