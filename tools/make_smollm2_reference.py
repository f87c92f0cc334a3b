#!/usr/bin/env python3
"""Dev-time generator of tests/fixtures/smollm2/: reference outputs of the real default model
(SmolLM2-135M-Instruct, GGUF Q4_1) computed by transformers, which dequantizes the GGUF
to float32 and runs its own LlamaForCausalLM. See tests/fixtures/README.md for the formats.

Usage (from the repository root):
    python3 tools/make_smollm2_reference.py [--gguf ~/.cache/qlm/SmolLM2-135M-Instruct.Q4_1.gguf]
Needs torch, transformers, gguf, numpy.
"""
import argparse
import json
import os

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = {
    "chat_capital": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "plain_fox": "The quick brown fox",
}
N_NEW = 32
TOP_K = 20


def greedy_margins(model, ids, n_new):
    """Greedy continuation by full re-evaluation, with the top1-top2 margin of every step."""
    ids = list(ids)
    start = len(ids)
    margins = []
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(torch.tensor([ids])).logits[0, -1]
            top = torch.topk(logits, 2)
            margins.append(float(top.values[0] - top.values[1]))
            ids.append(int(top.indices[0]))
    return ids[start:], margins


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/qlm/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default="tests/fixtures/smollm2")
    args = ap.parse_args()
    torch.set_num_threads(4)
    folder, name = os.path.split(os.path.abspath(args.gguf))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    os.makedirs(args.out, exist_ok=True)

    import importlib.metadata as md
    summary = {
        "model": name,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "gguf": md.version("gguf"), "numpy": np.__version__},
        "vocab_size": model.config.vocab_size,
        "prompts": {},
    }
    for key, text in PROMPTS.items():
        ids = tok(text, add_special_tokens=False)["input_ids"]
        # No BOS is added: SmolLM2's tokenizer does not add one and the chat template has none.
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
            out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=N_NEW, eos_token_id=None,
                                 pad_token_id=tok.pad_token_id or 0)
        greedy = [int(x) for x in out[0, len(ids):]]
        ref_greedy, margins = greedy_margins(model, ids, N_NEW)
        assert greedy == ref_greedy, f"{key}: generate() and full-forward greedy disagree"
        logits[-1].astype("<f4").tofile(os.path.join(args.out, f"{key}.last_logits.f32"))
        top_ids = np.argsort(-logits, axis=1, kind="stable")[:, :TOP_K]
        top_vals = np.take_along_axis(logits, top_ids, axis=1)
        top_ids.astype("<i4").tofile(os.path.join(args.out, f"{key}.top20_ids.i32"))
        top_vals.astype("<f4").tofile(os.path.join(args.out, f"{key}.top20_logits.f32"))
        entry = {
            "text": text,
            "prompt_ids": [int(x) for x in ids],
            "greedy_ids": greedy,
            "greedy_text": tok.decode(greedy),
            "min_greedy_margin": float(min(margins)),
            "greedy_margins": [round(m, 5) for m in margins],
            "last_logits_file": f"{key}.last_logits.f32",
            "top20_ids_file": f"{key}.top20_ids.i32",
            "top20_logits_file": f"{key}.top20_logits.f32",
            "top20_shape": [len(ids), TOP_K],
            "last_logits_max_abs": float(np.abs(logits[-1]).max()),
            "last_logits_mean_abs": float(np.abs(logits[-1]).mean()),
        }
        summary["prompts"][key] = entry
        print(f"{key}: {len(ids)} prompt tokens, greedy {entry['greedy_text']!r}, "
              f"min margin {entry['min_greedy_margin']:.4f}, last max|.| {entry['last_logits_max_abs']:.2f}")
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(summary, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(json.dumps(summary["versions"]))


if __name__ == "__main__":
    main()
