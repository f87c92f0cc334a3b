/* An interpreter for the subset of Jinja2 that Hugging Face chat templates are written in, with
 * the semantics transformers' apply_chat_template gives them: jinja2's sandboxed environment with
 * trim_blocks, lstrip_blocks and the loop controls, the globals raise_exception, strftime_now,
 * namespace, dict and range, and transformers' tojson. Templates come from model files, so the
 * source is untrusted: parsing never crashes, and a render is bounded in output, memory, loop
 * iterations, work and depth, each limit failing with its own message.
 *
 * Every byte of the output carries a mark: text from the template (its literals, bos_token, ...)
 * is trusted, text that came from an untrusted input string (what a message says) is not, through
 * concatenation, slicing, filters and methods, so the tokenizer never reads a control token typed
 * into a message.
 *
 * Errors: "chat template line L, column C: message". What qlm refuses (Markup strings, template
 * inheritance, imports, a few rarely used filters) fails with a message naming it, never with
 * other output. */
#ifndef QLM_JINJA_H
#define QLM_JINJA_H

#include <stddef.h>
#include <time.h>

#include "marked_text.h"

typedef struct qlm_jinja qlm_jinja;

/* Parses src[0..len); *out is freed with qlm_jinja_free. -1 with the error's line and column. */
int qlm_jinja_parse(const char *src, size_t len, qlm_jinja **out);
void qlm_jinja_free(qlm_jinja *t);

/* A variable passed to a render, built by the caller in its own memory (nothing is copied). */
typedef enum {
    QLM_JINJA_NONE,
    QLM_JINJA_BOOL,
    QLM_JINJA_INT,
    QLM_JINJA_FLOAT,
    QLM_JINJA_STRING,
    QLM_JINJA_LIST,
    QLM_JINJA_DICT,
} qlm_jinja_type;

typedef struct qlm_jinja_input {
    qlm_jinja_type type;
    const char *key; /* the entry's key inside a DICT (and the variable's name at the top level) */
    long long i;     /* BOOL, INT */
    double f;        /* FLOAT */
    const char *s;   /* STRING: s[0..len) */
    size_t len;
    int untrusted; /* STRING: what a user or a message said */
    const struct qlm_jinja_input *items; /* LIST items, DICT entries */
    int n;
} qlm_jinja_input;

typedef struct {
    size_t max_output;       /* bytes of output */
    size_t max_memory;       /* bytes the render may allocate */
    long max_iterations;     /* loop iterations, all loops together */
    long max_steps;          /* expressions and statements evaluated */
    int max_depth;           /* nesting of evaluation (macro calls included) */
    const struct tm *now;    /* what strftime_now formats; NULL: the local time */
} qlm_jinja_limits;

/* The limits a chat render runs under: 32 MiB of output, 512 MiB of memory, a million loop
 * iterations, 50 million steps (a hostile template stops within a few seconds), depth 500
 * (a few hundred KiB of stack). A real chat template uses a small fraction of each. */
qlm_jinja_limits qlm_jinja_default_limits(void);

/* Renders t with the n variables vars (each with its key), under lim (NULL: the defaults), into
 * *out (free with qlm_marked_free; left empty on failure). */
int qlm_jinja_render(const qlm_jinja *t, const qlm_jinja_input *vars, int n, const qlm_jinja_limits *lim,
                     qlm_marked_text *out);

#endif
