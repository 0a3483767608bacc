/* AVX2 kernels for the quantized weight types: the shared body (matmul_q_simd.h) with the
 * maddubs + madd dot product (no saturation: codes < 64 or |q8| <= 128 against |a| <= 127)
 * and a 2 x 4 register tile, within the 16 vector registers. */
#include "backend/cpu/matmul_q.h"

#include <assert.h>
#include <immintrin.h>
#include <stdint.h>

static inline __attribute__((always_inline)) __m256i mmq_dot_avx2(__m256i u, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
}

/* byte i = 0x10 where bit i of qh is set */
static inline __attribute__((always_inline)) __m256i mmq_q5_high_avx2(uint32_t qh) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                            2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* cpu_q8act_quantize with the same fp32 operations per element: |x|, the block maximum (order
 * free), d = amax / 127, one reciprocal, x * (1/d) rounded to nearest even by cvtps2dq (the
 * default rounding mode), then exact integer sums; so the bytes equal the scalar ones. */
void cpu_q8act_quantize_avx2(const float *x, int64_t n, void *buf) {
    cpu_q8act a = cpu_q8act_view(buf, n);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 v[4], m;
        for (int k = 0; k < 4; k++)
            v[k] = _mm256_loadu_ps(xb + 8 * k);
        m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], _mm256_set1_ps(id)));
        /* packs work per 128-bit lane: the dword permute puts the 8 bytes groups back in order */
        __m256i bytes =
            _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(a.q + 32 * b), _mm256_permutevar8x32_epi32(bytes, order));
        __m256i h0 = _mm256_add_epi32(q[0], q[1]), h1 = _mm256_add_epi32(q[2], q[3]);
        __m128i s4 = _mm_hadd_epi32(
            _mm_add_epi32(_mm256_castsi256_si128(h0), _mm256_extracti128_si256(h0, 1)),
            _mm_add_epi32(_mm256_castsi256_si128(h1), _mm256_extracti128_si256(h1, 1)));
        s4 = _mm_hadd_epi32(s4, s4); /* lane 0: elements 0..15, lane 1: 16..31 */
        const int s0 = _mm_cvtsi128_si32(s4), s1 = _mm_extract_epi32(s4, 1);
        a.d[b] = d;
        a.s[b] = d * (float)(s0 + s1);
        a.s16[2 * b] = d * (float)s0;
        a.s16[2 * b + 1] = d * (float)s1;
    }
}

#define MMQ_DOT(u, a)   mmq_dot_avx2((u), (a))
#define MMQ_Q5_HIGH(qh) mmq_q5_high_avx2(qh)
#define MMQ_R           2
#define MMQ_T           4
#define MMQ_TABLE       cpu_mmq_avx2
#define MMQ_QUANTIZE    cpu_q8act_quantize_avx2
/* Prefill (a row block decoded once for several token groups) goes through il_tile below */
#define MMQ_IL(dt)                                                                                 \
    ((dt) == TS_DTYPE_Q4_K || (dt) == TS_DTYPE_Q6_K || (dt) == TS_DTYPE_Q4_0 ||                    \
     (dt) == TS_DTYPE_Q5_0)
#define MMQ_IL_PREFILL_ONLY 1
#define MMQ_IL_DEC_CHUNKS   64
#define MMQ_IL_DEC_BYTES    (MMQ_R * MMQ_IL_DEC_CHUNKS * (int)sizeof(il_chunk))

/* A decoded 8-block chunk (a K-quant super-block, 8 Q4_0 / Q5_0 blocks): u[m] holds dword m
 * (elements 4m .. 4m + 3) of blocks 0..7, lane j block j - the order of cpu_q8act_interleave's
 * activations read a ymm at a time - so the dot products of the 8 blocks land in the 8 lanes of
 * one register with no folding; s: the chunk's fp32 scales (Q4_K: w, mins; Q6_K: w_lo, w_hi,
 * c0, c1 of mmq_k_scales; Q4_0 / Q5_0: the block scales). */
typedef struct {
    __m256i u[8];
    __m256 s[4];
} il_chunk;

#include "backend/cpu/matmul_q_simd.h"

/* The 8 x 8 dword transpose: r[j] holds block j's codes, u[m] dword m of every block. */
INLINE void il_transpose(const __m256i r[8], __m256i u[8]) {
    __m256i t[8], v[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        v[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        v[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        v[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        v[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int m = 0; m < 4; m++) {
        u[m] = _mm256_permute2x128_si256(v[m], v[m + 4], 0x20);
        u[m + 4] = _mm256_permute2x128_si256(v[m], v[m + 4], 0x31);
    }
}

/* Chunk ch of row w decoded into *c: the same codes and scales the shared body computes. */
INLINE void il_decode(ts_dtype dt, const uint8_t *w, int64_t ch, il_chunk *c) {
    __m256i r[8];
    if (dt == TS_DTYPE_Q4_K || dt == TS_DTYPE_Q6_K) {
        const uint8_t *blk = w + (size_t)ch * (dt == TS_DTYPE_Q4_K ? 144 : 210);
        mmq_k_scales(dt, blk, &c->s[0], &c->s[1], &c->s[2], &c->s[3]);
        for (int j = 0; j < 8; j++)
            r[j] = mmq_k_codes(dt, blk, j);
    } else {
        const int bb = dt == TS_DTYPE_Q4_0 ? 18 : 22;
        const uint8_t *blk = w + (size_t)ch * 8 * (size_t)bb;
        c->s[0] = mmq_chunk_scales(blk, bb);
        for (int j = 0; j < 8; j++)
            r[j] = mmq_32_codes(dt, blk + j * bb);
    }
    il_transpose(r, c->u);
}

/* sum_m maddubs(u[m0 + m], a[m0 + m]) for m < cnt (2, 4 or 8), in int16 (exact while cnt
 * times the largest pair sum, 2 * max code * 127, stays below 2^15), widened to int32. Two
 * chains of adds, even and odd m: one chain was the critical path, a full tree spilled. */
INLINE __m256i il_dots(const __m256i *u, const int8_t *aq, int m0, int cnt) {
#define IL_P(m) _mm256_maddubs_epi16(u[m], _mm256_loadu_si256((const __m256i *)(aq + 32 * (m))))
    __m256i s0 = IL_P(m0), s1 = IL_P(m0 + 1);
    UNROLL(4)
    for (int m = m0 + 2; m < m0 + cnt; m += 2) {
        s0 = _mm256_add_epi16(s0, IL_P(m));
        s1 = _mm256_add_epi16(s1, IL_P(m + 1));
    }
#undef IL_P
    return _mm256_madd_epi16(_mm256_add_epi16(s0, s1), _mm256_set1_epi16(1));
}

/* One row's decoded chunks against T tokens (activations interleaved), into acc[0 .. T). The
 * block totals are the shared body's (integer sums, exact in any order) and the fp32 steps
 * its own helpers, so every output has the bits the decode kernels give it. */
INLINE void il_row(ts_dtype dt, const il_chunk *dec, const cpu_q8act *A, int64_t chunks,
                   __m256 *acc, int T) {
    for (int64_t ch = 0; ch < chunks; ch++) {
        const il_chunk *c = &dec[ch];
        __m256i u[8];
        UNROLL(8)
        for (int m = 0; m < 8; m++)
            u[m] = _mm256_load_si256(&c->u[m]);
        UNROLL(4)
        for (int t = 0; t < T; t++) {
            const int8_t *aq = A[t].q + 256 * ch;
            if (dt == TS_DTYPE_Q4_K) { /* codes < 16: 8 pair sums fit int16 */
                acc[t] = mmq_k_offset(dt, c->s[2], c->s[3], &A[t], ch, acc[t]);
                const __m256i tot = il_dots(u, aq, 0, 8);
                acc[t] = mmq_k_sums(dt, tot, tot, tot, &A[t], ch, c->s[0], c->s[1], acc[t]);
            } else if (dt == TS_DTYPE_Q6_K) { /* codes < 64: 2 */
                acc[t] = mmq_k_offset(dt, c->s[2], c->s[3], &A[t], ch, acc[t]);
                const __m256i lo = _mm256_add_epi32(il_dots(u, aq, 0, 2), il_dots(u, aq, 2, 2));
                const __m256i hi = _mm256_add_epi32(il_dots(u, aq, 4, 2), il_dots(u, aq, 6, 2));
                acc[t] = mmq_k_sums(dt, lo, lo, hi, &A[t], ch, c->s[0], c->s[1], acc[t]);
            } else if (dt == TS_DTYPE_Q4_0) { /* codes < 16: 8 */
                acc[t] = mmq_chunk_sums(dt, il_dots(u, aq, 0, 8), &A[t], ch, c->s[0], acc[t]);
            } else { /* Q5_0, codes < 32: 4 */
                const __m256i tot = _mm256_add_epi32(il_dots(u, aq, 0, 4), il_dots(u, aq, 4, 4));
                acc[t] = mmq_chunk_sums(dt, tot, &A[t], ch, c->s[0], acc[t]);
            }
        }
    }
}

/* Prefill's tile (mmq_run: several token groups per row block): dec_state 1 decodes the row
 * block's chunks into decbuf (the first token group; the next row block's prefetch goes with
 * it), 2 reuses them. A row a pass: its 8 code vectors and T accumulators fill the registers. */
INLINE void il_tile(ts_dtype dt, const uint8_t *const *w, const uint8_t *pf, const uint8_t *act,
                    size_t ab, int64_t n, float *y, int64_t ldy, int nr, int T, uint8_t *decbuf,
                    int dec_state) {
    assert(dec_state == 1 || dec_state == 2);
    cpu_q8act A[MMQ_T];
    __m256 acc[MMQ_R][MMQ_T];
    mmq_tile_open(act, ab, n, MMQ_R, T, A, acc);
    const int64_t chunks = n / 256;
    il_chunk *dec = (il_chunk *)decbuf;
    /* the tail blocks of Q4_0 / Q5_0 rows (K-quant rows are whole chunks) */
    const int bb = dt == TS_DTYPE_Q4_0 ? 18 : 22;
    const int64_t tail0 = dt == TS_DTYPE_Q4_0 || dt == TS_DTYPE_Q5_0 ? 8 * chunks : n / 32;
    if (dec_state == 1) {
        const int cb = dt == TS_DTYPE_Q4_K ? 144 : dt == TS_DTYPE_Q6_K ? 210 : 8 * bb;
        const size_t pf_step = mmq_chunk_pf_step(pf, n, cb, bb);
        for (int64_t ch = 0; ch < chunks; ch++) {
            if (pf) mmq_prefetch_step(pf, (size_t)ch, (int)pf_step);
            for (int q = 0; q < MMQ_R; q++)
                il_decode(dt, w[q], ch, &dec[(size_t)q * (size_t)chunks + (size_t)ch]);
        }
    }
    for (int q = 0; q < nr; q++) {
        il_row(dt, &dec[(size_t)q * (size_t)chunks], A, chunks, acc[q], T);
        for (int64_t b = tail0; b < n / 32; b++)
            mmq_block32(dt, w[q], bb, A, b, acc[q], T);
    }
    mmq_tile_close(acc, MMQ_R, T, nr, y, ldy);
}

/* il_tile for each type and token count, out of line: inlined into mmq_run beside the decode
 * tiles, it made their code 3-8% slower (test_quant --bench hot avx2: Q4_0, Q6_K). */
static __attribute__((noinline)) void il_tile_any(ts_dtype dt, const uint8_t *const *w,
                                                  const uint8_t *pf, const uint8_t *act, size_t ab,
                                                  int64_t n, float *y, int64_t ldy, int nr, int T,
                                                  uint8_t *decbuf, int dec_state) {
#define IL_T(D)                                                                                    \
    switch (T) {                                                                                   \
    case 1: il_tile(D, w, pf, act, ab, n, y, ldy, nr, 1, decbuf, dec_state); break;                \
    case 2: il_tile(D, w, pf, act, ab, n, y, ldy, nr, 2, decbuf, dec_state); break;                \
    case 3: il_tile(D, w, pf, act, ab, n, y, ldy, nr, 3, decbuf, dec_state); break;                \
    default: il_tile(D, w, pf, act, ab, n, y, ldy, nr, MMQ_T, decbuf, dec_state); break;           \
    }
    switch (dt) {
    case TS_DTYPE_Q4_K: IL_T(TS_DTYPE_Q4_K); break;
    case TS_DTYPE_Q6_K: IL_T(TS_DTYPE_Q6_K); break;
    case TS_DTYPE_Q4_0: IL_T(TS_DTYPE_Q4_0); break;
    default: IL_T(TS_DTYPE_Q5_0); break;
    }
#undef IL_T
}

INLINE void mmq_il_tile(ts_dtype dt, const uint8_t *const *w, const uint8_t *pf, const uint8_t *act,
                        size_t ab, int64_t n, float *y, int64_t ldy, int nr, int T, uint8_t *decbuf,
                        int dec_state, bool seq) {
    (void)seq;
    il_tile_any(dt, w, pf, act, ab, n, y, ldy, nr, T, decbuf, dec_state);
}
