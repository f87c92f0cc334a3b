/* A model's units — the shared tensors (embeddings, head, final norms) and each layer or block —
 * each one flat parameter buffer, and the hooks through which a sharded run (dist/shard.h) has a
 * unit gathered just before the model code reads it and released after. Model code calls the
 * qlm_unit_* helpers around each unit's use; without hooks (one process, or replicated weights)
 * they cost a pointer test. */
#ifndef QLM_UNITS_H
#define QLM_UNITS_H

#include <stddef.h>

#include "param_pack.h"

typedef struct {
    void **buffer;    /* the model's field holding the unit's flat buffer */
    size_t *bytes;    /* and its size */
    int first, count; /* its parameters: entries first .. first+count-1 of the model's list */
    /* Weights that view the unit's own (a tied head, a fused adapter's parts), refreshed whenever
     * the unit's weights move. */
    const qlm_weight_view *views;
    int n_views;
} qlm_unit;

/* The kinds of pass a model runs, each with its own order of units (what prefetching follows);
 * REFRESH: the trainer's use of unit 0 after a step to refresh derived tensors, kept out of the
 * training pass's order, where it had the next step's pass prefetch unit 0 for nothing. */
enum { QLM_PASS_FORWARD, QLM_PASS_TRAIN, QLM_PASS_EVAL, QLM_PASS_REFRESH, QLM_PASS_KINDS };

/* What a sharded run does around each use of a unit: begin at the start of a pass, its
 * parameters (use/done), and in a training pass its gradients (grads_use before the first write,
 * grads_done after the last of the pass). begin, use and grads_use return -1 (message set) when
 * communication failed. */
typedef struct qlm_unit_hooks {
    void *ctx;
    int (*begin)(void *ctx, int kind);
    int (*use)(void *ctx, int unit);
    void (*done)(void *ctx, int unit);
    int (*grads_use)(void *ctx, int unit);
    int (*grads_done)(void *ctx, int unit);
} qlm_unit_hooks;

static inline int qlm_unit_begin(const qlm_unit_hooks *h, int kind) { return h ? h->begin(h->ctx, kind) : 0; }
static inline int qlm_unit_use(const qlm_unit_hooks *h, int unit) { return h ? h->use(h->ctx, unit) : 0; }
static inline void qlm_unit_done(const qlm_unit_hooks *h, int unit) {
    if (h) h->done(h->ctx, unit);
}
static inline int qlm_unit_grads_use(const qlm_unit_hooks *h, int unit) {
    return h && h->grads_use ? h->grads_use(h->ctx, unit) : 0;
}
static inline int qlm_unit_grads_done(const qlm_unit_hooks *h, int unit) {
    return h && h->grads_done ? h->grads_done(h->ctx, unit) : 0;
}

#endif
