/* AVX2 + FMA + F16C matmul kernels (F32, F16, BF16 weights; fp32 activations and accumulation).
 *
 * Same plan as matmul_avx512.c with 8-wide vectors and the 16 ymm registers in mind:
 * - decode (up to DEC_MAX_TOK tokens): stream 8 (one token) or 4 rows of W at once, convert in
 *   registers, use each converted vector for up to DEC_TOK tokens, one pass over the row block
 *   per token pair;
 * - prefill: convert + transpose a PF_ROWS x PF_KC panel of W into fp32 stack scratch, then a
 *   16 rows x 6 tokens micro-kernel (12 accumulators) reuses it for every token.
 * Column tails (cols not a multiple of 8) go through a small zero-padded copy, since AVX2 has
 * no masked 16-bit loads. */
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_int.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

#define DEC_ROWS_MAX 8 /* rows streamed together by the decode kernel (4 or 8) */
#define DEC_TOK 2      /* tokens per pass over a decode row block */
/* Up to DEC_MAX_TOK tokens the streaming kernel beats packing (measured with cold weights);
 * past it converting every W vector again for each token pair costs more. */
#define DEC_MAX_TOK 8
#define PF_ROWS 16    /* rows per packed panel: two ymm of output rows */
#define PF_TOK 6      /* tokens per micro-tile: 2 x 6 accumulators */
#define PF_KC 256     /* columns per packed panel: 16 KiB of fp32 scratch */
#define PF_PANELS 4   /* panels packed together: 64 KiB of stack */

static inline size_t elem_bytes(ts_dtype dt) { return dt == TS_DTYPE_F32 ? 4 : 2; }

/* 8 elements of a row starting at element i, as fp32. */
INLINE __m256 ld8(ts_dtype dt, const uint8_t *row, int64_t i) {
    switch (dt) {
    case TS_DTYPE_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case TS_DTYPE_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * i)));
    default: return _mm256_loadu_ps((const float *)(row + 4 * i));
    }
}

/* The n < 8 elements from element i, zero-padded. */
INLINE __m256 ld8_tail(ts_dtype dt, const uint8_t *row, int64_t i, int64_t n) {
    uint8_t buf[32] = {0};
    memcpy(buf, row + (size_t)i * elem_bytes(dt), (size_t)n * elem_bytes(dt));
    return ld8(dt, buf, 0);
}

INLINE __m256 ldx_tail(const float *x, int64_t n) {
    float buf[8] = {0};
    memcpy(buf, x, (size_t)n * sizeof(float));
    return _mm256_loadu_ps(buf);
}

/* [sum a, sum b, sum c, sum d] */
INLINE __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_hadd_ps(a, b); /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    __m256 cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* ---- decode ---------------------------------------------------------------------------- */

/* Rows [r, r + nr) (nr <= R) for T tokens of x / y; pf: prefetch the next block (the first pass
 * over this one). Missing rows re-read row r and their sums are dropped. As in the AVX-512
 * kernel, the next row block is prefetched into L2, one prefetch per 64-byte line (the
 * hardware prefetchers alone leave interleaved rows far below memory speed). */
INLINE void dec_block(ts_dtype dt, const cpu_mm_job *j, int64_t r, int nr, const float *x,
                      float *y, int R, int T, int pf) {
    const size_t rb = j->row_bytes, esz = elem_bytes(dt);
    const int U = 64 / (8 * (int)esz); /* 8-column vectors per 64-byte line */
    const uint8_t *w[DEC_ROWS_MAX];
    for (int q = 0; q < R; q++) w[q] = j->w + (size_t)(r + (q < nr ? q : 0)) * rb;
    const int64_t n = j->cols, ldx = j->ldx;
    __m256 a[DEC_ROWS_MAX][DEC_TOK];
TS_UNROLL(8)
    for (int q = 0; q < R; q++)
TS_UNROLL(2)
        for (int t = 0; t < T; t++) a[q][t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 * U <= n; i += 8 * U) {
        if (pf) {
TS_UNROLL(8)
            for (int q = 0; q < R; q++)
                _mm_prefetch((const char *)w[q] + R * rb + (size_t)i * esz, _MM_HINT_T1);
        }
TS_UNROLL(4)
        for (int u = 0; u < U; u++) {
TS_UNROLL(8)
            for (int q = 0; q < R; q++) {
                __m256 v = ld8(dt, w[q], i + 8 * u);
TS_UNROLL(2)
                for (int t = 0; t < T; t++)
                    a[q][t] = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + t * ldx + i + 8 * u), a[q][t]);
            }
        }
    }
    for (; i < n; i += 8) { /* whole vectors of a last partial line, then a partial vector */
        int64_t m = n - i >= 8 ? 8 : n - i;
TS_UNROLL(8)
        for (int q = 0; q < R; q++) {
            __m256 v = ld8_tail(dt, w[q], i, m);
TS_UNROLL(2)
            for (int t = 0; t < T; t++)
                a[q][t] = _mm256_fmadd_ps(v, ldx_tail(x + t * ldx + i, m), a[q][t]);
        }
    }
TS_UNROLL(2)
    for (int t = 0; t < T; t++) {
TS_UNROLL(2)
        for (int q = 0; q < R && q < nr; q += 4) {
            float s[4];
            _mm_storeu_ps(s, hsum4(a[q][t], a[q + 1][t], a[q + 2][t], a[q + 3][t]));
            int left = nr - q < 4 ? nr - q : 4;
            memcpy(y + t * j->ldy + r + q, s, (size_t)left * sizeof(float));
        }
    }
}

/* One row of dec_one when the rows go one after another (cpu_seq_rows; see the AVX-512 file):
 * the same operations on its accumulator as dec_one's loops over the rows. */
INLINE __m256 dec_row(ts_dtype dt, const uint8_t *w, const uint8_t *pf, const float *x, int64_t n,
                      size_t esz) {
    __m256 a = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if ((((size_t)i * esz) & 63) == 0)
            _mm_prefetch((const char *)pf + (size_t)i * esz, _MM_HINT_T1);
        a = _mm256_fmadd_ps(ld8(dt, w, i), _mm256_loadu_ps(x + i), a);
        a = _mm256_fmadd_ps(ld8(dt, w, i + 8), _mm256_loadu_ps(x + i + 8), a);
    }
    for (; i + 8 <= n; i += 8)
        a = _mm256_fmadd_ps(ld8(dt, w, i), _mm256_loadu_ps(x + i), a);
    if (i < n) a = _mm256_fmadd_ps(ld8_tail(dt, w, i, n - i), ldx_tail(x + i, n - i), a);
    return a;
}

/* The one-token case of dec_block with the loop over the rows kept rolled on purpose (see
 * dec_one in matmul_avx512.c: measured much closer to memory speed than unrolled). */
INLINE void dec_one(ts_dtype dt, const cpu_mm_job *j, int64_t r, int nr, const float *x,
                    float *y) {
    const size_t rb = j->row_bytes, esz = elem_bytes(dt);
    const uint8_t *w[DEC_ROWS_MAX];
    __m256 a[DEC_ROWS_MAX];
    for (int q = 0; q < DEC_ROWS_MAX; q++) {
        w[q] = j->w + (size_t)(r + (q < nr ? q : 0)) * rb;
        a[q] = _mm256_setzero_ps();
    }
    const int64_t n = j->cols;
    int64_t i = 0;
    if (cpu_seq_rows(CPU_SEQ_FLOAT_AVX2)) {
        for (int q = 0; q < DEC_ROWS_MAX; q++)
            a[q] = q < nr ? dec_row(dt, w[q], w[q] + DEC_ROWS_MAX * rb, x, n, esz) : a[q];
        i = n; /* the loops below have nothing left */
    }
    for (; i + 16 <= n; i += 16) { /* 16 columns a step, as the AVX-512 kernel */
        if ((((size_t)i * esz) & 63) == 0) { /* once per 64 bytes of each row */
TS_UNROLL(1)
            for (int q = 0; q < DEC_ROWS_MAX; q++)
                _mm_prefetch((const char *)w[q] + DEC_ROWS_MAX * rb + (size_t)i * esz,
                             _MM_HINT_T1);
        }
        __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
TS_UNROLL(1)
        for (int q = 0; q < DEC_ROWS_MAX; q++) {
            a[q] = _mm256_fmadd_ps(ld8(dt, w[q], i), x0, a[q]);
            a[q] = _mm256_fmadd_ps(ld8(dt, w[q], i + 8), x1, a[q]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
TS_UNROLL(1)
        for (int q = 0; q < DEC_ROWS_MAX; q++) a[q] = _mm256_fmadd_ps(ld8(dt, w[q], i), xv, a[q]);
    }
    if (i < n) {
        __m256 xv = ldx_tail(x + i, n - i);
TS_UNROLL(1)
        for (int q = 0; q < DEC_ROWS_MAX; q++)
            a[q] = _mm256_fmadd_ps(ld8_tail(dt, w[q], i, n - i), xv, a[q]);
    }
    for (int q = 0; q < nr; q += 4) {
        float s[4];
        _mm_storeu_ps(s, hsum4(a[q], a[q + 1], a[q + 2], a[q + 3]));
        int left = nr - q < 4 ? nr - q : 4;
        memcpy(y + r + q, s, (size_t)left * sizeof(float));
    }
}

/* One token: 8 rows at a time (more streams in flight); more tokens: 4 rows x 2 tokens per pass,
 * the 16-register file's limit. */
INLINE void decode(ts_dtype dt, const cpu_mm_job *j, int64_t r0, int64_t r1) {
    const int R = j->n_tok == 1 ? DEC_ROWS_MAX : 4;
    for (int64_t r = r0; r < r1; r += R) {
        int nr = r1 - r < R ? (int)(r1 - r) : R;
        if (R == DEC_ROWS_MAX) {
            dec_one(dt, j, r, nr, j->x, j->y);
            continue;
        }
        for (int t = 0; t < j->n_tok; t += DEC_TOK) {
            const float *x = j->x + t * j->ldx;
            float *y = j->y + t * j->ldy;
            if (j->n_tok - t == 1)
                dec_block(dt, j, r, nr, x, y, 4, 1, t == 0);
            else
                dec_block(dt, j, r, nr, x, y, 4, 2, t == 0);
        }
    }
}

/* ---- prefill --------------------------------------------------------------------------- */

/* In-register transpose: afterwards v[c] holds column c of the 8 x 8 block whose rows were
 * v[0..7]. */
INLINE void transpose8(__m256 v[8]) {
    __m256 t[8], u[8];
TS_UNROLL(4)
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    /* u[4g + c], lane L: rows 4g..4g+3 of column 4L + c */
TS_UNROLL(2)
    for (int g = 0; g < 2; g++) {
        u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
        u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
    }
TS_UNROLL(4)
    for (int c = 0; c < 4; c++) {
        v[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        v[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}

/* wp[k * PF_ROWS + q] = W[r + q, k0 + k] as fp32 for k < kc; rows q >= nr are zero.
 * next points at W[r', k0'] of the panel packed after this one: it is prefetched into L2 here,
 * since interleaved rows defeat the hardware prefetchers as in decode. */
INLINE void pack_panel(ts_dtype dt, const cpu_mm_job *j, int64_t r, int nr, int64_t k0, int kc,
                       const uint8_t *next, float *wp) {
    const size_t rb = j->row_bytes, esz = elem_bytes(dt);
    for (int g = 0; g < PF_ROWS; g += 8) {
        for (int k = 0; k < kc; k += 8) {
            int kn = kc - k < 8 ? kc - k : 8;
            __m256 v[8];
TS_UNROLL(8)
            for (int q = 0; q < 8; q++) {
                /* 8 columns are at most 32 bytes: every other call lands on a new line */
                _mm_prefetch((const char *)next + (size_t)(g + q) * rb + (size_t)k * esz,
                             _MM_HINT_T1);
                v[q] = _mm256_setzero_ps();
                if (g + q >= nr) continue;
                const uint8_t *row = j->w + (size_t)(r + g + q) * rb;
                v[q] = kn == 8 ? ld8(dt, row, k0 + k) : ld8_tail(dt, row, k0 + k, kn);
            }
            transpose8(v);
            for (int c = 0; c < kn; c++) _mm256_store_ps(wp + (k + c) * PF_ROWS + g, v[c]);
        }
    }
}

/* y[t][0..nr) (+)= packed panel . x[t] for t < T; add says whether an earlier panel of the
 * same rows already stored its partial sums. */
INLINE void pf_tile(const float *wp, int kc, const float *x, int64_t ldx, float *y, int64_t ldy,
                    int nr, int add, int T) {
    __m256 c0[PF_TOK], c1[PF_TOK];
TS_UNROLL(6)
    for (int t = 0; t < T; t++) c0[t] = c1[t] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m256 w0 = _mm256_load_ps(wp + k * PF_ROWS);
        __m256 w1 = _mm256_load_ps(wp + k * PF_ROWS + 8);
TS_UNROLL(6)
        for (int t = 0; t < T; t++) {
            __m256 b = _mm256_broadcast_ss(x + t * ldx + k);
            c0[t] = _mm256_fmadd_ps(w0, b, c0[t]);
            c1[t] = _mm256_fmadd_ps(w1, b, c1[t]);
        }
    }
TS_UNROLL(6)
    for (int t = 0; t < T; t++) {
        float *yt = y + t * ldy;
        if (nr == PF_ROWS) {
            if (add) {
                c0[t] = _mm256_add_ps(c0[t], _mm256_loadu_ps(yt));
                c1[t] = _mm256_add_ps(c1[t], _mm256_loadu_ps(yt + 8));
            }
            _mm256_storeu_ps(yt, c0[t]);
            _mm256_storeu_ps(yt + 8, c1[t]);
        } else {
            float s[PF_ROWS];
            _mm256_storeu_ps(s, c0[t]);
            _mm256_storeu_ps(s + 8, c1[t]);
            for (int q = 0; q < nr; q++) yt[q] = add ? yt[q] + s[q] : s[q];
        }
    }
}

#define MMF_TABLE cpu_mm_avx2_kernels
#define MMF_ALIGN 32
#include "backend/cpu/matmul_float_simd.h"

uint64_t cpu_read_sum_avx2(const void *p, size_t bytes) {
    const __m256i *v = p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < bytes / 32; i += 4) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + i));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + i + 1));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + i + 2));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + i + 3));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t s[4];
    _mm256_storeu_si256((__m256i *)s, a0);
    return s[0] + s[1] + s[2] + s[3];
}
