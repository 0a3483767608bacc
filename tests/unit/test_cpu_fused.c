/* The CPU backend's fused projections - matmul_n (a stack of weights sharing x, one job of the
 * pool) and matmul_glu (a gated MLP's two products and its activation) - give exactly the bits of
 * the ops they fuse (rmsnorm, matmul per weight, swiglu / gelu_mul): every ISA this CPU runs, 1
 * and 2 threads, stacks of 1-4 weights of one dtype and of mixed ones (float and quantized, as a
 * Q4_K_M file's stacks are), rows that leave a thread's range ending inside a weight or between
 * two, tiny weights among big ones, one token and several, with and without the folded norm.
 * Each case runs a few times, so that the pool's shares (which move the split) move. */
#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/quant.h"
#include "base/half.h"
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL 777.25f

static unsigned long long rng = 0xfeedULL;

typedef struct {
    ts_tensor t;
    uint8_t *buf;
} weight;

static void weight_make(weight *w, ts_dtype dt, int64_t rows, int64_t cols) {
    size_t rb = ts_dtype_row_bytes(dt, cols);
    w->buf = malloc(rb * (size_t)rows);
    float *row = malloc((size_t)cols * sizeof *row);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++)
            row[c] = tu_rng_uniform(&rng) * (float)(1u << (tu_rng_next(&rng) % 4)) * 0.25f;
        uint8_t *dst = w->buf + (size_t)r * rb;
        if (dt == TS_DTYPE_F32) {
            memcpy(dst, row, (size_t)cols * 4);
        } else if (dt == TS_DTYPE_F16 || dt == TS_DTYPE_BF16) {
            for (int64_t c = 0; c < cols; c++) {
                uint16_t h = dt == TS_DTYPE_F16 ? ts_f32_to_f16(row[c]) : ts_f32_to_bf16(row[c]);
                memcpy(dst + 2 * c, &h, 2);
            }
        } else {
            CHECK(ts_quantize_row(dt, row, dst, cols) == TS_OK);
        }
    }
    free(row);
    w->t = (ts_tensor){.dtype = dt,
                       .n_dims = 2,
                       .shape = {rows, cols, 1, 1},
                       .data = w->buf,
                       .nbytes = rb * (size_t)rows};
}

static float *filled(size_t n, float v) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = v;
    return p;
}

static float *random_rows(int n_tok, int64_t ld, int64_t cols) {
    float *x = filled((size_t)n_tok * ld, SENTINEL);
    for (int t = 0; t < n_tok; t++)
        for (int64_t c = 0; c < cols; c++)
            x[t * ld + c] = 2.0f * tu_rng_uniform(&rng);
    return x;
}

/* Bits of a and b over n_tok rows of `cols` values (ld apart); the gaps keep SENTINEL. */
static bool same_rows(const float *a, const float *b, int n_tok, int64_t ld, int64_t cols,
                      const char *what) {
    for (int t = 0; t < n_tok; t++)
        for (int64_t c = 0; c < ld; c++) {
            float u = a[t * ld + c], v = b[t * ld + c];
            if (c >= cols ? u != SENTINEL || v != SENTINEL : memcmp(&u, &v, sizeof u) != 0) {
                CHECKF(0, "%s: token %d column %lld: %.9g against %.9g", what, t, (long long)c, u,
                       v);
                return false;
            }
        }
    return true;
}

/* matmul_n over weights of dts (rows[j] rows, cols columns) against rmsnorm + matmul each. */
static void check_stack(ts_backend *be, const ts_dtype *dts, const int64_t *rows, int nw,
                        int64_t cols, int n_tok, bool norm, const char *name) {
    weight w[CPU_MATMUL_MAX_N];
    const ts_tensor *W[CPU_MATMUL_MAX_N];
    float *y[CPU_MATMUL_MAX_N], *ref[CPU_MATMUL_MAX_N];
    int64_t ld[CPU_MATMUL_MAX_N];
    for (int j = 0; j < nw; j++) {
        weight_make(&w[j], dts[j], rows[j], cols);
        W[j] = &w[j].t;
        ld[j] = rows[j] + 3;
    }
    int64_t ldx = cols + 5;
    float *x = random_rows(n_tok, ldx, cols), *nw_w = random_rows(1, cols, cols);
    float *scratch = filled((size_t)n_tok * ldx, SENTINEL);
    ts_prenorm pre = {nw_w, 1e-6f, scratch};
    for (int rep = 0; rep < 3; rep++) {
        for (int j = 0; j < nw; j++) {
            y[j] = filled((size_t)n_tok * ld[j], SENTINEL);
            ref[j] = filled((size_t)n_tok * ld[j], SENTINEL);
        }
        be->ops->matmul_n(be, W, nw, x, ldx, n_tok, norm ? &pre : NULL, y, ld);
        const float *xs = x;
        if (norm) {
            float *normed = filled((size_t)n_tok * ldx, SENTINEL);
            be->ops->rmsnorm(be, x, ldx, n_tok, (int)cols, nw_w, 1e-6f, normed, ldx);
            CHECKF(same_rows(normed, scratch, n_tok, ldx, cols, name), "%s: the normed rows", name);
            xs = normed;
        }
        for (int j = 0; j < nw; j++)
            be->ops->matmul(be, W[j], xs, ldx, n_tok, ref[j], ld[j]);
        for (int j = 0; j < nw; j++) {
            char what[160];
            snprintf(what, sizeof what, "%s: weight %d of %d (%s, %lld rows), %d tokens%s", name, j,
                     nw, ts_dtype_name(dts[j]), (long long)rows[j], n_tok, norm ? ", normed" : "");
            same_rows(y[j], ref[j], n_tok, ld[j], rows[j], what);
            free(y[j]);
            free(ref[j]);
        }
        if (norm) free((void *)xs);
    }
    for (int j = 0; j < nw; j++)
        free(w[j].buf);
    free(x), free(nw_w), free(scratch);
}

/* matmul_glu against matmul (twice) + swiglu / gelu_mul; in_place: out is the gate's scratch,
 * as Gemma 3 calls it. */
static void check_glu(ts_backend *be, ts_dtype dg, ts_dtype du, int64_t rows, int64_t cols,
                      int n_tok, bool norm, bool gelu, bool in_place, const char *name) {
    weight wg, wu;
    weight_make(&wg, dg, rows, cols);
    weight_make(&wu, du, rows, cols);
    int64_t ldx = cols + 2, ldt = rows + 7;
    float *x = random_rows(n_tok, ldx, cols), *nw_w = random_rows(1, cols, cols);
    float *scratch = filled((size_t)n_tok * ldx, SENTINEL);
    ts_prenorm pre = {nw_w, 1e-5f, scratch};
    for (int rep = 0; rep < 3; rep++) {
        size_t n = (size_t)n_tok * ldt;
        float *tg = filled(n, SENTINEL), *tu = filled(n, SENTINEL), *out = filled(n, SENTINEL);
        float *rg = filled(n, SENTINEL), *ru = filled(n, SENTINEL), *rout = filled(n, SENTINEL);
        float *o = in_place ? tg : out;
        be->ops->matmul_glu(be, &wg.t, &wu.t, x, ldx, n_tok, norm ? &pre : NULL, gelu, tg, tu, ldt,
                            o, ldt);
        const float *xs = x;
        float *normed = NULL;
        if (norm) {
            normed = filled((size_t)n_tok * ldx, SENTINEL);
            be->ops->rmsnorm(be, x, ldx, n_tok, (int)cols, nw_w, 1e-5f, normed, ldx);
            xs = normed;
        }
        be->ops->matmul(be, &wg.t, xs, ldx, n_tok, rg, ldt);
        be->ops->matmul(be, &wu.t, xs, ldx, n_tok, ru, ldt);
        float *ro = in_place ? rg : rout;
        if (gelu)
            be->ops->gelu_mul(be, rg, ru, ldt, n_tok, (int)rows, ro, ldt);
        else
            be->ops->swiglu(be, rg, ru, ldt, n_tok, (int)rows, ro, ldt);
        char what[160];
        snprintf(what, sizeof what, "%s: %s x %s, %lld rows, %d tokens%s%s%s", name,
                 ts_dtype_name(dg), ts_dtype_name(du), (long long)rows, n_tok, gelu ? ", GELU" : "",
                 norm ? ", normed" : "", in_place ? ", in place" : "");
        same_rows(o, ro, n_tok, ldt, rows, what);
        same_rows(tu, ru, n_tok, ldt, rows, what); /* the up product stays where it was put */
        free(tg), free(tu), free(out), free(rg), free(ru), free(rout), free(normed);
    }
    free(wg.buf), free(wu.buf), free(x), free(nw_w), free(scratch);
}

static void run_cases(ts_backend *be, const char *name) {
    CHECK(be->ops->matmul_n != NULL && be->ops->matmul_glu != NULL);
    if (!be->ops->matmul_n || !be->ops->matmul_glu) return;
    const ts_dtype bf = TS_DTYPE_BF16, f32 = TS_DTYPE_F32, f16 = TS_DTYPE_F16;
    const ts_dtype q40 = TS_DTYPE_Q4_0, q80 = TS_DTYPE_Q8_0, q4k = TS_DTYPE_Q4_K;
    const ts_dtype q6k = TS_DTYPE_Q6_K, q50 = TS_DTYPE_Q5_0;
    /* Qwen3.5's delta-rule input stack at 1/4 scale: qkv, z, and the 16-row a, b */
    check_stack(be, (ts_dtype[]){q40, q40, q40, q40}, (int64_t[]){1536, 512, 16, 16}, 4, 512, 1,
                true, name);
    check_stack(be, (ts_dtype[]){bf, bf, bf, bf}, (int64_t[]){1536, 512, 16, 16}, 4, 512, 1, true,
                name);
    /* a Q4_K_M file's mix: qkv in Q6_K, z in Q4_K, a and b in F32 */
    check_stack(be, (ts_dtype[]){q6k, q4k, f32, f32}, (int64_t[]){1536, 512, 16, 16}, 4, 512, 1,
                true, name);
    check_stack(be, (ts_dtype[]){q6k, q4k, f32, f32}, (int64_t[]){1536, 512, 16, 16}, 4, 512, 2,
                false, name);
    /* attention's q, k, v; Gemma 3's 640 columns (too few for K-quants: Q5_0 / Q8_0) */
    check_stack(be, (ts_dtype[]){q80, q40, q80}, (int64_t[]){500, 132, 132}, 3, 256, 1, true, name);
    check_stack(be, (ts_dtype[]){q80, q50, q80}, (int64_t[]){256, 64, 64}, 3, 640, 1, false, name);
    check_stack(be, (ts_dtype[]){f16, bf, f32}, (int64_t[]){300, 77, 5}, 3, 96, 3, true, name);
    /* prefill: many tokens (the tiled kernels, equal parts) */
    check_stack(be, (ts_dtype[]){q40, q6k}, (int64_t[]){260, 70}, 2, 256, 33, true, name);
    check_stack(be, (ts_dtype[]){bf, bf}, (int64_t[]){130, 40}, 2, 64, 40, false, name);
    /* one weight, and one too small to share */
    check_stack(be, (ts_dtype[]){q4k}, (int64_t[]){1000}, 1, 512, 1, false, name);
    check_stack(be, (ts_dtype[]){bf, q80}, (int64_t[]){3, 2}, 2, 32, 1, false, name);

    check_glu(be, q40, q40, 896, 256, 1, true, false, false, name);
    check_glu(be, bf, bf, 896, 256, 1, true, false, false, name);
    check_glu(be, q4k, q6k, 1000, 256, 1, false, false, false, name);
    check_glu(be, q50, q50, 512, 640, 1, false, true, true, name); /* Gemma 3: GELU, in place */
    check_glu(be, bf, bf, 300 + 37, 128, 2, true, true, false, name);
    check_glu(be, q80, q40, 256, 256, 20, true, false, true, name);
    check_glu(be, f32, bf, 70, 64, 9, false, true, true, name);
    check_glu(be, bf, bf, 10, 0, 2, false, false, false, name); /* no columns: act(0) * 0 */
}

int main(void) {
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        if (!cpu_isa_supported((cpu_isa)isa)) {
            printf("skip %s (not supported by this CPU)\n", cpu_isa_name((cpu_isa)isa));
            continue;
        }
        for (int threads = 1; threads <= 2; threads++) {
            ts_backend *be;
            CHECK(ts_backend_cpu_create(threads, isa, &be) == TS_OK);
            char name[64];
            snprintf(name, sizeof name, "%s, %d thread%s", cpu_isa_name((cpu_isa)isa), threads,
                     threads > 1 ? "s" : "");
            run_cases(be, name);
            ts_backend_free(be);
        }
    }
    return tu_report("test_cpu_fused");
}
