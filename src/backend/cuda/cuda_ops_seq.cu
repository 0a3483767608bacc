/* Sequence-mixing ops on the device: causal attention over the KV cache, the causal conv, the
 * Gated DeltaNet gates and delta rule. Each mirrors its CPU reference (backend/cpu/
 * ops_attention.c, ops_gdn.c) step for step in fp32.
 *
 * The delta rule runs in its recurrent form for both the decode and the chunked (prefill)
 * request: the state stays in registers (k_gdn_reg) for heads up to 256 keys, else in shared or
 * global memory. Both forms compute the same function, so this is correct, but prefill does not
 * get the chunked form's parallelism over tokens yet. */
#include <float.h>
#include <math.h>

#include "backend/cuda/cuda_int.cuh"

#define ATTN_WARPS 8
#define MAX_HEAD_DIM 512

/* A block per (head, query); its warps take every ATTN_WARPS-th key, each with its own online
 * softmax (running max m, sum l, accumulator), and the block merges the warps' partial results
 * at the end. Lane l holds dims l, l + 32, ... of the query and the accumulator. Splitting the
 * keys over warps is what makes decode (one query, hundreds of keys) fast: a single warp would
 * walk them one after another. */
template <int NPL>
__global__ static void k_attention(const float *q, int64_t ldq, int64_t q_head_stride, int n,
                                   int pos0, const float *kc, const float *vc, ts_attn_dims d,
                                   float *out, int64_t ldo, const ts_seq_run *runs) {
    __shared__ float sm_m[ATTN_WARPS], sm_l[ATTN_WARPS];
    extern __shared__ float sm_acc[]; /* [ATTN_WARPS][head_dim] */
    int h = (int)(blockIdx.x % d.n_heads), i = (int)(blockIdx.x / d.n_heads);
    if (runs) { /* blockIdx.y: the run */
        ts_seq_run r = runs[blockIdx.y];
        if (i >= r.len) return;
        q += r.start * ldq, out += r.start * ldo, pos0 = r.pos0, kc = r.a, vc = r.b;
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
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
    for (int p = first + warp; p <= qpos; p += ATTN_WARPS) {
        const float *k = kc + p * ldkv + (int64_t)kvh * hd;
        const float *v = vc + p * ldkv + (int64_t)kvh * hd;
        float s = 0.0f, vv[NPL];
#pragma unroll
        for (int j = 0; j < NPL; j++) {
            int ch = lane + 32 * j;
            s += ch < hd ? qv[j] * k[ch] : 0.0f;
            vv[j] = ch < hd ? v[ch] : 0.0f; /* loaded before the reduction waits */
        }
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        s *= d.scale;
        if (d.softcap > 0) s = d.softcap * tanhf(s / d.softcap);
        float corr = 1.0f, e = 1.0f;
        if (s > m) {
            corr = expf(m - s); /* 0 on the warp's first key */
            l = l * corr + 1.0f;
            m = s;
        } else {
            e = expf(s - m);
            l += e;
        }
#pragma unroll
        for (int j = 0; j < NPL; j++) acc[j] = acc[j] * corr + e * vv[j];
    }
    if (lane == 0) sm_m[warp] = m, sm_l[warp] = l;
#pragma unroll
    for (int j = 0; j < NPL; j++) {
        int ch = lane + 32 * j;
        if (ch < hd) sm_acc[warp * hd + ch] = acc[j];
    }
    __syncthreads();
    float mx = -FLT_MAX;
    for (int w = 0; w < ATTN_WARPS; w++) mx = fmaxf(mx, sm_m[w]);
    float lt = 0.0f;
    for (int w = 0; w < ATTN_WARPS; w++)
        if (sm_l[w] > 0.0f) lt += sm_l[w] * expf(sm_m[w] - mx);
    float *o = out + i * ldo + (int64_t)h * hd;
    for (int ch = threadIdx.x; ch < hd; ch += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++)
            if (sm_l[w] > 0.0f) a += sm_acc[w * hd + ch] * expf(sm_m[w] - mx);
        o[ch] = a / lt;
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
    unsigned blocks = (unsigned)((int64_t)dims->n_heads * n);
    int hd = dims->head_dim;
    size_t smem = (size_t)ATTN_WARPS * hd * sizeof(float); /* at most 16 KiB */
#define LAUNCH(NPL)                                                                                \
    cuda_launch(c, "attention", k_attention<NPL>, blocks, 32 * ATTN_WARPS, smem, q, ldq,           \
                q_head_stride, n, pos0, k_cache, v_cache, *dims, out, ldo,                         \
                (const ts_seq_run *)NULL)
    if (hd <= 64)
        LAUNCH(2);
    else if (hd <= 128)
        LAUNCH(4);
    else if (hd <= 256)
        LAUNCH(8);
    else
        LAUNCH(16);
#undef LAUNCH
}

/* One thread per channel: all n outputs, then the state shift (ascending k reads only indices
 * not yet overwritten). */
__global__ static void k_conv1d_silu(const float *x, int64_t ldx, int n, int C, int K,
                                     const float *w, float *state, float *out, int64_t ldo,
                                     const ts_seq_run *runs) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    if (runs) { /* blockIdx.y: the run */
        ts_seq_run r = runs[blockIdx.y];
        x += r.start * ldx, out += r.start * ldo, n = r.len, state = r.a;
    }
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
    cuda_launch(c, "conv1d_silu", k_conv1d_silu, cuda_blocks(C, 128), 128, 0, x, ldx, n, C, K, w,
                state, out, ldo, (const ts_seq_run *)NULL);
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
    cuda_launch(c, "gdn_gates", k_gdn_gates, cuda_blocks(total, 256), 256, 0, a, lda, b, ldb, n, Hv,
                neg_exp_a, dt_bias, g, beta);
}

/* The delta rule with the state in registers: a block per (32 state columns, v-head), four warps
 * splitting the d_k rows, lane = column. Thread (w, lane) holds rows w*R .. w*R+R-1 of its column;
 * the two dot products over d_k (the prediction k.S and the read q.S) are summed per warp and
 * then across the four warps through shared memory, in a fixed order. Many more blocks than one
 * per head, and no trip of the state through shared memory: this is the decode kernel, and it
 * serves prefill as well (one token after another, like the CPU's recurrent form). */
#define GDN_WARPS 4
template <int R>
__global__ static void k_gdn_reg(const float *q, const float *k, int64_t ldqk, const float *v,
                                 int64_t ldv, const float *g, const float *beta, int n,
                                 ts_gdn_dims d, float *state, float *out,
                                 const ts_seq_run *runs) {
    __shared__ float qs[GDN_WARPS * R], ks[GDN_WARPS * R];
    __shared__ float red[2][GDN_WARPS][32];
    int dk = d.d_k, dv = d.d_v, Hv = d.n_v_heads;
    if (runs) { /* blockIdx.z: the run */
        ts_seq_run r = runs[blockIdx.z];
        int64_t s = r.start;
        q += s * ldqk, k += s * ldqk, v += s * ldv, g += s * Hv, beta += s * Hv;
        out += s * Hv * dv, n = r.len, state = r.a;
    }
    int h = blockIdx.y, kh = h / (d.n_v_heads / d.n_k_heads);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int c = blockIdx.x * 32 + lane, r0 = warp * R;
    bool col = c < dv;
    float *Sg = state + (int64_t)h * dk * dv;
    float S[R];
#pragma unroll
    for (int j = 0; j < R; j++) S[j] = col && r0 + j < dk ? Sg[(int64_t)(r0 + j) * dv + c] : 0.0f;
    for (int t = 0; t < n; t++) {
        for (int i = threadIdx.x; i < GDN_WARPS * R; i += blockDim.x) {
            qs[i] = i < dk ? q[t * ldqk + (int64_t)kh * dk + i] : 0.0f;
            ks[i] = i < dk ? k[t * ldqk + (int64_t)kh * dk + i] : 0.0f;
        }
        __syncthreads();
        float decay = expf(g[t * Hv + h]), b = beta[t * Hv + h];
        float m = 0.0f;
#pragma unroll
        for (int j = 0; j < R; j++) {
            S[j] *= decay;
            m += S[j] * ks[r0 + j];
        }
        red[0][warp][lane] = m;
        __syncthreads();
        m = 0.0f;
#pragma unroll
        for (int w = 0; w < GDN_WARPS; w++) m += red[0][w][lane];
        float delta = b * ((col ? v[t * ldv + (int64_t)h * dv + c] : 0.0f) - m);
        float o = 0.0f;
#pragma unroll
        for (int j = 0; j < R; j++) {
            S[j] += ks[r0 + j] * delta;
            o += S[j] * qs[r0 + j];
        }
        red[1][warp][lane] = o;
        __syncthreads(); /* also: every thread is done with this token's qs and ks */
        if (warp == 0 && col) {
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < GDN_WARPS; w++) sum += red[1][w][lane];
            out[(int64_t)t * Hv * dv + (int64_t)h * dv + c] = sum;
        }
    }
#pragma unroll
    for (int j = 0; j < R; j++)
        if (col && r0 + j < dk) Sg[(int64_t)(r0 + j) * dv + c] = S[j];
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
    (void)chunked; /* same kernels for both forms: see the file comment */
    cuda_ctx *c = cuda_of(be);
    if (n <= 0) return;
    if (dims->d_v > 1024 || dims->d_v < 1) {
        cuda_check(c, cudaErrorInvalidValue, "gdn: d_v over 1024");
        return;
    }
    int dk = dims->d_k;
    dim3 grid((unsigned)((dims->d_v + 31) / 32), (unsigned)dims->n_v_heads);
#define REG(R)                                                                                     \
    cuda_launch(c, "gdn", k_gdn_reg<R>, grid, 32 * GDN_WARPS, 0, q, k, ldqk, v, ldv, g, beta, n,   \
                *dims, state, out, (const ts_seq_run *)NULL)
    if (dk <= 4 * 8) {
        REG(8);
        return;
    } else if (dk <= 4 * 16) {
        REG(16);
        return;
    } else if (dk <= 4 * 32) {
        REG(32);
        return;
    } else if (dk <= 4 * 64) {
        REG(64);
        return;
    }
#undef REG
    /* larger heads: the state does not fit in registers; a block per head, state in shared
     * memory when it fits, else in global memory */
    size_t base = 2 * (size_t)dk * sizeof(float);
    size_t with_state = base + (size_t)dk * dims->d_v * sizeof(float);
    int max_smem = 0;
    cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device);
    bool smem_state = with_state <= (size_t)max_smem;
    size_t bytes = smem_state ? with_state : base;
    if (bytes > 48 * 1024 &&
        !cuda_check(c, cudaFuncSetAttribute(k_gdn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)bytes),
                    "gdn smem"))
        return;
    cuda_launch(c, "gdn", k_gdn, dims->n_v_heads, dims->d_v, bytes, q, k, ldqk, v, ldv, g, beta,
                n, *dims, state, out, smem_state);
}

/* ---- all runs of a batch in one launch ------------------------------------------------------ */

void cuda_op_conv1d_silu_runs(ts_backend *be, const float *x, int64_t ldx, int C, int K,
                              const float *w, const ts_seq_run *runs, int nr, float *out,
                              int64_t ldo) {
    cuda_ctx *c = cuda_of(be);
    if (nr <= 0 || C <= 0) return;
    const ts_seq_run *dr = (const ts_seq_run *)cuda_table(c, runs, (size_t)nr * sizeof *runs);
    if (!dr) return;
    dim3 grid(cuda_blocks(C, 128), (unsigned)nr);
    cuda_launch(c, "conv1d_silu", k_conv1d_silu, grid, 128, 0, x, ldx, 0, C, K, w, (float *)NULL,
                out, ldo, dr);
}

void cuda_op_gdn_runs(ts_backend *be, const float *q, const float *k, int64_t ldqk, const float *v,
                      int64_t ldv, const float *g, const float *beta, const ts_gdn_dims *dims,
                      const ts_seq_run *runs, int nr, float *out) {
    cuda_ctx *c = cuda_of(be);
    if (nr <= 0) return;
    int dk = dims->d_k;
    if (dk > 4 * 64 || dims->d_v > 1024) { /* no register kernel: run by run */
        for (int r = 0; r < nr; r++) {
            int64_t s = runs[r].start;
            cuda_op_gdn(be, q + s * ldqk, k + s * ldqk, ldqk, v + s * ldv, ldv,
                        g + s * dims->n_v_heads, beta + s * dims->n_v_heads, runs[r].len, dims,
                        runs[r].a, out + s * dims->n_v_heads * dims->d_v, runs[r].len > 1);
        }
        return;
    }
    const ts_seq_run *dr = (const ts_seq_run *)cuda_table(c, runs, (size_t)nr * sizeof *runs);
    if (!dr) return;
    dim3 grid((unsigned)((dims->d_v + 31) / 32), (unsigned)dims->n_v_heads, (unsigned)nr);
#define REG(R)                                                                                     \
    cuda_launch(c, "gdn", k_gdn_reg<R>, grid, 32 * GDN_WARPS, 0, q, k, ldqk, v, ldv, g, beta, 0,   \
                *dims, (float *)NULL, out, dr)
    if (dk <= 4 * 8)
        REG(8);
    else if (dk <= 4 * 16)
        REG(16);
    else if (dk <= 4 * 32)
        REG(32);
    else
        REG(64);
#undef REG
}

/* Row i of run r's new keys and values to its cache row pos0 + i. */
__global__ static void k_kv_store(const float *k, const float *v, int kvw,
                                  const ts_seq_run *runs) {
    ts_seq_run r = runs[blockIdx.z];
    int i = blockIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= r.len || col >= kvw) return;
    int64_t src = (int64_t)(r.start + i) * kvw + col, dst = (int64_t)(r.pos0 + i) * kvw + col;
    r.a[dst] = k[src];
    r.b[dst] = v[src];
}

void cuda_op_attention_runs(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride,
                            const float *k, const float *v, const ts_attn_dims *dims,
                            const ts_seq_run *runs, int nr, float *out, int64_t ldo) {
    cuda_ctx *c = cuda_of(be);
    if (nr <= 0) return;
    int hd = dims->head_dim;
    if (hd > MAX_HEAD_DIM || hd < 1) {
        cuda_check(c, cudaErrorInvalidValue, "attention: head_dim over 512");
        return;
    }
    int maxlen = 0;
    for (int r = 0; r < nr; r++) maxlen = runs[r].len > maxlen ? runs[r].len : maxlen;
    const ts_seq_run *dr = (const ts_seq_run *)cuda_table(c, runs, (size_t)nr * sizeof *runs);
    if (!dr || maxlen <= 0) return;
    int kvw = dims->n_kv_heads * hd;
    dim3 sgrid(cuda_blocks(kvw, 256), (unsigned)maxlen, (unsigned)nr);
    cuda_launch(c, "kv_store", k_kv_store, sgrid, 256, 0, k, v, kvw, dr);
    dim3 grid((unsigned)(dims->n_heads * maxlen), (unsigned)nr);
    size_t smem = (size_t)ATTN_WARPS * hd * sizeof(float);
#define LAUNCH(NPL)                                                                                \
    cuda_launch(c, "attention", k_attention<NPL>, grid, 32 * ATTN_WARPS, smem, q, ldq,             \
                q_head_stride, 0, 0, (const float *)NULL, (const float *)NULL, *dims, out, ldo, dr)
    if (hd <= 64)
        LAUNCH(2);
    else if (hd <= 128)
        LAUNCH(4);
    else if (hd <= 256)
        LAUNCH(8);
    else
        LAUNCH(16);
#undef LAUNCH
}
