/* The trainer: which parameters train (an adapter, all weights, or all weights fake-quantized
 * with learned INT8 scales), their gradients and AdamW moments, the learning-rate schedule,
 * gradient clipping, dynamic loss scaling, and checkpoints that a crash cannot tear.
 *
 * Every trainable tensor is an entry of one list (value, gradient, two moments), so zeroing,
 * norms, clipping, the optimizer and checkpoints are one loop each. For full training the F32
 * master weights are the model given, and the forward reads a compute copy: the same memory in
 * F32, a BF16/F16 copy refreshed after each step (mixed precision), or the fake-quantized
 * weights (QAT). Gradients, moments and master weights are per-unit flat buffers (the shared
 * tensors, each layer).
 *
 * Distributed (qlm_train_dist): each rank runs passes over its slice of the batch; gradients are
 * summed over the ranks (deterministically, in rank order); DDP keeps everything whole on every
 * rank, ZeRO-1 splits the optimizer state (moments, and master weights under mixed precision)
 * among the S ranks of a shard group, ZeRO-2 the gradients too (reduce-scattered unit by unit as
 * the backward finishes each), FSDP the parameters too (gathered unit by unit around their use,
 * dist/shard.h). Each rank's trainable entries are then the pieces of tensors it owns. */
#ifndef QLM_TRAINER_H
#define QLM_TRAINER_H

#include <stdint.h>

#include "../models/model.h"
#include "../models/t5.h"
#include "../dist/comm.h"
#include "../dist/shard.h"
#include "../lora/lora.h"
#include "train_arch.h"

typedef enum { QLM_TRAIN_LORA, QLM_TRAIN_FULL, QLM_TRAIN_QAT } qlm_train_mode;
typedef enum { QLM_SHARD_NONE, QLM_SHARD_DDP, QLM_SHARD_ZERO1, QLM_SHARD_ZERO2, QLM_SHARD_FSDP } qlm_shard_strategy;

/* How one training job is split over processes. */
typedef struct {
    qlm_comm *world;             /* the job's ranks; NULL: one process */
    qlm_shard_strategy strategy; /* NONE with a world of one */
    int factor;                  /* ranks that share one copy of the sharded state (sharding factor; 0: all) */
    int prefetch;                /* FSDP: units gathered ahead of their use */
} qlm_train_dist;

/* "none", "ddp", "zero1", "zero2", "fsdp"; parse: 0, or -1 for an unknown name. */
const char *qlm_shard_strategy_name(qlm_shard_strategy s);
int qlm_shard_strategy_parse(const char *name, qlm_shard_strategy *out);
typedef enum { QLM_SCHEDULE_COSINE, QLM_SCHEDULE_LINEAR, QLM_SCHEDULE_CONSTANT } qlm_lr_schedule;

typedef struct {
    qlm_train_mode mode;
    qlm_dtype compute;   /* full: dtype of the compute copy (F32, BF16, F16); QAT: F32 */
    int qat_per_channel; /* QAT: one learned scale per output row */
    int qat_group;       /* QAT: one learned scale per this many weights along each row (0: see qat_per_channel) */
    int qat_bits;        /* QAT: 8 (symmetric, -127..127) or 4 (-8..7, Q4_0's values) */
    double lr, min_lr_ratio; /* the schedule decays to lr * min_lr_ratio */
    long warmup_steps, total_steps;
    qlm_lr_schedule schedule;
    /* decay applies to matrices (and adapters), not to norms or biases; doubles as qlm_adamw_step's */
    double beta1, beta2, eps, weight_decay;
    float clip;          /* global gradient-norm bound; 0: none */
    int dynamic_loss_scale;       /* F16: start at loss_scale, halve and skip on inf/NaN, double after window clean steps */
    float loss_scale;
    int loss_scale_window;
    int recompute;       /* keep only layer inputs; rerun each layer's forward in its backward */
    float lora_dropout;
    uint64_t seed;
    /* Distillation: every target is the starting model's next-token distribution (the loss is the
     * KL divergence from it) instead of the data's next token. The starting model is a frozen F32
     * copy made at init (whole on every rank), or for LoRA the base without the adapter. */
    int distill;
    long inject_overflow_step; /* fault injection for tests: this step's gradients get an inf (-1: never) */
    qlm_train_dist dist;
} qlm_train_options;

/* Defaults: AdamW(0.9, 0.999, 1e-8, decay 0.01), lr 2e-4 cosine to 10% with no warmup, clip 1,
 * F32, loss scale 65536 / window 2000 (used only when dynamic_loss_scale is set). */
void qlm_train_options_init(qlm_train_options *o);

/* One trainable tensor, or the piece of it this rank owns: its value, gradient and AdamW moments
 * (all F32, n values from element `offset` of the tensor, rows row0.. of a matrix). */
typedef struct {
    char name[200];
    float *p, *g, *m, *v;
    long n, offset;
    int64_t rows, cols; /* of the piece; cols 0: a vector */
    int64_t row0;
    long full_n;        /* values of the whole tensor */
    int decay;
    int matrix;         /* a weight matrix (else a vector or table kept in F32) */
    int param;          /* index in the model's (or adapter's) parameter list; -1 for a QAT scale */
    int qat_scale_of;   /* a QAT scale: index of its weight's entry; else -1 */
    int replicated;     /* whole on every rank of the shard group (QAT scales) */
} qlm_train_tensor;

typedef struct {
    double loss;         /* mean over the step's target tokens */
    long n_targets, n_tokens;
    double grad_norm;    /* before clipping (unscaled) */
    double comm_s;       /* distributed: seconds in gradient reductions and parameter gathers of the step */
    double lr;
    float loss_scale;
    int skipped;         /* inf/NaN gradients: no update */
} qlm_train_step_stats;

typedef struct {
    qlm_train_options o;
    const qlm_train_arch *arch;
    /* Models of the architecture (qlm_model or qlm_t5_model). model: full/QAT: the F32 master
     * weights; LoRA: the frozen base (any dtype). compute: the copy the forward reads when it
     * differs from model. grads, moment1, moment2: F32 twins (full/QAT). */
    void *model, *compute, *grads, *moment1, *moment2;
    int has_copy;
    void *state;         /* the architecture's activations */
    void *teacher;       /* distillation, full/QAT: the frozen copy of the starting weights */
    float *teacher_logits; /* distillation: [the state's rows][vocab] */
    size_t teacher_logits_n;
    qlm_lora_adapter *lora;
    qlm_lora_train lora_train;
    float *lora_m, *lora_v;
    float *qat_buf;      /* QAT: scales, their gradients and moments */
    float *qat_tmp;      /* QAT: one tensor's worth of scratch */
    qlm_train_tensor *t;
    int n_t;
    long step;           /* optimizer steps taken (skipped ones included) */
    long adam_step;      /* updates applied: AdamW's bias-correction count */
    float loss_scale;
    long clean_steps;    /* since the loss scale last changed */
    struct qlm_train_shards *sh; /* the trained units, their cuts among ranks and where their state lives */
} qlm_trainer;

/* Exactly one of llama, t5. The model must be F32 for full training and QAT (it becomes the master
 * weights, updated in place); any dtype for LoRA. lora: the adapter to train (LoRA mode; its A/B
 * are updated in place). shape: the largest batch. */
int qlm_trainer_init(qlm_trainer *t, qlm_model *llama, qlm_t5_model *t5, qlm_lora_adapter *lora,
                     const qlm_train_options *o, const qlm_train_shape *shape);
void qlm_trainer_free(qlm_trainer *t);

/* The learning rate of step (0-based) under the schedule. */
double qlm_train_lr(const qlm_train_options *o, long step);

/* One optimizer step over n_micro micro-batches (gradient accumulation): the loss is the mean
 * over all their target tokens. */
int qlm_trainer_step(qlm_trainer *t, const qlm_train_batch *micro, int n_micro, qlm_train_step_stats *st);
/* Loss sum and target count over one batch, no gradients (the weights the forward reads). */
int qlm_trainer_eval(qlm_trainer *t, const qlm_train_batch *b, double *loss_sum, long *n_targets);

/* Recomputes the compute copy from the master weights (after changing them directly). Collective
 * when distributed: 0, or -1 when communication failed. */
int qlm_trainer_refresh(qlm_trainer *t);
/* Distributed: makes the master weights whole on every rank again (to write the trained model;
 * collective). 0 or -1. */
int qlm_trainer_consolidate(qlm_trainer *t);
/* Bytes this rank holds of parameters (what the passes read; LoRA: the base and the adapter),
 * gradients and optimizer state (moments, the F32 master under mixed precision, QAT scales), and
 * the peak of the whole-unit buffers a sharded run allocates to gather parameters and
 * reduce-scatter gradients (in use or kept for reuse). */
typedef struct {
    double params, grads, optim, transient_peak;
} qlm_train_memory;
qlm_train_memory qlm_trainer_memory(const qlm_trainer *t);
/* How the run is split: the strategy in effect, the ranks of a shard group and how many groups
 * replicate it, and (FSDP) the seconds the passes waited for gathers, how many there were and how
 * many no pass used. */
typedef struct {
    qlm_shard_strategy strategy;
    int group, replicas;
    double gather_wait_s;
    long gathers, gathers_unused;
} qlm_train_split;
qlm_train_split qlm_trainer_split(const qlm_trainer *t);
/* The name of the backend the trainer runs on. */
const char *qlm_trainer_backend_name(const qlm_trainer *t);
/* The model the forward reads (compute copy, or the master itself). */
const void *qlm_trainer_forward_model(const qlm_trainer *t);
/* Bytes of activation memory the training state holds (with distillation's teacher logits). */
double qlm_trainer_activation_bytes(const qlm_trainer *t);

/* Checkpoints: each rank that holds a distinct part of the state writes the values and moments of
 * its pieces to dir/checkpoint-STEP[-part-R-of-S].safetensors atomically (a piece that is not a
 * whole tensor is named NAME@OFFSET); after a barrier rank 0 replaces dir/checkpoint.json (step,
 * trainer state, the files, and extra_json, e.g. the data position) atomically: that rename is
 * the commit, so a crash at any point leaves the last complete checkpoint. Older checkpoint
 * files are removed after. Collective when distributed. */
int qlm_trainer_save(const qlm_trainer *t, const char *dir, const char *extra_json);
/* Restores the newest checkpoint in dir, whatever the number of ranks or the strategy that wrote
 * it (each piece is filled from the pieces that overlap it); *extra_json (malloc'd) gets what
 * save was given. Returns 1 when dir holds no checkpoint, 0 when restored, -1 on error. */
int qlm_trainer_load(qlm_trainer *t, const char *dir, char **extra_json);
/* The extra_json of the newest checkpoint in dir without loading it (to check that it fits this
 * run first): 1 when there is none, 0, or -1 on error. */
int qlm_trainer_peek(const char *dir, char **extra_json);

#endif
