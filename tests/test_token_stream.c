/* The token stream's text is valid UTF-8 whatever the model samples: a character split over byte
 * tokens is held until complete, and a byte token that starts no valid sequence becomes U+FFFD
 * (as in `generate --json` and the server's JSON, which must be valid UTF-8). */
#include "../runtime/token_stream.h"
#include "../tokenizer/tokenizer.h"
#include "test_util.h"

typedef struct {
    char text[256];
    size_t len;
    int calls_with_partial; /* emits that ended inside a multi-byte character */
} sink;

static int collect(void *user, const char *text, size_t len) {
    sink *s = user;
    memcpy(s->text + s->len, text, len);
    s->len += len;
    unsigned char last = (unsigned char)text[len - 1];
    if (last >= 0xC0) s->calls_with_partial++;
    return 0;
}

/* Feeds the ids one by one through greedy sampling of one-hot logits. */
static void run(const qlm_tokenizer *tok, const int *ids, int n, sink *out) {
    int vocab = qlm_tokenizer_vocab_size(tok);
    qlm_gen_params p = {.max_new_tokens = 64};
    p.sampling.temperature = 0;
    qlm_gen_stats stats;
    qlm_token_stream ts;
    assert_int_equal(qlm_token_stream_init(&ts, tok, &p, vocab, -1, collect, out, &stats), 0);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    for (int i = 0; i < n; i++) {
        for (int v = 0; v < vocab; v++) logits[v] = v == ids[i] ? 10.0f : 0.0f;
        int id;
        assert_int_equal(qlm_token_stream_next(&ts, logits, ids, i, &id), 0);
        assert_int_equal(id, ids[i]);
    }
    qlm_token_stream_finish(&ts);
    free(logits);
    out->text[out->len] = 0;
}

static void test_invalid_and_split_bytes(void **state) {
    (void)state;
    char path[512];
    test_asset(path, sizeof path, "stories260K/tok512.bin");
    REQUIRE_ASSET(path);
    qlm_tokenizer *tok = qlm_tokenizer_load_llama2c(path, 512);
    assert_non_null(tok);
    int a = qlm_tokenizer_find(tok, "a"), dot = qlm_tokenizer_find(tok, "."), e0 = qlm_tokenizer_find(tok, "<0xE0>"),
        e2 = qlm_tokenizer_find(tok, "<0xE2>"), x82 = qlm_tokenizer_find(tok, "<0x82>"), xac = qlm_tokenizer_find(tok, "<0xAC>");
    assert_true(a >= 0 && dot >= 0 && e0 >= 0 && e2 >= 0 && x82 >= 0 && xac >= 0);
    /* "a", a lone 0xE0, ".", then the euro sign E2 82 AC spread over three tokens, then "." */
    int ids[] = {a, e0, dot, e2, x82, xac, dot};
    sink s = {0};
    run(tok, ids, 7, &s);
    assert_string_equal(s.text, "a\xEF\xBF\xBD.\xE2\x82\xAC.");
    assert_int_equal(s.calls_with_partial, 0);
    /* A character cut off by the end of generation still leaves valid text. */
    int cut[] = {a, e2, x82};
    sink t = {0};
    run(tok, cut, 3, &t);
    assert_string_equal(t.text, "a\xEF\xBF\xBD\xEF\xBF\xBD");
    qlm_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_invalid_and_split_bytes)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
