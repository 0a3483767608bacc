/* CPU matrix multiplication against weight tensors of every supported dtype.
 *
 * One scalar reference kernel per dtype is the oracle; AVX2 and AVX-512 variants live in their
 * own files, compiled with their own flags, and are chosen at run time (cpu_isa_best) from what
 * cpuid reports. Tests force each ISA to check it against the scalar path. */
#ifndef TS_BACKEND_CPU_MATMUL_H
#define TS_BACKEND_CPU_MATMUL_H

#include "backend/cpu/weight_cache.h"
#include "base/tensor.h"
#include "base/threadpool.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum { CPU_ISA_SCALAR, CPU_ISA_AVX2, CPU_ISA_AVX512, CPU_ISA_COUNT } cpu_isa;

const char *cpu_isa_name(cpu_isa isa);
/* True when this CPU can run the kernels of isa. */
bool cpu_isa_supported(cpu_isa isa);
/* The fastest supported ISA; the environment variable TESSERA_ISA=scalar|avx2|avx512 can only
 * lower it (for tests and comparisons). */
cpu_isa cpu_isa_best(void);
/* Whether decode sums a row block in passes of fewer rows, so that the weights stream nearly in
 * memory order - one token's a row a pass in the float kernels, one to eight tokens' rows
 * in the AVX-512 quantized stream - by path, as measured on each CPU vendor
 * (matmul.c; TESSERA_CPU_SEQ_ROWS=0 / 1 sets every path); and, for tests, the paths that take
 * it as a mask of (1u << path), to read and to set (not while kernels run) */
typedef enum {
    CPU_SEQ_FLOAT_AVX2,
    CPU_SEQ_FLOAT_AVX512,
    CPU_SEQ_QUANT_AVX512,
    CPU_SEQ_PATHS
} cpu_seq_path;
bool cpu_seq_rows(cpu_seq_path path);
unsigned cpu_seq_rows_mask(void);
void cpu_seq_rows_set_mask(unsigned mask);
/* True when matmul supports the weight dtype (at every ISA; slower ISAs may fall back). */
bool cpu_matmul_supports(ts_dtype dtype);

/* y[t*ldy + o] = sum_i W[o, i] * x[t*ldx + i]  for t in [0, n_tok), o in [0, rows(W)).
 * W is 2-D [out, in]; x and y are fp32 and must not overlap. Splits the work over the pool's
 * threads (pool may be NULL: single-threaded). Accumulates in fp32. Kernels that read their
 * weights regrouped (weight_cache.h) take them from wc, made there on first use; with wc NULL
 * they are regrouped for this call alone (tests, tools), or where that copy cannot be had the
 * next kernel set's kernel runs. */
void cpu_matmul(ts_pool *pool, cpu_wcache *wc, cpu_isa isa, const ts_tensor *W, const float *x,
                int64_t ldx, int n_tok, float *y, int64_t ldy);

/* The most weights one cpu_matmul_n call takes. */
#define CPU_MATMUL_MAX_N 4

/* What cpu_matmul_n runs on a thread's rows [r0, r1) of a pair of products once it has both. */
typedef struct {
    void (*fn)(void *ctx, int64_t r0, int64_t r1);
    void *ctx;
} cpu_mm_pair;

/* y[j] = W[j] x for nw (1..CPU_MATMUL_MAX_N) weights of one column count (dtypes may differ) as
 * one job of the pool: the threads divide all the weights' rows together, so that a stack of
 * projections costs one hand-over of the pool instead of nw. Each output row gets the bits
 * cpu_matmul gives it. With pair (nw == 2, W[0] and W[1] of the same rows), both are split
 * alike and pair->fn runs on each thread's rows once it has them in y[0] and y[1]. */
void cpu_matmul_n(ts_pool *pool, cpu_wcache *wc, cpu_isa isa, const ts_tensor *const *W, int nw,
                  const float *x, int64_t ldx, int n_tok, float *const *y, const int64_t *ldy,
                  const cpu_mm_pair *pair);

/* out[j] = W[row, j] as fp32 for j in [0, cols(W)) (embedding lookup). */
void cpu_dequant_row(const ts_tensor *W, int64_t row, float *out);

#endif
