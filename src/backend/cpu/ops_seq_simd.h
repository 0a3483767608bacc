/* The body of the SIMD sequence-op kernels (ops_seq.h), included by ops_attention_avx2.c and
 * ops_attention_avx512.c, which define before including it:
 *   V, VL                  the fp32 vector type and its lane count;
 *   VLOAD, VSTORE, VSET1, VZERO, VADD, VMUL, VDIV, VFMA(a, b, c) = a * b + c, VMIN, VMAX;
 *   VROUND(x)              round to nearest integer (as a float vector);
 *   VSCALE2(p, n)          p * 2^n for an integral float vector n in [-126, 127];
 *   VZERO_BELOW(y, x, lo)  y with 0 in the lanes where x < lo;
 *   VHSUM(v)               the sum of the lanes;
 *   VHSUM4(a, b, c, d, o)  o[0..3] = the lane sums of a, b, c, d;
 *   VD, VDL, VD_SET1, VD_MUL, VD_FMA, VD_MIN, VD_MAX, VD_ROUND, VD_SCALE2  the same for double
 *                          vectors (VD_SCALE2(p, n): p * 2^n, n integral in [-300, 300]);
 *   VH, VH_LOAD, VH_STORE  the float vector of VDL lanes; VD_FROM_H / VH_FROM_D convert (the
 *                          latter rounding to nearest); VH_SILU(x, e) = x / (1 + e);
 *   NN_NV                  vectors of columns per gemm_nn register tile (4 rows each);
 *   NT_MR                  rows per gemm_nt register tile (4 columns each);
 *   GDN_NV                 vectors of state columns per gdn_step block;
 *   SEQ_TABLE              the name of the kernel table to define.
 *
 * Register tiles: gemm_nn keeps a 4 x NN_NV-vector block of C in registers over the whole K
 * (a B row is loaded once per 4 rows, an A element broadcast once per NN_NV vectors); gemm_nt
 * keeps NT_MR x 4 dot products as vector partial sums over K and reduces them at the end.
 * Column (gemm_nn) and K (gemm_nt) remainders below a vector are done in scalar code. */
#include "backend/cpu/matmul_int.h"
#include "backend/cpu/ops_seq.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* ---- gemm_nn ---------------------------------------------------------------------------- */

/* Rows [0, mr) x columns [0, nv * VL) of C, over all K. */
INLINE void nn_tile(int mr, int nv, int K, const float *A, int64_t lda, const float *B, int64_t ldb,
                    float *C, int64_t ldc, const float *cs) {
    V acc[4][NN_NV];
    TS_UNROLL(4)
    for (int r = 0; r < mr; r++) {
        V s = cs ? VSET1(cs[r]) : VZERO();
        TS_UNROLL(4)
        for (int v = 0; v < nv; v++)
            acc[r][v] = cs ? VMUL(s, VLOAD(C + r * ldc + v * VL)) : s;
    }
    for (int k = 0; k < K; k++) {
        V b[NN_NV];
        TS_UNROLL(4)
        for (int v = 0; v < nv; v++)
            b[v] = VLOAD(B + k * ldb + v * VL);
        TS_UNROLL(4)
        for (int r = 0; r < mr; r++) {
            V a = VSET1(A[r * lda + k]);
            TS_UNROLL(4)
            for (int v = 0; v < nv; v++)
                acc[r][v] = VFMA(a, b[v], acc[r][v]);
        }
    }
    TS_UNROLL(4)
    for (int r = 0; r < mr; r++) {
        TS_UNROLL(4)
        for (int v = 0; v < nv; v++)
            VSTORE(C + r * ldc + v * VL, acc[r][v]);
    }
}

/* Rows [0, mr) over all columns: full tiles, single vectors, then scalar columns. */
INLINE void nn_rows(int mr, int N, int K, const float *A, int64_t lda, const float *B, int64_t ldb,
                    float *C, int64_t ldc, const float *cs) {
    int j = 0;
    for (; j + NN_NV * VL <= N; j += NN_NV * VL)
        nn_tile(mr, NN_NV, K, A, lda, B + j, ldb, C + j, ldc, cs);
    for (; j + VL <= N; j += VL)
        nn_tile(mr, 1, K, A, lda, B + j, ldb, C + j, ldc, cs);
    for (; j < N; j++)
        for (int r = 0; r < mr; r++) {
            float s = cs ? cs[r] * C[r * ldc + j] : 0.0f;
            for (int k = 0; k < K; k++)
                s += A[r * lda + k] * B[k * ldb + j];
            C[r * ldc + j] = s;
        }
}

static void gemm_nn_simd(int M, int N, int K, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float *C, int64_t ldc, const float *cs) {
    int r = 0;
    for (; r + 4 <= M; r += 4)
        nn_rows(4, N, K, A + r * lda, lda, B, ldb, C + r * ldc, ldc, cs ? cs + r : NULL);
    const float *csr = cs ? cs + r : NULL;
    switch (M - r) {
    case 3: nn_rows(3, N, K, A + r * lda, lda, B, ldb, C + r * ldc, ldc, csr); break;
    case 2: nn_rows(2, N, K, A + r * lda, lda, B, ldb, C + r * ldc, ldc, csr); break;
    case 1: nn_rows(1, N, K, A + r * lda, lda, B, ldb, C + r * ldc, ldc, csr); break;
    default: break;
    }
}

/* ---- gemm_nt ---------------------------------------------------------------------------- */

/* C[r][j] for r < mr, j < nr (<= 4): vector partial sums over K, reduced at the end. */
INLINE void nt_tile(int mr, int nr, int K, const float *A, int64_t lda, const float *B, int64_t ldb,
                    float *C, int64_t ldc) {
    V acc[NT_MR][4];
    TS_UNROLL(4)
    for (int r = 0; r < mr; r++) {
        TS_UNROLL(4)
        for (int j = 0; j < nr; j++)
            acc[r][j] = VZERO();
    }
    int k = 0;
    for (; k + VL <= K; k += VL) {
        V b[4];
        TS_UNROLL(4)
        for (int j = 0; j < nr; j++)
            b[j] = VLOAD(B + j * ldb + k);
        TS_UNROLL(4)
        for (int r = 0; r < mr; r++) {
            V a = VLOAD(A + r * lda + k);
            TS_UNROLL(4)
            for (int j = 0; j < nr; j++)
                acc[r][j] = VFMA(a, b[j], acc[r][j]);
        }
    }
    TS_UNROLL(4)
    for (int r = 0; r < mr; r++) {
        float s[4];
        if (nr == 4) {
            VHSUM4(acc[r][0], acc[r][1], acc[r][2], acc[r][3], s);
        } else {
            TS_UNROLL(4)
            for (int j = 0; j < nr; j++)
                s[j] = VHSUM(acc[r][j]);
        }
        for (int j = 0; j < nr; j++) {
            for (int kk = k; kk < K; kk++)
                s[j] += A[r * lda + kk] * B[j * ldb + kk];
            C[r * ldc + j] = s[j];
        }
    }
}

INLINE void nt_rows(int mr, int N, int K, const float *A, int64_t lda, const float *B, int64_t ldb,
                    float *C, int64_t ldc) {
    int j = 0;
    for (; j + 4 <= N; j += 4)
        nt_tile(mr, 4, K, A, lda, B + j * ldb, ldb, C + j, ldc);
    switch (N - j) {
    case 3: nt_tile(mr, 3, K, A, lda, B + j * ldb, ldb, C + j, ldc); break;
    case 2: nt_tile(mr, 2, K, A, lda, B + j * ldb, ldb, C + j, ldc); break;
    case 1: nt_tile(mr, 1, K, A, lda, B + j * ldb, ldb, C + j, ldc); break;
    default: break;
    }
}

static void gemm_nt_simd(int M, int N, int K, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float *C, int64_t ldc) {
    int r = 0;
    for (; r + NT_MR <= M; r += NT_MR)
        nt_rows(NT_MR, N, K, A + r * lda, lda, B, ldb, C + r * ldc, ldc);
    for (; r < M; r++)
        nt_rows(1, N, K, A + r * lda, lda, B, ldb, C + r * ldc, ldc);
}

/* ---- exp -------------------------------------------------------------------------------- */

/* e^x = 2^n e^f with n = round(x / ln 2) and f = x - n ln 2 in [-ln2/2, ln2/2], ln 2 split in a
 * short high part (n * hi is exact) and a low correction. e^f by its Taylor polynomial to
 * degree 7: the first term left out is f^8/8! < 5.2e-9, below half an ulp, so the error is
 * the rounding of the few operations (about 1-2 ulp). Below ln(FLT_MIN) the result is 0
 * (denormals dropped); arguments above 88 are clamped to 88. */
INLINE V vexp(V x) {
    const V lo = VSET1(-87.33654f), hi = VSET1(88.0f);
    V xc = VMAX(lo, VMIN(hi, x));
    V n = VROUND(VMUL(xc, VSET1(1.44269504088896341f)));
    V f = VFMA(n, VSET1(-0.693359375f), xc);
    f = VFMA(n, VSET1(2.12194440054690583e-4f), f);
    V p = VSET1(1.0f / 5040.0f);
    p = VFMA(p, f, VSET1(1.0f / 720.0f));
    p = VFMA(p, f, VSET1(1.0f / 120.0f));
    p = VFMA(p, f, VSET1(1.0f / 24.0f));
    p = VFMA(p, f, VSET1(1.0f / 6.0f));
    p = VFMA(p, f, VSET1(0.5f));
    p = VFMA(p, f, VSET1(1.0f));
    p = VFMA(p, f, VSET1(1.0f));
    return VZERO_BELOW(VSCALE2(p, n), x, lo);
}

static float exp_sum_simd(float *x, int n) {
    V acc = VZERO();
    int i = 0;
    for (; i + VL <= n; i += VL) {
        V e = vexp(VLOAD(x + i));
        VSTORE(x + i, e);
        acc = VADD(acc, e);
    }
    float sum = VHSUM(acc);
    if (i < n) { /* the tail through a padded vector, so that every element gets the same exp */
        float t[VL];
        for (int k = 0; k < VL; k++)
            t[k] = i + k < n ? x[i + k] : -INFINITY;
        VSTORE(t, vexp(VLOAD(t)));
        for (int k = 0; i + k < n; k++) {
            x[i + k] = t[k];
            sum += t[k];
        }
    }
    return sum;
}

/* e^x in double precision: n = round(x / ln 2), f = x - n ln 2 (two FMAs with ln 2 split in
 * the double nearest it and the rest), e^f by its Taylor polynomial to degree 12 (the first
 * term left out, f^13 / 13!, is below 2e-16 for |f| <= ln2 / 2), times 2^n. Relative error a
 * few 1e-16: rounded to float it is the float nearest e^x but where e^x lies within about 1e-8
 * of a float's last bit of a tie. x is clamped to [-150, 150], beyond which the float is 0 or
 * infinite anyway; NaN stays NaN. */
INLINE VD vexp_d(VD x) {
    x = VD_MAX(VD_SET1(-150.0), VD_MIN(VD_SET1(150.0), x));
    const VD n = VD_ROUND(VD_MUL(x, VD_SET1(1.4426950408889634)));
    VD f = VD_FMA(n, VD_SET1(-0.6931471805599453), x);
    f = VD_FMA(n, VD_SET1(-2.3190468138462996e-17), f);
    static const double inv_fact[13] = {1.0,
                                        1.0,
                                        1.0 / 2,
                                        1.0 / 6,
                                        1.0 / 24,
                                        1.0 / 120,
                                        1.0 / 720,
                                        1.0 / 5040,
                                        1.0 / 40320,
                                        1.0 / 362880,
                                        1.0 / 3628800,
                                        1.0 / 39916800,
                                        1.0 / 479001600};
    VD p = VD_SET1(inv_fact[12]);
    for (int k = 11; k >= 0; k--)
        p = VD_FMA(p, f, VD_SET1(inv_fact[k]));
    return VD_SCALE2(p, n);
}

/* SiLU of VDL floats with e^-x from vexp_d rounded to float (ops_seq.h: silu_fine); then
 * x / (1 + e) in float as the scalar form does. */
INLINE VH silu_fine_vec(VH v) {
    return VH_SILU(v, VH_FROM_D(vexp_d(VD_MUL(VD_SET1(-1.0), VD_FROM_H(v)))));
}

static void silu_fine_simd(const float *x, float *y, int n) {
    int i = 0;
    for (; i + VDL <= n; i += VDL)
        VH_STORE(y + i, silu_fine_vec(VH_LOAD(x + i)));
    if (i < n) { /* the tail through a padded vector */
        float t[VDL] = {0};
        for (int k = 0; i + k < n; k++)
            t[k] = x[i + k];
        VH_STORE(t, silu_fine_vec(VH_LOAD(t)));
        for (int k = 0; i + k < n; k++)
            y[i + k] = t[k];
    }
}

/* x / (1 + e^-x); for x below -88 e^-x is clamped to e^88, which still gives x / 1.7e38 ~ 0 */
static void silu_simd(const float *x, float *y, int n) {
    int i = 0;
    for (; i + VL <= n; i += VL) {
        V v = VLOAD(x + i);
        VSTORE(y + i, VDIV(v, VADD(VSET1(1.0f), vexp(VMUL(VSET1(-1.0f), v)))));
    }
    if (i < n) { /* the tail through a padded vector, as in exp_sum_simd */
        float t[VL] = {0};
        for (int k = 0; i + k < n; k++)
            t[k] = x[i + k];
        V v = VLOAD(t);
        VSTORE(t, VDIV(v, VADD(VSET1(1.0f), vexp(VMUL(VSET1(-1.0f), v)))));
        for (int k = 0; i + k < n; k++)
            y[i + k] = t[k];
    }
}

/* ---- gated delta rule, one token -------------------------------------------------------- */

/* Columns [0, nv * VL) of the state: m, delta and o stay in registers over the dk rows. */
INLINE void gdn_step_cols(int nv, float *S, int dk, int dv, const float *q, const float *k,
                          const float *v, float decay, float beta, float *o) {
    V m[GDN_NV], dl[GDN_NV], acc[GDN_NV];
    const V dec = VSET1(decay);
    TS_UNROLL(4)
    for (int c = 0; c < nv; c++)
        m[c] = VZERO();
    for (int i = 0; i < dk; i++) {
        float *Si = S + (int64_t)i * dv;
        V ki = VSET1(k[i]);
        TS_UNROLL(4)
        for (int c = 0; c < nv; c++) {
            V s = VMUL(VLOAD(Si + c * VL), dec);
            VSTORE(Si + c * VL, s);
            m[c] = VFMA(s, ki, m[c]);
        }
    }
    const V b = VSET1(beta);
    TS_UNROLL(4)
    for (int c = 0; c < nv; c++) {
        dl[c] = VMUL(b, VADD(VLOAD(v + c * VL), VMUL(VSET1(-1.0f), m[c])));
        acc[c] = VZERO();
    }
    for (int i = 0; i < dk; i++) {
        float *Si = S + (int64_t)i * dv;
        V ki = VSET1(k[i]), qi = VSET1(q[i]);
        TS_UNROLL(4)
        for (int c = 0; c < nv; c++) {
            V s = VFMA(ki, dl[c], VLOAD(Si + c * VL));
            VSTORE(Si + c * VL, s);
            acc[c] = VFMA(s, qi, acc[c]);
        }
    }
    TS_UNROLL(4)
    for (int c = 0; c < nv; c++)
        VSTORE(o + c * VL, acc[c]);
}

/* A block of columns at a time, so that its part of the state (dk x GDN_NV vectors) stays in
 * L1 between the two passes. */
static void gdn_step_simd(float *S, int dk, int dv, const float *q, const float *k, const float *v,
                          float decay, float beta, float *o) {
    int c = 0;
    for (; c + GDN_NV * VL <= dv; c += GDN_NV * VL)
        gdn_step_cols(GDN_NV, S + c, dk, dv, q, k, v + c, decay, beta, o + c);
    for (; c + VL <= dv; c += VL)
        gdn_step_cols(1, S + c, dk, dv, q, k, v + c, decay, beta, o + c);
    cpu_gdn_step_cols_scalar(S, dk, dv, c, dv, q, k, v, decay, beta, o); /* the rest */
}

const cpu_seq_kernels SEQ_TABLE = {gemm_nn_simd, gemm_nt_simd,   exp_sum_simd,
                                   silu_simd,    silu_fine_simd, gdn_step_simd};
