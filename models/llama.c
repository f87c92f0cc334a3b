/* Llama-family decoder: weight conversion into per-layer flat buffers, and the forward pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "model.h"
#include "param_pack.h"

/* ---- building: from store entries to converted weights ---- */

enum { MAX_LAYER_PARAMS = 20, N_SHARED_PARAMS = 3 };

/* The parameters of layer l under their Hugging Face names, with shapes and destinations: the
 * required ones, the biases (optional: loaded when the checkpoint has them), then the norms only
 * some families have. Returns the count. */
static int layer_params(qlm_model *m, int l, qlm_param p[MAX_LAYER_PARAMS]) {
    const qlm_llama_config *c = &m->cfg;
    qlm_layer *L = &m->layers[l];
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    /* Gemma's names: post_attention_layernorm is the attention output's norm, the MLP's input
     * norm is pre_feedforward_layernorm. */
    const char *ffn_norm = c->post_norms ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight";
    const struct {
        const char *suffix;
        int64_t rows, cols;
        qlm_weight *matrix;
        float **vector;
        int optional, listed;
    } k[MAX_LAYER_PARAMS] = {
        {"input_layernorm.weight", c->dim, 0, NULL, &L->attn_norm, 0, 1},
        {"self_attn.q_proj.weight", q, c->dim, &L->wq, NULL, 0, 1},
        {"self_attn.k_proj.weight", kv, c->dim, &L->wk, NULL, 0, 1},
        {"self_attn.v_proj.weight", kv, c->dim, &L->wv, NULL, 0, 1},
        {"self_attn.o_proj.weight", c->dim, q, &L->wo, NULL, 0, 1},
        {ffn_norm, c->dim, 0, NULL, &L->ffn_norm, 0, 1},
        {"mlp.gate_proj.weight", c->hidden_dim, c->dim, &L->w_gate, NULL, 0, 1},
        {"mlp.up_proj.weight", c->hidden_dim, c->dim, &L->w_up, NULL, 0, 1},
        {"mlp.down_proj.weight", c->dim, c->hidden_dim, &L->w_down, NULL, 0, 1},
        {"self_attn.q_proj.bias", q, 0, NULL, &L->bq, 1, 1},
        {"self_attn.k_proj.bias", kv, 0, NULL, &L->bk, 1, 1},
        {"self_attn.v_proj.bias", kv, 0, NULL, &L->bv, 1, 1},
        {"self_attn.o_proj.bias", c->dim, 0, NULL, &L->bo, 1, 1},
        {"mlp.gate_proj.bias", c->hidden_dim, 0, NULL, &L->b_gate, 1, 1},
        {"mlp.up_proj.bias", c->hidden_dim, 0, NULL, &L->b_up, 1, 1},
        {"mlp.down_proj.bias", c->dim, 0, NULL, &L->b_down, 1, 1},
        {"self_attn.q_norm.weight", c->head_dim, 0, NULL, &L->q_norm, 0, c->qk_norm},
        {"self_attn.k_norm.weight", c->head_dim, 0, NULL, &L->k_norm, 0, c->qk_norm},
        {"post_attention_layernorm.weight", c->dim, 0, NULL, &L->attn_post_norm, 0, c->post_norms},
        {"post_feedforward_layernorm.weight", c->dim, 0, NULL, &L->ffn_post_norm, 0, c->post_norms},
    };
    int n = 0;
    for (int i = 0; i < MAX_LAYER_PARAMS; i++) {
        if (!k[i].listed) continue;
        int is_norm = k[i].vector && strstr(k[i].suffix, "norm") != NULL;
        p[n] = (qlm_param){.rows = k[i].rows, .cols = k[i].cols, .optional = k[i].optional, .matrix = k[i].matrix,
                           .vector = k[i].vector, .offset = is_norm ? c->norm_offset : 0};
        snprintf(p[n].name, sizeof p[n].name, "model.layers.%d.%s", l, k[i].suffix);
        n++;
    }
    return n;
}

/* Embeddings, final norm and (untied) head; embed_name is where the embedding is read from. */
static int shared_params(qlm_model *m, const char *embed_name, qlm_param p[N_SHARED_PARAMS]) {
    const qlm_llama_config *c = &m->cfg;
    p[0] = (qlm_param){.rows = c->vocab_size, .cols = c->dim, .matrix = &m->tok_embed, .lookup = !c->tie_embeddings};
    p[1] = (qlm_param){.rows = c->dim, .vector = &m->final_norm, .offset = c->norm_offset};
    p[2] = (qlm_param){.rows = c->vocab_size, .cols = c->dim, .matrix = &m->lm_head};
    snprintf(p[0].name, sizeof p[0].name, "%s", embed_name);
    snprintf(p[1].name, sizeof p[1].name, "model.norm.weight");
    snprintf(p[2].name, sizeof p[2].name, "lm_head.weight");
    return c->tie_embeddings ? 2 : 3;
}

static int build_layer(qlm_model *m, const qlm_tensor_store *store, int l) {
    qlm_param p[MAX_LAYER_PARAMS];
    int n = layer_params(m, l, p);
    qlm_layer *L = &m->layers[l];
    return qlm_params_pack(p, n, store, m->fmt, m->be, &L->buffer, &L->buffer_bytes, &m->in_place_bytes);
}

static int build_shared(qlm_model *m, const qlm_tensor_store *store) {
    const char *embed = "model.embed_tokens.weight";
    int has_head = qlm_store_find(store, "lm_head.weight") != NULL;
    if (!qlm_store_find(store, embed) && has_head && m->cfg.tie_embeddings)
        embed = "lm_head.weight"; /* tied checkpoints may store only one name */
    if (!has_head) m->cfg.tie_embeddings = 1;
    qlm_param p[N_SHARED_PARAMS];
    int n = shared_params(m, embed, p);
    if (qlm_params_pack(p, n, store, m->fmt, m->be, &m->shared_buffer, &m->shared_bytes, &m->in_place_bytes) !=
        0)
        return -1;
    if (m->cfg.tie_embeddings) m->lm_head = m->tok_embed;
    return 0;
}

/* One RoPE inverse frequency f (theta^(-2j/head_dim)) under the configured scaling, as
 * transformers' rope initialisation functions compute it. */
static float scaled_freq(const qlm_llama_config *c, int j, float f) {
    float factor = c->rope_scale_factor, old = (float)c->rope_orig_max_pos;
    switch ((qlm_rope_type)c->rope_type) {
    case QLM_ROPE_DEFAULT:
    case QLM_ROPE_DYNAMIC:  /* unchanged within max_position_embeddings: qlm_llama_call_freq */
    case QLM_ROPE_LONGROPE: /* its factors divide the frequencies in freq_table */
        return f;
    case QLM_ROPE_LINEAR:
        return f / factor;
    case QLM_ROPE_LLAMA3: {
        float low_wavelen = old / c->rope_low_freq_factor, high_wavelen = old / c->rope_high_freq_factor;
        float wavelen = 2.0f * (float)M_PI / f;
        if (wavelen > low_wavelen) return f / factor;
        if (wavelen < high_wavelen) return f;
        float smooth = (old / wavelen - c->rope_low_freq_factor) / (c->rope_high_freq_factor - c->rope_low_freq_factor);
        return (1 - smooth) * f / factor + smooth * f;
    }
    case QLM_ROPE_YARN: {
        /* Dimensions that turn fewer than beta_slow times over the original context are
         * interpolated (f / factor), more than beta_fast times kept, with a linear ramp between. */
        float d = (float)c->head_dim, base = c->rope_theta;
        float lo = floorf(d * logf(old / (c->rope_beta_fast * 2 * (float)M_PI)) / (2 * logf(base)));
        float hi = ceilf(d * logf(old / (c->rope_beta_slow * 2 * (float)M_PI)) / (2 * logf(base)));
        if (lo < 0) lo = 0;
        if (hi > d - 1) hi = d - 1;
        if (lo == hi) hi += 0.001f;
        float ramp = ((float)j - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float extrapolation = 1 - ramp;
        return (f / factor) * (1 - extrapolation) + f * extrapolation;
    }
    }
    return f;
}

/* The frequencies of base theta (scaled as configured, or not) into out[head_dim / 2]; ext:
 * longrope's divisors, 1 / (ext[j] * theta^(2j/head_dim)) as transformers computes them. */
static void freq_table(const qlm_llama_config *c, float theta, int scaled, const float *ext, float *out) {
    for (int j = 0; j < c->head_dim / 2; j++) {
        float base_pow = powf(theta, (float)(2 * j) / (float)c->head_dim), f = 1.0f / base_pow;
        out[j] = ext ? 1.0f / (ext[j] * base_pow) : scaled ? scaled_freq(c, j, f) : f;
    }
}

/* freq_table into a new device buffer *table. */
static int build_inv_freq(qlm_model *m, float theta, int scaled, const float *ext, float **table) {
    size_t bytes = (size_t)(m->cfg.head_dim / 2) * sizeof(float);
    float *f_host = malloc(bytes);
    *table = m->be->alloc(bytes);
    if (!f_host || !*table) {
        free(f_host);
        return qlm_errorf("out of memory");
    }
    freq_table(&m->cfg, theta, scaled, ext, f_host);
    m->be->to_device(*table, f_host, bytes);
    free(f_host);
    return 0;
}

int qlm_rope_dynamic_init(qlm_rope_dynamic *d, const qlm_model *m) {
    memset(d, 0, sizeof *d);
    if (m->cfg.rope_type != QLM_ROPE_DYNAMIC) return 0;
    d->table = m->be->alloc((size_t)(m->cfg.head_dim / 2) * sizeof(float));
    return d->table ? 0 : qlm_errorf("out of memory");
}

void qlm_rope_dynamic_free(qlm_rope_dynamic *d, const qlm_model *m) {
    if (d->table) m->be->free(d->table);
    memset(d, 0, sizeof *d);
}

const float *qlm_llama_call_freq(const qlm_model *m, qlm_rope_dynamic *d, int max_pos) {
    const qlm_llama_config *c = &m->cfg;
    int len = max_pos + 1;
    if (m->inv_freq_long && len > c->rope_orig_max_pos) return m->inv_freq_long;
    if (!d->table || len <= c->rope_orig_max_pos) return m->inv_freq;
    if (d->len != len) {
        /* theta ((factor len / max) - (factor - 1))^(dim / (dim - 2)), in float32 as torch computes it */
        float factor = c->rope_scale_factor;
        float stretch = factor * (float)len / (float)c->rope_orig_max_pos - (factor - 1.0f);
        float theta = c->rope_theta * powf(stretch, (float)((double)c->head_dim / (c->head_dim - 2)));
        float host[2048]; /* head_dim <= 4096 (qlm_config_validate) */
        freq_table(c, theta, 0, NULL, host);
        m->be->to_device(d->table, host, (size_t)(c->head_dim / 2) * sizeof(float));
        d->len = len;
    }
    return d->table;
}

int qlm_model_random_store(const qlm_llama_config *cfg, uint64_t seed, qlm_tensor_store *store) {
    if (qlm_config_validate(cfg, "model config") != 0) return -1;
    qlm_model m = {.cfg = *cfg};
    m.layers = calloc((size_t)cfg->n_layers, sizeof *m.layers);
    if (!m.layers) return qlm_errorf("out of memory");
    qlm_param p[MAX_LAYER_PARAMS];
    int n = shared_params(&m, "model.embed_tokens.weight", p), rc = qlm_params_add_random(p, n, seed, store);
    for (int l = 0; l < cfg->n_layers && rc == 0; l++) {
        int count = layer_params(&m, l, p), keep = 0;
        /* Biases only where the config has them. */
        for (int i = 0; i < count; i++) {
            const char *name = p[i].name;
            int wanted = !strstr(name, ".bias")      ? 1
                         : strstr(name, "o_proj")    ? cfg->attn_out_bias
                         : strstr(name, "mlp.")      ? cfg->mlp_bias
                                                     : cfg->attn_bias;
            if (wanted) p[keep++] = p[i];
        }
        rc = qlm_params_add_random(p, keep, seed + 1000003u * (uint64_t)(l + 1), store);
    }
    free(m.layers);
    return rc;
}

int qlm_model_build(qlm_model *m, const qlm_llama_config *cfg, const qlm_tensor_store *store,
                    const qlm_model_options *opts) {
    memset(m, 0, sizeof *m);
    if (qlm_config_validate(cfg, "model config") != 0) return -1;
    m->cfg = *cfg;
    m->fmt = qlm_model_format(opts);
    m->be = opts->backend ? opts->backend : qlm_backend_cpu();
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->layers) return qlm_errorf("out of memory");
    int longrope = cfg->rope_type == QLM_ROPE_LONGROPE;
    if (build_shared(m, store) != 0 ||
        build_inv_freq(m, cfg->rope_theta, 1, longrope ? cfg->rope_short_factor : NULL, &m->inv_freq) != 0 ||
        (longrope && build_inv_freq(m, cfg->rope_theta, 1, cfg->rope_long_factor, &m->inv_freq_long) != 0) ||
        (cfg->rope_local_theta > 0 && build_inv_freq(m, cfg->rope_local_theta, 0, NULL, &m->inv_freq_local) != 0))
        goto fail;
    for (int l = 0; l < cfg->n_layers; l++) {
        if (build_layer(m, store, l) != 0) goto fail;
        if (opts->on_layer) opts->on_layer(opts->on_layer_user, l + 1, cfg->n_layers);
    }
    return 0;
fail:
    qlm_model_free(m);
    return -1;
}

void qlm_model_free(qlm_model *m) {
    const qlm_backend *be = m->be;
    if (be) {
        for (int l = 0; m->layers && l < m->cfg.n_layers; l++) be->free(m->layers[l].buffer);
        be->free(m->shared_buffer);
        be->free(m->inv_freq);
        be->free(m->inv_freq_local);
        be->free(m->inv_freq_long);
    }
    free(m->layers);
    memset(m, 0, sizeof *m);
}

size_t qlm_model_weight_bytes(const qlm_model *m) {
    size_t b = qlm_weight_bytes(&m->lm_head);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const qlm_layer *L = &m->layers[l];
        const qlm_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) b += qlm_weight_bytes(ws[i]);
    }
    return b;
}

size_t qlm_model_held_bytes(const qlm_model *m) {
    size_t b = m->shared_bytes + m->in_place_bytes;
    for (int l = 0; l < m->cfg.n_layers; l++) b += m->layers[l].buffer_bytes;
    return b;
}

/* Walks the shared parameters and every layer's, exporting or counting them. */
static int64_t walk_params(qlm_model *m, qlm_tensor_store *export_to) {
    qlm_param p[MAX_LAYER_PARAMS];
    int n = shared_params(m, "model.embed_tokens.weight", p);
    int64_t count = qlm_params_count(p, n);
    if (export_to && qlm_params_export(m->be, p, n, export_to) != 0) return -1;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        n = layer_params(m, l, p);
        count += qlm_params_count(p, n);
        if (export_to && qlm_params_export(m->be, p, n, export_to) != 0) return -1;
    }
    return count;
}

int64_t qlm_model_param_count(const qlm_model *m) {
    return walk_params((qlm_model *)m, NULL);
}

int qlm_model_export(const qlm_model *m, qlm_tensor_store *store) {
    return walk_params((qlm_model *)m, store) < 0 ? -1 : 0;
}

int qlm_model_units(qlm_model *m, qlm_param **params, int *n_params, qlm_unit **units) {
    int cap = N_SHARED_PARAMS + m->cfg.n_layers * MAX_LAYER_PARAMS, n = 0, n_units = m->cfg.n_layers + 1;
    qlm_param *list = malloc((size_t)cap * sizeof *list), p[MAX_LAYER_PARAMS];
    qlm_unit *u = units ? malloc((size_t)n_units * sizeof *u) : NULL;
    if (!list || (units && !u)) {
        free(list);
        free(u);
        return qlm_errorf("out of memory");
    }
    int k = shared_params(m, "model.embed_tokens.weight", p);
    for (int l = -1; l < m->cfg.n_layers; l++) {
        if (l >= 0) k = layer_params(m, l, p);
        if (u)
            u[l + 1] = (qlm_unit){.buffer = l < 0 ? &m->shared_buffer : &m->layers[l].buffer,
                                  .bytes = l < 0 ? &m->shared_bytes : &m->layers[l].buffer_bytes, .first = n};
        if (u && l < 0 && m->cfg.tie_embeddings) {
            m->head_view = (qlm_weight_view){&m->lm_head, &m->tok_embed, 0};
            u[0].views = &m->head_view, u[0].n_views = 1;
        }
        for (int i = 0; i < k; i++)
            if (qlm_param_present(&p[i])) list[n++] = p[i];
        if (u) u[l + 1].count = n - u[l + 1].first;
    }
    *params = list;
    *n_params = n;
    if (units) *units = u;
    return n_units;
}

int qlm_model_param_list(qlm_model *m, qlm_param **out) {
    int n = 0;
    return qlm_model_units(m, out, &n, NULL) < 0 ? -1 : n;
}

int qlm_model_f32_twin(qlm_model *twin, const qlm_model *m) {
    *twin = *m;
    twin->fmt = (qlm_weight_format){.dtype = QLM_F32};
    twin->in_place_bytes = 0;
    twin->inv_freq = twin->inv_freq_local = twin->inv_freq_long = NULL; /* the twin owns its buffers only */
    twin->hooks = NULL;
    twin->shared_buffer = NULL;
    twin->layers = calloc((size_t)m->cfg.n_layers, sizeof *twin->layers);
    if (!twin->layers) return qlm_errorf("out of memory");
    for (int l = 0; l < m->cfg.n_layers; l++) twin->layers[l] = m->layers[l], twin->layers[l].buffer = NULL;
    qlm_param p[MAX_LAYER_PARAMS];
    int k = shared_params(twin, "model.embed_tokens.weight", p);
    if (qlm_params_twin(m->be, p, k, &twin->shared_buffer) != 0) goto fail;
    if (m->cfg.tie_embeddings) twin->lm_head = twin->tok_embed;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        k = layer_params(twin, l, p);
        if (qlm_params_twin(m->be, p, k, &twin->layers[l].buffer) != 0) goto fail;
    }
    twin->inv_freq = m->inv_freq;
    twin->inv_freq_local = m->inv_freq_local;
    twin->inv_freq_long = m->inv_freq_long;
    return 0;
fail:
    twin->inv_freq = m->inv_freq;
    twin->inv_freq_local = m->inv_freq_local;
    twin->inv_freq_long = m->inv_freq_long;
    qlm_model_twin_free(twin);
    return -1;
}

void qlm_model_twin_free(qlm_model *twin) {
    if (twin->layers)
        for (int l = 0; l < twin->cfg.n_layers; l++) twin->be->free(twin->layers[l].buffer);
    free(twin->layers);
    if (twin->be) twin->be->free(twin->shared_buffer);
    memset(twin, 0, sizeof *twin);
}
