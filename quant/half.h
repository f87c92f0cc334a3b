/* F32 <-> F16 / BF16 conversion (round to nearest even; NaN and Inf kept). */
#ifndef QLM_HALF_H
#define QLM_HALF_H

#include <stdint.h>
#include <string.h>

#include "half_nan.h"

static inline float qlm_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t qlm_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (qlm_f32_bits_are_nan(u)) return qlm_bf16_of_nan(u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* F16's largest finite value, its bits, and the bits of +infinity. */
#define QLM_F16_MAX 65504.0f
#define QLM_F16_MAX_BITS 0x7bffu
#define QLM_F16_INF 0x7c00u

float qlm_f16_to_f32(uint16_t h);
uint16_t qlm_f32_to_f16(float f);

/* Bulk conversions. */
void qlm_f16_to_f32_n(float *dst, const uint16_t *src, long n);
void qlm_bf16_to_f32_n(float *dst, const uint16_t *src, long n);
void qlm_f32_to_f16_n(uint16_t *dst, const float *src, long n);
void qlm_f32_to_bf16_n(uint16_t *dst, const float *src, long n);

#endif
