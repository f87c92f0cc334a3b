/* The CPU backend's training ops (core/backend_cpu_train.c), gathered into the op table by
 * core/backend_cpu.c. Semantics: core/backend.h. */
#ifndef QLM_BACKEND_CPU_TRAIN_H
#define QLM_BACKEND_CPU_TRAIN_H

#include "../core/backend.h"

int qlm_cpu_matmul_backward_x(float *dx, const float *dy, int n, const qlm_weight *w, int accumulate);
int qlm_cpu_matmul_backward_w(float *dw, float *db, const float *dy, const float *x, int n, int rows, int cols,
                              qlm_dtype inputs);
void qlm_cpu_rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x, const float *weight, int n,
                              int dim, float eps);
/* Rotate-half RoPE of queries and keys by +angle (direction 1: the forward) or -angle (-1: its
 * backward), in place. */
void qlm_cpu_rope_rotate(float *q, float *k, int n, const int *pos, int n_heads, int n_kv_heads, int head_dim,
                         const float *inv_freq, float direction);
void qlm_cpu_rope_backward(float *dq, float *dk, int n, const int *pos, int n_heads, int n_kv_heads, int head_dim,
                           const float *inv_freq);
int qlm_cpu_attention_backward(float *dq, float *dk, float *dv, float *dpos_bias, const float *dout, const float *q,
                               const float *k, const float *v, int n, const int *pos, const qlm_attn_shape *sh);
void qlm_cpu_glu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, long n,
                          qlm_act a);
void qlm_cpu_activate_backward(float *dx, const float *dout, const float *x, long n, qlm_act a);
void qlm_cpu_embedding_backward(float *dtable, const float *dout, const int *ids, int n, int dim);
void qlm_cpu_cross_entropy(float *row_loss, float *logits, const int *targets, const float *teacher, int n, int vocab,
                           float grad_scale, float softcap);
void qlm_cpu_sum_squares(double *out, const float *const *x, const long *n, int count);
void qlm_cpu_scale(float *x, long n, float s);
void qlm_cpu_zero(float *x, long n);
void qlm_cpu_dropout(float *out, const float *x, long n, float p, uint64_t seed, long first);
void qlm_cpu_adamw(const qlm_adamw_tensors *t, const qlm_adamw_step *h);
void qlm_cpu_store_weight(qlm_weight *w, const float *src);
void qlm_cpu_fake_quant_forward(float *out, const float *w, int rows, int cols, const float *scales, int per_row,
                                int qmin, int qmax);
void qlm_cpu_fake_quant_backward(float *dw, float *dscales, const float *dout, const float *w, int rows, int cols,
                                 const float *scales, int per_row, int qmin, int qmax, float grad_factor);

#endif
