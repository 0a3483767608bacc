/* AVX-512 kernels for the quantized weight types: the shared body (matmul_q_simd.h) with the
 * VNNI dot product (vpdpbusd on 256-bit vectors: on Zen 4 a 512-bit op is two 256-bit halves
 * anyway) and a 4 x 4 register tile, which the 32 vector registers hold. Needs AVX512-VNNI
 * besides F/BW/VL/DQ: the dispatcher must check avx512vnni before choosing this table.
 *
 * Q4_0, Q4_K, Q6_K and Q8_0 have their own tile (mmq_il_tile below): it takes 8 blocks of 32
 * (a K-quant super-block, 8 Q4_0 / Q8_0 blocks) per step, decodes them into 4 zmm in the order
 * of cpu_q8act_interleave (_q8), and accumulates the 4 VNNI dots in one register whose lanes
 * then add up to the 8 block sums (Q6_K: two registers, one per 16-element scale, added into
 * the 16 lanes of one fp32 accumulator). The per-block fp32 work (convert, scale, accumulate)
 * runs once per 8 blocks on 8 (Q6_K: 16) lanes instead of once per block on a broadcast: the
 * shared body spends ~10 instructions per 32 weights per row, this one ~3-5, which is what
 * decode needs to approach the memory bandwidth, and prefill does 4 fp32 ops per 256 products
 * instead of 16-24. Q5_0 takes it too: its fifth bits are set in the decoded bytes by a masked
 * add, the mask of each code vector found by replicating one byte of each block's 32 high bits
 * and testing it against per-byte bit masks. (A first version that spread the bits otherwise
 * decoded at 12 GB/s against the shared body's 17 and was dropped; Gemma 3's Q4_K_M keeps its
 * 640-wide projections in Q5_0, and in prefill the shared body's per-block fp32 work made them
 * half of the whole prefill.)
 *
 * One Zen 4 core decodes (test_quant --bench hot, a matrix in L2, so the kernel's own speed)
 * Q4_K at 23.7 GB/s and Q6_K at 25.5 (one token; two tokens 17.5 / 19), about what it does
 * from DRAM: the decoders are bound by the vector ports, where on Zen 4 the 512-bit permutes,
 * shifts, conversions and vpdpbusd compete (each one per cycle). From 18.7 / 19.8 GB/s: the
 * decoders' loops unrolled (GCC had kept the 4 code vectors in a stack array: +16%); Q4_K's
 * high nibbles dotted in place (16 q, no shift; the activation scales of those blocks carry
 * the 1/16: +6%, bit-identical); Q6_K's two scales per block kept apart in 16 lanes until the
 * row is done, its code offset 32 through one FMA instead of a multiply, a fold and a
 * subtract per row and token (+11%). Tried and dropped: Q6_K's qh from broadcast loads and
 * blends instead of a permute (-13%); Q6_K codes where they lie, in natural order, with a
 * transpose-and-add of the sums (+3%: the transpose costs what the permutes did); Q4_K's 6-bit
 * scales unpacked in general-purpose registers (-3%) or for two rows at once (+1%); two
 * dot-product chains (0).
 *
 * Q4_K, Q6_K and Q4_0 weights are read regrouped (il_repack_q4k / _q6k / _q40 below, made once
 * per weight by the backend's cache, weight_cache.h): the decoders above then need no permutes,
 * and on a Zen 5 core, which runs 512-bit permutes and VNNI dots once a cycle each (ands twice),
 * a hot Q4_K super-block and row went 21.7 -> 18 cycles, a Q6_K one 30 -> 24 and a Q4_0 chunk
 * 21 -> 15, the same bits. */
#include "backend/cpu/matmul_q.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* cpu_q8act_quantize with the same fp32 operations per element (see the AVX2 version). */
void cpu_q8act_quantize_avx512(const float *x, int64_t n, void *buf) {
    cpu_q8act a = cpu_q8act_view(buf, n);
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        const float amax =
            _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
        _mm_storeu_si128((__m128i *)(a.q + 32 * b), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(a.q + 32 * b + 16), _mm512_cvtepi32_epi8(q1));
        const int s0 = _mm512_reduce_add_epi32(q0), s1 = _mm512_reduce_add_epi32(q1);
        a.d[b] = d;
        a.s[b] = d * (float)(s0 + s1);
        a.s16[2 * b] = d * (float)s0;
        a.s16[2 * b + 1] = d * (float)s1;
    }
}

#define MMQ_DOT(u, a)   _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (a))
#define MMQ_Q5_HIGH(qh) _mm256_maskz_mov_epi8((__mmask32)(qh), _mm256_set1_epi8(0x10))
#define MMQ_R           4
#define MMQ_T           4
#define MMQ_TABLE       cpu_mmq_avx512
#define MMQ_QUANTIZE    cpu_q8act_quantize_avx512
#define MMQ_IL(dt)      1
/* prefill: a row block's chunks decoded once for all its token groups, rows up to 64 chunks
 * (16384 columns); 384 bytes an 8-block chunk (il_weights) */
#define MMQ_IL_DEC_CHUNKS 64
#define MMQ_IL_DEC_BYTES  (MMQ_R * MMQ_IL_DEC_CHUNKS * 384)
/* one to eight tokens: mmq_il_stream (below) */
#define MMQ_IL_STREAM 1
/* Q4_K, Q6_K and Q4_0 blocks regrouped once (il_repack_q4k / _q6k / _q40, below) */
static void il_repack_q4k(const uint8_t *src, uint8_t *dst, size_t bytes, size_t row_bytes);
static void il_repack_q6k(const uint8_t *src, uint8_t *dst, size_t bytes, size_t row_bytes);
static void il_repack_q40(const uint8_t *src, uint8_t *dst, size_t bytes, size_t row_bytes);
#define MMQ_REPACK(dt)                                                                             \
    ((dt) == TS_DTYPE_Q4_K   ? il_repack_q4k                                                       \
     : (dt) == TS_DTYPE_Q6_K ? il_repack_q6k                                                       \
     : (dt) == TS_DTYPE_Q4_0 ? il_repack_q40                                                       \
                             : NULL)

#include "backend/cpu/matmul_q_simd.h"

/* The regrouped K-quant blocks. Row r of a 256-element chunk in the interleaved order
 * (cpu_q8act_interleave) holds in dword lane i elements 4 (2r + i / 8) .. + 3 of block i % 8.
 * The file's layout put the codes there with four two-source permutes a chunk (Q6_K: four
 * more permutes and eight variable shifts); on Zen 5, whose cores run a 512-bit permute or
 * VNNI dot once a cycle where they run 512-bit ands twice, those were a fifth of the hot
 * kernel's time. So the weights are regrouped once, on first use (weight_cache.h), into the
 * rows the dots read, in the same 144 / 210 bytes a block, and decoded with ands and shifts:
 * - Q4_K: code bytes q (0-63) = row 0 | row 2 << 4, 64 + q = row 1 | row 3 << 4 (row r's codes
 *   at byte q of the row); the scales, d and dmin as they were.
 * - Q6_K: ql bytes q = the low 4 bits of rows 0 | 1 << 4, 64 + q = of rows 2 | 3 << 4, qh byte
 *   q = the top 2 bits of rows 0, 1, 2, 3 at bits 0, 2, 4, 6; the 16 scales in the order of
 *   il_q6k_sums (0, 2, .. 14, 1, 3, .. 15); d as it was.
 * The regrouping takes the file's codes to those rows with the permutes the decoder used to
 * run per token (the tables below).
 *
 * Q4_K, row k, dword lane i: block s = i % 8 is nibble s % 2 of code bytes 32 * (s / 2) ..,
 * and the lane takes code dword 2k + i / 8 of it: 8 * (s / 2) + 2k + i / 8 of the 32. */
static const _Alignas(64) int32_t IL_Q4K_IDX[4][16] = {
    {0, 0, 8, 8, 16, 16, 24, 24, 1, 1, 9, 9, 17, 17, 25, 25},
    {2, 2, 10, 10, 18, 18, 26, 26, 3, 3, 11, 11, 19, 19, 27, 27},
    {4, 4, 12, 12, 20, 20, 28, 28, 5, 5, 13, 13, 21, 21, 29, 29},
    {6, 6, 14, 14, 22, 22, 30, 30, 7, 7, 15, 15, 23, 23, 31, 31},
};
/* odd blocks are high nibbles: the lane shifted down by 4 */
static const _Alignas(64) int32_t IL_Q4K_NIB_SHIFT[16] = {0, 4, 0, 4, 0, 4, 0, 4,
                                                          0, 4, 0, 4, 0, 4, 0, 4};

static void il_repack_q4k(const uint8_t *src, uint8_t *dst, size_t bytes, size_t row_bytes) {
    (void)row_bytes; /* rows are whole super-blocks */
    const __m512i low4 = _mm512_set1_epi8(15), sh = _mm512_load_si512(IL_Q4K_NIB_SHIFT);
    for (size_t o = 0; o < bytes; o += sizeof(ts_block_q4_K)) {
        const ts_block_q4_K *k = (const ts_block_q4_K *)(src + o);
        ts_block_q4_K *out = (ts_block_q4_K *)(dst + o);
        const __m512i q0 = _mm512_loadu_si512(k->qs), q1 = _mm512_loadu_si512(k->qs + 64);
        __m512i z[4];
        for (int r = 0; r < 4; r++)
            z[r] = _mm512_and_si512(
                _mm512_srlv_epi32(
                    _mm512_permutex2var_epi32(q0, _mm512_load_si512(IL_Q4K_IDX[r]), q1), sh),
                low4);
        memmove(out, k, offsetof(ts_block_q4_K, qs));
        _mm512_storeu_si512(out->qs, _mm512_or_si512(z[0], _mm512_slli_epi32(z[2], 4)));
        _mm512_storeu_si512(out->qs + 64, _mm512_or_si512(z[1], _mm512_slli_epi32(z[3], 4)));
    }
}

/* Q4_0 block s: d at byte 18s; code byte j at 18s + 2 + j holds element j (low nibble) and
 * j + 16 (high). X_h (h = 0, 1), dword lane i: code dword 2h + i / 8 of block i % 8, i.e.
 * words 9s + 1 + 2 (2h + i / 8) and the next; rows h and h + 2 are its low and high nibbles.
 * Block 7's codes (bytes 128..143) lie past the two vectors: 0 here, then words
 * 2 (2h + i / 8) .. of a third vector merged into its lanes. */
static const _Alignas(64) int16_t IL_Q40_IDX[2][32] = {
    {1, 2, 10, 11, 19, 20, 28, 29, 37, 38, 46, 47, 55, 56, 0, 0,
     3, 4, 12, 13, 21, 22, 30, 31, 39, 40, 48, 49, 57, 58, 0, 0},
    {5, 6, 14, 15, 23, 24, 32, 33, 41, 42, 50, 51, 59, 60, 0, 0,
     7, 8, 16, 17, 25, 26, 34, 35, 43, 44, 52, 53, 61, 62, 0, 0},
};
static const _Alignas(64) int16_t IL_Q40_IDX7[2][32] = {
    {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
     2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
    {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5,
     6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
};
/* the fp16 scales of the 8 blocks: words 9s */
static const _Alignas(64) int16_t IL_Q40_D[32] = {0, 9, 18, 27, 36, 45, 54, 63};

/* Q5_0 block s (22 bytes): d at word 11s, qh (32 high bits) at words 11s + 1, 11s + 2, codes
 * as Q4_0's from word 11s + 3. X_h lanes as Q4_0's: code dword 2h + i / 8 of block i % 8. Words
 * 0..63 come from bytes 0..127 (IDX); the words marked in B_MASK lie in bytes 128..175, taken
 * from a third vector (IDX_B). QHD: words 0-15 the qh of blocks 0-7 (dword s), words 16-23
 * their d. */
static const _Alignas(64) int16_t IL_Q50_IDX[2][32] = {
    {3, 4, 14, 15, 25, 26, 36, 37, 47, 48, 58, 59, 0, 0, 0, 0,
     5, 6, 16, 17, 27, 28, 38, 39, 49, 50, 60, 61, 0, 0, 0, 0},
    {7, 8, 18, 19, 29, 30, 40, 41, 51, 52, 62, 63, 0, 0, 0, 0,
     9, 10, 20, 21, 31, 32, 42, 43, 53, 54, 0, 0, 0, 0, 0, 0},
};
static const _Alignas(64) int16_t IL_Q50_IDX_B[2][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 6, 16, 17,
     0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 8, 18, 19},
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 10, 20, 21,
     0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 11, 12, 22, 23},
};
static const __mmask32 IL_Q50_B_MASK[2] = {0xf000f000u, 0xfc00f000u};
static const _Alignas(64) int16_t IL_Q50_QHD[32] = {1, 2, 12, 13, 23, 24, 34, 35, 45, 46, 56, 57,
                                                    0, 0, 0, 0, 0, 11, 22, 33, 44, 55};
static const _Alignas(64) int16_t IL_Q50_QHD_B[32] = {0, 0, 0, 0, 0, 0, 0, 0,  0,  0, 0,
                                                      0, 3, 4, 14, 15, 0, 0, 0, 0, 0, 0, 2, 13};
#define IL_Q50_QHD_B_MASK ((__mmask32)0x00c0f000u)
/* Code vector r holds elements 8r + 4 (i / 8) + k of block i % 8 in byte k of dword lane i:
 * their fifth bits are bits 4 (i / 8) + k of byte r of the block's qh. IL_Q50_REP[r] copies
 * byte r of each dword to its four bytes, IL_Q50_BIT picks bit k (lanes 0-7) or 4 + k. */
static const _Alignas(64) int8_t IL_Q50_REP[4][16] = {
    {0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12},
    {1, 1, 1, 1, 5, 5, 5, 5, 9, 9, 9, 9, 13, 13, 13, 13},
    {2, 2, 2, 2, 6, 6, 6, 6, 10, 10, 10, 10, 14, 14, 14, 14},
    {3, 3, 3, 3, 7, 7, 7, 7, 11, 11, 11, 11, 15, 15, 15, 15},
};
static const _Alignas(64) uint8_t IL_Q50_BIT[64] = {
    1,  2,  4,  8,  1,  2,  4,  8,  1,  2,  4,  8,  1,  2,  4,  8,
    1,  2,  4,  8,  1,  2,  4,  8,  1,  2,  4,  8,  1,  2,  4,  8,
    16, 32, 64, 128, 16, 32, 64, 128, 16, 32, 64, 128, 16, 32, 64, 128,
    16, 32, 64, 128, 16, 32, 64, 128, 16, 32, 64, 128, 16, 32, 64, 128,
};

/* Q8_0: the fp16 scale of block s at word 17s of its 8-block group (272 bytes): words
 * 0, 17, 34, 51 of the first 128 bytes in lanes 0-3, 4, 21, 38, 55 of the next in lanes 4-7 */
static const _Alignas(64) int16_t IL_Q80_D[32] = {0, 17, 34, 51, 4, 21, 38, 55};

/* Q6_K, row k, dword lane i: block s = i % 8 = 4h + j (j = quarter of half h) holds, for
 * element l, ql byte 64h + 32 (j % 2) + l (nibble j / 2) and qh byte 32h + l (bits 2j, 2j + 1);
 * the lane's l = 4 (2k + i / 8) gives ql dword 16h + 8 (j % 2) + 2k + i / 8, qh dword
 * 8h + 2k + i / 8. Rows 0-1 are elements 0-15 of each block (its first 16-element scale),
 * rows 2-3 elements 16-31. */
static const _Alignas(64) int32_t IL_Q6K_QL[4][16] = {
    {0, 8, 0, 8, 16, 24, 16, 24, 1, 9, 1, 9, 17, 25, 17, 25},
    {2, 10, 2, 10, 18, 26, 18, 26, 3, 11, 3, 11, 19, 27, 19, 27},
    {4, 12, 4, 12, 20, 28, 20, 28, 5, 13, 5, 13, 21, 29, 21, 29},
    {6, 14, 6, 14, 22, 30, 22, 30, 7, 15, 7, 15, 23, 31, 23, 31},
};
static const _Alignas(64) int32_t IL_Q6K_QH[4][16] = {
    {0, 0, 0, 0, 8, 8, 8, 8, 1, 1, 1, 1, 9, 9, 9, 9},
    {2, 2, 2, 2, 10, 10, 10, 10, 3, 3, 3, 3, 11, 11, 11, 11},
    {4, 4, 4, 4, 12, 12, 12, 12, 5, 5, 5, 5, 13, 13, 13, 13},
    {6, 6, 6, 6, 14, 14, 14, 14, 7, 7, 7, 7, 15, 15, 15, 15},
};
/* nibble j / 2 of ql; qh bits 2j, 2j + 1 of every byte rotated to bits 4, 5 */
static const _Alignas(64) int32_t IL_Q6K_SHIFT[16] = {0, 0, 4, 4, 0, 0, 4, 4,
                                                      0, 0, 4, 4, 0, 0, 4, 4};
static const _Alignas(64) int32_t IL_Q6K_ROT[16] = {4, 2, 0, 30, 4, 2, 0, 30,
                                                    4, 2, 0, 30, 4, 2, 0, 30};

static void il_repack_q6k(const uint8_t *src, uint8_t *dst, size_t bytes, size_t row_bytes) {
    (void)row_bytes; /* rows are whole super-blocks */
    const __m512i low4 = _mm512_set1_epi8(15);
    for (size_t o = 0; o < bytes; o += sizeof(ts_block_q6_K)) {
        const ts_block_q6_K *k = (const ts_block_q6_K *)(src + o);
        ts_block_q6_K *out = (ts_block_q6_K *)(dst + o);
        const __m512i l0 = _mm512_loadu_si512(k->ql), l1 = _mm512_loadu_si512(k->ql + 64);
        const __m512i h = _mm512_loadu_si512(k->qh);
        __m512i z[4];
        for (int r = 0; r < 4; r++) { /* row r's 6-bit codes */
            __m512i lo = _mm512_permutex2var_epi32(l0, _mm512_load_si512(IL_Q6K_QL[r]), l1);
            lo = _mm512_and_si512(_mm512_srlv_epi32(lo, _mm512_load_si512(IL_Q6K_SHIFT)), low4);
            __m512i hi = _mm512_permutexvar_epi32(_mm512_load_si512(IL_Q6K_QH[r]), h);
            hi = _mm512_and_si512(_mm512_rolv_epi32(hi, _mm512_load_si512(IL_Q6K_ROT)),
                                  _mm512_set1_epi8(0x30));
            z[r] = _mm512_or_si512(lo, hi);
        }
        _mm512_storeu_si512(
            out->ql, _mm512_ternarylogic_epi32(low4, z[0], _mm512_slli_epi16(z[1], 4), 0xca));
        _mm512_storeu_si512(
            out->ql + 64, _mm512_ternarylogic_epi32(low4, z[2], _mm512_slli_epi16(z[3], 4), 0xca));
        /* top 2 bits of each row: z0 bits 4-5 to 0-1, z1 to 2-3, z2 stay at 4-5, z3 to 6-7 */
        const __m512i t01 =
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(z[0], 4), _mm512_set1_epi8(0x03)),
                            _mm512_and_si512(_mm512_srli_epi16(z[1], 2), _mm512_set1_epi8(0x0c)));
        const __m512i t23 = _mm512_or_si512(
            _mm512_and_si512(z[2], _mm512_set1_epi8(0x30)),
            _mm512_and_si512(_mm512_slli_epi16(z[3], 2), _mm512_set1_epi8((char)0xc0)));
        _mm512_storeu_si512(out->qh, _mm512_or_si512(t01, t23));
        _mm_storeu_si128(
            (__m128i *)out->scales,
            _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)k->scales),
                             _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15)));
        out->d = k->d;
    }
}

/* dword lanes 7 and 15 (block 7) as a word mask */
#define IL_BLOCK7_WORDS ((__mmask32)0xc000c000u)

/* 8 blocks decoded for the interleaved tile: z[4] in the order of cpu_q8act_interleave (_q8;
 * Q4_K's z[2], z[3] hold 16 times the codes, il_accumulate takes that back); scale: the 8 block
 * scales (Q4_0, Q8_0: d; Q4_K: d * sc); offset: what each block's activation sum s is multiplied by
 * and subtracted (Q4_0: 8 d, Q8_0: 128 d, Q4_K: dmin * m). Q6_K: scale16, d * sc of the 16
 * sub-blocks, the first 16 elements of blocks 0-7 in lanes 0-7 and their last 16 in lanes 8-15 (the
 * order il_q6k_sums leaves the integer sums in). */
typedef struct {
    __m512i z[4];
    __m256 scale, offset;
    __m512 scale16;
} il_weights;
_Static_assert(sizeof(il_weights) * MMQ_R * MMQ_IL_DEC_CHUNKS == MMQ_IL_DEC_BYTES,
               "MMQ_IL_DEC_BYTES: the size of the decoded chunks");

INLINE void il_decode(ts_dtype dt, const uint8_t *p, il_weights *wt) {
    const __m512i low4 = _mm512_set1_epi8(15);
    __m512i *z = wt->z;
    __m256 *scale = &wt->scale, *offset = &wt->offset;
    if (dt == TS_DTYPE_Q4_K) { /* regrouped (il_repack_q4k): rows 2, 3 kept 16 times over */
        const ts_block_q4_K *k = (const ts_block_q4_K *)p;
        const __m512i q0 = _mm512_loadu_si512(k->qs), q1 = _mm512_loadu_si512(k->qs + 64);
        z[0] = _mm512_and_si512(q0, low4);
        z[1] = _mm512_and_si512(q1, low4);
        z[2] = _mm512_andnot_si512(low4, q0);
        z[3] = _mm512_andnot_si512(low4, q1);
        /* the 6-bit fields (layout in quant.h) as bytes sc[0..7], m[0..7]: low bits from
         * bytes 0-3 (sc 0-3), 8-11 low nibbles (sc 4-7), 4-7 (m 0-3), 8-11 high nibbles
         * (m 4-7); bits 4-5 of sc / m 4-7 from the top bits of bytes 0-3 / 4-7 */
        const __m128i raw = _mm_loadu_si128((const __m128i *)k->scales); /* + 4 code bytes */
        __m128i lo = _mm_shuffle_epi8(
            raw, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
        lo = _mm_mask_blend_epi8(0xf000, lo, _mm_srli_epi16(lo, 4));
        lo = _mm_and_si128(lo, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
        __m128i hi = _mm_shuffle_epi8(
            raw, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
        hi = _mm_and_si128(_mm_srli_epi16(hi, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
        const __m512 scm = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_or_si128(lo, hi)));
        uint32_t dd;
        memcpy(&dd, &k->d, 4); /* d, dmin */
        const __m512 dv =
            _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                  _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dd))));
        const __m512 prod = _mm512_mul_ps(scm, dv);
        *scale = _mm512_castps512_ps256(prod);
        *offset = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(prod), 1));
    } else if (dt == TS_DTYPE_Q6_K) { /* regrouped (il_repack_q6k) */
        const ts_block_q6_K *k = (const ts_block_q6_K *)p;
        const __m512i l01 = _mm512_loadu_si512(k->ql), l23 = _mm512_loadu_si512(k->ql + 64);
        const __m512i h = _mm512_loadu_si512(k->qh), top2 = _mm512_set1_epi8(0x30);
        /* low 4 bits where low4 is set, else the 2 high bits already in place (0xca: a ? b : c) */
        z[0] = _mm512_ternarylogic_epi32(low4, l01, _mm512_and_si512(_mm512_slli_epi16(h, 4), top2),
                                         0xca);
        z[1] = _mm512_ternarylogic_epi32(low4, _mm512_srli_epi16(l01, 4),
                                         _mm512_and_si512(_mm512_slli_epi16(h, 2), top2), 0xca);
        z[2] = _mm512_ternarylogic_epi32(low4, l23, _mm512_and_si512(h, top2), 0xca);
        z[3] = _mm512_ternarylogic_epi32(low4, _mm512_srli_epi16(l23, 4),
                                         _mm512_and_si512(_mm512_srli_epi16(h, 2), top2), 0xca);
        wt->scale16 = _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)k->scales))),
            _mm512_set1_ps(_cvtsh_ss(k->d)));
    } else if (dt == TS_DTYPE_Q8_0) {
        /* blocks of 34 bytes: codes of block s at 34s + 2. Pairs of blocks [s | s + 1] as
         * qwords 0-3 / 4-7; then qword k of blocks 0-3 and of 4-7 into the halves of row k */
        __m512i pair[4], lo[2], hi[2];
        UNROLL(4)
        for (int i = 0; i < 4; i++)
            pair[i] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 68 * i + 2))),
                _mm256_loadu_si256((const __m256i *)(p + 68 * i + 36)), 1);
        const __m512i k01 = _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13);
        const __m512i k23 = _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15);
        UNROLL(4)
        for (int h = 0; h < 2; h++) {
            lo[h] = _mm512_permutex2var_epi64(pair[2 * h], k01, pair[2 * h + 1]);
            hi[h] = _mm512_permutex2var_epi64(pair[2 * h], k23, pair[2 * h + 1]);
        }
        /* signed codes + 128 as the unsigned operand; the 128 comes back through s */
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        z[0] = _mm512_xor_si512(_mm512_shuffle_i64x2(lo[0], lo[1], 0x44), flip);
        z[1] = _mm512_xor_si512(_mm512_shuffle_i64x2(lo[0], lo[1], 0xee), flip);
        z[2] = _mm512_xor_si512(_mm512_shuffle_i64x2(hi[0], hi[1], 0x44), flip);
        z[3] = _mm512_xor_si512(_mm512_shuffle_i64x2(hi[0], hi[1], 0xee), flip);
        /* d of block s: word 17s of bytes 0..127 (s < 4), word 17s - 64 of bytes 128..255 */
        const __m512i dlo = _mm512_permutex2var_epi16(
            _mm512_loadu_si512(p), _mm512_load_si512(IL_Q80_D), _mm512_loadu_si512(p + 64));
        const __m512i dhi = _mm512_permutex2var_epi16(
            _mm512_loadu_si512(p + 128), _mm512_load_si512(IL_Q80_D), _mm512_loadu_si512(p + 192));
        const __m256 d =
            _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_mask_blend_epi16(0xf0, dlo, dhi)));
        *scale = d;
        *offset = _mm256_mul_ps(d, _mm256_set1_ps(128.0f));
    } else if (dt == TS_DTYPE_Q5_0) {
        /* 176 bytes: the last 48 by a masked load, which reads nothing past the chunk */
        const __m512i a0 = _mm512_loadu_si512(p), a1 = _mm512_loadu_si512(p + 64);
        const __m512i a2 = _mm512_maskz_loadu_epi8((__mmask64)0xffffffffffffull, p + 128);
        __m512i qhd = _mm512_permutex2var_epi16(a0, _mm512_load_si512(IL_Q50_QHD), a1);
        qhd = _mm512_mask_permutexvar_epi16(qhd, IL_Q50_QHD_B_MASK,
                                            _mm512_load_si512(IL_Q50_QHD_B), a2);
        const __m512i qh = _mm512_shuffle_i64x2(qhd, qhd, 0x44); /* dwords i and i + 8: block i */
        const __m512i bits = _mm512_load_si512(IL_Q50_BIT), fifth = _mm512_set1_epi8(0x10);
        UNROLL(4)
        for (int h = 0; h < 2; h++) {
            __m512i x = _mm512_permutex2var_epi16(a0, _mm512_load_si512(IL_Q50_IDX[h]), a1);
            x = _mm512_mask_permutexvar_epi16(x, IL_Q50_B_MASK[h],
                                              _mm512_load_si512(IL_Q50_IDX_B[h]), a2);
            z[h] = _mm512_and_si512(x, low4);
            z[h + 2] = _mm512_and_si512(_mm512_srli_epi16(x, 4), low4);
        }
        UNROLL(4)
        for (int r = 0; r < 4; r++) {
            const __m512i rep = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)IL_Q50_REP[r]));
            const __mmask64 hb = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, rep), bits);
            z[r] = _mm512_mask_add_epi8(z[r], hb, z[r], fifth);
        }
        const __m256 d = _mm256_cvtph_ps(_mm512_extracti32x4_epi32(qhd, 2));
        *scale = d;
        *offset = _mm256_mul_ps(d, _mm256_set1_ps(16.0f));
    } else { /* Q4_0, regrouped (il_repack_q40): the 8 scales, then X_0 and X_1 */
        UNROLL(4)
        for (int h = 0; h < 2; h++) {
            const __m512i x = _mm512_loadu_si512(p + 16 + 64 * h);
            z[h] = _mm512_and_si512(x, low4);
            z[h + 2] = _mm512_and_si512(_mm512_srli_epi16(x, 4), low4);
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        *scale = d;
        *offset = _mm256_mul_ps(d, _mm256_set1_ps(8.0f));
    }
}

/* Q4_0 regrouped: each row's whole 8-block chunks (144 bytes) as the 8 fp16 scales (16 bytes),
 * then X_0 and X_1 (64 bytes each, their low nibbles rows 0 / 1, high rows 2 / 3), where the
 * file's layout took two permutes and two merges of block 7's words a chunk for them and one
 * permute for the scales; a row's last n / 32 % 8 blocks stay as they are (il_tail reads them). */
static void il_repack_q40(const uint8_t *src, uint8_t *dst, size_t bytes, size_t row_bytes) {
    const size_t chunks = row_bytes / sizeof(ts_block_q4_0) / 8, whole = 144 * chunks;
    for (size_t r = 0; r < bytes; r += row_bytes) {
        for (size_t c = 0; c < whole; c += 144) {
            const uint8_t *p = src + r + c;
            uint8_t *o = dst + r + c;
            const __m512i a0 = _mm512_loadu_si512(p), a1 = _mm512_loadu_si512(p + 64);
            const __m512i b7 = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + 128)));
            __m512i x[2];
            for (int h = 0; h < 2; h++) {
                x[h] = _mm512_permutex2var_epi16(a0, _mm512_load_si512(IL_Q40_IDX[h]), a1);
                x[h] = _mm512_mask_permutexvar_epi16(x[h], IL_BLOCK7_WORDS,
                                                     _mm512_load_si512(IL_Q40_IDX7[h]), b7);
            }
            const __m128i d = _mm512_castsi512_si128(
                _mm512_permutex2var_epi16(a0, _mm512_load_si512(IL_Q40_D), a1));
            _mm_storeu_si128((__m128i *)o, d);
            _mm512_storeu_si512(o + 16, x[0]);
            _mm512_storeu_si512(o + 80, x[1]);
        }
        memmove(dst + r + whole, src + r + whole, row_bytes - whole);
    }
}

/* The bytes of one block of 32 of the types whose rows may end in a tail of blocks. */
INLINE int il_block_bytes(ts_dtype dt) {
    return dt == TS_DTYPE_Q8_0 ? 34 : dt == TS_DTYPE_Q5_0 ? 22 : 18;
}

/* The bytes of one chunk of 8 blocks (a K-quant super-block). */
INLINE int il_chunk_bytes(ts_dtype dt) {
    switch (dt) {
    case TS_DTYPE_Q8_0: return 272;
    case TS_DTYPE_Q6_K: return 210;
    case TS_DTYPE_Q5_0: return 176;
    default: return 144; /* Q4_0, Q4_K */
    }
}

/* A row's last nt blocks (1-7, after its whole chunks; from block b0), natural order, for R
 * rows (a tile's MMQ_R, a stream pass's one or two) and T tokens: each block's 8-lane dot
 * product folded into one lane a block (up to 4 blocks by two hadd levels, 5-7 by mmq_fold8;
 * the missing blocks zero), so the scales and the codes' offset apply once for the tail on 8
 * lanes instead of once per block (a block at a time was ~10 operations a block: Gemma 3's Q8_0
 * head, rows of 2 chunks and 4 such blocks, read 5.7% faster with the tail's sums left out). */
INLINE void il_tail(ts_dtype dt, const uint8_t *const *w, int bb, const cpu_q8act *A, int64_t b0,
                    int nt, __m256 acc[MMQ_R][MMQ_T], int R, int T) {
    const float off = dt == TS_DTYPE_Q8_0 ? -128.0f : dt == TS_DTYPE_Q5_0 ? -16.0f : -8.0f;
    const __mmask8 m = (__mmask8)((1u << nt) - 1);
    UNROLL(8)
    for (int q = 0; q < R; q++) {
        const uint8_t *blk = w[q] + (size_t)bb * (size_t)b0;
        __m128i h = _mm_setzero_si128();
        __m256i u[8];
        UNROLL(8)
        for (int j = 0; j < 8; j++) {
            u[j] = _mm256_setzero_si256();
            if (j >= nt) continue;
            const uint8_t *p = blk + (size_t)j * (size_t)bb;
            uint16_t hj;
            memcpy(&hj, p, 2);
            h = _mm_mask_set1_epi16(h, (__mmask8)(1u << j), (short)hj);
            u[j] = mmq_32_codes(dt, p);
            if (dt == TS_DTYPE_Q8_0) /* signed codes + 128 as the unsigned operand */
                u[j] = _mm256_xor_si256(u[j], _mm256_set1_epi8((char)0x80));
        }
        const __m256 dw = _mm256_cvtph_ps(h);
        UNROLL(8)
        for (int t = 0; t < T; t++) {
            __m256i d[8];
            mmq_dot8(u, A[t].q + 32 * b0, nt, d);
            __m256i tot;
            if (nt <= 4) { /* blocks 0-3: one hadd level less, the upper lanes zero */
                const __m256i g = _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]),
                                                    _mm256_hadd_epi32(d[2], d[3]));
                tot = _mm256_zextsi128_si256(
                    _mm_add_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1)));
            } else {
                tot = mmq_fold8(d, NULL, NULL);
            }
            const __m256 fi = _mm256_cvtepi32_ps(tot);
            const __m256 da = _mm256_maskz_loadu_ps(m, A[t].d + b0);
            const __m256 sa = _mm256_maskz_loadu_ps(m, A[t].s + b0);
            const __m256 f = _mm256_fmadd_ps(fi, da, _mm256_mul_ps(sa, _mm256_set1_ps(off)));
            acc[q][t] = _mm256_fmadd_ps(f, dw, acc[q][t]);
        }
    }
}

/* One decoded chunk ch of a row against the tile's T tokens, into acc[0 .. T). */
INLINE void il_accumulate(ts_dtype dt, const il_weights *wt, const cpu_q8act *A, int64_t ch,
                          __m256 *acc, int T) {
    UNROLL(8)
    for (int t = 0; t < T; t++) {
        const int8_t *aq = A[t].q + 256 * ch;
        __m256 da = _mm256_loadu_ps(A[t].d + 8 * ch);
        __m512i s = _mm512_setzero_si512();
        if (dt == TS_DTYPE_Q4_K) {
            /* rows 0, 1 as codes, rows 2, 3 as 16 codes: 16 s + t is 16 times each sum,
             * exactly (< 2^24), and da / 16 takes the 16 back, exactly, as fp32 scaling by
             * a power of two does - so the bits of a decoder that kept every code as is */
            __m512i t16 = _mm512_setzero_si512();
            s = _mm512_dpbusd_epi32(s, wt->z[0], _mm512_loadu_si512(aq));
            t16 = _mm512_dpbusd_epi32(t16, wt->z[2], _mm512_loadu_si512(aq + 128));
            s = _mm512_dpbusd_epi32(s, wt->z[1], _mm512_loadu_si512(aq + 64));
            t16 = _mm512_dpbusd_epi32(t16, wt->z[3], _mm512_loadu_si512(aq + 192));
            s = _mm512_add_epi32(_mm512_slli_epi32(s, 4), t16);
            da = _mm256_mul_ps(da, _mm256_set1_ps(0.0625f));
        } else {
            UNROLL(4)
            for (int r = 0; r < 4; r++)
                s = _mm512_dpbusd_epi32(s, wt->z[r], _mm512_loadu_si512(aq + 64 * r));
        }
        /* the 8 block sums: Q8_0 lanes 2j + 2j + 1, else lanes j + j + 8 */
        const __m256i s8 =
            dt == TS_DTYPE_Q8_0
                ? _mm512_cvtepi64_epi32(_mm512_add_epi32(s, _mm512_srli_epi64(s, 32)))
                : _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s8), _mm256_mul_ps(wt->scale, da), acc[t]);
        acc[t] = _mm256_fnmadd_ps(wt->offset, _mm256_loadu_ps(A[t].s + 8 * ch), acc[t]);
    }
}

/* Rows q0 .. q0 + RS of the tile over all whole chunks, into acc[q0 ..][0 .. T): decoded here,
 * or (dec) taken from the row block decoded once (dec[q * chunks + ch]); the same operations
 * on the same values either way. Each chunk step prefetches pf_step bytes of the row block
 * ahead (see mmq_il_tile). */
INLINE void il_rows(ts_dtype dt, const uint8_t *const *w, const uint8_t *pf, size_t pf_step,
                    const cpu_q8act *A, int64_t chunks, __m256 acc[MMQ_R][MMQ_T], int q0, int RS,
                    int T, const il_weights *dec) {
    const int cb = il_chunk_bytes(dt);
    for (int64_t ch = 0; ch < chunks; ch++) {
        if (pf) mmq_prefetch_step(pf, (size_t)ch, (int)pf_step);
        UNROLL(8)
        for (int q = q0; q < q0 + RS; q++) {
            if (dec) {
                il_accumulate(dt, &dec[(size_t)q * (size_t)chunks + (size_t)ch], A, ch, acc[q], T);
            } else {
                il_weights wt;
                il_decode(dt, w[q] + (size_t)cb * (size_t)ch, &wt);
                il_accumulate(dt, &wt, A, ch, acc[q], T);
            }
        }
    }
}

/* The 16 sub-block sums of one Q6_K super-block against one token, as fp32: lanes 0-7 the
 * first 16 elements of blocks 0-7 (rows 0-1 of the interleave), lanes 8-15 the last 16. */
INLINE __m512 il_q6k_sums(const il_weights *wt, const int8_t *aq) {
    __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wt->z[0], _mm512_loadu_si512(aq));
    __m512i s1 =
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), wt->z[2], _mm512_loadu_si512(aq + 128));
    s0 = _mm512_dpbusd_epi32(s0, wt->z[1], _mm512_loadu_si512(aq + 64));
    s1 = _mm512_dpbusd_epi32(s1, wt->z[3], _mm512_loadu_si512(aq + 192));
    /* lanes j and j + 8 of each are block j: [s0 lo + s0 hi | s1 lo + s1 hi] */
    const __m512i s =
        _mm512_add_epi32(_mm512_shuffle_i64x2(s0, s1, 0x44), _mm512_shuffle_i64x2(s0, s1, 0xee));
    return _mm512_cvtepi32_ps(s);
}

/* Q6_K: as il_rows, with 16-lane accumulators (one lane per sub-block scale). Per token and
 * super-block, the activation scales of the 8 blocks twice (da2) and 32 s16 in the order of
 * scale16 (s16x32) are formed once for all rows; per row and token that leaves the dots, one
 * convert, one multiply and two FMAs (the offset 32 of the codes through s16). */
INLINE void il_q6k_accumulate(const il_weights *wt, const cpu_q8act *A, int64_t ch,
                              const __m512 *da2, const __m512 *s16x32, __m512 *acc, int T) {
    UNROLL(8)
    for (int t = 0; t < T; t++) {
        const __m512 f = il_q6k_sums(wt, A[t].q + 256 * ch);
        acc[t] = _mm512_fmadd_ps(f, _mm512_mul_ps(wt->scale16, da2[t]), acc[t]);
        acc[t] = _mm512_fnmadd_ps(wt->scale16, s16x32[t], acc[t]);
    }
}

/* Chunk ch's activation scales for il_q6k_accumulate, T tokens: da2 and s16x32 above. */
INLINE void il_q6k_chunk_scales(const cpu_q8act *A, int64_t ch, int T, __m512 *da2,
                                __m512 *s16x32) {
    const __m512i even_odd =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    UNROLL(8)
    for (int t = 0; t < T; t++) {
        da2[t] = _mm512_broadcast_f32x8(_mm256_loadu_ps(A[t].d + 8 * ch));
        s16x32[t] =
            _mm512_mul_ps(_mm512_permutexvar_ps(even_odd, _mm512_loadu_ps(A[t].s16 + 16 * ch)),
                          _mm512_set1_ps(32.0f));
    }
}

INLINE void il_rows_q6k(const uint8_t *const *w, const uint8_t *pf, size_t pf_step,
                        const cpu_q8act *A, int64_t chunks, __m512 acc[MMQ_R][MMQ_T], int q0,
                        int RS, int T, const il_weights *dec) {
    for (int64_t ch = 0; ch < chunks; ch++) {
        if (pf) mmq_prefetch_step(pf, (size_t)ch, (int)pf_step);
        __m512 da2[MMQ_T], s16x32[MMQ_T];
        il_q6k_chunk_scales(A, ch, T, da2, s16x32);
        UNROLL(8)
        for (int q = q0; q < q0 + RS; q++) {
            if (dec) {
                il_q6k_accumulate(&dec[(size_t)q * (size_t)chunks + (size_t)ch], A, ch, da2,
                                  s16x32, acc[q], T);
            } else {
                il_weights wt;
                il_decode(TS_DTYPE_Q6_K, w[q] + (size_t)il_chunk_bytes(TS_DTYPE_Q6_K) * (size_t)ch,
                          &wt);
                il_q6k_accumulate(&wt, A, ch, da2, s16x32, acc[q], T);
            }
        }
    }
}

/* Q6_K's 16-lane sums of R rows, T tokens, as the 8 lanes the other types keep. */
INLINE void il_q6k_fold(__m512 acc16[MMQ_R][MMQ_T], __m256 acc[MMQ_R][MMQ_T], int R, int T) {
    UNROLL(8)
    for (int q = 0; q < R; q++) {
        UNROLL(8)
        for (int t = 0; t < T; t++)
            acc[q][t] = _mm256_add_ps(_mm512_castps512_ps256(acc16[q][t]),
                                      _mm512_extractf32x8_ps(acc16[q][t], 1));
    }
}

/* Decode of one to eight tokens (seq, mmq_run): the job's rows as one stream in passes of two
 * rows (which share each chunk's activations and Q6_K's per-chunk scales; every type went best
 * so, Q8_0 included: a row a pass was 5% slower, four rows 4%), a row's tail of blocks at the
 * end of its pass (il_tail), each chunk step asking for the lines pf bytes past the bytes it has
 * reached into L1 (prefetcht0) and those 3 pf bytes past into L2 (prefetcht1) - one running line
 * offset over the job's weights and on past their end. The same operations per row as mmq_il_tile,
 * so the same bits.
 *
 * Against the row-block tile (4 rows a block and their setup, the next row block prefetched
 * into L2), on the Intel Xeon VM: 0.8B tg128 Q4_K_M +12-18%, Q4_0 +12-15%, Q8_0 +15% with the
 * L1 prefetch alone; the L2 one then Q4_K_M +13-17%, Q4_0 +10-13%, Q8_0 +10-16%
 * (bench/RESULTS.md). Neither part of the first step gains alone: the stream with prefetcht1
 * (2 KB on) gained ~5%, the tile with prefetcht0 lost 10% (its distance, whole row blocks, is
 * 8 KB for rows of 3584 columns). The L2 distance 2, 3, 4 or 6 pf (prefetcht1; prefetcht2
 * alike) gave +8-13%, level within the noise. Rows with a tail (Gemma 3's 640 columns) in the
 * stream as well: the Gemma 3 270M GGUF +22%; mmq_run keeps a call of its own for rows of whole
 * chunks, where the compiler knows there is no tail (one call site for both cost the 0.8B
 * 15%).
 *
 * Three and four tokens (speculative decoding's checks, a few requests at once) went to the
 * row-block tile at first, which there takes a row a pass and streams the weights at about half
 * the rate: 248320 x 1024 (the 0.8B's output head) on two threads of the Intel Xeon VM, Q4_K
 * 3 tokens 9.95 -> 6.14 ms, 4 tokens 11.4 -> 7.1 (2 tokens: 5.3); Q6_K 11.9 -> 8.6 and 13.0 ->
 * 9.7; Q8_0 12.7 -> 9.8 and 16.2 -> 10.8 (test_quant --bench decode). A row a pass for three
 * or four tokens measured level with two (within +-10%, mixed by type), so up to four take
 * two. Five to eight tokens (several requests at once) likewise, a row a pass, its chunks
 * decoded once for two groups of accumulators: Q4_K 8.9 - 13.4 ms against the tile's 12.3 -
 * 19.2, Q6_K 9.9 - 13.9 against 15.0 - 22.8, Q8_0 10.8 - 13.4 against 16.8 - 22.4; two rows a
 * pass there spilled (Q4_K 11.6 - 17.4). */

/* Lines from *done (an offset from the 64-aligned base) up to end, asked for pf bytes on into
 * L1 and 3 pf bytes on into L2. */
INLINE void il_stream_prefetch(const uint8_t *base, size_t *done, size_t end, size_t pf) {
    size_t d = *done;
    for (; d < end; d += 64) {
        _mm_prefetch((const char *)base + d + pf, _MM_HINT_T0);
        _mm_prefetch((const char *)base + d + 3 * pf, _MM_HINT_T1);
    }
    *done = d;
}

/* One pass: RS rows of rb bytes from w[0] (contiguous; chunks whole chunks, then nt blocks),
 * T tokens (up to 2 MMQ_T: tokens from MMQ_T on in a second group of accumulators, each chunk
 * decoded once for both), their sums into y. */
INLINE void il_stream_pass(ts_dtype dt, const uint8_t *const *w, size_t rb, const uint8_t *base,
                           size_t *done, size_t pf, const cpu_q8act *A, int64_t chunks, int nt,
                           float *y, int64_t ldy, int RS, int T) {
    const size_t cb = (size_t)il_chunk_bytes(dt);
    const int T0 = T < MMQ_T ? T : MMQ_T, T1 = T - T0;
    const cpu_q8act *A1 = A + MMQ_T;
    size_t end = (size_t)(w[0] - base);
    __m256 acc[MMQ_R][MMQ_T], acc1[MMQ_R][MMQ_T];
    if (dt == TS_DTYPE_Q6_K) { /* as il_rows_q6k */
        __m512 acc16[MMQ_R][MMQ_T], acc16b[MMQ_R][MMQ_T];
        UNROLL(8)
        for (int q = 0; q < RS; q++) {
            UNROLL(8)
            for (int t = 0; t < T0; t++)
                acc16[q][t] = _mm512_setzero_ps();
            UNROLL(8)
            for (int t = 0; t < T1; t++)
                acc16b[q][t] = _mm512_setzero_ps();
        }
        for (int64_t ch = 0; ch < chunks; ch++) {
            end += (size_t)RS * cb;
            il_stream_prefetch(base, done, end, pf);
            __m512 da2[MMQ_T], s16x32[MMQ_T], da2b[MMQ_T], s16x32b[MMQ_T];
            il_q6k_chunk_scales(A, ch, T0, da2, s16x32);
            if (T1) il_q6k_chunk_scales(A1, ch, T1, da2b, s16x32b);
            UNROLL(8)
            for (int q = 0; q < RS; q++) {
                il_weights wt;
                il_decode(dt, w[q] + cb * (size_t)ch, &wt);
                il_q6k_accumulate(&wt, A, ch, da2, s16x32, acc16[q], T0);
                if (T1) il_q6k_accumulate(&wt, A1, ch, da2b, s16x32b, acc16b[q], T1);
            }
        }
        il_q6k_fold(acc16, acc, RS, T0);
        if (T1) il_q6k_fold(acc16b, acc1, RS, T1);
    } else {
        UNROLL(8)
        for (int q = 0; q < RS; q++) {
            UNROLL(8)
            for (int t = 0; t < T0; t++)
                acc[q][t] = _mm256_setzero_ps();
            UNROLL(8)
            for (int t = 0; t < T1; t++)
                acc1[q][t] = _mm256_setzero_ps();
        }
        for (int64_t ch = 0; ch < chunks; ch++) {
            end += (size_t)RS * cb;
            il_stream_prefetch(base, done, end, pf);
            UNROLL(8)
            for (int q = 0; q < RS; q++) {
                il_weights wt;
                il_decode(dt, w[q] + cb * (size_t)ch, &wt);
                il_accumulate(dt, &wt, A, ch, acc[q], T0);
                if (T1) il_accumulate(dt, &wt, A1, ch, acc1[q], T1);
            }
        }
        if (nt) { /* Q4_0, Q5_0, Q8_0: the rows' last blocks */
            il_stream_prefetch(base, done, (size_t)(w[0] - base) + (size_t)RS * rb, pf);
            il_tail(dt, w, il_block_bytes(dt), A, 8 * chunks, nt, acc, RS, T0);
            if (T1) il_tail(dt, w, il_block_bytes(dt), A1, 8 * chunks, nt, acc1, RS, T1);
        }
    }
    mmq_tile_close(acc, RS, T0, RS, y, ldy);
    if (T1) mmq_tile_close(acc1, RS, T1, RS, y + MMQ_T * ldy, ldy);
}

INLINE void mmq_il_stream(ts_dtype dt, const uint8_t *w0, size_t rb, int64_t rows,
                          const uint8_t *act, size_t ab, int64_t n, float *y, int64_t ldy, int T,
                          size_t pf_bytes) {
    cpu_q8act A[2 * MMQ_T];
    UNROLL(8)
    for (int t = 0; t < T; t++)
        A[t] = cpu_q8act_view((uint8_t *)act + (size_t)t * ab, n);
    const int64_t chunks = n / 256;
    const int tail = (int)(n / 32 - 8 * chunks);
    const uint8_t *base = (const uint8_t *)((uintptr_t)w0 & ~(uintptr_t)63);
    const size_t pf = (pf_bytes + 63) & ~(size_t)63;
    size_t done = 0;
    int64_t r = 0;
    /* two rows a pass (sharing each chunk's activations) up to MMQ_T tokens; beyond, one: two
     * rows' accumulators would not stay in the registers */
    if (T <= MMQ_T)
        for (; r + 2 <= rows; r += 2) {
            const uint8_t *w[MMQ_R] = {w0 + (size_t)r * rb, w0 + (size_t)(r + 1) * rb};
            il_stream_pass(dt, w, rb, base, &done, pf, A, chunks, tail, y + r, ldy, 2, T);
        }
    for (; r < rows; r++) { /* a row a pass, or an odd last row */
        const uint8_t *w[MMQ_R] = {w0 + (size_t)r * rb};
        il_stream_pass(dt, w, rb, base, &done, pf, A, chunks, tail, y + r, ldy, 1, T);
    }
}

/* dec_state (prefill, several token groups per row block; mmq_run): 0 decode as the chunks
 * are used; 1 decode the row block's chunks into decbuf first (this is its first token group),
 * then use them; 2 use what decbuf holds (a later group of the same row block). */
INLINE void mmq_il_tile(ts_dtype dt, const uint8_t *const *w, const uint8_t *pf, const uint8_t *act,
                        size_t ab, int64_t n, float *y, int64_t ldy, int nr, int T, uint8_t *decbuf,
                        int dec_state, bool seq) {
    cpu_q8act A[MMQ_T];
    __m256 acc[MMQ_R][MMQ_T];
    mmq_tile_open(act, ab, n, MMQ_R, T, A, acc);
    const int64_t chunks = n / 256;
    /* the tail blocks (Q4_0, Q5_0, Q8_0) and the 8-block chunks */
    const int bb = il_block_bytes(dt);
    const int cb = il_chunk_bytes(dt);
    const size_t pf_step = mmq_chunk_pf_step(pf, n, cb, bb);
    il_weights *dec = dec_state ? (il_weights *)decbuf : NULL;
    /* seq (cpu_seq_rows), one or two tokens - which mmq_run now gives mmq_il_stream, so this is
     * not reached; left for now because a build without it was slower, the cause not isolated
     * from another change (bench/RESULTS.md): to go with a measurement of its own. The row
     * block in passes of seq_rows
     * rows, each over its whole rows with its share of the next row block's prefetch, so that
     * memory sees one or two streams instead of four interleaved ones. Two rows a pass share
     * each chunk's activations; Q8_0, whose decode is lightest, goes best a row a pass (Intel
     * Xeon VM, bench/RESULTS.md). */
    seq = seq && T <= 2 && !dec;
    const int seq_rows = dt == TS_DTYPE_Q8_0 ? 1 : 2;
    const size_t seq_step = (pf_step + (MMQ_R / seq_rows) - 1) / (MMQ_R / seq_rows);
    /* pass q's share of that prefetch: its chunks' steps of seq_step bytes */
#define SEQ_PF(q) (pf ? pf + (size_t)((q) / seq_rows) * (size_t)chunks * seq_step : NULL)
    if (dec_state == 1) { /* the prefetch of the next row block goes with this pass */
        for (int64_t ch = 0; ch < chunks; ch++) {
            if (pf) mmq_prefetch_step(pf, (size_t)ch, (int)pf_step);
            UNROLL(4)
            for (int q = 0; q < MMQ_R; q++)
                il_decode(dt, w[q] + (size_t)cb * (size_t)ch,
                          &dec[(size_t)q * (size_t)chunks + (size_t)ch]);
        }
        if (chunks) pf = NULL;
    }
    /* Rows per pass, as many as the registers hold (with the accumulators, the codes and the
     * scales): decoding in the loop, more than 8 accumulators spill, so beyond 2 tokens the rows
     * go in two passes (Q4_K, Q6_K: four); with the codes read decoded from memory (prefill)
     * Q4_K and Q6_K take two rows a pass, Q5_0 and Q8_0 all four (test_quant --bench prefill on
     * Zen 4: Q4_K +26%, Q6_K +30%, Q5_0 +16%, Q8_0 +10%; Q4_0 gained nothing from four). The
     * first pass prefetches for all. */
    if (dt == TS_DTYPE_Q6_K) {
        __m512 acc16[MMQ_R][MMQ_T];
        UNROLL(8)
        for (int q = 0; q < MMQ_R; q++) {
            UNROLL(8)
            for (int t = 0; t < T; t++)
                acc16[q][t] = _mm512_setzero_ps();
        }
        /* more than 2 tokens: one row a pass (the accumulators and codes fill the registers),
         * two where the codes come decoded from memory */
        if (seq) {
            for (int q = 0; q < MMQ_R; q += seq_rows)
                il_rows_q6k(w, SEQ_PF(q), seq_step, A, chunks, acc16, q, seq_rows, T, dec);
        } else if (T > 2 && dec) {
            il_rows_q6k(w, pf, pf_step, A, chunks, acc16, 0, MMQ_R / 2, T, dec);
            il_rows_q6k(w, NULL, pf_step, A, chunks, acc16, MMQ_R / 2, MMQ_R / 2, T, dec);
        } else if (T > 2) {
            for (int q = 0; q < MMQ_R; q++)
                il_rows_q6k(w, q ? NULL : pf, pf_step, A, chunks, acc16, q, 1, T, dec);
        } else {
            il_rows_q6k(w, pf, pf_step, A, chunks, acc16, 0, MMQ_R, T, dec);
        }
        il_q6k_fold(acc16, acc, MMQ_R, T);
    } else if (seq) {
        for (int q = 0; q < MMQ_R; q += seq_rows)
            il_rows(dt, w, SEQ_PF(q), seq_step, A, chunks, acc, q, seq_rows, T, dec);
    } else if (T <= 2 || (dec && (dt == TS_DTYPE_Q5_0 || dt == TS_DTYPE_Q8_0))) {
        il_rows(dt, w, pf, pf_step, A, chunks, acc, 0, MMQ_R, T, dec);
    } else if (dt == TS_DTYPE_Q4_K && !dec) {
        for (int q = 0; q < MMQ_R; q++)
            il_rows(dt, w, q ? NULL : pf, pf_step, A, chunks, acc, q, 1, T, dec);
    } else {
        il_rows(dt, w, pf, pf_step, A, chunks, acc, 0, MMQ_R / 2, T, dec);
        il_rows(dt, w, NULL, pf_step, A, chunks, acc, MMQ_R / 2, MMQ_R / 2, T, dec);
    }
    /* K-quant rows are whole chunks */
    if ((dt == TS_DTYPE_Q4_0 || dt == TS_DTYPE_Q5_0 || dt == TS_DTYPE_Q8_0) && n / 32 > 8 * chunks)
        il_tail(dt, w, bb, A, 8 * chunks, (int)(n / 32 - 8 * chunks), acc, MMQ_R, T);
    mmq_tile_close(acc, MMQ_R, T, nr, y, ldy);
#undef SEQ_PF
}
