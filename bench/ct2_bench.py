#!/usr/bin/env python3
"""Dev-time comparison for `make bench`: CTranslate2 on the CPU summarizing the same DialogSum
dialogues as `qlm summarize --batch` in the same run, with the same prompts, greedy, exactly MAX_NEW
new tokens each. Never used by qlm.

Usage:
  ct2_bench.py convert CONFIG_FOLDER OUT QUANT
      A model of CONFIG_FOLDER's config.json with random weights (built by transformers from the
      config, as qlm's --random-weights builds one: the speed does not depend on the values),
      converted by CTranslate2's converter to OUT with quantization QUANT (float32 or int8).
  ct2_bench.py run CT2_MODEL CONFIG_FOLDER DIALOGUES.jsonl BATCH MAX_NEW THREADS
      Summarizes the dialogues in batches of BATCH in file order on THREADS threads (intra_threads;
      one batch at a time), after one warm-up batch. A T5 model gets the DialogSum lab's prompt as
      plain text with the tokenizer's </s>, a decoder the prompt as one user turn of its chat
      template, as qlm renders them, tokenized by CONFIG_FOLDER's tokenizer.json as qlm tokenizes. Prints one JSON line: dialogues, seconds, prompt_tokens,
      generated_tokens.
Needs ctranslate2, tokenizers, transformers and torch."""
import json
import os
import sys
import time

import ctranslate2
import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

PROMPT = "Summarize the following conversation.\n\n{dialogue}\n\nSummary: "


def is_t5(folder):
    return AutoConfig.from_pretrained(folder).model_type == "t5"


def convert(folder, out, quant):
    import tempfile

    from ctranslate2.converters import TransformersConverter

    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(folder)
    build = AutoModelForSeq2SeqLM if is_t5(folder) else AutoModelForCausalLM
    model = build.from_config(cfg, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as hf:
        model.save_pretrained(hf)
        AutoTokenizer.from_pretrained(folder).save_pretrained(hf)
        TransformersConverter(hf).convert(out, quantization=quant, force=True)


def prompts(folder, dialogues, t5):
    """Token ids by the folder's tokenizer.json, the file qlm reads (transformers 5 builds T5's tokenizer
    from spiece.model instead, which drops the space that ends the prompt)."""
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    if t5:
        return [tok.encode(PROMPT.format(dialogue=d)).ids for d in dialogues]
    chat = AutoTokenizer.from_pretrained(folder)
    texts = [chat.apply_chat_template([{"role": "user", "content": PROMPT.format(dialogue=d)}], tokenize=False,
                                      add_generation_prompt=True) for d in dialogues]
    return [tok.encode(t, add_special_tokens=False).ids for t in texts]


def run(model, folder, data, batch, max_new, threads):
    t5 = is_t5(folder)
    with open(data) as f:
        dialogues = [json.loads(line)["dialogue"] for line in f if line.strip()]
    ids = prompts(folder, dialogues, t5)
    vocab = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    tokens = [[vocab.id_to_token(i) for i in p] for p in ids]
    if t5:
        engine = ctranslate2.Translator(model, device="cpu", inter_threads=1, intra_threads=threads)

        def step(b):
            res = engine.translate_batch(b, beam_size=1, max_decoding_length=max_new, min_decoding_length=max_new,
                                         max_input_length=0)
            return sum(len(r.hypotheses[0]) for r in res)
    else:
        engine = ctranslate2.Generator(model, device="cpu", inter_threads=1, intra_threads=threads)

        def step(b):
            res = engine.generate_batch(b, max_length=max_new, min_length=max_new, include_prompt_in_result=False)
            return sum(len(r.sequences_ids[0]) for r in res)

    step(tokens[:batch])
    generated = 0
    t0 = time.perf_counter()
    for i in range(0, len(tokens), batch):
        generated += step(tokens[i:i + batch])
    dt = time.perf_counter() - t0
    print(json.dumps({"dialogues": len(tokens), "seconds": round(dt, 3), "prompt_tokens": sum(map(len, ids)),
                      "generated_tokens": generated}))


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "convert":
        convert(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 8 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
