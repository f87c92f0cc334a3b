#!/usr/bin/env bash
# Packs what a bare GPU machine (the device tool's) needs to run qlm's CUDA tests and benchmarks
# without building there: build/cuda's programs (stripped), the shared libraries they link beyond
# glibc, CUDA and NCCL (the machine has those: its PyTorch brings NCCL, 200 MB that would not fit
# the 64 MiB a call carries), the assets the tests and benchmarks read, and the default model's
# config and tokenizer. Writes OUT (default .gpu/, which .git/info/exclude should list) as two
# tarballs; each further FILE (llama.cpp's CUDA llama-bench with its converter as llama.tar.xz,
# the default model's GGUF) is split into OUT/parts/FILE.partNN of at most 24 MiB, with
# FILE.sha256, so that each rides in a call of its own. scripts/gpu_run.sh unpacks and joins them
# there and runs the tests and benchmarks.
# Usage: scripts/gpu_bundle.sh [OUT [FILE...]]
set -euo pipefail
out=${1:-.gpu}
[ $# -gt 0 ] && shift
mkdir -p "$out"
make --no-print-directory test-cuda-build >/dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/gpu/lib" "$stage/gpu/bin/tests/cuda" "$stage/gpu/assets" "$stage/gpu/smollm2"
cp build/cuda/qlm build/cuda/bench/bench_cuda "$stage/gpu/bin/"
cp build/cuda/tests/test_* "$stage/gpu/bin/tests/"
cp build/cuda/tests/cuda/test_* "$stage/gpu/bin/tests/cuda/"
find "$stage/gpu/bin" -type f -exec strip {} +
ldd build/cuda/qlm build/cuda/tests/test_llama | awk '/=> \// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' |
    while read -r lib; do cp -L "$lib" "$stage/gpu/lib/"; done
# One xz stream with a 64 MiB window: the programs each link the same library, and a window that
# spans several of them packs the copies as references (14 MB instead of 18 in a block per thread).
tar -C "$stage" -I "xz -9 -T1" -cf "$out/qlm.tar.xz" gpu/bin gpu/lib
for a in stories260K tinystories-656K-hf tinystories-text flan-t5-small flan-t5-base tinyllama-1.1b-chat-v1.0-tokenizer dialogsum; do
    cp -r "../shared/assets/$a" "$stage/gpu/assets/"
done
cache=${QLM_CACHE:-$HOME/.cache/qlm}
cp "$cache/SmolLM2-135M-Instruct/"{config.json,tokenizer.json,tokenizer_config.json} "$stage/gpu/smollm2/"
tar -C "$stage" -I "xz -T0" -cf "$out/assets.tar.xz" gpu/assets gpu/smollm2
for f in "$@"; do
    name=$(basename "$f")
    mkdir -p "$out/parts"
    rm -f "$out/parts/$name".*
    split -b 24M -d -a 2 "$f" "$out/parts/$name.part"
    { sha256sum <"$f" | cut -d' ' -f1; (cd "$out/parts" && sha256sum "$name".part*); } >"$out/parts/$name.sha256"
done
ls -la "$out" ${1:+"$out/parts"}
