/* CPU training ops: the backward of each forward op, cross-entropy and AdamW. Large products go
 * to single-threaded OpenBLAS sgemm on slices that OpenMP threads own, as the forward matmul
 * does, so results do not depend on scheduling and a run repeats bit for bit. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/fake_quant.h"
#include "../quant/half.h"
#include "../quant/matmul.h"
#include "../quant/quantize.h"
#include "backend_cpu_train.h"
#include "../core/train_formulas.h"
#include "../core/cpu_scratch.h"
#include "../core/error.h"

/* Rows of a non-F32 weight converted to F32 at a time in matmul_backward_x. */
enum { DEQUANT_BLOCK_ROWS = 512 };
/* Values of dy and x rounded to BF16 at a time in matmul_backward_w (rows of both as many as fit). */
enum { ROUNDED_ELEMS = 8 << 20 };

static _Thread_local qlm_cpu_scratch t_wf, t_rounded, t_attn_rows, t_attn_work;

/* All parallelism comes from OpenMP: OpenBLAS is held at one thread while our threads call it
 * (its own pool would fight them for the cores), as quant/matmul.c does. */
static int blas_hold(void) {
    int t = omp_in_parallel() ? 1 : openblas_get_num_threads();
    if (t != 1) openblas_set_num_threads(1);
    return t;
}

static void blas_release(int t) {
    if (t != 1) openblas_set_num_threads(t);
}

/* dx (+)= dy[:, r0:r1] Wf[r0:r1, :], each thread a run of dx's columns; block holds Wf's rows
 * r0..r1-1 (F32, ld cols). */
static void gemm_dx_block(float *dx, const float *dy, int n, int rows, int cols, const float *block, int r0, int r1,
                          float beta) {
    int nt = omp_get_max_threads(), held = blas_hold();
#pragma omp parallel for num_threads(nt) if (n * (r1 - r0) > 32768)
    for (int t = 0; t < nt; t++) {
        int c0 = (int)((long)cols * t / nt), c1 = (int)((long)cols * (t + 1) / nt);
        if (c1 > c0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, c1 - c0, r1 - r0, 1.0f, dy + r0, rows,
                        block + c0, cols, beta, dx + c0, cols);
    }
    blas_release(held);
}

int qlm_cpu_matmul_backward_x(float *dx, const float *dy, int n, const qlm_weight *w, int accumulate) {
    int rows = w->rows, cols = w->cols;
    if (w->dtype == QLM_F32) {
        gemm_dx_block(dx, dy, n, rows, cols, w->data, 0, rows, accumulate ? 1.0f : 0.0f);
        return 0;
    }
    /* INT8 through AMX's integer tiles where the CPU has them (dy in a 24-bit integer form), else
     * converted to F32 block by block. */
    if (qlm_matmul_i8_xw(dx, dy, n, w, accumulate) == 0) return 0;
    float *wf = qlm_cpu_scratch_get(&t_wf, (size_t)DEQUANT_BLOCK_ROWS * cols);
    if (!wf) return qlm_errorf("out of memory for a %d x %d weight block", DEQUANT_BLOCK_ROWS, cols);
    for (int r0 = 0; r0 < rows; r0 += DEQUANT_BLOCK_ROWS) {
        int r1 = r0 + DEQUANT_BLOCK_ROWS < rows ? r0 + DEQUANT_BLOCK_ROWS : rows;
#pragma omp parallel for if ((r1 - r0) * cols > 65536)
        for (int r = r0; r < r1; r++) qlm_weight_row_f32(w, r, wf + (size_t)(r - r0) * cols);
        gemm_dx_block(dx, dy, n, rows, cols, wf, r0, r1, (accumulate || r0 > 0) ? 1.0f : 0.0f);
    }
    return 0;
}

/* dw += dy^T x, each thread a run of dw's rows. */
static void gemm_dw(float *dw, const float *dy, const float *x, int n, int rows, int cols) {
    int nt = omp_get_max_threads(), held = blas_hold();
#pragma omp parallel for num_threads(nt) if ((long)rows * cols > 32768)
    for (int t = 0; t < nt; t++) {
        int r0 = (int)((long)rows * t / nt), r1 = (int)((long)rows * (t + 1) / nt);
        if (r1 > r0)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1 - r0, cols, n, 1.0f, dy + r0, rows, x, cols, 1.0f,
                        dw + (size_t)r0 * cols, cols);
    }
    blas_release(held);
}

/* db[r] += dy[i][r] over i in order (the CUDA backend's order too). */
static void add_column_sums(float *db, const float *dy, int n, int rows) {
    int nt = omp_get_max_threads();
#pragma omp parallel for num_threads(nt) if ((long)n * rows > 32768)
    for (int t = 0; t < nt; t++) {
        int r0 = (int)((long)rows * t / nt), r1 = (int)((long)rows * (t + 1) / nt);
        for (int i = 0; i < n; i++)
            for (int r = r0; r < r1; r++) db[r] += dy[(size_t)i * rows + r];
    }
}

static void round_to_bf16(float *out, const float *in, long n) {
#pragma omp parallel for if (n > 65536)
    for (long i = 0; i < n; i++) out[i] = qlm_bf16_to_f32(qlm_f32_to_bf16(in[i]));
}

int qlm_cpu_matmul_backward_w(float *dw, float *db, const float *dy, const float *x, int n, int rows, int cols,
                              qlm_dtype inputs) {
    if (n <= 0 || rows <= 0 || cols <= 0) return 0;
    if (db) add_column_sums(db, dy, n, rows);
    if (inputs != QLM_BF16) {
        gemm_dw(dw, dy, x, n, rows, cols);
        return 0;
    }
    const long per_row = (long)rows + cols, fit = ROUNDED_ELEMS / per_row;
    const int chunk = fit < 1 ? 1 : fit < n ? (int)fit : n;
    float *dyr = qlm_cpu_scratch_get(&t_rounded, (size_t)chunk * per_row);
    if (!dyr) return qlm_errorf("out of memory for %d rows of dy and x rounded to BF16", chunk);
    float *xr = dyr + (size_t)chunk * rows;
    for (int i0 = 0; i0 < n; i0 += chunk) {
        const int nc = n - i0 < chunk ? n - i0 : chunk;
        round_to_bf16(dyr, dy + (size_t)i0 * rows, (long)nc * rows);
        round_to_bf16(xr, x + (size_t)i0 * cols, (long)nc * cols);
        gemm_dw(dw, dyr, xr, nc, rows, cols);
    }
    return 0;
}

void qlm_cpu_rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x, const float *weight, int n,
                              int dim, float eps) {
    int nt = omp_get_max_threads();
    float *partial = dweight ? calloc((size_t)nt * dim, sizeof *partial) : NULL;
#pragma omp parallel num_threads(nt)
    {
        float *dw = partial ? partial + (size_t)omp_get_thread_num() * dim : NULL;
#pragma omp for schedule(static)
        for (int i = 0; i < n; i++) {
            const float *xi = x + (size_t)i * dim, *gi = dout + (size_t)i * dim;
            float *dxi = dx + (size_t)i * dim;
            double ss = 0, dot = 0;
            for (int j = 0; j < dim; j++) {
                ss += (double)xi[j] * xi[j];
                dot += (double)xi[j] * weight[j] * gi[j];
            }
            float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
            float k = (float)(dot / dim) * inv * inv * inv;
            for (int j = 0; j < dim; j++) {
                dxi[j] += inv * weight[j] * gi[j] - k * xi[j];
                if (dw) dw[j] += xi[j] * inv * gi[j];
            }
        }
    }
    /* Per-thread partial sums added in thread order: the same result on every run. */
    if (!dweight) return;
    if (partial)
        for (int t = 0; t < nt; t++)
            for (int j = 0; j < dim; j++) dweight[j] += partial[(size_t)t * dim + j];
    else
        for (int i = 0; i < n; i++) { /* out of memory for partials: the serial sum */
            const float *xi = x + (size_t)i * dim, *gi = dout + (size_t)i * dim;
            double ss = 0;
            for (int j = 0; j < dim; j++) ss += (double)xi[j] * xi[j];
            float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
            for (int j = 0; j < dim; j++) dweight[j] += xi[j] * inv * gi[j];
        }
    free(partial);
}

void qlm_cpu_rope_backward(float *dq, float *dk, int n, const int *pos, int n_heads, int n_kv_heads, int head_dim,
                           const float *inv_freq) {
    /* a rotation's inverse */
    qlm_cpu_rope_rotate(dq, dk, n, pos, n_heads, n_kv_heads, head_dim, inv_freq, -1.0f);
}


/* Query head h: the softmax rows P (recomputed) and dP = dO V^T as two n x nk matrices, then
 * dS = P (dP - rowsum(P dP)) and the three products dQ = dS K, dK = dS^T Q, dV = P^T dO, each a
 * single-threaded sgemm. dq rows are overwritten; dk_h / dv_h are this head's own partials. */
static int attention_head_backward(float *dq, float *dk_h, float *dv_h, float *dbias_h, const float *dout,
                                   const float *q, const float *k, const float *v, int n, int nk, const int *pos,
                                   const qlm_attn_shape *sh, int h) {
    int D = sh->head_dim, kvh = h / (sh->n_heads / sh->n_kv_heads);
    int q_stride = sh->n_heads * D, kv_stride = sh->n_kv_heads * D;
    /* P, dP and, with a soft cap, each capped score's derivative 1 - tanh^2 */
    float *P = qlm_cpu_scratch_get(&t_attn_rows, (size_t)(sh->softcap > 0 ? 3 : 2) * n * nk);
    if (!P) return -1;
    float *dP = P + (size_t)n * nk, *dcap = dP + (size_t)n * nk;
    const float *qh = q + (size_t)h * D, *kh = k + (size_t)kvh * D, *vh = v + (size_t)kvh * D,
                *gh = dout + (size_t)h * D;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, nk, D, sh->scale, qh, q_stride, kh, kv_stride, 0.0f, P, nk);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, nk, D, 1.0f, gh, q_stride, vh, kv_stride, 0.0f, dP, nk);
    for (int i = 0; i < n; i++) {
        float *pi = P + (size_t)i * nk, *dpi = dP + (size_t)i * nk;
        /* Keys [first, seen): the causal prefix, or the fixed count, less what a window leaves out. */
        int seen = sh->n_keys > 0 ? sh->n_keys : pos[i] + 1;
        int first = sh->n_keys <= 0 && sh->window > 0 && pos[i] >= sh->window ? pos[i] - sh->window + 1 : 0;
        if (seen > nk) seen = nk;
        if (sh->softcap > 0)
            for (int t = first; t < seen; t++) {
                float th = tanhf(pi[t] / sh->softcap);
                pi[t] = sh->softcap * th;
                dcap[(size_t)i * nk + t] = 1.0f - th * th;
            }
        if (sh->pos_bias) {
            const float *bias = sh->pos_bias + (size_t)h * sh->pos_bias_span - pos[i] + sh->pos_bias_offset;
            for (int t = first; t < seen; t++) pi[t] += bias[t];
        }
        float mx = -INFINITY;
        for (int t = first; t < seen; t++) mx = pi[t] > mx ? pi[t] : mx;
        double sum = 0;
        for (int t = first; t < seen; t++) {
            pi[t] = expf(pi[t] - mx);
            sum += pi[t];
        }
        float inv = (float)(1.0 / sum), dot = 0;
        for (int t = first; t < seen; t++) {
            pi[t] *= inv;
            dot += pi[t] * dpi[t];
        }
        for (int t = first; t < seen; t++) {
            float ds = pi[t] * (dpi[t] - dot);
            if (dbias_h) dbias_h[t - pos[i] + sh->pos_bias_offset] += ds;
            if (sh->softcap > 0) ds *= dcap[(size_t)i * nk + t];
            dpi[t] = ds * sh->scale;
        }
        for (int t = 0; t < first; t++) pi[t] = dpi[t] = 0;
        for (int t = seen; t < nk; t++) pi[t] = dpi[t] = 0;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, D, nk, 1.0f, dP, nk, kh, kv_stride, 0.0f,
                dq + (size_t)h * D, q_stride);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, n, 1.0f, dP, nk, qh, q_stride, 0.0f, dk_h, D);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, n, 1.0f, P, nk, gh, q_stride, 0.0f, dv_h, D);
    return 0;
}

int qlm_cpu_attention_backward(float *dq, float *dk, float *dv, float *dpos_bias, const float *dout, const float *q,
                               const float *k, const float *v, int n, const int *pos, const qlm_attn_shape *sh) {
    int H = sh->n_heads, D = sh->head_dim, group = sh->n_heads / sh->n_kv_heads;
    int n_keys = sh->n_keys > 0 ? sh->n_keys : 0;
    for (int i = 0; i < n && sh->n_keys <= 0; i++)
        if (pos[i] + 1 > n_keys) n_keys = pos[i] + 1;
    size_t kv_stride = (size_t)sh->n_kv_heads * D, per_head = (size_t)n_keys * D;
    size_t bias_span = dpos_bias ? (size_t)sh->pos_bias_span : 0, stride = 2 * per_head + bias_span;
    /* Per query head: its dK and dV partials and its bias gradient. */
    float *work = qlm_cpu_scratch_get(&t_attn_work, (size_t)H * stride);
    if (!work) return qlm_errorf("out of memory for attention gradients over %d keys", n_keys);
    if (bias_span)
        for (int h = 0; h < H; h++) memset(work + (size_t)h * stride + 2 * per_head, 0, bias_span * sizeof *work);
    int failed = 0, held = blas_hold();
#pragma omp parallel for schedule(dynamic, 1) reduction(| : failed)
    for (int h = 0; h < H; h++) {
        float *w = work + (size_t)h * stride;
        failed |= attention_head_backward(dq, w, w + per_head, bias_span ? w + 2 * per_head : NULL, dout, q, k, v, n,
                                          n_keys, pos, sh, h) != 0;
    }
    blas_release(held);
    if (failed) return qlm_errorf("out of memory for attention scores of %d x %d", n, n_keys);
    /* The group's heads summed in head order, so the sums repeat exactly. */
#pragma omp parallel for
    for (int kvh = 0; kvh < sh->n_kv_heads; kvh++)
        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
            const float *w = work + (size_t)h * stride;
            for (int t = 0; t < n_keys; t++)
                for (int d = 0; d < D; d++) {
                    dk[t * kv_stride + (size_t)kvh * D + d] += w[(size_t)t * D + d];
                    dv[t * kv_stride + (size_t)kvh * D + d] += w[per_head + (size_t)t * D + d];
                }
        }
    for (int h = 0; h < H && bias_span; h++)
        for (size_t j = 0; j < bias_span; j++)
            dpos_bias[(size_t)h * sh->pos_bias_span + j] += work[(size_t)h * stride + 2 * per_head + j];
    return 0;
}

void qlm_cpu_glu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, long n,
                          qlm_act a) {
#pragma omp parallel for if (n > 4096)
    for (long i = 0; i < n; i++) {
        float value, d = qlm_act_grad(gate[i], a, &value), g = dout[i];
        dgate[i] = g * up[i] * d;
        dup[i] = g * value;
    }
}

void qlm_cpu_activate_backward(float *dx, const float *dout, const float *x, long n, qlm_act a) {
#pragma omp parallel for if (n > 4096)
    for (long i = 0; i < n; i++) {
        float value;
        dx[i] = dout[i] * qlm_act_grad(x[i], a, &value);
    }
}

void qlm_cpu_embedding_backward(float *dtable, const float *dout, const int *ids, int n, int dim) {
    for (int i = 0; i < n; i++) {
        float *row = dtable + (size_t)ids[i] * dim;
        const float *g = dout + (size_t)i * dim;
        for (int j = 0; j < dim; j++) row[j] += g[j];
    }
}

/* A row's largest (capped) logit and the sum of exp(logit - largest), in double. */
static float row_max(const float *l, int vocab, float softcap) {
    float mx = -INFINITY;
    for (int j = 0; j < vocab; j++) {
        float x = qlm_softcapped(l[j], softcap);
        if (x > mx) mx = x;
    }
    return mx;
}

static double row_exp_sum(const float *l, int vocab, float softcap, float mx) {
    double sum = 0;
    for (int j = 0; j < vocab; j++) sum += exp((double)(qlm_softcapped(l[j], softcap) - mx));
    return sum;
}

void qlm_cpu_cross_entropy(float *row_loss, float *logits, const int *targets, const float *teacher, int n, int vocab,
                           float grad_scale, float softcap) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        float *l = logits + (size_t)i * vocab;
        row_loss[i] = 0;
        if (targets[i] < 0) {
            memset(l, 0, (size_t)vocab * sizeof *l);
            continue;
        }
        if (softcap > 0)
            for (int j = 0; j < vocab; j++) l[j] = qlm_softcapped(l[j], softcap);
        float mx = row_max(l, vocab, 0);
        double sum = row_exp_sum(l, vocab, 0, mx), log_sum = log(sum);
        float inv = (float)(1.0 / sum);
        const float *t = teacher ? teacher + (size_t)i * vocab : NULL;
        float t_mx = 0;
        double t_log_sum = 0, kl = 0;
        if (t) {
            t_mx = row_max(t, vocab, softcap);
            t_log_sum = log(row_exp_sum(t, vocab, softcap, t_mx));
        } else {
            row_loss[i] = (float)(log_sum - (double)(l[targets[i]] - mx));
        }
        for (int j = 0; j < vocab; j++) {
            double log_pt = t ? (double)(qlm_softcapped(t[j], softcap) - t_mx) - t_log_sum : 0;
            l[j] = qlm_cross_entropy_grad(l[j], mx, inv, log_sum, grad_scale, softcap, t != NULL, log_pt,
                                          j == targets[i], &kl);
        }
        if (t) row_loss[i] = (float)kl;
    }
}

enum { REDUCE_CHUNK = 1 << 16 };

static double sum_squares_of(const float *x, long n) {
    long n_chunks = (n + REDUCE_CHUNK - 1) / REDUCE_CHUNK;
    double total = 0;
    /* Fixed chunks summed in order: independent of the thread count. */
#pragma omp parallel for ordered schedule(static) if (n_chunks > 1)
    for (long c = 0; c < n_chunks; c++) {
        long end = (c + 1) * REDUCE_CHUNK < n ? (c + 1) * REDUCE_CHUNK : n;
        double s = 0;
        for (long i = c * REDUCE_CHUNK; i < end; i++) s += (double)x[i] * x[i];
#pragma omp ordered
        total += s;
    }
    return total;
}

void qlm_cpu_sum_squares(double *out, const float *const *x, const long *n, int count) {
    for (int i = 0; i < count; i++) out[i] = sum_squares_of(x[i], n[i]);
}

void qlm_cpu_scale(float *x, long n, float s) {
#pragma omp parallel for if (n > 65536)
    for (long i = 0; i < n; i++) x[i] *= s;
}

void qlm_cpu_zero(float *x, long n) { memset(x, 0, (size_t)n * sizeof *x); }

void qlm_cpu_dropout(float *out, const float *x, long n, float p, uint64_t seed, long first) {
#pragma omp parallel if (n > 65536)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const long i0 = n * t / nt, i1 = n * (t + 1) / nt;
        qlm_dropout_f32(out + i0, x + i0, i1 - i0, p, seed, first + i0);
    }
}

void qlm_cpu_adamw(const qlm_adamw_tensors *t, const qlm_adamw_step *h) {
    for (int j = 0; j < t->count; j++) {
        const qlm_adamw_consts c = qlm_adamw_constants(h, t->decay[j]);
        float *p = t->p[j], *m = t->m[j], *v = t->v[j];
        const float *gj = t->g[j];
        const long n = t->n[j];
#pragma omp parallel for if (n > 65536)
        for (long i = 0; i < n; i++) {
            const float g = gj[i] * c.grad_mul;
            p[i] *= c.decay;
            m[i] += c.one_minus_b1 * (g - m[i]);
            v[i] = v[i] * c.b2 + c.one_minus_b2 * g * g;
            p[i] -= c.step_size * m[i] / (sqrtf(v[i]) / c.bc2_sqrt + c.eps);
        }
    }
}

void qlm_cpu_store_weight(qlm_weight *w, const float *src) {
    long n = (long)w->rows * w->cols;
    void *dst = (void *)w->data;
    switch (w->dtype) {
    case QLM_BF16: qlm_f32_to_bf16_n(dst, src, n); break;
    case QLM_F16: qlm_f32_to_f16_n(dst, src, n); break;
    default: memcpy(dst, src, (size_t)n * sizeof *src); break;
    }
}

/* The fake-quantization ops are quant/fake_quant.c's functions, picked by the scales' layout. */
void qlm_cpu_fake_quant_forward(float *out, const float *w, int rows, int cols, const float *scales, int per_row,
                                int qmin, int qmax) {
    if (per_row) qlm_fake_quant_forward_rows(out, w, rows, cols, scales, qmin, qmax);
    else qlm_fake_quant_forward(out, w, (long)rows * cols, scales[0], qmin, qmax);
}

void qlm_cpu_fake_quant_backward(float *dw, float *dscales, const float *dout, const float *w, int rows, int cols,
                                 const float *scales, int per_row, int qmin, int qmax, float grad_factor) {
    if (per_row) qlm_fake_quant_backward_rows(dw, dscales, dout, w, rows, cols, scales, qmin, qmax, grad_factor);
    else qlm_fake_quant_backward(dw, dscales, dout, w, (long)rows * cols, scales[0], qmin, qmax, grad_factor);
}
