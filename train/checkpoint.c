/* Trainer checkpoints. Each rank that holds a distinct part of the state (the first replica of
 * each part; with one process, the process) writes its pieces' values and AdamW moments to its
 * own checkpoint-STEP[-part-R-of-S].safetensors; a piece that is not a whole tensor is stored as
 * NAME@OFFSET (NAME.adam_m@OFFSET, ...). When every rank has written, rank 0 commits by atomically
 * replacing checkpoint.json, which lists the files and holds the step counters, the loss scale
 * and the caller's state (data position). A load fills each of this rank's pieces from the stored
 * pieces that overlap it, so a run resumes whatever the number of ranks and the strategy that
 * wrote the checkpoint. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/atomic_file.h"
#include "../core/read_file.h"
#include "../loaders/safetensors.h"
#include "trainer_internal.h"

enum { MAX_FILES = 4096 };

static const char *mode_name(qlm_train_mode m) {
    return m == QLM_TRAIN_LORA ? "lora" : m == QLM_TRAIN_FULL ? "full" : "qat";
}

static const char *const k_suffix[3] = {"", ".adam_m", ".adam_v"};

/* "NAME[.adam_m|.adam_v][@OFFSET]" of piece e. */
static void stored_name(char *buf, size_t cap, const qlm_train_tensor *e, int kind) {
    if (e->offset == 0 && e->n == e->full_n) snprintf(buf, cap, "%s%s", e->name, k_suffix[kind]);
    else snprintf(buf, cap, "%s%s@%ld", e->name, k_suffix[kind], e->offset);
}

static void file_name(char *buf, size_t cap, long step, int part, int parts) {
    if (parts == 1) snprintf(buf, cap, "checkpoint-%ld.safetensors", step);
    else snprintf(buf, cap, "checkpoint-%ld-part-%d-of-%d.safetensors", step, part, parts);
}

/* Removes checkpoint files not listed in keep, and temporary files a crash left behind. */
static void remove_stale(const char *dir, char keep[][64], int n_keep) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int ours = strncmp(e->d_name, "checkpoint-", 11) == 0 || strncmp(e->d_name, "checkpoint.json.tmp.", 20) == 0;
        for (int k = 0; ours && k < n_keep; k++) ours = strcmp(e->d_name, keep[k]) != 0;
        if (!ours) continue;
        char path[4352];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

/* Whether this rank writes: the first replica of its part. */
static int writes(const qlm_trainer *t) { return !t->sh->replica || t->sh->replica->rank == 0; }

static int write_part(const qlm_trainer *t, const char *dir, const char *file) {
    const qlm_backend *be = t->arch->backend(t->model);
    qlm_tensor_store *store = qlm_store_new();
    int rc = store ? 0 : qlm_errorf("out of memory");
    for (int i = 0; i < t->n_t && rc == 0; i++) {
        const qlm_train_tensor *e = &t->t[i];
        if (e->replicated && t->sh->rank != 0) continue;
        int64_t shape[2] = {e->rows, e->cols};
        int ndim = e->cols ? 2 : 1;
        const float *data[3] = {e->p, e->m, e->v};
        for (int k = 0; k < 3 && rc == 0; k++) {
            char name[260];
            stored_name(name, sizeof name, e, k);
            size_t bytes = (size_t)e->n * sizeof(float);
            /* Host memory is written from where it lies; device memory is copied out first. */
            void *copy;
            if (be->host_memory) {
                if (!qlm_store_add(store, name, QLM_F32, ndim, shape, data[k], bytes)) rc = -1;
            } else if (qlm_store_add_owned(store, name, QLM_F32, ndim, shape, &copy)) {
                be->to_host(copy, data[k], bytes);
            } else {
                rc = -1;
            }
        }
    }
    char path[4352];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (rc == 0) rc = qlm_safetensors_save(path, store, NULL);
    qlm_store_free(store);
    return rc;
}

/* Every rank learns whether any failed (also a barrier): 0 when none did. */
static int agree(const qlm_trainer *t, int rc) {
    double failed = rc != 0;
    if (qlm_train_sum_world(t, &failed, 1) != 0) return -1;
    if (failed > 0 && rc == 0) return qlm_errorf("another rank failed (its message says why)");
    return rc;
}

static int commit(const qlm_trainer *t, const char *dir, cJSON *extra, char files[][64], int parts) {
    const struct qlm_train_shards *sh = t->sh;
    cJSON *j = cJSON_CreateObject(), *list = cJSON_CreateArray();
    cJSON_AddStringToObject(j, "format", "qlm-train-checkpoint");
    cJSON_AddNumberToObject(j, "version", 2);
    cJSON_AddStringToObject(j, "mode", mode_name(t->o.mode));
    for (int k = 0; k < parts; k++) cJSON_AddItemToArray(list, cJSON_CreateString(files[k]));
    cJSON_AddItemToObject(j, "tensors", list);
    cJSON_AddNumberToObject(j, "world_size", sh->world ? sh->world->size : 1);
    cJSON_AddStringToObject(j, "strategy", qlm_shard_strategy_name(sh->strategy));
    cJSON_AddNumberToObject(j, "shard_group", sh->S);
    cJSON_AddNumberToObject(j, "step", (double)t->step);
    cJSON_AddNumberToObject(j, "adam_step", (double)t->adam_step);
    cJSON_AddNumberToObject(j, "loss_scale", t->loss_scale);
    cJSON_AddNumberToObject(j, "clean_steps", (double)t->clean_steps);
    cJSON_AddItemReferenceToObject(j, "state", extra);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    char path[4352];
    snprintf(path, sizeof path, "%s/checkpoint.json", dir);
    int rc = text ? qlm_atomic_write_text(path, text) : qlm_errorf("out of memory");
    free(text);
    if (rc == 0) remove_stale(dir, files, parts);
    return rc;
}

int qlm_trainer_save(const qlm_trainer *t, const char *dir, const char *extra_json) {
    const struct qlm_train_shards *sh = t->sh;
    int rc = 0, world_rank = sh->world ? sh->world->rank : 0;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) rc = qlm_errorf("%s: cannot create: %s", dir, strerror(errno));
    cJSON *extra = extra_json ? cJSON_Parse(extra_json) : cJSON_CreateObject();
    if (rc == 0 && !extra) rc = qlm_errorf("checkpoint state is not valid JSON");
    int parts = sh->S;
    char (*files)[64] = calloc((size_t)parts, sizeof *files);
    if (rc == 0 && !files) rc = qlm_errorf("out of memory");
    for (int k = 0; k < parts && files; k++) file_name(files[k], sizeof files[k], t->step, k, parts);
    if (rc == 0 && writes(t)) rc = write_part(t, dir, files[sh->rank]);
    rc = agree(t, rc);
    if (rc == 0 && world_rank == 0) rc = commit(t, dir, extra, files, parts);
    rc = agree(t, rc);
    cJSON_Delete(extra);
    free(files);
    return rc;
}

static int get_count(const cJSON *j, const char *key, const char *path, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0)
        return qlm_errorf("%s: \"%s\" is missing or not a non-negative number", path, key);
    *out = v->valuedouble;
    return 0;
}

/* One stored tensor, as a range of a trainable tensor. */
typedef struct {
    const char *base; /* NAME (with the moment suffix), not NUL-terminated at base_len */
    size_t base_len;
    long offset, n;
    const qlm_tensor_entry *e;
} stored_piece;

static int cmp_piece(const void *a, const void *b) {
    const stored_piece *x = a, *y = b;
    size_t n = x->base_len < y->base_len ? x->base_len : y->base_len;
    int c = memcmp(x->base, y->base, n);
    if (c) return c;
    if (x->base_len != y->base_len) return x->base_len < y->base_len ? -1 : 1;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Indexes the store's tensors by name and offset; -1 for a malformed name or a non-F32 tensor. */
static stored_piece *index_store(const qlm_tensor_store *store, int *count) {
    int n = qlm_store_count(store);
    stored_piece *ix = calloc((size_t)(n ? n : 1), sizeof *ix);
    if (!ix) {
        qlm_errorf("out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        const qlm_tensor_entry *e = qlm_store_at(store, i);
        const char *at = strrchr(e->name, '@');
        long offset = 0;
        if (at) {
            char *end;
            offset = strtol(at + 1, &end, 10);
            if (*end || end == at + 1 || offset < 0) {
                free(ix);
                qlm_errorf("tensor %s: the part after @ is not an offset", e->name);
                return NULL;
            }
        }
        if (e->dtype != QLM_F32) {
            free(ix);
            qlm_errorf("tensor %s is %s, expected F32", e->name, qlm_dtype_name(e->dtype));
            return NULL;
        }
        ix[i] = (stored_piece){e->name, at ? (size_t)(at - e->name) : strlen(e->name), offset, (long)qlm_entry_numel(e), e};
    }
    qsort(ix, (size_t)n, sizeof *ix, cmp_piece);
    *count = n;
    return ix;
}

/* Copies into dst (piece e's values of one kind) every stored range that overlaps it. */
static int restore(const stored_piece *ix, int count, const qlm_train_tensor *e, int kind, float *dst) {
    char base[260];
    snprintf(base, sizeof base, "%s%s", e->name, k_suffix[kind]);
    stored_piece key = {base, strlen(base), 0, 0, NULL};
    int lo = 0, hi = count;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (cmp_piece(&ix[mid], &key) < 0) lo = mid + 1;
        else hi = mid;
    }
    long covered = 0, begin = e->offset, end = e->offset + e->n;
    for (int i = lo; i < count && ix[i].base_len == key.base_len && memcmp(ix[i].base, base, key.base_len) == 0; i++) {
        const stored_piece *p = &ix[i];
        if (p->offset + p->n > e->full_n)
            return qlm_errorf("tensor %s holds values %ld..%ld of a tensor of %ld (a checkpoint of another model?)",
                              p->e->name, p->offset, p->offset + p->n, e->full_n);
        long a = p->offset > begin ? p->offset : begin, b = p->offset + p->n < end ? p->offset + p->n : end;
        if (a >= b) continue;
        memcpy(dst + (a - begin), (const float *)p->e->data + (a - p->offset), (size_t)(b - a) * sizeof *dst);
        covered += b - a;
    }
    if (covered != e->n)
        return qlm_errorf("tensor %s: the checkpoint holds %ld of the %ld values %ld..%ld this rank needs (a "
                          "checkpoint of another model or setup?)",
                          base, covered, e->n, begin, end);
    return 0;
}

static int file_entry(const cJSON *f, const char *path, char names[][256], int *n) {
    if (!cJSON_IsString(f) || strchr(f->valuestring, '/') || strncmp(f->valuestring, "checkpoint-", 11) ||
        strlen(f->valuestring) >= 256)
        return qlm_errorf("%s: \"tensors\" must name checkpoint-*.safetensors files in the same folder", path);
    if (*n == MAX_FILES) return qlm_errorf("%s: more than %d files", path, MAX_FILES);
    snprintf(names[(*n)++], 256, "%s", f->valuestring);
    return 0;
}

/* The names in "tensors": one file (version 1) or a list. */
static int tensor_files(const cJSON *files, const char *path, char names[][256], int *n) {
    *n = 0;
    if (cJSON_IsString(files)) return file_entry(files, path, names, n);
    if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) == 0)
        return qlm_errorf("%s: \"tensors\" must name the checkpoint's files", path);
    const cJSON *f;
    cJSON_ArrayForEach(f, files) if (file_entry(f, path, names, n) != 0) return -1;
    return 0;
}

static int load_tensors(qlm_trainer *t, const char *dir, char names[][256], int n_files) {
    qlm_tensor_store *store = qlm_store_new();
    int rc = store ? 0 : qlm_errorf("out of memory");
    for (int k = 0; k < n_files && rc == 0; k++) {
        char file[4352];
        snprintf(file, sizeof file, "%s/%s", dir, names[k]);
        rc = qlm_safetensors_load(file, store);
    }
    int count = 0;
    stored_piece *ix = rc == 0 ? index_store(store, &count) : NULL;
    if (rc == 0 && !ix) rc = -1;
    const qlm_backend *be = t->arch->backend(t->model);
    /* Device memory is filled from one host buffer of the largest piece. */
    long largest = 1;
    for (int i = 0; i < t->n_t; i++)
        if (t->t[i].n > largest) largest = t->t[i].n;
    float *staged = NULL;
    if (rc == 0 && !be->host_memory && !(staged = malloc((size_t)largest * sizeof *staged)))
        rc = qlm_errorf("out of memory");
    for (int i = 0; i < t->n_t && rc == 0; i++) {
        qlm_train_tensor *e = &t->t[i];
        float *dst[3] = {e->p, e->m, e->v};
        for (int k = 0; k < 3 && rc == 0; k++) {
            rc = restore(ix, count, e, k, staged ? staged : dst[k]);
            if (rc == 0 && staged) be->to_device(dst[k], staged, (size_t)e->n * sizeof *staged);
        }
    }
    free(staged);
    if (rc != 0) qlm_error_context("%s", dir);
    free(ix);
    qlm_store_free(store);
    return rc;
}

static int load_manifest(qlm_trainer *t, const char *dir, cJSON *j, const char *path, char **extra_json) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format"), *mode = cJSON_GetObjectItemCaseSensitive(j, "mode"),
                *files = cJSON_GetObjectItemCaseSensitive(j, "tensors"),
                *state = cJSON_GetObjectItemCaseSensitive(j, "state");
    double step = 0, adam_step = 0, scale = 1, clean = 0;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "qlm-train-checkpoint") != 0)
        return qlm_errorf("%s: not a qlm training checkpoint", path);
    if (!cJSON_IsString(mode) || strcmp(mode->valuestring, mode_name(t->o.mode)) != 0)
        return qlm_errorf("%s: a %s checkpoint cannot resume %s training", path,
                          cJSON_IsString(mode) ? mode->valuestring : "?", mode_name(t->o.mode));
    if (get_count(j, "step", path, &step) || get_count(j, "adam_step", path, &adam_step) ||
        get_count(j, "loss_scale", path, &scale) || get_count(j, "clean_steps", path, &clean))
        return -1;
    if (!(scale > 0)) return qlm_errorf("%s: loss_scale must be positive", path);
    char(*names)[256] = malloc(MAX_FILES * sizeof *names);
    if (!names) return qlm_errorf("out of memory");
    int n_files = 0, rc = tensor_files(files, path, names, &n_files);
    if (rc == 0) rc = load_tensors(t, dir, names, n_files);
    free(names);
    if (rc != 0) return -1;
    t->step = (long)step;
    t->adam_step = (long)adam_step;
    t->loss_scale = (float)scale;
    t->clean_steps = (long)clean;
    *extra_json = state ? cJSON_PrintUnformatted(state) : NULL;
    return 0;
}

int qlm_trainer_peek(const char *dir, char **extra_json) {
    char path[4352];
    snprintf(path, sizeof path, "%s/checkpoint.json", dir);
    *extra_json = NULL;
    if (access(path, F_OK) != 0) return 1;
    size_t len = 0;
    char *text = qlm_read_file(path, 1 << 20, &len);
    if (!text) return -1;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j) return qlm_errorf("%s: not valid JSON", path);
    const cJSON *state = cJSON_GetObjectItemCaseSensitive(j, "state");
    *extra_json = state ? cJSON_PrintUnformatted(state) : NULL;
    cJSON_Delete(j);
    return 0;
}

int qlm_trainer_load(qlm_trainer *t, const char *dir, char **extra_json) {
    char path[4352];
    snprintf(path, sizeof path, "%s/checkpoint.json", dir);
    *extra_json = NULL;
    if (access(path, F_OK) != 0) return 1;
    size_t len = 0;
    char *text = qlm_read_file(path, 1 << 20, &len);
    int rc = -1;
    if (text) {
        cJSON *j = cJSON_ParseWithLength(text, len);
        rc = j ? load_manifest(t, dir, j, path, extra_json) : qlm_errorf("%s: not valid JSON", path);
        cJSON_Delete(j);
        free(text);
    }
    rc = agree(t, rc);
    if (rc == 0) rc = qlm_trainer_refresh(t);
    if (rc != 0) {
        free(*extra_json);
        *extra_json = NULL;
    }
    return rc;
}
