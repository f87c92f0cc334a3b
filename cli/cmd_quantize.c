/* qlm quantize / qlm convert: load any supported model, convert its weights to a storage
 * dtype, and write a Hugging Face style folder (model.safetensors, config.json, tokenizer). */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "common.h"
#include "model_folder.h"

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
    int rc = cli_write_model_folder(&cm, out);
    cli_free_model(&cm);
    if (rc != 0) return cli_fail(cmd);
    fprintf(stderr, "qlm %s: done\n", cmd);
    return 0;
}

int cmd_quantize(int argc, char **argv) { return run(argc, argv, "quantize", k_quantize_usage, 1); }

int cmd_convert(int argc, char **argv) { return run(argc, argv, "convert", k_convert_usage, 0); }
