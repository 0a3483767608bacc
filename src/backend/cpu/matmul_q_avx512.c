/* AVX-512 kernels for the quantized weight types: the shared body (matmul_q_simd.h) with the
 * VNNI dot product (vpdpbusd on 256-bit vectors: on Zen 4 a 512-bit op is two 256-bit halves
 * anyway) and a 4 x 4 register tile, which the 32 vector registers hold. Needs AVX512-VNNI
 * besides F/BW/VL/DQ: the dispatcher must check avx512vnni before choosing this table. */
#include <immintrin.h>
#include <stdint.h>

#define MMQ_DOT(u, a) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (a))
#define MMQ_Q5_HIGH(qh) _mm256_maskz_mov_epi8((__mmask32)(qh), _mm256_set1_epi8(0x10))
#define MMQ_R 4
#define MMQ_T 4
#define MMQ_TABLE cpu_mmq_avx512

#include "backend/cpu/matmul_q_simd.h"
