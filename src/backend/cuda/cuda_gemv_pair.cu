/* One launch for a single token's stack of two quantized weight types (cuda_gemv_pair).
 *
 * llama.cpp's Q4_K_M keeps some of a layer's tensors at higher precision, so the weights that
 * share one input - a layer's input projections - are often of two types: Qwen3.5's delta-rule
 * qkv in Q6_K beside its gate, beta and alpha in Q4_K; Gemma 3's v in Q8_0 in half the layers
 * beside q and k in Q5_0. The single-token kernel is one type a launch, so such a stack took two
 * launches, the second waiting for the first although it needs none of its results: one more
 * dependent kernel a layer, ~3-5 us of a decode step each on an H200 (bench/RESULTS.md). Here
 * the grid is split: the first blocks run g1_body for the first type's rows, the rest for the
 * second's, each part as cuda_gemv_one would run it alone (its own row bytes and integer or
 * float form), so every output has the bits of the two launches. TESSERA_CUDA_GEMV1_PAIR=0
 * keeps two launches, for comparisons. */
#include "backend/cuda/cuda_gemv_one.cuh"

/* The launch's arguments: the whole stack in a (the first type's weights first: nwa of them,
 * a.row_bytes and a.i8 theirs), the second type's row bytes and form, and the block where its
 * part starts */
typedef struct {
    g1_args a;
    size_t rb_b;
    int nwa;
    unsigned split;
    bool i8_b;
} g1_pair;
static_assert(sizeof(g1_pair) <= CQ_ARG_BYTES, "g1_pair fits a queued launch's arguments");

template <ts_dtype DA, ts_dtype DB, int U, int NR, bool NORM>
__device__ static inline void pair_body(const g1_pair &p) {
    const int64_t mid = p.a.set.end[p.nwa - 1];
    if (blockIdx.x < p.split)
        g1_body<DA, G1_PLAIN, U, NR, NORM, false, 1>(p.a, g1_part{0, mid, p.a.row_bytes, p.a.i8},
                                                     blockIdx.x, p.split);
    else
        g1_body<DB, G1_PLAIN, U, NR, NORM, false, 1>(p.a, g1_part{mid, p.a.rows, p.rb_b, p.i8_b},
                                                     blockIdx.x - p.split, gridDim.x - p.split);
}

template <ts_dtype DA, ts_dtype DB, int U, int NR, bool NORM>
__global__ static void __launch_bounds__(32 * G1_WARPS) k_gemv_pair(g1_pair p) {
    pair_body<DA, DB, U, NR, NORM>(p);
}

/* The same held to 4 blocks a multiprocessor (128 registers), for Q6_K beside Q4_K at 4 rows a
 * warp: Qwen3.5's delta-rule stacks (6144 + 2080 rows of 1024 columns, 514 blocks) took 164
 * registers there, 3 blocks a multiprocessor, 396 a round on an H200, so they kept two
 * launches; held, 528 a round and one launch (a 224-byte spill a thread; a step 759-761 ->
 * 736-737 us, bench/RESULTS.md). The Q8_0 / Q5_0 pair keeps its registers. */
template <ts_dtype DA, ts_dtype DB, int U, int NR, bool NORM>
__global__ static void __launch_bounds__(32 * G1_WARPS, 4) k_gemv_pair_held(g1_pair p) {
    pair_body<DA, DB, U, NR, NORM>(p);
}

template <ts_dtype DA, ts_dtype DB, int U, int NR, bool NORM>
static constexpr auto pair_kernel(void) {
    if constexpr (DA == TS_DTYPE_Q6_K && NR == 4)
        return k_gemv_pair_held<DA, DB, U, NR, NORM>;
    else
        return k_gemv_pair<DA, DB, U, NR, NORM>;
}

template <ts_dtype DA, ts_dtype DB, int U, int NR, bool NORM> static int pair_per_sm(void) {
    static const int n = g1_occupancy(pair_kernel<DA, DB, U, NR, NORM>(), 0);
    return n;
}

/* NR rows a warp for both parts (1, 2, 4: the fewest whose blocks fit in one round of the
 * capped grid, within a lane's loads for both types); false (nothing launched) where none does */
template <ts_dtype DA, ts_dtype DB, int U, int NR, bool NORM>
static bool pair_try(cuda_ctx *c, g1_pair p, int64_t rows_a, int64_t rows_b) {
    constexpr int LOADS =
        g1_fmt<DA>::LOADS > g1_fmt<DB>::LOADS ? g1_fmt<DA>::LOADS : g1_fmt<DB>::LOADS;
    if constexpr (U * NR * LOADS > G1_LOADS) {
        return false;
    } else {
        int64_t per = (int64_t)NR * G1_WARPS;
        int64_t ba = (rows_a + per - 1) / per, bb = (rows_b + per - 1) / per;
        int64_t cap = (int64_t)c->sm_count * pair_per_sm<DA, DB, U, NR, NORM>() * c->gemv_one_waves;
        if (ba + bb > cap) {
            if constexpr (NR < 4) return pair_try<DA, DB, U, 2 * NR, NORM>(c, p, rows_a, rows_b);
            return false;
        }
        p.split = (unsigned)ba;
        const char *name = cuda_gemv_name(rows_a + rows_b, NORM, DA);
        cuda_launch(c, name, pair_kernel<DA, DB, U, NR, NORM>(), (unsigned)(ba + bb), 32 * G1_WARPS,
                    0, p);
        return true;
    }
}

template <ts_dtype DA, ts_dtype DB>
static bool pair_start(cuda_ctx *c, const g1_pair &p, int64_t rows_a, int64_t rows_b) {
    /* a lane's units of a row: 1 or 2 (rows of up to 1024 or 2048 columns); longer rows go
     * round, which the pair leaves to two launches */
    int64_t per_lane = (p.a.cols / 32 + 31) / 32;
    bool norm = p.a.norm_w != nullptr;
    if (per_lane <= 1)
        return norm ? pair_try<DA, DB, 1, 1, true>(c, p, rows_a, rows_b)
                    : pair_try<DA, DB, 1, 1, false>(c, p, rows_a, rows_b);
    if (per_lane <= 2)
        return norm ? pair_try<DA, DB, 2, 1, true>(c, p, rows_a, rows_b)
                    : pair_try<DA, DB, 2, 1, false>(c, p, rows_a, rows_b);
    return false;
}

bool cuda_gemv_pair(cuda_ctx *c, const cuda_wview *wa, int na, const cuda_wview *wb, int nb,
                    const float *x, float *const *ya, float *const *yb, const float *norm_w,
                    float eps) {
    if (!c->gemv_one_pair || na < 1 || nb < 1 || na + nb > G1_SET) return false;
    if (!g1_fits(c, wa, na, x, 1, 0, norm_w) || !g1_fits(c, wb, nb, x, 1, 0, norm_w)) return false;
    if (wa[0].cols != wb[0].cols) return false;
    /* the pairs of types llama.cpp's Q4_K_M makes, the kernel's first type first */
    ts_dtype da = wa[0].dtype, db = wb[0].dtype;
    bool swap = (da == TS_DTYPE_Q4_K && db == TS_DTYPE_Q6_K) ||
                (da == TS_DTYPE_Q5_0 && db == TS_DTYPE_Q8_0);
    if (swap) {
        const cuda_wview *tw = wa;
        wa = wb, wb = tw;
        float *const *ty = ya;
        ya = yb, yb = ty;
        int tn = na;
        na = nb, nb = tn;
        da = wa[0].dtype, db = wb[0].dtype;
    }
    g1_pair p = {};
    int64_t rows = 0, rows_a = 0;
    for (int j = 0; j < na + nb; j++) {
        const cuda_wview &w = j < na ? wa[j] : wb[j - na];
        p.a.set.W[j] = (const uint8_t *)w.data;
        p.a.set.y[j] = j < na ? ya[j] : yb[j - na];
        p.a.set.end[j] = rows += w.rows;
        if (j == na - 1) rows_a = rows;
    }
    p.a.set.nw = na + nb, p.a.rows = rows, p.a.cols = wa[0].cols;
    p.a.row_bytes = cuda_row_bytes(da, wa[0].cols), p.rb_b = cuda_row_bytes(db, wb[0].cols);
    p.a.x = x, p.a.norm_w = norm_w, p.a.eps = eps, p.a.early = c->gemv_one_early;
    p.a.i8 = g1_int8_takes(c, rows_a), p.i8_b = g1_int8_takes(c, rows - rows_a);
    p.nwa = na;
    bool ok = false;
    if (da == TS_DTYPE_Q6_K && db == TS_DTYPE_Q4_K)
        ok = pair_start<TS_DTYPE_Q6_K, TS_DTYPE_Q4_K>(c, p, rows_a, rows - rows_a);
    else if (da == TS_DTYPE_Q8_0 && db == TS_DTYPE_Q5_0)
        ok = pair_start<TS_DTYPE_Q8_0, TS_DTYPE_Q5_0>(c, p, rows_a, rows - rows_a);
    c->gemv_pair_launches += ok;
    return ok;
}
