#!/usr/bin/env python3
"""Dev-time generator of the T5 training reference fixtures in tests/fixtures/train_t5/ (see the README
there). qlm never runs Python; this script only produces committed reference files. It follows
tools/make_train_fixtures.py (the Llama training fixtures) in every convention that applies.

For each base model (tests/fixtures/t5/gated_untied, tests/fixtures/t5/relu_tied) it writes
tests/fixtures/train_t5/<name>/:
  batch.json              2 examples: encoder ids "src" and target ids "tgt" (each tgt ends in </s> = 1)
  reference.json          loss, n_targets, 10 AdamW steps (losses, pre-clip grad norms), the same for
                          LoRA, and the conventions used
  grads.safetensors       d loss / d parameter for every parameter (Hugging Face names, float32; the
                          embedding shared by encoder, decoder (and the tied head) once, as shared.weight)
  lora_adapter/           the PEFT adapter (r=4, alpha=8, q/k/v/o + feed-forward, B randomized)
  lora_grads.safetensors  d lora_loss / d lora_A, lora_B (adapter_model.safetensors names)
No weights after the optimizer steps are stored (size).

Loss (Hugging Face T5 with labels=tgt): decoder_input_ids = [decoder_start_token_id] + tgt[:-1], then
cross-entropy of the decoder logits at position t against tgt[t], summed over every target token of the
batch and divided by their total count. Each example runs alone (no padding); the script checks that
transformers' own labels= loss on a right-padded batch (attention_mask on the encoder, labels padded
with -100) gives the same loss.

Usage (from the repository root):
  python3 -m venv --system-site-packages /tmp/tf4 && /tmp/tf4/bin/pip install "transformers<5" peft safetensors
  /tmp/tf4/bin/python tools/make_t5_train_fixtures.py [--out tests/fixtures/train_t5]
Needs torch, transformers 4.x (4.57.6 was used), peft, safetensors. transformers 5 is not a reference
for T5: its T5Config forces tied embeddings. Runs on the CPU in float32 with fixed seeds, one thread
and deterministic algorithms (a second run gives the same bytes).
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
from transformers import T5ForConditionalGeneration

BASES = {
    # name: (base fixture folder, data seed, LoRA target modules)
    "gated_untied": ("tests/fixtures/t5/gated_untied", 7101, ["q", "k", "v", "o", "wi_0", "wi_1", "wo"]),
    "relu_tied": ("tests/fixtures/t5/relu_tied", 7204, ["q", "k", "v", "o", "wi", "wo"]),
}
SRC_LENGTHS = (13, 9)
TGT_LENGTHS = (7, 5)
FIRST_ID = 2  # token ids are drawn uniformly from [FIRST_ID, vocab); the last tgt id is then set to EOS
EOS_ID = 1
N_STEPS = 10

LORA_BASE = dict(r=4, lora_alpha=8, lora_dropout=0.0, bias="none", task_type="SEQ_2_SEQ_LM")
LORA_INIT_SEED = 6101   # torch.manual_seed before get_peft_model (A: peft's kaiming-uniform init)
LORA_B_SEED = 6202      # every lora_B <- 0.02 * N(0, 1), in named_parameters order
LORA_B_STD = 0.02

FULL_OPT = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, wd_matrix=0.1, wd_vector=0.0, max_norm=1.0)
LORA_OPT = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, max_norm=1.0)


def make_batch(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    src, tgt = [], []
    for ns, nt in zip(SRC_LENGTHS, TGT_LENGTHS):
        src.append(torch.randint(FIRST_ID, vocab, (ns,), generator=g).tolist())
        t = torch.randint(FIRST_ID, vocab, (nt,), generator=g).tolist()
        t[-1] = EOS_ID
        tgt.append(t)
    return src, tgt


def load_base(path):
    model = T5ForConditionalGeneration.from_pretrained(path, dtype=torch.float32, dropout_rate=0.0)
    assert model.config.dropout_rate == 0.0
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    model.train()
    return model


def decoder_inputs(model, tgt):
    return [model.config.decoder_start_token_id] + tgt[:-1]


def batch_loss(model, src, tgt):
    """Sum of per-token cross-entropies of every example (each run alone) / total target count."""
    total = None
    n = 0
    sums = []
    for s, t in zip(src, tgt):
        logits = model(input_ids=torch.tensor([s]), decoder_input_ids=torch.tensor([decoder_inputs(model, t)]),
                       use_cache=False).logits[0]                           # [len(t), vocab]
        x = F.cross_entropy(logits, torch.tensor(t), reduction="sum")
        sums.append(float(x.detach()))
        n += len(t)
        total = x if total is None else total + x
    return total / n, n, sums


def hf_padded_loss(model, src, tgt):
    """transformers' own loss on a right-padded batch: encoder attention_mask, labels padded with -100
    (shift_right turns them into pad ids on the decoder input; causal attention keeps them out)."""
    S = max(len(s) for s in src)
    T = max(len(t) for t in tgt)
    inp = torch.full((len(src), S), model.config.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(src), S, dtype=torch.long)
    lab = torch.full((len(src), T), -100, dtype=torch.long)
    for b, (s, t) in enumerate(zip(src, tgt)):
        inp[b, :len(s)] = torch.tensor(s)
        mask[b, :len(s)] = 1
        lab[b, :len(t)] = torch.tensor(t)
    with torch.no_grad():
        return float(model(input_ids=inp, attention_mask=mask, labels=lab, use_cache=False).loss)


def contig(d):
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in d.items()}


def train_steps(model, params_groups, params, opt_cfg, src, tgt):
    """N_STEPS of: zero_grad, loss, backward, clip_grad_norm_ (pre-clip norm recorded), AdamW step."""
    opt = torch.optim.AdamW(params_groups, lr=opt_cfg["lr"], betas=opt_cfg["betas"], eps=opt_cfg["eps"],
                            foreach=False)
    losses, norms = [], []
    for _ in range(N_STEPS):
        opt.zero_grad()
        loss, _, _ = batch_loss(model, src, tgt)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=opt_cfg["max_norm"], foreach=False)
        opt.step()
        losses.append(float(loss.detach()))
        norms.append(float(norm))
    return losses, norms


def tensor_class(name):
    for key in ("lora_A", "lora_B", "shared", "lm_head", "relative_attention_bias", "layer_norm"):
        if key in name:
            return key
    parts = name.split(".")
    leaf = parts[-2]  # q, k, v, o, wi, wi_0, wi_1, wo
    if leaf in ("q", "k", "v", "o"):
        return f"{parts[-3]}.{leaf}"  # SelfAttention.q / EncDecAttention.q
    return leaf


def print_max_abs(title, tensors):
    by = {}
    for k, v in tensors.items():
        c = tensor_class(k)
        by[c] = max(by.get(c, 0.0), float(v.abs().max()))
    print(f"  {title}: " + ", ".join(f"{c} {m:.3e}" for c, m in sorted(by.items())))


def make_one(name, base, seed, targets, out_root):
    out = os.path.join(out_root, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    print(f"{name}: base {base}")

    # ---- batch, loss and full gradients -------------------------------------------------------
    model = load_base(base)
    cfg = model.config
    vocab = cfg.vocab_size
    assert cfg.eos_token_id == EOS_ID and cfg.decoder_start_token_id == 0 and cfg.pad_token_id == 0
    tied = bool(cfg.tie_word_embeddings)
    assert model.encoder.embed_tokens.weight is model.shared.weight
    assert model.decoder.embed_tokens.weight is model.shared.weight
    assert (model.lm_head.weight is model.shared.weight) == tied
    src, tgt = make_batch(vocab, seed)
    with open(os.path.join(out, "batch.json"), "w") as f:
        json.dump({"src": src, "tgt": tgt}, f)
        f.write("\n")

    base_keys = set(load_file(os.path.join(base, "model.safetensors")).keys())
    named = dict(model.named_parameters())  # shared (tied) parameters appear once, as shared.weight
    assert set(named) == base_keys, (set(named) ^ base_keys)

    model.zero_grad()
    loss, n_targets, seq_sums = batch_loss(model, src, tgt)
    loss.backward()
    grads = contig({k: p.grad for k, p in named.items()})
    save_file(grads, os.path.join(out, "grads.safetensors"), metadata={"format": "pt"})
    grad_norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])))
    padded = hf_padded_loss(model, src, tgt)
    loss_f = float(loss.detach())
    print(f"  loss {loss_f!r}  n_targets {n_targets}  grad norm {grad_norm:.6g}  "
          f"HF padded-batch loss |diff| {abs(padded - loss_f):.3g}")
    assert abs(padded - loss_f) < 1e-6
    print_max_abs("max |grad|", grads)

    ref = {
        "base": base,
        "src_lengths": list(SRC_LENGTHS),
        "tgt_lengths": list(TGT_LENGTHS),
        "data_seed": seed,
        "decoder_start_token_id": cfg.decoder_start_token_id,
        "eos_token_id": EOS_ID,
        "loss": loss_f,
        "n_targets": n_targets,
        "seq_loss_sums": seq_sums,
        "grad_norm": grad_norm,
        "hf_padded_batch_loss": padded,
        "hf_padded_batch_loss_abs_diff": abs(padded - loss_f),
        "tied_embeddings": tied,
        "grad_tensors": len(grads),
    }

    # ---- LoRA: adapter with randomized B, its loss and gradients ------------------------------
    del model
    model = load_base(base)
    lora_cfg = dict(LORA_BASE, target_modules=targets)
    torch.manual_seed(LORA_INIT_SEED)
    pmodel = get_peft_model(model, LoraConfig(**lora_cfg))
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
    lloss, _, lsums = batch_loss(pmodel, src, tgt)
    lloss.backward()
    lgrads = contig({to_saved(k): p.grad for k, p in lora_params.items()})
    save_file(lgrads, os.path.join(out, "lora_grads.safetensors"), metadata={"format": "pt"})
    lloss_f = float(lloss.detach())
    print(f"  lora_loss {lloss_f!r}  ({len(lgrads)} tensors, "
          f"{sum(v.numel() for v in lgrads.values())} params)")
    print_max_abs("max |lora grad|", lgrads)
    ref["lora_loss"] = lloss_f
    ref["lora_seq_loss_sums"] = lsums
    ref["lora"] = {**lora_cfg, "init_seed": LORA_INIT_SEED, "B_seed": LORA_B_SEED, "B_std": LORA_B_STD,
                   "scaling": lora_cfg["lora_alpha"] / lora_cfg["r"], "n_tensors": len(lgrads)}

    # ---- LoRA: 10 AdamW steps (base frozen) -----------------------------------------------------
    lp = list(lora_params.values())
    ref["lora_adamw_losses"], ref["lora_adamw_grad_norms"] = train_steps(
        pmodel, [{"params": lp, "weight_decay": LORA_OPT["weight_decay"]}], lp, LORA_OPT, src, tgt)
    print("  lora_adamw_losses " + " ".join(f"{x:.5f}" for x in ref["lora_adamw_losses"]))
    print("  lora_adamw_norms  " + " ".join(f"{x:.4f}" for x in ref["lora_adamw_grad_norms"]))

    # ---- full fine-tuning: 10 AdamW steps --------------------------------------------------------
    del pmodel, model
    model = load_base(base)
    named = dict(model.named_parameters())
    mats = [p for p in named.values() if p.ndim >= 2]  # includes relative_attention_bias [buckets, heads]
    vecs = [p for p in named.values() if p.ndim < 2]
    params = list(named.values())
    ref["adamw_losses"], ref["adamw_grad_norms"] = train_steps(
        model, [{"params": mats, "weight_decay": FULL_OPT["wd_matrix"]},
                {"params": vecs, "weight_decay": FULL_OPT["wd_vector"]}], params, FULL_OPT, src, tgt)
    print("  adamw_losses " + " ".join(f"{x:.5f}" for x in ref["adamw_losses"]))
    print("  adamw_norms  " + " ".join(f"{x:.4f}" for x in ref["adamw_grad_norms"]))
    orig = load_file(os.path.join(base, "model.safetensors"))
    final = contig(named)
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
    ap.add_argument("--out", default="tests/fixtures/train_t5")
    args = ap.parse_args()
    # peft stores target_modules as a set: fix str hashing so adapter_config.json lists them in the same order.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONHASHSEED="0"))
    if not transformers.__version__.startswith("4."):
        raise SystemExit(f"transformers {transformers.__version__}: T5 needs 4.x (5 forces tied embeddings)")
    transformers.logging.disable_progress_bar()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    for name, (base, seed, targets) in BASES.items():
        make_one(name, base, seed, targets, args.out)


if __name__ == "__main__":
    main()
