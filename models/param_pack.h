/* Packing a model's parameters from a tensor store into one flat, 64-byte-aligned buffer per
 * unit (a layer, or the embeddings), converted once to the storage dtype. Architectures
 * describe each unit as a list of qlm_param; sizing, filling, exporting and counting walk the
 * same list, so no model writes that code again. */
#ifndef QLM_PARAM_PACK_H
#define QLM_PARAM_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "../core/tensor_store.h"
#include "../core/backend.h"
#include "../core/weight.h"

typedef struct qlm_param_s {
    char name[160];     /* tensor name in the store (Hugging Face naming) */
    int64_t rows, cols; /* expected shape; cols 0: a 1-D tensor of rows values */
    int optional;       /* absent tensors leave the destination empty (NULL vector, 0x0 matrix) */
    qlm_weight *matrix; /* a linear weight, converted to the storage dtype, or */
    float **vector;     /* values kept F32 (norms, biases, small tables), row-major */
    /* A matrix only read a row at a time, never multiplied (an untied embedding table): it takes
     * no W8A8 panels, so a block table stays where the file has it. */
    int lookup;
    /* Added to a vector's values when packed and taken off when exported: Gemma stores norm
     * weights as w and multiplies by 1 + w, which the rmsnorm op then reads as it is. The packed
     * float is the 1 + w transformers computes in float32, and the exported (1 + w) - 1 gives that
     * float back (it may differ from w in its last bits). */
    float offset;
} qlm_param;

/* How a unit's matrices are stored. */
typedef struct {
    qlm_dtype dtype; /* storage dtype */
    int per_channel; /* I8: per-row scales */
    int group;       /* block types: weights per block */
    /* Each matrix keeps the dtype it is stored in (with its I8 scale granularity or its block
     * group) instead: a GGUF's mix of Q4_1, Q8_0 and F16 tensors runs as the file has it. */
    int as_stored;
    /* Block-type matrices take 8-bit activations (W8A8, qlm_weight: rows put in panels,
     * quant/block_pack.h; an embedding table's rows still read through qlm_weight_row_f32). */
    int act8;
    /* A matrix the store holds exactly as the kernels read it (its dtype, block group, INT8 scale
     * granularity, aligned for its elements; no W8A8 panels) is read where it lies, on a backend
     * that runs in host memory: the store must then outlive the weights. */
    int in_place;
    /* W8A8 matrices already in panels (a panel cache file's, loaders/panel_cache.h), read where
     * they lie when their name, dtype, group and shape match, in place of packing them again: the
     * store must then outlive the weights. */
    const qlm_tensor_store *panels;
    /* Each entry's values are checked (qlm_entry_check_values) just before they are read, in
     * place or to convert: one pass over the file's pages, and a bad tensor refused by name. */
    int check_values;
} qlm_weight_format;

/* Finds, checks, sizes, allocates and fills every parameter of the list into *buffer, then moves
 * the buffer into the backend's memory (be->upload; free it with be->free). Matrices are
 * converted to fmt (a block type needs widths that are whole blocks), or with fmt.in_place left
 * where the store holds them when they need nothing (*in_place_bytes, if not NULL, grows by
 * theirs). Errors name the tensor. On failure *buffer is freed and NULL. */
int qlm_params_pack(const qlm_param *p, int n, const qlm_tensor_store *store, qlm_weight_format fmt,
                    const qlm_backend *be, void **buffer, size_t *bytes, size_t *in_place_bytes);

/* Adds copies of the present parameters (in be's memory) to store under their names (storage dtype, I8 scales). */
int qlm_params_export(const qlm_backend *be, const qlm_param *p, int n, qlm_tensor_store *store);
/* Adds the matrices of the list made at load that a cache of converted weights keeps (W8A8
 * panels, and converted matrices of the types that are not blocks, INT8 with its scales) to store
 * as entries that point at them (no copy): what a panel cache file holds. */
int qlm_params_list_cacheable(const qlm_param *p, int n, qlm_tensor_store *store);

/* Number of values in the present parameters. */
int64_t qlm_params_count(const qlm_param *p, int n);

/* Adds every parameter of the list to store as F32, deterministic in seed: 1-D tensors (norms) 1,
 * other tables uniform in [-1, 1), linear weights uniform with variance 1/(3 cols). For measuring
 * a model's shape without its weights. */
int qlm_params_add_random(const qlm_param *p, int n, uint64_t seed, qlm_tensor_store *store);

/* The parameter has a destination filled (optional ones may be absent). */
int qlm_param_present(const qlm_param *p);

/* Points every present parameter of p[0..k) at F32 room in one fresh zeroed buffer (*buffer, from
 * be->alloc): the same unit's gradients, optimizer moments or master weights. Matrices become F32
 * qlm_weights; the destinations p points to are overwritten. */
int qlm_params_twin(const qlm_backend *be, qlm_param *p, int k, void **buffer);

/* Bytes one matrix occupies in its storage dtype, per-row scales included. */
size_t qlm_weight_bytes(const qlm_weight *w);

/* "[a,b]" shape check of a store entry; the error names the tensor. cols 0: a vector. */
int qlm_param_check_shape(const qlm_tensor_entry *e, int64_t rows, int64_t cols);

#endif
