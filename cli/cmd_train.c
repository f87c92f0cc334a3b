/* qlm train: fine-tune a Llama-family model on JSONL data (LoRA, full, or quantization-aware),
 * with progress, metrics.jsonl and a loss-curve picture, atomic checkpoints and exact --resume. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock.h"
#include "../core/error.h"
#include "../core/atomic_file.h"
#include "../loaders/safetensors.h"
#include "../train/data.h"
#include "../train/metrics.h"
#include "../train/trainer.h"
#include "commands.h"
#include "common.h"
#include "dist.h"
#include "model_folder.h"
#include "progress.h"

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
    "      --qat                every weight, fake-quantized to INT8 (INT4: --qat-bits 4) with learned scales (LSQ)\n"
    "      --per-channel        QAT: one scale per output channel\n"
    "      --qat-bits N         QAT: 8 (INT8, default) or 4 (INT4 as q4_0's values -8..7)\n"
    "      --group N            QAT: one scale per N weights along each row: 32 (INT4's default), 64 or 128\n"
    "      --distill            learn the starting model's next-token distributions (KL divergence) instead\n"
    "                           of the data's tokens: QAT that keeps what the model knew (a frozen copy)\n"
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
    "      --chat-template FILE the Jinja chat template in FILE instead of the model's\n"
    "  runs:\n"
    "      --save-every N       checkpoint every N steps and at the end (default 50)\n"
    "      --resume             continue from the checkpoint in DIR, exactly where it stopped\n"
    "      --overwrite          start a new run in a DIR that holds one (refused otherwise)\n"
    "      --seed S             data order, adapter init and dropout (default 1)\n"
    "      --threads N          CPU threads (default: the cores, divided among the ranks on this machine)\n"
    "      --device D           cpu (default), cuda, or auto\n"
    "      --random-weights     random weights of the shape in MODEL/config.json (for speed measurements)\n"
    "      --no-check           skip the load-time check for NaN/Inf weights and bad INT8 scales\n"
    "  several processes (start with mpirun -np N qlm train ...; each rank takes its slice of every\n"
    "  global batch of --batch x N x --accum sequences; rank 0 prints and writes the outputs):\n"
    "      --shard S            ddp (default), zero1 (optimizer state split), zero2 (and gradients),\n"
    "                           fsdp (and parameters, gathered unit by unit)\n"
    "      --sharding-factor F  split among groups of F ranks, replicated across the N/F groups\n"
    "                           (default N; 1 is DDP)\n"
    "      --prefetch K         fsdp: units gathered ahead of their use (default 1)\n"
    "      --offload cpu        keep shards and optimizer state in host memory, step on the CPU\n"
    "      --dist-timeout S     a rank that waits S seconds for another ends the job (default 600)\n"
    "      --reshard            --resume a checkpoint made by another number of ranks or strategy\n";

enum {
    OPT_DATA = 1200, OPT_OUT_DIR, OPT_EVAL, OPT_EVAL_FRACTION, OPT_EVAL_EVERY, OPT_EVAL_MAX, OPT_MODE_LORA, OPT_RANK,
    OPT_ALPHA, OPT_LORA_DROPOUT, OPT_TARGETS, OPT_RSLORA, OPT_MODE_FULL, OPT_MODE_QAT, OPT_PER_CH, OPT_QAT_BITS,
    OPT_QAT_GROUP, OPT_STEPS,
    OPT_EPOCHS, OPT_TBATCH, OPT_ACCUM, OPT_SEQ_LEN, OPT_PACK, OPT_LR, OPT_SCHEDULE, OPT_WARMUP, OPT_MIN_LR,
    OPT_WD, OPT_CLIP, OPT_TDTYPE, OPT_BASE_DTYPE, OPT_RECOMPUTE, OPT_TARGET_FIELD, OPT_TEMPLATE, OPT_CHAT,
    OPT_SAVE_EVERY, OPT_RESUME, OPT_OVERWRITE, OPT_TSEED, OPT_TTHREADS, OPT_TDEVICE, OPT_RANDOM, OPT_TNO_CHECK, OPT_SHARD, OPT_FACTOR,
    OPT_PREFETCH, OPT_OFFLOAD, OPT_DIST_TIMEOUT, OPT_RESHARD, OPT_TCHAT_TEMPLATE, OPT_DISTILL,
};

typedef struct {
    const char *model, *tokenizer, *data, *out, *eval, *targets, *target_field, *template_text, *base_dtype, *device;
    const char *chat_template;
    double eval_fraction;
    int eval_every, eval_max, rank, rslora, per_channel, qat_bits, qat_group, steps, epochs, batch, accum, seq_len, pack,
        warmup;
    int recompute, chat, save_every, resume, seed, threads, random_weights, no_check;
    int factor, prefetch, reshard, shard_given, offload, overwrite, distill;
    float alpha, lora_dropout, clip, dist_timeout;
    double lr, min_lr_ratio, weight_decay; /* doubles, as the optimizer takes them (qlm_adamw_step) */
    qlm_shard_strategy shard;
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
        {"distill", no_argument, 0, OPT_DISTILL},
        {"qat-bits", required_argument, 0, OPT_QAT_BITS}, {"group", required_argument, 0, OPT_QAT_GROUP},
        {"steps", required_argument, 0, OPT_STEPS}, {"epochs", required_argument, 0, OPT_EPOCHS},
        {"batch", required_argument, 0, OPT_TBATCH}, {"accum", required_argument, 0, OPT_ACCUM},
        {"seq-len", required_argument, 0, OPT_SEQ_LEN}, {"pack", no_argument, 0, OPT_PACK},
        {"lr", required_argument, 0, OPT_LR}, {"schedule", required_argument, 0, OPT_SCHEDULE},
        {"warmup", required_argument, 0, OPT_WARMUP}, {"min-lr-ratio", required_argument, 0, OPT_MIN_LR},
        {"weight-decay", required_argument, 0, OPT_WD}, {"clip", required_argument, 0, OPT_CLIP},
        {"dtype", required_argument, 0, OPT_TDTYPE}, {"base-dtype", required_argument, 0, OPT_BASE_DTYPE},
        {"recompute", no_argument, 0, OPT_RECOMPUTE}, {"target-field", required_argument, 0, OPT_TARGET_FIELD},
        {"template", required_argument, 0, OPT_TEMPLATE}, {"chat", no_argument, 0, OPT_CHAT},
        {"chat-template", required_argument, 0, OPT_TCHAT_TEMPLATE},
        {"save-every", required_argument, 0, OPT_SAVE_EVERY}, {"resume", no_argument, 0, OPT_RESUME},
        {"overwrite", no_argument, 0, OPT_OVERWRITE},
        {"seed", required_argument, 0, OPT_TSEED}, {"threads", required_argument, 0, OPT_TTHREADS},
        {"device", required_argument, 0, OPT_TDEVICE}, {"random-weights", no_argument, 0, OPT_RANDOM},
        {"no-check", no_argument, 0, OPT_TNO_CHECK},
        {"shard", required_argument, 0, OPT_SHARD}, {"sharding-factor", required_argument, 0, OPT_FACTOR},
        {"prefetch", required_argument, 0, OPT_PREFETCH}, {"offload", required_argument, 0, OPT_OFFLOAD},
        {"dist-timeout", required_argument, 0, OPT_DIST_TIMEOUT}, {"reshard", no_argument, 0, OPT_RESHARD},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *a = (train_args){.eval_every = 50, .eval_max = 200, .rank = 8, .lora_dropout = 0.05f, .targets = "all-linear",
                      .batch = 4, .accum = 1, .seq_len = 512, .lr = -1, .min_lr_ratio = 0.1, .weight_decay = 0.01,
                      .clip = 1.0f, .save_every = 50, .seed = 1, .mode = QLM_TRAIN_LORA,
                      .schedule = QLM_SCHEDULE_COSINE, .dtype = QLM_F32, .device = "cpu", .prefetch = 1, .qat_bits = 8,
                      .shard = QLM_SHARD_DDP};
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
        case OPT_DISTILL: a->distill = 1; break;
        case OPT_QAT_BITS:
            if (cli_int("--qat-bits", optarg, 4, 8, &a->qat_bits) || (a->qat_bits != 4 && a->qat_bits != 8))
                bad = fprintf(stderr, "qlm train: --qat-bits must be 8 or 4\n") > 0;
            break;
        case OPT_QAT_GROUP:
            if (cli_int("--group", optarg, 32, 128, &a->qat_group) || !qlm_group_valid(a->qat_group))
                bad = fprintf(stderr, "qlm train: --group must be 32, 64 or 128\n") > 0;
            break;
        case OPT_STEPS: bad = cli_int("--steps", optarg, 1, 1 << 30, &a->steps); break;
        case OPT_EPOCHS: bad = cli_int("--epochs", optarg, 1, 100000, &a->epochs); break;
        case OPT_TBATCH: bad = cli_int("--batch", optarg, 1, 4096, &a->batch); break;
        case OPT_ACCUM: bad = cli_int("--accum", optarg, 1, 4096, &a->accum); break;
        case OPT_SEQ_LEN: bad = cli_int("--seq-len", optarg, 2, 1 << 20, &a->seq_len); break;
        case OPT_PACK: a->pack = 1; break;
        case OPT_LR: bad = cli_double("--lr", optarg, 0, 10, &a->lr); break;
        case OPT_SCHEDULE:
            if (strcmp(optarg, "cosine") == 0) a->schedule = QLM_SCHEDULE_COSINE;
            else if (strcmp(optarg, "linear") == 0) a->schedule = QLM_SCHEDULE_LINEAR;
            else if (strcmp(optarg, "constant") == 0) a->schedule = QLM_SCHEDULE_CONSTANT;
            else bad = fprintf(stderr, "qlm train: --schedule must be cosine, linear or constant\n") > 0;
            break;
        case OPT_WARMUP: bad = cli_int("--warmup", optarg, 0, 1 << 30, &a->warmup); break;
        case OPT_MIN_LR: bad = cli_double("--min-lr-ratio", optarg, 0, 1, &a->min_lr_ratio); break;
        case OPT_WD: bad = cli_double("--weight-decay", optarg, 0, 10, &a->weight_decay); break;
        case OPT_CLIP: bad = cli_float("--clip", optarg, 0, 1e6, &a->clip); break;
        case OPT_TDTYPE:
            if (qlm_dtype_parse(optarg, &a->dtype) != 0 || a->dtype == QLM_I8 || qlm_dtype_is_block(a->dtype))
                bad = fprintf(stderr, "qlm train: --dtype must be f32, bf16 or f16\n") > 0;
            break;
        case OPT_BASE_DTYPE: a->base_dtype = optarg; break;
        case OPT_RECOMPUTE: a->recompute = 1; break;
        case OPT_TARGET_FIELD: a->target_field = optarg; break;
        case OPT_TEMPLATE: a->template_text = optarg; break;
        case OPT_CHAT: a->chat = 1; break;
        case OPT_TCHAT_TEMPLATE: a->chat_template = optarg; break;
        case OPT_SAVE_EVERY: bad = cli_int("--save-every", optarg, 1, 1 << 30, &a->save_every); break;
        case OPT_RESUME: a->resume = 1; break;
        case OPT_OVERWRITE: a->overwrite = 1; break;
        case OPT_TSEED: bad = cli_int("--seed", optarg, 0, 2147483647, &a->seed); break;
        case OPT_TTHREADS: bad = cli_int("--threads", optarg, 1, 1024, &a->threads); break;
        case OPT_TDEVICE: a->device = optarg; break;
        case OPT_RANDOM: a->random_weights = 1; break;
        case OPT_TNO_CHECK: a->no_check = 1; break;
        case OPT_SHARD:
            if (qlm_shard_strategy_parse(optarg, &a->shard) != 0 || a->shard == QLM_SHARD_NONE)
                bad = fprintf(stderr, "qlm train: --shard must be ddp, zero1, zero2 or fsdp\n") > 0;
            a->shard_given = 1;
            break;
        case OPT_FACTOR: bad = cli_int("--sharding-factor", optarg, 1, 1 << 20, &a->factor); break;
        case OPT_PREFETCH: bad = cli_int("--prefetch", optarg, 0, 64, &a->prefetch); break;
        case OPT_OFFLOAD:
            if (strcmp(optarg, "cpu") != 0) bad = fprintf(stderr, "qlm train: --offload takes cpu\n") > 0;
            a->offload = 1;
            break;
        case OPT_DIST_TIMEOUT: bad = cli_float("--dist-timeout", optarg, 0.1, 1e7, &a->dist_timeout); break;
        case OPT_RESHARD: a->reshard = 1; break;
        case 'h': fputs(k_usage, stdout); exit(0);
        default: return cli_usage_error("train", k_usage);
        }
        if (bad) return 2;
    }
    if (!a->model || !a->data || !a->out || optind != argc) {
        fprintf(stderr, "qlm train: need -m MODEL, --data FILE and --out DIR\n");
        return cli_usage_error("train", k_usage);
    }
    if (a->resume && a->overwrite) {
        fprintf(stderr, "qlm train: --resume continues the run in --out, --overwrite replaces it: choose one\n");
        return 2;
    }
    if (a->lr < 0) a->lr = a->mode == QLM_TRAIN_LORA ? 2e-4 : 2e-5;
    if (a->alpha <= 0) a->alpha = 2.0f * a->rank;
    if (a->mode == QLM_TRAIN_QAT && a->dtype != QLM_F32) {
        fprintf(stderr, "qlm train: --qat computes in f32 (the fake-quantized weights)\n");
        return 2;
    }
    if ((a->qat_bits != 8 || a->qat_group) && a->mode != QLM_TRAIN_QAT) {
        fprintf(stderr, "qlm train: --qat-bits and --group set up --qat\n");
        return 2;
    }
    if (a->qat_group && a->per_channel) {
        fprintf(stderr, "qlm train: --group and --per-channel are two scale granularities: choose one\n");
        return 2;
    }
    /* INT4 has too few levels for one scale per row or tensor: groups of 32 unless told. */
    if (a->qat_bits == 4 && !a->qat_group && !a->per_channel) a->qat_group = 32;
    return 0;
}

/* The settings a resumed run must share with the run it continues (the global batch, whatever
 * the number of ranks that split it). */
static char *fingerprint(const train_args *a, int ranks) {
    char buf[8192], data[4096];
    if (!realpath(a->data, data)) snprintf(data, sizeof data, "%s", a->data);
    snprintf(buf, sizeof buf, "mode=%d data=%s rank=%d alpha=%g targets=%s rslora=%d batch=%d accum=%d seq=%d pack=%d "
             "lr=%g schedule=%d warmup=%d steps=%d epochs=%d dtype=%d seed=%d per_channel=%d dropout=%g qat_bits=%d "
             "qat_group=%d%s",
             a->mode, data, a->rank, a->alpha, a->targets, a->rslora, a->batch * ranks, a->accum, a->seq_len, a->pack,
             a->lr, a->schedule, a->warmup, a->steps, a->epochs, a->dtype, a->seed, a->per_channel, a->lora_dropout,
             a->qat_bits, a->qat_group, a->distill ? " distill=1" : "");
    return strdup(buf);
}

/* The fingerprint's keys, in its order, and the flags that set them. */
static const char *const k_setting_keys[][2] = {
    {"mode", "--lora/--full/--qat"}, {"data", "--data"}, {"rank", "--rank"}, {"alpha", "--alpha"},
    {"targets", "--targets"}, {"rslora", "--rslora"}, {"batch", "--batch x ranks"}, {"accum", "--accum"},
    {"seq", "--seq-len"}, {"pack", "--pack"}, {"lr", "--lr"}, {"schedule", "--schedule"}, {"warmup", "--warmup"},
    {"steps", "--steps"}, {"epochs", "--epochs"}, {"dtype", "--dtype"}, {"seed", "--seed"},
    {"per_channel", "--per-channel"}, {"dropout", "--lora-dropout"}, {"qat_bits", "--qat-bits"},
    {"qat_group", "--group"}, {"distill", "--distill"}};
enum { N_SETTING_KEYS = sizeof k_setting_keys / sizeof k_setting_keys[0] };

/* The value of key i in a fingerprint (values may hold spaces: a value runs to the next key). */
static void setting_value(const char *fp, int i, char *out, size_t cap) {
    char at[32], next[32];
    snprintf(at, sizeof at, "%s%s=", i ? " " : "", k_setting_keys[i][0]);
    const char *v = i ? strstr(fp, at) : (!strncmp(fp, at, strlen(at)) ? fp : NULL);
    if (!v) { /* a flag's key is written only when set (--distill) */
        snprintf(out, cap, "0");
        return;
    }
    v += strlen(at);
    const char *end = NULL;
    if (i + 1 < N_SETTING_KEYS) {
        snprintf(next, sizeof next, " %s=", k_setting_keys[i + 1][0]);
        end = strstr(v, next);
    }
    int n = end ? (int)(end - v) : (int)strlen(v);
    snprintf(out, cap, "%.*s", n, v);
    /* The enums as their flags' words. */
    static const char *const modes[] = {"--lora", "--full", "--qat"}, *const schedules[] = {"cosine", "linear", "constant"};
    int k = atoi(out);
    if (!strcmp(k_setting_keys[i][0], "mode") && k >= 0 && k < 3) snprintf(out, cap, "%s", modes[k]);
    else if (!strcmp(k_setting_keys[i][0], "schedule") && k >= 0 && k < 3) snprintf(out, cap, "%s", schedules[k]);
    else if (!strcmp(k_setting_keys[i][0], "dtype")) snprintf(out, cap, "%s", qlm_dtype_name((qlm_dtype)k));
}

/* "--lr 0.001 vs 0.0002, --seq-len 64 vs 96": what differs between two fingerprints, in flags. */
static void settings_diff(const char *was, const char *now, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < N_SETTING_KEYS && n < cap; i++) {
        char a[1024], b[1024];
        setting_value(was, i, a, sizeof a);
        setting_value(now, i, b, sizeof b);
        if (strcmp(a, b) != 0)
            n += (size_t)snprintf(out + n, cap - n, "%s%s %s vs %s", n ? ", " : "", k_setting_keys[i][1], a, b);
    }
    if (!out[0]) snprintf(out, cap, "%s", was);
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

/* An encoder-decoder's split of an example: its input is the tokens before the first target. */
static int first_target(const unsigned char *target, int len) {
    int first = 1;
    while (first < len && !target[first]) first++;
    return first;
}

/* The rows (and input rows) batch_add makes of an example, without adding it. */
static void count_rows(const batch_buf *bb, const unsigned char *target, int len, long *rows, long *src_rows) {
    if (!bb->t5) {
        *rows += len;
        return;
    }
    int first = first_target(target, len);
    *rows += len - first;
    *src_rows += first + 1;
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
    int first = first_target(target, len);
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

/* This rank's micro-batch: the next global micro-batch of batch x ranks sequences is drawn from
 * the data stream (every rank draws the same), and rank r keeps sequences r*batch .. (r+1)*batch-1,
 * so the ranks together see what one process with the global batch would. */
static int next_micro(batch_buf *bb, const train_args *a, const qlm_train_set *set, qlm_train_cursor *cur, int *idx,
                      int *pack_ids, unsigned char *pack_target, int rank, int ranks) {
    batch_begin(bb);
    int global = a->batch * ranks, first = rank * a->batch;
    long row0 = 0, src_row0 = 0;
    if (a->pack) {
        for (int k = 0; k < global; k++) {
            int len = qlm_train_next_packed(cur, set, a->seq_len, pack_ids, pack_target, NULL);
            if (len < 0) return -1;
            if (k < first) count_rows(bb, pack_target, len, &row0, &src_row0);
            else if (k < first + a->batch) batch_add(bb, pack_ids, pack_target, len);
        }
    } else {
        if (qlm_train_next_batch(cur, set->n, global, idx) != 0) return -1;
        for (int k = 0; k < first + a->batch; k++) {
            const qlm_train_example *e = &set->ex[idx[k]];
            if (k < first) count_rows(bb, e->target, e->len, &row0, &src_row0);
            else batch_add(bb, e->ids, e->target, e->len);
        }
    }
    bb->b.row0 = row0, bb->b.src_row0 = src_row0;
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

/* What a checkpoint was made by: the model and the split of the job. A resume must match the
 * model; the split only without --reshard. */
typedef struct {
    char model[4096];
    double params;
    int ranks, factor;
    const char *strategy;
} run_shape;

static char *checkpoint_state(const qlm_train_cursor *cur, const char *fp, const run_totals *tot, const run_shape *rs) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "data_seed", (double)cur->seed);
    cJSON_AddNumberToObject(j, "data_epoch", cur->epoch);
    cJSON_AddNumberToObject(j, "data_index", cur->index);
    cJSON_AddNumberToObject(j, "elapsed_s", tot->elapsed_s);
    cJSON_AddNumberToObject(j, "tokens", tot->tokens);
    cJSON_AddStringToObject(j, "settings", fp);
    cJSON_AddStringToObject(j, "model", rs->model);
    cJSON_AddNumberToObject(j, "model_params", rs->params);
    cJSON_AddNumberToObject(j, "ranks", rs->ranks);
    cJSON_AddStringToObject(j, "shard", rs->strategy);
    cJSON_AddNumberToObject(j, "sharding_factor", rs->factor);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

/* The checkpoint's model and split against this run's: 0, or -1 with a message saying what differs. */
static int check_shape(const cJSON *j, const run_shape *rs, int reshard, const char *dir) {
    const cJSON *model = cJSON_GetObjectItem(j, "model"), *params = cJSON_GetObjectItem(j, "model_params"),
                *ranks = cJSON_GetObjectItem(j, "ranks"), *shard = cJSON_GetObjectItem(j, "shard"),
                *factor = cJSON_GetObjectItem(j, "sharding_factor");
    if (cJSON_IsNumber(params) && params->valuedouble != rs->params)
        return qlm_errorf("%s/checkpoint.json: made for the model %s (%.0f parameters); this run trains %s (%.0f "
                          "parameters)",
                          dir, cJSON_IsString(model) ? model->valuestring : "?", params->valuedouble, rs->model, rs->params);
    int c_ranks = cJSON_IsNumber(ranks) ? ranks->valueint : 1, c_factor = cJSON_IsNumber(factor) ? factor->valueint : 1;
    const char *c_shard = cJSON_IsString(shard) ? shard->valuestring : "none";
    if (reshard || (c_ranks == rs->ranks && c_factor == rs->factor && strcmp(c_shard, rs->strategy) == 0)) return 0;
    return qlm_errorf("%s/checkpoint.json: made by %d rank%s with --shard %s (sharding factor %d); this run has %d "
                      "rank%s with --shard %s (sharding factor %d): launch it as before, or add --reshard to "
                      "continue with this one",
                      dir, c_ranks, c_ranks == 1 ? "" : "s", c_shard, c_factor, rs->ranks, rs->ranks == 1 ? "" : "s",
                      rs->strategy, rs->factor);
}

static int restore_state(const char *json, qlm_train_cursor *cur, const char *fp, run_totals *tot, const char *dir,
                         const run_shape *rs, int reshard) {
    cJSON *j = json ? cJSON_Parse(json) : NULL;
    const cJSON *seed = cJSON_GetObjectItem(j, "data_seed"), *ep = cJSON_GetObjectItem(j, "data_epoch"),
                *ix = cJSON_GetObjectItem(j, "data_index"), *el = cJSON_GetObjectItem(j, "elapsed_s"),
                *tk = cJSON_GetObjectItem(j, "tokens"),
                *set = cJSON_GetObjectItem(j, "settings");
    int rc = 0;
    if (!cJSON_IsNumber(seed) || !cJSON_IsNumber(ep) || !cJSON_IsNumber(ix) || !cJSON_IsString(set))
        rc = qlm_errorf("%s/checkpoint.json: the data position is missing", dir);
    else if (check_shape(j, rs, reshard, dir) != 0)
        rc = -1;
    else if (strcmp(set->valuestring, fp) != 0) {
        char diff[2048];
        settings_diff(set->valuestring, fp, diff, sizeof diff);
        rc = qlm_errorf("%s/checkpoint.json: made with other settings (the checkpoint's first): %s; resume with the "
                        "same flags, or --overwrite to start again",
                        dir, diff);
    }
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
        const qlm_backend *be = t->arch->backend(t->model);
        qlm_tensor_store *store = qlm_store_new();
        int rc = store ? 0 : qlm_errorf("out of memory");
        for (int i = 0; i < t->n_t && rc == 0; i++) {
            const qlm_train_tensor *e = &t->t[i];
            if (e->qat_scale_of < 0) continue;
            int64_t shape[1] = {e->rows};
            size_t bytes = (size_t)e->n * sizeof(float);
            /* Device memory is copied out first. */
            void *copy;
            if (be->host_memory) {
                if (!qlm_store_add(store, e->name, QLM_F32, 1, shape, e->p, bytes)) rc = -1;
            } else if (qlm_store_add_owned(store, e->name, QLM_F32, 1, shape, &copy)) {
                be->to_host(copy, e->p, bytes);
            } else {
                rc = -1;
            }
        }
        char scales[4200];
        snprintf(scales, sizeof scales, "%s/qat_scales.safetensors", path);
        char bits[8], group[8];
        snprintf(bits, sizeof bits, "%d", a->qat_bits);
        snprintf(group, sizeof group, "%d", a->qat_group);
        const char *meta[] = {"qlm.qat", a->qat_group ? "per-group" : a->per_channel ? "per-channel" : "per-tensor",
                              "qlm.qat.bits", bits, "qlm.qat.group", group, NULL};
        if (rc == 0) rc = qlm_safetensors_save(scales, store, meta);
        qlm_store_free(store);
        if (rc != 0) return -1;
        fprintf(stderr, "qlm train: QAT model written to %s; make the %s model with qlm quantize --from-qat %s OUT\n",
                path, a->qat_bits == 4 ? "INT4 (q4_0)" : "INT8", path);
        return 0;
    }
    fprintf(stderr, "qlm train: model written to %s\n", path);
    return 0;
}

/* What each rank held and did, gathered on every rank: [rank][DIST_FIELDS]. */
enum { DIST_PARAMS, DIST_GRADS, DIST_OPTIM, DIST_TRANSIENT, DIST_RSS, DIST_COMM, DIST_WAIT, DIST_GATHERS,
       DIST_GATHERS_UNUSED, DIST_FIELDS };

static double *gather_rank_stats(const cli_dist *d, const qlm_trainer *t, double train_rss, double comm_s) {
    double *all = calloc((size_t)d->size * DIST_FIELDS, sizeof *all);
    if (!all) {
        qlm_errorf("out of memory");
        return NULL;
    }
    qlm_train_memory m = qlm_trainer_memory(t);
    qlm_train_split sp = qlm_trainer_split(t);
    double mine[DIST_FIELDS] = {m.params, m.grads, m.optim, m.transient_peak, train_rss, comm_s, sp.gather_wait_s,
                                (double)sp.gathers, (double)sp.gathers_unused};
    memcpy(all + (size_t)d->rank * DIST_FIELDS, mine, sizeof mine);
    if (qlm_comm_sum_host(d->world, all, d->size * DIST_FIELDS) != 0) {
        free(all);
        return NULL;
    }
    return all;
}

/* DIR/summary.json: what the finished run did, for scripts and benchmark tables; with several
 * ranks, the split and what each rank held (bytes) and waited for. */
static int write_summary(const train_args *a, const qlm_trainer *t, const run_totals *tot, double loss, double eval,
                         const cli_dist *d, const double *ranks) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "mode", a->mode == QLM_TRAIN_LORA ? "lora" : a->mode == QLM_TRAIN_FULL ? "full" : "qat");
    cJSON_AddBoolToObject(j, "distill", a->distill);
    cJSON_AddNumberToObject(j, "steps", (double)t->step);
    cJSON_AddNumberToObject(j, "tokens", tot->tokens);
    cJSON_AddNumberToObject(j, "train_seconds", tot->elapsed_s);
    cJSON_AddNumberToObject(j, "tokens_per_s", tot->elapsed_s > 0 ? tot->tokens / tot->elapsed_s : 0);
    cJSON_AddNumberToObject(j, "peak_rss_mib", peak_rss_mib());
    cJSON_AddNumberToObject(j, "activation_mib", qlm_trainer_activation_bytes(t) / 1048576.0);
    if (isfinite(loss)) cJSON_AddNumberToObject(j, "last_loss", loss);
    if (isfinite(eval)) cJSON_AddNumberToObject(j, "last_eval_loss", eval);
    qlm_train_split sp = qlm_trainer_split(t);
    cJSON *dist = cJSON_AddObjectToObject(j, "dist");
    cJSON_AddNumberToObject(dist, "ranks", d->size);
    cJSON_AddStringToObject(dist, "shard", qlm_shard_strategy_name(sp.strategy));
    cJSON_AddNumberToObject(dist, "shard_group", sp.group);
    cJSON_AddNumberToObject(dist, "prefetch", a->prefetch);
    static const char *const names[DIST_FIELDS] = {"params_bytes", "grads_bytes", "optim_bytes",
                                                   "transient_peak_bytes", "train_peak_rss_mib", "comm_seconds",
                                                   "gather_wait_seconds", "gathers", "gathers_unused"};
    cJSON *per_rank = cJSON_AddArrayToObject(dist, "per_rank");
    for (int r = 0; ranks && r < d->size; r++) {
        cJSON *o = cJSON_CreateObject();
        for (int k = 0; k < DIST_FIELDS; k++) cJSON_AddNumberToObject(o, names[k], ranks[(size_t)r * DIST_FIELDS + k]);
        cJSON_AddItemToArray(per_rank, o);
    }
    char *text = cJSON_Print(j), path[4200];
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/summary.json", a->out);
    int rc = text ? qlm_atomic_write_text(path, text) : qlm_errorf("out of memory");
    free(text);
    return rc;
}

/* Whether any rank was asked to stop (also keeps the ranks in step). */
static int any_stop(const cli_dist *d, int *failed) {
    double stop = g_stop;
    if (qlm_comm_sum_host(d->world, &stop, 1) != 0) *failed = 1;
    return stop > 0;
}

/* The output folder, before the model or the data is read: created with its parents and found
 * writable, and not holding another run unless --resume continues it or --overwrite replaces it
 * (its checkpoint.json is removed, so a crash before the first new checkpoint resumes nothing old).
 * Every rank does this before the job's first collective, so no rank has written yet. */
static int prepare_out(const train_args *a) {
    if (cli_make_dir(a->out) != 0) return -1;
    static const char *const marks[] = {"checkpoint.json", "metrics.jsonl", "summary.json", "adapter", "model"};
    char path[4200];
    if (a->overwrite) {
        snprintf(path, sizeof path, "%s/checkpoint.json", a->out);
        if (unlink(path) != 0 && errno != ENOENT) return qlm_errorf("%s: cannot remove: %s", path, strerror(errno));
        return 0;
    }
    for (size_t i = 0; !a->resume && i < sizeof marks / sizeof *marks; i++) {
        snprintf(path, sizeof path, "%s/%s", a->out, marks[i]);
        if (access(path, F_OK) == 0)
            return qlm_errorf("%s holds a run already (%s): --resume continues it, --overwrite starts a new one "
                              "there, or choose another --out", a->out, marks[i]);
    }
    return 0;
}

int cmd_train(int argc, char **argv) {
    train_args a;
    int prc = parse_args(argc, argv, &a);
    if (prc) return prc;
    if (prepare_out(&a) != 0) return cli_fail("train");
    cli_dist d;
    if (cli_dist_start(&d, a.device, a.dist_timeout, &a.threads, 0) != 0) return cli_fail("train");
    int root = d.rank == 0;
    if (d.size > 1 && !a.shard_given) a.shard = QLM_SHARD_DDP;
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    mo.model = a.model;
    mo.tokenizer = a.tokenizer;
    mo.chat_template = a.chat_template;
    mo.random_weights = a.random_weights;
    mo.no_check = a.no_check;
    mo.device = a.device;
    mo.threads = a.threads;
    mo.own_weights = 1;
    mo.dtype = a.mode == QLM_TRAIN_LORA ? (a.base_dtype ? a.base_dtype : qlm_dtype_name(a.dtype)) : "f32";
    cli_model cm;
    if (cli_load_model(&mo, &cm, 1, !root) != 0) {
        cli_dist_fail(&d, "train");
        cli_dist_end(&d);
        return 1;
    }
    int t5 = cm.src.is_t5;
    if (t5 && a.pack) {
        cli_free_model(&cm);
        cli_dist_end(&d);
        fprintf(stderr, "qlm train: --pack is for decoder-only models\n");
        return 2;
    }
    int rc = 1;
    cli_progress progress;
    cli_progress_init(&progress, !root);
    qlm_train_set train = {0}, eval = {0};
    qlm_lora_adapter adapter = {0};
    qlm_trainer t = {0};
    qlm_train_log *log = NULL;
    batch_buf bb = {0};
    int *idx = NULL, *pack_ids = NULL;
    unsigned char *pack_target = NULL;
    double *rank_stats = NULL;
    char *fp = fingerprint(&a, d.size), *state = NULL;
    qlm_train_data_options dopt = {.seq_len = a.seq_len, .prompt_template = a.template_text,
                                   .target_field = a.target_field, .chat = a.chat, .eval_fraction = a.eval_fraction,
                                   .seed = (uint64_t)a.seed};
    run_shape shape_now = {.params = t5 ? (double)qlm_t5_param_count(&cm.t5) : (double)qlm_model_param_count(&cm.model),
                           .ranks = d.size, .strategy = qlm_shard_strategy_name(d.size > 1 ? a.shard : QLM_SHARD_NONE)};
    shape_now.factor = d.size > 1 && a.shard >= QLM_SHARD_ZERO1 ? (a.factor ? a.factor : d.size) : 1;
    if (!realpath(a.model, shape_now.model)) snprintf(shape_now.model, sizeof shape_now.model, "%s", a.model);
    double t0 = qlm_now_s();
    if (root) fprintf(stderr, "qlm train: reading %s\n", a.data);
    if (qlm_train_data_load(&train, &eval, a.data, a.eval, cm.src.tok, &dopt) != 0) goto fail;
    if (root)
        fprintf(stderr, "qlm train: %d training examples (%ld tokens, %ld targets; %d truncated to %d, %d skipped), "
                        "%d eval examples, read in %.1f s\n",
                train.n, train.total_tokens, train.target_tokens, train.n_truncated, a.seq_len, train.n_skipped, eval.n,
                qlm_now_s() - t0);
    long global_batch = (long)a.batch * d.size;
    if (train.n < (a.pack ? 1 : global_batch)) {
        qlm_errorf("%s: %d examples are fewer than one global batch of %ld", a.data, train.n, global_batch);
        goto fail;
    }
    long per_epoch = a.pack ? qlm_train_packed_count(&train, (uint64_t)a.seed, 0, a.seq_len) : train.n;
    long steps_per_epoch = (per_epoch + global_batch * a.accum - 1) / (global_batch * a.accum);
    long total = a.steps ? a.steps : steps_per_epoch * (a.epochs ? a.epochs : 1);
    if (a.mode == QLM_TRAIN_LORA) {
        char *cfg = cli_lora_config_json(a.model, a.rank, a.alpha, a.targets, a.rslora, a.lora_dropout, t5);
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
    o.qat_bits = a.qat_bits;
    o.qat_group = a.qat_group;
    o.distill = a.distill;
    o.lr = a.lr, o.min_lr_ratio = a.min_lr_ratio, o.warmup_steps = a.warmup, o.total_steps = total;
    o.schedule = a.schedule, o.weight_decay = a.weight_decay, o.clip = a.clip;
    o.dynamic_loss_scale = a.dtype == QLM_F16;
    o.recompute = a.recompute, o.lora_dropout = a.lora_dropout, o.seed = (uint64_t)a.seed;
    o.dist = (qlm_train_dist){.world = d.world, .strategy = d.size > 1 ? a.shard : QLM_SHARD_NONE,
                              .factor = a.factor, .prefetch = a.prefetch};
    qlm_train_shape shape = {.max_rows = a.batch * a.seq_len, .max_src_rows = a.batch * (a.seq_len + 1),
                             .max_len = a.seq_len + 1};
    if (qlm_trainer_init(&t, t5 ? NULL : &cm.model, t5 ? &cm.t5 : NULL, a.mode == QLM_TRAIN_LORA ? &adapter : NULL, &o,
                         &shape) != 0)
        goto fail;
    if (batch_buf_init(&bb, a.batch, a.seq_len, &cm) != 0) goto fail;
    idx = malloc((size_t)global_batch * sizeof *idx);
    pack_ids = malloc((size_t)a.seq_len * sizeof *pack_ids);
    pack_target = malloc((size_t)a.seq_len);
    if (!idx || !pack_ids || !pack_target) {
        qlm_errorf("out of memory");
        goto fail;
    }
    qlm_train_cursor cur = {.seed = (uint64_t)a.seed};
    run_totals before = {0}, tot = {0};
    if (a.resume) {
        /* What the checkpoint was made by is checked before its tensors are read. */
        int lr = qlm_trainer_peek(a.out, &state);
        if (lr < 0 || (lr == 0 && restore_state(state, &cur, fp, &before, a.out, &shape_now, a.reshard) != 0)) goto fail;
        free(state);
        state = NULL;
        if (lr == 0 && qlm_trainer_load(&t, a.out, &state) != 0) goto fail;
        if (lr == 1) {
            if (root) fprintf(stderr, "qlm train: no checkpoint in %s: starting from step 0\n", a.out);
        } else if (root) {
            fprintf(stderr, "qlm train: resumed from %s/checkpoint.json at step %ld of %ld\n", a.out, t.step, total);
        }
    }
    char title[512];
    char what[64];
    snprintf(what, sizeof what, "%s%s", a.mode == QLM_TRAIN_LORA ? "LoRA" : a.mode == QLM_TRAIN_FULL ? "full" : "QAT",
             a.distill ? ", distilled from the starting model" : "");
    if (a.mode == QLM_TRAIN_LORA)
        snprintf(title, sizeof title, "qlm train: %s, LoRA r=%d on %s", a.model, a.rank, a.data);
    else
        snprintf(title, sizeof title, "qlm train: %s, %s on %s", a.model, what, a.data);
    if (root && !(log = qlm_train_log_open(a.out, a.resume ? t.step : -1, title))) goto fail;
    long trainable = 0;
    for (int i = 0; i < t.n_t; i++) trainable += t.t[i].n;
    if (root) {
        fprintf(stderr, "qlm train: %s, %ld trainable values, %ld steps (%ld per epoch) of %d x %ld sequences up to %d "
                        "tokens, lr %g %s, %s compute%s, activations %.0f MiB\n",
                what, trainable, total, steps_per_epoch, a.accum, global_batch, a.seq_len, a.lr,
                a.schedule == QLM_SCHEDULE_COSINE ? "cosine" : a.schedule == QLM_SCHEDULE_LINEAR ? "linear" : "constant",
                qlm_dtype_name(a.dtype), a.recompute ? " with recomputation" : "",
                qlm_trainer_activation_bytes(&t) / 1048576.0);
        if (a.offload)
            fprintf(stderr, "qlm train: --offload cpu: the %s backend keeps every shard and the optimizer state in host "
                            "memory, and steps on the CPU, already\n",
                    qlm_trainer_backend_name(&t));
        if (d.size > 1) {
            qlm_train_memory m = qlm_trainer_memory(&t);
            qlm_train_split sp = qlm_trainer_split(&t);
            fprintf(stderr, "qlm train: %d ranks, --shard %s, shard groups of %d (%d replicas), %d threads per rank; "
                            "rank 0 holds %.1f MiB of parameters, %.1f of gradients, %.1f of optimizer state\n",
                    d.size, qlm_shard_strategy_name(sp.strategy), sp.group, sp.replicas, omp_get_max_threads(),
                    m.params / 1048576.0, m.grads / 1048576.0, m.optim / 1048576.0);
        }
    }
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
    double run_start = qlm_now_s(), window_start = run_start, last_loss = NAN, last_eval = NAN, comm_s = 0;
    long window_tokens = 0, start_step = t.step;
    qlm_train_batch micro[64];
    int comm_failed = 0;
    cli_reset_peak_rss();
    while (t.step < total && !any_stop(&d, &comm_failed)) {
        for (int k = 0; k < a.accum; k++) {
            if (next_micro(&micro_bufs[k], &a, &train, &cur, idx, pack_ids, pack_target, d.rank, d.size) != 0)
                goto fail_bufs;
            micro[k] = micro_bufs[k].b;
        }
        qlm_train_step_stats st;
        if (qlm_trainer_step(&t, micro, a.accum, &st) != 0) goto fail_bufs;
        last_loss = st.loss;
        comm_s += st.comm_s;
        window_tokens += st.n_tokens;
        double now = qlm_now_s(), tps = window_tokens / (now - window_start + 1e-9);
        tot.elapsed_s = before.elapsed_s + (now - run_start);
        tot.tokens += st.n_tokens;
        double elapsed = tot.elapsed_s;
        if (root && qlm_train_log_step(log, t.step, st.loss, st.lr, st.grad_norm, tps, st.loss_scale, elapsed) != 0)
            goto fail_bufs;
        char eta[32];
        format_eta(eta, sizeof eta, (now - run_start) / (double)(t.step - start_step) * (double)(total - t.step));
        if (root) {
            char scale[48] = "";
            if (a.dtype == QLM_F16) snprintf(scale, sizeof scale, "  loss scale %g", st.loss_scale);
            cli_progress_update(&progress, t.step == total, "step %ld/%ld  loss %.4f  lr %.2e  grad norm %.3f%s  %.0f tok/s  ETA %s%s",
                                t.step, total, st.loss, st.lr, st.grad_norm, st.skipped ? " (overflow: skipped)" : "",
                                tps, eta, scale);
        }
        if (t.step % 20 == 0) window_start = now, window_tokens = 0;
        int last = t.step == total;
        if (eval.n && (t.step % a.eval_every == 0 || last)) {
            double el = eval_loss(&t, &eval, a.eval_max, &bb, a.batch);
            if (isnan(el)) goto fail_bufs;
            if (root) {
                cli_progress_break(&progress);
                fprintf(stderr, "qlm train: step %ld eval loss %.4f (%d examples)\n", t.step, el,
                        eval.n < a.eval_max ? eval.n : a.eval_max);
                if (qlm_train_log_eval(log, t.step, el) != 0) goto fail_bufs;
            }
            last_eval = el;
        }
        if (t.step % a.save_every == 0 || last || g_stop) {
            free(state);
            run_totals all = {tot.elapsed_s, before.tokens + tot.tokens};
            state = checkpoint_state(&cur, fp, &all, &shape_now);
            if (!state || (root && qlm_train_log_sync(log) != 0) || qlm_trainer_save(&t, a.out, state) != 0 ||
                (root && qlm_train_log_plot(log) != 0))
                goto fail_bufs;
        }
    }
    if (comm_failed) goto fail_bufs;
    cli_progress_break(&progress);
    if (t.step < total) {
        if (root)
            fprintf(stderr, "qlm train: interrupted at step %ld; the checkpoint in %s resumes it (--resume)\n", t.step,
                    a.out);
        rc = 130;
    } else {
        double secs = qlm_now_s() - run_start, train_rss = cli_peak_rss_mib();
        long trained = t.step - start_step;
        if (root)
            fprintf(stderr, "qlm train: %ld steps in %.1f s (%.2f s/step), peak memory %.0f MiB RSS (%.0f during the "
                            "steps)\n",
                    trained, secs, trained ? secs / trained : 0.0, peak_rss_mib(), train_rss);
        rank_stats = gather_rank_stats(&d, &t, train_rss, comm_s);
        if (!rank_stats || (a.mode != QLM_TRAIN_LORA && qlm_trainer_consolidate(&t) != 0)) goto fail_bufs;
        run_totals all = {t.step > start_step ? tot.elapsed_s : before.elapsed_s, before.tokens + tot.tokens};
        /* Resuming a finished run rewrites the outputs and keeps the summary of the run that trained. */
        char summary[4200];
        snprintf(summary, sizeof summary, "%s/summary.json", a.out);
        int keep_summary = trained == 0 && access(summary, F_OK) == 0;
        rc = !root || (write_outputs(&a, &t, &cm) == 0 &&
                       (keep_summary || write_summary(&a, &t, &all, last_loss, last_eval, &d, rank_stats) == 0))
                 ? 0
                 : 1;
        if (rc) goto fail_bufs;
    }
    for (int k = 0; k < n_bufs; k++) batch_buf_free(&micro_bufs[k]);
    goto done;
fail_bufs:
    for (int k = 0; k < n_bufs; k++) batch_buf_free(&micro_bufs[k]);
fail:
    cli_progress_break(&progress);
    rc = cli_dist_fail(&d, "train");
done:
    qlm_train_log_close(log);
    batch_buf_free(&bb);
    free(idx), free(pack_ids), free(pack_target), free(fp), free(state), free(rank_stats);
    if (t.t) qlm_trainer_free(&t);
    if (adapter.buffer) qlm_lora_free(&adapter);
    qlm_train_set_free(&train);
    qlm_train_set_free(&eval);
    cli_free_model(&cm);
    cli_dist_end(&d);
    return rc;
}
