/* AVX2 kernels for the quantized weight types: the shared body (matmul_q_simd.h) with the
 * maddubs + madd dot product (no saturation: codes < 64 or |q8| <= 128 against |a| <= 127)
 * and a 2 x 4 register tile, within the 16 vector registers. */
#include "backend/cpu/matmul_q.h"

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

#include "backend/cpu/matmul_q_simd.h"
