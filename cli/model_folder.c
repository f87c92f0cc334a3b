/* Writing a loaded model as a Hugging Face style folder, for qlm quantize/convert and qlm lora merge. */
#include "model_folder.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/error.h"
#include "../loaders/hf_config.h"
#include "../loaders/safetensors.h"

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

int cli_write_model_folder(cli_model *cm, const char *out_dir) {
    if (cli_make_dir(out_dir) != 0) return -1;
    qlm_tensor_store *store = qlm_store_new();
    if (!store) return -1;
    char path[4200];
    char quant[64];
    int t5 = cm->src.is_t5;
    const qlm_weight_format *f = cli_model_format(cm);
    qlm_dtype dt = f->dtype;
    int per_channel = f->per_channel, group = f->group;
    if (qlm_dtype_is_block(dt))
        snprintf(quant, sizeof quant, "%s-group-%d", qlm_dtype_name(dt), group);
    else
        snprintf(quant, sizeof quant, "%s%s", qlm_dtype_name(dt), dt == QLM_I8 ? (per_channel ? "-per-channel" : "-per-tensor") : "");
    const char *meta[] = {"format", "pt", "qlm.dtype", quant, NULL};
    int rc = t5 ? qlm_t5_export(&cm->t5, store) : qlm_model_export(&cm->model, store);
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if (rc == 0) rc = qlm_safetensors_save(path, store, meta);
    qlm_store_free(store);
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    qlm_hf_storage st = {.dtype = dt, .per_channel = per_channel, .group = group};
    if (rc == 0) rc = t5 ? qlm_hf_t5_config_save(path, &cm->t5.cfg, &st) : qlm_hf_config_save(path, &cm->model.cfg, &st);
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
        /* tokenizer.model too: Llama's SentencePiece file, which llama.cpp's converter reads. */
        const char *files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                               "generation_config.json", "spiece.model", "tokenizer.model"};
        for (size_t i = 0; i < sizeof files / sizeof files[0] && rc == 0; i++) rc = copy_if_exists(src_dir, out_dir, files[i]);
        return rc;
    }
    return qlm_tokenizer_save_json(cm->src.tok, out_dir);
}
