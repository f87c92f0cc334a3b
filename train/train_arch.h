/* What the trainer needs from an architecture, over opaque model pointers, so one trainer serves
 * the Llama family and T5: the parameter list, F32 twins (gradients, moments), compute copies in
 * another dtype, tensors derived from parameters, and the training pass with its activations. */
#ifndef QLM_TRAIN_ARCH_H
#define QLM_TRAIN_ARCH_H

#include <stddef.h>

#include "../core/backend.h"
#include "../models/param_pack.h"
#include "../models/units.h"
#include "../models/train_batch.h"

/* The largest batch a training state must hold. */
typedef struct {
    int max_rows;     /* decoder (or only) rows */
    int max_src_rows; /* encoder-decoders: input rows */
    int max_len;      /* longest sequence */
} qlm_train_shape;

typedef struct {
    const char *name;
    size_t model_size, state_size;
    int (*param_list)(void *m, qlm_param **out);
    /* The same list and the units it falls into (core/units.h): the number of units. */
    int (*units)(void *m, qlm_param **params, int *n_params, qlm_unit **units);
    int (*twin)(void *twin, const void *m);
    void (*twin_free)(void *twin);
    /* copy = master's parameters in dtype (a model of its own). */
    int (*build_copy)(void *copy, const void *master, qlm_dtype dtype);
    void (*free_model)(void *m);
    qlm_dtype (*dtype)(const void *m);
    int (*vocab)(const void *m);
    const qlm_backend *(*backend)(const void *m);
    /* Recomputes tensors derived from the parameters (T5's head norm) after they changed; they are
     * derived from unit 0's (derived set), which a sharded run gathers for it. */
    void (*refresh)(void *m);
    int derived;
    int (*state_init)(void *state, const void *m, const qlm_train_shape *shape, int recompute, int lora_rank);
    void (*state_free)(void *state, const void *m);
    double (*state_bytes)(const void *state);
    int (*pass)(const void *m, const void *grads, const qlm_lora_train *lora, void *state, const qlm_train_batch *b,
                float grad_scale, int backward, double *loss_sum);
} qlm_train_arch;

extern const qlm_train_arch qlm_train_arch_llama;
extern const qlm_train_arch qlm_train_arch_t5;

#endif
