#include "tensor_store.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../core/error.h"

typedef struct {
    void *addr;
    size_t len; /* 0 for a malloc'd buffer */
} held_region;

struct qlm_tensor_store {
    qlm_tensor_entry *entries;
    int n, cap;
    held_region *held;
    int n_held, cap_held;
};

qlm_tensor_store *qlm_store_new(void) {
    qlm_tensor_store *s = calloc(1, sizeof *s);
    if (!s) qlm_errorf("out of memory");
    return s;
}

void qlm_store_free(qlm_tensor_store *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->entries[i].name);
    for (int i = 0; i < s->n_held; i++) {
        if (s->held[i].len) munmap(s->held[i].addr, s->held[i].len);
        else free(s->held[i].addr);
    }
    free(s->entries);
    free(s->held);
    free(s);
}

static int hold(qlm_tensor_store *s, void *addr, size_t len) {
    if (s->n_held == s->cap_held) {
        int cap = s->cap_held ? 2 * s->cap_held : 16;
        held_region *h = realloc(s->held, (size_t)cap * sizeof *h);
        if (!h) return qlm_errorf("out of memory");
        s->held = h;
        s->cap_held = cap;
    }
    s->held[s->n_held++] = (held_region){addr, len};
    return 0;
}

int qlm_store_keep_mapping(qlm_tensor_store *s, void *addr, size_t len) { return hold(s, addr, len ? len : 1); }

int qlm_store_keep_buffer(qlm_tensor_store *s, void *buf) { return hold(s, buf, 0); }

qlm_tensor_entry *qlm_store_add(qlm_tensor_store *s, const char *name, qlm_dtype dtype, int ndim,
                                const int64_t *shape, const void *data, size_t nbytes) {
    if (ndim < 0 || ndim > QLM_MAX_DIMS) {
        qlm_errorf("tensor %s: %d dimensions (at most %d supported)", name, ndim, QLM_MAX_DIMS);
        return NULL;
    }
    if (qlm_store_find(s, name)) {
        qlm_errorf("tensor %s appears twice", name);
        return NULL;
    }
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        qlm_tensor_entry *e = realloc(s->entries, (size_t)cap * sizeof *e);
        if (!e) {
            qlm_errorf("out of memory");
            return NULL;
        }
        s->entries = e;
        s->cap = cap;
    }
    qlm_tensor_entry *e = &s->entries[s->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name) {
        qlm_errorf("out of memory");
        return NULL;
    }
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->data = data;
    e->nbytes = nbytes;
    e->scale = 1.0f;
    s->n++;
    return e;
}

qlm_tensor_entry *qlm_store_add_owned(qlm_tensor_store *s, const char *name, qlm_dtype dtype,
                                      int ndim, const int64_t *shape, void **data_out) {
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] > 0 && numel > INT64_MAX / 8 / shape[i])) {
            qlm_errorf("tensor %s: invalid shape", name);
            return NULL;
        }
        numel *= shape[i];
    }
    size_t nbytes = (size_t)numel * qlm_dtype_size(dtype);
    void *buf = NULL;
    if (posix_memalign(&buf, 64, nbytes ? nbytes : 64) != 0) {
        qlm_errorf("tensor %s: out of memory allocating %zu bytes", name, nbytes);
        return NULL;
    }
    if (hold(s, buf, 0) != 0) {
        free(buf);
        return NULL;
    }
    qlm_tensor_entry *e = qlm_store_add(s, name, dtype, ndim, shape, buf, nbytes);
    if (e && data_out) *data_out = buf;
    return e;
}

const qlm_tensor_entry *qlm_store_find(const qlm_tensor_store *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->entries[i].name, name) == 0) return &s->entries[i];
    return NULL;
}

int qlm_store_count(const qlm_tensor_store *s) { return s->n; }

const qlm_tensor_entry *qlm_store_at(const qlm_tensor_store *s, int i) {
    return i >= 0 && i < s->n ? &s->entries[i] : NULL;
}

int qlm_store_remove(qlm_tensor_store *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->entries[i].name, name) == 0) {
            free(s->entries[i].name);
            memmove(&s->entries[i], &s->entries[i + 1], (size_t)(s->n - i - 1) * sizeof s->entries[0]);
            s->n--;
            return 0;
        }
    return -1;
}

int64_t qlm_entry_numel(const qlm_tensor_entry *e) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
    return n;
}
