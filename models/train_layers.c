/* The shared layers of training passes: linear layer with its adapter, and the loss head. */
#include "train_layers.h"

#include "adapter.h"
#include "../core/error.h"

float *qlm_lora_train_grad(const qlm_lora_train *t, const void *weight_data) {
    return t->grad + ((const char *)weight_data - (const char *)t->adapter->buffer) / (long)sizeof(float);
}

/* A module's dropout seed from the pass's seed and the module's A: the parts of a fused module share
 * its A and so its mask, as peft drops out the fused projection's input once. */
static uint64_t dropout_seed(const qlm_lora_train *t, const qlm_lora_module *mod) {
    uint64_t at = (uint64_t)((const char *)mod->a.data - (const char *)t->adapter->buffer);
    return t->dropout_seed ^ (0x9e3779b97f4a7c15ULL * (at + 1));
}

/* The module's input as A sees it: x itself, or a dropped-out copy in tmp_in. */
static const float *adapter_input(const qlm_train_linear *c, const float *x, long n, uint64_t seed, long first) {
    if (c->lora->dropout <= 0) return x;
    c->be->dropout(c->tmp_in, x, n, c->lora->dropout, seed, first);
    return c->tmp_in;
}

void qlm_train_linear_forward(const qlm_train_linear *c, float *y, const float *x, int n, const qlm_weight *w,
                              const float *bias, const qlm_lora_module *mod, float *u, long row0) {
    const qlm_backend *be = c->be;
    be->matmul(y, x, n, w, bias);
    if (!mod) return;
    be->matmul(u, adapter_input(c, x, (long)n * w->cols, dropout_seed(c->lora, mod), row0 * w->cols), n, &mod->a,
               NULL);
    be->scale(u, (long)n * mod->r, mod->scale);
    be->matmul(c->tmp, u, n, &mod->b, NULL);
    be->add(y, c->tmp, (long)n * w->rows);
}

/* The precision of a weight's gradient product: a BF16 compute copy's takes BF16 inputs, as its
 * forward does; every other weight's (F32 masters, F16 under loss scaling, QAT's fake-quantized
 * copies, the adapters) F32. */
static qlm_dtype grad_inputs(const qlm_weight *w) { return w->dtype == QLM_BF16 ? QLM_BF16 : QLM_F32; }

int qlm_train_linear_backward(const qlm_train_linear *c, float *dx, int accumulate, const float *dy, const float *x,
                              int n, const qlm_weight *w, const qlm_weight *gw, float *gbias, const qlm_lora_module *mod,
                              const float *u, long row0) {
    const qlm_backend *be = c->be;
    if (be->matmul_backward_x(dx, dy, n, w, accumulate) != 0) return -1;
    if (gw && be->matmul_backward_w((float *)gw->data, gbias, dy, x, n, w->rows, w->cols, grad_inputs(w)) != 0)
        return -1;
    if (!mod) return 0;
    float *dA = qlm_lora_train_grad(c->lora, mod->a.data), *dB = qlm_lora_train_grad(c->lora, mod->b.data);
    uint64_t seed = dropout_seed(c->lora, mod);
    long n_in = (long)n * w->cols;
    if (be->matmul_backward_w(dB, NULL, dy, u, n, mod->b.rows, mod->b.cols, QLM_F32) != 0) return -1;
    if (be->matmul_backward_x(c->du, dy, n, &mod->b, 0) != 0) return -1;
    be->scale(c->du, (long)n * mod->r, mod->scale);
    long first = row0 * w->cols;
    if (be->matmul_backward_w(dA, NULL, c->du, adapter_input(c, x, n_in, seed, first), n, mod->a.rows, mod->a.cols,
                              QLM_F32) != 0)
        return -1;
    if (c->lora->dropout <= 0) return be->matmul_backward_x(dx, c->du, n, &mod->a, 1);
    if (be->matmul_backward_x(c->tmp_in, c->du, n, &mod->a, 0) != 0) return -1;
    be->dropout(c->tmp_in, c->tmp_in, n_in, c->lora->dropout, seed, first);
    be->add(dx, c->tmp_in, n_in);
    return 0;
}

int qlm_train_head_pass(const qlm_train_head *h, const float *x, const qlm_train_batch *b, float grad_scale,
                        int backward, double *loss_sum, float *dx) {
    const qlm_backend *be = h->be;
    const int *targets = b->targets;
    int row = 0, dim = h->dim, n = b->n_rows;
    size_t done = 0; /* target rows so far */
    /* x's rows as a table the chunk's target rows are gathered from (one op, not one a row). */
    const qlm_weight rows_of_x = {.dtype = QLM_F32, .rows = n, .cols = dim, .data = x, .scale = 1.0f};
    while (row < n) {
        int k = 0;
        for (; row < n && k < QLM_HEAD_CHUNK; row++) {
            if (targets[row] < 0) continue;
            if (targets[row] >= h->vocab)
                return qlm_errorf("target token %d is outside the vocabulary (0..%d)", targets[row], h->vocab - 1);
            h->rows[k] = row;
            h->targets[k] = targets[row];
            k++;
        }
        if (k == 0) break;
        be->embedding(h->head_x, &rows_of_x, h->rows, k);
        be->rmsnorm(h->head_xn, h->head_x, h->norm, k, dim, h->eps);
        be->matmul(h->logits, h->head_xn, k, h->lm_head, NULL);
        const size_t first = done;
        float *teacher = b->teacher_logits ? b->teacher_logits + first * (size_t)h->vocab : NULL;
        done += (size_t)k;
        if (b->writes_teacher) {
            be->copy(teacher, h->logits, (long)k * h->vocab);
            continue;
        }
        be->cross_entropy(h->row_loss + first, h->logits, h->targets, teacher, k, h->vocab, grad_scale, h->softcap);
        if (!backward) continue;
        /* d(normed rows) into dnorm, then through the final norm into compact rows dxn. */
        if (be->matmul_backward_x(h->dnorm, h->logits, k, h->lm_head, 0) != 0) return -1;
        if (h->g_head && be->matmul_backward_w((float *)h->g_head->data, NULL, h->logits, h->head_xn, k, h->vocab, dim,
                                               grad_inputs(h->lm_head)) != 0)
            return -1;
        be->zero(h->dxn, (long)k * dim);
        be->rmsnorm_backward(h->dxn, h->g_norm, h->dnorm, h->head_x, h->norm, k, dim, h->eps);
        be->embedding_backward(dx, h->dxn, h->rows, k, dim); /* dx's row rows[i] += dxn's row i */
    }
    if (b->writes_teacher || done == 0) return 0;
    /* The rows' losses come to the host once a pass, not once a chunk (a wait for the device each). */
    be->to_host(h->losses, h->row_loss, done * sizeof *h->losses);
    for (size_t i = 0; i < done; i++) *loss_sum += h->losses[i];
    return 0;
}
