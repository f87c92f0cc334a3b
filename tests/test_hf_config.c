/* config.json reader/writer against configs written by transformers (the fixtures from
 * tools/make_llama_fixtures.py, transformers 5 format) and by older versions (shared assets).
 * With QLM_EXPORT_DIR set, the round-trip folders (config.json + model.safetensors written
 * by qlm) are kept there for tools/check_qlm_exports.py to load with transformers. */
#include "test_util.h"

#include <dirent.h>
#include <math.h>
#include <unistd.h>

#include "core/error.h"
#include "loaders/hf_config.h"
#include "loaders/safetensors.h"

typedef struct {
    const char *dir;
    qlm_llama_config want;
} fixture_cfg;

/* Values given to transformers' config classes in tools/make_llama_fixtures.py. */
static const fixture_cfg FIXTURES[] = {
    {"mha_untied", {.arch = "llama", .dim = 64, .hidden_dim = 176, .n_layers = 2, .n_heads = 4, .n_kv_heads = 4,
                    .head_dim = 16, .vocab_size = 384, .max_seq_len = 256, .rope_theta = 10000.0f, .norm_eps = 1e-5f,
                    .bos_id = 1, .eos_id = 2}},
    {"gqa_tied", {.arch = "llama", .dim = 64, .hidden_dim = 160, .n_layers = 2, .n_heads = 8, .n_kv_heads = 2,
                  .head_dim = 8, .vocab_size = 320, .max_seq_len = 256, .rope_theta = 10000.0f, .norm_eps = 1e-6f,
                  .tie_embeddings = 1, .bos_id = 1, .eos_id = 2}},
    {"qwen2_bias", {.arch = "qwen2", .dim = 64, .hidden_dim = 192, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                    .head_dim = 16, .vocab_size = 448, .max_seq_len = 256, .rope_theta = 1000000.0f, .norm_eps = 1e-6f,
                    .attn_bias = 1, .bos_id = 1, .eos_id = 2}},
    {"llama3_rope", {.arch = "llama", .dim = 64, .hidden_dim = 128, .n_layers = 3, .n_heads = 4, .n_kv_heads = 2,
                     .head_dim = 32, .vocab_size = 256, .max_seq_len = 256, .rope_theta = 500000.0f, .norm_eps = 1e-5f,
                     .rope_scale_factor = 8.0f, .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f,
                     .rope_type = QLM_ROPE_LLAMA3, .rope_orig_max_pos = 32, .bos_id = 1, .eos_id = 2}},
    {"qwen3_window", {.arch = "qwen3", .dim = 64, .hidden_dim = 160, .n_layers = 3, .n_heads = 6, .n_kv_heads = 2,
                      .head_dim = 24, .vocab_size = 352, .max_seq_len = 256, .rope_theta = 1000000.0f,
                      .norm_eps = 1e-6f, .tie_embeddings = 1, .qk_norm = 1, .sliding_window = 8,
                      .window_first_layer = 1, .bos_id = 1, .eos_id = 2}},
    {"mistral_window", {.arch = "mistral", .dim = 64, .hidden_dim = 144, .n_layers = 2, .n_heads = 8,
                        .n_kv_heads = 2, .head_dim = 8, .vocab_size = 288, .max_seq_len = 256, .rope_theta = 10000.0f,
                        .norm_eps = 1e-5f, .sliding_window = 10, .bos_id = 1, .eos_id = 2}},
    {"gelu_linear_rope", {.arch = "llama", .dim = 64, .hidden_dim = 128, .n_layers = 2, .n_heads = 4, .n_kv_heads = 4,
                          .head_dim = 16, .vocab_size = 320, .max_seq_len = 256, .rope_theta = 10000.0f,
                          .norm_eps = 1e-5f, .act = QLM_ACT_GELU, .rope_type = QLM_ROPE_LINEAR,
                          .rope_scale_factor = 4.0f, .rope_orig_max_pos = 256, .bos_id = 1, .eos_id = 2}},
    /* attention factor 0.1 ln 8 + 1 */
    {"yarn_gelu_tanh_bias", {.arch = "llama", .dim = 64, .hidden_dim = 128, .n_layers = 2, .n_heads = 4,
                             .n_kv_heads = 2, .head_dim = 32, .vocab_size = 256, .max_seq_len = 128,
                             .rope_theta = 10000.0f, .norm_eps = 1e-6f, .attn_bias = 1, .attn_out_bias = 1,
                             .mlp_bias = 1, .act = QLM_ACT_GELU_TANH, .rope_type = QLM_ROPE_YARN,
                             .rope_scale_factor = 8.0f, .rope_beta_fast = 8.0f, .rope_beta_slow = 1.0f,
                             .rope_attn_factor = 1.2079441541679836f, .rope_orig_max_pos = 16, .bos_id = 1,
                             .eos_id = 2}},
    {"gemma2_softcap", {.arch = "gemma2", .dim = 64, .hidden_dim = 128, .n_layers = 3, .n_heads = 4, .n_kv_heads = 2,
                        .head_dim = 16, .vocab_size = 320, .max_seq_len = 256, .rope_theta = 10000.0f,
                        .norm_eps = 1e-6f, .act = QLM_ACT_GELU_TANH, .post_norms = 1, .norm_offset = 1,
                        .embed_scale = 8, .query_scale = 0.20412414523193151f, .attn_softcap = 5, .final_softcap = 8,
                        .sliding_window = 8, .window_period = 2, .bos_id = 1, .eos_id = 2}},
    {"gemma3_local_rope", {.arch = "gemma3_text", .dim = 64, .hidden_dim = 160, .n_layers = 4, .n_heads = 4,
                           .n_kv_heads = 1, .head_dim = 32, .vocab_size = 288, .max_seq_len = 256,
                           .rope_theta = 1000000.0f, .rope_local_theta = 10000.0f, .rope_type = QLM_ROPE_LINEAR,
                           .rope_scale_factor = 4, .rope_orig_max_pos = 256, .norm_eps = 1e-6f,
                           .act = QLM_ACT_GELU_TANH, .qk_norm = 1, .post_norms = 1, .norm_offset = 1,
                           .embed_scale = 8, .query_scale = 0.17677669529663687f, .sliding_window = 6,
                           .window_period = 3, .bos_id = 1, .eos_id = 2}},
};
/* The HF class each fixture's config is written back as. */
static const char *const SAVED_CLASS[] = {"LlamaForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM",
                                          "LlamaForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
                                          "LlamaForCausalLM", "LlamaForCausalLM", "Gemma2ForCausalLM",
                                          "Gemma3ForCausalLM"};
#define N_FIXTURES (sizeof FIXTURES / sizeof FIXTURES[0])

static void assert_cfg_equal(const qlm_llama_config *a, const qlm_llama_config *b) {
    assert_string_equal(a->arch, b->arch);
    assert_int_equal(a->dim, b->dim);
    assert_int_equal(a->hidden_dim, b->hidden_dim);
    assert_int_equal(a->n_layers, b->n_layers);
    assert_int_equal(a->n_heads, b->n_heads);
    assert_int_equal(a->n_kv_heads, b->n_kv_heads);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->max_seq_len, b->max_seq_len);
    assert_true(a->rope_theta == b->rope_theta);
    assert_true(a->norm_eps == b->norm_eps);
    assert_int_equal(a->tie_embeddings, b->tie_embeddings);
    assert_int_equal(a->attn_bias, b->attn_bias);
    assert_int_equal(a->attn_out_bias, b->attn_out_bias);
    assert_int_equal(a->mlp_bias, b->mlp_bias);
    assert_true(a->rope_scale_factor == b->rope_scale_factor);
    assert_true(a->rope_low_freq_factor == b->rope_low_freq_factor);
    assert_true(a->rope_high_freq_factor == b->rope_high_freq_factor);
    assert_int_equal(a->rope_orig_max_pos, b->rope_orig_max_pos);
    assert_int_equal(a->rope_type, b->rope_type);
    assert_true(a->rope_beta_fast == b->rope_beta_fast && a->rope_beta_slow == b->rope_beta_slow);
    assert_true(fabsf(a->rope_attn_factor - b->rope_attn_factor) <= 1e-6f);
    assert_int_equal(a->act, b->act);
    assert_int_equal(a->qk_norm, b->qk_norm);
    assert_int_equal(a->sliding_window, b->sliding_window);
    assert_int_equal(a->window_first_layer, b->window_first_layer);
    assert_int_equal(a->window_period, b->window_period);
    assert_true(a->rope_local_theta == b->rope_local_theta);
    assert_int_equal(a->post_norms, b->post_norms);
    assert_true(a->norm_offset == b->norm_offset && a->embed_scale == b->embed_scale);
    assert_true(a->query_scale == b->query_scale);
    assert_true(a->attn_softcap == b->attn_softcap && a->final_softcap == b->final_softcap);
    assert_int_equal(a->bos_id, b->bos_id);
    assert_int_equal(a->eos_id, b->eos_id);
}

static void load_ok(const char *path, qlm_llama_config *cfg) {
    if (qlm_hf_config_load(path, cfg) != 0) fail_msg("%s: %s", path, qlm_last_error());
}

static void test_fixture_configs(void **state) {
    (void)state;
    for (size_t i = 0; i < N_FIXTURES; i++) {
        char path[256];
        snprintf(path, sizeof path, "tests/fixtures/llama/%s/config.json", FIXTURES[i].dir);
        qlm_llama_config cfg;
        load_ok(path, &cfg);
        assert_cfg_equal(&cfg, &FIXTURES[i].want);
    }
}

static void test_asset_configs(void **state) {
    (void)state;
    char path[512];
    qlm_llama_config cfg;
    /* TinyLlama: transformers 4.35 format, and the file starts with a space. */
    test_asset(path, sizeof path, "tinyllama-1.1b-chat-v1.0-tokenizer/config.json");
    REQUIRE_ASSET(path);
    load_ok(path, &cfg);
    qlm_llama_config tinyllama = {.arch = "llama", .dim = 2048, .hidden_dim = 5632, .n_layers = 22, .n_heads = 32,
                                  .n_kv_heads = 4, .head_dim = 64, .vocab_size = 32000, .max_seq_len = 2048,
                                  .rope_theta = 10000.0f, .norm_eps = 1e-5f, .bos_id = 1, .eos_id = 2};
    assert_cfg_equal(&cfg, &tinyllama);

    test_asset(path, sizeof path, "tinystories-656K-hf/config.json");
    REQUIRE_ASSET(path);
    load_ok(path, &cfg);
    qlm_llama_config stories = {.arch = "llama", .dim = 128, .hidden_dim = 384, .n_layers = 2, .n_heads = 8,
                                .n_kv_heads = 4, .head_dim = 16, .vocab_size = 2048, .max_seq_len = 512,
                                .rope_theta = 10000.0f, .norm_eps = 1e-6f, .tie_embeddings = 1, .bos_id = 1, .eos_id = 2};
    assert_cfg_equal(&cfg, &stories);
}

/* ---------- hand-written configs ---------- */

static char g_dir[256];

static int setup_dir(void **state) {
    (void)state;
    return test_tmpdir(g_dir, sizeof g_dir) ? 0 : -1;
}

static int remove_dir(void **state) {
    (void)state;
    DIR *d = opendir(g_dir);
    const struct dirent *e;
    char p[600];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
            unlink(p);
        }
    if (d) closedir(d);
    rmdir(g_dir);
    return 0;
}

static const char *write_config(const char *text) {
    static char path[400];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    assert_int_equal(test_write_file(path, text, strlen(text)), 0);
    return path;
}

#define BASE_FIELDS                                                                                     \
    "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
    "\"vocab_size\": 100, \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-05"

static void expect_error(const char *text, const char *needle) {
    qlm_llama_config cfg;
    const char *path = write_config(text);
    qlm_clear_error();
    if (qlm_hf_config_load(path, &cfg) == 0) fail_msg("accepted: %s", text);
    if (!strstr(qlm_last_error(), needle)) fail_msg("error \"%s\" does not mention \"%s\"", qlm_last_error(), needle);
    if (!strstr(qlm_last_error(), "config.json")) fail_msg("error \"%s\" does not name the file", qlm_last_error());
}

static void test_defaults_and_variants(void **state) {
    (void)state;
    char path_buf[400];
    qlm_llama_config cfg;
    load_ok(write_config("{\"model_type\": \"llama\", " BASE_FIELDS "}"), &cfg);
    qlm_llama_config want = {.arch = "llama", .dim = 64, .hidden_dim = 128, .n_layers = 2, .n_heads = 4,
                             .n_kv_heads = 4, .head_dim = 16, .vocab_size = 100, .max_seq_len = 256,
                             .rope_theta = 10000.0f, .norm_eps = 1e-5f, .bos_id = -1, .eos_id = -1};
    assert_cfg_equal(&cfg, &want);

    /* Architecture alone, null optional fields, eos as a list, attention/MLP bias on. */
    load_ok(write_config("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS
                         ", \"num_key_value_heads\": null, \"head_dim\": null, \"rope_scaling\": null,"
                         " \"eos_token_id\": [7, 8], \"bos_token_id\": null, \"attention_bias\": true,"
                         " \"mlp_bias\": true, \"pretraining_tp\": 1}"),
            &cfg);
    assert_int_equal(cfg.n_kv_heads, 4);
    assert_int_equal(cfg.head_dim, 16);
    assert_int_equal(cfg.eos_id, 7);
    assert_int_equal(cfg.bos_id, -1);
    assert_true(cfg.attn_bias && cfg.attn_out_bias && cfg.mlp_bias);

    /* Old-style llama3 rope_scaling with "type", default original_max_position_embeddings. */
    load_ok(write_config("{\"model_type\": \"llama\", " BASE_FIELDS ", \"rope_theta\": 500000.0, \"rope_scaling\":"
                         " {\"type\": \"llama3\", \"factor\": 32, \"low_freq_factor\": 1, \"high_freq_factor\": 4}}"),
            &cfg);
    assert_true(cfg.rope_theta == 500000.0f && cfg.rope_scale_factor == 32.0f && cfg.rope_high_freq_factor == 4.0f);
    assert_int_equal(cfg.rope_orig_max_pos, 256);

    /* Explicit default rope in the transformers 5 form. */
    load_ok(write_config("{\"model_type\": \"llama\", " BASE_FIELDS
                         ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1234.5}}"),
            &cfg);
    assert_true(cfg.rope_theta == 1234.5f && cfg.rope_scale_factor == 0);

    /* Mistral: every layer over the window (4096 when absent); null means none. No biases. */
    load_ok(write_config("{\"model_type\": \"mistral\", " BASE_FIELDS ", \"sliding_window\": 64, \"attention_bias\": true}"),
            &cfg);
    assert_string_equal(cfg.arch, "mistral");
    assert_int_equal(cfg.max_seq_len, 256);
    assert_int_equal(cfg.sliding_window, 64);
    assert_int_equal(cfg.window_first_layer, 0);
    assert_int_equal(cfg.attn_bias, 0);
    load_ok(write_config("{\"model_type\": \"mistral\", " BASE_FIELDS ", \"sliding_window\": null}"), &cfg);
    assert_int_equal(cfg.sliding_window, 0);
    load_ok(write_config("{\"model_type\": \"mistral\", " BASE_FIELDS "}"), &cfg);
    assert_int_equal(cfg.sliding_window, 4096);

    /* Qwen2: q/k/v bias regardless of attention_bias; the window only counts when enabled, from
     * max_window_layers (28 when absent: none of these two layers) on. */
    load_ok(write_config("{\"model_type\": \"qwen2\", " BASE_FIELDS ", \"sliding_window\": 32, \"use_sliding_window\": false}"),
            &cfg);
    assert_true(cfg.attn_bias && !cfg.attn_out_bias && !cfg.mlp_bias);
    assert_int_equal(cfg.sliding_window, 0);
    load_ok(write_config("{\"model_type\": \"qwen2\", " BASE_FIELDS ", \"sliding_window\": 32, \"use_sliding_window\": true}"),
            &cfg);
    assert_int_equal(cfg.sliding_window, 0);
    load_ok(write_config("{\"model_type\": \"qwen2\", " BASE_FIELDS ", \"sliding_window\": 32, \"use_sliding_window\": true,"
                         " \"max_window_layers\": 1}"),
            &cfg);
    assert_true(cfg.sliding_window == 32 && cfg.window_first_layer == 1 && qlm_layer_window(&cfg, 0) == 0 &&
                qlm_layer_window(&cfg, 1) == 32);
    /* An explicit layer_types list wins over max_window_layers. */
    load_ok(write_config("{\"model_type\": \"qwen3\", " BASE_FIELDS ", \"sliding_window\": 16, \"use_sliding_window\": true,"
                         " \"max_window_layers\": 2, \"layer_types\": [\"sliding_attention\", \"sliding_attention\"]}"),
            &cfg);
    assert_true(cfg.qk_norm && !cfg.attn_bias && cfg.sliding_window == 16 && cfg.window_first_layer == 0);

    /* Phi-3: no window unless configured; "su" and "yarn" are its names for longrope; written back as
     * the Mistral it equals once qkv_proj and gate_up_proj are split (loaders/fused_weights.c). */
    load_ok("tests/fixtures/llama/phi3_fused/config.json", &cfg);
    assert_true(strcmp(cfg.arch, "phi3") == 0 && cfg.sliding_window == 9 && cfg.window_first_layer == 0);
    snprintf(path_buf, sizeof path_buf, "%s/phi3_config.json", g_dir);
    assert_int_equal(qlm_hf_config_save(path_buf, &cfg, NULL), 0);
    char *saved = test_read_file(path_buf, NULL);
    assert_non_null(strstr(saved, "\"MistralForCausalLM\""));
    free(saved);
    load_ok(write_config("{\"model_type\": \"phi3\", " BASE_FIELDS "}"), &cfg);
    assert_int_equal(cfg.sliding_window, 0);
    /* longrope: both factor lists, the top-level original context, the attention factor from the
     * given factor (2: sqrt(1 + ln 2 / ln 8)); written back and read again unchanged. */
    load_ok("tests/fixtures/llama/phi3_longrope_long/config.json", &cfg);
    assert_true(cfg.rope_type == QLM_ROPE_LONGROPE && cfg.rope_orig_max_pos == 8 && cfg.rope_scale_factor == 2.0f);
    assert_true(cfg.rope_short_factor[7] == 5.5f && cfg.rope_long_factor[7] == 8.0f);
    assert_true(fabsf(cfg.rope_attn_factor - 1.1547005f) < 1e-6f);
    assert_int_equal(qlm_hf_config_save(path_buf, &cfg, NULL), 0);
    qlm_llama_config back;
    load_ok(path_buf, &back);
    assert_true(back.rope_type == QLM_ROPE_LONGROPE && back.rope_orig_max_pos == 8 &&
                back.rope_attn_factor == cfg.rope_attn_factor && back.rope_scale_factor == 2.0f);
    assert_memory_equal(back.rope_short_factor, cfg.rope_short_factor, 8 * sizeof(float));
    assert_memory_equal(back.rope_long_factor, cfg.rope_long_factor, 8 * sizeof(float));
    expect_error("{\"model_type\": \"phi3\", " BASE_FIELDS ", \"rope_scaling\": {\"type\": \"su\", \"short_factor\": [1]}}",
                 "short_factor must be a list of 8 numbers");

    /* hidden_act names; RoPE types. */
    load_ok(write_config("{\"model_type\": \"llama\", " BASE_FIELDS ", \"hidden_act\": \"gelu_new\","
                         " \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}"),
            &cfg);
    assert_true(cfg.act == QLM_ACT_GELU_TANH && cfg.rope_type == QLM_ROPE_LINEAR && cfg.rope_scale_factor == 2.0f);
    /* YaRN's attention factor from mscale / mscale_all_dim (DeepSeek's form): equal ones give 1. */
    load_ok(write_config("{\"model_type\": \"llama\", " BASE_FIELDS ", \"rope_scaling\": {\"rope_type\": \"yarn\","
                         " \"factor\": 4, \"mscale\": 0.707, \"mscale_all_dim\": 0.707}}"),
            &cfg);
    assert_true(cfg.rope_type == QLM_ROPE_YARN && cfg.rope_attn_factor == 1.0f && cfg.rope_beta_fast == 32.0f);
}


static void test_errors(void **state) {
    (void)state;
    static const struct { const char *text, *needle; } cases[] = {
        {"{\"model_type\": \"llama\", \"hidden_size\": \"64\", \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
         " \"num_attention_heads\": 4, \"vocab_size\": 100, \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-05}",
         "hidden_size"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4,"
         " \"vocab_size\": 100, \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-05}",
         "missing required field num_hidden_layers"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
         " \"num_attention_heads\": 4, \"vocab_size\": 100, \"max_position_embeddings\": 256}",
         "rms_norm_eps"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"tie_word_embeddings\": \"yes\"}", "tie_word_embeddings"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"tie_word_embeddings\": 1}", "tie_word_embeddings"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"head_dim\": 12.5}", "head_dim"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"num_key_value_heads\": 3}", "num_key_value_heads"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"num_key_value_heads\": 1e12}", "num_key_value_heads"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"rope_theta\": \"big\"}", "rope_theta"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"rope_theta\": -5}", "rope_theta"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 4}}",
         "short_factor must be a list of 8 numbers"},
        {"{\"model_type\": \"phi3\", " BASE_FIELDS ", \"rope_scaling\": {\"type\": \"su\", \"short_factor\": [1, 1, 1, 1,"
         " 1, 1, 1, 1], \"long_factor\": [1, 1, 1, 0, 1, 1, 1, 1]}}",
         "long_factor[3] must be a positive number"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": -2}}",
         "factor"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"low_freq_factor\": 1,"
         " \"high_freq_factor\": 4}}",
         "rope_scaling.factor"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8,"
         " \"low_freq_factor\": 4, \"high_freq_factor\": 1}}",
         "high_freq_factor"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"rope_parameters\": {\"rope_type\": 3}}", "rope_parameters.rope_type"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"rope_scaling\": 5}", "rope_scaling"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"partial_rotary_factor\": 0.5}", "partial_rotary_factor"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"rope_parameters\": {\"partial_rotary_factor\": 0.5}}",
         "partial_rotary_factor"},
        {"{\"model_type\": \"t5\", " BASE_FIELDS "}", "unsupported model"},
        {"{" BASE_FIELDS "}", "unsupported model"},
        {"{\"model_type\": 5, " BASE_FIELDS "}", "model_type"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"eos_token_id\": \"</s>\"}", "eos_token_id"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"bos_token_id\": -3}", "bos_token_id"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"attention_bias\": \"false\"}", "attention_bias"},
        {"{\"model_type\": \"mistral\", " BASE_FIELDS ", \"sliding_window\": \"4096\"}", "sliding_window"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"hidden_act\": \"tanh\"}", "hidden_act \"tanh\""},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 0.5}}",
         "dynamic RoPE needs a factor in [1, 1024]"},
        {"{\"model_type\": \"llama\", " BASE_FIELDS ", \"rope_scaling\": {\"rope_type\": \"linear\"}}", "factor"},
        {"{\"model_type\": \"qwen3\", " BASE_FIELDS ", \"use_sliding_window\": true, \"max_window_layers\": 0,"
         " \"layer_types\": [\"sliding_attention\", \"chunked_attention\"]}",
         "layer_types[1]"},
        {"{\"model_type\": \"gemma3_text\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 5,"
         " \"num_attention_heads\": 4, \"vocab_size\": 100, \"max_position_embeddings\": 256, \"layer_types\":"
         " [\"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"sliding_attention\"]}",
         "mix of full and sliding layers"},
        {"{\"model_type\": \"gemma2\", " BASE_FIELDS ", \"use_bidirectional_attention\": true}", "bidirectional"},
        {"{\"model_type\": \"qwen3\", " BASE_FIELDS ", \"use_sliding_window\": true, \"layer_types\": [\"full_attention\"]}",
         "one type per layer"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 0, \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
         " \"num_attention_heads\": 4, \"vocab_size\": 100, \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-05}",
         "hidden_size"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
         " \"num_attention_heads\": 0, \"vocab_size\": 100, \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-05}",
         "num_attention_heads"},
        {"[1, 2]", "not a JSON object"},
        {"{\"model_type\": \"llama\", ", "not valid JSON"},
        {"", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_error(cases[i].text, cases[i].needle);
    qlm_llama_config cfg;
    assert_int_equal(qlm_hf_config_load("tests/fixtures/no-such/config.json", &cfg), -1);
    assert_non_null(strstr(qlm_last_error(), "no-such/config.json"));
}

/* ---------- writing ---------- */

static void test_save_roundtrip(void **state) {
    (void)state;
    const char *export_dir = getenv("QLM_EXPORT_DIR");
    for (size_t i = 0; i < N_FIXTURES; i++) {
        char src[300], out_dir[600], path[700];
        snprintf(src, sizeof src, "tests/fixtures/llama/%s", FIXTURES[i].dir);
        if (export_dir && *export_dir) {
            snprintf(out_dir, sizeof out_dir, "%s/%s", export_dir, FIXTURES[i].dir);
            mkdir(export_dir, 0755);
            mkdir(out_dir, 0755);
        } else {
            snprintf(out_dir, sizeof out_dir, "%s", g_dir);
        }
        qlm_llama_config cfg, back;
        snprintf(path, sizeof path, "%s/config.json", src);
        load_ok(path, &cfg);
        snprintf(path, sizeof path, "%s/config.json", out_dir);
        if (qlm_hf_config_save(path, &cfg, NULL) != 0) fail_msg("%s", qlm_last_error());
        load_ok(path, &back);
        assert_cfg_equal(&back, &cfg);
        char *text = test_read_file(path, NULL);
        assert_non_null(text);
        assert_non_null(strstr(text, "\"torch_dtype\":\t\"float32\""));
        char want_class[64];
        snprintf(want_class, sizeof want_class, "\"%s\"", SAVED_CLASS[i]);
        assert_non_null(strstr(text, want_class));
        free(text);

        qlm_tensor_store *s = qlm_store_new();
        if (qlm_safetensors_load_dir(src, s) != 0) fail_msg("%s", qlm_last_error());
        snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
        static const char *const meta[] = {"format", "pt", NULL};
        assert_int_equal(qlm_safetensors_save(path, s, meta), 0);
        qlm_store_free(s);
    }

    /* Shortest float text, written as JSON floats. */
    qlm_llama_config cfg = FIXTURES[3].want;
    char path[400];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    assert_int_equal(qlm_hf_config_save(path, &cfg, NULL), 0);
    char *text = test_read_file(path, NULL);
    assert_non_null(strstr(text, "\"rms_norm_eps\":\t1e-05"));
    assert_non_null(strstr(text, "\"rope_theta\":\t500000.0"));
    assert_non_null(strstr(text, "\"rope_type\":\t\"llama3\""));
    free(text);

    /* Bias layouts no supported HF class has, and invalid numbers, are refused. */
    cfg = FIXTURES[0].want;
    cfg.attn_out_bias = 1;
    assert_int_equal(qlm_hf_config_save(path, &cfg, NULL), -1);
    cfg = FIXTURES[2].want;
    cfg.mlp_bias = 1;
    assert_int_equal(qlm_hf_config_save(path, &cfg, NULL), -1);
    cfg = FIXTURES[0].want;
    cfg.n_kv_heads = 3;
    assert_int_equal(qlm_hf_config_save(path, &cfg, NULL), -1);
    /* Mistral round-trips as Mistral. */
    cfg = FIXTURES[0].want;
    snprintf(cfg.arch, sizeof cfg.arch, "mistral");
    assert_int_equal(qlm_hf_config_save(path, &cfg, NULL), 0);
    qlm_llama_config back;
    load_ok(path, &back);
    assert_cfg_equal(&back, &cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_configs),
        cmocka_unit_test(test_asset_configs),
        cmocka_unit_test(test_defaults_and_variants),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_save_roundtrip),
    };
    return cmocka_run_group_tests(tests, setup_dir, remove_dir);
}
