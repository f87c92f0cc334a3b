/* Storage types of weights and tensors. */
#ifndef QLM_DTYPE_H
#define QLM_DTYPE_H

#include <stddef.h>

typedef enum {
    QLM_F32 = 0,
    QLM_F16 = 1,
    QLM_BF16 = 2,
    QLM_I8 = 3, /* symmetric INT8 with a per-tensor or per-row F32 scale */
    QLM_DTYPE_COUNT
} qlm_dtype;

/* Bytes per element. */
size_t qlm_dtype_size(qlm_dtype t);
/* Lower-case name as used on the command line: "f32", "f16", "bf16", "int8". */
const char *qlm_dtype_name(qlm_dtype t);
/* Parses a command-line name ("f32", "fp32", "f16", "fp16", "bf16", "int8", "i8"); -1 if unknown. */
int qlm_dtype_parse(const char *s, qlm_dtype *out);

#endif
