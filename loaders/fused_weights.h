/* Checkpoints that store a layer's q/k/v projections as one matrix (qkv_proj) and the MLP's gate and
 * up projections as one (gate_up_proj), as Phi-3 does. The model reads separate projections: each
 * part of a fused matrix is a contiguous run of its rows, so it becomes an entry of its own that
 * points into the same data (no copy). */
#ifndef QLM_FUSED_WEIGHTS_H
#define QLM_FUSED_WEIGHTS_H

#include "../models/config.h"
#include "../core/tensor_store.h"

/* Replaces every layer's self_attn.qkv_proj.weight by q_proj/k_proj/v_proj and mlp.gate_up_proj.weight
 * by gate_proj/up_proj (rows in that order, as transformers' Phi-3 splits them), after checking
 * their shapes against cfg; a store without fused tensors is left as it is. path names the file in
 * errors. */
int qlm_store_unfuse(qlm_tensor_store *s, const qlm_llama_config *cfg, const char *path);

#endif
