/* What the trainer's files share: the storage of per-unit state, whole or split into parts, and the
 * distributed parts of a step (train/train_shards.c). */
#ifndef QLM_TRAINER_INTERNAL_H
#define QLM_TRAINER_INTERNAL_H

#include "trainer.h"

/* The trained parameters (the master model's, or the adapter's) as units, cut among the S ranks
 * of the shard group, and where each kind of per-unit state lives. */
struct qlm_train_shards {
    qlm_comm *group;   /* the S ranks that split the sharded state (NULL: one) */
    qlm_comm *replica; /* the ranks that hold the same part (NULL: one) */
    qlm_comm *world;
    int S, rank;       /* in the group */
    qlm_shard_strategy strategy;
    int grads_sharded, params_sharded;
    int n_units;
    qlm_cut *cuts;     /* [unit][S + 1] of the trained parameters */
    qlm_layout Lm;     /* the trained parameters: master model or adapter */
    qlm_layout Lg;     /* the full-training gradient twin */
    qlm_layout Lc;     /* the compute copy (has_copy) */
    qlm_layout Lb;     /* LoRA: the frozen base */
    qlm_shard *fwd;    /* hooks of the model the passes read (gathers, gradient reduce-scatters) */
    qlm_shard *master; /* master parts when the passes read a compute copy */
    /* Per unit, this rank's part of each kind of state that is split (NULL arrays: kept whole). */
    void **master_part, **grads_part, **copy_part, **m_part, **v_part;
    float **grads_whole; /* per unit, when the gradients stay whole: the buffer and its bytes */
    size_t *grads_bytes;
    /* The pieces as the step's list ops take them, made once: their gradients and lengths (one
     * sum_squares call, its sums in norm_sums) and the AdamW list over the same arrays. */
    const float **piece_g;
    long *piece_n;
    double *norm_sums;
    float **piece_p, **piece_m, **piece_v;
    unsigned char *piece_decay;
    qlm_adamw_tensors adamw;
    double comm_s;     /* seconds in collectives this step */
};

/* Whether the optimizer state is split among ranks (ZeRO-1 and up with a shard group of 2+). */
int qlm_train_optim_sharded(const qlm_train_options *o);
/* Where piece e's values go in the compute copy, and the copy's dtype there. */
void *qlm_train_copy_at(const qlm_trainer *t, const qlm_train_tensor *e, qlm_dtype *dtype);
/* Sets up the distributed state after the trainer made its whole models, and lists this rank's
 * pieces as t->t. */
int qlm_train_shards_init(qlm_trainer *t);
void qlm_train_shards_free(qlm_trainer *t);
/* Sums x[0..n) over the data-parallel ranks (world), in rank order. */
int qlm_train_sum_world(const qlm_trainer *t, double *x, int n);
/* Sums the entries' squared gradients over the shard group (replicated entries counted once). */
int qlm_train_grad_sumsq(const qlm_trainer *t, double *ss);
/* Zeroes the gradients a step accumulates into. */
void qlm_train_zero_grads(qlm_trainer *t);
/* After the passes: the gradients summed over the ranks, each rank left with its pieces' sums. */
int qlm_train_reduce_grads(qlm_trainer *t);
/* QAT: the scale gradients, which each rank summed over its pieces, summed over the group. */
int qlm_train_reduce_qat(qlm_trainer *t, float *scale_grads, long n);
/* After the update: every rank's whole copies of what the passes read made current again. */
int qlm_train_sync_params(qlm_trainer *t);

#endif
