/* A T5 encoder-decoder (T5, T5 v1.1, FLAN-T5) built from a tensor store with Hugging Face
 * names, written against the same op table as the Llama family: RMS layer norms without
 * bias, relative-position attention biases (computed by the first block of each stack and
 * shared by the others), no 1/sqrt(d) attention scaling, a ReLU or gated-GELU feed-forward.
 * The encoder runs once per input; the decoder keeps a self-attention KV cache and the
 * cross-attention keys/values of the encoder output, computed once per input. */
#ifndef QLM_T5_H
#define QLM_T5_H

#include <stdint.h>

#include "../core/tensor_store.h"
#include "../core/backend.h"
#include "config.h"
#include "model.h"
#include "../core/weight.h"

typedef struct {
    float *attn_norm;         /* before self-attention */
    qlm_weight q, k, v, o;
    float *cross_norm;        /* decoder only: before cross-attention */
    qlm_weight cq, ck, cv, co;
    float *ffn_norm;
    qlm_weight wi0, wi1, wo;  /* wi1 only when gated ("wi" of original T5 is wi0) */
    void *buffer;
    size_t buffer_bytes;
} qlm_t5_layer;

typedef struct {
    qlm_t5_config cfg;
    qlm_weight_format fmt; /* how the matrices are stored (qlm_model_format of the options) */
    size_t in_place_bytes; /* of the matrices read where the store holds them */
    const qlm_backend *be;
    qlm_weight shared;    /* token embedding of both stacks */
    qlm_weight lm_head;   /* the shared embedding when tied */
    qlm_weight_view head_view; /* lm_head as the view of shared a sharded run refreshes (tied) */
    float *enc_final_norm, *dec_final_norm;
    float *head_norm;     /* dec_final_norm, times d_model^-0.5 when tied */
    float *enc_rel_bias, *dec_rel_bias; /* [buckets][heads] */
    qlm_t5_layer *enc, *dec;
    void *shared_buffer;
    size_t shared_bytes;
    /* Set by a sharded run: unit 0 (shared), 1 + b (encoder block b), 1 + n_layers + b (decoder
     * block b) are gathered around their use. */
    const qlm_unit_hooks *hooks;
} qlm_t5_model;

int qlm_t5_build(qlm_t5_model *m, const qlm_t5_config *cfg, const qlm_tensor_store *store,
                 const qlm_model_options *opts);
void qlm_t5_free(qlm_t5_model *m);
int64_t qlm_t5_param_count(const qlm_t5_model *m);
/* Bytes of every parameter the model holds: its own buffers and what it reads where the loader
 * holds it (in_place_bytes). */
size_t qlm_t5_held_bytes(const qlm_t5_model *m);
/* Bytes of weights one decoder step reads (decoder layers and the head). */
size_t qlm_t5_decoder_weight_bytes(const qlm_t5_model *m);
/* Writes the weights back under HF names in the storage dtype (for `qlm quantize`). */
int qlm_t5_export(const qlm_t5_model *m, qlm_tensor_store *store);

/* Every parameter (shared ones, then the encoder's and the decoder's blocks), as qlm_param entries
 * pointing at m's fields: count, or -1; *out is malloc'd. */
struct qlm_param_s;
int qlm_t5_param_list(qlm_t5_model *m, struct qlm_param_s **out);
/* The same list and its units (unit 0 shared, then the encoder's blocks, then the decoder's):
 * the number of units; *params and *units (when not NULL) are malloc'd. */
int qlm_t5_units(qlm_t5_model *m, struct qlm_param_s **params, int *n_params, qlm_unit **units);
/* m's shape with every parameter F32 in fresh zeroed per-unit buffers (gradients, moments). */
int qlm_t5_f32_twin(qlm_t5_model *twin, const qlm_t5_model *m);
void qlm_t5_twin_free(qlm_t5_model *twin);
/* Recomputes head_norm from dec_final_norm (after training changed it). */
void qlm_t5_refresh_head_norm(qlm_t5_model *m);

/* Fills store with every tensor a T5 of this config needs, random as qlm_params_add_random makes
 * them: for measuring a model's shape without its weights (e.g. flan-t5-base's config.json alone). */
int qlm_t5_random_store(const qlm_t5_config *cfg, uint64_t seed, qlm_tensor_store *store);

/* T5's bucket of a relative position (key position - query position). */
int qlm_t5_rel_bucket(int rel, int bidirectional, int n_buckets, int max_distance);

/* The state of up to n_slots inputs decoded together: per slot its encoder output's
 * cross-attention K/V and its decoder KV cache; scratch shared by all. */
typedef struct {
    int max_src, max_tgt, n_slots;
    int *n_src;                   /* per slot: encoded input length (0: none yet) */
    float *enc_out;               /* [max_src][d_model] of the last encoded input */
    qlm_dtype kv_dtype;           /* of the caches and cross_k/cross_v: qlm_kv_dtype of the weights */
    void **cross_k, **cross_v;    /* per decoder layer: room for [n_slots][heads][max_src][d_kv], a slot's
                                   * heads packed as [heads][n_src][d_kv] (qlm_attn_shape.heads_packed) */
    void **k_cache, **v_cache;    /* per decoder layer: [n_slots][heads][max_tgt][d_kv] (core/kv_cache.h) */
    float *enc_bias, *dec_bias;   /* relative biases by delta: [heads][span] */
    int enc_span, dec_span;
    int rows;                     /* scratch rows: max(max_src, max_tgt, n_slots) */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2;
    float *hg;                    /* [rows][d_ff]: the feed-forward's activation, wo's x */
    float *logits_dev; /* [rows][vocab] where the backend's memory is not host memory, else NULL */
    int *pos;                     /* host positions 0..rows-1 for the encoder */
    qlm_lora_slots lora;          /* each slot's adapter (qlm_lora_slots_set), applied unmerged */
} qlm_t5_state;

int qlm_t5_state_init(qlm_t5_state *s, const qlm_t5_model *m, int max_src, int max_tgt, int n_slots);
void qlm_t5_state_free(qlm_t5_state *s, const qlm_t5_model *m);

/* Runs the encoder over ids[0..n) and computes every decoder layer's cross-attention K/V for
 * slot; the slot's decoder starts over. */
int qlm_t5_encode(const qlm_t5_model *m, qlm_t5_state *s, int slot, const int *ids, int n);

/* Runs n decoder tokens at positions pos[0..n), row i in slot slots[i] (NULL: all slot 0;
 * earlier positions already cached), and writes the logits of the listed rows (ascending), as
 * qlm_forward_slots does for decoder-only models. */
int qlm_t5_decode(const qlm_t5_model *m, qlm_t5_state *s, const int *tokens, const int *pos, const int *slots,
                  int n, const int *logit_rows, int n_logit_rows, float *logits);

#endif
