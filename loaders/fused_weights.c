#include "fused_weights.h"

#include <stdio.h>

#include "../core/error.h"

/* One part of a fused matrix: its name and how many rows it takes. */
typedef struct {
    const char *suffix;
    int64_t rows;
} part;

/* Splits model.layers.<l>.<fused> into parts[0..n) by rows, if the store has it. */
static int split_rows(qlm_tensor_store *s, int l, const char *fused, const part *parts, int n, int64_t cols,
                      const char *path) {
    char name[192];
    snprintf(name, sizeof name, "model.layers.%d.%s", l, fused);
    const qlm_tensor_entry *found = qlm_store_find(s, name);
    if (!found) return 0;
    const qlm_tensor_entry f = *found, *e = &f; /* adding entries may move the store's array */
    int64_t rows = 0;
    for (int i = 0; i < n; i++) rows += parts[i].rows;
    if (e->ndim != 2 || e->shape[0] != rows || e->shape[1] != cols)
        return qlm_errorf("%s: tensor %s: shape [%lld, %lld], expected [%lld, %lld]", path, name,
                          (long long)e->shape[0], (long long)(e->ndim > 1 ? e->shape[1] : 0), (long long)rows,
                          (long long)cols);
    size_t row_bytes = e->nbytes / (size_t)rows;
    const char *data = e->data;
    int64_t first = 0;
    for (int i = 0; i < n; i++) {
        char part_name[192];
        snprintf(part_name, sizeof part_name, "model.layers.%d.%s", l, parts[i].suffix);
        int64_t shape[2] = {parts[i].rows, cols};
        qlm_tensor_entry *p =
            qlm_store_add(s, part_name, e->dtype, 2, shape, data + (size_t)first * row_bytes, (size_t)parts[i].rows * row_bytes);
        if (!p) return qlm_errorf("%s: %s: %s", path, name, qlm_last_error());
        p->scale = e->scale;
        p->group = e->group;
        p->row_scales = e->row_scales ? e->row_scales + first : NULL;
        first += parts[i].rows;
    }
    return qlm_store_remove(s, name);
}

int qlm_store_unfuse(qlm_tensor_store *s, const qlm_llama_config *c, const char *path) {
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    const part qkv[] = {{"self_attn.q_proj.weight", q}, {"self_attn.k_proj.weight", kv}, {"self_attn.v_proj.weight", kv}};
    const part gate_up[] = {{"mlp.gate_proj.weight", c->hidden_dim}, {"mlp.up_proj.weight", c->hidden_dim}};
    for (int l = 0; l < c->n_layers; l++)
        if (split_rows(s, l, "self_attn.qkv_proj.weight", qkv, 3, c->dim, path) != 0 ||
            split_rows(s, l, "mlp.gate_up_proj.weight", gate_up, 2, c->dim, path) != 0)
            return -1;
    return 0;
}
