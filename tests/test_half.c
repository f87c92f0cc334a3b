/* F16 / BF16 conversions: scalar functions against numpy / torch bit patterns
 * (tests/fixtures/quant, made by tools/make_quant_fixtures.py) and hand-picked cases
 * (ties, subnormals, overflow, Inf, NaN); every SIMD path of the bulk conversions against
 * the scalar functions, bit for bit. */
#include <math.h>

#include "test_util.h"

#include "quant/half.h"
#include "quant/matmul.h"

#define F16_TABLE "tests/fixtures/quant/f16_to_f32.bin"
#define F32_CASES "tests/fixtures/quant/f32_cases.txt"

static const char *const k_isas[] = {"scalar", "avx2", "avxvnni", "avx512", "avx512vnni", "avx512bf16", "amx"};

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int f16_is_nan(uint16_t h) {
    return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}

/* Forces isa; returns 0 when this CPU cannot run it (the caller skips it). */
static int use_isa(const char *isa) {
    if (qlm_matmul_force_isa(isa) == 0) return 1;
    print_message("isa %s not supported here, skipped\n", isa);
    return 0;
}

typedef struct {
    uint32_t *f32;
    uint16_t *f16, *bf16;
    int n;
} cases;

static void load_cases(cases *c) {
    FILE *f = fopen(F32_CASES, "r");
    assert_non_null(f);
    int cap = 8192;
    c->f32 = malloc(cap * sizeof(uint32_t));
    c->f16 = malloc(cap * sizeof(uint16_t));
    c->bf16 = malloc(cap * sizeof(uint16_t));
    assert_true(c->f32 && c->f16 && c->bf16);
    c->n = 0;
    char line[128];
    while (fgets(line, sizeof line, f)) {
        unsigned a, h, b;
        if (line[0] == '#') continue;
        assert_int_equal(sscanf(line, "%x %x %x", &a, &h, &b), 3);
        assert_true(c->n < cap);
        c->f32[c->n] = a;
        c->f16[c->n] = (uint16_t)h;
        c->bf16[c->n] = (uint16_t)b;
        c->n++;
    }
    fclose(f);
    assert_true(c->n > 3000);
}

static void free_cases(cases *c) {
    free(c->f32);
    free(c->f16);
    free(c->bf16);
}

static void test_f16_to_f32_known(void **state) {
    (void)state;
    assert_true(qlm_f16_to_f32(0x3c00) == 1.0f);
    assert_true(qlm_f16_to_f32(0xc000) == -2.0f);
    assert_true(qlm_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(qlm_f16_to_f32(0x0400) == ldexpf(1, -14));
    assert_true(qlm_f16_to_f32(0x0001) == ldexpf(1, -24));
    assert_true(qlm_f16_to_f32(0x03ff) == ldexpf(1023, -24));
    assert_true(qlm_f16_to_f32(0x8001) == -ldexpf(1, -24));
    assert_int_equal(fbits(qlm_f16_to_f32(0x8000)), 0x80000000u);
    assert_int_equal(fbits(qlm_f16_to_f32(0x7c00)), 0x7f800000u);
    assert_int_equal(fbits(qlm_f16_to_f32(0xfc00)), 0xff800000u);
    /* NaNs are quieted and keep their payload, as F16C does. */
    assert_int_equal(fbits(qlm_f16_to_f32(0x7e00)), 0x7fc00000u);
    assert_int_equal(fbits(qlm_f16_to_f32(0x7c01)), 0x7fc02000u);
    assert_int_equal(fbits(qlm_f16_to_f32(0xfd55)), 0xffeaa000u);
}

static void test_f16_to_f32_all_vs_numpy(void **state) {
    (void)state;
    size_t len = 0;
    uint32_t *ref = (uint32_t *)test_read_file(F16_TABLE, &len);
    assert_non_null(ref);
    assert_int_equal(len, 65536 * 4);
    for (uint32_t h = 0; h < 65536; h++) {
        float f = qlm_f16_to_f32((uint16_t)h);
        if (f16_is_nan((uint16_t)h)) {
            assert_true(isnan(f));
            assert_int_equal(fbits(f) >> 31, h >> 15);
        } else if (fbits(f) != ref[h]) {
            fail_msg("f16 %04x: got %08x, numpy %08x", h, fbits(f), ref[h]);
        }
    }
    free(ref);
}

static void test_f32_to_f16_known(void **state) {
    (void)state;
    assert_int_equal(qlm_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(qlm_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(qlm_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(qlm_f32_to_f16(65519.996f), 0x7bff);
    assert_int_equal(qlm_f32_to_f16(65520.0f), 0x7c00); /* tie -> even is Inf */
    assert_int_equal(qlm_f32_to_f16(1e10f), 0x7c00);
    assert_int_equal(qlm_f32_to_f16(-INFINITY), 0xfc00);
    assert_int_equal(qlm_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00);     /* tie -> even, down */
    assert_int_equal(qlm_f32_to_f16(1.0f + 3 * ldexpf(1, -11)), 0x3c02); /* tie -> even, up */
    assert_int_equal(qlm_f32_to_f16(ldexpf(1, -24)), 0x0001);
    assert_int_equal(qlm_f32_to_f16(ldexpf(1, -25)), 0x0000);            /* tie -> 0 */
    assert_int_equal(qlm_f32_to_f16(ldexpf(1.5f, -24)), 0x0002);         /* tie -> even, up */
    assert_int_equal(qlm_f32_to_f16(ldexpf(2.5f, -24)), 0x0002);         /* tie -> even, down */
    assert_int_equal(qlm_f32_to_f16(ldexpf(1023.5f, -24)), 0x0400);      /* rounds up into normals */
    assert_int_equal(qlm_f32_to_f16(ldexpf(1, -14)), 0x0400);
    assert_int_equal(qlm_f32_to_f16(bitsf(0x7fc00000u)), 0x7e00);
    assert_int_equal(qlm_f32_to_f16(bitsf(0x7fa00000u)), 0x7f00); /* signalling: quieted, payload kept */
    assert_int_equal(qlm_f32_to_f16(bitsf(0xff800001u)), 0xfe00);
}

static void test_f32_to_f16_vs_numpy(void **state) {
    (void)state;
    cases c;
    load_cases(&c);
    for (int i = 0; i < c.n; i++) {
        float f = bitsf(c.f32[i]);
        uint16_t h = qlm_f32_to_f16(f);
        if (isnan(f)) {
            assert_true(f16_is_nan(h));
            assert_int_equal(h >> 15, c.f32[i] >> 31);
        } else if (h != c.f16[i]) {
            fail_msg("f32 %08x: got f16 %04x, numpy %04x", c.f32[i], h, c.f16[i]);
        }
    }
    free_cases(&c);
}

static void test_bf16_known(void **state) {
    (void)state;
    assert_int_equal(qlm_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(qlm_f32_to_bf16(bitsf(0x3f808000u)), 0x3f80); /* tie -> even, down */
    assert_int_equal(qlm_f32_to_bf16(bitsf(0x3f818000u)), 0x3f82); /* tie -> even, up */
    assert_int_equal(qlm_f32_to_bf16(bitsf(0x3f808001u)), 0x3f81);
    assert_int_equal(qlm_f32_to_bf16(bitsf(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to Inf */
    assert_int_equal(qlm_f32_to_bf16(bitsf(0x00010000u)), 0x0001); /* subnormal kept */
    assert_int_equal(qlm_f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(qlm_f32_to_bf16(bitsf(0x7f800001u)), 0x7fc0);
    assert_int_equal(fbits(qlm_bf16_to_f32(0x3f80)), 0x3f800000u);
    assert_int_equal(fbits(qlm_bf16_to_f32(0x0001)), 0x00010000u);
    assert_int_equal(fbits(qlm_bf16_to_f32(0xff80)), 0xff800000u);
    assert_true(isnan(qlm_bf16_to_f32(0x7fc1)));
}

static void test_f32_to_bf16_vs_torch(void **state) {
    (void)state;
    cases c;
    load_cases(&c);
    for (int i = 0; i < c.n; i++) {
        float f = bitsf(c.f32[i]);
        uint16_t b = qlm_f32_to_bf16(f);
        if (isnan(f)) {
            assert_true(isnan(qlm_bf16_to_f32(b)));
            assert_int_equal(b >> 15, c.f32[i] >> 31);
        } else if (b != c.bf16[i]) {
            fail_msg("f32 %08x: got bf16 %04x, torch %04x", c.f32[i], b, c.bf16[i]);
        }
        assert_int_equal(fbits(qlm_bf16_to_f32(c.bf16[i])), (uint32_t)c.bf16[i] << 16);
    }
    free_cases(&c);
}

/* Lengths that leave every possible tail after 8- and 16-wide blocks. */
static const long k_lengths[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100};

/* Every bulk conversion on every supported ISA equals the scalar function bit for bit, for all
 * 65536 half patterns and all fixture floats, at odd offsets and lengths. */
static void test_bulk_matches_scalar(void **state) {
    (void)state;
    cases c;
    load_cases(&c);
    float *all16 = malloc(65536 * sizeof(float)), *all_bf = malloc(65536 * sizeof(float));
    uint16_t *pat = malloc(65536 * sizeof(uint16_t)), *h = malloc(c.n * sizeof(uint16_t));
    float *f = malloc(65536 * sizeof(float)), *src = malloc(c.n * sizeof(float));
    assert_true(all16 && all_bf && pat && h && f && src);
    memcpy(src, c.f32, c.n * sizeof(float));
    for (uint32_t i = 0; i < 65536; i++) pat[i] = (uint16_t)i;
    const char *orig = qlm_matmul_isa();
    for (size_t ii = 0; ii < sizeof k_isas / sizeof k_isas[0]; ii++) {
        if (!use_isa(k_isas[ii])) continue;
        qlm_f16_to_f32_n(all16, pat, 65536);
        qlm_bf16_to_f32_n(all_bf, pat, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            assert_int_equal(fbits(all16[i]), fbits(qlm_f16_to_f32((uint16_t)i)));
            assert_int_equal(fbits(all_bf[i]), i << 16);
        }
        qlm_f32_to_f16_n(h, src, c.n);
        for (int i = 0; i < c.n; i++) assert_int_equal(h[i], qlm_f32_to_f16(src[i]));
        qlm_f32_to_bf16_n(h, src, c.n);
        for (int i = 0; i < c.n; i++) assert_int_equal(h[i], qlm_f32_to_bf16(src[i]));
        for (size_t li = 0; li < sizeof k_lengths / sizeof k_lengths[0]; li++) {
            long len = k_lengths[li];
            /* Sentinels after the end must survive: the tails may not write past n. */
            h[len] = 0xabcd;
            qlm_f32_to_f16_n(h, src + 3, len);
            for (long i = 0; i < len; i++) assert_int_equal(h[i], qlm_f32_to_f16(src[3 + i]));
            assert_int_equal(h[len], 0xabcd);
            qlm_f32_to_bf16_n(h, src + 5, len);
            for (long i = 0; i < len; i++) assert_int_equal(h[i], qlm_f32_to_bf16(src[5 + i]));
            assert_int_equal(h[len], 0xabcd);
            f[len] = 42.0f;
            qlm_f16_to_f32_n(f, pat + 0x3bf1, len);
            for (long i = 0; i < len; i++) assert_true(f[i] == qlm_f16_to_f32(pat[0x3bf1 + i]));
            qlm_bf16_to_f32_n(f, pat + 0x3f71, len);
            for (long i = 0; i < len; i++) assert_true(f[i] == qlm_bf16_to_f32(pat[0x3f71 + i]));
            assert_true(f[len] == 42.0f);
        }
    }
    assert_int_equal(qlm_matmul_force_isa(orig), 0);
    free(all16);
    free(all_bf);
    free(pat);
    free(h);
    free(f);
    free(src);
    free_cases(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_to_f32_known),   cmocka_unit_test(test_f16_to_f32_all_vs_numpy),
        cmocka_unit_test(test_f32_to_f16_known),   cmocka_unit_test(test_f32_to_f16_vs_numpy),
        cmocka_unit_test(test_bf16_known),         cmocka_unit_test(test_f32_to_bf16_vs_torch),
        cmocka_unit_test(test_bulk_matches_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
