/* Attention scores with the keys across the lanes, for calls of many query rows (prefill): each
 * block of LANE_COUNT keys is widened and turned once (lane k holds key k), then every query row
 * meets it with FMAs whose query element is broadcast, and the horizontal sums that weigh on the
 * tiles' scores at small head sizes (hsum4's shuffles, all on one port) become vertical adds.
 * Lane j's chain of a tile (the columns gemm_step puts in lane j, in its order) is here the chain
 * of turned vector j, and hsum4's tree (with 16 lanes first lane j with j + 8, then pairs, then
 * halves) is the same tree over those vectors, so every score is the tiles' bit for bit: a row's
 * score depends neither on the call's row count nor on which kernel took it.
 *
 * Included by kernels_avx512.h and kernels_avx2.h after kernel_rows.h (dot_rows, the tiles'
 * driver, takes the calls this one does not), once they define LANE_VEC (their vector type),
 * LANE_COUNT (its floats), LANE_QUERIES (query rows a pass takes within their registers),
 * LANE_KEYS_MIN_ROWS (query rows from which turning each block pays for itself),
 * LANES_OWN_ORDER(dt) (where dt's tiles sum in an order of their own: the BF16 dot product),
 * lanes_zero, lanes_fma, lanes_add, lanes_set1, lanes_unpacklo, lanes_unpackhi, lanes_shuffle (their
 * intrinsics), lanes_store (the first nk lanes), lanes_key_step (step s of a key row as gemm_step
 * puts it in the lanes) and lanes_cross (a transpose's moves across 128-bit lanes). */

/* head_dim up to which a turned block (head_dim vectors) stays on the stack. */
#define LANE_KEYS_MAX_COLS 256

/* v[c] becomes the vector of lane c of the LANE_COUNT vectors v held: a 4 x 4 transpose inside each
 * 128-bit lane of each group of four vectors (u[4k + e], lane L: element 4L + e of v[4k .. 4k + 3]),
 * then lanes_cross's moves across lanes. */
KERNEL_INLINE void lanes_transpose(LANE_VEC v[LANE_COUNT]) {
    LANE_VEC t[LANE_COUNT], u[LANE_COUNT];
    QLM_UNROLL(8)
    for (int k = 0; k < LANE_COUNT / 2; k++) {
        t[2 * k] = lanes_unpacklo(v[2 * k], v[2 * k + 1]);
        t[2 * k + 1] = lanes_unpackhi(v[2 * k], v[2 * k + 1]);
    }
    QLM_UNROLL(4)
    for (int k = 0; k < LANE_COUNT / 4; k++) {
        u[4 * k] = lanes_shuffle(t[4 * k], t[4 * k + 2], 0x44);
        u[4 * k + 1] = lanes_shuffle(t[4 * k], t[4 * k + 2], 0xee);
        u[4 * k + 2] = lanes_shuffle(t[4 * k + 1], t[4 * k + 3], 0x44);
        u[4 * k + 3] = lanes_shuffle(t[4 * k + 1], t[4 * k + 3], 0xee);
    }
    lanes_cross(v, u);
}

/* f_j of nq (a constant) query rows against the turned block kt: chain j multiplies turned
 * vector LANE_COUNT s + j by the query's element LANE_COUNT s + j (its x form) for each step s in
 * order, from zero, as the tile's lane j does; with 16 lanes chain j + 8 is added, as fold() adds
 * a lane pair. */
KERNEL_INLINE void lane_chain(LANE_VEC f[LANE_QUERIES], const float *x, long ldx, const LANE_VEC *kt, int steps,
                              int j, const int nq) {
    LANE_VEC lo[LANE_QUERIES], hi[LANE_QUERIES];
    QLM_UNROLL(4)
    for (int i = 0; i < nq; i++) lo[i] = hi[i] = lanes_zero();
    for (int s = 0; s < steps; s++) {
        const LANE_VEC *ks = kt + LANE_COUNT * s;
        const float *xs = x + LANE_COUNT * s;
        QLM_UNROLL(4)
        for (int i = 0; i < nq; i++) {
            lo[i] = lanes_fma(ks[j], lanes_set1(xs[i * ldx + j]), lo[i]);
            if (LANE_COUNT == 16) hi[i] = lanes_fma(ks[j + 8], lanes_set1(xs[i * ldx + j + 8]), hi[i]);
        }
    }
    QLM_UNROLL(4)
    for (int i = 0; i < nq; i++) f[i] = LANE_COUNT == 16 ? lanes_add(lo[i], hi[i]) : lo[i];
}

/* q = f_j + f_{j + 1} (j even): the first of hsum4's pairwise sums. */
KERNEL_INLINE void lane_pair(LANE_VEC q[LANE_QUERIES], const float *x, long ldx, const LANE_VEC *kt, int steps, int j,
                             const int nq) {
    LANE_VEC f[LANE_QUERIES];
    lane_chain(q, x, ldx, kt, steps, j, nq);
    lane_chain(f, x, ldx, kt, steps, j + 1, nq);
    QLM_UNROLL(4)
    for (int i = 0; i < nq; i++) q[i] = lanes_add(q[i], f[i]);
}

/* Scores of nq (a constant) query rows against a turned block, its first nk keys stored: hsum4's
 * tree ((f0 + f1) + (f2 + f3)) + ((f4 + f5) + (f6 + f7)), each sum taken as its terms come. */
KERNEL_INLINE void lane_scores(float *y, long ldy, const float *x, long ldx, const LANE_VEC *kt, int steps,
                               const int nq, int nk) {
    LANE_VEC h[LANE_QUERIES], a[LANE_QUERIES], b[LANE_QUERIES];
    lane_pair(a, x, ldx, kt, steps, 0, nq);
    lane_pair(b, x, ldx, kt, steps, 2, nq);
    QLM_UNROLL(4)
    for (int i = 0; i < nq; i++) h[i] = lanes_add(a[i], b[i]);
    lane_pair(a, x, ldx, kt, steps, 4, nq);
    lane_pair(b, x, ldx, kt, steps, 6, nq);
    QLM_UNROLL(4)
    for (int i = 0; i < nq; i++) lanes_store(y + i * ldy, lanes_add(h[i], lanes_add(a[i], b[i])), nk);
}

/* dot_rows for query rows in the x form of dt (rows cols apart) and whole steps of columns: keys
 * in blocks of LANE_COUNT, each widened and turned in place in kt, then met by LANE_QUERIES rows at
 * a time, the last few one by one. */
KERNEL_INLINE void key_lane_scores(float *y, long ldy, const float *x, int n, const char *w, size_t stride, int rows,
                                   long cols, qlm_dtype dt) {
    LANE_VEC kt[LANE_KEYS_MAX_COLS];
    const int steps = (int)(cols / LANE_COUNT);
    for (int r0 = 0; r0 < rows; r0 += LANE_COUNT) {
        const int nk = rows - r0 < LANE_COUNT ? rows - r0 : LANE_COUNT;
        for (int s = 0; s < steps; s++) {
            LANE_VEC *v = kt + LANE_COUNT * s;
            QLM_UNROLL(16)
            for (int k = 0; k < LANE_COUNT; k++)
                v[k] = k < nk ? lanes_key_step(w + (size_t)(r0 + k) * stride, s, dt) : lanes_zero();
            lanes_transpose(v);
        }
        float *yr = y + r0;
        int i = 0;
        for (; i + LANE_QUERIES <= n; i += LANE_QUERIES)
            lane_scores(yr + i * ldy, ldy, x + i * cols, cols, kt, steps, LANE_QUERIES, nk);
        for (; i < n; i++) lane_scores(yr + i * ldy, ldy, x + i * cols, cols, kt, steps, 1, nk);
    }
}

/* The table's dot_rows: the keys across the lanes where they can be (not where dt's tiles keep
 * an order of their own, nor for a row with a partial step), else the tiles. */
KERNEL_FN void attention_scores(float *y, long ldy, const void *x, int n, const void *w, size_t w_stride, int rows,
                                long cols, qlm_dtype dt) {
    if (n >= LANE_KEYS_MIN_ROWS && !LANES_OWN_ORDER(dt) && cols % STEP_COLS(dt) == 0 && cols <= LANE_KEYS_MAX_COLS)
        key_lane_scores(y, ldy, (const float *)x, n, (const char *)w, w_stride * qlm_weight_elem_size(dt), rows, cols,
                        dt);
    else
        dot_rows(y, ldy, x, n, w, w_stride, rows, cols, dt);
}
