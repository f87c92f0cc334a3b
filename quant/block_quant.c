#include "block_quant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "half.h"
#include "matmul_internal.h"

static uint16_t load_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static void store_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* A scale as stored: F16, saturated at F16's largest finite value. */
static float f16_round(float v, uint8_t *out) {
    if (v > QLM_F16_MAX) v = QLM_F16_MAX;
    if (v < -QLM_F16_MAX) v = -QLM_F16_MAX;
    uint16_t h = qlm_f32_to_f16(v);
    store_u16(out, h);
    return qlm_f16_to_f32(h);
}

static float finite_or_zero(float v) { return isfinite(v) ? v : 0.0f; }

static void quantize_block(uint8_t *b, qlm_dtype dt, int group, const float *w) {
    if (dt == QLM_Q8_0) {
        float amax = 0;
        for (int j = 0; j < group; j++) {
            float a = fabsf(finite_or_zero(w[j]));
            amax = a > amax ? a : amax;
        }
        float d = f16_round(amax / 127.0f, b), inv = d != 0 ? 1.0f / d : 0.0f;
        for (int j = 0; j < group; j++)
            ((int8_t *)(b + 2))[j] = (int8_t)qlm_round_clamp(finite_or_zero(w[j]) * inv, -127, 127);
        return;
    }
    uint8_t *qs = b + qlm_block_head(dt);
    memset(qs, 0, (size_t)group / 2);
    float d, m = 0;
    if (dt == QLM_Q4_0) {
        float ext = 0;
        for (int j = 0; j < group; j++)
            if (fabsf(finite_or_zero(w[j])) > fabsf(ext)) ext = finite_or_zero(w[j]);
        d = f16_round(ext / -8.0f, b);
    } else {
        float lo = INFINITY, hi = -INFINITY;
        for (int j = 0; j < group; j++) {
            float v = finite_or_zero(w[j]);
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        d = f16_round((hi - lo) / 15.0f, b);
        m = f16_round(lo, b + 2);
    }
    float inv = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < group; j++) {
        float v = finite_or_zero(w[j]);
        int q = dt == QLM_Q4_0 ? qlm_round_clamp(v * inv + 8.0f, 0, 15) : qlm_round_clamp((v - m) * inv, 0, 15);
        qs[qlm_q4_byte(j)] |= (uint8_t)(q << qlm_q4_shift(j));
    }
}

void qlm_block_pack_q4_0(void *dst, const int8_t *q, const float *scales, int group, long cols) {
    const size_t bb = qlm_dtype_block_bytes(QLM_Q4_0, group);
    for (long k = 0; k + group <= cols; k += group) {
        uint8_t *b = (uint8_t *)dst + (size_t)(k / group) * bb, *qs = b + 2;
        f16_round(scales[k / group], b);
        memset(qs, 0, (size_t)group / 2);
        for (int j = 0; j < group; j++) {
            int v = q[k + j] < -8 ? 0 : q[k + j] > 7 ? 15 : q[k + j] + 8;
            qs[qlm_q4_byte(j)] |= (uint8_t)(v << qlm_q4_shift(j));
        }
    }
}

static void dequantize_block(float *w, qlm_dtype dt, int group, const uint8_t *b) {
    const float d = qlm_f16_to_f32(load_u16(b));
    const uint8_t *vals = b + qlm_block_head(dt);
    if (dt == QLM_Q4_1) {
        const float m = qlm_f16_to_f32(load_u16(b + 2));
        for (int j = 0; j < group; j++) w[j] = (float)qlm_block_value(vals, j, dt) * d + m;
    } else {
        for (int j = 0; j < group; j++) w[j] = (float)qlm_block_value(vals, j, dt) * d;
    }
}

void qlm_block_quantize_row(void *dst, qlm_dtype dt, int group, const float *src, long cols) {
    const size_t bb = qlm_dtype_block_bytes(dt, group);
    for (long k = 0; k + group <= cols; k += group) quantize_block((uint8_t *)dst + (size_t)(k / group) * bb, dt, group, src + k);
}

void qlm_block_dequantize_row(float *dst, qlm_dtype dt, int group, const void *src, long cols) {
    const size_t bb = qlm_dtype_block_bytes(dt, group);
    for (long k = 0; k + group <= cols; k += group)
        dequantize_block(dst + k, dt, group, (const uint8_t *)src + (size_t)(k / group) * bb);
}
