/* The op table: everything a model architecture needs from a device. Model code
 * (core/llama.c) is written once against these ops; the CPU backend (core/backend_cpu.c)
 * and the CUDA backend (cuda/) implement them. Pointers to activations are device
 * memory of the backend that allocated them. */
#ifndef QLM_BACKEND_H
#define QLM_BACKEND_H

#include <stddef.h>

#include "weight.h"

/* Shape of one attention call over a KV cache laid out as [max_seq][n_kv_heads * head_dim]. */
typedef struct {
    int n_heads, n_kv_heads, head_dim;
    float scale; /* softmax scale, usually 1/sqrt(head_dim) */
} qlm_attn_shape;

typedef struct qlm_backend {
    const char *name;
    /* Device memory for activations and caches; NULL when out of memory. */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    /* Uploads a weight into device memory in its dtype (identity on the CPU). */
    int (*upload_weight)(qlm_weight *w);

    /* y[n][rows] = x[n][cols] W^T (+ bias) */
    void (*matmul)(float *y, const float *x, int n, const qlm_weight *w, const float *bias);
    /* out[i] = x[i] / rms(x[i]) * weight, for n rows of dim values */
    void (*rmsnorm)(float *out, const float *x, const float *weight, int n, int dim, float eps);
    /* Rotate-half RoPE in place on n rows of n_heads*head_dim values; row i at position pos[i].
     * inv_freq has head_dim/2 entries. */
    void (*rope)(float *x, int n, const int *pos, int n_heads, int head_dim, const float *inv_freq);
    /* Causal attention of n query rows; row i attends to cache rows 0..pos[i] of the cache
     * (k_cache/v_cache: [max_seq][n_kv_heads*head_dim]). out: [n][n_heads*head_dim]. */
    void (*attention)(float *out, const float *q, const float *k_cache, const float *v_cache, int n,
                      const int *pos, const qlm_attn_shape *shape);
    /* out = silu(gate) * up, elementwise over n values (out may alias gate). */
    void (*swiglu)(float *out, const float *gate, const float *up, long n);
    /* y += x over n values. */
    void (*add)(float *y, const float *x, long n);
    /* out[i] = row ids[i] of the table, as F32. */
    void (*embedding)(float *out, const qlm_weight *table, const int *ids, int n);
    /* Copies n floats between device buffers. */
    void (*copy)(float *dst, const float *src, long n);
} qlm_backend;

const qlm_backend *qlm_backend_cpu(void);
/* The CUDA backend, or NULL with an error message when qlm was built without CUDA or
 * no GPU is present. */
const qlm_backend *qlm_backend_cuda(void);
/* "cpu", "cuda", or "auto" (CUDA when available, else CPU). */
const qlm_backend *qlm_backend_by_name(const char *name);

#endif
