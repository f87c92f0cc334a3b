/* Tokenizers against reference ids from HF tokenizers / sentencepiece (tools/make_tokenizer_fixtures.py):
 * every corpus line of every tokenizer, decode and streaming pieces, known examples from the
 * asset README, speed, and malformed tokenizer.json / tokenizer.bin files. */
#include "test_util.h"

#include <cjson/cJSON.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "loaders/gguf.h"

#define FIXTURES "tests/fixtures/tokenizer/"

/* ---- corpus and fixtures ---- */

static int ids_match(const int *got, int n, const cJSON *want) {
    if (cJSON_GetArraySize(want) != n) return 0;
    for (int i = 0; i < n; i++)
        if (cJSON_GetArrayItem(want, i)->valueint != got[i]) return 0;
    return 1;
}

static void report(int rec, const char *what, const char *text, const int *got, int n, const cJSON *want) {
    char *w = want ? cJSON_PrintUnformatted(want) : NULL;
    print_message("record %d (%s) text=\"%.80s\"\n  got:", rec, what, text);
    for (int i = 0; i < n && i < 40; i++) print_message(" %d", got[i]);
    print_message("\n  want: %.300s\n", w ? w : "");
    free(w);
}

/* The ids with the BOS/EOS framing of add_special removed. */
static cJSON *unframed(const cJSON *ids, int add_bos, int add_eos) {
    cJSON *out = cJSON_CreateArray();
    int n = cJSON_GetArraySize(ids);
    for (int i = add_bos; i < n - add_eos; i++) cJSON_AddItemToArray(out, cJSON_CreateNumber(cJSON_GetArrayItem(ids, i)->valueint));
    return out;
}

typedef struct {
    int records, mismatches, streamed;
    int add_bos, add_eos, check_decs; /* from the fixture's meta line */
} tally;

static void check_text(const char *what, int rec, const char *got, const char *want, tally *t) {
    if (strcmp(got, want) == 0) return;
    print_message("record %d: %s\n  got:  \"%.200s\"\n  want: \"%.200s\"\n", rec, what, got, want);
    t->mismatches++;
}

/* A token decode(skip_special=1) drops (control/unknown). */
static int is_skipped(const qlm_tokenizer *tok, int id) {
    char *a = NULL, *b = NULL;
    assert_int_equal(qlm_tokenizer_decode(tok, &id, 1, 1, &a, NULL), 0);
    assert_int_equal(qlm_tokenizer_decode(tok, &id, 1, 0, &b, NULL), 0);
    int skipped = !*a && *b;
    free(a);
    free(b);
    return skipped;
}

/* The streamed pieces concatenate to decode(skip_special=1) when no skipped token follows the
 * first (the documented condition of qlm_tokenizer_piece). */
static void check_stream(const qlm_tokenizer *tok, int rec, const int *ids, int n, const char *dec, tally *t) {
    for (int i = 1; i < n; i++)
        if (is_skipped(tok, ids[i])) return;
    char *stream = calloc(64 * (size_t)n + 1, 1);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        int k = qlm_tokenizer_piece(tok, i > 0 ? ids[i - 1] : -1, ids[i], stream + at, 64);
        assert_true(k >= 0);
        at += (size_t)k;
    }
    check_text("streaming pieces", rec, stream, dec, t);
    t->streamed++;
    free(stream);
}

/* decode(ids, 1) against want_skip, decode(ids, 0) against want_keep (when not NULL), pieces. */
static void check_decode(const qlm_tokenizer *tok, int rec, const int *ids, int n, const char *want_skip,
                         const char *want_keep, tally *t) {
    char *dec = NULL;
    assert_int_equal(qlm_tokenizer_decode(tok, ids, n, 1, &dec, NULL), 0);
    check_text("decode(skip_special=1)", rec, dec, want_skip, t);
    check_stream(tok, rec, ids, n, dec, t);
    free(dec);
    if (want_keep) {
        assert_int_equal(qlm_tokenizer_decode(tok, ids, n, 0, &dec, NULL), 0);
        check_text("decode(skip_special=0)", rec, dec, want_keep, t);
        free(dec);
    }
}

static void check_ids(const qlm_tokenizer *tok, int rec, const char *text, size_t len, int add, const cJSON *want,
                      const char *what, tally *t, int **ids_out, int *n_out) {
    int *ids = NULL, n = 0;
    assert_int_equal(qlm_tokenizer_encode(tok, text, len, add, add, &ids, &n), 0);
    if (!ids_match(ids, n, want)) {
        report(rec, what, text, ids, n, want);
        t->mismatches++;
    }
    *ids_out = ids, *n_out = n;
}

static void check_record(const qlm_tokenizer *tok, const test_corpus *c, const cJSON *r, tally *t) {
    int i = cJSON_GetObjectItem(r, "i")->valueint, n = 1, rec = t->records++;
    const cJSON *jn = cJSON_GetObjectItem(r, "n"), *ids = cJSON_GetObjectItem(r, "ids");
    if (jn) n = jn->valueint;
    size_t len;
    char *text = test_corpus_text(c, i, n, &len);
    const cJSON *raw = cJSON_GetObjectItem(r, "raw"), *dec = cJSON_GetObjectItem(r, "dec");
    const cJSON *decs = cJSON_GetObjectItem(r, "decs");
    const char *want_skip = dec ? dec->valuestring : text;
    const char *want_keep = !t->check_decs ? NULL : decs ? decs->valuestring : text;
    int *got = NULL, n_got = 0;
    cJSON *framed = ids && !raw ? unframed(ids, t->add_bos, t->add_eos) : NULL;
    check_ids(tok, rec, text, len, 0, raw ? raw : framed, "add_special=0 parse_special=0", t, &got, &n_got);
    if (qlm_tokenizer_is_lossless(tok)) {
        char *back = NULL;
        assert_int_equal(qlm_tokenizer_decode(tok, got, n_got, 0, &back, NULL), 0);
        check_text("lossless round trip", rec, back, text, t);
        free(back);
    }
    if (!ids) check_decode(tok, rec, got, n_got, want_skip, NULL, t);
    free(got);
    if (ids) {
        check_ids(tok, rec, text, len, 1, ids, "add_special=1 parse_special=1", t, &got, &n_got);
        check_decode(tok, rec, got, n_got, want_skip, want_keep, t);
        free(got);
    }
    cJSON_Delete(framed);
    free(text);
}

/* Checks every record of a fixture; returns how many there were. */
static int check_fixture(const qlm_tokenizer *tok, const char *name) {
    char path[512];
    snprintf(path, sizeof(path), FIXTURES "%s.jsonl", name);
    char *data = test_read_file(path, NULL);
    assert_non_null(data);
    test_corpus c = test_corpus_load(FIXTURES "corpus.txt");
    tally t = {0};
    for (char *line = data, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = 0;
        cJSON *r = cJSON_Parse(line);
        assert_non_null(r);
        const cJSON *meta = cJSON_GetObjectItem(r, "meta");
        if (meta) {
            t.add_bos = cJSON_IsTrue(cJSON_GetObjectItem(meta, "add_bos"));
            t.add_eos = cJSON_IsTrue(cJSON_GetObjectItem(meta, "add_eos"));
            t.check_decs = !cJSON_IsFalse(cJSON_GetObjectItem(meta, "decs"));
        } else {
            check_record(tok, &c, r, &t);
        }
        cJSON_Delete(r);
    }
    print_message("%s: %d records (%d streamed), %d mismatches\n", name, t.records, t.streamed, t.mismatches);
    assert_int_equal(t.mismatches, 0);
    assert_true(t.streamed >= t.records / 4);
    test_corpus_free(&c);
    free(data);
    return t.records;
}

static qlm_tokenizer *load_asset_json(const char *rel) {
    char path[512];
    test_asset(path, sizeof(path), rel);
    if (!test_path_exists(path)) return NULL;
    qlm_tokenizer *t = qlm_tokenizer_load_json(path, NULL);
    if (!t) fail_msg("%s: %s", path, qlm_last_error());
    return t;
}

static void expect_ids(const qlm_tokenizer *t, const char *text, int add_special, const int *want, int n_want) {
    int *ids = NULL, n = 0;
    assert_int_equal(qlm_tokenizer_encode(t, text, strlen(text), add_special, 0, &ids, &n), 0);
    assert_int_equal(n, n_want);
    for (int i = 0; i < n; i++) assert_int_equal(ids[i], want[i]);
    free(ids);
}

/* ---- Llama 2 / llama2.c ---- */

static const int LILY[] = {9038, 2501, 263, 931, 29892, 727, 471, 263, 2217, 7826, 4257, 365, 2354, 29889};
static const char LILY_TEXT[] = "Once upon a time, there was a little girl named Lily.";

static void test_llama2c_known_example(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), "llama2-tokenizer/tokenizer.bin"));
    qlm_tokenizer *t = qlm_tokenizer_load_llama2c(path, 32000);
    assert_non_null(t);
    expect_ids(t, LILY_TEXT, 0, LILY, 14);
    int with_bos[15] = {1};
    memcpy(with_bos + 1, LILY, sizeof(LILY));
    expect_ids(t, LILY_TEXT, 1, with_bos, 15);
    assert_int_equal(qlm_tokenizer_bos(t), 1);
    assert_int_equal(qlm_tokenizer_eos(t), 2);
    assert_string_equal(qlm_tokenizer_token(t, 1), "<s>");
    assert_string_equal(qlm_tokenizer_token(t, 9038), "\xE2\x96\x81Once");
    assert_int_equal(qlm_tokenizer_find(t, "\xE2\x96\x81Once"), 9038);
    assert_true(qlm_tokenizer_is_lossless(t));
    assert_true(qlm_tokenizer_is_eog(t, 2));
    char *out = NULL;
    assert_int_equal(qlm_tokenizer_decode(t, with_bos, 15, 1, &out, NULL), 0);
    assert_string_equal(out, LILY_TEXT);
    free(out);
    qlm_tokenizer_free(t);
}

static void test_llama2c_corpus(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), "llama2-tokenizer/tokenizer.bin"));
    qlm_tokenizer *t = qlm_tokenizer_load_llama2c(path, 32000);
    assert_non_null(t);
    assert_true(check_fixture(t, "llama2") > 1200);
    qlm_tokenizer_free(t);
}

static void test_stories260k_corpus(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), "stories260K/tok512.bin"));
    qlm_tokenizer *t = qlm_tokenizer_load_llama2c(path, 512);
    assert_non_null(t);
    assert_true(check_fixture(t, "stories260k") > 1200);
    qlm_tokenizer_free(t);
}

/* ---- HF tokenizer.json ---- */

static void test_tinyllama_corpus(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), "tinyllama-1.1b-chat-v1.0-tokenizer/tokenizer.json"));
    qlm_tokenizer *t = load_asset_json("tinyllama-1.1b-chat-v1.0-tokenizer/tokenizer.json");
    assert_int_equal(qlm_tokenizer_vocab_size(t), 32000);
    assert_int_equal(qlm_tokenizer_bos(t), 1);
    assert_int_equal(qlm_tokenizer_eos(t), 2);
    assert_non_null(qlm_tokenizer_chat_template(t));
    assert_non_null(strstr(qlm_tokenizer_chat_template(t), "<|user|>"));
    expect_ids(t, LILY_TEXT, 0, LILY, 14);
    assert_true(check_fixture(t, "tinyllama") > 1200);
    qlm_tokenizer_free(t);
}

/* The TinyLlama tokenizer.json with its normalizer replaced by a Metaspace pre-tokenizer, written
 * to a temporary directory (the same edit the fixture script makes). */
static void check_metaspace_variant(const char *src, const char *scheme, int split, const char *fixture) {
    char *json = test_read_file(src, NULL);
    cJSON *root = cJSON_Parse(json);
    assert_non_null(root);
    cJSON *pre = cJSON_CreateObject();
    cJSON_AddStringToObject(pre, "type", "Metaspace");
    cJSON_AddStringToObject(pre, "replacement", "\xE2\x96\x81");
    cJSON_AddStringToObject(pre, "prepend_scheme", scheme);
    cJSON_AddBoolToObject(pre, "split", split);
    cJSON_ReplaceItemInObject(root, "normalizer", cJSON_CreateNull());
    cJSON_ReplaceItemInObject(root, "pre_tokenizer", pre);
    char *out = cJSON_PrintUnformatted(root);
    char dir[256], path[512];
    assert_non_null(test_tmpdir(dir, sizeof(dir)));
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    assert_int_equal(test_write_file(path, out, strlen(out)), 0);
    qlm_tokenizer *t = qlm_tokenizer_load_json(path, NULL);
    if (!t) fail_msg("%s", qlm_last_error());
    assert_true(check_fixture(t, fixture) > 290);
    qlm_tokenizer_free(t);
    remove(path);
    rmdir(dir);
    free(out);
    cJSON_Delete(root);
    free(json);
}

static void test_tinyllama_metaspace(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), "tinyllama-1.1b-chat-v1.0-tokenizer/tokenizer.json"));
    check_metaspace_variant(path, "first", 0, "tinyllama_ms_first");
    check_metaspace_variant(path, "always", 1, "tinyllama_ms_always");
}

static void test_tinystories656k_corpus(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), "tinystories-656K-hf/tokenizer.json"));
    qlm_tokenizer *t = load_asset_json("tinystories-656K-hf/tokenizer.json");
    assert_int_equal(qlm_tokenizer_vocab_size(t), 2048);
    assert_int_equal(qlm_tokenizer_bos(t), 1);
    assert_int_equal(qlm_tokenizer_eos(t), 2);
    assert_false(qlm_tokenizer_is_lossless(t)); /* byte_fallback without <0xNN> pieces */
    assert_true(check_fixture(t, "tinystories656k") > 1200);
    qlm_tokenizer_free(t);
}

/* ---- SmolLM2 GGUF ---- */

static qlm_gguf *open_default_gguf(void) {
    char path[512];
    test_default_gguf(path, sizeof(path));
    if (!test_path_exists(path)) return NULL;
    qlm_gguf *g = qlm_gguf_open(path);
    if (!g) fail_msg("%s: %s", path, qlm_last_error());
    return g;
}

static void test_smollm2_gguf_corpus(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_default_gguf(path, sizeof(path)));
    qlm_gguf *g = open_default_gguf();
    qlm_tokenizer *t = qlm_gguf_tokenizer(g);
    if (!t) fail_msg("%s", qlm_last_error());
    assert_int_equal(qlm_tokenizer_vocab_size(t), 49152);
    assert_int_equal(qlm_tokenizer_find(t, "<|im_start|>"), 1);
    assert_string_equal(qlm_tokenizer_token(t, 2), "<|im_end|>");
    assert_int_equal(qlm_tokenizer_eos(t), 2);
    assert_true(qlm_tokenizer_is_eog(t, 2));
    assert_true(qlm_tokenizer_is_eog(t, 0)); /* <|endoftext|> */
    assert_false(qlm_tokenizer_is_eog(t, 1));
    assert_false(qlm_tokenizer_is_lossless(t)); /* its alphabet lacks bytes 0x04 0x06 ... 0xF1 0xF2 */
    assert_non_null(strstr(qlm_tokenizer_chat_template(t), "<|im_start|>"));
    assert_true(check_fixture(t, "smollm2") > 1200);
    qlm_tokenizer_free(t);
    qlm_gguf_close(g);
}

/* The SmolLM2 vocabulary under the other byte-level pre-tokenizers. */
static void test_byte_level_pretokenizers(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_default_gguf(path, sizeof(path)));
    qlm_gguf *g = open_default_gguf();
    qlm_tokenizer_spec spec = {.type = QLM_TOK_BYTE_BPE, .bos_id = -1, .eos_id = -1, .unk_id = -1, .pad_id = -1};
    int *types = NULL, n_types = 0;
    assert_int_equal(qlm_gguf_get_str_array(g, "tokenizer.ggml.tokens", &spec.tokens, &spec.n_vocab), 0);
    assert_int_equal(qlm_gguf_get_str_array(g, "tokenizer.ggml.merges", &spec.merges, &spec.n_merges), 0);
    assert_int_equal(qlm_gguf_get_int_array(g, "tokenizer.ggml.token_type", &types, &n_types), 0);
    spec.token_types = types;
    static const struct {
        qlm_pretokenizer pre;
        int ignore_merges;
        const char *fixture;
    } cases[] = {{QLM_PRE_GPT2, 0, "smollm2_pre_gpt2"},
                 {QLM_PRE_LLAMA3, 1, "smollm2_pre_llama3"},
                 {QLM_PRE_QWEN2, 0, "smollm2_pre_qwen2"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        spec.pre = cases[i].pre;
        spec.ignore_merges = cases[i].ignore_merges;
        qlm_tokenizer *t = qlm_tokenizer_build(&spec);
        if (!t) fail_msg("%s", qlm_last_error());
        assert_true(check_fixture(t, cases[i].fixture) > 1200);
        qlm_tokenizer_free(t);
    }
    free(types);
    qlm_gguf_close(g);
}

/* ---- robustness and speed ---- */

static size_t put_utf8(char *o, uint32_t cp) {
    unsigned char *u = (unsigned char *)o;
    if (cp < 0x80) {
        u[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        u[0] = (unsigned char)(0xC0 | cp >> 6);
        u[1] = (unsigned char)(0x80 | (cp & 63));
        return 2;
    }
    if (cp < 0x10000) {
        u[0] = (unsigned char)(0xE0 | cp >> 12);
        u[1] = (unsigned char)(0x80 | (cp >> 6 & 63));
        u[2] = (unsigned char)(0x80 | (cp & 63));
        return 3;
    }
    u[0] = (unsigned char)(0xF0 | cp >> 18);
    u[1] = (unsigned char)(0x80 | (cp >> 12 & 63));
    u[2] = (unsigned char)(0x80 | (cp >> 6 & 63));
    u[3] = (unsigned char)(0x80 | (cp & 63));
    return 4;
}

/* Random text survives encode/decode: random code points (BMP without C0 controls, some astral)
 * for every tokenizer that keeps them, and random bytes (invalid UTF-8) when all_bytes. */
static void check_random_text(const qlm_tokenizer *t, int all_bytes) {
    unsigned state = 12345;
    for (int k = 0; k < 300; k++) {
        char text[256];
        size_t n = 0;
        for (int i = 0; i < k % 40 + 1; i++) {
            state = state * 1103515245u + 12345u;
            unsigned r = state >> 8;
            if (all_bytes) {
                text[n++] = (char)(r % 255 + 1); /* no NUL, so strcmp applies */
                continue;
            }
            uint32_t cp = r % 8 == 0 ? 0x10000 + r % 0x20000 : 0x20 + r % (0x10000 - 0x20);
            n += put_utf8(text + n, cp >= 0xD800 && cp < 0xE000 ? 'x' : cp);
        }
        text[n] = 0;
        int *ids = NULL, n_ids = 0;
        assert_int_equal(qlm_tokenizer_encode(t, text, n, 0, 0, &ids, &n_ids), 0);
        char *back = NULL;
        assert_int_equal(qlm_tokenizer_decode(t, ids, n_ids, 0, &back, NULL), 0);
        assert_string_equal(back, text);
        free(back);
        free(ids);
    }
}

static double encode_ms(const qlm_tokenizer *t, const char *text, size_t len, int *n_ids) {
    struct timespec a, b;
    int *ids = NULL;
    clock_gettime(CLOCK_MONOTONIC, &a);
    assert_int_equal(qlm_tokenizer_encode(t, text, len, 1, 1, &ids, n_ids), 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    free(ids);
    return (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
}

static void check_speed(const qlm_tokenizer *t, const char *name) {
    test_corpus c = test_corpus_load(FIXTURES "corpus.txt");
    size_t len;
    char *all = test_corpus_text(&c, 0, c.n, &len);
    int n_ids = 0;
    double ms10 = encode_ms(t, all, 10000, &n_ids), ms_all = encode_ms(t, all, len, &n_ids);
    print_message("%s: 10 kB in %.2f ms, %zu bytes (%d tokens) in %.2f ms\n", name, ms10, len, n_ids, ms_all);
    /* Generous for sanitizer builds; a quadratic merge loop takes seconds on the 70 kB text. */
    assert_true(ms_all < 1000.0);
    free(all);
    test_corpus_free(&c);
}

static void test_robustness_and_speed(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), "llama2-tokenizer/tokenizer.bin"));
    qlm_tokenizer *t = qlm_tokenizer_load_llama2c(path, 32000);
    assert_non_null(t);
    check_random_text(t, 0);
    check_random_text(t, 1);
    check_speed(t, "llama2 (score merges)");
    qlm_tokenizer_free(t);
    if ((t = load_asset_json("tinyllama-1.1b-chat-v1.0-tokenizer/tokenizer.json"))) {
        check_random_text(t, 0);
        check_random_text(t, 1);
        check_speed(t, "tinyllama (rank merges)");
        qlm_tokenizer_free(t);
    }
    qlm_gguf *g = open_default_gguf();
    if (g) {
        assert_non_null(t = qlm_gguf_tokenizer(g));
        check_random_text(t, 0);
        check_speed(t, "smollm2 (byte-level)");
        qlm_tokenizer_free(t);
        qlm_gguf_close(g);
    }
}

static void test_invalid_arguments(void **state) {
    (void)state;
    static const char *const toks[] = {"<unk>", "a", "b", "ab"};
    static const char *const merges[] = {"a b"};
    qlm_tokenizer_spec spec = {.type = QLM_TOK_BYTE_BPE, .n_vocab = 4, .tokens = toks, .n_merges = 1, .merges = merges,
                               .bos_id = -1, .eos_id = 7, .unk_id = 0, .pad_id = -1};
    assert_null(qlm_tokenizer_build(&spec)); /* eos outside the vocabulary */
    spec.eos_id = -1;
    static const char *const bad_merges[] = {"a c"};
    spec.merges = bad_merges;
    assert_null(qlm_tokenizer_build(&spec));
    assert_non_null(strstr(qlm_last_error(), "merge 0"));
    spec.merges = merges;
    qlm_tokenizer *t = qlm_tokenizer_build(&spec);
    assert_non_null(t);
    int *ids = NULL, n = 0;
    assert_int_equal(qlm_tokenizer_encode(t, "abab", 4, 0, 0, &ids, &n), 0);
    assert_int_equal(n, 2); /* "ab" "ab" */
    assert_int_equal(ids[0], 3);
    free(ids);
    assert_int_equal(qlm_tokenizer_encode(t, "", 0, 1, 1, &ids, &n), 0);
    assert_int_equal(n, 0);
    free(ids);
    int bad[] = {1, 4};
    char *out = NULL;
    assert_int_equal(qlm_tokenizer_decode(t, bad, 2, 0, &out, NULL), -1);
    char buf[1];
    assert_int_equal(qlm_tokenizer_piece(t, -1, 3, buf, 1), -1); /* "ab" does not fit in 1 byte */
    assert_int_equal(qlm_tokenizer_piece(t, -1, 9, buf, 1), -1);
    assert_null(qlm_tokenizer_token(t, 4));
    qlm_tokenizer_free(t);
}

/* ---- malformed files ---- */

static void expect_json_error(const char *dir, const char *json, const char *config, const char *needle) {
    char path[512], cfg[512];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    snprintf(cfg, sizeof(cfg), "%s/tokenizer_config.json", dir);
    assert_int_equal(test_write_file(path, json, strlen(json)), 0);
    remove(cfg);
    if (config) assert_int_equal(test_write_file(cfg, config, strlen(config)), 0);
    qlm_tokenizer *t = qlm_tokenizer_load_json(path, NULL);
    if (t) fail_msg("loaded a malformed tokenizer.json: %.200s", json);
    if (!strstr(qlm_last_error(), needle)) fail_msg("error \"%s\" does not mention \"%s\"", qlm_last_error(), needle);
    remove(path);
    remove(cfg);
}

#define BPE_HEAD "{\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},"

static void test_malformed_tokenizer_json(void **state) {
    (void)state;
    char dir[256];
    assert_non_null(test_tmpdir(dir, sizeof(dir)));
    expect_json_error(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0", NULL, "not valid JSON");
    expect_json_error(dir, "[1, 2]", NULL, "not a JSON object");
    expect_json_error(dir, "{}", NULL, "model is missing");
    expect_json_error(dir, "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", NULL, "Unigram");
    expect_json_error(dir, "{\"model\": {\"type\": \"WordPiece\"}}", NULL, "WordPiece");
    expect_json_error(dir, BPE_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}", NULL, "model.vocab");
    expect_json_error(dir, BPE_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}", NULL,
                      "model.vocab");
    expect_json_error(dir, BPE_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 5}, \"merges\": []}}",
                      NULL, "gaps");
    expect_json_error(dir, BPE_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}",
                      NULL, "id 0");
    expect_json_error(dir, BPE_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}}}", NULL,
                      "model.merges");
    expect_json_error(dir, BPE_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}}",
                      NULL, "merge 0");
    expect_json_error(dir, BPE_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [7]}}", NULL,
                      "model.merges[0]");
    expect_json_error(dir, BPE_HEAD "\"added_tokens\": [{\"id\": 99999999, \"content\": \"x\"}],"
                                    "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                      NULL, "added_tokens");
    expect_json_error(dir, "{\"pre_tokenizer\":{\"type\":\"Whitespace\"},\"model\": {\"type\": \"BPE\", \"vocab\": "
                           "{\"a\": 0}, \"merges\": []}}",
                      NULL, "pre_tokenizer");
    expect_json_error(dir, "{\"normalizer\":{\"type\":\"Lowercase\"},\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0},"
                           " \"merges\": []}}",
                      NULL, "Lowercase");
    const char *ok = BPE_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}}";
    expect_json_error(dir, ok, "{\"bos_token\": \"<s>\"}", "bos_token");
    expect_json_error(dir, ok, "{\"bos_token\": 3}", "bos_token");
    expect_json_error(dir, ok, "{\"bos_token\": ", "tokenizer_config.json");
    rmdir(dir);
}

/* The real TinyLlama tokenizer.json cut at many lengths never loads and never crashes. */
static void test_truncated_tokenizer_json(void **state) {
    (void)state;
    char src[512], dir[256], path[512];
    REQUIRE_ASSET(test_asset(src, sizeof(src), "tinystories-656K-hf/tokenizer.json"));
    size_t size = 0;
    char *json = test_read_file(src, &size);
    assert_non_null(test_tmpdir(dir, sizeof(dir)));
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    for (size_t cut = 0; cut < size; cut += size / 37 + 1) {
        assert_int_equal(test_write_file(path, json, cut), 0);
        qlm_tokenizer *t = qlm_tokenizer_load_json(path, NULL);
        assert_null(t);
        assert_non_null(strstr(qlm_last_error(), path));
    }
    remove(path);
    rmdir(dir);
    free(json);
}

static void expect_llama2c_error(const char *path, const void *data, size_t n, int vocab, const char *needle) {
    assert_int_equal(test_write_file(path, data, n), 0);
    qlm_tokenizer *t = qlm_tokenizer_load_llama2c(path, vocab);
    if (t) fail_msg("loaded a malformed tokenizer.bin of %zu bytes", n);
    if (!strstr(qlm_last_error(), needle)) fail_msg("error \"%s\" does not mention \"%s\"", qlm_last_error(), needle);
}

static void test_malformed_tokenizer_bin(void **state) {
    (void)state;
    char src[512], dir[256], path[512];
    REQUIRE_ASSET(test_asset(src, sizeof(src), "stories260K/tok512.bin"));
    size_t size = 0;
    char *bin = test_read_file(src, &size);
    assert_non_null(test_tmpdir(dir, sizeof(dir)));
    snprintf(path, sizeof(path), "%s/tokenizer.bin", dir);
    for (size_t cut = 0; cut < size; cut += 97) expect_llama2c_error(path, bin, cut, 512, path);
    expect_llama2c_error(path, bin, size - 1, 512, "past the end");
    expect_llama2c_error(path, bin, size, 513, "token 512");
    char *bad = malloc(size);
    memcpy(bad, bin, size);
    memcpy(bad, &(int32_t){-5}, 4);
    expect_llama2c_error(path, bad, size, 512, "max_token_length");
    memcpy(bad, bin, size);
    memcpy(bad + 4 + 4, &(int32_t){0x7FFFFFFF}, 4); /* the first token's length */
    expect_llama2c_error(path, bad, size, 512, "token 0");
    expect_llama2c_error(path, bin, size, -1, "vocab_size");
    /* With no checkpoint to say it, the vocabulary is the file's records, which must end with it. */
    assert_int_equal(test_write_file(path, bin, size), 0);
    qlm_tokenizer *counted = qlm_tokenizer_load_llama2c(path, 0);
    assert_non_null(counted);
    assert_int_equal(qlm_tokenizer_vocab_size(counted), 512);
    qlm_tokenizer_free(counted);
    expect_llama2c_error(path, bin, size - 3, 0, "runs past the end");
    free(bad);
    remove(path);
    assert_null(qlm_tokenizer_load_llama2c(path, 512));
    assert_non_null(strstr(qlm_last_error(), "cannot open"));
    rmdir(dir);
    free(bin);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2c_known_example),
        cmocka_unit_test(test_llama2c_corpus),
        cmocka_unit_test(test_stories260k_corpus),
        cmocka_unit_test(test_tinyllama_corpus),
        cmocka_unit_test(test_tinyllama_metaspace),
        cmocka_unit_test(test_tinystories656k_corpus),
        cmocka_unit_test(test_smollm2_gguf_corpus),
        cmocka_unit_test(test_byte_level_pretokenizers),
        cmocka_unit_test(test_robustness_and_speed),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_malformed_tokenizer_json),
        cmocka_unit_test(test_truncated_tokenizer_json),
        cmocka_unit_test(test_malformed_tokenizer_bin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
