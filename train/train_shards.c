/* Where the trainer's per-unit state lives and which pieces of it this rank owns.
 *
 * The trained parameters (the master model's units, or the adapter as one unit) are cut among the
 * S ranks of a shard group (S = 1 for one process and for DDP). Each kind of state is whole on
 * every rank or split into the rank's parts:
 *   moments            whole when S = 1, else parts (ZeRO-1 and up);
 *   master weights     whole, or parts when a compute copy is what the passes read and S > 1
 *                      (the F32 master is optimizer state then), or under FSDP;
 *   gradients          whole (reduced after the passes), or parts (ZeRO-2, FSDP: each unit's
 *                      gradients reduce-scattered as its backward ends, dist/shard.c);
 *   compute copy       whole, or parts under FSDP;
 *   frozen LoRA base   whole, or parts under FSDP.
 * A rank's trainable entries are the pieces of each tensor inside its part of the unit, so the
 * optimizer, clipping and the compute copy's refresh run on the pieces alone; then the whole
 * copies of what the passes read are gathered again (ZeRO-1/2) or stay split (FSDP). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/clock.h"
#include "../core/error.h"
#include "trainer_internal.h"


static int full_training(const qlm_trainer *t) { return t->o.mode != QLM_TRAIN_LORA; }

int qlm_train_optim_sharded(const qlm_train_options *o) {
    const qlm_train_dist *d = &o->dist;
    int N = d->world ? d->world->size : 1, F = d->factor > 0 ? d->factor : N;
    return N > 1 && d->strategy >= QLM_SHARD_ZERO1 && F > 1;
}

static void install_hooks(qlm_trainer *t, void *model, const qlm_unit_hooks *h) {
    if (t->arch == &qlm_train_arch_llama) ((qlm_model *)model)->hooks = h;
    else ((qlm_t5_model *)model)->hooks = h;
}

static qlm_cut *make_cuts(const qlm_param *p, const qlm_unit *u, int n_units, int S) {
    qlm_cut *c = malloc((size_t)n_units * (S + 1) * sizeof *c);
    if (!c) {
        qlm_errorf("out of memory");
        return NULL;
    }
    for (int k = 0; k < n_units; k++) qlm_cuts_make(p + u[k].first, u[k].count, S, c + (size_t)k * (S + 1));
    return c;
}

/* A layout of model m's units: with the given cuts, or (cuts NULL) cuts of its own, returned in
 * *own_cuts. */
static int layout_of(qlm_trainer *t, void *m, const qlm_cut *cuts, qlm_layout *L, qlm_cut **own_cuts) {
    struct qlm_train_shards *sh = t->sh;
    qlm_param *p = NULL;
    qlm_unit *u = NULL;
    int n = 0, n_units = m == t->lora ? qlm_lora_units(t->lora, &p, &n, &u) : t->arch->units(m, &p, &n, &u);
    if (n_units < 0) return -1;
    if (!cuts) {
        *own_cuts = make_cuts(p, u, n_units, sh->S);
        if (!*own_cuts) {
            free(p);
            free(u);
            return -1;
        }
        cuts = *own_cuts;
    }
    return qlm_layout_init(L, p, n, u, n_units, cuts, sh->S, sh->rank);
}

static int make_groups(qlm_trainer *t) {
    struct qlm_train_shards *sh = t->sh;
    const qlm_train_dist *d = &t->o.dist;
    int N = d->world ? d->world->size : 1;
    sh->world = d->world;
    sh->strategy = N > 1 ? (d->strategy == QLM_SHARD_NONE ? QLM_SHARD_DDP : d->strategy) : QLM_SHARD_NONE;
    int F = d->factor > 0 ? d->factor : N;
    if (F > N || N % F != 0) return qlm_errorf("the sharding factor %d must divide the %d ranks", F, N);
    sh->S = sh->strategy >= QLM_SHARD_ZERO1 ? F : 1;
    if (N == 1) return 0;
    int r = d->world->rank;
    sh->group = qlm_comm_split(d->world, r / sh->S, r);
    sh->replica = sh->group ? qlm_comm_split(d->world, r % sh->S, r) : NULL;
    if (!sh->group || !sh->replica) return qlm_error_context("making the shard groups");
    sh->rank = sh->group->rank;
    return 0;
}

static void **parts_of(qlm_shard *s, int n_units, int grads) {
    void **p = calloc((size_t)n_units, sizeof *p);
    if (!p) {
        qlm_errorf("out of memory");
        return NULL;
    }
    for (int u = 0; u < n_units; u++) p[u] = grads ? (void *)qlm_shard_grads_part(s, u) : qlm_shard_params_part(s, u);
    return p;
}

/* Zeroed parts of the trained parameters' layout, one per unit (sharded moments). */
static void **zero_parts(qlm_trainer *t) {
    struct qlm_train_shards *sh = t->sh;
    const qlm_backend *be = t->arch->backend(t->model);
    void **p = calloc((size_t)sh->n_units, sizeof *p);
    if (!p) {
        qlm_errorf("out of memory");
        return NULL;
    }
    for (int u = 0; u < sh->n_units; u++) {
        size_t bytes = qlm_layout_part(&sh->Lm, u, sh->rank);
        p[u] = be->alloc(bytes ? bytes : 64);
        if (!p[u]) return p; /* freed with the others */
        be->zero(p[u], (long)(bytes / sizeof(float)));
    }
    return p;
}

/* Splits what the strategy splits: the shards of the model the passes read (and their hooks),
 * the master's parts, the moments' parts. */
static int split_state(qlm_trainer *t) {
    struct qlm_train_shards *sh = t->sh;
    const qlm_backend *be = t->arch->backend(t->model);
    void *fwd = (void *)qlm_trainer_forward_model(t);
    int n = sh->n_units;
    if (!full_training(t)) {
        if (sh->params_sharded) {
            qlm_cut *base_cuts = NULL;
            int rc = layout_of(t, t->model, NULL, &sh->Lb, &base_cuts);
            if (rc == 0) sh->fwd = qlm_shard_new(sh->group, be, &sh->Lb, 1, NULL, t->o.dist.prefetch);
            free(base_cuts);
            if (!sh->fwd) return -1;
        }
    } else {
        if (sh->grads_sharded && layout_of(t, t->grads, sh->cuts, &sh->Lg, NULL) != 0) return -1;
        if (t->has_copy && layout_of(t, t->compute, sh->cuts, &sh->Lc, NULL) != 0) return -1;
        if (sh->params_sharded || sh->grads_sharded) {
            qlm_layout *P = sh->params_sharded ? (t->has_copy ? &sh->Lc : &sh->Lm) : NULL;
            sh->fwd = qlm_shard_new(sh->group, be, P, sh->params_sharded, sh->grads_sharded ? &sh->Lg : NULL,
                                    t->o.dist.prefetch);
            if (!sh->fwd) return -1;
        }
        if (t->has_copy && sh->S > 1 && !(sh->master = qlm_shard_new(sh->group, be, &sh->Lm, 1, NULL, 0))) return -1;
        if (sh->master && !(sh->master_part = parts_of(sh->master, n, 0))) return -1;
        if (sh->params_sharded && !t->has_copy && !(sh->master_part = parts_of(sh->fwd, n, 0))) return -1;
        if (sh->params_sharded && t->has_copy && !(sh->copy_part = parts_of(sh->fwd, n, 0))) return -1;
        if (sh->grads_sharded && !(sh->grads_part = parts_of(sh->fwd, n, 1))) return -1;
    }
    if (sh->fwd) install_hooks(t, fwd, qlm_shard_hooks(sh->fwd));
    if (sh->S > 1) {
        sh->m_part = zero_parts(t);
        sh->v_part = zero_parts(t);
        for (int u = 0; u < n && sh->m_part && sh->v_part; u++)
            if (!sh->m_part[u] || !sh->v_part[u]) return -1;
        if (!sh->m_part || !sh->v_part) return -1;
    }
    return 0;
}

/* Where element e of trained parameter i lies: in a whole model (list: its parameters), or in
 * this rank's part of its unit. */
static void *whole_at(const qlm_param *list, int i, int64_t e) {
    const qlm_param *p = &list[i];
    size_t esize = p->matrix ? qlm_dtype_size(p->matrix->dtype) : sizeof(float);
    return (char *)(p->matrix ? (void *)p->matrix->data : (void *)*p->vector) + (size_t)e * esize;
}

static void *part_at(const qlm_layout *L, void *const *parts, int u, int i, int64_t e, int rank) {
    return (char *)parts[u] + (qlm_layout_elem(L, i, e) - qlm_layout_begin(L, u, rank));
}

static int unit_of(const qlm_layout *L, int i) {
    int u = 0;
    while (u + 1 < L->n_units && L->units[u + 1].first <= i) u++;
    return u;
}

void *qlm_train_copy_at(const qlm_trainer *t, const qlm_train_tensor *e, qlm_dtype *dtype) {
    const struct qlm_train_shards *sh = t->sh;
    const qlm_param *p = &sh->Lc.params[e->param];
    *dtype = p->matrix ? p->matrix->dtype : QLM_F32;
    if (sh->copy_part) return part_at(&sh->Lc, sh->copy_part, unit_of(&sh->Lc, e->param), e->param, e->offset, sh->rank);
    return whole_at(sh->Lc.params, e->param, e->offset);
}

/* The parameter list of a model whose state stays whole (NULL: none). */
static qlm_param *params_of(qlm_trainer *t, void *m, int *fail) {
    if (!m) return NULL;
    qlm_param *p = NULL;
    int n = 0;
    if (t->arch->units(m, &p, &n, NULL) < 0) *fail = 1;
    return p;
}

/* The pieces of every trained tensor inside this rank's parts, followed by the entries already
 * listed (QAT scales, whole on every rank). */
static int list_pieces(qlm_trainer *t) {
    struct qlm_train_shards *sh = t->sh;
    const qlm_layout *L = &sh->Lm;
    int fail = 0, full = full_training(t);
    qlm_param *grads = full && !sh->grads_part ? params_of(t, t->grads, &fail) : NULL;
    qlm_param *m1 = full ? params_of(t, t->moment1, &fail) : NULL, *m2 = full ? params_of(t, t->moment2, &fail) : NULL;
    qlm_train_tensor *list = fail ? NULL : calloc((size_t)L->n_params + (size_t)t->n_t + 1, sizeof *list);
    if (!list) {
        free(grads), free(m1), free(m2);
        return fail ? -1 : qlm_errorf("out of memory");
    }
    int n = 0;
    for (int u = 0; u < L->n_units; u++) {
        const qlm_unit *un = &L->units[u];
        qlm_cut lo = sh->cuts[(size_t)u * (sh->S + 1) + sh->rank], hi = sh->cuts[(size_t)u * (sh->S + 1) + sh->rank + 1];
        for (int k = 0; k < un->count; k++) {
            int i = un->first + k;
            const qlm_param *p = &L->params[i];
            int64_t re = p->cols ? p->cols : 1;
            int64_t r0 = lo.param > k ? p->rows : lo.param == k ? lo.row : 0;
            int64_t r1 = hi.param > k ? p->rows : hi.param == k ? hi.row : 0;
            if (r1 <= r0) continue;
            qlm_train_tensor *e = &list[n++];
            snprintf(e->name, sizeof e->name, "%s", p->name);
            e->param = i, e->qat_scale_of = -1, e->matrix = p->matrix != NULL;
            e->row0 = r0, e->rows = r1 - r0, e->cols = p->cols;
            e->offset = (long)(r0 * re), e->n = (long)((r1 - r0) * re), e->full_n = (long)(p->rows * re);
            e->decay = full ? p->cols != 0 : 1;
            int64_t at = r0 * re;
            e->p = sh->master_part ? part_at(L, sh->master_part, u, i, at, sh->rank) : whole_at(L->params, i, at);
            if (full) {
                e->g = sh->grads_part ? part_at(&sh->Lg, sh->grads_part, u, i, at, sh->rank) : whole_at(grads, i, at);
                e->m = sh->m_part ? part_at(L, sh->m_part, u, i, at, sh->rank) : whole_at(m1, i, at);
                e->v = sh->v_part ? part_at(L, sh->v_part, u, i, at, sh->rank) : whole_at(m2, i, at);
            } else {
                size_t off = qlm_layout_elem(L, i, at) / sizeof(float);
                e->g = t->lora_train.grad + off;
                e->m = sh->m_part ? part_at(L, sh->m_part, u, i, at, sh->rank) : t->lora_m + off;
                e->v = sh->v_part ? part_at(L, sh->v_part, u, i, at, sh->rank) : t->lora_v + off;
            }
        }
    }
    if (t->n_t) memcpy(list + n, t->t, (size_t)t->n_t * sizeof *list);
    free(t->t);
    t->t = list;
    t->n_t += n;
    free(grads), free(m1), free(m2);
    return 0;
}

/* Unit u's whole gradient buffer and its values (gradients not split). */
static float *whole_grads(const qlm_trainer *t, int u, long *n) {
    const struct qlm_train_shards *sh = t->sh;
    *n = (long)(sh->grads_bytes[u] / sizeof(float));
    return sh->grads_whole[u];
}

/* Records where each unit's whole gradients are: the F32 twin's buffers, or the adapter's. */
static int find_whole_grads(qlm_trainer *t) {
    struct qlm_train_shards *sh = t->sh;
    sh->grads_whole = calloc((size_t)sh->n_units, sizeof *sh->grads_whole);
    sh->grads_bytes = calloc((size_t)sh->n_units, sizeof *sh->grads_bytes);
    if (!sh->grads_whole || !sh->grads_bytes) return qlm_errorf("out of memory");
    if (!full_training(t)) {
        sh->grads_whole[0] = t->lora_train.grad;
        sh->grads_bytes[0] = sh->Lm.bytes[0];
        return 0;
    }
    qlm_param *p = NULL;
    qlm_unit *units = NULL;
    int np = 0, nu = t->arch->units(t->grads, &p, &np, &units);
    for (int u = 0; u < nu && u < sh->n_units; u++) {
        sh->grads_whole[u] = *units[u].buffer;
        sh->grads_bytes[u] = *units[u].bytes;
    }
    free(p);
    free(units);
    return nu < 0 ? -1 : 0;
}

int qlm_train_shards_init(qlm_trainer *t) {
    struct qlm_train_shards *sh = calloc(1, sizeof *sh);
    if (!sh) return qlm_errorf("out of memory");
    t->sh = sh;
    if (make_groups(t) != 0) return -1;
    int full = full_training(t);
    sh->grads_sharded = full && sh->strategy >= QLM_SHARD_ZERO2 && sh->S > 1;
    sh->params_sharded = sh->strategy == QLM_SHARD_FSDP && sh->S > 1;
    if (layout_of(t, full ? t->model : (void *)t->lora, NULL, &sh->Lm, &sh->cuts) != 0) return -1;
    sh->n_units = sh->Lm.n_units;
    if (split_state(t) != 0 || list_pieces(t) != 0) return -1;
    size_t n = t->n_t > 0 ? (size_t)t->n_t : 1;
    sh->piece_g = malloc(n * sizeof *sh->piece_g);
    sh->piece_n = malloc(n * sizeof *sh->piece_n);
    sh->norm_sums = malloc(n * sizeof *sh->norm_sums);
    sh->piece_p = malloc(n * sizeof *sh->piece_p);
    sh->piece_m = malloc(n * sizeof *sh->piece_m);
    sh->piece_v = malloc(n * sizeof *sh->piece_v);
    sh->piece_decay = malloc(n);
    if (!sh->piece_g || !sh->piece_n || !sh->norm_sums || !sh->piece_p || !sh->piece_m || !sh->piece_v ||
        !sh->piece_decay)
        return qlm_errorf("out of memory");
    for (int i = 0; i < t->n_t; i++) {
        const qlm_train_tensor *e = &t->t[i];
        sh->piece_g[i] = e->g, sh->piece_n[i] = e->n, sh->piece_decay[i] = e->decay != 0;
        sh->piece_p[i] = e->p, sh->piece_m[i] = e->m, sh->piece_v[i] = e->v;
    }
    sh->adamw = (qlm_adamw_tensors){.p = sh->piece_p, .m = sh->piece_m, .v = sh->piece_v, .g = sh->piece_g,
                                    .n = sh->piece_n, .decay = sh->piece_decay, .count = t->n_t};
    return sh->grads_part ? 0 : find_whole_grads(t);
}

static void free_parts(const qlm_backend *be, void **p, int n, int owned) {
    for (int u = 0; p && owned && u < n; u++) be->free(p[u]);
    free(p);
}

void qlm_train_shards_free(qlm_trainer *t) {
    struct qlm_train_shards *sh = t->sh;
    if (!sh) return;
    const qlm_backend *be = t->arch->backend(t->model);
    if (sh->fwd) install_hooks(t, (void *)qlm_trainer_forward_model(t), NULL);
    qlm_shard_free(sh->fwd);
    qlm_shard_free(sh->master);
    free_parts(be, sh->master_part, sh->n_units, 0);
    free_parts(be, sh->grads_part, sh->n_units, 0);
    free_parts(be, sh->copy_part, sh->n_units, 0);
    free_parts(be, sh->m_part, sh->n_units, 1);
    free_parts(be, sh->v_part, sh->n_units, 1);
    qlm_layout_free(&sh->Lm);
    qlm_layout_free(&sh->Lg);
    qlm_layout_free(&sh->Lc);
    qlm_layout_free(&sh->Lb);
    free(sh->cuts);
    free(sh->grads_whole);
    free(sh->grads_bytes);
    free(sh->piece_g);
    free(sh->piece_n);
    free(sh->norm_sums);
    free(sh->piece_p);
    free(sh->piece_m);
    free(sh->piece_v);
    free(sh->piece_decay);
    qlm_comm_free(sh->replica);
    qlm_comm_free(sh->group);
    free(sh);
    t->sh = NULL;
}

/* ---- the distributed parts of a step ---- */

static int timed(struct qlm_train_shards *sh, int rc, double t0) {
    sh->comm_s += qlm_now_s() - t0;
    return rc;
}

int qlm_train_sum_world(const qlm_trainer *t, double *x, int n) {
    struct qlm_train_shards *sh = t->sh;
    if (!sh->world || sh->world->size == 1) return 0;
    double t0 = qlm_now_s();
    return timed(sh, qlm_comm_sum_host(sh->world, x, n), t0);
}

int qlm_train_grad_sumsq(const qlm_trainer *t, double *ss) {
    const qlm_backend *be = t->arch->backend(t->model);
    struct qlm_train_shards *sh = t->sh;
    be->sum_squares(sh->norm_sums, sh->piece_g, sh->piece_n, t->n_t);
    double pieces = 0, replicated = 0;
    for (int i = 0; i < t->n_t; i++) {
        if (t->t[i].replicated) replicated += sh->norm_sums[i];
        else pieces += sh->norm_sums[i];
    }
    if (sh->group && sh->group->size > 1) {
        double t0 = qlm_now_s();
        if (timed(sh, qlm_comm_sum_host(sh->group, &pieces, 1), t0) != 0) return -1;
    }
    *ss = pieces + replicated;
    return 0;
}

void qlm_train_zero_grads(qlm_trainer *t) {
    struct qlm_train_shards *sh = t->sh;
    const qlm_backend *be = t->arch->backend(t->model);
    for (int i = 0; i < t->n_t; i++)
        if (t->t[i].replicated) be->zero(t->t[i].g, t->t[i].n);
    for (int u = 0; u < sh->n_units; u++) {
        if (sh->grads_part) {
            be->zero(sh->grads_part[u], (long)(qlm_layout_part(&sh->Lg, u, sh->rank) / sizeof(float)));
            continue;
        }
        long n;
        float *g = whole_grads(t, u, &n);
        be->zero(g, n);
    }
}

int qlm_train_reduce_grads(qlm_trainer *t) {
    struct qlm_train_shards *sh = t->sh;
    double t0 = qlm_now_s();
    if (sh->fwd && qlm_shard_flush(sh->fwd) != 0) return timed(sh, -1, t0);
    if (!sh->world || sh->world->size == 1) return timed(sh, 0, t0);
    size_t *off = malloc((size_t)(sh->S + 1) * sizeof *off);
    if (!off) return qlm_errorf("out of memory");
    int rc = 0;
    for (int u = 0; u < sh->n_units && rc == 0; u++) {
        const qlm_layout *L = sh->grads_part ? &sh->Lg : &sh->Lm;
        float *part;
        long part_n = (long)(qlm_layout_part(L, u, sh->rank) / sizeof(float));
        if (sh->grads_part) {
            part = sh->grads_part[u];
        } else {
            long n;
            float *g = whole_grads(t, u, &n);
            if (sh->S == 1) {
                /* DDP: every rank keeps the whole sum. */
                rc = qlm_comm_allreduce(sh->replica, g, (size_t)n);
                continue;
            }
            for (int r = 0; r <= sh->S; r++) off[r] = qlm_layout_begin(L, u, r) / sizeof(float);
            part = g + off[sh->rank];
            rc = qlm_comm_reduce_scatter(sh->group, part, g, off, 0);
        }
        if (rc == 0 && sh->replica->size > 1 && part_n) rc = qlm_comm_allreduce(sh->replica, part, (size_t)part_n);
    }
    free(off);
    return timed(sh, rc, t0);
}

int qlm_train_reduce_qat(qlm_trainer *t, float *scale_grads, long n) {
    struct qlm_train_shards *sh = t->sh;
    if (!sh->group || sh->group->size == 1 || n == 0) return 0;
    double t0 = qlm_now_s();
    return timed(sh, qlm_comm_allreduce(sh->group, scale_grads, (size_t)n), t0);
}

/* Every rank's whole copy of each unit of L (the parts written by their owners) gathered. */
static int gather_whole(struct qlm_train_shards *sh, const qlm_layout *L) {
    size_t *off = malloc((size_t)(sh->S + 1) * sizeof *off);
    if (!off) return qlm_errorf("out of memory");
    int rc = 0;
    for (int u = 0; u < L->n_units && rc == 0; u++) {
        for (int r = 0; r <= sh->S; r++) off[r] = qlm_layout_begin(L, u, r);
        rc = qlm_comm_allgather(sh->group, *L->units[u].buffer, off);
    }
    free(off);
    return rc;
}

int qlm_train_sync_params(qlm_trainer *t) {
    struct qlm_train_shards *sh = t->sh;
    double t0 = qlm_now_s();
    int rc = 0;
    if (sh->S > 1 && (!full_training(t) || !sh->params_sharded)) {
        /* What the passes read whole: the adapter (replicated under FSDP too), the compute copy,
         * or the master itself. */
        const qlm_layout *L = !full_training(t) ? &sh->Lm : t->has_copy ? &sh->Lc : &sh->Lm;
        rc = gather_whole(sh, L);
    }
    /* Gathered units kept between passes, and prefetches, hold the old values. */
    if (rc == 0 && sh->fwd && qlm_shard_drop(sh->fwd) != 0) rc = -1;
    void *fwd = (void *)qlm_trainer_forward_model(t);
    if (rc == 0 && !sh->params_sharded) {
        t->arch->refresh(fwd);
    } else if (rc == 0 && full_training(t) && t->arch->derived) {
        /* The derived tensors come from unit 0, split under FSDP: gathered for the refresh. */
        const qlm_unit_hooks *h = qlm_shard_hooks(sh->fwd);
        rc = qlm_unit_begin(h, QLM_PASS_REFRESH) != 0 ? -1 : qlm_unit_use(h, 0);
        if (rc == 0) {
            t->arch->refresh(fwd);
            qlm_unit_done(h, 0);
        }
    }
    return timed(sh, rc, t0);
}

int qlm_trainer_consolidate(qlm_trainer *t) {
    struct qlm_train_shards *sh = t->sh;
    if (sh->master && qlm_shard_consolidate(sh->master) != 0) return -1;
    if (sh->params_sharded && !t->has_copy && full_training(t) && qlm_shard_consolidate(sh->fwd) != 0) return -1;
    /* The master's views were rebased to the gathered buffers; the pieces still point into the parts,
     * which consolidation freed: a consolidated trainer takes no more steps. */
    if (sh->master || (sh->params_sharded && !t->has_copy && full_training(t))) {
        free(sh->master_part);
        sh->master_part = NULL;
        if (sh->fwd && !t->has_copy) install_hooks(t, t->model, NULL);
    }
    return 0;
}

qlm_train_memory qlm_trainer_memory(const qlm_trainer *t) {
    const struct qlm_train_shards *sh = t->sh;
    qlm_train_memory mem = {0};
    double master = 0, moments = 0, grads = 0, params = 0, teacher = 0;
    for (int u = 0; u < sh->n_units; u++) {
        double whole = (double)sh->Lm.bytes[u], part = (double)qlm_layout_part(&sh->Lm, u, sh->rank);
        if (t->teacher) teacher += whole;
        master += sh->master_part ? part : whole;
        moments += 2 * (sh->m_part ? part : whole);
        grads += sh->grads_part ? (double)qlm_layout_part(&sh->Lg, u, sh->rank) : whole;
        if (t->has_copy) params += sh->copy_part ? (double)qlm_layout_part(&sh->Lc, u, sh->rank) : (double)sh->Lc.bytes[u];
    }
    for (int i = 0; i < t->n_t; i++)
        if (t->t[i].replicated) moments += 4.0 * t->t[i].n * sizeof(float);
    if (!full_training(t)) {
        const qlm_layout *B = sh->fwd ? &sh->Lb : NULL;
        qlm_param *p = NULL;
        qlm_unit *u = NULL;
        int np = 0, nu = B ? 0 : t->arch->units(t->model, &p, &np, &u);
        for (int k = 0; k < (B ? B->n_units : nu); k++)
            mem.params += B ? (double)qlm_layout_part(B, k, sh->rank) : (double)*u[k].bytes;
        free(p);
        free(u);
        mem.params += master; /* the adapter */
        mem.grads = grads;
        mem.optim = moments;
    } else if (t->has_copy) {
        mem.params = params;
        mem.grads = grads;
        mem.optim = moments + master;
    } else {
        mem.params = master;
        mem.grads = grads;
        mem.optim = moments;
    }
    mem.params += teacher; /* distillation's frozen copy, whole on every rank */
    if (sh->fwd) {
        qlm_shard_memory sm = qlm_shard_memory_now(sh->fwd);
        mem.transient_peak = sm.buffers_peak;
    }
    return mem;
}

qlm_train_split qlm_trainer_split(const qlm_trainer *t) {
    const struct qlm_train_shards *sh = t->sh;
    int N = sh->world ? sh->world->size : 1;
    qlm_train_split out = {.strategy = sh->strategy, .group = sh->S, .replicas = N / sh->S};
    if (sh->fwd) qlm_shard_timing(sh->fwd, &out.gather_wait_s, &out.gathers, &out.gathers_unused);
    return out;
}
