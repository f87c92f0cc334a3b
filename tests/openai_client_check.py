#!/usr/bin/env python3
"""The official `openai` client against `qlm serve`, unchanged. Run by tests/test_serve.c with the Python
that `scripts/setup.sh --test` prepares ($QLM_CACHE/test-python, which has the pinned `openai`).

Starts QLM serve on a free loopback port and checks, through the client only: the model list; completions
and chat, each streamed and not (greedy, so the streamed text must equal the other); n = 2 (streamed and
not, each choice the answer alone) and echo (with the prompt's log-probabilities); an adapter loaded
with POST /v1/adapters, chosen by "model" and by the "adapter" field, changing the answer; eight
concurrent sampled requests over the base and two adapters, each equal to the same request alone; the
adapters unloaded with DELETE; and the client's typed errors (404 for an unknown model, 401 for a wrong
key). Exits 0 when every check holds; SIGTERM must then drain the server to exit 0.

usage: tests/openai_client_check.py QLM_BIN MODEL_DIR WORK_DIR"""
import concurrent.futures
import json
import os
import random
import re
import signal
import struct
import subprocess
import sys

import openai


def write_adapter(folder, config, seed, rank=4, alpha=8):
    """A PEFT LoRA folder on q_proj and v_proj with non-zero A and B (B = 0 would leave the model as it is)."""
    hidden = config["hidden_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config.get("num_key_value_heads", config["num_attention_heads"]) * head_dim
    rng = random.Random(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, out in (("q_proj", hidden), ("v_proj", kv)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = ([rank, hidden], [rng.gauss(0, hidden ** -0.5) for _ in range(rank * hidden)])
            tensors[f"{prefix}.lora_B.weight"] = ([out, rank], [rng.gauss(0, 0.5) for _ in range(out * rank)])
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in tensors.items():
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
                   "target_modules": ["q_proj", "v_proj"], "bias": "none", "lora_dropout": 0.0}, f)


def complete(client, model, stream=False, **extra):
    args = dict(model=model, prompt="Once upon a time", max_tokens=24, temperature=0, **extra)
    if not stream:
        c = client.completions.create(**args)
        assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 24, c
        return c.choices[0].text
    return "".join(p.choices[0].text for p in client.completions.create(stream=True, **args))


def main():
    qlm, model_dir, work = sys.argv[1:4]
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    adapter_dir, adapter2_dir = os.path.join(work, "adapter"), os.path.join(work, "adapter2")
    write_adapter(adapter_dir, config, seed=7)
    write_adapter(adapter2_dir, config, seed=8)

    proc = subprocess.Popen([qlm, "serve", "-m", model_dir, "--port", "0", "--api-key", "k", "--name", "m", "--max-seqs", "8",
                             "--adapter-dir", work], stdout=subprocess.PIPE, text=True)
    try:
        port = int(re.search(r"127\.0\.0\.1:(\d+)", proc.stdout.readline()).group(1))
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)

        assert [m.id for m in client.models.list().data] == ["m"]
        base = complete(client, "m")
        assert base and complete(client, "m", stream=True) == base

        msgs = [{"role": "user", "content": "Tell me a story"}]
        chat = client.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=0)
        reply = chat.choices[0].message.content
        assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 16, chat
        parts = client.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=0, stream=True,
                                               stream_options={"include_usage": True})
        chunks = list(parts)
        assert "".join(p.choices[0].delta.content or "" for p in chunks if p.choices) == reply
        # include_usage: one last chunk with no choices carries the usage, the others none
        assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == 16, chunks[-1]
        assert all(p.usage is None for p in chunks[:-1]), chunks

        # n: greedy choices are each the answer alone, indexed 0..n-1, streamed or not; the usage counts
        # the prompt once. echo: the text starts with the prompt, with its tokens' log-probabilities.
        two = client.completions.create(model="m", prompt="Once upon a time", max_tokens=24, temperature=0, n=2)
        assert [(c.index, c.text) for c in two.choices] == [(0, base), (1, base)], two
        streamed = ["", ""]
        for p in client.completions.create(model="m", prompt="Once upon a time", max_tokens=24, temperature=0, n=2,
                                           stream=True):
            for c in p.choices:
                streamed[c.index] += c.text
        assert streamed == [base, base], streamed
        chats = client.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=0, n=2)
        assert [c.message.content for c in chats.choices] == [reply, reply], chats
        assert complete(client, "m", echo=True) == "Once upon a time" + base
        echoed = client.completions.create(model="m", prompt="Once upon a time", max_tokens=4, temperature=0, echo=True,
                                           logprobs=1)
        lp = echoed.choices[0].logprobs
        assert lp.token_logprobs[0] is None and len(lp.tokens) == echoed.usage.prompt_tokens + 4, lp
        assert "".join(lp.tokens[:echoed.usage.prompt_tokens]) == "Once upon a time", lp
        assert two.usage.completion_tokens == 48 and two.usage.prompt_tokens == echoed.usage.prompt_tokens, two.usage

        loaded = client.post("/adapters", body={"name": "story", "path": adapter_dir}, cast_to=object)
        assert loaded, loaded
        models = {m.id: m for m in client.models.list().data}
        assert set(models) == {"m", "story"} and models["story"].model_extra.get("parent") == "m", models
        tuned = complete(client, "story")
        assert tuned != base, "the adapter did not change the answer"
        assert complete(client, "story", stream=True) == tuned
        assert complete(client, "m", extra_body={"adapter": "story"}) == tuned
        assert complete(client, "m") == base

        # Eight requests at once over the base and two adapters, sampled with a seed each: every one
        # gets exactly what it gets alone, so the batch keeps each row's adapter and sampler apart.
        client.post("/adapters", body={"name": "tale", "path": adapter2_dir}, cast_to=object)
        jobs = [(["m", "story", "tale"][i % 3], f"Request {i}: once upon a time", i) for i in range(8)]

        def sampled(job):
            model, prompt, seed = job
            c = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0.8, seed=seed)
            return c.choices[0].text

        alone = [sampled(job) for job in jobs]
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            together = list(pool.map(sampled, jobs))
        assert together == alone, (together, alone)
        client.delete("/adapters/tale", cast_to=object)
        client.delete("/adapters/story", cast_to=object)
        assert [m.id for m in client.models.list().data] == ["m"]

        for call, error in ((lambda: complete(client, "story"), openai.NotFoundError),
                            (lambda: openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
                             .models.list(), openai.AuthenticationError)):
            try:
                call()
                raise AssertionError(f"expected {error.__name__}")
            except error:
                pass
        print(f"ok: models, completions, chat, streaming, n, echo, adapters, 8 concurrent mixed-adapter requests and errors "
              f"through openai {openai.__version__}")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, "qlm serve did not exit 0 after SIGTERM"


if __name__ == "__main__":
    main()
