/* Unit sharding: cut points, layouts, and the hooks that gather parameters and reduce-scatter
 * gradients around each unit's use (see shard.h). */
#include "../core/clock.h"
#include "shard.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/error.h"

/* ---- cuts ---- */

static int64_t row_elems(const qlm_param *p) { return p->cols ? p->cols : 1; }
static int64_t param_elems(const qlm_param *p) { return p->rows * row_elems(p); }

void qlm_cuts_make(const qlm_param *p, int count, int size, qlm_cut *cuts) {
    int64_t total = 0;
    for (int i = 0; i < count; i++) total += param_elems(&p[i]);
    cuts[0] = (qlm_cut){0, 0};
    cuts[size] = (qlm_cut){count, 0};
    int i = 0;
    int64_t start = 0; /* elements before parameter i */
    for (int k = 1; k < size; k++) {
        int64_t target = (int64_t)((__int128)total * k / size);
        while (i < count && start + param_elems(&p[i]) <= target) start += param_elems(&p[i++]);
        if (i == count) {
            cuts[k] = (qlm_cut){count, 0};
            continue;
        }
        /* the row boundary nearest the target, never before the previous cut */
        int64_t re = row_elems(&p[i]), row = (target - start + re / 2) / re;
        qlm_cut c = row >= p[i].rows ? (qlm_cut){i + 1, 0} : (qlm_cut){i, row};
        const qlm_cut *prev = &cuts[k - 1];
        if (c.param < prev->param || (c.param == prev->param && c.row < prev->row)) c = *prev;
        cuts[k] = c;
    }
}

/* ---- layouts ---- */

static const void *param_data(const qlm_param *p) { return p->matrix ? p->matrix->data : (const void *)*p->vector; }

static size_t row_bytes(const qlm_param *p) {
    return p->matrix ? (size_t)p->cols * qlm_dtype_size(p->matrix->dtype) : (size_t)row_elems(p) * sizeof(float);
}

int qlm_layout_init(qlm_layout *L, qlm_param *params, int n_params, qlm_unit *units, int n_units,
                    const qlm_cut *cuts, int size, int rank) {
    memset(L, 0, sizeof *L);
    /* Parts are cut at element offsets, which block types do not have. */
    for (int i = 0; i < n_params; i++)
        if (params[i].matrix && qlm_dtype_is_block(params[i].matrix->dtype))
            return qlm_errorf("%s: sharding %s weights is not supported: load the model with --dtype bf16 or int8",
                              params[i].name, qlm_dtype_name(params[i].matrix->dtype));
    L->params = params, L->n_params = n_params, L->units = units, L->n_units = n_units;
    L->size = size, L->rank = rank;
    L->cut = malloc((size_t)n_units * (size + 1) * sizeof *L->cut);
    L->data_off = malloc((size_t)(n_params ? n_params : 1) * sizeof *L->data_off);
    L->scale_off = malloc((size_t)(n_params ? n_params : 1) * sizeof *L->scale_off);
    L->bytes = malloc((size_t)n_units * sizeof *L->bytes);
    if (!L->cut || !L->data_off || !L->scale_off || !L->bytes) {
        qlm_layout_free(L);
        return qlm_errorf("out of memory");
    }
    for (int u = 0; u < n_units; u++) {
        const qlm_unit *un = &units[u];
        const char *base = *un->buffer;
        L->bytes[u] = *un->bytes;
        for (int i = un->first; i < un->first + un->count; i++) {
            const qlm_param *p = &params[i];
            const char *d = param_data(p);
            if (!base || d < base || d >= base + L->bytes[u]) {
                qlm_layout_free(L);
                return qlm_errorf("internal: parameter %s is not inside its unit's buffer", p->name);
            }
            L->data_off[i] = (size_t)(d - base);
            L->scale_off[i] = p->matrix && p->matrix->row_scales ? (size_t)((const char *)p->matrix->row_scales - base)
                                                                  : SIZE_MAX;
        }
        for (int k = 0; k <= size; k++) {
            qlm_cut c = cuts[(size_t)u * (size + 1) + k];
            L->cut[(size_t)u * (size + 1) + k] =
                c.param >= un->count ? L->bytes[u]
                                     : L->data_off[un->first + c.param] + (size_t)c.row * row_bytes(&params[un->first + c.param]);
        }
    }
    return 0;
}

void qlm_layout_free(qlm_layout *L) {
    free(L->params);
    free(L->units);
    free(L->cut);
    free(L->data_off);
    free(L->scale_off);
    free(L->bytes);
    memset(L, 0, sizeof *L);
}

void qlm_layout_point(const qlm_layout *L, int u, void *buffer) {
    const qlm_unit *un = &L->units[u];
    char *b = buffer;
    *un->buffer = buffer;
    for (int i = un->first; i < un->first + un->count; i++) {
        const qlm_param *p = &L->params[i];
        if (p->matrix) {
            p->matrix->data = b ? b + L->data_off[i] : NULL;
            if (L->scale_off[i] != SIZE_MAX) p->matrix->row_scales = b ? (const float *)(b + L->scale_off[i]) : NULL;
        } else {
            *p->vector = b ? (float *)(b + L->data_off[i]) : NULL;
        }
    }
    for (int i = 0; i < un->n_views; i++) qlm_weight_view_refresh(&un->views[i]);
}

size_t qlm_layout_elem(const qlm_layout *L, int i, int64_t e) {
    const qlm_param *p = &L->params[i];
    size_t esize = p->matrix ? qlm_dtype_size(p->matrix->dtype) : sizeof(float);
    return L->data_off[i] + (size_t)e * esize;
}

/* ---- the shard ---- */

enum { MAX_PENDING = 2, POOL = 8 };

/* Whole-unit buffers freed by one use and taken by the next: allocating and freeing them per use
 * costs page faults and zeroing of every page on the CPU (a decode step gathers every unit). */
typedef struct {
    void *p[POOL];
    size_t bytes[POOL];
    int n;
} buffer_pool;

typedef struct {
    qlm_comm_op *op;
    float *buf;
    size_t bytes;
} pending_rs;

struct qlm_shard {
    qlm_unit_hooks hooks;
    qlm_comm *comm;
    const qlm_backend *be;
    int prefetch;
    qlm_layout *P; /* parameters: gathered around use when shard_params */
    int shard_params;
    void **part;            /* per unit: this member's bytes of the parameters */
    void **full;            /* per unit: gathered buffer, or NULL */
    qlm_comm_op **inflight; /* per unit: its gather, or NULL */
    int *users;
    unsigned char *unused; /* per unit: gathered, and no use has come since */
    qlm_layout *G; /* gradients: sharded when set */
    float **gpart, **gfull;
    pending_rs pend[MAX_PENDING];
    int n_pend;
    /* prefetch: the order of uses recorded per pass kind, followed in the next pass of the kind */
    int kind, pos, following;
    int lockstep;
    int *plan[QLM_PASS_KINDS], plan_n[QLM_PASS_KINDS], plan_cap[QLM_PASS_KINDS];
    int *trace, trace_n, trace_cap;
    size_t *offsets; /* scratch: size + 1 */
    qlm_shard_memory mem;
    double wait_s;
    long gathers, gathers_unused;
    buffer_pool pool;
};



static void track(double *now, double *peak, double delta) {
    *now += delta;
    if (*now > *peak) *peak = *now;
}

/* A buffer of at least `bytes` (a cached one when one fits: no more than twice the size). */
static void *pool_get(qlm_shard *s, size_t bytes) {
    buffer_pool *pl = &s->pool;
    int best = -1;
    for (int i = 0; i < pl->n; i++)
        if (pl->bytes[i] >= bytes && pl->bytes[i] <= 2 * bytes && (best < 0 || pl->bytes[i] < pl->bytes[best]))
            best = i;
    if (best < 0) {
        void *p = s->be->alloc(bytes ? bytes : 64);
        if (p) track(&s->mem.buffers, &s->mem.buffers_peak, (double)bytes);
        return p;
    }
    void *p = pl->p[best];
    pl->p[best] = pl->p[--pl->n];
    pl->bytes[best] = pl->bytes[pl->n];
    return p;
}

/* Keeps a buffer for reuse; the pool holds the working set of gathers (prefetch + 2 units). */
static void pool_put(qlm_shard *s, void *p, size_t bytes) {
    buffer_pool *pl = &s->pool;
    int keep = s->prefetch + 2 < POOL ? s->prefetch + 2 : POOL;
    if (pl->n == keep) {
        s->mem.buffers -= (double)pl->bytes[0];
        s->be->free(pl->p[0]);
        pl->p[0] = pl->p[--pl->n];
        pl->bytes[0] = pl->bytes[pl->n];
    }
    pl->p[pl->n] = p;
    pl->bytes[pl->n++] = bytes;
}

/* Copies bytes between two buffers of the backend's memory. */
static int copy_bytes(const qlm_backend *be, void *dst, const void *src, size_t n) {
    if (be->host_memory) {
        memcpy(dst, src, n);
        return 0;
    }
    if (n % sizeof(float) == 0 && (uintptr_t)dst % sizeof(float) == 0 && (uintptr_t)src % sizeof(float) == 0) {
        be->copy(dst, src, (long)(n / sizeof(float)));
        return 0;
    }
    void *tmp = malloc(n);
    if (!tmp) return qlm_errorf("out of memory");
    be->to_host(tmp, src, n);
    be->to_device(dst, tmp, n);
    free(tmp);
    return 0;
}

/* Starts gathering unit u into a fresh buffer. */
static int gather_start(qlm_shard *s, int u) {
    const qlm_layout *L = s->P;
    size_t bytes = L->bytes[u];
    void *full = pool_get(s, bytes);
    if (!full) return qlm_error_context("gathering unit %d (%zu bytes)", u, bytes);
    track(&s->mem.gathered, &s->mem.gathered_peak, (double)bytes);
    size_t own = qlm_layout_part(L, u, s->comm->rank), begin = qlm_layout_begin(L, u, s->comm->rank);
    if (own && copy_bytes(s->be, (char *)full + begin, s->part[u], own) != 0) return -1;
    for (int r = 0; r <= s->comm->size; r++) s->offsets[r] = qlm_layout_begin(L, u, r);
    s->full[u] = full;
    s->gathers++;
    s->unused[u] = 1;
    s->inflight[u] = qlm_comm_start_allgather(s->comm, full, s->offsets);
    return s->inflight[u] ? 0 : -1;
}

static int gather_wait(qlm_shard *s, int u) {
    if (!s->inflight[u]) return 0;
    double t0 = qlm_now_s();
    int rc = qlm_comm_wait(s->inflight[u]);
    s->inflight[u] = NULL;
    s->wait_s += qlm_now_s() - t0;
    if (rc != 0) return qlm_error_context("unit %d", u);
    qlm_layout_point(s->P, u, s->full[u]);
    return 0;
}

static void release(qlm_shard *s, int u) {
    if (!s->full[u]) return;
    s->gathers_unused += s->unused[u];
    s->unused[u] = 0;
    pool_put(s, s->full[u], s->P->bytes[u]);
    s->mem.gathered -= (double)s->P->bytes[u];
    s->full[u] = NULL;
    qlm_layout_point(s->P, u, NULL);
}

/* The units the recorded order uses after the current position, up to the prefetch depth. */
static int upcoming(const qlm_shard *s, int j) {
    if (!s->following || s->pos + j >= s->plan_n[s->kind]) return -1;
    return s->plan[s->kind][s->pos + j];
}

static int record(qlm_shard *s, int u) {
    if (s->trace_n == s->trace_cap) {
        int cap = s->trace_cap ? 2 * s->trace_cap : 256;
        int *t = realloc(s->trace, (size_t)cap * sizeof *t);
        if (!t) return qlm_errorf("out of memory");
        s->trace = t, s->trace_cap = cap;
    }
    s->trace[s->trace_n++] = u;
    return 0;
}

static int shard_use(void *ctx, int u);
static void shard_done(void *ctx, int u);

/* The pass that ended becomes the plan of its kind; the new one starts following its kind's. */
static void next_pass(qlm_shard *s, int kind) {
    if (s->trace_n) {
        int k = s->kind;
        if (s->plan_cap[k] < s->trace_n) {
            int *p = realloc(s->plan[k], (size_t)s->trace_n * sizeof *p);
            if (p) s->plan[k] = p, s->plan_cap[k] = s->trace_n;
        }
        if (s->plan_cap[k] >= s->trace_n) {
            memcpy(s->plan[k], s->trace, (size_t)s->trace_n * sizeof *s->trace);
            s->plan_n[k] = s->trace_n;
        }
    }
    s->kind = kind >= 0 && kind < QLM_PASS_KINDS ? kind : QLM_PASS_FORWARD;
    s->trace_n = 0;
    s->pos = 0;
    s->following = s->plan_n[s->kind] > 0;
}

/* In lockstep, every pass starts with the sum over the group of who is busy (1) or drained (0),
 * so that ranks whose work ended keep joining the gathers of those still busy. */
static int busy_count(qlm_shard *s, double busy, double *count, double timeout_s) {
    double saved = s->comm->timeout_s;
    s->comm->timeout_s = timeout_s;
    *count = busy;
    int rc = qlm_comm_sum_host(s->comm, count, 1);
    s->comm->timeout_s = saved;
    return rc == 0 ? 0 : qlm_error_context("the pass count of a lockstep run");
}

static int shard_begin(void *ctx, int kind) {
    qlm_shard *s = ctx;
    double count;
    if (s->lockstep && busy_count(s, 1, &count, s->comm->timeout_s) != 0) return -1;
    next_pass(s, kind);
    return 0;
}

void qlm_shard_set_lockstep(qlm_shard *s) { s->lockstep = 1; }

int qlm_shard_drain(qlm_shard *s, const int *order, int n) {
    for (;;) {
        /* A drained rank waits as long as the others work (a server may idle for hours). */
        double count;
        if (busy_count(s, 0, &count, 1e9) != 0) return -1;
        if (count == 0) return 0;
        next_pass(s, QLM_PASS_FORWARD);
        for (int k = 0; k < n; k++) {
            if (shard_use(s, order[k]) != 0) return -1;
            shard_done(s, order[k]);
        }
    }
}

static int shard_use(void *ctx, int u) {
    qlm_shard *s = ctx;
    if (!s->shard_params) return 0;
    if (record(s, u) != 0) return -1;
    if (s->following && upcoming(s, 0) != u) s->following = 0;
    s->users[u]++;
    if (!s->full[u] && gather_start(s, u) != 0) return -1;
    if (gather_wait(s, u) != 0) return -1;
    s->unused[u] = 0;
    for (int j = 1; j <= s->prefetch; j++) {
        int v = upcoming(s, j);
        if (v >= 0 && !s->full[v] && gather_start(s, v) != 0) return -1;
    }
    if (s->following) s->pos++;
    return 0;
}

static void shard_done(void *ctx, int u) {
    qlm_shard *s = ctx;
    if (!s->shard_params || s->users[u] == 0 || --s->users[u] > 0) return;
    /* A unit the next uses need again stays (the last layer between forward and backward); not in
     * lockstep, where a drained rank's plan may not have it and the gathers must stay in step. */
    for (int j = 0; j < s->prefetch + 1 && !s->lockstep; j++)
        if (upcoming(s, j) == u) return;
    release(s, u);
}

static int shard_grads_use(void *ctx, int u) {
    qlm_shard *s = ctx;
    if (!s->G || s->gfull[u]) return 0;
    size_t bytes = s->G->bytes[u];
    float *buf = pool_get(s, bytes);
    if (!buf) return qlm_error_context("gradients of unit %d (%zu bytes)", u, bytes);
    s->be->zero(buf, (long)(bytes / sizeof(float)));
    track(&s->mem.grads_full, &s->mem.grads_full_peak, (double)bytes);
    s->gfull[u] = buf;
    qlm_layout_point(s->G, u, buf);
    return 0;
}

static int wait_oldest(qlm_shard *s) {
    pending_rs p = s->pend[0];
    memmove(s->pend, s->pend + 1, (size_t)(s->n_pend - 1) * sizeof *s->pend);
    s->n_pend--;
    int rc = qlm_comm_wait(p.op);
    pool_put(s, p.buf, p.bytes);
    return rc;
}

static int shard_grads_done(void *ctx, int u) {
    qlm_shard *s = ctx;
    float *buf = s->G ? s->gfull[u] : NULL;
    if (!buf) return 0;
    if (s->n_pend == MAX_PENDING && wait_oldest(s) != 0) return -1;
    for (int r = 0; r <= s->comm->size; r++) s->offsets[r] = qlm_layout_begin(s->G, u, r) / sizeof(float);
    qlm_comm_op *op = qlm_comm_start_reduce_scatter(s->comm, s->gpart[u], buf, s->offsets, 1);
    s->gfull[u] = NULL;
    qlm_layout_point(s->G, u, NULL);
    s->mem.grads_full -= (double)s->G->bytes[u];
    if (!op) {
        pool_put(s, buf, s->G->bytes[u]);
        return qlm_error_context("gradients of unit %d", u);
    }
    s->pend[s->n_pend++] = (pending_rs){op, buf, s->G->bytes[u]};
    return 0;
}

int qlm_shard_flush(qlm_shard *s) {
    int rc = 0;
    while (s->n_pend)
        if (wait_oldest(s) != 0) rc = -1;
    return rc;
}

int qlm_shard_drop(qlm_shard *s) {
    int rc = 0;
    for (int u = 0; s->shard_params && u < s->P->n_units; u++) {
        if (s->users[u]) continue;
        /* A prefetch still in flight gathers the old values too: completed (every rank started it), then dropped. */
        if (s->inflight[u] && gather_wait(s, u) != 0) rc = -1;
        release(s, u);
    }
    return rc;
}

static int alloc_arrays(qlm_shard *s, int n_units) {
    size_t n = (size_t)n_units;
    s->part = calloc(n, sizeof *s->part);
    s->full = calloc(n, sizeof *s->full);
    s->inflight = calloc(n, sizeof *s->inflight);
    s->users = calloc(n, sizeof *s->users);
    s->unused = calloc(n, sizeof *s->unused);
    s->gpart = calloc(n, sizeof *s->gpart);
    s->gfull = calloc(n, sizeof *s->gfull);
    s->offsets = calloc((size_t)s->comm->size + 1, sizeof *s->offsets);
    if (!s->part || !s->full || !s->inflight || !s->users || !s->unused || !s->gpart || !s->gfull || !s->offsets)
        return qlm_errorf("out of memory");
    return 0;
}

/* Copies this member's part of every unit of L out of the whole buffers, then frees them. */
static int cut_out(qlm_shard *s, const qlm_layout *L, void **parts, double *parts_bytes) {
    for (int u = 0; u < L->n_units; u++) {
        size_t own = qlm_layout_part(L, u, s->comm->rank), begin = qlm_layout_begin(L, u, s->comm->rank);
        parts[u] = s->be->alloc(own ? own : 64);
        if (!parts[u]) return qlm_error_context("the parts of %d units", L->n_units);
        *parts_bytes += (double)own;
        void *whole = *L->units[u].buffer;
        if (own && copy_bytes(s->be, parts[u], (char *)whole + begin, own) != 0) return -1;
        s->be->free(whole);
        qlm_layout_point(L, u, NULL);
    }
    return 0;
}

qlm_shard *qlm_shard_new(qlm_comm *group, const qlm_backend *be, qlm_layout *params, int shard_params,
                         qlm_layout *grads, int prefetch) {
    qlm_shard *s = calloc(1, sizeof *s);
    if (!s) {
        qlm_errorf("out of memory");
        return NULL;
    }
    s->comm = group, s->be = be, s->P = params, s->shard_params = shard_params, s->G = grads;
    s->prefetch = prefetch;
    s->hooks = (qlm_unit_hooks){.ctx = s, .begin = shard_begin, .use = shard_use, .done = shard_done,
                                .grads_use = shard_grads_use, .grads_done = shard_grads_done};
    int n_units = params ? params->n_units : grads ? grads->n_units : 0;
    if (alloc_arrays(s, n_units) != 0 || (shard_params && cut_out(s, params, s->part, &s->mem.params_parts) != 0) ||
        (grads && cut_out(s, grads, (void **)s->gpart, &s->mem.grads_parts) != 0)) {
        qlm_shard_free(s);
        return NULL;
    }
    for (int u = 0; grads && u < n_units; u++) {
        size_t own = qlm_layout_part(grads, u, group->rank);
        if (own) be->zero(s->gpart[u], (long)(own / sizeof(float)));
    }
    return s;
}

void qlm_shard_free(qlm_shard *s) {
    if (!s) return;
    qlm_shard_flush(s);
    int n_units = s->P ? s->P->n_units : s->G ? s->G->n_units : 0;
    for (int u = 0; u < n_units; u++) {
        if (s->inflight && s->inflight[u]) qlm_comm_wait(s->inflight[u]);
        if (s->full && s->full[u]) release(s, u);
        if (s->part && s->part[u]) s->be->free(s->part[u]);
        if (s->gfull && s->gfull[u]) {
            s->be->free(s->gfull[u]);
            qlm_layout_point(s->G, u, NULL);
        }
        if (s->gpart && s->gpart[u]) s->be->free(s->gpart[u]);
    }
    for (int i = 0; i < s->pool.n; i++) s->be->free(s->pool.p[i]);
    free(s->part), free(s->full), free(s->inflight), free(s->users), free(s->unused), free(s->gpart), free(s->gfull);
    free(s->offsets), free(s->trace);
    for (int k = 0; k < QLM_PASS_KINDS; k++) free(s->plan[k]);
    free(s);
}

const qlm_unit_hooks *qlm_shard_hooks(qlm_shard *s) { return &s->hooks; }

void *qlm_shard_params_part(qlm_shard *s, int u) { return s->shard_params ? s->part[u] : NULL; }

float *qlm_shard_grads_part(qlm_shard *s, int u) { return s->G ? s->gpart[u] : NULL; }

int qlm_shard_consolidate(qlm_shard *s) {
    if (!s->shard_params) return 0;
    for (int u = 0; u < s->P->n_units; u++) {
        if (!s->full[u] && gather_start(s, u) != 0) return -1;
        if (gather_wait(s, u) != 0) return -1;
        s->be->free(s->part[u]);
        s->part[u] = NULL;
        s->mem.params_parts -= (double)qlm_layout_part(s->P, u, s->comm->rank);
        s->full[u] = NULL; /* the model owns the whole buffer now */
    }
    s->shard_params = 0;
    return 0;
}

qlm_shard_memory qlm_shard_memory_now(const qlm_shard *s) { return s->mem; }

void qlm_shard_timing(const qlm_shard *s, double *wait_s, long *gathers, long *unused) {
    *wait_s = s->wait_s;
    *gathers = s->gathers;
    *unused = s->gathers_unused;
}
