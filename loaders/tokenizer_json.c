/* Hugging Face tokenizer.json (model.type "BPE" or "Unigram") plus the tokenizer_config.json
 * beside it. Supported BPE pipelines: normalizer Prepend("▁")+Replace(" ","▁") (Llama 2 /
 * TinyLlama), Metaspace pre-tokenizer (Mistral style), ByteLevel (GPT-2), Digits+ByteLevel
 * (SmolLM), and Split(regex)+ByteLevel with the Llama 3 or Qwen2 regex. An NFC normalizer (Qwen2)
 * is accepted but not applied: input that is not already NFC may tokenize differently from HF.
 * Unigram (T5): normalizers Precompiled (SentencePiece charsmap) and Replace(" {2,}", " "), then a
 * Metaspace pre-tokenizer. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/error.h"
#include "../tokenizer/tokenizer.h"
#include "../core/read_file.h"

#define MAX_JSON (1u << 30)
#define SPM_SPACE "\xE2\x96\x81"

typedef struct {
    const char *path;
    cJSON *root;
    const char **tokens;
    int *types;
    unsigned char *flags;
    char **merges;
    int n_merges;
    int unigram;
    double *scores;          /* Unigram piece scores */
    unsigned char *charsmap; /* Precompiled normalizer's precompiled_charsmap, decoded */
    int has_replace, has_prepend;
    int template_bos, template_eos; /* ids the post-processor adds around a single sequence */
    qlm_tokenizer_spec spec;
} json_load;

/* Parses path into *out. A missing file is an error unless optional (then *out is NULL). */
static int read_json(const char *path, int optional, cJSON **out) {
    *out = NULL;
    struct stat st;
    if (optional && stat(path, &st) != 0) return 0;
    size_t n;
    char *buf = qlm_read_file(path, MAX_JSON, &n);
    if (!buf) return -1;
    int rc = -1;
    if (!(*out = cJSON_ParseWithLength(buf, n))) {
        const char *at = cJSON_GetErrorPtr();
        qlm_errorf("%s: not valid JSON (near byte %ld)", path, at && at >= buf && at <= buf + n ? (long)(at - buf) : -1L);
    } else if (!cJSON_IsObject(*out)) {
        qlm_errorf("%s: top level is not a JSON object", path);
        cJSON_Delete(*out);
        *out = NULL;
    } else {
        rc = 0;
    }
    free(buf);
    return rc;
}

/* ---- small JSON helpers ---- */

static int get_bool(const cJSON *obj, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static const char *get_str(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int type_is(const cJSON *obj, const char *type) {
    const char *t = get_str(obj, "type");
    return t && strcmp(t, type) == 0;
}

static int json_id(const cJSON *v, int *id) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= (1 << 24) || v->valuedouble != (int)v->valuedouble)
        return -1;
    *id = (int)v->valuedouble;
    return 0;
}

/* ---- vocabulary ---- */

static int set_token(json_load *L, int id, const char *s, const char *field) {
    if (L->tokens[id] && strcmp(L->tokens[id], s) != 0)
        return qlm_errorf("%s: %s: id %d is both \"%.60s\" and \"%.60s\"", L->path, field, id, L->tokens[id], s);
    L->tokens[id] = s;
    return 0;
}

static int count_ids(json_load *L, const cJSON *vocab, const cJSON *added, int *n_vocab) {
    int max_id = -1, entries = 0, id;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (L->unigram) id = entries; /* [piece, score] pairs in id order */
        else if (json_id(e, &id) != 0)
            return qlm_errorf("%s: model.vocab: \"%.60s\" has no valid id", L->path, e->string ? e->string : "");
        max_id = id > max_id ? id : max_id;
        entries++;
    }
    cJSON_ArrayForEach(e, added) {
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "content")) ||
            json_id(cJSON_GetObjectItemCaseSensitive(e, "id"), &id) != 0)
            return qlm_errorf("%s: added_tokens[%d]: needs a string \"content\" and an integer \"id\"", L->path, entries);
        max_id = id > max_id ? id : max_id;
        entries++;
    }
    if (max_id < 0) return qlm_errorf("%s: model.vocab is empty", L->path);
    /* Ids must be dense, so the largest cannot exceed the number of entries. */
    if (max_id >= entries) return qlm_errorf("%s: model.vocab: id %d leaves gaps (%d entries)", L->path, max_id, entries);
    *n_vocab = max_id + 1;
    return 0;
}

/* A Unigram vocabulary entry: [piece, score]. */
static int unigram_piece(json_load *L, const cJSON *e, int id) {
    const cJSON *piece = cJSON_GetArrayItem(e, 0), *score = cJSON_GetArrayItem(e, 1);
    if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsString(piece) || !cJSON_IsNumber(score))
        return qlm_errorf("%s: model.vocab[%d] is not a Unigram [piece, score] pair", L->path, id);
    L->scores[id] = score->valuedouble;
    return set_token(L, id, piece->valuestring, "model.vocab");
}

static int load_added(json_load *L, const cJSON *added) {
    const cJSON *e;
    cJSON_ArrayForEach(e, added) {
        int id = -1;
        if (json_id(cJSON_GetObjectItemCaseSensitive(e, "id"), &id) != 0 || id >= L->spec.n_vocab)
            return qlm_errorf("%s: added_tokens: entry with id %d is invalid", L->path, id);
        if (set_token(L, id, get_str(e, "content"), "added_tokens") != 0) return -1;
        L->types[id] = get_bool(e, "special", 0) ? QLM_TOKEN_CONTROL : QLM_TOKEN_USER_DEFINED;
        L->flags[id] = get_bool(e, "normalized", 0) ? QLM_ADDED_NORMALIZED : 0;
    }
    return 0;
}

static int load_vocab(json_load *L, const cJSON *model) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(L->root, "added_tokens");
    if (L->unigram ? !cJSON_IsArray(vocab) : !cJSON_IsObject(vocab))
        return qlm_errorf("%s: model.vocab is missing or not an %s", L->path,
                          L->unigram ? "array (Unigram)" : "object");
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added))
        return qlm_errorf("%s: added_tokens is not an array", L->path);
    int n = 0;
    if (count_ids(L, vocab, cJSON_IsArray(added) ? added : NULL, &n) != 0) return -1;
    L->spec.n_vocab = n;
    L->tokens = calloc((size_t)n, sizeof(char *));
    L->types = malloc(sizeof(int) * (size_t)n);
    L->flags = calloc((size_t)n, 1);
    L->scores = L->unigram ? calloc((size_t)n, sizeof(double)) : NULL;
    if (!L->tokens || !L->types || !L->flags || (L->unigram && !L->scores))
        return qlm_errorf("%s: out of memory", L->path);
    for (int i = 0; i < n; i++) L->types[i] = QLM_TOKEN_NORMAL;
    const cJSON *e;
    int k = 0;
    cJSON_ArrayForEach(e, vocab) {
        int id = -1;
        if (L->unigram ? unigram_piece(L, e, k++) != 0
                       : json_id(e, &id) != 0 || id >= L->spec.n_vocab ||
                             set_token(L, id, e->string, "model.vocab") != 0)
            return -1;
    }
    if (cJSON_IsArray(added) && load_added(L, added) != 0) return -1;
    for (int i = 0; i < n; i++)
        if (!L->tokens[i]) return qlm_errorf("%s: model.vocab: no token has id %d", L->path, i);
    L->spec.tokens = L->tokens;
    L->spec.token_types = L->types;
    L->spec.token_flags = L->flags;
    L->spec.piece_scores = L->scores;
    return 0;
}

/* Merges are "left right" strings or, in newer files, ["left", "right"] pairs. */
static int load_merges(json_load *L, const cJSON *model) {
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsArray(merges)) return qlm_errorf("%s: model.merges is missing or not an array", L->path);
    int n = cJSON_GetArraySize(merges);
    L->merges = calloc((size_t)n + 1, sizeof(char *));
    if (!L->merges) return qlm_errorf("%s: out of memory", L->path);
    const cJSON *e;
    cJSON_ArrayForEach(e, merges) {
        const cJSON *a = cJSON_GetArrayItem(e, 0), *b = cJSON_GetArrayItem(e, 1);
        char *m = NULL;
        if (cJSON_IsString(e)) {
            m = strdup(e->valuestring);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(a) && cJSON_IsString(b)) {
            size_t la = strlen(a->valuestring), lb = strlen(b->valuestring);
            if ((m = malloc(la + lb + 2))) {
                memcpy(m, a->valuestring, la);
                m[la] = ' ';
                memcpy(m + la + 1, b->valuestring, lb + 1);
            }
        } else {
            return qlm_errorf("%s: model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", L->path, L->n_merges);
        }
        if (!m) return qlm_errorf("%s: out of memory", L->path);
        L->merges[L->n_merges++] = m;
    }
    L->spec.merges = (const char *const *)L->merges;
    L->spec.n_merges = L->n_merges;
    return 0;
}

/* Unigram: "vocab" [[piece, score], ...], "unk_id" (an index or null), "byte_fallback". */
static int load_unigram(json_load *L, const cJSON *model) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_id");
    if (!cJSON_IsArray(vocab) || cJSON_GetArraySize(vocab) == 0)
        return qlm_errorf("%s: model.vocab of the Unigram model is missing or empty", L->path);
    L->spec.byte_fallback = get_bool(model, "byte_fallback", 0);
    L->spec.fuse_unk = 1; /* tokenizers always fuses unknowns in Unigram */
    if (load_vocab(L, model) != 0) return -1;
    L->spec.unk_id = -1;
    if (unk && !cJSON_IsNull(unk) && (json_id(unk, &L->spec.unk_id) != 0 || L->spec.unk_id >= L->spec.n_vocab))
        return qlm_errorf("%s: model.unk_id is not an id of the vocabulary", L->path);
    return 0;
}

static int load_model(json_load *L) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(L->root, "model");
    if (!cJSON_IsObject(model)) return qlm_errorf("%s: model is missing or not an object", L->path);
    const char *type = get_str(model, "type");
    if (!type) return qlm_errorf("%s: model.type is missing", L->path);
    if (strcmp(type, "Unigram") == 0) {
        L->unigram = 1;
        return load_unigram(L, model);
    }
    if (strcmp(type, "BPE") != 0)
        return qlm_errorf("%s: model.type \"%s\" is not supported (only BPE and Unigram)", L->path, type);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0)
        return qlm_errorf("%s: model.dropout %g is not supported", L->path, dropout->valuedouble);
    const char *prefix = get_str(model, "continuing_subword_prefix"), *suffix = get_str(model, "end_of_word_suffix");
    if ((prefix && *prefix) || (suffix && *suffix))
        return qlm_errorf("%s: model.continuing_subword_prefix/end_of_word_suffix are not supported", L->path);
    L->spec.byte_fallback = get_bool(model, "byte_fallback", 0);
    L->spec.fuse_unk = get_bool(model, "fuse_unk", 0);
    L->spec.ignore_merges = get_bool(model, "ignore_merges", 0);
    if (load_vocab(L, model) != 0 || load_merges(L, model) != 0) return -1;
    const char *unk = get_str(model, "unk_token");
    L->spec.unk_id = -1;
    for (int i = 0; unk && i < L->spec.n_vocab && L->spec.unk_id < 0; i++)
        if (strcmp(L->tokens[i], unk) == 0) L->spec.unk_id = i;
    if (unk && L->spec.unk_id < 0) return qlm_errorf("%s: model.unk_token \"%.60s\" is not in the vocabulary", L->path, unk);
    return 0;
}

/* ---- normalizer and pre-tokenizer ---- */

static int base64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Precompiled: the SentencePiece charsmap, base64 (padded) in "precompiled_charsmap". */
static int load_precompiled(json_load *L, const cJSON *n) {
    const char *b64 = get_str(n, "precompiled_charsmap");
    if (!b64) return qlm_errorf("%s: normalizer Precompiled: precompiled_charsmap is missing", L->path);
    if (L->charsmap || L->spec.collapse_spaces)
        return qlm_errorf("%s: normalizer Precompiled: only one, before any Replace, is supported", L->path);
    size_t len = strlen(b64), n_out = 0;
    if (len % 4 != 0) return qlm_errorf("%s: normalizer Precompiled: precompiled_charsmap is not base64", L->path);
    L->charsmap = malloc(len / 4 * 3 + 1);
    if (!L->charsmap) return qlm_errorf("%s: out of memory", L->path);
    for (size_t i = 0; i < len; i += 4) {
        int v[4], pad = (b64[i + 3] == '=') + (b64[i + 2] == '=' && b64[i + 3] == '=');
        for (int k = 0; k < 4; k++) v[k] = k >= 4 - pad ? 0 : base64_value((unsigned char)b64[i + k]);
        if (v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0 || (pad > 0 && i + 4 < len))
            return qlm_errorf("%s: normalizer Precompiled: precompiled_charsmap is not base64", L->path);
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        for (int k = 0; k < 3 - pad; k++) L->charsmap[n_out++] = (unsigned char)(w >> (16 - 8 * k));
    }
    L->spec.charsmap = L->charsmap;
    L->spec.charsmap_len = n_out;
    return 0;
}

static int load_one_normalizer(json_load *L, const cJSON *n) {
    const char *type = get_str(n, "type");
    if (!type) return qlm_errorf("%s: normalizer without a type", L->path);
    if (strcmp(type, "Precompiled") == 0) return load_precompiled(L, n);
    if (strcmp(type, "Prepend") == 0) {
        const char *p = get_str(n, "prepend");
        if (!p || strcmp(p, SPM_SPACE) != 0) return qlm_errorf("%s: normalizer Prepend: only \"▁\" is supported", L->path);
        L->has_prepend = 1;
        return 0;
    }
    if (strcmp(type, "Replace") == 0) {
        const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *from = get_str(pattern, "String"), *re = get_str(pattern, "Regex"), *to = get_str(n, "content");
        if (re && to && strcmp(re, " {2,}") == 0 && strcmp(to, " ") == 0) {
            L->spec.collapse_spaces = 1;
            return 0;
        }
        if (!from || !to || strcmp(from, " ") != 0 || strcmp(to, SPM_SPACE) != 0)
            return qlm_errorf("%s: normalizer Replace: only \" \" -> \"▁\" and \" {2,}\" -> \" \" are supported",
                              L->path);
        L->has_replace = 1;
        return 0;
    }
    if (strcmp(type, "NFC") == 0) return 0;
    return qlm_errorf("%s: normalizer \"%s\" is not supported", L->path, type);
}

static int load_normalizer(json_load *L) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(L->root, "normalizer");
    if (!n || cJSON_IsNull(n)) return 0;
    if (!type_is(n, "Sequence")) return load_one_normalizer(L, n);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers"), *e;
    if (!cJSON_IsArray(list)) return qlm_errorf("%s: normalizer.normalizers is not an array", L->path);
    cJSON_ArrayForEach(e, list) {
        if (load_one_normalizer(L, e) != 0) return -1;
    }
    return 0;
}

static int load_metaspace(json_load *L, const cJSON *p) {
    const char *rep = get_str(p, "replacement"), *scheme = get_str(p, "prepend_scheme");
    if (!rep || strcmp(rep, SPM_SPACE) != 0) return qlm_errorf("%s: pre_tokenizer Metaspace: replacement must be \"▁\"", L->path);
    if (!scheme) scheme = get_bool(p, "add_prefix_space", 1) ? "always" : "never";
    if (strcmp(scheme, "always") != 0 && strcmp(scheme, "first") != 0 && strcmp(scheme, "never") != 0)
        return qlm_errorf("%s: pre_tokenizer Metaspace: unknown prepend_scheme \"%s\"", L->path, scheme);
    L->spec.spm_metaspace = 1;
    L->spec.add_space_prefix = strcmp(scheme, "never") != 0;
    L->spec.space_prefix_first = strcmp(scheme, "first") == 0;
    L->spec.split_words = get_bool(p, "split", 1);
    return 0;
}

static int byte_level(json_load *L, const cJSON *p, int use_regex) {
    if (!type_is(p, "ByteLevel") || get_bool(p, "add_prefix_space", 0) || get_bool(p, "use_regex", 1) != use_regex)
        return -1;
    L->spec.type = QLM_TOK_BYTE_BPE;
    return 0;
}

/* Sequence[Digits(individual), ByteLevel(regex)] or Sequence[Split(Llama 3/Qwen2 regex), ByteLevel]. */
static int load_sequence(json_load *L, const cJSON *p) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    const cJSON *a = cJSON_GetArrayItem(list, 0), *b = cJSON_GetArrayItem(list, 1);
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) != 2) return -1;
    if (type_is(a, "Digits") && get_bool(a, "individual_digits", 0)) {
        L->spec.pre = QLM_PRE_SMOLLM;
        return byte_level(L, b, 1);
    }
    const char *re = get_str(cJSON_GetObjectItemCaseSensitive(a, "pattern"), "Regex"), *behavior = get_str(a, "behavior");
    if (!type_is(a, "Split") || !re || !behavior || strcmp(behavior, "Isolated") != 0 || get_bool(a, "invert", 0))
        return -1;
    if (strcmp(re, qlm_pretokenizer_regex(QLM_PRE_LLAMA3)) == 0) L->spec.pre = QLM_PRE_LLAMA3;
    else if (strcmp(re, qlm_pretokenizer_regex(QLM_PRE_QWEN2)) == 0) L->spec.pre = QLM_PRE_QWEN2;
    else return -1;
    return byte_level(L, b, 0);
}

static int load_pre_tokenizer(json_load *L) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(L->root, "pre_tokenizer");
    L->spec.type = L->unigram ? QLM_TOK_UNIGRAM : QLM_TOK_SPM_BPE;
    if (p && !cJSON_IsNull(p)) {
        int rc = type_is(p, "Metaspace") ? load_metaspace(L, p)
                 : type_is(p, "Sequence") ? load_sequence(L, p)
                                          : byte_level(L, p, 1);
        if (rc != 0) {
            const char *type = get_str(p, "type");
            return qlm_errorf("%s: pre_tokenizer \"%s\" with these settings is not supported", L->path, type ? type : "?");
        }
    }
    if (L->unigram && (L->spec.type != QLM_TOK_UNIGRAM || !L->spec.spm_metaspace || L->has_prepend || L->has_replace))
        return qlm_errorf("%s: a Unigram model needs a Metaspace pre-tokenizer and no \"▁\" normalizer", L->path);
    if (!L->unigram && (L->spec.charsmap || L->spec.collapse_spaces))
        return qlm_errorf("%s: normalizers Precompiled and Replace(\" {2,}\") are supported with Unigram only",
                          L->path);
    if (L->spec.type == QLM_TOK_BYTE_BPE && (L->has_prepend || L->has_replace))
        return qlm_errorf("%s: a \"▁\" normalizer with a ByteLevel pre-tokenizer is not supported", L->path);
    if (L->spec.type == QLM_TOK_SPM_BPE && !L->spec.spm_metaspace) {
        if (!L->has_replace)
            return qlm_errorf("%s: normalizer: BPE without ByteLevel or Metaspace needs Replace(\" \", \"▁\")", L->path);
        L->spec.add_space_prefix = L->has_prepend;
    }
    return 0;
}

/* ---- post-processor: which special tokens frame a single sequence ---- */

static int special_id(json_load *L, const cJSON *post, const char *name) {
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(post, "special_tokens"), name);
    int id;
    if (json_id(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(st, "ids"), 0), &id) == 0 && id < L->spec.n_vocab)
        return id;
    for (int i = 0; i < L->spec.n_vocab; i++)
        if (strcmp(L->tokens[i], name) == 0) return i;
    return -1;
}

static void load_template(json_load *L, const cJSON *post) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(post, "single"), *e;
    int seen_seq = 0;
    cJSON_ArrayForEach(e, single) {
        const char *name = get_str(cJSON_GetObjectItemCaseSensitive(e, "SpecialToken"), "id");
        if (cJSON_GetObjectItemCaseSensitive(e, "Sequence")) seen_seq = 1;
        else if (name && !seen_seq) L->template_bos = special_id(L, post, name);
        else if (name) L->template_eos = special_id(L, post, name);
    }
}

static void load_post_processor(json_load *L) {
    const cJSON *post = cJSON_GetObjectItemCaseSensitive(L->root, "post_processor"), *e;
    L->template_bos = L->template_eos = -1;
    if (type_is(post, "TemplateProcessing")) load_template(L, post);
    if (!type_is(post, "Sequence")) return;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(post, "processors")) {
        if (type_is(e, "TemplateProcessing")) load_template(L, e);
    }
}

/* ---- tokenizer_config.json ---- */

/* bos_token etc.: a string or {"content": ...}; *id = -1 when absent. */
static int config_token(json_load *L, const cJSON *cfg, const char *cfg_path, const char *key, int *id) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    const char *s = cJSON_IsString(v) ? v->valuestring : get_str(v, "content");
    *id = -1;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!s) return qlm_errorf("%s: %s is neither a string nor {\"content\": ...}", cfg_path, key);
    for (int i = 0; i < L->spec.n_vocab; i++)
        if (strcmp(L->tokens[i], s) == 0) return *id = i, 0;
    return qlm_errorf("%s: %s \"%.60s\" is not in the vocabulary of %s", cfg_path, key, s, L->path);
}

/* chat_template: a string, or [{"name": ..., "template": ...}] of which "default" is used. */
static const char *config_chat_template(const cJSON *cfg) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *e;
    if (cJSON_IsString(v)) return v->valuestring;
    if (!cJSON_IsArray(v)) return NULL;
    cJSON_ArrayForEach(e, v) {
        const char *name = get_str(e, "name");
        if (name && strcmp(name, "default") == 0) return get_str(e, "template");
    }
    return NULL;
}

static int load_config(json_load *L, const cJSON *cfg, const char *cfg_path) {
    int bos = -1, eos = -1, pad = -1;
    if (cfg && (config_token(L, cfg, cfg_path, "bos_token", &bos) != 0 ||
                config_token(L, cfg, cfg_path, "eos_token", &eos) != 0))
        return -1;
    if (cfg && config_token(L, cfg, cfg_path, "pad_token", &pad) != 0) pad = -1; /* padding is optional */
    L->spec.bos_id = bos >= 0 ? bos : L->template_bos;
    L->spec.eos_id = eos >= 0 ? eos : L->template_eos;
    L->spec.pad_id = pad;
    L->spec.add_bos = get_bool(cfg, "add_bos_token", L->template_bos >= 0) && L->spec.bos_id >= 0;
    L->spec.add_eos = get_bool(cfg, "add_eos_token", L->template_eos >= 0) && L->spec.eos_id >= 0;
    L->spec.chat_template = cfg ? config_chat_template(cfg) : NULL;
    return 0;
}

static char *sibling_config(const char *json_path) {
    const char *slash = strrchr(json_path, '/');
    size_t dir = slash ? (size_t)(slash - json_path + 1) : 0;
    const char *name = "tokenizer_config.json";
    char *p = malloc(dir + strlen(name) + 1);
    if (!p) return NULL;
    memcpy(p, json_path, dir);
    strcpy(p + dir, name);
    return p;
}

static qlm_tokenizer *load(json_load *L, const char *config_path) {
    if (load_model(L) != 0 || load_normalizer(L) != 0 || load_pre_tokenizer(L) != 0) return NULL;
    load_post_processor(L);
    char *sibling = config_path ? NULL : sibling_config(L->path);
    const char *cfg_path = config_path ? config_path : sibling;
    if (!cfg_path) {
        qlm_errorf("%s: out of memory", L->path);
        return NULL;
    }
    cJSON *cfg = NULL;
    qlm_tokenizer *t = NULL;
    /* The sibling config is optional; an explicit one, or one that exists but is broken, is not. */
    if (read_json(cfg_path, config_path == NULL, &cfg) == 0 && load_config(L, cfg, cfg_path) == 0) {
        t = qlm_tokenizer_build(&L->spec);
        if (!t) qlm_error_context("%s", L->path);
    }
    cJSON_Delete(cfg);
    free(sibling);
    return t;
}

qlm_tokenizer *qlm_tokenizer_load_json(const char *tokenizer_json, const char *tokenizer_config) {
    if (!tokenizer_json) {
        qlm_errorf("tokenizer.json: no path");
        return NULL;
    }
    json_load L = {.path = tokenizer_json};
    L.spec.bos_id = L.spec.eos_id = L.spec.unk_id = L.spec.pad_id = -1;
    qlm_tokenizer *t = read_json(tokenizer_json, 0, &L.root) == 0 ? load(&L, tokenizer_config) : NULL;
    for (int i = 0; L.merges && i < L.n_merges; i++) free(L.merges[i]);
    free(L.merges);
    free(L.tokens);
    free(L.types);
    free(L.flags);
    free(L.scores);
    free(L.charsmap);
    cJSON_Delete(L.root);
    return t;
}
