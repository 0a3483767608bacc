/* The ops of an image encoder and of image positions in a decoder (backend.h): rope_cs,
 * layernorm, bias_act, vision_patches and vision_positions here; attention_full is in
 * cuda_ops_seq.cu, beside the tiled prompt kernel it runs. Each mirrors the CPU reference
 * (backend/cpu/ops_vision.c) in fp32 with its order of operations; the layernorm's mean and
 * variance are summed in double as there. */
#include "backend/cuda/cuda_int.cuh"
#include "backend/vision_grid.h"

#include <math.h>

/* A block per token, a thread per (head, pair): pair (k, k + half) of each head rotated by the
 * token's cosine cs[k] and sine cs[half + k]. */
__global__ static void k_rope_cs(float *x, int64_t ldx, int n_heads, int64_t head_stride, int half,
                                 const float *cs) {
    cuda_pdl_entry();
    int64_t t = blockIdx.x;
    const float *c = cs + t * 2 * half, *s = c + half;
    for (int idx = threadIdx.x; idx < n_heads * half; idx += blockDim.x) {
        int h = idx / half, k = idx % half;
        float *v = x + t * ldx + h * head_stride;
        float x0 = v[k], x1 = v[k + half];
        v[k] = x0 * c[k] - x1 * s[k];
        v[k + half] = x1 * c[k] + x0 * s[k];
    }
}

void cuda_op_rope_cs(ts_backend *be, float *x, int64_t ldx, int n_tok, int n_heads,
                     int64_t head_stride, int half, const float *cs) {
    cuda_ctx *c = cuda_of(be);
    if (n_tok <= 0 || n_heads <= 0 || half <= 0) return;
    cuda_launch(c, "rope_cs", k_rope_cs, (unsigned)n_tok, 128, 0, x, ldx, n_heads, head_stride,
                half, cs);
}

/* A block per row: the mean, then the variance about it, both in double; out may be x (each
 * thread rewrites only what it read, after both sums). */
__global__ static void k_layernorm(const float *x, int64_t ldx, int dim, const float *w,
                                   const float *b, float eps, float *out, int64_t ldo) {
    cuda_pdl_entry();
    const float *xr = x + blockIdx.x * ldx;
    float *o = out + blockIdx.x * ldo;
    double s = 0.0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        s += xr[i];
    double mean = row_sum_block(s) / dim, v = 0.0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        double d = (double)xr[i] - mean;
        v += d * d;
    }
    v = row_sum_block(v);
    float inv = (float)(1.0 / sqrt(v / dim + eps)), m = (float)mean;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        o[i] = (xr[i] - m) * inv * w[i] + b[i];
}

void cuda_op_layernorm(ts_backend *be, const float *x, int64_t ldx, int n_rows, int dim,
                       const float *w, const float *b, float eps, float *out, int64_t ldo) {
    cuda_ctx *c = cuda_of(be);
    if (n_rows <= 0 || dim <= 0) return;
    cuda_launch(c, "layernorm", k_layernorm, (unsigned)n_rows, ROW_THREADS, 0, x, ldx, dim, w, b,
                eps, out, ldo);
}

/* x = act(x + bias), a thread an element. The tanh GELU is the decoders' (cuda_gelu_tanh); the
 * erf one PyTorch's exact GELU. */
__global__ static void k_bias_act(float *x, int64_t ldx, int n_rows, int dim, const float *bias,
                                  int act) {
    cuda_pdl_entry();
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n_rows * dim) return;
    int64_t r = idx / dim;
    int i = (int)(idx % dim);
    float *p = x + r * ldx + i, v = *p;
    if (bias) v += bias[i];
    if (act == TS_ACT_GELU_TANH)
        v = cuda_gelu_tanh(v);
    else if (act == TS_ACT_GELU_ERF)
        v = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    *p = v;
}

void cuda_op_bias_act(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim, const float *bias,
                      int act) {
    cuda_ctx *c = cuda_of(be);
    int64_t total = (int64_t)n_rows * dim;
    if (total <= 0 || (!bias && act == TS_ACT_NONE)) return;
    cuda_launch(c, "bias_act", k_bias_act, cuda_blocks(total, EW_THREADS), EW_THREADS, 0, x, ldx,
                n_rows, dim, bias, act);
}

/* A block per patch, a thread per element of its row in turn: element ((c * temporal + t) * P
 * + y) * P + x is pixel (y, x) of the patch in frame t (the one frame of a still image),
 * channel c, looked up in the channel's table. */
__global__ static void k_vision_patches(const uint8_t *rgb, ts_patch_dims d, const float *lut,
                                        float *out) {
    cuda_pdl_entry();
    int n = (int)blockIdx.x, P = d.patch, PP = P * P, K = 3 * d.temporal * PP, row, col;
    ts_grid_patch_rc(n, d.width / P, d.merge, &row, &col);
    float *o = out + (int64_t)n * K;
    int64_t frame = (int64_t)d.width * d.height * 3;
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
        int ch = i / (d.temporal * PP), t = i / PP % d.temporal, y = i % PP / P, x = i % P;
        const uint8_t *f = rgb + (d.frames > 1 ? t * frame : 0);
        o[i] = lut[ch * 256 + f[((int64_t)(row * P + y) * d.width + col * P + x) * 3 + ch]];
    }
}

void cuda_op_vision_patches(ts_backend *be, const uint8_t *rgb, const ts_patch_dims *d,
                            const float *lut, float *out) {
    cuda_ctx *c = cuda_of(be);
    int n = (d->height / d->patch) * (d->width / d->patch);
    if (n <= 0) return;
    cuda_launch(c, "vision_patches", k_vision_patches, (unsigned)n, 256, 0, rgb, *d, lut, out);
}

/* A block per patch, a thread per column in turn: the four taps' rows times their weights,
 * summed from zero in the CPU's order, each product and sum rounded (no fused multiply-add,
 * so the bits are the CPU's). */
__global__ static void k_vision_positions(const float *table, int side, int dim, int grid_h,
                                          int grid_w, int merge, float *out) {
    cuda_pdl_entry();
    int n = (int)blockIdx.x, row, col, th[2], tw[2];
    float wh[2], ww[2];
    ts_grid_patch_rc(n, grid_w, merge, &row, &col);
    ts_grid_taps(row, grid_h, side, th, wh);
    ts_grid_taps(col, grid_w, side, tw, ww);
    const float *src[4];
    float wt[4];
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            src[2 * a + b] = table + (int64_t)(th[a] * side + tw[b]) * dim;
            wt[2 * a + b] = __fmul_rn(wh[a], ww[b]);
        }
    float *o = out + (int64_t)n * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < 4; k++)
            acc = __fadd_rn(acc, __fmul_rn(src[k][i], wt[k]));
        o[i] = acc;
    }
}

void cuda_op_vision_positions(ts_backend *be, const float *table, int side, int dim, int grid_h,
                              int grid_w, int merge, float *out) {
    cuda_ctx *c = cuda_of(be);
    if (grid_h <= 0 || grid_w <= 0 || dim <= 0) return;
    cuda_launch(c, "vision_positions", k_vision_positions, (unsigned)(grid_h * grid_w), 256, 0,
                table, side, dim, grid_h, grid_w, merge, out);
}
