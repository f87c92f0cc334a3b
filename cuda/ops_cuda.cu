// The CUDA backend's elementwise and per-row ops, each the GPU form of its CPU twin in
// core/backend_cpu.c (same formulas, so the two agree to F32 rounding).
#include <string.h>

#include "cuda_internal.h"

// One block per row: the sum of squares in F32 over a tree in qlm_rms_inv's order (the CPU sums in
// double; the two differ by F32 rounding of a few-thousand-term sum, far below any parity
// tolerance). Rows of up to RMS_HELD * 256 values stay in registers, x and weight read in one
// pass; out may alias x.
enum { RMS_HELD = 16 };
__global__ void __launch_bounds__(QLM_RMS_THREADS)
    rmsnorm_kernel(float *out, const float *x, const float *weight, int dim, float eps) {
    qlm_pdl_trigger();
    const float *xi = x + (size_t)blockIdx.x * dim;
    float *oi = out + (size_t)blockIdx.x * dim;
    const bool held = dim <= RMS_HELD * QLM_RMS_THREADS;
    float v[RMS_HELD], w[RMS_HELD], ss = 0;
    if (held) {
#pragma unroll
        for (int k = 0; k < RMS_HELD; k++) {
            int j = threadIdx.x + k * QLM_RMS_THREADS;
            v[k] = j < dim ? xi[j] : 0.0f;
            w[k] = j < dim ? weight[j] : 0.0f;
            if (j < dim) ss += v[k] * v[k];
        }
    } else {
        for (int j = threadIdx.x; j < dim; j += QLM_RMS_THREADS) ss += xi[j] * xi[j];
    }
    __shared__ float part[QLM_RMS_WARPS];
    ss = qlm_warp_sum(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    const float inv = qlm_rms_inv(part, dim, eps);
    if (held) {
#pragma unroll
        for (int k = 0; k < RMS_HELD; k++) {
            int j = threadIdx.x + k * QLM_RMS_THREADS;
            if (j < dim) oi[j] = v[k] * inv * w[k];
        }
    } else {
        for (int j = threadIdx.x; j < dim; j += QLM_RMS_THREADS) oi[j] = xi[j] * inv * weight[j];
    }
}

struct rmsnorm_args {
    float *out;
    const float *x, *weight;
    int n, dim;
    float eps;
};

static void launch_rmsnorm(const void *p) {
    const rmsnorm_args *a = (const rmsnorm_args *)p;
    rmsnorm_kernel<<<a->n, QLM_RMS_THREADS, 0, qlm_cuda_stream>>>(a->out, a->x, a->weight, a->dim, a->eps);
}

void qlm_cuda_rmsnorm(float *out, const float *x, const float *weight, int n, int dim, float eps) {
    if (n <= 0) return;
    rmsnorm_args a;
    memset(&a, 0, sizeof a);
    a.out = out, a.x = x, a.weight = weight, a.n = n, a.dim = dim, a.eps = eps;
    qlm_cuda_submit("rmsnorm", launch_rmsnorm, &a, sizeof a);
}

qlm_kv_dst qlm_cuda_kv_dst(const qlm_kv_step *kv, int n, int which) {
    if (kv->kv == QLM_F16) qlm_cuda_fail("kv step", "F16 caches are not a CUDA form", __FILE__, __LINE__);
    qlm_kv_dst d;
    memset(&d, 0, sizeof d);
    d.k_cache = kv->k_cache, d.v_cache = kv->v_cache, d.bf16 = kv->kv == QLM_BF16, d.heads = kv->n_kv_heads;
    d.hd = kv->head_dim, d.max_pos = kv->max_pos;
    d.slots = qlm_cuda_ints_of(kv->slots, n, which);
    d.pos = qlm_cuda_ints_of(kv->store_pos, n, which + 1);
    return d;
}

// Thread per (row, frequency, head) over the query heads then the key heads: rotate-half RoPE by
// +angle (direction 1, the forward) or -angle (-1, its backward), as qlm_cpu_rope_rotate. With
// dst.k_cache (rope_store), a key head's rotated pair also goes into the cache, and n * heads * hd
// more threads put the values there: rope and kv_store in one launch.
__global__ void rope_kernel(float *q, float *k, int n, qlm_cuda_ints pos, int n_heads, int n_kv_heads, int head_dim,
                            const float *inv_freq, float direction, qlm_kv_dst dst, const float *v_rows) {
    int half = head_dim / 2, heads = n_heads + n_kv_heads;
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x, total = (long)n * half * heads;
    if (t >= total) {
        t -= total;
        if (!dst.k_cache || t >= (long)n * n_kv_heads * head_dim) return;
        qlm_kv_put(dst, dst.v_cache, (int)(t / head_dim / n_kv_heads), (int)(t / head_dim % n_kv_heads),
                   (int)(t % head_dim), v_rows[t]);
        return;
    }
    int h = (int)(t % heads), j = (int)(t / heads % half), i = (int)(t / heads / half);
    float *v = h < n_heads ? q + ((size_t)i * n_heads + h) * head_dim : k + ((size_t)i * n_kv_heads + h - n_heads) * head_dim;
    float a = v[j], b = v[j + half];
    qlm_rope_pair(a, b, (float)qlm_ints_at(pos, i) * inv_freq[j], direction);
    v[j] = a;
    v[j + half] = b;
    if (dst.k_cache && h >= n_heads) {
        qlm_kv_put(dst, dst.k_cache, i, h - n_heads, j, a);
        qlm_kv_put(dst, dst.k_cache, i, h - n_heads, j + half, b);
    }
}

struct rope_args {
    float *q, *k;
    int n, n_heads, n_kv_heads, head_dim;
    qlm_cuda_ints pos;
    const float *inv_freq;
    float direction;
    qlm_kv_dst dst;
    const float *v;
};

static void launch_rope(const void *p) {
    const rope_args *a = (const rope_args *)p;
    long total = (long)a->n * (a->head_dim / 2) * (a->n_heads + a->n_kv_heads);
    if (a->dst.k_cache) total += (long)a->n * a->n_kv_heads * a->head_dim;
    rope_kernel<<<qlm_cuda_blocks(total, 256), 256, 0, qlm_cuda_stream>>>(a->q, a->k, a->n, a->pos, a->n_heads,
                                                                         a->n_kv_heads, a->head_dim, a->inv_freq,
                                                                         a->direction, a->dst, a->v);
}

// dst NULL: rope alone.
static void submit_rope(const char *name, float *q, float *k, int n, const int *pos, int n_heads, int n_kv_heads,
                        int head_dim, const float *inv_freq, float direction, const qlm_kv_dst *dst, const float *v) {
    if ((long)n * (head_dim / 2) * (n_heads + n_kv_heads) <= 0) return;
    rope_args a;
    memset(&a, 0, sizeof a);
    a.q = q, a.k = k, a.n = n, a.n_heads = n_heads, a.n_kv_heads = n_kv_heads, a.head_dim = head_dim;
    a.inv_freq = inv_freq, a.direction = direction;
    a.pos = qlm_cuda_ints_of(pos, n, 0);
    if (dst) a.dst = *dst, a.v = v;
    qlm_cuda_submit(name, launch_rope, &a, sizeof a);
}

void qlm_cuda_rope(float *q, float *k, int n, const int *pos, int n_heads, int n_kv_heads, int head_dim,
                   const float *inv_freq) {
    submit_rope("rope", q, k, n, pos, n_heads, n_kv_heads, head_dim, inv_freq, 1.0f, NULL, NULL);
}

static void submit_kv_store(const qlm_kv_dst &d, const float *k, const float *v, int n);

// Without frequencies (T5) the step is kv_store alone.
void qlm_cuda_rope_store(float *q, float *k, const float *v, int n, const qlm_kv_step *kv) {
    const qlm_kv_dst d = qlm_cuda_kv_dst(kv, n, 1);
    if (kv->inv_freq)
        submit_rope("rope_store", q, k, n, kv->pos, kv->n_heads, kv->n_kv_heads, kv->head_dim, kv->inv_freq, 1.0f, &d, v);
    else
        submit_kv_store(d, k, v, n);
}

// A rotation's inverse is the backward of rope.
void qlm_cuda_rope_backward(float *dq, float *dk, int n, const int *pos, int n_heads, int n_kv_heads, int head_dim,
                            const float *inv_freq) {
    submit_rope("rope_backward", dq, dk, n, pos, n_heads, n_kv_heads, head_dim, inv_freq, -1.0f, NULL, NULL);
}

__global__ void glu_kernel(float *out, const float *gate, const float *up, long n, qlm_act a) {
    qlm_pdl_trigger();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = up ? qlm_act_of(gate[i], a) * up[i] : qlm_act_of(gate[i], a);
}

struct elementwise_args {
    float *y;
    const float *a, *b;
    long n;
    float s;
    int act;
};

static void launch_glu(const void *p) {
    const elementwise_args *a = (const elementwise_args *)p;
    glu_kernel<<<qlm_cuda_blocks(a->n, 256), 256, 0, qlm_cuda_stream>>>(a->y, a->a, a->b, a->n, (qlm_act)a->act);
}

static void submit_elementwise(const char *name, qlm_cuda_launcher fn, float *y, const float *x, const float *b, long n, float s, int act) {
    if (n <= 0) return;
    elementwise_args a;
    memset(&a, 0, sizeof a);
    a.y = y, a.a = x, a.b = b, a.n = n, a.s = s, a.act = act;
    qlm_cuda_submit(name, fn, &a, sizeof a);
}

void qlm_cuda_glu(float *out, const float *gate, const float *up, long n, qlm_act act) {
    submit_elementwise("glu", launch_glu, out, gate, up, n, 0, act);
}

void qlm_cuda_activate(float *x, long n, qlm_act act) { qlm_cuda_glu(x, x, NULL, n, act); }

__global__ void add_kernel(float *y, const float *x, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

static void launch_add(const void *p) {
    const elementwise_args *a = (const elementwise_args *)p;
    add_kernel<<<qlm_cuda_blocks(a->n, 256), 256, 0, qlm_cuda_stream>>>(a->y, a->a, a->n);
}

void qlm_cuda_add(float *y, const float *x, long n) { submit_elementwise("add", launch_add, y, x, NULL, n, 0, 0); }

__global__ void scale_kernel(float *x, long n, float s) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

static void launch_scale(const void *p) {
    const elementwise_args *a = (const elementwise_args *)p;
    scale_kernel<<<qlm_cuda_blocks(a->n, 256), 256, 0, qlm_cuda_stream>>>(a->y, a->n, a->s);
}

void qlm_cuda_scale(float *x, long n, float s) { submit_elementwise("scale", launch_scale, x, NULL, NULL, n, s, 0); }

static void launch_zero(const void *p) {
    const elementwise_args *a = (const elementwise_args *)p;
    CUDA_CHECK(cudaMemsetAsync(a->y, 0, (size_t)a->n * sizeof(float), qlm_cuda_stream));
}

void qlm_cuda_zero(float *x, long n) { submit_elementwise("zero", launch_zero, x, NULL, NULL, n, 0, 0); }

static void launch_copy(const void *p) {
    const elementwise_args *a = (const elementwise_args *)p;
    CUDA_CHECK(cudaMemcpyAsync(a->y, a->a, (size_t)a->n * sizeof(float), cudaMemcpyDeviceToDevice, qlm_cuda_stream));
}

void qlm_cuda_copy(float *dst, const float *src, long n) { submit_elementwise("copy", launch_copy, dst, src, NULL, n, 0, 0); }

__global__ void embedding_kernel(float *out, qlm_weight table, qlm_cuda_ints ids, int n) {
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long)n * table.cols) return;
    int i = (int)(t / table.cols), c = (int)(t % table.cols);
    out[t] = qlm_weight_at(table, qlm_ints_at(ids, i), c);
}

struct embedding_args {
    float *out;
    qlm_weight table;
    qlm_cuda_ints ids;
    int n;
};

static void launch_embedding(const void *p) {
    const embedding_args *a = (const embedding_args *)p;
    long total = (long)a->n * a->table.cols;
    embedding_kernel<<<qlm_cuda_blocks(total, 256), 256, 0, qlm_cuda_stream>>>(a->out, a->table, a->ids, a->n);
}

void qlm_cuda_embedding(float *out, const qlm_weight *table, const int *ids, int n) {
    if ((long)n * table->cols <= 0) return;
    embedding_args a;
    memset(&a, 0, sizeof a);
    a.out = out, a.n = n;
    a.table = *table;
    a.ids = qlm_cuda_ints_of(ids, n, 0);
    qlm_cuda_submit("embedding", launch_embedding, &a, sizeof a);
}

// Thread per (keys or values, row, head, element).
__global__ void kv_store_kernel(qlm_kv_dst d, const float *k, const float *v, int n) {
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x, per = (long)n * d.heads * d.hd;
    if (t >= 2 * per) return;
    const bool is_v = t >= per;
    if (is_v) t -= per;
    qlm_kv_put(d, is_v ? d.v_cache : d.k_cache, (int)(t / d.hd / d.heads), (int)(t / d.hd % d.heads), (int)(t % d.hd),
               (is_v ? v : k)[t]);
}

struct kv_store_args {
    qlm_kv_dst d;
    const float *k, *v;
    int n;
};

static void launch_kv_store(const void *p) {
    const kv_store_args *a = (const kv_store_args *)p;
    long total = 2L * a->n * a->d.heads * a->d.hd;
    kv_store_kernel<<<qlm_cuda_blocks(total, 256), 256, 0, qlm_cuda_stream>>>(a->d, a->k, a->v, a->n);
}

static void submit_kv_store(const qlm_kv_dst &d, const float *k, const float *v, int n) {
    if ((long)n * d.heads * d.hd <= 0) return;
    kv_store_args a;
    memset(&a, 0, sizeof a);
    a.d = d, a.k = k, a.v = v, a.n = n;
    qlm_cuda_submit("kv_store", launch_kv_store, &a, sizeof a);
}

void qlm_cuda_kv_store(void *k_cache, void *v_cache, qlm_dtype kv, const float *k, const float *v, int n,
                       const int *slots, int slot, const int *pos, int heads, int hd, int max_pos) {
    if ((long)n * heads * hd <= 0) return;
    qlm_kv_step step;
    memset(&step, 0, sizeof step);
    step.n_kv_heads = heads, step.head_dim = hd, step.k_cache = k_cache, step.v_cache = v_cache, step.kv = kv;
    step.slots = slots, step.store_pos = pos, step.max_pos = max_pos;
    qlm_kv_dst d = qlm_cuda_kv_dst(&step, n, 0);
    d.slot = slot;
    submit_kv_store(d, k, v, n);
}
