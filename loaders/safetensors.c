/* safetensors: an 8-byte little-endian header length N, N bytes of JSON
 * {"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [begin, end]}},
 * then the data section; offsets are relative to its start and the tensors tile it
 * without gaps (the reference reader rejects anything else, so we do too).
 *
 * Data the mapping holds at an address not aligned to its element size (possible when the
 * header length is not a multiple of 8) is copied to an owned, aligned buffer.
 *
 * Tied embeddings: HF files of tied models store either model.embed_tokens.weight or
 * only lm_head.weight (e.g. tinystories-656K). The loader lists exactly what the file
 * holds; the model builder decides which tensor to share. */
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../core/error.h"
#include "../core/atomic_file.h"
#include "../core/read_file.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; big-endian hosts are not supported"
#endif

#define ST_MAX_HEADER (100u * 1024u * 1024u)
#define ST_MAX_TENSORS (1 << 17)
#define ST_MAX_INDEX (64u * 1024u * 1024u)
/* JSON numbers are doubles; integers beyond 2^53 cannot be represented exactly. */
#define ST_MAX_JSON_INT 9007199254740992.0

static const char SCALE_SUFFIX[] = "_scale";

typedef struct {
    const char *name; /* points into the cJSON tree */
    qlm_dtype dtype;
    int ndim;
    int64_t shape[QLM_MAX_DIMS]; /* block types: [rows, cols] in weights */
    uint64_t begin, end;
    int group; /* block types */
} st_info;

/* Block-type tensors (core/dtype.h) are stored as U8 [rows, bytes per row], and the metadata key
 * "qlm.blocks.<name>" says how to read them: "<dtype>/<group>" ("q4_0/64"). Other readers see
 * plain bytes and the config.json's quantization_config names the scheme. */
static const char BLOCKS_KEY[] = "qlm.blocks.";

static const struct { const char *name; qlm_dtype dtype; } DTYPES[] = {
    {"F32", QLM_F32}, {"F16", QLM_F16}, {"BF16", QLM_BF16}, {"I8", QLM_I8},
};

static const char *dtype_tag(qlm_dtype t) {
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
        if (DTYPES[i].dtype == t) return DTYPES[i].name;
    return NULL;
}

static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0) || d > ST_MAX_JSON_INT || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

/* "<name>_scale", malloc'd (error set on failure). */
static char *scale_name(const char *name) {
    size_t len = strlen(name);
    char *s = malloc(len + sizeof SCALE_SUFFIX);
    if (!s) {
        qlm_errorf("out of memory");
        return NULL;
    }
    memcpy(s, name, len);
    memcpy(s + len, SCALE_SUFFIX, sizeof SCALE_SUFFIX);
    return s;
}

static int ends_with_scale(const char *name, size_t *base_len) {
    size_t n = strlen(name), k = sizeof SCALE_SUFFIX - 1;
    if (n <= k || strcmp(name + n - k, SCALE_SUFFIX) != 0) return 0;
    *base_len = n - k;
    return 1;
}

/* ---------- reading ---------- */

static int parse_metadata(const char *path, const cJSON *meta) {
    if (!cJSON_IsObject(meta)) return qlm_errorf("%s: __metadata__ is not an object", path);
    for (const cJSON *kv = meta->child; kv; kv = kv->next)
        if (!cJSON_IsString(kv))
            return qlm_errorf("%s: __metadata__ value \"%s\" is not a string", path, kv->string);
    return 0;
}

/* A U8 tensor that the metadata declares a block type: its dtype and group in info. */
static int parse_block_format(const char *path, const char *name, const cJSON *meta, st_info *info) {
    char key[512];
    snprintf(key, sizeof key, "%s%s", BLOCKS_KEY, name);
    const cJSON *f = meta ? cJSON_GetObjectItemCaseSensitive(meta, key) : NULL;
    if (!cJSON_IsString(f))
        return qlm_errorf("%s: tensor %s: unsupported dtype U8 (no %s%s entry in __metadata__ says how to read it)",
                          path, name, BLOCKS_KEY, name);
    char dt_name[16];
    int group = 0, used = 0;
    qlm_dtype dt;
    if (sscanf(f->valuestring, "%15[a-z0-9_]/%d%n", dt_name, &group, &used) != 2 || f->valuestring[used] != 0 ||
        qlm_dtype_parse(dt_name, &dt) != 0 || !qlm_dtype_is_block(dt) || !qlm_group_valid(group))
        return qlm_errorf("%s: __metadata__ %s%s is \"%s\", expected \"q8_0|q4_0|q4_1/32|64|128\"", path, BLOCKS_KEY, name,
                          f->valuestring);
    info->dtype = dt;
    info->group = group;
    return 0;
}

static int parse_info(const char *path, const cJSON *item, const cJSON *meta, st_info *info) {
    const char *name = item->string;
    if (!cJSON_IsObject(item)) return qlm_errorf("%s: tensor %s: header entry is not an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dt)) return qlm_errorf("%s: tensor %s: missing or non-string dtype", path, name);
    if (!cJSON_IsArray(shape)) return qlm_errorf("%s: tensor %s: missing or non-array shape", path, name);
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return qlm_errorf("%s: tensor %s: data_offsets must be [begin, end]", path, name);

    info->name = name;
    size_t k = 0;
    while (k < sizeof DTYPES / sizeof DTYPES[0] && strcmp(dt->valuestring, DTYPES[k].name) != 0) k++;
    if (k < sizeof DTYPES / sizeof DTYPES[0])
        info->dtype = DTYPES[k].dtype;
    else if (strcmp(dt->valuestring, "U8") == 0 && parse_block_format(path, name, meta, info) != 0)
        return -1;
    else if (strcmp(dt->valuestring, "U8") != 0)
        return qlm_errorf("%s: tensor %s: unsupported dtype %s (supported: F32, F16, BF16, I8, and U8 blocks)", path,
                          name, dt->valuestring);

    int ndim = cJSON_GetArraySize(shape);
    if (ndim > QLM_MAX_DIMS)
        return qlm_errorf("%s: tensor %s: %d dimensions (at most %d supported)", path, name, ndim, QLM_MAX_DIMS);
    info->ndim = ndim;
    uint64_t numel = 1;
    int d = 0;
    for (const cJSON *v = shape->child; v; v = v->next, d++) {
        uint64_t dim;
        if (json_uint(v, &dim) != 0)
            return qlm_errorf("%s: tensor %s: shape[%d] is not a non-negative integer", path, name, d);
        if (__builtin_mul_overflow(numel, dim, &numel) || numel > (uint64_t)INT64_MAX)
            return qlm_errorf("%s: tensor %s: shape overflows", path, name);
        info->shape[d] = (int64_t)dim;
    }
    if (json_uint(offs->child, &info->begin) != 0 || json_uint(offs->child->next, &info->end) != 0)
        return qlm_errorf("%s: tensor %s: data_offsets are not non-negative integers", path, name);
    uint64_t nbytes;
    if (qlm_dtype_is_block(info->dtype)) {
        size_t bb = qlm_dtype_block_bytes(info->dtype, info->group);
        if (ndim != 2 || info->shape[1] % (int64_t)bb || info->shape[0] > INT32_MAX ||
            info->shape[1] / (int64_t)bb * info->group > INT32_MAX)
            return qlm_errorf("%s: tensor %s: %s blocks need a shape [rows, whole %zu-byte blocks]", path, name,
                              qlm_dtype_name(info->dtype), bb);
        nbytes = numel;
        info->shape[1] = info->shape[1] / (int64_t)bb * info->group;
    } else if (__builtin_mul_overflow(numel, (uint64_t)qlm_dtype_size(info->dtype), &nbytes)) {
        return qlm_errorf("%s: tensor %s: byte size overflows", path, name);
    }
    if (info->end < info->begin || info->end - info->begin != nbytes)
        return qlm_errorf("%s: tensor %s: data_offsets [%llu, %llu] do not match shape and dtype (%llu bytes)", path,
                          name, (unsigned long long)info->begin, (unsigned long long)info->end,
                          (unsigned long long)nbytes);
    return 0;
}

static int cmp_by_offset(const void *a, const void *b) {
    const st_info *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp(((const st_info *)a)->name, ((const st_info *)b)->name);
}

/* Tensors must tile [0, data_size) exactly: this rules out overlaps and data past the end. */
static int check_layout(const char *path, st_info *infos, int n, uint64_t data_size) {
    qsort(infos, (size_t)n, sizeof *infos, cmp_by_offset);
    uint64_t pos = 0;
    for (int i = 0; i < n; i++) {
        if (infos[i].begin != pos)
            return qlm_errorf("%s: tensor %s: data starts at %llu, expected %llu (gap or overlap)", path, infos[i].name,
                              (unsigned long long)infos[i].begin, (unsigned long long)pos);
        if (infos[i].end > data_size)
            return qlm_errorf("%s: tensor %s: data runs past the end of the file (to byte %llu of a %llu-byte data section)",
                              path, infos[i].name, (unsigned long long)infos[i].end, (unsigned long long)data_size);
        pos = infos[i].end;
    }
    if (pos != data_size)
        return qlm_errorf("%s: %llu bytes after the last tensor in the data section", path,
                          (unsigned long long)(data_size - pos));
    return 0;
}

static const st_info *find_info(const st_info *sorted, int n, const char *name) {
    st_info key = {.name = name};
    return bsearch(&key, sorted, (size_t)n, sizeof *sorted, cmp_by_name);
}

/* The I8 tensor a "<base>_scale" entry belongs to, or NULL if it is an ordinary tensor. */
static const st_info *scale_owner(const st_info *sorted, int n, const char *name) {
    size_t base_len;
    if (!ends_with_scale(name, &base_len)) return NULL;
    char *base = strndup(name, base_len);
    if (!base) return NULL;
    const st_info *owner = find_info(sorted, n, base);
    free(base);
    return owner && owner->dtype == QLM_I8 ? owner : NULL;
}

/* Data in the mapping is only as aligned as the header length makes it; copy what a
 * typed read could not use directly. */
static const void *aligned_data(qlm_tensor_store *store, const void *p, size_t nbytes, size_t align) {
    if ((uintptr_t)p % align == 0) return p;
    void *buf = malloc(nbytes ? nbytes : 1);
    if (!buf) {
        qlm_errorf("out of memory copying %zu bytes", nbytes);
        return NULL;
    }
    memcpy(buf, p, nbytes);
    if (qlm_store_keep_buffer(store, buf) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static int attach_scale(const char *path, qlm_tensor_store *store, qlm_tensor_entry *e, const st_info *sc,
                        const uint8_t *data) {
    if (sc->dtype != QLM_F32) return qlm_errorf("%s: tensor %s_scale: dtype must be F32", path, e->name);
    int64_t rows = e->ndim > 0 ? e->shape[0] : 1;
    int per_tensor = sc->ndim == 1 && sc->shape[0] == 1;
    int per_row = sc->ndim == 1 && e->ndim > 0 && sc->shape[0] == rows;
    if (!per_tensor && !per_row)
        return qlm_errorf("%s: tensor %s_scale: shape must be [1] or [%lld] (rows of %s)", path, e->name,
                          (long long)rows, e->name);
    const float *s = aligned_data(store, data + sc->begin, (size_t)(sc->end - sc->begin), sizeof(float));
    if (!s) return qlm_error_context("%s: tensor %s_scale", path, e->name);
    int64_t n = sc->shape[0];
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(s[i])) return qlm_errorf("%s: tensor %s_scale: element %lld is not finite", path, e->name, (long long)i);
    /* A one-row tensor's [1] scale reads as per-tensor; the arithmetic is the same. */
    if (per_tensor) e->scale = s[0];
    else e->row_scales = s;
    return 0;
}

static int add_tensors(const char *path, qlm_tensor_store *store, st_info *infos, int n, const uint8_t *data) {
    qsort(infos, (size_t)n, sizeof *infos, cmp_by_name);
    for (int i = 0; i + 1 < n; i++)
        if (strcmp(infos[i].name, infos[i + 1].name) == 0)
            return qlm_errorf("%s: tensor %s appears twice in the header", path, infos[i].name);
    for (int i = 0; i < n; i++) {
        const st_info *in = &infos[i];
        if (scale_owner(infos, n, in->name)) continue;
        size_t nbytes = (size_t)(in->end - in->begin);
        const void *p = aligned_data(store, data + in->begin, nbytes,
                                     qlm_dtype_is_block(in->dtype) ? 1 : qlm_dtype_size(in->dtype));
        if (!p) return qlm_error_context("%s: tensor %s", path, in->name);
        qlm_tensor_entry *e = qlm_store_add(store, in->name, in->dtype, in->ndim, in->shape, p, nbytes);
        if (!e) return qlm_error_context("%s", path);
        e->group = in->group;
        if (in->dtype != QLM_I8) continue;
        char *sname = scale_name(in->name);
        if (!sname) return -1;
        const st_info *sc = find_info(infos, n, sname);
        free(sname);
        if (!sc) return qlm_errorf("%s: INT8 tensor %s has no %s_scale companion", path, in->name, in->name);
        if (attach_scale(path, store, e, sc, data) != 0) return -1;
    }
    return 0;
}

static int parse_header(const char *path, const uint8_t *map, size_t size, qlm_tensor_store *store) {
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | map[i];
    if (hlen < 2 || hlen > ST_MAX_HEADER || hlen > size - 8)
        return qlm_errorf("%s: header length %llu is invalid for a %zu-byte file", path, (unsigned long long)hlen, size);
    const char *text = (const char *)map + 8;
    if (text[0] != '{') return qlm_errorf("%s: header does not start with '{'", path);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        return qlm_errorf("%s: header is not valid JSON (near byte %td)", path, at ? at - text : 0);
    }
    for (const char *p = end; p && p < text + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return qlm_errorf("%s: unexpected bytes after the header JSON", path);
        }

    int rc = -1, n = 0, cap = cJSON_GetArraySize(root);
    st_info *infos = NULL;
    if (!cJSON_IsObject(root)) {
        qlm_errorf("%s: header is not a JSON object", path);
        goto done;
    }
    if (cap > ST_MAX_TENSORS) {
        qlm_errorf("%s: header lists %d tensors (at most %d supported)", path, cap, ST_MAX_TENSORS);
        goto done;
    }
    infos = calloc((size_t)cap + 1, sizeof *infos);
    if (!infos) {
        qlm_errorf("out of memory");
        goto done;
    }
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    for (const cJSON *item = root->child; item; item = item->next) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (parse_metadata(path, item) != 0) goto done;
        } else if (parse_info(path, item, meta, &infos[n++]) != 0) {
            goto done;
        }
    }
    const uint8_t *data = map + 8 + hlen;
    if (check_layout(path, infos, n, size - 8 - hlen) != 0) goto done;
    rc = add_tensors(path, store, infos, n, data);
done:
    free(infos);
    cJSON_Delete(root);
    return rc;
}

int qlm_safetensors_load(const char *path, qlm_tensor_store *store) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return qlm_errorf("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return qlm_errorf("%s: not a regular file", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return qlm_errorf("%s: file too short (%lld bytes) for a safetensors header", path, (long long)st.st_size);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return qlm_errorf("%s: mmap failed: %s", path, strerror(errno));
    if (qlm_store_keep_mapping(store, map, size) != 0) {
        munmap(map, size);
        return -1;
    }
    return parse_header(path, map, size, store);
}

int qlm_safetensors_metadata(const char *path, const char *key, char *out, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return qlm_errorf("%s: cannot open: %s", path, strerror(errno));
    uint8_t le[8];
    uint64_t hlen = 0;
    int ok = fread(le, 1, 8, f) == 8;
    for (int i = 7; ok && i >= 0; i--) hlen = (hlen << 8) | le[i];
    char *text = ok && hlen >= 2 && hlen <= ST_MAX_HEADER ? malloc((size_t)hlen) : NULL;
    ok = text && fread(text, 1, (size_t)hlen, f) == hlen;
    fclose(f);
    cJSON *root = ok ? cJSON_ParseWithLength(text, (size_t)hlen) : NULL;
    free(text);
    if (!root) return qlm_errorf("%s: not a safetensors file (unreadable header)", path);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "__metadata__"), key);
    int found = cJSON_IsString(v);
    if (found) snprintf(out, cap, "%s", v->valuestring);
    cJSON_Delete(root);
    return found;
}

/* ---------- folders and sharded checkpoints ---------- */

static int join_path(char *buf, size_t cap, const char *dir, const char *name) {
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return qlm_errorf("%s/%s: path too long", dir, name);
    return 0;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int valid_shard_name(const char *s) {
    return s[0] && !strchr(s, '/') && !strchr(s, '\\') && !strstr(s, "..");
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

typedef struct {
    const char *name;
    int shard;
} name_shard;

static int cmp_name_shard(const void *a, const void *b) {
    return strcmp(((const name_shard *)a)->name, ((const name_shard *)b)->name);
}

static int shard_of(const char *const *shards, int n, const char *file) {
    const char *const *p = bsearch(&file, shards, (size_t)n, sizeof *shards, cmp_str);
    return (int)(p - shards);
}

/* Every name in weight_map must come from the shard it is mapped to; a "<x>_scale"
 * name is satisfied by the INT8 tensor x it was attached to. */
static int check_weight_map(const char *index_path, const qlm_tensor_store *store, const int *entry_shard,
                            const cJSON *wmap, const char *const *shards, int n_shards) {
    int n = qlm_store_count(store);
    name_shard *loaded = malloc(((size_t)n + 1) * sizeof *loaded);
    if (!loaded) return qlm_errorf("out of memory");
    for (int i = 0; i < n; i++) loaded[i] = (name_shard){qlm_store_at(store, i)->name, entry_shard[i]};
    qsort(loaded, (size_t)n, sizeof *loaded, cmp_name_shard);
    int rc = 0;
    for (const cJSON *kv = wmap->child; kv && rc == 0; kv = kv->next) {
        int want = shard_of(shards, n_shards, kv->valuestring);
        name_shard key = {kv->string, 0};
        const name_shard *hit = bsearch(&key, loaded, (size_t)n, sizeof *loaded, cmp_name_shard);
        size_t base_len;
        if (!hit && ends_with_scale(kv->string, &base_len)) {
            char *base = strndup(kv->string, base_len);
            if (!base) {
                rc = qlm_errorf("out of memory");
                break;
            }
            key.name = base;
            hit = bsearch(&key, loaded, (size_t)n, sizeof *loaded, cmp_name_shard);
            const qlm_tensor_entry *e = hit ? qlm_store_find(store, base) : NULL;
            if (!e || e->dtype != QLM_I8) hit = NULL;
            free(base);
        }
        if (!hit || hit->shard != want)
            rc = qlm_errorf("%s: tensor %s is mapped to %s but that shard does not contain it", index_path, kv->string,
                            kv->valuestring);
    }
    free(loaded);
    return rc;
}

static int load_shards(const char *dir, const char *index_path, const cJSON *wmap, qlm_tensor_store *store) {
    int n_map = cJSON_GetArraySize(wmap);
    const char **shards = malloc(((size_t)n_map + 1) * sizeof *shards);
    int *entry_shard = NULL;
    if (!shards) return qlm_errorf("out of memory");
    int n = 0, rc = -1;
    for (const cJSON *kv = wmap->child; kv; kv = kv->next) {
        if (!cJSON_IsString(kv)) {
            qlm_errorf("%s: weight_map entry %s is not a string", index_path, kv->string);
            goto done;
        }
        if (!valid_shard_name(kv->valuestring)) {
            qlm_errorf("%s: weight_map entry %s names an invalid shard file \"%s\"", index_path, kv->string,
                       kv->valuestring);
            goto done;
        }
        shards[n++] = kv->valuestring;
    }
    if (n == 0) {
        qlm_errorf("%s: weight_map is empty", index_path);
        goto done;
    }
    qsort(shards, (size_t)n, sizeof *shards, cmp_str);
    int u = 0;
    for (int i = 0; i < n; i++)
        if (u == 0 || strcmp(shards[u - 1], shards[i]) != 0) shards[u++] = shards[i];
    n = u;
    for (int s = 0; s < n; s++) {
        char path[PATH_MAX];
        if (join_path(path, sizeof path, dir, shards[s]) != 0) goto done;
        int before = qlm_store_count(store);
        if (qlm_safetensors_load(path, store) != 0) {
            qlm_error_context("%s", index_path);
            goto done;
        }
        int after = qlm_store_count(store);
        int *grown = realloc(entry_shard, ((size_t)after + 1) * sizeof *grown);
        if (!grown) {
            qlm_errorf("out of memory");
            goto done;
        }
        entry_shard = grown;
        for (int i = before; i < after; i++) entry_shard[i] = s;
    }
    rc = check_weight_map(index_path, store, entry_shard, wmap, shards, n);
done:
    free(entry_shard);
    free(shards);
    return rc;
}

static int load_index(const char *dir, const char *index_path, qlm_tensor_store *store) {
    char *text = qlm_read_file(index_path, ST_MAX_INDEX, &(size_t){0});
    if (!text) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return qlm_errorf("%s: not valid JSON", index_path);
    const cJSON *wmap = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    int rc = cJSON_IsObject(wmap) ? load_shards(dir, index_path, wmap, store)
                                  : qlm_errorf("%s: missing or non-object weight_map", index_path);
    cJSON_Delete(root);
    return rc;
}

/* Without model.safetensors or an index, a folder holding exactly one *.safetensors is unambiguous. */
static int load_single_other(const char *dir, qlm_tensor_store *store) {
    DIR *d = opendir(dir);
    if (!d) return qlm_errorf("%s: cannot open folder: %s", dir, strerror(errno));
    char found[NAME_MAX + 1] = "";
    int count = 0;
    const struct dirent *ent;
    while ((ent = readdir(d))) {
        size_t len = strlen(ent->d_name), k = strlen(".safetensors");
        if (len > k && strcmp(ent->d_name + len - k, ".safetensors") == 0 && count++ == 0)
            snprintf(found, sizeof found, "%s", ent->d_name);
    }
    closedir(d);
    if (count == 0) return qlm_errorf("%s: no model.safetensors, model.safetensors.index.json or *.safetensors file", dir);
    if (count > 1)
        return qlm_errorf("%s: %d .safetensors files but no model.safetensors.index.json to say how they fit", dir, count);
    char path[PATH_MAX];
    if (join_path(path, sizeof path, dir, found) != 0) return -1;
    return qlm_safetensors_load(path, store);
}

int qlm_safetensors_load_dir(const char *dir, qlm_tensor_store *store) {
    char path[PATH_MAX];
    if (join_path(path, sizeof path, dir, "model.safetensors") != 0) return -1;
    if (is_file(path)) return qlm_safetensors_load(path, store);
    if (join_path(path, sizeof path, dir, "model.safetensors.index.json") != 0) return -1;
    if (is_file(path)) return load_index(dir, path, store);
    return load_single_other(dir, store);
}

/* ---------- writing ---------- */

typedef struct {
    char *name; /* owned */
    qlm_dtype dtype;
    int ndim;
    int64_t shape[QLM_MAX_DIMS]; /* as written: block types [rows, bytes per row] */
    const void *data;
    size_t nbytes;
    int group; /* block types */
} st_out;

typedef struct {
    char *buf;
    size_t len, cap;
    int failed;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->buf, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->buf = p;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = 0;
}

static void sb_str(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_fmt(strbuf *b, const char *fmt, long long v) {
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, fmt, v);
    sb_put(b, tmp, (size_t)n);
}

/* A JSON string escaped the way the reference writer (serde_json) does it. */
static void sb_json_str(strbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        const char *esc = NULL;
        switch (*p) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default: break;
        }
        if (esc) {
            sb_str(b, esc);
        } else if (*p < 0x20) {
            char u[8];
            snprintf(u, sizeof u, "\\u%04x", *p);
            sb_str(b, u);
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* The reference writer orders data by dtype (F32, BF16, F16, I8), then by name; this keeps
 * every tensor aligned to its element size and makes our files byte-identical to its own. */
static int dtype_rank(qlm_dtype t) {
    switch (t) {
    case QLM_F32: return 0;
    case QLM_BF16: return 1;
    case QLM_F16: return 2;
    default: return 3;
    }
}

static int cmp_out(const void *a, const void *b) {
    const st_out *x = a, *y = b;
    int rx = dtype_rank(x->dtype), ry = dtype_rank(y->dtype);
    if (rx != ry) return rx - ry;
    return strcmp(x->name, y->name);
}

/* For a file whose data start on a cache line (qlm_safetensors_save_on_lines): the tensors a whole
 * number of lines long first, so that each of them starts on one, then as cmp_out orders. */
static int cmp_out_lines(const void *a, const void *b) {
    const st_out *x = a, *y = b;
    int ox = x->nbytes % 64 != 0, oy = y->nbytes % 64 != 0;
    return ox != oy ? ox - oy : cmp_out(a, b);
}

static int check_entry(const char *path, const qlm_tensor_entry *e) {
    if (qlm_dtype_is_block(e->dtype)) {
        if (e->ndim != 2 || !qlm_group_valid(e->group) || e->shape[0] < 0 || e->shape[1] < 0 ||
            e->shape[1] % e->group || e->nbytes != (size_t)e->shape[0] * qlm_dtype_row_bytes(e->dtype, (long)e->shape[1], e->group))
            return qlm_errorf("%s: tensor %s: not a matrix of whole %s blocks", path, e->name, qlm_dtype_name(e->dtype));
        if (e->nbytes && !e->data) return qlm_errorf("%s: tensor %s: no data", path, e->name);
        return 0;
    }
    if (!dtype_tag(e->dtype)) return qlm_errorf("%s: tensor %s: unsupported dtype", path, e->name);
    if (strcmp(e->name, "__metadata__") == 0) return qlm_errorf("%s: a tensor cannot be named __metadata__", path);
    if (e->ndim < 0 || e->ndim > QLM_MAX_DIMS) return qlm_errorf("%s: tensor %s: bad rank %d", path, e->name, e->ndim);
    uint64_t numel = 1;
    for (int i = 0; i < e->ndim; i++)
        if (e->shape[i] < 0 || __builtin_mul_overflow(numel, (uint64_t)e->shape[i], &numel))
            return qlm_errorf("%s: tensor %s: invalid shape", path, e->name);
    uint64_t want;
    if (__builtin_mul_overflow(numel, (uint64_t)qlm_dtype_size(e->dtype), &want) || want != e->nbytes)
        return qlm_errorf("%s: tensor %s: %zu data bytes do not match its shape", path, e->name, e->nbytes);
    if (e->nbytes && !e->data) return qlm_errorf("%s: tensor %s: no data", path, e->name);
    if (e->row_scales && e->ndim < 1) return qlm_errorf("%s: tensor %s: per-row scales need a row dimension", path, e->name);
    return 0;
}

static int collect_out(const char *path, const qlm_tensor_store *store, st_out *out, int *n_out) {
    int n = 0;
    for (int i = 0; i < qlm_store_count(store); i++) {
        const qlm_tensor_entry *e = qlm_store_at(store, i);
        if (check_entry(path, e) != 0) return -1;
        out[n] = (st_out){.name = strdup(e->name), .dtype = e->dtype, .ndim = e->ndim, .data = e->data, .nbytes = e->nbytes,
                          .group = e->group};
        if (!out[n].name) return qlm_errorf("out of memory");
        memcpy(out[n].shape, e->shape, sizeof e->shape);
        if (qlm_dtype_is_block(e->dtype)) out[n].shape[1] = (int64_t)qlm_dtype_row_bytes(e->dtype, (long)e->shape[1], e->group);
        n++;
        *n_out = n;
        if (e->dtype != QLM_I8) continue;
        char *sname = scale_name(e->name);
        if (!sname) return -1;
        out[n] = (st_out){.name = sname, .dtype = QLM_F32, .ndim = 1};
        n++;
        *n_out = n;
        if (qlm_store_find(store, sname))
            return qlm_errorf("%s: tensor %s clashes with the scale of INT8 tensor %s", path, sname, e->name);
        if (e->row_scales) {
            out[n - 1].shape[0] = e->shape[0];
            out[n - 1].data = e->row_scales;
            out[n - 1].nbytes = (size_t)e->shape[0] * sizeof(float);
        } else {
            out[n - 1].shape[0] = 1;
            out[n - 1].data = &e->scale;
            out[n - 1].nbytes = sizeof(float);
        }
    }
    return 0;
}

/* One key and value of __metadata__, after a comma unless it is the first. */
static void sb_meta(strbuf *b, int *count, const char *key, const char *value) {
    sb_str(b, (*count)++ ? "," : "\"__metadata__\":{");
    sb_json_str(b, key);
    sb_str(b, ":");
    sb_json_str(b, value);
}

/* The header, padded with spaces so that the data start on a multiple of align (8: as the
 * reference writer pads it) after the 8 bytes of its length. */
static int build_header(strbuf *b, st_out *out, int n, const char *const *metadata, size_t align) {
    sb_str(b, "{");
    int count = 0;
    for (int i = 0; metadata && metadata[i]; i += 2) {
        if (!metadata[i + 1]) return qlm_errorf("metadata key %s has no value", metadata[i]);
        sb_meta(b, &count, metadata[i], metadata[i + 1]);
    }
    for (int i = 0; i < n; i++) {
        if (!qlm_dtype_is_block(out[i].dtype)) continue;
        char key[512], value[32];
        snprintf(key, sizeof key, "%s%s", BLOCKS_KEY, out[i].name);
        snprintf(value, sizeof value, "%s/%d", qlm_dtype_name(out[i].dtype), out[i].group);
        sb_meta(b, &count, key, value);
    }
    if (count) sb_str(b, "}");
    int first = count == 0;
    uint64_t pos = 0;
    for (int i = 0; i < n; i++) {
        if (!first) sb_str(b, ",");
        first = 0;
        sb_json_str(b, out[i].name);
        sb_str(b, ":{\"dtype\":\"");
        sb_str(b, qlm_dtype_is_block(out[i].dtype) ? "U8" : dtype_tag(out[i].dtype));
        sb_str(b, "\",\"shape\":[");
        for (int d = 0; d < out[i].ndim; d++) sb_fmt(b, d ? ",%lld" : "%lld", (long long)out[i].shape[d]);
        sb_fmt(b, "],\"data_offsets\":[%lld", (long long)pos);
        pos += out[i].nbytes;
        sb_fmt(b, ",%lld]}", (long long)pos);
    }
    sb_str(b, "}");
    while (!b->failed && (8 + b->len) % align) sb_str(b, " ");
    return b->failed ? qlm_errorf("out of memory building the safetensors header") : 0;
}

static int write_file(const char *path, const strbuf *hdr, const st_out *out, int n) {
    qlm_atomic_file af;
    if (qlm_atomic_open(&af, path) != 0) return -1;
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (uint8_t)((uint64_t)hdr->len >> (8 * i));
    int rc = qlm_atomic_write(&af, lenbuf, 8);
    if (rc == 0) rc = qlm_atomic_write(&af, hdr->buf, hdr->len);
    for (int i = 0; i < n && rc == 0; i++) rc = qlm_atomic_write(&af, out[i].data, out[i].nbytes);
    if (rc != 0) {
        qlm_atomic_abort(&af);
        return -1;
    }
    return qlm_atomic_commit(&af);
}

static int save(const char *path, const qlm_tensor_store *store, const char *const *metadata, int on_lines) {
    int cap = 2 * qlm_store_count(store);
    st_out *out = calloc((size_t)cap + 1, sizeof *out);
    if (!out) return qlm_errorf("out of memory");
    int n = 0;
    strbuf hdr = {0};
    int rc = collect_out(path, store, out, &n);
    if (rc == 0) {
        qsort(out, (size_t)n, sizeof *out, on_lines ? cmp_out_lines : cmp_out);
        rc = build_header(&hdr, out, n, metadata, on_lines ? 64 : 8);
        if (rc != 0) qlm_error_context("%s", path);
    }
    if (rc == 0) rc = write_file(path, &hdr, out, n);
    for (int i = 0; i < n; i++) free(out[i].name);
    free(out);
    free(hdr.buf);
    return rc;
}

int qlm_safetensors_save(const char *path, const qlm_tensor_store *store, const char *const *metadata) {
    return save(path, store, metadata, 0);
}

int qlm_safetensors_save_on_lines(const char *path, const qlm_tensor_store *store, const char *const *metadata) {
    return save(path, store, metadata, 1);
}
