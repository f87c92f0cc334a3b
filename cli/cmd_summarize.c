/* qlm summarize: dialogue summarization with the DialogSum lab's prompts (zero-, one- and
 * few-shot), as plain text for T5 and base models or through an instruction-tuned decoder's chat
 * template; one dialogue from a file or stdin, or a JSONL file of them through the batch
 * scheduler, written in input order line by line so that a crash loses nothing written and
 * --resume continues where the output ends; --eval scores the output with ROUGE. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock.h"
#include "../runtime/batch.h"
#include "../core/error.h"
#include "../runtime/summary_prompt.h"
#include "../eval/rouge.h"
#include "batch_parts.h"
#include "commands.h"
#include "common.h"
#include "jsonl.h"
#include "progress.h"

static const char *k_usage =
    "usage: qlm summarize -m MODEL [FILE | -] [options]\n"
    "       qlm summarize -m MODEL --batch IN.jsonl --out OUT.jsonl [options]\n"
    "Summarizes a dialogue (FILE, or stdin) and prints the summary; with --batch, every line of IN.\n"
    "The prompt is the DialogSum lab's: \"Summarize the following conversation.\\n\\n{dialogue}\\n\\nSummary: \",\n"
    "after --shots worked examples; instruction-tuned decoders get it as chat turns in their template.\n"
    "Greedy (--temp 0) unless sampling flags say otherwise.\n\n" CLI_MODEL_HELP CLI_SAMPLING_HELP CLI_LORA_HELP
    CLI_CHAT_TEMPLATE_HELP
    "      --shots N          worked examples before the dialogue (default 0), from --examples\n"
    "      --examples FILE    JSONL with \"dialogue\" and \"summary\" fields; its first N lines are the shots\n"
    "      --prompt-template FILE  a template with {dialogue} instead of the lab's\n"
    "      --format F         auto (chat template when the model has one, else plain), plain, chat\n"
    "      --batch IN.jsonl   summarize the --field of every line of IN\n"
    "      --out OUT.jsonl    batch output: each input line without --field, plus --out-field (or\n"
    "                         \"error\" for a prompt too long for the model, which is skipped)\n"
    "      --field NAME       input field holding the dialogue (default dialogue)\n"
    "      --out-field NAME   output field for the summary (default summary; refused when IN has it)\n"
    "      --batch-size B     dialogues decoded together (default 16)\n"
    "      --no-prefix-reuse  evaluate every prompt whole: each summary is then exactly the one the dialogue\n"
    "                         gets alone, whatever the batch or the split over ranks (copying a shared prompt\n"
    "                         prefix is faster and can change the rounding)\n"
    "      --resume           continue after the last complete line of OUT (each line checked\n"
    "                         against its input record)\n"
    "      --eval             score OUT against IN's reference fields with ROUGE when done\n"
    "      --ref-field A[,B]  reference fields for --eval (default summary1,summary2,summary3 when IN has\n"
    "                         summary1, else summary)\n"
    "      --adapter-field F  each line's --lora adapter by name from its field F (none: the base model;\n"
    "                         absent: --adapter); lines with different adapters share the batch\n"
    "      --quiet            no load line, progress or timing on stderr\n"
    "      --json             (one dialogue) print {\"summary\", \"prompt_tokens\", \"completion_tokens\",\n"
    "                         \"finish_reason\", \"prefill_seconds\", \"decode_seconds\"} instead of the text\n" CLI_DIST_HELP
    "  (with --batch, the dialogues are split over the ranks; each writes its finished records to\n"
    "  OUT.part-R and rank 0 puts them into OUT in input order when all are done)\n";

enum {
    OPT_SHOTS = 600, OPT_EXAMPLES, OPT_TEMPLATE, OPT_FORMAT, OPT_BATCH_IN, OPT_OUT, OPT_FIELD, OPT_OUT_FIELD,
    OPT_BATCH_SIZE, OPT_RESUME, OPT_EVAL, OPT_REF_FIELD, OPT_ADAPTER_FIELD, OPT_NO_PREFIX_REUSE,
};

#define MAX_REFS 16

typedef struct {
    cli_model_opts mo;
    cli_sampling_opts so;
    const char *input, *examples, *template_path, *format, *batch_in, *out, *field, *out_field, *ref_fields,
        *adapter_field;
    int shots, batch_size, resume, eval, quiet, no_prefix_reuse, json;
} options;

/* Everything that turns a dialogue into prompt ids. */
typedef struct {
    char *tmpl;
    cli_jsonl examples;
    qlm_shot *shots;
    int n_shots;
    const char *chat_template, *bos, *eos;
    const qlm_tokenizer *tok;
} prompter;

static int parse(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    cli_model_opts_init(&o->mo);
    cli_sampling_opts_init(&o->so);
    o->so.gen.sampling.temperature = 0;
    o->so.gen.max_new_tokens = 128;
    o->format = "auto";
    o->field = "dialogue";
    o->out_field = "summary";
    o->batch_size = 16;
    static const struct option opts[] = {CLI_MODEL_OPTIONS, CLI_SAMPLING_OPTIONS, CLI_LORA_OPTIONS, CLI_DIST_OPTIONS,
                                         CLI_CHAT_TEMPLATE_OPTION,
                                         {"shots", required_argument, 0, OPT_SHOTS},
                                         {"examples", required_argument, 0, OPT_EXAMPLES},
                                         {"prompt-template", required_argument, 0, OPT_TEMPLATE},
                                         {"format", required_argument, 0, OPT_FORMAT},
                                         {"batch", required_argument, 0, OPT_BATCH_IN},
                                         {"out", required_argument, 0, OPT_OUT},
                                         {"field", required_argument, 0, OPT_FIELD},
                                         {"out-field", required_argument, 0, OPT_OUT_FIELD},
                                         {"batch-size", required_argument, 0, OPT_BATCH_SIZE},
                                         {"resume", no_argument, 0, OPT_RESUME},
                                         {"eval", no_argument, 0, OPT_EVAL},
                                         {"ref-field", required_argument, 0, OPT_REF_FIELD},
                                         {"adapter-field", required_argument, 0, OPT_ADAPTER_FIELD},
                                         {"quiet", no_argument, 0, OPT_QUIET},
                                         {"no-prefix-reuse", no_argument, 0, OPT_NO_PREFIX_REUSE},
                                         {"json", no_argument, 0, OPT_JSON},
                                         {0, 0, 0, 0}};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:t:n:c:h", opts, NULL)) != -1) {
        int r = cli_generation_flag(&o->mo, &o->so, c, optarg);
        if (r < 0) return 2;
        if (r > 0) continue;
        switch (c) {
        case OPT_HELP: fputs(k_usage, stdout); return 1;
        case OPT_SHOTS: if (cli_int("--shots", optarg, 0, 64, &o->shots) != 0) return 2; break;
        case OPT_EXAMPLES: o->examples = optarg; break;
        case OPT_TEMPLATE: o->template_path = optarg; break;
        case OPT_FORMAT: o->format = optarg; break;
        case OPT_BATCH_IN: o->batch_in = optarg; break;
        case OPT_OUT: o->out = optarg; break;
        case OPT_FIELD: o->field = optarg; break;
        case OPT_OUT_FIELD: o->out_field = optarg; break;
        case OPT_BATCH_SIZE: if (cli_int("--batch-size", optarg, 1, 1024, &o->batch_size) != 0) return 2; break;
        case OPT_RESUME: o->resume = 1; break;
        case OPT_EVAL: o->eval = 1; break;
        case OPT_JSON: o->json = 1; break;
        case OPT_REF_FIELD: o->ref_fields = optarg; break;
        case OPT_ADAPTER_FIELD: o->adapter_field = optarg; break;
        case OPT_QUIET: o->quiet = 1; break;
        case OPT_NO_PREFIX_REUSE: o->no_prefix_reuse = 1; break;
        default: return cli_usage_error("summarize", k_usage);
        }
    }
    const char *why = NULL;
    if (optind < argc - 1) why = "at most one input FILE";
    else if (o->batch_in && optind < argc) why = "either FILE or --batch, not both";
    else if (o->batch_in && !o->out) why = "--batch needs --out";
    else if (!o->batch_in && (o->out || o->resume || o->eval || o->adapter_field))
        why = "--out, --resume, --eval and --adapter-field go with --batch";
    else if (o->batch_in && o->json) why = "--json is for one dialogue (--batch writes JSON lines already)";
    else if (o->shots && !o->examples) why = "--shots needs --examples FILE";
    else if (strcmp(o->format, "auto") && strcmp(o->format, "plain") && strcmp(o->format, "chat"))
        why = "--format is auto, plain or chat";
    else if (!o->field[0] || !o->out_field[0]) why = "--field and --out-field need a name";
    if (why) {
        fprintf(stderr, "qlm summarize: %s\n", why);
        return cli_usage_error("summarize", k_usage);
    }
    if (cli_default_model(&o->mo, "summarize", o->quiet) != 0) return 2;
    o->input = optind < argc ? argv[optind] : "-";
    return 0;
}

static void prompter_free(prompter *p) {
    free(p->tmpl);
    free(p->shots);
    cli_jsonl_free(&p->examples);
}

static int prompter_init(prompter *p, const options *o, const cli_model *cm) {
    memset(p, 0, sizeof *p);
    p->tok = cm->src.tok;
    p->tmpl = o->template_path ? cli_read_text(o->template_path, NULL) : strdup(QLM_SUMMARY_TEMPLATE);
    if (!p->tmpl) return o->template_path ? -1 : qlm_errorf("out of memory");
    if (qlm_summary_template_check(p->tmpl, o->template_path ? o->template_path : "built-in template") != 0) return -1;
    if (o->shots) {
        if (cli_jsonl_load(&p->examples, o->examples) != 0) return -1;
        if (p->examples.n < o->shots)
            return qlm_errorf("%s: %d examples, but --shots %d", o->examples, p->examples.n, o->shots);
        if (!(p->shots = calloc((size_t)o->shots, sizeof *p->shots))) return qlm_errorf("out of memory");
        for (int i = 0; i < o->shots; i++) {
            p->shots[i].dialogue = cli_jsonl_text(&p->examples, i, "dialogue");
            p->shots[i].summary = cli_jsonl_text(&p->examples, i, "summary");
            if (!p->shots[i].dialogue || !p->shots[i].summary) return -1;
        }
        p->n_shots = o->shots;
    }
    const char *tmpl = qlm_tokenizer_chat_template(p->tok);
    int chat = strcmp(o->format, "chat") == 0 || (strcmp(o->format, "auto") == 0 && tmpl && !cm->src.is_t5);
    if (chat && !tmpl) return qlm_errorf("%s: --format chat, but the tokenizer has no chat template", o->mo.model);
    if (chat) {
        int bos = qlm_tokenizer_bos(p->tok), eos = qlm_tokenizer_eos(p->tok);
        if (cli_chat_template_ready(&o->mo, cm, o->quiet) != 0) return -1;
        p->chat_template = tmpl;
        p->bos = bos >= 0 ? qlm_tokenizer_token(p->tok, bos) : "";
        p->eos = eos >= 0 ? qlm_tokenizer_token(p->tok, eos) : "";
    }
    return 0;
}

/* The prompt ids for one dialogue. A chat template writes its own special tokens; plain prompts
 * get the tokenizer's (BOS for decoders, </s> for T5). A "</s>" inside a dialogue stays text. */
static int prompt_ids(const prompter *p, const char *dialogue, int **ids, int *n) {
    qlm_marked_text text;
    if (qlm_summary_prompt(p->tmpl, p->shots, p->n_shots, dialogue, p->chat_template, p->bos, p->eos, &text) != 0)
        return -1;
    int rc = qlm_tokenizer_encode_marked(p->tok, &text, !p->chat_template, ids, n);
    qlm_marked_free(&text);
    return rc;
}

/* Leading and trailing whitespace off a summary, in place; returns its new length. */
static size_t trim(char *s, size_t len) {
    size_t a = 0;
    while (a < len && (s[a] == ' ' || s[a] == '\n' || s[a] == '\t' || s[a] == '\r')) a++;
    while (len > a && (s[len - 1] == ' ' || s[len - 1] == '\n' || s[len - 1] == '\t' || s[len - 1] == '\r')) len--;
    memmove(s, s + a, len - a);
    s[len - a] = 0;
    return len - a;
}

static int print_json(const cli_text_out *b, const qlm_gen_stats *pst, const qlm_gen_stats *st) {
    cJSON *j = cJSON_CreateObject();
    int ok = j && cJSON_AddStringToObject(j, "summary", b->buf ? b->buf : "") &&
             cJSON_AddNumberToObject(j, "prompt_tokens", pst->n_prompt) &&
             cJSON_AddNumberToObject(j, "completion_tokens", st->n_generated) &&
             cJSON_AddStringToObject(j, "finish_reason", qlm_stop_reason_name(st->reason)) &&
             cJSON_AddNumberToObject(j, "prefill_seconds", pst->prefill_seconds) &&
             cJSON_AddNumberToObject(j, "decode_seconds", st->decode_seconds);
    char *text = ok ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!text) return qlm_errorf("out of memory");
    puts(text);
    free(text);
    return 0;
}

static int summarize_one(const options *o, cli_model *cm, const prompter *p) {
    int from_stdin = !strcmp(o->input, "-");
    if (from_stdin && isatty(STDIN_FILENO) && !o->quiet)
        fprintf(stderr, "qlm summarize: reading the dialogue from stdin (end it with Ctrl-D)\n");
    char *dialogue = cli_read_text(o->input, NULL);
    if (!dialogue) return -1;
    /* A summary of nothing is the model's invention: say so instead. */
    if (!dialogue[strspn(dialogue, " \t\r\n")]) {
        free(dialogue);
        return qlm_errorf("%s: no dialogue to summarize (the input is empty)", from_stdin ? "stdin" : o->input);
    }
    int *ids = NULL, n = 0, rc = -1;
    qlm_session s;
    int have_session = 0;
    qlm_gen_stats pst = {0}, st = {0};
    if (prompt_ids(p, dialogue, &ids, &n) != 0) goto out;
    if (cli_session_init(&o->mo, cm, &s, o->so.gen.max_new_tokens) != 0) goto out;
    have_session = 1;
    if (qlm_session_sync(&s, ids, n, &pst) != 0) goto out;
    cli_text_out text = {.to_stdout = !o->json, .keep = o->json};
    if (qlm_session_generate(&s, &o->so.gen, cli_emit_text, &text, &st) != 0 ||
        (o->json && print_json(&text, &pst, &st) != 0)) {
        free(text.buf);
        goto out;
    }
    free(text.buf);
    if (!o->json) fputc('\n', stdout);
    if (!o->quiet)
        fprintf(stderr, "qlm: prompt %d tokens in %.2f s; summary %d tokens in %.2f s (%.1f tok/s), stop: %s\n",
                pst.n_prompt, pst.prefill_seconds, st.n_generated, st.decode_seconds,
                st.n_generated / (st.decode_seconds + 1e-9), qlm_stop_reason_name(st.reason));
    rc = 0;
out:
    if (have_session) qlm_session_free(&s);
    free(ids);
    free(dialogue);
    return rc;
}

/* ---- batch mode ---- */

static volatile sig_atomic_t g_interrupted;

static void on_interrupt(int sig) {
    (void)sig;
    g_interrupted = 1;
}

typedef struct {
    const options *o;
    cli_model *cm;
    cli_jsonl in;
    const qlm_lora_adapter **adapter; /* per record */
    int first, next, written; /* input records: first to do, next to hand out, next to write */
    int **ids;
    int *n_ids;
    char **summary;           /* finished, waiting for the ones before them */
    char **error;             /* records skipped, and why (their line gets an "error" field) */
    int n_skipped;
    FILE *out;
    cli_batch_part *part;     /* split over ranks: this rank's records and part file, else NULL */
    double t0;
    long generated;
    int done_this_run;
    int shown; /* progress last printed at this count (-1: never) */
    cli_progress progress;
} batch_job;


static void progress(batch_job *j, int final) {
    if (j->o->quiet || !cli_is_root(j->cm) || (final && j->shown == j->done_this_run)) return;
    j->shown = j->done_this_run;
    int total = j->part ? j->part->n_todo : j->in.n - j->first, done = j->done_this_run;
    double secs = qlm_now_s() - j->t0, rate = done / (secs + 1e-9);
    double eta = rate > 0 ? (total - done) / rate : 0;
    int width = 30, fill = total ? (int)((long)width * done / total) : width;
    cli_progress_update(&j->progress, final || done == total,
                        "summarize [%.*s%*s] %d/%d dialogues, %.2f dialogues/s, %.1f tok/s, ETA %dm%02ds", fill,
                        "##############################", width - fill, "", done, total, rate,
                        j->generated / (secs + 1e-9), (int)eta / 60, (int)eta % 60);
}

/* Record i of the output: its input fields but the dialogue, plus the summary (or, for a skipped
 * record, "error"); NULL when out of memory. */
static cJSON *output_record(const batch_job *j, int i) {
    const options *o = j->o;
    cJSON *rec = cJSON_Duplicate(j->in.rec[i], 1);
    if (!rec) return NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(rec, o->field);
    if (!(j->error[i] ? cJSON_AddStringToObject(rec, "error", j->error[i])
                      : cJSON_AddStringToObject(rec, o->out_field, j->summary[i]))) {
        cJSON_Delete(rec);
        return NULL;
    }
    return rec;
}

/* Appends record i as one line, durably. */
static int write_record(batch_job *j, int i) {
    const options *o = j->o;
    cJSON *rec = output_record(j, i);
    char *line = rec ? cJSON_PrintUnformatted(rec) : NULL;
    cJSON_Delete(rec);
    if (!line) return qlm_errorf("out of memory");
    int ok = fputs(line, j->out) >= 0 && fputc('\n', j->out) != EOF && fflush(j->out) == 0 &&
             fdatasync(fileno(j->out)) == 0;
    free(line);
    if (!ok) return qlm_errorf("%s: write failed: %s", o->out, strerror(errno));
    return 0;
}

/* Record i is finished (j->summary[i] or j->error[i] set): into this rank's part file, or into OUT
 * once the records before it are there too. 0, or 1 to stop (the error printed). */
static int record_done(batch_job *j, int i) {
    if (j->part) {
        cJSON *rec = output_record(j, i);
        int rc = rec ? cli_batch_part_write(j->part, rec, i) : qlm_errorf("out of memory");
        cJSON_Delete(rec);
        free(j->summary[i]);
        j->summary[i] = NULL;
        if (rc != 0) {
            fprintf(stderr, "qlm summarize: %s\n", qlm_last_error());
            return 1;
        }
        j->done_this_run++;
        progress(j, 0);
        return g_interrupted ? 1 : 0;
    }
    /* Lines go out in input order, so the output's length always says where to resume. */
    while (j->written < j->in.n && (j->summary[j->written] || j->error[j->written])) {
        if (write_record(j, j->written) != 0) {
            fprintf(stderr, "qlm summarize: %s\n", qlm_last_error());
            return 1;
        }
        free(j->summary[j->written]);
        j->summary[j->written] = NULL;
        j->written++;
        j->done_this_run++;
        progress(j, 0);
    }
    return g_interrupted ? 1 : 0;
}

static int next_dialogue(void *ctx, qlm_batch_request *req) {
    batch_job *j = ctx;
    int last = j->part ? j->part->n_todo : j->in.n;
    for (;;) {
        if (j->next == last || g_interrupted) return 0;
        int i = j->part ? j->part->todo[j->next++] : j->next++;
        if (j->error[i]) { /* a skipped record is finished as soon as its turn comes */
            if (record_done(j, i) != 0) return -1;
            continue;
        }
        *req = (qlm_batch_request){.ids = j->ids[i], .n_ids = j->n_ids[i], .params = &j->o->so.gen,
                                   .adapter = j->adapter[i], .user = (void *)(intptr_t)i};
        return 1;
    }
}

static int finished_dialogue(void *ctx, const qlm_batch_request *req, const char *text, size_t len,
                             const qlm_gen_stats *st) {
    batch_job *j = ctx;
    int i = (int)(intptr_t)req->user;
    char *s = malloc(len + 1);
    if (!s) return 1;
    memcpy(s, text, len);
    s[len] = 0;
    trim(s, len);
    j->summary[i] = s;
    j->generated += st->n_generated;
    return record_done(j, i);
}

/* Whether an output line was written for input record i: it holds every field of the record but
 * the dialogue, with the same values (a DialogSum fname, an id, a topic). */
static int same_record(const batch_job *j, int i, const cJSON *line) {
    const cJSON *f;
    cJSON_ArrayForEach(f, j->in.rec[i]) {
        if (!strcmp(f->string, j->o->field)) continue;
        if (!cJSON_Compare(f, cJSON_GetObjectItemCaseSensitive(line, f->string), 1)) return 0;
    }
    return 1;
}

/* With --resume: the complete lines of OUT (each a JSON object) are kept, a torn last line is cut
 * off, and *done is their count. Without: OUT must not hold anything yet. */
static int open_output(batch_job *j) {
    const options *o = j->o;
    struct stat st;
    if (cli_make_parent_dir(o->out) != 0) return -1;
    if (stat(o->out, &st) == 0 && !S_ISREG(st.st_mode))
        return qlm_errorf("%s: not a regular file (--out names the JSONL file to write)", o->out);
    int exists = stat(o->out, &st) == 0 && st.st_size > 0;
    if (exists && !o->resume)
        return qlm_errorf("%s already holds results: use --resume to continue it, or remove it", o->out);
    if (exists) {
        size_t len;
        char *text = cli_read_text(o->out, &len);
        if (!text) return -1;
        size_t keep = 0;
        int lines = 0;
        for (size_t at = 0; at < len;) {
            char *nl = memchr(text + at, '\n', len - at);
            if (!nl) break; /* a torn line from an interrupted write */
            *nl = 0;
            cJSON *rec = cJSON_Parse(text + at);
            int ok = cJSON_IsObject(rec) && (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(rec, o->out_field)) ||
                                             cJSON_IsString(cJSON_GetObjectItemCaseSensitive(rec, "error")));
            int mine = ok && lines < j->in.n && same_record(j, lines, rec);
            cJSON_Delete(rec);
            if (!ok || !mine) {
                free(text);
                if (!ok) return qlm_errorf("%s:%d: not a summary line this command wrote; not resuming", o->out, lines + 1);
                if (lines >= j->in.n)
                    return qlm_errorf("%s has more lines than %s has records; not resuming", o->out, o->batch_in);
                return qlm_errorf("%s:%d does not belong to %s:%d (its fields differ); not resuming", o->out, lines + 1,
                                  o->batch_in, j->in.line[lines]);
            }
            lines++;
            at = (size_t)(nl - text) + 1;
            keep = at;
        }
        free(text);
        if (keep < (size_t)st.st_size && truncate(o->out, (off_t)keep) != 0)
            return qlm_errorf("%s: cannot cut the torn last line: %s", o->out, strerror(errno));
        j->first = lines;
    }
    j->out = fopen(o->out, "a");
    if (!j->out) return qlm_errorf("%s: %s", o->out, strerror(errno));
    return 0;
}

/* Splits "a,b,c" into names (in place). */
static int split_names(char *list, const char **names, int max) {
    int n = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ","))
        if (n < max) names[n++] = tok;
    return n;
}

/* ROUGE of OUT's summaries against IN's references, in input order. */
static int evaluate(const batch_job *j, double seconds) {
    const options *o = j->o;
    cli_jsonl out = {0};
    char fields[512];
    const char *names[MAX_REFS];
    int rc = -1;
    qlm_rouge_scores *scores = NULL;
    if (o->ref_fields)
        snprintf(fields, sizeof fields, "%s", o->ref_fields);
    else
        snprintf(fields, sizeof fields, "%s",
                 cJSON_GetObjectItemCaseSensitive(j->in.rec[0], "summary1") ? "summary1,summary2,summary3" : "summary");
    int n_refs = split_names(fields, names, MAX_REFS);
    if (n_refs == 0) return qlm_errorf("--ref-field needs at least one name");
    if (cli_jsonl_load(&out, o->out) != 0) goto done;
    if (out.n != j->in.n) {
        qlm_errorf("%s has %d summaries for %d dialogues", o->out, out.n, j->in.n);
        goto done;
    }
    scores = malloc((size_t)out.n * sizeof *scores);
    if (!scores) goto done;
    int scored = 0;
    for (int i = 0; i < out.n; i++) {
        if (cJSON_GetObjectItemCaseSensitive(out.rec[i], "error")) continue; /* skipped: no summary */
        const char *refs[MAX_REFS], *pred = cli_jsonl_text(&out, i, o->out_field);
        if (!pred) goto done;
        for (int k = 0; k < n_refs; k++)
            if (!(refs[k] = cli_jsonl_text(&j->in, i, names[k]))) goto done;
        if (qlm_rouge_score(pred, refs, n_refs, &scores[scored++]) != 0) goto done;
    }
    if (scored == 0) {
        qlm_errorf("%s: every record was skipped: nothing to score", o->out);
        goto done;
    }
    qlm_rouge_scores mean;
    qlm_rouge_mean(scores, (size_t)scored, &mean);
    printf("ROUGE of %s against %s (%d dialogues%s, best of %d reference%s per metric, stemmed):\n", o->out,
           o->batch_in, scored, scored < out.n ? "; the skipped ones left out" : "", n_refs, n_refs > 1 ? "s" : "");
    qlm_rouge_print_table(stdout, &mean);
    printf("generation took %.1f s (%d dialogues this run)\n", seconds, j->done_this_run);
    rc = 0;
done:
    free(scores);
    cli_jsonl_free(&out);
    return rc;
}

/* Each record's adapter: the default, or by name from --adapter-field. */
static int pick_adapters(batch_job *j) {
    const qlm_lora_registry *reg = &j->cm->lora;
    for (int i = 0; i < j->in.n; i++) {
        j->adapter[i] = qlm_lora_registry_default(reg);
        if (!j->o->adapter_field || !cJSON_GetObjectItemCaseSensitive(j->in.rec[i], j->o->adapter_field)) continue;
        const char *name = cli_jsonl_text(&j->in, i, j->o->adapter_field);
        if (!name) return -1;
        j->adapter[i] = strcmp(name, "none") ? qlm_lora_registry_find(reg, name) : NULL;
        if (!j->adapter[i] && strcmp(name, "none"))
            return qlm_errorf("%s:%d: adapter \"%s\" is not loaded (use --lora %s=PATH)", j->o->batch_in, j->in.line[i],
                              name, name);
    }
    return 0;
}

/* Split over ranks: rank 0 finds where OUT ends, every rank its share of the rest (after every
 * part is read, so no rank writes before all have planned). */
static int plan_ranks(batch_job *j, cli_batch_part *part) {
    cli_dist *d = &j->cm->dist;
    double first = j->first;
    if (qlm_comm_broadcast_host(d->world, &first, sizeof first, 0) != 0) return -1;
    j->first = (int)first;
    if (cli_batch_part_open(part, j->o->out, j->first, j->in.n, d->rank, d->size) != 0) return -1;
    j->part = part;
    return qlm_comm_barrier(d->world);
}

static int summarize_batch(const options *o, cli_model *cm, const prompter *p) {
    batch_job j = {.o = o, .cm = cm, .shown = -1};
    cli_batch_part part = {0};
    int rc = -1, ranks = cm->dist.size > 1, root = cli_is_root(cm);
    if (cli_jsonl_load(&j.in, o->batch_in) != 0) goto out;
    if (j.in.n == 0) {
        qlm_errorf("%s: no records", o->batch_in);
        goto out;
    }
    for (int i = 0; i < j.in.n; i++) {
        if (!cli_jsonl_text(&j.in, i, o->field)) goto out;
        /* The output line is the input's fields plus the summary: one of the same name would be lost. */
        if (strcmp(o->field, o->out_field) != 0 && cJSON_GetObjectItemCaseSensitive(j.in.rec[i], o->out_field)) {
            qlm_errorf("%s:%d: the record has a \"%s\" field, which the summary would replace; name the output "
                       "field with --out-field (e.g. --out-field prediction)",
                       o->batch_in, j.in.line[i], o->out_field);
            goto out;
        }
    }
    if (root && open_output(&j) != 0) goto out;
    if (ranks && plan_ranks(&j, &part) != 0) goto out;
    j.ids = calloc((size_t)j.in.n, sizeof *j.ids);
    j.n_ids = calloc((size_t)j.in.n, sizeof *j.n_ids);
    j.summary = calloc((size_t)j.in.n, sizeof *j.summary);
    j.adapter = calloc((size_t)j.in.n, sizeof *j.adapter);
    j.error = calloc((size_t)j.in.n, sizeof *j.error);
    if (!j.ids || !j.n_ids || !j.summary || !j.adapter || !j.error) {
        qlm_errorf("out of memory");
        goto out;
    }
    if (pick_adapters(&j) != 0) goto out;
    /* A decoder's prompt and summary share its positions: a prompt with no room for --max-tokens is
     * skipped (its line says why), not the whole batch. */
    int max_prompt = 1, positions = cm->src.is_t5 ? 0 : qlm_llama_positions(&cm->model.cfg);
    for (int i = j.first; i < j.in.n; i++) {
        if (prompt_ids(p, cli_jsonl_text(&j.in, i, o->field), &j.ids[i], &j.n_ids[i]) != 0) {
            qlm_error_context("%s:%d", o->batch_in, j.in.line[i]);
            goto out;
        }
        if (positions && j.n_ids[i] + o->so.gen.max_new_tokens > positions) {
            if (asprintf(&j.error[i], "the prompt is %d tokens: with --max-tokens %d it exceeds the model's %d positions",
                         j.n_ids[i], o->so.gen.max_new_tokens, positions) < 0) {
                j.error[i] = NULL;
                qlm_errorf("out of memory");
                goto out;
            }
            j.n_skipped++;
            if (!o->quiet && root)
                fprintf(stderr, "summarize: %s:%d skipped: %s\n", o->batch_in, j.in.line[i], j.error[i]);
            continue;
        }
        if (j.n_ids[i] > max_prompt) max_prompt = j.n_ids[i];
    }
    j.written = j.first;
    j.next = ranks ? 0 : j.first;
    qlm_batch_config bc = {.model = cm->src.is_t5 ? NULL : &cm->model, .t5 = cm->src.is_t5 ? &cm->t5 : NULL,
                           .tok = cm->src.tok, .n_slots = o->batch_size, .max_prompt = max_prompt,
                           .max_output = o->so.gen.max_new_tokens, .no_prefix_reuse = o->no_prefix_reuse};
    if (!o->quiet && root)
        fprintf(stderr, "summarize: %d of %d dialogues to do (%d already in %s), %d at a time, prompts up to %d tokens\n",
                j.in.n - j.first, j.in.n, j.first, o->out, o->batch_size, max_prompt);
    if (!o->quiet && root && ranks)
        fprintf(stderr, "summarize: split over %d ranks; rank 0 takes %d, and the progress below is its own\n",
                cm->dist.size, part.n_todo);
    int mine = ranks ? part.n_todo : j.in.n - j.first;
    struct sigaction sa = {.sa_handler = on_interrupt}, old_int, old_term;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    j.t0 = qlm_now_s();
    cli_progress_init(&j.progress, o->quiet);
    qlm_batch_stats bs;
    memset(&bs, 0, sizeof bs);
    int brc = mine > 0 ? qlm_batch_run(&bc, next_dialogue, finished_dialogue, &j, &bs) : 0;
    /* Every rank joins the others' passes until all are done. */
    if (brc == 0 && cli_dist_drain(&cm->dist) != 0) brc = -1;
    double seconds = qlm_now_s() - j.t0;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (mine > 0) progress(&j, 1);
    if (g_interrupted) {
        if (ranks)
            qlm_errorf("interrupted: the finished dialogues are in %s.part-*; run again with --resume to continue",
                       o->out);
        else
            qlm_errorf("interrupted: %d of %d dialogues are in %s; run again with --resume to continue", j.written,
                       j.in.n, o->out);
        goto out;
    }
    if (brc != 0) goto out;
    if (ranks && root && cli_batch_part_merge(j.out, o->out, j.first, j.in.n) != 0) goto out;
    if (!root) {
        rc = 0;
        goto out;
    }
    if (j.n_skipped > 0)
        fprintf(stderr, "summarize: %d record%s skipped (their lines in %s hold \"error\" instead of \"%s\")\n",
                j.n_skipped, j.n_skipped == 1 ? "" : "s", o->out, o->out_field);
    if (!o->quiet && mine > 0)
        fprintf(stderr, "summarize: %d dialogues in %.1f s (%.2f dialogues/s), %ld tokens generated (%.1f tok/s), "
                        "%ld decode steps; %ld of %ld prompt tokens reused from an earlier prompt's cache\n",
                j.done_this_run, seconds, j.done_this_run / (seconds + 1e-9), bs.generated_tokens,
                bs.generated_tokens / (seconds + 1e-9), bs.steps, bs.reused_tokens, bs.prompt_tokens);
    rc = o->eval ? evaluate(&j, seconds) : 0;
out:
    cli_batch_part_close(&part);
    if (j.out && fclose(j.out) != 0 && rc == 0) rc = qlm_errorf("%s: %s", o->out, strerror(errno));
    for (int i = 0; j.ids && i < j.in.n; i++) free(j.ids[i]);
    for (int i = 0; j.summary && i < j.in.n; i++) free(j.summary[i]);
    for (int i = 0; j.error && i < j.in.n; i++) free(j.error[i]);
    free(j.error);
    free(j.ids);
    free(j.n_ids);
    free(j.summary);
    free(j.adapter);
    cli_jsonl_free(&j.in);
    return rc;
}

int cmd_summarize(int argc, char **argv) {
    options o;
    int r = parse(argc, argv, &o);
    if (r) return r == 1 ? 0 : r;
    cli_model cm;
    o.mo.distributed = 1;
    if (cli_load_model(&o.mo, &cm, 1, o.quiet) != 0) return cli_model_fail(&cm, "summarize");
    prompter p;
    int rc = prompter_init(&p, &o, &cm);
    /* One dialogue over sharded weights: rank 0 summarizes it, the others serve their parts. */
    if (rc == 0) rc = o.batch_in ? summarize_batch(&o, &cm, &p) : cli_is_root(&cm) ? summarize_one(&o, &cm, &p) : 0;
    if (rc == 0 && !o.batch_in) rc = cli_dist_drain(&cm.dist);
    prompter_free(&p);
    if (rc != 0) return cli_model_fail(&cm, "summarize");
    cli_free_model(&cm);
    return 0;
}
