/* qlm tokenize: the ids and pieces of a text, to check a tokenizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/error.h"
#include "commands.h"
#include "common.h"

static const char *k_usage =
    "usage: qlm tokenize (-m MODEL | -t TOKENIZER) [--json] [--no-bos] [--no-special] [-f FILE | TEXT]\n"
    "Prints the token ids of TEXT (or FILE, '-' = stdin) with their pieces, or a JSON array with --json.\n";

static void print_json_string(const char *s) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p < 0x20) printf("\\u%04x", *p);
        else putchar(*p);
    }
    putchar('"');
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *tokenizer = NULL, *file = NULL;
    int json = 0, no_bos = 0, no_special = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"tokenizer", required_argument, 0, 't'},
                                         {"file", required_argument, 0, 'f'},  {"json", no_argument, 0, OPT_JSON},
                                         {"no-bos", no_argument, 0, OPT_NO_BOS}, {"no-special", no_argument, 0, OPT_NO_SPECIAL},
                                         {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:t:f:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 't': tokenizer = optarg; break;
        case 'f': file = optarg; break;
        case OPT_JSON: json = 1; break;
        case OPT_NO_BOS: no_bos = 1; break;
        case OPT_NO_SPECIAL: no_special = 1; break;
        case 'h': fputs(k_usage, stdout); return 0;
        default: return cli_usage_error("tokenize", k_usage);
        }
    }
    if ((!model && !tokenizer) || (file && optind != argc) || (!file && argc - optind != 1)) {
        fprintf(stderr, "qlm tokenize: give a model or tokenizer and exactly one TEXT (or -f FILE)\n");
        return cli_usage_error("tokenize", k_usage);
    }
    char *text = file ? cli_read_text(file, NULL) : strdup(argv[optind]);
    if (!text) return cli_fail("tokenize");
    qlm_source src = {0};
    qlm_tokenizer *tok = NULL;
    int rc = 1, *ids = NULL, n = 0;
    struct stat st;
    /* A model folder's own tokenizer needs no weights (e.g. a folder of tokenizer files only). */
    if (model && !tokenizer && stat(model, &st) == 0 && S_ISDIR(st.st_mode) && (tok = qlm_tokenizer_open(model, 0))) {
        src.tok = tok;
    } else if (model) {
        if (qlm_source_open(&src, model, tokenizer) != 0) goto out;
        tok = src.tok;
        if (!tok) {
            qlm_errorf("%s: no tokenizer found beside the model; give one with -t", model);
            goto out;
        }
    } else {
        tok = qlm_tokenizer_open(tokenizer, 0);
        if (!tok) goto out;
    }
    if (qlm_tokenizer_encode(tok, text, strlen(text), !no_bos, !no_special, &ids, &n) != 0) goto out;
    if (json) {
        printf("[");
        for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
        printf("]\n");
    } else {
        for (int i = 0; i < n; i++) {
            printf("%6d  ", ids[i]);
            print_json_string(qlm_tokenizer_token(tok, ids[i]));
            putchar('\n');
        }
        fprintf(stderr, "%d tokens\n", n);
    }
    rc = 0;
out:
    if (rc) cli_fail("tokenize");
    free(ids);
    free(text);
    if (model) qlm_source_close(&src);
    else if (tok) qlm_tokenizer_free(tok);
    return rc;
}
