/* Helpers shared by the training tests that compare with PyTorch fixtures: reading a fixture's
 * JSON, its reference numbers, and comparing every trainable tensor with a safetensors file. */
#ifndef QLM_TRAIN_TEST_UTIL_H
#define QLM_TRAIN_TEST_UTIL_H

#include <cjson/cJSON.h>
#include <math.h>

#include "../core/error.h"
#include "../core/read_file.h"
#include "../loaders/safetensors.h"
#include "../train/trainer.h"
#include "test_util.h"

static inline cJSON *train_fixture_json(const char *dir, const char *file) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    size_t len;
    char *text = qlm_read_file(path, 1 << 20, &len);
    if (!text) fail_msg("%s", qlm_last_error());
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j) fail_msg("%s: not valid JSON", path);
    return j;
}

static inline double ref_num(const cJSON *ref, const char *key) {
    const cJSON *v = cJSON_GetObjectItem(ref, key);
    if (!cJSON_IsNumber(v)) fail_msg("reference.json: %s missing", key);
    return v->valuedouble;
}

static inline double ref_at(const cJSON *ref, const char *key, int i) {
    const cJSON *v = cJSON_GetArrayItem(cJSON_GetObjectItem(ref, key), i);
    if (!cJSON_IsNumber(v)) fail_msg("reference.json: %s[%d] missing", key, i);
    return v->valuedouble;
}

/* Every trainable tensor's value (what = 'p') or gradient ('g') against dir/file's
 * tensor of the same name, which must hold exactly those tensors: |diff| <= tol * max(1, max |ref|)
 * for each element, except that one in 10,000 of the file's elements (rounded down) may lie up to
 * outlier_tol * that scale away. */
static inline void compare_tensors_outliers(const qlm_trainer *t, const char *dir, const char *file, char what,
                                            double tol, double outlier_tol) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    qlm_tensor_store *store = qlm_store_new();
    if (qlm_safetensors_load(path, store) != 0) fail_msg("%s", qlm_last_error());
    double worst = 0;
    long total = 0, outliers = 0;
    const char *worst_name = "";
    const qlm_backend *be = t->arch->backend(t->model);
    for (int i = 0; i < t->n_t; i++) {
        const qlm_train_tensor *e = &t->t[i];
        const qlm_tensor_entry *r = qlm_store_find(store, e->name);
        if (!r) fail_msg("%s: no tensor %s", path, e->name);
        assert_int_equal(qlm_entry_numel(r), e->n);
        const float *ref = r->data;
        float *ours = malloc((size_t)e->n * sizeof *ours);
        assert_non_null(ours);
        be->to_host(ours, what == 'p' ? e->p : e->g, (size_t)e->n * sizeof *ours);
        double max_ref = 1;
        for (long k = 0; k < e->n; k++)
            if (fabs(ref[k]) > max_ref) max_ref = fabs(ref[k]);
        for (long k = 0; k < e->n; k++) {
            double d = fabs(ref[k] - ours[k]) / max_ref;
            outliers += d > tol;
            if (d > worst) worst = d, worst_name = e->name;
        }
        total += e->n;
        free(ours);
    }
    print_message("%s: %d tensors, worst |diff|/scale %.3g (%s), %ld of %ld elements beyond %.3g\n", path, t->n_t,
                  worst, worst_name, outliers, total, tol);
    assert_int_equal(t->n_t, qlm_store_count(store));
    assert_true(outliers <= total / 10000);
    assert_true(worst <= fmax(tol, outlier_tol));
    qlm_store_free(store);
}

/* The same with no element beyond tol. */
static inline void compare_tensors(const qlm_trainer *t, const char *dir, const char *file, char what, double tol) {
    compare_tensors_outliers(t, dir, file, what, tol, tol);
}

#endif
