/* The row driver shared by the SIMD kernel files: y = x W^T for n rows of x over the output
 * rows [r0, r1). W goes in tiles of TILE_W rows, each multiplied with blocks of TILE_X rows of x
 * by the file's gemm_tile_x while it stays in cache (one x row is the GEMV of decode), then the
 * I8 scales and the bias. A row's result depends on neither n nor the thread split, so a
 * sequence decodes the same alone and in a batch. Included once by each of matmul_avx2.c and
 * matmul_avx512.c after they define KERNEL_FN and KERNEL_INLINE (their target attributes),
 * TILE_X, GROUP_ROWS and gemm_tile_x, so one text serves each instruction set. */
#ifndef KERNEL_FN
#error "define KERNEL_FN, KERNEL_INLINE, TILE_X, GROUP_ROWS and gemm_tile_x before including kernel_rows.h"
#endif

/* Weight rows multiplied with every block of x while they stay in L1/L2. */
#define TILE_W 32

KERNEL_INLINE void gemm_dt(float *y, const float *x, int n, const qlm_weight *w, int r0, int r1, const float *bias,
                           qlm_dtype dt) {
    size_t stride = (size_t)w->cols * qlm_weight_elem_size(dt);
    const char *base = w->data;
    for (int t = r0; t < r1; t += TILE_W) {
        int te = r1 - t < TILE_W ? r1 : t + TILE_W;
        for (int i = 0; i < n; i += TILE_X) {
            int nx = n - i < TILE_X ? n - i : TILE_X;
            const float *xi = x + (size_t)i * w->cols;
            float *yi = y + (size_t)i * w->rows;
            int o = t;
            /* One group ahead was as fast as two or three and much faster than none (measured). */
            if (GROUP_ROWS(nx) == 8)
                for (; o + 8 <= te; o += 8) {
                    const char *pf = o + 16 <= r1 ? base + (size_t)(o + 8) * stride : NULL;
                    gemm_tile_x(yi + o, w->rows, xi, nx, base + (size_t)o * stride, stride, w->cols, 8, dt, pf);
                }
            for (; o + 4 <= te; o += 4) {
                const char *pf = o + 8 <= r1 ? base + (size_t)(o + 4) * stride : NULL;
                gemm_tile_x(yi + o, w->rows, xi, nx, base + (size_t)o * stride, stride, w->cols, 4, dt, pf);
            }
            for (; o < te; o++) gemm_tile_x(yi + o, w->rows, xi, nx, base + (size_t)o * stride, stride, w->cols, 1, dt, NULL);
        }
        if (dt == QLM_I8 || bias)
            for (int i = 0; i < n; i++)
                for (int o = t; o < te; o++) y[(size_t)i * w->rows + o] = qlm_gemv_finish(y[(size_t)i * w->rows + o], w, o, bias);
    }
}

/* The dtype switch makes dt a constant inside each inlined copy of gemm_dt. */
KERNEL_FN void gemm(float *y, const float *x, int n, const qlm_weight *w, int r0, int r1, const float *bias) {
    switch (w->dtype) {
    case QLM_F16: gemm_dt(y, x, n, w, r0, r1, bias, QLM_F16); break;
    case QLM_BF16: gemm_dt(y, x, n, w, r0, r1, bias, QLM_BF16); break;
    case QLM_I8: gemm_dt(y, x, n, w, r0, r1, bias, QLM_I8); break;
    default: gemm_dt(y, x, n, w, r0, r1, bias, QLM_F32); break;
    }
}
