// The host emulation's CUDA runtime and cuBLAS, for backend_cuda.cu and graph_cuda.cu as they are:
// streams, events, graphs, device and pinned memory. Work queued on a stream runs only when the
// host waits for it (a stream or event synchronize, a copy to pageable memory, cudaFree), the
// latest the GPU could run it: a host write to a pinned buffer before the copy that reads it
// has run, or a read of a result before the wait, gives a wrong answer here where it would be a
// race on the GPU. Stream capture keeps the work as a graph's nodes, and what capture forbids
// (cudaMalloc, cudaFree, a synchronize, a copy from pageable memory) fails as the driver fails it.
// Copies and memsets must lie within one cudaMalloc'd or cudaHostAlloc'd block, by their kind.
// One device of 80 GiB (an H100's), compute 9.0.
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "cuda/cuda_internal.h"
extern "C" {
#include "dist/launch.h"
}

static std::recursive_mutex g_rt; // every call; a queue runs under it, on the thread that waits
static thread_local cudaError_t t_last;
static thread_local int t_capturing; // streams this thread captures in a mode that forbids unsafe calls

typedef std::vector<std::function<void()>> work_list;
struct emu_graph {
    std::shared_ptr<work_list> nodes = std::make_shared<work_list>();
};
struct emu_stream {
    std::deque<std::function<void()>> work;
    unsigned long long queued = 0, done = 0; // work items ever queued, ever run
    emu_graph *capture = nullptr;
    bool strict = false, invalidated = false;
};
struct emu_event {
    emu_stream *stream = nullptr; // of its last record, NULL if never recorded
    unsigned long long at = 0;    // complete once stream->done reaches it
    unsigned generation = 0;
    bool timing = true, in_capture = false;
    double seconds = 0;
};
static emu_stream g_legacy; // stream 0
static std::vector<emu_stream *> g_streams = {&g_legacy};

static emu_stream *stream_of(cudaStream_t s) { return s ? s : &g_legacy; }

static cudaError_t fail(cudaError_t e, const char *why) {
    fprintf(stderr, "emu: %s\n", why);
    t_last = e;
    return e;
}

// A call the capturing thread may not make: it fails, and so does the capture.
static bool unsafe_in_capture(const char *call) {
    if (t_capturing == 0) return false;
    for (emu_stream *s : g_streams)
        if (s->capture && s->strict) s->invalidated = true;
    char why[160];
    snprintf(why, sizeof why, "%s while a stream is being captured", call);
    fail(cudaErrorStreamCaptureUnsupported, why);
    return true;
}

static void run_until(emu_stream *s, unsigned long long count) {
    while (s->done < count) {
        std::function<void()> w = std::move(s->work.front());
        s->work.pop_front();
        w();
        s->done++;
    }
}
static void run_all() {
    for (emu_stream *s : g_streams) run_until(s, s->queued);
}

void emu_enqueue(cudaStream_t stream, std::function<void()> work) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    emu_stream *s = stream_of(stream);
    if (s->capture) {
        s->capture->nodes->push_back(std::move(work));
        return;
    }
    s->work.push_back(std::move(work));
    s->queued++;
}

// ---- memory ----

static const size_t DEVICE_BYTES = (size_t)80 << 30;
static std::map<uintptr_t, size_t> g_device, g_pinned; // block start -> bytes
static size_t g_device_used;

static bool within(const std::map<uintptr_t, size_t> &blocks, const void *p, size_t n) {
    auto it = blocks.upper_bound((uintptr_t)p);
    if (it == blocks.begin()) return false;
    --it;
    return (uintptr_t)p + n <= it->first + it->second;
}

cudaError_t cudaMalloc(void **p, size_t n) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    *p = NULL;
    if (unsafe_in_capture("cudaMalloc")) return cudaErrorStreamCaptureUnsupported;
    if (n > DEVICE_BYTES - g_device_used) return t_last = cudaErrorMemoryAllocation;
    // 256-byte aligned and exactly n bytes: the AddressSanitizer build reports an access past them.
    if (posix_memalign(p, 256, n ? n : 1) != 0) return t_last = cudaErrorMemoryAllocation;
    g_device[(uintptr_t)*p] = n;
    g_device_used += n;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    if (unsafe_in_capture("cudaFree")) return cudaErrorStreamCaptureUnsupported;
    if (!p) return cudaSuccess;
    auto it = g_device.find((uintptr_t)p);
    if (it == g_device.end()) return fail(cudaErrorInvalidValue, "cudaFree of a pointer cudaMalloc did not give");
    run_all(); // cudaFree waits for the device
    g_device_used -= it->second;
    g_device.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    *free_b = DEVICE_BYTES - g_device_used;
    *total_b = DEVICE_BYTES;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    *p = NULL;
    if (unsafe_in_capture("cudaHostAlloc")) return cudaErrorStreamCaptureUnsupported;
    if (posix_memalign(p, 4096, n ? n : 1) != 0) return t_last = cudaErrorMemoryAllocation;
    g_pinned[(uintptr_t)*p] = n;
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    if (!within(g_device, p, n)) return fail(cudaErrorInvalidValue, "cudaMemsetAsync outside a device block");
    emu_enqueue(s, [p, v, n] { memset(p, v, n); });
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *d, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    if (n == 0) return cudaSuccess;
    const bool d_dev = kind != cudaMemcpyDeviceToHost, s_dev = kind != cudaMemcpyHostToDevice;
    const void *host = kind == cudaMemcpyHostToDevice ? src : d;
    if ((d_dev && !within(g_device, d, n)) || (s_dev && !within(g_device, src, n)) ||
        (!d_dev && within(g_device, d, 1)) || (!s_dev && within(g_device, src, 1)))
        return fail(cudaErrorInvalidValue, "cudaMemcpyAsync: an end outside a device block, or a device pointer "
                                           "where its kind says host");
    emu_stream *s = stream_of(stream);
    if (kind == cudaMemcpyDeviceToDevice || within(g_pinned, host, n)) {
        emu_enqueue(stream, [d, src, n] { memmove(d, src, n); });
        return cudaSuccess;
    }
    // Pageable host memory: the copy cannot be a graph's node; from the host it is taken before
    // the call returns, to the host it has landed when the call returns.
    if (s->capture) {
        s->invalidated = true;
        return fail(cudaErrorStreamCaptureUnsupported, "cudaMemcpyAsync with pageable host memory in a capture");
    }
    if (kind == cudaMemcpyHostToDevice) {
        auto copy = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
        emu_enqueue(stream, [d, copy] { memcpy(d, copy->data(), copy->size()); });
        return cudaSuccess;
    }
    emu_enqueue(stream, [d, src, n] { memcpy(d, src, n); });
    run_until(s, s->queued);
    return cudaSuccess;
}

// ---- streams, events, graphs ----

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    *s = new emu_stream;
    g_streams.push_back(*s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    emu_stream *s = stream_of(stream);
    if (s->capture) {
        s->invalidated = true;
        return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize of a stream being captured");
    }
    if (unsafe_in_capture("cudaStreamSynchronize")) return cudaErrorStreamCaptureUnsupported;
    run_until(s, s->queued);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    emu_stream *s = stream_of(stream);
    if (s == &g_legacy || s->capture) return fail(cudaErrorInvalidValue, "capture of stream 0 or of one being captured");
    s->capture = new emu_graph;
    s->strict = mode != cudaStreamCaptureModeRelaxed;
    s->invalidated = false;
    if (s->strict) t_capturing++;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    emu_stream *s = stream_of(stream);
    *graph = NULL;
    if (!s->capture) return fail(cudaErrorInvalidValue, "cudaStreamEndCapture of a stream not being captured");
    if (s->strict) t_capturing--;
    emu_graph *captured = s->capture;
    s->capture = nullptr;
    if (s->invalidated) {
        delete captured;
        return fail(cudaErrorStreamCaptureInvalidated, "the capture was invalidated by a call it forbids");
    }
    *graph = captured;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    *exec = new emu_graph;
    *(*exec)->nodes = *graph->nodes;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    if (stream_of(stream)->capture) return fail(cudaErrorStreamCaptureUnsupported, "a graph launched into a capture");
    // The nodes are shared with the launch: an executable graph destroyed while in flight is freed
    // once it has run, as the driver does.
    std::shared_ptr<work_list> nodes = exec->nodes;
    emu_enqueue(stream, [nodes] {
        for (auto &w : *nodes) w();
    });
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    *e = new emu_event;
    (*e)->timing = !(flags & cudaEventDisableTiming);
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    emu_stream *s = stream_of(stream);
    const unsigned gen = ++e->generation;
    if (s->capture) { // a dependency inside the graph, not something the host can wait for
        e->in_capture = true;
        e->stream = nullptr;
        return cudaSuccess;
    }
    e->in_capture = false;
    emu_enqueue(stream, [e, gen] {
        if (e->generation == gen) e->seconds = now_s();
    });
    e->stream = s;
    e->at = s->queued;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    if (unsafe_in_capture("cudaEventSynchronize")) return cudaErrorStreamCaptureUnsupported;
    if (e->in_capture) return fail(cudaErrorStreamCaptureUnsupported, "cudaEventSynchronize of an event recorded in a capture");
    if (e->stream) run_until(e->stream, e->at);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    if (!a->timing || !b->timing || !a->stream || !b->stream)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime of an event without timing or never recorded");
    if (a->stream->done < a->at || b->stream->done < b->at)
        return fail(cudaErrorInvalidValue, "cudaEventElapsedTime of an event not yet complete");
    *ms = (float)((b->seconds - a->seconds) * 1e3);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    if (e->stream) run_until(e->stream, e->at); // its record still runs, and reads it
    delete e;
    return cudaSuccess;
}

// ---- the device ----

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : fail(cudaErrorInvalidValue, "cudaSetDevice of a device other than 0"); }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    if (d != 0) return fail(cudaErrorInvalidValue, "cudaGetDeviceProperties of a device other than 0");
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "host emulation (tools/cuda_emu)");
    p->major = 9;
    p->multiProcessorCount = 132;
    p->totalGlobalMem = DEVICE_BYTES;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, int attr, int d) {
    if (d != 0 || attr != cudaDevAttrMultiProcessorCount) return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute");
    *v = 132;
    return cudaSuccess;
}
cudaError_t cudaGetLastError() {
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    default: return "unknown error";
    }
}

// ---- cuBLAS ----

struct emu_blas {
    cudaStream_t stream = nullptr;
    void *workspace = nullptr;
};
cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = new emu_blas;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *workspace, size_t bytes) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    if (!within(g_device, workspace, bytes)) return CUBLAS_STATUS_INVALID_VALUE;
    h->workspace = workspace;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS"
           : s == CUBLAS_STATUS_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE"
                                              : "CUBLAS_STATUS_NOT_SUPPORTED";
}

static double elem(const void *p, cudaDataType t, size_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    if (t == CUDA_R_8I) return ((const signed char *)p)[i];
    if (t == CUDA_R_16BF) return __uint_as_float((unsigned)((const unsigned short *)p)[i] << 16);
    return (float)((const _Float16 *)p)[i];
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                            cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc, int compute,
                            int) {
    std::lock_guard<std::recursive_mutex> g(g_rt);
    // The integer GEMM's tensor-core requirements: 4-byte aligned pointers; m, k and the leading
    // dimensions multiples of 4.
    const bool integer = compute == CUBLAS_COMPUTE_32I;
    if (integer && (at != CUDA_R_8I || bt != CUDA_R_8I || ct != CUDA_R_32I || m % 4 || k % 4 || lda % 4 || ldb % 4 ||
                    ldc % 4 || (uintptr_t)A % 4 || (uintptr_t)B % 4 || (uintptr_t)C % 4))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    // Without a workspace of its own, cuBLAS would allocate inside the capture.
    if (stream_of(h->stream)->capture && !h->workspace) return CUBLAS_STATUS_NOT_SUPPORTED;
    // Host pointer mode: alpha and beta are read now.
    const long long ia = integer ? *(const int *)alpha : 0, ib = integer ? *(const int *)beta : 0;
    const double fa = integer ? 0 : *(const float *)alpha, fb = integer ? 0 : *(const float *)beta;
    emu_enqueue(h->stream, [=] {
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0;
                for (int p = 0; p < k; p++)
                    s += elem(A, at, ta == CUBLAS_OP_T ? p + (size_t)i * lda : i + (size_t)p * lda) *
                         elem(B, bt, tb == CUBLAS_OP_N ? p + (size_t)j * ldb : j + (size_t)p * ldb);
                const size_t c = i + (size_t)j * ldc;
                if (integer) {
                    const long long v = ia * (long long)s + (ib ? ib * (long long)((int *)C)[c] : 0);
                    ((int *)C)[c] = (int)(unsigned)v;
                } else {
                    float *y = (float *)C + c;
                    *y = (float)(fa * s + (fb != 0 ? fb * *y : 0));
                }
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}

// ---- what transport_nccl.cu would give: one emulated device, and no NCCL ----

int qlm_cuda_launch_device(int) { return 0; }

extern "C" qlm_transport *qlm_transport_nccl_world(const qlm_launch *, qlm_transport *, double) {
    qlm_errorf("NCCL is not part of the host emulation of CUDA (tools/cuda_emu): run GPU ranks on a GPU");
    return NULL;
}
