/* Kernel selection, the scalar reference, and the threading of qlm_matmul.
 *
 * Threads take contiguous runs of output rows (whole groups of 4, the kernels' row block), and
 * the ISA's register-tiled kernel reads each run of W once in its storage dtype, converting in
 * registers: memory-bound for one row of x (decode), FMA-bound from a few rows on, and as fast as
 * OpenBLAS sgemm at prefill sizes (which it replaced there, measured with bench_kernels --n 512):
 * one kernel for every n is what makes a row's result independent of the batch it comes in. */
#include "matmul.h"

#include <math.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "../core/cpu_scratch.h"
#include "../core/error.h"
#include "../core/train_formulas.h"
#include "block_pack.h"
#include "block_quant.h"
#include "matmul_internal.h"

/* Output rows the SIMD kernels handle together. */
#define ROW_GROUP 4

/* Multiply-adds per thread below which a parallel region costs more than it saves. */
#define MIN_WORK_PER_THREAD 32768L

/* Element k of x as weights of dtype wdt multiply it: x holds xdt elements, and F32 x meeting
 * BF16 weights is rounded to BF16 here (qlm_x_dtype). */
static float x_at(const void *x, long k, qlm_dtype xdt, qlm_dtype wdt) {
    float v = qlm_weight_at(x, k, xdt);
    return wdt == QLM_BF16 && xdt == QLM_F32 ? qlm_bf16_to_f32(qlm_f32_to_bf16(v)) : v;
}

/* The I16 form of x[k] (qlm_x_int_scale gave inv). */
static int32_t x_i16_at(const float *x, long k, float inv) {
    return inv == 0 ? 0 : (int32_t)lrintf(x[k] * inv);
}

/* The scale of x[0..n) in an integer form with values up to qmax, and in *inv its factor
 * (qlm_x_int_scale). */
static float x_int_scale(const float *x, long n, float qmax, float *inv) {
    float absmax = 0;
    int has_nan = 0;
    for (long k = 0; k < n; k++) {
        has_nan |= isnan(x[k]);
        absmax = fabsf(x[k]) > absmax ? fabsf(x[k]) : absmax;
    }
    return qlm_x_int_scale(absmax, has_nan, qmax, inv);
}

static float scalar_quantize_i16(int16_t *q, const float *x, long n) {
    float inv, s = x_int_scale(x, n, QLM_I16_MAX, &inv);
    for (long k = 0; k < n; k++) q[k] = (int16_t)x_i16_at(x, k, inv);
    return s;
}

/* Rows [r0, r1) of y = W x for one row of x in F32 or BF16 (xdt). */
static void scalar_gemv(float *y, const void *x, qlm_dtype xdt, const qlm_weight *w, int r0, int r1,
                        const float *bias) {
    size_t stride = (size_t)w->cols * qlm_weight_elem_size(w->dtype);
    for (int o = r0; o < r1; o++) {
        const char *row = (const char *)w->data + (size_t)o * stride;
        float s = 0;
        for (long k = 0; k < w->cols; k++) s += qlm_weight_at(row, k, w->dtype) * x_at(x, k, xdt, w->dtype);
        y[o] = qlm_gemv_finish(s, w, o, 1.0f, bias);
    }
}

/* The same for I8 weights and one row of x, given in the I16 form (q, xs) or as F32 x converted
 * on the fly (q NULL): exact integer sums in 64 bits. */
static void scalar_gemv_i8(float *y, const int16_t *q, const float *x, float xs, float inv, const qlm_weight *w,
                           int r0, int r1, const float *bias) {
    for (int o = r0; o < r1; o++) {
        const int8_t *row = (const int8_t *)w->data + (size_t)o * w->cols;
        int64_t s = 0;
        for (long k = 0; k < w->cols; k++) s += (int64_t)row[k] * (q ? q[k] : x_i16_at(x, k, inv));
        y[o] = qlm_gemv_finish((float)s, w, o, xs, bias);
    }
}

/* The same for block weights: each block's integer sum times its scale, (Q4_1) plus its offset
 * times the block's integer sum of x, added up in F32 block by block. */
static void scalar_gemv_block(float *y, const int16_t *q, const float *x, float xs, float inv, const qlm_weight *w,
                              int r0, int r1, const float *bias) {
    const qlm_dtype dt = w->dtype;
    const int g = w->group, head = qlm_block_head(dt);
    const size_t bb = qlm_dtype_block_bytes(dt, g), stride = qlm_dtype_row_bytes(dt, w->cols, g);
    for (int o = r0; o < r1; o++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)o * stride;
        float s = 0;
        for (long k = 0; k < w->cols; k += g) {
            const uint8_t *blk = row + (size_t)(k / g) * bb;
            int32_t dot = 0, xsum = 0;
            for (int j = 0; j < g; j++) {
                int32_t xv = q ? q[k + j] : x_i16_at(x, k + j, inv);
                dot += qlm_block_value(blk + head, j, dt) * xv;
                xsum += xv;
            }
            s += qlm_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)) * (float)dot;
            if (dt == QLM_Q4_1) s += qlm_f16_to_f32((uint16_t)(blk[2] | blk[3] << 8)) * (float)xsum;
        }
        y[o] = qlm_gemv_finish(s, w, o, xs, bias);
    }
}

static void scalar_quantize_i8(int8_t *q, float *scales, int32_t *sums, const float *x, long n) {
    for (long b = 0; b < n; b += QLM_X8_BLOCK) {
        float inv;
        scales[b / QLM_X8_BLOCK] = x_int_scale(x + b, QLM_X8_BLOCK, QLM_X8_MAX, &inv);
        int32_t sum = 0;
        for (long k = b; k < b + QLM_X8_BLOCK; k++) sum += q[k] = (int8_t)x_i16_at(x, k, inv);
        sums[b / QLM_X8_BLOCK] = sum;
    }
}

void qlm_w8a8_rows(float *y, const int8_t *x, long ldx, const float *xs, const int32_t *xsum, int n,
                   const qlm_weight *w, int r0, int r1, const float *bias) {
    const qlm_dtype dt = w->dtype;
    const int g = w->group, head = qlm_block_head(dt);
    const long runs = w->cols / QLM_X8_BLOCK;
    uint8_t room[QLM_BLOCK_MAX_BYTES];
    for (int o = r0; o < r1; o++) {
        for (int i = 0; i < n; i++) y[(size_t)i * w->rows + o] = 0;
        for (long b = 0; b < w->cols / g; b++) {
            const uint8_t *blk = qlm_panels_block(w->data, dt, g, w->rows, w->cols, o, b, room);
            for (int i = 0; i < n; i++) {
                const int8_t *q = x + (size_t)i * ldx + b * g;
                float s = y[(size_t)i * w->rows + o];
                for (int j0 = 0; j0 < g; j0 += QLM_X8_BLOCK) {
                    const long run = (b * g + j0) / QLM_X8_BLOCK;
                    int32_t dot = 0;
                    for (int j = 0; j < QLM_X8_BLOCK; j++) dot += qlm_block_value(blk + head, j0 + j, dt) * q[j0 + j];
                    const float dx = xs[(size_t)i * runs + run];
                    s += (float)dot * (qlm_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)) * dx);
                    if (dt == QLM_Q4_1)
                        s += qlm_f16_to_f32((uint16_t)(blk[2] | blk[3] << 8)) * ((float)xsum[(size_t)i * runs + run] * dx);
                }
                y[(size_t)i * w->rows + o] = s;
            }
        }
        if (bias)
            for (int i = 0; i < n; i++) y[(size_t)i * w->rows + o] += bias[o];
    }
}

static void scalar_gemm(float *y, const void *x, long ldx, const float *x_scale, int n, const qlm_weight *w, int r0,
                        int r1, const float *bias) {
    size_t x_row = (size_t)ldx * qlm_x_elem_size(w->dtype);
    for (int i = 0; i < n; i++) {
        const void *xi = (const char *)x + (size_t)i * x_row;
        float *yi = y + (size_t)i * w->rows;
        if (qlm_dtype_is_block(w->dtype))
            scalar_gemv_block(yi, xi, NULL, x_scale[i], 0, w, r0, r1, bias);
        else if (w->dtype == QLM_I8)
            scalar_gemv_i8(yi, xi, NULL, x_scale[i], 0, w, r0, r1, bias);
        else
            scalar_gemv(yi, xi, qlm_x_dtype(w->dtype), w, r0, r1, bias);
    }
}

static void scalar_dot_rows(float *y, long ldy, const void *x, int n, const void *w, size_t w_stride, int rows,
                            long cols, qlm_dtype dt) {
    const size_t esize = qlm_weight_elem_size(dt), xsize = qlm_x_elem_size(dt);
    const qlm_dtype xdt = qlm_x_dtype(dt);
    for (int i = 0; i < n; i++)
        for (int o = 0; o < rows; o++) {
            const char *wo = (const char *)w + (size_t)o * w_stride * esize;
            const char *xi = (const char *)x + (size_t)i * cols * xsize;
            float s = 0;
            for (long k = 0; k < cols; k++) s += qlm_weight_at(wo, k, dt) * qlm_weight_at(xi, k, xdt);
            y[(size_t)i * ldy + o] = s;
        }
}

static void scalar_weighted_sum(float *o, const float *p, int g, long ldp, const void *v, size_t v_stride, int m,
                                long hd, qlm_dtype dt) {
    const size_t esize = qlm_weight_elem_size(dt);
    for (int j = 0; j < g; j++)
        for (int t = 0; t < m; t++) {
            const char *vt = (const char *)v + (size_t)t * v_stride * esize;
            for (long d = 0; d < hd; d++) o[(size_t)j * hd + d] += p[(size_t)j * ldp + t] * qlm_weight_at(vt, d, dt);
        }
}

static void scalar_exp(float *x, long n) {
    for (long i = 0; i < n; i++) x[i] = expf(x[i]);
}

static void scalar_f16_to_f32(float *dst, const uint16_t *src, long n) {
    for (long i = 0; i < n; i++) dst[i] = qlm_f16_to_f32(src[i]);
}

static void scalar_bf16_to_f32(float *dst, const uint16_t *src, long n) {
    for (long i = 0; i < n; i++) dst[i] = qlm_bf16_to_f32(src[i]);
}

static void scalar_f32_to_f16(uint16_t *dst, const float *src, long n) {
    for (long i = 0; i < n; i++) dst[i] = qlm_f32_to_f16(src[i]);
}

static void scalar_f32_to_bf16(uint16_t *dst, const float *src, long n) {
    for (long i = 0; i < n; i++) dst[i] = qlm_f32_to_bf16(src[i]);
}

static void scalar_bf16_x_form(void *dst, const float *x, long n) {
    scalar_f32_to_bf16(dst, x, n);
}

static void scalar_i8_to_f32(float *dst, const int8_t *src, long n, float scale) {
    for (long i = 0; i < n; i++) dst[i] = (float)src[i] * scale;
}

static void scalar_dropout(float *out, const float *x, long n, float keep_scale, uint64_t base, uint64_t threshold,
                           long first) {
    for (long i = 0; i < n; i++) out[i] = qlm_dropout_drops(base, first + i, threshold) ? 0.0f : x[i] * keep_scale;
}

static const qlm_kernel_table scalar_table = {
    .name = "scalar",
    .gemm = scalar_gemm,
    .quantize_i16 = scalar_quantize_i16,
    .dot_rows = scalar_dot_rows,
    .weighted_sum = scalar_weighted_sum,
    .exp = scalar_exp,
    .f16_to_f32 = scalar_f16_to_f32,
    .bf16_to_f32 = scalar_bf16_to_f32,
    .f32_to_f16 = scalar_f32_to_f16,
    .f32_to_bf16 = scalar_f32_to_bf16,
    .bf16_x_form = scalar_bf16_x_form,
    .bf16_x_size = 2,
    .i8_to_f32 = scalar_i8_to_f32,
    .dropout = scalar_dropout,
};

#if defined(__x86_64__)
/* Features asked of CPUID directly because not every compiler's __builtin_cpu_supports knows
 * them (clang 14 knows neither "f16c" nor "avxvnni"): bit `bit` of register reg of leaf/subleaf. */
enum { CPUID_EAX, CPUID_EBX, CPUID_ECX, CPUID_EDX };

static int cpuid_bit(unsigned leaf, unsigned subleaf, int reg, int bit) {
    unsigned r[4];
    return __get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3]) && (r[reg] >> bit & 1u);
}

/* Whether Linux lets this process use AMX's tile data (asked once; the grant covers every thread):
 * without it the first tile instruction is an illegal instruction. */
static int g_amx_permitted;

static void ask_amx_permission(void) {
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    g_amx_permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

static int amx_permitted(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, ask_amx_permission);
    return g_amx_permitted;
}
#endif

/* The table for name if this CPU can run it, else NULL. */
static const qlm_kernel_table *table_named(const char *name) {
    if (strcmp(name, "scalar") == 0) return &scalar_table;
#if defined(__x86_64__)
    __builtin_cpu_init();
    const int f16c = cpuid_bit(1, 0, CPUID_ECX, 29), avxvnni = cpuid_bit(7, 1, CPUID_EAX, 4);
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    if (strcmp(name, "avx2") == 0 && avx2) return &qlm_kernels_avx2;
    if (strcmp(name, "avxvnni") == 0 && avx2 && avxvnni) return &qlm_kernels_avxvnni;
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl");
    if (strcmp(name, "avx512") == 0 && avx512) return &qlm_kernels_avx512;
    int vnni = avx512 && __builtin_cpu_supports("avx512vnni");
    if (strcmp(name, "avx512vnni") == 0 && vnni) return &qlm_kernels_avx512vnni;
    int bf16 = vnni && __builtin_cpu_supports("avx512bf16");
    if (strcmp(name, "avx512bf16") == 0 && bf16) return &qlm_kernels_avx512bf16;
    /* AMX-BF16, AMX-TILE and AMX-INT8, and the tile state granted. */
    if (strcmp(name, "amx") == 0 && bf16 && cpuid_bit(7, 0, CPUID_EDX, 22) && cpuid_bit(7, 0, CPUID_EDX, 24) &&
        cpuid_bit(7, 0, CPUID_EDX, 25) && amx_permitted())
        return &qlm_kernels_amx;
#endif
    return NULL;
}

/* Whether the automatic choice passes over the table named name though the CPU runs it: Intel's
 * cores retire one VDPBF16PS (32 multiply-adds) per two cycles where they retire two 512-bit FMAs
 * (also 32) per cycle (Emerald Rapids, measured: 0.77 against 0.19 ns an instruction), so their
 * BF16 weights go faster through F32 FMA (avx512vnni's split form: SmolLM2-135M BF16 pp512
 * 525-549 -> 668-752 tok/s, 2 threads); AMD's Zen 4 and 5 run the dot product at the FMA's rate
 * or better. AMX's table keeps the dot product for its few rows of x: its tiles take prefill. */
static int passed_over(const char *name) {
#if defined(__x86_64__)
    return strcmp(name, "avx512bf16") == 0 && __builtin_cpu_is("intel");
#else
    (void)name;
    return 0;
#endif
}

static _Atomic(const qlm_kernel_table *) g_table;

static const char *const k_isas[] = {"scalar", "avx2", "avxvnni", "avx512", "avx512vnni", "avx512bf16", "amx"};

const char *qlm_matmul_isas(void) {
    static char list[96];
    if (!list[0])
        for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++)
            if (table_named(k_isas[i]))
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? " " : "", k_isas[i]);
    return list;
}

float qlm_f16_lut[65536];

static void fill_f16_lut(void) {
    for (uint32_t h = 0; h < 65536; h++) qlm_f16_lut[h] = qlm_f16_to_f32((uint16_t)h);
}

static pthread_once_t g_lut_once = PTHREAD_ONCE_INIT;

const qlm_kernel_table *qlm_kernels(void) {
    const qlm_kernel_table *t = atomic_load_explicit(&g_table, memory_order_acquire);
    if (t) return t;
    pthread_once(&g_lut_once, fill_f16_lut);
    const char *forced = getenv("QLM_ISA");
    if (forced && *forced && !(t = table_named(forced)))
        fprintf(stderr, "qlm: QLM_ISA=%s is not a kernel set this CPU runs (%s); using the best one\n", forced,
                qlm_matmul_isas());
    for (size_t i = sizeof k_isas / sizeof k_isas[0]; !t && i-- > 0;)
        if (!passed_over(k_isas[i])) t = table_named(k_isas[i]);
    atomic_store_explicit(&g_table, t, memory_order_release);
    return t;
}

int qlm_matmul_w8a8(void) {
    return qlm_kernels()->gemm_w8a8 != NULL;
}

const char *qlm_matmul_isa(void) {
    return qlm_kernels()->name;
}

int qlm_matmul_force_isa(const char *name) {
    const qlm_kernel_table *t = name ? table_named(name) : NULL;
    if (!t) return qlm_errorf("matmul: instruction set '%s' is unknown or not supported by this CPU", name ? name : "(null)");
    pthread_once(&g_lut_once, fill_f16_lut);
    atomic_store_explicit(&g_table, t, memory_order_release);
    return 0;
}

/* The calling thread's room for one row of x in the I8 form. */
static _Thread_local qlm_cpu_scratch t_x8_row;

/* One row of x against act8 weights: x put in the I8 form, then qlm_w8a8_rows (NaN without
 * room for the form). */
static void scalar_matmul_w8a8(float *y, const float *x, const qlm_weight *w, const float *bias) {
    const long runs = w->cols / QLM_X8_BLOCK;
    const size_t q_bytes = ((size_t)w->cols + 3) & ~(size_t)3;
    char *buf = qlm_cpu_scratch_bytes(&t_x8_row, q_bytes + (size_t)runs * (sizeof(float) + sizeof(int32_t)));
    if (!buf) {
        for (int o = 0; o < w->rows; o++) y[o] = NAN;
        return;
    }
    float *xs = (float *)(buf + q_bytes);
    int32_t *sums = (int32_t *)(xs + runs);
    scalar_quantize_i8((int8_t *)buf, xs, sums, x, w->cols);
    qlm_w8a8_rows(y, (const int8_t *)buf, w->cols, xs, sums, 1, w, 0, w->rows, bias);
}

static void rope_rows_to_half(const qlm_matmul_out *o, int n);

/* The scalar products of w's rows in their stored order. */
static void scalar_stored(float *y, const float *x, int n, const qlm_weight *w, const float *bias) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * w->cols;
        float *yi = y + (size_t)i * w->rows;
        if (w->act8 && qlm_dtype_is_block(w->dtype)) {
            scalar_matmul_w8a8(yi, xi, w, bias);
        } else if (qlm_x_is_i16(w->dtype)) {
            float inv, xs = x_int_scale(xi, w->cols, QLM_I16_MAX, &inv);
            if (w->dtype == QLM_I8)
                scalar_gemv_i8(yi, NULL, xi, xs, inv, w, 0, w->rows, bias);
            else
                scalar_gemv_block(yi, NULL, xi, xs, inv, w, 0, w->rows, bias);
        } else {
            scalar_gemv(yi, xi, QLM_F32, w, 0, w->rows, bias);
        }
    }
}

void qlm_matmul_scalar(float *y, const float *x, int n, const qlm_weight *w, const float *bias) {
    const qlm_matmul_out out = {y, w, bias, 0};
    scalar_stored(y, x, n, w, w->rope_heads ? NULL : bias);
    if (w->rope_heads && w->rows > 0) rope_rows_to_half(&out, n);
}

static int min_int(int a, int b) {
    return a < b ? a : b;
}

int qlm_threads_for(double work, double min_per_thread) {
    int max = omp_get_max_threads();
    double t = work / min_per_thread;
    return t < 1 ? 1 : t < max ? (int)t : max;
}

/* Thread t's share [*r0, *r1) of rows, split in whole multiples of group rows. */
static void thread_rows(int rows, int group, int t, int nt, int *r0, int *r1) {
    long groups = (rows + group - 1) / group;
    *r0 = min_int(rows, (int)(groups * t / nt) * group);
    *r1 = min_int(rows, (int)(groups * (t + 1) / nt) * group);
}

/* Elements of x below which the calling thread puts x in its activation form alone rather than
 * with the other threads and a barrier. */
#define MIN_PARALLEL_FORM 16384L

/* The forms of x (qlm_x_dtype): F32 as given, BF16, I16 or I8. */
typedef enum { FORM_F32, FORM_BF16, FORM_I16, FORM_I8 } form_kind;

static form_kind form_for(const qlm_weight *w) {
    if (w->dtype == QLM_BF16) return FORM_BF16;
    if (!qlm_x_is_i16(w->dtype)) return FORM_F32;
    return w->act8 && qlm_dtype_is_block(w->dtype) ? FORM_I8 : FORM_I16;
}

static size_t form_elem_size(form_kind k, const qlm_kernel_table *kt) {
    return k == FORM_F32 ? 4 : k == FORM_I8 ? 1 : k == FORM_BF16 ? (size_t)kt->bf16_x_size : 2;
}

/* x in the activation form of W: the BF16, I16 or I8 rows xf, ldx elements apart (and for I16
 * the row scales xs, for I8 each row's run scales xs and sums xsum) that the GEMM reads, or x
 * itself. */
typedef struct {
    const float *x;
    void *xf;
    float *xs;
    int32_t *xsum;
    long ldx;
    form_kind kind;
} x_form;

/* Rows [i0, i1) of x into their activation form. */
static void form_rows(const x_form *f, int i0, int i1, const qlm_weight *w, const qlm_kernel_table *kt) {
    const size_t cols = (size_t)w->cols, row = (size_t)f->ldx * form_elem_size(f->kind, kt);
    for (int i = i0; i < i1; i++) {
        void *xi = (char *)f->xf + i * row;
        const float *x = f->x + i * cols;
        switch (f->kind) {
        case FORM_BF16: kt->bf16_x_form(xi, x, (long)cols); break;
        case FORM_I16: f->xs[i] = kt->quantize_i16(xi, x, (long)cols); break;
        case FORM_I8: {
            const size_t at = i * (cols / QLM_X8_BLOCK);
            (kt->quantize_i8 ? kt->quantize_i8 : scalar_quantize_i8)(xi, f->xs + at, f->xsum + at, x, (long)cols);
            break;
        }
        default: break;
        }
    }
}

/* Threads take runs of output rows of all count products (in whole groups of ROW_GROUP rows of
 * one weight, or panels for W8A8) and the kernel table's GEMM reads them in their storage
 * dtype, after x is put in its activation form (split among the threads by rows of x when
 * large). */
static void rows_parallel(const qlm_matmul_out *outs, int count, const x_form *f, int n, const qlm_kernel_table *kt) {
    const qlm_weight *w0 = outs[0].w;
    const int rg = f->kind == FORM_I8 ? QLM_PANEL_ROWS : ROW_GROUP;
    int groups = 0;
    for (int p = 0; p < count; p++) groups += (outs[p].w->rows + rg - 1) / rg;
    int nth = qlm_threads_for((double)n * groups * rg * w0->cols, MIN_WORK_PER_THREAD);
    int split_form = f->xf && nth > 1 && n > 1 && (long)n * w0->cols >= MIN_PARALLEL_FORM;
    if (f->xf && !split_form) form_rows(f, 0, n, w0, kt);
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        if (split_form) {
            form_rows(f, (int)((long)n * t / nt), (int)((long)n * (t + 1) / nt), w0, kt);
#pragma omp barrier
        }
        /* This thread's groups [g0, g1) of the concatenated rows, mapped back to each weight. */
        int g0, g1, base = 0;
        thread_rows(groups, 1, t, nt, &g0, &g1);
        for (int p = 0; p < count && base < g1; p++) {
            const qlm_weight *w = outs[p].w;
            int wg = (w->rows + rg - 1) / rg;
            int a = g0 > base ? g0 - base : 0, b = g1 - base < wg ? g1 - base : wg;
            int r0 = a * rg, r1 = min_int(w->rows, b * rg);
            if (a < b && f->kind == FORM_I8)
                (kt->gemm_w8a8 ? kt->gemm_w8a8 : qlm_w8a8_rows)(outs[p].y, f->xf, f->ldx, f->xs, f->xsum, n, w, r0, r1,
                                                             outs[p].bias);
            else if (a < b)
                kt->gemm(outs[p].y, f->xf ? f->xf : f->x, f->ldx, f->xs, n, w, r0, r1, outs[p].bias);
            base += wg;
        }
    }
}

void qlm_dot_rows(float *y, long ldy, const void *x, int n, const void *w, size_t w_stride, int rows, long cols,
                  qlm_dtype dt) {
    if (n > 0 && rows > 0) qlm_kernels()->dot_rows(y, ldy, x, n, w, w_stride, rows, cols, dt);
}

size_t qlm_bf16_x_size(void) {
    return (size_t)qlm_kernels()->bf16_x_size;
}

void qlm_bf16_x_form(void *dst, const float *x, long n) {
    if (n > 0) qlm_kernels()->bf16_x_form(dst, x, n);
}

void qlm_weighted_sum(float *o, const float *p, int g, long ldp, const void *v, size_t v_stride, int m, long hd,
                      qlm_dtype dt) {
    if (g > 0 && m > 0) qlm_kernels()->weighted_sum(o, p, g, ldp, v, v_stride, m, hd, dt);
}

/* The calling thread's buffer for x in its activation form, kept across calls. */
static _Thread_local qlm_cpu_scratch t_x_form;

void qlm_exp_f32(float *x, long n) {
    if (n > 0) qlm_kernels()->exp(x, n);
}

void qlm_dropout_f32(float *out, const float *x, long n, float p, uint64_t seed, long first) {
    if (n > 0) qlm_kernels()->dropout(out, x, n, 1.0f / (1.0f - p), qlm_mix64(seed), qlm_dropout_threshold(p), first);
}

/* Whether the count products can share x's activation form and one region. */
static int same_form(const qlm_matmul_out *outs, int count) {
    for (int p = 1; p < count; p++)
        if (outs[p].w->dtype != outs[0].w->dtype || outs[p].w->cols != outs[0].w->cols ||
            outs[p].w->act8 != outs[0].w->act8)
            return 0;
    return 1;
}

/* A product of a weight whose rows are interleaved for RoPE (rope_heads) comes out in the stored
 * order: each head of each row of y is put in PyTorch's order, then the bias (in that order) added. */
static void rope_rows_to_half(const qlm_matmul_out *o, int n) {
    const qlm_weight *w = o->w;
    const int hd = w->rows / w->rope_heads, half = hd / 2;
    float head[QLM_MAX_HEAD_DIM];
    for (int i = 0; i < n; i++) {
        float *y = o->y + (size_t)i * w->rows;
        for (int h = 0; h < w->rope_heads; h++) {
            float *yh = y + (size_t)h * hd;
            memcpy(head, yh, (size_t)hd * sizeof *head);
            for (int j = 0; j < half; j++) {
                yh[j] = head[2 * j];
                yh[half + j] = head[2 * j + 1];
            }
        }
        if (o->bias)
            for (int r = 0; r < w->rows; r++) y[r] += o->bias[r];
    }
}

/* Products of the stored rows of up to GROUP_MAX weights (biases of interleaved ones held back). */
enum { GROUP_MAX = 8 };
static void matmul_stored(const qlm_matmul_out *outs, int count, const float *x, int n);

/* The calling thread's buffer for the products that add, kept across calls: the kernels store. */
static _Thread_local qlm_cpu_scratch t_sums;

/* Floats of an add below which one thread adds them alone: a parallel region costs about a
 * microsecond, and even one that its if clause keeps to a thread costs ~0.4 us, which decode
 * would pay twice a layer. */
#define MIN_ADD_PER_THREAD 8192L

static void add_run(float *y, const float *x, long from, long to) {
    for (long i = from; i < to; i++) y[i] += x[i];
}

void qlm_add_f32(float *y, const float *x, long n) {
    const int nth = qlm_threads_for((double)n, MIN_ADD_PER_THREAD);
    if (nth == 1) {
        add_run(y, x, 0, n);
        return;
    }
#pragma omp parallel num_threads(nth)
    {
        const long th = omp_get_thread_num(), nt = omp_get_num_threads();
        add_run(y, x, n * th / nt, n * (th + 1) / nt);
    }
}

int qlm_matmul_group(const qlm_matmul_out *outs, int count, const float *x, int n) {
    if (n <= 0 || count <= 0) return 0;
    for (int c0 = 0; c0 < count; c0 += GROUP_MAX) {
        int m = count - c0 < GROUP_MAX ? count - c0 : GROUP_MAX;
        qlm_matmul_out stored[GROUP_MAX];
        size_t sums = 0;
        for (int p = 0; p < m; p++)
            if (outs[c0 + p].add && outs[c0 + p].w->rows > 0) sums += (size_t)n * (size_t)outs[c0 + p].w->rows;
        float *sum = sums ? qlm_cpu_scratch_get(&t_sums, sums) : NULL;
        if (sums && !sum) return qlm_errorf("out of memory for the sums of a product that adds (%zu floats)", sums);
        for (int p = 0; p < m; p++) {
            stored[p] = outs[c0 + p];
            if (stored[p].add && stored[p].w->rows > 0) {
                stored[p].y = sum;
                sum += (size_t)n * (size_t)stored[p].w->rows;
            }
        }
        for (int p = 0; p < m; p++)
            if (stored[p].w->rope_heads) stored[p].bias = NULL;
        matmul_stored(stored, m, x, n);
        for (int p = 0; p < m; p++) {
            const qlm_matmul_out *o = &outs[c0 + p];
            if (o->w->rows <= 0) continue;
            if (o->w->rope_heads) rope_rows_to_half(&(qlm_matmul_out){stored[p].y, o->w, o->bias, 0}, n);
            if (o->add) qlm_add_f32(o->y, stored[p].y, (long)n * o->w->rows);
        }
    }
    return 0;
}

static void matmul_stored(const qlm_matmul_out *outs, int count, const float *x, int n) {
    if (!same_form(outs, count)) {
        for (int p = 0; p < count; p++) matmul_stored(&outs[p], 1, x, n);
        return;
    }
    const qlm_weight *w = outs[0].w;
    if (w->cols < 0) return;
    for (int p = 0; p < count; p++)
        if (outs[p].w->rows < 0) return;
    const qlm_kernel_table *kt = qlm_kernels();
    x_form f = {x, NULL, NULL, NULL, w->cols, form_for(w)};
    if (f.kind != FORM_F32) {
        /* x is put in its form once per call rather than in every thread's kernel; the scales
         * follow the rows, 4-byte aligned. */
        const size_t esize = form_elem_size(f.kind, kt);
        const size_t scales = f.kind == FORM_I8 ? (size_t)w->cols / QLM_X8_BLOCK : 1;
        f.ldx = qlm_x_row_stride(w->cols, esize);
        size_t rows_bytes = ((size_t)n * (size_t)f.ldx * esize + 3) & ~(size_t)3;
        char *buf = qlm_cpu_scratch_bytes(&t_x_form, rows_bytes + (size_t)n * scales * (sizeof(float) + sizeof(int32_t)));
        if (!buf) {
            /* Out of memory for the copy: still correct, only slower. */
            for (int p = 0; p < count; p++) scalar_stored(outs[p].y, x, n, outs[p].w, outs[p].bias);
            return;
        }
        f.xf = buf;
        f.xs = (float *)(buf + rows_bytes);
        f.xsum = (int32_t *)(f.xs + (size_t)n * scales);
    }
    rows_parallel(outs, count, &f, n, kt);
}

void qlm_matmul(float *y, const float *x, int n, const qlm_weight *w, const float *bias) {
    qlm_matmul_out out = {y, w, bias, 0};
    (void)qlm_matmul_group(&out, 1, x, n); /* fails only for products that add */
}

int qlm_matmul_i8_xw(float *y, const float *x, int n, const qlm_weight *w, int accumulate) {
    const qlm_kernel_table *kt = qlm_kernels();
    if (!kt->gemm_i8_xw || w->dtype != QLM_I8 || w->rope_heads || n < QLM_I8_XW_MIN_ROWS || w->rows <= 0 ||
        w->rows % 64 != 0 || w->rows > 65536 || w->cols <= 0)
        return -1;
    /* Three planes of whole blocks of 16 rows (the last ones zero), then the row scales. */
    const long rows = w->rows, ld = qlm_x_row_stride(rows, 1), npad = (n + 15) / 16 * 16, plane = npad * ld;
    char *planes = qlm_cpu_scratch_bytes(&t_x_form, (size_t)(3 * plane) + (size_t)n * sizeof(float));
    if (!planes) return -1;
    float *xs = (float *)(planes + 3 * plane);
    /* Per-channel scales go onto x before its integer form (output o's scale multiplies x's column
     * o); a tensor's scale multiplies the sums. */
    const float scale = w->row_scales ? 1.0f : w->scale;
    const int nth = qlm_threads_for((double)n * (double)rows * w->cols, MIN_WORK_PER_THREAD);
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        for (int i = (int)((long)n * t / nt); i < (int)((long)n * (t + 1) / nt); i++) {
            char *p = planes + i * ld;
            xs[i] = kt->i24_planes((int8_t *)p, (uint8_t *)p + plane, (uint8_t *)p + 2 * plane, x + (size_t)i * rows,
                                   w->row_scales, rows);
        }
        if (t == 0)
            for (int c = 0; c < 3; c++) memset(planes + c * plane + n * ld, 0, (size_t)((npad - n) * ld));
#pragma omp barrier
        int k0, k1;
        thread_rows(w->cols, 16, t, nt, &k0, &k1);
        kt->gemm_i8_xw(y, planes, ld, plane, xs, n, w, scale, k0, k1, accumulate);
    }
    return 0;
}
