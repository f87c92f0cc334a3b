#!/usr/bin/env python3
"""Dev-time: the fixture that shows peft loading an adapter `qlm train` wrote (issue 21, item 9).

Writes tests/fixtures/train/qlm_trained_peft/: data.jsonl (made-up prompt/completion pairs, no
asset text), the adapter qlm trains on them from tinystories-656K-hf (adapter_config.json,
adapter_model.safetensors, as `qlm train` wrote them), and what peft makes of that folder: it is
opened with AutoPeftModelForCausalLM.from_pretrained(folder) alone, so peft finds the base through
the adapter's own base_model_name_or_path, and its F32 logits at every position of a prompt, with
the adapter (logits_peft.f32) and with it disabled (logits_base.f32), go into the fixture with the
prompt's ids (reference.json). tests/test_train_cli.c trains the same adapter again and checks that
qlm's logits with the committed adapter equal peft's.

Usage: python3 tools/make_peft_trained_fixture.py [--qlm build/qlm] [--assets ../shared/assets]
Needs torch, transformers, peft (e.g. ~/.cache/qlm/ref-python).
"""
import argparse
import json
import os
import shutil
import subprocess
import tempfile

import numpy as np
import peft
import torch
import transformers
from peft import AutoPeftModelForCausalLM

OUT = "tests/fixtures/train/qlm_trained_peft"
# The flags of the run (after -m, --data and --out), which tests/test_train_cli.c reads from reference.json.
TRAIN_FLAGS = ["--lora", "--rank", "4", "--alpha", "8", "--steps", "6", "--batch", "4", "--seq-len", "48",
               "--lr", "1e-2", "--seed", "3", "--threads", "2"]
PROMPT_IDS = [1, 415, 267, 1201, 263, 319, 400, 1007, 290, 371, 2032, 30, 66]


def write_data(path):
    names = ["Tom", "Mia", "Ben", "Lily", "Sam", "Zoe"]
    things = ["red ball", "blue kite", "small boat", "big box"]
    places = ["the park", "the garden", "the beach", "the yard"]
    with open(path, "w") as f:
        for i in range(24):
            name, thing, place = names[i % 6], things[i % 4], places[(i // 2) % 4]
            row = {"prompt": f"{name} had a {thing}.",
                   "completion": f" {name} took the {thing} to {place} and played all day."}
            f.write(json.dumps(row) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qlm", default="build/qlm")
    ap.add_argument("--assets", default="../shared/assets")
    args = ap.parse_args()
    base = os.path.realpath(os.path.join(args.assets, "tinystories-656K-hf"))
    os.makedirs(OUT, exist_ok=True)
    data = os.path.join(OUT, "data.jsonl")
    write_data(data)
    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        subprocess.run([args.qlm, "train", "-m", base, "--data", data, "--out", run, *TRAIN_FLAGS], check=True)
        adapter = os.path.join(run, "adapter")
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            shutil.copy(os.path.join(adapter, name), os.path.join(OUT, name))
        model = AutoPeftModelForCausalLM.from_pretrained(adapter, dtype=torch.float32).eval()
        found = model.peft_config["default"].base_model_name_or_path
        assert os.path.realpath(found) == base, found
        ids = torch.tensor([PROMPT_IDS])
        with torch.no_grad():
            adapted = model(input_ids=ids).logits[0].float().numpy()
            with model.disable_adapter():
                plain = model(input_ids=ids).logits[0].float().numpy()
    adapted.astype("<f4").tofile(os.path.join(OUT, "logits_peft.f32"))
    plain.astype("<f4").tofile(os.path.join(OUT, "logits_base.f32"))
    moved = float(np.abs(adapted - plain).max())
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump({"base": "tinystories-656K-hf", "train_flags": TRAIN_FLAGS, "prompt_ids": PROMPT_IDS,
                   "vocab_size": int(adapted.shape[1]), "adapter_moves_logits_by": moved,
                   "peft": peft.__version__, "transformers": transformers.__version__},
                  f, indent=1)
    print(f"{OUT}: peft loaded qlm's adapter through base_model_name_or_path; the adapter moves the logits by "
          f"up to {moved:.4f}")


if __name__ == "__main__":
    main()
