#!/usr/bin/env bash
# Runs each cmocka test program given as an argument from the repository root and prints
# one closing line "N passed, N failed, N skipped". Exits non-zero if any test failed. Each
# program gets a TMPDIR of its own, removed after it passes and kept (and named) when it fails, so
# the files its tests leave behind neither pile up nor vanish before they can be read.
set -u
# The programs link OpenBLAS as qlm does, and run the kernels qlm runs: on a CPU newer than the
# library, qlm names them itself (cli/blas_core.c) where the library alone takes its generic SSE3
# ones (Emerald Rapids: the suite in 5m12s instead of 6m28s), and a test that compares its own
# numbers with a qlm process's then compares one set of kernels. As in qlm, OpenBLAS runs one
# thread a call (the threads that call it are the programs' own), so it starts no pool to spin beside them.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -n "${QLM_BIN:-}" ]; then
    # sed, not jq: the GPU machine's image has no jq.
    core=$("$QLM_BIN" info --json 2>/dev/null | sed -n 's/^[[:space:]]*"openblas_core":[[:space:]]*"\([^"]*\)".*/\1/p')
    if [ -n "$core" ]; then export OPENBLAS_CORETYPE=$core; fi
fi
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
passed=0 failed=0 skipped=0 broken=()
for t in "$@"; do
    name=$(basename "$t")
    log=$(mktemp)
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/qlm-$name-XXXXXX")
    TMPDIR=$tmp "$t" >"$log" 2>&1
    rc=$?
    cat "$log"
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n1)
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -n1)
    passed=$((passed + ${p:-0})) failed=$((failed + ${f:-0})) skipped=$((skipped + ${s:-0}))
    if [ "$rc" -ne 0 ] && [ -z "$f" ]; then
        failed=$((failed + 1)); broken+=("$name (exit $rc)")
    elif [ -n "$f" ]; then
        broken+=("$name")
    fi
    if [ "$rc" -eq 0 ] && [ -z "$f" ]; then rm -rf "$tmp"; else echo "$name: its temporary files are kept in $tmp"; fi
    rm -f "$log"
done
[ ${#broken[@]} -eq 0 ] || printf 'failing programs: %s\n' "${broken[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
