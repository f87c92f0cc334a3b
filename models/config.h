/* Architecture hyper-parameters of a Llama-family decoder, as read from config.json,
 * GGUF metadata or a llama2.c header. */
#ifndef QLM_CONFIG_H
#define QLM_CONFIG_H

#define QLM_MAX_ROPE_FACTORS 256 /* longrope factors: head_dim up to 512 */

typedef struct {
    char arch[32];      /* "llama", "qwen2", ... (informational) */
    int dim;            /* hidden_size */
    int hidden_dim;     /* intermediate_size */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;       /* usually dim / n_heads */
    int vocab_size;
    int max_seq_len;    /* max_position_embeddings */
    float rope_theta;
    float norm_eps;
    int tie_embeddings; /* lm_head shares the token embedding */
    int attn_bias;      /* q/k/v projections have a bias (Qwen2) */
    int attn_out_bias;  /* o_proj has a bias */
    int mlp_bias;       /* gate/up/down have a bias */
    /* The checkpoint names q/k/v as one qkv_proj and gate/up as one gate_up_proj (Phi-3), and so do
     * its PEFT adapters; the model itself runs them as separate projections. */
    int fused_proj;
    int act;            /* qlm_act of the gated MLP (hidden_act) */
    int qk_norm;        /* per-head RMSNorm of queries and keys before RoPE (Qwen3, Gemma 3) */
    /* Gemma: RMSNorms multiply by (norm_offset + w); norms after the attention and the MLP output
     * as well as before (post_norms); the embedding scaled by embed_scale (0: 1); attention scores
     * scaled by query_scale (0: 1/sqrt(head_dim)); scores and final logits soft-capped
     * (cap * tanh(x / cap); 0: none). */
    float norm_offset;
    int post_norms;
    float embed_scale, query_scale;
    float attn_softcap, final_softcap;
    /* "rope_scaling": the type and its parameters (factor 0 with QLM_ROPE_DEFAULT). */
    int rope_type;      /* qlm_rope_type */
    /* longrope: per-frequency divisors (head_dim / 2 of each), the short ones while a call's
     * positions stay within rope_orig_max_pos, the long ones past it. */
    float rope_short_factor[QLM_MAX_ROPE_FACTORS], rope_long_factor[QLM_MAX_ROPE_FACTORS];
    float rope_scale_factor;
    float rope_low_freq_factor;  /* llama3 */
    float rope_high_freq_factor; /* llama3 */
    float rope_beta_fast, rope_beta_slow; /* yarn */
    float rope_attn_factor;      /* yarn: cos and sin are scaled by it (0: none) */
    int rope_orig_max_pos;
    /* Sliding-window attention: a query at position p sees keys p - sliding_window + 1 .. p, in
     * layers window_first_layer and up (Qwen2's max_window_layers; 0 for Mistral), except, with
     * window_period p > 0, every p-th layer (l % p == p - 1: Gemma's global layers). 0: none. */
    int sliding_window;
    int window_first_layer;
    int window_period;
    /* > 0: the windowed layers' RoPE base (Gemma 3's rope_local_base_freq), unscaled. */
    float rope_local_theta;
    int bos_id;         /* -1 when unknown */
    int eos_id;         /* -1 when unknown */
} qlm_llama_config;

/* DYNAMIC: dynamic NTK, whose base grows with the length a forward call reaches past
 * max_position_embeddings (rope_orig_max_pos holds it). */
typedef enum {
    QLM_ROPE_DEFAULT, QLM_ROPE_LINEAR, QLM_ROPE_LLAMA3, QLM_ROPE_YARN, QLM_ROPE_LONGROPE, QLM_ROPE_DYNAMIC
} qlm_rope_type;

/* Sets window_first_layer and window_period to give exactly the sliding layers of sliding[0..n)
 * (1: windowed): all from one layer on, or all but every p-th. -1 when the list has neither shape. */
int qlm_config_fit_windows(qlm_llama_config *cfg, const unsigned char *sliding, int n);

/* The window of layer l's attention (0: the whole causal prefix). */
static inline int qlm_layer_window(const qlm_llama_config *c, int l) {
    if (c->sliding_window <= 0 || l < c->window_first_layer) return 0;
    return c->window_period > 0 && l % c->window_period == c->window_period - 1 ? 0 : c->sliding_window;
}

/* The attention factor transformers derives when a config gives none: YaRN's 0.1 ln(factor) + 1,
 * longrope's sqrt(1 + ln(factor) / ln(original context)), 1 for a factor <= 1 or other types. */
float qlm_rope_default_attn_factor(const qlm_llama_config *c);

/* Positions one sequence may use: max_position_embeddings, or with dynamic NTK, which stretches its
 * base to whatever length a call reaches, no limit of the model's (2^24, the largest qlm reads). */
int qlm_llama_positions(const qlm_llama_config *c);

/* Checks that the numbers are positive and consistent (heads divide, GQA groups, ...).
 * `source` names the file for the message. */
int qlm_config_validate(const qlm_llama_config *c, const char *source);

/* Hyper-parameters of a T5 encoder-decoder (T5, T5 v1.1, FLAN-T5), as in config.json. */
typedef struct {
    int d_model, d_kv, d_ff;
    int n_layers, n_dec_layers, n_heads;
    int vocab_size;
    int rel_buckets, rel_max_distance; /* relative_attention_num_buckets / _max_distance */
    float norm_eps;                    /* layer_norm_epsilon */
    int gated;                         /* feed_forward_proj "gated-*": act(wi_0 x) * wi_1 x */
    int act;                           /* qlm_act of the feed-forward (core/backend.h) */
    /* Original T5 ties the head to the shared embedding and scales the decoder output by
     * d_model^-0.5; v1.1/FLAN-T5 have their own lm_head and no scaling. */
    int tie_embeddings;
    int decoder_start_id, eos_id, pad_id;
} qlm_t5_config;

int qlm_t5_config_validate(const qlm_t5_config *c, const char *source);

#endif
