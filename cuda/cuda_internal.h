// What the CUDA backend's files share: the one stream every op is queued on, the cuBLAS handle,
// the device memory pool, host index arrays handed to kernels, and each file's ops.
#ifndef QLM_CUDA_INTERNAL_H
#define QLM_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

extern "C" {
#include "../core/backend.h"
#include "../core/error.h"
#include "../quant/half_nan.h"
}

// A failed CUDA or cuBLAS call past start-up is a device fault (a kernel bug or a lost GPU); the
// context cannot be trusted after it, so the process ends with the call and the reason.
void qlm_cuda_fail(const char *what, const char *why, const char *file, int line);
#define CUDA_CHECK(call)                                                                     \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) qlm_cuda_fail(#call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)
#define CUBLAS_CHECK(call)                                                                    \
    do {                                                                                      \
        cublasStatus_t s_ = (call);                                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) qlm_cuda_fail(#call, cublasGetStatusString(s_), __FILE__, __LINE__); \
    } while (0)
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

extern cudaStream_t qlm_cuda_stream;
extern cublasHandle_t qlm_cuda_blas;
// The GPU the backend runs on: qlm_cuda_launch_device's, chosen at start-up.
extern int qlm_cuda_device;

// transport_nccl.cu: the GPU of this process. Started by a launcher (mpirun, torchrun), its rank
// on this machine modulo the n_devices it sees, so that ranks sharing a machine take different
// GPUs, as NCCL needs; else 0.
int qlm_cuda_launch_device(int n_devices);
// For the NCCL transport, which queues transfers behind the ops queued so far: runs the queue and,
// when after is not NULL, records it on the stream behind them, under the op table's lock.
void qlm_cuda_flush_and_record(cudaEvent_t after);

// Device memory from the pool (freed blocks are kept for reuse; cudaMalloc only). NULL with an
// error naming the size and the free memory when the device has no room.
void *qlm_cuda_alloc(size_t bytes);
void qlm_cuda_free(void *p);
// Scratch that grows: *buf holds at least bytes of device memory (its old contents are lost).
void *qlm_cuda_scratch(void **buf, size_t *cap, size_t bytes);
// The same, NULL (message set) when the device has no room, for ops that report it to the caller.
void *qlm_cuda_scratch_try(void **buf, size_t *cap, size_t bytes);

// Ops queue their launches (graph_cuda.cu): fn(args) runs at the next flush, args copied (and
// compared byte for byte with earlier steps, so zero an argument struct before filling it); name
// is the op's row in the QLM_CUDA_PROFILE table.
typedef void (*qlm_cuda_launcher)(const void *args);
void qlm_cuda_submit(const char *name, qlm_cuda_launcher fn, const void *args, size_t len);
// Runs what is queued; every sync point and host-side memory operation comes after one.
void qlm_cuda_flush(void);

// A host int array as a kernel sees it: staged into device memory with the queued step (graphs
// on), or, launching directly, up to QLM_CUDA_SMALL values inside the launch's parameters and
// longer ones copied first.
enum { QLM_CUDA_SMALL = 64 };
struct qlm_cuda_ints {
    const int *dev; // NULL: the values are in small
    int present;    // 0: the host array was NULL
    int small[QLM_CUDA_SMALL];
};
// which (0..3) picks one of the direct-launch scratch areas, so one op can pass several arrays.
qlm_cuda_ints qlm_cuda_ints_of(const int *host, int n, int which);
// Any host array (a table of structs) as a device address, staged as a long int array is (an op's
// arrays may take 1 MB of the ring); which as above.
const void *qlm_cuda_stage(const void *host, size_t bytes, int which);
__device__ __forceinline__ int qlm_ints_at(const qlm_cuda_ints &a, int i) { return a.dev ? a.dev[i] : a.small[i]; }

__device__ __forceinline__ float qlm_bf16_to_f32(unsigned short b) { return __uint_as_float((unsigned)b << 16); }
// Nearest even; a NaN as the CPU stores it (quant/half_nan.h).
__device__ __forceinline__ unsigned short qlm_f32_to_bf16(float f) {
    const unsigned u = __float_as_uint(f);
    return qlm_f32_bits_are_nan(u) ? qlm_bf16_of_nan(u) : __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ __forceinline__ unsigned short qlm_f32_to_f16(float f) {
    const unsigned u = __float_as_uint(f);
    return qlm_f32_bits_are_nan(u) ? qlm_f16_of_nan(u) : __half_as_ushort(__float2half_rn(f));
}

// x as BF16 weights meet it on every path (cuBLAS takes x rounded to BF16 for them, so the GEMV
// kernels round it too: a row's result does not depend on how many rows share the call).
__device__ __forceinline__ float qlm_bf16_round(float f) { return qlm_bf16_to_f32(qlm_f32_to_bf16(f)); }

// Element c of row r of a weight in its storage dtype (not a block type), as F32.
__device__ __forceinline__ float qlm_weight_at(const qlm_weight &w, long r, long c) {
    size_t i = (size_t)r * w.cols + c;
    switch (w.dtype) {
    case QLM_F32: return ((const float *)w.data)[i];
    case QLM_F16: return __half2float(((const __half *)w.data)[i]);
    case QLM_BF16: return qlm_bf16_to_f32(((const unsigned short *)w.data)[i]);
    default: return ((const signed char *)w.data)[i] * (w.row_scales ? w.row_scales[r] : w.scale);
    }
}

// The activations of the GLU (the GPU forms of the CPU's, same formulas), for glu_kernel and the
// GEMV that forms its x from gate and up.
__device__ __forceinline__ float qlm_act_of(float x, qlm_act a) {
    switch (a) {
    case QLM_ACT_RELU: return x > 0 ? x : 0;
    case QLM_ACT_GELU_TANH: return x - x / (expf(1.5957691216057308f * (x + 0.044715f * x * x * x)) + 1.0f);
    case QLM_ACT_GELU: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    default: return x / (1.0f + expf(-x));
    }
}

// v (float or double) summed over a warp: the butterfly's order is fixed, and every lane gets the
// same bits (each step adds the same two numbers on both sides).
template <typename T> __device__ __forceinline__ T qlm_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// RMSNorm's sum of squares, in one order wherever it runs (rmsnorm_kernel, and the GEMV that norms
// its x), so that both give the same bits: QLM_RMS_THREADS threads, thread t summing the squares of
// x[t + QLM_RMS_THREADS k] in k order, the sum over each warp by qlm_warp_sum, then qlm_rms_inv
// over the warps' sums in warp order.
enum { QLM_RMS_THREADS = 256, QLM_RMS_WARPS = QLM_RMS_THREADS / 32 };
__device__ __forceinline__ float qlm_rms_inv(const float *warp_sums, int dim, float eps) {
    float total = 0;
#pragma unroll
    for (int k = 0; k < QLM_RMS_WARPS; k++) total += warp_sums[k];
    return 1.0f / sqrtf(total / dim + eps);
}

// Where a step's keys and values go: the decode caches as kv_store lays them out (core/kv_cache.h),
// row i at position pos[i] of slot slots[i] (slots absent: of slot).
struct qlm_kv_dst {
    void *k_cache, *v_cache;
    qlm_cuda_ints slots, pos;
    int slot, bf16, heads, hd, max_pos;
};
// A kv step's destination (ops_cuda.cu): its slots and store positions in scratch areas which and
// which + 1 (see qlm_cuda_ints_of).
qlm_kv_dst qlm_cuda_kv_dst(const qlm_kv_step *kv, int n, int which);

// Element e of head h of row i's keys or values into cache, in the cache's dtype.
__device__ __forceinline__ void qlm_kv_put(const qlm_kv_dst &d, void *cache, int i, int h, int e, float x) {
    const size_t at = ((size_t)(d.slots.present ? qlm_ints_at(d.slots, i) : d.slot) * d.heads + h) * d.max_pos * d.hd +
                      (size_t)qlm_ints_at(d.pos, i) * d.hd + e;
    if (d.bf16)
        ((unsigned short *)cache)[at] = qlm_f32_to_bf16(x);
    else
        ((float *)cache)[at] = x;
}

// Rotate-half RoPE of one pair (a, b) = (x[j], x[j + head_dim / 2]) by angle (direction -1: by
// -angle, the backward), rounded as qlm_cpu_rope_rotate computes it, for every kernel that rotates
// (rope_kernel, and the GEMV that rotates q and k as it makes them): the same bits from both.
__device__ __forceinline__ void qlm_rope_pair(float &a, float &b, float angle, float direction) {
    const float c = cosf(angle), s = direction * sinf(angle);
    const float ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)), rb = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    a = ra;
    b = rb;
}

static inline unsigned qlm_cuda_blocks(long n, int threads) { return (unsigned)((n + threads - 1) / threads); }
// Rows of per_row elements each that fit cap elements (a scratch buffer's): at least one, at most rows.
static inline int qlm_cuda_rows_within(long cap, long per_row, int rows) {
    long r = cap / per_row;
    return r < 1 ? 1 : r < rows ? (int)r : rows;
}

// Whether the environment variable is set to value: the QLM_CUDA_* switches that tune or check the
// backend, each read once, at its first use.
int qlm_cuda_env_is(const char *name, const char *value);

// 0 when QLM_CUDA_FUSE=0: step_matmul_group runs its ops one after the other (each its own kernel)
// instead of inside the GEMV, for measuring what the fused kernels save and for telling a fault in
// them from one elsewhere; the results are the same bits either way.
int qlm_cuda_fused(void);

// Programmatic dependent launch (QLM_CUDA_PDL=1, compute 9.0 and newer): the GEMV and attention
// are launched to start while the kernel before them is still running; the GEMV loads its first
// weights (which no kernel writes) and streams the rest towards L2, and each waits for that
// kernel's end before it reads what the kernel wrote. 1 when they launch so.
int qlm_cuda_pdl(void);
// In a kernel a GEMV or attention may follow: lets its blocks start now. A no-op for any other successor.
__device__ __forceinline__ void qlm_pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}
// Waits until the kernel before this one has finished and its writes are visible (at once when
// this one was not launched to overlap it).
__device__ __forceinline__ void qlm_pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Launches kernel(args) on the stream, to overlap the kernel before it when pdl (the kernel waits
// with qlm_pdl_wait before it reads what that one writes).
template <typename... Params, typename... Args>
static void qlm_cuda_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, bool pdl, Args &&...args) {
    cudaLaunchAttribute overlap;
    overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = qlm_cuda_stream;
    cfg.attrs = &overlap;
    cfg.numAttrs = pdl ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...));
}

// matmul_cuda.cu
void qlm_cuda_matmul(float *y, const float *x, int n, const qlm_weight *w, const float *bias);
int qlm_cuda_matmul_group(const qlm_matmul_out *outs, int count, const float *x, int n);
int qlm_cuda_step_matmul_group(const qlm_matmul_out *outs, int count, const qlm_x_step *step, const qlm_kv_step *kv,
                               int n);
// attention_cuda.cu
void qlm_cuda_attention(float *out, const float *q, const void *k, const void *v, int n, const int *pos,
                        const qlm_attn_shape *shape);
// attention_backward_cuda.cu
int qlm_cuda_attention_backward(float *dq, float *dk, float *dv, float *dpos_bias, const float *dout, const float *q,
                                const float *k, const float *v, int n, const int *pos, const qlm_attn_shape *shape);
// lora_cuda.cu
int qlm_cuda_lora(float *y, const float *x, int n, const qlm_lora_ref *const *per_row);
// ops_cuda.cu
void qlm_cuda_rmsnorm(float *out, const float *x, const float *weight, int n, int dim, float eps);
void qlm_cuda_rope(float *q, float *k, int n, const int *pos, int n_heads, int n_kv_heads, int head_dim,
                   const float *inv_freq);
void qlm_cuda_glu(float *out, const float *gate, const float *up, long n, qlm_act act);
void qlm_cuda_activate(float *x, long n, qlm_act act);
void qlm_cuda_add(float *y, const float *x, long n);
void qlm_cuda_scale(float *x, long n, float s);
void qlm_cuda_zero(float *x, long n);
void qlm_cuda_copy(float *dst, const float *src, long n);
void qlm_cuda_embedding(float *out, const qlm_weight *table, const int *ids, int n);
void qlm_cuda_kv_store(void *k_cache, void *v_cache, qlm_dtype kv, const float *k, const float *v, int n,
                       const int *slots, int slot, const int *pos, int heads, int hd, int max_pos);
void qlm_cuda_rope_store(float *q, float *k, const float *v, int n, const qlm_kv_step *kv);
void qlm_cuda_rope_backward(float *dq, float *dk, int n, const int *pos, int n_heads, int n_kv_heads, int head_dim,
                            const float *inv_freq);
// matmul_backward_cuda.cu
int qlm_cuda_matmul_backward_x(float *dx, const float *dy, int n, const qlm_weight *w, int accumulate);
int qlm_cuda_matmul_backward_w(float *dw, float *db, const float *dy, const float *x, int n, int rows, int cols,
                               qlm_dtype inputs);
// out[i] = x[i] rounded to BF16, i < n, on the stream (matmul_cuda.cu).
void qlm_cuda_to_bf16(unsigned short *out, const float *x, long n);
// train_ops_cuda.cu
// For launchers: out[j] += the sum of m[i][j] over i = 0..n_rows-1 in order, a thread per j, on the stream.
void qlm_cuda_add_column_sums(float *out, const float *m, int n_rows, int cols);
void qlm_cuda_rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x, const float *weight, int n,
                               int dim, float eps);
void qlm_cuda_glu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, long n,
                           qlm_act act);
void qlm_cuda_activate_backward(float *dx, const float *dout, const float *x, long n, qlm_act act);
void qlm_cuda_embedding_backward(float *dtable, const float *dout, const int *ids, int n, int dim);
void qlm_cuda_cross_entropy(float *row_loss, float *logits, const int *targets, const float *teacher, int n, int vocab,
                            float grad_scale, float softcap);
void qlm_cuda_sum_squares(double *out, const float *const *x, const long *n, int count);
void qlm_cuda_dropout(float *out, const float *x, long n, float p, uint64_t seed, long first);
void qlm_cuda_adamw(const qlm_adamw_tensors *l, const qlm_adamw_step *h);
void qlm_cuda_store_weight(qlm_weight *w, const float *src);
// fake_quant_cuda.cu
void qlm_cuda_fake_quant_forward(float *out, const float *w, int rows, int cols, const float *scales, int per_row,
                                 int qmin, int qmax);
void qlm_cuda_fake_quant_backward(float *dw, float *dscales, const float *dout, const float *w, int rows, int cols,
                                  const float *scales, int per_row, int qmin, int qmax, float grad_factor);
void qlm_cuda_fake_quant_clamp_scales(float *scales, long n);

#endif
