/* qlm train: fine-tune a Llama-family model on JSONL data (LoRA, full, or quantization-aware),
 * with progress, metrics.jsonl and a loss-curve picture, atomic checkpoints and exact --resume. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../core/error.h"
#include "../loaders/atomic_file.h"
#include "../loaders/safetensors.h"
#include "../train/data.h"
#include "../train/metrics.h"
#include "../train/trainer.h"
#include "commands.h"
#include "common.h"
#include "model_folder.h"

static const char k_usage[] =
    "usage: qlm train -m MODEL --data TRAIN.jsonl --out DIR [options]\n"
    "Fine-tunes MODEL on JSONL examples: {\"prompt\",\"completion\"}, {\"messages\":[...]} (the model's chat\n"
    "template), or any fields through --target-field and --template (DialogSum: --target-field summary).\n"
    "The loss is on completion / assistant / target tokens only.\n"
    "  -m, --model PATH         model folder, .safetensors, .gguf or llama2.c .bin\n"
    "  -t, --tokenizer PATH     tokenizer.json, tokenizer.bin or .gguf (default: beside the model)\n"
    "      --data FILE          training examples (JSONL)\n"
    "  -o, --out DIR            outputs: adapter/ or model/, metrics.jsonl, loss_curve.svg, checkpoints\n"
    "      --eval FILE          held-out examples (default: --eval-fraction of the training file)\n"
    "      --eval-fraction F    share of the training file held out when no --eval (default 0)\n"
    "      --eval-every N       evaluate every N steps and at the end (default 50)\n"
    "      --eval-max N         evaluate on at most N examples (default 200)\n"
    "  what trains (default --lora):\n"
    "      --lora               a LoRA adapter; the base stays frozen in --base-dtype\n"
    "      --rank R             LoRA rank (default 8)\n"
    "      --alpha A            LoRA alpha (default 2 x rank)\n"
    "      --lora-dropout P     dropout on each adapted module's input (default 0.05)\n"
    "      --targets LIST       modules, e.g. q_proj,v_proj, or all-linear (default all-linear)\n"
    "      --rslora             scale alpha / sqrt(r)\n"
    "      --full               every weight (F32 master weights)\n"
    "      --qat                every weight, fake-quantized to INT8 with learned scales (LSQ)\n"
    "      --per-channel        QAT: one scale per output channel\n"
    "  how long and how fast:\n"
    "      --steps N            optimizer steps (default: one epoch)\n"
    "      --epochs E           passes over the data (when --steps is not given)\n"
    "      --batch B            sequences per micro-batch (default 4)\n"
    "      --accum K            micro-batches per step (default 1)\n"
    "      --seq-len T          longest sequence; longer examples lose prompt tokens first (default 512)\n"
    "      --pack               pack several short examples into each sequence\n"
    "      --lr LR              peak learning rate (default 2e-4 LoRA, 2e-5 full/QAT)\n"
    "      --schedule S         cosine, linear or constant (default cosine)\n"
    "      --warmup N           linear warm-up steps (default 0)\n"
    "      --min-lr-ratio R     the schedule ends at LR x R (default 0.1)\n"
    "      --weight-decay W     AdamW decoupled weight decay on matrices (default 0.01)\n"
    "      --clip C             clip the global gradient norm to C; 0 = off (default 1)\n"
    "      --dtype D            compute precision: f32, bf16 or f16 (f16 uses dynamic loss scaling)\n"
    "      --base-dtype D       LoRA: the frozen base's dtype: f32, bf16, f16 or int8 (default: --dtype)\n"
    "      --recompute          recompute each layer's activations in the backward (less memory)\n"
    "  data:\n"
    "      --target-field F     template mode: F is the completion, the prompt is --template\n"
    "      --template TEXT      prompt with {field} placeholders (default: the DialogSum lab prompt)\n"
    "      --chat               template mode through the model's chat template (user -> assistant)\n"
    "  runs:\n"
    "      --save-every N       checkpoint every N steps and at the end (default 50)\n"
    "      --resume             continue from the checkpoint in DIR, exactly where it stopped\n"
    "      --seed S             data order, adapter init and dropout (default 1)\n"
    "      --threads N          CPU threads (default: all cores)\n"
    "      --device D           cpu (default)\n"
    "      --random-weights     random weights of the shape in MODEL/config.json (for speed measurements)\n";

enum {
    OPT_DATA = 1200, OPT_OUT_DIR, OPT_EVAL, OPT_EVAL_FRACTION, OPT_EVAL_EVERY, OPT_EVAL_MAX, OPT_MODE_LORA, OPT_RANK,
    OPT_ALPHA, OPT_LORA_DROPOUT, OPT_TARGETS, OPT_RSLORA, OPT_MODE_FULL, OPT_MODE_QAT, OPT_PER_CH, OPT_STEPS,
    OPT_EPOCHS, OPT_TBATCH, OPT_ACCUM, OPT_SEQ_LEN, OPT_PACK, OPT_LR, OPT_SCHEDULE, OPT_WARMUP, OPT_MIN_LR,
    OPT_WD, OPT_CLIP, OPT_TDTYPE, OPT_BASE_DTYPE, OPT_RECOMPUTE, OPT_TARGET_FIELD, OPT_TEMPLATE, OPT_CHAT,
    OPT_SAVE_EVERY, OPT_RESUME, OPT_TSEED, OPT_TTHREADS, OPT_TDEVICE, OPT_RANDOM,
};

typedef struct {
    const char *model, *tokenizer, *data, *out, *eval, *targets, *target_field, *template_text, *base_dtype, *device;
    double eval_fraction;
    int eval_every, eval_max, rank, rslora, per_channel, steps, epochs, batch, accum, seq_len, pack, warmup;
    int recompute, chat, save_every, resume, seed, threads, random_weights;
    float alpha, lora_dropout, lr, min_lr_ratio, weight_decay, clip;
    qlm_train_mode mode;
    qlm_lr_schedule schedule;
    qlm_dtype dtype;
} train_args;

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static int parse_args(int argc, char **argv, train_args *a) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"tokenizer", required_argument, 0, 't'},
        {"data", required_argument, 0, OPT_DATA},
        {"out", required_argument, 0, 'o'}, {"eval", required_argument, 0, OPT_EVAL},
        {"eval-fraction", required_argument, 0, OPT_EVAL_FRACTION}, {"eval-every", required_argument, 0, OPT_EVAL_EVERY},
        {"eval-max", required_argument, 0, OPT_EVAL_MAX}, {"lora", no_argument, 0, OPT_MODE_LORA},
        {"rank", required_argument, 0, OPT_RANK}, {"alpha", required_argument, 0, OPT_ALPHA},
        {"lora-dropout", required_argument, 0, OPT_LORA_DROPOUT}, {"targets", required_argument, 0, OPT_TARGETS},
        {"rslora", no_argument, 0, OPT_RSLORA}, {"full", no_argument, 0, OPT_MODE_FULL},
        {"qat", no_argument, 0, OPT_MODE_QAT}, {"per-channel", no_argument, 0, OPT_PER_CH},
        {"steps", required_argument, 0, OPT_STEPS}, {"epochs", required_argument, 0, OPT_EPOCHS},
        {"batch", required_argument, 0, OPT_TBATCH}, {"accum", required_argument, 0, OPT_ACCUM},
        {"seq-len", required_argument, 0, OPT_SEQ_LEN}, {"pack", no_argument, 0, OPT_PACK},
        {"lr", required_argument, 0, OPT_LR}, {"schedule", required_argument, 0, OPT_SCHEDULE},
        {"warmup", required_argument, 0, OPT_WARMUP}, {"min-lr-ratio", required_argument, 0, OPT_MIN_LR},
        {"weight-decay", required_argument, 0, OPT_WD}, {"clip", required_argument, 0, OPT_CLIP},
        {"dtype", required_argument, 0, OPT_TDTYPE}, {"base-dtype", required_argument, 0, OPT_BASE_DTYPE},
        {"recompute", no_argument, 0, OPT_RECOMPUTE}, {"target-field", required_argument, 0, OPT_TARGET_FIELD},
        {"template", required_argument, 0, OPT_TEMPLATE}, {"chat", no_argument, 0, OPT_CHAT},
        {"save-every", required_argument, 0, OPT_SAVE_EVERY}, {"resume", no_argument, 0, OPT_RESUME},
        {"seed", required_argument, 0, OPT_TSEED}, {"threads", required_argument, 0, OPT_TTHREADS},
        {"device", required_argument, 0, OPT_TDEVICE}, {"random-weights", no_argument, 0, OPT_RANDOM},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *a = (train_args){.eval_every = 50, .eval_max = 200, .rank = 8, .lora_dropout = 0.05f, .targets = "all-linear",
                      .batch = 4, .accum = 1, .seq_len = 512, .lr = -1, .min_lr_ratio = 0.1f, .weight_decay = 0.01f,
                      .clip = 1.0f, .save_every = 50, .seed = 1, .mode = QLM_TRAIN_LORA,
                      .schedule = QLM_SCHEDULE_COSINE, .dtype = QLM_F32, .device = "cpu"};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:o:h", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': a->model = optarg; break;
        case 't': a->tokenizer = optarg; break;
        case OPT_DATA: a->data = optarg; break;
        case 'o': a->out = optarg; break;
        case OPT_EVAL: a->eval = optarg; break;
        case OPT_EVAL_FRACTION: {
            float f;
            bad = cli_float("--eval-fraction", optarg, 0, 0.5, &f);
            a->eval_fraction = f;
            break;
        }
        case OPT_EVAL_EVERY: bad = cli_int("--eval-every", optarg, 1, 1 << 30, &a->eval_every); break;
        case OPT_EVAL_MAX: bad = cli_int("--eval-max", optarg, 1, 1 << 30, &a->eval_max); break;
        case OPT_MODE_LORA: a->mode = QLM_TRAIN_LORA; break;
        case OPT_RANK: bad = cli_int("--rank", optarg, 1, 4096, &a->rank); break;
        case OPT_ALPHA: bad = cli_float("--alpha", optarg, 1e-6, 1e6, &a->alpha); break;
        case OPT_LORA_DROPOUT: bad = cli_float("--lora-dropout", optarg, 0, 0.9, &a->lora_dropout); break;
        case OPT_TARGETS: a->targets = optarg; break;
        case OPT_RSLORA: a->rslora = 1; break;
        case OPT_MODE_FULL: a->mode = QLM_TRAIN_FULL; break;
        case OPT_MODE_QAT: a->mode = QLM_TRAIN_QAT; break;
        case OPT_PER_CH: a->per_channel = 1; break;
        case OPT_STEPS: bad = cli_int("--steps", optarg, 1, 1 << 30, &a->steps); break;
        case OPT_EPOCHS: bad = cli_int("--epochs", optarg, 1, 100000, &a->epochs); break;
        case OPT_TBATCH: bad = cli_int("--batch", optarg, 1, 4096, &a->batch); break;
        case OPT_ACCUM: bad = cli_int("--accum", optarg, 1, 4096, &a->accum); break;
        case OPT_SEQ_LEN: bad = cli_int("--seq-len", optarg, 2, 1 << 20, &a->seq_len); break;
        case OPT_PACK: a->pack = 1; break;
        case OPT_LR: bad = cli_float("--lr", optarg, 0, 10, &a->lr); break;
        case OPT_SCHEDULE:
            if (strcmp(optarg, "cosine") == 0) a->schedule = QLM_SCHEDULE_COSINE;
            else if (strcmp(optarg, "linear") == 0) a->schedule = QLM_SCHEDULE_LINEAR;
            else if (strcmp(optarg, "constant") == 0) a->schedule = QLM_SCHEDULE_CONSTANT;
            else bad = fprintf(stderr, "qlm train: --schedule must be cosine, linear or constant\n") > 0;
            break;
        case OPT_WARMUP: bad = cli_int("--warmup", optarg, 0, 1 << 30, &a->warmup); break;
        case OPT_MIN_LR: bad = cli_float("--min-lr-ratio", optarg, 0, 1, &a->min_lr_ratio); break;
        case OPT_WD: bad = cli_float("--weight-decay", optarg, 0, 10, &a->weight_decay); break;
        case OPT_CLIP: bad = cli_float("--clip", optarg, 0, 1e6, &a->clip); break;
        case OPT_TDTYPE:
            if (qlm_dtype_parse(optarg, &a->dtype) != 0 || a->dtype == QLM_I8)
                bad = fprintf(stderr, "qlm train: --dtype must be f32, bf16 or f16\n") > 0;
            break;
        case OPT_BASE_DTYPE: a->base_dtype = optarg; break;
        case OPT_RECOMPUTE: a->recompute = 1; break;
        case OPT_TARGET_FIELD: a->target_field = optarg; break;
        case OPT_TEMPLATE: a->template_text = optarg; break;
        case OPT_CHAT: a->chat = 1; break;
        case OPT_SAVE_EVERY: bad = cli_int("--save-every", optarg, 1, 1 << 30, &a->save_every); break;
        case OPT_RESUME: a->resume = 1; break;
        case OPT_TSEED: bad = cli_int("--seed", optarg, 0, 2147483647, &a->seed); break;
        case OPT_TTHREADS: bad = cli_int("--threads", optarg, 1, 1024, &a->threads); break;
        case OPT_TDEVICE: a->device = optarg; break;
        case OPT_RANDOM: a->random_weights = 1; break;
        case 'h': fputs(k_usage, stdout); exit(0);
        default: return cli_usage_error("train", k_usage);
        }
        if (bad) return 2;
    }
    if (!a->model || !a->data || !a->out || optind != argc) {
        fprintf(stderr, "qlm train: need -m MODEL, --data FILE and --out DIR\n");
        return cli_usage_error("train", k_usage);
    }
    if (a->lr < 0) a->lr = a->mode == QLM_TRAIN_LORA ? 2e-4f : 2e-5f;
    if (a->alpha <= 0) a->alpha = 2.0f * a->rank;
    if (a->mode == QLM_TRAIN_QAT && a->dtype != QLM_F32) {
        fprintf(stderr, "qlm train: --qat computes in f32 (the fake-quantized weights)\n");
        return 2;
    }
    return 0;
}

/* The settings a resumed run must share with the run it continues. */
static char *fingerprint(const train_args *a) {
    char buf[8192], data[4096];
    if (!realpath(a->data, data)) snprintf(data, sizeof data, "%s", a->data);
    snprintf(buf, sizeof buf, "mode=%d data=%s rank=%d alpha=%g targets=%s rslora=%d batch=%d accum=%d seq=%d pack=%d "
             "lr=%g schedule=%d warmup=%d steps=%d epochs=%d dtype=%d seed=%d per_channel=%d dropout=%g",
             a->mode, data, a->rank, a->alpha, a->targets, a->rslora, a->batch, a->accum, a->seq_len, a->pack,
             a->lr, a->schedule, a->warmup, a->steps, a->epochs, a->dtype, a->seed, a->per_channel, a->lora_dropout);
    return strdup(buf);
}

/* Rows of one micro-batch, built from examples (or packed sequences). An encoder-decoder (t5 set)
 * reads each example's prompt tokens plus EOS as its input and decodes its targets. */
typedef struct {
    int t5, eos, decoder_start;
    int *start, *len, *ids, *pos, *targets, *src_start, *src_len, *src_ids;
    qlm_train_batch b;
} batch_buf;

static int batch_buf_init(batch_buf *bb, int n_seq, int seq_len, const cli_model *cm) {
    memset(bb, 0, sizeof *bb);
    size_t rows = (size_t)n_seq * (seq_len + 1);
    bb->t5 = cm->src.is_t5;
    bb->eos = cm->src.t5.eos_id;
    bb->decoder_start = cm->src.t5.decoder_start_id;
    int **arrays[] = {&bb->start, &bb->len, &bb->src_start, &bb->src_len};
    for (size_t i = 0; i < 4; i++)
        if (!(*arrays[i] = malloc((size_t)n_seq * sizeof(int)))) return qlm_errorf("out of memory");
    int **rowsets[] = {&bb->ids, &bb->pos, &bb->targets, &bb->src_ids};
    for (size_t i = 0; i < 4; i++)
        if (!(*rowsets[i] = malloc(rows * sizeof(int)))) return qlm_errorf("out of memory");
    return 0;
}

static void batch_buf_free(batch_buf *bb) {
    free(bb->start), free(bb->len), free(bb->ids), free(bb->pos), free(bb->targets);
    free(bb->src_start), free(bb->src_len), free(bb->src_ids);
}

static void batch_begin(batch_buf *bb) {
    bb->b = (qlm_train_batch){.start = bb->start, .len = bb->len, .ids = bb->ids, .pos = bb->pos, .targets = bb->targets};
    if (bb->t5) bb->b.src_start = bb->src_start, bb->b.src_len = bb->src_len, bb->b.src_ids = bb->src_ids;
}

/* Appends one example. Decoder-only: row t predicts ids[t + 1] where target[t + 1] is set.
 * Encoder-decoder: the input is the tokens before the first target and EOS; the decoder reads
 * decoder_start and the targets shifted right, and predicts the targets. */
static void batch_add(batch_buf *bb, const int *ids, const unsigned char *target, int len) {
    int s = bb->b.n_seq++, r0 = bb->b.n_rows;
    bb->start[s] = r0;
    if (!bb->t5) {
        bb->len[s] = len;
        for (int t = 0; t < len; t++) {
            bb->ids[r0 + t] = ids[t];
            bb->pos[r0 + t] = t;
            bb->targets[r0 + t] = t + 1 < len && target[t + 1] ? ids[t + 1] : -1;
        }
        bb->b.n_rows += len;
        return;
    }
    int first = 1;
    while (first < len && !target[first]) first++;
    int s0 = bb->b.n_src_rows;
    bb->src_start[s] = s0;
    bb->src_len[s] = first + 1;
    memcpy(bb->src_ids + s0, ids, (size_t)first * sizeof *ids);
    bb->src_ids[s0 + first] = bb->eos;
    bb->b.n_src_rows += first + 1;
    bb->len[s] = len - first;
    for (int t = 0; t < len - first; t++) {
        bb->ids[r0 + t] = t == 0 ? bb->decoder_start : ids[first + t - 1];
        bb->pos[r0 + t] = t;
        bb->targets[r0 + t] = target[first + t] ? ids[first + t] : -1;
    }
    bb->b.n_rows += len - first;
}

/* The next micro-batch from the data stream. */
static int next_micro(batch_buf *bb, const train_args *a, const qlm_train_set *set, qlm_train_cursor *cur, int *idx,
                      int *pack_ids, unsigned char *pack_target) {
    batch_begin(bb);
    if (a->pack) {
        for (int k = 0; k < a->batch; k++) {
            int len = qlm_train_next_packed(cur, set, a->seq_len, pack_ids, pack_target, NULL);
            if (len < 0) return -1;
            batch_add(bb, pack_ids, pack_target, len);
        }
        return 0;
    }
    if (qlm_train_next_batch(cur, set->n, a->batch, idx) != 0) return -1;
    for (int k = 0; k < a->batch; k++) batch_add(bb, set->ex[idx[k]].ids, set->ex[idx[k]].target, set->ex[idx[k]].len);
    return 0;
}

static double eval_loss(qlm_trainer *t, const qlm_train_set *ev, int max_examples, batch_buf *bb, int batch) {
    double loss = 0;
    long n_targets = 0;
    int n = ev->n < max_examples ? ev->n : max_examples;
    for (int i = 0; i < n; i += batch) {
        batch_begin(bb);
        for (int k = i; k < n && k < i + batch; k++) batch_add(bb, ev->ex[k].ids, ev->ex[k].target, ev->ex[k].len);
        if (qlm_trainer_eval(t, &bb->b, &loss, &n_targets) != 0) return NAN;
    }
    return n_targets ? loss / (double)n_targets : NAN;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

static void format_eta(char *buf, size_t cap, double s) {
    if (!isfinite(s) || s < 0) snprintf(buf, cap, "?");
    else if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
}

/* The checkpoint's caller state: where the data stream is, and the settings it was made with. */
/* Totals over the whole run, resumed parts included (kept in checkpoints). */
typedef struct {
    double elapsed_s, tokens;
} run_totals;

static char *checkpoint_state(const qlm_train_cursor *cur, const char *fp, const run_totals *tot) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "data_seed", (double)cur->seed);
    cJSON_AddNumberToObject(j, "data_epoch", cur->epoch);
    cJSON_AddNumberToObject(j, "data_index", cur->index);
    cJSON_AddNumberToObject(j, "elapsed_s", tot->elapsed_s);
    cJSON_AddNumberToObject(j, "tokens", tot->tokens);
    cJSON_AddStringToObject(j, "settings", fp);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

static int restore_state(const char *json, qlm_train_cursor *cur, const char *fp, run_totals *tot, const char *dir) {
    cJSON *j = json ? cJSON_Parse(json) : NULL;
    const cJSON *seed = cJSON_GetObjectItem(j, "data_seed"), *ep = cJSON_GetObjectItem(j, "data_epoch"),
                *ix = cJSON_GetObjectItem(j, "data_index"), *el = cJSON_GetObjectItem(j, "elapsed_s"),
                *tk = cJSON_GetObjectItem(j, "tokens"),
                *set = cJSON_GetObjectItem(j, "settings");
    int rc = 0;
    if (!cJSON_IsNumber(seed) || !cJSON_IsNumber(ep) || !cJSON_IsNumber(ix) || !cJSON_IsString(set))
        rc = qlm_errorf("%s/checkpoint.json: the data position is missing", dir);
    else if (strcmp(set->valuestring, fp) != 0)
        rc = qlm_errorf("%s/checkpoint.json: made with other settings (%s); resume with the same flags or use a new --out",
                        dir, set->valuestring);
    else {
        cur->seed = (uint64_t)seed->valuedouble;
        cur->epoch = ep->valueint;
        cur->index = ix->valueint;
        tot->elapsed_s = cJSON_IsNumber(el) ? el->valuedouble : 0;
        tot->tokens = cJSON_IsNumber(tk) ? tk->valuedouble : 0;
    }
    cJSON_Delete(j);
    return rc;
}

/* The trained result: the adapter in PEFT's format, or the model folder (QAT: F32 latent weights
 * plus qat_scales.safetensors for `qlm quantize --from-qat`). */
static int write_outputs(const train_args *a, qlm_trainer *t, cli_model *cm) {
    char path[4096];
    if (a->mode == QLM_TRAIN_LORA) {
        snprintf(path, sizeof path, "%s/adapter", a->out);
        if (qlm_lora_save(t->lora, path) != 0) return -1;
        fprintf(stderr, "qlm train: adapter written to %s (load it with --lora NAME=%s)\n", path, path);
        return 0;
    }
    snprintf(path, sizeof path, "%s/model", a->out);
    if (cli_write_model_folder(cm, path) != 0) return -1;
    if (a->mode == QLM_TRAIN_QAT) {
        qlm_tensor_store *store = qlm_store_new();
        int rc = store ? 0 : qlm_errorf("out of memory");
        for (int i = 0; i < t->n_t && rc == 0; i++) {
            const qlm_train_tensor *e = &t->t[i];
            if (e->qat_scale_of < 0) continue;
            int64_t shape[1] = {e->rows};
            if (!qlm_store_add(store, e->name, QLM_F32, 1, shape, e->p, (size_t)e->n * sizeof(float))) rc = -1;
        }
        char scales[4200];
        snprintf(scales, sizeof scales, "%s/qat_scales.safetensors", path);
        const char *meta[] = {"qlm.qat", a->per_channel ? "per-channel" : "per-tensor", NULL};
        if (rc == 0) rc = qlm_safetensors_save(scales, store, meta);
        qlm_store_free(store);
        if (rc != 0) return -1;
        fprintf(stderr, "qlm train: QAT model written to %s; make the INT8 model with qlm quantize --from-qat %s OUT\n",
                path, path);
        return 0;
    }
    fprintf(stderr, "qlm train: model written to %s\n", path);
    return 0;
}

/* DIR/summary.json: what the finished run did, for scripts and benchmark tables. */
static int write_summary(const train_args *a, const qlm_trainer *t, const run_totals *tot, double loss, double eval) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "mode", a->mode == QLM_TRAIN_LORA ? "lora" : a->mode == QLM_TRAIN_FULL ? "full" : "qat");
    cJSON_AddNumberToObject(j, "steps", (double)t->step);
    cJSON_AddNumberToObject(j, "tokens", tot->tokens);
    cJSON_AddNumberToObject(j, "train_seconds", tot->elapsed_s);
    cJSON_AddNumberToObject(j, "tokens_per_s", tot->elapsed_s > 0 ? tot->tokens / tot->elapsed_s : 0);
    cJSON_AddNumberToObject(j, "peak_rss_mib", peak_rss_mib());
    cJSON_AddNumberToObject(j, "activation_mib", qlm_trainer_activation_bytes(t) / 1048576.0);
    if (isfinite(loss)) cJSON_AddNumberToObject(j, "last_loss", loss);
    if (isfinite(eval)) cJSON_AddNumberToObject(j, "last_eval_loss", eval);
    char *text = cJSON_Print(j), path[4200];
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/summary.json", a->out);
    int rc = text ? qlm_atomic_write_text(path, text) : qlm_errorf("out of memory");
    free(text);
    return rc;
}

int cmd_train(int argc, char **argv) {
    train_args a;
    int prc = parse_args(argc, argv, &a);
    if (prc) return prc;
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    mo.model = a.model;
    mo.tokenizer = a.tokenizer;
    mo.random_weights = a.random_weights;
    mo.device = a.device;
    mo.threads = a.threads;
    mo.dtype = a.mode == QLM_TRAIN_LORA ? (a.base_dtype ? a.base_dtype : qlm_dtype_name(a.dtype)) : "f32";
    cli_model cm;
    if (cli_load_model(&mo, &cm, 1, 0) != 0) return cli_fail("train");
    int t5 = cm.src.is_t5;
    if (t5 && a.pack) {
        cli_free_model(&cm);
        fprintf(stderr, "qlm train: --pack is for decoder-only models\n");
        return 2;
    }
    int rc = 1;
    qlm_train_set train = {0}, eval = {0};
    qlm_lora_adapter adapter = {0};
    qlm_trainer t = {0};
    qlm_train_log *log = NULL;
    batch_buf bb = {0};
    int *idx = NULL, *pack_ids = NULL;
    unsigned char *pack_target = NULL;
    char *fp = fingerprint(&a), *state = NULL;
    qlm_train_data_options dopt = {.seq_len = a.seq_len, .prompt_template = a.template_text,
                                   .target_field = a.target_field, .chat = a.chat, .eval_fraction = a.eval_fraction,
                                   .seed = (uint64_t)a.seed};
    double t0 = now_s();
    fprintf(stderr, "qlm train: reading %s\n", a.data);
    if (qlm_train_data_load(&train, &eval, a.data, a.eval, cm.src.tok, &dopt) != 0) goto fail;
    fprintf(stderr, "qlm train: %d training examples (%ld tokens, %ld targets; %d truncated to %d, %d skipped), "
                    "%d eval examples, read in %.1f s\n",
            train.n, train.total_tokens, train.target_tokens, train.n_truncated, a.seq_len, train.n_skipped, eval.n,
            now_s() - t0);
    if (train.n < (a.pack ? 1 : a.batch)) {
        qlm_errorf("%s: %d examples are fewer than one batch of %d", a.data, train.n, a.batch);
        goto fail;
    }
    long per_epoch = a.pack ? qlm_train_packed_count(&train, (uint64_t)a.seed, 0, a.seq_len) : train.n;
    long steps_per_epoch = (per_epoch + (long)a.batch * a.accum - 1) / ((long)a.batch * a.accum);
    long total = a.steps ? a.steps : steps_per_epoch * (a.epochs ? a.epochs : 1);
    if (a.mode == QLM_TRAIN_LORA) {
        char *cfg = cli_lora_config_json(a.rank, a.alpha, a.targets, a.rslora, a.lora_dropout, t5);
        if (!cfg || qlm_lora_init(&adapter, "trained", t5 ? NULL : &cm.src.cfg, t5 ? &cm.src.t5 : NULL, cfg,
                                  (uint64_t)a.seed, QLM_F32) != 0) {
            free(cfg);
            goto fail;
        }
        free(cfg);
    }
    qlm_train_options o;
    qlm_train_options_init(&o);
    o.mode = a.mode;
    o.compute = a.mode == QLM_TRAIN_LORA ? QLM_F32 : a.dtype;
    o.qat_per_channel = a.per_channel;
    o.lr = a.lr, o.min_lr_ratio = a.min_lr_ratio, o.warmup_steps = a.warmup, o.total_steps = total;
    o.schedule = a.schedule, o.weight_decay = a.weight_decay, o.clip = a.clip;
    o.dynamic_loss_scale = a.dtype == QLM_F16;
    o.recompute = a.recompute, o.lora_dropout = a.lora_dropout, o.seed = (uint64_t)a.seed;
    qlm_train_shape shape = {.max_rows = a.batch * a.seq_len, .max_src_rows = a.batch * (a.seq_len + 1),
                             .max_len = a.seq_len + 1};
    if (qlm_trainer_init(&t, t5 ? NULL : &cm.model, t5 ? &cm.t5 : NULL, a.mode == QLM_TRAIN_LORA ? &adapter : NULL, &o,
                         &shape) != 0)
        goto fail;
    if (batch_buf_init(&bb, a.batch, a.seq_len, &cm) != 0) goto fail;
    idx = malloc((size_t)a.batch * sizeof *idx);
    pack_ids = malloc((size_t)a.seq_len * sizeof *pack_ids);
    pack_target = malloc((size_t)a.seq_len);
    if (!idx || !pack_ids || !pack_target) {
        qlm_errorf("out of memory");
        goto fail;
    }
    qlm_train_cursor cur = {.seed = (uint64_t)a.seed};
    run_totals before = {0}, tot = {0};
    if (a.resume) {
        int lr = qlm_trainer_load(&t, a.out, &state);
        if (lr < 0) goto fail;
        if (lr == 1) {
            fprintf(stderr, "qlm train: no checkpoint in %s: starting from step 0\n", a.out);
        } else {
            if (restore_state(state, &cur, fp, &before, a.out) != 0) goto fail;
            fprintf(stderr, "qlm train: resumed from %s/checkpoint.json at step %ld of %ld\n", a.out, t.step, total);
        }
    } else if (mkdir(a.out, 0755) != 0 && errno != EEXIST) {
        qlm_errorf("%s: cannot create: %s", a.out, strerror(errno));
        goto fail;
    }
    char title[512];
    const char *what = a.mode == QLM_TRAIN_LORA ? "LoRA" : a.mode == QLM_TRAIN_FULL ? "full" : "QAT";
    if (a.mode == QLM_TRAIN_LORA)
        snprintf(title, sizeof title, "qlm train: %s, LoRA r=%d on %s", a.model, a.rank, a.data);
    else
        snprintf(title, sizeof title, "qlm train: %s, %s on %s", a.model, what, a.data);
    log = qlm_train_log_open(a.out, a.resume ? t.step : -1, title);
    if (!log) goto fail;
    long trainable = 0;
    for (int i = 0; i < t.n_t; i++) trainable += t.t[i].n;
    fprintf(stderr, "qlm train: %s, %ld trainable values, %ld steps (%ld per epoch) of %d x %d sequences up to %d tokens, "
                    "lr %g %s, %s compute%s, activations %.0f MiB\n",
            what, trainable, total, steps_per_epoch, a.accum, a.batch, a.seq_len, a.lr,
            a.schedule == QLM_SCHEDULE_COSINE ? "cosine" : a.schedule == QLM_SCHEDULE_LINEAR ? "linear" : "constant",
            qlm_dtype_name(a.dtype), a.recompute ? " with recomputation" : "", qlm_trainer_activation_bytes(&t) / 1048576.0);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    batch_buf micro_bufs[64];
    int n_bufs = a.accum < 64 ? a.accum : 64;
    if (a.accum > 64) {
        qlm_errorf("--accum is at most 64");
        goto fail;
    }
    for (int k = 0; k < n_bufs; k++) micro_bufs[k] = (batch_buf){0};
    for (int k = 0; k < n_bufs; k++)
        if (batch_buf_init(&micro_bufs[k], a.batch, a.seq_len, &cm) != 0) goto fail_bufs;
    double run_start = now_s(), window_start = run_start, last_loss = NAN, last_eval = NAN;
    long window_tokens = 0, start_step = t.step;
    qlm_train_batch micro[64];
    while (t.step < total && !g_stop) {
        for (int k = 0; k < a.accum; k++) {
            if (next_micro(&micro_bufs[k], &a, &train, &cur, idx, pack_ids, pack_target) != 0) goto fail_bufs;
            micro[k] = micro_bufs[k].b;
        }
        qlm_train_step_stats st;
        if (qlm_trainer_step(&t, micro, a.accum, &st) != 0) goto fail_bufs;
        last_loss = st.loss;
        window_tokens += st.n_tokens;
        double now = now_s(), tps = window_tokens / (now - window_start + 1e-9);
        tot.elapsed_s = before.elapsed_s + (now - run_start);
        tot.tokens += st.n_tokens;
        double elapsed = tot.elapsed_s;
        if (qlm_train_log_step(log, t.step, st.loss, st.lr, st.grad_norm, tps, st.loss_scale, elapsed) != 0)
            goto fail_bufs;
        char eta[32];
        format_eta(eta, sizeof eta, (now - run_start) / (double)(t.step - start_step) * (double)(total - t.step));
        fprintf(stderr, "\rstep %ld/%ld  loss %.4f  lr %.2e  grad norm %.3f%s  %.0f tok/s  ETA %s   ", t.step, total,
                st.loss, st.lr, st.grad_norm, st.skipped ? " (overflow: skipped)" : "", tps, eta);
        if (a.dtype == QLM_F16) fprintf(stderr, " loss scale %g ", st.loss_scale);
        if (t.step % 20 == 0) window_start = now, window_tokens = 0;
        int last = t.step == total;
        if (eval.n && (t.step % a.eval_every == 0 || last)) {
            double el = eval_loss(&t, &eval, a.eval_max, &bb, a.batch);
            if (isnan(el)) goto fail_bufs;
            fprintf(stderr, "\nqlm train: step %ld eval loss %.4f (%d examples)\n", t.step, el,
                    eval.n < a.eval_max ? eval.n : a.eval_max);
            if (qlm_train_log_eval(log, t.step, el) != 0) goto fail_bufs;
            last_eval = el;
        }
        if (t.step % a.save_every == 0 || last || g_stop) {
            free(state);
            run_totals all = {tot.elapsed_s, before.tokens + tot.tokens};
            state = checkpoint_state(&cur, fp, &all);
            if (!state || qlm_train_log_sync(log) != 0 || qlm_trainer_save(&t, a.out, state) != 0 ||
                qlm_train_log_plot(log) != 0)
                goto fail_bufs;
        }
    }
    fprintf(stderr, "\n");
    if (g_stop) {
        fprintf(stderr, "qlm train: interrupted at step %ld; the checkpoint in %s resumes it (--resume)\n", t.step, a.out);
        rc = 130;
    } else {
        double secs = now_s() - run_start;
        long trained = t.step - start_step;
        fprintf(stderr, "qlm train: %ld steps in %.1f s (%.2f s/step), peak memory %.0f MiB RSS\n", trained, secs,
                trained ? secs / trained : 0.0, peak_rss_mib());
        run_totals all = {t.step > start_step ? tot.elapsed_s : before.elapsed_s, before.tokens + tot.tokens};
        /* Resuming a finished run rewrites the outputs and keeps the summary of the run that trained. */
        char summary[4200];
        snprintf(summary, sizeof summary, "%s/summary.json", a.out);
        int keep_summary = trained == 0 && access(summary, F_OK) == 0;
        rc = write_outputs(&a, &t, &cm) == 0 &&
                     (keep_summary || write_summary(&a, &t, &all, last_loss, last_eval) == 0) ? 0 : 1;
        if (rc) cli_fail("train");
    }
    for (int k = 0; k < n_bufs; k++) batch_buf_free(&micro_bufs[k]);
    goto done;
fail_bufs:
    for (int k = 0; k < n_bufs; k++) batch_buf_free(&micro_bufs[k]);
fail:
    fprintf(stderr, "\n");
    rc = cli_fail("train");
done:
    qlm_train_log_close(log);
    batch_buf_free(&bb);
    free(idx), free(pack_ids), free(pack_target), free(fp), free(state);
    if (t.t) qlm_trainer_free(&t);
    if (adapter.buffer) qlm_lora_free(&adapter);
    qlm_train_set_free(&train);
    qlm_train_set_free(&eval);
    cli_free_model(&cm);
    return rc;
}
