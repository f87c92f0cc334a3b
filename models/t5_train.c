/* The T5 training pass: encoder blocks, decoder blocks with cross-attention, the head and loss,
 * then each block's backward in reverse, the decoder's cross-attention gradients gathered into
 * the encoder output's gradient before the encoder runs backward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "t5_train.h"
#include "train_layers.h"

static void trace_free(const qlm_backend *be, qlm_t5_trace *t) {
    float *bufs[] = {t->xn1, t->q, t->k, t->v, t->att, t->x_mid, t->xnc, t->cq, t->ck,
                     t->cv, t->catt, t->x_mid2, t->xn2, t->h0, t->h1, t->h};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(bufs[i]);
    for (int i = 0; i <= QLM_LORA_WO; i++) be->free(t->lora_u[i]);
}

static int trace_init(const qlm_backend *be, const qlm_t5_config *c, int rows, int src_rows, int decoder, int rank,
                      qlm_t5_trace *t, double *bytes) {
    size_t d = (size_t)c->d_model, inner = (size_t)c->n_heads * c->d_kv, ff = (size_t)c->d_ff;
    struct {
        float **p;
        size_t n;
        int want;
    } b[] = {{&t->xn1, rows * d, 1},          {&t->q, rows * inner, 1},        {&t->k, rows * inner, 1},
             {&t->v, rows * inner, 1},        {&t->att, rows * inner, 1},      {&t->x_mid, rows * d, 1},
             {&t->xnc, rows * d, decoder},    {&t->cq, rows * inner, decoder}, {&t->ck, src_rows * inner, decoder},
             {&t->cv, src_rows * inner, decoder}, {&t->catt, rows * inner, decoder}, {&t->x_mid2, rows * d, decoder},
             {&t->xn2, rows * d, 1},          {&t->h0, rows * ff, 1},          {&t->h1, rows * ff, c->gated},
             {&t->h, rows * ff, 1}};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        if (!b[i].want) continue;
        *b[i].p = be->alloc(b[i].n * sizeof(float));
        if (!*b[i].p) return -1;
        *bytes += (double)b[i].n * sizeof(float);
    }
    int r = rows > src_rows ? rows : src_rows;
    for (int i = 0; i <= QLM_LORA_WO && rank > 0; i++) {
        t->lora_u[i] = be->alloc((size_t)r * rank * sizeof(float));
        if (!t->lora_u[i]) return -1;
        *bytes += (double)r * rank * sizeof(float);
    }
    return 0;
}

static float **alloc_inputs(const qlm_backend *be, int n, size_t floats, double *bytes) {
    float **x = calloc((size_t)n, sizeof *x);
    for (int i = 0; x && i < n; i++) {
        x[i] = be->alloc(floats * sizeof(float));
        if (!x[i]) return x; /* freed by the caller's cleanup */
        *bytes += (double)floats * sizeof(float);
    }
    return x;
}

static int inputs_ok(float **x, int n) {
    for (int i = 0; x && i < n; i++)
        if (!x[i]) return 0;
    return x != NULL;
}

int qlm_t5_train_state_init(qlm_t5_train_state *s, const qlm_t5_model *m, int max_src, int max_tgt, int max_len,
                            int recompute, int lora_rank) {
    const qlm_t5_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    memset(s, 0, sizeof *s);
    if (max_src <= 0 || max_tgt <= 0 || max_len <= 0) return qlm_errorf("a training batch needs input and output rows");
    s->max_src = max_src, s->max_tgt = max_tgt, s->max_len = max_len;
    s->recompute = recompute, s->lora_rank = lora_rank;
    s->n_enc_tr = recompute ? 1 : c->n_layers;
    s->n_dec_tr = recompute ? 1 : c->n_dec_layers;
    size_t R = (size_t)(max_src > max_tgt ? max_src : max_tgt), d = (size_t)c->d_model;
    size_t inner = (size_t)c->n_heads * c->d_kv, ff = (size_t)c->d_ff;
    size_t wide = ff > inner ? ff : inner;
    if (d > wide) wide = d;
    s->span = 2 * max_len - 1;
    s->enc_x = alloc_inputs(be, c->n_layers + 1, (size_t)max_src * d, &s->peak_bytes);
    s->dec_x = alloc_inputs(be, c->n_dec_layers + 1, (size_t)max_tgt * d, &s->peak_bytes);
    s->enc_tr = calloc((size_t)s->n_enc_tr, sizeof *s->enc_tr);
    s->dec_tr = calloc((size_t)s->n_dec_tr, sizeof *s->dec_tr);
    s->iota = malloc((size_t)max_len * sizeof *s->iota);
    s->bias_host = malloc(((size_t)c->n_heads * s->span + (size_t)c->rel_buckets * c->n_heads) * sizeof *s->bias_host);
    s->head_rows = malloc(QLM_HEAD_CHUNK * sizeof *s->head_rows);
    s->head_targets = malloc(QLM_HEAD_CHUNK * sizeof *s->head_targets);
    s->head_losses = malloc(R * sizeof *s->head_losses);
    if (!inputs_ok(s->enc_x, c->n_layers + 1) || !inputs_ok(s->dec_x, c->n_dec_layers + 1) || !s->enc_tr ||
        !s->dec_tr || !s->iota || !s->bias_host || !s->head_rows || !s->head_targets || !s->head_losses)
        goto oom;
    for (int i = 0; i < max_len; i++) s->iota[i] = i;
    for (int t = 0; t < s->n_enc_tr; t++)
        if (trace_init(be, c, max_src, 0, 0, lora_rank, &s->enc_tr[t], &s->peak_bytes) != 0) goto oom;
    for (int t = 0; t < s->n_dec_tr; t++)
        if (trace_init(be, c, max_tgt, max_src, 1, lora_rank, &s->dec_tr[t], &s->peak_bytes) != 0) goto oom;
    size_t table = (size_t)c->n_heads * s->span;
    struct {
        float **p;
        size_t n;
    } b[] = {{&s->enc_out, (size_t)max_src * d}, {&s->d_enc_out, (size_t)max_src * d}, {&s->dx, R * d},
             {&s->dxn, R * d},        {&s->dq, R * inner},      {&s->dk, R * inner},      {&s->dv, R * inner},
             {&s->datt, R * inner},   {&s->dh0, R * ff},        {&s->dh1, R * ff},        {&s->tmp, R * wide},
             {&s->tmp_in, R * wide},  {&s->lora_du, R * (lora_rank ? lora_rank : 1)}, {&s->d_head_norm, d},
             {&s->enc_bias, table},   {&s->dec_bias, table},    {&s->d_enc_bias, table},  {&s->d_dec_bias, table},
             {&s->head_x, QLM_HEAD_CHUNK * d}, {&s->head_xn, QLM_HEAD_CHUNK * d},
             {&s->logits, (size_t)QLM_HEAD_CHUNK * c->vocab_size}, {&s->row_loss, R}};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        *b[i].p = be->alloc(b[i].n * sizeof(float));
        if (!*b[i].p) goto oom;
        s->peak_bytes += (double)b[i].n * sizeof(float);
    }
    return 0;
oom:;
    double want = s->peak_bytes;
    qlm_t5_train_state_free(s, m);
    return qlm_errorf("out of memory for T5 training activations (%.1f MiB allocated so far)", want / 1048576.0);
}

void qlm_t5_train_state_free(qlm_t5_train_state *s, const qlm_t5_model *m) {
    const qlm_backend *be = m->be;
    for (int l = 0; s->enc_x && l <= m->cfg.n_layers; l++) be->free(s->enc_x[l]);
    for (int l = 0; s->dec_x && l <= m->cfg.n_dec_layers; l++) be->free(s->dec_x[l]);
    free(s->enc_x);
    free(s->dec_x);
    for (int t = 0; s->enc_tr && t < s->n_enc_tr; t++) trace_free(be, &s->enc_tr[t]);
    for (int t = 0; s->dec_tr && t < s->n_dec_tr; t++) trace_free(be, &s->dec_tr[t]);
    free(s->enc_tr);
    free(s->dec_tr);
    float *bufs[] = {s->enc_out, s->d_enc_out, s->dx,       s->dxn,        s->dq,         s->dk,      s->dv,
                     s->datt,    s->dh0,       s->dh1,      s->tmp,        s->tmp_in,     s->lora_du, s->d_head_norm,
                     s->enc_bias, s->dec_bias, s->d_enc_bias, s->d_dec_bias, s->head_x,   s->head_xn, s->logits,
                     s->row_loss};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(bufs[i]);
    free(s->iota);
    free(s->bias_host);
    free(s->head_rows);
    free(s->head_targets);
    free(s->head_losses);
    memset(s, 0, sizeof *s);
}

typedef struct {
    const qlm_t5_model *m;
    const qlm_t5_model *g;
    const qlm_lora_train *lora;
    qlm_t5_train_state *s;
    const qlm_train_batch *b;
    qlm_train_linear lin;
} pass;

/* The bias tables by key - query distance from the [buckets][heads] parameters, and back. */
static void bias_tables(const pass *p, int to_tables) {
    const qlm_t5_config *c = &p->m->cfg;
    qlm_t5_train_state *s = p->s;
    size_t table = (size_t)c->n_heads * s->span, rel = (size_t)c->rel_buckets * c->n_heads;
    float *host = s->bias_host, *rel_host = host + table;
    for (int dec = 0; dec < 2; dec++) {
        const float *rel_dev = dec ? p->m->dec_rel_bias : p->m->enc_rel_bias;
        float *tab_dev = dec ? s->dec_bias : s->enc_bias, *dtab_dev = dec ? s->d_dec_bias : s->d_enc_bias;
        float *grad_dev = p->g ? (dec ? p->g->dec_rel_bias : p->g->enc_rel_bias) : NULL;
        if (to_tables) p->m->be->to_host(rel_host, rel_dev, rel * sizeof *rel_host);
        else if (grad_dev) {
            p->m->be->to_host(host, dtab_dev, table * sizeof *host);
            p->m->be->to_host(rel_host, grad_dev, rel * sizeof *rel_host);
        } else {
            continue;
        }
        for (int delta = -(s->max_len - 1); delta <= s->max_len - 1; delta++) {
            int bucket = qlm_t5_rel_bucket(delta, !dec, c->rel_buckets, c->rel_max_distance);
            for (int h = 0; h < c->n_heads; h++) {
                size_t at = (size_t)h * s->span + delta + s->max_len - 1;
                if (to_tables) host[at] = rel_host[bucket * c->n_heads + h];
                else rel_host[bucket * c->n_heads + h] += host[at];
            }
        }
        if (to_tables) p->m->be->to_device(tab_dev, host, table * sizeof *host);
        else p->m->be->to_device(grad_dev, rel_host, rel * sizeof *rel_host);
    }
}

static const qlm_lora_module *module(const pass *p, int stack, int l, int target) {
    return p->lora ? qlm_lora_find(p->lora->adapter, stack, l, (qlm_lora_target)target) : NULL;
}

/* The first row of a projection's input in the step's whole micro-batch: the encoder's and the
 * cross-attention keys' and values' inputs are input rows, the others decoder rows. */
static long input_row0(const pass *p, int stack, int target) {
    int src = stack == 0 || target == QLM_LORA_CROSS_K || target == QLM_LORA_CROSS_V;
    return src ? p->b->src_row0 : p->b->row0;
}

static void lin_fwd(const pass *p, qlm_t5_trace *t, float *y, const float *x, int n, const qlm_weight *w, int stack,
                    int l, int target) {
    qlm_train_linear_forward(&p->lin, y, x, n, w, NULL, module(p, stack, l, target), t->lora_u[target],
                             input_row0(p, stack, target));
}

static int lin_bwd(const pass *p, qlm_t5_trace *t, float *dx, int accumulate, const float *dy, const float *x, int n,
                   const qlm_weight *w, const qlm_weight *gw, int stack, int l, int target) {
    return qlm_train_linear_backward(&p->lin, dx, accumulate, dy, x, n, w, gw, NULL, module(p, stack, l, target),
                                     t->lora_u[target], input_row0(p, stack, target));
}

static qlm_attn_shape shape(const qlm_t5_config *c, int n_keys, const float *bias, const qlm_t5_train_state *s) {
    return (qlm_attn_shape){.n_heads = c->n_heads, .n_kv_heads = c->n_heads, .head_dim = c->d_kv, .scale = 1.0f,
                            .n_keys = n_keys, .pos_bias = bias, .pos_bias_span = bias ? s->span : 0,
                            .pos_bias_offset = bias ? s->max_len - 1 : 0};
}

/* Attention of every sequence: queries in rows start/len, keys in rows kstart/klen (cross), or the
 * same rows (self: causal in the decoder, bidirectional in the encoder). */
static void attend(const pass *p, float *out, const float *q, const float *k, const float *v, const int *start,
                   const int *len, const int *kstart, const int *klen, int causal, const float *bias) {
    const qlm_t5_config *c = &p->m->cfg;
    size_t inner = (size_t)c->n_heads * c->d_kv;
    for (int i = 0; i < p->b->n_seq; i++) {
        qlm_attn_shape sh = shape(c, causal ? 0 : klen[i], bias, p->s);
        size_t r = (size_t)start[i], kr = (size_t)kstart[i];
        p->m->be->attention(out + r * inner, q + r * inner, k + kr * inner, v + kr * inner, len[i], p->s->iota, &sh);
    }
}

static int attend_backward(const pass *p, float *dq, float *dk, float *dv, float *dbias, const float *dout,
                           const float *q, const float *k, const float *v, const int *start, const int *len,
                           const int *kstart, const int *klen, int causal, const float *bias) {
    const qlm_t5_config *c = &p->m->cfg;
    size_t inner = (size_t)c->n_heads * c->d_kv;
    for (int i = 0; i < p->b->n_seq; i++) {
        qlm_attn_shape sh = shape(c, causal ? 0 : klen[i], bias, p->s);
        size_t r = (size_t)start[i], kr = (size_t)kstart[i];
        if (p->m->be->attention_backward(dq + r * inner, dk + kr * inner, dv + kr * inner, dbias, dout + r * inner,
                                         q + r * inner, k + kr * inner, v + kr * inner, len[i], p->s->iota, &sh) != 0)
            return -1;
    }
    return 0;
}

static void ffn_forward(const pass *p, const qlm_t5_layer *L, qlm_t5_trace *t, const float *x, float *x_out, int n,
                        int stack, int l) {
    const qlm_t5_config *c = &p->m->cfg;
    const qlm_backend *be = p->m->be;
    be->rmsnorm(t->xn2, x, L->ffn_norm, n, c->d_model, c->norm_eps);
    lin_fwd(p, t, t->h0, t->xn2, n, &L->wi0, stack, l, QLM_LORA_WI0);
    if (c->gated) {
        lin_fwd(p, t, t->h1, t->xn2, n, &L->wi1, stack, l, QLM_LORA_WI1);
        be->glu(t->h, t->h0, t->h1, (long)n * c->d_ff, (qlm_act)c->act);
    } else {
        be->copy(t->h, t->h0, (long)n * c->d_ff);
        be->activate(t->h, (long)n * c->d_ff, (qlm_act)c->act);
    }
    lin_fwd(p, t, p->s->dxn, t->h, n, &L->wo, stack, l, QLM_LORA_WO);
    be->copy(x_out, x, (long)n * c->d_model);
    be->add(x_out, p->s->dxn, (long)n * c->d_model);
}

/* s->dx: the gradient of the block's output; on return, of the feed-forward's input x. */
static int ffn_backward(const pass *p, const qlm_t5_layer *L, const qlm_t5_layer *G, qlm_t5_trace *t, const float *x,
                        int n, int stack, int l) {
    const qlm_t5_config *c = &p->m->cfg;
    const qlm_backend *be = p->m->be;
    qlm_t5_train_state *s = p->s;
    long nf = (long)n * c->d_ff;
    if (lin_bwd(p, t, s->tmp, 0, s->dx, t->h, n, &L->wo, G ? &G->wo : NULL, stack, l, QLM_LORA_WO) != 0) return -1;
    if (c->gated) be->glu_backward(s->dh0, s->dh1, s->tmp, t->h0, t->h1, nf, (qlm_act)c->act);
    else be->activate_backward(s->dh0, s->tmp, t->h0, nf, (qlm_act)c->act);
    if (lin_bwd(p, t, s->dxn, 0, s->dh0, t->xn2, n, &L->wi0, G ? &G->wi0 : NULL, stack, l, QLM_LORA_WI0) != 0)
        return -1;
    if (c->gated &&
        lin_bwd(p, t, s->dxn, 1, s->dh1, t->xn2, n, &L->wi1, G ? &G->wi1 : NULL, stack, l, QLM_LORA_WI1) != 0)
        return -1;
    be->rmsnorm_backward(s->dx, G ? G->ffn_norm : NULL, s->dxn, x, L->ffn_norm, n, c->d_model, c->norm_eps);
    return 0;
}

/* Self-attention sub-block: x_mid = x + O(attention(Q, K, V)). */
static void self_forward(const pass *p, const qlm_t5_layer *L, qlm_t5_trace *t, const float *x, int n, int stack,
                         int l, const int *start, const int *len, const float *bias) {
    const qlm_t5_config *c = &p->m->cfg;
    const qlm_backend *be = p->m->be;
    be->rmsnorm(t->xn1, x, L->attn_norm, n, c->d_model, c->norm_eps);
    lin_fwd(p, t, t->q, t->xn1, n, &L->q, stack, l, QLM_LORA_Q);
    lin_fwd(p, t, t->k, t->xn1, n, &L->k, stack, l, QLM_LORA_K);
    lin_fwd(p, t, t->v, t->xn1, n, &L->v, stack, l, QLM_LORA_V);
    attend(p, t->att, t->q, t->k, t->v, start, len, start, len, stack == 1, bias);
    lin_fwd(p, t, p->s->dxn, t->att, n, &L->o, stack, l, QLM_LORA_O);
    be->copy(t->x_mid, x, (long)n * c->d_model);
    be->add(t->x_mid, p->s->dxn, (long)n * c->d_model);
}

static int self_backward(const pass *p, const qlm_t5_layer *L, const qlm_t5_layer *G, qlm_t5_trace *t, const float *x,
                         int n, int stack, int l, const int *start, const int *len, const float *bias, float *dbias) {
    const qlm_t5_config *c = &p->m->cfg;
    const qlm_backend *be = p->m->be;
    qlm_t5_train_state *s = p->s;
    long ni = (long)n * c->n_heads * c->d_kv;
    if (lin_bwd(p, t, s->datt, 0, s->dx, t->att, n, &L->o, G ? &G->o : NULL, stack, l, QLM_LORA_O) != 0) return -1;
    be->zero(s->dk, ni);
    be->zero(s->dv, ni);
    if (attend_backward(p, s->dq, s->dk, s->dv, dbias, s->datt, t->q, t->k, t->v, start, len, start, len, stack == 1,
                        bias) != 0)
        return -1;
    if (lin_bwd(p, t, s->dxn, 0, s->dq, t->xn1, n, &L->q, G ? &G->q : NULL, stack, l, QLM_LORA_Q) ||
        lin_bwd(p, t, s->dxn, 1, s->dk, t->xn1, n, &L->k, G ? &G->k : NULL, stack, l, QLM_LORA_K) ||
        lin_bwd(p, t, s->dxn, 1, s->dv, t->xn1, n, &L->v, G ? &G->v : NULL, stack, l, QLM_LORA_V))
        return -1;
    be->rmsnorm_backward(s->dx, G ? G->attn_norm : NULL, s->dxn, x, L->attn_norm, n, c->d_model, c->norm_eps);
    return 0;
}

static void encoder_block(const pass *p, int l, qlm_t5_trace *t) {
    const qlm_train_batch *b = p->b;
    int n = b->n_src_rows;
    self_forward(p, &p->m->enc[l], t, p->s->enc_x[l], n, 0, l, b->src_start, b->src_len, p->s->enc_bias);
    ffn_forward(p, &p->m->enc[l], t, t->x_mid, p->s->enc_x[l + 1], n, 0, l);
}

static void decoder_block(const pass *p, int l, qlm_t5_trace *t, float *x_out) {
    const qlm_t5_config *c = &p->m->cfg;
    const qlm_backend *be = p->m->be;
    const qlm_t5_layer *L = &p->m->dec[l];
    const qlm_train_batch *b = p->b;
    int n = b->n_rows, ns = b->n_src_rows;
    self_forward(p, L, t, p->s->dec_x[l], n, 1, l, b->start, b->len, p->s->dec_bias);
    be->rmsnorm(t->xnc, t->x_mid, L->cross_norm, n, c->d_model, c->norm_eps);
    lin_fwd(p, t, t->cq, t->xnc, n, &L->cq, 1, l, QLM_LORA_CROSS_Q);
    lin_fwd(p, t, t->ck, p->s->enc_out, ns, &L->ck, 1, l, QLM_LORA_CROSS_K);
    lin_fwd(p, t, t->cv, p->s->enc_out, ns, &L->cv, 1, l, QLM_LORA_CROSS_V);
    attend(p, t->catt, t->cq, t->ck, t->cv, b->start, b->len, b->src_start, b->src_len, 0, NULL);
    lin_fwd(p, t, p->s->dxn, t->catt, n, &L->co, 1, l, QLM_LORA_CROSS_O);
    be->copy(t->x_mid2, t->x_mid, (long)n * c->d_model);
    be->add(t->x_mid2, p->s->dxn, (long)n * c->d_model);
    ffn_forward(p, L, t, t->x_mid2, x_out, n, 1, l);
}

static int decoder_block_backward(const pass *p, int l, qlm_t5_trace *t) {
    const qlm_t5_config *c = &p->m->cfg;
    const qlm_backend *be = p->m->be;
    const qlm_t5_layer *L = &p->m->dec[l], *G = p->g ? &p->g->dec[l] : NULL;
    qlm_t5_train_state *s = p->s;
    const qlm_train_batch *b = p->b;
    int n = b->n_rows, ns = b->n_src_rows;
    long nsi = (long)ns * c->n_heads * c->d_kv;
    if (ffn_backward(p, L, G, t, t->x_mid2, n, 1, l) != 0) return -1;
    /* cross-attention: the keys and values are projections of the encoder output */
    if (lin_bwd(p, t, s->datt, 0, s->dx, t->catt, n, &L->co, G ? &G->co : NULL, 1, l, QLM_LORA_CROSS_O) != 0) return -1;
    be->zero(s->dk, nsi);
    be->zero(s->dv, nsi);
    if (attend_backward(p, s->dq, s->dk, s->dv, NULL, s->datt, t->cq, t->ck, t->cv, b->start, b->len, b->src_start,
                        b->src_len, 0, NULL) != 0)
        return -1;
    if (lin_bwd(p, t, s->d_enc_out, 1, s->dk, s->enc_out, ns, &L->ck, G ? &G->ck : NULL, 1, l, QLM_LORA_CROSS_K) ||
        lin_bwd(p, t, s->d_enc_out, 1, s->dv, s->enc_out, ns, &L->cv, G ? &G->cv : NULL, 1, l, QLM_LORA_CROSS_V) ||
        lin_bwd(p, t, s->dxn, 0, s->dq, t->xnc, n, &L->cq, G ? &G->cq : NULL, 1, l, QLM_LORA_CROSS_Q))
        return -1;
    be->rmsnorm_backward(s->dx, G ? G->cross_norm : NULL, s->dxn, t->x_mid, L->cross_norm, n, c->d_model, c->norm_eps);
    return self_backward(p, L, G, t, s->dec_x[l], n, 1, l, b->start, b->len, s->dec_bias, p->g ? s->d_dec_bias : NULL);
}

static int check_batch(const qlm_t5_model *m, const qlm_t5_train_state *s, const qlm_train_batch *b) {
    if (b->n_rows > s->max_tgt || b->n_src_rows > s->max_src)
        return qlm_errorf("a batch of %d input / %d output rows exceeds the state's %d / %d", b->n_src_rows, b->n_rows,
                          s->max_src, s->max_tgt);
    if (!b->src_ids || !b->src_start || !b->src_len) return qlm_errorf("a T5 training batch needs input sequences");
    for (int i = 0; i < b->n_seq; i++)
        if (b->len[i] > s->max_len || b->src_len[i] > s->max_len || b->len[i] <= 0 || b->src_len[i] <= 0)
            return qlm_errorf("sequence %d: %d input / %d output tokens (1..%d each)", i, b->src_len[i], b->len[i],
                              s->max_len);
    for (int i = 0; i < b->n_rows; i++)
        if (b->ids[i] < 0 || b->ids[i] >= m->cfg.vocab_size) return qlm_errorf("token id %d is outside the vocabulary", b->ids[i]);
    for (int i = 0; i < b->n_src_rows; i++)
        if (b->src_ids[i] < 0 || b->src_ids[i] >= m->cfg.vocab_size)
            return qlm_errorf("token id %d is outside the vocabulary", b->src_ids[i]);
    return 0;
}

int qlm_t5_train_pass(const qlm_t5_model *m, const qlm_t5_model *grads, const qlm_lora_train *lora,
                      qlm_t5_train_state *s, const qlm_train_batch *b, float grad_scale, int backward,
                      double *loss_sum) {
    const qlm_t5_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    if (check_batch(m, s, b) != 0) return -1;
    if (lora && lora->adapter->n_params && s->lora_rank <= 0)
        return qlm_errorf("the training state was made without room for an adapter");
    pass p = {.m = m, .g = backward ? grads : NULL, .lora = lora, .s = s, .b = b,
              .lin = {.be = be, .lora = lora, .tmp = s->tmp, .tmp_in = s->tmp_in, .du = s->lora_du}};
    /* Unit 0 holds the embedding, the final norms, the bias tables and an untied head; unit 1 + l
     * encoder block l, unit 1 + n_layers + l decoder block l. Each use of unit 0's gradients is
     * its own reduce-scatter when they are sharded. */
    const qlm_unit_hooks *h = m->hooks;
    int enc0 = 1, dec0 = 1 + c->n_layers, G = p.g != NULL;
    if (qlm_unit_begin(h, backward ? QLM_PASS_TRAIN : QLM_PASS_EVAL) != 0 || qlm_unit_use(h, 0) != 0) return -1;
    bias_tables(&p, 1);
    int ns = b->n_src_rows, n = b->n_rows;
    be->embedding(s->enc_x[0], &m->shared, b->src_ids, ns);
    qlm_unit_done(h, 0);
    for (int l = 0; l < c->n_layers; l++) {
        if (qlm_unit_use(h, enc0 + l) != 0) return -1;
        encoder_block(&p, l, &s->enc_tr[s->recompute ? 0 : l]);
        qlm_unit_done(h, enc0 + l);
    }
    if (qlm_unit_use(h, 0) != 0) return -1;
    be->rmsnorm(s->enc_out, s->enc_x[c->n_layers], m->enc_final_norm, ns, c->d_model, c->norm_eps);
    be->embedding(s->dec_x[0], &m->shared, b->ids, n);
    qlm_unit_done(h, 0);
    for (int l = 0; l < c->n_dec_layers; l++) {
        if (qlm_unit_use(h, dec0 + l) != 0) return -1;
        decoder_block(&p, l, &s->dec_tr[s->recompute ? 0 : l], s->dec_x[l + 1]);
        qlm_unit_done(h, dec0 + l);
    }
    /* The tied head's d_model^-0.5 is folded into head_norm; its gradient goes to dec_final_norm. */
    qlm_train_head hd = {.be = be, .dim = c->d_model, .vocab = c->vocab_size, .eps = c->norm_eps, .norm = m->head_norm,
                         .lm_head = &m->lm_head, .g_norm = G ? s->d_head_norm : NULL, .g_head = G ? &p.g->lm_head : NULL,
                         .head_x = s->head_x, .head_xn = s->head_xn, .logits = s->logits, .row_loss = s->row_loss,
                         .dxn = s->dxn, .dnorm = s->tmp, .rows = s->head_rows, .targets = s->head_targets,
                         .losses = s->head_losses};
    if (backward) {
        be->zero(s->dx, (long)n * c->d_model);
        if (G) be->zero(s->d_head_norm, c->d_model), be->zero(s->d_dec_bias, (long)c->n_heads * s->span);
    }
    if (qlm_unit_use(h, 0) != 0 || (G && qlm_unit_grads_use(h, 0) != 0)) return -1;
    if (qlm_train_head_pass(&hd, s->dec_x[c->n_dec_layers], b, grad_scale, backward, loss_sum, s->dx) != 0)
        return -1;
    if (G) {
        be->scale(s->d_head_norm, c->d_model, c->tie_embeddings ? 1.0f / sqrtf((float)c->d_model) : 1.0f);
        be->add(p.g->dec_final_norm, s->d_head_norm, c->d_model);
        if (qlm_unit_grads_done(h, 0) != 0) return -1;
    }
    qlm_unit_done(h, 0);
    if (!backward) return 0;
    be->zero(s->d_enc_out, (long)ns * c->d_model);
    for (int l = c->n_dec_layers - 1; l >= 0; l--) {
        qlm_t5_trace *t = &s->dec_tr[s->recompute ? 0 : l];
        if (qlm_unit_use(h, dec0 + l) != 0 || qlm_unit_grads_use(h, dec0 + l) != 0) return -1;
        if (s->recompute) decoder_block(&p, l, t, s->tmp_in);
        if (decoder_block_backward(&p, l, t) != 0 || qlm_unit_grads_done(h, dec0 + l) != 0) return -1;
        qlm_unit_done(h, dec0 + l);
    }
    /* The decoder's embedding gradient, then the encoder from the gradient of its normed output. */
    if (qlm_unit_use(h, 0) != 0 || (G && qlm_unit_grads_use(h, 0) != 0)) return -1;
    if (G) be->embedding_backward((float *)p.g->shared.data, s->dx, b->ids, n, c->d_model);
    be->zero(s->dx, (long)ns * c->d_model);
    be->rmsnorm_backward(s->dx, G ? p.g->enc_final_norm : NULL, s->d_enc_out, s->enc_x[c->n_layers],
                         m->enc_final_norm, ns, c->d_model, c->norm_eps);
    if (G && qlm_unit_grads_done(h, 0) != 0) return -1;
    qlm_unit_done(h, 0);
    if (G) be->zero(s->d_enc_bias, (long)c->n_heads * s->span);
    for (int l = c->n_layers - 1; l >= 0; l--) {
        qlm_t5_trace *t = &s->enc_tr[s->recompute ? 0 : l];
        if (qlm_unit_use(h, enc0 + l) != 0 || qlm_unit_grads_use(h, enc0 + l) != 0) return -1;
        const qlm_t5_layer *L = &m->enc[l], *GL = G ? &p.g->enc[l] : NULL;
        if (s->recompute) {
            /* encoder_block writes the next input: keep it, the recomputation must not move it */
            self_forward(&p, L, t, s->enc_x[l], ns, 0, l, b->src_start, b->src_len, s->enc_bias);
            ffn_forward(&p, L, t, t->x_mid, s->tmp_in, ns, 0, l);
        }
        if (ffn_backward(&p, L, GL, t, t->x_mid, ns, 0, l) != 0 ||
            self_backward(&p, L, GL, t, s->enc_x[l], ns, 0, l, b->src_start, b->src_len, s->enc_bias,
                          G ? s->d_enc_bias : NULL) != 0 ||
            qlm_unit_grads_done(h, enc0 + l) != 0)
            return -1;
        qlm_unit_done(h, enc0 + l);
    }
    if (G) {
        if (qlm_unit_grads_use(h, 0) != 0) return -1;
        be->embedding_backward((float *)p.g->shared.data, s->dx, b->src_ids, ns, c->d_model);
        bias_tables(&p, 0);
        if (qlm_unit_grads_done(h, 0) != 0) return -1;
    }
    return 0;
}
