/* Private to the JSON constraint (json_schema.c compiles grammars, json_automaton.c steps the
 * automaton, json_mask.c indexes vocabularies and computes token masks). */
#ifndef QLM_JSON_INTERNAL_H
#define QLM_JSON_INTERNAL_H

#include <stdint.h>

#include "json_constraint.h"

enum {
    JSON_MAX_NEST = 32,   /* objects and arrays inside one another */
    JSON_MAX_FRAMES = JSON_MAX_NEST + 2, /* the root, the containers, one scalar */
    JSON_MAX_THREADS = 16, /* alternatives (anyOf) followed at once; more are dropped */
    JSON_MAX_WS = 20,     /* whitespace bytes in a row */
    JSON_MAX_NUMBER = 32, /* bytes of one number */
    JSON_MAX_PROPS = 64,  /* properties of one object schema (a bit each) */
};

typedef enum {
    JN_OBJECT,   /* props[first..first+count), or (count 0) any keys whose values are node child */
    JN_ARRAY,    /* items: child */
    JN_STRING,
    JN_NUMBER,
    JN_INTEGER,
    JN_LITERALS, /* one of the byte strings of the trie at root (enum, const, true/false/null) */
    JN_ALT,      /* one of alts[first..first+count) (anyOf, a list of types); never nested */
} json_kind;

typedef struct {
    json_kind kind;
    int first, count;
    int child;               /* -1: none (an object that takes no key outside its properties) */
    int root;                /* JN_LITERALS: the values' trie; JN_OBJECT: the keys' trie */
    int min_items, max_items; /* max -1: unbounded */
    uint64_t required;       /* JN_OBJECT: bit i for props[first + i] */
} json_node;

/* A node of a trie of byte strings: children are a sibling list. label >= 0 marks the end of a
 * string (a property's index in its object's key trie); props: the properties whose keys pass
 * through (key tries). */
typedef struct {
    int child, sibling;
    int label;
    uint8_t byte;
    uint64_t props;
} json_trie;

struct qlm_json_grammar {
    json_node *nodes;
    int n_nodes, cap_nodes;
    int *list; /* alternatives of JN_ALT and property values of JN_OBJECT */
    int n_list, cap_list;
    json_trie *trie;
    int n_trie, cap_trie;
    int root;        /* the document's node */
    int string_node; /* a string of any content (the keys of objects without properties) */
};

/* One frame of a thread's stack. Fields by kind: containers keep their whitespace run in ws;
 * objects a = the first property still allowed, b = the key trie node (while in a key) or the
 * property whose value follows; arrays a = items begun; strings a = \u digits (| JSON_LOW when a
 * low surrogate must follow) or the UTF-8 bytes still due, b = the \u value so far or the range of
 * the next UTF-8 byte (lo << 8 | hi); numbers a = bytes so far; literals b = trie node. The root
 * frame (index 0) holds the document's value node. */
typedef struct {
    uint16_t node;
    uint8_t phase, ws;
    uint16_t a, b;
} json_frame;

typedef struct {
    uint8_t depth;
    json_frame f[JSON_MAX_FRAMES];
} json_thread;

/* The automaton's state: the stacks of the alternatives still alive (no two equal). */
typedef struct {
    int n;
    json_thread t[JSON_MAX_THREADS];
} json_state;

/* json_automaton.c */
void json_state_start(const qlm_json_grammar *g, json_state *s);
/* The state after byte c: 1, or 0 when no thread takes it (out is then empty). */
int json_state_step(const qlm_json_grammar *g, const json_state *in, unsigned char c, json_state *out);
int json_state_complete(const qlm_json_grammar *g, const json_state *s);
int json_state_done(const json_state *s);
/* Whether thread t is inside a string of any content, where every character but the quote,
 * backslash and control bytes leaves it as it was. */
int json_thread_in_free_string(const qlm_json_grammar *g, const json_thread *t);
void json_thread_copy(json_thread *dst, const json_thread *src);

#endif
