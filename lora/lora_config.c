/* adapter_config.json: the fields qlm honours, the options it rejects, the file written back, and
 * peft's rules for which modules a configuration targets (peft/tuners/tuners_utils.py
 * check_target_module_exists) and with which rank and alpha (peft/utils/other.py
 * get_pattern_key). peft matches with Python's re; PCRE2 agrees with it on these patterns. */
#define PCRE2_CODE_UNIT_WIDTH 8

#include <cjson/cJSON.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../core/error.h"
#include "lora_internal.h"

enum { MAX_RANK = 1 << 16, MAX_LAYER_INDEX = 1 << 20 };

/* Options that change what an adapter computes and that qlm does not implement. Any value but
 * null, false, 0, "" or an empty list/object is rejected. */
static const struct {
    const char *field, *what;
} k_unsupported[] = {
    {"use_dora", "DoRA is not supported"},
    {"lora_bias", "a bias on lora_B (lora_bias) is not supported"},
    {"modules_to_save", "modules_to_save (fully trained copies of base modules) is not supported"},
    {"trainable_token_indices", "trainable_token_indices is not supported"},
    {"target_parameters", "target_parameters (LoRA on parameters rather than modules) is not supported"},
    {"layer_replication", "layer_replication is not supported"},
    {"alora_invocation_tokens", "activated LoRA (alora_invocation_tokens) is not supported"},
    {"use_qalora", "QALoRA is not supported"},
    {"kasa_config", "KaSA is not supported"},
    {"monteclora_config", "MonteCLoRA is not supported"},
    {"use_bdlora", "block-diagonal LoRA is not supported"},
    {"arrow_config", "Arrow routing is not supported"},
};

static int is_unset(const cJSON *v) {
    return !v || cJSON_IsNull(v) || cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0) ||
           (cJSON_IsString(v) && !v->valuestring[0]) || ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child);
}

static char *dup_str(const char *s) {
    char *d = strdup(s);
    if (!d) qlm_errorf("out of memory");
    return d;
}

static int json_int(const cJSON *v, long min, long max, long *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)min ||
        v->valuedouble > (double)max)
        return -1;
    *out = (long)v->valuedouble;
    return 0;
}

static int parse_bool(const cJSON *root, const char *field, const char *file, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, field);
    *out = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return qlm_errorf("%s: %s must be true or false", file, field);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int parse_opt_string(const cJSON *root, const char *field, const char *file, char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, field);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return qlm_errorf("%s: %s must be a string", file, field);
    return (*out = dup_str(v->valuestring)) ? 0 : -1;
}

static void selector_free(qlm_lora_selector *s) {
    free(s->regex);
    for (int i = 0; i < s->n_names; i++) free(s->names[i]);
    free(s->names);
    memset(s, 0, sizeof *s);
}

static int selector_given(const qlm_lora_selector *s) { return s->regex || s->is_list; }

/* null, a string, or a list of strings. */
static int parse_selector(const cJSON *root, const char *field, const char *file, qlm_lora_selector *s) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, field);
    memset(s, 0, sizeof *s);
    if (!v || cJSON_IsNull(v)) return 0;
    if (cJSON_IsString(v)) return (s->regex = dup_str(v->valuestring)) ? 0 : -1;
    if (!cJSON_IsArray(v)) return qlm_errorf("%s: %s must be a string or a list of strings", file, field);
    s->is_list = 1;
    int n = cJSON_GetArraySize(v);
    s->names = calloc((size_t)(n ? n : 1), sizeof *s->names);
    if (!s->names) return qlm_errorf("out of memory");
    const cJSON *item;
    cJSON_ArrayForEach(item, v) {
        if (!cJSON_IsString(item)) {
            selector_free(s);
            return qlm_errorf("%s: %s[%d] is not a string", file, field, s->n_names);
        }
        if (!(s->names[s->n_names] = dup_str(item->valuestring))) {
            selector_free(s);
            return -1;
        }
        s->n_names++;
    }
    return 0;
}

/* {"key": number, ...}; rank values must be ranks. */
static int parse_patterns(const cJSON *root, const char *field, int ranks, const char *file, qlm_lora_pattern **out,
                          int *n_out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, field), *item;
    *out = NULL;
    *n_out = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsObject(v)) return qlm_errorf("%s: %s must be an object", file, field);
    int n = cJSON_GetArraySize(v);
    qlm_lora_pattern *p = calloc((size_t)(n ? n : 1), sizeof *p);
    if (!p) return qlm_errorf("out of memory");
    int k = 0, rc = 0;
    cJSON_ArrayForEach(item, v) {
        long r;
        if (ranks ? json_int(item, 1, MAX_RANK, &r) != 0 : !(cJSON_IsNumber(item) && isfinite(item->valuedouble))) {
            rc = ranks ? qlm_errorf("%s: %s[\"%s\"] must be a rank in [1, %d]", file, field, item->string, MAX_RANK)
                       : qlm_errorf("%s: %s[\"%s\"] must be a finite number", file, field, item->string);
            break;
        }
        p[k].value = item->valuedouble;
        if (!(p[k].key = dup_str(item->string))) {
            rc = -1;
            break;
        }
        k++;
    }
    if (rc != 0) {
        for (int i = 0; i < k; i++) free(p[i].key);
        free(p);
        return -1;
    }
    *out = p;
    *n_out = k;
    return 0;
}

static int parse_layers(const cJSON *root, const char *file, qlm_lora_config *c) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "layers_to_transform"), *item;
    if (!v || cJSON_IsNull(v)) return 0;
    long idx;
    if (cJSON_IsNumber(v)) {
        if (json_int(v, 0, MAX_LAYER_INDEX, &idx) != 0)
            return qlm_errorf("%s: layers_to_transform must be a layer index or a list of them", file);
        if (!(c->layers_to_transform = malloc(sizeof(int)))) return qlm_errorf("out of memory");
        c->layers_to_transform[0] = (int)idx;
        c->n_layers_to_transform = 1;
        c->layers_to_transform_is_int = 1;
        return 0;
    }
    if (!cJSON_IsArray(v)) return qlm_errorf("%s: layers_to_transform must be a layer index or a list of them", file);
    int n = cJSON_GetArraySize(v);
    if (!(c->layers_to_transform = malloc(sizeof(int) * (size_t)(n ? n : 1)))) return qlm_errorf("out of memory");
    cJSON_ArrayForEach(item, v) {
        if (json_int(item, 0, MAX_LAYER_INDEX, &idx) != 0)
            return qlm_errorf("%s: layers_to_transform[%d] is not a layer index", file, c->n_layers_to_transform);
        c->layers_to_transform[c->n_layers_to_transform++] = (int)idx;
    }
    return 0;
}

static int parse_fields(const cJSON *root, const char *file, qlm_lora_config *c) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    if (v && !(cJSON_IsString(v) && strcmp(v->valuestring, "LORA") == 0))
        return qlm_errorf("%s: peft_type is %s, not \"LORA\"", file, cJSON_IsString(v) ? v->valuestring : "not a string");
    for (size_t i = 0; i < sizeof k_unsupported / sizeof k_unsupported[0]; i++)
        if (!is_unset(cJSON_GetObjectItemCaseSensitive(root, k_unsupported[i].field)))
            return qlm_errorf("%s: %s: %s", file, k_unsupported[i].field, k_unsupported[i].what);
    v = cJSON_GetObjectItemCaseSensitive(root, "bias");
    if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && strcmp(v->valuestring, "none") == 0))
        return qlm_errorf("%s: bias \"%s\": training the base model's biases is not supported (only \"none\")", file,
                          cJSON_IsString(v) ? v->valuestring : "?");
    /* peft's defaults for absent fields: r 8, lora_alpha 8. */
    long r = 8;
    v = cJSON_GetObjectItemCaseSensitive(root, "r");
    if (v && json_int(v, 1, MAX_RANK, &r) != 0) {
        if (cJSON_IsNumber(v)) return qlm_errorf("%s: r must be a rank in [1, %d], got %g", file, MAX_RANK, v->valuedouble);
        return qlm_errorf("%s: r must be a rank in [1, %d]", file, MAX_RANK);
    }
    c->r = (int)r;
    c->lora_alpha = 8;
    v = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    if (v) {
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return qlm_errorf("%s: lora_alpha must be a number", file);
        c->lora_alpha = v->valuedouble;
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "lora_dropout");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 1))
            return qlm_errorf("%s: lora_dropout must be a number in [0, 1)", file);
        c->lora_dropout = v->valuedouble;
    }
    if (parse_bool(root, "use_rslora", file, &c->use_rslora) != 0 ||
        parse_bool(root, "fan_in_fan_out", file, &c->fan_in_fan_out) != 0 ||
        parse_selector(root, "target_modules", file, &c->target_modules) != 0 ||
        parse_selector(root, "exclude_modules", file, &c->exclude_modules) != 0 ||
        parse_selector(root, "layers_pattern", file, &c->layers_pattern) != 0 || parse_layers(root, file, c) != 0 ||
        parse_patterns(root, "rank_pattern", 1, file, &c->rank_pattern, &c->n_rank_pattern) != 0 ||
        parse_patterns(root, "alpha_pattern", 0, file, &c->alpha_pattern, &c->n_alpha_pattern) != 0 ||
        parse_opt_string(root, "base_model_name_or_path", file, &c->base_model_name_or_path) != 0 ||
        parse_opt_string(root, "task_type", file, &c->task_type) != 0)
        return -1;
    /* The same combinations LoraConfig itself refuses. */
    if (c->target_modules.regex && (c->layers_to_transform || selector_given(&c->layers_pattern)))
        return qlm_errorf("%s: layers_to_transform and layers_pattern cannot be used with a target_modules string", file);
    const qlm_lora_selector *lp = &c->layers_pattern;
    if ((lp->regex ? lp->regex[0] != 0 : lp->n_names > 0) && !c->layers_to_transform)
        return qlm_errorf("%s: layers_pattern needs layers_to_transform", file);
    return 0;
}

int lora_config_parse(qlm_lora_config *c, const char *text, const char *file) {
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_Parse(text);
    if (!root) return qlm_errorf("%s: not valid JSON", file);
    int rc = cJSON_IsObject(root) ? parse_fields(root, file, c) : qlm_errorf("%s: not a JSON object", file);
    cJSON_Delete(root);
    if (rc != 0) lora_config_free(c);
    return rc;
}

static void patterns_free(qlm_lora_pattern *p, int n) {
    for (int i = 0; i < n; i++) free(p[i].key);
    free(p);
}

void lora_config_free(qlm_lora_config *c) {
    selector_free(&c->target_modules);
    selector_free(&c->exclude_modules);
    selector_free(&c->layers_pattern);
    patterns_free(c->rank_pattern, c->n_rank_pattern);
    patterns_free(c->alpha_pattern, c->n_alpha_pattern);
    free(c->layers_to_transform);
    free(c->base_model_name_or_path);
    free(c->task_type);
    memset(c, 0, sizeof *c);
}

/* ---- writing ---- */

static cJSON *selector_json(const qlm_lora_selector *s) {
    if (s->regex) return cJSON_CreateString(s->regex);
    if (!s->is_list) return cJSON_CreateNull();
    return cJSON_CreateStringArray((const char *const *)s->names, s->n_names);
}

static cJSON *patterns_json(const qlm_lora_pattern *p, int n) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; o && i < n; i++)
        if (!cJSON_AddNumberToObject(o, p[i].key, p[i].value)) {
            cJSON_Delete(o);
            return NULL;
        }
    return o;
}

static cJSON *opt_string(const char *s) { return s ? cJSON_CreateString(s) : cJSON_CreateNull(); }

char *qlm_lora_config_json(const qlm_lora_config *c) {
    cJSON *root = cJSON_CreateObject();
    cJSON *layers = !c->layers_to_transform ? cJSON_CreateNull()
                    : c->layers_to_transform_is_int ? cJSON_CreateNumber(c->layers_to_transform[0])
                                                    : cJSON_CreateIntArray(c->layers_to_transform, c->n_layers_to_transform);
    /* Keys in peft's (alphabetical) order; the options qlm rejects are written as off. */
    struct { const char *key; cJSON *v; } f[] = {
        {"alpha_pattern", patterns_json(c->alpha_pattern, c->n_alpha_pattern)},
        {"base_model_name_or_path", opt_string(c->base_model_name_or_path)},
        {"bias", cJSON_CreateString("none")},
        {"exclude_modules", selector_json(&c->exclude_modules)},
        {"fan_in_fan_out", cJSON_CreateBool(c->fan_in_fan_out)},
        {"inference_mode", cJSON_CreateTrue()},
        {"layers_pattern", selector_json(&c->layers_pattern)},
        {"layers_to_transform", layers},
        {"lora_alpha", cJSON_CreateNumber(c->lora_alpha)},
        {"lora_bias", cJSON_CreateFalse()},
        {"lora_dropout", cJSON_CreateNumber(c->lora_dropout)},
        {"modules_to_save", cJSON_CreateNull()},
        {"peft_type", cJSON_CreateString("LORA")},
        {"r", cJSON_CreateNumber(c->r)},
        {"rank_pattern", patterns_json(c->rank_pattern, c->n_rank_pattern)},
        {"target_modules", selector_json(&c->target_modules)},
        {"task_type", opt_string(c->task_type)},
        {"use_dora", cJSON_CreateFalse()},
        {"use_rslora", cJSON_CreateBool(c->use_rslora)},
    };
    int ok = root != NULL;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (ok && f[i].v && cJSON_AddItemToObject(root, f[i].key, f[i].v)) continue;
        ok = 0;
        cJSON_Delete(f[i].v);
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) qlm_errorf("out of memory writing adapter_config.json");
    return text;
}

/* ---- matching ---- */

struct lora_matcher {
    const qlm_lora_config *cfg;
    int is_t5, all_linear;
    const char *const *names; /* target list (given or peft's default) */
    int n_names;
    pcre2_code *target_re, *exclude_re;
    pcre2_code **layer_re; /* layers_pattern regexes, or the default one */
    int n_layer_re;
    pcre2_code **rank_re, **alpha_re;
    pcre2_match_data *md;
};

/* peft's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for llama/qwen2 and t5. */
static const char *const k_default_llama[] = {"q_proj", "v_proj"};
static const char *const k_default_t5[] = {"q", "v"};

static pcre2_code *compile(const char *pattern, uint32_t options, const char *file, const char *field) {
    int err;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, options | PCRE2_UTF, &err, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        qlm_errorf("%s: %s: regex \"%s\" does not compile: %s (at offset %zu)", file, field, pattern, (char *)msg,
                   (size_t)at);
    }
    return re;
}

/* A pattern wrapped as peft wraps it ("%s" is replaced by the user's pattern). */
static pcre2_code *compile_wrapped(const char *fmt, const char *pattern, uint32_t options, const char *file,
                                   const char *field) {
    size_t n = strlen(fmt) + strlen(pattern) + 1;
    char *s = malloc(n);
    if (!s) {
        qlm_errorf("out of memory");
        return NULL;
    }
    snprintf(s, n, fmt, pattern);
    pcre2_code *re = compile(s, options, file, field);
    free(s);
    return re;
}

static int matches(lora_matcher *m, const pcre2_code *re, const char *s) {
    return pcre2_match(re, (PCRE2_SPTR)s, PCRE2_ZERO_TERMINATED, 0, 0, m->md, NULL) >= 0;
}

/* The name list rule: the whole path, or a suffix after a dot. */
static int in_list(const char *const *names, int n, const char *path) {
    size_t len = strlen(path);
    for (int i = 0; i < n; i++) {
        size_t k = strlen(names[i]);
        if (strcmp(path, names[i]) == 0 || (k < len && path[len - k - 1] == '.' && strcmp(path + len - k, names[i]) == 0))
            return 1;
    }
    return 0;
}

static pcre2_code **compile_patterns(const qlm_lora_pattern *p, int n, const char *file, const char *field) {
    pcre2_code **re = calloc((size_t)(n ? n : 1), sizeof *re);
    if (!re) {
        qlm_errorf("out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!(re[i] = compile_wrapped("(.*\\.)?(%s)$", p[i].key, PCRE2_ANCHORED, file, field))) {
            for (int j = 0; j < i; j++) pcre2_code_free(re[j]);
            free(re);
            return NULL;
        }
    return re;
}

lora_matcher *lora_matcher_new(const qlm_lora_config *c, int is_t5, int fused, const char *file) {
    lora_matcher *m = calloc(1, sizeof *m);
    if (!m) {
        qlm_errorf("out of memory");
        return NULL;
    }
    m->cfg = c;
    m->is_t5 = is_t5;
    const qlm_lora_selector *t = &c->target_modules;
    const uint32_t full = PCRE2_ANCHORED | PCRE2_ENDANCHORED; /* re.fullmatch */
    if (t->regex && strcasecmp(t->regex, "all-linear") == 0) {
        m->all_linear = 1;
    } else if (t->regex) {
        if (!(m->target_re = compile(t->regex, full, file, "target_modules"))) goto fail;
    } else if (t->is_list) {
        m->names = (const char *const *)t->names;
        m->n_names = t->n_names;
    } else if (fused) {
        qlm_errorf("%s: target_modules is required for a model with fused projections (qkv_proj, gate_up_proj): "
                   "peft has no default for it", file);
        goto fail;
    } else {
        m->names = is_t5 ? k_default_t5 : k_default_llama;
        m->n_names = 2;
    }
    if (c->exclude_modules.regex && !(m->exclude_re = compile(c->exclude_modules.regex, full, file, "exclude_modules")))
        goto fail;
    /* The layer index is the number after the first "<layers_pattern>." (by default the first
     * "<any name>.") that is followed by a dot. */
    const qlm_lora_selector *lp = &c->layers_pattern;
    int n_lp = lp->regex ? (lp->regex[0] != 0) : lp->n_names;
    m->layer_re = calloc((size_t)(n_lp ? n_lp : 1), sizeof *m->layer_re);
    if (!m->layer_re) {
        qlm_errorf("out of memory");
        goto fail;
    }
    if (n_lp == 0)
        m->layer_re[m->n_layer_re++] = compile(".*?\\.[^.]*\\.(?P<idx>\\d+)\\.", PCRE2_ANCHORED, file, "layers_pattern");
    for (int i = 0; i < n_lp; i++)
        m->layer_re[m->n_layer_re++] = compile_wrapped("(?:^|.*?\\.)%s\\.(?P<idx>\\d+)\\.", lp->regex ? lp->regex : lp->names[i],
                                                       PCRE2_ANCHORED, file, "layers_pattern");
    for (int i = 0; i < m->n_layer_re; i++)
        if (!m->layer_re[i]) goto fail;
    if (!(m->rank_re = compile_patterns(c->rank_pattern, c->n_rank_pattern, file, "rank_pattern")) ||
        !(m->alpha_re = compile_patterns(c->alpha_pattern, c->n_alpha_pattern, file, "alpha_pattern")))
        goto fail;
    if (!(m->md = pcre2_match_data_create(16, NULL))) {
        qlm_errorf("out of memory");
        goto fail;
    }
    return m;
fail:
    lora_matcher_free(m);
    return NULL;
}

void lora_matcher_free(lora_matcher *m) {
    if (!m) return;
    pcre2_code_free(m->target_re);
    pcre2_code_free(m->exclude_re);
    for (int i = 0; i < m->n_layer_re; i++) pcre2_code_free(m->layer_re[i]);
    free(m->layer_re);
    for (int i = 0; m->rank_re && i < m->cfg->n_rank_pattern; i++) pcre2_code_free(m->rank_re[i]);
    for (int i = 0; m->alpha_re && i < m->cfg->n_alpha_pattern; i++) pcre2_code_free(m->alpha_re[i]);
    free(m->rank_re);
    free(m->alpha_re);
    pcre2_match_data_free(m->md);
    free(m);
}

/* The layer index peft reads from the path for layers_to_transform, or -1. */
static long layer_index(lora_matcher *m, const char *path) {
    for (int i = 0; i < m->n_layer_re; i++) {
        if (!matches(m, m->layer_re[i], path)) continue;
        int g = pcre2_substring_number_from_name(m->layer_re[i], (PCRE2_SPTR) "idx");
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
        if (g <= 0) return -1;
        long v = 0;
        for (PCRE2_SIZE k = ov[2 * g]; k < ov[2 * g + 1] && v <= MAX_LAYER_INDEX; k++) v = v * 10 + (path[k] - '0');
        return v;
    }
    return -1;
}

int lora_matcher_targets(lora_matcher *m, const char *path) {
    const qlm_lora_config *c = m->cfg;
    if (m->exclude_re && matches(m, m->exclude_re, path)) return 0;
    if (c->exclude_modules.is_list &&
        in_list((const char *const *)c->exclude_modules.names, c->exclude_modules.n_names, path))
        return 0;
    if (m->target_re) return matches(m, m->target_re, path);
    if (m->all_linear) return 1;
    for (int i = 0; i < m->n_names; i++)
        if (strcmp(path, m->names[i]) == 0) return 1; /* a full path is taken whatever the layer */
    if (!in_list(m->names, m->n_names, path)) return 0;
    if (c->n_layers_to_transform == 0) return 1;
    long idx = layer_index(m, path);
    for (int i = 0; idx >= 0 && i < c->n_layers_to_transform; i++)
        if (c->layers_to_transform[i] == idx) return 1;
    return 0;
}

void lora_matcher_rank_alpha(lora_matcher *m, const char *path, int *r, double *alpha) {
    const qlm_lora_config *c = m->cfg;
    *r = c->r;
    *alpha = c->lora_alpha;
    /* The first key (in file order) whose pattern matches the end of the path. */
    for (int i = 0; i < c->n_rank_pattern; i++)
        if (matches(m, m->rank_re[i], path)) {
            *r = (int)c->rank_pattern[i].value;
            break;
        }
    for (int i = 0; i < c->n_alpha_pattern; i++)
        if (matches(m, m->alpha_re[i], path)) {
            *alpha = c->alpha_pattern[i].value;
            break;
        }
}
