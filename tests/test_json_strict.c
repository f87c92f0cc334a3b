/* loaders/json_strict.c: what cJSON alone would accept and silently change (a string cut at
 * "\u0000", bytes after the value, a repeated key of which only the first counts) is refused with
 * the place named; escaped backslashes, whitespace after the value and the same key in different
 * objects are accepted; an object of 100,000 keys is checked in well under a second. */
#include <time.h>

#include "../core/error.h"
#include "../loaders/json_strict.h"
#include "test_util.h"

static void expect_refused(const char *text, size_t n, const char *mention) {
    cJSON *j = qlm_json_parse_strict(text, n);
    if (j) fail_msg("accepted: %.80s", text);
    if (!strstr(qlm_last_error(), mention)) fail_msg("'%s' does not mention '%s'", qlm_last_error(), mention);
}

static void expect_accepted(const char *text) {
    cJSON *j = qlm_json_parse_strict(text, strlen(text));
    if (!j) fail_msg("refused %s: %s", text, qlm_last_error());
    cJSON_Delete(j);
}

static void test_nul_escape_scan(void **state) {
    (void)state;
    const char *s = "{\"a\":\"x\\u0000\"}";
    assert_ptr_equal(qlm_json_find_nul_escape(s, strlen(s)), s + 7);
    s = "{\"a\":\"x\\\\u0000\"}"; /* a backslash, then the text u0000 */
    assert_null(qlm_json_find_nul_escape(s, strlen(s)));
    s = "\"\\\\\\u0000\""; /* an escaped backslash, then an escaped NUL */
    assert_ptr_equal(qlm_json_find_nul_escape(s, strlen(s)), s + 3);
    s = "\"\\u000";
    assert_null(qlm_json_find_nul_escape(s, strlen(s)));
    s = "\"\\u0000\"";
    assert_null(qlm_json_find_nul_escape(s, 6)); /* the escape runs past n */
    assert_non_null(qlm_json_find_nul_escape(s, 7));
    s = "\"\\u00001\"";
    assert_non_null(qlm_json_find_nul_escape(s, strlen(s)));
}

static void test_refused(void **state) {
    (void)state;
    expect_refused("{\"p\":\"a\\u0000b\"}", 16, "\\u0000 (byte 7)");
    expect_refused("{\"p\\u0000\":1}", 13, "\\u0000");
    expect_refused("{\"p\":\"a\0b\"}", 11, "a NUL byte at byte 7");
    expect_refused("{\"p\":\"\xc3\x28\"}", 10, "not valid UTF-8");
    expect_refused("{\"p\":1} x", 9, "bytes after the JSON value (from byte 8)");
    expect_refused("{\"p\":1}{}", 9, "bytes after the JSON value (from byte 7)");
    expect_refused("{\"p\":1,\"p\":2}", 13, "the key \"p\" appears twice");
    expect_refused("{\"m\":[{\"r\":1},{\"r\":1,\"c\":2,\"r\":3}]}", 35, "the key \"r\" appears twice");
    expect_refused("{\"p\":", 5, "invalid JSON at byte");
    expect_refused("", 0, "invalid JSON");
}

static void test_accepted(void **state) {
    (void)state;
    expect_accepted("{\"p\":\"a\\\\u0000\"}");
    expect_accepted(" {\"p\":1}\r\n\t ");
    expect_accepted("{\"a\":{\"k\":1},\"b\":{\"k\":2},\"k\":[{\"k\":3},{\"k\":4}]}");
    expect_accepted("[1,2,3]");
    expect_accepted("\"caf\xc3\xa9\"");
    cJSON *j = qlm_json_parse_strict("{\"p\":1}trailing", 7); /* n ends the text */
    assert_non_null(j);
    cJSON_Delete(j);
}

static void test_many_keys(void **state) {
    (void)state;
    enum { KEYS = 100000 };
    char *text = malloc((size_t)KEYS * 16 + 16);
    assert_non_null(text);
    for (int dup = 0; dup < 2; dup++) {
        size_t n = 0;
        text[n++] = '{';
        for (int i = 0; i < KEYS; i++)
            n += (size_t)sprintf(text + n, "%s\"k%d\":%d", i ? "," : "", dup && i == KEYS - 1 ? 17 : i, i);
        text[n++] = '}';
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        cJSON *j = qlm_json_parse_strict(text, n);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        print_message("%d keys%s: %.3f s\n", KEYS, dup ? " (one repeated)" : "", secs);
        if (dup) {
            assert_null(j);
            assert_non_null(strstr(qlm_last_error(), "\"k17\" appears twice"));
        } else {
            assert_non_null(j);
            cJSON_Delete(j);
        }
        assert_true(secs < 1);
    }
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nul_escape_scan),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_accepted),
        cmocka_unit_test(test_many_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
