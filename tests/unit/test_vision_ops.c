/* The backend ops of an image encoder (backend.h: attention_full, rope_cs, layernorm, bias_act)
 * against float64 references on random data, at every ISA this CPU has and on one and two
 * threads; and rope_cs with a plain position's angles against the rope op, bit for bit (MRoPE
 * of text-only tokens must be the rotation the decoder always did). */
#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static unsigned long long seed = 0x5eed1234ULL;

static float *rnd(long n, float scale) {
    float *v = malloc((size_t)n * sizeof *v);
    for (long i = 0; i < n; i++)
        v[i] = scale * tu_rng_uniform(&seed);
    return v;
}

/* q, k, v interleaved per token as a vision block's qkv rows: [n][3][H * hd] */
static void test_attention_full(ts_backend *be, int H, int hd, int n) {
    int W = H * hd;
    float *qkv = rnd((long)n * 3 * W, 1.5f), *out = calloc((size_t)n * W, 4);
    ts_attn_dims d = {H, H, hd, 1.0f / sqrtf((float)hd), 0, 0};
    be->ops->attention_full(be, qkv, 3 * W, qkv + W, qkv + 2 * W, 3 * W, n, &d, out, W);
    double err = 0, den = 0;
    double *s = malloc((size_t)n * sizeof *s);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < n; i++) {
            const float *q = qkv + (long)i * 3 * W + h * hd;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < n; j++) {
                const float *k = qkv + (long)j * 3 * W + W + h * hd;
                double dot = 0;
                for (int c = 0; c < hd; c++)
                    dot += (double)q[c] * k[c];
                s[j] = dot * d.scale;
                mx = s[j] > mx ? s[j] : mx;
            }
            for (int j = 0; j < n; j++)
                sum += s[j] = exp(s[j] - mx);
            for (int c = 0; c < hd; c++) {
                double o = 0;
                for (int j = 0; j < n; j++)
                    o += s[j] * qkv[(long)j * 3 * W + 2 * W + h * hd + c];
                o /= sum;
                double e = out[(long)i * W + h * hd + c] - o;
                err += e * e, den += o * o;
            }
        }
    CHECKF(sqrt(err / den) < 1e-5, "attention_full H %d hd %d n %d: %.3g", H, hd, n,
           sqrt(err / den));
    free(s), free(qkv), free(out);
}

static void test_rope_cs(ts_backend *be, int n, int H, int hd, int rot) {
    int half = rot / 2;
    long W = (long)H * hd;
    float *x = rnd(n * W, 1), *y = malloc((size_t)(n * W) * 4), *cs = malloc((size_t)n * rot * 4);
    int32_t *pos = malloc((size_t)n * 4);
    memcpy(y, x, (size_t)(n * W) * 4);
    float theta = 1e7f;
    for (int t = 0; t < n; t++) {
        pos[t] = 3 * t + 11;
        for (int j = 0; j < half; j++) {
            float inv = (float)(1.0 / pow((double)theta, (double)(2 * j) / rot));
            float a = (float)pos[t] * inv;
            cs[t * rot + j] = cosf(a);
            cs[t * rot + half + j] = sinf(a);
        }
    }
    be->ops->rope(be, x, W, n, H, hd, rot, pos, theta);
    be->ops->rope_cs(be, y, W, n, H, hd, half, cs);
    CHECKF(memcmp(x, y, (size_t)(n * W) * 4) == 0,
           "rope_cs with the rope op's angles differs "
           "(n %d H %d hd %d rot %d)",
           n, H, hd, rot);
    free(x), free(y), free(cs), free(pos);
}

static void test_layernorm(ts_backend *be, int rows, int dim) {
    float *x = rnd((long)rows * dim, 3), *w = rnd(dim, 1), *b = rnd(dim, 1);
    for (long i = 0; i < (long)rows * dim; i++)
        x[i] += 2.0f; /* a mean away from zero */
    float *out = malloc((size_t)rows * dim * 4);
    be->ops->layernorm(be, x, dim, rows, dim, w, b, 1e-6f, out, dim);
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < dim; i++)
            m += x[(long)r * dim + i];
        m /= dim;
        for (int i = 0; i < dim; i++)
            v += pow(x[(long)r * dim + i] - m, 2);
        v /= dim;
        for (int i = 0; i < dim; i++) {
            double ref = (x[(long)r * dim + i] - m) / sqrt(v + 1e-6) * w[i] + b[i];
            double e = fabs(out[(long)r * dim + i] - ref);
            worst = e > worst ? e : worst;
        }
    }
    CHECKF(worst < 2e-5, "layernorm %dx%d: worst abs error %.3g", rows, dim, worst);
    /* in place */
    be->ops->layernorm(be, x, dim, rows, dim, w, b, 1e-6f, x, dim);
    CHECK(memcmp(x, out, (size_t)rows * dim * 4) == 0);
    free(x), free(w), free(b), free(out);
}

static void test_bias_act(ts_backend *be, int rows, int dim, int act) {
    float *x = rnd((long)rows * dim, 6), *bias = rnd(dim, 1);
    float *y = malloc((size_t)rows * dim * 4);
    memcpy(y, x, (size_t)rows * dim * 4);
    be->ops->bias_act(be, y, dim, rows, dim, bias, act);
    double worst = 0;
    for (long i = 0; i < (long)rows * dim; i++) {
        double v = (double)x[i] + bias[i % dim], ref = v;
        if (act == TS_ACT_GELU_TANH)
            ref = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        else if (act == TS_ACT_GELU_ERF)
            ref = 0.5 * v * (1 + erf(v / sqrt(2.0)));
        double e = fabs(y[i] - ref) / (fabs(ref) > 1 ? fabs(ref) : 1);
        worst = e > worst ? e : worst;
    }
    CHECKF(worst < 2e-6, "bias_act %d (%dx%d): worst relative error %.3g", act, rows, dim, worst);
    free(x), free(bias), free(y);
}

int main(void) {
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        if (!cpu_isa_supported((cpu_isa)isa)) continue;
        for (int threads = 1; threads <= 2; threads++) {
            ts_backend *be;
            CHECK(ts_backend_cpu_create(threads, isa, &be) == TS_OK);
            test_attention_full(be, 2, 16, 1);
            test_attention_full(be, 3, 64, 37);
            test_attention_full(be, 2, 64, 150);  /* more keys than a block, over the threads */
            test_attention_full(be, 12, 64, 260); /* the 0.8B tower's heads */
            test_rope_cs(be, 5, 4, 32, 16);
            test_rope_cs(be, 40, 2, 256, 64); /* Qwen3.5's partial rotary */
            test_layernorm(be, 7, 32);
            test_layernorm(be, 33, 768);
            for (int act = TS_ACT_NONE; act <= TS_ACT_GELU_ERF; act++) {
                test_bias_act(be, 3, 40, act);
                test_bias_act(be, 20, 3072 + 5, act);
            }
            ts_backend_free(be);
        }
    }
    return tu_report("test_vision_ops");
}
