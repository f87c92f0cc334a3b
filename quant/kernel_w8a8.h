/* W8A8's drivers for block weights in panels (block_pack.h) and its quantizer of x, shared by every
 * table that multiplies bytes: the includer first defines KERNEL_INLINE, KERNEL_FN and a panel
 * tile, w8a8_panel with W8A8_TILE_X (kernel_w8a8_vnni.h: VPDPBUSD in zmm registers;
 * kernel_w8a8_ymm.h: VPMADDUBSW in ymm ones), which give the same integer sums and so the same
 * results. */
#ifndef W8A8_TILE_X
#error "include a w8a8_panel (kernel_w8a8_vnni.h or kernel_w8a8_ymm.h) before kernel_w8a8.h"
#endif

/* The panel tile for dt with group as a constant where the caller makes it one, and the tile's
 * rows of x: W8A8_AMX_ROWS at a time for Q8_0 where the table has AMX (gemm_w8a8_dt has configured
 * the tiles), W8A8_TILE_X at a time, then 4, 2 and 1 below that (a row's result is the same in any
 * of them); the first tile prefetches pf (NULL: none). */
KERNEL_INLINE void w8a8_panel_rows(float *y, long ldy, const int8_t *x, long ldx, const float *xs,
                                   const int32_t *xsum, long runs_ld, int n, const char *panel, long cols, qlm_dtype dt,
                                   const int group, const char *pf) {
    int i = 0;
#ifdef W8A8_AMX_ROWS
    if (dt == QLM_Q8_0)
        for (; i + W8A8_AMX_ROWS <= n; i += W8A8_AMX_ROWS, pf = NULL)
            w8a8_panel_amx(y + i * ldy, ldy, x + i * ldx, ldx, xs + i * runs_ld, runs_ld, panel, cols, group);
#endif
    for (; i + W8A8_TILE_X <= n; i += W8A8_TILE_X, pf = NULL)
        w8a8_panel(y + i * ldy, ldy, x + i * ldx, ldx, xs + i * runs_ld, xsum + i * runs_ld, runs_ld, panel, cols,
                   W8A8_TILE_X, dt, group, pf);
#if W8A8_TILE_X > 4
    if (n - i >= 4) {
        w8a8_panel(y + i * ldy, ldy, x + i * ldx, ldx, xs + i * runs_ld, xsum + i * runs_ld, runs_ld, panel, cols, 4, dt,
                   group, pf);
        i += 4;
        pf = NULL;
    }
#endif
#if W8A8_TILE_X > 2
    if (n - i >= 2) {
        w8a8_panel(y + i * ldy, ldy, x + i * ldx, ldx, xs + i * runs_ld, xsum + i * runs_ld, runs_ld, panel, cols, 2, dt,
                   group, pf);
        i += 2;
        pf = NULL;
    }
#endif
    if (i < n)
        w8a8_panel(y + i * ldy, ldy, x + i * ldx, ldx, xs + i * runs_ld, xsum + i * runs_ld, runs_ld, panel, cols, 1, dt,
                   group, pf);
}

KERNEL_INLINE void gemm_w8a8_dt(float *y, const int8_t *x, long ldx, const float *xs, const int32_t *xsum, int n,
                                const qlm_weight *w, int r0, int r1, const float *bias, qlm_dtype dt) {
    const long runs = w->cols / QLM_X8_BLOCK;
    const size_t panel_bytes = QLM_PANEL_ROWS * qlm_dtype_row_bytes(dt, w->cols, w->group);
    const int p1 = r1 < qlm_panel_rows(w->rows) ? r1 : qlm_panel_rows(w->rows);
#ifdef W8A8_AMX_ROWS
    /* One tile configuration for this thread's panels. */
    const int amx = dt == QLM_Q8_0 && n >= W8A8_AMX_ROWS && r0 < p1;
    if (amx) amx_configure();
#endif
    for (int p = r0; p < p1; p += QLM_PANEL_ROWS) {
        const char *panel = (const char *)w->data + (size_t)(p / QLM_PANEL_ROWS) * panel_bytes;
        const char *pf = p + QLM_PANEL_ROWS < p1 ? panel + panel_bytes : NULL;
        if (w->group == 32)
            w8a8_panel_rows(y + p, w->rows, x, ldx, xs, xsum, runs, n, panel, w->cols, dt, 32, pf);
        else
            w8a8_panel_rows(y + p, w->rows, x, ldx, xs, xsum, runs, n, panel, w->cols, dt, w->group, pf);
        if (bias)
            for (int i = 0; i < n; i++)
                for (int r = p; r < p + QLM_PANEL_ROWS; r++) y[(size_t)i * w->rows + r] += bias[r];
    }
#ifdef W8A8_AMX_ROWS
    if (amx) _tile_release();
#endif
    if (p1 < r1) qlm_w8a8_rows(y, x, ldx, xs, xsum, n, w, p1 > r0 ? p1 : r0, r1, bias);
}

/* The dtype switch makes dt a constant inside each inlined copy of gemm_w8a8_dt. */
KERNEL_FN void gemm_w8a8(float *y, const int8_t *x, long ldx, const float *xs, const int32_t *xsum, int n,
                         const qlm_weight *w, int r0, int r1, const float *bias) {
    switch (w->dtype) {
    case QLM_Q8_0: gemm_w8a8_dt(y, x, ldx, xs, xsum, n, w, r0, r1, bias, QLM_Q8_0); break;
    case QLM_Q4_0: gemm_w8a8_dt(y, x, ldx, xs, xsum, n, w, r0, r1, bias, QLM_Q4_0); break;
    default: gemm_w8a8_dt(y, x, ldx, xs, xsum, n, w, r0, r1, bias, QLM_Q4_1); break;
    }
}

/* x in the I8 form in 256-bit vectors (the same values as the scalar quantizer's): a run's largest
 * magnitude, its scale, and the values rounded to nearest even (as lrintf) times the inverse. */
KERNEL_FN void quantize_i8(int8_t *q, float *scales, int32_t *sums, const float *x, long n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    /* VPACKSS* interleave the 128-bit lanes: this puts the four-byte groups back in order. */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (long b = 0; b < n; b += QLM_X8_BLOCK) {
        __m256 v[4], mx = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
        QLM_UNROLL(4)
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + b + 8 * j);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[j], v[j], _CMP_UNORD_Q));
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[j]));
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        float inv;
        scales[b / QLM_X8_BLOCK] = qlm_x_int_scale(_mm_cvtss_f32(m), _mm256_movemask_ps(nan) != 0, QLM_X8_MAX, &inv);
        const __m256 f = _mm256_set1_ps(inv);
        __m256i a[4];
        QLM_UNROLL(4)
        for (int j = 0; j < 4; j++) a[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], f));
        const __m256i s = _mm256_add_epi32(_mm256_add_epi32(a[0], a[1]), _mm256_add_epi32(a[2], a[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        sums[b / QLM_X8_BLOCK] = _mm_cvtsi128_si32(s4);
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a[0], a[1]), _mm256_packs_epi32(a[2], a[3]));
        _mm256_storeu_si256((__m256i *)(q + b), _mm256_permutevar8x32_epi32(p, order));
    }
}
