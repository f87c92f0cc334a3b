// The matmul's backward on the GPU, as cpu/backend_cpu_train.c computes it: dx = dy W and
// dw += dy^T x in F32. F32 weights (and dw) as cuBLAS SGEMMs in the default math mode (no TF32, so
// F32 sums as the CPU's); F16 weights widened to F32 a block of rows at a time for the same SGEMM.
// BF16 and INT8 weights are exact in BF16 (INT8's integers; their scales go into dy), so dx takes
// the BF16 tensor cores at F32's precision: dy (times the scales) is split into three BF16 planes,
// hi + mid + lo, each holding the next 8 bits of what the planes before left (exactly, as F32
// subtractions of nearby values are), dy to within 2^-24 of itself, and three BF16 GEMMs with F32
// sums add W^T lo, W^T mid, W^T hi into dx: the SGEMM's product to F32 rounding at several times
// its rate, without an F32 copy of the weights. cuBLAS is column-major: a row-major [r][c] matrix
// is its transpose there, [c][r] with leading dimension c.
#include <string.h>

#include "cuda_internal.h"

// Rows of a widened weight at a time: at most BLOCK_ROWS, and at most BLOCK_ELEMS values.
enum { BLOCK_ROWS = 4096, BLOCK_ELEMS = 16 << 20 };
// Values of dy split into planes at a time (rows of dy as many as fit).
enum { SPLIT_ELEMS = 16 << 20, PLANES = 3 };
// Values of dy and x rounded to BF16 at a time in matmul_backward_w (rows of both as many as fit).
enum { ROUNDED_ELEMS = 16 << 20 };

// out[t] = element t of rows r0.. of w as F32, over ne elements.
__global__ void widen_rows_kernel(float *out, qlm_weight w, int r0, long ne) {
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < ne) out[t] = qlm_weight_at(w, r0 + t / w.cols, t % w.cols);
}

// INT8 integers as BF16 (exact).
__global__ void i8_to_bf16_kernel(unsigned short *out, const signed char *q, long ne) {
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < ne) out[t] = qlm_f32_to_bf16((float)q[t]);
}

// The PLANES BF16 planes (plane elements apart) of v = dy[i][r0 + c] times weight row r0 + c's
// scale, for ne values of rows i of bc columns (dy's rows have `rows`); a value that is not finite
// stays whole in hi, and a finite one that BF16 rounds to Inf takes BF16's largest finite value
// there, the rest in the planes below (else hi - v would be Inf and the sum NaN).
__global__ void split_bf16_kernel(unsigned short *planes, long plane, const float *dy, long ne, int rows, int r0,
                                  int bc, const float *row_scales, float scale) {
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= ne) return;
    const int c = (int)(t % bc);
    float v = __fmul_rn(dy[t / bc * rows + r0 + c], row_scales ? row_scales[r0 + c] : scale);
    const bool finite = fabsf(v) < INFINITY;
#pragma unroll
    for (int p = 0; p < PLANES; p++) {
        unsigned short b = qlm_f32_to_bf16(v);
        if (finite && (b & 0x7fff) == 0x7f80) b -= 1; // 0x7f7f: 3.3895e38, with v's sign
        planes[p * plane + t] = b;
        v = finite ? __fsub_rn(v, qlm_bf16_to_f32(b)) : 0.0f;
    }
}

struct backward_x_args {
    float *dx;
    void *wf;              // scratch: block_rows widened rows (F16: F32; INT8: BF16)
    unsigned short *split; // scratch: dy's planes, split_rows rows of dy by block_rows columns (BF16, INT8)
    const float *dy;
    qlm_weight w;
    int n, accumulate, block_rows, split_rows;
};

// dx (col-major [cols][n]) = beta dx + k weight rows (block: [k][cols], of type t: F32 or BF16)
// times the same k columns of dy (col-major [k][n] at dy, leading dimension ld, of type t).
static void gemm_dx(float *dx, const void *dy, cudaDataType t, int ld, int n, int cols, const void *block, int k,
                    float beta) {
    const float one = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(qlm_cuda_blas, CUBLAS_OP_N, CUBLAS_OP_N, cols, n, k, &one, block, t, cols, dy, t, ld,
                              &beta, dx, CUDA_R_32F, cols, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Through the BF16 tensor cores (BF16 and INT8 weights): each block of weight rows (INT8: widened
// to BF16 once), against dy's columns of those rows split into planes split_rows rows at a time,
// lo first.
static void backward_x_bf16(const backward_x_args &a) {
    const int rows = a.w.rows, cols = a.w.cols;
    const bool i8 = a.w.dtype == QLM_I8;
    for (int r0 = 0; r0 < rows; r0 += a.block_rows) {
        const int bc = rows - r0 < a.block_rows ? rows - r0 : a.block_rows;
        const void *block = a.wf;
        if (i8) {
            const long nw = (long)bc * cols;
            i8_to_bf16_kernel<<<qlm_cuda_blocks(nw, 256), 256, 0, qlm_cuda_stream>>>(
                (unsigned short *)a.wf, (const signed char *)a.w.data + (size_t)r0 * cols, nw);
            LAUNCH_CHECK();
        } else {
            block = (const unsigned short *)a.w.data + (size_t)r0 * cols;
        }
        for (int i0 = 0; i0 < a.n; i0 += a.split_rows) {
            const int nc = a.n - i0 < a.split_rows ? a.n - i0 : a.split_rows;
            const long ne = (long)nc * bc, plane = (long)a.split_rows * a.block_rows;
            split_bf16_kernel<<<qlm_cuda_blocks(ne, 256), 256, 0, qlm_cuda_stream>>>(
                a.split, plane, a.dy + (size_t)i0 * rows, ne, rows, r0, bc, i8 ? a.w.row_scales : NULL,
                i8 ? a.w.scale : 1.0f);
            LAUNCH_CHECK();
            for (int p = PLANES - 1; p >= 0; p--)
                gemm_dx(a.dx + (size_t)i0 * cols, a.split + p * plane, CUDA_R_16BF, bc, nc, cols, block, bc,
                        (a.accumulate || r0 > 0 || p < PLANES - 1) ? 1.0f : 0.0f);
        }
    }
}

static void launch_backward_x(const void *p) {
    const backward_x_args &a = *(const backward_x_args *)p;
    const int rows = a.w.rows, cols = a.w.cols;
    if (a.w.dtype == QLM_BF16 || a.w.dtype == QLM_I8) {
        backward_x_bf16(a);
        return;
    }
    if (a.w.dtype == QLM_F32) {
        gemm_dx(a.dx, a.dy, CUDA_R_32F, rows, a.n, cols, a.w.data, rows, a.accumulate ? 1.0f : 0.0f);
        return;
    }
    // One scratch block: stream order runs each SGEMM before the next block overwrites it.
    for (int r0 = 0; r0 < rows; r0 += a.block_rows) {
        int r1 = rows - r0 < a.block_rows ? rows : r0 + a.block_rows;
        long ne = (long)(r1 - r0) * cols;
        widen_rows_kernel<<<qlm_cuda_blocks(ne, 256), 256, 0, qlm_cuda_stream>>>((float *)a.wf, a.w, r0, ne);
        LAUNCH_CHECK();
        gemm_dx(a.dx, a.dy + r0, CUDA_R_32F, rows, a.n, cols, a.wf, r1 - r0, (a.accumulate || r0 > 0) ? 1.0f : 0.0f);
    }
}

static void *g_wf, *g_split;
static size_t g_wf_cap, g_split_cap;

int qlm_cuda_matmul_backward_x(float *dx, const float *dy, int n, const qlm_weight *w, int accumulate) {
    if (w->dtype != QLM_F32 && w->dtype != QLM_F16 && w->dtype != QLM_BF16 && w->dtype != QLM_I8)
        return qlm_errorf("matmul_backward_x: %s weights are not a CUDA form", qlm_dtype_name(w->dtype));
    if (n <= 0 || w->cols <= 0) return 0;
    if (w->rows <= 0) { // an empty product
        if (!accumulate) qlm_cuda_zero(dx, (long)n * w->cols);
        return 0;
    }
    backward_x_args a;
    memset(&a, 0, sizeof a);
    a.dx = dx, a.dy = dy, a.w = *w, a.n = n, a.accumulate = accumulate;
    if (w->dtype == QLM_F16 || w->dtype == QLM_I8) {
        const size_t esize = w->dtype == QLM_F16 ? sizeof(float) : 2;
        a.block_rows = qlm_cuda_rows_within(BLOCK_ELEMS, w->cols, w->rows < BLOCK_ROWS ? w->rows : BLOCK_ROWS);
        a.wf = qlm_cuda_scratch_try(&g_wf, &g_wf_cap, (size_t)a.block_rows * w->cols * esize);
        if (!a.wf) return qlm_error_context("matmul_backward_x: %d x %d weight rows widened", a.block_rows, w->cols);
    } else {
        a.block_rows = w->rows;
    }
    if (w->dtype == QLM_BF16 || w->dtype == QLM_I8) {
        a.split_rows = qlm_cuda_rows_within(SPLIT_ELEMS, a.block_rows, n);
        a.split = (unsigned short *)qlm_cuda_scratch_try(&g_split, &g_split_cap,
                                                         (size_t)PLANES * a.split_rows * a.block_rows * 2);
        if (!a.split) return qlm_error_context("matmul_backward_x: %d rows of dy in BF16 planes", a.split_rows);
    }
    qlm_cuda_submit("matmul_backward_x", launch_backward_x, &a, sizeof a);
    return 0;
}

struct backward_w_args {
    float *dw, *db;
    const float *dy, *x;
    unsigned short *rounded; // BF16 inputs: chunk rows of dy, then chunk rows of x
    int n, rows, cols, chunk;
};

// dw^T (col-major [cols][rows]) += x^T (col-major [cols][n]) times dy (dy^T is col-major [rows][n]),
// both of type t.
static void gemm_dw(float *dw, const void *dy, const void *x, cudaDataType t, int n, int rows, int cols) {
    const float one = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(qlm_cuda_blas, CUBLAS_OP_N, CUBLAS_OP_T, cols, rows, n, &one, x, t, cols, dy, t, rows,
                              &one, dw, CUDA_R_32F, cols, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void launch_backward_w(const void *p) {
    const backward_w_args &a = *(const backward_w_args *)p;
    if (!a.rounded) {
        gemm_dw(a.dw, a.dy, a.x, CUDA_R_32F, a.n, a.rows, a.cols);
    } else {
        // The BF16 tensor cores, a chunk of rows of dy and x at a time.
        unsigned short *xr = a.rounded + (size_t)a.chunk * a.rows;
        for (int i0 = 0; i0 < a.n; i0 += a.chunk) {
            const int nc = a.n - i0 < a.chunk ? a.n - i0 : a.chunk;
            qlm_cuda_to_bf16(a.rounded, a.dy + (size_t)i0 * a.rows, (long)nc * a.rows);
            qlm_cuda_to_bf16(xr, a.x + (size_t)i0 * a.cols, (long)nc * a.cols);
            gemm_dw(a.dw, a.rounded, xr, CUDA_R_16BF, nc, a.rows, a.cols);
        }
    }
    // db[r] += dy[i][r] for i in order: the CPU's order, so the same bits.
    if (a.db) qlm_cuda_add_column_sums(a.db, a.dy, a.n, a.rows);
}

static void *g_rounded;
static size_t g_rounded_cap;

int qlm_cuda_matmul_backward_w(float *dw, float *db, const float *dy, const float *x, int n, int rows, int cols,
                               qlm_dtype inputs) {
    if (n <= 0 || rows <= 0 || cols <= 0) return 0;
    backward_w_args a;
    memset(&a, 0, sizeof a);
    a.dw = dw, a.db = db, a.dy = dy, a.x = x, a.n = n, a.rows = rows, a.cols = cols;
    if (inputs == QLM_BF16) {
        a.chunk = qlm_cuda_rows_within(ROUNDED_ELEMS, (long)rows + cols, n);
        a.rounded = (unsigned short *)qlm_cuda_scratch_try(&g_rounded, &g_rounded_cap,
                                                           (size_t)a.chunk * ((size_t)rows + cols) * 2);
        if (!a.rounded) return qlm_error_context("matmul_backward_w: %d rows of dy and x in BF16", a.chunk);
    }
    qlm_cuda_submit("matmul_backward_w", launch_backward_w, &a, sizeof a);
    return 0;
}
