/* Untrusted model files: truncated, bit-flipped and size-lying GGUF and llama2.c files must
 * give an error (or, for flips inside tensor data, load harmlessly) and never crash, hang,
 * over-allocate or read out of bounds (run under ASan by `make asan`). */
#include "test_util.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <unistd.h>

#include "../core/error.h"
#include "../loaders/gguf.h"
#include "../loaders/llama2c.h"

#define QWEN2 "tests/fixtures/gguf/tiny_qwen2.gguf"
#define LLAMA "tests/fixtures/gguf/tiny_llama.gguf"

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    return test_tmpdir(g_dir, sizeof g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return rmdir(g_dir);
}

static const char *tmp_path(const char *name) {
    static char buf[320];
    snprintf(buf, sizeof buf, "%s/%s", g_dir, name);
    return buf;
}

/* ---------- GGUF ---------- */

/* Every stage a model load goes through, plus the `qlm info` and tokenizer accessors. */
static int gguf_pipeline(const char *path) {
    qlm_gguf *g = qlm_gguf_open(path);
    if (!g) return -1;
    for (int i = 0; i < qlm_gguf_n_kv(g); i++) {
        const char *key;
        char value[64];
        assert_int_equal(qlm_gguf_kv_describe(g, i, &key, value, sizeof value), 0);
    }
    for (int i = 0; i < qlm_gguf_n_tensors(g); i++) {
        const char *name, *type;
        int nd;
        long long dims[4];
        assert_int_equal(qlm_gguf_tensor_describe(g, i, &name, &type, &nd, dims), 0);
    }
    const char *const *tokens;
    int n;
    qlm_gguf_get_str_array(g, "tokenizer.ggml.tokens", &tokens, &n);
    qlm_llama_config c;
    int rc = qlm_gguf_llama_config(g, &c);
    if (rc == 0) {
        qlm_tensor_store *s = qlm_store_new();
        rc = qlm_gguf_load_tensors(g, &c, s);
        qlm_store_free(s);
    }
    qlm_gguf_close(g);
    return rc;
}

/* data_offset / data_end of a fixture as gguf-py measured them. */
static void fixture_layout(const char *json_path, size_t *data_offset, size_t *data_end) {
    char *text = test_read_file(json_path, NULL);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    *data_offset = (size_t)cJSON_GetObjectItemCaseSensitive(j, "data_offset")->valuedouble;
    *data_end = (size_t)cJSON_GetObjectItemCaseSensitive(j, "data_end")->valuedouble;
    cJSON_Delete(j);
}

static void test_gguf_truncated(void **state) {
    (void)state;
    size_t len = 0, hdr, end;
    char *data = test_read_file(QWEN2, &len);
    assert_non_null(data);
    fixture_layout("tests/fixtures/gguf/tiny_qwen2.json", &hdr, &end);
    assert_int_equal(end, len);
    assert_int_equal(gguf_pipeline(QWEN2), 0);
    const char *path = tmp_path("trunc.gguf");
    for (size_t cut = 0; cut < len; cut += cut < hdr + 64 ? 1 : 97) {
        assert_int_equal(test_write_file(path, data, cut), 0);
        if (gguf_pipeline(path) == 0) fail_msg("truncated at %zu of %zu bytes, but it loaded", cut, len);
    }
    remove(path);
    free(data);
}

/* Flips one bit per byte in place (pwrite), runs the pipeline, restores the byte. */
static void flip_run(int fd, const char *path, const char *orig, size_t off, int bit, int must_load) {
    char b = (char)(orig[off] ^ (1 << bit));
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    int rc = gguf_pipeline(path);
    if (must_load && rc != 0) fail_msg("flip in tensor data at %zu failed to load: %s", off, qlm_last_error());
    assert_int_equal(pwrite(fd, orig + off, 1, (off_t)off), 1);
}

static void flip_file(const char *fixture, const char *json, size_t header_stride) {
    size_t len = 0, hdr, end;
    char *data = test_read_file(fixture, &len);
    assert_non_null(data);
    fixture_layout(json, &hdr, &end);
    const char *path = tmp_path("flip.gguf");
    assert_int_equal(test_write_file(path, data, len), 0);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    for (size_t off = 0; off < 24; off++)
        for (int bit = 0; bit < 8; bit++) flip_run(fd, path, data, off, bit, 0);
    for (size_t off = 24; off < hdr; off += header_stride) flip_run(fd, path, data, off, (int)(off % 8), 0);
    for (size_t off = hdr; off < end; off += 61) flip_run(fd, path, data, off, (int)(off % 8), 1);
    close(fd);
    remove(path);
    free(data);
}

static void test_gguf_bit_flips(void **state) {
    (void)state;
    flip_file(QWEN2, "tests/fixtures/gguf/tiny_qwen2.json", 1);
    flip_file(LLAMA, "tests/fixtures/gguf/tiny_llama.json", 5);
}

/* A hand-built GGUF in memory. */
typedef struct {
    uint8_t buf[4096];
    size_t len;
} gbuf;

static void put(gbuf *b, const void *p, size_t n) {
    assert_true(b->len + n <= sizeof b->buf);
    memcpy(b->buf + b->len, p, n);
    b->len += n;
}

static void put_u32(gbuf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(gbuf *b, uint64_t v) { put(b, &v, 8); }

static void put_str(gbuf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void begin(gbuf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b->len = 0;
    put(b, "GGUF", 4);
    put_u32(b, version);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}

enum { U8 = 0, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STR = 8, ARR = 9, U64 = 10 };

static void kv_u32(gbuf *b, const char *key, uint32_t v) {
    put_str(b, key);
    put_u32(b, U32);
    put_u32(b, v);
}

static void kv_str(gbuf *b, const char *key, const char *v) {
    put_str(b, key);
    put_u32(b, STR);
    put_str(b, v);
}

static void tensor_info(gbuf *b, const char *name, uint32_t ndim, const uint64_t *ne, uint32_t type, uint64_t off) {
    put_str(b, name);
    put_u32(b, ndim);
    for (uint32_t d = 0; d < ndim; d++) put_u64(b, ne[d]);
    put_u32(b, type);
    put_u64(b, off);
}

/* Pads to 32 and appends n zero bytes of tensor data. */
static void data(gbuf *b, size_t n) {
    static const uint8_t zero[1024];
    put(b, zero, (32 - b->len % 32) % 32);
    put(b, zero, n);
}

static void expect_open_error(const gbuf *b, const char *what) {
    const char *path = tmp_path("lie.gguf");
    assert_int_equal(test_write_file(path, b->buf, b->len), 0);
    qlm_gguf *g = qlm_gguf_open(path);
    if (g) fail_msg("expected an error mentioning \"%s\", but the file opened", what);
    const char *msg = qlm_last_error();
    if (!strstr(msg, what) || !strstr(msg, "lie.gguf")) fail_msg("expected \"%s\", got: %s", what, msg);
    remove(path);
}

static void expect_open_ok(const gbuf *b) {
    const char *path = tmp_path("ok.gguf");
    assert_int_equal(test_write_file(path, b->buf, b->len), 0);
    qlm_gguf *g = qlm_gguf_open(path);
    if (!g) fail_msg("%s", qlm_last_error());
    qlm_gguf_close(g);
    remove(path);
}

static void test_gguf_header_lies(void **state) {
    (void)state;
    gbuf b;
    const uint64_t ne4[1] = {4};
    /* Controls: the builder makes valid files. */
    begin(&b, 3, 0, 0);
    expect_open_ok(&b);
    begin(&b, 2, 1, 1);
    kv_u32(&b, "general.alignment", 32);
    tensor_info(&b, "t", 1, ne4, 0, 0);
    data(&b, 16);
    expect_open_ok(&b);

    b.len = 0;
    put(&b, "GGUF\3\0\0\0", 8);
    expect_open_error(&b, "too short");
    begin(&b, 3, 0, 0);
    memcpy(b.buf, "GGUG", 4);
    expect_open_error(&b, "bad magic");
    begin(&b, 1, 0, 0);
    expect_open_error(&b, "version 1");
    begin(&b, 4, 0, 0);
    expect_open_error(&b, "version 4");
    begin(&b, 0x03000000u, 0, 0);
    expect_open_error(&b, "big-endian");
    begin(&b, 3, 1ull << 62, 0);
    expect_open_error(&b, "tensors, more than the file can hold");
    begin(&b, 3, 5, 0);
    tensor_info(&b, "t", 1, ne4, 0, 0);
    expect_open_error(&b, "tensors, more than the file can hold");
    begin(&b, 3, 0, 1ull << 40);
    expect_open_error(&b, "metadata entries");
    begin(&b, 3, 0, UINT64_MAX);
    expect_open_error(&b, "metadata entries");
}

static void test_gguf_metadata_lies(void **state) {
    (void)state;
    gbuf b;
    begin(&b, 3, 0, 1);
    put_u64(&b, 1ull << 63); /* key length */
    put_u32(&b, U8);
    put(&b, "xxxxxxxx", 8);
    expect_open_error(&b, "string length");
    begin(&b, 3, 0, 1);
    put_u64(&b, 0);
    put_u32(&b, U8);
    put(&b, "xxxxxxxx", 8);
    expect_open_error(&b, "empty key");
    begin(&b, 3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, STR);
    put_u64(&b, UINT64_MAX);
    expect_open_error(&b, "metadata key k: string length");
    begin(&b, 3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, STR);
    put_u64(&b, 100);
    put(&b, "short", 5);
    expect_open_error(&b, "runs past the end");
    begin(&b, 3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, ARR);
    put_u32(&b, U64);
    put_u64(&b, 1ull << 61);
    expect_open_error(&b, "cannot fit");
    begin(&b, 3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, ARR);
    put_u32(&b, STR);
    put_u64(&b, 1ull << 40);
    put_str(&b, "a");
    expect_open_error(&b, "cannot fit");
    begin(&b, 3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, ARR);
    put_u32(&b, STR);
    put_u64(&b, 2);
    put_str(&b, "a");
    put_u64(&b, 1ull << 50); /* second string's length */
    expect_open_error(&b, "element 1");
    begin(&b, 3, 0, 1);
    put_str(&b, "nested");
    put_u32(&b, ARR);
    for (int d = 0; d < 12; d++) {
        put_u32(&b, ARR);
        put_u64(&b, 1);
    }
    put_u32(&b, U8);
    put_u64(&b, 0);
    expect_open_error(&b, "nested deeper");
    begin(&b, 3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, 13);
    put_u32(&b, 0);
    expect_open_error(&b, "unknown value type 13");
    begin(&b, 3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, ARR);
    put_u32(&b, 99);
    put_u64(&b, 0);
    expect_open_error(&b, "unknown value type 99");
    begin(&b, 3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, BOOL);
    put(&b, "\2xxx", 4);
    expect_open_error(&b, "neither 0 nor 1");
    begin(&b, 3, 0, 2);
    kv_u32(&b, "dup", 1);
    kv_u32(&b, "dup", 2);
    expect_open_error(&b, "metadata key dup appears twice");
    uint32_t bad_align[] = {0, 48, 1u << 31};
    for (int i = 0; i < 3; i++) {
        begin(&b, 3, 0, 1);
        kv_u32(&b, "general.alignment", bad_align[i]);
        expect_open_error(&b, "general.alignment");
    }
    begin(&b, 3, 0, 1);
    put_str(&b, "general.alignment");
    put_u32(&b, U64);
    put_u64(&b, 32);
    expect_open_error(&b, "must be a u32");
}

static void test_gguf_tensor_lies(void **state) {
    (void)state;
    gbuf b;
    const uint64_t ne4[1] = {4}, huge3[3] = {1ull << 32, 1ull << 32, 1ull << 32}, zero[2] = {4, 0};
    const uint64_t ne33[1] = {33}, wide[2] = {1ull << 62, 1}, neg[1] = {1ull << 63}, ne5[5] = {4, 1, 1, 1, 1};
    struct { uint32_t ndim; const uint64_t *ne; uint32_t type; uint64_t off; const char *what; } cases[] = {
        {0, ne4, 0, 0, "0 dimensions"},
        {5, ne5, 0, 0, "5 dimensions"},
        {3, huge3, 0, 0, "overflow"},
        {2, zero, 0, 0, "dimension 1 = 0"},
        {1, neg, 0, 0, "dimension 0"},
        {1, ne4, 4, 0, "unknown tensor type id 4"},
        {1, ne4, 1000, 0, "unknown tensor type id 1000"},
        {1, ne33, 2, 0, "not a multiple of the Q4_0 block size 32"},
        {2, wide, 0, 0, "byte size overflows"},
        {1, ne4, 0, 32, "runs past the end of the file"},
        {1, ne4, 0, 1ull << 63, "runs past the end of the file"},
        {1, ne4, 0, 4, "not a multiple of the alignment"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        begin(&b, 3, 1, 0);
        tensor_info(&b, "t", cases[i].ndim, cases[i].ne, cases[i].type, cases[i].off);
        data(&b, 16);
        expect_open_error(&b, cases[i].what);
    }
    begin(&b, 3, 2, 0);
    tensor_info(&b, "same", 1, ne4, 0, 0);
    tensor_info(&b, "same", 1, ne4, 0, 0);
    data(&b, 16);
    expect_open_error(&b, "tensor same appears twice");
    begin(&b, 3, 1, 0);
    put_u64(&b, 300);
    for (int i = 0; i < 300; i++) put(&b, "n", 1);
    expect_open_error(&b, "exceeds the limit");
    begin(&b, 3, 1, 0);
    tensor_info(&b, "t", 1, ne4, 0, 0); /* no padding, no data */
    expect_open_error(&b, "starts past the end");
}

/* Files that open; their Llama config is read and must succeed (what == NULL) or fail naming what. */
static void expect_config(const gbuf *b, const char *what) {
    const char *path = tmp_path("cfg.gguf");
    assert_int_equal(test_write_file(path, b->buf, b->len), 0);
    qlm_gguf *g = qlm_gguf_open(path);
    if (!g) fail_msg("%s", qlm_last_error());
    qlm_llama_config c;
    int rc = qlm_gguf_llama_config(g, &c);
    if (!what && rc != 0) fail_msg("%s", qlm_last_error());
    if (what && (rc == 0 || !strstr(qlm_last_error(), what)))
        fail_msg("expected \"%s\", got: %s", what, rc == 0 ? "success" : qlm_last_error());
    qlm_gguf_close(g);
    remove(path);
}

/* A metadata-only llama header with 4 tokens and the given numbers. */
static void llama_kvs(gbuf *b, const char *arch, uint32_t dim, uint32_t layers, uint32_t heads, float theta,
                      uint32_t bos) {
    const float eps = 1e-5f;
    begin(b, 3, 0, 10);
    kv_str(b, "general.architecture", arch);
    kv_u32(b, "llama.embedding_length", dim);
    kv_u32(b, "llama.feed_forward_length", 64);
    kv_u32(b, "llama.block_count", layers);
    kv_u32(b, "llama.attention.head_count", heads);
    kv_u32(b, "llama.context_length", 128);
    put_str(b, "llama.rope.freq_base");
    put_u32(b, F32);
    put(b, &theta, 4);
    put_str(b, "llama.attention.layer_norm_rms_epsilon");
    put_u32(b, F32);
    put(b, &eps, 4);
    kv_u32(b, "tokenizer.ggml.bos_token_id", bos);
    put_str(b, "tokenizer.ggml.tokens");
    put_u32(b, ARR);
    put_u32(b, STR);
    put_u64(b, 4);
    for (int i = 0; i < 4; i++) put_str(b, "t");
}

static void test_gguf_config_lies(void **state) {
    (void)state;
    gbuf b;
    llama_kvs(&b, "llama", 32, 2, 4, 10000.0f, 1);
    expect_config(&b, NULL); /* control */
    llama_kvs(&b, "gpt2", 32, 2, 4, 10000.0f, 1);
    expect_config(&b, "architecture \"gpt2\" is not supported");
    llama_kvs(&b, "llama", 32, 0xffffffffu, 4, 10000.0f, 1);
    expect_config(&b, "llama.block_count = 4294967295 is out of range");
    llama_kvs(&b, "llama", 32, 2, 0, 10000.0f, 1);
    expect_config(&b, "llama.attention.head_count = 0");
    llama_kvs(&b, "llama", 33, 2, 4, 10000.0f, 1);
    expect_config(&b, "not a multiple of head_count");
    llama_kvs(&b, "llama", 32, 2, 4, NAN, 1);
    expect_config(&b, "freq_base");
    llama_kvs(&b, "llama", 32, 2, 4, INFINITY, 1);
    expect_config(&b, "freq_base");
    llama_kvs(&b, "llama", 32, 2, 4, 10000.0f, 4);
    expect_config(&b, "bos_token_id = 4 is outside the vocabulary");
    llama_kvs(&b, "llama", 1 << 21, 2, 4, 10000.0f, 1);
    expect_config(&b, "hidden_size");
    begin(&b, 3, 0, 1);
    put_str(&b, "general.architecture");
    put_u32(&b, U32);
    put_u32(&b, 1);
    expect_config(&b, "general.architecture is a u32, expected a string");
}

/* Loading the Qwen2 fixture with a config that lies about its sizes fails by name. */
static void test_gguf_load_with_wrong_config(void **state) {
    (void)state;
    qlm_gguf *g = qlm_gguf_open(QWEN2);
    assert_non_null(g);
    qlm_llama_config c;
    assert_int_equal(qlm_gguf_llama_config(g, &c), 0);
    qlm_llama_config lies[4] = {c, c, c, c};
    lies[0].n_layers = 2;
    lies[1].hidden_dim = 65;
    lies[2].tie_embeddings = 0;
    lies[3].vocab_size = 1 << 24;
    const char *what[4] = {"blk.1.attn_norm.weight", "shape", "output.weight", "token_embd.weight"};
    for (int i = 0; i < 4; i++) {
        qlm_tensor_store *s = qlm_store_new();
        assert_int_equal(qlm_gguf_load_tensors(g, &lies[i], s), -1);
        if (!strstr(qlm_last_error(), what[i])) fail_msg("expected \"%s\", got: %s", what[i], qlm_last_error());
        qlm_store_free(s);
    }
    qlm_gguf_close(g);
}

/* ---------- llama2.c ---------- */

static int l2c_pipeline(const char *path) {
    qlm_llama_config c;
    qlm_tensor_store *s = qlm_store_new();
    int rc = qlm_llama2c_load(path, &c, s);
    qlm_store_free(s);
    int probe = qlm_llama2c_probe(path);
    assert_int_equal(probe, rc == 0);
    return rc;
}

static void test_llama2c_truncated(void **state) {
    (void)state;
    char asset[4096];
    REQUIRE_ASSET(test_asset(asset, sizeof asset, "stories260K/stories260K.bin"));
    size_t len = 0;
    char *data = test_read_file(asset, &len);
    assert_non_null(data);
    const char *path = tmp_path("trunc.bin");
    for (size_t cut = 0; cut < len; cut += cut < 64 ? 1 : 40961) {
        assert_int_equal(test_write_file(path, data, cut), 0);
        if (l2c_pipeline(path) == 0) fail_msg("truncated at %zu but it loaded", cut);
    }
    for (size_t cut = len - 8; cut < len; cut++) {
        assert_int_equal(test_write_file(path, data, cut), 0);
        assert_int_equal(l2c_pipeline(path), -1);
    }
    data = realloc(data, len + 4);
    memset(data + len, 0, 4);
    assert_int_equal(test_write_file(path, data, len + 4), 0);
    assert_int_equal(l2c_pipeline(path), -1);
    assert_non_null(strstr(qlm_last_error(), "implies"));
    assert_int_equal(test_write_file(path, data, len), 0);
    assert_int_equal(l2c_pipeline(path), 0);
    remove(path);
    free(data);
}

static void test_llama2c_header_flips(void **state) {
    (void)state;
    char asset[4096];
    REQUIRE_ASSET(test_asset(asset, sizeof asset, "stories260K/stories260K.bin"));
    size_t len = 0;
    char *data = test_read_file(asset, &len);
    assert_non_null(data);
    const char *path = tmp_path("flip.bin");
    assert_int_equal(test_write_file(path, data, len), 0);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    for (size_t off = 0; off < 28; off++)
        for (int bit = 0; bit < 8; bit++) {
            char b = (char)(data[off] ^ (1 << bit));
            assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
            /* Any flip changes a size or makes the header inconsistent. */
            if (l2c_pipeline(path) == 0) fail_msg("header bit %d of byte %zu flipped, but it loaded", bit, off);
            assert_int_equal(pwrite(fd, data + off, 1, (off_t)off), 1);
        }
    close(fd);
    remove(path);
    free(data);
}

static void test_llama2c_header_lies(void **state) {
    (void)state;
    const int32_t cases[][7] = {
        {0, 172, 5, 8, 4, 512, 512},          {-64, 172, 5, 8, 4, 512, 512},
        {64, -1, 5, 8, 4, 512, 512},          {64, 172, 0, 8, 4, 512, 512},
        {64, 172, 5, 0, 4, 512, 512},         {64, 172, 5, 8, 0, 512, 512},
        {64, 172, 5, 8, 3, 512, 512},         {65, 172, 5, 8, 4, 512, 512},
        {64, 172, 5, 8, 16, 512, 512},        {64, 172, 5, 8, 4, INT32_MIN, 512},
        {64, 172, 5, 8, 4, 0, 512},           {64, 172, 5, 8, 4, 512, 0},
        {64, 172, INT32_MAX, 8, 4, 512, 512}, {1 << 20, 1 << 22, 4096, 256, 256, 1 << 24, 1 << 24},
        {8, 16, 1, 2, 1, -10, 4},             {INT32_MAX, INT32_MAX, INT32_MAX, 1, 1, INT32_MAX, INT32_MAX},
    };
    const char *path = tmp_path("lie.bin");
    char buf[28 + 4096] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(buf, cases[i], 28);
        assert_int_equal(test_write_file(path, buf, sizeof buf), 0);
        assert_int_equal(l2c_pipeline(path), -1);
        assert_non_null(strstr(qlm_last_error(), "lie.bin"));
    }
    assert_int_equal(test_write_file(path, buf, 10), 0);
    assert_int_equal(l2c_pipeline(path), -1);
    remove(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_truncated),       cmocka_unit_test(test_gguf_bit_flips),
        cmocka_unit_test(test_gguf_header_lies),     cmocka_unit_test(test_gguf_metadata_lies),
        cmocka_unit_test(test_gguf_tensor_lies),     cmocka_unit_test(test_gguf_config_lies),
        cmocka_unit_test(test_gguf_load_with_wrong_config), cmocka_unit_test(test_llama2c_truncated),
        cmocka_unit_test(test_llama2c_header_flips), cmocka_unit_test(test_llama2c_header_lies),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
