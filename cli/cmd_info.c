/* qlm info: what a model file holds, and what this machine offers. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "../core/backend.h"
#include "../tokenizer/chat.h"
#include "../core/error.h"
#include "../loaders/gguf.h"
#include "../quant/matmul.h"
#include "commands.h"
#include "common.h"

static const char *k_usage =
    "usage: qlm info [MODEL] [-t TOKENIZER] [--tensors]\n"
    "Prints the architecture, tensors and tokenizer of MODEL (folder, .safetensors, .gguf, llama2.c .bin),\n"
    "and the compute devices. Without MODEL, only the devices.\n";

static void print_devices(void) {
    printf("cpu: %d threads, matmul kernels: %s (this CPU runs: %s; QLM_ISA picks one)\n", omp_get_max_threads(),
           qlm_matmul_isa(), qlm_matmul_isas());
    printf("  W8A8 (--w8a8): %s; OpenBLAS kernels (attention's products): %s\n",
           qlm_matmul_w8a8() ? "byte dot products" : "not on this CPU", openblas_get_corename());
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

int cmd_info(int argc, char **argv) {
    const char *tokenizer = NULL;
    int tensors = 0;
    static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'},
                                         {"tensors", no_argument, 0, 'T'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "t:h", opts, NULL)) != -1) {
        switch (c) {
        case 't': tokenizer = optarg; break;
        case 'T': tensors = 1; break;
        case 'h': fputs(k_usage, stdout); return 0;
        default: return cli_usage_error("info", k_usage);
        }
    }
    if (argc - optind > 1) return cli_usage_error("info", k_usage);
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
    return 0;
}
