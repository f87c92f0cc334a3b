/* The CPU attention op against a double-precision reference: causal and fixed-key attention,
 * GQA, a relative-position bias, few rows (decode, with contexts longer than one key chunk) and
 * many (prefill blocks); BF16 and F16 keys and values, which the reference reads rounded as well
 * (and the query rounded to BF16 with BF16 keys). And a row's result bit for bit whatever else
 * its call holds: a sequence evaluated whole or in steps of any size (with windows, rolling
 * caches, soft caps and biases), on any number of threads, a batch of sequences with one cache
 * each (slots) against each row attending alone, a prefill beside decode rows; and the head-by-head
 * cache layouts against the default one. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "../core/backend.h"
#include "../quant/half.h"
#include "../quant/quantize.h"
#include "test_util.h"

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void reference(double *out, const float *q, const float *k, const float *v, int n, const int *pos,
                      const qlm_attn_shape *sh) {
    int hd = sh->head_dim, kv_dim = sh->n_kv_heads * hd, group = sh->n_heads / sh->n_kv_heads;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < sh->n_heads; h++) {
            int len = sh->n_keys ? sh->n_keys : pos[i] + 1, kvh = h / group;
            double *sc = malloc((size_t)len * sizeof *sc), mx = -INFINITY, sum = 0;
            for (int t = 0; t < len; t++) {
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)q[((size_t)i * sh->n_heads + h) * hd + d] * k[(size_t)t * kv_dim + kvh * hd + d];
                s *= sh->scale;
                if (sh->pos_bias) s += sh->pos_bias[(size_t)h * sh->pos_bias_span + sh->pos_bias_offset + t - pos[i]];
                sc[t] = s;
                mx = fmax(mx, s);
            }
            for (int t = 0; t < len; t++) sum += sc[t] = exp(sc[t] - mx);
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (int t = 0; t < len; t++) o += sc[t] / sum * v[(size_t)t * kv_dim + kvh * hd + d];
                out[((size_t)i * sh->n_heads + h) * hd + d] = o;
            }
            free(sc);
        }
}

/* x rounded to dtype dt (BF16 or F16) in place. */
static void round_to(float *x, long n, qlm_dtype dt) {
    for (long i = 0; i < n; i++)
        x[i] = dt == QLM_BF16 ? qlm_bf16_to_f32(qlm_f32_to_bf16(x[i])) : qlm_f16_to_f32(qlm_f32_to_f16(x[i]));
}

/* Caches of dtype kv: the reference takes the stored values widened (and the query rounded to
 * BF16 with BF16 keys, as the op rounds it). */
static void check(int n, int keys, int first_pos, int n_keys_mode, int with_bias, qlm_dtype kv) {
    qlm_attn_shape sh = {.n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .scale = 0.25f};
    int q_dim = sh.n_heads * sh.head_dim, kv_dim = sh.n_kv_heads * sh.head_dim;
    unsigned seed = (unsigned)(n * 7919 + keys);
    float *q = malloc((size_t)n * q_dim * sizeof *q), *k = malloc((size_t)keys * kv_dim * sizeof *k);
    float *v = malloc((size_t)keys * kv_dim * sizeof *v), *out = malloc((size_t)n * q_dim * sizeof *out);
    double *want = malloc((size_t)n * q_dim * sizeof *want);
    int *pos = malloc((size_t)n * sizeof *pos);
    int span = 2 * keys + 1;
    float *bias = malloc((size_t)sh.n_heads * span * sizeof *bias);
    for (int i = 0; i < n * q_dim; i++) q[i] = 2 * frand(&seed);
    for (int i = 0; i < keys * kv_dim; i++) k[i] = frand(&seed), v[i] = frand(&seed);
    for (int i = 0; i < sh.n_heads * span; i++) bias[i] = frand(&seed);
    for (int i = 0; i < n; i++) pos[i] = n_keys_mode ? i : first_pos + i;
    if (n_keys_mode) sh.n_keys = keys;
    if (with_bias) {
        sh.pos_bias = bias;
        sh.pos_bias_span = span;
        sh.pos_bias_offset = keys;
    }
    if (kv != QLM_F32) {
        uint16_t *kb = malloc((size_t)keys * kv_dim * sizeof *kb), *vb = malloc((size_t)keys * kv_dim * sizeof *vb);
        assert_true(kb && vb);
        qlm_convert_from_f32(kb, kv, k, (long)keys * kv_dim);
        qlm_convert_from_f32(vb, kv, v, (long)keys * kv_dim);
        sh.kv_dtype = kv;
        qlm_backend_cpu()->attention(out, q, kb, vb, n, pos, &sh);
        free(kb), free(vb);
        round_to(k, (long)keys * kv_dim, kv);
        round_to(v, (long)keys * kv_dim, kv);
        if (kv == QLM_BF16) round_to(q, (long)n * q_dim, QLM_BF16);
    } else {
        qlm_backend_cpu()->attention(out, q, k, v, n, pos, &sh);
    }
    reference(want, q, k, v, n, pos, &sh);
    double worst = 0;
    for (int i = 0; i < n * q_dim; i++) worst = fmax(worst, fabs(out[i] - want[i]));
    print_message("attention n %4d keys %5d %s%s, %s k/v: max|diff| %.3g\n", n, keys,
                  n_keys_mode ? "all keys" : "causal", with_bias ? " + bias" : "", qlm_dtype_name(kv), worst);
    assert_true(worst <= 2e-5);
    free(q), free(k), free(v), free(out), free(want), free(pos), free(bias);
}

/* Every cache dtype a model keeps (core/kv_cache.h). */
static const qlm_dtype kv_dtypes[] = {QLM_F32, QLM_BF16, QLM_F16};

static void test_few_rows(void **state) {
    (void)state;
    for (size_t d = 0; d < sizeof kv_dtypes / sizeof kv_dtypes[0]; d++) {
        check(1, 7, 6, 0, 0, kv_dtypes[d]);
        check(3, 5000, 4997, 0, 1, kv_dtypes[d]); /* causal over more keys than one chunk */
        check(5, 4500, 0, 1, 1, kv_dtypes[d]);
    }
}

static void test_many_rows(void **state) {
    (void)state;
    for (size_t d = 0; d < sizeof kv_dtypes / sizeof kv_dtypes[0]; d++) {
        check(16, 16, 0, 0, 0, kv_dtypes[d]);
        check(40, 100, 60, 0, 1, kv_dtypes[d]); /* a chunk that starts at position 60 */
        check(64, 64, 0, 1, 1, kv_dtypes[d]);
        check(150, 300, 150, 0, 1, kv_dtypes[d]); /* three row blocks, each seeing only the keys up to its last row */
        check(100, 100, 0, 1, 0, kv_dtypes[d]);
    }
}

/* Rows of three sequences in mixed order, each slot with its own cache, position and key count:
 * every row equals the same row attending over its own cache alone, bit for bit. All rows of
 * one slot equal the call on that slot's cache without slots. */
static void check_slots(int n_keys_mode) {
    enum { SLOTS = 3, MAX_SEQ = 40, N = 20 };
    qlm_attn_shape sh = {.n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .scale = 0.25f};
    int q_dim = sh.n_heads * sh.head_dim, kv_dim = sh.n_kv_heads * sh.head_dim;
    size_t stride = (size_t)MAX_SEQ * kv_dim;
    unsigned seed = 7u + (unsigned)n_keys_mode;
    float *q = malloc((size_t)N * q_dim * sizeof *q), *k = malloc(SLOTS * stride * sizeof *k);
    float *v = malloc(SLOTS * stride * sizeof *v), *out = malloc((size_t)N * q_dim * sizeof *out);
    float *one = malloc((size_t)N * q_dim * sizeof *one);
    int slots[N], pos[N], slot_keys[SLOTS] = {17, 40, 3};
    for (int i = 0; i < N * q_dim; i++) q[i] = 2 * frand(&seed);
    for (size_t i = 0; i < SLOTS * stride; i++) k[i] = frand(&seed), v[i] = frand(&seed);
    for (int i = 0; i < N; i++) {
        slots[i] = (i * 7) % SLOTS;
        pos[i] = n_keys_mode ? i : (i * 11) % MAX_SEQ;
    }
    if (n_keys_mode) sh.n_keys = MAX_SEQ;
    qlm_attn_shape batch = sh;
    batch.slots = slots;
    batch.slot_stride = stride;
    batch.slot_keys = n_keys_mode ? slot_keys : NULL;
    const qlm_backend *be = qlm_backend_cpu();
    be->attention(out, q, k, v, N, pos, &batch);
    for (int i = 0; i < N; i++) {
        qlm_attn_shape alone = sh;
        if (n_keys_mode) alone.n_keys = slot_keys[slots[i]];
        be->attention(one, q + (size_t)i * q_dim, k + slots[i] * stride, v + slots[i] * stride, 1, pos + i, &alone);
        assert_memory_equal(one, out + (size_t)i * q_dim, (size_t)q_dim * sizeof *out);
    }
    for (int i = 0; i < N; i++) slots[i] = 1;
    be->attention(out, q, k, v, N, pos, &batch);
    qlm_attn_shape alone = sh;
    if (n_keys_mode) alone.n_keys = slot_keys[1];
    be->attention(one, q, k + stride, v + stride, N, pos, &alone);
    assert_memory_equal(one, out, (size_t)N * q_dim * sizeof *out);
    free(q), free(k), free(v), free(out), free(one);
}

static void test_slots(void **state) {
    (void)state;
    check_slots(0);
    check_slots(1);
}

/* One call with a decode row of slot 0, a 20-row prefill of slot 1 and a decode row of slot 2, as
 * a batch step that admits a prompt: each part equals the call with it alone, bit for bit. */
static void test_prefill_beside_decode(void **state) {
    (void)state;
    enum { SLOTS = 3, MAX_SEQ = 40, P = 20, N = P + 2 };
    qlm_attn_shape sh = {.n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .scale = 0.25f};
    int q_dim = sh.n_heads * sh.head_dim, kv_dim = sh.n_kv_heads * sh.head_dim;
    size_t stride = (size_t)MAX_SEQ * kv_dim;
    unsigned seed = 5u;
    float *q = malloc((size_t)N * q_dim * sizeof *q), *k = malloc(SLOTS * stride * sizeof *k);
    float *v = malloc(SLOTS * stride * sizeof *v), *out = malloc((size_t)N * q_dim * sizeof *out);
    float *one = malloc((size_t)N * q_dim * sizeof *one);
    for (int i = 0; i < N * q_dim; i++) q[i] = 2 * frand(&seed);
    for (size_t i = 0; i < SLOTS * stride; i++) k[i] = frand(&seed), v[i] = frand(&seed);
    int slots[N], pos[N];
    slots[0] = 0, pos[0] = 30;
    for (int i = 1; i <= P; i++) slots[i] = 1, pos[i] = i - 1;
    slots[N - 1] = 2, pos[N - 1] = 12;
    qlm_attn_shape batch = sh;
    batch.slots = slots;
    batch.slot_stride = stride;
    const qlm_backend *be = qlm_backend_cpu();
    be->attention(out, q, k, v, N, pos, &batch);
    for (int i = 0; i < N; i += i == 0 ? 1 : P) {
        int rows = i == 0 || i == N - 1 ? 1 : P;
        be->attention(one, q + (size_t)i * q_dim, k + slots[i] * stride, v + slots[i] * stride, rows, pos + i, &sh);
        assert_memory_equal(one, out + (size_t)i * q_dim, (size_t)rows * q_dim * sizeof *out);
    }
    free(q), free(k), free(v), free(out), free(one);
}

/* The same keys and values laid out head by head ([kv_head][cap][head_dim], as a decode cache
 * holds them) give bit for bit the default layout's result, for few rows and many, causal and over
 * fixed keys, and for a batch of slots; so do they with each slot's heads packed
 * back to back after its own key count (heads_packed, T5's cross-attention), over fixed keys. */
static void test_head_major_layout(void **state) {
    (void)state;
    enum { KEYS = 70, CAP = 96, SLOTS = 2 };
    qlm_attn_shape sh = {.n_heads = 6, .n_kv_heads = 3, .head_dim = 16, .scale = 0.25f};
    int hd = sh.head_dim, q_dim = sh.n_heads * hd, kv_dim = sh.n_kv_heads * hd;
    size_t slot = (size_t)CAP * kv_dim;
    unsigned seed = 99u;
    float *k = malloc(SLOTS * slot * sizeof *k), *v = malloc(SLOTS * slot * sizeof *v);
    float *kh = malloc(SLOTS * slot * sizeof *kh), *vh = malloc(SLOTS * slot * sizeof *vh);
    float *q = malloc((size_t)KEYS * q_dim * sizeof *q), *a = malloc((size_t)KEYS * q_dim * sizeof *a);
    float *b = malloc((size_t)KEYS * q_dim * sizeof *b);
    for (size_t i = 0; i < SLOTS * slot; i++) k[i] = frand(&seed), v[i] = frand(&seed), kh[i] = vh[i] = NAN;
    for (int i = 0; i < KEYS * q_dim; i++) q[i] = 2 * frand(&seed);
    for (int sl = 0; sl < SLOTS; sl++)
        for (int t = 0; t < CAP; t++)
            for (int h = 0; h < sh.n_kv_heads; h++) {
                size_t from = sl * slot + (size_t)t * kv_dim + h * hd, to = sl * slot + ((size_t)h * CAP + t) * hd;
                memcpy(kh + to, k + from, hd * sizeof *k);
                memcpy(vh + to, v + from, hd * sizeof *v);
            }
    int pos[KEYS], slots[KEYS];
    for (int i = 0; i < KEYS; i++) pos[i] = i, slots[i] = i % SLOTS;
    const qlm_backend *be = qlm_backend_cpu();
    for (int form = 0; form < 4; form++) {
        /* 0: 3 causal rows, 1: all rows causal, 2: all rows over fixed keys, 3: slots */
        int n = form == 0 ? 3 : KEYS;
        qlm_attn_shape def = sh;
        if (form == 2) def.n_keys = KEYS;
        if (form == 3) def.slots = slots, def.slot_stride = slot;
        qlm_attn_shape hm = def;
        hm.row_stride = (size_t)hd;
        hm.head_stride = (size_t)CAP * hd;
        be->attention(a, q, k, v, n, pos, &def);
        be->attention(b, q, kh, vh, n, pos, &hm);
        assert_memory_equal(a, b, (size_t)n * q_dim * sizeof *a);
    }
    /* Packed heads: slot sl's KV head h holds its keys[sl] rows from (h * keys[sl]) * hd. */
    const int keys[SLOTS] = {KEYS, KEYS - 23};
    for (size_t i = 0; i < SLOTS * slot; i++) kh[i] = vh[i] = NAN;
    for (int sl = 0; sl < SLOTS; sl++)
        for (int t = 0; t < keys[sl]; t++)
            for (int h = 0; h < sh.n_kv_heads; h++) {
                size_t from = sl * slot + (size_t)t * kv_dim + h * hd, to = sl * slot + ((size_t)h * keys[sl] + t) * hd;
                memcpy(kh + to, k + from, hd * sizeof *k);
                memcpy(vh + to, v + from, hd * sizeof *v);
            }
    for (int form = 0; form < 3; form++) {
        /* 0: all rows over slot 0's keys, 1: 3 rows, 2: rows of both slots */
        int n = form == 1 ? 3 : KEYS;
        qlm_attn_shape def = sh;
        def.n_keys = KEYS;
        if (form == 2) def.slots = slots, def.slot_stride = slot, def.slot_keys = keys;
        qlm_attn_shape pk = def;
        pk.row_stride = (size_t)hd;
        pk.heads_packed = 1;
        be->attention(a, q, k, v, n, pos, &def);
        be->attention(b, q, kh, vh, n, pos, &pk);
        assert_memory_equal(a, b, (size_t)n * q_dim * sizeof *a);
    }
    free(k), free(v), free(kh), free(vh), free(q), free(a), free(b);
}

/* A sequence of L positions (GQA 6/2, head_dim 64) whose rows are evaluated `step` at a time, as a
 * prompt in chunks and then decode steps would be: each step's keys and values are stored first
 * (row t % ring of a rolling cache), then its rows attend. */
enum { SEQ_L = 1100, SEQ_HEADS = 6, SEQ_KV_HEADS = 2, SEQ_HD = 64 };

static void sequence_in_steps(float *out, const float *q, const float *k, const float *v, int step,
                              const qlm_attn_shape *sh) {
    const int q_dim = SEQ_HEADS * SEQ_HD, kv_dim = SEQ_KV_HEADS * SEQ_HD, rows = sh->ring ? sh->ring : SEQ_L;
    const size_t es = sh->kv_dtype == QLM_F32 ? sizeof(float) : sizeof(uint16_t);
    char *kc = malloc((size_t)rows * kv_dim * es), *vc = malloc((size_t)rows * kv_dim * es);
    int *pos = malloc(SEQ_L * sizeof *pos);
    assert_true(kc && vc && pos);
    for (int i = 0; i < SEQ_L; i++) pos[i] = i;
    for (int i0 = 0; i0 < SEQ_L; i0 += step) {
        int n = SEQ_L - i0 < step ? SEQ_L - i0 : step;
        for (int t = i0; t < i0 + n; t++) {
            size_t to = (size_t)(t % rows) * kv_dim * es;
            qlm_convert_from_f32(kc + to, sh->kv_dtype, k + (size_t)t * kv_dim, kv_dim);
            qlm_convert_from_f32(vc + to, sh->kv_dtype, v + (size_t)t * kv_dim, kv_dim);
        }
        qlm_backend_cpu()->attention(out + (size_t)i0 * q_dim, q + (size_t)i0 * q_dim, kc, vc, n, pos + i0, sh);
    }
    free(kc), free(vc), free(pos);
}

/* The sequence's rows give the same bits in steps of 1, 7, 64 and 100 rows as whole (rolling
 * caches: the largest step), and whole on 1 and 3 threads: causal over three key chunks, with a
 * 300-key window, with that window in a rolling cache, with a soft cap; in each cache dtype. */
static void test_rows_whatever_the_call(void **state) {
    (void)state;
    const int q_dim = SEQ_HEADS * SEQ_HD, kv_dim = SEQ_KV_HEADS * SEQ_HD, steps[] = {1, 7, 64, 100};
    float *q = malloc((size_t)SEQ_L * q_dim * sizeof *q), *k = malloc((size_t)SEQ_L * kv_dim * sizeof *k);
    float *v = malloc((size_t)SEQ_L * kv_dim * sizeof *v);
    float *whole = malloc((size_t)SEQ_L * q_dim * sizeof *whole), *got = malloc((size_t)SEQ_L * q_dim * sizeof *got);
    assert_true(q && k && v && whole && got);
    unsigned seed = 41u;
    for (int i = 0; i < SEQ_L * q_dim; i++) q[i] = 2 * frand(&seed);
    for (int i = 0; i < SEQ_L * kv_dim; i++) k[i] = frand(&seed), v[i] = frand(&seed);
    const int threads = omp_get_max_threads();
    for (size_t d = 0; d < sizeof kv_dtypes / sizeof kv_dtypes[0]; d++)
        for (int kind = 0; kind < 4; kind++) {
            /* 0: causal, 1: window, 2: window in a rolling cache, 3: soft cap */
            qlm_attn_shape sh = {.n_heads = SEQ_HEADS, .n_kv_heads = SEQ_KV_HEADS, .head_dim = SEQ_HD,
                                 .scale = 0.125f, .kv_dtype = kv_dtypes[d]};
            if (kind == 1 || kind == 2) sh.window = 300;
            if (kind == 2) sh.ring = 300 + 100 - 1;
            if (kind == 3) sh.softcap = 2.5f;
            sequence_in_steps(whole, q, k, v, kind == 2 ? 100 : SEQ_L, &sh);
            for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
                sequence_in_steps(got, q, k, v, steps[s], &sh);
                assert_memory_equal(got, whole, (size_t)SEQ_L * q_dim * sizeof *got);
            }
            for (int t = 1; t <= 3; t += 2) {
                omp_set_num_threads(t);
                sequence_in_steps(got, q, k, v, kind == 2 ? 100 : SEQ_L, &sh);
                omp_set_num_threads(threads);
                assert_memory_equal(got, whole, (size_t)SEQ_L * q_dim * sizeof *got);
            }
            print_message("%s keys, %s: the same bits in steps of 1, 7, 64, 100 and whole, on 1 and 3 threads\n",
                          qlm_dtype_name(kv_dtypes[d]),
                          kind == 0 ? "causal" : kind == 1 ? "window 300" : kind == 2 ? "window in a rolling cache" : "soft cap");
        }
    free(q), free(k), free(v), free(whole), free(got);
}

/* kv_store into each cache dtype, at position 1 of slot 1: the element read back is the value
 * rounded to that dtype (the caches' layout, core/kv_cache.h), and F16 holds values past its range
 * at its largest finite one, not infinity. */
static void test_kv_store_dtypes(void **state) {
    (void)state;
    enum { HEADS = 2, HD = 70, MAX_POS = 3, SLOTS = 2 }; /* 70: one F16 conversion part and a tail */
    const float big[] = {1e6f, -7e4f, 65504.0f, NAN};
    float k[HEADS * HD], v[HEADS * HD];
    for (int i = 0; i < HEADS * HD; i++) k[i] = 0.1f * (float)i - 3.3f, v[i] = i < 4 ? big[i] : -0.05f * (float)i;
    const qlm_backend *be = qlm_backend_cpu();
    for (size_t d = 0; d < sizeof kv_dtypes / sizeof kv_dtypes[0]; d++) {
        qlm_dtype dt = kv_dtypes[d];
        size_t es = dt == QLM_F32 ? 4 : 2, n = (size_t)SLOTS * HEADS * MAX_POS * HD;
        char *kc = calloc(n, es), *vc = calloc(n, es);
        assert_true(kc && vc);
        int pos = 1;
        be->kv_store(kc, vc, dt, k, v, 1, NULL, 1, &pos, HEADS, HD, MAX_POS);
        for (int h = 0; h < HEADS; h++)
            for (int e = 0; e < HD; e++) {
                size_t at = (((size_t)1 * HEADS + h) * MAX_POS + 1) * HD + e;
                float got_k, got_v, want_k = k[h * HD + e], want_v = v[h * HD + e];
                qlm_convert_to_f32(&got_k, kc + at * es, dt, 1);
                qlm_convert_to_f32(&got_v, vc + at * es, dt, 1);
                if (dt == QLM_F16 && !isnan(want_v)) want_v = fminf(fmaxf(want_v, -65504.0f), 65504.0f);
                float rk, rv;
                char buf[8];
                qlm_convert_from_f32(buf, dt, &want_k, 1), qlm_convert_to_f32(&rk, buf, dt, 1);
                qlm_convert_from_f32(buf, dt, &want_v, 1), qlm_convert_to_f32(&rv, buf, dt, 1);
                assert_true(got_k == rk);
                assert_true(isnan(rv) ? isnan(got_v) : got_v == rv);
            }
        if (dt == QLM_F16) {
            float first;
            qlm_convert_to_f32(&first, vc + (((size_t)1 * HEADS) * MAX_POS + 1) * HD * es, dt, 1);
            assert_true(first == 65504.0f);
        }
        free(kc), free(vc);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_store_dtypes),
        cmocka_unit_test(test_few_rows),
        cmocka_unit_test(test_many_rows),
        cmocka_unit_test(test_slots),
        cmocka_unit_test(test_prefill_beside_decode),
        cmocka_unit_test(test_rows_whatever_the_call),
        cmocka_unit_test(test_head_major_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
