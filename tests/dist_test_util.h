/* Starting a command as the ranks of one job: mpirun with --oversubscribe (this machine has fewer
 * cores than the ranks the tests start), allowed to run as root (CI does). Under `make asan` the
 * ranks do not look for leaks: Open MPI keeps allocations of its own until exit, from components
 * it has unloaded by then, which no suppression can name. */
#ifndef QLM_DIST_TEST_UTIL_H
#define QLM_DIST_TEST_UTIL_H

#include <stdarg.h>
#include <time.h>

#include "test_util.h"

#define TEST_MPIRUN "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 LSAN_OPTIONS=detect_leaks=0 " \
                    "mpirun --oversubscribe --mca btl self,vader"

/* Runs `mpirun -np N CMD 2>&1` (CMD formatted); returns mpirun's exit status, the output in *out
 * (malloc'd, when out is not NULL) and the wall time in *seconds (when not NULL). */
static inline int test_mpirun(char **out, double *seconds, int np, const char *fmt, ...) {
    char args[6000], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, TEST_MPIRUN " -np %d %s 2>&1", np, args);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = test_run_shell(out, cmd);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (seconds) *seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    return rc;
}

/* The qlm binary the end-to-end tests run: $QLM_BIN or build/qlm. */
static inline const char *test_qlm_bin(void) {
    const char *bin = getenv("QLM_BIN");
    return bin && *bin ? bin : "build/qlm";
}

#endif
