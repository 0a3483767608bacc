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
#include "backend/cuda/cuda_conv_step.cuh"
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

/* The conv of channel ch for the one token of a run at row t, whose value there is xv
 * (k_conv1d_silu's sum for n = 1), from the values conv_early_load read before the wait,
 * written to out (and returned), and the channel's state shifted by that token. */
__device__ static inline float conv_one(const conv_early &e, float xv, int64_t t, int C, int K,
                                        float *state, float *out, int64_t ldo, int ch) {
    float o = conv_sum(e, xv, K);
    out[t * ldo + ch] = o;
    conv_shift(e, xv, C, K, state, ch);
    return o;
}

/* A head's conv outputs kept in shared memory for its L2 norm up to this many keys (read back
 * from global memory they were a round trip through L2 after the barrier) */
#define PREP_SMEM_DK 256

/* grid.y: runs [G y, G y + G) of nr (runs NULL: the one run `one`), a thread taking its
 * channel of each; grid.x: 2 Hk head blocks, then the v channel blocks, then the gate blocks
 * (those with grid.y == 0 only). A thread's first channel is read before the wait for all its
 * runs, and so is the run table (written by a copy before the graph's kernels: gdn_reg). */
template <int G>
__global__ static void k_conv_gdn_prep(const float *x, int64_t ldx, int C, int K, const float *w,
                                       float *out, int64_t ldo, const ts_seq_run *runs,
                                       ts_seq_run one, int nr, ts_gdn_prep_args p) {
    int qk = 2 * p.Hk, qkc = qk * p.dk, T = (int)blockDim.x, tid = (int)threadIdx.x;
    int vb = (C - qkc + T - 1) / T, blk = blockIdx.x;
    bool conv = blk < qk + vb;
    ts_seq_run r[G];
    bool has[G]; /* the same for the whole block */
    conv_early e[G];
    int ch0 = blk >= qk ? qkc + (blk - qk) * T + tid : blk * p.dk + tid;
    bool mine = conv && (blk >= qk ? ch0 < C : tid < p.dk);
#pragma unroll
    for (int g = 0; g < G; g++) {
        int ri = (int)blockIdx.y * G + g;
        has[g] = conv && ri < nr;
        r[g] = has[g] ? (runs ? runs[ri] : one) : ts_seq_run{};
        if (mine && has[g]) conv_early_load(w, r[g].a, C, K, ch0, &e[g]);
    }
    cuda_pdl_entry();
    if (!conv) {
        int64_t idx = (int64_t)(blk - qk - vb) * T + tid;
        if (blockIdx.y || idx >= (int64_t)p.n * p.Hv) return;
        int64_t t = idx / p.Hv;
        int h = (int)(idx % p.Hv);
        cuda_gdn_gate(p.a[t * p.ldab + h], p.b[t * p.ldab + h], p.neg_exp_a[h], p.dt_bias[h],
                      &p.g[idx], &p.beta[idx]);
        return;
    }
    /* the runs' x of the first channel, every load in flight before any is used */
    float x0[G];
#pragma unroll
    for (int g = 0; g < G; g++)
        x0[g] = mine && has[g] ? x[r[g].start * ldx + ch0] : 0.0f;
    if (blk >= qk) { /* v channels */
#pragma unroll
        for (int g = 0; g < G; g++)
            if (mine && has[g]) conv_one(e[g], x0[g], r[g].start, C, K, r[g].a, out, ldo, ch0);
        return;
    }
    __shared__ float co[G][PREP_SMEM_DK];
    bool in_smem = p.dk <= PREP_SMEM_DK;
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (!has[g]) continue;
        for (int i = tid; i < p.dk; i += T) {
            int ch = blk * p.dk + i;
            conv_early ei;
            if (i != tid) conv_early_load(w, r[g].a, C, K, ch, &ei);
            float o = i == tid ? conv_one(e[g], x0[g], r[g].start, C, K, r[g].a, out, ldo, ch)
                               : conv_one(ei, x[r[g].start * ldx + ch], r[g].start, C, K, r[g].a,
                                          out, ldo, ch);
            if (in_smem) co[g][i] = o;
        }
    }
    __syncthreads(); /* the head's conv outputs are all written */
    bool isk = blk >= p.Hk;
    int h = isk ? blk - p.Hk : blk;
    float scale = isk ? 1.0f : p.q_scale;
    if (!in_smem) {
        for (int g = 0; g < G; g++)
            if (has[g])
                cuda_l2norm_row(out + r[g].start * ldo + (int64_t)blk * p.dk, p.dk, p.eps, scale,
                                (isk ? p.kn : p.qn) + (r[g].start * p.Hk + h) * p.dk);
        return;
    }
    /* cuda_l2norm_row's sums and values, the G rows' sums in one reduction */
    double ss[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        ss[g] = 0.0;
        for (int i = tid; i < p.dk && has[g]; i += T)
            ss[g] += (double)co[g][i] * co[g][i];
    }
    row_sum_blocks<G>(ss);
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (!has[g]) continue;
        float inv = 1.0f / sqrtf((float)ss[g] + p.eps);
        float *dst = (isk ? p.kn : p.qn) + (r[g].start * p.Hk + h) * p.dk;
        for (int i = tid; i < p.dk; i += T)
            dst[i] = (co[g][i] * inv) * scale;
    }
}

/* Blocks of k_conv_gdn_prep (a run a block) of T threads (128 or ROW_THREADS) a
 * multiprocessor holds at once, asked once (thread-safe: a static's initialisation). */
static int prep_per_sm(int T) {
    auto ask = [](int threads) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_conv_gdn_prep<1>, threads, 0) !=
                cudaSuccess ||
            n < 1)
            n = 1;
        return n;
    };
    static const int per_sm[2] = {ask(128), ask(ROW_THREADS)};
    return per_sm[T == 128 ? 0 : 1];
}

/* Runs of one token through a conv of up to PREP_KMAX taps take the fused kernel; two runs a
 * block (a thread its channel of both) where a run a block would take more than a wave of the
 * GPU, so that every block is resident at once and has its early loads in flight before the
 * wait: 64 sequences of the 0.8B are 3136 blocks of 128 threads, 1.5 waves of an H200 (132
 * multiprocessors of 16 such blocks). */
void cuda_op_conv_gdn_prep(ts_backend *be, const float *x, int64_t ldx, int C, int K,
                           const float *w, const ts_seq_run *runs, int nr, float *out, int64_t ldo,
                           const ts_gdn_prep_args *p) {
    cuda_ctx *c = cuda_of(be);
    if (nr <= 0 || C <= 0) return;
    bool ones = 2 * p->Hk * p->dk <= C && K <= PREP_KMAX;
    for (int r = 0; r < nr; r++)
        ones = ones && runs[r].len == 1;
    if (!ones) { /* runs of several tokens, or a conv of more taps: the two kernels */
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
    int64_t conv_blocks = (int64_t)(2 * p->Hk + vb) * nr;
    bool pairs = c->prep_pairs > 0 || (c->prep_pairs < 0 && nr > 1 &&
                                       conv_blocks > (int64_t)prep_per_sm(T) * c->sm_count);
    int G = pairs ? 2 : 1;
    dim3 grid((unsigned)(2 * p->Hk + vb) + gates, (unsigned)((nr + G - 1) / G));
    ts_seq_run one = runs[0];
    one.pos0 = 0; /* not used: as an argument it would change every step (a graph update) */
    if (pairs)
        cuda_launch(c, "conv_gdn_prep", k_conv_gdn_prep<2>, grid, T, 0, x, ldx, C, K, w, out, ldo,
                    dr, one, nr, *p);
    else
        cuda_launch(c, "conv_gdn_prep", k_conv_gdn_prep<1>, grid, T, 0, x, ldx, C, K, w, out, ldo,
                    dr, one, nr, *p);
}
