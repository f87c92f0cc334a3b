#!/usr/bin/env bash
# Packs what a bare GPU machine (the device tool's) needs to run qlm's CUDA tests and benchmarks
# without building there: build/cuda's programs (stripped), the shared libraries they link beyond
# glibc, CUDA and NCCL (the machine has those: its PyTorch brings NCCL, 200 MB that would not fit
# the 64 MiB a call carries), the assets the tests and benchmarks read, and the default model's
# config and tokenizer. Writes OUT (default .gpu/, which .git/info/exclude should list) as two
# tarballs. On the GPU machine: tar xJf OUT/qlm.tar.xz && tar xJf OUT/assets.tar.xz, then run with
# LD_LIBRARY_PATH=gpu/lib plus the folder of the machine's libnccl.so.2, QLM_ASSETS=gpu/assets.
set -euo pipefail
out=${1:-.gpu}
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
tar -C "$stage" -I "xz -T0" -cf "$out/qlm.tar.xz" gpu/bin gpu/lib
for a in stories260K tinystories-656K-hf tinystories-text flan-t5-small flan-t5-base tinyllama-1.1b-chat-v1.0-tokenizer dialogsum; do
    cp -r "../shared/assets/$a" "$stage/gpu/assets/"
done
cache=${QLM_CACHE:-$HOME/.cache/qlm}
cp "$cache/SmolLM2-135M-Instruct/"{config.json,tokenizer.json,tokenizer_config.json} "$stage/gpu/smollm2/"
tar -C "$stage" -I "xz -T0" -cf "$out/assets.tar.xz" gpu/assets gpu/smollm2
ls -la "$out"
