#!/usr/bin/env bash
# `make run`: the main job on the embedded default model (SmolLM2-135M-Instruct): summarize the
# dialogue shown in README.md, then answer one chat question in the same conversation.
set -euo pipefail
qlm=${1:-build/qlm}
cd "$(dirname "$0")/.."
cache="${QLM_CACHE:-$HOME/.cache/qlm}"
gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
model="$cache/SmolLM2-135M-Instruct"
if [ ! -f "$model/model.safetensors" ]; then
    echo "run: converting the default model once: $gguf -> $model" >&2
    "$qlm" convert "$gguf" "$model.tmp" --dtype bf16
    rm -rf "$model" && mv "$model.tmp" "$model"
fi
# The dialogue is the fenced block after the "demo-dialogue" marker in README.md.
dialogue=$(awk '/<!-- demo-dialogue -->/{f=1; next} f && /^```/{n++; if (n==2) exit; next} f && n==1' README.md)
[ -n "$dialogue" ] || { echo "run: demo dialogue not found in README.md" >&2; exit 1; }
question="What are three things to pack for a day at the beach?"
run_chat() { "$qlm" chat -m "$model" --dtype int8 --per-channel --temp 0 --repeat-penalty 1.1 -n 256 --quiet -p "$1"; }
echo "== Summary of the dialogue in README.md =="
run_chat "Summarize the following conversation.

$dialogue

Summary:"
echo
echo "== Chat: $question =="
run_chat "$question"
