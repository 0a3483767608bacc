/* y[t, o] = sum_i W[o, i] x[t, i] on the device, for weights stored row-major [out, in].
 *
 * Decode (few tokens): a warp per output row. The row is cut into groups of 8 elements; lane l
 * decodes groups l, l + 32, ... to fp32 (group8) and keeps one partial sum per token, so the
 * warp's weight and activation loads are contiguous. K-quant rows go by 32 elements a lane
 * (unit32), so that a block's scales are read once per 32 elements. Every weight type keeps its own
 * blocks on the device (a Q4_K weight costs 4.5 bits of memory traffic, not 32; Q6_K's, Q8_0's,
 * Q4_0's and Q5_0's are regrouped for alignment, cuda_row_bytes). Up to GEMV_MAX_TOK tokens per
 * pass; GEMMs above that (a pass per 8 tokens would re-read the weights, and the decoding of
 * quantized blocks is then the bottleneck). One token of 16-bit or quantized weights (the
 * single-sequence decode step) takes cuda_gemv_one.cu's kernel instead.
 *
 * From 4 tokens of 16-bit weights and 3 of quantized ones up to 64 (batched decode, short
 * prompts; skinny_from): the tensor-core GEMM of cuda_gemm_skinny.cu, against the activations
 * split into two 16-bit parts (rounding them to bf16 alone costs ~2e-2 relative error in the
 * logits of the bf16 fixtures; one fp16 part, ~4e-3). For F16 weights the parts are fp16, each
 * token's row scaled by a power of two first (k_split_f16_scaled) for fp16's range.
 *
 * Prefill (more tokens; all of them with TESSERA_CUDA_SKINNY=0): cuBLAS. F32 weights through an
 * fp32 GEMM (CUBLAS_COMPUTE_32F: no TF32); F16/BF16 on tensor cores against the split
 * activations (two GEMMs); quantized weights decoded to a bf16 copy for the same two GEMMs
 * (TESSERA_CUDA_QPREFILL_BF16=0: an fp32 copy for an fp32 GEMM, exact values). The cuBLAS work is queued as calls (cuda_queue.cuh), so it can be part
 * of a graph too. */
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_int.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

#define GEMV_MAX_TOK 8
#define GEMV_WARPS   4

/* Up to 4 weights of one dtype and column count that read the same x, stacked: global row o
 * belongs to the first weight j with o < end[j]. One launch instead of one per weight. */
#define GEMV_SET 4
static_assert(GEMV_SET <= SK_SET, "a group of weights goes to either kernel");
typedef struct {
    const uint8_t *W[GEMV_SET];
    float *y[GEMV_SET];
    int64_t end[GEMV_SET], ldy[GEMV_SET];
    int nw;
} gemv_set;

/* 8 floats from p, by float4 where vec (p 16-byte aligned). */
__device__ static inline void load8(const float *p, bool vec, float *v) {
    if (vec) {
        float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] = p[i];
    }
}

/* R rows' dot products with n <= GEMV_MAX_TOK tokens of x: the lane's partial sums in
 * acc[r][t] (cuda_warp_sum completes them). The rows' groups are decoded together, so a lane has R
 * rows' loads in flight; each row is summed in the same order whatever R is.
 * NORM: x is read as x * nw (the RMSNorm's weights), and ss[t] gathers the lane's share of
 * token t's sum of squares of x: the warp reads every element of x once, so the norm's
 * 1 / rms costs no pass of its own (k_gemv applies it to the sums). */
template <ts_dtype DT, int R, bool NORM>
__device__ static inline void row_dot(const uint8_t *const *row, size_t row_bytes, int64_t cols,
                                      const float *x, int64_t ldx, int n, int lane,
                                      float (*acc)[GEMV_MAX_TOK], const float *nw, float *ss) {
    bool vec = ((uintptr_t)x % 16) == 0 && ldx % 4 == 0;
    bool nvec = NORM && ((uintptr_t)nw % 16) == 0; /* the norm's weights by 4 too */
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < GEMV_MAX_TOK; t++)
            acc[r][t] = 0.0f;
#pragma unroll
    for (int t = 0; t < GEMV_MAX_TOK; t++)
        ss[t] = 0.0f;
    if constexpr (DT == TS_DTYPE_Q4_K || DT == TS_DTYPE_Q6_K) {
        /* one token: 32 elements a lane (unit32), the scales once per 32, not per 8 (an H200:
         * tg128 of the 0.8B Q4_K_M +9%; with 8 tokens it measured slower, so they stay below) */
        for (int64_t u = lane; n == 1 && u < cols / 32; u += 32) {
            float wa[R][16], wb[R][16];
            int64_t ea = 0, eb = 0;
#pragma unroll
            for (int r = 0; r < R; r++)
                unit32<DT>(row[r], u, wa[r], wb[r], &ea, &eb);
            const float *xa = x + ea, *xb = x + eb;
            float va[16], vb[16];
            if (vec) {
#pragma unroll
                for (int k = 0; k < 16; k += 4) {
                    float4 p = *(const float4 *)(xa + k), q = *(const float4 *)(xb + k);
                    va[k] = p.x, va[k + 1] = p.y, va[k + 2] = p.z, va[k + 3] = p.w;
                    vb[k] = q.x, vb[k + 1] = q.y, vb[k + 2] = q.z, vb[k + 3] = q.w;
                }
            } else {
#pragma unroll
                for (int k = 0; k < 16; k++)
                    va[k] = xa[k], vb[k] = xb[k];
            }
            if constexpr (NORM) {
                float ma[16], mb[16];
                load8(nw + ea, nvec, ma), load8(nw + ea + 8, nvec, ma + 8);
                load8(nw + eb, nvec, mb), load8(nw + eb + 8, nvec, mb + 8);
#pragma unroll
                for (int k = 0; k < 16; k++) {
                    ss[0] += va[k] * va[k] + vb[k] * vb[k];
                    va[k] *= ma[k], vb[k] *= mb[k];
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float s = acc[r][0];
#pragma unroll
                for (int k = 0; k < 16; k++)
                    s += wa[r][k] * va[k];
#pragma unroll
                for (int k = 0; k < 16; k++)
                    s += wb[r][k] * vb[k];
                acc[r][0] = s;
            }
        }
        if (n == 1) return;
    }
    /* float rows whose length breaks 16-byte alignment go element by element (the tail loop) */
    bool floats = DT == TS_DTYPE_F32 || DT == TS_DTYPE_F16 || DT == TS_DTYPE_BF16;
    int64_t groups = floats && row_bytes % 16 ? 0 : cols / 8;
#pragma unroll 2
    for (int64_t gi = lane; gi < groups; gi += 32) {
        float w[R][8];
#pragma unroll
        for (int r = 0; r < R; r++)
            group8<DT>(row[r], gi * 8, w[r]);
        float m[8];
        if constexpr (NORM) load8(nw + gi * 8, nvec, m);
#pragma unroll
        for (int t = 0; t < GEMV_MAX_TOK; t++) {
            if (t >= n) break;
            const float *xt = x + t * ldx + gi * 8;
            if (vec) {
                float4 a = *(const float4 *)xt, b = *(const float4 *)(xt + 4);
                if constexpr (NORM) {
                    ss[t] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
                    ss[t] += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
                    a.x *= m[0], a.y *= m[1], a.z *= m[2], a.w *= m[3];
                    b.x *= m[4], b.y *= m[5], b.z *= m[6], b.w *= m[7];
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float s = acc[r][t];
                    s += w[r][0] * a.x + w[r][1] * a.y + w[r][2] * a.z + w[r][3] * a.w;
                    s += w[r][4] * b.x + w[r][5] * b.y + w[r][6] * b.z + w[r][7] * b.w;
                    acc[r][t] = s;
                }
            } else {
                float v[8];
#pragma unroll
                for (int i = 0; i < 8; i++)
                    v[i] = xt[i];
                if constexpr (NORM) {
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        ss[t] += v[i] * v[i], v[i] *= m[i];
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float s = acc[r][t];
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        s += w[r][i] * v[i];
                    acc[r][t] = s;
                }
            }
        }
    }
    /* a tail shorter than a group (float rows only: quantized rows are whole blocks) */
    for (int64_t i = groups * 8 + lane; i < cols; i += 32) {
        if constexpr (NORM) { /* the norm's share once per element, not once per row */
#pragma unroll
            for (int t = 0; t < GEMV_MAX_TOK; t++)
                if (t < n) ss[t] += x[t * ldx + i] * x[t * ldx + i];
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            float wv = DT == TS_DTYPE_F32    ? ((const float *)row[r])[i]
                       : DT == TS_DTYPE_BF16 ? bf16f(((const uint16_t *)row[r])[i])
                                             : f16f(((const uint16_t *)row[r])[i]);
            if constexpr (NORM) wv *= nw[i];
#pragma unroll
            for (int t = 0; t < GEMV_MAX_TOK; t++)
                if (t < n) acc[r][t] += wv * x[t * ldx + i];
        }
    }
}

/* The input norm of a GEMV (NORM): the norm's weights, eps; 1 / rms of token t from the lanes'
 * shares of its sum of squares (row_dot), for cols values. */
typedef struct {
    const float *w;
    float eps;
} gemv_norm;
/* 4 bytes of padding after eps: packed field by field (cq_pack_fields) */
static_assert(sizeof(gemv_norm) == 16, "cq_pack lists every field");
template <> inline void cq_pack<gemv_norm>(cq_op *op, const gemv_norm &v) {
    cq_pack_fields(op, v, &gemv_norm::w, &gemv_norm::eps);
}

bool cuda_gemv_norm_packs_clean(void) {
    static float w[1];
    return cuda_packs_clean<gemv_norm>([](gemv_norm &g) { g.w = w, g.eps = 1e-6f; });
}

__device__ static inline float gemv_inv_rms(float ss, int64_t cols, float eps) {
    return 1.0f / sqrtf(cuda_warp_sum(ss) / (float)cols + eps);
}

/* A warp per output row; acc: y += the product instead of y = (a residual add in the epilogue).
 * (Splitting short-matrix rows over several warps of a block, with the parts summed in shared
 * memory, measured slower on an H200: 1.94 against 1.77 ms a decode step of the synthetic 0.8B;
 * as did 8 warps a block and a deeper unroll.) */
template <ts_dtype DT, bool NORM>
__global__ static void k_gemv(gemv_set set, size_t row_bytes, int64_t cols, const float *x,
                              int64_t ldx, int n, bool prefetch, gemv_norm nrm, bool acc_out) {
    int64_t o = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    int j = 0;
    while (j < set.nw && o >= set.end[j])
        j++;
    if (j && j < set.nw) o -= set.end[j - 1];
    int lane = threadIdx.x & 31;
    const uint8_t *row = j < set.nw ? set.W[j] + o * row_bytes : nullptr;
    /* the weights are not written by anyone: their row may stream into L2 while the
     * predecessor runs */
    if (prefetch && row) cuda_prefetch_l2(row, row_bytes, lane);
    cuda_pdl_entry();
    if (j == set.nw) return;
    float acc[1][GEMV_MAX_TOK], ss[GEMV_MAX_TOK];
    row_dot<DT, 1, NORM>(&row, row_bytes, cols, x, ldx, n, lane, acc, nrm.w, ss);
#pragma unroll
    for (int t = 0; t < GEMV_MAX_TOK; t++) {
        if (t >= n) break;
        float s = cuda_warp_sum(acc[0][t]);
        if (NORM) s *= gemv_inv_rms(ss[t], cols, nrm.eps);
        float *yo = &set.y[j][t * set.ldy[j] + o];
        if (lane == 0) *yo = acc_out ? *yo + s : s;
    }
}

/* The gated MLP's two projections and activation: a warp per row o of both weights,
 * out[t, o] = act((Wg x)[t, o]) * (Wu x)[t, o]. Each product is summed as k_gemv sums it, so
 * the result is bit-identical to two GEMVs and the elementwise kernel, one launch instead of
 * two, and twice the bytes in flight per warp. */
template <ts_dtype DT, bool GELU, bool NORM>
__global__ static void k_gemv_glu(const uint8_t *Wg, const uint8_t *Wu, int64_t rows,
                                  size_t row_bytes, int64_t cols, const float *x, int64_t ldx,
                                  int n, float *out, int64_t ldo, bool prefetch, gemv_norm nrm) {
    int64_t o = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    const uint8_t *rg = Wg + o * row_bytes, *ru = Wu + o * row_bytes;
    if (prefetch && o < rows) {
        cuda_prefetch_l2(rg, row_bytes, lane);
        cuda_prefetch_l2(ru, row_bytes, lane);
    }
    cuda_pdl_entry();
    if (o >= rows) return;
    float acc[2][GEMV_MAX_TOK], ss[GEMV_MAX_TOK];
    const uint8_t *rows2[2] = {rg, ru};
    row_dot<DT, 2, NORM>(rows2, row_bytes, cols, x, ldx, n, lane, acc, nrm.w, ss);
#pragma unroll
    for (int t = 0; t < GEMV_MAX_TOK; t++) {
        if (t >= n) break;
        float g = cuda_warp_sum(acc[0][t]), u = cuda_warp_sum(acc[1][t]);
        if (NORM) {
            float inv = gemv_inv_rms(ss[t], cols, nrm.eps);
            g *= inv, u *= inv;
        }
        if (lane == 0) out[t * ldo + o] = cuda_glu<GELU>(g, u);
    }
}

/* Whole rows to fp32 or bf16 (prefill of quantized weights): a warp per row, a group per lane. */
template <ts_dtype DT, typename T>
__global__ static void k_dequant(const uint8_t *W, size_t row_bytes, int64_t rows, int64_t cols,
                                 T *out) {
    cuda_pdl_entry();
    int64_t o = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (o >= rows) return;
    const uint8_t *row = W + o * row_bytes;
    for (int64_t gi = threadIdx.x & 31; gi < cols / 8; gi += 32) {
        float w[8];
        group8<DT>(row, gi * 8, w);
        if constexpr (std::is_same<T, float>::value) {
            float4 *dst = (float4 *)(out + o * cols + gi * 8); /* cols is a multiple of 32 */
            dst[0] = make_float4(w[0], w[1], w[2], w[3]);
            dst[1] = make_float4(w[4], w[5], w[6], w[7]);
        } else {
            __nv_bfloat162 h[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                h[i] = __floats2bfloat162_rn(w[2 * i], w[2 * i + 1]);
            *(uint4 *)(out + o * cols + gi * 8) = *(const uint4 *)h;
        }
    }
}

/* x split in two 16-bit parts, hi = round(x) and lo = round(x - hi): rows [0, n) of out hold hi,
 * rows [n, 2n) lo. W*hi + W*lo carries about 16 mantissa bits of x instead of 8 (bf16). */
/* Element idx of the hi rows and its lo twin. */
template <bool BF16>
__device__ static inline void split_store(void *out, int64_t idx, int64_t lo, float v) {
    if (BF16) {
        split_bf16_store(out, idx, lo - idx, v);
    } else {
        __half h = __float2half_rn(v);
        ((__half *)out)[idx] = h;
        ((__half *)out)[lo] = __float2half_rn(v - __half2float(h));
    }
}

/* bf16 parts (k_split_f16_scaled makes the fp16 ones): a thread per 4 columns of rows
 * blockIdx.y, blockIdx.y + gridDim.y, ..., in one 16-byte load and two 8-byte stores where the
 * rows allow (split_store's values: the same bits). A thread per element with a 64-bit
 * division for its row took 7.6 us of a 512-token prompt's 1024 columns (186 a prompt). */
__global__ static void k_split_half(const float *x, int64_t ldx, int n, int64_t cols, void *out) {
    cuda_pdl_entry();
    int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (c >= cols) return;
    bool vec = ((cols | ldx) & 3) == 0 && ((uintptr_t)x & 15) == 0;
    __nv_bfloat16 *o = (__nv_bfloat16 *)out;
    for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
        const float *xr = x + t * ldx;
        int64_t idx = t * cols + c, lo = (int64_t)n * cols + idx;
        if (vec) {
            float4 v4 = *(const float4 *)(xr + c);
            float v[4] = {v4.x, v4.y, v4.z, v4.w};
            unsigned short hb[4], lb[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                __nv_bfloat16 h = __float2bfloat16_rn(v[j]);
                hb[j] = __bfloat16_as_ushort(h);
                lb[j] = __bfloat16_as_ushort(__float2bfloat16_rn(v[j] - __bfloat162float(h)));
            }
            *(uint2 *)(o + idx) = make_uint2(hb[0] | (unsigned)hb[1] << 16, hb[2] | (unsigned)hb[3] << 16);
            *(uint2 *)(o + lo) = make_uint2(lb[0] | (unsigned)lb[1] << 16, lb[2] | (unsigned)lb[3] << 16);
        } else {
            for (int j = 0; j < 4 && c + j < cols; j++)
                split_store<true>(out, idx + j, lo + j, xr[c + j]);
        }
    }
}

/* The same split of rmsnorm(x) * w, a block per token: k_rmsnorm's values, so the bits of the
 * norm kernel followed by k_split_half, in one launch. Rows of up to SPLIT_KEEP * ROW_THREADS
 * columns are read once into registers, the norm's weights before the programmatic wait (no
 * kernel writes them): one round trip after the wait instead of two (the sum of squares, then the
 * values again). The same sums in the same order as row_sumsq, the same bits. */
#define SPLIT_KEEP 8
__global__ static void k_split_half_norm(const float *x, int64_t ldx, int n, int64_t cols,
                                         const float *w, float eps, void *out) {
    const bool kept = cols <= SPLIT_KEEP * (int64_t)blockDim.x;
    float wv[SPLIT_KEEP], xv[SPLIT_KEEP];
#pragma unroll
    for (int k = 0; k < SPLIT_KEEP; k++) {
        int64_t i = threadIdx.x + (int64_t)k * blockDim.x;
        wv[k] = kept && i < cols ? w[i] : 0.0f;
    }
    cuda_pdl_entry();
    const float *xr = x + blockIdx.x * ldx;
    if (!kept) {
        double ss = row_sumsq(xr, (int)cols);
        float inv = 1.0f / sqrtf((float)(ss / cols) + eps);
        for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
            int64_t idx = (int64_t)blockIdx.x * cols + i;
            split_store<true>(out, idx, (int64_t)n * cols + idx, (xr[i] * inv) * w[i]);
        }
        return;
    }
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < SPLIT_KEEP; k++) {
        int64_t i = threadIdx.x + (int64_t)k * blockDim.x;
        xv[k] = i < cols ? xr[i] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < SPLIT_KEEP; k++)
        if (threadIdx.x + (int64_t)k * blockDim.x < cols) s += (double)xv[k] * xv[k];
    float inv = 1.0f / sqrtf((float)(row_sum_block(s) / cols) + eps);
#pragma unroll
    for (int k = 0; k < SPLIT_KEEP; k++) {
        int64_t i = threadIdx.x + (int64_t)k * blockDim.x;
        if (i >= cols) break;
        int64_t idx = (int64_t)blockIdx.x * cols + i;
        split_store<true>(out, idx, (int64_t)n * cols + idx, (xv[k] * inv) * wv[k]);
    }
}

/* The split for F16 weights, whose mma and cuBLAS take fp16 activations: fp16 holds 6e-5 ..
 * 65504 where bf16 holds fp32's range, so each token's row (x, or rmsnorm(x) * w with
 * k_split_half_norm's values) is first scaled by the power of two that brings its largest
 * magnitude into [2^14, 2^15) - exactly - and unscale[t] undoes it after the product. Without
 * it a value beyond 65504 became inf, and small ones (and every lo part under 6e-5) lost their
 * bits. NaN and inf go through as they are. A block per token. */
__global__ static void k_split_f16_scaled(const float *x, int64_t ldx, int n, int64_t cols,
                                          const float *w, float eps, __half *out,
                                          float *unscale) {
    cuda_pdl_entry();
    __shared__ float part[ROW_THREADS / 32];
    const float *xr = x + blockIdx.x * ldx;
    float inv = 1.0f;
    if (w) inv = 1.0f / sqrtf((float)(row_sumsq(xr, (int)cols) / cols) + eps);
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
        m = fmaxf(m, fabsf(w ? (xr[i] * inv) * w[i] : xr[i])); /* fmaxf passes over NaN */
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
    __syncthreads();
    m = 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) m = fmaxf(m, part[i]);
    int e = m > 0.0f && isfinite(m) ? 14 - ilogbf(m) : 0;
    e = e < -100 ? -100 : e > 100 ? 100 : e;
    float s = ldexpf(1.0f, e);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        int64_t idx = (int64_t)blockIdx.x * cols + i;
        split_store<false>(out, idx, (int64_t)n * cols + idx,
                           (w ? (xr[i] * inv) * w[i] : xr[i]) * s);
    }
    if (threadIdx.x == 0) unscale[blockIdx.x] = ldexpf(1.0f, -e);
}

/* y[t] = unscale[t] * p[t] (+ y[t] with acc): cuBLAS's product of scaled F16 activations. */
__global__ static void k_unscale(const float *p, int64_t rows, int n, const float *unscale,
                                 float *y, int64_t ldy, bool acc) {
    cuda_pdl_entry();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * n) return;
    int64_t t = i / rows, r = i % rows;
    float v = p[i] * unscale[t];
    y[t * ldy + r] = acc ? y[t * ldy + r] + v : v;
}

/* nrm.w: the GEMV folds the input norm in (k_gemv's NORM); acc: y += the product. */
template <ts_dtype DT>
static void launch_gemv(cuda_ctx *c, const cuda_wview *w, int nw, const float *x, int64_t ldx,
                        int n, float *const *y, const int64_t *ldy, gemv_norm nrm, bool acc) {
    size_t rb = cuda_row_bytes(w[0].dtype, w[0].cols);
    for (int t0 = 0; t0 < n; t0 += GEMV_MAX_TOK) {
        int k = n - t0 < GEMV_MAX_TOK ? n - t0 : GEMV_MAX_TOK;
        gemv_set set = {};
        int64_t rows = 0;
        for (int j = 0; j < nw; j++) {
            set.W[j] = (const uint8_t *)w[j].data;
            set.y[j] = y[j] + t0 * ldy[j];
            set.ldy[j] = ldy[j];
            set.end[j] = rows += w[j].rows;
        }
        set.nw = nw;
        unsigned g = cuda_blocks(rows, GEMV_WARPS);
        const char *name = cuda_gemv_name(rows, nrm.w != nullptr, DT);
        if (nrm.w)
            cuda_launch(c, name, k_gemv<DT, true>, g, 32 * GEMV_WARPS, 0, set, rb, w[0].cols,
                        x + t0 * ldx, ldx, k, c->prefetch, nrm, acc);
        else
            cuda_launch(c, name, k_gemv<DT, false>, g, 32 * GEMV_WARPS, 0, set, rb, w[0].cols,
                        x + t0 * ldx, ldx, k, c->prefetch, nrm, acc);
    }
}

/* Calls f(std::integral_constant<ts_dtype, DT>) for the weight types the GEMV decodes; false for
 * any other type. */
template <typename F> static bool gemv_dtype(ts_dtype dt, F f) {
    switch (dt) {
    case TS_DTYPE_F32: f(std::integral_constant<ts_dtype, TS_DTYPE_F32>{}); return true;
    case TS_DTYPE_F16: f(std::integral_constant<ts_dtype, TS_DTYPE_F16>{}); return true;
    case TS_DTYPE_BF16: f(std::integral_constant<ts_dtype, TS_DTYPE_BF16>{}); return true;
    case TS_DTYPE_Q8_0: f(std::integral_constant<ts_dtype, TS_DTYPE_Q8_0>{}); return true;
    case TS_DTYPE_Q4_0: f(std::integral_constant<ts_dtype, TS_DTYPE_Q4_0>{}); return true;
    case TS_DTYPE_Q5_0: f(std::integral_constant<ts_dtype, TS_DTYPE_Q5_0>{}); return true;
    case TS_DTYPE_Q4_K: f(std::integral_constant<ts_dtype, TS_DTYPE_Q4_K>{}); return true;
    case TS_DTYPE_Q6_K: f(std::integral_constant<ts_dtype, TS_DTYPE_Q6_K>{}); return true;
    default: return false;
    }
}

/* y_j = W_j x (y_j += with acc) for nw <= GEMV_SET weights of one dtype and column count, x
 * normed on the fly where nrm.w is set. */
static void gemv(cuda_ctx *c, const cuda_wview *w, int nw, const float *x, int64_t ldx, int n,
                 float *const *y, const int64_t *ldy, gemv_norm nrm, bool acc) {
    if (cuda_gemv_one(c, w, nw, x, ldx, n, y, ldy, nrm.w, nrm.eps, acc)) return;
    if (!gemv_dtype(w[0].dtype, [&](auto dt) {
            launch_gemv<decltype(dt)::value>(c, w, nw, x, ldx, n, y, ldy, nrm, acc);
        }))
        cuda_check(c, cudaErrorInvalidValue, "matmul: dtype without a device kernel");
}

template <typename T> static void dequant(cuda_ctx *c, const cuda_wview *w, T *out) {
    size_t rb = cuda_row_bytes(w->dtype, w->cols);
    unsigned g = cuda_blocks(w->rows, GEMV_WARPS);
    const uint8_t *W = (const uint8_t *)w->data;
#define DQ(D)                                                                                      \
    cuda_launch(c, "dequant", k_dequant<D, T>, g, 32 * GEMV_WARPS, 0, W, rb, w->rows, w->cols, out)
    switch (w->dtype) {
    case TS_DTYPE_Q8_0: DQ(TS_DTYPE_Q8_0); break;
    case TS_DTYPE_Q4_0: DQ(TS_DTYPE_Q4_0); break;
    case TS_DTYPE_Q5_0: DQ(TS_DTYPE_Q5_0); break;
    case TS_DTYPE_Q4_K: DQ(TS_DTYPE_Q4_K); break;
    case TS_DTYPE_Q6_K: DQ(TS_DTYPE_Q6_K); break;
    default: cuda_check(c, cudaErrorInvalidValue, "matmul: dtype without a device kernel");
    }
#undef DQ
}

/* Column-major view: Y^T (rows x n, ld ldy) = W (cols x rows, ld cols)^T * X^T (cols x n). */
typedef struct {
    const void *W;
    cudaDataType wt;
    int64_t rows, cols;
    const void *x;
    cudaDataType xt;
    int64_t ldx;
    int n;
    float *y;
    int64_t ldy;
    bool accumulate;
} gemm_args;

static void gemm_call(cuda_ctx *c, cudaStream_t s, const void *p) {
    const gemm_args *a = (const gemm_args *)p;
    cuda_gemm_lt(c, s, a->W, a->wt, a->rows, a->cols, a->x, a->xt, a->ldx, a->n, a->y, a->ldy,
                 a->accumulate);
}

static void gemm(cuda_ctx *c, const void *W, cudaDataType wt, int64_t rows, int64_t cols,
                 const void *x, cudaDataType xt, int64_t ldx, int n, float *y, int64_t ldy,
                 bool accumulate) {
    gemm_args a;
    memset(&a, 0, sizeof a); /* padding too: a call's arguments are compared bytewise */
    a.W = W, a.wt = wt, a.rows = rows, a.cols = cols, a.x = x, a.xt = xt, a.ldx = ldx, a.n = n;
    a.y = y, a.ldy = ldy, a.accumulate = accumulate;
    cuda_call(c, "gemm", gemm_call, a);
}

/* Scratch slot 0's bytes for n rows of cols activations split in two 16-bit parts, and F16's n
 * unscale factors after them. */
static size_t split_bytes(int n, int64_t cols) { return (size_t)n * cols * 2 * 2 + (size_t)n * 4; }

/* x as [2n][cols] 16-bit values (hi rows, then lo rows) in scratch slot 0: F16 for F16
 * weights, BF16 for the others (16-bit or decoded to BF16 by the tensor-core GEMM); with pre,
 * those of rmsnorm(x) * pre->w. F16 ones are scaled per token (k_split_f16_scaled): *unscale
 * then holds the n factors that undo it (after the halves, in the same buffer), else NULL. */
static uint16_t *split_half(cuda_ctx *c, const cuda_wview *w, const float *x, int64_t ldx, int n,
                            const float **unscale, const ts_prenorm *pre = nullptr) {
    int64_t total = (int64_t)n * w->cols;
    *unscale = NULL;
    uint16_t *xh = (uint16_t *)cuda_scratch(c, 0, split_bytes(n, w->cols));
    if (!xh) return NULL;
    const auto &m = c->split_made;
    if (!pre && w->dtype != TS_DTYPE_F16 && m.parts == xh && m.op == c->ops_submitted && m.x == x &&
        m.ldx == ldx && m.n == n && m.cols == w->cols)
        return xh; /* the op that wrote x wrote its split too, and nothing ran since */
    if (w->dtype == TS_DTYPE_F16) {
        float *us = (float *)(xh + 2 * total); /* 4-byte aligned: 2 * total halves */
        cuda_launch(c, pre ? "matmul convert norm" : "matmul convert", k_split_f16_scaled,
                    (unsigned)n, ROW_THREADS, 0, x, ldx, n, w->cols,
                    pre ? pre->w : (const float *)NULL, pre ? pre->eps : 0.0f, (__half *)xh, us);
        *unscale = us;
    } else if (pre) {
        cuda_launch(c, "matmul convert norm", k_split_half_norm, (unsigned)n, ROW_THREADS, 0, x,
                    ldx, n, w->cols, pre->w, pre->eps, (void *)xh);
    } else {
        dim3 grid(cuda_blocks((w->cols + 3) / 4, 256), (unsigned)(n < 65535 ? n : 65535));
        cuda_launch(c, "matmul convert", k_split_half, grid, 256, 0, x, ldx, n, w->cols,
                    (void *)xh);
    }
    return xh;
}

/* The fewest tokens the tensor-core GEMM of cuda_gemm_skinny.cu takes of weights of type dt;
 * below, the GEMV. The GEMV re-reads x from L1 for every row, and with several tokens that, not
 * the weights, is its time (a decode step of 8 sequences of the 0.8B BF16 on an H200: 3.1 of
 * its 3.6 ms in GEMVs). Measured there, aggregate decode with the GEMM from 2, 4 and 9 tokens:
 * BF16 2 sequences 1011 / 1153-1160 / 1155-1173 t/s, 4: 1957 / 1915-1924 / 1620, 8: 3609-3618 /
 * 3579-3581 / 2119; Q4_K_M 2: 699 / 992 / 984, 4: 1381 / 1359 / 1538, 8: 2496 / 2499 / 2089 (the
 * quantized GEMV decodes each weight once for all tokens, the GEMM's tiles per 8). So: 16-bit
 * weights from 4 tokens (2-3 take cuda_gemv_one.cu's kernel, a grid of one wave, each weight
 * loaded once for them all), quantized from 8. Re-measured after the GEMM's later forms (H200,
 * aggregate t/s of 2 / 3 / 4 / 6 sequences with the GEMM from 3 against from 8): 0.8B Q4_K_M
 * 1219 / 1622 / 2123 / 3109 against 1218 / 1585 / 1833 / 2178, Gemma 3 270M-shaped Q8_0 2389 /
 * 3504 / 4641 / 6961 against 2388 / 3198 / 3830 / 4583 (its Q4_K_M 3018 / 4004 / 5949 against
 * 2990 / 3586 / 4352 at 3 / 4 / 6); from 2, 2 sequences fell (0.8B Q4_K_M 1082). So quantized
 * weights from 3 (2 take cuda_gemv_one.cu's kernel). TESSERA_CUDA_SKINNY_MIN=k sets k for all. */
static int skinny_from(const cuda_ctx *c, ts_dtype dt) {
    if (dt == TS_DTYPE_F32) return SK_MAX_TOK + 1; /* no tensor-core form */
    if (c->skinny_min) return c->skinny_min;
    return dt == TS_DTYPE_F16 || dt == TS_DTYPE_BF16 ? 4 : 3;
}

void *cuda_split_target(cuda_ctx *c, int n, int64_t cols) {
    /* 16-bit weights take the tensor-core GEMM from the fewest tokens of any type */
    if (!c->split_fused || !c->skinny || n < skinny_from(c, TS_DTYPE_BF16) || n > SK_MAX_TOK)
        return NULL;
    return cuda_scratch(c, 0, split_bytes(n, cols));
}

void cuda_split_made(cuda_ctx *c, const float *x, int64_t ldx, int n, int64_t cols,
                     const void *parts) {
    if (!parts) return;
    c->split_made.x = x, c->split_made.ldx = ldx, c->split_made.cols = cols;
    c->split_made.n = n, c->split_made.parts = parts, c->split_made.op = c->ops_submitted;
}

/* Whether the tensor-core GEMM takes n tokens of w (TESSERA_CUDA_SKINNY=0: never). */
static bool skinny(const cuda_ctx *c, const cuda_wview *w, int n) {
    return c->skinny && n >= skinny_from(c, w->dtype) && cuda_skinny_fits(w, n);
}

/* Whether the GEMV takes n tokens of all nw weights (each below its tensor-core threshold). */
static bool gemv_takes(const cuda_ctx *c, const cuda_wview *w, int nw, int n) {
    if (n > GEMV_MAX_TOK) return false;
    for (int j = 0; j < nw; j++)
        if (skinny(c, &w[j], n)) return false;
    return true;
}

/* y = W x, or y += W x with acc (the residual add of matmul_add, in the epilogue of each
 * path: the GEMV's store, the tensor-core GEMM's, cuBLAS's beta). */
static void matmul(cuda_ctx *c, const cuda_wview &w, const float *x, int64_t ldx, int n, float *y,
                   int64_t ldy, bool acc) {
    bool half = w.dtype == TS_DTYPE_F16 || w.dtype == TS_DTYPE_BF16;
    if (gemv_takes(c, &w, 1, n)) {
        gemv(c, &w, 1, x, ldx, n, &y, &ldy, gemv_norm{}, acc);
        return;
    }
    /* the tensor-core GEMM up to SK_MAX_TOK tokens. (Quantized prefill in passes of SK_MAX_TOK
     * tokens measured slower than the fp32 copy and cuBLAS on an H200: pp512 of the 0.8B
     * Q4_K_M 12.3k against 16.9k t/s.) */
    if (skinny(c, &w, n)) {
        const float *us;
        uint16_t *xh = split_half(c, &w, x, ldx, n, &us);
        if (xh) cuda_skinny_gemm(c, &w, 1, xh, us, n, &y, &ldy, acc);
        return;
    }
    if (w.dtype == TS_DTYPE_F32) {
        gemm(c, w.data, CUDA_R_32F, w.rows, w.cols, x, CUDA_R_32F, ldx, n, y, ldy, acc);
    } else if (half) {
        const float *us;
        uint16_t *xh = split_half(c, &w, x, ldx, n, &us);
        if (!xh) return;
        int64_t total = (int64_t)n * w.cols;
        cudaDataType t = w.dtype == TS_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        /* scaled F16 activations: the product into scratch, then unscaled into y */
        float *p = us ? (float *)cuda_scratch(c, 1, (size_t)(n * w.rows) * sizeof(float)) : y;
        int64_t ldp = us ? w.rows : ldy;
        if (!p) return;
        gemm(c, w.data, t, w.rows, w.cols, xh, t, w.cols, n, p, ldp, acc && !us);
        gemm(c, w.data, t, w.rows, w.cols, xh + total, t, w.cols, n, p, ldp, true);
        if (us)
            cuda_launch(c, "matmul unscale", k_unscale, cuda_blocks(n * w.rows, 256), 256, 0,
                        (const float *)p, w.rows, n, us, y, ldy, acc);
    } else if (c->qprefill_bf16) {
        /* quantized: decoded to bf16 (each weight rounded by up to 2^-9, as the tensor-core
         * GEMM of cuda_gemm_skinny.cu decodes them), then the two tensor-core GEMMs of the 16-bit
         * weights; the exact fp32 copy and an fp32 GEMM with TESSERA_CUDA_QPREFILL_BF16=0 */
        uint16_t *wb = (uint16_t *)cuda_scratch(c, 1, (size_t)(w.rows * w.cols) * 2);
        const float *us; /* NULL: the activations are bf16 */
        uint16_t *xh = wb ? split_half(c, &w, x, ldx, n, &us) : NULL;
        if (!xh) return;
        dequant(c, &w, (__nv_bfloat16 *)wb);
        int64_t total = (int64_t)n * w.cols;
        gemm(c, wb, CUDA_R_16BF, w.rows, w.cols, xh, CUDA_R_16BF, w.cols, n, y, ldy, acc);
        gemm(c, wb, CUDA_R_16BF, w.rows, w.cols, xh + total, CUDA_R_16BF, w.cols, n, y, ldy, true);
    } else {
        float *wf = (float *)cuda_scratch(c, 1, (size_t)(w.rows * w.cols) * sizeof(float));
        if (!wf) return;
        dequant(c, &w, wf);
        gemm(c, wf, CUDA_R_32F, w.rows, w.cols, x, CUDA_R_32F, ldx, n, y, ldy, acc);
    }
}

void cuda_op_matmul(ts_backend *be, const ts_tensor *W, const float *x, int64_t ldx, int n,
                    float *y, int64_t ldy) {
    cuda_ctx *c = cuda_of(be);
    cuda_wview w;
    if (n > 0 && cuda_weight(c, W, &w)) matmul(c, w, x, ldx, n, y, ldy, false);
}

void cuda_op_matmul_add(ts_backend *be, const ts_tensor *W, const float *x, int64_t ldx, int n,
                        float *y, int64_t ldy) {
    cuda_ctx *c = cuda_of(be);
    cuda_wview w;
    if (n > 0 && cuda_weight(c, W, &w)) matmul(c, w, x, ldx, n, y, ldy, true);
}

/* Whether the GEMVs of nw weights for n tokens fold an input norm into their reading of x: up
 * to GEMV_MAX_TOK tokens (each GEMV reads all of x), unless TESSERA_CUDA_FOLD_NORM=0, for
 * 16/32-bit float weights, whose GEMV waits on memory, and for one token of Q4_K, Q6_K, Q4_0
 * and Q5_0 (Q8_0's single-token GEMV measured 1-2% slower with its norm folded in on an H200,
 * Q4_0's 8% faster: bench/RESULTS.md). The
 * quantized GEMVs are bound by their instructions (decoding): with a warp per row the norm's two
 * operations per element made the 0.8B Q4_K_M's decode 4% slower on an H200 than a norm kernel
 * of its own (BF16: 6-8% faster); the single-token kernel (cuda_gemv_one.cu) reads each x value
 * once for 1-8 rows, so there the norm costs a fraction of an operation per weight. */
static bool gemv_folds_norm(const cuda_ctx *c, const cuda_wview *w, int nw, int n) {
    if (!c->fold_norm || nw > GEMV_SET || !gemv_takes(c, w, nw, n)) return false;
    for (int j = 0; j < nw; j++) {
        bool flt =
            w[j].dtype == TS_DTYPE_F32 || w[j].dtype == TS_DTYPE_F16 || w[j].dtype == TS_DTYPE_BF16;
        bool q = w[j].dtype == TS_DTYPE_Q4_K || w[j].dtype == TS_DTYPE_Q6_K ||
                 w[j].dtype == TS_DTYPE_Q4_0 || w[j].dtype == TS_DTYPE_Q5_0;
        if (!flt && !(q && n == 1)) return false;
    }
    return true;
}

/* The input norm of matmul_n / matmul_glu where the GEMV does not fold it in (more than
 * GEMV_MAX_TOK tokens): its own kernel into pre->scratch, whose rows the products then read. */
static const float *normed_input(ts_backend *be, const float *x, int64_t ldx, int n, int64_t cols,
                                 const ts_prenorm *pre) {
    cuda_op_rmsnorm(be, x, ldx, n, (int)cols, pre->w, pre->eps, pre->scratch, ldx);
    return pre->scratch;
}

/* Whether a stack is of exactly two weight types: then g / gy hold the weights (and outputs) of
 * the first one's type, in order, then the others; the count of the first type's, else 0. */
static int pair_split(const cuda_wview *w, int nw, float *const *y, cuda_wview *g, float **gy) {
    int na = 0, k = 0;
    for (int j = 0; j < nw; j++)
        if (w[j].dtype == w[0].dtype) g[k] = w[j], gy[k++] = y[j], na++;
    for (int j = 0; j < nw; j++) {
        if (w[j].dtype == w[0].dtype) continue;
        if (k > na && w[j].dtype != g[na].dtype) return 0; /* a third type */
        g[k] = w[j], gy[k++] = y[j];
    }
    return na < nw ? na : 0;
}

void cuda_op_matmul_n(ts_backend *be, const ts_tensor *const *W, int nw, const float *x,
                      int64_t ldx, int n, const ts_prenorm *pre, float *const *y,
                      const int64_t *ldy) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0 || nw <= 0) return;
    cuda_wview w[GEMV_SET], g[GEMV_SET];
    for (int j = 0; j < nw && j < GEMV_SET; j++)
        if (!cuda_weight(c, W[j], &w[j])) return;
    bool few = gemv_takes(c, w, nw < GEMV_SET ? nw : GEMV_SET, n), one_launch = nw <= GEMV_SET;
    for (int j = 0; j < nw && one_launch; j++)
        one_launch = w[j].dtype == w[0].dtype && w[j].cols == w[0].cols && skinny(c, &w[j], n);
    /* the input norm: folded into the GEMVs (gemv_folds_norm) or into the split of x for the
     * tensor-core GEMM where all weights take one launch; else a kernel of its own */
    gemv_norm nrm = {};
    const ts_prenorm *split_pre = NULL;
    if (pre && gemv_folds_norm(c, w, nw, n)) {
        nrm = gemv_norm{pre->w, pre->eps};
    } else if (pre && !few && one_launch && c->fold_norm) {
        split_pre = pre;
    } else if (pre) {
        x = normed_input(be, x, ldx, n, ts_tensor_cols(W[0]), pre);
    }
    if ((!few && n > SK_MAX_TOK) || nw > GEMV_SET) {
        for (int j = 0; j < nw; j++)
            cuda_op_matmul(be, W[j], x, ldx, n, y[j], ldy[j]);
        return;
    }
    /* one launch per group of weights with the dtype and column count of its first member:
     * the GEMV for a few tokens, the tensor-core GEMM (one split of x per group) above */
    float *gy[GEMV_SET];
    int64_t gld[GEMV_SET];
    bool done[GEMV_SET] = {false};
    /* one token of a stack of two quantized types: one launch for both (cuda_gemv_pair.cu) */
    int na = few && n == 1 ? pair_split(w, nw, y, g, gy) : 0;
    if (na && cuda_gemv_pair(c, g, na, g + na, nw - na, x, gy, gy + na, nrm.w, nrm.eps)) return;
    for (int j = 0; j < nw; j++) {
        if (done[j]) continue;
        if (!few && !skinny(c, &w[j], n)) {
            matmul(c, w[j], x, ldx, n, y[j], ldy[j], false);
            done[j] = true;
            continue;
        }
        int k = 0;
        for (int i = j; i < nw; i++)
            if (!done[i] && w[i].dtype == w[j].dtype && w[i].cols == w[j].cols &&
                (few || skinny(c, &w[i], n))) {
                g[k] = w[i], gy[k] = y[i], gld[k] = ldy[i], k++;
                done[i] = true;
            }
        if (few) {
            gemv(c, g, k, x, ldx, n, gy, gld, nrm, false);
        } else {
            const float *us;
            uint16_t *xh = split_half(c, &g[0], x, ldx, n, &us, split_pre);
            if (xh) cuda_skinny_gemm(c, g, k, xh, us, n, gy, gld, false);
        }
    }
}

template <ts_dtype DT, bool NORM>
static void launch_gemv_glu(cuda_ctx *c, const cuda_wview *g, const cuda_wview *u, const float *x,
                            int64_t ldx, int n, bool gelu, float *out, int64_t ldo, gemv_norm nrm) {
    size_t rb = cuda_row_bytes(g->dtype, g->cols);
    unsigned blocks = cuda_blocks(g->rows, GEMV_WARPS);
    const uint8_t *wg = (const uint8_t *)g->data, *wu = (const uint8_t *)u->data;
    if (gelu)
        cuda_launch(c, "gemv_glu", k_gemv_glu<DT, true, NORM>, blocks, 32 * GEMV_WARPS, 0, wg, wu,
                    g->rows, rb, g->cols, x, ldx, n, out, ldo, c->prefetch, nrm);
    else
        cuda_launch(c, "gemv_glu", k_gemv_glu<DT, false, NORM>, blocks, 32 * GEMV_WARPS, 0, wg, wu,
                    g->rows, rb, g->cols, x, ldx, n, out, ldo, c->prefetch, nrm);
}

void cuda_op_matmul_glu(ts_backend *be, const ts_tensor *Wg, const ts_tensor *Wu, const float *x,
                        int64_t ldx, int n, const ts_prenorm *pre, bool gelu, float *tg, float *tu,
                        int64_t ldt, float *out, int64_t ldo) {
    cuda_ctx *c = cuda_of(be);
    cuda_wview g, u;
    if (n <= 0 || !cuda_weight(c, Wg, &g) || !cuda_weight(c, Wu, &u)) return;
    /* other types: the general path below reports them */
    cuda_wview gu[2] = {g, u};
    bool few = gemv_takes(c, gu, 2, n);
    if (pre && few && !gemv_folds_norm(c, gu, 2, n)) {
        x = normed_input(be, x, ldx, n, g.cols, pre);
        pre = NULL;
    }
    if (few && cuda_gemv_one_glu(c, &g, &u, x, ldx, n, pre ? pre->w : NULL, pre ? pre->eps : 0.0f,
                                 gelu, out, ldo))
        return;
    if (few && g.dtype == u.dtype && g.rows == u.rows && g.cols == u.cols &&
        gemv_dtype(g.dtype, [&](auto dt) {
            if (pre)
                launch_gemv_glu<decltype(dt)::value, true>(c, &g, &u, x, ldx, n, gelu, out, ldo,
                                                           gemv_norm{pre->w, pre->eps});
            else
                launch_gemv_glu<decltype(dt)::value, false>(c, &g, &u, x, ldx, n, gelu, out, ldo,
                                                            gemv_norm{});
        }))
        return;
    const ts_tensor *W[2] = {Wg, Wu};
    float *y[2] = {tg, tu};
    int64_t ldy[2] = {ldt, ldt};
    cuda_op_matmul_n(be, W, 2, x, ldx, n, pre, y, ldy);
    if (gelu)
        cuda_op_gelu_mul(be, tg, tu, ldt, n, (int)g.rows, out, ldo);
    else
        cuda_op_swiglu(be, tg, tu, ldt, n, (int)g.rows, out, ldo);
}
