/* safetensors reader/writer against files written by the Python safetensors library:
 * the HF fixtures (tests/fixtures/llama, tools/make_llama_fixtures.py), a mixed-dtype file
 * (tests/fixtures/safetensors/mixed.safetensors) and the real tinystories-656K checkpoint.
 * Re-saving a Python-written file must reproduce it byte for byte, which is how we know
 * Python can read what qlm writes (tools/check_qlm_exports.py checks the rest by hand). */
#include "test_util.h"

#include <dirent.h>
#include <math.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "loaders/safetensors.h"

static const char *FIXTURES[] = {"mha_untied", "gqa_tied", "qwen2_bias", "llama3_rope"};
#define N_FIXTURES (sizeof FIXTURES / sizeof FIXTURES[0])

static qlm_tensor_store *load_dir_ok(const char *dir) {
    qlm_tensor_store *s = qlm_store_new();
    assert_non_null(s);
    if (qlm_safetensors_load_dir(dir, s) != 0) fail_msg("loading %s: %s", dir, qlm_last_error());
    return s;
}

static qlm_tensor_store *load_file_ok(const char *path) {
    qlm_tensor_store *s = qlm_store_new();
    assert_non_null(s);
    if (qlm_safetensors_load(path, s) != 0) fail_msg("loading %s: %s", path, qlm_last_error());
    return s;
}

static int load_dir_fails(const char *dir) {
    qlm_tensor_store *s = qlm_store_new();
    assert_non_null(s);
    qlm_clear_error();
    int rc = qlm_safetensors_load_dir(dir, s);
    qlm_store_free(s);
    return rc != 0;
}

static void assert_files_equal(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = test_read_file(a, &na), *y = test_read_file(b, &nb);
    assert_non_null(x);
    assert_non_null(y);
    if (na != nb) fail_msg("%s: %zu bytes, %s: %zu bytes", a, na, b, nb);
    for (size_t i = 0; i < na; i++)
        if (x[i] != y[i]) fail_msg("%s and %s differ at byte %zu", a, b, i);
    free(x);
    free(y);
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    const struct dirent *e;
    char p[1024];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    const struct dirent *e;
    while (d && (e = readdir(d))) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

/* Every tensor of the fixture matches the shape, sums and first values Python recorded. */
static void check_fixture(const char *name) {
    char dir[512], ref_path[600];
    snprintf(dir, sizeof dir, "tests/fixtures/llama/%s", name);
    snprintf(ref_path, sizeof ref_path, "%s/reference.json", dir);
    char *text = test_read_file(ref_path, NULL);
    assert_non_null(text);
    cJSON *ref = cJSON_Parse(text);
    free(text);
    assert_non_null(ref);
    const cJSON *tensors = cJSON_GetObjectItem(ref, "tensors");
    assert_true(cJSON_IsObject(tensors));

    qlm_tensor_store *s = load_dir_ok(dir);
    assert_int_equal(qlm_store_count(s), cJSON_GetArraySize(tensors));
    for (const cJSON *t = tensors->child; t; t = t->next) {
        const qlm_tensor_entry *e = qlm_store_find(s, t->string);
        if (!e) fail_msg("%s: tensor %s missing", name, t->string);
        assert_int_equal(e->dtype, QLM_F32);
        const cJSON *shape = cJSON_GetObjectItem(t, "shape");
        assert_int_equal(e->ndim, cJSON_GetArraySize(shape));
        for (int d = 0; d < e->ndim; d++) assert_int_equal(e->shape[d], cJSON_GetArrayItem(shape, d)->valueint);
        const float *v = e->data;
        int64_t n = qlm_entry_numel(e);
        assert_int_equal(e->nbytes, (size_t)n * 4);
        double sum = 0, abs_sum = 0;
        for (int64_t i = 0; i < n; i++) {
            sum += v[i];
            abs_sum += fabs(v[i]);
        }
        double want_abs = cJSON_GetObjectItem(t, "abs_sum")->valuedouble;
        assert_true(fabs(sum - cJSON_GetObjectItem(t, "sum")->valuedouble) <= 1e-9 * want_abs + 1e-12);
        assert_true(fabs(abs_sum - want_abs) <= 1e-9 * want_abs);
        const cJSON *first = cJSON_GetObjectItem(t, "first");
        for (int i = 0; i < cJSON_GetArraySize(first) && i < n; i++)
            assert_true(v[i] == (float)cJSON_GetArrayItem(first, i)->valuedouble);
    }
    cJSON_Delete(ref);
    qlm_store_free(s);
}

static void test_fixture_models(void **state) {
    (void)state;
    for (size_t i = 0; i < N_FIXTURES; i++) check_fixture(FIXTURES[i]);

    /* Tied: transformers stores only the embedding; untied stores both; Qwen2 has q/k/v bias only. */
    qlm_tensor_store *s = load_dir_ok("tests/fixtures/llama/gqa_tied");
    assert_non_null(qlm_store_find(s, "model.embed_tokens.weight"));
    assert_null(qlm_store_find(s, "lm_head.weight"));
    assert_int_equal(qlm_store_find(s, "model.layers.1.self_attn.k_proj.weight")->shape[0], 16); /* 2 kv x 8 */
    qlm_store_free(s);
    s = load_dir_ok("tests/fixtures/llama/qwen2_bias");
    assert_int_equal(qlm_store_find(s, "model.layers.0.self_attn.q_proj.bias")->shape[0], 64);
    assert_int_equal(qlm_store_find(s, "model.layers.0.self_attn.v_proj.bias")->shape[0], 32);
    assert_null(qlm_store_find(s, "model.layers.0.self_attn.o_proj.bias"));
    assert_non_null(qlm_store_find(s, "lm_head.weight"));
    qlm_store_free(s);
    s = load_dir_ok("tests/fixtures/llama/llama3_rope");
    const qlm_tensor_entry *q = qlm_store_find(s, "model.layers.2.self_attn.q_proj.weight");
    assert_int_equal(q->shape[0], 128); /* 4 heads x head_dim 32 */
    assert_int_equal(q->shape[1], 64);
    qlm_store_free(s);
}

static void test_fixture_resave_byte_identical(void **state) {
    (void)state;
    char tmp[256], out[300], src[300];
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    snprintf(out, sizeof out, "%s/resaved.safetensors", tmp);
    static const char *const meta[] = {"format", "pt", NULL};
    for (size_t i = 0; i < N_FIXTURES + 1; i++) {
        if (i < N_FIXTURES) snprintf(src, sizeof src, "tests/fixtures/llama/%s/model.safetensors", FIXTURES[i]);
        else snprintf(src, sizeof src, "tests/fixtures/safetensors/mixed.safetensors");
        qlm_tensor_store *s = load_file_ok(src);
        if (qlm_safetensors_save(out, s, meta) != 0) fail_msg("%s", qlm_last_error());
        qlm_store_free(s);
        assert_files_equal(src, out);
    }
    assert_int_equal(count_files(tmp), 1); /* no temporary file left behind */
    remove_tree(tmp);
}

static const qlm_tensor_entry *find_ok(const qlm_tensor_store *s, const char *name) {
    const qlm_tensor_entry *e = qlm_store_find(s, name);
    if (!e) fail_msg("tensor %s missing", name);
    return e;
}

static void test_mixed_dtypes(void **state) {
    (void)state;
    qlm_tensor_store *s = load_file_ok("tests/fixtures/safetensors/mixed.safetensors");
    assert_int_equal(qlm_store_count(s), 7); /* the two _scale companions are attached, not listed */
    assert_null(qlm_store_find(s, "i8.per_tensor_scale"));

    const qlm_tensor_entry *e = find_ok(s, "f32.matrix");
    assert_int_equal(e->ndim, 2);
    assert_int_equal(e->shape[0], 4);
    assert_int_equal(e->shape[1], 6);
    for (int i = 0; i < 24; i++) assert_true(((const float *)e->data)[i] == i * 0.25f - 3.0f);

    static const uint16_t f16_bits[] = {0xBC00, 0xB800, 0x0000, 0x3800, 0x3C00}; /* -1 -0.5 0 0.5 1 */
    e = find_ok(s, "f16.vector");
    assert_int_equal(e->dtype, QLM_F16);
    assert_memory_equal(e->data, f16_bits, sizeof f16_bits);

    static const uint16_t bf16_bits[] = {0x3F80, 0xC000, 0x4049, 0x0000, 0x7F80, 0x3E80};
    e = find_ok(s, "bf16.vector");
    assert_int_equal(e->dtype, QLM_BF16);
    assert_memory_equal(e->data, bf16_bits, sizeof bf16_bits);

    e = find_ok(s, "i8.per_tensor");
    assert_int_equal(e->dtype, QLM_I8);
    assert_null(e->row_scales);
    assert_true(e->scale == 0.125f);
    for (int i = 0; i < 6; i++) assert_int_equal(((const int8_t *)e->data)[i], i * 11 - 60);

    static const int8_t rows[] = {127, -127, 0, 1, -1, 64, -128, 5, 9};
    e = find_ok(s, "i8.per_row");
    assert_memory_equal(e->data, rows, sizeof rows);
    assert_non_null(e->row_scales);
    assert_true(e->row_scales[0] == 0.5f && e->row_scales[1] == 0.25f && e->row_scales[2] == 2.0f);
    assert_int_equal((uintptr_t)e->row_scales % 4, 0);

    e = find_ok(s, "empty");
    assert_int_equal(e->ndim, 2);
    assert_int_equal(e->shape[0], 0);
    assert_int_equal(e->nbytes, 0);
    e = find_ok(s, "scalar");
    assert_int_equal(e->ndim, 0);
    assert_true(*(const float *)e->data == 7.5f);
    qlm_store_free(s);
}

static void test_tinystories(void **state) {
    (void)state;
    char dir[512];
    test_asset(dir, sizeof dir, "tinystories-656K-hf");
    REQUIRE_ASSET(dir);
    qlm_tensor_store *s = load_dir_ok(dir);
    assert_int_equal(qlm_store_count(s), 20);
    /* Tied model that stores only lm_head.weight (metadata maps the embedding to it). */
    assert_null(qlm_store_find(s, "model.embed_tokens.weight"));
    const qlm_tensor_entry *e = find_ok(s, "lm_head.weight");
    assert_int_equal(e->ndim, 2);
    assert_int_equal(e->shape[0], 2048);
    assert_int_equal(e->shape[1], 128);
    const float *w = e->data;
    /* Values from safetensors.numpy.load_file. */
    assert_true(w[0] == -0.68359375f && w[1] == -0.02587890625f && w[2] == 0.58984375f);
    assert_true(w[2048 * 128 - 1] == -0.421875f);
    double sum = 0;
    for (int i = 0; i < 2048 * 128; i++) sum += w[i];
    assert_true(fabs(sum - 2512.834466814995) < 1e-6);
    e = find_ok(s, "model.norm.weight");
    sum = 0;
    for (int i = 0; i < 128; i++) sum += ((const float *)e->data)[i];
    assert_true(fabs(sum - 83.99560546875) < 1e-9);
    assert_int_equal(find_ok(s, "model.layers.1.mlp.down_proj.weight")->shape[1], 384);
    assert_int_equal(find_ok(s, "model.layers.0.self_attn.k_proj.weight")->shape[0], 64);

    /* A third-party file, written by an older library version, also re-saves byte for byte. */
    char tmp[256], out[300], src[600];
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    snprintf(out, sizeof out, "%s/model.safetensors", tmp);
    snprintf(src, sizeof src, "%s/model.safetensors", dir);
    static const char *const meta[] = {"format", "pt", "model.embed_tokens.weight", "lm_head.weight", NULL};
    if (qlm_safetensors_save(out, s, meta) != 0) fail_msg("%s", qlm_last_error());
    assert_files_equal(src, out);
    qlm_store_free(s);
    remove_tree(tmp);
}

/* ---------- in-memory round trip ---------- */

static uint32_t rng_state = 12345;
static uint32_t next_rand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static void *add_random(qlm_tensor_store *s, const char *name, qlm_dtype dt, int ndim, const int64_t *shape) {
    void *data = NULL;
    qlm_tensor_entry *e = qlm_store_add_owned(s, name, dt, ndim, shape, &data);
    assert_non_null(e);
    /* Arbitrary bit patterns, NaN payloads and subnormals included: the copy must be exact. */
    for (size_t i = 0; i < e->nbytes; i++) ((uint8_t *)data)[i] = (uint8_t)next_rand();
    return e;
}

static void assert_same_entry(const qlm_tensor_entry *a, const qlm_tensor_entry *b) {
    assert_string_equal(a->name, b->name);
    assert_int_equal(a->dtype, b->dtype);
    assert_int_equal(a->ndim, b->ndim);
    for (int d = 0; d < a->ndim; d++) assert_int_equal(a->shape[d], b->shape[d]);
    assert_int_equal(a->nbytes, b->nbytes);
    if (a->nbytes) assert_memory_equal(a->data, b->data, a->nbytes);
    assert_memory_equal(&a->scale, &b->scale, sizeof a->scale);
    assert_int_equal(a->row_scales != NULL, b->row_scales != NULL);
    if (a->row_scales) assert_memory_equal(a->row_scales, b->row_scales, (size_t)a->shape[0] * 4);
}

static qlm_tensor_store *make_store(float **row_scales_out) {
    qlm_tensor_store *s = qlm_store_new();
    assert_non_null(s);
    int64_t m[2] = {5, 7}, v[1] = {9}, c[3] = {2, 3, 5}, r[2] = {6, 4}, q[4] = {1, 2, 3, 4};
    add_random(s, "z.f32", QLM_F32, 2, m);
    add_random(s, "a.f16", QLM_F16, 1, v);
    add_random(s, "m.bf16", QLM_BF16, 3, c);
    add_random(s, "b.bf16_4d", QLM_BF16, 4, q);
    qlm_tensor_entry *pt = add_random(s, "w.i8_tensor", QLM_I8, 2, m);
    pt->scale = 0.0123f;
    qlm_tensor_entry *pr = add_random(s, "w.i8_rows", QLM_I8, 2, r);
    float *rs = malloc(6 * sizeof *rs);
    assert_non_null(rs);
    for (int i = 0; i < 6; i++) rs[i] = 0.001f * (float)(i + 1) + 1e-7f * (float)next_rand();
    pr->row_scales = rs;
    *row_scales_out = rs;
    return s;
}

static void test_roundtrip(void **state) {
    (void)state;
    char tmp[256], path[300];
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    snprintf(path, sizeof path, "%s/rt.safetensors", tmp);
    float *rs;
    qlm_tensor_store *a = make_store(&rs);
    static const char *const meta[] = {"format", "pt", "quote\"d", "line\nbreak\x01", NULL};
    if (qlm_safetensors_save(path, a, meta) != 0) fail_msg("%s", qlm_last_error());
    /* Save over an existing file (the rename replaces it). */
    if (qlm_safetensors_save(path, a, meta) != 0) fail_msg("%s", qlm_last_error());
    const char *export_dir = getenv("QLM_EXPORT_DIR"); /* for tools/check_qlm_exports.py */
    if (export_dir && *export_dir) {
        char out[600];
        snprintf(out, sizeof out, "%s/roundtrip.safetensors", export_dir);
        mkdir(export_dir, 0755);
        if (qlm_safetensors_save(out, a, meta) != 0) fail_msg("%s", qlm_last_error());
    }
    qlm_tensor_store *b = load_file_ok(path);
    assert_int_equal(qlm_store_count(b), qlm_store_count(a));
    for (int i = 0; i < qlm_store_count(a); i++) {
        const qlm_tensor_entry *ea = qlm_store_at(a, i);
        assert_same_entry(ea, find_ok(b, ea->name));
    }
    /* Data section: F32 (tensors then scales, by name), BF16, F16, I8; each aligned to its size. */
    for (int i = 0; i < qlm_store_count(b); i++) {
        const qlm_tensor_entry *e = qlm_store_at(b, i);
        assert_int_equal((uintptr_t)e->data % qlm_dtype_size(e->dtype), 0);
    }
    size_t len;
    char *bytes = test_read_file(path, &len);
    assert_non_null(bytes);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | (uint8_t)bytes[i];
    assert_int_equal(hlen % 8, 0);
    assert_non_null(strstr(bytes + 8, "\"quote\\\"d\":\"line\\nbreak\\u0001\""));
    const char *order[] = {"\"w.i8_rows_scale\"", "\"w.i8_tensor_scale\"", "\"z.f32\"", "\"b.bf16_4d\"",
                           "\"m.bf16\"", "\"a.f16\"", "\"w.i8_rows\"", "\"w.i8_tensor\""};
    const char *prev = bytes + 8;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        const char *p = strstr(bytes + 8, order[i]);
        assert_non_null(p);
        assert_true(p > prev);
        prev = p;
    }
    free(bytes);
    qlm_store_free(a);
    qlm_store_free(b);
    free(rs);
    assert_int_equal(count_files(tmp), 1);
    remove_tree(tmp);
}

/* A safetensors file made of header text and n zero data bytes. */
static void write_raw(const char *path, const char *header, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t len = strlen(header);
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(len >> (8 * i));
    assert_int_equal(fwrite(le, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, len, f), len);
    for (size_t i = 0; i < n; i++) fputc(0, f);
    assert_int_equal(fclose(f), 0);
}

/* Block-type tensors go out as U8 [rows, bytes] with a qlm.blocks.<name> metadata key and come back
 * as the same entries; a U8 tensor without that key, with a bad one, or whose rows are not whole
 * blocks is refused by name. */
static void test_block_roundtrip(void **state) {
    (void)state;
    char tmp[256], path[300];
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    snprintf(path, sizeof path, "%s/blocks.safetensors", tmp);
    qlm_tensor_store *a = qlm_store_new();
    struct { const char *name; qlm_dtype dt; int group; int64_t rows, cols; } spec[] = {
        {"w.q4_1", QLM_Q4_1, 64, 3, 128}, {"w.q8_0", QLM_Q8_0, 32, 2, 64}, {"w.q4_0", QLM_Q4_0, 128, 1, 256}};
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
        void *data;
        qlm_tensor_entry *e = qlm_store_add_owned_blocks(a, spec[i].name, spec[i].dt, spec[i].group, spec[i].rows,
                                                         spec[i].cols, &data);
        assert_non_null(e);
        for (size_t k = 0; k < e->nbytes; k++) ((uint8_t *)data)[k] = (uint8_t)next_rand();
    }
    int64_t shape[1] = {3};
    float *v;
    assert_non_null(qlm_store_add_owned(a, "norm", QLM_F32, 1, shape, (void **)&v));
    v[0] = v[1] = v[2] = 1;
    if (qlm_safetensors_save(path, a, NULL) != 0) fail_msg("%s", qlm_last_error());
    qlm_tensor_store *b = load_file_ok(path);
    assert_int_equal(qlm_store_count(b), qlm_store_count(a));
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
        const qlm_tensor_entry *ea = qlm_store_find(a, spec[i].name), *eb = find_ok(b, spec[i].name);
        assert_int_equal(eb->dtype, spec[i].dt);
        assert_int_equal(eb->group, spec[i].group);
        assert_int_equal(eb->ndim, 2);
        assert_int_equal(eb->shape[0], spec[i].rows);
        assert_int_equal(eb->shape[1], spec[i].cols);
        assert_int_equal(eb->nbytes, ea->nbytes);
        assert_memory_equal(eb->data, ea->data, ea->nbytes);
    }
    qlm_store_free(a);
    qlm_store_free(b);
    qlm_tensor_store *s = qlm_store_new();
    write_raw(path, "{\"x\":{\"dtype\":\"U8\",\"shape\":[2,18],\"data_offsets\":[0,36]}}", 36);
    assert_int_equal(qlm_safetensors_load(path, s), -1);
    assert_non_null(strstr(qlm_last_error(), "no qlm.blocks.x entry"));
    write_raw(path, "{\"__metadata__\":{\"qlm.blocks.x\":\"q4_2/32\"},"
                    "\"x\":{\"dtype\":\"U8\",\"shape\":[2,18],\"data_offsets\":[0,36]}}", 36);
    assert_int_equal(qlm_safetensors_load(path, s), -1);
    assert_non_null(strstr(qlm_last_error(), "q4_2/32"));
    write_raw(path, "{\"__metadata__\":{\"qlm.blocks.x\":\"q4_0/32\"},"
                    "\"x\":{\"dtype\":\"U8\",\"shape\":[2,20],\"data_offsets\":[0,40]}}", 40);
    assert_int_equal(qlm_safetensors_load(path, s), -1);
    assert_non_null(strstr(qlm_last_error(), "whole 18-byte blocks"));
    write_raw(path, "{\"__metadata__\":{\"qlm.blocks.x\":\"q4_0/32\"},"
                    "\"x\":{\"dtype\":\"U8\",\"shape\":[2,36],\"data_offsets\":[0,72]}}", 72);
    assert_int_equal(qlm_safetensors_load(path, s), 0);
    const qlm_tensor_entry *x = find_ok(s, "x");
    assert_true(x->dtype == QLM_Q4_0 && x->group == 32 && x->shape[0] == 2 && x->shape[1] == 64);
    qlm_store_free(s);
    remove_tree(tmp);
}

static void test_save_rejects_bad_store(void **state) {
    (void)state;
    char tmp[256], path[300];
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    snprintf(path, sizeof path, "%s/bad.safetensors", tmp);
    int64_t shape[1] = {4};
    static float data[4];

    qlm_tensor_store *s = qlm_store_new();
    assert_non_null(qlm_store_add(s, "w", QLM_I8, 1, shape, data, 4));
    assert_non_null(qlm_store_add(s, "w_scale", QLM_F32, 1, shape, data, 16));
    assert_int_equal(qlm_safetensors_save(path, s, NULL), -1);
    assert_non_null(strstr(qlm_last_error(), "w_scale"));
    qlm_store_free(s);

    s = qlm_store_new();
    assert_non_null(qlm_store_add(s, "short", QLM_F32, 1, shape, data, 12));
    assert_int_equal(qlm_safetensors_save(path, s, NULL), -1);
    assert_non_null(strstr(qlm_last_error(), "short"));
    qlm_store_free(s);

    s = qlm_store_new();
    assert_non_null(qlm_store_add(s, "ok", QLM_F32, 1, shape, data, 16));
    char missing[400];
    snprintf(missing, sizeof missing, "%s/no/such/dir/x.safetensors", tmp);
    assert_int_equal(qlm_safetensors_save(missing, s, NULL), -1);
    qlm_store_free(s);
    assert_int_equal(count_files(tmp), 0);
    remove_tree(tmp);
}

/* ---------- folders ---------- */

static void write_text(const char *dir, const char *name, const char *text) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    assert_int_equal(test_write_file(p, text, strlen(text)), 0);
}

/* Two shards written from one store split by name: entries before "m" go to shard 1. */
static void write_shards(const char *dir, const qlm_tensor_store *all) {
    qlm_tensor_store *s1 = qlm_store_new(), *s2 = qlm_store_new();
    for (int i = 0; i < qlm_store_count(all); i++) {
        const qlm_tensor_entry *e = qlm_store_at(all, i);
        qlm_tensor_entry *c = qlm_store_add(strcmp(e->name, "m") < 0 ? s1 : s2, e->name, e->dtype, e->ndim, e->shape,
                                            e->data, e->nbytes);
        assert_non_null(c);
        c->scale = e->scale;
        c->row_scales = e->row_scales;
    }
    char p[600];
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    assert_int_equal(qlm_safetensors_save(p, s1, NULL), 0);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(qlm_safetensors_save(p, s2, NULL), 0);
    qlm_store_free(s1);
    qlm_store_free(s2);
}

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"
#define INDEX_HEAD "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {"
#define GOOD_MAP                                                                                          \
    "\"a.f16\": \"" SHARD1 "\", \"b.bf16_4d\": \"" SHARD1 "\", \"m.bf16\": \"" SHARD2 "\", \"z.f32\": \"" \
    SHARD2 "\", \"w.i8_rows\": \"" SHARD2 "\", \"w.i8_rows_scale\": \"" SHARD2 "\", \"w.i8_tensor\": \"" SHARD2 "\""

/* Released mapped pages read back as they were (faulted in from the file again), and an owned
 * buffer is left alone. */
static void test_release_keeps_data(void **state) {
    (void)state;
    qlm_tensor_store *s = load_dir_ok("tests/fixtures/llama/mha_untied");
    int n = qlm_store_count(s);
    void **copies = calloc((size_t)n, sizeof *copies);
    for (int i = 0; i < n; i++) {
        const qlm_tensor_entry *e = qlm_store_at(s, i);
        copies[i] = malloc(e->nbytes);
        memcpy(copies[i], e->data, e->nbytes);
        qlm_store_release(s, e);
    }
    for (int i = 0; i < n; i++) {
        const qlm_tensor_entry *e = qlm_store_at(s, i);
        assert_memory_equal(e->data, copies[i], e->nbytes);
        free(copies[i]);
    }
    free(copies);
    int64_t shape[1] = {4096};
    void *owned;
    qlm_tensor_entry *e = qlm_store_add_owned(s, "owned", QLM_F32, 1, shape, &owned);
    for (int i = 0; i < 4096; i++) ((float *)owned)[i] = (float)i;
    qlm_store_release(s, e);
    for (int i = 0; i < 4096; i++) assert_true(((float *)owned)[i] == (float)i);
    qlm_store_free(s);
}

/* A store read once: a released entry's data is gone (NULL, never a dangling pointer), and an
 * owned buffer is freed when the last entry pointing into it is released (ASan's leak and
 * use-after-free checks watch the rest). */
static void test_read_once(void **state) {
    (void)state;
    qlm_tensor_store *s = load_dir_ok("tests/fixtures/llama/mha_untied");
    int64_t shape[2] = {64, 64};
    void *buf;
    qlm_tensor_entry *whole = qlm_store_add_owned(s, "whole", QLM_F32, 2, shape, &buf);
    assert_non_null(whole);
    /* two views into the second half of the buffer, as fused projections are split */
    int64_t half[2] = {32, 64};
    const qlm_tensor_entry *a = qlm_store_add(s, "a", QLM_F32, 2, half, (float *)buf + 32 * 64, 32 * 64 * sizeof(float));
    assert_non_null(a);
    qlm_store_read_once(s);
    const qlm_tensor_entry *mapped = qlm_store_find(s, "model.norm.weight");
    qlm_store_release(s, mapped);
    assert_null(mapped->data);
    qlm_store_release(s, whole);
    assert_null(whole->data);
    /* a still points into the buffer: it is not freed yet, and reads as it was */
    ((float *)a->data)[0] = 7.0f;
    assert_true(((const float *)a->data)[0] == 7.0f);
    qlm_store_release(s, a);
    assert_null(a->data);
    qlm_store_free(s);
}

static void test_sharded(void **state) {
    (void)state;
    char tmp[256];
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    float *rs;
    qlm_tensor_store *a = make_store(&rs);
    write_shards(tmp, a);
    write_text(tmp, "model.safetensors.index.json", INDEX_HEAD GOOD_MAP "}}");
    qlm_tensor_store *b = load_dir_ok(tmp);
    assert_int_equal(qlm_store_count(b), qlm_store_count(a));
    for (int i = 0; i < qlm_store_count(a); i++) assert_same_entry(qlm_store_at(a, i), find_ok(b, qlm_store_at(a, i)->name));
    qlm_store_free(b);

    static const char *const bad_maps[] = {
        /* a tensor mapped to the wrong shard */
        "\"a.f16\": \"" SHARD2 "\", \"z.f32\": \"" SHARD2 "\"",
        /* a tensor no shard holds */
        GOOD_MAP ", \"lm_head.weight\": \"" SHARD1 "\"",
        /* a scale mapped away from its INT8 tensor */
        "\"a.f16\": \"" SHARD1 "\", \"w.i8_tensor_scale\": \"" SHARD1 "\", \"z.f32\": \"" SHARD2 "\"",
        /* shard names that leave the folder, or do not exist */
        "\"a.f16\": \"../" SHARD1 "\"",
        "\"a.f16\": \"/etc/passwd\"",
        "\"a.f16\": \"sub/" SHARD1 "\"",
        "\"a.f16\": \"..\"",
        "\"a.f16\": \"\"",
        "\"a.f16\": \"missing.safetensors\"",
        /* wrong types */
        "\"a.f16\": 3",
        "\"a.f16\": null",
        "",
    };
    for (size_t i = 0; i < sizeof bad_maps / sizeof bad_maps[0]; i++) {
        char index[2048];
        snprintf(index, sizeof index, INDEX_HEAD "%s}}", bad_maps[i]);
        write_text(tmp, "model.safetensors.index.json", index);
        if (!load_dir_fails(tmp)) fail_msg("index accepted: %s", index);
        assert_non_null(strstr(qlm_last_error(), "model.safetensors.index.json"));
    }
    static const char *const bad_index[] = {"", "[]", "{\"weight_map\": []}", "{\"weight_map\": {\"a\": ", "{}"};
    for (size_t i = 0; i < sizeof bad_index / sizeof bad_index[0]; i++) {
        write_text(tmp, "model.safetensors.index.json", bad_index[i]);
        if (!load_dir_fails(tmp)) fail_msg("index accepted: %s", bad_index[i]);
    }
    /* Without the index, two *.safetensors files are ambiguous. */
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", tmp);
    unlink(p);
    assert_true(load_dir_fails(tmp));
    assert_non_null(strstr(qlm_last_error(), "2 .safetensors files"));
    /* With exactly one, of any name, it is loaded. */
    snprintf(p, sizeof p, "%s/" SHARD1, tmp);
    unlink(p);
    b = load_dir_ok(tmp);
    assert_non_null(qlm_store_find(b, "w.i8_rows"));
    assert_null(qlm_store_find(b, "a.f16"));
    qlm_store_free(b);
    snprintf(p, sizeof p, "%s/" SHARD2, tmp);
    unlink(p);
    assert_true(load_dir_fails(tmp));
    assert_true(load_dir_fails("tests/fixtures/no-such-folder"));
    qlm_store_free(a);
    free(rs);
    remove_tree(tmp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_models),
        cmocka_unit_test(test_fixture_resave_byte_identical),
        cmocka_unit_test(test_mixed_dtypes),
        cmocka_unit_test(test_tinystories),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_save_rejects_bad_store), cmocka_unit_test(test_block_roundtrip),
        cmocka_unit_test(test_release_keeps_data),
        cmocka_unit_test(test_read_once),
        cmocka_unit_test(test_sharded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
