/* The Llama training pass: attention_forward/attention_backward and mlp_forward/mlp_backward per
 * layer, the head with its loss in chunks of target rows (the logits of a whole batch would not
 * fit), and the embedding's gradient. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../lora/lora.h"
#include "error.h"
#include "llama_train.h"

/* Target rows whose logits are computed together: bounds the [chunk][vocab] buffer. */
enum { HEAD_CHUNK = 128 };

float *qlm_lora_train_grad(const qlm_lora_train *t, const void *weight_data) {
    return t->grad + ((const char *)weight_data - (const char *)t->adapter->buffer) / (long)sizeof(float);
}

static void trace_free(const qlm_backend *be, qlm_llama_trace *t) {
    float *bufs[] = {t->xn1, t->q, t->k, t->v, t->att, t->x_mid, t->xn2, t->gate, t->up, t->h};
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
             {&t->up, c->hidden_dim}, {&t->h, c->hidden_dim}};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
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
    s->head_chunk = HEAD_CHUNK;
    struct {
        float **p;
        size_t n;
    } b[] = {{&s->dx, R * c->dim},       {&s->dxn, R * c->dim},       {&s->dq, R * q},
             {&s->dk, R * kv},           {&s->dv, R * kv},            {&s->datt, R * q},
             {&s->dgate, R * c->hidden_dim}, {&s->dup, R * c->hidden_dim}, {&s->tmp, R * wide},
             {&s->tmp_in, R * wide},     {&s->lora_du, R * (lora_rank ? lora_rank : 1)},
             {&s->head_x, (size_t)HEAD_CHUNK * c->dim}, {&s->head_xn, (size_t)HEAD_CHUNK * c->dim},
             {&s->logits, (size_t)HEAD_CHUNK * c->vocab_size}, {&s->row_loss, HEAD_CHUNK}};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        *b[i].p = be->alloc(b[i].n * sizeof(float));
        if (!*b[i].p) goto oom;
        s->peak_bytes += (double)b[i].n * sizeof(float);
    }
    s->head_rows = malloc((size_t)HEAD_CHUNK * sizeof *s->head_rows);
    s->head_targets = malloc((size_t)HEAD_CHUNK * sizeof *s->head_targets);
    if (!s->head_rows || !s->head_targets) goto oom;
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
                     s->head_x, s->head_xn, s->logits, s->row_loss};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(bufs[i]);
    free(s->head_rows);
    free(s->head_targets);
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
} pass;

static const qlm_lora_module *lora_module(const pass *p, int l, int target) {
    return p->lora ? qlm_lora_find(p->lora->adapter, 0, l, (qlm_lora_target)target) : NULL;
}

static uint64_t dropout_seed(const pass *p, int l, int target) {
    return p->lora->dropout_seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(l * 8 + target + 1));
}

/* The module's input as A sees it: x itself, or a dropped-out copy in tmp_in. */
static const float *lora_input(const pass *p, const float *x, int in, int l, int target) {
    if (p->lora->dropout <= 0) return x;
    p->m->be->dropout(p->s->tmp_in, x, (long)p->n * in, p->lora->dropout, dropout_seed(p, l, target));
    return p->s->tmp_in;
}

/* y = x W^T + b, plus the trained adapter's scale * B A dropout(x); keeps scale * A dropout(x). */
static void linear_forward(const pass *p, qlm_llama_trace *t, float *y, const float *x, const qlm_weight *w,
                           const float *bias, int l, int target) {
    const qlm_backend *be = p->m->be;
    be->matmul(y, x, p->n, w, bias);
    const qlm_lora_module *mod = lora_module(p, l, target);
    if (!mod) return;
    float *u = t->lora_u[target];
    be->matmul(u, lora_input(p, x, w->cols, l, target), p->n, &mod->a, NULL);
    be->scale(u, (long)p->n * mod->r, mod->scale);
    be->matmul(p->s->tmp, u, p->n, &mod->b, NULL);
    be->add(y, p->s->tmp, (long)p->n * w->rows);
}

/* dx (+)= dy W (and the adapter's path); the weight's and the adapter's gradients. */
static int linear_backward(const pass *p, qlm_llama_trace *t, float *dx, int accumulate, const float *dy,
                           const float *x, const qlm_weight *w, const qlm_weight *gw, float *gbias, int l, int target) {
    const qlm_backend *be = p->m->be;
    int n = p->n;
    if (be->matmul_backward_x(dx, dy, n, w, accumulate) != 0) return -1;
    if (gw) be->matmul_backward_w((float *)gw->data, gbias, dy, x, n, w->rows, w->cols);
    const qlm_lora_module *mod = lora_module(p, l, target);
    if (!mod) return 0;
    float *du = p->s->lora_du, *dA = qlm_lora_train_grad(p->lora, mod->a.data),
          *dB = qlm_lora_train_grad(p->lora, mod->b.data);
    be->matmul_backward_w(dB, NULL, dy, t->lora_u[target], n, mod->b.rows, mod->b.cols);
    if (be->matmul_backward_x(du, dy, n, &mod->b, 0) != 0) return -1;
    be->scale(du, (long)n * mod->r, mod->scale);
    be->matmul_backward_w(dA, NULL, du, lora_input(p, x, w->cols, l, target), n, mod->a.rows, mod->a.cols);
    if (p->lora->dropout <= 0) return be->matmul_backward_x(dx, du, n, &mod->a, 1);
    if (be->matmul_backward_x(p->s->tmp_in, du, n, &mod->a, 0) != 0) return -1;
    be->dropout(p->s->tmp_in, p->s->tmp_in, (long)n * w->cols, p->lora->dropout, dropout_seed(p, l, target));
    be->add(dx, p->s->tmp_in, (long)n * w->cols);
    return 0;
}

static qlm_attn_shape attn_shape(const qlm_llama_config *c) {
    return (qlm_attn_shape){.n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                            .scale = 1.0f / sqrtf((float)c->head_dim)};
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
    linear_forward(p, t, t->q, t->xn1, &L->wq, L->bq, l, QLM_LORA_Q);
    linear_forward(p, t, t->k, t->xn1, &L->wk, L->bk, l, QLM_LORA_K);
    linear_forward(p, t, t->v, t->xn1, &L->wv, L->bv, l, QLM_LORA_V);
    be->rope(t->q, n, b->pos, c->n_heads, c->head_dim, m->inv_freq);
    be->rope(t->k, n, b->pos, c->n_kv_heads, c->head_dim, m->inv_freq);
    qlm_attn_shape shape = attn_shape(c);
    for (int i = 0; i < b->n_seq; i++) {
        size_t r = (size_t)b->start[i];
        be->attention(t->att + r * q_dim, t->q + r * q_dim, t->k + r * kv_dim, t->v + r * kv_dim, b->len[i],
                      b->pos + r, &shape);
    }
    linear_forward(p, t, p->s->dxn, t->att, &L->wo, L->bo, l, QLM_LORA_O);
    be->copy(t->x_mid, x_in, (long)n * c->dim);
    be->add(t->x_mid, p->s->dxn, (long)n * c->dim);
    /* mlp_forward */
    be->rmsnorm(t->xn2, t->x_mid, L->ffn_norm, n, c->dim, c->norm_eps);
    linear_forward(p, t, t->gate, t->xn2, &L->w_gate, L->b_gate, l, QLM_LORA_GATE);
    linear_forward(p, t, t->up, t->xn2, &L->w_up, L->b_up, l, QLM_LORA_UP);
    be->glu(t->h, t->gate, t->up, (long)n * c->hidden_dim, QLM_ACT_SILU);
    linear_forward(p, t, p->s->dxn, t->h, &L->w_down, L->b_down, l, QLM_LORA_DOWN);
    be->copy(x_out, t->x_mid, (long)n * c->dim);
    be->add(x_out, p->s->dxn, (long)n * c->dim);
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
    if (linear_backward(p, t, s->tmp, 0, s->dx, t->h, &L->w_down, GW(w_down), GB(b_down), l, QLM_LORA_DOWN) != 0)
        return -1;
    be->glu_backward(s->dgate, s->dup, s->tmp, t->gate, t->up, nh, QLM_ACT_SILU);
    if (linear_backward(p, t, s->dxn, 0, s->dgate, t->xn2, &L->w_gate, GW(w_gate), GB(b_gate), l, QLM_LORA_GATE) ||
        linear_backward(p, t, s->dxn, 1, s->dup, t->xn2, &L->w_up, GW(w_up), GB(b_up), l, QLM_LORA_UP))
        return -1;
    be->rmsnorm_backward(s->dx, G ? G->ffn_norm : NULL, s->dxn, t->x_mid, L->ffn_norm, n, c->dim, c->norm_eps);
    /* attention_backward */
    if (linear_backward(p, t, s->datt, 0, s->dx, t->att, &L->wo, GW(wo), GB(bo), l, QLM_LORA_O) != 0) return -1;
    be->zero(s->dk, (long)n * kv_dim);
    be->zero(s->dv, (long)n * kv_dim);
    qlm_attn_shape shape = attn_shape(c);
    for (int i = 0; i < b->n_seq; i++) {
        size_t r = (size_t)b->start[i];
        if (be->attention_backward(s->dq + r * q_dim, s->dk + r * kv_dim, s->dv + r * kv_dim, NULL,
                                   s->datt + r * q_dim, t->q + r * q_dim, t->k + r * kv_dim, t->v + r * kv_dim,
                                   b->len[i], b->pos + r, &shape) != 0)
            return -1;
    }
    be->rope_backward(s->dq, n, b->pos, c->n_heads, c->head_dim, m->inv_freq);
    be->rope_backward(s->dk, n, b->pos, c->n_kv_heads, c->head_dim, m->inv_freq);
    if (linear_backward(p, t, s->dxn, 0, s->dq, t->xn1, &L->wq, GW(wq), GB(bq), l, QLM_LORA_Q) ||
        linear_backward(p, t, s->dxn, 1, s->dk, t->xn1, &L->wk, GW(wk), GB(bk), l, QLM_LORA_K) ||
        linear_backward(p, t, s->dxn, 1, s->dv, t->xn1, &L->wv, GW(wv), GB(bv), l, QLM_LORA_V))
        return -1;
    be->rmsnorm_backward(s->dx, G ? G->attn_norm : NULL, s->dxn, x_in, L->attn_norm, n, c->dim, c->norm_eps);
#undef GW
#undef GB
    return 0;
}

/* The final norm, lm_head and cross-entropy over the target rows, chunk by chunk; with backward,
 * s->dx becomes the gradient of the last layer's output. */
static int head_pass(const pass *p, float grad_scale, int backward, double *loss_sum) {
    const qlm_model *m = p->m;
    const qlm_llama_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    qlm_llama_train_state *s = p->s;
    const float *x = s->x_in[c->n_layers];
    if (backward) be->zero(s->dx, (long)p->n * c->dim);
    int row = 0;
    while (row < p->n) {
        int k = 0;
        for (; row < p->n && k < s->head_chunk; row++)
            if (p->b->targets[row] >= 0) {
                if (p->b->targets[row] >= c->vocab_size)
                    return qlm_errorf("target token %d is outside the vocabulary (0..%d)", p->b->targets[row],
                                      c->vocab_size - 1);
                s->head_rows[k] = row;
                s->head_targets[k] = p->b->targets[row];
                be->copy(s->head_x + (size_t)k * c->dim, x + (size_t)row * c->dim, c->dim);
                k++;
            }
        if (k == 0) break;
        be->rmsnorm(s->head_xn, s->head_x, m->final_norm, k, c->dim, c->norm_eps);
        be->matmul(s->logits, s->head_xn, k, &m->lm_head, NULL);
        be->cross_entropy(s->row_loss, s->logits, s->head_targets, k, c->vocab_size, grad_scale);
        float losses[HEAD_CHUNK];
        be->to_host(losses, s->row_loss, (size_t)k * sizeof *losses);
        for (int i = 0; i < k; i++) *loss_sum += losses[i];
        if (!backward) continue;
        /* d(normed rows) into tmp, then through the final norm into compact rows of head_x's size. */
        if (be->matmul_backward_x(s->tmp, s->logits, k, &m->lm_head, 0) != 0) return -1;
        if (p->g) be->matmul_backward_w((float *)p->g->lm_head.data, NULL, s->logits, s->head_xn, k, c->vocab_size, c->dim);
        be->zero(s->dxn, (long)k * c->dim);
        be->rmsnorm_backward(s->dxn, p->g ? p->g->final_norm : NULL, s->tmp, s->head_x, m->final_norm, k, c->dim,
                             c->norm_eps);
        for (int i = 0; i < k; i++)
            be->add(s->dx + (size_t)s->head_rows[i] * c->dim, s->dxn + (size_t)i * c->dim, c->dim);
    }
    return 0;
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
    pass p = {.m = m, .g = grads, .lora = lora, .s = s, .b = b, .n = b->n_rows};
    be->embedding(s->x_in[0], &m->tok_embed, b->ids, p.n);
    for (int l = 0; l < c->n_layers; l++)
        layer_forward(&p, l, s->x_in[l], s->x_in[l + 1], &s->tr[s->recompute ? 0 : l]);
    if (head_pass(&p, grad_scale, backward, loss_sum) != 0) return -1;
    if (!backward) return 0;
    for (int l = c->n_layers - 1; l >= 0; l--) {
        qlm_llama_trace *t = &s->tr[s->recompute ? 0 : l];
        if (s->recompute) layer_forward(&p, l, s->x_in[l], s->tmp_in, t);
        if (layer_backward(&p, l, s->x_in[l], t) != 0) return -1;
    }
    if (grads) be->embedding_backward((float *)grads->tok_embed.data, s->dx, b->ids, p.n, c->dim);
    return 0;
}
