/* Quantized weight types: dequantization of hand-built blocks against values written out from
 * the format definition; quantize -> dequantize error on Gaussian data; every quantized matmul
 * kernel x every ISA this machine runs x odd shapes against a float64 reference (with a bound
 * derived from the int8 activation rounding) and against the scalar kernel; 1 and 2 threads;
 * the same bits for a token alone and inside a batch. `test_quant --bench` prints decode GB/s
 * (from DRAM, or `hot`: from L2) and prefill GFLOP/s instead (not run by CTest). */
#include "backend/cpu/bandwidth.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_q.h"
#include "backend/cpu/quant.h"
#include "base/cpu.h"
#include "base/half.h"
#include "base/mmapfile.h"
#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SENTINEL 777.25f

static const ts_dtype QTYPES[] = {TS_DTYPE_Q8_0, TS_DTYPE_Q4_0, TS_DTYPE_Q5_0, TS_DTYPE_Q4_K,
                                  TS_DTYPE_Q6_K};
#define N_QTYPES (sizeof QTYPES / sizeof *QTYPES)

static const cpu_mm_kernel *const TABLES[CPU_ISA_COUNT] = {cpu_mmq_scalar, cpu_mmq_avx2,
                                                           cpu_mmq_avx512};

/* The AVX-512 kernels use VNNI on top of what cpu_isa_supported checks. */
static int isa_ok(int isa) {
    if (!cpu_isa_supported((cpu_isa)isa)) return 0;
    return isa != CPU_ISA_AVX512 || ts_cpu_get_features()->avx512vnni;
}

static float gauss(unsigned long long *s) {
    double u1 = ((tu_rng_next(s) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (tu_rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* ---- hand-built blocks ------------------------------------------------------------------ */

static void test_dequant_q8_0_q4_0_q5_0(void) {
    uint8_t blk[34];
    float y[32];
    uint16_t h = 0x3800; /* 0.5 */
    memcpy(blk, &h, 2);
    for (int i = 0; i < 32; i++) blk[2 + i] = (uint8_t)(int8_t)(i * 8 - 127);
    CHECK(ts_dequantize_row(TS_DTYPE_Q8_0, blk, y, 32) == TS_OK);
    for (int i = 0; i < 32; i++) CHECKF(y[i] == (float)(i * 8 - 127) * 0.5f, "q8_0 %d: %g", i, y[i]);

    /* Q4_0, d = -2: byte j = element j (low) | element j + 16 (high) */
    h = 0xc000;
    memcpy(blk, &h, 2);
    for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(j | (15 - j) << 4);
    CHECK(ts_dequantize_row(TS_DTYPE_Q4_0, blk, y, 32) == TS_OK);
    for (int j = 0; j < 16; j++) {
        CHECKF(y[j] == (float)(j - 8) * -2.0f, "q4_0 %d: %g", j, y[j]);
        CHECKF(y[j + 16] == (float)(7 - j) * -2.0f, "q4_0 %d: %g", j + 16, y[j + 16]);
    }
    CHECK(y[0] == 16.0f && y[31] == 16.0f && y[15] == -14.0f); /* written out */

    /* Q5_0, d = 0.25: qh bytes little-endian; element 0 has bit 0 of byte 0, element 31 bit 7
     * of byte 3 */
    uint8_t b5[22];
    h = 0x3400;
    memcpy(b5, &h, 2);
    const uint8_t qh[4] = {0x01, 0x80, 0x00, 0xc0}; /* bits 0, 15, 30, 31 */
    memcpy(b5 + 2, qh, 4);
    for (int j = 0; j < 16; j++) b5[6 + j] = (uint8_t)(j | (j ^ 5) << 4);
    CHECK(ts_dequantize_row(TS_DTYPE_Q5_0, b5, y, 32) == TS_OK);
    for (int i = 0; i < 32; i++) {
        int nib = i < 16 ? i : ((i - 16) ^ 5);
        int hb = i == 0 || i == 15 || i == 30 || i == 31;
        CHECKF(y[i] == (float)(nib + 16 * hb - 16) * 0.25f, "q5_0 %d: %g", i, y[i]);
    }
    CHECK(y[0] == 0.0f && y[1] == -3.75f && y[15] == 3.75f && y[31] == ((10 + 16) - 16) * 0.25f);
}

static void test_dequant_q4_K(void) {
    static const int sc[8] = {1, 2, 3, 63, 17, 40, 5, 33}, m[8] = {0, 1, 62, 7, 20, 48, 9, 63};
    ts_block_q4_K b;
    memset(&b, 0, sizeof b);
    b.d = 0x3c00;    /* 1.0 */
    b.dmin = 0x3800; /* 0.5 */
    /* the packing, written out from the format description */
    for (int j = 0; j < 4; j++) {
        b.scales[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        b.scales[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        b.scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
    /* and once as literal bytes: sc[4] = 17 = 0b010001 -> low 4 bits 1 in byte 8, high bits
     * 01 in bits 6-7 of byte 0 (with sc[0] = 1): 0x41 */
    CHECK(b.scales[0] == 0x41 && b.scales[8] == (uint8_t)(1 | (20 & 15) << 4));
    for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)(i * 37 + 11);
    float y[256];
    CHECK(ts_dequantize_row(TS_DTYPE_Q4_K, &b, y, 256) == TS_OK);
    for (int e = 0; e < 256; e++) {
        int g = e / 64, r = e % 64, j = e / 32;
        uint8_t byte = b.qs[32 * g + r % 32];
        int q = r < 32 ? byte & 15 : byte >> 4;
        float want = 1.0f * (float)sc[j] * (float)q - 0.5f * (float)m[j];
        CHECKF(y[e] == want, "q4_K %d: %g want %g", e, y[e], want);
    }
    /* element 200: sub-block 6 (sc 5, m 9), group 3, low nibble of qs[96 + 8]; element 250:
     * sub-block 7 (sc 33, m 63), high nibble of qs[96 + 26] */
    CHECK(y[200] == 5.0f * (float)(((104 * 37 + 11) & 255) & 15) - 4.5f);
    CHECK(y[250] == 33.0f * (float)(((122 * 37 + 11) & 255) >> 4) - 31.5f);
}

static void test_dequant_q6_K(void) {
    ts_block_q6_K b;
    for (int i = 0; i < 128; i++) b.ql[i] = (uint8_t)(i * 29 + 3);
    for (int i = 0; i < 64; i++) b.qh[i] = (uint8_t)(i * 53 + 7);
    for (int i = 0; i < 16; i++) b.scales[i] = (int8_t)(i * 17 - 128);
    b.d = 0x3000; /* 0.125 */
    float y[256];
    CHECK(ts_dequantize_row(TS_DTYPE_Q6_K, &b, y, 256) == TS_OK);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, r = e % 128, l = r % 32, k = r / 32;
        uint8_t lb = b.ql[64 * h + l + 32 * (k & 1)];
        int lo = k >= 2 ? lb >> 4 : lb & 15;
        int hi = (b.qh[32 * h + l] >> (2 * k)) & 3;
        float want = 0.125f * (float)b.scales[e / 16] * (float)((lo | hi << 4) - 32);
        CHECKF(y[e] == want, "q6_K %d: %g want %g", e, y[e], want);
    }
    /* element 0: ql[0] = 3 -> 3, qh[0] = 7 -> bits 0-1 = 3: q = 51 - 32 = 19, sc -128 */
    CHECK(y[0] == 0.125f * -128.0f * 19.0f);
    /* element 200: half 1, l = 8, k = 2: high nibble of ql[72], bits 4-5 of qh[40] */
    int q200 = ((uint8_t)(72 * 29 + 3) >> 4 | (((uint8_t)(40 * 53 + 7) >> 4) & 3) << 4) - 32;
    CHECK(y[200] == 0.125f * (float)(12 * 17 - 128) * (float)q200);
}

static void test_errors(void) {
    float y[64];
    uint8_t buf[64] = {0};
    CHECK(ts_dequantize_row(TS_DTYPE_Q4_0, buf, y, 33) == TS_ERR_INVALID);
    CHECK(ts_quantize_row(TS_DTYPE_Q4_K, y, buf, 32) == TS_ERR_INVALID);
    CHECK(ts_dequantize_row(TS_DTYPE_COUNT, buf, y, 32) == TS_ERR_INVALID);
    CHECK(ts_dtype_is_quantized(TS_DTYPE_Q6_K) && !ts_dtype_is_quantized(TS_DTYPE_BF16));
    CHECK((size_t)ts_dtype_block_bytes(TS_DTYPE_Q5_0) == sizeof(ts_block_q5_0));
    CHECK((size_t)ts_dtype_block_bytes(TS_DTYPE_Q6_K) == sizeof(ts_block_q6_K));
}

/* ---- quantize -> dequantize ----------------------------------------------------------- */

static void test_roundtrip(void) {
    /* relative RMS error on Gaussian data; measured here: Q8_0 0.53%, Q4_0 8.6%, Q5_0 4.2%,
     * Q4_K 7.1%, Q6_K 1.8% */
    static const double bound[] = {0.006, 0.095, 0.047, 0.078, 0.020};
    enum { N = 256 * 64 };
    static float x[N], y[N];
    static uint8_t q[N * 2];
    unsigned long long s = 42;
    for (int i = 0; i < N; i++) x[i] = gauss(&s) * 0.05f;
    for (size_t k = 0; k < N_QTYPES; k++) {
        ts_dtype dt = QTYPES[k];
        CHECK(ts_quantize_row(dt, x, q, N) == TS_OK);
        CHECK(ts_dequantize_row(dt, q, y, N) == TS_OK);
        double e = tu_rel_l2(y, x, N);
        CHECKF(e < bound[k], "%s: relative RMS error %.4f >= %.4f", ts_dtype_name(dt), e,
               bound[k]);
        if (getenv("TS_VERBOSE")) printf("%s rel rms %.5f\n", ts_dtype_name(dt), e);
        /* all zeros stay zero; a block with one spike keeps the spike to its scale's rounding */
        float z[256] = {0}, zy[256];
        CHECK(ts_quantize_row(dt, z, q, 256) == TS_OK);
        CHECK(ts_dequantize_row(dt, q, zy, 256) == TS_OK);
        int nz = 0;
        for (int i = 0; i < 256; i++) nz += zy[i] != 0.0f;
        CHECKF(nz == 0, "%s: zeros -> %d nonzero", ts_dtype_name(dt), nz);
        z[37] = -3.0f;
        CHECK(ts_quantize_row(dt, z, q, 256) == TS_OK);
        CHECK(ts_dequantize_row(dt, q, zy, 256) == TS_OK);
        CHECKF(fabsf(zy[37] + 3.0f) < 0.01f && fabsf(zy[36]) < 0.01f, "%s: spike %g %g",
               ts_dtype_name(dt), zy[37], zy[36]);
    }
}

/* ---- matmul kernels -------------------------------------------------------------------- */

typedef struct {
    cpu_mm_job job;
    const cpu_mm_kernel *k;
    int64_t rows;
} run_ctx;

static void run_worker(void *ctx, int ith, int nth) {
    const run_ctx *c = ctx;
    long blocks = (long)((c->rows + c->k->row_align - 1) / c->k->row_align), lo, hi;
    ts_split_range(blocks, ith, nth, &lo, &hi);
    int64_t r0 = lo * c->k->row_align, r1 = hi * c->k->row_align;
    if (r1 > c->rows) r1 = c->rows;
    if (r0 < r1) c->k->fn(&c->job, r0, r1);
}

/* The kernel of one table on weights already in its layout, split over the pool's threads as
 * cpu_matmul splits them. */
static void run_kernel_on(ts_pool *pool, const cpu_mm_kernel *k, const void *w, ts_dtype dt,
                          int64_t rows, int64_t cols, const float *x, int64_t ldx, int n_tok,
                          float *y, int64_t ldy) {
    run_ctx c = {.job = {.w = w,
                         .row_bytes = ts_dtype_row_bytes(dt, cols),
                         .cols = cols,
                         .x = x,
                         .ldx = ldx,
                         .n_tok = n_tok,
                         .y = y,
                         .ldy = ldy},
                 .k = k,
                 .rows = rows};
    ts_pool_run(pool, run_worker, &c);
}

/* The same on weights in the file's layout (regrouped first, into a buffer of this call, where
 * the kernel reads them so). */
static void run_kernel(ts_pool *pool, const cpu_mm_kernel *k, const void *w, ts_dtype dt,
                       int64_t rows, int64_t cols, const float *x, int64_t ldx, int n_tok, float *y,
                       int64_t ldy) {
    if (!k->repack) {
        run_kernel_on(pool, k, w, dt, rows, cols, x, ldx, n_tok, y, ldy);
        return;
    }
    const size_t rb = ts_dtype_row_bytes(dt, cols), bytes = rb * (size_t)rows;
    uint8_t *kw = aligned_alloc(64, (bytes + 63) / 64 * 64);
    CHECK(kw != NULL);
    if (!kw) return;
    cpu_repack_run(NULL, w, kw, bytes, rb, k->repack);
    run_kernel_on(pool, k, kw, dt, rows, cols, x, ldx, n_tok, y, ldy);
    free(kw);
}

static void check_shape(ts_pool *pool, int nth, ts_dtype dt, int64_t rows, int64_t cols,
                        int n_tok, unsigned long long *s) {
    int fails_before = tu_failures;
    size_t rb = ts_dtype_row_bytes(dt, cols);
    uint8_t *w = aligned_alloc(64, (rb * (size_t)rows + 64 + 63) / 64 * 64); /* size: a multiple of 64 */
    float *wf = malloc(sizeof(float) * (size_t)(rows * cols));
    float *tmp = malloc(sizeof(float) * (size_t)cols);
    for (int64_t o = 0; o < rows; o++) {
        float scale = 0.02f * (float)(1 + o % 5);
        for (int64_t i = 0; i < cols; i++) tmp[i] = gauss(s) * scale;
        CHECK(ts_quantize_row(dt, tmp, w + (size_t)o * rb, cols) == TS_OK);
        CHECK(ts_dequantize_row(dt, w + (size_t)o * rb, wf + o * cols, cols) == TS_OK);
    }
    int64_t ldx = cols + 5, ldy = rows + 3;
    float *x = malloc(sizeof(float) * (size_t)(n_tok * ldx));
    for (int64_t i = 0; i < n_tok * ldx; i++) x[i] = gauss(s) * (i % 97 == 0 ? 8.0f : 1.0f);
    /* float64 reference from the dequantized weights and the fp32 activations; the kernels
     * round each activation to its block's int8 grid, by at most amax / 254 (half a step),
     * which bounds their deviation by sum over blocks of amax / 254 * sum |w| */
    size_t ny = (size_t)(n_tok * rows);
    double *ref = malloc(sizeof(double) * ny), *bnd = malloc(sizeof(double) * ny);
    double *mag = malloc(sizeof(double) * ny);
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + t * ldx;
        for (int64_t o = 0; o < rows; o++) {
            double acc = 0, b = 0, a = 0;
            for (int64_t b0 = 0; b0 < cols; b0 += 32) {
                double amax = 0, sw = 0;
                for (int64_t i = b0; i < b0 + 32; i++) {
                    double wv = wf[o * cols + i];
                    acc += wv * xt[i];
                    a += fabs(wv * xt[i]);
                    amax = fmax(amax, fabs(xt[i]));
                    sw += fabs(wv);
                }
                b += amax / 254.0 * sw;
            }
            ref[t * rows + o] = acc;
            bnd[t * rows + o] = b;
            mag[t * rows + o] = a;
        }
    }
    size_t ysz = sizeof(float) * (size_t)(n_tok * ldy);
    float *ys = malloc(ysz), *y = malloc(ysz);
    for (int64_t i = 0; i < n_tok * ldy; i++) ys[i] = SENTINEL;
    run_kernel(NULL, &cpu_mmq_scalar[dt], w, dt, rows, cols, x, ldx, n_tok, ys, ldy);
    for (int isa = 0; isa < CPU_ISA_COUNT + 1; isa++) {
        /* isa == CPU_ISA_COUNT: through cpu_matmul, once the dispatcher knows the type */
        if (isa < CPU_ISA_COUNT && !isa_ok(isa)) continue;
        if (isa == CPU_ISA_COUNT && !cpu_matmul_supports(dt)) continue;
        for (int64_t i = 0; i < n_tok * ldy; i++) y[i] = SENTINEL;
        if (isa < CPU_ISA_COUNT) {
            run_kernel(pool, &TABLES[isa][dt], w, dt, rows, cols, x, ldx, n_tok, y, ldy);
        } else {
            ts_tensor tt = {.dtype = dt, .n_dims = 2, .shape = {rows, cols}, .data = w,
                            .nbytes = rb * (size_t)rows};
            cpu_matmul(pool, NULL, cpu_isa_best(), &tt, x, ldx, n_tok, y, ldy);
        }
        const char *iname = isa < CPU_ISA_COUNT ? cpu_isa_name((cpu_isa)isa) : "cpu_matmul";
        for (int t = 0; t < n_tok; t++) {
            for (int64_t o = 0; o < ldy; o++) {
                float v = y[t * ldy + o];
                if (o >= rows) {
                    CHECKF(v == SENTINEL, "%s %s: wrote y gap t=%d o=%lld", ts_dtype_name(dt),
                           iname, t, (long long)o);
                    continue;
                }
                size_t i = (size_t)(t * rows + o);
                double fp = 2e-6 * mag[i] + 1e-30; /* fp32 rounding in any summation order */
                double e_ref = fabs((double)v - ref[i]), e_sc = fabs((double)v - ys[t * ldy + o]);
                CHECKF(e_ref <= 1.01 * bnd[i] + fp && e_sc <= fp,
                       "%s %s %d thr [%lld x %lld] n_tok %d: y[%d][%lld] = %.9g ref %.9g "
                       "(bound %.3g) scalar %.9g",
                       ts_dtype_name(dt), iname, nth, (long long)rows, (long long)cols, n_tok, t,
                       (long long)o, v, ref[i], bnd[i], ys[t * ldy + o]);
                if (tu_failures - fails_before > 5) goto out;
            }
        }
    }
out:
    free(w);
    free(wf);
    free(tmp);
    free(x);
    free(ref);
    free(bnd);
    free(mag);
    free(ys);
    free(y);
}

static void test_kernels(void) {
    static const int64_t rows[] = {1, 3, 7, 34, 67};
    static const int toks[] = {1, 2, 3, 5, 17, 64};
    unsigned long long seed = 0xfeedfacecafebeefull;
    for (int nth = 1; nth <= 2; nth++) {
        ts_pool *pool = NULL;
        CHECK(ts_pool_create(nth, &pool) == TS_OK);
        for (size_t d = 0; d < N_QTYPES; d++) {
            ts_dtype dt = QTYPES[d];
            int be = ts_dtype_block_elems(dt);
            const int64_t cols[] = {be, 3 * be, be == 32 ? 320 : 1024};
            for (size_t r = 0; r < sizeof rows / sizeof *rows; r++)
                for (size_t c = 0; c < 3; c++)
                    for (size_t t = 0; t < sizeof toks / sizeof *toks; t++)
                        check_shape(pool, nth, dt, rows[r], cols[c], toks[t], &seed);
            /* whole 256-element chunks plus a one-block tail (the AVX-512 8-block kernels) */
            check_shape(pool, nth, dt, 9, be == 32 ? 800 : 2304, 6, &seed);
            if (be == 32) { /* tails of 4 blocks (Gemma 3's 640 columns) and of 7 */
                check_shape(pool, nth, dt, 9, 640, 3, &seed);
                check_shape(pool, nth, dt, 9, 480, 5, &seed);
            }
            /* long rows: token tiles of the activation scratch (4 tokens at 32768 columns) */
            check_shape(pool, nth, dt, 5, 32768, 9, &seed);
            /* one token over many rows, as a decode step's matmuls: ranges of hundreds of
             * rows a thread, neither a multiple of the kernels' row blocks */
            check_shape(pool, nth, dt, 701, 2048, 1, &seed);
        }
        ts_pool_free(pool);
    }
}

/* A token's outputs do not depend on the tokens computed with it: every kernel gives the same
 * bits for a token alone (decode, one-token tiles) as inside a batch (tiles of several tokens,
 * where the AVX-512 K-quant tiles take the rows one at a time), so that prefill and decode, or
 * a prompt with and without a cached prefix, agree exactly - the token alone with a row block's
 * rows summed together and one after another (cpu_seq_rows, which a CPU's vendor picks by path). */
static void test_batch_invariance(void) {
    /* 5 whole chunks (where one to eight tokens on AVX-512 take the rows as one stream,
     * mmq_il_stream, an odd last row alone); the 32-element types also 3 or 7 blocks more (a
     * row tail, which the 8-block kernels fold in a form of its own for up to 4 blocks and
     * another for 5-7) */
    enum { ROWS = 37, COLS = 1280 + 224, NTOK = 11 };
    unsigned long long s = 0xba7c4ull;
    float *x = malloc(sizeof(float) * NTOK * COLS), *tmp = malloc(sizeof(float) * COLS);
    float *yb = malloc(sizeof(float) * NTOK * ROWS), *y1 = malloc(sizeof(float) * ROWS);
    float *yk = malloc(sizeof(float) * NTOK * ROWS);
    for (int i = 0; i < NTOK * COLS; i++) x[i] = gauss(&s);
    const unsigned seq_default = cpu_seq_rows_mask();
    for (size_t d = 0; d < 3 * N_QTYPES; d++) {
        const ts_dtype dt = QTYPES[d % N_QTYPES];
        const bool k_quant = ts_dtype_block_elems(dt) == 256;
        if (k_quant && d >= N_QTYPES) continue;
        const int cols = d < N_QTYPES ? 1280 : d < 2 * N_QTYPES ? 1280 + 96 : COLS;
        const size_t rb = ts_dtype_row_bytes(dt, cols);
        uint8_t *w = aligned_alloc(64, (rb * ROWS + 63) / 64 * 64);
        for (int o = 0; o < ROWS; o++) {
            for (int i = 0; i < cols; i++) tmp[i] = gauss(&s) * 0.05f;
            CHECK(ts_quantize_row(dt, tmp, w + (size_t)o * rb, cols) == TS_OK);
        }
        for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
            if (!isa_ok(isa)) continue;
            run_kernel(NULL, &TABLES[isa][dt], w, dt, ROWS, cols, x, COLS, NTOK, yb, ROWS);
            for (int seq = 0; seq < 2; seq++) {
                cpu_seq_rows_set_mask(seq ? ~0u : 0u);
                for (int t = 0; t < NTOK; t++) {
                    memset(y1, 0xff, sizeof(float) * ROWS); /* NaN: rows left out show */
                    run_kernel(NULL, &TABLES[isa][dt], w, dt, ROWS, cols, x + t * COLS, COLS, 1, y1,
                               ROWS);
                    int diff = 0;
                    for (int o = 0; o < ROWS; o++)
                        diff += memcmp(&y1[o], &yb[t * ROWS + o], 4) != 0;
                    CHECKF(diff == 0,
                           "%s %s, rows %s: token %d alone differs from the batch in %d rows",
                           ts_dtype_name(dt), cpu_isa_name((cpu_isa)isa),
                           seq ? "one after another" : "together", t, diff);
                }
                /* two to eight tokens: tiles of that many, or on AVX-512 the stream (the
                 * batch of NTOK takes the tiles) */
                for (int k = 2; k <= 8; k++)
                    for (int t = 0; t + k <= NTOK; t += k) {
                        memset(yk, 0xff, sizeof(float) * NTOK * ROWS);
                        run_kernel(NULL, &TABLES[isa][dt], w, dt, ROWS, cols, x + t * COLS, COLS, k,
                                   yk, ROWS);
                        int diff = 0;
                        for (int o = 0; o < k * ROWS; o++)
                            diff += memcmp(&yk[o], &yb[t * ROWS + o], 4) != 0;
                        CHECKF(diff == 0,
                               "%s %s, rows %s: tokens %d-%d differ from the batch in %d rows",
                               ts_dtype_name(dt), cpu_isa_name((cpu_isa)isa),
                               seq ? "one after another" : "together", t, t + k - 1, diff);
                    }
            }
            cpu_seq_rows_set_mask(seq_default);
        }
        free(w);
    }
    free(x);
    free(tmp);
    free(yb);
    free(y1);
    free(yk);
}

/* Prefill's activations quantized once by cpu_matmul_n for every thread and weight (matmul_act.c)
 * give each weight the bits its kernel gives quantizing for itself: every type and ISA, rows
 * with whole chunks, with a tail and too long for AVX2's decoded row block (its tiles then take
 * the activations in their natural order); a stack of two types; a stack whose layouts differ
 * on AVX-512 (Q8_0 beside Q4_K), where each kernel quantizes for itself. */
static void test_shared_activations(void) {
    enum { ROWS = 19, MAXC = 18432, NT = 37 };
    unsigned long long s = 0x5a7e5ull;
    ts_pool *pool = NULL;
    CHECK(ts_pool_create(2, &pool) == TS_OK);
    if (!pool) return;
    float *x = malloc(sizeof(float) * NT * MAXC), *tmp = malloc(sizeof(float) * MAXC);
    float *y[2], *ref[2];
    for (int i = 0; i < 2; i++) {
        y[i] = malloc(sizeof(float) * NT * ROWS);
        ref[i] = malloc(sizeof(float) * NT * ROWS);
    }
    for (int i = 0; i < NT * MAXC; i++)
        x[i] = gauss(&s);
    const int colss[] = {1280, 1376, MAXC};
    /* pairs of types for the stacks: one weight (both the same), two, two of different layouts */
    const ts_dtype pairs[][2] = {{TS_DTYPE_Q8_0, TS_DTYPE_Q8_0}, {TS_DTYPE_Q4_0, TS_DTYPE_Q4_0},
                                 {TS_DTYPE_Q5_0, TS_DTYPE_Q5_0}, {TS_DTYPE_Q4_K, TS_DTYPE_Q4_K},
                                 {TS_DTYPE_Q6_K, TS_DTYPE_Q6_K}, {TS_DTYPE_Q4_K, TS_DTYPE_Q6_K},
                                 {TS_DTYPE_Q8_0, TS_DTYPE_Q4_K}};
    for (size_t pi = 0; pi < sizeof pairs / sizeof *pairs; pi++) {
        const int nw = pairs[pi][0] == pairs[pi][1] ? 1 : 2;
        for (size_t ci = 0; ci < sizeof colss / sizeof *colss; ci++) {
            const int cols = colss[ci];
            bool ok = true;
            for (int j = 0; j < nw; j++)
                ok &= cols % ts_dtype_block_elems(pairs[pi][j]) == 0;
            if (!ok) continue;
            uint8_t *w[2] = {NULL, NULL};
            ts_tensor W[2];
            const ts_tensor *Wp[2] = {&W[0], &W[1]};
            for (int j = 0; j < nw; j++) {
                const ts_dtype dt = pairs[pi][j];
                const size_t rb = ts_dtype_row_bytes(dt, cols);
                w[j] = aligned_alloc(64, (rb * ROWS + 63) / 64 * 64);
                for (int o = 0; o < ROWS; o++) {
                    for (int i = 0; i < cols; i++)
                        tmp[i] = gauss(&s) * 0.05f;
                    CHECK(ts_quantize_row(dt, tmp, w[j] + (size_t)o * rb, cols) == TS_OK);
                }
                W[j] = (ts_tensor){.dtype = dt,
                                   .n_dims = 2,
                                   .shape = {ROWS, cols, 1, 1},
                                   .data = w[j],
                                   .nbytes = rb * ROWS};
            }
            const int64_t ld[2] = {ROWS, ROWS};
            for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
                if (!isa_ok(isa)) continue;
                for (int n_tok = 9; n_tok <= NT; n_tok += NT - 9) {
                    for (int j = 0; j < nw; j++) {
                        memset(y[j], 0xff, sizeof(float) * NT * ROWS);
                        run_kernel(pool, &TABLES[isa][pairs[pi][j]], w[j], pairs[pi][j], ROWS, cols,
                                   x, MAXC, n_tok, ref[j], ROWS);
                    }
                    cpu_matmul_n(pool, NULL, (cpu_isa)isa, Wp, nw, x, MAXC, n_tok, y, ld, NULL);
                    for (int j = 0; j < nw; j++)
                        CHECKF(memcmp(y[j], ref[j], sizeof(float) * (size_t)n_tok * ROWS) == 0,
                               "%s (of %d) %s, %d columns, %d tokens: shared activations differ",
                               ts_dtype_name(pairs[pi][j]), nw, cpu_isa_name((cpu_isa)isa), cols,
                               n_tok);
                }
            }
            for (int j = 0; j < nw; j++)
                free(w[j]);
        }
    }
    for (int i = 0; i < 2; i++)
        free(y[i]), free(ref[i]);
    free(x);
    free(tmp);
    ts_pool_free(pool);
}

/* Balanced jobs whose thread `slow` spends 3 us an item, the other 1 us: they move the pool's
 * shares away from halves (test_threadpool holds the shares themselves). */
typedef struct {
    ts_pool *pool;
    int slow;
} skew_job;

static void skew_fn(void *ctx, int ith, int nth) {
    const skew_job *j = ctx;
    long lo, hi;
    ts_pool_share(j->pool, 100, ith, nth, &lo, &hi);
    tu_spin_us((double)(hi - lo) * (ith == j->slow ? 3.0 : 1.0));
}

/* cpu_matmul's rows do not depend on how the threads divide them: for a few tokens the rows go
 * by the threads' measured speed (ts_pool_run_balanced), which changes from job to job, and a
 * row's value must not. One thread against two whose shares lean either way, bit for bit. */
static void test_split_invariance(void) {
    enum { ROWS = 301, COLS = 1024 };
    unsigned long long s = 0x5b1e7ull;
    ts_pool *one = NULL, *two = NULL;
    CHECK(ts_pool_create(1, &one) == TS_OK && ts_pool_create(2, &two) == TS_OK);
    if (!one || !two) return;
    float *x = malloc(sizeof(float) * 4 * COLS), *tmp = malloc(sizeof(float) * COLS);
    float *y1 = malloc(sizeof(float) * 4 * ROWS), *y2 = malloc(sizeof(float) * 4 * ROWS);
    for (int i = 0; i < 4 * COLS; i++)
        x[i] = gauss(&s);
    for (size_t d = 0; d < N_QTYPES; d++) {
        const ts_dtype dt = QTYPES[d];
        const size_t rb = ts_dtype_row_bytes(dt, COLS);
        uint8_t *w = aligned_alloc(64, (rb * ROWS + 63) / 64 * 64);
        for (int o = 0; o < ROWS; o++) {
            for (int i = 0; i < COLS; i++)
                tmp[i] = gauss(&s) * 0.05f;
            CHECK(ts_quantize_row(dt, tmp, w + (size_t)o * rb, COLS) == TS_OK);
        }
        ts_tensor W = {
            .dtype = dt, .n_dims = 2, .shape = {ROWS, COLS, 1, 1}, .data = w, .nbytes = rb * ROWS};
        for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
            if (!isa_ok(isa)) continue;
            for (int n_tok = 1; n_tok <= 4; n_tok += 3)
                for (int slow = 0; slow < 2; slow++) {
                    /* until the shares lean, at most 400 jobs: with other tests beside
                     * this one a descheduled thread looks slow too, so a fixed count of jobs
                     * did not always get there */
                    skew_job sj = {two, slow};
                    double s0 = ts_pool_share_of(two, 0);
                    for (int k = 0; k < 400 && (slow ? s0 <= 0.6 : s0 >= 0.4); k++) {
                        ts_pool_run_balanced(two, skew_fn, &sj, 100);
                        s0 = ts_pool_share_of(two, 0);
                    }
                    CHECKF(slow ? s0 > 0.6 : s0 < 0.4, "skewing the shares: thread 0 has %.3f", s0);
                    memset(y1, 0xff, sizeof(float) * 4 * ROWS); /* NaN: rows left out show */
                    memset(y2, 0xff, sizeof(float) * 4 * ROWS);
                    cpu_matmul(one, NULL, (cpu_isa)isa, &W, x, COLS, n_tok, y1, ROWS);
                    cpu_matmul(two, NULL, (cpu_isa)isa, &W, x, COLS, n_tok, y2, ROWS);
                    int diff = 0;
                    for (int i = 0; i < n_tok * ROWS; i++)
                        diff += memcmp(&y1[i], &y2[i], 4) != 0 || y1[i] != y1[i];
                    CHECKF(diff == 0,
                           "%s %s, %d tokens, thread 0's share %.3f: %d rows differ "
                           "from one thread's",
                           ts_dtype_name(dt), cpu_isa_name((cpu_isa)isa), n_tok, s0, diff);
                }
        }
        free(w);
    }
    free(x), free(tmp), free(y1), free(y2);
    ts_pool_free(one), ts_pool_free(two);
}

/* ---- activation quantizer and layouts --------------------------------------------------- */

/* The SIMD activation quantizers write the same bytes as the scalar one (q, d, s, s16), on
 * data that exercises the rounding: random magnitudes, exact ties (x / d = k + 0.5, which
 * round to even), all-zero blocks, -0.0, denormal-small and large blocks. */
static void test_act_quantizer(void) {
    static const int64_t lens[] = {32, 64, 96, 256, 288, 1056};
    unsigned long long seed = 0x5eed5eedull;
    for (size_t l = 0; l < sizeof lens / sizeof *lens; l++) {
        const int64_t n = lens[l];
        float *x = malloc(sizeof(float) * (size_t)n);
        size_t bytes = cpu_q8act_bytes(n);
        uint8_t *ref = aligned_alloc(64, (bytes + 63) / 64 * 64);
        uint8_t *got = aligned_alloc(64, (bytes + 63) / 64 * 64);
        for (int64_t b = 0; b < n / 32; b++) {
            float *xb = x + 32 * b;
            const int kind = (int)(b % 5);
            const float scale = kind == 3 ? 1e-30f : kind == 4 ? 3e4f : 1.0f;
            for (int i = 0; i < 32; i++) xb[i] = gauss(&seed) * scale;
            if (kind == 1) { /* max 127 -> d = 1: every k + 0.5 is a tie */
                xb[0] = 127.0f;
                for (int i = 1; i < 32; i++) xb[i] = (float)(i % 2 ? i : -i) + 0.5f;
            }
            if (kind == 2) {
                for (int i = 0; i < 32; i++) xb[i] = 0.0f;
                xb[7] = -0.0f;
            }
        }
        cpu_q8act_quantize(x, n, ref);
        struct {
            int isa;
            void (*fn)(const float *, int64_t, void *);
        } simd[] = {{CPU_ISA_AVX2, cpu_q8act_quantize_avx2},
                    {CPU_ISA_AVX512, cpu_q8act_quantize_avx512}};
        for (size_t k = 0; k < 2; k++) {
            if (!isa_ok(simd[k].isa)) continue;
            memset(got, 0xa5, bytes);
            simd[k].fn(x, n, got);
            CHECKF(memcmp(ref, got, bytes) == 0, "%s activation quantizer differs (n %lld)",
                   cpu_isa_name((cpu_isa)simd[k].isa), (long long)n);
        }
        /* the ties went to even: block 1 of each 5 has d = 1 and x = +-(i + 0.5) */
        if (n >= 64) {
            cpu_q8act a = cpu_q8act_view(ref, n);
            CHECK(a.d[1] == 1.0f && a.q[32 + 1] == 2 && a.q[32 + 2] == -2 && a.q[32 + 3] == 4);
        }
        free(x);
        free(ref);
        free(got);
    }
}

/* The interleaved orders of whole 256-element chunks, written out from their definitions; the
 * tail after the last whole chunk keeps the natural order. */
static void test_act_interleave(void) {
    const int64_t n = 2 * 256 + 64;
    size_t bytes = cpu_q8act_bytes(n);
    uint8_t *buf = malloc(bytes), *nat = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) nat[i] = (uint8_t)(i * 7 + i / 256);
    memcpy(buf, nat, bytes);
    cpu_q8act_interleave(n, buf);
    for (int64_t c = 0; c < 2; c++)
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 16; i++)
                for (int m = 0; m < 4; m++) {
                    int64_t e = 256 * c + 32 * (i % 8) + 4 * (2 * k + i / 8) + m;
                    CHECK(buf[256 * c + 64 * k + 4 * i + m] == nat[e]);
                }
    CHECK(memcmp(buf + 512, nat + 512, bytes - 512) == 0);
    memcpy(buf, nat, bytes);
    cpu_q8act_interleave_q8(n, buf);
    for (int64_t c = 0; c < 2; c++)
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 8; j++)
                for (int m = 0; m < 8; m++)
                    CHECK(buf[256 * c + 64 * k + 8 * j + m] == nat[256 * c + 32 * j + 8 * k + m]);
    CHECK(memcmp(buf + 512, nat + 512, bytes - 512) == 0);
    free(buf);
    free(nat);
}

/* ---- --bench --------------------------------------------------------------------------- */

/* TS_BENCH_THREADS=1 times with the thread's CPU clock: single-thread tuning on a busy host */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(atoi(tu_env("TS_BENCH_THREADS", "2")) == 1 ? CLOCK_THREAD_CPUTIME_ID
                                                                 : CLOCK_MONOTONIC,
                  &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Decode (n_tok <= 16) cycles through copies of the weights larger than the caches, so that
 * they come from DRAM; hot: one copy that stays in L2, to see the kernel's own speed. */
static void bench_one(ts_pool *pool, int nth, cpu_isa isa, ts_dtype dt, int64_t rows,
                      int64_t cols, int n_tok, double budget_s, int hot) {
    size_t wbytes = ts_dtype_row_bytes(dt, cols) * (size_t)rows;
    int copies = n_tok > 16 || hot ? 1 : (int)((512u << 20) / wbytes) + 1;
    size_t total = wbytes * (size_t)copies;
    uint8_t *w = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    float *x = malloc(sizeof(float) * (size_t)(cols * n_tok));
    float *y = malloc(sizeof(float) * (size_t)(rows * n_tok));
    if (w == MAP_FAILED || !x || !y) {
        printf("bench: out of memory\n");
        goto out;
    }
    madvise(w, total, MADV_HUGEPAGE);
    {
        /* one quantized row repeated: quantizing 500 MB would take longer than the bench */
        unsigned long long s = 5;
        float *row = malloc(sizeof(float) * (size_t)cols);
        for (int64_t i = 0; i < cols; i++) row[i] = gauss(&s);
        size_t rb = ts_dtype_row_bytes(dt, cols);
        ts_quantize_row(dt, row, w, cols);
        for (size_t o = 1; o < total / rb; o++) memcpy(w + o * rb, w, rb);
        free(row);
    }
    for (int64_t i = 0; i < cols * n_tok; i++) x[i] = 0.001f * (float)(i % 1000);
    const cpu_mm_kernel *k = &TABLES[isa][dt];
    if (k->repack) /* regrouped once, as the backend's cache does */
        cpu_repack_run(pool, w, w, total, ts_dtype_row_bytes(dt, cols), k->repack);
    enum { MAX_ITERS = 4096 };
    static double times[MAX_ITERS];
    int iters = 0;
    double start = now_s();
    while (iters < 3 || (now_s() - start < budget_s && iters < MAX_ITERS)) {
        const uint8_t *wi = w + (size_t)(iters % copies) * wbytes;
        double t0 = now_s();
        run_kernel_on(pool, k, wi, dt, rows, cols, x, cols, n_tok, y, rows);
        times[iters++] = now_s() - t0;
    }
    qsort(times, (size_t)iters, sizeof *times, cmp_double);
    double med = times[iters / 2], best = times[0];
    double flop = 2.0 * (double)rows * (double)cols * n_tok;
    printf("%-6s %-5s thr=%d [%6lld x %5lld] n_tok=%3d%s: %8.1f us  %6.2f GB/s %6.1f GFLOP/s"
           "  best %6.2f GB/s %6.1f GFLOP/s\n",
           cpu_isa_name(isa), ts_dtype_name(dt), nth, (long long)rows, (long long)cols, n_tok,
           hot ? " L2" : "", med * 1e6, (double)wbytes / med * 1e-9, flop / med * 1e-9,
           (double)wbytes / best * 1e-9, flop / best * 1e-9);
out:
    if (w != MAP_FAILED) munmap(w, total);
    free(x);
    free(y);
}

/* --bench [decode|hot|prefill|all [isa [dtype]]]; hot: decode of a matrix that stays in L2 */
static int bench(int argc, char **argv) {
    const char *only = argc > 2 && strcmp(argv[2], "all") ? argv[2] : "";
    const char *isa_only = argc > 3 ? argv[3] : "", *dt_only = argc > 4 ? argv[4] : "";
    static const ts_dtype dts[] = {TS_DTYPE_Q4_K, TS_DTYPE_Q4_0, TS_DTYPE_Q8_0, TS_DTYPE_Q6_K,
                                   TS_DTYPE_Q5_0};
    int nth = atoi(tu_env("TS_BENCH_THREADS", "2"));
    /* 1024 rows a thread: 576 KB of Q4_K, 840 KB of Q6_K a core, inside Zen 4's 1 MB L2 (Q8_0's
     * 1.1 MB partly not); shorter runs of the same kernels measured noisier */
    int64_t hot_rows = atoll(tu_env("TS_BENCH_HOT_ROWS", "0"));
    if (hot_rows <= 0) hot_rows = 1024 * nth;
    ts_pool *pool = NULL;
    if (ts_pool_create(nth, &pool) != TS_OK) return 1;
    printf("read bandwidth, %d threads: %.2f GB/s\n", nth,
           cpu_measure_read_bandwidth(pool, (size_t)1 << 30, 5));
    for (int i = CPU_ISA_COUNT - 1; i > CPU_ISA_SCALAR; i--) {
        if (!isa_ok(i) || (*isa_only && strcmp(isa_only, cpu_isa_name((cpu_isa)i)))) continue;
        for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
            ts_dtype dt = dts[d];
            if (*dt_only && strcmp(dt_only, ts_dtype_name(dt))) continue;
            if (!*only || !strcmp(only, "decode")) {
                bench_one(pool, nth, (cpu_isa)i, dt, 6144, 1024, 1, 0.5, 0);
                bench_one(pool, nth, (cpu_isa)i, dt, 1024, 6144, 1, 0.5, 0);
                bench_one(pool, nth, (cpu_isa)i, dt, 248320, 1024, 1, 1.0, 0);
                /* a few tokens: speculative decoding's guesses, or a few requests at once */
                for (int t = 2; t <= 8; t++)
                    bench_one(pool, nth, (cpu_isa)i, dt, 248320, 1024, t, 1.0, 0);
                if (ts_dtype_block_elems(dt) == 32) /* Gemma 3 270M's output head */
                    bench_one(pool, nth, (cpu_isa)i, dt, 262144, 640, 1, 1.0, 0);
            }
            if (!*only || !strcmp(only, "hot")) {
                bench_one(pool, nth, (cpu_isa)i, dt, hot_rows, 1024, 1, 0.5, 1);
                bench_one(pool, nth, (cpu_isa)i, dt, hot_rows, 1024, 2, 0.5, 1);
            }
            if (!*only || !strcmp(only, "prefill")) {
                bench_one(pool, nth, (cpu_isa)i, dt, 1024, 1024, 512, 1.0, 0);
                bench_one(pool, nth, (cpu_isa)i, dt, 3584, 1024, 512, 1.0, 0);
                /* Gemma 3 270M's 640-wide projections: two 256-element chunks and a tail of
                 * four 32-element blocks (the types whose blocks are 32 wide) */
                if (ts_dtype_block_elems(dt) == 32)
                    bench_one(pool, nth, (cpu_isa)i, dt, 2048, 640, 512, 1.0, 0);
            }
        }
    }
    ts_pool_free(pool);
    return 0;
}

/* The backend's cache of regrouped weights (weight_cache.h): a weight is regrouped once and then
 * found again (also after the table grows), with the bits of a call that regroups for itself; a
 * different tensor later at the same address is regrouped anew, not served stale; types the
 * kernels read as they are stored take no copy. */
static void test_weight_cache(void) {
    enum { ROWS = 64, COLS = 512, MANY = 100 };
    const cpu_isa isa = cpu_isa_best();
    if (!isa_ok(isa)) return;
    unsigned long long s = 0xcac4eull;
    cpu_wcache *wc = cpu_wcache_new();
    CHECK(wc != NULL);
    if (!wc) return;
    float *x = malloc(sizeof(float) * COLS), *tmp = malloc(sizeof(float) * COLS);
    float *y0 = malloc(sizeof(float) * ROWS), *y1 = malloc(sizeof(float) * ROWS);
    for (int i = 0; i < COLS; i++)
        x[i] = gauss(&s);
    static const ts_dtype types[] = {TS_DTYPE_Q4_K, TS_DTYPE_Q6_K, TS_DTYPE_Q8_0};
    uint8_t *w[3][MANY];
    long want = 0;
    size_t held = 0;
    for (int d = 0; d < 3; d++) {
        const ts_dtype dt = types[d];
        const size_t rb = ts_dtype_row_bytes(dt, COLS), bytes = rb * ROWS;
        const bool regrouped = TABLES[isa][dt].repack != NULL;
        for (int m = 0; m < MANY; m++) {
            w[d][m] = aligned_alloc(64, (bytes + 63) / 64 * 64);
            for (int o = 0; o < ROWS; o++) {
                for (int i = 0; i < COLS; i++)
                    tmp[i] = gauss(&s) * 0.05f;
                CHECK(ts_quantize_row(dt, tmp, w[d][m] + (size_t)o * rb, COLS) == TS_OK);
            }
        }
        /* each weight twice: regrouped the first time only, the same bits as without a cache */
        for (int pass = 0; pass < 2; pass++)
            for (int m = 0; m < MANY; m++) {
                ts_tensor W = {.dtype = dt,
                               .n_dims = 2,
                               .shape = {ROWS, COLS, 1, 1},
                               .data = w[d][m],
                               .nbytes = bytes};
                cpu_matmul(NULL, NULL, isa, &W, x, COLS, 1, y0, ROWS);
                cpu_matmul(NULL, wc, isa, &W, x, COLS, 1, y1, ROWS);
                CHECKF(!memcmp(y0, y1, sizeof(float) * ROWS), "%s weight %d, pass %d: cached bits",
                       ts_dtype_name(dt), m, pass);
                if (regrouped && pass == 0) want++, held += bytes;
            }
        CHECKF(cpu_wcache_repacks(wc) == want && cpu_wcache_bytes(wc) == held,
               "%s: %ld copies of %zu bytes, want %ld of %zu", ts_dtype_name(dt),
               cpu_wcache_repacks(wc), cpu_wcache_bytes(wc), want, held);
        /* new values at the address of weight 0: regrouped again, the new values' result */
        for (int o = 0; o < ROWS; o++) {
            for (int i = 0; i < COLS; i++)
                tmp[i] = gauss(&s) * 0.05f;
            CHECK(ts_quantize_row(dt, tmp, w[d][0] + (size_t)o * rb, COLS) == TS_OK);
        }
        ts_tensor W = {.dtype = dt,
                       .n_dims = 2,
                       .shape = {ROWS, COLS, 1, 1},
                       .data = w[d][0],
                       .nbytes = bytes};
        cpu_matmul(NULL, NULL, isa, &W, x, COLS, 1, y0, ROWS);
        cpu_matmul(NULL, wc, isa, &W, x, COLS, 1, y1, ROWS);
        CHECKF(!memcmp(y0, y1, sizeof(float) * ROWS), "%s: a new tensor at a cached address",
               ts_dtype_name(dt));
        if (regrouped) want++;
        CHECKF(cpu_wcache_repacks(wc) == want, "%s: %ld copies after new values, want %ld",
               ts_dtype_name(dt), cpu_wcache_repacks(wc), want);
        for (int m = 0; m < MANY; m++)
            free(w[d][m]);
    }
    /* on a machine whose kernels regroup (AVX-512 VNNI), the K-quants did */
    if (isa == CPU_ISA_AVX512) CHECK(want == 2 * (MANY + 1));
    cpu_wcache_free(wc);
    /* a cache that may hold nothing (TESSERA_CPU_REGROUP=0): no copy, and the product of the
     * next kernel set down that reads the file's layout, bit for bit */
    if (isa == CPU_ISA_AVX512 && isa_ok(CPU_ISA_AVX2)) {
        cpu_wcache *none = cpu_wcache_new();
        CHECK(none != NULL);
        if (none) {
            cpu_wcache_set_limit(none, 0);
            const size_t rb = ts_dtype_row_bytes(TS_DTYPE_Q4_K, COLS);
            uint8_t *w0 = aligned_alloc(64, rb * ROWS);
            for (int o = 0; o < ROWS; o++) {
                for (int i = 0; i < COLS; i++)
                    tmp[i] = gauss(&s) * 0.05f;
                CHECK(ts_quantize_row(TS_DTYPE_Q4_K, tmp, w0 + (size_t)o * rb, COLS) == TS_OK);
            }
            ts_tensor W = {.dtype = TS_DTYPE_Q4_K,
                           .n_dims = 2,
                           .shape = {ROWS, COLS, 1, 1},
                           .data = w0,
                           .nbytes = rb * ROWS};
            cpu_matmul(NULL, NULL, CPU_ISA_AVX2, &W, x, COLS, 1, y0, ROWS);
            cpu_matmul(NULL, none, isa, &W, x, COLS, 1, y1, ROWS);
            CHECK(!memcmp(y0, y1, sizeof(float) * ROWS) && cpu_wcache_repacks(none) == 0 &&
                  cpu_wcache_bytes(none) == 0);
            free(w0);
            cpu_wcache_free(none);
        }
    }
    free(x), free(tmp), free(y0), free(y1);
}

/* A weight of a model file that the cache regrouped gives its file's pages back
 * (ts_mmap_release): resident memory grows by much less than the copy (without that, by the
 * whole copy), while the source still reads the file's bytes and the product keeps its bits. */
static void test_weight_cache_release(void) {
    enum { COLS = 4096, ROWS = 7296, DISTINCT = 64 }; /* ~16 MB of Q4_K: a mapped file */
    const cpu_isa isa = cpu_isa_best();
    if (!isa_ok(isa)) return;
    const ts_dtype dt = TS_DTYPE_Q4_K;
    const size_t rb = ts_dtype_row_bytes(dt, COLS), bytes = rb * ROWS;
    unsigned long long s = 0x6e1ea5eull;
    uint8_t *ref = malloc(bytes);
    float *x = malloc(sizeof(float) * COLS), *y0 = malloc(sizeof(float) * ROWS),
          *y1 = malloc(sizeof(float) * ROWS);
    char path[128];
    snprintf(path, sizeof path, "%s/ts_wcache_%d.bin", tu_env("TMPDIR", "/tmp"), (int)getpid());
    FILE *f = fopen(path, "wb");
    CHECK(ref && x && y0 && y1 && f);
    if (!ref || !x || !y0 || !y1 || !f) goto out;
    for (int i = 0; i < COLS; i++)
        x[i] = gauss(&s);
    for (int o = 0; o < DISTINCT; o++) { /* then repeated: quantizing 7296 rows takes long */
        float row[COLS];
        for (int i = 0; i < COLS; i++)
            row[i] = gauss(&s) * 0.05f;
        CHECK(ts_quantize_row(dt, row, ref + (size_t)o * rb, COLS) == TS_OK);
    }
    for (int o = DISTINCT; o < ROWS; o++)
        memcpy(ref + (size_t)o * rb, ref + (size_t)(o % DISTINCT) * rb, rb);
    CHECK(fwrite(ref, 1, bytes, f) == bytes);
    fclose(f);
    f = NULL;
    ts_mmap m;
    CHECK(ts_mmap_open(path, &m) == TS_OK);
    unlink(path); /* the open file stays readable */
    if (!m.data) goto out;
    for (size_t i = 0; i < m.size; i += 4096)
        (void)((const volatile uint8_t *)m.data)[i]; /* resident, as a loaded model's weights */
    ts_tensor W = {
        .dtype = dt, .n_dims = 2, .shape = {ROWS, COLS, 1, 1}, .data = m.data, .nbytes = bytes};
    ts_tensor R = W;
    R.data = ref;
    cpu_wcache *wc = cpu_wcache_new();
    const size_t before = ts_rss_bytes();
    cpu_matmul(NULL, wc, isa, &W, x, COLS, 1, y1, ROWS);
    const size_t after = ts_rss_bytes();
    cpu_matmul(NULL, NULL, isa, &R, x, COLS, 1, y0, ROWS);
    CHECK(!memcmp(y0, y1, sizeof(float) * ROWS));
    if (TABLES[isa][dt].repack) {
        CHECK(cpu_wcache_bytes(wc) == bytes);
        CHECKF(after < before + bytes / 2, "resident %zu -> %zu bytes with a %zu-byte copy", before,
               after, bytes);
    }
    CHECK(!memcmp(m.data, ref, bytes)); /* read back from the file */
    cpu_matmul(NULL, wc, isa, &W, x, COLS, 1, y1, ROWS);
    CHECK(!memcmp(y0, y1, sizeof(float) * ROWS) && cpu_wcache_repacks(wc) <= 1);
    cpu_wcache_free(wc);
    ts_mmap_close(&m);
out:
    if (f) fclose(f), unlink(path);
    free(ref), free(x), free(y0), free(y1);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench(argc, argv);
    test_errors();
    test_dequant_q8_0_q4_0_q5_0();
    test_dequant_q4_K();
    test_dequant_q6_K();
    test_roundtrip();
    test_act_quantizer();
    test_act_interleave();
    test_kernels();
    test_batch_invariance();
    test_split_invariance();
    test_shared_activations();
    test_weight_cache();
    test_weight_cache_release();
    return tu_report("test_quant");
}
