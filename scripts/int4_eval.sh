#!/usr/bin/env bash
# `make int4-eval`: what 4-bit weights cost the default model (SmolLM2-135M-Instruct) and how much of
# it quantization-aware training wins back. INT4 QAT (`qlm train --qat --qat-bits 4 --group 32
# --distill`: q4_0's values with learned per-group scales, trained to match the unquantized model's
# next-token distributions) on TinyStories paragraphs and on DialogSum training dialogues that the
# unquantized model summarized in the chat, exported by `qlm quantize --from-qat`; then, for BF16,
# INT8 per channel, INT4 group 32 after training
# (q4_0) and the QAT model: perplexity on 200 held-out TinyStories paragraphs and ROUGE of the
# summaries of the first 100 DialogSum test dialogues. Weight-only quantization throughout
# (--no-w8a8: activations stay 16-bit). Writes the int4 block of docs/benchmarks.md. About an hour
# on 2 cores; QLM_INT4_STEPS sets the steps (default 160), QLM_INT4_LR the peak learning rate
# (default 1e-4), QLM_INT4_EXAMPLES the paragraphs and dialogues (default 500 each); an
# interrupted run continues from its checkpoint (remove QLM_INT4_DIR to start another).
set -euo pipefail
qlm=${1:-build/qlm}
cd "$(dirname "$0")/.."
. scripts/result_common.sh
dir="${QLM_INT4_DIR:-$cache/int4-eval}"
steps="${QLM_INT4_STEPS:-160}"
lr="${QLM_INT4_LR:-1e-4}"
mkdir -p "$dir"

# One paragraph per line; the last 200 are held out. Training examples alternate a paragraph (plain
# text, every token a target) and a summary in the chat (the prompt `qlm summarize` gives, answered
# as the unquantized model answers it: its greedy summary, so that the QAT model learns where that
# model ends its turn), examples each.
examples="${QLM_INT4_EXAMPLES:-500}"
awk 'BEGIN { RS = "" } { gsub(/\n/, " "); print }' "$assets/tinystories-text/tinystories_val.txt" > "$dir/paragraphs.txt"
tail -n 200 "$dir/paragraphs.txt" | awk 'NR > 1 { print "<|endoftext|>" } { print }' > "$dir/heldout.txt"
head -n "$examples" "$dir/paragraphs.txt" | jq -R -c '{prompt: "", completion: .}' > "$dir/stories.jsonl"
head -n "$examples" "$assets/dialogsum/dialogsum.train.from_zip_2021-05.jsonl" > "$dir/dialogues.jsonl"
echo "int4-eval: the unquantized model's summaries of $examples training dialogues" >&2
"$qlm" summarize -m "$model" --dtype bf16 --no-w8a8 --batch "$dir/dialogues.jsonl" --out "$dir/teacher.jsonl" \
    --out-field teacher --batch-size 16 -n 128 --resume
# The user turn is qlm summarize's own prompt (QLM_SUMMARY_TEMPLATE, its \n escapes undone).
template=$(sed -n 's/^#define QLM_SUMMARY_TEMPLATE "\(.*\)"$/\1/p' runtime/summary_prompt.h)
[ -n "$template" ] || { echo "int4-eval: no QLM_SUMMARY_TEMPLATE in runtime/summary_prompt.h" >&2; exit 1; }
jq -n -c --arg tmpl "$template" --slurpfile d "$dir/dialogues.jsonl" --slurpfile t "$dir/teacher.jsonl" '
    range(0; $d | length) as $i | if $d[$i].fname != $t[$i].fname then error("teacher.jsonl out of order") else
    {messages: [{role: "user", content: ($tmpl | gsub("\\\\n"; "\n") | sub("\\{dialogue\\}"; $d[$i].dialogue))},
                {role: "assistant", content: $t[$i].teacher}]} end' > "$dir/chats.jsonl"
paste -d '\n' "$dir/stories.jsonl" "$dir/chats.jsonl" > "$dir/train.jsonl"
head -n 100 "$assets/dialogsum/dialogsum.test.jsonl" > "$dir/test100.jsonl"

echo "int4-eval: INT4 QAT with distillation, $steps steps (checkpoints in $dir/qat)" >&2
"$qlm" train -m "$model" --qat --qat-bits 4 --group 32 --distill --data "$dir/train.jsonl" --out "$dir/qat" \
    --steps "$steps" --batch 4 --seq-len 384 --lr "$lr" --warmup 10 --save-every 20 --resume
"$qlm" quantize --from-qat "$dir/qat/model" "$dir/qat-q4_0"

# name, model, flags...: perplexity and ROUGE of one row.
measure() {
    local name=$1 m=$2; shift 2
    echo "int4-eval: $name: perplexity, then 100 summaries" >&2
    "$qlm" perplexity -m "$m" -f "$dir/heldout.txt" --json --quiet --no-w8a8 "$@" |
        sed -n 's/.*"nll": \([0-9.]*\).*/\1/p' > "$dir/$name.nll"
    rm -f "$dir/$name.jsonl"
    "$qlm" summarize -m "$m" --batch "$dir/test100.jsonl" --out "$dir/$name.jsonl" --batch-size 16 -n 128 --eval \
        --no-w8a8 "$@" > "$dir/$name.rouge" 2>&1
}
measure bf16 "$model" --dtype bf16
measure int8-pc "$model" --dtype int8 --per-channel
measure q4_0 "$model" --dtype q4_0 --group 32
measure qat "$dir/qat-q4_0"

nll() { cat "$dir/$1.nll"; }
r1() { awk '$1 == "ROUGE-1" { print $4 }' "$dir/$1.rouge"; }
closed() { # the gap of q4_0 to bf16 that QAT closes, in % (lower is better: sign -1 for ROUGE)
    awk -v b="$1" -v p="$2" -v q="$3" -v s="$4" 'BEGIN { g = s * (p - b); printf "%.0f", (g > 0 ? 100 * s * (p - q) / g : 0) }'
}
row() { printf '| %s | %s | %s | %.3f | %s |\n' "$1" "$2" "$(nll "$3")" "$(awk -v x="$(nll "$3")" 'BEGIN { print exp(x) }')" "$(r1 "$3")"; }
block=$(mktemp)
trap 'rm -f "$block"' EXIT
{
    echo "<!-- int4 -->"
    echo "## 4-bit weights: post-training and QAT"
    echo
    echo "Written by \`make int4-eval\` on $(date -u +%Y-%m-%d): SmolLM2-135M-Instruct (its Q4_1 GGUF dequantized is the"
    echo "unquantized model here: no other copy of its weights is at hand), weights only quantized (\`--no-w8a8\`)."
    echo "QAT: \`qlm train --qat --qat-bits 4 --group 32 --distill\`, $steps steps of 4 sequences (up to 384 tokens; AdamW lr"
    echo "$lr, 10 warm-up steps, cosine) over $examples TinyStories paragraphs (plain text) and $examples DialogSum training"
    echo "dialogues in the chat as \`qlm summarize\` prompts them, answered with the unquantized model's own greedy summaries;"
    echo "the loss the KL divergence from the unquantized model's next-token distributions; exported by"
    echo "\`qlm quantize --from-qat\` to q4_0 blocks. NLL: nats/token on 200 held-out TinyStories paragraphs, each from a"
    echo "fresh context; ROUGE-1: \`qlm summarize --batch --eval\` on the first 100 DialogSum test dialogues (greedy, at"
    echo "most 128 new tokens)."
    echo
    echo "| model | weights | NLL | perplexity | ROUGE-1 |"
    echo "| --- | --- | ---: | ---: | ---: |"
    row "unquantized" "BF16" bf16
    row "post-training" "INT8 per channel" int8-pc
    row "post-training" "INT4 (q4_0), group 32" q4_0
    row "QAT, \`quantize --from-qat\`" "INT4 (q4_0), group 32" qat
    echo
    echo "QAT closes $(closed "$(nll bf16)" "$(nll q4_0)" "$(nll qat)" 1)% of INT4's post-training perplexity gap"
    echo "(NLL) and $(closed "$(r1 bf16)" "$(r1 q4_0)" "$(r1 qat)" -1)% of its ROUGE-1 gap (target: half)."
    echo "<!-- /int4 -->"
} > "$block"
doc_block int4 "$block"
echo "int4-eval: results recorded in docs/benchmarks.md" >&2
