/* qlm generate: continue a prompt, streaming tokens to stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "commands.h"
#include "common.h"

static const char *k_usage =
    "usage: qlm generate -m MODEL [-t TOKENIZER] [-p PROMPT | -f FILE] [options]\n"
    "Continues PROMPT (default: empty, i.e. from BOS) and streams the text to stdout; a T5 model\n"
    "answers PROMPT instead (its encoder reads it, its decoder writes the output).\n\n" CLI_MODEL_HELP
    CLI_SAMPLING_HELP CLI_JSON_HELP CLI_LORA_HELP
    "  -p, --prompt TEXT      the prompt\n"
    "  -f, --file PATH        read the prompt from a file ('-' = stdin)\n"
    "      --no-bos           do not prepend the BOS token\n"
    "      --no-special       treat special-token text in the prompt as plain text\n"
    "      --json             print one JSON object: prompt ids, generated ids, text, stop reason\n"
    "      --quiet            no load line or timing on stderr\n" CLI_DIST_HELP;

static void print_ids(const char *key, const int *ids, int n) {
    printf("\"%s\": [", key);
    for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
    printf("]");
}

static void print_json_text(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') printf("\\n");
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

int cmd_generate(int argc, char **argv) {
    cli_model_opts mo;
    cli_sampling_opts so;
    cli_model_opts_init(&mo);
    cli_sampling_opts_init(&so);
    const char *prompt = "", *file = NULL;
    int no_bos = 0, no_special = 0, quiet = 0, json = 0;
    static const struct option opts[] = {CLI_MODEL_OPTIONS, CLI_SAMPLING_OPTIONS, CLI_JSON_OPTIONS, CLI_LORA_OPTIONS,
                                         CLI_DIST_OPTIONS,
                                         {"prompt", required_argument, 0, OPT_PROMPT},
                                         {"file", required_argument, 0, 'f'},
                                         {"no-bos", no_argument, 0, OPT_NO_BOS},
                                         {"no-special", no_argument, 0, OPT_NO_SPECIAL},
                                         {"quiet", no_argument, 0, OPT_QUIET},
                                         {"json", no_argument, 0, OPT_JSON},
                                         {0, 0, 0, 0}};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:t:p:n:f:c:h", opts, NULL)) != -1) {
        int r = cli_generation_flag(&mo, &so, c, optarg);
        if (r == 0) r = cli_json_flag(&so, c, optarg);
        if (r < 0) return 2;
        if (r > 0) continue;
        switch (c) {
        case OPT_HELP: fputs(k_usage, stdout); return 0;
        case OPT_PROMPT: prompt = optarg; break;
        case 'f': file = optarg; break;
        case OPT_NO_BOS: no_bos = 1; break;
        case OPT_NO_SPECIAL: no_special = 1; break;
        case OPT_QUIET: quiet = 1; break;
        case OPT_JSON: json = 1; break;
        default: return cli_usage_error("generate", k_usage);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "qlm generate: unexpected argument '%s'\n", argv[optind]);
        return cli_usage_error("generate", k_usage);
    }
    if (cli_default_model(&mo, "generate", quiet) != 0) return 2;
    if (cli_json_compile(&so) != 0) return cli_fail("generate");
    char *file_text = NULL;
    if (file) {
        file_text = cli_read_text(file, NULL);
        if (!file_text) {
            cli_json_free(&so);
            return cli_fail("generate");
        }
        prompt = file_text;
    }
    cli_model cm;
    mo.distributed = 1;
    if (cli_load_model(&mo, &cm, 1, quiet) != 0) {
        free(file_text);
        cli_json_free(&so);
        return cli_model_fail(&cm, "generate");
    }
    /* Sharded: rank 0 generates, the others hold their parts of the weights for its passes. */
    if (!cli_is_root(&cm)) {
        free(file_text);
        cli_json_free(&so);
        int rc = cli_dist_drain(&cm.dist) == 0 ? 0 : cli_model_fail(&cm, "generate");
        cli_free_model(&cm);
        return rc;
    }
    int rc = 1, *ids = NULL, n_ids = 0, *gen_ids = NULL;
    cli_text_out text = {.to_stdout = !json, .keep = json};
    qlm_session s;
    int have_session = 0;
    if (cli_json_ready(&so, cm.src.tok) != 0) goto out;
    if (qlm_tokenizer_encode(cm.src.tok, prompt, strlen(prompt), !no_bos, !no_special, &ids, &n_ids) != 0) goto out;
    if (n_ids == 0) {
        int bos = qlm_tokenizer_bos(cm.src.tok);
        if (bos < 0) {
            qlm_errorf("empty prompt and the tokenizer has no BOS token to start from");
            goto out;
        }
        free(ids);
        ids = malloc(sizeof *ids);
        if (!ids) goto out;
        ids[0] = bos;
        n_ids = 1;
    }
    if (cli_session_init(&mo, &cm, &s, so.gen.max_new_tokens) != 0) goto out;
    have_session = 1;
    qlm_gen_stats st = {0}, pst = {0};
    if (qlm_session_sync(&s, ids, n_ids, &pst) != 0) goto out;
    gen_ids = malloc(((size_t)so.gen.max_new_tokens + 1) * sizeof *gen_ids);
    if (!gen_ids) goto out;
    so.gen.out_ids = gen_ids;
    /* A decoder continues the prompt; an encoder-decoder answers it. */
    if (!json && !cm.src.is_t5) fputs(prompt, stdout);
    if (qlm_session_generate(&s, &so.gen, cli_emit_text, &text, &st) != 0) goto out;
    if (json) {
        printf("{");
        print_ids("prompt_ids", ids, n_ids);
        printf(", ");
        print_ids("ids", gen_ids, st.n_generated);
        printf(", \"text\": ");
        print_json_text(text.buf ? text.buf : "", text.len);
        printf(", \"stop\": \"%s\"}\n", qlm_stop_reason_name(st.reason));
    } else {
        fputc('\n', stdout);
    }
    if (!quiet)
        fprintf(stderr, "qlm: prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s (%.1f tok/s); stop: %s\n",
                pst.n_prompt, pst.prefill_seconds, pst.n_prompt / (pst.prefill_seconds + 1e-9), st.n_generated,
                st.decode_seconds, st.n_generated / (st.decode_seconds + 1e-9), qlm_stop_reason_name(st.reason));
    if (!quiet && so.gen.json && st.n_generated > 0)
        fprintf(stderr, "qlm: JSON token masks: %.1f us per token, %.2f%% of decoding\n",
                st.constraint_seconds / st.n_generated * 1e6, 100 * st.constraint_seconds / (st.decode_seconds + 1e-12));
    rc = cli_dist_drain(&cm.dist) == 0 ? 0 : 1;
out:
    /* The session before the model it points into (a prompt longer than the context failed here). */
    if (have_session) qlm_session_free(&s);
    if (rc) cli_model_fail(&cm, "generate");
    free(ids);
    free(gen_ids);
    free(text.buf);
    free(file_text);
    cli_json_free(&so);
    cli_free_model(&cm);
    return rc;
}
