/* T5 training against PyTorch (transformers 4.x, peft): loss, every parameter's gradient (relative
 * position biases and the tied head's scaled norm included), LoRA A/B gradients on self- and
 * cross-attention and the feed-forward, and 10 AdamW steps (full and LoRA), for the gated-GELU /
 * untied and ReLU / tied fixtures made by tools/make_t5_train_fixtures.py. */
#include "../loaders/model_source.h"
#include "train_test_util.h"

enum { MAX_SEQ = 4, MAX_ROWS = 64 };

static const qlm_train_shape k_shape = {.max_rows = MAX_ROWS, .max_src_rows = MAX_ROWS, .max_len = 32};

typedef struct {
    int n_seq, start[MAX_SEQ], len[MAX_SEQ], src_start[MAX_SEQ], src_len[MAX_SEQ], n_rows, n_src;
    int ids[MAX_ROWS], pos[MAX_ROWS], targets[MAX_ROWS], src[MAX_ROWS];
    qlm_train_batch b;
    cJSON *ref;
    char dir[300];
} fixture;

/* Decoder inputs are the targets shifted right behind decoder_start; every output row is a target. */
static void load_fixture(const char *name, fixture *f, int decoder_start) {
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "tests/fixtures/train_t5/%s", name);
    cJSON *j = train_fixture_json(f->dir, "batch.json");
    const cJSON *src = cJSON_GetObjectItem(j, "src"), *tgt = cJSON_GetObjectItem(j, "tgt");
    f->n_seq = cJSON_GetArraySize(src);
    assert_true(f->n_seq <= MAX_SEQ);
    for (int s = 0; s < f->n_seq; s++) {
        const cJSON *in = cJSON_GetArrayItem(src, s), *out = cJSON_GetArrayItem(tgt, s);
        f->src_start[s] = f->n_src;
        f->src_len[s] = cJSON_GetArraySize(in);
        for (int t = 0; t < f->src_len[s]; t++) f->src[f->n_src++] = cJSON_GetArrayItem(in, t)->valueint;
        f->start[s] = f->n_rows;
        f->len[s] = cJSON_GetArraySize(out);
        for (int t = 0; t < f->len[s]; t++) {
            int r = f->n_rows++;
            f->ids[r] = t == 0 ? decoder_start : cJSON_GetArrayItem(out, t - 1)->valueint;
            f->pos[r] = t;
            f->targets[r] = cJSON_GetArrayItem(out, t)->valueint;
        }
    }
    cJSON_Delete(j);
    f->b = (qlm_train_batch){.n_seq = f->n_seq, .start = f->start, .len = f->len, .n_rows = f->n_rows, .ids = f->ids,
                             .pos = f->pos, .targets = f->targets, .n_src_rows = f->n_src, .src_ids = f->src,
                             .src_start = f->src_start, .src_len = f->src_len};
    f->ref = train_fixture_json(f->dir, "reference.json");
}

static void open_model(const char *name, qlm_source *src, qlm_t5_model *m) {
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/t5/%s", name);
    if (qlm_source_open(src, dir, NULL) != 0) fail_msg("%s", qlm_last_error());
    assert_true(src->is_t5);
    qlm_model_options o = {.dtype = QLM_F32, .backend = test_backend()};
    if (qlm_t5_build(m, &src->t5, src->store, &o) != 0) fail_msg("%s", qlm_last_error());
}

/* Loss tolerance of a step: 1e-5 while the float32 trajectory is stable; after tight_steps, a bound
 * that covers how far torch's own float32 run drifts from a float64 one (tests/fixtures/train_t5/
 * README.md: up to 3e-5 for gated_untied's full run; relu_tied amplifies rounding from step 3 (full)
 * and step 7 (LoRA)), so builds that round differently (-O1 under the sanitizers: 1.2e-5 at step 2)
 * still pass. The largest difference is printed; the -O2 build stays within 1e-5 on gated_untied. */
static double step_tol(int step, int tight_steps, double late_tol) { return step < tight_steps ? 1e-5 : late_tol; }

static void check_full(const char *name, int tight_steps, double late_tol) {
    qlm_source src;
    qlm_t5_model m;
    open_model(name, &src, &m);
    fixture f;
    load_fixture(name, &f, src.t5.decoder_start_id);
    qlm_train_options o;
    qlm_train_options_init(&o);
    o.mode = QLM_TRAIN_FULL;
    o.lr = 1e-3;
    o.weight_decay = 0.1;
    o.schedule = QLM_SCHEDULE_CONSTANT;
    qlm_trainer t;
    if (qlm_trainer_init(&t, NULL, &m, NULL, &o, &k_shape) != 0) fail_msg("%s", qlm_last_error());
    double worst = 0;
    for (int step = 0; step < 10; step++) {
        qlm_train_step_stats st;
        if (qlm_trainer_step(&t, &f.b, 1, &st) != 0) fail_msg("%s", qlm_last_error());
        if (step == 0) {
            print_message("%s loss %.8f (torch %.8f), grad norm %.6f (torch %.6f)\n", name, st.loss,
                          ref_num(f.ref, "loss"), st.grad_norm, ref_num(f.ref, "grad_norm"));
            assert_int_equal(st.n_targets, (long)ref_num(f.ref, "n_targets"));
            assert_true(fabs(st.loss - ref_num(f.ref, "loss")) <= 1e-5);
            compare_tensors(&t, f.dir, "grads.safetensors", 'g', 1e-4); /* unclipped: clipping is inside the update */
        }
        double want = ref_at(f.ref, "adamw_losses", step);
        worst = fmax(worst, fabs(st.loss - want));
        if (fabs(st.loss - want) > step_tol(step, tight_steps, late_tol)) fail_msg("%s step %d: loss %.8f, torch %.8f", name, step + 1, st.loss, want);
    }
    print_message("%s: 10 AdamW losses within %.2g of torch\n", name, worst);
    qlm_trainer_free(&t);
    qlm_t5_free(&m);
    qlm_source_close(&src);
    cJSON_Delete(f.ref);
}

static void check_lora(const char *name, int tight_steps, double late_tol) {
    qlm_source src;
    qlm_t5_model m;
    open_model(name, &src, &m);
    fixture f;
    load_fixture(name, &f, src.t5.decoder_start_id);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/lora_adapter", f.dir);
    qlm_lora_adapter a;
    if (qlm_lora_load(&a, dir, "trained", NULL, &src.t5, QLM_F32) != 0) fail_msg("%s", qlm_last_error());
    qlm_train_options o;
    qlm_train_options_init(&o);
    o.lr = 1e-2;
    o.weight_decay = 0.01;
    o.schedule = QLM_SCHEDULE_CONSTANT;
    qlm_trainer t;
    if (qlm_trainer_init(&t, NULL, &m, &a, &o, &k_shape) != 0) fail_msg("%s", qlm_last_error());
    double worst = 0;
    for (int step = 0; step < 10; step++) {
        qlm_train_step_stats st;
        if (qlm_trainer_step(&t, &f.b, 1, &st) != 0) fail_msg("%s", qlm_last_error());
        if (step == 0) {
            print_message("%s LoRA loss %.8f (torch %.8f)\n", name, st.loss, ref_num(f.ref, "lora_loss"));
            assert_true(fabs(st.loss - ref_num(f.ref, "lora_loss")) <= 1e-5);
            compare_tensors(&t, f.dir, "lora_grads.safetensors", 'g', 1e-4);
        }
        double want = ref_at(f.ref, "lora_adamw_losses", step);
        worst = fmax(worst, fabs(st.loss - want));
        if (fabs(st.loss - want) > step_tol(step, tight_steps, late_tol)) fail_msg("%s LoRA step %d: loss %.8f, torch %.8f", name, step + 1, st.loss, want);
    }
    print_message("%s LoRA: 10 AdamW losses within %.2g of torch\n", name, worst);
    qlm_trainer_free(&t);
    qlm_lora_free(&a);
    qlm_t5_free(&m);
    qlm_source_close(&src);
    cJSON_Delete(f.ref);
}

static void test_full_gated_untied(void **state) {
    (void)state;
    check_full("gated_untied", 1, 5e-5);
}

static void test_full_relu_tied(void **state) {
    (void)state;
    check_full("relu_tied", 1, 1e-4);
}

static void test_lora_gated_untied(void **state) {
    (void)state;
    check_lora("gated_untied", 10, 0);
}

static void test_lora_relu_tied(void **state) {
    (void)state;
    check_lora("relu_tied", 6, 5e-4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_gated_untied), cmocka_unit_test(test_full_relu_tied),
        cmocka_unit_test(test_lora_gated_untied), cmocka_unit_test(test_lora_relu_tied),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
