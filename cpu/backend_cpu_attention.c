/* Attention on the CPU. One algorithm serves every call (a batch's decode rows, a prefill, an
 * encoder, a prompt beside decode rows): a work item takes a block of consecutive query rows of one
 * sequence and the query heads that share a KV head, and walks the keys in chunks whose bounds are
 * fixed key positions (multiples of KEY_CHUNK, and where a rolling cache wraps). Per chunk one
 * qlm_dot_rows call gives the block's scores, each row carries its softmax online from chunk to
 * chunk, and one qlm_weighted_sum call adds the values, with weight 0 on the keys a row does not
 * see. Every score and every output adds its terms in an order that depends on neither the block
 * nor the call (quant/matmul.h), so a row's result is the same bits whatever else its call holds:
 * a prompt gives the same logits evaluated whole, in chunks, after a copied prefix or beside
 * other sequences' decode rows. */
#include "backend_cpu_attention.h"

#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/half.h"
#include "../quant/matmul.h"
#include "../quant/quantize.h"
#include "../core/cpu_scratch.h"

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

/* The bias of head h's query at position p from key `from` on (NULL: none). */
static const float *bias_row(const qlm_attn_shape *sh, int h, int p, int from) {
    return sh->pos_bias ? sh->pos_bias + (size_t)h * sh->pos_bias_span + sh->pos_bias_offset - p + from : NULL;
}

/* Keys a chunk holds at most; chunks start at multiples of it (and where a rolling cache wraps). */
#define KEY_CHUNK 512
/* Query vectors (rows x heads) one work item takes at most, and rows of a block at most: the
 * block's keys and values are read once per chunk for all of them. */
#define BLOCK_VECTORS 128
#define BLOCK_ROWS 64
/* Query vectors from which a chunk's 16-bit value rows are widened to F32 once, before the
 * weighted sum, rather than in registers for every four vectors: the widening (exact) took the
 * ports the sum's FMAs use. The sums add the same products in the same order either way. */
#define WIDEN_MIN_VECTORS 8

typedef struct {
    float *out;
    const float *q;
    const void *k_cache, *v_cache;
    const int *pos;
    const qlm_attn_shape *sh;
} attn_call;

/* A work item's buffers, for cap query vectors. */
typedef struct {
    void *q;         /* [cap][head_dim]: F32, or for BF16 keys qlm_bf16_x_form's form (4 bytes or less) */
    float *s;        /* [cap][KEY_CHUNK] scores, then weights */
    float *o;        /* [cap][head_dim] weighted sums */
    float *mx, *sum; /* [cap] running maxima and sums */
    float *vw;       /* [KEY_CHUNK][head_dim] a chunk's value rows in F32; NULL below WIDEN_MIN_VECTORS */
} attend_buffers;

/* The end of the key chunk that starts at t0, before `end`. */
static int chunk_end(const qlm_attn_shape *sh, int t0, int end) {
    int t1 = (t0 / KEY_CHUNK + 1) * KEY_CHUNK;
    if (sh->ring && t0 - t0 % sh->ring + sh->ring < t1) t1 = t0 - t0 % sh->ring + sh->ring;
    return t1 < end ? t1 : end;
}

/* Rows [i0, i0 + nr) of the call (one sequence's) and query heads [h0, h0 + g) (one KV head's).
 * BF16 keys meet the query rounded to BF16, as in a BF16 matmul; F16 and F32 ones the F32 query. */
static void attend(const attn_call *c, int i0, int nr, int h0, int g, const attend_buffers *b) {
    const qlm_attn_shape *sh = c->sh;
    const int hd = sh->head_dim, nq = nr * g, kvh = h0 / (sh->n_heads / sh->n_kv_heads);
    const size_t rs = row_stride(sh), q_dim = (size_t)sh->n_heads * hd;
    const qlm_dtype dt = sh->kv_dtype;
    const size_t xsize = dt == QLM_BF16 ? qlm_bf16_x_size() : sizeof(float);
    const size_t at = cache_base(sh, i0) + head_offset(sh, kvh, keys_of(sh, c->pos, i0));
    const void *kc = kv_at(c->k_cache, at, sh), *vc = kv_at(c->v_cache, at, sh);
    int lo = INT_MAX, hi = 0;
    for (int r = 0; r < nr; r++) {
        const float *qr = c->q + (size_t)(i0 + r) * q_dim + (size_t)h0 * hd;
        if (dt == QLM_BF16)
            for (int j = 0; j < g; j++)
                qlm_bf16_x_form((char *)b->q + ((size_t)r * g + j) * hd * xsize, qr + (size_t)j * hd, hd);
        else
            memcpy((float *)b->q + (size_t)r * g * hd, qr, (size_t)g * hd * sizeof(float));
        if (first_key(sh, c->pos, i0 + r) < lo) lo = first_key(sh, c->pos, i0 + r);
        if (keys_of(sh, c->pos, i0 + r) > hi) hi = keys_of(sh, c->pos, i0 + r);
    }
    for (int v = 0; v < nq; v++) b->mx[v] = -INFINITY, b->sum[v] = 0;
    memset(b->o, 0, (size_t)nq * hd * sizeof *b->o);
    for (int t0 = lo, t1; t0 < hi; t0 = t1) {
        t1 = chunk_end(sh, t0, hi);
        const int m = t1 - t0;
        const size_t row = (size_t)(sh->ring ? t0 % sh->ring : t0) * rs;
        qlm_dot_rows(b->s, KEY_CHUNK, b->q, nq, kv_at(kc, row, sh), rs, m, hd, dt);
        for (int v = 0; v < nq; v++) {
            const int i = i0 + v / g, h = h0 + v % g;
            int from = first_key(sh, c->pos, i), to = keys_of(sh, c->pos, i);
            from = from > t0 ? from : t0;
            to = to < t1 ? to : t1;
            float *s = b->s + (size_t)v * KEY_CHUNK, *o = b->o + (size_t)v * hd;
            if (from >= to) {
                memset(s, 0, (size_t)m * sizeof *s);
                continue;
            }
            float *seen = s + (from - t0);
            float cmx = scale_bias_max(seen, to - from, sh->scale, bias_row(sh, h, c->pos[i], from));
            if (sh->softcap > 0) {
                /* tanh keeps the order: the capped maximum is the cap of the maximum */
                qlm_cpu_softcap(seen, to - from, sh->softcap);
                cmx = sh->softcap * tanhf(cmx / sh->softcap);
            }
            if (cmx > b->mx[v]) {
                /* A new maximum: what was summed so far shrinks by exp(old - new). */
                float shrink = expf(b->mx[v] - cmx);
                b->sum[v] *= shrink;
                for (int d = 0; d < hd; d++) o[d] *= shrink;
                b->mx[v] = cmx;
            }
            b->sum[v] += exp_sum(seen, to - from, b->mx[v]);
            /* the causal mask and the window */
            memset(s, 0, (size_t)(from - t0) * sizeof *s);
            memset(s + (to - t0), 0, (size_t)(t1 - to) * sizeof *s);
        }
        const void *vr = kv_at(vc, row, sh);
        if (dt != QLM_F32 && b->vw) {
            void (*widen)(float *, const uint16_t *, long) = dt == QLM_BF16 ? qlm_bf16_to_f32_n : qlm_f16_to_f32_n;
            for (int t = 0; t < m; t++) widen(b->vw + (size_t)t * hd, (const uint16_t *)vr + (size_t)t * rs, hd);
            qlm_weighted_sum(b->o, b->s, nq, KEY_CHUNK, b->vw, (size_t)hd, m, hd, QLM_F32);
        } else {
            qlm_weighted_sum(b->o, b->s, nq, KEY_CHUNK, vr, rs, m, hd, dt);
        }
    }
    for (int v = 0; v < nq; v++) {
        float inv = 1.0f / b->sum[v], *dst = c->out + (size_t)(i0 + v / g) * q_dim + (size_t)(h0 + v % g) * hd;
        for (int d = 0; d < hd; d++) dst[d] = b->o[(size_t)v * hd + d] * inv;
    }
}

/* Per-thread buffers, kept across calls so that steady decoding and prefill allocate nothing. */
static _Thread_local qlm_cpu_scratch t_buffers;

/* Buffers for nq query vectors from the thread's scratch; 0 when out of memory. */
static int scratch_buffers(attend_buffers *b, int nq, int hd) {
    const size_t vec = (size_t)nq * hd, widened = nq >= WIDEN_MIN_VECTORS ? (size_t)KEY_CHUNK * hd : 0;
    float *p = qlm_cpu_scratch_get(&t_buffers, 2 * vec + (size_t)nq * (KEY_CHUNK + 2) + widened);
    if (!p) return 0;
    /* The widened rows right after the scores, on a cache line as they are where head_dim is a
     * multiple of 8. */
    float *vw = p + 2 * vec + (size_t)nq * KEY_CHUNK;
    *b = (attend_buffers){.q = p, .o = p + vec, .s = p + 2 * vec, .vw = widened ? vw : NULL, .mx = vw + widened};
    b->sum = b->mx + nq;
    return 1;
}

/* A work item's vectors one at a time from buffers on the stack, for when its scratch cannot be had
 * (the same results: a row's result does not depend on its block). Kept out of line so that the
 * usual path does not carry its 34 KB frame. */
__attribute__((noinline)) static void attend_from_stack(const attn_call *c, int i0, int nr, int h0, int g) {
    float q[QLM_MAX_HEAD_DIM], s[KEY_CHUNK], o[QLM_MAX_HEAD_DIM], mx, sum;
    const attend_buffers b = {.q = q, .s = s, .o = o, .mx = &mx, .sum = &sum};
    for (int i = i0; i < i0 + nr; i++)
        for (int h = h0; h < h0 + g; h++) attend(c, i, 1, h, 1, &b);
}

static void attend_item(const attn_call *c, int i0, int nr, int h0, int g) {
    attend_buffers b;
    if (scratch_buffers(&b, nr * g, c->sh->head_dim))
        attend(c, i0, nr, h0, g, &b);
    else
        attend_from_stack(c, i0, nr, h0, g);
}

/* Cuts the call's rows into blocks of at most `rows` consecutive rows of one sequence: block k is
 * rows [start[k], start[k + 1]). Returns the number of blocks. */
static int cut_blocks(int *start, int n, const qlm_attn_shape *sh, int rows) {
    int k = 0;
    for (int i = 0; i < n; k++) {
        start[k] = i;
        int e = i + 1;
        while (e < n && e - i < rows && (!sh->slots || sh->slots[e] == sh->slots[i])) e++;
        i = e;
    }
    start[k] = n;
    return k;
}

static _Thread_local qlm_cpu_scratch t_blocks;

/* Rows of a block whose items take g heads each. */
static int block_rows(int g) {
    int rows = BLOCK_VECTORS / g;
    return rows < 1 ? 1 : rows > BLOCK_ROWS ? BLOCK_ROWS : rows;
}

/* Every (block, query heads sharing a KV head) in one parallel loop. The heads of a KV head go
 * together when that still leaves a few items per thread (else one head an item); with a few
 * blocks per thread, a thread takes a whole block's heads at a time: it then reads one sequence's
 * caches in order (one run when heads_packed), which memory streams faster than heads dealt out to
 * the threads in turn. */
void qlm_cpu_attention(float *out, const float *q, const void *k_cache, const void *v_cache, int n, const int *pos,
                       const qlm_attn_shape *sh) {
    const attn_call c = {.out = out, .q = q, .k_cache = k_cache, .v_cache = v_cache, .pos = pos, .sh = sh};
    const int group = sh->n_heads / sh->n_kv_heads, threads = omp_get_max_threads();
    int *start = qlm_cpu_scratch_bytes(&t_blocks, (size_t)(n + 1) * sizeof(int));
    if (!start) {
        /* Out of memory for the block list: every row a block of its own, the same results. */
#pragma omp parallel for schedule(dynamic, 1) if (n * sh->n_heads > 1)
        for (int it = 0; it < n * sh->n_heads; it++) attend_item(&c, it / sh->n_heads, 1, it % sh->n_heads, 1);
        return;
    }
    int g = group, blocks = cut_blocks(start, n, sh, block_rows(g));
    if (g > 1 && blocks * sh->n_kv_heads < 2 * threads) {
        g = 1;
        blocks = cut_blocks(start, n, sh, block_rows(g));
    }
    const int per_block = sh->n_heads / g, chunk = blocks >= 2 * threads ? per_block : 1;
#pragma omp parallel for schedule(dynamic, chunk) if (blocks * per_block > 1)
    for (int it = 0; it < blocks * per_block; it++) {
        int k = it / per_block;
        attend_item(&c, start[k], start[k + 1] - start[k], it % per_block * g, g);
    }
}
