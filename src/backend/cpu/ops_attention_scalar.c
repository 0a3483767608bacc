/* The scalar set of the sequence-op kernels (ops_seq.h): plain loops, the oracle for the SIMD
 * sets and the fallback on CPUs without AVX2. */
#include "backend/cpu/ops_seq.h"

#include <math.h>

static void gemm_nn_scalar(int M, int N, int K, const float *A, int64_t lda, const float *B,
                           int64_t ldb, float *C, int64_t ldc, const float *cs) {
    for (int r = 0; r < M; r++) {
        float *c = C + r * ldc;
        for (int j = 0; j < N; j++)
            c[j] = cs ? cs[r] * c[j] : 0.0f;
        for (int k = 0; k < K; k++) {
            float a = A[r * lda + k];
            const float *b = B + k * ldb;
            for (int j = 0; j < N; j++)
                c[j] += a * b[j];
        }
    }
}

static void gemm_nt_scalar(int M, int N, int K, const float *A, int64_t lda, const float *B,
                           int64_t ldb, float *C, int64_t ldc) {
    for (int r = 0; r < M; r++)
        for (int j = 0; j < N; j++) {
            const float *a = A + r * lda, *b = B + j * ldb;
            float s = 0.0f;
            for (int k = 0; k < K; k++)
                s += a[k] * b[k];
            C[r * ldc + j] = s;
        }
}

static float exp_sum_scalar(float *x, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i]);
        s += x[i];
    }
    return s;
}

static void silu_scalar(const float *x, float *y, int n) {
    for (int i = 0; i < n; i++)
        y[i] = x[i] / (1.0f + expf(-x[i]));
}

/* Column by column so that m, delta and o stay scalars; the reference's order of operations. */
void cpu_gdn_step_cols_scalar(float *S, int dk, int dv, int c0, int c1, const float *q,
                              const float *k, const float *v, float decay, float beta, float *o) {
    for (int c = c0; c < c1; c++) {
        float m = 0.0f;
        for (int i = 0; i < dk; i++) {
            float s = S[(int64_t)i * dv + c] * decay;
            S[(int64_t)i * dv + c] = s;
            m += s * k[i];
        }
        float delta = beta * (v[c] - m), acc = 0.0f;
        for (int i = 0; i < dk; i++) {
            float s = S[(int64_t)i * dv + c] + k[i] * delta;
            S[(int64_t)i * dv + c] = s;
            acc += s * q[i];
        }
        o[c] = acc;
    }
}

static void gdn_step_scalar(float *S, int dk, int dv, const float *q, const float *k,
                            const float *v, float decay, float beta, float *o) {
    cpu_gdn_step_cols_scalar(S, dk, dv, 0, dv, q, k, v, decay, beta, o);
}

/* the scalar silu, through expf, is already what silu_fine asks for */
const cpu_seq_kernels cpu_seq_scalar = {gemm_nn_scalar, gemm_nt_scalar, exp_sum_scalar,
                                        silu_scalar,    silu_scalar,    gdn_step_scalar};

const cpu_seq_kernels *cpu_seq_pick(cpu_isa isa) {
    static const cpu_seq_kernels *const sets[CPU_ISA_COUNT] = {
        [CPU_ISA_SCALAR] = &cpu_seq_scalar,
        [CPU_ISA_AVX2] = &cpu_seq_avx2,
        [CPU_ISA_AVX512] = &cpu_seq_avx512,
    };
    int i = (unsigned)isa < CPU_ISA_COUNT ? (int)isa : CPU_ISA_SCALAR;
    while (i > CPU_ISA_SCALAR && !cpu_isa_supported((cpu_isa)i))
        i--;
    return sets[i];
}
