/* OpenBLAS as Debian builds it (DYNAMIC_ARCH) picks its kernels by the CPU's family and model when
 * the library loads, and a model newer than the library falls back to Prescott's SSE3 kernels:
 * Debian 12's 0.3.21 on Emerald Rapids (model 207) does: prompt processing ran 1.45x slower for it
 * when attention's products were OpenBLAS sgemm calls (SmolLM2-135M Q4_0 W8A8 pp512, 2 threads),
 * and training's backward products still are. Its only switch is the environment variable OPENBLAS_CORETYPE, read before main, so
 * qlm names the kernels the CPU's features allow and runs itself again, once: the variable set
 * (by qlm, or by a user who wants other kernels) makes the check a no-op. */
#include "blas_core.h"

#include <cblas.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

/* The OpenBLAS kernel set for this CPU's features, or NULL. */
static const char *core_for_cpu(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}

void cli_blas_core_check(char **argv) {
    if (getenv("OPENBLAS_CORETYPE")) return;
    const char *have = openblas_get_corename(), *want = core_for_cpu();
    if (!have || strcasecmp(have, "prescott") != 0 || !want || setenv("OPENBLAS_CORETYPE", want, 1) != 0) return;
    execv("/proc/self/exe", argv);
}
