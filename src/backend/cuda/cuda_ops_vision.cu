/* The ops of an image encoder and of image positions in a decoder (backend.h): rope_cs,
 * layernorm and bias_act here; attention_full is in cuda_ops_seq.cu, beside the tiled prompt
 * kernel it runs. Each mirrors the CPU reference (backend/cpu/ops_vision.c) in fp32 with its
 * order of operations; the layernorm's mean and variance are summed in double as there. */
#include "backend/cuda/cuda_int.cuh"

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
