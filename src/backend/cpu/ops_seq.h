/* The building blocks of the CPU sequence ops (attention, the gated delta rule), one set per
 * ISA: small dense products, a vector exp and the one-token delta-rule step.
 *
 * Both ops are written once against this table (ops_attention.c, ops_gdn.c) and pick the set
 * for the backend's ISA; the scalar set (ops_attention_scalar.c) is the oracle the SIMD sets
 * (ops_attention_avx2.c, ops_attention_avx512.c, sharing the body in ops_seq_simd.h) are tested
 * against. Every matrix is fp32 and row-major with the given row stride; operands must not
 * overlap the output. */
#ifndef TS_BACKEND_CPU_OPS_SEQ_H
#define TS_BACKEND_CPU_OPS_SEQ_H

#include "backend/cpu/matmul.h"

#include <stdint.h>

typedef struct {
    /* C[r][j] = (cs ? cs[r] * C[r][j] : 0) + sum_{k<K} A[r][k] * B[k][j] for r < M, j < N.
     * K may be 0 (then C is only scaled or zeroed). */
    void (*gemm_nn)(int M, int N, int K, const float *A, int64_t lda, const float *B, int64_t ldb,
                    float *C, int64_t ldc, const float *cs);
    /* C[r][j] = sum_{k<K} A[r][k] * B[j][k] for r < M, j < N: dot products of rows. */
    void (*gemm_nt)(int M, int N, int K, const float *A, int64_t lda, const float *B, int64_t ldb,
                    float *C, int64_t ldc);
    /* x[i] = exp(x[i]) for i < n; returns the sum of the results. -INFINITY gives 0, results
     * below FLT_MIN may be 0 (the SIMD sets drop denormals); arguments must be <= 88. The SIMD
     * sets use their own polynomial (within about 1e-7 relative of exp), the scalar set expf. */
    float (*exp_sum)(float *x, int n);
    /* y[i] = x[i] / (1 + exp(-x[i])) (SiLU) for i < n, through the exp above; y may be x. */
    void (*silu)(const float *x, float *y, int n);
    /* The same with exp(-x[i]) the float nearest the true value (from a double-precision exp,
     * so within a last bit of expf's: the SIMD sets agree with the scalar expf form for all
     * but about one float in 60,000, by a few ulp of the result); y may be x. The causal
     * conv's. */
    void (*silu_fine)(const float *x, float *y, int n);
    /* One token of the delta rule (spec A.6 step 6) on a dk x dv state S (row i = key dim i):
     * S *= decay; m = S^T k; S += k (x) beta (v - m); o = S^T q. */
    void (*gdn_step)(float *S, int dk, int dv, const float *q, const float *k, const float *v,
                     float decay, float beta, float *o);
} cpu_seq_kernels;

extern const cpu_seq_kernels cpu_seq_scalar, cpu_seq_avx2, cpu_seq_avx512;

/* The scalar delta-rule step for state columns [c0, c1) only (v and o indexed by column): the
 * scalar set's gdn_step, and the SIMD sets' columns past their last whole vector. */
void cpu_gdn_step_cols_scalar(float *S, int dk, int dv, int c0, int c1, const float *q,
                              const float *k, const float *v, float decay, float beta, float *o);

/* o[i] = gelu_tanh(g[i]) * (u ? u[i] : 1) for i < n through k's vector exp (ops_basic.c: the
 * tanh-approximate GELU of the gated MLPs and of a vision tower); o may be g. */
void cpu_gelu_tanh_mul(const cpu_seq_kernels *k, const float *g, const float *u, float *o,
                       int64_t n);

/* The set for isa, or the nearest lower one this CPU supports. */
const cpu_seq_kernels *cpu_seq_pick(cpu_isa isa);

#endif
