/* The AVX2 set of the sequence-op kernels (ops_seq.h); the body is ops_seq_simd.h. */
#include <immintrin.h>

#define V                     __m256
#define VL                    8
#define VLOAD(p)              _mm256_loadu_ps(p)
#define VSTORE(p, v)          _mm256_storeu_ps(p, v)
#define VSET1(x)              _mm256_set1_ps(x)
#define VZERO()               _mm256_setzero_ps()
#define VADD(a, b)            _mm256_add_ps(a, b)
#define VMUL(a, b)            _mm256_mul_ps(a, b)
#define VDIV(a, b)            _mm256_div_ps(a, b)
#define VFMA(a, b, c)         _mm256_fmadd_ps(a, b, c)
#define VMIN(a, b)            _mm256_min_ps(a, b)
#define VMAX(a, b)            _mm256_max_ps(a, b)
#define VROUND(x)             _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VSCALE2(p, n)         seq_scale2_avx2(p, n)
#define VZERO_BELOW(y, x, lo) _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_NLT_UQ), y)
#define VHSUM(v)              seq_hsum_avx2(v)
#define VHSUM4(a, b, c, d, o) seq_hsum4_avx2(a, b, c, d, o)
#define NN_NV                 2 /* 4 x 2 accumulators + 2 B vectors + a broadcast of 16 registers */
#define NT_MR                 2
#define GDN_NV                4 /* 4 independent sums per pass: the FMA latency */
#define SEQ_TABLE             cpu_seq_avx2
#define VD                    __m256d
#define VDL                   4
#define VD_SET1(x)            _mm256_set1_pd(x)
#define VD_MUL(a, b)          _mm256_mul_pd(a, b)
#define VD_FMA(a, b, c)       _mm256_fmadd_pd(a, b, c)
#define VD_MIN(a, b)          _mm256_min_pd(a, b)
#define VD_MAX(a, b)          _mm256_max_pd(a, b)
#define VD_ROUND(x)           _mm256_round_pd(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VD_SCALE2(p, n)       seq_scale2d_avx2(p, n)
#define VH                    __m128
#define VH_LOAD(p)            _mm_loadu_ps(p)
#define VH_STORE(p, v)        _mm_storeu_ps(p, v)
#define VD_FROM_H(h)          _mm256_cvtps_pd(h)
#define VH_FROM_D(d)          _mm256_cvtpd_ps(d)
#define VH_SILU(x, e)         _mm_div_ps(x, _mm_add_ps(_mm_set1_ps(1.0f), e))

#define SEQ_INLINE static inline __attribute__((always_inline))

/* p * 2^n, n integral in [-126, 127]: 2^n built in the exponent field */
SEQ_INLINE __m256 seq_scale2_avx2(__m256 p, __m256 n) {
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* p * 2^n for doubles, n integral in [-300, 300]: 2^n built in the exponent field */
SEQ_INLINE __m256d seq_scale2d_avx2(__m256d p, __m256d n) {
    __m256i e = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n));
    e = _mm256_slli_epi64(_mm256_add_epi64(e, _mm256_set1_epi64x(1023)), 52);
    return _mm256_mul_pd(p, _mm256_castsi256_pd(e));
}

SEQ_INLINE float seq_hsum_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The four lane sums: three horizontal adds leave [a b c d] in each half; add the halves. */
SEQ_INLINE void seq_hsum4_avx2(__m256 a, __m256 b, __m256 c, __m256 d, float *o) {
    __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_storeu_ps(o, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}

#include "backend/cpu/ops_seq_simd.h"
