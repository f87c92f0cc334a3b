#!/usr/bin/env python3
"""Dev-time generator of the training reference fixtures in tests/fixtures/train/ (see the README
there). qlm never runs Python; this script only produces committed reference files.

For each base model (tests/fixtures/llama/ gqa_tied, qwen2_bias, qwen3_window, gelu_linear_rope,
gemma2_softcap, gemma3_local_rope, mistral_window, phi3_fused) it writes
tests/fixtures/train/<name>/:
  batch.json               3 sequences of different lengths and their labels (-100 = not a target)
  reference.json           loss, n_targets, 10 AdamW steps (losses, pre-clip grad norms), the same
                           for LoRA, and the conventions used
  grads.safetensors        d loss / d parameter for every parameter (Hugging Face names, float32;
                           Phi-3's fused matrices split into q/k/v_proj and gate/up_proj, as qlm holds them)
  adamw_final.safetensors  every parameter after 10 full fine-tuning AdamW steps
  lora_adapter/            the PEFT adapter (r=4, alpha=8, every projection, B randomized; Phi-3's on
                           qkv_proj, o_proj, gate_up_proj, down_proj)
  lora_grads.safetensors   d lora_loss / d lora_A, lora_B (adapter_model.safetensors names)
  lora_adamw_final.safetensors  the adapter tensors after 10 LoRA AdamW steps (same names)

Loss (Hugging Face causal LM): cross-entropy of logits[b, t] against labels[b, t+1], summed over all
target tokens of the batch and divided by their total count. Each sequence runs alone with positions
0..len-1 (no padding); the script checks that a right-padded batch with attention_mask gives the
same loss through transformers' own `labels=` path.

Usage (from the repository root):
  python3 -m venv --system-site-packages /tmp/trainref && /tmp/trainref/bin/pip install peft safetensors
  /tmp/trainref/bin/python tools/make_train_fixtures.py [--out tests/fixtures/train] [--only NAME ...]
Needs torch, transformers 5.x, peft, safetensors. Runs on the CPU in float32 with fixed seeds, one
thread and deterministic algorithms (a second run gives the same bytes).
"""
import os
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_fixture_common as C  # noqa: E402  (shared with make_t5_train_fixtures.py)

BASES = {
    # name: (base fixture folder, data seed)
    "gqa_tied": ("tests/fixtures/llama/gqa_tied", 5101),
    "qwen2_bias": ("tests/fixtures/llama/qwen2_bias", 5202),
    # q/k norms and sliding-window attention (window 8 < the 23- and 17-token sequences)
    "qwen3_window": ("tests/fixtures/llama/qwen3_window", 5303),
    # exact GELU and linear RoPE scaling
    "gelu_linear_rope": ("tests/fixtures/llama/gelu_linear_rope", 5404),
    # Gemma 2: soft caps on scores and logits, norms after each block, the scaled embedding
    "gemma2_softcap": ("tests/fixtures/llama/gemma2_softcap", 5505),
    # Gemma 3: (1 + w) q/k norms, local and global RoPE tables
    "gemma3_local_rope": ("tests/fixtures/llama/gemma3_local_rope", 5606),
    # Mistral: every layer over a window of 10, shorter than the 23- and 17-token sequences
    "mistral_window": ("tests/fixtures/llama/mistral_window", 5707),
    # Phi-3: fused qkv_proj and gate_up_proj (the adapter on the fused modules, as peft names them),
    # every layer over a window of 9
    "phi3_fused": ("tests/fixtures/llama/phi3_fused", 5808),
}
LENGTHS = (23, 17, 11)
# Bases whose reference also records the float32-vs-float64 spread of the LoRA run's final adapter
# (those made since it was added; the test takes 1e-4 where it is absent).
F64_SPREAD = ("gemma2_softcap", "gemma3_local_rope", "mistral_window", "phi3_fused")
FIRST_ID = 3  # token ids are drawn uniformly from [FIRST_ID, vocab)

LORA_CFG = dict(r=4, lora_alpha=8, lora_dropout=0.0,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                bias="none")
# Every linear module of a model whose checkpoint fuses q/k/v and gate/up (Phi-3).
LORA_CFG_FUSED = dict(LORA_CFG, target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])


def split_fused(tensors, config):
    """Phi-3's fused matrices (and their gradients) under the separate names qlm holds them by: the
    rows of qkv_proj are q, k, v, those of gate_up_proj gate, up (transformers' own split)."""
    head_dim = config.hidden_size // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    parts = {"self_attn.qkv_proj": [("self_attn.q_proj", q), ("self_attn.k_proj", kv), ("self_attn.v_proj", kv)],
             "mlp.gate_up_proj": [("mlp.gate_proj", config.intermediate_size),
                                  ("mlp.up_proj", config.intermediate_size)]}
    out = {}
    for name, t in tensors.items():
        fused = next((f for f in parts if f"{f}.weight" in name), None)
        if fused is None:
            out[name] = t
            continue
        row = 0
        for part, rows in parts[fused]:
            out[name.replace(fused, part)] = t[row:row + rows].contiguous()
            row += rows
        assert row == t.shape[0], name
    return out


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


def tensor_class(name):
    for key in ("lora_A", "lora_B", "embed_tokens", "lm_head", "norm", "bias"):
        if key in name:
            return key
    for key in ("qkv_proj", "q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "gate_proj", "up_proj",
                "down_proj"):
        if key in name:
            return key
    return "other"


def make_one(name, base, seed, out_root):
    out = C.fresh_dir(out_root, name, base)

    # ---- batch, loss and full gradients -------------------------------------------------------
    model = load_base(base)
    vocab = model.config.vocab_size
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    ids, labels = make_batch(vocab, seed)
    C.write_json(os.path.join(out, "batch.json"), {"ids": ids, "labels": labels})

    def loss_fn(m):
        return batch_loss(m, ids, labels)

    loss_f, n_targets, seq_sums, grads, grad_norm = C.full_grads(model, base, out, loss_fn)
    fused = model.config.model_type == "phi3"
    if fused:
        C.save_st(split_fused(grads, model.config), os.path.join(out, "grads.safetensors"))
    padded = hf_padded_loss(model, ids, labels)
    loss_ref = C.check_padded(loss_f, n_targets, seq_sums, grad_norm, padded, 1e-5)
    C.print_max_abs("max |grad|", grads, tensor_class)

    ref = {
        "base": base,
        "lengths": list(LENGTHS),
        "data_seed": seed,
        **loss_ref,
        "tied_embeddings": tied,
    }

    # ---- LoRA (randomized B): loss, gradients, 10 AdamW steps ---------------------------------
    del model
    ref.update(C.lora_reference(load_base(base), LORA_CFG_FUSED if fused else LORA_CFG, out, loss_fn, tensor_class,
                                save_final=True, f64_twin=load_base(base) if name in F64_SPREAD else None))

    # ---- full fine-tuning: 10 AdamW steps --------------------------------------------------------
    # one model's final weights keep the fixtures small
    ref["adamw_losses"], ref["adamw_grad_norms"] = C.full_reference(
        load_base(base), base, out, loss_fn, tensor_class, save_final=(name == "gqa_tied"))
    C.write_reference(out, ref)


if __name__ == "__main__":
    C.main(__doc__, "tests/fixtures/train", BASES, make_one)
