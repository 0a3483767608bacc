/* Backend ops against float64 references on random data: the gated delta rule in both its
 * forms (and chunked == recurrent), attention with and without a sliding window, the causal
 * conv with its carried state, and the norms. */
#include <math.h>
#include <string.h>

#include "backend/backend.h"
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

static void test_attention(ts_backend *be, int H, int Hkv, int hd, int n, int pos0, int window) {
    int T = pos0 + n;
    float *q = rnd((long)n * H * hd, 1), *kc = rnd((long)T * Hkv * hd, 1), *vc = rnd((long)T * Hkv * hd, 1);
    float *out = malloc((size_t)n * H * hd * 4);
    ts_attn_dims d = {H, Hkv, hd, 1.0f / sqrtf((float)hd), window, 0};
    be->ops->attention(be, q, (long)H * hd, hd, n, pos0, kc, vc, &d, out, (long)H * hd);
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
                p[j] = s / sqrt((double)hd);
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
    CHECKF(sqrt(err / den) < 1e-5, "attention H %d Hkv %d hd %d n %d pos0 %d window %d: %.3g", H,
           Hkv, hd, n, pos0, window, sqrt(err / den));
    free(q), free(kc), free(vc), free(out), free(p);
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

int main(void) {
    for (int threads = 1; threads <= 2; threads++) {
        ts_backend *be;
        CHECK(ts_backend_cpu_create(threads, -1, &be) == TS_OK);
        test_gdn(be, 2, 2, 16, 16, 1);
        test_gdn(be, 2, 2, 32, 24, 63);
        test_gdn(be, 2, 4, 16, 32, 150); /* Hv > Hk, crosses two chunk boundaries */
        test_gdn(be, 1, 3, 24, 8, 64);
        test_gdn(be, 2, 2, 128, 128, 70); /* the real head size */
        test_attention(be, 4, 2, 32, 1, 0, 0);
        test_attention(be, 4, 2, 32, 17, 30, 0);
        test_attention(be, 8, 1, 64, 40, 0, 16); /* sliding window shorter than the run */
        test_attention(be, 4, 4, 256, 5, 600, 512);
        test_conv(be, 37, 4, 20);
        test_conv(be, 8, 2, 7);
        ts_backend_free(be);
    }
    return tu_report("test_ops");
}
