/* Shared parts of the qlm subcommands: model/sampling flags, loading, parsing numbers. */
#ifndef QLM_CLI_COMMON_H
#define QLM_CLI_COMMON_H

#include <getopt.h>

#include "../runtime/generate.h"
#include "../runtime/json_constraint.h"
#include "../models/model.h"
#include "../models/t5.h"
#include "../lora/lora.h"
#include "../loaders/model_source.h"
#include "dist.h"

/* Long-option ids shared by several commands (values above any short option). */
enum {
    OPT_MODEL = 'm', OPT_TOKENIZER = 't', OPT_PROMPT = 'p', OPT_NTOK = 'n', OPT_HELP = 'h',
    OPT_DTYPE = 256, OPT_PER_CHANNEL, OPT_THREADS, OPT_CTX, OPT_DEVICE, OPT_BATCH,
    OPT_TEMP, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_REPEAT_PENALTY, OPT_REPEAT_LAST_N, OPT_PRESENCE_PENALTY,
    OPT_FREQUENCY_PENALTY, OPT_SEED, OPT_STOP,
    OPT_JSON, OPT_SYSTEM, OPT_NO_BOS, OPT_RAW, OPT_FILE, OPT_REPS, OPT_PP, OPT_TG, OPT_QUIET,
    OPT_NO_SPECIAL, OPT_RANDOM_WEIGHTS, OPT_LORA, OPT_ADAPTER, OPT_INFER_SHARD, OPT_INFER_PREFETCH,
    OPT_INFER_TIMEOUT, OPT_NO_CHECK, OPT_CHAT_TEMPLATE, OPT_GROUP, OPT_W8A8, OPT_NO_W8A8, OPT_NO_PANEL_CACHE, OPT_JSON_OBJECT, OPT_JSON_SCHEMA,
};

#define CLI_MODEL_OPTIONS                                                                                 \
    {"model", required_argument, 0, OPT_MODEL}, {"tokenizer", required_argument, 0, OPT_TOKENIZER},       \
        {"dtype", required_argument, 0, OPT_DTYPE}, {"per-channel", no_argument, 0, OPT_PER_CHANNEL},     \
        {"group", required_argument, 0, OPT_GROUP}, {"w8a8", no_argument, 0, OPT_W8A8},                   \
        {"no-w8a8", no_argument, 0, OPT_NO_W8A8}, {"no-panel-cache", no_argument, 0, OPT_NO_PANEL_CACHE}, \
        {"threads", required_argument, 0, OPT_THREADS}, {"ctx", required_argument, 0, OPT_CTX},         \
        {"ctx-size", required_argument, 0, OPT_CTX},           \
        {"device", required_argument, 0, OPT_DEVICE}, {"chunk", required_argument, 0, OPT_BATCH},        \
        {"random-weights", no_argument, 0, OPT_RANDOM_WEIGHTS}, {"no-check", no_argument, 0, OPT_NO_CHECK}, \
        {"help", no_argument, 0, OPT_HELP}

/* Sharded inference under mpirun, for generate, summarize and serve. */
#define CLI_DIST_OPTIONS                                                                                  \
    {"shard", required_argument, 0, OPT_INFER_SHARD}, {"prefetch", required_argument, 0, OPT_INFER_PREFETCH}, \
        {"dist-timeout", required_argument, 0, OPT_INFER_TIMEOUT}

#define CLI_DIST_HELP                                                                                     \
    "  several processes (mpirun -np N qlm ... --shard fsdp): each rank keeps 1/N of the weights and\n"  \
    "  gathers a layer just before it runs it, so a model larger than one machine's or GPU's memory runs:\n" \
    "      --shard fsdp       split the weights over the ranks (needed when started as several ranks)\n"  \
    "      --prefetch K       layers gathered ahead of their use (default 1)\n"                           \
    "      --dist-timeout S   a rank that waits S seconds for another ends the job (default 600)\n"

/* A chat template file in place of the model's, for the commands that render chats (chat, serve,
 * summarize, train). */
#define CLI_CHAT_TEMPLATE_OPTION {"chat-template", required_argument, 0, OPT_CHAT_TEMPLATE}

#define CLI_CHAT_TEMPLATE_HELP                                                                            \
    "      --chat-template FILE  render chats with the Jinja template in FILE instead of the model's\n"

/* Adapters, for the commands that generate (generate, chat, summarize). */
#define CLI_LORA_OPTIONS {"lora", required_argument, 0, OPT_LORA}, {"adapter", required_argument, 0, OPT_ADAPTER}

#define CLI_LORA_HELP                                                                                     \
    "      --lora NAME=PATH   load the PEFT LoRA adapter folder PATH as NAME (repeatable)\n"              \
    "      --adapter NAME     the adapter to use (default: the first --lora; none: the base model)\n"

/* JSON output, for the commands that generate text for a reader (generate, chat). */
#define CLI_JSON_OPTIONS {"json-object", no_argument, 0, OPT_JSON_OBJECT}, {"json-schema", required_argument, 0, OPT_JSON_SCHEMA}

#define CLI_JSON_HELP                                                                                     \
    "      --json-object      the output is one JSON object (as the server's response_format json_object)\n" \
    "      --json-schema FILE the output is one JSON value the JSON Schema in FILE accepts (the server's\n" \
    "                         json_schema subset; see server/README.md)\n"

#define CLI_SAMPLING_OPTIONS                                                                              \
    {"temp", required_argument, 0, OPT_TEMP}, {"temperature", required_argument, 0, OPT_TEMP},               \
        {"top-k", required_argument, 0, OPT_TOP_K},                 \
        {"top-p", required_argument, 0, OPT_TOP_P}, {"repeat-penalty", required_argument, 0, OPT_REPEAT_PENALTY}, \
        {"repeat-last-n", required_argument, 0, OPT_REPEAT_LAST_N}, {"seed", required_argument, 0, OPT_SEED}, \
        {"min-p", required_argument, 0, OPT_MIN_P}, {"presence-penalty", required_argument, 0, OPT_PRESENCE_PENALTY}, \
        {"frequency-penalty", required_argument, 0, OPT_FREQUENCY_PENALTY},                                   \
        {"max-tokens", required_argument, 0, OPT_NTOK}, {"stop", required_argument, 0, OPT_STOP}

#define CLI_MODEL_HELP                                                                                    \
    "  -m, --model PATH       model folder, .safetensors, .gguf or llama2.c .bin\n"                       \
    "  -t, --tokenizer PATH   tokenizer.json, tokenizer.bin or .gguf (default: beside the model)\n"       \
    "      --dtype D          weight dtype: f32, bf16, f16, int8, or a block type: q8_0, q4_0 (also\n"  \
    "                         int4), q4_1 (default: each tensor as stored)\n"                          \
    "      --per-channel      int8 with one scale per output channel\n"                                   \
    "      --group N          weights per block of a block type: 32, 64 or 128 (default 32); int8\n"    \
    "                         with --group N is q8_0 with blocks of N\n"                                \
    "      --w8a8, --no-w8a8  block weights (q8_0, q4_0, q4_1) multiply activations quantized to 8 bits\n" \
    "                         per 32 values, as llama.cpp does (default: on with AVX2 or AVX-512:\n" \
    "                         1.7-4x prefill, faster decode, perplexity +0.1-0.3%)\n" \
    "      --no-panel-cache   W8A8 repacks the weights into panels, and --dtype int8 (bf16, ...) converts\n" \
    "                         them; for 32 MiB or more of such weights the first load keeps them in\n"  \
    "                         $QLM_CACHE/panels and later loads map that file (as fast as weights read\n" \
    "                         in place): this flag neither reads nor writes it\n"                       \
    "      --threads N        CPU threads (default: the cores other programs leave free, divided among\n" \
    "                         the ranks of an mpirun job)\n"                                            \
    "      --ctx N            context window in tokens (also -c, --ctx-size; default: min(model, 4096))\n"   \
    "      --chunk N          tokens per forward pass during prefill (default 512)\n"                     \
    "      --device D         cpu, cuda or auto (default auto)\n"                                       \
    "      --random-weights   random weights of the shape in MODEL/config.json (for speed measurements)\n" \
    "      --no-check         skip the load-time check for NaN/Inf weights and bad INT8 scales\n"

#define CLI_SAMPLING_HELP                                                                                 \
    "  -n, --max-tokens N     tokens to generate (default 256)\n"                                         \
    "      --temp T           temperature (also --temperature); 0 is greedy (default 0.7)\n"                                   \
    "      --top-k K          sample among the K most likely tokens; 0 = all (default 40)\n"              \
    "      --top-p P          nucleus sampling threshold (default 0.9)\n"                                 \
    "      --repeat-penalty R penalty for recent tokens; 1 = off (default 1)\n"                           \
    "      --repeat-last-n N  how many recent tokens the penalty sees (default 64)\n"                     \
    "      --presence-penalty P, --frequency-penalty F  OpenAI's: logit -= F * count + P, for each token\n" \
    "                         generated so far (-2..2; default 0)\n"                                    \
    "      --min-p P          drop tokens below P times the likeliest one's probability (default 0)\n"   \
    "      --seed S           random seed (default: from the clock)\n"                                    \
    "      --stop STR         stop when STR is generated (repeatable)\n"

enum { CLI_MAX_LORA = 32 };

typedef struct {
    const char *model, *tokenizer, *dtype, *device;
    const char *chat_template; /* --chat-template FILE */
    int per_channel, group, threads, ctx, batch, random_weights, no_check, no_panel_cache;
    /* W8A8: 1 (--w8a8), 0 (--no-w8a8), or -1 (default): on for block weights where the CPU has byte
     * dot products and the command does not write the weights (own_weights). */
    int act8;
    /* the command writes into the weights (merging, training) or splits them over ranks (training):
     * the model holds them in its own buffers, none read in place */
    int own_weights;
    const char *lora[CLI_MAX_LORA]; /* "NAME=PATH" */
    int n_lora;
    const char *adapter;
    /* Commands that run as several ranks (CLI_DIST_OPTIONS) set distributed. */
    int distributed, shard, prefetch;
    float dist_timeout;
} cli_model_opts;

typedef struct {
    qlm_gen_params gen;
    const char *stops[16];
    int json_object;          /* --json-object */
    const char *json_schema;  /* --json-schema FILE */
    qlm_json_grammar *json;   /* either, compiled (gen.json points here once the vocabulary is indexed) */
    qlm_json_vocab *json_vocab;
} cli_sampling_opts;

void cli_model_opts_init(cli_model_opts *o);
void cli_sampling_opts_init(cli_sampling_opts *s);
/* 1 if opt was a model/sampling flag and was stored, 0 if not one, -1 on a bad value (message printed). */
int cli_model_flag(cli_model_opts *o, int opt, const char *arg);
/* The same for --lora / --adapter. */
int cli_lora_flag(cli_model_opts *o, int opt, const char *arg);
/* Any of the three kinds, for the commands that generate (generate, chat, summarize). */
int cli_generation_flag(cli_model_opts *mo, cli_sampling_opts *so, int opt, const char *arg);
int cli_sampling_flag(cli_sampling_opts *s, int opt, const char *arg);
/* --json-object and --json-schema FILE: 1 if opt was one and was stored, 0 if not. */
int cli_json_flag(cli_sampling_opts *s, int opt, const char *arg);
/* Compiles the JSON output asked for (none: nothing to do), before the model loads so that a bad
 * schema fails at once; an error names the file and the keyword. */
int cli_json_compile(cli_sampling_opts *s);
/* Indexes tok's vocabulary for the compiled grammar and puts both into s->gen. */
int cli_json_ready(cli_sampling_opts *s, const qlm_tokenizer *tok);
void cli_json_free(cli_sampling_opts *s);

/* Generated text as it comes (a qlm_emit_fn's user): written to stdout, and/or kept in buf
 * (NUL-terminated, malloc'd) for an answer printed whole (--json) or remembered (a chat turn). */
typedef struct {
    char *buf;
    size_t len, cap;
    int to_stdout, keep;
} cli_text_out;
int cli_emit_text(void *user, const char *text, size_t len);

/* Strict number parsing with a message naming the flag. */
int cli_int(const char *flag, const char *arg, long min, long max, int *out);
int cli_float(const char *flag, const char *arg, double min, double max, float *out);
int cli_double(const char *flag, const char *arg, double min, double max, double *out);

typedef struct {
    qlm_source src;
    qlm_tensor_store *panels; /* the panel cache file's W8A8 weights, read in place, or NULL */
    qlm_model model;  /* decoder-only models, or */
    qlm_t5_model t5;  /* encoder-decoders (src.is_t5) */
    qlm_lora_registry lora; /* the --lora adapters; its default is the one in use */
    int loaded;
    cli_dist dist;    /* the job's ranks (one when started alone); with --shard, the weights' split */
} cli_model;

/* Opens the model named by o->model, builds it in the chosen dtype, loads the --lora adapters and
 * picks the --adapter, prints a load line to stderr unless quiet. A --chat-template file is read
 * and parsed first (an error names its line and column) and replaces the tokenizer's template.
 * need_tokenizer: fail if none was found. With o->distributed: started as several ranks, the world opens first and, with
 * --shard fsdp, the weights are split over it (only rank 0 prints). On failure the caller ends
 * with cli_model_fail, which stops every rank; cli_free_model also closes the world. */
int cli_load_model(const cli_model_opts *o, cli_model *cm, int need_tokenizer, int quiet);
/* Bytes of a loaded model's weights by where they lie: read where the model file is mapped, where
 * the W8A8 panel cache file is mapped (both pages the kernel can drop and read again), and in
 * buffers qlm allocated (converted, repacked or copied). */
void cli_weight_bytes(cli_model *cm, size_t *file, size_t *cache, size_t *owned);
void cli_free_model(cli_model *cm);
/* How the loaded model (decoder or T5) stores its matrices. */
static inline const qlm_weight_format *cli_model_format(const cli_model *cm) {
    return cm->src.is_t5 ? &cm->t5.fmt : &cm->model.fmt;
}
/* "dtype[ per-channel][ w8a8]": the load line's and `qlm info`'s words for the weights. */
void cli_format_words(const qlm_weight_format *f, char *buf, size_t cap);
/* cli_fail, and with several ranks the whole job's end (the others would wait for this one). */
int cli_model_fail(cli_model *cm, const char *cmd);
/* Whether this process is the job's first rank (the one that reads requests and prints). */
static inline int cli_is_root(const cli_model *cm) { return cm->dist.rank == 0; }
int cli_context_size(const cli_model_opts *o, const cli_model *cm);
/* A generation session for either architecture, with room for max_new_tokens outputs (T5's
 * input window is --ctx, default 2048). */
int cli_session_init(const cli_model_opts *o, const cli_model *cm, qlm_session *s, int max_new_tokens);
/* For the commands that chat: the chat template in use parses (an error says how to give one),
 * and unless quiet a line on stderr says which it is. */
int cli_chat_template_ready(const cli_model_opts *o, const cli_model *cm, int quiet);
/* For commands that need a decoder-only model: an error naming cmd for T5 models. */
int cli_require_decoder_only(const cli_model *cm, const char *cmd);

/* Prints "qlm <cmd>: <qlm_last_error()>" to stderr; returns 1 (the exit status). */
int cli_fail(const char *cmd);
/* Reports an unknown flag / missing value from getopt; returns 2. */
int cli_usage_error(const char *cmd, const char *usage);

/* adapter_config.json text for a new adapter (targets: a comma list of module names, or
 * "all-linear"; task_type from the architecture), or NULL when out of memory. */
char *cli_lora_config_json(const char *base, int rank, double alpha, const char *targets, int rslora, double dropout,
                           int t5);

/* Creates the folder path and its missing parents (fine if it is one already) and checks that a
 * file can be written in it; an error names a file in the way or the reason. */
int cli_make_dir(const char *path);
/* Without -m: the embedded default model from $QLM_CACHE (default ~/.cache/qlm), said on stderr
 * unless quiet; -1 with a message on how to fetch it when it is not there. */
int cli_default_model(cli_model_opts *mo, const char *cmd, int quiet);
/* cli_make_dir for the folder that will hold file. */
int cli_make_parent_dir(const char *file);
/* Reads a whole file ("-" = stdin) into a malloc'd NUL-terminated string. */
char *cli_read_text(const char *path, size_t *len);

#endif
