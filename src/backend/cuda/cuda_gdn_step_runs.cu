/* Many sequences' delta-rule decode step in one kernel: for a batch whose every run is one
 * token, what conv_gdn_prep, the delta rule (gdn_runs) and gated_rmsnorm did in three launches -
 * the causal conv of the token's q, k and v channels, the L2 norms of q and k, the gates, the
 * rule on the recurrent state, the gated RMSNorm of the output - from the input projection's row
 * to the output projection's input, q, k and v never leaving the block.
 *
 * A block of 512 threads per (v-head, run): the Qwen3.5 heads (d_k = d_v = 128, one v-head a
 * k-head). For the rule, warp w holds columns 32 (w / 4) .. + 31 (lane = column) and rows
 * 32 (w % 4) .. + 31 of the head's state, 32 values a thread in registers - the layout of
 * gdn_reg's four 128-thread column blocks (cuda_ops_seq.cu), which the one-sequence step runs as a
 * cluster; here the four are one block, so the gated norm's sum over the head's 128 columns and
 * the q and k conv outputs are shared through the block's own shared memory instead of a cluster
 * (clusters cost the batched rule more than the launch they save: cuda_ops_seq.cu) and each q and
 * k channel is convolved once, not by each column block. For the conv, thread t < 128 takes q
 * channel t of its head, 128 <= t < 256 k channel t - 128, 256 <= t < 384 v channel t - 256.
 * Every sum is taken in the one-sequence step's order (k_gdn_conv_step), so a run's output and
 * states are that step's bit for bit (test_cuda's steps section).
 *
 * Read before the programmatic wait: the run table (written by a copy before the graph's
 * kernels), the recurrent state and the conv's weights and state (no kernel of the step writes
 * them before this one), the gates' and the norm's weights. Each state is stored as soon as it is
 * final. Two blocks a multiprocessor (64 registers a thread): 128 KB of state in flight on each,
 * as gdn_reg's eight 128-thread blocks - yet the state streams at ~3.0 TB/s on an H200 against
 * their 3.4 (two big blocks pause their loads together while they compute; asking L2 for the
 * next wave's state made it slower: bench/RESULTS.md). A 64-sequence step of the 0.8B still
 * gained 4.5%, the three launches' worth. */
#include "backend/cuda/cuda_conv_step.cuh"
#include "backend/cuda/cuda_int.cuh"

#define GSR_DK      128 /* d_k = d_v */
#define GSR_THREADS 512
#define GSR_ROWS    32 /* state rows a thread */

__global__ static void __launch_bounds__(GSR_THREADS, 2)
    k_gdn_step_runs(const ts_seq_run *runs, const float *x, int C, int K, const float *w,
                    ts_gdn_prep_args p, ts_gated_norm gn, float *out) {
    constexpr int D = GSR_DK;
    __shared__ float qs[D], ks[D], vs[D];
    __shared__ float red[2][4][4][32]; /* [dot][column block][row warp][lane] */
    __shared__ double part[8];         /* the q and k sums of squares, a warp each */
    __shared__ float ssq[4];           /* the output's sums of squares, a column block each */
    int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int cb = warp >> 2, rw = warp & 3, c = cb * 32 + lane, h = (int)blockIdx.x, H = (int)gridDim.x;
    ts_seq_run r = runs[blockIdx.y];
    float *Sr = r.b + (int64_t)h * D * D + (int64_t)(rw * GSR_ROWS) * D + c;
    float S[GSR_ROWS];
#pragma unroll
    for (int j = 0; j < GSR_ROWS; j++)
        S[j] = Sr[j * D];
    /* the conv channel: q, then k heads (H of each), then the v channels */
    int part_of = tid >> 7, ch = part_of * H * D + h * D + (tid & (D - 1));
    bool conv = part_of < 3;
    conv_early e;
    if (conv) conv_early_load(w, r.a, C, K, ch, &e);
    float gw = rw == 0 ? gn.w[c] : 0.0f, nea = p.neg_exp_a[h], dtb = p.dt_bias[h];
    cuda_pdl_entry();
    const float *xr = x + (int64_t)r.start * C;
    float xv = conv ? xr[ch] : 0.0f, ga = p.a[(int64_t)r.start * p.ldab + h],
          gb = p.b[(int64_t)r.start * p.ldab + h];
    int64_t at = (int64_t)r.start * H * D + (int64_t)h * D + c;
    float zi = rw == 0 ? gn.z[at] : 0.0f;
    float co = conv ? conv_sum(e, xv, K) : 0.0f;
    if (conv) conv_shift(e, xv, C, K, r.a, ch); /* only this thread reads the channel's state */
    if (part_of == 2) vs[tid - 2 * D] = co;
    /* the q and k norms: row_sum_blocks' order over each part's four warps */
    double s = (double)co * co;
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0 && warp < 8) part[warp] = s;
    __syncthreads();
    if (part_of < 2) {
        double t = 0.0;
        for (int i = 0; i < 4; i++)
            t += part[part_of * 4 + i];
        float inv = 1.0f / sqrtf((float)t + p.eps);
        if (part_of == 0)
            qs[tid] = (co * inv) * p.q_scale;
        else
            ks[tid - D] = (co * inv) * 1.0f;
    }
    float gt, bt;
    cuda_gdn_gate(ga, gb, nea, dtb, &gt, &bt);
    __syncthreads();
    float decay = expf(gt), m = 0.0f;
    const float *kr = ks + rw * GSR_ROWS, *qr = qs + rw * GSR_ROWS;
#pragma unroll
    for (int j = 0; j < GSR_ROWS; j++) {
        S[j] *= decay;
        m += S[j] * kr[j];
    }
    red[0][cb][rw][lane] = m;
    __syncthreads();
    m = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++)
        m += red[0][cb][i][lane];
    float delta = bt * (vs[c] - m), o = 0.0f;
#pragma unroll
    for (int j = 0; j < GSR_ROWS; j++) {
        S[j] += kr[j] * delta;
        o += S[j] * qr[j];
    }
#pragma unroll
    for (int j = 0; j < GSR_ROWS; j++) /* final: its stores drain under the output's sums */
        Sr[j * D] = S[j];
    red[1][cb][rw][lane] = o;
    __syncthreads();
    float sum = 0.0f;
    if (rw == 0) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            sum += red[1][cb][i][lane];
        float sq = cuda_warp_sum(sum * sum);
        if (lane == 0) ssq[cb] = sq;
    }
    __syncthreads();
    if (rw == 0) {
        float total = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++)
            total += ssq[i];
        float inv = 1.0f / sqrtf(total / D + gn.eps);
        out[at] = gw * (sum * inv) * (zi / (1.0f + expf(-zi)));
    }
}

bool cuda_gdn_step_runs(cuda_ctx *c, const float *x, int C, int K, const float *w,
                        const ts_seq_run *runs, int nr, const ts_gdn_prep_args *p, int H,
                        const ts_gated_norm *gn, float *out) {
    if (!c->gdn_step_runs || H < 1 || C != 3 * H * GSR_DK || K < 1 || K > PREP_KMAX) return false;
    const ts_seq_run *dr = (const ts_seq_run *)cuda_table(c, runs, (size_t)nr * sizeof *runs);
    if (!dr) return true; /* recorded as failed */
    cuda_launch(c, "gdn_step_runs", k_gdn_step_runs, dim3((unsigned)H, (unsigned)nr), GSR_THREADS,
                0, dr, x, C, K, w, *p, *gn, out);
    return true;
}
