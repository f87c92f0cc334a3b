/* The CUDA attention_backward against the CPU backend's (which tests/test_train*.c check against
 * torch) on random inputs: dq is poisoned with NaN first (it is overwritten), dk, dv and dpos_bias
 * start from random values (they accumulate), and a second GPU run from the same start must repeat
 * the first bit for bit. Built and run by `make test-cuda` only: it needs a GPU. */
#include <math.h>

#include "gpu_test_util.h"

typedef struct {
    const char *what;
    int n, heads, kv_heads, hd;
    int n_keys;    /* > 0: every row sees this many keys (rows at 0..n-1); 0: causal */
    int first_pos; /* causal: row i at first_pos + i, over first_pos + n keys */
    int window;
    float softcap;
    int bias; /* a T5 relative-position bias and its gradient */
} bwd_case;

/* The GPU's dq, dk, dv, dbias (dev[0..3], lens[0..3] values) from dk, dv, dbias starting at the host
 * values given and dq poisoned; dev[4..7] hold dout, q, k, v. */
static void run_gpu(const qlm_attn_shape *sh, float *const dev[8], const long lens[4], const float *dk0,
                    const float *dv0, const float *db0, int n, const int *pos, float *out[4]) {
    float *nan = malloc((size_t)lens[0] * sizeof *nan);
    assert_non_null(nan);
    for (long i = 0; i < lens[0]; i++) nan[i] = NAN;
    gpu->to_device(dev[0], nan, (size_t)lens[0] * sizeof *nan);
    gpu->to_device(dev[1], dk0, (size_t)lens[1] * sizeof *dk0);
    gpu->to_device(dev[2], dv0, (size_t)lens[2] * sizeof *dv0);
    if (db0) gpu->to_device(dev[3], db0, (size_t)lens[3] * sizeof *db0);
    assert_int_equal(gpu->attention_backward(dev[0], dev[1], dev[2], dev[3], dev[4], dev[5], dev[6], dev[7], n, pos, sh), 0);
    for (int j = 0; j < 4; j++) out[j] = dev[j] ? from_gpu(dev[j], lens[j]) : NULL;
    free(nan);
}

static void check_case(const bwd_case *c) {
    const int causal = c->n_keys <= 0, nk = causal ? c->first_pos + c->n : c->n_keys;
    qlm_attn_shape sh = {.n_heads = c->heads,
                         .n_kv_heads = c->kv_heads,
                         .head_dim = c->hd,
                         .scale = c->bias ? 1.0f : 1.0f / sqrtf((float)c->hd),
                         .n_keys = c->n_keys,
                         .window = c->window,
                         .softcap = c->softcap};
    int *pos = malloc((size_t)c->n * sizeof *pos);
    assert_non_null(pos);
    for (int i = 0; i < c->n; i++) pos[i] = causal ? c->first_pos + i : i;
    /* Relative positions t - p run from -(largest p) to nk - 1. */
    int max_pos = causal ? nk - 1 : c->n - 1;
    if (c->bias) sh.pos_bias_offset = max_pos, sh.pos_bias_span = max_pos + nk;
    long q_len = (long)c->n * c->heads * c->hd, kv_len = (long)nk * c->kv_heads * c->hd,
         b_len = (long)c->heads * sh.pos_bias_span;
    /* Scores large enough for the cap to bend; without the 1/sqrt(hd) scale (T5), smaller inputs
     * keep them in the range trained models give. */
    const float amp = c->softcap > 0 ? 3.0f : c->bias ? 1.0f : 1.5f;
    float *q = randv(q_len, 31u + (unsigned)c->n, amp), *k = randv(kv_len, 32u + (unsigned)nk, amp);
    float *v = randv(kv_len, 33u, 1.0f), *dout = randv(q_len, 34u, 1.0f);
    float *dk0 = randv(kv_len, 35u, 1.0f), *dv0 = randv(kv_len, 36u, 1.0f);
    float *bias = c->bias ? randv(b_len, 37u, 2.0f) : NULL, *db0 = c->bias ? randv(b_len, 38u, 1.0f) : NULL;

    float *want[4] = {malloc((size_t)q_len * sizeof(float)), malloc((size_t)kv_len * sizeof(float)),
                      malloc((size_t)kv_len * sizeof(float)), c->bias ? malloc((size_t)b_len * sizeof(float)) : NULL};
    assert_non_null(want[0]), assert_non_null(want[1]), assert_non_null(want[2]);
    for (long i = 0; i < q_len; i++) want[0][i] = NAN;
    memcpy(want[1], dk0, (size_t)kv_len * sizeof(float));
    memcpy(want[2], dv0, (size_t)kv_len * sizeof(float));
    if (c->bias) memcpy(want[3], db0, (size_t)b_len * sizeof(float));
    sh.pos_bias = bias;
    assert_int_equal(cpu->attention_backward(want[0], want[1], want[2], want[3], dout, q, k, v, c->n, pos, &sh), 0);

    /* dq, dk, dv, dbias, dout, q, k, v on the GPU */
    float *dev[8] = {gpu->alloc((size_t)q_len * sizeof(float)), gpu->alloc((size_t)kv_len * sizeof(float)),
                     gpu->alloc((size_t)kv_len * sizeof(float)), c->bias ? gpu->alloc((size_t)b_len * sizeof(float)) : NULL,
                     to_gpu(dout, (size_t)q_len * sizeof(float)), to_gpu(q, (size_t)q_len * sizeof(float)),
                     to_gpu(k, (size_t)kv_len * sizeof(float)), to_gpu(v, (size_t)kv_len * sizeof(float))};
    assert_non_null(dev[0]), assert_non_null(dev[1]), assert_non_null(dev[2]);
    qlm_attn_shape gsh = sh;
    gsh.pos_bias = c->bias ? to_gpu(bias, (size_t)b_len * sizeof(float)) : NULL;
    const long lens[4] = {q_len, kv_len, kv_len, b_len};
    float *got[4], *again[4];
    run_gpu(&gsh, dev, lens, dk0, dv0, db0, c->n, pos, got);
    run_gpu(&gsh, dev, lens, dk0, dv0, db0, c->n, pos, again);
    double d[4] = {0, 0, 0, 0};
    for (int j = 0; j < (c->bias ? 4 : 3); j++) {
        d[j] = rel_diff(got[j], want[j], lens[j]);
        assert_memory_equal(got[j], again[j], (size_t)lens[j] * sizeof(float));
    }
    print_message("attention_backward %-26s n %3d heads %d/%d hd %3d keys %3d: dq %.2e dk %.2e dv %.2e dbias %.2e\n",
                  c->what, c->n, c->heads, c->kv_heads, c->hd, nk, d[0], d[1], d[2], d[3]);
    for (int j = 0; j < 4; j++) assert_true(d[j] <= 1e-5);

    for (int j = 0; j < 4; j++) free(want[j]), free(got[j]), free(again[j]);
    for (int j = 0; j < 8; j++) gpu->free(dev[j]);
    gpu->free((void *)gsh.pos_bias);
    free(pos), free(q), free(k), free(v), free(dout), free(dk0), free(dv0), free(bias), free(db0);
}

static void test_attention_backward(void **state) {
    (void)state;
    static const bwd_case cases[] = {
        {.what = "causal MHA", .n = 7, .heads = 4, .kv_heads = 4, .hd = 64},
        {.what = "causal GQA", .n = 40, .heads = 8, .kv_heads = 2, .hd = 128},
        {.what = "causal, window 9", .n = 50, .heads = 6, .kv_heads = 3, .hd = 48, .window = 9},
        {.what = "causal after a prefix of 5", .n = 7, .heads = 4, .kv_heads = 2, .hd = 64, .first_pos = 5},
        {.what = "window after a prefix", .n = 10, .heads = 4, .kv_heads = 4, .hd = 48, .first_pos = 12, .window = 4},
        {.what = "one row after a prefix", .n = 1, .heads = 8, .kv_heads = 2, .hd = 64, .first_pos = 30},
        {.what = "one row, one key", .n = 1, .heads = 2, .kv_heads = 1, .hd = 32},
        {.what = "causal, 300 rows", .n = 300, .heads = 4, .kv_heads = 2, .hd = 64},
        {.what = "window, prefix, 300 rows", .n = 300, .heads = 2, .kv_heads = 1, .hd = 80, .first_pos = 20,
         .window = 64},
        {.what = "softcap", .n = 30, .heads = 8, .kv_heads = 2, .hd = 128, .softcap = 1.5f},
        {.what = "softcap, head_dim 256", .n = 12, .heads = 4, .kv_heads = 1, .hd = 256, .softcap = 2.0f},
        {.what = "T5 encoder: all keys", .n = 33, .heads = 8, .kv_heads = 8, .hd = 64, .n_keys = 33},
        {.what = "T5 cross-attention", .n = 7, .heads = 4, .kv_heads = 4, .hd = 80, .n_keys = 50},
        {.what = "T5 encoder + bias", .n = 33, .heads = 6, .kv_heads = 6, .hd = 64, .n_keys = 33, .bias = 1},
        {.what = "T5 decoder: causal + bias", .n = 20, .heads = 4, .kv_heads = 4, .hd = 48, .bias = 1},
        {.what = "T5 decoder, 300 rows + bias", .n = 300, .heads = 2, .kv_heads = 2, .hd = 64, .bias = 1},
        /* The tiled kernels' full and partial tiles and chunks: SmolLM2-135M's heads at 512 rows, a
         * window that cuts tiles at odd places after an offset, and head_dim between the templates. */
        {.what = "causal GQA 9/3, 512 rows", .n = 512, .heads = 9, .kv_heads = 3, .hd = 64},
        {.what = "window 37, prefix 29", .n = 100, .heads = 6, .kv_heads = 2, .hd = 96, .first_pos = 29, .window = 37},
    };
    for (size_t j = 0; j < sizeof cases / sizeof cases[0]; j++) check_case(&cases[j]);
}

int main(void) {
    gpu = qlm_backend_cuda();
    cpu = qlm_backend_cpu();
    if (!gpu) {
        fprintf(stderr, "test_attention_backward needs a GPU: %s\n", qlm_last_error());
        return 1;
    }
    if (!gpu->attention_backward) {
        fprintf(stderr, "test_attention_backward: the CUDA backend has no attention_backward\n");
        return 1;
    }
    char line[256];
    gpu->describe(line, sizeof line);
    printf("%s\n", line);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_attention_backward)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
