/* Backend ops against float64 references on random data, at every ISA this CPU has: the gated
 * delta rule in both its forms (and chunked == recurrent), attention (GQA, sliding window,
 * softcap, decode and prefill shapes), the causal conv with its carried state; and the SIMD
 * kernels under the sequence ops against their scalar versions; argmax against its definition.
 * `test_ops --bench` times the sequence ops of a decode step at the Qwen3.5 0.8B shapes instead
 * (not CTest). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/ops_seq.h"
#include "testutil.h"

static unsigned long long seed = 0x1234567ULL;

static float *rnd(long n, float scale) {
    float *v = malloc((size_t)n * sizeof *v);
    for (long i = 0; i < n; i++) v[i] = scale * tu_rng_uniform(&seed);
    return v;
}

/* float64 token-by-token delta rule (spec A.6 step 6) */
static void gdn_ref(const float *q, const float *k, const float *v, const float *g,
                    const float *beta, int n, const ts_gdn_dims *d, double *S, double *out) {
    int dk = d->d_k, dv = d->d_v, Hv = d->n_v_heads, Hk = d->n_k_heads;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < Hv; h++) {
            int kh = h / (Hv / Hk);
            const float *qt = q + (long)t * Hk * dk + kh * dk, *kt = k + (long)t * Hk * dk + kh * dk;
            const float *vt = v + (long)t * Hv * dv + h * dv;
            double *Sh = S + (long)h * dk * dv, dec = exp((double)g[t * Hv + h]);
            for (long i = 0; i < (long)dk * dv; i++) Sh[i] *= dec;
            for (int c = 0; c < dv; c++) {
                double m = 0;
                for (int i = 0; i < dk; i++) m += Sh[(long)i * dv + c] * kt[i];
                double delta = beta[t * Hv + h] * (vt[c] - m);
                for (int i = 0; i < dk; i++) Sh[(long)i * dv + c] += kt[i] * delta;
            }
            for (int c = 0; c < dv; c++) {
                double o = 0;
                for (int i = 0; i < dk; i++) o += Sh[(long)i * dv + c] * qt[i];
                out[(long)t * Hv * dv + h * dv + c] = o;
            }
        }
}

static void normalise_rows(float *x, long rows, int dim, float scale) {
    for (long r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)x[r * dim + i] * x[r * dim + i];
        for (int i = 0; i < dim; i++) x[r * dim + i] = (float)(x[r * dim + i] / sqrt(ss) * scale);
    }
}

static void test_gdn(ts_backend *be, int Hk, int Hv, int dk, int dv, int n) {
    ts_gdn_dims d = {Hk, Hv, dk, dv};
    float *q = rnd((long)n * Hk * dk, 1), *k = rnd((long)n * Hk * dk, 1);
    float *v = rnd((long)n * Hv * dv, 1), *g = rnd((long)n * Hv, 1), *beta = rnd((long)n * Hv, 1);
    normalise_rows(q, (long)n * Hk, dk, 1.0f / sqrtf((float)dk));
    normalise_rows(k, (long)n * Hk, dk, 1.0f);
    for (long i = 0; i < (long)n * Hv; i++) {
        g[i] = -0.3f * (g[i] + 1.0f); /* decay in (0.55, 1] */
        beta[i] = 0.5f * (beta[i] + 1.0f);
    }
    long ns = (long)Hv * dk * dv;
    float *s0 = rnd(ns, 0.5f);
    float *st_rec = malloc(ns * 4), *st_chk = malloc(ns * 4);
    memcpy(st_rec, s0, ns * 4);
    memcpy(st_chk, s0, ns * 4);
    double *S = malloc(ns * sizeof *S), *ref = malloc((size_t)n * Hv * dv * sizeof *ref);
    for (long i = 0; i < ns; i++) S[i] = s0[i];
    gdn_ref(q, k, v, g, beta, n, &d, S, ref);
    float *o_rec = malloc((size_t)n * Hv * dv * 4), *o_chk = malloc((size_t)n * Hv * dv * 4);
    be->ops->gdn(be, q, k, (long)Hk * dk, v, (long)Hv * dv, g, beta, n, &d, st_rec, o_rec, false);
    be->ops->gdn(be, q, k, (long)Hk * dk, v, (long)Hv * dv, g, beta, n, &d, st_chk, o_chk, true);
    double e_rec = 0, e_chk = 0, e_st = 0, e_cr = 0, den = 0, sden = 0;
    for (long i = 0; i < (long)n * Hv * dv; i++) {
        e_rec += (o_rec[i] - ref[i]) * (o_rec[i] - ref[i]);
        e_chk += (o_chk[i] - ref[i]) * (o_chk[i] - ref[i]);
        e_cr += (double)(o_chk[i] - o_rec[i]) * (o_chk[i] - o_rec[i]);
        den += ref[i] * ref[i];
    }
    for (long i = 0; i < ns; i++) {
        e_st += (st_chk[i] - S[i]) * (st_chk[i] - S[i]) + (st_rec[i] - S[i]) * (st_rec[i] - S[i]);
        sden += S[i] * S[i];
    }
    CHECKF(sqrt(e_rec / den) < 1e-5, "gdn recurrent vs f64 (Hk %d Hv %d dk %d dv %d n %d): %.3g",
           Hk, Hv, dk, dv, n, sqrt(e_rec / den));
    CHECKF(sqrt(e_chk / den) < 1e-5, "gdn chunked vs f64 (Hk %d Hv %d dk %d dv %d n %d): %.3g", Hk,
           Hv, dk, dv, n, sqrt(e_chk / den));
    CHECKF(sqrt(e_cr / den) < 1e-5, "gdn chunked vs recurrent: %.3g", sqrt(e_cr / den));
    CHECKF(sqrt(e_st / sden) < 1e-5, "gdn final state: %.3g", sqrt(e_st / sden));
    free(q), free(k), free(v), free(g), free(beta), free(s0), free(st_rec), free(st_chk);
    free(S), free(ref), free(o_rec), free(o_chk);
}

static void test_attention(ts_backend *be, int H, int Hkv, int hd, int n, int pos0, int window,
                           float softcap) {
    int T = pos0 + n;
    float *q = rnd((long)n * H * hd, 1), *kc = rnd((long)T * Hkv * hd, 1), *vc = rnd((long)T * Hkv * hd, 1);
    /* queries spread over the heads with a row stride wider than the heads (as Qwen's gated
     * q projection lays them out): q_head_stride = 2 * hd, ldq = 2 * H * hd */
    float *qw = rnd((long)n * 2 * H * hd, 1);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++)
            memcpy(qw + (long)i * 2 * H * hd + 2L * h * hd, q + (long)i * H * hd + (long)h * hd,
                   (size_t)hd * 4);
    float *out = malloc((size_t)n * H * hd * 4), *out2 = malloc((size_t)n * H * hd * 4);
    /* a larger score scale than 1/sqrt(hd) makes the softmax peaky, so that a wrong max or
     * mask shows */
    float scale = 3.0f / sqrtf((float)hd);
    ts_attn_dims d = {H, Hkv, hd, scale, window, softcap};
    be->ops->attention(be, q, (long)H * hd, hd, n, pos0, kc, vc, &d, out, (long)H * hd);
    be->ops->attention(be, qw, 2L * H * hd, 2L * hd, n, pos0, kc, vc, &d, out2, (long)H * hd);
    double err = 0, den = 0;
    double *p = malloc((size_t)T * sizeof *p);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++) {
            int kvh = h / (H / Hkv), qp = pos0 + i;
            double mx = -1e300, sum = 0;
            for (int j = 0; j <= qp; j++) {
                p[j] = -1e300;
                if (window && j <= qp - window) continue;
                double s = 0;
                for (int c = 0; c < hd; c++)
                    s += (double)q[(long)i * H * hd + h * hd + c] * kc[(long)j * Hkv * hd + kvh * hd + c];
                p[j] = s * scale;
                if (softcap > 0) p[j] = softcap * tanh(p[j] / softcap);
                if (p[j] > mx) mx = p[j];
            }
            for (int j = 0; j <= qp; j++) sum += p[j] > -1e299 ? exp(p[j] - mx) : 0;
            for (int c = 0; c < hd; c++) {
                double o = 0;
                for (int j = 0; j <= qp; j++)
                    if (p[j] > -1e299) o += exp(p[j] - mx) / sum * vc[(long)j * Hkv * hd + kvh * hd + c];
                double gdiff = out[(long)i * H * hd + h * hd + c] - o;
                err += gdiff * gdiff;
                den += o * o;
            }
        }
    CHECKF(sqrt(err / den) < 1e-5,
           "attention %s H %d Hkv %d hd %d n %d pos0 %d window %d softcap %g: %.3g",
           ts_backend_cpu_isa_name(be), H, Hkv, hd, n, pos0, window, softcap, sqrt(err / den));
    CHECKF(memcmp(out, out2, (size_t)n * H * hd * 4) == 0, "attention with strided q differs (%s)",
           ts_backend_cpu_isa_name(be));
    free(q), free(qw), free(kc), free(vc), free(out), free(out2), free(p);
}

/* A run split in two (state carried) equals the run at once; and matches a direct sum. */
static void test_conv(ts_backend *be, int C, int K, int n) {
    float *x = rnd((long)n * C, 1), *w = rnd((long)C * K, 1);
    float *st1 = calloc((size_t)(K - 1) * C, 4), *st2 = calloc((size_t)(K - 1) * C, 4);
    float *o1 = malloc((size_t)n * C * 4), *o2 = malloc((size_t)n * C * 4);
    be->ops->conv1d_silu(be, x, C, n, C, K, w, st1, o1, C);
    int a = n / 3;
    be->ops->conv1d_silu(be, x, C, a, C, K, w, st2, o2, C);
    for (int t = a; t < n; t++) /* the rest one token at a time, like decoding */
        be->ops->conv1d_silu(be, x + (long)t * C, C, 1, C, K, w, st2, o2 + (long)t * C, C);
    double err = 0, err2 = 0;
    for (int t = 0; t < n; t++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                int tau = t - (K - 1) + k;
                if (tau >= 0) s += (double)w[c * K + k] * x[(long)tau * C + c];
            }
            double ref = s / (1 + exp(-s));
            err += fabs(o1[(long)t * C + c] - ref);
            err2 += fabs(o2[(long)t * C + c] - o1[(long)t * C + c]);
        }
    CHECKF(err / ((double)n * C) < 1e-6, "conv vs f64: mean abs %.3g", err / ((double)n * C));
    CHECKF(err2 == 0, "conv split run differs: %.3g", err2);
    CHECK(memcmp(st1, st2, (size_t)(K - 1) * C * 4) == 0);
    free(x), free(w), free(st1), free(st2), free(o1), free(o2);
}

/* out = w * rmsnorm(x) * silu(z), per head row, in place (as the model calls it) */
static void test_gated_rmsnorm(ts_backend *be, int n_tok, int n_heads, int dv) {
    long rows = (long)n_tok * n_heads;
    float *x = rnd(rows * dv, 2), *z = rnd(rows * dv, 6), *w = rnd(dv, 1);
    float *o = malloc((size_t)rows * dv * 4);
    memcpy(o, x, (size_t)rows * dv * 4);
    be->ops->gated_rmsnorm(be, o, z, n_tok, n_heads, dv, w, 1e-6f, o);
    double err = 0, den = 0;
    for (long r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < dv; i++) ss += (double)x[r * dv + i] * x[r * dv + i];
        double inv = 1 / sqrt(ss / dv + 1e-6);
        for (int i = 0; i < dv; i++) {
            double zd = z[r * dv + i], ref = w[i] * x[r * dv + i] * inv * zd / (1 + exp(-zd));
            err += (o[r * dv + i] - ref) * (o[r * dv + i] - ref);
            den += ref * ref;
        }
    }
    CHECKF(sqrt(err / den) < 1e-6, "gated rmsnorm %s n %d heads %d dv %d: %.3g",
           ts_backend_cpu_isa_name(be), n_tok, n_heads, dv, sqrt(err / den));
    free(x), free(z), free(w), free(o);
}

/* The SIMD kernels of the sequence ops against the scalar set, on ragged sizes (register-tile
 * and vector remainders), and their exp against expf. */
static void test_seq_kernels(cpu_isa isa) {
    const cpu_seq_kernels *K = cpu_seq_pick(isa), *R = &cpu_seq_scalar;
    const char *name = cpu_isa_name(isa);
    /* exp: relative error over the whole useful range, exact zeros below it */
    double worst = 0;
    float x[1000];
    for (int b = 0; b < 2000; b++) {
        for (int i = 0; i < 1000; i++) x[i] = -87.3f + 175.3f * (float)(b * 1000 + i) / 2e6f;
        float y[1000];
        double s_ref = 0;
        memcpy(y, x, sizeof x);
        float s = K->exp_sum(y, 1000 - b % 17); /* odd lengths: the padded tail */
        for (int i = 0; i < 1000 - b % 17; i++) {
            double e = exp((double)x[i]), rel = fabs(y[i] - e) / e;
            s_ref += e;
            if (rel > worst) worst = rel;
        }
        if (s_ref < 1e37) /* the float sum of the top of the range overflows */
            CHECKF(fabs(s - s_ref) <= 1e-5 * s_ref, "%s exp_sum %g vs %g", name, s, s_ref);
    }
    /* about 1 ulp (a degree-6 polynomial already reaches 2.3e-7) */
    CHECKF(worst < 1.5e-7, "%s exp: worst relative error %.3g", name, worst);
    float lowx[5] = {-INFINITY, -1e30f, -104.0f, -88.0f, 0.0f};
    CHECKF(K->exp_sum(lowx, 5) == 1.0f && lowx[0] == 0 && lowx[1] == 0 && lowx[2] == 0 &&
               lowx[3] < 1.2e-38f && lowx[4] == 1.0f, /* below FLT_MIN: 0 or a denormal */
           "%s exp below range: %g %g %g %g %g", name, lowx[0], lowx[1], lowx[2], lowx[3], lowx[4]);
    if (isa != CPU_ISA_SCALAR) printf("%s exp worst relative error %.3g\n", name, worst);

    /* silu, in place and not, with a tail */
    worst = 0;
    for (int b = 0; b < 200; b++) {
        float y[1000];
        for (int i = 0; i < 1000; i++) x[i] = -100.0f + 200.0f * (float)(b * 1000 + i) / 2e5f;
        memcpy(y, x, sizeof x);
        int n = 1000 - b % 13;
        K->silu(b % 2 ? y : x, y, n);
        for (int i = 0; i < n; i++) {
            double xd = x[i], ref = xd / (1 + exp(-xd)), e = fabs(y[i] - ref);
            if (fabs(ref) > 1e-30) e /= fabs(ref); /* the far negative end: absolute */
            if (e > worst) worst = e;
        }
    }
    CHECKF(worst < 3e-7, "%s silu: worst relative error %.3g", name, worst);

    /* silu_fine against the scalar expf form, bit for bit but for rare last bits of e^-x (a
     * full sweep of the 2^32 floats: 1.7e-5 of them differ, by at most 4 ulp of the result;
     * of these 4 million values from -110 to 110, 2e-4, and 3e-3 with the polynomial cut to
     * degree 7), in place and not, with tails, and the special values */
    long differ = 0, total = 0;
    int far = 0;
    for (int b = 0; b < 4000; b++) {
        float y[1000], r[1000];
        for (int i = 0; i < 1000; i++)
            x[i] = -110.0f + 220.0f * (float)(b * 1000 + i) / 4e6f;
        memcpy(y, x, sizeof x);
        int n = 1000 - b % 11;
        R->silu_fine(x, r, n);
        K->silu_fine(b % 2 ? y : x, y, n);
        for (int i = 0; i < n; i++, total++) {
            int32_t a, c;
            memcpy(&a, &y[i], 4), memcpy(&c, &r[i], 4);
            differ += a != c;
            far += a - c > 4 || c - a > 4;
        }
    }
    CHECKF(far == 0 && differ * 2000 < total,
           "%s silu_fine: %ld of %ld differ from expf's, %d by more than 4 ulp", name, differ,
           total, far);
    /* the special values as the scalar form gives them (-inf: NaN, as -inf / inf) */
    float sx[8] = {0.0f, -0.0f, INFINITY, -INFINITY, 1e-40f, -200.0f, 200.0f, NAN}, sy[8], sr[8];
    K->silu_fine(sx, sy, 8);
    R->silu_fine(sx, sr, 8);
    for (int i = 0; i < 8; i++)
        CHECKF((isnan(sy[i]) && isnan(sr[i])) || memcmp(&sy[i], &sr[i], 4) == 0,
               "%s silu_fine(%g) = %g, the scalar form %g", name, sx[i], sy[i], sr[i]);

    /* gemm_nn (with and without row scales) and gemm_nt on sizes around the tiles */
    static const int sz[][3] = {{1, 1, 1}, {3, 17, 5}, {4, 64, 64}, {7, 33, 9}, {16, 128, 64},
                                {9, 256, 0}, {5, 70, 31}, {64, 130, 200}};
    for (size_t t = 0; t < sizeof sz / sizeof sz[0]; t++) {
        int M = sz[t][0], N = sz[t][1], Kd = sz[t][2];
        int lda = Kd + 3, ldb = N + 5, ldc = N + 2, ldbt = Kd + 1;
        float *A = rnd((long)M * lda, 1), *B = rnd((long)(Kd + 1) * ldb, 1), *cs = rnd(M, 1);
        float *Bt = rnd((long)N * ldbt, 1), *C0 = rnd((long)M * ldc, 1);
        float *C1 = malloc((size_t)M * ldc * 4), *C2 = malloc((size_t)M * ldc * 4);
        for (int pass = 0; pass < 3; pass++) {
            memcpy(C1, C0, (size_t)M * ldc * 4);
            memcpy(C2, C0, (size_t)M * ldc * 4);
            if (pass < 2) {
                R->gemm_nn(M, N, Kd, A, lda, B, ldb, C1, ldc, pass ? cs : NULL);
                K->gemm_nn(M, N, Kd, A, lda, B, ldb, C2, ldc, pass ? cs : NULL);
            } else {
                R->gemm_nt(M, N, Kd, A, lda, Bt, ldbt, C1, ldc);
                K->gemm_nt(M, N, Kd, A, lda, Bt, ldbt, C2, ldc);
            }
            double e = 0;
            for (int r = 0; r < M; r++)
                for (int j = 0; j < ldc; j++) {
                    float a = C1[r * ldc + j], b = C2[r * ldc + j];
                    /* outside [0, N) the padding must be untouched */
                    e = fmax(e, j < N ? fabs(a - b) / (1.0 + sqrt((double)Kd)) : (a != b) * 1.0);
                }
            CHECKF(e < 1e-5, "%s gemm %s M %d N %d K %d: %.3g", name,
                   pass == 2 ? "nt" : pass ? "nn+scale" : "nn", M, N, Kd, e);
        }
        free(A), free(B), free(cs), free(Bt), free(C0), free(C1), free(C2);
    }

    /* the one-token delta rule */
    static const int gd[][2] = {{16, 16}, {128, 128}, {24, 40}, {8, 72}};
    for (size_t t = 0; t < sizeof gd / sizeof gd[0]; t++) {
        int dk = gd[t][0], dv = gd[t][1];
        float *S1 = rnd((long)dk * dv, 1), *S2 = malloc((size_t)dk * dv * 4);
        float *q = rnd(dk, 0.3f), *k = rnd(dk, 0.3f), *v = rnd(dv, 1);
        float o1[128], o2[128];
        memcpy(S2, S1, (size_t)dk * dv * 4);
        R->gdn_step(S1, dk, dv, q, k, v, 0.9f, 0.7f, o1);
        K->gdn_step(S2, dk, dv, q, k, v, 0.9f, 0.7f, o2);
        double e = 0;
        for (int c = 0; c < dv; c++) e = fmax(e, fabs(o1[c] - o2[c]));
        for (long i = 0; i < (long)dk * dv; i++) e = fmax(e, fabs(S1[i] - S2[i]));
        CHECKF(e < 1e-5, "%s gdn_step dk %d dv %d: %.3g", name, dk, dv, e);
        free(S1), free(S2), free(q), free(k), free(v);
    }
}

/* gelu_mul (tanh GELU of gate, times up) against double precision, in place as Gemma calls it,
 * with gate values far into both tails and rows longer than a chunk. */
static void test_gelu_mul(ts_backend *be, int n_tok, int dim) {
    int64_t ld = dim + 3;
    size_t n = (size_t)n_tok * ld;
    float *g = malloc(n * sizeof *g), *u = malloc(n * sizeof *u);
    double *ref = malloc(n * sizeof *ref);
    unsigned long long rng = 99;
    for (size_t i = 0; i < n; i++) {
        g[i] = tu_rng_uniform(&rng) * (i % 7 == 0 ? 40.0f : 4.0f);
        u[i] = tu_rng_uniform(&rng);
    }
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < dim; i++) {
            double x = g[t * ld + i];
            double th = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
            ref[t * ld + i] = 0.5 * x * (1.0 + th) * u[t * ld + i];
        }
    be->ops->gelu_mul(be, g, u, ld, n_tok, dim, g, ld);
    double worst = 0;
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < dim; i++) {
            double r = ref[t * ld + i], d = fabs(g[t * ld + i] - r);
            double rel = d / (fabs(r) + 1e-6);
            if (rel > worst) worst = rel;
        }
    CHECKF(worst <= 2e-6, "gelu_mul %dx%d: worst relative error %.3g", n_tok, dim, worst);
    free(g), free(u), free(ref);
}

/* swiglu (SiLU of gate, times up) against double precision, tails to |x| = 90. */
static void test_swiglu(ts_backend *be, int n_tok, int dim) {
    int64_t ld = dim + 5;
    size_t n = (size_t)n_tok * ld;
    float *g = malloc(n * sizeof *g), *u = malloc(n * sizeof *u), *o = malloc(n * sizeof *o);
    unsigned long long rng = 7;
    for (size_t i = 0; i < n; i++) {
        g[i] = tu_rng_uniform(&rng) * (i % 5 == 0 ? 90.0f : 6.0f);
        u[i] = tu_rng_uniform(&rng);
    }
    be->ops->swiglu(be, g, u, ld, n_tok, dim, o, ld);
    double worst = 0;
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < dim; i++) {
            double x = g[t * ld + i], r = x / (1.0 + exp(-x)) * u[t * ld + i];
            double rel = fabs(o[t * ld + i] - r) / (fabs(r) + 1e-6);
            if (rel > worst) worst = rel;
        }
    CHECKF(worst <= 2e-6, "swiglu %dx%d: worst relative error %.3g", n_tok, dim, worst);
    free(g), free(u), free(o);
}

/* argmax: the first index of the largest value, NaN never chosen, a row of NaN alone 0 -
 * against the one-comparison-at-a-time definition, on rows of 1..70 values drawn from few
 * values (ties), NaN, +-infinity and +-0, and a 262144-value row whose maximum sits near its
 * end. */
static int argmax_ref(const float *v, int n) {
    int best = 0;
    for (int j = 1; j < n; j++)
        if (v[j] > v[best] || (v[best] != v[best] && v[j] == v[j])) best = j;
    return best;
}

static void test_argmax(ts_backend *be) {
    const float sp[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f, -1.0f};
    int bad = 0;
    for (int it = 0; it < 20000; it++) {
        int n = 1 + (int)(tu_rng_next(&seed) % 70);
        float v[70];
        for (int j = 0; j < n; j++) {
            uint64_t r = tu_rng_next(&seed);
            v[j] = r % 10 < 3 ? sp[(r >> 8) % 8] : (float)((int)((r >> 16) % 5) - 2);
        }
        int32_t got = -1;
        be->ops->argmax(be, v, n, 1, n, &got);
        if (got != argmax_ref(v, n) && bad++ < 3)
            fprintf(stderr, "argmax of %d values: %d, not %d\n", n, got, argmax_ref(v, n));
    }
    CHECKF(bad == 0, "argmax: %d rows wrong", bad);
    enum { V = 262144 };
    float *x = rnd(2L * V, 1.0f);
    x[V - 100] = 2.0f, x[V + 7] = 3.0f, x[V + V - 3] = 3.0f; /* row 1: a tie, the first wins */
    int32_t got[2];
    be->ops->argmax(be, x, V, 2, V, got);
    CHECKF(got[0] == V - 100 && got[1] == 7, "argmax of two long rows: %d %d", got[0], got[1]);
    free(x);
}

/* ---- --bench: a decode step's sequence ops, 0.8B shapes, 1 and 2 threads ---------------- */

static int bench(void) {
    enum { C = 6144, K = 4, HK = 16, HV = 16, DK = 128, DV = 128, REPS = 2000 };
    ts_gdn_dims d = {HK, HV, DK, DV};
    float *x = rnd(C, 1), *w = rnd((long)C * K, 1), *st = calloc((size_t)(K - 1) * C, 4);
    float *o = malloc(C * 4), *g = rnd(HV, 0.1f), *beta = rnd(HV, 0.5f);
    float *S = rnd((long)HV * DK * DV, 0.1f), *go = malloc(HV * DV * 4);
    for (int threads = 1; threads <= 2; threads++) {
        ts_backend *be;
        if (ts_backend_cpu_create(threads, -1, &be) != TS_OK) return 1;
        for (int round = 0; round < 2; round++) {
            double t0 = ts_now_s();
            for (int r = 0; r < REPS; r++) be->ops->conv1d_silu(be, x, C, 1, C, K, w, st, o, C);
            double t1 = ts_now_s();
            for (int r = 0; r < REPS / 4; r++)
                be->ops->gdn(be, x, x + HK * DK, 2L * HK * DK, x + 2 * HK * DK, HV * DV, g, beta,
                             1, &d, S, go, false);
            double t2 = ts_now_s();
            printf("%s, %d thread%s: conv1d_silu 1 x %d x %d taps %.2f us, delta rule step "
                   "%d heads of %dx%d %.2f us\n", ts_backend_cpu_isa_name(be), threads,
                   threads > 1 ? "s" : "", C, K, (t1 - t0) / REPS * 1e6, HV, DK, DV,
                   (t2 - t1) / (REPS / 4) * 1e6);
        }
        ts_backend_free(be);
    }
    free(x), free(w), free(st), free(o), free(g), free(beta), free(S), free(go);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench();
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        if (!cpu_isa_supported((cpu_isa)isa)) {
            printf("skip %s (not supported by this CPU)\n", cpu_isa_name((cpu_isa)isa));
            continue;
        }
        test_seq_kernels((cpu_isa)isa);
        for (int threads = 1; threads <= 2; threads++) {
            ts_backend *be;
            CHECK(ts_backend_cpu_create(threads, isa, &be) == TS_OK);
            test_gdn(be, 2, 2, 16, 16, 1);
            test_gdn(be, 2, 2, 32, 24, 63);
            test_gdn(be, 2, 4, 16, 32, 150); /* Hv > Hk, crosses two chunk boundaries */
            test_gdn(be, 1, 3, 24, 8, 64);
            test_gdn(be, 2, 2, 128, 128, 70); /* the real head size */
            test_gdn(be, 2, 2, 128, 128, 1);  /* decode */
            test_attention(be, 4, 2, 32, 1, 0, 0, 0);
            test_attention(be, 4, 2, 32, 17, 30, 0, 0);
            test_attention(be, 8, 1, 64, 40, 0, 16, 0); /* sliding window shorter than the run */
            test_attention(be, 4, 4, 256, 5, 600, 512, 0);
            test_attention(be, 4, 1, 256, 1, 700, 0, 0);   /* decode, Gemma 3 270M shape */
            test_attention(be, 8, 2, 256, 150, 0, 0, 0);   /* prefill, Qwen3.5 shape */
            test_attention(be, 8, 2, 256, 70, 90, 0, 0);   /* a second prefill chunk */
            test_attention(be, 4, 1, 128, 200, 0, 100, 0); /* window inside the run */
            test_attention(be, 6, 3, 64, 33, 7, 0, 50.0f); /* softcap */
            test_attention(be, 2, 2, 64, 1, 130, 0, 5.0f); /* softcap, decode */
            test_attention(be, 4, 2, 24, 45, 3, 20, 0);    /* head size below a vector */
            test_attention(be, 2, 1, 512, 20, 70, 0, 0);   /* the largest head size */
            test_attention(be, 16, 1, 32, 90, 0, 0, 0);    /* a wide group, small heads */
            test_conv(be, 37, 4, 20);
            test_conv(be, 8, 2, 7);
            test_conv(be, 300, 4, 70); /* several channel blocks, over the threads */
            test_conv(be, 2100, 4, 5); /* decode steps wide enough to go over the threads */
            test_gated_rmsnorm(be, 5, 3, 128);
            test_gated_rmsnorm(be, 2, 2, 40);
            test_gelu_mul(be, 1, 640);
            test_swiglu(be, 1, 3584);
            test_swiglu(be, 7, 1000 + 3);
            test_gelu_mul(be, 9, 2048 + 37);
            if (threads == 1) test_argmax(be);
            ts_backend_free(be);
        }
    }
    return tu_report("test_ops");
}
