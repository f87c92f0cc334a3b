/* Shared helpers for the cmocka test programs: where the assets and fixtures are,
 * and the rule that a missing asset skips a test unless QLM_REQUIRE_ASSETS=1. */
#ifndef QLM_TEST_UTIL_H
#define QLM_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include <cmocka.h>

#include "../core/backend.h"
#include "../core/clock.h"
#include "../core/error.h"

/* The backend the model tests run on: $QLM_TEST_DEVICE (cpu unless set; `make test-cuda` sets
 * cuda). A device asked for but absent fails the test rather than quietly testing the CPU. */
static inline const qlm_backend *test_backend(void) {
    const char *dev = getenv("QLM_TEST_DEVICE");
    const qlm_backend *be = qlm_backend_by_name(dev && *dev ? dev : "cpu");
    if (!be) fail_msg("QLM_TEST_DEVICE=%s: %s", dev, qlm_last_error());
    return be;
}

/* ../shared/assets relative to the repository root (tests run from the root), or $QLM_ASSETS. */
static inline const char *test_assets_dir(void) {
    const char *env = getenv("QLM_ASSETS");
    return env && *env ? env : "../shared/assets";
}

/* Writes "<assets>/<rel>" into buf and returns buf. */
static inline const char *test_asset(char *buf, size_t cap, const char *rel) {
    snprintf(buf, cap, "%s/%s", test_assets_dir(), rel);
    return buf;
}

static inline int test_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Skips the current test when path is missing, or fails it when QLM_REQUIRE_ASSETS=1. */
#define REQUIRE_ASSET(path)                                                                  \
    do {                                                                                     \
        if (!test_path_exists(path)) {                                                       \
            const char *req_ = getenv("QLM_REQUIRE_ASSETS");                                 \
            if (req_ && strcmp(req_, "1") == 0) fail_msg("required asset missing: %s", path); \
            print_message("asset missing, skipping: %s\n", path);                            \
            skip();                                                                          \
        }                                                                                    \
    } while (0)

/* NAME in qlm's cache folder ($QLM_CACHE, default ~/.cache/qlm), where scripts/setup.sh puts what it fetches. */
static inline const char *test_cache_path(char *buf, size_t cap, const char *name) {
    const char *cache = getenv("QLM_CACHE");
    const char *home = getenv("HOME");
    if (cache && *cache)
        snprintf(buf, cap, "%s/%s", cache, name);
    else
        snprintf(buf, cap, "%s/.cache/qlm/%s", home ? home : ".", name);
    return buf;
}

/* The default model (SmolLM2-135M-Instruct GGUF) fetched by scripts/setup.sh. */
static inline const char *test_default_gguf(char *buf, size_t cap) {
    const char *env = getenv("QLM_DEFAULT_MODEL");
    if (env && *env) {
        snprintf(buf, cap, "%s", env);
        return buf;
    }
    return test_cache_path(buf, cap, "SmolLM2-135M-Instruct.Q4_1.gguf");
}

/* Reads a whole file; returns malloc'd bytes (NUL-terminated) or NULL. */
static inline char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len) *len = (size_t)n;
    }
    return buf;
}

/* Writes bytes to a file; returns 0 on success. */
static inline int test_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    fclose(f);
    return w == len ? 0 : -1;
}

/* The unsigned 64-bit little-endian integer at p (a safetensors file's header length). */
static inline uint64_t test_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* A copy at `to` of the safetensors file at `from` whose tensor data start `at` bytes past a 64-byte
 * cache line: its header (less the spaces that end it) padded with spaces, as the format allows.
 * Returns 0 on success. */
static inline int test_safetensors_repad(const char *from, const char *to, int at) {
    size_t len;
    unsigned char *d = (unsigned char *)test_read_file(from, &len);
    if (!d || len < 8 || test_le64(d) > len - 8) {
        free(d);
        return -1;
    }
    const uint64_t n = test_le64(d);
    size_t json = (size_t)n;
    while (json > 0 && d[8 + json - 1] == ' ') json--;
    const size_t pad = ((size_t)at + 128 - (8 + json) % 64) % 64, head = json + pad, rest = len - 8 - (size_t)n;
    unsigned char *out = malloc(8 + head + rest);
    if (out) {
        for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)head >> (8 * i));
        memcpy(out + 8, d + 8, json);
        memset(out + 8 + json, ' ', pad);
        memcpy(out + 8 + head, d + 8 + n, rest);
    }
    int rc = out ? test_write_file(to, out, 8 + head + rest) : -1;
    free(out);
    free(d);
    return rc;
}

/* A fresh temporary directory (mkdtemp under $TMPDIR or /tmp); path written into buf. */
static inline const char *test_tmpdir(char *buf, size_t cap) {
    const char *t = getenv("TMPDIR");
    snprintf(buf, cap, "%s/qlm-test-XXXXXX", t && *t ? t : "/tmp");
    return mkdtemp(buf);
}

/* The lines of a text file (each ending in '\n'), in one buffer. */
typedef struct {
    char *data;
    const char **line;
    size_t *len;
    int n;
} test_corpus;

static inline test_corpus test_corpus_load(const char *path) {
    test_corpus c = {0};
    size_t size = 0;
    c.data = test_read_file(path, &size);
    assert_non_null(c.data);
    for (size_t i = 0; i < size; i++) c.n += c.data[i] == '\n';
    c.line = malloc(sizeof(char *) * (size_t)(c.n ? c.n : 1));
    c.len = malloc(sizeof(size_t) * (size_t)(c.n ? c.n : 1));
    assert_true(c.line && c.len);
    size_t start = 0;
    for (int k = 0; k < c.n; k++) {
        const char *nl = memchr(c.data + start, '\n', size - start);
        c.line[k] = c.data + start;
        c.len[k] = (size_t)(nl - (c.data + start));
        start += c.len[k] + 1;
    }
    return c;
}

static inline void test_corpus_free(test_corpus *c) {
    free(c->data);
    free(c->line);
    free(c->len);
}

/* "\n".join(lines[i:i+n]), malloc'd. */
static inline char *test_corpus_text(const test_corpus *c, int i, int n, size_t *len) {
    size_t total = 1;
    for (int k = i; k < i + n; k++) total += c->len[k] + 1;
    char *s = malloc(total), *p = s;
    assert_non_null(s);
    for (int k = i; k < i + n; k++) {
        if (k > i) *p++ = '\n';
        memcpy(p, c->line[k], c->len[k]);
        p += c->len[k];
    }
    *p = 0;
    *len = (size_t)(p - s);
    return s;
}

/* Runs cmd through the shell; returns its exit status and, when out is not NULL, its captured
 * stdout (malloc'd). */
static inline int test_run_shell(char **out, const char *cmd) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap);
    assert_non_null(buf);
    while ((r = fread(buf + n, 1, cap - n - 1, p)) > 0)
        if ((n += r) + 1 >= cap) {
            buf = realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
    buf[n] = 0;
    int status = pclose(p);
    if (out) *out = buf;
    else free(buf);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Runs "$QLM_BIN ARGS" (default build/qlm) through the shell; returns its exit status and, when
 * out is not NULL, its captured stdout (malloc'd). */
static inline int test_run_qlm(char **out, const char *fmt, ...) {
    const char *bin = getenv("QLM_BIN");
    char args[4096], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s", bin && *bin ? bin : "build/qlm", args);
    return test_run_shell(out, cmd);
}

/* Removes a test's temporary directory and everything in it: 0 on success. */
static inline int test_remove_tree(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

#endif
