/* Folding an adapter into the base weights (W0 += sign·scale·B·A) and back out. */
#include <stdlib.h>

#include "../core/error.h"
#include "../quant/half.h"
#include "../quant/quantize.h"
#include "lora.h"

/* The model weight an adapter module changes: Llama or T5, by (stack, layer, target). */
typedef struct {
    qlm_model *llama;
    qlm_t5_model *t5;
} merge_target;

static qlm_weight *target_weight(const merge_target *mt, int stack, int layer, qlm_lora_target t) {
    if (mt->llama) {
        if (stack != 0 || layer >= mt->llama->cfg.n_layers) return NULL;
        qlm_layer *L = &mt->llama->layers[layer];
        qlm_weight *w[] = {[QLM_LORA_Q] = &L->wq,       [QLM_LORA_K] = &L->wk,  [QLM_LORA_V] = &L->wv,
                           [QLM_LORA_O] = &L->wo,       [QLM_LORA_GATE] = &L->w_gate, [QLM_LORA_UP] = &L->w_up,
                           [QLM_LORA_DOWN] = &L->w_down};
        return t <= QLM_LORA_DOWN ? w[t] : NULL;
    }
    int n = stack ? mt->t5->cfg.n_dec_layers : mt->t5->cfg.n_layers;
    if (layer >= n) return NULL;
    qlm_t5_layer *L = stack ? &mt->t5->dec[layer] : &mt->t5->enc[layer];
    switch (t) {
    case QLM_LORA_Q: return &L->q;
    case QLM_LORA_K: return &L->k;
    case QLM_LORA_V: return &L->v;
    case QLM_LORA_O: return &L->o;
    case QLM_LORA_CROSS_Q: return stack ? &L->cq : NULL;
    case QLM_LORA_CROSS_K: return stack ? &L->ck : NULL;
    case QLM_LORA_CROSS_V: return stack ? &L->cv : NULL;
    case QLM_LORA_CROSS_O: return stack ? &L->co : NULL;
    case QLM_LORA_WI0: return &L->wi0;
    case QLM_LORA_WI1: return &L->wi1;
    case QLM_LORA_WO: return &L->wo;
    default: return NULL;
    }
}

static float load_elem(const void *data, qlm_dtype dt, size_t i) {
    if (dt == QLM_F32) return ((const float *)data)[i];
    uint16_t h = ((const uint16_t *)data)[i];
    return dt == QLM_BF16 ? qlm_bf16_to_f32(h) : qlm_f16_to_f32(h);
}

static void store_elem(void *data, qlm_dtype dt, size_t i, float v) {
    if (dt == QLM_F32) ((float *)data)[i] = v;
    else ((uint16_t *)data)[i] = dt == QLM_BF16 ? qlm_f32_to_bf16(v) : qlm_f32_to_f16(v);
}

/* W += sign·scale·B·A with A transposed to at[in][r] and B as bf[out][r], both F32. Each ΔW
 * element is the same F32 dot product (k ascending) for merge and unmerge, so that unmerge
 * subtracts exactly what merge added. */
static void merge_module(qlm_weight *w, const qlm_lora_module *m, int sign, float *at, float *bf) {
    int r = m->r, in = m->a.cols, out = m->b.rows;
    for (int k = 0; k < r; k++) {
        qlm_weight_row_f32(&m->a, k, bf);
        for (int i = 0; i < in; i++) at[(size_t)i * r + k] = bf[i];
    }
    for (int o = 0; o < out; o++) qlm_weight_row_f32(&m->b, o, bf + (size_t)o * r);
    void *data = (void *)w->data; /* the model's own buffer: merge changes the base in place */
    float scale = sign > 0 ? m->scale : -m->scale;
#pragma omp parallel for if ((long)out * in * r > (1L << 16))
    for (int o = 0; o < out; o++) {
        const float *b = bf + (size_t)o * r;
        for (int i = 0; i < in; i++) {
            const float *a = at + (size_t)i * r;
            float dot = 0;
            for (int k = 0; k < r; k++) dot += b[k] * a[k];
            size_t idx = (size_t)o * in + i;
            store_elem(data, w->dtype, idx, load_elem(data, w->dtype, idx) + scale * dot);
        }
    }
}

static int merge(const merge_target *mt, const qlm_backend *be, const qlm_lora_adapter *a, int sign) {
    if (sign != 1 && sign != -1) return qlm_errorf("merge sign must be +1 (merge) or -1 (unmerge)");
    if (a->is_t5 != (mt->t5 != NULL))
        return qlm_errorf("adapter %s is for a %s model, not %s", a->name, qlm_lora_arch_name(a),
                          mt->t5 ? "T5" : "a Llama-family one");
    if (be != qlm_backend_cpu()) return qlm_errorf("merging needs the model's weights in host memory (the cpu backend)");
    /* Every module is checked before any weight changes. */
    size_t at_max = 1, b_max = 1;
    for (int i = 0; i < a->n_modules; i++) {
        const qlm_lora_module *m = &a->modules[i];
        const qlm_weight *w = target_weight(mt, m->stack, m->layer, m->target);
        if (!w || !w->data)
            return qlm_errorf("adapter %s: the model has no %s", a->name, m->path);
        if (w->dtype == QLM_I8 || qlm_dtype_is_block(w->dtype))
            return qlm_errorf("merging into %s weights is not supported: load the model as f32, bf16 or f16 (and "
                              "quantize the merged model afterwards)", w->dtype == QLM_I8 ? "INT8" : qlm_dtype_name(w->dtype));
        if (w->rows != m->b.rows || w->cols != m->a.cols)
            return qlm_errorf("adapter %s: %s is [%d,%d] in the adapter (out, in) but [%d,%d] in the model", a->name,
                              m->path, m->b.rows, m->a.cols, w->rows, w->cols);
        size_t at = (size_t)m->a.cols * m->r, bt = (size_t)m->b.rows * m->r;
        /* bf also holds a row of A while at is built. */
        if (at > at_max) at_max = at;
        if (bt > b_max) b_max = bt;
        if ((size_t)m->a.cols > b_max) b_max = (size_t)m->a.cols;
    }
    float *at = malloc(at_max * sizeof *at), *bf = malloc(b_max * sizeof *bf);
    if (!at || !bf) {
        free(at);
        free(bf);
        return qlm_errorf("out of memory merging adapter %s", a->name);
    }
    for (int i = 0; i < a->n_modules; i++) {
        const qlm_lora_module *m = &a->modules[i];
        merge_module(target_weight(mt, m->stack, m->layer, m->target), m, sign, at, bf);
    }
    free(at);
    free(bf);
    return 0;
}

int qlm_lora_merge(qlm_model *m, const qlm_lora_adapter *a, int sign) {
    merge_target mt = {.llama = m};
    return merge(&mt, m->be, a, sign);
}

int qlm_lora_merge_t5(qlm_t5_model *m, const qlm_lora_adapter *a, int sign) {
    merge_target mt = {.t5 = m};
    return merge(&mt, m->be, a, sign);
}
