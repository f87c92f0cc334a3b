/* The embedded default model, SmolLM2-135M-Instruct (GGUF Q4_1), against transformers loading
 * the same GGUF (tools/make_smollm2_reference.py): last-position logits, the top-20 logits of
 * every prompt position, and a 32-token greedy continuation, in F32. Lower precisions are
 * reported and held to loose bounds. */
#include <cjson/cJSON.h>
#include <math.h>

#include "../core/error.h"
#include "../runtime/generate.h"
#include "../models/model.h"
#include "../quant/matmul.h"
#include "../loaders/model_source.h"
#include "test_util.h"

#define FIX "tests/fixtures/smollm2"

static qlm_source g_src;
static cJSON *g_ref;

static int setup(void **state) {
    (void)state;
    char *text = test_read_file(FIX "/reference.json", NULL);
    if (!text) return -1;
    g_ref = cJSON_Parse(text);
    free(text);
    return g_ref ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    cJSON_Delete(g_ref);
    if (g_src.store) qlm_source_close(&g_src);
    return 0;
}

static void open_model(void) {
    char path[512];
    test_default_gguf(path, sizeof path);
    REQUIRE_ASSET(path);
    if (!g_src.store && qlm_source_open(&g_src, path, NULL) != 0) fail_msg("%s", qlm_last_error());
}

static int *ids_of(const cJSON *arr, int *n) {
    *n = cJSON_GetArraySize(arr);
    int *ids = malloc((size_t)*n * sizeof *ids);
    for (int i = 0; i < *n; i++) ids[i] = cJSON_GetArrayItem(arr, i)->valueint;
    return ids;
}

/* Compares one prompt; returns max |diff| over the last logits and all top-20 entries. Counts the
 * free-running greedy tokens equal to the reference before the first difference (greedy_ok) and
 * the reference continuation positions whose argmax qlm also picks (forced_ok). */
static double compare_prompt(const qlm_model *m, const char *key, int *greedy_ok, int *forced_ok,
                             int n_greedy_check) {
    const cJSON *p = cJSON_GetObjectItem(cJSON_GetObjectItem(g_ref, "prompts"), key);
    assert_non_null(p);
    int n, n_greedy, vocab = m->cfg.vocab_size;
    int *prompt = ids_of(cJSON_GetObjectItem(p, "prompt_ids"), &n);
    int *greedy = ids_of(cJSON_GetObjectItem(p, "greedy_ids"), &n_greedy);
    char path[256];
    size_t len;
    snprintf(path, sizeof path, FIX "/%s.last_logits.f32", key);
    float *last = (float *)test_read_file(path, &len);
    assert_non_null(last);
    assert_int_equal(len, (size_t)vocab * 4);
    snprintf(path, sizeof path, FIX "/%s.top20_ids.i32", key);
    int *top_ids = (int *)test_read_file(path, &len);
    assert_int_equal(len, (size_t)n * 20 * 4);
    snprintf(path, sizeof path, FIX "/%s.top20_logits.f32", key);
    float *top_logits = (float *)test_read_file(path, &len);
    assert_int_equal(len, (size_t)n * 20 * 4);

    qlm_kv_state st;
    assert_int_equal(qlm_state_init(&st, m, n, n), 0);
    int *pos = malloc((size_t)n * sizeof *pos), *rows = malloc((size_t)n * sizeof *rows);
    float *logits = malloc((size_t)n * vocab * sizeof *logits);
    for (int i = 0; i < n; i++) pos[i] = rows[i] = i;
    assert_int_equal(qlm_forward(m, &st, prompt, pos, n, rows, n, logits), 0);
    double worst = 0;
    for (int v = 0; v < vocab; v++) worst = fmax(worst, fabs(logits[(size_t)(n - 1) * vocab + v] - last[v]));
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 20; k++) {
            int id = top_ids[i * 20 + k];
            assert_true(id >= 0 && id < vocab);
            worst = fmax(worst, fabs(logits[(size_t)i * vocab + id] - top_logits[i * 20 + k]));
        }
    qlm_state_free(&st, m);

    /* Teacher-forced: the argmax after each reference token, so one near-tie does not end the count. */
    int nf = n + n_greedy - 1;
    int *forced = malloc((size_t)nf * sizeof *forced), *fpos = malloc((size_t)nf * sizeof *fpos);
    int *frows = malloc((size_t)n_greedy * sizeof *frows);
    float *flogits = malloc((size_t)n_greedy * vocab * sizeof *flogits);
    for (int i = 0; i < nf; i++) {
        forced[i] = i < n ? prompt[i] : greedy[i - n];
        fpos[i] = i;
    }
    for (int j = 0; j < n_greedy; j++) frows[j] = n - 1 + j;
    assert_int_equal(qlm_state_init(&st, m, nf, nf), 0);
    assert_int_equal(qlm_forward(m, &st, forced, fpos, nf, frows, n_greedy, flogits), 0);
    *forced_ok = 0;
    for (int j = 0; j < n_greedy; j++) {
        const float *row = flogits + (size_t)j * vocab;
        int best = 0;
        for (int v = 1; v < vocab; v++)
            if (row[v] > row[best]) best = v;
        *forced_ok += best == greedy[j];
    }
    qlm_state_free(&st, m);
    free(forced);
    free(fpos);
    free(frows);
    free(flogits);

    qlm_session s;
    assert_int_equal(qlm_session_init(&s, m, NULL, n + n_greedy + 1, 64), 0);
    assert_int_equal(qlm_session_sync(&s, prompt, n, NULL), 0);
    int *out = calloc((size_t)n_greedy, sizeof *out);
    qlm_gen_params gp = {.sampling = qlm_sampling_defaults(), .max_new_tokens = n_greedy_check, .out_ids = out};
    gp.sampling.temperature = 0;
    assert_int_equal(qlm_session_generate(&s, &gp, NULL, NULL, NULL), 0);
    *greedy_ok = 0;
    while (*greedy_ok < n_greedy_check && out[*greedy_ok] == greedy[*greedy_ok]) (*greedy_ok)++;
    qlm_session_free(&s);
    free(out);
    free(prompt);
    free(greedy);
    free(last);
    free(top_ids);
    free(top_logits);
    free(pos);
    free(rows);
    free(logits);
    return worst;
}

static void check_options(qlm_model_options o, double tol, int min_greedy, int min_forced) {
    const qlm_dtype dt = o.dtype;
    const int per_channel = o.per_channel;
    qlm_model m;
    if (qlm_model_build(&m, &g_src.cfg, g_src.store, &o) != 0) fail_msg("%s", qlm_last_error());
    const char *keys[] = {"chat_capital", "plain_fox"};
    for (int k = 0; k < 2; k++) {
        int greedy = 0, forced = 0;
        double diff = compare_prompt(&m, keys[k], &greedy, &forced, 32);
        print_message("smollm2 %-5s%s %-12s max|logit diff| %.3g, greedy %d/32 equal, teacher-forced top-1 %d/32\n",
                      qlm_dtype_name(dt), per_channel ? "-pc" : o.act8 ? "-w8a8" : o.as_stored ? "-as-stored" : "   ", keys[k], diff,
                      greedy, forced);
        assert_true(diff <= tol);
        assert_true(greedy >= min_greedy);
        assert_true(forced >= min_forced);
    }
    qlm_model_free(&m);
}

static void check_dtype(qlm_dtype dt, int per_channel, double tol, int min_greedy, int min_forced) {
    open_model();
    check_options((qlm_model_options){.dtype = dt, .per_channel = per_channel, .backend = test_backend()}, tol,
                  min_greedy, min_forced);
}

static void test_f32_matches_transformers(void **state) {
    (void)state;
    check_dtype(QLM_F32, 0, 1e-4, 32, 32);
}

/* Free-running greedy text in BF16 and INT8 is not stable across instruction sets: a near-tie
 * decides it (BF16 plain_fox: 32/32 equal with AVX512_BF16's dot products, 8/32 on an AVX-512
 * CPU without them, where BF16 products are summed in another order; INT8 leaves the reference
 * two tokens in, at 1.15 max logit error). So the bounds are on the logits and on the
 * teacher-forced top-1 agreement along the reference continuation, which every kernel keeps. */
static void test_bf16_close(void **state) {
    (void)state;
    check_dtype(QLM_BF16, 0, 1.0, 0, 30);
}

static void test_int8_close(void **state) {
    (void)state;
    check_dtype(QLM_I8, 1, 2.5, 0, 28);
}

/* The file's own blocks (Q4_1 layers, Q8_0 embedding) run as stored: the weights are the values
 * transformers dequantizes, so only x's 16-bit integer form (a relative rounding of 1/65534 of
 * each row's largest value) and the F16 caches part the logits from the F32 reference: 0.059-0.075
 * measured (0.038 with F32 caches, see qlm_kv_dtype), against 0.41 for BF16 weights. */
static void test_as_stored_blocks_close(void **state) {
    (void)state;
    open_model();
    const qlm_tensor_entry *q = qlm_store_find(g_src.store, "model.layers.0.self_attn.q_proj.weight");
    const qlm_tensor_entry *e = qlm_store_find(g_src.store, "model.embed_tokens.weight");
    assert_true(q && e && q->dtype == QLM_Q4_1 && e->dtype == QLM_Q8_0 && q->group == 32);
    check_options((qlm_model_options){.dtype = g_src.stored_dtype, .as_stored = 1, .backend = test_backend()}, 0.1,
                  0, 31);
}

/* The same blocks in W8A8 (panels, x in bytes with a scale per 32 values): x's 8-bit rounding
 * (1/254 of each run's largest value) is what parts the logits from the reference now: 1.01 and
 * 1.7 at most over the two prompts' top-20 logits (INT8 weights with 16-bit x: 1.73 and 1.3),
 * while perplexity moves by 0.1-0.3% (docs/benchmarks.md). Where the
 * kernels have no byte dot products the command line leaves W8A8 off, so there is nothing of
 * theirs to check. */
static void test_as_stored_w8a8_close(void **state) {
    (void)state;
    if (!qlm_matmul_w8a8()) {
        print_message("kernels %s have no W8A8 path: nothing to check\n", qlm_matmul_isa());
        return;
    }
    open_model();
    check_options((qlm_model_options){.dtype = g_src.stored_dtype, .as_stored = 1, .act8 = 1, .backend = test_backend()},
                  2.5, 0, 30);
}

static void test_config_and_tokenizer(void **state) {
    (void)state;
    open_model();
    const qlm_llama_config *c = &g_src.cfg;
    assert_int_equal(c->dim, 576);
    assert_int_equal(c->n_layers, 30);
    assert_int_equal(c->n_heads, 9);
    assert_int_equal(c->n_kv_heads, 3);
    assert_int_equal(c->vocab_size, 49152);
    assert_true(c->tie_embeddings);
    assert_non_null(g_src.tok);
    const cJSON *p = cJSON_GetObjectItem(cJSON_GetObjectItem(g_ref, "prompts"), "plain_fox");
    const char *text = cJSON_GetObjectItem(p, "text")->valuestring;
    int *ids = NULL, n = 0, n_ref;
    int *ref = ids_of(cJSON_GetObjectItem(p, "prompt_ids"), &n_ref);
    assert_int_equal(qlm_tokenizer_encode(g_src.tok, text, strlen(text), 1, 1, &ids, &n), 0);
    assert_int_equal(n, n_ref);
    assert_memory_equal(ids, ref, (size_t)n * sizeof *ids);
    free(ids);
    free(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_and_tokenizer),
        cmocka_unit_test(test_f32_matches_transformers),
        cmocka_unit_test(test_bf16_close),
        cmocka_unit_test(test_as_stored_blocks_close),
        cmocka_unit_test(test_as_stored_w8a8_close),
        cmocka_unit_test(test_int8_close),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
