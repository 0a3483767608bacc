/* Gated DeltaNet ops on the CPU: the causal conv, the gates, the delta rule (token-by-token
 * recurrent form and chunked form) and the gated output norm. specs/models.md A.6 and A.7 give
 * the math; both delta-rule forms are tested equal on random data. The recurrent state stays
 * fp32 throughout. */
#include <string.h>

#include "backend/cpu/cpu_int.h"

void cpu_op_conv1d_silu(ts_backend *be, const float *x, int64_t ldx, int n, int C, int K,
                        const float *w, float *state, float *out, int64_t ldo) {
    (void)be;
    int hist = K - 1;
    for (int t = 0; t < n; t++) {
        float *o = out + t * ldo;
        for (int c = 0; c < C; c++) {
            const float *wc = w + (int64_t)c * K;
            float s = 0.0f;
            for (int k = 0; k < K; k++) {
                int tau = t - hist + k; /* input time of tap k */
                float xv = tau < 0 ? state[(int64_t)(hist + tau) * C + c] : x[tau * ldx + c];
                s += wc[k] * xv;
            }
            o[c] = cpu_silu(s);
        }
    }
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
} gdn_job;

/* Token by token, in the reference's order: decay, predict, correct, read. */
static void gdn_recurrent_head(const gdn_job *j, int h) {
    const ts_gdn_dims *d = j->d;
    int dk = d->d_k, dv = d->d_v, Hv = d->n_v_heads;
    int kh = h / (d->n_v_heads / d->n_k_heads);
    float *S = j->state + (int64_t)h * dk * dv;
    float m[CPU_MAX_HEAD_DIM], delta[CPU_MAX_HEAD_DIM];
    for (int t = 0; t < j->n; t++) {
        const float *q = j->q + t * j->ldqk + (int64_t)kh * dk;
        const float *k = j->k + t * j->ldqk + (int64_t)kh * dk;
        const float *v = j->v + t * j->ldv + (int64_t)h * dv;
        float *o = j->out + (int64_t)t * Hv * dv + (int64_t)h * dv;
        float decay = expf(j->g[t * Hv + h]), b = j->beta[t * Hv + h];
        for (int c = 0; c < dv; c++) m[c] = 0.0f;
        for (int i = 0; i < dk; i++) {
            float *Si = S + (int64_t)i * dv;
            float ki = k[i];
            for (int c = 0; c < dv; c++) {
                Si[c] *= decay;
                m[c] += Si[c] * ki;
            }
        }
        for (int c = 0; c < dv; c++) {
            delta[c] = b * (v[c] - m[c]);
            o[c] = 0.0f;
        }
        for (int i = 0; i < dk; i++) {
            float *Si = S + (int64_t)i * dv;
            float ki = k[i], qi = q[i];
            for (int c = 0; c < dv; c++) {
                Si[c] += ki * delta[c];
                o[c] += Si[c] * qi;
            }
        }
    }
}

/* Chunked form (spec A.7) for chunks of up to CPU_GDN_CHUNK tokens: a few dense passes over
 * the state per chunk instead of two per token. */
static void gdn_chunked_head(const gdn_job *j, int h) {
    enum { CH = CPU_GDN_CHUNK };
    const ts_gdn_dims *d = j->d;
    int dk = d->d_k, dv = d->d_v, Hv = d->n_v_heads;
    int kh = h / (d->n_v_heads / d->n_k_heads);
    float *S = j->state + (int64_t)h * dk * dv;
    static _Thread_local float Wk[CH * CPU_MAX_HEAD_DIM], Pq[CH * CPU_MAX_HEAD_DIM],
        U[CH * CPU_MAX_HEAD_DIM];
    float gam[CH], egam[CH], KK[CH][CH], QK[CH][CH];

    for (int c0 = 0; c0 < j->n; c0 += CH) {
        int n = j->n - c0 < CH ? j->n - c0 : CH;
#define QROW(r) (j->q + (int64_t)(c0 + (r)) * j->ldqk + (int64_t)kh * dk)
#define KROW(r) (j->k + (int64_t)(c0 + (r)) * j->ldqk + (int64_t)kh * dk)
#define VROW(r) (j->v + (int64_t)(c0 + (r)) * j->ldv + (int64_t)h * dv)
        float acc = 0.0f;
        for (int r = 0; r < n; r++) {
            acc += j->g[(c0 + r) * Hv + h];
            gam[r] = acc;
            egam[r] = expf(acc);
        }
        /* Wk[r] = S0^T k_r, Pq[r] = S0^T q_r */
        memset(Wk, 0, sizeof(float) * (size_t)n * dv);
        memset(Pq, 0, sizeof(float) * (size_t)n * dv);
        for (int i = 0; i < dk; i++) {
            const float *Si = S + (int64_t)i * dv;
            for (int r = 0; r < n; r++) {
                float ki = KROW(r)[i], qi = QROW(r)[i];
                float *wr = Wk + r * dv, *pr = Pq + r * dv;
                for (int c = 0; c < dv; c++) {
                    wr[c] += ki * Si[c];
                    pr[c] += qi * Si[c];
                }
            }
        }
        /* k_r.k_s and q_r.k_s for s <= r */
        for (int r = 0; r < n; r++)
            for (int s = 0; s <= r; s++) {
                const float *kr = KROW(r), *ks = KROW(s), *qr = QROW(r);
                float kk = 0.0f, qk = 0.0f;
                for (int i = 0; i < dk; i++) {
                    kk += kr[i] * ks[i];
                    qk += qr[i] * ks[i];
                }
                KK[r][s] = kk;
                QK[r][s] = qk;
            }
        /* U_r = b_r v_r - b_r e^{G_r} S0^T k_r - sum_{s<r} b_r (k_r.k_s) e^{G_r-G_s} U_s */
        for (int r = 0; r < n; r++) {
            float b = j->beta[(c0 + r) * Hv + h];
            float *ur = U + r * dv;
            const float *vr = VROW(r), *wr = Wk + r * dv;
            for (int c = 0; c < dv; c++) ur[c] = b * (vr[c] - egam[r] * wr[c]);
            for (int s = 0; s < r; s++) {
                float a = b * KK[r][s] * expf(gam[r] - gam[s]);
                const float *us = U + s * dv;
                for (int c = 0; c < dv; c++) ur[c] -= a * us[c];
            }
        }
        /* o_r = e^{G_r} S0^T q_r + sum_{s<=r} e^{G_r-G_s} (q_r.k_s) U_s */
        for (int r = 0; r < n; r++) {
            float *o = j->out + (int64_t)(c0 + r) * Hv * dv + (int64_t)h * dv;
            const float *pr = Pq + r * dv;
            for (int c = 0; c < dv; c++) o[c] = egam[r] * pr[c];
            for (int s = 0; s <= r; s++) {
                float a = QK[r][s] * expf(gam[r] - gam[s]);
                const float *us = U + s * dv;
                for (int c = 0; c < dv; c++) o[c] += a * us[c];
            }
        }
        /* S = e^{G_n} S0 + sum_s e^{G_n-G_s} k_s (x) U_s */
        float eg_last = egam[n - 1], wgt[CH];
        for (int s = 0; s < n; s++) wgt[s] = expf(gam[n - 1] - gam[s]);
        for (int i = 0; i < dk; i++) {
            float *Si = S + (int64_t)i * dv;
            for (int c = 0; c < dv; c++) Si[c] *= eg_last;
            for (int s = 0; s < n; s++) {
                float a = wgt[s] * KROW(s)[i];
                const float *us = U + s * dv;
                for (int c = 0; c < dv; c++) Si[c] += a * us[c];
            }
        }
#undef QROW
#undef KROW
#undef VROW
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
    gdn_task_arg a = {{q, k, v, g, beta, ldqk, ldv, n, dims, state, out}, chunked};
    ts_pool_run(cpu_of(be)->pool, gdn_task, &a);
}

void cpu_op_gated_rmsnorm(ts_backend *be, const float *x, const float *z, int n_tok,
                          int n_heads, int dv, const float *w, float eps, float *out) {
    (void)be;
    for (long r = 0; r < (long)n_tok * n_heads; r++) {
        const float *xr = x + r * dv, *zr = z + r * dv;
        float *o = out + r * dv;
        double ss = 0;
        for (int i = 0; i < dv; i++) ss += (double)xr[i] * xr[i];
        float inv = 1.0f / sqrtf((float)(ss / dv) + eps);
        for (int i = 0; i < dv; i++) o[i] = w[i] * (xr[i] * inv) * cpu_silu(zr[i]);
    }
}
