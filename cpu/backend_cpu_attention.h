/* The CPU backend's attention op (core/backend.h): one algorithm for every call, a row's result the
 * same whatever else its call holds (backend_cpu_attention.c). */
#ifndef QLM_BACKEND_CPU_ATTENTION_H
#define QLM_BACKEND_CPU_ATTENTION_H

#include <math.h>

#include "../core/backend.h"

/* s[t] = cap * tanh(s[t] / cap) for t < n: soft-capped scores (qlm_attn_shape.softcap). */
static inline void qlm_cpu_softcap(float *s, int n, float cap) {
    for (int t = 0; t < n; t++) s[t] = cap * tanhf(s[t] / cap);
}

void qlm_cpu_attention(float *out, const float *q, const void *k_cache, const void *v_cache, int n, const int *pos,
                       const qlm_attn_shape *sh);

#endif
