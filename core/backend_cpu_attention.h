/* The CPU backend's attention op (core/backend.h), in its own file for its two paths. */
#ifndef QLM_BACKEND_CPU_ATTENTION_H
#define QLM_BACKEND_CPU_ATTENTION_H

#include "backend.h"

void qlm_cpu_attention(float *out, const float *q, const void *k_cache, const void *v_cache, int n, const int *pos,
                       const qlm_attn_shape *sh);

#endif
