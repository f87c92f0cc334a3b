/* The op table: everything a model architecture needs from a device. Model code
 * (core/llama.c) is written once against these ops; the CPU backend (core/backend_cpu.c)
 * and the CUDA backend (cuda/) implement them. Pointers to activations, caches and weights
 * are device memory of the backend that allocated them; the small integer arrays an op takes
 * (token ids, positions, slots, slot_keys) and the per-row LoRA table are host memory, which a
 * GPU backend copies itself. */
#ifndef QLM_BACKEND_H
#define QLM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "weight.h"

/* Shape of one attention call over a KV cache: by default laid out as [max_seq][n_kv_heads * head_dim],
 * or as row_stride and head_stride say. */
typedef struct {
    int n_heads, n_kv_heads, head_dim;
    float scale; /* softmax scale: 1/sqrt(head_dim) for Llama, 1 for T5 */
    /* 0: causal, query row i sees cache rows 0..pos[i]. > 0: every row sees rows 0..n_keys-1
     * (T5's encoder and cross-attention). */
    int n_keys;
    /* Causal only: > 0 limits row i to the last `window` keys, pos[i] - window + 1 .. pos[i]
     * (sliding-window attention); 0: the whole prefix. */
    int window;
    /* > 0: the caches roll: key t lies in row t % ring (a window's cache that holds only the rows a
     * step can see, core/kv_cache.h); every key a call's rows see must still be there (the window
     * plus the call's own rows of a sequence fit in ring). 0: key t in row t. */
    int ring;
    /* > 0: scores (after the scale) become softcap * tanh(score / softcap) (Gemma 2; never with
     * pos_bias). */
    float softcap;
    /* NULL, or an additive score bias by relative position (T5): for query position p and key
     * row t, pos_bias[h * pos_bias_span + t - p + pos_bias_offset]. */
    const float *pos_bias;
    int pos_bias_span, pos_bias_offset;
    /* NULL: every row attends over the cache given. Else the rows are a batch of sequences, one
     * cache each: row i's keys and values start slots[i] * slot_stride floats into the cache, and
     * with n_keys > 0 it sees slot_keys[slots[i]] of them. One call serves the whole batch. */
    const int *slots;
    size_t slot_stride;
    const int *slot_keys;
    /* Where a sequence's keys (and values) lie: key row t of KV head h starts h * head_stride +
     * t * row_stride floats in. Both 0: the default, row_stride = n_kv_heads * head_dim and
     * head_stride = head_dim. A decode cache takes head_stride = max_seq * head_dim and
     * row_stride = head_dim, so that each head's keys are one contiguous run that memory streams. */
    size_t row_stride, head_stride;
    /* With n_keys > 0 and row_stride = head_dim: a sequence's heads lie back to back, head h of
     * one with K keys from h * K * head_dim (head_stride unused). Caches whose keys are all stored
     * at once (T5's cross-attention) take this layout, so that one sequence's keys (and values)
     * are one run that memory streams rather than a run per head with gaps between. */
    int heads_packed;
    /* The dtype of the keys and values: F32 (0), or the BF16 or F16 of a decode cache
     * (qlm_kv_dtype in core/kv_cache.h); strides count elements either way. */
    qlm_dtype kv_dtype;
} qlm_attn_shape;

/* One LoRA pair as the lora op applies it: y += scale * B (A x), A [r][in], B [out][r]. */
typedef struct {
    const qlm_weight *a, *b;
    float scale;
} qlm_lora_ref;

/* The lora op's grouping: the rows of per_row[0..n) that share row i's pair go to rows (their
 * count is returned); 0 when row i has no pair or an earlier row has the same one. */
static inline int qlm_lora_group(const qlm_lora_ref *const *per_row, int n, int i, int *rows) {
    const qlm_lora_ref *ref = per_row[i];
    if (!ref) return 0;
    for (int k = 0; k < i; k++)
        if (per_row[k] == ref) return 0;
    int m = 0;
    for (int k = i; k < n; k++)
        if (per_row[k] == ref) rows[m++] = k;
    return m;
}

/* Activation functions of the feed-forward blocks. */
typedef enum {
    QLM_ACT_SILU,      /* x * sigmoid(x): Llama's SwiGLU */
    QLM_ACT_GELU_TANH, /* GELU, tanh approximation ("gelu_new"): T5 v1.1 / FLAN-T5 */
    QLM_ACT_RELU,      /* original T5 */
    QLM_ACT_GELU,      /* exact GELU, x * Phi(x) (hidden_act "gelu") */
} qlm_act;

/* The op before a product that makes its x, run by step_matmul_group in the product's own pass
 * where the backend can: x = rmsnorm(a) * weight (RMSNORM, eps), or act(a) * b (GLU; act(a) alone
 * with b NULL). x ([n][cols], cols the weights' width) is written either way, for what reads it
 * next (LoRA); it aliases neither a nor b. */
typedef enum { QLM_X_RMSNORM, QLM_X_GLU } qlm_x_kind;
typedef struct {
    qlm_x_kind kind;
    float *x;
    const float *a, *b, *weight;
    float eps;
    qlm_act act;
} qlm_x_step;

/* What follows the products of q, k and v (one group, in that order) in a step of attention:
 * RoPE (rotate-half over inv_freq's head_dim/2 frequencies; NULL: none) on q and k, row i at
 * position pos[i], then row i of k and v into the caches at position store_pos[i] of slot slots[i]
 * (slots NULL: slot 0) as kv_store lays them out, in the caches' dtype kv; max_pos positions a slot.
 * rope_store runs it alone; step_matmul_group in the products' own pass where the backend can. */
typedef struct {
    const int *pos;
    const float *inv_freq;
    int n_heads, n_kv_heads, head_dim;
    void *k_cache, *v_cache;
    qlm_dtype kv;
    const int *slots, *store_pos;
    int max_pos;
} qlm_kv_step;

/* One AdamW update as torch.optim.AdamW computes it (decoupled weight decay, bias correction). The
 * hyper-parameters are doubles, as torch's are Python floats: each of the update's constants (1 -
 * lr * decay, 1 - beta, lr over the bias correction ...) is computed from them in double and rounded
 * to float once, as torch rounds a Python scalar for a float32 tensor. From float hyper-parameters
 * 1 - 0.999f is 1.3e-5 away from torch's 0.001f and 1 - 0.999f^1 5e-5 from its first correction. */
typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    long step;      /* 1 for the first update */
    float grad_mul; /* each gradient is multiplied by this first: the clip factor over the loss scale (1: none) */
} qlm_adamw_step;

/* The tensors one optimizer step updates (a trainer builds the list once): tensor i's n[i]
 * parameters p[i], gradients g[i] and moments m[i], v[i]; decay[i] 0 exempts it from weight decay. */
typedef struct {
    float *const *p, *const *m, *const *v;
    const float *const *g;
    const long *n;
    const unsigned char *decay;
    int count;
} qlm_adamw_tensors;

typedef struct qlm_backend {
    const char *name;
    /* 1 when device memory is host memory (the CPU): model code then reads and writes its
     * buffers directly instead of staging them through to_host. */
    int host_memory;
    /* 1 when the matrix ops take weights in the block types (Q8_0, Q4_0, Q4_1). */
    int block_weights;
    /* 1 when they take weights with act8 set (W8A8, qlm_weight). */
    int act8_weights;
    /* Device memory for activations and caches; NULL (message set) when out of memory. */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    /* Moves a buffer of parameters (host memory from malloc) into device memory and returns the
     * pointer to use from then on, which free releases; the host buffer is then the caller's to
     * free unless the same pointer came back (the CPU keeps it as it is). NULL (message set)
     * when out of memory. */
    void *(*upload)(void *host, size_t bytes);
    /* The device memory's bandwidth in GB/s as the bound of memory-bound kernels (CPU: a
     * timed read; GPU: a timed device-to-device copy, bytes read plus written); -1 on error. */
    double (*bandwidth_gbs)(void);
    /* One line naming the device and its memory, for `qlm info` and logs. */
    void (*describe)(char *out, size_t len);

    /* y[n][rows] = x[n][cols] W^T (+ bias) */
    void (*matmul)(float *y, const float *x, int n, const qlm_weight *w, const float *bias);
    /* matmul for each of count weights that multiply the same x, as one operation (one parallel
     * region on the CPU); products that add (qlm_matmul_out.add) add to y. Returns -1 (message
     * set) only when scratch memory cannot be had. */
    int (*matmul_group)(const qlm_matmul_out *outs, int count, const float *x, int n);
    /* The step's op, then matmul_group over its x, then (kv not NULL; outs are q, k and v) the kv
     * step, as one operation: a GPU's GEMV forms each value of x as it loads it and rotates and
     * stores its outputs as it makes them, one kernel instead of three (decode on a GPU is bound
     * by its count of kernels). The same values as the ops one after the other. */
    int (*step_matmul_group)(const qlm_matmul_out *outs, int count, const qlm_x_step *step, const qlm_kv_step *kv,
                             int n);
    /* Unmerged LoRA on top of a matmul's output: y[i] += scale B (A x[i]) with row i's own pair
     * (per_row[i]; NULL: none), so one call serves a batch that mixes adapters. Returns -1
     * (message set) only when scratch memory cannot be had. */
    int (*lora)(float *y, const float *x, int n, const qlm_lora_ref *const *per_row);
    /* out[i] = x[i] / rms(x[i]) * weight, for n rows of dim values */
    void (*rmsnorm)(float *out, const float *x, const float *weight, int n, int dim, float eps);
    /* Rotate-half RoPE in place on a step's queries (n rows of n_heads*head_dim values) and keys
     * (n rows of n_kv_heads*head_dim); row i at position pos[i]. inv_freq has head_dim/2 entries. */
    void (*rope)(float *q, float *k, int n, const int *pos, int n_heads, int n_kv_heads, int head_dim,
                 const float *inv_freq);
    /* Attention of n query rows over the cache (k_cache/v_cache: [rows][n_kv_heads*head_dim] or as
     * the shape's strides say),
     * causal or over a fixed key count, with an optional relative-position bias (see
     * qlm_attn_shape). pos[i] is query row i's position. out: [n][n_heads*head_dim]. */
    void (*attention)(float *out, const float *q, const void *k_cache, const void *v_cache, int n,
                      const int *pos, const qlm_attn_shape *shape);
    /* out = act(gate) * up, elementwise over n values (out may alias gate). */
    void (*glu)(float *out, const float *gate, const float *up, long n, qlm_act act);
    /* x = act(x) in place over n values. */
    void (*activate)(float *x, long n, qlm_act act);
    /* y += x over n values. */
    void (*add)(float *y, const float *x, long n);
    /* out[i] = row ids[i] of the table, as F32. */
    void (*embedding)(float *out, const qlm_weight *table, const int *ids, int n);
    /* Copies n floats between device buffers. */
    void (*copy)(float *dst, const float *src, long n);
    /* Row i of k and of v ([n][heads * hd]) goes to position pos[i] of slot slots[i] (slots NULL:
     * of `slot`) of the key and value caches laid out as core/kv_cache.h says, in the caches' dtype
     * kv (F32, or BF16 or F16 rounded to nearest even; F16 held within its finite range). */
    void (*kv_store)(void *k_cache, void *v_cache, qlm_dtype kv, const float *k, const float *v, int n, const int *slots,
                     int slot, const int *pos, int heads, int hd, int max_pos);
    /* The kv step (rope on q and k, then k and v into the caches) on n rows, as one op. */
    void (*rope_store)(float *q, float *k, const float *v, int n, const qlm_kv_step *kv);
    /* Copies bytes from host memory into device memory (tables computed on the host). */
    void (*to_device)(void *dst, const void *src, size_t bytes);
    /* Copies bytes from device memory into host memory. */
    void (*to_host)(void *dst, const void *src, size_t bytes);

    /* ---- training: the backward of each forward op, the loss and the optimizer. Gradients
     * are F32 and accumulate (+=) unless the op says otherwise. A backend without them (NULL
     * matmul_backward_x) runs inference only. ---- */
    /* dx[n][cols] = dy[n][rows] W (accumulate 0), or += (accumulate 1); W in any storage dtype. */
    int (*matmul_backward_x)(float *dx, const float *dy, int n, const qlm_weight *w, int accumulate);
    /* dw[rows][cols] += dy^T x, db[rows] += the column sums of dy (db NULL: no bias). inputs QLM_BF16
     * (the gradient of a BF16 compute copy): dy and x enter the product rounded to BF16, with F32
     * sums, as the forward's x enters a BF16 matmul (torch's autocast does the same); QLM_F32: as
     * they are. db always sums dy as it is. 0, or -1 with the error set (no scratch for the rounding). */
    int (*matmul_backward_w)(float *dw, float *db, const float *dy, const float *x, int n, int rows, int cols,
                             qlm_dtype inputs);
    /* dx += the gradient through out = rmsnorm(x) * weight; dweight += its gradient (NULL: not wanted). */
    void (*rmsnorm_backward)(float *dx, float *dweight, const float *dout, const float *x, const float *weight,
                             int n, int dim, float eps);
    /* The inverse rotation of rope, in place: the backward of rope. */
    void (*rope_backward)(float *dq, float *dk, int n, const int *pos, int n_heads, int n_kv_heads, int head_dim,
                          const float *inv_freq);
    /* Gradients of attention (same shapes and masking as attention; k, v hold the keys the queries
     * saw): dq = (overwritten), dk, dv and dpos_bias (NULL: no bias, else [n_heads][pos_bias_span])
     * accumulate. The softmax is recomputed, so no n x n matrix is kept between the passes. */
    int (*attention_backward)(float *dq, float *dk, float *dv, float *dpos_bias, const float *dout, const float *q,
                               const float *k, const float *v, int n, const int *pos, const qlm_attn_shape *shape);
    /* dgate, dup = (overwritten) the gradients through out = act(gate) * up. */
    void (*glu_backward)(float *dgate, float *dup, const float *dout, const float *gate, const float *up, long n,
                         qlm_act act);
    /* dx = dout * act'(x), in place over dout allowed (dx == dout). */
    void (*activate_backward)(float *dx, const float *dout, const float *x, long n, qlm_act act);
    /* dtable[ids[i]] += dout[i] (F32 table of rows x dim). */
    void (*embedding_backward)(float *dtable, const float *dout, const int *ids, int n, int dim);
    /* Cross-entropy of n rows of logits against targets (-1: not a target): row_loss[i] is row i's
     * loss in nats (0 where no target), and the logits are replaced by their gradient times
     * grad_scale: grad_scale * (softmax - onehot), zero rows where the target is -1. With teacher
     * ([n][vocab] another model's logits for the same rows; NULL: none) the target of a row is the
     * teacher's distribution instead of its token: the loss is KL(teacher || softmax) and the
     * gradient grad_scale * (softmax - teacher's softmax). softcap > 0: both are of
     * softcap * tanh(logit / softcap), and the gradient goes through the cap. */
    void (*cross_entropy)(float *row_loss, float *logits, const int *targets, const float *teacher, int n, int vocab,
                          float grad_scale, float softcap);
    /* out[i] = the sum of squares of x[i]'s n[i] values in double, for count arrays (a gradient
     * norm's tensors) in one call, so that a device that queues work is waited for once; inf and
     * NaN propagate. */
    void (*sum_squares)(double *out, const float *const *x, const long *n, int count);
    /* x *= s over n values. */
    void (*scale)(float *x, long n, float s);
    /* out = x * keep / (1 - p), keep[i] = 0 with probability p, a pure function of (seed, first + i):
     * applying it again with the same seed and first is its backward. out may alias x. */
    void (*dropout)(float *out, const float *x, long n, float p, uint64_t seed, long first);
    /* x = 0 over n values. */
    void (*zero)(float *x, long n);
    /* One AdamW update of every tensor of the list (in one launch where the device queues work:
     * a LoRA adapter has hundreds of small tensors). */
    void (*adamw)(const qlm_adamw_tensors *t, const qlm_adamw_step *h);
    /* Stores F32 values into a weight in its storage dtype (F32, BF16 or F16): the compute copy of
     * F32 master weights in mixed-precision training. */
    void (*store_weight)(qlm_weight *w, const float *src);
    /* QAT's fake quantization with learned scales, as quant/fake_quant.h defines it (formulas,
     * rounding, non-finite values): out[rows][cols] = clamp(round(w * (1/s)), qmin, qmax) * s,
     * s = scales[r] for row r (per_row 1) or scales[0] for all (per_row 0). out may alias w. */
    void (*fake_quant_forward)(float *out, const float *w, int rows, int cols, const float *scales, int per_row,
                               int qmin, int qmax);
    /* Its backward for the upstream gradient dout: dw += the straight-through gradient, and
     * dscales[r] (per_row) or dscales[0] += the LSQ scale gradient times grad_factor, summed in
     * double in an order fixed by the shape, so it repeats bit for bit. dw or dscales may be NULL. */
    void (*fake_quant_backward)(float *dw, float *dscales, const float *dout, const float *w, int rows, int cols,
                                const float *scales, int per_row, int qmin, int qmax, float grad_factor);
    /* Raises n learned scales (NaN ones too) to the floor QLM_FAKE_QUANT_MIN_SCALE (FLT_EPSILON), as
     * torch does before each forward: after every optimizer step. */
    void (*fake_quant_clamp_scales)(float *scales, long n);
} qlm_backend;

/* logits[n][vocab] (host memory) = x lm_head^T for the x that the final norm makes (a step, run
 * in the head's own pass where the backend can), through dev ([n][vocab] of device memory) where
 * the backend's memory is not host memory (dev NULL: straight into logits). -1 (message set) when
 * scratch memory cannot be had. */
static inline int qlm_logits_out(const qlm_backend *be, float *logits, float *dev, const qlm_x_step *norm, int n,
                                 const qlm_weight *lm_head) {
    const qlm_matmul_out out = {dev ? dev : logits, lm_head, NULL, 0};
    if (be->step_matmul_group(&out, 1, norm, NULL, n) != 0) return -1;
    if (dev) be->to_host(logits, dev, (size_t)n * lm_head->rows * sizeof(float));
    return 0;
}

/* step_matmul_group as its ops one after the other: the CPU's, and a GPU's where its GEMV does not
 * take the shapes. */
static inline int qlm_step_then_matmul_group(const qlm_backend *be, const qlm_matmul_out *outs, int count,
                                             const qlm_x_step *step, const qlm_kv_step *kv, int n) {
    const int cols = outs[0].w->cols;
    const long values = (long)n * cols;
    if (step->kind == QLM_X_RMSNORM) {
        be->rmsnorm(step->x, step->a, step->weight, n, cols, step->eps);
    } else if (step->b) {
        be->glu(step->x, step->a, step->b, values, step->act);
    } else {
        be->copy(step->x, step->a, values);
        be->activate(step->x, values, step->act);
    }
    if (be->matmul_group(outs, count, step->x, n) != 0) return -1;
    if (kv) be->rope_store(outs[0].y, outs[1].y, outs[2].y, n, kv);
    return 0;
}

const qlm_backend *qlm_backend_cpu(void);
/* The CUDA backend, or NULL with an error message when qlm was built without CUDA or
 * no GPU is present. */
const qlm_backend *qlm_backend_cuda(void);
/* "cpu", "cuda", or "auto" (CUDA when available, else CPU). */
const qlm_backend *qlm_backend_by_name(const char *name);

#endif
