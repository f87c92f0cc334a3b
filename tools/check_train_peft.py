#!/usr/bin/env python3
"""Dev-time check that an adapter written by `qlm train` is a PEFT adapter peft reads and that it
changes the model the same way in both: loads BASE with transformers and ADAPTER with
peft.PeftModel, decodes greedily from a prompt, and compares the token ids with
`qlm generate --lora`. qlm never runs Python; this only checks its output.

Usage: python3 tools/check_train_peft.py BASE_FOLDER ADAPTER_FOLDER [--qlm build/qlm] [--prompt TEXT] [-n N]
Needs torch, transformers, peft.
"""
import argparse
import json
import subprocess
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("adapter")
    ap.add_argument("--qlm", default="build/qlm")
    ap.add_argument("--prompt", default="Summarize the following conversation.\n\n#Person1#: Where are you going?\n"
                                        "#Person2#: To the library, I have an exam tomorrow.\n\nSummary: ")
    ap.add_argument("-n", type=int, default=24)
    args = ap.parse_args()

    out = subprocess.run([args.qlm, "generate", "-m", args.base, "--dtype", "f32", "--lora", f"a={args.adapter}",
                          "--temp", "0", "-n", str(args.n), "--json", "--quiet", "-p", args.prompt],
                         check=True, capture_output=True, text=True).stdout
    q = json.loads(out)
    model = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    model = PeftModel.from_pretrained(model, args.adapter).eval()
    ids = torch.tensor([q["prompt_ids"]])
    with torch.no_grad():
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.n,
                             do_sample=False)[0, ids.shape[1]:].tolist()
    same = 0
    while same < min(len(gen), len(q["ids"])) and gen[same] == q["ids"][same]:
        same += 1
    print(f"peft  : {gen}\nqlm   : {q['ids']}\nagree on the first {same} of {len(q['ids'])} tokens")
    base = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    with torch.no_grad():
        plain = base.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.n,
                              do_sample=False)[0, ids.shape[1]:].tolist()
    print(f"base  : {plain} ({'differs from' if plain != gen else 'same as'} the adapted model)")
    sys.exit(0 if same == len(q["ids"]) else 1)


if __name__ == "__main__":
    main()
