/* The body of the SIMD quantized-weight kernels, included by matmul_q_avx2.c and
 * matmul_q_avx512.c, which define before including it:
 *   MMQ_DOT(u, a)  __m256i of 8 int32: lane i = sum of u[4i..4i+3] * a[4i..4i+3], u unsigned
 *                  (< 128) and a signed bytes (AVX-512 VNNI: vpdpbusd; AVX2: maddubs + madd);
 *   MMQ_Q5_HIGH(qh) __m256i with byte i = 0x10 where bit i of the u32 qh is set, else 0;
 *   MMQ_R, MMQ_T   the register tile: rows x tokens per pass;
 *   MMQ_TABLE      the name of the kernel table to define;
 *   MMQ_QUANTIZE   this ISA's cpu_q8act_quantize (same bytes as the scalar one);
 *   MMQ_IL(dt)     optional: nonzero for the dtypes that the file's own mmq_il_tile handles
 *                  (activations in the order of cpu_q8act_interleave; see matmul_q_avx512.c);
 *   MMQ_IL_DEC_BYTES, MMQ_IL_DEC_CHUNKS  with MMQ_IL: a buffer in which mmq_il_tile keeps a row
 *                  block decoded for all its token groups (rows of up to that many 256-element
 *                  chunks), so prefill decodes each weight once per tile of tokens;
 *   MMQ_REPACK(dt) optional: the cpu_repack_fn of the dtypes whose blocks the file's kernels
 *                  read regrouped (cpu_mm_kernel.repack), else NULL;
 *   MMQ_IL_PREFILL_ONLY  optional, with MMQ_IL: 1 where mmq_il_tile serves only tiles of more
 *                  than MMQ_T tokens whose row blocks fit that buffer (AVX2: its decoder
 *                  transposes, which only pays when the decoded block is reused); the shared
 *                  tiles take the rest, with the same bits.
 *
 * Work order: activations are quantized (cpu_q8act_quantize) a tile of tokens at a time into
 * a stack buffer; for each block of MMQ_R rows, each group of up to MMQ_T tokens runs over the
 * whole row with MMQ_R x MMQ_T accumulators, so a weight block is decoded once per token group
 * and an activation block loaded once per row block. Each 32-element block gives 8 int32 lanes
 * of integer dot product; Q4_K, Q6_K, Q4_0 and Q5_0 fold 8 blocks' lanes into one lane a
 * block (mmq_fold8) and convert and scale them once per 8 blocks, Q8_0 converts and scales each
 * block's 8 lanes; offsets of the unsigned codes (Q4_0: 8, Q5_0: 16, Q4_K: the mins,
 * Q6_K: 32) are subtracted through the activations' block sums. On the first token group the
 * row block cpu_mmq_prefetch_bytes(dt) or more ahead (whole row blocks) is prefetched into L2 as
 * one sequential stream (a row block is contiguous), one prefetch per 64-byte line: without it one
 * Zen 4 core decoded Q4_K at 7 GB/s, with it (8 KB ahead) 15. */
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_q.h"
#include "backend/cpu/quant.h"

#include <assert.h>
#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

#if defined(__OPTIMIZE__)
#define MMQ_PRAGMA(x) _Pragma(#x)
#define UNROLL(n) MMQ_PRAGMA(GCC unroll n)
#else
#define UNROLL(n)
#endif

INLINE float mmq_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE __m256 mmq_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm256_set1_ps(_cvtsh_ss(h));
}

/* Step i of a pass that consumes `chunk` bytes of a row block per step: prefetches the lines
 * that start in [pf + i * chunk, pf + (i + 1) * chunk), pf being the same offset into a row
 * block further on. A row block is contiguous, so this is one sequential stream. */
INLINE void mmq_prefetch_step(const uint8_t *pf, size_t i, int chunk) {
    uintptr_t lo = (uintptr_t)pf + i * (size_t)chunk, hi = lo + (size_t)chunk;
    for (uintptr_t p = (lo + 63) & ~(uintptr_t)63; p < hi; p += 64)
        _mm_prefetch((const char *)p, _MM_HINT_T1);
}

/* Low (hi = 0) or high nibbles of 32 bytes. */
INLINE __m256i mmq_nib(__m256i v, int hi) {
    if (hi) v = _mm256_srli_epi16(v, 4);
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

/* Codes of a Q4_0 / Q5_0 block (unsigned, offset 8 / 16): elements 0..15 are the low nibbles. */
INLINE __m256i mmq_u_q4_0(const uint8_t *qs) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

/* The start and end every tile shares: views of the T tokens' quantized activations (slots ab
 * bytes apart) and R x T zeroed accumulators; then the horizontal sums of the first nr rows
 * into y[t * ldy + q]. */
INLINE void mmq_tile_open(const uint8_t *act, size_t ab, int64_t n, int R, int T, cpu_q8act *A,
                          __m256 acc[MMQ_R][MMQ_T]) {
    UNROLL(8)
    for (int t = 0; t < T; t++) A[t] = cpu_q8act_view((uint8_t *)act + (size_t)t * ab, n);
    UNROLL(8)
    for (int q = 0; q < R; q++) {
        UNROLL(8)
        for (int t = 0; t < T; t++) acc[q][t] = _mm256_setzero_ps();
    }
}

INLINE void mmq_tile_close(__m256 acc[MMQ_R][MMQ_T], int R, int T, int nr, float *y,
                           int64_t ldy) {
    UNROLL(8)
    for (int q = 0; q < R; q++) {
        if (q >= nr) break;
        UNROLL(8)
        for (int t = 0; t < T; t++) y[t * ldy + q] = mmq_hsum(acc[q][t]);
    }
}

/* The 16-bit word at p (a block's fp16 scale), as a short for _mm_setr_epi16. */
INLINE short mmq_u16(const uint8_t *p) {
    short v;
    memcpy(&v, p, 2);
    return v;
}

/* The codes of one Q8_0 / Q4_0 / Q5_0 block (Q8_0: signed; the others unsigned). */
INLINE __m256i mmq_32_codes(ts_dtype dt, const uint8_t *blk) {
    if (dt == TS_DTYPE_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    if (dt == TS_DTYPE_Q4_0) return mmq_u_q4_0(blk + 2);
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    return _mm256_or_si256(mmq_u_q4_0(blk + 6), MMQ_Q5_HIGH(qh));
}

/* A block's integer dot product (8 int32 lanes); Q8_0's signed codes: the sign moved onto a. */
INLINE __m256i mmq_32_dot(ts_dtype dt, __m256i u, __m256i a) {
    if (dt == TS_DTYPE_Q8_0) return MMQ_DOT(_mm256_sign_epi8(u, u), _mm256_sign_epi8(a, u));
    return MMQ_DOT(u, a);
}

/* The dot products (8 int32 lanes each) of nb <= 8 blocks' unsigned codes u with the activation
 * blocks from aq on, d[j] zero for j >= nb. */
INLINE void mmq_dot8(const __m256i u[8], const int8_t *aq, int nb, __m256i d[8]) {
    UNROLL(8)
    for (int j = 0; j < 8; j++)
        d[j] = j < nb ? MMQ_DOT(u[j], _mm256_loadu_si256((const __m256i *)(aq + 32 * j)))
                      : _mm256_setzero_si256();
}

/* The totals of 8 blocks' dot products, block j in lane j: hadd steps, then the two halves of
 * every block added across the 128-bit lanes. lo / hi (not NULL): the halves themselves -
 * lanes 0-3 (elements 0-15) and 4-7 (16-31) of each block. */
INLINE __m256i mmq_fold8(const __m256i d[8], __m256i *lo_out, __m256i *hi_out) {
    const __m256i g0 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
    const __m256i g1 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[4], d[5]), _mm256_hadd_epi32(d[6], d[7]));
    const __m256i lo = _mm256_permute2x128_si256(g0, g1, 0x20);
    const __m256i hi = _mm256_permute2x128_si256(g0, g1, 0x31);
    if (lo_out) *lo_out = lo, *hi_out = hi;
    return _mm256_add_epi32(lo, hi);
}

/* The fp32 scales of the 8 blocks of bb bytes from blk on, by word inserts (not through a stack
 * array: a store-to-load stall). */
INLINE __m256 mmq_chunk_scales(const uint8_t *blk, int bb) {
    return _mm256_cvtph_ps(_mm_setr_epi16(mmq_u16(blk), mmq_u16(blk + bb), mmq_u16(blk + 2 * bb),
                                          mmq_u16(blk + 3 * bb), mmq_u16(blk + 4 * bb),
                                          mmq_u16(blk + 5 * bb), mmq_u16(blk + 6 * bb),
                                          mmq_u16(blk + 7 * bb)));
}

/* Block b of row w (bb bytes a block) against T tokens, its 8 lanes scaled by themselves: how
 * Q8_0, and a Q4_0 / Q5_0 row's last n / 32 % 8 blocks, are summed (the activations of those
 * blocks stay in their natural order in every layout). */
INLINE void mmq_block32(ts_dtype dt, const uint8_t *w, int bb, const cpu_q8act *A, int64_t b,
                        __m256 *acc, int T) {
    const float off = dt == TS_DTYPE_Q4_0 ? -8.0f : dt == TS_DTYPE_Q5_0 ? -16.0f : 0.0f;
    const uint8_t *blk = w + (size_t)b * (size_t)bb;
    const __m256 dw = mmq_f16(blk);
    const __m256i u = mmq_32_codes(dt, blk);
    UNROLL(8)
    for (int t = 0; t < T; t++) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(A[t].q + 32 * b));
        const __m256 fi = _mm256_cvtepi32_ps(mmq_32_dot(dt, u, a));
        const __m256 da = _mm256_set1_ps(A[t].d[b]);
        __m256 f;
        if (dt == TS_DTYPE_Q8_0)
            f = _mm256_mul_ps(fi, da);
        else
            f = _mm256_fmadd_ps(fi, da, _mm256_set1_ps(A[t].s[b] * (off / 8)));
        acc[t] = _mm256_fmadd_ps(f, dw, acc[t]);
    }
}

/* A Q4_0 / Q5_0 chunk's 8 block totals (lane j: block j) against token A, scaled and added to
 * acc; the codes' offset through each block's activation sum s. */
INLINE __m256 mmq_chunk_sums(ts_dtype dt, __m256i tot, const cpu_q8act *A, int64_t c, __m256 dw,
                             __m256 acc) {
    const float off = dt == TS_DTYPE_Q4_0 ? -8.0f : -16.0f;
    const __m256 f =
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_loadu_ps(A->d + 8 * c),
                        _mm256_mul_ps(_mm256_loadu_ps(A->s + 8 * c), _mm256_set1_ps(off)));
    return _mm256_fmadd_ps(f, dw, acc);
}

/* Rows w[0..R) (row pointers), tokens act[0..T) (slots ab bytes apart), block type dt with
 * 32-element blocks of bb bytes; y[t * ldy + q] for q < nr. pf: the next row block, or NULL.
 * Q4_0's and Q5_0's whole chunks of 8 blocks fold their dot products into one lane a block
 * (mmq_fold8), so the scales and the codes' offset are applied once per chunk on 8 lanes (Q4_0
 * in L2 +36%); Q8_0, and a row's last n / 32 % 8 blocks, go one at a time, their 8 lanes
 * scaled alike. */
INLINE void mmq_tile32(ts_dtype dt, const uint8_t *const *w, const uint8_t *pf, size_t rb,
                       const uint8_t *act, size_t ab, int64_t n, float *y, int64_t ldy, int nr,
                       int R, int T) {
    const int bb = dt == TS_DTYPE_Q8_0 ? 34 : dt == TS_DTYPE_Q4_0 ? 18 : 22;
    (void)rb;
    cpu_q8act A[MMQ_T];
    __m256 acc[MMQ_R][MMQ_T];
    mmq_tile_open(act, ab, n, R, T, A, acc);
    /* Q8_0 stays a block at a time: it streams at the bandwidth either way, and its rows of
     * 640 read 5% slower in chunks (Gemma 3's head). Q5_0's chunks: decode level (its fifth
     * bits bind it), prefill +17-35% */
    const int64_t nc = dt == TS_DTYPE_Q4_0 || dt == TS_DTYPE_Q5_0 ? n / 256 : 0;
    for (int64_t c = 0; c < nc; c++) {
        const size_t o = (size_t)c * 8 * (size_t)bb;
        if (pf) mmq_prefetch_step(pf, (size_t)c, 8 * R * bb);
        UNROLL(8)
        for (int q = 0; q < R; q++) {
            const uint8_t *blk = w[q] + o;
            const __m256 dw = mmq_chunk_scales(blk, bb);
            __m256i u[8];
            UNROLL(8)
            for (int j = 0; j < 8; j++) u[j] = mmq_32_codes(dt, blk + j * bb);
            UNROLL(8)
            for (int t = 0; t < T; t++) {
                __m256i d[8]; /* Q4_0 / Q5_0: unsigned codes */
                mmq_dot8(u, A[t].q + 256 * c, 8, d);
                acc[q][t] = mmq_chunk_sums(dt, mmq_fold8(d, NULL, NULL), &A[t], c, dw, acc[q][t]);
            }
        }
    }
    for (int64_t b = 8 * nc; b < n / 32; b++) {
        if (pf) mmq_prefetch_step(pf, (size_t)b, R * bb);
        UNROLL(8)
        for (int q = 0; q < R; q++)
            mmq_block32(dt, w[q], bb, A, b, acc[q], T);
    }
    mmq_tile_close(acc, R, T, nr, y, ldy);
}

/* The unsigned codes of sub-block jj (32 elements) of a Q4_K / Q6_K super-block. */
INLINE __m256i mmq_k_codes(ts_dtype dt, const uint8_t *blk, int jj) {
    if (dt == TS_DTYPE_Q4_K)
        return mmq_nib(_mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * (jj / 2))), jj & 1);
    const int h = jj / 4, k = jj % 4;
    __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (k & 1)));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    /* bits 2k..2k+1 of qh to bits 4..5 */
    if (k == 0) qh = _mm256_slli_epi16(qh, 4);
    if (k == 1) qh = _mm256_slli_epi16(qh, 2);
    if (k == 3) qh = _mm256_srli_epi16(qh, 2);
    return _mm256_or_si256(mmq_nib(ql, k >= 2), _mm256_and_si256(qh, _mm256_set1_epi8(0x30)));
}

/* A Q4_K / Q6_K super-block's fp32 scales. Q4_K: w_lo = w_hi the 8 sub-block scales, c0 their
 * mins (subtracted through the activations' block sums s); Q6_K: w_lo, w_hi the scales 2j and
 * 2j + 1 of sub-block j (its elements 0-15 and 16-31), c0, c1 the 16 scales in order times 32
 * (the codes' offset, subtracted through the half-block sums s16). */
INLINE void mmq_k_scales(ts_dtype dt, const uint8_t *blk, __m256 *w_lo, __m256 *w_hi, __m256 *c0,
                         __m256 *c1) {
    if (dt == TS_DTYPE_Q4_K) {
        const ts_block_q4_K *k = (const ts_block_q4_K *)blk;
        /* the 6-bit fields of all 8 sub-blocks at once, as bytes (layout in quant.h) */
        uint32_t u[3];
        memcpy(u, k->scales, 12);
        uint64_t sc = (uint64_t)(u[0] & 0x3f3f3f3fu) |
                      (uint64_t)((u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u)) << 32;
        uint64_t mn = (uint64_t)(u[1] & 0x3f3f3f3fu) |
                      (uint64_t)(((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u)) << 32;
        __m256 scv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
        __m256 mnv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
        *w_lo = *w_hi = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(k->d)), scv);
        *c0 = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(k->dmin)), mnv);
        *c1 = _mm256_setzero_ps();
        return;
    }
    const ts_block_q6_K *k = (const ts_block_q6_K *)blk;
    __m256 d = _mm256_set1_ps(_cvtsh_ss(k->d));
    __m128i sc = _mm_loadu_si128((const __m128i *)k->scales);
    __m256 w0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
    __m256 w1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
    *c0 = _mm256_mul_ps(w0, _mm256_set1_ps(32.0f));
    *c1 = _mm256_mul_ps(w1, _mm256_set1_ps(32.0f));
    /* the even and the odd scales of w0 | w1, in order */
    *w_lo = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(w0, w1, 0x88)), 0xd8));
    *w_hi = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(w0, w1, 0xdd)), 0xd8));
}

/* The codes' offsets of super-block sb against token A (mmq_k_scales' c0, c1), subtracted
 * from acc before its sums are added. */
INLINE __m256 mmq_k_offset(ts_dtype dt, __m256 c0, __m256 c1, const cpu_q8act *A, int64_t sb,
                           __m256 acc) {
    if (dt == TS_DTYPE_Q4_K) return _mm256_fnmadd_ps(c0, _mm256_loadu_ps(A->s + 8 * sb), acc);
    const float *s16 = A->s16 + 16 * sb;
    acc = _mm256_fnmadd_ps(c0, _mm256_loadu_ps(s16), acc);
    return _mm256_fnmadd_ps(c1, _mm256_loadu_ps(s16 + 8), acc);
}

/* A super-block's 8 sub-block totals tot (Q6_K: their halves lo, hi; lane j: sub-block j)
 * against token A, scaled and added to acc. */
INLINE __m256 mmq_k_sums(ts_dtype dt, __m256i tot, __m256i lo, __m256i hi, const cpu_q8act *A,
                         int64_t sb, __m256 w_lo, __m256 w_hi, __m256 acc) {
    const __m256 da = _mm256_loadu_ps(A->d + 8 * sb);
    if (dt == TS_DTYPE_Q4_K)
        return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(tot), da), w_lo, acc);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(lo), da), w_lo, acc);
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(hi), da), w_hi, acc);
}

/* Same for Q4_K and Q6_K super-blocks of 256. */
INLINE void mmq_tileK(ts_dtype dt, const uint8_t *const *w, const uint8_t *pf, size_t rb,
                      const uint8_t *act, size_t ab, int64_t n, float *y, int64_t ldy, int nr,
                      int R, int T) {
    const int bb = dt == TS_DTYPE_Q4_K ? 144 : 210;
    (void)rb;
    cpu_q8act A[MMQ_T];
    __m256 acc[MMQ_R][MMQ_T];
    mmq_tile_open(act, ab, n, R, T, A, acc);
    for (int64_t sb = 0; sb < n / 256; sb++) {
        const size_t o = (size_t)sb * (size_t)bb;
        if (pf) mmq_prefetch_step(pf, (size_t)sb, R * bb);
        /* Per row: the scales, the codes' offsets through the activations' sums, then the 8
         * sub-blocks' dot products (8 int32 lanes each) folded into their 8 totals (one lane
         * each, mmq_fold8), so the fp32 work - conversion, the activation scales, the weight
         * scales - runs once per super-block on 8 lanes instead of once per sub-block; Q6_K
         * keeps each sub-block's two halves apart (lo: elements 0-15, scale 2j; hi: 16-31,
         * scale 2j + 1). */
        UNROLL(8)
        for (int q = 0; q < R; q++) {
            const uint8_t *blk = w[q] + o;
            __m256 w_lo, w_hi, c0, c1;
            mmq_k_scales(dt, blk, &w_lo, &w_hi, &c0, &c1);
            UNROLL(8)
            for (int t = 0; t < T; t++)
                acc[q][t] = mmq_k_offset(dt, c0, c1, &A[t], sb, acc[q][t]);
            __m256i u[8];
            UNROLL(8)
            for (int jj = 0; jj < 8; jj++) u[jj] = mmq_k_codes(dt, blk, jj);
            UNROLL(8)
            for (int t = 0; t < T; t++) {
                __m256i d[8], lo, hi;
                mmq_dot8(u, A[t].q + 256 * sb, 8, d);
                const __m256i tot = mmq_fold8(d, &lo, &hi);
                acc[q][t] = mmq_k_sums(dt, tot, lo, hi, &A[t], sb, w_lo, w_hi, acc[q][t]);
            }
        }
    }
    mmq_tile_close(acc, R, T, nr, y, ldy);
}

/* The next row block's prefetch spread over a pass's 8-block chunk steps (cb bytes a chunk, the
 * row's last n / 32 % 8 blocks bb bytes each): the bytes a step; a row block with no whole
 * chunk is asked for here at once. The whole block goes over the chunk steps: with a tail
 * (Gemma's 640-column Q8_0 output head: 2 chunks + 4 blocks) steps of one chunk left a fifth
 * of it to demand misses, and decode of that head ran at 3/4 of the old kernel's speed. */
INLINE size_t mmq_chunk_pf_step(const uint8_t *pf, int64_t n, int cb, int bb) {
    const int64_t chunks = n / 256;
    const size_t block_bytes = (size_t)MMQ_R * ((size_t)chunks * cb + (size_t)(n % 256) / 32 * bb);
    if (pf && !chunks) mmq_prefetch_step(pf, 0, (int)block_bytes);
    return chunks ? (block_bytes + (size_t)chunks - 1) / (size_t)chunks : 0;
}

#ifdef MMQ_IL
#define MMQ_HAS_IL 1
INLINE void mmq_il_tile(ts_dtype dt, const uint8_t *const *w, const uint8_t *pf, const uint8_t *act,
                        size_t ab, int64_t n, float *y, int64_t ldy, int nr, int T, uint8_t *decbuf,
                        int dec_state, bool seq);
#ifdef MMQ_IL_STREAM
INLINE void mmq_il_stream(ts_dtype dt, const uint8_t *w0, size_t rb, int64_t rows,
                          const uint8_t *act, size_t ab, int64_t n, float *y, int64_t ldy, int T,
                          size_t pf_bytes);
#endif
#else
#define MMQ_HAS_IL 0
#define MMQ_IL(dt) 0
#endif
#ifndef MMQ_IL_PREFILL_ONLY
#define MMQ_IL_PREFILL_ONLY 0
#endif

/* seq (cpu_seq_rows): one or two tokens' row block in passes of fewer rows, where the file's
 * own tile (MMQ_IL) takes the type; the shared body keeps its rows together (AVX2's tile is two
 * rows; a row a pass loads the activations and their scales once a row: 9-11% slower there) */
INLINE void mmq_tile(ts_dtype dt, bool il, const uint8_t *const *w, const uint8_t *pf, size_t rb,
                     const uint8_t *act, size_t ab, int64_t n, float *y, int64_t ldy, int nr, int T,
                     uint8_t *decbuf, int dec_state, bool seq) {
#if MMQ_HAS_IL
    if (il) {
        mmq_il_tile(dt, w, pf, act, ab, n, y, ldy, nr, T, decbuf, dec_state, seq);
        return;
    }
#endif
    (void)il, (void)decbuf, (void)dec_state, (void)seq;
    if (dt == TS_DTYPE_Q4_K || dt == TS_DTYPE_Q6_K)
        mmq_tileK(dt, w, pf, rb, act, ab, n, y, ldy, nr, MMQ_R, T);
    else
        mmq_tile32(dt, w, pf, rb, act, ab, n, y, ldy, nr, MMQ_R, T);
}

/* Whether a row of n columns fits the buffer in which the file's own tile keeps a row block
 * decoded for all its token groups (MMQ_IL_DEC_BYTES). */
INLINE bool mmq_predecode(ts_dtype dt, int64_t n) {
#if MMQ_HAS_IL && defined(MMQ_IL_DEC_BYTES)
    (void)dt; /* AVX-512's MMQ_IL takes every type */
    return MMQ_IL(dt) && n / 256 <= MMQ_IL_DEC_CHUNKS;
#else
    (void)dt, (void)n;
    return false;
#endif
}

/* The layout of the activations the file's own tile reads (il), or the shared tiles' */
INLINE int mmq_layout(ts_dtype dt, bool il) {
    if (!il) return CPU_MMQ_ACT_NATURAL;
    return dt == TS_DTYPE_Q8_0 ? CPU_MMQ_ACT_IL_Q8 : CPU_MMQ_ACT_IL;
}

/* The layout in which the tiles below take a call's tokens of n columns all quantized
 * beforehand: the file's own tile where it takes the type (AVX2's only with the row block
 * decoded once). */
INLINE int mmq_act_layout(ts_dtype dt, int64_t n) {
    return mmq_layout(dt, MMQ_IL(dt) && (!MMQ_IL_PREFILL_ONLY || mmq_predecode(dt, n)));
}

#ifdef MMQ_IL_STREAM
/* mmq_il_stream with the token count a constant, 1 .. 2 MMQ_T (the loops over tokens unrolled) */
INLINE void mmq_il_stream_n(ts_dtype dt, const uint8_t *w0, size_t rb, int64_t rows,
                            const uint8_t *act, size_t ab, int64_t n, float *y, int64_t ldy, int nt,
                            size_t pf) {
    switch (nt) {
    case 1: mmq_il_stream(dt, w0, rb, rows, act, ab, n, y, ldy, 1, pf); break;
    case 2: mmq_il_stream(dt, w0, rb, rows, act, ab, n, y, ldy, 2, pf); break;
    case 3: mmq_il_stream(dt, w0, rb, rows, act, ab, n, y, ldy, 3, pf); break;
    case 4: mmq_il_stream(dt, w0, rb, rows, act, ab, n, y, ldy, 4, pf); break;
    case 5: mmq_il_stream(dt, w0, rb, rows, act, ab, n, y, ldy, 5, pf); break;
    case 6: mmq_il_stream(dt, w0, rb, rows, act, ab, n, y, ldy, 6, pf); break;
    case 7: mmq_il_stream(dt, w0, rb, rows, act, ab, n, y, ldy, 7, pf); break;
    default: mmq_il_stream(dt, w0, rb, rows, act, ab, n, y, ldy, 8, pf); break;
    }
}
#endif

INLINE void mmq_run(ts_dtype dt, const cpu_mm_job *j, int64_t r0, int64_t r1) {
    _Alignas(64) uint8_t buf[CPU_MMQ_ACT_BYTES];
#if MMQ_HAS_IL && defined(MMQ_IL_DEC_BYTES)
    _Alignas(64) uint8_t decbuf[MMQ_IL_DEC_BYTES];
#else
    uint8_t *decbuf = NULL;
#endif
    const bool predecode = mmq_predecode(dt, j->cols);
    const int64_t n = j->cols;
    assert(n % ts_dtype_block_elems(dt) == 0 && n <= CPU_MMQ_MAX_COLS);
    const size_t ab = cpu_q8act_bytes(n), rb = j->row_bytes;
    int tt = cpu_mmq_tok_tile(n);
    const size_t pf_bytes = cpu_mmq_prefetch_bytes(dt);
    const bool seq = cpu_seq_rows(CPU_SEQ_QUANT_AVX512); /* only the AVX-512 tile uses it */
    if (tt > MMQ_T) tt -= tt % MMQ_T;
    for (int t0 = 0; t0 < j->n_tok; t0 += tt) {
        const int nt = j->n_tok - t0 < tt ? j->n_tok - t0 : tt;
        /* the file's own tile, for every token count or (MMQ_IL_PREFILL_ONLY) only where a row
         * block is decoded once for several token groups; with x quantized beforehand, as
         * mmq_act_layout chose for all of it (a short last tile included: either tile gives
         * the same bits) */
        const int layout =
            j->xq
                ? mmq_act_layout(dt, n)
                : mmq_layout(dt, MMQ_IL(dt) && (!MMQ_IL_PREFILL_ONLY || (predecode && nt > MMQ_T)));
        const bool il = layout != CPU_MMQ_ACT_NATURAL;
        const uint8_t *tile = j->xq ? j->xq + (size_t)t0 * ab : buf;
        for (int t = 0; t < nt && !j->xq; t++) {
            MMQ_QUANTIZE(j->x + (int64_t)(t0 + t) * j->ldx, n, buf + (size_t)t * ab);
            cpu_q8act_arrange(layout, n, buf + (size_t)t * ab);
        }
#ifdef MMQ_IL_STREAM
        /* one to eight tokens: the rows as one stream. Rows of whole chunks by calls of their own,
         * where n % 256 == 0 tells the compiler the stream's tail code is dead: with one call
         * site for both, that code (never run there) cost the K-quants' stream 15% on the Intel
         * Xeon VM (bench/RESULTS.md) */
        if (il && seq && nt <= 2 * MMQ_T) {
            const uint8_t *w0 = j->w + (size_t)r0 * rb;
            float *y = j->y + (int64_t)t0 * j->ldy + r0;
            if (n % 256 == 0)
                mmq_il_stream_n(dt, w0, rb, r1 - r0, tile, ab, n, y, j->ldy, nt, pf_bytes);
            else
                mmq_il_stream_n(dt, w0, rb, r1 - r0, tile, ab, n, y, j->ldy, nt, pf_bytes);
            continue;
        }
#endif
        for (int64_t r = r0; r < r1; r += MMQ_R) {
            const int nr = r1 - r < MMQ_R ? (int)(r1 - r) : MMQ_R;
            const uint8_t *w[MMQ_R];
            /* missing rows re-read the last one; their sums are dropped */
            for (int q = 0; q < MMQ_R; q++) w[q] = j->w + (size_t)(r + (q < nr ? q : nr - 1)) * rb;
            /* prefetch whole row blocks ahead, at least pf_bytes */
            const size_t blk_bytes = (size_t)MMQ_R * rb;
            const uint8_t *pf = w[0] + (pf_bytes + blk_bytes - 1) / blk_bytes * blk_bytes;
            for (int tg = 0; tg < nt; tg += MMQ_T) {
                const uint8_t *act = tile + (size_t)tg * ab;
                float *y = j->y + (int64_t)(t0 + tg) * j->ldy + r;
                const uint8_t *p = tg == 0 ? pf : NULL;
                /* several token groups: decode the row block once, with the first (AVX2's
                 * tile always: it only reads decoded blocks) */
                const int ds = predecode && (nt > MMQ_T || (il && MMQ_IL_PREFILL_ONLY))
                                   ? (tg == 0 ? 1 : 2)
                                   : 0;
                switch (nt - tg) {
                case 1:
                    mmq_tile(dt, il, w, p, rb, act, ab, n, y, j->ldy, nr, 1, decbuf, ds, seq);
                    break;
#if MMQ_T > 2
                case 2:
                    mmq_tile(dt, il, w, p, rb, act, ab, n, y, j->ldy, nr, 2, decbuf, ds, seq);
                    break;
                case 3:
                    mmq_tile(dt, il, w, p, rb, act, ab, n, y, j->ldy, nr, 3, decbuf, ds, seq);
                    break;
#endif
                default:
                    mmq_tile(dt, il, w, p, rb, act, ab, n, y, j->ldy, nr, MMQ_T, decbuf, ds, seq);
                    break;
                }
            }
        }
    }
}

#define MMQ_ENTRY(T)                                                                               \
    static void mmq_##T(const cpu_mm_job *j, int64_t r0, int64_t r1) {                             \
        mmq_run(TS_DTYPE_##T, j, r0, r1);                                                          \
    }                                                                                              \
    static int mmq_act_##T(int64_t n) { return mmq_act_layout(TS_DTYPE_##T, n); }
MMQ_ENTRY(Q8_0)
MMQ_ENTRY(Q4_0)
MMQ_ENTRY(Q5_0)
MMQ_ENTRY(Q4_K)
MMQ_ENTRY(Q6_K)
#undef MMQ_ENTRY

#ifndef MMQ_REPACK
#define MMQ_REPACK(dt) NULL
#endif
#define MMQ_KERNEL(T)                                                                              \
    [TS_DTYPE_##T] = {mmq_##T, MMQ_R, 0, 0, mmq_act_##T, MMQ_QUANTIZE, MMQ_REPACK(TS_DTYPE_##T)}
const cpu_mm_kernel MMQ_TABLE[TS_DTYPE_COUNT] = {
    MMQ_KERNEL(Q8_0), MMQ_KERNEL(Q4_0), MMQ_KERNEL(Q5_0), MMQ_KERNEL(Q4_K), MMQ_KERNEL(Q6_K),
};
#undef MMQ_KERNEL
