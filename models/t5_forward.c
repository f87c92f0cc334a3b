/* The T5 forward pass, written once against the backend op table. */
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../core/kv_cache.h"
#include "adapter.h"
#include "t5.h"

/* Host table of relative biases by delta (key - query) in [-(len-1), len-1]: [heads][2*len-1]. */
static float *bias_by_delta(const qlm_t5_model *m, const float *rel_bias, int len, int bidirectional, int *span) {
    const qlm_t5_config *c = &m->cfg;
    *span = 2 * len - 1;
    size_t table = (size_t)c->rel_buckets * c->n_heads;
    float *host = malloc((size_t)c->n_heads * *span * sizeof *host), *by_bucket = malloc(table * sizeof *by_bucket);
    float *dev = m->be->alloc((size_t)c->n_heads * *span * sizeof(float));
    if (host && by_bucket && dev) {
        m->be->to_host(by_bucket, rel_bias, table * sizeof *by_bucket);
        for (int d = -(len - 1); d <= len - 1; d++) {
            int bucket = qlm_t5_rel_bucket(d, bidirectional, c->rel_buckets, c->rel_max_distance);
            for (int h = 0; h < c->n_heads; h++) host[(size_t)h * *span + d + len - 1] = by_bucket[bucket * c->n_heads + h];
        }
        m->be->to_device(dev, host, (size_t)c->n_heads * *span * sizeof(float));
    } else if (dev) {
        m->be->free(dev);
        dev = NULL;
    }
    free(host);
    free(by_bucket);
    return dev;
}

int qlm_t5_state_init(qlm_t5_state *s, const qlm_t5_model *m, int max_src, int max_tgt, int n_slots) {
    const qlm_t5_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    memset(s, 0, sizeof *s);
    if (max_src <= 0 || max_tgt <= 0 || n_slots <= 0) return qlm_errorf("input, output and slot counts must be positive");
    s->max_src = max_src;
    s->max_tgt = max_tgt;
    s->n_slots = n_slots;
    s->rows = max_src > max_tgt ? max_src : max_tgt;
    if (n_slots > s->rows) s->rows = n_slots;
    size_t R = (size_t)s->rows, d = (size_t)c->d_model, inner = (size_t)c->n_heads * c->d_kv, nd = (size_t)c->n_dec_layers;
    s->cross_k = calloc(nd, sizeof *s->cross_k);
    s->cross_v = calloc(nd, sizeof *s->cross_v);
    s->k_cache = calloc(nd, sizeof *s->k_cache);
    s->v_cache = calloc(nd, sizeof *s->v_cache);
    s->pos = malloc(R * sizeof *s->pos);
    s->n_src = calloc((size_t)n_slots, sizeof *s->n_src);
    if (!s->n_src || !s->cross_k || !s->cross_v || !s->k_cache || !s->v_cache || !s->pos) goto oom;
    s->kv_dtype = qlm_kv_dtype(m->fmt.dtype, m->be);
    size_t esize = qlm_kv_elem_size(s->kv_dtype);
    for (size_t l = 0; l < nd; l++) {
        s->cross_k[l] = be->alloc((size_t)n_slots * max_src * inner * esize);
        s->cross_v[l] = be->alloc((size_t)n_slots * max_src * inner * esize);
        s->k_cache[l] = be->alloc((size_t)n_slots * max_tgt * inner * esize);
        s->v_cache[l] = be->alloc((size_t)n_slots * max_tgt * inner * esize);
        if (!s->cross_k[l] || !s->cross_v[l] || !s->k_cache[l] || !s->v_cache[l]) goto oom;
    }
    size_t xb = d > inner ? d : inner;
    s->enc_out = be->alloc((size_t)max_src * d * sizeof(float));
    s->x = be->alloc(R * d * sizeof(float));
    s->xb = be->alloc(R * xb * sizeof(float));
    s->q = be->alloc(R * inner * sizeof(float));
    s->k = be->alloc(R * inner * sizeof(float));
    s->v = be->alloc(R * inner * sizeof(float));
    s->att = be->alloc(R * inner * sizeof(float));
    s->hb = be->alloc(R * c->d_ff * sizeof(float));
    s->hb2 = be->alloc(R * c->d_ff * sizeof(float));
    s->hg = be->alloc(R * c->d_ff * sizeof(float));
    s->enc_bias = bias_by_delta(m, m->enc_rel_bias, max_src, 1, &s->enc_span);
    s->dec_bias = bias_by_delta(m, m->dec_rel_bias, max_tgt, 0, &s->dec_span);
    if (!s->enc_out || !s->x || !s->xb || !s->q || !s->k || !s->v || !s->att || !s->hb || !s->hb2 || !s->hg ||
        !s->enc_bias || !s->dec_bias)
        goto oom;
    if (!be->host_memory && !(s->logits_dev = be->alloc(R * c->vocab_size * sizeof(float)))) goto oom;
    if (qlm_lora_slots_init(&s->lora, n_slots, s->rows) != 0) goto oom;
    for (int i = 0; i < s->rows; i++) s->pos[i] = i;
    return 0;
oom:
    qlm_t5_state_free(s, m);
    return qlm_errorf("out of memory for a T5 state of %d x (%d input + %d output) tokens", n_slots, max_src, max_tgt);
}

void qlm_t5_state_free(qlm_t5_state *s, const qlm_t5_model *m) {
    const qlm_backend *be = m->be;
    void **per_layer[] = {s->cross_k, s->cross_v, s->k_cache, s->v_cache};
    for (size_t i = 0; i < 4; i++) {
        for (int l = 0; per_layer[i] && l < m->cfg.n_dec_layers; l++) be->free(per_layer[i][l]);
        free(per_layer[i]);
    }
    float *bufs[] = {s->enc_out, s->x, s->xb, s->q, s->k, s->v, s->att, s->hb, s->hb2, s->hg, s->enc_bias, s->dec_bias,
                     s->logits_dev};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(bufs[i]);
    free(s->pos);
    free(s->n_src);
    qlm_lora_slots_free(&s->lora);
    memset(s, 0, sizeof *s);
}

static qlm_attn_shape attn_shape(const qlm_t5_model *m, int n_keys, const float *bias, int span, int offset) {
    return (qlm_attn_shape){.n_heads = m->cfg.n_heads, .n_kv_heads = m->cfg.n_heads, .head_dim = m->cfg.d_kv,
                            .scale = 1.0f, .n_keys = n_keys, .pos_bias = bias, .pos_bias_span = span,
                            .pos_bias_offset = offset};
}

/* A projection with each row's LoRA update: rows in slots[i] (or all in `slot`), the stack's layer l;
 * the same for several projections of one x, given or made by a step; and a sub-block's last
 * product, which adds its output to the residual stream x as it is made. */
#define PROJ_GROUP(outs, targets, count, x, step, kv) \
    qlm_matmul_lora_group(be, &s->lora, outs, targets, count, x, step, kv, n, slots, slot, stack, l)
#define PROJ_ADD(in, step, w, target) \
    qlm_matmul_lora_group(be, &s->lora, &(qlm_matmul_out){s->x, w, NULL, 1}, &(int){target}, 1, in, step, NULL, n, \
                          slots, slot, stack, l)

/* A norm of in into out, run inside the products after it (step_matmul_group). */
static qlm_x_step norm_step(const qlm_t5_model *m, float *out, const float *in, const float *weight) {
    return (qlm_x_step){.kind = QLM_X_RMSNORM, .x = out, .a = in, .weight = weight, .eps = m->cfg.norm_eps};
}

/* q, k and v of layer L's self-attention, of its norm of x, and k and v into the caches after
 * them (kv; NULL: not kept, the encoder's). */
static int qkv_forward(const qlm_t5_model *m, const qlm_t5_layer *L, qlm_t5_state *s, int n, const int *slots,
                       int slot, int stack, int l, const qlm_kv_step *kv) {
    const qlm_backend *be = m->be;
    const qlm_matmul_out outs[] = {{s->q, &L->q, NULL, 0}, {s->k, &L->k, NULL, 0}, {s->v, &L->v, NULL, 0}};
    static const int targets[] = {QLM_LORA_Q, QLM_LORA_K, QLM_LORA_V};
    const qlm_x_step norm = norm_step(m, s->xb, s->x, L->attn_norm);
    return PROJ_GROUP(outs, targets, 3, NULL, &norm, kv);
}

/* The feed-forward sub-block: its norm inside wi's products, the activation (of the gate, times
 * wi1's product when gated) inside wo's, which adds to x. */
static int ffn_forward(const qlm_t5_model *m, const qlm_t5_layer *L, qlm_t5_state *s, int n, const int *slots,
                       int slot, int stack, int l) {
    const qlm_t5_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    const qlm_matmul_out wi[] = {{s->hb, &L->wi0, NULL, 0}, {s->hb2, &L->wi1, NULL, 0}};
    static const int wi_targets[] = {QLM_LORA_WI0, QLM_LORA_WI1};
    const qlm_x_step norm = norm_step(m, s->xb, s->x, L->ffn_norm);
    if (PROJ_GROUP(wi, wi_targets, c->gated ? 2 : 1, NULL, &norm, NULL)) return -1;
    const qlm_x_step act = {.kind = QLM_X_GLU, .x = s->hg, .a = s->hb, .b = c->gated ? s->hb2 : NULL,
                            .act = (qlm_act)c->act};
    return PROJ_ADD(NULL, &act, &L->wo, QLM_LORA_WO);
}

int qlm_t5_encode(const qlm_t5_model *m, qlm_t5_state *s, int slot, const int *ids, int n) {
    const qlm_t5_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    const int *slots = NULL;
    if (slot < 0 || slot >= s->n_slots) return qlm_errorf("slot %d out of range (0..%d)", slot, s->n_slots - 1);
    if (n <= 0 || n > s->max_src) return qlm_errorf("input of %d tokens does not fit (1..%d)", n, s->max_src);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return qlm_errorf("token id %d is outside the vocabulary (0..%d)", ids[i], c->vocab_size - 1);
    s->n_src[slot] = 0;
    qlm_attn_shape self = attn_shape(m, n, s->enc_bias, s->enc_span, s->max_src - 1);
    be->embedding(s->x, &m->shared, ids, n);
    int stack = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const qlm_t5_layer *L = &m->enc[l];
        if (qkv_forward(m, L, s, n, slots, slot, stack, l, NULL) != 0) return -1;
        be->attention(s->att, s->q, s->k, s->v, n, s->pos, &self);
        if (PROJ_ADD(s->att, NULL, &L->o, QLM_LORA_O)) return -1;
        if (ffn_forward(m, L, s, n, slots, slot, stack, l) != 0) return -1;
    }
    be->rmsnorm(s->enc_out, s->x, m->enc_final_norm, n, c->d_model, c->norm_eps);
    stack = 1; /* the cross-attention keys and values are the decoder's projections */
    for (int l = 0; l < c->n_dec_layers; l++) {
        const qlm_matmul_out kv[] = {{s->k, &m->dec[l].ck, NULL, 0}, {s->v, &m->dec[l].cv, NULL, 0}};
        static const int kv_targets[] = {QLM_LORA_CROSS_K, QLM_LORA_CROSS_V};
        if (PROJ_GROUP(kv, kv_targets, 2, s->enc_out, NULL, NULL)) return -1;
        /* Into the slot's region as slot 0 of caches with n positions a head: its heads packed back
         * to back (qlm_attn_shape.heads_packed). */
        size_t at = (size_t)slot * c->n_heads * s->max_src * c->d_kv * qlm_kv_elem_size(s->kv_dtype);
        be->kv_store((char *)s->cross_k[l] + at, (char *)s->cross_v[l] + at, s->kv_dtype, s->k, s->v, n, NULL, 0, s->pos,
                     c->n_heads, c->d_kv, n);
    }
    s->n_src[slot] = n;
    return 0;
}

/* Attention of rows [0, n), each over its slot's keys and values (caches of slot_rows positions a
 * slot, laid out as core/kv_cache.h says). */
static void slot_attention(const qlm_t5_model *m, qlm_t5_state *s, void **k, void **v, int l, int slot_rows,
                           const int *pos, const int *slots, int n, int cross) {
    qlm_attn_shape sh = cross ? attn_shape(m, slots ? s->max_src : s->n_src[0], NULL, 0, 0)
                              : attn_shape(m, 0, s->dec_bias, s->dec_span, s->max_tgt - 1);
    qlm_kv_shape(&sh, slot_rows, s->kv_dtype);
    sh.heads_packed = cross;
    if (slots) {
        sh.slots = slots;
        sh.slot_keys = cross ? s->n_src : NULL;
    }
    m->be->attention(s->att, s->q, k[l], v[l], n, pos, &sh);
}

/* One chunk of at most s->rows decoder tokens. */
static int decode_chunk(const qlm_t5_model *m, qlm_t5_state *s, const int *tokens, const int *pos, const int *slots,
                        int n, const int *rows, int n_rows, float *logits) {
    const qlm_t5_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    const int slot = 0, stack = 1;
    be->embedding(s->x, &m->shared, tokens, n);
    for (int l = 0; l < c->n_dec_layers; l++) {
        const qlm_t5_layer *L = &m->dec[l];
        const qlm_kv_step kv = {.pos = pos, .n_heads = c->n_heads, .n_kv_heads = c->n_heads, .head_dim = c->d_kv,
                                .k_cache = s->k_cache[l], .v_cache = s->v_cache[l], .kv = s->kv_dtype,
                                .slots = slots, .store_pos = pos, .max_pos = s->max_tgt};
        if (qkv_forward(m, L, s, n, slots, slot, stack, l, &kv) != 0) return -1;
        slot_attention(m, s, s->k_cache, s->v_cache, l, s->max_tgt, pos, slots, n, 0);
        if (PROJ_ADD(s->att, NULL, &L->o, QLM_LORA_O)) return -1;

        const qlm_x_step cross_norm = norm_step(m, s->xb, s->x, L->cross_norm);
        const qlm_matmul_out cq = {s->q, &L->cq, NULL, 0};
        if (PROJ_GROUP(&cq, &(int){QLM_LORA_CROSS_Q}, 1, NULL, &cross_norm, NULL)) return -1;
        slot_attention(m, s, s->cross_k, s->cross_v, l, s->max_src, pos, slots, n, 1);
        if (PROJ_ADD(s->att, NULL, &L->co, QLM_LORA_CROSS_O)) return -1;

        if (ffn_forward(m, L, s, n, slots, slot, stack, l) != 0) return -1;
    }
    if (n_rows == 0) return 0;
    for (int r = 0; r < n_rows; r++)
        be->copy(s->xb + (size_t)r * c->d_model, s->x + (size_t)rows[r] * c->d_model, c->d_model);
    /* The head's norm inside its products, into x: the residual stream's last use was the copy. */
    const qlm_x_step norm = norm_step(m, s->x, s->xb, m->head_norm);
    return qlm_logits_out(be, logits, s->logits_dev, &norm, n_rows, &m->lm_head);
}

#undef PROJ_GROUP
#undef PROJ_ADD

int qlm_t5_decode(const qlm_t5_model *m, qlm_t5_state *s, const int *tokens, const int *pos, const int *slots,
                  int n, const int *logit_rows, int n_logit_rows, float *logits) {
    const qlm_t5_config *c = &m->cfg;
    for (int i = 0; i < n; i++) {
        int slot = slots ? slots[i] : 0;
        if (slot < 0 || slot >= s->n_slots) return qlm_errorf("slot %d out of range (0..%d)", slot, s->n_slots - 1);
        if (s->n_src[slot] <= 0) return qlm_errorf("T5: decode before encode (slot %d)", slot);
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return qlm_errorf("token id %d is outside the vocabulary (0..%d)", tokens[i], c->vocab_size - 1);
        if (pos[i] < 0 || pos[i] >= s->max_tgt)
            return qlm_errorf("output position %d is outside the output window (%d tokens)", pos[i], s->max_tgt);
    }
    for (int r = 0; r < n_logit_rows; r++)
        if (logit_rows[r] < 0 || logit_rows[r] >= n || (r > 0 && logit_rows[r] <= logit_rows[r - 1]))
            return qlm_errorf("logit rows must be ascending and within 0..%d", n - 1);
    int *chunk_rows = malloc((size_t)(n_logit_rows ? n_logit_rows : 1) * sizeof *chunk_rows);
    if (!chunk_rows) return qlm_errorf("out of memory");
    int done = 0;
    for (int start = 0; start < n; start += s->rows) {
        int len = n - start < s->rows ? n - start : s->rows, k = 0;
        for (int r = 0; r < n_logit_rows; r++)
            if (logit_rows[r] >= start && logit_rows[r] < start + len) chunk_rows[k++] = logit_rows[r] - start;
        if (decode_chunk(m, s, tokens + start, pos + start, slots ? slots + start : NULL, len, chunk_rows, k,
                         logits + (size_t)done * c->vocab_size) != 0) {
            free(chunk_rows);
            return -1;
        }
        done += k;
    }
    free(chunk_rows);
    return 0;
}
