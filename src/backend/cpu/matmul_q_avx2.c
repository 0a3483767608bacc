/* AVX2 kernels for the quantized weight types: the shared body (matmul_q_simd.h) with the
 * maddubs + madd dot product (no saturation: codes < 64 or |q8| <= 128 against |a| <= 127)
 * and a 2 x 4 register tile, within the 16 vector registers. */
#include <immintrin.h>
#include <stdint.h>

static inline __attribute__((always_inline)) __m256i mmq_dot_avx2(__m256i u, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
}

/* byte i = 0x10 where bit i of qh is set */
static inline __attribute__((always_inline)) __m256i mmq_q5_high_avx2(uint32_t qh) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                            2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

#define MMQ_DOT(u, a) mmq_dot_avx2((u), (a))
#define MMQ_Q5_HIGH(qh) mmq_q5_high_avx2(qh)
#define MMQ_R 2
#define MMQ_T 4
#define MMQ_TABLE cpu_mmq_avx2

#include "backend/cpu/matmul_q_simd.h"
