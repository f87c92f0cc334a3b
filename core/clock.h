/* Monotonic seconds, for durations, rates and deadlines (never the wall clock, which can jump). */
#ifndef QLM_CLOCK_H
#define QLM_CLOCK_H

#include <time.h>

static inline double qlm_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
