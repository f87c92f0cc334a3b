/* T5 encoder-decoder: parameters under Hugging Face names, packed per block with
 * core/param_pack; the forward pass is in t5_forward.c. */
#include "t5.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "param_pack.h"

enum { MAX_BLOCK_PARAMS = 14, N_SHARED_PARAMS = 6 };

/* Stack "encoder" or "decoder", block b: its parameters, shapes and destinations. */
static int block_params(qlm_t5_model *m, int decoder, int b, qlm_param p[MAX_BLOCK_PARAMS]) {
    const qlm_t5_config *c = &m->cfg;
    qlm_t5_layer *L = decoder ? &m->dec[b] : &m->enc[b];
    int64_t d = c->d_model, inner = (int64_t)c->n_heads * c->d_kv, ff = c->d_ff;
    const char *stack = decoder ? "decoder" : "encoder";
    int ffl = decoder ? 2 : 1; /* the feed-forward sub-layer's index */
    int n = 0;
#define ADD(R, C, MAT, VEC, ...)                                                                  \
    do {                                                                                          \
        p[n] = (qlm_param){.rows = (R), .cols = (C), .matrix = (MAT), .vector = (VEC)};           \
        snprintf(p[n].name, sizeof p[n].name, "%s.block.%d." __VA_ARGS__);                       \
        n++;                                                                                      \
    } while (0)
    ADD(d, 0, NULL, &L->attn_norm, "layer.0.layer_norm.weight", stack, b);
    ADD(inner, d, &L->q, NULL, "layer.0.SelfAttention.q.weight", stack, b);
    ADD(inner, d, &L->k, NULL, "layer.0.SelfAttention.k.weight", stack, b);
    ADD(inner, d, &L->v, NULL, "layer.0.SelfAttention.v.weight", stack, b);
    ADD(d, inner, &L->o, NULL, "layer.0.SelfAttention.o.weight", stack, b);
    if (decoder) {
        ADD(d, 0, NULL, &L->cross_norm, "layer.1.layer_norm.weight", stack, b);
        ADD(inner, d, &L->cq, NULL, "layer.1.EncDecAttention.q.weight", stack, b);
        ADD(inner, d, &L->ck, NULL, "layer.1.EncDecAttention.k.weight", stack, b);
        ADD(inner, d, &L->cv, NULL, "layer.1.EncDecAttention.v.weight", stack, b);
        ADD(d, inner, &L->co, NULL, "layer.1.EncDecAttention.o.weight", stack, b);
    }
    ADD(d, 0, NULL, &L->ffn_norm, "layer.%d.layer_norm.weight", stack, b, ffl);
    if (c->gated) {
        ADD(ff, d, &L->wi0, NULL, "layer.%d.DenseReluDense.wi_0.weight", stack, b, ffl);
        ADD(ff, d, &L->wi1, NULL, "layer.%d.DenseReluDense.wi_1.weight", stack, b, ffl);
    } else {
        ADD(ff, d, &L->wi0, NULL, "layer.%d.DenseReluDense.wi.weight", stack, b, ffl);
    }
    ADD(d, ff, &L->wo, NULL, "layer.%d.DenseReluDense.wo.weight", stack, b, ffl);
#undef ADD
    return n;
}

/* Embedding, head, final norms and the two relative-bias tables; embed_name is where the
 * embedding is read from. */
static int shared_params(qlm_t5_model *m, const char *embed_name, qlm_param p[N_SHARED_PARAMS]) {
    const qlm_t5_config *c = &m->cfg;
    int n = 0;
    p[n++] = (qlm_param){.rows = c->vocab_size, .cols = c->d_model, .matrix = &m->shared, .lookup = !c->tie_embeddings};
    snprintf(p[0].name, sizeof p[0].name, "%s", embed_name);
    const struct { const char *name; int64_t rows, cols; float **vec; } v[] = {
        {"encoder.final_layer_norm.weight", c->d_model, 0, &m->enc_final_norm},
        {"decoder.final_layer_norm.weight", c->d_model, 0, &m->dec_final_norm},
        {"encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", c->rel_buckets, c->n_heads, &m->enc_rel_bias},
        {"decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", c->rel_buckets, c->n_heads, &m->dec_rel_bias},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        p[n] = (qlm_param){.rows = v[i].rows, .cols = v[i].cols, .vector = v[i].vec};
        snprintf(p[n].name, sizeof p[n].name, "%s", v[i].name);
        n++;
    }
    if (!c->tie_embeddings) {
        p[n] = (qlm_param){.rows = c->vocab_size, .cols = c->d_model, .matrix = &m->lm_head};
        snprintf(p[n].name, sizeof p[n].name, "lm_head.weight");
        n++;
    }
    return n;
}

static int build_shared(qlm_t5_model *m, const qlm_tensor_store *store) {
    /* Checkpoints store the shared embedding as "shared.weight"; some only as one stack's copy. */
    const char *embed = "shared.weight";
    if (!qlm_store_find(store, embed) && qlm_store_find(store, "encoder.embed_tokens.weight"))
        embed = "encoder.embed_tokens.weight";
    qlm_param p[N_SHARED_PARAMS];
    int n = shared_params(m, embed, p);
    if (qlm_params_pack(p, n, store, m->fmt, m->be, &m->shared_buffer, &m->shared_bytes, &m->in_place_bytes) !=
        0)
        return -1;
    if (m->cfg.tie_embeddings) m->lm_head = m->shared;
    m->head_norm = m->be->alloc((size_t)m->cfg.d_model * sizeof(float));
    if (!m->head_norm) return qlm_errorf("out of memory");
    qlm_t5_refresh_head_norm(m);
    return 0;
}

int qlm_t5_build(qlm_t5_model *m, const qlm_t5_config *cfg, const qlm_tensor_store *store,
                 const qlm_model_options *opts) {
    memset(m, 0, sizeof *m);
    if (qlm_t5_config_validate(cfg, "model config") != 0) return -1;
    m->cfg = *cfg;
    m->fmt = qlm_model_format(opts);
    m->be = opts->backend ? opts->backend : qlm_backend_cpu();
    m->enc = calloc((size_t)cfg->n_layers, sizeof *m->enc);
    m->dec = calloc((size_t)cfg->n_dec_layers, sizeof *m->dec);
    if (!m->enc || !m->dec) {
        qlm_t5_free(m);
        return qlm_errorf("out of memory");
    }
    if (build_shared(m, store) != 0) goto fail;
    for (int dec = 0; dec < 2; dec++)
        for (int b = 0; b < (dec ? cfg->n_dec_layers : cfg->n_layers); b++) {
            qlm_param p[MAX_BLOCK_PARAMS];
            int n = block_params(m, dec, b, p);
            qlm_t5_layer *L = dec ? &m->dec[b] : &m->enc[b];
            if (qlm_params_pack(p, n, store, m->fmt, m->be, &L->buffer, &L->buffer_bytes, &m->in_place_bytes) != 0)
                goto fail;
            if (opts->on_layer)
                opts->on_layer(opts->on_layer_user, (dec ? cfg->n_layers : 0) + b + 1, cfg->n_layers + cfg->n_dec_layers);
        }
    return 0;
fail:
    qlm_t5_free(m);
    return -1;
}

void qlm_t5_free(qlm_t5_model *m) {
    const qlm_backend *be = m->be;
    if (be) {
        for (int b = 0; m->enc && b < m->cfg.n_layers; b++) be->free(m->enc[b].buffer);
        for (int b = 0; m->dec && b < m->cfg.n_dec_layers; b++) be->free(m->dec[b].buffer);
        be->free(m->shared_buffer);
        be->free(m->head_norm);
    }
    free(m->enc);
    free(m->dec);
    memset(m, 0, sizeof *m);
}

/* Walks every parameter list, counting and (when export_to is set) exporting. */
static int64_t walk_params(qlm_t5_model *m, qlm_tensor_store *export_to) {
    qlm_param p[MAX_BLOCK_PARAMS];
    int n = shared_params(m, "shared.weight", p);
    int64_t count = qlm_params_count(p, n);
    if (export_to && qlm_params_export(m->be, p, n, export_to) != 0) return -1;
    for (int dec = 0; dec < 2; dec++)
        for (int b = 0; b < (dec ? m->cfg.n_dec_layers : m->cfg.n_layers); b++) {
            n = block_params(m, dec, b, p);
            count += qlm_params_count(p, n);
            if (export_to && qlm_params_export(m->be, p, n, export_to) != 0) return -1;
        }
    return count;
}

size_t qlm_t5_held_bytes(const qlm_t5_model *m) {
    size_t b = m->shared_bytes + m->in_place_bytes;
    for (int l = 0; l < m->cfg.n_layers; l++) b += m->enc[l].buffer_bytes;
    for (int l = 0; l < m->cfg.n_dec_layers; l++) b += m->dec[l].buffer_bytes;
    return b;
}

int64_t qlm_t5_param_count(const qlm_t5_model *m) {
    return walk_params((qlm_t5_model *)m, NULL);
}

int qlm_t5_export(const qlm_t5_model *m, qlm_tensor_store *store) {
    return walk_params((qlm_t5_model *)m, store) < 0 ? -1 : 0;
}

size_t qlm_t5_decoder_weight_bytes(const qlm_t5_model *m) {
    size_t b = qlm_weight_bytes(&m->lm_head);
    for (int l = 0; l < m->cfg.n_dec_layers; l++) {
        const qlm_t5_layer *L = &m->dec[l];
        const qlm_weight *ws[] = {&L->q, &L->k, &L->v, &L->o, &L->cq, &L->co, &L->wi0, &L->wi1, &L->wo};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) b += qlm_weight_bytes(ws[i]);
    }
    return b;
}

int qlm_t5_random_store(const qlm_t5_config *cfg, uint64_t seed, qlm_tensor_store *store) {
    if (qlm_t5_config_validate(cfg, "model config") != 0) return -1;
    /* Only the parameter lists are needed: a model with layer arrays but no weights yet. */
    qlm_t5_model m = {.cfg = *cfg};
    m.enc = calloc((size_t)cfg->n_layers, sizeof *m.enc);
    m.dec = calloc((size_t)cfg->n_dec_layers, sizeof *m.dec);
    int rc = m.enc && m.dec ? 0 : qlm_errorf("out of memory");
    qlm_param p[MAX_BLOCK_PARAMS];
    int n = shared_params(&m, "shared.weight", p);
    if (rc == 0) rc = qlm_params_add_random(p, n, seed, store);
    for (int dec = 0; dec < 2 && rc == 0; dec++)
        for (int b = 0; b < (dec ? cfg->n_dec_layers : cfg->n_layers) && rc == 0; b++) {
            n = block_params(&m, dec, b, p);
            rc = qlm_params_add_random(p, n, seed + 1000003u * (uint64_t)(dec * 4096 + b + 1), store);
        }
    free(m.enc);
    free(m.dec);
    return rc;
}

/* As transformers computes it: exact buckets for small distances, then logarithmic ones up to
 * max_distance, in float32 so the rounding of the bucket edges agrees. */
int qlm_t5_rel_bucket(int rel, int bidirectional, int n_buckets, int max_distance) {
    int ret = 0, n;
    if (bidirectional) {
        n_buckets /= 2;
        if (rel > 0) ret += n_buckets;
        n = rel < 0 ? -rel : rel;
    } else {
        n = rel < 0 ? -rel : 0;
    }
    int max_exact = n_buckets / 2;
    if (n < max_exact) return ret + n;
    float span = (float)log((double)max_distance / max_exact);
    int large = max_exact + (int)(logf((float)n / (float)max_exact) / span * (float)(n_buckets - max_exact));
    return ret + (large < n_buckets - 1 ? large : n_buckets - 1);
}

/* The tied head's d_model^-0.5 output scaling folds into the final norm's weight. */
void qlm_t5_refresh_head_norm(qlm_t5_model *m) {
    m->be->copy(m->head_norm, m->dec_final_norm, m->cfg.d_model);
    if (m->cfg.tie_embeddings) m->be->scale(m->head_norm, m->cfg.d_model, 1.0f / sqrtf((float)m->cfg.d_model));
}

int qlm_t5_units(qlm_t5_model *m, qlm_param **params, int *n_params, qlm_unit **units) {
    int n_blocks = m->cfg.n_layers + m->cfg.n_dec_layers, n_units = n_blocks + 1, n = 0;
    int cap = N_SHARED_PARAMS + n_blocks * MAX_BLOCK_PARAMS;
    qlm_param *list = malloc((size_t)cap * sizeof *list), p[MAX_BLOCK_PARAMS];
    qlm_unit *u = units ? malloc((size_t)n_units * sizeof *u) : NULL;
    if (!list || (units && !u)) {
        free(list);
        free(u);
        return qlm_errorf("out of memory");
    }
    int k = shared_params(m, "shared.weight", p);
    if (u) u[0] = (qlm_unit){.buffer = &m->shared_buffer, .bytes = &m->shared_bytes, .first = 0, .count = k};
    if (u && m->cfg.tie_embeddings) {
        m->head_view = (qlm_weight_view){&m->lm_head, &m->shared, 0};
        u[0].views = &m->head_view, u[0].n_views = 1;
    }
    for (int i = 0; i < k; i++) list[n++] = p[i];
    for (int dec = 0, unit = 1; dec < 2; dec++)
        for (int b = 0; b < (dec ? m->cfg.n_dec_layers : m->cfg.n_layers); b++, unit++) {
            qlm_t5_layer *L = dec ? &m->dec[b] : &m->enc[b];
            k = block_params(m, dec, b, p);
            if (u) u[unit] = (qlm_unit){.buffer = &L->buffer, .bytes = &L->buffer_bytes, .first = n, .count = k};
            for (int i = 0; i < k; i++) list[n++] = p[i];
        }
    *params = list;
    *n_params = n;
    if (units) *units = u;
    return n_units;
}

int qlm_t5_param_list(qlm_t5_model *m, qlm_param **out) {
    int n = 0;
    return qlm_t5_units(m, out, &n, NULL) < 0 ? -1 : n;
}

int qlm_t5_f32_twin(qlm_t5_model *twin, const qlm_t5_model *m) {
    *twin = *m;
    twin->fmt = (qlm_weight_format){.dtype = QLM_F32};
    twin->in_place_bytes = 0;
    twin->shared_buffer = twin->head_norm = NULL;
    twin->hooks = NULL;
    twin->enc = calloc((size_t)m->cfg.n_layers, sizeof *twin->enc);
    twin->dec = calloc((size_t)m->cfg.n_dec_layers, sizeof *twin->dec);
    if (!twin->enc || !twin->dec) goto fail;
    for (int b = 0; b < m->cfg.n_layers; b++) twin->enc[b] = m->enc[b], twin->enc[b].buffer = NULL;
    for (int b = 0; b < m->cfg.n_dec_layers; b++) twin->dec[b] = m->dec[b], twin->dec[b].buffer = NULL;
    qlm_param p[MAX_BLOCK_PARAMS];
    int k = shared_params(twin, "shared.weight", p);
    if (qlm_params_twin(m->be, p, k, &twin->shared_buffer) != 0) goto fail;
    if (m->cfg.tie_embeddings) twin->lm_head = twin->shared;
    twin->head_norm = m->be->alloc((size_t)m->cfg.d_model * sizeof *twin->head_norm);
    if (!twin->head_norm) goto fail;
    m->be->zero(twin->head_norm, m->cfg.d_model);
    for (int dec = 0; dec < 2; dec++)
        for (int b = 0; b < (dec ? m->cfg.n_dec_layers : m->cfg.n_layers); b++) {
            k = block_params(twin, dec, b, p);
            if (qlm_params_twin(m->be, p, k, dec ? &twin->dec[b].buffer : &twin->enc[b].buffer) != 0) goto fail;
        }
    return 0;
fail:
    qlm_t5_twin_free(twin);
    return qlm_errorf("out of memory for an F32 copy of the T5 parameters");
}

void qlm_t5_twin_free(qlm_t5_model *twin) { qlm_t5_free(twin); }
