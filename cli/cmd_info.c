/* qlm info: what a model file holds, and what this machine offers. */
#include <cblas.h>
#include <cjson/cJSON.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/backend.h"
#include "../tokenizer/chat.h"
#include "../core/error.h"
#include "../loaders/gguf.h"
#include "../loaders/hf_config.h"
#include "../quant/matmul.h"
#include "commands.h"
#include "common.h"

static const char *k_usage =
    "usage: qlm info [MODEL] [-t TOKENIZER] [--tensors] [--json]\n"
    "Prints the architecture, tensors and tokenizer of MODEL (folder, .safetensors, .gguf, llama2.c .bin),\n"
    "and the compute devices. Without MODEL, only the devices.\n"
    "--json: one JSON object on stdout instead: \"cpu\", \"cuda\" and, with MODEL, \"model\" (its path, format,\n"
    "the config.json qlm would write for it, tensor, parameter and byte counts, stored dtype, tokenizer;\n"
    "with --tensors each tensor's name, dtype and shape; \"weights\": how a run without flags loads them on the\n"
    "CPU, their dtype and bytes read where the model file is mapped, where the W8A8 panel cache is, and in\n"
    "memory of qlm's own).\n";

static void print_devices(void) {
    printf("cpu: %d threads, matmul kernels: %s (this CPU runs: %s; QLM_ISA picks one)\n", omp_get_max_threads(),
           qlm_matmul_isa(), qlm_matmul_isas());
    printf("  W8A8 for block weights: %s; OpenBLAS (training's backward products): kernels %s, threads %d\n",
           qlm_matmul_w8a8() ? "on by default (byte dot products; --no-w8a8 keeps 16-bit activations)"
                             : "off (these kernels have no byte dot products)",
           openblas_get_corename(), openblas_get_num_threads());
    const qlm_backend *cuda = qlm_backend_cuda();
    char line[256];
    if (cuda) cuda->describe(line, sizeof line);
    printf("%s%s\n", cuda ? "" : "cuda: ", cuda ? line : qlm_last_error());
}

static void print_config(const qlm_llama_config *c) {
    printf("architecture: %s\n", c->arch[0] ? c->arch : "llama");
    printf("  hidden %d, intermediate %d, layers %d, heads %d, kv heads %d, head dim %d\n", c->dim, c->hidden_dim,
           c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim);
    printf("  vocab %d, context %d, rope theta %g, rms eps %g, tied embeddings %s, qkv bias %s\n", c->vocab_size,
           c->max_seq_len, c->rope_theta, c->norm_eps, c->tie_embeddings ? "yes" : "no", c->attn_bias ? "yes" : "no");
    static const char *const acts[] = {[QLM_ACT_SILU] = "silu", [QLM_ACT_GELU_TANH] = "gelu (tanh)",
                                       [QLM_ACT_RELU] = "relu", [QLM_ACT_GELU] = "gelu"};
    printf("  activation %s, q/k norm %s\n", acts[c->act], c->qk_norm ? "yes" : "no");
    if (c->rope_type == QLM_ROPE_LINEAR)
        printf("  rope scaling linear: factor %g\n", c->rope_scale_factor);
    if (c->rope_type == QLM_ROPE_LLAMA3)
        printf("  rope scaling llama3: factor %g, low %g, high %g, original context %d\n", c->rope_scale_factor,
               c->rope_low_freq_factor, c->rope_high_freq_factor, c->rope_orig_max_pos);
    if (c->rope_type == QLM_ROPE_YARN)
        printf("  rope scaling yarn: factor %g, beta fast %g, slow %g, attention factor %g, original context %d\n",
               c->rope_scale_factor, c->rope_beta_fast, c->rope_beta_slow, c->rope_attn_factor, c->rope_orig_max_pos);
    if (c->rope_type == QLM_ROPE_DYNAMIC)
        printf("  rope scaling dynamic NTK: factor %g, the base stretched for calls past %d positions\n",
               c->rope_scale_factor, c->rope_orig_max_pos);
    if (c->sliding_window)
        printf("  sliding window %d tokens, layers %d..%d\n", c->sliding_window, c->window_first_layer, c->n_layers - 1);
}

static void print_t5_config(const qlm_t5_config *c) {
    printf("architecture: t5 (encoder-decoder)\n");
    printf("  d_model %d, d_ff %d, d_kv %d, heads %d, encoder layers %d, decoder layers %d\n", c->d_model, c->d_ff,
           c->d_kv, c->n_heads, c->n_layers, c->n_dec_layers);
    printf("  vocab %d, feed-forward %s, relative buckets %d up to distance %d, eps %g, tied head %s\n", c->vocab_size,
           !c->gated ? "relu" : c->act == QLM_ACT_SILU ? "gated-silu" : "gated-gelu", c->rel_buckets,
           c->rel_max_distance, c->norm_eps, c->tie_embeddings ? "yes (scaled)" : "no");
    printf("  decoder start %d, eos %d, pad %d\n", c->decoder_start_id, c->eos_id, c->pad_id);
}

static void print_gguf_metadata(const char *path) {
    qlm_gguf *g = qlm_gguf_open(path);
    if (!g) return;
    printf("gguf metadata (%d keys):\n", qlm_gguf_n_kv(g));
    for (int i = 0; i < qlm_gguf_n_kv(g); i++) {
        const char *key;
        char value[160];
        if (qlm_gguf_kv_describe(g, i, &key, value, sizeof value) == 0) printf("  %-40s %s\n", key, value);
    }
    int counts[64] = {0};
    const char *names[64] = {0};
    int n_types = 0;
    for (int i = 0; i < qlm_gguf_n_tensors(g); i++) {
        const char *name, *type;
        int nd;
        long long dims[4];
        if (qlm_gguf_tensor_describe(g, i, &name, &type, &nd, dims) != 0) continue;
        int j = 0;
        while (j < n_types && strcmp(names[j], type)) j++;
        if (j == n_types && n_types < 64) names[n_types++] = type;
        if (j < 64) counts[j]++;
    }
    printf("gguf tensor types:");
    for (int j = 0; j < n_types; j++) printf(" %s x%d", names[j], counts[j]);
    printf("\n");
    qlm_gguf_close(g);
}

/* ---- --json ---- */

static cJSON *devices_json(cJSON *root) {
    cJSON *cpu = cJSON_AddObjectToObject(root, "cpu"), *cuda = cJSON_AddObjectToObject(root, "cuda");
    if (!cpu || !cuda || !cJSON_AddNumberToObject(cpu, "threads", omp_get_max_threads()) ||
        !cJSON_AddStringToObject(cpu, "kernels", qlm_matmul_isa()) ||
        !cJSON_AddStringToObject(cpu, "kernel_sets", qlm_matmul_isas()) ||
        !cJSON_AddBoolToObject(cpu, "w8a8", qlm_matmul_w8a8()) ||
        !cJSON_AddStringToObject(cpu, "openblas_core", openblas_get_corename()) ||
        !cJSON_AddNumberToObject(cpu, "openblas_threads", openblas_get_num_threads()))
        return NULL;
    const qlm_backend *be = qlm_backend_cuda();
    char line[256];
    if (be) be->describe(line, sizeof line);
    if (!cJSON_AddBoolToObject(cuda, "available", be != NULL) ||
        !cJSON_AddStringToObject(cuda, be ? "description" : "reason", be ? line : qlm_last_error()))
        return NULL;
    return root;
}

static cJSON *tensor_json(const qlm_tensor_entry *e) {
    cJSON *t = cJSON_CreateObject(), *shape = t ? cJSON_AddArrayToObject(t, "shape") : NULL;
    int ok = shape && cJSON_AddStringToObject(t, "name", e->name) &&
             cJSON_AddStringToObject(t, "dtype", qlm_dtype_name(e->dtype));
    for (int d = 0; ok && d < e->ndim; d++) ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->shape[d]));
    if (ok && qlm_dtype_is_block(e->dtype)) ok = cJSON_AddNumberToObject(t, "group", e->group) != NULL;
    if (ok && e->dtype == QLM_I8) ok = cJSON_AddBoolToObject(t, "per_channel", e->row_scales != NULL) != NULL;
    if (!ok) cJSON_Delete(t);
    return ok ? t : NULL;
}

static cJSON *tokenizer_json(const qlm_tokenizer *tok) {
    if (!tok) return cJSON_CreateNull();
    cJSON *t = cJSON_CreateObject();
    int bos = qlm_tokenizer_bos(tok), eos = qlm_tokenizer_eos(tok);
    char tmpl[640];
    int ok = t && cJSON_AddNumberToObject(t, "tokens", qlm_tokenizer_vocab_size(tok)) &&
             cJSON_AddNumberToObject(t, "bos_id", bos) && cJSON_AddNumberToObject(t, "eos_id", eos) &&
             cJSON_AddStringToObject(t, "chat_template",
                                     qlm_chat_template_describe(qlm_tokenizer_chat_template(tok), tmpl, sizeof tmpl));
    if (!ok) cJSON_Delete(t);
    return ok ? t : NULL;
}

/* The weights as a run without flags loads them on the CPU (the panel cache read and, when it
 * has none yet for a large model, written, as that run would). */
typedef struct {
    char desc[64]; /* dtype, "per-channel", "w8a8" */
    size_t file, cache, owned; /* cli_weight_bytes */
} loaded_weights;

static int load_weights(const char *path, const char *tokenizer, loaded_weights *lw) {
    cli_model_opts o;
    cli_model_opts_init(&o);
    o.model = path;
    o.tokenizer = tokenizer;
    o.device = "cpu";
    cli_model cm;
    if (cli_load_model(&o, &cm, 0, 1) != 0) return -1;
    cli_format_words(cli_model_format(&cm), lw->desc, sizeof lw->desc);
    cli_weight_bytes(&cm, &lw->file, &lw->cache, &lw->owned);
    cli_free_model(&cm);
    return 0;
}

static cJSON *weights_json(const loaded_weights *lw) {
    cJSON *w = cJSON_CreateObject();
    if (w && cJSON_AddStringToObject(w, "loads_as", lw->desc) &&
        cJSON_AddNumberToObject(w, "file_mapped_bytes", (double)lw->file) &&
        cJSON_AddNumberToObject(w, "panel_cache_mapped_bytes", (double)lw->cache) &&
        cJSON_AddNumberToObject(w, "owned_bytes", (double)lw->owned))
        return w;
    cJSON_Delete(w);
    return NULL;
}

/* "model": the config.json qlm would write for it, so every field has transformers' name. */
static cJSON *model_json(const qlm_source *src, const char *path, int tensors) {
    cJSON *m = cJSON_CreateObject(), *list = NULL;
    qlm_hf_storage st = {.dtype = src->stored_dtype, .per_channel = src->stored_per_channel};
    cJSON *config = src->is_t5 ? qlm_hf_t5_config_json(&src->t5, &st, path) : qlm_hf_config_json(&src->cfg, &st, path);
    int ok = m && config && cJSON_AddStringToObject(m, "path", path) &&
             cJSON_AddStringToObject(m, "format", qlm_format_name(src->format)) &&
             cJSON_AddItemToObject(m, "config", config);
    if (!ok) cJSON_Delete(config);
    int64_t params = 0;
    double bytes = 0;
    if (ok && tensors) ok = (list = cJSON_AddArrayToObject(m, "tensors")) != NULL;
    for (int i = 0; ok && i < qlm_store_count(src->store); i++) {
        const qlm_tensor_entry *e = qlm_store_at(src->store, i);
        params += qlm_entry_numel(e);
        bytes += (double)e->nbytes;
        if (list) ok = cJSON_AddItemToArray(list, tensor_json(e));
    }
    ok = ok && cJSON_AddNumberToObject(m, "tensor_count", qlm_store_count(src->store)) &&
         cJSON_AddNumberToObject(m, "parameters", (double)params) && cJSON_AddNumberToObject(m, "bytes", bytes) &&
         cJSON_AddStringToObject(m, "dtype", qlm_dtype_name(src->stored_dtype)) &&
         cJSON_AddBoolToObject(m, "per_channel", src->stored_per_channel);
    cJSON *tok = ok ? tokenizer_json(src->tok) : NULL;
    if (tok && !cJSON_AddItemToObject(m, "tokenizer", tok)) cJSON_Delete(tok), tok = NULL;
    if (!ok || !tok) {
        cJSON_Delete(m);
        if (config) qlm_errorf("out of memory describing %s", path);
        return NULL;
    }
    return m;
}

static int print_json(const char *path, const char *tokenizer, int tensors) {
    cJSON *root = cJSON_CreateObject();
    int rc = root && devices_json(root) ? 0 : qlm_errorf("out of memory");
    qlm_source src;
    if (rc == 0 && path && qlm_source_open(&src, path, tokenizer) != 0) rc = -1;
    else if (rc == 0 && path) {
        cJSON *m = model_json(&src, path, tensors);
        qlm_source_close(&src);
        loaded_weights lw;
        cJSON *w = m && load_weights(path, tokenizer, &lw) == 0 ? weights_json(&lw) : NULL;
        if (w && !cJSON_AddItemToObject(m, "weights", w)) cJSON_Delete(w), w = NULL;
        if (!w || !cJSON_AddItemToObject(root, "model", m)) {
            cJSON_Delete(m);
            rc = -1;
        }
    }
    char *text = rc == 0 ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (rc == 0 && !text) rc = qlm_errorf("out of memory");
    if (text) puts(text);
    free(text);
    return rc == 0 ? 0 : cli_fail("info");
}

int cmd_info(int argc, char **argv) {
    const char *tokenizer = NULL;
    int tensors = 0, json = 0;
    static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'},
                                         {"tensors", no_argument, 0, 'T'},
                                         {"json", no_argument, 0, 'J'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "t:h", opts, NULL)) != -1) {
        switch (c) {
        case 't': tokenizer = optarg; break;
        case 'T': tensors = 1; break;
        case 'J': json = 1; break;
        case 'h': fputs(k_usage, stdout); return 0;
        default: return cli_usage_error("info", k_usage);
        }
    }
    if (argc - optind > 1) return cli_usage_error("info", k_usage);
    if (json) return print_json(optind < argc ? argv[optind] : NULL, tokenizer, tensors);
    print_devices();
    if (optind == argc) return 0;
    const char *path = argv[optind];
    qlm_source src;
    if (qlm_source_open(&src, path, tokenizer) != 0) return cli_fail("info");
    printf("model: %s (%s)\n", path, qlm_format_name(src.format));
    if (src.is_t5)
        print_t5_config(&src.t5);
    else
        print_config(&src.cfg);
    int64_t params = 0;
    size_t bytes = 0;
    for (int i = 0; i < qlm_store_count(src.store); i++) {
        const qlm_tensor_entry *e = qlm_store_at(src.store, i);
        params += qlm_entry_numel(e);
        bytes += e->nbytes;
        if (tensors) {
            printf("  %-52s %-5s [", e->name, qlm_dtype_name(e->dtype));
            for (int d = 0; d < e->ndim; d++) printf("%s%lld", d ? ", " : "", (long long)e->shape[d]);
            if (qlm_dtype_is_block(e->dtype)) printf("] blocks of %d\n", e->group);
            else printf("]%s\n", e->dtype == QLM_I8 ? (e->row_scales ? " per-channel scales" : " per-tensor scale") : "");
        }
    }
    printf("tensors: %d, parameters: %.2fM, %.1f MiB as loaded (%s%s)\n", qlm_store_count(src.store), params / 1e6,
           bytes / 1048576.0, qlm_dtype_name(src.stored_dtype), src.stored_per_channel ? " per-channel" : "");
    if (src.format == QLM_FMT_GGUF) print_gguf_metadata(path);
    if (src.tok) {
        int bos = qlm_tokenizer_bos(src.tok), eos = qlm_tokenizer_eos(src.tok);
        char tmpl[640];
        printf("tokenizer: %d tokens, bos %d %s, eos %d %s, chat template: %s\n", qlm_tokenizer_vocab_size(src.tok), bos,
               bos >= 0 ? qlm_tokenizer_token(src.tok, bos) : "-", eos, eos >= 0 ? qlm_tokenizer_token(src.tok, eos) : "-",
               qlm_chat_template_describe(qlm_tokenizer_chat_template(src.tok), tmpl, sizeof tmpl));
    } else {
        printf("tokenizer: none found\n");
    }
    qlm_source_close(&src);
    loaded_weights lw;
    if (load_weights(path, tokenizer, &lw) != 0) return cli_fail("info");
    printf("weights as a run without flags loads them: %s, %.1f MiB read where the model file is mapped, %.1f MiB from "
           "the panel cache's mapping, %.1f MiB in memory of qlm's own\n",
           lw.desc, lw.file / 1048576.0, lw.cache / 1048576.0, lw.owned / 1048576.0);
    return 0;
}
