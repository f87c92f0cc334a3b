#!/usr/bin/env python3
"""Dev-time generator of the distillation references in tests/fixtures/train/<name>/distill/ (see
the README there). qlm never runs Python; this script only produces committed reference files.

For each named training fixture it reads the committed batch.json and lora_adapter/ (made by
make_train_fixtures.py) and writes distill/:
  reference.json          loss and n_targets
  lora_grads.safetensors  d loss / d lora_A, lora_B (adapter_model.safetensors names)

Loss (`qlm train --distill` with an adapter): the teacher is the base model with the adapter switched
off, the student the base with it; for every target row (labels[t+1] != -100) the KL divergence
sum_v p_teacher(v) (log p_teacher(v) - log p_student(v)) of the next-token distributions (after the
model's final logit soft cap), summed over the batch's target rows and divided by their count.

Usage (from the repository root, the venv of make_train_fixtures.py):
  /tmp/trainref/bin/python tools/make_distill_fixtures.py [--only NAME ...]
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

NAMES = {
    # name: base fixture folder
    "gqa_tied": "tests/fixtures/llama/gqa_tied",
    # the final logit soft cap on both distributions
    "gemma2_softcap": "tests/fixtures/llama/gemma2_softcap",
}


def distill_loss(pmodel, ids, labels):
    total, n = None, 0
    for seq, lab in zip(ids, labels):
        x = torch.tensor([seq])
        rows = torch.tensor([t for t in range(len(seq) - 1) if lab[t + 1] != -100])
        with torch.no_grad(), pmodel.disable_adapter():
            teacher = pmodel(input_ids=x).logits[0, rows]
        student = pmodel(input_ids=x).logits[0, rows]
        s = F.kl_div(F.log_softmax(student, -1), F.log_softmax(teacher, -1), log_target=True, reduction="sum")
        total = s if total is None else total + s
        n += len(rows)
    return total / n, n


def make_one(name, base):
    torch.manual_seed(0)
    fixture = os.path.join("tests/fixtures/train", name)
    with open(os.path.join(fixture, "batch.json")) as f:
        batch = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="eager")
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    pmodel = PeftModel.from_pretrained(model, os.path.join(fixture, "lora_adapter"), is_trainable=True)
    params = {k: p for k, p in pmodel.named_parameters() if p.requires_grad}
    loss, n = distill_loss(pmodel, batch["ids"], batch["labels"])
    loss.backward()
    saved = load_file(os.path.join(fixture, "lora_adapter", "adapter_model.safetensors"))
    grads = {k.replace(".default.", "."): p.grad.contiguous() for k, p in params.items()}
    assert set(grads) == set(saved), set(grads) ^ set(saved)
    out = os.path.join(fixture, "distill")
    os.makedirs(out, exist_ok=True)
    save_file(grads, os.path.join(out, "lora_grads.safetensors"))
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"loss": float(loss.detach()), "n_targets": n}, f, indent=1)
        f.write("\n")
    print(f"{name}: distillation loss {float(loss.detach())!r} over {n} targets, {len(grads)} gradient tensors")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=list(NAMES))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for name in args.only:
        make_one(name, NAMES[name])
