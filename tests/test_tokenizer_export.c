/* qlm_tokenizer_save_json: every tokenizer source (llama2.c tokenizer.bin, HF tokenizer.json, GGUF)
 * is written to a folder, loaded back with qlm_tokenizer_load_json, and must give the original's
 * ids on every corpus line (add_special / parse_special on and off), the same decodes, special
 * tokens, end-of-generation ids and chat template. The merges derived from llama2.c scores must
 * equal the ones HF's converter wrote into TinyLlama's tokenizer.json (the same Llama 2
 * vocabulary). With QLM_EXPORT_DIR set, the folders are kept there for
 * tools/check_tokenizer_export.py. */
#include "test_util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <unistd.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"
#include "loaders/gguf.h"

#define CORPUS "tests/fixtures/tokenizer/corpus.txt"

/* ---- export folders ---- */

typedef struct {
    char path[512];
    int keep; /* under QLM_EXPORT_DIR */
} out_dir;

static void open_out_dir(out_dir *d, const char *name) {
    const char *env = getenv("QLM_EXPORT_DIR");
    d->keep = env && *env;
    if (d->keep) {
        mkdir(env, 0755);
        snprintf(d->path, sizeof(d->path), "%s/%s", env, name);
        mkdir(d->path, 0755);
        assert_true(test_path_exists(d->path));
    } else {
        assert_non_null(test_tmpdir(d->path, sizeof(d->path)));
    }
}

static void close_out_dir(out_dir *d) {
    if (d->keep) return;
    DIR *dir = opendir(d->path);
    assert_non_null(dir);
    for (struct dirent *e; (e = readdir(dir));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[1024];
        snprintf(p, sizeof(p), "%s/%s", d->path, e->d_name);
        remove(p);
    }
    closedir(dir);
    rmdir(d->path);
}

/* Saves t into d and loads it back. */
static qlm_tokenizer *round_trip(const qlm_tokenizer *t, const out_dir *d) {
    if (qlm_tokenizer_save_json(t, d->path) != 0) fail_msg("save: %s", qlm_last_error());
    char path[600];
    snprintf(path, sizeof(path), "%s/tokenizer.json", d->path);
    qlm_tokenizer *back = qlm_tokenizer_load_json(path, NULL);
    if (!back) fail_msg("load: %s", qlm_last_error());
    return back;
}

static cJSON *read_json_file(const char *dir, const char *name) {
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    char *text = test_read_file(path, NULL);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    return j;
}

/* ---- comparison ---- */

static int same_ids(const int *a, int na, const int *b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, sizeof(int) * (size_t)na) == 0);
}

static void check_decodes(const qlm_tokenizer *a, const qlm_tokenizer *b, const int *ids, int n, int line, int *bad) {
    for (int skip = 0; skip <= 1; skip++) {
        char *x = NULL, *y = NULL;
        size_t nx = 0, ny = 0;
        assert_int_equal(qlm_tokenizer_decode(a, ids, n, skip, &x, &nx), 0);
        assert_int_equal(qlm_tokenizer_decode(b, ids, n, skip, &y, &ny), 0);
        if (nx != ny || memcmp(x, y, nx) != 0) {
            print_message("line %d: decode(skip_special=%d) differs: \"%.80s\" vs \"%.80s\"\n", line, skip, x, y);
            (*bad)++;
        }
        free(x);
        free(y);
    }
}

typedef struct {
    int encodes, mismatches;
    int unk_parsed; /* lines where the reloaded tokenizer parses the unknown token's text */
} tally;

/* A source whose unknown token has type UNKNOWN (llama2.c, GGUF) does not match its text in the
 * input; the export lists it as a special added token, as HF's Llama conversion does, so with
 * parse_special the reloaded tokenizer turns "<unk>" into its id. */
static int parses_unk_differently(const qlm_tokenizer *t, const char *text, size_t len, int parse_special) {
    int unk = t->unk;
    if (!parse_special || unk < 0 || t->types[unk] != QLM_TOKEN_UNKNOWN) return 0;
    return memmem(text, len, tok_str(t, unk), t->len[unk]) != NULL;
}

static void compare_line(const qlm_tokenizer *a, const qlm_tokenizer *b, const char *text, size_t len, int line,
                         tally *s) {
    for (int mode = 0; mode < 4; mode++) {
        int add = mode & 1, parse = mode >> 1;
        int *x = NULL, *y = NULL, nx = 0, ny = 0;
        assert_int_equal(qlm_tokenizer_encode(a, text, len, add, parse, &x, &nx), 0);
        assert_int_equal(qlm_tokenizer_encode(b, text, len, add, parse, &y, &ny), 0);
        s->encodes++;
        if (parses_unk_differently(a, text, len, parse)) {
            int found = 0;
            for (int i = 0; i < ny; i++) found |= y[i] == a->unk;
            assert_true(found);
            s->unk_parsed++;
        } else if (!same_ids(x, nx, y, ny)) {
            print_message("line %d add=%d parse=%d: ids differ (%d vs %d ids) \"%.80s\"\n", line, add, parse, nx, ny,
                          text);
            s->mismatches++;
        }
        check_decodes(a, b, x, nx, line, &s->mismatches);
        free(x);
        free(y);
    }
}

static int same_str(const char *a, const char *b) { return (!a && !b) || (a && b && strcmp(a, b) == 0); }

static void compare_tokens(const qlm_tokenizer *a, const qlm_tokenizer *b) {
    int n = qlm_tokenizer_vocab_size(a);
    assert_int_equal(qlm_tokenizer_vocab_size(b), n);
    for (int id = 0; id < n; id++) {
        assert_string_equal(qlm_tokenizer_token(a, id), qlm_tokenizer_token(b, id));
        assert_int_equal(qlm_tokenizer_is_eog(a, id), qlm_tokenizer_is_eog(b, id));
    }
    assert_int_equal(qlm_tokenizer_bos(a), qlm_tokenizer_bos(b));
    assert_int_equal(qlm_tokenizer_eos(a), qlm_tokenizer_eos(b));
    assert_int_equal(a->unk, b->unk);
    assert_int_equal(a->pad, b->pad);
    assert_int_equal(a->add_bos, b->add_bos);
    assert_int_equal(a->add_eos, b->add_eos);
    assert_int_equal(qlm_tokenizer_is_lossless(a), qlm_tokenizer_is_lossless(b));
    assert_true(same_str(qlm_tokenizer_chat_template(a), qlm_tokenizer_chat_template(b)));
}

/* (left, right, merged) of every merge of a rank-merging tokenizer, in rank order. */
static int rank_cmp(const void *x, const void *y) {
    const int *p = x, *q = y;
    return (p[0] > q[0]) - (p[0] < q[0]);
}

static int *merge_table(const qlm_tokenizer *t, int *n) {
    const tok_pairmap *m = &t->merges;
    int *v = malloc(sizeof(int) * 4 * ((size_t)m->mask + 1)), k = 0;
    assert_non_null(v);
    for (uint32_t h = 0; m->keys && h <= m->mask; h++) {
        if (!m->keys[h]) continue;
        uint64_t key = m->keys[h] - 1;
        int *e = v + 4 * k++;
        e[0] = m->rank[h], e[1] = (int)(key >> 32), e[2] = (int)(uint32_t)key, e[3] = m->merged[h];
    }
    qsort(v, (size_t)k, sizeof(int) * 4, rank_cmp);
    *n = k;
    return v;
}

/* A rank-merging source keeps its merge table pair for pair. */
static void compare_merges(const qlm_tokenizer *a, const qlm_tokenizer *b) {
    if (a->scores) return;
    int na, nb;
    int *x = merge_table(a, &na), *y = merge_table(b, &nb);
    assert_int_equal(na, nb);
    for (int i = 0; i < na; i++) {
        if (x[4 * i + 1] != y[4 * i + 1] || x[4 * i + 2] != y[4 * i + 2] || x[4 * i + 3] != y[4 * i + 3])
            fail_msg("merge %d: (%d %d -> %d) became (%d %d -> %d)", i, x[4 * i + 1], x[4 * i + 2], x[4 * i + 3],
                     y[4 * i + 1], y[4 * i + 2], y[4 * i + 3]);
    }
    free(x);
    free(y);
}

/* Exports t under name, reloads it and compares; returns the number of encodes compared. */
static int check_export(const qlm_tokenizer *t, const char *name, out_dir *keep_open) {
    out_dir d;
    open_out_dir(&d, name);
    qlm_tokenizer *back = round_trip(t, &d);
    compare_tokens(t, back);
    compare_merges(t, back);
    test_corpus c = test_corpus_load(CORPUS);
    tally s = {0};
    for (int i = 0; i < c.n; i++) compare_line(t, back, c.line[i], c.len[i], i, &s);
    size_t all_len = (size_t)(c.line[c.n - 1] + c.len[c.n - 1] - c.data);
    compare_line(t, back, c.data, all_len, -1, &s); /* the whole corpus as one text */
    print_message("%s: %d encodes, %d mismatches, %d with <unk> parsed\n", name, s.encodes, s.mismatches,
                  s.unk_parsed);
    assert_int_equal(s.mismatches, 0);
    test_corpus_free(&c);
    qlm_tokenizer_free(back);
    if (keep_open) *keep_open = d;
    else close_out_dir(&d);
    return s.unk_parsed;
}

/* ---- sources ---- */

static qlm_tokenizer *load_llama2c_asset(const char *rel, int n_vocab) {
    char path[512];
    test_asset(path, sizeof(path), rel);
    qlm_tokenizer *t = qlm_tokenizer_load_llama2c(path, n_vocab);
    if (!t) fail_msg("%s: %s", path, qlm_last_error());
    return t;
}

static qlm_tokenizer *load_json_asset(const char *rel) {
    char path[512];
    test_asset(path, sizeof(path), rel);
    qlm_tokenizer *t = qlm_tokenizer_load_json(path, NULL);
    if (!t) fail_msg("%s: %s", path, qlm_last_error());
    return t;
}

static void test_stories260k(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), "stories260K/tok512.bin"));
    qlm_tokenizer *t = load_llama2c_asset("stories260K/tok512.bin", 512);
    assert_true(check_export(t, "stories260k", NULL) > 0); /* the corpus has "<unk>" lines */
    qlm_tokenizer_free(t);
}

/* Llama 2's tokenizer.bin has scores, no merges; TinyLlama's tokenizer.json holds the merges HF's
 * SentencePiece converter derived from the same vocabulary. Compared as id triples: three of
 * TinyLlama's pieces hold ASCII spaces where tokenizer.bin has the original NBSPs. */
static void test_llama2(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), "llama2-tokenizer/tokenizer.bin"));
    REQUIRE_ASSET(test_asset(path, sizeof(path), "tinyllama-1.1b-chat-v1.0-tokenizer/tokenizer.json"));
    qlm_tokenizer *t = load_llama2c_asset("llama2-tokenizer/tokenizer.bin", 32000);
    qlm_tokenizer *ref = load_json_asset("tinyllama-1.1b-chat-v1.0-tokenizer/tokenizer.json");
    out_dir d;
    assert_true(check_export(t, "llama2", &d) > 0);
    cJSON *j = read_json_file(d.path, "tokenizer.json");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "model"), "merges")), 61249);
    cJSON_Delete(j);
    qlm_tokenizer *back = round_trip(t, &d);
    int n_mine, n_ref;
    int *mine = merge_table(back, &n_mine), *theirs = merge_table(ref, &n_ref);
    print_message("llama2: %d derived merges, TinyLlama's tokenizer.json has %d\n", n_mine, n_ref);
    assert_int_equal(n_mine, 61249);
    assert_int_equal(n_ref, 61249);
    int differ = 0;
    for (int i = 0; i < n_mine; i++) {
        const int *x = mine + 4 * i, *y = theirs + 4 * i;
        if ((x[1] != y[1] || x[2] != y[2] || x[3] != y[3]) && differ++ < 5)
            print_message("merge %d: (%d %d -> %d) vs (%d %d -> %d)\n", i, x[1], x[2], x[3], y[1], y[2], y[3]);
    }
    assert_int_equal(differ, 0);
    free(mine);
    free(theirs);
    qlm_tokenizer_free(back);
    qlm_tokenizer_free(ref);
    close_out_dir(&d);
    qlm_tokenizer_free(t);
}

static void test_tinyllama(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), "tinyllama-1.1b-chat-v1.0-tokenizer/tokenizer.json"));
    qlm_tokenizer *t = load_json_asset("tinyllama-1.1b-chat-v1.0-tokenizer/tokenizer.json");
    out_dir d;
    assert_int_equal(check_export(t, "tinyllama", &d), 0);
    cJSON *cfg = read_json_file(d.path, "tokenizer_config.json");
    assert_string_equal(cJSON_GetObjectItem(cfg, "bos_token")->valuestring, "<s>");
    assert_string_equal(cJSON_GetObjectItem(cfg, "eos_token")->valuestring, "</s>");
    assert_string_equal(cJSON_GetObjectItem(cfg, "unk_token")->valuestring, "<unk>");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cfg, "add_bos_token")));
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(cfg, "add_eos_token")));
    cJSON_Delete(cfg);
    close_out_dir(&d);
    qlm_tokenizer_free(t);
}

/* TinyLlama with a Metaspace pre-tokenizer instead of its normalizer (as test_tokenizer.c). */
static void test_tinyllama_metaspace(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), "tinyllama-1.1b-chat-v1.0-tokenizer/tokenizer.json"));
    static const struct {
        const char *scheme, *name;
        int split;
    } cases[] = {{"first", "tinyllama_ms_first", 0}, {"always", "tinyllama_ms_always", 1}};
    char *json = test_read_file(path, NULL);
    cJSON *root = cJSON_Parse(json);
    assert_non_null(root);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cJSON *pre = cJSON_CreateObject();
        cJSON_AddStringToObject(pre, "type", "Metaspace");
        cJSON_AddStringToObject(pre, "replacement", "\xE2\x96\x81");
        cJSON_AddStringToObject(pre, "prepend_scheme", cases[i].scheme);
        cJSON_AddBoolToObject(pre, "split", cases[i].split);
        cJSON_ReplaceItemInObject(root, "normalizer", cJSON_CreateNull());
        cJSON_ReplaceItemInObject(root, "pre_tokenizer", pre);
        char *text = cJSON_PrintUnformatted(root), dir[256], src[600];
        assert_non_null(test_tmpdir(dir, sizeof(dir)));
        snprintf(src, sizeof(src), "%s/tokenizer.json", dir);
        assert_int_equal(test_write_file(src, text, strlen(text)), 0);
        qlm_tokenizer *t = qlm_tokenizer_load_json(src, NULL);
        if (!t) fail_msg("%s", qlm_last_error());
        assert_true(t->spm_metaspace);
        assert_int_equal(check_export(t, cases[i].name, NULL), 0);
        qlm_tokenizer_free(t);
        remove(src);
        rmdir(dir);
        free(text);
    }
    cJSON_Delete(root);
    free(json);
}

static void test_tinystories656k(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), "tinystories-656K-hf/tokenizer.json"));
    qlm_tokenizer *t = load_json_asset("tinystories-656K-hf/tokenizer.json");
    assert_true(t->norm_added.n == 3); /* its added tokens are "normalized": true */
    out_dir d;
    assert_int_equal(check_export(t, "tinystories656k", &d), 0);
    cJSON *j = read_json_file(d.path, "tokenizer.json");
    const cJSON *added = cJSON_GetObjectItem(j, "added_tokens");
    assert_int_equal(cJSON_GetArraySize(added), 3);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(added, 1), "normalized")));
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(added, 1), "content")->valuestring, "<|start_story|>");
    cJSON_Delete(j);
    close_out_dir(&d);
    qlm_tokenizer_free(t);
}

static qlm_gguf *open_default_gguf(void) {
    char path[512];
    test_default_gguf(path, sizeof(path));
    qlm_gguf *g = qlm_gguf_open(path);
    if (!g) fail_msg("%s: %s", path, qlm_last_error());
    return g;
}

static void test_smollm2(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_default_gguf(path, sizeof(path)));
    qlm_gguf *g = open_default_gguf();
    qlm_tokenizer *t = qlm_gguf_tokenizer(g);
    if (!t) fail_msg("%s", qlm_last_error());
    assert_non_null(qlm_tokenizer_chat_template(t));
    out_dir d;
    assert_int_equal(check_export(t, "smollm2", &d), 0);
    cJSON *j = read_json_file(d.path, "tokenizer.json");
    const cJSON *pre = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "pre_tokenizer"), "pretokenizers"), 0);
    assert_string_equal(cJSON_GetObjectItem(pre, "type")->valuestring, "Digits");
    const cJSON *added = cJSON_GetObjectItem(j, "added_tokens");
    assert_int_equal(cJSON_GetArraySize(added), 17); /* <|endoftext|> .. <empty_output>, all special */
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(added, 1), "content")->valuestring, "<|im_start|>");
    cJSON_Delete(j);
    close_out_dir(&d);
    qlm_tokenizer_free(t);
    qlm_gguf_close(g);
}

/* The SmolLM2 vocabulary under the GPT-2, Llama 3 (ignore_merges) and Qwen2 pre-tokenizers. */
static void test_byte_level_families(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_default_gguf(path, sizeof(path)));
    qlm_gguf *g = open_default_gguf();
    qlm_tokenizer_spec spec = {.type = QLM_TOK_BYTE_BPE, .bos_id = 1, .eos_id = 2, .unk_id = -1, .pad_id = -1};
    int *types = NULL, n_types = 0;
    assert_int_equal(qlm_gguf_get_str_array(g, "tokenizer.ggml.tokens", &spec.tokens, &spec.n_vocab), 0);
    assert_int_equal(qlm_gguf_get_str_array(g, "tokenizer.ggml.merges", &spec.merges, &spec.n_merges), 0);
    assert_int_equal(qlm_gguf_get_int_array(g, "tokenizer.ggml.token_type", &types, &n_types), 0);
    spec.token_types = types;
    static const struct {
        qlm_pretokenizer pre;
        int ignore_merges, add_bos, add_eos;
        const char *name;
    } cases[] = {{QLM_PRE_GPT2, 0, 0, 0, "smollm2_pre_gpt2"},
                 {QLM_PRE_LLAMA3, 1, 1, 0, "smollm2_pre_llama3"},
                 {QLM_PRE_QWEN2, 0, 1, 1, "smollm2_pre_qwen2"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        spec.pre = cases[i].pre;
        spec.ignore_merges = cases[i].ignore_merges;
        spec.add_bos = cases[i].add_bos, spec.add_eos = cases[i].add_eos;
        qlm_tokenizer *t = qlm_tokenizer_build(&spec);
        if (!t) fail_msg("%s", qlm_last_error());
        out_dir d;
        assert_int_equal(check_export(t, cases[i].name, &d), 0);
        qlm_tokenizer *back = round_trip(t, &d);
        assert_int_equal(back->pre, cases[i].pre);
        assert_int_equal(back->ignore_merges, cases[i].ignore_merges);
        qlm_tokenizer_free(back);
        close_out_dir(&d);
        qlm_tokenizer_free(t);
    }
    free(types);
    qlm_gguf_close(g);
}

/* ---- errors ---- */

static qlm_tokenizer *tiny(const char *const *tokens, int n) {
    qlm_tokenizer_spec spec = {.type = QLM_TOK_BYTE_BPE, .n_vocab = n, .tokens = tokens,
                               .bos_id = -1, .eos_id = -1, .unk_id = -1, .pad_id = -1};
    qlm_tokenizer *t = qlm_tokenizer_build(&spec);
    if (!t) fail_msg("%s", qlm_last_error());
    return t;
}

static int count_files(const char *path) {
    DIR *dir = opendir(path);
    assert_non_null(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(dir));) n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(dir);
    return n;
}

static void test_errors(void **state) {
    (void)state;
    out_dir d = {.keep = 0};
    assert_non_null(test_tmpdir(d.path, sizeof(d.path)));
    static const char *const dup[] = {"a", "b", "a"}, *const bad_utf8[] = {"a", "\xC3("}, *const ok[] = {"a", "b"};
    qlm_tokenizer *t = tiny(dup, 3);
    assert_int_equal(qlm_tokenizer_save_json(t, d.path), -1);
    assert_non_null(strstr(qlm_last_error(), "token 2"));
    qlm_tokenizer_free(t);
    t = tiny(bad_utf8, 2);
    assert_int_equal(qlm_tokenizer_save_json(t, d.path), -1);
    assert_non_null(strstr(qlm_last_error(), "UTF-8"));
    qlm_tokenizer_free(t);
    t = tiny(ok, 2);
    assert_int_equal(qlm_tokenizer_set_chat_template(t, "{{ x }}\xFF"), 0);
    assert_int_equal(qlm_tokenizer_save_json(t, d.path), -1);
    assert_non_null(strstr(qlm_last_error(), "chat template"));
    qlm_tokenizer_free(t);
    assert_int_equal(count_files(d.path), 0); /* failed saves leave nothing behind */
    char missing[600];
    snprintf(missing, sizeof(missing), "%s/no/such/folder", d.path);
    t = tiny(ok, 2);
    assert_int_equal(qlm_tokenizer_save_json(t, missing), -1);
    assert_non_null(strstr(qlm_last_error(), "tokenizer.json"));
    assert_int_equal(qlm_tokenizer_save_json(NULL, d.path), -1);
    assert_int_equal(qlm_tokenizer_save_json(t, d.path), 0);
    assert_int_equal(count_files(d.path), 2); /* tokenizer.json and tokenizer_config.json, no temporaries */
    qlm_tokenizer *back = round_trip(t, &d);
    compare_tokens(t, back);
    assert_null(qlm_tokenizer_chat_template(back));
    qlm_tokenizer_free(back);
    qlm_tokenizer_free(t);
    close_out_dir(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k),          cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_tinyllama),            cmocka_unit_test(test_tinyllama_metaspace),
        cmocka_unit_test(test_tinystories656k),      cmocka_unit_test(test_smollm2),
        cmocka_unit_test(test_byte_level_families),  cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
