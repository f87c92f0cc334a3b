#include "param_pack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/block_pack.h"
#include "../quant/block_quant.h"
#include "../quant/quantize.h"
#include "../core/error.h"

int qlm_param_check_shape(const qlm_tensor_entry *e, int64_t rows, int64_t cols) {
    int ok = cols ? (e->ndim == 2 && e->shape[0] == rows && e->shape[1] == cols)
                  : (e->ndim == 1 && e->shape[0] == rows);
    if (ok) return 0;
    char got[96] = "";
    for (int i = 0; i < e->ndim; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? "," : "", (long long)e->shape[i]);
    if (cols)
        return qlm_errorf("tensor %s has shape [%s], expected [%lld,%lld]", e->name, got, (long long)rows,
                          (long long)cols);
    return qlm_errorf("tensor %s has shape [%s], expected [%lld]", e->name, got, (long long)rows);
}

/* The stored row that holds PyTorch's row r of matrix entry e. */
static int64_t stored_row(const qlm_tensor_entry *e, int64_t r) {
    return e->rope_heads ? qlm_rope_stored_row(r, e->shape[0], e->rope_heads) : r;
}

/* PyTorch's row r of an entry (any stored dtype, I8 with its scales, block types) as F32. */
static void entry_row_f32(const qlm_tensor_entry *e, int64_t rows, int64_t cols, int64_t r, float *out) {
    const qlm_weight w = {.dtype = e->dtype, .rows = (int)rows, .cols = (int)cols, .data = e->data,
                          .scale = e->scale, .row_scales = e->row_scales, .group = e->group};
    qlm_weight_row_f32(&w, (int)stored_row(e, r), out);
}

/* A whole entry as F32 in PyTorch's order (vectors, and matrices for F32/F16/BF16/I8 targets); a
 * Q or K bias in RoPE's interleaved order is taken a value (a row) at a time. */
static void entry_to_f32(const qlm_tensor_entry *e, float *out) {
    int64_t n = qlm_entry_numel(e), rows = e->ndim >= 2 || e->rope_heads ? e->shape[0] : 1, cols = rows ? n / rows : 0;
    if (e->dtype != QLM_I8 && !qlm_dtype_is_block(e->dtype) && !e->rope_heads) {
        qlm_convert_to_f32(out, e->data, e->dtype, n);
        return;
    }
    for (int64_t r = 0; r < rows; r++) entry_row_f32(e, rows, cols, r, out + r * cols);
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* 1 if parameter p's rows of F32, F16 or BF16 at data lie where the products can read them: on
 * their element size, and on a cache line where they are a whole number of lines long, unless
 * only looked up. Off a line, each of the products' 64-byte loads spans two lines, and a copy is
 * faster from the first token (a safetensors file puts its data wherever its header ends:
 * SmolLM2-135M BF16 40 bytes past a line, pp256 +13-20%, tg64 +7-12% from a copy on lines). */
static int rows_placed(const qlm_param *p, qlm_dtype dt, const void *data) {
    const int lines = !p->lookup && (size_t)p->cols * qlm_dtype_size(dt) % 64 == 0;
    return (uintptr_t)data % (lines ? 64 : qlm_dtype_size(dt)) == 0;
}

/* The format parameter p's entry e takes under fmt on backend be: as stored, block types become
 * BF16 where be does not run them; a lookup table never takes W8A8. */
static qlm_weight_format format_for(const qlm_weight_format *fmt, const qlm_param *p, const qlm_tensor_entry *e,
                                    const qlm_backend *be) {
    qlm_weight_format f = *fmt;
    const int to_bf16 = fmt->as_stored && qlm_dtype_is_block(e->dtype) && !be->block_weights;
    if (fmt->as_stored) {
        f.dtype = to_bf16 ? QLM_BF16 : e->dtype;
        f.per_channel = !to_bf16 && e->row_scales != NULL;
        f.group = to_bf16 ? 0 : e->group;
    }
    if (to_bf16 || p->lookup) f.act8 = 0;
    return f;
}

/* Parameter p as format f would make it, where f's cache store (the panel cache file) holds it:
 * block types only as W8A8 panels (the file holds no other block matrices), INT8 with scales of
 * f's granularity, the others where rows_placed. NULL when it is not there. */
static const qlm_tensor_entry *cached_matrix(const qlm_weight_format *f, const qlm_param *p, const qlm_backend *be) {
    const int block = qlm_dtype_is_block(f->dtype);
    if (!f->panels || !f->in_place || !be->host_memory || (block && !f->act8)) return NULL;
    const qlm_tensor_entry *c = qlm_store_find(f->panels, p->name);
    if (!c || c->dtype != f->dtype || c->ndim != 2 || c->shape[0] != p->rows || c->shape[1] != p->cols ||
        c->rope_heads || (block && c->group != f->group) ||
        (f->dtype == QLM_I8 && f->per_channel != (c->row_scales != NULL)) ||
        (!block && f->dtype != QLM_I8 && !rows_placed(p, c->dtype, c->data)))
        return NULL;
    return c;
}

/* Bytes a matrix takes in format f, scales included, each part aligned. */
static size_t matrix_bytes(const qlm_weight_format *f, int64_t rows, int64_t cols) {
    size_t b = align64((size_t)rows * qlm_dtype_row_bytes(f->dtype, (long)cols, f->group));
    if (f->dtype == QLM_I8 && f->per_channel) b += align64((size_t)rows * sizeof(float));
    return b;
}

/* Stored rows of e wholly read once PyTorch's rows 0..done-1 are (a RoPE head's rows are permuted
 * within the head). */
static int64_t stored_rows_done(const qlm_tensor_entry *e, int64_t done) {
    if (!e->rope_heads) return done;
    const int64_t hd = e->shape[0] / e->rope_heads;
    return done / hd * hd;
}

/* Rows r0..r0+n-1 (at most a panel's) of a block-type target: rows already in its blocks are read
 * where they lie, others quantized from F32 (row: cols floats); under W8A8 a whole panel is written
 * in the panel layout straight from those rows (tmp: a panel's bytes when converting). */
static void fill_panel(qlm_weight *w, const qlm_tensor_entry *e, char *dst, int r0, int n, float *row, char *tmp) {
    const size_t row_bytes = qlm_dtype_row_bytes(w->dtype, w->cols, w->group);
    const int same = e->dtype == w->dtype && e->group == w->group, packed = w->act8 && n == QLM_PANEL_ROWS;
    const void *src[QLM_PANEL_ROWS];
    for (int i = 0; i < n; i++) {
        const int r = r0 + i;
        char *out = packed && !same ? tmp + i * row_bytes : dst + (size_t)r * row_bytes;
        if (same) {
            src[i] = (const char *)e->data + (size_t)stored_row(e, r) * row_bytes;
            if (!packed) memcpy(out, src[i], row_bytes);
        } else {
            entry_row_f32(e, w->rows, w->cols, r, row);
            qlm_block_quantize_row(out, w->dtype, w->group, row, w->cols);
            src[i] = out;
        }
    }
    if (packed) qlm_panel_from_rows(dst + (size_t)r0 * row_bytes, src, w->dtype, w->group, w->cols);
}

/* A block-type target, threads taking panels, a stretch of rows at a time whose source pages are
 * given back as soon as it is done: the peak stays near the weights built, whatever the size of
 * the largest matrix. */
static int fill_blocks(qlm_weight *w, const qlm_tensor_entry *e, char *dst, const qlm_tensor_store *store) {
    enum { STRETCH = 64 * QLM_PANEL_ROWS };
    const size_t row_bytes = qlm_dtype_row_bytes(w->dtype, w->cols, w->group);
    const int same = e->dtype == w->dtype && e->group == w->group;
    int failed = 0;
#pragma omp parallel
    {
        float *row = same ? NULL : malloc((size_t)w->cols * sizeof *row);
        char *tmp = w->act8 && !same ? malloc(QLM_PANEL_ROWS * row_bytes) : NULL;
        const int ok = (same || row) && (!w->act8 || same || tmp);
        if (!ok) failed = 1;
        for (int s0 = 0; s0 < w->rows; s0 += STRETCH) {
            const int s1 = s0 + STRETCH < w->rows ? s0 + STRETCH : w->rows;
#pragma omp for schedule(static)
            for (int r0 = s0; r0 < s1; r0 += QLM_PANEL_ROWS)
                if (ok) fill_panel(w, e, dst, r0, s1 - r0 < QLM_PANEL_ROWS ? s1 - r0 : QLM_PANEL_ROWS, row, tmp);
#pragma omp master
            qlm_store_release_rows(store, e, stored_rows_done(e, s1));
        }
        free(row);
        free(tmp);
    }
    return failed ? qlm_errorf("out of memory converting %s", e->name) : 0;
}

/* A target of F32, F16, BF16 or INT8 converted a stretch of rows at a time, threads taking rows,
 * each through one row of F32 rather than an F32 copy of the matrix; per-tensor INT8 takes its
 * absolute maximum in a pass of its own first. The source pages behind each stretch are given
 * back as in fill_blocks. row_scales: per-channel INT8's, else NULL. */
static int fill_rows(qlm_weight *w, const qlm_tensor_entry *e, char *dst, float *row_scales,
                     const qlm_tensor_store *store) {
    enum { STRETCH = 1024 };
    const int per_tensor = w->dtype == QLM_I8 && !row_scales;
    const size_t row_bytes = qlm_dtype_row_bytes(w->dtype, w->cols, 0);
    float absmax = 0;
    int failed = 0;
    for (int pass = per_tensor ? 0 : 1; pass < 2 && !failed; pass++) {
#pragma omp parallel reduction(max : absmax)
        {
            float *row = malloc((size_t)w->cols * sizeof *row);
            if (!row) failed = 1;
            for (int s0 = 0; s0 < w->rows; s0 += STRETCH) {
                const int s1 = s0 + STRETCH < w->rows ? s0 + STRETCH : w->rows;
#pragma omp for schedule(static)
                for (int r = s0; r < s1; r++) {
                    if (!row) continue;
                    entry_row_f32(e, w->rows, w->cols, r, row);
                    char *out = dst + (size_t)r * row_bytes;
                    if (pass == 0) {
                        const float a = qlm_absmax_finite(row, w->cols);
                        absmax = a > absmax ? a : absmax;
                    } else if (w->dtype != QLM_I8) {
                        qlm_convert_from_f32(out, w->dtype, row, w->cols);
                    } else {
                        if (row_scales) row_scales[r] = qlm_i8_scale(qlm_absmax_finite(row, w->cols));
                        qlm_quantize_i8_run((int8_t *)out, row, w->cols, row_scales ? row_scales[r] : w->scale);
                    }
                }
#pragma omp master
                qlm_store_release_rows(store, e, stored_rows_done(e, s1));
            }
            free(row);
        }
        if (pass == 0) w->scale = qlm_i8_scale(absmax);
    }
    return failed ? qlm_errorf("out of memory converting %s", e->name) : 0;
}

/* 1 if parameter p's entry e is matrix data exactly as format f lays it out, readable where it
 * lies. */
static int readable_in_place(const qlm_weight_format *f, const qlm_param *p, const qlm_tensor_entry *e,
                             const qlm_backend *be) {
    if (!f->in_place || !be->host_memory || e->dtype != f->dtype || !e->data) return 0;
    if (qlm_dtype_is_block(e->dtype)) return !f->act8 && e->group == f->group;
    if (e->dtype == QLM_I8) return f->per_channel == (e->row_scales != NULL) && (uintptr_t)e->row_scales % 4 == 0;
    return rows_placed(p, e->dtype, e->data);
}

/* Copies the rows (row_bytes each) of matrix entry e to dst in PyTorch's order. */
static void copy_rows(char *dst, const qlm_tensor_entry *e, size_t row_bytes) {
    if (e->rope_heads)
        qlm_rope_rows_to_half(dst, e->data, e->shape[0], row_bytes, e->rope_heads);
    else
        memcpy(dst, e->data, (size_t)e->shape[0] * row_bytes);
}

/* Converts entry e (rows in any stored order) into the matrix w placed at *cursor (advanced past it), in format f. */
static int fill_matrix(qlm_weight *w, const qlm_tensor_entry *e, const qlm_weight_format *f, char **cursor,
                       const qlm_tensor_store *store) {
    int64_t rows = e->shape[0], cols = e->shape[1];
    const qlm_dtype dt = f->dtype;
    const int per_channel = f->per_channel;
    if (qlm_dtype_is_block(dt) && (!qlm_group_valid(f->group) || cols % f->group != 0))
        return qlm_errorf("tensor %s: %lld columns do not split into %s blocks of %d", e->name, (long long)cols,
                          qlm_dtype_name(dt), f->group);
    char *dst = *cursor;
    *cursor += align64((size_t)rows * qlm_dtype_row_bytes(dt, (long)cols, f->group));
    *w = (qlm_weight){.dtype = dt, .rows = (int)rows, .cols = (int)cols, .data = dst, .scale = 1.0f,
                      .group = qlm_dtype_is_block(dt) ? f->group : 0,
                      .act8 = f->act8 && qlm_dtype_is_block(dt)};
    if (qlm_dtype_is_block(dt)) return fill_blocks(w, e, dst, store);
    float *row_scales = NULL;
    if (dt == QLM_I8 && per_channel) {
        row_scales = (float *)*cursor;
        w->row_scales = row_scales;
        *cursor += align64((size_t)rows * sizeof(float));
    }
    if (e->dtype == dt && dt != QLM_I8) {
        copy_rows(dst, e, (size_t)cols * qlm_dtype_size(dt));
        return 0;
    }
    /* INT8 stays as stored when the scale granularity allows it: no second rounding. */
    if (e->dtype == QLM_I8 && dt == QLM_I8 && (per_channel || !e->row_scales)) {
        copy_rows(dst, e, (size_t)cols);
        if (per_channel)
            for (int64_t r = 0; r < rows; r++)
                row_scales[r] = e->row_scales ? e->row_scales[stored_row(e, r)] : e->scale;
        else
            w->scale = e->scale;
        return 0;
    }
    return fill_rows(w, e, dst, row_scales, store);
}

/* Points the views of parameters laid out in from at the same offsets in to (after an upload). */
static void rebase(const qlm_param *p, int n, const char *from, char *to) {
    for (int i = 0; i < n; i++) {
        qlm_weight *w = p[i].matrix;
        if (w && w->data) {
            w->data = to + ((const char *)w->data - from);
            if (w->row_scales) w->row_scales = (const float *)(to + ((const char *)w->row_scales - from));
        } else if (!w && *p[i].vector) {
            *p[i].vector = (float *)(to + ((const char *)*p[i].vector - from));
        }
    }
}

/* qlm_entry_check_values, its error saying how to load such a file anyway. */
static int check_values(const qlm_tensor_entry *e) {
    if (qlm_entry_check_values(e) == 0) return 0;
    char why[512];
    snprintf(why, sizeof why, "%s", qlm_last_error());
    return qlm_errorf("%s (--no-check loads it anyway)", why);
}

int qlm_params_pack(const qlm_param *p, int n, const qlm_tensor_store *store, qlm_weight_format fmt,
                    const qlm_backend *be, void **buffer, size_t *bytes, size_t *in_place_bytes) {
    *buffer = NULL;
    *bytes = 0;
    if (qlm_dtype_is_block(fmt.dtype) && !fmt.as_stored && !be->block_weights)
        return qlm_errorf("the %s backend does not run %s weights: load them as bf16 or int8 there", be->name,
                          qlm_dtype_name(fmt.dtype));
    if (fmt.act8 && !be->act8_weights) return qlm_errorf("the %s backend does not run W8A8 (8-bit activations)", be->name);
    const qlm_tensor_entry **ent = calloc((size_t)(n ? n : 1), sizeof *ent);
    if (!ent) return qlm_errorf("out of memory");
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        ent[i] = qlm_store_find(store, p[i].name);
        if (!ent[i]) {
            if (p[i].optional) continue;
            free(ent);
            return qlm_errorf("tensor %s is missing", p[i].name);
        }
        if (qlm_param_check_shape(ent[i], p[i].rows, p[i].cols) != 0) {
            free(ent);
            return -1;
        }
        qlm_weight_format f = format_for(&fmt, &p[i], ent[i], be);
        if (p[i].matrix && (readable_in_place(&f, &p[i], ent[i], be) || cached_matrix(&f, &p[i], be))) continue;
        total += p[i].matrix ? matrix_bytes(&f, p[i].rows, p[i].cols)
                             : align64((size_t)qlm_entry_numel(ent[i]) * sizeof(float));
    }
    char *buf = aligned_alloc(64, total ? total : 64);
    if (!buf) {
        free(ent);
        return qlm_errorf("out of memory for %zu bytes of weights", total);
    }
    char *cur = buf;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (p[i].matrix) {
            *p[i].matrix = (qlm_weight){0};
            if (!ent[i]) continue;
            qlm_weight_format f = format_for(&fmt, &p[i], ent[i], be);
            const qlm_tensor_entry *e = ent[i];
            const qlm_tensor_entry *c = cached_matrix(&f, &p[i], be);
            if (!c && fmt.check_values && check_values(e) != 0) {
                rc = -1;
                break;
            }
            if (readable_in_place(&f, &p[i], e, be)) {
                *p[i].matrix = (qlm_weight){.dtype = e->dtype, .rows = (int)e->shape[0], .cols = (int)e->shape[1],
                                            .data = e->data, .scale = e->scale, .row_scales = e->row_scales,
                                            .group = e->group, .rope_heads = e->rope_heads};
                if (in_place_bytes) *in_place_bytes += qlm_weight_bytes(p[i].matrix);
                /* a table read a row at a time need not stay resident because the check read it */
                if (p[i].lookup) qlm_store_release_rows(store, e, e->shape[0]);
                continue;
            }
            if (c) {
                *p[i].matrix = (qlm_weight){.dtype = c->dtype, .rows = (int)c->shape[0], .cols = (int)c->shape[1],
                                            .data = c->data, .scale = c->dtype == QLM_I8 ? c->scale : 1.0f,
                                            .row_scales = c->row_scales, .group = c->group,
                                            .act8 = qlm_dtype_is_block(c->dtype)};
                if (in_place_bytes) *in_place_bytes += qlm_weight_bytes(p[i].matrix);
                qlm_store_release(store, e);
                continue;
            }
            rc = fill_matrix(p[i].matrix, e, &f, &cur, store);
            p[i].matrix->made_at_load = 1;
            qlm_store_release(store, e);
        } else {
            *p[i].vector = NULL;
            if (!ent[i]) continue;
            if (fmt.check_values && check_values(ent[i]) != 0) {
                rc = -1;
                break;
            }
            *p[i].vector = (float *)cur;
            cur += align64((size_t)qlm_entry_numel(ent[i]) * sizeof(float));
            entry_to_f32(ent[i], *p[i].vector);
            if (p[i].offset != 0)
                for (int64_t k = 0; k < qlm_entry_numel(ent[i]); k++) (*p[i].vector)[k] += p[i].offset;
        }
    }
    free(ent);
    char *dev = rc == 0 ? be->upload(buf, total ? total : 64) : NULL;
    if (dev && dev != buf) rebase(p, n, buf, dev);
    if (dev != buf) free(buf);
    if (!dev) return -1;
    *buffer = dev;
    *bytes = total;
    return 0;
}

size_t qlm_weight_bytes(const qlm_weight *w) {
    size_t b = (size_t)w->rows * qlm_dtype_row_bytes(w->dtype, w->cols, w->group);
    if (w->row_scales) b += (size_t)w->rows * sizeof(float);
    return b;
}

/* rows of row_bytes from src (memory of be) into dst, from qlm's RoPE row order back to the
 * file's when rope_heads is set. Device memory is copied to the host first. */
static int export_rows(const qlm_backend *be, void *dst, const void *src, int64_t rows, size_t row_bytes,
                       int rope_heads) {
    size_t bytes = (size_t)rows * row_bytes;
    void *staged = NULL;
    if (!be->host_memory) {
        if (!rope_heads) {
            be->to_host(dst, src, bytes);
            return 0;
        }
        if (!(staged = malloc(bytes ? bytes : 1))) return qlm_errorf("out of memory");
        be->to_host(staged, src, bytes);
        src = staged;
    }
    if (rope_heads)
        qlm_rope_rows_to_half(dst, src, rows, row_bytes, rope_heads);
    else
        memcpy(dst, src, bytes);
    free(staged);
    return 0;
}

static int export_matrix(const qlm_backend *be, qlm_tensor_store *s, const char *name, const qlm_weight *w) {
    int64_t shape[2] = {w->rows, w->cols};
    void *data;
    qlm_tensor_entry *e = qlm_dtype_is_block(w->dtype)
                              ? qlm_store_add_owned_blocks(s, name, w->dtype, w->group, w->rows, w->cols, &data)
                              : qlm_store_add_owned(s, name, w->dtype, 2, shape, &data);
    if (!e) return -1;
    if (export_rows(be, data, w->data, w->rows, qlm_dtype_row_bytes(w->dtype, w->cols, w->group), w->rope_heads) != 0)
        return -1;
    if (w->act8 && qlm_block_from_panels(data, w->dtype, w->group, w->rows, w->cols) != 0) return -1;
    e->scale = w->scale;
    if (w->row_scales) {
        float *rs = malloc((size_t)w->rows * sizeof *rs);
        if (!rs || qlm_store_keep_buffer(s, rs) != 0) {
            free(rs);
            return qlm_errorf("out of memory");
        }
        if (export_rows(be, rs, w->row_scales, w->rows, sizeof *rs, w->rope_heads) != 0) return -1;
        e->row_scales = rs;
    }
    return 0;
}

static int export_vector(const qlm_backend *be, qlm_tensor_store *s, const qlm_param *p) {
    int64_t shape[2] = {p->rows, p->cols};
    void *data;
    if (!qlm_store_add_owned(s, p->name, QLM_F32, p->cols ? 2 : 1, shape, &data)) return -1;
    size_t count = (size_t)(p->rows * (p->cols ? p->cols : 1));
    if (export_rows(be, data, *p->vector, 1, count * sizeof(float), 0) != 0) return -1;
    for (size_t k = 0; p->offset != 0 && k < count; k++) ((float *)data)[k] -= p->offset;
    return 0;
}

int qlm_params_export(const qlm_backend *be, const qlm_param *p, int n, qlm_tensor_store *store) {
    for (int i = 0; i < n; i++) {
        int rc = 0;
        if (p[i].matrix && p[i].matrix->data)
            rc = export_matrix(be, store, p[i].name, p[i].matrix);
        else if (!p[i].matrix && *p[i].vector)
            rc = export_vector(be, store, &p[i]);
        if (rc != 0) return -1;
    }
    return 0;
}

int qlm_params_list_cacheable(const qlm_param *p, int n, qlm_tensor_store *store) {
    for (int i = 0; i < n; i++) {
        const qlm_weight *w = p[i].matrix;
        const int block = w && qlm_dtype_is_block(w->dtype);
        if (!w || !w->data || !w->made_at_load || (block && !w->act8)) continue;
        int64_t shape[2] = {w->rows, w->cols};
        qlm_tensor_entry *e = qlm_store_add(store, p[i].name, w->dtype, 2, shape, w->data,
                                            (size_t)w->rows * qlm_dtype_row_bytes(w->dtype, w->cols, w->group));
        if (!e) return -1;
        e->group = w->group;
        e->scale = w->scale;
        e->row_scales = w->row_scales;
    }
    return 0;
}

int64_t qlm_params_count(const qlm_param *p, int n) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        int present = qlm_param_present(&p[i]);
        if (present) total += p[i].rows * (p[i].cols ? p[i].cols : 1);
    }
    return total;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

int qlm_params_add_random(const qlm_param *p, int n, uint64_t seed, qlm_tensor_store *store) {
    for (int k = 0; k < n; k++) {
        int64_t shape[2] = {p[k].rows, p[k].cols}, count = p[k].rows * (p[k].cols ? p[k].cols : 1);
        void *data;
        if (!qlm_store_add_owned(store, p[k].name, QLM_F32, p[k].cols ? 2 : 1, shape, &data)) return -1;
        float *w = data, gain = p[k].matrix ? 1.0f / sqrtf((float)p[k].cols) : 1.0f;
        uint64_t base = splitmix64(seed + (uint64_t)k) << 32;
        for (int64_t i = 0; i < count; i++) {
            float u = (float)((double)(splitmix64(base + (uint64_t)i) >> 40) / 16777216.0 * 2.0 - 1.0);
            w[i] = p[k].cols ? u * gain : 1.0f - p[k].offset;
        }
    }
    return 0;
}

int qlm_param_present(const qlm_param *p) { return p->matrix ? p->matrix->data != NULL : *p->vector != NULL; }

int qlm_params_twin(const qlm_backend *be, qlm_param *p, int k, void **buffer) {
    size_t floats = 0;
    for (int i = 0; i < k; i++)
        if (qlm_param_present(&p[i]))
            floats += ((size_t)p[i].rows * (p[i].cols ? (size_t)p[i].cols : 1) + 15) & ~(size_t)15;
    float *buf = be->alloc((floats ? floats : 1) * sizeof *buf);
    if (!buf) return qlm_errorf("out of memory for %.1f MiB of F32 parameters", floats * 4.0 / 1048576.0);
    be->zero(buf, (long)(floats ? floats : 1));
    *buffer = buf;
    for (int i = 0; i < k; i++) {
        if (!qlm_param_present(&p[i])) continue;
        size_t n = (size_t)p[i].rows * (p[i].cols ? (size_t)p[i].cols : 1);
        if (p[i].matrix)
            *p[i].matrix = (qlm_weight){.dtype = QLM_F32, .rows = (int)p[i].rows, .cols = (int)p[i].cols,
                                        .data = buf, .scale = 1.0f};
        else
            *p[i].vector = buf;
        buf += (n + 15) & ~(size_t)15;
    }
    return 0;
}
