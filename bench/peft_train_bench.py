#!/usr/bin/env python3
"""Dev-time comparison for `make bench` and scripts/bench_gpu_train.sh: training throughput and peak
memory of Hugging Face transformers (+ peft for LoRA) on the same data, model, rank and sequence
lengths as `qlm train` in the same run.

Usage: peft_train_bench.py MODEL_FOLDER DATA.jsonl STEPS BATCH THREADS [--device cuda] [--random-weights]
                           [--full] [--seq-len N] [--dtype f32|bf16]
DATA.jsonl holds {"prompt", "completion"} lines; each example is prompt + completion + EOS tokens (cut to
--seq-len) with the loss on the completion and EOS, batches of BATCH examples in file order, AdamW, gradient
clipping at 1; LoRA r=16 alpha=32 dropout 0.05 on all linear layers, or --full. --dtype f32 (default): F32
throughout, TF32 off. --dtype bf16, the mixed precision `qlm train --dtype bf16` runs: the forward and
backward under torch.autocast to BF16, the trained weights and AdamW in F32, and for LoRA a frozen base
stored in BF16 (peft keeps the adapters F32). Prints one
line: tokens/s, peak memory MiB (host RSS on the CPU; the GPU's peak reserved by torch's allocator plus
its context, as nvidia-smi would count, on cuda), tokens, seconds. Never used by qlm."""
import argparse
import json
import resource
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("data")
    ap.add_argument("steps", type=int)
    ap.add_argument("batch", type=int)
    ap.add_argument("threads", type=int)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--seq-len", type=int, default=0)
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1)
    dev = torch.device(a.device)
    tok = AutoTokenizer.from_pretrained(a.folder)
    bf16 = a.dtype == "bf16"
    weights = torch.bfloat16 if bf16 and not a.full else torch.float32
    if a.random_weights:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(a.folder), dtype=weights)
    else:
        model = AutoModelForCausalLM.from_pretrained(a.folder, dtype=weights)
    if not a.full:
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    model.to(dev)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=4e-4, weight_decay=0.01)
    examples = []
    with open(a.data) as f:
        for line in f:
            r = json.loads(line)
            p = tok(r["prompt"], add_special_tokens=False)["input_ids"]
            c = tok(r["completion"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            ids, labels = p + c, [-100] * len(p) + c
            if a.seq_len:
                ids, labels = ids[:a.seq_len], labels[:a.seq_len]
            examples.append((ids, labels))
    tokens, t0 = 0, time.perf_counter()
    for step in range(a.steps):
        chunk = examples[step * a.batch:(step + 1) * a.batch]
        L = max(len(ids) for ids, _ in chunk)
        ids = torch.full((len(chunk), L), tok.eos_token_id, dtype=torch.long)
        labels = torch.full((len(chunk), L), -100, dtype=torch.long)
        mask = torch.zeros((len(chunk), L), dtype=torch.long)
        for b, (x, y) in enumerate(chunk):
            ids[b, :len(x)], labels[b, :len(y)], mask[b, :len(x)] = torch.tensor(x), torch.tensor(y), 1
            tokens += len(x)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids.to(dev), attention_mask=mask.to(dev), labels=labels.to(dev)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info()
        # What the process holds on the GPU: the allocator's peak plus what lies outside it (context, cuBLAS).
        outside = (total - free) - torch.cuda.memory_reserved()
        peak = (torch.cuda.max_memory_reserved() + max(outside, 0)) / 1048576.0
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"{tokens / seconds:.1f} {peak:.0f} {tokens} {seconds:.1f}")


if __name__ == "__main__":
    main()
