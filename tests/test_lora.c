/* LoRA adapters against peft (tools/make_lora_fixtures.py): every fixture adapter loads with the
 * configuration and shapes peft used; the F32 base with the adapter merged gives peft's unmerged
 * logits to 1e-4, and the backend's unmerged lora op equals the merged weight; unmerge
 * restores every weight to within one unit in the last place; save -> load is bit-exact; the
 * registry; the batch scheduler reuses a shared prompt prefix only between requests with the same
 * adapter; bad adapters fail with a clear error and change neither the base nor the registry;
 * `qlm lora info` and `qlm lora merge` through the binary.
 * With QLM_EXPORT_DIR set, every fixture adapter is also saved there by qlm, for
 * `tools/make_lora_fixtures.py --check DIR` (peft loads them and reproduces the logits). */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <unistd.h>

#include "../runtime/batch.h"
#include "../core/error.h"
#include "../models/model.h"
#include "../models/t5.h"
#include "../loaders/model_source.h"
#include "../loaders/safetensors.h"
#include "../lora/lora.h"
#include "../quant/half.h"
#include "../quant/matmul.h"
#include "test_util.h"

#define FIX "tests/fixtures/lora"

static const char *const k_names[] = {"mha_attn_r8",        "mha_mlp_rslora_r16", "qwen2_all_rslora_r4",
                                      "gqa_regex_patterns", "t5_all_patterns_r8", "t5_qv_rslora_r16"};
enum { N_FIXTURES = sizeof k_names / sizeof k_names[0] };

/* ---- fixtures and their base models ---- */

typedef struct {
    char dir[256], base_dir[256];
    cJSON *ref, *base_ref;
    qlm_source src;
} fixture;

static cJSON *read_json(const char *path) {
    char *text = test_read_file(path, NULL);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    return j;
}

static void open_fixture(fixture *f, const char *name) {
    char path[1024];
    snprintf(f->dir, sizeof f->dir, FIX "/%s", name);
    snprintf(path, sizeof path, "%s/reference.json", f->dir);
    f->ref = read_json(path);
    snprintf(f->base_dir, sizeof f->base_dir, "tests/fixtures/%s", cJSON_GetObjectItem(f->ref, "base")->valuestring);
    snprintf(path, sizeof path, "%s/reference.json", f->base_dir);
    f->base_ref = read_json(path);
    if (qlm_source_open(&f->src, f->base_dir, NULL) != 0) fail_msg("%s", qlm_last_error());
}

static void close_fixture(fixture *f) {
    cJSON_Delete(f->ref);
    cJSON_Delete(f->base_ref);
    qlm_source_close(&f->src);
}

static const qlm_llama_config *llama_cfg(const fixture *f) { return f->src.is_t5 ? NULL : &f->src.cfg; }
static const qlm_t5_config *t5_cfg(const fixture *f) { return f->src.is_t5 ? &f->src.t5 : NULL; }

static int load_for(qlm_lora_adapter *a, const char *path, const fixture *f, qlm_dtype dt) {
    return qlm_lora_load(a, path, NULL, llama_cfg(f), t5_cfg(f), dt);
}

typedef struct {
    int is_t5;
    qlm_model m;
    qlm_t5_model t5;
} base_model;

/* be: test_backend() for the tests that only run the model, the CPU for those that read its weights. */
static void build_base_on(base_model *b, const fixture *f, qlm_dtype dt, const qlm_backend *be) {
    qlm_model_options o = {.dtype = dt, .backend = be};
    b->is_t5 = f->src.is_t5;
    int rc = b->is_t5 ? qlm_t5_build(&b->t5, &f->src.t5, f->src.store, &o) : qlm_model_build(&b->m, &f->src.cfg, f->src.store, &o);
    if (rc != 0) fail_msg("%s", qlm_last_error());
}

static void build_base(base_model *b, const fixture *f, qlm_dtype dt) { build_base_on(b, f, dt, qlm_backend_cpu()); }

/* An adapter loaded for the model's backend, placed in its memory. */
static int load_placed(qlm_lora_adapter *a, const char *path, const fixture *f, qlm_dtype dt, const base_model *b) {
    if (load_for(a, path, f, dt) != 0) return -1;
    return qlm_lora_place(a, b->is_t5 ? b->t5.be : b->m.be);
}

static void free_base(base_model *b) {
    if (b->is_t5) qlm_t5_free(&b->t5);
    else qlm_model_free(&b->m);
}

static int merge_base(base_model *b, const qlm_lora_adapter *a, int sign) {
    return b->is_t5 ? qlm_lora_merge_t5(&b->t5, a, sign) : qlm_lora_merge(&b->m, a, sign);
}

/* The model weight a module changes. */
static qlm_weight *base_weight(base_model *b, const qlm_lora_module *m) {
    if (!b->is_t5) {
        qlm_layer *L = &b->m.layers[m->layer];
        qlm_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        assert_true(m->target <= QLM_LORA_DOWN);
        return w[m->target];
    }
    qlm_t5_layer *L = m->stack ? &b->t5.dec[m->layer] : &b->t5.enc[m->layer];
    qlm_weight *w[] = {[QLM_LORA_Q] = &L->q,        [QLM_LORA_K] = &L->k,        [QLM_LORA_V] = &L->v,
                       [QLM_LORA_O] = &L->o,        [QLM_LORA_CROSS_Q] = &L->cq, [QLM_LORA_CROSS_K] = &L->ck,
                       [QLM_LORA_CROSS_V] = &L->cv, [QLM_LORA_CROSS_O] = &L->co, [QLM_LORA_WI0] = &L->wi0,
                       [QLM_LORA_WI1] = &L->wi1,    [QLM_LORA_WO] = &L->wo};
    assert_non_null(w[m->target]);
    return w[m->target];
}

/* Every parameter byte of the model, for "unchanged" checks. */
static char *snapshot(const base_model *b, size_t *n) {
    size_t total = b->is_t5 ? b->t5.shared_bytes : b->m.shared_bytes;
    int n_enc = b->is_t5 ? b->t5.cfg.n_layers : b->m.cfg.n_layers, n_dec = b->is_t5 ? b->t5.cfg.n_dec_layers : 0;
    for (int l = 0; l < n_enc + n_dec; l++)
        total += b->is_t5 ? (l < n_enc ? b->t5.enc[l] : b->t5.dec[l - n_enc]).buffer_bytes : b->m.layers[l].buffer_bytes;
    char *s = malloc(total), *p = s;
    assert_non_null(s);
    memcpy(p, b->is_t5 ? b->t5.shared_buffer : b->m.shared_buffer, b->is_t5 ? b->t5.shared_bytes : b->m.shared_bytes);
    p += b->is_t5 ? b->t5.shared_bytes : b->m.shared_bytes;
    for (int l = 0; l < n_enc + n_dec; l++) {
        const void *buf = b->is_t5 ? (l < n_enc ? b->t5.enc[l] : b->t5.dec[l - n_enc]).buffer : b->m.layers[l].buffer;
        size_t bytes = b->is_t5 ? (l < n_enc ? b->t5.enc[l] : b->t5.dec[l - n_enc]).buffer_bytes : b->m.layers[l].buffer_bytes;
        memcpy(p, buf, bytes);
        p += bytes;
    }
    *n = total;
    return s;
}

static int *json_ids(const cJSON *arr, int *n) {
    *n = cJSON_GetArraySize(arr);
    int *ids = malloc((size_t)(*n ? *n : 1) * sizeof *ids);
    for (int i = 0; i < *n; i++) ids[i] = cJSON_GetArrayItem(arr, i)->valueint;
    return ids;
}

/* Llama: the logits of every position of the base fixture's tokens; T5: the teacher-forced
 * decoder logits over decoder_ids[:-1]. *count floats, malloc'd. */
/* The fixture's logits with adapter (NULL: none) applied unmerged in slot 0. */
static float *logits_with(const fixture *f, const base_model *b, const qlm_lora_adapter *adapter, size_t *count) {
    int vocab = b->is_t5 ? b->t5.cfg.vocab_size : b->m.cfg.vocab_size, n, n_src = 0;
    int *ids = json_ids(cJSON_GetObjectItem(f->base_ref, b->is_t5 ? "decoder_ids" : "tokens"), &n);
    int *src = b->is_t5 ? json_ids(cJSON_GetObjectItem(f->base_ref, "input_ids"), &n_src) : NULL;
    if (b->is_t5) n--;
    int *pos = malloc((size_t)n * sizeof *pos);
    for (int i = 0; i < n; i++) pos[i] = i;
    float *logits = malloc((size_t)n * vocab * sizeof *logits);
    if (b->is_t5) {
        qlm_t5_state s;
        assert_int_equal(qlm_t5_state_init(&s, &b->t5, n_src, n, 1), 0);
        qlm_lora_slots_set(&s.lora, 0, adapter);
        assert_int_equal(qlm_t5_encode(&b->t5, &s, 0, src, n_src), 0);
        assert_int_equal(qlm_t5_decode(&b->t5, &s, ids, pos, NULL, n, pos, n, logits), 0);
        qlm_t5_state_free(&s, &b->t5);
    } else {
        qlm_kv_state s;
        assert_int_equal(qlm_state_init(&s, &b->m, n, 16), 0);
        qlm_lora_slots_set(&s.lora, 0, adapter);
        assert_int_equal(qlm_forward(&b->m, &s, ids, pos, n, pos, n, logits), 0);
        qlm_state_free(&s, &b->m);
    }
    free(ids);
    free(src);
    free(pos);
    *count = (size_t)n * vocab;
    return logits;
}

static float *logits_of(const fixture *f, const base_model *b, size_t *count) {
    return logits_with(f, b, NULL, count);
}

static double max_diff_file(const float *got, size_t n, const char *path) {
    size_t len = 0;
    float *ref = (float *)test_read_file(path, &len);
    assert_non_null(ref);
    assert_int_equal(len, n * sizeof(float));
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)got[i] - ref[i]));
    free(ref);
    return d;
}

static void assert_adapters_equal(const qlm_lora_adapter *x, const qlm_lora_adapter *y) {
    assert_int_equal(x->n_modules, y->n_modules);
    assert_int_equal(x->is_t5, y->is_t5);
    assert_int_equal(x->dtype, y->dtype);
    assert_int_equal(x->n_params, y->n_params);
    for (int i = 0; i < x->n_modules; i++) {
        const qlm_lora_module *a = &x->modules[i], *b = &y->modules[i];
        assert_string_equal(a->path, b->path);
        assert_true(a->stack == b->stack && a->layer == b->layer && a->target == b->target && a->r == b->r);
        assert_memory_equal(&a->scale, &b->scale, sizeof a->scale);
        assert_true(a->a.rows == b->a.rows && a->a.cols == b->a.cols && a->b.rows == b->b.rows && a->b.cols == b->b.cols);
        assert_memory_equal(a->a.data, b->a.data, (size_t)a->a.rows * a->a.cols * qlm_dtype_size(a->a.dtype));
        assert_memory_equal(a->b.data, b->b.data, (size_t)a->b.rows * a->b.cols * qlm_dtype_size(a->b.dtype));
    }
}

/* ---- loading ---- */

static void test_load_fixtures(void **state) {
    (void)state;
    for (int k = 0; k < N_FIXTURES; k++) {
        fixture f;
        open_fixture(&f, k_names[k]);
        qlm_lora_adapter a, nobase;
        if (load_for(&a, f.dir, &f, QLM_F32) != 0) fail_msg("%s", qlm_last_error());
        assert_string_equal(a.name, k_names[k]);
        assert_true(a.has_base);
        const cJSON *cfg = cJSON_GetObjectItem(f.ref, "config"), *mods = cJSON_GetObjectItem(f.ref, "modules");
        assert_int_equal(a.cfg.r, cJSON_GetObjectItem(cfg, "r")->valueint);
        assert_true(a.cfg.lora_alpha == cJSON_GetObjectItem(cfg, "lora_alpha")->valuedouble);
        assert_int_equal(a.cfg.use_rslora, cJSON_IsTrue(cJSON_GetObjectItem(cfg, "use_rslora")));
        assert_int_equal(a.n_modules, cJSON_GetArraySize(mods));
        assert_int_equal(a.n_params, cJSON_GetObjectItem(f.ref, "n_params")->valueint);
        for (int i = 0; i < a.n_modules; i++) {
            const qlm_lora_module *m = &a.modules[i];
            const cJSON *want = cJSON_GetObjectItem(mods, m->path);
            if (!want) fail_msg("%s: module %s is not in peft's list", k_names[k], m->path);
            assert_int_equal(m->r, cJSON_GetObjectItem(want, "r")->valueint);
            assert_true(m->scale == (float)cJSON_GetObjectItem(want, "scale")->valuedouble);
            assert_int_equal(m->a.rows, m->r);
            assert_int_equal(m->b.cols, m->r);
            assert_ptr_equal(qlm_lora_find(&a, m->stack, m->layer, m->target), m);
        }
        /* Lookups of projections without a module, and out of range. */
        int absent = 0;
        for (int s = 0; s < QLM_LORA_MAX_STACKS; s++)
            for (int l = 0; l < a.n_layers[s]; l++)
                for (int t = 0; t < QLM_LORA_N_TARGETS; t++) absent += qlm_lora_find(&a, s, l, (qlm_lora_target)t) == NULL;
        int slots = (a.n_layers[0] + a.n_layers[1]) * QLM_LORA_N_TARGETS;
        assert_int_equal(absent, slots - a.n_modules);
        assert_null(qlm_lora_find(&a, 0, -1, QLM_LORA_Q));
        assert_null(qlm_lora_find(&a, 0, a.n_layers[0], QLM_LORA_Q));
        assert_null(qlm_lora_find(&a, 2, 0, QLM_LORA_Q));
        assert_null(qlm_lora_find(&a, 0, 0, QLM_LORA_N_TARGETS));
        /* Without a base: the same modules and values, shapes only checked for consistency. */
        if (qlm_lora_load(&nobase, f.dir, "x", NULL, NULL, QLM_F32) != 0) fail_msg("%s", qlm_last_error());
        assert_false(nobase.has_base);
        assert_adapters_equal(&a, &nobase);
        print_message("%-20s %2d modules, %6lld parameters, r %d, alpha %g%s\n", k_names[k], a.n_modules,
                      (long long)a.n_params, a.cfg.r, a.cfg.lora_alpha, a.cfg.use_rslora ? ", rsLoRA" : "");
        qlm_lora_free(&a);
        qlm_lora_free(&nobase);
        close_fixture(&f);
    }
}

/* ---- parity with peft, unmerged update, unmerge bound ---- */

static void test_merged_matches_peft(void **state) {
    (void)state;
    for (int k = 0; k < N_FIXTURES; k++) {
        fixture f;
        open_fixture(&f, k_names[k]);
        qlm_lora_adapter a;
        if (load_for(&a, f.dir, &f, QLM_F32) != 0) fail_msg("%s", qlm_last_error());
        base_model b;
        build_base(&b, &f, QLM_F32);
        /* The unmerged update of every module must equal the merged weight's product. */
        float **w0 = calloc((size_t)a.n_modules, sizeof *w0);
        for (int i = 0; i < a.n_modules; i++) {
            const qlm_weight *w = base_weight(&b, &a.modules[i]);
            w0[i] = malloc((size_t)w->rows * w->cols * sizeof(float));
            memcpy(w0[i], w->data, (size_t)w->rows * w->cols * sizeof(float));
        }
        if (merge_base(&b, &a, 1) != 0) fail_msg("%s", qlm_last_error());
        size_t n;
        float *logits = logits_of(&f, &b, &n);
        char path[1024];
        snprintf(path, sizeof path, "%s/logits.f32", f.dir);
        double diff = max_diff_file(logits, n, path);
        double apply_diff = 0;
        enum { ROWS = 3 };
        for (int i = 0; i < a.n_modules; i++) {
            const qlm_lora_module *m = &a.modules[i];
            const qlm_weight *w1 = base_weight(&b, m);
            qlm_weight base = *w1;
            base.data = w0[i];
            float *x = malloc((size_t)ROWS * w1->cols * sizeof *x), *y1 = malloc((size_t)ROWS * w1->rows * sizeof *y1);
            float *y2 = malloc((size_t)ROWS * w1->rows * sizeof *y2);
            const qlm_lora_ref *per_row[ROWS] = {&m->ref, &m->ref, &m->ref};
            for (int j = 0; j < ROWS * w1->cols; j++) x[j] = sinf(0.37f * (float)j + (float)i);
            qlm_matmul(y1, x, ROWS, w1, NULL);
            qlm_matmul(y2, x, ROWS, &base, NULL);
            assert_int_equal(qlm_backend_cpu()->lora(y2, x, ROWS, per_row), 0);
            for (int j = 0; j < ROWS * w1->rows; j++) apply_diff = fmax(apply_diff, fabs((double)y1[j] - y2[j]));
            free(x);
            free(y1);
            free(y2);
            free(w0[i]);
        }
        free(w0);
        free(logits);
        /* Unmerged, the base's own logits come back. */
        if (merge_base(&b, &a, -1) != 0) fail_msg("%s", qlm_last_error());
        logits = logits_of(&f, &b, &n);
        snprintf(path, sizeof path, "%s/logits.f32", f.base_dir);
        double base_diff = max_diff_file(logits, n, path);
        print_message("%-20s merged f32 logits vs peft max|diff| %.3g (max|logit| %.1f, the adapter moves them by up "
                      "to %.1f); unmerged update vs merged weight %.3g; after unmerge vs base %.3g\n", k_names[k], diff,
                      cJSON_GetObjectItem(f.ref, "logits_max_abs")->valuedouble,
                      cJSON_GetObjectItem(f.ref, "adapter_effect_max_abs")->valuedouble, apply_diff, base_diff);
        assert_true(diff <= 1e-4);
        assert_true(apply_diff <= 1e-4);
        assert_true(base_diff <= 1e-4);
        free(logits);
        free_base(&b);
        qlm_lora_free(&a);
        close_fixture(&f);
    }
}

/* Spacing of the storage dtype's values at |x|. */
static double ulp_of(double x, qlm_dtype dt) {
    int e;
    frexp(fabs(x), &e);
    int mant = dt == QLM_F32 ? 24 : dt == QLM_BF16 ? 8 : 11, emin = dt == QLM_F16 ? -13 : -125;
    if (x == 0 || e < emin) e = emin;
    return ldexp(1.0, e - mant);
}

static double elem(const qlm_weight *w, size_t i) {
    if (w->dtype == QLM_F32) return ((const float *)w->data)[i];
    uint16_t h = ((const uint16_t *)w->data)[i];
    return w->dtype == QLM_BF16 ? qlm_bf16_to_f32(h) : qlm_f16_to_f32(h);
}

/* Bytes of a weight's values. */
static void *copy_weight(const qlm_weight *w) {
    size_t n = (size_t)w->rows * w->cols * qlm_dtype_size(w->dtype);
    void *c = malloc(n);
    assert_non_null(c);
    memcpy(c, w->data, n);
    return c;
}

/* Merge then unmerge on F32, BF16 and F16 bases: every weight within one ulp of where it was;
 * INT8 is refused and left alone. */
/* Unmerged (the forward pass adds scale·B(Ax) per row): F32 A/B match peft to 1e-4; BF16 A/B are
 * reported and held to 1% of the largest logit. */
static void test_unmerged_matches_peft(void **state) {
    (void)state;
    for (int k = 0; k < N_FIXTURES; k++) {
        fixture f;
        open_fixture(&f, k_names[k]);
        base_model b;
        build_base_on(&b, &f, QLM_F32, test_backend());
        char path[1024];
        snprintf(path, sizeof path, "%s/logits.f32", f.dir);
        double diff[2];
        for (int bf16 = 0; bf16 < 2; bf16++) {
            qlm_lora_adapter a;
            if (load_placed(&a, f.dir, &f, bf16 ? QLM_BF16 : QLM_F32, &b) != 0) fail_msg("%s", qlm_last_error());
            size_t n;
            float *logits = logits_with(&f, &b, &a, &n);
            diff[bf16] = max_diff_file(logits, n, path);
            free(logits);
            qlm_lora_free(&a);
        }
        double max_logit = cJSON_GetObjectItem(f.ref, "logits_max_abs")->valuedouble;
        print_message("%-20s unmerged logits vs peft max|diff|: f32 A/B %.3g, bf16 A/B %.3g (%.2g of max)\n",
                      k_names[k], diff[0], diff[1], diff[1] / max_logit);
        assert_true(diff[0] <= 1e-4);
        assert_true(diff[1] <= 0.01 * max_logit);
        free_base(&b);
        close_fixture(&f);
    }
}

/* Two adapters of one base (mha_attn_r8 and mha_mlp_rslora_r16), placed for the test backend. */
typedef struct {
    fixture fa, fb;
    base_model b;
    qlm_lora_adapter A, B;
} two_adapters;

static void two_adapters_open(two_adapters *t, qlm_dtype base_dtype) {
    open_fixture(&t->fa, "mha_attn_r8");
    open_fixture(&t->fb, "mha_mlp_rslora_r16");
    build_base_on(&t->b, &t->fa, base_dtype, test_backend());
    if (load_placed(&t->A, t->fa.dir, &t->fa, QLM_F32, &t->b) != 0 ||
        load_placed(&t->B, t->fb.dir, &t->fb, QLM_F32, &t->b) != 0)
        fail_msg("%s", qlm_last_error());
}

static void two_adapters_close(two_adapters *t) {
    qlm_lora_free(&t->A);
    qlm_lora_free(&t->B);
    free_base(&t->b);
    close_fixture(&t->fa);
    close_fixture(&t->fb);
}

/* One batch of four sequences with adapters {A, B, none, A}: prefilled per slot, then decoded
 * together step by step; every row's logits equal those of its sequence run alone, on an F32 and
 * on an INT8 base (adapters apply unmerged to any weight dtype). */
static void mixed_batch(qlm_dtype base_dtype) {
    two_adapters t;
    two_adapters_open(&t, base_dtype);
    base_model *b = &t.b;
    const qlm_lora_adapter *use[4] = {&t.A, &t.B, NULL, &t.A};
    enum { PROMPT = 5, STEPS = 6, SEQ = PROMPT + STEPS };
    int vocab = b->m.cfg.vocab_size, tokens[4][SEQ];
    for (int q = 0; q < 4; q++)
        for (int i = 0; i < SEQ; i++) tokens[q][i] = 3 + (q * 37 + i * 11) % (vocab - 3);
    /* Alone: each sequence in its own state, with the batch's row counts (its prompt at once, then a
     * row a step), so that on a GPU both sides take the same matmul kernels. A many-row matmul
     * (cuBLAS) sums F32 weights in another order than the few-row GEMV (an INT8 base's integer sums
     * are exact either way), and where a later matmul rounds x to BF16 such a difference of 1e-7
     * can flip one rounding and move logits by 1e-2. */
    float *alone = malloc((size_t)4 * SEQ * vocab * sizeof *alone);
    int pos[SEQ], last = PROMPT - 1, first = 0;
    for (int i = 0; i < SEQ; i++) pos[i] = i;
    for (int q = 0; q < 4; q++) {
        qlm_kv_state s;
        assert_int_equal(qlm_state_init(&s, &b->m, SEQ, SEQ), 0);
        qlm_lora_slots_set(&s.lora, 0, use[q]);
        float *lq = alone + (size_t)q * SEQ * vocab;
        assert_int_equal(qlm_forward(&b->m, &s, tokens[q], pos, PROMPT, &last, 1, lq + (size_t)last * vocab), 0);
        for (int i = PROMPT; i < SEQ; i++)
            assert_int_equal(qlm_forward(&b->m, &s, tokens[q] + i, pos + i, 1, &first, 1, lq + (size_t)i * vocab), 0);
        qlm_state_free(&s, &b->m);
    }
    /* Together: four slots; prompts prefilled per slot, then one row per slot per step. */
    qlm_kv_state s;
    assert_int_equal(qlm_state_init_slots(&s, &b->m, SEQ, 4, 16), 0);
    for (int q = 0; q < 4; q++) qlm_lora_slots_set(&s.lora, q, use[q]);
    float *got = malloc((size_t)4 * vocab * sizeof *got);
    double worst = 0;
    for (int q = 0; q < 4; q++) {
        int slots[PROMPT];
        for (int i = 0; i < PROMPT; i++) slots[i] = q;
        assert_int_equal(qlm_forward_slots(&b->m, &s, tokens[q], pos, slots, PROMPT, &last, 1, got), 0);
        const float *want = alone + ((size_t)q * SEQ + PROMPT - 1) * vocab;
        for (int v = 0; v < vocab; v++) worst = fmax(worst, fabs(got[v] - want[v]));
    }
    for (int step = PROMPT; step < SEQ; step++) {
        int ids[4], p[4], slots[4] = {0, 1, 2, 3}, rows[4] = {0, 1, 2, 3};
        for (int q = 0; q < 4; q++) {
            ids[q] = tokens[q][step];
            p[q] = step;
        }
        assert_int_equal(qlm_forward_slots(&b->m, &s, ids, p, slots, 4, rows, 4, got), 0);
        for (int q = 0; q < 4; q++) {
            const float *want = alone + ((size_t)q * SEQ + step) * vocab;
            for (int v = 0; v < vocab; v++) worst = fmax(worst, fabs(got[(size_t)q * vocab + v] - want[v]));
        }
    }
    print_message("mixed batch {A, B, none, A} on a %s base: max|diff| vs each sequence alone %.3g\n",
                  qlm_dtype_name(base_dtype), worst);
    assert_true(worst <= (b->m.be->host_memory ? 1e-5 : 5e-5));
    qlm_state_free(&s, &b->m);
    free(got);
    free(alone);
    two_adapters_close(&t);
}

static void test_mixed_batch(void **state) {
    (void)state;
    mixed_batch(QLM_F32);
    mixed_batch(QLM_I8);
}

/* Uniform in [-1, 1) from a 64-bit LCG. */
static float uniform(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)(*s >> 40) / (float)(1 << 23) - 1.0f;
}

/* The CPU lora op on a call of ten rows over three pairs (F32 rank 16, F32 rank 8, BF16 rank 16)
 * and a row without one, 576 columns in and 1536 out, so that its threads split the pairs' rows
 * and put x in form together: every value is the bits y + scale · B (A x) has from two
 * qlm_matmul calls of the row alone, on one thread and on four. */
static void test_lora_op_threads(void **state) {
    (void)state;
    enum { IN = 576, OUT = 1536, N = 10, PAIRS = 3 };
    const int rank[PAIRS] = {16, 8, 16};
    const qlm_dtype dt[PAIRS] = {QLM_F32, QLM_F32, QLM_BF16};
    const int use[N] = {0, 1, -1, 0, 2, 1, 2, 0, 0, 2};
    uint64_t seed = 12345;
    float *x = malloc(sizeof(float) * N * IN), *y0 = malloc(sizeof(float) * N * OUT);
    float *want = malloc(sizeof(float) * N * OUT), *got = malloc(sizeof(float) * N * OUT);
    assert_non_null(x && y0 && want && got);
    for (int i = 0; i < N * IN; i++) x[i] = uniform(&seed);
    for (int i = 0; i < N * OUT; i++) y0[i] = uniform(&seed);
    qlm_lora_ref ref[PAIRS];
    qlm_weight w[PAIRS][2];
    void *data[PAIRS][2];
    for (int p = 0; p < PAIRS; p++)
        for (int ab = 0; ab < 2; ab++) {
            const int rows = ab ? OUT : rank[p], cols = ab ? rank[p] : IN;
            const size_t count = (size_t)rows * cols;
            float *f = malloc(count * sizeof *f);
            assert_non_null(f);
            for (size_t k = 0; k < count; k++) f[k] = uniform(&seed) * 0.2f;
            data[p][ab] = f;
            if (dt[p] == QLM_BF16) {
                data[p][ab] = malloc(count * sizeof(uint16_t));
                assert_non_null(data[p][ab]);
                qlm_f32_to_bf16_n(data[p][ab], f, (long)count);
                free(f);
            }
            w[p][ab] = (qlm_weight){.dtype = dt[p], .rows = rows, .cols = cols, .data = data[p][ab], .scale = 1.0f};
        }
    for (int p = 0; p < PAIRS; p++) ref[p] = (qlm_lora_ref){.a = &w[p][0], .b = &w[p][1], .scale = 0.5f + p};
    const qlm_lora_ref *per_row[N];
    memcpy(want, y0, sizeof(float) * N * OUT);
    for (int i = 0; i < N; i++) {
        per_row[i] = use[i] < 0 ? NULL : &ref[use[i]];
        if (use[i] < 0) continue;
        float t[16], u[OUT];
        qlm_matmul(t, x + (size_t)i * IN, 1, per_row[i]->a, NULL);
        qlm_matmul(u, t, 1, per_row[i]->b, NULL);
        for (int o = 0; o < OUT; o++) want[(size_t)i * OUT + o] += per_row[i]->scale * u[o];
    }
    const int threads = omp_get_max_threads(), counts[2] = {1, 4};
    for (int c = 0; c < 2; c++) {
        omp_set_num_threads(counts[c]);
        memcpy(got, y0, sizeof(float) * N * OUT);
        assert_int_equal(qlm_backend_cpu()->lora(got, x, N, per_row), 0);
        for (int i = 0; i < N * OUT; i++)
            if (memcmp(&got[i], &want[i], sizeof got[i]) != 0)
                fail_msg("%d threads: row %d column %d: %.9g, two products give %.9g", counts[c], i / OUT, i % OUT,
                         got[i], want[i]);
    }
    omp_set_num_threads(threads);
    for (int p = 0; p < PAIRS; p++) {
        free(data[p][0]);
        free(data[p][1]);
    }
    free(x);
    free(y0);
    free(want);
    free(got);
}

/* The batch scheduler with adapters and prompts that share their first 20 tokens: a prompt only
 * reuses the prefix of one with the same adapter (keys and values depend on it), and every request's
 * greedy tokens equal those of a batch that runs it alone. */
typedef struct {
    int ids[6][40], n, next;
    const qlm_lora_adapter *use[6];
    qlm_gen_params params[6];
    int out[6][8];
} prefix_run;

static int prefix_next(void *ctx, qlm_batch_request *req) {
    prefix_run *r = ctx;
    if (r->next == r->n) return 0;
    int i = r->next++;
    *req = (qlm_batch_request){.ids = r->ids[i], .n_ids = 30, .params = &r->params[i], .adapter = r->use[i]};
    return 1;
}

static int prefix_done(void *ctx, const qlm_batch_request *req, const char *text, size_t len, const qlm_gen_stats *st) {
    (void)ctx, (void)req, (void)text, (void)len, (void)st;
    return 0;
}

static void test_batch_prefix_per_adapter(void **state) {
    (void)state;
    two_adapters t;
    two_adapters_open(&t, QLM_F32);
    int vocab = t.b.m.cfg.vocab_size;
    prefix_run all = {.n = 6};
    const qlm_lora_adapter *use[6] = {&t.A, &t.B, NULL, &t.A, &t.B, NULL};
    for (int i = 0; i < 6; i++) {
        all.use[i] = use[i];
        for (int k = 0; k < 30; k++) all.ids[i][k] = 3 + ((k < 20 ? 0 : i * 37) + k * 11) % (vocab - 3);
        all.params[i] = (qlm_gen_params){.sampling = qlm_sampling_defaults(), .max_new_tokens = 8, .out_ids = all.out[i]};
        all.params[i].sampling.temperature = 0;
    }
    qlm_batch_config bc = {.model = &t.b.m, .n_slots = 6, .max_prompt = 30, .max_output = 8};
    qlm_batch_stats st;
    if (qlm_batch_run(&bc, prefix_next, prefix_done, &all, &st) != 0) fail_msg("%s", qlm_last_error());
    /* The second request of each adapter (and of none) takes the first one's 20 tokens. */
    assert_int_equal(st.reused_tokens, 3 * 20);
    bc.n_slots = 1;
    for (int i = 0; i < 6; i++) {
        prefix_run one = {.n = 1};
        memcpy(one.ids[0], all.ids[i], sizeof one.ids[0]);
        one.use[0] = use[i];
        one.params[0] = all.params[i];
        one.params[0].out_ids = one.out[0];
        if (qlm_batch_run(&bc, prefix_next, prefix_done, &one, &st) != 0) fail_msg("%s", qlm_last_error());
        assert_int_equal(st.reused_tokens, 0);
        assert_memory_equal(one.out[0], all.out[i], sizeof one.out[0]);
    }
    two_adapters_close(&t);
}

/* qlm_lora_init and `qlm lora init`: the modules the config targets, A within peft's
 * kaiming-uniform bound, B zero (so the logits are the base's), and a folder that loads back. */
static void test_init(void **state) {
    (void)state;
    fixture f;
    open_fixture(&f, "mha_attn_r8");
    const char *json = "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\", \"down_proj\"], "
                       "\"rank_pattern\": {\"down_proj\": 2}}";
    qlm_lora_adapter a;
    if (qlm_lora_init(&a, "fresh", &f.src.cfg, NULL, json, 7, QLM_F32) != 0) fail_msg("%s", qlm_last_error());
    assert_int_equal(a.n_modules, 2 * f.src.cfg.n_layers);
    for (int i = 0; i < a.n_modules; i++) {
        const qlm_lora_module *m = &a.modules[i];
        assert_int_equal(m->r, m->target == QLM_LORA_DOWN ? 2 : 4);
        const float *A = m->a.data, *B = m->b.data;
        float bound = 1.0f / sqrtf((float)m->a.cols), amax = 0;
        for (int j = 0; j < m->a.rows * m->a.cols; j++) amax = fmaxf(amax, fabsf(A[j]));
        assert_true(amax <= bound && amax > 0.5f * bound);
        for (int j = 0; j < m->b.rows * m->b.cols; j++) assert_true(B[j] == 0.0f);
    }
    base_model b;
    build_base(&b, &f, QLM_F32);
    size_t n;
    float *with = logits_with(&f, &b, &a, &n), *without = logits_of(&f, &b, &n);
    assert_memory_equal(with, without, n * sizeof *with);
    free(with);
    free(without);
    free_base(&b);
    qlm_lora_free(&a);
    assert_int_equal(qlm_lora_init(&a, "x", &f.src.cfg, NULL, "{\"r\": 4, \"target_modules\": [\"nothing\"]}", 1, QLM_F32), -1);
    assert_non_null(strstr(qlm_last_error(), "matches no projection"));

    char dir[256], *out = NULL;
    assert_non_null(test_tmpdir(dir, sizeof dir));
    /* -o may name missing parent folders, as --out does for train. */
    assert_int_equal(test_run_qlm(&out, "lora init -m %s -o %s/a/b/new --rank 8 --targets all-linear 2>&1", f.base_dir, dir),
                     0);
    free(out);
    char path[512];
    snprintf(path, sizeof path, "%s/a/b/new", dir);
    qlm_lora_adapter back;
    if (qlm_lora_load(&back, path, NULL, &f.src.cfg, NULL, QLM_F32) != 0) fail_msg("%s", qlm_last_error());
    assert_int_equal(back.n_modules, 7 * f.src.cfg.n_layers);
    qlm_lora_free(&back);
    const char *files[] = {"a/b/new/adapter_config.json", "a/b/new/adapter_model.safetensors", "a/b/new", "a/b", "a", ""};
    for (int i = 0; i < 6; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        remove(path);
    }
    close_fixture(&f);
}

static void test_unmerge_bound(void **state) {
    (void)state;
    const char *names[] = {"qwen2_all_rslora_r4", "t5_all_patterns_r8"};
    const qlm_dtype dts[] = {QLM_F32, QLM_BF16, QLM_F16};
    for (int k = 0; k < 2; k++) {
        fixture f;
        open_fixture(&f, names[k]);
        qlm_lora_adapter a;
        if (load_for(&a, f.dir, &f, QLM_F32) != 0) fail_msg("%s", qlm_last_error());
        for (int d = 0; d < 3; d++) {
            base_model b;
            build_base(&b, &f, dts[d]);
            void **w0 = calloc((size_t)a.n_modules, sizeof *w0), **w1 = calloc((size_t)a.n_modules, sizeof *w1);
            for (int i = 0; i < a.n_modules; i++) w0[i] = copy_weight(base_weight(&b, &a.modules[i]));
            assert_int_equal(merge_base(&b, &a, 1), 0);
            for (int i = 0; i < a.n_modules; i++) w1[i] = copy_weight(base_weight(&b, &a.modules[i]));
            assert_int_equal(merge_base(&b, &a, -1), 0);
            size_t total = 0, exact = 0, changed = 0;
            double worst_ulps = 0;
            for (int i = 0; i < a.n_modules; i++) {
                const qlm_weight *w = base_weight(&b, &a.modules[i]);
                qlm_weight before = *w, merged = *w;
                before.data = w0[i];
                merged.data = w1[i];
                for (size_t j = 0; j < (size_t)w->rows * w->cols; j++) {
                    double x0 = elem(&before, j), x1 = elem(&merged, j), x2 = elem(w, j);
                    worst_ulps = fmax(worst_ulps, fabs(x2 - x0) / ulp_of(fmax(fabs(x0), fabs(x1)), dts[d]));
                    exact += x2 == x0;
                    changed += x1 != x0;
                    total++;
                }
                free(w0[i]);
                free(w1[i]);
            }
            free(w0);
            free(w1);
            print_message("%-20s %-4s base: merge changed %zu of %zu adapted weights; unmerge restored %zu exactly, "
                          "the rest within %.2f ulp\n", names[k], qlm_dtype_name(dts[d]), changed, total, exact, worst_ulps);
            assert_true(worst_ulps <= 1.0);
            assert_true(changed > total / 2);
            free_base(&b);
        }
        base_model q;
        build_base(&q, &f, QLM_I8);
        size_t n1, n2;
        char *s1 = snapshot(&q, &n1);
        assert_int_equal(merge_base(&q, &a, 1), -1);
        assert_non_null(strstr(qlm_last_error(), "INT8"));
        char *s2 = snapshot(&q, &n2);
        assert_memory_equal(s1, s2, n1);
        free(s1);
        free(s2);
        free_base(&q);
        qlm_lora_free(&a);
        close_fixture(&f);
    }
}

/* ---- save and reload ---- */

static void remove_adapter_dir(const char *dir) {
    const char *files[] = {"adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"};
    char path[1024];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void test_save_roundtrip(void **state) {
    (void)state;
    const char *export_dir = getenv("QLM_EXPORT_DIR"); /* for tools/make_lora_fixtures.py --check */
    char tmp[256], dir[600];
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    for (int k = 0; k < N_FIXTURES; k++) {
        fixture f;
        open_fixture(&f, k_names[k]);
        for (int d = 0; d < 2; d++) {
            qlm_dtype dt = d ? QLM_BF16 : QLM_F32;
            qlm_lora_adapter a, again;
            if (load_for(&a, f.dir, &f, dt) != 0) fail_msg("%s", qlm_last_error());
            snprintf(dir, sizeof dir, "%s/%s", tmp, k_names[k]);
            if (qlm_lora_save(&a, dir) != 0) fail_msg("%s", qlm_last_error());
            if (load_for(&again, dir, &f, dt) != 0) fail_msg("%s", qlm_last_error());
            assert_adapters_equal(&a, &again);
            char *c1 = qlm_lora_config_json(&a.cfg), *c2 = qlm_lora_config_json(&again.cfg);
            assert_string_equal(c1, c2);
            free(c1);
            free(c2);
            if (export_dir && dt == QLM_F32) {
                char out[600];
                mkdir(export_dir, 0755);
                snprintf(out, sizeof out, "%s/%s", export_dir, k_names[k]);
                if (qlm_lora_save(&a, out) != 0) fail_msg("%s", qlm_last_error());
            }
            qlm_lora_free(&a);
            qlm_lora_free(&again);
            remove_adapter_dir(dir);
        }
        close_fixture(&f);
    }
    rmdir(tmp);
}

/* ---- variants of a fixture adapter ---- */

/* Copies fixture `name` into dir with its adapter_config.json changed by patch (a JSON object
 * whose members replace the config's; the string "DELETE" removes the member). */
static void write_variant(const char *dir, const char *name, const char *patch) {
    char src[600], dst[600];
    mkdir(dir, 0755);
    snprintf(src, sizeof src, FIX "/%s/adapter_config.json", name);
    cJSON *cfg = read_json(src);
    cJSON *p = cJSON_Parse(patch ? patch : "{}"), *item;
    assert_non_null(p);
    cJSON_ArrayForEach(item, p) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, item->string);
        if (!(cJSON_IsString(item) && strcmp(item->valuestring, "DELETE") == 0))
            cJSON_AddItemToObject(cfg, item->string, cJSON_Duplicate(item, 1));
    }
    char *text = cJSON_Print(cfg);
    snprintf(dst, sizeof dst, "%s/adapter_config.json", dir);
    assert_int_equal(test_write_file(dst, text, strlen(text)), 0);
    free(text);
    cJSON_Delete(cfg);
    cJSON_Delete(p);
    size_t len = 0;
    snprintf(src, sizeof src, FIX "/%s/adapter_model.safetensors", name);
    char *bytes = test_read_file(src, &len);
    assert_non_null(bytes);
    snprintf(dst, sizeof dst, "%s/adapter_model.safetensors", dir);
    assert_int_equal(test_write_file(dst, bytes, len), 0);
    free(bytes);
}

typedef enum { T_NAN, T_INF, T_DROP, T_RENAME, T_ADD, T_INT8, T_VECTOR } tensor_edit;

/* Rewrites dir/adapter_model.safetensors with one change to the tensor `name`: a NaN or Inf
 * value, dropped, renamed to / added as `arg`, stored as INT8, or made 1-D. */
static void edit_tensors(const char *dir, tensor_edit op, const char *name, const char *arg) {
    char path[1024];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    qlm_tensor_store *in = qlm_store_new(), *out = qlm_store_new();
    if (qlm_safetensors_load(path, in) != 0) fail_msg("%s", qlm_last_error());
    int found = 0;
    for (int i = 0; i < qlm_store_count(in); i++) {
        const qlm_tensor_entry *e = qlm_store_at(in, i);
        int hit = strcmp(e->name, name) == 0;
        found |= hit;
        if (hit && op == T_DROP) continue;
        const char *new_name = hit && op == T_RENAME ? arg : e->name;
        int64_t shape[2] = {e->shape[0], e->shape[1]};
        if (hit && op == T_VECTOR) shape[0] *= shape[1];
        qlm_dtype dt = hit && op == T_INT8 ? QLM_I8 : e->dtype;
        void *data;
        qlm_tensor_entry *o = qlm_store_add_owned(out, new_name, dt, hit && op == T_VECTOR ? 1 : 2, shape, &data);
        assert_non_null(o);
        if (dt == QLM_I8) {
            memset(data, 1, (size_t)qlm_entry_numel(e));
            o->scale = 0.5f;
            continue;
        }
        memcpy(data, e->data, e->nbytes);
        if (hit && (op == T_NAN || op == T_INF)) ((float *)data)[3] = op == T_NAN ? NAN : -INFINITY;
        if (hit && op == T_ADD) {
            assert_non_null(qlm_store_add_owned(out, arg, e->dtype, 2, shape, &data));
            memcpy(data, e->data, e->nbytes);
        }
    }
    assert_true(found);
    assert_int_equal(qlm_safetensors_save(path, out, NULL), 0);
    qlm_store_free(in);
    qlm_store_free(out);
}

#define KEY(module, ab) "base_model.model." module ".lora_" ab ".weight"

/* Configurations peft would accept, read as peft reads them. */
static void test_config_semantics(void **state) {
    (void)state;
    fixture f, t5;
    open_fixture(&f, "qwen2_all_rslora_r4");
    open_fixture(&t5, "t5_qv_rslora_r16");
    char tmp[256], dir[600];
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    snprintf(dir, sizeof dir, "%s/v", tmp);
    const struct {
        const fixture *f;
        const char *name, *patch;
        int modules; /* -1: must fail with `error` */
        const char *error;
    } cases[] = {
        /* all-linear as a string (peft expands it when saving), case-insensitive. */
        {&f, "qwen2_all_rslora_r4", "{\"target_modules\": \"ALL-LINEAR\"}", 14, NULL},
        /* The regex must match the whole path (re.fullmatch), not a part of it. */
        {&f, "qwen2_all_rslora_r4", "{\"target_modules\": \"model\\\\.layers\\\\.\\\\d+\\\\.(self_attn|mlp)\\\\..*\"}", 14, NULL},
        {&f, "qwen2_all_rslora_r4", "{\"target_modules\": \"q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj\"}", -1,
         "not targeted"},
        /* A list entry matches a whole path or a dot-separated suffix, not a substring. */
        {&f, "qwen2_all_rslora_r4",
         "{\"target_modules\": [\"self_attn.q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"mlp.gate_proj\", \"up_proj\", "
         "\"down_proj\"]}", 14, NULL},
        {&f, "qwen2_all_rslora_r4", "{\"target_modules\": [\"proj\"]}", -1, "not targeted"},
        {&f, "qwen2_all_rslora_r4", "{\"exclude_modules\": [\"down_proj\"]}", -1, "mlp.down_proj is not targeted"},
        {&f, "qwen2_all_rslora_r4", "{\"exclude_modules\": \".*\\\\.layers\\\\.1\\\\..*\"}", -1, "model.layers.1."},
        /* layers_to_transform with the default and an explicit layers_pattern; a pattern that names
         * no part of the path selects nothing. */
        {&f, "mha_mlp_rslora_r16", "{\"layers_pattern\": \"layers\"}", 3, NULL},
        {&f, "mha_mlp_rslora_r16", "{\"layers_pattern\": [\"h\", \"layers\"]}", 3, NULL},
        {&f, "mha_mlp_rslora_r16", "{\"layers_pattern\": \"blocks\"}", -1, "not targeted"},
        {&f, "mha_mlp_rslora_r16", "{\"layers_to_transform\": 0}", -1, "targets model.layers.0.mlp.gate_proj"},
        {&f, "mha_mlp_rslora_r16", "{\"layers_to_transform\": [0, 1]}", -1, "model.layers.0.mlp.gate_proj but the file has no"},
        /* fan_in_fan_out is ignored for nn.Linear, as peft does. */
        {&f, "mha_attn_r8", "{\"fan_in_fan_out\": true}", 8, NULL},
        /* peft's default targets (q, v) when target_modules is absent; T5's include cross-attention. */
        {&t5, "t5_qv_rslora_r16", "{\"target_modules\": \"DELETE\"}", 16, NULL},
        {&t5, "t5_qv_rslora_r16", "{\"target_modules\": [\"SelfAttention.q\", \"SelfAttention.v\"]}", -1,
         "decoder.block.0.layer.1.EncDecAttention.q is not targeted"},
        {&f, "mha_attn_r8", "{\"target_modules\": null}", -1, "k_proj is not targeted"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        write_variant(dir, cases[c].name, cases[c].patch);
        fixture *fx = (fixture *)cases[c].f;
        /* Llama cases other than qwen2's need their own base. */
        fixture own;
        int reopen = strncmp(cases[c].name, "mha", 3) == 0;
        if (reopen) {
            open_fixture(&own, cases[c].name);
            fx = &own;
        }
        qlm_lora_adapter a;
        int rc = load_for(&a, dir, fx, QLM_F32);
        if (cases[c].modules >= 0) {
            if (rc != 0) fail_msg("case %zu (%s): %s", c, cases[c].patch, qlm_last_error());
            assert_int_equal(a.n_modules, cases[c].modules);
            qlm_lora_free(&a);
        } else {
            assert_int_equal(rc, -1);
            if (!strstr(qlm_last_error(), cases[c].error))
                fail_msg("case %zu (%s): error \"%s\" lacks \"%s\"", c, cases[c].patch, qlm_last_error(), cases[c].error);
        }
        if (reopen) close_fixture(&own);
        remove_adapter_dir(dir);
    }
    /* rank_pattern / alpha_pattern keys are tried in file order; the first match wins. */
    write_variant(dir, "gqa_regex_patterns", "{\"rank_pattern\": {\"model.layers.1.self_attn.q_proj\": 16, \"down_proj\": 4, "
                                             "\"q_proj\": 2}, \"alpha_pattern\": {\"layers.0.self_attn.v_proj\": 2, \"v_proj\": 4}}");
    fixture g;
    open_fixture(&g, "gqa_regex_patterns");
    qlm_lora_adapter a;
    assert_int_equal(load_for(&a, dir, &g, QLM_F32), -1); /* q_proj of layer 0 is now rank 2 in the config */
    assert_non_null(strstr(qlm_last_error(), "rank 2"));
    remove_adapter_dir(dir);
    write_variant(dir, "gqa_regex_patterns", "{\"alpha_pattern\": {\"layers.0.self_attn.v_proj\": 2, \"v_proj\": 4}}");
    if (load_for(&a, dir, &g, QLM_F32) != 0) fail_msg("%s", qlm_last_error());
    assert_true(qlm_lora_find(&a, 0, 0, QLM_LORA_V)->scale == 0.25f);
    assert_true(qlm_lora_find(&a, 0, 1, QLM_LORA_V)->scale == 0.5f);
    qlm_lora_free(&a);
    remove_adapter_dir(dir);
    close_fixture(&g);
    rmdir(tmp);
    close_fixture(&f);
    close_fixture(&t5);
}

/* ---- registry ---- */

static void test_registry(void **state) {
    (void)state;
    fixture f, q;
    open_fixture(&f, "mha_attn_r8");
    open_fixture(&q, "qwen2_all_rslora_r4");
    qlm_lora_registry r;
    assert_int_equal(qlm_lora_registry_init(&r, &f.src.cfg, &q.src.t5, NULL), -1);
    assert_int_equal(qlm_lora_registry_init(&r, &f.src.cfg, NULL, NULL), 0);
    assert_null(qlm_lora_registry_default(&r));
    assert_int_equal(qlm_lora_registry_load(&r, "a", FIX "/mha_attn_r8", QLM_F32), 0);
    assert_int_equal(qlm_lora_registry_load(&r, "b", FIX "/mha_mlp_rslora_r16", QLM_BF16), 0);
    assert_int_equal(qlm_lora_registry_load(&r, "a", FIX "/mha_mlp_rslora_r16", QLM_F32), -1);
    assert_non_null(strstr(qlm_last_error(), "already loaded"));
    const char *bad_names[] = {"none", "", "a=b", "x/y", "0123456789012345678901234567890123456789012345678901234567890123"};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        assert_int_equal(qlm_lora_registry_load(&r, bad_names[i], FIX "/mha_attn_r8", QLM_F32), -1);
        assert_non_null(strstr(qlm_last_error(), "adapter name"));
    }
    assert_int_equal(r.n, 2);
    const qlm_lora_adapter *a = qlm_lora_registry_find(&r, "a"), *b = qlm_lora_registry_find(&r, "b");
    assert_true(a && b && a != b);
    assert_ptr_equal(qlm_lora_registry_at(&r, 0), a);
    assert_ptr_equal(qlm_lora_registry_at(&r, 1), b);
    assert_null(qlm_lora_registry_at(&r, 2));
    assert_null(qlm_lora_registry_find(&r, "c"));
    assert_int_equal(b->dtype, QLM_BF16);
    assert_int_equal(b->modules[0].a.dtype, QLM_BF16);
    /* Switching the default: by name, to none, and a failed switch changes nothing. */
    assert_int_equal(qlm_lora_registry_set_default(&r, "b"), 0);
    assert_ptr_equal(qlm_lora_registry_default(&r), b);
    assert_int_equal(qlm_lora_registry_set_default(&r, "zzz"), -1);
    assert_ptr_equal(qlm_lora_registry_default(&r), b);
    assert_int_equal(qlm_lora_registry_set_default(&r, "none"), 0);
    assert_null(qlm_lora_registry_default(&r));
    assert_int_equal(qlm_lora_registry_set_default(&r, "a"), 0);
    assert_int_equal(qlm_lora_registry_set_default(&r, NULL), 0);
    assert_null(qlm_lora_registry_default(&r));
    /* Removing the default makes it none; other adapters stay where they are. */
    assert_int_equal(qlm_lora_registry_set_default(&r, "b"), 0);
    assert_int_equal(qlm_lora_registry_remove(&r, "b"), 0);
    assert_null(qlm_lora_registry_default(&r));
    assert_ptr_equal(qlm_lora_registry_find(&r, "a"), a);
    assert_int_equal(qlm_lora_registry_remove(&r, "b"), -1);
    /* Adapters taken over must have been checked against this base. */
    qlm_lora_adapter x;
    assert_int_equal(qlm_lora_load(&x, FIX "/mha_attn_r8", "x", NULL, NULL, QLM_F32), 0);
    assert_int_equal(qlm_lora_registry_add(&r, &x), -1);
    assert_non_null(strstr(qlm_last_error(), "not loaded for this base"));
    assert_non_null(x.modules); /* untouched on failure */
    qlm_lora_free(&x);
    assert_int_equal(qlm_lora_load(&x, FIX "/qwen2_all_rslora_r4", "x", &q.src.cfg, NULL, QLM_F32), 0);
    assert_int_equal(qlm_lora_registry_add(&r, &x), -1);
    qlm_lora_free(&x);
    assert_int_equal(qlm_lora_load(&x, FIX "/mha_mlp_rslora_r16", "x", &f.src.cfg, NULL, QLM_F32), 0);
    assert_int_equal(qlm_lora_registry_add(&r, &x), 0);
    assert_null(x.modules);
    assert_int_equal(qlm_lora_registry_find(&r, "x")->n_modules, 3);
    /* An adapter for another base is refused at load. */
    assert_int_equal(qlm_lora_registry_load(&r, "q", FIX "/qwen2_all_rslora_r4", QLM_F32), -1);
    assert_non_null(strstr(qlm_last_error(), "expected"));
    assert_int_equal(qlm_lora_registry_load(&r, "t", FIX "/t5_qv_rslora_r16", QLM_F32), -1);
    assert_non_null(strstr(qlm_last_error(), "Llama-family"));
    /* Full. */
    char name[16];
    while (r.n < QLM_LORA_MAX_RESIDENT) {
        snprintf(name, sizeof name, "n%d", r.n);
        assert_int_equal(qlm_lora_registry_load(&r, name, FIX "/mha_attn_r8", QLM_F32), 0);
    }
    assert_int_equal(qlm_lora_registry_load(&r, "last", FIX "/mha_attn_r8", QLM_F32), -1);
    assert_non_null(strstr(qlm_last_error(), "resident"));
    assert_int_equal(r.n, QLM_LORA_MAX_RESIDENT);
    assert_ptr_equal(qlm_lora_registry_find(&r, "a"), a);
    qlm_lora_registry_free(&r);
    /* A T5 registry. */
    fixture t;
    open_fixture(&t, "t5_all_patterns_r8");
    assert_int_equal(qlm_lora_registry_init(&r, NULL, &t.src.t5, NULL), 0);
    assert_int_equal(qlm_lora_registry_load(&r, "all", FIX "/t5_all_patterns_r8", QLM_F32), 0);
    assert_int_equal(qlm_lora_registry_load(&r, "qv", FIX "/t5_qv_rslora_r16", QLM_BF16), 0);
    assert_int_equal(qlm_lora_registry_load(&r, "m", FIX "/mha_attn_r8", QLM_F32), -1);
    assert_non_null(strstr(qlm_last_error(), "T5"));
    assert_non_null(qlm_lora_find(qlm_lora_registry_find(&r, "qv"), 1, 2, QLM_LORA_CROSS_V));
    assert_null(qlm_lora_find(qlm_lora_registry_find(&r, "qv"), 1, 2, QLM_LORA_CROSS_K));
    assert_int_equal(r.n, 2);
    qlm_lora_registry_free(&r);
    close_fixture(&t);
    close_fixture(&f);
    close_fixture(&q);
}

/* ---- bad adapters ---- */

static void truncate_weights(const char *dir, int garbage) {
    char path[1024];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    char *bytes = test_read_file(path, &len);
    assert_non_null(bytes);
    if (garbage) {
        char *more = realloc(bytes, len + 8);
        assert_non_null(more);
        bytes = more;
        memset(bytes + len, 7, 8);
        len += 8;
    } else {
        len /= 2;
    }
    assert_int_equal(test_write_file(path, bytes, len), 0);
    free(bytes);
}

/* Every bad adapter gives an error naming the problem, leaves a zeroed adapter, and changes
 * neither the base model nor the registry (its adapters and default). */
static void test_bad_adapters(void **state) {
    (void)state;
    fixture f;
    open_fixture(&f, "mha_attn_r8");
    base_model b;
    build_base(&b, &f, QLM_F32);
    qlm_lora_registry r;
    assert_int_equal(qlm_lora_registry_init(&r, &f.src.cfg, NULL, NULL), 0);
    assert_int_equal(qlm_lora_registry_load(&r, "good", FIX "/mha_attn_r8", QLM_F32), 0);
    assert_int_equal(qlm_lora_registry_set_default(&r, "good"), 0);
    const qlm_lora_adapter *good = qlm_lora_registry_find(&r, "good");
    size_t n_good = (size_t)good->buffer_bytes, n_model;
    char *good_bytes = malloc(n_good);
    memcpy(good_bytes, good->buffer, n_good);
    char *model_bytes = snapshot(&b, &n_model);

    char tmp[256], dir[600], path[1024];
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    snprintf(dir, sizeof dir, "%s/bad", tmp);
    const char *q0a = KEY("model.layers.0.self_attn.q_proj", "A"), *q0b = KEY("model.layers.0.self_attn.q_proj", "B");
    enum { NONE = -1, NO_CONFIG = 100, NO_WEIGHTS, BIN_ONLY, NOT_JSON, TRUNCATED, GARBAGE, A_FILE };
    const struct {
        const char *fixture, *patch;
        int op; /* a tensor_edit or one of the cases above */
        const char *tensor, *arg, *error;
    } cases[] = {
        {"mha_attn_r8", NULL, NO_CONFIG, NULL, NULL, "no adapter_config.json"},
        {"mha_attn_r8", NULL, NO_WEIGHTS, NULL, NULL, "no adapter_model.safetensors"},
        {"mha_attn_r8", NULL, BIN_ONLY, NULL, NULL, "unsupported, use safetensors"},
        {"mha_attn_r8", NULL, NOT_JSON, NULL, NULL, "adapter_config.json: not valid JSON"},
        {"mha_attn_r8", NULL, A_FILE, NULL, NULL, "not a folder"},
        {"mha_attn_r8", "{\"r\": 0}", NONE, NULL, NULL, "adapter_config.json: r must be a rank in [1, 65536], got 0"},
        {"mha_attn_r8", "{\"r\": -4}", NONE, NULL, NULL, "r must be a rank"},
        {"mha_attn_r8", "{\"r\": 8.5}", NONE, NULL, NULL, "r must be a rank"},
        {"mha_attn_r8", "{\"r\": \"8\"}", NONE, NULL, NULL, "r must be a rank"},
        {"mha_attn_r8", "{\"r\": 4}", NONE, NULL, NULL, "do not have the rank 4"},
        {"mha_attn_r8", "{\"lora_alpha\": \"16\"}", NONE, NULL, NULL, "lora_alpha must be a number"},
        {"mha_attn_r8", "{\"use_rslora\": 1}", NONE, NULL, NULL, "use_rslora must be true or false"},
        {"mha_attn_r8", "{\"use_dora\": true}", NONE, NULL, NULL, "use_dora: DoRA is not supported"},
        {"mha_attn_r8", "{\"bias\": \"all\"}", NONE, NULL, NULL, "bias \"all\""},
        {"mha_attn_r8", "{\"bias\": \"lora_only\"}", NONE, NULL, NULL, "bias \"lora_only\""},
        {"mha_attn_r8", "{\"lora_bias\": true}", NONE, NULL, NULL, "lora_bias"},
        {"mha_attn_r8", "{\"modules_to_save\": [\"lm_head\"]}", NONE, NULL, NULL, "modules_to_save"},
        {"mha_attn_r8", "{\"peft_type\": \"IA3\"}", NONE, NULL, NULL, "peft_type is IA3"},
        {"mha_attn_r8", "{\"target_modules\": \"(q_proj\"}", NONE, NULL, NULL, "does not compile"},
        {"mha_attn_r8", "{\"target_modules\": 3}", NONE, NULL, NULL, "target_modules must be a string or a list"},
        {"mha_attn_r8", "{\"target_modules\": \".*\", \"layers_to_transform\": [0]}", NONE, NULL, NULL,
         "cannot be used with a target_modules string"},
        {"mha_attn_r8", "{\"layers_pattern\": \"layers\"}", NONE, NULL, NULL, "layers_pattern needs layers_to_transform"},
        {"mha_attn_r8", "{\"rank_pattern\": {\"q_proj\": 0}}", NONE, NULL, NULL, "rank_pattern[\"q_proj\"] must be a rank"},
        {"mha_attn_r8", "{\"alpha_pattern\": {\"q_proj\": null}}", NONE, NULL, NULL,
         "alpha_pattern[\"q_proj\"] must be a finite number"},
        {"mha_attn_r8", NULL, T_NAN, q0a, NULL, KEY("model.layers.0.self_attn.q_proj", "A") ": element 3 is NaN"},
        {"mha_attn_r8", NULL, T_INF, q0b, NULL, "element 3 is infinite"},
        {"mha_attn_r8", NULL, T_DROP, q0b, NULL, KEY("model.layers.0.self_attn.q_proj", "A") " has no matching lora_B"},
        {"mha_attn_r8", NULL, T_DROP, q0a, NULL, "has no matching lora_A"},
        {"mha_attn_r8", NULL, T_RENAME, q0a, "base_model.model.lm_head.lora_A.weight",
         "lm_head is not a projection qlm adapts in this Llama-family model"},
        {"mha_attn_r8", NULL, T_RENAME, q0a, KEY("model.layers.0.self_attn.qkv_proj", "A"),
         "the base model has separate projections, so its adapters name q/k/v_proj and gate/up_proj"},
        {"mha_attn_r8", NULL, T_RENAME, q0a, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
         "is not a LoRA weight"},
        {"mha_attn_r8", NULL, T_RENAME, q0a, KEY("model.layers.00.self_attn.q_proj", "A"), "is not a projection"},
        {"mha_attn_r8", NULL, T_RENAME, q0a, KEY("model.layers.7.self_attn.q_proj", "A"), "only 2 layers"},
        {"mha_attn_r8", NULL, T_ADD, q0a, KEY("model.layers.0.mlp.up_proj", "A"), "mlp.up_proj is not targeted"},
        {"mha_attn_r8", NULL, T_INT8, q0a, NULL, "INT8 LoRA weights are not supported"},
        {"mha_attn_r8", NULL, T_VECTOR, q0b, NULL, "must be a non-empty matrix"},
        {"mha_attn_r8", NULL, TRUNCATED, NULL, NULL, "adapter_model.safetensors"},
        {"mha_attn_r8", NULL, GARBAGE, NULL, NULL, "after the last tensor"},
        {"qwen2_all_rslora_r4", NULL, NONE, NULL, NULL,
         "self_attn.k_proj.lora_B.weight has shape [32,4], expected [64,4]: model.layers.0.self_attn.k_proj of the base "
         "model is [out 64, in 64]"},
        {"t5_qv_rslora_r16", NULL, NONE, NULL, NULL, "adapts a T5 model, but the base model is Llama-family"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        write_variant(dir, cases[c].fixture, cases[c].patch);
        const char *load_path = dir;
        switch (cases[c].op) {
        case NONE: break;
        case NO_CONFIG:
        case NO_WEIGHTS:
        case BIN_ONLY:
            snprintf(path, sizeof path, "%s/%s", dir, cases[c].op == NO_CONFIG ? "adapter_config.json" : "adapter_model.safetensors");
            unlink(path);
            if (cases[c].op == BIN_ONLY) {
                snprintf(path, sizeof path, "%s/adapter_model.bin", dir);
                assert_int_equal(test_write_file(path, "PK", 2), 0);
            }
            break;
        case NOT_JSON:
            snprintf(path, sizeof path, "%s/adapter_config.json", dir);
            assert_int_equal(test_write_file(path, "{\"r\": 8,", 8), 0);
            break;
        case TRUNCATED:
        case GARBAGE: truncate_weights(dir, cases[c].op == GARBAGE); break;
        case A_FILE:
            snprintf(path, sizeof path, "%s/adapter_config.json", dir);
            load_path = path;
            break;
        default: edit_tensors(dir, (tensor_edit)cases[c].op, cases[c].tensor, cases[c].arg);
        }
        qlm_lora_adapter a;
        memset(&a, 0x5a, sizeof a);
        assert_int_equal(load_for(&a, load_path, &f, QLM_F32), -1);
        if (!strstr(qlm_last_error(), cases[c].error))
            fail_msg("case %zu: error \"%s\" lacks \"%s\"", c, qlm_last_error(), cases[c].error);
        print_message("bad adapter %2zu: %s\n", c, qlm_last_error());
        qlm_lora_adapter zero;
        memset(&zero, 0, sizeof zero);
        assert_memory_equal(&a, &zero, sizeof a);
        assert_int_equal(qlm_lora_registry_load(&r, "bad", load_path, QLM_F32), -1);
        assert_int_equal(r.n, 1);
        assert_ptr_equal(qlm_lora_registry_find(&r, "good"), good);
        assert_ptr_equal(qlm_lora_registry_default(&r), good);
        assert_memory_equal(good->buffer, good_bytes, n_good);
        remove_adapter_dir(dir);
    }
    /* A merge that fails on a later module changes no earlier one: qwen2's q_proj fits this
     * base, its k_proj does not. */
    qlm_lora_adapter other;
    assert_int_equal(qlm_lora_load(&other, FIX "/qwen2_all_rslora_r4", NULL, NULL, NULL, QLM_F32), 0);
    assert_int_equal(merge_base(&b, &other, 1), -1);
    assert_non_null(strstr(qlm_last_error(), "model.layers.0.self_attn.k_proj is [32,64] in the adapter"));
    qlm_lora_free(&other);
    assert_int_equal(merge_base(&b, good, 2), -1);
    assert_int_equal(qlm_lora_load(&other, FIX "/t5_qv_rslora_r16", NULL, NULL, NULL, QLM_F32), 0);
    assert_int_equal(merge_base(&b, &other, 1), -1);
    assert_non_null(strstr(qlm_last_error(), "is for a t5 model"));
    qlm_lora_free(&other);
    size_t n_after;
    char *after = snapshot(&b, &n_after);
    assert_memory_equal(after, model_bytes, n_model);
    free(after);
    free(model_bytes);
    free(good_bytes);
    rmdir(tmp);
    qlm_lora_registry_free(&r);
    free_base(&b);
    close_fixture(&f);
}

/* ---- the command line ---- */

/* `qlm lora merge` into a folder, loaded back as a model: its logits are the fixture's. */
static void check_cli_merge(const char *name, const char *tmp) {
    fixture f;
    open_fixture(&f, name);
    char out_dir[600], *err = NULL;
    snprintf(out_dir, sizeof out_dir, "%s/%s", tmp, name);
    assert_int_equal(test_run_qlm(&err, "lora merge -m %s --lora %s -o %s 2>&1", f.base_dir, f.dir, out_dir), 0);
    assert_non_null(strstr(err, "merged"));
    free(err);
    fixture merged = f;
    if (qlm_source_open(&merged.src, out_dir, NULL) != 0) fail_msg("%s", qlm_last_error());
    base_model b;
    build_base(&b, &merged, QLM_F32);
    size_t n;
    float *logits = logits_of(&f, &b, &n);
    char path[1024];
    snprintf(path, sizeof path, "%s/logits.f32", f.dir);
    double diff = max_diff_file(logits, n, path);
    print_message("%-20s `qlm lora merge` folder: logits vs peft max|diff| %.3g\n", name, diff);
    assert_true(diff <= 1e-4);
    free(logits);
    free_base(&b);
    qlm_source_close(&merged.src);
    const char *files[] = {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", out_dir, files[i]);
        unlink(path);
    }
    rmdir(out_dir);
    close_fixture(&f);
}

static void test_cli(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(test_run_qlm(&out, "lora info " FIX "/gqa_regex_patterns"), 0);
    const char *lines[] = {"base            llama family\n", "rank            8 (down_proj=4, model.layers.1.self_attn.q_proj=16)\n",
                           "alpha           16 (v_proj=4)\n", "rsLoRA          no", "scale           0.5 to 4\n",
                           "target_modules  .*\\.(q_proj|v_proj|down_proj)\n", "targets         q_proj v_proj down_proj\n",
                           "modules         6\n", "parameters      6144 (24.0 KiB as f32"};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        if (!strstr(out, lines[i])) fail_msg("`qlm lora info` lacks \"%s\":\n%s", lines[i], out);
    free(out);
    assert_int_equal(test_run_qlm(&out, "lora info --json " FIX "/t5_all_patterns_r8"), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "arch")->valuestring, "t5");
    assert_int_equal(cJSON_GetObjectItem(j, "r")->valueint, 8);
    assert_false(cJSON_IsTrue(cJSON_GetObjectItem(j, "use_rslora")));
    assert_int_equal(cJSON_GetObjectItem(j, "modules")->valueint, 47);
    assert_int_equal(cJSON_GetObjectItem(j, "parameters")->valueint, 51968);
    assert_int_equal(cJSON_GetObjectItem(j, "bytes")->valueint, 51968 * 4);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "targets")), 11);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "decoder_blocks")), 3);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "rank_pattern"), "wo")->valueint, 4);
    assert_true(cJSON_GetObjectItem(j, "scale_min")->valuedouble == 0.25);
    cJSON_Delete(j);
    free(out);

    assert_int_equal(test_run_qlm(&out, "lora info /nonexistent/adapter 2>&1"), 1);
    assert_non_null(strstr(out, "qlm lora info: /nonexistent/adapter"));
    free(out);
    const char *usage_errors[] = {"lora", "lora frob", "lora info", "lora info a b", "lora info --bogus x", "lora merge -m x",
                                  "lora merge -m x --lora y -o z --dtype int8", "lora merge -m x --lora y -o z extra",
                                  "lora merge -m x --lora y -o z --dtype q3"};
    for (size_t i = 0; i < sizeof usage_errors / sizeof usage_errors[0]; i++) {
        int rc = test_run_qlm(&out, "%s 2>&1", usage_errors[i]);
        if (rc != 2) fail_msg("`qlm %s` exited %d, not 2:\n%s", usage_errors[i], rc, out);
        free(out);
    }
    assert_int_equal(test_run_qlm(&out, "lora --help"), 0);
    assert_non_null(strstr(out, "usage: qlm lora info"));
    free(out);

    char tmp[256];
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    check_cli_merge("mha_attn_r8", tmp);
    check_cli_merge("t5_all_patterns_r8", tmp);
    /* An adapter for another base, and an INT8 model, are refused (exit 1) and write nothing. */
    assert_int_equal(test_run_qlm(&out, "lora merge -m tests/fixtures/llama/mha_untied --lora " FIX
                                        "/qwen2_all_rslora_r4 -o %s/x 2>&1", tmp), 1);
    assert_non_null(strstr(out, "expected [64,4]"));
    free(out);
    assert_int_equal(test_run_qlm(&out, "quantize tests/fixtures/llama/mha_untied %s/i8 --dtype int8 2>&1", tmp), 0);
    free(out);
    assert_int_equal(test_run_qlm(&out, "lora merge -m %s/i8 --lora " FIX "/mha_attn_r8 -o %s/x 2>&1", tmp, tmp), 1);
    assert_non_null(strstr(out, "INT8"));
    free(out);
    char path[1024];
    snprintf(path, sizeof path, "%s/x", tmp);
    assert_false(test_path_exists(path));
    const char *files[] = {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/i8/%s", tmp, files[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/i8", tmp);
    rmdir(path);
    rmdir(tmp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_fixtures),
        cmocka_unit_test(test_merged_matches_peft),
        cmocka_unit_test(test_unmerged_matches_peft),
        cmocka_unit_test(test_mixed_batch),
        cmocka_unit_test(test_lora_op_threads),
        cmocka_unit_test(test_batch_prefix_per_adapter),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_unmerge_bound),
        cmocka_unit_test(test_save_roundtrip),
        cmocka_unit_test(test_config_semantics),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_bad_adapters),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
