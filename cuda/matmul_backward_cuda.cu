// The matmul's backward on the GPU, as cpu/backend_cpu_train.c computes it: dx = dy W and
// dw += dy^T x as cuBLAS SGEMMs in the default math mode (no TF32, so F32 sums as the CPU's),
// weights of other dtypes widened to F32 a block of rows at a time. cuBLAS is column-major: a
// row-major [r][c] matrix is its transpose there, [c][r] with leading dimension c.
#include <string.h>

#include "cuda_internal.h"

// Rows of a non-F32 weight widened at a time: at most BLOCK_ROWS, and at most BLOCK_ELEMS floats.
enum { BLOCK_ROWS = 4096, BLOCK_ELEMS = 16 << 20 };

// out[t] = element t of rows r0.. of w as F32, over ne elements.
__global__ void widen_rows_kernel(float *out, qlm_weight w, int r0, long ne) {
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < ne) out[t] = qlm_weight_at(w, r0 + t / w.cols, t % w.cols);
}

struct backward_x_args {
    float *dx, *wf; // wf: scratch for block_rows widened rows
    const float *dy;
    qlm_weight w;
    int n, accumulate, block_rows;
};

// dx (col-major [cols][n]) = beta dx + rows r0..r1 of W (F32 [r1-r0][cols] at block) times the
// same columns of dy (col-major [rows][n], ld rows).
static void gemm_dx(float *dx, const float *dy, int n, int rows, int cols, const float *block, int r0, int r1,
                    float beta) {
    const float one = 1.0f;
    CUBLAS_CHECK(cublasSgemm(qlm_cuda_blas, CUBLAS_OP_N, CUBLAS_OP_N, cols, n, r1 - r0, &one, block, cols, dy + r0, rows,
                             &beta, dx, cols));
}

static void launch_backward_x(const void *p) {
    const backward_x_args &a = *(const backward_x_args *)p;
    const int rows = a.w.rows, cols = a.w.cols;
    if (a.w.dtype == QLM_F32) {
        gemm_dx(a.dx, a.dy, a.n, rows, cols, (const float *)a.w.data, 0, rows, a.accumulate ? 1.0f : 0.0f);
        return;
    }
    // One scratch block: stream order runs each SGEMM before the next block overwrites it.
    for (int r0 = 0; r0 < rows; r0 += a.block_rows) {
        int r1 = rows - r0 < a.block_rows ? rows : r0 + a.block_rows;
        long ne = (long)(r1 - r0) * cols;
        widen_rows_kernel<<<qlm_cuda_blocks(ne, 256), 256, 0, qlm_cuda_stream>>>(a.wf, a.w, r0, ne);
        LAUNCH_CHECK();
        gemm_dx(a.dx, a.dy, a.n, rows, cols, a.wf, r0, r1, (a.accumulate || r0 > 0) ? 1.0f : 0.0f);
    }
}

static void *g_wf;
static size_t g_wf_cap;

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
    if (w->dtype != QLM_F32) {
        int rows = BLOCK_ELEMS / w->cols > 0 ? BLOCK_ELEMS / w->cols : 1;
        a.block_rows = rows < BLOCK_ROWS ? rows : BLOCK_ROWS;
        if (a.block_rows > w->rows) a.block_rows = w->rows;
        a.wf = (float *)qlm_cuda_scratch_try(&g_wf, &g_wf_cap, (size_t)a.block_rows * w->cols * sizeof(float));
        if (!a.wf) return qlm_error_context("matmul_backward_x: %d x %d weight rows as F32", a.block_rows, w->cols);
    }
    qlm_cuda_submit("matmul_backward_x", launch_backward_x, &a, sizeof a);
    return 0;
}

struct backward_w_args {
    float *dw, *db;
    const float *dy, *x;
    int n, rows, cols;
};

static void launch_backward_w(const void *p) {
    const backward_w_args &a = *(const backward_w_args *)p;
    const float one = 1.0f;
    // dw^T (col-major [cols][rows]) += x^T (col-major [cols][n]) times dy (dy^T is col-major [rows][n]).
    CUBLAS_CHECK(cublasSgemm(qlm_cuda_blas, CUBLAS_OP_N, CUBLAS_OP_T, a.cols, a.rows, a.n, &one, a.x, a.cols, a.dy,
                             a.rows, &one, a.dw, a.cols));
    // db[r] += dy[i][r] for i in order: the CPU's order, so the same bits.
    if (a.db) qlm_cuda_add_column_sums(a.db, a.dy, a.n, a.rows);
}

void qlm_cuda_matmul_backward_w(float *dw, float *db, const float *dy, const float *x, int n, int rows, int cols) {
    if (n <= 0 || rows <= 0 || cols <= 0) return;
    backward_w_args a;
    memset(&a, 0, sizeof a);
    a.dw = dw, a.db = db, a.dy = dy, a.x = x, a.n = n, a.rows = rows, a.cols = cols;
    qlm_cuda_submit("matmul_backward_w", launch_backward_w, &a, sizeof a);
}
