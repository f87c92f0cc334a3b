/* Scalar F16 conversions with IEEE round-to-nearest-even, subnormals, Inf and NaN. NaNs are
 * quieted and keep their top payload bits, as the F16C instructions do, so the scalar and
 * SIMD paths give identical bits. The bulk conversions go through the active kernel table. */
#include "half.h"

#include "matmul_internal.h"

float qlm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        u = sign;
    } else {
        /* Subnormal mant * 2^-24: shift the leading 1 up to the implicit-bit position. */
        uint32_t e = 113;
        do {
            mant <<= 1;
            e--;
        } while (!(mant & 0x400u));
        u = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t qlm_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (qlm_f32_bits_are_nan(u)) return qlm_f16_of_nan(u);
    /* 65520 is the midpoint between 65504 (odd mantissa) and 2^16, so it ties up to Inf. */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {
        /* Normal: round at bit 13 (ties to even), then rebias 127 -> 15; a carry out of
         * the mantissa correctly bumps the exponent. */
        uint32_t r = a + 0x0fffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    /* 2^-25 is the midpoint between 0 and the smallest subnormal; it ties down to 0. */
    if (a <= 0x33000000u) return sign;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - (a >> 23); /* 14..24: value in units of 2^-24 is m >> shift */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

void qlm_f16_to_f32_n(float *dst, const uint16_t *src, long n) {
    qlm_kernels()->f16_to_f32(dst, src, n);
}

void qlm_bf16_to_f32_n(float *dst, const uint16_t *src, long n) {
    qlm_kernels()->bf16_to_f32(dst, src, n);
}

void qlm_f32_to_f16_n(uint16_t *dst, const float *src, long n) {
    qlm_kernels()->f32_to_f16(dst, src, n);
}

void qlm_f32_to_bf16_n(uint16_t *dst, const float *src, long n) {
    qlm_kernels()->f32_to_bf16(dst, src, n);
}
