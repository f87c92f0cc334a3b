// What CUDA C++ gives a kernel, for compiling qlm's .cu files as host C++ (tools/cuda_emu/build.sh):
// the built-in types and indices, barriers and warp shuffles (emu.cpp runs them), the intrinsics
// and conversions the kernels use, and the few runtime and cuBLAS calls their launchers make.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>
using std::max;
using std::min;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __cvta_generic_to_shared(p) ((size_t)(p))
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
// Aligned as CUDA's: a kernel's vector access at an address that is not is a fault on the GPU, and
// build.sh's -fsanitize=alignment reports it here.
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) int4 { int x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }
extern dim3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
extern unsigned char *emu_dyn_smem;
// The runtime (runtime.cpp): streams whose work runs only when the host waits for it, events,
// graphs by stream capture, device and pinned memory, the calls that capture forbids.
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
typedef struct emu_graph *cudaGraph_t;
typedef struct emu_graph *cudaGraphExec_t;
typedef int cudaError_t;
enum {
    cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorInvalidResourceHandle = 400,
    cudaErrorStreamCaptureUnsupported = 900, cudaErrorStreamCaptureInvalidated = 901,
};
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
enum { cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2, cudaHostAllocDefault = 0 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeRelaxed };
struct cudaDeviceProp {
    char name[256];
    int major, minor, multiProcessorCount;
    size_t totalGlobalMem;
};
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind kind, cudaStream_t st);
// Work for stream s: run when the host waits for it, or kept in the graph s is capturing.
void emu_enqueue(cudaStream_t s, std::function<void()> work);

// A kernel's __launch_bounds__, which asm.pl makes its first statement: a launch with more threads a
// block fails on the GPU.
static inline void emu_launch_bounds(int max_threads, int = 0) {
    if ((int)(blockDim.x * blockDim.y * blockDim.z) > max_threads) {
        fprintf(stderr, "emu: block of %u threads for a kernel bounded to %d\n", blockDim.x * blockDim.y * blockDim.z,
                max_threads);
        abort();
    }
}
// A __shared__ array, which asm.pl makes a static with one of these beside it, and a call of arrive
// after it: the first of a block's threads to get there fills it with 0xff bytes (NaN, -1), since on
// the GPU a block's shared memory starts as garbage, not as the block before left it (a block's
// threads are fibers of one host thread: no locking). emu_launch moves emu_block_epoch on per block.
extern unsigned emu_block_epoch;
struct emu_shared_array {
    void *p;
    size_t n;
    unsigned epoch = 0;
    emu_shared_array(void *p_, size_t n_) : p(p_), n(n_) {}
    void arrive() {
        if (epoch == emu_block_epoch) return;
        memset(p, 0xff, n);
        epoch = emu_block_epoch;
    }
};
void emu_syncthreads();
void emu_warp_xchg(uint64_t v, uint64_t *out, int src);
static inline void __syncthreads() { emu_syncthreads(); }
int emu_syncthreads_or(int p);
static inline int __syncthreads_or(int p) { return emu_syncthreads_or(p); }

void emu_syncwarp();
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_syncwarp(); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <class T> static inline T emu_shfl(T v, int src) {
    uint64_t in = 0, out;
    memcpy(&in, &v, sizeof v);
    emu_warp_xchg(in, &out, src);
    T r;
    memcpy(&r, &out, sizeof r);
    return r;
}
template <class T> static inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    int lane = threadIdx.x & 31;
    return emu_shfl(v, (lane & ~(width - 1)) | (src & (width - 1)));
}
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o, int width = 32) {
    int lane = threadIdx.x & 31;
    int s = lane ^ o;
    return emu_shfl(v, (s & ~(width - 1)) == (lane & ~(width - 1)) ? s : lane);
}
template <class T> static inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
    int lane = threadIdx.x & 31, seg = lane & ~(width - 1);
    int s = lane + (int)d;
    return emu_shfl(v, s < seg + width ? s : lane);
}
template <class T> static inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
    int lane = threadIdx.x & 31, seg = lane & ~(width - 1);
    int s = lane - (int)d;
    return emu_shfl(v, s >= seg ? s : lane);
}
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    uint64_t b = (uint64_t)x | ((uint64_t)y << 32);
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((b >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T __ldcs(const T *p) { return *p; }
template <class T> static inline T __ldcg(const T *p) { return *p; }
template <class T> static inline T __ldlu(const T *p) { return *p; }
template <class T> static inline void __stcs(T *p, T v) { *p = v; }
template <class T> static inline void __stcg(T *p, T v) { *p = v; }
#define __expf expf
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline float __double2float_rn(double a) { return (float)a; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline int __float2int_rn(float x) { return (int)lrintf(x); }
static inline float __ll2float_rn(long long x) { return (float)x; }
static inline float __saturatef(float x) { return x < 0 ? 0 : x > 1 ? 1 : x; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline float atomicAdd(float *p, float v) { static std::mutex m; std::lock_guard<std::mutex> g(m); float o = *p; *p = o + v; return o; }
static inline int atomicAdd(int *p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
// BF16 and F16 as their bits.
struct __nv_bfloat16 { unsigned short x; };
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fff}; // the GPU's canonical NaN
    u += 0x7fffu + ((u >> 16) & 1);
    return {(unsigned short)(u >> 16)};
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
static inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float((unsigned)h.x << 16); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
struct __half { _Float16 v; };
struct alignas(4) __half2 { __half x, y; };
static inline float __half2float(__half h) { return (float)h.v; }
// A NaN becomes the GPU's canonical NaN, whatever its sign and payload.
static inline __half __float2half_rn(float f) {
    if (f != f) { __half h; const unsigned short nan = 0x7fff; memcpy(&h, &nan, 2); return h; }
    return {(_Float16)f};
}
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline float2 __half22float2(__half2 h) { return {(float)h.x.v, (float)h.y.v}; }
static inline unsigned short __half_as_ushort(__half h) { unsigned short u; memcpy(&u, &h, 2); return u; }
// Launches with attributes (programmatic dependent launch): run as plain launches.
enum cudaLaunchAttributeID { cudaLaunchAttributeProgrammaticStreamSerialization };
struct cudaLaunchAttribute {
    cudaLaunchAttributeID id;
    struct { int programmaticStreamSerializationAllowed; } val;
};
struct cudaLaunchConfig_t {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned numAttrs;
};
// kernel<<<grid, block, smem, stream>>>(args) becomes emu_launch_kernel(kernel, grid, block, smem,
// stream, args): the launch is checked at once and queued on the stream with the arguments' values
// as the kernel's parameters take them; kernel names the function for its dynamic shared memory
// limit (cudaFuncSetAttribute's).
void emu_launch(const void *kernel, std::function<void()> fn, dim3 grid, dim3 block, size_t smem, cudaStream_t stream);
template <class... P, class... A>
static inline void emu_launch_kernel(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A &&...args) {
    std::tuple<std::decay_t<P>...> params(static_cast<A &&>(args)...);
    emu_launch((const void *)k, [k, params] { std::apply(k, params); }, grid, block, smem, s);
}
// cuBLAS, as much of it as the backend calls, by plain loops queued on the handle's stream.
typedef struct emu_blas *cublasHandle_t;
typedef int cublasStatus_t;
enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_NOT_SUPPORTED = 15 };
typedef enum { CUBLAS_OP_N, CUBLAS_OP_T } cublasOperation_t;
typedef enum { CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F, CUDA_R_8I, CUDA_R_32I } cudaDataType;
enum { CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT };
const char *cublasGetStatusString(cublasStatus_t s);
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *workspace, size_t bytes);
// CUBLAS_COMPUTE_32I: alpha and beta are int, C int32 (exact sums, wrapped as the hardware's).
cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                            cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc, int compute,
                            int);

static inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                         const float *alpha, const float *A, int lda, const float *B, int ldb,
                                         const float *beta, float *C, int ldc) {
    return cublasGemmEx(h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta, C, CUDA_R_32F, ldc,
                        CUBLAS_COMPUTE_32F, 0);
}
enum { cudaFuncAttributeMaxDynamicSharedMemorySize, cudaDevAttrMultiProcessorCount };
void emu_set_smem_limit(const void *kernel, int bytes);
template <class F> static inline int cudaFuncSetAttribute(F f, int attr, int v) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) emu_set_smem_limit((const void *)f, v);
    return 0;
}
cudaError_t cudaDeviceGetAttribute(int *v, int attr, int device);
// mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32 with C = 0, from the PTX ISA's fragment layout.
void emu_mma_bf16(float d[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1);
// mma.sync.m16n8k32.row.col.s32.s8.s8.s32 with C = D, likewise.
void emu_mma_i8(int c[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1);
template <class... P, class... A> static inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *c, void (*k)(P...), A &&...args) {
    emu_launch_kernel(k, c->gridDim, c->blockDim, c->dynamicSmemBytes, c->stream, static_cast<A &&>(args)...);
    return cudaSuccess;
}
