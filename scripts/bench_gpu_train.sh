#!/usr/bin/env bash
# Training on one GPU against transformers (+ peft) on the same GPU, in one run: SmolLM2-135M's config
# (random weights: speed does not depend on the values), DialogSum training dialogues cut to 512 tokens,
# batch 8, AdamW; LoRA rank 16 alpha 32 dropout 0.05 on all linear layers, then full fine-tuning; each in
# F32 (TF32 off on both sides) and in BF16 mixed precision (qlm --dtype bf16; torch.autocast over F32
# trained weights, a BF16 frozen base for LoRA: bench/peft_train_bench.py --dtype bf16). Peak GPU memory
# is read the same way for both engines: nvidia-smi's used memory sampled every 100 ms during the run,
# less what was in use before it. Model FLOPs utilization is against the card's datasheet rate for the
# precision (F32 without tensor cores, dense BF16 tensor cores). Prints the block and puts it in
# docs/benchmarks.md (between <!-- gpu-train --> markers).
# Usage: scripts/bench_gpu_train.sh BIN ASSETS SMOLLM2 [STEPS]
#   BIN      folder holding qlm built with `make CUDA=1` (build/cuda, or gpu/bin of scripts/gpu_bundle.sh)
#   ASSETS   ../shared/assets (DialogSum)
#   SMOLLM2  a folder with SmolLM2-135M-Instruct's config.json, tokenizer.json, tokenizer_config.json
#   QLM_GPU_TRAIN_DTYPES  the precisions to run (default "f32 bf16")
set -euo pipefail
bin=$1 assets=$2 smol=$3 steps=${4:-20}
dtypes=${QLM_GPU_TRAIN_DTYPES:-f32 bf16}
for d in $dtypes; do
    case $d in f32 | bf16) ;; *) echo "bench_gpu_train: QLM_GPU_TRAIN_DTYPES: '$d' is not f32 or bf16" >&2; exit 2 ;; esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
batch=8 seq=512 params=134515008
template=$'Summarize the following conversation.\n\n{dialogue}\n\nSummary: '
head -n $((steps * batch)) "$assets/dialogsum/dialogsum.train.from_zip_2021-05.jsonl" >"$work/train.jsonl"
python3 -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(json.dumps({"prompt": "Summarize the following conversation.\n\n" + r["dialogue"] + "\n\nSummary: ",
                      "completion": r["summary"]}))' "$work/train.jsonl" >"$work/train_pc.jsonl"

used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -n1; }
# Runs a command while sampling the GPU's used memory; prints the peak over the baseline (MiB).
with_peak() {
    local base peak sampler rc=0
    base=$(used_mib)
    (while :; do used_mib; sleep 0.1; done) >"$work/mem" 2>/dev/null &
    sampler=$!
    "$@" || rc=$?
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null || true
    peak=$(sort -n "$work/mem" | tail -n1)
    echo $((peak - base)) >"$work/peak"
    return $rc
}
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
# Datasheet TFLOP/s (dense) of the cards this runs on: F32 on CUDA cores, BF16 on tensor cores.
case "$gpu" in
*H100*PCIe*) peak_f32=51.2 peak_bf16=756 ;;
*H100*NVL*) peak_f32=60 peak_bf16=835 ;;
*H100* | *H200* | *H800*) peak_f32=66.9 peak_bf16=989 ;;
*A100*) peak_f32=19.5 peak_bf16=312 ;;
*) peak_f32="" peak_bf16="" ;;
esac
# "N%" of the card's rate for precision $1 at $2 tokens/s, blank for a card not listed above.
mfu() {
    local peak
    peak=$([ "$1" = bf16 ] && echo "$peak_bf16" || echo "$peak_f32")
    [ -n "$peak" ] && python3 -c "print(f'{100*6*$params*$2/1e12/$peak:.0f}%')" || true
}

{
echo "<!-- gpu-train -->"
echo "## Training on the GPU"
echo
echo "Written by \`scripts/bench_gpu_train.sh\` on $(date +%Y-%m-%d): $gpu,"
echo "transformers $(python3 -c 'import transformers; print(transformers.__version__)'), peft $(python3 -c 'import peft; print(peft.__version__)'),"
echo "torch $(python3 -c 'import torch; print(torch.__version__)'). SmolLM2-135M's config with random weights, the first $((steps * batch))"
echo "DialogSum training dialogues cut to $seq tokens, batch $batch, $steps steps, AdamW; LoRA rank 16, alpha 32, dropout 0.05"
echo "on all linear layers. f32: F32 throughout, TF32 off on both sides. bf16: qlm \`--dtype bf16\` (BF16 weights"
echo "and matmul inputs, F32 accumulation, master weights and AdamW; LoRA on a BF16 frozen base) against"
echo "torch.autocast to BF16 over F32 trained weights (LoRA: the base stored in BF16, peft's adapters F32)."
echo "Peak GPU memory: nvidia-smi's used memory, sampled every 100 ms, less what was in use before the run"
echo "(torch's own count of its allocator's peak plus the context beside it). Model FLOP/s count 6 N per token"
echo "(N = 134.5M; a frozen base does ~4 N of it); MFU divides them by the datasheet's dense rate for the"
echo "precision (${peak_f32:-?} TFLOP/s F32, ${peak_bf16:-?} BF16 for this card). Reproduce:"
echo "\`scripts/bench_gpu_train.sh BIN ASSETS SMOLLM2 $steps\` (BIN: build/cuda or gpu_bundle.sh's gpu/bin)."
echo
echo "| mode | precision | engine | tokens/s | peak GPU MiB | model TFLOP/s (6 N tokens/s) | MFU | qlm / transformers |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"
for dtype in $dtypes; do
for mode in lora full; do
    flags=$([ $mode = lora ] && echo "--lora --rank 16 --alpha 32 --lora-dropout 0.05" || echo "--full")
    run=${mode}_$dtype
    QLM_CUDA_GRAPHS=report with_peak "$bin/qlm" train -m "$smol" --random-weights --device cuda --data "$work/train.jsonl" --out "$work/q_$run" \
        $flags --dtype "$dtype" --steps "$steps" --batch $batch --seq-len $seq --target-field summary --template "$template" \
        --lr 4e-4 --save-every 100000 2>"$work/q_$run.log" >/dev/null || { tail -n 20 "$work/q_$run.log" >&2; exit 1; }
    q_tps=$(field "$work/q_$run/summary.json" tokens_per_s) q_mem=$(cat "$work/peak")
    grep -h 'qlm cuda graphs' "$work/q_$run.log" | sed "s/^/$run: /" >&2 || true # a diagnostic: never the bench's end
    hf_flags=$([ $mode = full ] && echo "--full" || true)
    with_peak python3 "$here/bench/peft_train_bench.py" "$smol" "$work/train_pc.jsonl" "$steps" $batch 8 --device cuda \
        --random-weights --seq-len $seq --dtype "$dtype" $hf_flags >"$work/hf_$run.out" 2>"$work/hf_$run.log" ||
        { tail -n 20 "$work/hf_$run.log" >&2; exit 1; }
    read -r h_tps h_own _ _ <"$work/hf_$run.out"
    h_mem=$(cat "$work/peak")
    name=$([ $mode = lora ] && echo "transformers + peft" || echo "transformers")
    printf '| %s | %s | qlm | %.0f | %d | %.1f | %s | %.2fx tokens/s, %.2fx memory |\n' $mode "$dtype" "$q_tps" "$q_mem" \
        "$(python3 -c "print(6*$params*$q_tps/1e12)")" "$(mfu "$dtype" "$q_tps")" "$(python3 -c "print($q_tps/$h_tps)")" \
        "$(python3 -c "print($q_mem/max($h_mem,1))")"
    printf '| %s | %s | %s | %.0f | %d (torch: %d) | %.1f | %s | |\n' $mode "$dtype" "$name" "$h_tps" "$h_mem" "$h_own" \
        "$(python3 -c "print(6*$params*$h_tps/1e12)")" "$(mfu "$dtype" "$h_tps")"
done
done
echo "<!-- /gpu-train -->"
} | tee "$work/block.md" # as it comes: a run cut short still shows the rows it made
cd "$here" && . scripts/doc_block.sh && doc_block gpu-train "$work/block.md"
