#!/usr/bin/env bash
# Runs on a lent GPU machine (the device tool's), in its copy of the repository, what
# scripts/gpu_bundle.sh packed into .gpu/ and the call carried: unpacks it into /tmp/gpu once,
# joins split parts as they arrive (a part per call when a file does not fit one call's 64 MiB;
# /tmp/gpu outlives calls while the machine stays warm), then runs each STAGE. Each stage's log and
# the docs/benchmarks.md the stages rewrote go to $OUT (default /tmp/gpu/out) for the session to
# bring home.
# Usage: scripts/gpu_run.sh STAGE...
#   parts      only unpack and join (a call that carries a part and runs nothing)
#   tests      the CUDA tests (scripts/run_cuda_tests.sh), and their training fixtures' comparisons
#              with PyTorch as docs/benchmarks.md's gpu-grads block
#   memcheck   compute-sanitizer's memcheck of the op tests (scripts/memcheck_cuda.sh)
#   bench      kernels, decode, summarization vs transformers, and llama.cpp's llama-bench when its
#              part (llama.tar.xz) has been joined (scripts/bench_gpu.sh)
#   train      LoRA and full fine-tuning vs transformers + peft (scripts/bench_gpu_train.sh)
#   dialogsum  LoRA on all DialogSum training dialogues, ROUGE before and after, on the real
#              SmolLM2-135M-Instruct (its GGUF part joined; scripts/train_dialogsum.sh at lab scale)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
g=/tmp/gpu
out=${OUT:-$g/out}
mkdir -p "$g/parts" "$out"
# Each tarball is unpacked once, and again when a later call carries another (a rebuilt bundle).
for t in qlm assets; do
    [ -f ".gpu/$t.tar.xz" ] || continue
    sum=$(sha256sum <".gpu/$t.tar.xz")
    if [ "$(cat "$g/.$t" 2>/dev/null)" != "$sum" ]; then
        tar xJf ".gpu/$t.tar.xz" -C /tmp && echo "$sum" >"$g/.$t"
    fi
done
[ -d .gpu/parts ] && cp -n .gpu/parts/* "$g/parts/"
# NAME.sha256 lists NAME's parts; NAME is whole when every part is here and the joined file matches.
for sums in "$g"/parts/*.sha256; do
    [ -e "$sums" ] || continue
    name=$(basename "$sums" .sha256)
    [ -e "$g/$name" ] && continue
    parts=$(awk 'NR > 1 { print $2 }' "$sums")
    missing=0
    for p in $parts; do [ -e "$g/parts/$p" ] || missing=1; done
    if [ $missing = 1 ]; then echo "gpu_run: $name: waiting for more parts" >&2; continue; fi
    (cd "$g/parts" && cat $parts) >"$g/$name.tmp"
    if [ "$(sha256sum <"$g/$name.tmp" | cut -d' ' -f1)" = "$(head -n1 "$sums")" ]; then
        mv "$g/$name.tmp" "$g/$name" && echo "gpu_run: $name joined" >&2
    else
        echo "gpu_run: $name: the joined parts do not match their checksum" >&2 && rm -f "$g/$name.tmp"
    fi
done
[ -e "$g/llama.tar.xz" ] && [ ! -d "$g/llama" ] && tar xJf "$g/llama.tar.xz" -C "$g"
if [ ! -x "$g/bin/qlm" ]; then echo "gpu_run: no qlm in $g/bin: carry .gpu (scripts/gpu_bundle.sh)" >&2; exit 1; fi
# test_smollm2 runs the default model's GGUF once its parts are joined (else it is skipped).
[ -e "$g/SmolLM2-135M-Instruct.Q4_1.gguf" ] && export QLM_DEFAULT_MODEL=$g/SmolLM2-135M-Instruct.Q4_1.gguf
nccl=$(find / -name libnccl.so.2 -not -path '/proc/*' 2>/dev/null | head -n1)
export LD_LIBRARY_PATH="$g/lib${nccl:+:$(dirname "$nccl")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export QLM_ASSETS=$g/assets
rc=0
for stage in "$@"; do
    t0=$SECONDS
    echo "gpu_run: $stage ..." >&2
    case $stage in
    parts) ;;
    tests)
        tests=$(cd "$g/bin" && ls tests/cuda/test_* tests/test_*)
        # shellcheck disable=SC2086
        scripts/run_cuda_tests.sh "$g/bin" $tests >"$out/tests.log" 2>&1 || rc=1
        scripts/train_equality_table.sh "$out/tests.log" "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)" \
            >"$g/grads.md" && (. scripts/doc_block.sh && doc_block gpu-grads "$g/grads.md")
        tail -n 25 "$out/tests.log" ;;
    memcheck)
        # One log (each program's report inside it): $OUT brings back 8 files at most.
        scripts/memcheck_cuda.sh "$g/bin" >"$out/memcheck.log" 2>&1 || rc=1
        tail -n 20 "$out/memcheck.log" ;;
    bench)
        llama=()
        [ -x "$g/llama/llama-bench" ] && llama=(QLM_LLAMA_BENCH="$g/llama/llama-bench" QLM_LLAMA_CPP_SRC="$g/llama")
        env "${llama[@]}" scripts/bench_gpu.sh "$g/bin" "$g/assets" "$g/smollm2" >"$out/bench.log" 2>&1 || rc=1
        tail -n 40 "$out/bench.log" ;;
    train)
        scripts/bench_gpu_train.sh "$g/bin" "$g/assets" "$g/smollm2" 20 >"$out/train.log" 2>&1 || rc=1
        tail -n 15 "$out/train.log" ;;
    dialogsum)
        gguf=SmolLM2-135M-Instruct.Q4_1.gguf
        if [ ! -e "$g/$gguf" ]; then echo "gpu_run: dialogsum needs $gguf's parts" >&2; rc=1; continue; fi
        mkdir -p "$g/cache" && ln -sf "$g/$gguf" "$g/cache/$gguf"
        QLM_CACHE=$g/cache QLM_TRAIN_SCALE=lab QLM_TRAIN_DEVICE=cuda QLM_TRAIN_DIR=$g/train-dialogsum \
            scripts/train_dialogsum.sh "$g/bin/qlm" >"$out/dialogsum.log" 2>&1 || rc=1
        tail -n 25 "$out/dialogsum.log" ;;
    *) echo "gpu_run: unknown stage $stage" >&2; rc=1 ;;
    esac
    echo "gpu_run: $stage took $((SECONDS - t0)) s" >&2
    # After each stage, so that a call cut off at its time limit still brings back what ended.
    cp docs/benchmarks.md "$out/"
done
exit $rc
