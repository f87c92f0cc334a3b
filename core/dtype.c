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

const char *qlm_dtype_name(qlm_dtype t) {
    static const char *names[] = {"f32", "f16", "bf16", "int8"};
    return (unsigned)t < QLM_DTYPE_COUNT ? names[t] : "?";
}

int qlm_dtype_parse(const char *s, qlm_dtype *out) {
    static const struct { const char *name; qlm_dtype t; } table[] = {
        {"f32", QLM_F32}, {"fp32", QLM_F32}, {"float32", QLM_F32},
        {"f16", QLM_F16}, {"fp16", QLM_F16}, {"float16", QLM_F16},
        {"bf16", QLM_BF16}, {"bfloat16", QLM_BF16},
        {"int8", QLM_I8}, {"i8", QLM_I8}, {"q8", QLM_I8},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(s, table[i].name) == 0) {
            *out = table[i].t;
            return 0;
        }
    return -1;
}
