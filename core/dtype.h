/* Storage types of weights and tensors. */
#ifndef QLM_DTYPE_H
#define QLM_DTYPE_H

#include <stddef.h>

typedef enum {
    QLM_F32 = 0,
    QLM_F16 = 1,
    QLM_BF16 = 2,
    QLM_I8 = 3, /* symmetric INT8 with a per-tensor or per-row F32 scale */
    /* Block types: each row is a run of blocks of `group` weights (32, 64 or 128, along the
     * input dimension), each block an F16 scale d (Q4_1: then an F16 offset m) and the values.
     * At group 32 the bytes are those of GGUF's types of the same names, so such tensors run in
     * place from the file. Q4 blocks hold their values in 16-byte runs of 32: byte j of a run
     * holds value j in its low nibble and value j + 16 in its high one. */
    QLM_Q8_0 = 4, /* w = q d, q int8 */
    QLM_Q4_0 = 5, /* w = (q - 8) d, q in 0..15 */
    QLM_Q4_1 = 6, /* w = q d + m, q in 0..15 */
    QLM_DTYPE_COUNT
} qlm_dtype;

/* Bytes per element; 0 for block types (see qlm_dtype_row_bytes). */
size_t qlm_dtype_size(qlm_dtype t);
/* Whether t is a block type. */
static inline int qlm_dtype_is_block(qlm_dtype t) { return t == QLM_Q8_0 || t == QLM_Q4_0 || t == QLM_Q4_1; }
/* Bytes of one block of group weights of block type t. */
size_t qlm_dtype_block_bytes(qlm_dtype t, int group);
/* Bytes of a row of cols weights: cols * size, or the row's blocks (cols a multiple of group). */
size_t qlm_dtype_row_bytes(qlm_dtype t, long cols, int group);
/* Whether group is a block size qlm runs (32, 64, 128). */
int qlm_group_valid(int group);
/* Lower-case name as used on the command line: "f32", "f16", "bf16", "int8", "q8_0", "q4_0",
 * "q4_1". */
const char *qlm_dtype_name(qlm_dtype t);
/* Parses a command-line name ("f32", "fp32", "f16", "fp16", "bf16", "int8", "i8", "q8_0",
 * "q4_0" or "int4", "q4_1"); -1 if unknown. */
int qlm_dtype_parse(const char *s, qlm_dtype *out);

#endif
