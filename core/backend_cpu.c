/* CPU implementation of the op table: OpenMP across rows/heads, SIMD matmuls from quant/. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/matmul.h"
#include "../quant/quantize.h"
#include "backend.h"

static void *cpu_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

static void cpu_free(void *p) { free(p); }

static int cpu_upload_weight(qlm_weight *w) {
    (void)w;
    return 0;
}

static void cpu_rmsnorm(float *out, const float *x, const float *weight, int n, int dim, float eps) {
#pragma omp parallel for if (n > 1)
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        float *oi = out + (size_t)i * dim;
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += (double)xi[j] * xi[j];
        float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int j = 0; j < dim; j++) oi[j] = xi[j] * inv * weight[j];
    }
}

static void cpu_rope(float *x, int n, const int *pos, int n_heads, int head_dim, const float *inv_freq) {
    int half = head_dim / 2;
#pragma omp parallel for if (n > 1)
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < half; j++) {
            float angle = (float)pos[i] * inv_freq[j];
            float c = cosf(angle), s = sinf(angle);
            for (int h = 0; h < n_heads; h++) {
                float *v = x + ((size_t)i * n_heads + h) * head_dim;
                float a = v[j], b = v[j + half];
                v[j] = a * c - b * s;
                v[j + half] = b * c + a * s;
            }
        }
    }
}

static void cpu_attention(float *out, const float *q, const float *k_cache, const float *v_cache, int n,
                          const int *pos, const qlm_attn_shape *sh) {
    int hd = sh->head_dim, kv_dim = sh->n_kv_heads * hd, group = sh->n_heads / sh->n_kv_heads;
    int max_len = sh->n_keys;
    for (int i = 0; i < n && !sh->n_keys; i++)
        if (pos[i] + 1 > max_len) max_len = pos[i] + 1;
#pragma omp parallel
    {
        /* On the stack when small, so the common case allocates nothing and cannot fail. */
        float small[4096];
        float *scores = max_len <= 4096 ? small : malloc((size_t)max_len * sizeof *scores);
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int i = 0; i < n; i++) {
            for (int h = 0; h < sh->n_heads; h++) {
                const float *qi = q + ((size_t)i * sh->n_heads + h) * hd;
                float *oi = out + ((size_t)i * sh->n_heads + h) * hd;
                int kvh = h / group, len = sh->n_keys ? sh->n_keys : pos[i] + 1;
                const float *bias = sh->pos_bias ? sh->pos_bias + (size_t)h * sh->pos_bias_span + sh->pos_bias_offset - pos[i] : NULL;
                float mx = -INFINITY;
                for (int t = 0; t < len; t++) {
                    const float *kt = k_cache + (size_t)t * kv_dim + (size_t)kvh * hd;
                    float s = 0;
                    for (int d = 0; d < hd; d++) s += qi[d] * kt[d];
                    s *= sh->scale;
                    if (bias) s += bias[t];
                    scores[t] = s;
                    if (s > mx) mx = s;
                }
                float sum = 0;
                for (int t = 0; t < len; t++) {
                    scores[t] = expf(scores[t] - mx);
                    sum += scores[t];
                }
                float inv = 1.0f / sum;
                memset(oi, 0, (size_t)hd * sizeof *oi);
                for (int t = 0; t < len; t++) {
                    const float *vt = v_cache + (size_t)t * kv_dim + (size_t)kvh * hd;
                    float p = scores[t] * inv;
                    for (int d = 0; d < hd; d++) oi[d] += p * vt[d];
                }
            }
        }
        if (scores != small) free(scores);
    }
}

static inline float act(float x, qlm_act a) {
    switch (a) {
    case QLM_ACT_GELU_TANH: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case QLM_ACT_RELU: return x > 0 ? x : 0;
    default: return x / (1.0f + expf(-x));
    }
}

static void cpu_glu(float *out, const float *gate, const float *up, long n, qlm_act a) {
#pragma omp parallel for if (n > 4096)
    for (long i = 0; i < n; i++) out[i] = act(gate[i], a) * up[i];
}

static void cpu_activate(float *x, long n, qlm_act a) {
#pragma omp parallel for if (n > 4096)
    for (long i = 0; i < n; i++) x[i] = act(x[i], a);
}

static void cpu_add(float *y, const float *x, long n) {
#pragma omp parallel for if (n > 16384)
    for (long i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_embedding(float *out, const qlm_weight *table, const int *ids, int n) {
    for (int i = 0; i < n; i++) qlm_weight_row_f32(table, ids[i], out + (size_t)i * table->cols);
}

static void cpu_copy(float *dst, const float *src, long n) { memmove(dst, src, (size_t)n * sizeof *dst); }

static void cpu_to_device(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

static const qlm_backend cpu_backend = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload_weight = cpu_upload_weight,
    .matmul = qlm_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .glu = cpu_glu,
    .activate = cpu_activate,
    .add = cpu_add,
    .embedding = cpu_embedding,
    .copy = cpu_copy,
    .to_device = cpu_to_device,
};

const qlm_backend *qlm_backend_cpu(void) { return &cpu_backend; }
