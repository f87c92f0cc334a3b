/* The lora op: rows that share a pair are multiplied together, t = A x and then y += scale · B t,
 * and every pair of the call goes through one parallel region, whose threads split the rows of x
 * to put in A's form, then the rows of all the A's and then those of all the B's, a barrier
 * between. Apart, each product was too small to split (one sequence's rank-16 pair of a 576-wide
 * projection is 18,432 multiply-adds), so one core read every pair from memory while the others
 * waited: four sequences on four F32 adapters took 28-37 us a projection, 17-21 us now, with caches
 * flushed between calls as a decode step's weights flush them. Each value is the bits two
 * qlm_matmul calls give (the same kernels through qlm_dot_rows; x and t rounded to BF16 for a
 * BF16 pair), however the rows split. */
#include "backend_cpu_lora.h"

#include <omp.h>
#include <string.h>

#include "../core/cpu_scratch.h"
#include "../core/error.h"
#include "../quant/matmul.h"

/* Multiply-adds below which a thread gets no share: a region costs about a microsecond, in which a
 * core reads some 16 KB of a pair from memory. */
#define MIN_WORK_PER_THREAD 4096L

/* Rows of x below which the calling thread puts them in A's form alone. */
#define MIN_PARALLEL_FORM_ROWS 8

/* One pair and the rows of the call that use it. */
typedef struct {
    const qlm_lora_ref *ref;
    const int *rows; /* m rows of the call, in order */
    int m;
    char *x;    /* those rows of x in A's activation form */
    float *t;   /* A x: m rows of rank floats */
    float *u;   /* B t: m rows of out floats */
    size_t tf;  /* where t's BF16 form starts in a thread's slice (BF16 pairs) */
} lora_group;

typedef struct {
    lora_group *g;
    int count;
    int in, out;
    char *t_form; /* nth slices of t_form_bytes, one a thread */
    size_t t_form_bytes;
} lora_call;

static _Thread_local qlm_cpu_scratch t_groups, t_rows, t_x, t_t, t_u, t_t_form;

/* Bytes of an element of x in the activation form of pair weights of dtype dt. */
static size_t form_size(qlm_dtype dt) {
    return dt == QLM_BF16 ? qlm_bf16_x_size() : sizeof(float);
}

/* n values from src in the activation form of dt (the F32 values themselves unless BF16). */
static void to_form(void *dst, const float *src, long n, qlm_dtype dt) {
    if (dt == QLM_BF16)
        qlm_bf16_x_form(dst, src, n);
    else
        memcpy(dst, src, (size_t)n * sizeof *src);
}

/* Rows [k0, k1) of pair g's rows of x into A's form. */
static void form_rows(const lora_call *c, const lora_group *gr, const float *x, long k0, long k1) {
    const qlm_dtype dt = gr->ref->a->dtype;
    const size_t row = (size_t)c->in * form_size(dt);
    for (long k = k0; k < k1; k++) to_form(gr->x + k * row, x + (size_t)gr->rows[k] * c->in, c->in, dt);
}

/* Rows [j0, j1) of pair g's A against its rows of x. */
static void a_rows(const lora_call *c, const lora_group *gr, long j0, long j1) {
    const qlm_weight *a = gr->ref->a;
    const char *w = (const char *)a->data + (size_t)j0 * c->in * qlm_dtype_size(a->dtype);
    qlm_dot_rows(gr->t + j0, a->rows, gr->x, gr->m, w, (size_t)c->in, (int)(j1 - j0), c->in, a->dtype);
}

/* Rows [o0, o1) of pair g's B against t, scaled into y. form: the calling thread's slice for t's
 * BF16 form (each thread forms the t of the pairs it takes rows of). */
static void b_rows(const lora_call *c, const lora_group *gr, long o0, long o1, float *y, char *form) {
    const qlm_weight *b = gr->ref->b;
    const int r = b->cols;
    const void *t = gr->t;
    if (b->dtype == QLM_BF16) {
        char *tf = form + gr->tf;
        for (int k = 0; k < gr->m; k++)
            qlm_bf16_x_form(tf + (size_t)k * r * qlm_bf16_x_size(), gr->t + (size_t)k * r, r);
        t = tf;
    }
    const char *w = (const char *)b->data + (size_t)o0 * r * qlm_dtype_size(b->dtype);
    qlm_dot_rows(gr->u + o0, c->out, t, gr->m, w, (size_t)r, (int)(o1 - o0), r, b->dtype);
    for (int k = 0; k < gr->m; k++) {
        float *yr = y + (size_t)gr->rows[k] * c->out;
        const float *ur = gr->u + (size_t)k * c->out;
        for (long o = o0; o < o1; o++) yr[o] += gr->ref->scale * ur[o];
    }
}

/* The three passes of a call, each over all pairs' units one after another. */
typedef enum { PASS_FORM, PASS_A, PASS_B } lora_pass;

static long pass_units(const lora_call *c, const lora_group *gr, lora_pass p) {
    return p == PASS_FORM ? gr->m : p == PASS_A ? gr->ref->a->rows : c->out;
}

/* Thread t's share of a pass. */
static void run_pass(const lora_call *c, lora_pass p, const float *x, float *y, int t, int nt) {
    long total = 0, base = 0;
    for (int g = 0; g < c->count; g++) total += pass_units(c, &c->g[g], p);
    const long a = total * t / nt, b = total * (t + 1) / nt;
    for (int g = 0; g < c->count && base < b; g++) {
        const lora_group *gr = &c->g[g];
        const long units = pass_units(c, gr, p);
        const long from = a > base ? a - base : 0, to = b - base < units ? b - base : units;
        if (from < to) {
            if (p == PASS_FORM)
                form_rows(c, gr, x, from, to);
            else if (p == PASS_A)
                a_rows(c, gr, from, to);
            else
                b_rows(c, gr, from, to, y, c->t_form + (size_t)t * c->t_form_bytes);
        }
        base += units;
    }
}

static size_t line_up(size_t bytes) {
    return (bytes + 63) & ~(size_t)63;
}

int qlm_cpu_lora(float *y, const float *x, int n, const qlm_lora_ref *const *per_row) {
    lora_group *g = qlm_cpu_scratch_bytes(&t_groups, (size_t)n * sizeof *g);
    int *rows = qlm_cpu_scratch_bytes(&t_rows, (size_t)n * sizeof *rows);
    if (!g || !rows) return qlm_errorf("out of memory for LoRA scratch");
    lora_call c = {.g = g};
    size_t x_bytes = 0, t_floats = 0, u_floats = 0, t_form_bytes = 0;
    long work = 0;
    int used = 0;
    for (int i = 0; i < n; i++) {
        const int m = qlm_lora_group(per_row, n, i, rows + used);
        if (m == 0) continue;
        const qlm_lora_ref *ref = per_row[i];
        const int r = ref->a->rows;
        c.in = ref->a->cols;
        c.out = ref->b->rows;
        g[c.count++] = (lora_group){.ref = ref, .rows = rows + used, .m = m, .tf = t_form_bytes};
        x_bytes += line_up((size_t)m * c.in * form_size(ref->a->dtype));
        t_floats += (size_t)m * r;
        u_floats += (size_t)m * c.out;
        if (ref->b->dtype == QLM_BF16) t_form_bytes += line_up((size_t)m * r * qlm_bf16_x_size());
        work += (long)m * r * (c.in + c.out);
        used += m;
    }
    if (c.count == 0) return 0;
    const int nth = qlm_threads_for((double)work, MIN_WORK_PER_THREAD);
    char *xf = qlm_cpu_scratch_bytes(&t_x, x_bytes);
    float *t = qlm_cpu_scratch_get(&t_t, t_floats), *u = qlm_cpu_scratch_get(&t_u, u_floats);
    c.t_form_bytes = t_form_bytes;
    c.t_form = t_form_bytes ? qlm_cpu_scratch_bytes(&t_t_form, (size_t)nth * t_form_bytes) : NULL;
    if (!xf || !t || !u || (t_form_bytes && !c.t_form)) return qlm_errorf("out of memory for LoRA scratch");
    for (int k = 0; k < c.count; k++) {
        g[k].x = xf;
        g[k].t = t;
        g[k].u = u;
        xf += line_up((size_t)g[k].m * c.in * form_size(g[k].ref->a->dtype));
        t += (size_t)g[k].m * g[k].ref->a->rows;
        u += (size_t)g[k].m * c.out;
    }
    const int split_form = nth > 1 && used >= MIN_PARALLEL_FORM_ROWS;
    if (!split_form) run_pass(&c, PASS_FORM, x, y, 0, 1);
    if (nth == 1) {
        run_pass(&c, PASS_A, x, y, 0, 1);
        run_pass(&c, PASS_B, x, y, 0, 1);
        return 0;
    }
#pragma omp parallel num_threads(nth)
    {
        const int th = omp_get_thread_num(), nt = omp_get_num_threads();
        if (split_form) {
            run_pass(&c, PASS_FORM, x, y, th, nt);
#pragma omp barrier
        }
        run_pass(&c, PASS_A, x, y, th, nt);
#pragma omp barrier
        run_pass(&c, PASS_B, x, y, th, nt);
    }
    return 0;
}
