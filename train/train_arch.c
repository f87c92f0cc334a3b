/* The Llama and T5 entries of the trainer's architecture table. */
#include "train_arch.h"

#include "../core/error.h"
#include "../models/llama_train.h"
#include "../models/t5_train.h"

/* ---- Llama family ---- */

static int llama_param_list(void *m, qlm_param **out) { return qlm_model_param_list(m, out); }
static int llama_units(void *m, qlm_param **p, int *n, qlm_unit **u) { return qlm_model_units(m, p, n, u); }
static int llama_twin(void *twin, const void *m) { return qlm_model_f32_twin(twin, m); }
static void llama_twin_free(void *twin) { qlm_model_twin_free(twin); }
static void llama_free(void *m) { qlm_model_free(m); }
static qlm_dtype llama_dtype(const void *m) { return ((const qlm_model *)m)->fmt.dtype; }
static int llama_vocab(const void *m) { return ((const qlm_model *)m)->cfg.vocab_size; }
static const qlm_backend *llama_backend(const void *m) { return ((const qlm_model *)m)->be; }
static void llama_refresh(void *m) { (void)m; }

static int llama_build_copy(void *copy, const void *master, qlm_dtype dtype) {
    const qlm_model *m = master;
    qlm_tensor_store *store = qlm_store_new();
    if (!store) return qlm_errorf("out of memory");
    qlm_model_options mo = {.dtype = dtype, .backend = m->be};
    int rc = qlm_model_export(m, store);
    if (rc == 0) rc = qlm_model_build(copy, &m->cfg, store, &mo);
    qlm_store_free(store);
    return rc;
}

static int llama_state_init(void *state, const void *m, const qlm_train_shape *sh, int recompute, int lora_rank) {
    return qlm_llama_train_state_init(state, m, sh->max_rows, recompute, lora_rank);
}
static void llama_state_free(void *state, const void *m) { qlm_llama_train_state_free(state, m); }
static double llama_state_bytes(const void *state) { return ((const qlm_llama_train_state *)state)->peak_bytes; }

static int llama_pass(const void *m, const void *grads, const qlm_lora_train *lora, void *state,
                      const qlm_train_batch *b, float grad_scale, int backward, double *loss_sum) {
    return qlm_llama_train_pass(m, grads, lora, state, b, grad_scale, backward, loss_sum);
}

const qlm_train_arch qlm_train_arch_llama = {
    .name = "llama", .model_size = sizeof(qlm_model), .state_size = sizeof(qlm_llama_train_state),
    .param_list = llama_param_list, .units = llama_units, .twin = llama_twin, .twin_free = llama_twin_free,
    .build_copy = llama_build_copy, .free_model = llama_free, .dtype = llama_dtype, .vocab = llama_vocab,
    .backend = llama_backend,
    .refresh = llama_refresh, .state_init = llama_state_init, .state_free = llama_state_free,
    .state_bytes = llama_state_bytes, .pass = llama_pass,
};

/* ---- T5 ---- */

static int t5_param_list(void *m, qlm_param **out) { return qlm_t5_param_list(m, out); }
static int t5_units(void *m, qlm_param **p, int *n, qlm_unit **u) { return qlm_t5_units(m, p, n, u); }
static int t5_twin(void *twin, const void *m) { return qlm_t5_f32_twin(twin, m); }
static void t5_twin_free(void *twin) { qlm_t5_twin_free(twin); }
static void t5_free(void *m) { qlm_t5_free(m); }
static qlm_dtype t5_dtype(const void *m) { return ((const qlm_t5_model *)m)->fmt.dtype; }
static int t5_vocab(const void *m) { return ((const qlm_t5_model *)m)->cfg.vocab_size; }
static const qlm_backend *t5_backend(const void *m) { return ((const qlm_t5_model *)m)->be; }
static void t5_refresh(void *m) { qlm_t5_refresh_head_norm(m); }

static int t5_build_copy(void *copy, const void *master, qlm_dtype dtype) {
    const qlm_t5_model *m = master;
    qlm_tensor_store *store = qlm_store_new();
    if (!store) return qlm_errorf("out of memory");
    qlm_model_options mo = {.dtype = dtype, .backend = m->be};
    int rc = qlm_t5_export(m, store);
    if (rc == 0) rc = qlm_t5_build(copy, &m->cfg, store, &mo);
    qlm_store_free(store);
    return rc;
}

static int t5_state_init(void *state, const void *m, const qlm_train_shape *sh, int recompute, int lora_rank) {
    return qlm_t5_train_state_init(state, m, sh->max_src_rows, sh->max_rows, sh->max_len, recompute, lora_rank);
}
static void t5_state_free(void *state, const void *m) { qlm_t5_train_state_free(state, m); }
static double t5_state_bytes(const void *state) { return ((const qlm_t5_train_state *)state)->peak_bytes; }

static int t5_pass(const void *m, const void *grads, const qlm_lora_train *lora, void *state, const qlm_train_batch *b,
                   float grad_scale, int backward, double *loss_sum) {
    return qlm_t5_train_pass(m, grads, lora, state, b, grad_scale, backward, loss_sum);
}

const qlm_train_arch qlm_train_arch_t5 = {
    .name = "t5", .model_size = sizeof(qlm_t5_model), .state_size = sizeof(qlm_t5_train_state),
    .param_list = t5_param_list, .units = t5_units, .twin = t5_twin, .twin_free = t5_twin_free, .build_copy = t5_build_copy,
    .free_model = t5_free, .dtype = t5_dtype, .vocab = t5_vocab, .backend = t5_backend, .refresh = t5_refresh, .derived = 1,
    .state_init = t5_state_init, .state_free = t5_state_free, .state_bytes = t5_state_bytes, .pass = t5_pass,
};
