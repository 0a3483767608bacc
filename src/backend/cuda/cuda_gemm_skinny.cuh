/* What the tensor-core GEMMs of a few dozen tokens share (cuda_gemm_skinny.cu: mma.sync with
 * the weights in registers; cuda_gemm_wg.cu: wgmma with both operands in shared memory): the set
 * of weights one launch multiplies, the accumulators' layout - a warp's 16-row tiles by token
 * groups of 8, four floats each, as mma.m16n8 and wgmma's m64nN both leave them - and the
 * epilogue that stores them or sums them over a cluster's blocks in a fixed order. */
#pragma once

#include "backend/cuda/cuda_int.cuh"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define SK_WARPS 4
#define SK_MT    2                       /* 16-row tiles per warp */
#define SK_ROWS  (SK_WARPS * SK_MT * 16) /* rows per block */
#define SK_CHUNK 32

typedef struct {
    const uint8_t *W[SK_SET];
    float *y[SK_SET];
    int64_t rows[SK_SET], ldy[SK_SET];
    int first[SK_SET + 1]; /* the first block (grid x) of each weight; first[nw] = all */
    int nw;
    bool acc; /* y += the product (a residual add in the epilogue) */
} sk_set;

/* The first row block (grid x) of each weight of the set, blocks of `rows` rows. */
static inline void sk_blocks(sk_set &set, int rows) {
    for (int j = 0; j < set.nw; j++)
        set.first[j + 1] = set.first[j] + (int)((set.rows[j] + rows - 1) / rows);
}

/* Where accumulator (m, q, i) of lane l in warp w lands: row and token; acc adds it to y.
 * (Loading all of a thread's old values first, then storing, measured slower: the addresses and
 * sums held for it spill.) */
template <bool US, int MS = 16>
__device__ static inline void sk_store(int64_t rw0, int m, int q, int i, int lane, float s,
                                       int64_t rows, int n, float *y, int64_t ldy, bool acc,
                                       const float *unscale) {
    int64_t row = rw0 + m * MS + (lane >> 2) + (i >= 2 ? 8 : 0);
    int tok = q * 8 + (lane & 3) * 2 + (i & 1);
    if (row < rows && tok < n) {
        if (US) s *= unscale[tok];
        float *p = &y[(int64_t)tok * ldy + row];
        *p = acc ? *p + s : s;
    }
}

/* f(m, q, i) for every accumulator element [m][q][i] of a warp, unrolled. */
template <int NT, int MT = SK_MT, typename F> __device__ static inline void sk_each(F f) {
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int q = 0; q < NT; q++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                f(m, q, i);
}

/* Which weight of the set the blocks of grid column b work on. */
__device__ static inline int sk_weight_of(const sk_set &set, int b) {
    int j = 0;
    while (j + 1 < set.nw && b >= set.first[j + 1])
        j++;
    return j;
}

/* The block's sums to y: stored (KS = 1), or summed over the cluster's KS blocks through
 * distributed shared memory, each block adding up a slice in a fixed order. red: the block's
 * shared memory, free again (its reads done), at least SK_WARPS * MT * NT * 128 floats. The
 * rows of accumulator tile m of warp w: w * MT * 16 + m * 16 on (k_skinny: a warp's tiles
 * adjacent), or with WG m * 64 + w * 16 on (a warpgroup's m64 tiles: each warp 16 rows of
 * each). */
template <bool US, int NT, int KS, int MT, bool WG = false>
__device__ static inline void sk_finish(const float (&acc)[MT][NT][4], float *red,
                                        const sk_set &set, int j, int64_t r0, int n,
                                        const float *unscale) {
    constexpr int PER = MT * NT * 4 * 32; /* accumulators of a warp */
    constexpr int TOT = SK_WARPS * PER;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int WS = WG ? 16 : MT * 16, MS = WG ? 64 : 16; /* a warp's rows, a tile's */
    int64_t rows = set.rows[j], rw0 = r0 + warp * WS;
    float *y = set.y[j];
    int64_t ldy = set.ldy[j];
    if (KS == 1) {
        sk_each<NT, MT>([&](int m, int q, int i) {
            sk_store<US, MS>(rw0, m, q, i, lane, acc[m][q][i], rows, n, y, ldy, set.acc, unscale);
        });
        return;
    }
    /* element e = warp * PER + ((m * NT + q) * 4 + i) * 32 + lane; this thread sums EL of
     * them, V consecutive ones (lanes of one row, V tokens) at a time */
    constexpr int THREADS = 32 * SK_WARPS, EL = TOT / KS / THREADS, V = EL >= 4 ? 4 : EL;
    static_assert(EL * KS * THREADS == TOT && EL % V == 0, "whole groups a thread");
    __syncthreads(); /* staging is over (also when this block had no chunk) */
    sk_each<NT, MT>([&](int m, int q, int i) {
        red[warp * PER + ((m * NT + q) * 4 + i) * 32 + lane] = acc[m][q][i];
    });
    cg::cluster_group cl = cg::this_cluster();
    int rank = (int)cl.block_rank();
    auto elem = [&](int k) { return rank * (TOT / KS) + (tid + k / V * THREADS) * V + k % V; };
    auto where = [&](int e, int64_t &row, int &tok) {
        int w = e / PER, f = e % PER, l = f & 31, i = (f >> 5) & 3, mq = f >> 7;
        row = r0 + w * WS + mq / NT * MS + (l >> 2) + (i >= 2 ? 8 : 0);
        tok = mq % NT * 8 + (l & 3) * 2 + (i & 1);
        return row < rows && tok < n;
    };
    /* the residual's old values first, all at once (no other thread writes these elements, and
     * the previous kernel is done: cuda_pdl_entry). The barrier's release is a GPU-wide fence
     * (MEMBAR.ALL.GPU) that waits for them: one round trip for all, as before for each. */
    float old[EL];
#pragma unroll
    for (int k = 0; k < EL; k++) {
        int64_t row;
        int tok;
        old[k] = set.acc && where(elem(k), row, tok) ? y[(int64_t)tok * ldy + row] : 0.0f;
    }
    cl.sync(); /* every block's sums are in its shared memory */
    const float *part[KS];
#pragma unroll
    for (int r = 0; r < KS; r++)
        part[r] = cl.map_shared_rank(red, r);
    /* every load of the slice at once (they were a round trip each, element after element),
     * then the sums in the blocks' order, as before */
    float sum[EL];
#pragma unroll
    for (int r = 0; r < KS; r++)
#pragma unroll
        for (int k = 0; k < EL; k += V) {
            float v[V];
            if constexpr (V == 4)
                *(float4 *)v = *(const float4 *)(part[r] + elem(k));
            else if constexpr (V == 2)
                *(float2 *)v = *(const float2 *)(part[r] + elem(k));
            else
                v[0] = part[r][elem(k)];
#pragma unroll
            for (int u = 0; u < V; u++)
                sum[k + u] = r ? sum[k + u] + v[u] : v[u];
        }
#pragma unroll
    for (int k = 0; k < EL; k++) {
        int64_t row;
        int tok;
        if (where(elem(k), row, tok)) {
            float v = sum[k];
            if (US) v *= unscale[tok];
            y[(int64_t)tok * ldy + row] = set.acc ? old[k] + v : v;
        }
    }
    /* the blocks' shared memory stays until every slice has been read. A relaxed arrive: the
     * reads are done (their sums are stored above), and cluster.sync()'s release would add a
     * GPU-wide fence (MEMBAR.ALL.GPU) that stalled the small GEMMs measurably (ncu). */
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::
                     : "memory");
}

/* 16-bit weights of c->wg_min..64 tokens through wgmma (cuda_gemm_wg.cu); false where that form
 * does not take the product (another type or count, no sm_90a code on the device,
 * TESSERA_CUDA_SKINNY_WG=0): the caller runs k_skinny instead. set: its blocks of SK_ROWS rows. */
bool cuda_wg_gemm(cuda_ctx *c, const sk_set &set, ts_dtype dt, int64_t cols, const uint16_t *x,
                  const float *us, int n);
