/* The layout of the decode caches, shared by the architectures: in each slot every head's rows are
 * one contiguous run, [slot][head][max_pos][head_dim], so that attention streams one head's keys
 * rather than picking them out of rows that interleave all heads (see qlm_attn_shape). */
#ifndef QLM_KV_CACHE_H
#define QLM_KV_CACHE_H

#include "backend.h"

/* The dtype of the decode caches of a model whose linear weights are of dtype `weights`: BF16 for
 * INT8 weights, which halves the bytes every decode step reads from the caches at a rounding far
 * below the weights' own (BF16 has F32's range, so T5's large activations cannot overflow it);
 * F32 for the others, whose logits keep their documented distance from the reference (BF16
 * caches moved F16 models from 0.23% to 0.74% and BF16 ones from 2.1% to 2.6% of the largest
 * logit on the parity fixtures). */
static inline qlm_dtype qlm_kv_dtype(qlm_dtype weights) {
    return weights == QLM_I8 ? QLM_BF16 : QLM_F32;
}

/* The dtype of T5's cross-attention keys and values, which every decode step reads over the whole
 * input: BF16 for BF16 weights too (a flan-t5-base decode step at batch 32 spent 17 of 57 ms reading
 * them as F32; flan-t5-base-shaped summarization went from 3.60 to 3.85 dialogues/s at batch 32 and
 * from 1.20 to 1.26-1.35 at batch 1). T5's BF16 parity figures moved from 0.9% / 2.0% to 1.0% / 1.7%
 * of the largest logit, under their 3% tolerance. Self-attention caches keep qlm_kv_dtype. */
static inline qlm_dtype qlm_cross_kv_dtype(qlm_dtype weights) {
    return weights == QLM_BF16 ? QLM_BF16 : qlm_kv_dtype(weights);
}

/* Bytes of one cache element of dtype kv. */
static inline size_t qlm_kv_elem_size(qlm_dtype kv) {
    return kv == QLM_BF16 ? 2 : 4;
}

/* Gives sh the strides of this layout for caches of max_pos positions per slot, of dtype kv. */
static inline void qlm_kv_shape(qlm_attn_shape *sh, int max_pos, qlm_dtype kv) {
    sh->slot_stride = (size_t)sh->n_kv_heads * max_pos * sh->head_dim;
    sh->row_stride = (size_t)sh->head_dim;
    sh->head_stride = (size_t)max_pos * sh->head_dim;
    sh->kv_bf16 = kv == QLM_BF16;
}

#endif
