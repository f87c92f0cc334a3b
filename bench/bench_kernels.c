/* Kernel benchmark: memory bandwidth, then GEMV (decode, n = 1) and GEMM (prefill) speed per
 * weight dtype for the SmolLM2-135M matrix shapes (GEMM also flan-t5-base's), a batched decode
 * step's attention (SmolLM2's self-attention, flan-t5-base's cross-attention) and a prompt's
 * (SmolLM2's causal self-attention over 512 and 2048 rows).
 *
 * GEMV runs "cold": it cycles through enough copies of the matrix to exceed the caches, as
 * decode does (a whole model never fits in L3), so GB/s is comparable with the measured
 * bandwidth. --hot reuses one copy instead. GEMM reuses one copy (it is compute-bound).
 *
 * usage: bench_kernels [--isa scalar|avx2|avxvnni|avx512|avx512vnni|avx512bf16|amx] [--hot] [--n N] [--quick] [--only gemv|gemm|attention] */
#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "cpu/backend_cpu_attention.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cpu/membw.h"
#include "quant/block_pack.h"
#include "quant/block_quant.h"
#include "quant/half.h"
#include "quant/matmul.h"
#include "quant/quantize.h"

/* Bytes of weight copies a cold GEMV cycles through: 4x a 32 MiB L3. */
#define COLD_BYTES (128L << 20)

typedef struct {
    const char *name;
    int rows, cols;
} shape;

static const shape k_shapes[] = {
    {"q/o 576x576", 576, 576},      {"k/v 192x576", 192, 576},         {"gate/up 1536x576", 1536, 576},
    {"down 576x1536", 576, 1536},   {"lm_head 49152x576", 49152, 576},
};
#define NSHAPES (int)(sizeof k_shapes / sizeof k_shapes[0])

/* flan-t5-base's encoder products, for GEMM only: its FFN's down projection has rows of 4 KiB in
 * BF16 (see qlm_x_row_stride). */
static const shape k_t5_shapes[] = {
    {"t5 q+k+v 2304x768", 2304, 768}, {"t5 gate+up 4096x768", 4096, 768}, {"t5 down 768x2048", 768, 2048}};
#define NT5SHAPES (int)(sizeof k_t5_shapes / sizeof k_t5_shapes[0])

typedef struct {
    qlm_dtype dtype;
    int per_row; /* I8 only */
    const char *label;
    int group; /* block types */
    int act8;  /* W8A8 */
} variant;

static const variant k_variants[] = {
    {QLM_F32, 0, "f32", 0, 0},          {QLM_F16, 0, "f16", 0, 0},      {QLM_BF16, 0, "bf16", 0, 0},
    {QLM_I8, 0, "int8", 0, 0},          {QLM_I8, 1, "int8/row", 0, 0},  {QLM_Q8_0, 0, "q8_0", 32, 0},
    {QLM_Q8_0, 0, "q8_0/a8", 32, 1},    {QLM_Q4_0, 0, "q4_0", 32, 0},   {QLM_Q4_0, 0, "q4_0/a8", 32, 1},
    {QLM_Q4_1, 0, "q4_1", 32, 0},       {QLM_Q4_1, 0, "q4_1/a8", 32, 1}, {QLM_Q4_0, 0, "q4_0/128", 128, 0},
};
#define NVARIANTS (int)(sizeof k_variants / sizeof k_variants[0])


static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* Copies of one random rows x cols matrix in the variant's dtype, back to back. */
typedef struct {
    void *data;
    float *row_scales;
    float scale;
    size_t bytes; /* of one copy */
    long copies;
} weights;

static void weights_free(weights *wt) {
    free(wt->data);
    free(wt->row_scales);
    wt->data = NULL;
    wt->row_scales = NULL;
}

static int weights_make(weights *wt, const shape *s, const variant *v, long copies) {
    long n = (long)s->rows * s->cols;
    float *f = malloc((size_t)n * sizeof(float));
    wt->bytes = (size_t)s->rows * qlm_dtype_row_bytes(v->dtype, s->cols, v->group);
    wt->copies = copies;
    wt->data = malloc(wt->bytes * (size_t)copies);
    wt->row_scales = v->per_row ? malloc((size_t)s->rows * sizeof(float)) : NULL;
    if (!f || !wt->data || (v->per_row && !wt->row_scales)) {
        free(f);
        weights_free(wt);
        return qlm_errorf("bench: cannot allocate %zu MiB of weights", (wt->bytes * (size_t)copies) >> 20);
    }
    for (long i = 0; i < n; i++) f[i] = frand() * 0.05f;
    wt->scale = 1.0f;
    if (v->dtype == QLM_I8 && v->per_row)
        qlm_quantize_i8_rows(wt->data, wt->row_scales, f, s->rows, s->cols);
    else if (v->dtype == QLM_I8)
        wt->scale = qlm_quantize_i8(wt->data, f, s->rows, s->cols);
    else if (qlm_dtype_is_block(v->dtype)) {
        for (int r = 0; r < s->rows; r++)
            qlm_block_quantize_row((char *)wt->data + (size_t)r * (wt->bytes / s->rows), v->dtype, v->group,
                                   f + (long)r * s->cols, s->cols);
        if (v->act8 && qlm_block_to_panels(wt->data, v->dtype, v->group, s->rows, s->cols) != 0) {
            free(f);
            weights_free(wt);
            return -1;
        }
    }
    else
        qlm_convert_from_f32(wt->data, v->dtype, f, n);
    for (long c = 1; c < copies; c++) memcpy((char *)wt->data + (size_t)c * wt->bytes, wt->data, wt->bytes);
    free(f);
    return 0;
}

static qlm_weight weights_copy(const weights *wt, const shape *s, const variant *v, long c) {
    return (qlm_weight){.dtype = v->dtype,
                        .rows = s->rows,
                        .cols = s->cols,
                        .data = (const char *)wt->data + (size_t)c * wt->bytes,
                        .scale = wt->scale,
                        .row_scales = wt->row_scales,
                        .group = v->group,
                        .act8 = v->act8};
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Seconds per qlm_matmul call over about budget_s, cycling through the copies: the 20th
 * percentile of the call times. Not the mean: on a shared 2-core machine one preemption of an
 * OpenMP thread costs a whole scheduler tick and would swamp microsecond calls. */
static double time_matmul(const weights *wt, const shape *s, const variant *v, int n, const float *x, float *y,
                          double budget_s) {
    enum { MAX_CALLS = 1 << 16 };
    static double times[MAX_CALLS];
    int calls = 0;
    long c = 0;
    double start = qlm_now_s(), t0 = start, t1;
    do {
        qlm_weight w = weights_copy(wt, s, v, c);
        qlm_matmul(y, x, n, &w, NULL);
        c = (c + 1) % wt->copies;
        t1 = qlm_now_s();
        times[calls++] = t1 - t0;
        t0 = t1;
    } while (t1 - start < budget_s && calls < MAX_CALLS);
    qsort(times, (size_t)calls, sizeof times[0], cmp_double);
    return times[calls / 5];
}

static double memcpy_gbs(void) {
    size_t bytes = (size_t)COLD_BYTES / 2;
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        free(a);
        free(b);
        return -1;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 1e30;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = qlm_now_s();
#pragma omp parallel
        {
            int nt = omp_get_num_threads(), t = omp_get_thread_num();
            size_t chunk = bytes / (size_t)nt, off = chunk * (size_t)t;
            memcpy(b + off, a + off, t == nt - 1 ? bytes - off : chunk);
        }
        double dt = qlm_now_s() - t0;
        if (dt < best) best = dt;
    }
    free(a);
    free(b);
    /* memcpy reads and writes every byte. */
    return 2.0 * (double)bytes / best / 1e9;
}

typedef struct {
    int hot, quick, gemm_n;
    const char *only; /* "gemv", "gemm", "attention" or NULL for all */
} options;

static int parse_args(int argc, char **argv, options *o) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--hot") == 0) {
            o->hot = 1;
        } else if (strcmp(argv[i], "--quick") == 0) {
            o->quick = 1;
        } else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
            if (qlm_matmul_force_isa(argv[++i]) != 0) {
                fprintf(stderr, "bench_kernels: %s\n", qlm_last_error());
                return -1;
            }
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            o->only = argv[++i];
        } else if (strcmp(argv[i], "--n") == 0 && i + 1 < argc) {
            o->gemm_n = atoi(argv[++i]);
            if (o->gemm_n < 1 || o->gemm_n > 4096) {
                fprintf(stderr, "bench_kernels: --n must be in 1..4096\n");
                return -1;
            }
        } else {
            fprintf(stderr, "usage: bench_kernels [--isa scalar|avx2|avxvnni|avx512|avx512vnni|avx512bf16|amx] [--hot] [--n N] [--quick] [--only gemv|gemm|attention]\n");
            return -1;
        }
    }
    return 0;
}

/* Seconds per GEMV for each shape and variant, printing one row per pair. The variants of a
 * shape are timed in ROUNDS interleaved rounds and the best round counts, so a burst of other
 * load on the machine spoils one round of one variant rather than a whole row. */
#define ROUNDS 4
static int bench_gemv(const options *o, double bw, double gemv_s[NSHAPES][NVARIANTS]) {
    double budget = (o->quick ? 0.15 : 0.6) / ROUNDS;
    printf("\nGEMV n=1 (%s)\n%-20s %-9s %10s %9s %9s %8s\n", o->hot ? "hot: one copy" : "cold: cycling copies > L3",
           "shape", "dtype", "us/call", "GFLOP/s", "GB/s", "of BW");
    for (int si = 0; si < NSHAPES; si++) {
        const shape *s = &k_shapes[si];
        float *x = malloc((size_t)s->cols * sizeof(float)), *y = malloc((size_t)s->rows * sizeof(float));
        weights wt[NVARIANTS] = {{0}};
        int ok = x && y;
        if (!ok) qlm_errorf("bench: out of memory");
        for (int vi = 0; ok && vi < NVARIANTS; vi++) {
            const variant *v = &k_variants[vi];
            size_t bytes = (size_t)s->rows * qlm_dtype_row_bytes(v->dtype, s->cols, v->group);
            long copies = o->hot ? 1 : (long)((COLD_BYTES + bytes - 1) / bytes);
            if (copies < 2 && !o->hot) copies = 2;
            ok = weights_make(&wt[vi], s, v, copies) == 0;
        }
        if (ok) {
            for (int k = 0; k < s->cols; k++) x[k] = frand();
            for (int vi = 0; vi < NVARIANTS; vi++) gemv_s[si][vi] = 1e30;
            for (int round = 0; round < ROUNDS; round++)
                for (int vi = 0; vi < NVARIANTS; vi++) {
                    double t = time_matmul(&wt[vi], s, &k_variants[vi], 1, x, y, budget);
                    if (t < gemv_s[si][vi]) gemv_s[si][vi] = t;
                }
            for (int vi = 0; vi < NVARIANTS; vi++) {
                double t = gemv_s[si][vi], gbs = (double)wt[vi].bytes / t / 1e9;
                printf("%-20s %-9s %10.2f %9.2f %9.2f %7.0f%%\n", s->name, k_variants[vi].label, t * 1e6,
                       2.0 * s->rows * s->cols / t / 1e9, gbs, 100.0 * gbs / bw);
            }
        }
        for (int vi = 0; vi < NVARIANTS; vi++) weights_free(&wt[vi]);
        free(x);
        free(y);
        if (!ok) return -1;
    }
    return 0;
}

static int bench_gemm(const options *o) {
    int n = o->gemm_n;
    double budget = o->quick ? 0.15 : 0.5;
    printf("\nGEMM n=%d (prefill, hot)\n%-20s %-9s %10s %9s\n", n, "shape", "dtype", "ms/call", "GFLOP/s");
    for (int si = 0; si < NSHAPES + NT5SHAPES; si++) {
        const shape *s = si < NSHAPES ? &k_shapes[si] : &k_t5_shapes[si - NSHAPES];
        float *x = malloc((size_t)n * s->cols * sizeof(float)), *y = malloc((size_t)n * s->rows * sizeof(float));
        if (!x || !y) {
            free(x);
            free(y);
            return qlm_errorf("bench: out of memory");
        }
        for (long k = 0; k < (long)n * s->cols; k++) x[k] = frand();
        for (int vi = 0; vi < NVARIANTS; vi++) {
            const variant *v = &k_variants[vi];
            weights wt;
            if (weights_make(&wt, s, v, 1) != 0) {
                free(x);
                free(y);
                return -1;
            }
            double t = time_matmul(&wt, s, v, n, x, y, budget);
            printf("%-20s %-9s %10.3f %9.2f\n", s->name, v->label, t * 1e3, 2.0 * n * s->rows * s->cols / t / 1e9);
            if (v->dtype == QLM_F32) {
                /* Reference: one sgemm call threaded by OpenBLAS itself. */
                double best = 1e30;
                for (int rep = 0; rep < 5; rep++) {
                    double t0 = qlm_now_s();
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, s->rows, s->cols, 1.0f, x, s->cols,
                                wt.data, s->cols, 0.0f, y, s->rows);
                    double dt = qlm_now_s() - t0;
                    if (dt < best) best = dt;
                }
                printf("%-20s %-9s %10.3f %9.2f\n", s->name, "(blas)", best * 1e3,
                       2.0 * n * s->rows * s->cols / best / 1e9);
            }
            weights_free(&wt);
        }
        free(x);
        free(y);
    }
    return 0;
}

/* A batched decode step's attention: B sequences of len keys each, in every layer's caches (so
 * they come from memory, as in decode). */
typedef struct {
    const char *name;
    int layers, heads, kv_heads, len;
    int bf16;          /* BF16 caches, else F32 */
    int both_layouts;  /* also the row-by-row layout ([pos][kv_heads*head_dim]) */
    int packed;        /* also heads packed back to back (qlm_attn_shape.heads_packed) */
    int batch[3];
} attn_case;

enum { ATTN_HD = 64, ATTN_CAP = 512 };

static const attn_case k_attn_cases[] = {
    /* SmolLM2-135M's self-attention (9 query, 3 KV heads) over F32 caches. */
    {"SmolLM2 self-attention, f32", 30, 9, 3, 260, 0, 1, 0, {1, 8, 27}},
    /* flan-t5-base's cross-attention over a ~217-token dialogue, BF16 keys and values. */
    {"flan-t5-base cross-attention, bf16", 12, 12, 12, 217, 1, 0, 1, {1, 8, 32}},
};

/* One case, with the cache laid out head by head ([kv_head][pos][head_dim] with room for
 * ATTN_CAP positions, the decode cache's layout) and, where asked, row by row and with the heads
 * packed. GB/s counts the keys and values read. */
static int bench_attention_case(const attn_case *c, const options *o) {
    const size_t esize = c->bf16 ? sizeof(uint16_t) : sizeof(float);
    const size_t slot = (size_t)ATTN_CAP * c->kv_heads * ATTN_HD;
    printf("\ndecode attention: %s, %d keys per sequence, %d layers\n%-8s %-12s %10s %9s\n", c->name, c->len,
           c->layers, "seqs", "layout", "ms/step", "GB/s");
    for (int bi = 0; bi < 3; bi++) {
        int b = c->batch[bi];
        size_t n_kv = 2 * (size_t)c->layers * b * slot;
        char *kv = malloc(n_kv * esize);
        float *q = malloc((size_t)b * c->heads * ATTN_HD * sizeof(float));
        float *out = malloc((size_t)b * c->heads * ATTN_HD * sizeof(float));
        int *pos = malloc((size_t)b * sizeof(int)), *slots = malloc((size_t)b * sizeof(int));
        if (!kv || !q || !out || !pos || !slots) {
            free(kv), free(q), free(out), free(pos), free(slots);
            return qlm_errorf("bench: out of memory");
        }
        for (size_t i = 0; i < n_kv; i++) {
            float v = frand();
            if (c->bf16)
                ((uint16_t *)kv)[i] = qlm_f32_to_bf16(v);
            else
                ((float *)kv)[i] = v;
        }
        for (int i = 0; i < b * c->heads * ATTN_HD; i++) q[i] = frand();
        for (int i = 0; i < b; i++) pos[i] = c->len - 1, slots[i] = i;
        static const char *const names[] = {"row by row", "head by head", "packed"};
        for (int layout = c->both_layouts ? 0 : 1; layout < (c->packed ? 3 : 2); layout++) {
            qlm_attn_shape sh = {.n_heads = c->heads, .n_kv_heads = c->kv_heads, .head_dim = ATTN_HD, .scale = 0.125f,
                                 .slots = slots, .slot_stride = slot, .kv_dtype = c->bf16 ? QLM_BF16 : QLM_F32};
            if (layout) sh.row_stride = ATTN_HD, sh.head_stride = (size_t)ATTN_CAP * ATTN_HD;
            if (layout == 2) sh.heads_packed = 1, sh.n_keys = c->len;
            double best = 1e30;
            for (int rep = 0; rep < (o->quick ? 3 : 8); rep++) {
                double t0 = qlm_now_s();
                for (int l = 0; l < c->layers; l++) {
                    const char *k = kv + 2 * (size_t)l * b * slot * esize;
                    qlm_cpu_attention(out, q, k, k + (size_t)b * slot * esize, b, pos, &sh);
                }
                double dt = qlm_now_s() - t0;
                if (dt < best) best = dt;
            }
            double bytes = 2.0 * c->layers * b * c->len * c->kv_heads * ATTN_HD * (double)esize;
            printf("%-8d %-12s %10.2f %9.2f\n", b, names[layout], best * 1e3, bytes / best / 1e9);
        }
        free(kv), free(q), free(out), free(pos), free(slots);
    }
    return 0;
}

/* One layer's causal self-attention over a whole prompt of len rows (prefill), SmolLM2-135M's heads,
 * in each cache dtype: GFLOP/s counts 4 head_dim multiply-adds' FLOPs per (row, key it sees, head). */
static int bench_prefill_attention(const options *o) {
    enum { HEADS = 9, KV_HEADS = 3 };
    static const int lens[] = {512, 2048};
    static const qlm_dtype dts[] = {QLM_F32, QLM_BF16, QLM_F16};
    printf("\nprefill attention: SmolLM2 self-attention (%d query, %d KV heads, head_dim %d), one layer\n%-6s %-5s %10s %9s\n",
           HEADS, KV_HEADS, ATTN_HD, "rows", "cache", "ms", "GFLOP/s");
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int len = lens[li];
        const size_t n_kv = (size_t)KV_HEADS * len * ATTN_HD;
        float *kv = malloc(2 * n_kv * sizeof(float)), *q = malloc((size_t)len * HEADS * ATTN_HD * sizeof(float));
        float *out = malloc((size_t)len * HEADS * ATTN_HD * sizeof(float));
        uint16_t *kv16 = malloc(2 * n_kv * sizeof(uint16_t));
        int *pos = malloc((size_t)len * sizeof(int));
        if (!kv || !q || !out || !kv16 || !pos) {
            free(kv), free(q), free(out), free(kv16), free(pos);
            return qlm_errorf("bench: out of memory");
        }
        for (size_t i = 0; i < 2 * n_kv; i++) kv[i] = frand();
        for (size_t i = 0; i < (size_t)len * HEADS * ATTN_HD; i++) q[i] = frand();
        for (int i = 0; i < len; i++) pos[i] = i;
        for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
            const qlm_dtype dt = dts[di];
            const void *k = kv, *v = kv + n_kv;
            if (dt != QLM_F32) {
                qlm_convert_from_f32(kv16, dt, kv, (long)(2 * n_kv));
                k = kv16, v = kv16 + n_kv;
            }
            const qlm_attn_shape sh = {.n_heads = HEADS, .n_kv_heads = KV_HEADS, .head_dim = ATTN_HD, .scale = 0.125f,
                                       .row_stride = ATTN_HD, .head_stride = (size_t)len * ATTN_HD, .kv_dtype = dt};
            double best = 1e30;
            for (int rep = 0; rep < (o->quick ? 2 : 5); rep++) {
                double t0 = qlm_now_s();
                qlm_cpu_attention(out, q, k, v, len, pos, &sh);
                double t = qlm_now_s() - t0;
                if (t < best) best = t;
            }
            const double flops = 4.0 * ATTN_HD * HEADS * (double)len * (len + 1) / 2;
            printf("%-6d %-5s %10.2f %9.1f\n", len, qlm_dtype_name(dt), best * 1e3, flops / best / 1e9);
        }
        free(kv), free(q), free(out), free(kv16), free(pos);
    }
    return 0;
}

static int bench_attention(const options *o) {
    for (size_t i = 0; i < sizeof k_attn_cases / sizeof k_attn_cases[0]; i++)
        if (bench_attention_case(&k_attn_cases[i], o) != 0) return -1;
    return bench_prefill_attention(o);
}

int main(int argc, char **argv) {
    options o = {0, 0, 128, NULL};
    if (parse_args(argc, argv, &o) != 0) return 2;
    /* The (blas) rows run the kernels OpenBLAS picked for this CPU, which qlm itself overrides where
     * they are its generic ones (cli/blas_core.c): OPENBLAS_CORETYPE sets them here. */
    printf("isa %s, %d OpenMP threads, OpenBLAS %d threads (%s kernels)\n", qlm_matmul_isa(), omp_get_max_threads(),
           openblas_get_num_threads(), openblas_get_corename());
    double bw = qlm_measure_bandwidth_gbs();
    if (bw <= 0) {
        fprintf(stderr, "bench_kernels: %s\n", qlm_last_error());
        return 1;
    }
    printf("memory bandwidth: read %.2f GB/s, memcpy %.2f GB/s (read+write)\n", bw, memcpy_gbs());

    static double gemv_s[NSHAPES][NVARIANTS];
    int gemv = !o.only || strcmp(o.only, "gemv") == 0, gemm = !o.only || strcmp(o.only, "gemm") == 0;
    int attention = !o.only || strcmp(o.only, "attention") == 0;
    if ((gemv && bench_gemv(&o, bw, gemv_s) != 0) || (gemm && bench_gemm(&o) != 0) ||
        (attention && bench_attention(&o) != 0)) {
        fprintf(stderr, "bench_kernels: %s\n", qlm_last_error());
        return 1;
    }
    if (!gemv) return 0;

    printf("\nGEMV speedup over bf16 (time ratio) and int8 bandwidth use\n%-20s %8s %8s %8s %10s\n", "shape",
           "f16", "int8", "int8/row", "int8 of BW");
    double sum[NVARIANTS] = {0};
    for (int si = 0; si < NSHAPES; si++) {
        double bf = gemv_s[si][2];
        size_t bytes8 = (size_t)k_shapes[si].rows * k_shapes[si].cols;
        printf("%-20s %7.2fx %7.2fx %7.2fx %9.0f%%\n", k_shapes[si].name, bf / gemv_s[si][1], bf / gemv_s[si][3],
               bf / gemv_s[si][4], 100.0 * (double)bytes8 / gemv_s[si][3] / 1e9 / bw);
        for (int vi = 0; vi < NVARIANTS; vi++) sum[vi] += gemv_s[si][vi];
    }
    printf("%-20s %7.2fx %7.2fx %7.2fx\n", "all shapes (sum)", sum[2] / sum[1], sum[2] / sum[3], sum[2] / sum[4]);
    return 0;
}
