/* The layout of the decode caches, shared by the architectures: in each slot every head's rows are
 * one contiguous run, [slot][head][max_pos][head_dim], so that attention streams one head's keys
 * rather than picking them out of rows that interleave all heads (see qlm_attn_shape). */
#ifndef QLM_KV_CACHE_H
#define QLM_KV_CACHE_H

#include "backend.h"

/* Row i of src ([n][heads * hd]) goes to position pos[i] of slot slots[i] (slots NULL: of slot). */
static inline void qlm_kv_store(const qlm_backend *be, float *cache, const float *src, int n, const int *slots,
                                int slot, const int *pos, int heads, int hd, int max_pos) {
    size_t run = (size_t)max_pos * hd;
    for (int i = 0; i < n; i++) {
        size_t base = (size_t)(slots ? slots[i] : slot) * heads * run + (size_t)pos[i] * hd;
        for (int h = 0; h < heads; h++) be->copy(cache + base + h * run, src + ((size_t)i * heads + h) * hd, hd);
    }
}

/* Gives sh the strides of this layout for caches of max_pos positions per slot. */
static inline void qlm_kv_shape(qlm_attn_shape *sh, int max_pos) {
    sh->slot_stride = (size_t)sh->n_kv_heads * max_pos * sh->head_dim;
    sh->row_stride = (size_t)sh->head_dim;
    sh->head_stride = (size_t)max_pos * sh->head_dim;
}

#endif
