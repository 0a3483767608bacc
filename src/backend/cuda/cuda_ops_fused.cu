/* Several small ops of a layer in one launch. A decode step of a small model is hundreds of
 * kernels whose cost is their launch and ramp, not their work; each kernel here does what two
 * to four did, with the same device functions (cuda_int.cuh) and so the same bits.
 *
 * gdn_prep: the delta rule's inputs. Blocks [0, n Hk) L2-normalise the q heads of the conv
 * output (and scale them), [n Hk, 2 n Hk) the k heads, and the last blocks compute the gates g and
 * beta of every (token, v-head).
 *
 * conv_gdn_prep: the causal conv of a decode step (every run one token) and gdn_prep in one:
 * a block per q head and per k head convolves its channels and L2-normalises them, blocks of
 * v channels convolve theirs, the last blocks compute the gates. Runs of more tokens take the
 * two kernels (the conv walks a run's tokens in order, one thread a channel).
 *
 * qk_norm_rope: attention's per-head RMSNorm of q and k followed by RoPE. A block per (token,
 * head) of q, then of k: the normalised head goes through shared memory to the rotation. */
#include "backend/cuda/cuda_int.cuh"

__global__ static void k_gdn_prep(const float *conv, int64_t ldc, int n, int Hk, int dk, float eps,
                                  float q_scale, float *qn, float *kn, const float *a,
                                  const float *b, int64_t ldab, int Hv, const float *neg_exp_a,
                                  const float *dt_bias, float *g, float *beta) {
    cuda_pdl_entry();
    int64_t heads = (int64_t)n * Hk, blk = blockIdx.x;
    if (blk < 2 * heads) { /* uniform per block: the whole block takes this branch */
        bool isk = blk >= heads;
        int64_t r = isk ? blk - heads : blk; /* row t * Hk + h of qn / kn */
        int64_t t = r / Hk, h = r % Hk;
        const float *src = conv + t * ldc + (isk ? (int64_t)Hk * dk : 0) + h * dk;
        cuda_l2norm_row(src, dk, eps, isk ? 1.0f : q_scale, (isk ? kn : qn) + r * dk);
        return;
    }
    int64_t idx = (blk - 2 * heads) * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n * Hv) return;
    int64_t t = idx / Hv;
    int h = (int)(idx % Hv);
    cuda_gdn_gate(a[t * ldab + h], b[t * ldab + h], neg_exp_a[h], dt_bias[h], &g[idx], &beta[idx]);
}

void cuda_op_gdn_prep(ts_backend *be, const float *conv, int64_t ldc, const ts_gdn_prep_args *p) {
    cuda_ctx *c = cuda_of(be);
    if (p->n <= 0) return;
    /* blocks of the head's width (to ROW_THREADS): a 512-token prompt is 2 x 512 x 16 heads of
     * 128 keys, and blocks of 256 threads ran half idle in twice the waves (27 us a layer). The
     * sums are the same: row_sumsq's idle warps add zeros. */
    int threads = p->dk < ROW_THREADS ? (p->dk + 31) / 32 * 32 : ROW_THREADS;
    unsigned blocks = (unsigned)(2 * (int64_t)p->n * p->Hk) +
                      cuda_blocks((int64_t)p->n * p->Hv, threads);
    cuda_launch(c, "gdn_prep", k_gdn_prep, blocks, threads, 0, conv, ldc, p->n, p->Hk, p->dk,
                p->eps, p->q_scale, p->qn, p->kn, p->a, p->b, p->ldab, p->Hv, p->neg_exp_a,
                p->dt_bias, p->g, p->beta);
}

/* hd <= QK_MAX_HD values per head through shared memory */
#define QK_MAX_HD 1024

__global__ static void k_qk_norm_rope(float *q, int64_t ldq, int64_t qhs, int nq, const float *wq,
                                      float *k, int64_t ldk, int nk, const float *wk, int hd,
                                      float eps, int rot_dim, const int32_t *pos, float theta) {
    cuda_pdl_entry();
    __shared__ float y[QK_MAX_HD];
    int64_t blk = blockIdx.x, per = (int64_t)nq + nk;
    int t = (int)(blk / per), h = (int)(blk % per);
    bool isk = h >= nq;
    float *x = isk ? k + t * ldk + (int64_t)(h - nq) * hd : q + t * ldq + (int64_t)h * qhs;
    const float *w = isk ? wk : wq;
    /* the RMSNorm of k_rmsnorm */
    double ss = row_sumsq(x, hd);
    float inv = 1.0f / sqrtf((float)(ss / hd) + eps);
    for (int i = threadIdx.x; i < hd; i += blockDim.x)
        y[i] = (x[i] * inv) * w[i];
    __syncthreads();
    /* then the rotation of k_rope; dims past rot_dim as normalised */
    int half = rot_dim / 2;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        if (i < half)
            cuda_rope_pair(y[i], y[i + half], pos[t], i, rot_dim, theta, &x[i], &x[i + half]);
        else if (i >= 2 * half)
            x[i] = y[i];
    }
}

void cuda_op_qk_norm_rope(ts_backend *be, float *q, int64_t ldq, int64_t q_head_stride, int nq,
                          const float *wq, float *k, int64_t ldk, int nk, const float *wk,
                          int n_tok, int hd, float eps, int rot_dim, const int32_t *pos,
                          float theta) {
    cuda_ctx *c = cuda_of(be);
    if (n_tok <= 0 || nq + nk <= 0) return;
    if (hd > QK_MAX_HD || rot_dim > hd) { /* beyond the shared row: the ops it fuses */
        cuda_op_rmsnorm(be, q, q_head_stride, n_tok * nq, hd, wq, eps, q, q_head_stride);
        cuda_op_rmsnorm(be, k, hd, n_tok * nk, hd, wk, eps, k, hd);
        cuda_op_rope(be, q, ldq, n_tok, nq, q_head_stride, rot_dim, pos, theta);
        cuda_op_rope(be, k, ldk, n_tok, nk, hd, rot_dim, pos, theta);
        return;
    }
    const int32_t *pd = cuda_positions(c, pos, n_tok);
    if (!pd) return;
    cuda_launch(c, "qk_norm_rope", k_qk_norm_rope, (unsigned)((int64_t)n_tok * (nq + nk)),
                ROW_THREADS, 0, q, ldq, q_head_stride, nq, wq, k, ldk, nk, wk, hd, eps, rot_dim, pd,
                theta);
}

/* The conv of channel ch for the one token of a run at row t (k_conv1d_silu's sum for n = 1),
 * written to out (and returned), and the channel's state shifted by that token. */
__device__ static inline float conv_one(const float *x, int64_t t, int64_t ldx, int C, int K,
                                        const float *w, float *state, float *out, int64_t ldo,
                                        int ch) {
    int hist = K - 1;
    const float *wc = w + (int64_t)ch * K;
    float s = 0.0f;
    for (int k = 0; k < K; k++)
        s += wc[k] * (k < hist ? state[(int64_t)k * C + ch] : x[t * ldx + ch]);
    float o = s / (1.0f + expf(-s));
    out[t * ldo + ch] = o;
    for (int k = 0; k < hist; k++)
        state[(int64_t)k * C + ch] =
            k + 1 < hist ? state[(int64_t)(k + 1) * C + ch] : x[t * ldx + ch];
    return o;
}

/* A channel's conv weights and state, loaded before the programmatic wait (no kernel writes the
 * weights; the state was written by this kernel a step ago - the delta rule loads its state
 * there too), so that after the wait only the token's x is a round trip. Kernels of up to
 * PREP_KMAX taps; longer ones take conv_one after the wait. */
#define PREP_KMAX 4
typedef struct {
    float w[PREP_KMAX], s[PREP_KMAX - 1];
} conv_early;

__device__ static inline void conv_early_load(const float *w, const float *state, int C, int K,
                                              int ch, conv_early *e) {
#pragma unroll
    for (int k = 0; k < PREP_KMAX; k++)
        e->w[k] = k < K ? w[(int64_t)ch * K + k] : 0.0f;
#pragma unroll
    for (int k = 0; k < PREP_KMAX - 1; k++)
        e->s[k] = k < K - 1 ? state[(int64_t)k * C + ch] : 0.0f;
}

/* conv_one from the values conv_early_load read: the same sum in the same order */
__device__ static inline float conv_one_early(const conv_early &e, const float *x, int64_t t,
                                              int64_t ldx, int C, int K, float *state, float *out,
                                              int64_t ldo, int ch) {
    int hist = K - 1;
    float xv = x[t * ldx + ch], s = 0.0f;
#pragma unroll
    for (int k = 0; k < PREP_KMAX; k++)
        if (k < K) s += e.w[k] * (k < hist ? e.s[k] : xv);
    float o = s / (1.0f + expf(-s));
    out[t * ldo + ch] = o;
#pragma unroll
    for (int k = 0; k < PREP_KMAX - 1; k++)
        if (k < hist) state[(int64_t)k * C + ch] = k + 1 < hist ? e.s[k + 1] : xv;
    return o;
}

/* A head's conv outputs kept in shared memory for its L2 norm up to this many keys (read back
 * from global memory they were a round trip through L2 after the barrier) */
#define PREP_SMEM_DK 256

/* grid.y: the run (runs NULL: the one run `one`); grid.x: 2 Hk head blocks, then the v channel
 * blocks, then the gate blocks (those with grid.y == 0 only). */
__global__ static void k_conv_gdn_prep(const float *x, int64_t ldx, int C, int K, const float *w,
                                       float *out, int64_t ldo, const ts_seq_run *runs,
                                       ts_seq_run one, ts_gdn_prep_args p) {
    int qk = 2 * p.Hk, qkc = qk * p.dk;
    int vb = (C - qkc + (int)blockDim.x - 1) / (int)blockDim.x, blk = blockIdx.x;
    /* the thread's first channel (a v channel, or channel threadIdx.x of a q / k head), its
     * weights and state read before the wait; so is the run table (written by a copy before
     * the graph's kernels: gdn_reg) */
    bool early = K <= PREP_KMAX && blk < qk + vb;
    ts_seq_run r = early ? (runs ? runs[blockIdx.y] : one) : ts_seq_run{};
    int ch0 = blk >= qk ? qkc + (blk - qk) * (int)blockDim.x + threadIdx.x
                        : blk * p.dk + (int)threadIdx.x;
    early = early && (blk >= qk ? ch0 < C : (int)threadIdx.x < p.dk);
    conv_early e;
    if (early) conv_early_load(w, r.a, C, K, ch0, &e);
    cuda_pdl_entry();
    if (blk >= qk + vb) {
        int64_t idx = (int64_t)(blk - qk - vb) * blockDim.x + threadIdx.x;
        if (blockIdx.y || idx >= (int64_t)p.n * p.Hv) return;
        int64_t t = idx / p.Hv;
        int h = (int)(idx % p.Hv);
        cuda_gdn_gate(p.a[t * p.ldab + h], p.b[t * p.ldab + h], p.neg_exp_a[h], p.dt_bias[h],
                      &p.g[idx], &p.beta[idx]);
        return;
    }
    if (K > PREP_KMAX) r = runs ? runs[blockIdx.y] : one;
    int64_t t = r.start;
    if (blk >= qk) { /* v channels */
        if (early)
            conv_one_early(e, x, t, ldx, C, K, r.a, out, ldo, ch0);
        else if (ch0 < C)
            conv_one(x, t, ldx, C, K, w, r.a, out, ldo, ch0);
        return;
    }
    __shared__ float co[PREP_SMEM_DK];
    bool in_smem = p.dk <= PREP_SMEM_DK;
    for (int i = threadIdx.x; i < p.dk; i += blockDim.x) {
        float o = early && i == (int)threadIdx.x
                      ? conv_one_early(e, x, t, ldx, C, K, r.a, out, ldo, blk * p.dk + i)
                      : conv_one(x, t, ldx, C, K, w, r.a, out, ldo, blk * p.dk + i);
        if (in_smem) co[i] = o;
    }
    __syncthreads(); /* the head's conv outputs are all written */
    bool isk = blk >= p.Hk;
    int h = isk ? blk - p.Hk : blk;
    cuda_l2norm_row(in_smem ? co : out + t * ldo + (int64_t)blk * p.dk, p.dk, p.eps,
                    isk ? 1.0f : p.q_scale, (isk ? p.kn : p.qn) + (t * p.Hk + h) * p.dk);
}

void cuda_op_conv_gdn_prep(ts_backend *be, const float *x, int64_t ldx, int C, int K,
                           const float *w, const ts_seq_run *runs, int nr, float *out, int64_t ldo,
                           const ts_gdn_prep_args *p) {
    cuda_ctx *c = cuda_of(be);
    if (nr <= 0 || C <= 0) return;
    bool ones = 2 * p->Hk * p->dk <= C;
    for (int r = 0; r < nr; r++)
        ones = ones && runs[r].len == 1;
    if (!ones) { /* runs of several tokens: the two kernels */
        if (nr > 1)
            cuda_op_conv1d_silu_runs(be, x, ldx, C, K, w, runs, nr, out, ldo);
        else
            cuda_op_conv1d_silu(be, x + (int64_t)runs[0].start * ldx, ldx, runs[0].len, C, K, w,
                                runs[0].a, out + (int64_t)runs[0].start * ldo, ldo);
        cuda_op_gdn_prep(be, out, ldo, p);
        return;
    }
    const ts_seq_run *dr = NULL;
    if (nr > 1 && !(dr = (const ts_seq_run *)cuda_table(c, runs, (size_t)nr * sizeof *runs)))
        return;
    /* threads a block: 128 for more than 16 sequences - a 128-key head's block without its idle
     * half, twice the blocks resident: a step of 32 / 64 sequences of the 0.8B on an H200 -1.9%
     * / -1.3% - and 256 for fewer (one sequence's step +0.8% with 128, 16 level). The same bits
     * either way (test_cuda's fused test). */
    int T = c->prep_threads ? c->prep_threads : nr > 16 ? 128 : ROW_THREADS;
    int vb = (int)cuda_blocks(C - 2 * p->Hk * p->dk, T);
    unsigned gates = cuda_blocks((int64_t)p->n * p->Hv, T);
    dim3 grid((unsigned)(2 * p->Hk + vb) + gates, (unsigned)nr);
    ts_seq_run one = runs[0];
    one.pos0 = 0; /* not used: as an argument it would change every step (a graph update) */
    cuda_launch(c, "conv_gdn_prep", k_conv_gdn_prep, grid, T, 0, x, ldx, C, K, w, out, ldo, dr, one,
                *p);
}
