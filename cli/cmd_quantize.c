/* qlm quantize / qlm convert: load any supported model, convert its weights to a storage
 * dtype, and write a Hugging Face style folder (model.safetensors, config.json, tokenizer). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/clock.h"
#include "../core/error.h"
#include "../models/param_pack.h"
#include "../loaders/safetensors.h"
#include "../quant/fake_quant.h"

#include "commands.h"
#include "common.h"
#include "model_folder.h"
#include "../quant/block_quant.h"

static const char *k_quantize_usage =
    "usage: qlm quantize IN OUT --dtype f32|bf16|f16|int8|q8_0|q4_0|int4|q4_1 [--per-channel] [--group N]\n"
    "                    [--random-weights] [--json]\n"
    "       qlm quantize --from-qat IN OUT [--json]\n"
    "Writes the model IN (folder, .safetensors, .gguf or llama2.c .bin) to the folder OUT as safetensors with\n"
    "weights in the given dtype. INT8 is symmetric: q = round(w / s), s = max|w| / 127 per tensor, or per\n"
    "output channel with --per-channel, or per --group of weights along each row (int8 --group N is q8_0\n"
    "with blocks of N); each INT8 tensor NAME is followed by an F32 tensor NAME_scale of shape\n"
    "[1] (per tensor) or [rows] (per channel). The block types q8_0, q4_0 (int4) and q4_1 keep one F16 scale\n"
    "(q4_1: and offset) per --group of 32 (default), 64 or 128 weights along each row, stored as U8\n"
    "[rows, bytes] tensors that __metadata__ qlm.blocks.NAME describes. Norms and biases stay F32.\n"
    "--from-qat: IN is the model/ folder of `qlm train --qat`; its INT8 weights use the learned scales of\n"
    "IN/qat_scales.safetensors (per tensor or per channel, as trained) instead of max|w| / 127.\n"
    "--random-weights: IN is a folder with a config.json (and tokenizer files); OUT gets qlm's deterministic\n"
    "random weights of that shape (the same bytes every run), a model of a size to measure without its weights.\n"
    "--json: when done, one JSON object on stdout (out, dtype, group or per_channel, parameters, bytes of\n"
    "model.safetensors, seconds).\n";

static const char *k_convert_usage =
    "usage: qlm convert IN OUT [--dtype f32|bf16|f16|int8|q8_0|q4_0|int4|q4_1] [--per-channel] [--group N] [--json]\n"
    "Turns a GGUF file or llama2.c checkpoint IN into a Hugging Face style folder OUT (model.safetensors,\n"
    "config.json, tokenizer.json, tokenizer_config.json) that qlm and transformers both load. Quantized GGUF\n"
    "tensors are dequantized; the default output dtype is f32. --json: as for quantize.\n";

enum { OPT_FROM_QAT = 1300 };

/* What --json prints when the folder is written. */
static int print_result(const cli_model *cm, const char *out, double seconds) {
    int t5 = cm->src.is_t5;
    const qlm_weight_format *f = cli_model_format(cm);
    char file[4200];
    snprintf(file, sizeof file, "%s/model.safetensors", out);
    struct stat st;
    cJSON *j = cJSON_CreateObject();
    int ok = j && stat(file, &st) == 0 && cJSON_AddStringToObject(j, "out", out) &&
             cJSON_AddStringToObject(j, "dtype", qlm_dtype_name(f->dtype)) &&
             (qlm_dtype_is_block(f->dtype) ? cJSON_AddNumberToObject(j, "group", f->group) != NULL
                                           : cJSON_AddBoolToObject(j, "per_channel", f->per_channel) != NULL) &&
             cJSON_AddNumberToObject(j, "parameters",
                                     (double)(t5 ? qlm_t5_param_count(&cm->t5) : qlm_model_param_count(&cm->model))) &&
             cJSON_AddNumberToObject(j, "bytes", (double)st.st_size) && cJSON_AddNumberToObject(j, "seconds", seconds);
    char *text = ok ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!text) return qlm_errorf("%s: cannot describe the result", file);
    puts(text);
    free(text);
    return 0;
}

/* How a QAT run's scales are laid out (qat_scales.safetensors' metadata): bits 8 or 4, and for
 * INT4 the group. */
typedef struct {
    int bits, group;
} qat_format;

/* One weight quantized with its learned scale(s) into store: INT8 per tensor or row, or Q4_0
 * blocks with one scale per group. */
static int add_qat_weight(qlm_tensor_store *store, const qlm_tensor_store *scales, const char *dir, const qlm_param *p,
                          const qat_format *fmt, int *per_row) {
    char name[200];
    snprintf(name, sizeof name, "%s.qat_scale", p->name);
    const qlm_tensor_entry *s = qlm_store_find(scales, name);
    if (!s) return qlm_errorf("%s/qat_scales.safetensors: no scale for %s", dir, p->name);
    int64_t n = qlm_entry_numel(s), groups = fmt->group ? p->rows * (p->cols / fmt->group) : 0;
    if (fmt->group ? s->dtype != QLM_F32 || p->cols % fmt->group || n != groups
                   : s->dtype != QLM_F32 || (n != 1 && n != p->rows))
        return qlm_errorf("%s/qat_scales.safetensors: %s must be F32 with %lld values", dir, name,
                          (long long)(fmt->group ? groups : p->rows));
    const float *sv = s->data;
    for (int64_t i = 0; i < n; i++)
        if (!(sv[i] > 0) || !isfinite(sv[i])) return qlm_errorf("%s/qat_scales.safetensors: %s is not positive", dir, name);
    *per_row = n != 1;
    int64_t shape[2] = {p->rows, p->cols};
    void *q;
    if (fmt->bits == 4) {
        int8_t *v = malloc((size_t)(p->rows * p->cols));
        qlm_tensor_entry *e = v ? qlm_store_add_owned_blocks(store, p->name, QLM_Q4_0, fmt->group, p->rows, p->cols, &q)
                                : NULL;
        if (e) {
            /* The forward's values: q = clamp(round(w / s)) per group, as QAT trained them. */
            qlm_fake_quant_to_int8(v, p->matrix->data, (int)groups, fmt->group, sv, 1, -8, 7);
            size_t row_bytes = qlm_dtype_row_bytes(QLM_Q4_0, (long)p->cols, fmt->group);
            for (int64_t r = 0; r < p->rows; r++)
                qlm_block_pack_q4_0((char *)q + r * row_bytes, v + r * p->cols, sv + r * (p->cols / fmt->group),
                                    fmt->group, (long)p->cols);
        }
        free(v);
        return e ? 0 : v ? -1 : qlm_errorf("out of memory");
    }
    qlm_tensor_entry *e = qlm_store_add_owned(store, p->name, QLM_I8, 2, shape, &q);
    if (!e) return -1;
    qlm_fake_quant_to_int8(q, p->matrix->data, (int)p->rows, (int)p->cols, sv, *per_row, -127, 127);
    if (*per_row) {
        float *rs = malloc((size_t)n * sizeof *rs);
        if (!rs || qlm_store_keep_buffer(store, rs) != 0) {
            free(rs);
            return qlm_errorf("out of memory");
        }
        memcpy(rs, sv, (size_t)n * sizeof *rs);
        e->row_scales = rs;
    } else {
        e->scale = sv[0];
    }
    return 0;
}

/* The scales' layout from the file's metadata (files without it are INT8, as before INT4 QAT). */
static int read_qat_format(const char *path, qat_format *fmt) {
    char v[32];
    *fmt = (qat_format){8, 0};
    int rc = qlm_safetensors_metadata(path, "qlm.qat.bits", v, sizeof v);
    if (rc < 0) return -1;
    if (rc == 0) return 0;
    fmt->bits = atoi(v);
    if (qlm_safetensors_metadata(path, "qlm.qat.group", v, sizeof v) == 1) fmt->group = atoi(v);
    if (fmt->bits == 8 && fmt->group == 0) return 0;
    if (fmt->bits == 4 && qlm_group_valid(fmt->group)) return 0;
    return qlm_errorf("%s: qlm.qat.bits %d with qlm.qat.group %d is not a QAT layout qlm writes", path, fmt->bits,
                      fmt->group);
}

/* Replaces the F32 latent weights of a QAT model by INT8 (or Q4_0) with the learned scales. */
static int apply_qat_scales(cli_model *cm, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/qat_scales.safetensors", dir);
    int t5 = cm->src.is_t5;
    if (cli_model_format(cm)->dtype != QLM_F32)
        return qlm_errorf("%s: a QAT model folder holds F32 latent weights", dir);
    qlm_tensor_store *scales = qlm_store_new(), *store = qlm_store_new();
    qlm_param *p = NULL;
    qat_format fmt;
    int n = -1, rc = scales && store ? qlm_safetensors_load(path, scales) : qlm_errorf("out of memory");
    if (rc == 0) rc = read_qat_format(path, &fmt);
    if (rc == 0) n = t5 ? qlm_t5_param_list(&cm->t5, &p) : qlm_model_param_list(&cm->model, &p), rc = n < 0 ? -1 : 0;
    int per_row = 0, any_per_row = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (p[i].matrix) {
            rc = add_qat_weight(store, scales, dir, &p[i], &fmt, &per_row);
            any_per_row |= per_row;
        } else {
            int64_t shape[2] = {p[i].rows, p[i].cols}, count = p[i].rows * (p[i].cols ? p[i].cols : 1);
            rc = qlm_store_add(store, p[i].name, QLM_F32, p[i].cols ? 2 : 1, shape, *p[i].vector,
                               (size_t)count * sizeof(float)) ? 0 : -1;
        }
    }
    qlm_model_options mo = {.dtype = rc == 0 && fmt.bits == 4 ? QLM_Q4_0 : QLM_I8, .per_channel = any_per_row,
                            .group = rc == 0 ? fmt.group : 0, .backend = qlm_backend_cpu()};
    if (rc == 0 && t5) {
        qlm_t5_model q;
        if ((rc = qlm_t5_build(&q, &cm->t5.cfg, store, &mo)) == 0) qlm_t5_free(&cm->t5), cm->t5 = q;
    } else if (rc == 0) {
        qlm_model q;
        if ((rc = qlm_model_build(&q, &cm->model.cfg, store, &mo)) == 0) qlm_model_free(&cm->model), cm->model = q;
    }
    free(p);
    qlm_store_free(scales);
    qlm_store_free(store);
    return rc;
}

static int run(int argc, char **argv, const char *cmd, const char *usage, int require_dtype) {
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    mo.device = "cpu";
    mo.act8 = 0; /* the weights are written, not run */
    static const struct option opts[] = {{"dtype", required_argument, 0, OPT_DTYPE},
                                         {"per-channel", no_argument, 0, OPT_PER_CHANNEL},
                                         {"group", required_argument, 0, OPT_GROUP},
                                         {"tokenizer", required_argument, 0, OPT_TOKENIZER},
                                         {"threads", required_argument, 0, OPT_THREADS},
                                         {"from-qat", no_argument, 0, OPT_FROM_QAT},
                                         {"random-weights", no_argument, 0, OPT_RANDOM_WEIGHTS},
                                         {"json", no_argument, 0, OPT_JSON},
                                         {"help", no_argument, 0, OPT_HELP},
                                         {0, 0, 0, 0}};
    optind = 1;
    int c, from_qat = 0, json = 0;
    double t0 = qlm_now_s();
    while ((c = getopt_long(argc, argv, "t:h", opts, NULL)) != -1) {
        if (c == OPT_FROM_QAT && require_dtype) {
            from_qat = 1;
            continue;
        }
        /* convert reads weights that exist; only quantize makes a model from a config alone. */
        if (c == OPT_RANDOM_WEIGHTS && !require_dtype) return cli_usage_error(cmd, usage);
        if (c == OPT_JSON) {
            json = 1;
            continue;
        }
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
    if (from_qat && mo.dtype) {
        fprintf(stderr, "qlm %s: --from-qat writes INT8 with the learned scales; leave out --dtype\n", cmd);
        return 2;
    }
    if (from_qat && mo.random_weights) {
        fprintf(stderr, "qlm %s: --from-qat reads trained weights and scales; leave out --random-weights\n", cmd);
        return 2;
    }
    if (from_qat) mo.dtype = "f32";
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
    if (from_qat && apply_qat_scales(&cm, mo.model) != 0) {
        cli_free_model(&cm);
        return cli_fail(cmd);
    }
    const qlm_weight_format *f = cli_model_format(&cm);
    char what[48] = "";
    if (qlm_dtype_is_block(f->dtype)) snprintf(what, sizeof what, ", groups of %d", f->group);
    else if (f->per_channel) snprintf(what, sizeof what, ", per-channel scales");
    fprintf(stderr, "qlm %s: writing %s (%s%s weights)\n", cmd, out, qlm_dtype_name(f->dtype), what);
    int rc = cli_write_model_folder(&cm, out);
    if (rc == 0 && json) rc = print_result(&cm, out, qlm_now_s() - t0);
    cli_free_model(&cm);
    if (rc != 0) return cli_fail(cmd);
    fprintf(stderr, "qlm %s: done\n", cmd);
    return 0;
}

int cmd_quantize(int argc, char **argv) { return run(argc, argv, "quantize", k_quantize_usage, 1); }

int cmd_convert(int argc, char **argv) { return run(argc, argv, "convert", k_convert_usage, 0); }
