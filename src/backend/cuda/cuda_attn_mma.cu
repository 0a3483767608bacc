/* Attention for prompts on the tensor cores: one sequence's queries over its KV cache, causal,
 * with ts_attn_dims' sliding window and soft cap, heads of 64, 128 or 256 dims (Qwen3.5's and
 * Gemma 3's are 256); in a batch of several sequences, each run of CUDA_ATTN_MMA_MIN queries or
 * more in turn. The fp32 tiled kernel (cuda_ops_seq.cu) does ~7 TFLOP/s of fp32
 * arithmetic: fine for a 512-token prompt (0.15 ms a layer of the 0.8B), but its work grows with
 * the square of the prompt, and at a few thousand tokens attention becomes most of a prefill.
 *
 * Precision: bf16x3. Every operand (q, k, v and the softmax weights p) is split into a bf16
 * high part and the bf16 rounding of its remainder, and each product is hi*hi + hi*lo + lo*hi
 * in fp32 accumulators (lo*lo, ~2^-16 of the product, left out): about 16 bits of each operand
 * where one bf16 product would keep 8 - the results within ~1e-5 of the fp32 kernel's, in line
 * with the GEMMs' hi and lo activations (cuda_matmul.cu).
 *
 * Two steps. First the operands are split and written in the order a warp's mma fragments read
 * them (k_am_split_q, k_am_split_kv): a lane's fragment for one mma step is one 16-byte load,
 * coalesced over the warp, with no shared memory, no bank conflicts and no layout work left in
 * the main loop. The keys are split once a call (not once a query block), the queries once.
 * Then k_attention_mma: a warp owns 16 queries of one head (4 warps a block, consecutive
 * groups: they read the same keys, which the L1 cache then serves) and walks their keys in
 * tiles of 32: S = Q K^T (16 x 32, four 8-key mma tiles; the hi*hi products and the two small
 * ones in accumulators apart, so that no chain is longer than needed), the mask and the online
 * softmax on the accumulators in registers (a row's 32 scores are spread over the 4 lanes of a
 * quad: max and sum by two shuffles), and O += P V with P taken straight from S's accumulator
 * layout as the A operand (the layouts agree, pair by pair), O (16 x D) in registers. The last
 * query groups (the most keys) go first. */
#include "backend/cuda/cuda_int.cuh"
#include "backend/cuda/cuda_mma.cuh"

#include <cuda_bf16.h>
#include <math.h> /* INFINITY */

#define AM_KT    32 /* keys a tile */
#define AM_WARPS 4  /* 16-query groups a block, at most (fewer where the grid would be short) */
/* The most scratch the split operands may take: every key a call sees is split, so a chunk of
 * a very long context would ask for ~4 KB a key (the 0.8B's heads); past this - or where the
 * device has not the memory - the fp32 tiled kernel, which needs none, takes the call (the
 * 0.8B: up to ~130k keys) */
#define AM_SCRATCH_MAX ((size_t)512 << 20)

/* (x0, x1) as bf16 pairs: hi their rounding, lo that of the remainders */
__device__ static inline void am_split(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    float2 hf = __bfloat1622float2(h);
    __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
    hi = *(uint32_t *)&h;
    lo = *(uint32_t *)&l;
}

/* Fragment entry e, ((head * groups + g) * (D / 16) + c) * 32 + lane, by its parts: the lane,
 * its group of four (gr) and place in it (t), the 16-wide column c, the group and the head */
typedef struct {
    int lane, gr, t, c, g, h;
} am_entry;
__device__ static inline am_entry am_entry_of(int64_t e, int C, int groups) {
    am_entry x;
    x.lane = (int)(e & 31), x.gr = x.lane >> 2, x.t = x.lane & 3;
    int64_t f = e >> 5;
    x.c = (int)(f % C), x.g = (int)(f / C % groups), x.h = (int)(f / C / groups);
    return x;
}

/* The queries of every head as A fragments (16 queries x 16 dims), rows past n zero: entry
 * ((h * ng + g) * (D / 16) + c) * 32 + lane of hi and of lo. */
template <int D>
__global__ static void k_am_split_q(const float *q, int64_t ldq, int64_t qhs, int n, int n_heads,
                                    int ng, uint4 *hi, uint4 *lo) {
    cuda_pdl_entry();
    constexpr int C = D / 16;
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (int64_t)n_heads * ng * C * 32) return;
    am_entry x = am_entry_of(e, C, ng);
    int r0 = x.g * 16 + x.gr, r1 = r0 + 8;
    const float *qh = q + (int64_t)x.h * qhs + x.c * 16 + 2 * x.t;
    auto at = [&](int r, int dc) { return r < n ? qh[(int64_t)r * ldq + dc] : 0.0f; };
    uint32_t a[4], b[4];
    am_split(at(r0, 0), at(r0, 1), a[0], b[0]);
    am_split(at(r1, 0), at(r1, 1), a[1], b[1]);
    am_split(at(r0, 8), at(r0, 9), a[2], b[2]);
    am_split(at(r1, 8), at(r1, 9), a[3], b[3]);
    hi[e] = make_uint4(a[0], a[1], a[2], a[3]);
    lo[e] = make_uint4(b[0], b[1], b[2], b[3]);
}

/* Keys [kmin, kmin + 16 * nkg) of every KV head as B fragments, keys past kmax zero, entry
 * ((kvh * nkg + g) * (D / 16) + c) * 32 + lane; each entry two 8-wide mma tiles (x, y and z, w):
 * for S = Q K^T, keys 16g + 0..7 and 8..15 over dims 16c .. 16c + 15 (B[dim][key] = K[key][dim]);
 * for P V, dims 16c + 0..7 and 8..15 over keys 16g .. 16g + 15 (B[key][dim] = V[key][dim]). */
template <int D>
__global__ static void k_am_split_kv(const float *kc, const float *vc, int64_t ldkv, int n_kv,
                                     int kmin, int kmax, int nkg, uint4 *khi, uint4 *klo,
                                     uint4 *vhi, uint4 *vlo) {
    cuda_pdl_entry();
    constexpr int C = D / 16;
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (int64_t)n_kv * nkg * C * 32) return;
    am_entry x = am_entry_of(e, C, nkg);
    int key0 = kmin + x.g * 16, c = x.c, gr = x.gr, t = x.t;
    auto at = [&](const float *m, int key, int dim) {
        return key < kmax ? m[(int64_t)key * ldkv + (int64_t)x.h * D + dim] : 0.0f;
    };
    uint32_t h[4], l[4];
    for (int nt = 0; nt < 2; nt++) { /* K: key 16g + 8nt + gr, dims 2t, 2t + 1 and 8 on */
        int key = key0 + nt * 8 + gr, dim = c * 16 + 2 * t;
        am_split(at(kc, key, dim), at(kc, key, dim + 1), h[2 * nt], l[2 * nt]);
        am_split(at(kc, key, dim + 8), at(kc, key, dim + 9), h[2 * nt + 1], l[2 * nt + 1]);
    }
    khi[e] = make_uint4(h[0], h[1], h[2], h[3]);
    klo[e] = make_uint4(l[0], l[1], l[2], l[3]);
    for (int nt = 0; nt < 2; nt++) { /* V: dim 16c + 8nt + gr, keys 2t, 2t + 1 and 8 on */
        int key = key0 + 2 * t, dim = c * 16 + nt * 8 + gr;
        am_split(at(vc, key, dim), at(vc, key + 1, dim), h[2 * nt], l[2 * nt]);
        am_split(at(vc, key + 8, dim), at(vc, key + 9, dim), h[2 * nt + 1], l[2 * nt + 1]);
    }
    vhi[e] = make_uint4(h[0], h[1], h[2], h[3]);
    vlo[e] = make_uint4(l[0], l[1], l[2], l[3]);
}

/* c += a b for an A fragment and one 8-wide B tile (b0, b1) */
__device__ static inline void am_mma(float *c, const uint4 &a, uint32_t b0, uint32_t b1) {
    mma16816<true>(c, a.x, a.y, a.z, a.w, b0, b1);
}

/* One 16-wide k step of the three products into two 8-wide tiles (bh / bl's x, y and z, w):
 * c += ah bh, then x += al bh + ah bl (x the same accumulators as c, or its own) */
__device__ static inline void am_mma3(float *c0, float *c1, float *x0, float *x1, const uint4 &ah,
                                      const uint4 &al, const uint4 &bh, const uint4 &bl) {
    am_mma(c0, ah, bh.x, bh.y);
    am_mma(c1, ah, bh.z, bh.w);
    am_mma(x0, al, bh.x, bh.y);
    am_mma(x1, al, bh.z, bh.w);
    am_mma(x0, ah, bl.x, bl.y);
    am_mma(x1, ah, bl.z, bl.w);
}

/* A row's max and sum over the 4 lanes of its quad */
__device__ static inline float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ static inline float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <int D>
__global__ static void __launch_bounds__(32 * AM_WARPS)
    k_attention_mma(const uint4 *qhi, const uint4 *qlo, const uint4 *khi, const uint4 *klo,
                    const uint4 *vhi, const uint4 *vlo, int n, int pos0, int kmin, int ng, int nkg,
                    ts_attn_dims d, float *out, int64_t ldo) {
    cuda_pdl_entry();
    constexpr int C = D / 16;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;
    int wpb = blockDim.x >> 5, h = (int)(blockIdx.x % d.n_heads), blocks = (ng + wpb - 1) / wpb;
    int g = (blocks - 1 - (int)(blockIdx.x / d.n_heads)) * wpb + warp; /* longest first */
    if (g >= ng) return;
    int kvh = h / (d.n_heads / d.n_kv_heads), i0 = g * 16;
    /* this lane's two rows (gr and gr + 8): their positions, -1 past the prompt (no keys) */
    int p0 = i0 + gr < n ? pos0 + i0 + gr : -1, p1 = i0 + gr + 8 < n ? pos0 + i0 + gr + 8 : -1;
    int kend = pos0 + min(i0 + 15, n - 1); /* the last key of the group's last row */
    int kbeg = d.window > 0 ? max(kmin, pos0 + i0 - d.window + 1) : kmin;
    const uint4 *qh = qhi + ((int64_t)h * ng + g) * C * 32 + lane;
    const uint4 *ql = qlo + ((int64_t)h * ng + g) * C * 32 + lane;
    /* the warp's query fragments copied once into shared memory, where no key or value load
     * pushes them out as in L1 (read there at each tile, the kernel took 19% longer: 62% of
     * its L1 reads hit, 75% now); a lane reads back only what it wrote: no barrier */
    extern __shared__ uint4 am_smem[];
    uint4 *qs = am_smem + warp * 2 * C * 32 + lane;
    for (int c = 0; c < C; c++)
        qs[c * 32] = __ldg(qh + c * 32), qs[(C + c) * 32] = __ldg(ql + c * 32);
    int64_t kvo = (int64_t)kvh * nkg * C * 32 + lane;
    const uint4 *kh = khi + kvo, *kl = klo + kvo, *vh = vhi + kvo, *vl = vlo + kvo;
    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    for (int kt = (kbeg - kmin) / AM_KT; kt <= (kend - kmin) / AM_KT; kt++) {
        float s[4][4], sx[4][4];
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                s[j][i] = sx[j][i] = 0.0f;
#pragma unroll 4
        for (int c = 0; c < C; c++) {
            uint4 a = qs[c * 32], al = qs[(C + c) * 32];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                int64_t at = ((int64_t)(2 * kt + j) * C + c) * 32;
                uint4 b = __ldg(kh + at), bl = __ldg(kl + at);
                am_mma3(s[2 * j], s[2 * j + 1], sx[2 * j], sx[2 * j + 1], a, al, b, bl);
            }
        }
        /* logits, masked: key kb + 8j + 2t + i of rows p0 (i = 0, 1) and p1 (i = 2, 3) */
        int kb = kmin + kt * AM_KT;
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int key = kb + 8 * j + 2 * t + (i & 1), p = i < 2 ? p0 : p1;
                bool vis = key <= p && (d.window <= 0 || key > p - d.window);
                float x = vis ? attn_logit(s[j][i] + sx[j][i], d) : -INFINITY;
                s[j][i] = x;
                if (i < 2)
                    mx0 = fmaxf(mx0, x);
                else
                    mx1 = fmaxf(mx1, x);
            }
        float mn0 = fmaxf(m0, quad_max(mx0)), mn1 = fmaxf(m1, quad_max(mx1));
        /* a row with no key yet keeps m = -inf: its weights and correction from base 0 */
        float b0 = mn0 == -INFINITY ? 0.0f : mn0, b1 = mn1 == -INFINITY ? 0.0f : mn1;
        float c0 = expf(m0 - b0), c1 = expf(m1 - b1);
        m0 = mn0, m1 = mn1, l0 *= c0, l1 *= c1;
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float p = expf(s[j][i] - (i < 2 ? b0 : b1));
                s[j][i] = p;
                if (i < 2)
                    l0 += p;
                else
                    l1 += p;
            }
#pragma unroll
        for (int j = 0; j < D / 8; j++)
            o[j][0] *= c0, o[j][1] *= c0, o[j][2] *= c1, o[j][3] *= c1;
            /* P as A fragments, 16 keys each: S's accumulator pairs are A's register pairs */
#pragma unroll
        for (int kc = 0; kc < 2; kc++) {
            uint4 ph, pl;
            am_split(s[2 * kc][0], s[2 * kc][1], ph.x, pl.x);
            am_split(s[2 * kc][2], s[2 * kc][3], ph.y, pl.y);
            am_split(s[2 * kc + 1][0], s[2 * kc + 1][1], ph.z, pl.z);
            am_split(s[2 * kc + 1][2], s[2 * kc + 1][3], ph.w, pl.w);
#pragma unroll
            for (int c = 0; c < C; c++) {
                int64_t at = ((int64_t)(2 * kt + kc) * C + c) * 32;
                uint4 b = __ldg(vh + at), bl = __ldg(vl + at);
                am_mma3(o[2 * c], o[2 * c + 1], o[2 * c], o[2 * c + 1], ph, pl, b, bl);
            }
        }
    }
    l0 = quad_sum(l0), l1 = quad_sum(l1);
    float *r0 = out + (int64_t)(i0 + gr) * ldo + (int64_t)h * D + 2 * t;
    float *r1 = r0 + 8 * ldo;
    float i0v = p0 >= 0 ? 1.0f / l0 : 0.0f, i1v = p1 >= 0 ? 1.0f / l1 : 0.0f;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
        if (p0 >= 0) r0[8 * j] = o[j][0] * i0v, r0[8 * j + 1] = o[j][1] * i0v;
        if (p1 >= 0) r1[8 * j] = o[j][2] * i1v, r1[8 * j + 1] = o[j][3] * i1v;
    }
}

/* The queries' fragments in shared memory: bytes a block of wpb warps */
#define AM_SMEM(wpb, D) ((size_t)(wpb)*2 * (D)*32)

/* Whether the kernels take these heads (64, 128 or 256 dims, whole groups of query heads a
 * KV head) on this device; the first call allows the kernels their shared memory. */
static bool am_takes(cuda_ctx *c, const ts_attn_dims *d) {
    int hd = d->head_dim;
    if (!c->attn_mma || c->cc < 80 || (hd != 64 && hd != 128 && hd != 256) || d->n_kv_heads < 1 ||
        d->n_heads % d->n_kv_heads)
        return false;
    if (!c->attn_mma_opted) {
        const void *k[] = {(const void *)k_attention_mma<64>, (const void *)k_attention_mma<128>,
                           (const void *)k_attention_mma<256>};
        c->attn_mma = cuda_allow_smem(c, k, 3, (int)AM_SMEM(AM_WARPS, 256));
        c->attn_mma_opted = true;
    }
    return c->attn_mma;
}

/* The fragment groups of n queries at pos0 (ng) and of the keys they see (kmin on, nkg), and
 * the scratch bytes they take: hi and lo, 2 bytes each a value, 16 rows of hd values a group */
typedef struct {
    int ng, kmin, nkg;
    size_t bytes;
} am_shape;
static am_shape am_shape_of(const ts_attn_dims *d, int n, int pos0) {
    am_shape s;
    s.ng = (n + 15) / 16;
    s.kmin = d->window > 0 && pos0 - d->window + 1 > 0 ? pos0 - d->window + 1 : 0;
    s.nkg = (pos0 + n - s.kmin + AM_KT - 1) / AM_KT * (AM_KT / 16);
    s.bytes = (size_t)2 * 2 * 16 * d->head_dim *
              ((size_t)d->n_heads * s.ng + 2 * (size_t)d->n_kv_heads * s.nkg);
    return s;
}

template <int D>
static void am_launch(cuda_ctx *c, const float *q, int64_t ldq, int64_t qhs, int n, int pos0,
                      const float *kc, const float *vc, const ts_attn_dims *d, float *out,
                      int64_t ldo, am_shape sh, uint4 *buf) {
    constexpr int C = D / 16;
    int ng = sh.ng, kmin = sh.kmin, nkg = sh.nkg;
    int64_t qe = (int64_t)d->n_heads * ng * C * 32, ke = (int64_t)d->n_kv_heads * nkg * C * 32;
    uint4 *qhi = buf, *qlo = qhi + qe, *khi = qlo + qe, *klo = khi + ke, *vhi = klo + ke,
          *vlo = vhi + ke;
    cuda_launch(c, "attention_mma_split", k_am_split_q<D>, dim3(cuda_blocks(qe, 256)), 256, 0, q,
                ldq, qhs, n, d->n_heads, ng, qhi, qlo);
    cuda_launch(c, "attention_mma_split", k_am_split_kv<D>, dim3(cuda_blocks(ke, 256)), 256, 0, kc,
                vc, (int64_t)d->n_kv_heads * D, d->n_kv_heads, kmin, pos0 + n, nkg, khi, klo, vhi,
                vlo);
    /* short prompts: fewer warps a block, so that the blocks reach every multiprocessor */
    int wpb = AM_WARPS;
    while (wpb > 1 && (int64_t)d->n_heads * ((ng + wpb - 1) / wpb) < 2 * c->sm_count)
        wpb /= 2;
    int blocks = (ng + wpb - 1) / wpb;
    cuda_launch(c, "attention_mma", k_attention_mma<D>,
                dim3((unsigned)((int64_t)d->n_heads * blocks)), 32 * wpb, AM_SMEM(wpb, D), qhi, qlo,
                khi, klo, vhi, vlo, n, pos0, kmin, ng, nkg, *d, out, ldo);
}

static void am_run(cuda_ctx *c, const float *q, int64_t ldq, int64_t qhs, int n, int pos0,
                   const float *kc, const float *vc, const ts_attn_dims *d, float *out, int64_t ldo,
                   am_shape sh, uint4 *buf) {
    if (d->head_dim == 64)
        am_launch<64>(c, q, ldq, qhs, n, pos0, kc, vc, d, out, ldo, sh, buf);
    else if (d->head_dim == 128)
        am_launch<128>(c, q, ldq, qhs, n, pos0, kc, vc, d, out, ldo, sh, buf);
    else
        am_launch<256>(c, q, ldq, qhs, n, pos0, kc, vc, d, out, ldo, sh, buf);
}

bool cuda_attention_mma(cuda_ctx *c, const float *q, int64_t ldq, int64_t qhs, int n, int pos0,
                        const float *kc, const float *vc, const ts_attn_dims *d, float *out,
                        int64_t ldo) {
    am_shape sh = am_shape_of(d, n, pos0);
    if (n < CUDA_ATTN_MMA_MIN || sh.bytes > AM_SCRATCH_MAX || !am_takes(c, d)) return false;
    /* short of device memory for the split operands, the fp32 kernel (which needs none) */
    uint4 *buf = (uint4 *)cuda_scratch_try(c, 7, sh.bytes);
    if (!buf) return false;
    am_run(c, q, ldq, qhs, n, pos0, kc, vc, d, out, ldo, sh, buf);
    return true;
}

/* Several sequences' runs: each of CUDA_ATTN_MMA_MIN queries or more a split and a kernel, one
 * after the other in one scratch buffer (each kernel waits for its predecessor, so a run's
 * split never overwrites operands still read). Where it takes any, rest (nr entries) gets the
 * runs with those taken as runs of none, for the caller's kernels. */
int cuda_attention_mma_runs(cuda_ctx *c, const float *q, int64_t ldq, int64_t qhs,
                            const ts_seq_run *runs, int nr, const ts_attn_dims *d, float *out,
                            int64_t ldo, ts_seq_run *rest) {
    int taken = 0;
    size_t bytes = 0;
    for (int r = 0; r < nr; r++) {
        if (runs[r].len < CUDA_ATTN_MMA_MIN) continue;
        size_t b = am_shape_of(d, runs[r].len, runs[r].pos0).bytes;
        bytes = b > bytes ? b : bytes;
        taken++;
    }
    if (!taken || bytes > AM_SCRATCH_MAX || !am_takes(c, d)) return 0;
    uint4 *buf = (uint4 *)cuda_scratch_try(c, 7, bytes);
    if (!buf) return 0;
    for (int r = 0; r < nr; r++) {
        const ts_seq_run *u = &runs[r];
        rest[r] = *u;
        if (u->len < CUDA_ATTN_MMA_MIN) continue;
        am_run(c, q + u->start * ldq, ldq, qhs, u->len, u->pos0, u->a, u->b, d,
               out + u->start * ldo, ldo, am_shape_of(d, u->len, u->pos0), buf);
        rest[r].len = 0;
    }
    return taken;
}
