/* qlm perplexity: mean NLL (nats/token) and perplexity of a text file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../runtime/perplexity.h"
#include "commands.h"
#include "common.h"
#include "progress.h"

static const char *k_usage =
    "usage: qlm perplexity -m MODEL -f TEXTFILE [options]\n"
    "Splits the text into documents at a separator (default '<|endoftext|>'), drops the whitespace that\n"
    "starts each document, encodes it with BOS, scores every token after BOS from a fresh context (in\n"
    "windows of the context size for long documents), and prints the mean negative log-likelihood in\n"
    "nats/token and the perplexity.\n\n" CLI_MODEL_HELP
    "  -f, --file PATH        the text ('-' = stdin)\n"
    "      --split STR        document separator (default '<|endoftext|>'; '' = whole file is one document)\n"
    "      --json             print the result as JSON\n"
    "      --quiet            no load line on stderr\n";

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

int cmd_perplexity(int argc, char **argv) {
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    const char *file = NULL, *split = "<|endoftext|>";
    int json = 0, quiet = 0;
    static const struct option opts[] = {CLI_MODEL_OPTIONS, {"file", required_argument, 0, 'f'},
                                         {"split", required_argument, 0, OPT_STOP}, {"json", no_argument, 0, OPT_JSON},
                                         {"quiet", no_argument, 0, OPT_QUIET}, {0, 0, 0, 0}};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:t:f:c:h", opts, NULL)) != -1) {
        int r = cli_model_flag(&mo, c, optarg);
        if (r < 0) return 2;
        if (r > 0) continue;
        switch (c) {
        case OPT_HELP: fputs(k_usage, stdout); return 0;
        case 'f': file = optarg; break;
        case OPT_STOP: split = optarg; break;
        case OPT_JSON: json = 1; break;
        case OPT_QUIET: quiet = 1; break;
        default: return cli_usage_error("perplexity", k_usage);
        }
    }
    if (!mo.model || !file || optind < argc) {
        fprintf(stderr, "qlm perplexity: need -m MODEL and -f TEXTFILE\n");
        return cli_usage_error("perplexity", k_usage);
    }
    char *text = cli_read_text(file, NULL);
    if (!text) return cli_fail("perplexity");
    cli_model cm;
    if (cli_load_model(&mo, &cm, 1, quiet) != 0 || cli_require_decoder_only(&cm, "perplexity") != 0) {
        free(text);
        cli_free_model(&cm);
        return cli_fail("perplexity");
    }
    qlm_kv_state st;
    int rc = 1, n_docs = 0;
    qlm_nll acc = {0};
    if (qlm_state_init(&st, &cm.model, cli_context_size(&mo, &cm), mo.batch) != 0) goto out_nostate;
    size_t sep_len = strlen(split);
    cli_progress progress;
    cli_progress_init(&progress, quiet || json);
    for (char *doc = text; doc;) {
        char *end = sep_len ? strstr(doc, split) : NULL;
        char *next = end ? end + sep_len : NULL;
        if (!end) end = doc + strlen(doc);
        while (doc < end && is_space(*doc)) doc++;
        if (end > doc) {
            int *ids = NULL, n = 0;
            if (qlm_tokenizer_encode(cm.src.tok, doc, (size_t)(end - doc), 1, 0, &ids, &n) != 0) goto out;
            int r = qlm_score_tokens(&cm.model, &st, ids, n, &acc);
            free(ids);
            if (r != 0) goto out;
            n_docs++;
            cli_progress_update(&progress, 0, "scored %d documents, %ld tokens", n_docs, acc.n_predicted);
        }
        doc = next;
    }
    cli_progress_update(&progress, 1, "scored %d documents, %ld tokens", n_docs, acc.n_predicted);
    if (acc.n_predicted == 0) {
        qlm_errorf("%s: no tokens to score", file);
        goto out;
    }
    double nll = acc.nll_sum / acc.n_predicted;
    if (json)
        printf("{\"nll\": %.6f, \"perplexity\": %.6f, \"tokens\": %ld, \"documents\": %d, \"dtype\": \"%s\"}\n", nll,
               exp(nll), acc.n_predicted, n_docs, qlm_dtype_name(cm.model.fmt.dtype));
    else
        printf("mean NLL %.4f nats/token, perplexity %.4f (%ld tokens, %d documents, %s weights)\n", nll, exp(nll),
               acc.n_predicted, n_docs, qlm_dtype_name(cm.model.fmt.dtype));
    rc = 0;
out:
    qlm_state_free(&st, &cm.model);
out_nostate:
    if (rc) cli_fail("perplexity");
    free(text);
    cli_free_model(&cm);
    return rc;
}
