#!/usr/bin/env bash
# `make w8a8-eval`: what W8A8 (`--w8a8`: block weights times activations in 8-bit runs of 32, byte
# dot products) costs and gains on the default model (SmolLM2-135M-Instruct), for each block type
# with --no-w8a8 and --w8a8: perplexity on the same 200 held-out TinyStories paragraphs as
# qat-eval, each from a fresh context, and prompt processing / decoding speed (qlm bench, pp512 and
# tg128, 2 threads) in the same run. Writes the w8a8 block of docs/benchmarks.md. About 10 minutes
# on 2 cores. On a CPU without AVX2 the flag changes nothing, and the table says so.
set -euo pipefail
qlm=${1:-build/qlm}
cd "$(dirname "$0")/.."
. scripts/result_common.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

awk 'BEGIN { RS = "" } { gsub(/\n/, " "); print }' "$assets/tinystories-text/tinystories_val.txt" |
    tail -n 200 | awk 'NR > 1 { print "<|endoftext|>" } { print }' > "$tmp/heldout.txt"
field() { sed -n "s/.*\"$2\": \([0-9.]*\).*/\1/p" "$1"; }
rows=()
for dt in q8_0 q4_0 q4_1; do
    for flag in --no-w8a8 --w8a8; do
        echo "w8a8-eval: $dt $flag" >&2
        "$qlm" perplexity -m "$model" --dtype "$dt" $flag -f "$tmp/heldout.txt" --json --quiet > "$tmp/$dt$flag.ppl"
        "$qlm" bench -m "$model" --dtype "$dt" $flag --threads 2 --pp 512 --tg 128 --reps 3 --json 2> /dev/null \
            > "$tmp/$dt$flag.bench"
        rows+=("$dt$flag")
    done
done
isa=$(sed -n 's/.*"isa": "\([a-z0-9]*\)".*/\1/p' "$tmp/q8_0--no-w8a8.bench")
block=$(mktemp)
trap 'rm -rf "$tmp" "$block"' EXIT
{
    echo "<!-- w8a8 -->"
    echo "## W8A8: 8-bit activations for block weights"
    echo
    echo "Written by \`make w8a8-eval\` on $(date -u +%Y-%m-%d) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs),"
    echo "kernels: $isa): SmolLM2-135M-Instruct (its Q4_1 GGUF) requantized at load to each block type, with x in the 16-bit form"
    echo "(\`--no-w8a8\`) and with \`--w8a8\` (bytes, one scale per 32 values; the default on CPUs with byte dot"
    echo "products). Perplexity on 200 held-out TinyStories paragraphs; speed"
    echo "from \`qlm bench\`, 2 threads, mean ± sd of 3, same run."
    echo
    echo "| weights | x | NLL | perplexity | pp512 tok/s | tg128 tok/s |"
    echo "| --- | --- | ---: | ---: | ---: | ---: |"
    for r in "${rows[@]}"; do
        x="8-bit per 32 (--w8a8, the default)"
        [[ "$r" == *--no-w8a8 ]] && x="16-bit per row (--no-w8a8)"
        nll=$(field "$tmp/$r.ppl" nll)
        printf "| %s | %s | %s | %.3f | %.1f ± %.1f | %.1f ± %.1f |\n" "${r%%--*}" "$x" "$nll" \
            "$(awk -v x="$nll" 'BEGIN { print exp(x) }')" "$(field "$tmp/$r.bench" pp_tps)" "$(field "$tmp/$r.bench" pp_sd)" \
            "$(field "$tmp/$r.bench" tg_tps)" "$(field "$tmp/$r.bench" tg_sd)"
    done
    echo
    case "$isa" in
    avx512vnni | avx512bf16) echo "W8A8 ran here (byte dot products, AVX512_VNNI's VPDPBUSD)." ;;
    avx2 | avx512) echo "W8A8 ran here (byte dot products through VPMADDUBSW: no VNNI)." ;;
    *) echo "These kernels have no byte dot products: \`--w8a8\` left x 16-bit, so the row pairs are the same computation." ;;
    esac
    echo "<!-- /w8a8 -->"
} > "$block"
doc_block w8a8 "$block"
echo "w8a8-eval: results recorded in docs/benchmarks.md" >&2
