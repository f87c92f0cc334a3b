#!/usr/bin/env bash
# Packs what a bare GPU machine (the device tool's) needs to run qlm's CUDA tests and benchmarks
# without building there: build/cuda's programs (stripped), the shared libraries they link beyond
# glibc, CUDA and NCCL (the machine has those: its PyTorch brings NCCL, 200 MB that would not fit
# the 64 MiB a call carries), the assets the tests and benchmarks read, and the default model's
# config and tokenizer. Writes OUT (default .gpu/, which .gitignore lists: a call carries it only
# by name) as two tarballs; each further FILE (the default model's GGUF) is split into
# OUT/parts/FILE.partNN of at most 24 MiB, with FILE.sha256, so that each rides in a call of its
# own. A FILE that is a folder (scripts/build_llama_bench.sh's OUT of kind cuda, named llama) is
# packed first as NAME.tar.xz: llama-bench stripped, the converter, and not llama-quantize, which
# no GPU stage runs (2 parts instead of 4). scripts/gpu_run.sh unpacks and joins them there and
# runs the tests and benchmarks. Run from the repository root.
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
# The Makefile's CUDA tests only: build/cuda/tests may hold programs of tests since removed.
for t in $(sed -n 's/^CUDA_TESTS := //p' Makefile); do cp "build/cuda/$t" "$stage/gpu/bin/$t"; done
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
    if [ -d "$f" ]; then
        dir=$(basename "$f")
        cp -r "$f" "$stage/$dir"
        rm -f "$stage/$dir/llama-quantize"
        [ -f "$stage/$dir/llama-bench" ] && strip "$stage/$dir/llama-bench"
        tar -C "$stage" -I "xz -6 -T0" -cf "$stage/$dir.tar.xz" "$dir"
        f=$stage/$dir.tar.xz
    fi
    name=$(basename "$f")
    mkdir -p "$out/parts"
    rm -f "$out/parts/$name".*
    split -b 24M -d -a 2 "$f" "$out/parts/$name.part"
    { sha256sum <"$f" | cut -d' ' -f1; (cd "$out/parts" && sha256sum "$name".part*); } >"$out/parts/$name.sha256"
done
ls -la "$out" ${1:+"$out/parts"}
