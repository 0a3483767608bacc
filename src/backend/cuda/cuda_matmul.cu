/* y[t, o] = sum_i W[o, i] x[t, i] on the device, for weights stored row-major [out, in].
 *
 * Up to GEMV_MAX_TOK tokens (decode): one warp per output row streams the row once with 16-byte
 * loads and keeps a partial sum per token, all in fp32. More tokens (prefill): cuBLAS. F32
 * weights go through an fp32 GEMM (CUBLAS_COMPUTE_32F: no TF32); F16/BF16 weights run on tensor
 * cores with fp32 accumulation against the activations split into two 16-bit parts (two GEMMs:
 * rounding the activations to bf16 alone costs ~2e-2 relative error in the logits of the bf16
 * fixtures); Q8_0 weights are dequantized to an fp32 scratch first. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_int.cuh"

#define GEMV_MAX_TOK 8
#define GEMV_WARPS 8

__device__ static inline float bf16f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ static inline float f16f(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}

/* One weight element as fp32. */
template <ts_dtype DT> __device__ static inline float wload(const void *row, int64_t i);
template <> __device__ inline float wload<TS_DTYPE_F16>(const void *row, int64_t i) {
    return f16f(((const uint16_t *)row)[i]);
}
template <> __device__ inline float wload<TS_DTYPE_BF16>(const void *row, int64_t i) {
    return bf16f(((const uint16_t *)row)[i]);
}

/* 16-bit weights, 8 per lane per step when the row allows 16-byte loads. */
template <ts_dtype DT>
__device__ static void gemv_row_half(const uint16_t *row, int64_t cols, const float *x,
                                     int64_t ldx, int n, float *acc) {
    int lane = threadIdx.x & 31;
    bool vec = (cols % 8) == 0 && ((uintptr_t)row % 16) == 0;
    if (vec) {
        for (int64_t i = (int64_t)lane * 8; i < cols; i += 32 * 8) {
            uint4 u = *(const uint4 *)(row + i);
            uint32_t w4[4] = {u.x, u.y, u.z, u.w};
            float w[8];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint16_t lo = (uint16_t)(w4[j] & 0xffffu), hi = (uint16_t)(w4[j] >> 16);
                w[2 * j] = DT == TS_DTYPE_BF16 ? bf16f(lo) : f16f(lo);
                w[2 * j + 1] = DT == TS_DTYPE_BF16 ? bf16f(hi) : f16f(hi);
            }
#pragma unroll
            for (int t = 0; t < GEMV_MAX_TOK; t++) {
                if (t >= n) break;
                const float *xt = x + t * ldx + i;
                float s = acc[t];
#pragma unroll
                for (int j = 0; j < 8; j++) s += w[j] * xt[j];
                acc[t] = s;
            }
        }
    } else {
        for (int64_t i = lane; i < cols; i += 32) {
            float w = wload<DT>(row, i);
#pragma unroll
            for (int t = 0; t < GEMV_MAX_TOK; t++)
                if (t < n) acc[t] += w * x[t * ldx + i];
        }
    }
}

/* Q8_0: blocks of 34 bytes (fp16 scale, 32 int8), one block per lane per step. */
__device__ static void gemv_row_q8_0(const uint8_t *row, int64_t cols, const float *x,
                                     int64_t ldx, int n, float *acc) {
    int lane = threadIdx.x & 31;
    int64_t nb = cols / 32;
    for (int64_t b = lane; b < nb; b += 32) {
        const uint16_t *blk = (const uint16_t *)(row + b * 34); /* 2-byte aligned */
        float d = f16f(blk[0]);
        float q[32];
#pragma unroll
        for (int j = 0; j < 16; j++) {
            uint16_t u = blk[1 + j];
            q[2 * j] = (float)(int8_t)(u & 0xffu);
            q[2 * j + 1] = (float)(int8_t)(u >> 8);
        }
#pragma unroll
        for (int t = 0; t < GEMV_MAX_TOK; t++) {
            if (t >= n) break;
            const float *xt = x + t * ldx + b * 32;
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < 32; j++) s += q[j] * xt[j];
            acc[t] += d * s;
        }
    }
}

template <ts_dtype DT>
__global__ static void k_gemv(const void *W, size_t row_bytes, int64_t rows, int64_t cols,
                              const float *x, int64_t ldx, int n, float *y, int64_t ldy) {
    int64_t o = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (o >= rows) return;
    const uint8_t *row = (const uint8_t *)W + o * row_bytes;
    float acc[GEMV_MAX_TOK];
#pragma unroll
    for (int t = 0; t < GEMV_MAX_TOK; t++) acc[t] = 0.0f;
    if constexpr (DT == TS_DTYPE_Q8_0) {
        gemv_row_q8_0(row, cols, x, ldx, n, acc);
    } else if constexpr (DT == TS_DTYPE_F32) {
        for (int64_t i = threadIdx.x & 31; i < cols; i += 32) {
            float w = ((const float *)row)[i];
#pragma unroll
            for (int t = 0; t < GEMV_MAX_TOK; t++)
                if (t < n) acc[t] += w * x[t * ldx + i];
        }
    } else {
        gemv_row_half<DT>((const uint16_t *)row, cols, x, ldx, n, acc);
    }
#pragma unroll
    for (int t = 0; t < GEMV_MAX_TOK; t++) {
        if (t >= n) break;
        float s = acc[t];
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if ((threadIdx.x & 31) == 0) y[t * ldy + o] = s;
    }
}

__global__ static void k_dequant_q8_0(const uint8_t *W, int64_t rows, int64_t cols, float *out) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * cols) return;
    int64_t r = idx / cols, i = idx % cols;
    const uint8_t *blk = W + r * (cols / 32 * 34) + (i / 32) * 34;
    float d = f16f((uint16_t)(blk[0] | (blk[1] << 8)));
    out[idx] = d * (float)(int8_t)blk[2 + i % 32];
}

/* x split in two 16-bit parts, hi = round(x) and lo = round(x - hi): rows [0, n) of out hold hi,
 * rows [n, 2n) lo. W*hi + W*lo carries about 16 mantissa bits of x instead of 8 (bf16). */
template <bool BF16>
__global__ static void k_split_half(const float *x, int64_t ldx, int n, int64_t cols, void *out) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n * cols) return;
    float v = x[(idx / cols) * ldx + idx % cols];
    int64_t lo = (int64_t)n * cols + idx;
    if (BF16) {
        __nv_bfloat16 h = __float2bfloat16_rn(v);
        ((__nv_bfloat16 *)out)[idx] = h;
        ((__nv_bfloat16 *)out)[lo] = __float2bfloat16_rn(v - __bfloat162float(h));
    } else {
        __half h = __float2half_rn(v);
        ((__half *)out)[idx] = h;
        ((__half *)out)[lo] = __float2half_rn(v - __half2float(h));
    }
}

static void gemv(cuda_ctx *c, const cuda_wview *w, const float *x, int64_t ldx, int n, float *y,
                 int64_t ldy) {
    size_t rb = ts_dtype_row_bytes(w->dtype, w->cols);
    unsigned blocks = cuda_blocks(w->rows, GEMV_WARPS);
    dim3 th(32 * GEMV_WARPS);
    for (int t0 = 0; t0 < n; t0 += GEMV_MAX_TOK) {
        int k = n - t0 < GEMV_MAX_TOK ? n - t0 : GEMV_MAX_TOK;
        const float *xt = x + t0 * ldx;
        float *yt = y + t0 * ldy;
        switch (w->dtype) {
        case TS_DTYPE_F32:
            k_gemv<TS_DTYPE_F32><<<blocks, th, 0, c->stream>>>(w->data, rb, w->rows, w->cols, xt,
                                                               ldx, k, yt, ldy);
            break;
        case TS_DTYPE_F16:
            k_gemv<TS_DTYPE_F16><<<blocks, th, 0, c->stream>>>(w->data, rb, w->rows, w->cols, xt,
                                                               ldx, k, yt, ldy);
            break;
        case TS_DTYPE_BF16:
            k_gemv<TS_DTYPE_BF16><<<blocks, th, 0, c->stream>>>(w->data, rb, w->rows, w->cols,
                                                                xt, ldx, k, yt, ldy);
            break;
        default:
            k_gemv<TS_DTYPE_Q8_0><<<blocks, th, 0, c->stream>>>(w->data, rb, w->rows, w->cols,
                                                                xt, ldx, k, yt, ldy);
            break;
        }
        if (!cuda_launched(c, "gemv")) return;
    }
}

/* Column-major view: Y^T (rows x n, ld ldy) = W (cols x rows, ld cols)^T * X^T (cols x n). */
static void gemm(cuda_ctx *c, const void *W, cudaDataType wt, int64_t rows, int64_t cols,
                 const void *x, cudaDataType xt, int64_t ldx, int n, float *y, int64_t ldy,
                 bool accumulate) {
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cuda_check_blas(c,
                    cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, n, (int)cols, &one,
                                 W, wt, (int)cols, x, xt, (int)ldx, &beta, y, CUDA_R_32F,
                                 (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "gemm");
}

void cuda_op_matmul(ts_backend *be, const ts_tensor *W, const float *x, int64_t ldx, int n,
                    float *y, int64_t ldy) {
    cuda_ctx *c = cuda_of(be);
    cuda_wview w;
    if (n <= 0 || !cuda_weight(c, W, &w)) return;
    if (n <= GEMV_MAX_TOK) {
        gemv(c, &w, x, ldx, n, y, ldy);
        return;
    }
    switch (w.dtype) {
    case TS_DTYPE_F32:
        gemm(c, w.data, CUDA_R_32F, w.rows, w.cols, x, CUDA_R_32F, ldx, n, y, ldy, false);
        break;
    case TS_DTYPE_F16:
    case TS_DTYPE_BF16: {
        bool bf = w.dtype == TS_DTYPE_BF16;
        int64_t total = (int64_t)n * w.cols;
        uint16_t *xh = (uint16_t *)cuda_scratch(c, 0, (size_t)total * 2 * 2);
        if (!xh) return;
        if (bf)
            k_split_half<true><<<cuda_blocks(total, 256), 256, 0, c->stream>>>(x, ldx, n, w.cols,
                                                                               xh);
        else
            k_split_half<false><<<cuda_blocks(total, 256), 256, 0, c->stream>>>(x, ldx, n, w.cols,
                                                                                xh);
        if (!cuda_launched(c, "matmul convert")) return;
        cudaDataType t = bf ? CUDA_R_16BF : CUDA_R_16F;
        gemm(c, w.data, t, w.rows, w.cols, xh, t, w.cols, n, y, ldy, false);
        gemm(c, w.data, t, w.rows, w.cols, xh + total, t, w.cols, n, y, ldy, true);
        break;
    }
    default: { /* Q8_0 */
        int64_t total = w.rows * w.cols;
        float *wf = (float *)cuda_scratch(c, 1, (size_t)total * sizeof(float));
        if (!wf) return;
        k_dequant_q8_0<<<cuda_blocks(total, 256), 256, 0, c->stream>>>(
            (const uint8_t *)w.data, w.rows, w.cols, wf);
        if (!cuda_launched(c, "matmul dequant")) return;
        gemm(c, wf, CUDA_R_32F, w.rows, w.cols, x, CUDA_R_32F, ldx, n, y, ldy, false);
        break;
    }
    }
}
