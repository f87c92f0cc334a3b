/* A LoRA adapter as the models apply it: per adapted projection (stack, layer, target) its A and B
 * matrices and scale, found in O(1). The data only: reading, writing and merging PEFT adapters is
 * lora/'s, which fills these; models/ reads them and never includes lora/. */
#ifndef QLM_ADAPTER_H
#define QLM_ADAPTER_H

#include <stddef.h>
#include <stdint.h>

#include "../core/backend.h"
#include "../core/weight.h"

/* The projections an adapter can change. Llama: q_proj..down_proj; a base whose checkpoint fuses
 * them (Phi-3) has qkv_proj and gate_up_proj (QKV, GATE_UP) instead of q/k/v and gate/up. T5:
 * self-attention q/k/v/o are Q/K/V/O, the decoder's EncDecAttention q/k/v/o are CROSS_*,
 * DenseReluDense wi_0 (or the ungated "wi"), wi_1, wo are WI0, WI1, WO. */
typedef enum {
    QLM_LORA_Q, QLM_LORA_K, QLM_LORA_V, QLM_LORA_O,
    QLM_LORA_GATE, QLM_LORA_UP, QLM_LORA_DOWN,
    QLM_LORA_CROSS_Q, QLM_LORA_CROSS_K, QLM_LORA_CROSS_V, QLM_LORA_CROSS_O,
    QLM_LORA_WI0, QLM_LORA_WI1, QLM_LORA_WO,
    QLM_LORA_QKV, QLM_LORA_GATE_UP,
    QLM_LORA_N_TARGETS
} qlm_lora_target;

/* Stacks: Llama's layers and T5's encoder are 0, T5's decoder is 1. */
enum { QLM_LORA_MAX_STACKS = 2 };

typedef struct qlm_lora_module_s {
    int stack, layer;
    qlm_lora_target target;
    char path[64];   /* module path under the model, e.g. "model.layers.3.self_attn.q_proj" */
    int r;
    float scale;     /* alpha / r or alpha / sqrt(r), with this module's rank_pattern / alpha_pattern */
    qlm_weight a;    /* [r][in] */
    qlm_weight b;    /* [out][r] */
    qlm_lora_ref ref; /* a, b and scale as the backend's lora op takes them */
} qlm_lora_module;

/* target_modules / exclude_modules / layers_pattern as adapter_config.json gives them: a string
 * (a regex that must match the whole module path, as re.fullmatch; "all-linear" for targets), or a
 * list of names, each a module path or its last dot-separated components ("q_proj"). */
typedef struct {
    char *regex;
    char **names;
    int n_names;
    int is_list;     /* a list was given (possibly empty); else regex or nothing */
} qlm_lora_selector;

typedef struct {
    char *key;       /* a regex for the end of the module path: (.*\.)?(KEY)$ as peft matches it */
    double value;
} qlm_lora_pattern;

/* The supported part of adapter_config.json. */
typedef struct {
    int r;
    double lora_alpha;
    int use_rslora;
    double lora_dropout;     /* training only: dropout on each adapted module's input */
    int fan_in_fan_out;      /* kept as read: peft ignores it for nn.Linear, and so does qlm */
    qlm_lora_selector target_modules; /* none given: peft's default for the architecture (q, v) */
    qlm_lora_selector exclude_modules;
    qlm_lora_selector layers_pattern;
    int *layers_to_transform;         /* layer indices, or NULL for all */
    int n_layers_to_transform;
    int layers_to_transform_is_int;   /* written back as a number rather than a list */
    qlm_lora_pattern *rank_pattern, *alpha_pattern;
    int n_rank_pattern, n_alpha_pattern;
    char *base_model_name_or_path, *task_type; /* NULL when absent */
} qlm_lora_config;

typedef struct qlm_lora_adapter {
    char name[64];
    char path[4096];          /* the folder it was loaded from */
    qlm_lora_config cfg;
    int is_t5;
    int t5_gated;             /* T5: 1 wi_0/wi_1, 0 "wi", -1 unknown (no base, no feed-forward module) */
    int has_base;             /* shapes were checked against a base configuration */
    int n_layers[QLM_LORA_MAX_STACKS];
    qlm_dtype dtype;          /* of every A and B (F32 or BF16) */
    /* As the file stores them (PEFT's modules), in the order stack, layer, target. */
    qlm_lora_module *stored;
    int n_stored;
    /* As the models apply them: the stored ones, except that a fused one (QKV, GATE_UP) becomes a
     * module per part (Q, K, V; GATE, UP) sharing its A, each with its rows of B. Same order. */
    qlm_lora_module *modules;
    int n_modules;
    qlm_weight_view *views; /* each module's A and B as views of its stored module's (2 per module) */
    int n_views;
    const qlm_lora_module **index; /* [stack-major layers][QLM_LORA_N_TARGETS] */
    void *buffer;             /* every A and B, 64-byte aligned */
    size_t buffer_bytes;
    const qlm_backend *be;    /* whose memory buffer is in (qlm_lora_place), or NULL: malloc'd host memory */
    int64_t n_params;
    qlm_dtype file_dtype;     /* dtype of the tensors in the file (F32 if they differ) */
    size_t file_bytes;        /* bytes of A/B data in adapter_model.safetensors */
} qlm_lora_adapter;

/* The module of (stack, layer, target), or NULL when the adapter leaves that projection alone. O(1). */
const qlm_lora_module *qlm_lora_find(const qlm_lora_adapter *a, int stack, int layer, qlm_lora_target t);

#endif
