/* The layout of the decode caches, shared by the architectures: in each slot every head's rows are
 * one contiguous run, [slot][head][max_pos][head_dim], so that attention streams one head's keys
 * rather than picking them out of rows that interleave all heads (see qlm_attn_shape). Caches
 * written whole at once (T5's cross-attention) pack the heads instead: kv_store with max_pos = the
 * input's length, and qlm_attn_shape.heads_packed. */
#ifndef QLM_KV_CACHE_H
#define QLM_KV_CACHE_H

#include "backend.h"

/* The dtype of the decode caches (T5's cross-attention keys and values too) of a model whose
 * linear weights are of dtype `weights`: BF16 for INT8 and BF16 weights, which halves the bytes
 * every decode step reads from the caches (BF16 has F32's range, so T5's large activations cannot
 * overflow it); transformers' own BF16 models keep BF16 caches as well. F16 for block types, as
 * llama.cpp keeps them: a GGUF run as stored holds the file's exact weights, and F16's 11-bit
 * significand keeps the default model's Q4_1 within 0.075 of transformers' logits (F32 caches:
 * 0.038, BF16 ones: 0.54) and its perplexity over 9,119 tokens of stories at 10.0543 (F32:
 * 10.0545) at half the bytes. A backend without block weights (CUDA) loads a GGUF's blocks as
 * BF16, and its caches are BF16's. F32 for F32 weights (the exact reference) and F16 ones (BF16
 * caches moved F16 models from 0.23% to 0.74% of the largest logit on the parity fixtures, past
 * their 0.4% tolerance). */
static inline qlm_dtype qlm_kv_dtype(qlm_dtype weights, const qlm_backend *be) {
    if (qlm_dtype_is_block(weights)) return be->block_weights ? QLM_F16 : QLM_BF16;
    return weights == QLM_I8 || weights == QLM_BF16 ? QLM_BF16 : QLM_F32;
}

/* Bytes of one cache element of dtype kv. */
static inline size_t qlm_kv_elem_size(qlm_dtype kv) {
    return kv == QLM_F32 ? 4 : 2;
}

/* Gives sh the strides of this layout for caches of max_pos positions per slot, of dtype kv. A
 * rolling cache (sliding-window layers) holds max_pos rows and keeps position p in row p % max_pos:
 * its callers set sh->ring = max_pos and store positions modulo it. */
static inline void qlm_kv_shape(qlm_attn_shape *sh, int max_pos, qlm_dtype kv) {
    sh->slot_stride = (size_t)sh->n_kv_heads * max_pos * sh->head_dim;
    sh->row_stride = (size_t)sh->head_dim;
    sh->head_stride = (size_t)max_pos * sh->head_dim;
    sh->kv_dtype = kv;
}

#endif
