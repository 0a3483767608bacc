/* Several small ops of a layer in one launch. A decode step of a small model is hundreds of
 * kernels whose cost is their launch and ramp, not their work; each kernel here does what two
 * to four did, with the same device functions (cuda_int.cuh) and so the same bits.
 *
 * gdn_prep: the delta rule's inputs. Blocks [0, n Hk) L2-normalise the q heads of the conv
 * output (and scale them), [n Hk, 2 n Hk) the k heads, and the last blocks compute the gates g and
 * beta of every (token, v-head).
 *
 * qk_norm_rope: attention's per-head RMSNorm of q and k followed by RoPE. A block per (token,
 * head) of q, then of k: the normalised head goes through shared memory to the rotation. */
#include "backend/cuda/cuda_int.cuh"

#define GATES_PER_BLOCK ROW_THREADS

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
    int64_t idx = (blk - 2 * heads) * GATES_PER_BLOCK + threadIdx.x;
    if (idx >= (int64_t)n * Hv) return;
    int64_t t = idx / Hv;
    int h = (int)(idx % Hv);
    cuda_gdn_gate(a[t * ldab + h], b[t * ldab + h], neg_exp_a[h], dt_bias[h], &g[idx], &beta[idx]);
}

void cuda_op_gdn_prep(ts_backend *be, const float *conv, int64_t ldc, int n, int Hk, int dk,
                      float eps, float q_scale, float *qn, float *kn, const float *a,
                      const float *b, int64_t ldab, int Hv, const float *neg_exp_a,
                      const float *dt_bias, float *g, float *beta) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0) return;
    unsigned blocks = (unsigned)(2 * (int64_t)n * Hk) + cuda_blocks((int64_t)n * Hv, GATES_PER_BLOCK);
    cuda_launch(c, "gdn_prep", k_gdn_prep, blocks, ROW_THREADS, 0, conv, ldc, n, Hk, dk, eps,
                q_scale, qn, kn, a, b, ldab, Hv, neg_exp_a, dt_bias, g, beta);
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
    for (int i = threadIdx.x; i < hd; i += blockDim.x) y[i] = (x[i] * inv) * w[i];
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
                ROW_THREADS, 0, q, ldq, q_head_stride, nq, wq, k, ldk, nk, wk, hd, eps,
                rot_dim, pd, theta);
}
