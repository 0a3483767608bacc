/* Private to the CPU matmul: kernels for block-quantized weights (quant.h), one table per ISA
 * with only the quantized dtypes set (same entry type and fallback rules as matmul_int.h), and
 * the int8 activation format the kernels share.
 *
 * The kernels quantize the fp32 activations of each token to int8 in blocks of 32 (one fp32
 * scale per block, round to nearest even) and take integer dot products against the weights'
 * integer codes; the weight and activation scales are applied per block in fp32. Every ISA
 * gets the same int8 activations (cpu_q8act_quantize, or its AVX2 / AVX-512 versions, which
 * write the same bytes), so SIMD and scalar results differ only by fp32 summation order.
 * Weight blocks must be 2-byte aligned (GGUF data is). */
#ifndef TS_BACKEND_CPU_MATMUL_Q_H
#define TS_BACKEND_CPU_MATMUL_Q_H

#include "backend/cpu/matmul_int.h"
#include "base/threadpool.h"

#include <stddef.h>
#include <stdint.h>

extern const cpu_mm_kernel cpu_mmq_scalar[TS_DTYPE_COUNT];
extern const cpu_mm_kernel cpu_mmq_avx2[TS_DTYPE_COUNT];
extern const cpu_mm_kernel cpu_mmq_avx512[TS_DTYPE_COUNT];

/* How far ahead (bytes, at least: whole row blocks) decode prefetches weights of type dt into
 * L2, by the CPU (matmul.c) */
size_t cpu_mmq_prefetch_bytes(ts_dtype dt);

/* Largest row length (columns) the quantized kernels accept. */
#define CPU_MMQ_MAX_COLS 65536
/* Bytes of activation scratch a kernel keeps on its stack; tokens are processed in tiles that
 * fit it (at least 4 tokens up to 32768 columns). */
#define CPU_MMQ_ACT_BYTES (192 * 1024)

/* One token's quantized activations, n elements (a multiple of 32): views into one buffer of
 * cpu_q8act_bytes(n) bytes, q first (so it keeps the buffer's alignment). */
typedef struct {
    int8_t *q;   /* [n] */
    float *d;    /* [n/32] scale of each block */
    float *s;    /* [n/32] d * (sum of the block's q) */
    float *s16;  /* [n/16] d * (sum of each half block's q) */
} cpu_q8act;

static inline size_t cpu_q8act_bytes(int64_t n) { return (size_t)n + (size_t)n / 2; }

static inline cpu_q8act cpu_q8act_view(void *buf, int64_t n) {
    cpu_q8act a;
    a.q = buf;
    a.d = (float *)((uint8_t *)buf + n);
    a.s = a.d + n / 32;
    a.s16 = a.s + n / 32;
    return a;
}

/* Layouts of quantized activations (cpu_mm_kernel.act_layout): as cpu_q8act_quantize writes
 * them, or each whole 256-element chunk reordered by cpu_q8act_interleave /
 * cpu_q8act_interleave_q8. */
enum { CPU_MMQ_ACT_NATURAL, CPU_MMQ_ACT_IL, CPU_MMQ_ACT_IL_Q8 };

/* Quantizes x[0..n) into the buffer (n a multiple of 32): per block d = max|x| / 127,
 * q = x * (1/d) rounded to nearest even. The AVX2 and AVX-512 versions write the same bytes
 * (same fp32 operations per element, integer sums), so every ISA sees the same activations. */
void cpu_q8act_quantize(const float *x, int64_t n, void *buf);
void cpu_q8act_quantize_avx2(const float *x, int64_t n, void *buf);
void cpu_q8act_quantize_avx512(const float *x, int64_t n, void *buf);

/* Reorders the q of every whole 256-element chunk of a quantized token for the AVX-512
 * kernels that sum 8 blocks at once: the chunk becomes 4 rows of 16 dwords, and dword i of
 * row k holds elements 4 * (2k + i / 8) .. + 3 of block i % 8. A VNNI dot of row k against
 * weights decoded in the same order leaves in lanes i and i + 8 only products of block i % 8,
 * so the 4 rows accumulate in one register and its two halves add up to the 8 block sums.
 * Elements after the last whole chunk, d, s and s16 stay as they are. */
void cpu_q8act_interleave(int64_t n, void *buf);
/* The same for the Q8_0 kernel, whose decoder moves qwords: row k of a chunk holds elements
 * 8k .. 8k + 7 of blocks 0..7 in turn (qword j: block j), so lanes 2j, 2j + 1 are block j. */
void cpu_q8act_interleave_q8(int64_t n, void *buf);

/* A quantized token of n columns (buf) put from its natural order into the given layout. */
static inline void cpu_q8act_arrange(int layout, int64_t n, void *buf) {
    if (layout == CPU_MMQ_ACT_IL)
        cpu_q8act_interleave(n, buf);
    else if (layout == CPU_MMQ_ACT_IL_Q8)
        cpu_q8act_interleave_q8(n, buf);
}

/* The activations of n_tok tokens (x, ldx apart, cols columns) quantized by the pool's threads
 * with kernel k's quantizer, in the given layout (k->act_layout's answer), into the calling
 * thread's buffer (matmul_act.c): what cpu_mm_job.xq takes. NULL if that buffer could not grow
 * or would pass 64 MiB; the kernels then quantize for themselves. */
const uint8_t *cpu_mm_act_prepare(ts_pool *pool, const cpu_mm_kernel *k, int layout, const float *x,
                                  int64_t ldx, int64_t cols, int n_tok);

/* How many tokens of n columns fit in CPU_MMQ_ACT_BYTES (at least 1). */
static inline int cpu_mmq_tok_tile(int64_t n) {
    int64_t t = (int64_t)(CPU_MMQ_ACT_BYTES / cpu_q8act_bytes(n));
    return t < 1 ? 1 : t > 4096 ? 4096 : (int)t;
}

#endif
