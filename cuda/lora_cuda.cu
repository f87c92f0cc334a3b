// Unmerged LoRA on the GPU: the rows of a batch that share an adapter pair are gathered and take
// it together, u = A x (a warp per (row, rank)), then y += scale B u (a thread per (row, output)),
// so a batch that mixes adapters costs two launches per distinct pair, whatever its size.
#include <string.h>

#include "cuda_internal.h"

struct lora_args {
    float *y, *u; // u: scratch [m][r]
    const float *x;
    qlm_weight a, b;
    float scale;
    qlm_cuda_ints rows;
    int m;
};

__device__ __forceinline__ float lora_weight(const qlm_weight &w, long i) {
    return w.dtype == QLM_BF16 ? qlm_bf16_to_f32(((const unsigned short *)w.data)[i]) : ((const float *)w.data)[i];
}

__global__ void lora_down_kernel(lora_args a) {
    const int warp = (int)((blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    const int r = a.a.rows, in = a.a.cols;
    if (warp >= a.m * r) return;
    const int k = warp / r, j = warp % r;
    const float *xr = a.x + (size_t)qlm_ints_at(a.rows, k) * in;
    float sum = 0;
    const bool bf16 = a.a.dtype == QLM_BF16; // BF16 weights meet BF16 inputs, as in every matmul
    for (int c = lane; c < in; c += 32) sum += lora_weight(a.a, (long)j * in + c) * (bf16 ? qlm_bf16_round(xr[c]) : xr[c]);
    sum = qlm_warp_sum(sum);
    if (lane == 0) a.u[(size_t)k * r + j] = sum;
}

__global__ void lora_up_kernel(lora_args a) {
    const long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const int out = a.b.rows, r = a.b.cols;
    if (t >= (long)a.m * out) return;
    const int k = (int)(t / out), o = (int)(t % out);
    float sum = 0;
    const bool bf16 = a.b.dtype == QLM_BF16;
    for (int j = 0; j < r; j++) {
        float u = a.u[(size_t)k * r + j];
        sum += lora_weight(a.b, (long)o * r + j) * (bf16 ? qlm_bf16_round(u) : u);
    }
    a.y[(size_t)qlm_ints_at(a.rows, k) * out + o] += a.scale * sum;
}

static void launch_lora(const void *p) {
    const lora_args &a = *(const lora_args *)p;
    lora_down_kernel<<<qlm_cuda_blocks((long)a.m * a.a.rows * 32, 256), 256, 0, qlm_cuda_stream>>>(a);
    LAUNCH_CHECK();
    lora_up_kernel<<<qlm_cuda_blocks((long)a.m * a.b.rows, 256), 256, 0, qlm_cuda_stream>>>(a);
}

static int *g_rows;
static size_t g_rows_cap;
static void *g_u;
static size_t g_u_cap;

int qlm_cuda_lora(float *y, const float *x, int n, const qlm_lora_ref *const *per_row) {
    if ((size_t)n > g_rows_cap) {
        int *r = (int *)realloc(g_rows, (size_t)n * sizeof *r);
        if (!r) return qlm_errorf("out of memory for LoRA rows");
        g_rows = r;
        g_rows_cap = (size_t)n;
    }
    // Scratch for every pair's u at once: the queued launches of one call must not share it.
    size_t u_total = 0;
    for (int i = 0; i < n; i++)
        if (per_row[i]) u_total += (size_t)per_row[i]->a->rows;
    float *u = (float *)qlm_cuda_scratch(&g_u, &g_u_cap, (u_total ? u_total : 1) * sizeof(float));
    for (int i = 0; i < n; i++) {
        int m = qlm_lora_group(per_row, n, i, g_rows);
        if (m == 0) continue;
        const qlm_lora_ref *ref = per_row[i];
        lora_args a;
        memset(&a, 0, sizeof a);
        a.y = y, a.x = x, a.u = u, a.a = *ref->a, a.b = *ref->b, a.scale = ref->scale, a.m = m;
        a.rows = qlm_cuda_ints_of(g_rows, m, 3);
        qlm_cuda_submit("lora", launch_lora, &a, sizeof a);
        u += (size_t)m * ref->a->rows;
    }
    return 0;
}
