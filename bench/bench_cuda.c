/* Times the CUDA op table on operands of one decode step of a TinyLlama-1.1B-shaped model
 * (hidden 2048, FFN 5632, 32 heads of 64 over 4 KV heads) and of SmolLM2-135M's (576 / 1536):
 * each op queued `reps` times, flushed and synchronized, three rounds (the third replays the CUDA
 * graph the second captured, as decode does); prints microseconds per op and, for the matmuls
 * (one row of x, and two GEMVs of 8 and 4 rows), the weight bytes streamed per second against the
 * device-to-device copy bandwidth; then 512-row prefill products (cuBLAS's BF16 GEMM, INT8's
 * integer GEMM) in TFLOP/s.
 * Usage: bench_cuda [reps]   (built by `make CUDA=1 build/cuda/bench/bench_cuda`) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/clock.h"
#include "../core/backend.h"
#include "../core/error.h"
#include "../core/kv_cache.h"
#include "../quant/quantize.h"

static const qlm_backend *gpu;

static float *dev_floats(long n, float amp) {
    float *h = malloc((size_t)n * sizeof *h), *d = gpu->alloc((size_t)n * sizeof *d);
    if (!h || !d) exit(1);
    unsigned s = 12345u + (unsigned)n;
    for (long i = 0; i < n; i++) s = s * 1664525u + 1013904223u, h[i] = amp * ((s >> 8) / 16777216.0f * 2 - 1);
    gpu->to_device(d, h, (size_t)n * sizeof *h);
    free(h);
    return d;
}

static qlm_weight dev_weight(qlm_dtype dt, int rows, int cols) {
    size_t n = (size_t)rows * cols;
    float *w = malloc(n * sizeof *w);
    void *buf = malloc(n * qlm_dtype_size(dt));
    if (!w || !buf) exit(1);
    for (size_t i = 0; i < n; i++) w[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    qlm_weight q = {.dtype = dt, .rows = rows, .cols = cols, .scale = 1.0f};
    if (dt == QLM_I8)
        q.scale = qlm_quantize_i8(buf, w, rows, cols);
    else
        qlm_convert_from_f32(buf, dt, w, (long)n);
    free(w);
    q.data = gpu->upload(buf, n * qlm_dtype_size(dt));
    if (!q.data) exit(1);
    if (q.data != buf) free(buf);
    return q;
}

typedef void (*op_fn)(void *ctx);

/* Microseconds per call of the third round. */
static double time_op(op_fn fn, void *ctx, int reps, float *sink) {
    float h;
    double us = 0;
    for (int round = 0; round < 3; round++) {
        double t0 = qlm_now_s();
        for (int r = 0; r < reps; r++) fn(ctx);
        gpu->to_host(&h, sink, sizeof h);
        us = (qlm_now_s() - t0) * 1e6 / reps;
    }
    return us;
}

typedef struct {
    qlm_matmul_out outs[3];
    int count, n;
    const float *x;
    const qlm_x_step *step; /* NULL: x as given */
    const qlm_kv_step *kv;  /* NULL: none */
} mm_ctx;

static void run_mm(void *p) {
    mm_ctx *c = p;
    if (c->step)
        (void)gpu->step_matmul_group(c->outs, c->count, c->step, c->kv, c->n);
    else if (c->count == 1)
        gpu->matmul(c->outs[0].y, c->x, c->n, c->outs[0].w, NULL);
    else
        (void)gpu->matmul_group(c->outs, c->count, c->x, c->n);
}

typedef struct {
    float *out, *q, *x, *w, *h, *inv;
    void *kc, *vc;
    qlm_attn_shape sh;
    int pos, dim, heads, kv_heads, hd, hidden, max_pos, kv_dtype;
} step_ctx;

static void run_rmsnorm(void *p) { step_ctx *c = p; gpu->rmsnorm(c->out, c->x, c->w, 1, c->dim, 1e-5f); }
static void run_rope(void *p) { step_ctx *c = p; gpu->rope(c->q, c->x, 1, &c->pos, c->heads, c->kv_heads, c->hd, c->inv); }
static void run_kv_store(void *p) {
    step_ctx *c = p;
    gpu->kv_store(c->kc, c->vc, (qlm_dtype)c->kv_dtype, c->q, c->x, 1, NULL, 0, &c->pos, c->kv_heads, c->hd, c->max_pos);
}
static void run_rope_store(void *p) {
    step_ctx *c = p;
    const qlm_kv_step kv = {.pos = &c->pos, .inv_freq = c->inv, .n_heads = c->heads, .n_kv_heads = c->kv_heads,
                            .head_dim = c->hd, .k_cache = c->kc, .v_cache = c->vc, .kv = (qlm_dtype)c->kv_dtype,
                            .store_pos = &c->pos, .max_pos = c->max_pos};
    gpu->rope_store(c->q, c->x, c->out, 1, &kv);
}
static void run_attention(void *p) { step_ctx *c = p; gpu->attention(c->out, c->q, c->kc, c->vc, 1, &c->pos, &c->sh); }
static void run_add(void *p) { step_ctx *c = p; gpu->add(c->x, c->out, c->dim); }
static void run_glu(void *p) { step_ctx *c = p; gpu->glu(c->h, c->h, c->h, c->hidden, QLM_ACT_SILU); }

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 200;
    gpu = qlm_backend_cuda();
    if (!gpu) {
        fprintf(stderr, "bench_cuda: %s\n", qlm_last_error());
        return 1;
    }
    char line[256];
    gpu->describe(line, sizeof line);
    double bw = gpu->bandwidth_gbs();
    printf("%s\ndevice-to-device copy: %.0f GB/s (read + write)\n\n", line, bw);
    printf("| op | shape | dtype | us/op | GB/s | of copy bw |\n| --- | --- | --- | ---: | ---: | ---: |\n");
    /* n rows of x (1 in decode; the GEMV takes up to 8, a batch of sequences); step: 1 the norm
     * before the products, 2 the GLU, formed as the GEMV loads x (step_matmul_group), 0 none; kv:
     * RoPE on q and k (heads of 64) and k and v into BF16 caches as the products are made. */
    const struct {
        const char *name;
        int rows[3], count, cols, n, step, kv;
    } mms[] = {
        {"q_proj", {2048}, 1, 2048, 1, 0, 0},
        {"gate+up", {5632, 5632}, 2, 2048, 1, 0, 0},
        {"down", {2048}, 1, 5632, 1, 0, 0},
        {"q+k+v", {2048, 256, 256}, 3, 2048, 1, 0, 0},
        {"norm + q+k+v", {2048, 256, 256}, 3, 2048, 1, 1, 0},
        {"norm + q+k+v + rope_store", {2048, 256, 256}, 3, 2048, 1, 1, 1},
        {"glu + down", {2048}, 1, 5632, 1, 2, 0},
        {"smol q", {576}, 1, 576, 1, 0, 0},
        {"smol down", {576}, 1, 1536, 1, 0, 0},
        {"smol norm + q+k+v", {576, 192, 192}, 3, 576, 1, 1, 0},
        {"smol norm + q+k+v + rope_store", {576, 192, 192}, 3, 576, 1, 1, 1},
        {"smol glu + down", {576}, 1, 1536, 1, 2, 0},
        {"q_proj, 8 rows", {2048}, 1, 2048, 8, 0, 0},
        {"smol q, 4 rows", {576}, 1, 576, 4, 0, 0},
    };
    const qlm_dtype dts[] = {QLM_BF16, QLM_I8};
    float *x = dev_floats(8 * 8192, 1.0f), *x2 = dev_floats(8 * 8192, 1.0f), *formed = dev_floats(8 * 8192, 1.0f);
    float *norm_w = dev_floats(8192, 1.0f), *inv_freq = dev_floats(32, 0.1f);
    const qlm_x_step steps[] = {{QLM_X_RMSNORM, formed, x, NULL, norm_w, 1e-5f, QLM_ACT_SILU},
                                {QLM_X_GLU, formed, x, x2, NULL, 0.0f, QLM_ACT_SILU}};
    const int kv_pos = 100, kv_max_pos = 2048;
    void *kv_cache[2] = {dev_floats(4L * kv_max_pos * 64 / 2, 1.0f), dev_floats(4L * kv_max_pos * 64 / 2, 1.0f)};
    for (size_t d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof mms / sizeof mms[0]; i++) {
            const qlm_kv_step kv = {.pos = &kv_pos, .inv_freq = inv_freq, .n_heads = mms[i].rows[0] / 64,
                                    .n_kv_heads = mms[i].rows[1] / 64, .head_dim = 64, .k_cache = kv_cache[0],
                                    .v_cache = kv_cache[1], .kv = QLM_BF16, .store_pos = &kv_pos,
                                    .max_pos = kv_max_pos};
            mm_ctx c = {.count = mms[i].count, .n = mms[i].n, .x = x, .step = mms[i].step ? &steps[mms[i].step - 1] : NULL,
                        .kv = mms[i].kv ? &kv : NULL};
            qlm_weight w[3];
            double bytes = 0;
            for (int k = 0; k < c.count; k++) {
                w[k] = dev_weight(dts[d], mms[i].rows[k], mms[i].cols);
                c.outs[k] = (qlm_matmul_out){gpu->alloc((size_t)c.n * mms[i].rows[k] * sizeof(float)), &w[k], NULL, 0};
                bytes += (double)mms[i].rows[k] * mms[i].cols * qlm_dtype_size(dts[d]);
            }
            double us = time_op(run_mm, &c, reps, c.outs[0].y);
            printf("| %s | %dx%d | %s | %.2f | %.0f | %.0f%% |\n", mms[i].name, mms[i].rows[0] * c.count, mms[i].cols,
                   qlm_dtype_name(dts[d]), us, bytes / us * 1e-3, 100 * bytes / us * 1e-3 / bw);
            for (int k = 0; k < c.count; k++) gpu->free((void *)w[k].data), gpu->free(c.outs[k].y);
        }
    step_ctx c = {.dim = 2048, .heads = 32, .kv_heads = 4, .hd = 64, .hidden = 5632, .max_pos = 2048};
    c.out = dev_floats(8192, 1.0f), c.q = dev_floats(8192, 1.0f), c.x = dev_floats(8192, 1.0f);
    c.w = dev_floats(2048, 1.0f), c.h = dev_floats(5632, 1.0f), c.inv = dev_floats(32, 0.1f);
    printf("| rmsnorm | 1x2048 | f32 | %.2f | | |\n", time_op(run_rmsnorm, &c, reps, c.out));
    printf("| rope | 32 + 4 heads x 64 | f32 | %.2f | | |\n", time_op(run_rope, &c, reps, c.q));
    printf("| add | 2048 | f32 | %.2f | | |\n", time_op(run_add, &c, reps, c.x));
    printf("| glu | 5632 | f32 | %.2f | | |\n", time_op(run_glu, &c, reps, c.h));
    for (int bf = 0; bf < 2; bf++) {
        c.kv_dtype = bf ? QLM_BF16 : QLM_F32;
        long cache = (long)c.kv_heads * c.max_pos * c.hd;
        c.kc = dev_floats(cache, 1.0f), c.vc = dev_floats(cache, 1.0f);
        c.sh = (qlm_attn_shape){.n_heads = 32, .n_kv_heads = 4, .head_dim = 64, .scale = 0.125f};
        qlm_kv_shape(&c.sh, c.max_pos, (qlm_dtype)c.kv_dtype);
        c.pos = 100;
        printf("| kv_store | k and v, 4 heads x 64 | %s | %.2f | | |\n", bf ? "bf16" : "f32", time_op(run_kv_store, &c, reps, c.out));
        printf("| rope_store | rope + kv_store | %s | %.2f | | |\n", bf ? "bf16" : "f32",
               time_op(run_rope_store, &c, reps, c.q));
        const int ctxs[] = {128, 1024, 2047};
        for (int k = 0; k < 3; k++) {
            c.pos = ctxs[k];
            printf("| attention | 1 row, %d keys | %s | %.2f | | |\n", ctxs[k] + 1, bf ? "bf16" : "f32",
                   time_op(run_attention, &c, reps, c.out));
        }
        gpu->free(c.kc), gpu->free(c.vc);
    }
    /* Prefill: 512 rows of x through the many-row path (cuBLAS; INT8 its integer GEMM over x's I16
     * form, x made into bytes first), in multiply-adds (x 2) per second. */
    printf("\n| prefill product | shape | dtype | us/op | TFLOP/s |\n| --- | --- | --- | ---: | ---: |\n");
    const struct {
        const char *name;
        int rows, count, cols;
    } pre[] = {{"q_proj", 2048, 1, 2048}, {"gate+up", 5632, 2, 2048}, {"down", 2048, 1, 5632}};
    enum { PREFILL_ROWS = 512 };
    float *xp = dev_floats((long)PREFILL_ROWS * 5632, 1.0f);
    for (size_t d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++) {
            mm_ctx m = {.count = pre[i].count, .n = PREFILL_ROWS, .x = xp};
            qlm_weight w[2];
            for (int k = 0; k < m.count; k++) {
                w[k] = dev_weight(dts[d], pre[i].rows, pre[i].cols);
                m.outs[k] = (qlm_matmul_out){gpu->alloc((size_t)PREFILL_ROWS * pre[i].rows * sizeof(float)), &w[k], NULL, 0};
            }
            double us = time_op(run_mm, &m, reps / 4 + 1, m.outs[0].y);
            double flop = 2.0 * PREFILL_ROWS * pre[i].rows * m.count * pre[i].cols;
            printf("| %s | %d x %dx%d | %s | %.2f | %.1f |\n", pre[i].name, PREFILL_ROWS, pre[i].rows * m.count,
                   pre[i].cols, qlm_dtype_name(dts[d]), us, flop / us * 1e-6);
            for (int k = 0; k < m.count; k++) gpu->free((void *)w[k].data), gpu->free(m.outs[k].y);
        }
    gpu->free(xp);
    return 0;
}
