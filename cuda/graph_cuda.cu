// Queued launches and CUDA graphs. A decode step is a few hundred small kernels, and launching
// them one by one costs more host time than the GPU needs to run them. So ops do not launch:
// they queue (launcher, arguments), and a sync point (to_host, to_device, an upload) flushes the
// queue. A queue whose launchers and argument bytes equal those of an earlier flush is the same
// step again: the second time it is captured into a CUDA graph, from then on the graph is
// replayed with one launch. What changes between steps, the host index arrays (token ids,
// positions, slots), is not in the arguments: it is staged into a pinned ring that the graph's
// first node copies to the device, so kernels read it from the same device addresses each time.
// QLM_CUDA_GRAPHS=0 launches each op as it comes (for compute-sanitizer and debugging);
// QLM_CUDA_PROFILE=1 also times each one (see print_profile); QLM_CUDA_GRAPHS=report prints at exit
// how many queues were replayed, captured and launched op by op (a step that never replays has
// something in its arguments that changes every time).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

struct queued {
    qlm_cuda_launcher fn;
    size_t at, len; // the arguments' bytes in g_args
};

static int g_enabled = -1, g_profiling;
static queued *g_cmds;
static size_t g_n_cmds, g_cap_cmds;
static unsigned char *g_args;
static size_t g_args_len, g_args_cap;

// The ring of staged host ints: pinned on the host, mirrored on the device.
static const size_t RING_INTS = (size_t)1 << 20;
static int *g_ring_host, *g_ring_dev;
static size_t g_ring_used;
// Where the arrays of the op being prepared begin: an op hands out device addresses as it stages
// each array and queues itself after the last, so the ring is only ever emptied between ops.
static size_t g_ring_op;
// What the ring keeps free for one op's arrays: a queue that leaves less runs at the op's end.
static const size_t OP_RING_INTS = RING_INTS / 4;
static cudaEvent_t g_ring_free; // recorded after the copy that last read the host ring

// Graphs of earlier steps, found by the hash and bytes of their queue.
enum { GRAPH_SLOTS = 16, SEEN_SLOTS = 32 };
struct cached_graph {
    unsigned long long hash;
    unsigned char *sig;
    size_t sig_len;
    cudaGraphExec_t exec;
};
static cached_graph g_graphs[GRAPH_SLOTS];
static int g_next_graph;
static unsigned long long g_seen[SEEN_SLOTS]; // hashes of queues run once, not yet captured
static int g_next_seen;

// QLM_CUDA_GRAPHS=report: flushed queues by what became of them, and the ops in each kind.
enum { REPLAYED, CAPTURED, LAUNCHED, FLUSH_KINDS };
static long g_flushes[FLUSH_KINDS], g_flushed_ops[FLUSH_KINDS];

static void print_report(void) {
    fprintf(stderr, "qlm cuda graphs: %ld queues replayed (%ld ops), %ld captured (%ld ops), %ld launched op by op (%ld ops)\n",
            g_flushes[REPLAYED], g_flushed_ops[REPLAYED], g_flushes[CAPTURED], g_flushed_ops[CAPTURED],
            g_flushes[LAUNCHED], g_flushed_ops[LAUNCHED]);
}

static int enabled(void) {
    if (g_enabled < 0) {
        g_profiling = qlm_cuda_env_is("QLM_CUDA_PROFILE", "1");
        g_enabled = !qlm_cuda_env_is("QLM_CUDA_GRAPHS", "0") && !g_profiling;
        if (g_enabled && qlm_cuda_env_is("QLM_CUDA_GRAPHS", "report")) atexit(print_report);
        if (g_enabled) {
            CUDA_CHECK(cudaHostAlloc((void **)&g_ring_host, RING_INTS * sizeof(int), cudaHostAllocDefault));
            CUDA_CHECK(cudaMalloc((void **)&g_ring_dev, RING_INTS * sizeof(int)));
            CUDA_CHECK(cudaEventCreateWithFlags(&g_ring_free, cudaEventDisableTiming));
        }
    }
    return g_enabled;
}

static void grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return;
    size_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) qlm_cuda_fail("queue", "out of host memory", __FILE__, __LINE__);
    *p = q;
    *cap = c;
}

// ---- QLM_CUDA_PROFILE=1: every op launched alone between two events and waited for, its GPU
// time summed by name and printed at exit (graphs off; the sum against the wall time shows what
// launching costs) ----

struct profile_row {
    const char *name;
    double ms;
    long calls;
};
static profile_row g_profile[32];
static int g_n_profile;
static cudaEvent_t g_prof_start, g_prof_end;

static int by_time(const void *a, const void *b) {
    double d = ((const profile_row *)b)->ms - ((const profile_row *)a)->ms;
    return d > 0 ? 1 : d < 0 ? -1 : 0;
}

static void print_profile(void) {
    double total = 0;
    for (int i = 0; i < g_n_profile; i++) total += g_profile[i].ms;
    qsort(g_profile, (size_t)g_n_profile, sizeof *g_profile, by_time);
    fprintf(stderr, "qlm cuda profile (GPU time of each op, launched alone):\n%-18s %8s %10s %9s %6s\n", "op", "calls",
            "total ms", "avg us", "share");
    for (int i = 0; i < g_n_profile; i++)
        fprintf(stderr, "%-18s %8ld %10.2f %9.2f %5.1f%%\n", g_profile[i].name, g_profile[i].calls, g_profile[i].ms,
                1000 * g_profile[i].ms / g_profile[i].calls, 100 * g_profile[i].ms / total);
}

static void profiled(const char *name, qlm_cuda_launcher fn, const void *args) {
    if (g_n_profile == 0) {
        CUDA_CHECK(cudaEventCreate(&g_prof_start));
        CUDA_CHECK(cudaEventCreate(&g_prof_end));
        atexit(print_profile);
    }
    CUDA_CHECK(cudaEventRecord(g_prof_start, qlm_cuda_stream));
    fn(args);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaEventRecord(g_prof_end, qlm_cuda_stream));
    CUDA_CHECK(cudaEventSynchronize(g_prof_end));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, g_prof_start, g_prof_end));
    int i = 0;
    while (i < g_n_profile && strcmp(g_profile[i].name, name) != 0) i++;
    if (i == g_n_profile) {
        if (g_n_profile == (int)(sizeof g_profile / sizeof g_profile[0])) return;
        g_profile[g_n_profile++] = {name, 0, 0};
    }
    g_profile[i].ms += ms;
    g_profile[i].calls++;
}

void qlm_cuda_submit(const char *name, qlm_cuda_launcher fn, const void *args, size_t len) {
    if (!enabled()) {
        if (g_profiling)
            profiled(name, fn, args);
        else
            fn(args);
        LAUNCH_CHECK();
        return;
    }
    grow((void **)&g_cmds, &g_cap_cmds, g_n_cmds + 1, sizeof *g_cmds);
    grow((void **)&g_args, &g_args_cap, g_args_len + len, 1);
    memcpy(g_args + g_args_len, args, len);
    g_cmds[g_n_cmds++] = {fn, g_args_len, len};
    g_args_len += len;
    g_ring_op = g_ring_used;
    if (g_ring_used > RING_INTS - OP_RING_INTS) qlm_cuda_flush();
}

const void *qlm_cuda_stage(const void *host, size_t bytes, int which) {
    const size_t n = (bytes + sizeof(int) - 1) / sizeof(int);
    if (!enabled()) {
        static void *scratch[4];
        static size_t cap[4];
        void *d = qlm_cuda_scratch(&scratch[which], &cap[which], n * sizeof(int));
        // From pageable memory the copy is staged before the call returns, so host may change after.
        CUDA_CHECK(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, qlm_cuda_stream));
        return d;
    }
    const size_t need = (n + 31) & ~(size_t)31; // 128-byte steps: any struct's alignment holds
    if (g_ring_used + need > RING_INTS) {
        // Emptying the ring here would let the next queue's copy overwrite this op's earlier arrays.
        if (g_ring_used != g_ring_op || need > RING_INTS)
            qlm_cuda_fail("index arrays", "one op's arrays are longer than the staging ring keeps for it", __FILE__,
                          __LINE__);
        qlm_cuda_flush();
    }
    // The host ring is written again only once the copy of its last contents has run.
    if (g_ring_used == 0) CUDA_CHECK(cudaEventSynchronize(g_ring_free));
    memcpy(g_ring_host + g_ring_used, host, bytes);
    const int *d = g_ring_dev + g_ring_used;
    g_ring_used += need;
    return d;
}

qlm_cuda_ints qlm_cuda_ints_of(const int *host, int n, int which) {
    qlm_cuda_ints a;
    memset(&a, 0, sizeof a);
    a.present = host != NULL;
    if (!host || n <= 0) return a;
    if (!enabled() && n <= QLM_CUDA_SMALL)
        memcpy(a.small, host, (size_t)n * sizeof(int));
    else
        a.dev = (const int *)qlm_cuda_stage(host, (size_t)n * sizeof(int), which);
    return a;
}

// FNV-1a, a 64-bit word at a time (a decode step queues some 60 KB of arguments).
static unsigned long long mix(unsigned long long h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        unsigned long long w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 1099511628211ull;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

// The hash of the queue's launchers, arguments and ring length.
static unsigned long long queue_hash(void) {
    unsigned long long h = mix(1469598103934665603ull, g_cmds, g_n_cmds * sizeof *g_cmds);
    h = mix(h, g_args, g_args_len);
    return mix(h, &g_ring_used, sizeof g_ring_used);
}

// The queue as bytes: commands then arguments then the ring length.
static unsigned char *queue_sig(size_t *len) {
    size_t a = g_n_cmds * sizeof *g_cmds;
    *len = a + g_args_len + sizeof g_ring_used;
    unsigned char *s = (unsigned char *)malloc(*len);
    if (!s) return NULL;
    memcpy(s, g_cmds, a);
    memcpy(s + a, g_args, g_args_len);
    memcpy(s + a + g_args_len, &g_ring_used, sizeof g_ring_used);
    return s;
}

// 1 if the queue is byte for byte the one graph c was captured from.
static int same_queue(const cached_graph *c) {
    size_t a = g_n_cmds * sizeof *g_cmds;
    return c->sig_len == a + g_args_len + sizeof g_ring_used && memcmp(c->sig, g_cmds, a) == 0 &&
           memcmp(c->sig + a, g_args, g_args_len) == 0 &&
           memcmp(c->sig + a + g_args_len, &g_ring_used, sizeof g_ring_used) == 0;
}

static void run_queue(void) {
    if (g_ring_used)
        CUDA_CHECK(cudaMemcpyAsync(g_ring_dev, g_ring_host, g_ring_used * sizeof(int), cudaMemcpyHostToDevice,
                                   qlm_cuda_stream));
    for (size_t i = 0; i < g_n_cmds; i++) {
        g_cmds[i].fn(g_args + g_cmds[i].at);
        LAUNCH_CHECK();
    }
}

void qlm_cuda_flush(void) {
    if (!enabled() || (g_n_cmds == 0 && g_ring_used == 0)) return;
    unsigned long long h = queue_hash();
    int found = -1;
    for (int i = 0; i < GRAPH_SLOTS && found < 0; i++)
        if (g_graphs[i].exec && g_graphs[i].hash == h && same_queue(&g_graphs[i])) found = i;
    int seen = 0;
    for (int i = 0; i < SEEN_SLOTS && !seen; i++) seen = g_seen[i] == h;
    size_t sig_len = 0;
    unsigned char *sig = NULL;
    const int kind = found >= 0 ? REPLAYED : seen && (sig = queue_sig(&sig_len)) ? CAPTURED : LAUNCHED;
    g_flushes[kind]++;
    g_flushed_ops[kind] += (long)g_n_cmds;
    if (kind == REPLAYED) {
        CUDA_CHECK(cudaGraphLaunch(g_graphs[found].exec, qlm_cuda_stream)); // its first node copies the ring
    } else if (kind == CAPTURED) {
        // The second time this step runs: capture it (the ring copy included) and keep the graph.
        cudaGraph_t graph;
        CUDA_CHECK(cudaStreamBeginCapture(qlm_cuda_stream, cudaStreamCaptureModeThreadLocal));
        run_queue();
        CUDA_CHECK(cudaStreamEndCapture(qlm_cuda_stream, &graph));
        cached_graph *c = &g_graphs[g_next_graph];
        g_next_graph = (g_next_graph + 1) % GRAPH_SLOTS;
        if (c->exec) CUDA_CHECK(cudaGraphExecDestroy(c->exec));
        free(c->sig);
        CUDA_CHECK(cudaGraphInstantiate(&c->exec, graph, 0));
        CUDA_CHECK(cudaGraphDestroy(graph));
        c->hash = h;
        c->sig = sig;
        c->sig_len = sig_len;
        CUDA_CHECK(cudaGraphLaunch(c->exec, qlm_cuda_stream));
    } else {
        run_queue();
        g_seen[g_next_seen] = h;
        g_next_seen = (g_next_seen + 1) % SEEN_SLOTS;
    }
    CUDA_CHECK(cudaEventRecord(g_ring_free, qlm_cuda_stream));
    g_n_cmds = 0;
    g_args_len = 0;
    // A flush inside an op (the allocator's, to free cached blocks) leaves its arrays where they
    // are, behind the ones just copied, so that the next queue's copy carries them too.
    if (g_ring_used == g_ring_op) g_ring_used = g_ring_op = 0;
}
