/* Llama-family decoder: weight conversion into per-layer flat buffers, and the forward pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/quantize.h"
#include "error.h"
#include "model.h"

/* ---- building: from store entries to converted weights ---- */

/* Where each parameter of a layer goes, so sizing and filling walk the same list. */
typedef struct {
    const char *suffix; /* after "model.layers.N." */
    int is_matrix;      /* linear weight (storage dtype) vs F32 vector */
    int optional;
} param_spec;

static const param_spec k_layer_params[] = {
    {"input_layernorm.weight", 0, 0},
    {"self_attn.q_proj.weight", 1, 0},
    {"self_attn.k_proj.weight", 1, 0},
    {"self_attn.v_proj.weight", 1, 0},
    {"self_attn.o_proj.weight", 1, 0},
    {"post_attention_layernorm.weight", 0, 0},
    {"mlp.gate_proj.weight", 1, 0},
    {"mlp.up_proj.weight", 1, 0},
    {"mlp.down_proj.weight", 1, 0},
    {"self_attn.q_proj.bias", 0, 1},
    {"self_attn.k_proj.bias", 0, 1},
    {"self_attn.v_proj.bias", 0, 1},
    {"self_attn.o_proj.bias", 0, 1},
    {"mlp.gate_proj.bias", 0, 1},
    {"mlp.up_proj.bias", 0, 1},
    {"mlp.down_proj.bias", 0, 1},
};
enum { N_LAYER_PARAMS = sizeof k_layer_params / sizeof k_layer_params[0] };

/* Expected [rows, cols] of each layer parameter (cols 0 for vectors). */
static void layer_param_shape(const qlm_llama_config *c, int idx, int64_t *rows, int64_t *cols) {
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t shapes[N_LAYER_PARAMS][2] = {
        {c->dim, 0}, {q, c->dim}, {kv, c->dim}, {kv, c->dim}, {c->dim, q}, {c->dim, 0},
        {c->hidden_dim, c->dim}, {c->hidden_dim, c->dim}, {c->dim, c->hidden_dim},
        {q, 0}, {kv, 0}, {kv, 0}, {c->dim, 0}, {c->hidden_dim, 0}, {c->hidden_dim, 0}, {c->dim, 0},
    };
    *rows = shapes[idx][0];
    *cols = shapes[idx][1];
}

static int check_shape(const qlm_tensor_entry *e, int64_t rows, int64_t cols) {
    int ok = cols ? (e->ndim == 2 && e->shape[0] == rows && e->shape[1] == cols)
                  : (e->ndim == 1 && e->shape[0] == rows);
    if (!ok) {
        char got[96] = "";
        for (int i = 0; i < e->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? "," : "", (long long)e->shape[i]);
        if (cols)
            return qlm_errorf("tensor %s has shape [%s], expected [%lld,%lld]", e->name, got, (long long)rows,
                              (long long)cols);
        return qlm_errorf("tensor %s has shape [%s], expected [%lld]", e->name, got, (long long)rows);
    }
    return 0;
}

/* Any stored dtype (I8 with its scales) to F32. */
static void entry_to_f32(const qlm_tensor_entry *e, float *out) {
    int64_t n = qlm_entry_numel(e);
    if (e->dtype != QLM_I8) {
        qlm_convert_to_f32(out, e->data, e->dtype, n);
        return;
    }
    int64_t rows = e->ndim >= 1 ? e->shape[0] : 1, cols = rows ? n / rows : 0;
    const int8_t *q = e->data;
    for (int64_t r = 0; r < rows; r++) {
        float s = e->row_scales ? e->row_scales[r] : e->scale;
        for (int64_t j = 0; j < cols; j++) out[r * cols + j] = q[r * cols + j] * s;
    }
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Bytes a matrix takes in the storage dtype, scales included. */
static size_t matrix_bytes(qlm_dtype dt, int per_channel, int64_t rows, int64_t cols) {
    size_t b = align64((size_t)(rows * cols) * qlm_dtype_size(dt));
    if (dt == QLM_I8 && per_channel) b += align64((size_t)rows * sizeof(float));
    return b;
}

/* Converts entry e into the matrix w placed at *cursor (advanced past it). */
static int fill_matrix(qlm_weight *w, const qlm_tensor_entry *e, qlm_dtype dt, int per_channel, char **cursor) {
    int64_t rows = e->shape[0], cols = e->shape[1], n = rows * cols;
    char *dst = *cursor;
    *cursor += align64((size_t)n * qlm_dtype_size(dt));
    w->dtype = dt;
    w->rows = (int)rows;
    w->cols = (int)cols;
    w->data = dst;
    w->scale = 1.0f;
    w->row_scales = NULL;
    if (dt == QLM_I8 && per_channel) {
        w->row_scales = (float *)*cursor;
        *cursor += align64((size_t)rows * sizeof(float));
    }
    if (e->dtype == dt && dt != QLM_I8) {
        memcpy(dst, e->data, (size_t)n * qlm_dtype_size(dt));
        return 0;
    }
    if (e->dtype == QLM_I8 && dt == QLM_I8 && (per_channel || !e->row_scales)) {
        memcpy(dst, e->data, (size_t)n);
        if (per_channel)
            for (int64_t r = 0; r < rows; r++) ((float *)w->row_scales)[r] = e->row_scales ? e->row_scales[r] : e->scale;
        else
            w->scale = e->scale;
        return 0;
    }
    float *tmp = malloc((size_t)n * sizeof *tmp);
    if (!tmp) return qlm_errorf("out of memory converting %s", e->name);
    entry_to_f32(e, tmp);
    if (dt == QLM_I8) {
        if (per_channel)
            qlm_quantize_i8_rows((int8_t *)dst, (float *)w->row_scales, tmp, rows, cols);
        else
            w->scale = qlm_quantize_i8((int8_t *)dst, tmp, rows, cols);
    } else {
        qlm_convert_from_f32(dst, dt, tmp, n);
    }
    free(tmp);
    return 0;
}

static float *fill_vector(const qlm_tensor_entry *e, char **cursor) {
    float *dst = (float *)*cursor;
    *cursor += align64((size_t)qlm_entry_numel(e) * sizeof(float));
    entry_to_f32(e, dst);
    return dst;
}

static const qlm_tensor_entry *layer_entry(const qlm_tensor_store *s, int layer, const char *suffix) {
    char name[160];
    snprintf(name, sizeof name, "model.layers.%d.%s", layer, suffix);
    return qlm_store_find(s, name);
}

static int build_layer(qlm_model *m, const qlm_tensor_store *store, int l) {
    const qlm_llama_config *c = &m->cfg;
    const qlm_tensor_entry *ent[N_LAYER_PARAMS];
    size_t bytes = 0;
    for (int i = 0; i < N_LAYER_PARAMS; i++) {
        int64_t rows, cols;
        layer_param_shape(c, i, &rows, &cols);
        ent[i] = layer_entry(store, l, k_layer_params[i].suffix);
        if (!ent[i]) {
            if (k_layer_params[i].optional) continue;
            return qlm_errorf("tensor model.layers.%d.%s is missing", l, k_layer_params[i].suffix);
        }
        if (check_shape(ent[i], rows, cols) != 0) return -1;
        bytes += k_layer_params[i].is_matrix ? matrix_bytes(m->dtype, m->per_channel, rows, cols)
                                             : align64((size_t)rows * sizeof(float));
    }
    qlm_layer *L = &m->layers[l];
    L->buffer = malloc(bytes ? bytes : 64);
    if (!L->buffer) return qlm_errorf("out of memory for layer %d (%zu bytes)", l, bytes);
    L->buffer_bytes = bytes;
    char *cur = L->buffer;
    qlm_weight *mats[] = {NULL, &L->wq, &L->wk, &L->wv, &L->wo, NULL, &L->w_gate, &L->w_up, &L->w_down};
    float **vecs[N_LAYER_PARAMS] = {&L->attn_norm, NULL, NULL, NULL, NULL, &L->ffn_norm, NULL, NULL, NULL,
                                    &L->bq, &L->bk, &L->bv, &L->bo, &L->b_gate, &L->b_up, &L->b_down};
    for (int i = 0; i < N_LAYER_PARAMS; i++) {
        if (!ent[i]) continue;
        if (k_layer_params[i].is_matrix) {
            if (fill_matrix(mats[i], ent[i], m->dtype, m->per_channel, &cur) != 0) return -1;
            if (m->be->upload_weight(mats[i]) != 0) return -1;
        } else {
            *vecs[i] = fill_vector(ent[i], &cur);
        }
    }
    return 0;
}

static int build_shared(qlm_model *m, const qlm_tensor_store *store) {
    const qlm_llama_config *c = &m->cfg;
    const qlm_tensor_entry *emb = qlm_store_find(store, "model.embed_tokens.weight");
    const qlm_tensor_entry *head = qlm_store_find(store, "lm_head.weight");
    const qlm_tensor_entry *norm = qlm_store_find(store, "model.norm.weight");
    if (!emb && head && c->tie_embeddings) emb = head; /* tied checkpoints may store only one name */
    if (!emb) return qlm_errorf("tensor model.embed_tokens.weight is missing");
    if (!norm) return qlm_errorf("tensor model.norm.weight is missing");
    int tied = c->tie_embeddings || !head;
    if (tied) head = emb;
    if (check_shape(emb, c->vocab_size, c->dim) != 0 || check_shape(head, c->vocab_size, c->dim) != 0 ||
        check_shape(norm, c->dim, 0) != 0)
        return -1;
    size_t bytes = matrix_bytes(m->dtype, m->per_channel, c->vocab_size, c->dim) + align64((size_t)c->dim * 4);
    if (!tied) bytes += matrix_bytes(m->dtype, m->per_channel, c->vocab_size, c->dim);
    m->shared_buffer = malloc(bytes);
    if (!m->shared_buffer) return qlm_errorf("out of memory for embeddings (%zu bytes)", bytes);
    m->shared_bytes = bytes;
    char *cur = m->shared_buffer;
    if (fill_matrix(&m->tok_embed, emb, m->dtype, m->per_channel, &cur) != 0) return -1;
    if (tied)
        m->lm_head = m->tok_embed;
    else if (fill_matrix(&m->lm_head, head, m->dtype, m->per_channel, &cur) != 0)
        return -1;
    m->final_norm = fill_vector(norm, &cur);
    if (m->be->upload_weight(&m->tok_embed) != 0) return -1;
    if (!tied && m->be->upload_weight(&m->lm_head) != 0) return -1;
    if (tied) m->lm_head = m->tok_embed;
    m->cfg.tie_embeddings = tied;
    return 0;
}

/* RoPE inverse frequencies, with Llama 3's long-context rescaling when configured. */
static int build_inv_freq(qlm_model *m) {
    const qlm_llama_config *c = &m->cfg;
    int half = c->head_dim / 2;
    m->inv_freq = malloc((size_t)half * sizeof(float));
    if (!m->inv_freq) return qlm_errorf("out of memory");
    for (int j = 0; j < half; j++) {
        float f = 1.0f / powf(c->rope_theta, (float)(2 * j) / (float)c->head_dim);
        if (c->rope_scale_factor > 0) {
            float old = (float)c->rope_orig_max_pos;
            float low_wavelen = old / c->rope_low_freq_factor, high_wavelen = old / c->rope_high_freq_factor;
            float wavelen = 2.0f * (float)M_PI / f;
            if (wavelen > low_wavelen) {
                f = f / c->rope_scale_factor;
            } else if (wavelen >= high_wavelen) {
                float smooth = (old / wavelen - c->rope_low_freq_factor) /
                               (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1 - smooth) * f / c->rope_scale_factor + smooth * f;
            }
        }
        m->inv_freq[j] = f;
    }
    return 0;
}

int qlm_model_build(qlm_model *m, const qlm_llama_config *cfg, const qlm_tensor_store *store,
                    const qlm_model_options *opts) {
    memset(m, 0, sizeof *m);
    if (qlm_config_validate(cfg, "model config") != 0) return -1;
    m->cfg = *cfg;
    m->dtype = opts->dtype;
    m->per_channel = opts->dtype == QLM_I8 && opts->per_channel;
    m->be = opts->backend ? opts->backend : qlm_backend_cpu();
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->layers) return qlm_errorf("out of memory");
    if (build_shared(m, store) != 0 || build_inv_freq(m) != 0) goto fail;
    for (int l = 0; l < cfg->n_layers; l++)
        if (build_layer(m, store, l) != 0) goto fail;
    return 0;
fail:
    qlm_model_free(m);
    return -1;
}

void qlm_model_free(qlm_model *m) {
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layers; l++) free(m->layers[l].buffer);
    free(m->layers);
    free(m->shared_buffer);
    free(m->inv_freq);
    memset(m, 0, sizeof *m);
}

static size_t weight_bytes(const qlm_weight *w) {
    size_t b = (size_t)w->rows * w->cols * qlm_dtype_size(w->dtype);
    if (w->row_scales) b += (size_t)w->rows * sizeof(float);
    return b;
}

size_t qlm_model_weight_bytes(const qlm_model *m) {
    size_t b = weight_bytes(&m->lm_head);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const qlm_layer *L = &m->layers[l];
        const qlm_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) b += weight_bytes(ws[i]);
    }
    return b;
}

/* The optional bias vectors of a layer, in k_layer_params order from index FIRST_BIAS. */
enum { FIRST_BIAS = 9 };
static const float *layer_bias(const qlm_layer *L, int idx) {
    const float *b[] = {L->bq, L->bk, L->bv, L->bo, L->b_gate, L->b_up, L->b_down};
    return b[idx - FIRST_BIAS];
}

int64_t qlm_model_param_count(const qlm_model *m) {
    const qlm_llama_config *c = &m->cfg;
    int64_t per_layer = 0;
    for (int i = 0; i < N_LAYER_PARAMS; i++) {
        int64_t rows, cols;
        layer_param_shape(c, i, &rows, &cols);
        if (k_layer_params[i].optional && !layer_bias(&m->layers[0], i)) continue;
        per_layer += rows * (cols ? cols : 1);
    }
    int64_t n = per_layer * c->n_layers + (int64_t)c->vocab_size * c->dim + c->dim;
    if (!c->tie_embeddings) n += (int64_t)c->vocab_size * c->dim;
    return n;
}

static int export_matrix(qlm_tensor_store *s, const char *name, const qlm_weight *w) {
    int64_t shape[2] = {w->rows, w->cols};
    void *data;
    qlm_tensor_entry *e = qlm_store_add_owned(s, name, w->dtype, 2, shape, &data);
    if (!e) return -1;
    memcpy(data, w->data, (size_t)w->rows * w->cols * qlm_dtype_size(w->dtype));
    e->scale = w->scale;
    if (w->row_scales) {
        float *rs = malloc((size_t)w->rows * sizeof *rs);
        if (!rs || qlm_store_keep_buffer(s, rs) != 0) {
            free(rs);
            return qlm_errorf("out of memory");
        }
        memcpy(rs, w->row_scales, (size_t)w->rows * sizeof *rs);
        e->row_scales = rs;
    }
    return 0;
}

static int export_vector(qlm_tensor_store *s, const char *name, const float *v, int64_t n) {
    void *data;
    if (!qlm_store_add_owned(s, name, QLM_F32, 1, &n, &data)) return -1;
    memcpy(data, v, (size_t)n * sizeof(float));
    return 0;
}

int qlm_model_export(const qlm_model *m, qlm_tensor_store *store) {
    const qlm_llama_config *c = &m->cfg;
    if (export_matrix(store, "model.embed_tokens.weight", &m->tok_embed) != 0) return -1;
    if (!c->tie_embeddings && export_matrix(store, "lm_head.weight", &m->lm_head) != 0) return -1;
    if (export_vector(store, "model.norm.weight", m->final_norm, c->dim) != 0) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        const qlm_layer *L = &m->layers[l];
        const qlm_weight *mats[] = {NULL, &L->wq, &L->wk, &L->wv, &L->wo, NULL, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < N_LAYER_PARAMS; i++) {
            char name[160];
            int64_t rows, cols;
            layer_param_shape(c, i, &rows, &cols);
            snprintf(name, sizeof name, "model.layers.%d.%s", l, k_layer_params[i].suffix);
            int rc;
            if (k_layer_params[i].is_matrix)
                rc = export_matrix(store, name, mats[i]);
            else if (i < FIRST_BIAS)
                rc = export_vector(store, name, i == 0 ? L->attn_norm : L->ffn_norm, rows);
            else
                rc = layer_bias(L, i) ? export_vector(store, name, layer_bias(L, i), rows) : 0;
            if (rc != 0) return -1;
        }
    }
    return 0;
}
