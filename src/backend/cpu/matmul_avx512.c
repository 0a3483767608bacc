/* AVX-512 matmul kernels (F32, F16, BF16 weights; fp32 activations and accumulation).
 *
 * Two shapes of work, chosen by the number of tokens:
 * - decode (up to DEC_MAX_TOK tokens): W is streamed once from memory, 8 or 4 rows at a time,
 *   each 16-wide slice converted to fp32 in registers (BF16: zero-extend + shift; F16:
 *   vcvtph2ps) and used for up to DEC_TOK tokens; more tokens take more passes over the row
 *   block, which by then sits in L1/L2. Bound by memory bandwidth at one token, by the FMAs
 *   at 4 and more.
 * - prefill (more tokens): panels of PF_ROWS rows x PF_KC columns of W are converted once into
 *   fp32 scratch on the stack, transposed so that one vector holds 16 output rows, and a
 *   register-blocked micro-kernel (64 rows x 6 tokens, 24 accumulators) runs them against every
 *   token. Each converted weight is reused n_tok times, so the FMA units set the pace. */
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_int.h"

#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

#define DEC_ROWS_MAX 8 /* rows streamed together by the decode kernel (4 or 8) */
#define DEC_TOK 4      /* tokens per pass over a decode row block */
/* Up to DEC_MAX_TOK tokens the streaming kernel beats packing (measured with cold weights:
 * ~100 GFLOP/s at 8-16 tokens, packing 40-70); past it x no longer fits in L1/L2. */
#define DEC_MAX_TOK 16

/* The prefill micro-kernel: PF_RV vectors of 16 output rows x PF_TOK tokens, 24 accumulators.
 * 4 x 6 needs 4 weight loads and 6 broadcasts per 24 FMAs; measured on Zen 4 it reaches 110 of
 * the 116 GFLOP/s FMA peak of a core, against 101 for 2 x 12 (12 broadcasts). */
#define PF_RV 4
#define PF_TOK 6
#define PF_ROWS (16 * PF_RV) /* rows per packed panel */
#define PF_KC 256     /* columns per packed panel: 64 KiB of fp32 scratch */
#define PF_PANELS 2   /* panels packed together, sharing each x tile: 128 KiB of stack */

/* 16 elements of a row starting at element i, as fp32. */
INLINE __m512 ld16(ts_dtype dt, const uint8_t *row, int64_t i) {
    switch (dt) {
    case TS_DTYPE_BF16: {
        __m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case TS_DTYPE_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * i)));
    default: return _mm512_loadu_ps((const float *)(row + 4 * i));
    }
}

/* Same, for the lanes in m only (others are 0); masked-off lanes are never read. */
INLINE __m512 ld16m(ts_dtype dt, const uint8_t *row, int64_t i, __mmask16 m) {
    switch (dt) {
    case TS_DTYPE_BF16: {
        __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * i);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case TS_DTYPE_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * i));
    default: return _mm512_maskz_loadu_ps(m, row + 4 * i);
    }
}

static inline __mmask16 tail_mask(int64_t n) { return (__mmask16)((1u << n) - 1u); }

/* [sum a, sum b, sum c, sum d] */
INLINE __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    __m256 ab = _mm256_hadd_ps(a8, b8); /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    __m256 cd = _mm256_hadd_ps(c8, d8);
    __m256 abcd = _mm256_hadd_ps(ab, cd); /* a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7 */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* ---- decode ---------------------------------------------------------------------------- */

/* Rows [r, r + nr) (nr <= R) for T tokens of x / y; pf: prefetch the next block (the first pass
 * over this one). Missing rows re-read row r and their sums are dropped, which keeps the loop
 * free of row conditions.
 *
 * The next R-row block is prefetched into L2 while this one is read, one prefetch per 64-byte
 * line: the hardware prefetchers lose track of R interleaved short streams and stall on every
 * new block otherwise. Measured on one Zen 4 core, BF16 [6144 x 1024], cold: 10-12 GB/s
 * without, 21-26 with, against 31-32 for a plain sequential read (one token: dec_one). */
INLINE void dec_block(ts_dtype dt, const cpu_mm_job *j, int64_t r, int nr, const float *x,
                      float *y, int R, int T, int pf) {
    const size_t rb = j->row_bytes, esz = dt == TS_DTYPE_F32 ? 4 : 2;
    const int U = 64 / (16 * (int)esz); /* 16-column vectors per 64-byte line */
    const uint8_t *w[DEC_ROWS_MAX];
    for (int q = 0; q < R; q++) w[q] = j->w + (size_t)(r + (q < nr ? q : 0)) * rb;
    const int64_t n = j->cols, ldx = j->ldx;
    __m512 a[DEC_ROWS_MAX][DEC_TOK];
TS_UNROLL(8)
    for (int q = 0; q < R; q++)
TS_UNROLL(4)
        for (int t = 0; t < T; t++) a[q][t] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 * U <= n; i += 16 * U) {
        if (pf) {
TS_UNROLL(8)
            for (int q = 0; q < R; q++)
                _mm_prefetch((const char *)w[q] + R * rb + (size_t)i * esz, _MM_HINT_T1);
        }
TS_UNROLL(2)
        for (int u = 0; u < U; u++) {
            __m512 v[DEC_ROWS_MAX];
TS_UNROLL(8)
            for (int q = 0; q < R; q++) v[q] = ld16(dt, w[q], i + 16 * u);
TS_UNROLL(4)
            for (int t = 0; t < T; t++) {
                __m512 xv = _mm512_loadu_ps(x + t * ldx + i + 16 * u);
TS_UNROLL(8)
                for (int q = 0; q < R; q++) a[q][t] = _mm512_fmadd_ps(v[q], xv, a[q][t]);
            }
        }
    }
    for (; i < n; i += 16) { /* whole vectors of a last partial line, then a partial vector */
        __mmask16 m = n - i >= 16 ? 0xffff : tail_mask(n - i);
        __m512 v[DEC_ROWS_MAX];
TS_UNROLL(8)
        for (int q = 0; q < R; q++) v[q] = ld16m(dt, w[q], i, m);
TS_UNROLL(4)
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + t * ldx + i);
TS_UNROLL(8)
            for (int q = 0; q < R; q++) a[q][t] = _mm512_fmadd_ps(v[q], xv, a[q][t]);
        }
    }
TS_UNROLL(4)
    for (int t = 0; t < T; t++) {
TS_UNROLL(2)
        for (int q = 0; q < R && q < nr; q += 4) {
            __m128 s = hsum4(a[q][t], a[q + 1][t], a[q + 2][t], a[q + 3][t]);
            int left = nr - q < 4 ? nr - q : 4;
            _mm_mask_storeu_ps(y + t * j->ldy + r + q, (__mmask8)((1u << left) - 1u), s);
        }
    }
}

/* One row of dec_one when the rows go one after another (cpu_seq_rows): the same operations on
 * its accumulator as dec_one's loop over the rows, with its row of the next row block (pf)
 * prefetched on the way. On the Intel Xeon VM the row block's rows side by side read 14 GB/s a
 * core and in memory order 16: 0.8B BF16 decode 15.5 -> 19.5 t/s (bench/RESULTS.md). */
INLINE __m512 dec_row(ts_dtype dt, const uint8_t *w, const uint8_t *pf, const float *x, int64_t n,
                      size_t esz) {
    __m512 a = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if ((((size_t)i * esz) & 63) == 0)
            _mm_prefetch((const char *)pf + (size_t)i * esz, _MM_HINT_T1);
        a = _mm512_fmadd_ps(ld16(dt, w, i), _mm512_loadu_ps(x + i), a);
    }
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        a = _mm512_fmadd_ps(ld16m(dt, w, i, m), _mm512_maskz_loadu_ps(m, x + i), a);
    }
    return a;
}

/* The one-token case of dec_block, which decode spends most of its time in. The loop over the
 * rows is kept rolled on purpose, accumulators in memory: measured on Zen 4 (BF16 [6144 x 1024],
 * one core, cold weights) this streams at 29-30 GB/s against 21-22 for the same loop unrolled
 * with the accumulators in registers, and 31-32 for a plain read. (A likely cause: unrolled,
 * each row gets its own load instruction with a constant stride, and the per-instruction
 * hardware prefetchers then compete with the software prefetches for miss buffers.) */
INLINE void dec_one(ts_dtype dt, const cpu_mm_job *j, int64_t r, int nr, const float *x,
                    float *y) {
    const size_t rb = j->row_bytes, esz = dt == TS_DTYPE_F32 ? 4 : 2;
    const uint8_t *w[DEC_ROWS_MAX];
    __m512 a[DEC_ROWS_MAX];
    for (int q = 0; q < DEC_ROWS_MAX; q++) {
        w[q] = j->w + (size_t)(r + (q < nr ? q : 0)) * rb;
        a[q] = _mm512_setzero_ps();
    }
    const int64_t n = j->cols;
    int64_t i = 0;
    if (cpu_seq_rows(CPU_SEQ_FLOAT_AVX512)) {
        for (int q = 0; q < DEC_ROWS_MAX; q++)
            a[q] = q < nr ? dec_row(dt, w[q], w[q] + DEC_ROWS_MAX * rb, x, n, esz) : a[q];
        i = n; /* the loops below have nothing left */
    }
    for (; i + 16 <= n; i += 16) {
        if ((((size_t)i * esz) & 63) == 0) { /* once per 64 bytes of each row */
TS_UNROLL(1)
            for (int q = 0; q < DEC_ROWS_MAX; q++)
                _mm_prefetch((const char *)w[q] + DEC_ROWS_MAX * rb + (size_t)i * esz,
                             _MM_HINT_T1);
        }
        __m512 xv = _mm512_loadu_ps(x + i);
TS_UNROLL(1)
        for (int q = 0; q < DEC_ROWS_MAX; q++) a[q] = _mm512_fmadd_ps(ld16(dt, w[q], i), xv, a[q]);
    }
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
TS_UNROLL(1)
        for (int q = 0; q < DEC_ROWS_MAX; q++)
            a[q] = _mm512_fmadd_ps(ld16m(dt, w[q], i, m), xv, a[q]);
    }
    for (int q = 0; q < nr; q += 4) {
        __m128 s = hsum4(a[q], a[q + 1], a[q + 2], a[q + 3]);
        int left = nr - q < 4 ? nr - q : 4;
        _mm_mask_storeu_ps(y + r + q, (__mmask8)((1u << left) - 1u), s);
    }
}

/* One or two tokens: 8 rows at a time (more streams in flight, see above); more tokens: 4 rows
 * x 4 tokens per pass, the register file's limit. */
INLINE void decode(ts_dtype dt, const cpu_mm_job *j, int64_t r0, int64_t r1) {
    const int R = j->n_tok <= 2 ? DEC_ROWS_MAX : 4;
    for (int64_t r = r0; r < r1; r += R) {
        int nr = r1 - r < R ? (int)(r1 - r) : R;
        for (int t = 0; t < j->n_tok; t += DEC_TOK) {
            const float *x = j->x + t * j->ldx;
            float *y = j->y + t * j->ldy;
            int pf = t == 0;
            if (R == DEC_ROWS_MAX) {
                if (j->n_tok == 1)
                    dec_one(dt, j, r, nr, x, y);
                else
                    dec_block(dt, j, r, nr, x, y, DEC_ROWS_MAX, 2, pf);
                continue;
            }
            switch (j->n_tok - t) {
            case 1: dec_block(dt, j, r, nr, x, y, 4, 1, pf); break;
            case 2: dec_block(dt, j, r, nr, x, y, 4, 2, pf); break;
            case 3: dec_block(dt, j, r, nr, x, y, 4, 3, pf); break;
            default: dec_block(dt, j, r, nr, x, y, 4, 4, pf); break;
            }
        }
    }
}

/* ---- prefill --------------------------------------------------------------------------- */

/* In-register transpose: afterwards v[c] holds column c of the 16 x 16 block whose rows were
 * v[0..15]. */
INLINE void transpose16(__m512 v[16]) {
    __m512 t[16], u[16];
TS_UNROLL(8)
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    /* u[4g + c], lane L: rows 4g..4g+3 of column 4L + c */
TS_UNROLL(4)
    for (int g = 0; g < 4; g++) {
        __m512d e0 = _mm512_castps_pd(t[4 * g]), e1 = _mm512_castps_pd(t[4 * g + 1]);
        __m512d e2 = _mm512_castps_pd(t[4 * g + 2]), e3 = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(e0, e2));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(e0, e2));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(e1, e3));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(e1, e3));
    }
TS_UNROLL(4)
    for (int c = 0; c < 4; c++) {
        __m512 lo01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
        __m512 hi01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xee);
        __m512 lo23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
        __m512 hi23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xee);
        v[c] = _mm512_shuffle_f32x4(lo01, lo23, 0x88);
        v[4 + c] = _mm512_shuffle_f32x4(lo01, lo23, 0xdd);
        v[8 + c] = _mm512_shuffle_f32x4(hi01, hi23, 0x88);
        v[12 + c] = _mm512_shuffle_f32x4(hi01, hi23, 0xdd);
    }
}

/* wp[k * PF_ROWS + q] = W[r + q, k0 + k] as fp32 for k < kc; rows q >= nr are zero.
 * next points at W[r', k0'] of the panel packed after this one: it is prefetched into L2 here,
 * since 16 interleaved rows defeat the hardware prefetchers as in decode. */
INLINE void pack_panel(ts_dtype dt, const cpu_mm_job *j, int64_t r, int nr, int64_t k0, int kc,
                       const uint8_t *next, float *wp) {
    const size_t rb = j->row_bytes, esz = dt == TS_DTYPE_F32 ? 4 : 2;
    for (int g = 0; g < PF_ROWS; g += 16) {
        for (int k = 0; k < kc; k += 16) {
            int kn = kc - k < 16 ? kc - k : 16;
            __mmask16 m = tail_mask(kn);
            __m512 v[16];
TS_UNROLL(16)
            for (int q = 0; q < 16; q++) {
                _mm_prefetch((const char *)next + (size_t)(g + q) * rb + (size_t)k * esz,
                             _MM_HINT_T1);
                v[q] = _mm512_setzero_ps();
                if (g + q < nr) v[q] = ld16m(dt, j->w + (size_t)(r + g + q) * rb, k0 + k, m);
            }
            transpose16(v);
            for (int c = 0; c < kn; c++) _mm512_store_ps(wp + (k + c) * PF_ROWS + g, v[c]);
        }
    }
}

/* y[t][0..nr) (+)= packed panel . x[t] for t < T; add says whether an earlier panel of the
 * same rows already stored its partial sums. */
INLINE void pf_tile(const float *wp, int kc, const float *x, int64_t ldx, float *y, int64_t ldy,
                    int nr, int add, int T) {
    __m512 c[PF_RV][PF_TOK];
TS_UNROLL(4)
    for (int v = 0; v < PF_RV; v++)
TS_UNROLL(12)
        for (int t = 0; t < T; t++) c[v][t] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m512 w[PF_RV];
TS_UNROLL(4)
        for (int v = 0; v < PF_RV; v++) w[v] = _mm512_load_ps(wp + k * PF_ROWS + 16 * v);
TS_UNROLL(12)
        for (int t = 0; t < T; t++) {
            __m512 b = _mm512_set1_ps(x[t * ldx + k]);
TS_UNROLL(4)
            for (int v = 0; v < PF_RV; v++) c[v][t] = _mm512_fmadd_ps(w[v], b, c[v][t]);
        }
    }
    __mmask16 m[PF_RV];
TS_UNROLL(4)
    for (int v = 0; v < PF_RV; v++)
        m[v] = nr >= 16 * (v + 1) ? 0xffff : nr > 16 * v ? tail_mask(nr - 16 * v) : 0;
TS_UNROLL(12)
    for (int t = 0; t < T; t++) {
        float *yt = y + t * ldy;
TS_UNROLL(4)
        for (int v = 0; v < PF_RV; v++) {
            if (add) c[v][t] = _mm512_add_ps(c[v][t], _mm512_maskz_loadu_ps(m[v], yt + 16 * v));
            _mm512_mask_storeu_ps(yt + 16 * v, m[v], c[v][t]);
        }
    }
}

#define MMF_TABLE cpu_mm_avx512_kernels
#define MMF_ALIGN 64
#include "backend/cpu/matmul_float_simd.h"

uint64_t cpu_read_sum_avx512(const void *p, size_t bytes) {
    const __m512i *v = p;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < bytes / 64; i += 4) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(v + i));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(v + i + 1));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(v + i + 2));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(v + i + 3));
    }
    a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
    return (uint64_t)_mm512_reduce_add_epi64(a0);
}
