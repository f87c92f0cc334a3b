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
    int max_len = 0;
    for (int i = 0; i < n; i++)
        if (pos[i] + 1 > max_len) max_len = pos[i] + 1;
#pragma omp parallel
    {
        float *scores = malloc((size_t)max_len * sizeof *scores);
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int i = 0; i < n; i++) {
            for (int h = 0; h < sh->n_heads; h++) {
                const float *qi = q + ((size_t)i * sh->n_heads + h) * hd;
                float *oi = out + ((size_t)i * sh->n_heads + h) * hd;
                int kvh = h / group, len = pos[i] + 1;
                float mx = -INFINITY;
                for (int t = 0; t < len; t++) {
                    const float *kt = k_cache + (size_t)t * kv_dim + (size_t)kvh * hd;
                    float s = 0;
                    for (int d = 0; d < hd; d++) s += qi[d] * kt[d];
                    s *= sh->scale;
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
        free(scores);
    }
}

static void cpu_swiglu(float *out, const float *gate, const float *up, long n) {
#pragma omp parallel for if (n > 4096)
    for (long i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static void cpu_add(float *y, const float *x, long n) {
#pragma omp parallel for if (n > 16384)
    for (long i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_embedding(float *out, const qlm_weight *table, const int *ids, int n) {
    for (int i = 0; i < n; i++) qlm_weight_row_f32(table, ids[i], out + (size_t)i * table->cols);
}

static void cpu_copy(float *dst, const float *src, long n) { memmove(dst, src, (size_t)n * sizeof *dst); }

static const qlm_backend cpu_backend = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload_weight = cpu_upload_weight,
    .matmul = qlm_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .embedding = cpu_embedding,
    .copy = cpu_copy,
};

const qlm_backend *qlm_backend_cpu(void) { return &cpu_backend; }
