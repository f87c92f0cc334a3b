/* SentencePiece Unigram (T5 / FLAN-T5) against reference ids from HF tokenizers and sentencepiece
 * (tools/make_unigram_fixtures.py): every corpus text from tokenizer.json and from spiece.model,
 * decoding, the precompiled charsmap normalizer on chosen strings, the tokenizer.json writer, and
 * truncated, bit-flipped and size-lying files. */
#include "test_util.h"

#include <cjson/cJSON.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"
#include "loaders/model_source.h"

#define FIXTURES "tests/fixtures/unigram/"
#define T5_JSON "flan-t5-small/tokenizer.json"
#define T5_SPIECE "flan-t5-small/spiece.model"

/* ---- corpus and fixtures ---- */

/* The fixture's records (every line after the meta line), parsed. */
static cJSON **load_records(const char *name, int *n) {
    char path[256];
    snprintf(path, sizeof(path), FIXTURES "%s.jsonl", name);
    char *data = test_read_file(path, NULL);
    assert_non_null(data);
    int cap = 0;
    for (char *p = data; *p; p++) cap += *p == '\n';
    cJSON **recs = calloc((size_t)cap + 1, sizeof(cJSON *));
    assert_non_null(recs);
    *n = 0;
    for (char *line = data, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = 0;
        cJSON *r = cJSON_Parse(line);
        assert_non_null(r);
        if (cJSON_GetObjectItem(r, "meta")) cJSON_Delete(r);
        else recs[(*n)++] = r;
    }
    free(data);
    return recs;
}

static void free_records(cJSON **recs, int n) {
    for (int i = 0; i < n; i++) cJSON_Delete(recs[i]);
    free(recs);
}

typedef struct {
    int records, mismatches;
} tally;

static int ids_equal(const int *got, int n, const cJSON *want, int extra) {
    int m = cJSON_GetArraySize(want);
    if (m + (extra >= 0) != n) return 0;
    for (int i = 0; i < m; i++)
        if (cJSON_GetArrayItem(want, i)->valueint != got[i]) return 0;
    return extra < 0 || got[m] == extra;
}

/* encode(text) against want (followed by the id extra, unless -1). */
static void check_ids(const qlm_tokenizer *t, int rec, const char *text, size_t len, int add, int parse,
                      const cJSON *want, int extra, tally *y) {
    int *ids = NULL, n = 0;
    assert_int_equal(qlm_tokenizer_encode(t, text, len, add, parse, &ids, &n), 0);
    if (!ids_equal(ids, n, want, extra)) {
        char *w = cJSON_PrintUnformatted(want);
        print_message("record %d (add_special=%d parse_special=%d) text=\"%.80s\"\n  got:", rec, add, parse, text);
        for (int i = 0; i < n && i < 40; i++) print_message(" %d", ids[i]);
        print_message("\n  want: %.300s%s\n", w, extra >= 0 ? " + eos" : "");
        free(w);
        y->mismatches++;
    }
    free(ids);
}

static void check_decode(const qlm_tokenizer *t, int rec, const cJSON *ids, int skip, const char *want, tally *y) {
    int n = cJSON_GetArraySize(ids);
    int *v = malloc(sizeof(int) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) v[i] = cJSON_GetArrayItem(ids, i)->valueint;
    char *got = NULL;
    assert_int_equal(qlm_tokenizer_decode(t, v, n, skip, &got, NULL), 0);
    if (strcmp(got, want) != 0) {
        print_message("record %d: decode(skip_special=%d)\n  got:  \"%.200s\"\n  want: \"%.200s\"\n", rec, skip, got,
                      want);
        y->mismatches++;
    }
    free(got);
    free(v);
}

static const char *str_or(const cJSON *r, const char *key, const char *dflt) {
    const cJSON *v = cJSON_GetObjectItem(r, key);
    return v ? v->valuestring : dflt;
}

/* tokenizers records: "ids" with special tokens parsed and </s> appended, "raw" without either,
 * and both decodes. */
static void check_tokenizers_record(const qlm_tokenizer *t, const test_corpus *c, const cJSON *r, tally *y) {
    int i = cJSON_GetObjectItem(r, "i")->valueint, rec = y->records++;
    const cJSON *jn = cJSON_GetObjectItem(r, "n"), *ids = cJSON_GetObjectItem(r, "ids");
    const cJSON *raw = cJSON_GetObjectItem(r, "raw");
    size_t len;
    char *text = test_corpus_text(c, i, jn ? jn->valueint : 1, &len);
    check_ids(t, rec, text, len, 1, 1, ids, -1, y);
    if (raw) {
        check_ids(t, rec, text, len, 0, 0, raw, -1, y);
    } else {
        cJSON *framed = cJSON_Duplicate(ids, 1);
        cJSON_DeleteItemFromArray(framed, cJSON_GetArraySize(framed) - 1);
        check_ids(t, rec, text, len, 0, 0, framed, -1, y);
        cJSON_Delete(framed);
    }
    check_decode(t, rec, ids, 1, str_or(r, "dec", text), y);
    check_decode(t, rec, ids, 0, str_or(r, "decs", text), y);
    free(text);
}

/* sentencepiece records: "ids" without special tokens; with add_special EOS follows. */
static void check_sentencepiece_record(const qlm_tokenizer *t, const test_corpus *c, const cJSON *r, tally *y) {
    int i = cJSON_GetObjectItem(r, "i")->valueint, rec = y->records++;
    const cJSON *jn = cJSON_GetObjectItem(r, "n"), *ids = cJSON_GetObjectItem(r, "ids");
    size_t len;
    char *text = test_corpus_text(c, i, jn ? jn->valueint : 1, &len);
    check_ids(t, rec, text, len, 0, 0, ids, -1, y);
    check_ids(t, rec, text, len, 1, 0, ids, qlm_tokenizer_eos(t), y);
    check_decode(t, rec, ids, 1, str_or(r, "dec", text), y);
    free(text);
}

typedef void (*record_fn)(const qlm_tokenizer *, const test_corpus *, const cJSON *, tally *);

static int check_fixture(const qlm_tokenizer *t, const char *name, record_fn check) {
    int n = 0;
    cJSON **recs = load_records(name, &n);
    test_corpus c = test_corpus_load(FIXTURES "corpus.txt");
    tally y = {0};
    for (int k = 0; k < n; k++) check(t, &c, recs[k], &y);
    print_message("%s: %d records over %d corpus lines, %d mismatches\n", name, y.records, c.n, y.mismatches);
    assert_int_equal(y.mismatches, 0);
    assert_true(c.n >= 1000);
    test_corpus_free(&c);
    free_records(recs, n);
    return y.records;
}

static qlm_tokenizer *load_asset(const char *rel, int spiece) {
    char path[512];
    test_asset(path, sizeof(path), rel);
    qlm_tokenizer *t = spiece ? qlm_tokenizer_load_spiece(path) : qlm_tokenizer_load_json(path, NULL);
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

/* ---- the reference corpus ---- */

/* The asset README's example, without and with </s>. */
static const char PROMPT[] = "Summarize the following dialogue: #Person1#: Hello, how are you?";
static const int PROMPT_IDS[] = {12198, 1635, 1737, 8, 826, 7478, 10, 1713, 345, 13515, 536, 4663, 10, 8774, 6, 149, 33,
                                 25, 58, 1};

static void check_t5_basics(const qlm_tokenizer *t, int n_vocab) {
    assert_int_equal(qlm_tokenizer_vocab_size(t), n_vocab);
    assert_int_equal(qlm_tokenizer_eos(t), 1);
    assert_int_equal(qlm_tokenizer_bos(t), -1);
    assert_true(qlm_tokenizer_is_eog(t, 1));
    assert_false(qlm_tokenizer_is_lossless(t));
    assert_string_equal(qlm_tokenizer_token(t, 3), "\xE2\x96\x81");
    expect_ids(t, PROMPT, 0, PROMPT_IDS, 19);
    expect_ids(t, PROMPT, 1, PROMPT_IDS, 20);
    char *out = NULL;
    assert_int_equal(qlm_tokenizer_decode(t, PROMPT_IDS, 20, 1, &out, NULL), 0);
    assert_string_equal(out, PROMPT);
    free(out);
}

static void test_tokenizer_json_corpus(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), T5_JSON));
    qlm_tokenizer *t = load_asset(T5_JSON, 0);
    check_t5_basics(t, 32100);
    assert_int_equal(qlm_tokenizer_find(t, "<extra_id_0>"), 32099);
    assert_true(check_fixture(t, "tokenizers", check_tokenizers_record) > 2000);
    qlm_tokenizer_free(t);
}

static void test_spiece_corpus(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), T5_SPIECE));
    qlm_tokenizer *t = load_asset(T5_SPIECE, 1);
    check_t5_basics(t, 32000);
    assert_true(check_fixture(t, "sentencepiece", check_sentencepiece_record) > 2000);
    qlm_tokenizer_free(t);
}

/* qlm_tokenizer_open finds both files by name and by folder; flan-t5-base has the same files. */
static void test_open(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), "flan-t5-base/spiece.model"));
    const char *paths[] = {"flan-t5-base/tokenizer.json", "flan-t5-base/spiece.model", "flan-t5-base"};
    for (int k = 0; k < 3; k++) {
        qlm_tokenizer *t = qlm_tokenizer_open(test_asset(path, sizeof(path), paths[k]), 32128);
        if (!t) fail_msg("%s: %s", path, qlm_last_error());
        expect_ids(t, PROMPT, 1, PROMPT_IDS, 20);
        qlm_tokenizer_free(t);
    }
    /* A folder with spiece.model but no tokenizer.json. */
    char dir[256], src[512];
    assert_non_null(test_tmpdir(dir, sizeof(dir)));
    size_t size = 0;
    char *model = test_read_file(test_asset(src, sizeof(src), "flan-t5-base/spiece.model"), &size);
    snprintf(path, sizeof(path), "%s/spiece.model", dir);
    assert_int_equal(test_write_file(path, model, size), 0);
    qlm_tokenizer *t = qlm_tokenizer_open(dir, 0);
    if (!t) fail_msg("%s: %s", dir, qlm_last_error());
    assert_int_equal(qlm_tokenizer_vocab_size(t), 32000);
    qlm_tokenizer_free(t);
    remove(path);
    assert_null(qlm_tokenizer_open(dir, 0));
    assert_non_null(strstr(qlm_last_error(), "spiece.model"));
    rmdir(dir);
    free(model);
}

/* ---- the precompiled charsmap ---- */

static void test_charsmap_normalizer(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), T5_SPIECE));
    qlm_tokenizer *hf = load_asset(T5_JSON, 0), *sp = load_asset(T5_SPIECE, 1);
    /* The same map in both files: base64 in the JSON, bytes in the protobuf. */
    assert_int_equal(hf->uni->map.blob_len, sp->uni->map.blob_len);
    assert_memory_equal(hf->uni->map.blob, sp->uni->map.blob, sp->uni->map.blob_len);
    assert_true(hf->uni->map.n_units > 40000);
    char *json = test_read_file(FIXTURES "normalize.json", NULL);
    cJSON *root = cJSON_Parse(json), *c;
    assert_non_null(root);
    tok_buf out = {0};
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const char *text = str_or(c, "text", NULL);
        const tok_unigram *u = hf->uni;
        assert_int_equal(tok_charsmap_normalize_hf(&u->map, u->grapheme_re, text, strlen(text), 1, &out), 0);
        if (strcmp(out.p, str_or(c, "tokenizers", NULL)) != 0)
            fail_msg("tokenizers normalizer on \"%s\": got \"%s\", want \"%s\"", text, out.p,
                     str_or(c, "tokenizers", ""));
        assert_int_equal(tok_charsmap_normalize_spm(&sp->uni->map, text, strlen(text), 1, 1, &out), 0);
        if (strcmp(out.p, str_or(c, "sentencepiece", NULL)) != 0)
            fail_msg("sentencepiece normalizer on \"%s\": got \"%s\", want \"%s\"", text, out.p,
                     str_or(c, "sentencepiece", ""));
        n++;
    }
    assert_true(n > 30);
    /* Hand-picked rules: NFKC forms, a shortest-rule cluster (tokenizers drops the grave accent
     * after Â), and invalid UTF-8 as U+FFFD. */
    static const struct {
        const char *in, *hf, *spm;
    } known[] = {
        {"\xEF\xAC\x81", "fi", "\xE2\x96\x81" "fi"},
        {"\xEF\xBC\xA1\xEF\xBC\xA2", "AB", "\xE2\x96\x81" "AB"},
        {"A\xCC\x82\xCC\x80", "\xC3\x82", "\xE2\x96\x81\xE1\xBA\xA6"},
        {"a\t\tb ", "a b ", "\xE2\x96\x81" "a\xE2\x96\x81" "b"},
        {"x\xFFy", "x\xEF\xBF\xBDy", "\xE2\x96\x81x\xEF\xBF\xBDy"},
    };
    for (size_t k = 0; k < sizeof(known) / sizeof(known[0]); k++) {
        assert_int_equal(tok_charsmap_normalize_hf(&hf->uni->map, hf->uni->grapheme_re, known[k].in,
                                                   strlen(known[k].in), 1, &out), 0);
        assert_string_equal(out.p, known[k].hf);
        assert_int_equal(tok_charsmap_normalize_spm(&sp->uni->map, known[k].in, strlen(known[k].in), 1, 1, &out), 0);
        assert_string_equal(out.p, known[k].spm);
    }
    free(out.p);
    cJSON_Delete(root);
    free(json);
    qlm_tokenizer_free(hf);
    qlm_tokenizer_free(sp);
}

/* ---- the tokenizer.json writer ---- */

/* Saves the tokenizer.json tokenizer and the spiece.model one, loads them back, and compares the
 * whole corpus. With QLM_EXPORT_DIR the folders are kept (tools/check_unigram_export.py). */
static void test_save_json(void **state) {
    (void)state;
    char path[1024], dir[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), T5_SPIECE));
    const char *keep = getenv("QLM_EXPORT_DIR");
    static const char *const sources[] = {T5_JSON, T5_SPIECE};
    static const char *const names[] = {"t5_json", "t5_spiece"};
    test_corpus c = test_corpus_load(FIXTURES "corpus.txt");
    size_t len;
    char *all = test_corpus_text(&c, 0, c.n, &len);
    for (int k = 0; k < 2; k++) {
        qlm_tokenizer *t = load_asset(sources[k], k);
        if (keep && *keep) {
            snprintf(dir, sizeof(dir), "%s/%s", keep, names[k]);
            mkdir(keep, 0755);
            mkdir(dir, 0755);
        } else {
            assert_non_null(test_tmpdir(dir, sizeof(dir)));
        }
        if (qlm_tokenizer_save_json(t, dir) != 0) fail_msg("save: %s", qlm_last_error());
        snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
        qlm_tokenizer *back = qlm_tokenizer_load_json(path, NULL);
        if (!back) fail_msg("reload: %s", qlm_last_error());
        assert_int_equal(qlm_tokenizer_vocab_size(back), qlm_tokenizer_vocab_size(t));
        /* The JSON tokenizer comes back the same; the spiece one as tokenizers would run it, so
         * compare it with the JSON tokenizer on the texts where that vocabulary has every id. */
        qlm_tokenizer *want = k == 0 ? t : load_asset(T5_JSON, 0);
        int *a = NULL, *b = NULL, na = 0, nb = 0;
        for (int i = 0; i < c.n; i++) {
            assert_int_equal(qlm_tokenizer_encode(back, c.line[i], c.len[i], 1, 1, &a, &na), 0);
            assert_int_equal(qlm_tokenizer_encode(want, c.line[i], c.len[i], 1, 1, &b, &nb), 0);
            if (k == 1 && strstr(c.line[i], "<extra_id_")) na = nb = 0;
            assert_int_equal(na, nb);
            assert_memory_equal(a, b, sizeof(int) * (size_t)na);
            free(a);
            free(b);
        }
        if (k == 0) { /* the whole corpus at once */
            assert_int_equal(qlm_tokenizer_encode(back, all, len, 0, 0, &a, &na), 0);
            assert_int_equal(qlm_tokenizer_encode(want, all, len, 0, 0, &b, &nb), 0);
            assert_int_equal(na, nb);
            assert_memory_equal(a, b, sizeof(int) * (size_t)na);
            free(a);
            free(b);
        } else {
            qlm_tokenizer_free(want);
        }
        qlm_tokenizer_free(back);
        qlm_tokenizer_free(t);
        if (!(keep && *keep)) {
            remove(path);
            snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
            remove(path);
            rmdir(dir);
        }
    }
    free(all);
    test_corpus_free(&c);
}

/* ---- speed ---- */

static void test_speed(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), T5_SPIECE));
    test_corpus c = test_corpus_load(FIXTURES "corpus.txt");
    size_t len;
    char *all = test_corpus_text(&c, 0, c.n, &len);
    for (int k = 0; k < 2; k++) {
        qlm_tokenizer *t = load_asset(k ? T5_SPIECE : T5_JSON, k);
        struct timespec a, b;
        int *ids = NULL, n = 0;
        clock_gettime(CLOCK_MONOTONIC, &a);
        assert_int_equal(qlm_tokenizer_encode(t, all, len, 1, 1, &ids, &n), 0);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
        print_message("%s: %zu bytes (%d tokens) in %.2f ms\n", k ? "spiece.model" : "tokenizer.json", len, n, ms);
        assert_true(ms < 2000.0); /* generous for sanitizer builds */
        free(ids);
        qlm_tokenizer_free(t);
    }
    free(all);
    test_corpus_free(&c);
}

/* ---- malformed spiece.model ---- */

/* Protobuf writing helpers for hand-made models; ends[] records where top-level fields end. */
typedef struct {
    unsigned char b[8192];
    size_t n;
    size_t ends[300];
    int n_ends;
} pbuf;

static void pb_varint(pbuf *p, uint64_t v) {
    do {
        p->b[p->n++] = (unsigned char)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
}

static void pb_bytes(pbuf *p, int field, const void *data, size_t n) {
    pb_varint(p, (uint64_t)field << 3 | 2);
    pb_varint(p, n);
    memcpy(p->b + p->n, data, n);
    p->n += n;
}

static void pb_int(pbuf *p, int field, int64_t v) {
    pb_varint(p, (uint64_t)field << 3);
    pb_varint(p, (uint64_t)v);
}

static void pb_piece(pbuf *p, const char *piece, float score, int type) {
    pbuf m = {.n = 0};
    pb_bytes(&m, 1, piece, strlen(piece));
    uint32_t bits;
    memcpy(&bits, &score, 4);
    pb_varint(&m, 2 << 3 | 5);
    for (int i = 0; i < 4; i++) m.b[m.n++] = (unsigned char)(bits >> (8 * i));
    pb_int(&m, 3, type);
    pb_bytes(p, 1, m.b, m.n);
    p->ends[p->n_ends++] = p->n;
}

/* A small Unigram model: <unk> <s> </s> ▁ a b ab ▁ab, with byte_fallback the 256 byte pieces
 * <0x00>.. (ids 8..263, as sentencepiece requires); its charsmap is given (NULL: none). */
static pbuf small_model(const void *charsmap, size_t charsmap_len, int byte_fallback) {
    pbuf p = {.n = 0}, ts = {.n = 0}, ns = {.n = 0};
    pb_piece(&p, "<unk>", 0, 2);
    pb_piece(&p, "<s>", 0, 3);
    pb_piece(&p, "</s>", 0, 3);
    pb_piece(&p, "\xE2\x96\x81", -1.5f, 1);
    pb_piece(&p, "a", -2, 1);
    pb_piece(&p, "b", -2.5f, 1);
    pb_piece(&p, "ab", -3, 1);
    pb_piece(&p, "\xE2\x96\x81" "ab", -3.5f, 1);
    for (int b = 0; byte_fallback && b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        pb_piece(&p, name, 0, 6);
    }
    pb_int(&ts, 3, 1);
    pb_int(&ts, 35, byte_fallback);
    pb_int(&ts, 40, 0);
    pb_int(&ts, 41, -1);
    pb_int(&ts, 42, 2);
    pb_int(&ts, 43, -1);
    pb_bytes(&p, 2, ts.b, ts.n);
    p.ends[p.n_ends++] = p.n;
    pb_bytes(&ns, 1, "test", 4);
    if (charsmap) pb_bytes(&ns, 2, charsmap, charsmap_len);
    pb_bytes(&p, 3, ns.b, ns.n);
    return p;
}

static qlm_tokenizer *load_bytes(const char *path, const void *data, size_t n) {
    assert_int_equal(test_write_file(path, data, n), 0);
    return qlm_tokenizer_load_spiece(path);
}

static void expect_spiece_error(const char *path, const void *data, size_t n, const char *needle) {
    qlm_tokenizer *t = load_bytes(path, data, n);
    if (t) fail_msg("loaded a malformed model of %zu bytes", n);
    if (!strstr(qlm_last_error(), path)) fail_msg("error \"%s\" does not name %s", qlm_last_error(), path);
    if (needle && !strstr(qlm_last_error(), needle))
        fail_msg("error \"%s\" does not mention \"%s\"", qlm_last_error(), needle);
}

/* Encodes a few texts with a tokenizer that loaded from damaged bytes: no crash, no leak. */
static void exercise(qlm_tokenizer *t) {
    static const char *const texts[] = {"ab  ab\tx", "caf\xC3\xA9 \xEF\xAC\x81 A\xCC\x82\xCC\x80", "\xFF\x01 b"};
    for (int k = 0; k < 3; k++) {
        int *ids = NULL, n = 0;
        if (qlm_tokenizer_encode(t, texts[k], strlen(texts[k]), 1, 1, &ids, &n) == 0) {
            char *out = NULL;
            if (qlm_tokenizer_decode(t, ids, n, 0, &out, NULL) == 0) free(out);
            free(ids);
        }
    }
}

/* Ids from sentencepiece on the same models (built with its protobuf module). */
static void test_small_model(void **state) {
    (void)state;
    char dir[256], path[512];
    assert_non_null(test_tmpdir(dir, sizeof(dir)));
    snprintf(path, sizeof(path), "%s/tiny.model", dir);
    pbuf p = small_model(NULL, 0, 1);
    qlm_tokenizer *t = load_bytes(path, p.b, p.n);
    if (!t) fail_msg("%s", qlm_last_error());
    /* "▁ab" (-3.5) beats "▁" + "ab" (-4.5); x, é, y, z have no piece and become bytes. */
    static const int want1[] = {7, 7, 2};
    expect_ids(t, "ab ab", 1, want1, 3);
    static const int want2[] = {3, 4, 128, 203, 177, 129, 130, 3, 5};
    expect_ids(t, "  ax\xC3\xA9yz   b  ", 0, want2, 9);
    static const int want3[] = {3, 4, 6};
    expect_ids(t, "aab", 0, want3, 3);
    char *out = NULL;
    assert_int_equal(qlm_tokenizer_decode(t, want2, 9, 1, &out, NULL), 0);
    assert_string_equal(out, "ax\xC3\xA9yz b");
    free(out);
    qlm_tokenizer_free(t);
    /* Without byte fallback the unknown run "xéyz" is one unk. */
    p = small_model(NULL, 0, 0);
    assert_non_null(t = load_bytes(path, p.b, p.n));
    static const int want4[] = {3, 4, 0, 3, 5};
    expect_ids(t, "ax\xC3\xA9yz b", 0, want4, 5);
    assert_int_equal(qlm_tokenizer_decode(t, want4, 5, 1, &out, NULL), 0);
    assert_string_equal(out, "a b");
    free(out);
    qlm_tokenizer_free(t);
    remove(path);
    rmdir(dir);
}

static void test_malformed_spiece(void **state) {
    (void)state;
    char dir[256], path[512];
    assert_non_null(test_tmpdir(dir, sizeof(dir)));
    snprintf(path, sizeof(path), "%s/spiece.model", dir);
    pbuf good = small_model(NULL, 0, 1);
    /* A cut inside a field is an error naming the file; one between top-level fields is a
     * shorter valid model (the trainer_spec defaults to unk_id 0, eos_id 2). */
    int loaded = 0;
    for (size_t cut = 0; cut < good.n; cut++) {
        qlm_tokenizer *t = load_bytes(path, good.b, cut);
        int boundary = 0;
        for (int k = 0; k < good.n_ends; k++) boundary |= good.ends[k] == cut;
        if (t) {
            if (!boundary) fail_msg("a model cut at %zu bytes, inside a field, loaded", cut);
            loaded++;
            qlm_tokenizer_free(t);
        } else {
            assert_non_null(strstr(qlm_last_error(), path));
        }
    }
    assert_true(loaded > 200);
    expect_spiece_error(path, "", 0, "no pieces");
    expect_spiece_error(path, "\x0A\xFF\xFF\xFF\xFF\x0F", 6, "runs past the end");
    expect_spiece_error(path, "\x0A\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01", 12, "varint");
    expect_spiece_error(path, "\x0B\x00", 2, "wire type");
    expect_spiece_error(path, "\x08\x01", 2, "wire type 0");
    /* Size-lying lengths: the first piece message claims more bytes (it then swallows the next
     * piece and fails to parse), its string claims more than its message, the last field (the
     * normalizer_spec) more than the file. */
    pbuf bad = good;
    assert_int_equal(bad.b[0], 0x0A);
    bad.b[1] = 0x7F;
    expect_spiece_error(path, bad.b, bad.n, NULL);
    bad = good;
    assert_int_equal(bad.b[2], 0x0A);
    bad.b[3] = 0x40;
    expect_spiece_error(path, bad.b, bad.n, "runs past the end");
    bad = good;
    assert_int_equal(bad.b[good.ends[good.n_ends - 1]], 0x1A);
    bad.b[good.ends[good.n_ends - 1] + 1] = 0x7F;
    expect_spiece_error(path, bad.b, bad.n, "runs past the end");
    /* Fields that parse but make no valid model. */
    pbuf m = {.n = 0}, ts = {.n = 0};
    pb_piece(&m, "<unk>", 0, 2);
    pb_piece(&m, "a", -1, 9);
    expect_spiece_error(path, m.b, m.n, "unknown type 9");
    m.n = 0;
    pb_piece(&m, "a", -1, 1);
    pb_piece(&m, "b", -1, 1);
    pb_piece(&m, "c", -1, 1);
    expect_spiece_error(path, m.b, m.n, "unk_id 0");
    pb_piece(&m, "", -1, 1);
    expect_spiece_error(path, m.b, m.n, "piece 3");
    m.n = 0;
    pb_piece(&m, "<unk>", 0, 2);
    pb_int(&ts, 3, 2);
    pb_bytes(&m, 2, ts.b, ts.n);
    expect_spiece_error(path, m.b, m.n, "model_type 2");
    ts.n = 0;
    pb_int(&ts, 41, -1);
    pb_int(&ts, 42, 5);
    m.n = 0;
    pb_piece(&m, "<unk>", 0, 2);
    pb_bytes(&m, 2, ts.b, ts.n);
    expect_spiece_error(path, m.b, m.n, "eos_id 5");
    /* Charsmaps: a trie size past the end, strings without a final NUL, then garbage trie units
     * that load and must still encode safely. */
    unsigned char map[64] = {0xF0, 0, 0, 0};
    pbuf cm = small_model(map, 12, 1);
    expect_spiece_error(path, cm.b, cm.n, "trie size");
    map[0] = 8, map[12] = 'x';
    cm = small_model(map, 13, 1);
    expect_spiece_error(path, cm.b, cm.n, "NUL");
    unsigned state_rng = 99;
    for (int round = 0; round < 200; round++) {
        for (int i = 4; i < 64; i++) map[i] = (unsigned char)((state_rng = state_rng * 1103515245u + 12345u) >> 16);
        map[0] = 4 * (unsigned char)(1 + round % 12), map[1] = map[2] = map[3] = 0, map[63] = 0;
        cm = small_model(map, 64, 1);
        qlm_tokenizer *t = load_bytes(path, cm.b, cm.n);
        if (!t) fail_msg("random charsmap %d: %s", round, qlm_last_error());
        exercise(t);
        qlm_tokenizer_free(t);
    }
    remove(path);
    rmdir(dir);
}

/* The real spiece.model cut at many lengths and with flipped bits: errors name the file; what
 * still loads encodes without crashing. */
static void test_damaged_real_spiece(void **state) {
    (void)state;
    char src[512], dir[256], path[512];
    REQUIRE_ASSET(test_asset(src, sizeof(src), T5_SPIECE));
    size_t size = 0;
    unsigned char *model = (unsigned char *)test_read_file(src, &size);
    assert_non_null(test_tmpdir(dir, sizeof(dir)));
    snprintf(path, sizeof(path), "%s/spiece.model", dir);
    int failed = 0, cuts = 0;
    for (size_t cut = 0; cut < size; cut += size / 97 + 1, cuts++) {
        qlm_tokenizer *t = load_bytes(path, model, cut);
        if (t) {
            exercise(t);
            qlm_tokenizer_free(t);
        } else {
            assert_non_null(strstr(qlm_last_error(), path));
            failed++;
        }
    }
    print_message("truncated spiece.model: %d of %d cuts rejected\n", failed, cuts);
    assert_true(failed >= cuts - 2);
    unsigned rng = 7;
    unsigned char *flip = malloc(size);
    int rejected = 0;
    for (int round = 0; round < 40; round++) {
        memcpy(flip, model, size);
        for (int k = 0; k < 4; k++) {
            rng = rng * 1103515245u + 12345u;
            size_t at = (size_t)(rng >> 4) % size;
            /* Half the flips hit the charsmap (the last 240 kB) or the header. */
            if (k % 2) at = round % 4 == 0 ? at % 64 : size - 1 - at % 240000;
            flip[at] ^= (unsigned char)(1u << (rng >> 28) % 8);
        }
        qlm_tokenizer *t = load_bytes(path, flip, size);
        if (t) {
            exercise(t);
            qlm_tokenizer_free(t);
        } else {
            assert_non_null(strstr(qlm_last_error(), path));
            rejected++;
        }
    }
    print_message("bit-flipped spiece.model: %d of 40 rejected\n", rejected);
    free(flip);
    free(model);
    remove(path);
    rmdir(dir);
}

/* ---- malformed Unigram tokenizer.json ---- */

static void expect_json_error(const char *dir, const char *json, const char *needle) {
    char path[512];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    assert_int_equal(test_write_file(path, json, strlen(json)), 0);
    qlm_tokenizer *t = qlm_tokenizer_load_json(path, NULL);
    if (t) fail_msg("loaded a malformed tokenizer.json: %.200s", json);
    if (!strstr(qlm_last_error(), needle)) fail_msg("error \"%s\" does not mention \"%s\"", qlm_last_error(), needle);
    remove(path);
}

#define META                                                                                                  \
    "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"always\"},"
#define UNI(vocab, extra) "{" META "\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":" vocab extra "}}"
#define VOCAB "[[\"<unk>\",0],[\"\xE2\x96\x81\",-1],[\"a\",-2]]"

static void test_malformed_unigram_json(void **state) {
    (void)state;
    char dir[256], path[512];
    assert_non_null(test_tmpdir(dir, sizeof(dir)));
    expect_json_error(dir, UNI("[]", ""), "Unigram");
    expect_json_error(dir, UNI("{\"a\":0}", ""), "Unigram");
    expect_json_error(dir, UNI("[[\"<unk>\",0],[\"a\"]]", ""), "model.vocab[1]");
    expect_json_error(dir, UNI("[[\"<unk>\",0],[\"a\",\"x\"]]", ""), "model.vocab[1]");
    expect_json_error(dir, UNI("[[\"<unk>\",0],[7,1]]", ""), "model.vocab[1]");
    expect_json_error(dir, "{" META "\"model\":{\"type\":\"Unigram\",\"unk_id\":3,\"vocab\":" VOCAB "}}", "unk_id");
    expect_json_error(dir, "{" META "\"model\":{\"type\":\"Unigram\",\"unk_id\":null,\"vocab\":" VOCAB "}}",
                      "unknown token");
    expect_json_error(dir, "{\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":" VOCAB "}}", "Metaspace");
    expect_json_error(dir, "{\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"Unigram\",\"unk_id\":0,"
                           "\"vocab\":" VOCAB "}}",
                      "Metaspace");
    expect_json_error(dir, "{\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"@@@@\"}," META
                           "\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":" VOCAB "}}",
                      "base64");
    expect_json_error(dir, "{\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"8AAAAAAAAAA=\"}," META
                           "\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":" VOCAB "}}",
                      "trie size");
    expect_json_error(dir, "{\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"\"},"
                           "\"pre_tokenizer\":{\"type\":\"ByteLevel\"},"
                           "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                      "Unigram only");
    expect_json_error(dir,
                      "{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\" +\"},\"content\":\" \"}," META
                      "\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":" VOCAB "}}",
                      "Replace");
    /* The smallest valid one loads. */
    const char *ok = "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Precompiled\","
                     "\"precompiled_charsmap\":\"\"},{\"type\":\"Replace\",\"pattern\":{\"Regex\":\" {2,}\"},"
                     "\"content\":\" \"}]}," META "\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":" VOCAB "}}";
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    assert_int_equal(test_write_file(path, ok, strlen(ok)), 0);
    qlm_tokenizer *t = qlm_tokenizer_load_json(path, NULL);
    if (!t) fail_msg("%s", qlm_last_error());
    static const int want[] = {1, 2, 1, 0, 2};
    expect_ids(t, "a   \xE4\xB8\xAD\xE6\x96\x87" "a", 0, want, 5);
    qlm_tokenizer_free(t);
    remove(path);
    rmdir(dir);
}

/* The real tokenizer.json cut at many lengths never loads and never crashes. */
static void test_truncated_unigram_json(void **state) {
    (void)state;
    char src[512], dir[256], path[512];
    REQUIRE_ASSET(test_asset(src, sizeof(src), T5_JSON));
    size_t size = 0;
    char *json = test_read_file(src, &size);
    assert_non_null(test_tmpdir(dir, sizeof(dir)));
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    for (size_t cut = 0; cut < size; cut += size / 23 + 1) {
        assert_int_equal(test_write_file(path, json, cut), 0);
        assert_null(qlm_tokenizer_load_json(path, NULL));
        assert_non_null(strstr(qlm_last_error(), path));
    }
    remove(path);
    rmdir(dir);
    free(json);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenizer_json_corpus),
        cmocka_unit_test(test_spiece_corpus),
        cmocka_unit_test(test_open),
        cmocka_unit_test(test_charsmap_normalizer),
        cmocka_unit_test(test_save_json),
        cmocka_unit_test(test_speed),
        cmocka_unit_test(test_small_model),
        cmocka_unit_test(test_malformed_spiece),
        cmocka_unit_test(test_damaged_real_spiece),
        cmocka_unit_test(test_malformed_unigram_json),
        cmocka_unit_test(test_truncated_unigram_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
