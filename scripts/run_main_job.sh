#!/usr/bin/env bash
# `make run`: the main job on the embedded default model (SmolLM2-135M-Instruct): summarize the
# dialogue shown in README.md with `qlm summarize`, then answer one question with `qlm chat`.
set -euo pipefail
qlm=${1:-build/qlm}
cd "$(dirname "$0")/.."
. scripts/default_model.sh
dialogue=$(scripts/demo_dialogue.sh)
question="What are three things to pack for a day at the beach?"
flags=(-m "$model" --dtype int8 --per-channel --temp 0 --repeat-penalty 1.1 -n 256 --quiet)
echo "== Summary of the dialogue in README.md =="
printf '%s\n' "$dialogue" | "$qlm" summarize "${flags[@]}"
echo
echo "== Chat: $question =="
"$qlm" chat "${flags[@]}" -p "$question"
