// The CUDA backend: device start-up, the memory pool, transfers, and the op table. Every op is
// queued on one stream, so ops run in the order model code calls them and only to_host waits.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

#include "cuda_internal.h"

cudaStream_t qlm_cuda_stream;
cublasHandle_t qlm_cuda_blas;
int qlm_cuda_device;

void qlm_cuda_fail(const char *what, const char *why, const char *file, int line) {
    fprintf(stderr, "qlm: CUDA failure at %s:%d: %s: %s\n", file, line, what, why);
    exit(EXIT_FAILURE);
}

// ---- the pool: freed blocks are kept and handed out again to a request that fits them closely ----

struct pool_block {
    void *p;
    size_t size;
};
static pool_block *g_live, *g_cached;  // blocks in use, blocks freed for reuse
static size_t g_n_live, g_cap_live, g_n_cached, g_cap_cached;

static int push_block(pool_block **list, size_t *n, size_t *cap, pool_block b) {
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 256;
        pool_block *l = (pool_block *)realloc(*list, c * sizeof *l);
        if (!l) return -1;
        *list = l;
        *cap = c;
    }
    (*list)[(*n)++] = b;
    return 0;
}

static void release_cached(void) {
    qlm_cuda_flush();
    CUDA_CHECK(cudaStreamSynchronize(qlm_cuda_stream));
    for (size_t i = 0; i < g_n_cached; i++) CUDA_CHECK(cudaFree(g_cached[i].p));
    g_n_cached = 0;
}

// QLM_CUDA_POOL=0: every block is a cudaMalloc of exactly its size, freed at once, so that
// compute-sanitizer (and the host emulation's AddressSanitizer) see an access past a buffer's end
// where the pool's rounding and reuse would hide it. For checking, not speed: each free waits.
static int pooled(void) {
    static const int on = !qlm_cuda_env_is("QLM_CUDA_POOL", "0");
    return on;
}

void *qlm_cuda_alloc(size_t bytes) {
    size_t size = pooled() ? (bytes + 511) & ~(size_t)511 : bytes;
    if (size == 0) size = pooled() ? 512 : 1;
    // The smallest cached block that wastes at most a quarter of itself.
    size_t best = g_n_cached;
    for (size_t i = 0; i < g_n_cached; i++)
        if (g_cached[i].size >= size && g_cached[i].size - size <= g_cached[i].size / 4 &&
            (best == g_n_cached || g_cached[i].size < g_cached[best].size))
            best = i;
    pool_block b = {NULL, size};
    if (best < g_n_cached) {
        b = g_cached[best];
        g_cached[best] = g_cached[--g_n_cached];
    } else if (cudaMalloc(&b.p, size) != cudaSuccess) {
        cudaGetLastError();
        release_cached();
        if (cudaMalloc(&b.p, size) != cudaSuccess) {
            cudaGetLastError();
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            qlm_errorf("out of GPU memory: %.1f MiB needed, %.1f MiB free of %.1f MiB", size / 1048576.0,
                       free_b / 1048576.0, total_b / 1048576.0);
            return NULL;
        }
    }
    if (push_block(&g_live, &g_n_live, &g_cap_live, b) != 0) {
        cudaFree(b.p);
        qlm_errorf("out of host memory for the GPU pool's table");
        return NULL;
    }
    return b.p;
}

void qlm_cuda_free(void *p) {
    if (!p) return;
    for (size_t i = 0; i < g_n_live; i++)
        if (g_live[i].p == p) {
            pool_block b = g_live[i];
            g_live[i] = g_live[--g_n_live];
            if (!pooled()) {
                qlm_cuda_flush(); // queued ops may still use it
                CUDA_CHECK(cudaFree(b.p));
                return;
            }
            // A block queued work may still use goes back only in stream order: kernels read it
            // before any later op can be handed the same memory.
            if (push_block(&g_cached, &g_n_cached, &g_cap_cached, b) != 0) {
                CUDA_CHECK(cudaStreamSynchronize(qlm_cuda_stream));
                CUDA_CHECK(cudaFree(b.p));
            }
            return;
        }
    qlm_cuda_fail("qlm_cuda_free", "pointer not from the pool", __FILE__, __LINE__);
}

void *qlm_cuda_scratch_try(void **buf, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return *buf;
    qlm_cuda_free(*buf);
    *buf = qlm_cuda_alloc(bytes);
    *cap = *buf ? bytes : 0;
    return *buf;
}

void *qlm_cuda_scratch(void **buf, size_t *cap, size_t bytes) {
    if (!qlm_cuda_scratch_try(buf, cap, bytes)) qlm_cuda_fail("scratch", qlm_last_error(), __FILE__, __LINE__);
    return *buf;
}

// ---- transfers ----

// Weights go up through two pinned buffers in turn: one fills on the host while the other copies.
static const size_t STAGE_BYTES = (size_t)16 << 20;
static void *g_stage[2];
static cudaEvent_t g_stage_done[2];

static void *cuda_upload(void *host, size_t bytes) {
    qlm_cuda_flush();
    char *dev = (char *)qlm_cuda_alloc(bytes);
    if (!dev) return NULL;
    const char *src = (const char *)host;
    for (size_t off = 0, k = 0; off < bytes; off += STAGE_BYTES, k ^= 1) {
        size_t len = bytes - off < STAGE_BYTES ? bytes - off : STAGE_BYTES;
        CUDA_CHECK(cudaEventSynchronize(g_stage_done[k]));
        memcpy(g_stage[k], src + off, len);
        CUDA_CHECK(cudaMemcpyAsync(dev + off, g_stage[k], len, cudaMemcpyHostToDevice, qlm_cuda_stream));
        CUDA_CHECK(cudaEventRecord(g_stage_done[k], qlm_cuda_stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(qlm_cuda_stream));
    return dev;
}

static void cuda_to_device(void *dst, const void *src, size_t bytes) {
    qlm_cuda_flush();
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, qlm_cuda_stream));
}

static void cuda_to_host(void *dst, const void *src, size_t bytes) {
    qlm_cuda_flush();
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, qlm_cuda_stream));
    CUDA_CHECK(cudaStreamSynchronize(qlm_cuda_stream));
}

// A device-to-device copy of 2 x 512 MiB, timed with events over ten repetitions after a warm-up;
// bytes read plus bytes written, as HBM's datasheet counts them.
static double cuda_bandwidth_gbs(void) {
    qlm_cuda_flush();
    const size_t bytes = (size_t)512 << 20;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(a);
        qlm_errorf("no room on the GPU for the bandwidth test (2 x 512 MiB)");
        return -1;
    }
    CUDA_CHECK(cudaMemsetAsync(a, 1, bytes, qlm_cuda_stream));
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, qlm_cuda_stream));
    CUDA_CHECK(cudaEventRecord(t0, qlm_cuda_stream));
    const int reps = 10;
    for (int r = 0; r < reps; r++)
        CUDA_CHECK(cudaMemcpyAsync(r & 1 ? a : b, r & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, qlm_cuda_stream));
    CUDA_CHECK(cudaEventRecord(t1, qlm_cuda_stream));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    CUDA_CHECK(cudaEventDestroy(t0));
    CUDA_CHECK(cudaEventDestroy(t1));
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    return 2.0 * bytes * reps / (ms * 1e-3) / 1e9;
}

static cudaDeviceProp g_prop;
static const size_t CUBLAS_WORKSPACE = (size_t)32 << 20;

static void cuda_describe(char *out, size_t len) {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    snprintf(out, len, "cuda: %s (compute %d.%d, %d SMs), %.1f GiB free of %.1f GiB", g_prop.name, g_prop.major,
             g_prop.minor, g_prop.multiProcessorCount, free_b / 1073741824.0, total_b / 1073741824.0);
}

// Every entry of the table holds one lock: the model runs from one thread, but a server may load
// or unload an adapter (upload, free) from another while a step is being queued, and the queue,
// the pool and the staging ring are shared. Recursive, as uploads flush through the same entries.
static std::recursive_mutex g_lock;

// CUDA keeps a current GPU per thread: a thread's first call makes it the backend's.
static thread_local bool t_on_device;
static void on_device(void) {
    if (t_on_device) return;
    CUDA_CHECK(cudaSetDevice(qlm_cuda_device));
    t_on_device = true;
}

template <auto F> struct locked;
template <typename R, typename... A, R (*F)(A...)> struct locked<F> {
    static R call(A... args) {
        std::lock_guard<std::recursive_mutex> hold(g_lock);
        on_device();
        return F(args...);
    }
};

void qlm_cuda_flush_and_record(cudaEvent_t after) {
    std::lock_guard<std::recursive_mutex> hold(g_lock);
    on_device();
    qlm_cuda_flush();
    if (after) CUDA_CHECK(cudaEventRecord(after, qlm_cuda_stream));
}

int qlm_cuda_env_is(const char *name, const char *value) {
    const char *e = getenv(name);
    return e && strcmp(e, value) == 0;
}

int qlm_cuda_fused(void) {
    static const int on = !qlm_cuda_env_is("QLM_CUDA_FUSE", "0");
    return on;
}

int qlm_cuda_pdl(void) {
    static const int on = qlm_cuda_env_is("QLM_CUDA_PDL", "1") && g_prop.major >= 9;
    return on;
}

// Every op of the table, inference and training.
static qlm_backend cuda_backend;

static void fill_table(qlm_backend *b) {
    b->name = "cuda";
    b->host_memory = 0;
    b->alloc = locked<qlm_cuda_alloc>::call;
    b->free = locked<qlm_cuda_free>::call;
    b->upload = locked<cuda_upload>::call;
    b->bandwidth_gbs = locked<cuda_bandwidth_gbs>::call;
    b->describe = locked<cuda_describe>::call;
    b->matmul = locked<qlm_cuda_matmul>::call;
    b->matmul_group = locked<qlm_cuda_matmul_group>::call;
    b->step_matmul_group = locked<qlm_cuda_step_matmul_group>::call;
    b->lora = locked<qlm_cuda_lora>::call;
    b->rmsnorm = locked<qlm_cuda_rmsnorm>::call;
    b->rope = locked<qlm_cuda_rope>::call;
    b->attention = locked<qlm_cuda_attention>::call;
    b->attention_backward = locked<qlm_cuda_attention_backward>::call;
    b->glu = locked<qlm_cuda_glu>::call;
    b->activate = locked<qlm_cuda_activate>::call;
    b->add = locked<qlm_cuda_add>::call;
    b->embedding = locked<qlm_cuda_embedding>::call;
    b->copy = locked<qlm_cuda_copy>::call;
    b->kv_store = locked<qlm_cuda_kv_store>::call;
    b->rope_store = locked<qlm_cuda_rope_store>::call;
    b->to_device = locked<cuda_to_device>::call;
    b->to_host = locked<cuda_to_host>::call;
    b->scale = locked<qlm_cuda_scale>::call;
    b->zero = locked<qlm_cuda_zero>::call;
    b->matmul_backward_x = locked<qlm_cuda_matmul_backward_x>::call;
    b->matmul_backward_w = locked<qlm_cuda_matmul_backward_w>::call;
    b->rmsnorm_backward = locked<qlm_cuda_rmsnorm_backward>::call;
    b->rope_backward = locked<qlm_cuda_rope_backward>::call;
    b->glu_backward = locked<qlm_cuda_glu_backward>::call;
    b->activate_backward = locked<qlm_cuda_activate_backward>::call;
    b->embedding_backward = locked<qlm_cuda_embedding_backward>::call;
    b->cross_entropy = locked<qlm_cuda_cross_entropy>::call;
    b->sum_squares = locked<qlm_cuda_sum_squares>::call;
    b->dropout = locked<qlm_cuda_dropout>::call;
    b->adamw = locked<qlm_cuda_adamw>::call;
    b->store_weight = locked<qlm_cuda_store_weight>::call;
    b->fake_quant_forward = locked<qlm_cuda_fake_quant_forward>::call;
    b->fake_quant_backward = locked<qlm_cuda_fake_quant_backward>::call;
    b->fake_quant_clamp_scales = locked<qlm_cuda_fake_quant_clamp_scales>::call;
}

// Start-up happens once; its failure (no device, no driver) is an error the caller can report.
static int start(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0)
        return qlm_errorf("no GPU: %s", err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device found");
    qlm_cuda_device = qlm_cuda_launch_device(n);
    if ((err = cudaSetDevice(qlm_cuda_device)) != cudaSuccess ||
        (err = cudaGetDeviceProperties(&g_prop, qlm_cuda_device)) != cudaSuccess ||
        (err = cudaStreamCreateWithFlags(&qlm_cuda_stream, cudaStreamNonBlocking)) != cudaSuccess)
        return qlm_errorf("GPU start-up failed: %s", cudaGetErrorString(err));
    if (g_prop.major < 8) return qlm_errorf("GPU %s is compute %d.%d; qlm needs 8.0 or newer", g_prop.name, g_prop.major, g_prop.minor);
    for (int k = 0; k < 2; k++)
        if ((err = cudaHostAlloc(&g_stage[k], STAGE_BYTES, cudaHostAllocDefault)) != cudaSuccess ||
            (err = cudaEventCreateWithFlags(&g_stage_done[k], cudaEventDisableTiming)) != cudaSuccess)
            return qlm_errorf("GPU start-up failed: pinned staging: %s", cudaGetErrorString(err));
    cublasStatus_t bs = cublasCreate(&qlm_cuda_blas);
    if (bs != CUBLAS_STATUS_SUCCESS) return qlm_errorf("cuBLAS start-up failed: %s", cublasGetStatusString(bs));
    CUBLAS_CHECK(cublasSetStream(qlm_cuda_blas, qlm_cuda_stream));
    // A workspace of its own keeps cuBLAS from allocating while a graph is being captured.
    void *workspace = NULL;
    if ((err = cudaMalloc(&workspace, CUBLAS_WORKSPACE)) != cudaSuccess)
        return qlm_errorf("GPU start-up failed: cuBLAS workspace: %s", cudaGetErrorString(err));
    CUBLAS_CHECK(cublasSetWorkspace(qlm_cuda_blas, workspace, CUBLAS_WORKSPACE));
    fill_table(&cuda_backend);
    return 0;
}

extern "C" const qlm_backend *qlm_backend_cuda(void) {
    static int state = 0; // 0: not tried, 1: up, -1: failed (message kept)
    static char why[256];
    if (state == 0) {
        state = start() == 0 ? 1 : -1;
        if (state < 0) snprintf(why, sizeof why, "%s", qlm_last_error());
    }
    if (state < 0) {
        qlm_errorf("%s", why);
        return NULL;
    }
    return &cuda_backend;
}
