/* Trainer checkpoints: the tensors in checkpoint-STEP.safetensors (value, .adam_m, .adam_v per
 * trainable tensor, F32), committed by atomically replacing checkpoint.json, which names that
 * file and holds the step counters, the loss scale and the caller's state (data position). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../loaders/atomic_file.h"
#include "../loaders/read_file.h"
#include "../loaders/safetensors.h"
#include "trainer.h"

static const char *mode_name(qlm_train_mode m) {
    return m == QLM_TRAIN_LORA ? "lora" : m == QLM_TRAIN_FULL ? "full" : "qat";
}

/* Removes checkpoint files other than keep, and temporary files a crash left behind. */
static void remove_stale(const char *dir, const char *keep) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int ours = strncmp(e->d_name, "checkpoint-", 11) == 0 || strncmp(e->d_name, "checkpoint.json.tmp.", 20) == 0;
        if (!ours || (keep && strcmp(e->d_name, keep) == 0)) continue;
        char path[4352];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

int qlm_trainer_save(const qlm_trainer *t, const char *dir, const char *extra_json) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return qlm_errorf("%s: cannot create: %s", dir, strerror(errno));
    cJSON *extra = extra_json ? cJSON_Parse(extra_json) : cJSON_CreateObject();
    if (!extra) return qlm_errorf("checkpoint state is not valid JSON");
    qlm_tensor_store *store = qlm_store_new();
    int rc = store ? 0 : qlm_errorf("out of memory");
    for (int i = 0; i < t->n_t && rc == 0; i++) {
        const qlm_train_tensor *e = &t->t[i];
        int64_t shape[2] = {e->rows, e->cols};
        int ndim = e->cols ? 2 : 1;
        const char *suffix[3] = {"", ".adam_m", ".adam_v"};
        const float *data[3] = {e->p, e->m, e->v};
        for (int k = 0; k < 3 && rc == 0; k++) {
            char name[220];
            snprintf(name, sizeof name, "%s%s", e->name, suffix[k]);
            if (!qlm_store_add(store, name, QLM_F32, ndim, shape, data[k], (size_t)e->n * sizeof(float))) rc = -1;
        }
    }
    char file[64], path[4352];
    snprintf(file, sizeof file, "checkpoint-%ld.safetensors", t->step);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (rc == 0) rc = qlm_safetensors_save(path, store, NULL);
    qlm_store_free(store);
    if (rc == 0) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "format", "qlm-train-checkpoint");
        cJSON_AddNumberToObject(j, "version", 1);
        cJSON_AddStringToObject(j, "mode", mode_name(t->o.mode));
        cJSON_AddStringToObject(j, "tensors", file);
        cJSON_AddNumberToObject(j, "step", (double)t->step);
        cJSON_AddNumberToObject(j, "adam_step", (double)t->adam_step);
        cJSON_AddNumberToObject(j, "loss_scale", t->loss_scale);
        cJSON_AddNumberToObject(j, "clean_steps", (double)t->clean_steps);
        cJSON_AddItemToObject(j, "state", extra);
        extra = NULL;
        char *text = cJSON_Print(j);
        cJSON_Delete(j);
        snprintf(path, sizeof path, "%s/checkpoint.json", dir);
        rc = text ? qlm_atomic_write_text(path, text) : qlm_errorf("out of memory");
        free(text);
        if (rc == 0) remove_stale(dir, file);
    }
    cJSON_Delete(extra);
    return rc;
}

static int get_count(const cJSON *j, const char *key, const char *path, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0)
        return qlm_errorf("%s: \"%s\" is missing or not a non-negative number", path, key);
    *out = v->valuedouble;
    return 0;
}

/* Copies a checkpoint tensor into dst after checking its dtype and size. */
static int restore(const qlm_tensor_store *store, const char *file, const char *name, float *dst, long n) {
    const qlm_tensor_entry *e = qlm_store_find(store, name);
    if (!e) return qlm_errorf("%s: tensor %s is missing (a checkpoint of another model or setup?)", file, name);
    if (e->dtype != QLM_F32 || qlm_entry_numel(e) != n)
        return qlm_errorf("%s: tensor %s has %lld values of %s, expected %ld F32", file, name,
                          (long long)qlm_entry_numel(e), qlm_dtype_name(e->dtype), n);
    memcpy(dst, e->data, (size_t)n * sizeof *dst);
    return 0;
}

int qlm_trainer_load(qlm_trainer *t, const char *dir, char **extra_json) {
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
    int rc = -1;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format"), *mode = cJSON_GetObjectItemCaseSensitive(j, "mode"),
                *file = cJSON_GetObjectItemCaseSensitive(j, "tensors"), *state = cJSON_GetObjectItemCaseSensitive(j, "state");
    double step, adam_step, scale, clean;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "qlm-train-checkpoint") != 0) {
        qlm_errorf("%s: not a qlm training checkpoint", path);
    } else if (!cJSON_IsString(mode) || strcmp(mode->valuestring, mode_name(t->o.mode)) != 0) {
        qlm_errorf("%s: a %s checkpoint cannot resume %s training", path,
                   cJSON_IsString(mode) ? mode->valuestring : "?", mode_name(t->o.mode));
    } else if (!cJSON_IsString(file) || strchr(file->valuestring, '/') || strncmp(file->valuestring, "checkpoint-", 11)) {
        qlm_errorf("%s: \"tensors\" must name a checkpoint-*.safetensors file in the same folder", path);
    } else if (get_count(j, "step", path, &step) || get_count(j, "adam_step", path, &adam_step) ||
               get_count(j, "loss_scale", path, &scale) || get_count(j, "clean_steps", path, &clean)) {
    } else if (!(scale > 0)) {
        qlm_errorf("%s: loss_scale must be positive", path);
    } else {
        char tensors[4352];
        snprintf(tensors, sizeof tensors, "%s/%s", dir, file->valuestring);
        qlm_tensor_store *store = qlm_store_new();
        rc = store ? qlm_safetensors_load(tensors, store) : qlm_errorf("out of memory");
        for (int i = 0; i < t->n_t && rc == 0; i++) {
            qlm_train_tensor *e = &t->t[i];
            char name[220];
            snprintf(name, sizeof name, "%s.adam_m", e->name);
            rc = restore(store, tensors, e->name, e->p, e->n) || restore(store, tensors, name, e->m, e->n);
            snprintf(name, sizeof name, "%s.adam_v", e->name);
            if (rc == 0) rc = restore(store, tensors, name, e->v, e->n);
        }
        qlm_store_free(store);
        if (rc == 0) {
            t->step = (long)step;
            t->adam_step = (long)adam_step;
            t->loss_scale = (float)scale;
            t->clean_steps = (long)clean;
            *extra_json = state ? cJSON_PrintUnformatted(state) : NULL;
            qlm_trainer_refresh(t);
        } else {
            rc = -1;
        }
    }
    cJSON_Delete(j);
    return rc;
}
