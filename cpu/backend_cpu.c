/* CPU implementation of the op table: OpenMP across rows/heads, SIMD matmuls from quant/. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../quant/fake_quant.h"
#include "../quant/half.h"
#include "../quant/matmul.h"
#include "../quant/quantize.h"
#include "../core/backend.h"
#include "backend_cpu_attention.h"
#include "backend_cpu_lora.h"
#include "backend_cpu_train.h"
#include "../core/cpu_scratch.h"
#include "../core/error.h"
#include "../core/kv_cache.h"
#include "membw.h"

/* body for i = 0 .. n - 1, split over the threads when `parallel` holds. A region that an if clause
 * keeps to one thread still costs a libgomp team (~0.4 us against ~0.3 us for a 576-float add),
 * which a decode token would pay ~120 times (its norms, RoPE and GLU at one row). */
#define CPU_FOR(i, n, parallel, body)                                                                \
    do {                                                                                             \
        const long cpu_for_n = (n);                                                                  \
        if (parallel) {                                                                              \
            _Pragma("omp parallel for") for (long i = 0; i < cpu_for_n; i++) body;                  \
        } else {                                                                                     \
            for (long i = 0; i < cpu_for_n; i++) body;                                               \
        }                                                                                            \
    } while (0)

static void *cpu_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

static void cpu_free(void *p) { free(p); }

static void *cpu_upload(void *host, size_t bytes) {
    (void)bytes;
    return host;
}

static void cpu_describe(char *out, size_t len) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    snprintf(out, len, "cpu: %d threads, %.1f GiB of memory", omp_get_max_threads(),
             pages > 0 && page > 0 ? (double)pages * page / 1073741824.0 : 0.0);
}

/* n values from src as cache elements of dtype kv. F16 holds values past its largest finite
 * one at it: an infinite key would make every score of its head NaN. Rounding already takes
 * values below 65520 to 65504, so the infinities the conversion made are what is held. */
static void kv_store_row(void *dst, qlm_dtype kv, const float *src, int n) {
    qlm_convert_from_f32(dst, kv, src, n);
    if (kv != QLM_F16) return;
    uint16_t *h = dst;
    for (int i = 0; i < n; i++)
        if ((h[i] & 0x7fffu) == QLM_F16_INF) h[i] = (uint16_t)((h[i] & 0x8000u) | QLM_F16_MAX_BITS);
}

/* Row i's keys and values into its slot's caches at position pos[i]. */
static void kv_store_one(void *k_cache, void *v_cache, qlm_dtype kv, const float *k, const float *v, int i,
                         const int *slots, int slot, const int *pos, int heads, int hd, int max_pos) {
    size_t run = (size_t)max_pos * hd, esize = qlm_kv_elem_size(kv);
    size_t base = (size_t)(slots ? slots[i] : slot) * heads * run + (size_t)pos[i] * hd;
    for (int h = 0; h < heads; h++) {
        size_t at = (base + h * run) * esize, from = ((size_t)i * heads + h) * hd;
        kv_store_row((char *)k_cache + at, kv, k + from, hd);
        kv_store_row((char *)v_cache + at, kv, v + from, hd);
    }
}

/* Rows store apart (no two rows of a call share a slot and position: a ring holds a call's rows),
 * so a prompt's rows are split over the threads rather than converted by one while the others wait. */
static void cpu_kv_store(void *k_cache, void *v_cache, qlm_dtype kv, const float *k, const float *v, int n,
                         const int *slots, int slot, const int *pos, int heads, int hd, int max_pos) {
    CPU_FOR(i, n, n > 1, kv_store_one(k_cache, v_cache, kv, k, v, (int)i, slots, slot, pos, heads, hd, max_pos));
}

/* Lanes of sum_squares: a double sum in order does not vectorize; 8 running sums do, and each is
 * in order, so every clone (one per instruction set, picked at load time) gives the same bits. */
#define SS_LANES 8

__attribute__((target_clones("avx512f", "avx2", "default"))) static double sum_squares(const float *x, int n) {
    double acc[SS_LANES] = {0};
    int j = 0;
    for (; j + SS_LANES <= n; j += SS_LANES)
        for (int l = 0; l < SS_LANES; l++) acc[l] += (double)x[j + l] * x[j + l];
    for (; j < n; j++) acc[0] += (double)x[j] * x[j];
    double ss = 0;
    for (int l = 0; l < SS_LANES; l++) ss += acc[l];
    return ss;
}

static void rmsnorm_row(float *oi, const float *xi, const float *weight, int dim, float eps) {
    float inv = 1.0f / sqrtf((float)(sum_squares(xi, dim) / dim) + eps);
    for (int j = 0; j < dim; j++) oi[j] = xi[j] * inv * weight[j];
}

static void cpu_rmsnorm(float *out, const float *x, const float *weight, int n, int dim, float eps) {
    CPU_FOR(i, n, n > 1, rmsnorm_row(out + (size_t)i * dim, x + (size_t)i * dim, weight, dim, eps));
}

/* Row i of q and k rotated; each (row, frequency) angle is computed once for the query heads and
 * the key heads. */
static void rope_row(float *q, float *k, int i, const int *pos, int n_heads, int n_kv_heads, int head_dim,
                     const float *inv_freq, float direction) {
    int half = head_dim / 2;
    for (int j = 0; j < half; j++) {
        float angle = (float)pos[i] * inv_freq[j];
        float c = cosf(angle), s = direction * sinf(angle);
        for (int h = 0; h < n_heads + n_kv_heads; h++) {
            float *v = h < n_heads ? q + ((size_t)i * n_heads + h) * head_dim
                                   : k + ((size_t)i * n_kv_heads + h - n_heads) * head_dim;
            float a = v[j], b = v[j + half];
            v[j] = a * c - b * s;
            v[j + half] = b * c + a * s;
        }
    }
}

void qlm_cpu_rope_rotate(float *q, float *k, int n, const int *pos, int n_heads, int n_kv_heads, int head_dim,
                         const float *inv_freq, float direction) {
    CPU_FOR(i, n, n > 1, rope_row(q, k, (int)i, pos, n_heads, n_kv_heads, head_dim, inv_freq, direction));
}

static void cpu_rope(float *q, float *k, int n, const int *pos, int n_heads, int n_kv_heads, int head_dim,
                     const float *inv_freq) {
    qlm_cpu_rope_rotate(q, k, n, pos, n_heads, n_kv_heads, head_dim, inv_freq, 1.0f);
}

static void rope_store_row(float *q, float *k, const float *v, int i, const qlm_kv_step *kv) {
    if (kv->inv_freq) rope_row(q, k, i, kv->pos, kv->n_heads, kv->n_kv_heads, kv->head_dim, kv->inv_freq, 1.0f);
    kv_store_one(kv->k_cache, kv->v_cache, kv->kv, k, v, i, kv->slots, 0, kv->store_pos, kv->n_kv_heads, kv->head_dim,
                 kv->max_pos);
}

/* Each row rotated and stored by one thread, in one parallel loop. */
static void cpu_rope_store(float *q, float *k, const float *v, int n, const qlm_kv_step *kv) {
    CPU_FOR(i, n, n > 1, rope_store_row(q, k, v, (int)i, kv));
}

/* Values per block of an activation: a block's exponentials go through the vectorized qlm_exp_f32. */
#define ACT_BLOCK 256

/* out[i] = act(x[i]) * up[i] (or without up when NULL) for i < n <= ACT_BLOCK; out may be x, never
 * up. Inlined with n = ACT_BLOCK for whole blocks, where the loops' fixed length lets the compiler
 * vectorize them. */
static inline __attribute__((always_inline)) void act_rows(float *out, const float *x, const float *restrict up,
                                                          long n, qlm_act a) {
    float e[ACT_BLOCK], r[ACT_BLOCK];
    switch (a) {
    case QLM_ACT_RELU:
        for (long i = 0; i < n; i++) r[i] = x[i] > 0 ? x[i] : 0;
        break;
    case QLM_ACT_GELU_TANH:
        /* 0.5 x (1 + tanh u) = x - x / (e^2u + 1), which holds for e^2u = inf too. */
        for (long i = 0; i < n; i++) e[i] = 1.5957691216057308f * (x[i] + 0.044715f * x[i] * x[i] * x[i]);
        qlm_exp_f32(e, n);
        for (long i = 0; i < n; i++) r[i] = x[i] - x[i] / (e[i] + 1.0f);
        break;
    case QLM_ACT_GELU:
        for (long i = 0; i < n; i++) r[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.7071067811865476f));
        break;
    default:
        /* SiLU: x / (1 + e^-x) */
        for (long i = 0; i < n; i++) e[i] = -x[i];
        qlm_exp_f32(e, n);
        for (long i = 0; i < n; i++) r[i] = x[i] / (1.0f + e[i]);
    }
    if (up)
        for (long i = 0; i < n; i++) out[i] = r[i] * up[i];
    else
        for (long i = 0; i < n; i++) out[i] = r[i];
}

/* One block of act_rows, cloned per instruction set (picked at load time) so that the vector loops
 * are 16 wide where the CPU allows; elementwise and uncontracted (ISO C), so every clone gives the
 * same bits. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void act_block(float *out, const float *x,
                                                                                 const float *up, long n, qlm_act a) {
    if (n == ACT_BLOCK)
        act_rows(out, x, up, ACT_BLOCK, a);
    else
        act_rows(out, x, up, n, a);
}

/* Elements of a GLU or activation below which one thread takes them all. */
#define MIN_PARALLEL_ACT 4096L

/* Block b (ACT_BLOCK elements from b * ACT_BLOCK) of act_block over n elements; up may be NULL. */
static void act_block_at(float *out, const float *x, const float *up, long n, long b, qlm_act a) {
    const long at = b * ACT_BLOCK;
    act_block(out + at, x + at, up ? up + at : NULL, n - at < ACT_BLOCK ? n - at : ACT_BLOCK, a);
}

static void cpu_glu(float *out, const float *gate, const float *up, long n, qlm_act a) {
    CPU_FOR(b, (n + ACT_BLOCK - 1) / ACT_BLOCK, n > MIN_PARALLEL_ACT, act_block_at(out, gate, up, n, b, a));
}

static void cpu_activate(float *x, long n, qlm_act a) {
    CPU_FOR(b, (n + ACT_BLOCK - 1) / ACT_BLOCK, n > MIN_PARALLEL_ACT, act_block_at(x, x, NULL, n, b, a));
}

static void cpu_embedding(float *out, const qlm_weight *table, const int *ids, int n) {
    for (int i = 0; i < n; i++) qlm_weight_row_f32(table, ids[i], out + (size_t)i * table->cols);
}

static void cpu_copy(float *dst, const float *src, long n) { memmove(dst, src, (size_t)n * sizeof *dst); }

static void cpu_memcpy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

static int cpu_step_matmul_group(const qlm_matmul_out *outs, int count, const qlm_x_step *step, const qlm_kv_step *kv,
                                 int n) {
    return qlm_step_then_matmul_group(qlm_backend_cpu(), outs, count, step, kv, n);
}

static const qlm_backend cpu_backend = {
    .name = "cpu",
    .host_memory = 1,
    .block_weights = 1,
    .act8_weights = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .bandwidth_gbs = qlm_measure_bandwidth_gbs,
    .describe = cpu_describe,
    .matmul = qlm_matmul,
    .matmul_group = qlm_matmul_group,
    .step_matmul_group = cpu_step_matmul_group,
    .kv_store = cpu_kv_store,
    .rope_store = cpu_rope_store,
    .lora = qlm_cpu_lora,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention = qlm_cpu_attention,
    .glu = cpu_glu,
    .activate = cpu_activate,
    .add = qlm_add_f32,
    .embedding = cpu_embedding,
    .copy = cpu_copy,
    .to_device = cpu_memcpy,
    .to_host = cpu_memcpy,
    .matmul_backward_x = qlm_cpu_matmul_backward_x,
    .matmul_backward_w = qlm_cpu_matmul_backward_w,
    .rmsnorm_backward = qlm_cpu_rmsnorm_backward,
    .rope_backward = qlm_cpu_rope_backward,
    .attention_backward = qlm_cpu_attention_backward,
    .glu_backward = qlm_cpu_glu_backward,
    .activate_backward = qlm_cpu_activate_backward,
    .embedding_backward = qlm_cpu_embedding_backward,
    .cross_entropy = qlm_cpu_cross_entropy,
    .sum_squares = qlm_cpu_sum_squares,
    .scale = qlm_cpu_scale,
    .zero = qlm_cpu_zero,
    .dropout = qlm_cpu_dropout,
    .adamw = qlm_cpu_adamw,
    .store_weight = qlm_cpu_store_weight,
    .fake_quant_forward = qlm_cpu_fake_quant_forward,
    .fake_quant_backward = qlm_cpu_fake_quant_backward,
    .fake_quant_clamp_scales = qlm_fake_quant_clamp_scales,
};

const qlm_backend *qlm_backend_cpu(void) { return &cpu_backend; }
