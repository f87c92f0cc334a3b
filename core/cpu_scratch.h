/* Growable per-thread scratch of the CPU backend's ops: allocated on first use and reused, so
 * steady decoding and training allocate nothing once the largest shape has been seen. */
#ifndef QLM_CPU_SCRATCH_H
#define QLM_CPU_SCRATCH_H

#include <stdlib.h>

typedef struct {
    float *p;
    size_t cap;
} qlm_cpu_scratch;

/* Room for n floats (contents not kept when it grows), or NULL when out of memory. */
static inline float *qlm_cpu_scratch_get(qlm_cpu_scratch *s, size_t n) {
    if (n <= s->cap) return s->p;
    float *p = realloc(s->p, n * sizeof *p);
    if (!p) return NULL;
    s->p = p;
    s->cap = n;
    return p;
}

#endif
