// The CUDA backend's training ops (attention's backward and the matmul's have files of their own),
// each the GPU form of its twin in cpu/backend_cpu_train.c: the same formulas in the same order,
// sums in double where the CPU's are, and no float atomics anywhere, so every result repeats bit
// for bit from run to run.
#include <math.h>
#include <string.h>

#include "cuda_internal.h"
#include "../core/train_formulas.h"

enum { THREADS = 256, WARPS = THREADS / 32 };

struct sum_op {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct max_op { // NaN is passed over, as the CPU's `if (x > mx)` passes it over
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// v combined over a block of THREADS threads in a fixed order, the result on every thread; shared
// holds WARPS values and may be reused once this returns.
template <typename T, typename Op> __device__ T block_reduce(T v, T *shared, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
    __syncthreads();
    T r = shared[0];
    for (int w = 1; w < WARPS; w++) r = op(r, shared[w]);
    __syncthreads();
    return r;
}

// out[j] += m[i][j] for i in order, a thread per column j.
__global__ void add_column_sums_kernel(float *out, const float *m, int n_rows, int cols) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    float acc = out[j];
    for (int i = 0; i < n_rows; i++) acc += m[(size_t)i * cols + j];
    out[j] = acc;
}

void qlm_cuda_add_column_sums(float *out, const float *m, int n_rows, int cols) {
    add_column_sums_kernel<<<qlm_cuda_blocks(cols, THREADS), THREADS, 0, qlm_cuda_stream>>>(out, m, n_rows, cols);
}

// ---- rmsnorm_backward ----

// RMS_BLOCKS blocks, block b taking rows b, b + RMS_BLOCKS, ...; a row's sums in double as on the
// CPU. Block b's dweight terms go to row b of partial (NULL: not wanted), whose columns are added
// up in block order afterwards.
enum { RMS_BLOCKS = 512 };

__global__ void __launch_bounds__(THREADS) rmsnorm_backward_kernel(float *dx, float *partial, const float *dout,
                                                                   const float *x, const float *weight, int n, int dim,
                                                                   float eps) {
    __shared__ double shared[WARPS];
    float *pw = partial ? partial + (size_t)blockIdx.x * dim : NULL;
    for (int i = blockIdx.x; i < n; i += gridDim.x) {
        const float *xi = x + (size_t)i * dim, *gi = dout + (size_t)i * dim;
        float *dxi = dx + (size_t)i * dim;
        double ss = 0, dot = 0;
        for (int j = threadIdx.x; j < dim; j += THREADS) {
            ss += (double)xi[j] * xi[j];
            dot += (double)xi[j] * weight[j] * gi[j];
        }
        ss = block_reduce(ss, shared, sum_op());
        dot = block_reduce(dot, shared, sum_op());
        const float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
        const float k = (float)(dot / dim) * inv * inv * inv;
        for (int j = threadIdx.x; j < dim; j += THREADS) {
            dxi[j] += inv * weight[j] * gi[j] - k * xi[j];
            if (pw) pw[j] = (i == (int)blockIdx.x ? 0.0f : pw[j]) + xi[j] * inv * gi[j];
        }
    }
}

struct rmsnorm_backward_args {
    float *dx, *dweight, *partial;
    const float *dout, *x, *weight;
    int n, dim, blocks;
    float eps;
};

static void launch_rmsnorm_backward(const void *p) {
    const rmsnorm_backward_args &a = *(const rmsnorm_backward_args *)p;
    rmsnorm_backward_kernel<<<a.blocks, THREADS, 0, qlm_cuda_stream>>>(a.dx, a.partial, a.dout, a.x, a.weight, a.n,
                                                                       a.dim, a.eps);
    LAUNCH_CHECK();
    if (a.dweight) qlm_cuda_add_column_sums(a.dweight, a.partial, a.blocks, a.dim);
}

static void *g_partial;
static size_t g_partial_cap;

void qlm_cuda_rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x, const float *weight, int n,
                               int dim, float eps) {
    if (n <= 0 || dim <= 0) return;
    rmsnorm_backward_args a;
    memset(&a, 0, sizeof a);
    a.dx = dx, a.dweight = dweight, a.dout = dout, a.x = x, a.weight = weight, a.n = n, a.dim = dim, a.eps = eps;
    a.blocks = n < RMS_BLOCKS ? n : RMS_BLOCKS;
    if (dweight)
        a.partial = (float *)qlm_cuda_scratch(&g_partial, &g_partial_cap, (size_t)a.blocks * dim * sizeof(float));
    qlm_cuda_submit("rmsnorm_backward", launch_rmsnorm_backward, &a, sizeof a);
}

// ---- glu_backward, activate_backward ----

// With up (glu): dx = dout * up * act'(x), dup = dout * act(x); without: dx = dout * act'(x).
// Every input is read before an output is written, so outputs may alias inputs.
__global__ void act_backward_kernel(float *dx, float *dup, const float *dout, const float *x, const float *up, long n,
                                    qlm_act a) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float value, d = qlm_act_grad(x[i], a, &value), g = dout[i];
    if (up) {
        float u = up[i];
        dx[i] = g * u * d;
        dup[i] = g * value;
    } else {
        dx[i] = g * d;
    }
}

struct act_backward_args {
    float *dx, *dup;
    const float *dout, *x, *up;
    long n;
    int act;
};

static void launch_act_backward(const void *p) {
    const act_backward_args &a = *(const act_backward_args *)p;
    act_backward_kernel<<<qlm_cuda_blocks(a.n, THREADS), THREADS, 0, qlm_cuda_stream>>>(a.dx, a.dup, a.dout, a.x, a.up,
                                                                                       a.n, (qlm_act)a.act);
}

static void submit_act_backward(const char *name, float *dx, float *dup, const float *dout, const float *x,
                                const float *up, long n, qlm_act act) {
    if (n <= 0) return;
    act_backward_args a;
    memset(&a, 0, sizeof a);
    a.dx = dx, a.dup = dup, a.dout = dout, a.x = x, a.up = up, a.n = n, a.act = act;
    qlm_cuda_submit(name, launch_act_backward, &a, sizeof a);
}

void qlm_cuda_glu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, long n,
                           qlm_act act) {
    submit_act_backward("glu_backward", dgate, dup, dout, gate, up, n, act);
}

void qlm_cuda_activate_backward(float *dx, const float *dout, const float *x, long n, qlm_act act) {
    submit_act_backward("activate_backward", dx, NULL, dout, x, NULL, n, act);
}

// ---- embedding_backward ----

// A thread per (bucket, column): bucket b walks all rows in order and adds those whose id is b
// modulo EMB_BUCKETS, so each table row takes its rows' gradients in row order, as on the CPU,
// without atomics, and EMB_BUCKETS threads share each column's work.
enum { EMB_BUCKETS = 64 };

__global__ void embedding_backward_kernel(float *dtable, const float *dout, qlm_cuda_ints ids, int n, int dim) {
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long)EMB_BUCKETS * dim) return;
    const int j = (int)(t % dim), b = (int)(t / dim);
    for (int i = 0; i < n; i++) {
        const int id = qlm_ints_at(ids, i);
        if ((unsigned)id % EMB_BUCKETS == (unsigned)b) dtable[(size_t)id * dim + j] += dout[(size_t)i * dim + j];
    }
}

struct embedding_backward_args {
    float *dtable;
    const float *dout;
    qlm_cuda_ints ids;
    int n, dim;
};

static void launch_embedding_backward(const void *p) {
    const embedding_backward_args &a = *(const embedding_backward_args *)p;
    embedding_backward_kernel<<<qlm_cuda_blocks((long)EMB_BUCKETS * a.dim, THREADS), THREADS, 0, qlm_cuda_stream>>>(
        a.dtable, a.dout, a.ids, a.n, a.dim);
}

void qlm_cuda_embedding_backward(float *dtable, const float *dout, const int *ids, int n, int dim) {
    if (n <= 0 || dim <= 0) return;
    embedding_backward_args a;
    memset(&a, 0, sizeof a);
    a.dtable = dtable, a.dout = dout, a.n = n, a.dim = dim;
    a.ids = qlm_cuda_ints_of(ids, n, 0);
    qlm_cuda_submit("embedding_backward", launch_embedding_backward, &a, sizeof a);
}

// ---- cross_entropy ----

// A block per row: the CPU's steps and formulas, with its double sums as double block sums.
__global__ void __launch_bounds__(THREADS) cross_entropy_kernel(float *row_loss, float *logits, qlm_cuda_ints targets,
                                                                const float *teacher, int vocab, float grad_scale,
                                                                float softcap) {
    __shared__ double dshared[WARPS];
    __shared__ float fshared[WARPS];
    const int i = blockIdx.x, target = qlm_ints_at(targets, i);
    float *l = logits + (size_t)i * vocab;
    if (target < 0) {
        for (int j = threadIdx.x; j < vocab; j += THREADS) l[j] = 0;
        if (threadIdx.x == 0) row_loss[i] = 0;
        return;
    }
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < vocab; j += THREADS) {
        float v = l[j];
        if (softcap > 0) l[j] = v = qlm_softcapped(v, softcap);
        mx = fmaxf(mx, v);
    }
    mx = block_reduce(mx, fshared, max_op());
    // Read before the block's barrier below, after which the target's thread overwrites it.
    const float l_target = l[target];
    double sum = 0;
    for (int j = threadIdx.x; j < vocab; j += THREADS) sum += exp((double)(l[j] - mx));
    sum = block_reduce(sum, dshared, sum_op());
    const double log_sum = log(sum);
    const float inv = (float)(1.0 / sum);
    const float *t = teacher ? teacher + (size_t)i * vocab : NULL;
    float t_mx = -INFINITY;
    double t_log_sum = 0, kl = 0;
    if (t) {
        for (int j = threadIdx.x; j < vocab; j += THREADS) t_mx = fmaxf(t_mx, qlm_softcapped(t[j], softcap));
        t_mx = block_reduce(t_mx, fshared, max_op());
        double t_sum = 0;
        for (int j = threadIdx.x; j < vocab; j += THREADS) t_sum += exp((double)(qlm_softcapped(t[j], softcap) - t_mx));
        t_log_sum = log(block_reduce(t_sum, dshared, sum_op()));
    }
    for (int j = threadIdx.x; j < vocab; j += THREADS) {
        double log_pt = t ? (double)(qlm_softcapped(t[j], softcap) - t_mx) - t_log_sum : 0;
        l[j] = qlm_cross_entropy_grad(l[j], mx, inv, log_sum, grad_scale, softcap, t != NULL, log_pt, j == target, &kl);
    }
    if (t) kl = block_reduce(kl, dshared, sum_op());
    if (threadIdx.x == 0) row_loss[i] = t ? (float)kl : (float)(log_sum - (double)(l_target - mx));
}

struct cross_entropy_args {
    float *row_loss, *logits;
    const float *teacher;
    qlm_cuda_ints targets;
    int n, vocab;
    float grad_scale, softcap;
};

static void launch_cross_entropy(const void *p) {
    const cross_entropy_args &a = *(const cross_entropy_args *)p;
    cross_entropy_kernel<<<a.n, THREADS, 0, qlm_cuda_stream>>>(a.row_loss, a.logits, a.targets, a.teacher, a.vocab,
                                                               a.grad_scale, a.softcap);
}

void qlm_cuda_cross_entropy(float *row_loss, float *logits, const int *targets, const float *teacher, int n, int vocab,
                            float grad_scale, float softcap) {
    if (n <= 0 || vocab <= 0) return;
    cross_entropy_args a;
    memset(&a, 0, sizeof a);
    a.row_loss = row_loss, a.logits = logits, a.teacher = teacher, a.n = n, a.vocab = vocab;
    a.grad_scale = grad_scale, a.softcap = softcap;
    a.targets = qlm_cuda_ints_of(targets, n, 0);
    qlm_cuda_submit("cross_entropy", launch_cross_entropy, &a, sizeof a);
}

// ---- tensor lists ----

// The list ops (sum_squares, adamw) take a step's hundreds of tensors in one launch: the grid is
// every tensor's blocks one after another, each block finds its tensor in a staged table by a
// binary search over the tensors' first blocks, and works on that tensor alone, as a launch per
// tensor would. A table holds up to LIST_MAX tensors (longer lists take a launch per LIST_MAX).
enum { LIST_MAX = 4096 };

// The last of count tensors whose first block is at most b (tensors without blocks are passed over).
template <typename T> __device__ int list_find(const T *t, int count, long b) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (t[mid].first_block <= b) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// ---- sum_squares ----

// Array j's squares are summed in double by ss_blocks(n[j]) blocks over grid-stride shares, then its
// partials by one block, in a fixed order: the partition depends on n alone, so the sums repeat
// bit for bit on any device. Every array's blocks are one launch, then one for the partials, then
// the one wait for all the sums (a gradient norm over hundreds of LoRA tensors waits once a step).
enum { SS_MAX_BLOCKS = 1024, SS_PER_THREAD = 16 };

static __host__ __device__ int ss_blocks(long n) {
    if (n <= 0) return 0;
    const long b = (n + (long)THREADS * SS_PER_THREAD - 1) / ((long)THREADS * SS_PER_THREAD);
    return b < SS_MAX_BLOCKS ? (int)b : SS_MAX_BLOCKS;
}

struct ss_array {
    const float *x;
    long n;
    long first_block; // in this launch's grid, and its first partial past the launch's
};

__global__ void __launch_bounds__(THREADS) sum_squares_kernel(double *partial, const ss_array *arrays, int count) {
    __shared__ double shared[WARPS];
    const ss_array &a = arrays[list_find(arrays, count, blockIdx.x)];
    const long block = blockIdx.x - a.first_block, blocks = ss_blocks(a.n);
    double s = 0;
    for (long i = block * THREADS + threadIdx.x; i < a.n; i += blocks * THREADS) s += (double)a.x[i] * a.x[i];
    s = block_reduce(s, shared, sum_op());
    if (threadIdx.x == 0) partial[a.first_block + block] = s;
}

// out[j] = the sum of partials first[j] .. first[j + 1] - 1 (block j).
__global__ void __launch_bounds__(THREADS) sum_partials_kernel(double *out, const double *partial, qlm_cuda_ints first) {
    __shared__ double shared[WARPS];
    const int end = qlm_ints_at(first, blockIdx.x + 1);
    double s = 0;
    for (int i = qlm_ints_at(first, blockIdx.x) + threadIdx.x; i < end; i += THREADS) s += partial[i];
    s = block_reduce(s, shared, sum_op());
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

struct sum_squares_args {
    double *partial;
    const ss_array *arrays;
    int count, blocks;
};

static void launch_sum_squares(const void *p) {
    const sum_squares_args &a = *(const sum_squares_args *)p;
    sum_squares_kernel<<<a.blocks, THREADS, 0, qlm_cuda_stream>>>(a.partial, a.arrays, a.count);
    LAUNCH_CHECK();
}

struct sum_partials_args {
    double *out;
    const double *partial;
    qlm_cuda_ints first;
    int count;
};

static void launch_sum_partials(const void *p) {
    const sum_partials_args &a = *(const sum_partials_args *)p;
    sum_partials_kernel<<<a.count, THREADS, 0, qlm_cuda_stream>>>(a.out, a.partial, a.first);
    LAUNCH_CHECK();
}

static void *g_sums;
static size_t g_sums_cap;
static int *g_first;
static int g_first_cap;
static ss_array g_ss_table[LIST_MAX]; // the host table a launch's is staged from (under the op table's lock)

void qlm_cuda_sum_squares(double *out, const float *const *x, const long *n, int count) {
    if (count <= 0) return;
    if (count + 1 > g_first_cap) {
        int *f = (int *)realloc(g_first, (size_t)(count + 1) * sizeof *f);
        if (!f) qlm_cuda_fail("sum_squares", "out of host memory for the arrays' offsets", __FILE__, __LINE__);
        g_first = f, g_first_cap = count + 1;
    }
    g_first[0] = 0;
    for (int j = 0; j < count; j++) g_first[j + 1] = g_first[j] + ss_blocks(n[j]);
    // The count sums, then every array's partials.
    double *sums = (double *)qlm_cuda_scratch(&g_sums, &g_sums_cap, ((size_t)count + g_first[count]) * sizeof(double));
    ss_array *table = g_ss_table;
    for (int j0 = 0; j0 < count; j0 += LIST_MAX) {
        const int k = count - j0 < LIST_MAX ? count - j0 : LIST_MAX;
        for (int j = 0; j < k; j++) {
            ss_array &t = table[j];
            memset(&t, 0, sizeof t);
            t.x = x[j0 + j], t.n = n[j0 + j], t.first_block = g_first[j0 + j] - g_first[j0];
        }
        sum_squares_args a;
        memset(&a, 0, sizeof a);
        a.partial = sums + count + g_first[j0], a.count = k, a.blocks = g_first[j0 + k] - g_first[j0];
        if (a.blocks == 0) continue;
        a.arrays = (const ss_array *)qlm_cuda_stage(table, (size_t)k * sizeof *table, 0);
        qlm_cuda_submit("sum_squares", launch_sum_squares, &a, sizeof a);
    }
    sum_partials_args a;
    memset(&a, 0, sizeof a);
    a.out = sums, a.partial = sums + count, a.count = count;
    a.first = qlm_cuda_ints_of(g_first, count + 1, 1);
    qlm_cuda_submit("sum_squares", launch_sum_partials, &a, sizeof a);
    qlm_cuda_flush();
    CUDA_CHECK(cudaMemcpyAsync(out, sums, (size_t)count * sizeof *out, cudaMemcpyDeviceToHost, qlm_cuda_stream));
    CUDA_CHECK(cudaStreamSynchronize(qlm_cuda_stream));
}

// ---- dropout ----

// The seed changes every step; staged like an index array it leaves the launch's arguments the
// same from step to step, so a LoRA step with dropout is replayed from its graph.
__global__ void dropout_kernel(float *out, const float *x, long n, qlm_cuda_ints base, uint64_t threshold, long first,
                               float keep_scale) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint64_t b = (uint64_t)(unsigned)qlm_ints_at(base, 1) << 32 | (unsigned)qlm_ints_at(base, 0);
    out[i] = qlm_dropout_drops(b, first + i, threshold) ? 0.0f : x[i] * keep_scale;
}

struct dropout_args {
    float *out;
    const float *x;
    long n, first;
    uint64_t threshold;
    float keep_scale;
    qlm_cuda_ints base;
};

static void launch_dropout(const void *p) {
    const dropout_args &a = *(const dropout_args *)p;
    dropout_kernel<<<qlm_cuda_blocks(a.n, THREADS), THREADS, 0, qlm_cuda_stream>>>(a.out, a.x, a.n, a.base, a.threshold,
                                                                                  a.first, a.keep_scale);
}

void qlm_cuda_dropout(float *out, const float *x, long n, float p, uint64_t seed, long first) {
    if (n <= 0) return;
    dropout_args a;
    memset(&a, 0, sizeof a);
    a.out = out, a.x = x, a.n = n, a.first = first;
    a.threshold = qlm_dropout_threshold(p);
    a.keep_scale = 1.0f / (1.0f - p);
    const uint64_t base = qlm_mix64(seed);
    const int halves[2] = {(int)(unsigned)(base & 0xffffffffu), (int)(unsigned)(base >> 32)};
    a.base = qlm_cuda_ints_of(halves, 2, 0);
    qlm_cuda_submit("dropout", launch_dropout, &a, sizeof a);
}

// ---- adamw ----

// Every tensor of the list in one launch, ADAMW_CHUNK values a block.
enum { ADAMW_CHUNK = THREADS * 8 };

struct adamw_tensor {
    float *p, *m, *v;
    const float *g;
    long n;
    long first_block;
    float decay; // 1 - lr * weight_decay, or 1 for a tensor without decay
};

struct adamw_args {
    const adamw_tensor *tensors;
    int count;
    long blocks;
    qlm_adamw_consts c;
};

// The CPU's operations in its order, each rounded on its own (no FMA contraction): the same bits.
__global__ void __launch_bounds__(THREADS) adamw_kernel(adamw_args a) {
    const adamw_tensor &t = a.tensors[list_find(a.tensors, a.count, blockIdx.x)];
    const qlm_adamw_consts &c = a.c;
    const long start = (blockIdx.x - t.first_block) * (long)ADAMW_CHUNK;
    const long end = start + ADAMW_CHUNK < t.n ? start + ADAMW_CHUNK : t.n;
    for (long i = start + threadIdx.x; i < end; i += THREADS) {
        const float g = __fmul_rn(t.g[i], c.grad_mul);
        const float p = __fmul_rn(t.p[i], t.decay);
        const float m = __fadd_rn(t.m[i], __fmul_rn(c.one_minus_b1, __fsub_rn(g, t.m[i])));
        const float v = __fadd_rn(__fmul_rn(t.v[i], c.b2), __fmul_rn(__fmul_rn(c.one_minus_b2, g), g));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
        t.p[i] = __fsub_rn(p, __fdiv_rn(__fmul_rn(c.step_size, m), denom));
        t.m[i] = m;
        t.v[i] = v;
    }
}

static void launch_adamw(const void *p) {
    const adamw_args &a = *(const adamw_args *)p;
    adamw_kernel<<<(unsigned)a.blocks, THREADS, 0, qlm_cuda_stream>>>(a);
    LAUNCH_CHECK();
}

static adamw_tensor g_adamw_table[LIST_MAX];

void qlm_cuda_adamw(const qlm_adamw_tensors *l, const qlm_adamw_step *h) {
    adamw_tensor *table = g_adamw_table;
    const qlm_adamw_consts c = qlm_adamw_constants(h, 1);
    for (int j0 = 0; j0 < l->count; j0 += LIST_MAX) {
        const int k = l->count - j0 < LIST_MAX ? l->count - j0 : LIST_MAX;
        long blocks = 0;
        for (int j = 0; j < k; j++) {
            adamw_tensor &t = table[j];
            memset(&t, 0, sizeof t);
            t.p = l->p[j0 + j], t.m = l->m[j0 + j], t.v = l->v[j0 + j], t.g = l->g[j0 + j], t.n = l->n[j0 + j];
            t.first_block = blocks;
            t.decay = l->decay[j0 + j] ? c.decay : 1.0f;
            blocks += (t.n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
        }
        if (blocks == 0) continue;
        adamw_args a;
        memset(&a, 0, sizeof a);
        a.count = k, a.blocks = blocks, a.c = c;
        a.tensors = (const adamw_tensor *)qlm_cuda_stage(table, (size_t)k * sizeof *table, 0);
        qlm_cuda_submit("adamw", launch_adamw, &a, sizeof a);
    }
}

// ---- store_weight ----

// F32 to BF16 or F16, rounded to nearest even.
__global__ void narrow_kernel(void *out, const float *src, long n, int bf16) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    ((unsigned short *)out)[i] = bf16 ? qlm_f32_to_bf16(src[i]) : qlm_f32_to_f16(src[i]);
}

struct store_weight_args {
    void *dst;
    const float *src;
    long n;
    int dtype;
};

static void launch_store_weight(const void *p) {
    const store_weight_args &a = *(const store_weight_args *)p;
    if (a.dtype == QLM_F32)
        CUDA_CHECK(cudaMemcpyAsync(a.dst, a.src, (size_t)a.n * sizeof(float), cudaMemcpyDeviceToDevice, qlm_cuda_stream));
    else
        narrow_kernel<<<qlm_cuda_blocks(a.n, THREADS), THREADS, 0, qlm_cuda_stream>>>(a.dst, a.src, a.n,
                                                                                     a.dtype == QLM_BF16);
}

void qlm_cuda_store_weight(qlm_weight *w, const float *src) {
    if (w->dtype != QLM_F32 && w->dtype != QLM_BF16 && w->dtype != QLM_F16)
        qlm_cuda_fail("store_weight", "the weight is not F32, BF16 or F16", __FILE__, __LINE__);
    long n = (long)w->rows * w->cols;
    if (n <= 0) return;
    store_weight_args a;
    memset(&a, 0, sizeof a);
    a.dst = (void *)w->data, a.src = src, a.n = n, a.dtype = w->dtype;
    qlm_cuda_submit("store_weight", launch_store_weight, &a, sizeof a);
}
