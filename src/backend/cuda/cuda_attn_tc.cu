/* Unmasked attention on the tensor cores: an image encoder's (attention_full) for heads of 64
 * dims, the Qwen3.5 vision tower's. The fp32 tiled kernel (cuda_ops_seq.cu) spent ~3.4 ms a
 * block on a 1024x1024 image's 4096 patches (12 heads) on an H100 - 40 of the tower's ~48 ms -
 * at ~15 TFLOP/s of fp32 arithmetic; this one ~2.6 ms (bench/RESULTS.md). It is bound by
 * latency, not by the tensor cores (Nsight Compute: 2 warps a scheduler, 6 cycles an
 * instruction, half of it the wait on the previous mma of the same accumulator) - yet not by
 * those chains: split in two and the four 16-wide blocks' chains side by side, the kernel was
 * no faster (2607 -> 2678 us a block on an H100; bench/RESULTS.md).
 *
 * The products go through TF32 mma (wmma m16n16k8) as three: each operand split into a TF32
 * high part and the TF32 rounding of its remainder, and hi*lo + lo*hi + hi*hi summed in fp32
 * (the lo*lo term, ~2^-22 of the product, left out) - the fp32 kernel's results within ~1e-6,
 * where one TF32 product would be ~1e-3 off.
 *
 * A block is 8 warps and 128 queries of one head (16 a warp); it walks the keys in tiles of
 * 64, staged with cp.async into two buffers (the next while the current is used) and split
 * into high and low parts once for all warps (the low parts in a buffer of their own); a
 * warp's queries are split once, in its fragments. Per tile a warp computes its 16 x 64 scores into
 * shared memory, each pair of lanes takes a row (32 keys a lane) for the online softmax and writes
 * the weights back over the scores, then the warp's P V goes through shared memory into the lanes'
 * accumulators (32 dims a lane, rescaled by the row's correction first - wmma's accumulator layout
 * is opaque, so rows cannot be rescaled in it). Keys and queries past n are staged as zeros; past-n
 * keys get weight 0. */
#include "backend/cuda/cuda_int.cuh"

#include <float.h>
#include <mma.h>

using namespace nvcuda;

#define TC_WARPS 8
#define TC_Q     (16 * TC_WARPS) /* queries a block */
#define TC_K     64              /* keys a tile */
#define TC_D     64              /* dims a head */
#define TC_LD    (TC_D + 4)      /* row stride of the query, key, value and output tiles */
#define TC_SLD   (TC_K + 4)      /* row stride of a warp's scores */

/* The query tile, two buffers of [keys][values], the current tile's low parts, a warp's
 * scores and P V: floats */
#define TC_SMEM                                                                                    \
    (sizeof(float) *                                                                               \
     ((size_t)TC_Q * TC_LD + 6 * (size_t)TC_K * TC_LD + (size_t)TC_WARPS * 16 * (TC_SLD + TC_LD)))

typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> frag_bt;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> frag_b;
typedef wmma::fragment<wmma::accumulator, 16, 16, 8, float> frag_c;

/* hi holds the loaded floats: it becomes their TF32 rounding, lo that of the remainder */
template <class F> __device__ static inline void tf32_split(F &hi, F &lo) {
#pragma unroll
    for (int i = 0; i < hi.num_elements; i++) {
        float x = hi.x[i], h = wmma::__float_to_tf32(x);
        hi.x[i] = h;
        lo.x[i] = wmma::__float_to_tf32(x - h);
    }
}

template <class A, class B>
__device__ static inline void mma3(frag_c &c, const A &ah, const A &al, const B &bh, const B &bl) {
    wmma::mma_sync(c, al, bh, c);
    wmma::mma_sync(c, ah, bl, c);
    wmma::mma_sync(c, ah, bh, c);
}

/* A warp's NT blocks of 16 columns of A B into dst (row stride ldd), A given as its K/8 split
 * fragments a k-step each and B as its split tiles hi and lo (row stride TC_LD), whose fragment
 * for column block nt and k-step kc starts nt * nt_at + kc * kc_at floats in: S = Q K^T (K's
 * rows as B's columns) and P V are the same loop over other strides. */
template <class FragB, int NT, int KC>
__device__ static inline void mma3_tiles(const frag_a *ah, const frag_a *al, const float *bh,
                                         const float *bl, int nt_at, int kc_at, float *dst,
                                         int ldd) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        frag_c acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
            FragB h, l;
            wmma::load_matrix_sync(h, bh + nt * nt_at + kc * kc_at, TC_LD);
            wmma::load_matrix_sync(l, bl + nt * nt_at + kc * kc_at, TC_LD);
            mma3(acc, ah[kc], al[kc], h, l);
        }
        wmma::store_matrix_sync(dst + nt * 16, acc, ldd, wmma::mem_row_major);
    }
}

__global__ static void __launch_bounds__(32 * TC_WARPS)
    k_attention_full_tc(const float *q, int64_t ldq, const float *k, const float *v, int64_t ldkv,
                        int n, int n_heads, float scale, float *out, int64_t ldo) {
    cuda_pdl_entry();
    extern __shared__ float4 tc_smem[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *Qs = (float *)tc_smem, *KV = Qs + TC_Q * TC_LD, *Lo = KV + 4 * TC_K * TC_LD;
    float *Ss = Lo + 2 * TC_K * TC_LD + warp * 16 * TC_SLD;
    float *Os = Lo + 2 * TC_K * TC_LD + TC_WARPS * 16 * TC_SLD + warp * 16 * TC_LD;
    int h = (int)(blockIdx.x % n_heads), q0 = (int)(blockIdx.x / n_heads) * TC_Q;
    const float *kh = k + (int64_t)h * TC_D, *vh = v + (int64_t)h * TC_D;
    constexpr int D4 = TC_D / 4;
    for (int i = threadIdx.x; i < TC_Q * D4; i += blockDim.x) {
        int r = i / D4, c = 4 * (i % D4);
        bool in = q0 + r < n;
        cp_async16(Qs + r * TC_LD + c,
                   q + (in ? (int64_t)(q0 + r) * ldq + (int64_t)h * TC_D + c : 0), in);
    }
    auto stage = [&](int buf, int k0) {
        float *Ks = KV + buf * 2 * TC_K * TC_LD, *Vs = Ks + TC_K * TC_LD;
        for (int i = threadIdx.x; i < TC_K * D4; i += blockDim.x) {
            int r = i / D4, c = 4 * (i % D4);
            bool in = k0 + r < n;
            int64_t at = in ? (int64_t)(k0 + r) * ldkv + c : 0;
            cp_async16(Ks + r * TC_LD + c, kh + at, in);
            cp_async16(Vs + r * TC_LD + c, vh + at, in);
        }
        cp_async_commit(); /* the first group takes the queries too */
    };
    int row = lane >> 1, half = lane & 1;
    float m = -FLT_MAX, l = 0.0f, o[TC_D / 2];
#pragma unroll
    for (int j = 0; j < TC_D / 2; j++)
        o[j] = 0.0f;
    frag_a qh[TC_D / 8], ql[TC_D / 8];
    int tiles = (n + TC_K - 1) / TC_K;
    stage(0, 0);
    for (int t = 0; t < tiles; t++) {
        if (t + 1 < tiles) {
            stage((t + 1) & 1, (t + 1) * TC_K);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); /* this tile (the first time, the queries) visible to all */
        if (t == 0)
#pragma unroll
            for (int kc = 0; kc < TC_D / 8; kc++) {
                wmma::load_matrix_sync(qh[kc], Qs + warp * 16 * TC_LD + kc * 8, TC_LD);
                tf32_split(qh[kc], ql[kc]);
            }
        float *Ks = KV + (t & 1) * 2 * TC_K * TC_LD, *Vs = Ks + TC_K * TC_LD;
        const float *Kl = Lo, *Vl = Lo + TC_K * TC_LD;
        /* the tile's keys and values split once for all warps: TF32 high parts in place, the
         * remainders' beside them */
        for (int i = threadIdx.x; i < 2 * TC_K * TC_LD; i += blockDim.x) {
            float x = Ks[i], hi = wmma::__float_to_tf32(x);
            Ks[i] = hi;
            Lo[i] = wmma::__float_to_tf32(x - hi);
        }
        __syncthreads();
        /* the warp's scores S = Q K^T: K's rows read as the columns of B */
        mma3_tiles<frag_bt, TC_K / 16, TC_D / 8>(qh, ql, Ks, Kl, 16 * TC_LD, 8, Ss, TC_SLD);
        __syncwarp();
        /* the online softmax: a lane pair a row, 32 keys a lane; weights over the scores */
        int kb = t * TC_K + half * 32;
        float *sr = Ss + row * TC_SLD + half * 32, mx = -FLT_MAX;
#pragma unroll
        for (int j = 0; j < 32; j++)
            if (kb + j < n) mx = fmaxf(mx, sr[j] * scale);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        float mn = fmaxf(m, mx), corr = expf(m - mn), ps = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            float p = kb + j < n ? expf(sr[j] * scale - mn) : 0.0f;
            sr[j] = p;
            ps += p;
        }
        ps += __shfl_xor_sync(0xffffffffu, ps, 1);
        l = l * corr + ps;
        m = mn;
#pragma unroll
        for (int j = 0; j < TC_D / 2; j++)
            o[j] *= corr;
        __syncwarp();
        /* P V, a 16-dim column block at a time, into the lanes' accumulators */
        frag_a ph[TC_K / 8], pl[TC_K / 8];
#pragma unroll
        for (int kc = 0; kc < TC_K / 8; kc++) {
            wmma::load_matrix_sync(ph[kc], Ss + kc * 8, TC_SLD);
            tf32_split(ph[kc], pl[kc]);
        }
        mma3_tiles<frag_b, TC_D / 16, TC_K / 8>(ph, pl, Vs, Vl, 16, 8 * TC_LD, Os, TC_LD);
        __syncwarp();
        const float *orow = Os + row * TC_LD + half * (TC_D / 2);
#pragma unroll
        for (int j = 0; j < TC_D / 2; j++)
            o[j] += orow[j];
        __syncthreads(); /* every warp is done with this buffer before it is staged again */
    }
    int r = q0 + warp * 16 + row;
    if (r < n) {
        float inv = 1.0f / l, *dst = out + (int64_t)r * ldo + (int64_t)h * TC_D + half * (TC_D / 2);
#pragma unroll
        for (int j = 0; j < TC_D / 2; j++)
            dst[j] = o[j] * inv;
    }
}

bool cuda_attention_full_tc(cuda_ctx *c, const float *q, int64_t ldq, const float *k,
                            const float *v, int64_t ldkv, int n, const ts_attn_dims *d, float *out,
                            int64_t ldo) {
    if (!c->attn_tc || c->cc < 80 || d->head_dim != TC_D || d->softcap != 0.0f || d->window ||
        d->n_kv_heads != d->n_heads || n < 1 || ldq % 4 || ldkv % 4 || ((uintptr_t)q & 15) ||
        ((uintptr_t)k & 15) || ((uintptr_t)v & 15))
        return false;
    if (!c->attn_tc_opted) {
        const void *kern[] = {(const void *)k_attention_full_tc};
        if (!cuda_allow_smem(c, kern, 1, (int)TC_SMEM)) {
            c->attn_tc = false;
            return false;
        }
        c->attn_tc_opted = true;
    }
    int tiles = (n + TC_Q - 1) / TC_Q;
    cuda_launch(c, "attention_full_tc", k_attention_full_tc,
                dim3((unsigned)((int64_t)d->n_heads * tiles)), 32 * TC_WARPS, TC_SMEM, q, ldq, k, v,
                ldkv, n, d->n_heads, d->scale, out, ldo);
    return true;
}
