#!/usr/bin/env bash
# `make eval`: summarizes the 500 DialogSum test dialogues with the default model through
# `qlm summarize --batch --eval`, and records the ROUGE scores and timing in docs/benchmarks.md
# (the block between the dialogsum-eval markers, which `make bench` keeps). About 4 minutes on
# 2 cores. QLM_EVAL_ARGS adds summarize flags (e.g. "--shots 1 --examples FILE").
set -euo pipefail
qlm=${1:-build/qlm}
cd "$(dirname "$0")/.."
. scripts/result_common.sh
out_dir="${QLM_EVAL_DIR:-$cache/eval}"
mkdir -p "$out_dir"
pred="$out_dir/smollm2-dialogsum-test.jsonl"
log=$(mktemp)
trap 'rm -f "$log" "$log.block"' EXIT
resume=()
[ -s "$pred" ] && resume=(--resume)
# shellcheck disable=SC2086
"$qlm" summarize -m "$model" --dtype bf16 --batch "$assets/dialogsum/dialogsum.test.jsonl" --out "$pred" \
    --batch-size 16 -n 128 --eval "${resume[@]}" ${QLM_EVAL_ARGS:-} 2>&1 | tee "$log"
f1() { awk -v m="$1" '$1 == m { print $4 }' "$log"; }
# BF16 products' sums may differ in their last bits between kernel sets (VDPBF16PS's pairs, the F32
# FMAs' even columns then odd ones, AMX's tiles), and greedy summaries with them: the block names the set.
kernels=$("$qlm" info --json | jq -r '.cpu.kernels')
{
    echo "<!-- dialogsum-eval -->"
    echo "## DialogSum test set: ROUGE"
    echo
    echo "Written by \`make eval\` on $(date -u +%Y-%m-%d): \`qlm summarize --batch --eval\` over the 500 dialogues of"
    echo "dialogsum.test.jsonl, zero-shot (the lab's prompt; SmolLM2 gets it through its chat template), greedy, at most"
    echo "128 new tokens, BF16 weights, batch size 16, $kernels kernels; F1 against the best of summary1..3 per metric,"
    echo "stemmed, equal to rouge_score. The FLAN-T5-base rows are the lab's published figures (not measured here)."
    echo
    echo "| model | ROUGE-1 | ROUGE-2 | ROUGE-L | ROUGE-Lsum |"
    echo "| --- | ---: | ---: | ---: | ---: |"
    echo "| SmolLM2-135M-Instruct, zero-shot (qlm) | $(f1 ROUGE-1) | $(f1 ROUGE-2) | $(f1 ROUGE-L) | $(f1 ROUGE-Lsum) |"
    echo "| FLAN-T5-base, zero-shot (lab) | 0.2334 | | | |"
    echo "| FLAN-T5-base, full fine-tuning (lab) | 0.4216 | | | |"
    echo "| FLAN-T5-base, LoRA (lab) | 0.4081 | | | |"
    echo
    if grep -q '^summarize: .* dialogues in ' "$log"; then
        echo "This run: $(sed -n 's/^summarize: //p' "$log")."
    else
        echo "Scored from the output of an earlier run (--resume found nothing left to generate)."
    fi
    echo "<!-- /dialogsum-eval -->"
} > "$log.block"
doc_block dialogsum-eval "$log.block"
echo "eval: scores recorded in docs/benchmarks.md" >&2
