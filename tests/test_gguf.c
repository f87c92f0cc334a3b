/* GGUF loader against references from tools/make_gguf_fixtures.py: metadata of every value
 * type as gguf-py reads it, synthetic Llama/Qwen2 files whose tensors (every supported type)
 * were dequantized by gguf-py and un-permuted as transformers does, and the real SmolLM2 Q4_1
 * file summarized by gguf-py and transformers. */
#include "test_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <unistd.h>

#include "../core/error.h"
#include "../models/model.h"
#include "../loaders/gguf.h"
#include "../loaders/hf_config.h"
#include "../quant/quantize.h"

#define FIX "tests/fixtures/gguf/"

static cJSON *load_json(const char *path) {
    char *text = test_read_file(path, NULL);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    return j;
}

static double jnum(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    assert_true(cJSON_IsNumber(v));
    return v->valuedouble;
}

/* |a - b| <= rel * |b|, with a tiny absolute floor for exact zeros. */
static int near(double a, double b, double rel) { return fabs(a - b) <= rel * fabs(b) + 1e-30; }

static qlm_gguf *open_ok(const char *path) {
    qlm_gguf *g = qlm_gguf_open(path);
    if (!g) fail_msg("%s", qlm_last_error());
    return g;
}

/* ---------- metadata of every type ---------- */

static void check_int_kv(qlm_gguf *g, const char *key, const cJSON *value) {
    long long i;
    double f;
    const char *s;
    assert_int_equal(qlm_gguf_get_int(g, key, &i), 0);
    assert_true((double)i == value->valuedouble);
    assert_int_equal(qlm_gguf_get_float(g, key, &f), 0);
    assert_true(f == value->valuedouble);
    assert_int_equal(qlm_gguf_get_str(g, key, &s), -1);
    assert_non_null(strstr(qlm_last_error(), key));
}

static void check_array_kv(qlm_gguf *g, const char *key, const char *elem, const cJSON *value) {
    int n = cJSON_GetArraySize(value), m;
    int is_float = strcmp(elem, "FLOAT32") == 0 || strcmp(elem, "FLOAT64") == 0;
    int is_int = !is_float && strcmp(elem, "BOOL") != 0 && strcmp(elem, "STRING") != 0;
    if (strcmp(elem, "STRING") == 0) {
        const char *const *items;
        assert_int_equal(qlm_gguf_get_str_array(g, key, &items, &m), 0);
        assert_int_equal(m, n);
        for (int i = 0; i < n; i++) assert_string_equal(items[i], cJSON_GetArrayItem(value, i)->valuestring);
        return;
    }
    float *fv = NULL;
    int *iv = NULL;
    assert_int_equal(qlm_gguf_get_float_array(g, key, &fv, &m), is_int || is_float ? 0 : -1);
    if (fv) {
        assert_int_equal(m, n);
        for (int i = 0; i < n; i++) assert_true(fv[i] == (float)cJSON_GetArrayItem(value, i)->valuedouble);
        free(fv);
    }
    /* Integer arrays convert to int only when every element fits. */
    int fits = is_int;
    for (int i = 0; i < n && fits; i++) fits = fabs(cJSON_GetArrayItem(value, i)->valuedouble) <= 2147483647.0;
    assert_int_equal(qlm_gguf_get_int_array(g, key, &iv, &m), fits ? 0 : -1);
    if (iv) {
        assert_int_equal(m, n);
        for (int i = 0; i < n; i++) assert_true(iv[i] == cJSON_GetArrayItem(value, i)->valuedouble);
        free(iv);
    }
}

static void test_kv_types(void **state) {
    (void)state;
    cJSON *ref = load_json(FIX "kv_types.json");
    qlm_gguf *g = open_ok(FIX "kv_types.gguf");
    assert_int_equal(qlm_gguf_n_tensors(g), 0);
    assert_int_equal(qlm_gguf_n_kv(g), cJSON_GetArraySize(ref) + 1); /* + general.architecture */
    const char *s;
    assert_int_equal(qlm_gguf_get_str(g, "general.architecture", &s), 0);
    assert_string_equal(s, "llama");
    for (const cJSON *e = ref->child; e; e = e->next) {
        const char *key = e->string;
        const char *type = cJSON_GetObjectItemCaseSensitive(e, "type")->valuestring;
        const cJSON *value = cJSON_GetObjectItemCaseSensitive(e, "value");
        long long i;
        double f;
        int b;
        if (strcmp(type, "STRING") == 0) {
            assert_int_equal(qlm_gguf_get_str(g, key, &s), 0);
            assert_string_equal(s, value->valuestring);
        } else if (strcmp(type, "BOOL") == 0) {
            assert_int_equal(qlm_gguf_get_bool(g, key, &b), 0);
            assert_int_equal(b, cJSON_IsTrue(value));
            assert_int_equal(qlm_gguf_get_int(g, key, &i), -1);
        } else if (strcmp(type, "FLOAT32") == 0 || strcmp(type, "FLOAT64") == 0) {
            assert_int_equal(qlm_gguf_get_float(g, key, &f), 0);
            assert_true(f == value->valuedouble);
            assert_int_equal(qlm_gguf_get_int(g, key, &i), -1);
        } else if (strcmp(type, "ARRAY") != 0) {
            check_int_kv(g, key, value);
        } else {
            const char *elem = cJSON_GetObjectItemCaseSensitive(e, "elem")->valuestring;
            if (strcmp(elem, "ARRAY") != 0) {
                check_array_kv(g, key, elem, value);
            } else {
                int *iv, n;
                assert_int_equal(qlm_gguf_get_int_array(g, key, &iv, &n), -1);
            }
        }
    }
    qlm_gguf_close(g);
    cJSON_Delete(ref);
}

/* Described values as `qlm info` prints them; nested arrays are skipped correctly when the
 * entries after them still read right. */
static void test_kv_describe(void **state) {
    (void)state;
    qlm_gguf *g = open_ok(FIX "kv_types.gguf");
    struct { const char *key, *want; } cases[] = {
        {"test.u64", "12345678901234"},
        {"test.i8", "-100"},
        {"test.f32", "0.100000001"},
        {"test.bool_false", "false"},
        {"test.str", "\"h\xc3\xa9llo \\\"w\xc3\xb6rld\\\"\\n\""},
        {"test.arr.bool", "[3 x bool] true, false, true"},
        {"test.arr.str", "[4 x string] \"a\", \"\", \"\xc4\xa0the\", \"<|im_end|>\""},
        {"test.arr.nested", "[3 x array]"},
        {"test.arr.nested_str", "[2 x array]"},
        {"test.arr.u64", "[2 x u64] 1, 1099511627776"},
    };
    int found = 0;
    for (int i = 0; i < qlm_gguf_n_kv(g); i++) {
        const char *key;
        char value[200];
        assert_int_equal(qlm_gguf_kv_describe(g, i, &key, value, sizeof value), 0);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            if (strcmp(key, cases[c].key) == 0) {
                assert_string_equal(value, cases[c].want);
                found++;
            }
        /* Tiny buffers are truncated, never overrun (ASan checks the bounds). */
        for (size_t cap = 1; cap < 12; cap++) {
            char *small = malloc(cap);
            assert_int_equal(qlm_gguf_kv_describe(g, i, &key, small, cap), 0);
            assert_true(strlen(small) < cap);
            free(small);
        }
    }
    assert_int_equal(found, (int)(sizeof cases / sizeof cases[0]));
    const char *key;
    char value[8];
    assert_int_equal(qlm_gguf_kv_describe(g, qlm_gguf_n_kv(g), &key, value, sizeof value), -1);
    qlm_gguf_close(g);
}

/* ---------- synthetic models: config and every tensor element ---------- */

static void check_config(const qlm_llama_config *c, const cJSON *ref) {
    assert_string_equal(c->arch, cJSON_GetObjectItemCaseSensitive(ref, "arch")->valuestring);
    assert_int_equal(c->dim, (int)jnum(ref, "dim"));
    assert_int_equal(c->hidden_dim, (int)jnum(ref, "hidden_dim"));
    assert_int_equal(c->n_layers, (int)jnum(ref, "n_layers"));
    assert_int_equal(c->n_heads, (int)jnum(ref, "n_heads"));
    assert_int_equal(c->n_kv_heads, (int)jnum(ref, "n_kv_heads"));
    assert_int_equal(c->head_dim, (int)jnum(ref, "head_dim"));
    assert_int_equal(c->vocab_size, (int)jnum(ref, "vocab_size"));
    assert_int_equal(c->max_seq_len, (int)jnum(ref, "max_seq_len"));
    assert_true(c->rope_theta == (float)jnum(ref, "rope_theta"));
    assert_true(c->norm_eps == (float)jnum(ref, "norm_eps"));
    assert_int_equal(c->bos_id, (int)jnum(ref, "bos_id"));
    assert_int_equal(c->eos_id, (int)jnum(ref, "eos_id"));
    assert_int_equal(c->tie_embeddings, (int)jnum(ref, "tie_embeddings"));
    assert_int_equal(c->attn_bias, (int)jnum(ref, "attn_bias"));
    assert_int_equal(c->attn_out_bias, 0);
    assert_int_equal(c->mlp_bias, 0);
    const cJSON *qk_norm = cJSON_GetObjectItemCaseSensitive(ref, "qk_norm");
    assert_int_equal(c->qk_norm, qk_norm ? (int)qk_norm->valuedouble : 0);
    if (cJSON_GetObjectItemCaseSensitive(ref, "rope_scale_factor")) {
        assert_true(c->rope_scale_factor == (float)jnum(ref, "rope_scale_factor"));
        assert_true(c->rope_low_freq_factor == (float)jnum(ref, "rope_low_freq_factor"));
        assert_true(c->rope_high_freq_factor == (float)jnum(ref, "rope_high_freq_factor"));
        assert_int_equal(c->rope_orig_max_pos, (int)jnum(ref, "rope_orig_max_pos"));
    } else {
        assert_true(c->rope_scale_factor == 0);
    }
}

/* An entry's values as F32 (block types expanded row by row), malloc'd. */
static float *entry_values(const qlm_tensor_entry *e) {
    int64_t n = qlm_entry_numel(e);
    float *out = malloc((size_t)(n ? n : 1) * sizeof *out);
    assert_non_null(out);
    if (e->ndim != 2) {
        qlm_convert_to_f32(out, e->data, e->dtype, n);
        return out;
    }
    /* Rows in PyTorch's order, as the model reads them (rope_heads: kept in the file's order). */
    const qlm_weight w = {.dtype = e->dtype, .rows = (int)e->shape[0], .cols = (int)e->shape[1], .data = e->data,
                          .group = e->group, .rope_heads = e->rope_heads};
    for (int r = 0; r < w.rows; r++) qlm_weight_row_f32(&w, r, out + (size_t)r * w.cols);
    return out;
}

/* The dtype the loader gives a tensor of GGML type `type`: matrices in Q8_0/Q4_0/Q4_1 keep it, so
 * do F16/BF16 ones whose data is 2-byte aligned (aligned: the file's alignment makes it so), the
 * other quantized types become Q8_0; vectors and F32 matrices F32. */
static qlm_dtype expected_dtype(const char *type, int ndim, int aligned) {
    if (ndim != 2 || !strcmp(type, "F32")) return QLM_F32;
    if (!strcmp(type, "Q4_0")) return QLM_Q4_0;
    if (!strcmp(type, "Q4_1")) return QLM_Q4_1;
    if (!strcmp(type, "F16")) return aligned ? QLM_F16 : QLM_F32;
    if (!strcmp(type, "BF16")) return aligned ? QLM_BF16 : QLM_F32;
    return QLM_Q8_0;
}

/* How far a value converted to Q8_0 from another type may lie from gguf-py's: half a step of its
 * block's F16 scale (max|w| / 127, rounded: a value at the top may clamp by a few thousandths of a
 * step more). Exact for every type kept as stored. */
static double allowed_error(const qlm_tensor_entry *e, const char *type, const float *ref, size_t i) {
    if (e->dtype != QLM_Q8_0 || !strcmp(type, "Q8_0")) return 0;
    size_t b0 = i / 32 * 32;
    double amax = 0;
    for (size_t k = b0; k < b0 + 32; k++) amax = fmax(amax, fabs(ref[k]));
    return amax / 127 * 0.51;
}

/* Every tensor of the reference, element by element, and no other tensor in the store. */
static void check_tensors(const qlm_tensor_store *s, const cJSON *tensors, const float *ref, size_t ref_floats,
                          int aligned) {
    assert_int_equal(qlm_store_count(s), cJSON_GetArraySize(tensors));
    for (const cJSON *t = tensors->child; t; t = t->next) {
        const char *hf = cJSON_GetObjectItemCaseSensitive(t, "hf")->valuestring;
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
        const qlm_tensor_entry *e = qlm_store_find(s, hf);
        if (!e) fail_msg("tensor %s missing from the store", hf);
        const char *type = cJSON_GetObjectItemCaseSensitive(t, "type")->valuestring;
        assert_int_equal(e->ndim, cJSON_GetArraySize(shape));
        if (e->dtype != expected_dtype(type, e->ndim, aligned))
            fail_msg("%s (%s) loaded as %s", hf, type, qlm_dtype_name(e->dtype));
        for (int d = 0; d < e->ndim; d++) assert_int_equal(e->shape[d], cJSON_GetArrayItem(shape, d)->valueint);
        size_t off = (size_t)jnum(t, "offset"), n = (size_t)qlm_entry_numel(e);
        assert_true(off + n <= ref_floats);
        if (qlm_dtype_is_block(e->dtype))
            assert_int_equal(e->nbytes, (size_t)e->shape[0] * qlm_dtype_row_bytes(e->dtype, (long)e->shape[1], 32));
        else
            assert_int_equal(e->nbytes, n * qlm_dtype_size(e->dtype));
        float *got = entry_values(e);
        for (size_t i = 0; i < n; i++) {
            double allowed = allowed_error(e, type, ref + off, i);
            if (allowed ? fabs(got[i] - ref[off + i]) > allowed : !near(got[i], ref[off + i], 1e-6))
                fail_msg("%s (%s) element %zu: %.9g, gguf-py %.9g", hf, type, i, got[i], ref[off + i]);
        }
        free(got);
    }
}

static void check_model(const char *name) {
    char path[256];
    snprintf(path, sizeof path, FIX "%s.json", name);
    cJSON *ref = load_json(path);
    snprintf(path, sizeof path, FIX "%s.f32", name);
    size_t len = 0;
    float *values = (float *)test_read_file(path, &len);
    assert_non_null(values);
    snprintf(path, sizeof path, FIX "%s.gguf", name);
    qlm_gguf *g = open_ok(path);
    qlm_llama_config cfg;
    if (qlm_gguf_llama_config(g, &cfg) != 0) fail_msg("%s", qlm_last_error());
    check_config(&cfg, cJSON_GetObjectItemCaseSensitive(ref, "config"));
    qlm_tensor_store *s = qlm_store_new();
    if (qlm_gguf_load_tensors(g, &cfg, s) != 0) fail_msg("%s", qlm_last_error());
    /* tiny_qwen2 is written with general.alignment 1: its F16 data lies at odd offsets. */
    check_tensors(s, cJSON_GetObjectItemCaseSensitive(ref, "tensors"), values, len / sizeof(float),
                  strcmp(name, "tiny_qwen2") != 0);
    qlm_store_free(s);
    qlm_gguf_close(g);
    free(values);
    cJSON_Delete(ref);
}

static void test_tiny_llama(void **state) {
    (void)state;
    check_model("tiny_llama");
}

static void test_tiny_qwen2(void **state) {
    (void)state;
    check_model("tiny_qwen2");
}

static void test_tiny_qwen3(void **state) {
    (void)state;
    check_model("tiny_qwen3");
}

/* Hugging Face fixtures written as llama.cpp writes their architectures (tools/make_gguf_fixtures.py,
 * HF_AS_GGUF): the same config as from config.json, and the fixture's transformers logits within
 * 1e-4 in F32 (Gemma's 1 + w norms, Phi-3's fused matrices and longrope tensors read back). */
static void test_hf_fixtures_as_gguf(void **state) {
    (void)state;
    static const char *const names[] = {"gemma2_softcap", "gemma3_local_rope", "phi3_longrope_long"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char path[300];
        snprintf(path, sizeof path, FIX "%s.gguf", names[k]);
        qlm_gguf *g = open_ok(path);
        qlm_llama_config cfg, want;
        if (qlm_gguf_llama_config(g, &cfg) != 0) fail_msg("%s", qlm_last_error());
        snprintf(path, sizeof path, "tests/fixtures/llama/%s/config.json", names[k]);
        if (qlm_hf_config_load(path, &want) != 0) fail_msg("%s", qlm_last_error());
        assert_true(cfg.post_norms == want.post_norms && cfg.qk_norm == want.qk_norm &&
                    cfg.norm_offset == want.norm_offset && cfg.sliding_window == want.sliding_window &&
                    cfg.window_period == want.window_period && cfg.rope_type == want.rope_type &&
                    cfg.attn_softcap == want.attn_softcap && cfg.final_softcap == want.final_softcap &&
                    cfg.act == want.act && cfg.rope_local_theta == want.rope_local_theta);
        assert_true(fabsf(cfg.query_scale - want.query_scale) <= 1e-7f * want.query_scale + 1e-9f);
        assert_true(fabsf(cfg.rope_attn_factor - want.rope_attn_factor) <= 1e-6f);
        qlm_tensor_store *s = qlm_store_new();
        if (qlm_gguf_load_tensors(g, &cfg, s) != 0) fail_msg("%s", qlm_last_error());
        qlm_model m;
        qlm_model_options o = {.dtype = QLM_F32, .backend = qlm_backend_cpu()};
        if (qlm_model_build(&m, &cfg, s, &o) != 0) fail_msg("%s", qlm_last_error());
        snprintf(path, sizeof path, "tests/fixtures/llama/%s/reference.json", names[k]);
        cJSON *ref = load_json(path);
        const cJSON *toks = cJSON_GetObjectItemCaseSensitive(ref, "tokens");
        int n = cJSON_GetArraySize(toks), vocab = cfg.vocab_size;
        int *ids = malloc((size_t)n * sizeof *ids), *pos = malloc((size_t)n * sizeof *pos);
        for (int i = 0; i < n; i++) ids[i] = cJSON_GetArrayItem(toks, i)->valueint, pos[i] = i;
        snprintf(path, sizeof path, "tests/fixtures/llama/%s/logits.f32", names[k]);
        size_t len;
        float *want_logits = (float *)test_read_file(path, &len), *logits = malloc((size_t)vocab * sizeof *logits);
        assert_int_equal(len, (size_t)n * vocab * sizeof(float));
        qlm_kv_state st;
        assert_int_equal(qlm_state_init(&st, &m, n, n), 0);
        int last = n - 1;
        assert_int_equal(qlm_forward(&m, &st, ids, pos, n, &last, 1, logits), 0);
        double worst = 0;
        for (int v = 0; v < vocab; v++) worst = fmax(worst, fabs((double)logits[v] - want_logits[(size_t)last * vocab + v]));
        print_message("%s.gguf: max|diff| %.3g at the last position\n", names[k], worst);
        assert_true(worst <= 1e-4);
        qlm_state_free(&st, &m);
        free(ids);
        free(pos);
        free(logits);
        free(want_logits);
        cJSON_Delete(ref);
        qlm_model_free(&m);
        qlm_store_free(s);
        qlm_gguf_close(g);
    }
}

/* Tensor infos as listed by gguf-py: names, type names, dims innermost first. */
static void test_tensor_describe(void **state) {
    (void)state;
    cJSON *ref = load_json(FIX "tiny_llama.json");
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(ref, "tensors");
    qlm_gguf *g = open_ok(FIX "tiny_llama.gguf");
    assert_int_equal(qlm_gguf_n_tensors(g), cJSON_GetArraySize(tensors) + 1); /* + rope_freqs.weight */
    int matched = 0;
    for (int i = 0; i < qlm_gguf_n_tensors(g); i++) {
        const char *name, *type;
        int nd;
        long long dims[4];
        assert_int_equal(qlm_gguf_tensor_describe(g, i, &name, &type, &nd, dims), 0);
        for (const cJSON *t = tensors->child; t; t = t->next) {
            if (strcmp(cJSON_GetObjectItemCaseSensitive(t, "gguf")->valuestring, name) != 0) continue;
            const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
            assert_string_equal(type, cJSON_GetObjectItemCaseSensitive(t, "type")->valuestring);
            assert_int_equal(nd, cJSON_GetArraySize(shape));
            for (int d = 0; d < nd; d++) assert_int_equal(dims[d], cJSON_GetArrayItem(shape, nd - 1 - d)->valueint);
            matched++;
        }
    }
    assert_int_equal(matched, cJSON_GetArraySize(tensors));
    qlm_gguf_close(g);
    cJSON_Delete(ref);
}

/* ---------- errors that name the tensor ---------- */

/* A copy of the fixture file with `count` bytes replaced at `at` bytes from the start of the
 * string `name` (a tensor's or a metadata key's), written to a fresh temporary folder. */
static void patched_copy(const char *file, const char *name, size_t at, const void *bytes, size_t count, char *out,
                         size_t cap) {
    size_t len = 0;
    char *data = test_read_file(file, &len);
    assert_non_null(data);
    size_t nlen = strlen(name), pos = 8;
    uint64_t prefix = nlen; /* the name's u64 length field comes right before it */
    while (pos + nlen <= len && !(memcmp(data + pos, name, nlen) == 0 && memcmp(data + pos - 8, &prefix, 8) == 0))
        pos++;
    assert_true(pos + at + count <= len);
    memcpy(data + pos + at, bytes, count);
    char dir[256];
    assert_non_null(test_tmpdir(dir, sizeof dir));
    snprintf(out, cap, "%s/patched.gguf", dir);
    assert_int_equal(test_write_file(out, data, len), 0);
    free(data);
}

static void expect_load_error(const char *path, const char *what1, const char *what2) {
    qlm_gguf *g = open_ok(path);
    qlm_llama_config cfg;
    if (qlm_gguf_llama_config(g, &cfg) != 0) fail_msg("%s", qlm_last_error());
    qlm_tensor_store *s = qlm_store_new();
    assert_int_equal(qlm_gguf_load_tensors(g, &cfg, s), -1);
    const char *msg = qlm_last_error();
    if (!strstr(msg, what1) || !strstr(msg, what2)) fail_msg("unexpected message: %s", msg);
    qlm_store_free(s);
    qlm_gguf_close(g);
    remove(path);
    *strrchr((char *)path, '/') = 0;
    rmdir(path);
}

static void test_unsupported_type(void **state) {
    (void)state;
    char path[300];
    /* blk.0.ffn_gate.weight is Q4_0 (18-byte blocks of 32); IQ4_NL has the same geometry. The
     * type id follows the name, n_dims (4 bytes) and two dims (16 bytes). */
    const char *name = "blk.0.ffn_gate.weight";
    const uint8_t iq4_nl[4] = {20, 0, 0, 0};
    patched_copy(FIX "tiny_llama.gguf", name, strlen(name) + 20, iq4_nl, 4, path, sizeof path);
    expect_load_error(path, "blk.0.ffn_gate.weight", "IQ4_NL");
}

static void test_missing_and_misshaped(void **state) {
    (void)state;
    char path[300];
    const char *up = "blk.2.ffn_up.weight", *norm = "output_norm.weight";
    patched_copy(FIX "tiny_llama.gguf", up, strlen(up) - 1, "x", 1, path, sizeof path); /* renamed blk.2.ffn_up.weighx */
    expect_load_error(path, "blk.2.ffn_up.weight", "missing");
    const uint8_t ne0_16[8] = {16, 0, 0, 0, 0, 0, 0, 0}; /* output_norm [32] -> [16] */
    patched_copy(FIX "tiny_llama.gguf", norm, strlen(norm) + 4, ne0_16, 8, path, sizeof path);
    expect_load_error(path, "output_norm.weight", "shape [16], expected [32]");
}

/* Gemma 3's per-layer window list (gemma3_local_rope: windowed, windowed, global, windowed): all
 * global turns the window off; a mix that is neither "from one layer on" nor "all but every n-th" is
 * refused by its key. The first bool follows the key, its type, element type and count. */
static void test_window_pattern_list(void **state) {
    (void)state;
    const char *key = "gemma3.attention.sliding_window_pattern";
    char path[300];
    const uint8_t none[4] = {0, 0, 0, 0}, odd[1] = {0};
    patched_copy(FIX "gemma3_local_rope.gguf", key, strlen(key) + 16, none, 4, path, sizeof path);
    qlm_gguf *g = open_ok(path);
    qlm_llama_config cfg;
    if (qlm_gguf_llama_config(g, &cfg) != 0) fail_msg("%s", qlm_last_error());
    assert_int_equal(cfg.sliding_window, 0);
    qlm_gguf_close(g);
    patched_copy(FIX "gemma3_local_rope.gguf", key, strlen(key) + 16, odd, 1, path, sizeof path);
    g = open_ok(path);
    assert_int_equal(qlm_gguf_llama_config(g, &cfg), -1);
    if (!strstr(qlm_last_error(), key) || !strstr(qlm_last_error(), "mix of global and windowed layers"))
        fail_msg("unexpected message: %s", qlm_last_error());
    qlm_gguf_close(g);
    remove(path);
    *strrchr(path, '/') = 0;
    rmdir(path);
}

/* ---------- the real default model ---------- */

static void check_real_metadata(qlm_gguf *g, const cJSON *ref) {
    for (const cJSON *m = cJSON_GetObjectItemCaseSensitive(ref, "metadata")->child; m; m = m->next) {
        if (cJSON_IsString(m)) {
            const char *s;
            assert_int_equal(qlm_gguf_get_str(g, m->string, &s), 0);
            assert_string_equal(s, m->valuestring);
        } else {
            double f;
            assert_int_equal(qlm_gguf_get_float(g, m->string, &f), 0);
            assert_true(f == m->valuedouble);
        }
    }
    for (const cJSON *a = cJSON_GetObjectItemCaseSensitive(ref, "arrays")->child; a; a = a->next) {
        int n = (int)jnum(a, "n"), m;
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(a, "items");
        if (strcmp(a->string, "tokenizer.ggml.token_type") == 0) {
            int *v;
            assert_int_equal(qlm_gguf_get_int_array(g, a->string, &v, &m), 0);
            assert_int_equal(m, n);
            for (const cJSON *it = items->child; it; it = it->next) assert_int_equal(v[atoi(it->string)], it->valueint);
            free(v);
        } else {
            const char *const *v;
            assert_int_equal(qlm_gguf_get_str_array(g, a->string, &v, &m), 0);
            assert_int_equal(m, n);
            for (const cJSON *it = items->child; it; it = it->next) assert_string_equal(v[atoi(it->string)], it->valuestring);
        }
    }
    assert_int_equal(qlm_gguf_n_kv(g), (int)jnum(ref, "n_kv"));
    const cJSON *infos = cJSON_GetObjectItemCaseSensitive(ref, "tensor_infos");
    assert_int_equal(qlm_gguf_n_tensors(g), cJSON_GetArraySize(infos));
    int i = 0;
    for (const cJSON *t = infos->child; t; t = t->next, i++) {
        const char *name, *type;
        int nd;
        long long dims[4];
        assert_int_equal(qlm_gguf_tensor_describe(g, i, &name, &type, &nd, dims), 0);
        assert_string_equal(name, cJSON_GetObjectItemCaseSensitive(t, "name")->valuestring);
        assert_string_equal(type, cJSON_GetObjectItemCaseSensitive(t, "type")->valuestring);
        const cJSON *ne = cJSON_GetObjectItemCaseSensitive(t, "ne");
        assert_int_equal(nd, cJSON_GetArraySize(ne));
        for (int d = 0; d < nd; d++) assert_int_equal(dims[d], cJSON_GetArrayItem(ne, d)->valueint);
    }
}

static void check_real_tensor(const qlm_tensor_entry *e, const cJSON *ref) {
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(ref, "shape");
    assert_int_equal(e->ndim, cJSON_GetArraySize(shape));
    for (int d = 0; d < e->ndim; d++) assert_int_equal(e->shape[d], cJSON_GetArrayItem(shape, d)->valueint);
    float *x = entry_values(e);
    int64_t n = qlm_entry_numel(e);
    double sum = 0, sum_abs = 0, sum_sq = 0;
    for (int64_t i = 0; i < n; i++) {
        sum += x[i];
        sum_abs += fabs(x[i]);
        sum_sq += (double)x[i] * x[i];
    }
    if (!near(sum_abs, jnum(ref, "sum_abs"), 1e-9) || !near(sum_sq, jnum(ref, "sum_sq"), 1e-9) ||
        fabs(sum - jnum(ref, "sum")) > 1e-9 * sum_abs)
        fail_msg("%s: sums %.12g %.12g %.12g, transformers %.12g %.12g %.12g", e->name, sum, sum_abs, sum_sq,
                 jnum(ref, "sum"), jnum(ref, "sum_abs"), jnum(ref, "sum_sq"));
    for (const cJSON *s = cJSON_GetObjectItemCaseSensitive(ref, "samples")->child; s; s = s->next)
        assert_true(x[atoll(s->string)] == (float)s->valuedouble);
    free(x);
}

/* Q/K row sums pin down the row order: a wrong (or missing) un-permutation moves them. */
static void check_row_sums(const qlm_tensor_entry *e, const cJSON *rows) {
    assert_int_equal(e->shape[0], cJSON_GetArraySize(rows));
    float *x = entry_values(e);
    int r = 0;
    for (const cJSON *v = rows->child; v; v = v->next, r++) {
        double s = 0, a = 0;
        for (int64_t c = 0; c < e->shape[1]; c++) {
            s += x[r * e->shape[1] + c];
            a += fabs(x[r * e->shape[1] + c]);
        }
        if (fabs(s - v->valuedouble) > 1e-9 * a + 1e-12) fail_msg("%s row %d: %.10g vs %.10g", e->name, r, s, v->valuedouble);
    }
    free(x);
}

static void test_smollm2(void **state) {
    (void)state;
    char path[4096];
    test_default_gguf(path, sizeof path);
    REQUIRE_ASSET(path);
    cJSON *ref = load_json(FIX "smollm2_q4_1.json");
    qlm_gguf *g = open_ok(path);
    check_real_metadata(g, ref);
    qlm_llama_config c;
    if (qlm_gguf_llama_config(g, &c) != 0) fail_msg("%s", qlm_last_error());
    assert_string_equal(c.arch, "llama");
    assert_int_equal(c.dim, 576);
    assert_int_equal(c.hidden_dim, 1536);
    assert_int_equal(c.n_layers, 30);
    assert_int_equal(c.n_heads, 9);
    assert_int_equal(c.n_kv_heads, 3);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.vocab_size, 49152);
    assert_int_equal(c.max_seq_len, 8192);
    assert_true(c.rope_theta == 100000.0f);
    assert_true(c.norm_eps == 1e-5f);
    assert_int_equal(c.tie_embeddings, 1);
    assert_int_equal(c.attn_bias, 0);
    assert_true(c.rope_scale_factor == 0);
    assert_int_equal(c.bos_id, 1);
    assert_int_equal(c.eos_id, 2);
    qlm_tensor_store *s = qlm_store_new();
    if (qlm_gguf_load_tensors(g, &c, s) != 0) fail_msg("%s", qlm_last_error());
    qlm_gguf_close(g);
    const cJSON *sums = cJSON_GetObjectItemCaseSensitive(ref, "tensor_sums");
    assert_int_equal(qlm_store_count(s), cJSON_GetArraySize(sums));
    assert_null(qlm_store_find(s, "lm_head.weight"));
    /* Q/K stay where the file has them, rows interleaved, rather than copied into PyTorch's order. */
    assert_int_equal(qlm_store_find(s, "model.layers.0.self_attn.q_proj.weight")->rope_heads, 9);
    assert_int_equal(qlm_store_find(s, "model.layers.29.self_attn.k_proj.weight")->rope_heads, 3);
    assert_int_equal(qlm_store_find(s, "model.layers.0.self_attn.v_proj.weight")->rope_heads, 0);
    for (const cJSON *t = sums->child; t; t = t->next) {
        const qlm_tensor_entry *e = qlm_store_find(s, t->string);
        if (!e) fail_msg("tensor %s missing", t->string);
        check_real_tensor(e, t);
    }
    for (const cJSON *r = cJSON_GetObjectItemCaseSensitive(ref, "row_sums")->child; r; r = r->next)
        check_row_sums(qlm_store_find(s, r->string), r);
    qlm_store_free(s);
    cJSON_Delete(ref);
}

/* The value check reads every block's F16 scale (and Q4_1's offset): of several NaN/Inf heads in
 * a matrix big enough to be checked by threads, the error names the first, and which half. */
static void test_block_heads_checked(void **state) {
    (void)state;
    const struct { qlm_dtype dt; long bad[3]; int offset; const char *want; } cases[] = {
        {QLM_Q8_0, {30000, 20001, 39999}, 0, "the scale of block 20001 is NaN or Inf"},
        {QLM_Q4_1, {25000, 17000, 3}, 1, "the offset of block 3 is NaN or Inf"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        qlm_tensor_store *s = qlm_store_new();
        void *data = NULL;
        const int rows = 1250, cols = 1024; /* 40,000 blocks of 32 */
        qlm_tensor_entry *e = s ? qlm_store_add_owned_blocks(s, "w", cases[c].dt, 32, rows, cols, &data) : NULL;
        assert_non_null(e);
        const size_t bb = qlm_dtype_block_bytes(cases[c].dt, 32);
        memset(data, 0, e->nbytes);
        assert_int_equal(qlm_store_check_values(s), 0);
        for (int i = 0; i < 3; i++) {
            uint8_t *head = (uint8_t *)data + cases[c].bad[i] * bb + (i == 2 ? 2 * cases[c].offset : 0);
            head[0] = 0x00;
            head[1] = i ? 0x7C : 0x7E; /* Inf, or a NaN */
        }
        assert_int_equal(qlm_store_check_values(s), -1);
        if (!strstr(qlm_last_error(), cases[c].want)) fail_msg("expected \"%s\", got: %s", cases[c].want, qlm_last_error());
        qlm_store_free(s);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_types),         cmocka_unit_test(test_kv_describe),
        cmocka_unit_test(test_tiny_llama),       cmocka_unit_test(test_tiny_qwen2),
        cmocka_unit_test(test_tiny_qwen3),       cmocka_unit_test(test_hf_fixtures_as_gguf),
        cmocka_unit_test(test_tensor_describe),  cmocka_unit_test(test_unsupported_type),
        cmocka_unit_test(test_missing_and_misshaped), cmocka_unit_test(test_window_pattern_list),
        cmocka_unit_test(test_smollm2),          cmocka_unit_test(test_block_heads_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
