#!/usr/bin/env bash
# Builds llama.cpp's llama-bench and llama-quantize, the yardsticks of docs/benchmarks.md, outside
# the repository from the llama.cpp sources vendored in the PyPI sdist of llama-cpp-python (dev-time
# only; qlm never runs them). OUT receives the two programs (linked statically against llama.cpp's
# own libraries, so that OUT moves to another machine whole), convert_hf_to_gguf.py with its modules
# (gguf-py/, and conversion/ where the sources have it: what QLM_LLAMA_CPP_SRC names for
# scripts/bench.sh and scripts/bench_gpu.sh), and SOURCE, the sdist it came from. KIND:
#   native  this CPU's instruction sets (QLM_LLAMA_BENCH of `make bench`)
#   avx2    AVX2 alone, for the AVX2 section (QLM_LLAMA_BENCH_AVX2)
#   cuda    CUDA for sm_90 (H100, H200) with the CPU at AVX2; `tar -C OUT/.. -cJf llama.tar.xz
#           llama` of an OUT named llama is what scripts/gpu_bundle.sh splits into parts and
#           scripts/gpu_run.sh unpacks on the lent GPU machine (nvcc takes 30-60 minutes here)
# Usage: scripts/build_llama_bench.sh OUT [KIND] [VERSION]   (KIND native, VERSION 0.3.36 unless given)
set -euo pipefail
out=${1:?usage: scripts/build_llama_bench.sh OUT [native|avx2|cuda] [VERSION]}
kind=${2:-native}
version=${3:-0.3.36}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
case "$out/" in "$repo"/*) echo "build_llama_bench: OUT must be outside the repository ($repo)" >&2; exit 2 ;; esac
case "$kind" in
native) flags=(-DGGML_NATIVE=ON) ;;
avx2) flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF) ;;
cuda) flags=(-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
             -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)") ;;
*) echo "build_llama_bench: KIND is native, avx2 or cuda, not '$kind'" >&2; exit 2 ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "build_llama_bench: fetching the llama-cpp-python $version sdist from PyPI ..." >&2
pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work" >&2
sdist=$(ls "$work"/llama_cpp_python-*.tar.gz)
tar xzf "$sdist" -C "$work"
src=$(ls -d "$work"/llama_cpp_python-*/vendor/llama.cpp)
echo "build_llama_bench: configuring $kind (${flags[*]}) ..." >&2
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF "${flags[@]}" >"$work/configure.log" 2>&1 ||
    { tail -n 30 "$work/configure.log" >&2; exit 1; }
echo "build_llama_bench: building llama-bench and llama-quantize on $(nproc) cores ..." >&2
cmake --build "$work/build" --target llama-bench llama-quantize -j "$(nproc)" >"$work/build.log" 2>&1 ||
    { tail -n 30 "$work/build.log" >&2; exit 1; }
cp "$work/build/bin/llama-bench" "$work/build/bin/llama-quantize" "$out/"
cp "$src/convert_hf_to_gguf.py" "$out/"
# The converter's own modules: gguf-py always, conversion/ where the script has been split up.
for d in gguf-py conversion; do
    rm -rf "${out:?}/$d"
    if [ -d "$src/$d" ]; then cp -r "$src/$d" "$out/$d"; fi
done
echo "llama-cpp-python $version sdist ($(basename "$sdist")), vendor/llama.cpp, $kind: ${flags[*]}" >"$out/SOURCE"
echo "build_llama_bench: $out/llama-bench ($kind)" >&2
