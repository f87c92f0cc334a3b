#!/usr/bin/env bash
# Runs every test of the CUDA op test programs (tests/cuda/, all but NCCL's) through the host
# emulation, under AddressSanitizer unless QLM_EMU_ASAN=0 (build.sh says what else stops a run),
# one test at a time, and prints a line per test and a summary: what a GPU session's `make
# test-cuda` and memcheck would find in the kernels, on a machine without a GPU. Each test runs
# with the blocks and threads scheduled first to last and again last to first (QLM_EMU_ORDER, see
# emu.cpp; QLM_EMU_ORDERS=forward runs the one order), which shows a missing barrier whichever
# side of it runs first. Then qlm itself,
# built on the emulation, decodes stories260K with --device cuda (the queue, its graphs and the
# pool on a whole model) and must give the CPU's tokens, and trains three LoRA steps on it with the
# CPU's losses and gradient norms, the last replayed from a graph. Takes about 10 minutes on 2 cores, a
# third of it building (test_matmul_backward_x is most of the rest), half again for the second
# order; `make test-cuda-emu` runs a few of the tests without AddressSanitizer, and the two qlm
# checks, in about 3 minutes (CI does).
# Usage (from the repository root, after `make`): tools/cuda_emu/check.sh [TEST_NAME...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
programs=(test_backend_ops test_train_ops test_attention_backward test_fake_quant_cuda)
bin=$(mktemp -d)
logs=${QLM_EMU_LOGS:-$(mktemp -d)}
trap 'rm -rf "$bin"' EXIT
# Each buffer its own cudaMalloc of its exact size, so AddressSanitizer sees where it ends.
export QLM_EMU_ASAN=${QLM_EMU_ASAN:-1} QLM_CUDA_POOL=0 OPENBLAS_NUM_THREADS=1
# A failed cudaMalloc is an answer the backend handles (test_out_of_memory), not an abort.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1}
failed=0 ran=0
for p in "${programs[@]}"; do
    echo "check: building $p ..." >&2
    "$here/build.sh" "$bin/$p" "tests/cuda/$p.c"
    for t in $(grep -o 'cmocka_unit_test([a-z_0-9]*' "tests/cuda/$p.c" | cut -d'(' -f2); do
        [ $# -gt 0 ] && [[ " $* " != *" $t "* ]] && continue
        t0=$SECONDS
        bad=
        for order in ${QLM_EMU_ORDERS:-forward reverse}; do
            QLM_EMU_ORDER=$order "$bin/$p" "$t" >"$logs/$t.$order.log" 2>&1 || bad+=" $order"
        done
        r=passed
        [ -z "$bad" ] || r="FAILED (${bad# })" failed=$((failed + 1))
        ran=$((ran + 1))
        printf '%-26s %-28s %-7s %5d s\n' "$p" "$t" "$r" $((SECONDS - t0))
    done
done
echo "check: building qlm ..." >&2
"$here/build.sh" "$bin/qlm" cli/*.c
assets=${QLM_ASSETS:-../shared/assets}
model=$assets/stories260K/stories260K.bin
# Greedy decoding on the emulated GPU gives the CPU's tokens.
same_generation() {
    "$bin/qlm" generate -m "$model" --device cuda --temp 0 -n 40 >"$logs/generate_cuda.txt" &&
        build/qlm generate -m "$model" --device cpu --temp 0 -n 40 >"$logs/generate_cpu.txt" &&
        cmp "$logs/generate_cuda.txt" "$logs/generate_cpu.txt"
}
# Three LoRA steps on DialogSum dialogues, dropout on: each step's loss and gradient norm within 1e-5
# of the CPU's (sums in another order, as the op tests allow); the third step's forward and backward
# replay the graph captured in the second, with that step's own dropout seed.
same_training() {
    head -n 8 "$assets/dialogsum/dialogsum.dev.jsonl" >"$bin/train.jsonl"
    local args=(train -m "$model" -t "$assets/stories260K/tok512.bin" --data "$bin/train.jsonl" --target-field summary
                --lora --rank 4 --steps 3 --batch 2 --seq-len 64 --threads 1)
    QLM_CUDA_GRAPHS=report "$bin/qlm" "${args[@]}" --device cuda --out "$bin/train_cuda" 2>"$logs/train_cuda.err" &&
        grep -q 'graphs: [1-9][0-9]* queues replayed' "$logs/train_cuda.err" &&
        build/qlm "${args[@]}" --device cpu --out "$bin/train_cpu" &&
        paste <(step_metrics "$bin/train_cuda") <(step_metrics "$bin/train_cpu") | tee "$logs/train_steps.txt" |
        awk '{ n++; for (i = 1; i <= 4; i++) if ($i !~ /^-?[0-9][0-9.e+-]*$/) bad = 1 # not a number (mawk: NaN <= x)
               for (i = 1; i <= 2; i++) { d = $i - $(i + 2); if (d * d > 1e-10 * $(i + 2) * $(i + 2)) bad = 1 } }
             END { exit (n != 3 || bad) }'
}
step_metrics() { sed -n 's/.*"loss":\([^,]*\),.*"grad_norm":\([^,]*\),.*/\1 \2/p' "$1/metrics.jsonl"; }
for c in same_generation same_training; do
    t0=$SECONDS
    ran=$((ran + 1))
    if [ ! -f "$model" ]; then
        r="FAILED (no $model)" failed=$((failed + 1))
    elif "$c" >"$logs/$c.log" 2>&1; then
        r=passed
    else
        r=FAILED failed=$((failed + 1))
    fi
    printf '%-26s %-28s %-7s %5d s\n' qlm "$c" "$r" $((SECONDS - t0))
done
echo "check: $((ran - failed)) of $ran passed (logs in $logs)"
[ "$failed" -eq 0 ]
