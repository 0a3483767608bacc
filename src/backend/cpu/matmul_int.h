/* Private to the CPU matmul: the job description and the [isa][dtype] kernel tables.
 *
 * Each ISA file (matmul_scalar.c, matmul_avx2.c, matmul_avx512.c) exports one table indexed by
 * ts_dtype. A NULL entry means "this ISA has no kernel for the dtype": the dispatcher falls back
 * to the next lower ISA, down to scalar. A dtype is supported only when its scalar entry exists,
 * so a new weight type (the quantized ones) starts as one scalar kernel and gains SIMD entries
 * later without touching the dispatcher. */
#ifndef TS_BACKEND_CPU_MATMUL_INT_H
#define TS_BACKEND_CPU_MATMUL_INT_H

#include "backend/cpu/weight_cache.h"
#include "base/tensor.h"

#include <stddef.h>
#include <stdint.h>

/* Loop unrolling hints for the SIMD kernels; only when optimising, since GCC warns that it
 * ignores them at -O0 (and the Debug build treats warnings as errors). */
#define TS_PRAGMA_(x) _Pragma(#x)
#if defined(__OPTIMIZE__)
#define TS_UNROLL(n) TS_PRAGMA_(GCC unroll n)
#else
#define TS_UNROLL(n)
#endif

/* y[t*ldy + o] = sum_i W[o, i] * x[t*ldx + i] for t in [0, n_tok). Borrowed pointers only. */
typedef struct {
    const uint8_t *w; /* row 0 of W; rows are row_bytes apart */
    size_t row_bytes;
    int64_t cols; /* in features */
    const float *x;
    int64_t ldx;
    int n_tok;
    float *y;
    int64_t ldy;
    /* quantized kernels, many tokens: x already quantized in the layout the kernel's act_layout
     * gave (n_tok slots of cpu_q8act_bytes(cols) bytes, matmul_q.h), or NULL: the kernel
     * quantizes x itself */
    const uint8_t *xq;
} cpu_mm_job;

/* Computes output rows [r0, r1) for every token. Any range is correct; the dispatcher starts
 * ranges on the entry's alignment (below) so that SIMD row blocks do not straddle threads. */
typedef void (*cpu_mm_fn)(const cpu_mm_job *job, int64_t r0, int64_t r1);

typedef struct {
    cpu_mm_fn fn;  /* NULL: fall back to the next lower ISA */
    int row_align; /* thread ranges start at multiples of this (the prefill panel) ... */
    int few_tok;   /* ... or, when n_tok <= few_tok (the decode kernel), */
    int few_align; /* at multiples of this smaller block, for a finer split */
    /* Quantized SIMD kernels: the layout (CPU_MMQ_ACT_*, matmul_q.h) in which they take a
     * call's activations of cols columns quantized beforehand, and the quantizer; cpu_matmul_n
     * then quantizes x once for all threads and weights (cpu_mm_job.xq). NULL: not offered. */
    int (*act_layout)(int64_t cols);
    void (*act_quantize)(const float *x, int64_t n, void *buf);
    /* Kernels that read their weights regrouped (the AVX-512 Q4_K, Q6_K and Q4_0 tiles): the
     * regrouping of whole rows, which cpu_matmul_n applies first (weight_cache.h); NULL:
     * the file's layout. */
    cpu_repack_fn repack;
} cpu_mm_kernel;

extern const cpu_mm_kernel cpu_mm_scalar_kernels[TS_DTYPE_COUNT];
extern const cpu_mm_kernel cpu_mm_avx2_kernels[TS_DTYPE_COUNT];
extern const cpu_mm_kernel cpu_mm_avx512_kernels[TS_DTYPE_COUNT];

/* Read loops of the bandwidth probe: fold every 64-bit word of [p, p + bytes) into the result so
 * the loads cannot be optimised away. bytes is a multiple of 256 and p is 64-byte aligned. */
uint64_t cpu_read_sum_avx2(const void *p, size_t bytes);
uint64_t cpu_read_sum_avx512(const void *p, size_t bytes);

#endif
