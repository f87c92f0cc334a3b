/* The Llama forward pass over a KV cache, written once against the backend op table. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../core/kv_cache.h"
#include "adapter.h"
#include "model.h"

int qlm_state_init(qlm_kv_state *s, const qlm_model *m, int max_seq, int max_batch) {
    return qlm_state_init_slots(s, m, max_seq, 1, max_batch);
}

/* be->alloc of bytes, counted in s->bytes. */
static void *state_alloc(qlm_kv_state *s, const qlm_backend *be, size_t bytes) {
    s->bytes += bytes;
    return be->alloc(bytes);
}

int qlm_state_init_slots(qlm_kv_state *s, const qlm_model *m, int max_seq, int n_slots, int max_batch) {
    const qlm_llama_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    memset(s, 0, sizeof *s);
    if (max_seq <= 0 || max_batch <= 0 || n_slots <= 0)
        return qlm_errorf("context, slot and batch sizes must be positive");
    s->max_seq = max_seq;
    s->n_slots = n_slots;
    s->max_batch = max_batch;
    size_t kv_dim = (size_t)c->n_kv_heads * c->head_dim, q_dim = (size_t)c->n_heads * c->head_dim;
    size_t B = (size_t)max_batch;
    s->kv_dtype = qlm_kv_dtype(m->fmt.dtype, m->be);
    size_t row_bytes = (size_t)n_slots * kv_dim * qlm_kv_elem_size(s->kv_dtype), kv_bytes = 0;
    s->k_cache = calloc((size_t)c->n_layers, sizeof *s->k_cache);
    s->v_cache = calloc((size_t)c->n_layers, sizeof *s->v_cache);
    s->cache_rows = calloc((size_t)c->n_layers, sizeof *s->cache_rows);
    s->ring_pos = calloc(B, sizeof *s->ring_pos);
    if (!s->k_cache || !s->v_cache || !s->cache_rows || !s->ring_pos) goto oom;
    for (int l = 0; l < c->n_layers; l++) {
        long window = qlm_layer_window(c, l), rolling = window + max_batch - 1;
        s->cache_rows[l] = window && rolling < max_seq ? (int)rolling : max_seq;
        kv_bytes += 2 * row_bytes * (size_t)s->cache_rows[l];
        s->k_cache[l] = state_alloc(s, be, row_bytes * (size_t)s->cache_rows[l]);
        s->v_cache[l] = state_alloc(s, be, row_bytes * (size_t)s->cache_rows[l]);
        if (!s->k_cache[l] || !s->v_cache[l]) goto oom;
    }
    size_t xb_dim = (size_t)c->dim > q_dim ? (size_t)c->dim : q_dim;
    s->x = state_alloc(s, be, B * c->dim * sizeof(float));
    s->xb = state_alloc(s, be, B * xb_dim * sizeof(float));
    s->q = state_alloc(s, be, B * q_dim * sizeof(float));
    s->k = state_alloc(s, be, B * kv_dim * sizeof(float));
    s->v = state_alloc(s, be, B * kv_dim * sizeof(float));
    s->att = state_alloc(s, be, B * q_dim * sizeof(float));
    s->hb = state_alloc(s, be, B * c->hidden_dim * sizeof(float));
    s->hb2 = state_alloc(s, be, B * c->hidden_dim * sizeof(float));
    s->hg = state_alloc(s, be, B * c->hidden_dim * sizeof(float));
    s->logits_rows = state_alloc(s, be, B * c->dim * sizeof(float));
    if (!s->x || !s->xb || !s->q || !s->k || !s->v || !s->att || !s->hb || !s->hb2 || !s->hg || !s->logits_rows)
        goto oom;
    if (!be->host_memory && !(s->logits_dev = state_alloc(s, be, B * c->vocab_size * sizeof(float)))) goto oom;
    if (qlm_lora_slots_init(&s->lora, n_slots, max_batch) != 0 || qlm_rope_dynamic_init(&s->rope, m) != 0) goto oom;
    return 0;
oom:
    qlm_state_free(s, m);
    return qlm_errorf("out of memory for a KV cache of %d x %d positions (%.1f MiB)", n_slots, max_seq,
                      (double)(kv_bytes ? kv_bytes : 2 * row_bytes * (size_t)max_seq * c->n_layers) / 1048576.0);
}

void qlm_state_free(qlm_kv_state *s, const qlm_model *m) {
    const qlm_backend *be = m->be;
    if (s->k_cache)
        for (int l = 0; l < m->cfg.n_layers; l++) be->free(s->k_cache[l]);
    if (s->v_cache)
        for (int l = 0; l < m->cfg.n_layers; l++) be->free(s->v_cache[l]);
    free(s->k_cache);
    free(s->v_cache);
    free(s->cache_rows);
    free(s->ring_pos);
    float *bufs[] = {s->x, s->xb, s->q, s->k, s->v, s->att, s->hb, s->hb2, s->hg, s->logits_rows, s->logits_dev};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(bufs[i]);
    qlm_lora_slots_free(&s->lora);
    qlm_rope_dynamic_free(&s->rope, m);
    memset(s, 0, sizeof *s);
}

/* The window of the first rolling cache (all of a model's windows are equal), or 0 when none rolls. */
static int rolling_window(const qlm_model *m, const qlm_kv_state *s) {
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (s->cache_rows[l] < s->max_seq) return qlm_layer_window(&m->cfg, l);
    return 0;
}

int qlm_state_resumable(const qlm_model *m, const qlm_kv_state *s, int filled, int k) {
    int w = rolling_window(m, s);
    if (!w || k <= 0) return k;
    /* Position k's window starts at k - w + 1; a rolling cache of R rows still holds positions
     * filled - R and up. */
    for (int l = 0; l < m->cfg.n_layers; l++) {
        int first = k - w + 1 > 0 ? k - w + 1 : 0;
        if (s->cache_rows[l] < s->max_seq && first < filled - s->cache_rows[l]) return 0;
    }
    return k;
}

int qlm_state_copy_prefix(const qlm_model *m, qlm_kv_state *s, int dst, int src, int n) {
    const qlm_llama_config *c = &m->cfg;
    if (dst < 0 || dst >= s->n_slots || src < 0 || src >= s->n_slots || n < 0 || n > s->max_seq)
        return qlm_errorf("cache copy of %d positions from slot %d to slot %d is outside %d slots of %d", n, src, dst,
                          s->n_slots, s->max_seq);
    if (dst == src || n == 0) return 0;
    size_t esize = qlm_kv_elem_size(s->kv_dtype);
    for (int l = 0; l < c->n_layers; l++) {
        int rows = s->cache_rows[l], rolling = rows < s->max_seq;
        /* A rolling cache needs only the window before position n, which may wrap around its end. */
        int from = rolling && n > qlm_layer_window(c, l) ? n - qlm_layer_window(c, l) : 0;
        /* A head's run of positions is contiguous (core/kv_cache.h), and whole floats long: head_dim is even. */
        size_t run = (size_t)rows * c->head_dim * esize;
        for (int p = from; p < n;) {
            int row = rolling ? p % rows : p, len = n - p < rows - row ? n - p : rows - row;
            long floats = (long)((size_t)len * c->head_dim * esize / sizeof(float));
            size_t at = (size_t)row * c->head_dim * esize;
            for (int h = 0; h < c->n_kv_heads; h++) {
                size_t to = ((size_t)dst * c->n_kv_heads + h) * run + at, fr = ((size_t)src * c->n_kv_heads + h) * run + at;
                m->be->copy((float *)((char *)s->k_cache[l] + to), (const float *)((char *)s->k_cache[l] + fr), floats);
                m->be->copy((float *)((char *)s->v_cache[l] + to), (const float *)((char *)s->v_cache[l] + fr), floats);
            }
            p += len;
        }
    }
    return 0;
}

/* A projection of layer l with each row's LoRA update, and the same for several of one x, made
 * by a step or given, and q, k and v with the kv step after them (see qlm_matmul_lora_group). */
#define PROJ_GROUP(outs, targets, count, x, step, kv) \
    qlm_matmul_lora_group(be, &s->lora, outs, targets, count, x, step, kv, n, slots, 0, 0, l)

/* A block's output joins the residual stream x: its last product adds to x as it is made. A model
 * that norms a block's output first (post_norm: Gemma) takes it in xb and adds it after. */
static int block_out(const qlm_model *m, qlm_kv_state *s, int l, const int *slots, int n, const float *in,
                     const qlm_x_step *step, const qlm_weight *w, const float *bias, const float *post_norm,
                     int target) {
    const qlm_llama_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    const qlm_matmul_out out = {post_norm ? s->xb : s->x, w, bias, !post_norm};
    if (PROJ_GROUP(&out, &target, 1, in, step, NULL)) return -1;
    if (post_norm) {
        be->rmsnorm(s->xb, s->xb, post_norm, n, c->dim, c->norm_eps);
        be->add(s->x, s->xb, (long)n * c->dim);
    }
    return 0;
}

/* Each row attends over its own slot's cache. Each block's input norm runs inside its first
 * products (step_matmul_group), so do RoPE and the cache stores after q, k and v (unless q and k
 * have norms of their own), and its last product adds to x: a decode step on a GPU is bound by its
 * count of kernels. */
static int attention_forward(const qlm_model *m, const qlm_layer *L, qlm_kv_state *s, int l, const int *pos,
                             const int *slots, int n, const float *call_freq) {
    const qlm_llama_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    const qlm_x_step norm = {.kind = QLM_X_RMSNORM, .x = s->xb, .a = s->x, .weight = L->attn_norm, .eps = c->norm_eps};
    const qlm_matmul_out qkv[] = {{s->q, &L->wq, L->bq, 0}, {s->k, &L->wk, L->bk, 0}, {s->v, &L->wv, L->bv, 0}};
    static const int qkv_targets[] = {QLM_LORA_Q, QLM_LORA_K, QLM_LORA_V};
    int rows = s->cache_rows[l];
    const int *store_pos = pos;
    if (rows < s->max_seq) {
        for (int i = 0; i < n; i++) s->ring_pos[i] = pos[i] % rows;
        store_pos = s->ring_pos;
    }
    const qlm_kv_step kv = {.pos = pos, .inv_freq = qlm_llama_layer_freq(m, l, call_freq), .n_heads = c->n_heads,
                            .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .k_cache = s->k_cache[l],
                            .v_cache = s->v_cache[l], .kv = s->kv_dtype, .slots = slots, .store_pos = store_pos,
                            .max_pos = rows};
    if (PROJ_GROUP(qkv, qkv_targets, 3, NULL, &norm, L->q_norm ? NULL : &kv)) return -1;
    if (L->q_norm) {
        be->rmsnorm(s->q, s->q, L->q_norm, n * c->n_heads, c->head_dim, c->norm_eps);
        be->rmsnorm(s->k, s->k, L->k_norm, n * c->n_kv_heads, c->head_dim, c->norm_eps);
        be->rope_store(s->q, s->k, s->v, n, &kv);
    }
    qlm_attn_shape shape = qlm_llama_attn_shape(c, l);
    shape.slots = slots;
    qlm_kv_shape(&shape, rows, s->kv_dtype);
    if (rows < s->max_seq) shape.ring = rows;
    be->attention(s->att, s->q, s->k_cache[l], s->v_cache[l], n, pos, &shape);
    return block_out(m, s, l, slots, n, s->att, NULL, &L->wo, L->bo, L->attn_post_norm, QLM_LORA_O);
}

/* The GLU's product goes to hg, not over gate or up: the step's x aliases neither input. */
static int mlp_forward(const qlm_model *m, const qlm_layer *L, qlm_kv_state *s, int l, const int *slots, int n) {
    const qlm_llama_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    const qlm_x_step norm = {.kind = QLM_X_RMSNORM, .x = s->xb, .a = s->x, .weight = L->ffn_norm, .eps = c->norm_eps};
    const qlm_matmul_out gate_up[] = {{s->hb, &L->w_gate, L->b_gate, 0}, {s->hb2, &L->w_up, L->b_up, 0}};
    static const int gate_up_targets[] = {QLM_LORA_GATE, QLM_LORA_UP};
    if (PROJ_GROUP(gate_up, gate_up_targets, 2, NULL, &norm, NULL)) return -1;
    const qlm_x_step glu = {.kind = QLM_X_GLU, .x = s->hg, .a = s->hb, .b = s->hb2, .act = (qlm_act)c->act};
    return block_out(m, s, l, slots, n, NULL, &glu, &L->w_down, L->b_down, L->ffn_post_norm, QLM_LORA_DOWN);
}

#undef PROJ_GROUP

/* One chunk of at most max_batch tokens; logits for chunk rows rows[0..n_rows). */
static int forward_chunk(const qlm_model *m, qlm_kv_state *s, const int *tokens, const int *pos, const int *slots,
                         int n, const int *rows, int n_rows, float *logits, const float *call_freq) {
    const qlm_llama_config *c = &m->cfg;
    const qlm_backend *be = m->be;
    const qlm_unit_hooks *h = m->hooks;
    if (qlm_unit_begin(h, QLM_PASS_FORWARD) != 0 || qlm_unit_use(h, 0) != 0) return -1;
    be->embedding(s->x, &m->tok_embed, tokens, n);
    if (c->embed_scale > 0) be->scale(s->x, (long)n * c->dim, c->embed_scale);
    qlm_unit_done(h, 0);
    for (int l = 0; l < c->n_layers; l++) {
        if (qlm_unit_use(h, 1 + l) != 0 || attention_forward(m, &m->layers[l], s, l, pos, slots, n, call_freq) != 0 ||
            mlp_forward(m, &m->layers[l], s, l, slots, n) != 0)
            return -1;
        qlm_unit_done(h, 1 + l);
    }
    /* Sharded, every rank gathers the head in every pass, whether it wants logits or not. */
    if (n_rows == 0 && !h) return 0;
    if (qlm_unit_use(h, 0) != 0) return -1;
    /* Every row's logits in order (decode): the head norms x's rows where they are; else the rows
     * that want logits are gathered into xb first. */
    int each_row = n_rows == n;
    for (int r = 0; each_row && r < n_rows; r++) each_row = rows[r] == r;
    if (!each_row)
        for (int r = 0; r < n_rows; r++)
            be->copy(s->xb + (size_t)r * c->dim, s->x + (size_t)rows[r] * c->dim, c->dim);
    if (n_rows) {
        const qlm_x_step norm = {.kind = QLM_X_RMSNORM, .x = s->logits_rows, .a = each_row ? s->x : s->xb,
                                 .weight = m->final_norm, .eps = c->norm_eps};
        if (qlm_logits_out(be, logits, s->logits_dev, &norm, n_rows, &m->lm_head) != 0) return -1;
        /* the logits are host memory by now */
        if (c->final_softcap > 0)
            for (size_t i = 0; i < (size_t)n_rows * c->vocab_size; i++)
                logits[i] = c->final_softcap * tanhf(logits[i] / c->final_softcap);
    }
    qlm_unit_done(h, 0);
    return 0;
}

int qlm_forward(const qlm_model *m, qlm_kv_state *s, const int *tokens, const int *pos, int n,
                const int *logit_rows, int n_logit_rows, float *logits) {
    return qlm_forward_slots(m, s, tokens, pos, NULL, n, logit_rows, n_logit_rows, logits);
}

int qlm_forward_slots(const qlm_model *m, qlm_kv_state *s, const int *tokens, const int *pos, const int *slots,
                      int n, const int *logit_rows, int n_logit_rows, float *logits) {
    const qlm_llama_config *c = &m->cfg;
    int max_pos = 0; /* of the whole call, which picks its RoPE table */
    for (int i = 0; i < n; i++) {
        if (pos[i] > max_pos) max_pos = pos[i];
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return qlm_errorf("token id %d is outside the vocabulary (0..%d)", tokens[i], c->vocab_size - 1);
        if (pos[i] < 0 || pos[i] >= s->max_seq)
            return qlm_errorf("position %d is outside the context window (%d tokens)", pos[i], s->max_seq);
        if (slots && (slots[i] < 0 || slots[i] >= s->n_slots))
            return qlm_errorf("slot %d out of range (0..%d)", slots[i], s->n_slots - 1);
    }
    for (int r = 0; r < n_logit_rows; r++)
        if (logit_rows[r] < 0 || logit_rows[r] >= n || (r > 0 && logit_rows[r] <= logit_rows[r - 1]))
            return qlm_errorf("logit rows must be ascending and within 0..%d", n - 1);
    int *chunk_rows = malloc((size_t)(n_logit_rows ? n_logit_rows : 1) * sizeof *chunk_rows);
    if (!chunk_rows) return qlm_errorf("out of memory");
    int done_rows = 0;
    const float *call_freq = qlm_llama_call_freq(m, &s->rope, max_pos);
    for (int start = 0; start < n; start += s->max_batch) {
        int len = n - start < s->max_batch ? n - start : s->max_batch;
        int k = 0;
        for (int r = 0; r < n_logit_rows; r++)
            if (logit_rows[r] >= start && logit_rows[r] < start + len) chunk_rows[k++] = logit_rows[r] - start;
        if (forward_chunk(m, s, tokens + start, pos + start, slots ? slots + start : NULL, len, chunk_rows, k,
                          logits + (size_t)done_rows * c->vocab_size, call_freq) != 0) {
            free(chunk_rows);
            return -1;
        }
        done_rows += k;
    }
    free(chunk_rows);
    return 0;
}
