// Attention on the GPU: one block per (query head, query row, span of keys), its warps taking 32
// keys at a time (a lane per key for the scores, a lane per pair of elements for the values) with the
// softmax carried online, so no score matrix is ever stored; the warps' partial sums meet in shared
// memory. When few (row, head) blocks would each walk many keys (decode over a long context), the
// keys a row sees (a sliding window's only) are split into up to MAX_SPLITS spans of at least
// SPLIT_KEYS, each block writes its running max, sum and weighted values, and the span's block that
// finishes last merges them (as flash-decoding does, without its second kernel: decode on a GPU is
// bound by its count of kernels).
// Covers every shape of qlm_attn_shape: causal or fixed key counts, GQA, T5's relative-position
// bias, a batch of slots, F32 or BF16 caches.
#include <math.h>
#include <string.h>

#include "cuda_internal.h"

enum { ATTN_WARPS = 8, SPLIT_KEYS = 256, MAX_SPLITS = 64 };

struct attn_args {
    float *out;
    const float *q;
    const void *k, *v;
    qlm_cuda_ints pos, slots, slot_keys;
    int n, n_heads, group, head_dim, n_keys, bf16;
    int window; // causal: a query at p sees keys from p - window + 1 (0: all)
    int ring;   // > 0: key t in row t % ring (a rolling cache)
    int vec; // every key row starts 16-byte aligned and head_dim fills whole 16-byte loads
    float scale, softcap;
    float *part; // splits > 1: [n][n_heads][splits][head_dim + 2] (max, sum, weighted values)
    int *done;   // splits > 1: [n][n_heads] spans finished, back to 0 after the merge
    int splits, keys_per_split;
    const float *bias;
    int span, offset;
    size_t slot_stride, row_stride, head_stride;
    int heads_packed; // head_stride = the sequence's key count * head_dim
};

__device__ __forceinline__ float kv_elem(const void *base, size_t i, int bf16) {
    return bf16 ? qlm_bf16_to_f32(((const unsigned short *)base)[i]) : ((const float *)base)[i];
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// q . key row, 16 bytes of the key (8 BF16 or 4 F32 values) a load, with every load of the row
// issued before the first is used; q is read through the cache (every lane reads the same q).
template <int ND, int BF>
__device__ __forceinline__ float key_dot(const void *k, size_t row, const float *q, int hd, int vec) {
    float dot = 0;
    if (vec) {
        constexpr int PER = BF ? 8 : 4, NV = 32 * ND / PER, CHUNK = NV < 8 ? NV : 8;
        const uint4 *kr = (const uint4 *)((const char *)k + row * (BF ? 2 : 4));
        const float4 *q4 = (const float4 *)q;
        const int nvec = hd / PER;
#pragma unroll
        for (int u0 = 0; u0 < NV; u0 += CHUNK) {
            uint4 raw[CHUNK];
#pragma unroll
            for (int u = 0; u < CHUNK; u++) raw[u] = u0 + u < nvec ? kr[u0 + u] : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int u = 0; u < CHUNK; u++) {
                if (u0 + u >= nvec) break;
                const unsigned w[4] = {raw[u].x, raw[u].y, raw[u].z, raw[u].w};
                if (BF) {
                    const float4 qa = __ldg(q4 + 2 * (u0 + u)), qb = __ldg(q4 + 2 * (u0 + u) + 1);
                    dot += qa.x * __uint_as_float(w[0] << 16) + qa.y * __uint_as_float(w[0] & 0xffff0000u) +
                           qa.z * __uint_as_float(w[1] << 16) + qa.w * __uint_as_float(w[1] & 0xffff0000u) +
                           qb.x * __uint_as_float(w[2] << 16) + qb.y * __uint_as_float(w[2] & 0xffff0000u) +
                           qb.z * __uint_as_float(w[3] << 16) + qb.w * __uint_as_float(w[3] & 0xffff0000u);
                } else {
                    const float4 qa = __ldg(q4 + u0 + u);
                    dot += qa.x * __uint_as_float(w[0]) + qa.y * __uint_as_float(w[1]) + qa.z * __uint_as_float(w[2]) +
                           qa.w * __uint_as_float(w[3]);
                }
            }
        }
    } else {
        for (int d = 0; d < hd; d++) dot += __ldg(q + d) * kv_elem(k, row + d, BF);
    }
    return dot;
}

// Elements 2 lane + 64 j and the one after it of a value row (pairs: a lane's share of the row).
template <int BF>
__device__ __forceinline__ float2 value_pair(const void *v, size_t row, int d, int hd, int vec) {
    if (d >= hd) return make_float2(0, 0);
    if (vec) {
        if (BF) {
            const unsigned u = *(const unsigned *)((const unsigned short *)v + row + d);
            return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
        }
        return *(const float2 *)((const float *)v + row + d);
    }
    return make_float2(kv_elem(v, row + d, BF), d + 1 < hd ? kv_elem(v, row + d + 1, BF) : 0.0f);
}

// This lane's pair of value elements of keys t0 + j0 .. t0 + j0 + VU - 1 (0 from the tile's len on).
template <int P, int VU, int BF>
__device__ __forceinline__ void load_values(float2 (&vv)[VU][P], const attn_args &a, size_t base, int t0, int j0,
                                            int len, int lane) {
#pragma unroll
    for (int u = 0; u < VU; u++) {
        const int key = t0 + j0 + u;
        const size_t row = base + (size_t)(a.ring ? key % a.ring : key) * a.row_stride;
#pragma unroll
        for (int k = 0; k < P; k++)
            vv[u][k] = j0 + u < len ? value_pair<BF>(a.v, row, 2 * lane + 64 * k, a.head_dim, a.vec) : make_float2(0, 0);
    }
}

// acc += p v over those keys, key j0 + u's weight p held by lane (j0 + u) % 32 in e.
template <int P, int VU>
__device__ __forceinline__ void add_values(float (&acc)[2 * P], const float2 (&vv)[VU][P], float e, int j0) {
#pragma unroll
    for (int u = 0; u < VU; u++) {
        const float pj = __shfl_sync(0xffffffffu, e, (j0 + u) & 31);
#pragma unroll
        for (int k = 0; k < P; k++) acc[2 * k] += pj * vv[u][k].x, acc[2 * k + 1] += pj * vv[u][k].y;
    }
}

// The spans of one (row, head) merged into its output, each span's sums rescaled to the largest
// max, in span order whichever block runs it. The spans come from other blocks: read from L2.
__device__ void merge_spans(const attn_args &a, int i, int h) {
    const int hd = a.head_dim;
    const float *part = a.part + ((size_t)i * a.n_heads + h) * a.splits * (hd + 2);
    float mx = -INFINITY;
    for (int z = 0; z < a.splits; z++) mx = fmaxf(mx, __ldcg(part + z * (hd + 2)));
    float total = 0;
    for (int z = 0; z < a.splits; z++) {
        const float m = __ldcg(part + z * (hd + 2));
        if (m != -INFINITY) total += expf(m - mx) * __ldcg(part + z * (hd + 2) + 1);
    }
    float *oi = a.out + ((size_t)i * a.n_heads + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float sum = 0;
        for (int z = 0; z < a.splits; z++) {
            const float m = __ldcg(part + z * (hd + 2));
            if (m != -INFINITY) sum += expf(m - mx) * __ldcg(part + z * (hd + 2) + 2 + d);
        }
        oi[d] = total > 0 ? sum / total : 0.0f;
    }
}

// ND: head_dim <= 32 * ND; BF: BF16 caches. Each warp walks 32 keys at a time: a lane per key for
// the score, then a lane per pair of elements for the values. A tile's key row and the values of
// its first VU keys are loaded together, before the score needs them, so that a tile costs one
// memory latency rather than one per step (decode reads caches that have just left L2).
template <int ND, int BF>
__global__ void __launch_bounds__(ATTN_WARPS * 32) attention_kernel(attn_args a) {
    qlm_pdl_wait();
    qlm_pdl_trigger();
    constexpr int P = (ND + 1) / 2, VU = P == 1 ? 32 : 16 / P;
    extern __shared__ float smem[];
    const int h = blockIdx.x, i = blockIdx.y, z = blockIdx.z, hd = a.head_dim;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *s_acc = smem, *s_ml = s_acc + ATTN_WARPS * hd;
    const int p = qlm_ints_at(a.pos, i);
    const int slot = a.slots.present ? qlm_ints_at(a.slots, i) : 0;
    const int all_keys = a.n_keys > 0 ? (a.slot_keys.present ? qlm_ints_at(a.slot_keys, slot) : a.n_keys) : p + 1;
    // Spans count from the row's first visible key, so that a sliding window's keys are split
    // however far along the sequence it lies.
    const int window_first = a.n_keys == 0 && a.window > 0 && p >= a.window ? p - a.window + 1 : 0;
    const int first = window_first + (a.splits > 1 ? z * a.keys_per_split : 0);
    const int nk = a.splits > 1 && first + a.keys_per_split < all_keys ? first + a.keys_per_split : all_keys;
    const size_t head_stride = a.heads_packed ? (size_t)all_keys * hd : a.head_stride;
    const size_t base = (size_t)slot * a.slot_stride + (size_t)(h / a.group) * head_stride;
    const float *qi = a.q + ((size_t)i * a.n_heads + h) * hd;
    const float *bias = a.bias ? a.bias + (size_t)h * a.span + a.offset - p : NULL;

    float m = -INFINITY, l = 0, acc[2 * P];
#pragma unroll
    for (int k = 0; k < 2 * P; k++) acc[k] = 0;
    for (int t0 = first + w * 32; t0 < nk; t0 += ATTN_WARPS * 32) {
        const int t = t0 + lane, len = nk - t0 < 32 ? nk - t0 : 32;
        float2 vv[VU][P];
        load_values<P, VU, BF>(vv, a, base, t0, 0, len, lane);
        float s = -INFINITY;
        if (t < nk) {
            const float dot = key_dot<ND, BF>(a.k, base + (size_t)(a.ring ? t % a.ring : t) * a.row_stride, qi, hd, a.vec);
            s = a.softcap > 0 ? a.softcap * tanhf(dot * a.scale / a.softcap) + (bias ? bias[t] : 0.0f)
                              : dot * a.scale + (bias ? bias[t] : 0.0f);
        }
        const float m_new = fmaxf(m, warp_max(s));
        const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
        const float e = t < nk ? expf(s - m_new) : 0.0f;
        l = l * corr + qlm_warp_sum(e);
#pragma unroll
        for (int k = 0; k < 2 * P; k++) acc[k] *= corr;
        add_values<P, VU>(acc, vv, e, 0);
        // Wide heads hold fewer keys' values at a time: the rest of the tile, VU keys a step.
        for (int j0 = VU; j0 < len; j0 += VU) {
            load_values<P, VU, BF>(vv, a, base, t0, j0, len, lane);
            add_values<P, VU>(acc, vv, e, j0);
        }
        m = m_new;
    }
#pragma unroll
    for (int k = 0; k < 2 * P; k++) {
        const int d = 2 * lane + 64 * (k / 2) + k % 2;
        if (d < hd) s_acc[w * hd + d] = acc[k];
    }
    if (lane == 0) s_ml[2 * w] = m, s_ml[2 * w + 1] = l;
    __syncthreads();
    float mx = -INFINITY;
    for (int u = 0; u < ATTN_WARPS; u++) mx = fmaxf(mx, s_ml[2 * u]);
    float total = 0, wt[ATTN_WARPS];
    for (int u = 0; u < ATTN_WARPS; u++) {
        wt[u] = s_ml[2 * u] == -INFINITY ? 0.0f : expf(s_ml[2 * u] - mx);
        total += wt[u] * s_ml[2 * u + 1];
    }
    if (a.splits > 1) {
        float *part = a.part + (((size_t)i * a.n_heads + h) * a.splits + z) * (hd + 2);
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float sum = 0;
            for (int u = 0; u < ATTN_WARPS; u++) sum += wt[u] * s_acc[u * hd + d];
            part[2 + d] = sum;
        }
        if (threadIdx.x == 0) part[0] = mx, part[1] = total;
        // The block that counts the last span done merges them: its count comes after every
        // span's writes (each block's fence before its count).
        __shared__ int last;
        __threadfence();
        __syncthreads();
        int *done = a.done + (size_t)i * a.n_heads + h;
        if (threadIdx.x == 0) last = atomicAdd(done, 1) == a.splits - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        merge_spans(a, i, h);
        if (threadIdx.x == 0) *done = 0;
        return;
    }
    float *oi = a.out + ((size_t)i * a.n_heads + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float sum = 0;
        for (int u = 0; u < ATTN_WARPS; u++) sum += wt[u] * s_acc[u * hd + d];
        oi[d] = total > 0 ? sum / total : 0.0f;
    }
}

// Launched to overlap the kernel before it (qlm_cuda_pdl), its blocks are in place when that one
// ends: a decode step's attention follows the GEMV that stores its keys.
template <int BF> static void launch_attention_kernel(const attn_args &a, dim3 grid, size_t smem) {
    const int nd = (a.head_dim + 31) / 32;
    void (*const kernel)(attn_args) = nd <= 1   ? attention_kernel<1, BF>
                                      : nd <= 2 ? attention_kernel<2, BF>
                                      : nd <= 4 ? attention_kernel<4, BF>
                                      : nd <= 8 ? attention_kernel<8, BF>
                                      : nd <= 16 ? attention_kernel<16, BF>
                                                 : attention_kernel<32, BF>;
    qlm_cuda_launch(kernel, grid, dim3(ATTN_WARPS * 32), smem, qlm_cuda_pdl(), a);
}

static void launch_attention(const void *p) {
    const attn_args &a = *(const attn_args *)p;
    dim3 grid(a.n_heads, a.n, a.splits);
    size_t smem = ((size_t)a.head_dim * ATTN_WARPS + 2 * ATTN_WARPS) * sizeof(float);
    if (a.bf16)
        launch_attention_kernel<1>(a, grid, smem);
    else
        launch_attention_kernel<0>(a, grid, smem);
}

static void *g_part;
static size_t g_part_cap;
// The spans' counts: splits > 1 only below SPLIT_ROW_HEADS (row, head) pairs. Zero from the start
// and after every merge. Not from the pool: a block freed by an op still queued could come back
// and be written by it after the zeroing, which goes to the stream at once.
enum { SPLIT_ROW_HEADS = 256 };
static int *g_done;

static int *split_counts(void) {
    if (!g_done) {
        CUDA_CHECK(cudaMalloc((void **)&g_done, SPLIT_ROW_HEADS * sizeof(int)));
        CUDA_CHECK(cudaMemsetAsync(g_done, 0, SPLIT_ROW_HEADS * sizeof(int), qlm_cuda_stream));
    }
    return g_done;
}

void qlm_cuda_attention(float *out, const float *q, const void *k, const void *v, int n, const int *pos,
                        const qlm_attn_shape *sh) {
    if (n <= 0) return;
    const int hd = sh->head_dim;
    if (hd > 32 * 32) qlm_cuda_fail("attention", "head_dim over 1024 is not supported on the GPU", __FILE__, __LINE__);
    attn_args a;
    memset(&a, 0, sizeof a);
    a.out = out;
    a.q = q;
    a.k = k;
    a.v = v;
    a.n = n;
    a.pos = qlm_cuda_ints_of(pos, n, 0);
    a.slots = qlm_cuda_ints_of(sh->slots, n, 1);
    int n_slots = 0;
    for (int i = 0; sh->slots && i < n; i++)
        if (sh->slots[i] + 1 > n_slots) n_slots = sh->slots[i] + 1;
    a.slot_keys = qlm_cuda_ints_of(sh->slots ? sh->slot_keys : NULL, n_slots, 2);
    a.n_heads = sh->n_heads;
    a.group = sh->n_heads / sh->n_kv_heads;
    a.head_dim = hd;
    a.n_keys = sh->n_keys;
    a.window = sh->window;
    a.ring = sh->ring;
    // F16 caches belong to block weights, which only the CPU backend runs.
    if (sh->kv_dtype == QLM_F16) qlm_cuda_fail("attention", "F16 caches are not a CUDA form", __FILE__, __LINE__);
    a.bf16 = sh->kv_dtype == QLM_BF16;
    a.scale = sh->scale;
    a.softcap = sh->softcap;
    a.bias = sh->pos_bias;
    a.span = sh->pos_bias_span;
    a.offset = sh->pos_bias_offset;
    a.slot_stride = sh->slots ? sh->slot_stride : 0;
    a.row_stride = sh->row_stride ? sh->row_stride : (size_t)sh->n_kv_heads * hd;
    a.head_stride = sh->head_stride ? sh->head_stride : (size_t)hd;
    a.heads_packed = sh->heads_packed;
    // Split the keys a row sees (a window's at most) when the (row, head) blocks alone would leave
    // most of the GPU idle.
    int max_keys = 0;
    for (int i = 0; i < n; i++) {
        int nk = sh->n_keys > 0 ? (sh->slots && sh->slot_keys ? sh->slot_keys[sh->slots[i]] : sh->n_keys) : pos[i] + 1;
        if (sh->n_keys == 0 && sh->window > 0 && nk > sh->window) nk = sh->window;
        if (nk > max_keys) max_keys = nk;
    }
    a.splits = 1;
    if ((long)n * sh->n_heads < SPLIT_ROW_HEADS && max_keys > 2 * SPLIT_KEYS) {
        a.splits = (max_keys + SPLIT_KEYS - 1) / SPLIT_KEYS;
        if (a.splits > MAX_SPLITS) a.splits = MAX_SPLITS;
        a.keys_per_split = ((max_keys + a.splits - 1) / a.splits + 31) & ~31;
    }
    if (a.splits > 1) {
        a.part = (float *)qlm_cuda_scratch(&g_part, &g_part_cap,
                                           (size_t)n * sh->n_heads * a.splits * (hd + 2) * sizeof(float));
        a.done = split_counts();
    }
    size_t esize = a.bf16 ? 2 : 4;
    a.vec = (hd * esize) % 16 == 0 && (a.row_stride * esize) % 16 == 0 && (a.head_stride * esize) % 16 == 0 &&
            (a.slot_stride * esize) % 16 == 0 && (uintptr_t)k % 16 == 0 && (uintptr_t)v % 16 == 0;
    qlm_cuda_submit("attention", launch_attention, &a, sizeof a);
}
