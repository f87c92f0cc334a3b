/* Loading, checking and saving PEFT LoRA adapters, and the O(1) module lookup. */
#include "lora.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/error.h"
#include "../core/atomic_file.h"
#include "../core/read_file.h"
#include "../loaders/safetensors.h"
#include "../quant/matmul.h"
#include "../quant/quantize.h"
#include "lora_internal.h"

#define CONFIG_FILE "adapter_config.json"
#define WEIGHTS_FILE "adapter_model.safetensors"
#define KEY_PREFIX "base_model.model."
#define MAX_CONFIG_BYTES (16u << 20)
/* Without a base, the layer count comes from the names: bounded so that the lookup table stays small. */
#define MAX_INFERRED_LAYERS 4096

/* ---- the base's projections ---- */

static const char *const k_llama_suffix[QLM_LORA_N_TARGETS] = {
    [QLM_LORA_Q] = "self_attn.q_proj",  [QLM_LORA_K] = "self_attn.k_proj", [QLM_LORA_V] = "self_attn.v_proj",
    [QLM_LORA_O] = "self_attn.o_proj",  [QLM_LORA_GATE] = "mlp.gate_proj", [QLM_LORA_UP] = "mlp.up_proj",
    [QLM_LORA_DOWN] = "mlp.down_proj", [QLM_LORA_QKV] = "self_attn.qkv_proj", [QLM_LORA_GATE_UP] = "mlp.gate_up_proj",
};

/* A fused projection's parts, in the order of its rows (transformers' Phi-3 split). */
static int fused_parts(qlm_lora_target t, qlm_lora_target parts[3]) {
    if (t == QLM_LORA_QKV) {
        parts[0] = QLM_LORA_Q, parts[1] = QLM_LORA_K, parts[2] = QLM_LORA_V;
        return 3;
    }
    if (t == QLM_LORA_GATE_UP) {
        parts[0] = QLM_LORA_GATE, parts[1] = QLM_LORA_UP;
        return 2;
    }
    return 0;
}

static int is_llama_target(qlm_lora_target t) { return t <= QLM_LORA_DOWN || t >= QLM_LORA_QKV; }
/* 1: only a fused base has it, 0: only a base with separate projections, -1: both. */
static int needs_fused(qlm_lora_target t) {
    return t >= QLM_LORA_QKV ? 1 : t == QLM_LORA_O || t == QLM_LORA_DOWN ? -1 : 0;
}

static const char *const k_t5_name[QLM_LORA_N_TARGETS] = {
    [QLM_LORA_Q] = "q", [QLM_LORA_K] = "k", [QLM_LORA_V] = "v", [QLM_LORA_O] = "o",
    [QLM_LORA_CROSS_Q] = "EncDecAttention.q", [QLM_LORA_CROSS_K] = "EncDecAttention.k",
    [QLM_LORA_CROSS_V] = "EncDecAttention.v", [QLM_LORA_CROSS_O] = "EncDecAttention.o",
    [QLM_LORA_WI0] = "wi_0", [QLM_LORA_WI1] = "wi_1", [QLM_LORA_WO] = "wo",
};

static int is_cross(qlm_lora_target t) { return t >= QLM_LORA_CROSS_Q && t <= QLM_LORA_CROSS_O; }
static int is_ffn_t5(qlm_lora_target t) { return t >= QLM_LORA_WI0 && t <= QLM_LORA_WO; }

void lora_base_llama(lora_base *b, const qlm_llama_config *c) {
    memset(b, 0, sizeof *b);
    b->known = 1;
    b->t5_gated = -1;
    b->fused = c->fused_proj != 0;
    b->n_layers[0] = c->n_layers;
    int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    const int shape[][2] = {[QLM_LORA_Q] = {c->dim, q},           [QLM_LORA_K] = {c->dim, kv},
                            [QLM_LORA_V] = {c->dim, kv},          [QLM_LORA_O] = {q, c->dim},
                            [QLM_LORA_GATE] = {c->dim, c->hidden_dim}, [QLM_LORA_UP] = {c->dim, c->hidden_dim},
                            [QLM_LORA_DOWN] = {c->hidden_dim, c->dim}, [QLM_LORA_QKV] = {c->dim, q + 2 * kv},
                            [QLM_LORA_GATE_UP] = {c->dim, 2 * c->hidden_dim}};
    for (int t = 0; t < QLM_LORA_N_TARGETS; t++)
        if (is_llama_target((qlm_lora_target)t)) b->in[t] = shape[t][0], b->out[t] = shape[t][1];
}

void lora_base_t5(lora_base *b, const qlm_t5_config *c) {
    memset(b, 0, sizeof *b);
    b->is_t5 = 1;
    b->known = 1;
    b->t5_gated = c->gated != 0;
    b->fused = 0;
    b->n_layers[0] = c->n_layers;
    b->n_layers[1] = c->n_dec_layers;
    int inner = c->n_heads * c->d_kv;
    for (int t = 0; t <= QLM_LORA_WO; t++) {
        int o = t == QLM_LORA_O || t == QLM_LORA_CROSS_O, ff_in = t == QLM_LORA_WI0 || t == QLM_LORA_WI1;
        b->in[t] = o ? inner : t == QLM_LORA_WO ? c->d_ff : c->d_model;
        b->out[t] = o || t == QLM_LORA_WO ? c->d_model : ff_in ? c->d_ff : inner;
    }
}

int lora_base_has(const lora_base *b, int stack, qlm_lora_target t) {
    if (b->is_t5 != 1) {
        int f = needs_fused(t);
        return b->is_t5 == 0 && stack == 0 && is_llama_target(t) && (b->fused < 0 || f < 0 || f == b->fused);
    }
    if (stack < 0 || stack > 1 || (t >= QLM_LORA_GATE && t <= QLM_LORA_DOWN) || t >= QLM_LORA_QKV) return 0;
    if (is_cross(t)) return stack == 1;
    return t != QLM_LORA_WI1 || b->t5_gated == 1;
}

/* The module path with an explicit T5 gating (the ungated model calls wi_0 "wi"). */
static void module_path(int is_t5, int gated, int stack, int layer, qlm_lora_target t, char *buf, size_t cap) {
    if (!is_t5) {
        snprintf(buf, cap, "model.layers.%d.%s", layer, k_llama_suffix[t]);
        return;
    }
    const char *stack_name = stack ? "decoder" : "encoder";
    if (is_ffn_t5(t))
        snprintf(buf, cap, "%s.block.%d.layer.%d.DenseReluDense.%s", stack_name, layer, stack ? 2 : 1,
                 t == QLM_LORA_WI0 && !gated ? "wi" : k_t5_name[t]);
    else
        snprintf(buf, cap, "%s.block.%d.layer.%d.%s%s", stack_name, layer, is_cross(t), is_cross(t) ? "" : "SelfAttention.",
                 k_t5_name[t]);
}

void lora_module_path(const lora_base *b, int stack, int layer, qlm_lora_target t, char *buf, size_t cap) {
    module_path(b->is_t5 == 1, b->t5_gated != 0, stack, layer, t, buf, cap);
}

const char *qlm_lora_target_name(const qlm_lora_adapter *a, qlm_lora_target t) {
    if (t < 0 || t >= QLM_LORA_N_TARGETS) return "?";
    if (!a->is_t5) return is_llama_target(t) ? strchr(k_llama_suffix[t], '.') + 1 : "?";
    return t == QLM_LORA_WI0 && a->t5_gated == 0 ? "wi" : k_t5_name[t] ? k_t5_name[t] : "?";
}

const char *qlm_lora_arch_name(const qlm_lora_adapter *a) { return a->is_t5 ? "t5" : "llama"; }

/* A layer number as peft writes it (no sign, no leading zero); -1 if there is none. */
static int parse_index(const char **s) {
    const char *p = *s;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return -1;
    long v = 0;
    while (*p >= '0' && *p <= '9' && v < 1000000) v = v * 10 + (*p++ - '0');
    *s = p;
    return v < 1000000 ? (int)v : -1;
}

/* The (stack, layer, target) of a module path; an unknown base takes the architecture and T5
 * gating of the first path it sees. 0, or -1 for a path this base lacks (*layer_out_of_range
 * set when only the layer number is beyond the base). */
static int parse_module(lora_base *b, const char *path, int *stack, int *layer, qlm_lora_target *target,
                        int *layer_out_of_range) {
    static const char *const prefixes[] = {"model.layers.", "encoder.block.", "decoder.block."};
    *layer_out_of_range = 0;
    for (int p = 0; p < 3; p++) {
        int t5 = p > 0;
        size_t n = strlen(prefixes[p]);
        if ((b->is_t5 >= 0 && b->is_t5 != t5) || strncmp(path, prefixes[p], n) != 0) continue;
        const char *rest = path + n;
        int l = parse_index(&rest);
        if (l < 0 || *rest != '.') return -1;
        int st = p == 2;
        for (int t = 0; t < QLM_LORA_N_TARGETS; t++)
            for (int gated = 0; gated < 2; gated++) {
                if ((b->t5_gated >= 0 && gated != b->t5_gated) || (!t5 && gated)) continue;
                lora_base probe = *b;
                probe.is_t5 = t5;
                probe.t5_gated = t5 ? gated : -1;
                if (!lora_base_has(&probe, st, (qlm_lora_target)t)) continue;
                char want[64];
                module_path(t5, gated, st, l, (qlm_lora_target)t, want, sizeof want);
                if (strcmp(want, path) != 0) continue;
                if (l >= (b->known ? b->n_layers[st] : MAX_INFERRED_LAYERS)) {
                    *layer_out_of_range = 1;
                    return -1;
                }
                /* Only the feed-forward's input projections are spelled differently when gated. */
                if (t5 && b->t5_gated < 0 && (t == QLM_LORA_WI0 || t == QLM_LORA_WI1)) b->t5_gated = gated;
                if (!t5 && b->fused < 0 && needs_fused((qlm_lora_target)t) >= 0) b->fused = needs_fused((qlm_lora_target)t);
                b->is_t5 = t5;
                if (!b->known && l >= b->n_layers[st]) b->n_layers[st] = l + 1;
                *stack = st;
                *layer = l;
                *target = (qlm_lora_target)t;
                return 0;
            }
        return -1;
    }
    return -1;
}

/* ---- loading ---- */

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* One tensor of the file, classified. */
typedef struct {
    const qlm_tensor_entry *e;
    int stack, layer, is_b;
    qlm_lora_target target;
} lora_tensor;

/* Reads and classifies every tensor name; errors name the file and the tensor. */
static int classify(const qlm_tensor_store *store, lora_base *b, const char *file, lora_tensor *out) {
    static const char *const suffix[2] = {".lora_A.weight", ".lora_B.weight"};
    int n = qlm_store_count(store);
    for (int i = 0; i < n; i++) {
        const qlm_tensor_entry *e = qlm_store_at(store, i);
        size_t len = strlen(e->name), pre = strlen(KEY_PREFIX);
        int is_b = -1;
        for (int k = 0; k < 2; k++) {
            size_t sl = strlen(suffix[k]);
            if (len > pre + sl && strcmp(e->name + len - sl, suffix[k]) == 0) is_b = k;
        }
        if (is_b < 0 || strncmp(e->name, KEY_PREFIX, pre) != 0)
            return qlm_errorf("%s: tensor %s is not a LoRA weight (expected " KEY_PREFIX "<module>.lora_A.weight or "
                              ".lora_B.weight)", file, e->name);
        char path[128];
        size_t plen = len - pre - strlen(suffix[is_b]);
        if (plen >= sizeof path) return qlm_errorf("%s: tensor %s: module path too long", file, e->name);
        memcpy(path, e->name + pre, plen);
        path[plen] = 0;
        int out_of_range;
        lora_tensor *t = &out[i];
        if (parse_module(b, path, &t->stack, &t->layer, &t->target, &out_of_range) != 0) {
            if (out_of_range && b->known)
                return qlm_errorf("%s: tensor %s: the base model has only %d layers in that stack", file, e->name,
                                  b->n_layers[strncmp(path, "decoder.", 8) == 0]);
            if (out_of_range)
                return qlm_errorf("%s: tensor %s: layer numbers must be below %d", file, e->name, MAX_INFERRED_LAYERS);
            int t5_path = strncmp(path, "encoder.block.", 14) == 0 || strncmp(path, "decoder.block.", 14) == 0;
            int llama_path = strncmp(path, "model.layers.", 13) == 0;
            if ((t5_path && b->is_t5 == 0) || (llama_path && b->is_t5 == 1))
                return qlm_errorf("%s: tensor %s adapts a %s model, but %s", file, e->name, t5_path ? "T5" : "Llama-family",
                                  b->known ? (b->is_t5 ? "the base model is a T5" : "the base model is Llama-family")
                                           : "the adapter's earlier tensors adapt the other architecture");
            if (llama_path && b->fused >= 0 &&
                (strstr(path, b->fused ? "self_attn.q_proj" : ".qkv_proj") ||
                 strstr(path, b->fused ? "mlp.gate_proj" : ".gate_up_proj")))
                return qlm_errorf("%s: tensor %s: %s, so its adapters name %s", file, e->name,
                                  b->fused ? "the base model fuses its projections (Phi-3)"
                                           : b->known ? "the base model has separate projections"
                                                      : "the adapter's earlier tensors adapt separate projections",
                                  b->fused ? "qkv_proj and gate_up_proj" : "q/k/v_proj and gate/up_proj");
            return qlm_errorf("%s: tensor %s: %s is not a projection qlm adapts in %s model", file, e->name, path,
                              b->is_t5 == 1 ? "this T5" : b->is_t5 == 0 ? "this Llama-family" : "a Llama-family or T5");
        }
        t->e = e;
        t->is_b = is_b;
        if (e->dtype == QLM_I8) return qlm_errorf("%s: tensor %s: INT8 LoRA weights are not supported", file, e->name);
        if (e->ndim != 2 || e->shape[0] < 1 || e->shape[1] < 1 || e->shape[0] > INT32_MAX || e->shape[1] > INT32_MAX)
            return qlm_errorf("%s: tensor %s must be a non-empty matrix", file, e->name);
    }
    return 0;
}

static int module_slot(const lora_base *b, int stack, int layer, qlm_lora_target t) {
    return ((stack ? b->n_layers[0] : 0) + layer) * QLM_LORA_N_TARGETS + (int)t;
}

/* Converts a tensor to F32 in tmp, checks every value is finite, and stores it as dt at dst. */
static int fill(void *dst, qlm_dtype dt, const qlm_tensor_entry *e, float *tmp, const char *file) {
    int64_t n = qlm_entry_numel(e);
    qlm_convert_to_f32(tmp, e->data, e->dtype, n);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(tmp[i]))
            return qlm_errorf("%s: tensor %s: element %lld is %s", file, e->name, (long long)i,
                              isnan(tmp[i]) ? "NaN" : "infinite");
    qlm_convert_from_f32(dst, dt, tmp, n);
    return 0;
}

/* The modules the models apply: each stored one, or for a fused one (with a known base) one per
 * part, sharing its A, with its run of B's rows; their A and B are views of the stored ones.
 * Indexed by (stack, layer, target). */
static int split_parts(qlm_lora_adapter *a, const lora_base *b) {
    int n = 0;
    for (int i = 0; i < a->n_stored; i++) {
        qlm_lora_target parts[3];
        int k = b->known ? fused_parts(a->stored[i].target, parts) : 0;
        n += k ? k : 1;
    }
    a->modules = calloc((size_t)(n ? n : 1), sizeof *a->modules);
    a->views = calloc((size_t)(n ? 2 * n : 1), sizeof *a->views);
    if (!a->modules || !a->views) return qlm_errorf("out of memory");
    for (int i = 0; i < a->n_stored; i++) {
        qlm_lora_module *st = &a->stored[i];
        qlm_lora_target parts[3];
        int k = b->known ? fused_parts(st->target, parts) : 0, row = 0;
        for (int p = 0; p < (k ? k : 1); p++) {
            qlm_lora_module *mod = &a->modules[a->n_modules];
            *mod = *st;
            if (k) mod->target = parts[p], mod->b.rows = b->out[parts[p]];
            a->views[2 * a->n_modules] = (qlm_weight_view){&mod->a, &st->a, 0};
            a->views[2 * a->n_modules + 1] = (qlm_weight_view){&mod->b, &st->b, row};
            row += mod->b.rows;
            mod->ref = (qlm_lora_ref){&mod->a, &mod->b, mod->scale};
            a->index[module_slot(b, mod->stack, mod->layer, mod->target)] = mod;
            a->n_modules++;
        }
    }
    a->n_views = 2 * a->n_modules;
    for (int i = 0; i < a->n_views; i++) qlm_weight_view_refresh(&a->views[i]);
    return 0;
}

/* Pairs the tensors into stored modules in (stack, layer, target) order, checks them against the
 * config and the base, fills a, and splits fused ones into the modules the models apply. */
static int build(qlm_lora_adapter *a, lora_base *b, lora_tensor *tensors, int n_tensors, lora_matcher *m,
                 const char *file, qlm_dtype dt) {
    int n_slots = (b->n_layers[0] + b->n_layers[1]) * QLM_LORA_N_TARGETS;
    const lora_tensor **slot = calloc((size_t)(n_slots ? n_slots : 1) * 2, sizeof *slot);
    a->index = calloc((size_t)(n_slots ? n_slots : 1), sizeof *a->index);
    a->stored = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *a->stored);
    if (!slot || !a->index || !a->stored) {
        free(slot);
        return qlm_errorf("out of memory");
    }
    for (int i = 0; i < n_tensors; i++)
        slot[2 * module_slot(b, tensors[i].stack, tensors[i].layer, tensors[i].target) + tensors[i].is_b] = &tensors[i];
    int rc = 0;
    size_t bytes = 0, max_numel = 0;
    for (int s = 0; s < n_slots && rc == 0; s++) {
        int stack = s >= b->n_layers[0] * QLM_LORA_N_TARGETS;
        int layer = s / QLM_LORA_N_TARGETS - (stack ? b->n_layers[0] : 0);
        qlm_lora_target t = (qlm_lora_target)(s % QLM_LORA_N_TARGETS);
        if (!lora_base_has(b, stack, t)) continue;
        const lora_tensor *ta = slot[2 * s], *tb = slot[2 * s + 1];
        char path[64];
        lora_module_path(b, stack, layer, t, path, sizeof path);
        int wanted = lora_matcher_targets(m, path);
        if (!ta && !tb) {
            /* Without a base, modules past the last one seen may simply not exist. */
            if (wanted && b->known)
                rc = qlm_errorf("%s: adapter_config.json targets %s but the file has no lora_A/lora_B for it", file, path);
            continue;
        }
        const qlm_tensor_entry *ea = ta ? ta->e : NULL, *eb = tb ? tb->e : NULL;
        if (!wanted) {
            rc = qlm_errorf("%s: tensor %s: module %s is not targeted by adapter_config.json (target_modules, "
                            "exclude_modules, layers_to_transform)", file, (ea ? ea : eb)->name, path);
            break;
        }
        if (!ea || !eb) {
            rc = qlm_errorf("%s: tensor %s has no matching %s", file, (ea ? ea : eb)->name, ea ? "lora_B" : "lora_A");
            break;
        }
        int r;
        double alpha;
        lora_matcher_rank_alpha(m, path, &r, &alpha);
        int64_t in = ea->shape[1], out = eb->shape[0];
        if (ea->shape[0] != r || eb->shape[1] != r) {
            rc = qlm_errorf("%s: tensors %s [%lld,%lld] and %s [%lld,%lld] do not have the rank %d that "
                            "adapter_config.json gives %s", file, ea->name, (long long)ea->shape[0],
                            (long long)ea->shape[1], eb->name, (long long)eb->shape[0], (long long)eb->shape[1], r, path);
            break;
        }
        if (b->known && (in != b->in[t] || out != b->out[t])) {
            const qlm_tensor_entry *bad = in != b->in[t] ? ea : eb;
            rc = qlm_errorf("%s: tensor %s has shape [%lld,%lld], expected [%lld,%lld]: %s of the base model is "
                            "[out %d, in %d]", file, bad->name, (long long)bad->shape[0], (long long)bad->shape[1],
                            (long long)(bad == ea ? r : b->out[t]), (long long)(bad == ea ? b->in[t] : r), path,
                            b->out[t], b->in[t]);
            break;
        }
        qlm_lora_module *mod = &a->stored[a->n_stored++];
        *mod = (qlm_lora_module){.stack = stack, .layer = layer, .target = t, .r = r,
                                 .scale = (float)(alpha / (a->cfg.use_rslora ? sqrt((double)r) : (double)r)),
                                 .a = {.dtype = dt, .rows = r, .cols = (int)in, .scale = 1.0f},
                                 .b = {.dtype = dt, .rows = (int)out, .cols = r, .scale = 1.0f}};
        snprintf(mod->path, sizeof mod->path, "%s", path);
        bytes += align64((size_t)(r * in) * qlm_dtype_size(dt)) + align64((size_t)(r * out) * qlm_dtype_size(dt));
        if ((size_t)(r * in) > max_numel) max_numel = (size_t)(r * in);
        if ((size_t)(r * out) > max_numel) max_numel = (size_t)(r * out);
        a->n_params += r * (in + out);
        a->file_bytes += ea->nbytes + eb->nbytes;
        if (a->n_stored == 1) a->file_dtype = ea->dtype;
        if (ea->dtype != a->file_dtype || eb->dtype != a->file_dtype) a->file_dtype = QLM_F32;
    }
    if (rc == 0 && a->n_stored == 0) rc = qlm_errorf("%s: the adapter has no LoRA tensors", file);
    float *tmp = NULL;
    if (rc == 0) {
        a->buffer = aligned_alloc(64, bytes ? bytes : 64);
        tmp = malloc(max_numel * sizeof *tmp);
        if (!a->buffer || !tmp) rc = qlm_errorf("out of memory for the adapter's %zu bytes", bytes);
        else a->buffer_bytes = bytes;
    }
    char *cur = a->buffer;
    for (int i = 0; i < a->n_stored && rc == 0; i++) {
        qlm_lora_module *mod = &a->stored[i];
        int s = module_slot(b, mod->stack, mod->layer, mod->target);
        mod->a.data = cur;
        rc = fill(cur, dt, slot[2 * s]->e, tmp, file);
        cur += align64((size_t)mod->a.rows * mod->a.cols * qlm_dtype_size(dt));
        mod->b.data = cur;
        if (rc == 0) rc = fill(cur, dt, slot[2 * s + 1]->e, tmp, file);
        cur += align64((size_t)mod->b.rows * mod->b.cols * qlm_dtype_size(dt));
        mod->ref = (qlm_lora_ref){&mod->a, &mod->b, mod->scale};
    }
    free(tmp);
    free(slot);
    return rc == 0 ? split_parts(a, b) : rc;
}

static int valid_name(const char *s) {
    if (!s[0] || strlen(s) >= sizeof ((qlm_lora_adapter *)0)->name || strcmp(s, "none") == 0) return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
              *p == '-' || *p == '.'))
            return 0;
    return 1;
}

/* The last component of a folder path, trailing slashes ignored. */
static void folder_name(const char *path, char *buf, size_t cap) {
    size_t end = strlen(path);
    while (end > 1 && path[end - 1] == '/') end--;
    size_t start = end;
    while (start > 0 && path[start - 1] != '/') start--;
    snprintf(buf, cap, "%.*s", (int)(end - start), path + start);
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static void base_of(lora_base *b, const qlm_llama_config *llama, const qlm_t5_config *t5) {
    if (llama) lora_base_llama(b, llama);
    else if (t5) lora_base_t5(b, t5);
    else *b = (lora_base){.is_t5 = -1, .t5_gated = -1, .fused = -1};
}

/* The adapter from its parsed configuration (a->cfg) and its tensors, checked against b. */
static int assemble(qlm_lora_adapter *a, lora_base *b, const qlm_tensor_store *store, const char *cfg_file,
                    const char *file, qlm_dtype dt) {
    int n = qlm_store_count(store), rc;
    lora_tensor *tensors = calloc((size_t)(n ? n : 1), sizeof *tensors);
    lora_matcher *m = NULL;
    rc = tensors ? classify(store, b, file, tensors) : qlm_errorf("out of memory");
    if (rc == 0 && b->is_t5 < 0) rc = qlm_errorf("%s: the adapter has no LoRA tensors", file);
    if (rc == 0 && !(m = lora_matcher_new(&a->cfg, b->is_t5, b->fused == 1, cfg_file))) rc = -1;
    if (rc == 0) {
        a->is_t5 = b->is_t5;
        a->t5_gated = b->is_t5 ? b->t5_gated : 0;
        a->has_base = b->known;
        a->dtype = dt;
        a->n_layers[0] = b->n_layers[0];
        a->n_layers[1] = b->n_layers[1];
        rc = build(a, b, tensors, n, m, file, dt);
    }
    lora_matcher_free(m);
    free(tensors);
    return rc;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* A as peft initializes it (kaiming-uniform with a = sqrt(5): uniform in +-1/sqrt(in)), B zero. */
static int add_init_pair(qlm_tensor_store *store, const char *path, int r, int in, int out, uint64_t seed) {
    char name[256];
    int64_t shape_a[2] = {r, in}, shape_b[2] = {out, r};
    void *da, *db;
    snprintf(name, sizeof name, "base_model.model.%s.lora_A.weight", path);
    if (!qlm_store_add_owned(store, name, QLM_F32, 2, shape_a, &da)) return -1;
    snprintf(name, sizeof name, "base_model.model.%s.lora_B.weight", path);
    if (!qlm_store_add_owned(store, name, QLM_F32, 2, shape_b, &db)) return -1;
    float *a = da, bound = 1.0f / sqrtf((float)in);
    for (int64_t i = 0; i < (int64_t)r * in; i++)
        a[i] = bound * (float)((double)(splitmix64(seed + (uint64_t)i) >> 40) / 8388608.0 - 1.0);
    memset(db, 0, (size_t)out * r * sizeof(float));
    return 0;
}

int qlm_lora_init(qlm_lora_adapter *out, const char *name, const qlm_llama_config *llama, const qlm_t5_config *t5,
                  const char *config_json, uint64_t seed, qlm_dtype dt) {
    memset(out, 0, sizeof *out);
    int rc = -1;
    if (!llama == !t5) return qlm_errorf("a new adapter needs its base model's configuration");
    if (dt != QLM_F32 && dt != QLM_BF16) return qlm_errorf("LoRA weights are held as f32 or bf16, not %s", qlm_dtype_name(dt));
    if (!valid_name(name))
        return qlm_errorf("adapter name \"%s\": use 1-63 letters, digits, '_', '-' or '.' (\"none\" is reserved)", name);
    snprintf(out->name, sizeof out->name, "%s", name);
    if (lora_config_parse(&out->cfg, config_json, "new adapter config") != 0) return -1;
    lora_base b;
    base_of(&b, llama, t5);
    qlm_tensor_store *store = qlm_store_new();
    lora_matcher *m = store ? lora_matcher_new(&out->cfg, b.is_t5, b.fused == 1, "new adapter config") : NULL;
    rc = m ? 0 : -1;
    char path[128];
    for (int s = 0; s < QLM_LORA_MAX_STACKS && rc == 0; s++)
        for (int l = 0; l < b.n_layers[s] && rc == 0; l++)
            for (int t = 0; t < QLM_LORA_N_TARGETS && rc == 0; t++) {
                if (!lora_base_has(&b, s, (qlm_lora_target)t)) continue;
                lora_module_path(&b, s, l, (qlm_lora_target)t, path, sizeof path);
                if (!lora_matcher_targets(m, path)) continue;
                int r;
                double alpha;
                lora_matcher_rank_alpha(m, path, &r, &alpha);
                if (r <= 0) rc = qlm_errorf("new adapter config: rank %d for %s", r, path);
                else rc = add_init_pair(store, path, r, b.in[t], b.out[t], splitmix64(seed ^ (uint64_t)((s * 4096 + l) * 64 + t)));
            }
    lora_matcher_free(m);
    if (rc == 0 && qlm_store_count(store) == 0) rc = qlm_errorf("new adapter config: target_modules matches no projection");
    if (rc == 0) rc = assemble(out, &b, store, "new adapter config", "new adapter", dt);
    qlm_store_free(store);
    if (rc != 0) qlm_lora_free(out);
    return rc;
}

static int load(qlm_lora_adapter *a, const char *path, const char *name, const qlm_llama_config *llama,
                const qlm_t5_config *t5, qlm_dtype dt) {
    if (dt != QLM_F32 && dt != QLM_BF16) return qlm_errorf("LoRA weights are held as f32 or bf16, not %s", qlm_dtype_name(dt));
    if (llama && t5) return qlm_errorf("an adapter has one base model (Llama or T5), not both");
    char buf[64];
    if (!name) {
        folder_name(path, buf, sizeof buf);
        name = valid_name(buf) ? buf : "adapter";
    }
    if (!valid_name(name))
        return qlm_errorf("adapter name \"%s\": use 1-63 letters, digits, '_', '-' or '.' (\"none\" is reserved)", name);
    snprintf(a->name, sizeof a->name, "%s", name);
    if (strlen(path) >= sizeof a->path - sizeof "/" WEIGHTS_FILE) return qlm_errorf("%s: path too long", path);
    snprintf(a->path, sizeof a->path, "%s", path);
    struct stat st;
    if (stat(path, &st) != 0) return qlm_errorf("%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return qlm_errorf("%s: not a folder (a PEFT adapter is a folder with " CONFIG_FILE " and " WEIGHTS_FILE ")", path);

    char file[4200];
    snprintf(file, sizeof file, "%s/" CONFIG_FILE, path);
    if (!file_exists(file)) return qlm_errorf("%s: no " CONFIG_FILE " (not a PEFT adapter folder)", path);
    size_t size;
    char *text = qlm_read_file(file, MAX_CONFIG_BYTES, &size);
    if (!text) return -1;
    int rc = lora_config_parse(&a->cfg, text, file);
    free(text);
    if (rc != 0) return -1;

    snprintf(file, sizeof file, "%s/" WEIGHTS_FILE, path);
    if (!file_exists(file)) {
        snprintf(file, sizeof file, "%s/adapter_model.bin", path);
        if (file_exists(file))
            return qlm_errorf("%s: PyTorch pickle adapters are unsupported, use safetensors (peft's save_pretrained "
                              "writes " WEIGHTS_FILE " by default)", file);
        return qlm_errorf("%s: no " WEIGHTS_FILE, path);
    }
    lora_base b;
    base_of(&b, llama, t5);
    qlm_tensor_store *store = qlm_store_new();
    if (!store) return -1;
    rc = qlm_safetensors_load(file, store);
    char cfg_file[4200];
    snprintf(cfg_file, sizeof cfg_file, "%s/" CONFIG_FILE, path);
    if (rc == 0) rc = assemble(a, &b, store, cfg_file, file, dt);
    qlm_store_free(store);
    return rc;
}

int qlm_lora_load(qlm_lora_adapter *out, const char *path, const char *name, const qlm_llama_config *llama,
                  const qlm_t5_config *t5, qlm_dtype ab_dtype) {
    memset(out, 0, sizeof *out);
    if (load(out, path, name, llama, t5, ab_dtype) == 0) return 0;
    qlm_lora_free(out);
    return -1;
}

int qlm_lora_place(qlm_lora_adapter *a, const qlm_backend *be) {
    if (a->be) return a->be == be ? 0 : qlm_errorf("adapter %s is already in %s memory", a->name, a->be->name);
    char *dev = be->upload(a->buffer, a->buffer_bytes ? a->buffer_bytes : 64);
    if (!dev) return -1;
    if (dev != a->buffer) {
        for (int i = 0; i < a->n_stored; i++) {
            qlm_lora_module *m = &a->stored[i];
            m->a.data = dev + ((const char *)m->a.data - (const char *)a->buffer);
            m->b.data = dev + ((const char *)m->b.data - (const char *)a->buffer);
        }
        for (int i = 0; i < a->n_views; i++) qlm_weight_view_refresh(&a->views[i]);
        free(a->buffer);
        a->buffer = dev;
    }
    a->be = be;
    return 0;
}

int qlm_lora_units(qlm_lora_adapter *a, qlm_param **params, int *n_params, qlm_unit **units) {
    int n = 2 * a->n_stored;
    qlm_param *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    qlm_unit *u = units ? malloc(sizeof *u) : NULL;
    if (!p || (units && !u)) {
        free(p);
        free(u);
        return qlm_errorf("out of memory");
    }
    for (int i = 0; i < a->n_stored; i++)
        for (int k = 0; k < 2; k++) {
            qlm_weight *w = k ? &a->stored[i].b : &a->stored[i].a;
            qlm_param *e = &p[2 * i + k];
            *e = (qlm_param){.rows = w->rows, .cols = w->cols, .matrix = w};
            snprintf(e->name, sizeof e->name, "base_model.model.%s.lora_%c.weight", a->stored[i].path, k ? 'B' : 'A');
        }
    if (u)
        *u = (qlm_unit){.buffer = &a->buffer, .bytes = &a->buffer_bytes, .first = 0, .count = n, .views = a->views,
                        .n_views = a->n_views};
    *params = p;
    *n_params = n;
    if (units) *units = u;
    return 1;
}

void qlm_lora_free(qlm_lora_adapter *a) {
    lora_config_free(&a->cfg);
    free(a->stored);
    free(a->modules);
    free(a->views);
    free(a->index);
    if (a->be)
        a->be->free(a->buffer);
    else
        free(a->buffer);
    memset(a, 0, sizeof *a);
}

/* ---- saving ---- */

static int save_weights(const qlm_lora_adapter *a, const char *file) {
    qlm_tensor_store *store = qlm_store_new();
    if (!store) return -1;
    /* An adapter in device memory is written from a host copy of its buffer. */
    const char *host = a->buffer;
    char *staged = NULL;
    if (a->be && !a->be->host_memory) {
        if (!(staged = malloc(a->buffer_bytes ? a->buffer_bytes : 1))) {
            qlm_store_free(store);
            return qlm_errorf("out of memory");
        }
        a->be->to_host(staged, a->buffer, a->buffer_bytes);
        host = staged;
    }
    int rc = 0;
    for (int i = 0; i < a->n_stored && rc == 0; i++)
        for (int k = 0; k < 2 && rc == 0; k++) {
            const qlm_lora_module *m = &a->stored[i];
            const qlm_weight *w = k ? &m->b : &m->a;
            char name[160];
            snprintf(name, sizeof name, KEY_PREFIX "%s.lora_%c.weight", m->path, k ? 'B' : 'A');
            int64_t shape[2] = {w->rows, w->cols};
            const void *data = host + ((const char *)w->data - (const char *)a->buffer);
            if (!qlm_store_add(store, name, w->dtype, 2, shape, data, (size_t)w->rows * w->cols * qlm_dtype_size(w->dtype)))
                rc = -1;
        }
    const char *meta[] = {"format", "pt", NULL};
    if (rc == 0) rc = qlm_safetensors_save(file, store, meta);
    qlm_store_free(store);
    free(staged);
    return rc;
}

static int save_config(const qlm_lora_adapter *a, const char *file) {
    char *text = qlm_lora_config_json(&a->cfg);
    if (!text) return -1;
    int rc = qlm_atomic_write_text(file, text);
    free(text);
    return rc;
}

int qlm_lora_save(const qlm_lora_adapter *a, const char *dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return qlm_errorf("%s: %s", dir, strerror(errno));
    char file[4200];
    /* Weights first: a folder whose config is old or missing is not mistaken for the new adapter. */
    snprintf(file, sizeof file, "%s/" WEIGHTS_FILE, dir);
    if (save_weights(a, file) != 0) return -1;
    snprintf(file, sizeof file, "%s/" CONFIG_FILE, dir);
    return save_config(a, file);
}
