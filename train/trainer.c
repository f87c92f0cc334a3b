/* The trainer: the models it keeps (master, compute copy, F32 gradient and moment twins), one
 * optimizer step (accumulate, reduce, unscale, check, clip, AdamW, refresh the compute copy), the
 * schedule, and evaluation. Where the state lives and the pieces a rank owns: train_shards.c;
 * checkpoints: checkpoint.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../models/param_pack.h"
#include "../quant/fake_quant.h"
#include "trainer_internal.h"

/* INT8 range of QAT: symmetric, as qlm's INT8 weights are (q in [-127, 127], w = q * scale). */
/* QAT's integer range: INT8 symmetric, INT4 as Q4_0 stores it (q - 8 for q in 0..15). */
static int qat_qmin(const qlm_train_options *o) { return o->qat_bits == 4 ? -8 : -127; }
static int qat_qmax(const qlm_train_options *o) { return o->qat_bits == 4 ? 7 : 127; }

/* Weights of a row of cols that share one QAT scale: a group, the whole row (per channel), or 0
 * (one scale for the tensor). Per-group and per-channel scales are then per-row scales of the
 * matrix seen as [rows * cols / span][span]. */
static long qat_span(const qlm_train_options *o, long cols) {
    return o->qat_group ? o->qat_group : o->qat_per_channel ? cols : 0;
}

void qlm_train_options_init(qlm_train_options *o) {
    *o = (qlm_train_options){.mode = QLM_TRAIN_LORA, .compute = QLM_F32, .lr = 2e-4, .min_lr_ratio = 0.1,
                             .schedule = QLM_SCHEDULE_COSINE, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                             .weight_decay = 0.01, .clip = 1.0f, .loss_scale = 65536.0f,
                             .loss_scale_window = 2000, .inject_overflow_step = -1, .qat_bits = 8,
                             .dist = {.strategy = QLM_SHARD_NONE, .prefetch = 1}};
}

static const char *const k_strategy_names[] = {"none", "ddp", "zero1", "zero2", "fsdp"};

const char *qlm_shard_strategy_name(qlm_shard_strategy s) {
    return s >= QLM_SHARD_NONE && s <= QLM_SHARD_FSDP ? k_strategy_names[s] : "?";
}

int qlm_shard_strategy_parse(const char *name, qlm_shard_strategy *out) {
    for (int i = 0; i <= QLM_SHARD_FSDP; i++)
        if (strcmp(name, k_strategy_names[i]) == 0) {
            *out = (qlm_shard_strategy)i;
            return 0;
        }
    return -1;
}

double qlm_train_lr(const qlm_train_options *o, long step) {
    if (o->warmup_steps > 0 && step < o->warmup_steps) return o->lr * (double)(step + 1) / (double)o->warmup_steps;
    if (o->schedule == QLM_SCHEDULE_CONSTANT || o->total_steps <= o->warmup_steps) return o->lr;
    double frac = (double)(step - o->warmup_steps) / (double)(o->total_steps - o->warmup_steps);
    if (frac > 1) frac = 1;
    double min_lr = o->lr * o->min_lr_ratio;
    double shape = o->schedule == QLM_SCHEDULE_LINEAR ? 1.0 - frac : 0.5 * (1.0 + cos(M_PI * frac));
    return min_lr + (o->lr - min_lr) * shape;
}

static int init_full(qlm_trainer *t) {
    const qlm_train_options *o = &t->o;
    const qlm_train_arch *A = t->arch;
    if (A->dtype(t->model) != QLM_F32)
        return qlm_errorf("full training and QAT keep F32 master weights: load the model as f32 (it is %s)",
                          qlm_dtype_name(A->dtype(t->model)));
    int sharded_optim = qlm_train_optim_sharded(o);
    t->grads = calloc(1, A->model_size);
    if (!t->grads || A->twin(t->grads, t->model) != 0) return t->grads ? -1 : qlm_errorf("out of memory");
    /* Sharded moments are parts made by train_shards.c; whole ones are twins of the model. */
    if (!sharded_optim) {
        t->moment1 = calloc(1, A->model_size);
        t->moment2 = calloc(1, A->model_size);
        if (!t->moment1 || !t->moment2) return qlm_errorf("out of memory");
        if (A->twin(t->moment1, t->model) || A->twin(t->moment2, t->model)) return -1;
    }
    qlm_dtype copy = o->mode == QLM_TRAIN_QAT ? QLM_F32 : o->compute;
    if (o->mode == QLM_TRAIN_QAT || copy != QLM_F32) {
        t->compute = calloc(1, A->model_size);
        if (!t->compute || A->build_copy(t->compute, t->model, copy) != 0) return -1;
        t->has_copy = 1;
    }
    return 0;
}

static int init_teacher(qlm_trainer *t) {
    const qlm_train_arch *A = t->arch;
    t->teacher = calloc(1, A->model_size);
    if (!t->teacher) return qlm_errorf("out of memory");
    return A->build_copy(t->teacher, t->model, A->dtype(t->model)) == 0 ? 0
                                                                        : qlm_error_context("distillation's teacher");
}

/* n zeroed floats of the backend's memory. */
static float *zeroed(const qlm_backend *be, size_t n) {
    float *p = be->alloc((n ? n : 1) * sizeof(float));
    if (p) be->zero(p, (long)n);
    return p;
}

static int init_lora(qlm_trainer *t) {
    qlm_lora_adapter *a = t->lora;
    if (!a) return qlm_errorf("LoRA training needs an adapter");
    if (a->dtype != QLM_F32) return qlm_errorf("an adapter trains in F32 (it is %s)", qlm_dtype_name(a->dtype));
    const qlm_backend *be = t->arch->backend(t->model);
    /* The adapter trains where the model runs. */
    if (!be->host_memory && qlm_lora_place(a, be) != 0) return -1;
    size_t floats = a->buffer_bytes / sizeof(float);
    t->lora_train = (qlm_lora_train){.adapter = a, .dropout = t->o.lora_dropout};
    if (!(t->lora_train.grad = zeroed(be, floats))) return -1;
    if (!qlm_train_optim_sharded(&t->o) && (!(t->lora_m = zeroed(be, floats)) || !(t->lora_v = zeroed(be, floats))))
        return -1;
    return 0;
}

static int max_lora_rank(const qlm_lora_adapter *a) {
    int r = 0;
    for (int i = 0; a && i < a->n_modules; i++)
        if (a->modules[i].r > r) r = a->modules[i].r;
    return r;
}

/* QAT: one learned scale per weight matrix (or per row), initialized from the whole weight. The
 * scales are computed on the host (from a host copy of each weight where the backend's memory is
 * not host memory) and then moved into the backend's buffer. */
static int init_qat_scales(qlm_trainer *t) {
    if (t->o.mode != QLM_TRAIN_QAT) return 0;
    const qlm_backend *be = t->arch->backend(t->model);
    qlm_param *mp = NULL;
    int n = t->arch->param_list(t->model, &mp);
    if (n < 0) return -1;
    long scale_values = 0, largest = 0;
    int n_scales = 0;
    for (int i = 0; i < n; i++)
        if (mp[i].matrix) {
            long span = qat_span(&t->o, (long)mp[i].cols);
            if (span && mp[i].cols % span) {
                qlm_errorf("QAT: %s has %lld columns, not whole groups of %ld", mp[i].name, (long long)mp[i].cols, span);
                free(mp);
                return -1;
            }
            n_scales++;
            scale_values += span ? (long)(mp[i].rows * mp[i].cols) / span : 1;
            long sz = (long)(mp[i].rows * mp[i].cols);
            if (sz > largest) largest = sz;
        }
    qlm_train_tensor *grown = realloc(t->t, (size_t)(t->n_t + n_scales) * sizeof *grown);
    if (grown) t->t = grown;
    t->qat_buf = zeroed(be, (size_t)scale_values * 4);
    t->qat_tmp = be->alloc((size_t)(largest ? largest : 1) * sizeof *t->qat_tmp);
    /* Where the starting scales are computed, and where the weights are read from. */
    float *host = be->host_memory ? t->qat_buf : malloc((size_t)(scale_values ? scale_values : 1) * sizeof *host);
    float *wcopy = be->host_memory ? NULL : malloc((size_t)(largest ? largest : 1) * sizeof *wcopy);
    int rc = 0;
    if (!grown || !t->qat_buf || !t->qat_tmp || !host || (!be->host_memory && !wcopy))
        rc = qlm_errorf("out of memory for QAT scales");
    long at = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (!mp[i].matrix) continue;
        long span = qat_span(&t->o, (long)mp[i].cols), k = span ? (long)(mp[i].rows * mp[i].cols) / span : 1;
        qlm_train_tensor *e = &t->t[t->n_t++];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s.qat_scale", mp[i].name);
        float *p = t->qat_buf + at;
        e->p = p, e->g = p + scale_values, e->m = p + 2 * scale_values, e->v = p + 3 * scale_values;
        e->n = e->full_n = k;
        e->rows = k;
        e->param = -1;
        e->qat_scale_of = i;
        e->replicated = 1;
        const float *w = mp[i].matrix->data;
        if (wcopy) {
            be->to_host(wcopy, w, (size_t)(mp[i].rows * mp[i].cols) * sizeof *wcopy);
            w = wcopy;
        }
        float *s = host + at;
        if (span && t->o.qat_bits == 4)
            qlm_fake_quant_init_scales_mse_rows(s, w, (int)k, (int)span, qat_qmin(&t->o), qat_qmax(&t->o));
        else if (span)
            qlm_fake_quant_init_scales_rows(s, w, (int)k, (int)span, qat_qmax(&t->o));
        else
            s[0] = qlm_fake_quant_init_scale(w, (long)(mp[i].rows * mp[i].cols), qat_qmax(&t->o));
        at += k;
    }
    if (rc == 0 && host != t->qat_buf) be->to_device(t->qat_buf, host, (size_t)scale_values * sizeof *host);
    if (host != t->qat_buf) free(host);
    free(wcopy);
    free(mp);
    return rc;
}

int qlm_trainer_init(qlm_trainer *t, qlm_model *llama, qlm_t5_model *t5, qlm_lora_adapter *lora,
                     const qlm_train_options *o, const qlm_train_shape *shape) {
    memset(t, 0, sizeof *t);
    t->o = *o;
    t->arch = t5 ? &qlm_train_arch_t5 : &qlm_train_arch_llama;
    t->model = t5 ? (void *)t5 : (void *)llama;
    t->lora = o->mode == QLM_TRAIN_LORA ? lora : NULL;
    t->loss_scale = o->dynamic_loss_scale ? o->loss_scale : 1.0f;
    if (!llama == !t5) return qlm_errorf("internal: the trainer takes exactly one model");
    const qlm_backend *be = t->arch->backend(t->model);
    if (!be->matmul_backward_x) return qlm_errorf("the %s backend runs inference only", be->name);
    if (o->compute != QLM_F32 && o->compute != QLM_BF16 && o->compute != QLM_F16)
        return qlm_errorf("training computes in f32, bf16 or f16 (not %s)", qlm_dtype_name(o->compute));
    if (o->dynamic_loss_scale && !(o->loss_scale > 0 && isfinite(o->loss_scale)))
        return qlm_errorf("the initial loss scale must be positive and finite");
    if (t->lora && t->lora->is_t5 != (t5 != NULL))
        return qlm_errorf("the adapter is for %s, the model is %s", qlm_lora_arch_name(t->lora), t->arch->name);
    /* The teacher is copied while the master is whole and still the starting weights. */
    int rc = o->distill && o->mode != QLM_TRAIN_LORA ? init_teacher(t) : 0;
    if (rc == 0) rc = o->mode == QLM_TRAIN_LORA ? init_lora(t) : init_full(t);
    /* The scales come from the whole weights, so before anything is split; the pieces go first. */
    if (rc == 0) rc = init_qat_scales(t);
    if (rc == 0) rc = qlm_train_shards_init(t);
    if (rc == 0) {
        t->state = calloc(1, t->arch->state_size);
        rc = t->state ? t->arch->state_init(t->state, qlm_trainer_forward_model(t), shape, o->recompute,
                                            max_lora_rank(t->lora))
                      : qlm_errorf("out of memory");
        if (rc != 0) free(t->state), t->state = NULL;
    }
    if (rc == 0 && o->distill) {
        t->teacher_logits_n = (size_t)shape->max_rows * (size_t)t->arch->vocab(t->model);
        t->teacher_logits = be->alloc(t->teacher_logits_n * sizeof(float));
        if (!t->teacher_logits) rc = qlm_errorf("out of memory (distillation's logits for %d rows)", shape->max_rows);
    }
    if (rc == 0) rc = qlm_trainer_refresh(t);
    if (rc != 0) {
        qlm_trainer_free(t);
        return -1;
    }
    return 0;
}

void qlm_trainer_free(qlm_trainer *t) {
    const qlm_train_arch *A = t->arch;
    if (!A) return;
    if (t->state) A->state_free(t->state, qlm_trainer_forward_model(t));
    free(t->state);
    qlm_train_shards_free(t);
    /* A failed build or twin leaves its model zeroed, which the free functions accept. */
    if (t->compute) A->free_model(t->compute);
    if (t->teacher) A->free_model(t->teacher);
    free(t->teacher);
    const qlm_backend *be = A->backend(t->model);
    be->free(t->teacher_logits);
    void *twins[3] = {t->grads, t->moment1, t->moment2};
    for (int i = 0; i < 3; i++)
        if (twins[i]) A->twin_free(twins[i]);
    free(t->compute), free(t->grads), free(t->moment1), free(t->moment2);
    be->free(t->lora_train.grad);
    be->free(t->lora_m);
    be->free(t->lora_v);
    be->free(t->qat_buf);
    be->free(t->qat_tmp);
    free(t->t);
    memset(t, 0, sizeof *t);
}

const char *qlm_trainer_backend_name(const qlm_trainer *t) { return t->arch->backend(t->model)->name; }

const void *qlm_trainer_forward_model(const qlm_trainer *t) { return t->has_copy ? t->compute : t->model; }

double qlm_trainer_activation_bytes(const qlm_trainer *t) {
    return (t->state ? t->arch->state_bytes(t->state) : 0) + (double)t->teacher_logits_n * sizeof(float);
}

/* The scale entry of the weight of parameter `param`, or NULL. */
static const qlm_train_tensor *qat_scale(const qlm_trainer *t, int param) {
    for (int j = 0; j < t->n_t; j++)
        if (t->t[j].qat_scale_of == param) return &t->t[j];
    return NULL;
}

/* Piece e of a QAT weight as the fake-quantization ops take it: [*rows][*cols] with one scale per
 * row (a group or an output row), from scale *first on; returns 0 for one scale for all. */
static int qat_view(const qlm_trainer *t, const qlm_train_tensor *e, int *rows, int *cols, long *first) {
    const long span = qat_span(&t->o, (long)e->cols);
    *rows = (int)(span ? e->rows * e->cols / span : e->rows);
    *cols = (int)(span ? span : e->cols);
    *first = span ? (long)(e->row0 * (e->cols / span)) : 0;
    return span != 0;
}


/* The compute copy of this rank's pieces from the master weights: cast (mixed precision) or
 * fake-quantized (QAT); then every rank's whole copies current again. */
int qlm_trainer_refresh(qlm_trainer *t) {
    const qlm_backend *be = t->arch->backend(t->model);
    for (int i = 0; i < t->n_t && t->has_copy; i++) {
        const qlm_train_tensor *e = &t->t[i];
        if (e->param < 0) continue;
        qlm_dtype dt;
        void *dst = qlm_train_copy_at(t, e, &dt);
        const qlm_train_tensor *s = t->o.mode == QLM_TRAIN_QAT && e->matrix ? qat_scale(t, e->param) : NULL;
        if (s) {
            int rows, cols;
            long first;
            int per_row = qat_view(t, e, &rows, &cols, &first);
            be->fake_quant_forward(dst, e->p, rows, cols, s->p + first, per_row, qat_qmin(&t->o), qat_qmax(&t->o));
        } else if (e->matrix) {
            qlm_weight w = {.dtype = dt, .rows = (int)e->rows, .cols = (int)e->cols, .data = dst, .scale = 1.0f};
            be->store_weight(&w, e->p);
        } else {
            be->copy(dst, e->p, e->n);
        }
    }
    return qlm_train_sync_params(t);
}

/* QAT: gradients with respect to the fake-quantized weights become the latent weights'
 * (straight-through inside the range) and the scales' (LSQ), piece by piece; the scale
 * gradients are then summed over the ranks that split the weights. */
static int qat_backward(qlm_trainer *t) {
    const qlm_backend *be = t->arch->backend(t->model);
    long scale_values = 0;
    for (int j = 0; j < t->n_t; j++) {
        qlm_train_tensor *e = &t->t[j];
        if (e->replicated) scale_values += e->n;
        const qlm_train_tensor *s = e->param >= 0 && e->matrix ? qat_scale(t, e->param) : NULL;
        if (!s) continue;
        const int qmin = qat_qmin(&t->o), qmax = qat_qmax(&t->o);
        int rows, cols;
        long first;
        int per_row = qat_view(t, e, &rows, &cols, &first);
        /* LSQ's N is the weights one scale quantizes; torch's per-channel form counts the whole tensor,
         * which the INT8 modes keep (they match torch bit for bit), groups their own. */
        float gf = qlm_lsq_grad_factor(t->o.qat_group ? t->o.qat_group : e->full_n, qmax);
        be->zero(t->qat_tmp, e->n);
        be->fake_quant_backward(t->qat_tmp, s->g + first, e->g, e->p, rows, cols, s->p + first, per_row, qmin, qmax,
                                gf);
        be->copy(e->g, t->qat_tmp, e->n);
    }
    return qlm_train_reduce_qat(t, t->qat_buf + scale_values, scale_values);
}

static long count_targets(const qlm_train_batch *b, long *tokens) {
    long n = 0;
    for (int i = 0; i < b->n_rows; i++) n += b->targets[i] >= 0;
    *tokens += b->n_rows + b->n_src_rows;
    return n;
}

static int run_pass(qlm_trainer *t, const qlm_train_batch *b, float grad_scale, int backward, double *loss) {
    const qlm_lora_train *lt = t->lora ? &t->lora_train : NULL;
    const void *g = t->o.mode == QLM_TRAIN_LORA || !backward ? NULL : t->grads;
    if (!t->o.distill) return t->arch->pass(qlm_trainer_forward_model(t), g, lt, t->state, b, grad_scale, backward, loss);
    /* The teacher's pass first, through the same activations: its logits become the targets. */
    qlm_train_batch db = *b;
    db.teacher_logits = t->teacher_logits;
    db.writes_teacher = 1;
    double none = 0;
    if (t->arch->pass(t->teacher ? t->teacher : t->model, NULL, NULL, t->state, &db, 0.0f, 0, &none) != 0)
        return qlm_error_context("distillation's teacher");
    db.writes_teacher = 0;
    return t->arch->pass(qlm_trainer_forward_model(t), g, lt, t->state, &db, grad_scale, backward, loss);
}

int qlm_trainer_step(qlm_trainer *t, const qlm_train_batch *micro, int n_micro, qlm_train_step_stats *st) {
    const qlm_backend *be = t->arch->backend(t->model);
    memset(st, 0, sizeof *st);
    t->sh->comm_s = 0;
    for (int k = 0; k < n_micro; k++) st->n_targets += count_targets(&micro[k], &st->n_tokens);
    /* The loss is the mean over the targets of every rank's micro-batches. */
    double counts[2] = {(double)st->n_targets, (double)st->n_tokens};
    if (qlm_train_sum_world(t, counts, 2) != 0) return qlm_error_context("step %ld", t->step + 1);
    st->n_targets = (long)counts[0], st->n_tokens = (long)counts[1];
    if (st->n_targets == 0) return qlm_errorf("step %ld: the batch has no target tokens", t->step + 1);
    qlm_train_zero_grads(t);
    float grad_scale = t->loss_scale / (float)st->n_targets;
    double loss = 0;
    for (int k = 0; k < n_micro; k++) {
        t->lora_train.dropout_seed = t->o.seed * 0x9e3779b97f4a7c15ULL + (uint64_t)t->step * 1000003u + (uint64_t)k;
        if (run_pass(t, &micro[k], grad_scale, 1, &loss) != 0) return qlm_error_context("step %ld", t->step + 1);
    }
    if (qlm_train_reduce_grads(t) != 0 || qlm_train_sum_world(t, &loss, 1) != 0)
        return qlm_error_context("step %ld", t->step + 1);
    st->loss = loss / (double)st->n_targets;
    if (t->o.inject_overflow_step == t->step && t->n_t > 0) {
        const float inf = INFINITY;
        be->to_device(t->t[0].g, &inf, sizeof inf);
    }
    if (t->o.mode == QLM_TRAIN_QAT && qat_backward(t) != 0) return qlm_error_context("step %ld", t->step + 1);
    /* The gradients stay multiplied by the loss scale: the norm and the update unscale them as they
     * read them (a power of two, as the dynamic scale always is, multiplies exactly, so the results
     * are those of unscaling in place, as torch's GradScaler does, without a pass over them). */
    const double unscale = 1.0 / t->loss_scale;
    double ss = 0;
    if (qlm_train_grad_sumsq(t, &ss) != 0) return qlm_error_context("step %ld", t->step + 1);
    st->grad_norm = sqrt(ss * unscale * unscale);
    st->lr = qlm_train_lr(&t->o, t->step);
    st->loss_scale = t->loss_scale;
    t->step++;
    /* Every rank has the same norm, so every rank takes the same decision. */
    if (!isfinite(st->grad_norm)) {
        st->skipped = 1;
        if (t->o.dynamic_loss_scale) t->loss_scale *= 0.5f;
        t->clean_steps = 0;
        st->comm_s = t->sh->comm_s;
        return 0;
    }
    if (t->o.dynamic_loss_scale && ++t->clean_steps >= t->o.loss_scale_window) {
        t->loss_scale *= 2.0f;
        t->clean_steps = 0;
    }
    /* Clipping scales the gradients as AdamW reads them (torch's clip_grad_norm_ factor, in the
     * update's one pass), with the unscale: the gradients in memory stay the step's own. */
    float clip = t->o.clip > 0 ? (float)(t->o.clip / (st->grad_norm + 1e-6)) : 1.0f;
    qlm_adamw_step h = {.lr = st->lr, .beta1 = t->o.beta1, .beta2 = t->o.beta2, .eps = t->o.eps,
                        .weight_decay = t->o.weight_decay, .step = ++t->adam_step,
                        .grad_mul = (float)(fminf(clip, 1.0f) * unscale)};
    be->adamw(&t->sh->adamw, &h);
    for (int i = 0; i < t->n_t; i++)
        if (t->t[i].qat_scale_of >= 0) be->fake_quant_clamp_scales(t->t[i].p, t->t[i].n);
    int rc = qlm_trainer_refresh(t);
    st->comm_s = t->sh->comm_s;
    return rc == 0 ? 0 : qlm_error_context("step %ld", t->step);
}

int qlm_trainer_eval(qlm_trainer *t, const qlm_train_batch *b, double *loss_sum, long *n_targets) {
    long tokens = 0;
    *n_targets += count_targets(b, &tokens);
    float dropout = t->lora_train.dropout;
    t->lora_train.dropout = 0; /* evaluation sees the whole adapter */
    int rc = run_pass(t, b, 0.0f, 0, loss_sum);
    t->lora_train.dropout = dropout;
    return rc;
}
