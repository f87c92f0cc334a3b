/* qlm_gguf_tokenizer on small GGUF files written here: both tokenizer models build and encode,
 * and missing, mismatched or out-of-range tokenizer.ggml.* metadata gives an error naming the key.
 * (The real SmolLM2 GGUF is checked against reference ids in test_tokenizer.c.) */
#include "test_util.h"

#include <unistd.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "loaders/gguf.h"

enum { T_U32 = 4, T_I32 = 5, T_F32 = 6, T_BOOL = 7, T_STR = 8, T_ARR = 9 };

typedef struct {
    unsigned char *p;
    size_t n, cap;
    int n_kv;
} wbuf;

static void put(wbuf *b, const void *data, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_u32(wbuf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(wbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(wbuf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void key(wbuf *b, const char *k, uint32_t type) {
    put_str(b, k);
    put_u32(b, type);
    b->n_kv++;
}

static void kv_str(wbuf *b, const char *k, const char *v) {
    key(b, k, T_STR);
    put_str(b, v);
}

static void kv_u32(wbuf *b, const char *k, uint32_t v) {
    key(b, k, T_U32);
    put_u32(b, v);
}

static void kv_bool(wbuf *b, const char *k, int v) {
    key(b, k, T_BOOL);
    unsigned char c = (unsigned char)v;
    put(b, &c, 1);
}

static void kv_strs(wbuf *b, const char *k, const char *const *v, int n) {
    key(b, k, T_ARR);
    put_u32(b, T_STR);
    put_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++) put_str(b, v[i]);
}

static void kv_nums(wbuf *b, const char *k, uint32_t type, const void *v, int n) {
    key(b, k, T_ARR);
    put_u32(b, type);
    put_u64(b, (uint64_t)n);
    put(b, v, 4 * (size_t)n);
}

/* Writes a GGUF v3 file holding the metadata in kvs and no tensors; returns the opened file. */
static qlm_gguf *write_gguf(const char *path, const wbuf *kvs) {
    wbuf f = {0};
    put(&f, "GGUF", 4);
    put_u32(&f, 3);
    put_u64(&f, 0);
    put_u64(&f, (uint64_t)kvs->n_kv);
    put(&f, kvs->p, kvs->n);
    while (f.n % 32) put(&f, "", 1); /* the (empty) data section starts aligned */
    assert_int_equal(test_write_file(path, f.p, f.n), 0);
    free(f.p);
    qlm_gguf *g = qlm_gguf_open(path);
    if (!g) fail_msg("%s", qlm_last_error());
    return g;
}

static const char *const BYTE_TOKENS[] = {"<|endoftext|>", "a", "b", "ab", "\u0120", "\u0120ab"};
static const char *const BYTE_MERGES[] = {"a b", "\u0120 ab"};
static const int BYTE_TYPES[] = {3, 1, 1, 1, 1, 1};
static const char *const SPM_TOKENS[] = {"<unk>", "<s>", "</s>", "\u2581", "a", "\u2581a"};
static const float SPM_SCORES[] = {0, 0, 0, -1, -2, -0.5f};
static const int SPM_TYPES[] = {2, 3, 3, 1, 1, 1};

/* Metadata of a valid model; `drop` names one key to leave out, `bad` one key to write wrongly. */
static void byte_level_kvs(wbuf *b, const char *drop, const char *bad) {
    if (!drop || strcmp(drop, "model")) kv_str(b, "tokenizer.ggml.model", bad && !strcmp(bad, "model") ? "bert" : "gpt2");
    kv_str(b, "tokenizer.ggml.pre", bad && !strcmp(bad, "pre") ? "falcon-ish" : "smollm");
    if (!drop || strcmp(drop, "tokens")) kv_strs(b, "tokenizer.ggml.tokens", BYTE_TOKENS, 6);
    kv_nums(b, "tokenizer.ggml.token_type", T_I32, BYTE_TYPES, 6);
    if (!drop || strcmp(drop, "merges")) kv_strs(b, "tokenizer.ggml.merges", BYTE_MERGES, bad && !strcmp(bad, "merges") ? 1 : 2);
    kv_u32(b, "tokenizer.ggml.eos_token_id", bad && !strcmp(bad, "eos") ? 6 : 0);
    kv_bool(b, "tokenizer.ggml.add_bos_token", 0);
    kv_str(b, "tokenizer.chat_template", "{{ '<|im_start|>' }}");
}

static void spm_kvs(wbuf *b, const char *bad) {
    int types[6];
    memcpy(types, SPM_TYPES, sizeof(types));
    if (bad && !strcmp(bad, "token_type")) types[4] = 9;
    kv_str(b, "tokenizer.ggml.model", "llama");
    kv_strs(b, "tokenizer.ggml.tokens", SPM_TOKENS, 6);
    if (!bad || strcmp(bad, "scores")) kv_nums(b, "tokenizer.ggml.scores", T_F32, SPM_SCORES, 6);
    else kv_nums(b, "tokenizer.ggml.scores", T_F32, SPM_SCORES, 5);
    kv_nums(b, "tokenizer.ggml.token_type", T_I32, types, 6);
    if (bad && !strcmp(bad, "bos")) kv_u32(b, "tokenizer.ggml.bos_token_id", 1000);
}

static void expect_ids(const qlm_tokenizer *t, const char *text, int add_special, const int *want, int n_want) {
    int *ids = NULL, n = 0;
    assert_int_equal(qlm_tokenizer_encode(t, text, strlen(text), add_special, 1, &ids, &n), 0);
    assert_int_equal(n, n_want);
    for (int i = 0; i < n; i++) assert_int_equal(ids[i], want[i]);
    free(ids);
}

static void test_valid_models(void **state) {
    (void)state;
    char dir[256], path[512];
    assert_non_null(test_tmpdir(dir, sizeof(dir)));
    snprintf(path, sizeof(path), "%s/t.gguf", dir);
    wbuf b = {0};
    byte_level_kvs(&b, NULL, NULL);
    qlm_gguf *g = write_gguf(path, &b);
    qlm_tokenizer *t = qlm_gguf_tokenizer(g);
    if (!t) fail_msg("%s", qlm_last_error());
    expect_ids(t, "ab abab<|endoftext|>", 1, (const int[]){3, 5, 3, 0}, 4);
    assert_int_equal(qlm_tokenizer_eos(t), 0);
    assert_string_equal(qlm_tokenizer_chat_template(t), "{{ '<|im_start|>' }}");
    qlm_tokenizer_free(t);
    qlm_gguf_close(g);
    free(b.p);

    b = (wbuf){0};
    spm_kvs(&b, NULL);
    g = write_gguf(path, &b);
    t = qlm_gguf_tokenizer(g);
    if (!t) fail_msg("%s", qlm_last_error());
    /* Defaults for SentencePiece: bos 1, add_bos, "▁" prefix; "▁a" (-0.5) beats "▁" + "a". */
    expect_ids(t, "a a", 1, (const int[]){1, 5, 5}, 3);
    qlm_tokenizer_free(t);
    qlm_gguf_close(g);
    free(b.p);
    remove(path);
    rmdir(dir);
}

static void expect_error(const char *path, wbuf *b, const char *needle) {
    qlm_gguf *g = write_gguf(path, b);
    qlm_tokenizer *t = qlm_gguf_tokenizer(g);
    if (t) fail_msg("built a tokenizer; expected an error about %s", needle);
    if (!strstr(qlm_last_error(), needle)) fail_msg("error \"%s\" does not mention \"%s\"", qlm_last_error(), needle);
    qlm_gguf_close(g);
    free(b->p);
    *b = (wbuf){0};
}

static void test_bad_metadata(void **state) {
    (void)state;
    char dir[256], path[512];
    assert_non_null(test_tmpdir(dir, sizeof(dir)));
    snprintf(path, sizeof(path), "%s/t.gguf", dir);
    wbuf b = {0};
    static const struct {
        const char *drop, *bad, *needle;
    } cases[] = {
        {"model", NULL, "tokenizer.ggml.model"},   {"tokens", NULL, "tokenizer.ggml.tokens"},
        {"merges", NULL, "tokenizer.ggml.merges"}, {NULL, "model", "bert"},
        {NULL, "pre", "falcon-ish"},               {NULL, "eos", "eos_token_id"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        byte_level_kvs(&b, cases[i].drop, cases[i].bad);
        expect_error(path, &b, cases[i].needle);
    }
    byte_level_kvs(&b, NULL, "merges"); /* "Ġab" cannot be merged, which is fine */
    qlm_gguf *g = write_gguf(path, &b);
    qlm_tokenizer *t = qlm_gguf_tokenizer(g);
    assert_non_null(t);
    expect_ids(t, " ab", 0, (const int[]){4, 3}, 2);
    qlm_tokenizer_free(t);
    qlm_gguf_close(g);
    free(b.p);
    b = (wbuf){0};
    spm_kvs(&b, "scores");
    expect_error(path, &b, "tokenizer.ggml.scores");
    spm_kvs(&b, "token_type");
    expect_error(path, &b, "type 9");
    spm_kvs(&b, "bos");
    expect_error(path, &b, "bos_token_id");
    assert_null(qlm_gguf_tokenizer(NULL));
    remove(path);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_models),
        cmocka_unit_test(test_bad_metadata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
