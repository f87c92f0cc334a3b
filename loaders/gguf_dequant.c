/* GGML block formats (little-endian; "d"/"m"/"dmin" are F16 scales):
 *   Q8_0  34 B / 32: d, int8 q[32]                      x = q * d
 *   Q4_0  18 B / 32: d, qs[16]                          x = (q - 8) * d
 *   Q4_1  20 B / 32: d, m, qs[16]                       x = q * d + m
 *   Q5_0  22 B / 32: d, qh (u32), qs[16]                x = (q - 16) * d
 *   Q5_1  24 B / 32: d, m, qh (u32), qs[16]             x = q * d + m
 * In the 32-element blocks, element j < 16 is the low nibble of qs[j] and element j + 16 its
 * high nibble; Q5 types add bit j of qh as the fifth bit of element j.
 * K-quants use 256-element super-blocks:
 *   Q4_K 144 B: d, dmin, scales[12] (eight 6-bit scale/min pairs), qs[128]
 *   Q5_K 176 B: d, dmin, scales[12], qh[32], qs[128]
 *   Q6_K 210 B: ql[128], qh[64], int8 scales[16], d
 * Q4_K/Q5_K: sub-block s (32 elements) is x = d*sc[s] * q - dmin*mn[s]; qs byte 32*(e/64) + e%32
 * holds element e in its low (e%64 < 32) or high nibble, and Q5_K's fifth bit is bit e/32 of
 * qh[e%32]. Q6_K: x = d*scales[e/16] * (q - 32), with the low nibble in ql and two high bits
 * in qh as decoded in deq_q6_k. */
#include "gguf_dequant.h"

#include <stddef.h>
#include <string.h>

#include "../quant/block_quant.h"
#include "../quant/half.h"

static float f16_at(const uint8_t *p) { return qlm_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static uint32_t u32_at(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void deq_f32(const uint8_t *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

/* The bulk converters need 2-byte aligned input; a file with general.alignment 1 may not give it. */
static void deq_f16(const uint8_t *src, float *dst, int64_t n) {
    if ((uintptr_t)src % 2 == 0) qlm_f16_to_f32_n(dst, (const uint16_t *)src, (long)n);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = f16_at(src + 2 * i);
}

static void deq_bf16(const uint8_t *src, float *dst, int64_t n) {
    if ((uintptr_t)src % 2 == 0) qlm_bf16_to_f32_n(dst, (const uint16_t *)src, (long)n);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = qlm_bf16_to_f32((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
}

/* GGUF's Q8_0, Q4_0 and Q4_1 are qlm's block types at group 32. */
static void deq_q8_0(const uint8_t *src, float *dst, int64_t nb) { qlm_block_dequantize_row(dst, QLM_Q8_0, 32, src, (long)(nb * 32)); }
static void deq_q4_0(const uint8_t *src, float *dst, int64_t nb) { qlm_block_dequantize_row(dst, QLM_Q4_0, 32, src, (long)(nb * 32)); }
static void deq_q4_1(const uint8_t *src, float *dst, int64_t nb) { qlm_block_dequantize_row(dst, QLM_Q4_1, 32, src, (long)(nb * 32)); }

/* The 5-bit values of a Q5_0/Q5_1 block, unsigned 0..31. */
static void q5_values(const uint8_t *qh_bytes, const uint8_t *qs, int q[32]) {
    uint32_t qh = u32_at(qh_bytes);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0x0f) | (int)((qh >> j) & 1u) << 4;
        q[j + 16] = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
    }
}

static void deq_q5_0(const uint8_t *src, float *dst, int64_t nb) {
    int q[32];
    for (int64_t b = 0; b < nb; b++, src += 22, dst += 32) {
        float d = f16_at(src);
        q5_values(src + 2, src + 6, q);
        for (int j = 0; j < 32; j++) dst[j] = (float)(q[j] - 16) * d;
    }
}

static void deq_q5_1(const uint8_t *src, float *dst, int64_t nb) {
    int q[32];
    for (int64_t b = 0; b < nb; b++, src += 24, dst += 32) {
        float d = f16_at(src), m = f16_at(src + 2);
        q5_values(src + 4, src + 8, q);
        for (int j = 0; j < 32; j++) dst[j] = (float)q[j] * d + m;
    }
}

/* Q4_K/Q5_K: eight 6-bit (scale, min) pairs packed in 12 bytes. Pairs 0-3 are the low 6 bits
 * of bytes 0-3 / 4-7; pairs 4-7 take 4 bits from bytes 8-11 and their top 2 bits from the
 * spare top bits of bytes 0-3 / 4-7. */
static void k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* Shared by Q4_K and Q5_K; qh is NULL for Q4_K. */
static void deq_k4_block(const uint8_t *head, const uint8_t *qh, const uint8_t *qs, float *dst) {
    float d = f16_at(head), dmin = f16_at(head + 2);
    const uint8_t *scales = head + 4;
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        k_scale_min(scales, s, &sc, &mn);
        float ds = d * (float)sc, dm = dmin * (float)mn;
        const uint8_t *bytes = qs + 32 * (s / 2);
        int shift = 4 * (s % 2);
        for (int l = 0; l < 32; l++) {
            int q = (bytes[l] >> shift) & 0x0f;
            if (qh) q |= ((qh[l] >> s) & 1) << 4;
            dst[32 * s + l] = ds * (float)q - dm;
        }
    }
}

static void deq_q4_k(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 144, dst += 256) deq_k4_block(src, NULL, src + 16, dst);
}

static void deq_q5_k(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 176, dst += 256) deq_k4_block(src, src + 16, src + 48, dst);
}

/* Element e of a half h = e / 128 (r = e % 128): low 4 bits in nibble r / 64 of ql[64h + r % 64],
 * high 2 bits at bit 2 * (r / 32) of qh[32h + r % 32]; so byte l < 32 of a half's qh holds the high
 * bits of r = l, l + 32, l + 64 and l + 96. */
static void deq_q6_k(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 210, dst += 256) {
        const int8_t *scales = (const int8_t *)(src + 192);
        float d = f16_at(src + 208), ds[16];
        for (int k = 0; k < 16; k++) ds[k] = d * (float)scales[k];
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = src + 64 * h, *qh = src + 128 + 32 * h;
            float *y = dst + 128 * h;
            const float *sc = ds + 8 * h;
            for (int l = 0; l < 32; l++) {
                int q0 = (ql[l] & 0x0f) | (qh[l] & 3) << 4, q1 = (ql[l + 32] & 0x0f) | (qh[l] >> 2 & 3) << 4;
                int q2 = ql[l] >> 4 | (qh[l] >> 4 & 3) << 4, q3 = ql[l + 32] >> 4 | (qh[l] >> 6 & 3) << 4;
                y[l] = sc[l / 16] * (float)(q0 - 32);
                y[l + 32] = sc[2 + l / 16] * (float)(q1 - 32);
                y[l + 64] = sc[4 + l / 16] * (float)(q2 - 32);
                y[l + 96] = sc[6 + l / 16] * (float)(q3 - 32);
            }
        }
    }
}

static const struct {
    uint32_t id;
    qlm_ggml_type t;
} TYPES[] = {
    {0, {"F32", 1, 4, deq_f32}},      {1, {"F16", 1, 2, deq_f16}},        {2, {"Q4_0", 32, 18, deq_q4_0}},
    {3, {"Q4_1", 32, 20, deq_q4_1}},  {6, {"Q5_0", 32, 22, deq_q5_0}},    {7, {"Q5_1", 32, 24, deq_q5_1}},
    {8, {"Q8_0", 32, 34, deq_q8_0}},  {9, {"Q8_1", 32, 40, NULL}},        {10, {"Q2_K", 256, 84, NULL}},
    {11, {"Q3_K", 256, 110, NULL}},   {12, {"Q4_K", 256, 144, deq_q4_k}}, {13, {"Q5_K", 256, 176, deq_q5_k}},
    {14, {"Q6_K", 256, 210, deq_q6_k}}, {15, {"Q8_K", 256, 292, NULL}},   {16, {"IQ2_XXS", 256, 66, NULL}},
    {17, {"IQ2_XS", 256, 74, NULL}},  {18, {"IQ3_XXS", 256, 98, NULL}},   {19, {"IQ1_S", 256, 50, NULL}},
    {20, {"IQ4_NL", 32, 18, NULL}},   {21, {"IQ3_S", 256, 110, NULL}},    {22, {"IQ2_S", 256, 82, NULL}},
    {23, {"IQ4_XS", 256, 136, NULL}}, {24, {"I8", 1, 1, NULL}},           {25, {"I16", 1, 2, NULL}},
    {26, {"I32", 1, 4, NULL}},        {27, {"I64", 1, 8, NULL}},          {28, {"F64", 1, 8, NULL}},
    {29, {"IQ1_M", 256, 56, NULL}},   {30, {"BF16", 1, 2, deq_bf16}},     {34, {"TQ1_0", 256, 54, NULL}},
    {35, {"TQ2_0", 256, 66, NULL}},   {39, {"MXFP4", 32, 17, NULL}},
};

const qlm_ggml_type *qlm_ggml_type_info(uint32_t id) {
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (TYPES[i].id == id) return &TYPES[i].t;
    return NULL;
}
