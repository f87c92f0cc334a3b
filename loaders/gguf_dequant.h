/* GGML tensor types as GGUF stores them: block geometry of every known type id, and
 * conversion to F32 for the ones qlm reads; plus the Q/K row order fix shared with the
 * llama2.c loader. Internal to the loaders. */
#ifndef QLM_GGUF_DEQUANT_H
#define QLM_GGUF_DEQUANT_H

#include <stddef.h>
#include <stdint.h>

/* Converts nblocks consecutive blocks at src into nblocks * block floats at dst. */
typedef void (*qlm_ggml_dequant_fn)(const uint8_t *src, float *dst, int64_t nblocks);

typedef struct {
    const char *name;        /* "Q4_1" */
    uint32_t block;          /* elements per block */
    uint32_t bytes;          /* bytes per block */
    qlm_ggml_dequant_fn fn;  /* NULL when qlm cannot convert this type */
} qlm_ggml_type;

/* The type with GGUF type id `id`, or NULL for an id this build does not know. */
const qlm_ggml_type *qlm_ggml_type_info(uint32_t id);

#endif
