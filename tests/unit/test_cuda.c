/* The CUDA backend against the CPU backend: every op on random data, then every Hugging Face
 * fixture model through the engine with device CUDA against device CPU and against the
 * reference logits. Prints "skipped: ..." and passes where there is no CUDA device or the
 * build has no CUDA. */
#include "backend/backend.h"
#include "backend/cpu/quant.h"
#include "backend/cuda/cuda_backend.h"
#include "base/half.h"
#include "engine/engine_int.h"
#include "engine/sampler_int.h"
#include "fixture_util.h"
#include "model/layers.h"
#include "tessera.h"
#include "testutil.h"

#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef TESSERA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define FP32_TOL 1e-5
#define LOGIT_TOL 1e-2

static ts_backend *cpu, *gpu;
static void *kept[8]; /* test weights, alive until the backend is gone */
static void *kept_more[256];
static int n_kept_more;
/* Weights whose host address keys a device copy stay allocated until the end. */
static void kept_extra(void *p) {
    if (n_kept_more < 256) kept_more[n_kept_more++] = p;
}
static unsigned long long rng = 0x5eedULL;

static float *rnd(size_t n, float scale) {
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = tu_rng_uniform(&rng) * scale;
    return v;
}

/* A device buffer of backend be holding a copy of host floats. */
static float *dev_of(ts_backend *be, const float *h, size_t n) {
    float *d = be->ops->alloc(be, n * sizeof *d);
    be->ops->upload(be, d, h, n * sizeof *d);
    return d;
}
static float *dev(const float *h, size_t n) { return dev_of(gpu, h, n); }

/* n floats of a device buffer of backend be, as a new host array (poisoned first). */
static float *host_of(ts_backend *be, const float *d, size_t n) {
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    be->ops->download(be, h, d, n * sizeof *h);
    return h;
}
static float *host(const float *d, size_t n) { return host_of(gpu, d, n); }

static void cmp(const char *what, const float *d, const float *ref, size_t n, double tol) {
    float *got = host(d, n);
    double rel = tu_rel_l2(got, ref, (long)n);
    CHECKF(rel <= tol, "%s: rel L2 %.3g > %.1g", what, rel, tol);
    free(got);
}

static void test_rows_ops(void) {
    int rows = 37, dim = 200;
    int64_t ld = 211;
    size_t n = (size_t)rows * ld;
    float *x = rnd(n, 2.0f), *w = rnd(dim, 1.0f), *o = calloc(n, sizeof *o);
    float *dx = dev(x, n), *dw = dev(w, dim), *dout = dev(o, n);
    cpu->ops->rmsnorm(cpu, x, ld, rows, dim, w, 1e-6f, o, ld);
    gpu->ops->rmsnorm(gpu, dx, ld, rows, dim, dw, 1e-6f, dout, ld);
    cmp("rmsnorm", dout, o, n, FP32_TOL);
    /* in place */
    cpu->ops->rmsnorm(cpu, x, ld, rows, dim, w, 1e-6f, x, ld);
    gpu->ops->rmsnorm(gpu, dx, ld, rows, dim, dw, 1e-6f, dx, ld);
    cmp("rmsnorm in place", dx, x, n, FP32_TOL);
    cpu->ops->l2norm(cpu, x, ld, rows, dim, 1e-6f, 0.3f);
    gpu->ops->l2norm(gpu, dx, ld, rows, dim, 1e-6f, 0.3f);
    cmp("l2norm", dx, x, n, FP32_TOL);
    /* gated rmsnorm: rows of dv contiguous */
    int nt = 5, nh = 4, dv = 64;
    size_t gn = (size_t)nt * nh * dv;
    float *gx = rnd(gn, 1.0f), *gz = rnd(gn, 3.0f), *gw = rnd(dv, 1.0f), *go = calloc(gn, 4);
    float *dgx = dev(gx, gn), *dgz = dev(gz, gn), *dgw = dev(gw, dv), *dgo = dev(go, gn);
    cpu->ops->gated_rmsnorm(cpu, gx, gz, nt, nh, dv, gw, 1e-6f, go);
    gpu->ops->gated_rmsnorm(gpu, dgx, dgz, nt, nh, dv, dgw, 1e-6f, dgo);
    cmp("gated_rmsnorm", dgo, go, gn, FP32_TOL);
    /* the fusions: x += h then rmsnorm (out aliasing h, as the models call it), and the strided
     * per-head l2norm, against the CPU's ops composed */
    float *h = rnd(n, 1.0f), *dh = dev(h, n);
    for (int r = 0; r < rows; r++) /* rows of dim values: the padding stays */
        cpu->ops->add(cpu, x + (size_t)r * ld, h + (size_t)r * ld, dim);
    cpu->ops->rmsnorm(cpu, x, ld, rows, dim, w, 1e-6f, h, ld);
    gpu->ops->add_rmsnorm(gpu, dx, dh, rows, dim, ld, dw, 1e-6f, dh);
    cmp("add_rmsnorm x", dx, x, n, FP32_TOL);
    cmp("add_rmsnorm out", dh, h, n, FP32_TOL);
    int heads = 3, hdim = 40; /* 37 tokens of 3 heads inside rows of ld */
    float *lo = calloc((size_t)rows * heads * hdim, 4), *dlo = dev(lo, (size_t)rows * heads * hdim);
    cpu->ops->copy_rows(cpu, lo, heads * hdim, x + 7, ld, rows, heads * hdim);
    cpu->ops->l2norm(cpu, lo, hdim, rows * heads, hdim, 1e-6f, 0.7f);
    gpu->ops->l2norm_heads(gpu, dx + 7, ld, rows, heads, hdim, 1e-6f, 0.7f, dlo);
    cmp("l2norm_heads", dlo, lo, (size_t)rows * heads * hdim, FP32_TOL);
    gpu->ops->free(gpu, dh), gpu->ops->free(gpu, dlo);
    free(h), free(lo);
    float *bufs[] = {dx, dw, dout, dgx, dgz, dgw, dgo};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->ops->free(gpu, bufs[i]);
    free(x), free(w), free(o), free(gx), free(gz), free(gw), free(go);
}

static void test_elementwise(void) {
    int nt = 7, nh = 6, hd = 64, hs = 128; /* q+gate layout: head stride 2*hd */
    int64_t ld = (int64_t)nh * hs + 3;
    size_t n = (size_t)nt * ld;
    float *x = rnd(n, 1.5f), *dx = dev(x, n);
    int32_t pos[7] = {0, 1, 2, 30, 31, 500, 4095};
    cpu->ops->rope(cpu, x, ld, nt, nh, hs, 48, pos, 10000000.0f);
    gpu->ops->rope(gpu, dx, ld, nt, nh, hs, 48, pos, 10000000.0f);
    cmp("rope partial", dx, x, n, FP32_TOL);
    int32_t pos2[7] = {3, 4, 5, 6, 7, 8, 9}; /* new positions must be uploaded */
    cpu->ops->rope(cpu, x, ld, nt, nh, hs, hd, pos2, 10000.0f);
    gpu->ops->rope(gpu, dx, ld, nt, nh, hs, hd, pos2, 10000.0f);
    cmp("rope full", dx, x, n, FP32_TOL);
    float *y = rnd(n, 1.0f), *dy = dev(y, n);
    cpu->ops->add(cpu, x, y, (int64_t)n);
    gpu->ops->add(gpu, dx, dy, (int64_t)n);
    cmp("add", dx, x, n, FP32_TOL);
    cpu->ops->sigmoid_gate(cpu, x, ld, y + hd, ld, nt, nh, hd, hs);
    gpu->ops->sigmoid_gate(gpu, dx, ld, dy + hd, ld, nt, nh, hd, hs);
    cmp("sigmoid_gate", dx, x, n, FP32_TOL);
    float *o = calloc(n, 4), *dout = dev(o, n);
    cpu->ops->swiglu(cpu, x, y, ld, nt, 300, o, ld);
    gpu->ops->swiglu(gpu, dx, dy, ld, nt, 300, dout, ld);
    cmp("swiglu", dout, o, n, FP32_TOL);
    cpu->ops->gelu_mul(cpu, x, y, ld, nt, 300, x, ld); /* in place, as Gemma calls it */
    gpu->ops->gelu_mul(gpu, dx, dy, ld, nt, 300, dx, ld);
    cmp("gelu_mul", dx, x, n, FP32_TOL);
    for (size_t i = 0; i < n; i++) x[i] *= 40.0f;
    gpu->ops->upload(gpu, dx, x, n * 4);
    cpu->ops->softcap(cpu, x, (int64_t)n, 30.0f);
    gpu->ops->softcap(gpu, dx, (int64_t)n, 30.0f);
    cmp("softcap", dx, x, n, FP32_TOL);
    cpu->ops->copy_rows(cpu, o + 5, ld, x + 2, ld - 1, nt - 1, 100);
    gpu->ops->copy_rows(gpu, dout + 5, ld, dx + 2, ld - 1, nt - 1, 100);
    cmp("copy_rows", dout, o, n, FP32_TOL); /* x itself differs by the softcap's rounding */
    gpu->ops->free(gpu, dx), gpu->ops->free(gpu, dy), gpu->ops->free(gpu, dout);
    free(x), free(y), free(o);
}

/* The device with one fused op removed: the model layer (model/layers.c) then composes it from
 * the plain ops, as for a backend without it. */
/* An environment switch set for the backends made until env_restore, which puts back what was
 * there (so that a switch the whole run was started with, TESSERA_CUDA_SKINNY_WG=0 say, still
 * holds for the backends made after). */
typedef struct {
    const char *name;
    char *old;
} env_saved;
static env_saved env_set(const char *name, const char *value) {
    const char *o = getenv(name);
    env_saved sv = {name, o ? strdup(o) : NULL};
    setenv(name, value, 1);
    return sv;
}
static void env_restore(env_saved sv) {
    if (sv.old)
        setenv(sv.name, sv.old, 1), free(sv.old);
    else
        unsetenv(sv.name);
}

/* A second CUDA backend made with the environment switch name=value (and name2=value2 where
 * name2 is set), for comparisons with the default one; NULL (a failed check) if it cannot be
 * made. */
static ts_backend *gpu_with(const char *name, const char *value, const char *name2,
                            const char *value2) {
    ts_backend *be = NULL;
    env_saved a = env_set(name, value), b = {NULL, NULL};
    if (name2) b = env_set(name2, value2);
    CHECK(ts_backend_cuda_create(0, &be) == TS_OK);
    env_restore(a);
    if (name2) env_restore(b);
    return be;
}

static ts_backend_ops plain_ops;
static ts_backend plain_be;
static ts_backend *without(size_t op_offset) {
    plain_ops = *gpu->ops;
    *(void **)((char *)&plain_ops + op_offset) = NULL;
    plain_be = *gpu;
    plain_be.ops = &plain_ops;
    return &plain_be;
}

static void same_bits(const char *what, const float *da, const float *db, size_t n) {
    float *a = host(da, n), *b = host(db, n);
    CHECKF(memcmp(a, b, n * sizeof *a) == 0, "%s: fused op differs from its composition", what);
    free(a), free(b);
}

/* gdn_prep, conv_gdn_prep and qk_norm_rope: the bits of the ops they fuse, and the CPU's
 * values. */
static void test_fused(void) {
    { /* gdn_prep: 5 tokens, 3 k-heads of 40, 6 v-heads; rows padded */
        int n = 5, Hk = 3, dk = 40, Hv = 6;
        int64_t ldc = 2 * Hk * dk + 70, ldab = 2 * Hv + 1;
        float *conv = rnd((size_t)n * ldc, 2.0f), *ab = rnd((size_t)n * ldab, 3.0f);
        float *nea = rnd(Hv, 1.0f), *dtb = rnd(Hv, 1.0f);
        size_t nq = (size_t)n * Hk * dk, ng = (size_t)n * Hv;
        float *out = calloc(2 * nq + 2 * ng, 4);
        float *dconv = dev(conv, (size_t)n * ldc), *dab = dev(ab, (size_t)n * ldab);
        float *dnea = dev(nea, Hv), *ddtb = dev(dtb, Hv);
        float *d1 = dev(out, 2 * nq + 2 * ng), *d2 = dev(out, 2 * nq + 2 * ng);
        float *o[2] = {out, NULL}, *d[2] = {d1, d2};
        ts_backend *be[3] = {cpu, gpu, without(offsetof(ts_backend_ops, gdn_prep))};
        for (int i = 0; i < 3; i++) {
            float *base = i == 0 ? o[0] : d[i - 1];
            const float *c0 = i == 0 ? conv : dconv, *a0 = i == 0 ? ab : dab;
            ts_gdn_prep_args pa = {.n = n, .Hk = Hk, .dk = dk, .Hv = Hv, .eps = 1e-6f,
                                   .q_scale = 0.125f, .a = a0, .b = a0 + Hv, .ldab = ldab,
                                   .neg_exp_a = i == 0 ? nea : dnea,
                                   .dt_bias = i == 0 ? dtb : ddtb, .qn = base, .kn = base + nq,
                                   .g = base + 2 * nq, .beta = base + 2 * nq + ng};
            ts_gdn_prep(be[i], c0, ldc, &pa);
        }
        cmp("gdn_prep", d1, out, 2 * nq + 2 * ng, FP32_TOL);
        same_bits("gdn_prep", d1, d2, 2 * nq + 2 * ng);
        float *bufs[] = {dconv, dab, dnea, ddtb, d1, d2};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->ops->free(gpu, bufs[i]);
        free(conv), free(ab), free(nea), free(dtb), free(out);
    }
    /* conv_gdn_prep: one run of one token, five runs of one token (the fused kernel, its two
     * ways of reading the runs), runs of 2, 1, 3 tokens and three runs of one token through a
     * 5-tap conv (the two kernels); the fused kernel also in blocks of 128 threads taking two
     * runs each (a backend made with TESSERA_CUDA_PREP_THREADS=128, TESSERA_CUDA_PREP_PAIRS=1:
     * a pair without its second run for one and five runs) */
    ts_backend *be128 =
        gpu_with("TESSERA_CUDA_PREP_THREADS", "128", "TESSERA_CUDA_PREP_PAIRS", "1");
    for (int ci = 0; ci < 4 && be128; ci++) {
        int lens[4][5] = {{1}, {1, 1, 1, 1, 1}, {2, 1, 3}, {1, 1, 1}}, nrs[4] = {1, 5, 3, 3};
        int nr = nrs[ci], n = 0, Hk = 3, dk = 40, Hv = 6, K = ci == 3 ? 5 : 4;
        int C = 2 * 3 * 40 + 300;
        ts_seq_run sr[3][5];
        for (int r = 0; r < nr; r++) n += lens[ci][r];
        int64_t ldx = C + 5, ldo = C + 3, ldab = 2 * Hv + 1;
        size_t nst = (size_t)(K - 1) * C, nq = (size_t)n * Hk * dk, ng = (size_t)n * Hv;
        size_t nout = (size_t)n * ldo + 2 * nq + 2 * ng + nr * nst;
        float *x = rnd((size_t)n * ldx, 2.0f), *w = rnd((size_t)C * K, 1.0f);
        float *ab = rnd((size_t)n * ldab, 3.0f), *nea = rnd(Hv, 1.0f), *dtb = rnd(Hv, 1.0f);
        float *out = calloc(nout, 4);
        for (int r = 0; r < nr; r++) {
            float *st = rnd(nst, 1.0f);
            memcpy(out + nout - (size_t)(nr - r) * nst, st, nst * 4);
            free(st);
        }
        float *dx = dev(x, (size_t)n * ldx), *dw = dev(w, (size_t)C * K);
        float *dab = dev(ab, (size_t)n * ldab), *dnea = dev(nea, Hv), *ddtb = dev(dtb, Hv);
        float *d1 = dev(out, nout), *d2 = dev(out, nout), *d3 = dev(out, nout);
        ts_backend *be[4] = {cpu, gpu, without(offsetof(ts_backend_ops, conv_gdn_prep)), be128};
        ts_seq_run sr3[5];
        for (int i = 0; i < 4; i++) {
            float *base = i == 0 ? out : i == 1 ? d1 : i == 2 ? d2 : d3;
            ts_seq_run *sri = i < 3 ? sr[i] : sr3;
            if (i == 3) free(host(d3, 1)); /* the uploads (gpu's queue) done before be128's op */
            float *qn = base + (size_t)n * ldo, *kn = qn + nq, *g = kn + nq, *beta = g + ng;
            for (int r = 0, start = 0; r < nr; start += lens[ci][r++])
                sri[r] = (ts_seq_run){start, lens[ci][r], 7, 0, beta + ng + (size_t)r * nst, NULL};
            const float *a0 = i == 0 ? ab : dab;
            ts_gdn_prep_args pa = {n,  Hk, dk, Hv, 1e-6f, 0.125f, a0, a0 + Hv, ldab,
                                   i == 0 ? nea : dnea, i == 0 ? dtb : ddtb, qn, kn, g, beta};
            ts_conv_gdn_prep(be[i], i == 0 ? x : dx, ldx, C, K, i == 0 ? w : dw, sri, nr, base, ldo,
                             &pa);
        }
        float *h3 = malloc(nout * sizeof *h3), *h1 = host(d1, nout);
        be128->ops->download(be128, h3, d3, nout * sizeof *h3); /* after be128's queue */
        CHECKF(memcmp(h1, h3, nout * sizeof *h1) == 0,
               "conv_gdn_prep (case %d): 128-thread blocks of two runs differ from 256", ci);
        free(h1), free(h3);
        char what[64];
        snprintf(what, sizeof what, "conv_gdn_prep (case %d)", ci);
        cmp(what, d1, out, nout, FP32_TOL);
        same_bits(what, d1, d2, nout);
        float *bufs[] = {dx, dw, dab, dnea, ddtb, d1, d2, d3};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->ops->free(gpu, bufs[i]);
        free(x), free(w), free(ab), free(nea), free(dtb), free(out);
    }
    if (be128) ts_backend_free(be128);
    /* norm_add_rmsnorm: Gemma's post-norm, residual add and next norm; out = h as Gemma calls
     * it, and the add alone after the last layer (w NULL) */
    for (int ci = 0; ci < 2; ci++) {
        int rows = 3, dim = 640;
        int64_t ld = dim; /* (the CPU's composition adds whole strides, padding too) */
        size_t nx = (size_t)rows * ld;
        float *x = rnd(nx, 2.0f), *h = rnd(nx, 5.0f), *wh = rnd(dim, 1.5f), *w = rnd(dim, 1.5f);
        float *dx1 = dev(x, nx), *dx2 = dev(x, nx), *dh1 = dev(h, nx), *dh2 = dev(h, nx);
        float *dwh = dev(wh, dim), *dw = dev(w, dim);
        ts_norm_add_rmsnorm(cpu, x, h, rows, dim, ld, wh, ci ? w : NULL, 1e-6f, h);
        ts_norm_add_rmsnorm(gpu, dx1, dh1, rows, dim, ld, dwh, ci ? dw : NULL, 1e-6f, dh1);
        ts_norm_add_rmsnorm(without(offsetof(ts_backend_ops, norm_add_rmsnorm)), dx2, dh2, rows,
                            dim, ld, dwh, ci ? dw : NULL, 1e-6f, dh2);
        char what[64];
        snprintf(what, sizeof what, "norm_add_rmsnorm x (%s)", ci ? "normed out" : "add alone");
        cmp(what, dx1, x, nx, FP32_TOL);
        same_bits(what, dx1, dx2, nx);
        if (ci) {
            snprintf(what, sizeof what, "norm_add_rmsnorm out");
            cmp(what, dh1, h, nx, FP32_TOL);
            same_bits(what, dh1, dh2, nx);
        }
        float *bufs[] = {dx1, dx2, dh1, dh2, dwh, dw};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->ops->free(gpu, bufs[i]);
        free(x), free(h), free(wh), free(w);
    }
    /* qk_norm_rope: Qwen's layout (q heads 2 hd apart, followed by their gates; partial
     * rotation, an odd rot_dim too) and Gemma's (packed heads, full rotation) */
    struct { int nq, nk, hd, qhs, rot; } cs[] = {{4, 2, 64, 128, 16}, {3, 1, 96, 96, 96},
                                                 {2, 2, 32, 64, 7}};
    int32_t pos[6] = {0, 1, 7, 300, 301, 4096};
    for (size_t ci = 0; ci < sizeof cs / sizeof *cs; ci++) {
        int nt = 6, nq = cs[ci].nq, nk = cs[ci].nk, hd = cs[ci].hd, qhs = cs[ci].qhs;
        int64_t ldq = (int64_t)nq * qhs, ldk = (int64_t)nk * hd;
        size_t sq = (size_t)nt * ldq, sk = (size_t)nt * ldk;
        float *q = rnd(sq, 2.0f), *k = rnd(sk, 2.0f), *wq = rnd(hd, 1.5f), *wk = rnd(hd, 1.5f);
        float *dq1 = dev(q, sq), *dq2 = dev(q, sq), *dk1 = dev(k, sk), *dk2 = dev(k, sk);
        float *dwq = dev(wq, hd), *dwk = dev(wk, hd);
        ts_qk_norm_rope(cpu, q, ldq, qhs, nq, wq, k, ldk, nk, wk, nt, hd, 1e-6f, cs[ci].rot, pos,
                        10000.0f);
        ts_qk_norm_rope(gpu, dq1, ldq, qhs, nq, dwq, dk1, ldk, nk, dwk, nt, hd, 1e-6f, cs[ci].rot,
                        pos, 10000.0f);
        ts_qk_norm_rope(without(offsetof(ts_backend_ops, qk_norm_rope)), dq2, ldq, qhs, nq, dwq,
                        dk2, ldk, nk, dwk, nt, hd, 1e-6f, cs[ci].rot, pos, 10000.0f);
        char what[64];
        snprintf(what, sizeof what, "qk_norm_rope q (case %zu)", ci);
        cmp(what, dq1, q, sq, FP32_TOL);
        same_bits(what, dq1, dq2, sq);
        snprintf(what, sizeof what, "qk_norm_rope k (case %zu)", ci);
        cmp(what, dk1, k, sk, FP32_TOL);
        same_bits(what, dk1, dk2, sk);
        float *bufs[] = {dq1, dq2, dk1, dk2, dwq, dwk};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->ops->free(gpu, bufs[i]);
        free(q), free(k), free(wq), free(wk);
    }
}

/* attention against the CPU's. Prompts of 32 queries or more with heads of 64, 128 or 256
 * dims take the tensor-core kernel (cuda_attn_mma.cu, bf16x3: within MMA_TOL); a second backend
 * made with TESSERA_CUDA_ATTN_MMA=0 runs every case through the fp32 kernels (FP32_TOL). */
#define MMA_TOL 3e-5
static void test_attention(void) {
    struct {
        int nh, nkv, hd, n, pos0, window;
        float softcap;
    } cases[] = {{4, 2, 64, 9, 0, 0, 0},
                 {8, 1, 256, 1, 70, 0, 0},
                 {4, 4, 128, 13, 20, 16, 50.0f},
                 {2, 1, 96, 1, 99, 32, 0},
                 /* long contexts: every warp of the block gets many keys */
                 {8, 2, 256, 1, 700, 0, 0},
                 {16, 2, 128, 3, 300, 0, 0},
                 {4, 1, 64, 2, 600, 128, 0},
                 {2, 2, 512, 1, 90, 0, 0},
                 {2, 1, 32, 1, 3, 0, 0}, /* fewer keys than warps */
                 /* prompts of 32 queries or more: the tiled kernel (a partial last tile,
                  * three tiles after a prefix, a window with softcap, 96 dims); 512 dims fall
                  * back to the kernel above */
                 {8, 2, 256, 40, 0, 0, 0},
                 {4, 2, 64, 70, 10, 0, 0},
                 {4, 1, 128, 50, 100, 32, 30.0f},
                 {4, 4, 96, 33, 5, 0, 0},
                 {2, 1, 512, 40, 0, 0, 0},
                 /* the tensor-core kernel: many key tiles and partial query groups, after a
                  * prefix, Gemma's 512-key window over a prefix longer than it, a window
                  * shorter than the prompt (each query group starts at its own tile) with a
                  * soft cap, as many KV heads as heads */
                 {8, 2, 256, 300, 0, 0, 0},
                 {4, 1, 256, 100, 1000, 0, 0},
                 {4, 1, 256, 200, 600, 512, 0},
                 {4, 2, 128, 90, 37, 20, 30.0f},
                 {2, 2, 64, 65, 3, 0, 0}};
    ts_backend *fp32 = gpu_with("TESSERA_CUDA_ATTN_MMA", "0", NULL, NULL);
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases && fp32; ci++) {
        int nh = cases[ci].nh, nkv = cases[ci].nkv, hd = cases[ci].hd, n = cases[ci].n;
        int ctx = cases[ci].pos0 + n, kvw = nkv * hd;
        int64_t ldq = (int64_t)nh * hd * 2; /* q rows with a gate half, as Qwen3.5 has */
        size_t nq = (size_t)n * ldq, nkvs = (size_t)ctx * kvw, no = (size_t)n * nh * hd;
        float *q = rnd(nq, 1.0f), *k = rnd(nkvs, 1.0f), *v = rnd(nkvs, 1.0f), *o = calloc(no, 4);
        float *dq = dev(q, nq), *dk = dev(k, nkvs), *dv = dev(v, nkvs), *dout = dev(o, no);
        /* the same on the fp32 backend: q, k, v, out */
        float *f[4] = {dev_of(fp32, q, nq), dev_of(fp32, k, nkvs), dev_of(fp32, v, nkvs),
                       dev_of(fp32, o, no)};
        ts_attn_dims d = {nh, nkv, hd, 1.0f / sqrtf((float)hd), cases[ci].window,
                          cases[ci].softcap};
        cpu->ops->attention(cpu, q, ldq, 2 * hd, n, cases[ci].pos0, k, v, &d, o, nh * hd);
        gpu->ops->attention(gpu, dq, ldq, 2 * hd, n, cases[ci].pos0, dk, dv, &d, dout, nh * hd);
        fp32->ops->attention(fp32, f[0], ldq, 2 * hd, n, cases[ci].pos0, f[1], f[2], &d, f[3],
                             nh * hd);
        bool mma = n >= 32 && (hd == 64 || hd == 128 || hd == 256);
        float *got = host(dout, no), *got2 = host_of(fp32, f[3], no);
        double rel = tu_rel_l2(got, o, (long)no), rel2 = tu_rel_l2(got2, o, (long)no);
        CHECKF(rel <= (mma ? MMA_TOL : FP32_TOL), "attention case %zu%s: rel L2 %.3g", ci,
               mma ? " (tensor cores)" : "", rel);
        if (mma) printf("  attention case %zu (tensor cores): rel L2 %.3g\n", ci, rel);
        CHECKF(rel2 <= FP32_TOL, "attention case %zu (fp32 kernels): rel L2 %.3g", ci, rel2);
        /* the tensor cores' sums are not the fp32 kernels': equal bits would mean that the
         * case never reached the kernel it is there for */
        if (mma)
            CHECKF(memcmp(got, got2, no * 4) != 0,
                   "attention case %zu: the tensor-core kernel not taken", ci);
        free(got), free(got2);
        gpu->ops->free(gpu, dq), gpu->ops->free(gpu, dk), gpu->ops->free(gpu, dv);
        gpu->ops->free(gpu, dout);
        for (int i = 0; i < 4; i++)
            fp32->ops->free(fp32, f[i]);
        free(q), free(k), free(v), free(o);
    }
    if (fp32) ts_backend_free(fp32);
}

/* The image encoder's ops (backend.h's optional four) against the CPU's, on strided rows. */
/* A device array equal to n floats of the host's, bit for bit. */
static void same_as_host(const char *what, const float *d, const float *ref, size_t n) {
    float *got = host(d, n);
    size_t i = 0;
    while (i < n && memcmp(&got[i], &ref[i], sizeof *got) == 0)
        i++;
    CHECKF(i == n, "%s: element %zu is %.9g, the CPU's %.9g", what, i, i < n ? got[i] : 0.0,
           i < n ? ref[i] : 0.0);
    free(got);
}

/* vision_patches and vision_positions against the CPU's, bit for bit (table lookups, and
 * products and sums rounded one by one): Qwen3.5's patches of 16 in 2x2 blocks of two frames,
 * the tiny fixtures' of 4, an image wider than tall and one taller; learned tables resampled to
 * grids from 2x2 to a 1024x1024 image's 64x64, with the real tower's 48x48 table of 768 and a
 * tiny one. */
static void test_vision_input_ops(bool quick) {
    const ts_backend_ops *g = gpu->ops;
    struct {
        int w, h, patch, merge, temporal, frames;
    } pc[] = {{64, 96, 16, 2, 2, 1},     {96, 32, 16, 2, 2, 1}, {24, 40, 4, 2, 2, 1},
              {1024, 1024, 16, 2, 2, 1}, {64, 96, 16, 2, 2, 2}, {24, 40, 4, 2, 2, 2}};
    for (size_t ci = 0; ci < sizeof pc / sizeof *pc; ci++) {
        if (quick && pc[ci].w > 512) continue;
        /* frames 2: a video's step, each frame its own place of the patch's time axis */
        ts_patch_dims d = {pc[ci].w,     pc[ci].h,        pc[ci].patch,
                           pc[ci].merge, pc[ci].temporal, pc[ci].frames};
        size_t nb = (size_t)d.width * d.height * 3 * d.frames,
               np = (size_t)(d.width / d.patch) * (d.height / d.patch),
               K = 3 * (size_t)d.temporal * d.patch * d.patch;
        uint8_t *rgb = malloc(nb);
        for (size_t i = 0; i < nb; i++)
            rgb[i] = (uint8_t)(i * 2654435761u >> 13);
        float *lut = rnd(3 * 256, 2.0f), *want = malloc(np * K * sizeof *want);
        uint8_t *drgb = g->alloc(gpu, nb);
        g->upload(gpu, drgb, rgb, nb);
        float *dlut = dev(lut, 3 * 256), *dout = g->alloc(gpu, np * K * sizeof(float));
        cpu->ops->vision_patches(cpu, rgb, &d, lut, want);
        g->vision_patches(gpu, drgb, &d, dlut, dout);
        char what[64];
        snprintf(what, sizeof what, "vision_patches %dx%d patch %d, %d frame(s)", d.width, d.height,
                 d.patch, d.frames);
        same_as_host(what, dout, want, np * K);
        g->free(gpu, drgb), g->free(gpu, dlut), g->free(gpu, dout);
        free(rgb), free(lut), free(want);
    }
    struct {
        int side, dim, gh, gw, merge;
    } qc[] = {{48, 768, 64, 64, 2},
              {48, 768, 6, 40, 2},
              {48, 768, 2, 2, 2},
              {4, 32, 10, 6, 2},
              {4, 32, 2, 18, 2}};
    for (size_t ci = 0; ci < sizeof qc / sizeof *qc; ci++) {
        if (quick && qc[ci].gh * qc[ci].gw > 1000) continue;
        int side = qc[ci].side, dim = qc[ci].dim, n = qc[ci].gh * qc[ci].gw;
        size_t nt = (size_t)side * side * dim, no = (size_t)n * dim;
        float *table = rnd(nt, 1.0f), *want = malloc(no * sizeof *want);
        float *dtable = dev(table, nt), *dout = g->alloc(gpu, no * sizeof(float));
        cpu->ops->vision_positions(cpu, table, side, dim, qc[ci].gh, qc[ci].gw, qc[ci].merge, want);
        g->vision_positions(gpu, dtable, side, dim, qc[ci].gh, qc[ci].gw, qc[ci].merge, dout);
        char what[64];
        snprintf(what, sizeof what, "vision_positions %dx%d of %d", qc[ci].gh, qc[ci].gw, side);
        same_as_host(what, dout, want, no);
        g->free(gpu, dtable), g->free(gpu, dout), free(table), free(want);
    }
}

static void test_vision_ops(bool quick) {
    const ts_backend_ops *g = gpu->ops;
    CHECKF(g->rope_cs && g->layernorm && g->bias_act && g->attention_full && g->vision_patches &&
               g->vision_positions,
           "the CUDA backend lacks a vision op");
    if (!g->rope_cs || !g->layernorm || !g->bias_act || !g->attention_full || !g->vision_patches ||
        !g->vision_positions)
        return;
    test_vision_input_ops(quick);
    { /* rope_cs: heads with a gap after their rotated dims (a gate half, a partial rotary) */
        int n = 37, nh = 3, half = 12;
        int64_t hs = 2 * half + 8, ldx = nh * hs + 5;
        size_t nx = (size_t)n * ldx, ncs = (size_t)n * 2 * half;
        float *x = rnd(nx, 1.0f), *cs = rnd(ncs, 1.0f), *dx = dev(x, nx), *dcs = dev(cs, ncs);
        cpu->ops->rope_cs(cpu, x, ldx, n, nh, hs, half, cs);
        g->rope_cs(gpu, dx, ldx, n, nh, hs, half, dcs);
        cmp("rope_cs", dx, x, nx, FP32_TOL);
        g->free(gpu, dx), g->free(gpu, dcs), free(x), free(cs);
    }
    /* layernorm: rows far from zero mean (the variance about the mean), into another buffer
     * and in place */
    for (int in_place = 0; in_place < 2; in_place++) {
        int rows = 19, dim = 1152;
        int64_t ldx = dim + 10, ldo = in_place ? ldx : dim + 3;
        size_t nx = (size_t)rows * ldx, no = (size_t)rows * ldo;
        float *x = rnd(nx, 1.0f), *w = rnd((size_t)dim, 1.0f), *b = rnd((size_t)dim, 1.0f);
        for (size_t i = 0; i < nx; i++)
            x[i] += 3.0f;
        float *o = in_place ? x : rnd(no, 1.0f);
        float *dx = dev(x, nx), *dw = dev(w, (size_t)dim), *db = dev(b, (size_t)dim);
        float *dout = in_place ? dx : dev(o, no);
        cpu->ops->layernorm(cpu, x, ldx, rows, dim, w, b, 1e-6f, o, ldo);
        g->layernorm(gpu, dx, ldx, rows, dim, dw, db, 1e-6f, dout, ldo);
        cmp(in_place ? "layernorm in place" : "layernorm", dout, o, no, FP32_TOL);
        if (!in_place) g->free(gpu, dout), free(o);
        g->free(gpu, dx), g->free(gpu, dw), g->free(gpu, db), free(x), free(w), free(b);
    }
    /* bias_act: each activation, with and without a bias; the columns past dim untouched */
    for (int act = TS_ACT_NONE; act <= TS_ACT_GELU_ERF; act++)
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            int rows = 23, dim = 200;
            int64_t ldx = 213;
            size_t nx = (size_t)rows * ldx;
            float *x = rnd(nx, 3.0f), *bias = rnd((size_t)dim, 1.0f);
            float *dx = dev(x, nx), *dbias = dev(bias, (size_t)dim);
            cpu->ops->bias_act(cpu, x, ldx, rows, dim, with_bias ? bias : NULL, act);
            g->bias_act(gpu, dx, ldx, rows, dim, with_bias ? dbias : NULL, act);
            char what[64];
            snprintf(what, sizeof what, "bias_act %d%s", act, with_bias ? " with bias" : "");
            cmp(what, dx, x, nx, FP32_TOL);
            g->free(gpu, dx), g->free(gpu, dbias), free(x), free(bias);
        }
    /* attention_full on a tower's fused rows [q | k | v] (3 * heads * dims a token): fewer
     * tokens than a tile, a partial last tile, several tiles, the head sizes of the lanes'
     * three register widths, a softcap, and the 4096 patches of a 1024x1024 image's tokens;
     * heads of 64 dims without a softcap take the tensor cores (cuda_attn_tc.cu: fewer tokens
     * than a warp's 16 rows, query and key tiles cut short). Then an encoder's (EmbeddingGemma):
     * grouped kv heads (the first kv * dims of the k and v blocks) and a symmetric window (keys
     * within window - 1 on either side), which the tiled kernel takes, across tile edges. */
    struct {
        int nh, kv, hd, n, window;
        float softcap;
    } cases[] = {{2, 2, 16, 5, 0, 0},       {3, 3, 64, 33, 0, 0},   {12, 12, 64, 300, 0, 0},
                 {4, 4, 128, 97, 0, 0},     {2, 2, 256, 70, 0, 0},  {4, 4, 40, 64, 0, 0},
                 {4, 4, 64, 257, 0, 20.0f}, {2, 2, 64, 4096, 0, 0}, {2, 2, 64, 5, 0, 0},
                 {1, 1, 64, 130, 0, 0},     {4, 2, 64, 70, 0, 0},   {4, 1, 32, 33, 0, 0},
                 {4, 2, 64, 200, 9, 0},     {3, 1, 256, 90, 5, 0},  {2, 2, 64, 130, 65, 0},
                 {4, 1, 16, 40, 1, 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        int nh = cases[ci].nh, hd = cases[ci].hd, n = cases[ci].n, H = nh * hd;
        if (quick && n > 1000) continue;
        size_t nqkv = (size_t)n * 3 * H, no = (size_t)n * H;
        float *qkv = rnd(nqkv, 1.0f), *o = calloc(no, sizeof *o);
        float *dqkv = dev(qkv, nqkv), *dout = dev(o, no);
        ts_attn_dims d = {
            nh, cases[ci].kv, hd, 1.0f / sqrtf((float)hd), cases[ci].window, cases[ci].softcap};
        cpu->ops->attention_full(cpu, qkv, 3 * H, qkv + H, qkv + 2 * H, 3 * H, n, &d, o, H);
        g->attention_full(gpu, dqkv, 3 * H, dqkv + H, dqkv + 2 * H, 3 * H, n, &d, dout, H);
        char what[64];
        snprintf(what, sizeof what, "attention_full case %zu", ci);
        cmp(what, dout, o, no, FP32_TOL);
        g->free(gpu, dqkv), g->free(gpu, dout), free(qkv), free(o);
    }
}

static void test_conv_gates(void) {
    int C = 300;
    int64_t ldx = 310;
    /* runs after runs (the state carried); 700 tokens: more than the kernel's 512 token lanes */
    int lens[] = {1, 2, 9, 1, 700, 3};
    for (int K = 4; K >= 2; K -= 2) {
        float *w = rnd((size_t)C * K, 0.5f), *st = calloc((size_t)(K - 1) * C, 4);
        float *dw = dev(w, (size_t)C * K), *dst = dev(st, (size_t)(K - 1) * C);
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            int n = lens[li];
            size_t nx = (size_t)n * ldx;
            float *x = rnd(nx, 1.0f), *o = calloc(nx, 4), *dx = dev(x, nx), *dout = dev(o, nx);
            cpu->ops->conv1d_silu(cpu, x, ldx, n, C, K, w, st, o, ldx);
            gpu->ops->conv1d_silu(gpu, dx, ldx, n, C, K, dw, dst, dout, ldx);
            cmp("conv1d_silu out", dout, o, nx, FP32_TOL);
            cmp("conv1d_silu state", dst, st, (size_t)(K - 1) * C, 0.0);
            gpu->ops->free(gpu, dx), gpu->ops->free(gpu, dout);
            free(x), free(o);
        }
        gpu->ops->free(gpu, dw), gpu->ops->free(gpu, dst);
        free(w), free(st);
    }

    int n = 11, Hv = 16;
    int64_t lda = 20;
    float *a = rnd((size_t)n * lda, 8.0f), *b = rnd((size_t)n * lda, 4.0f);
    float *nea = rnd(Hv, 2.0f), *dtb = rnd(Hv, 12.0f), *g = calloc((size_t)n * Hv, 4),
          *beta = calloc((size_t)n * Hv, 4);
    float *da = dev(a, (size_t)n * lda), *db = dev(b, (size_t)n * lda), *dnea = dev(nea, Hv),
          *ddtb = dev(dtb, Hv), *dg = dev(g, (size_t)n * Hv), *dbeta = dev(beta, (size_t)n * Hv);
    cpu->ops->gdn_gates(cpu, a, lda, b, lda, n, Hv, nea, dtb, g, beta);
    gpu->ops->gdn_gates(gpu, da, lda, db, lda, n, Hv, dnea, ddtb, dg, dbeta);
    cmp("gdn_gates g", dg, g, (size_t)n * Hv, FP32_TOL);
    cmp("gdn_gates beta", dbeta, beta, (size_t)n * Hv, FP32_TOL);
    float *bufs[] = {da, db, dnea, ddtb, dg, dbeta};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->ops->free(gpu, bufs[i]);
    free(a), free(b), free(nea), free(dtb), free(g), free(beta);
}

/* Random delta-rule inputs for n tokens: unit-norm keys keep the recurrence stable, as the
 * model's l2norm does; decays in (0, 1], beta in [0, 1]. */
typedef struct {
    float *q, *k, *v, *g, *beta;
} gdn_in;

/* Rows of q and k ldqk apart (Hk heads of dk, unit-norm keys), of v ldv apart. */
static gdn_in gdn_random(int n, int Hk, int Hv, int dk, int64_t ldqk, int64_t ldv) {
    gdn_in in;
    in.q = rnd((size_t)n * ldqk, 1.0f), in.k = rnd((size_t)n * ldqk, 1.0f);
    for (int t = 0; t < n; t++)
        for (int hk = 0; hk < Hk; hk++) {
            float *kr = in.k + t * ldqk + (int64_t)hk * dk;
            double ss = 0;
            for (int i = 0; i < dk; i++)
                ss += (double)kr[i] * kr[i];
            for (int i = 0; i < dk; i++)
                kr[i] /= (float)sqrt(ss);
        }
    in.v = rnd((size_t)n * ldv, 1.0f), in.g = rnd((size_t)n * Hv, 0.5f);
    in.beta = rnd((size_t)n * Hv, 0.5f);
    for (int i = 0; i < n * Hv; i++) in.g[i] = -fabsf(in.g[i]), in.beta[i] = 0.5f + in.beta[i];
    return in;
}

static void gdn_free(gdn_in *in) { free(in->q), free(in->k), free(in->v), free(in->g), free(in->beta); }

/* The delta rule: prefill runs (chunked request: 37 tokens, 150 over three chunks, exactly 64)
 * and decode steps (recurrent), state carried; GPU against the CPU's recurrent form at every
 * step, and the GPU's chunked kernel against its own recurrent kernel (a second state driven
 * with the recurrent request only), for states in registers, in shared and in global memory. */
static void test_gdn(int Hk, int Hv, int dk, int dvv, bool quick) {
    int runs[] = {37, 1, 150, 1, 5, 64};
    /* quick (sanitizers): 37 and 70 tokens still take the chunked kernels, two chunks */
    int runs_quick[] = {37, 1, 70};
    size_t nruns = quick ? sizeof runs_quick / sizeof *runs_quick : sizeof runs / sizeof *runs;
    size_t ns = (size_t)Hv * dk * dvv;
    float *S = calloc(ns, 4), *dS = dev(S, ns), *dS_rec = dev(S, ns);
    for (size_t r = 0; r < nruns; r++) {
        int n = quick ? runs_quick[r] : runs[r];
        /* the 64-key heads' rows start off 16-byte alignment: the scan stages them by its
         * element-wise path */
        int64_t ldqk = (int64_t)Hk * dk + (dk == 64), ldv = (int64_t)Hv * dvv + 7;
        size_t no = (size_t)n * Hv * dvv;
        gdn_in in = gdn_random(n, Hk, Hv, dk, ldqk, ldv);
        float *o = calloc(no, 4);
        float *dq = dev(in.q, (size_t)n * ldqk), *dk_ = dev(in.k, (size_t)n * ldqk),
              *dv = dev(in.v, (size_t)n * ldv), *dg = dev(in.g, (size_t)n * Hv),
              *db = dev(in.beta, (size_t)n * Hv), *dout = dev(o, no), *dout_rec = dev(o, no);
        ts_gdn_dims d = {Hk, Hv, dk, dvv};
        cpu->ops->gdn(cpu, in.q, in.k, ldqk, in.v, ldv, in.g, in.beta, n, &d, S, o, false);
        gpu->ops->gdn(gpu, dq, dk_, ldqk, dv, ldv, dg, db, n, &d, dS, dout, n > 1);
        gpu->ops->gdn(gpu, dq, dk_, ldqk, dv, ldv, dg, db, n, &d, dS_rec, dout_rec, false);
        char what[96];
        snprintf(what, sizeof what, "gdn %dx%d Hk %d Hv %d run %zu (n %d) out", dk, dvv, Hk, Hv,
                 r, n);
        cmp(what, dout, o, no, FP32_TOL);
        snprintf(what, sizeof what, "gdn %dx%d run %zu state", dk, dvv, r);
        cmp(what, dS, S, ns, FP32_TOL);
        float *got = host(dout, no), *rec = host(dout_rec, no);
        double rel = tu_rel_l2(got, rec, (long)no);
        CHECKF(rel <= FP32_TOL, "gdn %dx%d n %d: chunked vs recurrent kernel rel L2 %.3g", dk,
               dvv, n, rel);
        if (n > 1) printf("  gdn %dx%d n %d: chunked vs recurrent kernel %.2e\n", dk, dvv, n, rel);
        free(got), free(rec);
        float *bufs[] = {dq, dk_, dv, dg, db, dout, dout_rec};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->ops->free(gpu, bufs[i]);
        gdn_free(&in);
        free(o);
    }
    gpu->ops->free(gpu, dS), gpu->ops->free(gpu, dS_rec);
    free(S);
}

/* gdn_runs: several sequences in one launch, each with its own state, against the CPU run by
 * run. A 70-token run takes the chunked kernel for all runs of the call (short ones too), one
 * of single tokens the recurrent one; one run alone goes without a table. With the gated norm
 * (gn): folded into the recurrent kernel (a cluster per head), after the chunked one. */
static void test_gdn_runs(int Hk, int Hv, int dk, int dvv) {
    int sets[5][3] = {{70, 1, 20}, {1, 1, 1}, {1}, {5}, {40}}, nrs[5] = {3, 3, 1, 1, 1};
    int64_t ldqk = (int64_t)Hk * dk, ldv = (int64_t)Hv * dvv;
    size_t ns = (size_t)Hv * dk * dvv;
    for (int ci = 0; ci < 10; ci++) {
        int si = ci % 5, nr = nrs[si], total = 0;
        bool gated = ci >= 5;
        for (int r = 0; r < nr; r++) total += sets[si][r];
        gdn_in in = gdn_random(total, Hk, Hv, dk, ldqk, ldv);
        size_t no = (size_t)total * Hv * dvv;
        float *o = calloc(no, 4), *dout = NULL, *z = rnd(no, 3.0f), *gw = rnd(dvv, 1.0f);
        float *dq = dev(in.q, (size_t)total * ldqk), *dk_ = dev(in.k, (size_t)total * ldqk),
              *dv = dev(in.v, (size_t)total * ldv), *dg = dev(in.g, (size_t)total * Hv),
              *db = dev(in.beta, (size_t)total * Hv), *dz = dev(z, no), *dgw = dev(gw, dvv);
        dout = dev(o, no);
        float *S[3], *dS[3];
        ts_seq_run runs[3];
        ts_gdn_dims d = {Hk, Hv, dk, dvv};
        int start = 0;
        for (int r = 0; r < nr; r++) {
            int n = sets[si][r];
            S[r] = rnd(ns, 0.3f); /* a state carried from earlier tokens */
            dS[r] = dev(S[r], ns);
            runs[r] = (ts_seq_run){start, n, 0, 0, dS[r], NULL};
            cpu->ops->gdn(cpu, in.q + start * ldqk, in.k + start * ldqk, ldqk, in.v + start * ldv,
                          ldv, in.g + start * Hv, in.beta + start * Hv, n, &d, S[r],
                          o + (size_t)start * Hv * dvv, false);
            start += n;
        }
        if (gated) cpu->ops->gated_rmsnorm(cpu, o, z, total, Hv, dvv, gw, 1e-6f, o);
        ts_gated_norm gn = {dz, dgw, 1e-6f};
        gpu->ops->gdn_runs(gpu, dq, dk_, ldqk, dv, ldv, dg, db, &d, runs, nr, gated ? &gn : NULL,
                           dout);
        char what[96];
        snprintf(what, sizeof what, "gdn_runs %dx%d runs %d/%d/%d%s out", dk, dvv, sets[si][0],
                 sets[si][1], sets[si][2], gated ? " gated" : "");
        cmp(what, dout, o, no, FP32_TOL);
        for (int r = 0; r < nr; r++) {
            snprintf(what, sizeof what, "gdn_runs %dx%d set %d run %d state", dk, dvv, si, r);
            cmp(what, dS[r], S[r], ns, FP32_TOL);
            gpu->ops->free(gpu, dS[r]);
            free(S[r]);
        }
        float *bufs[] = {dq, dk_, dv, dg, db, dout, dz, dgw};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->ops->free(gpu, bufs[i]);
        gdn_free(&in);
        free(o), free(z), free(gw);
    }
}

/* conv_gdn_step, one sequence's delta-rule decode step in one kernel, against conv_gdn_prep
 * and gdn_runs (the device without the op, as the model composes them) bit for bit over three
 * steps - each step's output, then both states - with 4 and 3 conv taps; and the shapes it
 * does not take (d_k 64, two v-heads a k-head) refused. Where the device sets L2 aside for the
 * state, each step takes the form that keeps it there, with the set-aside made, and gdn_runs
 * gives it back (so every step here makes it afresh). */
static void test_conv_gdn_step(void) {
    for (int ci = 0; ci < 2; ci++) {
        int H = 2, dk = 128, K = ci ? 3 : 4, C = 3 * H * dk, steps = 3;
        size_t nst = (size_t)(K - 1) * C, nrec = (size_t)H * dk * dk, no = (size_t)H * dk;
        float *x = rnd((size_t)steps * C, 2.0f), *w = rnd((size_t)C * K, 0.7f);
        float *ab = rnd((size_t)steps * 2 * H, 3.0f), *nea = rnd(H, 1.0f), *dtb = rnd(H, 1.0f);
        float *z = rnd(no, 3.0f), *gw = rnd(dk, 1.0f), *cs = rnd(nst, 1.0f);
        float *rs = rnd(nrec, 0.3f);
        float *dx = dev(x, (size_t)steps * C), *dw = dev(w, (size_t)C * K);
        float *dab = dev(ab, (size_t)steps * 2 * H), *dnea = dev(nea, H), *ddtb = dev(dtb, H);
        float *dz = dev(z, no), *dgw = dev(gw, dk);
        float *dcs[2] = {dev(cs, nst), dev(cs, nst)}, *drs[2] = {dev(rs, nrec), dev(rs, nrec)};
        float *dout[2] = {dev(z, no), dev(z, no)};
        /* the composition's scratch: the conv's output, qn, kn, g, beta */
        float *scr = gpu->ops->alloc(gpu, ((size_t)C + 2 * no + 2 * H) * sizeof *scr);
        float *qn = scr + C, *kn = qn + no, *g = kn + no, *beta = g + H;
        ts_gdn_dims d = {H, H, dk, dk};
        ts_gated_norm gn = {dz, dgw, 1e-6f};
        ts_backend *plain = without(offsetof(ts_backend_ops, conv_gdn_step));
        for (int t = 0; t < steps; t++) {
            const float *xt = dx + (size_t)t * C, *at = dab + (size_t)t * 2 * H;
            ts_gdn_prep_args pa = {1,  H,      dk,  H,    1e-6f, 1.0f / sqrtf((float)dk),
                                   at, at + H, H,   dnea, ddtb,  qn,
                                   kn, g,      beta};
            ts_seq_run sr0 = {0, 1, t, 0, dcs[0], drs[0]}, sr = {0, 1, t, 0, dcs[1], drs[1]};
            bool on = false;
            long n_kept = ts_backend_cuda_gdn_keep_launches(gpu, NULL);
            CHECKF(ts_conv_gdn_step(gpu, xt, C, K, dw, &sr0, 1, &pa, &d, &gn, dout[0]),
                   "conv_gdn_step (K %d): the device refused the Qwen3.5 heads", K);
            if (n_kept >= 0)
                CHECKF(ts_backend_cuda_gdn_keep_launches(gpu, &on) == n_kept + 1 && on,
                       "conv_gdn_step K %d step %d: not in the form that keeps its state in L2 "
                       "(set-aside %s)",
                       K, t, on ? "made" : "not made");
            else if (ci == 0 && t == 0)
                printf("  conv_gdn_step: the device sets no L2 aside (form not tested)\n");
            CHECK(!ts_conv_gdn_step(plain, xt, C, K, dw, &sr, 1, &pa, &d, &gn, dout[1]));
            ts_conv_gdn_prep(plain, xt, C, C, K, dw, &sr, 1, scr, C, &pa);
            sr.a = drs[1];
            ts_gdn_runs(plain, qn, kn, H * dk, scr + 2 * H * dk, C, g, beta, &d, &sr, 1, &gn,
                        dout[1]);
            ts_backend_cuda_gdn_keep_launches(gpu, &on);
            CHECKF(!on, "conv_gdn_step K %d step %d: gdn_runs left the L2 set-aside in place", K,
                   t);
            char what[64];
            snprintf(what, sizeof what, "conv_gdn_step K %d step %d out", K, t);
            same_bits(what, dout[0], dout[1], no);
        }
        char what[64];
        snprintf(what, sizeof what, "conv_gdn_step K %d conv state", K);
        same_bits(what, dcs[0], dcs[1], nst);
        snprintf(what, sizeof what, "conv_gdn_step K %d recurrent state", K);
        same_bits(what, drs[0], drs[1], nrec);
        /* refused: d_k 64; two v-heads a k-head (by the device); a run of two tokens (by the
         * model layer's helper) */
        ts_gdn_dims d64 = {H, H, 64, 64}, dgq = {1, 2, dk, dk};
        ts_gdn_prep_args p64 = {1, H,    64,   H,  1e-6f, 0.125f, dab, dab + H,
                                H, dnea, ddtb, qn, kn,    g,      beta};
        ts_gdn_prep_args pgq = {1, 1,    dk,   2,  1e-6f, 0.125f, dab, dab + H,
                                H, dnea, ddtb, qn, kn,    g,      beta};
        ts_seq_run r2[1] = {{0, 1, 3, 0, dcs[0], drs[0]}}, rlong = {0, 2, 3, 0, dcs[0], drs[0]};
        CHECK(!ts_conv_gdn_step(gpu, dx, 3 * H * 64, K, dw, r2, 1, &p64, &d64, &gn, dout[0]));
        CHECK(!ts_conv_gdn_step(gpu, dx, 4 * dk, K, dw, r2, 1, &pgq, &dgq, &gn, dout[0]));
        ts_gdn_prep_args p2 = {2, H,    dk,   H,  1e-6f, 0.125f, dab, dab + H,
                               H, dnea, ddtb, qn, kn,    g,      beta};
        CHECK(!ts_conv_gdn_step(gpu, dx, C, K, dw, &rlong, 1, &p2, &d, &gn, dout[0]));
        float *bufs[] = {dx,     dw,     dab,    dnea,   ddtb,    dz,      dgw,
                         dcs[0], dcs[1], drs[0], drs[1], dout[0], dout[1], scr};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            gpu->ops->free(gpu, bufs[i]);
        free(x), free(w), free(ab), free(nea), free(dtb), free(z), free(gw), free(cs), free(rs);
    }
}

/* conv_gdn_step for a batch of many sequences (runs of one token: cuda_gdn_step_runs.cu) over
 * three steps: each run's output, conv state and recurrent state bit for bit those of the same
 * run stepped alone (the one-sequence kernel, whose bits are its composition's: above), and
 * within FP32_TOL of the batch's composition (conv_gdn_prep, then gdn_runs with its gated norm);
 * three heads, 4 and 3 conv taps, the runs' rows in another order than their states, and 40
 * runs. */
static void test_conv_gdn_step_runs(void) {
    /* run r's row of a batch of five: the last run ends the batch, as gdn_runs has it */
    static const int order5[5] = {3, 0, 2, 1, 4};
    for (int ci = 0; ci < 3; ci++) {
        int H = 3, dk = 128, K = ci == 1 ? 3 : 4, C = 3 * H * dk, nr = ci == 2 ? 40 : 5, steps = 3;
        int vd = H * dk;
        size_t nst = (size_t)(K - 1) * C, nrec = (size_t)H * dk * dk, no = (size_t)nr * vd;
        float *x = rnd((size_t)steps * nr * C, 2.0f), *w = rnd((size_t)C * K, 0.7f);
        float *ab = rnd((size_t)steps * nr * 2 * H, 3.0f), *nea = rnd(H, 1.0f);
        float *dtb = rnd(H, 1.0f), *z = rnd((size_t)steps * no, 3.0f), *gw = rnd(dk, 1.0f);
        float *cs = rnd(nr * nst, 1.0f), *rs = rnd(nr * nrec, 0.3f);
        float *dx = dev(x, (size_t)steps * nr * C), *dw = dev(w, (size_t)C * K);
        float *dab = dev(ab, (size_t)steps * nr * 2 * H), *dnea = dev(nea, H), *ddtb = dev(dtb, H);
        float *dz = dev(z, (size_t)steps * no), *dgw = dev(gw, dk);
        /* [0] the batch's kernel, [1] each run alone, [2] the composition */
        float *dcs[3], *drs[3], *dout[3];
        for (int i = 0; i < 3; i++)
            dcs[i] = dev(cs, nr * nst), drs[i] = dev(rs, nr * nrec), dout[i] = dev(z, no);
        float *scr = gpu->ops->alloc(gpu, ((size_t)nr * C + 2 * no + 2 * (size_t)nr * H) * 4);
        float *qn = scr + (size_t)nr * C, *kn = qn + no, *g = kn + no, *beta = g + nr * H;
        ts_gdn_dims d = {H, H, dk, dk};
        ts_backend *plain = without(offsetof(ts_backend_ops, conv_gdn_step));
        ts_seq_run *sr = malloc(3 * (size_t)nr * sizeof *sr);
        for (int t = 0; t < steps; t++) {
            const float *xt = dx + (size_t)t * nr * C, *at = dab + (size_t)t * nr * 2 * H;
            const float *zt = dz + (size_t)t * no;
            ts_gdn_prep_args pa = {nr, H,      dk,    H,    1e-6f, 1.0f / sqrtf((float)dk),
                                   at, at + H, 2 * H, dnea, ddtb,  qn,
                                   kn, g,      beta};
            ts_gated_norm gn = {zt, dgw, 1e-6f};
            for (int i = 0; i < 3; i++)
                for (int r = 0; r < nr; r++)
                    sr[i * nr + r] = (ts_seq_run){
                        nr == 5 ? order5[r] : r, 1, t, 0, dcs[i] + r * nst, drs[i] + r * nrec};
            CHECKF(ts_conv_gdn_step(gpu, xt, C, K, dw, sr, nr, &pa, &d, &gn, dout[0]),
                   "conv_gdn_step (K %d, %d runs): the device refused the batch", K, nr);
            for (int r = 0; r < nr; r++) {
                ts_seq_run one = sr[nr + r];
                int row = one.start;
                one.start = 0;
                ts_gdn_prep_args p1 = pa;
                p1.n = 1, p1.a = at + row * 2 * H, p1.b = p1.a + H;
                ts_gated_norm g1 = {zt + (size_t)row * vd, dgw, 1e-6f};
                CHECK(ts_conv_gdn_step(gpu, xt + (size_t)row * C, C, K, dw, &one, 1, &p1, &d, &g1,
                                       dout[1] + (size_t)row * vd));
            }
            CHECK(!ts_conv_gdn_step(plain, xt, C, K, dw, sr + 2 * nr, nr, &pa, &d, &gn, dout[2]));
            ts_conv_gdn_prep(plain, xt, C, C, K, dw, sr + 2 * nr, nr, scr, C, &pa);
            for (int r = 0; r < nr; r++)
                sr[2 * nr + r].a = sr[2 * nr + r].b;
            ts_gdn_runs(plain, qn, kn, H * dk, scr + 2 * H * dk, C, g, beta, &d, sr + 2 * nr, nr,
                        &gn, dout[2]);
            char what[80];
            snprintf(what, sizeof what, "conv_gdn_step %d runs K %d step %d out", nr, K, t);
            same_bits(what, dout[0], dout[1], no);
            float *ref = host(dout[2], no);
            cmp(what, dout[0], ref, no, FP32_TOL);
            free(ref);
        }
        const char *names[2] = {"conv state", "recurrent state"};
        float **bufs2[2] = {dcs, drs};
        size_t sizes[2] = {nr * nst, nr * nrec};
        for (int s = 0; s < 2; s++) {
            char what[80];
            snprintf(what, sizeof what, "conv_gdn_step %d runs K %d %s", nr, K, names[s]);
            same_bits(what, bufs2[s][0], bufs2[s][1], sizes[s]);
            float *ref = host(bufs2[s][2], sizes[s]);
            cmp(what, bufs2[s][0], ref, sizes[s], FP32_TOL);
            free(ref);
        }
        float *bufs[] = {dx, dw, dab, dnea, ddtb, dz, dgw, scr};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            gpu->ops->free(gpu, bufs[i]);
        for (int i = 0; i < 3; i++)
            gpu->ops->free(gpu, dcs[i]), gpu->ops->free(gpu, drs[i]), gpu->ops->free(gpu, dout[i]);
        free(sr), free(x), free(w), free(ab), free(nea), free(dtb), free(z), free(gw), free(cs);
        free(rs);
    }
}

/* attention_step, one sequence's attention step in one kernel, against qk_norm_rope,
 * attention_runs and sigmoid_gate (the device without the op, as the model composes them) bit
 * for bit - the output and both caches: Qwen's heads (q and its gate 2 hd apart, a quarter of
 * the dims rotated, four q heads a kv head) with and without the gate, at the first position,
 * a short context and one long enough for the key split and its merge; packed heads of 128
 * fully rotated; rotary positions shifted from the cache row (text after an image), ahead and
 * behind; a run of two tokens refused. */
static void test_attention_step(void) {
    struct {
        int nh, nkv, hd, qhs, rot, pos;
        bool gate;
        int shift;
    } cs[] = {{8, 2, 256, 512, 64, 0, true, 0},     {8, 2, 256, 512, 64, 37, true, 0},
              {8, 2, 256, 512, 64, 3000, true, 0},  {8, 2, 256, 512, 64, 37, false, 0},
              {4, 1, 128, 128, 128, 700, false, 0}, {4, 1, 128, 128, 128, 5, false, 0},
              {8, 2, 256, 512, 64, 37, true, -30},  {4, 1, 128, 128, 128, 700, false, 411}};
    for (size_t ci = 0; ci < sizeof cs / sizeof *cs; ci++) {
        int nh = cs[ci].nh, nkv = cs[ci].nkv, hd = cs[ci].hd, qhs = cs[ci].qhs, pos = cs[ci].pos;
        int kvw = nkv * hd, ow = nh * hd;
        size_t nq = (size_t)nh * qhs, nc = (size_t)(pos + 1) * kvw;
        float *q = rnd(nq, 2.0f), *k = rnd(kvw, 2.0f), *v = rnd(kvw, 1.0f);
        float *wq = rnd(hd, 1.5f), *wk = rnd(hd, 1.5f), *cache = rnd(2 * nc, 1.0f);
        float *dq[2] = {dev(q, nq), dev(q, nq)}, *dk_[2] = {dev(k, kvw), dev(k, kvw)};
        float *dv = dev(v, kvw), *dwq = dev(wq, hd), *dwk = dev(wk, hd);
        float *dc[2] = {dev(cache, 2 * nc), dev(cache, 2 * nc)};
        float *dout[2] = {dev(q, ow), dev(q, ow)};
        ts_attn_dims d = {nh, nkv, hd, 1.0f / sqrtf((float)hd), 0, 0};
        ts_seq_run sr[2];
        for (int i = 0; i < 2; i++)
            sr[i] = (ts_seq_run){0, 1, pos, cs[ci].shift, dc[i], dc[i] + nc};
        ts_backend *plain = without(offsetof(ts_backend_ops, attention_step));
        float eps = 1e-6f, theta = 10000000.0f;
        CHECKF(ts_attention_step(gpu, dq[0], (int64_t)nq, qhs, dwq, dk_[0], dwk, dv, eps,
                                 cs[ci].rot, theta, &d, &sr[0], 1, cs[ci].gate ? dq[0] + hd : NULL,
                                 dout[0], ow),
               "attention_step (case %zu) refused", ci);
        int32_t p32 = pos + cs[ci].shift;
        ts_qk_norm_rope(plain, dq[1], (int64_t)nq, qhs, nh, dwq, dk_[1], kvw, nkv, dwk, 1, hd, eps,
                        cs[ci].rot, &p32, theta);
        ts_attend_runs(plain, dq[1], (int64_t)nq, qhs, dk_[1], dv, &d, &sr[1], 1, dout[1], ow);
        if (cs[ci].gate)
            plain->ops->sigmoid_gate(plain, dout[1], ow, dq[1] + hd, (int64_t)nq, 1, nh, hd, qhs);
        char what[64];
        snprintf(what, sizeof what, "attention_step (case %zu) out", ci);
        same_bits(what, dout[0], dout[1], ow);
        snprintf(what, sizeof what, "attention_step (case %zu) caches", ci);
        same_bits(what, dc[0], dc[1], 2 * nc);
        /* a run of two tokens refused by the device and by the model layer's helper */
        ts_seq_run two = {0, 2, pos, 0, dc[0], dc[0] + nc};
        CHECK(!gpu->ops->attention_step(gpu, dq[0], (int64_t)nq, qhs, dwq, dk_[0], dwk, dv, eps,
                                        cs[ci].rot, theta, &d, &two, 1, NULL, dout[0], ow));
        CHECK(!ts_attention_step(gpu, dq[0], (int64_t)nq, qhs, dwq, dk_[0], dwk, dv, eps,
                                 cs[ci].rot, theta, &d, &two, 1, NULL, dout[0], ow));
        float *bufs[] = {dq[0], dq[1], dk_[0], dk_[1],  dv,     dwq,
                         dwk,   dc[0], dc[1],  dout[0], dout[1]};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            gpu->ops->free(gpu, bufs[i]);
        free(q), free(k), free(v), free(wq), free(wk), free(cache);
    }
}

/* attention_step for a batch of many sequences (runs of one token), against qk_norm_rope,
 * attention_runs and sigmoid_gate over the same batch (the device without the op) bit for bit -
 * the output and every run's caches: Qwen's heads with the gate, runs whose rows are in another
 * order than their caches, one at the first position, with one long enough for the key split
 * and its merge (which then applies the gate) and without (the kernel applies it); packed heads
 * of 128 without the gate, and with a sliding window of 32 keys (Gemma 3's local layers); runs
 * each with its own rotary shift (text after an image), ahead, behind and none. */
static void test_attention_step_runs(void) {
    struct {
        int nh, nkv, hd, qhs, rot, nr;
        bool gate;
        int pos[5], row[5];
        int window;
        int shift[5]; /* each run's rotary shift (text after an image) */
    } cs[] = {{8, 2, 256, 512, 64, 5, true, {0, 37, 300, 3000, 5}, {3, 0, 2, 4, 1}, 0, {0}},
              {8, 2, 256, 512, 64, 4, true, {0, 37, 100, 5}, {2, 0, 3, 1}, 0, {0}},
              {4, 1, 128, 128, 128, 3, false, {700, 5, 64}, {1, 2, 0}, 0, {0}},
              {4, 1, 128, 128, 128, 3, false, {700, 5, 64}, {1, 2, 0}, 32, {0}},
              {8, 2, 256, 512, 64, 4, true, {0, 37, 100, 5}, {2, 0, 3, 1}, 0, {9, -37, 0, 250}}};
    for (size_t ci = 0; ci < sizeof cs / sizeof *cs; ci++) {
        int nh = cs[ci].nh, nkv = cs[ci].nkv, hd = cs[ci].hd, qhs = cs[ci].qhs, nr = cs[ci].nr;
        int kvw = nkv * hd, ow = nh * hd;
        int64_t ldq = (int64_t)nh * qhs;
        size_t nq = (size_t)nr * ldq, nkv_rows = (size_t)nr * kvw, no = (size_t)nr * ow;
        float *q = rnd(nq, 2.0f), *k = rnd(nkv_rows, 2.0f), *v = rnd(nkv_rows, 1.0f);
        float *wq = rnd(hd, 1.5f), *wk = rnd(hd, 1.5f);
        float *dq[2] = {dev(q, nq), dev(q, nq)}, *dk_[2] = {dev(k, nkv_rows), dev(k, nkv_rows)};
        float *dv = dev(v, nkv_rows), *dwq = dev(wq, hd), *dwk = dev(wk, hd);
        float *dout[2] = {dev(q, no), dev(q, no)};
        float *cache[5], *dc[2][5];
        size_t nc[5];
        ts_seq_run sr[2][5];
        int32_t pos_of_row[5];
        for (int r = 0; r < nr; r++) {
            nc[r] = (size_t)(cs[ci].pos[r] + 1) * kvw;
            cache[r] = rnd(2 * nc[r], 1.0f);
            pos_of_row[cs[ci].row[r]] = cs[ci].pos[r] + cs[ci].shift[r];
            for (int i = 0; i < 2; i++) {
                dc[i][r] = dev(cache[r], 2 * nc[r]);
                sr[i][r] = (ts_seq_run){cs[ci].row[r],   1,        cs[ci].pos[r],
                                        cs[ci].shift[r], dc[i][r], dc[i][r] + nc[r]};
            }
        }
        ts_attn_dims d = {nh, nkv, hd, 1.0f / sqrtf((float)hd), cs[ci].window, 0};
        ts_backend *plain = without(offsetof(ts_backend_ops, attention_step));
        float eps = 1e-6f, theta = 10000000.0f;
        CHECKF(ts_attention_step(gpu, dq[0], ldq, qhs, dwq, dk_[0], dwk, dv, eps, cs[ci].rot, theta,
                                 &d, sr[0], nr, cs[ci].gate ? dq[0] + hd : NULL, dout[0], ow),
               "attention_step runs (case %zu) refused", ci);
        ts_qk_norm_rope(plain, dq[1], ldq, qhs, nh, dwq, dk_[1], kvw, nkv, dwk, nr, hd, eps,
                        cs[ci].rot, pos_of_row, theta);
        ts_attend_runs(plain, dq[1], ldq, qhs, dk_[1], dv, &d, sr[1], nr, dout[1], ow);
        if (cs[ci].gate)
            plain->ops->sigmoid_gate(plain, dout[1], ow, dq[1] + hd, ldq, nr, nh, hd, qhs);
        char what[64];
        snprintf(what, sizeof what, "attention_step runs (case %zu) out", ci);
        same_bits(what, dout[0], dout[1], no);
        for (int r = 0; r < nr; r++) {
            snprintf(what, sizeof what, "attention_step runs (case %zu) run %d caches", ci, r);
            same_bits(what, dc[0][r], dc[1][r], 2 * nc[r]);
            gpu->ops->free(gpu, dc[0][r]), gpu->ops->free(gpu, dc[1][r]);
            free(cache[r]);
        }
        float *bufs[] = {dq[0], dq[1], dk_[0], dk_[1], dv, dwq, dwk, dout[0], dout[1]};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            gpu->ops->free(gpu, bufs[i]);
        free(q), free(k), free(v), free(wq), free(wk);
    }
}

/* attention_runs over nr sequences' runs on backend be (the K/V caches' new rows stored by the
 * op); out gets its output on the host. Runs of skip_from queries or more are given as runs of
 * none (their output left as out has it). */
static void attention_runs_on(ts_backend *be, int nr, const int lens[3], const int pos0[3],
                              int skip_from, const float *q, const float *knew, const float *vnew,
                              float *const kc[3], float *const vc[3], const ts_attn_dims *d,
                              float *out) {
    int nh = d->n_heads, hd = d->head_dim, kvw = d->n_kv_heads * hd, total = 0;
    int64_t ldq = (int64_t)nh * hd * 2;
    for (int r = 0; r < nr; r++)
        total += lens[r];
    float *dq = dev_of(be, q, (size_t)total * ldq), *dkn = dev_of(be, knew, (size_t)total * kvw),
          *dvn = dev_of(be, vnew, (size_t)total * kvw), *dkc[3], *dvc[3];
    float *dout = dev_of(be, out, (size_t)total * nh * hd);
    ts_seq_run runs[3];
    for (int r = 0, start = 0; r < nr; start += lens[r], r++) {
        size_t cap = (size_t)(pos0[r] + lens[r]) * kvw;
        dkc[r] = dev_of(be, kc[r], cap), dvc[r] = dev_of(be, vc[r], cap);
        runs[r] =
            (ts_seq_run){start, lens[r] < skip_from ? lens[r] : 0, pos0[r], 0, dkc[r], dvc[r]};
    }
    be->ops->attention_runs(be, dq, ldq, 2 * hd, dkn, dvn, d, runs, nr, dout, nh * hd);
    float *got = host_of(be, dout, (size_t)total * nh * hd);
    memcpy(out, got, (size_t)total * nh * hd * sizeof *out);
    free(got);
    for (int r = 0; r < nr; r++)
        be->ops->free(be, dkc[r]), be->ops->free(be, dvc[r]);
    be->ops->free(be, dq), be->ops->free(be, dkn), be->ops->free(be, dvn), be->ops->free(be, dout);
}

/* attention_runs against the CPU's, on the default backend and on fp32 (made with
 * TESSERA_CUDA_ATTN_MMA=0). On the default backend runs of 32 queries or more take the
 * tensor-core kernel (within MMA_TOL; their bits differ from fp32's), the others the fp32
 * kernels in one launch: their bits those of fp32 given them alone (the others as runs of no
 * queries). */
static void test_attention_runs_case(ts_backend *fp32, int nr, const int lens[3], const int pos0[3],
                                     const char *what) {
    int nh = 8, nkv = 2, hd = 256, kvw = nkv * hd;
    int64_t ldq = (int64_t)nh * hd * 2;
    int total = 0;
    for (int r = 0; r < nr; r++) total += lens[r];
    size_t no = (size_t)total * nh * hd;
    float *q = rnd((size_t)total * ldq, 1.0f), *knew = rnd((size_t)total * kvw, 1.0f),
          *vnew = rnd((size_t)total * kvw, 1.0f), *o = calloc(no, 4), *got = calloc(no, 4),
          *got2 = calloc(no, 4), *got3 = calloc(no, 4);
    float *kc[3], *vc[3];
    ts_attn_dims d = {nh, nkv, hd, 1.0f / sqrtf((float)hd), 0, 0};
    for (int r = 0, start = 0; r < nr; start += lens[r], r++) {
        size_t cap = (size_t)(pos0[r] + lens[r]) * kvw;
        kc[r] = rnd(cap, 1.0f), vc[r] = rnd(cap, 1.0f);
        /* the CPU reference reads the new rows from its cache: store them there first */
        memcpy(kc[r] + (size_t)pos0[r] * kvw, knew + (size_t)start * kvw,
               (size_t)lens[r] * kvw * 4);
        memcpy(vc[r] + (size_t)pos0[r] * kvw, vnew + (size_t)start * kvw,
               (size_t)lens[r] * kvw * 4);
        cpu->ops->attention(cpu, q + start * ldq, ldq, 2 * hd, lens[r], pos0[r], kc[r], vc[r], &d,
                            o + (size_t)start * nh * hd, nh * hd);
    }
    attention_runs_on(gpu, nr, lens, pos0, INT_MAX, q, knew, vnew, kc, vc, &d, got);
    attention_runs_on(fp32, nr, lens, pos0, INT_MAX, q, knew, vnew, kc, vc, &d, got2);
    attention_runs_on(fp32, nr, lens, pos0, 32, q, knew, vnew, kc, vc, &d, got3);
    for (int r = 0, start = 0; r < nr; start += lens[r], r++) {
        size_t at = (size_t)start * nh * hd, len = (size_t)lens[r] * nh * hd;
        bool mma = lens[r] >= 32;
        double rel = tu_rel_l2(got + at, o + at, (long)len),
               rel2 = tu_rel_l2(got2 + at, o + at, (long)len);
        CHECKF(rel <= (mma ? MMA_TOL : FP32_TOL), "%s, run %d (%d queries): rel L2 %.3g", what, r,
               lens[r], rel);
        CHECKF(rel2 <= FP32_TOL, "%s, run %d (fp32 kernels): rel L2 %.3g", what, r, rel2);
        if (mma)
            CHECKF(memcmp(got + at, got2 + at, len * 4) != 0,
                   "%s, run %d (%d queries): the tensor-core kernel not taken", what, r, lens[r]);
        else
            CHECKF(memcmp(got + at, got3 + at, len * 4) == 0,
                   "%s, run %d (%d queries): not the fp32 kernels' bits", what, r, lens[r]);
    }
    for (int r = 0; r < nr; r++)
        free(kc[r]), free(vc[r]);
    free(q), free(knew), free(vnew), free(o), free(got), free(got2), free(got3);
}

/* One sequence's decode steps through attention_runs, several in one submission: the
 * position reaches the kernels through the device (cuda_kv_pos), uploaded once per
 * submission and again whenever it changes - a step that reused the previous step's upload
 * would store its K/V row over the previous one and attend to one key too few. */
static void test_attention_one_seq_steps(void) {
    int nh = 4, nkv = 2, hd = 128, kvw = nkv * hd, p0 = 300, steps = 3;
    int64_t ldq = (int64_t)nh * hd;
    size_t cap = (size_t)(p0 + steps) * kvw;
    float *kc = rnd(cap, 1.0f), *vc = rnd(cap, 1.0f), *q = rnd((size_t)steps * ldq, 1.0f);
    float *kn = rnd((size_t)steps * kvw, 1.0f), *vn = rnd((size_t)steps * kvw, 1.0f);
    float *o = calloc((size_t)steps * ldq, 4);
    float *dkc = dev(kc, cap), *dvc = dev(vc, cap), *dq = dev(q, (size_t)steps * ldq);
    float *dkn = dev(kn, (size_t)steps * kvw), *dvn = dev(vn, (size_t)steps * kvw);
    float *dout = dev(o, (size_t)steps * ldq);
    ts_attn_dims d = {nh, nkv, hd, 1.0f / sqrtf((float)hd), 0, 0};
    for (int i = 0; i < steps; i++) { /* queued one after another: no download between */
        ts_seq_run r = {0, 1, p0 + i, 0, dkc, dvc};
        gpu->ops->attention_runs(gpu, dq + i * ldq, ldq, hd, dkn + (size_t)i * kvw,
                                 dvn + (size_t)i * kvw, &d, &r, 1, dout + i * ldq, ldq);
    }
    for (int i = 0; i < steps; i++) {
        memcpy(kc + (size_t)(p0 + i) * kvw, kn + (size_t)i * kvw, (size_t)kvw * 4);
        memcpy(vc + (size_t)(p0 + i) * kvw, vn + (size_t)i * kvw, (size_t)kvw * 4);
        cpu->ops->attention(cpu, q + i * ldq, ldq, hd, 1, p0 + i, kc, vc, &d, o + i * ldq, ldq);
    }
    cmp("attention_runs, one sequence's steps in one submission", dout, o, (size_t)steps * ldq,
        FP32_TOL);
    cmp("attention_runs, one sequence's K cache", dkc, kc, cap, 0.0);
    gpu->ops->free(gpu, dkc), gpu->ops->free(gpu, dvc), gpu->ops->free(gpu, dq);
    gpu->ops->free(gpu, dkn), gpu->ops->free(gpu, dvn), gpu->ops->free(gpu, dout);
    free(kc), free(vc), free(q), free(kn), free(vn), free(o);
}

/* A run longer than a grid's 65535 rows: every new K/V row must reach the cache (the store
 * kernels walk the rows; a launch of one block row per token would fail). Only the caches are
 * compared: a CPU reference of the attention itself over 65600 queries would take minutes. */
static void test_kv_store_long_run(void) {
    int n = 65600, hd = 4, kvw = hd;
    ts_attn_dims d = {1, 1, hd, 0.5f, 0, 0};
    float *kn = rnd((size_t)n * kvw, 1.0f), *vn = rnd((size_t)n * kvw, 1.0f);
    float *q = rnd((size_t)n * hd, 1.0f);
    float *dkn = dev(kn, (size_t)n * kvw), *dvn = dev(vn, (size_t)n * kvw);
    float *dq = dev(q, (size_t)n * hd), *dout = dev(q, (size_t)n * hd);
    for (int nr = 1; nr <= 2; nr++) { /* one run (no table), then beside a second run */
        float *zero = calloc((size_t)(n + 1) * kvw, 4);
        float *dkc = dev(zero, (size_t)(n + 1) * kvw), *dvc = dev(zero, (size_t)(n + 1) * kvw);
        float *dkc2 = dev(zero, (size_t)(n + 1) * kvw), *dvc2 = dev(zero, (size_t)(n + 1) * kvw);
        ts_seq_run runs[2] = {{0, n - 1, 1, 0, dkc, dvc}, {n - 1, 1, 0, 0, dkc2, dvc2}};
        if (nr == 1) runs[0].len = n;
        gpu->ops->attention_runs(gpu, dq, hd, hd, dkn, dvn, &d, runs, nr, dout, hd);
        float *got = host(dvc, (size_t)(n + 1) * kvw);
        int len = runs[0].len;
        CHECKF(memcmp(got + kvw, vn, (size_t)len * kvw * 4) == 0,
               "%d run(s): a %d-token run's V rows did not all reach the cache", nr, len);
        free(got);
        gpu->ops->free(gpu, dkc), gpu->ops->free(gpu, dvc);
        gpu->ops->free(gpu, dkc2), gpu->ops->free(gpu, dvc2);
        free(zero);
    }
    gpu->ops->free(gpu, dkn), gpu->ops->free(gpu, dvn), gpu->ops->free(gpu, dq);
    gpu->ops->free(gpu, dout);
    free(kn), free(vn), free(q);
}

static void test_attention_runs(void) {
    ts_backend *fp32 = gpu_with("TESSERA_CUDA_ATTN_MMA", "0", NULL, NULL);
    if (fp32) {
        test_attention_runs_case(fp32, 3, (int[]){1, 3, 1}, (int[]){1500, 40, 700},
                                 "attention_runs, long contexts");
        /* prompts of 40 and 70 queries (the tensor-core kernel, run by run) beside a decode
         * token (the fp32 kernels') */
        test_attention_runs_case(fp32, 3, (int[]){40, 1, 70}, (int[]){0, 700, 20},
                                 "attention_runs, prompts");
        /* a prompt of 31 queries (just short of the tensor cores) beside one of 32 */
        test_attention_runs_case(fp32, 2, (int[]){31, 32, 0}, (int[]){5, 300, 0},
                                 "attention_runs, prompts at the threshold");
        /* one sequence (decode of one stream, and a prompt - the tensor-core kernel): no run
         * table */
        test_attention_runs_case(fp32, 1, (int[]){1, 0, 0}, (int[]){1500, 0, 0},
                                 "attention_runs, one sequence's decode token");
        test_attention_runs_case(fp32, 1, (int[]){70, 0, 0}, (int[]){20, 0, 0},
                                 "attention_runs, one sequence's prompt");
        ts_backend_free(fp32);
    }
    test_attention_one_seq_steps();
    test_kv_store_long_run();
}

/* A [rows, cols] weight of dtype made from random floats; *f32 gets its exact values. */
static ts_tensor make_weight(ts_dtype dt, int rows, int cols, float **f32) {
    float *src = rnd((size_t)rows * cols, 0.5f);
    size_t rb = ts_dtype_row_bytes(dt, cols);
    uint8_t *data = malloc(rb * rows);
    *f32 = malloc((size_t)rows * cols * sizeof(float));
    for (int r = 0; r < rows; r++) {
        ts_quantize_row(dt, src + (size_t)r * cols, data + rb * r, cols);
        ts_dequantize_row(dt, data + rb * r, *f32 + (size_t)r * cols, cols);
    }
    free(src);
    ts_tensor t = {dt, 2, {rows, cols, 1, 1, 1, 1}, data, rb * rows};
    return t;
}

/* The bound of a device matmul against the exact fp32 product: where the tensor cores take
 * it (16-bit weights from 4 tokens, quantized from 3: cuda_matmul.cu's skinny_from) the
 * activations go in two 16-bit parts (~1e-5), and quantized weights decoded to bf16 (each
 * weight rounded by up to 2^-9, ~1e-3 over a dot product): in the tiles of the tensor-core GEMM
 * up to 64 tokens, as a whole bf16 copy for cuBLAS above. Fewer tokens: the GEMV, exact fp32. */
static double gemm_tol(ts_dtype dt, int n) {
    bool half = dt == TS_DTYPE_F16 || dt == TS_DTYPE_BF16;
    if (dt == TS_DTYPE_F32 || n < (half ? 4 : 3)) return FP32_TOL;
    return half ? 1e-4 : 3e-3;
}

/* One matmul of W on the device against the CPU's fp32 product over its exact values Wf, for n
 * random tokens whose rows lie ldx (x) and ldy (y) apart, within the path's bound. */
static void matmul_vs_cpu(const ts_tensor *W, const ts_tensor *Wf, int n, int64_t ldx,
                          int64_t ldy) {
    int64_t rows = ts_tensor_rows(W), cols = ts_tensor_cols(W);
    float *x = rnd((size_t)n * ldx, 1.0f), *y = calloc((size_t)n * ldy, 4);
    float *dx = dev(x, (size_t)n * ldx), *dy = dev(y, (size_t)n * ldy);
    cpu->ops->matmul(cpu, Wf, x, ldx, n, y, ldy);
    gpu->ops->matmul(gpu, W, dx, ldx, n, dy, ldy);
    char what[64];
    snprintf(what, sizeof what, "matmul %s %lldx%lld n=%d", ts_dtype_name(W->dtype),
             (long long)rows, (long long)cols, n);
    cmp(what, dy, y, (size_t)n * ldy, gemm_tol(W->dtype, n));
    gpu->ops->free(gpu, dx), gpu->ops->free(gpu, dy);
    free(x), free(y);
}

/* matmul and get_rows for each dtype and token count, against the CPU's fp32 matmul over the
 * exact weight values (the CPU's quantized kernels round the activations to int8, so they are
 * no reference for a device that keeps them fp32). BF16/F16 prefill splits the activations
 * into two 16-bit parts for the tensor cores: a slightly looser bound there. */
static void test_matmul(void) {
    ts_dtype dts[] = {TS_DTYPE_F32, TS_DTYPE_F16, TS_DTYPE_BF16, TS_DTYPE_Q8_0, TS_DTYPE_Q4_K,
                      TS_DTYPE_Q6_K, TS_DTYPE_Q4_0};
    /* 4..64 tokens of 16-bit weights, 8..64 of quantized: the tensor-core GEMM (2, 4 and 8 token
     * groups); 65 and the other types: cuBLAS */
    int ns[] = {1, 3, 8, 9, 20, 64, 65};
    int rows = 300, cols = 512;
    int64_t ldx = cols + 4, ldy = rows + 2;
    /* few long rows: the decode kernel splits each row over several warps */
    for (size_t di = 0; di < sizeof dts / sizeof *dts; di++) {
        float *wf;
        int r2 = 37, c2 = 4096;
        ts_tensor W = make_weight(dts[di], r2, c2, &wf);
        ts_tensor Wf = {TS_DTYPE_F32, 2, {r2, c2, 1, 1, 1, 1}, wf, (uint64_t)r2 * c2 * 4};
        for (int n = 1; n <= 8; n += 7)
            matmul_vs_cpu(&W, &Wf, n, c2, r2);
        kept_extra((void *)W.data);
        free(wf);
    }
    /* 24 and 64 tokens on 1024 x 2048 weights, the 0.8B's output projection's shape: 64-row
     * blocks in clusters of 16 (skinny_ks16_go; of 8 with TESSERA_CUDA_SKINNY_KS16=0) */
    for (int ci = 0; ci < 2; ci++) {
        float *wf;
        ts_dtype dt = ci ? TS_DTYPE_Q4_K : TS_DTYPE_BF16;
        ts_tensor W = make_weight(dt, 1024, 2048, &wf);
        ts_tensor Wf = {TS_DTYPE_F32, 2, {1024, 2048, 1, 1, 1, 1}, wf, (uint64_t)1024 * 2048 * 4};
        matmul_vs_cpu(&W, &Wf, 64, 2048, 1024);
        matmul_vs_cpu(&W, &Wf, 24, 2048, 1024);
        kept_extra((void *)W.data);
        free(wf);
    }
    /* 16-bit weights whose shapes give the tensor-core GEMM (cuda_gemm_skinny.cu) column
     * splits over 1, 2 and 4 blocks on an H200 (the 300 x 512 ones below: 8) */
    for (int ci = 0; ci < 6; ci++) {
        ts_dtype dt = ci & 1 ? TS_DTYPE_F16 : TS_DTYPE_BF16;
        int r2 = (int[]){40000, 20000, 700}[ci / 2], c2 = (int[]){64, 128, 192}[ci / 2];
        int n = (int[]){33, 17, 64}[ci / 2];
        float *wf;
        ts_tensor W = make_weight(dt, r2, c2, &wf);
        ts_tensor Wf = {TS_DTYPE_F32, 2, {r2, c2, 1, 1, 1, 1}, wf, (uint64_t)r2 * c2 * 4};
        matmul_vs_cpu(&W, &Wf, n, c2, r2);
        kept_extra((void *)W.data);
        free(wf);
    }
    for (size_t di = 0; di < sizeof dts / sizeof *dts; di++) {
        float *wf;
        ts_tensor W = make_weight(dts[di], rows, cols, &wf);
        ts_tensor Wf = {TS_DTYPE_F32, 2, {rows, cols, 1, 1, 1, 1}, wf,
                        (uint64_t)rows * cols * 4};
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            matmul_vs_cpu(&W, &Wf, ns[ni], ldx, ldy);
        /* matmul_n: this weight with an F32 one of other rows (its own launch) and itself
         * again (the same launch), n <= 8 and n > 8 */
        for (int nn = 0; nn < 3; nn++) {
            int n = (int[]){3, 12, 48}[nn];
            float *x = rnd((size_t)n * ldx, 1.0f), *dx = dev(x, (size_t)n * ldx);
            float *wf2 = rnd((size_t)77 * cols, 0.5f);
            ts_tensor W2 = {TS_DTYPE_F32, 2, {77, cols, 1, 1, 1, 1}, wf2, (uint64_t)77 * cols * 4};
            const ts_tensor *Ws[3] = {&W, &W2, &W};
            float *ref[3], *dys[3];
            int64_t lds[3] = {rows + 1, 80, rows};
            for (int j = 0; j < 3; j++) {
                size_t ny = (size_t)n * lds[j];
                ref[j] = calloc(ny, 4);
                dys[j] = dev(ref[j], ny);
                cpu->ops->matmul(cpu, j == 1 ? &W2 : &Wf, x, ldx, n, ref[j], lds[j]);
            }
            gpu->ops->matmul_n(gpu, Ws, 3, dx, ldx, n, NULL, dys, lds);
            for (int j = 0; j < 3; j++) {
                char what[64];
                snprintf(what, sizeof what, "matmul_n %s n=%d #%d", ts_dtype_name(dts[di]), n, j);
                cmp(what, dys[j], ref[j], (size_t)n * lds[j],
                    gemm_tol(j == 1 ? TS_DTYPE_F32 : dts[di], n));
                gpu->ops->free(gpu, dys[j]);
                free(ref[j]);
            }
            gpu->ops->free(gpu, dx);
            free(x);
            kept_extra(wf2);
        }
        int32_t ids[5] = {0, 299, 7, 7, 150};
        float *o = calloc((size_t)5 * cols, 4), *dout = dev(o, (size_t)5 * cols);
        cpu->ops->get_rows(cpu, &W, ids, 5, 1.7f, o);
        gpu->ops->get_rows(gpu, &W, ids, 5, 1.7f, dout);
        cmp("get_rows", dout, o, (size_t)5 * cols, 0.0);
        gpu->ops->free(gpu, dout);
        free(o), free(wf);
        /* W.data stays allocated: the backend keys its device copy by this address */
        kept[di] = (void *)W.data;
    }
}

/* Q8_0, Q4_0 and Q5_0 rows that end in a partial group of the device's layout (672 columns: 21
 * blocks, groups of 8, 8 and 5) through every path by token count - the single-token kernel,
 * the general GEMV (3), the tensor-core GEMM (9, 20, 64) and the decoded copy for cuBLAS (65) -
 * against the CPU's fp32 matmul over the exact weights. */
/* GEMMs of more than 64 tokens go through cuBLASLt with one algorithm per bucket of token
 * counts (65-80, 81-96, 97-112, 113-128, 129-160, ...; cuda_gemm_lt.cu): right for every count,
 * and a count not seen before in a bucket already met asks for no new algorithm - a new shape's
 * heuristic and first kernel cost a prompt of a new length ~20 ms before. A weight shape of its
 * own, so that no other test has met its buckets. */
static void test_gemm_buckets(void) {
    const ts_dtype dts[2] = {TS_DTYPE_BF16, TS_DTYPE_F32};
    for (int di = 0; di < 2; di++) {
        float *wf;
        const int rows = 296, cols = 640;
        ts_tensor W = make_weight(dts[di], rows, cols, &wf);
        ts_tensor Wf = {TS_DTYPE_F32, 2, {rows, cols, 1, 1, 1, 1}, wf, (uint64_t)rows * cols * 4};
        const int first[2] = {113, 129}, more[2][3] = {{114, 120, 128}, {130, 150, 160}};
        for (int b = 0; b < 2; b++) {
            long a0 = ts_backend_cuda_lt_algos(gpu);
            matmul_vs_cpu(&W, &Wf, first[b], cols, rows);
            long a1 = ts_backend_cuda_lt_algos(gpu);
            for (int i = 0; i < 3; i++)
                matmul_vs_cpu(&W, &Wf, more[b][i], cols, rows);
            long a2 = ts_backend_cuda_lt_algos(gpu);
            CHECKF(a1 > a0 && a2 == a1,
                   "%s, the bucket of %d tokens: %ld algorithms asked for by its first count, "
                   "%ld more by three others",
                   ts_dtype_name(dts[di]), more[b][2], a1 - a0, a2 - a1);
        }
        kept_extra((void *)W.data);
        free(wf);
    }
}

static void test_q32_partial_group(void) {
    ts_dtype dts[] = {TS_DTYPE_Q8_0, TS_DTYPE_Q4_0, TS_DTYPE_Q5_0};
    int ns[] = {1, 3, 9, 20, 64, 65}, rows = 333, cols = 672;
    for (size_t di = 0; di < sizeof dts / sizeof *dts; di++) {
        float *wf;
        ts_tensor W = make_weight(dts[di], rows, cols, &wf);
        ts_tensor Wf = {TS_DTYPE_F32, 2, {rows, cols, 1, 1, 1, 1}, wf, (uint64_t)rows * cols * 4};
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            matmul_vs_cpu(&W, &Wf, ns[ni], cols, rows);
        kept_extra((void *)W.data);
        free(wf);
    }
}

/* The device's decoding of every quantized type, exactly: a GEMV against one-hot tokens gives a
 * column of the weights (w * 1 plus zeros), which must equal the CPU dequantizer's value - for
 * one token (the one-token kernels: unit32, cuda_gemv_one.cu's raw units) and for 2 (group8;
 * from 3 the tensor-core GEMM takes quantized weights, decoded to bf16). */
static void test_decode_exact(void) {
    ts_dtype dts[] = {TS_DTYPE_Q8_0, TS_DTYPE_Q4_0, TS_DTYPE_Q5_0, TS_DTYPE_Q4_K, TS_DTYPE_Q6_K};
    for (size_t di = 0; di < sizeof dts / sizeof *dts; di++) {
        /* 9 K-quant blocks: Q6_K's device layout groups 8 and 1; 67 blocks of 32 elements: 8
         * groups and 3 (q32_dev_codes) */
        int rows = 64, cols = dts[di] == TS_DTYPE_Q4_K || dts[di] == TS_DTYPE_Q6_K ? 2304 : 2144;
        float *wf;
        ts_tensor W = make_weight(dts[di], rows, cols, &wf);
        for (int n = 1; n <= 2; n++) {
            float *x = calloc((size_t)n * cols, 4), *y = calloc((size_t)n * rows, 4);
            float *dx = dev(x, (size_t)n * cols), *dy = dev(y, (size_t)n * rows);
            int bad = 0, first = -1;
            for (int k0 = 0; k0 < cols; k0 += n) {
                int m = cols - k0 < n ? cols - k0 : n;
                memset(x, 0, (size_t)n * cols * 4);
                for (int t = 0; t < m; t++)
                    x[(size_t)t * cols + k0 + t] = 1.0f;
                gpu->ops->upload(gpu, dx, x, (size_t)n * cols * 4);
                gpu->ops->matmul(gpu, &W, dx, cols, n, dy, rows);
                float *got = host(dy, (size_t)n * rows);
                for (int t = 0; t < m; t++)
                    for (int r = 0; r < rows; r++)
                        if (got[(size_t)t * rows + r] != wf[(size_t)r * cols + k0 + t]) {
                            if (!bad++) first = r * cols + k0 + t;
                        }
                free(got);
            }
            CHECKF(bad == 0,
                   "%s decode, %d token(s): %d of %d weights differ from the CPU's (first "
                   "at row %d column %d)",
                   ts_dtype_name(dts[di]), n, bad, rows * cols, first / cols, first % cols);
            gpu->ops->free(gpu, dx), gpu->ops->free(gpu, dy);
            free(x), free(y);
        }
        kept_extra((void *)W.data);
        free(wf);
    }
}

/* The 16-bit activations of the tensor-core GEMM (8 tokens) and of cuBLAS (70) keep each
 * token's range: tokens of magnitude 1e-7 .. 1e7 (fp16 alone holds 6e-5 .. 65504: F16 weights'
 * activations are scaled per token), one with a NaN (its outputs NaN), each token's products
 * within the bound of its own scale. */
static void test_split_range(void) {
    ts_dtype dts[] = {TS_DTYPE_BF16, TS_DTYPE_F16, TS_DTYPE_Q4_K};
    int rows = 300, cols = 512;
    for (size_t ci = 0; ci < 2 * sizeof dts / sizeof *dts; ci++) {
        size_t di = ci / 2;
        int n = ci % 2 ? 70 : 8;
        float *wf;
        ts_tensor W = make_weight(dts[di], rows, cols, &wf);
        ts_tensor Wf = {TS_DTYPE_F32, 2, {rows, cols, 1, 1, 1, 1}, wf, (uint64_t)rows * cols * 4};
        float *x = rnd((size_t)n * cols, 1.0f), *y = calloc((size_t)n * rows, 4);
        for (int t = 0; t < n; t++)
            for (int i = 0; i < cols; i++) x[t * cols + i] *= powf(10.0f, (float)(2 * (t % 8) - 7));
        x[6 * cols + 5] = NAN;
        float *dx = dev(x, (size_t)n * cols), *dy = dev(y, (size_t)n * rows);
        cpu->ops->matmul(cpu, &Wf, x, cols, n, y, rows);
        gpu->ops->matmul(gpu, &W, dx, cols, n, dy, rows);
        float *got = host(dy, (size_t)n * rows);
        for (int t = 0; t < n; t++) {
            if (t == 6) {
                int nan = 0;
                for (int r = 0; r < rows; r++) nan += isnan(got[t * rows + r]);
                CHECKF(nan == rows, "split range %s n=%d: %d of %d outputs of the NaN token NaN",
                       ts_dtype_name(dts[di]), n, nan, rows);
                continue;
            }
            double rel = tu_rel_l2(got + t * rows, y + t * rows, rows);
            CHECKF(rel <= gemm_tol(dts[di], n), "split range %s n=%d token of 1e%d: rel L2 %.3g",
                   ts_dtype_name(dts[di]), n, 2 * (t % 8) - 7, rel);
        }
        gpu->ops->free(gpu, dx), gpu->ops->free(gpu, dy);
        free(x), free(y), free(got), free(wf);
        kept_extra((void *)W.data);
    }
}

/* matmul_glu (a gated MLP's two projections and activation): the fused GEMV (n <= 8) must give
 * the bits of the composed ops on the device (matmul_n, then swiglu / gelu_mul), and both the
 * CPU's fp32 result within the matmul bounds; above 8 tokens the op composes itself. */
static void test_matmul_glu(void) {
    ts_dtype dts[] = {TS_DTYPE_F32, TS_DTYPE_BF16, TS_DTYPE_Q4_K, TS_DTYPE_Q8_0, TS_DTYPE_Q6_K};
    int rows = 200, cols = 256;
    int64_t ldx = cols + 4, ldt = rows + 3;
    for (size_t di = 0; di < sizeof dts / sizeof *dts; di++) {
        float *fg, *fu;
        ts_tensor Wg = make_weight(dts[di], rows, cols, &fg), Wu = make_weight(dts[di], rows, cols, &fu);
        ts_tensor Fg = {TS_DTYPE_F32, 2, {rows, cols, 1, 1, 1, 1}, fg, (uint64_t)rows * cols * 4};
        ts_tensor Fu = {TS_DTYPE_F32, 2, {rows, cols, 1, 1, 1, 1}, fu, (uint64_t)rows * cols * 4};
        for (int ni = 0; ni < 3; ni++) {
            int n = (int[]){1, 3, 12}[ni];
            for (int gelu = 0; gelu < 2; gelu++) {
                size_t nt = (size_t)n * ldt;
                float *x = rnd((size_t)n * ldx, 1.0f), *dx = dev(x, (size_t)n * ldx);
                float *tg = calloc(nt, 4), *tu = calloc(nt, 4), *ref = calloc(nt, 4);
                cpu->ops->matmul(cpu, &Fg, x, ldx, n, tg, ldt);
                cpu->ops->matmul(cpu, &Fu, x, ldx, n, tu, ldt);
                (gelu ? cpu->ops->gelu_mul : cpu->ops->swiglu)(cpu, tg, tu, ldt, n, rows, ref, ldt);
                float *dg = dev(tg, nt), *du = dev(tu, nt), *dc = dev(tg, nt), *df = dev(tg, nt);
                const ts_tensor *W[2] = {&Wg, &Wu};
                float *y[2] = {dg, du};
                int64_t ldy[2] = {ldt, ldt};
                gpu->ops->matmul_n(gpu, W, 2, dx, ldx, n, NULL, y, ldy);
                (gelu ? gpu->ops->gelu_mul : gpu->ops->swiglu)(gpu, dg, du, ldt, n, rows, dc, ldt);
                /* in place (out = tg, as Gemma calls it) for one case */
                float *out = ni == 1 ? dg : df;
                gpu->ops->matmul_glu(gpu, &Wg, &Wu, dx, ldx, n, NULL, gelu, dg, du, ldt, out, ldt);
                float *a = host(dc, nt), *b = host(out, nt);
                char what[80];
                snprintf(what, sizeof what, "matmul_glu %s n=%d %s", ts_dtype_name(dts[di]), n,
                         gelu ? "gelu" : "silu");
                cmp(what, out, ref, nt, gemm_tol(dts[di], n));
                for (int t = 0; t < n; t++)
                    CHECKF(memcmp(a + t * ldt, b + t * ldt, (size_t)rows * 4) == 0,
                           "%s: not the bits of matmul_n + the activation (token %d)", what, t);
                gpu->ops->free(gpu, dx), gpu->ops->free(gpu, dg), gpu->ops->free(gpu, du);
                gpu->ops->free(gpu, dc), gpu->ops->free(gpu, df);
                free(x), free(tg), free(tu), free(ref), free(a), free(b);
            }
        }
        kept_extra((void *)Wg.data), kept_extra((void *)Wu.data);
        free(fg), free(fu);
    }
}

/* A case of the tensor-core GEMM tests: nw weights (one, or two in one launch) of rs[j] x cols
 * of type dt, and their exact values as F32 tensors for the CPU. */
typedef struct {
    int nw, rs[2], cols;
    ts_tensor W[2], Wf[2];
    float *f[2];
} skinny_case;

static void skinny_case_make(skinny_case *k, ts_dtype dt, int rows, int r1, int cols) {
    *k = (skinny_case){.nw = r1 ? 2 : 1, .rs = {rows, r1}, .cols = cols};
    for (int j = 0; j < k->nw; j++) {
        k->W[j] = make_weight(dt, k->rs[j], cols, &k->f[j]);
        k->Wf[j] = (ts_tensor){
            TS_DTYPE_F32, 2, {k->rs[j], cols, 1, 1, 1, 1}, k->f[j], (uint64_t)k->rs[j] * cols * 4};
    }
}

static void skinny_case_free(skinny_case *k) {
    for (int j = 0; j < k->nw; j++) /* the weights' host data stays: the backends key by it */
        kept_extra((void *)k->W[j].data), free(k->f[j]);
}

/* The CPU's y0 + W x for n tokens of x, y0 random with the residual add and zero without: y0[j]
 * and want[j] for each weight, new arrays. */
static void skinny_want(const skinny_case *k, const float *x, int n, bool add, float **y0,
                        float **want) {
    for (int j = 0; j < k->nw; j++) {
        y0[j] = rnd((size_t)n * k->rs[j], add ? 1.0f : 0.0f);
        want[j] = calloc((size_t)n * k->rs[j], 4);
        cpu->ops->matmul(cpu, &k->Wf[j], x, k->cols, n, want[j], k->rs[j]);
        for (size_t i = 0; i < (size_t)n * k->rs[j]; i++)
            want[j][i] += y0[j][i];
    }
}

/* The case on backend be: y0 uploaded, then matmul_add of the first weight (add) or matmul_n of
 * all; got[j] the results as new host arrays. */
static void skinny_run(ts_backend *be, const skinny_case *k, const float *x, int n,
                       float *const *y0, bool add, float **got) {
    float *dx = be->ops->alloc(be, (size_t)n * k->cols * 4), *dy[2];
    be->ops->upload(be, dx, x, (size_t)n * k->cols * 4);
    for (int j = 0; j < k->nw; j++) {
        dy[j] = be->ops->alloc(be, (size_t)n * k->rs[j] * 4);
        be->ops->upload(be, dy[j], y0[j], (size_t)n * k->rs[j] * 4);
    }
    if (add) {
        be->ops->matmul_add(be, &k->W[0], dx, k->cols, n, dy[0], k->rs[0]);
    } else {
        const ts_tensor *Ws[2] = {&k->W[0], &k->W[1]};
        int64_t lds[2] = {k->rs[0], k->rs[1]};
        be->ops->matmul_n(be, Ws, k->nw, dx, k->cols, n, NULL, dy, lds);
    }
    for (int j = 0; j < k->nw; j++) {
        got[j] = host_of(be, dy[j], (size_t)n * k->rs[j]);
        be->ops->free(be, dy[j]);
    }
    be->ops->free(be, dx);
}

/* The tensor-core GEMM's ring form for 16-bit weights (cuda_gemm_skinny.cu's k_skinny_ring:
 * weights and activations by cp.async into a ring of stages) against its registers' form. Three
 * backends: the ring wherever it may (TESSERA_CUDA_SKINNY_RING=1), the default without the
 * 17-32-token ring (=0: the short grids below take, for 9-16 tokens, the deep ring of 8 stages
 * in 64-row blocks) and the registers' form everywhere (=0 and TESSERA_CUDA_SKINNY_DEEP=0). All
 * issue the same mmas in the same order, so the sums must be the same bits; and all the CPU's fp32
 * product within the bound. The shapes take, on an H200 (132 multiprocessors), clusters of 1,
 * 2, 4 and 8 blocks (40000, 20000, 10000 and 1000 rows), 2 to 10 steps of 64 columns a block, a
 * last row block cut short (every row count here but 10000 and 20000 ends mid-block), token
 * groups of 2, 4 and 8 (9..64 tokens, some groups partly empty); the residual add (matmul_add)
 * and two weights in one launch (matmul_n); and a width of 96 columns, not whole steps, which
 * stays on the registers' form. The 1000 + 300, 700 and 300-row launches are clusters of 8 that
 * leave the GPU short: blocks of 64 rows but in the first backend (128, the ring's), so the bits
 * compare the two tilings too; the 700 rows' 9 steps a block go round the deep ring. */
static void test_skinny_ring(bool quick) {
    ts_backend *bes[3] = {NULL, NULL, NULL};
    static const char *ring_env[3] = {"1", "0", "0"}, *deep_env[3] = {"1", "1", "0"};
    ts_status st = TS_OK;
    /* clusters of 16 (33-64 tokens' short grids) split the columns otherwise, and the wgmma form
     * (33-64 tokens, test_skinny_wg) adds each token's hi and lo sums apart: other bits */
    env_saved ks16 = env_set("TESSERA_CUDA_SKINNY_KS16", "0"),
              wg = env_set("TESSERA_CUDA_SKINNY_WG", "0");
    for (int b = 0; b < 3 && st == TS_OK; b++) {
        env_saved ring = env_set("TESSERA_CUDA_SKINNY_RING", ring_env[b]),
                  deep = env_set("TESSERA_CUDA_SKINNY_DEEP", deep_env[b]);
        st = ts_backend_cuda_create(0, &bes[b]);
        env_restore(ring), env_restore(deep);
    }
    env_restore(ks16), env_restore(wg);
    CHECK(st == TS_OK);
    if (st != TS_OK) {
        for (int b = 0; b < 3; b++)
            if (bes[b]) ts_backend_free(bes[b]);
        return;
    }
    ts_dtype dts[] = {TS_DTYPE_BF16, TS_DTYPE_F16};
    static const int shapes[][3] = {/* rows, cols, rows of a second weight in the launch */
                                    {40000, 640, 0},   {20000, 640, 0}, {10000, 1024, 0},
                                    {1000, 2048, 300}, {300, 1024, 0},  {1000, 96, 0},
                                    {700, 4608, 0}};
    int ns[] = {9, 16, 17, 40, 64};
    for (size_t di = 0; di < sizeof dts / sizeof *dts; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            int rows = shapes[si][0], cols = shapes[si][1];
            if (quick && rows > 10000) continue; /* sanitizers: the large grids only add time */
            skinny_case k;
            skinny_case_make(&k, dts[di], rows, shapes[si][2], cols);
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                int n = ns[ni];
                bool add = ni & 1; /* every other token count with the residual add */
                float *x = rnd((size_t)n * cols, 1.0f), *y0[2], *want[2], *got[3][2];
                skinny_want(&k, x, n, add, y0, want);
                for (int b = 0; b < 3; b++)
                    skinny_run(bes[b], &k, x, n, y0, add, got[b]);
                for (int j = 0; j < (add ? 1 : k.nw); j++) {
                    char what[96];
                    snprintf(what, sizeof what, "skinny ring %s %dx%d (weight %d) n=%d%s",
                             ts_dtype_name(dts[di]), k.rs[j], cols, j, n, add ? " add" : "");
                    size_t cnt = (size_t)n * k.rs[j];
                    for (int b = 0; b < 2; b++) {
                        CHECKF(memcmp(got[b][j], got[2][j], cnt * 4) == 0,
                               "%s: backend %d not the registers' form's bits", what, b);
                        double rel = tu_rel_l2(got[b][j], want[j], (long)cnt);
                        CHECKF(rel <= gemm_tol(dts[di], n), "%s: backend %d rel L2 %.3g", what, b,
                               rel);
                    }
                }
                for (int j = 0; j < k.nw; j++)
                    free(y0[j]), free(want[j]), free(got[0][j]), free(got[1][j]), free(got[2][j]);
                free(x);
            }
            skinny_case_free(&k);
        }
    for (int b = 0; b < 3; b++)
        ts_backend_free(bes[b]);
}

/* The wgmma GEMM for 9-64 tokens of 16-bit weights (cuda_gemm_wg.cu: weights and activations by
 * bulk tensor copies into a ring of 3 stages, wgmma m64n32k16 / m64n64k16 / m64n128k16 for token
 * groups of 2, 4 and 8) against the mma.sync kernels (a backend made with
 * TESSERA_CUDA_SKINNY_WG=0) and the CPU's fp32 product; its own backend takes it from 9 tokens
 * (TESSERA_CUDA_WG_MIN=9). The shapes take, on an H200 (132 multiprocessors, 64-row blocks),
 * clusters of 1, 2, 4, 8 and 16 blocks (40000, 5000, 3000, 1000 + 300 and 700 or 1024 rows; 9-16
 * tokens up to 8), from 2 to 10 stages a block (the ring goes round more than three times), last
 * row blocks cut short (the copies' rows past the end come as zeros), two weights in one launch,
 * the residual add; 9 to 64 tokens (the activations' lo box starts at row n, so n changes where
 * every lo part comes from). A token's sums do not depend on the others: the first 9, 17 and 33
 * tokens of 16, 32 and 64 must be the bits of the 9-, 17- and 33-token products. On a device of
 * compute capability 9.0 the form must have run. Skipped when the run was started with the form
 * off (TESSERA_CUDA_SKINNY_WG=0: a sanitizer pass over the other kernels alone). */
static void test_skinny_wg(bool quick) {
    const char *off = getenv("TESSERA_CUDA_SKINNY_WG");
    if (off && strcmp(off, "0") == 0) {
        printf("  wgmma GEMM: skipped (TESSERA_CUDA_SKINNY_WG=0)\n");
        return;
    }
    ts_backend *ref = NULL, *wg = NULL;
    env_saved sv = env_set("TESSERA_CUDA_SKINNY_WG", "0");
    ts_status st = ts_backend_cuda_create(0, &ref);
    env_restore(sv);
    sv = env_set("TESSERA_CUDA_WG_MIN", "9");
    if (st == TS_OK) st = ts_backend_cuda_create(0, &wg);
    env_restore(sv);
    CHECK(st == TS_OK);
    if (st != TS_OK) {
        if (ref) ts_backend_free(ref);
        return;
    }
    ts_dtype dts[] = {TS_DTYPE_BF16, TS_DTYPE_F16};
    static const int shapes[][3] = {/* rows, cols, rows of a second weight in the launch */
                                    {40000, 640, 0},   {5000, 1024, 0}, {3000, 1024, 0},
                                    {1000, 2048, 300}, {700, 4608, 0},  {1024, 2048, 0}};
    int ns[] = {9, 16, 17, 24, 32, 33, 40, 64};
    for (size_t di = 0; di < sizeof dts / sizeof *dts; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            int rows = shapes[si][0], cols = shapes[si][1];
            if (quick && rows > 10000) continue;
            skinny_case k;
            skinny_case_make(&k, dts[di], rows, shapes[si][2], cols);
            float *x = rnd((size_t)64 * cols, 1.0f), *first[2] = {NULL, NULL};
            int nfirst = 0;
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                int n = ns[ni];
                bool add = n == 24 || n == 40;      /* the residual add for two counts */
                float *y0[2], *want[2], *got[2][2]; /* wgmma, mma.sync */
                skinny_want(&k, x, n, add, y0, want);
                skinny_run(wg, &k, x, n, y0, add, got[0]);
                skinny_run(ref, &k, x, n, y0, add, got[1]);
                for (int j = 0; j < (add ? 1 : k.nw); j++) {
                    char what[96];
                    snprintf(what, sizeof what, "skinny wg %s %dx%d (weight %d) n=%d%s",
                             ts_dtype_name(dts[di]), k.rs[j], cols, j, n, add ? " add" : "");
                    long cnt = (long)n * k.rs[j];
                    double rel = tu_rel_l2(got[0][j], want[j], cnt);
                    CHECKF(rel <= gemm_tol(dts[di], n), "%s: rel L2 %.3g against the CPU", what,
                           rel);
                    double rel_mma = tu_rel_l2(got[0][j], got[1][j], cnt);
                    CHECKF(rel_mma <= 1e-6, "%s: rel L2 %.3g against mma.sync", what, rel_mma);
                    if (n == 9 || n == 17 || n == 33) { /* the first count of a token group */
                        free(first[j]);
                        first[j] = got[0][j];
                        got[0][j] = NULL;
                        nfirst = n;
                    } else if ((n == 16 || n == 32 || n == 64) && first[j]) {
                        CHECKF(memcmp(first[j], got[0][j], (size_t)nfirst * k.rs[j] * 4) == 0,
                               "%s: the first %d tokens not the %d-token product's bits", what,
                               nfirst, nfirst);
                    }
                }
                for (int j = 0; j < k.nw; j++)
                    free(y0[j]), free(want[j]), free(got[0][j]), free(got[1][j]);
            }
            for (int j = 0; j < k.nw; j++)
                free(first[j]);
            skinny_case_free(&k);
            free(x);
        }
    bool hopper, ref_hopper;
    long ran = ts_backend_cuda_wg_launches(wg, &hopper);
    printf("  wgmma GEMM launches: %ld (compute capability 9.0: %s)\n", ran, hopper ? "yes" : "no");
    if (hopper) CHECKF(ran > 0, "the wgmma GEMM did not run on a compute capability 9.0 device");
    CHECKF(ts_backend_cuda_wg_launches(ref, &ref_hopper) == 0,
           "TESSERA_CUDA_SKINNY_WG=0 still ran the wgmma GEMM");
    ts_backend_free(ref);
    ts_backend_free(wg);
}

/* n tokens of the single-token GEMV's cases through backend be: the gated MLP of W[0] and W[1]
 * (glu; GELU where gelu, else SiLU), W[0] x added to y (add), or the nw (up to 4) stacked
 * weights' products (matmul_n) - the input norm's weights nwt folded in where normed. Token t's x
 * at x + t * ldx (host); on the device its outputs lie in a row 4 floats longer than they are.
 * The outputs as one new host array, token after token: the gated MLP's rs[0] values, or the
 * stack's rows one weight after the other (rs[j]: weight j's rows; W[0]'s alone where nw is 1);
 * y0: their values before, packed the same way (NULL: left as the allocation has them, for an
 * op that overwrites). */
static float *gemv1_run(ts_backend *be, const ts_tensor *W, int nw, const int *rs, int cols, int n,
                        const float *x, int64_t ldx, const float *nwt, float eps, bool normed,
                        bool glu, bool gelu, bool add, const float *y0) {
    int r0 = rs[0], tot = r0;
    for (int j = 1; j < nw && !glu; j++)
        tot += rs[j];
    int64_t ldy = tot + 4;
    size_t xs = (size_t)n * ldx * 4, ys = (size_t)n * ldy * 4;
    float *dx = be->ops->alloc(be, xs), *dnw = be->ops->alloc(be, (size_t)cols * 4);
    float *dscr = be->ops->alloc(be, xs), *dy = be->ops->alloc(be, ys), *dtmp[2];
    float *yh = calloc((size_t)n * ldy, 4);
    be->ops->upload(be, dx, x, xs);
    be->ops->upload(be, dnw, nwt, (size_t)cols * 4);
    if (y0) {
        for (int t = 0; t < n; t++)
            memcpy(yh + t * ldy, y0 + (size_t)t * tot, (size_t)tot * 4);
        be->ops->upload(be, dy, yh, ys);
    }
    for (int j = 0; j < 2; j++)
        dtmp[j] = be->ops->alloc(be, (size_t)n * r0 * 4);
    ts_prenorm pre = {dnw, eps, dscr};
    if (glu) {
        be->ops->matmul_glu(be, &W[0], &W[1], dx, ldx, n, normed ? &pre : NULL, gelu, dtmp[0],
                            dtmp[1], r0, dy, ldy);
    } else if (add) {
        be->ops->matmul_add(be, &W[0], dx, ldx, n, dy, ldy);
    } else {
        const ts_tensor *Ws[4];
        float *yw[4];
        int64_t lds[4];
        for (int j = 0, off = 0; j < nw; off += rs[j++])
            Ws[j] = &W[j], yw[j] = dy + off, lds[j] = ldy;
        be->ops->matmul_n(be, Ws, nw, dx, ldx, n, normed ? &pre : NULL, yw, lds);
    }
    be->ops->download(be, yh, dy, ys);
    float *got = malloc((size_t)n * tot * 4);
    for (int t = 0; t < n; t++)
        memcpy(got + (size_t)t * tot, yh + t * ldy, (size_t)tot * 4);
    float *bufs[] = {dx, dnw, dscr, dy, dtmp[0], dtmp[1]};
    for (int i = 0; i < 6; i++)
        be->ops->free(be, bufs[i]);
    free(yh);
    return got;
}

/* One token of quantized weights (Q4_K, Q6_K, Q8_0, Q4_0, Q5_0) by integer dot products
 * (cuda_gemv_one.cu's g1_x8: x to int8 a 16-element run, dp4a against the codes), on a backend
 * made with the default form (TESSERA_CUDA_GEMV1_INT8=1: GEMVs of 2048 rows and more) against
 * the global one, made with the float decode (=0). Where the integer form runs - enough rows,
 * and a round covering the row - no further from the CPU's fp32 product than the CPU's own
 * quantized kernel (int8 activations a 32-element block) is, within a quarter; elsewhere
 * (1024-row GEMVs, rows past one round: 8192 columns, 4096 for Q8_0 or a gated MLP, 2048 for
 * Q8_0's) the float decode's bits. Plain, stacked, with the input norm
 * folded, added to y, and the gated MLP's form. */
static void test_gemv_int8(void) {
    ts_backend *i8 = gpu_with("TESSERA_CUDA_GEMV1_INT8", "1", NULL, NULL);
    if (!i8) return;
    enum { K4 = TS_DTYPE_Q4_K, K6 = TS_DTYPE_Q6_K, Q8 = TS_DTYPE_Q8_0, Q4 = TS_DTYPE_Q4_0 };
    enum { Q5 = TS_DTYPE_Q5_0 };
    static const int cases[][7] = {/* dtype, cols, rows, rows of a second weight, glu, norm, add */
                                   {K4, 1024, 6000, 5000, 0, 1, 0}, {K4, 1024, 2048, 0, 0, 0, 1},
                                   {K4, 2048, 4000, 0, 0, 1, 0},    {K4, 3584, 2048, 0, 0, 0, 1},
                                   {K4, 1024, 3584, 0, 1, 1, 0},    {K4, 3584, 2048, 0, 1, 0, 0},
                                   {K4, 1024, 1024, 0, 0, 1, 1},    {K4, 9216, 2500, 0, 0, 1, 0},
                                   {K4, 9216, 2100, 0, 1, 0, 0},    {K6, 1024, 30000, 0, 0, 0, 0},
                                   {K6, 1024, 9000, 300, 0, 1, 0},  {K6, 3584, 2048, 0, 0, 0, 1},
                                   {K6, 1024, 3584, 0, 1, 1, 0},    {K6, 3584, 1024, 0, 0, 0, 1},
                                   {K6, 9216, 2200, 0, 0, 0, 0},    {K4, 4608, 2600, 0, 1, 1, 0},
                                   {Q8, 640, 40000, 0, 0, 0, 0},    {Q8, 2048, 1024, 0, 0, 0, 1},
                                   {Q8, 1024, 2048, 0, 1, 1, 0},    {Q8, 3072, 2048, 0, 1, 0, 0},
                                   {Q4, 1024, 3000, 0, 1, 1, 0},    {Q4, 4096, 2500, 0, 0, 0, 1},
                                   {Q5, 640, 2048, 0, 1, 1, 0},     {Q5, 2144, 2100, 0, 0, 0, 1}};
    const float eps = 1e-6f;
    for (int ci = 0; ci < (int)(sizeof cases / sizeof *cases); ci++) {
        ts_dtype dt = (ts_dtype)cases[ci][0];
        int cols = cases[ci][1], r0 = cases[ci][2], r1 = cases[ci][3];
        bool glu = cases[ci][4], normed = cases[ci][5], add = cases[ci][6];
        int nw = glu || r1 ? 2 : 1, rs[2] = {r0, glu ? r0 : r1}, tot = glu ? r0 : r0 + r1;
        /* the units a lane keeps of a row (cuda_gemv_one.cu's g1_shape): a round covers 1024
         * columns each */
        int umax = (dt == TS_DTYPE_Q8_0 ? 4 : 8) / (glu ? 2 : 1);
        bool fallback = cols > 1024 * umax || tot < 2048;
        float *f[2] = {NULL, NULL}, *nwt = rnd(cols, 1.0f), *x = rnd(cols, 3.0f);
        float *y0 = rnd(tot, add ? 1.0f : 0.0f), *xn = calloc(cols, 4);
        ts_tensor W[2];
        for (int j = 0; j < nw; j++)
            W[j] = make_weight(dt, rs[j], cols, &f[j]);
        if (normed)
            cpu->ops->rmsnorm(cpu, x, cols, 1, cols, nwt, eps, xn, cols);
        else
            memcpy(xn, x, (size_t)cols * 4);
        /* want[0]: the fp32 product of the weights' values, want[1]: the CPU's quantized kernel */
        float *want[2];
        for (int w = 0; w < 2; w++) {
            float *prod[2];
            want[w] = calloc((size_t)tot, 4);
            for (int j = 0; j < nw; j++) {
                ts_tensor F = {
                    TS_DTYPE_F32, 2, {rs[j], cols, 1, 1, 1, 1}, f[j], (uint64_t)rs[j] * cols * 4};
                prod[j] = calloc(rs[j], 4);
                cpu->ops->matmul(cpu, w ? &W[j] : &F, xn, cols, 1, prod[j], rs[j]);
            }
            if (glu)
                cpu->ops->swiglu(cpu, prod[0], prod[1], r0, 1, r0, want[w], r0);
            else
                for (int j = 0, o = 0; j < nw; o += rs[j++])
                    for (int r = 0; r < rs[j]; r++)
                        want[w][o + r] = prod[j][r] + y0[o + r];
            for (int j = 0; j < nw; j++)
                free(prod[j]);
        }
        float *got[2];
        for (int b = 0; b < 2; b++) /* b = 0: integer dot products, 1: the float decode */
            got[b] = gemv1_run(b ? gpu : i8, W, nw, rs, cols, 1, x, cols, nwt, eps, normed, glu,
                               false, add, y0);
        char what[96];
        snprintf(what, sizeof what, "gemv %s int8 %d+%d x %d%s%s%s", ts_dtype_name(dt), r0, r1,
                 cols, glu ? " glu" : "", normed ? " normed" : "", add ? " add" : "");
        double rel = tu_rel_l2(got[0], want[0], tot), rel_cpu = tu_rel_l2(want[1], want[0], tot);
        bool same = memcmp(got[0], got[1], (size_t)tot * 4) == 0;
        if (fallback) {
            CHECKF(same, "%s: not the float decode's bits (too few rows, or past one round)", what);
        } else {
            CHECKF(rel <= 1.25 * rel_cpu + 1e-4,
                   "%s: rel L2 %.3g against the fp32 product, the CPU's quantized kernel %.3g",
                   what, rel, rel_cpu);
            CHECKF(!same, "%s: the float decode's bits - the integer form did not run", what);
        }
        if (ci == 0 || ci == 9 || ci == 16)
            printf("  %s int8: rel L2 %.2g against fp32 (the CPU's int8 kernel %.2g)\n",
                   ts_dtype_name(dt), rel, rel_cpu);
        for (int j = 0; j < nw; j++)
            kept_extra((void *)W[j].data), free(f[j]);
        free(nwt), free(x), free(y0), free(xn), free(want[0]), free(want[1]);
        free(got[0]), free(got[1]);
    }
    ts_backend_free(i8);
}

/* One token of quantized weights in cuda_gemv_one.cu's kernel (1, 2, 4 or 8 units of 32
 * elements a lane by the row's length, 1..8 rows a warp, long rows and tall matrices going
 * round; rows of whole and partial groups of 8 blocks in the device's layouts): for Q4_K and
 * Q6_K the bits of the general GEMV's one-token sums (a second backend made with
 * TESSERA_CUDA_GEMV1_KQUANT=0), whose lanes take the same units; for Q8_0, Q4_0 and Q5_0, whose
 * general GEMV gives a lane groups of 8 elements instead, the same within the GEMV's bound; and
 * for all the CPU's fp32 product within that bound. Plain (one or two stacked weights) and
 * the gated MLP's form; every other case with its input RMSNorm folded in (both kernels apply
 * it as they read x). */
static void test_gemv_one_kquant(void) {
    ts_backend *ref = gpu_with("TESSERA_CUDA_GEMV1_KQUANT", "0", NULL, NULL);
    if (!ref) return;
    enum { K4 = TS_DTYPE_Q4_K, K6 = TS_DTYPE_Q6_K, Q8 = TS_DTYPE_Q8_0, Q4 = TS_DTYPE_Q4_0 };
    enum { Q5 = TS_DTYPE_Q5_0 };
    static const int cases[][5] = {
        /* dtype, cols, rows of weight 0 and 1 (0: none), glu */
        {K4, 1024, 6000, 5000, 0},
        {K4, 1024, 300, 0, 0},
        {K4, 2048, 4000, 3000, 0},
        {K4, 3584, 1024, 1000, 0},
        {K4, 9216, 500, 0, 0},
        {K4, 1024, 30000, 0, 0},
        {K4, 1024, 3584, 0, 1},
        {K4, 2048, 6000, 0, 1},
        {K4, 3584, 1024, 0, 1},
        {K4, 9216, 300, 0, 1},
        {K4, 1024, 20000, 0, 1},
        {K6, 1024, 9000, 300, 0},
        {K6, 1024, 40000, 0, 0},
        {K6, 2048, 2000, 2000, 0},
        {K6, 3584, 1024, 0, 0},
        {K6, 9216, 700, 0, 0},
        {K6, 1024, 3584, 0, 1},
        {K6, 3584, 1024, 0, 1},
        /* 640 and 2144 columns: 20 and 67 blocks, a partial group of 4 and 3 */
        {Q8, 1024, 6000, 5000, 0},
        {Q8, 640, 100000, 0, 0},
        {Q8, 2144, 1500, 0, 0},
        {Q8, 1024, 3584, 0, 1},
        {Q4, 1024, 8000, 2000, 0},
        {Q4, 640, 3000, 0, 1},
        {Q4, 4096, 700, 0, 0},
        {Q5, 640, 4000, 1000, 0},
        {Q5, 640, 2048, 0, 1},
        {Q5, 2144, 900, 0, 0},
        {Q5, 1024, 20000, 0, 1}};
    for (int ci = 0; ci < (int)(sizeof cases / sizeof *cases); ci++) {
        ts_dtype dt = (ts_dtype)cases[ci][0];
        int cols = cases[ci][1], r0 = cases[ci][2], r1 = cases[ci][3];
        bool glu = cases[ci][4], normed = ci & 1; /* every other case with its input norm */
        int nw = r1 ? 2 : 1, rs[2] = {r0, glu ? r0 : r1};
        float eps = 1e-6f, *nwt = rnd(cols, 1.0f);
        float *f[2] = {NULL, NULL};
        ts_tensor W[2];
        for (int j = 0; j < (glu ? 2 : nw); j++)
            W[j] = make_weight(dt, rs[j], cols, &f[j]);
        float *x = rnd(cols, 3.0f), *want[2] = {calloc(r0, 4), calloc(rs[1] ? rs[1] : 1, 4)};
        float *xn = calloc(cols, 4);
        if (normed)
            cpu->ops->rmsnorm(cpu, x, cols, 1, cols, nwt, eps, xn, cols);
        else
            memcpy(xn, x, (size_t)cols * 4);
        for (int j = 0; j < (glu ? 2 : nw); j++) {
            ts_tensor F = {
                TS_DTYPE_F32, 2, {rs[j], cols, 1, 1, 1, 1}, f[j], (uint64_t)rs[j] * cols * 4};
            cpu->ops->matmul(cpu, &F, xn, cols, 1, want[j], rs[j]);
        }
        float *exact = want[0];
        if (glu) {
            exact = calloc(r0, 4);
            cpu->ops->swiglu(cpu, want[0], want[1], r0, 1, r0, exact, r0);
        }
        float *got[2];
        for (int b = 0; b < 2; b++) /* b = 0: the kernel under test, 1: the general GEMV */
            got[b] = gemv1_run(b ? ref : gpu, W, nw, rs, cols, 1, x, cols, nwt, eps, normed, glu,
                               false, false, NULL);
        char what[96];
        snprintf(what, sizeof what, "gemv one token %s %s%d+%d x %d%s", ts_dtype_name(dt),
                 glu ? "glu " : "", r0, r1, cols, normed ? " normed" : "");
        int n_out = glu ? r0 : r0 + r1;
        if (dt == TS_DTYPE_Q4_K || dt == TS_DTYPE_Q6_K)
            CHECKF(memcmp(got[0], got[1], (size_t)n_out * 4) == 0,
                   "%s: not the general GEMV's bits", what);
        else
            CHECKF(tu_rel_l2(got[0], got[1], n_out) <= (glu ? 2 : 1) * gemm_tol(dt, 1),
                   "%s: rel L2 %.3g from the general GEMV", what, tu_rel_l2(got[0], got[1], n_out));
        double rel = tu_rel_l2(got[0], exact, r0);
        CHECKF(rel <= (glu ? 2 : 1) * gemm_tol(dt, 1), "%s: rel L2 %.3g", what, rel);
        if (nw == 2) {
            rel = tu_rel_l2(got[0] + r0, want[1], r1);
            CHECKF(rel <= gemm_tol(dt, 1), "%s (second weight): rel L2 %.3g", what, rel);
        }
        for (int j = 0; j < (glu ? 2 : nw); j++)
            kept_extra((void *)W[j].data), free(f[j]);
        if (glu) free(exact);
        free(x), free(xn), free(nwt), free(want[0]), free(want[1]), free(got[0]), free(got[1]);
    }
    ts_backend_free(ref);
}

/* One token of 16-bit weights (cuda_gemv_one.cu): a lane keeps 4, 8 or 16 groups of a row in
 * flight by the row's length, a warp sums 1, 2 or 4 rows together (rows o, o + W, ...) so that
 * one round of the capped grid covers the matrix, and larger matrices go round. The cases below
 * take each of those shapes on an H200 (132 multiprocessors): stacks of two weights (a warp's
 * rows across the boundary), the input norm folded in, rows of 17 groups (lanes idle) and of 257
 * (a second round of loads); then quantized weights' GEMV over as many rows; then the gated
 * MLP's form (a gate and an up row an output, one or two outputs a warp). Against the CPU's norm
 * and fp32 matmul. */
static void test_gemv_one_rows(void) {
    float eps = 1e-6f;
    static const int plain[][3] = {{136, 5000, 4200},  {2056, 4500, 4100}, {1000, 3000, 3000},
                                   {1000, 2000, 1000}, {1536, 2000, 1000}, {1536, 5000, 4000}};
    for (int ci = 0; ci < (int)(sizeof plain / sizeof *plain); ci++) {
        ts_dtype dt = ci & 1 ? TS_DTYPE_F16 : TS_DTYPE_BF16;
        int cols = plain[ci][0], r0 = plain[ci][1], r1 = plain[ci][2];
        float *f0, *f1, *nw = rnd(cols, 1.0f);
        ts_tensor W0 = make_weight(dt, r0, cols, &f0), W1 = make_weight(dt, r1, cols, &f1);
        ts_tensor F0 = {TS_DTYPE_F32, 2, {r0, cols, 1, 1, 1, 1}, f0, (uint64_t)r0 * cols * 4};
        ts_tensor F1 = {TS_DTYPE_F32, 2, {r1, cols, 1, 1, 1, 1}, f1, (uint64_t)r1 * cols * 4};
        float *x = rnd(cols, 3.0f), *xn = calloc(cols, 4);
        float *y0 = calloc(r0, 4), *y1 = calloc(r1, 4);
        cpu->ops->rmsnorm(cpu, x, cols, 1, cols, nw, eps, xn, cols);
        cpu->ops->matmul(cpu, &F0, xn, cols, 1, y0, r0);
        cpu->ops->matmul(cpu, &F1, xn, cols, 1, y1, r1);
        float *dx = dev(x, cols), *dscr = dev(x, cols), *dnw = dev(nw, cols);
        float *d0 = dev(y0, r0), *d1 = dev(y1, r1);
        ts_prenorm pre = {dnw, eps, dscr};
        const ts_tensor *Ws[2] = {&W0, &W1};
        float *dys[2] = {d0, d1};
        int64_t lds[2] = {r0, r1};
        gpu->ops->matmul_n(gpu, Ws, 2, dx, cols, 1, &pre, dys, lds);
        char what[80];
        snprintf(what, sizeof what, "gemv one token %s %d+%d x %d normed", ts_dtype_name(dt), r0,
                 r1, cols);
        cmp(what, d0, y0, r0, gemm_tol(dt, 1));
        cmp(what, d1, y1, r1, gemm_tol(dt, 1));
        gpu->ops->free(gpu, dx), gpu->ops->free(gpu, dscr), gpu->ops->free(gpu, dnw);
        gpu->ops->free(gpu, d0), gpu->ops->free(gpu, d1);
        kept_extra((void *)W0.data), kept_extra((void *)W1.data);
        free(f0), free(f1), free(nw), free(x), free(xn), free(y0), free(y1);
    }
    /* quantized weights (cuda_matmul.cu's k_gemv, a warp per row): stacks of thousands of rows
     * (several waves of blocks), one and two tokens, and the gated MLP's form */
    static const struct {
        ts_dtype dt;
        int cols, r0, r1, n;
    } qcases[] = {{TS_DTYPE_Q4_K, 1024, 6000, 5000, 1}, {TS_DTYPE_Q6_K, 1024, 9000, 300, 1},
                  {TS_DTYPE_Q8_0, 640, 7000, 4100, 1},  {TS_DTYPE_Q5_0, 640, 5000, 4000, 1},
                  {TS_DTYPE_Q4_0, 768, 4000, 3000, 2},  {TS_DTYPE_Q4_K, 512, 8000, 2000, 2}};
    for (int ci = 0; ci < (int)(sizeof qcases / sizeof *qcases); ci++) {
        ts_dtype dt = qcases[ci].dt;
        int cols = qcases[ci].cols, r0 = qcases[ci].r0, r1 = qcases[ci].r1, n = qcases[ci].n;
        float *f0, *f1;
        ts_tensor W0 = make_weight(dt, r0, cols, &f0), W1 = make_weight(dt, r1, cols, &f1);
        ts_tensor F0 = {TS_DTYPE_F32, 2, {r0, cols, 1, 1, 1, 1}, f0, (uint64_t)r0 * cols * 4};
        ts_tensor F1 = {TS_DTYPE_F32, 2, {r1, cols, 1, 1, 1, 1}, f1, (uint64_t)r1 * cols * 4};
        float *x = rnd((size_t)n * cols, 3.0f);
        float *y0 = calloc((size_t)n * r0, 4), *y1 = calloc((size_t)n * r1, 4);
        cpu->ops->matmul(cpu, &F0, x, cols, n, y0, r0);
        cpu->ops->matmul(cpu, &F1, x, cols, n, y1, r1);
        float *dx = dev(x, (size_t)n * cols), *d0 = dev(y0, (size_t)n * r0);
        float *d1 = dev(y1, (size_t)n * r1);
        const ts_tensor *Ws[2] = {&W0, &W1};
        float *dys[2] = {d0, d1};
        int64_t lds[2] = {r0, r1};
        gpu->ops->matmul_n(gpu, Ws, 2, dx, cols, n, NULL, dys, lds);
        char what[80];
        snprintf(what, sizeof what, "gemv %s %d+%d x %d, %d token(s)", ts_dtype_name(dt), r0, r1,
                 cols, n);
        cmp(what, d0, y0, (size_t)n * r0, gemm_tol(dt, n));
        cmp(what, d1, y1, (size_t)n * r1, gemm_tol(dt, n));
        /* the gated MLP's form over the same weights (r0 rows of each) */
        if (n == 1) {
            float *ref = calloc(r0, 4), *dg = dev(y0, r0), *du = dev(y0, r0), *dout = dev(y0, r0);
            float *fu;
            ts_tensor Wu = make_weight(dt, r0, cols, &fu);
            ts_tensor Fu = {TS_DTYPE_F32, 2, {r0, cols, 1, 1, 1, 1}, fu, (uint64_t)r0 * cols * 4};
            float *tu = calloc(r0, 4);
            cpu->ops->matmul(cpu, &Fu, x, cols, 1, tu, r0);
            cpu->ops->swiglu(cpu, y0, tu, r0, 1, r0, ref, r0);
            gpu->ops->matmul_glu(gpu, &W0, &Wu, dx, cols, 1, NULL, false, dg, du, r0, dout, r0);
            snprintf(what, sizeof what, "gemv glu %s %d x %d", ts_dtype_name(dt), r0, cols);
            cmp(what, dout, ref, r0, 2 * gemm_tol(dt, 1));
            gpu->ops->free(gpu, dg), gpu->ops->free(gpu, du), gpu->ops->free(gpu, dout);
            kept_extra((void *)Wu.data);
            free(fu), free(tu), free(ref);
        }
        gpu->ops->free(gpu, dx), gpu->ops->free(gpu, d0), gpu->ops->free(gpu, d1);
        kept_extra((void *)W0.data), kept_extra((void *)W1.data);
        free(f0), free(f1), free(x), free(y0), free(y1);
    }
    static const int glu[][2] = {{1000, 3000}, {1000, 5000}, {2000, 3000}, {4104, 1500}};
    for (int ci = 0; ci < (int)(sizeof glu / sizeof *glu); ci++) {
        ts_dtype dt = ci & 1 ? TS_DTYPE_F16 : TS_DTYPE_BF16;
        int cols = glu[ci][0], rows = glu[ci][1];
        bool normed = ci < 2, gelu = ci & 1;
        float *fg, *fu, *nw = rnd(cols, 1.0f);
        ts_tensor Wg = make_weight(dt, rows, cols, &fg), Wu = make_weight(dt, rows, cols, &fu);
        ts_tensor Fg = {TS_DTYPE_F32, 2, {rows, cols, 1, 1, 1, 1}, fg, (uint64_t)rows * cols * 4};
        ts_tensor Fu = {TS_DTYPE_F32, 2, {rows, cols, 1, 1, 1, 1}, fu, (uint64_t)rows * cols * 4};
        float *x = rnd(cols, 3.0f), *xn = calloc(cols, 4);
        float *tg = calloc(rows, 4), *tu = calloc(rows, 4), *ref = calloc(rows, 4);
        if (normed)
            cpu->ops->rmsnorm(cpu, x, cols, 1, cols, nw, eps, xn, cols);
        else
            memcpy(xn, x, (size_t)cols * 4);
        cpu->ops->matmul(cpu, &Fg, xn, cols, 1, tg, rows);
        cpu->ops->matmul(cpu, &Fu, xn, cols, 1, tu, rows);
        (gelu ? cpu->ops->gelu_mul : cpu->ops->swiglu)(cpu, tg, tu, rows, 1, rows, ref, rows);
        float *dx = dev(x, cols), *dscr = dev(x, cols), *dnw = dev(nw, cols);
        float *dg = dev(tg, rows), *du = dev(tu, rows), *dout = dev(tg, rows);
        ts_prenorm pre = {dnw, eps, dscr};
        gpu->ops->matmul_glu(gpu, &Wg, &Wu, dx, cols, 1, normed ? &pre : NULL, gelu, dg, du, rows,
                             dout, rows);
        char what[80];
        snprintf(what, sizeof what, "gemv one token glu %s %d x %d%s%s", ts_dtype_name(dt), rows,
                 cols, normed ? " normed" : "", gelu ? " gelu" : "");
        cmp(what, dout, ref, rows, 2 * gemm_tol(dt, 1));
        gpu->ops->free(gpu, dx), gpu->ops->free(gpu, dscr), gpu->ops->free(gpu, dnw);
        gpu->ops->free(gpu, dg), gpu->ops->free(gpu, du), gpu->ops->free(gpu, dout);
        kept_extra((void *)Wg.data), kept_extra((void *)Wu.data);
        free(fg), free(fu), free(nw), free(x), free(xn), free(tg), free(tu), free(ref);
    }
}

/* The residual stream's fusions: matmul_n and matmul_glu reading x through its RMSNorm
 * (ts_prenorm: folded into the GEMV up to 8 tokens, a norm kernel into the scratch above), and
 * matmul_add (y += W x in each path's epilogue), against the CPU's norm and fp32 matmul over the
 * exact weights. matmul_add must also give the bits of the device's matmul and add where the
 * GEMV runs (the same sum, then the same float add). */
static void test_matmul_norm_add(void) {
    ts_dtype dts[] = {TS_DTYPE_F32, TS_DTYPE_BF16, TS_DTYPE_Q8_0, TS_DTYPE_Q4_K, TS_DTYPE_Q6_K,
                      TS_DTYPE_Q4_0};
    int rows = 192, cols = 512;
    int64_t ldx = cols + 4, ldy = rows + 2;
    float eps = 1e-6f;
    float *nw = rnd(cols, 1.0f);
    for (int i = 0; i < cols; i++) nw[i] += 1.0f;
    float *dnw = dev(nw, cols);
    for (size_t di = 0; di < sizeof dts / sizeof *dts; di++) {
        float *wf, *uf;
        ts_tensor W = make_weight(dts[di], rows, cols, &wf);
        ts_tensor U = make_weight(dts[di], rows, cols, &uf);
        ts_tensor Wf = {TS_DTYPE_F32, 2, {rows, cols, 1, 1, 1, 1}, wf, (uint64_t)rows * cols * 4};
        ts_tensor Uf = {TS_DTYPE_F32, 2, {rows, cols, 1, 1, 1, 1}, uf, (uint64_t)rows * cols * 4};
        int ns[] = {1, 5, 8, 12, 48, 70};
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            int n = ns[ni];
            size_t nx = (size_t)n * ldx, ny = (size_t)n * ldy;
            float *x = rnd(nx, 3.0f), *xn = calloc(nx, 4), *yw = calloc(ny, 4), *yu = calloc(ny, 4);
            float *glu = calloc(ny, 4), *y0 = rnd(ny, 1.0f), *yadd = calloc(ny, 4);
            cpu->ops->rmsnorm(cpu, x, ldx, n, cols, nw, eps, xn, ldx);
            cpu->ops->matmul(cpu, &Wf, xn, ldx, n, yw, ldy);
            cpu->ops->matmul(cpu, &Uf, xn, ldx, n, yu, ldy);
            cpu->ops->swiglu(cpu, yw, yu, ldy, n, rows, glu, ldy);
            cpu->ops->matmul(cpu, &Wf, x, ldx, n, yadd, ldy);
            for (size_t i = 0; i < ny; i++) yadd[i] += y0[i];
            /* the products leave the rows' padding alone: zero there, as in the references */
            float *zeros = calloc(ny, 4);
            float *dx = dev(x, nx), *dscr = dev(x, nx), *d1 = dev(zeros, ny), *d2 = dev(zeros, ny);
            ts_prenorm pre = {dnw, eps, dscr};
            const ts_tensor *Ws[2] = {&W, &U};
            float *dys[2] = {d1, d2};
            int64_t lds[2] = {ldy, ldy};
            char what[80];
            gpu->ops->matmul_n(gpu, Ws, 2, dx, ldx, n, &pre, dys, lds);
            snprintf(what, sizeof what, "matmul_n normed %s n=%d", ts_dtype_name(dts[di]), n);
            cmp(what, d1, yw, ny, gemm_tol(dts[di], n));
            cmp(what, d2, yu, ny, gemm_tol(dts[di], n));
            gpu->ops->matmul_glu(gpu, &W, &U, dx, ldx, n, &pre, false, d1, d2, ldy, d1, ldy);
            snprintf(what, sizeof what, "matmul_glu normed %s n=%d", ts_dtype_name(dts[di]), n);
            cmp(what, d1, glu, ny, 2 * gemm_tol(dts[di], n));
            /* matmul_add onto y0; x itself untouched by the normed calls above */
            gpu->ops->upload(gpu, d1, y0, ny * 4);
            gpu->ops->matmul_add(gpu, &W, dx, ldx, n, d1, ldy);
            snprintf(what, sizeof what, "matmul_add %s n=%d", ts_dtype_name(dts[di]), n);
            cmp(what, d1, yadd, ny, gemm_tol(dts[di], n));
            if (n <= 8) {
                gpu->ops->upload(gpu, d2, y0, ny * 4);
                gpu->ops->upload(gpu, dscr, zeros, ny * 4);
                gpu->ops->matmul(gpu, &W, dx, ldx, n, dscr, ldy);
                gpu->ops->add(gpu, d2, dscr, (int64_t)ny);
                float *a = host(d1, ny), *b = host(d2, ny);
                CHECKF(memcmp(a, b, ny * 4) == 0, "%s: not the bits of matmul + add", what);
                free(a), free(b);
            }
            float *xa = host(dx, nx);
            CHECKF(memcmp(xa, x, nx * 4) == 0, "normed matmuls %s n=%d wrote their input",
                   ts_dtype_name(dts[di]), n);
            free(xa);
            gpu->ops->free(gpu, dx), gpu->ops->free(gpu, dscr), gpu->ops->free(gpu, d1);
            gpu->ops->free(gpu, d2);
            free(x), free(xn), free(yw), free(yu), free(glu), free(y0), free(yadd), free(zeros);
        }
        kept_extra((void *)W.data), kept_extra((void *)U.data);
        free(wf), free(uf);
    }
    gpu->ops->free(gpu, dnw);
    free(nw);
}

/* argmax against the CPU op: ties (the first index wins), NaN (never wins), one row all NaN;
 * 6 rows (chunks of 1024 columns a block) and 200 (chunks of 6144: batched decode's form), with
 * ties across a chunk's end; rows of any stride (scalar loads) and of a multiple of 4 (16-byte
 * loads, with a last chunk of 2 columns beyond them). */
static void test_argmax(void) {
    for (int ci = 0; ci < 4; ci++) {
        int rows = ci & 1 ? 200 : 6, cols = ci < 2 ? 70000 : 70002;
        int64_t ld = ci < 2 ? cols + 5 : cols + 2;
        float *x = rnd((size_t)rows * ld, 1.0f);
        x[1 * ld + 500] = 9.0f, x[1 * ld + 60000] = 9.0f; /* tie: 500 */
        x[2 * ld + 0] = NAN, x[2 * ld + 69999] = 5.0f;    /* NaN first */
        for (int j = 0; j < cols; j++)
            x[3 * ld + j] = NAN;                                        /* all NaN: 0 */
        x[4 * ld + 69999] = 3.0f;                                       /* the last */
        x[5 * ld + 6143] = 4.0f, x[5 * ld + 6144] = 4.0f;               /* tie across 6144: 6143 */
        if (rows > 6) x[6 * ld + 1023] = 4.0f, x[6 * ld + 1024] = 4.0f; /* tie: 1023 */
        float *dx = dev(x, (size_t)rows * ld);
        int32_t *a = malloc(rows * sizeof *a), *b = malloc(rows * sizeof *b);
        for (int r = 0; r < rows; r++)
            b[r] = -7;
        cpu->ops->argmax(cpu, x, ld, rows, cols, a);
        gpu->ops->argmax(gpu, dx, ld, rows, cols, b);
        CHECK(a[1] == 500 && a[2] == 69999 && a[3] == 0 && a[4] == 69999 && a[5] == 6143);
        CHECK(rows == 6 || a[6] == 1023);
        for (int r = 0; r < rows; r++)
            CHECKF(a[r] == b[r], "argmax %d rows, row %d: cpu %d cuda %d", rows, r, a[r], b[r]);
        gpu->ops->free(gpu, dx);
        free(x), free(a), free(b);
    }
}

static ts_engine *make_engine_slots(ts_model *m, int n_slots);
static bool decode_fixtures(char f32[8192], char bf16[8192]);
/* vocabularies of one chunk: device and host draws agree exactly */
#define SAMPLE_EXACT_V 1024

/* Sampling on the device (cuda_sample.cu) against the host sampler on the same logits, from the
 * same seed (the device takes ts_sampler_request's uniform number u and, for top-k / top-p,
 * hands a candidate list to ts_sampler_finish). Both draw by the running sum of the weights, but
 * over 248k tokens a running sum's rounding (~1e-6 of the total) is as wide as a token's share,
 * so the two may pick neighbours: each draw is checked against the float64 truth instead. A
 * plain draw must be the token at u times the total of the float64 weights (within 1e-5 of the
 * total); a list must hold every token the filter keeps, and the draw must come from those;
 * greedy rows and one-chunk vocabularies must match the host exactly. Rows of several
 * vocabulary sizes (one chunk; 151936; 248320), peaked and flat, with NaN and -inf entries. */
typedef struct {
    const float *x;
    int V;
    int32_t *order;  /* candidates by logit, descending (ties: lower id) */
    int n_cand;
    double *w;       /* float64 weights exp(l / T - max / T), min-p applied, 0 for the rest */
    double *before;  /* running sum of w before each token, vocabulary order */
    double total, total_all; /* of w, and of the weights without min-p */
} sample_truth;

static const float *truth_x;
static int by_truth_logit(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = truth_x[i], y = truth_x[j];
    if (x != y) return x < y ? 1 : -1;
    return (i > j) - (i < j);
}

static void truth_make(sample_truth *t, const float *x, int V, const ts_sampler_params *sp) {
    t->x = x, t->V = V;
    t->order = malloc((size_t)V * sizeof *t->order);
    t->w = malloc((size_t)V * sizeof *t->w);
    t->before = malloc((size_t)V * sizeof *t->before);
    t->n_cand = 0;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++)
        if (!isnan(x[i]) && x[i] != -INFINITY) {
            t->order[t->n_cand++] = i;
            if (x[i] > mx) mx = x[i];
        }
    truth_x = x;
    qsort(t->order, (size_t)t->n_cand, sizeof *t->order, by_truth_logit);
    double T = sp->temperature > 0 ? sp->temperature : 1.0, acc = 0, all = 0;
    for (int i = 0; i < V; i++) {
        double w = 0;
        if (!isnan(x[i]) && x[i] != -INFINITY) w = exp((double)x[i] / T - (double)mx / T);
        all += w;
        if (w < sp->min_p) w = 0;
        t->w[i] = w, t->before[i] = acc;
        acc += w;
    }
    t->total = acc, t->total_all = all;
}

static void truth_free(sample_truth *t) { free(t->order), free(t->w), free(t->before); }

/* How many of the best candidates the filter keeps (top-k, then top-p within them). */
static int truth_kept(const sample_truth *t, const ts_sampler_params *sp, double slack) {
    int n = t->n_cand;
    if (sp->top_k > 0 && sp->top_k < n) n = sp->top_k;
    if (sp->top_p >= 1.0f) return n;
    double T = sp->temperature, mx = t->x[t->order[0]], tot = 0, cum = 0;
    for (int i = 0; i < n; i++) tot += exp((double)t->x[t->order[i]] / T - mx / T);
    for (int i = 0; i < n; i++) {
        cum += exp((double)t->x[t->order[i]] / T - mx / T);
        if (cum >= sp->top_p * tot * slack) return i + 1;
    }
    return n;
}

/* A plain draw for uniform number u: the token at u times the total of the float64 weights
 * (within 1e-5 of the total). */
static bool truth_draw_ok(const sample_truth *t, double u, int32_t got) {
    double at = u * t->total, tol = 1e-5 * t->total;
    return got >= 0 && got < t->V && t->w[got] > 0 && at >= t->before[got] - tol &&
           at <= t->before[got] + t->w[got] + tol;
}

/* A top-k draw for uniform number u, as the host sampler makes it from the float64 weights:
 * the k best candidates in order, the first of them whose running sum reaches top_p of their
 * total, those at or above min_p; the token at u times what is left's sum, walking it in that
 * order (within 1e-5 of the sum). */
static bool truth_topk_ok(const sample_truth *t, const ts_sampler_params *sp, double u,
                          int32_t got) {
    int keep = truth_kept(t, sp, 1.0); /* the k best, then the top-p cut */
    double T = sp->temperature, best = t->x[t->order[0]] / T, sum = 0;
    double *w = malloc((size_t)keep * sizeof *w);
    if (!w) return false;
    for (int i = 0; i < keep; i++) {
        w[i] = exp(t->x[t->order[i]] / T - best);
        if (w[i] < sp->min_p) w[i] = 0;
        sum += w[i];
    }
    double at = u * sum, tol = 1e-5 * sum, before = 0;
    bool ok = false;
    for (int i = 0; i < keep && !ok; before += w[i], i++)
        ok = t->order[i] == got && w[i] > 0 && at >= before - tol && at <= before + w[i] + tol;
    free(w);
    return ok;
}

/* A top-p draw (no top-k) for uniform number u, as the host sampler makes it (sampler.c,
 * nucleus) from float64 weights exp(l / T - max / T): their buckets (the float bits' top 12)
 * summed from the top until they reach top_p of the total; every token of a bucket above the
 * last one, in vocabulary order, then the last bucket's in descending order (the lower id
 * first among equals) until the running sum reaches the target; of those, the ones at or above
 * min_p; the token at u times what is kept, walking it in that order (within 1e-5 of it). */
static int by_truth_weight(const void *a, const void *b) {
    const double *x = a, *y = b; /* {weight, id} */
    if (x[0] != y[0]) return x[0] < y[0] ? 1 : -1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

static bool truth_nucleus_ok(const sample_truth *t, const ts_sampler_params *sp, double u,
                             int32_t got) {
    enum { NB = 2048 };
    static double mass[NB];
    memset(mass, 0, sizeof mass);
    int V = t->V, *bucket = malloc((size_t)V * sizeof *bucket);
    double *w = malloc((size_t)V * sizeof *w), *low_set = malloc((size_t)V * 2 * sizeof *low_set);
    if (!bucket || !w || !low_set) {
        free(bucket), free(w), free(low_set);
        return false;
    }
    double T = sp->temperature, top = t->x[t->order[0]] / T, total = 0;
    for (int i = 0; i < V; i++) {
        float l = t->x[i];
        w[i] = !isnan(l) && l != -INFINITY ? exp(l / T - top) : 0.0;
        float wf = (float)w[i];
        uint32_t b;
        memcpy(&b, &wf, 4);
        bucket[i] = (int)(b >> 20);
        mass[bucket[i]] += w[i], total += w[i];
    }
    double target = sp->top_p * total, above = 0;
    int low = 0;
    for (int k = NB - 1; k >= 0; k--) {
        if (above + mass[k] >= target) {
            low = k;
            break;
        }
        above += mass[k];
    }
    int n_low = 0;
    for (int i = 0; i < V; i++)
        if (w[i] > 0 && bucket[i] == low)
            low_set[2 * n_low] = w[i], low_set[2 * n_low + 1] = i, n_low++;
    qsort(low_set, (size_t)n_low, 2 * sizeof *low_set, by_truth_weight);
    int keep = n_low;
    double cum = above;
    for (int j = 0; j < n_low; j++)
        if ((cum += low_set[2 * j]) >= target) {
            keep = j + 1;
            break;
        }
    double sum = 0; /* what min-p keeps of it */
    for (int i = 0; i < V; i++)
        if (w[i] > 0 && bucket[i] > low && w[i] >= sp->min_p) sum += w[i];
    for (int j = 0; j < keep; j++)
        if (low_set[2 * j] >= sp->min_p) sum += low_set[2 * j];
    double at = u * sum, tol = 1e-5 * sum, before = 0;
    bool ok = false;
    for (int i = 0; i < V && !ok; i++)
        if (w[i] > 0 && bucket[i] > low && w[i] >= sp->min_p) {
            ok = i == got && at >= before - tol && at <= before + w[i] + tol;
            before += w[i];
        }
    for (int j = 0; j < keep && !ok; j++)
        if (low_set[2 * j] >= sp->min_p) {
            ok = (int32_t)low_set[2 * j + 1] == got && at >= before - tol &&
                 at <= before + low_set[2 * j] + tol;
            before += low_set[2 * j];
        }
    free(bucket), free(w), free(low_set);
    return ok;
}

/* Many rows of plain draws in one call (each its own temperature, one of them greedy): the
 * one-kernel draw (k_smp_draw), 40 rows of 151936 tokens, so that its blocks take two parts
 * each, every draw against its row's float64 truth. */
static void test_sample_plain_rows(void) {
    enum { R = 40, ROUNDS = 3 };
    const int V = 151936;
    float *x = rnd((size_t)R * V, 12.0f);
    sample_truth t[R];
    ts_sampler *ds[R];
    ts_sampler_params ps[R];
    for (int r = 0; r < R; r++) {
        float *row = x + (size_t)r * V;
        row[(r * 7919) % V] = 14.0f, row[(r * 104729 + 5) % V] = NAN;
        ps[r] = (ts_sampler_params){r == 5 ? 0.0f : 0.5f + 0.05f * (float)r, 0, 1.0f, 0.0f,
                                    (uint64_t)(100 + r)};
        truth_make(&t[r], row, V, &ps[r]);
        ds[r] = NULL;
        CHECK(ts_sampler_create(&ps[r], V, &ds[r]) == TS_OK);
    }
    float *dx = dev(x, (size_t)R * V);
    int bad = 0;
    for (int i = 0; i < ROUNDS; i++) {
        ts_sample_req rq[R];
        ts_sample_res rs[R];
        for (int r = 0; r < R; r++)
            rq[r] = ts_sampler_request(ds[r]), rs[r] = (ts_sample_res){-1, 0, NULL, NULL, 0};
        gpu->ops->sample(gpu, dx, V, R, V, rq, rs);
        for (int r = 0; r < R; r++) {
            int32_t got = rs[r].n == 0 ? ts_sampler_finish(ds[r], &rq[r], &rs[r]) : -1;
            bool ok = r == 5 ? got == t[r].order[0] : truth_draw_ok(&t[r], rq[r].u, got);
            CHECKF(ok, "plain rows: round %d row %d drew %d", i, r, got);
            bad += !ok;
        }
    }
    printf("  sample %d plain rows of V=%d in one call: %d of %d draws wrong\n", R, V, bad,
           R * ROUNDS);
    for (int r = 0; r < R; r++)
        truth_free(&t[r]), ts_sampler_free(ds[r]);
    gpu->ops->free(gpu, dx);
    free(x);
}

/* With n_adj adjustments (logit biases, penalties), the device sampler gets them
 * (ts_sampler_set_adjust) and applies them to its copy of the row, which is uploaded again
 * before each draw; the host side and the truth see the row with the adjustments applied here. */
static int sample_row_case(const float *x0, int V, const ts_sampler_params *sp, int draws,
                           int *longest, int *agree, const ts_logit_adjust *adj, int n_adj) {
    float *dx = dev(x0, (size_t)V);
    float *x = malloc((size_t)V * sizeof *x);
    memcpy(x, x0, (size_t)V * sizeof *x);
    ts_logit_adjust_apply(adj, n_adj, x, V);
    ts_sampler *hs = NULL, *ds = NULL;
    CHECK(ts_sampler_create(sp, V, &hs) == TS_OK && ts_sampler_create(sp, V, &ds) == TS_OK);
    if (ds) ts_sampler_set_adjust(ds, adj, n_adj);
    float *lg = malloc((size_t)V * sizeof *lg);
    int32_t *tk = malloc((size_t)V * sizeof *tk);
    uint8_t *in_list = calloc((size_t)V, 1), *reach = calloc((size_t)V, 1);
    sample_truth t;
    truth_make(&t, x, V, sp);
    bool greedy = sp->temperature <= 0 || sp->top_k == 1;
    bool listed = !greedy && ((sp->top_k > 0 && sp->top_k < V) || sp->top_p < 1.0f);
    /* the CUDA backend draws top-k rows (k up to 1024) and top-p rows itself */
    bool device_ends = listed && sp->top_k < V && sp->top_k <= 1024;
    /* the filter's set, and a slightly larger one the draw may reach through rounding */
    int n_keep = listed ? truth_kept(&t, sp, 1.0 - 1e-4) : 0;
    int n_reach = listed ? truth_kept(&t, sp, 1.0 + 1e-4) : 0;
    for (int i = 0; i < n_reach; i++) reach[t.order[i]] = 1;
    int bad = 0, distinct = 0;
    *agree = 0;
    int32_t first = -1;
    for (int i = 0; hs && ds && i < draws; i++) {
        int32_t want = ts_sampler_sample(hs, x);
        ts_sample_req rq = ts_sampler_request(ds);
        ts_sample_res rs = {-1, 0, lg, tk, 0};
        if (n_adj && i) gpu->ops->upload(gpu, dx, x0, (size_t)V * sizeof *x0);
        gpu->ops->sample(gpu, dx, V, 1, V, &rq, &rs);
        if (rs.id < 0 && rs.n <= 0) { /* the op failed */
            bad++;
            continue;
        }
        bool ok = true;
        if (listed && rs.id < 0) {
            ok = !device_ends; /* a top-k row the device draws itself */
            for (int k = 0; k < rs.n; k++) in_list[tk[k]] = 1;
            for (int k = 0; k < n_keep; k++) ok = ok && in_list[t.order[k]];
            for (int k = 0; k < rs.n; k++) in_list[tk[k]] = 0;
            if (rs.n > *longest) *longest = rs.n;
        } else if (listed && !device_ends) {
            ok = false; /* a list was due */
        }
        int32_t got = ts_sampler_finish(ds, &rq, &rs);
        if (got < 0 || got >= V) {
            bad++;
            continue;
        }
        if (greedy || V <= SAMPLE_EXACT_V) {
            ok = ok && got == want;
        } else if (listed) {
            ok = ok && reach[got] &&
                 (!device_ends || (sp->top_k > 0 ? truth_topk_ok(&t, sp, rq.u, got)
                                                 : truth_nucleus_ok(&t, sp, rq.u, got)));
        } else {
            ok = ok && truth_draw_ok(&t, rq.u, got);
        }
        bad += !ok;
        *agree += got == want;
        if (i == 0) first = got;
        distinct += got != first;
    }
    /* a sampler stuck on one token: every draw the same where the truth gave that a chance
     * under 1e-6 (the likeliest token's share to the power draws - 1 bounds it) */
    double pmax = 0;
    for (int i = 0; i < V; i++) pmax = t.w[i] / t.total > pmax ? t.w[i] / t.total : pmax;
    if (!greedy && draws >= 20 && distinct == 0 && pow(pmax, draws - 1) < 1e-6) bad += 1000000;
    truth_free(&t);
    ts_sampler_free(hs), ts_sampler_free(ds);
    free(lg), free(tk), free(in_list), free(reach), free(x);
    gpu->ops->free(gpu, dx);
    return bad;
}

/* ts_backend_ops.sample_logprobs: the draws sample makes (the same kernels, the same u) and,
 * from the same submission, what the host's ts_sampler_logprobs makes of the adjusted row - the
 * same alternatives in the same order (on equal logits the lower id first), the values up to
 * rounding in the sum - for three rows in one call (greedy, plain, top-k with top-p; one with
 * adjustments), with NaN and -inf, peaked, flat and rows of many equal logits; a row too long
 * for its parts is refused with nothing queued. */
static void test_sample_logprobs(bool quick) {
    if (!gpu->ops->sample_logprobs) {
        CHECKF(0, "the CUDA backend has no sample_logprobs");
        return;
    }
    enum { R = 3 };
    const int sizes[4] = {1000, 151936, 248320, 262144};
    const ts_sampler_params ps[R] = {
        {0.0f, 0, 1.0f, 0.0f, 31}, {1.0f, 0, 1.0f, 0.0f, 32}, {0.8f, 40, 0.9f, 0.0f, 33}};
    const int tops[3] = {1, 5, 20};
    ts_logit_adjust adj[64];
    int bad = 0, cases = 0;
    double worst = 0;
    for (int si = 0; si < 4; si++)
        for (int shape = 0; shape < 3; shape++) { /* peaked, flat, ties */
            if (quick && (si == 1 || si == 3 || shape == 1)) continue;
            const int V = sizes[si];
            float *x = rnd((size_t)R * V, shape == 0 ? 12.0f : 3.0f);
            for (int r = 0; r < R; r++) {
                float *row = x + (size_t)r * V;
                if (shape == 2) /* 13 levels: the top one holds thousands of equal logits */
                    for (int i = 0; i < V; i++)
                        row[i] = roundf(row[i] * 2.0f) * 0.5f;
                row[(r * 7 + 1) % V] = NAN, row[V / 2] = -INFINITY, row[V - 1] = NAN;
                if (shape == 0) row[(V / 5 + r) % V] = 14.0f;
            }
            for (int i = 0; i < 64; i++) /* biases, penalties, both */
                adj[i] = (ts_logit_adjust){(int32_t)(((int64_t)i * 7919 + V / 5) % V),
                                           i % 4 ? 0.0f : 1.5f - 0.75f * (float)(i % 8),
                                           i % 4 == 1 ? 1.0f : 1.2f, 0.5f * (float)(i % 3)};
            float *xa = malloc((size_t)R * V * sizeof *xa); /* row 1 adjusted, as the device */
            memcpy(xa, x, (size_t)R * V * sizeof *xa);
            ts_logit_adjust_apply(adj, 64, xa + V, V);
            float *dx = dev(x, (size_t)R * V), *dy = dev(x, (size_t)R * V);
            ts_sampler *sa[R], *sb[R];
            ts_sample_req ra[R], rb[R], lq[R];
            ts_sample_res oa[R], ob[R], ol[R];
            float chosen[R], *lg = malloc((size_t)R * V * sizeof *lg);
            int32_t *tk = malloc((size_t)R * V * sizeof *tk);
            for (int r = 0; r < R; r++) {
                sa[r] = sb[r] = NULL;
                CHECK(ts_sampler_create(&ps[r], V, &sa[r]) == TS_OK &&
                      ts_sampler_create(&ps[r], V, &sb[r]) == TS_OK);
                if (r == 1) ts_sampler_set_adjust(sa[r], adj, 64);
                if (r == 1) ts_sampler_set_adjust(sb[r], adj, 64);
                ra[r] = ts_sampler_request(sa[r]), rb[r] = ts_sampler_request(sb[r]);
                lq[r] = ts_sampler_logprob_request(tops[(r + si + shape) % 3]);
                oa[r] = (ts_sample_res){-1, 0, NULL, NULL, 0};
                ob[r] = (ts_sample_res){-1, 0, NULL, NULL, 0};
                ol[r] = (ts_sample_res){-1, 0, lg + (size_t)r * V, tk + (size_t)r * V, 0};
            }
            gpu->ops->sample(gpu, dx, V, R, V, ra, oa);
            bool took = gpu->ops->sample_logprobs(gpu, dy, V, R, V, rb, lq, ob, ol, chosen);
            CHECKF(took, "V=%d shape %d: sample_logprobs refused", V, shape);
            for (int r = 0; took && r < R; r++) {
                int n_top = lq[r].top_k;
                ts_logprobs got = {0}, want = {0};
                bool same = ob[r].id >= 0 && ob[r].id == oa[r].id &&
                            ts_sampler_logprobs_list(sb[r], &ol[r], chosen[r], n_top, &got);
                if (same) ts_sampler_logprobs(sb[r], xa + (size_t)r * V, ob[r].id, n_top, &want);
                same = same && got.n_top == want.n_top && want.n_top == n_top;
                double d = fabs((double)got.logprob - want.logprob);
                for (int k = 0; same && k < n_top; k++) {
                    same = got.top_id[k] == want.top_id[k];
                    double dk = fabs((double)got.top_logprob[k] - want.top_logprob[k]);
                    d = dk > d ? dk : d;
                }
                same = same && d <= 1e-4;
                worst = same && d > worst ? d : worst;
                CHECKF(same,
                       "V=%d shape %d row %d (top %d): draw %d / %d, log-probabilities %s "
                       "the host's (difference %.3g)",
                       V, shape, r, n_top, ob[r].id, oa[r].id, same ? "as" : "not as", d);
                bad += !same, cases++;
            }
            for (int r = 0; r < R; r++)
                ts_sampler_free(sa[r]), ts_sampler_free(sb[r]);
            gpu->ops->free(gpu, dx), gpu->ops->free(gpu, dy);
            free(x), free(xa), free(lg), free(tk);
        }
    printf("  sample_logprobs: %d of %d rows as the host's, worst difference %.3g\n", cases - bad,
           cases, worst);
    /* a row longer than the parts can hold: refused before anything is queued (its
     * adjustments not made either) */
    {
        const int V = 600000;
        float *x = rnd((size_t)V, 3.0f), *dx = dev(x, (size_t)V);
        ts_sampler *s = NULL;
        CHECK(ts_sampler_create(&ps[1], V, &s) == TS_OK);
        if (s) {
            ts_sampler_set_adjust(s, adj, 64);
            ts_sample_req rq = ts_sampler_request(s), lq = ts_sampler_logprob_request(5);
            ts_sample_res o = {-1, 0, NULL, NULL, 0}, l = {-1, 0, NULL, NULL, 0};
            float ch = 0;
            CHECKF(!gpu->ops->sample_logprobs(gpu, dx, V, 1, V, &rq, &lq, &o, &l, &ch),
                   "a row of %d logits was taken", V);
            float *back = host(dx, (size_t)V);
            CHECKF(memcmp(back, x, (size_t)V * sizeof *x) == 0,
                   "a refused row of %d logits was changed", V);
            free(back);
            ts_sampler_free(s);
        }
        gpu->ops->free(gpu, dx);
        free(x);
    }
}

static void test_sample(bool quick) {
    const int sizes[3] = {1000, 151936, 248320};
    /* params 9 (top-k over 1024) is the one whose list the host finishes */
    const ts_sampler_params ps[10] = {{1.0f, 0, 1.0f, 0.0f, 11},    {0.7f, 0, 1.0f, 0.05f, 12},
                                      {0.8f, 40, 1.0f, 0.0f, 13},   {1.0f, 0, 0.9f, 0.0f, 14},
                                      {0.6f, 50, 0.95f, 0.02f, 15}, {1.3f, 0, 0.5f, 0.0f, 16},
                                      {0.0f, 0, 1.0f, 0.0f, 17},    {1.0f, 1, 1.0f, 0.0f, 18},
                                      {0.9f, 0, 0.9f, 0.05f, 19},   {0.9f, 2000, 1.0f, 0.0f, 20}};
    for (int si = 0; si < 3; si++)
        for (int shape = 0; shape < 2 && !(quick && si == 1); shape++) { /* peaked, flat */
            int V = sizes[si];
            float *x = rnd((size_t)V, shape == 0 ? 12.0f : 1.0f);
            x[V / 3] = NAN, x[V / 2] = -INFINITY, x[V - 1] = NAN;
            if (shape == 0) x[V / 5] = 14.0f; /* a clear favourite, not the only one */
            for (int pi = 0; pi < 10; pi++) {
                /* flat rows with top-p keep most of the vocabulary: few draws (the host side
                 * sorts the list) */
                bool slow = shape == 1 && ps[pi].top_p < 1.0f && ps[pi].top_k == 0;
                int longest = 0, agree = 0, draws = quick ? 2 : slow ? 6 : 40;
                int bad = sample_row_case(x, V, &ps[pi], draws, &longest, &agree, NULL, 0);
                CHECKF(bad == 0, "V=%d %s params %d: %d of %d device draws wrong%s", V,
                       shape ? "flat" : "peaked", pi, bad % 1000000, draws,
                       bad >= 1000000 ? ", and every draw was the same token" : "");
                if (si == 2 && (pi == 0 || pi == 2))
                    printf("  sample V=%d %s params %d: %d of %d draws as the host's, list of "
                           "%d tokens\n", V, shape ? "flat" : "peaked", pi, agree, draws,
                           longest);
            }
            free(x);
        }
    /* penalties as adjustments: 300 tokens (the favourite among them) with repetition penalty
     * 1.3 but every fifth, half of them with a frequency / presence term, every seventh with a
     * logit bias, applied on the device */
    {
        ts_logit_adjust adj[300];
        for (int si = 0; si < 3; si += 2) {
            int V = sizes[si];
            float *x = rnd((size_t)V, 12.0f);
            x[V / 5] = 14.0f;
            for (int i = 0; i < 300; i++)
                adj[i] = (ts_logit_adjust){(int32_t)((V / 5 + (int64_t)i * 7919) % V),
                                           i % 7 ? 0.0f : 2.0f - 0.5f * (float)(i % 9),
                                           i % 5 ? 1.3f : 1.0f,
                                           i % 2 ? 0.0f : 0.25f + 0.5f * (float)(i % 5)};
            for (int pi = 0; pi < 10; pi++) {
                if (pi == 3 || pi == 5 || pi >= 8) continue; /* covered above */
                int longest = 0, agree = 0, draws = quick ? 2 : 30;
                int bad = sample_row_case(x, V, &ps[pi], draws, &longest, &agree, adj, 300);
                CHECKF(bad == 0, "V=%d with adjustments, params %d: %d of %d device draws wrong",
                       V, pi, bad % 1000000, draws);
            }
            free(x);
        }
    }
    test_sample_plain_rows();
    /* several rows in one call (of one chunk each: exact), each with its own parameters, one
     * of them greedy */
    int V = SAMPLE_EXACT_V - 24, R = 3;
    int64_t ld = V + 7;
    float *x = rnd((size_t)R * ld, 8.0f);
    float *dx = dev(x, (size_t)R * ld);
    ts_sampler_params rp[3] = {{1.0f, 0, 1.0f, 0.0f, 21}, {0.8f, 40, 0.9f, 0.0f, 22},
                               {0.0f, 0, 1.0f, 0.0f, 23}};
    ts_sampler *hs[3], *ds[3];
    for (int r = 0; r < R; r++)
        CHECK(ts_sampler_create(&rp[r], V, &hs[r]) == TS_OK &&
              ts_sampler_create(&rp[r], V, &ds[r]) == TS_OK);
    float *lg = malloc((size_t)R * V * sizeof *lg);
    int32_t *tk = malloc((size_t)R * V * sizeof *tk);
    int diff = 0;
    for (int i = 0; i < 30; i++) {
        ts_sample_req rq[3];
        ts_sample_res rs[3];
        for (int r = 0; r < R; r++)
            rq[r] = ts_sampler_request(ds[r]),
            rs[r] = (ts_sample_res){-1, 0, lg + (size_t)r * V, tk + (size_t)r * V, 0};
        gpu->ops->sample(gpu, dx, ld, R, V, rq, rs);
        for (int r = 0; r < R; r++)
            diff += ts_sampler_finish(ds[r], &rq[r], &rs[r]) !=
                    ts_sampler_sample(hs[r], x + (size_t)r * ld);
    }
    CHECKF(diff == 0, "three rows in one call: %d of 90 draws differ", diff);
    for (int r = 0; r < R; r++) ts_sampler_free(hs[r]), ts_sampler_free(ds[r]);
    free(lg), free(tk), free(x);
    gpu->ops->free(gpu, dx);
}

/* ts_engine_forward_sample on the GPU: the tokens of 24 decode steps, drawn on the device inside
 * the replayed step, must be those the host sampler draws from the logits that
 * ts_engine_forward of a second engine downloads, from the same seed. */
/* Two samplers of the same parameters p over V tokens, adjusting the logits alike by the 40
 * entries of adj (which the samplers read at each draw: the caller's array, filled here), entry
 * i token (mul * i) % V with repetition penalty pen, less step * (i % mod), every fifth biased
 * by step * (i % 3) first. False (both freed) where either cannot be made. */
static bool adjusted_pair(const ts_sampler_params *p, int V, int mul, float step, int mod,
                          float pen, ts_logit_adjust adj[40], ts_sampler **sa, ts_sampler **sb) {
    *sa = *sb = NULL;
    bool ok = ts_sampler_create(p, V, sa) == TS_OK && ts_sampler_create(p, V, sb) == TS_OK;
    CHECK(ok);
    if (!ok) {
        ts_sampler_free(*sa), ts_sampler_free(*sb);
        return false;
    }
    for (int i = 0; i < 40; i++)
        adj[i] = (ts_logit_adjust){(mul * i) % V, i % 5 ? 0.0f : step * (float)(i % 3), pen,
                                   step * (float)(i % mod)};
    ts_sampler_set_adjust(*sa, adj, 40);
    ts_sampler_set_adjust(*sb, adj, 40);
    return true;
}

/* The F32 decode fixture and two engines of one slot on it (ea, eb: NULL, a failed check, where
 * one cannot be made); NULL without the fixture. */
static ts_model *f32_engine_pair(ts_engine **ea, ts_engine **eb) {
    char f32[8192], bf16[8192];
    *ea = *eb = NULL;
    if (!decode_fixtures(f32, bf16)) return NULL;
    ts_model *m = NULL;
    CHECKF(ts_model_open(f32, &m) == TS_OK, "%s: %s", f32, ts_last_error());
    if (!m) return NULL;
    *ea = make_engine_slots(m, 1), *eb = make_engine_slots(m, 1);
    CHECK(*ea && *eb);
    return m;
}

static void test_engine_sample(void) {
    ts_engine *ea, *eb;
    ts_model *m = f32_engine_pair(&ea, &eb);
    if (!m) return;
    const ts_sampler_params ps[3] = {{1.0f, 0, 1.0f, 0.0f, 5}, {0.9f, 20, 0.9f, 0.0f, 6},
                                     {0.7f, 0, 1.0f, 0.1f, 7}};
    for (int c = 0; ea && eb && c < 3; c++) {
        int V = ts_engine_n_vocab(ea);
        ts_sampler *sa = NULL, *sb = NULL;
        CHECK(ts_sampler_create(&ps[c], V, &sa) == TS_OK &&
              ts_sampler_create(&ps[c], V, &sb) == TS_OK);
        float *lg = malloc((size_t)V * sizeof *lg);
        ts_engine_slot_clear(ea, 0), ts_engine_slot_clear(eb, 0);
        int32_t ta = 3, tb = 3, sl = 0;
        int diff = 0, steps = 24;
        long r0 = 0, b0 = 0, u0 = 0, r1 = 0, b1 = 0, u1 = 0;
        ts_backend_cuda_graph_stats(ea->be, &r0, &b0, &u0);
        long early0 = ts_backend_cuda_early_waits(ea->be);
        for (int i = 0; i < steps; i++) {
            int32_t p = i;
            ts_batch ba = {1, &ta, &p, &sl, NULL, NULL, NULL},
                     bb = {1, &tb, &p, &sl, NULL, NULL, NULL};
            CHECK(ts_engine_forward_sample(ea, &ba, &sa, &ta) == TS_OK);
            CHECK(ts_engine_forward(eb, &bb, lg) == TS_OK);
            tb = ts_sampler_sample(sb, lg);
            diff += ta != tb;
            tb = ta; /* the same next input on both sides */
        }
        ts_backend_cuda_graph_stats(ea->be, &r1, &b1, &u1);
        CHECKF(diff == 0, "params %d: %d of %d steps drew another token on the device", c, diff,
               steps);
        /* the draw ends on the device (plain, top-k with top-p, min-p): no copy in the step,
         * and (as a greedy step) the wait returns on the drawn token's key */
        int copies = ts_backend_cuda_graph_copies(ea->be);
        long early = ts_backend_cuda_early_waits(ea->be) - early0;
        CHECKF(copies == 0, "params %d: the sampled step's graph has %d copy nodes", c, copies);
        CHECKF(early >= steps - 1,
               "params %d: %ld of %d sampled steps' waits returned on their "
               "keys",
               c, early, steps);
        CHECKF(r1 - r0 >= steps - 4, "params %d: %ld graph replays in %d sampled steps", c,
               r1 - r0, steps);
        printf("  engine sample params %d: %d steps, %ld replays, %ld nodes updated\n", c, steps,
               r1 - r0, u1 - u0);
        ts_sampler_free(sa), ts_sampler_free(sb);
        free(lg);
    }
    /* with log-probabilities (ts_engine_forward_sample_logits): the draw stays on the device and
     * the logits come back with the sampler's adjustments applied by the device, bit for bit
     * what the host's ts_sampler_adjust makes of the step's logits; the same draws */
    for (int c = 0; ea && eb && c < 2; c++) {
        int V = ts_engine_n_vocab(ea);
        ts_sampler *sa = NULL, *sb = NULL;
        ts_logit_adjust adj[40];
        if (!adjusted_pair(&ps[c], V, 7, 0.3f, 4, 1.3f, adj, &sa, &sb)) break;
        float *lg = malloc((size_t)V * sizeof *lg), *la = malloc((size_t)V * sizeof *la);
        ts_engine_slot_clear(ea, 0), ts_engine_slot_clear(eb, 0);
        int32_t ta = 3, sl = 0;
        int diff = 0, ldiff = 0, steps = 8;
        for (int i = 0; i < steps; i++) {
            int32_t p = i, tb = ta;
            ts_batch ba = {1, &ta, &p, &sl, NULL, NULL, NULL},
                     bb = {1, &tb, &p, &sl, NULL, NULL, NULL};
            CHECK(ts_engine_forward_sample_logits(ea, &ba, &sa, &ta, la) == TS_OK);
            CHECK(ts_engine_forward(eb, &bb, lg) == TS_OK);
            ts_sampler_adjust(sb, lg);
            ldiff += memcmp(la, lg, (size_t)V * sizeof *la) != 0;
            diff += ta != ts_sampler_sample(sb, lg);
        }
        CHECKF(ldiff == 0 && diff == 0, "params %d with logits: %d of %d steps' logits and %d "
               "draws differ", c, ldiff, steps, diff);
        ts_sampler_free(sa), ts_sampler_free(sb);
        free(lg), free(la);
    }
    /* log-probabilities computed on the device (ts_engine_forward_sample_logprobs): the same
     * draws, and what the host's ts_sampler_logprobs makes of the step's adjusted logits - the
     * same alternatives, the values up to rounding in the sum - with 0, 1, 5 and 20
     * alternatives; plain, top-k with top-p, min-p and greedy draws. Four cases with
     * adjustments and the alternatives changing each step (so that no step is the one held),
     * four without, decoded ahead (sample_held_logprobs) */
    const ts_sampler_params pl[4] = {ps[0], ps[1], ps[2], {0.0f, 0, 1.0f, 0.0f, 8}};
    for (int c = 0; ea && eb && c < 8; c++) {
        const bool adjusted = c < 4;
        int V = ts_engine_n_vocab(ea);
        ts_sampler *sa = NULL, *sb = NULL;
        ts_logit_adjust adj[40];
        if (adjusted && !adjusted_pair(&pl[c], V, 5, 0.4f, 3, 1.2f, adj, &sa, &sb)) break;
        if (!adjusted)
            CHECK(ts_sampler_create(&pl[c % 4], V, &sa) == TS_OK &&
                  ts_sampler_create(&pl[c % 4], V, &sb) == TS_OK);
        if (!sa || !sb) break;
        const long held0 = ea->ahead.launched_held;
        float *lg = malloc((size_t)V * sizeof *lg);
        ts_engine_slot_clear(ea, 0), ts_engine_slot_clear(eb, 0);
        int32_t ta = 3, sl = 0;
        int diff = 0, lpdiff = 0, steps = 9;
        double worst = 0;
        long r0 = 0, b0 = 0, u0 = 0, r1 = 0, b1 = 0, u1 = 0;
        ts_backend_cuda_graph_stats(ea->be, &r0, &b0, &u0);
        for (int i = 0; i < steps; i++) {
            int32_t p = i, tb = ta;
            int n_top = adjusted ? (int[]){0, 5, 20}[i % 3] : (int[]){0, 5, 20, 1}[c % 4];
            ts_batch ba = {1, &ta, &p, &sl, NULL, NULL, NULL},
                     bb = {1, &tb, &p, &sl, NULL, NULL, NULL};
            ts_logprobs got = {0}, want = {0};
            CHECK(ts_engine_forward_sample_logprobs(ea, &ba, &sa, n_top, &ta, &got) == TS_OK);
            CHECK(ts_engine_forward(eb, &bb, lg) == TS_OK);
            ts_sampler_adjust(sb, lg);
            diff += ta != ts_sampler_sample(sb, lg);
            ts_sampler_logprobs(sb, lg, ta, n_top, &want);
            bool same = got.n_top == want.n_top;
            double d = fabs(got.logprob - want.logprob);
            for (int k = 0; same && k < want.n_top; k++) {
                same = got.top_id[k] == want.top_id[k];
                double dk = fabs(got.top_logprob[k] - want.top_logprob[k]);
                d = dk > d ? dk : d;
            }
            lpdiff += !same || !(d <= 1e-4);
            worst = d > worst ? d : worst;
        }
        ts_backend_cuda_graph_stats(ea->be, &r1, &b1, &u1);
        CHECKF(diff == 0 && lpdiff == 0, "params %d with log-probabilities: %d of %d draws and %d "
               "steps' log-probabilities differ (worst value %.3g)", c, diff, steps, lpdiff, worst);
        /* the device ends each of these draws, so a step with log-probabilities is one
         * submission - the forward, its draw and the log-probability pass (sample_logprobs) -
         * from the third step on a graph replayed, one a step (two or three a step, the list
         * made as a top-k request and the drawn logit read apart, with
         * TESSERA_CUDA_LOGPROBS_ONE=0; where the host finishes a draw - a top-k over 1024, more
         * than these fixtures' vocabularies - that is still the way) */
        CHECKF(r1 - r0 >= steps - 2 && r1 - r0 <= steps,
               "params %d with log-probabilities: %ld graph replays in %d steps (one a step)", c,
               r1 - r0, steps);
        /* without adjustments each step after the first was held and launched (steps with
         * log-probabilities decoded ahead); with them, whose alternatives change, none */
        long held = ea->ahead.launched_held - held0;
        CHECKF(adjusted ? held == 0 : held >= steps - 2,
               "params %d with log-probabilities%s: %ld of %d steps decoded ahead", c,
               adjusted ? " and adjustments" : "", held, steps);
        printf("  engine logprobs params %d%s: worst difference from the host's %.3g, %ld graph "
               "replays, %ld steps decoded ahead in %d\n",
               c, adjusted ? " (adjusted)" : "", worst, r1 - r0, held, steps);
        ts_sampler_free(sa), ts_sampler_free(sb);
        free(lg);
    }
    /* a sampler for another vocabulary is refused */
    ts_sampler *wrong = NULL;
    ts_sampler_params wp = {1.0f, 0, 1.0f, 0.0f, 1};
    CHECK(ts_sampler_create(&wp, 7, &wrong) == TS_OK);
    int32_t t = 3, p = 0, sl = 0, out = -1;
    ts_batch bw = {1, &t, &p, &sl, NULL, NULL, NULL};
    if (ea) ts_engine_slot_clear(ea, 0);
    CHECK(!ea || ts_engine_forward_sample(ea, &bw, &wrong, &out) == TS_ERR_INVALID);
    ts_sampler_free(wrong);
    if (ea) ts_engine_free(ea);
    if (eb) ts_engine_free(eb);
    ts_model_close(m);
}

/* A penalty list kept as the server keeps one (serve/decode.c): two biased tokens, then with a
 * repetition penalty every token of the prompt, then each drawn token; its entry's sub the
 * frequency penalty times its count in the answer plus the presence penalty. */
typedef struct {
    ts_logit_adjust *adj;
    int *at, *count, n;
    float rep, freq, pres;
} pen_list;

static void pen_token(pen_list *l, int32_t t, bool drawn) {
    if (drawn) l->count[t]++;
    if (l->at[t] < 0) {
        l->at[t] = l->n++;
        l->adj[l->at[t]] = (ts_logit_adjust){t, 0.0f, 1.0f, 0.0f};
    }
    l->adj[l->at[t]].rep = l->rep;
    l->adj[l->at[t]].sub = l->count[t] ? l->freq * (float)l->count[t] + l->pres : 0.0f;
}

static void pen_bias(pen_list *l, int32_t t, float bias) {
    l->at[t] = l->n++;
    l->adj[l->at[t]] = (ts_logit_adjust){t, bias, 1.0f, 0.0f};
}

/* Penalised draws decoded ahead: the held step is given the penalty list as it is at its launch
 * (sample_held_adjust) - grown by the token drawn since it was queued - so each draw is the
 * host's from the step's logits with the list applied (an engine of ts_engine_forward and
 * ts_sampler_adjust), with log-probabilities or without, plain, top-k and greedy draws, and
 * most steps are launched held. Strong penalties over the fixture's small vocabulary, so that a
 * held step that kept the list it was queued with draws other tokens within a few steps. The
 * last case starts from 250 prompt tokens (repetition penalty), so the list outgrows the 256
 * entries the first held steps reserved: that step is dropped and run as it comes, the draws
 * the same. */
static void test_engine_penalties_ahead(void) {
    ts_engine *ea, *eb;
    ts_model *m = f32_engine_pair(&ea, &eb);
    if (!m) return;
    const struct {
        ts_sampler_params p;
        float rep, freq, pres;
        int n_top, prompt;
    } cases[] = {{{1.0f, 0, 1.0f, 0.0f, 11}, 1.0f, 0.8f, 1.5f, -1, 0},
                 {{0.8f, 20, 0.95f, 0.0f, 12}, 1.3f, 0.5f, 0.5f, -1, 20},
                 {{0.0f, 0, 1.0f, 0.0f, 13}, 1.0f, 2.0f, 2.0f, -1, 0},
                 {{0.9f, 0, 1.0f, 0.05f, 14}, 1.2f, 0.6f, 1.0f, 5, 10},
                 {{0.0f, 0, 1.0f, 0.0f, 15}, 1.5f, 3.0f, 0.0f, 20, 0},
                 {{1.0f, 0, 1.0f, 0.0f, 16}, 1.1f, 1.0f, 1.0f, -1, 250}};
    const int nc = (int)(sizeof cases / sizeof *cases), steps = 16;
    for (int c = 0; ea && eb && c < nc; c++) {
        int V = ts_engine_n_vocab(ea);
        ts_sampler *sa = NULL, *sb = NULL;
        CHECK(ts_sampler_create(&cases[c].p, V, &sa) == TS_OK &&
              ts_sampler_create(&cases[c].p, V, &sb) == TS_OK);
        pen_list l = {calloc((size_t)V, sizeof(ts_logit_adjust)),
                      malloc((size_t)V * sizeof(int)),
                      calloc((size_t)V, sizeof(int)),
                      0,
                      cases[c].rep,
                      cases[c].freq,
                      cases[c].pres};
        for (int t = 0; t < V; t++)
            l.at[t] = -1;
        pen_bias(&l, 9 % V, 2.0f), pen_bias(&l, 4 % V, -1.5f);
        for (int i = 0; i < cases[c].prompt; i++)
            pen_token(&l, (int32_t)((i * 37 + 5) % V), false);
        float *lg = malloc((size_t)V * sizeof *lg);
        ts_engine_slot_clear(ea, 0), ts_engine_slot_clear(eb, 0);
        int32_t ta = 3, sl = 0;
        int diff = 0, lpdiff = 0, n_top = cases[c].n_top;
        const long held0 = ea->ahead.launched_held;
        for (int i = 0; i < steps; i++) {
            ts_sampler_set_adjust(sa, l.adj, l.n);
            ts_sampler_set_adjust(sb, l.adj, l.n);
            int32_t p = i, tb = ta;
            ts_batch ba = {1, &ta, &p, &sl, NULL, NULL, NULL},
                     bb = {1, &tb, &p, &sl, NULL, NULL, NULL};
            ts_logprobs got = {0}, want = {0};
            CHECK((n_top < 0 ? ts_engine_forward_sample(ea, &ba, &sa, &ta)
                             : ts_engine_forward_sample_logprobs(ea, &ba, &sa, n_top, &ta, &got)) ==
                  TS_OK);
            CHECK(ts_engine_forward(eb, &bb, lg) == TS_OK);
            ts_sampler_adjust(sb, lg);
            diff += ta != ts_sampler_sample(sb, lg);
            if (n_top >= 0) {
                ts_sampler_logprobs(sb, lg, ta, n_top, &want);
                bool same = got.n_top == want.n_top && fabsf(got.logprob - want.logprob) <= 1e-4f;
                for (int k = 0; same && k < want.n_top; k++)
                    same = got.top_id[k] == want.top_id[k];
                lpdiff += !same;
            }
            if (ta >= 0 && ta < V) pen_token(&l, ta, true);
        }
        long held = ea->ahead.launched_held - held0;
        CHECKF(diff == 0 && lpdiff == 0,
               "penalties case %d: %d of %d draws and %d log-probabilities differ from the host's",
               c, diff, steps, lpdiff);
        /* the first step is never held, the second was queued before the list had an entry
         * (frequency and presence only); the list past 256 entries drops one more */
        int want_held = steps - 2 - (cases[c].prompt > 200);
        CHECKF(held >= want_held, "penalties case %d: %ld of %d steps decoded ahead (want %d)", c,
               held, steps, want_held);
        printf("  penalised draws case %d: %d entries at the end, %ld of %d steps decoded ahead\n",
               c, l.n, held, steps);
        ts_sampler_free(sa), ts_sampler_free(sb);
        free(lg), free(l.adj), free(l.at), free(l.count);
    }
    if (ea) ts_engine_free(ea);
    if (eb) ts_engine_free(eb);
    ts_model_close(m);
}

/* Decode through replayed CUDA graphs must give the same logits, bit for bit, as the ops run one
 * by one (TESSERA_CUDA_GRAPHS=0), with several sequences decoding together and one alone, and
 * with 12 sequences of a BF16 model (the tensor-core GEMM of cuda_gemm_skinny.cu, clusters and
 * all, inside the graph); and the graph engine must actually replay. ts_engine_forward_greedy
 * must pick the argmax of the logits that ts_engine_forward returns. */
#define GD_MAX_B 12
static ts_engine *make_engine_dev(ts_model *m, int n_slots, ts_device dv);

/* steps decode steps of B sequences from fresh slots, each step feeding back the tokens it chose:
 * with logits ([steps][B][V] floats), the argmax of the logits ts_engine_forward downloads;
 * without, ts_engine_forward_greedy's choice on the device. ids[i * B + s] (may be NULL when
 * logits are asked for): the token chosen for sequence s at step i. False on a failed forward. */
static bool decode_steps_at(ts_engine *e, int slot0, int B, int steps, float *logits,
                            int32_t *ids) {
    int V = ts_engine_n_vocab(e);
    int32_t tok[GD_MAX_B], pos[GD_MAX_B], sl[GD_MAX_B], chose[GD_MAX_B];
    uint8_t want[GD_MAX_B];
    for (int s = 0; s < B; s++)
        ts_engine_slot_clear(e, slot0 + s), tok[s] = 3 + 5 * s + slot0, sl[s] = slot0 + s;
    for (int i = 0; i < steps; i++) {
        for (int s = 0; s < B; s++) pos[s] = i, want[s] = 1;
        ts_batch b = {B, tok, pos, sl, want, NULL, NULL};
        float *lg = logits ? logits + (size_t)i * B * V : NULL;
        if ((lg ? ts_engine_forward(e, &b, lg) : ts_engine_forward_greedy(e, &b, chose)) != TS_OK) {
            fprintf(stderr, "forward: %s\n", ts_last_error());
            return false;
        }
        for (int s = 0; s < B; s++) {
            if (lg) {
                const float *r = lg + (size_t)s * V;
                chose[s] = 0;
                for (int j = 1; j < V; j++)
                    if (r[j] > r[chose[s]]) chose[s] = j;
            }
            tok[s] = chose[s];
            if (ids) ids[i * B + s] = chose[s];
        }
    }
    return true;
}

static bool decode_steps(ts_engine *e, int B, int steps, float *logits, int32_t *ids) {
    return decode_steps_at(e, 0, B, steps, logits, ids);
}

/* An engine that runs its ops one by one (TESSERA_CUDA_GRAPHS=0) and one that replays graphs,
 * n_slots each; false (neither kept) when either cannot be made. */
static bool plain_and_graph(ts_model *m, int n_slots, ts_engine **plain, ts_engine **graph) {
    setenv("TESSERA_CUDA_GRAPHS", "0", 1);
    *plain = make_engine_slots(m, n_slots);
    unsetenv("TESSERA_CUDA_GRAPHS");
    *graph = make_engine_slots(m, n_slots);
    CHECK(*plain && *graph);
    if (*plain && *graph) return true;
    ts_engine_free(*plain), ts_engine_free(*graph);
    return false;
}

/* A replay whose arguments did change: one sequence decodes in slot 0, then another in slot 1
 * - the same shape, other state and cache buffers - so the cached graph's nodes are updated
 * before its replays. The logits must be those of the op-by-op engine, bit for bit. */
static void graph_update_case(ts_model *m) {
    ts_engine *plain, *graph;
    if (!plain_and_graph(m, 2, &plain, &graph)) return;
    int V = ts_engine_n_vocab(graph), steps = 6;
    size_t nl = (size_t)steps * V;
    float *a = malloc(2 * nl * sizeof *a), *b = malloc(2 * nl * sizeof *b);
    bool ok = true;
    long r0 = 0, b0 = 0, u0 = 0, r1 = 0, b1 = 0, u1 = 0;
    for (int slot = 0; slot < 2 && ok; slot++) {
        if (slot == 1) ts_backend_cuda_graph_stats(graph->be, &r0, &b0, &u0);
        ok = decode_steps_at(plain, slot, 1, steps, a + slot * nl, NULL) &&
             decode_steps_at(graph, slot, 1, steps, b + slot * nl, NULL);
    }
    ts_backend_cuda_graph_stats(graph->be, &r1, &b1, &u1);
    CHECK(ok);
    CHECKF(ok && memcmp(a, b, 2 * nl * sizeof(float)) == 0,
           "graph decode after a slot change differs from op-by-op decode");
    CHECKF(u1 - u0 > 0 && r1 - r0 >= steps - 1 && b1 == b0,
           "slot change: %ld nodes updated, %ld replays, %ld new graphs", u1 - u0, r1 - r0,
           b1 - b0);
    printf("  graph update (slot 0 -> 1): %ld replays, %ld nodes updated, %s logits\n", r1 - r0,
           u1 - u0, ok && memcmp(a, b, 2 * nl * sizeof(float)) == 0 ? "identical" : "DIFFERENT");
    free(a), free(b);
    ts_engine_free(plain);
    ts_engine_free(graph);
}

static void graph_decode_case(ts_model *m, int B, int steps) {
    ts_engine *plain, *graph;
    if (!plain_and_graph(m, GD_MAX_B, &plain, &graph)) return;
    int V = ts_engine_n_vocab(graph);
    size_t nl = (size_t)steps * B * V;
    int32_t ids_a[16 * GD_MAX_B], ids_b[16 * GD_MAX_B], ids_g[16 * GD_MAX_B];
    float *a = malloc(nl * sizeof *a), *b = malloc(nl * sizeof *b);
    bool ok = decode_steps(plain, B, steps, a, ids_a) && decode_steps(graph, B, steps, b, ids_b);
    CHECK(ok);
    bool same = ok && memcmp(a, b, nl * sizeof(float)) == 0;
    if (ok && !same) {
        /* which side is wrong: the first differing step, and step 0 (the same input tokens
         * everywhere) against the CPU backend */
        int first = 0;
        while (first < steps && memcmp(a + (size_t)first * B * V, b + (size_t)first * B * V,
                                       (size_t)B * V * sizeof(float)) == 0)
            first++;
        ts_engine *cpu_e = make_engine_dev(m, GD_MAX_B, TS_DEVICE_CPU);
        float *c = malloc((size_t)B * V * sizeof *c);
        bool cok = cpu_e && decode_steps(cpu_e, B, 1, c, NULL);
        double ra = cok ? tu_rel_l2(a, c, (long)B * V) : -1.0;
        double rb = cok ? tu_rel_l2(b, c, (long)B * V) : -1.0;
        CHECKF(0, "B=%d: graph decode differs from op-by-op decode from step %d on; step 0 "
                  "against the CPU: op by op %.2e, graph %.2e", B, first, ra, rb);
        free(c);
        if (cpu_e) ts_engine_free(cpu_e);
    }
    long replays = 0, builds = 0, updates = 0, r0 = 0, b0 = 0, u0 = 0;
    ts_backend_cuda_graph_stats(graph->be, &replays, &builds, &updates);
    ts_backend_cuda_graph_stats(plain->be, &r0, &b0, &u0);
    CHECKF(replays >= steps - 3 && builds >= 1, "B=%d: %ld replays, %ld graphs", B, replays,
           builds);
    CHECKF(r0 == 0 && b0 == 0, "TESSERA_CUDA_GRAPHS=0 still built %ld graphs", b0);
    /* a step's arguments (the position included: cuda_kv_pos, cuda_positions) live on the
     * device, so a replay needs no node updated - each update costs the host microseconds */
    CHECKF(updates == 0, "B=%d: %ld graph nodes updated in %ld replays", B, updates, replays);
    printf("  graph decode B=%d: %d steps, %ld replays, %ld graphs, %ld nodes updated, %s "
           "logits\n", B, steps, replays, builds, updates, same ? "identical" : "DIFFERENT");
    /* greedy on the device = argmax of the downloaded logits, step after step */
    CHECK(decode_steps(graph, B, steps, NULL, ids_g));
    /* one sequence's greedy step is kernels alone: its position read and its keys written by
     * the kernels in pinned memory, no copy node at either end of the graph (each cost the
     * step microseconds of the copy engine) */
    int copies = ts_backend_cuda_graph_copies(graph->be);
    if (B == 1)
        CHECKF(copies == 0, "B=1: the greedy step's graph has %d copy or memset nodes", copies);
    /* and the host takes each step's tokens as soon as the argmax has written them, not when
     * the stream's end is signalled (~4 us later): every greedy step's wait but the first */
    long early = ts_backend_cuda_early_waits(graph->be);
    CHECKF(early >= steps - 1, "B=%d: %ld of %d greedy steps' waits returned on their keys", B,
           early, steps);
    for (int i = 0; i < steps; i++)
        for (int s = 0; s < B; s++)
            CHECKF(ids_g[i * B + s] == ids_a[i * B + s], "greedy step %d seq %d: %d vs %d", i, s,
                   ids_g[i * B + s], ids_a[i * B + s]);
    free(a), free(b);
    ts_engine_free(plain);
    ts_engine_free(graph);
}

/* A forward that asks for no output (a prompt's chunk, as the server runs one between its
 * checks for a new request) has run when it returns: nothing of it is left in the queue, and
 * the next token's logits after it are those of a forward of the whole prompt that asked for
 * them. (Left queued, the server's background prefill queued every chunk at once and a new
 * request waited behind all of them.) */
static void test_forward_without_output_finishes(void) {
    char f32[8192], bf16[8192];
    if (!decode_fixtures(f32, bf16)) return;
    ts_model *m = NULL;
    CHECKF(ts_model_open(f32, &m) == TS_OK, "%s: %s", f32, ts_last_error());
    if (!m) return;
    ts_engine *e = make_engine_slots(m, 2);
    CHECK(e);
    int V = e ? ts_engine_n_vocab(e) : 0, n = 12;
    float *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
    int32_t ids[13], pos[13], slot0[13] = {0}, slot1[13];
    uint8_t none[13] = {0};
    for (int i = 0; i < 13; i++)
        ids[i] = (7 * i + 3) % (V ? V : 1), pos[i] = i, slot1[i] = 1;
    for (int rep = 0; e && a && b && rep < 3; rep++) {
        ts_engine_slot_clear(e, 0), ts_engine_slot_clear(e, 1);
        ts_batch q = {n, ids, pos, slot0, none, NULL, NULL};
        CHECK(ts_engine_forward(e, &q, NULL) == TS_OK);
        long left = ts_backend_cuda_queued_ops(e->be);
        CHECKF(left == 0, "a forward without output left %ld ops queued", left);
        ts_batch next = {1, ids + n, pos + n, slot0, NULL, NULL, NULL},
                 whole = {n + 1, ids, pos, slot1, NULL, NULL, NULL};
        CHECK(ts_engine_forward(e, &next, a) == TS_OK);
        CHECK(ts_engine_forward(e, &whole, b) == TS_OK);
        double d = 0, r = 0;
        for (int i = 0; i < V; i++)
            d += (a[i] - b[i]) * (a[i] - b[i]), r += b[i] * b[i];
        CHECKF(d <= 1e-6 * r, "logits after a forward without output: rel L2 %.3g", sqrt(d / r));
    }
    free(a), free(b);
    ts_engine_free(e);
    ts_model_close(m);
}

/* The decode checks' two Qwen3.5 fixtures: the first one (F32 weights) and the BF16 one with
 * 128-wide rows ("bf16_composite"). False (and a failed check) when they are missing. */
static bool decode_fixtures(char f32[8192], char bf16[8192]) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/qwen35", tu_env("TS_FIXTURES", "tests/fixtures"));
    char *names[16];
    int nm = fx_list_models(dir, names, 16);
    CHECK(nm > 0);
    if (nm <= 0) return false;
    int bf = 0;
    for (int i = 0; i < nm; i++)
        if (strstr(names[i], "bf16_composite")) bf = i;
    bool ok = strstr(names[bf], "bf16_composite") != NULL;
    CHECKF(ok, "no bf16_composite fixture in %s", dir);
    snprintf(f32, 8192, "%s/%s", dir, names[0]);
    snprintf(bf16, 8192, "%s/%s", dir, names[bf]);
    for (int i = 0; i < nm; i++) free(names[i]);
    return ok;
}

static void test_graph_decode(void) {
    char f32[8192], bf16[8192];
    if (!decode_fixtures(f32, bf16)) return;
    /* the F32 fixture for 1 and 3 sequences, the BF16 one for 12 */
    for (int c = 0; c < 3; c++) {
        int B = (int[]){1, 3, 12}[c];
        const char *path = B == 12 ? bf16 : f32;
        ts_model *m = NULL;
        CHECKF(ts_model_open(path, &m) == TS_OK, "%s: %s", path, ts_last_error());
        if (!m) continue;
        graph_decode_case(m, B, 12);
        if (B == 1) graph_update_case(m);
        ts_model_close(m);
    }
}

/* Another process that keeps the copy engines busy (the child side of the test below): pinned
 * host memory to the device and back, 256 MiB each way, until killed or `seconds` pass. It says
 * "ready" on stdout after its first round trip. */
static int copy_load_child(int seconds) {
#ifdef TESSERA_HAVE_CUDA
    size_t bytes = (size_t)256 << 20;
    void *h = NULL, *d = NULL;
    cudaStream_t s = NULL;
    if (cudaMallocHost(&h, bytes) != cudaSuccess || cudaMalloc(&d, bytes) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
        return 1;
    time_t end = time(NULL) + seconds;
    for (int round = 0; time(NULL) < end; round++) {
        cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s);
        cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, s);
        if (cudaStreamSynchronize(s) != cudaSuccess) return 1;
        if (round == 0) printf("ready\n"), fflush(stdout);
    }
#else
    (void)seconds;
#endif
    return 0;
}

/* Weights must be on the device before the kernels that read them run, even while another
 * process keeps the copy engines busy: the first decode step of a fresh engine (every weight
 * uploaded during it) must match the CPU backend. (Uploads once went through cudaMemcpy, on the
 * legacy default stream, which does not order the backend's non-blocking stream and which, from
 * pageable memory, returns before its last DMA has landed: with another process copying, nearly
 * every first step read some stale weights. Copies on a second stream of this process did not
 * show it, hence the child process.) */
static void test_upload_under_copy_load(void) {
    char paths[2][8192];
    if (!decode_fixtures(paths[0], paths[1])) return;
    int fd[2];
    CHECK(pipe(fd) == 0);
    pid_t child = fork();
    if (child == 0) { /* exec at once: a forked CUDA process may not use CUDA */
        dup2(fd[1], 1), close(fd[0]), close(fd[1]);
        setenv("TS_CUDA_COPY_LOAD", "120", 1);
        execl("/proc/self/exe", "test_cuda", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char ready[16] = {0};
    FILE *from = fdopen(fd[0], "r");
    bool loaded = child > 0 && from && fgets(ready, sizeof ready, from) &&
                  strcmp(ready, "ready\n") == 0;
    CHECKF(loaded, "the copy-load process did not start");
    enum { B = 3, REPS = 8 };
    double worst = 0.0;
    for (int f = 0; loaded && f < 2; f++) {
        ts_model *m = NULL;
        CHECKF(ts_model_open(paths[f], &m) == TS_OK, "%s: %s", paths[f], ts_last_error());
        if (!m) continue;
        ts_engine *ce = make_engine_dev(m, B, TS_DEVICE_CPU);
        int V = ce ? ts_engine_n_vocab(ce) : 0;
        float *ref = malloc((size_t)B * V * sizeof *ref), *got = malloc((size_t)B * V * sizeof *got);
        CHECK(ce && decode_steps(ce, B, 1, ref, NULL));
        for (int r = 0; ce && r < REPS; r++) {
            ts_engine *ge = make_engine_slots(m, B);
            bool ok = ge && decode_steps(ge, B, 1, got, NULL);
            CHECK(ok);
            double rel = ok ? tu_rel_l2(got, ref, (long)B * V) : 1.0;
            CHECKF(rel < 1e-3, "%s with another process copying: step 0 of fresh engine %d is "
                               "%.2e from the CPU", paths[f], r, rel);
            if (rel > worst) worst = rel;
            if (ge) ts_engine_free(ge);
        }
        free(ref), free(got);
        if (ce) ts_engine_free(ce);
        ts_model_close(m);
    }
    if (child > 0) kill(child, SIGTERM), waitpid(child, NULL, 0);
    if (from) fclose(from);
    else close(fd[0]);
    printf("  uploads while another process copies: %d fresh engines x 2 models, worst %.2e "
           "from the CPU\n", REPS, worst);
}

/* Several sequences in one batch, runs of different lengths (the *_runs ops), then decode steps
 * of all of them together: CUDA against the CPU, every position's logits. */

static void test_multi_runs(const char *family) {
    char dir[4096], path[8192];
    snprintf(dir, sizeof dir, "%s/%s", tu_env("TS_FIXTURES", "tests/fixtures"), family);
    char *names[16];
    int nm = fx_list_models(dir, names, 16);
    CHECK(nm > 0);
    for (int mi = 0; mi < nm; mi++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[mi]);
        ts_model *m = NULL;
        if (ts_model_open(path, &m) != TS_OK) {
            CHECKF(0, "%s: %s", path, ts_last_error());
            continue;
        }
        ts_engine *ec = make_engine_dev(m, 4, TS_DEVICE_CPU), *eg = make_engine_dev(m, 4,
                                                                                  TS_DEVICE_CUDA);
        int V = ts_engine_n_vocab(ec);
        /* slots 2, 0, 1 with 5, 1, 3 tokens, then 3 steps of one token each, out of order */
        int32_t tok[9] = {5, 6, 7, 8, 9, 11, 12, 13, 14}, sl[9] = {2, 2, 2, 2, 2, 0, 1, 1, 1},
                pos[9] = {0, 1, 2, 3, 4, 0, 0, 1, 2};
        uint8_t want[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
        float *a = malloc((size_t)9 * V * 4), *b = malloc((size_t)9 * V * 4);
        for (int s = 0; s < 3; s++) ts_engine_slot_clear(ec, s), ts_engine_slot_clear(eg, s);
        ts_batch bt = {9, tok, pos, sl, want, NULL, NULL};
        CHECK(ts_engine_forward(ec, &bt, a) == TS_OK && ts_engine_forward(eg, &bt, b) == TS_OK);
        double worst = tu_rel_l2(b, a, 9L * V);
        int32_t len[3] = {1, 3, 5};
        for (int step = 0; step < 3; step++) {
            int32_t t3[3] = {20 + step, 30 + step, 40 + step}, s3[3] = {1, 2, 0}, p3[3];
            for (int i = 0; i < 3; i++) p3[i] = len[s3[i]]++;
            ts_batch d = {3, t3, p3, s3, want, NULL, NULL};
            CHECK(ts_engine_forward(ec, &d, a) == TS_OK && ts_engine_forward(eg, &d, b) == TS_OK);
            double r = tu_rel_l2(b, a, 3L * V);
            worst = r > worst ? r : worst;
        }
        CHECKF(worst <= 1e-4, "%s/%s: multi-sequence cuda vs cpu rel L2 %.3g", family,
               names[mi], worst);
        printf("  %s/%s: 3 sequences, runs of 5/1/3 then 3 joint steps: cuda vs cpu %.2e\n",
               family, names[mi], worst);
        free(a), free(b);
        ts_engine_free(ec);
        ts_engine_free(eg);
        ts_model_close(m);
        free(names[mi]);
    }
}

static ts_engine *make_engine_slots(ts_model *m, int n_slots) {
    return make_engine_dev(m, n_slots, TS_DEVICE_CUDA);
}

static ts_engine *make_engine_dev(ts_model *m, int n_slots, ts_device dv) {
    ts_engine_opts o;
    ts_engine_opts_default(&o);
    o.n_ctx = 64;
    o.n_batch = 16;
    o.n_slots = n_slots;
    o.n_threads = 2;
    o.device = dv;
    ts_engine *e = NULL;
    if (ts_engine_create(m, &o, &e) != TS_OK) fprintf(stderr, "engine: %s\n", ts_last_error());
    return e;
}

static ts_engine *make_engine(ts_model *m, ts_device dev_kind) {
    ts_engine_opts o;
    ts_engine_opts_default(&o);
    o.n_ctx = 256;
    o.n_batch = 64;
    o.n_threads = 2;
    o.device = dev_kind;
    ts_engine *e = NULL;
    if (ts_engine_create(m, &o, &e) != TS_OK) fprintf(stderr, "engine: %s\n", ts_last_error());
    return e;
}

/* All-position logits of a prompt, then n_dec greedy decode steps (logits appended). */
static float *run_prompt(ts_engine *e, const int32_t *ids, int n, int n_dec, int32_t *dec_ids) {
    int V = ts_engine_n_vocab(e);
    float *out = malloc((size_t)(n + n_dec) * V * sizeof *out);
    int32_t *pos = malloc((size_t)n * 4), *sl = malloc((size_t)n * 4);
    uint8_t *want = malloc((size_t)n);
    for (int i = 0; i < n; i++) pos[i] = i, sl[i] = 0, want[i] = 1;
    ts_batch b = {n, ids, pos, sl, want, NULL, NULL};
    ts_engine_slot_clear(e, 0);
    bool ok = ts_engine_forward(e, &b, out) == TS_OK;
    for (int s = 0; ok && s < n_dec; s++) {
        const float *last = out + (size_t)(n + s - 1) * V;
        int best = 0;
        for (int j = 1; j < V; j++)
            if (last[j] > last[best]) best = j;
        if (dec_ids[s] < 0) dec_ids[s] = best; /* the first engine picks, the second follows */
        int32_t tok = dec_ids[s], p = n + s, s0 = 0;
        uint8_t w1 = 1;
        ts_batch d = {1, &tok, &p, &s0, &w1, NULL, NULL};
        ok = ts_engine_forward(e, &d, out + (size_t)(n + s) * V) == TS_OK;
    }
    if (!ok) {
        fprintf(stderr, "forward: %s\n", ts_last_error());
        free(out);
        out = NULL;
    }
    free(pos), free(sl), free(want);
    return out;
}

/* Marks and rewinds on the device (speculative decoding's wrong guesses taken back): 20 tokens,
 * a mark, two right tokens and three wrong ones in one step, a rewind to after the right ones
 * (Gemma 3: to there; Qwen3.5: to the mark, its linear-attention state copied back), the
 * tokens after that again and one more: that last row as a CPU prefill of the 23 tokens. */
static void test_rewind_on_the_gpu(const char *family, const char *model, bool exact) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/%s", tu_env("TS_FIXTURES", "tests/fixtures"), family, model);
    ts_model *m = NULL;
    if (ts_model_open(path, &m) != TS_OK) {
        CHECKF(0, "%s: %s", path, ts_last_error());
        return;
    }
    ts_engine *g = make_engine_dev(m, 2, TS_DEVICE_CUDA), *c = make_engine_dev(m, 1, TS_DEVICE_CPU);
    if (g && c) {
        int V = ts_engine_n_vocab(g), h = 20;
        int32_t a[32], pos[32], sl[32];
        uint8_t want[32];
        for (int i = 0; i < 32; i++)
            a[i] = (3 + 7 * i) % V, pos[i] = i, sl[i] = 1, want[i] = 0;
        float *rows = malloc(8 * (size_t)V * sizeof *rows), *ref = malloc((size_t)V * 4);
        CHECK(ts_engine_forward(g, &(ts_batch){h, a, pos, sl, want, NULL, NULL}, NULL) == TS_OK);
        CHECK(ts_engine_slot_mark(g, 1) == TS_OK);
        int32_t t[5] = {a[h], a[h + 1], (a[h + 2] + 5) % V, 1, 2};
        uint8_t w5[5] = {1, 1, 1, 1, 1};
        CHECK(ts_engine_forward(g, &(ts_batch){5, t, pos + h, sl, w5, NULL, NULL}, rows) == TS_OK);
        int got = -1;
        CHECK(ts_engine_slot_rewind(g, 1, h + 2, &got) == TS_OK);
        CHECKF(got == (exact ? h + 2 : h), "%s/%s: rewound to %d", family, model, got);
        int n = h + 3 - got;
        for (int i = 0; i < n; i++)
            want[got + i] = i == n - 1;
        CHECK(ts_engine_forward(g, &(ts_batch){n, a + got, pos + got, sl, want + got, NULL, NULL},
                                rows) == TS_OK);
        int32_t s0[32] = {0};
        CHECK(ts_engine_forward(c, &(ts_batch){h + 3, a, pos, s0, NULL, NULL, NULL}, ref) == TS_OK);
        double r = tu_rel_l2(rows, ref, V);
        CHECKF(r <= 1e-3, "%s/%s: after a rewind on the gpu vs a cpu prefill: rel %.3g", family,
               model, r);
        printf("  %s/%s: rewound to %d, then cuda vs cpu %.2e\n", family, model, got, r);
        free(rows), free(ref);
    }
    if (g) ts_engine_free(g);
    if (c) ts_engine_free(c);
    ts_model_close(m);
}

/* 40 sequences a step - the tensor-core GEMM's widest token groups, on a compute capability 9.0
 * device its wgmma form (cuda_gemm_wg.cu) for the 64-column-wide 16-bit weights - against the
 * CPU, the Qwen3.5 BF16 fixtures: a token each from fresh slots, then two more joint steps. */
static void test_wide_batch(void) {
    static const char *models[] = {"tiny_b_bf16_untied_interval3", "tiny_d_bf16_composite"};
    enum { B = 40 };
    for (int mi = 0; mi < 2; mi++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/qwen35/%s", tu_env("TS_FIXTURES", "tests/fixtures"),
                 models[mi]);
        ts_model *m = NULL;
        if (ts_model_open(path, &m) != TS_OK) {
            CHECKF(0, "%s: %s", path, ts_last_error());
            continue;
        }
        ts_engine *e[2] = {NULL, NULL};
        for (int d = 0; d < 2; d++) {
            ts_engine_opts o;
            ts_engine_opts_default(&o);
            o.n_ctx = 64, o.n_batch = 64, o.n_slots = B, o.n_threads = 2;
            o.device = d ? TS_DEVICE_CUDA : TS_DEVICE_CPU;
            CHECKF(ts_engine_create(m, &o, &e[d]) == TS_OK, "engine: %s", ts_last_error());
        }
        if (e[0] && e[1]) {
            int V = ts_engine_n_vocab(e[0]);
            float *a = malloc((size_t)B * V * 4), *b = malloc((size_t)B * V * 4);
            int32_t tok[B], pos[B], sl[B];
            uint8_t want[B];
            double worst = 0.0;
            for (int step = 0; step < 3; step++) {
                for (int s = 0; s < B; s++)
                    tok[s] = (3 + 7 * s + 11 * step) % V, pos[s] = step, sl[s] = s, want[s] = 1;
                ts_batch bt = {B, tok, pos, sl, want, NULL, NULL};
                CHECK(ts_engine_forward(e[0], &bt, a) == TS_OK &&
                      ts_engine_forward(e[1], &bt, b) == TS_OK);
                double r = tu_rel_l2(b, a, (long)B * V);
                worst = r > worst ? r : worst;
            }
            /* tiny_d amplifies the tensor-core GEMM's 1e-4 to 2.5e-4 (mma.sync and wgmma alike,
             * H200); activations rounded to bf16 alone give ~1e-2 */
            CHECKF(worst <= 5e-4, "qwen35/%s: %d sequences cuda vs cpu rel L2 %.3g", models[mi], B,
                   worst);
            printf("  qwen35/%s: %d sequences, 3 joint steps: cuda vs cpu %.2e\n", models[mi], B,
                   worst);
            free(a), free(b);
        }
        for (int d = 0; d < 2; d++)
            if (e[d]) ts_engine_free(e[d]);
        ts_model_close(m);
    }
}

static void test_fixtures(const char *family) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", tu_env("TS_FIXTURES", "tests/fixtures"), family);
    char *names[16];
    int nm = fx_list_models(dir, names, 16);
    CHECKF(nm > 0, "no fixtures under %s", dir);
    for (int mi = 0; mi < nm; mi++) {
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, names[mi]);
        ts_model *m = NULL;
        CHECKF(ts_model_open(path, &m) == TS_OK, "%s: %s", path, ts_last_error());
        if (!m) continue;
        ts_engine *ec = make_engine(m, TS_DEVICE_CPU), *eg = make_engine(m, TS_DEVICE_CUDA);
        CHECK(ec && eg);
        for (int p = 0; ec && eg && p < 4; p++) {
            int32_t *ids;
            int n;
            snprintf(path, sizeof path, "%s/%s/ref/prompt_%d.ids", dir, names[mi], p);
            if (fx_read_ids(path, 0, &ids, &n) != 0) continue;
            int V = ts_engine_n_vocab(ec), n_dec = 4;
            int32_t dec[4] = {-1, -1, -1, -1};
            float *lc = run_prompt(ec, ids, n, n_dec, dec), *lg = run_prompt(eg, ids, n, n_dec, dec);
            snprintf(path, sizeof path, "%s/%s/ref/prompt_%d.logits", dir, names[mi], p);
            float *ref = fx_read_floats(path, (long)n * V);
            CHECK(lc && lg);
            if (lc && lg) {
                size_t tot = (size_t)(n + n_dec) * V;
                double rel = tu_rel_l2(lg, lc, (long)tot);
                CHECKF(rel <= LOGIT_TOL, "%s/%s prompt %d: cuda vs cpu rel L2 %.3g", family,
                       names[mi], p, rel);
                if (ref) {
                    double rr = tu_rel_l2(lg, ref, (long)n * V);
                    CHECKF(rr <= LOGIT_TOL, "%s/%s prompt %d: cuda vs HF rel L2 %.3g", family,
                           names[mi], p, rr);
                }
                int mism = 0, checked = 0;
                for (int t = 0; t < n + n_dec; t++) {
                    const float *a = lc + (size_t)t * V, *b = lg + (size_t)t * V;
                    int i1 = 0, i2 = -1, j1 = 0;
                    for (int j = 1; j < V; j++) {
                        if (a[j] > a[i1]) i2 = i1, i1 = j;
                        else if (i2 < 0 || a[j] > a[i2]) i2 = j;
                        if (b[j] > b[j1]) j1 = j;
                    }
                    if (i2 >= 0 && a[i1] - a[i2] < 1e-3f * (fabsf(a[i1]) + 1.0f)) continue;
                    checked++;
                    mism += i1 != j1;
                }
                CHECKF(mism == 0, "%s/%s prompt %d: %d of %d argmax differ", family, names[mi],
                       p, mism, checked);
                printf("  %s/%s prompt %d (%d tokens + %d decoded): cuda vs cpu %.2e%s\n", family,
                       names[mi], p, n, n_dec, rel, ref ? "" : " (no HF logits)");
            }
            free(lc), free(lg), free(ref), free(ids);
        }
        ts_engine_free(ec);
        ts_engine_free(eg);
        ts_model_close(m);
        free(names[mi]);
    }
}

/* The split of a GEMM's activations written by the op that produced them (swiglu, gelu_mul,
 * gated_rmsnorm, sigmoid_gate), the matmul then skipping its own split kernel: the matmul's
 * bits are those of a backend that always splits (TESSERA_CUDA_SPLIT_FUSED=0), for 8 and 64
 * tokens, rows of x padded or not; and where another op changes x in between (an add), the
 * matmul splits the new x, not the producer's. */
static void test_split_fused(void) {
    ts_backend *bno = gpu_with("TESSERA_CUDA_SPLIT_FUSED", "0", NULL, NULL);
    if (!bno) return;
    int rows = 300, heads = 4, hd = 128, cols = heads * hd;
    float *wf;
    ts_tensor W = make_weight(TS_DTYPE_BF16, rows, cols, &wf);
    free(wf);
    kept_extra((void *)W.data);
    for (int ci = 0; ci < 16; ci++) {
        int kind = ci % 4, n = ci & 4 ? 64 : 8;
        bool stale = ci & 8;
        int64_t ldx = kind == 2 ? cols : cols + 8; /* gated_rmsnorm writes dense rows */
        size_t nx = (size_t)n * ldx, ny = (size_t)n * rows;
        float *a = rnd(nx, 2.0f), *b = rnd(nx, 2.0f), *y0 = rnd(ny, 1.0f), *nw = rnd(hd, 1.0f);
        float *got[2];
        ts_backend *bes[2] = {gpu, bno};
        for (int k = 0; k < 2; k++) {
            ts_backend *be = bes[k];
            float *da = be->ops->alloc(be, nx * 4), *db = be->ops->alloc(be, nx * 4);
            float *dx = be->ops->alloc(be, nx * 4), *dy = be->ops->alloc(be, ny * 4);
            float *dw = be->ops->alloc(be, (size_t)hd * 4);
            be->ops->upload(be, da, a, nx * 4);
            be->ops->upload(be, db, b, nx * 4);
            be->ops->upload(be, dx, a, nx * 4);
            be->ops->upload(be, dy, y0, ny * 4);
            be->ops->upload(be, dw, nw, (size_t)hd * 4);
            be->ops->matmul_add(be, &W, da, ldx, n, dy, rows); /* the weight's upload first */
            be->ops->upload(be, dy, y0, ny * 4);
            switch (kind) {
            case 0: be->ops->swiglu(be, da, db, ldx, n, cols, dx, ldx); break;
            case 1: be->ops->gelu_mul(be, da, db, ldx, n, cols, dx, ldx); break;
            case 2: be->ops->gated_rmsnorm(be, da, db, n, heads, hd, dw, 1e-6f, dx); break;
            default: be->ops->sigmoid_gate(be, dx, ldx, db, ldx, n, heads, hd, hd); break;
            }
            if (stale) be->ops->add(be, dx, db, (int64_t)nx);
            be->ops->matmul_add(be, &W, dx, ldx, n, dy, rows);
            got[k] = host_of(be, dy, ny);
            float *bufs[] = {da, db, dx, dy, dw};
            for (int i = 0; i < 5; i++)
                be->ops->free(be, bufs[i]);
        }
        CHECKF(memcmp(got[0], got[1], ny * 4) == 0,
               "split written by op %d (%d tokens%s): the matmul's bits differ", kind, n,
               stale ? ", x changed after it" : "");
        free(got[0]), free(got[1]), free(a), free(b), free(y0), free(nw);
    }
    ts_backend_free(bno);
}

/* The single-token GEMV with x staged in shared memory (cuda_gemv_one.cu's g1_xs_takes: a
 * 16-bit row a warp, 2048 columns or more, a small grid) gives the bits of the same GEMV
 * reading x from global memory (TESSERA_CUDA_GEMV1_XSMEM=0), with and without the residual
 * add and the folded input norm. */
static void test_gemv_x_staged(void) {
    ts_backend *b0 = gpu_with("TESSERA_CUDA_GEMV1_XSMEM", "0", NULL, NULL);
    ts_backend *b2 = gpu_with("TESSERA_CUDA_GEMV1_XSMEM", "2", NULL, NULL);
    if (!b0 || !b2) return;
    /* rows, cols; the last staged with XSMEM=2 only: a grid of several rounds (a row a warp
     * is the last form for rows over 2048 columns), whose first round's y an add reads early
     * and the later rounds' at their store */
    static const int shapes[][2] = {{300, 2048}, {1000, 3584}, {37, 4096}, {6000, 4096}};
    for (int ci = 0; ci < 32; ci++) {
        int rows = shapes[ci % 4][0], cols = shapes[ci % 4][1];
        ts_dtype dt = ci & 8 ? TS_DTYPE_F16 : TS_DTYPE_BF16;
        bool norm = ci & 16, add = ci & 4;
        float *wf, *x = rnd(cols, 2.0f), *y0 = rnd(rows, 1.0f), *nw = rnd(cols, 1.0f);
        ts_tensor W = make_weight(dt, rows, cols, &wf);
        free(wf);
        kept_extra((void *)W.data);
        float *got[3];
        ts_backend *bes[3] = {gpu, b2, b0};
        for (int k = 0; k < 3; k++) {
            ts_backend *be = bes[k];
            float *dx = be->ops->alloc(be, (size_t)cols * 4), *dy = be->ops->alloc(be, rows * 4);
            float *dn = be->ops->alloc(be, (size_t)cols * 4), *ds = be->ops->alloc(be, cols * 4);
            be->ops->upload(be, dx, x, (size_t)cols * 4);
            be->ops->upload(be, dy, y0, (size_t)rows * 4);
            be->ops->upload(be, dn, nw, (size_t)cols * 4);
            if (norm) {
                ts_prenorm pre = {dn, 1e-6f, ds};
                const ts_tensor *Ws[1] = {&W};
                float *dys[1] = {dy};
                int64_t lds[1] = {rows};
                be->ops->matmul_n(be, Ws, 1, dx, cols, 1, &pre, dys, lds);
            } else if (add) {
                be->ops->matmul_add(be, &W, dx, cols, 1, dy, rows);
            } else {
                be->ops->matmul(be, &W, dx, cols, 1, dy, rows);
            }
            got[k] = host_of(be, dy, rows);
            float *bufs[] = {dx, dy, dn, ds};
            for (int i = 0; i < 4; i++)
                be->ops->free(be, bufs[i]);
        }
        for (int k = 0; k < 2; k++)
            CHECKF(memcmp(got[k], got[2], (size_t)rows * 4) == 0,
                   "gemv %s %d x %d%s, XSMEM %s: x from shared memory gives other bits",
                   ts_dtype_name(dt), rows, cols,
                   norm  ? " normed"
                   : add ? " added"
                         : "",
                   k ? "2" : "default");
        free(got[0]), free(got[1]), free(got[2]), free(x), free(y0), free(nw);
    }
    ts_backend_free(b0);
    ts_backend_free(b2);
}

/* The few-token GEMV cases' op (kind: 0 matmul_n of W0, 1 matmul_add, 2 matmul_n of W0 and W1
 * with the input norm nw folded, 3 the gated MLP normed (SiLU), 4 the gated MLP (GELU), 5
 * matmul_n of W0 and W1) through gemv1_run on backend be: n tokens of x (rows ldx apart), y0 the
 * outputs' values before (the add); returns the outputs packed, token after token, n * (r0 + r1)
 * values (r1: W1's rows, 0 unless stacked). */
static float *few_run(ts_backend *be, int kind, const ts_tensor *W0, const ts_tensor *W1, int n,
                      const float *x, int64_t ldx, const float *y0, const float *nw) {
    bool stack = kind == 2 || kind == 5, glu = kind == 3 || kind == 4;
    ts_tensor W[2] = {*W0, *W1};
    int rs[2] = {(int)ts_tensor_rows(W0), stack ? (int)ts_tensor_rows(W1) : 0};
    return gemv1_run(be, W, stack ? 2 : 1, rs, (int)ts_tensor_cols(W0), n, x, ldx, nw, 1e-6f,
                     kind == 2 || kind == 3, glu, kind == 4, kind == 1, y0);
}

/* few_run's outputs from the CPU's ops over the weights' exact values F0, F1 (the CPU backend
 * has no fused matmul_add, matmul_n or matmul_glu: they are composed here) */
static float *few_ref(int kind, const ts_tensor *F0, const ts_tensor *F1, int n, const float *x,
                      int64_t ldx, const float *y0, const float *nw) {
    bool stack = kind == 2 || kind == 5;
    int r0 = (int)ts_tensor_rows(F0), r1 = stack ? (int)ts_tensor_rows(F1) : 0;
    int cols = (int)ts_tensor_cols(F0), out = r0 + r1;
    float *xn = malloc((size_t)n * cols * 4), *got = malloc((size_t)n * out * 4);
    float *tg = malloc((size_t)n * r0 * 4), *tu = malloc((size_t)n * r0 * 4);
    if (kind == 2 || kind == 3)
        cpu->ops->rmsnorm(cpu, x, ldx, n, cols, nw, 1e-6f, xn, cols);
    else
        for (int t = 0; t < n; t++)
            memcpy(xn + (size_t)t * cols, x + t * ldx, (size_t)cols * 4);
    cpu->ops->matmul(cpu, F0, xn, cols, n, got, out);
    if (kind == 1)
        for (size_t i = 0; i < (size_t)n * out; i++)
            got[i] += y0[i];
    if (stack) cpu->ops->matmul(cpu, F1, xn, cols, n, got + r0, out);
    if (kind == 3 || kind == 4) {
        cpu->ops->matmul(cpu, F0, xn, cols, n, tg, r0);
        cpu->ops->matmul(cpu, F1, xn, cols, n, tu, r0);
        if (kind == 3)
            cpu->ops->swiglu(cpu, tg, tu, r0, n, r0, got, out);
        else
            cpu->ops->gelu_mul(cpu, tg, tu, r0, n, r0, got, out);
    }
    free(xn), free(tg), free(tu);
    return got;
}

/* 2-3 tokens of 16-bit weights through the single-token GEMV's kernel (cuda_gemv_one.cu, T
 * tokens at once): each token's outputs the bits of that token alone, and the bits of the
 * general GEMV of cuda_matmul.cu (a backend with TESSERA_CUDA_GEMV1_TOKENS=1), within the fp32
 * bound of the CPU's product; x's and y's rows further apart than their widths. Plain, added
 * to y, stacked with the input norm folded, the gated MLP's two forms; shapes with x staged in
 * shared memory (1024 rows of 2048 and 3584 columns), rows going round (20000 rows), more
 * rows than one round's warps and a long row (4104 columns). The kernel must have run. */
static void test_gemv_few(void) {
    ts_backend *gen = gpu_with("TESSERA_CUDA_GEMV1_TOKENS", "1", NULL, NULL);
    if (!gen) return;
    static const int cases[][4] = {
        /* kind, rows (W0), rows (W1), cols */
        {0, 1024, 0, 3584},   {1, 1024, 0, 2048},  {2, 6144, 2056, 1024}, {3, 3584, 3584, 1024},
        {4, 2048, 2048, 640}, {0, 20000, 0, 1024}, {1, 3000, 0, 4104},    {2, 40, 24, 256}};
    long launches = ts_backend_cuda_gemv_few_launches(gpu);
    for (int ci = 0; ci < (int)(sizeof cases / sizeof *cases); ci++) {
        int kind = cases[ci][0], r0 = cases[ci][1], r1 = cases[ci][2], cols = cases[ci][3];
        ts_dtype dt = ci & 1 ? TS_DTYPE_F16 : TS_DTYPE_BF16;
        float *f0, *f1 = NULL;
        ts_tensor W0 = make_weight(dt, r0, cols, &f0), W1 = {0};
        if (r1) W1 = make_weight(dt, r1, cols, &f1);
        ts_tensor F0 = {TS_DTYPE_F32, 2, {r0, cols, 1, 1, 1, 1}, f0, (uint64_t)r0 * cols * 4};
        ts_tensor F1 = {TS_DTYPE_F32, 2, {r1, cols, 1, 1, 1, 1}, f1, (uint64_t)r1 * cols * 4};
        int out = kind == 2 ? r0 + r1 : r0;
        int64_t ldx = cols + 8;
        float *x = rnd((size_t)3 * ldx, 2.0f), *y0 = rnd((size_t)3 * out, 1.0f);
        float *nw = rnd(cols, 1.0f);
        for (int n = 2; n <= 3; n++) {
            const float *yb = kind == 1 ? y0 : NULL;
            float *got = few_run(gpu, kind, &W0, &W1, n, x, ldx, yb, nw);
            float *ref = few_run(gen, kind, &W0, &W1, n, x, ldx, yb, nw);
            float *cpu_y = few_ref(kind, &F0, &F1, n, x, ldx, yb, nw);
            char what[96];
            snprintf(what, sizeof what, "gemv of %d tokens, kind %d, %s %d+%d x %d", n, kind,
                     ts_dtype_name(dt), r0, r1, cols);
            CHECKF(memcmp(got, ref, (size_t)n * out * 4) == 0, "%s: not the general GEMV's bits",
                   what);
            double rel = tu_rel_l2(got, cpu_y, (long)n * out);
            CHECKF(rel <= FP32_TOL, "%s: rel L2 %.3g against the CPU", what, rel);
            for (int t = 0; t < n; t++) {
                float *one = few_run(gpu, kind, &W0, &W1, 1, x + t * ldx, ldx,
                                     yb ? yb + (size_t)t * out : NULL, nw);
                CHECKF(memcmp(got + (size_t)t * out, one, (size_t)out * 4) == 0,
                       "%s: token %d's bits differ from the token alone", what, t);
                free(one);
            }
            free(got), free(ref), free(cpu_y);
        }
        kept_extra((void *)W0.data);
        if (r1) kept_extra((void *)W1.data);
        free(f0), free(f1), free(x), free(y0), free(nw);
    }
    long ran = ts_backend_cuda_gemv_few_launches(gpu) - launches;
    printf("  few-token GEMV launches: %ld\n", ran);
    CHECKF(ran >= 16, "the few-token GEMV ran %ld times for 16 products", ran);
    CHECKF(ts_backend_cuda_gemv_few_launches(gen) == 0,
           "TESSERA_CUDA_GEMV1_TOKENS=1 still ran the few-token GEMV");
    ts_backend_free(gen);
}

/* 2 tokens of quantized weights through the single-token GEMV's kernel: on the global backend
 * (the float decode) and on one with the integer form (TESSERA_CUDA_GEMV1_INT8=1, x to int8 per
 * token: GEMVs of 2048 rows and more whose rows have at most 2048 K-quant columns, else the
 * float decode), each token's outputs the bits of that token alone on the same backend (the
 * case of 4096 columns: the integer form alone, the float decode with two, so there the bound
 * alone), within the CPU's fp32 product by 1e-5 (float decode) or 1e-2 (int8; test_gemv_int8
 * bounds its error closely). Stacked, plain over rounds, added, the gated MLP; no input norm
 * (one token folds it into quantized weights, two take it as a kernel of its own: other bits
 * alone, by design). The kernel must have run. The Q6_K GEMV of 20000 rows and the Q8_0 one of
 * 40000 rows of 640 columns (Gemma 3's head: 20 units a row) go round the grid: the integer form
 * takes them with x's int8 runs staged in shared memory, and the Q6_K one by half warps (16
 * lanes a row), once for two tokens and once for each alone, which must have run - each
 * token's outputs the bits of a backend that keeps x's int8 runs in registers
 * (TESSERA_CUDA_GEMV1_XSMEM=0). */
static void test_gemv_few_quant(void) {
    ts_backend *i8 = gpu_with("TESSERA_CUDA_GEMV1_INT8", "1", NULL, NULL);
    ts_backend *i8r = gpu_with("TESSERA_CUDA_GEMV1_INT8", "1", "TESSERA_CUDA_GEMV1_XSMEM", "0");
    if (!i8 || !i8r) return;
    static const struct {
        int kind;
        ts_dtype dt;
        int r0, r1, cols;
        bool round; /* rows that go round: x8 staged on the int8 backend (Q6_K: half warps) */
    } cases[] = {{5, TS_DTYPE_Q4_K, 6144, 2048, 1024, 0}, {0, TS_DTYPE_Q6_K, 20000, 0, 1024, 1},
                 {4, TS_DTYPE_Q8_0, 2048, 2048, 640, 0},  {1, TS_DTYPE_Q4_0, 1024, 0, 3584, 0},
                 {0, TS_DTYPE_Q5_0, 3000, 0, 2048, 0},    {4, TS_DTYPE_Q4_K, 3584, 3584, 1024, 0},
                 {1, TS_DTYPE_Q4_K, 2500, 0, 4096, 0},    {0, TS_DTYPE_Q8_0, 40000, 0, 640, 1}};
    const int nc = (int)(sizeof cases / sizeof *cases);
    long launches[2] = {ts_backend_cuda_gemv_few_launches(gpu),
                        ts_backend_cuda_gemv_few_launches(i8)};
    for (int ci = 0; ci < nc; ci++) {
        long halves = ts_backend_cuda_gemv_half_launches(i8);
        long staged = ts_backend_cuda_gemv_x8_staged_launches(i8);
        int kind = cases[ci].kind, r0 = cases[ci].r0, r1 = cases[ci].r1, cols = cases[ci].cols;
        ts_dtype dt = cases[ci].dt;
        float *f0, *f1 = NULL;
        ts_tensor W0 = make_weight(dt, r0, cols, &f0), W1 = {0};
        if (r1) W1 = make_weight(dt, r1, cols, &f1);
        ts_tensor F0 = {TS_DTYPE_F32, 2, {r0, cols, 1, 1, 1, 1}, f0, (uint64_t)r0 * cols * 4};
        ts_tensor F1 = {TS_DTYPE_F32, 2, {r1, cols, 1, 1, 1, 1}, f1, (uint64_t)r1 * cols * 4};
        int out = kind == 5 ? r0 + r1 : r0, n = 2;
        int64_t ldx = cols + 8;
        float *x = rnd((size_t)n * ldx, 2.0f), *y0 = rnd((size_t)n * out, 1.0f);
        float *nw = rnd(cols, 1.0f);
        const float *yb = kind == 1 ? y0 : NULL;
        float *cpu_y = few_ref(kind, &F0, &F1, n, x, ldx, yb, nw);
        for (int b = 0; b < 2; b++) {
            ts_backend *be = b ? i8 : gpu;
            float *got = few_run(be, kind, &W0, &W1, n, x, ldx, yb, nw);
            char what[96];
            snprintf(what, sizeof what, "gemv of 2 tokens, kind %d, %s %d+%d x %d%s", kind,
                     ts_dtype_name(dt), r0, r1, cols, b ? ", int8" : "");
            double rel = tu_rel_l2(got, cpu_y, (long)n * out);
            CHECKF(rel <= (b ? 1e-2 : FP32_TOL), "%s: rel L2 %.3g against the CPU", what, rel);
            for (int t = 0; t < n && !(b && cols > 2048); t++) {
                float *one = few_run(be, kind, &W0, &W1, 1, x + t * ldx, ldx,
                                     yb ? yb + (size_t)t * out : NULL, nw);
                CHECKF(memcmp(got + (size_t)t * out, one, (size_t)out * 4) == 0,
                       "%s: token %d's bits differ from the token alone", what, t);
                free(one);
            }
            if (b && cases[ci].round) { /* x8 staged: the bits of x8 in registers */
                float *reg = few_run(i8r, kind, &W0, &W1, n, x, ldx, yb, nw);
                CHECKF(memcmp(got, reg, (size_t)n * out * 4) == 0,
                       "%s: x's int8 runs staged in shared memory give other bits than in "
                       "registers",
                       what);
                free(reg);
            }
            free(got);
        }
        halves = ts_backend_cuda_gemv_half_launches(i8) - halves;
        staged = ts_backend_cuda_gemv_x8_staged_launches(i8) - staged;
        bool half = cases[ci].round && dt == TS_DTYPE_Q6_K;
        CHECKF(half ? halves >= 3 : halves == 0, "%s %d x %d: %ld half-warp GEMV launches",
               ts_dtype_name(dt), r0, cols, halves);
        CHECKF(cases[ci].round ? staged >= 3 : staged == 0,
               "%s %d x %d: %ld GEMV launches with x8 staged", ts_dtype_name(dt), r0, cols, staged);
        kept_extra((void *)W0.data);
        if (r1) kept_extra((void *)W1.data);
        free(cpu_y), free(f0), free(f1), free(x), free(y0), free(nw);
    }
    for (int b = 0; b < 2; b++) {
        long ran = ts_backend_cuda_gemv_few_launches(b ? i8 : gpu) - launches[b];
        printf("  few-token quantized GEMV launches%s: %ld\n", b ? " (int8)" : "", ran);
        CHECKF(ran >= nc, "the few-token GEMV ran %ld times for %d products", ran, nc);
    }
    ts_backend_free(i8);
    ts_backend_free(i8r);
}

/* One token of a stack of two quantized types (llama.cpp's Q4_K_M: Gemma 3's v in Q8_0 beside q
 * and k in Q5_0; Qwen3.5's delta-rule qkv in Q6_K beside its gate, beta and alpha in Q4_K) in one
 * launch (cuda_gemv_pair.cu): every output the bits of the two launches of a backend with
 * TESSERA_CUDA_GEMV1_PAIR=0 (both with the default integer form: parts of 2048 rows and more),
 * within the CPU's fp32 product by 1e-2. The first type's weights first or not, the norm folded
 * or not (Q8_0 never folds it), rows of one or two units a lane, one part in the integer form
 * beside one in the float decode; a stack too large for one round of the grid keeps two
 * launches. The pair must have run for the others - the Qwen3.5 0.8B's delta-rule stack too,
 * which fits one round only with the Q6_K / Q4_K kernel held to 128 registers. */
static void test_gemv_pair(void) {
    ts_backend *one = gpu_with("TESSERA_CUDA_GEMV1_INT8", "1", NULL, NULL);
    ts_backend *two = gpu_with("TESSERA_CUDA_GEMV1_INT8", "1", "TESSERA_CUDA_GEMV1_PAIR", "0");
    if (!one || !two) return;
    enum { K4 = TS_DTYPE_Q4_K, K6 = TS_DTYPE_Q6_K, Q8 = TS_DTYPE_Q8_0, Q5 = TS_DTYPE_Q5_0 };
    static const struct {
        int nw, dt[4], rows[4], cols, normed, paired;
    } cases[] = {
        {4, {K6, K4, K4, K4}, {2048, 1024, 16, 16}, 1024, 1, 1}, /* int8 beside float */
        {4, {K6, K4, K4, K4}, {6144, 2048, 16, 16}, 1024, 1, 1}, /* the 0.8B's: 4 rows a warp */
        {2, {K4, K6}, {1500, 1000}, 2048, 0, 1},                 /* second type first */
        {3, {Q5, Q5, Q8}, {1024, 256, 256}, 640, 1, 1},          /* Gemma 3's attention */
        {3, {Q8, Q5, Q8}, {300, 40, 24}, 1024, 0, 1},            /* interleaved, small */
        {2, {K6, K4}, {60000, 4000}, 1024, 1, 0},                /* past one round */
    };
    const int nc = (int)(sizeof cases / sizeof *cases);
    long before = ts_backend_cuda_gemv_pair_launches(one), want = 0;
    for (int ci = 0; ci < nc; ci++) {
        int nw = cases[ci].nw, cols = cases[ci].cols, tot = 0, off[4];
        ts_tensor W[4], F[4];
        float *f[4];
        for (int j = 0; j < nw; j++) {
            int r = cases[ci].rows[j];
            W[j] = make_weight((ts_dtype)cases[ci].dt[j], r, cols, &f[j]);
            F[j] =
                (ts_tensor){TS_DTYPE_F32, 2, {r, cols, 1, 1, 1, 1}, f[j], (uint64_t)r * cols * 4};
            off[j] = tot, tot += r;
        }
        float *x = rnd(cols, 2.0f), *nwt = rnd(cols, 1.0f), *xn = malloc((size_t)cols * 4);
        float *want_y = malloc((size_t)tot * 4), *got[2];
        if (cases[ci].normed)
            cpu->ops->rmsnorm(cpu, x, cols, 1, cols, nwt, 1e-6f, xn, cols);
        else
            memcpy(xn, x, (size_t)cols * 4);
        for (int j = 0; j < nw; j++)
            cpu->ops->matmul(cpu, &F[j], xn, cols, 1, want_y + off[j], tot);
        for (int b = 0; b < 2; b++)
            got[b] = gemv1_run(b ? two : one, W, nw, cases[ci].rows, cols, 1, x, cols, nwt, 1e-6f,
                               cases[ci].normed, false, false, false, NULL);
        char what[64];
        snprintf(what, sizeof what, "stack of two types, case %d (%d weights x %d)", ci, nw, cols);
        CHECKF(memcmp(got[0], got[1], (size_t)tot * 4) == 0, "%s: not the two launches' bits",
               what);
        double rel = tu_rel_l2(got[0], want_y, tot);
        CHECKF(rel <= 1e-2, "%s: rel L2 %.3g against the CPU", what, rel);
        want += cases[ci].paired;
        for (int j = 0; j < nw; j++)
            kept_extra((void *)W[j].data), free(f[j]);
        free(x), free(nwt), free(xn), free(want_y), free(got[0]), free(got[1]);
    }
    long ran = ts_backend_cuda_gemv_pair_launches(one) - before;
    printf("  two-type stack launches: %ld\n", ran);
    CHECKF(ran == want, "the pair ran %ld times for %ld stacks", ran, want);
    CHECKF(ts_backend_cuda_gemv_pair_launches(two) == 0, "TESSERA_CUDA_GEMV1_PAIR=0 still paired");
    ts_backend_free(one);
    ts_backend_free(two);
}

/* Decoding ahead, the backend's side: argmax_held's ids, and get_rows_fed's rows from them -
 * the bits of get_rows (the CPU's dequantizer) for every weight type, scaled and not; a flush
 * while ops are held runs none of them. */
static void test_fed_rows(void) {
    const ts_dtype types[] = {TS_DTYPE_F32,  TS_DTYPE_F16,  TS_DTYPE_BF16, TS_DTYPE_Q8_0,
                              TS_DTYPE_Q4_0, TS_DTYPE_Q5_0, TS_DTYPE_Q4_K, TS_DTYPE_Q6_K};
    const ts_backend_ops *op = gpu->ops;
    CHECK(op->step_can_hold && op->step_can_hold(gpu));
    int rows = 300, cols = 512, n = 5, V = 3000;
    int32_t want[5] = {7, 299, 0, 150, 42}, got[5];
    float *x = rnd((size_t)n * V, 1.0f);
    for (int i = 0; i < n; i++)
        x[(size_t)i * V + want[i]] = 50.0f;
    float *dx = dev(x, (size_t)n * V);
    for (int i = 0; i < n; i++)
        got[i] = -9;
    op->argmax_held(gpu, dx, V, n, V, got);
    CHECK(got[0] == -9); /* queued only */
    op->step_launch(gpu);
    op->step_drop(gpu); /* nothing held: stop holding */
    op->step_wait(gpu);
    for (int i = 0; i < n; i++)
        CHECKF(got[i] == want[i], "held argmax row %d: %d", i, got[i]);
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        float *f32;
        ts_tensor W = make_weight(types[t], rows, cols, &f32);
        kept_extra((void *)W.data);
        free(f32);
        for (int sc = 0; sc < 2; sc++) {
            float scale = sc ? 22.627417f : 1.0f, *ref = malloc((size_t)n * cols * 4);
            float *dout = dev(ref, (size_t)n * cols);
            cpu->ops->get_rows(cpu, &W, want, n, scale, ref);
            CHECK(op->get_rows_fed(gpu, &W, n, scale, dout));
            float *h = host(dout, (size_t)n * cols);
            CHECKF(memcmp(h, ref, (size_t)n * cols * 4) == 0,
                   "get_rows_fed %s scale %g: not "
                   "get_rows' bits",
                   ts_dtype_name(types[t]), scale);
            free(h), free(ref);
            op->free(gpu, dout);
        }
    }
    /* held ops: a download's flush must not run them, and the step cannot be sealed */
    float *zero = calloc((size_t)n * cols, 4), *dz = dev(zero, (size_t)n * cols);
    float *f32;
    ts_tensor W = make_weight(TS_DTYPE_BF16, rows, cols, &f32);
    kept_extra((void *)W.data);
    free(f32);
    op->argmax_held(gpu, dx, V, n, V, got);
    op->step_launch(gpu); /* holds what follows */
    CHECK(op->get_rows_fed(gpu, &W, n, 1.0f, dz));
    float *h = host(dz, (size_t)n * cols);
    CHECKF(memcmp(h, zero, (size_t)n * cols * 4) == 0, "a flush ran a held op");
    CHECK(!op->step_seal(gpu));
    op->step_drop(gpu);
    op->step_wait(gpu);
    free(h);
    /* ... and once sealed, the next launch runs them */
    op->argmax_held(gpu, dx, V, n, V, got);
    op->step_launch(gpu);
    CHECK(op->get_rows_fed(gpu, &W, n, 1.0f, dz));
    CHECK(op->step_seal(gpu));
    op->step_wait(gpu);
    op->step_launch(gpu);
    op->step_drop(gpu);
    op->step_wait(gpu);
    float *ref = malloc((size_t)n * cols * 4);
    cpu->ops->get_rows(cpu, &W, want, n, 1.0f, ref);
    h = host(dz, (size_t)n * cols);
    CHECKF(memcmp(h, ref, (size_t)n * cols * 4) == 0, "a sealed held step did not run");
    free(h), free(ref), free(zero), free(x);
    op->free(gpu, dz), op->free(gpu, dx);
}

/* Greedy decode of B sequences (slots 0..B-1) for steps, as a caller does: feeds each step's
 * ids back, except that at step `swap` it feeds (id + 1) % V instead and at step `clear` it
 * clears slot B (not decoding). ids[i * B + s] the step's choices; the logits of one more
 * forward of each sequence go to lg ([B][V]). */
static bool ahead_run(ts_engine *e, int B, int steps, int swap, int clear, int32_t *ids,
                      float *lg) {
    int V = ts_engine_n_vocab(e);
    int32_t tok[GD_MAX_B], pos[GD_MAX_B], sl[GD_MAX_B];
    uint8_t want[GD_MAX_B];
    for (int s = 0; s < B; s++)
        ts_engine_slot_clear(e, s), tok[s] = 3 + 7 * s, sl[s] = s, want[s] = 1;
    for (int i = 0; i < steps; i++) {
        for (int s = 0; s < B; s++)
            pos[s] = i;
        ts_batch b = {B, tok, pos, sl, want, NULL, NULL};
        if (i == clear && ts_engine_slot_clear(e, B) != TS_OK) return false;
        if (ts_engine_forward_greedy(e, &b, ids + i * B) != TS_OK) return false;
        for (int s = 0; s < B; s++)
            tok[s] = i == swap ? (ids[i * B + s] + 1) % V : ids[i * B + s];
    }
    for (int s = 0; s < B; s++) {
        int32_t p = steps, t = tok[s], sp = s;
        ts_batch b = {1, &t, &p, &sp, NULL, NULL, NULL};
        if (ts_engine_forward(e, &b, lg + (size_t)s * V) != TS_OK) return false;
    }
    return true;
}

/* Sampled decode of one sequence in slot 0 for steps with sampler parameters sp (a fresh
 * generator), feeding back the draws but (id + 1) % V at step swap; ids the draws, lg the next
 * forward's logits. */
static bool ahead_sampled_run(ts_engine *e, const ts_sampler_params *sp, bool penalty, int steps,
                              int swap, int32_t *ids, float *lg) {
    static const ts_logit_adjust adj[1] = {{5, 0.0f, 1.3f, 0.5f}};
    int V = ts_engine_n_vocab(e);
    ts_sampler *smp = NULL;
    if (ts_sampler_create(sp, V, &smp) != TS_OK) return false;
    if (penalty) ts_sampler_set_adjust(smp, adj, 1);
    ts_engine_slot_clear(e, 0);
    int32_t tok = 3, s0 = 0;
    bool ok = true;
    for (int i = 0; ok && i < steps; i++) {
        int32_t p = i;
        ts_batch b = {1, &tok, &p, &s0, NULL, NULL, NULL};
        ok = ts_engine_forward_sample(e, &b, &smp, &ids[i]) == TS_OK;
        tok = i == swap ? (ids[i] + 1) % V : ids[i];
    }
    int32_t p = steps;
    ts_batch b = {1, &tok, &p, &s0, NULL, NULL, NULL};
    ok = ok && ts_engine_forward(e, &b, lg) == TS_OK;
    ts_sampler_free(smp);
    return ok;
}

/* The index of x's largest value (the first of equals). */
static int32_t argmax_of(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Decode steps after an image (Qwen3.5's MRoPE: a text token's three rotary positions are equal
 * and run `shift` from its cache row - behind it after an image, whose rows advance the
 * positions by less than their number): on the GPU they take the fused attention step with the
 * run's rope shift and are decoded ahead; their tokens and logits must be the CPU's, whose path
 * rotates by the positions given. Rotary attention sees only differences of positions, so a
 * prompt shifted throughout is no test: the prompt's first rows are unshifted (an image's
 * place), the rest and the decode steps shifted. What a kernel ignoring the shift would give -
 * the CPU's first step with the shift left out - is checked to differ from the right logits, so
 * that the comparison can see it. */
static void test_ahead_rope_shift(void) {
    const char *fx = tu_env("TS_FIXTURES", "tests/fixtures");
    char path[4096];
    snprintf(path, sizeof path, "%s/qwen35_vision/tiny_v_f32", fx);
    ts_model *m = NULL;
    CHECKF(ts_model_open(path, &m) == TS_OK, "%s: %s", path, ts_last_error());
    if (!m) return;
    ts_engine *g = make_engine_dev(m, 1, TS_DEVICE_CUDA), *c = make_engine_dev(m, 2, TS_DEVICE_CPU);
    CHECK(g && c);
    int V = g && c ? ts_engine_n_vocab(g) : 0;
    enum { N = 9, FROM = 4, STEPS = 12 };
    const int shifts[3] = {-3, 23, 0};
    float *lc = malloc((size_t)V * sizeof *lc), *lg = malloc((size_t)V * sizeof *lg);
    float *lw = malloc((size_t)V * sizeof *lw);
    for (int si = 0; g && c && si < 3; si++) {
        int shift = shifts[si];
        int32_t ids[N], pos[N], slot[N] = {0}, slot1[N], rope[3 * N];
        for (int i = 0; i < N; i++) {
            ids[i] = 5 + 37 * i % 400, pos[i] = i, slot1[i] = 1;
            rope[3 * i] = rope[3 * i + 1] = rope[3 * i + 2] = i + (i >= FROM ? shift : 0);
        }
        int32_t tg = -1, tc = -1, same = 0;
        long held0 = g->ahead.launched_held;
        ts_batch pb = {N, ids, pos, slot, NULL, NULL, rope};
        CHECK(ts_engine_slot_clear(g, 0) == TS_OK && ts_engine_slot_clear(c, 0) == TS_OK);
        CHECK(ts_engine_forward_greedy(g, &pb, &tg) == TS_OK);
        CHECK(ts_engine_forward(c, &pb, lc) == TS_OK);
        tc = argmax_of(lc, V);
        if (shift) { /* slot 1: the first step with the shift left out */
            ts_batch pw = {N, ids, pos, slot1, NULL, NULL, rope};
            int32_t p = N, s = 1;
            ts_batch dw = {1, &tc, &p, &s, NULL, NULL, NULL};
            CHECK(ts_engine_slot_clear(c, 1) == TS_OK && ts_engine_forward(c, &pw, lw) == TS_OK &&
                  ts_engine_forward(c, &dw, lw) == TS_OK);
        }
        double rel = -1.0;
        for (int k = 0; k < STEPS && tg == tc; k++, same++) {
            int32_t p = N + k, s = 0, r3[3] = {p + shift, p + shift, p + shift};
            ts_batch d = {1, &tg, &p, &s, NULL, NULL, r3};
            ts_batch dc = {1, &tc, &p, &s, NULL, NULL, r3};
            if (k == STEPS - 1) { /* the last step's logits, on both */
                CHECK(ts_engine_forward(g, &d, lg) == TS_OK);
                tg = argmax_of(lg, V);
            } else {
                CHECK(ts_engine_forward_greedy(g, &d, &tg) == TS_OK);
            }
            CHECK(ts_engine_forward(c, &dc, lc) == TS_OK);
            tc = argmax_of(lc, V);
            if (k == 0 && shift) {
                double seen = tu_rel_l2(lw, lc, V);
                CHECKF(seen > 1e-3, "shift %d: leaving it out changes the logits by only %.3g",
                       shift, seen);
            }
        }
        if (same == STEPS) rel = tu_rel_l2(lg, lc, V);
        long held = g->ahead.launched_held - held0;
        printf("  rope shift %d: %d greedy steps equal, %ld decoded ahead, last logits vs cpu "
               "%.3g\n",
               shift, same, held, rel);
        CHECKF(same == STEPS, "shift %d: the GPU's greedy tokens left the CPU's at step %d", shift,
               same);
        CHECKF(same < STEPS || rel <= LOGIT_TOL, "shift %d: last step's logits vs the CPU's %.3g",
               shift, rel);
        CHECKF(held >= STEPS - 3, "shift %d: %ld of %d steps decoded ahead", shift, held, STEPS);
    }
    free(lc), free(lg), free(lw);
    if (g) ts_engine_free(g);
    if (c) ts_engine_free(c);
    ts_model_close(m);
}

/* Decoding ahead through the engine: the same ids and the same state (the next logits, bit for
 * bit) as the engine without it (TESSERA_DECODE_AHEAD=0), with held steps launched, a token the
 * caller changed and a slot cleared between steps (each drops the held step: had it run, the
 * state would differ), for one and for several sequences; a greedy sampler takes the same
 * path. */
static void test_decode_ahead(void) {
    char f32[8192], bf16[8192], untied[2][8192];
    if (!decode_fixtures(f32, bf16)) return;
    /* models whose embedding is not the output head: it goes to the device at the first
     * fed gather (Gemma 3's scaled by its embedding scale) */
    const char *fx = tu_env("TS_FIXTURES", "tests/fixtures");
    snprintf(untied[0], 8192, "%s/qwen35/tiny_b_bf16_untied_interval3", fx);
    snprintf(untied[1], 8192, "%s/gemma3/tiny_c_f32_untied_softcap_w39_explicit", fx);
    for (int c = 0; c < 4; c++) {
        ts_model *m = NULL;
        const char *path = c == 0 ? f32 : c == 1 ? bf16 : untied[c - 2];
        CHECKF(ts_model_open(path, &m) == TS_OK, "%s: %s", path, ts_last_error());
        if (!m) continue;
        setenv("TESSERA_DECODE_AHEAD", "0", 1);
        ts_engine *plain = make_engine_slots(m, GD_MAX_B);
        unsetenv("TESSERA_DECODE_AHEAD");
        ts_engine *ahead = make_engine_slots(m, GD_MAX_B);
        CHECK(plain && ahead);
        int V = plain && ahead ? ts_engine_n_vocab(plain) : 0;
        for (int k = 0; plain && ahead && k < 3; k++) {
            int B = (int[]){1, 3, 1}[k], steps = 14, swap = k ? 5 : -1, clear = k ? 9 : -1;
            int32_t ia[14 * GD_MAX_B], ib[14 * GD_MAX_B];
            float *la = malloc((size_t)B * V * 4), *lb = malloc((size_t)B * V * 4);
            long held0 = ahead->ahead.launched_held;
            bool ok = ahead_run(plain, B, steps, swap, clear, ia, la) &&
                      ahead_run(ahead, B, steps, swap, clear, ib, lb);
            long held = ahead->ahead.launched_held - held0;
            CHECK(ok);
            CHECKF(ok && memcmp(ia, ib, sizeof(int32_t) * steps * B) == 0,
                   "%s B=%d: decoding ahead chose other tokens", path, B);
            CHECKF(ok && memcmp(la, lb, (size_t)B * V * 4) == 0,
                   "%s B=%d: decoding ahead left another state", path, B);
            CHECKF(held >= steps - 4 && plain->ahead.launched_held == 0,
                   "%s B=%d: %ld held steps launched", path, B, held);
            printf("  decode ahead %s B=%d: %ld of %d steps launched held, %s\n",
                   strrchr(path, '/') + 1, B, held, steps,
                   ok && memcmp(la, lb, (size_t)B * V * 4) == 0 ? "identical" : "DIFFERENT");
            free(la), free(lb);
        }
        /* a greedy sampler with nothing to adjust goes ahead too, to the same tokens */
        ts_sampler *smp = NULL;
        ts_sampler_params sp = {0.0f, 0, 1.0f, 0.0f, 1};
        CHECK(ahead && ts_sampler_create(&sp, V, &smp) == TS_OK);
        if (smp && ahead) {
            int32_t tok = 3, ids[8], ref[8];
            ts_engine_slot_clear(ahead, 0);
            long held0 = ahead->ahead.launched_held;
            for (int i = 0; i < 8; i++) {
                int32_t p = i, s0 = 0;
                ts_batch b = {1, &tok, &p, &s0, NULL, NULL, NULL};
                CHECK(ts_engine_forward_sample(ahead, &b, &smp, &ids[i]) == TS_OK);
                tok = ids[i];
            }
            CHECKF(ahead->ahead.launched_held - held0 >= 6, "greedy sampler: %ld held",
                   ahead->ahead.launched_held - held0);
            float *lg = malloc((size_t)V * 4);
            CHECK(ahead_run(plain, 1, 8, -1, -1, ref, lg));
            CHECKF(memcmp(ids, ref, sizeof ids) == 0, "greedy sampler ahead: other tokens");
            free(lg);
            ts_sampler_free(smp);
        }
        /* draws that end on the device (temperature, min-p, top-k with top-p, top-p) go ahead
         * with their uniform numbers taken early: the same draws as without, a dropped held
         * step (the swapped token) taking none from the generator; a draw with a penalty
         * (logit adjustments) too, its list given to the held step at its launch */
        const ts_sampler_params sps[4] = {{0.9f, 0, 1.0f, 0.05f, 11},
                                          {0.9f, 20, 0.9f, 0.02f, 13},
                                          {0.9f, 0, 0.8f, 0.05f, 14},
                                          {0.9f, 0, 1.0f, 0.0f, 12}};
        for (int k = 0; plain && ahead && k < 4; k++) {
            int steps = 12, swap = 4;
            int32_t ia[12], ib[12];
            float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
            long held0 = ahead->ahead.launched_held;
            bool ok = ahead_sampled_run(plain, &sps[k], k == 3, steps, swap, ia, la) &&
                      ahead_sampled_run(ahead, &sps[k], k == 3, steps, swap, ib, lb);
            long held = ahead->ahead.launched_held - held0;
            CHECK(ok);
            CHECKF(ok && memcmp(ia, ib, sizeof ia) == 0 && memcmp(la, lb, (size_t)V * 4) == 0,
                   "%s sampled (top-k %d, top-p %g): decoding ahead drew other tokens or left "
                   "another state",
                   path, sps[k].top_k, sps[k].top_p);
            CHECKF(held >= steps - 3,
                   "%s sampled (top-k %d, top-p %g): "
                   "%ld held",
                   path, sps[k].top_k, sps[k].top_p, held);
            printf("  decode ahead %s sampled, top-k %d, top-p %g, min-p %g%s: %ld of %d steps "
                   "launched held, %s\n",
                   strrchr(path, '/') + 1, sps[k].top_k, sps[k].top_p, sps[k].min_p,
                   k == 3 ? ", a penalty" : "", held, steps,
                   ok && memcmp(ia, ib, sizeof ia) == 0 ? "same draws" : "DIFFERENT");
            free(la), free(lb);
        }
        ts_engine_free(plain);
        ts_engine_free(ahead);
        ts_model_close(m);
    }
}

/* Whether TS_CUDA_ONLY (a comma-separated list of section names) selects this section; all
 * run when it is unset. Prints the section's name when it runs. */
static bool section(const char *name) {
    const char *only = tu_env("TS_CUDA_ONLY", "");
    size_t n = strlen(name);
    bool on = !*only;
    for (const char *p = only; *p && !on; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
        on = strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == '\0');
    }
    if (on) printf("%s\n", name);
    return on;
}

int main(void) {
    if (getenv("TS_CUDA_COPY_LOAD")) return copy_load_child(atoi(getenv("TS_CUDA_COPY_LOAD")));
    setvbuf(stdout, NULL, _IONBF, 0); /* progress survives a crash */
    /* host-side, before the device is asked for: struct arguments with padding reach the launch
     * queue without it (else a steady decode step's graph updates nodes now and then) */
    CHECKF(ts_backend_cuda_args_pack_clean(),
           "a padded struct's stack bytes reach kernel arguments");
    /* the global backend with the float decode of one token's K-quants, whose sums the
     * exactness tests compare bit for bit; test_gemv_int8 compares the integer form */
    env_saved float_q4k = env_set("TESSERA_CUDA_GEMV1_INT8", "0");
    ts_status st = ts_backend_cuda_create(0, &gpu);
    env_restore(float_q4k);
    if (st != TS_OK) {
        printf("skipped: %s\n", ts_last_error());
        return tu_report("test_cuda");
    }
    CHECK(ts_backend_cpu_create(2, -1, &cpu) == TS_OK);
    printf("device: %s\n", ts_backend_cuda_device_name(gpu));
    /* TS_CUDA_QUICK=1 (for the sanitizers, which run kernels 10-100x slower): no fixture
     * prompts, a lighter delta-rule section; the graph and multi-sequence tests still run.
     * TS_CUDA_ONLY=gdn,attention,... (skinny: the ring GEMM's test alone, also in matmul;
     * staging: the split and x-staging tests, also in matmul; int8: the one-token GEMV's
     * integer form, also in matmul; few: its kernel for 2-3 tokens, also in matmul; pair: a
     * stack of two quantized types in one launch, also in matmul)
     * runs only those sections (a sanitizer pass over some kernels fits a time limit). */
    bool quick = strcmp(tu_env("TS_CUDA_QUICK", "0"), "1") == 0;
    if (section("rows")) test_rows_ops();
    if (section("elementwise")) test_elementwise(), test_fused();
    if (section("attention")) test_attention();
    if (section("vision")) test_vision_ops(quick);
    if (section("conv")) test_conv_gates();
    if (section("gdn")) {
        test_gdn(2, 4, 128, 128, quick);
        test_gdn(1, 2, 64, 32, quick);
        test_gdn(1, 1, 256, 256, quick); /* the largest head kept in registers */
        if (!quick) { /* the slow state-in-memory kernels: sanitizer passes skip them */
            test_gdn(1, 2, 300, 40, false);  /* over 256 keys: state in shared memory */
            test_gdn(1, 1, 320, 512, false); /* 640 KiB of state: stays in global memory */
        }
        test_gdn_runs(2, 4, 128, 128);
        test_gdn_runs(1, 1, 256, 64);
        test_conv_gdn_step();
        test_conv_gdn_step_runs();
    }
    if (section("attention"))
        test_attention_runs(), test_attention_step(), test_attention_step_runs();
    /* the fused decode steps alone, for the sanitizers */
    if (section("steps"))
        test_conv_gdn_step(), test_conv_gdn_step_runs(), test_attention_step(),
            test_attention_step_runs();
    if (section("argmax")) test_argmax();
    if (section("sample")) test_sample(quick), test_sample_logprobs(quick);
    if (section("matmul")) {
        test_matmul(), test_matmul_glu(), test_matmul_norm_add(), test_gemv_one_rows();
        test_gemv_one_kquant(), test_gemv_int8(), test_gemv_few(), test_gemv_few_quant();
        test_gemv_pair();
        test_decode_exact();
        test_q32_partial_group();
        test_split_range();
    }
    /* the staged activations: the split written by its producer, x in the GEMV's shared
     * memory (also alone, for the sanitizers) */
    if (section("matmul") || section("staging")) test_split_fused(), test_gemv_x_staged();
    if (section("matmul") || section("lt")) test_gemm_buckets();
    if (section("matmul") || section("skinny")) test_skinny_ring(quick);
    if (section("matmul") || section("skinny") || section("wg")) test_skinny_wg(quick);
    if (section("int8")) test_gemv_int8();
    if (section("few")) test_gemv_few(), test_gemv_few_quant();
    if (section("pair")) test_gemv_pair();
    if (!quick && section("fixtures")) {
        test_fixtures("qwen35");
        test_fixtures("gemma3");
    }
    if (section("graph"))
        test_graph_decode(), test_engine_sample(), test_forward_without_output_finishes();
    if (section("ahead"))
        test_fed_rows(), test_decode_ahead(), test_engine_penalties_ahead(),
            test_ahead_rope_shift();
    if (section("upload")) test_upload_under_copy_load();
    if (section("runs")) {
        test_multi_runs("qwen35");
        test_multi_runs("gemma3");
        test_wide_batch();
        test_rewind_on_the_gpu("qwen35", "tiny_a_f32_tied_explicit", false);
        test_rewind_on_the_gpu("gemma3", "tiny_a_f32_tied_mqa_w16_pat3", true);
    }
    ts_backend_free(cpu);
    ts_backend_free(gpu);
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) free(kept[i]);
    for (int i = 0; i < n_kept_more; i++) free(kept_more[i]);
    return tu_report("test_cuda");
}
