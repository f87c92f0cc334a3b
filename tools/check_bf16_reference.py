#!/usr/bin/env python3
"""Dev-time measure of how far transformers' own BF16 inference lands from its F32 logits on the
Llama parity fixtures, the yardstick for qlm's BF16 tolerance in tests/test_llama.c.

    python3 tools/check_bf16_reference.py

For each fixture in tests/fixtures/llama: the model is loaded in F32 and in BF16 (weights,
activations and the KV cache all BF16, as `torch_dtype=torch.bfloat16` runs it), the fixture's
whole token sequence goes through both, and the largest |logit difference| is printed relative to
the largest |F32 logit| (the measure test_llama uses).
"""
import json
import os

import torch
from transformers import AutoModelForCausalLM

FIXTURES = "tests/fixtures/llama"


def logits(folder, dtype, tokens):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


def main():
    for name in sorted(os.listdir(FIXTURES)):
        folder = os.path.join(FIXTURES, name)
        with open(os.path.join(folder, "reference.json")) as f:
            tokens = json.load(f).get("tokens")
        if tokens is None:  # mistral_long_window keeps only some rows; test_llama does not use this measure on it
            continue
        f32 = logits(folder, torch.float32, tokens)
        bf16 = logits(folder, torch.bfloat16, tokens)
        largest = f32.abs().max().item()
        rel = (bf16 - f32).abs().max().item() / largest
        print(f"{name:12s} transformers bf16: max|diff| {rel:.4f} of max|logit| {largest:.2f}")


if __name__ == "__main__":
    main()
