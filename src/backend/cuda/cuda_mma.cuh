/* mma.sync m16n8k16 with fp32 accumulators, the one instruction the mma.sync kernels
 * (cuda_gemm_skinny.cu, cuda_attn_mma.cu) share. Fragments (PTX ISA, "Matrix Fragments for
 * mma.m16n8k16"; g = lane / 4, t = lane % 4, a register two 16-bit values, the lower column or
 * row in the low half): A (16 x 16, row) a0 = rows g, columns 2t and 2t + 1; a1 = row g + 8; a2
 * and a3 the same rows, columns 8 on; B (16 x 8, col) b0 = rows 2t and 2t + 1 of column g, b1 =
 * rows 8 on; C c0, c1 = row g, columns 2t and 2t + 1; c2, c3 = row g + 8. */
#pragma once

#include <stdint.h>

/* c += a b: BF true for bf16 operands, false for f16 */
template <bool BF>
__device__ static inline void mma16816(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1) {
    if (BF)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
