#!/usr/bin/env python3
"""Writes a small Hugging Face checkpoint of one family with transformers itself, its weights
moved far from their initialisation, and prints transformers' loss on given tokens, so that
tests can check that `model.init_from` reads it to the same loss.

    hf-checkpoint.py OUT --family {llama,qwen2,qwen3,mistral,gpt2} [--tokens FILE.json]
                     [--dtype {float32,bfloat16}] [--shard] [--vocab V] [--context T]

FILE.json: {"inputs": [[...], ...], "targets": [[...], ...]} (B x T token ids, T <= the
context); without it nothing is printed. --vocab (97) and --context (16) size the embedding
and the positions.
OUT gets config.json and model.safetensors, or with --shard the shards of a few KB each and
model.safetensors.index.json, written by save_pretrained in the config style of the installed
transformers (4.x: top-level rope_theta / rope_scaling and torch_dtype; 5.x: rope_parameters
and dtype). With --dtype bfloat16 the weights are saved in bf16, and the loss is of the saved
weights read back in float32, as zeropp reads them.

The shapes (vocabulary 97, hidden 32, 2 layers, 4 heads, 2 key/value heads, MLP 48, context
16) carry what each family adds: Llama 3's rope scaling from a context of 4 (so that it turns
these positions) and a tied head; Qwen2's q/k/v biases, rope theta 1e6 and a tied head;
Qwen3's q/k norms and a head width of 16 (hidden / heads is 8), untied; Mistral with no
sliding window, untied.

Prints one JSON line: {"loss": ..., "class": ..., "transformers": "4.57.6"}.
Needs: pip install torch transformers safetensors numpy
"""
import argparse
import json

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

MAJOR = int(transformers.__version__.split(".")[0])

COMMON = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_act="silu",
)


def rope(theta, scaling=None):
    """The rope settings in the installed version's spelling."""
    if MAJOR >= 5:
        params = {"rope_type": "default", "rope_theta": theta}
        if scaling:
            params.update(scaling)
        return {"rope_parameters": params}
    return {"rope_theta": theta, "rope_scaling": scaling}


def config(family, vocab, context):
    if family == "gpt2":
        return AutoConfig.for_model(
            "gpt2", vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=context
        )
    common = dict(COMMON, vocab_size=vocab, max_position_embeddings=context)
    if family == "llama":
        scaling = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 4}
        return AutoConfig.for_model("llama", **common, **rope(500000.0, scaling),
                                    rms_norm_eps=1e-5, tie_word_embeddings=True)
    if family == "qwen2":
        return AutoConfig.for_model("qwen2", **common, **rope(1e6), rms_norm_eps=1e-6,
                                    tie_word_embeddings=True, use_sliding_window=False)
    if family == "qwen3":
        return AutoConfig.for_model("qwen3", **common, **rope(1e6), head_dim=16,
                                    rms_norm_eps=1e-6, tie_word_embeddings=False)
    if family == "mistral":
        return AutoConfig.for_model("mistral", **common, **rope(1e6), rms_norm_eps=1e-5,
                                    sliding_window=None, tie_word_embeddings=False)
    raise SystemExit(f"unknown family {family}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--family", required=True)
    ap.add_argument("--tokens")
    ap.add_argument("--vocab", type=int, default=97)
    ap.add_argument("--context", type=int, default=16)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--shard", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config(a.family, a.vocab, a.context), torch_dtype=torch.float32
    )
    # Far from the initialisation: a tensor read into the wrong place or orientation moves the
    # loss by far more than the tests' 1e-5.
    with torch.no_grad():
        for name, p in model.named_parameters():
            u = torch.rand_like(p) * 2 - 1
            if p.dim() == 1 and ("norm" in name or "ln_" in name) and "bias" not in name:
                p.copy_(1 + 0.5 * u)
            elif p.dim() == 1:
                p.copy_(0.1 * u)
            else:
                p.copy_(0.3 * u)
    model = model.to(getattr(torch, a.dtype))
    kw = {"max_shard_size": "8KB"} if a.shard else {}
    model.save_pretrained(a.out, safe_serialization=True, **kw)
    if not a.tokens:
        return
    back = AutoModelForCausalLM.from_pretrained(a.out, torch_dtype=torch.float32).eval()
    j = json.load(open(a.tokens))
    x, y = torch.tensor(j["inputs"]), torch.tensor(j["targets"])
    with torch.no_grad():
        logits = back(input_ids=x).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))
    print(json.dumps({"loss": loss.item(), "class": type(back).__name__,
                      "transformers": transformers.__version__}))


if __name__ == "__main__":
    main()
