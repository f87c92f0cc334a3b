/* Sharding a model's units (core/units.h) over the members of a group.
 *
 * Each unit is cut among the members at row boundaries of its parameters, balanced by element
 * count (qlm_cut). The cut points are the same for every model of the run — the F32 master
 * weights, their gradients and optimizer moments, a BF16 compute copy, a frozen INT8 base — and a
 * qlm_layout turns them into byte offsets of one model's buffers, so member r's part of a unit is
 * one contiguous run of bytes in every model, and the parts of the F32 master map element for
 * element onto the parts of its compute copy.
 *
 * qlm_shard is what a sharded run installs as a model's qlm_unit_hooks: with sharded parameters
 * (FSDP), using a unit gathers it from the parts into a full buffer (while the units after it in
 * the recorded order are already being gathered: prefetch), and releasing it frees the buffer;
 * with sharded gradients (ZeRO-2, FSDP), a unit's gradients go to a zeroed full buffer during its
 * backward, which is then reduce-scattered into this member's part and freed. */
#ifndef QLM_SHARD_H
#define QLM_SHARD_H

#include <stdint.h>

#include "../models/units.h"
#include "comm.h"

/* A cut point: before row `row` of the unit's parameter `param` (param == count: the end; a
 * vector's rows are its elements). */
typedef struct {
    int param;
    int64_t row;
} qlm_cut;

/* cuts[0..size]: the unit's parameters p[0..count) cut into size parts of nearly equal element
 * counts, each boundary at a row boundary. */
void qlm_cuts_make(const qlm_param *p, int count, int size, qlm_cut *cuts);

/* Where the cuts and the parameters of every unit lie in one model's buffers. */
typedef struct {
    int n_units, n_params, size, rank;
    qlm_unit *units;   /* the model's units and parameters (owned copies of the lists) */
    qlm_param *params;
    size_t *cut;       /* [unit][size + 1] byte offsets in the unit's buffer */
    size_t *data_off;  /* per parameter: from its unit's buffer start */
    size_t *scale_off; /* per parameter: its INT8 row scales, or SIZE_MAX */
    size_t *bytes;     /* per unit: the whole buffer */
} qlm_layout;

/* Reads the offsets of a model whose units are all whole now. Takes ownership of params and
 * units (from qlm_model_units / qlm_t5_units); cuts: [n_units][size + 1]. */
int qlm_layout_init(qlm_layout *L, qlm_param *params, int n_params, qlm_unit *units, int n_units,
                    const qlm_cut *cuts, int size, int rank);
void qlm_layout_free(qlm_layout *L);
/* Member r's part of unit u: its first byte and its size. */
static inline size_t qlm_layout_begin(const qlm_layout *L, int u, int r) { return L->cut[(size_t)u * (L->size + 1) + r]; }
static inline size_t qlm_layout_part(const qlm_layout *L, int u, int r) {
    return qlm_layout_begin(L, u, r + 1) - qlm_layout_begin(L, u, r);
}
/* Points unit u's parameter views (and the unit's buffer field) at buffer, laid out as before. */
void qlm_layout_point(const qlm_layout *L, int u, void *buffer);
/* The byte offset of element e of parameter i (global index) in its unit's buffer. */
size_t qlm_layout_elem(const qlm_layout *L, int i, int64_t e);

/* Memory a sharded run holds, in bytes, now and at its peak. */
typedef struct {
    double params_parts, grads_parts;   /* this member's parts */
    double gathered, gathered_peak;     /* whole parameter buffers of gathered units */
    double grads_full, grads_full_peak; /* whole gradient buffers of units in their backward */
    double buffers, buffers_peak;       /* both kinds as allocated: in use, or kept for reuse */
} qlm_shard_memory;

typedef struct qlm_shard qlm_shard;

/* A model whose parameters stay whole (ZeRO-1/2 with F32 compute) or are sharded over the group
 * (FSDP: params_part set: the member's part of each unit is copied out and the whole buffers are
 * freed), and, when grads (a layout of the F32 gradient twin) is given, gradients sharded too:
 * the twin's buffers are freed and each unit's part (zeroed, grads_part) accumulates the
 * reduce-scatter of every pass's gradients. prefetch: units gathered ahead of their use. The
 * layouts stay the caller's. */
qlm_shard *qlm_shard_new(qlm_comm *group, const qlm_backend *be, qlm_layout *params, int shard_params,
                         qlm_layout *grads, int prefetch);
void qlm_shard_free(qlm_shard *s);
/* Lockstep (sharded inference, where ranks do different work): every pass begins with a count of
 * the busy ranks, and a rank whose work has ended calls qlm_shard_drain, which joins the others'
 * passes — gathering the units of order[0..n) (a forward pass's units in order), computing
 * nothing — until every rank has drained. */
void qlm_shard_set_lockstep(qlm_shard *s);
int qlm_shard_drain(qlm_shard *s, const int *order, int n);
/* The hooks to install in the model the passes read (model->hooks). */
const qlm_unit_hooks *qlm_shard_hooks(qlm_shard *s);
/* Member's part of unit u: of the parameters (FSDP; NULL otherwise) and of the gradients (F32). */
void *qlm_shard_params_part(qlm_shard *s, int u);
float *qlm_shard_grads_part(qlm_shard *s, int u);
/* Completes the reduce-scatters still in flight (after the last pass of a step): 0 or -1. */
int qlm_shard_flush(qlm_shard *s);
/* Releases every gathered unit that no pass holds, prefetches in flight included (after the
 * parameters changed, between steps): 0, or -1 when a gather failed. */
int qlm_shard_drop(qlm_shard *s);
/* Gathers every unit into whole buffers for good (writing the trained model): 0 or -1. The
 * shard's parameter parts are freed; the model is whole again. */
int qlm_shard_consolidate(qlm_shard *s);
qlm_shard_memory qlm_shard_memory_now(const qlm_shard *s);
/* Totals since the shard began: seconds the passes waited for gathers, timed around each unit's
 * use (the communication not hidden behind compute), the number of gathers, and how many of them
 * were released before any use (a prefetch the passes did not follow: traffic for nothing). */
void qlm_shard_timing(const qlm_shard *s, double *wait_s, long *gathers, long *unused);

#endif
