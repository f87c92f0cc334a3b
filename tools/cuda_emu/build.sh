#!/usr/bin/env bash
# Builds a GPU test against qlm's CUDA kernels compiled as host C++ (the host emulation: cuda_emu.h,
# emu.cpp, asm.pl), to check what new or changed kernels compute on a machine without a GPU. Not a
# substitute for `make test-cuda` on a GPU (no timing, no memory model, none of the host side of
# the backend: graphs, pool, streams) and slower than the CPU backend (seconds to a few minutes a
# test; the model and training tests, QLM_TEST_DEVICE=cuda, run too); nothing in `make test` uses it. What would fault on the GPU stops the run: a vector access at an address
# not aligned to its size (-fsanitize=alignment), a block over 1024 threads or its kernel's
# __launch_bounds__, a grid over its limits, dynamic shared memory over what the kernel may take.
# With QLM_EMU_ASAN=1 the kernels and device memory are also under AddressSanitizer: an access out of
# a cudaMalloc'd buffer or of shared memory is reported, which stands in for compute-sanitizer's
# memcheck where that cannot run (1-3x slower). check.sh runs every op test this way.
# Usage (from the repository root, after `make`, which builds build/libqlm.a):
#   tools/cuda_emu/build.sh OUT TEST.c FILE.cu...
#   OUT [cmocka test name]                     # e.g. QLM_TEST_DEVICE=cuda for the model tests
# e.g. tools/cuda_emu/build.sh /tmp/ops tests/cuda/test_backend_ops.c cuda/ops_cuda.cu \
#          cuda/attention_cuda.cu cuda/matmul_cuda.cu cuda/lora_cuda.cu && /tmp/ops test_attention
set -euo pipefail
out=$1 test=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
san=(-fsanitize=alignment -fno-sanitize-recover=alignment)
[ "${QLM_EMU_ASAN:-0}" = 1 ] && san+=(-fsanitize=address)
cxx=(g++ -std=c++20 -O1 -g -w "${san[@]}" -I"$here/include" -I"$root" -I"$root/cuda")
objs=()
for cu in "$@"; do
    b=$(basename "$cu" .cu)
    perl -0p "$here/asm.pl" "$root/$cu" >"$work/$b.cpp"
    "${cxx[@]}" -c "$work/$b.cpp" -o "$work/$b.o"
    objs+=("$work/$b.o")
done
"${cxx[@]}" -c "$here/emu.cpp" -o "$work/emu.o"
cc -O1 -g -w -I"$root" -Dmain=test_main -c "$root/$test" -o "$work/test.o"
cat >"$work/main.c" <<'C'
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
int test_main(void);
/* argv[1]: run only the tests of that name. */
int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return test_main();
}
C
cc -c "$work/main.c" -o "$work/main.o"
g++ "${san[@]}" -o "$out" "$work/test.o" "$work/main.o" "${objs[@]}" "$work/emu.o" "$root/build/libqlm.a" -lcmocka -lopenblas \
    -lpcre2-8 -lcjson -lcurl -lmicrohttpd -lcrypto -ledit $(pkg-config --libs ompi-c 2>/dev/null || echo -lmpi) -lm \
    -lpthread -fopenmp
