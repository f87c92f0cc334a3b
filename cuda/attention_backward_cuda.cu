// Attention's backward on the GPU without an n x n matrix: each probability is recomputed from q
// and k where it is needed, and every sum runs in a fixed order, so a run repeats bit for bit (no
// atomics). head_dim <= 128 takes the tiled path, FlashAttention-2's backward in F32 FMAs:
//  1. stats: a block per (32 query rows, chunk of keys, head) with key tiles staged in shared
//     memory: each row's max score, softmax sum and sum_t e_t (dout . v_t) over the chunk, the sums
//     in double (as the CPU sums them); a small kernel combines the chunks into (max, 1 / sum, D);
//  2. main: a block per (32 query rows, chunk of keys, head) for dq, and a block per (32 keys,
//     chunk of rows, query head) for dk and dv, in one grid: the first loads K and V tiles, the
//     second q and dout tiles, both recompute P = exp(s - max) / sum and dS = P (dP - D), put them
//     in shared memory and multiply them into the block's own rows (dq += dS k; dk += dS^T q,
//     dv += P^T dout), each thread 4 x 4 dot products (4 x 2 for head_dim over 64) and 4 x 4
//     outputs per 64 columns, all in F32 FMAs (no TF32, for the CPU's results to 1e-5);
//  3. sum: dq is the sum of its key chunks' parts, and dk, dv accumulate each head's part (the sum
//     of its row chunks) in head order, as the CPU adds them; a T5 bias's gradient (its diagonal
//     sums of dS, taken by the dq blocks) likewise.
// Chunks of keys (rows) cap the longest block where there are few blocks, so that a causal
// triangle spreads over the GPU. head_dim up to 256 runs the earlier kernels: a warp per (row, head), then per (key, KV
// head), then per (head, bias index). Training's form only: one sequence of F32 keys and values in
// the default layout.
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda_internal.h"

enum { BWD_WARPS = 8, BWD_MAX_HEAD_DIM = 256, BWD_TILED_HEAD_DIM = 128 };
// The tiled path: a block of 128 threads owns 32 rows (or keys) and streams the others in tiles.
// Chunks are multiples of CHUNK_UNIT keys (rows), at most MAX_CHUNKS of them.
enum { OWN = 32, THREADS = 128, CHUNK_UNIT = 64, MAX_CHUNKS = 4, SUM_THREADS = 256 };

struct attn_bwd_args {
    float *dq, *dk, *dv, *dbias;
    float *stats;       // [n][n_heads] of (max score, 1 / softmax sum, D)
    double *part_stats; // [chunks_k][n][n_heads] of (max, sum, sum e * dp) over a chunk of keys
    float *part_q;      // [chunks_k][n][n_heads][head_dim], when chunks_k > 1
    float *part_k, *part_v; // [n_heads][chunks_r][nk][head_dim]
    float *part_bias;   // [row tiles][chunks_k][n_heads][span]
    const float *dout, *q, *k, *v, *bias;
    qlm_cuda_ints pos;
    int n, nk, n_heads, n_kv_heads, group, head_dim, n_keys, window, span, offset;
    int chunk, chunks_k, chunks_r; // keys (rows) per chunk, the key and row chunk counts
    int vec;                       // q, k, v, dout 16-byte aligned and head_dim % 4 == 0
    float scale, softcap;
};

// Keys [*first, return value) of the row at position p: the causal prefix or the fixed count, less
// what a window leaves out.
static __device__ __forceinline__ int row_keys(const attn_bwd_args &a, int p, int *first) {
    *first = a.n_keys <= 0 && a.window > 0 && p >= a.window ? p - a.window + 1 : 0;
    return a.n_keys > 0 ? a.n_keys : p + 1;
}

// The forward's score from a (row at p, head h) . key t product: scaled, capped, biased; *dcap is
// the cap's derivative 1 - tanh^2 (1 without a cap).
static __device__ __forceinline__ float score_of(const attn_bwd_args &a, float dot, int h, int p, int t, float *dcap) {
    float s = dot * a.scale;
    *dcap = 1.0f;
    if (a.softcap > 0) {
        const float th = tanhf(s / a.softcap);
        s = a.softcap * th;
        *dcap = 1.0f - th * th;
    }
    return a.bias ? s + a.bias[(size_t)h * a.span + (t - p + a.offset)] : s;
}

// dS = P (dP - D) of a pair from its row's stats, *pr = P computed as the CPU rounds it.
static __device__ __forceinline__ float pair_ds(const float *st, float s, float dp, float *pr) {
    *pr = expf(s - st[0]) * st[1];
    return *pr * (dp - st[2]);
}

// A row's (max, 1 / sum, D) from its max, softmax sum and sum of e * dp.
static __device__ __forceinline__ void put_stats(float *st, float m, double l, double pdp) {
    st[0] = m;
    st[1] = l > 0 ? (float)(1.0 / l) : 0.0f;
    st[2] = l > 0 ? (float)(pdp / l) : 0.0f;
}

// ---- the tiled path ----
//
// Shared memory, in floats: X1, X2 [32][HD + 4] the block's own rows (q and dout of 32 query rows,
// or k and v of 32 keys), Y1, Y2 [BS][HD + 4] the streamed tile (k and v, or q and dout), W1, W2
// [32][BS + 8] the products for the own rows (dS and its pre-scale form, or dS^T and P^T), then the
// streamed rows' (max, 1 / sum, D, position, first key, key end). The paddings keep every access of
// a warp within distinct banks: a float4 row read by 8 lanes hits rows 4 banks apart, and a W
// element written by a 4 x 8 patch of lanes hits rows 8 banks apart.
//
// Thread (ta, tb), ta = 0..7, tb = 0..15 (a warp is a 4 x 8 patch of them): own rows ta + 8i
// (i < 4), streamed rows tb + 16j (j < BS / 16), output columns 4 tb + 64 k + e (k < HD / 64).
template <int HD, int BS> struct tile_geom {
    static constexpr int XS = HD + 4, WS = BS + 8, NB = BS / 16, NO = HD / 16;
    static constexpr int X1 = 0, X2 = X1 + OWN * XS, Y1 = X2 + OWN * XS, Y2 = Y1 + BS * XS, W1 = Y2 + BS * XS,
                         W2 = W1 + OWN * WS, INFO = W2 + OWN * WS, END = INFO + 6 * BS;
    // The stats kernel keeps X and Y, then its reductions: [2][32] double sums and products, [2][32] maxima.
    static constexpr int RED = W1, STATS_END = RED + 4 * 2 * OWN + 2 * OWN;
    static_assert(HD % 64 == 0 && BS % 16 == 0 && CHUNK_UNIT % BS == 0, "tile shapes");
    static_assert(OWN * HD % (4 * THREADS) == 0 && BS * HD % (4 * THREADS) == 0, "tile loads");
};

struct tile_thread {
    int ta, tb;
};
static __device__ __forceinline__ tile_thread thread_in_tile() {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    return {(w >> 1) * 4 + (l >> 3), (w & 1) * 8 + (l & 7)};
}

static __device__ __forceinline__ float comp(const float4 &v, int u) { return u == 0 ? v.x : u == 1 ? v.y : u == 2 ? v.z : v.w; }

// dst[r][0..HD) (row stride HD + 4) = row r of src (rows apart by stride) for r < rows, zeros past
// rows and past hd.
template <int HD, int ROWS>
static __device__ __forceinline__ void load_rows(float *dst, const float *src, size_t stride, int rows, int hd, int vec) {
    constexpr int XS = HD + 4;
    if (vec) {
#pragma unroll
        for (int it = 0; it < ROWS * HD / 4 / THREADS; it++) {
            const int e = it * THREADS + threadIdx.x, r = e / (HD / 4), d = 4 * (e % (HD / 4));
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < rows && d < hd) x = *(const float4 *)(src + r * stride + d);
            *(float4 *)(dst + r * XS + d) = x;
        }
    } else {
#pragma unroll 4
        for (int it = 0; it < ROWS * HD / THREADS; it++) {
            const int e = it * THREADS + threadIdx.x, r = e / HD, d = e % HD;
            dst[r * XS + d] = r < rows && d < hd ? src[r * stride + d] : 0.0f;
        }
    }
}

// acc[i][j] = X[ta + 8i] . Y[tb + 16j] over HD elements, summed in element order (the same bits
// whichever of the two is the query).
template <int HD, int BS>
static __device__ __forceinline__ void tile_dots(float (&acc)[4][BS / 16], const float *X, const float *Y, tile_thread tt) {
    constexpr int XS = HD + 4, NB = BS / 16;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < NB; j++) acc[i][j] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < HD; d += 4) {
        float4 x[4], y[NB];
#pragma unroll
        for (int i = 0; i < 4; i++) x[i] = *(const float4 *)(X + (tt.ta + 8 * i) * XS + d);
#pragma unroll
        for (int j = 0; j < NB; j++) y[j] = *(const float4 *)(Y + (tt.tb + 16 * j) * XS + d);
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < NB; j++) acc[i][j] = fmaf(comp(x[i], u), comp(y[j], u), acc[i][j]);
    }
}

// Rows r0.. of head h's queries into Q and of its output gradients into D (ROWS rows).
template <int HD, int ROWS>
static __device__ __forceinline__ void query_rows(const attn_bwd_args &a, int r0, int h, float *Q, float *D) {
    const size_t stride = (size_t)a.n_heads * a.head_dim, at = ((size_t)r0 * a.n_heads + h) * a.head_dim;
    load_rows<HD, ROWS>(Q, a.q + at, stride, a.n - r0, a.head_dim, a.vec);
    load_rows<HD, ROWS>(D, a.dout + at, stride, a.n - r0, a.head_dim, a.vec);
}

// Keys t0.. (count of them, at most ROWS) of KV head g into K and their values into V.
template <int HD, int ROWS>
static __device__ __forceinline__ void key_rows(const attn_bwd_args &a, int t0, int count, int g, float *K, float *V) {
    const size_t stride = (size_t)a.n_kv_heads * a.head_dim, at = (size_t)t0 * stride + (size_t)g * a.head_dim;
    load_rows<HD, ROWS>(K, a.k + at, stride, count, a.head_dim, a.vec);
    load_rows<HD, ROWS>(V, a.v + at, stride, count, a.head_dim, a.vec);
}

// Key tile t0 of KV head g into Y1 (keys) and Y2 (values), once every thread has read the last
// one, then s = the own rows X1 (queries) . keys and dp = X2 (dout) . values.
template <int HD, int BS>
static __device__ __forceinline__ void key_tile_dots(const attn_bwd_args &a, int t0, int g, const float *X1,
                                                     const float *X2, float *Y1, float *Y2, tile_thread tt,
                                                     float (&s)[4][BS / 16], float (&dp)[4][BS / 16]) {
    __syncthreads();
    key_rows<HD, BS>(a, t0, a.nk - t0, g, Y1, Y2);
    __syncthreads();
    tile_dots<HD, BS>(s, X1, Y1, tt);
    tile_dots<HD, BS>(dp, X2, Y2, tt);
}

// out[i][4k + e] += sum over the tile's rows b, in order, of W[ta + 8i][b] Y[b][4 tb + 64k + e].
template <int HD, int BS>
static __device__ __forceinline__ void tile_acc(float (&out)[4][HD / 16], const float *W, const float *Y, tile_thread tt) {
    constexpr int XS = HD + 4, WS = BS + 8;
#pragma unroll 2
    for (int b = 0; b < BS; b += 4) {
        float4 w[4];
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = *(const float4 *)(W + (tt.ta + 8 * i) * WS + b);
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int k = 0; k < HD / 64; k++) {
                const float4 z = *(const float4 *)(Y + (b + u) * XS + 4 * tt.tb + 64 * k);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float wi = comp(w[i], u);
                    out[i][4 * k + 0] = fmaf(wi, z.x, out[i][4 * k + 0]);
                    out[i][4 * k + 1] = fmaf(wi, z.y, out[i][4 * k + 1]);
                    out[i][4 * k + 2] = fmaf(wi, z.z, out[i][4 * k + 2]);
                    out[i][4 * k + 3] = fmaf(wi, z.w, out[i][4 * k + 3]);
                }
            }
    }
}

// Thread (ta, tb)'s columns of its own rows to dst (rows apart by stride), rows < rows, columns < hd.
template <int HD>
static __device__ __forceinline__ void store_rows(float *dst, size_t stride, int rows, int hd, const float (&out)[4][HD / 16],
                                                  tile_thread tt) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = tt.ta + 8 * i;
        if (r >= rows) continue;
#pragma unroll
        for (int k = 0; k < HD / 64; k++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int d = 4 * tt.tb + 64 * k + e;
                if (d < hd) dst[r * stride + d] = out[i][4 * k + e];
            }
    }
}

// The query rows [r0, r0 + 32) of a block: each thread's four (position, first key, key end), and
// the keys [*lo, *hi) any of them sees within key chunk c, and the rows' least and largest position.
static __device__ __forceinline__ void own_rows(const attn_bwd_args &a, int r0, int c, tile_thread tt, int (&p)[4],
                                                int (&first)[4], int (&seen)[4], int *lo, int *hi, int *pmin, int *pmax) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = r0 + tt.ta + 8 * i;
        p[i] = first[i] = seen[i] = 0;
        if (r < a.n) {
            p[i] = qlm_ints_at(a.pos, r);
            seen[i] = row_keys(a, p[i], &first[i]);
        }
    }
    int l = a.nk, h = 0, pl = INT_MAX, ph = INT_MIN;
    for (int r = r0; r < r0 + OWN && r < a.n; r++) {
        const int pr = qlm_ints_at(a.pos, r);
        int f;
        const int s = row_keys(a, pr, &f);
        l = min(l, f), h = max(h, s), pl = min(pl, pr), ph = max(ph, pr);
    }
    const int c0 = c * a.chunk;
    *lo = max(l, c0);
    *hi = min(h, min(a.nk, c0 + a.chunk));
    *pmin = pl, *pmax = ph;
}

// Block (row tile, key chunk c, head h) of the stats: each row's (max, sum, sum e * dp) over the
// chunk's keys, each thread its own in a running max, then the 16 threads of a row combined.
template <int HD, int BS>
__global__ void __launch_bounds__(THREADS) attn_bwd_stats_kernel(attn_bwd_args a) {
    typedef tile_geom<HD, BS> G;
    extern __shared__ float4 bwd_smem[];
    float *sm = (float *)bwd_smem, *X1 = sm + G::X1, *X2 = sm + G::X2, *Y1 = sm + G::Y1, *Y2 = sm + G::Y2;
    double *red_l = (double *)(sm + G::RED), *red_p = red_l + 2 * OWN;
    float *red_m = (float *)(red_p + 2 * OWN);
    int id = blockIdx.x;
    const int h = id % a.n_heads;
    id /= a.n_heads;
    const int c = id % a.chunks_k, r0 = ((a.n + OWN - 1) / OWN - 1 - id / a.chunks_k) * OWN; // the longest rows first
    const int g = h / a.group;
    const tile_thread tt = thread_in_tile();
    query_rows<HD, OWN>(a, r0, h, X1, X2);
    int p[4], first[4], seen[4], lo, hi, pmin, pmax;
    own_rows(a, r0, c, tt, p, first, seen, &lo, &hi, &pmin, &pmax);
    float m[4];
    double l[4], pd[4];
#pragma unroll
    for (int i = 0; i < 4; i++) m[i] = -INFINITY, l[i] = pd[i] = 0;
    for (int t0 = lo / BS * BS; t0 < hi; t0 += BS) {
        float s[4][G::NB], dp[4][G::NB], dcap;
        key_tile_dots<HD, BS>(a, t0, g, X1, X2, Y1, Y2, tt, s, dp);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float mt = -INFINITY;
#pragma unroll
            for (int j = 0; j < G::NB; j++) {
                const int t = t0 + tt.tb + 16 * j;
                if (t >= first[i] && t < seen[i]) {
                    s[i][j] = score_of(a, s[i][j], h, p[i], t, &dcap);
                    mt = fmaxf(mt, s[i][j]);
                }
            }
            if (mt > m[i]) {
                const double f = m[i] == -INFINITY ? 0.0 : exp((double)m[i] - (double)mt);
                l[i] *= f, pd[i] *= f, m[i] = mt;
            }
#pragma unroll
            for (int j = 0; j < G::NB; j++) {
                const int t = t0 + tt.tb + 16 * j;
                if (t >= first[i] && t < seen[i]) {
                    const float e = expf(s[i][j] - m[i]);
                    l[i] += e;
                    pd[i] += (double)e * dp[i][j];
                }
            }
        }
    }
    // A row's 16 threads: 8 lanes of each of two warps, combined within each warp by shuffles and
    // across the two in shared memory, in the same order every run.
    const int lane = threadIdx.x & 31, half = (threadIdx.x >> 5) & 1;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float mm = m[i];
        for (int o = 1; o < 8; o <<= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
        if ((lane & 7) == 0) red_m[half * OWN + tt.ta + 8 * i] = mm;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = tt.ta + 8 * i;
        const float mx = fmaxf(red_m[r], red_m[OWN + r]);
        const double f = m[i] == -INFINITY ? 0.0 : exp((double)m[i] - (double)mx);
        double ls = l[i] * f, ps = pd[i] * f;
        for (int o = 1; o < 8; o <<= 1) {
            ls += __shfl_xor_sync(0xffffffffu, ls, o);
            ps += __shfl_xor_sync(0xffffffffu, ps, o);
        }
        if ((lane & 7) == 0) red_l[half * OWN + r] = ls, red_p[half * OWN + r] = ps;
    }
    __syncthreads();
    if (tt.tb != 0) return;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = tt.ta + 8 * i, row = r0 + r;
        if (row >= a.n) continue;
        const float mx = fmaxf(red_m[r], red_m[OWN + r]);
        const double ls = red_l[r] + red_l[OWN + r], ps = red_p[r] + red_p[OWN + r];
        if (a.chunks_k == 1) {
            put_stats(a.stats + ((size_t)row * a.n_heads + h) * 3, mx, ls, ps);
        } else {
            double *st = a.part_stats + (((size_t)c * a.n + row) * a.n_heads + h) * 3;
            st[0] = mx, st[1] = ls, st[2] = ps;
        }
    }
}

// A thread per (row, head): its chunks' stats combined in chunk order.
__global__ void attn_bwd_stats_sum_kernel(attn_bwd_args a) {
    const size_t e = (size_t)blockIdx.x * SUM_THREADS + threadIdx.x, rows = (size_t)a.n * a.n_heads;
    if (e >= rows) return;
    const double *ps = a.part_stats + e * 3;
    double mx = -INFINITY, l = 0, pdp = 0;
    for (int c = 0; c < a.chunks_k; c++) mx = fmax(mx, ps[c * rows * 3]);
    for (int c = 0; c < a.chunks_k; c++) {
        const double *st = ps + c * rows * 3;
        if (st[0] == -INFINITY) continue;
        const double f = exp(st[0] - mx);
        l += st[1] * f;
        pdp += st[2] * f;
    }
    put_stats(a.stats + e * 3, (float)mx, l, pdp);
}

// Block (row tile at r0, key chunk c, head h): dq of the 32 rows over the chunk's keys, written to
// dq (one chunk) or to the chunk's part; with a bias, the block's diagonal sums of dS into its
// part of the bias gradient.
template <int HD, int BS> static __device__ __forceinline__ void dq_block(const attn_bwd_args &a, float *sm, int r0, int c, int h) {
    typedef tile_geom<HD, BS> G;
    float *X1 = sm + G::X1, *X2 = sm + G::X2, *Y1 = sm + G::Y1, *Y2 = sm + G::Y2, *W1 = sm + G::W1, *W2 = sm + G::W2;
    int *own_p = (int *)(sm + G::INFO);
    const int hd = a.head_dim, g = h / a.group, rt = r0 / OWN;
    const size_t q_stride = (size_t)a.n_heads * hd;
    const tile_thread tt = thread_in_tile();
    query_rows<HD, OWN>(a, r0, h, X1, X2);
    int p[4], first[4], seen[4], lo, hi, pmin, pmax;
    own_rows(a, r0, c, tt, p, first, seen, &lo, &hi, &pmin, &pmax);
    float st[4][3];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int row = r0 + tt.ta + 8 * i;
#pragma unroll
        for (int u = 0; u < 3; u++) st[i][u] = row < a.n ? a.stats[((size_t)row * a.n_heads + h) * 3 + u] : 0.0f;
    }
    float *bias_part = NULL;
    if (a.dbias) {
        bias_part = a.part_bias + (((size_t)rt * a.chunks_k + c) * a.n_heads + h) * a.span;
        for (int j = threadIdx.x; j < a.span; j += THREADS) bias_part[j] = 0.0f;
        if (threadIdx.x < OWN) own_p[threadIdx.x] = r0 + (int)threadIdx.x < a.n ? qlm_ints_at(a.pos, r0 + threadIdx.x) : 0;
    }
    float acc[4][G::NO];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int k = 0; k < G::NO; k++) acc[i][k] = 0.0f;
    for (int t0 = lo / BS * BS; t0 < hi; t0 += BS) {
        float s[4][G::NB], dp[4][G::NB], dcap;
        key_tile_dots<HD, BS>(a, t0, g, X1, X2, Y1, Y2, tt, s, dp);
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < G::NB; j++) {
                const int t = t0 + tt.tb + 16 * j, at = (tt.ta + 8 * i) * G::WS + tt.tb + 16 * j;
                float ds = 0.0f, gs = 0.0f, pr;
                if (t >= first[i] && t < seen[i]) {
                    const float sc = score_of(a, s[i][j], h, p[i], t, &dcap);
                    ds = pair_ds(st[i], sc, dp[i][j], &pr);
                    gs = ds * dcap * a.scale;
                }
                W1[at] = gs;
                W2[at] = ds;
            }
        __syncthreads();
        tile_acc<HD, BS>(acc, W1, Y1, tt);
        if (bias_part) {
            // Bias index j meets row r's key j + p_r - offset: the tile's diagonals, rows in order.
            const int j0 = max(0, t0 - pmax + a.offset), j1 = min(a.span, t0 + BS - pmin + a.offset);
            for (int j = j0 + threadIdx.x; j < j1; j += THREADS) {
                float sum = 0.0f;
                for (int r = 0; r < OWN && r0 + r < a.n; r++) {
                    const int t = j + own_p[r] - a.offset;
                    if (t >= t0 && t < t0 + BS) sum += W2[r * G::WS + t - t0];
                }
                bias_part[j] += sum;
            }
        }
    }
    float *dst = a.chunks_k == 1 ? a.dq : a.part_q + (size_t)c * a.n * q_stride;
    store_rows<HD>(dst + ((size_t)r0 * a.n_heads + h) * hd, q_stride, a.n - r0, hd, acc, tt);
}

// Block (key tile at k0, row chunk c, query head h): head h's part of dk and dv of the 32 keys
// over the chunk's rows, row tiles in order.
template <int HD, int BS> static __device__ __forceinline__ void dkv_block(const attn_bwd_args &a, float *sm, int k0, int c, int h) {
    typedef tile_geom<HD, BS> G;
    float *X1 = sm + G::X1, *X2 = sm + G::X2, *Y1 = sm + G::Y1, *Y2 = sm + G::Y2, *W1 = sm + G::W1, *W2 = sm + G::W2;
    float *i_st = sm + G::INFO; // [BS][3]
    int *i_p = (int *)(i_st + 3 * BS), *i_first = i_p + BS, *i_seen = i_first + BS;
    const int hd = a.head_dim, g = h / a.group;
    const tile_thread tt = thread_in_tile();
    const int k1 = min(a.nk, k0 + OWN);
    key_rows<HD, OWN>(a, k0, k1 - k0, g, X1, X2);
    float dk[4][G::NO], dv[4][G::NO];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int k = 0; k < G::NO; k++) dk[i][k] = dv[i][k] = 0.0f;
    const int rows_end = min(a.n, (c + 1) * a.chunk);
    for (int r0 = c * a.chunk; r0 < rows_end; r0 += BS) {
        // The row stats were last read before the W barrier, Y before the next barrier below.
        int sees = 0;
        if (threadIdx.x < BS) {
            const int b = threadIdx.x, row = r0 + b;
            int p = 0, first = 0, seen = 0;
            if (row < a.n) {
                p = qlm_ints_at(a.pos, row);
                seen = row_keys(a, p, &first);
#pragma unroll
                for (int u = 0; u < 3; u++) i_st[3 * b + u] = a.stats[((size_t)row * a.n_heads + h) * 3 + u];
            }
            i_p[b] = p, i_first[b] = first, i_seen[b] = seen;
            sees = first < k1 && seen > k0 && first < seen;
        }
        if (!__syncthreads_or(sees)) continue; // no row of the tile sees these keys
        query_rows<HD, BS>(a, r0, h, Y1, Y2);
        __syncthreads();
        float s[4][G::NB], dp[4][G::NB], dcap;
        tile_dots<HD, BS>(s, X1, Y1, tt);
        tile_dots<HD, BS>(dp, X2, Y2, tt);
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < G::NB; j++) {
                const int t = k0 + tt.ta + 8 * i, b = tt.tb + 16 * j, at = (tt.ta + 8 * i) * G::WS + b;
                float gs = 0.0f, pr = 0.0f;
                if (t < a.nk && t >= i_first[b] && t < i_seen[b]) {
                    const float sc = score_of(a, s[i][j], h, i_p[b], t, &dcap);
                    gs = pair_ds(i_st + 3 * b, sc, dp[i][j], &pr) * dcap * a.scale;
                }
                W1[at] = gs;
                W2[at] = pr;
            }
        __syncthreads();
        tile_acc<HD, BS>(dk, W1, Y1, tt);
        tile_acc<HD, BS>(dv, W2, Y2, tt);
    }
    const size_t part = (((size_t)h * a.chunks_r + c) * a.nk + k0) * hd;
    store_rows<HD>(a.part_k + part, hd, k1 - k0, hd, dk, tt);
    store_rows<HD>(a.part_v + part, hd, k1 - k0, hd, dv, tt);
}

// The dq blocks and the dk/dv blocks in one grid, interleaved and the longest first (for causal
// rows: the last row tiles and the first key tiles), heads innermost.
template <int HD, int BS>
__global__ void __launch_bounds__(THREADS, HD <= 64 ? 3 : 2) attn_bwd_main_kernel(attn_bwd_args a) {
    extern __shared__ float4 bwd_smem[];
    float *sm = (float *)bwd_smem;
    int id = blockIdx.x;
    const int h = id % a.n_heads;
    id /= a.n_heads;
    const int u = id >> 1, row_tiles = (a.n + OWN - 1) / OWN, key_tiles = (a.nk + OWN - 1) / OWN;
    if (id & 1) {
        if (u >= key_tiles * a.chunks_r) return;
        dkv_block<HD, BS>(a, sm, u / a.chunks_r * OWN, u % a.chunks_r, h);
    } else {
        if (u >= row_tiles * a.chunks_k) return;
        dq_block<HD, BS>(a, sm, (row_tiles - 1 - u / a.chunks_k) * OWN, u % a.chunks_k, h);
    }
}

// A thread per value: dq = its chunks' parts in chunk order (when there are several); dk and dv +=
// each head of the group in head order, a head's part the sum of its row chunks in order; dbias
// += the parts of its row tiles and key chunks in order.
__global__ void attn_bwd_sum_kernel(attn_bwd_args a) {
    size_t e = (size_t)blockIdx.x * SUM_THREADS + threadIdx.x;
    const size_t hd = a.head_dim, nq = a.chunks_k > 1 ? (size_t)a.n * a.n_heads * hd : 0,
                 nkv = (size_t)a.nk * a.n_kv_heads * hd, nb = a.dbias ? (size_t)a.n_heads * a.span : 0;
    if (e < nq) {
        float s = a.part_q[e];
        for (int c = 1; c < a.chunks_k; c++) s += a.part_q[c * nq + e];
        a.dq[e] = s;
        return;
    }
    e -= nq;
    if (e < nkv) {
        const size_t d = e % hd, t = e / hd / a.n_kv_heads;
        const int g = (int)(e / hd % a.n_kv_heads);
        float sk = a.dk[e], sv = a.dv[e];
        for (int h = g * a.group; h < (g + 1) * a.group; h++) {
            const size_t at = ((size_t)h * a.chunks_r * a.nk + t) * hd + d, chunk = (size_t)a.nk * hd;
            float hk = a.part_k[at], hv = a.part_v[at];
            for (int c = 1; c < a.chunks_r; c++) hk += a.part_k[at + c * chunk], hv += a.part_v[at + c * chunk];
            sk += hk, sv += hv;
        }
        a.dk[e] = sk, a.dv[e] = sv;
        return;
    }
    e -= nkv;
    if (e < nb) {
        const size_t per = nb, tiles = (size_t)(a.n + OWN - 1) / OWN * a.chunks_k;
        float s = a.dbias[e];
        for (size_t u = 0; u < tiles; u++) s += a.part_bias[u * per + e];
        a.dbias[e] = s;
    }
}

template <int HD, int BS> static int main_smem_bytes() { return tile_geom<HD, BS>::END * (int)sizeof(float); }
template <int HD, int BS> static int stats_smem_bytes() { return tile_geom<HD, BS>::STATS_END * (int)sizeof(float); }

template <int HD, int BS> static void launch_tiled(const attn_bwd_args &a) {
    static int ready; // the shared memory limit raised, once per kernel
    if (!ready) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_stats_kernel<HD, BS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        stats_smem_bytes<HD, BS>()));
        CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_main_kernel<HD, BS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        main_smem_bytes<HD, BS>()));
        ready = 1;
    }
    const int row_tiles = (a.n + OWN - 1) / OWN, key_tiles = (a.nk + OWN - 1) / OWN;
    const int units = max(row_tiles * a.chunks_k, key_tiles * a.chunks_r);
    attn_bwd_stats_kernel<HD, BS>
        <<<row_tiles * a.chunks_k * a.n_heads, THREADS, stats_smem_bytes<HD, BS>(), qlm_cuda_stream>>>(a);
    LAUNCH_CHECK();
    if (a.chunks_k > 1) {
        attn_bwd_stats_sum_kernel<<<qlm_cuda_blocks((long)a.n * a.n_heads, SUM_THREADS), SUM_THREADS, 0, qlm_cuda_stream>>>(a);
        LAUNCH_CHECK();
    }
    attn_bwd_main_kernel<HD, BS><<<2 * units * a.n_heads, THREADS, main_smem_bytes<HD, BS>(), qlm_cuda_stream>>>(a);
    LAUNCH_CHECK();
    const long values = (a.chunks_k > 1 ? (long)a.n * a.n_heads * a.head_dim : 0) + (long)a.nk * a.n_kv_heads * a.head_dim +
                        (a.dbias ? (long)a.n_heads * a.span : 0);
    attn_bwd_sum_kernel<<<qlm_cuda_blocks(values, SUM_THREADS), SUM_THREADS, 0, qlm_cuda_stream>>>(a);
}

// ---- head_dim over 128: a warp per unit of work, the head dimension across its lanes ----

// This lane's elements of a head_dim row; 0 past its end, so dot products need no bounds.
template <int ND> static __device__ __forceinline__ void load_row(float (&r)[ND], const float *src, int hd) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < ND; k++) r[k] = lane + 32 * k < hd ? src[lane + 32 * k] : 0.0f;
}

template <int ND> static __device__ __forceinline__ void store_row(float *dst, const float (&r)[ND], int hd) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < ND; k++)
        if (lane + 32 * k < hd) dst[lane + 32 * k] = r[k];
}

// Row i's query and output gradient in head h.
template <int ND>
static __device__ __forceinline__ void load_q_dout(float (&qr)[ND], float (&gr)[ND], const attn_bwd_args &a, int i, int h) {
    const size_t qo = ((size_t)i * a.n_heads + h) * a.head_dim;
    load_row(qr, a.q + qo, a.head_dim);
    load_row(gr, a.dout + qo, a.head_dim);
}

// Whether the row at position p attends to key t.
static __device__ __forceinline__ bool sees_key(const attn_bwd_args &a, int p, int t) {
    int first;
    const int seen = row_keys(a, p, &first);
    return t >= first && t < seen;
}

template <int ND> static __device__ __forceinline__ float dot_rows(const float (&x)[ND], const float (&y)[ND]) {
    float s = 0;
#pragma unroll
    for (int k = 0; k < ND; k++) s += x[k] * y[k];
    return qlm_warp_sum(s);
}

template <int ND>
__global__ void __launch_bounds__(BWD_WARPS * 32) attn_bwd_rows_kernel(attn_bwd_args a) {
    const int i = blockIdx.x * BWD_WARPS + (threadIdx.x >> 5), h = blockIdx.y, hd = a.head_dim;
    if (i >= a.n) return;
    const int p = qlm_ints_at(a.pos, i);
    const size_t kv_stride = (size_t)a.n_kv_heads * hd, qo = ((size_t)i * a.n_heads + h) * hd;
    const float *kh = a.k + (size_t)(h / a.group) * hd, *vh = a.v + (size_t)(h / a.group) * hd;
    float qr[ND], gr[ND], kr[ND], vr[ND], acc[ND], dcap;
    load_row(qr, a.q + qo, hd);
    load_row(gr, a.dout + qo, hd);
    int first;
    const int seen = row_keys(a, p, &first);
    float m = -INFINITY;
    for (int t = first; t < seen; t++) {
        load_row(kr, kh + t * kv_stride, hd);
        m = fmaxf(m, score_of(a, dot_rows(qr, kr), h, p, t, &dcap));
    }
    double l = 0, pdp = 0;
    for (int t = first; t < seen; t++) {
        load_row(kr, kh + t * kv_stride, hd);
        load_row(vr, vh + t * kv_stride, hd);
        const float e = expf(score_of(a, dot_rows(qr, kr), h, p, t, &dcap) - m);
        l += e;
        pdp += (double)e * dot_rows(gr, vr);
    }
    float st[3];
    put_stats(st, m, l, pdp);
    if ((threadIdx.x & 31) == 0)
        for (int u = 0; u < 3; u++) a.stats[((size_t)i * a.n_heads + h) * 3 + u] = st[u];
#pragma unroll
    for (int k = 0; k < ND; k++) acc[k] = 0;
    for (int t = first; t < seen; t++) {
        load_row(kr, kh + t * kv_stride, hd);
        load_row(vr, vh + t * kv_stride, hd);
        const float s = score_of(a, dot_rows(qr, kr), h, p, t, &dcap);
        float pr;
        const float g = pair_ds(st, s, dot_rows(gr, vr), &pr) * dcap * a.scale;
#pragma unroll
        for (int k = 0; k < ND; k++) acc[k] += g * kr[k];
    }
    store_row(a.dq + qo, acc, hd);
}

// Each head's sums start from 0 and are added to dk and dv in head order, as the CPU adds them.
template <int ND>
__global__ void __launch_bounds__(BWD_WARPS * 32) attn_bwd_keys_kernel(attn_bwd_args a) {
    const int t = blockIdx.x * BWD_WARPS + (threadIdx.x >> 5), g = blockIdx.y, hd = a.head_dim;
    if (t >= a.nk) return;
    const size_t ko = ((size_t)t * a.n_kv_heads + g) * hd;
    float kr[ND], vr[ND], qr[ND], gr[ND], dk[ND], dv[ND], hk[ND], hv[ND], dcap;
    load_row(kr, a.k + ko, hd);
    load_row(vr, a.v + ko, hd);
    load_row(dk, a.dk + ko, hd);
    load_row(dv, a.dv + ko, hd);
    for (int h = g * a.group; h < (g + 1) * a.group; h++) {
#pragma unroll
        for (int k = 0; k < ND; k++) hk[k] = hv[k] = 0;
        for (int i = 0; i < a.n; i++) {
            const int p = qlm_ints_at(a.pos, i);
            if (!sees_key(a, p, t)) continue;
            load_q_dout(qr, gr, a, i, h);
            const float s = score_of(a, dot_rows(qr, kr), h, p, t, &dcap);
            float pr;
            const float gs = pair_ds(a.stats + ((size_t)i * a.n_heads + h) * 3, s, dot_rows(gr, vr), &pr) * dcap * a.scale;
#pragma unroll
            for (int k = 0; k < ND; k++) {
                hk[k] += gs * qr[k];
                hv[k] += pr * gr[k];
            }
        }
#pragma unroll
        for (int k = 0; k < ND; k++) {
            dk[k] += hk[k];
            dv[k] += hv[k];
        }
    }
    store_row(a.dk + ko, dk, hd);
    store_row(a.dv + ko, dv, hd);
}

// Bias index j of head h is used by row i's key t = j + pos[i] - offset; dS before the cap's
// derivative and the scale, summed in row order as the CPU sums it.
template <int ND>
__global__ void __launch_bounds__(BWD_WARPS * 32) attn_bwd_bias_kernel(attn_bwd_args a) {
    const int j = blockIdx.x * BWD_WARPS + (threadIdx.x >> 5), h = blockIdx.y, hd = a.head_dim;
    if (j >= a.span) return;
    const size_t kv_stride = (size_t)a.n_kv_heads * hd;
    const float *kh = a.k + (size_t)(h / a.group) * hd, *vh = a.v + (size_t)(h / a.group) * hd;
    float qr[ND], gr[ND], kr[ND], vr[ND], dcap, sum = 0;
    for (int i = 0; i < a.n; i++) {
        const int p = qlm_ints_at(a.pos, i), t = j + p - a.offset;
        if (!sees_key(a, p, t)) continue;
        load_q_dout(qr, gr, a, i, h);
        load_row(kr, kh + t * kv_stride, hd);
        load_row(vr, vh + t * kv_stride, hd);
        const float s = score_of(a, dot_rows(qr, kr), h, p, t, &dcap);
        float pr;
        sum += pair_ds(a.stats + ((size_t)i * a.n_heads + h) * 3, s, dot_rows(gr, vr), &pr);
    }
    if ((threadIdx.x & 31) == 0) a.dbias[(size_t)h * a.span + j] += sum;
}

static void launch_warps(const attn_bwd_args &a) {
    enum { ND = BWD_MAX_HEAD_DIM / 32 };
    attn_bwd_rows_kernel<ND><<<dim3(qlm_cuda_blocks(a.n, BWD_WARPS), a.n_heads), BWD_WARPS * 32, 0, qlm_cuda_stream>>>(a);
    LAUNCH_CHECK();
    attn_bwd_keys_kernel<ND>
        <<<dim3(qlm_cuda_blocks(a.nk, BWD_WARPS), a.n_kv_heads), BWD_WARPS * 32, 0, qlm_cuda_stream>>>(a);
    if (!a.dbias) return;
    LAUNCH_CHECK();
    attn_bwd_bias_kernel<ND><<<dim3(qlm_cuda_blocks(a.span, BWD_WARPS), a.n_heads), BWD_WARPS * 32, 0, qlm_cuda_stream>>>(a);
}

static void launch_attention_backward(const void *p) {
    const attn_bwd_args &a = *(const attn_bwd_args *)p;
    if (a.head_dim <= 64)
        launch_tiled<64, 64>(a);
    else if (a.head_dim <= BWD_TILED_HEAD_DIM)
        launch_tiled<128, 32>(a);
    else
        launch_warps(a);
}

// Training attends over one sequence's F32 keys as the layers computed them; the decode caches'
// forms are the forward's alone. What of the shape the backward does not take, or NULL.
static const char *unsupported(const qlm_attn_shape *sh) {
    const size_t kv_stride = (size_t)sh->n_kv_heads * sh->head_dim;
    if (sh->head_dim > BWD_MAX_HEAD_DIM) return "head_dim over 256 is not supported";
    if (sh->slots) return "slots are not supported";
    if (sh->ring) return "rolling caches are not supported";
    if (sh->heads_packed) return "packed heads are not supported";
    if ((sh->row_stride && sh->row_stride != kv_stride) || (sh->head_stride && sh->head_stride != (size_t)sh->head_dim))
        return "strided caches are not supported";
    if (sh->kv_dtype != QLM_F32) return "caches other than F32 are not supported";
    return NULL;
}

static void *g_scratch;
static size_t g_scratch_cap;

// Carves bytes (rounded up to 256) off *at.
static size_t carve(size_t *at, size_t bytes) {
    const size_t off = *at;
    *at += (bytes + 255) & ~(size_t)255;
    return off;
}

int qlm_cuda_attention_backward(float *dq, float *dk, float *dv, float *dpos_bias, const float *dout, const float *q,
                                const float *k, const float *v, int n, const int *pos, const qlm_attn_shape *sh) {
    if (n <= 0) return 0;
    const int hd = sh->head_dim;
    const char *why = unsupported(sh);
    if (why) qlm_cuda_fail("attention_backward", why, __FILE__, __LINE__);
    attn_bwd_args a;
    memset(&a, 0, sizeof a);
    a.dq = dq, a.dk = dk, a.dv = dv, a.dout = dout, a.q = q, a.k = k, a.v = v;
    a.n = n;
    a.pos = qlm_cuda_ints_of(pos, n, 0);
    // The key count: the fixed one, or the causal rows' furthest reach.
    a.nk = sh->n_keys > 0 ? sh->n_keys : 0;
    for (int i = 0; i < n && sh->n_keys <= 0; i++)
        if (pos[i] + 1 > a.nk) a.nk = pos[i] + 1;
    a.n_heads = sh->n_heads;
    a.n_kv_heads = sh->n_kv_heads;
    a.group = sh->n_heads / sh->n_kv_heads;
    a.head_dim = hd;
    a.n_keys = sh->n_keys;
    a.window = sh->window;
    a.scale = sh->scale;
    a.softcap = sh->softcap;
    a.bias = sh->pos_bias;
    a.span = sh->pos_bias_span;
    a.offset = sh->pos_bias_offset;
    a.dbias = sh->pos_bias_span > 0 ? dpos_bias : NULL;
    const size_t rows = (size_t)n * sh->n_heads;
    size_t bytes = 0, at_stats = carve(&bytes, rows * 3 * sizeof(float)), at_part_stats = 0, at_q = 0, at_k = 0,
           at_v = 0, at_bias = 0;
    if (hd <= BWD_TILED_HEAD_DIM) {
        // Chunks: enough that a block's share of the longest rows (keys) is at most about half of
        // what one SM has to do, so that the longest blocks, started first, end with the rest:
        // blocks of 32 rows over all keys, tiles * n_heads of them over sms, would make the longest
        // about 2 sms / (tiles * n_heads) times an SM's share.
        static int sms;
        if (!sms) CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, qlm_cuda_device));
        const int longest = n > a.nk ? n : a.nk, tiles = (longest + OWN - 1) / OWN;
        int chunks = (int)((4L * sms + (long)tiles * sh->n_heads - 1) / ((long)tiles * sh->n_heads));
        chunks = chunks < 1 ? 1 : chunks > MAX_CHUNKS ? MAX_CHUNKS : chunks;
        const int per = (longest + chunks - 1) / chunks;
        a.chunk = (per + CHUNK_UNIT - 1) / CHUNK_UNIT * CHUNK_UNIT;
        a.chunks_k = (a.nk + a.chunk - 1) / a.chunk;
        a.chunks_r = (n + a.chunk - 1) / a.chunk;
        a.vec = hd % 4 == 0 && (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)dout) & 15) == 0;
        const size_t kv_part = (size_t)sh->n_heads * a.chunks_r * a.nk * hd * sizeof(float);
        if (a.chunks_k > 1) {
            at_part_stats = carve(&bytes, (size_t)a.chunks_k * rows * 3 * sizeof(double));
            at_q = carve(&bytes, (size_t)a.chunks_k * rows * hd * sizeof(float));
        }
        at_k = carve(&bytes, kv_part);
        at_v = carve(&bytes, kv_part);
        if (a.dbias)
            at_bias = carve(&bytes, (size_t)(n + OWN - 1) / OWN * a.chunks_k * sh->n_heads * a.span * sizeof(float));
    }
    char *scratch = (char *)qlm_cuda_scratch(&g_scratch, &g_scratch_cap, bytes);
    a.stats = (float *)(scratch + at_stats);
    if (hd <= BWD_TILED_HEAD_DIM) {
        if (a.chunks_k > 1) a.part_stats = (double *)(scratch + at_part_stats), a.part_q = (float *)(scratch + at_q);
        a.part_k = (float *)(scratch + at_k);
        a.part_v = (float *)(scratch + at_v);
        if (a.dbias) a.part_bias = (float *)(scratch + at_bias);
    }
    qlm_cuda_submit("attention_backward", launch_attention_backward, &a, sizeof a);
    return 0;
}
