/* Symmetric INT8 quantization and dtype conversions.
 *
 * Rounding is half away from zero (as roundf; qlm_round_clamp), so |w - q*s| <= s/2 for every finite w (up to the
 * float rounding of w / s).
 * Scales: s = max|w| / 127 over the finite values; a tensor (or row) with no nonzero finite
 * value, or one so small that s underflows to 0, gets s = 1 (all q = 0), never NaN.
 * Non-finite inputs: +-Inf clamp to +-127, NaN becomes 0. */
#include "quantize.h"

#include <math.h>
#include <string.h>

#include "block_pack.h"
#include "block_quant.h"
#include "half.h"
#include "matmul_internal.h"

/* One clone per instruction set: these passes run over every weight a load converts to INT8. The
 * clones are static behind plain entry points: clang 14 gives an external target_clones function
 * no symbol of its own name, so other files could not link to it. */
#define PER_ISA __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))

/* On the bits: |w| of finite floats orders as their magnitudes' bits do, a max reduction the
 * compiler vectorizes where a float one with a finiteness test stays scalar. */
PER_ISA static float absmax_finite(const float *w, long n) {
    uint32_t m = 0;
    for (long i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &w[i], sizeof u);
        u &= 0x7FFFFFFFu;
        u &= -(uint32_t)(u < 0x7F800000u);
        m = u > m ? u : m;
    }
    union {
        uint32_t u;
        float f;
    } r = {.u = m};
    return r.f;
}

float qlm_absmax_finite(const float *w, long n) { return absmax_finite(w, n); }

float qlm_i8_scale(float absmax) {
    float s = absmax / 127.0f;
    return s > 0 ? s : 1.0f;
}

PER_ISA static void quantize_i8_run(int8_t *q, const float *w, long n, float s) {
    enum { CHUNK = 256 };
    float held[CHUNK];
    for (long i0 = 0; i0 < n; i0 += CHUNK) {
        const long m = n - i0 < CHUNK ? n - i0 : CHUNK;
        for (long i = 0; i < m; i++) held[i] = qlm_round_clamp_hold(w[i0 + i] / s, -127, 127);
        for (long i = 0; i < m; i++) q[i0 + i] = (int8_t)qlm_round_clamp_held(held[i], -127, 127);
    }
}

void qlm_quantize_i8_run(int8_t *q, const float *w, long n, float s) { quantize_i8_run(q, w, n, s); }

float qlm_quantize_i8(int8_t *q, const float *w, long rows, long cols) {
    float m = 0;
#pragma omp parallel for reduction(max : m) schedule(static)
    for (long r = 0; r < rows; r++) {
        float a = qlm_absmax_finite(w + r * cols, cols);
        if (a > m) m = a;
    }
    float s = qlm_i8_scale(m);
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) qlm_quantize_i8_run(q + r * cols, w + r * cols, cols, s);
    return s;
}

void qlm_quantize_i8_rows(int8_t *q, float *scales, const float *w, long rows, long cols) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        scales[r] = qlm_i8_scale(qlm_absmax_finite(w + r * cols, cols));
        qlm_quantize_i8_run(q + r * cols, w + r * cols, cols, scales[r]);
    }
}

void qlm_convert_from_f32(void *dst, qlm_dtype dt, const float *src, long n) {
    switch (dt) {
    case QLM_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case QLM_F16: qlm_f32_to_f16_n(dst, src, n); break;
    case QLM_BF16: qlm_f32_to_bf16_n(dst, src, n); break;
    default: break; /* I8 needs a scale: use qlm_quantize_i8*. */
    }
}

void qlm_convert_to_f32(float *dst, const void *src, qlm_dtype st, long n) {
    switch (st) {
    case QLM_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case QLM_F16: qlm_f16_to_f32_n(dst, src, n); break;
    case QLM_BF16: qlm_bf16_to_f32_n(dst, src, n); break;
    default: break; /* I8 needs a scale: use qlm_weight_row_f32. */
    }
}

void qlm_weight_row_f32(const qlm_weight *w, int r, float *out) {
    size_t cols = (size_t)w->cols;
    if (w->rope_heads) r = (int)qlm_rope_stored_row(r, w->rows, w->rope_heads);
    if (qlm_dtype_is_block(w->dtype)) {
        if (w->act8)
            qlm_panels_row_f32(out, w->data, w->dtype, w->group, w->rows, w->cols, r);
        else
            qlm_block_dequantize_row(out, w->dtype, w->group,
                                     (const char *)w->data + (size_t)r * qlm_dtype_row_bytes(w->dtype, w->cols, w->group),
                                     w->cols);
        return;
    }
    if (w->dtype != QLM_I8) {
        qlm_convert_to_f32(out, (const char *)w->data + (size_t)r * cols * qlm_weight_elem_size(w->dtype), w->dtype,
                           (long)cols);
        return;
    }
    qlm_kernels()->i8_to_f32(out, (const int8_t *)w->data + (size_t)r * cols, (long)cols,
                             w->row_scales ? w->row_scales[r] : w->scale);
}
