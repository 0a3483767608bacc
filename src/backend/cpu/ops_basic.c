/* Row-wise and elementwise CPU ops: norms, RoPE, activations, copies, embedding lookup.
 * They are cheap next to the matmuls and stay plain loops the compiler vectorises; in prefill
 * their rows (or tokens) split over the pool (cpu_run_rows), which a profile showed to matter
 * for the norms, RoPE and the activations. */
#include <string.h>

#include "backend/cpu/cpu_int.h"
#include "backend/cpu/ops_seq.h"
#include "base/argmax.h"

typedef struct {
    const ts_tensor *W;
    const int32_t *ids;
    int n;
    float scale;
    float *out;
} get_rows_job;

static void get_rows_task(void *p, int ith, int nth) {
    get_rows_job *j = p;
    long lo, hi;
    ts_split_range(j->n, ith, nth, &lo, &hi);
    int64_t cols = ts_tensor_cols(j->W);
    for (long i = lo; i < hi; i++) {
        float *o = j->out + i * cols;
        cpu_dequant_row(j->W, j->ids[i], o);
        if (j->scale != 1.0f)
            for (int64_t c = 0; c < cols; c++) o[c] *= j->scale;
    }
}

void cpu_op_get_rows(ts_backend *be, const ts_tensor *W, const int32_t *ids, int n, float scale,
                     float *out) {
    get_rows_job j = {W, ids, n, scale, out};
    cpu_run_rows(be, get_rows_task, &j, n, 9);
}

void cpu_op_matmul(ts_backend *be, const ts_tensor *W, const float *x, int64_t ldx, int n,
                   float *y, int64_t ldy) {
    cpu_ctx *c = cpu_of(be);
    cpu_matmul(c->pool, c->wc, c->isa, W, x, ldx, n, y, ldy);
}

/* The norms' rows, split over the pool when there are enough of them (prefill). */
typedef struct {
    const float *x;
    int64_t ldx;
    int n_rows, dim;
    const float *w; /* NULL: l2norm (scale, in place) */
    float eps, scale;
    float *out;
    int64_t ldo;
} norm_job;

static void norm_task(void *p, int ith, int nth) {
    const norm_job *j = p;
    long lo, hi;
    ts_split_range(j->n_rows, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        const float *xr = j->x + r * j->ldx;
        float *o = j->out + r * j->ldo;
        double ss = cpu_sum_squares(xr, j->dim);
        if (j->w) {
            float inv = 1.0f / sqrtf((float)(ss / j->dim) + j->eps);
            for (int i = 0; i < j->dim; i++) o[i] = (xr[i] * inv) * j->w[i];
        } else {
            float inv = 1.0f / sqrtf((float)ss + j->eps);
            for (int i = 0; i < j->dim; i++) o[i] = (xr[i] * inv) * j->scale;
        }
    }
}

/* The rows from which a norm wakes the pool: at least 16, and 16K values - a decode step's
 * per-head norms (16 heads of 128) took ~1 us of work and ~4 us of the pool's hand-over. */
static long norm_min_rows(int dim) {
    long m = dim > 0 ? 16384 / dim : 16;
    return m > 16 ? m : 16;
}

void cpu_op_rmsnorm(ts_backend *be, const float *x, int64_t ldx, int n_rows, int dim,
                    const float *w, float eps, float *out, int64_t ldo) {
    norm_job j = {x, ldx, n_rows, dim, w, eps, 1.0f, out, ldo};
    cpu_run_rows(be, norm_task, &j, n_rows, norm_min_rows(dim));
}

void cpu_op_l2norm(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim, float eps,
                   float scale) {
    norm_job j = {x, ldx, n_rows, dim, NULL, eps, scale, x, ldx};
    cpu_run_rows(be, norm_task, &j, n_rows, norm_min_rows(dim));
}

typedef struct {
    float *x;
    int64_t ldx, head_stride;
    int n_tok, n_heads, half;
    const int32_t *pos;
    const float *inv_freq;
} rope_job;

static void rope_task(void *p, int ith, int nth) {
    const rope_job *j = p;
    long lo, hi;
    ts_split_range(j->n_tok, ith, nth, &lo, &hi);
    float cs[CPU_MAX_HEAD_DIM / 2], sn[CPU_MAX_HEAD_DIM / 2];
    for (long t = lo; t < hi; t++) {
        /* the angles as the reference computes them: fp32 inv_freq times an fp32 position */
        for (int k = 0; k < j->half; k++) {
            float a = (float)j->pos[t] * j->inv_freq[k];
            cs[k] = cosf(a);
            sn[k] = sinf(a);
        }
        for (int h = 0; h < j->n_heads; h++) {
            float *v = j->x + t * j->ldx + h * j->head_stride;
            for (int k = 0; k < j->half; k++) {
                float x0 = v[k], x1 = v[k + j->half];
                v[k] = x0 * cs[k] - x1 * sn[k];
                v[k + j->half] = x1 * cs[k] + x0 * sn[k];
            }
        }
    }
}

/* inv_freq once per call (it was a pow per token and pair), the tokens over the pool in
 * prefill (their sines and cosines were ~4% of a Gemma 3 prefill on one thread). */
void cpu_op_rope(ts_backend *be, float *x, int64_t ldx, int n_tok, int n_heads,
                 int64_t head_stride, int rot_dim, const int32_t *pos, float theta) {
    int half = rot_dim / 2;
    float inv_freq[CPU_MAX_HEAD_DIM / 2];
    for (int k = 0; k < half; k++)
        inv_freq[k] = (float)(1.0 / pow((double)theta, (double)(2 * k) / rot_dim));
    rope_job j = {x, ldx, head_stride, n_tok, n_heads, half, pos, inv_freq};
    cpu_run_rows(be, rope_task, &j, n_tok, 16);
}

void cpu_op_add(ts_backend *be, float *dst, const float *src, int64_t n) {
    (void)be;
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

/* The gated activations out = act(gate) * up through the ISA's vector exp (ops_seq.h), rows
 * split over the thread pool: one expf / tanhf per element on one thread was a seventh of
 * Qwen3.5 prefill (SiLU) and a third of Gemma 3's (GELU). The vector kernels take a row's tail
 * through a padded vector, so an element's rounding never depends on where a span starts or
 * ends: the fused matmul_glu, which applies them to each thread's columns, gives the bits of
 * the op over whole rows. */
typedef struct {
    const float *gate, *up;
    int64_t ldg;
    int n_tok, dim;
    float *out;
    int64_t ldo;
    const cpu_seq_kernels *k;
    bool gelu;
} glu_job;

/* GELU with the tanh approximation (PyTorch's approximate="tanh"):
 * 0.5 x (1 + tanh(u)) = x * e / (1 + e) with e = exp(2u), u = sqrt(2/pi) (x + 0.044715 x^3);
 * 2u is clamped to [-80, 80], where the factor is 0 or 1 in fp32 anyway. */
#define GELU_CHUNK 256

void cpu_gelu_tanh_mul(const cpu_seq_kernels *k, const float *g, const float *u, float *o,
                       int64_t n) {
    float e[GELU_CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += GELU_CHUNK) {
        int m = n - i0 < GELU_CHUNK ? (int)(n - i0) : GELU_CHUNK;
        for (int i = 0; i < m; i++) {
            float x = g[i0 + i];
            float a = 2.0f * 0.7978845608028654f * (x + 0.044715f * x * x * x);
            e[i] = a > 80.0f ? 80.0f : a < -80.0f ? -80.0f : a;
        }
        k->exp_sum(e, m);
        for (int i = 0; i < m; i++)
            o[i0 + i] = g[i0 + i] * (e[i] / (1.0f + e[i])) * (u ? u[i0 + i] : 1.0f);
    }
}

/* o[i] = act(g[i]) * u[i] for i in [0, n); o may be g. */
static void glu_span(const cpu_seq_kernels *k, bool gelu, const float *g, const float *u, float *o,
                     int64_t n) {
    if (gelu) {
        cpu_gelu_tanh_mul(k, g, u, o, n);
        return;
    }
    k->silu(g, o, (int)n);
    for (int64_t i = 0; i < n; i++)
        o[i] *= u[i];
}

/* columns [c0, c1) of every token's row (a glu_job; matmul_glu's pair) */
static void glu_cols(void *p, int64_t c0, int64_t c1) {
    const glu_job *j = p;
    for (int t = 0; t < j->n_tok; t++)
        glu_span(j->k, j->gelu, j->gate + t * j->ldg + c0, j->up + t * j->ldg + c0,
                 j->out + t * j->ldo + c0, c1 - c0);
}

static void glu_task(void *p, int ith, int nth) {
    const glu_job *j = p;
    long lo, hi;
    ts_split_range(j->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        glu_span(j->k, j->gelu, j->gate + t * j->ldg, j->up + t * j->ldg, j->out + t * j->ldo,
                 j->dim);
}

static void glu_run(ts_backend *be, const float *gate, const float *up, int64_t ldg, int n_tok,
                    int dim, float *out, int64_t ldo, bool gelu) {
    glu_job j = {gate, up, ldg, n_tok, dim, out, ldo, cpu_seq_pick(cpu_of(be)->isa), gelu};
    cpu_run_rows(be, glu_task, &j, n_tok, 2); /* decode: not worth waking the pool */
}

void cpu_op_swiglu(ts_backend *be, const float *gate, const float *up, int64_t ldg, int n_tok,
                   int dim, float *out, int64_t ldo) {
    glu_run(be, gate, up, ldg, n_tok, dim, out, ldo, false);
}

void cpu_op_gelu_mul(ts_backend *be, const float *gate, const float *up, int64_t ldg, int n_tok,
                     int dim, float *out, int64_t ldo) {
    glu_run(be, gate, up, ldg, n_tok, dim, out, ldo, true);
}

/* The normed rows where the matmuls read them: the norm op into pre->scratch (the CPU kernels
 * quantize or widen x anyway, so folding the norm into them would save one pass over a row). */
static const float *prenormed(ts_backend *be, const float *x, int64_t ldx, int n,
                              const ts_prenorm *pre, int64_t cols) {
    if (!pre) return x;
    cpu_op_rmsnorm(be, x, ldx, n, (int)cols, pre->w, pre->eps, pre->scratch, ldx);
    return pre->scratch;
}

void cpu_op_matmul_n(ts_backend *be, const ts_tensor *const *W, int nw, const float *x, int64_t ldx,
                     int n, const ts_prenorm *pre, float *const *y, const int64_t *ldy) {
    cpu_ctx *c = cpu_of(be);
    x = prenormed(be, x, ldx, n, pre, ts_tensor_cols(W[0]));
    for (int j0 = 0; j0 < nw; j0 += CPU_MATMUL_MAX_N) {
        int m = nw - j0 < CPU_MATMUL_MAX_N ? nw - j0 : CPU_MATMUL_MAX_N;
        cpu_matmul_n(c->pool, c->wc, c->isa, W + j0, m, x, ldx, n, y + j0, ldy + j0, NULL);
    }
}

void cpu_op_matmul_glu(ts_backend *be, const ts_tensor *Wg, const ts_tensor *Wu, const float *x,
                       int64_t ldx, int n, const ts_prenorm *pre, bool gelu, float *tg, float *tu,
                       int64_t ldt, float *out, int64_t ldo) {
    cpu_ctx *c = cpu_of(be);
    int64_t dim = ts_tensor_rows(Wg);
    x = prenormed(be, x, ldx, n, pre, ts_tensor_cols(Wg));
    const ts_tensor *W[2] = {Wg, Wu};
    float *y[2] = {tg, tu};
    int64_t ldy[2] = {ldt, ldt};
    if (ts_tensor_rows(Wu) != dim) { /* not a gated pair: the products, then the activation */
        cpu_matmul_n(c->pool, c->wc, c->isa, W, 2, x, ldx, n, y, ldy, NULL);
        glu_run(be, tg, tu, ldt, n, (int)dim, out, ldo, gelu);
        return;
    }
    glu_job j = {tg, tu, ldt, n, (int)dim, out, ldo, cpu_seq_pick(c->isa), gelu};
    cpu_mm_pair pair = {glu_cols, &j};
    cpu_matmul_n(c->pool, c->wc, c->isa, W, 2, x, ldx, n, y, ldy, &pair);
}

void cpu_op_scale_rows(ts_backend *be, float *x, int64_t ldx, int n_rows, int dim, const float *s) {
    (void)be;
    for (int r = 0; r < n_rows; r++)
        for (int i = 0; i < dim; i++)
            x[r * ldx + i] *= s[r];
}

void cpu_op_softcap(ts_backend *be, float *x, int64_t n, float cap) {
    (void)be;
    for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

void cpu_op_sigmoid_gate(ts_backend *be, float *x, int64_t ldx, const float *g, int64_t ldg,
                         int n_tok, int n_heads, int head_dim, int64_t gstride) {
    (void)be;
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_heads; h++) {
            float *xv = x + t * ldx + (int64_t)h * head_dim;
            const float *gv = g + t * ldg + h * gstride;
            for (int d = 0; d < head_dim; d++) xv[d] *= cpu_sigmoid(gv[d]);
        }
}

void cpu_op_copy_rows(ts_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds,
                      int n, int dim) {
    (void)be;
    for (int r = 0; r < n; r++) memmove(dst + r * ldd, src + r * lds, (size_t)dim * sizeof(float));
}

void cpu_op_argmax(ts_backend *be, const float *x, int64_t ldx, int n_rows, int n_cols,
                   int32_t *out_host) {
    (void)be;
    for (int r = 0; r < n_rows; r++) out_host[r] = ts_argmax_f32(x + r * ldx, n_cols);
}
