/* llama2.c checkpoint loader: the stories260K header and tensor shapes, every tensor against
 * the file's bytes read independently with stdio, the Q/K reordering checked by its meaning
 * (interleaved RoPE on the file's rows gives the same attention scores as rotate-half RoPE on
 * the loaded rows), and an unshared classifier in a small synthetic checkpoint. */
#include "test_util.h"

#include <math.h>
#include <unistd.h>

#include "../core/error.h"
#include "../loaders/llama2c.h"
#include "../quant/quantize.h"

#define STORIES "stories260K/stories260K.bin"
#define DIM 64
#define HID 172
#define LAYERS 5
#define HEADS 8
#define KV_HEADS 4
#define VOCAB 512
#define SEQ 512
#define HD (DIM / HEADS)
#define KV_DIM (KV_HEADS * HD)

typedef struct {
    qlm_llama_config cfg;
    qlm_tensor_store *store;
    float *raw; /* the file's floats after the 28-byte header */
} loaded;

static int setup(void **state) {
    char path[4096];
    test_asset(path, sizeof path, STORIES);
    if (!test_path_exists(path)) {
        *state = NULL;
        return 0;
    }
    loaded *l = calloc(1, sizeof *l);
    l->store = qlm_store_new();
    if (qlm_llama2c_load(path, &l->cfg, l->store) != 0) {
        print_error("%s\n", qlm_last_error());
        return -1;
    }
    size_t len = 0;
    char *bytes = test_read_file(path, &len);
    if (!bytes || len < 28) return -1;
    l->raw = malloc(len - 28);
    memcpy(l->raw, bytes + 28, len - 28);
    free(bytes);
    *state = l;
    return 0;
}

static int teardown(void **state) {
    loaded *l = *state;
    if (!l) return 0;
    qlm_store_free(l->store);
    free(l->raw);
    free(l);
    return 0;
}

static loaded *need(void **state) {
    char path[4096];
    REQUIRE_ASSET(test_asset(path, sizeof path, STORIES));
    return *state;
}

static const qlm_tensor_entry *layer_entry(const loaded *l, int layer, const char *name) {
    char full[128];
    snprintf(full, sizeof full, "model.layers.%d.%s", layer, name);
    const qlm_tensor_entry *e = qlm_store_find(l->store, full);
    if (!e) fail_msg("missing %s", full);
    return e;
}

static void test_header(void **state) {
    const qlm_llama_config *c = &need(state)->cfg;
    assert_string_equal(c->arch, "llama");
    assert_int_equal(c->dim, DIM);
    assert_int_equal(c->hidden_dim, HID);
    assert_int_equal(c->n_layers, LAYERS);
    assert_int_equal(c->n_heads, HEADS);
    assert_int_equal(c->n_kv_heads, KV_HEADS);
    assert_int_equal(c->head_dim, HD);
    assert_int_equal(c->vocab_size, VOCAB);
    assert_int_equal(c->max_seq_len, SEQ);
    assert_int_equal(c->tie_embeddings, 1);
    assert_int_equal(c->attn_bias, 0);
    assert_true(c->rope_theta == 10000.0f);
    assert_true(c->norm_eps == 1e-5f);
    assert_int_equal(c->bos_id, 1);
    assert_int_equal(c->eos_id, 2);
}

static void check_shape(const qlm_tensor_entry *e, int64_t rows, int64_t cols) {
    assert_int_equal(e->dtype, QLM_F32);
    assert_int_equal(e->ndim, cols ? 2 : 1);
    assert_int_equal(e->shape[0], rows);
    if (cols) assert_int_equal(e->shape[1], cols);
    assert_int_equal(e->nbytes, (size_t)(rows * (cols ? cols : 1)) * sizeof(float));
}

/* The file's arrays, in order: name, rows, cols (0: vector), per layer?, Q/K heads. */
static const struct {
    const char *name;
    int64_t rows, cols;
    int per_layer, heads;
} LAYOUT[] = {
    {"model.embed_tokens.weight", VOCAB, DIM, 0, 0},
    {"input_layernorm.weight", DIM, 0, 1, 0},
    {"self_attn.q_proj.weight", DIM, DIM, 1, HEADS},
    {"self_attn.k_proj.weight", KV_DIM, DIM, 1, KV_HEADS},
    {"self_attn.v_proj.weight", KV_DIM, DIM, 1, 0},
    {"self_attn.o_proj.weight", DIM, DIM, 1, 0},
    {"post_attention_layernorm.weight", DIM, 0, 1, 0},
    {"mlp.gate_proj.weight", HID, DIM, 1, 0},
    {"mlp.down_proj.weight", DIM, HID, 1, 0},
    {"mlp.up_proj.weight", HID, DIM, 1, 0},
    {"model.norm.weight", DIM, 0, 0, 0},
};

/* Every tensor equals the floats at its place in the file; Q/K row r of head h holds file row
 * h*hd + 2i + s where r = h*hd + s*hd/2 + i. */
/* An F32 matrix entry's rows in PyTorch's order, as the model reads them (malloc'd). */
static float *pytorch_rows(const qlm_tensor_entry *e) {
    const qlm_weight w = {.dtype = e->dtype, .rows = (int)e->shape[0], .cols = (int)e->shape[1], .data = e->data,
                          .rope_heads = e->rope_heads};
    float *out = malloc((size_t)w.rows * (size_t)w.cols * sizeof *out);
    assert_non_null(out);
    for (int r = 0; r < w.rows; r++) qlm_weight_row_f32(&w, r, out + (size_t)r * w.cols);
    return out;
}

/* Every array lies in the store as in the file (Q/K too: rope_heads says their rows are interleaved),
 * and reads back in PyTorch's order. */
static void test_tensors_match_file(void **state) {
    loaded *l = need(state);
    assert_int_equal(qlm_store_count(l->store), 2 + 9 * LAYERS);
    assert_null(qlm_store_find(l->store, "lm_head.weight"));
    size_t off = 0;
    for (size_t k = 0; k < sizeof LAYOUT / sizeof LAYOUT[0]; k++) {
        int64_t cols = LAYOUT[k].cols ? LAYOUT[k].cols : 1, n = LAYOUT[k].rows * cols;
        for (int layer = 0; layer < (LAYOUT[k].per_layer ? LAYERS : 1); layer++, off += (size_t)n) {
            const qlm_tensor_entry *e = LAYOUT[k].per_layer ? layer_entry(l, layer, LAYOUT[k].name)
                                                            : qlm_store_find(l->store, LAYOUT[k].name);
            assert_non_null(e);
            check_shape(e, LAYOUT[k].rows, LAYOUT[k].cols);
            const float *file = l->raw + off;
            int heads = LAYOUT[k].heads;
            assert_memory_equal(e->data, file, (size_t)n * sizeof(float));
            assert_int_equal(e->rope_heads, heads);
            if (!heads) continue;
            float *got = pytorch_rows(e);
            for (int64_t r = 0; r < LAYOUT[k].rows; r++) {
                int64_t hd = LAYOUT[k].rows / heads, h = r / hd, j = r % hd;
                int64_t src = h * hd + 2 * (j % (hd / 2)) + j / (hd / 2);
                assert_memory_equal(got + r * cols, file + src * cols, (size_t)cols * sizeof(float));
            }
            free(got);
        }
    }
    /* What is left is freq_cis_real + freq_cis_imag: seq_len * head_size floats. */
    assert_int_equal(off + SEQ * HD, (1056540 - 28) / 4);
    /* Spot values numpy reads at those offsets (np.fromfile(path, "<f4", offset=28)). */
    const float *emb = qlm_store_find(l->store, "model.embed_tokens.weight")->data;
    const float *norm = qlm_store_find(l->store, "model.norm.weight")->data;
    float *q = pytorch_rows(layer_entry(l, 0, "self_attn.q_proj.weight"));
    assert_true(emb[0] == -0.29474878f && emb[1] == 0.5618956f);
    assert_true(norm[0] == 2.458309f && norm[63] == 1.7077769f);
    assert_true(q[1 * DIM] == 0.055401117f); /* file row 2 */
    assert_true(q[4 * DIM] == 0.22455421f);  /* file row 1 */
    free(q);
}

/* Rotates consecutive pairs (2i, 2i+1) (llama2.c) or halves (i, i + hd/2) (Hugging Face). */
static void rope(float *v, int heads, int pos, int interleaved) {
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < HD / 2; i++) {
            double freq = pow(10000.0, -2.0 * i / HD), c = cos(pos * freq), s = sin(pos * freq);
            int a = h * HD + (interleaved ? 2 * i : i), b = h * HD + (interleaved ? 2 * i + 1 : i + HD / 2);
            float x = v[a], y = v[b];
            v[a] = (float)(x * c - y * s);
            v[b] = (float)(x * s + y * c);
        }
}

static void matvec(const float *w, const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        double acc = 0;
        for (int c = 0; c < cols; c++) acc += (double)w[r * cols + c] * x[c];
        y[r] = (float)acc;
    }
}

/* Attention scores q_h . k_(h / group) after RoPE at positions pq and pk. */
static void scores(const float *wq, const float *wk, const float *x, const float *y, int pq, int pk, int interleaved,
                   double out[HEADS]) {
    float q[DIM], k[KV_DIM];
    matvec(wq, x, q, DIM, DIM);
    matvec(wk, y, k, KV_DIM, DIM);
    rope(q, HEADS, pq, interleaved);
    rope(k, KV_HEADS, pk, interleaved);
    for (int h = 0; h < HEADS; h++) {
        out[h] = 0;
        for (int d = 0; d < HD; d++) out[h] += (double)q[h * HD + d] * k[(h / (HEADS / KV_HEADS)) * HD + d];
    }
}

static void test_rope_layout(void **state) {
    loaded *l = need(state);
    float x[DIM], y[DIM];
    for (int i = 0; i < DIM; i++) {
        x[i] = (float)sin(0.37 * i + 0.1);
        y[i] = (float)cos(0.91 * i - 0.3);
    }
    const size_t wq0 = (size_t)VOCAB * DIM + (size_t)LAYERS * DIM, wk0 = wq0 + (size_t)LAYERS * DIM * DIM;
    const int pos[][2] = {{0, 0}, {5, 2}, {100, 37}, {511, 0}};
    for (int layer = 0; layer < LAYERS; layer++)
        for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++) {
            double file_scores[HEADS], hf_scores[HEADS];
            scores(l->raw + wq0 + (size_t)layer * DIM * DIM, l->raw + wk0 + (size_t)layer * KV_DIM * DIM, x, y,
                   pos[p][0], pos[p][1], 1, file_scores);
            float *wq = pytorch_rows(layer_entry(l, layer, "self_attn.q_proj.weight"));
            float *wk = pytorch_rows(layer_entry(l, layer, "self_attn.k_proj.weight"));
            scores(wq, wk, x, y, pos[p][0], pos[p][1], 0, hf_scores);
            free(wq);
            free(wk);
            for (int h = 0; h < HEADS; h++)
                if (fabs(file_scores[h] - hf_scores[h]) > 1e-4 * (1 + fabs(file_scores[h])))
                    fail_msg("layer %d head %d positions %d/%d: %g vs %g", layer, h, pos[p][0], pos[p][1],
                             file_scores[h], hf_scores[h]);
        }
}

static void write_ints(FILE *f, const int32_t *v, int n) { assert_int_equal(fwrite(v, 4, (size_t)n, f), (size_t)n); }

/* A negative vocab_size puts the classifier after freq_cis; each float holds its own index. */
static void test_unshared_classifier(void **state) {
    (void)state;
    char dir[256], path[300];
    assert_non_null(test_tmpdir(dir, sizeof dir));
    snprintf(path, sizeof path, "%s/tiny.bin", dir);
    const int32_t hdr[7] = {8, 16, 1, 2, 1, -10, 4};
    const int dim = 8, hid = 16, kv = 4, vocab = 10, seq = 4, hd = 4;
    int n = vocab * dim + (2 * dim + 2 * dim * dim + 2 * kv * dim + 3 * hid * dim) + dim + seq * hd + vocab * dim;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    write_ints(f, hdr, 7);
    for (int i = 0; i < n; i++) {
        float v = (float)i;
        assert_int_equal(fwrite(&v, 4, 1, f), 1);
    }
    fclose(f);
    assert_int_equal(qlm_llama2c_probe(path), 1);
    qlm_llama_config c;
    qlm_tensor_store *s = qlm_store_new();
    if (qlm_llama2c_load(path, &c, s) != 0) fail_msg("%s", qlm_last_error());
    assert_int_equal(c.vocab_size, 10);
    assert_int_equal(c.tie_embeddings, 0);
    const qlm_tensor_entry *cls = qlm_store_find(s, "lm_head.weight");
    assert_non_null(cls);
    check_shape(cls, vocab, dim);
    for (int i = 0; i < vocab * dim; i++) assert_true(((const float *)cls->data)[i] == (float)(n - vocab * dim + i));
    const float *norm = qlm_store_find(s, "model.norm.weight")->data;
    assert_true(norm[0] == (float)(n - vocab * dim - seq * hd - dim));
    /* Q rows of head 0 (hd 4): file rows 0, 2, 1, 3. */
    float *q = pytorch_rows(qlm_store_find(s, "model.layers.0.self_attn.q_proj.weight"));
    const int q0 = vocab * dim + dim, order[4] = {0, 2, 1, 3};
    for (int r = 0; r < 4; r++) assert_true(q[r * dim] == (float)(q0 + order[r] * dim));
    free(q);
    qlm_store_free(s);
    remove(path);
    rmdir(dir);
}

static void test_probe(void **state) {
    (void)state;
    char path[4096];
    REQUIRE_ASSET(test_asset(path, sizeof path, STORIES));
    assert_int_equal(qlm_llama2c_probe(path), 1);
    assert_int_equal(qlm_llama2c_probe(test_asset(path, sizeof path, "stories260K/tok512.bin")), 0);
    assert_int_equal(qlm_llama2c_probe("tests/fixtures/gguf/tiny_llama.gguf"), 0);
    assert_int_equal(qlm_llama2c_probe("tests/fixtures/gguf/no_such_file.bin"), 0);
    qlm_llama_config c;
    qlm_tensor_store *s = qlm_store_new();
    assert_int_equal(qlm_llama2c_load("tests/fixtures/gguf/tiny_llama.gguf", &c, s), -1);
    assert_non_null(strstr(qlm_last_error(), "tiny_llama.gguf"));
    qlm_store_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header),
        cmocka_unit_test(test_tensors_match_file),
        cmocka_unit_test(test_rope_layout),
        cmocka_unit_test(test_unshared_classifier),
        cmocka_unit_test(test_probe),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
