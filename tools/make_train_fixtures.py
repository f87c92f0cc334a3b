#!/usr/bin/env python3
"""Dev-time generator of the training reference fixtures in tests/fixtures/train/ (see the README
there). qlm never runs Python; this script only produces committed reference files.

For each base model (tests/fixtures/llama/gqa_tied, tests/fixtures/llama/qwen2_bias) it writes
tests/fixtures/train/<name>/:
  batch.json               3 sequences of different lengths and their labels (-100 = not a target)
  reference.json           loss, n_targets, 10 AdamW steps (losses, pre-clip grad norms), the same
                           for LoRA, and the conventions used
  grads.safetensors        d loss / d parameter for every parameter (Hugging Face names, float32)
  adamw_final.safetensors  every parameter after 10 full fine-tuning AdamW steps
  lora_adapter/            the PEFT adapter (r=4, alpha=8, all 7 projections, B randomized)
  lora_grads.safetensors   d lora_loss / d lora_A, lora_B (adapter_model.safetensors names)
  lora_adamw_final.safetensors  the adapter tensors after 10 LoRA AdamW steps (same names)

Loss (Hugging Face causal LM): cross-entropy of logits[b, t] against labels[b, t+1], summed over all
target tokens of the batch and divided by their total count. Each sequence runs alone with positions
0..len-1 (no padding); the script checks that a right-padded batch with attention_mask gives the
same loss through transformers' own `labels=` path.

Usage (from the repository root):
  python3 -m venv --system-site-packages /tmp/trainref && /tmp/trainref/bin/pip install peft safetensors
  /tmp/trainref/bin/python tools/make_train_fixtures.py [--out tests/fixtures/train]
Needs torch, transformers 5.x, peft, safetensors. Runs on the CPU in float32 with fixed seeds, one
thread and deterministic algorithms (a second run gives the same bytes).
"""
import argparse
import json
import os
import shutil
import sys

import peft
import safetensors
import torch
import torch.nn.functional as F
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

BASES = {
    # name: (base fixture folder, data seed)
    "gqa_tied": ("tests/fixtures/llama/gqa_tied", 5101),
    "qwen2_bias": ("tests/fixtures/llama/qwen2_bias", 5202),
}
LENGTHS = (23, 17, 11)
FIRST_ID = 3  # token ids are drawn uniformly from [FIRST_ID, vocab)
N_STEPS = 10

LORA_CFG = dict(r=4, lora_alpha=8, lora_dropout=0.0,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                bias="none")
LORA_INIT_SEED = 6101   # torch.manual_seed before get_peft_model (A: peft's kaiming-uniform init)
LORA_B_SEED = 6202      # every lora_B <- 0.02 * N(0, 1), in named_parameters order
LORA_B_STD = 0.02

FULL_OPT = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, wd_matrix=0.1, wd_vector=0.0, max_norm=1.0)
LORA_OPT = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, max_norm=1.0)


def make_batch(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    ids, labels = [], []
    for n in LENGTHS:
        seq = torch.randint(FIRST_ID, vocab, (n,), generator=g).tolist()
        start = n // 2  # prompt = [0, n//2), completion (targets) = [n//2, n)
        ids.append(seq)
        labels.append([-100 if t < start else seq[t] for t in range(n)])
    return ids, labels


def load_base(path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    model.config.attention_dropout = 0.0
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = 0.0
    model.train()
    return model


def batch_loss(model, ids, labels):
    """Sum of per-token cross-entropies of every sequence (each run alone) / total target count."""
    total = None
    n = 0
    sums = []
    for seq, lab in zip(ids, labels):
        logits = model(input_ids=torch.tensor([seq])).logits[0]          # [len, vocab]
        target = torch.tensor(lab[1:])
        s = F.cross_entropy(logits[:-1], target, ignore_index=-100, reduction="sum")
        sums.append(float(s.detach()))
        n += int((target != -100).sum())
        total = s if total is None else total + s
    return total / n, n, sums


def hf_padded_loss(model, ids, labels):
    """transformers' own loss on a right-padded batch (attention_mask 0 on padding)."""
    L = max(len(s) for s in ids)
    inp = torch.zeros(len(ids), L, dtype=torch.long)
    lab = torch.full((len(ids), L), -100, dtype=torch.long)
    mask = torch.zeros(len(ids), L, dtype=torch.long)
    for b, (s, l) in enumerate(zip(ids, labels)):
        inp[b, :len(s)] = torch.tensor(s)
        lab[b, :len(s)] = torch.tensor(l)
        mask[b, :len(s)] = 1
    with torch.no_grad():
        return float(model(input_ids=inp, attention_mask=mask, labels=lab).loss)


def contig(d):
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in d.items()}


def train_steps(model, params_groups, params, opt_cfg, ids, labels):
    """N_STEPS of: zero_grad, loss, backward, clip_grad_norm_ (pre-clip norm recorded), AdamW step."""
    opt = torch.optim.AdamW(params_groups, lr=opt_cfg["lr"], betas=opt_cfg["betas"], eps=opt_cfg["eps"],
                            foreach=False)
    losses, norms = [], []
    for _ in range(N_STEPS):
        opt.zero_grad()
        loss, _, _ = batch_loss(model, ids, labels)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=opt_cfg["max_norm"], foreach=False)
        opt.step()
        losses.append(float(loss.detach()))
        norms.append(float(norm))
    return losses, norms


def tensor_class(name):
    for key in ("lora_A", "lora_B", "embed_tokens", "lm_head", "norm", "bias"):
        if key in name:
            return key
    for key in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        if key in name:
            return key
    return "other"


def print_max_abs(title, tensors):
    by = {}
    for k, v in tensors.items():
        c = tensor_class(k)
        by[c] = max(by.get(c, 0.0), float(v.abs().max()))
    print(f"  {title}: " + ", ".join(f"{c} {m:.3e}" for c, m in sorted(by.items())))


def make_one(name, base, seed, out_root):
    out = os.path.join(out_root, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    print(f"{name}: base {base}")

    # ---- batch, loss and full gradients -------------------------------------------------------
    model = load_base(base)
    vocab = model.config.vocab_size
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    ids, labels = make_batch(vocab, seed)
    with open(os.path.join(out, "batch.json"), "w") as f:
        json.dump({"ids": ids, "labels": labels}, f)
        f.write("\n")

    base_keys = set(load_file(os.path.join(base, "model.safetensors")).keys())
    named = dict(model.named_parameters())  # shared (tied) parameters appear once
    assert set(named) == base_keys, (set(named) ^ base_keys)

    model.zero_grad()
    loss, n_targets, seq_sums = batch_loss(model, ids, labels)
    loss.backward()
    grads = contig({k: p.grad for k, p in named.items()})
    save_file(grads, os.path.join(out, "grads.safetensors"), metadata={"format": "pt"})
    grad_norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])))
    padded = hf_padded_loss(model, ids, labels)
    loss_f = float(loss.detach())
    print(f"  loss {loss_f!r}  n_targets {n_targets}  grad norm {grad_norm:.6g}  "
          f"HF padded-batch loss |diff| {abs(padded - loss_f):.3g}")
    assert abs(padded - loss_f) < 1e-5
    print_max_abs("max |grad|", grads)

    ref = {
        "base": base,
        "lengths": list(LENGTHS),
        "data_seed": seed,
        "loss": loss_f,
        "n_targets": n_targets,
        "seq_loss_sums": seq_sums,
        "grad_norm": grad_norm,
        "hf_padded_batch_loss": padded,
        "tied_embeddings": tied,
    }

    # ---- LoRA: adapter with randomized B, its loss and gradients ------------------------------
    del model
    model = load_base(base)
    torch.manual_seed(LORA_INIT_SEED)
    pmodel = get_peft_model(model, LoraConfig(**LORA_CFG))
    pmodel.train()
    g = torch.Generator().manual_seed(LORA_B_SEED)
    with torch.no_grad():
        for k, p in pmodel.named_parameters():
            if "lora_B" in k:
                p.copy_(LORA_B_STD * torch.randn(p.shape, generator=g))
    adir = os.path.join(out, "lora_adapter")
    pmodel.save_pretrained(adir)
    os.remove(os.path.join(adir, "README.md"))  # peft's model card template
    saved = load_file(os.path.join(adir, "adapter_model.safetensors"))

    lora_params = {k: p for k, p in pmodel.named_parameters() if p.requires_grad}
    assert all(("lora_A" in k or "lora_B" in k) for k in lora_params)
    adapter_name = ".default."

    def to_saved(k):
        assert adapter_name in k, k
        return k.replace(adapter_name, ".")

    assert set(map(to_saved, lora_params)) == set(saved), set(map(to_saved, lora_params)) ^ set(saved)
    for k, p in lora_params.items():
        assert torch.equal(p.detach(), saved[to_saved(k)]), k

    pmodel.zero_grad()
    lloss, _, lsums = batch_loss(pmodel, ids, labels)
    lloss.backward()
    lgrads = contig({to_saved(k): p.grad for k, p in lora_params.items()})
    save_file(lgrads, os.path.join(out, "lora_grads.safetensors"), metadata={"format": "pt"})
    lloss_f = float(lloss.detach())
    print(f"  lora_loss {lloss_f!r}  ({len(lgrads)} tensors, "
          f"{sum(v.numel() for v in lgrads.values())} params)")
    print_max_abs("max |lora grad|", lgrads)
    ref["lora_loss"] = lloss_f
    ref["lora_seq_loss_sums"] = lsums
    ref["lora"] = {**LORA_CFG, "init_seed": LORA_INIT_SEED, "B_seed": LORA_B_SEED, "B_std": LORA_B_STD,
                   "scaling": LORA_CFG["lora_alpha"] / LORA_CFG["r"], "n_tensors": len(lgrads)}

    # ---- LoRA: 10 AdamW steps (base frozen) -----------------------------------------------------
    lp = list(lora_params.values())
    ref["lora_adamw_losses"], ref["lora_adamw_grad_norms"] = train_steps(
        pmodel, [{"params": lp, "weight_decay": LORA_OPT["weight_decay"]}], lp, LORA_OPT, ids, labels)
    save_file(contig({to_saved(k): p for k, p in lora_params.items()}),
              os.path.join(out, "lora_adamw_final.safetensors"), metadata={"format": "pt"})
    print("  lora_adamw_losses " + " ".join(f"{x:.5f}" for x in ref["lora_adamw_losses"]))
    print("  lora_adamw_norms  " + " ".join(f"{x:.4f}" for x in ref["lora_adamw_grad_norms"]))

    # ---- full fine-tuning: 10 AdamW steps --------------------------------------------------------
    del pmodel, model
    model = load_base(base)
    named = dict(model.named_parameters())
    mats = [p for p in named.values() if p.ndim >= 2]
    vecs = [p for p in named.values() if p.ndim < 2]
    params = list(named.values())
    ref["adamw_losses"], ref["adamw_grad_norms"] = train_steps(
        model, [{"params": mats, "weight_decay": FULL_OPT["wd_matrix"]},
                {"params": vecs, "weight_decay": FULL_OPT["wd_vector"]}], params, FULL_OPT, ids, labels)
    final = contig(named)
    if name == "gqa_tied":  # one model's final weights keep the fixtures small
        save_file(final, os.path.join(out, "adamw_final.safetensors"), metadata={"format": "pt"})
    print("  adamw_losses " + " ".join(f"{x:.5f}" for x in ref["adamw_losses"]))
    print("  adamw_norms  " + " ".join(f"{x:.4f}" for x in ref["adamw_grad_norms"]))
    orig = load_file(os.path.join(base, "model.safetensors"))
    print_max_abs("max |final - initial|", {k: final[k] - orig[k] for k in final})

    ref["adamw"] = {"lr": FULL_OPT["lr"], "betas": list(FULL_OPT["betas"]), "eps": FULL_OPT["eps"],
                    "weight_decay_ndim_ge_2": FULL_OPT["wd_matrix"], "weight_decay_ndim_1": FULL_OPT["wd_vector"],
                    "max_norm": FULL_OPT["max_norm"], "steps": N_STEPS}
    ref["lora_adamw"] = {"lr": LORA_OPT["lr"], "betas": list(LORA_OPT["betas"]), "eps": LORA_OPT["eps"],
                         "weight_decay": LORA_OPT["weight_decay"], "max_norm": LORA_OPT["max_norm"],
                         "steps": N_STEPS}
    ref["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                       "peft": peft.__version__, "safetensors": safetensors.__version__,
                       "python": sys.version.split()[0]}
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/train")
    args = ap.parse_args()
    # peft stores target_modules as a set: fix str hashing so adapter_config.json lists them in the same order.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONHASHSEED="0"))
    transformers.logging.disable_progress_bar()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    for name, (base, seed) in BASES.items():
        make_one(name, base, seed, args.out)


if __name__ == "__main__":
    main()
