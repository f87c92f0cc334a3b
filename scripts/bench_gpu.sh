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
# With QLM_LLAMA_BENCH (llama.cpp's llama-bench built with CUDA, outside the repository, from the
# llama-cpp-python sdist's vendored sources: `scripts/build_llama_bench.sh DIR cuda`) and
# QLM_LLAMA_CPP_SRC (a folder holding that source's convert_hf_to_gguf.py and its modules: that
# DIR), the same random-weight models converted to BF16 and Q8_0
# GGUFs also run under llama-bench on the same GPU (all layers offloaded): its pp512 and tg128
# next to qlm's BF16 and INT8.
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
# The decode table's models: SmolLM2's config and TinyLlama's.
model_dir() { [ "$1" = smollm2 ] && echo "$smol" || echo "$work/tinyllama"; }
# avg_ts of llama-bench's test with n_prompt p and n_gen g, from its JSON.
llama_ts() {
    python3 -c 'import json, sys
for r in json.load(open(sys.argv[1])):
    if r["n_prompt"] == int(sys.argv[2]) and r["n_gen"] == int(sys.argv[3]):
        print("%.1f" % r["avg_ts"])' "$1" "$2" "$3"
}
# llama.cpp on the decode table's models: qlm writes random BF16 weights of each config, llama.cpp's
# converter makes BF16 and Q8_0 GGUFs of them, llama-bench runs each with every layer on the GPU.
llama_section() {
    local lb=${QLM_LLAMA_BENCH:-} src=${QLM_LLAMA_CPP_SRC:-} m dir t d lpp ltg qpp qtg
    if [ -z "$lb" ] || [ -z "$src" ]; then
        echo
        echo "llama.cpp not measured in this run (QLM_LLAMA_BENCH and QLM_LLAMA_CPP_SRC unset)."
        return
    fi
    echo
    echo "The same models under llama.cpp's \`llama-bench -ngl 99 -p 512 -n 128 -r 3\` (CUDA build of the llama-cpp-python"
    echo "sdist's sources; random BF16 weights written by \`qlm quantize --random-weights\`, converted by its"
    echo "convert_hf_to_gguf.py to BF16 and Q8_0 GGUFs), same GPU, same run; qlm's columns from the table above:"
    echo
    echo "| model | qlm – llama.cpp | llama.cpp pp512 | qlm pp512 | llama.cpp tg128 | qlm tg128 | qlm / llama.cpp tg |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
    for m in smollm2 tinyllama; do
        dir="$work/$m-bf16"
        "$bin/qlm" quantize "$([ $m = smollm2 ] && echo "$smol" || echo "$assets/tinyllama-1.1b-chat-v1.0-tokenizer")" "$dir" --dtype bf16 \
            --random-weights >"$work/quantize.log" 2>&1 || { cat "$work/quantize.log" >&2; return 1; }
        for t in bf16 q8_0; do
            PYTHONPATH="$src/gguf-py" python3 "$src/convert_hf_to_gguf.py" "$dir" --outtype $t \
                --outfile "$work/$m-$t.gguf" >"$work/convert.log" 2>&1 || { cat "$work/convert.log" >&2; return 1; }
            "$lb" -m "$work/$m-$t.gguf" -ngl 99 -p 512 -n 128 -r 3 -o json >"$work/llama-$m-$t.json" 2>"$work/llama.log" ||
                { cat "$work/llama.log" >&2; return 1; }
            d=$([ $t = bf16 ] && echo bf16 || echo int8)
            lpp=$(llama_ts "$work/llama-$m-$t.json" 512 0) ltg=$(llama_ts "$work/llama-$m-$t.json" 0 128)
            qpp=$(field pp_tps <"$work/qlm-$m-$d.json") qtg=$(field tg_tps <"$work/qlm-$m-$d.json")
            printf '| %s | %s – %s | %s | %.0f | %s | %.1f | %.2fx |\n' $m "$(echo $d | tr a-z A-Z)" "$(echo $t | tr a-z A-Z)" \
                "$lpp" "$qpp" "$ltg" "$qtg" "$(python3 -c "print($qtg/$ltg)")"
        done
        rm -f "$work/$m"-*.gguf
    done
}

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
echo "Kernels, one TinyLlama-1.1B / SmolLM2-135M decode step's operands, then 512-row prefill products (\`$bin/bench_cuda\`):"
echo
"$bin/bench_cuda" 200 | sed -n '/^| op/,$p'
echo
echo "Decode at batch 1 (\`qlm bench -m MODEL --random-weights --device cuda --dtype D --pp 512 --tg 128\`), bound ="
echo "weight bytes per token / device-to-device copy bandwidth (read + write) measured in the same run:"
echo
echo "| model | dtype | pp512 tok/s | tg128 tok/s | copy GB/s | bound tok/s | of bound |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
# Each model and dtype also runs with QLM_CUDA_PDL=1 and with QLM_CUDA_FUSE=0, its rows kept for the
# table after llama.cpp's.
: >"$work/pdl.md"
for m in smollm2 tinyllama; do
    dir=$(model_dir $m)
    for d in bf16 int8; do
        j=$("$bin/qlm" bench -m "$dir" --random-weights --device cuda --dtype $d --pp 512 --tg 128 --reps 3 --json)
        echo "$j" >"$work/qlm-$m-$d.json"
        printf '| %s | %s | %.0f | %.1f | %.0f | %.0f | %.0f%% |\n' $m $d "$(field pp_tps <<<"$j")" "$(field tg_tps <<<"$j")" \
            "$(field bandwidth_gbs <<<"$j")" "$(field tg_bound_tps <<<"$j")" "$(python3 -c "print(100*$(field tg_fraction_of_bound <<<"$j"))")"
        p=$(QLM_CUDA_PDL=1 "$bin/qlm" bench -m "$dir" --random-weights --device cuda --dtype $d --pp 512 --tg 128 --reps 3 --json)
        u=$(QLM_CUDA_FUSE=0 "$bin/qlm" bench -m "$dir" --random-weights --device cuda --dtype $d --pp 512 --tg 128 --reps 3 --json)
        gen() {
            "$bin/qlm" generate -m "$([ $m = smollm2 ] && echo "$smol" || echo "$assets/tinyllama-1.1b-chat-v1.0-tokenizer")" \
                --random-weights --device cuda --dtype $d --temp 0 -n 48 -p "Once upon a time" 2>/dev/null
        }
        g=$(gen)
        same="$([ "$g" = "$(QLM_CUDA_PDL=1 gen)" ] && echo yes || echo NO), $([ "$g" = "$(QLM_CUDA_FUSE=0 gen)" ] && echo yes || echo NO)"
        printf '| %s | %s | %.1f | %.1f | %.1f | %s |\n' $m $d "$(field tg_tps <<<"$j")" "$(field tg_tps <<<"$p")" \
            "$(field tg_tps <<<"$u")" "$same" >>"$work/pdl.md"
    done
done
llama_section || echo "(llama.cpp's section stopped: its error is in the log above.)"
echo
echo "The same decode with each GEMV and attention launched to overlap the kernel before it (\`QLM_CUDA_PDL=1\`:"
echo "programmatic dependent launch; the GEMV's weights head for L2 while that kernel finishes), and with the norms,"
echo "activations, RoPE and cache stores as kernels of their own instead of inside the GEMVs (\`QLM_CUDA_FUSE=0\`);"
echo "whether 48 greedy tokens (\`qlm generate --temp 0\`) come out the same with each as without:"
echo
echo "| model | dtype | tg128 tok/s | with QLM_CUDA_PDL=1 | with QLM_CUDA_FUSE=0 | same tokens (PDL, unfused) |"
echo "| --- | --- | ---: | ---: | ---: | --- |"
cat "$work/pdl.md"
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
} | tee "$work/block.md" # as it comes: a run cut short still shows the rows it made
cd "$here" && . scripts/doc_block.sh && doc_block gpu "$work/block.md"
