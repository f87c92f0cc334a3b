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
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from transformers import T5ForConditionalGeneration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_fixture_common as C  # noqa: E402  (shared with make_train_fixtures.py)

BASES = {
    # name: (base fixture folder, data seed, LoRA target modules)
    "gated_untied": ("tests/fixtures/t5/gated_untied", 7101, ["q", "k", "v", "o", "wi_0", "wi_1", "wo"]),
    "relu_tied": ("tests/fixtures/t5/relu_tied", 7204, ["q", "k", "v", "o", "wi", "wo"]),
}
SRC_LENGTHS = (13, 9)
TGT_LENGTHS = (7, 5)
FIRST_ID = 2  # token ids are drawn uniformly from [FIRST_ID, vocab); the last tgt id is then set to EOS
EOS_ID = 1

LORA_BASE = dict(r=4, lora_alpha=8, lora_dropout=0.0, bias="none", task_type="SEQ_2_SEQ_LM")


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


def tensor_class(name):
    for key in ("lora_A", "lora_B", "shared", "lm_head", "relative_attention_bias", "layer_norm"):
        if key in name:
            return key
    parts = name.split(".")
    leaf = parts[-2]  # q, k, v, o, wi, wi_0, wi_1, wo
    if leaf in ("q", "k", "v", "o"):
        return f"{parts[-3]}.{leaf}"  # SelfAttention.q / EncDecAttention.q
    return leaf


def make_one(name, base, seed, targets, out_root):
    out = C.fresh_dir(out_root, name, base)

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
    C.write_json(os.path.join(out, "batch.json"), {"src": src, "tgt": tgt})

    def loss_fn(m):
        return batch_loss(m, src, tgt)

    # the embedding shared by encoder, decoder (and the tied head) is one parameter, shared.weight
    loss_f, n_targets, seq_sums, grads, grad_norm = C.full_grads(model, base, out, loss_fn)
    padded = hf_padded_loss(model, src, tgt)
    loss_ref = C.check_padded(loss_f, n_targets, seq_sums, grad_norm, padded, 1e-6)
    C.print_max_abs("max |grad|", grads, tensor_class)

    ref = {
        "base": base,
        "src_lengths": list(SRC_LENGTHS),
        "tgt_lengths": list(TGT_LENGTHS),
        "data_seed": seed,
        "decoder_start_token_id": cfg.decoder_start_token_id,
        "eos_token_id": EOS_ID,
        **loss_ref,
        "hf_padded_batch_loss_abs_diff": abs(padded - loss_f),
        "tied_embeddings": tied,
        "grad_tensors": len(grads),
    }

    # ---- LoRA (randomized B): loss, gradients, 10 AdamW steps ---------------------------------
    del model
    lora_cfg = dict(LORA_BASE, target_modules=targets)
    ref.update(C.lora_reference(load_base(base), lora_cfg, out, loss_fn, tensor_class, save_final=False))

    # ---- full fine-tuning: 10 AdamW steps (relative_attention_bias [buckets, heads] gets decay) --
    ref["adamw_losses"], ref["adamw_grad_norms"] = C.full_reference(
        load_base(base), base, out, loss_fn, tensor_class, save_final=False)
    C.write_reference(out, ref)


def require_transformers_4():
    if not transformers.__version__.startswith("4."):
        raise SystemExit(f"transformers {transformers.__version__}: T5 needs 4.x (5 forces tied embeddings)")


if __name__ == "__main__":
    C.main(__doc__, "tests/fixtures/train_t5", BASES, make_one, check=require_transformers_4)
