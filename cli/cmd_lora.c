/* qlm lora info: what a PEFT LoRA adapter holds. qlm lora merge: a model with an adapter folded
 * into its weights, written as a model folder. qlm lora init: a new adapter for a model, as peft
 * initializes one. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../lora/lora.h"
#include "commands.h"
#include "common.h"
#include "model_folder.h"

static const char *k_usage =
    "usage: qlm lora info PATH [--json]\n"
    "       qlm lora merge -m MODEL --lora PATH -o OUT [--dtype f32|bf16|f16] [--threads N]\n"
    "       qlm lora init -m MODEL -o OUT --rank R [--alpha A] [--targets LIST] [--rslora] [--seed S]\n"
    "PATH is a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors).\n"
    "info prints its rank, alpha, rsLoRA, targets, module and parameter counts and size (--json: as JSON).\n"
    "merge loads MODEL (in --dtype, default as stored), checks the adapter against it, adds scale*B*A to\n"
    "each adapted weight, and writes the merged model to the folder OUT as `qlm quantize` does. INT8 models\n"
    "cannot be merged into: give --dtype f32, bf16 or f16, and quantize the merged model afterwards.\n";

enum { OPT_OUT = 'o' };

static void scale_range(const qlm_lora_adapter *a, float *lo, float *hi) {
    *lo = *hi = a->stored[0].scale;
    for (int i = 1; i < a->n_stored; i++) {
        if (a->stored[i].scale < *lo) *lo = a->stored[i].scale;
        if (a->stored[i].scale > *hi) *hi = a->stored[i].scale;
    }
}

/* Which targets have at least one module, in target order. */
static int present_targets(const qlm_lora_adapter *a, qlm_lora_target *out) {
    int seen[QLM_LORA_N_TARGETS] = {0}, n = 0;
    for (int i = 0; i < a->n_stored; i++) seen[a->stored[i].target] = 1;
    for (int t = 0; t < QLM_LORA_N_TARGETS; t++)
        if (seen[t]) out[n++] = (qlm_lora_target)t;
    return n;
}

static void print_patterns(const qlm_lora_pattern *p, int n) {
    if (!n) return;
    printf(" (");
    for (int i = 0; i < n; i++) printf("%s%s=%g", i ? ", " : "", p[i].key, p[i].value);
    printf(")");
}

/* Which layers of a stack have at least one module: used[l] for l < a->n_layers[stack]. */
static void adapted_layers(const qlm_lora_adapter *a, int stack, char *used) {
    memset(used, 0, (size_t)a->n_layers[stack]);
    for (int i = 0; i < a->n_stored; i++)
        if (a->stored[i].stack == stack) used[a->stored[i].layer] = 1;
}

/* "0-3, 5" */
static void print_layers(const qlm_lora_adapter *a, int stack) {
    char *used = malloc((size_t)a->n_layers[stack] + 1);
    if (!used) return;
    adapted_layers(a, stack, used);
    const char *sep = "";
    for (int l = 0; l < a->n_layers[stack]; l++) {
        if (!used[l]) continue;
        int end = l;
        while (end + 1 < a->n_layers[stack] && used[end + 1]) end++;
        printf("%s%d", sep, l);
        if (end > l) printf("-%d", end);
        sep = ", ";
        l = end;
    }
    if (!*sep) printf("none");
    free(used);
}

static void print_text(const qlm_lora_adapter *a) {
    const qlm_lora_config *c = &a->cfg;
    printf("adapter         %s\n", a->path);
    if (a->is_t5) {
        const char *ffn = a->t5_gated < 0 ? "" : a->t5_gated ? " (gated feed-forward)" : " (ungated feed-forward)";
        printf("base            t5%s\nlayers          encoder blocks ", ffn);
        print_layers(a, 0);
        printf("; decoder blocks ");
        print_layers(a, 1);
    } else {
        printf("base            llama family\nlayers          ");
        print_layers(a, 0);
    }
    printf("\n");
    printf("rank            %d", c->r);
    print_patterns(c->rank_pattern, c->n_rank_pattern);
    printf("\nalpha           %g", c->lora_alpha);
    print_patterns(c->alpha_pattern, c->n_alpha_pattern);
    float lo, hi;
    scale_range(a, &lo, &hi);
    printf("\nrsLoRA          %s\n", c->use_rslora ? "yes (scale = alpha / sqrt(r))" : "no (scale = alpha / r)");
    if (lo == hi) printf("scale           %g\n", lo);
    else printf("scale           %g to %g\n", lo, hi);
    printf("target_modules  ");
    if (c->target_modules.regex) printf("%s\n", c->target_modules.regex);
    else if (!c->target_modules.is_list) printf("(peft's default for the architecture)\n");
    else if (c->target_modules.n_names == 0) printf("[]\n");
    for (int i = 0; i < c->target_modules.n_names; i++)
        printf("%s%s", c->target_modules.names[i], i + 1 < c->target_modules.n_names ? ", " : "\n");
    qlm_lora_target t[QLM_LORA_N_TARGETS];
    int nt = present_targets(a, t);
    printf("targets        ");
    for (int i = 0; i < nt; i++) printf(" %s", qlm_lora_target_name(a, t[i]));
    printf("\nmodules         %d\n", a->n_stored);
    printf("parameters      %lld (%.1f KiB as %s in adapter_model.safetensors)\n", (long long)a->n_params,
           a->file_bytes / 1024.0, qlm_dtype_name(a->file_dtype));
}

static int print_json(const qlm_lora_adapter *a) {
    const qlm_lora_config *c = &a->cfg;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "path", a->path);
    cJSON_AddStringToObject(j, "arch", qlm_lora_arch_name(a));
    for (int stack = 0; stack < (a->is_t5 ? 2 : 1); stack++) {
        cJSON *layers = cJSON_AddArrayToObject(j, a->is_t5 ? (stack ? "decoder_blocks" : "encoder_blocks") : "layers");
        char *used = malloc((size_t)a->n_layers[stack] + 1);
        if (!used) break;
        adapted_layers(a, stack, used);
        for (int l = 0; l < a->n_layers[stack]; l++)
            if (used[l]) cJSON_AddItemToArray(layers, cJSON_CreateNumber(l));
        free(used);
    }
    cJSON_AddNumberToObject(j, "r", c->r);
    cJSON_AddNumberToObject(j, "lora_alpha", c->lora_alpha);
    cJSON_AddBoolToObject(j, "use_rslora", c->use_rslora);
    /* The selection fields as adapter_config.json spells them. */
    char *cfg_text = qlm_lora_config_json(c);
    cJSON *cfg = cfg_text ? cJSON_Parse(cfg_text) : NULL;
    free(cfg_text);
    const char *keys[] = {"target_modules", "exclude_modules", "layers_to_transform", "rank_pattern", "alpha_pattern"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        cJSON_AddItemToObject(j, keys[i], cJSON_DetachItemFromObject(cfg, keys[i]));
    cJSON_Delete(cfg);
    qlm_lora_target t[QLM_LORA_N_TARGETS];
    int nt = present_targets(a, t);
    cJSON *targets = cJSON_AddArrayToObject(j, "targets");
    for (int i = 0; i < nt; i++) cJSON_AddItemToArray(targets, cJSON_CreateString(qlm_lora_target_name(a, t[i])));
    float lo, hi;
    scale_range(a, &lo, &hi);
    cJSON_AddNumberToObject(j, "scale_min", lo);
    cJSON_AddNumberToObject(j, "scale_max", hi);
    cJSON_AddNumberToObject(j, "modules", a->n_stored);
    cJSON_AddNumberToObject(j, "parameters", (double)a->n_params);
    cJSON_AddNumberToObject(j, "bytes", (double)a->file_bytes);
    cJSON_AddStringToObject(j, "dtype", qlm_dtype_name(a->file_dtype));
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return qlm_errorf("out of memory");
    puts(text);
    free(text);
    return 0;
}

static int lora_info(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, OPT_JSON}, {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
    int json = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == OPT_JSON) json = 1;
        else if (c == OPT_HELP) {
            fputs(k_usage, stdout);
            return 0;
        } else {
            return cli_usage_error("lora", k_usage);
        }
    }
    if (argc - optind != 1) {
        fprintf(stderr, "qlm lora info: need one adapter folder\n");
        return cli_usage_error("lora", k_usage);
    }
    qlm_lora_adapter a;
    if (qlm_lora_load(&a, argv[optind], NULL, NULL, NULL, QLM_F32) != 0) return cli_fail("lora info");
    int rc = json ? print_json(&a) : (print_text(&a), 0);
    qlm_lora_free(&a);
    return rc ? cli_fail("lora info") : 0;
}

static int lora_merge(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, OPT_MODEL}, {"lora", required_argument, 0, OPT_LORA},
                                         {"out", required_argument, 0, OPT_OUT}, {"dtype", required_argument, 0, OPT_DTYPE},
                                         {"threads", required_argument, 0, OPT_THREADS}, {"help", no_argument, 0, OPT_HELP},
                                         {0, 0, 0, 0}};
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    mo.device = "cpu"; /* merging writes the weights in host memory */
    const char *lora = NULL, *out = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:o:h", opts, NULL)) != -1) {
        int r = cli_model_flag(&mo, c, optarg);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (c == OPT_LORA) lora = optarg;
        else if (c == OPT_OUT) out = optarg;
        else if (c == OPT_HELP) {
            fputs(k_usage, stdout);
            return 0;
        } else {
            return cli_usage_error("lora", k_usage);
        }
    }
    if (!mo.model || !lora || !out || optind != argc) {
        fprintf(stderr, "qlm lora merge: need -m MODEL, --lora PATH and -o OUT (and nothing else)\n");
        return cli_usage_error("lora", k_usage);
    }
    qlm_dtype dt;
    if (mo.dtype && qlm_dtype_parse(mo.dtype, &dt) == 0 && dt == QLM_I8) {
        fprintf(stderr, "qlm lora merge: the merged model is written as f32, bf16 or f16; quantize it afterwards "
                        "with `qlm quantize`\n");
        return 2;
    }
    cli_model cm;
    mo.own_weights = 1;
    if (cli_load_model(&mo, &cm, 0, 0) != 0) return cli_fail("lora merge");
    qlm_lora_adapter a;
    int t5 = cm.src.is_t5;
    int rc = qlm_lora_load(&a, lora, NULL, t5 ? NULL : &cm.model.cfg, t5 ? &cm.t5.cfg : NULL, QLM_F32);
    if (rc == 0) {
        rc = t5 ? qlm_lora_merge_t5(&cm.t5, &a, 1) : qlm_lora_merge(&cm.model, &a, 1);
        if (rc == 0)
            fprintf(stderr, "qlm lora merge: merged %d modules (%lld parameters) of %s; writing %s (%s weights)\n",
                    a.n_stored, (long long)a.n_params, lora, out, qlm_dtype_name(cli_model_format(&cm)->dtype));
        qlm_lora_free(&a);
    }
    if (rc == 0) rc = cli_write_model_folder(&cm, out);
    cli_free_model(&cm);
    if (rc != 0) return cli_fail("lora merge");
    fprintf(stderr, "qlm lora merge: done\n");
    return 0;
}

enum { OPT_RANK = 1100, OPT_ALPHA, OPT_TARGETS, OPT_RSLORA, OPT_SEED_INIT };

static int lora_init(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, OPT_MODEL}, {"out", required_argument, 0, OPT_OUT},
                                         {"rank", required_argument, 0, OPT_RANK}, {"alpha", required_argument, 0, OPT_ALPHA},
                                         {"targets", required_argument, 0, OPT_TARGETS},
                                         {"rslora", no_argument, 0, OPT_RSLORA}, {"seed", required_argument, 0, OPT_SEED_INIT},
                                         {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    mo.device = "cpu";
    const char *out = NULL, *targets = NULL;
    int rank = 0, rslora = 0, seed = 0;
    float alpha = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:o:h", opts, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL: mo.model = optarg; break;
        case OPT_OUT: out = optarg; break;
        case OPT_RANK: if (cli_int("--rank", optarg, 1, 4096, &rank)) return 2; break;
        case OPT_ALPHA: if (cli_float("--alpha", optarg, 1e-6, 1e6, &alpha)) return 2; break;
        case OPT_TARGETS: targets = optarg; break;
        case OPT_RSLORA: rslora = 1; break;
        case OPT_SEED_INIT: if (cli_int("--seed", optarg, 0, 2147483647, &seed)) return 2; break;
        case OPT_HELP: fputs(k_usage, stdout); return 0;
        default: return cli_usage_error("lora", k_usage);
        }
    }
    if (!mo.model || !out || !rank || optind != argc) {
        fprintf(stderr, "qlm lora init: need -m MODEL, -o OUT and --rank R (and nothing else)\n");
        return cli_usage_error("lora", k_usage);
    }
    /* The folder (and its parents) first: a bad -o fails before the model is read. */
    if (cli_make_dir(out) != 0) return cli_fail("lora init");
    cli_model cm;
    if (cli_load_model(&mo, &cm, 0, 1) != 0) return cli_fail("lora init");
    int t5 = cm.src.is_t5;
    /* peft's defaults: alpha = rank, and the query and value projections. */
    char *json = cli_lora_config_json(mo.model, rank, alpha > 0 ? alpha : rank, targets ? targets : t5 ? "q,v" : "q_proj,v_proj", rslora, 0, t5);
    qlm_lora_adapter a;
    int rc = json ? qlm_lora_init(&a, "new", t5 ? NULL : &cm.src.cfg, t5 ? &cm.src.t5 : NULL, json, (uint64_t)seed, QLM_F32)
                  : qlm_errorf("out of memory");
    free(json);
    if (rc == 0) {
        rc = qlm_lora_save(&a, out);
        if (rc == 0)
            fprintf(stderr, "qlm lora init: %s: rank %d, %d modules, %lld parameters (B = 0: the model is unchanged "
                            "until trained)\n", out, a.cfg.r, a.n_stored, (long long)a.n_params);
        qlm_lora_free(&a);
    }
    cli_free_model(&cm);
    return rc ? cli_fail("lora init") : 0;
}

int cmd_lora(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "init") == 0) return lora_init(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "info") == 0) return lora_info(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "merge") == 0) return lora_merge(argc - 1, argv + 1);
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(k_usage, stdout);
        return 0;
    }
    if (argc < 2) fprintf(stderr, "qlm lora: need a subcommand (info, merge or init)\n");
    else fprintf(stderr, "qlm lora: unknown subcommand '%s'\n", argv[1]);
    return cli_usage_error("lora", k_usage);
}
