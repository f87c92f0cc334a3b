/* A 2-D weight matrix [rows][cols] in its storage dtype, as the matmul kernels take it.
 * Row r holds the weights of output r (PyTorch nn.Linear layout). */
#ifndef QLM_WEIGHT_H
#define QLM_WEIGHT_H

#include "dtype.h"

typedef struct {
    qlm_dtype dtype;
    int rows, cols;
    const void *data;
    float scale;             /* I8: per-tensor scale (w = q * scale) */
    const float *row_scales; /* I8: per-row scales, or NULL for per-tensor */
    int group;               /* block types: weights per block */
    /* Block types: activations are quantized to 8 bits in runs of 32 (W8A8: dot products of bytes)
     * where the CPU multiplies bytes, rather than to 16 bits per row (see qlm_x_dtype). */
    int act8;
} qlm_weight;

/* A weight that is rows row0.. of another (all of it: a tied head is the embedding; a run of rows:
 * a part of a fused adapter), re-derived with qlm_weight_view_refresh whenever the other moves.
 * Row-major dtypes (not the block types). */
typedef struct {
    qlm_weight *view;
    const qlm_weight *of;
    int row0;
} qlm_weight_view;

static inline void qlm_weight_view_refresh(const qlm_weight_view *v) {
    const char *data = (const char *)v->of->data;
    v->view->data = data ? data + (size_t)v->row0 * v->of->cols * qlm_dtype_size(v->of->dtype) : NULL;
    v->view->row_scales = v->of->row_scales ? v->of->row_scales + v->row0 : NULL;
}

/* One of several products of the same x (qlm_matmul_group, the backend's matmul_group):
 * y = x W^T (+ bias). */
typedef struct {
    float *y;
    const qlm_weight *w;
    const float *bias;
} qlm_matmul_out;

#endif
