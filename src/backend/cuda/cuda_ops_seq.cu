/* Sequence-mixing ops on the device: causal attention over the KV cache, the causal conv, the
 * Gated DeltaNet gates and delta rule. Each mirrors its CPU reference (backend/cpu/
 * ops_attention.c, ops_gdn.c) step for step in fp32.
 *
 * The delta rule runs in its recurrent form for both the decode and the chunked (prefill)
 * request: one block per v-head walks the tokens in order with the head's state in shared
 * memory (or in global memory when it does not fit). Both forms compute the same function, so
 * this is correct, but prefill does not get the chunked form's parallelism yet. */
#include <float.h>
#include <math.h>

#include "backend/cuda/cuda_int.cuh"

#define ATTN_WARPS 4
#define MAX_HEAD_DIM 512

/* One warp per (head, query): lane l holds dims l, l+32, ...; online softmax over the keys. */
template <int NPL>
__global__ static void k_attention(const float *q, int64_t ldq, int64_t q_head_stride, int n,
                                   int pos0, const float *kc, const float *vc, ts_attn_dims d,
                                   float *out, int64_t ldo) {
    int64_t w = (int64_t)blockIdx.x * ATTN_WARPS + (threadIdx.x >> 5);
    if (w >= (int64_t)d.n_heads * n) return;
    int lane = threadIdx.x & 31;
    int h = (int)(w % d.n_heads), i = (int)(w / d.n_heads);
    int hd = d.head_dim;
    int kvh = h / (d.n_heads / d.n_kv_heads);
    int64_t ldkv = (int64_t)d.n_kv_heads * hd;
    const float *qr = q + i * ldq + h * q_head_stride;
    int qpos = pos0 + i, first = 0;
    if (d.window > 0 && qpos - d.window + 1 > 0) first = qpos - d.window + 1;
    float qv[NPL], acc[NPL];
#pragma unroll
    for (int j = 0; j < NPL; j++) {
        int ch = lane + 32 * j;
        qv[j] = ch < hd ? qr[ch] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -FLT_MAX, l = 0.0f;
    for (int p = first; p <= qpos; p++) {
        const float *k = kc + p * ldkv + (int64_t)kvh * hd;
        const float *v = vc + p * ldkv + (int64_t)kvh * hd;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < NPL; j++) {
            int ch = lane + 32 * j;
            if (ch < hd) s += qv[j] * k[ch];
        }
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        s *= d.scale;
        if (d.softcap > 0) s = d.softcap * tanhf(s / d.softcap);
        float corr = 1.0f, e = 1.0f;
        if (s > m) {
            corr = expf(m - s); /* 0 on the first key */
            l = l * corr + 1.0f;
            m = s;
        } else {
            e = expf(s - m);
            l += e;
        }
#pragma unroll
        for (int j = 0; j < NPL; j++) {
            int ch = lane + 32 * j;
            if (ch < hd) acc[j] = acc[j] * corr + e * v[ch];
        }
    }
    float inv = 1.0f / l;
    float *o = out + i * ldo + (int64_t)h * hd;
#pragma unroll
    for (int j = 0; j < NPL; j++) {
        int ch = lane + 32 * j;
        if (ch < hd) o[ch] = acc[j] * inv;
    }
}

void cuda_op_attention(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride, int n,
                       int pos0, const float *k_cache, const float *v_cache,
                       const ts_attn_dims *dims, float *out, int64_t ldo) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0) return;
    if (dims->head_dim > MAX_HEAD_DIM || dims->head_dim < 1) {
        cuda_check(c, cudaErrorInvalidValue, "attention: head_dim over 512");
        return;
    }
    unsigned blocks = cuda_blocks((int64_t)dims->n_heads * n, ATTN_WARPS);
    dim3 th(32 * ATTN_WARPS);
    int hd = dims->head_dim;
#define LAUNCH(NPL)                                                                                \
    k_attention<NPL><<<blocks, th, 0, c->stream>>>(q, ldq, q_head_stride, n, pos0, k_cache,        \
                                                   v_cache, *dims, out, ldo)
    if (hd <= 64)
        LAUNCH(2);
    else if (hd <= 128)
        LAUNCH(4);
    else if (hd <= 256)
        LAUNCH(8);
    else
        LAUNCH(16);
#undef LAUNCH
    cuda_launched(c, "attention");
}

/* One thread per channel: all n outputs, then the state shift (ascending k reads only indices
 * not yet overwritten). */
__global__ static void k_conv1d_silu(const float *x, int64_t ldx, int n, int C, int K,
                                     const float *w, float *state, float *out, int64_t ldo) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int hist = K - 1;
    const float *wc = w + (int64_t)c * K;
    for (int t = 0; t < n; t++) {
        float s = 0.0f;
        for (int k = 0; k < K; k++) {
            int tau = t - hist + k;
            float xv = tau < 0 ? state[(int64_t)(hist + tau) * C + c] : x[tau * ldx + c];
            s += wc[k] * xv;
        }
        out[t * ldo + c] = s / (1.0f + expf(-s));
    }
    for (int k = 0; k < hist; k++) {
        int src = k + n; /* index into [old state ; x] */
        state[(int64_t)k * C + c] =
            src < hist ? state[(int64_t)src * C + c] : x[(int64_t)(src - hist) * ldx + c];
    }
}

void cuda_op_conv1d_silu(ts_backend *be, const float *x, int64_t ldx, int n, int C, int K,
                         const float *w, float *state, float *out, int64_t ldo) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0 || C <= 0) return;
    k_conv1d_silu<<<cuda_blocks(C, 128), 128, 0, c->stream>>>(x, ldx, n, C, K, w, state, out,
                                                              ldo);
    cuda_launched(c, "conv1d_silu");
}

__global__ static void k_gdn_gates(const float *a, int64_t lda, const float *b, int64_t ldb,
                                   int n, int Hv, const float *neg_exp_a, const float *dt_bias,
                                   float *g, float *beta) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n * Hv) return;
    int64_t t = idx / Hv;
    int h = (int)(idx % Hv);
    beta[idx] = 1.0f / (1.0f + expf(-b[t * ldb + h]));
    float x = a[t * lda + h] + dt_bias[h];
    float sp = x > 20.0f ? x : log1pf(expf(x)); /* softplus as torch computes it */
    g[idx] = neg_exp_a[h] * sp;
}

void cuda_op_gdn_gates(ts_backend *be, const float *a, int64_t lda, const float *b, int64_t ldb,
                       int n, int Hv, const float *neg_exp_a, const float *dt_bias, float *g,
                       float *beta) {
    cuda_ctx *c = cuda_of(be);
    int64_t total = (int64_t)n * Hv;
    if (total <= 0) return;
    k_gdn_gates<<<cuda_blocks(total, 256), 256, 0, c->stream>>>(a, lda, b, ldb, n, Hv, neg_exp_a,
                                                                dt_bias, g, beta);
    cuda_launched(c, "gdn_gates");
}

/* One block per v-head, thread c owns column c of the head's [d_k][d_v] state; per token the
 * reference's order: decay, predict, correct, read. */
__global__ static void k_gdn(const float *q, const float *k, int64_t ldqk, const float *v,
                             int64_t ldv, const float *g, const float *beta, int n,
                             ts_gdn_dims d, float *state, float *out, bool smem_state) {
    extern __shared__ float sm[];
    int dk = d.d_k, dv = d.d_v, Hv = d.n_v_heads, h = blockIdx.x, c = threadIdx.x;
    int kh = h / (d.n_v_heads / d.n_k_heads);
    float *qs = sm, *ks = sm + dk;
    float *Sg = state + (int64_t)h * dk * dv;
    float *S = smem_state ? sm + 2 * dk : Sg;
    if (smem_state)
        for (int i = 0; i < dk; i++) S[i * dv + c] = Sg[i * dv + c];
    for (int t = 0; t < n; t++) {
        __syncthreads(); /* the previous token's q and k are no longer read */
        for (int i = c; i < dk; i += blockDim.x) {
            qs[i] = q[t * ldqk + (int64_t)kh * dk + i];
            ks[i] = k[t * ldqk + (int64_t)kh * dk + i];
        }
        __syncthreads();
        float decay = expf(g[t * Hv + h]), b = beta[t * Hv + h];
        float m = 0.0f;
        for (int i = 0; i < dk; i++) {
            float s = S[i * dv + c] * decay;
            S[i * dv + c] = s;
            m += s * ks[i];
        }
        float delta = b * (v[t * ldv + (int64_t)h * dv + c] - m);
        float o = 0.0f;
        for (int i = 0; i < dk; i++) {
            float s = S[i * dv + c] + ks[i] * delta;
            S[i * dv + c] = s;
            o += s * qs[i];
        }
        out[(int64_t)t * Hv * dv + (int64_t)h * dv + c] = o;
    }
    if (smem_state)
        for (int i = 0; i < dk; i++) Sg[i * dv + c] = S[i * dv + c];
}

void cuda_op_gdn(ts_backend *be, const float *q, const float *k, int64_t ldqk, const float *v,
                 int64_t ldv, const float *g, const float *beta, int n, const ts_gdn_dims *dims,
                 float *state, float *out, bool chunked) {
    (void)chunked; /* same kernel for both forms: see the file comment */
    cuda_ctx *c = cuda_of(be);
    if (n <= 0) return;
    if (dims->d_v > 1024 || dims->d_v < 1) {
        cuda_check(c, cudaErrorInvalidValue, "gdn: d_v over 1024");
        return;
    }
    size_t base = 2 * (size_t)dims->d_k * sizeof(float);
    size_t with_state = base + (size_t)dims->d_k * dims->d_v * sizeof(float);
    int max_smem = 0;
    cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device);
    bool smem_state = with_state <= (size_t)max_smem;
    size_t bytes = smem_state ? with_state : base;
    if (bytes > 48 * 1024 &&
        !cuda_check(c, cudaFuncSetAttribute(k_gdn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)bytes),
                    "gdn smem"))
        return;
    k_gdn<<<dims->n_v_heads, dims->d_v, bytes, c->stream>>>(q, k, ldqk, v, ldv, g, beta, n, *dims,
                                                            state, out, smem_state);
    cuda_launched(c, "gdn");
}
