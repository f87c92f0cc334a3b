#include "config.h"

#include <math.h>
#include <stddef.h>

#include "../core/error.h"
#include "../core/weight.h"

float qlm_rope_default_attn_factor(const qlm_llama_config *c) {
    double f = c->rope_scale_factor;
    if (f <= 1) return 1.0f;
    if (c->rope_type == QLM_ROPE_YARN) return (float)(0.1 * log(f) + 1.0);
    if (c->rope_type == QLM_ROPE_LONGROPE) return (float)sqrt(1 + log(f) / log((double)c->rope_orig_max_pos));
    return 1.0f;
}

int qlm_config_validate(const qlm_llama_config *c, const char *source) {
    struct { const char *name; long v; long max; } pos[] = {
        {"hidden_size", c->dim, 1L << 20},      {"intermediate_size", c->hidden_dim, 1L << 22},
        {"num_hidden_layers", c->n_layers, 4096}, {"num_attention_heads", c->n_heads, 4096},
        {"num_key_value_heads", c->n_kv_heads, 4096}, {"head_dim", c->head_dim, QLM_MAX_HEAD_DIM},
        {"vocab_size", c->vocab_size, 1L << 24}, {"max_position_embeddings", c->max_seq_len, 1L << 24},
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0 || pos[i].v > pos[i].max)
            return qlm_errorf("%s: %s = %ld is out of range (1..%ld)", source, pos[i].name, pos[i].v, pos[i].max);
    if (c->n_heads % c->n_kv_heads != 0)
        return qlm_errorf("%s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)", source,
                          c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2 != 0) return qlm_errorf("%s: head_dim (%d) must be even for rotary embeddings", source, c->head_dim);
    if (!(c->rope_theta > 0)) return qlm_errorf("%s: rope_theta must be positive", source);
    if (!(c->norm_eps > 0) || c->norm_eps > 1) return qlm_errorf("%s: rms_norm_eps must be in (0, 1]", source);
    if (c->rope_scale_factor < 0) return qlm_errorf("%s: rope_scaling.factor must be positive", source);
    if (c->rope_type == QLM_ROPE_LONGROPE) {
        if (c->head_dim / 2 > QLM_MAX_ROPE_FACTORS || c->rope_orig_max_pos <= 0)
            return qlm_errorf("%s: longrope needs head_dim <= %d and a positive original_max_position_embeddings",
                              source, 2 * QLM_MAX_ROPE_FACTORS);
        for (int j = 0; j < c->head_dim / 2; j++)
            if (!(c->rope_short_factor[j] > 0) || !(c->rope_long_factor[j] > 0) || !isfinite(c->rope_short_factor[j]) ||
                !isfinite(c->rope_long_factor[j]))
                return qlm_errorf("%s: longrope factor %d must be a positive number", source, j);
    }
    if (c->rope_type == QLM_ROPE_DYNAMIC && (!(c->rope_scale_factor >= 1) || c->rope_scale_factor > 1024 ||
                                             c->head_dim < 4 || c->rope_orig_max_pos <= 0))
        return qlm_errorf("%s: dynamic RoPE needs a factor in [1, 1024] and head_dim >= 4", source);
    return 0;
}

int qlm_config_fit_windows(qlm_llama_config *cfg, const unsigned char *sliding, int n) {
    int first = 0;
    while (first < n && !sliding[first]) first++;
    int ok = 1;
    for (int l = first; l < n; l++) ok &= sliding[l];
    if (ok) {
        cfg->window_first_layer = first;
        cfg->window_period = 0;
        return 0;
    }
    for (int p = 2; p <= n; p++) {
        ok = 1;
        for (int l = 0; l < n && ok; l++) ok = sliding[l] == (l % p != p - 1);
        if (ok) {
            cfg->window_first_layer = 0;
            cfg->window_period = p;
            return 0;
        }
    }
    return -1;
}

int qlm_llama_positions(const qlm_llama_config *c) {
    return c->rope_type == QLM_ROPE_DYNAMIC ? 1 << 24 : c->max_seq_len;
}

int qlm_t5_config_validate(const qlm_t5_config *c, const char *source) {
    struct { const char *name; long v; long max; } pos[] = {
        {"d_model", c->d_model, 1L << 20}, {"d_kv", c->d_kv, 4096}, {"d_ff", c->d_ff, 1L << 22},
        {"num_layers", c->n_layers, 4096}, {"num_decoder_layers", c->n_dec_layers, 4096},
        {"num_heads", c->n_heads, 4096}, {"vocab_size", c->vocab_size, 1L << 24},
        {"relative_attention_num_buckets", c->rel_buckets, 1L << 16},
        {"relative_attention_max_distance", c->rel_max_distance, 1L << 24},
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0 || pos[i].v > pos[i].max)
            return qlm_errorf("%s: %s = %ld is out of range (1..%ld)", source, pos[i].name, pos[i].v, pos[i].max);
    /* The bucket formula divides by log(max_distance / max_exact) with max_exact = buckets / 4. */
    if (c->rel_buckets < 4 || c->rel_max_distance <= c->rel_buckets / 4)
        return qlm_errorf("%s: relative_attention_num_buckets must be >= 4 and max_distance > buckets/4", source);
    if (!(c->norm_eps > 0) || c->norm_eps > 1) return qlm_errorf("%s: layer_norm_epsilon must be in (0, 1]", source);
    int ids[] = {c->decoder_start_id, c->eos_id, c->pad_id};
    for (int i = 0; i < 3; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return qlm_errorf("%s: token ids (decoder start, eos, pad) must be within the vocabulary", source);
    return 0;
}
