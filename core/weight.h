/* A 2-D weight matrix [rows][cols] in its storage dtype, as the matmul kernels take it.
 * Row r holds the weights of output r (PyTorch nn.Linear layout). */
#ifndef QLM_WEIGHT_H
#define QLM_WEIGHT_H

#include <stdint.h>
#include <string.h>

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
    /* Rows as llama.cpp's converter leaves a "llama" model's Q and K (each of rope_heads heads
     * interleaved for pairwise RoPE), used where they lie in a GGUF file; 0: PyTorch's order.
     * Readers give rows and products in PyTorch's order all the same (qlm_rope_stored_row). */
    int rope_heads;
    /* Made at load into the model's own memory (converted, repacked or copied), not read where the
     * loader holds it: what a cache of converted weights keeps (cli's panel cache). */
    int made_at_load;
} qlm_weight;

/* The largest head a model may have (the config loaders refuse more). */
enum { QLM_MAX_HEAD_DIM = 4096 };

/* The stored row that holds PyTorch's row r of a matrix of rows rows whose heads (of heads) are
 * interleaved: PyTorch's head dims (half s, index i) are the stored head's 2i + s. */
static inline int64_t qlm_rope_stored_row(int64_t r, int64_t rows, int heads) {
    int64_t hd = rows / heads, half = hd / 2, h = r / hd, j = r % hd;
    return h * hd + 2 * (j % half) + j / half;
}

/* Copies the rows (row_bytes each, any dtype) of a Q or K projection or its bias from the
 * interleaved layout of llama.cpp "llama" GGUFs and llama2.c checkpoints into PyTorch's
 * rotate-half order. */
static inline void qlm_rope_rows_to_half(void *dst, const void *src, int64_t rows, size_t row_bytes, int heads) {
    for (int64_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * row_bytes, (const char *)src + qlm_rope_stored_row(r, rows, heads) * row_bytes,
               row_bytes);
}

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
 * y = x W^T (+ bias), or with add y += x W^T (+ bias): a block's output joins the residual stream
 * in the product's own pass. */
typedef struct {
    float *y;
    const qlm_weight *w;
    const float *bias;
    int add;
} qlm_matmul_out;

#endif
