/* OpenBLAS reads two settings qlm needs from the environment only, before main, so qlm sets them
 * and runs itself again, once; a variable already set (by qlm, or by a user who wants otherwise)
 * is left as it is.
 * - Its kernels: as Debian builds it (DYNAMIC_ARCH) it picks them by the CPU's family and model,
 *   and a model newer than the library falls back to Prescott's SSE3 kernels: Debian 12's 0.3.21
 *   on Emerald Rapids (model 207) does: prompt processing ran 1.45x slower for it when attention's
 *   products were OpenBLAS sgemm calls (SmolLM2-135M Q4_0 W8A8 pp512, 2 threads), and training's
 *   backward products still are. OPENBLAS_CORETYPE names the kernels the CPU's features allow.
 * - Its threads: qlm's OpenMP threads call it on slices of their own, one thread each
 *   (cpu/backend_cpu_train.c), so its pool never works; but the pthread build starts one thread per
 *   core as it loads, which spin for about 0.1 s beside qlm's: `qlm generate -n 1` took 150-230 ms
 *   with them, 75-95 ms with OPENBLAS_NUM_THREADS=1 (2-core VM). */
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
    int again = 0;
    if (!getenv("OPENBLAS_CORETYPE")) {
        const char *have = openblas_get_corename(), *want = core_for_cpu();
        if (have && strcasecmp(have, "prescott") == 0 && want && setenv("OPENBLAS_CORETYPE", want, 1) == 0) again = 1;
    }
    if (!getenv("OPENBLAS_NUM_THREADS") && openblas_get_num_threads() > 1 && setenv("OPENBLAS_NUM_THREADS", "1", 1) == 0)
        again = 1;
    if (again) execv("/proc/self/exe", argv);
}
