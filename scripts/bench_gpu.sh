#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md, on a machine with an NVIDIA GPU, PyTorch and
# transformers (the device tool's machine): the op table's kernels (bench_cuda), batch-1 decode of
# SmolLM2-135M- and TinyLlama-1.1B-shaped models in BF16 and INT8 against the device-to-device copy
# bandwidth, where one TinyLlama decode step's GPU time goes (QLM_CUDA_PROFILE), and batch
# summarization of DialogSum's test dialogues against transformers generate() on the same GPU.
# Random weights of the real configs throughout (speed does not depend on the values; the real
# SmolLM2 GGUF is too large to carry to the lent machine), so both engines generate exactly -n
# tokens per dialogue. Prints the block and puts it in docs/benchmarks.md (between <!-- gpu -->
# markers, which `make bench` keeps).
# Usage: scripts/bench_gpu.sh BIN ASSETS SMOLLM2 [DIALOGUES]
#   BIN      folder holding qlm and bench_cuda built with `make CUDA=1` (build/cuda, or gpu/bin of
#            scripts/gpu_bundle.sh)
#   ASSETS   ../shared/assets (TinyLlama's config.json, DialogSum)
#   SMOLLM2  a folder with SmolLM2-135M-Instruct's config.json, tokenizer.json, tokenizer_config.json
set -euo pipefail
bin=$1 assets=$2 smol=$3 n_dial=${4:-500}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tinyllama"
cp "$assets/tinyllama-1.1b-chat-v1.0-tokenizer/config.json" "$work/tinyllama/"
head -n "$n_dial" "$assets/dialogsum/dialogsum.test.jsonl" >"$work/dialogues.jsonl"
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }

{
echo "<!-- gpu -->"
echo "## GPU (CUDA backend)"
echo
echo "Written by \`scripts/bench_gpu.sh\` on $(date +%Y-%m-%d): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
echo "(driver), qlm built with \`make CUDA=1\`. Random weights of the real configs throughout (speed does not"
echo "depend on the values). Reproduce on a machine with a GPU, PyTorch and transformers: \`make test-cuda-build &&"
echo "scripts/bench_gpu.sh build/cuda ../shared/assets SMOLLM2_FOLDER\` (on one without qlm's Debian libraries, unpack"
echo "what \`scripts/gpu_bundle.sh\` packs and pass its gpu/bin, gpu/assets and gpu/smollm2)."
echo
echo "Kernels, one TinyLlama-1.1B / SmolLM2-135M decode step's operands (\`$bin/bench_cuda\`):"
echo
"$bin/bench_cuda" 200 | sed -n '/^| op/,$p'
echo
echo "Decode at batch 1 (\`qlm bench -m MODEL --random-weights --device cuda --dtype D --pp 512 --tg 128\`), bound ="
echo "weight bytes per token / device-to-device copy bandwidth (read + write) measured in the same run:"
echo
echo "| model | dtype | pp512 tok/s | tg128 tok/s | copy GB/s | bound tok/s | of bound |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
for m in smollm2 tinyllama; do
    dir=$([ $m = smollm2 ] && echo "$smol" || echo "$work/tinyllama")
    for d in bf16 int8; do
        j=$("$bin/qlm" bench -m "$dir" --random-weights --device cuda --dtype $d --pp 512 --tg 128 --reps 3 --json)
        printf '| %s | %s | %.0f | %.1f | %.0f | %.0f | %.0f%% |\n' $m $d "$(field pp_tps <<<"$j")" "$(field tg_tps <<<"$j")" \
            "$(field bandwidth_gbs <<<"$j")" "$(field tg_bound_tps <<<"$j")" "$(python3 -c "print(100*$(field tg_fraction_of_bound <<<"$j"))")"
    done
done
echo
echo "Where a TinyLlama BF16 decode step's GPU time goes (\`QLM_CUDA_PROFILE=1 qlm bench ... --pp 0 --tg 64 --reps 1\`,"
echo "each op launched alone and timed with events):"
echo
echo '```'
QLM_CUDA_PROFILE=1 "$bin/qlm" bench -m "$work/tinyllama" --random-weights --device cuda --dtype bf16 --pp 0 --tg 64 \
    --reps 1 --json 2>&1 >/dev/null | sed -n '/^qlm cuda profile/,$p'
echo '```'
echo
echo "Batch summarization of $n_dial DialogSum test dialogues, SmolLM2-135M-Instruct's config, BF16, greedy, 64"
echo "new tokens each, the lab's prompt in the chat template; transformers $(python3 -c 'import transformers; print(transformers.__version__)')"
echo "generate() (bench/hf_generate_bench.py) on the same GPU in the same run:"
echo
echo "| batch | qlm dialogues/s | transformers dialogues/s | qlm / transformers |"
echo "| ---: | ---: | ---: | ---: |"
for b in 32 64; do
    "$bin/qlm" summarize -m "$smol" --random-weights --dtype bf16 --device cuda --temp 0 -n 64 --batch "$work/dialogues.jsonl" \
        --out "$work/out$b.jsonl" --batch-size $b 2>"$work/summ$b.log"
    q=$(sed -n 's/.*dialogues in .* s (\([0-9.]*\) dialogues\/s).*/\1/p' "$work/summ$b.log" | tail -n1)
    h=$(python3 "$here/bench/hf_generate_bench.py" "$smol" "$work/dialogues.jsonl" $b 64 --random-weights |
        sed -n 's/.* s, \([0-9.]*\) dialogues\/s.*/\1/p')
    printf '| %d | %.2f | %.2f | %.2fx |\n' $b "$q" "$h" "$(python3 -c "print($q/$h)")"
done
echo "<!-- /gpu -->"
} >"$work/block.md"
cat "$work/block.md"
cd "$here" && . scripts/doc_block.sh && doc_block gpu "$work/block.md"
