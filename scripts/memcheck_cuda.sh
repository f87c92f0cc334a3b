#!/usr/bin/env bash
# compute-sanitizer's memcheck over the GPU's op tests built by `make test-cuda-build` (BUILD_DIR
# holds them): every kernel's reads and writes, on the shapes the tests give them. Each program's
# report goes to BUILD_DIR/memcheck_NAME.log and is printed whole; exits non-zero if one found an
# error. A runtime whose compute-sanitizer refuses the device (gVisor's: "Device not supported")
# is a skip, said as such, not a failure.
# Usage: scripts/memcheck_cuda.sh BUILD_DIR
set -u
build=$1
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -z "$sanitizer" ]; then
    echo "compute-sanitizer not found: memcheck skipped"
    exit 0
fi
rc=0
# No leak check: the memory pool keeps freed blocks for reuse until the process ends; no API
# error reports: the out-of-memory test provokes one on purpose, and qlm checks every call itself.
# QLM_CUDA_POOL=0: each buffer a cudaMalloc of its own size, so an access past its end is reported.
export QLM_CUDA_POOL=0
for t in test_backend_ops test_attention_backward test_train_ops test_fake_quant_cuda; do
    echo "compute-sanitizer memcheck: $build/tests/cuda/$t"
    "$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 3 --log-file "$build/memcheck_$t.log" \
        "$build/tests/cuda/$t" >/dev/null 2>&1
    s=$?
    cat "$build/memcheck_$t.log"
    if grep -q "Device not supported" "$build/memcheck_$t.log"; then
        echo "compute-sanitizer does not support this machine's device (its runtime): memcheck skipped"
        exit 0
    fi
    if [ "$s" -ne 0 ]; then echo "memcheck failed (exit $s), see $build/memcheck_$t.log"; rc=1; fi
done
exit $rc
