#include "tensor_store.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "error.h"

typedef struct {
    void *addr;
    size_t len; /* a mapping's length, an owned buffer's size (0: unknown) */
    int owned;  /* malloc'd: freed, not unmapped */
} held_region;

struct qlm_tensor_store {
    qlm_tensor_entry *entries;
    int n, cap;
    held_region *held;
    int n_held, cap_held;
    int read_once; /* qlm_store_read_once */
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
        if (s->held[i].owned) free(s->held[i].addr);
        else munmap(s->held[i].addr, s->held[i].len);
    }
    free(s->entries);
    free(s->held);
    free(s);
}

static int hold(qlm_tensor_store *s, void *addr, size_t len, int owned) {
    if (s->n_held == s->cap_held) {
        int cap = s->cap_held ? 2 * s->cap_held : 16;
        held_region *h = realloc(s->held, (size_t)cap * sizeof *h);
        if (!h) return qlm_errorf("out of memory");
        s->held = h;
        s->cap_held = cap;
    }
    s->held[s->n_held++] = (held_region){addr, len, owned};
    return 0;
}

int qlm_store_keep_mapping(qlm_tensor_store *s, void *addr, size_t len) { return hold(s, addr, len ? len : 1, 0); }

void qlm_store_read_once(qlm_tensor_store *s) { s->read_once = 1; }

static int points_into(const qlm_tensor_entry *e, uintptr_t lo, uintptr_t hi) {
    uintptr_t d = (uintptr_t)e->data, r = (uintptr_t)e->row_scales;
    return (d && d >= lo && d < hi) || (r && r >= lo && r < hi);
}

/* Read once: e's data is gone for good, and the owned buffer it lay in is freed once no other
 * entry points into it. The store's own bookkeeping, hence the casts. */
static void consume(const qlm_tensor_store *cs, const qlm_tensor_entry *e) {
    qlm_tensor_store *s = (qlm_tensor_store *)cs;
    uintptr_t d = (uintptr_t)e->data;
    qlm_tensor_entry *me = (qlm_tensor_entry *)e;
    me->data = NULL;
    me->row_scales = NULL;
    for (int i = 0; i < s->n_held; i++) {
        held_region *h = &s->held[i];
        uintptr_t lo = (uintptr_t)h->addr, hi = lo + h->len;
        if (!h->owned || !h->len || d < lo || d >= hi) continue;
        for (int j = 0; j < s->n; j++)
            if (points_into(&s->entries[j], lo, hi)) return;
        free(h->addr);
        *h = (held_region){NULL, 0, 1};
        return;
    }
}

/* Gives back the whole pages inside [lo, hi) where they lie in a mapping the store keeps. */
static void release_range(const qlm_tensor_store *s, uintptr_t lo, uintptr_t hi) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < s->n_held; i++) {
        uintptr_t a = (uintptr_t)s->held[i].addr;
        if (s->held[i].owned || lo < a || hi > a + s->held[i].len) continue;
        uintptr_t first = (lo + page - 1) & ~(page - 1), last = hi & ~(page - 1);
        if (last > first) madvise((void *)first, last - first, MADV_DONTNEED);
        break;
    }
}

void qlm_store_release(const qlm_tensor_store *s, const qlm_tensor_entry *e) {
    release_range(s, (uintptr_t)e->data, (uintptr_t)e->data + e->nbytes);
    if (s->read_once) consume(s, e);
}

void qlm_store_release_rows(const qlm_tensor_store *s, const qlm_tensor_entry *e, int64_t rows) {
    if (e->ndim < 1 || e->shape[0] <= 0 || rows <= 0) return;
    const size_t row_bytes = e->nbytes / (size_t)e->shape[0];
    release_range(s, (uintptr_t)e->data, (uintptr_t)e->data + (size_t)rows * row_bytes);
}

int qlm_store_keep_buffer(qlm_tensor_store *s, void *buf) { return hold(s, buf, 0, 1); }

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

/* Allocates nbytes (64-byte aligned) that the store frees, and an entry for them. */
static qlm_tensor_entry *add_owned_bytes(qlm_tensor_store *s, const char *name, qlm_dtype dtype, int ndim,
                                         const int64_t *shape, size_t nbytes, void **data_out) {
    void *buf = NULL;
    if (posix_memalign(&buf, 64, nbytes ? nbytes : 64) != 0) {
        qlm_errorf("tensor %s: out of memory allocating %zu bytes", name, nbytes);
        return NULL;
    }
    if (hold(s, buf, nbytes, 1) != 0) {
        free(buf);
        return NULL;
    }
    qlm_tensor_entry *e = qlm_store_add(s, name, dtype, ndim, shape, buf, nbytes);
    if (e && data_out) *data_out = buf;
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
    return add_owned_bytes(s, name, dtype, ndim, shape, (size_t)numel * qlm_dtype_size(dtype), data_out);
}

qlm_tensor_entry *qlm_store_add_owned_blocks(qlm_tensor_store *s, const char *name, qlm_dtype dtype, int group,
                                             int64_t rows, int64_t cols, void **data_out) {
    if (!qlm_dtype_is_block(dtype) || !qlm_group_valid(group) || rows < 0 || cols < 0 || cols % group ||
        rows > INT32_MAX || cols > INT32_MAX) {
        qlm_errorf("tensor %s: invalid %s shape [%lld, %lld] for groups of %d", name, qlm_dtype_name(dtype),
                   (long long)rows, (long long)cols, group);
        return NULL;
    }
    int64_t shape[2] = {rows, cols};
    qlm_tensor_entry *e =
        add_owned_bytes(s, name, dtype, 2, shape, (size_t)rows * qlm_dtype_row_bytes(dtype, (long)cols, group), data_out);
    if (e) e->group = group;
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

/* One clone per instruction set (picked at load time): the check reads every byte of a 16- or
 * 32-bit file once, and the baseline's 16-byte vectors made it slower than the reads. */
#define PER_ISA __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))

/* Whether the exponent bits of any of v[0, n) are all ones (NaN or Inf); a branch-free loop the
 * compiler vectorizes. */
PER_ISA static int any_exp_ones_32(const uint32_t *v, int64_t n) {
    uint32_t hit = 0;
    for (int64_t i = 0; i < n; i++) hit |= (v[i] & 0x7F800000u) == 0x7F800000u;
    return hit != 0;
}

PER_ISA static int any_exp_ones_16(const uint16_t *v, int64_t n, uint16_t exp) {
    uint16_t hit = 0;
    for (int64_t i = 0; i < n; i++) hit |= (uint16_t)((v[i] & exp) == exp);
    return hit != 0;
}

/* The first element of e[from, to) that is a NaN or an Inf, or -1. */
static int64_t first_non_finite(const qlm_tensor_entry *e, int64_t from, int64_t to) {
    int wide = e->dtype == QLM_F32;
    uint16_t exp = e->dtype == QLM_F16 ? 0x7C00u : 0x7F80u;
    if (e->dtype != QLM_F32 && e->dtype != QLM_F16 && e->dtype != QLM_BF16) return -1;
    const uint32_t *v32 = e->data;
    const uint16_t *v16 = e->data;
    if (wide ? !any_exp_ones_32(v32 + from, to - from) : !any_exp_ones_16(v16 + from, to - from, exp)) return -1;
    for (int64_t i = from; i < to; i++)
        if (wide ? any_exp_ones_32(v32 + i, 1) : any_exp_ones_16(v16 + i, 1, exp)) return i;
    return -1;
}

static int scale_ok(float s) { return isfinite(s) && s > 0 && s <= 1e30f; }

/* The F16 scale (and Q4_1's offset) at the head of every block; threads take runs of blocks (the
 * pass touches every page of the file). */
static int check_blocks(const qlm_tensor_entry *e) {
    enum { CHUNK = 1 << 14 };
    const size_t bb = qlm_dtype_block_bytes(e->dtype, e->group);
    const int64_t blocks = bb ? (int64_t)(e->nbytes / bb) : 0;
    const int heads = e->dtype == QLM_Q4_1 ? 2 : 1;
    const uint8_t *p = e->data;
    int64_t bad = INT64_MAX;
#pragma omp parallel for schedule(dynamic) reduction(min : bad) if (blocks > CHUNK)
    for (int64_t c = 0; c < (blocks + CHUNK - 1) / CHUNK; c++)
        for (int64_t b = c * CHUNK; b < blocks && b < c * CHUNK + CHUNK && b * heads < bad; b++)
            for (int h = 0; h < heads; h++) {
                uint16_t v = (uint16_t)(p[b * bb + 2 * h] | p[b * bb + 2 * h + 1] << 8);
                if ((v & 0x7C00u) == 0x7C00u && b * heads + h < bad) bad = b * heads + h;
            }
    if (bad == INT64_MAX) return 0;
    return qlm_errorf("tensor %s: the %s of block %lld is NaN or Inf", e->name, bad % heads ? "offset" : "scale",
                      (long long)(bad / heads));
}

int qlm_entry_check_values(const qlm_tensor_entry *e) {
    if (qlm_dtype_is_block(e->dtype)) return check_blocks(e);
    if (e->dtype == QLM_I8) {
        int64_t rows = e->ndim >= 1 ? e->shape[0] : 1;
        if (!e->row_scales && !scale_ok(e->scale))
            return qlm_errorf("tensor %s: INT8 scale %g is not in (0, 1e30]", e->name, (double)e->scale);
        for (int64_t r = 0; e->row_scales && r < rows; r++)
            if (!scale_ok(e->row_scales[r]))
                return qlm_errorf("tensor %s: INT8 scale %g of row %lld is not in (0, 1e30]", e->name,
                                  (double)e->row_scales[r], (long long)r);
        return 0;
    }
    enum { CHUNK = 1 << 16 };
    int64_t n = qlm_entry_numel(e), bad = INT64_MAX;
#pragma omp parallel for schedule(dynamic) reduction(min : bad) if (n > CHUNK)
    for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++) {
        int64_t at = first_non_finite(e, c * CHUNK, c * CHUNK + CHUNK < n ? c * CHUNK + CHUNK : n);
        if (at >= 0 && at < bad) bad = at;
    }
    if (bad == INT64_MAX) return 0;
    return qlm_errorf("tensor %s holds NaN or Inf (element %lld of %lld)", e->name, (long long)bad, (long long)n);
}

int qlm_store_check_values(const qlm_tensor_store *s) {
    for (int i = 0; i < qlm_store_count(s); i++)
        if (qlm_entry_check_values(qlm_store_at(s, i)) != 0) return -1;
    return 0;
}
