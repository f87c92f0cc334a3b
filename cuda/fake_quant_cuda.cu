// QAT's fake quantization on the GPU: the ops of quant/fake_quant.c, whose formulas (and comments)
// these kernels follow. Each value's forward and gradient terms are the CPU's operations in its
// order and rounding (_rn intrinsics, so nvcc contracts nothing into an FMA), so out and dw are the
// same bits. A scale's gradient is its terms summed in double in an order fixed by the shape (not
// the CPU's chunks, so the two agree within double rounding), without atomics: it repeats bit for
// bit from run to run.
#include <string.h>

#include "cuda_internal.h"

extern "C" {
#include "../quant/fake_quant.h"
}

enum { THREADS = 256, WARPS = THREADS / 32 };
// Blocks that share a per-tensor scale gradient; their partial sums are then added by one block.
enum { FQ_BLOCKS = 1024 };

// q = round(w * (1/s)), halves to even (rintf, as the CPU's nearbyintf in the default mode).
static __device__ __forceinline__ float fq_round(float w, float inv) { return rintf(__fmul_rn(w, inv)); }

__global__ void fake_quant_forward_kernel(float *out, const float *w, long n, int cols, const float *scales,
                                          int per_row, float lo, float hi) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float s = scales[per_row ? i / cols : 0], inv = __fdiv_rn(1.0f, s);
    float q = __fadd_rn(fq_round(w[i], inv), 0.0f); // -0 -> +0, as the CPU (torch goes through int64)
    if (q < lo) q = lo;
    else if (q > hi) q = hi;
    out[i] = __fmul_rn(q, s);
}

// Value i's scale-gradient term, adding dout[i] to dw[i] where q is inside: the CPU's backward_span.
static __device__ __forceinline__ float fq_term(float *dw, const float *dout, const float *w, long i, float s,
                                                float inv, float lo, float hi, float gf) {
    const float g = dout[i], q = fq_round(w[i], inv);
    if (q < lo) return __fmul_rn(__fmul_rn(g, lo), gf);
    if (q > hi) return __fmul_rn(__fmul_rn(g, hi), gf);
    if (dw) dw[i] = __fadd_rn(dw[i], g);
    // q*s - w rounded once, computed as the CPU computes it (in double, where it is exact).
    const float d = __double2float_rn(__dsub_rn(__dmul_rn((double)q, (double)s), (double)w[i]));
    return __fmul_rn(__fmul_rn(__fmul_rn(g, d), inv), gf);
}

// A double summed over a block of THREADS threads in a fixed order: the warps' sums, in warp order.
static __device__ double block_sum(double v) {
    __shared__ double part[WARPS];
    v = qlm_warp_sum(v);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    double total = 0;
    for (int k = 0; k < WARPS; k++) total += part[k];
    return total;
}

// Per-row scales: a warp per row, each lane summing every 32nd term, then the warp's sum.
__global__ void __launch_bounds__(THREADS) fake_quant_backward_rows_kernel(float *dw, float *dscales,
                                                                           const float *dout, const float *w, int rows,
                                                                           int cols, const float *scales, float lo,
                                                                           float hi, float gf) {
    const int r = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return; // the whole warp: r is the warp's
    const long o = (long)r * cols;
    const float s = scales[r], inv = __fdiv_rn(1.0f, s);
    double sum = 0;
    for (int c = lane; c < cols; c += 32) sum += fq_term(dw, dout, w, o + c, s, inv, lo, hi, gf);
    sum = qlm_warp_sum(sum);
    if (lane == 0 && dscales) dscales[r] = __fadd_rn(dscales[r], __double2float_rn(sum));
}

// One scale for all n values: FQ_BLOCKS blocks sum grid-stride shares into partial[block].
__global__ void __launch_bounds__(THREADS) fake_quant_backward_tensor_kernel(float *dw, double *partial,
                                                                             const float *dout, const float *w, long n,
                                                                             const float *scales, float lo, float hi,
                                                                             float gf) {
    const float s = scales[0], inv = __fdiv_rn(1.0f, s);
    double sum = 0;
    for (long i = (long)blockIdx.x * THREADS + threadIdx.x; i < n; i += (long)gridDim.x * THREADS)
        sum += fq_term(dw, dout, w, i, s, inv, lo, hi, gf);
    sum = block_sum(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// dscale[0] += the FQ_BLOCKS partials, summed by one block in a fixed order.
__global__ void __launch_bounds__(THREADS) add_partials_kernel(float *dscale, const double *partial) {
    double sum = 0;
    for (int b = threadIdx.x; b < FQ_BLOCKS; b += THREADS) sum += partial[b];
    sum = block_sum(sum);
    if (threadIdx.x == 0) dscale[0] = __fadd_rn(dscale[0], __double2float_rn(sum));
}

__global__ void clamp_scales_kernel(float *scales, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && !(scales[i] >= QLM_FAKE_QUANT_MIN_SCALE)) scales[i] = QLM_FAKE_QUANT_MIN_SCALE;
}

struct fake_quant_args {
    float *out, *dw, *dscales;
    double *partial; // per-tensor backward: FQ_BLOCKS partial sums
    const float *w, *dout, *scales;
    long n;
    int rows, cols, per_row;
    float lo, hi, gf;
};

static void launch_forward(const void *p) {
    const fake_quant_args &a = *(const fake_quant_args *)p;
    fake_quant_forward_kernel<<<qlm_cuda_blocks(a.n, THREADS), THREADS, 0, qlm_cuda_stream>>>(
        a.out, a.w, a.n, a.cols, a.scales, a.per_row, a.lo, a.hi);
}

static void launch_backward(const void *p) {
    const fake_quant_args &a = *(const fake_quant_args *)p;
    if (a.per_row) {
        fake_quant_backward_rows_kernel<<<qlm_cuda_blocks(a.rows, WARPS), THREADS, 0, qlm_cuda_stream>>>(
            a.dw, a.dscales, a.dout, a.w, a.rows, a.cols, a.scales, a.lo, a.hi, a.gf);
        return;
    }
    fake_quant_backward_tensor_kernel<<<FQ_BLOCKS, THREADS, 0, qlm_cuda_stream>>>(a.dw, a.partial, a.dout, a.w, a.n,
                                                                                  a.scales, a.lo, a.hi, a.gf);
    if (!a.dscales) return;
    LAUNCH_CHECK();
    add_partials_kernel<<<1, THREADS, 0, qlm_cuda_stream>>>(a.dscales, a.partial);
}

static void launch_clamp_scales(const void *p) {
    const fake_quant_args &a = *(const fake_quant_args *)p;
    clamp_scales_kernel<<<qlm_cuda_blocks(a.n, THREADS), THREADS, 0, qlm_cuda_stream>>>(a.out, a.n);
}

void qlm_cuda_fake_quant_forward(float *out, const float *w, int rows, int cols, const float *scales, int per_row,
                                 int qmin, int qmax) {
    long n = (long)rows * cols;
    if (n <= 0) return;
    fake_quant_args a;
    memset(&a, 0, sizeof a);
    a.out = out, a.w = w, a.scales = scales, a.n = n, a.rows = rows, a.cols = cols, a.per_row = per_row != 0;
    a.lo = (float)qmin, a.hi = (float)qmax;
    qlm_cuda_submit("fake_quant_forward", launch_forward, &a, sizeof a);
}

static void *g_partial;
static size_t g_partial_cap;

void qlm_cuda_fake_quant_backward(float *dw, float *dscales, const float *dout, const float *w, int rows, int cols,
                                  const float *scales, int per_row, int qmin, int qmax, float grad_factor) {
    long n = (long)rows * cols;
    if (n <= 0) return;
    fake_quant_args a;
    memset(&a, 0, sizeof a);
    a.dw = dw, a.dscales = dscales, a.dout = dout, a.w = w, a.scales = scales, a.n = n, a.rows = rows, a.cols = cols;
    a.per_row = per_row != 0, a.lo = (float)qmin, a.hi = (float)qmax, a.gf = grad_factor;
    if (!a.per_row)
        a.partial = (double *)qlm_cuda_scratch(&g_partial, &g_partial_cap, FQ_BLOCKS * sizeof(double));
    qlm_cuda_submit("fake_quant_backward", launch_backward, &a, sizeof a);
}

void qlm_cuda_fake_quant_clamp_scales(float *scales, long n) {
    if (n <= 0) return;
    fake_quant_args a;
    memset(&a, 0, sizeof a);
    a.out = scales, a.n = n;
    qlm_cuda_submit("fake_quant_clamp_scales", launch_clamp_scales, &a, sizeof a);
}
