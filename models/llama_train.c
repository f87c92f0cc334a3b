/* The Llama training pass: attention_forward/attention_backward and mlp_forward/mlp_backward per
 * layer, the head with its loss in chunks of target rows (the logits of a whole batch would not
 * fit), and the embedding's gradient. */
#include <stdlib.h>
#include <string.h>

#include "adapter.h"
#include "../core/error.h"
#include "llama_train.h"
#include "train_layers.h"

static void trace_free(const qlm_backend *be, qlm_llama_trace *t) {
    float *bufs[] = {t->xn1, t->q, t->k, t->v, t->att, t->x_mid, t->xn2, t->gate, t->up, t->h, t->q_pre, t->k_pre, t->attn_out, t->mlp_out};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(bufs[i]);
    for (int i = 0; i < 7; i++) be->free(t->lora_u[i]);
}

static int trace_init(const qlm_backend *be, const qlm_llama_config *c, int rows, int rank, qlm_llama_trace *t,
                      double *bytes) {
    size_t q = (size_t)c->n_heads * c->head_dim, kv = (size_t)c->n_kv_heads * c->head_dim, R = (size_t)rows;
    struct {
        float **p;
        size_t n;
    } b[] = {{&t->xn1, c->dim}, {&t->q, q},         {&t->k, kv},       {&t->v, kv},
             {&t->att, q},      {&t->x_mid, c->dim}, {&t->xn2, c->dim}, {&t->gate, c->hidden_dim},
             {&t->up, c->hidden_dim}, {&t->h, c->hidden_dim}, {&t->q_pre, c->qk_norm ? q : 0},
             {&t->k_pre, c->qk_norm ? kv : 0}, {&t->attn_out, c->post_norms ? (size_t)c->dim : 0},
             {&t->mlp_out, c->post_norms ? (size_t)c->dim : 0}};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        if (!b[i].n) continue;
        *b[i].p = be->alloc(R * b[i].n * sizeof(float));
        if (!*b[i].p) return -1;
        *bytes += (double)R * b[i].n * sizeof(float);
    }
    for (int i = 0; i < 7 && rank > 0; i++) {
        t->lora_u[i] = be->alloc(R * rank * sizeof(float));
        if (!t->lora_u[i]) return -1;
        *bytes += (double)R * rank * sizeof(float);
    }
    return 0;
}

int qlm_llama_train_state_init(qlm_llama_train_state *s, const qlm_model *m, int max_rows, int recompute,
                               int lora_rank) {
    const qlm_llama_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    memset(s, 0, sizeof *s);
    if (max_rows <= 0) return qlm_errorf("a training batch needs at least one row");
    s->max_rows = max_rows;
    s->recompute = recompute;
    s->lora_rank = lora_rank;
    s->n_traces = recompute ? 1 : c->n_layers;
    size_t R = (size_t)max_rows, q = (size_t)c->n_heads * c->head_dim, kv = (size_t)c->n_kv_heads * c->head_dim;
    size_t wide = (size_t)c->hidden_dim > q ? (size_t)c->hidden_dim : q;
    if ((size_t)c->dim > wide) wide = c->dim;
    s->x_in = calloc((size_t)c->n_layers + 1, sizeof *s->x_in);
    s->tr = calloc((size_t)s->n_traces, sizeof *s->tr);
    if (!s->x_in || !s->tr) goto oom;
    for (int l = 0; l <= c->n_layers; l++) {
        s->x_in[l] = be->alloc(R * c->dim * sizeof(float));
        if (!s->x_in[l]) goto oom;
        s->peak_bytes += (double)R * c->dim * sizeof(float);
    }
    for (int t = 0; t < s->n_traces; t++)
        if (trace_init(be, c, max_rows, lora_rank, &s->tr[t], &s->peak_bytes) != 0) goto oom;
    struct {
        float **p;
        size_t n;
    } b[] = {{&s->dx, R * c->dim},       {&s->dxn, R * c->dim},       {&s->dq, R * q},
             {&s->dk, R * kv},           {&s->dv, R * kv},            {&s->datt, R * q},
             {&s->dgate, R * c->hidden_dim}, {&s->dup, R * c->hidden_dim}, {&s->tmp, R * wide},
             {&s->tmp_in, R * wide},     {&s->lora_du, R * (lora_rank ? lora_rank : 1)},
             {&s->head_x, (size_t)QLM_HEAD_CHUNK * c->dim}, {&s->head_xn, (size_t)QLM_HEAD_CHUNK * c->dim},
             {&s->logits, (size_t)QLM_HEAD_CHUNK * c->vocab_size}, {&s->row_loss, R},
             {&s->dq_pre, c->qk_norm ? R * q : 0}, {&s->dk_pre, c->qk_norm ? R * kv : 0}};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        if (!b[i].n) continue;
        *b[i].p = be->alloc(b[i].n * sizeof(float));
        if (!*b[i].p) goto oom;
        s->peak_bytes += (double)b[i].n * sizeof(float);
    }
    s->head_rows = malloc((size_t)QLM_HEAD_CHUNK * sizeof *s->head_rows);
    s->head_targets = malloc((size_t)QLM_HEAD_CHUNK * sizeof *s->head_targets);
    s->head_losses = malloc(R * sizeof *s->head_losses);
    if (!s->head_rows || !s->head_targets || !s->head_losses || qlm_rope_dynamic_init(&s->rope, m) != 0) goto oom;
    return 0;
oom:;
    double want = s->peak_bytes;
    qlm_llama_train_state_free(s, m);
    return qlm_errorf("out of memory for training activations of %d rows (%.1f MiB allocated so far)", max_rows,
                      want / 1048576.0);
}

void qlm_llama_train_state_free(qlm_llama_train_state *s, const qlm_model *m) {
    const qlm_backend *be = m->be;
    if (s->x_in)
        for (int l = 0; l <= m->cfg.n_layers; l++) be->free(s->x_in[l]);
    if (s->tr)
        for (int t = 0; t < s->n_traces; t++) trace_free(be, &s->tr[t]);
    free(s->x_in);
    free(s->tr);
    float *bufs[] = {s->dx, s->dxn, s->dq, s->dk, s->dv, s->datt, s->dgate, s->dup, s->tmp, s->tmp_in, s->lora_du,
                     s->head_x, s->head_xn, s->logits, s->row_loss, s->dq_pre, s->dk_pre};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(bufs[i]);
    free(s->head_rows);
    free(s->head_targets);
    free(s->head_losses);
    qlm_rope_dynamic_free(&s->rope, m);
    memset(s, 0, sizeof *s);
}

/* One pass's context, so the layer functions take few arguments. */
typedef struct {
    const qlm_model *m;
    const qlm_llama_grads *g;
    const qlm_lora_train *lora;
    qlm_llama_train_state *s;
    const qlm_train_batch *b;
    int n; /* rows */
    const float *call_freq; /* the RoPE table of the batch's highest position (as for a padded batch in transformers) */
    qlm_train_linear lin;
} pass;

static const qlm_lora_module *lora_module(const pass *p, int l, int target) {
    return p->lora ? qlm_lora_find(p->lora->adapter, 0, l, (qlm_lora_target)target) : NULL;
}

static void linear_forward(const pass *p, qlm_llama_trace *t, float *y, const float *x, const qlm_weight *w,
                           const float *bias, int l, int target) {
    qlm_train_linear_forward(&p->lin, y, x, p->n, w, bias, lora_module(p, l, target), t->lora_u[target], p->b->row0);
}

static int linear_backward(const pass *p, qlm_llama_trace *t, float *dx, int accumulate, const float *dy,
                           const float *x, const qlm_weight *w, const qlm_weight *gw, float *gbias, int l, int target) {
    return qlm_train_linear_backward(&p->lin, dx, accumulate, dy, x, p->n, w, gw, gbias, lora_module(p, l, target),
                                     t->lora_u[target], p->b->row0);
}

/* x_out = layer l applied to x_in, leaving the trace. */
static void layer_forward(const pass *p, int l, const float *x_in, float *x_out, qlm_llama_trace *t) {
    const qlm_model *m = p->m;
    const qlm_llama_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    const qlm_layer *L = &m->layers[l];
    const qlm_train_batch *b = p->b;
    int n = p->n;
    size_t q_dim = (size_t)c->n_heads * c->head_dim, kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    /* attention_forward */
    be->rmsnorm(t->xn1, x_in, L->attn_norm, n, c->dim, c->norm_eps);
    linear_forward(p, t, L->q_norm ? t->q_pre : t->q, t->xn1, &L->wq, L->bq, l, QLM_LORA_Q);
    linear_forward(p, t, L->q_norm ? t->k_pre : t->k, t->xn1, &L->wk, L->bk, l, QLM_LORA_K);
    linear_forward(p, t, t->v, t->xn1, &L->wv, L->bv, l, QLM_LORA_V);
    if (L->q_norm) {
        be->rmsnorm(t->q, t->q_pre, L->q_norm, n * c->n_heads, c->head_dim, c->norm_eps);
        be->rmsnorm(t->k, t->k_pre, L->k_norm, n * c->n_kv_heads, c->head_dim, c->norm_eps);
    }
    be->rope(t->q, t->k, n, b->pos, c->n_heads, c->n_kv_heads, c->head_dim, qlm_llama_layer_freq(m, l, p->call_freq));
    qlm_attn_shape shape = qlm_llama_attn_shape(c, l);
    for (int i = 0; i < b->n_seq; i++) {
        size_t r = (size_t)b->start[i];
        be->attention(t->att + r * q_dim, t->q + r * q_dim, t->k + r * kv_dim, t->v + r * kv_dim, b->len[i],
                      b->pos + r, &shape);
    }
    if (L->attn_post_norm) {
        linear_forward(p, t, t->attn_out, t->att, &L->wo, L->bo, l, QLM_LORA_O);
        be->rmsnorm(p->s->dxn, t->attn_out, L->attn_post_norm, n, c->dim, c->norm_eps);
    } else {
        linear_forward(p, t, p->s->dxn, t->att, &L->wo, L->bo, l, QLM_LORA_O);
    }
    be->copy(t->x_mid, x_in, (long)n * c->dim);
    be->add(t->x_mid, p->s->dxn, (long)n * c->dim);
    /* mlp_forward */
    be->rmsnorm(t->xn2, t->x_mid, L->ffn_norm, n, c->dim, c->norm_eps);
    linear_forward(p, t, t->gate, t->xn2, &L->w_gate, L->b_gate, l, QLM_LORA_GATE);
    linear_forward(p, t, t->up, t->xn2, &L->w_up, L->b_up, l, QLM_LORA_UP);
    be->glu(t->h, t->gate, t->up, (long)n * c->hidden_dim, (qlm_act)c->act);
    if (L->ffn_post_norm) {
        linear_forward(p, t, t->mlp_out, t->h, &L->w_down, L->b_down, l, QLM_LORA_DOWN);
        be->rmsnorm(p->s->dxn, t->mlp_out, L->ffn_post_norm, n, c->dim, c->norm_eps);
    } else {
        linear_forward(p, t, p->s->dxn, t->h, &L->w_down, L->b_down, l, QLM_LORA_DOWN);
    }
    be->copy(x_out, t->x_mid, (long)n * c->dim);
    be->add(x_out, p->s->dxn, (long)n * c->dim);
}

/* The gradient of a block's output before its post norm (in s->dxn), given dout after it; without
 * a post norm, dout itself. */
static const float *post_norm_backward(const pass *p, const float *dout, const float *pre, const float *norm,
                                       float *g_norm) {
    if (!norm) return dout;
    const qlm_llama_config *c = &p->m->cfg;
    p->m->be->zero(p->s->dxn, (long)p->n * c->dim);
    p->m->be->rmsnorm_backward(p->s->dxn, g_norm, dout, pre, norm, p->n, c->dim, c->norm_eps);
    return p->s->dxn;
}

/* s->dx holds the gradient of layer l's output; on return, of its input. */
static int layer_backward(const pass *p, int l, const float *x_in, qlm_llama_trace *t) {
    const qlm_model *m = p->m;
    const qlm_llama_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    const qlm_layer *L = &m->layers[l];
    const qlm_layer *G = p->g ? &p->g->layers[l] : NULL;
    qlm_llama_train_state *s = p->s;
    const qlm_train_batch *b = p->b;
    int n = p->n;
    size_t q_dim = (size_t)c->n_heads * c->head_dim, kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    long nh = (long)n * c->hidden_dim;
#define GW(w) (G ? &G->w : NULL)
#define GB(bias) (G ? G->bias : NULL)
    /* mlp_backward: dx is the gradient of the block output and of x_mid through the residual. */
    const float *dy = post_norm_backward(p, s->dx, t->mlp_out, L->ffn_post_norm, G ? G->ffn_post_norm : NULL);
    if (linear_backward(p, t, s->tmp, 0, dy, t->h, &L->w_down, GW(w_down), GB(b_down), l, QLM_LORA_DOWN) != 0)
        return -1;
    be->glu_backward(s->dgate, s->dup, s->tmp, t->gate, t->up, nh, (qlm_act)c->act);
    if (linear_backward(p, t, s->dxn, 0, s->dgate, t->xn2, &L->w_gate, GW(w_gate), GB(b_gate), l, QLM_LORA_GATE) ||
        linear_backward(p, t, s->dxn, 1, s->dup, t->xn2, &L->w_up, GW(w_up), GB(b_up), l, QLM_LORA_UP))
        return -1;
    be->rmsnorm_backward(s->dx, G ? G->ffn_norm : NULL, s->dxn, t->x_mid, L->ffn_norm, n, c->dim, c->norm_eps);
    /* attention_backward */
    dy = post_norm_backward(p, s->dx, t->attn_out, L->attn_post_norm, G ? G->attn_post_norm : NULL);
    if (linear_backward(p, t, s->datt, 0, dy, t->att, &L->wo, GW(wo), GB(bo), l, QLM_LORA_O) != 0) return -1;
    be->zero(s->dk, (long)n * kv_dim);
    be->zero(s->dv, (long)n * kv_dim);
    qlm_attn_shape shape = qlm_llama_attn_shape(c, l);
    for (int i = 0; i < b->n_seq; i++) {
        size_t r = (size_t)b->start[i];
        if (be->attention_backward(s->dq + r * q_dim, s->dk + r * kv_dim, s->dv + r * kv_dim, NULL,
                                   s->datt + r * q_dim, t->q + r * q_dim, t->k + r * kv_dim, t->v + r * kv_dim,
                                   b->len[i], b->pos + r, &shape) != 0)
            return -1;
    }
    be->rope_backward(s->dq, s->dk, n, b->pos, c->n_heads, c->n_kv_heads, c->head_dim,
                      qlm_llama_layer_freq(m, l, p->call_freq));
    float *dq = s->dq, *dk = s->dk;
    if (L->q_norm) {
        dq = s->dq_pre, dk = s->dk_pre;
        be->zero(dq, (long)n * q_dim);
        be->zero(dk, (long)n * kv_dim);
        be->rmsnorm_backward(dq, G ? G->q_norm : NULL, s->dq, t->q_pre, L->q_norm, n * c->n_heads, c->head_dim,
                             c->norm_eps);
        be->rmsnorm_backward(dk, G ? G->k_norm : NULL, s->dk, t->k_pre, L->k_norm, n * c->n_kv_heads, c->head_dim,
                             c->norm_eps);
    }
    if (linear_backward(p, t, s->dxn, 0, dq, t->xn1, &L->wq, GW(wq), GB(bq), l, QLM_LORA_Q) ||
        linear_backward(p, t, s->dxn, 1, dk, t->xn1, &L->wk, GW(wk), GB(bk), l, QLM_LORA_K) ||
        linear_backward(p, t, s->dxn, 1, s->dv, t->xn1, &L->wv, GW(wv), GB(bv), l, QLM_LORA_V))
        return -1;
    be->rmsnorm_backward(s->dx, G ? G->attn_norm : NULL, s->dxn, x_in, L->attn_norm, n, c->dim, c->norm_eps);
#undef GW
#undef GB
    return 0;
}

/* The final norm, lm_head and loss; with backward, s->dx becomes the gradient of the last output. */
static int head_pass(const pass *p, float grad_scale, int backward, double *loss_sum) {
    const qlm_model *m = p->m;
    qlm_llama_train_state *s = p->s;
    qlm_train_head h = {.be = m->be, .dim = m->cfg.dim, .vocab = m->cfg.vocab_size, .eps = m->cfg.norm_eps,
                        .norm = m->final_norm, .lm_head = &m->lm_head, .g_norm = p->g ? p->g->final_norm : NULL,
                        .g_head = p->g ? &p->g->lm_head : NULL, .softcap = m->cfg.final_softcap,
                        .head_x = s->head_x, .head_xn = s->head_xn,
                        .logits = s->logits, .row_loss = s->row_loss, .dxn = s->dxn, .dnorm = s->tmp,
                        .rows = s->head_rows, .targets = s->head_targets,
                        .losses = s->head_losses};
    if (backward) m->be->zero(s->dx, (long)p->n * m->cfg.dim);
    return qlm_train_head_pass(&h, s->x_in[m->cfg.n_layers], p->b, grad_scale, backward, loss_sum, s->dx);
}

int qlm_llama_train_pass(const qlm_model *m, const qlm_llama_grads *grads, const qlm_lora_train *lora,
                         qlm_llama_train_state *s, const qlm_train_batch *b, float grad_scale, int backward,
                         double *loss_sum) {
    const qlm_llama_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    if (b->n_rows > s->max_rows)
        return qlm_errorf("a batch of %d rows exceeds the %d the training state holds", b->n_rows, s->max_rows);
    for (int i = 0; i < b->n_rows; i++)
        if (b->ids[i] < 0 || b->ids[i] >= c->vocab_size)
            return qlm_errorf("token id %d is outside the vocabulary (0..%d)", b->ids[i], c->vocab_size - 1);
    if (lora && lora->adapter->n_params && s->lora_rank <= 0)
        return qlm_errorf("the training state was made without room for an adapter");
    int max_pos = 0;
    for (int i = 0; i < b->n_rows; i++)
        if (b->pos[i] > max_pos) max_pos = b->pos[i];
    pass p = {.m = m, .g = grads, .lora = lora, .s = s, .b = b, .n = b->n_rows,
              .call_freq = qlm_llama_call_freq(m, &s->rope, max_pos),
              .lin = {.be = be, .lora = lora, .tmp = s->tmp, .tmp_in = s->tmp_in, .du = s->lora_du}};
    /* Unit 0 holds the embedding, the final norm and the head; unit 1 + l layer l. */
    const qlm_unit_hooks *h = m->hooks;
    if (qlm_unit_begin(h, backward ? QLM_PASS_TRAIN : QLM_PASS_EVAL) != 0 || qlm_unit_use(h, 0) != 0) return -1;
    be->embedding(s->x_in[0], &m->tok_embed, b->ids, p.n);
    if (c->embed_scale > 0) be->scale(s->x_in[0], (long)p.n * c->dim, c->embed_scale);
    qlm_unit_done(h, 0);
    for (int l = 0; l < c->n_layers; l++) {
        if (qlm_unit_use(h, 1 + l) != 0) return -1;
        layer_forward(&p, l, s->x_in[l], s->x_in[l + 1], &s->tr[s->recompute ? 0 : l]);
        qlm_unit_done(h, 1 + l);
    }
    if (qlm_unit_use(h, 0) != 0 || (backward && qlm_unit_grads_use(h, 0) != 0) ||
        head_pass(&p, grad_scale, backward, loss_sum) != 0 || (backward && qlm_unit_grads_done(h, 0) != 0))
        return -1;
    qlm_unit_done(h, 0);
    if (!backward) return 0;
    for (int l = c->n_layers - 1; l >= 0; l--) {
        qlm_llama_trace *t = &s->tr[s->recompute ? 0 : l];
        if (qlm_unit_use(h, 1 + l) != 0 || qlm_unit_grads_use(h, 1 + l) != 0) return -1;
        if (s->recompute) layer_forward(&p, l, s->x_in[l], s->tmp_in, t);
        if (layer_backward(&p, l, s->x_in[l], t) != 0 || qlm_unit_grads_done(h, 1 + l) != 0) return -1;
        qlm_unit_done(h, 1 + l);
    }
    /* The embedding's gradient goes to unit 0 again (sharded: a second reduce-scatter of it, so
     * its whole gradient buffer is not held through the layers' backward). */
    if (grads) {
        if (qlm_unit_grads_use(h, 0) != 0) return -1;
        if (c->embed_scale > 0) be->scale(s->dx, (long)p.n * c->dim, c->embed_scale);
        be->embedding_backward((float *)grads->tok_embed.data, s->dx, b->ids, p.n, c->dim);
        if (qlm_unit_grads_done(h, 0) != 0) return -1;
    }
    return 0;
}
