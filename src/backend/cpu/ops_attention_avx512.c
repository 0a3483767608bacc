/* The AVX-512 set of the sequence-op kernels (ops_seq.h); the body is ops_seq_simd.h. */
#include <immintrin.h>

#define V                     __m512
#define VL                    16
#define VLOAD(p)              _mm512_loadu_ps(p)
#define VSTORE(p, v)          _mm512_storeu_ps(p, v)
#define VSET1(x)              _mm512_set1_ps(x)
#define VZERO()               _mm512_setzero_ps()
#define VADD(a, b)            _mm512_add_ps(a, b)
#define VMUL(a, b)            _mm512_mul_ps(a, b)
#define VDIV(a, b)            _mm512_div_ps(a, b)
#define VFMA(a, b, c)         _mm512_fmadd_ps(a, b, c)
#define VMIN(a, b)            _mm512_min_ps(a, b)
#define VMAX(a, b)            _mm512_max_ps(a, b)
#define VROUND(x)             _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VSCALE2(p, n)         _mm512_scalef_ps(p, n)
#define VZERO_BELOW(y, x, lo) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), y)
#define VHSUM(v)              _mm512_reduce_add_ps(v)
#define VHSUM4(a, b, c, d, o) seq_hsum4_avx512(a, b, c, d, o)
#define NN_NV                 4
#define NT_MR                 4
#define GDN_NV                4 /* a dk x 64 block of the state: 32 KiB at dk 128, in L1 */
#define SEQ_TABLE             cpu_seq_avx512
#define VD                    __m512d
#define VDL                   8
#define VD_SET1(x)            _mm512_set1_pd(x)
#define VD_MUL(a, b)          _mm512_mul_pd(a, b)
#define VD_FMA(a, b, c)       _mm512_fmadd_pd(a, b, c)
#define VD_MIN(a, b)          _mm512_min_pd(a, b)
#define VD_MAX(a, b)          _mm512_max_pd(a, b)
#define VD_ROUND(x)           _mm512_roundscale_pd(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VD_SCALE2(p, n)       _mm512_scalef_pd(p, n)
#define VH                    __m256
#define VH_LOAD(p)            _mm256_loadu_ps(p)
#define VH_STORE(p, v)        _mm256_storeu_ps(p, v)
#define VD_FROM_H(h)          _mm512_cvtps_pd(h)
#define VH_FROM_D(d)          _mm512_cvtpd_ps(d)
#define VH_SILU(x, e)         _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e))

/* The four lane sums: fold each vector to 8 lanes, then three horizontal adds and a fold. */
static inline __attribute__((always_inline)) void seq_hsum4_avx512(__m512 a, __m512 b, __m512 c,
                                                                   __m512 d, float *o) {
#define FOLD(x) _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1))
    __m256 ab = _mm256_hadd_ps(FOLD(a), FOLD(b)), cd = _mm256_hadd_ps(FOLD(c), FOLD(d));
#undef FOLD
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    _mm_storeu_ps(o, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}

#include "backend/cpu/ops_seq_simd.h"
