/* One channel's causal conv for one token of a decode step, in three parts so that a kernel
 * can place each where its dependencies allow: the channel's weights and state read before the
 * programmatic wait (no kernel writes the weights; the state was written by the same kernel a
 * step ago), the sum once the token's x is known, the state shifted by that token when no one
 * still reads it. k_conv1d_silu's arithmetic (cuda_ops_seq.cu), bit for bit. Convs of up to
 * PREP_KMAX taps. Used by conv_gdn_prep (cuda_ops_fused.cu) and the delta rule's fused decode
 * step (cuda_ops_seq.cu). */
#pragma once

#include "backend/cuda/cuda_int.cuh"

#define PREP_KMAX 4
typedef struct {
    float w[PREP_KMAX], s[PREP_KMAX - 1];
} conv_early;

/* Channel ch's K weights and K - 1 state taps (state: [K - 1][C]) */
__device__ static inline void conv_early_load(const float *w, const float *state, int C, int K,
                                              int ch, conv_early *e) {
#pragma unroll
    for (int k = 0; k < PREP_KMAX; k++)
        e->w[k] = k < K ? w[(int64_t)ch * K + k] : 0.0f;
#pragma unroll
    for (int k = 0; k < PREP_KMAX - 1; k++)
        e->s[k] = k < K - 1 ? state[(int64_t)k * C + ch] : 0.0f;
}

/* SiLU of the conv of the channel's taps and the token's value xv */
__device__ static inline float conv_sum(const conv_early &e, float xv, int K) {
    int hist = K - 1;
    float s = 0.0f;
    /* k_conv1d_silu's s += w * v, contracted, as explicit fmas: left to the compiler, the taps
     * of the state (known before the wait) became plain multiplies there - other bits */
#pragma unroll
    for (int k = 0; k < PREP_KMAX; k++)
        if (k < K) s = __fmaf_rn(e.w[k], k < hist ? e.s[k] : xv, s);
    return s / (1.0f + expf(-s));
}

/* The channel's state after the token xv */
__device__ static inline void conv_shift(const conv_early &e, float xv, int C, int K, float *state,
                                         int ch) {
    int hist = K - 1;
#pragma unroll
    for (int k = 0; k < PREP_KMAX - 1; k++)
        if (k < hist) state[(int64_t)k * C + ch] = k + 1 < hist ? e.s[k + 1] : xv;
}
