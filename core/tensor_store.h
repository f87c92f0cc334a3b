/* A set of named tensors read from a model file, before they become model weights.
 * Every loader (safetensors, GGUF, llama2.c) fills one of these with Hugging Face
 * tensor names ("model.layers.0.self_attn.q_proj.weight") and HF layouts, so the
 * model builder and the writers see one convention. Data either points into a
 * read-only mapping the store owns, or into a buffer the store owns. */
#ifndef QLM_TENSOR_STORE_H
#define QLM_TENSOR_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

#define QLM_MAX_DIMS 4

typedef struct {
    char *name;
    qlm_dtype dtype;
    int ndim;
    int64_t shape[QLM_MAX_DIMS];
    const void *data;
    size_t nbytes;
    /* INT8 only: per-tensor scale, or per-row scales (shape[0] floats) when row_scales != NULL. */
    float scale;
    const float *row_scales;
    /* Block types (2-D, shape [rows, cols]): weights per block; nbytes = rows * the row's blocks. */
    int group;
    /* Rows of heads interleaved for pairwise RoPE, as qlm_weight.rope_heads (0: PyTorch's order). */
    int rope_heads;
} qlm_tensor_entry;

typedef struct qlm_tensor_store qlm_tensor_store;

qlm_tensor_store *qlm_store_new(void);
void qlm_store_free(qlm_tensor_store *s);

/* Adds an entry whose data stays owned by whoever owns `data` (a mapping the store keeps, see
 * qlm_store_keep_mapping, or a buffer given with qlm_store_keep_buffer). Copies the name.
 * Fails on a duplicate name. Returns the entry or NULL. */
qlm_tensor_entry *qlm_store_add(qlm_tensor_store *s, const char *name, qlm_dtype dtype, int ndim,
                                const int64_t *shape, const void *data, size_t nbytes);
/* Allocates an owned, 64-byte aligned buffer of nbytes and adds an entry pointing to it. */
qlm_tensor_entry *qlm_store_add_owned(qlm_tensor_store *s, const char *name, qlm_dtype dtype,
                                      int ndim, const int64_t *shape, void **data_out);
/* The same for a 2-D tensor [rows, cols] of block type dtype with blocks of group weights. */
qlm_tensor_entry *qlm_store_add_owned_blocks(qlm_tensor_store *s, const char *name, qlm_dtype dtype, int group,
                                             int64_t rows, int64_t cols, void **data_out);
/* The store unmaps (munmap) this region when freed. */
int qlm_store_keep_mapping(qlm_tensor_store *s, void *addr, size_t len);
/* The store frees this malloc'd buffer when freed. */
int qlm_store_keep_buffer(qlm_tensor_store *s, void *buf);

const qlm_tensor_entry *qlm_store_find(const qlm_tensor_store *s, const char *name);
int qlm_store_count(const qlm_tensor_store *s);
const qlm_tensor_entry *qlm_store_at(const qlm_tensor_store *s, int i);
/* Gives back the memory of e's bytes where they lie in a file mapping the store keeps, once the
 * caller has converted them (madvise MADV_DONTNEED on the whole pages inside them): a model built
 * from a mapped file then peaks near its own weights rather than the file plus its weights. The
 * data stays readable: a later read faults it in from the file again. Owned buffers (converted or
 * reordered copies) are left alone, unless the store is read once. */
void qlm_store_release(const qlm_tensor_store *s, const qlm_tensor_entry *e);
/* The same for the first rows stored rows of e alone, while a converter works through the rest. */
void qlm_store_release_rows(const qlm_tensor_store *s, const qlm_tensor_entry *e, int64_t rows);
/* Whoever builds from this store reads each released entry no more (one model is built, then the
 * store freed): from now on a release also drops the entry's data (NULL) and frees the owned
 * buffer it lay in once no other entry points into it, so a GGUF's reordered Q/K copies and
 * converted K-quants do not outlive their conversion. */
void qlm_store_read_once(qlm_tensor_store *s);
/* Removes an entry by name (data not freed until the store is). Returns 0 if found. */
int qlm_store_remove(qlm_tensor_store *s, const char *name);

/* Element count of an entry (product of shape). */
int64_t qlm_entry_numel(const qlm_tensor_entry *e);

/* Checks that every value of e is usable: F32/F16/BF16 hold no NaN or Inf, INT8 scales are in
 * (0, 1e30], the F16 scales and offsets of block types are finite. A file with such values loads
 * and then generates empty or garbage text, so the error names the tensor and the first bad
 * element. One pass over the data, threads taking chunks: the model builder checks each tensor
 * just before it reads it (qlm_weight_format.check_values), so the pages are read once. */
int qlm_entry_check_values(const qlm_tensor_entry *e);
/* The same for every entry of s. */
int qlm_store_check_values(const qlm_tensor_store *s);

#endif
