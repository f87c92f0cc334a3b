#include "dtype.h"

#include <string.h>

size_t qlm_dtype_size(qlm_dtype t) {
    switch (t) {
    case QLM_F32: return 4;
    case QLM_F16:
    case QLM_BF16: return 2;
    case QLM_I8: return 1;
    default: return 0;
    }
}

size_t qlm_dtype_block_bytes(qlm_dtype t, int group) {
    switch (t) {
    case QLM_Q8_0: return 2 + (size_t)group;
    case QLM_Q4_0: return 2 + (size_t)group / 2;
    case QLM_Q4_1: return 4 + (size_t)group / 2;
    default: return 0;
    }
}

size_t qlm_dtype_row_bytes(qlm_dtype t, long cols, int group) {
    if (qlm_dtype_is_block(t)) return group > 0 ? (size_t)(cols / group) * qlm_dtype_block_bytes(t, group) : 0;
    return (size_t)cols * qlm_dtype_size(t);
}

int qlm_group_valid(int group) { return group == 32 || group == 64 || group == 128; }

const char *qlm_dtype_name(qlm_dtype t) {
    static const char *names[] = {"f32", "f16", "bf16", "int8", "q8_0", "q4_0", "q4_1"};
    return (unsigned)t < QLM_DTYPE_COUNT ? names[t] : "?";
}

int qlm_dtype_parse(const char *s, qlm_dtype *out) {
    static const struct { const char *name; qlm_dtype t; } table[] = {
        {"f32", QLM_F32}, {"fp32", QLM_F32}, {"float32", QLM_F32},
        {"f16", QLM_F16}, {"fp16", QLM_F16}, {"float16", QLM_F16},
        {"bf16", QLM_BF16}, {"bfloat16", QLM_BF16},
        {"int8", QLM_I8}, {"i8", QLM_I8}, {"q8", QLM_I8},
        {"q8_0", QLM_Q8_0}, {"q4_0", QLM_Q4_0}, {"int4", QLM_Q4_0}, {"q4_1", QLM_Q4_1},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(s, table[i].name) == 0) {
            *out = table[i].t;
            return 0;
        }
    return -1;
}
