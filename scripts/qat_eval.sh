#!/usr/bin/env bash
# `make qat-eval`: does quantization-aware training recover what INT8 post-training quantization
# loses? On the default model (SmolLM2-135M-Instruct), the same short run on TinyStories paragraphs
# twice: full F32 fine-tuning and QAT (per-tensor INT8, learned LSQ scales), then perplexity on 200
# held-out paragraphs of: the F32 fine-tuned model, its post-training INT8 per-tensor quantization,
# and the QAT model exported by `qlm quantize --from-qat`. Writes the qat block of
# docs/benchmarks.md. About 30 minutes on 2 cores; QLM_QAT_STEPS sets the steps (default 200).
set -euo pipefail
qlm=${1:-build/qlm}
cd "$(dirname "$0")/.."
. scripts/result_common.sh
dir="${QLM_QAT_DIR:-$cache/qat-eval}"
steps="${QLM_QAT_STEPS:-200}"
mkdir -p "$dir"

# One paragraph per line; the last 200 are held out, the rest become {"prompt": "", "completion": ...}.
awk 'BEGIN { RS = "" } { gsub(/\n/, " "); print }' "$assets/tinystories-text/tinystories_val.txt" > "$dir/paragraphs.txt"
total=$(wc -l < "$dir/paragraphs.txt")
head -n $((total - 200)) "$dir/paragraphs.txt" |
    awk '{ gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\t/, "\\t"); printf "{\"prompt\": \"\", \"completion\": \"%s\"}\n", $0 }' \
        > "$dir/train.jsonl"
tail -n 200 "$dir/paragraphs.txt" | awk 'NR > 1 { print "<|endoftext|>" } { print }' > "$dir/heldout.txt"

common=(--data "$dir/train.jsonl" --steps "$steps" --batch 4 --seq-len 256 --lr 5e-5 --warmup 5 --save-every 20 --resume)
echo "qat-eval: full F32 fine-tuning, $steps steps" >&2
"$qlm" train -m "$model" --full --out "$dir/full" "${common[@]}"
echo "qat-eval: QAT (INT8 per tensor, learned scales), $steps steps" >&2
"$qlm" train -m "$model" --qat --out "$dir/qat" "${common[@]}"
"$qlm" quantize --from-qat "$dir/qat/model" "$dir/qat-int8"

nll() { "$qlm" perplexity -m "$1" -f "$dir/heldout.txt" --json --quiet "${@:2}" | sed -n 's/.*"nll": \([0-9.]*\).*/\1/p'; }
echo "qat-eval: held-out perplexity" >&2
base_f32=$(nll "$model" --dtype f32)
base_i8=$(nll "$model" --dtype int8)
ft_f32=$(nll "$dir/full/model")
ft_i8=$(nll "$dir/full/model" --dtype int8)
qat_i8=$(nll "$dir/qat-int8")
closed=$(awk -v f="$ft_f32" -v p="$ft_i8" -v q="$qat_i8" 'BEGIN { printf "%.0f", (p > f ? 100 * (p - q) / (p - f) : 0) }')
ppl() { awk -v x="$1" 'BEGIN { printf "%.3f", exp(x) }'; }
block=$(mktemp)
trap 'rm -f "$block"' EXIT
{
    echo "<!-- qat -->"
    echo "## Quantization-aware training"
    echo
    echo "Written by \`make qat-eval\` on $(date -u +%Y-%m-%d): SmolLM2-135M-Instruct, $steps steps of 4 TinyStories"
    echo "paragraphs (up to 256 tokens, AdamW lr 5e-5, 5 warm-up steps, cosine), once as full F32 fine-tuning and once"
    echo "as QAT (\`qlm train --qat\`: INT8 per-tensor fake quantization with LSQ scales learned from the absmax"
    echo "start); perplexity (nats/token) on 200 held-out paragraphs, each from a fresh context."
    echo
    echo "| model | weights | NLL | perplexity |"
    echo "| --- | --- | ---: | ---: |"
    echo "| base | F32 | $base_f32 | $(ppl "$base_f32") |"
    echo "| base, post-training quantization | INT8 per tensor | $base_i8 | $(ppl "$base_i8") |"
    echo "| F32 fine-tuned | F32 | $ft_f32 | $(ppl "$ft_f32") |"
    echo "| F32 fine-tuned, post-training quantization | INT8 per tensor | $ft_i8 | $(ppl "$ft_i8") |"
    echo "| QAT, \`quantize --from-qat\` | INT8 per tensor | $qat_i8 | $(ppl "$qat_i8") |"
    echo
    echo "QAT closes $closed% of the post-training quantization gap of the same fine-tuning run (target: 50%)."
    echo "<!-- /qat -->"
} > "$block"
doc_block qat "$block"
echo "qat-eval: results recorded in docs/benchmarks.md" >&2
