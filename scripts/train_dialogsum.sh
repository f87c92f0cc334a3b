#!/usr/bin/env bash
# `make train-eval`: LoRA-trains the default model (SmolLM2-135M-Instruct) on DialogSum training
# dialogues with the lab's prompt through its chat template, then summarizes the first 100 test
# dialogues without and with the adapter and scores both with ROUGE. Records the scores, the
# training tokens/s and peak memory in docs/benchmarks.md (the dialogsum-lora block). About 40
# minutes on 2 cores. QLM_TRAIN_STEPS (default 240 steps of 4 dialogues) sets the budget; an
# interrupted run continues where its checkpoint stopped.
set -euo pipefail
qlm=${1:-build/qlm}
cd "$(dirname "$0")/.."
. scripts/result_common.sh
out_dir="${QLM_TRAIN_DIR:-$cache/train-dialogsum}"
steps="${QLM_TRAIN_STEPS:-240}"
mkdir -p "$out_dir"
test100="$out_dir/dialogsum.test100.jsonl"
head -n 100 "$assets/dialogsum/dialogsum.test.jsonl" > "$test100"

echo "train-eval: LoRA training, $steps steps (checkpoints in $out_dir/run)" >&2
"$qlm" train -m "$model" --data "$assets/dialogsum/dialogsum.train.from_zip_2021-05.jsonl" \
    --eval "$assets/dialogsum/dialogsum.dev.jsonl" --eval-max 40 --eval-every 100 --target-field summary --chat \
    --out "$out_dir/run" --steps "$steps" --batch 4 --seq-len 512 --rank 16 --lr 4e-4 --warmup 10 --save-every 40 \
    --resume

score() { # name, extra flags...
    local name=$1; shift
    local log="$out_dir/$name.log"
    echo "train-eval: summarizing 100 test dialogues ($name)" >&2
    rm -f "$out_dir/$name.jsonl"
    "$qlm" summarize -m "$model" --batch "$test100" --out "$out_dir/$name.jsonl" --batch-size 16 -n 128 --eval "$@" \
        2>&1 | tee "$log" >&2
}
score base
score lora --lora dialogsum="$out_dir/run/adapter" --adapter dialogsum

f1() { awk -v m="$2" '$1 == m { print $4 }' "$out_dir/$1.log"; }
field() { sed -n "s/.*\"$1\":[[:space:]]*\([0-9.e+-]*\).*/\1/p" "$out_dir/run/summary.json" | head -n1; }
block=$(mktemp)
trap 'rm -f "$block"' EXIT
{
    echo "<!-- dialogsum-lora -->"
    echo "## LoRA fine-tuning on DialogSum"
    echo
    echo "Written by \`make train-eval\` on $(date -u +%Y-%m-%d): \`qlm train --lora\` (rank 16, alpha 32, all linear"
    echo "layers, dropout 0.05, AdamW lr 4e-4 cosine with 10 warm-up steps, batch 4, sequences up to 512 tokens, F32)"
    echo "for $(field steps) steps on DialogSum training dialogues (the lab's prompt as the user turn of SmolLM2's chat"
    echo "template, loss on the summary only), then \`qlm summarize --batch --eval\` on the first 100 test dialogues"
    echo "(greedy, at most 128 new tokens) without and with the adapter."
    echo
    echo "| model | ROUGE-1 | ROUGE-2 | ROUGE-L | ROUGE-Lsum |"
    echo "| --- | ---: | ---: | ---: | ---: |"
    echo "| SmolLM2-135M-Instruct, zero-shot | $(f1 base ROUGE-1) | $(f1 base ROUGE-2) | $(f1 base ROUGE-L) | $(f1 base ROUGE-Lsum) |"
    echo "| SmolLM2-135M-Instruct + LoRA (qlm train) | $(f1 lora ROUGE-1) | $(f1 lora ROUGE-2) | $(f1 lora ROUGE-L) | $(f1 lora ROUGE-Lsum) |"
    echo
    printf 'Training: %s tokens in %.0f s, %.0f tokens/s on %s cores; peak memory %.0f MiB RSS (activations %.0f MiB);\n' \
        "$(field tokens)" "$(field train_seconds)" "$(field tokens_per_s)" "$(nproc)" "$(field peak_rss_mib)" \
        "$(field activation_mib)"
    printf 'last training loss %.3f, dev loss %.3f (40 dialogues); %s dialogues seen.\n' "$(field last_loss)" \
        "$(field last_eval_loss)" "$(( $(field steps) * 4 ))"
    echo "<!-- /dialogsum-lora -->"
} > "$block"
doc_block dialogsum-lora "$block"
echo "train-eval: results recorded in docs/benchmarks.md" >&2
