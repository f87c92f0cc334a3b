/* Starting a command as the ranks of one job: mpirun with --oversubscribe (this machine has fewer
 * cores than the ranks the tests start), allowed to run as root (CI does). */
#ifndef QLM_DIST_TEST_UTIL_H
#define QLM_DIST_TEST_UTIL_H

#include <stdarg.h>
#include <time.h>

#include "test_util.h"

/* Runs `mpirun -np N CMD 2>&1` (CMD formatted); returns mpirun's exit status, the output in *out
 * (malloc'd, when out is not NULL) and the wall time in *seconds (when not NULL). */
static inline int test_mpirun(char **out, double *seconds, int np, const char *fmt, ...) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    char args[6000], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "mpirun --oversubscribe --mca btl self,vader -np %d %s 2>&1", np, args);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap);
    assert_non_null(buf);
    while ((r = fread(buf + n, 1, cap - n - 1, p)) > 0)
        if ((n += r) + 1 >= cap) {
            buf = realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
    buf[n] = 0;
    int status = pclose(p);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (seconds) *seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (out) *out = buf;
    else free(buf);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The qlm binary the end-to-end tests run: $QLM_BIN or build/qlm. */
static inline const char *test_qlm_bin(void) {
    const char *bin = getenv("QLM_BIN");
    return bin && *bin ? bin : "build/qlm";
}

#endif
