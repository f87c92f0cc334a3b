/* What the GPU op tests share: the two backends, random inputs, copies to and from the device,
 * comparisons, and weights in every dtype with their host twin for the reference. */
#ifndef QLM_GPU_TEST_UTIL_H
#define QLM_GPU_TEST_UTIL_H

#include <math.h>

#include "../../quant/quantize.h"
#include "../test_util.h"

static const qlm_backend *gpu, *cpu;

/* Uniform in [-1, 1), from a 32-bit LCG. */
static inline float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) / 16777216.0 * 2.0 - 1.0);
}

static inline float *randv(long n, unsigned seed, float amp) {
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    for (long i = 0; i < n; i++) v[i] = amp * frand(&seed);
    return v;
}

static inline float *copyv(const float *x, long n) {
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    memcpy(v, x, (size_t)n * sizeof *v);
    return v;
}

static inline void *to_gpu(const void *host, size_t bytes) {
    void *d = gpu->alloc(bytes);
    assert_non_null(d);
    gpu->to_device(d, host, bytes);
    return d;
}

static inline float *from_gpu(const float *dev, long n) {
    float *h = malloc((size_t)n * sizeof *h);
    assert_non_null(h);
    gpu->to_host(h, dev, (size_t)n * sizeof *h);
    return h;
}

/* n NaNs in device memory: the start of an output the op must overwrite. */
static inline float *nan_gpu(long n) {
    float *h = malloc((size_t)n * sizeof *h);
    assert_non_null(h);
    for (long i = 0; i < n; i++) h[i] = NAN;
    float *d = to_gpu(h, (size_t)n * sizeof *h);
    free(h);
    return d;
}

/* max |a - b| over n values, relative to max |b| (absolute below 1); NaN against a number: inf. */
static inline double rel_diff(const float *a, const float *b, long n) {
    double d = 0, m = 1;
    for (long i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i])) return INFINITY;
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return d / m;
}

/* The device's n values against want within tol (rel_diff). */
static inline void check_close(const char *what, const float *dev, const float *want, long n, double tol) {
    float *got = from_gpu(dev, n);
    double d = rel_diff(got, want, n);
    print_message("%-52s %.2e\n", what, d);
    free(got);
    assert_true(d <= tol);
}

/* A weight of dtype dt: the host copy (the reference's) and the device one. */
typedef struct {
    qlm_weight host, dev;
    void *host_buf, *dev_buf;
} test_weight;

/* t->host_buf for a rows x cols weight of dtype dt: its bytes, then (at *data, 64-aligned as
 * models/param_pack.c places them; a kernel's 4-byte loads of them fault on the GPU otherwise) room
 * for rows F32 row scales, *total bytes in all. t->host describes the weight, scale 1, no row
 * scales yet. Returns the row scales' place. */
static inline float *alloc_weight(test_weight *t, qlm_dtype dt, int rows, int cols, size_t *data, size_t *total) {
    *data = ((size_t)rows * cols * qlm_dtype_size(dt) + 63) & ~(size_t)63;
    *total = *data + (size_t)rows * sizeof(float);
    t->host_buf = malloc(*total);
    assert_non_null(t->host_buf);
    t->host = (qlm_weight){.dtype = dt, .rows = rows, .cols = cols, .data = t->host_buf, .scale = 1.0f};
    return (float *)((char *)t->host_buf + *data);
}

/* The device copy of t->host_buf (alloc_weight's). */
static inline void upload_weight(test_weight *t, size_t data, size_t total) {
    void *copy = malloc(total);
    assert_non_null(copy);
    memcpy(copy, t->host_buf, total);
    t->dev_buf = gpu->upload(copy, total);
    assert_non_null(t->dev_buf);
    if (t->dev_buf != copy) free(copy);
    t->dev = t->host;
    t->dev.data = t->dev_buf;
    if (t->host.row_scales) t->dev.row_scales = (const float *)((char *)t->dev_buf + data);
}

/* From uniform values in [-amp, amp] (INT8 quantized per tensor or per row). */
static inline void make_weight_amp(test_weight *t, qlm_dtype dt, int per_channel, int rows, int cols, unsigned seed,
                                   float amp) {
    float *w = randv((long)rows * cols, seed, amp);
    size_t data, total;
    float *rs = alloc_weight(t, dt, rows, cols, &data, &total);
    if (dt == QLM_I8 && per_channel) {
        qlm_quantize_i8_rows(t->host_buf, rs, w, rows, cols);
        t->host.row_scales = rs;
    } else if (dt == QLM_I8) {
        t->host.scale = qlm_quantize_i8(t->host_buf, w, rows, cols);
    } else {
        qlm_convert_from_f32(t->host_buf, dt, w, (long)rows * cols);
    }
    free(w);
    upload_weight(t, data, total);
}

static inline void make_weight(test_weight *t, qlm_dtype dt, int per_channel, int rows, int cols, unsigned seed) {
    make_weight_amp(t, dt, per_channel, rows, cols, seed, 1.0f);
}

static inline void free_weight(test_weight *t) {
    free(t->host_buf);
    gpu->free(t->dev_buf);
}

#endif
