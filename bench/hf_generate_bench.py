#!/usr/bin/env python3
"""Dev-time comparison for qlm's batch summarization on a GPU: Hugging Face transformers generate()
on the same dialogues, prompt and generation length as `qlm summarize --batch` in the same run.

Usage: hf_generate_bench.py MODEL_FOLDER DIALOGUES.jsonl BATCH MAX_NEW [--random-weights]
MODEL_FOLDER holds config.json, tokenizer.json and tokenizer_config.json (and the weights unless
--random-weights: then the model is built from config.json, as qlm's --random-weights does; the
speed does not depend on the values). Each dialogue becomes the DialogSum lab's prompt as one user
turn of the model's chat template, as qlm renders it; greedy, BF16, left padding, batches of BATCH
in file order, exactly MAX_NEW new tokens each (min_new_tokens = max_new_tokens, so both engines
generate the same number of tokens whatever the weights). Prints one line: dialogues/s and
generated tokens/s. Never used by qlm."""
import json
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

PROMPT = "Summarize the following conversation.\n\n{dialogue}\n\nSummary: "


def main():
    folder, data, batch, max_new = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    random_weights = "--random-weights" in sys.argv[5:]
    torch.manual_seed(1)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if random_weights:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.bfloat16)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    model = model.cuda().eval()
    with open(data) as f:
        dialogues = [json.loads(line)["dialogue"] for line in f if line.strip()]
    prompts = [tok.apply_chat_template([{"role": "user", "content": PROMPT.format(dialogue=d)}], tokenize=False,
                                       add_generation_prompt=True) for d in dialogues]
    with torch.no_grad():  # one warm-up batch: kernels and cuBLAS handles, as qlm's first step has
        warm = tok(prompts[:batch], return_tensors="pt", padding=True, add_special_tokens=False).to("cuda")
        model.generate(**warm, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    generated = 0
    with torch.no_grad():
        for i in range(0, len(prompts), batch):
            enc = tok(prompts[i:i + batch], return_tensors="pt", padding=True, add_special_tokens=False).to("cuda")
            out = model.generate(**enc, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
            generated += (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0]
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(f"transformers generate: {len(prompts)} dialogues, batch {batch}, {dt:.2f} s, "
          f"{len(prompts) / dt:.2f} dialogues/s, {generated / dt:.0f} generated tokens/s")


if __name__ == "__main__":
    main()
