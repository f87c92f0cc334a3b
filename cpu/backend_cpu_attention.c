/* Attention on the CPU. Few query rows of a sequence (decode) take a per-row loop over the keys,
 * with the softmax computed online over chunks of keys, and every (row, head) pair of the batch
 * in one parallel loop. Many rows of one sequence (prefill, encoders) take, per head, two
 * single-threaded sgemm calls, scores = Q K^T and out = softmax(scores) V, with the heads spread
 * over the threads: the loop form left prefill spending most of its time here. One call may mix
 * both (a prefill beside decode rows). */
#include "backend_cpu_attention.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/matmul.h"
#include "../quant/quantize.h"
#include "../core/cpu_scratch.h"

/* From this many query rows of one sequence on, the sgemm form is faster. */
#define SGEMM_MIN_ROWS 16

/* Keys row i of the call sees: its sequence's fixed count, or the causal prefix 0..pos[i]. */
static int keys_of(const qlm_attn_shape *sh, const int *pos, int i) {
    if (!sh->n_keys) return pos[i] + 1;
    return sh->slots && sh->slot_keys ? sh->slot_keys[sh->slots[i]] : sh->n_keys;
}

/* The first key row i sees: past the sliding window, or 0. */
static int first_key(const qlm_attn_shape *sh, const int *pos, int i) {
    if (sh->n_keys || !sh->window || pos[i] < sh->window) return 0;
    return pos[i] - sh->window + 1;
}

/* See qlm_attn_shape's row_stride and head_stride. */
static size_t row_stride(const qlm_attn_shape *sh) {
    return sh->row_stride ? sh->row_stride : (size_t)sh->n_kv_heads * sh->head_dim;
}

/* Offset of KV head kvh in a sequence of `keys` keys, in elements. */
static size_t head_offset(const qlm_attn_shape *sh, int kvh, int keys) {
    if (sh->heads_packed) return (size_t)kvh * keys * sh->head_dim;
    return (size_t)kvh * (sh->head_stride ? sh->head_stride : (size_t)sh->head_dim);
}

/* Offset of row i's sequence in the caches, in elements. */
static size_t cache_base(const qlm_attn_shape *sh, int i) {
    return sh->slots ? (size_t)sh->slots[i] * sh->slot_stride : 0;
}

/* The key or value cache from element offset `at`. */
static const void *kv_at(const void *cache, size_t at, const qlm_attn_shape *sh) {
    return (const char *)cache + at * (sh->kv_dtype == QLM_F32 ? sizeof(float) : sizeof(uint16_t));
}

/* Lanes of the running maxima and sums below: their fixed-length inner loops vectorize, where a
 * plain reduction loop stays scalar (without -ffast-math GCC keeps a float sum in order). Each
 * lane's operations are elementwise, so every clone (one per instruction set, picked at load time)
 * gives the same bits. */
#define LANES 16
#define PER_ISA __attribute__((target_clones("avx512f", "avx2", "default")))

/* s[t] = s[t] * scale + bias[t] (bias NULL: + 0) for t < n; returns the largest (-inf for n = 0). */
PER_ISA static float scale_bias_max(float *s, int n, float scale, const float *bias) {
    float mx[LANES];
    for (int j = 0; j < LANES; j++) mx[j] = -INFINITY;
    int t = 0;
    if (bias)
        for (; t + LANES <= n; t += LANES)
            for (int j = 0; j < LANES; j++) s[t + j] = s[t + j] * scale + bias[t + j];
    else
        for (; t + LANES <= n; t += LANES)
            for (int j = 0; j < LANES; j++) s[t + j] = s[t + j] * scale + 0.0f;
    for (int u = 0; u < t; u += LANES)
        for (int j = 0; j < LANES; j++) mx[j] = s[u + j] > mx[j] ? s[u + j] : mx[j];
    for (; t < n; t++) {
        s[t] = s[t] * scale + (bias ? bias[t] : 0.0f);
        mx[0] = s[t] > mx[0] ? s[t] : mx[0];
    }
    float m = mx[0];
    for (int j = 1; j < LANES; j++) m = mx[j] > m ? mx[j] : m;
    return m;
}

/* The sum of s[0..n). */
PER_ISA static float lane_sum(const float *s, int n) {
    float acc[LANES] = {0};
    int t = 0;
    for (; t + LANES <= n; t += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += s[t + j];
    for (; t < n; t++) acc[0] += s[t];
    float sum = 0;
    for (int j = 0; j < LANES; j++) sum += acc[j];
    return sum;
}

/* s[t] = e^(s[t] - mx) for t < n; returns their sum. */
static float exp_sum(float *s, int n, float mx) {
    for (int t = 0; t < n; t++) s[t] -= mx;
    qlm_exp_f32(s, n);
    return lane_sum(s, n);
}

/* Softmax of scores[0..len) in place after the bias. */
static void softmax_row(float *scores, int len, const float *bias) {
    float inv = 1.0f / exp_sum(scores, len, scale_bias_max(scores, len, 1.0f, bias));
    for (int t = 0; t < len; t++) scores[t] *= inv;
}

/* The bias of head h's query at position p from key `from` on (NULL: none). */
static const float *bias_row(const qlm_attn_shape *sh, int h, int p, int from) {
    return sh->pos_bias ? sh->pos_bias + (size_t)h * sh->pos_bias_span + sh->pos_bias_offset - p + from : NULL;
}

/* Keys are taken in chunks of this many, with the softmax carried across chunks (running max and
 * sum), so any context length works from a stack buffer and nothing is allocated. */
#define KEY_CHUNK 512
/* Most query heads one work item takes together (those sharing a KV head, under GQA). */
#define MAX_GROUP 8

/* Query elements rounded to BF16 that attend holds on its stack (head_dim is at most 4096). */
#define Q_BF16_CAP 4096

/* Query heads [h0, h0 + g) of row i, which share KV head kvh, over keys [first, len): for each chunk of keys, the scores
 * as one small product and the weighted sum of the values, both by the matmul kernels of the
 * CPU's instruction set (this file is built for the baseline ISA), around the online softmax.
 * BF16 keys meet the query rounded to BF16, as in a BF16 matmul; F16 and F32 ones the F32 query. */
static void attend(float *out, const float *q, const void *kc, const void *vc, const qlm_attn_shape *sh, int h0,
                  int g, int kvh, int first, int len, int p) {
    int hd = sh->head_dim;
    size_t rs = row_stride(sh);
    const qlm_dtype dt = sh->kv_dtype;
    const int q_bf16 = dt == QLM_BF16;
    kc = kv_at(kc, head_offset(sh, kvh, len), sh);
    vc = kv_at(vc, head_offset(sh, kvh, len), sh);
    uint16_t qb[Q_BF16_CAP];
    int gb = q_bf16 && g * hd > Q_BF16_CAP ? Q_BF16_CAP / hd : g; /* heads per scores call */
    /* All heads' rounded query fits (the usual case): rounded once, not per chunk of keys. */
    const int round_per_chunk = q_bf16 && gb < g;
    if (q_bf16 && !round_per_chunk) qlm_convert_from_f32(qb, QLM_BF16, q + (size_t)h0 * hd, (long)g * hd);
    float scores[MAX_GROUP][KEY_CHUNK], mx[MAX_GROUP], sum[MAX_GROUP];
    float *o = out + (size_t)h0 * hd;
    for (int j = 0; j < g; j++) mx[j] = -INFINITY, sum[j] = 0;
    memset(o, 0, (size_t)g * hd * sizeof *o);
    for (int t0 = first, m; t0 < len; t0 += m) {
        m = len - t0 < KEY_CHUNK ? len - t0 : KEY_CHUNK;
        /* A rolling cache: the chunk ends where the rows wrap around. */
        size_t row = sh->ring ? (size_t)(t0 % sh->ring) : (size_t)t0;
        if (sh->ring && (int)row + m > sh->ring) m = sh->ring - (int)row;
        for (int j0 = 0; j0 < g; j0 += gb) {
            int nj = g - j0 < gb ? g - j0 : gb;
            const float *qj = q + (size_t)(h0 + j0) * hd;
            if (round_per_chunk) qlm_convert_from_f32(qb, QLM_BF16, qj, (long)nj * hd);
            qlm_dot_rows(scores[j0], KEY_CHUNK, q_bf16 ? (const void *)qb : qj, nj, kv_at(kc, row * rs, sh),
                         rs, m, hd, dt);
        }
        for (int j = 0; j < g; j++) {
            float cmx = scale_bias_max(scores[j], m, sh->scale, bias_row(sh, h0 + j, p, t0));
            if (sh->softcap > 0) {
                /* tanh keeps the order: the capped maximum is the cap of the maximum */
                qlm_cpu_softcap(scores[j], m, sh->softcap);
                cmx = sh->softcap * tanhf(cmx / sh->softcap);
            }
            if (cmx > mx[j]) {
                /* A new maximum: what was summed so far shrinks by exp(old - new). */
                float shrink = expf(mx[j] - cmx);
                sum[j] *= shrink;
                for (int d = 0; d < hd; d++) o[(size_t)j * hd + d] *= shrink;
                mx[j] = cmx;
            }
            sum[j] += exp_sum(scores[j], m, mx[j]);
        }
        qlm_weighted_sum(o, scores[0], g, KEY_CHUNK, kv_at(vc, row * rs, sh), rs, m, hd, dt);
    }
    for (int j = 0; j < g; j++) {
        float inv = 1.0f / sum[j];
        for (int d = 0; d < hd; d++) o[(size_t)j * hd + d] *= inv;
    }
}

/* Every (listed row, group of query heads) in one parallel loop; rows NULL lists rows 0..n-1. Heads
 * sharing a KV head go together when that still leaves a few items per thread; a row's result is
 * the same either way. With a few rows per thread, a thread takes a whole row's heads at a time:
 * it then reads one sequence's caches in order (one run when heads_packed), which memory streams
 * faster than heads dealt out to the threads in turn. */
static void attention_rows(float *out, const float *q, const void *k_cache, const void *v_cache, const int *rows,
                           int n, const int *pos, const qlm_attn_shape *sh) {
    int hd = sh->head_dim, group = sh->n_heads / sh->n_kv_heads, threads = omp_get_max_threads();
    int g = group <= MAX_GROUP && n * sh->n_kv_heads >= 2 * threads ? group : 1;
    int per_row = sh->n_heads / g, chunk = n >= 2 * threads ? per_row : 1;
#pragma omp parallel for schedule(dynamic, chunk) if (n * per_row > 1)
    for (int it = 0; it < n * per_row; it++) {
        int i = rows ? rows[it / per_row] : it / per_row, h0 = it % per_row * g;
        size_t base = cache_base(sh, i), row = (size_t)i * sh->n_heads * hd;
        attend(out + row, q + row, kv_at(k_cache, base, sh), kv_at(v_cache, base, sh), sh, h0, g, h0 / group,
               first_key(sh, pos, i), keys_of(sh, pos, i), pos[i]);
    }
}

/* Per-thread score matrices, and F32 copies of a head's 16-bit keys and values, kept across calls
 * so steady-state prefill does not allocate. */
static _Thread_local qlm_cpu_scratch t_scores, t_kv_f32;

/* Query rows one pair of sgemm calls takes: a causal block sees only the keys up to its last
 * row, so the masked half of the score matrix is mostly never computed. */
#define ROW_BLOCK 64

static void attention_sgemm(float *out, const float *q, const void *k_cache, const void *v_cache, int n,
                            const int *pos, const qlm_attn_shape *sh, int max_len) {
    int hd = sh->head_dim, q_dim = sh->n_heads * hd;
    int group = sh->n_heads / sh->n_kv_heads;
    size_t rs = row_stride(sh);
    int blas_threads = omp_in_parallel() ? 1 : openblas_get_num_threads();
    if (blas_threads != 1) openblas_set_num_threads(1);
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : failed)
    for (int h = 0; h < sh->n_heads; h++) {
        float *s = qlm_cpu_scratch_get(&t_scores, (size_t)ROW_BLOCK * max_len);
        if (!s) {
            failed = 1;
            continue;
        }
        const void *kc = kv_at(k_cache, head_offset(sh, h / group, max_len), sh);
        const void *vc = kv_at(v_cache, head_offset(sh, h / group, max_len), sh);
        const float *kh = kc, *vh = vc;
        int ld = (int)rs;
        if (sh->kv_dtype != QLM_F32) {
            /* sgemm takes F32: the head's keys and values widened, rows hd apart. */
            float *kf = qlm_cpu_scratch_get(&t_kv_f32, (size_t)2 * max_len * hd);
            if (!kf) {
                failed = 1;
                continue;
            }
            int stored = sh->ring && sh->ring < max_len ? sh->ring : max_len; /* rows the caches hold */
            for (int t = 0; t < stored; t++) {
                qlm_convert_to_f32(kf + (size_t)t * hd, kv_at(kc, (size_t)t * rs, sh), sh->kv_dtype, hd);
                qlm_convert_to_f32(kf + (size_t)(max_len + t) * hd, kv_at(vc, (size_t)t * rs, sh), sh->kv_dtype,
                                   hd);
            }
            kh = kf;
            vh = kf + (size_t)max_len * hd;
            ld = hd;
        }
        for (int b = 0; b < n; b += ROW_BLOCK) {
            /* The block's keys [k0, len): a sliding window leaves out those before every row's. */
            int rows = n - b < ROW_BLOCK ? n - b : ROW_BLOCK, len = 0, k0 = INT_MAX;
            for (int i = b; i < b + rows; i++) {
                if (keys_of(sh, pos, i) > len) len = keys_of(sh, pos, i);
                if (first_key(sh, pos, i) < k0) k0 = first_key(sh, pos, i);
            }
            /* In a rolling cache the span starts at row r0 and may wrap once: its first `head` keys, then
             * the rest from row 0 (a block's rows are one step's, so the span fits in the ring). */
            int span = len - k0, r0 = sh->ring ? k0 % sh->ring : k0;
            int head = sh->ring && r0 + span > sh->ring ? sh->ring - r0 : span;
            const float *qb = q + (size_t)b * q_dim + h * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, head, hd, sh->scale, qb, q_dim,
                        kh + (size_t)r0 * ld, ld, 0.0f, s, span);
            if (head < span)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, span - head, hd, sh->scale, qb, q_dim, kh,
                            ld, 0.0f, s + head, span);
            for (int i = 0; i < rows; i++) {
                float *row = s + (size_t)i * span;
                int from = first_key(sh, pos, b + i) - k0, keys = keys_of(sh, pos, b + i) - k0;
                if (sh->softcap > 0) qlm_cpu_softcap(row + from, keys - from, sh->softcap);
                softmax_row(row + from, keys - from, bias_row(sh, h, pos[b + i], k0 + from));
                /* the causal mask and the window */
                memset(row, 0, (size_t)from * sizeof *row);
                memset(row + keys, 0, (size_t)(span - keys) * sizeof *row);
            }
            float *ob = out + (size_t)b * q_dim + h * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, head, 1.0f, s, span, vh + (size_t)r0 * ld,
                        ld, 0.0f, ob, q_dim);
            if (head < span)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, span - head, 1.0f, s + head, span, vh,
                            ld, 1.0f, ob, q_dim);
        }
    }
    if (blas_threads != 1) openblas_set_num_threads(blas_threads);
    /* Out of memory for a score matrix: the row form needs only a row of it. */
    if (failed) attention_rows(out, q, k_cache, v_cache, NULL, n, pos, sh);
}

/* The calling thread's list of rows for the loop form, kept across calls like the score matrices. */
static _Thread_local qlm_cpu_scratch t_loose;

/* The sgemm form over rows [r0, r1), which are all of one sequence. */
static void sequence_sgemm(float *out, const float *q, const void *k_cache, const void *v_cache, int r0, int r1,
                           const int *pos, const qlm_attn_shape *sh) {
    qlm_attn_shape seq = *sh;
    seq.slots = NULL;
    if (sh->n_keys) seq.n_keys = keys_of(sh, pos, r0);
    int max_len = seq.n_keys;
    for (int i = r0; i < r1 && !seq.n_keys; i++)
        if (pos[i] + 1 > max_len) max_len = pos[i] + 1;
    size_t base = cache_base(sh, r0), q_row = (size_t)sh->n_heads * sh->head_dim;
    attention_sgemm(out + r0 * q_row, q + r0 * q_row, kv_at(k_cache, base, sh), kv_at(v_cache, base, sh), r1 - r0,
                    pos + r0, &seq, max_len);
}

/* Runs of at least SGEMM_MIN_ROWS consecutive rows of one sequence (a prefill, alone or beside
 * decode rows) take the sgemm form, the other rows the loop form together: a row gets the form it
 * would get with its sequence alone in the call, and so the same result. */
void qlm_cpu_attention(float *out, const float *q, const void *k_cache, const void *v_cache, int n, const int *pos,
                       const qlm_attn_shape *sh) {
    int *loose = qlm_cpu_scratch_bytes(&t_loose, (size_t)n * sizeof(int)), n_loose = 0;
    if (!loose) {
        /* Out of memory for the row list: every row in the loop form, still correct. */
        attention_rows(out, q, k_cache, v_cache, NULL, n, pos, sh);
        return;
    }
    for (int r0 = 0, r1; r0 < n; r0 = r1) {
        for (r1 = r0 + 1; r1 < n && (!sh->slots || sh->slots[r1] == sh->slots[r0]); r1++) {}
        if (r1 - r0 >= SGEMM_MIN_ROWS)
            sequence_sgemm(out, q, k_cache, v_cache, r0, r1, pos, sh);
        else
            for (int i = r0; i < r1; i++) loose[n_loose++] = i;
    }
    if (n_loose) attention_rows(out, q, k_cache, v_cache, n_loose == n ? NULL : loose, n_loose, pos, sh);
}
