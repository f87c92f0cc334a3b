/* Damaged and lying safetensors files: every one must give an error (never a crash, hang or
 * out-of-bounds read; run under `make asan` too). Bit flips that leave a valid file (a
 * changed letter in a name) may load, but then every entry must be self-consistent. */
#include "test_util.h"

#include <math.h>
#include <unistd.h>

#include "core/error.h"
#include "loaders/safetensors.h"

static char g_dir[256], g_path[400];

static int setup(void **state) {
    (void)state;
    if (!test_tmpdir(g_dir, sizeof g_dir)) return -1;
    snprintf(g_path, sizeof g_path, "%s/t.safetensors", g_dir);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    unlink(g_path);
    rmdir(g_dir);
    return 0;
}

/* Writes the 8-byte length field (which may lie), the header bytes and the data. */
static void write_parts(uint64_t hlen, const char *header, size_t header_bytes, const void *data, size_t data_len) {
    FILE *f = fopen(g_path, "wb");
    assert_non_null(f);
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(hlen >> (8 * i));
    assert_int_equal(fwrite(len, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, header_bytes, f), header_bytes);
    if (data_len) assert_int_equal(fwrite(data, 1, data_len, f), data_len);
    assert_int_equal(fclose(f), 0);
}

static void write_st(const char *header, const void *data, size_t data_len) {
    write_parts(strlen(header), header, strlen(header), data, data_len);
}

/* Loads g_path; on success checks every entry the way a consumer would read it. Returns the rc. */
static int try_load(void) {
    qlm_tensor_store *s = qlm_store_new();
    assert_non_null(s);
    qlm_clear_error();
    int rc = qlm_safetensors_load(g_path, s);
    if (rc == 0) {
        for (int i = 0; i < qlm_store_count(s); i++) {
            const qlm_tensor_entry *e = qlm_store_at(s, i);
            assert_true(e->dtype >= QLM_F32 && e->dtype < QLM_DTYPE_COUNT);
            assert_true(e->ndim >= 0 && e->ndim <= QLM_MAX_DIMS);
            assert_int_equal(e->nbytes, (size_t)qlm_entry_numel(e) * qlm_dtype_size(e->dtype));
            assert_int_equal((uintptr_t)e->data % qlm_dtype_size(e->dtype), 0);
            unsigned acc = 0; /* touch every byte: ASan / a fault would catch a bad range */
            for (size_t b = 0; b < e->nbytes; b++) acc += ((const uint8_t *)e->data)[b];
            if (e->row_scales)
                for (int64_t r = 0; r < e->shape[0]; r++) assert_true(isfinite(e->row_scales[r]));
            (void)acc;
        }
    } else {
        assert_true(strlen(qlm_last_error()) > 0);
    }
    qlm_store_free(s);
    return rc;
}

static void expect_error(const char *header, const void *data, size_t data_len, const char *needle) {
    write_st(header, data, data_len);
    if (try_load() == 0) fail_msg("accepted: %s", header);
    if (needle && !strstr(qlm_last_error(), needle))
        fail_msg("error \"%s\" does not mention \"%s\" (header %s)", qlm_last_error(), needle, header);
}

static void test_truncations(void **state) {
    (void)state;
    size_t len = 0;
    char *buf = test_read_file("tests/fixtures/safetensors/mixed.safetensors", &len);
    assert_non_null(buf);
    for (size_t cut = 0; cut < len; cut++) {
        assert_int_equal(test_write_file(g_path, buf, cut), 0);
        if (try_load() == 0) fail_msg("mixed.safetensors cut to %zu bytes was accepted", cut);
    }
    /* A file with trailing bytes after the last tensor is as wrong as a short one. */
    char *longer = malloc(len + 3);
    assert_non_null(longer);
    memcpy(longer, buf, len);
    memcpy(longer + len, "abc", 3);
    assert_int_equal(test_write_file(g_path, longer, len + 3), 0);
    assert_int_not_equal(try_load(), 0);
    free(longer);
    free(buf);

    buf = test_read_file("tests/fixtures/llama/gqa_tied/model.safetensors", &len);
    assert_non_null(buf);
    for (int k = 0; k < 400; k++) {
        size_t cut = k < 200 ? (size_t)k * 13 : len - 1 - (size_t)(k - 200) * (len / 200);
        assert_int_equal(test_write_file(g_path, buf, cut), 0);
        if (try_load() == 0) fail_msg("gqa_tied cut to %zu bytes was accepted", cut);
    }
    free(buf);
}

static void test_bit_flips(void **state) {
    (void)state;
    size_t len = 0;
    uint8_t *buf = (uint8_t *)test_read_file("tests/fixtures/safetensors/mixed.safetensors", &len);
    assert_non_null(buf);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    int loaded = 0, failed = 0;
    for (size_t pos = 0; pos < 8 + hlen; pos++)
        for (int bit = 0; bit < 8; bit++) {
            buf[pos] ^= (uint8_t)(1u << bit);
            assert_int_equal(test_write_file(g_path, buf, len), 0);
            int rc = try_load();
            buf[pos] ^= (uint8_t)(1u << bit);
            if (pos < 8 && rc == 0) fail_msg("header length with bit %d of byte %zu flipped was accepted", bit, pos);
            if (rc == 0) loaded++;
            else failed++;
        }
    print_message("header bit flips: %d rejected, %d still valid\n", failed, loaded);
    /* Most flips break the JSON, a number, a dtype or the layout. */
    assert_true(failed > 4 * loaded);
    free(buf);
}

static void test_header_length_lies(void **state) {
    (void)state;
    static const char header[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    static const float data[2] = {1.5f, -2.0f};
    size_t h = strlen(header);
    write_parts(h, header, h, data, sizeof data);
    assert_int_equal(try_load(), 0); /* the honest file is fine */
    const uint64_t lies[] = {0, 1, 2, 7, h - 1, h + 1, h + 8, h + 9, (uint64_t)1 << 32, (uint64_t)1 << 40,
                             100u * 1024u * 1024u + 1, (uint64_t)INT64_MAX, UINT64_MAX};
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        write_parts(lies[i], header, h, data, sizeof data);
        if (try_load() == 0) fail_msg("header length %llu accepted", (unsigned long long)lies[i]);
    }
    /* Files shorter than the length field itself. */
    for (size_t n = 0; n < 8; n++) {
        assert_int_equal(test_write_file(g_path, "\x02\0\0\0\0\0\0\0", n), 0);
        assert_int_not_equal(try_load(), 0);
    }
    write_parts(2, "{}", 2, NULL, 0);
    assert_int_equal(try_load(), 0); /* an empty but valid file */
    qlm_tensor_store *s = qlm_store_new();
    assert_int_equal(qlm_safetensors_load(g_dir, s), -1); /* a folder is not a file */
    assert_int_equal(qlm_safetensors_load("tests/fixtures/no-such.safetensors", s), -1);
    assert_non_null(strstr(qlm_last_error(), "no-such.safetensors"));
    qlm_store_free(s);
}

#define T(dtype, shape, offs) "{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":" offs "}"

static void test_offset_and_shape_lies(void **state) {
    (void)state;
    static const uint8_t data[64] = {0};
    static const struct { const char *header; size_t data_len; const char *needle; } cases[] = {
        /* offsets */
        {"{\"a\":" T("F32", "[2]", "[0,16]") "}", 16, "tensor a"},
        {"{\"a\":" T("F32", "[4]", "[0,16]") "}", 8, "tensor a"},
        {"{\"a\":" T("F32", "[2]", "[8,0]") "}", 8, "tensor a"},
        {"{\"a\":" T("F32", "[2]", "[4,12]") "}", 12, "tensor a"},
        {"{\"a\":" T("F32", "[2]", "[0,8]") ",\"b\":" T("F32", "[2]", "[4,12]") "}", 12, "tensor b"},
        {"{\"a\":" T("F32", "[2]", "[0,8]") ",\"b\":" T("F32", "[2]", "[0,8]") "}", 16, NULL},
        {"{\"a\":" T("F32", "[2]", "[0,8]") ",\"b\":" T("F32", "[2]", "[12,20]") "}", 20, "tensor b"},
        {"{\"a\":" T("F32", "[2]", "[0,8]") "}", 12, "after the last tensor"},
        {"{\"a\":" T("F32", "[2]", "[0.5,8.5]") "}", 8, "data_offsets"},
        {"{\"a\":" T("F32", "[2]", "[-8,0]") "}", 8, "data_offsets"},
        {"{\"a\":" T("F32", "[2]", "[0,8,16]") "}", 16, "data_offsets"},
        {"{\"a\":" T("F32", "[2]", "[\"0\",\"8\"]") "}", 8, "data_offsets"},
        {"{\"a\":" T("F32", "[2]", "[18446744073709551608,18446744073709551616]") "}", 8, "data_offsets"},
        {"{\"a\":" T("F32", "[2]", "[1e300,1e300]") "}", 8, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets"},
        /* shapes */
        {"{\"a\":" T("F32", "[3]", "[0,8]") "}", 8, "tensor a"},
        {"{\"a\":" T("F32", "[-2]", "[0,8]") "}", 8, "shape"},
        {"{\"a\":" T("F32", "[2.5]", "[0,8]") "}", 8, "shape"},
        {"{\"a\":" T("F32", "[1,1,1,1,2]", "[0,8]") "}", 8, "dimensions"},
        {"{\"a\":" T("F32", "[4294967296,4294967296,4294967296]", "[0,8]") "}", 8, "overflow"},
        {"{\"a\":" T("F32", "[4611686018427387904]", "[0,8]") "}", 8, "tensor a"},
        {"{\"a\":" T("F32", "[9007199254740993]", "[0,8]") "}", 8, "tensor a"},
        {"{\"a\":" T("F32", "[0,4611686018427387904]", "[0,8]") "}", 8, "tensor a"},
        {"{\"a\":" T("F32", "2", "[0,8]") "}", 8, "shape"},
        {"{\"a\":" T("F32", "[\"2\"]", "[0,8]") "}", 8, "shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "shape"},
        /* dtypes */
        {"{\"a\":" T("F64", "[1]", "[0,8]") "}", 8, "unsupported dtype F64"},
        {"{\"a\":" T("I32", "[2]", "[0,8]") "}", 8, "I32"},
        {"{\"a\":" T("f32", "[2]", "[0,8]") "}", 8, "f32"},
        {"{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype"},
        /* INT8 scales */
        {"{\"w\":" T("I8", "[2,4]", "[0,8]") "}", 8, "w_scale"},
        {"{\"w\":" T("I8", "[2,4]", "[0,8]") ",\"w_scale\":" T("F32", "[4]", "[8,24]") "}", 24, "w_scale"},
        {"{\"w\":" T("I8", "[2,4]", "[0,8]") ",\"w_scale\":" T("F32", "[2,1]", "[8,16]") "}", 16, "w_scale"},
        {"{\"w\":" T("I8", "[2,4]", "[0,8]") ",\"w_scale\":" T("F32", "[]", "[8,12]") "}", 12, "w_scale"},
        {"{\"w\":" T("I8", "[2,4]", "[0,8]") ",\"w_scale\":" T("F16", "[2]", "[8,12]") "}", 12, "F32"},
        {"{\"w\":" T("I8", "[]", "[0,1]") ",\"w_scale\":" T("F32", "[0]", "[1,1]") "}", 1, "w_scale"},
        /* JSON structure */
        {"{\"__metadata__\":{\"format\":5}}", 0, "__metadata__"},
        {"{\"__metadata__\":[\"pt\"]}", 0, "__metadata__"},
        {"{\"a\":[1,2]}", 0, "tensor a"},
        {"{\"a\":" T("F32", "[2]", "[0,8]") "} x", 8, "after"},
        {"[{\"a\":1}]", 0, NULL},
        {" {}", 0, NULL},
        {"{\"a\":" T("F32", "[2]", "[0,8]"), 8, "JSON"},
        {"{\"a\":" T("F32", "[2]", "[0,8]") ",\"a\":" T("F32", "[2]", "[8,16]") "}", 16, "twice"},
        {"{\"a\":" T("F32", "[2]", "[0,8]") ",\"x\":}", 8, "JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_error(cases[i].header, data, cases[i].data_len, cases[i].needle);

    /* A NUL inside the header, and a non-finite scale. */
    static const char nul_header[] = "{\"a\":" T("F32", "[2]", "[0,8]") "}\0  ";
    write_parts(sizeof nul_header - 1, nul_header, sizeof nul_header - 1, data, 8);
    assert_int_not_equal(try_load(), 0);
    const float nan_scale = NAN;
    uint8_t w[8] = {1, 2, 3, 4};
    memcpy(w + 4, &nan_scale, 4);
    expect_error("{\"w\":" T("I8", "[1,4]", "[0,4]") ",\"w_scale\":" T("F32", "[1]", "[4,8]") "}", w, 8, "not finite");
}

/* A header length that leaves the data section misaligned is legal; typed data must still
 * come back aligned (copied) with the right values. */
static void test_unaligned_data(void **state) {
    (void)state;
    char header[256];
    snprintf(header, sizeof header,
             "{\"f\":" T("F32", "[3]", "[0,12]") ",\"h\":" T("BF16", "[1]", "[12,14]") ",\"w\":" T("I8", "[2,2]", "[14,18]")
             ",\"w_scale\":" T("F32", "[2]", "[18,26]") "}");
    size_t h = strlen(header);
    while (h % 4 != 1) header[h++] = ' ';
    header[h] = 0;
    uint8_t data[26];
    const float f[3] = {1.25f, -3.5f, 1e-30f}, sc[2] = {0.5f, 0.0625f};
    memcpy(data, f, 12);
    data[12] = 0x80;
    data[13] = 0x3F;
    const int8_t q[4] = {-128, 127, 3, -4};
    memcpy(data + 14, q, 4);
    memcpy(data + 18, sc, 8);
    write_st(header, data, sizeof data);
    qlm_tensor_store *s = qlm_store_new();
    if (qlm_safetensors_load(g_path, s) != 0) fail_msg("%s", qlm_last_error());
    const qlm_tensor_entry *e = qlm_store_find(s, "f");
    assert_int_equal((uintptr_t)e->data % 4, 0);
    assert_memory_equal(e->data, f, 12);
    e = qlm_store_find(s, "h");
    assert_int_equal((uintptr_t)e->data % 2, 0);
    assert_int_equal(*(const uint16_t *)e->data, 0x3F80);
    e = qlm_store_find(s, "w");
    assert_memory_equal(e->data, q, 4);
    assert_non_null(e->row_scales);
    assert_int_equal((uintptr_t)e->row_scales % 4, 0);
    assert_true(e->row_scales[0] == 0.5f && e->row_scales[1] == 0.0625f);
    assert_int_equal(qlm_store_count(s), 3);
    qlm_store_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_bit_flips),
        cmocka_unit_test(test_header_length_lies),
        cmocka_unit_test(test_offset_and_shape_lies),
        cmocka_unit_test(test_unaligned_data),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
