// y = x W^T on the GPU. Up to GEMV_MAX_ROWS rows of x (decode) take one GEMV launch, which also
// serves a whole matmul_group, streaming the weights once in their storage dtype. More rows
// (prefill, batches) go through cuBLAS: F32 weights as SGEMM (no TF32), BF16 as a BF16 GEMM with x
// rounded to BF16 and F32 accumulation, INT8 as an integer GEMM against x in the I16 form (as the
// GEMV and the CPU take it: the same outputs bit for bit; launch_gemm_i8), F16 widened to F32 for
// SGEMM (F16 x could overflow on T5).
//
// The GEMV is bound by weight bytes, but a 2048-row matrix is only ~60 KB per SM: unless an SM has
// its whole share of loads in flight at once, the time goes to memory latency. So a block of
// GEMV_WARPS (16) warps takes a tile of 16 rows (each part of a group starts a tile) and gives each
// warp a contiguous range of the columns (split-K inside the block: 2048 rows are 128 blocks, each
// with its 64 KB of BF16 in flight at once; 576 rows still issue every load at once). Lane
// (g, t) = (lane / 4, lane % 4) loads 16 bytes of rows g and g + 8 per 64-byte step, GEMV_STEPS
// steps before using any. BF16 weights: the loaded registers are the tensor cores' A fragment as
// they are, with the rows of x as the 8 columns of B, so a row's result does not depend on n; that
// k runs in another order than in memory does not matter to a dot product, as long as A and B
// share it. mma m16n8k16 against x rounded to BF16, F32 sums; the warp loads x coalesced and
// shuffles it to the lanes that need it (xshare), so that for one row of x the kernel fits 64
// registers and two blocks share an SM (a 2560-row q+k+v group, 160 tiles, runs in one wave).
// INT8 weights: mma m16n8k32 on the bytes as stored, which are B's fragments as loaded (8 rows an
// mma), against x in the I16 form as A, as the CPU takes it (quant/x_int_form.h: per row of x,
// q = round(x / s), |q| <= 32767, s = max|x| / 32767, found by each block in a pass over x first),
// its high bytes and its low bytes in one mma, laid out by each warp in shared memory as the
// fragments want them (tile_imma): the sums are exact, so INT8 decode gives the CPU's scalar
// reference bit for bit, and no weight is converted and no register moved to make a fragment (the
// old BF16 conversion spent 2.5 instructions a byte and ran at 36-44% of the bandwidth; shuffling
// x to the lanes and moving the weight registers into A fragments took ~292 instructions a warp's
// 4 KB batch, this ~216). F32 and F16 weights (x stays F32 for them) and widths that do not fill
// 16-byte vectors take FMA loops with the same lane layout (INT8 there in int64 against the I16
// form: the same sums). Each warp's 16x8 partial sums meet in shared memory and
// are added in warp order (the same bits for any n and in any group), then scaled (INT8: by x's
// scale, then the weight's, as the CPU) and biased.
#include <string.h>

#include "cuda_internal.h"
#include "../quant/x_int_form.h"

enum { GEMV_MAX_ROWS = 8, GEMV_WARPS = 16, GEMV_TILE = 16, GEMV_STEPS = 4, GROUP_MAX = 4 };
// INT8 rows longer than this go to cuBLAS: a warp's int32 sums of 1/16 of them stay exact (a
// weight byte times a byte of x's I16 form, both signed, is at most 2^14; 2^16 of them 2^30).
enum { GEMV_I8_MAX_COLS = 1 << 20 };

struct gemv_part {
    const void *w;
    float *y;
    const float *bias, *row_scales;
    float scale;
    int rows, add; // add: y += the product
    // A tile's 16 rows are two runs of 8, pair rows apart: 8, or half a head where the outputs are
    // rotated (rope: q and k under a kv step), so that each rotated pair meets in one tile.
    int pair, rope;
    void *cache; // the kv step's cache this part's outputs also go to (NULL: none)
};

// How the kernel forms x from its inputs (qlm_x_step): as given, or by the step's op as it loads.
enum { X_GIVEN, X_RMSNORM, X_GLU };

// The steps of a warp's first batch that an mma kernel with something before its products (a norm's
// sums of squares, INT8's pass for x's scales, the wait for the kernel before under PDL) loads
// first: as many as a 2048-column warp has, in 16 registers (more spill where one row of x leaves
// 64 a thread, and so does a GLU's activation).
enum { GEMV_PRELOAD = 2 };
template <int DT, bool VEC, int FORM, bool PDL> __host__ __device__ constexpr int gemv_preload() {
    const bool mma = VEC && (DT == QLM_BF16 || DT == QLM_I8);
    return mma && FORM != X_GLU && (FORM == X_RMSNORM || DT == QLM_I8 || PDL) ? GEMV_PRELOAD : 0;
}

struct gemv_args {
    gemv_part part[GROUP_MAX];
    int tile0[GROUP_MAX + 1]; // first tile (block) of each part; tile0[count] tiles in all
    int count, cols, vec;     // vec: every row starts 16-byte aligned and cols fills whole vectors
    int pdl;                  // launched to overlap the kernel before it (qlm_cuda_pdl)
    int dtype, n;
    int form, act;            // X_*, and the GLU's activation
    float eps;                // X_RMSNORM's
    const float *x;           // x as given, RMSNORM's input, or the GLU's gate
    const float *up, *norm;   // the GLU's up; RMSNORM's weight
    float *x_out;             // the formed x, which the first block writes (X_RMSNORM, X_GLU)
    // The kv step after q, k and v (parts with rope or a cache): RoPE at rope_pos, frequencies
    // inv_freq, heads of head_dim; the caches' layout and positions.
    qlm_cuda_ints rope_pos;
    const float *inv_freq;
    int head_dim;
    qlm_kv_dst kv;
};

// A weight dtype's bytes per value, and what a tile's partial sums are: F32, or for INT8 the exact
// integer sums against x's I16 form.
template <int DT> struct wtraits;
template <> struct wtraits<QLM_F32> { static constexpr int size = 4; using sum = float; };
template <> struct wtraits<QLM_F16> { static constexpr int size = 2; using sum = float; };
template <> struct wtraits<QLM_BF16> { static constexpr int size = 2; using sum = float; };
template <> struct wtraits<QLM_I8> { static constexpr int size = 1; using sum = long long; };

template <int DT> __device__ __forceinline__ float w_scalar(const void *row, int c) {
    if (DT == QLM_F32) return ((const float *)row)[c];
    if (DT == QLM_F16) return __half2float(((const __half *)row)[c]);
    if (DT == QLM_BF16) return qlm_bf16_to_f32(((const unsigned short *)row)[c]);
    return (float)((const signed char *)row)[c];
}

// 16 bytes of F32 or F16 weights as floats (4 or 8 of them).
template <int DT> __device__ __forceinline__ void w_unpack(uint4 raw, float *f) {
    const unsigned u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (DT == QLM_F32) {
            f[k] = __uint_as_float(u[k]);
        } else {
            const float2 v = __half22float2(*reinterpret_cast<const __half2 *>(&u[k]));
            f[2 * k] = v.x;
            f[2 * k + 1] = v.y;
        }
    }
}

// Weights are read once: streaming (evict-first, as __ldcs), with L2 fetching whole 256-byte
// blocks from memory, where ok; elsewhere nothing is read and v keeps what it held. Volatile keeps
// the loads in program order, ahead of their use.
__device__ __forceinline__ void ld_weights_if(uint4 &v, const char *p, bool ok) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
                 " @p ld.global.cs.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
                 : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
                 : "l"(p), "r"((int)ok));
}

// The 128-byte line at p towards L2, holding no register.
__device__ __forceinline__ void prefetch_l2(const char *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// 4 bytes from global to shared memory without holding a register; cp.async.wait_all waits.
__device__ __forceinline__ void cp_async4(float *dst, const float *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}

// lo and hi rounded to BF16 (nearest even), lo in the low half.
__device__ __forceinline__ unsigned bf16x2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned *>(&h);
}

// c (16x8, F32) += A (16x16) B (16x8), BF16 operands: a0 and a2 from row g, a1 and a3 from row
// g + 8, each pair's k matching b0 (a0, a1) and b1 (a2, a3); c0, c1 row g, c2, c3 row g + 8, at
// columns 2t and 2t + 1. The mma sums its 16 products from zero and the result joins c in an F32
// add, so that the running sum is carried by IEEE adds whatever the tensor cores keep of it.
__device__ __forceinline__ void mma_bf16(float c[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
    float d[4];
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %10, %10, %10};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
#pragma unroll
    for (int k = 0; k < 4; k++) c[k] += d[k];
}

// c (16x8, int32) += A (16x32, INT8) B (32x8, INT8), both signed: a0 and a2 from row g, a1 and a3
// from row g + 8 (a.x .. a.w), each pair's k matching b0 (a0, a1) and b1 (a2, a3). Integer sums:
// exact, in any order.
__device__ __forceinline__ void mma_i8(int c[4], uint4 a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// x in the I16 form (quant/x_int_form.h), as the CPU's quantize_i16 makes it: round(x * inv), 0
// where inv is 0 (its row holds a value that is not finite, or all of it is below 1e-30).
__device__ __forceinline__ int i16_of(float x, float inv) { return inv == 0 ? 0 : __float2int_rn(__fmul_rn(x, inv)); }

// Four values of x in the I16 form as the bytes the integer mma takes: their high bytes, then their
// low bytes less 128 (q = 256 hi + lo, lo in 0 .. 255), both signed.
__device__ __forceinline__ uint2 i16_bytes(float4 v, float inv) {
    const unsigned p01 = __byte_perm(i16_of(v.x, inv), i16_of(v.y, inv), 0x5410);
    const unsigned p23 = __byte_perm(i16_of(v.z, inv), i16_of(v.w, inv), 0x5410);
    return make_uint2(__byte_perm(p01, p23, 0x7531), __byte_perm(p01, p23, 0x6420) ^ 0x80808080u);
}

// Lane t's vector of steps s + FROM .. s + TO - 1 of rows wa and wb, all loads issued before any
// is used. Steps past s1 are not loaded (their registers keep what they held: the loops stop before
// them). A lane past the row's nvec vectors, where x is 0, reads the row's last vector again for
// INT8 (adding 0 exactly, no register zeroed) and gets zero weights for BF16, whose tensor-core
// products it joins: an infinite weight times x's 0 would turn the row's infinite sum into NaN.
template <int DT, int FROM = 0, int TO = GEMV_STEPS>
__device__ __forceinline__ void load_steps(uint4 (&ra)[GEMV_STEPS], uint4 (&rb)[GEMV_STEPS], const char *wa,
                                           const char *wb, int s, int s1, int t, int nvec) {
#pragma unroll
    for (int u = FROM; u < TO; u++) {
        const int v = (s + u) * 4 + t;
        if constexpr (DT == QLM_BF16) {
            ld_weights_if(ra[u], wa + (size_t)v * 16, s + u < s1 && v < nvec);
            ld_weights_if(rb[u], wb + (size_t)v * 16, s + u < s1 && v < nvec);
            if (v >= nvec) ra[u] = rb[u] = make_uint4(0, 0, 0, 0);
        } else {
            const size_t last = (size_t)min(v, nvec - 1);
            ld_weights_if(ra[u], wa + last * 16, s + u < s1);
            ld_weights_if(rb[u], wb + last * 16, s + u < s1);
        }
    }
}

// The batch of steps from s: whole, but for the warp's first (s0), whose first PRE steps the kernel
// loaded first thing (gemv_preload).
template <int DT, int PRE>
__device__ __forceinline__ void load_batch(uint4 (&ra)[GEMV_STEPS], uint4 (&rb)[GEMV_STEPS], const char *wa,
                                           const char *wb, int s, int s0, int s1, int t, int nvec) {
    if (PRE == 0 || s != s0)
        load_steps<DT>(ra, rb, wa, wb, s, s1, t, nvec);
    else
        load_steps<DT, PRE>(ra, rb, wa, wb, s, s1, t, nvec);
}

// Where a GEMV's x comes from: x as given, or formed as it is loaded from the step's inputs, the
// same float4 the step's own kernel would have written (rmsnorm_kernel: a * inv * weight; glu_kernel:
// act(gate) * up, or act(gate) without an up), which the first block also stores for what reads x
// next.
template <int FORM> struct x_source {
    const float *x, *up, *norm;
    const float *inv; // RMSNORM: 1 / rms of each row of x, in shared memory
    float *out;       // NULL but in the block that stores the formed x
    qlm_act act;

    // x row `row`, columns col .. col + 3, at off = row * cols + col.
    __device__ __forceinline__ float4 load(size_t off, int col, int row) const {
        float4 v = __ldg((const float4 *)(x + off));
        if (FORM == X_RMSNORM) {
            const float4 w = __ldg((const float4 *)(norm + col));
            const float r = inv[row];
            v = make_float4(v.x * r * w.x, v.y * r * w.y, v.z * r * w.z, v.w * r * w.w);
        } else if (FORM == X_GLU) {
            v = make_float4(qlm_act_of(v.x, act), qlm_act_of(v.y, act), qlm_act_of(v.z, act), qlm_act_of(v.w, act));
            if (up) {
                const float4 u = __ldg((const float4 *)(up + off));
                v = make_float4(v.x * u.x, v.y * u.y, v.z * u.z, v.w * u.w);
            }
        }
        if (FORM != X_GIVEN && out) *(float4 *)(out + off) = v;
        return v;
    }
};

// Per batch of GEMV_STEPS steps, a warp's mma need the batch's columns of NR rows of x (NR: n
// rounded up to a power of 2), lane (g, t) those of row g for its vectors, 4 columns a round (Q
// rounds a 16-byte vector of weights). The warp loads them spread evenly, SLOTS float4 a lane, and
// passes each to the lane that needs it by shuffles: for n = 1, one coalesced load a lane instead
// of eight in four lanes, so that 64 registers hold every weight load of the batch and two blocks
// fit on an SM. Round r of lane d = 4 g + t < 4 NR takes slot r / RPS of lane (r % RPS) 4 NR + d:
// x row g, columns 4q .. 4q + 3 of its vector (s + u) 4 + t (r = u Q + q). So slot k of a lane
// holds what lane d = lane % 4 NR needs in round r = k RPS + lane / 4 NR.
template <int NR> struct xshare {
    static constexpr int V = 8;                      // BF16 columns per vector
    static constexpr int Q = V / 4;                  // rounds per vector
    static constexpr int ROUNDS = GEMV_STEPS * Q;    // rounds per batch
    static constexpr int RPS = 8 / NR;               // rounds that take their x from one slot
    static constexpr int SLOTS = ROUNDS / RPS;       // float4 of x each lane loads per batch

    int off[SLOTS], col[SLOTS], step[SLOTS], vec[SLOTS], row[SLOTS];

    __device__ __forceinline__ xshare(int lane, int cols) {
#pragma unroll
        for (int k = 0; k < SLOTS; k++) {
            const int r = k * RPS + lane / (4 * NR), d = lane % (4 * NR), u = r / Q, q = r % Q;
            step[k] = u;
            vec[k] = u * 4 + (d & 3); // relative to the batch's first vector, 4 s
            row[k] = d / 4;
            col[k] = vec[k] * V + 4 * q;
            off[k] = row[k] * cols + col[k];
        }
    }
    // Slot k of the batch at step s: zero wherever the weights are (past the warp's steps or the
    // row) and for rows of x past n.
    template <int FORM>
    __device__ __forceinline__ float4 load(const x_source<FORM> &x, int k, int s, int s1, int nvec, int n) const {
        const bool ok = row[k] < n && s + step[k] < s1 && s * 4 + vec[k] < nvec;
        const int batch_col = s * 4 * V;
        return ok ? x.load((size_t)batch_col + off[k], batch_col + col[k], row[k]) : make_float4(0, 0, 0, 0);
    }
    // Where this lane finds round r's x: the slot, and the lane holding it.
    static __device__ __forceinline__ int slot(int r) { return r / RPS; }
    static __device__ __forceinline__ int source(int r, int lane) { return ((r % RPS) * 4 * NR + lane) & 31; }
};

// BF16 weights, whole vectors: the warp's steps [s0, s1) of rows wa (g) and wb (g + 8) against rows
// 0 .. n - 1 of x rounded to BF16, on the tensor cores; ra and rb hold the first batch's first PRE
// steps, loaded first thing (gemv_preload).
template <int NR, int FORM, int PRE>
__device__ __forceinline__ void tile_mma(float c[4], uint4 (&ra)[GEMV_STEPS], uint4 (&rb)[GEMV_STEPS], const char *wa,
                                         const char *wb, const x_source<FORM> &x, int n, int cols, int nvec, int s0,
                                         int s1, int lane) {
    using X = xshare<NR>;
    const X xs(lane, cols);
    const int t = lane & 3;
    c[0] = c[1] = c[2] = c[3] = 0;
    for (int s = s0; s < s1; s += GEMV_STEPS) {
        load_batch<QLM_BF16, PRE>(ra, rb, wa, wb, s, s0, s1, t, nvec);
        unsigned px[X::SLOTS][2];
#pragma unroll
        for (int k = 0; k < X::SLOTS; k++) {
            const float4 xv = xs.load(x, k, s, s1, nvec, n);
            px[k][0] = bf16x2(xv.x, xv.y);
            px[k][1] = bf16x2(xv.z, xv.w);
        }
#pragma unroll
        for (int u = 0; u < GEMV_STEPS; u++) {
            if (s + u >= s1) break; // the warp's last batch (the same for all its lanes)
            const unsigned a[4] = {ra[u].x, ra[u].y, ra[u].z, ra[u].w}, b[4] = {rb[u].x, rb[u].y, rb[u].z, rb[u].w};
            // Each mma takes 4 of the vector's columns: x's 4 values there and the weights'.
#pragma unroll
            for (int q = 0; q < X::Q; q++) {
                const int r = u * X::Q + q, k = X::slot(r), src = X::source(r, lane);
                // Lanes past 4 NR get some other lane's x: columns NR.. of B, whose sums are never stored.
                const unsigned x0 = __shfl_sync(0xffffffffu, px[k][0], src);
                const unsigned x1 = __shfl_sync(0xffffffffu, px[k][1], src);
                mma_bf16(c, a[2 * q], b[2 * q], a[2 * q + 1], b[2 * q + 1], x0, x1);
            }
        }
    }
}

// max(m, |v|), infinite once v is not a number.
__device__ __forceinline__ float absmax_of(float m, float v) { return v == v ? fmaxf(m, fabsf(v)) : INFINITY; }

// The I16 form's factor inv[j] and scale[j] of rows j < n of x as the source forms them (the
// largest |x| of each whole row, found by the whole block; non-finite x makes it infinite, which
// qlm_x_int_scale turns into NaN products), whole vectors when VEC (the source forms x then; the
// block that writes the formed x writes it here).
template <bool VEC, int FORM>
__device__ __forceinline__ void rows_i16_scales(float *inv, float *scale, const x_source<FORM> &x, int n, int cols) {
    __shared__ float warp_max[GEMV_MAX_ROWS][GEMV_WARPS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int j = 0; j < n; j++) {
        float m = 0;
        if constexpr (VEC) {
            for (int c = 4 * (int)threadIdx.x; c < cols; c += 4 * GEMV_WARPS * 32) {
                const float4 v = x.load((size_t)j * cols + c, c, j);
                m = absmax_of(absmax_of(absmax_of(absmax_of(m, v.x), v.y), v.z), v.w);
            }
        } else {
            for (int c = threadIdx.x; c < cols; c += GEMV_WARPS * 32) m = absmax_of(m, x.x[(size_t)j * cols + c]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0) warp_max[j][warp] = m;
    }
    __syncthreads();
    if (threadIdx.x < n) {
        float m = 0;
        for (int w = 0; w < GEMV_WARPS; w++) m = fmaxf(m, warp_max[threadIdx.x][w]);
        scale[threadIdx.x] = qlm_x_int_scale(m, 0, QLM_I16_MAX, &inv[threadIdx.x]);
    }
    __syncthreads();
}

// The integer GEMV's x: each warp writes x's bytes for I8_IMAGE_STEPS steps at a time into an image
// of its own in shared memory, a row of I8_IMAGE_STRIDE bytes for each row of x and one for the mask
// (1 for a valid column, as high bytes; 0 as low bytes), a 32-byte record a step and vector t: for
// each 4 columns, their 4 high bytes then 4 low bytes less 128. So lane (g, t)'s two 16-byte reads
// of its record are its A fragments of the step as they are. 16 bytes more than a row's records put
// the next row on other banks.
enum { I8_IMAGE_STEPS = 2, I8_IMAGE_STRIDE = I8_IMAGE_STEPS * 4 * 32 + 16 };
template <int NR> __host__ __device__ constexpr int i8_image_bytes() {
    return GEMV_WARPS * (NR + 1) * I8_IMAGE_STRIDE;
}

// INT8 weights, whole vectors: the warp's steps [s0, s1) of rows wa (g) and wb (g + 8) against rows
// 0 .. n - 1 of x in the I16 form (inv: each row's factor) on the integer tensor cores, exactly: c
// gets x row g's sums of tile rows 2t, 2t + 1, 8 + 2t and 9 + 2t. The weights are the mma's B as
// loaded (a lane's 16 bytes of a row are two B fragments; an mma takes 8 rows of the tile) and x is
// A: A row j holds x row j's high bytes and A row j + 8 its low bytes less 128 (image: the warp's,
// above), both signed, so one mma takes both halves of q and no register is moved to make a
// fragment. The 128 taken off each low byte comes back as 128 times each weight row's sum over the
// valid columns, an mma's product with the mask: A row 7 where x has at most 4 rows, else a second
// mma. sum w q = 256 hi + lo' + 128 sum w, each int32 exact within a warp's share of the columns
// (GEMV_I8_MAX_COLS), added in int64. ra and rb hold the first batch's first PRE steps, loaded
// first thing (gemv_preload).
template <int NR, int FORM, int PRE>
__device__ __forceinline__ void tile_imma(long long c[4], unsigned char *image, uint4 (&ra)[GEMV_STEPS],
                                          uint4 (&rb)[GEMV_STEPS], const char *wa, const char *wb,
                                          const x_source<FORM> &x, const float *inv, int n, int cols, int nvec, int s0,
                                          int s1, int lane) {
    constexpr int MASK = NR;            // the image's mask row
    constexpr bool MASK_IN_A = NR <= 4; // A row 7 is free for it
    static_assert(I8_IMAGE_STEPS * 16 == 32, "a lane's 4 columns of x a step");
    const int g = lane >> 2, t = lane & 3;
    // Lanes of rows past n read row 0: their sums are never stored.
    const int row = g < n ? g : MASK_IN_A && g == 7 ? MASK : 0;
    const unsigned char *mine = image + row * I8_IMAGE_STRIDE + t * 32;
    const unsigned char *mask = image + MASK * I8_IMAGE_STRIDE + t * 32;
    int da[4] = {0, 0, 0, 0}, db[4] = {0, 0, 0, 0}, wsa[4] = {0, 0, 0, 0}, wsb[4] = {0, 0, 0, 0};
    for (int s = s0; s < s1; s += GEMV_STEPS) {
        load_batch<QLM_I8, PRE>(ra, rb, wa, wb, s, s0, s1, t, nvec);
#pragma unroll
        for (int h = 0; h < GEMV_STEPS; h += I8_IMAGE_STEPS) {
            const int sh = s + h;
            if (sh >= s1) break; // the warp's last batch (the same for all its lanes)
            // Lane L forms columns 4 L .. 4 L + 3 of these steps: step L / 16, vector L / 4 % 4.
            const int col = sh * 64 + 4 * lane;
            const bool ok = col < cols && sh + lane / 16 < s1;
            const int at = ok ? col : 0;
#pragma unroll
            for (int j = 0; j < NR; j++) {
                if (j >= n) break;
                const uint2 v = i16_bytes(x.load((size_t)j * cols + at, at, j), inv[j]);
                *(uint2 *)(image + j * I8_IMAGE_STRIDE + 8 * lane) = ok ? v : make_uint2(0, 0);
            }
            *(uint2 *)(image + MASK * I8_IMAGE_STRIDE + 8 * lane) = make_uint2(ok ? 0x01010101u : 0, 0);
            __syncwarp();
#pragma unroll
            for (int u = 0; u < I8_IMAGE_STEPS; u++) {
                const uint4 wr = ra[h + u], wr8 = rb[h + u];
                const uint4 a0 = *(const uint4 *)(mine + u * 128), a1 = *(const uint4 *)(mine + u * 128 + 16);
                mma_i8(da, a0, wr.x, wr.y);
                mma_i8(db, a0, wr8.x, wr8.y);
                mma_i8(da, a1, wr.z, wr.w);
                mma_i8(db, a1, wr8.z, wr8.w);
                if constexpr (!MASK_IN_A) {
                    const uint4 m0 = *(const uint4 *)(mask + u * 128), m1 = *(const uint4 *)(mask + u * 128 + 16);
                    mma_i8(wsa, m0, wr.x, wr.y);
                    mma_i8(wsb, m0, wr8.x, wr8.y);
                    mma_i8(wsa, m1, wr.z, wr.w);
                    mma_i8(wsb, m1, wr8.z, wr8.w);
                }
            }
            __syncwarp(); // before the next steps' x overwrites these
        }
    }
    // Lane (g, t) holds x row g's sums of tile rows 2t + e (da) and 8 + 2t + e (db): the high bytes'
    // in [e], the low bytes' in [2 + e]; the weight rows' sums are lane (7, t)'s [e], or wsa / wsb's.
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int sa = MASK_IN_A ? __shfl_sync(0xffffffffu, da[e], 28 + t) : wsa[e];
        const int sb = MASK_IN_A ? __shfl_sync(0xffffffffu, db[e], 28 + t) : wsb[e];
        c[e] = 256 * (long long)da[e] + da[2 + e] + 128 * (long long)sa;
        c[2 + e] = 256 * (long long)db[e] + db[2 + e] + 128 * (long long)sb;
    }
}

// Any dtype with F32 FMAs (x rounded to BF16 for BF16 weights), but INT8 with exact int64 sums
// against x's I16 form (inv: each row's factor; only where the rows fill no vectors): steps
// [s0, s1) of rows wa and wb against the n rows of x, 16 bytes per lane and step when vec, else one
// column. The four lanes of a row then split its sums so that c has tile_mma's layout.
template <int DT, bool VEC>
__device__ __forceinline__ void tile_fma(typename wtraits<DT>::sum c[4], const char *wa, const char *wb, const float *x,
                                         const float *inv, int n, int cols, int nvec, int s0, int s1, int t) {
    using T = typename wtraits<DT>::sum;
    static_assert(DT != QLM_I8 || !VEC, "INT8 vectors go to tile_imma");
    T acc[2 * GEMV_MAX_ROWS]; // [j] row g, [GEMV_MAX_ROWS + j] row g + 8, against row j of x
#pragma unroll
    for (int j = 0; j < 2 * GEMV_MAX_ROWS; j++) acc[j] = 0;
    if constexpr (VEC) {
        constexpr int U = GEMV_STEPS, V = 16 / wtraits<DT>::size;
        uint4 ra[U] = {}, rb[U] = {};
        for (int s = s0; s < s1; s += U) {
            load_steps<DT>(ra, rb, wa, wb, s, s1, t, nvec);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int v = (s + u) * 4 + t;
                if (s + u >= s1 || v >= nvec) break;
                float fa[V], fb[V];
                w_unpack<DT>(ra[u], fa);
                w_unpack<DT>(rb[u], fb);
#pragma unroll
                for (int j = 0; j < GEMV_MAX_ROWS; j++) {
                    if (j >= n) break;
                    const float4 *xr = (const float4 *)(x + (size_t)j * cols + (size_t)v * V);
#pragma unroll
                    for (int q = 0; q < V / 4; q++) {
                        const float4 xv = __ldg(xr + q);
                        const float xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            acc[j] = fmaf(fa[4 * q + e], xs[e], acc[j]);
                            acc[GEMV_MAX_ROWS + j] = fmaf(fb[4 * q + e], xs[e], acc[GEMV_MAX_ROWS + j]);
                        }
                    }
                }
            }
        }
    } else {
#pragma unroll 4
        for (int s = s0; s < s1; s++) {
            const int col = s * 4 + t;
            if (col >= cols) continue;
#pragma unroll
            for (int j = 0; j < GEMV_MAX_ROWS; j++) {
                if (j >= n) break;
                const float xv = x[(size_t)j * cols + col];
                if constexpr (DT == QLM_I8) {
                    const long long q = i16_of(xv, inv[j]);
                    acc[j] += ((const signed char *)wa)[col] * q;
                    acc[GEMV_MAX_ROWS + j] += ((const signed char *)wb)[col] * q;
                } else {
                    const float xr = DT == QLM_BF16 ? qlm_bf16_round(xv) : xv;
                    acc[j] = fmaf(w_scalar<DT>(wa, col), xr, acc[j]);
                    acc[GEMV_MAX_ROWS + j] = fmaf(w_scalar<DT>(wb, col), xr, acc[GEMV_MAX_ROWS + j]);
                }
            }
        }
    }
    // Lanes t ^ 2 swap halves of j (t & 2 keeps 4..7), then lanes t ^ 1 (t & 1 keeps the upper
    // pair): lane t ends with j = 2t and 2t + 1 of both rows.
    const bool hi2 = t & 2, hi1 = t & 1;
    T h[8];
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const T lo = acc[r * GEMV_MAX_ROWS + i], up = acc[r * GEMV_MAX_ROWS + 4 + i];
            h[r * 4 + i] = (hi2 ? up : lo) + __shfl_xor_sync(0xffffffffu, hi2 ? lo : up, 2);
        }
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const T lo = h[r * 4 + i], up = h[r * 4 + 2 + i];
            c[r * 2 + i] = (hi1 ? up : lo) + __shfl_xor_sync(0xffffffffu, hi1 ? lo : up, 1);
        }
}

// The mma kernels for one row of x (1 or 2 float4 of x a lane) fit 64 registers: two blocks per SM.
template <int DT, bool VEC, int NR> constexpr int gemv_min_blocks() {
    if constexpr (VEC && (DT == QLM_BF16 || DT == QLM_I8))
        return NR == 1 ? 2 : 1;
    else
        return 1;
}

// 1 / rms of rows 0 .. n - 1 of x (cols values each) into inv, in rmsnorm_kernel's order: each
// half of the block's threads takes every other row as that kernel's QLM_RMS_THREADS take one.
__device__ __forceinline__ void rows_rms_inv(float *inv, const float *x, int n, int cols, float eps) {
    static_assert(GEMV_WARPS * 32 == 2 * QLM_RMS_THREADS, "two halves of the block");
    __shared__ float warp_sums[GEMV_MAX_ROWS][QLM_RMS_WARPS];
    const int t = threadIdx.x % QLM_RMS_THREADS;
    for (int j = threadIdx.x / QLM_RMS_THREADS; j < n; j += 2) {
        const float *xj = x + (size_t)j * cols;
        float ss = 0;
        for (int c = t; c < cols; c += QLM_RMS_THREADS) ss += xj[c] * xj[c];
        ss = qlm_warp_sum(ss);
        if ((t & 31) == 0) warp_sums[j][t >> 5] = ss;
    }
    __syncthreads();
    if (threadIdx.x < n) inv[threadIdx.x] = qlm_rms_inv(warp_sums[threadIdx.x], cols, eps);
    __syncthreads();
}

// Row i (0 .. GEMV_TILE - 1) of the tile whose rows start at r0, two runs of 8 pair rows apart.
__device__ __forceinline__ int tile_row(int r0, int pair, int i) { return r0 + (i & 7) + (i >> 3) * pair; }

// An INT8 product's output before its bias: the exact integer sum against x's I16 form times x's
// scale, then the weight's, as the CPU's qlm_gemv_finish.
__device__ __forceinline__ float i8_output(long long sum, float xscale, float wscale) {
    return __fmul_rn(__fmul_rn(__ll2float_rn(sum), xscale), wscale);
}

// Output j of the tile's row `row`: the warps' sums in warp order (INT8: i8_output with x's
// scale xscale[j]), biased.
template <int DT>
__device__ __forceinline__ float tile_output(const typename wtraits<DT>::sum (&sums)[GEMV_WARPS][GEMV_TILE][GEMV_MAX_ROWS],
                                             int row, int j, const gemv_part &P, const float *row_scale,
                                             const float *row_bias, const float *xscale) {
    typename wtraits<DT>::sum v = 0;
#pragma unroll
    for (int w = 0; w < GEMV_WARPS; w++) v += sums[w][row][j];
    float out;
    if constexpr (DT == QLM_I8)
        out = i8_output(v, xscale[j], P.row_scales ? row_scale[row] : P.scale);
    else
        out = v;
    return P.bias ? __fadd_rn(out, row_bias[row]) : out;
}

// NR: n rounded up to a power of 2 for the mma kernels, GEMV_MAX_ROWS (unused) for the others.
// FORM: how x is formed (X_GIVEN but for the mma kernels).
template <int DT, bool VEC, int NR, bool PDL, int FORM>
__global__ void __launch_bounds__(GEMV_WARPS * 32, gemv_min_blocks<DT, VEC, NR>())
    gemv_kernel(const __grid_constant__ gemv_args a) {
    static_assert(GEMV_MAX_ROWS == 8 && GEMV_TILE == 16, "the mma's n and m");
    using T = typename wtraits<DT>::sum;
    using tile_sums = T[GEMV_WARPS][GEMV_TILE][GEMV_MAX_ROWS];
    // The integer kernels' x images (tile_imma) and the warps' partial sums share the memory.
    constexpr bool IMAGE = VEC && DT == QLM_I8;
    constexpr size_t IMAGES = IMAGE ? i8_image_bytes<NR>() : 0;
    constexpr size_t SMEM = IMAGES > sizeof(tile_sums) ? IMAGES : sizeof(tile_sums);
    __shared__ __align__(16) unsigned char smem[SMEM];
    tile_sums &sums = *reinterpret_cast<tile_sums *>(smem);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int tile = blockIdx.x;
    int k = 0;
    while (tile >= a.tile0[k + 1]) k++;
    const gemv_part &P = a.part[k];
    const int runs = P.pair / 8, ti = tile - a.tile0[k];
    const int r0 = ti / runs * 2 * P.pair + ti % runs * 8, cols = a.cols, n = a.n;
    // Rows past the weight's last read that row instead; their sums are never stored.
    const size_t row_bytes = (size_t)cols * wtraits<DT>::size;
    const char *wa = (const char *)P.w + (size_t)min(r0 + g, P.rows - 1) * row_bytes;
    const char *wb = (const char *)P.w + (size_t)min(r0 + g + P.pair, P.rows - 1) * row_bytes;
    // The row's steps (4 vectors or 4 columns, one per lane t), split evenly among the warps.
    const int nvec = (int)(row_bytes / 16), steps = VEC ? (nvec + 3) / 4 : (cols + 3) / 4;
    const int s0 = warp * steps / GEMV_WARPS, s1 = (warp + 1) * steps / GEMV_WARPS;
    // Launched to overlap the kernel before (qlm_cuda_pdl), the warp's weights head for L2 while
    // that kernel finishes x: the 128-byte lines of its steps of both rows, split among lanes t.
    // Its own instances, so that the others' registers are not spent on it. A norm's sums of
    // squares and INT8's pass for x's scales come before the products: they too have the weights
    // on their way. The first batch's first steps go to registers (PRE: gemv_preload); no kernel
    // that lets this one start early writes weights.
    if (VEC && (PDL || FORM == X_RMSNORM || DT == QLM_I8))
        for (int line = s0 / 2 + t; line <= (s1 - 1) / 2; line += 4) {
            prefetch_l2(wa + (size_t)line * 128);
            prefetch_l2(wb + (size_t)line * 128);
        }
    constexpr int PRE = gemv_preload<DT, VEC, FORM, PDL>();
    uint4 ra[GEMV_STEPS] = {}, rb[GEMV_STEPS] = {};
    if (PRE && s0 < s1) load_steps<DT, 0, PRE>(ra, rb, wa, wb, s0, s1, t, nvec);
    qlm_pdl_wait();
    qlm_pdl_trigger();
    // The tile's row scales and biases start on their way to shared memory now (no registers held
    // through the loads), for thread i < 128, which finishes output j = i % 8 of the tile's row i / 8.
    __shared__ float row_scale[GEMV_TILE], row_bias[GEMV_TILE];
    const int scale_row = tile_row(r0, P.pair, threadIdx.x);
    if (threadIdx.x < GEMV_TILE && scale_row < P.rows) {
        if (DT == QLM_I8 && P.row_scales) cp_async4(&row_scale[threadIdx.x], P.row_scales + scale_row);
        if (P.bias) cp_async4(&row_bias[threadIdx.x], P.bias + scale_row);
    }
    __shared__ float xinv[GEMV_MAX_ROWS], xscale[GEMV_MAX_ROWS]; // INT8: x's I16 form, per row
    T c[4];
    if constexpr (VEC && (DT == QLM_BF16 || DT == QLM_I8)) {
        __shared__ float inv[GEMV_MAX_ROWS];
        if (FORM == X_RMSNORM) rows_rms_inv(inv, a.x, n, cols, a.eps);
        x_source<FORM> x = {a.x, a.up, a.norm, inv, blockIdx.x == 0 ? a.x_out : NULL, (qlm_act)a.act};
        if constexpr (DT == QLM_I8) {
            rows_i16_scales<true>(xinv, xscale, x, n, cols);
            x.out = NULL; // the scales' pass wrote it whole
            unsigned char *image = smem + warp * (NR + 1) * I8_IMAGE_STRIDE;
            tile_imma<NR, FORM, PRE>(c, image, ra, rb, wa, wb, x, xinv, n, cols, nvec, s0, s1, lane);
        } else {
            tile_mma<NR, FORM, PRE>(c, ra, rb, wa, wb, x, n, cols, nvec, s0, s1, lane);
        }
    } else {
        if constexpr (DT == QLM_I8) rows_i16_scales<false>(xinv, xscale, x_source<X_GIVEN>{a.x}, n, cols);
        tile_fma<DT, VEC>(c, wa, wb, a.x, xinv, n, cols, nvec, s0, s1, t);
    }
    if constexpr (IMAGE) {
        __syncthreads(); // every warp done with its image
        if (g < n)
#pragma unroll
            for (int i = 0; i < 4; i++) sums[warp][2 * t + (i & 1) + 8 * (i >> 1)][g] = c[i];
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) sums[warp][g + 8 * (i >> 1)][2 * t + (i & 1)] = c[i];
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    const int j = threadIdx.x % GEMV_MAX_ROWS, row = threadIdx.x / GEMV_MAX_ROWS, r = tile_row(r0, P.pair, row);
    if (threadIdx.x >= GEMV_TILE * GEMV_MAX_ROWS || j >= n || r >= P.rows) return;
    float out = tile_output<DT>(sums, row, j, P, row_scale, row_bias, xscale);
    if (P.rope) {
        // Tile rows row and row ^ 8 are a pair (x[e], x[e + half]) of a head: each thread makes the
        // other's output too and keeps its own side of the rotation, as rope_kernel rotates.
        const float other = tile_output<DT>(sums, row ^ 8, j, P, row_scale, row_bias, xscale);
        float lo = row < 8 ? out : other, hi = row < 8 ? other : out;
        qlm_rope_pair(lo, hi, (float)qlm_ints_at(a.rope_pos, j) * a.inv_freq[r % a.head_dim % P.pair], 1.0f);
        out = row < 8 ? lo : hi;
    }
    float *y = P.y + (size_t)j * P.rows + r;
    *y = P.add ? *y + out : out;
    if (P.cache) qlm_kv_put(a.kv, P.cache, j, r / a.head_dim, r % a.head_dim, out);
}

template <int DT, bool VEC, int NR, int FORM> static void gemv_launch_kernel(const gemv_args &a) {
    const dim3 grid((unsigned)a.tile0[a.count]), block(GEMV_WARPS * 32);
    if (a.pdl)
        qlm_cuda_launch(gemv_kernel<DT, VEC, NR, true, FORM>, grid, block, 0, true, a);
    else
        qlm_cuda_launch(gemv_kernel<DT, VEC, NR, false, FORM>, grid, block, 0, false, a);
}

template <int DT, int FORM> static void gemv_launch_mma(const gemv_args &a) {
    switch (a.n) {
    case 1: gemv_launch_kernel<DT, true, 1, FORM>(a); break;
    case 2: gemv_launch_kernel<DT, true, 2, FORM>(a); break;
    case 3:
    case 4: gemv_launch_kernel<DT, true, 4, FORM>(a); break;
    default: gemv_launch_kernel<DT, true, 8, FORM>(a); break;
    }
}

// Only the mma kernels form x (gemv_forms says which calls get here with a form).
template <int DT> static void gemv_launch_dt(const gemv_args &a) {
    if (!a.vec) {
        gemv_launch_kernel<DT, false, GEMV_MAX_ROWS, X_GIVEN>(a);
    } else if constexpr (DT == QLM_F32 || DT == QLM_F16) {
        gemv_launch_kernel<DT, true, GEMV_MAX_ROWS, X_GIVEN>(a);
    } else {
        switch (a.form) {
        case X_RMSNORM: gemv_launch_mma<DT, X_RMSNORM>(a); break;
        case X_GLU: gemv_launch_mma<DT, X_GLU>(a); break;
        default: gemv_launch_mma<DT, X_GIVEN>(a); break;
        }
    }
}

static void launch_gemv(const void *p) {
    const gemv_args &a = *(const gemv_args *)p;
    switch (a.dtype) {
    case QLM_F32: gemv_launch_dt<QLM_F32>(a); break;
    case QLM_F16: gemv_launch_dt<QLM_F16>(a); break;
    case QLM_BF16: gemv_launch_dt<QLM_BF16>(a); break;
    default: gemv_launch_dt<QLM_I8>(a); break;
    }
}

// One launch for count (<= GROUP_MAX) weights of one dtype and width multiplying the same x, or
// the x that step forms (NULL: x as given; else gemv_forms holds), then the kv step (NULL: none).
static void gemv(const qlm_matmul_out *outs, int count, const float *x, int n, const qlm_x_step *step,
                 const qlm_kv_step *kv) {
    gemv_args a;
    memset(&a, 0, sizeof a);
    if (step) {
        a.form = step->kind == QLM_X_RMSNORM ? X_RMSNORM : X_GLU;
        a.act = step->act;
        a.eps = step->eps;
        x = step->a;
        a.up = step->b;
        a.norm = step->weight;
        a.x_out = step->x;
    }
    const qlm_weight *w0 = outs[0].w;
    a.dtype = w0->dtype;
    a.n = n;
    const int esize = (int)qlm_dtype_size(w0->dtype);
    a.count = count;
    a.cols = w0->cols;
    a.x = x;
    a.vec = ((size_t)w0->cols * esize) % 16 == 0 && (uintptr_t)x % 16 == 0;
    a.pdl = qlm_cuda_pdl();
    a.tile0[0] = 0;
    for (int k = 0; k < count; k++) {
        const qlm_weight *w = outs[k].w;
        a.part[k].w = w->data;
        a.part[k].y = outs[k].y;
        a.part[k].bias = outs[k].bias;
        a.part[k].row_scales = w->row_scales;
        a.part[k].scale = w->scale;
        a.part[k].rows = w->rows;
        a.part[k].add = outs[k].add;
        a.part[k].pair = GEMV_TILE / 2;
        a.tile0[k + 1] = a.tile0[k] + (w->rows + GEMV_TILE - 1) / GEMV_TILE;
        a.vec = a.vec && (uintptr_t)w->data % 16 == 0;
    }
    if (a.tile0[count] == 0) return;
    if (kv) {
        a.head_dim = kv->head_dim;
        a.kv = qlm_cuda_kv_dst(kv, n, 1);
        a.part[1].cache = kv->k_cache;
        a.part[2].cache = kv->v_cache;
        if (kv->inv_freq) {
            a.rope_pos = qlm_cuda_ints_of(kv->pos, n, 0);
            a.inv_freq = kv->inv_freq;
            for (int k = 0; k < 2; k++) a.part[k].rope = 1, a.part[k].pair = kv->head_dim / 2;
        }
    }
    static const char *const names[4][2] = {{"gemv", "gemv (2-8 rows)"},
                                            {"gemv + norm", "gemv + norm (2-8 rows)"},
                                            {"gemv + glu", "gemv + glu (2-8 rows)"},
                                            {"gemv + norm + kv step", "gemv + norm + kv step (2-8 rows)"}};
    qlm_cuda_submit(names[kv ? 3 : a.form][a.n > 1], launch_gemv, &a, sizeof a);
}

// ---- many rows: cuBLAS ----

static void *g_xconv, *g_wconv, *g_sum;
static size_t g_xconv_cap, g_wconv_cap, g_sum_cap;
// Rows of a widened F16 weight chunk: at most this many elements at a time.
enum { WCONV_ELEMS = 32 << 20 };

__global__ void to_bf16_kernel(unsigned short *out, const float *x, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = qlm_f32_to_bf16(x[i]);
}

void qlm_cuda_to_bf16(unsigned short *out, const float *x, long n) {
    to_bf16_kernel<<<qlm_cuda_blocks(n, 256), 256, 0, qlm_cuda_stream>>>(out, x, n);
    LAUNCH_CHECK();
}

__global__ void widen_f16_kernel(float *out, const __half *w, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __half2float(w[i]);
}

// y[j][r] = (y[j][r] with add) + sum[j][r] + bias[r], the bias absent or not.
__global__ void epilogue_kernel(float *y, const float *sum, int add, int n, int rows, const float *bias) {
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long)n * rows) return;
    float v = sum[t];
    if (bias) v += bias[(int)(t % rows)];
    y[t] = add ? y[t] + v : v;
}

// Y (col-major rows x n, ld rows) = alpha W^T X for a row-major W [rows][cols] of type wt and
// X [n][cols] of type xt.
static void gemm(float *y, int ldy, const void *w, cudaDataType wt, const void *x, cudaDataType xt, int rows, int n,
                 int cols, float alpha) {
    const float beta = 0;
    CUBLAS_CHECK(cublasGemmEx(qlm_cuda_blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &alpha, w, wt, cols, x, xt, cols,
                              &beta, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// INT8 weights against more rows of x than the GEMV takes: cuBLAS's integer GEMM (signed bytes,
// int32 sums, on the tensor cores) over x in the I16 form, as the CPU and the GEMV take it, so that
// prefill too gives the CPU's scalar reference bit for bit and the weights are read as stored. q
// needs 16 bits, so x's n rows go in as rows of bytes: rows [0, n) q >> 8, rows [n, 2n)
// (q & 255) - 128, row 2n ones (each weight row's own sum), zeros up to a multiple of 16 (the
// GEMM's m, which its tensor-core kernels want a multiple of 4, as they do k and the leading
// dimensions; the weight rows are its n, any count), and sum w q = 256 sum w hi + sum w lo +
// 128 sum w. Columns go I8_GEMM_K at a time (each int32 sum below 2^30), weight rows a block whose
// sums fit I8_SUMS_ELEMS.
enum { I8_GEMM_K = 1 << 16, I8_SUMS_ELEMS = 16 << 20, I8_PLANE_ALIGN = 16 };

struct i8_planes {
    signed char *b; // nb rows of ld bytes
    float *xscale;  // x's n scales
    long ld;
    int nb;
};

static size_t round_up(size_t v, size_t m) { return (v + m - 1) / m * m; }

static i8_planes i8_planes_of(void *scratch, int n, int cols) {
    i8_planes p;
    p.b = (signed char *)scratch;
    p.ld = (long)round_up((size_t)cols, I8_PLANE_ALIGN);
    p.nb = (int)round_up(2 * (size_t)n + 1, I8_PLANE_ALIGN);
    p.xscale = (float *)(p.b + (size_t)p.nb * p.ld);
    return p;
}

static size_t i8_planes_bytes(int n, int cols) {
    const i8_planes p = i8_planes_of(NULL, n, cols);
    return (size_t)p.nb * p.ld + n * sizeof(float);
}

// Block i < n (GEMV_WARPS warps, as the GEMV's scale pass wants): row i's scale, found as the GEMV
// finds it, and its two rows of bytes; block n: the ones row and the zero rows.
__global__ void i16_planes_kernel(i8_planes p, const float *x, int n, int cols) {
    const int i = blockIdx.x;
    if (i == n) {
        for (int r = 2 * n; r < p.nb; r++)
            for (int c = threadIdx.x; c < cols; c += blockDim.x) p.b[(size_t)r * p.ld + c] = r == 2 * n;
        return;
    }
    __shared__ float inv, scale;
    const float *xi = x + (size_t)i * cols;
    rows_i16_scales<false>(&inv, &scale, x_source<X_GIVEN>{xi}, 1, cols);
    if (threadIdx.x == 0) p.xscale[i] = scale;
    signed char *hi = p.b + (size_t)i * p.ld, *lo = p.b + (size_t)(n + i) * p.ld;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const int q = i16_of(xi[c], inv);
        hi[c] = (signed char)(q >> 8);
        lo[c] = (signed char)((q & 255) - 128);
    }
}

struct i8_fold {
    float *y;
    long long *acc;  // the sums of the column chunks before: rc rows of n
    const int *sums; // this chunk's: rc rows (weight rows) of nb (the planes' rows)
    const float *xscale, *row_scales, *bias;
    float scale;
    int n, nb, rows, r0, rc, first, last, add;
};

enum { FOLD_TILE = 32, FOLD_ROWS = 8 };

// A tile of FOLD_TILE rows of x by FOLD_TILE outputs of [r0, r0 + rc): a column chunk's sums made
// back into sum w q (read along x's rows) and added to the chunks' before; after the last, scaled
// and biased as the GEMV's outputs and written along the outputs (through shared memory).
__global__ void __launch_bounds__(FOLD_TILE *FOLD_ROWS) i8_fold_kernel(const i8_fold f) {
    __shared__ long long tile[FOLD_TILE][FOLD_TILE + 1];
    const int i0 = blockIdx.x * FOLD_TILE, o0 = blockIdx.y * FOLD_TILE, tx = threadIdx.x, ty = threadIdx.y;
    for (int k = ty; k < FOLD_TILE; k += FOLD_ROWS) {
        const int i = i0 + tx, r = o0 + k;
        if (i >= f.n || r >= f.rc) continue;
        const int *s = f.sums + (size_t)r * f.nb;
        long long v = 256LL * s[i] + s[f.n + i] + 128LL * s[2 * f.n];
        long long *acc = f.acc + (size_t)r * f.n + i;
        if (!f.first) v += *acc;
        if (f.last)
            tile[k][tx] = v;
        else
            *acc = v;
    }
    if (!f.last) return;
    __syncthreads();
    for (int k = ty; k < FOLD_TILE; k += FOLD_ROWS) {
        const int i = i0 + k, r = o0 + tx, o = f.r0 + r;
        if (i >= f.n || r >= f.rc) continue;
        float out = i8_output(tile[tx][k], f.xscale[i], f.row_scales ? f.row_scales[o] : f.scale);
        if (f.bias) out = __fadd_rn(out, f.bias[o]);
        float *y = f.y + (size_t)i * f.rows + o;
        *y = f.add ? *y + out : out;
    }
}

struct gemm_args {
    float *y, *sum; // sum: where the product goes before it adds to y (add), else y
    const float *x, *bias;
    qlm_weight w;
    void *xform, *wconv; // scratch: x as BF16 or INT8's planes and scales; widened F16 rows or INT8's sums
    long long *acc;      // INT8: the column chunks' sums so far
    int n, chunk, add;   // chunk: weight rows at a time (F16, INT8)
};

static void launch_gemm_i8(const gemm_args &a) {
    const qlm_weight *w = &a.w;
    const int rows = w->rows, cols = w->cols, n = a.n, one = 1, zero = 0;
    const i8_planes p = i8_planes_of(a.xform, n, cols);
    i16_planes_kernel<<<n + 1, GEMV_WARPS * 32, 0, qlm_cuda_stream>>>(p, a.x, n, cols);
    LAUNCH_CHECK();
    i8_fold f = {a.y, a.acc, (const int *)a.wconv, p.xscale, w->row_scales, a.bias, w->scale, n, p.nb, rows, 0, 0, 0, 0, a.add};
    for (f.r0 = 0; f.r0 < rows; f.r0 += a.chunk) {
        f.rc = rows - f.r0 < a.chunk ? rows - f.r0 : a.chunk;
        const signed char *wr = (const signed char *)w->data + (size_t)f.r0 * cols;
        const dim3 grid((unsigned)((n + FOLD_TILE - 1) / FOLD_TILE), (unsigned)((f.rc + FOLD_TILE - 1) / FOLD_TILE));
        for (int k0 = 0; k0 < cols; k0 += I8_GEMM_K) {
            const int kc = cols - k0 < I8_GEMM_K ? cols - k0 : I8_GEMM_K;
            CUBLAS_CHECK(cublasGemmEx(qlm_cuda_blas, CUBLAS_OP_T, CUBLAS_OP_N, p.nb, f.rc, kc, &one, p.b + k0, CUDA_R_8I,
                                      (int)p.ld, wr + k0, CUDA_R_8I, cols, &zero, a.wconv, CUDA_R_32I, p.nb,
                                      CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT));
            f.first = k0 == 0, f.last = k0 + kc >= cols;
            i8_fold_kernel<<<grid, dim3(FOLD_TILE, FOLD_ROWS), 0, qlm_cuda_stream>>>(f);
            LAUNCH_CHECK();
        }
    }
}

static void launch_gemm(const void *p) {
    const gemm_args &a = *(const gemm_args *)p;
    const qlm_weight *w = &a.w;
    const int rows = w->rows, cols = w->cols, n = a.n;
    if (w->dtype == QLM_I8) {
        launch_gemm_i8(a);
        return;
    }
    float *y = a.sum;
    if (w->dtype == QLM_F32) {
        gemm(y, rows, w->data, CUDA_R_32F, a.x, CUDA_R_32F, rows, n, cols, 1.0f);
    } else if (w->dtype == QLM_BF16) {
        qlm_cuda_to_bf16((unsigned short *)a.xform, a.x, (long)n * cols);
        gemm(y, rows, w->data, CUDA_R_16BF, a.xform, CUDA_R_16BF, rows, n, cols, 1.0f);
    } else {
        for (int r0 = 0; r0 < rows; r0 += a.chunk) {
            int rc = rows - r0 < a.chunk ? rows - r0 : a.chunk;
            long ne = (long)rc * cols;
            widen_f16_kernel<<<qlm_cuda_blocks(ne, 256), 256, 0, qlm_cuda_stream>>>(
                (float *)a.wconv, (const __half *)w->data + (size_t)r0 * cols, ne);
            LAUNCH_CHECK();
            gemm(y + r0, rows, a.wconv, CUDA_R_32F, a.x, CUDA_R_32F, rc, n, cols, 1.0f);
        }
    }
    if (a.bias || a.add) {
        long ny = (long)n * rows;
        epilogue_kernel<<<qlm_cuda_blocks(ny, 256), 256, 0, qlm_cuda_stream>>>(a.y, y, a.add, n, rows, a.bias);
        LAUNCH_CHECK();
    }
}

// Whether cuBLAS's integer GEMM can read an INT8 weight: 4-byte aligned rows.
static bool i8_gemm_takes(const qlm_weight *w) { return w->cols % 4 == 0 && (uintptr_t)w->data % 4 == 0; }

static void gemm_matmul(const qlm_matmul_out *out, const float *x, int n) {
    const qlm_weight *w = out->w;
    const size_t cols = (size_t)w->cols;
    gemm_args a;
    memset(&a, 0, sizeof a);
    a.y = out->y, a.x = x, a.bias = out->bias, a.w = *w, a.n = n, a.add = out->add;
    if (w->dtype == QLM_I8) {
        const int nb = i8_planes_of(NULL, n, w->cols).nb;
        a.chunk = qlm_cuda_rows_within(I8_SUMS_ELEMS, nb, w->rows);
        a.xform = qlm_cuda_scratch(&g_xconv, &g_xconv_cap, i8_planes_bytes(n, w->cols));
        a.wconv = qlm_cuda_scratch(&g_wconv, &g_wconv_cap, (size_t)nb * a.chunk * sizeof(int));
        if (cols > I8_GEMM_K) a.acc = (long long *)qlm_cuda_scratch(&g_sum, &g_sum_cap, (size_t)n * a.chunk * 8);
        qlm_cuda_submit("gemm (cuBLAS, int8)", launch_gemm, &a, sizeof a);
        return;
    }
    a.sum = a.add ? (float *)qlm_cuda_scratch(&g_sum, &g_sum_cap, (size_t)n * w->rows * sizeof(float)) : a.y;
    if (w->dtype == QLM_BF16) a.xform = qlm_cuda_scratch(&g_xconv, &g_xconv_cap, (size_t)n * cols * 2);
    if (w->dtype == QLM_F16) {
        a.chunk = qlm_cuda_rows_within(WCONV_ELEMS, (long)cols, w->rows);
        a.wconv = qlm_cuda_scratch(&g_wconv, &g_wconv_cap, (size_t)a.chunk * cols * sizeof(float));
    }
    qlm_cuda_submit("gemm (cuBLAS)", launch_gemm, &a, sizeof a);
}

// The GEMV over rows of x GEMV_MAX_ROWS at a time: INT8 weights that cuBLAS's integer GEMM cannot
// read (rows that fill no 16-byte vectors, where the GEMV's sums are int64: any width).
static void gemv_rows(const qlm_matmul_out *out, const float *x, int n) {
    for (int i = 0; i < n; i += GEMV_MAX_ROWS) {
        qlm_matmul_out o = *out;
        o.y += (size_t)i * out->w->rows;
        gemv(&o, 1, x + (size_t)i * out->w->cols, n - i < GEMV_MAX_ROWS ? n - i : GEMV_MAX_ROWS, NULL, NULL);
    }
}

void qlm_cuda_matmul(float *y, const float *x, int n, const qlm_weight *w, const float *bias) {
    const qlm_matmul_out one = {y, w, bias, 0};
    qlm_cuda_matmul_group(&one, 1, x, n);
}

// The longest run of outs[k..count) that one GEMV launch can take together.
static int gemv_run(const qlm_matmul_out *outs, int count, int k) {
    int m = 1;
    while (k + m < count && m < GROUP_MAX && outs[k + m].w->dtype == outs[k].w->dtype &&
           outs[k + m].w->cols == outs[k].w->cols)
        m++;
    return m;
}

// Whether the GEMV takes n rows of x against w.
static bool gemv_takes(const qlm_weight *w, int n) {
    return n <= GEMV_MAX_ROWS && (w->dtype != QLM_I8 || w->cols <= GEMV_I8_MAX_COLS);
}

int qlm_cuda_matmul_group(const qlm_matmul_out *outs, int count, const float *x, int n) {
    if (n <= 0) return 0;
    for (int k = 0; k < count;) {
        const bool gemv_ok = gemv_takes(outs[k].w, n);
        const int m = gemv_ok ? gemv_run(outs, count, k) : 1;
        if (gemv_ok)
            gemv(outs + k, m, x, n, NULL, NULL);
        else if (outs[k].w->rows > 0)
            (outs[k].w->dtype == QLM_I8 && !i8_gemm_takes(outs[k].w) ? gemv_rows : gemm_matmul)(&outs[k], x, n);
        k += m;
    }
    return 0;
}

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

// Whether a kv step fits the products q, k and v as their GEMV makes them: heads of whole tiles
// when they are rotated (each pair of a head's halves in one tile), q of n_heads heads and k and v
// of n_kv_heads, none adding.
static bool gemv_takes_kv(const qlm_matmul_out *outs, int count, const qlm_kv_step *kv) {
    const int hd = kv->head_dim;
    if (count != 3 || hd <= 0 || (kv->inv_freq && hd % GEMV_TILE != 0)) return false;
    const int rows[3] = {kv->n_heads * hd, kv->n_kv_heads * hd, kv->n_kv_heads * hd};
    for (int k = 0; k < 3; k++)
        if (outs[k].w->rows != rows[k] || outs[k].add) return false;
    return true;
}

// Whether one GEMV launch can take the whole group with the step forming x and the kv step (NULL:
// none) after it: the mma kernels (BF16 or INT8 weights, rows of whole 16-byte vectors) over at
// most GEMV_MAX_ROWS rows, every vector the step reads or writes aligned.
static bool gemv_forms(const qlm_matmul_out *outs, int count, const qlm_x_step *step, const qlm_kv_step *kv, int n) {
    const qlm_weight *w = outs[0].w;
    if (!gemv_takes(w, n) || gemv_run(outs, count, 0) != count || (w->dtype != QLM_BF16 && w->dtype != QLM_I8) ||
        ((size_t)w->cols * qlm_dtype_size(w->dtype)) % 16 != 0 || (kv && !gemv_takes_kv(outs, count, kv)))
        return false;
    for (int k = 0; k < count; k++)
        if (!aligned16(outs[k].w->data) || outs[k].w->rows <= 0) return false;
    const float *second = step->kind == QLM_X_RMSNORM ? step->weight : step->b;
    return aligned16(step->x) && aligned16(step->a) && aligned16(second);
}

int qlm_cuda_step_matmul_group(const qlm_matmul_out *outs, int count, const qlm_x_step *step, const qlm_kv_step *kv,
                               int n) {
    if (n <= 0 || count <= 0) return 0;
    if (!qlm_cuda_fused() || !gemv_forms(outs, count, step, kv, n))
        return qlm_step_then_matmul_group(qlm_backend_cuda(), outs, count, step, kv, n);
    gemv(outs, count, NULL, n, step, kv);
    return 0;
}
