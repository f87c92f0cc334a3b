/* The BF16 and F16 bits of an F32 NaN (u: its bits): its sign and top payload bits, made quiet, as
 * F16C and AVX-512 BF16 convert one. One definition for both backends, so that a stored NaN has the
 * same bits on each (the GPU's own conversions give one canonical NaN instead). */
#ifndef QLM_HALF_NAN_H
#define QLM_HALF_NAN_H

#include <stdint.h>

#include "../core/host_device.h"

static inline QLM_HD int qlm_f32_bits_are_nan(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }
static inline QLM_HD uint16_t qlm_bf16_of_nan(uint32_t u) { return (uint16_t)(u >> 16 | 0x40u); }
static inline QLM_HD uint16_t qlm_f16_of_nan(uint32_t u) {
    return (uint16_t)((u >> 16 & 0x8000u) | 0x7e00u | (u >> 13 & 0x3ffu));
}

#endif
