#include "threads.h"

#include "../cpu/cpu_load.h"

#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

static int usable_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return omp_get_num_procs();
}

int cli_threads_apply(int requested, int local_ranks, int quiet) {
    int from_env = requested <= 0 && getenv("OMP_NUM_THREADS");
    int cores = usable_cores(), ranks = local_ranks > 1 ? local_ranks : 1;
    int threads = from_env ? omp_get_max_threads() : requested;
    /* The load is sampled (10 ms) only where it decides something: the default count, or a warning
     * about a chosen one. Other ranks of this job on the machine are load too, so only a lone
     * process looks. */
    int warn = threads > 0 && !quiet && !getenv("OMP_WAIT_POLICY");
    int busy = ranks == 1 && (threads <= 0 || warn) ? qlm_cpu_others_running() : -1;
    int free_cores = cores - (busy > 0 ? busy : 0);
    if (threads > 0) {
        /* libgomp reads its wait policy at start-up, so a count chosen past the free cores can only
         * be told how to make its waiting threads sleep. */
        if (warn && busy >= 0 && threads > free_cores)
            fprintf(stderr,
                    "qlm: %d threads, but other programs leave %d of the %d cores free: waiting threads spin for "
                    "nothing (OMP_WAIT_POLICY=passive makes them sleep; fewer threads is faster still)\n",
                    threads, free_cores > 0 ? free_cores : 0, cores);
    } else {
        threads = cores > ranks ? cores / ranks : 1;
        if (busy > 0 && free_cores < threads) {
            threads = free_cores > 1 ? free_cores : 1;
            if (!quiet)
                fprintf(stderr, "qlm: other programs keep %d of the %d cores busy: %d thread%s (--threads N to choose)\n",
                        busy < cores ? busy : cores, cores, threads, threads == 1 ? "" : "s");
        }
    }
    omp_set_num_threads(threads);
    return threads;
}
