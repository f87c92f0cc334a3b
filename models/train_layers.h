/* The pieces every architecture's training pass shares: the linear layer (y = x W^T + b plus the
 * trained adapter's scale * B A dropout(x)) with its backward into dx, the weight's gradient (full
 * training) and the adapter's A/B gradients; and the loss head (final norm, lm_head, cross-entropy
 * over the target rows, chunk by chunk) with its backward. */
#ifndef QLM_TRAIN_LAYERS_H
#define QLM_TRAIN_LAYERS_H

#include <stdint.h>

#include "../core/backend.h"
#include "train_batch.h"

struct qlm_lora_module_s;

typedef struct {
    const qlm_backend *be;
    const qlm_lora_train *lora; /* NULL: no adapter trained */
    /* Scratch of the pass: tmp [rows][widest output], tmp_in [rows][widest input], du [rows][rank]. */
    float *tmp, *tmp_in, *du;
} qlm_train_linear;

/* mod: the adapter's module for this projection, or NULL. u: [n][r] where scale * A dropout(x)
 * is kept for the backward (unused without mod). row0: x's first row in the step's whole
 * micro-batch (qlm_train_batch.row0 or src_row0), where the dropout draw starts. */
void qlm_train_linear_forward(const qlm_train_linear *c, float *y, const float *x, int n, const qlm_weight *w,
                              const float *bias, const struct qlm_lora_module_s *mod, float *u, long row0);
/* dx = (accumulate 0) or += dy W plus the adapter's path; gw / gbias (NULL: frozen) += the weight's
 * and bias's gradients; the adapter's A and B gradients accumulate in c->lora. */
int qlm_train_linear_backward(const qlm_train_linear *c, float *dx, int accumulate, const float *dy, const float *x,
                              int n, const qlm_weight *w, const qlm_weight *gw, float *gbias,
                              const struct qlm_lora_module_s *mod, const float *u, long row0);

/* Target rows whose logits are computed together: bounds the [chunk][vocab] buffer. */
enum { QLM_HEAD_CHUNK = 128 };

typedef struct {
    const qlm_backend *be;
    int dim, vocab;
    float eps;
    const float *norm;        /* final norm weight */
    const qlm_weight *lm_head;
    float *g_norm;            /* gradients (NULL: frozen) */
    const qlm_weight *g_head;
    float softcap;            /* of the logits (0: none) */
    /* Scratch: head_x/head_xn [CHUNK][dim], logits [CHUNK][vocab], row_loss [rows of the pass], dxn
     * and dnorm [CHUNK][dim]; on the host rows/targets [CHUNK] and losses [rows of the pass]. */
    float *head_x, *head_xn, *logits, *row_loss, *dxn, *dnorm;
    int *rows, *targets;
    float *losses;
} qlm_train_head;

/* The loss of rows x[0..b->n_rows) against b's targets (-1: none), added to *loss_sum; with
 * backward, dx (n x dim, zeroed by the caller) += the gradient times grad_scale. A teacher's pass
 * (b->writes_teacher) writes the target rows' logits to b->teacher_logits instead. */
int qlm_train_head_pass(const qlm_train_head *h, const float *x, const qlm_train_batch *b, float grad_scale,
                        int backward, double *loss_sum, float *dx);


#endif
