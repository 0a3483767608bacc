/* Gated DeltaNet ops on the CPU: the causal conv, the gates, the delta rule (token-by-token
 * recurrent form and chunked form) and the gated output norm. specs/models.md A.6 and A.7 give
 * the math; both delta-rule forms are tested equal on random data. The recurrent state stays
 * fp32 throughout. */
#include "backend/cpu/cpu_int.h"
#include "backend/cpu/ops_seq.h"

#include <string.h>

/* The causal conv a span of channels at a time, blocks of CONV_CB channels split over the
 * threads (conv_task): the span's taps transposed to [K][span] on the stack, then per token K
 * contiguous multiply-adds over the span (vectorised by the compiler, in tap order as the plain
 * loop sums); a single token of 4 taps reads the taps in place (conv_one4), the same
 * operations in the same order. So a run split into single tokens gives the same bits (the
 * plain loop, for kernels of more taps, may differ from it in a SiLU's last bit). */
enum { CONV_CB = 64, CONV_SPAN = 1024, CONV_MAX_K = 16 };

typedef struct {
    const float *x;
    int64_t ldx;
    int n, C, K;
    const float *w, *state;
    float *out;
    int64_t ldo;
    const cpu_seq_kernels *sk;
} conv_job;

/* One token of the 4-tap conv (decode) over channels [c0, c0 + nc): the taps read where they lie
 * (w is [C][4]; the compiler's interleaved loads), not transposed first - for a single token the
 * transposition cost as much as the sums. The same operations in the same order as the
 * transposed form, so the same bits. */
static void conv_one4(const conv_job *j, int c0, int nc, float *acc) {
    const float *w = j->w + (int64_t)c0 * 4, *s = j->state + c0;
    const float *x0 = s, *x1 = s + j->C, *x2 = s + 2 * (int64_t)j->C, *x3 = j->x + c0;
    for (int c = 0; c < nc; c++) {
        float a = 0.0f;
        a += w[4 * c] * x0[c];
        a += w[4 * c + 1] * x1[c];
        a += w[4 * c + 2] * x2[c];
        a += w[4 * c + 3] * x3[c];
        acc[c] = a;
    }
}

static void conv_block(const conv_job *j, int c0, int nc) {
    int K = j->K, hist = K - 1;
    float wt[CONV_MAX_K][CONV_SPAN], acc[CONV_SPAN];
    if (j->n == 1 && K == 4) {
        conv_one4(j, c0, nc, acc);
        j->sk->silu_fine(acc, j->out + c0, nc);
        return;
    }
    for (int k = 0; k < K; k++)
        for (int c = 0; c < nc; c++)
            wt[k][c] = j->w[(int64_t)(c0 + c) * K + k];
    for (int t = 0; t < j->n; t++) {
        for (int c = 0; c < nc; c++)
            acc[c] = 0.0f;
        for (int k = 0; k < K; k++) {
            int tau = t - hist + k; /* input time of tap k */
            const float *xr =
                tau < 0 ? j->state + (int64_t)(hist + tau) * j->C + c0 : j->x + tau * j->ldx + c0;
            for (int c = 0; c < nc; c++)
                acc[c] += wt[k][c] * xr[c];
        }
        /* SiLU with e^-x as expf gives it, to the last bit but for about one float in 60,000
         * (silu_fine: a double-precision vector exp; expf was 5% of a 0.8B prefill).
         * Not the float vector SiLU: with it the bf16 fixture of test_hf_parity, whose
         * batched-vs-separate check sits near its bound, went from 2.4e-5 to 5.7e-5 > 5e-5 at
         * AVX2 when tried. */
        j->sk->silu_fine(acc, j->out + t * j->ldo + c0, nc);
    }
}

/* The threads divide blocks of CONV_CB channels; each takes its channels in spans of up to
 * CONV_SPAN, all tokens of a span at a time: a token's span of x is then one contiguous run (a
 * 64-channel block walked token by token read 256 bytes a row, a row 24 KB apart for the 0.8B,
 * and missed the caches at every token: 4% of a prefill). */
static void conv_task(void *p, int ith, int nth) {
    const conv_job *j = p;
    long lo, hi;
    ts_split_range((j->C + CONV_CB - 1) / CONV_CB, ith, nth, &lo, &hi);
    int c1 = hi * CONV_CB < j->C ? (int)hi * CONV_CB : j->C;
    for (int c0 = (int)lo * CONV_CB; c0 < c1; c0 += CONV_SPAN)
        conv_block(j, c0, c1 - c0 < CONV_SPAN ? c1 - c0 : CONV_SPAN);
}

/* The reference loop, for kernels wider than CONV_MAX_K taps (none of the models). */
static void conv_plain(const conv_job *j) {
    int hist = j->K - 1;
    for (int t = 0; t < j->n; t++) {
        float *o = j->out + t * j->ldo;
        for (int c = 0; c < j->C; c++) {
            const float *wc = j->w + (int64_t)c * j->K;
            float s = 0.0f;
            for (int k = 0; k < j->K; k++) {
                int tau = t - hist + k;
                s += wc[k] * (tau < 0 ? j->state[(int64_t)(hist + tau) * j->C + c]
                                      : j->x[tau * j->ldx + c]);
            }
            o[c] = cpu_silu(s);
        }
    }
}

void cpu_op_conv1d_silu(ts_backend *be, const float *x, int64_t ldx, int n, int C, int K,
                        const float *w, float *state, float *out, int64_t ldo) {
    cpu_ctx *ctx = cpu_of(be);
    int hist = K - 1;
    conv_job j = {x, ldx, n, C, K, w, state, out, ldo, cpu_seq_pick(ctx->isa)};
    if (K > CONV_MAX_K)
        conv_plain(&j);
    else if ((int64_t)n * C < 1024) /* less work than handing half to a thread */
        conv_task(&j, 0, 1);
    else
        ts_pool_run(ctx->pool, conv_task, &j);
    /* the new state: the last K-1 inputs, oldest first */
    if (n >= hist) {
        for (int k = 0; k < hist; k++)
            memcpy(state + (int64_t)k * C, x + (n - hist + k) * ldx, (size_t)C * sizeof(float));
    } else {
        memmove(state, state + (int64_t)n * C, (size_t)(hist - n) * C * sizeof(float));
        for (int k = 0; k < n; k++)
            memcpy(state + (int64_t)(hist - n + k) * C, x + k * ldx, (size_t)C * sizeof(float));
    }
}

void cpu_op_gdn_gates(ts_backend *be, const float *a, int64_t lda, const float *b, int64_t ldb,
                      int n, int Hv, const float *neg_exp_a, const float *dt_bias, float *g,
                      float *beta) {
    (void)be;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < Hv; h++) {
            beta[t * Hv + h] = cpu_sigmoid(b[t * ldb + h]);
            g[t * Hv + h] = neg_exp_a[h] * cpu_softplus(a[t * lda + h] + dt_bias[h]);
        }
}

typedef struct {
    const float *q, *k, *v, *g, *beta;
    int64_t ldqk, ldv;
    int n;
    const ts_gdn_dims *d;
    float *state, *out;
    const cpu_seq_kernels *kern;
} gdn_job;

/* Token by token, in the reference's order: decay, predict, correct, read. */
static void gdn_recurrent_head(const gdn_job *j, int h) {
    const ts_gdn_dims *d = j->d;
    int dk = d->d_k, dv = d->d_v, Hv = d->n_v_heads;
    int kh = h / (d->n_v_heads / d->n_k_heads);
    float *S = j->state + (int64_t)h * dk * dv;
    for (int t = 0; t < j->n; t++) {
        const float *q = j->q + t * j->ldqk + (int64_t)kh * dk;
        const float *k = j->k + t * j->ldqk + (int64_t)kh * dk;
        const float *v = j->v + t * j->ldv + (int64_t)h * dv;
        float *o = j->out + (int64_t)t * Hv * dv + (int64_t)h * dv;
        j->kern->gdn_step(S, dk, dv, q, k, v, expf(j->g[t * Hv + h]), j->beta[t * Hv + h], o);
    }
}

/* Per-thread chunk buffers (static TLS: too large for the pool threads' stacks to promise). */
enum { CH = CPU_GDN_CHUNK };
static _Thread_local float gdn_wk[CH * CPU_MAX_HEAD_DIM], gdn_u[CH * CPU_MAX_HEAD_DIM],
    gdn_kt[CPU_MAX_HEAD_DIM * CH], gdn_kk[CH * CH], gdn_qk[CH * CH];

/* Chunked form (spec A.7) for chunks of up to CPU_GDN_CHUNK tokens, as a few small matrix
 * products per chunk (ops_seq.h kernels) instead of two passes over the state per token:
 *   W = K S0, O = Q S0               (n x dk times dk x dv)
 *   KK = K K^T, QK = Q K^T           (n x n dot products, lower triangle used)
 *   U = B - A U  (forward substitution, A strictly lower: row r is a 1 x r times r x dv product)
 *   O = e^G o O + (D o QK) U         (row-scaled, lower-triangular n x n times n x dv)
 *   S = e^G_n S0 + (w o K)^T U       (dk x n times n x dv, K transposed once per chunk)
 * The decay factors e^(G_r - G_s) come from the vector exp, one row of them at a time. */
static void gdn_chunked_head(const gdn_job *j, int h) {
    const ts_gdn_dims *d = j->d;
    const cpu_seq_kernels *K = j->kern;
    int dk = d->d_k, dv = d->d_v, Hv = d->n_v_heads;
    int kh = h / (d->n_v_heads / d->n_k_heads);
    int64_t ldo = (int64_t)Hv * dv;
    float *S = j->state + (int64_t)h * dk * dv;
    float *Wk = gdn_wk, *U = gdn_u, *Kt = gdn_kt, *KK = gdn_kk, *QK = gdn_qk;
    float gam[CH], egam[CH], row[CH], scale_s[CPU_MAX_HEAD_DIM];

    for (int c0 = 0; c0 < j->n; c0 += CH) {
        int n = j->n - c0 < CH ? j->n - c0 : CH;
        const float *Qc = j->q + (int64_t)c0 * j->ldqk + (int64_t)kh * dk;
        const float *Kc = j->k + (int64_t)c0 * j->ldqk + (int64_t)kh * dk;
        const float *Vc = j->v + (int64_t)c0 * j->ldv + (int64_t)h * dv;
        float *Oc = j->out + (int64_t)c0 * ldo + (int64_t)h * dv;
        float acc = 0.0f;
        for (int r = 0; r < n; r++) {
            acc += j->g[(c0 + r) * Hv + h];
            gam[r] = acc;
            egam[r] = expf(acc);
        }
        K->gemm_nn(n, dv, dk, Kc, j->ldqk, S, dv, Wk, dv, NULL);
        K->gemm_nn(n, dv, dk, Qc, j->ldqk, S, dv, Oc, ldo, NULL);
        /* lower triangles in row blocks of 16 (the products above the diagonal are skipped) */
        for (int r0 = 0; r0 < n; r0 += 16) {
            int mr = n - r0 < 16 ? n - r0 : 16, nc = r0 + mr;
            K->gemm_nt(mr, nc, dk, Kc + r0 * j->ldqk, j->ldqk, Kc, j->ldqk, KK + r0 * CH, CH);
            K->gemm_nt(mr, nc, dk, Qc + r0 * j->ldqk, j->ldqk, Kc, j->ldqk, QK + r0 * CH, CH);
        }
        /* KK row r becomes -A[r][s] = -b_r (k_r.k_s) e^(G_r-G_s) for s < r; QK row r becomes
         * (q_r.k_s) e^(G_r-G_s) for s <= r, 0 beyond (the diagonal of QK is needed, of KK not) */
        for (int r = 0; r < n; r++) {
            float b = j->beta[(c0 + r) * Hv + h];
            for (int s = 0; s <= r; s++)
                row[s] = gam[r] - gam[s];
            K->exp_sum(row, r + 1);
            for (int s = 0; s < r; s++)
                KK[r * CH + s] *= -b * row[s];
            for (int s = 0; s <= r; s++)
                QK[r * CH + s] *= row[s];
            for (int s = r + 1; s < n; s++)
                QK[r * CH + s] = 0.0f;
        }
        /* U_r = b_r v_r - b_r e^{G_r} S0^T k_r - sum_{s<r} A[r][s] U_s */
        for (int r = 0; r < n; r++) {
            float b = j->beta[(c0 + r) * Hv + h], *ur = U + r * dv;
            const float *vr = Vc + r * j->ldv, *wr = Wk + r * dv;
            for (int c = 0; c < dv; c++)
                ur[c] = b * (vr[c] - egam[r] * wr[c]);
            row[0] = 1.0f;
            K->gemm_nn(1, dv, r, KK + r * CH, CH, U, dv, ur, dv, row);
        }
        /* o_r = e^{G_r} S0^T q_r + sum_{s<=r} e^{G_r-G_s} (q_r.k_s) U_s */
        for (int r0 = 0; r0 < n; r0 += 16) {
            int mr = n - r0 < 16 ? n - r0 : 16;
            K->gemm_nn(mr, dv, r0 + mr, QK + r0 * CH, CH, U, dv, Oc + r0 * ldo, ldo, egam + r0);
        }
        /* S = e^{G_n} S0 + sum_s e^{G_n-G_s} k_s (x) U_s */
        for (int s = 0; s < n; s++)
            row[s] = gam[n - 1] - gam[s];
        K->exp_sum(row, n);
        for (int i = 0; i < dk; i++) {
            for (int s = 0; s < n; s++)
                Kt[i * CH + s] = row[s] * Kc[s * j->ldqk + i];
            scale_s[i] = egam[n - 1];
        }
        K->gemm_nn(dk, dv, n, Kt, CH, U, dv, S, dv, scale_s);
    }
}

typedef struct {
    gdn_job job;
    bool chunked;
} gdn_task_arg;

static void gdn_task(void *p, int ith, int nth) {
    gdn_task_arg *a = p;
    long lo, hi;
    ts_split_range(a->job.d->n_v_heads, ith, nth, &lo, &hi);
    for (long h = lo; h < hi; h++) {
        if (a->chunked)
            gdn_chunked_head(&a->job, (int)h);
        else
            gdn_recurrent_head(&a->job, (int)h);
    }
}

void cpu_op_gdn(ts_backend *be, const float *q, const float *k, int64_t ldqk, const float *v,
                int64_t ldv, const float *g, const float *beta, int n, const ts_gdn_dims *dims,
                float *state, float *out, bool chunked) {
    gdn_task_arg a = {
        {q, k, v, g, beta, ldqk, ldv, n, dims, state, out, cpu_seq_pick(cpu_of(be)->isa)}, chunked};
    ts_pool_run(cpu_of(be)->pool, gdn_task, &a);
}

void cpu_op_gated_rmsnorm(ts_backend *be, const float *x, const float *z, int n_tok, int n_heads,
                          int dv, const float *w, float eps, float *out) {
    const cpu_seq_kernels *kern = cpu_seq_pick(cpu_of(be)->isa);
    float gate[CPU_MAX_HEAD_DIM];
    for (long r = 0; r < (long)n_tok * n_heads; r++) {
        const float *xr = x + r * dv, *zr = z + r * dv;
        float *o = out + r * dv;
        double ss = cpu_sum_squares(xr, dv);
        float inv = 1.0f / sqrtf((float)(ss / dv) + eps);
        for (int i0 = 0; i0 < dv; i0 += CPU_MAX_HEAD_DIM) { /* o may be x: elementwise */
            int m = dv - i0 < CPU_MAX_HEAD_DIM ? dv - i0 : CPU_MAX_HEAD_DIM;
            kern->silu(zr + i0, gate, m);
            for (int i = 0; i < m; i++)
                o[i0 + i] = w[i0 + i] * (xr[i0 + i] * inv) * gate[i];
        }
    }
}
