#!/usr/bin/env bash
# `make train-eval`: LoRA-trains the default model (SmolLM2-135M-Instruct) on DialogSum training
# dialogues with the lab's prompt through its chat template, then summarizes the first 100 test
# dialogues without and with the adapter and scores both with ROUGE. Records the scores, the
# training tokens/s and peak memory in docs/benchmarks.md (the dialogsum-lora block). About 40
# minutes on 2 cores. QLM_TRAIN_STEPS (default 240 steps of 4 dialogues) sets the budget; an
# interrupted run continues where its checkpoint stopped.
# QLM_TRAIN_SCALE=lab runs the lab's scale instead, for a GPU (QLM_TRAIN_DEVICE=cuda): one epoch
# over all 12,460 training dialogues in batches of 8, BF16 compute, ROUGE on all 500 test
# dialogues (the dialogsum-lora-lab block).
set -euo pipefail
qlm=${1:-build/qlm}
cd "$(dirname "$0")/.."
. scripts/result_common.sh
out_dir="${QLM_TRAIN_DIR:-$cache/train-dialogsum}"
device="${QLM_TRAIN_DEVICE:-cpu}"
if [ "${QLM_TRAIN_SCALE:-}" = lab ]; then
    block_name=dialogsum-lora-lab n_test=500 batch=8 warmup=30 every=500 save=500 summ_batch=64
    budget=() budget_text="one epoch" dtype=bf16
else
    block_name=dialogsum-lora n_test=100 batch=4 warmup=10 every=100 save=40 summ_batch=16
    budget=(--steps "${QLM_TRAIN_STEPS:-240}") budget_text="" dtype=f32
fi
mkdir -p "$out_dir"
test_set="$out_dir/dialogsum.test$n_test.jsonl"
head -n "$n_test" "$assets/dialogsum/dialogsum.test.jsonl" > "$test_set"

echo "train-eval: LoRA training on $device, ${budget_text:-${QLM_TRAIN_STEPS:-240} steps} (checkpoints in $out_dir/run)" >&2
"$qlm" train -m "$model" --data "$assets/dialogsum/dialogsum.train.from_zip_2021-05.jsonl" \
    --eval "$assets/dialogsum/dialogsum.dev.jsonl" --eval-max 40 --eval-every "$every" --target-field summary --chat \
    --out "$out_dir/run" "${budget[@]}" --batch "$batch" --seq-len 512 --rank 16 --lr 4e-4 --warmup "$warmup" \
    --save-every "$save" --dtype "$dtype" --device "$device" --resume

score() { # name, extra flags...
    local name=$1; shift
    local log="$out_dir/$name.log"
    echo "train-eval: summarizing $n_test test dialogues ($name)" >&2
    rm -f "$out_dir/$name.jsonl"
    "$qlm" summarize -m "$model" --batch "$test_set" --out "$out_dir/$name.jsonl" --batch-size "$summ_batch" -n 128 \
        --device "$device" --eval "$@" 2>&1 | tee "$log" >&2
}
score base
score lora --lora dialogsum="$out_dir/run/adapter" --adapter dialogsum

f1() { awk -v m="$2" '$1 == m { print $4 }' "$out_dir/$1.log"; }
field() { sed -n "s/.*\"$1\":[[:space:]]*\([0-9.e+-]*\).*/\1/p" "$out_dir/run/summary.json" | head -n1; }
block=$(mktemp)
trap 'rm -f "$block"' EXIT
{
    echo "<!-- $block_name -->"
    if [ "$block_name" = dialogsum-lora-lab ]; then
        echo "## LoRA fine-tuning on DialogSum at the lab's scale ($device)"
    else
        echo "## LoRA fine-tuning on DialogSum"
    fi
    echo
    echo "Written by \`$([ "$block_name" = dialogsum-lora ] && echo make train-eval || echo "QLM_TRAIN_SCALE=lab QLM_TRAIN_DEVICE=$device scripts/train_dialogsum.sh")\` on $(date -u +%Y-%m-%d): \`qlm train --lora\` (rank 16,"
    echo "alpha 32, all linear layers, dropout 0.05, AdamW lr 4e-4 cosine with $warmup warm-up steps, batch $batch, sequences up"
    echo "to 512 tokens, $(echo "$dtype" | tr a-z A-Z) compute, device $device) for $(field steps) steps${budget_text:+ ($budget_text)} on DialogSum training"
    echo "dialogues (the lab's prompt as the user turn of SmolLM2's chat template, loss on the summary only), then"
    echo "\`qlm summarize --batch --eval\` on the first $n_test test dialogues (greedy, at most 128 new tokens) without and"
    echo "with the adapter. The lab's FLAN-T5-base figures (ROUGE-1, 500 test dialogues): zero-shot 0.2334, LoRA 0.4081."
    echo
    echo "| model | ROUGE-1 | ROUGE-2 | ROUGE-L | ROUGE-Lsum |"
    echo "| --- | ---: | ---: | ---: | ---: |"
    echo "| SmolLM2-135M-Instruct, zero-shot | $(f1 base ROUGE-1) | $(f1 base ROUGE-2) | $(f1 base ROUGE-L) | $(f1 base ROUGE-Lsum) |"
    echo "| SmolLM2-135M-Instruct + LoRA (qlm train) | $(f1 lora ROUGE-1) | $(f1 lora ROUGE-2) | $(f1 lora ROUGE-L) | $(f1 lora ROUGE-Lsum) |"
    echo
    printf 'Training: %s tokens in %.0f s, %.0f tokens/s (%s); peak memory %.0f MiB RSS (activations %.0f MiB);\n' \
        "$(field tokens)" "$(field train_seconds)" "$(field tokens_per_s)" \
        "$([ "$device" = cpu ] && echo "$(nproc) cores" || "$qlm" info 2>/dev/null | sed -n 's/^cuda: //p')" \
        "$(field peak_rss_mib)" "$(field activation_mib)"
    printf 'last training loss %.3f, dev loss %.3f (40 dialogues); %s dialogues seen.\n' "$(field last_loss)" \
        "$(field last_eval_loss)" "$(( $(field steps) * batch ))"
    echo "<!-- /$block_name -->"
} > "$block"
doc_block "$block_name" "$block"
echo "train-eval: results recorded in docs/benchmarks.md" >&2
