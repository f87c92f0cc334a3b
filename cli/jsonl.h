/* Reading JSONL files (one JSON object per line), as `qlm rouge` and `qlm summarize` take them. */
#ifndef QLM_CLI_JSONL_H
#define QLM_CLI_JSONL_H

#include <cjson/cJSON.h>

/* The non-blank lines of a JSONL file, parsed. */
typedef struct {
    const char *path;
    char *text;
    int n;
    cJSON **rec;
    int *line; /* 1-based line number of each record */
} cli_jsonl;

/* Loads path ("-" = stdin). Errors name the file and line: invalid UTF-8 or JSON, NUL bytes,
 * lines that are not objects. On failure call cli_jsonl_free too. */
int cli_jsonl_load(cli_jsonl *f, const char *path);
void cli_jsonl_free(cli_jsonl *f);
/* The string value of record i's field, or NULL with the error naming file, line and field. */
const char *cli_jsonl_text(const cli_jsonl *f, int i, const char *name);

#endif
