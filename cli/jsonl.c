/* JSONL input files: every non-blank line parsed, with its line number for error messages. */
#include "jsonl.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../tokenizer/tokenizer.h"
#include "../loaders/json_strict.h"
#include "common.h"

void cli_jsonl_free(cli_jsonl *f) {
    for (int i = 0; i < f->n; i++) cJSON_Delete(f->rec[i]);
    free(f->rec);
    free(f->line);
    free(f->text);
}

/* cJSON ends a string at an escaped NUL, which would silently cut the text; a space keeps the rest
 * (to ROUGE a NUL is a separator like a space anyway), so "\u0000" becomes "\u0020" before parsing. */
static void space_nul_escapes(char *s, size_t n) {
    const char *at, *end = s + n;
    while ((at = qlm_json_find_nul_escape(s, (size_t)(end - s)))) {
        memcpy((char *)at + 2, "0020", 4);
        s = (char *)at + 6;
    }
}

int cli_jsonl_load(cli_jsonl *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->path = path;
    size_t len;
    f->text = cli_read_text(path, &len);
    if (!f->text) return -1;
    int cap = 0;
    char *p = f->text, *end = f->text + len;
    for (int line = 1; p < end; line++) {
        char *nl = memchr(p, '\n', (size_t)(end - p)), *stop = nl ? nl : end;
        size_t n = (size_t)(stop - p);
        *stop = 0;
        char *q = p;
        while (*q == ' ' || *q == '\t' || *q == '\r') q++;
        if (q < stop) {
            if (memchr(p, 0, n)) return qlm_errorf("%s:%d: line holds a NUL byte", path, line);
            if (!qlm_utf8_valid((const unsigned char *)p, n)) return qlm_errorf("%s:%d: not valid UTF-8", path, line);
            space_nul_escapes(p, n);
            const char *err = NULL;
            cJSON *rec = cJSON_ParseWithOpts(p, &err, 1);
            if (!rec) return qlm_errorf("%s:%d: invalid JSON at column %d", path, line, err ? (int)(err - p) + 1 : 1);
            if (f->n == cap) {
                cap = cap ? cap * 2 : 256;
                cJSON **r = realloc(f->rec, (size_t)cap * sizeof *r);
                if (r) f->rec = r;
                int *l = realloc(f->line, (size_t)cap * sizeof *l);
                if (l) f->line = l;
                if (!r || !l) {
                    cJSON_Delete(rec);
                    return qlm_errorf("%s: out of memory", path);
                }
            }
            f->rec[f->n] = rec;
            f->line[f->n++] = line;
            if (!cJSON_IsObject(rec)) return qlm_errorf("%s:%d: expected a JSON object", path, line);
        }
        p = stop + 1;
    }
    return 0;
}

const char *cli_jsonl_text(const cli_jsonl *f, int i, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->rec[i], name);
    if (!v) qlm_errorf("%s:%d: missing field \"%s\"", f->path, f->line[i], name);
    else if (!cJSON_IsString(v)) qlm_errorf("%s:%d: field \"%s\" is not a string", f->path, f->line[i], name);
    return v && cJSON_IsString(v) ? v->valuestring : NULL;
}
