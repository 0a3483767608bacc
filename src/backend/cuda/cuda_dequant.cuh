/* Weight rows decoded on the device, 8 elements at a time: the GEMV and the tensor-core GEMM
 * read every weight type in its own layout through these. */
#ifndef TS_BACKEND_CUDA_CUDA_DEQUANT_CUH
#define TS_BACKEND_CUDA_CUDA_DEQUANT_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "backend/cuda/cuda_int.cuh" /* ts_dtype, with C linkage */

__device__ static inline float bf16f(uint32_t h) { return __uint_as_float(h << 16); }
__device__ static inline float f16f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ static inline uint16_t ld16(const uint8_t *p) { return *(const uint16_t *)p; }

/* Elements [e, e + 8) of a row as fp32 (e a multiple of 8; quantized blocks hold whole groups of
 * 8). Every formula is the CPU dequantizer's (backend/cpu/quant.c), term for term. Lane l of a
 * warp decodes group l, l + 32, ...: neighbouring lanes read neighbouring bytes of the row and
 * neighbouring 32-byte pieces of x, so both streams are coalesced. */
template <ts_dtype DT> __device__ static inline void group8(const uint8_t *row, int64_t e, float *w);

template <> __device__ inline void group8<TS_DTYPE_F32>(const uint8_t *row, int64_t e, float *w) {
    const float4 *p = (const float4 *)(row + e * 4);
    float4 a = p[0], b = p[1];
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}

/* 8 BF16 or F16 values (16 bytes, already loaded) as fp32. */
template <ts_dtype DT> __device__ static inline void half8(uint4 v, float *w) {
    uint32_t a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (DT == TS_DTYPE_BF16)
            w[2 * i] = bf16f(a[i] & 0xffffu), w[2 * i + 1] = bf16f(a[i] >> 16);
        else
            w[2 * i] = f16f((uint16_t)(a[i] & 0xffffu)), w[2 * i + 1] = f16f((uint16_t)(a[i] >> 16));
    }
}

template <> __device__ inline void group8<TS_DTYPE_BF16>(const uint8_t *row, int64_t e, float *w) {
    half8<TS_DTYPE_BF16>(*(const uint4 *)(row + e * 2), w);
}

template <> __device__ inline void group8<TS_DTYPE_F16>(const uint8_t *row, int64_t e, float *w) {
    half8<TS_DTYPE_F16>(*(const uint4 *)(row + e * 2), w);
}

/* 8 bytes at a 2-byte aligned address */
__device__ static inline void bytes8(const uint8_t *p, int *q) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint16_t v = ld16(p + 2 * i);
        q[2 * i] = v & 0xff, q[2 * i + 1] = v >> 8;
    }
}

template <> __device__ inline void group8<TS_DTYPE_Q8_0>(const uint8_t *row, int64_t e, float *w) {
    const uint8_t *b = row + (e >> 5) * 34;
    float d = f16f(ld16(b));
    int q[8];
    bytes8(b + 2 + (e & 31), q);
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = (float)(int8_t)q[i] * d;
}

/* Q4_0 / Q5_0: element p < 16 of a block is the low nibble of qs[p], p >= 16 the high nibble of
 * qs[p - 16] */
template <> __device__ inline void group8<TS_DTYPE_Q4_0>(const uint8_t *row, int64_t e, float *w) {
    const uint8_t *b = row + (e >> 5) * 18;
    int p = (int)(e & 31), shift = (p >> 4) * 4;
    float d = f16f(ld16(b));
    int q[8];
    bytes8(b + 2 + (p & 15), q);
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = (float)(((q[i] >> shift) & 15) - 8) * d;
}

template <> __device__ inline void group8<TS_DTYPE_Q5_0>(const uint8_t *row, int64_t e, float *w) {
    const uint8_t *b = row + (e >> 5) * 22;
    int p = (int)(e & 31), shift = (p >> 4) * 4;
    float d = f16f(ld16(b));
    uint32_t qh = (uint32_t)ld16(b + 2) | (uint32_t)ld16(b + 4) << 16;
    int q[8];
    bytes8(b + 6 + (p & 15), q);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int v = ((q[i] >> shift) & 15) | (int)((qh >> (p + i)) & 1) << 4;
        w[i] = (float)(v - 16) * d;
    }
}

template <> __device__ inline void group8<TS_DTYPE_Q4_K>(const uint8_t *row, int64_t e, float *w) {
    const uint8_t *b = row + (e >> 8) * 144; /* 16-byte aligned: rows are whole super-blocks */
    int k = (int)(e & 255), j = k >> 5, p = k & 31;
    float d = f16f(ld16(b)), dmin = f16f(ld16(b + 2));
    const uint8_t *s = b + 4;
    int sc, m;
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    float d1 = d * (float)sc, m1 = dmin * (float)m;
    uint2 v = *(const uint2 *)(b + 16 + 32 * (j >> 1) + p);
    int shift = (j & 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int byte = ((i < 4 ? v.x : v.y) >> (8 * (i & 3))) & 0xff;
        w[i] = __fsub_rn(__fmul_rn(d1, (float)((byte >> shift) & 15)), m1);
    }
}

template <> __device__ inline void group8<TS_DTYPE_Q6_K>(const uint8_t *row, int64_t e, float *w) {
    const uint8_t *b = row + (e >> 8) * 210; /* 2-byte aligned */
    int k = (int)(e & 255), h = k >> 7, qt = (k >> 5) & 3, l = k & 31;
    float d = f16f(ld16(b + 208));
    float ds = __fmul_rn(d, (float)((const int8_t *)(b + 192))[8 * h + 2 * qt + (l >> 4)]);
    int ql[8], qh[8];
    bytes8(b + 64 * h + (qt & 1) * 32 + l, ql);
    bytes8(b + 128 + 32 * h + l, qh);
    int lshift = (qt >> 1) * 4, hshift = 2 * qt;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int q = (((ql[i] >> lshift) & 15) | ((qh[i] >> hshift) & 3) << 4) - 32;
        w[i] = __fmul_rn(ds, (float)q);
    }
}


/* K-quant rows 32 elements at a time (the GEMV's unit for these types: the block's scales and
 * the packed codes are loaded once per 32 elements, not per 8). Unit u is two runs of 16
 * elements, starting at elements *ea and *eb, that share their code bytes:
 * Q4_K: super-block u / 8, code bytes 16 (u % 8) .. + 16 of its 128; low nibbles are sub-block
 * 2 ((u / 2) % 4), high nibbles the next one.
 * Q6_K: super-block u / 8, half h = (u / 4) % 2, l0 = 16 ((u / 2) % 2), qt in {u % 2, u % 2 + 2}:
 * the low and high nibbles of the same ql bytes, the same qh bytes. Same formulas as group8. */
template <ts_dtype DT>
__device__ static inline void unit32(const uint8_t *row, int64_t u, float *wa, float *wb,
                                     int64_t *ea, int64_t *eb);

template <>
__device__ inline void unit32<TS_DTYPE_Q4_K>(const uint8_t *row, int64_t u, float *wa, float *wb,
                                             int64_t *ea, int64_t *eb) {
    const uint8_t *b = row + (u >> 3) * 144;
    int i = (int)(u >> 1) & 3, hf = (int)u & 1, j = 2 * i;
    float d = f16f(ld16(b)), dmin = f16f(ld16(b + 2));
    const uint8_t *s = b + 4;
    int sc0, m0, sc1, m1; /* sub-blocks j (< 7) and j + 1 */
    if (j < 4) {
        sc0 = s[j] & 63, m0 = s[j + 4] & 63;
    } else {
        sc0 = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4), m0 = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    if (j + 1 < 4) {
        sc1 = s[j + 1] & 63, m1 = s[j + 5] & 63;
    } else {
        sc1 = (s[j + 5] & 15) | ((s[j - 3] >> 6) << 4), m1 = (s[j + 5] >> 4) | ((s[j + 1] >> 6) << 4);
    }
    float d0 = d * (float)sc0, n0 = dmin * (float)m0, d1 = d * (float)sc1, n1 = dmin * (float)m1;
    uint4 v = *(const uint4 *)(b + 16 + 32 * i + 16 * hf);
    uint32_t q[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 16; k++) {
        int byte = (q[k >> 2] >> (8 * (k & 3))) & 0xff;
        wa[k] = __fsub_rn(__fmul_rn(d0, (float)(byte & 15)), n0);
        wb[k] = __fsub_rn(__fmul_rn(d1, (float)(byte >> 4)), n1);
    }
    *ea = (u >> 3) * 256 + 64 * i + 16 * hf;
    *eb = *ea + 32;
}

template <>
__device__ inline void unit32<TS_DTYPE_Q6_K>(const uint8_t *row, int64_t u, float *wa, float *wb,
                                             int64_t *ea, int64_t *eb) {
    const uint8_t *b = row + (u >> 3) * 210; /* 2-byte aligned */
    int h = (int)(u >> 2) & 1, l0 = ((int)(u >> 1) & 1) * 16, qp = (int)u & 1;
    float d = f16f(ld16(b + 208));
    const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + (l0 >> 4);
    float da = __fmul_rn(d, (float)sc[2 * qp]), db = __fmul_rn(d, (float)sc[2 * qp + 4]);
    int ql[16], qh[16];
    bytes8(b + 64 * h + qp * 32 + l0, ql), bytes8(b + 64 * h + qp * 32 + l0 + 8, ql + 8);
    bytes8(b + 128 + 32 * h + l0, qh), bytes8(b + 128 + 32 * h + l0 + 8, qh + 8);
#pragma unroll
    for (int k = 0; k < 16; k++) {
        int qa = ((ql[k] & 15) | ((qh[k] >> (2 * qp)) & 3) << 4) - 32;
        int qb = ((ql[k] >> 4) | ((qh[k] >> (2 * qp + 4)) & 3) << 4) - 32;
        wa[k] = __fmul_rn(da, (float)qa);
        wb[k] = __fmul_rn(db, (float)qb);
    }
    *ea = (u >> 3) * 256 + 128 * h + 32 * qp + l0;
    *eb = *ea + 64;
}

#endif
