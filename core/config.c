#include "config.h"

#include <stddef.h>

#include "error.h"

int qlm_config_validate(const qlm_llama_config *c, const char *source) {
    struct { const char *name; long v; long max; } pos[] = {
        {"hidden_size", c->dim, 1L << 20},      {"intermediate_size", c->hidden_dim, 1L << 22},
        {"num_hidden_layers", c->n_layers, 4096}, {"num_attention_heads", c->n_heads, 4096},
        {"num_key_value_heads", c->n_kv_heads, 4096}, {"head_dim", c->head_dim, 4096},
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
    return 0;
}
