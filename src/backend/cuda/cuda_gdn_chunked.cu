/* The chunked form of the gated delta rule (models.md A.7) for prefill: tokens in chunks of 64,
 * in two kernels.
 *
 * Why: the recurrent kernel (k_gdn_reg) must finish token t before it starts token t + 1, three
 * block-wide barriers per token, so a 512-token prompt is 512 dependent steps per layer however
 * wide the GPU (~0.5 ms per layer on an H200, a third of the prefill). In the chunked form, per
 * v-head, chunk of n <= 64 tokens and incoming state S0 (Γ_r = Σ_{s<=r} g_s):
 *   A[r,s] = β_r (k_r·k_s) exp(Γ_r - Γ_s)      s < r      P[r,s] = (q_r·k_s) exp(Γ_r - Γ_s)  s <= r
 *   T = (I + A)⁻¹,  W = T (β exp(Γ) ∘ K),  U' = T (β ∘ V)
 *   U   = U' - W S0                          (U_r is the recurrence's δ_r)
 *   o_r = exp(Γ_r) S0ᵀq_r + Σ_{s<=r} P[r,s] U_s
 *   S_new = exp(Γ_n) S0 + Σ_s exp(Γ_n - Γ_s) k_s ⊗ U_s
 * The first two lines depend on the chunk's inputs only, not on the state: the first kernel
 * (k_gdnc_prep) computes P, W, U' and Γ for all chunks of all heads at once, a block per
 * (chunk, head), W and U' by forward substitution (T is never formed). The second
 * (k_gdnc_scan) walks the chunks in order for a block of 32 state columns per head: three small
 * products per chunk, register-tiled. fp32 throughout: the recurrence's function
 * with another rounding order (test_cuda holds it to the CPU's recurrent form and to the
 * recurrent kernel at 1e-5). */
#include <math.h>

#include "backend/cuda/cuda_int.cuh"

#define GDNC_C 64        /* tokens per chunk, as HF and the CPU use */
#define GDNC_PREP_T 256  /* threads of the first kernel */

/* Per (run, chunk, head) in the scratch: W [C][d_k], U' [C][d_v], P [C][C], Γ [C]. */
__host__ __device__ static inline int64_t gdnc_per(int dk, int dv) {
    return (int64_t)GDNC_C * (dk + dv + GDNC_C + 1);
}

/* The run's part of this launch: token offset and count (runs NULL: one run of n tokens). */
__device__ static inline void gdnc_run(const ts_seq_run *runs, int r, int *start, int *n,
                                       float **state) {
    if (runs) {
        ts_seq_run rr = runs[r];
        *start = rr.start, *n = rr.len, *state = rr.a;
    } else {
        *start = 0;
    }
}

/* Shared memory of the first kernel, in floats: K and Q chunk rows with stride d_k + 1 (16 rows
 * a warp reads at one index fall in 16 banks; W takes Q's place once A and P are done), A,
 * U' [C][d_v], Γ, β, β exp(Γ). */
__host__ __device__ static inline int gdnc_prep_floats(int dk, int dv) {
    return 2 * GDNC_C * (dk + 1) + GDNC_C * GDNC_C + GDNC_C * dv + 3 * GDNC_C;
}

__global__ static void k_gdnc_prep(const float *q, const float *k, int64_t ldqk, const float *v,
                                   int64_t ldv, const float *g, const float *beta, int n,
                                   ts_gdn_dims d, const ts_seq_run *runs, float *scratch) {
    cuda_pdl_entry();
    extern __shared__ float sm[];
    const int C = GDNC_C;
    int dk = d.d_k, dv = d.d_v, Hv = d.n_v_heads;
    int ci = blockIdx.x, h = blockIdx.y, run = blockIdx.z, start;
    float *unused;
    gdnc_run(runs, run, &start, &n, &unused);
    int t0 = ci * C;
    if (t0 >= n) return;
    int nc = n - t0 < C ? n - t0 : C;
    q += (int64_t)start * ldqk, k += (int64_t)start * ldqk, v += (int64_t)start * ldv;
    g += (int64_t)start * Hv, beta += (int64_t)start * Hv;
    int kh = h / (Hv / d.n_k_heads), kst = dk + 1;
    float *Kc = sm, *Qc = Kc + C * kst, *Wc = Qc, *A = Qc + C * kst, *Uc = A + C * C;
    float *G = Uc + C * dv, *Beta = G + C, *BG = Beta + C;
    float *out = scratch + (((int64_t)run * gridDim.x + ci) * Hv + h) * gdnc_per(dk, dv);
    float *Wo = out, *Uo = Wo + (int64_t)C * dk, *Po = Uo + (int64_t)C * dv, *Go = Po + C * C;
    int tid = threadIdx.x, nth = blockDim.x;

    for (int idx = tid; idx < C * dk; idx += nth) {
        int r = idx / dk, i = idx - r * dk;
        int64_t src = (int64_t)(t0 + r) * ldqk + (int64_t)kh * dk + i;
        Kc[r * kst + i] = r < nc ? k[src] : 0.0f;
        Qc[r * kst + i] = r < nc ? q[src] : 0.0f;
    }
    if (tid < C) {
        G[tid] = tid < nc ? g[(int64_t)(t0 + tid) * Hv + h] : 0.0f;
        Beta[tid] = tid < nc ? beta[(int64_t)(t0 + tid) * Hv + h] : 0.0f;
    }
    __syncthreads();
    if (tid == 0) /* cumulative log-decay, in token order */
        for (int r = 1; r < nc; r++) G[r] += G[r - 1];
    __syncthreads();
    if (tid < C) Go[tid] = G[tid], BG[tid] = Beta[tid] * expf(G[tid]);

    /* A and P: 4 x 4 tiles of (r, s) pairs, rows rt + 16a, columns st + 16b */
    for (int tile = tid; tile < 256; tile += nth) {
        int rt = tile >> 4, st = tile & 15;
        float kk[4][4], qk[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) kk[a][b] = 0.0f, qk[a][b] = 0.0f;
        if (rt < nc) {
            for (int i = 0; i < dk; i++) {
                float kr[4], qr[4], ks[4];
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    kr[a] = Kc[(rt + 16 * a) * kst + i];
                    qr[a] = Qc[(rt + 16 * a) * kst + i];
                    ks[a] = Kc[(st + 16 * a) * kst + i];
                }
#pragma unroll
                for (int a = 0; a < 4; a++)
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        kk[a][b] += kr[a] * ks[b];
                        qk[a][b] += qr[a] * ks[b];
                    }
            }
        }
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) {
                int r = rt + 16 * a, s = st + 16 * b;
                bool low = r < nc && s <= r;
                float dec = low ? expf(G[r] - G[s]) : 0.0f; /* exponent <= 0 only */
                A[r * C + s] = low && s < r ? Beta[r] * kk[a][b] * dec : 0.0f;
                Po[r * C + s] = low ? qk[a][b] * dec : 0.0f;
            }
    }
    __syncthreads(); /* Q is read no more: W takes its place */
    /* W = (I + A)⁻¹ (β exp(Γ) ∘ K) and U' = (I + A)⁻¹ (β ∘ V) by forward substitution, a thread
     * per column of either: row r needs rows s < r of its own column only, no barriers */
    for (int col = tid; col < dk + dv; col += nth) {
        bool isw = col < dk;
        int i = isw ? col : col - dk;
        float *X = isw ? Wc + i : Uc + i;
        int xst = isw ? kst : dv;
        /* the column in registers, loops unrolled: the chain of dependent updates then waits on
         * FMA latency only, and A's loads can all be issued early (rows past nc are zero) */
        float x[GDNC_C];
#pragma unroll
        for (int r = 0; r < GDNC_C; r++) {
            float xr = isw ? BG[r] * Kc[r * kst + i]
                           : (r < nc ? Beta[r] * v[(int64_t)(t0 + r) * ldv + (int64_t)h * dv + i]
                                     : 0.0f);
#pragma unroll
            for (int s = 0; s < r; s++) xr -= A[r * C + s] * x[s];
            x[r] = xr;
        }
#pragma unroll
        for (int r = 0; r < GDNC_C; r++) X[r * xst] = x[r];
    }
    __syncthreads();
    for (int idx = tid; idx < nc * dk; idx += nth) {
        int r = idx / dk, i = idx - r * dk;
        Wo[idx] = Wc[r * kst + i];
    }
    for (int idx = tid; idx < nc * dv; idx += nth) Uo[idx] = Uc[idx];
}

/* Shared memory of the scan, in floats, for blocks of cw state columns: the state tile S
 * [d_k][cw], two staging areas of [C][d_k + 1] (W and Q, then K), P [C][C + 1], U [C][cw], Γ
 * and the state-update weights. */
__host__ __device__ static inline int gdnc_scan_floats(int dk, int cw) {
    return dk * cw + 2 * GDNC_C * (dk + 1) + GDNC_C * (GDNC_C + 1) + GDNC_C * cw + 2 * GDNC_C;
}

/* Rows [0, nc) of a [C][dk] block of global memory into shared rows of stride dk + 1, rows
 * beyond zeroed. Eight loads per thread are issued before their stores: the scan has few warps
 * per multiprocessor, and one load at a time would pay the full memory latency each time. */
__device__ static inline void gdnc_stage(float *dst, const float *src, int64_t ld, int nc, int dk) {
    const int nt = blockDim.x, total = GDNC_C * dk, sr = nt / dk, si = nt % dk;
    int r = threadIdx.x / dk, i = threadIdx.x % dk;
    for (int e0 = threadIdx.x; e0 < total; e0 += 8 * nt) {
        float val[8];
        int at[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            bool in = e0 + j * nt < total;
            at[j] = in ? r * (dk + 1) + i : -1;
            val[j] = in && r < nc ? src[(int64_t)r * ld + i] : 0.0f;
            i += si, r += sr;
            if (i >= dk) i -= dk, r++;
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (at[j] >= 0) dst[at[j]] = val[j];
    }
}

/* The scan over the chunks: a block per (4 CG state columns, v-head, run) with the state tile
 * in shared memory, 16 CG threads. Thread (rg, cg) computes 4 x 4 tiles: rows rg + 16a,
 * columns 4cg .. 4cg + 3, so each value read from shared memory serves 4 products. CG = 16
 * (64 columns, 8 warps) where shared memory allows: more warps to hide the loads' latency. */
template <int CG>
__global__ static void k_gdnc_scan(const float *q, const float *k, int64_t ldqk, int n,
                                   ts_gdn_dims d, float *state, float *out,
                                   const ts_seq_run *runs, const float *scratch, int max_chunks) {
    cuda_pdl_entry();
    extern __shared__ float sm[];
    const int C = GDNC_C;
    int dk = d.d_k, dv = d.d_v, Hv = d.n_v_heads, kst = dk + 1;
    int h = blockIdx.y, run = blockIdx.z, start;
    gdnc_run(runs, run, &start, &n, &state);
    q += (int64_t)start * ldqk, k += (int64_t)start * ldqk;
    out += (int64_t)start * Hv * dv;
    int kh = h / (Hv / d.n_k_heads);
    const int CW = 4 * CG; /* columns of the block */
    int tid = threadIdx.x, cg = tid % CG, rg = tid / CG;
    int c0 = blockIdx.x * CW + 4 * cg; /* this thread's first state column */
    float *S = sm, *X1 = S + dk * CW, *X2 = X1 + C * kst, *Ps = X2 + C * kst, *U = Ps + C * (C + 1);
    float *Gs = U + C * CW, *Wd = Gs + C;
    float *Sg = state + (int64_t)h * dk * dv;
    for (int idx = tid; idx < dk * CW; idx += blockDim.x) {
        int i = idx / CW, cc = blockIdx.x * CW + idx % CW;
        S[idx] = cc < dv ? Sg[(int64_t)i * dv + cc] : 0.0f;
    }
    for (int ci = 0; ci * C < n; ci++) {
        int t0 = ci * C, nc = n - t0 < C ? n - t0 : C;
        const float *in = scratch + (((int64_t)run * max_chunks + ci) * Hv + h) * gdnc_per(dk, dv);
        const float *W = in, *Up = W + (int64_t)C * dk, *P = Up + (int64_t)C * dv, *G = P + C * C;
        gdnc_stage(X1, W, dk, nc, dk);
        gdnc_stage(X2, q + (int64_t)t0 * ldqk + (int64_t)kh * dk, ldqk, nc, dk);
        gdnc_stage(Ps, P, C, C, C);
        if (tid < C) Gs[tid] = G[tid];
        __syncthreads();
        /* U = U' - W S0 and S0ᵀq_r */
        float u[4][4], o[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) u[a][b] = 0.0f, o[a][b] = 0.0f;
        for (int i = 0; i < dk; i++) {
            float4 s4 = *(const float4 *)(S + i * CW + 4 * cg);
            float sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
            for (int a = 0; a < 4; a++) {
                float w = X1[(rg + 16 * a) * kst + i], qv = X2[(rg + 16 * a) * kst + i];
#pragma unroll
                for (int b = 0; b < 4; b++) u[a][b] += w * sv[b], o[a][b] += qv * sv[b];
            }
        }
#pragma unroll
        for (int a = 0; a < 4; a++) {
            int r = rg + 16 * a;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                int c = c0 + b;
                float up = r < nc && c < dv ? Up[(int64_t)r * dv + c] : 0.0f;
                U[r * CW + 4 * cg + b] = r < nc ? up - u[a][b] : 0.0f;
            }
        }
        if (tid < nc) Wd[tid] = expf(Gs[nc - 1] - Gs[tid]);
        __syncthreads(); /* U complete; W and Q staged no more */
        gdnc_stage(X1, k + (int64_t)t0 * ldqk + (int64_t)kh * dk, ldqk, nc, dk);
        /* o_r = exp(Γ_r) S0ᵀq_r + Σ_{s<=r} P[r,s] U_s (P is zero above the diagonal) */
        float acc[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++) {
            float e = expf(Gs[rg + 16 * a]);
#pragma unroll
            for (int b = 0; b < 4; b++) acc[a][b] = e * o[a][b];
        }
        for (int s = 0; s < nc; s++) {
            float4 u4 = *(const float4 *)(U + s * CW + 4 * cg);
            float uv[4] = {u4.x, u4.y, u4.z, u4.w};
#pragma unroll
            for (int a = 0; a < 4; a++) {
                float p = Ps[(rg + 16 * a) * (C + 1) + s];
#pragma unroll
                for (int b = 0; b < 4; b++) acc[a][b] += p * uv[b];
            }
        }
#pragma unroll
        for (int a = 0; a < 4; a++) {
            int r = rg + 16 * a;
#pragma unroll
            for (int b = 0; b < 4; b++)
                if (r < nc && c0 + b < dv)
                    out[(int64_t)(t0 + r) * Hv * dv + (int64_t)h * dv + c0 + b] = acc[a][b];
        }
        __syncthreads(); /* K staged */
        /* S = exp(Γ_n) S0 + Σ_t exp(Γ_n - Γ_t) k_t ⊗ U_t, rows rg + 16a in passes of 4 */
        float el = expf(Gs[nc - 1]);
        for (int i0 = 0; i0 < dk; i0 += 64) {
            float sacc[4][4];
#pragma unroll
            for (int a = 0; a < 4; a++) {
                int i = i0 + rg + 16 * a;
                float4 s4 = i < dk ? *(const float4 *)(S + i * CW + 4 * cg) : make_float4(0, 0, 0, 0);
                sacc[a][0] = el * s4.x, sacc[a][1] = el * s4.y;
                sacc[a][2] = el * s4.z, sacc[a][3] = el * s4.w;
            }
            for (int t = 0; t < nc; t++) {
                float4 u4 = *(const float4 *)(U + t * CW + 4 * cg);
                float uv[4] = {u4.x, u4.y, u4.z, u4.w};
                float wd = Wd[t];
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    int i = i0 + rg + 16 * a;
                    float kd = i < dk ? wd * X1[t * kst + i] : 0.0f;
#pragma unroll
                    for (int b = 0; b < 4; b++) sacc[a][b] += kd * uv[b];
                }
            }
#pragma unroll
            for (int a = 0; a < 4; a++) {
                int i = i0 + rg + 16 * a;
                if (i < dk)
                    *(float4 *)(S + i * CW + 4 * cg) =
                        make_float4(sacc[a][0], sacc[a][1], sacc[a][2], sacc[a][3]);
            }
        }
        __syncthreads(); /* the state is settled before the next chunk reads it */
    }
    for (int idx = tid; idx < dk * CW; idx += blockDim.x) {
        int i = idx / CW, cc = blockIdx.x * CW + idx % CW;
        if (cc < dv) Sg[(int64_t)i * dv + cc] = S[idx];
    }
}

/* The scan's column group count for heads of d_k keys: 16 where its shared memory fits. */
static int gdnc_scan_cg(int dk, int max_smem) {
    return (size_t)gdnc_scan_floats(dk, 64) * sizeof(float) <= (size_t)max_smem ? 16 : 8;
}

bool cuda_gdn_chunked_fits(cuda_ctx *c, int d_k, int d_v) {
    int max_smem = c->smem_optin;
    size_t prep = (size_t)gdnc_prep_floats(d_k, d_v) * sizeof(float);
    size_t scan = (size_t)gdnc_scan_floats(d_k, 4 * gdnc_scan_cg(d_k, max_smem)) * sizeof(float);
    if (prep > (size_t)max_smem || scan > (size_t)max_smem) return false;
    size_t need = prep > scan ? prep : scan;
    if (need > c->gdnc_smem_opted) {
        if (cudaFuncSetAttribute(k_gdnc_prep, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)need) != cudaSuccess ||
            cudaFuncSetAttribute(k_gdnc_scan<8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)need) != cudaSuccess ||
            cudaFuncSetAttribute(k_gdnc_scan<16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)need) != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
        c->gdnc_smem_opted = need;
    }
    return true;
}

void cuda_gdn_chunked_launch(cuda_ctx *c, const float *q, const float *k, int64_t ldqk,
                             const float *v, int64_t ldv, const float *g, const float *beta, int n,
                             int max_len, const ts_gdn_dims *dims, float *state, float *out,
                             const ts_seq_run *runs_dev, int nr) {
    int dk = dims->d_k, dv = dims->d_v, Hv = dims->n_v_heads;
    int max_chunks = (max_len + GDNC_C - 1) / GDNC_C;
    if (!runs_dev) nr = 1;
    size_t bytes = (size_t)nr * max_chunks * Hv * gdnc_per(dk, dv) * sizeof(float);
    float *scratch = (float *)cuda_scratch(c, 4, bytes);
    if (!scratch) return;
    cuda_launch(c, "gdn_chunk_prep", k_gdnc_prep,
                dim3((unsigned)max_chunks, (unsigned)Hv, (unsigned)nr), GDNC_PREP_T,
                (size_t)gdnc_prep_floats(dk, dv) * sizeof(float), q, k, ldqk, v, ldv, g, beta, n,
                *dims, runs_dev, scratch);
    int cg = gdnc_scan_cg(dk, c->smem_optin), cw = 4 * cg;
    dim3 grid((unsigned)((dv + cw - 1) / cw), (unsigned)Hv, (unsigned)nr);
    size_t smem = (size_t)gdnc_scan_floats(dk, cw) * sizeof(float);
    if (cg == 16)
        cuda_launch(c, "gdn_chunk_scan", k_gdnc_scan<16>, grid, 16 * cg, smem, q, k, ldqk, n,
                    *dims, state, out, runs_dev, (const float *)scratch, max_chunks);
    else
        cuda_launch(c, "gdn_chunk_scan", k_gdnc_scan<8>, grid, 16 * cg, smem, q, k, ldqk, n,
                    *dims, state, out, runs_dev, (const float *)scratch, max_chunks);
}
