/* config.json of LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM,
 * Gemma2ForCausalLM, Gemma3ForCausalLM (text) and Phi3ForCausalLM checkpoints. Defaults follow transformers' own config
 * classes (tie_word_embeddings false except for Gemma; rope_theta 10000, Gemma 3's 1e6 and 1e4 for
 * its local layers; Mistral's and Gemma's sliding_window 4096 when absent, Phi-3's none). Both the old RoPE keys ("rope_theta", "rope_scaling") and the
 * transformers 5 form ("rope_parameters": {"rope_type", "rope_theta", ...}) are read. */
#include "hf_config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../core/backend.h"
#include "../core/error.h"
#include "../core/atomic_file.h"
#include "../core/read_file.h"

#define HF_CONFIG_MAX_BYTES (16u * 1024u * 1024u)

typedef enum { ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3, ARCH_MISTRAL, ARCH_GEMMA2, ARCH_GEMMA3, ARCH_PHI3 } hf_arch;

/* Indexed by hf_arch. */
static const struct { const char *model_type, *architecture; } ARCHES[] = {
    [ARCH_LLAMA] = {"llama", "LlamaForCausalLM"},
    [ARCH_QWEN2] = {"qwen2", "Qwen2ForCausalLM"},
    [ARCH_QWEN3] = {"qwen3", "Qwen3ForCausalLM"},
    [ARCH_MISTRAL] = {"mistral", "MistralForCausalLM"},
    [ARCH_GEMMA2] = {"gemma2", "Gemma2ForCausalLM"},
    [ARCH_GEMMA3] = {"gemma3_text", "Gemma3ForCausalLM"},
    [ARCH_PHI3] = {"phi3", "Phi3ForCausalLM"},
};
#define N_ARCHES (sizeof ARCHES / sizeof ARCHES[0])

typedef struct {
    const char *path;
    const cJSON *root;
    const char *prefix; /* "rope_scaling." while reading a nested object, for messages */
} hf_ctx;

static const cJSON *field(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNull(v) ? NULL : v;
}

/* The key is there and null (which some keys read as "none" rather than as absent). */
static int is_null(const cJSON *obj, const char *key) {
    return cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(obj, key));
}

/* Integer field of obj: *out = dflt when absent or null (an error when required). */
static int get_int(const hf_ctx *c, const cJSON *obj, const char *key, int required, int dflt, int *out) {
    const cJSON *v = field(obj, key);
    if (!v) {
        if (required) return qlm_errorf("%s: missing required field %s%s", c->path, c->prefix, key);
        *out = dflt;
        return 0;
    }
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || d != floor(d) || d < INT_MIN || d > INT_MAX)
        return qlm_errorf("%s: field %s%s must be an integer", c->path, c->prefix, key);
    *out = (int)d;
    return 0;
}

static int get_float(const hf_ctx *c, const cJSON *obj, const char *key, int required, float dflt, float *out) {
    const cJSON *v = field(obj, key);
    if (!v) {
        if (required) return qlm_errorf("%s: missing required field %s%s", c->path, c->prefix, key);
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return qlm_errorf("%s: field %s%s must be a number", c->path, c->prefix, key);
    *out = (float)v->valuedouble;
    return 0;
}

static int get_bool(const hf_ctx *c, const char *key, int dflt, int *out) {
    const cJSON *v = field(c->root, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsBool(v)) return qlm_errorf("%s: field %s must be true or false", c->path, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A string field, or NULL when absent/null; -1 if it has another type. */
static int get_str(const hf_ctx *c, const cJSON *obj, const char *key, const char **out) {
    const cJSON *v = field(obj, key);
    *out = NULL;
    if (!v) return 0;
    if (!cJSON_IsString(v)) return qlm_errorf("%s: field %s%s must be a string", c->path, c->prefix, key);
    *out = v->valuestring;
    return 0;
}

/* bos/eos may be an integer or a list of integers (the first one is used). */
static int get_token_id(const hf_ctx *c, const char *key, int *out) {
    const cJSON *v = field(c->root, key);
    *out = -1;
    if (!v) return 0;
    if (cJSON_IsArray(v)) {
        if (!v->child) return 0;
        v = v->child;
    }
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || d != floor(d) || d < 0 || d > INT_MAX)
        return qlm_errorf("%s: field %s must be a token id or a list of token ids", c->path, key);
    *out = (int)d;
    return 0;
}

static int find_arch(const hf_ctx *c, hf_arch *arch) {
    const char *mt;
    if (get_str(c, c->root, "model_type", &mt) != 0) return -1;
    const cJSON *archs = field(c->root, "architectures");
    if (archs && !cJSON_IsArray(archs)) return qlm_errorf("%s: field architectures must be a list", c->path);
    const char *an = archs && cJSON_IsString(archs->child) ? archs->child->valuestring : NULL;
    for (size_t i = 0; i < N_ARCHES; i++)
        if ((mt && strcmp(mt, ARCHES[i].model_type) == 0) || (!mt && an && strcmp(an, ARCHES[i].architecture) == 0)) {
            *arch = (hf_arch)i;
            return 0;
        }
    return qlm_errorf("%s: unsupported model (model_type %s, architecture %s; supported: llama, qwen2, qwen3, mistral, gemma2, gemma3_text, phi3)",
                      c->path, mt ? mt : "absent", an ? an : "absent");
}

/* YaRN's ramp bounds and the attention factor that scales cos and sin, as transformers derives it
 * (from mscale and mscale_all_dim when both are given, else from the factor). */
static float yarn_mscale(float scale, float mscale) {
    return scale <= 1 ? 1.0f : (float)(0.1 * mscale * log(scale) + 1.0);
}

static int read_yarn(const hf_ctx *rc, const cJSON *rope, qlm_llama_config *cfg) {
    float mscale, mscale_all_dim;
    const cJSON *truncate = field(rope, "truncate");
    if (get_float(rc, rope, "beta_fast", 0, 32, &cfg->rope_beta_fast) != 0 ||
        get_float(rc, rope, "beta_slow", 0, 1, &cfg->rope_beta_slow) != 0 ||
        get_float(rc, rope, "mscale", 0, 0, &mscale) != 0 || get_float(rc, rope, "mscale_all_dim", 0, 0, &mscale_all_dim) != 0 ||
        get_float(rc, rope, "attention_factor", 0, 0, &cfg->rope_attn_factor) != 0)
        return -1;
    if (truncate && !cJSON_IsTrue(truncate))
        return qlm_errorf("%s: %struncate false is not supported", rc->path, rc->prefix);
    if (!(cfg->rope_beta_fast > 0) || !(cfg->rope_beta_slow > 0))
        return qlm_errorf("%s: %sbeta_fast and beta_slow must be positive", rc->path, rc->prefix);
    if (cfg->rope_attn_factor < 0) return qlm_errorf("%s: %sattention_factor must be positive", rc->path, rc->prefix);
    if (cfg->rope_attn_factor == 0)
        cfg->rope_attn_factor = mscale != 0 && mscale_all_dim != 0
                                    ? yarn_mscale(cfg->rope_scale_factor, mscale) /
                                          yarn_mscale(cfg->rope_scale_factor, mscale_all_dim)
                                    : qlm_rope_default_attn_factor(cfg);
    return 0;
}

/* One RoPE parameter object (rope_scaling, rope_parameters or one of Gemma 3's per-layer-type
 * ones): its base, and its scaling type and parameters. key names it in messages. */
/* longrope's factor lists (head_dim / 2 numbers each), original context and attention factor
 * (sqrt(1 + ln(factor) / ln(original)), factor max_position_embeddings / original when not given). */
static int read_longrope(const hf_ctx *rc, const cJSON *rope, qlm_llama_config *cfg) {
    int half = cfg->head_dim / 2;
    if (half > QLM_MAX_ROPE_FACTORS) return qlm_errorf("%s: longrope with head_dim %d is not supported", rc->path, cfg->head_dim);
    const char *names[2] = {"short_factor", "long_factor"};
    float *dst[2] = {cfg->rope_short_factor, cfg->rope_long_factor};
    for (int k = 0; k < 2; k++) {
        const cJSON *list = field(rope, names[k]);
        if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) != half)
            return qlm_errorf("%s: %s%s must be a list of %d numbers", rc->path, rc->prefix, names[k], half);
        int j = 0;
        for (const cJSON *v = list->child; v; v = v->next, j++) {
            if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble))
                return qlm_errorf("%s: %s%s[%d] must be a positive number", rc->path, rc->prefix, names[k], j);
            dst[k][j] = (float)v->valuedouble;
        }
    }
    /* Phi-3 keeps the original context at the top level, and transformers prefers it there. */
    hf_ctx top = {rc->path, rc->root, ""};
    if (get_int(rc, rope, "original_max_position_embeddings", 0, cfg->max_seq_len, &cfg->rope_orig_max_pos) != 0 ||
        get_int(&top, rc->root, "original_max_position_embeddings", 0, cfg->rope_orig_max_pos, &cfg->rope_orig_max_pos) != 0)
        return -1;
    if (cfg->rope_orig_max_pos <= 0) return qlm_errorf("%s: original_max_position_embeddings must be positive", rc->path);
    double factor = (double)cfg->max_seq_len / cfg->rope_orig_max_pos;
    float f;
    if (get_float(rc, rope, "factor", 0, (float)factor, &f) != 0 ||
        get_float(rc, rope, "attention_factor", 0, 0, &cfg->rope_attn_factor) != 0)
        return -1;
    cfg->rope_scale_factor = f;
    if (cfg->rope_attn_factor == 0)
        cfg->rope_attn_factor = qlm_rope_default_attn_factor(cfg);
    return 0;
}

static int read_rope_params(const hf_ctx *c, const cJSON *rope, const char *key, int phi3, float *partial,
                            qlm_llama_config *cfg) {
    if (rope && !cJSON_IsObject(rope)) return qlm_errorf("%s: field %s must be an object", c->path, key);
    if (!rope) return 0;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s.", key);
    hf_ctx rc = {c->path, c->root, prefix};
    if (get_float(&rc, rope, "rope_theta", 0, cfg->rope_theta, &cfg->rope_theta) != 0 ||
        get_float(&rc, rope, "partial_rotary_factor", 0, *partial, partial) != 0)
        return -1;
    const char *type, *legacy_type;
    if (get_str(&rc, rope, "rope_type", &type) != 0 || get_str(&rc, rope, "type", &legacy_type) != 0) return -1;
    if (!type) type = legacy_type ? legacy_type : "default";
    /* transformers' Phi-3 config renames "su" and "yarn" to longrope */
    if (phi3 && (strcmp(type, "su") == 0 || strcmp(type, "yarn") == 0)) type = "longrope";
    static const struct { const char *name; qlm_rope_type type; } TYPES[] = {
        {"default", QLM_ROPE_DEFAULT}, {"linear", QLM_ROPE_LINEAR}, {"llama3", QLM_ROPE_LLAMA3},
        {"yarn", QLM_ROPE_YARN},       {"longrope", QLM_ROPE_LONGROPE}, {"dynamic", QLM_ROPE_DYNAMIC}};
    size_t t = 0;
    while (t < sizeof TYPES / sizeof TYPES[0] && strcmp(TYPES[t].name, type) != 0) t++;
    if (t == sizeof TYPES / sizeof TYPES[0])
        return qlm_errorf("%s: %s type \"%s\" is not supported (default, linear, llama3, yarn, longrope, dynamic)", c->path,
                          key, type);
    cfg->rope_type = TYPES[t].type;
    if (cfg->rope_type == QLM_ROPE_DEFAULT) return 0;
    if (cfg->rope_type == QLM_ROPE_LONGROPE) return read_longrope(&rc, rope, cfg);
    if (get_float(&rc, rope, "factor", 1, 0, &cfg->rope_scale_factor) != 0 ||
        get_int(&rc, rope, "original_max_position_embeddings", 0, cfg->max_seq_len, &cfg->rope_orig_max_pos) != 0)
        return -1;
    if (!(cfg->rope_scale_factor > 0) || cfg->rope_orig_max_pos <= 0)
        return qlm_errorf("%s: %sfactor and original_max_position_embeddings must be positive", c->path, prefix);
    /* transformers stretches dynamic NTK from max_position_embeddings, whatever rope_scaling says */
    if (cfg->rope_type == QLM_ROPE_DYNAMIC) cfg->rope_orig_max_pos = cfg->max_seq_len;
    if (cfg->rope_type == QLM_ROPE_LLAMA3) {
        if (get_float(&rc, rope, "low_freq_factor", 1, 0, &cfg->rope_low_freq_factor) != 0 ||
            get_float(&rc, rope, "high_freq_factor", 1, 0, &cfg->rope_high_freq_factor) != 0)
            return -1;
        if (!(cfg->rope_low_freq_factor > 0) || !(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor))
            return qlm_errorf("%s: %s: llama3 factors must be positive with high_freq_factor > low_freq_factor", c->path,
                              key);
    }
    return cfg->rope_type == QLM_ROPE_YARN ? read_yarn(&rc, rope, cfg) : 0;
}

/* Gemma 3: the global layers' RoPE (rope_theta, 1e6, with any scaling) and the local ones' base
 * (rope_local_base_freq, 1e4), either as top-level keys or nested per layer type in
 * rope_parameters. */
static int read_gemma3_rope(const hf_ctx *c, qlm_llama_config *cfg, float *partial) {
    const cJSON *params = field(c->root, "rope_parameters"), *scaling = field(c->root, "rope_scaling");
    const cJSON *full = params ? field(params, "full_attention") : NULL;
    const cJSON *local = params ? field(params, "sliding_attention") : NULL;
    if (params && !full && !local) full = params; /* one object: the global layers' */
    if (get_float(c, c->root, "rope_theta", 0, 1000000.0f, &cfg->rope_theta) != 0 ||
        get_float(c, c->root, "rope_local_base_freq", 0, 10000.0f, &cfg->rope_local_theta) != 0 ||
        read_rope_params(c, scaling ? scaling : full, scaling ? "rope_scaling" : "rope_parameters.full_attention", 0,
                         partial, cfg) != 0)
        return -1;
    if (local) {
        qlm_llama_config lc = {.rope_theta = cfg->rope_local_theta, .max_seq_len = cfg->max_seq_len};
        if (read_rope_params(c, local, "rope_parameters.sliding_attention", 0, partial, &lc) != 0) return -1;
        if (lc.rope_type != QLM_ROPE_DEFAULT)
            return qlm_errorf("%s: scaled RoPE on the sliding layers is not supported", c->path);
        cfg->rope_local_theta = lc.rope_theta;
    }
    if (cfg->rope_type == QLM_ROPE_YARN || cfg->rope_type == QLM_ROPE_LONGROPE)
        return qlm_errorf("%s: %s RoPE is not supported for Gemma 3 (its attention factor would reach the local "
                          "layers)", c->path, cfg->rope_type == QLM_ROPE_YARN ? "yarn" : "longrope");
    return 0;
}

/* rope_scaling (old) wins over rope_parameters (transformers 5), as in transformers. */
static int read_rope(const hf_ctx *c, hf_arch arch, qlm_llama_config *cfg) {
    float partial;
    if (get_float(c, c->root, "partial_rotary_factor", 0, 1.0f, &partial) != 0) return -1;
    int rc;
    if (arch == ARCH_GEMMA3) {
        rc = read_gemma3_rope(c, cfg, &partial);
    } else {
        const cJSON *rope = field(c->root, "rope_scaling");
        const char *key = rope ? "rope_scaling" : "rope_parameters";
        if (!rope) rope = field(c->root, "rope_parameters");
        rc = get_float(c, c->root, "rope_theta", 0, 10000.0f, &cfg->rope_theta) != 0 ||
                     read_rope_params(c, rope, key, arch == ARCH_PHI3, &partial, cfg) != 0
                 ? -1
                 : 0;
    }
    if (rc == 0 && partial != 1.0f) return qlm_errorf("%s: partial_rotary_factor %g is not supported", c->path, partial);
    return rc;
}

/* Which layers attend over a sliding window, as transformers decides: an explicit layer_types list;
 * else Mistral's every layer when sliding_window is set (4096 when absent; Phi-3's likewise, none
 * when absent), Qwen2/Qwen3's layers
 * from max_window_layers on with use_sliding_window, Gemma 2's every other layer from the first,
 * Gemma 3's all but every sliding_window_pattern-th (6). */
static int read_sliding_window(const hf_ctx *c, hf_arch arch, qlm_llama_config *cfg) {
    if (arch == ARCH_LLAMA) return 0;
    int use = 1, window, first = 0, period = arch == ARCH_GEMMA2 ? 2 : 0, dflt_window = arch == ARCH_PHI3 ? 0 : 4096;
    int qwen = arch == ARCH_QWEN2 || arch == ARCH_QWEN3;
    if (qwen && (get_bool(c, "use_sliding_window", 0, &use) != 0 ||
                 get_int(c, c->root, "max_window_layers", 0, 28, &first) != 0))
        return -1;
    if (arch == ARCH_GEMMA3 && get_int(c, c->root, "sliding_window_pattern", 0, 6, &period) != 0) return -1;
    if (get_int(c, c->root, "sliding_window", 0, dflt_window, &window) != 0) return -1;
    if (is_null(c->root, "sliding_window")) window = 0;
    if (!use || window == 0) return 0;
    if (window < 0 || period < 0) return qlm_errorf("%s: sliding_window and its pattern must be positive", c->path);
    int n = cfg->n_layers;
    unsigned char *sliding = malloc((size_t)n);
    if (!sliding) return qlm_errorf("out of memory");
    const cJSON *types = field(c->root, "layer_types");
    if (types && (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != n)) {
        free(sliding);
        return qlm_errorf("%s: layer_types must list one type per layer (%d)", c->path, n);
    }
    const cJSON *t = types ? types->child : NULL;
    for (int l = 0; l < n; l++, t = t ? t->next : NULL) {
        if (!types) {
            sliding[l] = period > 0 ? l % period != period - 1 : l >= first;
            continue;
        }
        int is_sliding = cJSON_IsString(t) && strcmp(t->valuestring, "sliding_attention") == 0;
        if (!is_sliding && !(cJSON_IsString(t) && strcmp(t->valuestring, "full_attention") == 0)) {
            free(sliding);
            return qlm_errorf("%s: layer_types[%d] must be \"full_attention\" or \"sliding_attention\"", c->path, l);
        }
        sliding[l] = (unsigned char)is_sliding;
    }
    int any = 0;
    for (int l = 0; l < n; l++) any |= sliding[l];
    int rc = any ? qlm_config_fit_windows(cfg, sliding, n) : 0;
    free(sliding);
    if (rc != 0)
        return qlm_errorf("%s: layer_types: this mix of full and sliding layers is not supported (sliding from one "
                          "layer on, or all but every n-th)", c->path);
    cfg->sliding_window = any ? window : 0;
    return 0;
}

/* Gemma 2 and 3: (1 + w) norms before and after each block, the embedding scaled by
 * sqrt(hidden_size), queries by query_pre_attn_scalar^-0.5, soft caps (Gemma 2: 50 on the scores,
 * 30 on the logits, by default; Gemma 3: the logits' only), q/k norms in Gemma 3. */
static int read_gemma(const hf_ctx *c, hf_arch arch, qlm_llama_config *cfg) {
    float qpas, dflt_attn_cap = arch == ARCH_GEMMA2 ? 50.0f : 0, dflt_final_cap = arch == ARCH_GEMMA2 ? 30.0f : 0;
    int bidirectional;
    if (get_float(c, c->root, "query_pre_attn_scalar", 0, 256, &qpas) != 0 ||
        get_float(c, c->root, "attn_logit_softcapping", 0, dflt_attn_cap, &cfg->attn_softcap) != 0 ||
        get_float(c, c->root, "final_logit_softcapping", 0, dflt_final_cap, &cfg->final_softcap) != 0 ||
        get_bool(c, "use_bidirectional_attention", 0, &bidirectional) != 0)
        return -1;
    /* null caps mean none; Gemma 3's attention keeps attn_logit_softcapping but never applies it */
    if (is_null(c->root, "attn_logit_softcapping") || arch == ARCH_GEMMA3) cfg->attn_softcap = 0;
    if (is_null(c->root, "final_logit_softcapping")) cfg->final_softcap = 0;
    if (bidirectional) return qlm_errorf("%s: use_bidirectional_attention is not supported", c->path);
    if (!(qpas > 0) || cfg->attn_softcap < 0 || cfg->final_softcap < 0)
        return qlm_errorf("%s: query_pre_attn_scalar and the soft caps must be positive", c->path);
    cfg->post_norms = 1;
    cfg->norm_offset = 1.0f;
    cfg->qk_norm = arch == ARCH_GEMMA3;
    /* transformers computes both in double and multiplies in float32 */
    cfg->embed_scale = (float)sqrt((double)cfg->dim);
    cfg->query_scale = (float)pow((double)qpas, -0.5);
    return 0;
}

/* hidden_act (Gemma: hidden_activation first): transformers' names for the activations qlm has. */
static int read_act(const hf_ctx *c, int gemma, qlm_llama_config *cfg) {
    static const struct { const char *name; qlm_act act; } ACTS[] = {
        {"silu", QLM_ACT_SILU}, {"swish", QLM_ACT_SILU}, {"gelu", QLM_ACT_GELU},
        {"gelu_new", QLM_ACT_GELU_TANH}, {"gelu_pytorch_tanh", QLM_ACT_GELU_TANH}, {"relu", QLM_ACT_RELU}};
    const char *act, *gemma_act;
    if (get_str(c, c->root, "hidden_act", &act) != 0 || get_str(c, c->root, "hidden_activation", &gemma_act) != 0)
        return -1;
    if (gemma) act = gemma_act ? gemma_act : act ? act : "gelu_pytorch_tanh";
    cfg->act = QLM_ACT_SILU;
    if (!act) return 0;
    for (size_t i = 0; i < sizeof ACTS / sizeof ACTS[0]; i++)
        if (strcmp(ACTS[i].name, act) == 0) {
            cfg->act = ACTS[i].act;
            return 0;
        }
    return qlm_errorf("%s: hidden_act \"%s\" is not supported (silu, gelu, gelu_new, gelu_pytorch_tanh, relu)",
                      c->path, act);
}

static int read_biases(const hf_ctx *c, hf_arch arch, qlm_llama_config *cfg) {
    switch (arch) {
    case ARCH_QWEN2:
        cfg->attn_bias = 1;
        return 0;
    case ARCH_PHI3:
        cfg->fused_proj = 1;
        return 0;
    case ARCH_MISTRAL:
        return 0;
    case ARCH_GEMMA2:
    case ARCH_GEMMA3:
    case ARCH_QWEN3:
        cfg->qk_norm = arch != ARCH_GEMMA2;
        if (get_bool(c, "attention_bias", 0, &cfg->attn_bias) != 0) return -1;
        cfg->attn_out_bias = cfg->attn_bias;
        return 0;
    case ARCH_LLAMA:
        if (get_bool(c, "attention_bias", 0, &cfg->attn_bias) != 0 || get_bool(c, "mlp_bias", 0, &cfg->mlp_bias) != 0)
            return -1;
        cfg->attn_out_bias = cfg->attn_bias;
        return 0;
    }
    return 0;
}

static int read_config(const hf_ctx *c, qlm_llama_config *cfg) {
    hf_arch arch = ARCH_LLAMA;
    if (find_arch(c, &arch) != 0) return -1;
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->arch, sizeof cfg->arch, "%s", ARCHES[arch].model_type);
    int gemma = arch == ARCH_GEMMA2 || arch == ARCH_GEMMA3;
    if (read_act(c, gemma, cfg) != 0) return -1;
    if (get_int(c, c->root, "hidden_size", 1, 0, &cfg->dim) != 0 ||
        get_int(c, c->root, "intermediate_size", 1, 0, &cfg->hidden_dim) != 0 ||
        get_int(c, c->root, "num_hidden_layers", 1, 0, &cfg->n_layers) != 0 ||
        get_int(c, c->root, "num_attention_heads", 1, 0, &cfg->n_heads) != 0 ||
        get_int(c, c->root, "num_key_value_heads", 0, cfg->n_heads, &cfg->n_kv_heads) != 0 ||
        get_int(c, c->root, "vocab_size", 1, 0, &cfg->vocab_size) != 0 ||
        get_int(c, c->root, "max_position_embeddings", 1, 0, &cfg->max_seq_len) != 0 ||
        get_float(c, c->root, "rms_norm_eps", !gemma, 1e-6f, &cfg->norm_eps) != 0)
        return -1;
    if (cfg->n_heads <= 0) return qlm_errorf("%s: num_attention_heads must be positive", c->path);
    if (get_int(c, c->root, "head_dim", 0, gemma ? 256 : cfg->dim / cfg->n_heads, &cfg->head_dim) != 0 ||
        get_bool(c, "tie_word_embeddings", gemma, &cfg->tie_embeddings) != 0 || read_biases(c, arch, cfg) != 0 ||
        read_rope(c, arch, cfg) != 0 || read_sliding_window(c, arch, cfg) != 0 ||
        (gemma && read_gemma(c, arch, cfg) != 0) || get_token_id(c, "bos_token_id", &cfg->bos_id) != 0 ||
        get_token_id(c, "eos_token_id", &cfg->eos_id) != 0)
        return -1;
    return qlm_config_validate(cfg, c->path);
}

/* Reads and parses path as a JSON object into *root (the caller deletes it). */
static int load_root(const char *path, cJSON **root) {
    size_t n;
    char *text = qlm_read_file(path, HF_CONFIG_MAX_BYTES, &n);
    *root = NULL;
    if (!text) return -1;
    *root = cJSON_ParseWithLength(text, n);
    free(text);
    if (!*root) return qlm_errorf("%s: not valid JSON", path);
    if (!cJSON_IsObject(*root)) {
        cJSON_Delete(*root);
        *root = NULL;
        return qlm_errorf("%s: not a JSON object", path);
    }
    return 0;
}

int qlm_hf_config_load(const char *path, qlm_llama_config *cfg) {
    cJSON *root;
    if (load_root(path, &root) != 0) return -1;
    hf_ctx c = {path, root, ""};
    int rc = read_config(&c, cfg);
    cJSON_Delete(root);
    return rc;
}

int qlm_hf_config_is_t5(const char *path) {
    cJSON *root;
    if (load_root(path, &root) != 0) return -1;
    const cJSON *mt = field(root, "model_type");
    int t5 = cJSON_IsString(mt) && strcmp(mt->valuestring, "t5") == 0;
    cJSON_Delete(root);
    return t5;
}

/* feed_forward_proj: "relu" (T5), "gated-gelu" (v1.1/FLAN: the tanh GELU), "gated-silu". */
static int read_t5_ffn(const hf_ctx *c, qlm_t5_config *cfg) {
    const char *proj;
    if (get_str(c, c->root, "feed_forward_proj", &proj) != 0) return -1;
    if (!proj || strcmp(proj, "relu") == 0) {
        cfg->gated = 0;
        cfg->act = QLM_ACT_RELU;
    } else if (strcmp(proj, "gated-gelu") == 0 || strcmp(proj, "gated-silu") == 0) {
        cfg->gated = 1;
        cfg->act = proj[6] == 'g' ? QLM_ACT_GELU_TANH : QLM_ACT_SILU;
    } else {
        return qlm_errorf("%s: feed_forward_proj \"%s\" is not supported (relu, gated-gelu, gated-silu)", c->path, proj);
    }
    return 0;
}

int qlm_hf_t5_config_load(const char *path, qlm_t5_config *cfg) {
    cJSON *root;
    if (load_root(path, &root) != 0) return -1;
    hf_ctx c = {path, root, ""};
    memset(cfg, 0, sizeof *cfg);
    int rc = -1;
    if (get_int(&c, root, "d_model", 1, 0, &cfg->d_model) == 0 && get_int(&c, root, "d_kv", 1, 0, &cfg->d_kv) == 0 &&
        get_int(&c, root, "d_ff", 1, 0, &cfg->d_ff) == 0 && get_int(&c, root, "num_layers", 1, 0, &cfg->n_layers) == 0 &&
        get_int(&c, root, "num_decoder_layers", 0, cfg->n_layers, &cfg->n_dec_layers) == 0 &&
        get_int(&c, root, "num_heads", 1, 0, &cfg->n_heads) == 0 &&
        get_int(&c, root, "vocab_size", 1, 0, &cfg->vocab_size) == 0 &&
        get_int(&c, root, "relative_attention_num_buckets", 0, 32, &cfg->rel_buckets) == 0 &&
        get_int(&c, root, "relative_attention_max_distance", 0, 128, &cfg->rel_max_distance) == 0 &&
        get_float(&c, root, "layer_norm_epsilon", 0, 1e-6f, &cfg->norm_eps) == 0 && read_t5_ffn(&c, cfg) == 0 &&
        get_bool(&c, "tie_word_embeddings", 1, &cfg->tie_embeddings) == 0 &&
        get_int(&c, root, "pad_token_id", 0, 0, &cfg->pad_id) == 0 &&
        get_int(&c, root, "eos_token_id", 0, 1, &cfg->eos_id) == 0 &&
        get_int(&c, root, "decoder_start_token_id", 0, cfg->pad_id, &cfg->decoder_start_id) == 0)
        rc = qlm_t5_config_validate(cfg, path);
    cJSON_Delete(root);
    return rc;
}

/* ---------- writing ---------- */

/* Shortest decimal that reads back as the same float, written as a JSON float ("1e-05", "10000.0"). */
static cJSON *add_float(cJSON *obj, const char *key, float v) {
    char buf[48];
    if (v == floorf(v) && fabsf(v) < 1e15f) {
        snprintf(buf, sizeof buf, "%.1f", (double)v);
    } else {
        for (int prec = 1; prec <= 9; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, (double)v);
            if (strtof(buf, NULL) == v) break;
        }
    }
    return cJSON_AddRawToObject(obj, key, buf);
}

static cJSON *add_token(cJSON *obj, const char *key, int id) {
    return id >= 0 ? cJSON_AddNumberToObject(obj, key, id) : cJSON_AddNullToObject(obj, key);
}

/* The HF family that has the config's features: Qwen3 for per-head q/k norms, Qwen2 for q/k/v
 * biases without an o_proj bias, Mistral for a window over every layer, else Llama (whose
 * attention_bias covers all four projections). */
static int pick_arch(const qlm_llama_config *cfg, const char *path, hf_arch *arch) {
    if (cfg->post_norms || cfg->norm_offset != 0) {
        if (!cfg->post_norms || cfg->norm_offset != 1.0f || cfg->mlp_bias || cfg->attn_bias != cfg->attn_out_bias)
            return qlm_errorf("%s: this mix of Gemma's norms and biases has no HF model", path);
        *arch = cfg->qk_norm ? ARCH_GEMMA3 : ARCH_GEMMA2;
        return 0;
    }
    if (cfg->qk_norm) {
        if (cfg->mlp_bias || cfg->attn_bias != cfg->attn_out_bias)
            return qlm_errorf("%s: q/k norms with MLP biases or partial attention biases have no HF model", path);
        *arch = ARCH_QWEN3;
    } else if (cfg->attn_bias && !cfg->attn_out_bias) {
        if (cfg->mlp_bias) return qlm_errorf("%s: q/k/v bias without o_proj bias plus MLP bias has no HF model", path);
        *arch = ARCH_QWEN2;
    } else if (!cfg->attn_bias && cfg->attn_out_bias) {
        return qlm_errorf("%s: an o_proj bias without q/k/v biases has no HF model", path);
    } else if ((strcmp(cfg->arch, "mistral") == 0 || (cfg->sliding_window && !cfg->window_first_layer)) &&
               !cfg->attn_bias && !cfg->mlp_bias) {
        *arch = ARCH_MISTRAL;
    } else {
        *arch = ARCH_LLAMA;
    }
    if (cfg->sliding_window && cfg->window_period)
        return qlm_errorf("%s: windowed layers interleaved with global ones have an HF model only in Gemma", path);
    if (cfg->sliding_window && *arch == ARCH_LLAMA)
        return qlm_errorf("%s: sliding-window attention with biases has no HF model", path);
    if (cfg->sliding_window && *arch == ARCH_MISTRAL && cfg->window_first_layer)
        return qlm_errorf("%s: a sliding window over only some layers has no Mistral model", path);
    return 0;
}

static const char *act_name(int act) {
    switch ((qlm_act)act) {
    case QLM_ACT_GELU: return "gelu";
    case QLM_ACT_GELU_TANH: return "gelu_pytorch_tanh";
    case QLM_ACT_RELU: return "relu";
    case QLM_ACT_SILU: break;
    }
    return "silu";
}

static int add_rope_scaling(cJSON *root, const qlm_llama_config *cfg) {
    if (cfg->rope_type == QLM_ROPE_DEFAULT) return cJSON_AddNullToObject(root, "rope_scaling") != NULL;
    static const char *const NAMES[] = {[QLM_ROPE_LINEAR] = "linear", [QLM_ROPE_LLAMA3] = "llama3",
                                        [QLM_ROPE_YARN] = "yarn", [QLM_ROPE_LONGROPE] = "longrope",
                                        [QLM_ROPE_DYNAMIC] = "dynamic"};
    cJSON *rope = cJSON_AddObjectToObject(root, "rope_scaling");
    int ok = rope && cJSON_AddStringToObject(rope, "rope_type", NAMES[cfg->rope_type]) &&
             add_float(rope, "factor", cfg->rope_scale_factor) &&
             (cfg->rope_type == QLM_ROPE_LINEAR || cfg->rope_type == QLM_ROPE_DYNAMIC ||
              cJSON_AddNumberToObject(rope, "original_max_position_embeddings", cfg->rope_orig_max_pos));
    if (ok && cfg->rope_type == QLM_ROPE_LLAMA3)
        ok = add_float(rope, "low_freq_factor", cfg->rope_low_freq_factor) &&
             add_float(rope, "high_freq_factor", cfg->rope_high_freq_factor);
    if (ok && cfg->rope_type == QLM_ROPE_LONGROPE) {
        cJSON *lists[2] = {cJSON_AddArrayToObject(rope, "short_factor"), cJSON_AddArrayToObject(rope, "long_factor")};
        const float *src[2] = {cfg->rope_short_factor, cfg->rope_long_factor};
        for (int k = 0; k < 2 && ok; k++) {
            ok = lists[k] != NULL;
            for (int j = 0; ok && j < cfg->head_dim / 2; j++) {
                cJSON *v = cJSON_CreateNumber(src[k][j]);
                ok = v && cJSON_AddItemToArray(lists[k], v);
                if (!ok) cJSON_Delete(v);
            }
        }
    }
    if (ok && cfg->rope_type == QLM_ROPE_YARN)
        ok = add_float(rope, "beta_fast", cfg->rope_beta_fast) && add_float(rope, "beta_slow", cfg->rope_beta_slow);
    /* only when the factor alone would not give it back */
    if (ok && (cfg->rope_type == QLM_ROPE_YARN || cfg->rope_type == QLM_ROPE_LONGROPE) &&
        cfg->rope_attn_factor != qlm_rope_default_attn_factor(cfg))
        ok = add_float(rope, "attention_factor", cfg->rope_attn_factor) != NULL;
    return ok;
}

static int add_sliding_window(cJSON *root, const qlm_llama_config *cfg, hf_arch arch) {
    if (arch == ARCH_GEMMA2 || arch == ARCH_GEMMA3) return 1; /* add_gemma lists every layer */
    if (arch == ARCH_MISTRAL)
        return cfg->sliding_window ? cJSON_AddNumberToObject(root, "sliding_window", cfg->sliding_window) != NULL
                                   : cJSON_AddNullToObject(root, "sliding_window") != NULL;
    if (arch == ARCH_LLAMA) return 1;
    return cJSON_AddBoolToObject(root, "use_sliding_window", cfg->sliding_window > 0) &&
           (cfg->sliding_window ? cJSON_AddNumberToObject(root, "sliding_window", cfg->sliding_window) != NULL
                                : cJSON_AddNullToObject(root, "sliding_window") != NULL) &&
           cJSON_AddNumberToObject(root, "max_window_layers",
                                   cfg->sliding_window ? cfg->window_first_layer : cfg->n_layers);
}

/* A soft cap, null for none. */
static int add_cap(cJSON *root, const char *key, float cap) {
    return cap > 0 ? add_float(root, key, cap) != NULL : cJSON_AddNullToObject(root, key) != NULL;
}

/* Gemma's fields: its activation key, query scalar, caps, the window with every layer's type, and
 * Gemma 3's local RoPE base. */
static int add_gemma(cJSON *root, const qlm_llama_config *cfg, hf_arch arch) {
    double qpas = 1.0 / ((double)cfg->query_scale * cfg->query_scale);
    int ok = cJSON_AddStringToObject(root, "hidden_activation", act_name(cfg->act)) &&
             cJSON_AddNumberToObject(root, "query_pre_attn_scalar", round(qpas)) &&
             add_cap(root, "attn_logit_softcapping", cfg->attn_softcap) &&
             add_cap(root, "final_logit_softcapping", cfg->final_softcap) &&
             (cfg->sliding_window ? cJSON_AddNumberToObject(root, "sliding_window", cfg->sliding_window) != NULL
                                  : cJSON_AddNullToObject(root, "sliding_window") != NULL);
    cJSON *types = ok ? cJSON_AddArrayToObject(root, "layer_types") : NULL;
    for (int l = 0; types && l < cfg->n_layers; l++) {
        cJSON *t = cJSON_CreateString(qlm_layer_window(cfg, l) ? "sliding_attention" : "full_attention");
        if (!t || !cJSON_AddItemToArray(types, t)) {
            cJSON_Delete(t);
            types = NULL;
        }
    }
    ok = ok && types;
    if (ok && arch == ARCH_GEMMA3) ok = add_float(root, "rope_local_base_freq", cfg->rope_local_theta) != NULL;
    return ok;
}

static int fill_json(cJSON *root, const qlm_llama_config *cfg, hf_arch arch) {
    const char *names[2] = {ARCHES[arch].architecture, NULL};
    cJSON *archs = cJSON_CreateStringArray(names, 1);
    if (!archs || !cJSON_AddItemToObject(root, "architectures", archs)) {
        cJSON_Delete(archs);
        return -1;
    }
    int ok = cJSON_AddStringToObject(root, "model_type", ARCHES[arch].model_type) &&
             cJSON_AddStringToObject(root, "hidden_act", act_name(cfg->act)) &&
             cJSON_AddNumberToObject(root, "hidden_size", cfg->dim) &&
             cJSON_AddNumberToObject(root, "intermediate_size", cfg->hidden_dim) &&
             cJSON_AddNumberToObject(root, "num_hidden_layers", cfg->n_layers) &&
             cJSON_AddNumberToObject(root, "num_attention_heads", cfg->n_heads) &&
             cJSON_AddNumberToObject(root, "num_key_value_heads", cfg->n_kv_heads) &&
             cJSON_AddNumberToObject(root, "head_dim", cfg->head_dim) &&
             cJSON_AddNumberToObject(root, "vocab_size", cfg->vocab_size) &&
             cJSON_AddNumberToObject(root, "max_position_embeddings", cfg->max_seq_len) &&
             add_float(root, "rope_theta", cfg->rope_theta) && add_float(root, "rms_norm_eps", cfg->norm_eps) &&
             cJSON_AddBoolToObject(root, "tie_word_embeddings", cfg->tie_embeddings) &&
             add_token(root, "bos_token_id", cfg->bos_id) && add_token(root, "eos_token_id", cfg->eos_id) &&
             add_rope_scaling(root, cfg) && add_sliding_window(root, cfg, arch);
    if (ok && (arch == ARCH_GEMMA2 || arch == ARCH_GEMMA3)) ok = add_gemma(root, cfg, arch);
    if (ok && arch != ARCH_QWEN2 && arch != ARCH_MISTRAL)
        ok = cJSON_AddBoolToObject(root, "attention_bias", cfg->attn_bias) != NULL;
    if (ok && arch == ARCH_LLAMA) ok = cJSON_AddBoolToObject(root, "mlp_bias", cfg->mlp_bias) != NULL;
    return ok ? 0 : -1;
}

/* Writes root as pretty JSON to path atomically, then frees it. */
/* torch_dtype, and for INT8 and the block types the quantization_config. */
static int add_storage(cJSON *root, const qlm_hf_storage *st) {
    qlm_dtype d = st ? st->dtype : QLM_F32;
    const char *torch = d == QLM_BF16 ? "bfloat16" : d == QLM_F16 ? "float16" : "float32";
    if (!cJSON_AddStringToObject(root, "torch_dtype", torch)) return 0;
    if (qlm_dtype_is_block(d)) {
        cJSON *q = cJSON_AddObjectToObject(root, "quantization_config");
        return q && cJSON_AddStringToObject(q, "quant_method", "qlm_blocks") &&
               cJSON_AddStringToObject(q, "format", qlm_dtype_name(d)) &&
               cJSON_AddNumberToObject(q, "bits", d == QLM_Q8_0 ? 8 : 4) &&
               cJSON_AddNumberToObject(q, "group_size", st->group) &&
               cJSON_AddStringToObject(q, "layout", "uint8 [rows, blocks * block bytes] per weight, each block an "
                                                    "F16 scale (q4_1: and F16 offset) then its values (GGUF's layout at "
                                                    "group 32); __metadata__ qlm.blocks.<name> names the format");
    }
    if (d != QLM_I8) return 1;
    cJSON *q = cJSON_AddObjectToObject(root, "quantization_config");
    return q && cJSON_AddStringToObject(q, "quant_method", "qlm_int8") && cJSON_AddNumberToObject(q, "bits", 8) &&
           cJSON_AddStringToObject(q, "granularity", st->per_channel ? "per-channel" : "per-tensor") &&
           cJSON_AddStringToObject(q, "scales", "float32 tensor <weight name>_scale beside each int8 weight; "
                                                "weight = int8 * scale");
}

static int save_json(const char *path, cJSON *root) {
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return qlm_errorf("%s: out of memory building config.json", path);
    int rc = qlm_atomic_write_text(path, text);
    free(text);
    return rc;
}

cJSON *qlm_hf_config_json(const qlm_llama_config *cfg, const qlm_hf_storage *st, const char *source) {
    hf_arch arch = ARCH_LLAMA;
    if (qlm_config_validate(cfg, source) != 0 || pick_arch(cfg, source, &arch) != 0) return NULL;
    cJSON *root = cJSON_CreateObject();
    if (root && (fill_json(root, cfg, arch) != 0 || !add_storage(root, st))) {
        cJSON_Delete(root);
        root = NULL;
    }
    if (!root) qlm_errorf("%s: out of memory building config.json", source);
    return root;
}

int qlm_hf_config_save(const char *path, const qlm_llama_config *cfg, const qlm_hf_storage *st) {
    cJSON *root = qlm_hf_config_json(cfg, st, path);
    return root ? save_json(path, root) : -1;
}

cJSON *qlm_hf_t5_config_json(const qlm_t5_config *cfg, const qlm_hf_storage *st, const char *source) {
    if (qlm_t5_config_validate(cfg, source) != 0) return NULL;
    const char *proj = !cfg->gated ? "relu" : cfg->act == QLM_ACT_SILU ? "gated-silu" : "gated-gelu";
    const char *names[1] = {"T5ForConditionalGeneration"};
    cJSON *root = cJSON_CreateObject(), *archs = cJSON_CreateStringArray(names, 1);
    int ok = root && archs && cJSON_AddItemToObject(root, "architectures", archs);
    if (!ok) cJSON_Delete(archs);
    ok = ok && cJSON_AddStringToObject(root, "model_type", "t5") && cJSON_AddNumberToObject(root, "d_model", cfg->d_model) &&
         cJSON_AddNumberToObject(root, "d_kv", cfg->d_kv) && cJSON_AddNumberToObject(root, "d_ff", cfg->d_ff) &&
         cJSON_AddNumberToObject(root, "num_layers", cfg->n_layers) &&
         cJSON_AddNumberToObject(root, "num_decoder_layers", cfg->n_dec_layers) &&
         cJSON_AddNumberToObject(root, "num_heads", cfg->n_heads) &&
         cJSON_AddNumberToObject(root, "vocab_size", cfg->vocab_size) &&
         cJSON_AddNumberToObject(root, "relative_attention_num_buckets", cfg->rel_buckets) &&
         cJSON_AddNumberToObject(root, "relative_attention_max_distance", cfg->rel_max_distance) &&
         add_float(root, "layer_norm_epsilon", cfg->norm_eps) && cJSON_AddStringToObject(root, "feed_forward_proj", proj) &&
         cJSON_AddBoolToObject(root, "tie_word_embeddings", cfg->tie_embeddings) &&
         cJSON_AddBoolToObject(root, "is_encoder_decoder", 1) && cJSON_AddNumberToObject(root, "pad_token_id", cfg->pad_id) &&
         cJSON_AddNumberToObject(root, "eos_token_id", cfg->eos_id) &&
         cJSON_AddNumberToObject(root, "decoder_start_token_id", cfg->decoder_start_id) && add_storage(root, st);
    if (!ok) {
        cJSON_Delete(root);
        qlm_errorf("%s: out of memory building config.json", source);
        return NULL;
    }
    return root;
}

int qlm_hf_t5_config_save(const char *path, const qlm_t5_config *cfg, const qlm_hf_storage *st) {
    cJSON *root = qlm_hf_t5_config_json(cfg, st, path);
    return root ? save_json(path, root) : -1;
}
