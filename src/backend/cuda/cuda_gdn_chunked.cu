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

/* A thread's 4 x 4 register tile of sums, zeroed. */
__device__ static inline void gdnc_zero(float (&x)[4][4]) {
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
            x[a][b] = 0.0f;
}

/* cp.async of rows [0, rows) x columns [0, cols) of a row-major block of global memory (row
 * stride ld) to shared memory (row stride dst_ld, a multiple of 4), rows [rows, zrows) zeroed:
 * 16-byte copies where the rows are 16-byte aligned, else an element at a time. The (row,
 * piece) of a thread's next copy is stepped, not divided out. */
__device__ static inline void gdnc_copy(float *dst, int dst_ld, const float *src, int64_t ld,
                                        int rows, int cols, int zrows) {
    bool v16 = ((uintptr_t)src & 15) == 0 && (ld & 3) == 0 && (cols & 3) == 0;
    int w = v16 ? 4 : 1, per = cols / w; /* elements a piece, pieces a row */
    int r = threadIdx.x / per, p = threadIdx.x - r * per;
    const int dr = blockDim.x / per, dp = blockDim.x - dr * per;
    for (int e = threadIdx.x; e < zrows * per; e += blockDim.x) {
        bool in = r < rows;
        const float *from = src + (in ? (int64_t)r * ld + p * w : 0);
        if (v16)
            cp_async16(dst + r * dst_ld + p * w, from, in);
        else
            cp_async4(dst + r * dst_ld + p, from, in);
        r += dr, p += dp;
        if (p >= per) p -= per, r++;
    }
}

/* Row stride of the first kernel's staged K and Q: 16-byte rows 4 banks apart, so that the 16
 * rows a warp reads 4 wide at one index take the fewest passes (two). */
__host__ __device__ static inline int gdnc_prep_kst(int dk) { return (dk + 31) / 32 * 32 + 4; }

/* Shared memory of the first kernel, in floats: K and Q chunk rows (zero past the chunk and
 * past d_k to a multiple of 4), A [C][C], Γ, β, β exp(Γ). */
__host__ __device__ static inline int gdnc_prep_floats(int dk) {
    return 2 * GDNC_C * gdnc_prep_kst(dk) + GDNC_C * GDNC_C + 3 * GDNC_C;
}

__global__ static void __launch_bounds__(GDNC_PREP_T)
    k_gdnc_prep(const float *q, const float *k, int64_t ldqk, const float *v, int64_t ldv,
                const float *g, const float *beta, int n, ts_gdn_dims d, const ts_seq_run *runs,
                float *scratch) {
    cuda_pdl_entry();
    extern __shared__ float4 sm4[];
    float *sm = (float *)sm4;
    const int C = GDNC_C;
    int dk = d.d_k, dv = d.d_v, Hv = d.n_v_heads, kst = gdnc_prep_kst(dk), dk4 = (dk + 3) & ~3;
    int ci = blockIdx.x, h = blockIdx.y, run = blockIdx.z, start;
    float *unused;
    gdnc_run(runs, run, &start, &n, &unused);
    int t0 = ci * C;
    if (t0 >= n) return;
    int nc = n - t0 < C ? n - t0 : C;
    q += (int64_t)start * ldqk, k += (int64_t)start * ldqk, v += (int64_t)start * ldv;
    g += (int64_t)start * Hv, beta += (int64_t)start * Hv;
    int kh = h / (Hv / d.n_k_heads);
    float *Kc = sm, *Qc = Kc + C * kst, *A = Qc + C * kst, *G = A + C * C, *Beta = G + C;
    float *BG = Beta + C;
    float *out = scratch + (((int64_t)run * gridDim.x + ci) * Hv + h) * gdnc_per(dk, dv);
    float *Wo = out, *Uo = Wo + (int64_t)C * dk, *Po = Uo + (int64_t)C * dv, *Go = Po + C * C;
    int tid = threadIdx.x, nth = blockDim.x;

    int64_t row0 = (int64_t)t0 * ldqk + (int64_t)kh * dk;
    gdnc_copy(Kc, kst, k + row0, ldqk, nc, dk, C);
    gdnc_copy(Qc, kst, q + row0, ldqk, nc, dk, C);
    cp_async_commit();
    for (int idx = tid; idx < C * (dk4 - dk); idx += nth) { /* the 4-wide loads' tail */
        int r = idx / (dk4 - dk), i = dk + idx % (dk4 - dk);
        Kc[r * kst + i] = 0.0f, Qc[r * kst + i] = 0.0f;
    }
    if (tid < C) {
        G[tid] = tid < nc ? g[(int64_t)(t0 + tid) * Hv + h] : 0.0f;
        Beta[tid] = tid < nc ? beta[(int64_t)(t0 + tid) * Hv + h] : 0.0f;
    }
    __syncthreads();
    if (tid < 32) { /* Γ, the cumulative log-decay: a scan over the warp, two tokens a lane */
        float a = G[2 * tid], sum = a + G[2 * tid + 1];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            float y = __shfl_up_sync(0xffffffffu, sum, o);
            if (tid >= o) sum += y;
        }
        float before = __shfl_up_sync(0xffffffffu, sum, 1);
        G[2 * tid] = tid ? before + a : a, G[2 * tid + 1] = sum;
    }
    cp_async_wait<0>();
    __syncthreads();
    if (tid < C) Go[tid] = G[tid], BG[tid] = Beta[tid] * expf(G[tid]);

    /* A and P: 4 x 4 tiles of (r, s) pairs, rows rt + 16a, columns st + 16b, four indices a
     * load (the same sums in the same order as one at a time: the tail adds zeros) */
    for (int tile = tid; tile < 256; tile += nth) {
        int rt = tile >> 4, st = tile & 15;
        float kk[4][4], qk[4][4];
        gdnc_zero(kk), gdnc_zero(qk);
        if (rt < nc) {
            for (int i = 0; i < dk; i += 4) {
                float4 kr[4], qr[4], ks[4];
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    kr[a] = *(const float4 *)(Kc + (rt + 16 * a) * kst + i);
                    qr[a] = *(const float4 *)(Qc + (rt + 16 * a) * kst + i);
                    ks[a] = *(const float4 *)(Kc + (st + 16 * a) * kst + i);
                }
#pragma unroll
                for (int a = 0; a < 4; a++)
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        kk[a][b] += kr[a].x * ks[b].x, qk[a][b] += qr[a].x * ks[b].x;
                        kk[a][b] += kr[a].y * ks[b].y, qk[a][b] += qr[a].y * ks[b].y;
                        kk[a][b] += kr[a].z * ks[b].z, qk[a][b] += qr[a].z * ks[b].z;
                        kk[a][b] += kr[a].w * ks[b].w, qk[a][b] += qr[a].w * ks[b].w;
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
    __syncthreads();
    /* W = (I + A)⁻¹ (β exp(Γ) ∘ K) and U' = (I + A)⁻¹ (β ∘ V) by forward substitution, a thread
     * per column of either: row r needs rows s < r of its own column only, no barriers. The
     * column stays in registers (loops unrolled: the chain of dependent updates waits on FMA
     * latency only), A's rows are read 4 wide, and the rows go straight to the scratch. */
    for (int col = tid; col < dk + dv; col += nth) {
        bool isw = col < dk;
        int i = isw ? col : col - dk;
        float x[GDNC_C];
#pragma unroll
        for (int r = 0; r < GDNC_C; r++) {
            float xr = isw ? BG[r] * Kc[r * kst + i]
                           : (r < nc ? Beta[r] * v[(int64_t)(t0 + r) * ldv + (int64_t)h * dv + i]
                                     : 0.0f);
            const float4 *Ar = (const float4 *)(A + r * C);
#pragma unroll
            for (int s4 = 0; s4 < r / 4; s4++) {
                float4 a4 = Ar[s4];
                xr -= a4.x * x[4 * s4], xr -= a4.y * x[4 * s4 + 1];
                xr -= a4.z * x[4 * s4 + 2], xr -= a4.w * x[4 * s4 + 3];
            }
#pragma unroll
            for (int s = r / 4 * 4; s < r; s++) xr -= A[r * C + s] * x[s];
            x[r] = xr;
        }
        float *dst = isw ? Wo + i : Uo + i;
        int64_t ld = isw ? dk : dv;
#pragma unroll
        for (int r = 0; r < GDNC_C; r++)
            if (r < nc) dst[(int64_t)r * ld] = x[r];
    }
}

/* The scan: a block per (16 state columns, v-head, run), eight warps. A 512-token prompt of the
 * 0.8B's 16 heads of 128 columns is 128 blocks on an H200's 132 multiprocessors (blocks of 64
 * columns filled 32 of them: 264 us a layer). Each of the chunk's three products splits its
 * reduction over lanes of a warp (4 for W S0, Q S0 and P U, 2 for the state update) and sums
 * them by shuffles, so a thread still keeps 4 x 4 register tiles - a value read from shared
 * memory serves 4 or 16 products - on a quarter of the work. The chunk's inputs come by cp.async
 * while the products of the one before run: W, Q, U' and Γ from the moment the first product
 * has read them; P and K a whole chunk ahead where shared memory holds two of each (d_k 128:
 * 205 KB), else K in W's place once W is read and P after the second product. */
#define GDNC_CW     16           /* state columns of a scan block */
#define GDNC_SCAN_T 256          /* its threads */
#define GDNC_SST    (GDNC_CW + 4) /* row stride of the state tile */
#define GDNC_PST    (GDNC_C + 4) /* row stride of the staged P: 16-byte rows 4 banks apart */

/* Row stride of the staged W, Q and K: 16-byte rows 16 banks apart, so that the rows a warp
 * reads 4 wide at one index (2 rows x 4 lanes' indices) fill the 32 banks once; zero past d_k
 * to a multiple of 16. */
__host__ __device__ static inline int gdnc_kst(int dk) { return (dk + 31) / 32 * 32 + 16; }

/* The scan's shared memory in floats: the state tile S [d_k to a multiple of 16][SST], W and Q
 * [C][kst], K [C][kst] and P [C][PST] (two of each for two = true; else K takes W's place), U',
 * U and U scaled by its token's decay to the chunk's end (each [C][CW]), Γ of two chunks. */
__host__ __device__ static inline int gdnc_scan_floats(int dk, bool two) {
    int kst = gdnc_kst(dk), nb = two ? 2 : 1;
    return (dk + 15) / 16 * 16 * GDNC_SST + (2 + (two ? 2 : 0)) * GDNC_C * kst +
           nb * GDNC_C * GDNC_PST + 3 * GDNC_C * GDNC_CW + 2 * GDNC_C;
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

/* One pass of the state update's sums: rows i0 + ig + 32a of Σ_t K[t][i] Uw[t][cols], tokens t
 * = tp (mod 2). CHECK: rows past d_k read as zero (a pass that ends beyond d_k). */
template <bool CHECK>
__device__ static inline void gdnc_state_sums(const float *Kc, int kst, const float *Uw, int nc,
                                              int dk, int i0, int ig, int cs, int tp,
                                              float (&sa)[4][4]) {
    gdnc_zero(sa);
    for (int t = tp; t < nc; t += 2) {
        float4 u4 = *(const float4 *)(Uw + t * GDNC_CW + 4 * cs);
        float uv[4] = {u4.x, u4.y, u4.z, u4.w};
#pragma unroll
        for (int a = 0; a < 4; a++) {
            int i = i0 + ig + 32 * a;
            float kv = !CHECK || i < dk ? Kc[t * kst + i] : 0.0f;
#pragma unroll
            for (int b = 0; b < 4; b++) sa[a][b] += kv * uv[b];
        }
    }
}

template <bool TWO>
__global__ static void __launch_bounds__(GDNC_SCAN_T)
    k_gdnc_scan(const float *q, const float *k, int64_t ldqk, int n, ts_gdn_dims d, float *state,
                float *out, const ts_seq_run *runs, const float *scratch, int max_chunks) {
    cuda_pdl_entry();
    extern __shared__ float4 sm4[];
    float *sm = (float *)sm4;
    const int C = GDNC_C, CW = GDNC_CW, PST = GDNC_PST, SST = GDNC_SST;
    int dk = d.d_k, dv = d.d_v, Hv = d.n_v_heads, kst = gdnc_kst(dk), dk16 = (dk + 15) & ~15;
    int h = blockIdx.y, run = blockIdx.z, start;
    gdnc_run(runs, run, &start, &n, &state);
    q += (int64_t)start * ldqk, k += (int64_t)start * ldqk;
    out += (int64_t)start * Hv * dv;
    int kh = h / (Hv / d.n_k_heads), cb = blockIdx.x * CW, ncol = min(CW, dv - cb);
    float *S = sm, *Wb = S + dk16 * SST, *Qb = Wb + C * kst, *Kb = TWO ? Qb + C * kst : Wb;
    float *Pb = TWO ? Kb + 2 * C * kst : Qb + C * kst, *Upb = Pb + (TWO ? 2 : 1) * C * PST;
    float *U = Upb + C * CW, *Uw = U + C * CW, *Gb = Uw + C * CW;
    float *Sg = state + (int64_t)h * dk * dv + cb;
    const int64_t per = gdnc_per(dk, dv);
    const float *in0 = scratch + ((int64_t)run * max_chunks * Hv + h) * per;

    /* chunk ci's parts: W [C][dk], U' [C][dv], P [C][C], Γ [C] in the scratch; Q and K rows */
    auto nc_of = [&](int ci) { return min(C, n - ci * C); };
    auto in_of = [&](int ci) { return in0 + (int64_t)ci * Hv * per; };
    auto qk_of = [&](const float *x, int ci) { return x + (int64_t)ci * C * ldqk + (int64_t)kh * dk; };
    auto issue_w = [&](int ci) {
        gdnc_copy(Wb, kst, in_of(ci), dk, nc_of(ci), dk, nc_of(ci));
    };
    auto issue_qug = [&](int ci) { /* the first product's other inputs */
        int nc = nc_of(ci);
        gdnc_copy(Qb, kst, qk_of(q, ci), ldqk, nc, dk, nc);
        gdnc_copy(Upb, CW, in_of(ci) + (int64_t)C * dk + cb, dv, nc, ncol, nc);
        gdnc_copy(Gb + (ci & 1) * C, C, in_of(ci) + (int64_t)C * (dk + dv + C), C, 1, C, 1);
    };
    auto issue_p = [&](int ci, float *dst) {
        gdnc_copy(dst, PST, in_of(ci) + (int64_t)C * (dk + dv), C, nc_of(ci), C, nc_of(ci));
    };
    auto issue_k = [&](int ci, float *dst) {
        gdnc_copy(dst, kst, qk_of(k, ci), ldqk, nc_of(ci), dk, nc_of(ci));
    };

    /* the state tile, zero past d_k (and past d_v); W's and Q's columns past d_k, which the
     * copies leave alone: zero, so that the 4-wide reads past d_k add nothing */
    for (int idx = threadIdx.x; idx < dk16 * CW; idx += blockDim.x) {
        int i = idx / CW, c = idx - i * CW;
        S[i * SST + c] = i < dk && c < ncol ? Sg[(int64_t)i * dv + c] : 0.0f;
    }
    for (int idx = threadIdx.x; idx < C * (dk16 - dk); idx += blockDim.x) {
        int r = idx / (dk16 - dk), i = dk + idx % (dk16 - dk);
        Wb[r * kst + i] = 0.0f, Qb[r * kst + i] = 0.0f;
    }
    if (n > 0) {
        issue_w(0), issue_qug(0);
        issue_p(0, Pb);
        if (TWO) issue_k(0, Kb);
    }
    cp_async_commit();

    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* products with rows of the chunk (W S0, Q S0, P U): tile rows rg + 16a, columns 4cg ..
     * 4cg + 3, the reduction's indices 4sl .. 4sl + 3 (mod 16) for W S0 and Q S0, sl (mod 4)
     * for P U; then this lane's row is r */
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
            if (more) {
                issue_p(ci + 1, Pb + (buf ^ 1) * C * PST);
                issue_k(ci + 1, Kb + (buf ^ 1) * C * kst);
            }
            cp_async_commit();
        }
        /* U = U' - W S0 and S0ᵀq_r, four indices a load */
        float u[4][4], o[4][4];
        gdnc_zero(u), gdnc_zero(o);
#pragma unroll 2
        for (int i = 4 * sl; i < dk; i += 16) {
            float sv[4][4];
#pragma unroll
            for (int m = 0; m < 4; m++) {
                float4 s4 = *(const float4 *)(S + (i + m) * SST + 4 * cg);
                sv[m][0] = s4.x, sv[m][1] = s4.y, sv[m][2] = s4.z, sv[m][3] = s4.w;
            }
#pragma unroll
            for (int a = 0; a < 4; a++) {
                float4 w4 = *(const float4 *)(Wb + (rg + 16 * a) * kst + i);
                float4 q4 = *(const float4 *)(Qb + (rg + 16 * a) * kst + i);
                float w[4] = {w4.x, w4.y, w4.z, w4.w}, qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
                for (int m = 0; m < 4; m++)
#pragma unroll
                    for (int b = 0; b < 4; b++)
                        u[a][b] += w[m] * sv[m][b], o[a][b] += qv[m] * sv[m][b];
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
        gdnc_zero(pu);
        for (int s = sl; s < nc; s += 4) {
            float4 u4 = *(const float4 *)(U + s * CW + 4 * cg);
            float uv[4] = {u4.x, u4.y, u4.z, u4.w};
#pragma unroll
            for (int a = 0; a < 4; a++) {
                float p = Pc[(rg + 16 * a) * PST + s];
#pragma unroll
                for (int b = 0; b < 4; b++) pu[a][b] += p * uv[b];
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
            float sa[4][4], ss[2][4];
            if (i0 + 128 <= dk)
                gdnc_state_sums<false>(Kc, kst, Uw, nc, dk, i0, ig, cs, tp, sa);
            else
                gdnc_state_sums<true>(Kc, kst, Uw, nc, dk, i0, ig, cs, tp, sa);
            gdnc_sum2(sa, ss);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                int i = i0 + ig + 32 * (2 * tp + j);
                if (i < dk) {
                    float4 *sp = (float4 *)(S + i * SST + 4 * cs), s4 = *sp;
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
        if (c < ncol) Sg[(int64_t)i * dv + c] = S[i * SST + c];
    }
}

/* Two K and P buffers in the scan where shared memory holds them. */
static bool gdnc_scan_two(int dk, int max_smem) {
    return (size_t)gdnc_scan_floats(dk, true) * sizeof(float) <= (size_t)max_smem;
}

bool cuda_gdn_chunked_fits(cuda_ctx *c, int d_k) {
    int max_smem = c->smem_optin;
    size_t prep = (size_t)gdnc_prep_floats(d_k) * sizeof(float);
    size_t scan = (size_t)gdnc_scan_floats(d_k, gdnc_scan_two(d_k, max_smem)) * sizeof(float);
    if (prep > (size_t)max_smem || scan > (size_t)max_smem) return false;
    size_t need = prep > scan ? prep : scan;
    if (need > c->gdnc_smem_opted) {
        const void *k[] = {(const void *)k_gdnc_prep, (const void *)k_gdnc_scan<false>,
                           (const void *)k_gdnc_scan<true>};
        if (!cuda_allow_smem(c, k, 3, (int)need)) return false;
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
                (size_t)gdnc_prep_floats(dk) * sizeof(float), q, k, ldqk, v, ldv, g, beta, n,
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
