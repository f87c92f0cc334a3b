#include "json_strict.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../tokenizer/tokenizer.h"

const char *qlm_json_find_nul_escape(const char *s, size_t n) {
    for (size_t i = 0; i + 1 < n; i++)
        if (s[i] == '\\') {
            if (s[i + 1] == 'u' && n - i >= 6 && memcmp(s + i + 2, "0000", 4) == 0) return s + i;
            i++; /* the escaped character, so "\\" never starts an escape */
        }
    return NULL;
}

static int key_order(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first key that one object of v (at any depth) holds twice, or NULL. Sorting the keys keeps an
 * object of many keys at n log n. cJSON bounds the depth (CJSON_NESTING_LIMIT). */
static const char *repeated_key(const cJSON *v, int *oom) {
    int n = 0;
    for (const cJSON *c = v->child; c; c = c->next) {
        const char *k = repeated_key(c, oom);
        if (k || *oom) return k;
        n++;
    }
    if (!cJSON_IsObject(v) || n < 2) return NULL;
    const char **keys = malloc((size_t)n * sizeof *keys);
    if (!keys) {
        *oom = 1;
        return NULL;
    }
    int i = 0;
    for (const cJSON *c = v->child; c; c = c->next) keys[i++] = c->string;
    qsort(keys, (size_t)n, sizeof *keys, key_order);
    const char *dup = NULL;
    for (i = 1; i < n && !dup; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0) dup = keys[i];
    free(keys);
    return dup;
}

cJSON *qlm_json_parse_strict(const char *s, size_t n) {
    const char *nul = memchr(s, 0, n);
    if (nul) {
        qlm_errorf("a NUL byte at byte %zu", (size_t)(nul - s));
        return NULL;
    }
    if (!qlm_utf8_valid((const unsigned char *)s, n)) {
        qlm_errorf("not valid UTF-8");
        return NULL;
    }
    if ((nul = qlm_json_find_nul_escape(s, n))) {
        qlm_errorf("a string holds \\u0000 (byte %zu)", (size_t)(nul - s));
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    if (!root) {
        qlm_errorf("invalid JSON at byte %zu", end ? (size_t)(end - s) : (size_t)0);
        return NULL;
    }
    size_t at = (size_t)(end - s);
    while (at < n && strchr(" \t\r\n", s[at])) at++;
    if (at < n) {
        cJSON_Delete(root);
        qlm_errorf("bytes after the JSON value (from byte %zu)", at);
        return NULL;
    }
    int oom = 0;
    const char *dup = repeated_key(root, &oom);
    if (dup || oom) {
        if (oom) qlm_errorf("out of memory");
        else qlm_errorf("the key \"%.64s\" appears twice in one object", dup);
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}
