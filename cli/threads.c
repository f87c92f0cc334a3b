#include "threads.h"

#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int usable_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return omp_get_num_procs();
}

/* Runnable tasks of other programs: the fewest of a few samples of /proc/loadavg's running count
 * (a moment's fork or exit is not load), less this process's reading thread. -1 when unknown. */
static int others_running(void) {
    int fewest = -1;
    for (int i = 0; i < 5; i++) {
        FILE *f = fopen("/proc/loadavg", "r");
        int running = 0;
        int ok = f && fscanf(f, "%*f %*f %*f %d/", &running) == 1;
        if (f) fclose(f);
        if (!ok) return -1;
        if (fewest < 0 || running - 1 < fewest) fewest = running - 1;
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    return fewest;
}

int cli_threads_apply(int requested, int local_ranks, int quiet) {
    if (requested <= 0 && getenv("OMP_NUM_THREADS")) return omp_get_max_threads();
    int threads = requested;
    if (threads <= 0) {
        int cores = usable_cores(), ranks = local_ranks > 1 ? local_ranks : 1;
        threads = cores > ranks ? cores / ranks : 1;
        int busy = ranks == 1 ? others_running() : -1;
        if (busy > 0 && cores - busy < threads) {
            threads = cores - busy > 1 ? cores - busy : 1;
            if (!quiet)
                fprintf(stderr, "qlm: other programs keep %d of the %d cores busy: %d thread%s (--threads N to choose)\n",
                        busy < cores ? busy : cores, cores, threads, threads == 1 ? "" : "s");
        }
    }
    omp_set_num_threads(threads);
    return threads;
}
