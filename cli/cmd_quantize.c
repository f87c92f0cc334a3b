/* qlm quantize / qlm convert: load any supported model, convert its weights to a storage
 * dtype, and write a Hugging Face style folder (model.safetensors, config.json, tokenizer). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/error.h"
#include "../loaders/hf_config.h"
#include "../loaders/safetensors.h"
#include "commands.h"
#include "common.h"

static const char *k_quantize_usage =
    "usage: qlm quantize IN OUT --dtype f32|bf16|f16|int8 [--per-channel]\n"
    "Writes the model IN (folder, .safetensors, .gguf or llama2.c .bin) to the folder OUT as safetensors with\n"
    "weights in the given dtype. INT8 is symmetric: q = round(w / s), s = max|w| / 127 per tensor, or per\n"
    "output channel with --per-channel; each INT8 tensor NAME is followed by an F32 tensor NAME_scale of shape\n"
    "[1] (per tensor) or [rows] (per channel). Norms and biases stay F32.\n";

static const char *k_convert_usage =
    "usage: qlm convert IN OUT [--dtype f32|bf16|f16|int8] [--per-channel]\n"
    "Turns a GGUF file or llama2.c checkpoint IN into a Hugging Face style folder OUT (model.safetensors,\n"
    "config.json, tokenizer.json, tokenizer_config.json) that qlm and transformers both load. Quantized GGUF\n"
    "tensors are dequantized; the default output dtype is f32.\n";

/* Copies a small file if it exists (tokenizer side files of HF folders). */
static int copy_if_exists(const char *src_dir, const char *dst_dir, const char *name) {
    char src[4200], dst[4200], tmp[4300];
    snprintf(src, sizeof src, "%s/%s", src_dir, name);
    snprintf(dst, sizeof dst, "%s/%s", dst_dir, name);
    FILE *in = fopen(src, "rb");
    if (!in) return 0;
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    FILE *out = fopen(tmp, "wb");
    if (!out) {
        fclose(in);
        return qlm_errorf("%s: %s", tmp, strerror(errno));
    }
    char buf[65536];
    size_t n;
    int rc = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) rc = qlm_errorf("%s: write failed", tmp);
    fclose(in);
    if (fclose(out) != 0 && rc == 0) rc = qlm_errorf("%s: write failed", tmp);
    if (rc == 0 && rename(tmp, dst) != 0) rc = qlm_errorf("%s: %s", dst, strerror(errno));
    if (rc) remove(tmp);
    return rc;
}

static int write_folder(cli_model *cm, const char *out_dir) {
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) return qlm_errorf("%s: %s", out_dir, strerror(errno));
    qlm_tensor_store *store = qlm_store_new();
    if (!store) return -1;
    char path[4200];
    char quant[64];
    int t5 = cm->src.is_t5;
    qlm_dtype dt = t5 ? cm->t5.dtype : cm->model.dtype;
    int per_channel = t5 ? cm->t5.per_channel : cm->model.per_channel;
    snprintf(quant, sizeof quant, "%s%s", qlm_dtype_name(dt), dt == QLM_I8 ? (per_channel ? "-per-channel" : "-per-tensor") : "");
    const char *meta[] = {"format", "pt", "qlm.dtype", quant, NULL};
    int rc = t5 ? qlm_t5_export(&cm->t5, store) : qlm_model_export(&cm->model, store);
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if (rc == 0) rc = qlm_safetensors_save(path, store, meta);
    qlm_store_free(store);
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    if (rc == 0) rc = t5 ? qlm_hf_t5_config_save(path, &cm->t5.cfg) : qlm_hf_config_save(path, &cm->model.cfg);
    if (rc != 0 || !cm->src.tok) return rc;
    if (cm->src.format == QLM_FMT_SAFETENSORS) {
        char src_dir[4096];
        struct stat st;
        snprintf(src_dir, sizeof src_dir, "%s", cm->src.path);
        if (stat(src_dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
            char *slash = strrchr(src_dir, '/');
            if (slash) *slash = 0;
            else snprintf(src_dir, sizeof src_dir, ".");
        }
        const char *files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                               "generation_config.json", "spiece.model"};
        for (size_t i = 0; i < sizeof files / sizeof files[0] && rc == 0; i++) rc = copy_if_exists(src_dir, out_dir, files[i]);
        return rc;
    }
    return qlm_tokenizer_save_json(cm->src.tok, out_dir);
}

static int run(int argc, char **argv, const char *cmd, const char *usage, int require_dtype) {
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    mo.device = "cpu";
    static const struct option opts[] = {{"dtype", required_argument, 0, OPT_DTYPE},
                                         {"per-channel", no_argument, 0, OPT_PER_CHANNEL},
                                         {"tokenizer", required_argument, 0, OPT_TOKENIZER},
                                         {"threads", required_argument, 0, OPT_THREADS},
                                         {"help", no_argument, 0, OPT_HELP},
                                         {0, 0, 0, 0}};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "t:h", opts, NULL)) != -1) {
        int r = cli_model_flag(&mo, c, optarg);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (c == OPT_HELP) {
            fputs(usage, stdout);
            return 0;
        }
        return cli_usage_error(cmd, usage);
    }
    if (argc - optind != 2) {
        fprintf(stderr, "qlm %s: need IN and OUT\n", cmd);
        return cli_usage_error(cmd, usage);
    }
    if (require_dtype && !mo.dtype) {
        fprintf(stderr, "qlm %s: --dtype is required\n", cmd);
        return cli_usage_error(cmd, usage);
    }
    if (!mo.dtype) mo.dtype = "f32";
    if (mo.per_channel && strcmp(mo.dtype, "int8") && strcmp(mo.dtype, "i8") && strcmp(mo.dtype, "q8")) {
        fprintf(stderr, "qlm %s: --per-channel only applies to --dtype int8\n", cmd);
        return 2;
    }
    mo.model = argv[optind];
    const char *out = argv[optind + 1];
    cli_model cm;
    if (cli_load_model(&mo, &cm, 0, 0) != 0) return cli_fail(cmd);
    qlm_dtype dt = cm.src.is_t5 ? cm.t5.dtype : cm.model.dtype;
    int pc = cm.src.is_t5 ? cm.t5.per_channel : cm.model.per_channel;
    fprintf(stderr, "qlm %s: writing %s (%s%s weights)\n", cmd, out, qlm_dtype_name(dt), pc ? ", per-channel scales" : "");
    int rc = write_folder(&cm, out);
    cli_free_model(&cm);
    if (rc != 0) return cli_fail(cmd);
    fprintf(stderr, "qlm %s: done\n", cmd);
    return 0;
}

int cmd_quantize(int argc, char **argv) { return run(argc, argv, "quantize", k_quantize_usage, 1); }

int cmd_convert(int argc, char **argv) { return run(argc, argv, "convert", k_convert_usage, 0); }
