#include <cjson/cJSON.h>
#include "common.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <unistd.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../quant/matmul.h"
#include "../tokenizer/chat.h"
#include "../core/clock.h"
#include "../core/error.h"
#include "../loaders/json_strict.h"
#include "../loaders/panel_cache.h"
#include "../models/param_pack.h"
#include "progress.h"
#include "threads.h"

void cli_model_opts_init(cli_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = "auto";
    o->batch = 512;
    o->prefetch = 1;
    o->act8 = -1;
}

void cli_sampling_opts_init(cli_sampling_opts *s) {
    memset(s, 0, sizeof *s);
    s->gen.sampling = qlm_sampling_defaults();
    s->gen.max_new_tokens = 256;
    s->gen.stop = s->stops;
}

int cli_int(const char *flag, const char *arg, long min, long max, int *out) {
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno || end == arg || *end || v < min || v > max) {
        fprintf(stderr, "qlm: %s expects an integer in [%ld, %ld], got '%s'\n", flag, min, max, arg);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int cli_double(const char *flag, const char *arg, double min, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (errno || end == arg || *end || !(v >= min && v <= max)) {
        fprintf(stderr, "qlm: %s expects a number in [%g, %g], got '%s'\n", flag, min, max, arg);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_float(const char *flag, const char *arg, double min, double max, float *out) {
    double v;
    if (cli_double(flag, arg, min, max, &v) != 0) return -1;
    *out = (float)v;
    return 0;
}

int cli_model_flag(cli_model_opts *o, int opt, const char *arg) {
    switch (opt) {
    case OPT_MODEL: o->model = arg; return 1;
    case OPT_TOKENIZER:
        /* llama.cpp's -t is its thread count: a bare number is that habit, not a tokenizer file. */
        if (arg[0] && strspn(arg, "0123456789") == strlen(arg) && access(arg, F_OK) != 0) {
            fprintf(stderr, "qlm: -t is the tokenizer file; for %s threads use --threads %s\n", arg, arg);
            return -1;
        }
        o->tokenizer = arg;
        return 1;
    case OPT_DTYPE: {
        qlm_dtype d;
        if (qlm_dtype_parse(arg, &d) != 0) {
            fprintf(stderr, "qlm: --dtype must be f32, bf16, f16, int8, q8_0, q4_0 (int4) or q4_1, got '%s'\n", arg);
            return -1;
        }
        o->dtype = arg;
        return 1;
    }
    case OPT_PER_CHANNEL: o->per_channel = 1; return 1;
    case OPT_GROUP:
        if (cli_int("--group", arg, 32, 128, &o->group)) return -1;
        if (!qlm_group_valid(o->group)) {
            fprintf(stderr, "qlm: --group must be 32, 64 or 128, got '%s'\n", arg);
            return -1;
        }
        return 1;
    case OPT_W8A8: o->act8 = 1; return 1;
    case OPT_NO_W8A8: o->act8 = 0; return 1;
    case OPT_THREADS: return cli_int("--threads", arg, 1, 1024, &o->threads) ? -1 : 1;
    case 'c': /* llama.cpp's -c */
    case OPT_CTX: return cli_int("--ctx", arg, 1, 1 << 24, &o->ctx) ? -1 : 1;
    case OPT_BATCH: return cli_int("--chunk", arg, 1, 1 << 16, &o->batch) ? -1 : 1;
    case OPT_RANDOM_WEIGHTS: o->random_weights = 1; return 1;
    case OPT_NO_CHECK: o->no_check = 1; return 1;
    case OPT_NO_PANEL_CACHE: o->no_panel_cache = 1; return 1;
    case OPT_CHAT_TEMPLATE: o->chat_template = arg; return 1;
    case OPT_INFER_SHARD:
        if (strcmp(arg, "fsdp") != 0) {
            fprintf(stderr, "qlm: --shard takes fsdp (the weights split over the ranks), got '%s'\n", arg);
            return -1;
        }
        o->shard = 1;
        return 1;
    case OPT_INFER_PREFETCH: return cli_int("--prefetch", arg, 0, 64, &o->prefetch) ? -1 : 1;
    case OPT_INFER_TIMEOUT: return cli_float("--dist-timeout", arg, 0.1, 1e7, &o->dist_timeout) ? -1 : 1;
    case OPT_DEVICE:
        if (strcmp(arg, "cpu") && strcmp(arg, "cuda") && strcmp(arg, "auto")) {
            fprintf(stderr, "qlm: --device must be cpu, cuda or auto, got '%s'\n", arg);
            return -1;
        }
        o->device = arg;
        return 1;
    default: return 0;
    }
}

int cli_lora_flag(cli_model_opts *o, int opt, const char *arg) {
    if (opt == OPT_ADAPTER) {
        o->adapter = arg;
        return 1;
    }
    if (opt != OPT_LORA) return 0;
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1]) {
        fprintf(stderr, "qlm: --lora expects NAME=PATH, got '%s'\n", arg);
        return -1;
    }
    if (o->n_lora == CLI_MAX_LORA) {
        fprintf(stderr, "qlm: at most %d --lora adapters\n", CLI_MAX_LORA);
        return -1;
    }
    o->lora[o->n_lora++] = arg;
    return 1;
}

int cli_generation_flag(cli_model_opts *mo, cli_sampling_opts *so, int opt, const char *arg) {
    int r = cli_model_flag(mo, opt, arg);
    if (r == 0) r = cli_sampling_flag(so, opt, arg);
    if (r == 0) r = cli_lora_flag(mo, opt, arg);
    return r;
}

int cli_sampling_flag(cli_sampling_opts *s, int opt, const char *arg) {
    qlm_sampling *p = &s->gen.sampling;
    int v;
    switch (opt) {
    case OPT_TEMP: return cli_float("--temp", arg, 0, 100, &p->temperature) ? -1 : 1;
    case OPT_TOP_K: return cli_int("--top-k", arg, 0, 1 << 24, &p->top_k) ? -1 : 1;
    case OPT_TOP_P: return cli_float("--top-p", arg, 1e-6, 1, &p->top_p) ? -1 : 1;
    case OPT_REPEAT_PENALTY: return cli_float("--repeat-penalty", arg, 1e-3, 100, &p->repeat_penalty) ? -1 : 1;
    case OPT_REPEAT_LAST_N: return cli_int("--repeat-last-n", arg, 0, 1 << 24, &p->repeat_last_n) ? -1 : 1;
    case OPT_MIN_P: return cli_float("--min-p", arg, 0, 1, &p->min_p) ? -1 : 1;
    case OPT_PRESENCE_PENALTY: return cli_float("--presence-penalty", arg, -2, 2, &p->presence_penalty) ? -1 : 1;
    case OPT_FREQUENCY_PENALTY: return cli_float("--frequency-penalty", arg, -2, 2, &p->frequency_penalty) ? -1 : 1;
    case OPT_SEED: {
        char *end;
        errno = 0;
        unsigned long long seed = strtoull(arg, &end, 10);
        if (errno || end == arg || *end || arg[0] == '-') {
            fprintf(stderr, "qlm: --seed expects a non-negative integer, got '%s'\n", arg);
            return -1;
        }
        p->seed = seed ? seed : 0x9E3779B97F4A7C15ULL; /* 0 would mean "from the clock" */
        return 1;
    }
    case OPT_NTOK:
        if (cli_int("--max-tokens", arg, 0, 1 << 24, &v) != 0) return -1;
        s->gen.max_new_tokens = v;
        return 1;
    case OPT_STOP:
        if (s->gen.n_stop == (int)(sizeof s->stops / sizeof s->stops[0])) {
            fprintf(stderr, "qlm: at most %zu --stop strings\n", sizeof s->stops / sizeof s->stops[0]);
            return -1;
        }
        if (!arg[0]) {
            fprintf(stderr, "qlm: --stop needs a non-empty string\n");
            return -1;
        }
        s->stops[s->gen.n_stop++] = arg;
        return 1;
    default: return 0;
    }
}

int cli_emit_text(void *user, const char *text, size_t len) {
    cli_text_out *o = user;
    if (o->to_stdout) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    if (!o->keep) return 0;
    if (o->len + len + 1 > o->cap) {
        size_t cap = (o->len + len + 1) * 2;
        char *b = realloc(o->buf, cap);
        if (!b) return qlm_errorf("out of memory");
        o->buf = b;
        o->cap = cap;
    }
    memcpy(o->buf + o->len, text, len);
    o->len += len;
    o->buf[o->len] = 0;
    return 0;
}

int cli_json_flag(cli_sampling_opts *s, int opt, const char *arg) {
    if (opt == OPT_JSON_OBJECT) s->json_object = 1;
    else if (opt == OPT_JSON_SCHEMA) s->json_schema = arg;
    else return 0;
    return 1;
}

int cli_json_compile(cli_sampling_opts *s) {
    if (s->json_object && s->json_schema) return qlm_errorf("--json-object and --json-schema exclude each other");
    if (s->json_object) return (s->json = qlm_json_grammar_object()) ? 0 : -1;
    if (!s->json_schema) return 0;
    size_t len;
    char *text = cli_read_text(s->json_schema, &len);
    if (!text) return qlm_error_context("--json-schema %s", s->json_schema);
    cJSON *schema = qlm_json_parse_strict(text, len);
    free(text);
    if (!schema) return qlm_error_context("--json-schema %s: not JSON", s->json_schema);
    s->json = qlm_json_grammar_schema(schema);
    cJSON_Delete(schema);
    return s->json ? 0 : qlm_error_context("--json-schema %s", s->json_schema);
}

int cli_json_ready(cli_sampling_opts *s, const qlm_tokenizer *tok) {
    if (!s->json) return 0;
    const char *flag = s->json_object ? "--json-object" : "--json-schema";
    if (!(s->json_vocab = qlm_json_vocab_from_tokenizer(tok)) || qlm_json_vocab_check(s->json_vocab, s->json) != 0)
        return qlm_error_context("%s", flag);
    s->gen.json = s->json;
    s->gen.json_vocab = s->json_vocab;
    return 0;
}

void cli_json_free(cli_sampling_opts *s) {
    qlm_json_grammar_free(s->json);
    qlm_json_vocab_free(s->json_vocab);
    s->json = NULL;
    s->json_vocab = NULL;
    s->gen.json = NULL;
    s->gen.json_vocab = NULL;
}

int cli_fail(const char *cmd) {
    fprintf(stderr, "qlm %s: %s\n", cmd, qlm_last_error());
    return 1;
}

int cli_usage_error(const char *cmd, const char *usage) {
    const char *nl = strchr(usage, '\n');
    fprintf(stderr, "%.*s\nRun 'qlm %s --help' for all options.\n", nl ? (int)(nl - usage) : (int)strlen(usage), usage,
            cmd);
    return 2;
}

/* The --lora adapters, checked against the base, and the --adapter choice (default: the first). */
static int load_adapters(const cli_model_opts *o, cli_model *cm) {
    const qlm_backend *be = cm->src.is_t5 ? cm->t5.be : cm->model.be;
    if (qlm_lora_registry_init(&cm->lora, cm->src.is_t5 ? NULL : &cm->src.cfg, cm->src.is_t5 ? &cm->src.t5 : NULL, be) != 0)
        return -1;
    for (int i = 0; i < o->n_lora; i++) {
        char name[64];
        const char *eq = strchr(o->lora[i], '=');
        if ((size_t)(eq - o->lora[i]) >= sizeof name) return qlm_errorf("--lora %s: the name is too long", o->lora[i]);
        snprintf(name, sizeof name, "%.*s", (int)(eq - o->lora[i]), o->lora[i]);
        if (qlm_lora_registry_load(&cm->lora, name, eq + 1, QLM_F32) != 0) return -1;
    }
    const char *pick = o->adapter ? o->adapter : o->n_lora ? qlm_lora_registry_at(&cm->lora, 0)->name : NULL;
    if (pick && strcmp(pick, "none") != 0 && !qlm_lora_registry_find(&cm->lora, pick))
        return qlm_errorf("--adapter %s: no such adapter (load it with --lora %s=PATH)", pick, pick);
    return qlm_lora_registry_set_default(&cm->lora, pick);
}

/* Bytes of weights the model reads where the loader holds them (qlm_model_options.in_place). */
static size_t in_place_bytes(const cli_model *cm) {
    return cm->src.is_t5 ? cm->t5.in_place_bytes : cm->model.in_place_bytes;
}

void cli_weight_bytes(cli_model *cm, size_t *file, size_t *cache, size_t *owned) {
    const size_t held = cm->src.is_t5 ? qlm_t5_held_bytes(&cm->t5) : qlm_model_held_bytes(&cm->model);
    /* The panel cache's matrices the model reads: each points at its entry's data. */
    qlm_param *list = NULL;
    int n = 0;
    if (cm->panels) n = cm->src.is_t5 ? qlm_t5_param_list(&cm->t5, &list) : qlm_model_param_list(&cm->model, &list);
    *cache = 0;
    for (int i = 0; i < n; i++) {
        const qlm_tensor_entry *c = list[i].matrix ? qlm_store_find(cm->panels, list[i].name) : NULL;
        if (c && list[i].matrix->data == c->data) *cache += c->nbytes;
    }
    free(list);
    *file = in_place_bytes(cm) - *cache;
    *owned = held - in_place_bytes(cm);
}

/* The load line (and each adapter's). */
void cli_format_words(const qlm_weight_format *f, char *buf, size_t cap) {
    snprintf(buf, cap, "%s%s%s", qlm_dtype_name(f->dtype), f->per_channel ? " per-channel" : "", f->act8 ? " w8a8" : "");
}

static void print_loaded(const cli_model_opts *o, cli_model *cm, const qlm_backend *be, double secs) {
    char words[48];
    cli_format_words(cli_model_format(cm), words, sizeof words);
    if (cm->src.is_t5) {
        const qlm_t5_model *m = &cm->t5;
        fprintf(stderr, "qlm: loaded %s (%s, t5) in %.2f s: %d+%d layers, d_model %d, %.1fM params, %s weights, %s backend, %d threads\n",
                o->model, qlm_format_name(cm->src.format), secs, m->cfg.n_layers, m->cfg.n_dec_layers, m->cfg.d_model,
                qlm_t5_param_count(m) / 1e6, words, be->name, omp_get_max_threads());
    } else {
        const qlm_model *m = &cm->model;
        fprintf(stderr, "qlm: loaded %s (%s, %s) in %.2f s: %d layers, dim %d, %.1fM params, %s weights, %s backend, %d threads\n",
                o->model, qlm_format_name(cm->src.format), m->cfg.arch[0] ? m->cfg.arch : "llama", secs,
                m->cfg.n_layers, m->cfg.dim, qlm_model_param_count(m) / 1e6, words, be->name, omp_get_max_threads());
    }
    size_t file, cache, owned;
    cli_weight_bytes(cm, &file, &cache, &owned);
    fprintf(stderr, "qlm: weights: %.1f MiB read where the model file is mapped, %.1f MiB from the panel cache's "
                    "mapping, %.1f MiB in memory of qlm's own\n",
            file / 1048576.0, cache / 1048576.0, owned / 1048576.0);
    for (int i = 0; i < cm->lora.n; i++) {
        const qlm_lora_adapter *a = qlm_lora_registry_at(&cm->lora, i);
        fprintf(stderr, "qlm: adapter %s from %s: rank %d, %d modules, %.2fM params%s\n", a->name, a->path, a->cfg.r,
                a->n_stored, a->n_params / 1e6, a == qlm_lora_registry_default(&cm->lora) ? " (in use)" : "");
    }
}

/* Started as several ranks: the world, and a model that must be split over it. */
static int start_ranks(const cli_model_opts *o, cli_model *cm, int *threads, int quiet) {
    if (cli_dist_start(&cm->dist, o->device, o->dist_timeout, threads, quiet) != 0) return -1;
    if (cm->dist.size > 1 && !o->shard)
        return qlm_errorf("started as %d ranks: add --shard fsdp to split the weights over them (or start one "
                          "process)",
                          cm->dist.size);
    return 0;
}

/* The --chat-template file's text, checked to be UTF-8 that parses (before the model loads: that
 * can take minutes). NULL with the error. */
static char *read_chat_template(const char *path) {
    size_t len;
    char *text = cli_read_text(path, &len);
    if (!text) return NULL;
    if (strlen(text) != len || !qlm_utf8_valid((const unsigned char *)text, len)) {
        qlm_errorf("--chat-template %s: not UTF-8 text", path);
    } else if (qlm_chat_template_check(text) != 0) {
        qlm_error_context("--chat-template %s", path);
    } else {
        return text;
    }
    free(text);
    return NULL;
}

static int set_chat_template(const cli_model_opts *o, cli_model *cm, const char *text) {
    if (!cm->src.tok) return qlm_errorf("--chat-template %s: the model has no tokenizer to use it with", o->chat_template);
    return qlm_tokenizer_set_chat_template(cm->src.tok, text);
}

int cli_chat_template_ready(const cli_model_opts *o, const cli_model *cm, int quiet) {
    const char *tmpl = qlm_tokenizer_chat_template(cm->src.tok);
    if (qlm_chat_template_check(tmpl) != 0)
        return qlm_error_context("%s: the model's chat template cannot be used (give one with --chat-template FILE)",
                                 o->model);
    char what[640];
    if (!quiet)
        fprintf(stderr, "qlm: chat template: %s%s%s\n", qlm_chat_template_describe(tmpl, what, sizeof what),
                o->chat_template ? " from " : tmpl ? " from the model's tokenizer" : "",
                o->chat_template ? o->chat_template : "");
    return 0;
}

/* Building the model's layers: shown once it has taken a second (a load that converts a large
 * model), not for the loads that take a fraction of one. */
typedef struct {
    cli_progress line;
    double t0;
} build_progress;

static void on_layer(void *user, int done, int total) {
    build_progress *b = user;
    double secs = qlm_now_s() - b->t0;
    if (secs < 1.0) return;
    int width = 30, fill = (int)((long)width * done / total);
    cli_progress_update(&b->line, done == total, "converting weights [%.*s%*s] %d/%d layers, %.1f s", fill,
                        "##############################", width - fill, "", done, total, secs);
}

/* qlm's cache folder: $QLM_CACHE, else ~/.cache/qlm. */
static void cache_dir(char *dir, size_t cap) {
    const char *cache = getenv("QLM_CACHE"), *home = getenv("HOME");
    if (cache && *cache) snprintf(dir, cap, "%s", cache);
    else snprintf(dir, cap, "%s/.cache/qlm", home && *home ? home : ".");
}

/* Below this, converting or packing at load costs about a tenth of a second or less: no file. */
#define PANEL_CACHE_MIN_BYTES ((size_t)32 << 20)

/* The panel cache file for this load into path, and the format label it is kept under: 1 when
 * there is one to read or write. It keeps what a load makes that is worth keeping: W8A8's panels,
 * a dtype asked for that is not a block type (INT8, BF16 from F32, ...), converted, and copies on
 * cache lines of F32, F16 and BF16 matrices that the model file holds off them (param_pack.c). */
static int panel_cache_path(const cli_model_opts *o, const qlm_model_options *mo, char *path, size_t cap, char *label,
                            size_t label_cap) {
    const int converts = !mo->as_stored && !qlm_dtype_is_block(mo->dtype);
    /* The file is mapped and read where it lies: weights in host memory only. */
    if (!(mo->act8 || converts || mo->as_stored) || !mo->in_place || !mo->backend->host_memory ||
        o->random_weights || o->no_panel_cache)
        return 0;
    if (mo->as_stored)
        snprintf(label, label_cap, mo->act8 ? "as-stored" : "as-stored/16-bit-x");
    else if (converts)
        snprintf(label, label_cap, "%s%s", qlm_dtype_name(mo->dtype),
                 mo->dtype == QLM_I8 && mo->per_channel ? "/per-channel" : "");
    else
        snprintf(label, label_cap, "%s/%d", qlm_dtype_name(mo->dtype), qlm_model_format(mo).group);
    char dir[4096];
    cache_dir(dir, sizeof dir);
    return qlm_panel_cache_path(dir, o->model, label, path, cap) == 1;
}

/* Writes what the load made that the cache keeps (qlm_params_list_cacheable) to the file at path,
 * when it is large enough to be worth it. A failure only costs later loads their speed: it is
 * said, and the load goes on. */
static void save_panel_cache(const cli_model_opts *o, cli_model *cm, const char *path, const char *label, int quiet) {
    qlm_param *list = NULL;
    int n = cm->src.is_t5 ? qlm_t5_param_list(&cm->t5, &list) : qlm_model_param_list(&cm->model, &list);
    qlm_tensor_store *panels = n >= 0 ? qlm_store_new() : NULL;
    size_t bytes = 0;
    int rc = panels && qlm_params_list_cacheable(list, n, panels) == 0 ? 0 : -1;
    for (int i = 0; rc == 0 && i < qlm_store_count(panels); i++) bytes += qlm_store_at(panels, i)->nbytes;
    if (rc == 0 && bytes >= PANEL_CACHE_MIN_BYTES) {
        double t0 = qlm_now_s();
        rc = cli_make_parent_dir(path) == 0 && qlm_panel_cache_save(path, o->model, label, panels) == 0 ? 0 : -1;
        if (rc == 0 && !quiet)
            fprintf(stderr, "qlm: weights made at load (%.1f MiB) kept in %s in %.2f s: later loads map them "
                            "(--no-panel-cache: not)\n",
                    bytes / 1048576.0, path, qlm_now_s() - t0);
    }
    if (rc != 0 && !quiet)
        fprintf(stderr, "qlm: the weights made at load could not be kept for later loads (%s); they are made again "
                        "each load\n",
                qlm_last_error());
    qlm_store_free(panels);
    free(list);
}

static int load_model(const cli_model_opts *o, cli_model *cm, int need_tokenizer, int quiet,
                      const char *chat_template) {
    int threads = o->threads;
    qlm_dtype want;
    if (o->group && !(o->dtype && qlm_dtype_parse(o->dtype, &want) == 0 && (qlm_dtype_is_block(want) || want == QLM_I8)))
        return qlm_errorf("--group applies to int8 and the block dtypes (--dtype q8_0, q4_0 or q4_1)");
    if (o->group && o->per_channel && want == QLM_I8)
        return qlm_errorf("--per-channel and --group are two scale granularities of int8: give one");
    if (o->distributed && start_ranks(o, cm, &threads, quiet) != 0) return -1;
    quiet |= cm->dist.rank != 0;
    if (!o->distributed) cli_threads_apply(threads, 1, quiet);
    const qlm_backend *be = qlm_backend_by_name(o->device);
    if (!be) return -1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = o->random_weights ? qlm_source_open_random(&cm->src, o->model, o->tokenizer, 0x716c6d)
                               : qlm_source_open(&cm->src, o->model, o->tokenizer);
    if (rc != 0) return -1;
    if (need_tokenizer && !cm->src.tok) {
        qlm_source_close(&cm->src);
        return qlm_errorf("%s: no tokenizer found beside the model; give one with -t", o->model);
    }
    if (chat_template && set_chat_template(o, cm, chat_template) != 0) {
        qlm_source_close(&cm->src);
        return -1;
    }
    /* Weights that need no conversion are read from the file's mapping where nothing writes them
     * and nothing splits them over ranks. */
    qlm_model_options mo = {.dtype = cm->src.stored_dtype, .per_channel = o->per_channel || cm->src.stored_per_channel,
                            .group = o->group, .as_stored = !o->dtype, .act8 = o->act8 == 1,
                            .in_place = !o->own_weights && cm->dist.size == 1,
                            .check_values = !o->random_weights && !o->no_check, .backend = be};
    build_progress progress = {.t0 = qlm_now_s()};
    cli_progress_init(&progress.line, quiet);
    mo.on_layer = on_layer;
    mo.on_layer_user = &progress;
    if (o->dtype) qlm_dtype_parse(o->dtype, &mo.dtype);
    /* INT8 with one scale per group of weights along the row is Q8_0's layout at that group. */
    if (o->dtype && mo.dtype == QLM_I8 && o->group) mo.dtype = QLM_Q8_0;
    if (o->dtype && mo.dtype == QLM_I8) mo.per_channel = o->per_channel;
    if (o->act8 == 1 && !qlm_dtype_is_block(mo.dtype)) {
        qlm_source_close(&cm->src);
        return qlm_errorf("--w8a8 applies to block weights (--dtype q8_0, q4_0 or q4_1; q8_0 is int8 with a scale per "
                          "32 weights); %s has %s",
                          o->model, qlm_dtype_name(mo.dtype));
    }
    if (o->act8 == 1 && be->host_memory && !qlm_matmul_w8a8()) {
        /* Without byte dot products W8A8 is slower than the 16-bit form, and no more accurate. */
        if (!quiet) fprintf(stderr, "qlm: --w8a8: these kernels (%s) have no byte dot products; activations stay 16-bit\n",
                            qlm_matmul_isa());
        mo.act8 = 0;
    }
    /* By default block weights take 8-bit activations where that is faster (the CPU multiplies
     * bytes): 4x prefill and faster decode for +0.1-0.3% perplexity, llama.cpp's own numerics for
     * these types. Not where the weights are written (training, merging): their passes stay 16-bit. */
    if (o->act8 == -1)
        mo.act8 = qlm_dtype_is_block(mo.dtype) && be->host_memory && be->act8_weights && qlm_matmul_w8a8() &&
                  !o->own_weights;
    char panel_path[4400], label[64];
    const int panel_cache = panel_cache_path(o, &mo, panel_path, sizeof panel_path, label, sizeof label);
    if (panel_cache) {
        const char *why;
        cm->panels = qlm_panel_cache_open(panel_path, o->model, label, &why);
        if (why && !quiet)
            fprintf(stderr, "qlm: the weights in %s are stale (%s): making them again\n", panel_path, why);
        mo.panels = cm->panels;
    }
    /* One model is built from the store: copies go as they are converted. */
    qlm_store_read_once(cm->src.store);
    rc = cm->src.is_t5 ? qlm_t5_build(&cm->t5, &cm->src.t5, cm->src.store, &mo)
                           : qlm_model_build(&cm->model, &cm->src.cfg, cm->src.store, &mo);
    cli_progress_break(&progress.line);
    if (rc != 0) {
        qlm_error_context("%s", o->model);
        qlm_source_close(&cm->src);
        qlm_store_free(cm->panels);
        cm->panels = NULL;
        return -1;
    }
    if (panel_cache && !cm->panels) save_panel_cache(o, cm, panel_path, label, quiet);
    /* Unless weights are read in place, the converted ones are all the model needs: release the
     * file mappings (else qlm_source_close does, after the model is freed). */
    if (!in_place_bytes(cm)) {
        qlm_store_free(cm->src.store);
        cm->src.store = NULL;
    }
    cm->loaded = 1;
    if (load_adapters(o, cm) != 0) {
        cli_free_model(cm);
        return -1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!quiet) print_loaded(o, cm, be, (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
    /* Split after the counts above were taken from the whole weights. */
    if (cm->dist.size > 1 &&
        (cm->src.is_t5 ? qlm_errorf("sharded inference runs Llama-family models; %s is T5", o->model)
                       : cli_dist_shard(&cm->dist, &cm->model, o->prefetch)) != 0)
        return -1;
    if (cm->dist.size > 1 && !quiet) {
        double whole = 0;
        for (int u = 0; u < cm->dist.layout.n_units; u++) whole += (double)cm->dist.layout.bytes[u];
        fprintf(stderr, "qlm: weights split over %d ranks (--shard fsdp, prefetch %d): rank 0 keeps %.1f of %.1f MiB\n",
                cm->dist.size, o->prefetch, qlm_shard_memory_now(cm->dist.shard).params_parts / 1048576.0,
                whole / 1048576.0);
    }
    return 0;
}

int cli_load_model(const cli_model_opts *o, cli_model *cm, int need_tokenizer, int quiet) {
    memset(cm, 0, sizeof *cm);
    cm->dist.size = 1;
    if (!o->model) return qlm_errorf("no model given (use -m PATH)");
    char *chat_template = NULL;
    if (o->chat_template && !(chat_template = read_chat_template(o->chat_template))) return -1;
    int rc = load_model(o, cm, need_tokenizer, quiet, chat_template);
    free(chat_template);
    return rc;
}

void cli_free_model(cli_model *cm) {
    if (cm->loaded) qlm_lora_registry_free(&cm->lora);
    if (cm->loaded && cm->src.is_t5) qlm_t5_free(&cm->t5);
    if (cm->loaded && !cm->src.is_t5) {
        cli_dist_unshard(&cm->dist, &cm->model);
        qlm_model_free(&cm->model);
    }
    qlm_source_close(&cm->src);
    qlm_store_free(cm->panels);
    cm->panels = NULL;
    cm->loaded = 0;
    cli_dist_end(&cm->dist);
}

int cli_model_fail(cli_model *cm, const char *cmd) {
    int rc = cli_dist_fail(&cm->dist, cmd);
    cli_free_model(cm);
    return rc;
}

int cli_context_size(const cli_model_opts *o, const cli_model *cm) {
    int ctx = o->ctx > 0 ? o->ctx : 4096, positions = qlm_llama_positions(&cm->model.cfg);
    return ctx < positions ? ctx : positions;
}

int cli_session_init(const cli_model_opts *o, const cli_model *cm, qlm_session *s, int max_new_tokens) {
    int rc = cm->src.is_t5 ? qlm_session_init_t5(s, &cm->t5, cm->src.tok, o->ctx > 0 ? o->ctx : 2048, max_new_tokens + 1)
                           : qlm_session_init(s, &cm->model, cm->src.tok, cli_context_size(o, cm), o->batch);
    if (rc == 0) qlm_session_set_adapter(s, qlm_lora_registry_default(&cm->lora));
    return rc;
}

int cli_require_decoder_only(const cli_model *cm, const char *cmd) {
    if (!cm->src.is_t5) return 0;
    return qlm_errorf("%s is a T5 encoder-decoder; `qlm %s` needs a decoder-only model (T5 runs with generate and "
                      "summarize)", cm->src.path, cmd);
}

static int make_one_dir(const char *path) {
    struct stat st;
    if (mkdir(path, 0755) == 0) return 0;
    if (errno == EEXIST && stat(path, &st) == 0 && !S_ISDIR(st.st_mode))
        return qlm_errorf("%s: exists and is not a folder", path);
    return errno == EEXIST ? 0 : qlm_errorf("%s: cannot create: %s", path, strerror(errno));
}

int cli_make_dir(const char *path) {
    char buf[4200];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return qlm_errorf("%.64s...: path too long", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        int rc = make_one_dir(buf);
        *p = '/';
        if (rc != 0) return -1;
    }
    if (make_one_dir(buf) != 0) return -1;
    /* Long jobs write their results at the end: a folder they cannot write to is found now. */
    char probe[4300];
    snprintf(probe, sizeof probe, "%s/.qlm-write-check-%ld", path, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return qlm_errorf("%s: cannot write there: %s", path, strerror(errno));
    close(fd);
    unlink(probe);
    return 0;
}

int cli_default_model(cli_model_opts *mo, const char *cmd, int quiet) {
    if (mo->model) return 0;
    static char path[4200];
    char dir[4096];
    cache_dir(dir, sizeof dir);
    /* The folder `make run` converts once, else the GGUF setup fetched (read as F32 each time). */
    const char *const names[] = {"SmolLM2-135M-Instruct/model.safetensors", "SmolLM2-135M-Instruct.Q4_1.gguf"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (access(path, R_OK) != 0) continue;
        if (i == 0) *strrchr(path, '/') = 0;
        mo->model = path;
        if (!quiet) fprintf(stderr, "qlm %s: no -m given: the default model, %s\n", cmd, path);
        return 0;
    }
    fprintf(stderr,
            "qlm %s: no -m MODEL given, and the default model (SmolLM2-135M-Instruct) is not in %s: `make run` "
            "(or scripts/setup.sh) fetches it\n",
            cmd, dir);
    return -1;
}

int cli_make_parent_dir(const char *file) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", file);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = 0;
    return cli_make_dir(dir);
}

char *cli_read_text(const char *path, size_t *len) {
    struct stat st;
    if (strcmp(path, "-") != 0 && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        qlm_errorf("%s: is a folder, not a file", path);
        return NULL;
    }
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        qlm_errorf("%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) break;
            buf = b;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) {
                qlm_errorf("%s: read error", path);
                free(buf);
                buf = NULL;
            }
            break;
        }
    }
    if (f != stdin) fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* The adapter_config.json text of the flags (target_modules: a comma list, or "all-linear"). */
/* The shortest decimal that reads back as the same float: a flag parsed as 0.05f is written 0.05,
 * not 0.05000000074505806 (the float's exact value, which is what peft would then show). */
static double float_decimal(double v) {
    float f = (float)v;
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, f);
        if (strtof(buf, NULL) == f) break;
    }
    return strtod(buf, NULL);
}

/* The base as peft's from_pretrained can find it again: the hub id as given, or a local path made
 * absolute. */
static char *base_model_id(const char *model) {
    char real[PATH_MAX];
    return strdup(access(model, F_OK) == 0 && realpath(model, real) ? real : model);
}

char *cli_lora_config_json(const char *base, int rank, double alpha, const char *targets, int rslora, double dropout,
                           int t5) {
    cJSON *root = cJSON_CreateObject();
    char *base_id = base_model_id(base);
    int ok = root && base_id && cJSON_AddStringToObject(root, "peft_type", "LORA") &&
             cJSON_AddStringToObject(root, "base_model_name_or_path", base_id) && cJSON_AddNumberToObject(root, "r", rank) &&
             cJSON_AddNumberToObject(root, "lora_alpha", float_decimal(alpha)) &&
             cJSON_AddBoolToObject(root, "use_rslora", rslora) && cJSON_AddStringToObject(root, "bias", "none") &&
             cJSON_AddNumberToObject(root, "lora_dropout", float_decimal(dropout)) &&
             cJSON_AddStringToObject(root, "task_type", t5 ? "SEQ_2_SEQ_LM" : "CAUSAL_LM");
    free(base_id);
    if (ok && strcmp(targets, "all-linear") == 0) {
        ok = cJSON_AddStringToObject(root, "target_modules", "all-linear") != NULL;
    } else if (ok) {
        cJSON *list = cJSON_AddArrayToObject(root, "target_modules");
        char *copy = strdup(targets);
        ok = list && copy;
        for (char *t = copy ? strtok(copy, ",") : NULL; t && ok; t = strtok(NULL, ","))
            ok = cJSON_AddItemToArray(list, cJSON_CreateString(t));
        free(copy);
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return text;
}
