/* CPU matrix products with weights in any storage dtype (weight-only quantization: activations
 * stay F32, rounded to BF16 where the weights are BF16 and to 16-bit integers with a row scale
 * where they are INT8 or a block type; W8A8 for block weights with act8 set: 8-bit integers
 * with a scale per 32, see qlm_x_dtype). A portable scalar path and AVX2 / AVX-512 paths are
 * chosen at run time; work is split across OpenMP threads. */
#ifndef QLM_MATMUL_H
#define QLM_MATMUL_H

#include "../core/weight.h"

/* y[i][o] = sum_k x[i][k] * W[o][k] (+ bias[o] when bias != NULL), i < n, o < w->rows, k < w->cols.
 * x and y are row-major and must not alias. Row i of y depends on row i of x alone, bit for bit,
 * whatever n and the thread count are. */
void qlm_matmul(float *y, const float *x, int n, const qlm_weight *w, const float *bias);

/* qlm_matmul for each of count weights that multiply the same x (q/k/v, gate/up), with the same
 * results, in one parallel region whose threads split the rows of all of them, and x put in its
 * activation form once: one region instead of count saves their fork/join and each thread
 * streams one run of rows (decode). Weights of different dtypes or widths go one by one. Products
 * that add (qlm_matmul_out.add) go through a per-thread buffer and then add to y; -1 (message
 * set) when that buffer cannot be had, else 0. */
int qlm_matmul_group(const qlm_matmul_out *outs, int count, const float *x, int n);

/* y[i * ldy + o] = dot(w + o * w_stride, x row i) over cols, for i < n, o < rows: rows of dt
 * (F32, F16, or BF16) at any stride in elements (one head's keys in a KV cache), with the kernels
 * of qlm_matmul. x holds n rows of cols elements one after the other: F32, or for BF16 rows each
 * row in the form qlm_bf16_x_form makes (qlm_bf16_x_size bytes an element). Single-threaded, for
 * callers that spread work over threads. Each result is the same bits whatever n and rows are (the
 * products of an x row and a w row are added in one order). */
void qlm_dot_rows(float *y, long ldy, const void *x, int n, const void *w, size_t w_stride, int rows, long cols,
                  qlm_dtype dt);

/* One row of x (n elements) as qlm_dot_rows multiplies it with BF16 rows, on the kernels in use:
 * rounded to BF16 (as a BF16 matmul rounds its activations), in the layout those kernels read. */
void qlm_bf16_x_form(void *dst, const float *x, long n);
/* Bytes of an element of that form: 2 or 4. */
size_t qlm_bf16_x_size(void);

/* o[j * hd + d] += sum over t < m of p[j * ldp + t] * v[t * v_stride + d], for j < g, d < hd:
 * attention's weighted sum of value rows of dt (F32, F16 or BF16; any stride in elements) for g
 * rows. Each output adds its m products in order of t, whatever g is, so a weight of 0 (on finite
 * values) leaves it unchanged. Single-threaded. */
void qlm_weighted_sum(float *o, const float *p, int g, long ldp, const void *v, size_t v_stride, int m, long hd,
                      qlm_dtype dt);

/* x[i] = e^x[i] for i < n, in place: within 2 ulp of expf, e^-inf = 0, e^x overflowing to +inf and
 * NaN staying NaN; results below 3e-38 may be 0. Single-threaded. */
void qlm_exp_f32(float *x, long n);

/* y[i] += x[i] for i < n: a prompt's residual stream (512 x 576 floats a product) split over the
 * threads from 8192 floats a thread, decode's one row by the calling thread without a parallel
 * region. */
void qlm_add_f32(float *y, const float *x, long n);

/* Threads worth using for work units at min_per_thread a thread: 1 to omp_get_max_threads(). */
int qlm_threads_for(double work, double min_per_thread);

/* Rows of x from which qlm_matmul_i8_xw takes a product. */
#define QLM_I8_XW_MIN_ROWS 16

/* y = x W, or with accumulate y += x W (x: n rows of w->rows; y: n rows of w->cols), for an INT8
 * weight on CPUs with AMX (the backward through a frozen INT8 base): x (times per-channel scales)
 * in a 24-bit integer form with one scale per row (relative error 6e-8 of the row's largest
 * magnitude), each sum exact and rounded once, then times x's row scale and W's tensor scale.
 * Returns -1, writing nothing, where it does not apply (no AMX, rows interleaved for RoPE,
 * fewer than QLM_I8_XW_MIN_ROWS rows, W's rows not a multiple of 64 up to 65,536, out of memory):
 * the caller then multiplies another way. Multi-threaded. */
int qlm_matmul_i8_xw(float *y, const float *x, int n, const qlm_weight *w, int accumulate);

/* Dropout with probability p (below 1) of elements first..first+n-1 of a tensor whose draws come
 * from seed: out[i] = 0 where element first + i drops (core/train_formulas.h's qlm_dropout_drops,
 * as the CUDA backend draws), else x[i] / (1 - p). out may be x. Single-threaded. */
void qlm_dropout_f32(float *out, const float *x, long n, float p, uint64_t seed, long first);

/* The scalar reference, for tests. */
void qlm_matmul_scalar(float *y, const float *x, int n, const qlm_weight *w, const float *bias);

/* Name of the SIMD path in use ("avx512bf16", "avx512", "avx2", "scalar"): the best this CPU
 * runs, or the one the environment variable QLM_ISA names (to test every path a machine has; a
 * path the CPU cannot run is refused with a warning on stderr and the best one used). */
const char *qlm_matmul_isa(void);
/* Whether the path in use multiplies block weights with act8 set by 8-bit activations (W8A8):
 * it needs byte dot products (AVX512_VNNI); elsewhere act8 changes nothing. */
int qlm_matmul_w8a8(void);
/* The paths this CPU runs, from the simplest, separated by spaces. */
const char *qlm_matmul_isas(void);
/* Forces a path ("scalar", "avx2", "avx512", "avx512bf16") if the CPU supports it; -1 otherwise. For tests/bench. */
int qlm_matmul_force_isa(const char *name);

#endif
