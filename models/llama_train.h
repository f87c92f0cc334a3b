/* Training pass of the Llama-family decoder: a forward that keeps what its backward needs, the
 * cross-entropy loss over target rows, and the backward, layer by layer as forward/backward pairs
 * written against the op table. Gradients go to a model-shaped view of F32 buffers (full
 * training) and/or to an adapter's gradient buffer (LoRA); the base may be frozen in any dtype. */
#ifndef QLM_LLAMA_TRAIN_H
#define QLM_LLAMA_TRAIN_H

#include "model.h"
#include "train_batch.h"

/* What one layer's backward reads, as the forward left it. */
typedef struct {
    float *xn1, *q, *k, *v, *att, *x_mid, *xn2, *gate, *up, *h;
    float *q_pre, *k_pre; /* with qk_norm: the projections before their norm, else NULL */
    float *attn_out, *mlp_out; /* with post_norms: each block's output before its norm, else NULL */
    float *lora_u[7]; /* per target: scale * A(dropout(x)), [rows][r] */
} qlm_llama_trace;

typedef struct {
    int max_rows, recompute, lora_rank;
    float **x_in;          /* [n_layers + 1][max_rows * dim]: each layer's input, then the last output */
    qlm_llama_trace *tr;   /* n_layers traces, or one that recompute refills per layer */
    int n_traces;
    float *dx, *dxn, *dq, *dk, *dv, *datt, *dgate, *dup, *tmp, *tmp_in, *lora_du;
    float *dq_pre, *dk_pre; /* with qk_norm: gradients of the projections before their norm */
    float *head_x, *head_xn, *logits, *row_loss; /* one chunk of target rows */
    int *head_rows, *head_targets;
    float *head_losses;    /* host: the target rows' losses */
    double peak_bytes;     /* activation memory held */
    qlm_rope_dynamic rope;
} qlm_llama_train_state;

/* Activations for batches of up to max_rows rows. recompute: keep only each layer's input and
 * rerun the layer's forward in its backward. lora_rank: the largest rank trained (0: none). */
int qlm_llama_train_state_init(qlm_llama_train_state *s, const qlm_model *m, int max_rows, int recompute,
                               int lora_rank);
void qlm_llama_train_state_free(qlm_llama_train_state *s, const qlm_model *m);

/* Gradient views: a model whose every parameter points at F32 gradient memory of the same shape. */
typedef qlm_model qlm_llama_grads;

/* Forward over the batch; adds the sum of the target rows' losses (nats) to *loss_sum. With
 * backward, gradients times grad_scale (1 / target count of the step, times the loss scale)
 * are added to grads (NULL: the base is frozen) and to lora (NULL: no adapter trained). */
int qlm_llama_train_pass(const qlm_model *m, const qlm_llama_grads *grads, const qlm_lora_train *lora,
                         qlm_llama_train_state *s, const qlm_train_batch *b, float grad_scale, int backward,
                         double *loss_sum);

#endif
