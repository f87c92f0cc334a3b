#!/usr/bin/env bash
# Runs the GPU tests built by `make test-cuda-build` (BUILD_DIR holds them): every program with
# QLM_TEST_DEVICE=cuda, the decode-heavy ones again with the GEMV and attention launched to overlap
# the kernel before them (QLM_CUDA_PDL=1, which needs compute 9.0), then the op tests under
# compute-sanitizer's memcheck
# when it is installed.
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
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "$sanitizer" ]; then
    # No leak check: the memory pool keeps freed blocks for reuse until the process ends; no API
    # error reports: the out-of-memory test provokes one on purpose, and qlm checks every call itself.
    for t in test_backend_ops test_attention_backward test_train_ops test_fake_quant_cuda; do
        echo "compute-sanitizer memcheck: $build/tests/cuda/$t"
        "$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 3 --log-file "$build/memcheck_$t.log" \
            "$build/tests/cuda/$t" >/dev/null 2>&1
        s=$?
        tail -n 3 "$build/memcheck_$t.log"
        if [ "$s" -ne 0 ]; then echo "memcheck failed (exit $s), see $build/memcheck_$t.log"; rc=1; fi
    done
else
    echo "compute-sanitizer not found: memcheck skipped"
fi
exit $rc
