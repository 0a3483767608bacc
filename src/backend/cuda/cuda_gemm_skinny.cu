/* y[t, o] = sum_i W[o, i] x[t, i] for 16-bit weights and 9..64 tokens: the batched decode of
 * many sequences, on tensor cores, reading each weight once.
 *
 * Why not cuBLAS: with a few dozen tokens the product is still bound by the weight stream, and
 * cuBLAS's tiles leave most of the GPU idle for matrices of ~1000 rows (an H200 measured ~23 us
 * per GEMM, ~15% of its read bandwidth); and the activations, split in a 16-bit hi and lo part
 * for accuracy (cuda_matmul.cu), took two GEMMs, i.e. two reads of every weight.
 *
 * Layout of the work: a block of 4 warps owns 32 rows (two 16-row tiles per warp); a cluster of
 * SK_KSPLIT blocks shares those rows, each block one contiguous quarter of the columns, its
 * warps taking every 4th 32-column chunk of it. A chunk is two mma.m16n8k16 per tile and token
 * group, each for hi and lo into the same fp32 accumulators. The block's weight range is asked
 * of the L2 cache before the programmatic-launch wait, so it streams in while the previous
 * kernel runs. The four warps' sums meet in shared memory, the cluster's blocks through
 * distributed shared memory, always in the same order: results do not depend on timing.
 *
 * mma fragments with a permuted k: a thread (group g = lane / 4, t = lane % 4) loads 8
 * consecutive 16-bit values of its rows at column 8t of the chunk, and so does the activation
 * fragment of token g. The first mma takes values 0..3 of each (as the k pairs 2t and 2t + 8 of
 * the instruction), the second values 4..7. A and B use the same permutation, and a dot product
 * does not care about the order of k. */
#include <cooperative_groups.h>

#include "backend/cuda/cuda_int.cuh"

namespace cg = cooperative_groups;

#define SK_ROWS 32
#define SK_WARPS 4
#define SK_KSPLIT 4
#define SK_CHUNK 32

typedef struct {
    const uint16_t *W[SK_SET];
    float *y[SK_SET];
    int64_t rows[SK_SET], ldy[SK_SET];
    int first[SK_SET + 1]; /* the first block (grid x) of each weight; first[nw] = all */
    int nw;
} sk_set;

template <bool BF>
__device__ static inline void mma16816(float *c, uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
    if (BF)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Stores element e = ((m * NT + q) * 4 + i) * 32 + lane of the accumulators, as an mma's C
 * fragment places it: row g (+ 8 for i >= 2), token 2t + (i & 1) of group q. */
__device__ static inline void sk_store(int e, float s, int64_t r0, int64_t rows, int n, float *y,
                                       int64_t ldy, int NT) {
    int l = e & 31, i = (e >> 5) & 3, mq = e >> 7, q = mq % NT, m = mq / NT;
    int64_t row = r0 + m * 16 + (l >> 2) + (i >= 2 ? 8 : 0);
    int tok = q * 8 + (l & 3) * 2 + (i & 1);
    if (row < rows && tok < n) y[(int64_t)tok * ldy + row] = s;
}

/* x: [2n][cols] 16-bit, rows [0, n) the hi parts, [n, 2n) the lo parts. NT token groups of 8
 * (n <= 8 NT). */
template <bool BF, int NT, int KS>
__global__ static void __cluster_dims__(1, KS, 1) __launch_bounds__(32 * SK_WARPS, 3)
    k_skinny(sk_set set, int64_t cols, const uint16_t *x, int n, bool prefetch) {
    __shared__ float red[SK_WARPS][2 * NT * 4 * 32];
    int b = blockIdx.x, j = 0;
    while (j + 1 < set.nw && b >= set.first[j + 1]) j++;
    int64_t r0 = (int64_t)(b - set.first[j]) * SK_ROWS, rows = set.rows[j];
    int64_t nrow = rows - r0 < SK_ROWS ? rows - r0 : SK_ROWS;
    const uint16_t *W = set.W[j];
    int64_t nch = cols / SK_CHUNK, c0 = nch * blockIdx.y / KS, c1 = nch * (blockIdx.y + 1) / KS;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    if (prefetch) { /* this block's rows x its quarter of the columns, a line per thread */
        size_t seg = (size_t)(c1 - c0) * SK_CHUNK * 2;
        int lines = (int)((seg + 127) / 128) + 1;
        for (int i = tid; i < nrow * lines; i += 32 * SK_WARPS) {
            const char *s = (const char *)(W + (r0 + i / lines) * cols + c0 * SK_CHUNK);
            uintptr_t a = ((uintptr_t)s & ~(uintptr_t)127) + (uintptr_t)(i % lines) * 128;
            if (a < (uintptr_t)s + seg)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(a < (uintptr_t)s ? (uintptr_t)s : a));
        }
    }
    cuda_pdl_entry();

    const uint16_t *wr[2][2];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int64_t r = r0 + m * 16 + g + 8 * h;
            wr[m][h] = W + (r < rows ? r : rows - 1) * cols + t4 * 8; /* rows past the end: a copy */
        }
    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int q = 0; q < NT; q++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][q][i] = 0.0f;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    /* the weights of the next chunk are loaded before this chunk's products */
    uint4 a[2][2], an[2][2];
    int64_t ch = c0 + warp;
    if (ch < c1)
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) a[m][h] = __ldg((const uint4 *)(wr[m][h] + ch * SK_CHUNK));
    for (; ch < c1; ch += SK_WARPS) {
        int64_t k = ch * SK_CHUNK;
        bool more = ch + SK_WARPS < c1;
        if (more)
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    an[m][h] = __ldg((const uint4 *)(wr[m][h] + k + SK_WARPS * SK_CHUNK));
#pragma unroll
        for (int q = 0; q < NT; q++) {
            int tok = q * 8 + g;
            const uint16_t *xp = x + (int64_t)tok * cols + k + t4 * 8;
            uint4 hi = tok < n ? *(const uint4 *)xp : zero;
            uint4 lo = tok < n ? *(const uint4 *)(xp + (int64_t)n * cols) : zero;
#pragma unroll
            for (int m = 0; m < 2; m++) {
                mma16816<BF>(acc[m][q], a[m][0].x, a[m][1].x, a[m][0].y, a[m][1].y, hi.x, hi.y);
                mma16816<BF>(acc[m][q], a[m][0].z, a[m][1].z, a[m][0].w, a[m][1].w, hi.z, hi.w);
                mma16816<BF>(acc[m][q], a[m][0].x, a[m][1].x, a[m][0].y, a[m][1].y, lo.x, lo.y);
                mma16816<BF>(acc[m][q], a[m][0].z, a[m][1].z, a[m][0].w, a[m][1].w, lo.z, lo.w);
            }
        }
        if (more)
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) a[m][h] = an[m][h];
    }
    /* element e = ((m * NT + q) * 4 + i) * 32 + lane of a warp's accumulators */
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int q = 0; q < NT; q++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp][((m * NT + q) * 4 + i) * 32 + lane] = acc[m][q][i];
    __syncthreads();
    const int per = 2 * NT * 4 * 32;
    for (int e = tid; e < per; e += 32 * SK_WARPS) {
        float s = red[0][e];
#pragma unroll
        for (int w = 1; w < SK_WARPS; w++) s += red[w][e];
        red[0][e] = s;
    }
    float *y = set.y[j];
    int64_t ldy = set.ldy[j];
    if (KS == 1) {
        __syncthreads();
        for (int e = tid; e < per; e += 32 * SK_WARPS) sk_store(e, red[0][e], r0, rows, n, y, ldy, NT);
        return;
    }
    cg::cluster_group cl = cg::this_cluster();
    cl.sync(); /* every block's sum is in its shared memory */
    if (cl.block_rank() == 0) {
        const float *part[KS];
#pragma unroll
        for (int r = 0; r < KS; r++) part[r] = cl.map_shared_rank(&red[0][0], r);
        for (int e = tid; e < per; e += 32 * SK_WARPS) {
            float s = part[0][e];
#pragma unroll
            for (int r = 1; r < KS; r++) s += part[r][e];
            sk_store(e, s, r0, rows, n, y, ldy, NT);
        }
    }
    cl.sync(); /* the other blocks' shared memory stays until rank 0 has read it */
}

bool cuda_skinny_fits(const cuda_wview *w, int n) {
    return (w->dtype == TS_DTYPE_BF16 || w->dtype == TS_DTYPE_F16) && n > 0 &&
           n <= SK_MAX_TOK && w->cols % SK_CHUNK == 0 && w->cols >= SK_CHUNK * SK_KSPLIT &&
           (uintptr_t)w->data % 16 == 0 && w->rows > 0;
}

/* The columns are split over a cluster of 4 blocks only where the row blocks alone would
 * leave the GPU short of work: the cluster's reduction costs as much as a few chunks. */
template <bool BF, int NT>
static void skinny_launch(cuda_ctx *c, const sk_set &set, int64_t cols, const uint16_t *x, int n) {
    unsigned bx = (unsigned)set.first[set.nw];
    if (bx >= 4u * (unsigned)c->sm_count)
        cuda_launch(c, "gemm_skinny", k_skinny<BF, NT, 1>, dim3(bx, 1), 32 * SK_WARPS, 0, set,
                    cols, x, n, c->prefetch);
    else
        cuda_launch(c, "gemm_skinny", k_skinny<BF, NT, SK_KSPLIT>, dim3(bx, SK_KSPLIT),
                    32 * SK_WARPS, 0, set, cols, x, n, c->prefetch);
}

void cuda_skinny_gemm(cuda_ctx *c, const cuda_wview *w, int nw, const uint16_t *x, int n,
                      float *const *y, const int64_t *ldy) {
    sk_set set = {};
    set.nw = nw;
    for (int j = 0; j < nw; j++) {
        set.W[j] = (const uint16_t *)w[j].data;
        set.y[j] = y[j];
        set.rows[j] = w[j].rows;
        set.ldy[j] = ldy[j];
        set.first[j + 1] = set.first[j] + (int)((w[j].rows + SK_ROWS - 1) / SK_ROWS);
    }
    bool bf = w[0].dtype == TS_DTYPE_BF16;
    int64_t cols = w[0].cols;
#define SK_GO(NT)                                                                                  \
    (bf ? skinny_launch<true, NT>(c, set, cols, x, n) : skinny_launch<false, NT>(c, set, cols, x, n))
    if (n <= 16)
        SK_GO(2);
    else if (n <= 32)
        SK_GO(4);
    else
        SK_GO(8);
#undef SK_GO
}
