/* One token's GEMV for 16-bit weights (BF16, F16): the decode step of one sequence, where the
 * kernels are short and their fixed costs are the step's time.
 *
 * The general GEMV (cuda_matmul.cu) keeps a warp on one row with up to 8 tokens' sums in
 * registers: two 16-byte loads of a row in flight per lane, a warp per row and as many blocks
 * as rows / 4. On an H200 (ncu, one 0.8B decode step) that left the 1024-row output and down
 * projections at 0.6 TB/s (a warp walks a 2048- or 3584-column row in 4 or 7 dependent rounds of
 * loads) and the 8224-row input projection at 1.2 TB/s, with 2.6 waves of blocks.
 *
 * Here a lane issues all its loads of a row at once (G1_U 16-byte groups: a 2048-column row is
 * one round), and the grid is capped at what the GPU holds at once (TESSERA_CUDA_GEMV1 waves,
 * default 1): warp w takes rows w, w + W, ... (two at a time where every warp has two or more).
 * Each row is summed in the general GEMV's order. Measured on an H200, the same binary
 * alternating (`tessera bench -p 16 -n 128 -r 3`, 0.8B BF16): tg128 786-832 (general GEMV) against 850-921 t/s; caps of half a
 * wave (767-773: the lm_head's 248k rows then go round in too few warps) or of 2-16 waves
 * (855-886) were slower. Each GEMV also asking L2 for the next one's weights (a queued op
 * amended with its successor's) changed nothing: 1.060-1.064 ms a step with and without.
 * Its warps asking L2 for all their rows before the programmatic wait (as the general GEMV
 * does) cost the 0.8B BF16 ~8% (tg128 859-871 against 925-979 asking nothing) and the 2B ~7%
 * (509-523 against 546-567): the lm_head's 0.5-1 GB asked at once overflows L2. An ask capped
 * at half of L2 recovered most of it (888-934, 544-557), none at all the rest; so none. */
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_int.cuh"

#define G1_WARPS 4
#define G1_SET   4
/* 16-byte groups of a row a lane has in flight. (4 for rows of up to 1024 columns, whose lanes
 * have no more, with fewer registers and so more warps in the capped grid, measured level on
 * an H200: tg128 872-901 against 856-899 t/s.) */
#define G1_U 8

typedef struct {
    const uint8_t *W[G1_SET];
    float *y[G1_SET];
    int64_t end[G1_SET]; /* global row o is weight j's for the first j with o < end[j] */
    int nw;
} g1_set;

/* Where the kernel's rows come from: a stack of weights (plain, acc) or the gate and up
 * weights of a gated MLP (glu). */
typedef struct {
    g1_set set;
    const uint8_t *Wg, *Wu;
    float *out;
    int64_t rows;
    size_t row_bytes;
    int64_t cols;
    const float *x;
    const float *norm_w; /* the input RMSNorm's weights, or NULL */
    float eps;
    bool acc; /* y += instead of y = */
} g1_args;

enum { G1_PLAIN, G1_SILU, G1_GELU };

__device__ static inline uint4 g1_load(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Row o of the kernel's first (or only) weight: its bytes, or NULL past the end. */
template <int MODE>
__device__ static inline const uint8_t *g1_row(const g1_args &a, int64_t o, int r, int *j_out) {
    if (o >= a.rows) return nullptr;
    if (MODE != G1_PLAIN) return (r ? a.Wu : a.Wg) + o * a.row_bytes;
    int j = 0;
    while (j < a.set.nw - 1 && o >= a.set.end[j])
        j++;
    *j_out = j;
    return a.set.W[j] + (o - (j ? a.set.end[j - 1] : 0)) * a.row_bytes;
}

/* The lane's partial sums of NR rows (acc[i]) over the whole rows, G1_U groups a round, in the
 * general GEMV's order (group lane, lane + 32, ...); ss: the lane's share of x's sum of squares
 * where want_ss (a warp's first rows, NORM). */
template <ts_dtype DT, int NR, bool NORM>
__device__ static inline void g1_dot(const uint8_t *const *row, int64_t ge, const float *x,
                                     const float *nw, int lane, float *acc, bool want_ss,
                                     float *ss) {
    for (int64_t g0 = 0; g0 < ge; g0 += 32 * G1_U) {
        uint4 q[NR][G1_U];
#pragma unroll
        for (int u = 0; u < G1_U; u++) {
            int64_t gi = g0 + u * 32 + lane;
#pragma unroll
            for (int i = 0; i < NR; i++)
                if (gi < ge && row[i]) q[i][u] = g1_load(row[i] + gi * 16);
        }
#pragma unroll
        for (int u = 0; u < G1_U; u++) {
            int64_t gi = g0 + u * 32 + lane;
            if (gi >= ge) break;
            float4 xa = *(const float4 *)(x + gi * 8), xb = *(const float4 *)(x + gi * 8 + 4);
            if constexpr (NORM) {
                if (want_ss) {
                    *ss += xa.x * xa.x + xa.y * xa.y + xa.z * xa.z + xa.w * xa.w;
                    *ss += xb.x * xb.x + xb.y * xb.y + xb.z * xb.z + xb.w * xb.w;
                }
                float4 ma = *(const float4 *)(nw + gi * 8), mb = *(const float4 *)(nw + gi * 8 + 4);
                xa.x *= ma.x, xa.y *= ma.y, xa.z *= ma.z, xa.w *= ma.w;
                xb.x *= mb.x, xb.y *= mb.y, xb.z *= mb.z, xb.w *= mb.w;
            }
#pragma unroll
            for (int i = 0; i < NR; i++) {
                if (!row[i]) continue;
                float w[8];
                half8<DT>(q[i][u], w);
                float s = acc[i];
                s += w[0] * xa.x + w[1] * xa.y + w[2] * xa.z + w[3] * xa.w;
                s += w[4] * xb.x + w[5] * xb.y + w[6] * xb.z + w[7] * xb.w;
                acc[i] = s;
            }
        }
    }
}

/* A warp per row (MODE G1_PLAIN: R rows of the stack a round, rows o and o + W; glu: a row of
 * gate and up), the rows o = w, w + W, ... of warp w. (A row split over 2 or 4 warps of a
 * block, the parts added in shared memory, measured slower on an H200: 0.8B BF16 tg128 785-861
 * against 895-921.) */
template <ts_dtype DT, int MODE, int R, bool NORM>
__global__ static void __launch_bounds__(32 * G1_WARPS) k_gemv_one(g1_args a) {
    constexpr int NR = MODE == G1_PLAIN ? R : 2; /* rows summed together by a warp */
    const int lane = threadIdx.x & 31;
    const int64_t W = (int64_t)gridDim.x * G1_WARPS; /* the row stride between a warp's rows */
    const int64_t w0 = (int64_t)blockIdx.x * G1_WARPS + (threadIdx.x >> 5);
    const int64_t step = MODE == G1_PLAIN ? R * W : W, groups = a.cols / 8;
    int jr[NR];
    cuda_pdl_entry();
    float ss = 0.0f, inv = 1.0f;
    bool first = true;
    for (int64_t o = w0; o < a.rows; o += step) {
        const uint8_t *row[NR];
#pragma unroll
        for (int i = 0; i < NR; i++) {
            jr[i] = 0;
            row[i] = MODE == G1_PLAIN ? g1_row<MODE>(a, o + i * W, 0, &jr[i])
                                      : g1_row<MODE>(a, o, i, &jr[i]);
        }
        float acc[NR];
#pragma unroll
        for (int i = 0; i < NR; i++)
            acc[i] = 0.0f;
        g1_dot<DT, NR, NORM>(row, groups, a.x, a.norm_w, lane, acc, first, &ss);
        if (NORM && first) inv = 1.0f / sqrtf(cuda_warp_sum(ss) / (float)a.cols + a.eps);
        first = false;
        float s[NR];
#pragma unroll
        for (int i = 0; i < NR; i++)
            s[i] = cuda_warp_sum(acc[i]) * (NORM ? inv : 1.0f);
        if (lane) continue;
        if constexpr (MODE == G1_PLAIN) {
#pragma unroll
            for (int i = 0; i < NR; i++) {
                if (!row[i]) continue;
                int64_t oi = o + i * W, j = jr[i];
                float *yo = &a.set.y[j][oi - (j ? a.set.end[j - 1] : 0)];
                *yo = a.acc ? *yo + s[i] : s[i];
            }
        } else {
            a.out[o] = cuda_glu<MODE == G1_GELU>(s[0], s[1]);
        }
    }
}

/* Blocks of the kernel the GPU holds at once per multiprocessor (asked once per kernel). */
template <ts_dtype DT, int MODE, int R, bool NORM> static int g1_per_sm(void) {
    static const int per_sm = [] {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv_one<DT, MODE, R, NORM>,
                                                          32 * G1_WARPS, 0) != cudaSuccess ||
            n < 1)
            n = 1;
        return n;
    }();
    return per_sm;
}

/* Blocks for rows (rows_per_block a round) under the cap of gemv_one_waves times what the GPU
 * holds at once. */
static unsigned g1_grid(const cuda_ctx *c, int per_sm, int64_t rows, int rows_per_block) {
    int64_t need = (rows + rows_per_block - 1) / rows_per_block;
    int64_t cap = (int64_t)c->sm_count * per_sm * c->gemv_one_waves;
    if (cap < 1) cap = 1;
    return (unsigned)(need < cap ? need : cap);
}

/* Whether the single-token kernel takes these weights and x: 16-bit types, rows of whole
 * 16-byte groups, x (and the norm's weights) 16-byte aligned. */
static bool g1_fits(const cuda_ctx *c, const cuda_wview *w, int nw, const float *x,
                    const float *norm_w) {
    if (!c->gemv_one_waves || (uintptr_t)x % 16 || (uintptr_t)norm_w % 16 || nw > G1_SET)
        return false;
    for (int j = 0; j < nw; j++)
        if ((w[j].dtype != TS_DTYPE_BF16 && w[j].dtype != TS_DTYPE_F16) ||
            w[j].dtype != w[0].dtype || w[j].cols != w[0].cols || w[j].cols % 8)
            return false;
    return true;
}

template <ts_dtype DT, int MODE, int R, bool NORM>
static void g1_launch(cuda_ctx *c, const char *name, const g1_args &a) {
    int rpb = (MODE == G1_PLAIN ? R : 1) * G1_WARPS;
    unsigned g = g1_grid(c, g1_per_sm<DT, MODE, R, NORM>(), a.rows, rpb);
    cuda_launch(c, name, k_gemv_one<DT, MODE, R, NORM>, g, 32 * G1_WARPS, 0, a);
}

template <int MODE, int R>
static void g1_dispatch(cuda_ctx *c, const char *name, ts_dtype dt, const g1_args &a) {
    bool norm = a.norm_w != nullptr;
    if (dt == TS_DTYPE_BF16)
        norm ? g1_launch<TS_DTYPE_BF16, MODE, R, true>(c, name, a)
             : g1_launch<TS_DTYPE_BF16, MODE, R, false>(c, name, a);
    else
        norm ? g1_launch<TS_DTYPE_F16, MODE, R, true>(c, name, a)
             : g1_launch<TS_DTYPE_F16, MODE, R, false>(c, name, a);
}

bool cuda_gemv_one(cuda_ctx *c, const cuda_wview *w, int nw, const float *x, float *const *y,
                   const float *norm_w, float eps, bool acc) {
    if (!g1_fits(c, w, nw, x, norm_w)) return false;
    g1_args a = {};
    int64_t rows = 0;
    for (int j = 0; j < nw; j++) {
        a.set.W[j] = (const uint8_t *)w[j].data;
        a.set.y[j] = y[j];
        a.set.end[j] = rows += w[j].rows;
    }
    a.set.nw = nw, a.rows = rows, a.row_bytes = (size_t)w[0].cols * 2, a.cols = w[0].cols;
    a.x = x, a.norm_w = norm_w, a.eps = eps, a.acc = acc;
    /* two rows a round where every warp of the capped grid has at least two */
    int per_sm = g1_per_sm<TS_DTYPE_BF16, G1_PLAIN, 1, false>();
    const char *name = norm_w ? "gemv_norm" : "gemv";
    if (rows >= 2 * (int64_t)g1_grid(c, per_sm, rows, G1_WARPS) * G1_WARPS)
        g1_dispatch<G1_PLAIN, 2>(c, name, w[0].dtype, a);
    else
        g1_dispatch<G1_PLAIN, 1>(c, name, w[0].dtype, a);
    return true;
}

bool cuda_gemv_one_glu(cuda_ctx *c, const cuda_wview *g, const cuda_wview *u, const float *x,
                       const float *norm_w, float eps, bool gelu, float *out) {
    cuda_wview gu[2] = {*g, *u};
    if (!g1_fits(c, gu, 2, x, norm_w) || g->rows != u->rows) return false;
    g1_args a = {};
    a.set.nw = 0;
    a.Wg = (const uint8_t *)g->data, a.Wu = (const uint8_t *)u->data, a.out = out;
    a.rows = g->rows, a.row_bytes = (size_t)g->cols * 2, a.cols = g->cols;
    a.x = x, a.norm_w = norm_w, a.eps = eps;
    if (gelu)
        g1_dispatch<G1_GELU, 1>(c, "gemv_glu", g->dtype, a);
    else
        g1_dispatch<G1_SILU, 1>(c, "gemv_glu", g->dtype, a);
    return true;
}
