/* qlm chat: multi-turn conversation rendered with the model's chat template. The KV cache
 * keeps the conversation so each turn only evaluates its new tokens; when the history no
 * longer fits the context window, the oldest turns are dropped (the system prompt stays). */
#include <editline/readline.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tokenizer/chat.h"
#include "../core/error.h"
#include "commands.h"
#include "common.h"

static const char *k_usage =
    "usage: qlm chat -m MODEL [options]\n"
    "Interactive chat: type a message and press Enter (line editing and history on a terminal).\n"
    "Ctrl-C stops an answer and returns to the prompt; Ctrl-C at the prompt or Ctrl-D quits. Commands:\n"
    "/help, /reset (forget the conversation), /adapter NAME|none (switch LoRA adapter; /adapter lists\n"
    "them), /exit; start a message with // to send one that begins with /. With -p the messages are\n"
    "sent one after another and qlm exits.\n\n" CLI_MODEL_HELP CLI_SAMPLING_HELP CLI_JSON_HELP CLI_LORA_HELP
    CLI_CHAT_TEMPLATE_HELP
    "  -p, --prompt TEXT      send TEXT as a user message (repeatable); no interactive input\n"
    "      --system TEXT      system prompt\n"
    "      --quiet            no load line or timing on stderr\n";

typedef struct {
    qlm_chat_message *msgs;
    int n, cap;
} history;

static int history_add(history *h, const char *role, const char *content) {
    if (h->n == h->cap) {
        int cap = h->cap ? h->cap * 2 : 16;
        qlm_chat_message *m = realloc(h->msgs, (size_t)cap * sizeof *m);
        if (!m) return qlm_errorf("out of memory");
        h->msgs = m;
        h->cap = cap;
    }
    char *copy = strdup(content);
    if (!copy) return qlm_errorf("out of memory");
    h->msgs[h->n++] = (qlm_chat_message){role, copy};
    return 0;
}

/* Removes message i (freeing its content). */
static void history_remove(history *h, int i) {
    free((char *)h->msgs[i].content);
    memmove(&h->msgs[i], &h->msgs[i + 1], (size_t)(h->n - i - 1) * sizeof h->msgs[0]);
    h->n--;
}

static void history_clear(history *h, int keep) {
    while (h->n > keep) history_remove(h, h->n - 1);
}

/* Ctrl-C while an answer is generated: the first stops the answer, a second one quits. */
static volatile sig_atomic_t g_interrupted;

static void on_interrupt(int sig) {
    if (g_interrupted) {
        signal(sig, SIG_DFL);
        raise(sig);
    }
    g_interrupted = 1;
}

/* The answer on stdout and kept for the history, until a Ctrl-C stops it. */
static int emit_reply(void *user, const char *text, size_t len) {
    return g_interrupted ? 1 : cli_emit_text(user, text, len);
}

/* Renders and tokenizes the conversation, dropping the oldest turns until prompt + reply fit. */
static int fit_prompt(const qlm_tokenizer *tok, history *h, int first_turn, int ctx, int reserve, int **ids, int *n) {
    const char *tmpl = qlm_tokenizer_chat_template(tok);
    int bos = qlm_tokenizer_bos(tok), eos = qlm_tokenizer_eos(tok);
    const char *bos_s = bos >= 0 ? qlm_tokenizer_token(tok, bos) : "";
    const char *eos_s = eos >= 0 ? qlm_tokenizer_token(tok, eos) : "";
    for (;;) {
        qlm_marked_text text;
        if (qlm_chat_render_marked(tmpl, h->msgs, h->n, 1, bos_s, eos_s, &text) != 0) return -1;
        int rc = qlm_tokenizer_encode_marked(tok, &text, 0, ids, n);
        qlm_marked_free(&text);
        if (rc != 0) return -1;
        if (*n + reserve <= ctx) return 0;
        free(*ids);
        *ids = NULL;
        if (h->n - first_turn <= 1)
            return qlm_errorf("the message (%d tokens with its reply budget of %d) does not fit the context window of %d",
                              *n, reserve, ctx);
        history_remove(h, first_turn); /* oldest user message, then its reply */
        if (h->n > first_turn && strcmp(h->msgs[first_turn].role, "assistant") == 0) history_remove(h, first_turn);
    }
}

static int chat_turn(qlm_session *s, history *h, int first_turn, const char *message, const cli_sampling_opts *so,
                     int quiet) {
    if (history_add(h, "user", message) != 0) return -1;
    int *ids = NULL, n = 0;
    int reserve = so->gen.max_new_tokens < s->state.max_seq / 2 ? so->gen.max_new_tokens : s->state.max_seq / 2;
    if (fit_prompt(s->tok, h, first_turn, s->state.max_seq, reserve, &ids, &n) != 0) {
        history_remove(h, h->n - 1);
        return -1;
    }
    qlm_gen_stats pst = {0}, st = {0};
    cli_text_out reply = {.to_stdout = 1, .keep = 1};
    g_interrupted = 0;
    struct sigaction sa = {.sa_handler = on_interrupt}, old;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    int rc = qlm_session_sync(s, ids, n, &pst);
    if (rc == 0) rc = qlm_session_generate(s, &so->gen, emit_reply, &reply, &st);
    sigaction(SIGINT, &old, NULL);
    free(ids);
    fputc('\n', stdout);
    fflush(stdout);
    /* The part said so far stays in the conversation, as the model's turn. */
    if (g_interrupted) fprintf(stderr, "[stopped]\n");
    if (rc == 0) rc = history_add(h, "assistant", reply.buf ? reply.buf : "");
    else history_remove(h, h->n - 1);
    free(reply.buf);
    if (rc == 0 && !quiet)
        fprintf(stderr, "[%d new prompt tokens in %.2f s, %d tokens at %.1f tok/s, stop: %s]\n", pst.n_prompt,
                pst.prefill_seconds, st.n_generated, st.n_generated / (st.decode_seconds + 1e-9),
                qlm_stop_reason_name(st.reason));
    return rc;
}

/* "/adapter NAME" or "/adapter none": the next replies use that adapter (the conversation is
 * kept; its prompt is evaluated again under the new weights). "/adapter" alone lists them. */
static void switch_adapter(qlm_session *s, cli_model *cm, const char *arg) {
    while (*arg == ' ') arg++;
    if (!*arg) {
        const qlm_lora_adapter *cur = qlm_lora_registry_default(&cm->lora);
        fprintf(stderr, "[adapters:%s", cm->lora.n ? "" : " none loaded (use --lora NAME=PATH)");
        for (int i = 0; i < cm->lora.n; i++) {
            const qlm_lora_adapter *a = qlm_lora_registry_at(&cm->lora, i);
            fprintf(stderr, " %s%s", a->name, a == cur ? " (in use)" : "");
        }
        fprintf(stderr, "%s]\n", cur ? "" : "; using none");
        return;
    }
    if (qlm_lora_registry_set_default(&cm->lora, arg) != 0) {
        fprintf(stderr, "qlm chat: %s\n", qlm_last_error());
        return;
    }
    qlm_session_set_adapter(s, qlm_lora_registry_default(&cm->lora));
    fprintf(stderr, "[adapter: %s]\n", strcmp(arg, "none") ? arg : "none (base model)");
}

static void print_commands(void) {
    fputs("/help              this list\n"
          "/reset             forget the conversation (the system prompt stays)\n"
          "/adapter           list the LoRA adapters; /adapter NAME or /adapter none switches\n"
          "/exit, /quit       leave (so do Ctrl-D and Ctrl-C at the prompt)\n"
          "//text             send a message that begins with /\n"
          "Ctrl-C             while an answer is written: stop it\n",
          stderr);
}

/* Reads one line of any length from f; NULL at end of input. */
static char *read_line(FILE *f) {
    size_t cap = 256, n = 0;
    char *buf = malloc(cap);
    int ch;
    if (!buf) return NULL;
    while ((ch = fgetc(f)) != EOF && ch != '\n') {
        if (n + 1 >= cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                return NULL;
            }
            buf = b;
            cap *= 2;
        }
        buf[n++] = (char)ch;
    }
    if (ch == EOF && n == 0) {
        free(buf);
        return NULL;
    }
    if (n && buf[n - 1] == '\r') n--;
    buf[n] = 0;
    return buf;
}

/* The next line typed: through libedit (editing, history) on a terminal, plain reading otherwise.
 * NULL at end of input. */
static char *next_line(int tty) {
    if (!tty) return read_line(stdin);
    char *line = readline("> ");
    if (line && line[0]) add_history(line);
    return line;
}

int cmd_chat(int argc, char **argv) {
    cli_model_opts mo;
    cli_sampling_opts so;
    cli_model_opts_init(&mo);
    cli_sampling_opts_init(&so);
    const char *system = NULL, *prompts[64];
    int n_prompts = 0, quiet = 0;
    static const struct option opts[] = {CLI_MODEL_OPTIONS, CLI_SAMPLING_OPTIONS, CLI_JSON_OPTIONS, CLI_LORA_OPTIONS,
                                         CLI_CHAT_TEMPLATE_OPTION,
                                         {"prompt", required_argument, 0, OPT_PROMPT},
                                         {"system", required_argument, 0, OPT_SYSTEM},
                                         {"quiet", no_argument, 0, OPT_QUIET},
                                         {0, 0, 0, 0}};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:t:p:n:c:h", opts, NULL)) != -1) {
        int r = cli_generation_flag(&mo, &so, c, optarg);
        if (r == 0) r = cli_json_flag(&so, c, optarg);
        if (r < 0) return 2;
        if (r > 0) continue;
        switch (c) {
        case OPT_HELP: fputs(k_usage, stdout); return 0;
        case OPT_PROMPT:
            if (n_prompts == (int)(sizeof prompts / sizeof prompts[0])) {
                fprintf(stderr, "qlm chat: at most 64 -p messages\n");
                return 2;
            }
            prompts[n_prompts++] = optarg;
            break;
        case OPT_SYSTEM: system = optarg; break;
        case OPT_QUIET: quiet = 1; break;
        default: return cli_usage_error("chat", k_usage);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "qlm chat: unexpected argument '%s'\n", argv[optind]);
        return cli_usage_error("chat", k_usage);
    }
    if (cli_default_model(&mo, "chat", quiet) != 0) return 2;
    if (cli_json_compile(&so) != 0) return cli_fail("chat");
    cli_model cm;
    if (cli_load_model(&mo, &cm, 1, quiet) != 0) {
        cli_json_free(&so);
        return cli_fail("chat");
    }
    qlm_session s;
    if (cli_require_decoder_only(&cm, "chat") != 0 || cli_chat_template_ready(&mo, &cm, quiet) != 0 ||
        cli_json_ready(&so, cm.src.tok) != 0 || cli_session_init(&mo, &cm, &s, so.gen.max_new_tokens) != 0) {
        cli_json_free(&so);
        cli_free_model(&cm);
        return cli_fail("chat");
    }
    history h = {0};
    int rc = 0, first_turn = 0;
    if (system && history_add(&h, "system", system) != 0) rc = 1;
    first_turn = h.n;
    if (rc == 0 && n_prompts > 0) {
        for (int i = 0; i < n_prompts && rc == 0; i++) {
            if (!quiet) fprintf(stderr, "> %s\n", prompts[i]);
            if (chat_turn(&s, &h, first_turn, prompts[i], &so, quiet) != 0) rc = 1;
        }
    } else if (rc == 0) {
        int tty = isatty(0);
        if (tty && !quiet) fprintf(stderr, "qlm chat: /help lists the commands\n");
        for (;;) {
            char *line = next_line(tty);
            if (!line) break;
            if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) {
                free(line);
                break;
            }
            if (!strcmp(line, "/help")) {
                print_commands();
            } else if (!strcmp(line, "/reset")) {
                history_clear(&h, first_turn);
                fprintf(stderr, "[conversation cleared]\n");
            } else if (!strncmp(line, "/adapter", 8) && (line[8] == ' ' || !line[8])) {
                switch_adapter(&s, &cm, line + 8);
            } else if (line[0] == '/' && line[1] != '/') {
                /* A mistyped command would otherwise go to the model as a message. */
                fprintf(stderr, "qlm chat: unknown command %s (/help lists them; // sends a message starting with /)\n",
                        line);
            } else if (line[0] && chat_turn(&s, &h, first_turn, line + (line[0] == '/'), &so, quiet) != 0) {
                fprintf(stderr, "qlm chat: %s\n", qlm_last_error());
            }
            free(line);
        }
    }
    if (rc) cli_fail("chat");
    history_clear(&h, 0);
    free(h.msgs);
    qlm_session_free(&s);
    cli_json_free(&so);
    cli_free_model(&cm);
    return rc;
}
