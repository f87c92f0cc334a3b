#!/usr/bin/env bash
# Builds a GPU test, or qlm itself, against qlm's CUDA backend compiled as host C++ (the host
# emulation: cuda_emu.h, emu.cpp, runtime.cpp, asm.pl), to check what new or changed kernels and the
# backend's host side do on a machine without a GPU. Not a substitute for `make test-cuda` on a GPU
# (no timing, no concurrency between the GPU and the host, no memory model) and slower than the
# CPU backend (seconds to a few minutes a test; the model and training tests, QLM_TEST_DEVICE=cuda,
# run too); nothing in `make test` uses it. What would fault on the GPU stops the run: a vector
# access at an address not aligned to its size (-fsanitize=alignment), a block over 1024 threads or
# its kernel's __launch_bounds__, a grid over its limits, dynamic shared memory over what the
# kernel may take. With QLM_EMU_ASAN=1 the kernels and device memory are also under
# AddressSanitizer: an access out of a cudaMalloc'd buffer or of shared memory is reported, which
# stands in for compute-sanitizer's memcheck where that cannot run (1-3x slower; with
# QLM_CUDA_POOL=0 every buffer is its own cudaMalloc). check.sh runs every op test this way.
# The backend's host side runs as it is (backend_cuda.cu's pool, graph_cuda.cu's queue and graphs)
# over runtime.cpp, whose streams run work only when the host waits for it and whose captures fail
# on what the driver forbids in them (see there). Every cuda/*.cu but NCCL's is compiled once into
# build/cuda_emu (build/cuda_emu_asan with QLM_EMU_ASAN=1) and again when it or the emulation changes.
# Usage (from the repository root, after `make`, which builds build/libqlm.a):
#   tools/cuda_emu/build.sh OUT tests/TEST.c     # OUT [cmocka test name]; QLM_TEST_DEVICE=cuda
#                                                # for the model tests
#   tools/cuda_emu/build.sh OUT cli/*.c          # qlm itself: OUT train --device cuda ...
# e.g. tools/cuda_emu/build.sh /tmp/ops tests/cuda/test_backend_ops.c && /tmp/ops test_attention
set -euo pipefail
out=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
san=(-fsanitize=alignment -fno-sanitize-recover=alignment)
objdir=$root/build/cuda_emu
if [ "${QLM_EMU_ASAN:-0}" = 1 ]; then san+=(-fsanitize=address); objdir=${objdir}_asan; fi
mkdir -p "$objdir"
cxx=(g++ -std=c++20 -O1 -g -w "${san[@]}" -I"$here/include" -I"$root" -I"$root/cuda")
deps=("$root/cuda/cuda_internal.h" "$here/cuda_emu.h" "$here/asm.pl" "$here/build.sh")
stale() { # stale OBJ SRC: OBJ is missing or older than SRC or the emulation
    local f
    for f in "${@:2}" "${deps[@]}"; do [ "$1" -nt "$f" ] || return 0; done
    return 1
}
# A file per core at a time; a failed compile leaves its mark in $work and stops the build after the rest.
compile() {
    perl -0p "$here/asm.pl" "$1" >"$work/$2.cpp" && "${cxx[@]}" -c "$work/$2.cpp" -o "$objdir/$2.o" ||
        touch "$work/$2.failed"
}
objs=()
for cu in "$root"/cuda/*.cu; do
    b=$(basename "$cu" .cu)
    [ "$b" = transport_nccl ] && continue
    if stale "$objdir/$b.o" "$cu"; then
        echo "emu: compiling $b.cu" >&2
        while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
        compile "$cu" "$b" &
    fi
    objs+=("$objdir/$b.o")
done
wait
for f in "$work"/*.failed; do
    [ -e "$f" ] || continue
    echo "emu: $(basename "$f" .failed).cu did not compile" >&2
    exit 1
done
for src in emu runtime; do
    if stale "$objdir/$src.o" "$here/$src.cpp"; then "${cxx[@]}" -c "$here/$src.cpp" -o "$objdir/$src.o"; fi
    objs+=("$objdir/$src.o")
done
cobjs=()
cflags=(-O1 -g -w -D_GNU_SOURCE -I"$root" $(pkg-config --cflags libpcre2-8 libcjson ompi-c 2>/dev/null))
if [ $# -eq 1 ] && [[ $1 == tests/* ]]; then
    cc "${cflags[@]}" -Dmain=test_main -c "$root/$1" -o "$work/test.o"
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
    cobjs=("$work/test.o" "$work/main.o")
else
    for c in "$@"; do
        o=$work/$(basename "$c" .c).o
        cc "${cflags[@]}" -fopenmp -c "$root/$c" -o "$o"
        cobjs+=("$o")
    done
fi
g++ "${san[@]}" -o "$out" "${cobjs[@]}" "${objs[@]}" "$root/build/libqlm.a" -lcmocka -lopenblas \
    -lpcre2-8 -lcjson -lcurl -lmicrohttpd -lcrypto -ledit $(pkg-config --libs ompi-c 2>/dev/null || echo -lmpi) -lm \
    -lpthread -fopenmp
