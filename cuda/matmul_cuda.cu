// y = x W^T on the GPU. Up to GEMV_MAX_ROWS rows of x (decode) take a GEMV kernel that streams the
// weights once in their storage dtype, a warp per output row, with F32 products and sums (x rounded
// to BF16 for BF16 and INT8 weights, as on the cuBLAS path); one launch serves a whole matmul_group. More rows (prefill, batches) go through cuBLAS: F32 weights
// as SGEMM (no TF32), BF16 as a BF16 GEMM with x rounded to BF16 and F32 accumulation, INT8 as
// exact BF16 copies of the integers (|q| <= 127 fits BF16's 8-bit significand) in a BF16 GEMM
// with the scales applied after, F16 widened to F32 for SGEMM (F16 x could overflow on T5).
#include <string.h>

#include "cuda_internal.h"

enum { GEMV_MAX_ROWS = 8, GEMV_WARPS = 8, GROUP_MAX = 4 };

struct gemv_part {
    const void *w;
    float *y;
    const float *bias, *row_scales;
    float scale;
    int rows;
};

struct gemv_args {
    gemv_part part[GROUP_MAX];
    int start[GROUP_MAX + 1]; // first global row of each part
    int count, cols, vec;     // vec: every row starts 16-byte aligned and cols fills whole vectors
    int dtype, n;
    const float *x;
};

template <int DT> struct wtraits;
template <> struct wtraits<QLM_F32> { static constexpr int size = 4; };
template <> struct wtraits<QLM_F16> { static constexpr int size = 2; };
template <> struct wtraits<QLM_BF16> { static constexpr int size = 2; };
template <> struct wtraits<QLM_I8> { static constexpr int size = 1; };

template <int DT> __device__ __forceinline__ float w_scalar(const void *row, int c) {
    if (DT == QLM_F32) return ((const float *)row)[c];
    if (DT == QLM_F16) return __half2float(((const __half *)row)[c]);
    if (DT == QLM_BF16) return qlm_bf16_to_f32(((const unsigned short *)row)[c]);
    return (float)((const signed char *)row)[c];
}

// 16 bytes of weights as floats (4, 8 or 16 of them).
template <int DT> __device__ __forceinline__ void w_unpack(uint4 raw, float *f) {
    const unsigned u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (DT == QLM_F32) {
            f[k] = __uint_as_float(u[k]);
        } else if (DT == QLM_BF16) {
            f[2 * k] = __uint_as_float(u[k] << 16);
            f[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
        } else if (DT == QLM_F16) {
            __half2 h2 = *reinterpret_cast<const __half2 *>(&u[k]);
            float2 v = __half22float2(h2);
            f[2 * k] = v.x;
            f[2 * k + 1] = v.y;
        } else {
            // Each byte, its sign bit flipped (q + 128), becomes the low mantissa byte of 2^23;
            // subtracting 2^23 + 128 leaves q exactly: a byte permute and an add per value
            // instead of a slow integer-to-float conversion.
            const unsigned biased = u[k] ^ 0x80808080u;
#pragma unroll
            for (int b = 0; b < 4; b++) f[4 * k + b] = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7440 + b)) - 8388736.0f;
        }
    }
}

template <int DT, int NR>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_kernel(gemv_args a) {
    constexpr int V = 16 / wtraits<DT>::size;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (row >= a.start[a.count]) return;
    int k = 0;
    while (row >= a.start[k + 1]) k++;
    const gemv_part &P = a.part[k];
    const int r = row - a.start[k], cols = a.cols;
    const char *wrow = (const char *)P.w + (size_t)r * cols * wtraits<DT>::size;
    float acc[NR];
#pragma unroll
    for (int j = 0; j < NR; j++) acc[j] = 0;
    if (a.vec) {
        // U vectors per lane in flight before any is used: the loads, not the arithmetic, are the cost.
        constexpr int U = 4;
        for (int c0 = lane * V; c0 < cols; c0 += 32 * V * U) {
            uint4 raw[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                int c = c0 + u * 32 * V;
                raw[u] = c < cols ? __ldcs((const uint4 *)(wrow + (size_t)c * wtraits<DT>::size)) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                int c = c0 + u * 32 * V;
                if (c >= cols) break;
                float wf[V];
                w_unpack<DT>(raw[u], wf);
#pragma unroll
                for (int j = 0; j < NR; j++) {
                    const float4 *xr = (const float4 *)(a.x + (size_t)j * cols + c);
#pragma unroll
                    for (int v = 0; v < V / 4; v++) {
                        float4 xv = __ldg(xr + v);
                        if (DT == QLM_BF16 || DT == QLM_I8)
                            xv = make_float4(qlm_bf16_round(xv.x), qlm_bf16_round(xv.y), qlm_bf16_round(xv.z),
                                             qlm_bf16_round(xv.w));
                        acc[j] += wf[4 * v] * xv.x + wf[4 * v + 1] * xv.y + wf[4 * v + 2] * xv.z + wf[4 * v + 3] * xv.w;
                    }
                }
            }
        }
    } else {
        for (int c = lane; c < cols; c += 32) {
            float wv = w_scalar<DT>(wrow, c);
#pragma unroll
            for (int j = 0; j < NR; j++) {
                float xv = a.x[(size_t)j * cols + c];
                acc[j] += wv * (DT == QLM_BF16 || DT == QLM_I8 ? qlm_bf16_round(xv) : xv);
            }
        }
    }
    const float s = DT == QLM_I8 ? (P.row_scales ? P.row_scales[r] : P.scale) : 1.0f;
    const float b = P.bias ? P.bias[r] : 0.0f;
#pragma unroll
    for (int j = 0; j < NR; j++) {
        float v = acc[j];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) P.y[(size_t)j * P.rows + r] = v * s + b;
    }
}

template <int DT>
static void gemv_launch_rows(const gemv_args &a, unsigned blocks) {
    switch (a.n) {
#define CASE(R) \
    case R: gemv_kernel<DT, R><<<blocks, GEMV_WARPS * 32, 0, qlm_cuda_stream>>>(a); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    }
}

static void launch_gemv(const void *p) {
    const gemv_args &a = *(const gemv_args *)p;
    unsigned blocks = qlm_cuda_blocks(a.start[a.count], GEMV_WARPS);
    switch (a.dtype) {
    case QLM_F32: gemv_launch_rows<QLM_F32>(a, blocks); break;
    case QLM_F16: gemv_launch_rows<QLM_F16>(a, blocks); break;
    case QLM_BF16: gemv_launch_rows<QLM_BF16>(a, blocks); break;
    default: gemv_launch_rows<QLM_I8>(a, blocks); break;
    }
}

// One launch for count (<= GROUP_MAX) weights of one dtype and width multiplying the same x.
static void gemv(const qlm_matmul_out *outs, int count, const float *x, int n) {
    gemv_args a;
    memset(&a, 0, sizeof a);
    const qlm_weight *w0 = outs[0].w;
    a.dtype = w0->dtype;
    a.n = n;
    const int esize = (int)qlm_dtype_size(w0->dtype);
    a.count = count;
    a.cols = w0->cols;
    a.x = x;
    a.vec = ((size_t)w0->cols * esize) % 16 == 0 && (uintptr_t)x % 16 == 0;
    a.start[0] = 0;
    for (int k = 0; k < count; k++) {
        const qlm_weight *w = outs[k].w;
        a.part[k].w = w->data;
        a.part[k].y = outs[k].y;
        a.part[k].bias = outs[k].bias;
        a.part[k].row_scales = w->row_scales;
        a.part[k].scale = w->scale;
        a.part[k].rows = w->rows;
        a.start[k + 1] = a.start[k] + w->rows;
        a.vec = a.vec && (uintptr_t)w->data % 16 == 0;
    }
    qlm_cuda_submit(a.n == 1 ? "gemv" : "gemv (2-8 rows)", launch_gemv, &a, sizeof a);
}

// ---- many rows: cuBLAS ----

static void *g_xconv, *g_wconv;
static size_t g_xconv_cap, g_wconv_cap;
// Rows of a converted weight chunk: at most this many elements at a time.
enum { WCONV_ELEMS = 32 << 20 };

__global__ void to_bf16_kernel(unsigned short *out, const float *x, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = qlm_f32_to_bf16(x[i]);
}

// Rows [0, rows) of an INT8 weight as BF16 (exact), or of an F16 one as F32 (exact).
__global__ void widen_kernel(void *out, const void *w, int dt, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (dt == QLM_I8)
        ((__nv_bfloat16 *)out)[i] = __float2bfloat16_rn((float)((const signed char *)w)[i]);
    else
        ((float *)out)[i] = __half2float(((const __half *)w)[i]);
}

// y[j][r] = y[j][r] * row_scales[r] + bias[r], either part absent.
__global__ void epilogue_kernel(float *y, int n, int rows, const float *row_scales, const float *bias) {
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long)n * rows) return;
    int r = (int)(t % rows);
    float v = y[t];
    if (row_scales) v *= row_scales[r];
    if (bias) v += bias[r];
    y[t] = v;
}

// Y (col-major rows x n, ld rows) = alpha W^T X for a row-major W [rows][cols] of type wt and
// X [n][cols] of type xt.
static void gemm(float *y, int ldy, const void *w, cudaDataType wt, const void *x, cudaDataType xt, int rows, int n,
                 int cols, float alpha) {
    const float beta = 0;
    CUBLAS_CHECK(cublasGemmEx(qlm_cuda_blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &alpha, w, wt, cols, x, xt, cols,
                              &beta, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

struct gemm_args {
    float *y;
    const float *x, *bias;
    qlm_weight w;
    void *xb, *wconv; // scratch: x as BF16, a chunk of converted weight rows
    int n, chunk;
};

static void launch_gemm(const void *p) {
    const gemm_args &a = *(const gemm_args *)p;
    const qlm_weight *w = &a.w;
    const int rows = w->rows, cols = w->cols, n = a.n;
    const float *row_scales = NULL;
    if (w->dtype == QLM_F32) {
        gemm(a.y, rows, w->data, CUDA_R_32F, a.x, CUDA_R_32F, rows, n, cols, 1.0f);
    } else if (w->dtype == QLM_BF16 || w->dtype == QLM_I8) {
        long nx = (long)n * cols;
        to_bf16_kernel<<<qlm_cuda_blocks(nx, 256), 256, 0, qlm_cuda_stream>>>((unsigned short *)a.xb, a.x, nx);
        LAUNCH_CHECK();
        if (w->dtype == QLM_BF16) {
            gemm(a.y, rows, w->data, CUDA_R_16BF, a.xb, CUDA_R_16BF, rows, n, cols, 1.0f);
        } else {
            for (int r0 = 0; r0 < rows; r0 += a.chunk) {
                int rc = rows - r0 < a.chunk ? rows - r0 : a.chunk;
                long ne = (long)rc * cols;
                widen_kernel<<<qlm_cuda_blocks(ne, 256), 256, 0, qlm_cuda_stream>>>(
                    a.wconv, (const signed char *)w->data + (size_t)r0 * cols, QLM_I8, ne);
                LAUNCH_CHECK();
                gemm(a.y + r0, rows, a.wconv, CUDA_R_16BF, a.xb, CUDA_R_16BF, rc, n, cols, w->row_scales ? 1.0f : w->scale);
            }
            row_scales = w->row_scales;
        }
    } else {
        for (int r0 = 0; r0 < rows; r0 += a.chunk) {
            int rc = rows - r0 < a.chunk ? rows - r0 : a.chunk;
            long ne = (long)rc * cols;
            widen_kernel<<<qlm_cuda_blocks(ne, 256), 256, 0, qlm_cuda_stream>>>(
                a.wconv, (const __half *)w->data + (size_t)r0 * cols, QLM_F16, ne);
            LAUNCH_CHECK();
            gemm(a.y + r0, rows, a.wconv, CUDA_R_32F, a.x, CUDA_R_32F, rc, n, cols, 1.0f);
        }
    }
    if (row_scales || a.bias) {
        long ny = (long)n * rows;
        epilogue_kernel<<<qlm_cuda_blocks(ny, 256), 256, 0, qlm_cuda_stream>>>(a.y, n, rows, row_scales, a.bias);
    }
}

static void gemm_matmul(float *y, const float *x, int n, const qlm_weight *w, const float *bias) {
    gemm_args a;
    memset(&a, 0, sizeof a);
    a.y = y, a.x = x, a.bias = bias, a.w = *w, a.n = n;
    a.chunk = WCONV_ELEMS / w->cols > 0 ? WCONV_ELEMS / w->cols : 1;
    if (a.chunk > w->rows) a.chunk = w->rows;
    if (w->dtype == QLM_BF16 || w->dtype == QLM_I8)
        a.xb = qlm_cuda_scratch(&g_xconv, &g_xconv_cap, (size_t)n * w->cols * 2);
    if (w->dtype == QLM_I8 || w->dtype == QLM_F16)
        a.wconv = qlm_cuda_scratch(&g_wconv, &g_wconv_cap, (size_t)a.chunk * w->cols * (w->dtype == QLM_I8 ? 2 : 4));
    qlm_cuda_submit("gemm (cuBLAS)", launch_gemm, &a, sizeof a);
}

void qlm_cuda_matmul(float *y, const float *x, int n, const qlm_weight *w, const float *bias) {
    if (n <= 0 || w->rows <= 0) return;
    if (n > GEMV_MAX_ROWS) {
        gemm_matmul(y, x, n, w, bias);
        return;
    }
    const qlm_matmul_out one = {y, w, bias};
    gemv(&one, 1, x, n);
}

void qlm_cuda_matmul_group(const qlm_matmul_out *outs, int count, const float *x, int n) {
    if (n <= 0) return;
    for (int k = 0; k < count;) {
        // The longest run of weights that one GEMV launch can take together.
        int m = 1;
        while (n <= GEMV_MAX_ROWS && k + m < count && m < GROUP_MAX && outs[k + m].w->dtype == outs[k].w->dtype &&
               outs[k + m].w->cols == outs[k].w->cols)
            m++;
        if (n <= GEMV_MAX_ROWS)
            gemv(outs + k, m, x, n);
        else
            gemm_matmul(outs[k].y, x, n, outs[k].w, outs[k].bias);
        k += m;
    }
}
