/* The single-token GEMV's device side (cuda_gemv_one.cu describes it): the argument and part
 * structs, the weight types' units, the loads, the float and integer sums, and g1_body, the
 * kernel's body for one part of a launch - shared by cuda_gemv_one.cu's kernel (one part) and
 * cuda_gemv_pair.cu's (a stack of two quantized types, a part each). */
#ifndef TS_BACKEND_CUDA_GEMV_ONE_CUH
#define TS_BACKEND_CUDA_GEMV_ONE_CUH
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_int.cuh"

#define G1_WARPS 4
#define G1_SET   4
/* 16-byte groups a lane has in flight at once: U of each of NR rows, U * NR <= G1_LOADS (64
 * registers). U follows the row length (4, 8 or 16 groups a lane: rows of up to 1024, 2048 or
 * 4096 columns; longer ones go round in rounds of 16), NR the rows a warp must take so that one
 * round of the capped grid covers the matrix. */
#define G1_LOADS 16

/* Tokens the kernel takes at once (G1_TOKENS 16-bit weights, G1_QTOKENS quantized): each
 * weight loaded once for all of them, every token's sums in its own registers. From 3 tokens
 * the tensor-core GEMM takes quantized weights (cuda_matmul.cu's skinny_from). */
#define G1_TOKENS  3
#define G1_QTOKENS 2

typedef struct {
    const uint8_t *W[G1_SET];
    float *y[G1_SET];
    int64_t end[G1_SET]; /* global row o is weight j's for the first j with o < end[j] */
    int64_t ldy[G1_SET]; /* token t's outputs of weight j at y[j] + t * ldy[j] */
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
    int64_t ldx, ldo;    /* token t's x at x + t * ldx; its glu out at out + t * ldo */
    const float *norm_w; /* the input RMSNorm's weights, or NULL */
    float eps;
    bool acc;   /* y += instead of y = */
    bool early; /* the first round loaded before the programmatic wait */
    bool i8;    /* quantized weights by integer dot products against x in int8 (g1_x8) */
} g1_args;
static_assert(sizeof(g1_args) <= CQ_ARG_BYTES, "g1_args fits a queued launch's arguments");

/* The rows one kernel body takes: [r0, r1) of the stack (global row numbers), rows of rb bytes,
 * by integer dot products or not (g1_args.i8). A launch is one part (g1_whole) or, for a stack
 * of two quantized types, two (cuda_gemv_pair.cu). */
typedef struct {
    int64_t r0, r1;
    size_t rb;
    bool i8;
} g1_part;

__device__ static inline g1_part g1_whole(const g1_args &a) {
    return g1_part{0, a.rows, a.row_bytes, a.i8};
}

enum { G1_PLAIN, G1_SILU, G1_GELU };

__device__ static inline uint4 g1_load(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* A weight type's unit: the elements a lane takes at once and the raw bytes it loads for them
 * (LOADS 16-byte loads), summed into a row's partial sum in the general GEMV's order. UMIN: the
 * fewest units a lane keeps of a row. */
template <ts_dtype DT> struct g1_fmt {
    /* BF16, F16: a group of 8 elements, one load */
    static constexpr int ELEMS = 8, LOADS = 1, UMIN = 4;
    typedef uint4 raw;
    __device__ static inline raw load(const uint8_t *row, int64_t gi) {
        return g1_load(row + gi * 16);
    }
};

/* K-quants: unit32's 32 elements in two runs of 16 (runs: where they start in x), decoded by
 * the formulas of unit32 from the unit's raw bytes. Q4_K: its super-block's first 16 bytes (d,
 * dmin, scales: the same for 8 lanes, one transaction) and its 16 code bytes - 8 registers
 * instead of 32 decoded floats. */
template <> struct g1_fmt<TS_DTYPE_Q4_K> {
    static constexpr int ELEMS = 32, LOADS = 2, UMIN = 1;
    struct raw {
        uint4 h, v;
    };
    __device__ static inline raw load(const uint8_t *row, int64_t u) {
        return raw{g1_load(row + (u >> 3) * 144), g1_load(row + q4k_code_offset(u))};
    }
    __device__ static inline void runs(int64_t u, int64_t *ea, int64_t *eb) {
        *ea = q4k_unit_start(u), *eb = *ea + 32;
    }
    __device__ static inline void decode(const raw &r, int64_t u, float *wa, float *wb) {
        int64_t ea, eb;
        q4k_unit(r.h, r.v, u, wa, wb, &ea, &eb);
    }
};

/* Q6_K (the device's layout): 16 ql and 16 qh bytes, 8 scale bytes and d - 11 registers,
 * counted as 3 loads. */
template <> struct g1_fmt<TS_DTYPE_Q6_K> {
    static constexpr int ELEMS = 32, LOADS = 3, UMIN = 1;
    typedef q6k_raw raw;
    __device__ static inline raw load(const uint8_t *row, int64_t u) {
        const uint8_t *b = row + q6k_dev_block(u >> 3);
        int h = (int)(u >> 2) & 1, l0 = ((int)(u >> 1) & 1) * 16, qp = (int)u & 1;
        raw r;
        r.ql = g1_load(b + 64 * h + qp * 32 + l0);
        r.qh = g1_load(b + 128 + 32 * h + l0);
        asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];"
                     : "=r"(r.sc.x), "=r"(r.sc.y)
                     : "l"(b + 192 + 8 * h));
        r.d = ld16(row + q6k_dev_d(u >> 3));
        return r;
    }
    __device__ static inline void runs(int64_t u, int64_t *ea, int64_t *eb) {
        *ea = q6k_unit_start(u), *eb = *ea + 64;
    }
    __device__ static inline void decode(const raw &r, int64_t u, float *wa, float *wb) {
        int64_t ea, eb;
        q6k_unit(r, u, wa, wb, &ea, &eb);
    }
};

/* Q8_0, Q4_0, Q5_0 (the device's layout, q32_*): a unit is one block, its 32 elements in order
 * - the first 16 run a, the rest run b - from its code bytes, d and (Q5_0) qh; decoded with
 * group8's formulas. */
__device__ static inline uint32_t g1_ld16(const uint8_t *p) {
    unsigned short v;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
__device__ static inline uint32_t g1_ld32(const uint8_t *p) {
    uint32_t v;
    asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
template <ts_dtype DT> struct g1_q32 {
    static constexpr int CODES = q32_code_bytes(DT) / 16; /* 16-byte loads of codes */
    static constexpr int ELEMS = 32, LOADS = CODES + 1, UMIN = 1;
    struct raw {
        uint4 c[CODES];
        uint32_t d, qh;
    };
    __device__ static inline raw load(const uint8_t *row, int64_t u) {
        raw r;
        const uint8_t *c = row + q32_dev_codes(DT, u);
        r.c[0] = g1_load(c);
        if constexpr (CODES == 2) r.c[1] = g1_load(c + 16);
        r.d = g1_ld16(row + q32_dev_d(DT, u));
        r.qh = DT == TS_DTYPE_Q5_0 ? g1_ld32(row + q32_dev_qh(DT, u)) : 0;
        return r;
    }
    __device__ static inline void runs(int64_t u, int64_t *ea, int64_t *eb) {
        *ea = 32 * u, *eb = *ea + 16;
    }
    __device__ static inline void decode(const raw &r, int64_t u, float *wa, float *wb) {
        (void)u;
        float d = f16f((uint16_t)r.d);
        if constexpr (DT == TS_DTYPE_Q8_0) {
            uint32_t a[4] = {r.c[0].x, r.c[0].y, r.c[0].z, r.c[0].w};
            uint32_t b[4] = {r.c[1].x, r.c[1].y, r.c[1].z, r.c[1].w};
#pragma unroll
            for (int k = 0; k < 16; k++) { /* int8 codes: the byte with its top bit flipped - 128 */
                wa[k] = byte_f(a[k >> 2] ^ 0x80808080u, k & 3, 128.0f) * d;
                wb[k] = byte_f(b[k >> 2] ^ 0x80808080u, k & 3, 128.0f) * d;
            }
        } else {
            uint32_t q[4] = {r.c[0].x, r.c[0].y, r.c[0].z, r.c[0].w};
            constexpr float bias = DT == TS_DTYPE_Q5_0 ? 16.0f : 8.0f;
#pragma unroll
            for (int k = 0; k < 16; k++) {
                uint32_t lo = q[k >> 2] & 0x0F0F0F0Fu, hi = (q[k >> 2] >> 4) & 0x0F0F0F0Fu;
                if constexpr (DT == TS_DTYPE_Q5_0) { /* bit 4 of element e is bit e of qh */
                    int j = k & ~3;                  /* the word's first element */
                    lo |= (((r.qh >> j) & 15u) * 0x00204081u & 0x01010101u) << 4;
                    hi |= (((r.qh >> (16 + j)) & 15u) * 0x00204081u & 0x01010101u) << 4;
                }
                wa[k] = byte_f(lo, k & 3, bias) * d;
                wb[k] = byte_f(hi, k & 3, bias) * d;
            }
        }
    }
};
template <> struct g1_fmt<TS_DTYPE_Q8_0> : g1_q32<TS_DTYPE_Q8_0> {};
template <> struct g1_fmt<TS_DTYPE_Q4_0> : g1_q32<TS_DTYPE_Q4_0> {};
template <> struct g1_fmt<TS_DTYPE_Q5_0> : g1_q32<TS_DTYPE_Q5_0> {};

/* Row o of the kernel's first (or only) weight: its bytes, or NULL past the end. */
template <int MODE>
__device__ static inline const uint8_t *g1_row(const g1_args &a, const g1_part &p, int64_t o, int r,
                                               int *j_out) {
    if (o >= p.r1) return nullptr;
    if (MODE != G1_PLAIN) return (r ? a.Wu : a.Wg) + o * p.rb;
    /* one weight (the output head, whose rows go round many times): no search of the stack,
     * whose loop and offsets cost a row ~30 instructions (issue-bound at 250k rows) */
    if (a.set.nw == 1) {
        *j_out = 0;
        return a.set.W[0] + o * p.rb;
    }
    int j = 0;
    while (j < a.set.nw - 1 && o >= a.set.end[j])
        j++;
    *j_out = j;
    return a.set.W[j] + (o - (j ? a.set.end[j - 1] : 0)) * p.rb;
}

/* The NR weight rows a warp sums together in the round at o (W: the warps of the grid):
 * plain, rows o, o + W, ... of the stack; glu, the gate and the up row of outputs o, o + W, ...
 * (i even: gate, odd: up). jr: each row's entry of the stack. */
template <int MODE, int NR>
__device__ static inline void g1_rows(const g1_args &a, const g1_part &p, int64_t o, int64_t W,
                                      const uint8_t **row, int *jr) {
#pragma unroll
    for (int i = 0; i < NR; i++) {
        jr[i] = 0;
        row[i] = MODE == G1_PLAIN ? g1_row<MODE>(a, p, o + i * W, 0, &jr[i])
                                  : g1_row<MODE>(a, p, o + (i >> 1) * W, i & 1, &jr[i]);
    }
}

/* Where plain row o (of weight j: g1_rows) of token t goes in its weight's output */
__device__ static inline float *g1_y(const g1_args &a, int64_t o, int j, int t = 0) {
    if (a.set.nw == 1) return &a.set.y[0][t * a.set.ldy[0] + o];
    return &a.set.y[j][t * a.set.ldy[j] + o - (j ? a.set.end[j - 1] : 0)];
}

/* The lane's loads of round g0 of NR rows (U units each: unit lane, lane + L, ...; L the lanes
 * that share a row, lane counted among them) into q, all in flight at once. */
template <ts_dtype DT, int U, int NR, int L = 32>
__device__ static inline void g1_issue(const uint8_t *const *row, int64_t g0, int64_t ge, int lane,
                                       typename g1_fmt<DT>::raw (*q)[U]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        int64_t gi = g0 + u * L + lane;
#pragma unroll
        for (int i = 0; i < NR; i++)
            if (gi < ge && row[i]) q[i][u] = g1_fmt<DT>::load(row[i], gi);
    }
}

/* Round g0's products of the loaded 16-bit groups q with the T tokens of x (token t at x + t *
 * ldx) into the lane's partial sums acc[i][t], in the general GEMV's order; ss[t]: the lane's
 * share of token t's sum of squares where want_ss (a warp's first round, NORM). */
template <ts_dtype DT, int U, int NR, bool NORM, int T>
__device__ static inline void g1_math16(const uint8_t *const *row, const uint4 (*q)[U], int64_t g0,
                                        int64_t ge, const float *x, int64_t ldx, const float *nw,
                                        int lane, float (*acc)[T], bool want_ss, float *ss) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        int64_t gi = g0 + u * 32 + lane;
        if (gi >= ge) break;
        float4 xa[T], xb[T];
#pragma unroll
        for (int t = 0; t < T; t++) {
            xa[t] = *(const float4 *)(x + t * ldx + gi * 8);
            xb[t] = *(const float4 *)(x + t * ldx + gi * 8 + 4);
            if constexpr (NORM) {
                float4 &a = xa[t], &b = xb[t];
                if (want_ss) {
                    ss[t] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
                    ss[t] += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
                }
                float4 ma = *(const float4 *)(nw + gi * 8), mb = *(const float4 *)(nw + gi * 8 + 4);
                a.x *= ma.x, a.y *= ma.y, a.z *= ma.z, a.w *= ma.w;
                b.x *= mb.x, b.y *= mb.y, b.z *= mb.z, b.w *= mb.w;
            }
        }
#pragma unroll
        for (int i = 0; i < NR; i++) {
            if (!row[i]) continue;
            float w[8];
            half8<DT>(q[i][u], w);
#pragma unroll
            for (int t = 0; t < T; t++) {
                const float4 &a = xa[t], &b = xb[t];
                float s = acc[i][t];
                s += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w;
                s += w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
                acc[i][t] = s;
            }
        }
    }
}

/* The two runs of x that unit gi of every row covers (16 values each, at ea and eb) into va and
 * vb, the input norm's weights applied where folded (as row_dot applies them); the squares of x
 * added to ss on the way where want_ss (NORM) */
template <ts_dtype DT, bool NORM>
__device__ static inline void g1_xruns(const float *x, const float *nw, int64_t gi, bool want_ss,
                                       float *ss, float *va, float *vb) {
    int64_t ea, eb;
    g1_fmt<DT>::runs(gi, &ea, &eb);
#pragma unroll
    for (int k = 0; k < 16; k += 4) {
        float4 p = *(const float4 *)(x + ea + k), r = *(const float4 *)(x + eb + k);
        va[k] = p.x, va[k + 1] = p.y, va[k + 2] = p.z, va[k + 3] = p.w;
        vb[k] = r.x, vb[k + 1] = r.y, vb[k + 2] = r.z, vb[k + 3] = r.w;
    }
    if constexpr (NORM) {
#pragma unroll
        for (int k = 0; k < 16; k += 4) {
            float4 p = *(const float4 *)(nw + ea + k), r = *(const float4 *)(nw + eb + k);
            float ma[4] = {p.x, p.y, p.z, p.w}, mb[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if (want_ss) *ss += va[k + i] * va[k + i] + vb[k + i] * vb[k + i];
                va[k + i] *= ma[i], vb[k + i] *= mb[i];
            }
        }
    }
}

/* The same for 32-element units: for the K-quants k_gemv's one-token sums (row_dot's unit32
 * loop), for Q8_0 / Q4_0 / Q5_0 a block's elements in order; the input norm applied to x as
 * row_dot applies it. One token: x's runs read once for all rows. Two (no norm: cuda_matmul.cu
 * folds none into quantized weights beyond one token): a row's unit decoded once for both, each
 * token's runs read (from L1) per row, since both tokens' runs beside the rows' loads would take
 * 64 registers. Each token's sums are the one-token form's, bit for bit. */
template <ts_dtype DT, int U, int NR, bool NORM, int T>
__device__ static inline void g1_mathk(const uint8_t *const *row,
                                       const typename g1_fmt<DT>::raw (*q)[U], int64_t g0,
                                       int64_t ge, const float *x, int64_t ldx, const float *nw,
                                       int lane, float (*acc)[T], bool want_ss, float *ss) {
    static_assert(T == 1 || !NORM, "quantized weights fold the norm for one token only");
#pragma unroll
    for (int u = 0; u < U; u++) {
        int64_t gi = g0 + u * 32 + lane;
        if (gi >= ge) break;
        float va[16], vb[16]; /* every row's unit gi covers the same elements of x */
        if constexpr (T == 1) g1_xruns<DT, NORM>(x, nw, gi, want_ss, ss, va, vb);
#pragma unroll
        for (int i = 0; i < NR; i++) {
            if (!row[i]) continue;
            float wa[16], wb[16];
            g1_fmt<DT>::decode(q[i][u], gi, wa, wb);
#pragma unroll
            for (int t = 0; t < T; t++) {
                if constexpr (T > 1) g1_xruns<DT, false>(x + t * ldx, nw, gi, false, ss, va, vb);
                float s = acc[i][t];
#pragma unroll
                for (int k = 0; k < 16; k++)
                    s += wa[k] * va[k];
#pragma unroll
                for (int k = 0; k < 16; k++)
                    s += wb[k] * vb[k];
                acc[i][t] = s;
            }
        }
    }
}

/* Quantized weights through integer dot products (g1_args.i8): the lane quantizes its units' x once
 * - each 16-element run (a unit's two runs) to int8 with a scale of its own, max|x| / 127,
 * rounded to nearest even as the CPU's activations are - and a row's unit is then a few byte
 * masks and 8 dp4a against the codes, each run's scales applied once: Q4_K dx (d sc (sum q xq) -
 * dmin m (sum xq)), Q6_K d sc dx (sum q xq - 32 sum xq), Q8_0 d dx (sum q xq), Q4_0 / Q5_0
 * d dx (sum q xq - 8 / 16 sum xq). The float decode spends a permute, a
 * subtraction, a multiply and an FMA a weight, which left these GEMVs bound by their decoding
 * (bench/RESULTS.md). Quantizing x costs each lane a pass over its units after the
 * programmatic wait, which only pays where a warp has many rows to share it: GEMVs of
 * G1_I8_ROWS rows and more (cuda_gemv_one). */
#define G1_I8_ROWS 2048
/* and, with two tokens, where both tokens' units of x a lane keeps fit in registers: T x U of
 * at most this many (K-quant rows of up to 2048 columns), else the float decode */
#define G1_I8_UNITS 4

typedef struct {
    uint32_t qa[4], qb[4]; /* the two runs' int8 values, four a word in element order */
    float da, db;          /* their scales */
    int ia, ib;            /* their int8 values' sums, for the codes' offsets and Q4_K's mins */
} g1_x8;

/* One run of 16 values to int8: packed into q, its scale and the int8 values' sum. The sum of
 * the int8 values, not of x, goes with the codes' offsets (Q4_K's min, Q6_K's 32, ...): then x's
 * rounding meets each weight as a whole, offset included, and stays as small as the weight's
 * own products make it (with x's exact sum beside rounded codes' products it met the codes'
 * large mean alone: 2-3 times the error, test_cuda) */
__device__ static inline void g1_x8_run(const float *v, uint32_t *q, float *d, int *isum) {
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < 16; k++)
        amax = fmaxf(amax, fabsf(v[k]));
    float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int is = 0;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        uint32_t p = 0;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            int e = __float2int_rn(v[4 * w + b] * id);
            is += e;
            p |= ((uint32_t)e & 0xffu) << (8 * b);
        }
        q[w] = p;
    }
    *d = amax / 127.0f, *isum = is;
}

/* The lane's U units of x (one round covers the row: the caller checks), the norm's weights
 * applied where folded; ss: the lane's share of x's sum of squares (NORM) */
template <ts_dtype DT, int U, bool NORM, int L = 32>
__device__ static inline void g1_x8_make(const float *x, const float *nw, int lane, int64_t groups,
                                         g1_x8 *xq, float *ss) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        int64_t gi = u * L + lane;
        if (gi >= groups) break;
        float va[16], vb[16];
        g1_xruns<DT, NORM>(x, nw, gi, true, ss, va, vb);
        g1_x8_run(va, xq[u].qa, &xq[u].da, &xq[u].ia);
        g1_x8_run(vb, xq[u].qb, &xq[u].db, &xq[u].ib);
    }
}

/* The same values for the whole block at once, into shared memory (xs: T tokens' groups units
 * each), a run a thread in turn, then the block's barrier: for rows that go round (the output
 * head), where the lanes' own units of x (g1_x8_make) held their registers for the kernel's life -
 * 28-36 of a lane's registers beside its loads, and with them blocks a multiprocessor. No norm. */
template <ts_dtype DT>
__device__ static inline void g1_x8_stage(const float *x, int64_t ldx, int64_t groups, int T,
                                          g1_x8 *xs) {
    for (int64_t r = threadIdx.x; r < 2 * groups * T; r += blockDim.x) {
        int64_t t = r / (2 * groups), gi = (r - t * 2 * groups) >> 1, ea, eb;
        g1_fmt<DT>::runs(gi, &ea, &eb);
        const float *src = x + t * ldx + (r & 1 ? eb : ea);
        float v[16];
#pragma unroll
        for (int k = 0; k < 16; k += 4) {
            float4 p = *(const float4 *)(src + k);
            v[k] = p.x, v[k + 1] = p.y, v[k + 2] = p.z, v[k + 3] = p.w;
        }
        g1_x8 &d = xs[t * groups + gi];
        if (r & 1)
            g1_x8_run(v, d.qb, &d.db, &d.ib);
        else
            g1_x8_run(v, d.qa, &d.da, &d.ia);
    }
    __syncthreads();
}

/* Where a lane's K-quant unit gi sits in its super-block, as the integer dots read it: Q4_K's
 * first scale j, Q6_K's qh shift sh and scale shift si. The same for every row, so g1_math8 takes
 * it once a unit (inside a row's branch the compiler formed it again for each row). */
typedef struct {
    int j, sh, si;
} g1_upos;
__device__ static inline g1_upos g1_pos(int64_t gi) {
    int qp = (int)gi & 1, half = (int)(gi >> 1) & 1;
    return {2 * ((int)(gi >> 1) & 3), 2 * qp, 8 * (half + 2 * qp)};
}

/* One row's unit (raw bytes r) against the int8 x of that unit, added to s */
__device__ static inline float g1_dot8(const g1_fmt<TS_DTYPE_Q4_K>::raw &r, const g1_upos &p,
                                       const g1_x8 &xq, float s) {
    const int j = p.j;
    float d = f16f((uint16_t)(r.h.x & 0xffffu)), dmin = f16f((uint16_t)(r.h.x >> 16));
    int sc0, m0, sc1, m1;
    q4k_scale_min(r.h, j, &sc0, &m0);
    q4k_scale_min(r.h, j + 1, &sc1, &m1);
    uint32_t c[4] = {r.v.x, r.v.y, r.v.z, r.v.w};
    int pa = 0, pb = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        pa = __dp4a((int)(c[k] & 0x0F0F0F0Fu), (int)xq.qa[k], pa);
        pb = __dp4a((int)((c[k] >> 4) & 0x0F0F0F0Fu), (int)xq.qb[k], pb);
    }
    s += xq.da * (d * (float)sc0 * (float)pa - dmin * (float)m0 * (float)xq.ia);
    s += xq.db * (d * (float)sc1 * (float)pb - dmin * (float)m1 * (float)xq.ib);
    return s;
}
__device__ static inline float g1_dot8(const q6k_raw &r, const g1_upos &p, const g1_x8 &xq,
                                       float s) {
    float d = f16f((uint16_t)r.d); /* scale shift si as q6k_unit's */
    float sa = (float)(int8_t)(r.sc.x >> p.si), sb = (float)(int8_t)(r.sc.y >> p.si);
    uint32_t ql[4] = {r.ql.x, r.ql.y, r.ql.z, r.ql.w}, qh[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
    int pa = 0, pb = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        /* the codes' high bits (bits sh, sh + 1 and sh + 4, sh + 5 of each qh byte) moved to
         * bits 4-5 by one shift each: ((h >> sh) & 3) << 4 is (h << (4 - sh)) & 0x30 per byte,
         * ((h >> (sh + 4)) & 3) << 4 is (h >> sh) & 0x30 */
        uint32_t l = ql[k], h = qh[k];
        uint32_t qa = (l & 0x0F0F0F0Fu) | ((h << (4 - p.sh)) & 0x30303030u);
        uint32_t qb = ((l >> 4) & 0x0F0F0F0Fu) | ((h >> p.sh) & 0x30303030u);
        pa = __dp4a((int)qa, (int)xq.qa[k], pa);
        pb = __dp4a((int)qb, (int)xq.qb[k], pb);
    }
    s += d * sa * xq.da * (float)(pa - 32 * xq.ia);
    s += d * sb * xq.db * (float)(pb - 32 * xq.ib);
    return s;
}

/* Q8_0, Q4_0 and Q5_0 (a unit is a block: run a its first 16 elements, run b the rest) */
template <ts_dtype DT>
__device__ static inline float g1_dot8_q32(const typename g1_q32<DT>::raw &r, const g1_x8 &xq,
                                           float s) {
    float d = f16f((uint16_t)r.d);
    int pa = 0, pb = 0;
    if constexpr (DT == TS_DTYPE_Q8_0) { /* int8 codes as they are */
        uint32_t a[4] = {r.c[0].x, r.c[0].y, r.c[0].z, r.c[0].w};
        uint32_t b[4] = {r.c[1].x, r.c[1].y, r.c[1].z, r.c[1].w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            pa = __dp4a((int)a[k], (int)xq.qa[k], pa);
            pb = __dp4a((int)b[k], (int)xq.qb[k], pb);
        }
        return s + d * (xq.da * (float)pa + xq.db * (float)pb);
    } else { /* nibbles (and Q5_0's fifth bits, as g1_q32::decode builds them), offset 8 or 16 */
        uint32_t q[4] = {r.c[0].x, r.c[0].y, r.c[0].z, r.c[0].w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t lo = q[k] & 0x0F0F0F0Fu, hi = (q[k] >> 4) & 0x0F0F0F0Fu;
            if constexpr (DT == TS_DTYPE_Q5_0) {
                lo |= (((r.qh >> (4 * k)) & 15u) * 0x00204081u & 0x01010101u) << 4;
                hi |= (((r.qh >> (16 + 4 * k)) & 15u) * 0x00204081u & 0x01010101u) << 4;
            }
            pa = __dp4a((int)lo, (int)xq.qa[k], pa);
            pb = __dp4a((int)hi, (int)xq.qb[k], pb);
        }
        constexpr int off = DT == TS_DTYPE_Q5_0 ? 16 : 8;
        return s + d * (xq.da * (float)(pa - off * xq.ia) + xq.db * (float)(pb - off * xq.ib));
    }
}

/* The weight types the integer form takes */
template <ts_dtype DT> __host__ __device__ constexpr bool g1_has8() {
    return DT == TS_DTYPE_Q4_K || DT == TS_DTYPE_Q6_K || DT == TS_DTYPE_Q8_0 ||
           DT == TS_DTYPE_Q4_0 || DT == TS_DTYPE_Q5_0;
}

/* Rows' partial sums of the round's loaded units against the T tokens' int8 x (xq[t][u], or
 * where XS token t's unit gi at xs[t * groups + gi] in shared memory: g1_x8_stage) */
template <ts_dtype DT, int U, int NR, int T, int L = 32, bool XS = false>
__device__ static inline void
g1_math8(const uint8_t *const *row, const typename g1_fmt<DT>::raw (*q)[U], int64_t groups,
         int lane, const g1_x8 (*xq)[U], const g1_x8 *xs, float (*acc)[T]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        int64_t gi = u * L + lane;
        if (gi >= groups) break;
        const g1_upos pos = g1_pos(gi);
#pragma unroll
        for (int i = 0; i < NR; i++) {
            if (!row[i]) continue;
#pragma unroll
            for (int t = 0; t < T; t++) {
                const g1_x8 &x8 = XS ? xs[t * groups + gi] : xq[t][u];
                if constexpr (DT == TS_DTYPE_Q4_K || DT == TS_DTYPE_Q6_K)
                    acc[i][t] = g1_dot8(q[i][u], pos, x8, acc[i][t]);
                else
                    acc[i][t] = g1_dot8_q32<DT>(q[i][u], x8, acc[i][t]);
            }
        }
    }
}

/* A warp per row: NR weight rows summed together, each lane U groups of each in flight; warp w
 * takes the rounds at o = w, w + NO * W, ... (NO: outputs a round, NR plain, NR / 2 glu). T
 * tokens (up to 3 of 16-bit weights, 2 of quantized): the loaded weights summed against each
 * token's x in turn, each as T = 1 sums it, so a token's sums are the same bits alone or beside
 * others (quantized: where both take the same form, g1_x8 or the float decode).
 * L = 16 (quantized weights by integer dot products alone: the caller checks): each half of the
 * warp takes its own NR rows, 16 lanes a row - for rows that go round many times (the output
 * head), where a row's addresses, sums and store are half the instructions of a round, so one
 * instruction serves two rows. Other bits than L = 32 (each lane sums U units, not U / 2).
 * XS: x through shared memory - 16-bit weights' as floats, staged by the block (a row a warp,
 * cuda_gemv_one.cu's g1_xs_takes); quantized weights' as int8 runs (g1_x8_stage; rows that go
 * round, no norm: g1_x8_takes). */
template <ts_dtype DT, int MODE, int U, int NR, bool NORM, bool XS, int T, int L = 32>
__device__ static inline void g1_body(const g1_args &a, const g1_part &p, unsigned bid,
                                      unsigned nblocks) {
    static_assert(U * NR * g1_fmt<DT>::LOADS <= G1_LOADS,
                  "a lane's loads in flight take at most 64 registers");
    static_assert(T <= (g1_fmt<DT>::ELEMS == 8 ? G1_TOKENS : G1_QTOKENS), "tokens a launch");
    static_assert(L == 32 || (L == 16 && g1_has8<DT>()), "half warps: integer form only");
    /* x through shared memory: 16-bit weights' as floats, quantized weights' as int8 runs */
    constexpr bool XF = XS && g1_fmt<DT>::ELEMS == 8, X8 = XS && !XF;
    static_assert(!X8 || (g1_has8<DT>() && !NORM), "x staged as int8: no norm");
    constexpr int NO = MODE == G1_PLAIN ? NR : NR / 2, H = 32 / L;
    const int lane = threadIdx.x & (L - 1), half = (threadIdx.x & 31) / L;
    const int64_t W = (int64_t)nblocks * G1_WARPS; /* warps of the grid */
    /* this half's first row, and the stride between its rows */
    const int64_t w0 = p.r0 + (int64_t)bid * G1_WARPS + (threadIdx.x >> 5) + half * W;
    const int64_t WR = H * W;
    const int64_t step = NO * WR, groups = a.cols / g1_fmt<DT>::ELEMS; /* units a row */
    int jr[NR];
    const uint8_t *row[NR];
    typename g1_fmt<DT>::raw q[NR][U];
    /* No kernel writes weights, so the warp's first round may be loaded before the programmatic
     * wait: those loads are in flight while the predecessor kernel finishes (a.early;
     * TESSERA_CUDA_GEMV1_EARLY=0 loads after the wait, for comparisons). */
    g1_rows<MODE, NR>(a, p, w0, WR, row, jr);
    if (a.early) g1_issue<DT, U, NR, L>(row, 0, groups, lane, q);
    cuda_pdl_entry();
    /* The first round's y of a residual add (acc) in the staged form (the 1024-row output and
     * down projections), asked for now, beside x's loads: read at the store, it was a round
     * trip of its own after the warp's sums. (The other forms would pay registers for it, and
     * with them blocks a multiprocessor.) Lane t stores token t's output of the form's one
     * row (below), so it asks for that y. */
    const float y0 = XS && a.acc && lane < T && row[0] ? *g1_y(a, w0, jr[0], lane) : 0.0f;
    /* x through shared memory: one read of it from L2 a block instead of one a warp (the T
     * tokens one after another, cols apart) */
    extern __shared__ float4 g1_xs[];
    const float *x = a.x;
    int64_t ldx = a.ldx;
    if constexpr (XF) {
        /* XS_BATCH loads a thread in flight before their stores (a loop of load, store went
         * one round trip at a time: 7 for the 3584-column rows) */
        constexpr int XS_BATCH = 8;
        int64_t n4 = a.cols / 4;
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float4 *xt = (const float4 *)(a.x + t * a.ldx);
            for (int64_t i0 = threadIdx.x; i0 < n4; i0 += XS_BATCH * (int64_t)blockDim.x) {
                float4 v[XS_BATCH];
#pragma unroll
                for (int k = 0; k < XS_BATCH; k++) {
                    int64_t i = i0 + k * (int64_t)blockDim.x;
                    if (i < n4) v[k] = xt[i];
                }
#pragma unroll
                for (int k = 0; k < XS_BATCH; k++) {
                    int64_t i = i0 + k * (int64_t)blockDim.x;
                    if (i < n4) g1_xs[t * n4 + i] = v[k];
                }
            }
        }
        __syncthreads();
        x = (const float *)g1_xs, ldx = a.cols;
    }
    cuda_trace_at(4); /* block traces: x staged */
    float ss[T], inv[T];
#pragma unroll
    for (int t = 0; t < T; t++)
        ss[t] = 0.0f, inv[t] = 1.0f;
    bool first = true;
    /* quantized weights by integer dot products where one round covers a row: x quantized once,
     * each token's (with two tokens, where a lane's units are few: xq's registers) */
    constexpr bool Q8 = g1_has8<DT>() && (T == 1 || T * U <= G1_I8_UNITS || X8);
    const bool i8 = X8 || (Q8 && p.i8 && groups <= L * U); /* X8: the caller checks */
    g1_x8 xq[Q8 && !X8 ? T : 1][U]; /* unused (no registers) where X8 or not Q8 */
    g1_x8 *xs8 = (g1_x8 *)g1_xs;
    if constexpr (X8) {
        g1_x8_stage<DT>(x, ldx, groups, T, xs8);
    } else if constexpr (Q8) {
        if (i8) {
#pragma unroll
            for (int t = 0; t < T; t++) {
                g1_x8_make<DT, U, NORM, L>(x + t * ldx, a.norm_w, lane, groups, xq[t], &ss[t]);
                if (NORM) inv[t] = 1.0f / sqrtf(cuda_lanes_sum<L>(ss[t]) / (float)a.cols + a.eps);
            }
        }
    }
    /* o: this half's rows of the round; the halves' rounds end together (the butterflies take
     * the whole warp), so the loop runs while the first half's rows remain */
    for (int64_t o = w0; o - half * W < p.r1; o += step) {
        if (!first) g1_rows<MODE, NR>(a, p, o, WR, row, jr);
        float acc[NR][T];
#pragma unroll
        for (int i = 0; i < NR; i++)
#pragma unroll
            for (int t = 0; t < T; t++)
                acc[i][t] = 0.0f;
        for (int64_t g0 = 0; g0 < groups; g0 += L * U) {
            if (g0 || !first || !a.early) g1_issue<DT, U, NR, L>(row, g0, groups, lane, q);
            if constexpr (Q8) {
                if (i8) {
                    g1_math8<DT, U, NR, T, L, X8>(row, q, groups, lane, xq, xs8, acc);
                    continue;
                }
            }
            if constexpr (L == 32) { /* the float decode: whole warps alone (g1_try_half) */
                if constexpr (g1_fmt<DT>::ELEMS == 32)
                    g1_mathk<DT, U, NR, NORM, T>(row, q, g0, groups, x, ldx, a.norm_w, lane, acc,
                                                 first, ss);
                else
                    g1_math16<DT, U, NR, NORM, T>(row, q, g0, groups, x, ldx, a.norm_w, lane, acc,
                                                  first, ss);
            }
        }
        if (first) cuda_trace_at(5); /* the first round's sums (its weights arrived) */
        if (NORM && first && !i8) {
#pragma unroll
            for (int t = 0; t < T; t++)
                inv[t] = 1.0f / sqrtf(cuda_lanes_sum<L>(ss[t]) / (float)a.cols + a.eps);
        }
        first = false;
        float s[NR][T];
#pragma unroll
        for (int i = 0; i < NR; i++)
#pragma unroll
            for (int t = 0; t < T; t++)
                s[i][t] = cuda_lanes_sum<L>(acc[i][t]) * (NORM ? inv[t] : 1.0f);
        /* Every lane holds every sum: lane t NO + i stores output i of token t, so that the
         * round ends in one store instead of NO T of them one after another in lane 0 (with
         * their addresses: ~25 instructions a row, where the output head's 250k rows go round
         * ~100 times). */
        static_assert(NO * T <= L, "a lane an output");
        float v = 0.0f, vu = 0.0f;
        bool has = false;
        int jo = 0, to = 0;
        int64_t oi = 0;
#pragma unroll
        for (int t = 0; t < T; t++) {
#pragma unroll
            for (int i = 0; i < NO; i++) {
                if (lane != t * NO + i) continue;
                to = t, oi = o + i * WR;
                if constexpr (MODE == G1_PLAIN) {
                    has = row[i] != nullptr, jo = jr[i], v = s[i][t];
                } else {
                    has = row[2 * i] != nullptr, v = s[2 * i][t], vu = s[2 * i + 1][t];
                }
            }
        }
        if (!has) continue;
        if constexpr (MODE == G1_PLAIN) {
            float *yo = g1_y(a, oi, jo, to);
            *yo = a.acc ? (XS && o == w0 ? y0 : *yo) + v : v;
        } else {
            a.out[to * a.ldo + oi] = cuda_glu<MODE == G1_GELU>(v, vu);
        }
    }
    cuda_trace_end();
}

/* Host side, for both launchers */

/* Blocks of a kernel of G1_WARPS warps with smem bytes of dynamic shared memory that the GPU
 * holds at once per multiprocessor (1 where the query fails) */
template <typename K> static int g1_occupancy(K kernel, size_t smem) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, 32 * G1_WARPS, smem) !=
            cudaSuccess ||
        n < 1)
        n = 1;
    return n;
}

/* Whether the single-token kernel takes these weights and x: 16-bit types, and the quantized
 * ones (TESSERA_CUDA_GEMV1_KQUANT=0: not, for comparisons), rows of whole units, x (and the
 * norm's weights, where it is folded in) 16-byte aligned. */
static bool g1_fits(const cuda_ctx *c, const cuda_wview *w, int nw, const float *x, int n,
                    int64_t ldx, const float *norm_w) {
    if (!c->gemv_one_waves || (uintptr_t)x % 16 || (uintptr_t)norm_w % 16 || nw > G1_SET)
        return false;
    bool half = w[0].dtype == TS_DTYPE_BF16 || w[0].dtype == TS_DTYPE_F16;
    /* several tokens: up to gemv_one_tokens (quantized weights G1_QTOKENS, without a folded
     * norm: cuda_matmul.cu folds none into them beyond one token), each token's x 16-byte
     * aligned */
    if (n < 1 || n > c->gemv_one_tokens || (n > 1 && ldx % 4)) return false;
    if (n > 1 && !half && (n > G1_QTOKENS || norm_w)) return false;
    bool kq = (w[0].dtype == TS_DTYPE_Q4_K || w[0].dtype == TS_DTYPE_Q6_K) && c->gemv_one_kquant;
    bool q32 = q32_type(w[0].dtype) && c->gemv_one_kquant;
    if (!half && !kq && !q32) return false;
    int64_t unit = half ? 8 : kq ? 256 : 32; /* elements of a group or block */
    for (int j = 0; j < nw; j++)
        if (w[j].dtype != w[0].dtype || w[j].cols != w[0].cols || w[j].cols % unit) return false;
    return true;
}

/* Whether a GEMV of rows rows (outputs) takes the integer form (g1_x8), by the backend's
 * switch: G1_I8_ROWS and more by default, every one with 2, none with 0 */
static bool g1_int8_takes(const cuda_ctx *c, int64_t rows) {
    return c->gemv_one_int8 == 2 || (c->gemv_one_int8 == 1 && rows >= G1_I8_ROWS);
}

#endif
