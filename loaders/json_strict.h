/* JSON from outside (HTTP bodies, dataset lines) held to what RFC 8259 asks of a sender, so that
 * what cJSON hands back is exactly what was sent: cJSON itself ends a string at "\u0000" (its strings
 * are NUL-terminated), ignores bytes after the value and keeps only the first of repeated keys. */
#ifndef QLM_JSON_STRICT_H
#define QLM_JSON_STRICT_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* The backslash of the first "\u0000" escape in s[0..n) (escaped backslashes understood), or NULL. */
const char *qlm_json_find_nul_escape(const char *s, size_t n);

/* Parses s[0..n): valid UTF-8 without NUL bytes or "\u0000", one value with only whitespace after
 * it, no object with a key twice. NULL with the reason (and byte offset or key) as the error. */
cJSON *qlm_json_parse_strict(const char *s, size_t n);

#endif
