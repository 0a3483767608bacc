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

/* (float)((int)v - bias) for a code 0 <= v < 2^22 and an integer bias, without the int-to-float
 * conversion, a quarter-rate instruction on sm_90 that bounded the quantized GEMVs: the float
 * whose low mantissa bits hold v is 2^23 + v, and subtracting 2^23 + bias from it is exact - the
 * conversion's value, bit for bit. */
__device__ static inline float code_f(uint32_t v, float bias) {
    return __int_as_float(0x4B000000u | v) - (8388608.0f + bias);
}

/* code_f of byte i (0..3) of v: one byte permute builds the float, where a shift and a mask
 * would take two instructions. With v's bytes already codes (nibbles or 6-bit values masked
 * four at a time), a K-quant weight costs a permute, the subtraction and its scaling. */
__device__ static inline float byte_f(uint32_t v, int i, float bias) {
    return __int_as_float(__byte_perm(v, 0x4B000000u, 0x7540u | (unsigned)i)) - (8388608.0f + bias);
}

/* Q8_0, Q4_0, Q5_0 in the device's layout (cuda_int.cuh's q32_*): a block's d, its codes
 * (16-byte aligned; a group of 8 elements is 8 bytes of them at a multiple of 8) and Q5_0's qh. */
template <> __device__ inline void group8<TS_DTYPE_Q8_0>(const uint8_t *row, int64_t e, float *w) {
    constexpr ts_dtype T = TS_DTYPE_Q8_0;
    int64_t b = e >> 5;
    float d = f16f(ld16(row + q32_dev_d(T, b)));
    uint2 v = *(const uint2 *)(row + q32_dev_codes(T, b) + (e & 31));
#pragma unroll
    for (int i = 0; i < 8; i++)
        w[i] = code_f(((i < 4 ? v.x : v.y) >> (8 * (i & 3)) & 0xffu) ^ 0x80u, 128.0f) * d;
}

/* Q4_0 / Q5_0: element p < 16 of a block is the low nibble of qs[p], p >= 16 the high nibble of
 * qs[p - 16] */
template <> __device__ inline void group8<TS_DTYPE_Q4_0>(const uint8_t *row, int64_t e, float *w) {
    constexpr ts_dtype T = TS_DTYPE_Q4_0;
    int64_t b = e >> 5;
    int p = (int)(e & 31), shift = (p >> 4) * 4;
    float d = f16f(ld16(row + q32_dev_d(T, b)));
    uint2 v = *(const uint2 *)(row + q32_dev_codes(T, b) + (p & 15));
#pragma unroll
    for (int i = 0; i < 8; i++)
        w[i] = code_f(((i < 4 ? v.x : v.y) >> (8 * (i & 3) + shift)) & 15, 8.0f) * d;
}

template <> __device__ inline void group8<TS_DTYPE_Q5_0>(const uint8_t *row, int64_t e, float *w) {
    constexpr ts_dtype T = TS_DTYPE_Q5_0;
    int64_t b = e >> 5;
    int p = (int)(e & 31), shift = (p >> 4) * 4;
    float d = f16f(ld16(row + q32_dev_d(T, b)));
    uint32_t qh = *(const uint32_t *)(row + q32_dev_qh(T, b));
    uint2 v = *(const uint2 *)(row + q32_dev_codes(T, b) + (p & 15));
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint32_t q = ((i < 4 ? v.x : v.y) >> (8 * (i & 3) + shift)) & 15;
        w[i] = code_f(q | ((qh >> (p + i)) & 1) << 4, 16.0f) * d;
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
        w[i] = __fsub_rn(__fmul_rn(d1, code_f((byte >> shift) & 15, 0.0f)), m1);
    }
}

/* Q6_K in the device's layout (cuda_int.cuh's q6k_dev_block) */
template <> __device__ inline void group8<TS_DTYPE_Q6_K>(const uint8_t *row, int64_t e, float *w) {
    const uint8_t *b = row + q6k_dev_block(e >> 8); /* 16-byte aligned */
    int k = (int)(e & 255), h = k >> 7, qt = (k >> 5) & 3, l = k & 31;
    float d = f16f(ld16(row + q6k_dev_d(e >> 8)));
    float ds = __fmul_rn(d, (float)((const int8_t *)(b + 192))[8 * h + 2 * qt + (l >> 4)]);
    uint2 ql = *(const uint2 *)(b + 64 * h + (qt & 1) * 32 + l); /* l: a multiple of 8 */
    uint2 qh = *(const uint2 *)(b + 128 + 32 * h + l);
    int lshift = (qt >> 1) * 4, hshift = 2 * qt;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int sh = 8 * (i & 3);
        int lo = (int)((i < 4 ? ql.x : ql.y) >> sh) & 0xff,
            hi = (int)((i < 4 ? qh.x : qh.y) >> sh) & 0xff;
        int q = ((lo >> lshift) & 15) | ((hi >> hshift) & 3) << 4;
        w[i] = __fmul_rn(ds, code_f(q, 32.0f));
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

/* Byte k of a Q4_K super-block's 12 scale bytes, from its first 16 bytes h (d, dmin, scales). */
__device__ static inline int q4k_sbyte(uint4 h, int k) {
    uint32_t w = k < 4 ? h.y : k < 8 ? h.z : h.w;
    return (int)(w >> (8 * (k & 3))) & 0xff;
}

/* Sub-block j's 6-bit scale and min, from the super-block's first 16 bytes h. */
__device__ static inline void q4k_scale_min(uint4 h, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q4k_sbyte(h, j) & 63, *m = q4k_sbyte(h, j + 4) & 63;
    } else {
        *sc = (q4k_sbyte(h, j + 4) & 15) | ((q4k_sbyte(h, j - 4) >> 6) << 4);
        *m = (q4k_sbyte(h, j + 4) >> 4) | ((q4k_sbyte(h, j) >> 6) << 4);
    }
}

/* Where Q4_K unit u's 16 code bytes lie in its row. */
__device__ static inline int64_t q4k_code_offset(int64_t u) {
    return (u >> 3) * 144 + 16 + 32 * ((u >> 1) & 3) + 16 * (u & 1);
}

/* The first element of Q4_K unit u's low-nibble run (its high-nibble run starts 32 later). */
__device__ static inline int64_t q4k_unit_start(int64_t u) {
    return (u >> 3) * 256 + 64 * ((u >> 1) & 3) + 16 * (u & 1);
}

/* Q4_K unit u from its raw bytes, already loaded: h, the super-block's first 16 bytes (d, dmin,
 * the scales), v, the unit's code bytes. The single-token GEMV loads these itself (several
 * rows' units in flight at once) and decodes them here, with unit32's values. */
__device__ static inline void q4k_unit(uint4 h, uint4 v, int64_t u, float *wa, float *wb,
                                       int64_t *ea, int64_t *eb) {
    int j = 2 * ((int)(u >> 1) & 3);
    float d = f16f((uint16_t)(h.x & 0xffffu)), dmin = f16f((uint16_t)(h.x >> 16));
    int sc0, m0, sc1, m1; /* sub-blocks j (< 7) and j + 1 */
    q4k_scale_min(h, j, &sc0, &m0);
    q4k_scale_min(h, j + 1, &sc1, &m1);
    float d0 = d * (float)sc0, n0 = dmin * (float)m0, d1 = d * (float)sc1, n1 = dmin * (float)m1;
    uint32_t q[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 16; k++) { /* four low and four high nibbles a word */
        uint32_t lo = q[k >> 2] & 0x0F0F0F0Fu, hi = (q[k >> 2] >> 4) & 0x0F0F0F0Fu;
        wa[k] = __fsub_rn(__fmul_rn(d0, byte_f(lo, k & 3, 0.0f)), n0);
        wb[k] = __fsub_rn(__fmul_rn(d1, byte_f(hi, k & 3, 0.0f)), n1);
    }
    *ea = q4k_unit_start(u);
    *eb = *ea + 32;
}

template <>
__device__ inline void unit32<TS_DTYPE_Q4_K>(const uint8_t *row, int64_t u, float *wa, float *wb,
                                             int64_t *ea, int64_t *eb) {
    /* 16-byte aligned: rows are whole 144-byte super-blocks */
    uint4 h = *(const uint4 *)(row + (u >> 3) * 144);
    q4k_unit(h, *(const uint4 *)(row + q4k_code_offset(u)), u, wa, wb, ea, eb);
}

/* The raw bytes of Q6_K unit u (device layout): its 16 ql and 16 qh bytes, the 8 scale bytes of
 * its half (two of them its own), and its block's d. */
typedef struct {
    uint4 ql, qh;
    uint2 sc;
    uint32_t d;
} q6k_raw;

__device__ static inline q6k_raw q6k_load(const uint8_t *row, int64_t u) {
    const uint8_t *b = row + q6k_dev_block(u >> 3);
    int h = (int)(u >> 2) & 1, l0 = ((int)(u >> 1) & 1) * 16, qp = (int)u & 1;
    q6k_raw r;
    r.ql = *(const uint4 *)(b + 64 * h + qp * 32 + l0);
    r.qh = *(const uint4 *)(b + 128 + 32 * h + l0);
    r.sc = *(const uint2 *)(b + 192 + 8 * h);
    r.d = ld16(row + q6k_dev_d(u >> 3));
    return r;
}

/* The first element of Q6_K unit u's first run (its second starts 64 later). */
__device__ static inline int64_t q6k_unit_start(int64_t u) {
    return (u >> 3) * 256 + 128 * ((u >> 2) & 1) + 32 * (u & 1) + 16 * ((u >> 1) & 1);
}

/* Q6_K unit u from its raw bytes (q6k_load, or the single-token GEMV's own loads). */
__device__ static inline void q6k_unit(const q6k_raw &r, int64_t u, float *wa, float *wb,
                                       int64_t *ea, int64_t *eb) {
    int l0 = ((int)(u >> 1) & 1) * 16, qp = (int)u & 1;
    float d = f16f((uint16_t)r.d);
    int si = 8 * ((l0 >> 4) + 2 * qp); /* scale (l0 / 16 + 2 qp) of the half, and that + 4 */
    float da = __fmul_rn(d, (float)(int8_t)(r.sc.x >> si));
    float db = __fmul_rn(d, (float)(int8_t)(r.sc.y >> si));
    uint32_t ql[4] = {r.ql.x, r.ql.y, r.ql.z, r.ql.w}, qh[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
#pragma unroll
    for (int k = 0; k < 16; k++) { /* four 6-bit codes of each run a word, masked together */
        uint32_t l = ql[k >> 2], h = qh[k >> 2];
        uint32_t qa = (l & 0x0F0F0F0Fu) | ((h >> (2 * qp)) & 0x03030303u) << 4;
        uint32_t qb = ((l >> 4) & 0x0F0F0F0Fu) | ((h >> (2 * qp + 4)) & 0x03030303u) << 4;
        wa[k] = __fmul_rn(da, byte_f(qa, k & 3, 32.0f));
        wb[k] = __fmul_rn(db, byte_f(qb, k & 3, 32.0f));
    }
    *ea = q6k_unit_start(u);
    *eb = *ea + 64;
}

template <>
__device__ inline void unit32<TS_DTYPE_Q6_K>(const uint8_t *row, int64_t u, float *wa, float *wb,
                                             int64_t *ea, int64_t *eb) {
    q6k_unit(q6k_load(row, u), u, wa, wb, ea, eb);
}

#endif
