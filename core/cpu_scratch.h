/* Growable per-thread scratch of the CPU backend's ops: allocated on first use and reused, so
 * steady decoding and training allocate nothing once the largest shape has been seen. A thread's
 * regions are freed when it ends (an OpenMP team that shrinks ends threads). */
#ifndef QLM_CPU_SCRATCH_H
#define QLM_CPU_SCRATCH_H

#include <stdlib.h>

typedef struct qlm_cpu_scratch {
    void *p;
    size_t cap;                   /* bytes */
    struct qlm_cpu_scratch *next; /* the thread's region allocated before this one */
} qlm_cpu_scratch;

/* Adds s (a _Thread_local region getting its first bytes) to those its thread frees when it ends.
 * Returns -1 (nothing added) when the thread's list cannot be kept. */
int qlm_cpu_scratch_track(qlm_cpu_scratch *s);

/* Room for the given bytes (contents not kept when it grows), or NULL when out of memory. The
 * room starts on a cache line, as the kernels' rows then do: a 64-byte vector load from malloc's
 * 16-byte alignment would straddle two lines. */
static inline void *qlm_cpu_scratch_bytes(qlm_cpu_scratch *s, size_t bytes) {
    if (bytes <= s->cap) return s->p;
    void *p;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    if (!s->p && qlm_cpu_scratch_track(s) != 0) {
        free(p);
        return NULL;
    }
    free(s->p);
    s->p = p;
    s->cap = bytes;
    return p;
}

/* Room for n floats. */
static inline float *qlm_cpu_scratch_get(qlm_cpu_scratch *s, size_t n) {
    return qlm_cpu_scratch_bytes(s, n * sizeof(float));
}

#endif
