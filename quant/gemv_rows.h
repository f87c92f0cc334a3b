/* The GEMV row driver shared by the SIMD kernel files: groups of 4 rows through the file's
 * dot4, the rest through dot1, then the I8 scale and bias. Included once by each of
 * matmul_avx2.c and matmul_avx512.c after they define KERNEL_FN and KERNEL_INLINE (their
 * target attributes) and their dot4/dot1, so one text serves each instruction set. */
#ifndef KERNEL_FN
#error "define KERNEL_FN, KERNEL_INLINE, dot4 and dot1 before including gemv_rows.h"
#endif

KERNEL_INLINE void gemv_dt(float *y, const float *x, const qlm_weight *w, int r0, int r1, const float *bias,
                           qlm_dtype dt) {
    size_t stride = (size_t)w->cols * qlm_weight_elem_size(dt);
    const char *base = w->data;
    int o = r0;
    for (; o + 4 <= r1; o += 4) {
        /* One group ahead was as fast as two or three and much faster than none (measured). */
        const char *pf = o + 8 <= r1 ? base + (size_t)(o + 4) * stride : NULL;
        __m128 s = dot4(base + (size_t)o * stride, stride, x, w->cols, dt, pf);
        if (dt == QLM_I8)
            s = _mm_mul_ps(s, w->row_scales ? _mm_loadu_ps(w->row_scales + o) : _mm_set1_ps(w->scale));
        if (bias) s = _mm_add_ps(s, _mm_loadu_ps(bias + o));
        _mm_storeu_ps(y + o, s);
    }
    for (; o < r1; o++) y[o] = qlm_gemv_finish(dot1(base + (size_t)o * stride, x, w->cols, dt), w, o, bias);
}

/* The dtype switch makes dt a constant inside each inlined copy of gemv_dt. */
KERNEL_FN void gemv(float *y, const float *x, const qlm_weight *w, int r0, int r1, const float *bias) {
    switch (w->dtype) {
    case QLM_F16: gemv_dt(y, x, w, r0, r1, bias, QLM_F16); break;
    case QLM_BF16: gemv_dt(y, x, w, r0, r1, bias, QLM_BF16); break;
    case QLM_I8: gemv_dt(y, x, w, r0, r1, bias, QLM_I8); break;
    default: gemv_dt(y, x, w, r0, r1, bias, QLM_F32); break;
    }
}
