// The host emulation's kernels: a launch is checked at once and queued on its stream
// (runtime.cpp runs the queue); a grid runs one block at a time, the block's threads as fibers on
// the host thread that runs it (so __syncthreads is a barrier and each warp's shuffles meet in an
// exchange array), blocks in order, so a race between blocks shows up as a wrong result instead of
// hiding; mma is computed from the PTX ISA's fragment layout. Blind to timing: it checks what
// kernels compute, not how fast. x86-64 only (emu_switch).
#include <pthread.h>
#include <sys/mman.h>

#include <map>

#include "cuda_emu.h"

dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
unsigned char *emu_dyn_smem;

// A block's threads are fibers on the launching thread, each on a stack of its own, switched only
// at barriers (a thread waiting at one hands over to the next): no system call per switch, where
// a host thread per GPU thread spent most of its time in futex waits and thread starts.
enum { FIBER_STACK = 256 << 10, MAX_THREADS = 1024 };
struct fiber {
    void *sp;          // saved stack pointer while switched out
    char *stack;       // FIBER_STACK bytes
    dim3 idx;
    bool done;
};
static fiber g_fibers[MAX_THREADS];
static int g_cur;
static void *g_sched_sp;
static const std::function<void()> *g_fn;


// emu_switch(save, to): saves the callee-saved registers and the stack pointer in *save, continues
// on the stack at to (the System V x86-64 ABI's callee-saved set: rbx, rbp, r12-r15).
extern "C" void emu_switch(void **save, void *to);
asm(R"(
.text
.globl emu_switch
.type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
)");

// AddressSanitizer is told of each switch of stacks, and a fiber's stack is made addressable again
// before it is reused (the frame of fiber_main, which never returns, keeps its poisoned redzones).
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
static void *g_fake;
static void switch_begin(const char *stack, size_t size) { __sanitizer_start_switch_fiber(&g_fake, stack, size); }
static void switch_end() { __sanitizer_finish_switch_fiber(g_fake, NULL, NULL); }
static void stack_reset(char *stack, size_t size) { __asan_unpoison_memory_region(stack, size); }
#else
static void switch_begin(const char *, size_t) {}
static void switch_end() {}
static void stack_reset(char *, size_t) {}
#endif
// The stack of the thread that runs the grid (the scheduler's), for the switches back to it.
static thread_local const char *g_sched_stack;
static thread_local size_t g_sched_stack_size;
static void find_sched_stack() {
    if (g_sched_stack) return;
    pthread_attr_t a;
    void *addr;
    if (pthread_getattr_np(pthread_self(), &a) != 0 || pthread_attr_getstack(&a, &addr, &g_sched_stack_size) != 0) {
        fprintf(stderr, "emu: the thread's stack is unknown\n");
        abort();
    }
    pthread_attr_destroy(&a);
    g_sched_stack = (const char *)addr;
}

// The current fiber hands over to the scheduler, which resumes it later.
static void yield() {
    switch_begin(g_sched_stack, g_sched_stack_size);
    emu_switch(&g_fibers[g_cur].sp, g_sched_sp);
    switch_end();
}

// A barrier of `expected` live threads; a thread that ends leaves it (arrive_and_drop).
struct barrier {
    int expected, arrived;
    unsigned phase;
    void arrive_and_wait() {
        const unsigned p = phase;
        if (++arrived == expected) {
            arrived = 0, phase++;
            return;
        }
        while (phase == p) yield();
    }
    void arrive_and_drop() {
        if (--expected > 0 && arrived == expected) arrived = 0, phase++;
    }
};
static barrier g_block_bar, g_warp_bar[32];
static uint64_t g_xchg[32][32];

static int linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
void emu_syncthreads() { g_block_bar.arrive_and_wait(); }
static int g_or;
int emu_syncthreads_or(int p) {
    if (p) g_or = 1;
    g_block_bar.arrive_and_wait();
    int r = g_or;
    g_block_bar.arrive_and_wait();
    if (linear_tid() == 0) g_or = 0;
    g_block_bar.arrive_and_wait();
    return r;
}
void emu_warp_xchg(uint64_t v, uint64_t *out, int src) {
    int t = linear_tid(), w = t >> 5, lane = t & 31;
    g_xchg[w][lane] = v;
    g_warp_bar[w].arrive_and_wait();
    *out = g_xchg[w][src];
    g_warp_bar[w].arrive_and_wait();
}

void emu_syncwarp() { g_warp_bar[linear_tid() >> 5].arrive_and_wait(); }

// Dynamic shared memory a kernel may take: 48 KiB, or what cudaFuncSetAttribute raised it to, up to
// the 227 KiB of a Hopper block (static shared memory not counted: it is not known here).
enum { SMEM_DEFAULT = 48 << 10, SMEM_OPT_IN_MAX = 227 << 10 };
static std::mutex g_smem_mutex;
static std::map<const void *, int> g_smem_limit;
void emu_set_smem_limit(const void *kernel, int bytes) {
    if (bytes > SMEM_OPT_IN_MAX) { fprintf(stderr, "emu: shared memory limit of %d bytes asked\n", bytes); abort(); }
    std::lock_guard<std::mutex> g(g_smem_mutex);
    g_smem_limit[kernel] = bytes;
}

unsigned emu_block_epoch = 1;

// Where a fiber starts (emu_switch's ret lands here): runs the kernel, leaves the barriers, and
// hands over for good.
static void fiber_main() {
    switch_end();
    (*g_fn)();
    fiber &f = g_fibers[g_cur];
    f.done = true;
    g_block_bar.arrive_and_drop();
    g_warp_bar[linear_tid() >> 5].arrive_and_drop();
    switch_begin(g_sched_stack, g_sched_stack_size);
    emu_switch(&f.sp, g_sched_sp);
    abort(); // never resumed
}

// A fresh stack for fiber f whose first switch returns into fiber_main, with the stack pointer as
// after a call (16-aligned plus the return address).
static void fiber_start(fiber &f) {
    if (!f.stack) {
        f.stack = (char *)mmap(NULL, FIBER_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (f.stack == MAP_FAILED) { fprintf(stderr, "emu: no memory for a fiber's stack\n"); abort(); }
    }
    stack_reset(f.stack, FIBER_STACK);
    void **top = (void **)(f.stack + FIBER_STACK);
    *--top = NULL;                         // fiber_main's return address: it never returns
    *--top = (void *)fiber_main;           // emu_switch's ret
    for (int r = 0; r < 6; r++) *--top = NULL; // rbp, rbx, r12-r15
    f.sp = top;
    f.done = false;
}

// QLM_EMU_ORDER=reverse runs a grid's blocks, and a block's threads between two barriers, last to
// first. Fibers switch only at barriers, so a missing __syncthreads or __syncwarp goes unseen when
// the thread that writes runs before the one that reads; one run in each order shows both sides of
// such a race, as a race between blocks that one order hides.
static bool reverse_order() {
    static const bool rev = [] {
        const char *e = getenv("QLM_EMU_ORDER");
        if (!e || !*e || strcmp(e, "forward") == 0) return false;
        if (strcmp(e, "reverse") == 0) return true;
        fprintf(stderr, "emu: QLM_EMU_ORDER=%s (forward or reverse)\n", e);
        abort();
    }();
    return rev;
}

// One grid, run to its end on the calling thread (runtime.cpp serializes the queues' runs).
static void run_grid(const std::function<void()> &fn, dim3 grid, dim3 block, size_t smem) {
    const int nt = block.x * block.y * block.z;
    const bool rev = reverse_order();
    blockDim = block, gridDim = grid;
    // Exactly smem bytes (16-aligned, as new gives), so that the AddressSanitizer build reports a
    // kernel's access past them.
    std::vector<unsigned char> dyn(smem ? smem : 1);
    emu_dyn_smem = dyn.data();
    g_fn = &fn;
    find_sched_stack();
    const size_t nb = (size_t)grid.x * grid.y * grid.z;
    for (size_t i = 0; i < nb; i++) {
        const size_t b = rev ? nb - 1 - i : i;
        blockIdx = dim3(b % grid.x, b / grid.x % grid.y, b / grid.x / grid.y);
        g_block_bar = {nt, 0, 0};
        for (int w = 0; w < (nt + 31) / 32; w++) g_warp_bar[w] = {std::min(32, nt - 32 * w), 0, 0};
        memset(dyn.data(), 0xff, dyn.size()); // NaNs: shared memory starts as garbage
        emu_block_epoch++;                     // static shared arrays too (emu_shared_array)
        for (int t = 0; t < nt; t++) {
            g_fibers[t].idx = dim3(t % block.x, t / block.x % block.y, t / block.x / block.y);
            fiber_start(g_fibers[t]);
        }
        for (int live = nt; live > 0;)
            for (int j = 0; j < nt; j++) {
                const int t = rev ? nt - 1 - j : j;
                fiber &f = g_fibers[t];
                if (f.done) continue;
                g_cur = t;
                threadIdx = f.idx;
                switch_begin(f.stack, FIBER_STACK);
                emu_switch(&g_sched_sp, f.sp);
                switch_end();
                if (f.done) live--;
            }
    }
}

// What the GPU refuses at launch stops the run here, where the launch is; the grid runs when
// its stream is waited for.
void emu_launch(const void *kernel, std::function<void()> fn, dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
    const int nt = block.x * block.y * block.z;
    if (nt <= 0 || nt > MAX_THREADS) { fprintf(stderr, "emu: block of %d threads\n", nt); abort(); }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
        fprintf(stderr, "emu: grid of %u x %u x %u\n", grid.x, grid.y, grid.z);
        abort();
    }
    {
        std::lock_guard<std::mutex> g(g_smem_mutex);
        auto it = g_smem_limit.find(kernel);
        const size_t limit = it == g_smem_limit.end() ? SMEM_DEFAULT : it->second;
        if (smem > limit) { fprintf(stderr, "emu: %zu bytes of dynamic shared memory, limit %zu\n", smem, limit); abort(); }
    }
    emu_enqueue(stream, [fn = std::move(fn), grid, block, smem] { run_grid(fn, grid, block, smem); });
}

static unsigned g_frag[32][32][6];
void emu_mma_bf16(float d[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    int t = linear_tid(), w = t >> 5, lane = t & 31;
    unsigned *f = g_frag[w][lane];
    f[0] = a0, f[1] = a1, f[2] = a2, f[3] = a3, f[4] = b0, f[5] = b1;
    g_warp_bar[w].arrive_and_wait();
    auto bf = [](unsigned r, int hi) { return __uint_as_float(hi ? r & 0xffff0000u : r << 16); };
    auto A = [&](int row, int k) { // row g: regs 0 (k 0-7), 2 (k 8-15); row g + 8: regs 1, 3
        int g = row & 7, hi8 = row >> 3, tt = (k & 7) >> 1, reg = hi8 + 2 * (k >> 3);
        return bf(g_frag[w][4 * g + tt][reg], k & 1);
    };
    auto B = [&](int k, int col) { int tt = (k & 7) >> 1; return bf(g_frag[w][4 * col + tt][4 + (k >> 3)], k & 1); };
    int g = lane >> 2, tq = lane & 3;
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i >> 1), col = 2 * tq + (i & 1);
        double s = 0;
        for (int k = 0; k < 16; k++) s += (double)A(row, k) * B(k, col);
        d[i] = (float)s;
    }
    g_warp_bar[w].arrive_and_wait();
}
void emu_mma_i8(int c[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    int t = linear_tid(), w = t >> 5, lane = t & 31;
    unsigned *f = g_frag[w][lane];
    f[0] = a0, f[1] = a1, f[2] = a2, f[3] = a3, f[4] = b0, f[5] = b1;
    g_warp_bar[w].arrive_and_wait();
    auto byte = [](unsigned r, int k) { return (r >> (8 * (k & 3))) & 0xff; };
    auto A = [&](int row, int k) { // row g: regs 0 (k 0-15), 2 (k 16-31); row g + 8: regs 1, 3
        int g = row & 7, hi8 = row >> 3, tt = (k & 15) >> 2, reg = hi8 + 2 * (k >> 4);
        return (int)(signed char)byte(g_frag[w][4 * g + tt][reg], k);
    };
    auto B = [&](int k, int col) {
        return (int)(signed char)byte(g_frag[w][4 * col + ((k & 15) >> 2)][4 + (k >> 4)], k);
    };
    int g = lane >> 2, tq = lane & 3, d[4];
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i >> 1), col = 2 * tq + (i & 1);
        long long s = c[i];
        for (int k = 0; k < 32; k++) s += (long long)A(row, k) * B(k, col);
        d[i] = (int)(unsigned)s;
    }
    g_warp_bar[w].arrive_and_wait();
    for (int i = 0; i < 4; i++) c[i] = d[i];
}
