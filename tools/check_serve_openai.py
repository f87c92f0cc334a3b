#!/usr/bin/env python3
"""Dev-time check that the official `openai` client works against `qlm serve` unchanged (not part of
`make test`; needs `pip install openai`). Starts build/qlm serve on a free port, runs completions,
chat, and streaming (greedy: the streamed text must equal the non-streamed one), then SIGTERM.

usage: tools/check_serve_openai.py [MODEL]   (default ../shared/assets/tinystories-656K-hf)"""
import re
import signal
import subprocess
import sys

import openai

model_path = sys.argv[1] if len(sys.argv) > 1 else "../shared/assets/tinystories-656K-hf"
proc = subprocess.Popen(["build/qlm", "serve", "-m", model_path, "--port", "0", "--api-key", "k", "--name", "m"],
                        stdout=subprocess.PIPE, text=True)
line = proc.stdout.readline()
port = int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k")
try:
    assert [m.id for m in client.models.list().data][0] == "m"
    c = client.completions.create(model="m", prompt="Once upon a time", max_tokens=24, temperature=0)
    text = c.choices[0].text
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 24, c
    parts = client.completions.create(model="m", prompt="Once upon a time", max_tokens=24, temperature=0, stream=True)
    assert "".join(p.choices[0].text for p in parts) == text
    msgs = [{"role": "user", "content": "Tell me a story"}]
    chat = client.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=0)
    reply = chat.choices[0].message.content
    parts = client.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=0, stream=True)
    assert "".join(p.choices[0].delta.content or "" for p in parts) == reply
    try:
        client.completions.create(model="nope", prompt="a")
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError:
        pass
    print("ok: models, completions, chat, streaming and errors through the openai client", openai.__version__)
finally:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
