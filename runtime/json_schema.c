/* JSON Schema (the subset structured-output clients send) compiled into the automaton's grammar.
 * The schema comes from the request, so everything is bounded (schema depth, nesting, nodes, the
 * bytes of keys and values) and each refusal names the keyword and where it is. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "json_internal.h"

enum {
    MAX_SCHEMA_DEPTH = 64, /* schemas inside one another (anyOf counts too) */
    MAX_NODES = 8192,
    MAX_LIST = 65536,
    MAX_TRIE = 65535,      /* a frame keeps a trie node in 16 bits */
    MAX_MIN_ITEMS = 1024,
    MAX_ALTS = 64,         /* alternatives of one anyOf, once flattened */
    PATH_CAP = 512,
};

enum { T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_NUMBER = 8, T_INTEGER = 16, T_BOOLEAN = 32, T_NULL = 64 };
enum { T_ALL = 127 };

typedef struct {
    qlm_json_grammar *g;
    char path[PATH_CAP]; /* JSON pointer of the schema being compiled ("#/properties/name") */
    size_t path_len;
    int depth, nest;     /* schemas, and objects and arrays, inside one another */
    int any, number, integer; /* shared nodes, -1 until needed */
} compiler;

static const char *const k_types[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
static const char *const k_ignored[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                        "$defs", "definitions", NULL};
static const char *const k_supported[] = {"type", "properties", "required", "additionalProperties", "items",
                                          "minItems", "maxItems", "enum", "const", "anyOf", NULL};

static int listed(const char *s, const char *const *names) {
    for (; *names; names++)
        if (!strcmp(s, *names)) return 1;
    return 0;
}

/* Appends one reference token (RFC 6901: ~ and / escaped); returns the length to restore. A path
 * too long for the buffer is cut (the message still names the keyword). */
static size_t path_push(compiler *c, const char *seg) {
    size_t old = c->path_len;
    char *p = c->path + c->path_len, *end = c->path + PATH_CAP - 1;
    if (p < end) *p++ = '/';
    for (; *seg && p + 2 <= end; seg++) {
        if (*seg == '~' || *seg == '/') *p++ = '~', *p++ = *seg == '~' ? '0' : '1';
        else *p++ = *seg;
    }
    *p = 0;
    c->path_len = (size_t)(p - c->path);
    return old;
}

static size_t path_push_index(compiler *c, const char *key, int i) {
    char seg[16];
    snprintf(seg, sizeof seg, "%d", i);
    size_t old = path_push(c, key);
    path_push(c, seg);
    return old;
}

static void path_pop(compiler *c, size_t len) {
    c->path_len = len;
    c->path[len] = 0;
}

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int cap2 = *cap ? *cap * 2 : 64;
    while (cap2 < need) cap2 *= 2;
    void *q = realloc(*p, (size_t)cap2 * elem);
    if (!q) return qlm_errorf("out of memory");
    *p = q;
    *cap = cap2;
    return 0;
}

static int new_node(compiler *c, json_kind kind) {
    qlm_json_grammar *g = c->g;
    if (g->n_nodes == MAX_NODES) return qlm_errorf("the schema compiles to more than %d nodes", MAX_NODES);
    if (grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes) != 0) return -1;
    g->nodes[g->n_nodes] = (json_node){.kind = kind, .child = -1, .root = -1, .max_items = -1};
    return g->n_nodes++;
}

/* The ids go to the list one after another; returns where they start. */
static int add_list(compiler *c, const int *ids, int n) {
    qlm_json_grammar *g = c->g;
    if (g->n_list + n > MAX_LIST) return qlm_errorf("the schema compiles to more than %d entries", MAX_LIST);
    if (grow((void **)&g->list, &g->cap_list, g->n_list + n, sizeof *g->list) != 0) return -1;
    memcpy(g->list + g->n_list, ids, (size_t)n * sizeof *ids);
    g->n_list += n;
    return g->n_list - n;
}

static int new_trie(compiler *c, unsigned char byte) {
    qlm_json_grammar *g = c->g;
    if (g->n_trie == MAX_TRIE) return qlm_errorf("the schema's keys and values exceed %d bytes", MAX_TRIE);
    if (grow((void **)&g->trie, &g->cap_trie, g->n_trie + 1, sizeof *g->trie) != 0) return -1;
    g->trie[g->n_trie] = (json_trie){.child = -1, .sibling = -1, .label = -1, .byte = byte};
    return g->n_trie++;
}

/* Adds the bytes s[0..n) under root, ending in label; prop marks the nodes a key passes. */
static int trie_add(compiler *c, int root, const char *s, size_t n, int label, uint64_t prop) {
    int at = root;
    c->g->trie[at].props |= prop;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int k = c->g->trie[at].child;
        while (k >= 0 && c->g->trie[k].byte != b) k = c->g->trie[k].sibling;
        if (k < 0) {
            if ((k = new_trie(c, b)) < 0) return -1;
            c->g->trie[k].sibling = c->g->trie[at].child;
            c->g->trie[at].child = k;
        }
        c->g->trie[k].props |= prop;
        at = k;
    }
    c->g->trie[at].label = label;
    return 0;
}

/* A value as the output must spell it: compact JSON, valid UTF-8 (so any byte it needs is one
 * every usable vocabulary has). */
static int add_value(compiler *c, int root, const cJSON *v, int label, uint64_t prop, const char *what) {
    char *text = cJSON_PrintUnformatted(v);
    if (!text) return qlm_errorf("out of memory");
    size_t n = strlen(text);
    int rc = qlm_utf8_valid((const unsigned char *)text, n)
                 ? trie_add(c, root, text, n, label, prop)
                 : qlm_errorf("%s at %s is not valid UTF-8", what, c->path);
    free(text);
    return rc;
}

static int add_key(compiler *c, int root, const char *name, int prop) {
    cJSON *key = cJSON_CreateString(name);
    int rc = key ? add_value(c, root, key, prop, 1ULL << prop, "the property name") : qlm_errorf("out of memory");
    cJSON_Delete(key);
    return rc;
}

static int compile(compiler *c, const cJSON *s);

static int make_alt(compiler *c, const int *ids, int n) {
    if (n == 1) return ids[0];
    int id = new_node(c, JN_ALT), first = id < 0 ? -1 : add_list(c, ids, n);
    if (first < 0) return -1;
    c->g->nodes[id].first = first;
    c->g->nodes[id].count = n;
    return id;
}

static int literals(compiler *c, const char *const *values, int n) {
    int id = new_node(c, JN_LITERALS), root = id < 0 ? -1 : new_trie(c, 0);
    if (root < 0) return -1;
    c->g->nodes[id].root = root;
    for (int i = 0; i < n; i++)
        if (trie_add(c, root, values[i], strlen(values[i]), 0, 0) != 0) return -1;
    return id;
}

static int shared(compiler *c, int *slot, json_kind kind) {
    if (*slot < 0) *slot = new_node(c, kind);
    return *slot;
}

/* Any JSON value: an object of any keys or an array, both of any values, a string, a number,
 * true, false or null. */
static int any_node(compiler *c) {
    if (c->any >= 0) return c->any;
    static const char *const words[] = {"true", "false", "null"};
    int id = new_node(c, JN_ALT), obj = new_node(c, JN_OBJECT), arr = new_node(c, JN_ARRAY);
    int num = shared(c, &c->number, JN_NUMBER), lit = literals(c, words, 3);
    if (id < 0 || obj < 0 || arr < 0 || num < 0 || lit < 0) return -1;
    c->g->nodes[obj].child = id;
    c->g->nodes[arr].child = id;
    int members[] = {obj, arr, c->g->string_node, num, lit}, first = add_list(c, members, 5);
    if (first < 0) return -1;
    c->g->nodes[id].first = first;
    c->g->nodes[id].count = 5;
    return c->any = id;
}

/* An integer count in [0, hi]; absent leaves *out. */
static int count_field(compiler *c, const cJSON *s, const char *key, double hi, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble != floor(v->valuedouble))
        return qlm_errorf("'%s' at %s must be a non-negative integer", key, c->path);
    if (v->valuedouble > hi) return qlm_errorf("'%s' at %s must be at most %.0f", key, c->path, hi);
    *out = (int)v->valuedouble;
    return 0;
}

static int parse_types(compiler *c, const cJSON *s, unsigned *types) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type"), *e;
    *types = t ? 0 : T_ALL;
    if (t && !cJSON_IsString(t) && !(cJSON_IsArray(t) && t->child))
        return qlm_errorf("'type' at %s must be a type name or a non-empty list of them", c->path);
    for (e = cJSON_IsArray(t) ? t->child : t; e; e = cJSON_IsArray(t) ? e->next : NULL) {
        unsigned bit = 0;
        for (int i = 0; cJSON_IsString(e) && i < 7; i++)
            if (!strcmp(e->valuestring, k_types[i])) bit = 1u << i;
        if (!bit) return qlm_errorf("'type' at %s: '%.64s' is not a JSON Schema type", c->path,
                                    cJSON_IsString(e) ? e->valuestring : "?");
        *types |= bit;
    }
    return 0;
}

static int compile_object(compiler *c, const cJSON *s) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return qlm_errorf("'properties' at %s must be an object", c->path);
    if (extra && !cJSON_IsBool(extra) && !cJSON_IsObject(extra))
        return qlm_errorf("'additionalProperties' at %s must be true, false or a schema", c->path);
    if (req && !cJSON_IsArray(req)) return qlm_errorf("'required' at %s must be a list of property names", c->path);
    int count = props ? cJSON_GetArraySize(props) : 0, values[JSON_MAX_PROPS], i = 0;
    if (count > JSON_MAX_PROPS)
        return qlm_errorf("'properties' at %s has more than %d entries", c->path, JSON_MAX_PROPS);
    int id = new_node(c, JN_OBJECT), root = id >= 0 && count ? new_trie(c, 0) : -1;
    if (id < 0 || (count && root < 0)) return -1;
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        size_t back = path_push(c, "properties");
        path_push(c, p->string);
        values[i] = compile(c, p);
        int rc = values[i] < 0 ? -1 : add_key(c, root, p->string, i);
        path_pop(c, back);
        if (rc != 0) return -1;
        i++;
    }
    /* Checked even where it is not used (properties are listed), so that no keyword goes unread. */
    int extra_node = -1;
    if (cJSON_IsObject(extra)) {
        size_t back = path_push(c, "additionalProperties");
        extra_node = compile(c, extra);
        path_pop(c, back);
        if (extra_node < 0) return -1;
    } else if (!cJSON_IsFalse(extra) && !count && (extra_node = any_node(c)) < 0) {
        return -1;
    }
    uint64_t required = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        int k = 0;
        cJSON_ArrayForEach(p, props) {
            if (cJSON_IsString(r) && !strcmp(p->string, r->valuestring)) break;
            k++;
        }
        if (k == count)
            return qlm_errorf("'required' at %s names %s%.64s%s, which 'properties' does not list", c->path,
                              cJSON_IsString(r) ? "'" : "", cJSON_IsString(r) ? r->valuestring : "a non-string",
                              cJSON_IsString(r) ? "'" : "");
        required |= 1ULL << k;
    }
    int first = count ? add_list(c, values, count) : 0;
    if (first < 0) return -1;
    json_node *n = &c->g->nodes[id];
    n->first = first, n->count = count, n->root = root, n->required = required;
    n->child = count ? -1 : extra_node;
    return id;
}

static int compile_array(compiler *c, const cJSON *s) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    int min = 0, max = -1;
    if (cJSON_IsArray(items)) return qlm_errorf("'items' at %s as a list (a tuple) is not supported", c->path);
    if (count_field(c, s, "minItems", MAX_MIN_ITEMS, &min) != 0 || count_field(c, s, "maxItems", 1e9, &max) != 0)
        return -1;
    if (max >= 0 && min > max) return qlm_errorf("'minItems' at %s is larger than 'maxItems'", c->path);
    /* Items are counted in 16 bits: a larger bound is generated as that bound, which it allows. */
    if (max > UINT16_MAX) max = UINT16_MAX;
    int item;
    if (items) {
        size_t back = path_push(c, "items");
        item = compile(c, items);
        path_pop(c, back);
    } else {
        item = any_node(c);
    }
    int id = item < 0 ? -1 : new_node(c, JN_ARRAY);
    if (id < 0) return -1;
    json_node *n = &c->g->nodes[id];
    n->child = item, n->min_items = min, n->max_items = max;
    return id;
}

static int compile_types(compiler *c, const cJSON *s, unsigned types) {
    int alts[5], n = 0;
    if (types & (T_OBJECT | T_ARRAY)) {
        /* Every container of the schema fits the automaton's nesting, so no output dead-ends there. */
        if (c->nest == JSON_MAX_NEST)
            return qlm_errorf("objects and arrays nest deeper than %d at %s", JSON_MAX_NEST, c->path);
        c->nest++;
        int obj = types & T_OBJECT ? compile_object(c, s) : 0;
        int arr = obj >= 0 && types & T_ARRAY ? compile_array(c, s) : 0;
        c->nest--;
        if (obj < 0 || arr < 0) return -1;
        if (types & T_OBJECT) alts[n++] = obj;
        if (types & T_ARRAY) alts[n++] = arr;
    }
    if (types & T_STRING) alts[n++] = c->g->string_node;
    if (types & T_NUMBER) alts[n++] = shared(c, &c->number, JN_NUMBER);
    else if (types & T_INTEGER) alts[n++] = shared(c, &c->integer, JN_INTEGER);
    if (types & (T_BOOLEAN | T_NULL)) {
        const char *words[3];
        int k = 0;
        if (types & T_BOOLEAN) words[k++] = "true", words[k++] = "false";
        if (types & T_NULL) words[k++] = "null";
        alts[n++] = literals(c, words, k);
    }
    for (int i = 0; i < n; i++)
        if (alts[i] < 0) return -1;
    return make_alt(c, alts, n);
}

static int type_matches(const cJSON *v, unsigned types) {
    if (cJSON_IsNumber(v)) return types & T_NUMBER || (types & T_INTEGER && v->valuedouble == floor(v->valuedouble));
    if (cJSON_IsString(v)) return types & T_STRING;
    if (cJSON_IsBool(v)) return types & T_BOOLEAN;
    if (cJSON_IsNull(v)) return types & T_NULL;
    return types & (cJSON_IsArray(v) ? T_ARRAY : T_OBJECT);
}

/* Keywords that would constrain the values beside a list of given ones (or beside anyOf), which
 * qlm does not combine. */
static int lone(compiler *c, const cJSON *s, const char *owner, const char *const *others) {
    for (; *others; others++)
        if (cJSON_GetObjectItemCaseSensitive(s, *others))
            return qlm_errorf("'%s' beside '%s' at %s is not supported", *others, owner, c->path);
    return 0;
}

/* enum or const: those values (of the given types) as they are spelled. */
static int compile_values(compiler *c, const cJSON *s, const cJSON *en, const cJSON *co) {
    static const char *const structural[] = {"properties", "required", "additionalProperties", "items", "minItems",
                                             "maxItems", NULL};
    const char *key = en ? "enum" : "const";
    unsigned types;
    if (en && co) return qlm_errorf("'const' beside 'enum' at %s is not supported", c->path);
    if (lone(c, s, key, structural) != 0 || parse_types(c, s, &types) != 0) return -1;
    if (en && !(cJSON_IsArray(en) && en->child)) return qlm_errorf("'enum' at %s must be a non-empty list", c->path);
    int id = new_node(c, JN_LITERALS), root = id < 0 ? -1 : new_trie(c, 0), kept = 0;
    if (root < 0) return -1;
    c->g->nodes[id].root = root;
    for (const cJSON *v = en ? en->child : co; v; v = en ? v->next : NULL) {
        if (!type_matches(v, types)) continue;
        if (add_value(c, root, v, 0, 0, en ? "an 'enum' value" : "the 'const' value") != 0) return -1;
        kept++;
    }
    if (!kept) return qlm_errorf("no value of '%s' at %s is of its 'type'", key, c->path);
    return id;
}

static int compile_any_of(compiler *c, const cJSON *s, const cJSON *any_of) {
    static const char *const others[] = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                         "maxItems", "enum", "const", NULL};
    if (lone(c, s, "anyOf", others) != 0) return -1;
    if (!cJSON_IsArray(any_of) || !any_of->child)
        return qlm_errorf("'anyOf' at %s must be a non-empty list of schemas", c->path);
    int ids[MAX_ALTS], k = 0, i = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, any_of) {
        size_t back = path_push_index(c, "anyOf", i++);
        int id = compile(c, a);
        path_pop(c, back);
        if (id < 0) return -1;
        const json_node *n = &c->g->nodes[id];
        /* Alternatives are flattened: a thread only ever forks once per value. */
        int m = n->kind == JN_ALT ? n->count : 1;
        for (int j = 0; j < m; j++) {
            int member = n->kind == JN_ALT ? c->g->list[n->first + j] : id, dup = 0;
            for (int q = 0; q < k; q++) dup |= ids[q] == member;
            if (dup) continue;
            if (k == MAX_ALTS) return qlm_errorf("'anyOf' at %s has more than %d alternatives", c->path, MAX_ALTS);
            ids[k++] = member;
        }
    }
    return make_alt(c, ids, k);
}

static int compile_checked(compiler *c, const cJSON *s) {
    const cJSON *f;
    cJSON_ArrayForEach(f, s) {
        if (!listed(f->string, k_supported) && !listed(f->string, k_ignored))
            return qlm_errorf("'%.64s' at %s is not supported", f->string, c->path);
    }
    const cJSON *any_of = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum"), *co = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (any_of) return compile_any_of(c, s, any_of);
    if (en || co) return compile_values(c, s, en, co);
    unsigned types;
    return parse_types(c, s, &types) != 0 ? -1 : compile_types(c, s, types);
}

static int compile(compiler *c, const cJSON *s) {
    if (cJSON_IsTrue(s)) return any_node(c);
    if (!cJSON_IsObject(s)) return qlm_errorf("the schema at %s must be an object (or true)", c->path);
    if (c->depth == MAX_SCHEMA_DEPTH)
        return qlm_errorf("the schema is nested deeper than %d levels at %s", MAX_SCHEMA_DEPTH, c->path);
    c->depth++;
    int id = compile_checked(c, s);
    c->depth--;
    return id;
}

void qlm_json_grammar_free(qlm_json_grammar *g) {
    if (!g) return;
    free(g->nodes);
    free(g->list);
    free(g->trie);
    free(g);
}

qlm_json_grammar *qlm_json_grammar_schema(const cJSON *schema) {
    compiler c = {.path = "#", .path_len = 1, .any = -1, .number = -1, .integer = -1};
    if (!(c.g = calloc(1, sizeof *c.g))) {
        qlm_errorf("out of memory");
        return NULL;
    }
    c.g->string_node = new_node(&c, JN_STRING);
    if (c.g->string_node < 0 || (c.g->root = compile(&c, schema)) < 0) {
        qlm_json_grammar_free(c.g);
        return NULL;
    }
    return c.g;
}

qlm_json_grammar *qlm_json_grammar_object(void) {
    cJSON *s = cJSON_CreateObject();
    qlm_json_grammar *g = s && cJSON_AddStringToObject(s, "type", "object") ? qlm_json_grammar_schema(s) : NULL;
    if (!s) qlm_errorf("out of memory");
    cJSON_Delete(s);
    return g;
}
