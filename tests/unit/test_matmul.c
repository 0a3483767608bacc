/* CPU matmul: every dtype x every ISA this machine runs x odd shapes, against a float64
 * reference computed here and against the scalar kernel; 1 and 2 threads; dequant_row; ISA
 * selection. `test_matmul --bench` prints decode GB/s and prefill GFLOP/s instead (not CTest). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backend/cpu/bandwidth.h"
#include "backend/cpu/matmul.h"
#include "base/half.h"
#include "testutil.h"

#define TOL 1e-5      /* of sum |W||x|: fp32 rounding in any summation order */
#define SENTINEL 777.25f

typedef struct {
    ts_tensor t;
    void *buf;
    double *wd; /* the stored values, decoded exactly */
} wmat;

static void wmat_make(wmat *m, ts_dtype dt, int64_t rows, int64_t cols, unsigned long long *s) {
    size_t esz = dt == TS_DTYPE_F32 ? 4 : 2, n = (size_t)(rows * cols);
    m->buf = malloc(n * esz + 1); /* +1: an odd offset below checks unaligned rows */
    m->wd = malloc(n * sizeof(double));
    uint8_t *base = (uint8_t *)m->buf + 1;
    for (size_t i = 0; i < n; i++) {
        /* a spread of magnitudes so that the exponent handling of each format is exercised */
        float v = tu_rng_uniform(s) * (float)(1u << (tu_rng_next(s) % 6)) * 0.25f;
        if (dt == TS_DTYPE_F32) {
            memcpy(base + 4 * i, &v, 4);
            m->wd[i] = v;
        } else {
            uint16_t h = dt == TS_DTYPE_F16 ? ts_f32_to_f16(v) : ts_f32_to_bf16(v);
            memcpy(base + 2 * i, &h, 2);
            m->wd[i] = dt == TS_DTYPE_F16 ? ts_f16_to_f32(h) : ts_bf16_to_f32(h);
        }
    }
    m->t = (ts_tensor){.dtype = dt,
                       .n_dims = 2,
                       .shape = {rows, cols, 1, 1},
                       .data = base,
                       .nbytes = n * esz};
}

static void wmat_free(wmat *m) {
    free(m->buf);
    free(m->wd);
}

/* y = W x for tokens laid out with strides ldx / ldy; gaps of y keep SENTINEL. */
static void run_mm(ts_pool *pool, cpu_isa isa, const wmat *m, const float *x, int64_t ldx,
                   int n_tok, float *y, int64_t ldy) {
    for (int64_t i = 0; i < n_tok * ldy; i++) y[i] = SENTINEL;
    cpu_matmul(pool, NULL, isa, &m->t, x, ldx, n_tok, y, ldy);
}

static int check_shape(ts_pool *pool, int nth, ts_dtype dt, int64_t rows, int64_t cols,
                       int n_tok, unsigned long long *s) {
    int fails_before = tu_failures;
    wmat m;
    wmat_make(&m, dt, rows, cols, s);
    int64_t ldx = cols + 3, ldy = rows + 5;
    float *x = malloc(sizeof(float) * (size_t)(n_tok * ldx));
    for (int64_t i = 0; i < n_tok * ldx; i++) x[i] = tu_rng_uniform(s);
    double *ref = malloc(sizeof(double) * (size_t)(n_tok * rows));
    double *mag = malloc(sizeof(double) * (size_t)(n_tok * rows));
    for (int t = 0; t < n_tok; t++) {
        for (int64_t o = 0; o < rows; o++) {
            double acc = 0, a = 0;
            for (int64_t i = 0; i < cols; i++) {
                double p = m.wd[o * cols + i] * (double)x[t * ldx + i];
                acc += p;
                a += fabs(p);
            }
            ref[t * rows + o] = acc;
            mag[t * rows + o] = a;
        }
    }
    size_t ysz = sizeof(float) * (size_t)(n_tok * ldy);
    float *ys = malloc(ysz), *y = malloc(ysz);
    run_mm(NULL, CPU_ISA_SCALAR, &m, x, ldx, n_tok, ys, ldy);
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        if (!cpu_isa_supported((cpu_isa)isa)) continue;
        run_mm(pool, (cpu_isa)isa, &m, x, ldx, n_tok, y, ldy);
        for (int t = 0; t < n_tok; t++) {
            for (int64_t o = 0; o < ldy; o++) {
                float v = y[t * ldy + o];
                if (o >= rows) {
                    CHECKF(v == SENTINEL, "%s %s: wrote y gap t=%d o=%lld", ts_dtype_name(dt),
                           cpu_isa_name((cpu_isa)isa), t, (long long)o);
                    continue;
                }
                double tol = TOL * mag[t * rows + o] + 1e-30;
                double e_ref = fabs((double)v - ref[t * rows + o]);
                double e_sc = fabs((double)v - (double)ys[t * ldy + o]);
                CHECKF(e_ref <= tol && e_sc <= tol,
                       "%s %s %d thr [%lld x %lld] n_tok %d: y[%d][%lld] = %.9g ref %.9g "
                       "scalar %.9g (|W||x| %.3g)",
                       ts_dtype_name(dt), cpu_isa_name((cpu_isa)isa), nth, (long long)rows,
                       (long long)cols, n_tok, t, (long long)o, v, ref[t * rows + o],
                       ys[t * ldy + o], mag[t * rows + o]);
                if (tu_failures - fails_before > 5) goto out; /* one broken case, not 10^4 lines */
            }
        }
    }
out:
    free(x);
    free(ref);
    free(mag);
    free(ys);
    free(y);
    wmat_free(&m);
    return tu_failures - fails_before;
}

static void test_matmul_shapes(void) {
    static const int64_t rows[] = {1, 5, 33, 67, 130};
    static const int64_t cols[] = {1, 7, 16, 33, 100, 300};
    static const int toks[] = {1, 2, 3, 5, 8, 16, 17, 64}; /* both sides of each switch */
    static const ts_dtype dts[] = {TS_DTYPE_F32, TS_DTYPE_F16, TS_DTYPE_BF16};
    unsigned long long seed = 0x1234567887654321ull;
    for (int nth = 1; nth <= 2; nth++) {
        ts_pool *pool = NULL;
        CHECK(ts_pool_create(nth, &pool) == TS_OK);
        for (size_t d = 0; d < 3; d++) {
            for (size_t r = 0; r < sizeof rows / sizeof *rows; r++)
                for (size_t c = 0; c < sizeof cols / sizeof *cols; c++)
                    for (size_t t = 0; t < sizeof toks / sizeof *toks; t++)
                        check_shape(pool, nth, dts[d], rows[r], cols[c], toks[t], &seed);
            /* more columns than one packed panel, and row counts off every block size */
            check_shape(pool, nth, dts[d], 70, 1100, 1, &seed);
            check_shape(pool, nth, dts[d], 70, 1100, 3, &seed);
            check_shape(pool, nth, dts[d], 70, 1100, 19, &seed);
            check_shape(pool, nth, dts[d], 97, 523, 64, &seed);
            check_shape(pool, nth, dts[d], 200, 300, 23, &seed);
        }
        ts_pool_free(pool);
    }
}

/* The SIMD kernels sum in another order than the scalar one, so over long rows some outputs
 * differ in their last bits; identical results everywhere would mean the dispatcher quietly
 * ran the scalar kernel. */
static void test_simd_really_runs(void) {
    static const ts_dtype dts[] = {TS_DTYPE_F32, TS_DTYPE_F16, TS_DTYPE_BF16};
    static const int toks[] = {1, 64};
    unsigned long long seed = 7;
    for (size_t d = 0; d < 3; d++) {
        wmat m;
        wmat_make(&m, dts[d], 64, 1000, &seed);
        static float x[64 * 1000], ys[64 * 64], y[64 * 64];
        for (int i = 0; i < 64 * 1000; i++) x[i] = tu_rng_uniform(&seed);
        for (size_t k = 0; k < 2; k++) {
            cpu_matmul(NULL, NULL, CPU_ISA_SCALAR, &m.t, x, 1000, toks[k], ys, 64);
            for (int isa = CPU_ISA_SCALAR + 1; isa < CPU_ISA_COUNT; isa++) {
                if (!cpu_isa_supported((cpu_isa)isa)) continue;
                cpu_matmul(NULL, NULL, (cpu_isa)isa, &m.t, x, 1000, toks[k], y, 64);
                int differ = 0;
                for (int i = 0; i < 64 * toks[k]; i++) differ += memcmp(&y[i], &ys[i], 4) != 0;
                CHECKF(differ > 0, "%s %s n_tok %d: bit-identical to scalar", ts_dtype_name(dts[d]),
                       cpu_isa_name((cpu_isa)isa), toks[k]);
            }
        }
        wmat_free(&m);
    }
}

/* No columns: every output is an empty sum, 0, on every path (the packed path has no column
 * panel to write through). */
static void test_empty_rows(void) {
    static const float none[1] = {0};
    ts_tensor t = {.dtype = TS_DTYPE_BF16, .n_dims = 2, .shape = {70, 0, 1, 1}, .data = none};
    float y[70 * 20];
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        for (int n_tok = 1; n_tok <= 20; n_tok += 19) {
            for (int i = 0; i < 70 * n_tok; i++) y[i] = SENTINEL;
            cpu_matmul(NULL, NULL, (cpu_isa)isa, &t, none, 0, n_tok, y, 70);
            int bad = 0;
            for (int i = 0; i < 70 * n_tok; i++) bad += y[i] != 0.0f;
            CHECKF(bad == 0, "%s n_tok %d: %d outputs not 0", cpu_isa_name((cpu_isa)isa), n_tok,
                   bad);
        }
    }
}

static void test_dequant_row(void) {
    /* known encodings: 1, -2, 0.5, smallest subnormal (f16 2^-24), 65504 / bf16 max-ish */
    static const uint16_t f16[] = {0x3c00, 0xc000, 0x3800, 0x0001, 0x7bff};
    static const float f16v[] = {1.0f, -2.0f, 0.5f, 5.9604645e-08f, 65504.0f};
    static const uint16_t bf16[] = {0x3f80, 0xc000, 0x3f00, 0x0001, 0x7f7f};
    static const float bf16v[] = {1.0f, -2.0f, 0.5f, 9.18355e-41f, 3.3895314e+38f};
    uint16_t h2[2][5];
    float f2[2][5], out[5];
    for (int i = 0; i < 5; i++) {
        h2[0][i] = 0;
        h2[1][i] = f16[i];
        f2[0][i] = 0;
        f2[1][i] = f16v[i] * 3.0f;
    }
    ts_tensor t = {.dtype = TS_DTYPE_F16, .n_dims = 2, .shape = {2, 5, 1, 1}, .data = h2};
    cpu_dequant_row(&t, 1, out);
    for (int i = 0; i < 5; i++) CHECKF(out[i] == f16v[i], "f16 %d: %g", i, out[i]);
    for (int i = 0; i < 5; i++) h2[1][i] = bf16[i];
    t.dtype = TS_DTYPE_BF16;
    cpu_dequant_row(&t, 1, out);
    for (int i = 0; i < 5; i++) CHECKF(out[i] == bf16v[i], "bf16 %d: %g", i, out[i]);
    t.dtype = TS_DTYPE_F32;
    t.data = f2;
    cpu_dequant_row(&t, 1, out);
    for (int i = 0; i < 5; i++) CHECKF(out[i] == f16v[i] * 3.0f, "f32 %d: %g", i, out[i]);
}

static void test_isa_selection(const char *self) {
    CHECK(cpu_matmul_supports(TS_DTYPE_F32));
    CHECK(cpu_matmul_supports(TS_DTYPE_F16));
    CHECK(cpu_matmul_supports(TS_DTYPE_BF16));
    CHECK(cpu_matmul_supports(TS_DTYPE_Q8_0)); /* quantized kernels: test_quant.c */
    CHECK(!cpu_matmul_supports(TS_DTYPE_COUNT));
    CHECK(cpu_isa_supported(CPU_ISA_SCALAR));
    cpu_isa best = cpu_isa_best();
    CHECK(cpu_isa_supported(best));
    const char *env = getenv("TESSERA_ISA");
    if (!env || !*env) {
        for (int i = best + 1; i < CPU_ISA_COUNT; i++) CHECK(!cpu_isa_supported((cpu_isa)i));
    }
    /* the variable is read once per process, so ask a child copy of this test */
    static const char *names[] = {"scalar", "avx2", "avx512"};
    for (int i = 0; i < CPU_ISA_COUNT; i++) {
        char cmd[512], got[64] = "";
        snprintf(cmd, sizeof cmd, "TESSERA_ISA=%s '%s' --print-isa", names[i], self);
        FILE *p = popen(cmd, "r");
        CHECK(p != NULL);
        if (!p) continue;
        if (!fgets(got, sizeof got, p)) got[0] = 0;
        pclose(p);
        got[strcspn(got, "\n")] = 0;
        cpu_isa want = (cpu_isa)i < best ? (cpu_isa)i : best;
        CHECKF(strcmp(got, cpu_isa_name(want)) == 0, "TESSERA_ISA=%s gave '%s', want %s",
               names[i], got, cpu_isa_name(want));
    }
}

/* ---- --bench --------------------------------------------------------------------------- */

/* -DBENCH_CLOCK=CLOCK_THREAD_CPUTIME_ID: single-thread tuning on a busy machine */
#ifndef BENCH_CLOCK
#define BENCH_CLOCK CLOCK_MONOTONIC
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(BENCH_CLOCK, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* n_copies copies of a [rows, cols] matrix back to back, so that rotating through them keeps
 * the weights out of the caches as a real model's do. */
static uint8_t *bench_weights(ts_dtype dt, int64_t rows, int64_t cols, int n_copies) {
    size_t esz = dt == TS_DTYPE_F32 ? 4 : 2, n = (size_t)(rows * cols) * (size_t)n_copies;
    void *p = mmap(NULL, n * esz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    /* the bandwidth probe uses huge pages; TS_BENCH_4K=1 measures 4 KiB pages (file mmap) */
    if (!getenv("TS_BENCH_4K")) madvise(p, n * esz, MADV_HUGEPAGE);
    uint8_t *w = p;
    unsigned long long s = 99;
    for (size_t i = 0; i < n; i++) {
        float v = tu_rng_uniform(&s);
        uint16_t h = dt == TS_DTYPE_F16 ? ts_f32_to_f16(v) : ts_f32_to_bf16(v);
        if (dt == TS_DTYPE_F32)
            memcpy(w + 4 * i, &v, 4);
        else
            memcpy(w + 2 * i, &h, 2);
    }
    return w;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void bench_one(ts_pool *pool, int nth, cpu_isa isa, ts_dtype dt, int64_t rows,
                      int64_t cols, int n_tok, double budget_s) {
    size_t wbytes = (size_t)(rows * cols) * (dt == TS_DTYPE_F32 ? 4 : 2);
    int copies = (int)((512u << 20) / wbytes) + 1; /* >= 512 MiB in rotation: from DRAM */
    if (n_tok > 64) copies = 1; /* long prefill is compute-bound: hot is fine */
    uint8_t *w = bench_weights(dt, rows, cols, copies);
    float *x = malloc(sizeof(float) * (size_t)(cols * n_tok));
    float *y = malloc(sizeof(float) * (size_t)(rows * n_tok));
    if (!w || !x || !y) {
        printf("bench: out of memory\n");
        goto out;
    }
    for (int64_t i = 0; i < cols * n_tok; i++) x[i] = 0.001f * (float)(i % 1000);
    ts_tensor t = {.dtype = dt, .n_dims = 2, .shape = {rows, cols, 1, 1}, .nbytes = wbytes};
    enum { MAX_ITERS = 4096 };
    static double times[MAX_ITERS];
    int iters = 0;
    double start = now_s();
    while (iters < 3 || (now_s() - start < budget_s && iters < MAX_ITERS)) {
        t.data = w + (size_t)(iters % copies) * wbytes;
        double t0 = now_s();
        cpu_matmul(pool, NULL, isa, &t, x, cols, n_tok, y, rows);
        times[iters++] = now_s() - t0;
    }
    /* median and best: on a busy shared host the median shows what to expect, the best what
     * the code does when nothing interferes (and compares with the probe, also a best-of) */
    qsort(times, (size_t)iters, sizeof *times, cmp_double);
    double med = times[iters / 2], best = times[0];
    double flop = 2.0 * (double)rows * (double)cols * n_tok;
    printf("%-6s %-5s thr=%d [%6lld x %5lld] n_tok=%3d: %8.1f us  %6.2f GB/s %6.1f GFLOP/s"
           "  best %6.2f GB/s %6.1f GFLOP/s",
           cpu_isa_name(isa), ts_dtype_name(dt), nth, (long long)rows, (long long)cols, n_tok,
           med * 1e6, (double)wbytes / med * 1e-9, flop / med * 1e-9,
           (double)wbytes / best * 1e-9, flop / best * 1e-9);
    if (n_tok <= 4) {
        /* this host's bandwidth drifts (shared machine): compare with a probe taken now */
        double probe = cpu_measure_read_bandwidth(pool, (size_t)512 << 20, 5);
        printf("  probe %.1f GB/s: best %.0f%%", probe, 100.0 * (double)wbytes / best * 1e-9 /
                                                          probe);
    }
    printf("\n");
out:
    if (w) munmap(w, wbytes * (size_t)copies);
    free(x);
    free(y);
}

/* --bench [decode|mid|prefill|bw|all [isa [dtype]]] */
static int bench(int argc, char **argv) {
    const char *only = argc > 2 && strcmp(argv[2], "all") ? argv[2] : "";
    const char *isa_only = argc > 3 ? argv[3] : "", *dt_only = argc > 4 ? argv[4] : "";
    static const ts_dtype dts[] = {TS_DTYPE_BF16, TS_DTYPE_F16, TS_DTYPE_F32};
    for (int nth = 1; nth <= 2; nth++) {
        ts_pool *pool = NULL;
        if (ts_pool_create(nth, &pool) != TS_OK) return 1;
        if (!*only || !strcmp(only, "bw"))
            printf("read bandwidth, %d thread(s): %.2f GB/s\n", nth,
                   cpu_measure_read_bandwidth(pool, (size_t)1 << 30, 5));
        for (int i = CPU_ISA_COUNT - 1; i >= 0; i--) {
            cpu_isa isa = (cpu_isa)i;
            if (!cpu_isa_supported(isa) || (*isa_only && strcmp(isa_only, cpu_isa_name(isa))))
                continue;
            for (size_t d = 0; d < 3; d++) {
                ts_dtype dt = dts[d];
                if (*dt_only && strcmp(dt_only, ts_dtype_name(dt))) continue;
                if (!*only || !strcmp(only, "decode")) {
                    bench_one(pool, nth, isa, dt, 6144, 1024, 1, 0.5);
                    bench_one(pool, nth, isa, dt, 1024, 6144, 1, 0.5);
                    if (dt == TS_DTYPE_BF16) bench_one(pool, nth, isa, dt, 248320, 1024, 1, 1.0);
                }
                /* batched decode and short prompts: weights still come from memory */
                if ((!*only && dt == TS_DTYPE_BF16) || !strcmp(only, "mid")) {
                    for (int t = 2; t <= 64; t *= 2) {
                        if (isa == CPU_ISA_SCALAR && t > 4) break;
                        bench_one(pool, nth, isa, dt, 6144, 1024, t, 0.5);
                        if (t >= 8) bench_one(pool, nth, isa, dt, 1024, 6144, t, 0.5);
                    }
                }
                if (isa == CPU_ISA_SCALAR) continue; /* minutes at 512 tokens */
                if (!*only || !strcmp(only, "prefill")) {
                    bench_one(pool, nth, isa, dt, 1024, 1024, 512, 1.0);
                    bench_one(pool, nth, isa, dt, 3584, 1024, 512, 1.0);
                }
            }
        }
        ts_pool_free(pool);
    }
    return 0;
}

/* One token's decode gives the same bits with a row block's rows side by side and one after
 * another (cpu_seq_rows, which the CPU's vendor picks by path; both orders set here for every
 * path), at every ISA: the same operations on each row's accumulator in either order. Row counts
 * that leave a row block short, columns with every kind of tail, 1 and 2 threads; rows not written
 * show as NaN. */
static void test_decode_row_order(void) {
    static const int64_t shapes[][2] = {{1, 16}, {7, 37}, {13, 1000}, {29, 1024}, {70, 4104}};
    const ts_dtype types[] = {TS_DTYPE_F32, TS_DTYPE_F16, TS_DTYPE_BF16};
    const unsigned seq_default = cpu_seq_rows_mask();
    unsigned long long s = 0x5e90ab5ull;
    for (int nth = 1; nth <= 2; nth++) {
        ts_pool *pool = NULL;
        CHECK(ts_pool_create(nth, &pool) == TS_OK);
        for (size_t d = 0; d < sizeof types / sizeof *types; d++)
            for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
                int64_t rows = shapes[k][0], cols = shapes[k][1];
                wmat m;
                wmat_make(&m, types[d], rows, cols, &s);
                float *x = malloc(sizeof(float) * (size_t)cols), *y[2];
                for (int64_t i = 0; i < cols; i++)
                    x[i] = tu_rng_uniform(&s);
                for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
                    if (!cpu_isa_supported((cpu_isa)isa)) continue;
                    for (int seq = 0; seq < 2; seq++) {
                        cpu_seq_rows_set_mask(seq ? ~0u : 0u);
                        y[seq] = malloc(sizeof(float) * (size_t)rows);
                        memset(y[seq], 0xff, sizeof(float) * (size_t)rows);
                        cpu_matmul(pool, NULL, (cpu_isa)isa, &m.t, x, cols, 1, y[seq], rows);
                    }
                    int diff = 0;
                    for (int64_t o = 0; o < rows; o++)
                        diff += memcmp(&y[0][o], &y[1][o], 4) != 0 || y[1][o] != y[1][o];
                    CHECKF(diff == 0,
                           "%s %s %d thr [%lld x %lld]: %d rows differ between the orders",
                           ts_dtype_name(types[d]), cpu_isa_name((cpu_isa)isa), nth,
                           (long long)rows, (long long)cols, diff);
                    free(y[0]), free(y[1]);
                }
                free(x);
                wmat_free(&m);
            }
        ts_pool_free(pool);
    }
    cpu_seq_rows_set_mask(seq_default);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--print-isa")) {
        printf("%s\n", cpu_isa_name(cpu_isa_best()));
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench(argc, argv);
    test_isa_selection(argv[0]);
    test_dequant_row();
    test_simd_really_runs();
    test_empty_rows();
    test_matmul_shapes();
    test_decode_row_order();
    return tu_report("test_matmul");
}
