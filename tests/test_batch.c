/* The batch scheduler gives every request exactly what a session alone gives it: texts,
 * ids and stop reasons for a mix of prompts, lengths, stop strings and seeded sampling, with
 * fewer slots than requests so that slots are reused; for a decoder (stories260K, with its
 * tokenizer) and for T5 (the gated_untied fixture, ids only). */
#include "../runtime/batch.h"
#include "../core/error.h"
#include "../loaders/model_source.h"
#include "test_util.h"

enum { N_REQ = 7 };

typedef struct {
    int ids[320], n_ids;
    qlm_gen_params params;
    int out[64];
    const char *stops[1];
} request;

typedef struct {
    request *reqs;
    int next, n;
    char *text[N_REQ];
    qlm_gen_stats stats[N_REQ];
    int order[N_REQ], n_done;
} run_ctx;

static int next_req(void *ctx, qlm_batch_request *req) {
    run_ctx *c = ctx;
    if (c->next == c->n) return 0;
    request *r = &c->reqs[c->next];
    *req = (qlm_batch_request){.ids = r->ids, .n_ids = r->n_ids, .params = &r->params, .user = (void *)(intptr_t)c->next};
    c->next++;
    return 1;
}

static int done_req(void *ctx, const qlm_batch_request *req, const char *text, size_t len, const qlm_gen_stats *st) {
    run_ctx *c = ctx;
    int i = (int)(intptr_t)req->user;
    c->text[i] = strndup(text, len);
    c->stats[i] = *st;
    c->order[c->n_done++] = i;
    return 0;
}

static int collect(void *user, const char *text, size_t len) {
    char **acc = user;
    size_t old = *acc ? strlen(*acc) : 0;
    *acc = realloc(*acc, old + len + 1);
    memcpy(*acc + old, text, len);
    (*acc)[old + len] = 0;
    return 0;
}

/* Requests: prompts of 1..19 tokens (or the lengths given) whose first `shared` tokens are the same,
 * 0..40 new tokens, one stop string, some sampled. */
static void make_requests(request *r, int vocab, int first_id, const int *lengths, int shared) {
    for (int i = 0; i < N_REQ; i++) {
        r[i].n_ids = lengths ? lengths[i] : 1 + (i * 7) % 19;
        r[i].ids[0] = first_id;
        for (int k = 1; k < r[i].n_ids; k++) r[i].ids[k] = 3 + ((k < shared ? 0 : i * 31) + k * 17) % (vocab - 3);
        r[i].params = (qlm_gen_params){.sampling = qlm_sampling_defaults(), .max_new_tokens = (i * 13) % 41,
                                       .out_ids = r[i].out};
        r[i].params.sampling.temperature = i % 3 == 2 ? 1.0f : 0.0f;
        r[i].params.sampling.seed = 100 + i;
        if (i == 4) {
            r[i].stops[0] = "the";
            r[i].params.stop = r[i].stops;
            r[i].params.n_stop = 1;
        }
    }
}

/* Returns the prompt tokens the batch reused from earlier prompts' caches. */
static long compare(const qlm_batch_config *bc, request *reqs, qlm_session *single) {
    run_ctx c = {.reqs = reqs, .n = N_REQ};
    qlm_batch_stats bs;
    if (qlm_batch_run(bc, next_req, done_req, &c, &bs) != 0) fail_msg("%s", qlm_last_error());
    assert_int_equal(c.n_done, N_REQ);
    assert_int_equal(bs.requests, N_REQ);
    for (int i = 0; i < N_REQ; i++) {
        int batch_out[64];
        memcpy(batch_out, reqs[i].out, sizeof batch_out);
        char *text = NULL;
        qlm_gen_stats st;
        assert_int_equal(qlm_session_sync(single, reqs[i].ids, reqs[i].n_ids, NULL), 0);
        assert_int_equal(qlm_session_generate(single, &reqs[i].params, collect, &text, &st), 0);
        assert_int_equal(c.stats[i].n_generated, st.n_generated);
        assert_int_equal(c.stats[i].reason, st.reason);
        assert_memory_equal(batch_out, reqs[i].out, (size_t)st.n_generated * sizeof(int));
        assert_string_equal(c.text[i], text ? text : "");
        free(text);
        free(c.text[i]);
    }
    print_message("batch of %d requests in %d slots: %ld decode steps, %ld tokens generated, completion order", N_REQ,
                  bc->n_slots, bs.steps, bs.generated_tokens);
    for (int i = 0; i < N_REQ; i++) print_message(" %d", c.order[i]);
    print_message("; %ld prompt tokens reused\n", bs.reused_tokens);
    return bs.reused_tokens;
}

/* stories260K (llama2.c, with its tokenizer) built in dtype dt. */
static void open_stories260k(qlm_source *src, qlm_model *m, qlm_dtype dt) {
    char path[512];
    test_asset(path, sizeof path, "stories260K");
    REQUIRE_ASSET(path);
    if (qlm_source_open(src, path, NULL) != 0) fail_msg("%s", qlm_last_error());
    qlm_model_options o = {.dtype = dt, .backend = test_backend()};
    assert_int_equal(qlm_model_build(m, &src->cfg, src->store, &o), 0);
}

/* stories260K requests of the given prompt lengths (NULL: 1..19) through a 3-slot batch and alone,
 * weights in dt; returns the prompt tokens the batch reused. */
static long decoder_vs_session(const int *lengths, int max_prompt, int shared, qlm_dtype dt) {
    qlm_source src;
    qlm_model m;
    open_stories260k(&src, &m, dt);
    request reqs[N_REQ];
    make_requests(reqs, m.cfg.vocab_size, qlm_tokenizer_bos(src.tok), lengths, shared);
    qlm_session single;
    assert_int_equal(qlm_session_init(&single, &m, src.tok, max_prompt + 44, 64), 0);
    qlm_batch_config bc = {.model = &m, .tok = src.tok, .n_slots = 3, .max_prompt = max_prompt, .max_output = 44};
    long reused = compare(&bc, reqs, &single);
    qlm_session_free(&single);
    qlm_model_free(&m);
    qlm_source_close(&src);
    return reused;
}

static void test_decoder_matches_session(void **state) {
    (void)state;
    /* Prompts that share only BOS evaluate all their tokens. */
    assert_int_equal(decoder_vs_session(NULL, 20, 0, QLM_F32), 0);
}

/* Prompts of up to 300 tokens: the ones that fit beside the decode rows of a step join it, longer
 * ones are prefilled alone in chunks; with F32 weights and caches, and on the CPU (whose ops give a
 * row the same bits whatever rows are beside it) with BF16 ones too, where more near ties would
 * show a row that rounds otherwise in a batch. */
static void test_decoder_long_prompts(void **state) {
    (void)state;
    static const int lengths[N_REQ] = {300, 40, 260, 5, 120, 2, 253};
    assert_int_equal(decoder_vs_session(lengths, 320, 0, QLM_F32), 0);
    if (test_backend() == qlm_backend_cpu()) assert_int_equal(decoder_vs_session(lengths, 320, 0, QLM_BF16), 0);
}

/* Prompts that start with the same 40 tokens (as a chat template's system block and instruction
 * do): the first one's keys and values serve the other six, which evaluate only the rest, and each
 * still gets what a session gives it (which skips the prefix it shares with its previous prompt).
 * The two that arrive with the first wait one step for its prefix rather than evaluate their own. */
static void test_decoder_shared_prefix(void **state) {
    (void)state;
    static const int lengths[N_REQ] = {60, 45, 70, 41, 90, 50, 120};
    assert_int_equal(decoder_vs_session(lengths, 128, 40, QLM_F32), 6 * 40);
}

static void test_t5_matches_session(void **state) {
    (void)state;
    qlm_source src;
    if (qlm_source_open(&src, "tests/fixtures/t5/gated_untied", NULL) != 0) fail_msg("%s", qlm_last_error());
    assert_true(src.is_t5);
    qlm_t5_model m;
    qlm_model_options o = {.dtype = QLM_F32, .backend = test_backend()};
    assert_int_equal(qlm_t5_build(&m, &src.t5, src.store, &o), 0);
    request reqs[N_REQ];
    make_requests(reqs, m.cfg.vocab_size, 5, NULL, 0);
    qlm_session single;
    assert_int_equal(qlm_session_init_t5(&single, &m, NULL, 20, 45), 0);
    qlm_batch_config bc = {.t5 = &m, .n_slots = 4, .max_prompt = 20, .max_output = 44};
    compare(&bc, reqs, &single);
    qlm_session_free(&single);
    qlm_t5_free(&m);
    qlm_source_close(&src);
}

/* Streaming: each request's pieces arrive through its emit callback and add up to its text; one
 * that cancels (its callback returns non-zero) ends with QLM_STOP_CALLER and the others are as
 * they would be alone. */
typedef struct {
    char text[4096];
    size_t len;
    int pieces, cancel_after;
} stream_sink;

static stream_sink g_sinks[N_REQ];

static int sink_emit(void *user, const char *text, size_t len) {
    stream_sink *k = user;
    if (k->len + len < sizeof k->text) memcpy(k->text + k->len, text, len);
    k->len += len;
    k->text[k->len < sizeof k->text ? k->len : sizeof k->text - 1] = 0;
    return k->cancel_after && ++k->pieces >= k->cancel_after;
}

static int next_streamed(void *ctx, qlm_batch_request *req) {
    int r = next_req(ctx, req);
    if (r == 1) {
        req->emit = sink_emit;
        req->emit_user = &g_sinks[(intptr_t)req->user];
    }
    return r;
}

static void test_streaming_and_cancel(void **state) {
    (void)state;
    qlm_source src;
    qlm_model m;
    open_stories260k(&src, &m, QLM_F32);
    request reqs[N_REQ];
    make_requests(reqs, m.cfg.vocab_size, qlm_tokenizer_bos(src.tok), NULL, 0);
    memset(g_sinks, 0, sizeof g_sinks);
    g_sinks[3].cancel_after = 3; /* request 3 asks for 39 tokens */
    run_ctx c = {.reqs = reqs, .n = N_REQ};
    qlm_batch_config bc = {.model = &m, .tok = src.tok, .n_slots = 3, .max_prompt = 20, .max_output = 44};
    if (qlm_batch_run(&bc, next_streamed, done_req, &c, NULL) != 0) fail_msg("%s", qlm_last_error());
    qlm_session single;
    assert_int_equal(qlm_session_init(&single, &m, src.tok, 64, 64), 0);
    for (int i = 0; i < N_REQ; i++) {
        assert_string_equal(g_sinks[i].text, c.text[i]);
        if (i == 3) {
            assert_int_equal(c.stats[i].reason, QLM_STOP_CALLER);
            assert_true(c.stats[i].n_generated < reqs[i].params.max_new_tokens);
        } else {
            char *text = NULL;
            assert_int_equal(qlm_session_sync(&single, reqs[i].ids, reqs[i].n_ids, NULL), 0);
            assert_int_equal(qlm_session_generate(&single, &reqs[i].params, collect, &text, NULL), 0);
            assert_string_equal(c.text[i], text ? text : "");
            free(text);
        }
        free(c.text[i]);
    }
    print_message("streamed %d requests; request 3 cancelled after %d pieces (%d tokens)\n", N_REQ,
                  g_sinks[3].pieces, c.stats[3].n_generated);
    qlm_session_free(&single);
    qlm_model_free(&m);
    qlm_source_close(&src);
}

static int refuse(void *ctx, qlm_batch_request *req) {
    (void)ctx;
    static int ids[100];
    *req = (qlm_batch_request){.ids = ids, .n_ids = 100};
    return 1;
}

static int unused_done(void *ctx, const qlm_batch_request *req, const char *text, size_t len, const qlm_gen_stats *st) {
    (void)ctx, (void)req, (void)text, (void)len, (void)st;
    return 0;
}

static void test_errors(void **state) {
    (void)state;
    qlm_source src;
    if (qlm_source_open(&src, "tests/fixtures/t5/relu_tied", NULL) != 0) fail_msg("%s", qlm_last_error());
    qlm_t5_model m;
    qlm_model_options o = {.dtype = QLM_F32, .backend = test_backend()};
    assert_int_equal(qlm_t5_build(&m, &src.t5, src.store, &o), 0);
    qlm_batch_config bc = {.t5 = &m, .n_slots = 2, .max_prompt = 20, .max_output = 8};
    assert_int_equal(qlm_batch_run(&bc, refuse, unused_done, NULL, NULL), -1);
    assert_non_null(strstr(qlm_last_error(), "100 tokens"));
    bc.n_slots = 0;
    assert_int_equal(qlm_batch_run(&bc, refuse, unused_done, NULL, NULL), -1);
    qlm_t5_free(&m);
    qlm_source_close(&src);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decoder_matches_session),
        cmocka_unit_test(test_decoder_long_prompts),
        cmocka_unit_test(test_decoder_shared_prefix),
        cmocka_unit_test(test_t5_matches_session),
        cmocka_unit_test(test_streaming_and_cancel),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
