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
 * (k_gdnc_scan) walks the chunks in order for a block of 16 state columns per head: three small
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

/* The scan: a block per (16 state columns, v-head, run), eight warps. A 512-token prompt of the
 * 0.8B's 16 heads of 128 columns is 128 blocks on an H200's 132 multiprocessors (blocks of 64
 * columns filled 32 of them: 264 us a layer). Each of the chunk's three products splits its
 * reduction over lanes of a warp (4 for W S0, Q S0 and P U, 2 for the state update) and sums
 * them by shuffles, so a thread still keeps 4 x 4 register tiles - a value read from shared
 * memory serves 4 products - on a quarter of the work. The chunk's inputs come by cp.async while
 * the products of the one before run: W, Q, U' and Γ from the moment the first product has read
 * them; P and K a whole chunk ahead where shared memory holds two of each (d_k 128: 191 KB),
 * else K in W's place once W is read and P after the second product. */
#define GDNC_CW     16           /* state columns of a scan block */
#define GDNC_SCAN_T 256          /* its threads */
#define GDNC_PST    (GDNC_C + 4) /* row stride of the staged P: 16-byte rows 4 banks apart */

/* Row stride of the staged W, Q and K: 16-byte rows 4 banks apart, so that the rows a warp reads
 * at one index (2 rows x 4 lanes' indices) fall in distinct banks. */
__host__ __device__ static inline int gdnc_kst(int dk) { return (dk + 31) / 32 * 32 + 4; }

/* The scan's shared memory in floats: the state tile S [d_k][CW], W and Q [C][kst], K [C][kst]
 * and P [C][PST] (two of each for two = true; else K takes W's place), U', U and U scaled by its
 * token's decay to the chunk's end (each [C][CW]), Γ of two chunks. */
__host__ __device__ static inline int gdnc_scan_floats(int dk, bool two) {
    int kst = gdnc_kst(dk), nb = two ? 2 : 1;
    return dk * GDNC_CW + (2 + (two ? 2 : 0)) * GDNC_C * kst + nb * GDNC_C * GDNC_PST +
           3 * GDNC_C * GDNC_CW + 2 * GDNC_C;
}

/* cp.async of rows [0, rows) x columns [0, cols) of a row-major block of global memory (row
 * stride ld) to shared memory (row stride dst_ld, a multiple of 4): 16-byte copies where the
 * rows are 16-byte aligned, else an element at a time. */
__device__ static inline void gdnc_copy(float *dst, int dst_ld, const float *src, int64_t ld,
                                        int rows, int cols) {
    if (((uintptr_t)src & 15) == 0 && (ld & 3) == 0 && (cols & 3) == 0) {
        int per = cols >> 2;
        for (int e = threadIdx.x; e < rows * per; e += blockDim.x) {
            int r = e / per, c = (e - r * per) * 4;
            cp_async16(dst + r * dst_ld + c, src + (int64_t)r * ld + c, true);
        }
    } else {
        for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
            int r = e / cols, c = e - r * cols;
            cp_async4(dst + r * dst_ld + c, src + (int64_t)r * ld + c);
        }
    }
}

/* x[a][m]: partial sums of row a held by the 4 lanes l, l ^ 1, l ^ 2, l ^ 3 of a warp. The lane
 * with (lane & 3) == j returns row j's full sums in y (halves exchanged twice: 12 shuffles for
 * 4 values a row instead of 32). */
template <int M> __device__ static inline void gdnc_sum4(const float (&x)[4][M], float (&y)[M]) {
    bool hi = threadIdx.x & 2, lo = threadIdx.x & 1;
    float h[2][M];
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int m = 0; m < M; m++) {
            float keep = hi ? x[2 + j][m] : x[j][m], send = hi ? x[j][m] : x[2 + j][m];
            h[j][m] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
        }
#pragma unroll
    for (int m = 0; m < M; m++) {
        float keep = lo ? h[1][m] : h[0][m], send = lo ? h[0][m] : h[1][m];
        y[m] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
    }
}

/* The same over the 2 lanes l, l ^ 1: the lane with (lane & 1) == j returns rows 2j and 2j + 1. */
template <int M> __device__ static inline void gdnc_sum2(const float (&x)[4][M], float (&y)[2][M]) {
    bool lo = threadIdx.x & 1;
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int m = 0; m < M; m++) {
            float keep = lo ? x[2 + j][m] : x[j][m], send = lo ? x[j][m] : x[2 + j][m];
            y[j][m] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
        }
}

template <bool TWO>
__global__ static void __launch_bounds__(GDNC_SCAN_T)
    k_gdnc_scan(const float *q, const float *k, int64_t ldqk, int n, ts_gdn_dims d, float *state,
                float *out, const ts_seq_run *runs, const float *scratch, int max_chunks) {
    cuda_pdl_entry();
    extern __shared__ float4 sm4[];
    float *sm = (float *)sm4;
    const int C = GDNC_C, CW = GDNC_CW, PST = GDNC_PST;
    int dk = d.d_k, dv = d.d_v, Hv = d.n_v_heads, kst = gdnc_kst(dk);
    int h = blockIdx.y, run = blockIdx.z, start;
    gdnc_run(runs, run, &start, &n, &state);
    q += (int64_t)start * ldqk, k += (int64_t)start * ldqk;
    out += (int64_t)start * Hv * dv;
    int kh = h / (Hv / d.n_k_heads), cb = blockIdx.x * CW, ncol = min(CW, dv - cb);
    float *S = sm, *Wb = S + dk * CW, *Qb = Wb + C * kst, *Kb = TWO ? Qb + C * kst : Wb;
    float *Pb = TWO ? Kb + 2 * C * kst : Qb + C * kst, *Upb = Pb + (TWO ? 2 : 1) * C * PST;
    float *U = Upb + C * CW, *Uw = U + C * CW, *Gb = Uw + C * CW;
    float *Sg = state + (int64_t)h * dk * dv + cb;
    const int64_t per = gdnc_per(dk, dv);
    const float *in0 = scratch + ((int64_t)run * max_chunks * Hv + h) * per;
    /* chunk ci's parts: W [C][dk], U' [C][dv], P [C][C], Γ [C] in the scratch, Q and K rows */
    auto nc_of = [&](int ci) { return min(C, n - ci * C); };
    auto issue_w = [&](int ci) {
        gdnc_copy(Wb, kst, in0 + (int64_t)ci * Hv * per, dk, nc_of(ci), dk);
    };
    auto issue_qug = [&](int ci) { /* the first product's other inputs */
                                   const float *in = in0 + (int64_t)ci * Hv * per;
                                   int nc = nc_of(ci);
                                   gdnc_copy(Qb, kst, q + (int64_t)ci * C * ldqk + (int64_t)kh * dk,
                                             ldqk, nc, dk);
                                   gdnc_copy(Upb, CW, in + (int64_t)C * dk + cb, dv, nc, ncol);
                                   gdnc_copy(Gb + (ci & 1) * C, C, in + (int64_t)C * (dk + dv + C),
                                             C, 1, C);
    };
    auto issue_p = [&](int ci, float *dst) {
        const float *in = in0 + (int64_t)ci * Hv * per;
        gdnc_copy(dst, PST, in + (int64_t)C * (dk + dv), C, nc_of(ci), C);
    };
    auto issue_k = [&](int ci, float *dst) {
        gdnc_copy(dst, kst, k + (int64_t)ci * C * ldqk + (int64_t)kh * dk, ldqk, nc_of(ci), dk);
    };

    for (int idx = threadIdx.x; idx < dk * CW; idx += blockDim.x) {
        int i = idx / CW, c = idx - i * CW;
        S[idx] = c < ncol ? Sg[(int64_t)i * dv + c] : 0.0f;
    }
    if (n > 0) {
        issue_w(0), issue_qug(0);
        issue_p(0, Pb);
        if (TWO) issue_k(0, Kb);
    }
    cp_async_commit();

    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* products with rows of the chunk (W S0, Q S0, P U): tile rows rg + 16a, columns 4cg ..
     * 4cg + 3, the reduction's indices i = sl (mod 4); then this lane's row is r */
    int sl = lane & 3, tile = warp * 8 + (lane >> 2), cg = tile & 3, rg = tile >> 2;
    int r = rg + 16 * sl;
    /* the state update: rows i0 + ig + 32a, columns 4cs .. 4cs + 3, tokens t = tp (mod 2) */
    int tp = lane & 1, pos = warp * 16 + (lane >> 1), cs = pos & 3, ig = pos >> 2;
    for (int ci = 0; ci * C < n; ci++) {
        int t0 = ci * C, nc = nc_of(ci), buf = TWO ? ci & 1 : 0;
        bool more = t0 + C < n;
        const float *Kc = Kb + buf * C * kst, *Pc = Pb + buf * C * PST, *Gc = Gb + (ci & 1) * C;
        cp_async_wait<0>();
        __syncthreads(); /* the chunk's inputs (and the state) are in */
        if (TWO) {
            if (more)
                issue_p(ci + 1, Pb + (buf ^ 1) * C * PST),
                    issue_k(ci + 1, Kb + (buf ^ 1) * C * kst);
            cp_async_commit();
        }
        /* U = U' - W S0 and S0ᵀq_r */
        float u[4][4], o[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) u[a][b] = 0.0f, o[a][b] = 0.0f;
#pragma unroll 4
        for (int i = sl; i < dk; i += 4) {
            float4 s4 = *(const float4 *)(S + i * CW + 4 * cg);
            float sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
            for (int a = 0; a < 4; a++) {
                float w = Wb[(rg + 16 * a) * kst + i], qv = Qb[(rg + 16 * a) * kst + i];
#pragma unroll
                for (int b = 0; b < 4; b++) u[a][b] += w * sv[b], o[a][b] += qv * sv[b];
            }
        }
        float us[4], os[4];
        gdnc_sum4(u, us);
        gdnc_sum4(o, os);
        {
            /* U (rows past the chunk zero), and U scaled by exp(Γ_n - Γ_r) for the state */
            float wd = r < nc ? expf(Gc[nc - 1] - Gc[r]) : 0.0f, uv[4];
#pragma unroll
            for (int b = 0; b < 4; b++) {
                int c = 4 * cg + b;
                uv[b] = r < nc && c < ncol ? Upb[r * CW + c] - us[b] : 0.0f;
            }
            *(float4 *)(U + r * CW + 4 * cg) = make_float4(uv[0], uv[1], uv[2], uv[3]);
            *(float4 *)(Uw + r * CW + 4 * cg) =
                make_float4(wd * uv[0], wd * uv[1], wd * uv[2], wd * uv[3]);
        }
        __syncthreads(); /* U complete; W, Q and U' read no more */
        if (!TWO) {
            issue_k(ci, Wb);
            cp_async_commit();
        }
        if (more) {
            if (TWO) issue_w(ci + 1);
            issue_qug(ci + 1);
        }
        cp_async_commit();
        /* o_r = exp(Γ_r) S0ᵀq_r + Σ_{s<=r} P[r,s] U_s (P is zero above the diagonal) */
        float pu[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++)
                pu[a][b] = 0.0f;
        for (int s = sl; s < nc; s += 4) {
            float4 u4 = *(const float4 *)(U + s * CW + 4 * cg);
            float uv[4] = {u4.x, u4.y, u4.z, u4.w};
#pragma unroll
            for (int a = 0; a < 4; a++) {
                float p = Pc[(rg + 16 * a) * PST + s];
#pragma unroll
                for (int b = 0; b < 4; b++)
                    pu[a][b] += p * uv[b];
            }
        }
        float ps[4];
        gdnc_sum4(pu, ps);
        if (r < nc) {
            float e = expf(Gc[r]);
            float *orow = out + (int64_t)(t0 + r) * Hv * dv + (int64_t)h * dv + cb;
#pragma unroll
            for (int b = 0; b < 4; b++)
                if (4 * cg + b < ncol) orow[4 * cg + b] = e * os[b] + ps[b];
        }
        if (!TWO) {
            cp_async_wait<1>(); /* K, not the next chunk's Q */
            __syncthreads();    /* K in; P read no more */
            if (more) issue_p(ci + 1, Pb);
            cp_async_commit();
        }
        /* S = exp(Γ_n) S0 + Σ_t exp(Γ_n - Γ_t) k_t ⊗ U_t, 128 rows a pass */
        float el = expf(Gc[nc - 1]);
        for (int i0 = 0; i0 < dk; i0 += 128) {
            float sa[4][4];
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++)
                    sa[a][b] = 0.0f;
            for (int t = tp; t < nc; t += 2) {
                float4 u4 = *(const float4 *)(Uw + t * CW + 4 * cs);
                float uv[4] = {u4.x, u4.y, u4.z, u4.w};
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    int i = i0 + ig + 32 * a;
                    float kv = i < dk ? Kc[t * kst + i] : 0.0f;
#pragma unroll
                    for (int b = 0; b < 4; b++)
                        sa[a][b] += kv * uv[b];
                }
            }
            float ss[2][4];
            gdnc_sum2(sa, ss);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                int i = i0 + ig + 32 * (2 * tp + j);
                if (i < dk) {
                    float4 *sp = (float4 *)(S + i * CW + 4 * cs), s4 = *sp;
                    *sp = make_float4(el * s4.x + ss[j][0], el * s4.y + ss[j][1],
                                      el * s4.z + ss[j][2], el * s4.w + ss[j][3]);
                }
            }
        }
        if (!TWO) {
            __syncthreads(); /* K read no more: the next chunk's W takes its place */
            if (more) issue_w(ci + 1);
            cp_async_commit();
        }
    }
    cp_async_wait<0>();
    __syncthreads(); /* the state's last update */
    for (int idx = threadIdx.x; idx < dk * CW; idx += blockDim.x) {
        int i = idx / CW, c = idx - i * CW;
        if (c < ncol) Sg[(int64_t)i * dv + c] = S[idx];
    }
}

/* Two K and P buffers in the scan where shared memory holds them. */
static bool gdnc_scan_two(int dk, int max_smem) {
    return (size_t)gdnc_scan_floats(dk, true) * sizeof(float) <= (size_t)max_smem;
}

bool cuda_gdn_chunked_fits(cuda_ctx *c, int d_k, int d_v) {
    int max_smem = c->smem_optin;
    size_t prep = (size_t)gdnc_prep_floats(d_k, d_v) * sizeof(float);
    size_t scan = (size_t)gdnc_scan_floats(d_k, gdnc_scan_two(d_k, max_smem)) * sizeof(float);
    if (prep > (size_t)max_smem || scan > (size_t)max_smem) return false;
    size_t need = prep > scan ? prep : scan;
    if (need > c->gdnc_smem_opted) {
        if (cudaFuncSetAttribute(k_gdnc_prep, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)need) != cudaSuccess ||
            cudaFuncSetAttribute(k_gdnc_scan<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)need) != cudaSuccess ||
            cudaFuncSetAttribute(k_gdnc_scan<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
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
    bool two = gdnc_scan_two(dk, c->smem_optin);
    dim3 grid((unsigned)((dv + GDNC_CW - 1) / GDNC_CW), (unsigned)Hv, (unsigned)nr);
    size_t smem = (size_t)gdnc_scan_floats(dk, two) * sizeof(float);
    if (two)
        cuda_launch(c, "gdn_chunk_scan", k_gdnc_scan<true>, grid, GDNC_SCAN_T, smem, q, k, ldqk, n,
                    *dims, state, out, runs_dev, (const float *)scratch, max_chunks);
    else
        cuda_launch(c, "gdn_chunk_scan", k_gdnc_scan<false>, grid, GDNC_SCAN_T, smem, q, k, ldqk, n,
                    *dims, state, out, runs_dev, (const float *)scratch, max_chunks);
}
