/* GGUF block-quantized weight types: the block layouts, and the reference quantize / dequantize
 * functions (scalar, bit-exact with GGUF semantics for dequantization).
 *
 * A quantized row is a whole number of blocks; element order inside a block is the one GGUF
 * files use:
 * - Q8_0 (32): q[i] * d.
 * - Q4_0 (32): byte j holds element j (low nibble) and j + 16 (high); value (q - 8) * d.
 * - Q5_0 (32): as Q4_0 plus bit i of the little-endian u32 qh as bit 4 of element i;
 *   value (q - 16) * d.
 * - Q4_K (256): 8 sub-blocks of 32 with 6-bit scale sc and min m each; value d*sc*q - dmin*m.
 *   qs is 4 groups of 32 bytes: group g holds sub-block 2g in its low nibbles and 2g+1 in its
 *   high ones. The 12 scale bytes: bytes 0-3 low 6 bits = sc[0..3], bytes 4-7 low 6 bits =
 *   m[0..3]; bytes 8-11 low nibble = low 4 bits of sc[4..7], high nibble = low 4 bits of
 *   m[4..7]; the top 2 bits of bytes 0-3 (4-7) are the high bits of sc[4..7] (m[4..7]).
 * - Q6_K (256): 16 sub-blocks of 16 with int8 scales; value d * sc * (q - 32) with q 6 bits.
 *   Two halves of 128 elements, each with 64 bytes of ql and 32 of qh: element l (< 64) of a
 *   half is the low nibble of ql[l], element 64 + l the high nibble; bits 2k..2k+1 of qh[l]
 *   are the top bits of element 32k + l. */
#ifndef TS_BACKEND_CPU_QUANT_H
#define TS_BACKEND_CPU_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tensor.h"

#define TS_QK 32    /* elements per Q8_0 / Q4_0 / Q5_0 block */
#define TS_QK_K 256 /* elements per K-quant super-block */

typedef struct {
    uint16_t d; /* fp16 */
    int8_t qs[32];
} ts_block_q8_0;

typedef struct {
    uint16_t d; /* fp16 */
    uint8_t qs[16];
} ts_block_q4_0;

typedef struct {
    uint16_t d;     /* fp16 */
    uint8_t qh[4];  /* little-endian u32: bit i = bit 4 of element i */
    uint8_t qs[16]; /* as Q4_0 */
} ts_block_q5_0;

typedef struct {
    uint16_t d, dmin;    /* fp16 */
    uint8_t scales[12];  /* packed 6-bit sc[8] and m[8] (see above) */
    uint8_t qs[128];
} ts_block_q4_K;

typedef struct {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d; /* fp16 */
} ts_block_q6_K;

_Static_assert(sizeof(ts_block_q8_0) == 34, "Q8_0 block");
_Static_assert(sizeof(ts_block_q4_0) == 18, "Q4_0 block");
_Static_assert(sizeof(ts_block_q5_0) == 22, "Q5_0 block");
_Static_assert(sizeof(ts_block_q4_K) == 144, "Q4_K block");
_Static_assert(sizeof(ts_block_q6_K) == 210, "Q6_K block");

/* True for the block-quantized dtypes this module handles. */
bool ts_dtype_is_quantized(ts_dtype t);

/* Scale and min of Q4_K sub-block j (0..7) from the 12 packed bytes. */
static inline void ts_q4k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* dst[0..n) = the values of the n elements at src (whole blocks of dtype; float dtypes are
 * converted too). TS_ERR_INVALID when n is not a whole number of blocks or the dtype unknown. */
ts_status ts_dequantize_row(ts_dtype dtype, const void *src, float *dst, int64_t n);

/* Encodes n floats as ts_dtype_row_bytes(dtype, n) bytes at dst: Q8_0 / Q4_0 / Q5_0 by
 * round-to-nearest of x / d with d from the block's largest magnitude; Q4_K and Q6_K with a
 * least-squares search for each sub-block's scale (and min), without importance weights, as
 * GGUF's reference quantizers do. Float dtypes are converted. Same errors as above. */
ts_status ts_quantize_row(ts_dtype dtype, const float *src, void *dst, int64_t n);

#endif
