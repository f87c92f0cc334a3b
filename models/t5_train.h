/* Training pass of T5 encoder-decoders, as core/llama_train.h is for the Llama family: the encoder
 * over the inputs, the decoder over the shifted targets with cross-attention, the loss, and the
 * backward of every block (self-attention with the relative-position bias and its gradient,
 * cross-attention whose key/value gradients flow back into the encoder, gated-GELU or ReLU
 * feed-forward), written against the op table. */
#ifndef QLM_T5_TRAIN_H
#define QLM_T5_TRAIN_H

#include "adapter.h"
#include "t5.h"
#include "train_batch.h"

typedef struct {
    float *xn1, *q, *k, *v, *att, *x_mid;      /* self-attention */
    float *xnc, *cq, *ck, *cv, *catt, *x_mid2; /* decoder: cross-attention (ck, cv over input rows) */
    float *xn2, *h0, *h1, *h;                  /* feed-forward (h1: gated only) */
    float *lora_u[QLM_LORA_WO + 1]; /* T5's targets */
} qlm_t5_trace;

typedef struct {
    int max_src, max_tgt, max_len, recompute, lora_rank;
    float **enc_x, **dec_x;      /* each block's input, then the stack's last output */
    float *enc_out, *d_enc_out;
    qlm_t5_trace *enc_tr, *dec_tr;
    int n_enc_tr, n_dec_tr;
    float *dx, *dxn, *dq, *dk, *dv, *datt, *dh0, *dh1, *tmp, *tmp_in, *lora_du, *d_head_norm;
    float *enc_bias, *dec_bias, *d_enc_bias, *d_dec_bias; /* [heads][2 max_len - 1] by key - query */
    int span;
    int *iota;                   /* positions 0 .. max_len - 1 */
    float *bias_host;            /* host room for one table and the [buckets][heads] parameters */
    float *head_x, *head_xn, *logits, *row_loss;
    int *head_rows, *head_targets;
    float *head_losses;          /* host: the target rows' losses */
    double peak_bytes;
} qlm_t5_train_state;

/* Room for batches of up to max_src input and max_tgt output rows, sequences up to max_len tokens. */
int qlm_t5_train_state_init(qlm_t5_train_state *s, const qlm_t5_model *m, int max_src, int max_tgt, int max_len,
                            int recompute, int lora_rank);
void qlm_t5_train_state_free(qlm_t5_train_state *s, const qlm_t5_model *m);

/* As qlm_llama_train_pass: grads is a model-shaped view of F32 gradients (NULL: frozen base). */
int qlm_t5_train_pass(const qlm_t5_model *m, const qlm_t5_model *grads, const qlm_lora_train *lora,
                      qlm_t5_train_state *s, const qlm_train_batch *b, float grad_scale, int backward,
                      double *loss_sum);

#endif
