/* The row drivers shared by the SIMD kernel files: y = x W^T for n rows of x (in the activation
 * form of W, qlm_x_dtype) over the output rows [r0, r1) (gemm), the same over F32 or BF16 rows at
 * any stride (dot_rows: attention scores), and the dtype dispatch of weighted_sum. W goes in tiles
 * of TILE_W rows, each multiplied with blocks of TILE_X rows of x by the file's gemm_tile_x while it
 * stays in cache (one x row is the GEMV of decode), then the
 * I8 scales and the bias. A row's result depends on neither n nor the thread split, so a
 * sequence decodes the same alone and in a batch. Block weights go the same way through the
 * file's block_tile_x. Included once by each of kernels_avx2.h and kernels_avx512.h after they
 * define KERNEL_FN and KERNEL_INLINE (their target attributes), TILE_X, GROUP_ROWS, X_SIZE (bytes of
 * an element of x in its form), gemm_tile_x, BLOCK_TILE_X, block_tile_g and weighted_sum_dt, so one
 * text serves each instruction set. */
#if !defined(KERNEL_FN) || !defined(X_SIZE)
#error "define KERNEL_FN, KERNEL_INLINE, TILE_X, GROUP_ROWS, X_SIZE, gemm_tile_x and weighted_sum_dt before including kernel_rows.h"
#endif

/* Weight rows multiplied with every block of x while they stay in L1/L2. */
#define TILE_W 32

/* nr rows from w against nx rows of x (ldx elements apart) over all columns: one call of
 * gemm_tile_x, or for I8 one per block of QLM_I8_BLOCK columns, whose integer sums each call
 * converts and adds up in F32 (the next rows from pf are prefetched along). */
KERNEL_INLINE void tile_group(float *y, long ldy, const char *x, long ldx, int nx, const char *w, size_t stride,
                              long cols, const int nr, qlm_dtype dt, const char *pf) {
    const long block = dt == QLM_I8 ? QLM_I8_BLOCK : cols;
    const size_t xsize = X_SIZE(dt), esize = qlm_weight_elem_size(dt);
    long k0 = 0;
    do {
        long kc = cols - k0 < block ? cols - k0 : block;
        gemm_tile_x(y, ldy, x + k0 * xsize, ldx, nx, w + k0 * esize, stride, kc, nr, dt, pf ? pf + k0 * nr * esize : NULL,
                    k0 > 0);
        k0 += kc;
    } while (k0 < cols);
}

/* One tile: y[i * ldy + o] = dot(row o, x[i]) for t <= o < te, i < n; rows stride bytes apart
 * from base, x rows ldx elements apart. Rows up to r1 exist (for the prefetch). Only the first
 * block of x rows prefetches: it reads the tile's rows from memory, and the later blocks find them
 * in L2, where the prefetches only took load slots and L1 room (SmolLM2's and flan-t5-base's F32
 * products over 217 rows of x: 0.64-0.87x -> 0.82-1.00x of OpenBLAS sgemm, one thread). */
KERNEL_INLINE void tile_rows(float *y, long ldy, const void *x, long ldx, int n, const char *base, size_t stride,
                             long cols, int t, int te, int r1, qlm_dtype dt) {
    const size_t x_row = (size_t)ldx * X_SIZE(dt);
    for (int i = 0; i < n; i += TILE_X) {
        int nx = n - i < TILE_X ? n - i : TILE_X;
        const char *xi = (const char *)x + (size_t)i * x_row;
        float *yi = y + (size_t)i * ldy;
        int o = t;
        /* One group ahead was as fast as two or three and much faster than none (measured). */
        if (GROUP_ROWS(nx) == 8)
            for (; o + 8 <= te; o += 8) {
                const char *pf = i == 0 && o + 16 <= r1 ? base + (size_t)(o + 8) * stride : NULL;
                tile_group(yi + o, ldy, xi, ldx, nx, base + (size_t)o * stride, stride, cols, 8, dt, pf);
            }
        for (; o + 4 <= te; o += 4) {
            const char *pf = i == 0 && o + 8 <= r1 ? base + (size_t)(o + 4) * stride : NULL;
            tile_group(yi + o, ldy, xi, ldx, nx, base + (size_t)o * stride, stride, cols, 4, dt, pf);
        }
        for (; o < te; o++) tile_group(yi + o, ldy, xi, ldx, nx, base + (size_t)o * stride, stride, cols, 1, dt, NULL);
    }
}

KERNEL_INLINE void gemm_dt(float *y, const void *x, long ldx, const float *x_scale, int n, const qlm_weight *w, int r0,
                           int r1, const float *bias, qlm_dtype dt) {
    size_t stride = (size_t)w->cols * qlm_weight_elem_size(dt);
    for (int t = r0; t < r1; t += TILE_W) {
        int te = r1 - t < TILE_W ? r1 : t + TILE_W;
        tile_rows(y, w->rows, x, ldx, n, w->data, stride, w->cols, t, te, r1, dt);
        if (dt == QLM_I8 || bias)
            for (int i = 0; i < n; i++)
                for (int o = t; o < te; o++) {
                    float *yo = y + (size_t)i * w->rows + o;
                    *yo = qlm_gemv_finish(*yo, w, o, x_scale ? x_scale[i] : 1.0f, bias);
                }
    }
}

/* The file's block tile with group 32 (one run of values per block) as a constant. */
KERNEL_INLINE void block_tile_x(float *y, long ldy, const int16_t *x, long ldx, int nx, const char *w, size_t stride,
                                long cols, const int nr, qlm_dtype dt, int group, const char *pf) {
    if (group == 32)
        block_tile_g(y, ldy, x, ldx, nx, w, stride, cols, nr, dt, 32, pf);
    else
        block_tile_g(y, ldy, x, ldx, nx, w, stride, cols, nr, dt, group, pf);
}

/* Block weights: tiles of TILE_W rows in groups of 4, each against BLOCK_TILE_X rows of x at a
 * time, then x's row scales and the bias. */
KERNEL_INLINE void gemm_blocks_dt(float *y, const int16_t *x, long ldx, const float *x_scale, int n,
                                  const qlm_weight *w, int r0, int r1, const float *bias, qlm_dtype dt) {
    const size_t stride = qlm_dtype_row_bytes(dt, w->cols, w->group);
    const char *base = w->data;
    for (int t = r0; t < r1; t += TILE_W) {
        int te = r1 - t < TILE_W ? r1 : t + TILE_W;
        for (int i = 0; i < n; i += BLOCK_TILE_X) {
            int nx = n - i < BLOCK_TILE_X ? n - i : BLOCK_TILE_X, o = t;
            float *yi = y + (size_t)i * w->rows;
            const int16_t *xi = x + (size_t)i * ldx;
            for (; o + 4 <= te; o += 4) {
                const char *pf = o + 8 <= r1 ? base + (size_t)(o + 4) * stride : NULL;
                block_tile_x(yi + o, w->rows, xi, ldx, nx, base + (size_t)o * stride, stride, w->cols, 4, dt, w->group, pf);
            }
            for (; o < te; o++)
                block_tile_x(yi + o, w->rows, xi, ldx, nx, base + (size_t)o * stride, stride, w->cols, 1, dt, w->group, NULL);
        }
        for (int i = 0; i < n; i++)
            for (int o = t; o < te; o++) {
                float *yo = y + (size_t)i * w->rows + o;
                *yo = qlm_gemv_finish(*yo, w, o, x_scale[i], bias);
            }
    }
}

/* Rows of dt F32, F16 (x in F32) or BF16 (x then in bf16_x_form's form); the branches make dt a
 * constant in each tile_rows. */
KERNEL_FN void dot_rows(float *y, long ldy, const void *x, int n, const void *w, size_t w_stride, int rows, long cols,
                        qlm_dtype dt) {
    const size_t stride = w_stride * qlm_weight_elem_size(dt);
    for (int t = 0; t < rows; t += TILE_W) {
        int te = rows - t < TILE_W ? rows : t + TILE_W;
        if (dt == QLM_BF16)
            tile_rows(y, ldy, x, cols, n, (const char *)w, stride, cols, t, te, rows, QLM_BF16);
        else if (dt == QLM_F16)
            tile_rows(y, ldy, x, cols, n, (const char *)w, stride, cols, t, te, rows, QLM_F16);
        else
            tile_rows(y, ldy, x, cols, n, (const char *)w, stride, cols, t, te, rows, QLM_F32);
    }
}

/* The branches make dt a constant inside each inlined copy of the file's weighted_sum_dt. */
KERNEL_FN void weighted_sum(float *o, const float *p, int g, long ldp, const void *v, size_t v_stride, int m, long hd,
                            qlm_dtype dt) {
    if (dt == QLM_BF16)
        weighted_sum_dt(o, p, g, ldp, v, v_stride, m, hd, QLM_BF16);
    else if (dt == QLM_F16)
        weighted_sum_dt(o, p, g, ldp, v, v_stride, m, hd, QLM_F16);
    else
        weighted_sum_dt(o, p, g, ldp, v, v_stride, m, hd, QLM_F32);
}

/* The dtype switch makes dt a constant inside each inlined copy of gemm_dt. */
KERNEL_FN void gemm(float *y, const void *x, long ldx, const float *x_scale, int n, const qlm_weight *w, int r0, int r1,
                    const float *bias) {
    switch (w->dtype) {
    case QLM_F16: gemm_dt(y, x, ldx, NULL, n, w, r0, r1, bias, QLM_F16); break;
    case QLM_BF16: gemm_dt(y, x, ldx, NULL, n, w, r0, r1, bias, QLM_BF16); break;
    case QLM_I8: gemm_dt(y, x, ldx, x_scale, n, w, r0, r1, bias, QLM_I8); break;
    case QLM_Q8_0: gemm_blocks_dt(y, x, ldx, x_scale, n, w, r0, r1, bias, QLM_Q8_0); break;
    case QLM_Q4_0: gemm_blocks_dt(y, x, ldx, x_scale, n, w, r0, r1, bias, QLM_Q4_0); break;
    case QLM_Q4_1: gemm_blocks_dt(y, x, ldx, x_scale, n, w, r0, r1, bias, QLM_Q4_1); break;
    default: gemm_dt(y, x, ldx, NULL, n, w, r0, r1, bias, QLM_F32); break;
    }
}
