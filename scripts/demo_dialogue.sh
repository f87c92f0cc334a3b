#!/usr/bin/env bash
# Prints the demo dialogue of README.md: the fenced block after its "demo-dialogue" marker (the
# main job summarizes it, make bench measures the default model's footprint on it).
set -euo pipefail
cd "$(dirname "$0")/.."
dialogue=$(awk '/<!-- demo-dialogue -->/{f=1; next} f && /^```/{n++; if (n==2) exit; next} f && n==1' README.md)
[ -n "$dialogue" ] || { echo "demo dialogue not found in README.md" >&2; exit 1; }
printf '%s\n' "$dialogue"
