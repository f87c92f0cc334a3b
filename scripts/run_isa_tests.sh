#!/usr/bin/env bash
# After the suite: the tests whose numbers depend on the matmul kernels, again under every other
# kernel set this CPU runs (QLM_ISA), so that a bound one set's rounding breaks fails on this
# machine rather than on another. The scalar reference is left out: every x86-64 qlm targets has
# AVX2. Usage: scripts/run_isa_tests.sh BUILD_DIR
set -u
build=${1:-build}
info=$(env -u QLM_ISA "$build/qlm" info)
best=$(sed -n 's/.*matmul kernels: \([a-z0-9]*\) .*/\1/p' <<< "$info")
isas=$(sed -n 's/.*this CPU runs: \([^;]*\);.*/\1/p' <<< "$info")
tests=(test_attention test_llama test_t5 test_smollm2 test_lora test_batch test_train test_train_t5)
rc=0
for isa in $isas; do
    if [ "$isa" = scalar ] || [ "$isa" = "$best" ]; then continue; fi
    echo "== the kernel-dependent tests again with QLM_ISA=$isa (the suite ran with $best)"
    QLM_ISA=$isa QLM_BIN="$(realpath "$build/qlm")" scripts/run_tests.sh "${tests[@]/#/$build/tests/}" || rc=1
done
exit $rc
