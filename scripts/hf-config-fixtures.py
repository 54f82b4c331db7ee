#!/usr/bin/env python3
"""Writes Hugging Face config.json fixtures with transformers itself, one folder per major version.

transformers 4.x writes RoPE as a top-level `rope_theta` plus an optional `rope_scaling` dict;
5.x moved both into one `rope_parameters` dict. Real checkpoints come in both spellings, so the
importer's tests read files that transformers really wrote rather than hand-written guesses.

OUT/v{major}/
  llama-default.json   tiny Llama, rope_theta 500000, no scaling
  llama-theta10k.json  the same with rope_theta 10000
  llama-llama3.json    Llama 3.1/3.2 scaling: factor 32, low/high freq 1/4, original 8192
  llama-yarn.json      yarn, factor 4, original_max_position_embeddings 32
  llama-linear.json    linear, factor 2
  gpt2.json            tiny GPT-2

Regenerate from the repository root (no torch needed: saving a config does not use it):
  python3 -m venv /tmp/t4 && /tmp/t4/bin/pip install transformers==4.57.6
  /tmp/t4/bin/python scripts/hf-config-fixtures.py tests/fixtures/hf-config
  python3 -m venv /tmp/t5 && /tmp/t5/bin/pip install 'transformers>=5,<6'
  /tmp/t5/bin/python scripts/hf-config-fixtures.py tests/fixtures/hf-config
"""

import json
import pathlib
import shutil
import sys
import tempfile

import transformers
from transformers import GPT2Config, LlamaConfig

MAJOR = int(transformers.__version__.split(".")[0])

LLAMA = dict(
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1024,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    architectures=["LlamaForCausalLM"],
)

# rope_type plus its extra fields; None means plain RoPE.
SCALINGS = {
    "llama-default": (500000.0, None),
    "llama-theta10k": (10000.0, None),
    "llama-llama3": (500000.0, {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "llama-yarn": (500000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
    "llama-linear": (500000.0, {"rope_type": "linear", "factor": 2.0}),
}


def rope_kwargs(theta, scaling):
    # Each version's documented API: 4.x has `rope_theta` and `rope_scaling` arguments,
    # 5.x takes one `rope_parameters` dict holding the theta too.
    if MAJOR < 5:
        return {"rope_theta": theta, "rope_scaling": scaling}
    return {"rope_parameters": {"rope_type": "default", **(scaling or {}), "rope_theta": theta}}


def save(config, path):
    # Through save_pretrained so the file is exactly what a published checkpoint would carry.
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        shutil.copy(pathlib.Path(tmp) / "config.json", path)


def main():
    out = pathlib.Path(sys.argv[1]) / f"v{MAJOR}"
    out.mkdir(parents=True, exist_ok=True)
    for name, (theta, scaling) in SCALINGS.items():
        path = out / f"{name}.json"
        save(LlamaConfig(**LLAMA, **rope_kwargs(theta, scaling)), path)
        # Guard against a version silently dropping the theta: the tests rely on it being there.
        assert str(int(theta)) in path.read_text(), f"{path}: rope_theta {theta} missing"
        json.loads(path.read_text())
    gpt2 = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=1024,
                      architectures=["GPT2LMHeadModel"])
    save(gpt2, out / "gpt2.json")
    print(f"transformers {transformers.__version__} -> {out}")


if __name__ == "__main__":
    main()
