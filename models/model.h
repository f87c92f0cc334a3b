/* A Llama-family decoder (Llama 2/3, TinyLlama, SmolLM2, Qwen2, TinyStories) built from a
 * tensor store, its weights converted once to the chosen storage dtype, and its forward
 * pass written against the backend op table. Each layer's parameters live in one
 * contiguous buffer (the unit that FSDP will shard), indexed by qlm_weight views. */
#ifndef QLM_MODEL_H
#define QLM_MODEL_H

#include <math.h>
#include <stdint.h>

#include "../core/tensor_store.h"
#include "../core/backend.h"
#include "config.h"
#include "lora_rows.h"
#include "param_pack.h"
#include "units.h"
#include "../core/weight.h"

typedef struct {
    float *attn_norm, *ffn_norm;
    float *attn_post_norm, *ffn_post_norm;            /* Gemma's norms of each block's output, else NULL */
    qlm_weight wq, wk, wv, wo, w_gate, w_up, w_down;
    float *bq, *bk, *bv, *bo, *b_gate, *b_up, *b_down; /* NULL when absent */
    float *q_norm, *k_norm;                           /* [head_dim] with qk_norm, else NULL */
    void *buffer;                                     /* the layer's flat parameter buffer */
    size_t buffer_bytes;
} qlm_layer;

typedef struct {
    qlm_llama_config cfg;
    /* How the matrices are stored (qlm_model_format of the options); fmt.dtype names the linear
     * weights' dtype (with fmt.as_stored: the attention's). */
    qlm_weight_format fmt;
    size_t in_place_bytes; /* of the matrices read where the store holds them */
    const qlm_backend *be;
    qlm_weight tok_embed;
    qlm_weight lm_head; /* same data as tok_embed when tied */
    qlm_weight_view head_view; /* lm_head as the view of tok_embed a sharded run refreshes (tied) */
    float *final_norm;
    float *inv_freq;    /* head_dim/2 RoPE frequencies (with the configured scaling applied) */
    float *inv_freq_local; /* the windowed layers' own (rope_local_theta), else NULL */
    float *inv_freq_long;  /* longrope's for calls that reach past rope_orig_max_pos, else NULL */
    qlm_layer *layers;
    void *shared_buffer; /* embeddings, lm_head, final norm */
    size_t shared_bytes;
    /* Set by a sharded run: unit 0 (shared) and 1 + l (layer l) are gathered around their use. */
    const qlm_unit_hooks *hooks;
} qlm_model;

typedef struct {
    qlm_dtype dtype;     /* storage dtype for linear weights and embeddings */
    int per_channel;     /* INT8: per-output-channel scales */
    int group;           /* block types: weights per block (0: 32) */
    int as_stored;       /* each matrix keeps its stored dtype; dtype then only names the model's */
    int act8;            /* block weights take 8-bit activations (W8A8, qlm_weight) */
    /* Matrices stored as the kernels read them stay where the store holds them (a file mapping:
     * nothing copied, nothing converted) on a host-memory backend. The store must then outlive
     * the model, and nothing may write into those weights: not for training or merging. */
    int in_place;
    /* With in_place and act8: a panel cache's store (loaders/panel_cache.h), whose W8A8 matrices
     * are read where it maps them instead of being packed again; it must outlive the model. */
    const qlm_tensor_store *panels;
    /* Each tensor's values are checked (qlm_entry_check_values) just before the build reads it. */
    int check_values;
    const qlm_backend *backend;
    /* NULL, or told after each layer (T5: block) is built: done of total (converting a large model
     * takes seconds). */
    void (*on_layer)(void *user, int done, int total);
    void *on_layer_user;
} qlm_model_options;

/* How a model built with these options stores its matrices: per-channel scales for INT8 only, the
 * block group a block dtype takes (0 for the others). */
static inline qlm_weight_format qlm_model_format(const qlm_model_options *o) {
    return (qlm_weight_format){.dtype = o->dtype,
                               .per_channel = o->dtype == QLM_I8 && o->per_channel,
                               .group = qlm_dtype_is_block(o->dtype) ? (o->group ? o->group : 32) : 0,
                               .as_stored = o->as_stored,
                               .act8 = o->act8,
                               .in_place = o->in_place,
                               .panels = o->panels,
                               .check_values = o->check_values};
}

/* The softmax scale of attention: 1/sqrt(head_dim) (or the configured query scale), times the
 * square of YaRN's attention factor (transformers scales cos and sin by it, so every score carries
 * it twice). */
static inline float qlm_llama_attn_scale(const qlm_llama_config *c) {
    float f = c->rope_attn_factor > 0 ? c->rope_attn_factor : 1.0f;
    return f * f * (c->query_scale > 0 ? c->query_scale : 1.0f / sqrtf((float)c->head_dim));
}

/* Layer l's attention: its window, scale and soft cap. */
static inline qlm_attn_shape qlm_llama_attn_shape(const qlm_llama_config *c, int l) {
    return (qlm_attn_shape){.n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                            .scale = qlm_llama_attn_scale(c), .window = qlm_layer_window(c, l),
                            .softcap = c->attn_softcap};
}

/* Dynamic NTK's table for the length of the latest call (device memory); a part of the state of
 * whoever runs forward calls, since it changes with each call's highest position. */
typedef struct {
    float *table;
    int len; /* the call length it was computed for, 0: none yet */
} qlm_rope_dynamic;

int qlm_rope_dynamic_init(qlm_rope_dynamic *d, const qlm_model *m);
void qlm_rope_dynamic_free(qlm_rope_dynamic *d, const qlm_model *m);

/* The RoPE table of a call whose highest position is max_pos, as transformers picks it per forward
 * call: longrope's long table once a position reaches rope_orig_max_pos; dynamic NTK's base
 * stretched to the call's length past max_position_embeddings (computed into d); else the
 * configured one. */
const float *qlm_llama_call_freq(const qlm_model *m, qlm_rope_dynamic *d, int max_pos);

/* Layer l's RoPE table within a call whose table is call_freq: the windowed layers' own base where
 * the model has one. */
static inline const float *qlm_llama_layer_freq(const qlm_model *m, int l, const float *call_freq) {
    return m->inv_freq_local && qlm_layer_window(&m->cfg, l) ? m->inv_freq_local : call_freq;
}

/* Builds the model from store (HF names). Converts each tensor to opts->dtype. */
int qlm_model_build(qlm_model *m, const qlm_llama_config *cfg, const qlm_tensor_store *store,
                    const qlm_model_options *opts);
void qlm_model_free(qlm_model *m);
/* Fills store with every tensor a model of this config needs, random as qlm_params_add_random
 * makes them: for measuring a model's shape without its weights. */
int qlm_model_random_store(const qlm_llama_config *cfg, uint64_t seed, qlm_tensor_store *store);
/* Bytes of weights read per decoded token (all linear weights + lm_head, no embedding table
 * unless tied), for bandwidth figures. */
size_t qlm_model_weight_bytes(const qlm_model *m);
/* Bytes of every parameter the model holds: its own buffers and what it reads where the loader
 * holds it (in_place_bytes). */
size_t qlm_model_held_bytes(const qlm_model *m);
/* Total parameter count. */
int64_t qlm_model_param_count(const qlm_model *m);
/* Writes the weights back into a store under HF names, in the model's storage dtype
 * (INT8 with scales), e.g. for `qlm quantize` and `qlm convert`. The store owns copies. */
int qlm_model_export(const qlm_model *m, qlm_tensor_store *store);

/* Every present parameter (shared ones first, then layer by layer; a tied head is not listed
 * twice), as qlm_param entries pointing at m's fields. Returns the count, or -1; *out is malloc'd. */
struct qlm_param_s;
int qlm_model_param_list(qlm_model *m, struct qlm_param_s **out);
/* The same list and the units it falls into: unit 0 the shared tensors, unit 1 + l layer l.
 * Returns the number of units; *params and *units (when units is not NULL) are malloc'd. */
int qlm_model_units(qlm_model *m, struct qlm_param_s **params, int *n_params, qlm_unit **units);
/* A model of m's shape whose every parameter is F32 in fresh zeroed buffers, one per unit (the
 * shared tensors, each layer): gradients, optimizer moments, master weights. It shares m's
 * backend and RoPE table; free it with qlm_model_twin_free. */
int qlm_model_f32_twin(qlm_model *twin, const qlm_model *m);
void qlm_model_twin_free(qlm_model *twin);

/* The KV caches and scratch activations of up to n_slots sequences decoded together. Each slot
 * holds max_seq positions of every layer's keys and values. */
typedef struct {
    int max_seq;   /* positions one slot holds */
    int n_slots;
    int max_batch; /* rows one forward call may process */
    /* Rows per slot of layer l's caches: max_seq, or for a sliding-window layer whose window leaves
     * room, window + max_batch - 1 (a step's rows plus the window before the first of them; the
     * cache rolls, position p in row p % rows). */
    int *cache_rows;
    int *ring_pos; /* [max_batch] positions modulo a rolling cache's rows, for kv_store */
    qlm_dtype kv_dtype;         /* of the caches: qlm_kv_dtype of the weights */
    void **k_cache, **v_cache;  /* per layer: [n_slots][n_kv_heads][max_seq][head_dim] (core/kv_cache.h) */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *logits_rows;
    float *hg; /* [max_batch][hidden_dim]: the GLU's product, the down projection's x */
    float *logits_dev; /* [max_batch][vocab] where the backend's memory is not host memory, else NULL */
    size_t bytes;      /* the caches' and the buffers' above, as allocated */
    qlm_lora_slots lora; /* each slot's adapter (qlm_lora_slots_set), applied unmerged */
    qlm_rope_dynamic rope;
} qlm_kv_state;

/* One sequence (one slot). */
int qlm_state_init(qlm_kv_state *s, const qlm_model *m, int max_seq, int max_batch);
int qlm_state_init_slots(qlm_kv_state *s, const qlm_model *m, int max_seq, int n_slots, int max_batch);
void qlm_state_free(qlm_kv_state *s, const qlm_model *m);
/* Copies the keys and values of positions [0, n) of slot src into slot dst (a prompt prefix that
 * another request already evaluated: every row's keys and values depend only on the tokens up to
 * it); a rolling cache gets the positions the window of position n needs. n must be what
 * qlm_state_resumable allows for src. */
int qlm_state_copy_prefix(const qlm_model *m, qlm_kv_state *s, int dst, int src, int n);
/* How much of a prefix of k positions a slot whose caches were written up to position filled can
 * resume from: k, or 0 when a rolling cache has already overwritten keys the window of position k
 * needs. */
int qlm_state_resumable(const qlm_model *m, const qlm_kv_state *s, int filled, int k);

/* Runs n tokens at positions pos[0..n) (all positions of earlier tokens must already be in the
 * cache). Writes logits for the rows listed in logit_rows (n_logit_rows of them, ascending, each
 * in [0,n)) to logits[n_logit_rows][vocab]. n may exceed max_batch: the call is split into chunks. */
int qlm_forward(const qlm_model *m, qlm_kv_state *s, const int *tokens, const int *pos, int n,
                const int *logit_rows, int n_logit_rows, float *logits);
/* The same for rows of several sequences: row i belongs to slot slots[i] (NULL: all slot 0).
 * The weights are read once for all rows, so decoding many sequences together costs little
 * more than one. */
int qlm_forward_slots(const qlm_model *m, qlm_kv_state *s, const int *tokens, const int *pos, const int *slots,
                      int n, const int *logit_rows, int n_logit_rows, float *logits);

#endif
