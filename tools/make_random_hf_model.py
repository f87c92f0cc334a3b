#!/usr/bin/env python3
"""Dev-time writer of a random-weight Hugging Face folder of a given config's shape, for memory and
load-time measurements on files the size of real ones (qlm's own --random-weights never touches a
file). Not used by the tests.

    python3 tools/make_random_hf_model.py ../shared/assets/tinyllama-1.1b-chat-v1.0-tokenizer /tmp/tl11

Copies the folder's config and tokenizer files and writes model.safetensors in BF16 (weights
N(0, 0.02^2), norms 1). Needs torch and safetensors.
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(src):
        if name.endswith((".json", ".model")):
            shutil.copy(os.path.join(src, name), out)
    c = json.load(open(os.path.join(src, "config.json")))
    d, h, n_layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    nh, nkv, vocab = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"]), c["vocab_size"]
    hd = c.get("head_dim") or d // nh
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    t = {"model.embed_tokens.weight": rand(vocab, d), "model.norm.weight": ones(d)}
    if not c.get("tie_word_embeddings", False):
        t["lm_head.weight"] = rand(vocab, d)
    for layer in range(n_layers):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = ones(d)
        t[p + "post_attention_layernorm.weight"] = ones(d)
        t[p + "self_attn.q_proj.weight"] = rand(nh * hd, d)
        t[p + "self_attn.k_proj.weight"] = rand(nkv * hd, d)
        t[p + "self_attn.v_proj.weight"] = rand(nkv * hd, d)
        t[p + "self_attn.o_proj.weight"] = rand(d, nh * hd)
        t[p + "mlp.gate_proj.weight"] = rand(h, d)
        t[p + "mlp.up_proj.weight"] = rand(h, d)
        t[p + "mlp.down_proj.weight"] = rand(d, h)
    save_file(t, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    print(f"{out}: {sum(v.numel() for v in t.values())} parameters")


if __name__ == "__main__":
    main()
