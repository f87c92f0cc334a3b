/* GGUF v2/v3, little-endian:
 *   "GGUF", u32 version, u64 tensor_count, u64 kv_count,
 *   kv_count x (string key, u32 value_type, value),
 *   tensor_count x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset),
 *   padding to general.alignment (default 32), then the data section; tensor offsets are
 *   relative to it and multiples of the alignment.
 * A string is a u64 byte length then the bytes (no NUL). An array value is u32 element type,
 * u64 count, then the elements (arrays may nest). ne[0] is the innermost (contiguous) dimension,
 * so a [rows, cols] matrix is stored as ne = {cols, rows}.
 * The file is untrusted: every length, count and offset is checked against the mapping before
 * it is used, and counts are bounded by what the remaining bytes could hold. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/backend.h"
#include "../core/error.h"
#include "fused_weights.h"
#include "gguf_dequant.h"
#include "../quant/block_quant.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "GGUF data is read as little-endian; big-endian hosts are not supported"
#endif

#define GGUF_MAX_KV (1 << 16)
#define GGUF_MAX_TENSORS (1 << 16)
#define GGUF_MAX_KEY 65535
#define GGUF_MAX_NAME 256
#define GGUF_MAX_DEPTH 8
#define GGUF_MAX_ALIGN (1u << 30)
#define GGUF_DEFAULT_ALIGN 32
/* Smallest possible encodings, used to bound counts by the bytes left in the file. */
#define GGUF_MIN_KV_BYTES 14     /* key length + 1 key byte + type + 1 value byte */
#define GGUF_MIN_TENSOR_BYTES 33 /* name length + 1 name byte + n_dims + 1 dim + type + offset */

enum {
    VT_U8, VT_I8, VT_U16, VT_I16, VT_U32, VT_I32, VT_F32, VT_BOOL, VT_STR, VT_ARR, VT_U64, VT_I64, VT_F64,
    VT_COUNT
};

static const uint8_t VT_SIZE[VT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
static const char *const VT_NAME[VT_COUNT] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                              "bool", "string", "array", "u64", "i64", "f64"};

/* A name and the index of its entry, for sorted lookups. */
typedef struct {
    const char *name;
    int idx;
} name_ref;

typedef struct {
    char *key;
    uint32_t type;
    const uint8_t *data; /* fixed-size scalar, or first element of an array, in the mapping */
    char *str;           /* VT_STR value, NUL-terminated copy */
    uint32_t elem;       /* VT_ARR element type */
    uint64_t count;      /* VT_ARR element count */
    char **strs;         /* VT_ARR of strings: count NUL-terminated copies (one block with strs) */
} gguf_kv;

typedef struct {
    char *name;
    int ndim;
    int64_t ne[4];
    uint32_t type_id;
    const qlm_ggml_type *type;
    uint64_t offset, nbytes;
} gguf_tensor;

struct qlm_gguf {
    char *path;
    const uint8_t *map;
    size_t size;
    gguf_kv *kvs;
    int n_kv;
    name_ref *kv_sorted; /* kvs ordered by key */
    gguf_tensor *tensors;
    int n_tensors;
    name_ref *t_sorted; /* tensors ordered by name */
    uint64_t data_start;
};

/* ---------- bounded reading ---------- */

typedef struct {
    const uint8_t *p;
    uint64_t size, pos;
} cursor;

static int take(cursor *c, uint64_t n, const uint8_t **out) {
    if (n > c->size - c->pos) {
        qlm_errorf("%llu bytes needed at offset %llu run past the end of the file (%llu bytes)",
                   (unsigned long long)n, (unsigned long long)c->pos, (unsigned long long)c->size);
        return -1;
    }
    *out = c->p + c->pos;
    c->pos += n;
    return 0;
}

static uint64_t remaining(const cursor *c) { return c->size - c->pos; }

static uint32_t le32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static int read_u32(cursor *c, uint32_t *v) {
    const uint8_t *p;
    if (take(c, 4, &p) != 0) return -1;
    *v = le32(p);
    return 0;
}

static int read_u64(cursor *c, uint64_t *v) {
    const uint8_t *p;
    if (take(c, 8, &p) != 0) return -1;
    *v = le64(p);
    return 0;
}

static int read_str(cursor *c, uint64_t max_len, const uint8_t **s, uint64_t *len) {
    if (read_u64(c, len) != 0) return -1;
    if (*len > max_len) return qlm_errorf("string length %llu exceeds the limit of %llu", (unsigned long long)*len,
                                          (unsigned long long)max_len);
    if (*len > remaining(c))
        return qlm_errorf("string length %llu at offset %llu runs past the end of the file", (unsigned long long)*len,
                          (unsigned long long)(c->pos - 8));
    return take(c, *len, s);
}

static char *copy_str(const uint8_t *s, uint64_t len) {
    char *out = malloc((size_t)len + 1);
    if (!out) {
        qlm_errorf("out of memory copying a %llu-byte string", (unsigned long long)len);
        return NULL;
    }
    memcpy(out, s, (size_t)len);
    out[len] = 0;
    return out;
}

/* ---------- metadata values ---------- */

static int check_bools(const uint8_t *p, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (p[i] > 1) return qlm_errorf("bool value %u is neither 0 nor 1", p[i]);
    return 0;
}

static int check_type(uint32_t t) {
    if (t >= VT_COUNT) return qlm_errorf("unknown value type %u", t);
    return 0;
}

/* Reads an array's element type and count, checking the count against the bytes left. */
static int array_head(cursor *c, uint32_t *elem, uint64_t *count) {
    if (read_u32(c, elem) != 0 || check_type(*elem) != 0 || read_u64(c, count) != 0) return -1;
    uint64_t min = *elem == VT_STR ? 8 : *elem == VT_ARR ? 12 : VT_SIZE[*elem];
    if (*count > remaining(c) / min)
        return qlm_errorf("array of %llu %s values cannot fit in the %llu bytes left", (unsigned long long)*count,
                          VT_NAME[*elem], (unsigned long long)remaining(c));
    return 0;
}

/* Validates and steps over one value (nested arrays included) without keeping it. */
static int skip_value(cursor *c, uint32_t type, int depth) {
    const uint8_t *p;
    uint64_t len;
    if (type == VT_STR) return read_str(c, UINT64_MAX, &p, &len);
    if (type != VT_ARR) {
        if (take(c, VT_SIZE[type], &p) != 0) return -1;
        return type == VT_BOOL ? check_bools(p, 1) : 0;
    }
    if (depth >= GGUF_MAX_DEPTH) return qlm_errorf("arrays nested deeper than %d levels", GGUF_MAX_DEPTH);
    uint32_t elem;
    uint64_t count;
    if (array_head(c, &elem, &count) != 0) return -1;
    if (elem != VT_STR && elem != VT_ARR) {
        if (take(c, count * VT_SIZE[elem], &p) != 0) return -1;
        return elem == VT_BOOL ? check_bools(p, count) : 0;
    }
    for (uint64_t i = 0; i < count; i++)
        if (skip_value(c, elem, depth + 1) != 0) return -1;
    return 0;
}

/* Copies an array of count strings into one block: count pointers followed by the bytes. */
static int read_str_array(cursor *c, gguf_kv *kv) {
    cursor probe = *c;
    uint64_t total = 0;
    for (uint64_t i = 0; i < kv->count; i++) {
        const uint8_t *s;
        uint64_t len;
        if (read_str(&probe, UINT64_MAX, &s, &len) != 0) return qlm_error_context("element %llu", (unsigned long long)i);
        total += len + 1;
    }
    size_t ptr_bytes = (size_t)kv->count * sizeof(char *);
    kv->strs = malloc(ptr_bytes + (size_t)total + 1);
    if (!kv->strs) return qlm_errorf("out of memory for %llu strings", (unsigned long long)kv->count);
    char *dst = (char *)kv->strs + ptr_bytes;
    for (uint64_t i = 0; i < kv->count; i++) {
        const uint8_t *s;
        uint64_t len;
        if (read_str(c, UINT64_MAX, &s, &len) != 0) return -1;
        memcpy(dst, s, (size_t)len);
        dst[len] = 0;
        kv->strs[i] = dst;
        dst += len + 1;
    }
    return 0;
}

static int read_value(cursor *c, gguf_kv *kv) {
    if (check_type(kv->type) != 0) return -1;
    const uint8_t *p;
    uint64_t len;
    if (kv->type == VT_STR) {
        if (read_str(c, UINT64_MAX, &p, &len) != 0) return -1;
        kv->str = copy_str(p, len);
        return kv->str ? 0 : -1;
    }
    if (kv->type != VT_ARR) {
        if (take(c, VT_SIZE[kv->type], &kv->data) != 0) return -1;
        return kv->type == VT_BOOL ? check_bools(kv->data, 1) : 0;
    }
    if (array_head(c, &kv->elem, &kv->count) != 0) return -1;
    if (kv->elem == VT_STR) return read_str_array(c, kv);
    kv->data = c->p + c->pos;
    if (kv->elem == VT_ARR) {
        for (uint64_t i = 0; i < kv->count; i++)
            if (skip_value(c, VT_ARR, 1) != 0) return qlm_error_context("element %llu", (unsigned long long)i);
        return 0;
    }
    if (take(c, kv->count * VT_SIZE[kv->elem], &p) != 0) return -1;
    return kv->elem == VT_BOOL ? check_bools(p, kv->count) : 0;
}

/* A number of type t at p, as an integer (is_int) or a double. Unsigned 64-bit values above
 * INT64_MAX are reported through *too_big. */
typedef struct {
    int is_int, too_big;
    long long i;
    double f;
} number;

static number number_at(uint32_t t, const uint8_t *p) {
    number n = {1, 0, 0, 0};
    switch (t) {
    case VT_U8: n.i = p[0]; break;
    case VT_I8: n.i = (int8_t)p[0]; break;
    case VT_U16: n.i = (uint16_t)(p[0] | p[1] << 8); break;
    case VT_I16: n.i = (int16_t)(uint16_t)(p[0] | p[1] << 8); break;
    case VT_U32: n.i = le32(p); break;
    case VT_I32: n.i = (int32_t)le32(p); break;
    case VT_BOOL: n.i = p[0]; break;
    case VT_U64: {
        uint64_t u = le64(p);
        n.too_big = u > (uint64_t)LLONG_MAX;
        n.i = n.too_big ? LLONG_MAX : (long long)u;
        n.f = (double)u;
        return n;
    }
    case VT_I64: n.i = (long long)le64(p); break;
    case VT_F32: {
        float f;
        memcpy(&f, p, 4);
        n.is_int = 0;
        n.f = f;
        return n;
    }
    default: {
        double d;
        memcpy(&d, p, 8);
        n.is_int = 0;
        n.f = d;
        return n;
    }
    }
    n.f = (double)n.i;
    return n;
}

static int is_integer_type(uint32_t t) { return t <= VT_I32 || t == VT_U64 || t == VT_I64; }

static int is_number_type(uint32_t t) { return is_integer_type(t) || t == VT_F32 || t == VT_F64; }

/* ---------- lookups ---------- */

static int cmp_ref(const void *a, const void *b) {
    return strcmp(((const name_ref *)a)->name, ((const name_ref *)b)->name);
}

static int find_ref(const name_ref *refs, int n, const char *name) {
    name_ref key = {name, 0};
    const name_ref *r = n > 0 ? bsearch(&key, refs, (size_t)n, sizeof key, cmp_ref) : NULL;
    return r ? r->idx : -1;
}

static const gguf_kv *find_kv(const qlm_gguf *g, const char *key) {
    int i = find_ref(g->kv_sorted, g->n_kv, key);
    return i >= 0 ? &g->kvs[i] : NULL;
}

static const gguf_tensor *find_tensor(const qlm_gguf *g, const char *name) {
    int i = find_ref(g->t_sorted, g->n_tensors, name);
    return i >= 0 ? &g->tensors[i] : NULL;
}

/* Sorts refs (already filled) by name and rejects duplicates. */
static int sort_refs(const qlm_gguf *g, name_ref *refs, int n, const char *what) {
    qsort(refs, (size_t)n, sizeof *refs, cmp_ref);
    for (int i = 0; i + 1 < n; i++)
        if (strcmp(refs[i].name, refs[i + 1].name) == 0)
            return qlm_errorf("%s: %s %s appears twice", g->path, what, refs[i].name);
    return 0;
}

/* ---------- header, metadata and tensor infos ---------- */

static int read_counts(qlm_gguf *g, cursor *c, uint64_t *n_tensors, uint64_t *n_kv) {
    const uint8_t *magic;
    uint32_t version;
    if (take(c, 4, &magic) != 0 || memcmp(magic, "GGUF", 4) != 0)
        return qlm_errorf("%s: not a GGUF file (bad magic)", g->path);
    if (read_u32(c, &version) != 0) return qlm_error_context("%s: version", g->path);
    if (version == 1) return qlm_errorf("%s: GGUF version 1 is not supported (only 2 and 3)", g->path);
    if (version != 2 && version != 3) {
        if ((version & 0xffff) == 0 && version != 0)
            return qlm_errorf("%s: big-endian GGUF files are not supported", g->path);
        return qlm_errorf("%s: unsupported GGUF version %u (only 2 and 3)", g->path, version);
    }
    if (read_u64(c, n_tensors) != 0) return qlm_error_context("%s: tensor count", g->path);
    if (read_u64(c, n_kv) != 0) return qlm_error_context("%s: metadata count", g->path);
    if (*n_kv > GGUF_MAX_KV || *n_kv > remaining(c) / GGUF_MIN_KV_BYTES)
        return qlm_errorf("%s: header claims %llu metadata entries, more than the file can hold", g->path,
                          (unsigned long long)*n_kv);
    if (*n_tensors > GGUF_MAX_TENSORS || *n_tensors > remaining(c) / GGUF_MIN_TENSOR_BYTES)
        return qlm_errorf("%s: header claims %llu tensors, more than the file can hold", g->path,
                          (unsigned long long)*n_tensors);
    return 0;
}

static int read_kvs(qlm_gguf *g, cursor *c, uint64_t n) {
    g->kvs = calloc((size_t)(n ? n : 1), sizeof *g->kvs);
    g->kv_sorted = calloc((size_t)(n ? n : 1), sizeof *g->kv_sorted);
    if (!g->kvs || !g->kv_sorted) return qlm_errorf("out of memory");
    for (uint64_t i = 0; i < n; i++) {
        gguf_kv *kv = &g->kvs[i];
        const uint8_t *key;
        uint64_t len;
        if (read_str(c, GGUF_MAX_KEY, &key, &len) != 0)
            return qlm_error_context("%s: metadata entry %llu: key", g->path, (unsigned long long)i);
        if (len == 0 || memchr(key, 0, (size_t)len))
            return qlm_errorf("%s: metadata entry %llu: empty key or key with a NUL byte", g->path,
                              (unsigned long long)i);
        kv->key = copy_str(key, len);
        if (!kv->key) return -1;
        g->kv_sorted[i] = (name_ref){kv->key, (int)i};
        g->n_kv++;
        if (read_u32(c, &kv->type) != 0 || read_value(c, kv) != 0)
            return qlm_error_context("%s: metadata key %s", g->path, kv->key);
    }
    return sort_refs(g, g->kv_sorted, g->n_kv, "metadata key");
}

static int read_tensor_info(cursor *c, gguf_tensor *t) {
    uint32_t ndim;
    if (read_u32(c, &ndim) != 0) return -1;
    if (ndim < 1 || ndim > 4) return qlm_errorf("%u dimensions (1 to 4 supported)", ndim);
    t->ndim = (int)ndim;
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t ne;
        if (read_u64(c, &ne) != 0) return -1;
        if (ne < 1 || ne > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, (int64_t)ne, &numel))
            return qlm_errorf("dimension %d = %llu is zero or makes the size overflow", d, (unsigned long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    if (read_u32(c, &t->type_id) != 0 || read_u64(c, &t->offset) != 0) return -1;
    t->type = qlm_ggml_type_info(t->type_id);
    if (!t->type) return qlm_errorf("unknown tensor type id %u", t->type_id);
    if (t->ne[0] % t->type->block != 0)
        return qlm_errorf("ne[0] = %lld is not a multiple of the %s block size %u", (long long)t->ne[0],
                          t->type->name, t->type->block);
    uint64_t blocks = (uint64_t)(numel / t->type->block);
    if (__builtin_mul_overflow(blocks, (uint64_t)t->type->bytes, &t->nbytes))
        return qlm_errorf("byte size overflows");
    return 0;
}

static int read_tensors(qlm_gguf *g, cursor *c, uint64_t n) {
    g->tensors = calloc((size_t)(n ? n : 1), sizeof *g->tensors);
    g->t_sorted = calloc((size_t)(n ? n : 1), sizeof *g->t_sorted);
    if (!g->tensors || !g->t_sorted) return qlm_errorf("out of memory");
    for (uint64_t i = 0; i < n; i++) {
        gguf_tensor *t = &g->tensors[i];
        const uint8_t *name;
        uint64_t len;
        if (read_str(c, GGUF_MAX_NAME, &name, &len) != 0)
            return qlm_error_context("%s: tensor info %llu: name", g->path, (unsigned long long)i);
        if (len == 0 || memchr(name, 0, (size_t)len))
            return qlm_errorf("%s: tensor info %llu: empty name or name with a NUL byte", g->path,
                              (unsigned long long)i);
        t->name = copy_str(name, len);
        if (!t->name) return -1;
        g->t_sorted[i] = (name_ref){t->name, (int)i};
        g->n_tensors++;
        if (read_tensor_info(c, t) != 0) return qlm_error_context("%s: tensor %s", g->path, t->name);
    }
    return sort_refs(g, g->t_sorted, g->n_tensors, "tensor");
}

static int read_alignment(const qlm_gguf *g, uint64_t *align) {
    *align = GGUF_DEFAULT_ALIGN;
    const gguf_kv *kv = find_kv(g, "general.alignment");
    if (!kv) return 0;
    if (kv->type != VT_U32) return qlm_errorf("%s: general.alignment must be a u32", g->path);
    *align = le32(kv->data);
    if (*align == 0 || (*align & (*align - 1)) != 0 || *align > GGUF_MAX_ALIGN)
        return qlm_errorf("%s: general.alignment = %llu is not a power of two up to 2^30", g->path,
                          (unsigned long long)*align);
    return 0;
}

static int check_data(qlm_gguf *g, uint64_t header_end) {
    uint64_t align;
    if (read_alignment(g, &align) != 0) return -1;
    g->data_start = (header_end + align - 1) / align * align;
    if (g->n_tensors > 0 && g->data_start > g->size)
        return qlm_errorf("%s: data section at offset %llu starts past the end of the file (%zu bytes)", g->path,
                          (unsigned long long)g->data_start, g->size);
    uint64_t data_size = g->n_tensors > 0 ? g->size - g->data_start : 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (t->offset % align != 0)
            return qlm_errorf("%s: tensor %s: offset %llu is not a multiple of the alignment %llu", g->path, t->name,
                              (unsigned long long)t->offset, (unsigned long long)align);
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return qlm_errorf("%s: tensor %s: data (%llu bytes at offset %llu) runs past the end of the file",
                              g->path, t->name, (unsigned long long)t->nbytes, (unsigned long long)t->offset);
    }
    return 0;
}

/* Maps the file read-only into *map, checking it is a regular file of at least min bytes. */
static int map_path(const char *path, size_t min, const uint8_t **map, size_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return qlm_errorf("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return qlm_errorf("%s: not a regular file", path);
    }
    if ((size_t)st.st_size < min) {
        close(fd);
        return qlm_errorf("%s: file too short (%lld bytes) for a GGUF header", path, (long long)st.st_size);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return qlm_errorf("%s: mmap failed: %s", path, strerror(errno));
    *map = m;
    *size = (size_t)st.st_size;
    return 0;
}

static int map_file(qlm_gguf *g) { return map_path(g->path, 24, &g->map, &g->size); }

/* A mapping of the file that the store keeps (and unmaps when freed), for the tensors it holds in
 * place: its own, so that the store and g may be freed in either order. The page cache backs both
 * mappings once. */
static const uint8_t *map_for_store(const qlm_gguf *g, qlm_tensor_store *store) {
    const uint8_t *m;
    size_t size;
    if (map_path(g->path, 24, &m, &size) != 0) return NULL;
    if (size != g->size) {
        munmap((void *)m, size);
        qlm_errorf("%s: the file changed while it was being read", g->path);
        return NULL;
    }
    if (qlm_store_keep_mapping(store, (void *)m, size) != 0) {
        munmap((void *)m, size);
        return NULL;
    }
    return m;
}

qlm_gguf *qlm_gguf_open(const char *path) {
    qlm_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        qlm_errorf("out of memory");
        return NULL;
    }
    uint64_t n_tensors = 0, n_kv = 0;
    cursor c = {0};
    int rc = map_file(g);
    if (rc == 0) {
        c = (cursor){g->map, g->size, 0};
        rc = read_counts(g, &c, &n_tensors, &n_kv);
    }
    if (rc == 0) rc = read_kvs(g, &c, n_kv);
    if (rc == 0) rc = read_tensors(g, &c, n_tensors);
    if (rc == 0) rc = check_data(g, c.pos);
    if (rc != 0) {
        qlm_gguf_close(g);
        return NULL;
    }
    return g;
}

void qlm_gguf_close(qlm_gguf *g) {
    if (!g) return;
    for (int i = 0; i < g->n_kv; i++) {
        free(g->kvs[i].key);
        free(g->kvs[i].str);
        free(g->kvs[i].strs);
    }
    for (int i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->kvs);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->t_sorted);
    if (g->map) munmap((void *)g->map, g->size);
    free(g->path);
    free(g);
}

/* ---------- metadata accessors ---------- */

static const gguf_kv *typed_kv(const qlm_gguf *g, const char *key, const char *want, int ok_type(uint32_t)) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv) {
        qlm_errorf("%s: metadata key %s is missing", g->path, key);
        return NULL;
    }
    if (!ok_type(kv->type)) {
        qlm_errorf("%s: metadata key %s is a %s, expected %s", g->path, key, VT_NAME[kv->type], want);
        return NULL;
    }
    return kv;
}

static int is_str_type(uint32_t t) { return t == VT_STR; }
static int is_bool_type(uint32_t t) { return t == VT_BOOL; }
static int is_arr_type(uint32_t t) { return t == VT_ARR; }

int qlm_gguf_get_str(const qlm_gguf *g, const char *key, const char **out) {
    const gguf_kv *kv = typed_kv(g, key, "a string", is_str_type);
    if (!kv) return -1;
    *out = kv->str;
    return 0;
}

int qlm_gguf_get_int(const qlm_gguf *g, const char *key, long long *out) {
    const gguf_kv *kv = typed_kv(g, key, "an integer", is_integer_type);
    if (!kv) return -1;
    number n = number_at(kv->type, kv->data);
    if (n.too_big) return qlm_errorf("%s: metadata key %s: value does not fit in 64-bit signed", g->path, key);
    *out = n.i;
    return 0;
}

int qlm_gguf_get_float(const qlm_gguf *g, const char *key, double *out) {
    const gguf_kv *kv = typed_kv(g, key, "a number", is_number_type);
    if (!kv) return -1;
    *out = number_at(kv->type, kv->data).f;
    return 0;
}

int qlm_gguf_get_bool(const qlm_gguf *g, const char *key, int *out) {
    const gguf_kv *kv = typed_kv(g, key, "a bool", is_bool_type);
    if (!kv) return -1;
    *out = kv->data[0];
    return 0;
}

static const gguf_kv *array_kv(const qlm_gguf *g, const char *key, const char *want, int ok_elem(uint32_t)) {
    const gguf_kv *kv = typed_kv(g, key, "an array", is_arr_type);
    if (!kv) return NULL;
    if (!ok_elem(kv->elem)) {
        qlm_errorf("%s: metadata key %s is an array of %s, expected %s", g->path, key, VT_NAME[kv->elem], want);
        return NULL;
    }
    if (kv->count > INT_MAX) {
        qlm_errorf("%s: metadata key %s: array of %llu elements is too long", g->path, key,
                   (unsigned long long)kv->count);
        return NULL;
    }
    return kv;
}

int qlm_gguf_get_str_array(const qlm_gguf *g, const char *key, const char *const **items, int *n) {
    const gguf_kv *kv = array_kv(g, key, "strings", is_str_type);
    if (!kv) return -1;
    *items = (const char *const *)kv->strs;
    *n = (int)kv->count;
    return 0;
}

int qlm_gguf_get_float_array(const qlm_gguf *g, const char *key, float **out, int *n) {
    const gguf_kv *kv = array_kv(g, key, "numbers", is_number_type);
    if (!kv) return -1;
    float *v = malloc((size_t)(kv->count ? kv->count : 1) * sizeof *v);
    if (!v) return qlm_errorf("out of memory");
    for (uint64_t i = 0; i < kv->count; i++) v[i] = (float)number_at(kv->elem, kv->data + i * VT_SIZE[kv->elem]).f;
    *out = v;
    *n = (int)kv->count;
    return 0;
}

int qlm_gguf_get_int_array(const qlm_gguf *g, const char *key, int **out, int *n) {
    const gguf_kv *kv = array_kv(g, key, "integers", is_integer_type);
    if (!kv) return -1;
    int *v = malloc((size_t)(kv->count ? kv->count : 1) * sizeof *v);
    if (!v) return qlm_errorf("out of memory");
    for (uint64_t i = 0; i < kv->count; i++) {
        number x = number_at(kv->elem, kv->data + i * VT_SIZE[kv->elem]);
        if (x.too_big || x.i < INT_MIN || x.i > INT_MAX) {
            free(v);
            return qlm_errorf("%s: metadata key %s: element %llu does not fit in an int", g->path, key,
                              (unsigned long long)i);
        }
        v[i] = (int)x.i;
    }
    *out = v;
    *n = (int)kv->count;
    return 0;
}

/* ---------- description for `qlm info` ---------- */

typedef struct {
    char *buf;
    size_t cap, len;
} sbuf;

static void sb_printf(sbuf *s, const char *fmt, ...) QLM_PRINTF(2, 3);

static void sb_printf(sbuf *s, const char *fmt, ...) {
    if (s->len + 1 >= s->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(s->buf + s->len, s->cap - s->len, fmt, ap);
    va_end(ap);
    if (n > 0) s->len = s->len + (size_t)n < s->cap ? s->len + (size_t)n : s->cap - 1;
}

/* Drops a UTF-8 sequence left incomplete at the end of the buffer. */
static void sb_trim_utf8(sbuf *s) {
    size_t n = s->len;
    while (n > 0 && ((unsigned char)s->buf[n - 1] & 0xc0) == 0x80) n--;
    if (n > 0 && (unsigned char)s->buf[n - 1] >= 0xc0) n--;
    s->len = n;
    s->buf[n] = 0;
}

/* Quoted, with control characters escaped; ends in "..." when it does not fit. */
static void sb_quoted(sbuf *s, const char *str) {
    sb_printf(s, "\"");
    for (const unsigned char *p = (const unsigned char *)str; *p; p++) {
        if (s->len + 6 >= s->cap) {
            if ((*p & 0xc0) == 0x80) sb_trim_utf8(s);
            sb_printf(s, "...");
            return;
        }
        if (*p == '"' || *p == '\\') sb_printf(s, "\\%c", *p);
        else if (*p == '\n') sb_printf(s, "\\n");
        else if (*p < 0x20) sb_printf(s, "\\x%02x", *p);
        else sb_printf(s, "%c", *p);
    }
    sb_printf(s, "\"");
}

static void sb_number(sbuf *s, uint32_t type, const uint8_t *p) {
    number n = number_at(type, p);
    if (type == VT_BOOL) sb_printf(s, "%s", n.i ? "true" : "false");
    else if (type == VT_U64) sb_printf(s, "%llu", (unsigned long long)le64(p));
    else if (n.is_int) sb_printf(s, "%lld", n.i);
    else sb_printf(s, type == VT_F32 ? "%.9g" : "%.17g", n.f);
}

/* Elements until the buffer is nearly full, keeping room for a final " ...". */
static void describe_array(sbuf *s, const gguf_kv *kv) {
    sb_printf(s, "[%llu x %s]", (unsigned long long)kv->count, VT_NAME[kv->elem]);
    if (kv->elem == VT_ARR) return;
    size_t full = s->cap;
    s->cap = full > 5 ? full - 4 : full;
    uint64_t i = 0;
    for (; i < kv->count && s->len + 8 < s->cap; i++) {
        sb_printf(s, i ? ", " : " ");
        if (kv->elem == VT_STR) sb_quoted(s, kv->strs[i]);
        else sb_number(s, kv->elem, kv->data + i * VT_SIZE[kv->elem]);
    }
    s->cap = full;
    if (i < kv->count) sb_printf(s, " ...");
}

int qlm_gguf_n_kv(const qlm_gguf *g) { return g->n_kv; }

int qlm_gguf_kv_describe(const qlm_gguf *g, int i, const char **key, char *value, size_t cap) {
    if (i < 0 || i >= g->n_kv) return qlm_errorf("%s: metadata index %d out of range", g->path, i);
    if (cap == 0) return qlm_errorf("%s: no room to describe metadata", g->path);
    const gguf_kv *kv = &g->kvs[i];
    sbuf s = {value, cap, 0};
    value[0] = 0;
    if (kv->type == VT_STR) sb_quoted(&s, kv->str);
    else if (kv->type == VT_ARR) describe_array(&s, kv);
    else sb_number(&s, kv->type, kv->data);
    *key = kv->key;
    return 0;
}

int qlm_gguf_n_tensors(const qlm_gguf *g) { return g->n_tensors; }

int qlm_gguf_tensor_describe(const qlm_gguf *g, int i, const char **name, const char **type_name, int *ndim,
                             long long dims[4]) {
    if (i < 0 || i >= g->n_tensors) return qlm_errorf("%s: tensor index %d out of range", g->path, i);
    const gguf_tensor *t = &g->tensors[i];
    *name = t->name;
    *type_name = t->type->name;
    *ndim = t->ndim;
    for (int d = 0; d < 4; d++) dims[d] = d < t->ndim ? t->ne[d] : 1;
    return 0;
}

/* ---------- Llama-family config ---------- */

/* Llama-shaped architectures. llama.cpp's converter interleaves the Q/K rows of "llama" models
 * (pairwise RoPE); the others keep Hugging Face's rotate-half layout. */
static const struct {
    const char *arch;
    int permuted;
} ARCHS[] = {{"llama", 1}, {"qwen2", 0}, {"qwen3", 0}, {"gemma2", 0}, {"gemma3", 0}, {"phi3", 0}};

static int arch_index(const char *arch) {
    for (int i = 0; i < (int)(sizeof ARCHS / sizeof ARCHS[0]); i++)
        if (strcmp(ARCHS[i].arch, arch) == 0) return i;
    return -1;
}

/* "<arch>.<suffix>" as a positive int; *out = dflt when absent and not required. */
static int arch_int(const qlm_gguf *g, const char *arch, const char *suffix, int required, int dflt, int *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!find_kv(g, key)) {
        if (required) return qlm_errorf("%s: metadata key %s is missing", g->path, key);
        *out = dflt;
        return 0;
    }
    long long v;
    if (qlm_gguf_get_int(g, key, &v) != 0) return -1;
    if (v < 1 || v > INT_MAX) return qlm_errorf("%s: metadata key %s = %lld is out of range", g->path, key, v);
    *out = (int)v;
    return 0;
}

static int arch_float(const qlm_gguf *g, const char *arch, const char *suffix, int required, float dflt, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!find_kv(g, key)) {
        if (required) return qlm_errorf("%s: metadata key %s is missing", g->path, key);
        *out = dflt;
        return 0;
    }
    double v;
    if (qlm_gguf_get_float(g, key, &v) != 0) return -1;
    if (!isfinite(v) || !(v > 0) || v > 1e30)
        return qlm_errorf("%s: metadata key %s = %g must be a positive finite number", g->path, key, v);
    *out = (float)v;
    return 0;
}

static int read_dims(const qlm_gguf *g, const char *a, qlm_llama_config *c) {
    if (arch_int(g, a, "embedding_length", 1, 0, &c->dim) != 0 ||
        arch_int(g, a, "feed_forward_length", 1, 0, &c->hidden_dim) != 0 ||
        arch_int(g, a, "block_count", 1, 0, &c->n_layers) != 0 ||
        arch_int(g, a, "attention.head_count", 1, 0, &c->n_heads) != 0 ||
        arch_int(g, a, "attention.head_count_kv", 0, c->n_heads, &c->n_kv_heads) != 0 ||
        arch_int(g, a, "context_length", 1, 0, &c->max_seq_len) != 0)
        return -1;
    char key_len[128];
    snprintf(key_len, sizeof key_len, "%s.attention.key_length", a);
    if (!find_kv(g, key_len) && c->dim % c->n_heads != 0)
        return qlm_errorf("%s: embedding_length %d is not a multiple of head_count %d (and %s is absent)", g->path,
                          c->dim, c->n_heads, key_len);
    int value_len, rope_dims;
    if (arch_int(g, a, "attention.key_length", 0, c->dim / c->n_heads, &c->head_dim) != 0 ||
        arch_int(g, a, "attention.value_length", 0, c->head_dim, &value_len) != 0 ||
        arch_int(g, a, "rope.dimension_count", 0, c->head_dim, &rope_dims) != 0)
        return -1;
    if (value_len != c->head_dim)
        return qlm_errorf("%s: attention.value_length %d differs from key_length %d (not supported)", g->path,
                          value_len, c->head_dim);
    if (rope_dims != c->head_dim)
        return qlm_errorf("%s: rope.dimension_count %d differs from the head size %d (partial rotary embeddings are "
                          "not supported)", g->path, rope_dims, c->head_dim);
    if (arch_float(g, a, "rope.freq_base", 0, 10000.0f, &c->rope_theta) != 0 ||
        arch_float(g, a, "attention.layer_norm_rms_epsilon", 1, 0, &c->norm_eps) != 0)
        return -1;
    return 0;
}

/* From the embedding matrix (rows), else <arch>.vocab_size, else the tokenizer's token list. */
static int read_vocab(const qlm_gguf *g, const char *a, qlm_llama_config *c) {
    const gguf_tensor *t = find_tensor(g, "token_embd.weight");
    if (t && t->ndim == 2) {
        if (t->ne[1] > INT_MAX) return qlm_errorf("%s: token_embd.weight has too many rows", g->path);
        c->vocab_size = (int)t->ne[1];
        return 0;
    }
    char key[128];
    snprintf(key, sizeof key, "%s.vocab_size", a);
    if (find_kv(g, key)) return arch_int(g, a, "vocab_size", 1, 0, &c->vocab_size);
    const char *const *tokens;
    if (qlm_gguf_get_str_array(g, "tokenizer.ggml.tokens", &tokens, &c->vocab_size) != 0)
        return qlm_error_context("%s: no vocabulary size", g->path);
    return 0;
}

static int read_token_id(const qlm_gguf *g, const char *key, int vocab, int *out) {
    *out = -1;
    if (!find_kv(g, key)) return 0;
    long long v;
    if (qlm_gguf_get_int(g, key, &v) != 0) return -1;
    if (v < 0 || v >= vocab)
        return qlm_errorf("%s: %s = %lld is outside the vocabulary (%d tokens)", g->path, key, v, vocab);
    *out = (int)v;
    return 0;
}

/* Converts blocks [b0, b0 + n) of tensor t to floats at dst (the whole tensor's output). */
static void convert_blocks(const qlm_gguf *g, const gguf_tensor *t, float *dst, int64_t b0, int64_t n) {
    const uint8_t *src = g->map + g->data_start + t->offset;
    t->type->fn(src + b0 * t->type->bytes, dst + b0 * t->type->block, n);
}

static int64_t n_blocks(const gguf_tensor *t) { return (int64_t)(t->nbytes / t->type->bytes); }

static int check_convertible(const qlm_gguf *g, const gguf_tensor *t) {
    if (t->type->fn) return 0;
    return qlm_errorf("%s: tensor %s has type %s, which qlm cannot convert (supported: F32, F16, BF16, Q4_0, "
                      "Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)", g->path, t->name, t->type->name);
}

/* Llama 3.x files carry their long-context RoPE rescaling as per-frequency divisors in
 * rope_freqs.weight instead of metadata. They are accepted when the divisors follow the Llama 3
 * rule with its published parameters (original context 8192, low/high frequency factors 1 and
 * 4), taking the factor from the lowest frequency. */
static int read_rope_freqs(const qlm_gguf *g, qlm_llama_config *c) {
    const gguf_tensor *t = find_tensor(g, "rope_freqs.weight");
    if (!t) return 0;
    int half = c->head_dim / 2;
    if (t->ndim != 1 || t->ne[0] != half)
        return qlm_errorf("%s: rope_freqs.weight must have %d elements", g->path, half);
    if (check_convertible(g, t) != 0) return -1;
    float *div = malloc((size_t)half * sizeof *div);
    if (!div) return qlm_errorf("out of memory");
    convert_blocks(g, t, div, 0, n_blocks(t));
    const float orig = 8192, low = 1, high = 4, factor = div[half - 1];
    int ok = isfinite(factor) && factor >= 1;
    for (int j = 0; j < half && ok; j++) {
        float f = 1.0f / powf(c->rope_theta, (float)(2 * j) / (float)c->head_dim);
        float wavelen = 2.0f * (float)M_PI / f, want = 1;
        if (wavelen > orig / low) {
            want = factor;
        } else if (wavelen >= orig / high) {
            float smooth = (orig / wavelen - low) / (high - low);
            want = 1.0f / ((1 - smooth) / factor + smooth);
        }
        ok = fabsf(div[j] - want) <= 1e-3f * want;
    }
    free(div);
    if (!ok)
        return qlm_errorf("%s: rope_freqs.weight does not follow Llama 3 RoPE scaling (original context 8192, "
                          "frequency factors 1 and 4); other RoPE scalings are not supported", g->path);
    if (factor > 1) {
        c->rope_type = QLM_ROPE_LLAMA3;
        c->rope_scale_factor = factor;
        c->rope_low_freq_factor = low;
        c->rope_high_freq_factor = high;
        c->rope_orig_max_pos = (int)orig;
    }
    return 0;
}

/* <arch>.rope.scaling.*: none, linear (factor) or yarn (factor, original context, betas, attention factor). */
static int read_rope_scaling(const qlm_gguf *g, const char *a, qlm_llama_config *c) {
    char key[128];
    const char *type;
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (!find_kv(g, key)) return 0;
    if (qlm_gguf_get_str(g, key, &type) != 0) return -1;
    if (strcmp(type, "none") == 0) return 0;
    if (strcmp(type, "linear") == 0) c->rope_type = QLM_ROPE_LINEAR;
    else if (strcmp(type, "yarn") == 0) c->rope_type = QLM_ROPE_YARN;
    else return qlm_errorf("%s: RoPE scaling \"%s\" (%s) is not supported (none, linear, yarn)", g->path, type, key);
    if (arch_float(g, a, "rope.scaling.factor", 1, 0, &c->rope_scale_factor) != 0 ||
        arch_int(g, a, "rope.scaling.original_context_length", 0, c->max_seq_len, &c->rope_orig_max_pos) != 0)
        return -1;
    if (c->rope_type != QLM_ROPE_YARN) return 0;
    if (arch_float(g, a, "rope.scaling.yarn_beta_fast", 0, 32, &c->rope_beta_fast) != 0 ||
        arch_float(g, a, "rope.scaling.yarn_beta_slow", 0, 1, &c->rope_beta_slow) != 0)
        return -1;
    /* transformers' attention factor from the scaling factor (llama.cpp's own attn_factor key
     * multiplies its internal one and is not read). */
    c->rope_attn_factor = qlm_rope_default_attn_factor(c);
    return 0;
}

/* A 1-D F32 tensor of exactly n values into out (longrope's factor lists). */
static int read_vector(const qlm_gguf *g, const gguf_tensor *t, int n, float *out) {
    if (t->ndim != 1 || t->ne[0] != n) return qlm_errorf("%s: %s must have %d elements", g->path, t->name, n);
    if (check_convertible(g, t) != 0) return -1;
    convert_blocks(g, t, out, 0, n_blocks(t));
    return 0;
}

/* <arch>.attention.sliding_window_pattern: every n-th layer global (an integer, dflt when absent),
 * or one bool per layer, true where the layer is windowed (llama.cpp's per-layer form). */
static int read_window_pattern(const qlm_gguf *g, const char *a, int dflt, qlm_llama_config *c) {
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != VT_ARR) return arch_int(g, a, "attention.sliding_window_pattern", 0, dflt, &c->window_period);
    if (!array_kv(g, key, "bools", is_bool_type)) return -1;
    if (kv->count != (uint64_t)c->n_layers)
        return qlm_errorf("%s: metadata key %s has %llu values for %d layers", g->path, key,
                          (unsigned long long)kv->count, c->n_layers);
    int any = 0;
    for (int l = 0; l < c->n_layers; l++) any |= kv->data[l] != 0;
    if (!any) {
        c->sliding_window = 0;
        return 0;
    }
    if (qlm_config_fit_windows(c, (const unsigned char *)kv->data, c->n_layers) != 0)
        return qlm_errorf("%s: %s: this mix of global and windowed layers is not supported (windowed from one layer "
                          "on, or all but every n-th)", g->path, key);
    return 0;
}

/* Gemma 2/3 as llama.cpp writes them: norms stored as 1 + w (qlm_gguf_load_tensors takes the 1 off
 * again), soft caps under <arch>.*_logit_softcapping (Gemma 2's defaults when absent; Gemma 3 caps
 * only the logits, as transformers does), the window over every other layer (Gemma 2) or all but
 * every sliding_window_pattern-th (Gemma 3: 6, or one bool per layer), Gemma 3's local RoPE base
 * rope.freq_base_swa (1e4). The query scale is attention.scale when present, else
 * llama.cpp's rule: 1/sqrt(hidden/heads) for the 27B models (46 and 62 layers), 1/sqrt(head_dim)
 * for the others, which is query_pre_attn_scalar^-0.5 for every published size. */
static int read_gemma(const qlm_gguf *g, const char *a, int gemma3, qlm_llama_config *c) {
    int big = c->n_layers == (gemma3 ? 62 : 46), period = gemma3 ? 6 : 2;
    float scale = 1.0f / sqrtf((float)(big ? c->dim / c->n_heads : c->head_dim)), dflt_attn = 50.0f;
    if (arch_float(g, a, "attention.scale", 0, scale, &c->query_scale) != 0 ||
        (!gemma3 && arch_float(g, a, "attn_logit_softcapping", 0, dflt_attn, &c->attn_softcap) != 0) ||
        arch_float(g, a, "final_logit_softcapping", 0, gemma3 ? 0 : 30.0f, &c->final_softcap) != 0 ||
        arch_int(g, a, "attention.sliding_window", 0, 4096, &c->sliding_window) != 0 ||
        read_window_pattern(g, a, period, c) != 0 ||
        (gemma3 && arch_float(g, a, "rope.freq_base_swa", 0, 10000.0f, &c->rope_local_theta) != 0))
        return -1;
    c->post_norms = 1;
    c->norm_offset = 1.0f;
    c->embed_scale = (float)sqrt((double)c->dim);
    c->act = QLM_ACT_GELU_TANH;
    return 0;
}

/* Phi-3: the window, and longrope from rope_factors_short/long.weight with the original context
 * and the attention factor from rope.scaling.*. */
static int read_phi3(const qlm_gguf *g, const char *a, qlm_llama_config *c) {
    c->fused_proj = 1;
    if (arch_int(g, a, "attention.sliding_window", 0, 0, &c->sliding_window) != 0) return -1;
    const gguf_tensor *sf = find_tensor(g, "rope_factors_short.weight"), *lf = find_tensor(g, "rope_factors_long.weight");
    if (!sf && !lf) return 0;
    int half = c->head_dim / 2;
    if (!sf || !lf || half > QLM_MAX_ROPE_FACTORS)
        return qlm_errorf("%s: longrope needs rope_factors_short.weight and rope_factors_long.weight (head_dim <= %d)",
                          g->path, 2 * QLM_MAX_ROPE_FACTORS);
    c->rope_type = QLM_ROPE_LONGROPE;
    if (read_vector(g, sf, half, c->rope_short_factor) != 0 || read_vector(g, lf, half, c->rope_long_factor) != 0 ||
        arch_int(g, a, "rope.scaling.original_context_length", 1, 0, &c->rope_orig_max_pos) != 0)
        return -1;
    c->rope_scale_factor = (float)c->max_seq_len / (float)c->rope_orig_max_pos;
    return arch_float(g, a, "rope.scaling.attn_factor", 0, qlm_rope_default_attn_factor(c), &c->rope_attn_factor);
}

int qlm_gguf_llama_config(const qlm_gguf *g, qlm_llama_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    const char *arch;
    if (qlm_gguf_get_str(g, "general.architecture", &arch) != 0) return -1;
    if (arch_index(arch) < 0)
        return qlm_errorf("%s: architecture \"%s\" is not supported (llama, qwen2, qwen3, gemma2, gemma3, phi3)",
                          g->path, arch);
    snprintf(cfg->arch, sizeof cfg->arch, "%s", arch);
    if (read_dims(g, arch, cfg) != 0 || read_vocab(g, arch, cfg) != 0) return -1;
    int gemma = strncmp(arch, "gemma", 5) == 0;
    if ((gemma && read_gemma(g, arch, strcmp(arch, "gemma3") == 0, cfg) != 0) ||
        (strcmp(arch, "phi3") == 0 && read_phi3(g, arch, cfg) != 0))
        return -1;
    cfg->tie_embeddings = find_tensor(g, "output.weight") == NULL;
    cfg->attn_bias = find_tensor(g, "blk.0.attn_q.bias") != NULL;
    cfg->attn_out_bias = find_tensor(g, "blk.0.attn_output.bias") != NULL;
    cfg->mlp_bias = find_tensor(g, "blk.0.ffn_gate.bias") != NULL;
    cfg->qk_norm = find_tensor(g, "blk.0.attn_q_norm.weight") != NULL;
    if (read_token_id(g, "tokenizer.ggml.bos_token_id", cfg->vocab_size, &cfg->bos_id) != 0 ||
        read_token_id(g, "tokenizer.ggml.eos_token_id", cfg->vocab_size, &cfg->eos_id) != 0)
        return -1;
    if (read_rope_scaling(g, arch, cfg) != 0 || qlm_config_validate(cfg, g->path) != 0) return -1;
    return read_rope_freqs(g, cfg);
}

/* ---------- tensors under Hugging Face names ---------- */

/* One tensor the model needs: rows x cols (cols 0 for a vector), and the number of heads whose
 * rows llama.cpp interleaved (0: stored as Hugging Face has it). */
typedef struct {
    const char *gguf, *hf;
    int64_t rows, cols;
    int perm_heads;
    int wanted;
} want;

#define LAYER_WANTS 23

/* fused: Phi-3's attn_qkv and ffn_up holding gate and up, which loaders/fused_weights.c splits. */
static int layer_wants(const qlm_llama_config *c, int permuted, int fused, want w[LAYER_WANTS]) {
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    int qh = permuted ? c->n_heads : 0, kh = permuted ? c->n_kv_heads : 0, post = c->post_norms;
    const want list[] = {
        {"attn_norm.weight", "input_layernorm.weight", c->dim, 0, 0, 1},
        {"attn_qkv.weight", "self_attn.qkv_proj.weight", q + 2 * kv, c->dim, 0, fused},
        {"attn_q.weight", "self_attn.q_proj.weight", q, c->dim, qh, !fused},
        {"attn_k.weight", "self_attn.k_proj.weight", kv, c->dim, kh, !fused},
        {"attn_v.weight", "self_attn.v_proj.weight", kv, c->dim, 0, !fused},
        {"attn_output.weight", "self_attn.o_proj.weight", c->dim, q, 0, 1},
        {"attn_q.bias", "self_attn.q_proj.bias", q, 0, qh, c->attn_bias},
        {"attn_k.bias", "self_attn.k_proj.bias", kv, 0, kh, c->attn_bias},
        {"attn_v.bias", "self_attn.v_proj.bias", kv, 0, 0, c->attn_bias},
        {"attn_output.bias", "self_attn.o_proj.bias", c->dim, 0, 0, c->attn_out_bias},
        {"ffn_norm.weight", "post_attention_layernorm.weight", c->dim, 0, 0, !post},
        /* Gemma: a norm after each block; its MLP's input norm has the other name */
        {"ffn_norm.weight", "pre_feedforward_layernorm.weight", c->dim, 0, 0, post},
        {"post_attention_norm.weight", "post_attention_layernorm.weight", c->dim, 0, 0, post},
        {"post_ffw_norm.weight", "post_feedforward_layernorm.weight", c->dim, 0, 0, post},
        {"ffn_gate.weight", "mlp.gate_proj.weight", c->hidden_dim, c->dim, 0, !fused},
        {"ffn_up.weight", "mlp.up_proj.weight", c->hidden_dim, c->dim, 0, !fused},
        {"ffn_up.weight", "mlp.gate_up_proj.weight", 2 * (int64_t)c->hidden_dim, c->dim, 0, fused},
        {"ffn_down.weight", "mlp.down_proj.weight", c->dim, c->hidden_dim, 0, 1},
        {"ffn_gate.bias", "mlp.gate_proj.bias", c->hidden_dim, 0, 0, c->mlp_bias},
        {"ffn_up.bias", "mlp.up_proj.bias", c->hidden_dim, 0, 0, c->mlp_bias},
        {"ffn_down.bias", "mlp.down_proj.bias", c->dim, 0, 0, c->mlp_bias},
        {"attn_q_norm.weight", "self_attn.q_norm.weight", c->head_dim, 0, 0, c->qk_norm},
        {"attn_k_norm.weight", "self_attn.k_norm.weight", c->head_dim, 0, 0, c->qk_norm},
    };
    _Static_assert(sizeof list / sizeof list[0] == LAYER_WANTS, "LAYER_WANTS must match the list");
    memcpy(w, list, sizeof list);
    return LAYER_WANTS;
}

static int check_shape(const qlm_gguf *g, const gguf_tensor *t, const want *w, const char *hf) {
    int ok = w->cols ? t->ndim == 2 && t->ne[0] == w->cols && t->ne[1] == w->rows
                     : t->ndim == 1 && t->ne[0] == w->rows;
    if (ok) return 0;
    char got[96] = "", exp[48];
    for (int d = t->ndim - 1; d >= 0; d--)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d == t->ndim - 1 ? "" : ", ",
                 (long long)t->ne[d]);
    if (w->cols) snprintf(exp, sizeof exp, "%lld, %lld", (long long)w->rows, (long long)w->cols);
    else snprintf(exp, sizeof exp, "%lld", (long long)w->rows);
    return qlm_errorf("%s: tensor %s (%s): shape [%s], expected [%s]", g->path, t->name, hf, got, exp);
}

/* A tensor to convert: its source, its buffer in the store (F32, or Q8_0 rows), and the Q/K row fix. */
typedef struct {
    const gguf_tensor *t;
    void *dst;
    int64_t rows, cols;
    int perm_heads;
    qlm_dtype out;
} job;

/* The qlm block type a GGUF tensor type is, or -1. */
static int block_dtype(const gguf_tensor *t) {
    const char *n = t->type->name;
    return !strcmp(n, "Q8_0") ? QLM_Q8_0 : !strcmp(n, "Q4_0") ? QLM_Q4_0 : !strcmp(n, "Q4_1") ? QLM_Q4_1 : -1;
}

/* The dtype a GGUF matrix is kept in as it lies in the file (Q8_0/Q4_0/Q4_1 as qlm's block types,
 * F16/BF16 where the data is 2-byte aligned), or -1 when it must be converted. */
static int kept_dtype(const gguf_tensor *t, const uint8_t *data) {
    int bt = block_dtype(t);
    if (bt >= 0) return bt;
    if ((uintptr_t)data % 2) return -1;
    return !strcmp(t->type->name, "F16") ? QLM_F16 : !strcmp(t->type->name, "BF16") ? QLM_BF16 : -1;
}

/* A matrix kept as it lies in the file, entered from the store's mapping; Q/K rows stay in the
 * file's interleaved order (rope_heads), which the model reads in place or reorders as it copies. */
static int add_kept(const qlm_gguf *g, const uint8_t *store_map, const gguf_tensor *t, const want *w,
                    const char *hname, qlm_dtype dt, qlm_tensor_store *store) {
    const int group = qlm_dtype_is_block(dt) ? 32 : 0;
    int64_t shape[2] = {w->rows, w->cols};
    qlm_tensor_entry *e = qlm_store_add(store, hname, dt, 2, shape, store_map + g->data_start + t->offset,
                                        (size_t)w->rows * qlm_dtype_row_bytes(dt, (long)w->cols, group));
    if (!e) return qlm_error_context("%s: tensor %s", g->path, t->name);
    e->group = group;
    e->rope_heads = w->perm_heads;
    return 0;
}

/* Finds and checks the tensor for w. Matrices qlm runs as stored go into the store as they are
 * (returns 0); others get a (not yet filled) buffer in the store and a conversion job in *out
 * (returns 1): F32 for vectors and F32 matrices, Q8_0 for matrices in the other GGML types (K-quants,
 * Q5), never expanded to F32. -1 on error. */
static int plan_one(const qlm_gguf *g, const uint8_t **store_map, const want *w, const char *gname, const char *hname,
                    qlm_tensor_store *store, job *out) {
    const gguf_tensor *t = find_tensor(g, gname);
    if (!t) return qlm_errorf("%s: tensor %s (%s) is missing", g->path, gname, hname);
    if (check_shape(g, t, w, hname) != 0 || check_convertible(g, t) != 0) return -1;
    int kept = kept_dtype(t, g->map + g->data_start + t->offset);
    if (kept >= 0 && w->cols) {
        if (!*store_map && !(*store_map = map_for_store(g, store))) return -1;
        return add_kept(g, *store_map, t, w, hname, (qlm_dtype)kept, store);
    }
    int64_t shape[2] = {w->rows, w->cols};
    void *buf;
    qlm_dtype dt = w->cols && t->type->block > 1 && w->cols % 32 == 0 ? QLM_Q8_0 : QLM_F32;
    qlm_tensor_entry *e = dt == QLM_Q8_0 ? qlm_store_add_owned_blocks(store, hname, dt, 32, w->rows, w->cols, &buf)
                                         : qlm_store_add_owned(store, hname, dt, w->cols ? 2 : 1, shape, &buf);
    if (!e) return qlm_error_context("%s: tensor %s", g->path, gname);
    *out = (job){t, buf, w->rows, w->cols ? w->cols : 1, w->perm_heads, dt};
    return 1;
}

#define CHUNK_ELEMS 65536

/* Rows of a Q8_0 job per chunk. */
static int64_t chunk_rows(const job *j) { return j->cols >= CHUNK_ELEMS ? 1 : CHUNK_ELEMS / j->cols; }

static int64_t job_chunks(const job *j) {
    if (j->out == QLM_Q8_0) return (j->rows + chunk_rows(j) - 1) / chunk_rows(j);
    int64_t per = CHUNK_ELEMS / j->t->type->block;
    return (n_blocks(j->t) + per - 1) / per;
}

static size_t job_row_bytes(const job *j) { return qlm_dtype_row_bytes(j->out, (long)j->cols, 32); }

/* Chunk c of job j: F32 blocks converted in place, or Q8_0 rows made through row, an F32 buffer of
 * cols floats. */
static void convert_chunk(const qlm_gguf *g, const job *j, int64_t c, float *row) {
    if (j->out == QLM_F32) {
        int64_t per = CHUNK_ELEMS / j->t->type->block, b0 = c * per, nb = n_blocks(j->t);
        convert_blocks(g, j->t, j->dst, b0, nb - b0 < per ? nb - b0 : per);
        return;
    }
    const uint8_t *src = g->map + g->data_start + j->t->offset;
    const int64_t per_row = j->cols / j->t->type->block, r1 = (c + 1) * chunk_rows(j);
    for (int64_t r = c * chunk_rows(j); r < r1 && r < j->rows; r++) {
        j->t->type->fn(src + r * per_row * j->t->type->bytes, row, per_row);
        qlm_block_quantize_row((char *)j->dst + r * job_row_bytes(j), QLM_Q8_0, 32, row, (long)j->cols);
    }
}

/* One parallel loop over fixed-size chunks of all tensors, so that a thread that falls behind
 * holds up one barrier rather than one per tensor; then the Q/K rows are reordered. */
static int convert_all(const qlm_gguf *g, const job *jobs, int n) {
    int64_t *first = malloc((size_t)(n + 1) * sizeof *first), max_cols = 1;
    size_t max_perm = 1;
    if (!first) return qlm_errorf("out of memory");
    first[0] = 0;
    for (int i = 0; i < n; i++) {
        first[i + 1] = first[i] + job_chunks(&jobs[i]);
        if (jobs[i].cols > max_cols) max_cols = jobs[i].cols;
        size_t bytes = (size_t)jobs[i].rows * job_row_bytes(&jobs[i]);
        if (jobs[i].perm_heads && bytes > max_perm) max_perm = bytes;
    }
    void *tmp = malloc(max_perm);
    if (!tmp) {
        free(first);
        return qlm_errorf("out of memory");
    }
    int failed = 0;
#pragma omp parallel
    {
        float *row = malloc((size_t)max_cols * sizeof *row);
        if (!row) failed = 1;
#pragma omp for schedule(dynamic, 4)
        for (int64_t ch = 0; ch < first[n]; ch++) {
            if (!row) continue;
            int lo = 0, hi = n - 1;
            while (lo < hi) {
                int mid = (lo + hi + 1) / 2;
                if (first[mid] <= ch) lo = mid;
                else hi = mid - 1;
            }
            convert_chunk(g, &jobs[lo], ch - first[lo], row);
        }
        free(row);
    }
    for (int i = 0; !failed && i < n; i++) {
        if (!jobs[i].perm_heads) continue;
        size_t row_bytes = job_row_bytes(&jobs[i]);
        memcpy(tmp, jobs[i].dst, (size_t)jobs[i].rows * row_bytes);
        qlm_rope_rows_to_half(jobs[i].dst, tmp, jobs[i].rows, row_bytes, jobs[i].perm_heads);
    }
    free(tmp);
    free(first);
    return failed ? qlm_errorf("out of memory") : 0;
}

static int plan_all(const qlm_gguf *g, const qlm_llama_config *cfg, int permuted, qlm_tensor_store *store,
                    job *jobs, int *n_jobs) {
    const want global[] = {
        {"token_embd.weight", "model.embed_tokens.weight", cfg->vocab_size, cfg->dim, 0, 1},
        {"output_norm.weight", "model.norm.weight", cfg->dim, 0, 0, 1},
        {"output.weight", "lm_head.weight", cfg->vocab_size, cfg->dim, 0, !cfg->tie_embeddings},
    };
    int n = 0, rc;
    const uint8_t *store_map = NULL;
    for (size_t i = 0; i < sizeof global / sizeof global[0]; i++) {
        if (!global[i].wanted) continue;
        if ((rc = plan_one(g, &store_map, &global[i], global[i].gguf, global[i].hf, store, &jobs[n])) < 0) return -1;
        n += rc;
    }
    want w[LAYER_WANTS];
    int nw = layer_wants(cfg, permuted, find_tensor(g, "blk.0.attn_qkv.weight") != NULL, w);
    for (int l = 0; l < cfg->n_layers; l++)
        for (int i = 0; i < nw; i++) {
            if (!w[i].wanted) continue;
            char gname[96], hname[128];
            snprintf(gname, sizeof gname, "blk.%d.%s", l, w[i].gguf);
            snprintf(hname, sizeof hname, "model.layers.%d.%s", l, w[i].hf);
            if ((rc = plan_one(g, &store_map, &w[i], gname, hname, store, &jobs[n])) < 0) return -1;
            n += rc;
        }
    *n_jobs = n;
    return 0;
}

int qlm_gguf_load_tensors(const qlm_gguf *g, const qlm_llama_config *cfg, qlm_tensor_store *store) {
    if (qlm_config_validate(cfg, g->path) != 0) return -1;
    const char *arch;
    if (qlm_gguf_get_str(g, "general.architecture", &arch) != 0) return -1;
    int a = arch_index(arch);
    if (a < 0) return qlm_errorf("%s: architecture \"%s\" is not supported", g->path, arch);
    job *jobs = malloc((size_t)(3 + cfg->n_layers * LAYER_WANTS) * sizeof *jobs);
    if (!jobs) return qlm_errorf("out of memory");
    int n = 0;
    int rc = plan_all(g, cfg, ARCHS[a].permuted, store, jobs, &n);
    if (rc == 0) rc = convert_all(g, jobs, n);
    /* llama.cpp stores Gemma's norms as 1 + w; the store holds Hugging Face's w */
    for (int i = 0; rc == 0 && cfg->norm_offset != 0 && i < n; i++)
        if (jobs[i].cols == 1 && strstr(jobs[i].t->name, "norm.weight"))
            for (int64_t k = 0; k < jobs[i].rows; k++) ((float *)jobs[i].dst)[k] -= cfg->norm_offset;
    free(jobs);
    return rc == 0 ? qlm_store_unfuse(store, cfg, g->path) : -1;
}
