/* y[t, o] = sum_i W[o, i] x[t, i] for up to 64 tokens on tensor cores, reading each weight once:
 * the batched decode of many sequences, and short prompts. 16-bit weights go in as stored;
 * quantized ones are decoded in registers and rounded to bf16 (dequantize-to-BF16 tiles: no fp32
 * copy of the weight is ever written).
 *
 * Why not cuBLAS: with a few dozen tokens the product is still bound by the weight stream, and
 * cuBLAS's tiles leave most of the GPU idle for matrices of ~1000 rows (an H200 measured ~23 us
 * per GEMM, ~15% of its read bandwidth); and the activations, split in a 16-bit hi and lo part
 * for accuracy (cuda_matmul.cu), took two GEMMs, i.e. two reads of every weight.
 *
 * Layout of the work: a block of 4 warps owns 128 rows (two 16-row tiles per warp; 64 rows, one
 * tile a warp, where even clusters of 8 blocks would leave the GPU short: skinny_go) and walks
 * its columns in steps of two chunks of 32 (one where the columns are not a multiple of 64).
 * Each step of the activations (hi and lo parts of every token) is staged once in shared memory
 * for the four warps, with asynchronous copies one step ahead; the weights come straight into
 * registers, also a step ahead (k_skinny) - or, for 16-bit weights and 17-32 tokens, both come
 * into a ring of three stages in shared memory, two steps ahead (k_skinny_ring; for 9-16 tokens
 * in the 64-row blocks, a ring of eight stages, seven steps ahead). A chunk is two
 * mma.m16n8k16 per tile and token group, each for hi and lo into the same fp32 accumulators. (One
 * chunk a step left the weight loads of a single chunk in flight per synchronisation: 8 sequences
 * of the 0.8B ran 3.5k t/s BF16 and 2.5k Q4_K_M against 3.9k and 2.8k with two; the sums are the
 * same either way.) Where the row blocks alone would leave the GPU short of work, a cluster of KS
 * blocks splits the columns and the blocks' sums meet through distributed shared memory, each block
 * adding up a slice in a fixed order: results do not depend on timing. The first step's weights are
 * loaded (and, for quantized ones, the block's weight range asked of the L2 cache) before the
 * programmatic-launch wait, so they stream in while the previous kernel runs.
 *
 * mma fragments with a permuted k: a thread (group g = lane / 4, t = lane % 4) loads 8
 * consecutive 16-bit values of its rows at column 8t of the chunk, and so does the activation
 * fragment of token g. The first mma takes values 0..3 of each (as the k pairs 2t and 2t + 8 of
 * the instruction), the second values 4..7. A and B use the same permutation, and a dot product
 * does not care about the order of k. */
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_gemm_skinny.cuh"
#include "backend/cuda/cuda_mma.cuh"

#include <cuda_bf16.h>

/* Elements [e, e + 8) of a weight row as an mma operand: 16-bit weights as stored, every other
 * type decoded (cuda_dequant.cuh) and rounded to bf16 - dequantize-to-BF16 tiles. */
template <ts_dtype DT> __device__ static inline uint4 sk_wload(const uint8_t *row, int64_t e) {
    if (DT == TS_DTYPE_BF16 || DT == TS_DTYPE_F16) return __ldg((const uint4 *)(row + e * 2));
    float w[8];
    group8<DT>(row, e, w);
    uint32_t p[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __nv_bfloat162 h = __floats2bfloat162_rn(w[2 * i], w[2 * i + 1]);
        p[i] = *(uint32_t *)&h;
    }
    return make_uint4(p[0], p[1], p[2], p[3]);
}

/* Where 16-byte piece `piece` of staged row `row` lies in the staging buffer: as it is, but for
 * 128-byte rows (KC = 2) an odd row's two halves swap. A warp's fragment load reads 64 bytes of
 * each of rows g = 0..7; unswizzled, rows g and g + 1 share banks (a 2-way conflict). */
template <int KC> __device__ static inline int sk_piece(int piece, int row) {
    return KC == 2 ? piece ^ ((row & 1) << 2) : piece;
}

/* The accumulators zeroed, element by element (an initializer `= {}` compiled to other
 * code around them). */
template <int NT, int MT> __device__ static inline void sk_zero(float (&acc)[MT][NT][4]) {
    sk_each<NT, MT>([&](int m, int q, int i) { acc[m][q][i] = 0.0f; });
}

/* One chunk of 32 columns into acc: each token group's hi and lo fragments from the staged
 * rows (xb: the NT * 8 hi rows, then the lo rows, STEP values apart; this thread's 16 bytes at
 * col) against the warp's weight fragments w, two mmas for each part into the same fp32
 * accumulators. */
template <bool BF, int NT, int STEP, int MT>
__device__ static inline void sk_chunk(float (&acc)[MT][NT][4], const uint4 (&w)[MT][2],
                                       const uint16_t *xb, int g, int col) {
#pragma unroll
    for (int q = 0; q < NT; q++) {
        uint4 hi = *(const uint4 *)(xb + (q * 8 + g) * STEP + col);
        uint4 lo = *(const uint4 *)(xb + (NT * 8 + q * 8 + g) * STEP + col);
#pragma unroll
        for (int m = 0; m < MT; m++) {
            mma16816<BF>(acc[m][q], w[m][0].x, w[m][1].x, w[m][0].y, w[m][1].y, hi.x, hi.y);
            mma16816<BF>(acc[m][q], w[m][0].z, w[m][1].z, w[m][0].w, w[m][1].w, hi.z, hi.w);
            mma16816<BF>(acc[m][q], w[m][0].x, w[m][1].x, w[m][0].y, w[m][1].y, lo.x, lo.y);
            mma16816<BF>(acc[m][q], w[m][0].z, w[m][1].z, w[m][0].w, w[m][1].w, lo.z, lo.w);
        }
    }
}

/* x: [2n][cols] 16-bit, rows [0, n) the hi parts, [n, 2n) the lo parts, for F16 weights (fp16
 * parts) token t scaled by 1 / unscale[t]; the other types never read unscale (their kernels
 * compile as they did without it: a runtime test here cost 64 sequences of the 0.8B BF16 ~5%). NT
 * token groups of 8 (n <= 8 NT); KS blocks of a cluster split the columns; each step (a staging
 * buffer, one synchronisation) covers KC chunks of SK_CHUNK columns; MT 16-row tiles a warp (blocks
 * of SK_WARPS * MT * 16 rows: MT = 1 where the GPU would be short of blocks, skinny_go). */
template <ts_dtype DT, int NT, int KS, int KC, int MT = SK_MT>
__global__ static void __cluster_dims__(1, KS, 1) __launch_bounds__(32 * SK_WARPS)
    k_skinny(sk_set set, size_t row_bytes, int64_t cols, const uint16_t *x, const float *unscale,
             int n, bool prefetch) {
    constexpr bool BF = DT != TS_DTYPE_F16; /* the mma's 16-bit type */
    constexpr bool US = !BF;                /* fp16 activations come scaled */
    constexpr int XROWS = 2 * NT * 8;                /* staged rows: hi then lo of each token */
    constexpr int STEP = KC * SK_CHUNK;              /* columns a step */
    constexpr int XBUF = XROWS * STEP;               /* 16-bit values per staging buffer */
    constexpr int PER = MT * NT * 4 * 32;            /* accumulators of a warp */
    constexpr int TOT = SK_WARPS * PER;
    constexpr int ROWS = SK_WARPS * MT * 16; /* rows a block */
    constexpr int BYTES = 4 * TOT > 2 * 2 * XBUF ? 4 * TOT : 2 * 2 * XBUF;
    __shared__ __align__(16) unsigned char smem[BYTES]; /* staging, then the cluster's sums */
    uint16_t *xs = (uint16_t *)smem;
    int j = sk_weight_of(set, blockIdx.x);
    int64_t r0 = (int64_t)(blockIdx.x - set.first[j]) * ROWS, rows = set.rows[j];
    int64_t nrow = rows - r0 < ROWS ? rows - r0 : ROWS;
    const uint8_t *W = set.W[j];
    int64_t nch = cols / STEP, c0 = nch * blockIdx.y / KS, c1 = nch * (blockIdx.y + 1) / KS;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    if (prefetch) { /* this block's rows x (about) its share of the columns, a line per thread */
        size_t b0 = row_bytes * c0 / nch, seg = row_bytes * c1 / nch - b0;
        int lines = (int)((seg + 127) / 128) + 1;
        for (int i = tid; i < nrow * lines; i += 32 * SK_WARPS) {
            const char *s = (const char *)(W + (r0 + i / lines) * row_bytes + b0);
            uintptr_t a = ((uintptr_t)s & ~(uintptr_t)127) + (uintptr_t)(i % lines) * 128;
            if (a < (uintptr_t)s + seg)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(a < (uintptr_t)s ? (uintptr_t)s : a));
        }
    }
    /* the first step's weights before the programmatic wait (no kernel before this one writes
     * them): their latency overlaps the previous kernel's tail */
    int64_t rw0 = r0 + warp * MT * 16; /* this warp's first row */
    const uint8_t *wr[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int64_t r = rw0 + m * 16 + g + 8 * h;
            wr[m][h] = W + (r < rows ? r : rows - 1) * row_bytes; /* rows past the end: a copy */
        }
    uint4 a[KC][MT][2], an[KC][MT][2];
    if (c0 < c1)
#pragma unroll
        for (int k = 0; k < KC; k++)
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    a[k][m][h] = sk_wload<DT>(wr[m][h], c0 * STEP + k * SK_CHUNK + t4 * 8);
    cuda_pdl_entry();

    /* chunk ch of the activations into staging buffer buf: 16-byte pieces, tokens past n zero.
     * A constant trip count, so that the loop unrolls (with `p < total; p += threads` it
     * compiled to a counted loop with a remainder: ~250 of a step's ~570 instructions). Where a
     * staged row is 128 bytes (KC = 2), odd rows swap its halves (sk_piece), so that the
     * fragment loads of rows g and g + 1, 128 bytes apart, fall in different banks. */
    auto stage = [&](int64_t ch, int buf) {
        constexpr int PIECES = XROWS * 4 * KC, THREADS = 32 * SK_WARPS;
        static_assert(PIECES % THREADS == 0, "whole rounds of 16-byte pieces");
#pragma unroll
        for (int i = 0; i < PIECES / THREADS; i++) {
            int p = tid + i * THREADS;
            int row = p / (4 * KC), piece = p % (4 * KC), part = row / (NT * 8),
                tok = row % (NT * 8);
            bool ok = tok < n;
            const uint16_t *src =
                ok ? x + (int64_t)(part * n + tok) * cols + ch * STEP + piece * 8 : x;
            cp_async16(xs + buf * XBUF + row * STEP + sk_piece<KC>(piece, row) * 8, src, ok);
        }
        cp_async_commit();
    };
    float acc[MT][NT][4];
    sk_zero(acc);
    if (c0 < c1) stage(c0, 0);
    for (int64_t ch = c0; ch < c1; ch++) {
        int buf = (int)((ch - c0) & 1);
        bool more = ch + 1 < c1;
        if (more) { /* the next chunk's activations and weights, while this one computes */
            stage(ch + 1, buf ^ 1);
#pragma unroll
            for (int k = 0; k < KC; k++)
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        an[k][m][h] =
                            sk_wload<DT>(wr[m][h], (ch + 1) * STEP + k * SK_CHUNK + t4 * 8);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *xb = xs + buf * XBUF;
#pragma unroll
        for (int k = 0; k < KC; k++) /* rows q * 8 + g: the parity of g */
            sk_chunk<BF, NT, STEP>(acc, a[k], xb, g, sk_piece<KC>(k * 4 + t4, g) * 8);
        __syncthreads(); /* all reads of buf done before it is staged again */
        if (more)
#pragma unroll
            for (int k = 0; k < KC; k++)
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++) a[k][m][h] = an[k][m][h];
    }
    sk_finish<US, NT, KS, MT>(acc, (float *)smem, set, j, r0, n, unscale);
}

/* 16-bit weights through a ring of SK_RING stages in shared memory: each step's 128 x 64
 * weights and its activations come by cp.async two steps ahead, so that two steps' loads are
 * in flight while one computes, at no cost in registers (k_skinny holds its next step's weights
 * in 64 registers, so only one step is in flight). The first two steps' weights are asked for
 * before the programmatic wait. The same mmas in the same order as k_skinny with KC = 2: the
 * same sums, bit for bit. Dynamic shared memory: SK_RING stages of (128 + 16 NT) rows of 128
 * bytes (96 KB for 64 tokens: two blocks a multiprocessor, as k_skinny's registers allow).
 * Measured on an H200 (bench/RESULTS.md): faster for 17-32 tokens, slower for 64 - there the
 * step's mmas already cover one step of loads, and the weights' extra trip through shared
 * memory costs - and no faster for the 1024-row GEMMs it was meant for, whose 64 blocks wait
 * on their loads either way; so skinny_ring_go takes it for 17-32 tokens only. */
#define SK_RING 3

/* Dynamic shared memory of the ring: D stages of (rows a block + 16 NT) rows of 128 bytes. */
template <int NT, int MT = SK_MT, int D = SK_RING>
__host__ __device__ constexpr int sk_ring_bytes() {
    return D * (SK_WARPS * MT * 16 + 2 * NT * 8) * 2 * SK_CHUNK * 2;
}

/* MT: 16-row tiles a warp, as k_skinny's; D: the ring's stages, D - 1 steps in flight. The
 * 64-row blocks of 9-16 tokens take D = 8 (skinny_deep_go): up to 7 steps of a block's share of
 * the columns in flight at once. */
template <ts_dtype DT, int NT, int KS, int MT = SK_MT, int D = SK_RING>
__global__ static void __cluster_dims__(1, KS, 1) __launch_bounds__(32 * SK_WARPS)
    k_skinny_ring(sk_set set, size_t row_bytes, int64_t cols, const uint16_t *x,
                  const float *unscale, int n) {
    constexpr bool BF = DT != TS_DTYPE_F16, US = !BF;
    constexpr int KC = 2, STEP = KC * SK_CHUNK; /* columns a step: 128-byte rows */
    constexpr int XROWS = 2 * NT * 8;           /* hi then lo of each token */
    constexpr int ROWS = SK_WARPS * MT * 16;    /* rows a block */
    constexpr int WTILE = ROWS * STEP, STAGE = WTILE + XROWS * STEP; /* 16-bit values */
    constexpr int THREADS = 32 * SK_WARPS;
    static_assert(ROWS * 8 % THREADS == 0 && XROWS * 8 % THREADS == 0, "whole rounds");
    static_assert(SK_WARPS * MT * NT * 128 * 4 <= sk_ring_bytes<NT, MT, D>(), "room for the sums");
    static_assert(D >= 3, "two steps in flight at least");
    extern __shared__ __align__(16) unsigned char sk_dyn[];
    uint16_t *ring = (uint16_t *)sk_dyn;
    int j = sk_weight_of(set, blockIdx.x);
    int64_t r0 = (int64_t)(blockIdx.x - set.first[j]) * ROWS, rows = set.rows[j];
    const uint8_t *W = set.W[j];
    int64_t nch = cols / STEP, c0 = nch * blockIdx.y / KS;
    int steps = (int)(nch * (blockIdx.y + 1) / KS - c0);
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;

    /* step s's weights into its stage: 8 pieces of 16 bytes a row, rows past the end zero */
    auto stage_w = [&](int s) {
        uint16_t *dst = ring + (s % D) * STAGE;
        size_t col = (size_t)(c0 + s) * STEP * 2;
#pragma unroll
        for (int i = 0; i < ROWS * 8 / THREADS; i++) {
            int p = tid + i * THREADS, row = p / 8, piece = p % 8;
            bool ok = r0 + row < rows;
            const uint8_t *src = ok ? W + (r0 + row) * row_bytes + col + piece * 16 : W;
            cp_async16(dst + row * STEP + sk_piece<KC>(piece, row) * 8, src, ok);
        }
    };
    /* step s's activations after them, as k_skinny stages them: tokens past n zero */
    auto stage_x = [&](int s) {
        uint16_t *dst = ring + (s % D) * STAGE + WTILE;
#pragma unroll
        for (int i = 0; i < XROWS * 8 / THREADS; i++) {
            int p = tid + i * THREADS, row = p / 8, piece = p % 8, part = row / (NT * 8),
                tok = row % (NT * 8);
            bool ok = tok < n;
            const uint16_t *src =
                ok ? x + (int64_t)(part * n + tok) * cols + (c0 + s) * STEP + piece * 8 : x;
            cp_async16(dst + row * STEP + sk_piece<KC>(piece, row) * 8, src, ok);
        }
    };
    /* groups: W0 .. W(D-2), X0 .. X(D-2), then one a step (steps s + D - 1); a step waits for
     * all but the newest D - 2, which hold nothing it needs */
#pragma unroll
    for (int i = 0; i < D - 1; i++) {
        if (steps > i) stage_w(i);
        cp_async_commit();
    }
    cuda_pdl_entry();
#pragma unroll
    for (int i = 0; i < D - 1; i++) {
        if (steps > i) stage_x(i);
        cp_async_commit();
    }

    float acc[MT][NT][4];
    sk_zero(acc);
    for (int s = 0; s < steps; s++) {
        cp_async_wait<D - 2>();
        __syncthreads(); /* step s is in for every thread; every warp is done with step s - 1 */
        if (s + D - 1 < steps) { /* into step s - 1's stage */
            stage_w(s + D - 1);
            stage_x(s + D - 1);
        }
        cp_async_commit();
        const uint16_t *ws = ring + (s % D) * STAGE, *xb = ws + WTILE;
#pragma unroll
        for (int k = 0; k < KC; k++) {
            int col = sk_piece<KC>(k * 4 + t4, g) * 8; /* every row read here has g's parity */
            uint4 w[MT][2];
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    w[m][h] =
                        *(const uint4 *)(ws + (warp * MT * 16 + m * 16 + h * 8 + g) * STEP + col);
            sk_chunk<BF, NT, STEP>(acc, w, xb, g, col);
        }
    }
    cp_async_wait<0>();           /* only empty groups are left; none may land in the sums' space */
    if (KS == 1)
        __syncthreads(); /* every thread past the ring (sk_finish's cluster form
                          * synchronises before it reuses the space) */
    sk_finish<US, NT, KS, MT>(acc, (float *)sk_dyn, set, j, r0, n, unscale);
}

bool cuda_skinny_fits(const cuda_wview *w, int n) {
    bool type = false;
    switch (w->dtype) {
    case TS_DTYPE_BF16: case TS_DTYPE_F16: case TS_DTYPE_Q8_0: case TS_DTYPE_Q4_0:
    case TS_DTYPE_Q5_0: case TS_DTYPE_Q4_K: case TS_DTYPE_Q6_K: type = true; break;
    default: break;
    }
    return type && n > 0 && n <= SK_MAX_TOK && w->cols % SK_CHUNK == 0 && w->cols > 0 &&
           (uintptr_t)w->data % 16 == 0 && w->rows > 0;
}

/* Every ring kernel allowed the ring's largest dynamic shared memory (64 tokens), once a
 * backend, as the tiled attention's kernels are (cuda_ops_seq.cu): the allowance is the
 * device's, and a refusal turns the ring off. */
template <ts_dtype DT, int NT> static bool skinny_ring_allow(const cuda_ctx *c, int bytes) {
    const void *k[] = {
        (const void *)k_skinny_ring<DT, NT, 1>, (const void *)k_skinny_ring<DT, NT, 2>,
        (const void *)k_skinny_ring<DT, NT, 4>, (const void *)k_skinny_ring<DT, NT, 8>};
    return cuda_allow_smem(c, k, 4, bytes);
}

static bool skinny_ring_opt_in(cuda_ctx *c) {
    if (c->skinny_ring_opted) return true;
    constexpr int bytes = sk_ring_bytes<8>();
    if (!skinny_ring_allow<TS_DTYPE_BF16, 2>(c, bytes) ||
        !skinny_ring_allow<TS_DTYPE_BF16, 4>(c, bytes) ||
        !skinny_ring_allow<TS_DTYPE_BF16, 8>(c, bytes) ||
        !skinny_ring_allow<TS_DTYPE_F16, 2>(c, bytes) ||
        !skinny_ring_allow<TS_DTYPE_F16, 4>(c, bytes) ||
        !skinny_ring_allow<TS_DTYPE_F16, 8>(c, bytes)) {
        c->skinny_ring = 0;
        return false;
    }
    c->skinny_ring_opted = true;
    return true;
}

/* Whether 16-bit weights with whole steps of 64 columns take the ring: by default for 17-32
 * tokens (token groups of 4) only, where it measured faster; TESSERA_CUDA_SKINNY_RING=1 for
 * any count, =0 never (cuda_int.cuh). */
template <ts_dtype DT, int NT, int KS>
static bool skinny_ring_go(cuda_ctx *c, const sk_set &set, int64_t cols, const uint16_t *x,
                           const float *us, int n, dim3 grid) {
    if constexpr (DT != TS_DTYPE_BF16 && DT != TS_DTYPE_F16) {
        return false;
    } else {
        bool take = c->skinny_ring == 1 || (c->skinny_ring == 2 && NT == 4);
        if (!take || cols % (2 * SK_CHUNK) || !skinny_ring_opt_in(c)) return false;
        cuda_launch(c, "gemm_skinny", k_skinny_ring<DT, NT, KS>, grid, 32 * SK_WARPS,
                    sk_ring_bytes<NT>(), set, cuda_row_bytes(DT, cols), cols, x, us, n);
        return true;
    }
}

/* The ring's stages for skinny_deep_go: 7 steps in flight, a 1024-row GEMM's whole share of a
 * 3584-column matrix in clusters of 8 (96 KB of shared memory for 9-16 tokens). */
#define SK_DEEP 8

/* 64-row blocks of 16-bit weights (skinny_go's short grids) through the ring with D = SK_DEEP:
 * k_skinny's 64-row form has one step of loads in flight per synchronisation, and with about
 * one block a multiprocessor each step waits for its loads. The same mmas in the same order:
 * the same sums, bit for bit. 8 / 16 sequences of the 0.8B BF16 on an H200 +4-7% / +6% (the
 * same binary, TESSERA_CUDA_SKINNY_DEEP=0 against default; bench/RESULTS.md). False where it is
 * off or the device refuses its shared memory. */
template <ts_dtype DT, int NT>
static bool skinny_deep_go(cuda_ctx *c, const sk_set &half, int64_t cols, const uint16_t *x,
                           const float *us, int n, dim3 grid) {
    /* token groups of 2 (9-16 tokens) only: for 64 tokens it measured slower (the 0.8B's
     * 1024-row GEMMs 13.5 / 18.3 -> 28.7 / 40.0 us under ncu, 64 sequences -16%) */
    if constexpr ((DT != TS_DTYPE_BF16 && DT != TS_DTYPE_F16) || NT != 2) {
        return false;
    } else {
        constexpr int bytes = sk_ring_bytes<NT, 1, SK_DEEP>();
        constexpr unsigned bit = DT == TS_DTYPE_F16 ? 2u : 1u;
        auto k = k_skinny_ring<DT, NT, 8, 1, SK_DEEP>;
        if (!c->skinny_deep || cols % (2 * SK_CHUNK)) return false;
        if (!(c->skinny_deep_opted & bit)) {
            const void *kp = (const void *)k;
            if (!cuda_allow_smem(c, &kp, 1, bytes)) {
                c->skinny_deep = false;
                return false;
            }
            c->skinny_deep_opted |= bit;
        }
        cuda_launch(c, "gemm_skinny", k, grid, 32 * SK_WARPS, bytes, half, cuda_row_bytes(DT, cols),
                    cols, x, us, n);
        return true;
    }
}

/* 64-row blocks of 17-64 tokens (NT = 4, 8) in clusters of 16 instead of 8: twice the blocks
 * where clusters of 8 leave about one block a multiprocessor (the 0.8B's 1024-row GEMMs: ~7%
 * achieved occupancy, DRAM throughput ~10% under ncu - latency-bound; for 17-32 tokens of
 * 16-bit weights it replaces the ring's 128-row blocks there). Each block sums half the columns
 * of the 8-block form; the cluster adds 16 partial sums in the blocks' order - other bits than
 * the 8-block forms (test_cuda's ring test compares forms with this off). On an H200 the 0.8B
 * BF16's 20 / 32 / 48 / 64 sequences +4 / +4 / +5 / +3.3%, its Q4_K_M level to +1%
 * (bench/RESULTS.md). False where it is off or the device refuses the cluster size. */
template <ts_dtype DT, int NT>
static bool skinny_ks16_go(cuda_ctx *c, const sk_set &half, size_t rb, int64_t cols,
                           const uint16_t *x, const float *us, int n, bool pf, unsigned gx) {
    if constexpr (NT < 4) {
        return false;
    } else {
        auto k = k_skinny<DT, NT, 16, 2, 1>;
        unsigned bit = (1u << ((unsigned)DT & 15u)) << (NT == 8 ? 16 : 0); /* a kernel each */
        if (!c->skinny_ks16 || cols / (2 * SK_CHUNK) < 32) return false;
        if (!(c->skinny_ks16_opted & bit)) {
            if (cudaFuncSetAttribute((const void *)k,
                                     cudaFuncAttributeNonPortableClusterSizeAllowed,
                                     1) != cudaSuccess) {
                cudaGetLastError();
                c->skinny_ks16 = false;
                return false;
            }
            c->skinny_ks16_opted |= bit;
        }
        cuda_launch(c, "gemm_skinny", k, dim3(gx, 16), 32 * SK_WARPS, 0, half, rb, cols, x, us, n,
                    pf);
        return true;
    }
}

template <ts_dtype DT, int NT, int KS>
static void skinny_go(cuda_ctx *c, const sk_set &set, int64_t cols, const uint16_t *x,
                      const float *us, int n) {
    dim3 grid((unsigned)set.first[set.nw], KS);
    size_t rb = cuda_row_bytes(DT, cols);
    /* the L2 prefetch for quantized weights only: for 16-bit ones it cost the BF16 0.8B's 8 / 64
     * sequences 9% / 4% and the 2B's 10% / 7% (H200), quantized ones were level */
    bool pf = c->prefetch && DT != TS_DTYPE_BF16 && DT != TS_DTYPE_F16;
    bool kc2 = c->skinny_kc == 2 && cols % (2 * SK_CHUNK) == 0;
    /* clusters of 8 that still leave the GPU short of blocks (the 0.8B's 1024-row matrices: 64
     * blocks, one a multiprocessor): blocks of half the rows, twice as many, 148 registers a
     * thread instead of 234 (TESSERA_CUDA_SKINNY_MT1=0: never). Each row's sums are the same
     * either way. Taken for every cluster of 8 it was level (the gated MLPs' 448 blocks became
     * 896); so was the cluster's size chosen by waves of blocks x steps (and 32 sequences -6%). */
    bool short_grid = KS == 8 && kc2 && c->skinny_mt1 && grid.x * KS < 2 * (unsigned)c->sm_count;
    sk_set half;
    if (short_grid) {
        half = set;
        sk_blocks(half, SK_WARPS * 16);
    }
    unsigned half_x = short_grid ? (unsigned)half.first[half.nw] : 0;
    /* 17-32 tokens there: clusters of 16 before the ring, which does not help those grids */
    if (short_grid && NT == 4 && skinny_ks16_go<DT, NT>(c, half, rb, cols, x, us, n, pf, half_x))
        return;
    if (skinny_ring_go<DT, NT, KS>(c, set, cols, x, us, n, grid)) return;
    if (short_grid) {
        grid.x = half_x;
        if (skinny_deep_go<DT, NT>(c, half, cols, x, us, n, grid)) return;
        if (skinny_ks16_go<DT, NT>(c, half, rb, cols, x, us, n, pf, grid.x)) return;
        cuda_launch(c, "gemm_skinny", k_skinny<DT, NT, KS, 2, 1>, grid, 32 * SK_WARPS, 0, half, rb,
                    cols, x, us, n, pf);
        return;
    }
    if (kc2)
        cuda_launch(c, "gemm_skinny", k_skinny<DT, NT, KS, 2>, grid, 32 * SK_WARPS, 0, set, rb,
                    cols, x, us, n, pf);
    else
        cuda_launch(c, "gemm_skinny", k_skinny<DT, NT, KS, 1>, grid, 32 * SK_WARPS, 0, set, rb,
                    cols, x, us, n, pf);
}

/* The column split: the fewest blocks per cluster (1, 2, 4, 8) that give the GPU two blocks per
 * multiprocessor, no more than half the chunks of columns. */
template <ts_dtype DT, int NT>
static void skinny_ks(cuda_ctx *c, const sk_set &set, int64_t cols, const uint16_t *x,
                      const float *us, int n) {
    int64_t bx = set.first[set.nw], nch = cols / (SK_CHUNK * (c->skinny_kc == 2 ? 2 : 1));
    int ks = 1;
    while (ks < 8 && bx * ks < 2 * (int64_t)c->sm_count && 2 * ks <= nch) ks *= 2;
    switch (ks) {
    case 1: skinny_go<DT, NT, 1>(c, set, cols, x, us, n); break;
    case 2: skinny_go<DT, NT, 2>(c, set, cols, x, us, n); break;
    case 4: skinny_go<DT, NT, 4>(c, set, cols, x, us, n); break;
    default: skinny_go<DT, NT, 8>(c, set, cols, x, us, n); break;
    }
}

template <ts_dtype DT>
static void skinny_nt(cuda_ctx *c, const sk_set &set, int64_t cols, const uint16_t *x,
                      const float *us, int n) {
    if (cuda_wg_gemm(c, set, DT, cols, x, us, n)) return; /* 16-bit weights on Hopper's wgmma */
    if (n <= 16)
        skinny_ks<DT, 2>(c, set, cols, x, us, n);
    else if (n <= 32)
        skinny_ks<DT, 4>(c, set, cols, x, us, n);
    else
        skinny_ks<DT, 8>(c, set, cols, x, us, n);
}

void cuda_skinny_gemm(cuda_ctx *c, const cuda_wview *w, int nw, const uint16_t *x,
                      const float *unscale, int n, float *const *y, const int64_t *ldy, bool acc) {
    sk_set set = {};
    set.nw = nw;
    set.acc = acc;
    for (int j = 0; j < nw; j++) {
        set.W[j] = (const uint8_t *)w[j].data;
        set.y[j] = y[j];
        set.rows[j] = w[j].rows;
        set.ldy[j] = ldy[j];
    }
    sk_blocks(set, SK_ROWS);
    int64_t cols = w[0].cols;
    switch (w[0].dtype) {
    case TS_DTYPE_BF16: skinny_nt<TS_DTYPE_BF16>(c, set, cols, x, unscale, n); break;
    case TS_DTYPE_F16: skinny_nt<TS_DTYPE_F16>(c, set, cols, x, unscale, n); break;
    case TS_DTYPE_Q8_0: skinny_nt<TS_DTYPE_Q8_0>(c, set, cols, x, unscale, n); break;
    case TS_DTYPE_Q4_0: skinny_nt<TS_DTYPE_Q4_0>(c, set, cols, x, unscale, n); break;
    case TS_DTYPE_Q5_0: skinny_nt<TS_DTYPE_Q5_0>(c, set, cols, x, unscale, n); break;
    case TS_DTYPE_Q4_K: skinny_nt<TS_DTYPE_Q4_K>(c, set, cols, x, unscale, n); break;
    case TS_DTYPE_Q6_K: skinny_nt<TS_DTYPE_Q6_K>(c, set, cols, x, unscale, n); break;
    default: cuda_check(c, cudaErrorInvalidValue, "skinny GEMM: weight type");
    }
}
