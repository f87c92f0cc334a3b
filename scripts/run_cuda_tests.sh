#!/usr/bin/env bash
# Runs the GPU tests built by `make test-cuda-build` (BUILD_DIR holds them): every program with
# QLM_TEST_DEVICE=cuda, then the decode-heavy ones again with the GEMV and attention launched to
# overlap the kernel before them (QLM_CUDA_PDL=1, which needs compute 9.0). compute-sanitizer's
# memcheck of the op tests is scripts/memcheck_cuda.sh (`make test-cuda` runs both).
# Usage: scripts/run_cuda_tests.sh BUILD_DIR TEST...
set -u
build=$1
shift
bins=()
for t in "$@"; do bins+=("$build/$t"); done
QLM_TEST_DEVICE=cuda QLM_BIN="$(cd "$build" && pwd)/qlm" "$(dirname "$0")/run_tests.sh" "${bins[@]}"
rc=$?
echo "QLM_CUDA_PDL=1:"
QLM_CUDA_PDL=1 QLM_TEST_DEVICE=cuda QLM_BIN="$(cd "$build" && pwd)/qlm" "$(dirname "$0")/run_tests.sh" \
    "$build/tests/cuda/test_backend_ops" "$build/tests/test_lora" "$build/tests/test_llama" || rc=1
exit $rc
