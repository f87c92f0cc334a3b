#!/usr/bin/env python3
"""Dev-time comparison for `make bench`: LoRA training throughput and peak memory of Hugging Face
transformers + peft on the same data, model, rank and sequence lengths as `qlm train` in the same run.

Usage: peft_train_bench.py MODEL_FOLDER DATA.jsonl STEPS BATCH THREADS
DATA.jsonl holds {"prompt", "completion"} lines; each example is prompt + completion + EOS tokens with
the loss on the completion and EOS, batches of BATCH examples in file order, F32, AdamW, LoRA r=16 alpha=32
dropout 0.05 on all linear layers. Prints one line: tokens/s and peak RSS MiB. Never used by qlm."""
import json
import resource
import sys
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    folder, data, steps, batch, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=4e-4, weight_decay=0.01)
    examples = []
    with open(data) as f:
        for line in f:
            r = json.loads(line)
            p = tok(r["prompt"], add_special_tokens=False)["input_ids"]
            c = tok(r["completion"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            examples.append((p + c, [-100] * len(p) + c))
    tokens, t0 = 0, time.perf_counter()
    for step in range(steps):
        chunk = examples[step * batch:(step + 1) * batch]
        L = max(len(ids) for ids, _ in chunk)
        ids = torch.full((len(chunk), L), tok.eos_token_id, dtype=torch.long)
        labels = torch.full((len(chunk), L), -100, dtype=torch.long)
        mask = torch.zeros((len(chunk), L), dtype=torch.long)
        for b, (x, y) in enumerate(chunk):
            ids[b, :len(x)], labels[b, :len(y)], mask[b, :len(x)] = torch.tensor(x), torch.tensor(y), 1
            tokens += len(x)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"{tokens / seconds:.1f} {rss:.0f} {tokens} {seconds:.1f}")


if __name__ == "__main__":
    main()
