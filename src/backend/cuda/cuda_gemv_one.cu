/* One token's GEMV for 16-bit weights (BF16, F16) and the quantized types (Q4_K, Q6_K, Q8_0,
 * Q4_0, Q5_0): the decode step of one sequence, where the kernels are short and their fixed
 * costs are the step's time - and of two or three sequences (G1_TOKENS), each weight loaded
 * once for all of them.
 *
 * The general GEMV (cuda_matmul.cu) keeps a warp on one row with up to 8 tokens' sums in
 * registers: two 16-byte loads of a row in flight per lane, a warp per row and as many blocks
 * as rows / 4. On an H200 (ncu, one 0.8B decode step) that left the 1024-row output and down
 * projections at 0.6 TB/s (a warp walks a 2048- or 3584-column row in 4 or 7 dependent rounds of
 * loads) and the 8224-row input projection at 1.2 TB/s, with 2.6 waves of blocks.
 *
 * Here the grid is capped at what the GPU holds at once (TESSERA_CUDA_GEMV1 waves, default 1)
 * and the whole matrix is in flight in one round where it fits: a lane keeps U 16-byte groups
 * of each of NR rows in registers (U by the row's length, NR the fewest rows a warp that cover
 * the matrix in one round of the grid; G1_LOADS below), issues all those loads at once - the
 * first round before the programmatic wait, since no kernel writes weights - and then sums.
 * Each row is summed in the general GEMV's order, so the bits do not depend on U or NR.
 *
 * Measured on an H200 (`tessera bench -p 16 -n 128 -r 3`, alternating): the first version
 * (a lane's loads of one row at once, 8 groups whatever the row's length, a second row only
 * where every warp had two) against the general GEMV, 0.8B BF16 tg128 850-921 against 786-832;
 * caps of half a wave or 2-16 waves were slower. Its first round loaded before the wait: 0.8B
 * 985-1009 -> 1016-1042, 2B 575-579 -> 595-597. U and NR by the shape (the 0.8B's input
 * projection and gated MLP in one round instead of 2-3 and 1-2, the down projection's
 * 3584-column rows in one instead of two, 16 loads a lane in the lm_head instead of 8): 0.8B
 * 987-992 -> 1097-1120 (a step's graph 987 -> 868 us), 2B 560-575 -> 630-644. Not kept: each
 * GEMV asking L2 for the next one's weights (a step 1.060-1.064 ms with and without), or its
 * warps asking L2 for all their rows before the wait, as the general GEMV does (0.8B -8%, 2B
 * -7%: the lm_head's 0.5-1 GB asked at once overflows L2; an ask capped at half of L2 was
 * still behind asking nothing).
 *
 * The K-quants go by 32-element units (unit32's), a lane keeping the raw bytes of each unit -
 * Q4_K 8 registers, Q6_K 11 - instead of its 32 decoded floats, and decoding them with unit32's
 * formulas after the loads: the general GEMV's sums, bit for bit (g1_fmt). H200, 0.8B Q4_K_M
 * (with Q6_K regrouped on the device): a step 1209 -> 1080 us, tg128 772-777 -> 864-874. */
#include "backend/cuda/cuda_gemv_one.cuh"

#include <mutex>

template <ts_dtype DT, int MODE, int U, int NR, bool NORM, bool XS = false, int T = 1, int L = 32>
__global__ static void __launch_bounds__(32 * G1_WARPS) k_gemv_one(g1_args a) {
    g1_body<DT, MODE, U, NR, NORM, XS, T, L>(a, g1_whole(a), blockIdx.x, gridDim.x);
}

/* Blocks of the kernel the GPU holds at once per multiprocessor with smem bytes of shared
 * memory (asked once per kernel and size: a model has a few sizes; past 8 asked each time).
 * Without shared memory - most launches - a plain static. */
template <ts_dtype DT, int MODE, int U, int NR, bool NORM, bool XS, int T, int L = 32>
static int g1_per_sm(size_t smem) {
    auto ask = [](size_t bytes) {
        return g1_occupancy(k_gemv_one<DT, MODE, U, NR, NORM, XS, T, L>, bytes);
    };
    static const int plain = ask(0);
    if (!smem) return plain;
    static std::mutex lock;
    static size_t sizes[8];
    static int counts[8], known;
    std::lock_guard<std::mutex> hold(lock);
    for (int i = 0; i < known; i++)
        if (sizes[i] == smem) return counts[i];
    int n = ask(smem);
    if (known < 8) sizes[known] = smem, counts[known++] = n;
    return n;
}

/* Whether x (cols floats of each of n tokens, 16-byte aligned: g1_fits) goes through shared
 * memory, for 16-bit weights a row a warp (the only form that can): where the grid is at most
 * two blocks a multiprocessor (fit) and rows of 2048 columns and more (up to 48 KB in all).
 * Measured on an H200 (bench/RESULTS.md): the 0.8B's 1024-row output and down projections, where
 * each warp read all of x from L2, a step 3.7% faster; slower wherever more warps share a
 * multiprocessor (the 2B's 2048-row projections, grids of 1024-column rows) or a warp takes
 * quantized units (their x reads, 128 bytes apart from lane to lane, meet in the same banks). */
static bool g1_xs_takes(const cuda_ctx *c, int64_t cols, int n, bool fit) {
    if (n * cols * 4 > 48 * 1024 || cols % 4) return false;
    return c->gemv_one_xsmem == 2 || (c->gemv_one_xsmem == 1 && fit && cols >= 2048);
}

/* Whether quantized rows that go round, by integer dot products with L lanes of U units each
 * covering a row, take x's int8 runs staged once a block in shared memory (g1_body's XS for
 * quantized weights, g1_x8_stage) instead of each lane's own in registers for the kernel's life
 * (TESSERA_CUDA_GEMV1_XSMEM=0: never). The same values and sums in the same order: the same
 * bits. H200 (bench/RESULTS.md): 28-36 registers a lane fewer; Gemma 3's Q8_0 head 60.2 -> 57.7
 * us, five blocks a multiprocessor instead of four; the Qwen3.5 0.8B's Q6_K head by whole warps
 * 87.9 -> 77.1, by half warps 72.2 -> 71.1. */
template <ts_dtype DT> static bool g1_x8_takes(const cuda_ctx *c, const g1_args &a, int L, int U) {
    return c->gemv_one_xsmem != 0 && a.i8 && a.cols / g1_fmt<DT>::ELEMS <= L * U;
}

/* Blocks that cover rows rows in one round at NO outputs a warp */
static int64_t g1_need(int64_t rows, int no) {
    return (rows + no * G1_WARPS - 1) / (no * G1_WARPS);
}

/* Blocks in one round of the capped grid: gemv_one_waves times what the GPU holds at once
 * (per_sm blocks a multiprocessor), at least one */
static int64_t g1_cap(const cuda_ctx *c, int per_sm) {
    int64_t cap = (int64_t)c->sm_count * per_sm * c->gemv_one_waves;
    return cap < 1 ? 1 : cap;
}

/* Launches the kernel with x's int8 runs staged (g1_x8_takes said so) on at most need blocks,
 * one round of the capped grid at most */
template <ts_dtype DT, int MODE, int U, int NR, bool NORM, int T, int L = 32>
static void g1_launch_x8(cuda_ctx *c, const char *name, const g1_args &a, int64_t need) {
    size_t bytes = (size_t)T * (size_t)(a.cols / g1_fmt<DT>::ELEMS) * sizeof(g1_x8);
    int64_t cap = g1_cap(c, g1_per_sm<DT, MODE, U, NR, NORM, true, T, L>(bytes));
    cuda_launch(c, name, k_gemv_one<DT, MODE, U, NR, NORM, true, T, L>,
                (unsigned)(need < cap ? need : cap), 32 * G1_WARPS, bytes, a);
    c->gemv_x8_staged_launches++;
}

/* Launches the kernel with NR rows a warp where one round of the capped grid (gemv_one_waves
 * times what the GPU holds at once) covers every row, or where last; false (nothing launched)
 * otherwise, so that the caller tries more rows a warp. */
template <ts_dtype DT, int MODE, int U, int NR, bool NORM, int T>
static bool g1_try(cuda_ctx *c, const char *name, g1_args a, bool last) {
    constexpr int NO = MODE == G1_PLAIN ? NR : NR / 2;
    /* the form that stages x exists for 16-bit weights a row a warp only: its batch of x loads
     * takes registers every other form would pay for in blocks a multiprocessor */
    constexpr bool XS_OK = g1_fmt<DT>::ELEMS == 8 && MODE == G1_PLAIN && NR == 1;
    int64_t need = g1_need(a.rows, NO);
    bool xs = XS_OK && g1_xs_takes(c, a.cols, T, need <= 2 * (int64_t)c->sm_count);
    size_t smem = xs ? (size_t)(T * a.cols) * 4 : 0;
    int per_sm = xs ? g1_per_sm<DT, MODE, U, NR, NORM, XS_OK, T>(smem)
                    : g1_per_sm<DT, MODE, U, NR, NORM, false, T>(0);
    int64_t cap = g1_cap(c, per_sm);
    if (need > cap && !last) return false;
    if constexpr (g1_has8<DT>() && !NORM) {
        if (need > cap && g1_x8_takes<DT>(c, a, 32, U)) { /* rows go round: x8 staged */
            g1_launch_x8<DT, MODE, U, NR, NORM, T>(c, name, a, need);
            return true;
        }
    }
    unsigned grid = (unsigned)(need < cap ? need : cap);
    if constexpr (XS_OK) {
        if (xs) {
            cuda_launch(c, name, k_gemv_one<DT, MODE, U, NR, NORM, true, T>, grid, 32 * G1_WARPS,
                        smem, a);
            return true;
        }
    }
    cuda_launch(c, name, k_gemv_one<DT, MODE, U, NR, NORM, false, T>, grid, 32 * G1_WARPS, 0, a);
    return true;
}

/* Rows that go round even at the most rows a warp (NR, U units a lane: the output head), of
 * Q6_K by integer dot products: the half-warp form (g1_body's L = 16; 2 U units a lane of NR / 2
 * rows a half, the same registers), where a lane's units cover the row and it has rows to halve;
 * false (nothing launched) otherwise. TESSERA_CUDA_GEMV1_HALF=0: never. H200, the 0.8B's head
 * (248320 x 1024): Q6_K 88.2 -> 72.2 us (the Q4_K_M file's tg128 +1.5-2.3%); Q8_0, whose units
 * decode in a few instructions, 77.2 -> 79.5, so it keeps whole warps (bench/RESULTS.md; so do
 * Gemma 3's 640-column Q8_0 rows, which quarter warps did not make faster).
 * Its bits are not whole warps', so one token and two must take it alike (a token's bits the
 * same alone or beside another): only where the two-token form exists (a unit a lane, rows of
 * up to 32 units), and rows that go round counted by one token's grid whatever T is. x's int8
 * runs staged in shared memory where g1_x8_takes (71.1 against 72.2 us on that head). */
template <ts_dtype DT, int MODE, int U, int NR, bool NORM, int T>
static bool g1_try_half(cuda_ctx *c, const char *name, const g1_args &a) {
    constexpr int NR0 = MODE == G1_PLAIN ? 1 : 2, NH = NR / 2, NO = MODE == G1_PLAIN ? NR : NR / 2;
    constexpr bool Q8 = DT == TS_DTYPE_Q6_K && G1_QTOKENS * 2 * U <= G1_I8_UNITS;
    if constexpr (!Q8 || NH < NR0) {
        return false;
    } else {
        if (!c->gemv_one_half || !a.i8 || a.cols / g1_fmt<DT>::ELEMS > 16 * 2 * U) return false;
        if (g1_need(a.rows, NO) <= g1_cap(c, g1_per_sm<DT, MODE, U, NR, NORM, false, 1>(0)))
            return false; /* one round: nothing to share */
        c->gemv_half_launches++;
        if constexpr (!NORM) {
            if (g1_x8_takes<DT>(c, a, 16, 2 * U)) { /* a whole round: rows go round */
                g1_launch_x8<DT, MODE, 2 * U, NH, NORM, T, 16>(c, name, a, INT64_MAX);
                return true;
            }
        }
        int64_t cap = g1_cap(c, g1_per_sm<DT, MODE, 2 * U, NH, NORM, false, T, 16>(0));
        cuda_launch(c, name, k_gemv_one<DT, MODE, 2 * U, NH, NORM, false, T, 16>, (unsigned)cap,
                    32 * G1_WARPS, 0, a);
        return true;
    }
}

/* NR, 2 NR, ... rows a warp, up to what G1_LOADS allows with U units of each: the fewest that
 * cover the matrix in one round, or the most. */
template <ts_dtype DT, int MODE, int U, int NR, bool NORM, int T>
static void g1_rows_ladder(cuda_ctx *c, const char *name, const g1_args &a) {
    if constexpr (2 * NR * U * g1_fmt<DT>::LOADS > G1_LOADS) {
        if (!g1_try_half<DT, MODE, U, NR, NORM, T>(c, name, a))
            g1_try<DT, MODE, U, NR, NORM, T>(c, name, a, true);
    } else if (!g1_try<DT, MODE, U, NR, NORM, T>(c, name, a, false))
        g1_rows_ladder<DT, MODE, U, 2 * NR, NORM, T>(c, name, a);
}

/* The units a lane keeps of each row: U, 2 U, ... until they hold the lane's share of a row
 * (per_lane) or a warp's fewest rows (one, two for the gated MLP's gate and up) fill G1_LOADS;
 * longer rows go round. Then the rows a warp. */
template <ts_dtype DT, int MODE, int U, bool NORM, int T>
static void g1_shape(cuda_ctx *c, const char *name, const g1_args &a, int64_t per_lane) {
    constexpr int NR0 = MODE == G1_PLAIN ? 1 : 2; /* two rows (gate, up) an output */
    if constexpr (2 * U * NR0 * g1_fmt<DT>::LOADS <= G1_LOADS) { /* 2 U would still fit */
        if (per_lane > U) return g1_shape<DT, MODE, 2 * U, NORM, T>(c, name, a, per_lane);
    }
    g1_rows_ladder<DT, MODE, U, NR0, NORM, T>(c, name, a);
}

template <ts_dtype DT, int MODE, bool NORM, int T>
static void g1_start(cuda_ctx *c, const char *name, const g1_args &a) {
    int64_t per_lane = (a.cols / g1_fmt<DT>::ELEMS + 31) / 32;
    g1_shape<DT, MODE, g1_fmt<DT>::UMIN, NORM, T>(c, name, a, per_lane);
}

/* g1_start for n tokens (1..G1_TOKENS for 16-bit weights, 1..G1_QTOKENS for the quantized:
 * g1_fits), with the input norm folded in or not (quantized weights: one token) */
template <ts_dtype DT, int MODE, int T = 1>
static void g1_start_norm(cuda_ctx *c, const char *name, const g1_args &a, int n) {
    constexpr bool half = DT == TS_DTYPE_BF16 || DT == TS_DTYPE_F16;
    if constexpr (T < (half ? G1_TOKENS : G1_QTOKENS)) {
        if (n > T) return g1_start_norm<DT, MODE, T + 1>(c, name, a, n);
    }
    if constexpr (half || T == 1) {
        if (a.norm_w) return g1_start<DT, MODE, true, T>(c, name, a);
    }
    g1_start<DT, MODE, false, T>(c, name, a);
}

template <int MODE>
static void g1_dispatch(cuda_ctx *c, const char *name, ts_dtype dt, const g1_args &a, int n) {
    switch (dt) {
    case TS_DTYPE_Q8_0: return g1_start_norm<TS_DTYPE_Q8_0, MODE>(c, name, a, n);
    case TS_DTYPE_Q4_0: return g1_start_norm<TS_DTYPE_Q4_0, MODE>(c, name, a, n);
    case TS_DTYPE_Q5_0: return g1_start_norm<TS_DTYPE_Q5_0, MODE>(c, name, a, n);
    case TS_DTYPE_Q4_K: return g1_start_norm<TS_DTYPE_Q4_K, MODE>(c, name, a, n);
    case TS_DTYPE_Q6_K: return g1_start_norm<TS_DTYPE_Q6_K, MODE>(c, name, a, n);
    case TS_DTYPE_BF16: return g1_start_norm<TS_DTYPE_BF16, MODE>(c, name, a, n);
    default: return g1_start_norm<TS_DTYPE_F16, MODE>(c, name, a, n); /* g1_fits: F16 */
    }
}

bool cuda_gemv_one(cuda_ctx *c, const cuda_wview *w, int nw, const float *x, int64_t ldx, int n,
                   float *const *y, const int64_t *ldy, const float *norm_w, float eps, bool acc) {
    if (!g1_fits(c, w, nw, x, n, ldx, norm_w)) return false;
    g1_args a = {};
    int64_t rows = 0;
    for (int j = 0; j < nw; j++) {
        a.set.W[j] = (const uint8_t *)w[j].data;
        a.set.y[j] = y[j];
        a.set.ldy[j] = n > 1 ? ldy[j] : 0;
        a.set.end[j] = rows += w[j].rows;
    }
    a.set.nw = nw, a.rows = rows, a.cols = w[0].cols;
    a.row_bytes = cuda_row_bytes(w[0].dtype, w[0].cols);
    a.x = x, a.ldx = n > 1 ? ldx : 0;
    a.norm_w = norm_w, a.eps = eps, a.acc = acc, a.early = c->gemv_one_early;
    a.i8 = g1_int8_takes(c, rows);
    const char *name = cuda_gemv_name(rows, norm_w != nullptr, w[0].dtype);
    g1_dispatch<G1_PLAIN>(c, name, w[0].dtype, a, n);
    c->gemv_few_launches += n > 1;
    return true;
}

bool cuda_gemv_one_glu(cuda_ctx *c, const cuda_wview *g, const cuda_wview *u, const float *x,
                       int64_t ldx, int n, const float *norm_w, float eps, bool gelu, float *out,
                       int64_t ldo) {
    cuda_wview gu[2] = {*g, *u};
    if (!g1_fits(c, gu, 2, x, n, ldx, norm_w) || g->rows != u->rows) return false;
    g1_args a = {};
    a.set.nw = 0;
    a.Wg = (const uint8_t *)g->data, a.Wu = (const uint8_t *)u->data, a.out = out;
    a.rows = g->rows, a.row_bytes = cuda_row_bytes(g->dtype, g->cols), a.cols = g->cols;
    a.x = x, a.ldx = n > 1 ? ldx : 0, a.ldo = n > 1 ? ldo : 0;
    a.norm_w = norm_w, a.eps = eps, a.early = c->gemv_one_early;
    a.i8 = g1_int8_takes(c, g->rows);
    if (gelu)
        g1_dispatch<G1_GELU>(c, "gemv_glu", g->dtype, a, n);
    else
        g1_dispatch<G1_SILU>(c, "gemv_glu", g->dtype, a, n);
    c->gemv_few_launches += n > 1;
    return true;
}
