/* Sequence-mixing ops on the device: causal attention over the KV cache, the causal conv, the
 * Gated DeltaNet gates and delta rule. Each mirrors its CPU reference (backend/cpu/
 * ops_attention.c, ops_gdn.c) step for step in fp32.
 *
 * The delta rule: runs of 32 tokens or more (prefill) take the chunked kernel
 * (cuda_gdn_chunked.cu: all chunks' state-free factors at once, then a scan), shorter ones the
 * recurrent kernel with the state in registers (k_gdn_reg) for heads up to 256 keys, else in shared
 * or global memory.
 *
 * Attention: a block per (head, query) whose warps split the keys; when that leaves the GPU
 * mostly idle (decode of a few sequences over a long context) the keys are split over several
 * blocks as well (flash-decoding) and a second kernel merges their partial softmaxes. */
#include "backend/cuda/cuda_conv_step.cuh"
#include "backend/cuda/cuda_int.cuh"

#include <cooperative_groups.h>
#include <float.h>
#include <math.h>
#include <type_traits>

namespace cg = cooperative_groups;

#define ATTN_WARPS   8
#define MAX_HEAD_DIM 512

/* Partial softmaxes of key splits: for each (run, query, head, split) the running max m, the sum
 * l and the unnormalised accumulator acc[head_dim]. n = 1: no split, the kernel writes out. */
typedef struct {
    int n;
    float *m, *l, *acc;
} attn_parts;

/* attention_step's inputs beyond k_attention's (its STEP form): one sequence's one token, whose
 * q row (q) and new key and value rows (k, v: n_kv_heads heads) are as the projections left
 * them. Each block norms and rotates its q head and its kv head's new key as qk_norm_rope does
 * (into shared memory: a block of ROW_THREADS threads, the same sums), takes the new key and
 * value from there and from v instead of the caches, and the first q head of each kv head (split
 * 0) stores them in the caches - no block reads the new row from a cache. gate (q's layout, not
 * NULL): the output times sigmoid(gate), as sigmoid_gate. */
typedef struct {
    const float *wq, *wk, *k, *v;
    float eps, theta;
    int rot_dim;
    int rope_shift; /* rotary position - cache row (ts_seq_run.rope_shift; per run in runs) */
    const float *gate;
} attn_step_in;

/* q's head and the new key of kv head kvh (raw rows qr, kr) normed and rotated into sq, sk:
 * k_qk_norm_rope's arithmetic, the two sums in one reduction */
__device__ static inline void attn_step_qk(const float *qr, const float *kr, int hd, int pos,
                                           const attn_step_in &st, float *sq, float *sk) {
    double ss[2] = {0.0, 0.0};
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        ss[0] += (double)qr[i] * qr[i];
        ss[1] += (double)kr[i] * kr[i];
    }
    row_sum_blocks<2>(ss);
    float iq = 1.0f / sqrtf((float)(ss[0] / hd) + st.eps);
    float ik = 1.0f / sqrtf((float)(ss[1] / hd) + st.eps);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        sq[i] = (qr[i] * iq) * st.wq[i];
        sk[i] = (kr[i] * ik) * st.wk[i];
    }
    __syncthreads();
    int half = st.rot_dim / 2; /* a thread rotates its pair in place; dims past 2 half stay */
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        cuda_rope_pair(sq[i], sq[i + half], pos, i, st.rot_dim, st.theta, &sq[i], &sq[i + half]);
        cuda_rope_pair(sk[i], sk[i + half], pos, i, st.rot_dim, st.theta, &sk[i], &sk[i + half]);
    }
    __syncthreads();
}

/* An attention output value times its gate, as k_sigmoid_gate computes it */
__device__ static inline float attn_gated(float o, const float *gate, int64_t at) {
    return gate ? o * (1.0f / (1.0f + expf(-gate[at]))) : o;
}

/* A block per (head, query); its warps take every ATTN_WARPS-th key, each with its own online
 * softmax (running max m, sum l, accumulator), and the block merges the warps' partial results
 * at the end. Lane l holds dims l, l + 32, ... of the query and the accumulator. Splitting the
 * keys over warps is what makes decode (one query, hundreds of keys) fast: a single warp would
 * walk them one after another. */
/* A warp's next KEYS_AT_ONCE keys (p0, p0 + ATTN_WARPS, ...; none past last) into registers,
 * all loads in flight together: one round trip a batch instead of one a key. skip: a position
 * left at zero (attention_step's new row, which is not in the caches yet). */
#define KEYS_AT_ONCE 4
template <int NPL>
__device__ static inline void attn_load_keys(const float *kc, const float *vc, int64_t ldkv,
                                             int64_t off, int hd, int lane, int p0, int last,
                                             int skip, float (*kb)[NPL], float (*vb)[NPL]) {
#pragma unroll
    for (int b = 0; b < KEYS_AT_ONCE; b++) {
        int p = p0 + b * ATTN_WARPS;
        bool ok = p <= last && p != skip;
        const float *k = kc + p * ldkv + off, *v = vc + p * ldkv + off;
#pragma unroll
        for (int j = 0; j < NPL; j++) {
            int ch = lane + 32 * j;
            kb[b][j] = ok && ch < hd ? k[ch] : 0.0f;
            vb[b][j] = ok && ch < hd ? v[ch] : 0.0f;
        }
    }
}

template <int NPL, bool STEP>
__device__ static inline void
attention_query(const float *q, int64_t ldq, int64_t q_head_stride, int n, int pos0,
                const float *kc, const float *vc, ts_attn_dims d, float *out, int64_t ldo,
                const ts_seq_run *runs, attn_parts parts, const int32_t *pos_dev, attn_step_in st) {
    /* STEP: the position (uploaded before the step's first kernel) and the first batch of the
     * keys before the new one (rows of earlier steps: no kernel of this step writes them) are
     * read before the programmatic wait, so that their round trip overlaps the predecessor */
    if (!STEP) cuda_pdl_entry();
    if (pos_dev) pos0 = *pos_dev; /* see cuda_kv_pos */
    __shared__ float sm_m[ATTN_WARPS], sm_l[ATTN_WARPS];
    /* [ATTN_WARPS][head_dim]; STEP: then q's head and the new key, normed and rotated */
    extern __shared__ float sm_acc[];
    int h = (int)(blockIdx.x % d.n_heads), i = (int)(blockIdx.x / d.n_heads);
    if (runs) { /* blockIdx.y: the run */
        ts_seq_run r = runs[blockIdx.y];
        if (i >= r.len) return;
        q += r.start * ldq, out += r.start * ldo, pos0 = r.pos0, kc = r.a, vc = r.b;
        if constexpr (STEP) { /* the run's new key and value rows, its gates (q's rows) */
            int64_t kvw = (int64_t)d.n_kv_heads * d.head_dim;
            st.k += r.start * kvw, st.v += r.start * kvw, st.rope_shift = r.rope_shift;
            if (st.gate) st.gate += r.start * ldq;
        }
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int hd = d.head_dim;
    int kvh = h / (d.n_heads / d.n_kv_heads);
    int64_t ldkv = (int64_t)d.n_kv_heads * hd, off = (int64_t)kvh * hd;
    const float *qr = q + i * ldq + h * q_head_stride;
    int qpos = pos0 + i, first = 0;
    if (d.window > 0 && qpos - d.window + 1 > 0) first = qpos - d.window + 1;
    int last = qpos;
    if (parts.n > 1) { /* blockIdx.z: this block's share of the keys */
        int per = (qpos - first + 1 + parts.n - 1) / parts.n;
        first += (int)blockIdx.z * per;
        last = min(qpos, first + per - 1);
    }
    float kb[KEYS_AT_ONCE][NPL], vb[KEYS_AT_ONCE][NPL];
    if constexpr (STEP) {
        attn_load_keys<NPL>(kc, vc, ldkv, off, hd, lane, first + warp, last, qpos, kb, vb);
        cuda_pdl_entry();
    }
    float *sq = sm_acc + ATTN_WARPS * hd, *sk = sq + hd;
    if constexpr (STEP) {
        attn_step_qk(qr, st.k + off, hd, qpos + st.rope_shift, st, sq, sk);
        qr = sq;
        if (h % (d.n_heads / d.n_kv_heads) == 0 && blockIdx.z == 0)
            for (int ch = threadIdx.x; ch < hd; ch += blockDim.x) {
                int64_t at = qpos * ldkv + off + ch;
                ((float *)kc)[at] = sk[ch];
                ((float *)vc)[at] = st.v[off + ch];
            }
    }
    float qv[NPL], acc[NPL];
#pragma unroll
    for (int j = 0; j < NPL; j++) {
        int ch = lane + 32 * j;
        qv[j] = ch < hd ? qr[ch] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -FLT_MAX, l = 0.0f;
    for (int p0 = first + warp; p0 <= last; p0 += KEYS_AT_ONCE * ATTN_WARPS) {
        if (!STEP || p0 != first + warp)
            attn_load_keys<NPL>(kc, vc, ldkv, off, hd, lane, p0, last, STEP ? qpos : -1, kb, vb);
        float s[KEYS_AT_ONCE];
#pragma unroll
        for (int b = 0; b < KEYS_AT_ONCE; b++) {
            if (STEP && p0 + b * ATTN_WARPS == qpos) { /* the new row */
#pragma unroll
                for (int j = 0; j < NPL; j++) {
                    int ch = lane + 32 * j;
                    kb[b][j] = ch < hd ? sk[ch] : 0.0f;
                    vb[b][j] = ch < hd ? st.v[off + ch] : 0.0f;
                }
            }
            s[b] = 0.0f;
#pragma unroll
            for (int j = 0; j < NPL; j++) {
                int ch = lane + 32 * j;
                s[b] += ch < hd ? qv[j] * kb[b][j] : 0.0f;
            }
        }
        /* the keys' sums side by side, then the online softmax key by key, in their order */
#pragma unroll
        for (int b = 0; b < KEYS_AT_ONCE; b++)
            s[b] = cuda_warp_sum(s[b]);
#pragma unroll
        for (int b = 0; b < KEYS_AT_ONCE; b++) {
            if (p0 + b * ATTN_WARPS > last) break;
            float sl = attn_logit(s[b], d);
            float corr = 1.0f, e = 1.0f;
            if (sl > m) {
                corr = expf(m - sl); /* 0 on the warp's first key */
                l = l * corr + 1.0f;
                m = sl;
            } else {
                e = expf(sl - m);
                l += e;
            }
#pragma unroll
            for (int j = 0; j < NPL; j++)
                acc[j] = acc[j] * corr + e * vb[b][j];
        }
    }
    if (lane == 0) sm_m[warp] = m, sm_l[warp] = l;
#pragma unroll
    for (int j = 0; j < NPL; j++) {
        int ch = lane + 32 * j;
        if (ch < hd) sm_acc[warp * hd + ch] = acc[j];
    }
    __syncthreads();
    float mx = -FLT_MAX;
    for (int w = 0; w < ATTN_WARPS; w++)
        mx = fmaxf(mx, sm_m[w]);
    float lt = 0.0f;
    for (int w = 0; w < ATTN_WARPS; w++)
        if (sm_l[w] > 0.0f) lt += sm_l[w] * expf(sm_m[w] - mx);
    float *o = out + i * ldo + (int64_t)h * hd;
    int64_t pi = 0; /* this block's partial: ((run * n + i) * heads + h) * splits + split */
    if (parts.n > 1) {
        pi = (((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * parts.n) + blockIdx.z;
        if (threadIdx.x == 0) parts.m[pi] = mx, parts.l[pi] = lt;
    }
    for (int ch = threadIdx.x; ch < hd; ch += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++)
            if (sm_l[w] > 0.0f) a += sm_acc[w * hd + ch] * expf(sm_m[w] - mx);
        if (parts.n > 1)
            parts.acc[pi * hd + ch] = a; /* unnormalised: the merge rescales */
        else
            o[ch] = STEP ? attn_gated(a / lt, st.gate, h * q_head_stride + ch) : a / lt;
    }
}

template <int NPL>
__global__ static void k_attention(const float *q, int64_t ldq, int64_t q_head_stride, int n,
                                   int pos0, const float *kc, const float *vc, ts_attn_dims d,
                                   float *out, int64_t ldo, const ts_seq_run *runs,
                                   attn_parts parts, const int32_t *pos_dev) {
    attention_query<NPL, false>(q, ldq, q_head_stride, n, pos0, kc, vc, d, out, ldo, runs, parts,
                                pos_dev, attn_step_in{});
}

template <int NPL>
__global__ static void k_attention_step(const float *q, int64_t q_head_stride, float *kc, float *vc,
                                        ts_attn_dims d, float *out, attn_parts parts,
                                        const int32_t *pos_dev, attn_step_in st) {
    attention_query<NPL, true>(q, 0, q_head_stride, 1, 0, kc, vc, d, out, 0, NULL, parts, pos_dev,
                               st);
}

/* attention_step for many sequences: a run's one token at its row of q (ldq), of the new key,
 * value and gate rows, and of out (ldo); its caches and position from the run table */
template <int NPL>
__global__ static void k_attention_step_runs(const float *q, int64_t ldq, int64_t q_head_stride,
                                             ts_attn_dims d, float *out, int64_t ldo,
                                             const ts_seq_run *runs, attn_parts parts,
                                             attn_step_in st) {
    attention_query<NPL, true>(q, ldq, q_head_stride, 1, 0, NULL, NULL, d, out, ldo, runs, parts,
                               NULL, st);
}

/* Merges the key splits of each (head, query): the same rescaling as the warps' merge above. */
__global__ static void k_attention_merge(attn_parts parts, ts_attn_dims d, float *out, int64_t ldo,
                                         const ts_seq_run *runs, const float *gate,
                                         int64_t gate_head_stride, int64_t ldg) {
    cuda_pdl_entry();
    int h = (int)(blockIdx.x % d.n_heads), i = (int)(blockIdx.x / d.n_heads);
    if (runs) {
        ts_seq_run r = runs[blockIdx.y];
        if (i >= r.len) return;
        out += r.start * ldo;
        if (gate) gate += r.start * ldg;
    }
    int hd = d.head_dim, ns = parts.n;
    int64_t p0 = ((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * ns;
    float mx = -FLT_MAX, lt = 0.0f;
    for (int s = 0; s < ns; s++)
        if (parts.l[p0 + s] > 0.0f) mx = fmaxf(mx, parts.m[p0 + s]);
    for (int s = 0; s < ns; s++)
        if (parts.l[p0 + s] > 0.0f) lt += parts.l[p0 + s] * expf(parts.m[p0 + s] - mx);
    float *o = out + i * ldo + (int64_t)h * hd;
    for (int ch = threadIdx.x; ch < hd; ch += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < ns; s++)
            if (parts.l[p0 + s] > 0.0f)
                a += parts.acc[(p0 + s) * hd + ch] * expf(parts.m[p0 + s] - mx);
        o[ch] = attn_gated(a / lt, gate, h * gate_head_stride + ch); /* gate: attention_step */
    }
}

/* Attention for prompts, tiled: a block per (head, 32 queries), 8 warps of 4 queries each. The
 * block walks the keys in tiles of 32: it stages the tile's keys and values in shared memory
 * once for its 32 queries (the kernel above re-reads every key from L2 for every query: 0.22
 * ms a layer for a 512-token prompt of the 0.8B), each lane scores one key against its warp's
 * 4 queries (the queries are broadcast from shared memory, 4 dims a load), the warp updates its
 * rows' online softmax, and the values go into the accumulators with each key's weight passed
 * by shuffle. Lane l holds dims l, l + 32, ... of its 4 rows' accumulators. Tiles are staged
 * with cp.async into two buffers, the next while the current one is used (staged through
 * registers, one load waiting at a time, a tile took ~30 us). The last query tiles have the most
 * keys: blocks take them first. Dynamic shared memory: the query tile [32][hd], then two of the
 * key tile [32][hd + 4] (rows 16-byte aligned, float4 reads free of bank conflicts) and the
 * value tile [32][hd]. */
#define AT_Q 32
#define AT_K 32
static size_t attention_tiled_smem(int hd) {
    return (size_t)(AT_Q * hd + 2 * (AT_K * (hd + 4) + AT_K * hd)) * sizeof(float);
}

/* Keys and values [k0, k0 + nk) of KV head kvh into Ks / Vs (rows beyond nk zeroed). */
__device__ static inline void at_stage(float *Ks, float *Vs, const float *kc, const float *vc,
                                       int64_t ldkv, int kvh, int hd, int k0, int nk) {
    int hd4 = hd / 4, ks = hd + 4;
    for (int idx = threadIdx.x; idx < AT_K * hd4; idx += blockDim.x) {
        int kk = idx / hd4, c = 4 * (idx % hd4);
        bool in = kk < nk;
        int64_t at = in ? (int64_t)(k0 + kk) * ldkv + (int64_t)kvh * hd + c : 0;
        cp_async16(Ks + kk * ks + c, kc + at, in);
        cp_async16(Vs + kk * hd + c, vc + at, in);
    }
    cp_async_commit();
}

template <int NPL>
__global__ static void k_attention_tiled(const float *q, int64_t ldq, int64_t q_head_stride, int n,
                                         int pos0, const float *kc, const float *vc, ts_attn_dims d,
                                         float *out, int64_t ldo, const ts_seq_run *runs,
                                         int n_tiles, int64_t ldkv, int n_keys) {
    cuda_pdl_entry();
    extern __shared__ float4 at_smem[];
    int hd = d.head_dim, ks = hd + 4, tile_floats = AT_K * ks + AT_K * hd;
    float *Qs = (float *)at_smem, *buf = Qs + AT_Q * hd;
    int h = (int)(blockIdx.x % d.n_heads);
    int i0 = (n_tiles - 1 - (int)(blockIdx.x / d.n_heads)) * AT_Q; /* the longest tiles first */
    if (runs) { /* blockIdx.y: the run */
        ts_seq_run r = runs[blockIdx.y];
        q += r.start * ldq, out += r.start * ldo, n = r.len, pos0 = r.pos0, kc = r.a, vc = r.b;
    }
    if (i0 >= n) return;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rb = warp * 4;
    int nq = min(AT_Q, n - i0);
    int kvh = h / (d.n_heads / d.n_kv_heads);
    if (!ldkv) ldkv = (int64_t)d.n_kv_heads * hd;
    /* attention_full: every query sees keys 0..n_keys-1, or (a window) those within window - 1
     * of it on either side; else the causal mask, a window behind */
    bool full = n_keys > 0;
    int qlast = full ? n_keys - 1 : pos0 + i0 + nq - 1, kbeg = 0;
    if (full && d.window > 0) qlast = min(qlast, i0 + nq - 1 + d.window - 1);
    if (d.window > 0 && pos0 + i0 - d.window + 1 > 0) kbeg = pos0 + i0 - d.window + 1;
    at_stage(buf, buf + AT_K * ks, kc, vc, ldkv, kvh, hd, kbeg, min(AT_K, qlast - kbeg + 1));
    for (int idx = threadIdx.x; idx < AT_Q * hd; idx += blockDim.x) {
        int r = idx / hd, ch = idx % hd;
        Qs[idx] = r < nq ? q[(int64_t)(i0 + r) * ldq + (int64_t)h * q_head_stride + ch] : 0.0f;
    }
    float m[4], l[4], acc[4][NPL];
    int klo[4], khi[4]; /* the keys row r sees: [klo, khi]; none for no such query */
#pragma unroll
    for (int r = 0; r < 4; r++) {
        m[r] = -FLT_MAX, l[r] = 0.0f;
        int qp = pos0 + i0 + rb + r;
        klo[r] = d.window > 0 ? qp - d.window + 1 : 0;
        khi[r] = rb + r >= nq   ? -1
                 : !full        ? qp
                 : d.window > 0 ? min(n_keys - 1, qp + d.window - 1)
                                : n_keys - 1;
#pragma unroll
        for (int j = 0; j < NPL; j++) acc[r][j] = 0.0f;
    }
    for (int k0 = kbeg, t = 0; k0 <= qlast; k0 += AT_K, t++) {
        int nk = min(AT_K, qlast - k0 + 1);
        if (k0 + AT_K <= qlast) { /* the next tile into the other buffer, then wait for this one */
            float *nb = buf + ((t + 1) & 1) * tile_floats;
            at_stage(nb, nb + AT_K * ks, kc, vc, ldkv, kvh, hd, k0 + AT_K,
                     min(AT_K, qlast - k0 - AT_K + 1));
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); /* this tile (and the first time the queries) visible to all */
        const float *Ks = buf + (t & 1) * tile_floats, *Vs = Ks + AT_K * ks;
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const float *kr = Ks + lane * ks;
        for (int ch = 0; ch < hd; ch += 4) {
            float4 kv = *(const float4 *)(kr + ch);
#pragma unroll
            for (int r = 0; r < 4; r++) {
                float4 qv = *(const float4 *)(Qs + (rb + r) * hd + ch);
                s[r] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
            }
        }
        int kp = k0 + lane;
        float p[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            bool valid = lane < nk && kp >= klo[r] && kp <= khi[r];
            float sr = attn_logit(s[r], d);
            float mt = valid ? sr : -FLT_MAX;
            for (int off = 16; off > 0; off >>= 1)
                mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
            float mn = fmaxf(m[r], mt);
            p[r] = valid ? expf(sr - mn) : 0.0f;
            float ps = cuda_warp_sum(p[r]);
            float corr = expf(m[r] - mn); /* 0 before the row's first key, 1 for no change */
            l[r] = l[r] * corr + ps;
            m[r] = mn;
#pragma unroll
            for (int j = 0; j < NPL; j++) acc[r][j] *= corr;
        }
        for (int kk = 0; kk < nk; kk++) {
            float vv[NPL];
#pragma unroll
            for (int j = 0; j < NPL; j++) {
                int ch = lane + 32 * j;
                vv[j] = ch < hd ? Vs[kk * hd + ch] : 0.0f;
            }
#pragma unroll
            for (int r = 0; r < 4; r++) {
                float pk = __shfl_sync(0xffffffffu, p[r], kk);
#pragma unroll
                for (int j = 0; j < NPL; j++) acc[r][j] += pk * vv[j];
            }
        }
        __syncthreads(); /* this buffer is read: the next round may stage into it */
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        if (rb + r >= nq) continue;
        float *o = out + (int64_t)(i0 + rb + r) * ldo + (int64_t)h * hd;
#pragma unroll
        for (int j = 0; j < NPL; j++) {
            int ch = lane + 32 * j;
            if (ch < hd) o[ch] = acc[r][j] / l[r];
        }
    }
}

/* Whether n queries take the tiled kernel: prompts of at least AT_Q queries, heads up to 256
 * dims in steps of 4, caches 16-byte aligned for cp.async (kc, vc; NULL for the runs form, whose
 * caches are the engine's, aligned like every slot of them), the shared memory granted
 * (TESSERA_CUDA_ATTN_TILE=0: never). */
static bool attention_tiled_smem_granted(cuda_ctx *c) {
    if (!c->attn_tile_opted) {
        const void *k[] = {(const void *)k_attention_tiled<2>, (const void *)k_attention_tiled<4>,
                           (const void *)k_attention_tiled<8>};
        if (!cuda_allow_smem(c, k, 3, (int)attention_tiled_smem(256))) return false;
        c->attn_tile_opted = true;
    }
    return true;
}

/* The heads and rows the tiled kernel takes: up to 256 dims in steps of 4, key and value rows
 * 16-byte aligned for cp.async. */
static bool attention_tiled_shape(int hd, const float *kc, const float *vc) {
    return hd > 0 && hd <= 256 && hd % 4 == 0 && ((uintptr_t)kc | (uintptr_t)vc) % 16 == 0;
}

static bool attention_tiled(cuda_ctx *c, int n, int hd, const float *kc, const float *vc) {
    if (!c->attn_tile || n < AT_Q || !attention_tiled_shape(hd, kc, vc)) return false;
    if (!attention_tiled_smem_granted(c)) {
        c->attn_tile = false;
        return false;
    }
    return true;
}

/* Calls launch with the dims each lane holds for heads of hd dims (2, 4, 8 or 16 of up to 512)
 * as a compile-time constant (std::integral_constant), for the kernels' register arrays. */
template <typename F> static void with_lanes_dims(int hd, F launch) {
    if (hd <= 64)
        launch(std::integral_constant<int, 2>{});
    else if (hd <= 128)
        launch(std::integral_constant<int, 4>{});
    else if (hd <= 256)
        launch(std::integral_constant<int, 8>{});
    else
        launch(std::integral_constant<int, 16>{});
}

/* How many blocks share the keys of one (head, query): enough to give the GPU about two
 * blocks per multiprocessor, each at least ATTN_SPLIT_MIN keys, rounded down to a power of two
 * so that a decode step's shape (and its CUDA graph) changes only a few times as the context
 * grows. */
#define ATTN_SPLIT_MIN 64
#define ATTN_SPLIT_MAX 64
static int attention_splits(cuda_ctx *c, int64_t blocks, int max_keys) {
    if (!c->attn_split) return 1; /* TESSERA_CUDA_ATTN_SPLIT=0, for comparisons */
    int sms = c->sm_count;
    int64_t want = max_keys / ATTN_SPLIT_MIN, room = 2 * (int64_t)sms / (blocks ? blocks : 1);
    int64_t ns = want < room ? want : room;
    if (ns > ATTN_SPLIT_MAX) ns = ATTN_SPLIT_MAX;
    int p = 1;
    while (2 * p <= ns)
        p *= 2;
    return p;
}

/* One launcher for the single-sequence and the runs forms: runs NULL means one sequence of n
 * queries at pos0 over kc / vc (pos_dev not NULL: the per-query kernel reads pos0 there); else n
 * is the longest run and max_keys the most keys any query sees. st (not NULL): attention_step's
 * one query, with pos_dev. */
static void attention_launch(cuda_ctx *c, const float *q, int64_t ldq, int64_t q_head_stride, int n,
                             int pos0, const float *kc, const float *vc, const ts_attn_dims *dims,
                             float *out, int64_t ldo, const ts_seq_run *runs, int nr, int max_keys,
                             const int32_t *pos_dev, const attn_step_in *st = NULL) {
    int hd = dims->head_dim;
    if (!st && !runs &&
        cuda_attention_mma(c, q, ldq, q_head_stride, n, pos0, kc, vc, dims, out, ldo))
        return;
    if (!st && attention_tiled(c, n, hd, kc, vc)) {
        int tiles = (n + AT_Q - 1) / AT_Q;
        dim3 grid((unsigned)((int64_t)dims->n_heads * tiles), (unsigned)nr);
        with_lanes_dims(hd, [&](auto npl) {
            cuda_launch(c, "attention_tiled", k_attention_tiled<decltype(npl)::value>, grid,
                        32 * ATTN_WARPS, attention_tiled_smem(hd), q, ldq, q_head_stride, n, pos0,
                        kc, vc, *dims, out, ldo, runs, tiles, (int64_t)0, 0);
        });
        return;
    }
    int64_t blocks = (int64_t)dims->n_heads * n * nr;
    if (dims->window > 0 && max_keys > dims->window) max_keys = dims->window;
    attn_parts parts = {1, NULL, NULL, NULL};
    int ns = attention_splits(c, blocks, max_keys);
    if (ns > 1) {
        int64_t np = blocks * ns;
        float *buf = (float *)cuda_scratch(c, 3, (size_t)np * (hd + 2) * sizeof(float));
        if (!buf) return;
        parts.n = ns, parts.m = buf, parts.l = buf + np, parts.acc = buf + 2 * np;
    }
    dim3 grid((unsigned)((int64_t)dims->n_heads * n), (unsigned)nr, (unsigned)ns);
    /* at most 16 KiB; attention_step's q head and new key after it (20 KiB) */
    size_t smem = (size_t)(ATTN_WARPS + (st ? 2 : 0)) * hd * sizeof(float);
    with_lanes_dims(hd, [&](auto npl) {
        if (st && runs)
            cuda_launch(c, "attention_step", k_attention_step_runs<decltype(npl)::value>, grid,
                        32 * ATTN_WARPS, smem, q, ldq, q_head_stride, *dims, out, ldo, runs, parts,
                        *st);
        else if (st)
            cuda_launch(c, "attention_step", k_attention_step<decltype(npl)::value>, grid,
                        32 * ATTN_WARPS, smem, q, q_head_stride, (float *)kc, (float *)vc, *dims,
                        out, parts, pos_dev, *st);
        else /* with pos_dev, no argument that changes every step */
            cuda_launch(c, "attention", k_attention<decltype(npl)::value>, grid, 32 * ATTN_WARPS,
                        smem, q, ldq, q_head_stride, n, pos_dev ? 0 : pos0, kc, vc, *dims, out, ldo,
                        runs, parts, pos_dev);
    });
    if (ns > 1)
        cuda_launch(c, "attention_merge", k_attention_merge,
                    dim3((unsigned)((int64_t)dims->n_heads * n), (unsigned)nr), 128, 0, parts,
                    *dims, out, ldo, runs, st ? st->gate : (const float *)NULL, q_head_stride, ldq);
}

void cuda_op_attention(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride, int n,
                       int pos0, const float *k_cache, const float *v_cache,
                       const ts_attn_dims *dims, float *out, int64_t ldo) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0) return;
    if (dims->head_dim > MAX_HEAD_DIM || dims->head_dim < 1) {
        cuda_check(c, cudaErrorInvalidValue, "attention: head_dim over 512");
        return;
    }
    attention_launch(c, q, ldq, q_head_stride, n, pos0, k_cache, v_cache, dims, out, ldo, NULL, 1,
                     pos0 + n, NULL);
}

/* Attention without a mask among n tokens (an image encoder's): the tiled kernel with every
 * query at the last key's position, k and v rows ldkv apart. Its shapes: heads of up to 256 dims
 * in steps of 4, as many KV heads as query heads, rows 16-byte aligned for cp.async - what
 * vision towers have; anything else is an error, not a silent fallback. */
void cuda_op_attention_full(ts_backend *be, const float *q, int64_t ldq, const float *k,
                            const float *v, int64_t ldkv, int n, const ts_attn_dims *dims,
                            float *out, int64_t ldo) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0 || cuda_attention_full_tc(c, q, ldq, k, v, ldkv, n, dims, out, ldo)) return;
    int hd = dims->head_dim;
    if (!attention_tiled_shape(hd, k, v) || ldkv % 4 || dims->n_kv_heads < 1 ||
        dims->n_heads % dims->n_kv_heads) {
        cuda_check(c, cudaErrorInvalidValue,
                   "attention_full: heads of 4-256 dims in steps of 4, "
                   "rows 16-byte aligned, kv heads a divisor of heads");
        return;
    }
    if (!attention_tiled_smem_granted(c)) {
        cuda_check(c, cudaErrorInvalidValue, "attention_full: shared memory not granted");
        return;
    }
    int tiles = (n + AT_Q - 1) / AT_Q;
    dim3 grid((unsigned)((int64_t)dims->n_heads * tiles), 1);
    with_lanes_dims(hd, [&](auto npl) {
        cuda_launch(c, "attention_full", k_attention_tiled<decltype(npl)::value>, grid,
                    32 * ATTN_WARPS, attention_tiled_smem(hd), q, ldq, (int64_t)hd, n, 0, k, v,
                    *dims, out, ldo, (const ts_seq_run *)NULL, tiles, ldkv, n);
    });
}

/* Output t of channel c: the K taps over [state ; x] (tau < 0 reads the state), then SiLU. */
__device__ static inline float conv_tap_silu(const float *x, int64_t ldx, int t, int C, int K,
                                             const float *wc, const float *state, int c) {
    int hist = K - 1;
    float s = 0.0f;
    for (int k = 0; k < K; k++) {
        int tau = t - hist + k;
        float xv = tau < 0 ? state[(int64_t)(hist + tau) * C + c] : x[tau * ldx + c];
        s += wc[k] * xv;
    }
    return s / (1.0f + expf(-s));
}

#define CONV_TPT   8 /* tokens of a group (kernels of up to CONV_MAX_K taps) */
#define CONV_MAX_K 8
/* A thread per (channel, token lane): lane y computes the groups of CONV_TPT outputs y,
 * y + gridDim.y, ... (one output a lane read every tap and weight again: 34 us a layer for a
 * 512-token prompt of the 0.8B's 6144 channels). Only the
 * first K - 1 outputs read the old state, so lane 0 computes those itself and then shifts the
 * state (ascending k reads only indices not yet overwritten); the other lanes read x alone and
 * never race with the shift. (One thread walking all n tokens of its channel took ~240 us for a
 * 512-token prompt: 48 blocks, each a chain of dependent loads.) runs: blockIdx.z is the run. */
__global__ static void k_conv1d_silu(const float *x, int64_t ldx, int n, int C, int K,
                                     const float *w, float *state, float *out, int64_t ldo,
                                     const ts_seq_run *runs) {
    cuda_pdl_entry();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    if (runs) {
        ts_seq_run r = runs[blockIdx.z];
        x += r.start * ldx, out += r.start * ldo, n = r.len, state = r.a;
    }
    int hist = K - 1;
    int head = n < hist ? n : hist; /* the outputs that read the state */
    const float *wc = w + (int64_t)c * K;
    if (K <= CONV_MAX_K) {
        /* CONV_TPT tokens a group, lane y taking groups y, y + gridDim.y, ...: the taps in
         * registers and a window of TPT + K - 1 inputs, each loaded once (conv_tap_silu's sums
         * in its order: the same bits) */
        float wr[CONV_MAX_K];
#pragma unroll
        for (int k = 0; k < CONV_MAX_K; k++) wr[k] = k < K ? wc[k] : 0.0f;
        for (int t0 = blockIdx.y * CONV_TPT; t0 < n; t0 += gridDim.y * CONV_TPT) {
            float win[CONV_TPT + CONV_MAX_K - 1];
#pragma unroll
            for (int m = 0; m < CONV_TPT + CONV_MAX_K - 1; m++) {
                int tau = t0 - hist + m;
                win[m] = m < CONV_TPT + hist && tau >= 0 && tau < n ? x[tau * ldx + c] : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < CONV_TPT; j++) {
                int t = t0 + j;
                if (t < head || t >= n) continue;
                float s = 0.0f;
#pragma unroll
                for (int k = 0; k < CONV_MAX_K; k++)
                    if (k < K) s += wr[k] * win[j + k];
                out[t * ldo + c] = s / (1.0f + expf(-s));
            }
        }
    } else {
        for (int t = blockIdx.y; t < n; t += gridDim.y)
            if (t >= head) out[t * ldo + c] = conv_tap_silu(x, ldx, t, C, K, wc, state, c);
    }
    if (blockIdx.y != 0) return;
    for (int t = 0; t < head; t++) out[t * ldo + c] = conv_tap_silu(x, ldx, t, C, K, wc, state, c);
    for (int k = 0; k < hist; k++) {
        int src = k + n; /* index into [old state ; x] */
        state[(int64_t)k * C + c] =
            src < hist ? state[(int64_t)src * C + c] : x[(int64_t)(src - hist) * ldx + c];
    }
}

/* Token lanes of k_conv1d_silu for runs of up to n tokens: a group of CONV_TPT tokens each. */
static unsigned conv_lanes(int n) {
    int groups = (n + CONV_TPT - 1) / CONV_TPT;
    return (unsigned)(groups < 1 ? 1 : groups < 512 ? groups : 512);
}

void cuda_op_conv1d_silu(ts_backend *be, const float *x, int64_t ldx, int n, int C, int K,
                         const float *w, float *state, float *out, int64_t ldo) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0 || C <= 0) return;
    dim3 grid(cuda_blocks(C, 128), conv_lanes(n));
    cuda_launch(c, "conv1d_silu", k_conv1d_silu, grid, 128, 0, x, ldx, n, C, K, w, state, out, ldo,
                (const ts_seq_run *)NULL);
}

__global__ static void k_gdn_gates(const float *a, int64_t lda, const float *b, int64_t ldb, int n,
                                   int Hv, const float *neg_exp_a, const float *dt_bias, float *g,
                                   float *beta) {
    cuda_pdl_entry();
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n * Hv) return;
    int64_t t = idx / Hv;
    int h = (int)(idx % Hv);
    cuda_gdn_gate(a[t * lda + h], b[t * ldb + h], neg_exp_a[h], dt_bias[h], &g[idx], &beta[idx]);
}

void cuda_op_gdn_gates(ts_backend *be, const float *a, int64_t lda, const float *b, int64_t ldb,
                       int n, int Hv, const float *neg_exp_a, const float *dt_bias, float *g,
                       float *beta) {
    cuda_ctx *c = cuda_of(be);
    int64_t total = (int64_t)n * Hv;
    if (total <= 0) return;
    cuda_launch(c, "gdn_gates", k_gdn_gates, cuda_blocks(total, 256), 256, 0, a, lda, b, ldb, n, Hv,
                neg_exp_a, dt_bias, g, beta);
}

/* The delta rule with the state in registers: a block per (32 state columns, v-head), four warps
 * splitting the d_k rows, lane = column. Thread (w, lane) holds rows w*R .. w*R+R-1 of its column;
 * the two dot products over d_k (the prediction k.S and the read q.S) are summed per warp and
 * then across the four warps through shared memory, in a fixed order. Many more blocks than one
 * per head, and no trip of the state through shared memory: this is the decode kernel, and it
 * serves prefill as well (one token after another, like the CPU's recurrent form). */
#define GDN_WARPS 4
/* k_gdn_conv_step's inputs (gdn_reg's CONV, below) */
typedef struct {
    const float *x, *w; /* the token's C channels: q heads, k heads, v; the conv's weights */
    float *state;       /* the conv's [K - 1][C] */
    int C, K;
    const float *a, *b, *neg_exp_a, *dt_bias; /* the gates' (cuda_gdn_gate) */
    float eps, q_scale;                       /* the L2 norms' */
} gdn_conv_in;

/* The single-sequence step's recurrent state kept in L2 (gdn_reg's KEEP): its loads and
 * stores carry an evict_last policy, so that with a set-aside of L2 for such lines
 * (cuda_l2_keep) the 1.5 GB of weights that stream through L2 between two steps do not push
 * the state out. The 0.8B's 18 MB of state is then read from L2 instead of DRAM, where the
 * step's blocks, resident only just before their release, waited for it. H200
 * (bench/RESULTS.md): a step 696 -> 690 us, tg128 +1.3-2.2%; set-asides of 19-24 MB measured
 * alike, 32 MB slower than none (the weights' own share of L2 then too small). */
__device__ static inline uint64_t l2_keep_policy() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ static inline float ld_keep(const float *a, uint64_t pol) {
    float v;
    asm volatile("ld.global.L2::cache_hint.f32 %0, [%1], %2;" : "=f"(v) : "l"(a), "l"(pol));
    return v;
}
__device__ static inline void st_keep(float *a, float v, uint64_t pol) {
    asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;" ::"l"(a), "f"(v), "l"(pol)
                 : "memory");
}

/* CL > 0: the gated RMSNorm of gated_rmsnorm on each token's output as well (gn: z, w, eps). The
 * CL blocks of a head (its d_v / 32 column groups) form a cluster: each puts its columns' sum of
 * squares in shared memory and reads the others' through the cluster, so every block scales its
 * own columns, and the output leaves the kernel normed (one launch less per layer).
 * DV > 0: d_v is DV and d_k is GDN_WARPS * R (the launcher checks): the state's row stride is a
 * constant, so each of a thread's R loads and stores addresses its row as an offset from one
 * pointer, and no row or column is out of range. With a runtime stride every row kept a 64-bit
 * address of its own from load to store: 132 registers a thread for R = 32, three blocks a
 * multiprocessor, too few loads in flight for the state's stream with many sequences.
 * CONV: one sequence's one token from the input projection's row on (k_gdn_conv_step): the
 * conv, the L2 norms and the gates of conv_gdn_prep in the block itself, q, k and v never
 * leaving it. A thread convolves row tid of its head's q and k (d_k is the block's 128
 * threads), warp 0 the v channels of its columns; each channel's weights and state are read
 * before the wait with the delta rule's state. The q and k channels' conv state is shared by the
 * head's column blocks (one v-head a k-head), so block 0 of the cluster shifts it, after the
 * cluster's barrier - past every block's early read.
 * KEEP: the state's loads and stores with the evict_last policy above (CONV's launcher says
 * when).
 * EARLY (CONV's one token): the state stored as soon as it is final, right after its update,
 * and the conv state shifted as soon as no block reads it (v channels then too, q and k
 * channels by block 0 right after the token's cluster barrier), so that the stores drain under
 * the output's sums and norm instead of after them: the kernel ends, and the output projection
 * is released, sooner. H200, 0.8B BF16 (bench/RESULTS.md): a step 686-690 -> 684-685 us. */
template <int R, int CL, int DV = 0, bool CONV = false, bool KEEP = false, bool EARLY = false>
__device__ static inline void
gdn_reg(const float *q, const float *k, int64_t ldqk, const float *v, int64_t ldv, const float *g,
        const float *beta, int n, ts_gdn_dims d, float *state, float *out, const ts_seq_run *runs,
        ts_gated_norm gn, gdn_conv_in cv = gdn_conv_in{}) {
    static_assert(!CONV || (R == 32 && DV > 0 && CL > 0), "CONV: d_k = 128 threads, a cluster");
    static_assert(!EARLY || CONV, "EARLY: the one-token step");
    __shared__ float qs[GDN_WARPS * R], ks[GDN_WARPS * R];
    __shared__ float red[2][GDN_WARPS][32];
    __shared__ float ssq[2]; /* this block's share of a token's sum of squares, by parity */
    __shared__ float vs[CONV ? 32 : 1]; /* CONV: the token's v of the block's columns */
    int dk = DV ? GDN_WARPS * R : d.d_k, dv = DV ? DV : d.d_v, Hv = d.n_v_heads;
    if (runs) { /* blockIdx.z: the run */
        ts_seq_run r = runs[blockIdx.z];
        int64_t s = r.start;
        q += s * ldqk, k += s * ldqk, v += s * ldv, g += s * Hv, beta += s * Hv;
        out += s * Hv * dv, n = r.len, state = r.a;
        if (CL) gn.z += s * Hv * dv;
    }
    int h = blockIdx.y, kh = h / (d.n_v_heads / d.n_k_heads);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int c = blockIdx.x * 32 + lane, r0 = warp * R;
    bool col = c < dv;
    float *Sg = state + (int64_t)h * dk * dv;
    float *Sr = Sg + (int64_t)r0 * dv + c; /* this thread's first row (DV: all its rows) */
    float S[R];
    uint64_t pol = KEEP ? l2_keep_policy() : 0;
#pragma unroll
    for (int j = 0; j < R; j++)
        if (KEEP && DV)
            S[j] = ld_keep(Sr + j * DV, pol);
        else if (DV)
            S[j] = Sr[j * DV];
        else
            S[j] = col && r0 + j < dk ? Sg[(int64_t)(r0 + j) * dv + c] : 0.0f;
    int tid = threadIdx.x, kd = d.n_k_heads * dk;
    int chq = kh * dk + tid, chk = kd + chq, chv = 2 * kd + h * dv + c; /* CONV's channels */
    conv_early eq, ek, ev;
    if constexpr (CONV) {
        conv_early_load(cv.w, cv.state, cv.C, cv.K, chq, &eq);
        conv_early_load(cv.w, cv.state, cv.C, cv.K, chk, &ek);
        if (warp == 0 && col) conv_early_load(cv.w, cv.state, cv.C, cv.K, chv, &ev);
    }
    /* The run table and the state are read before the programmatic wait: no kernel writes the
     * table (a copy queued before this kernel, which a graph joins by a full edge) and the state
     * was last written by this kernel a step ago, while once this kernel runs at all, every
     * kernel before its predecessor has finished (cuda_pdl_entry). For one sequence (no table,
     * the conv's kernel just before) the state's loads overlap that kernel's tail. */
    /* CONV: the gated norm's weight too; its z (the input projection's) asked for right after
     * the wait, beside the token's channels - read at the end, it was a round trip of its own */
    float gw = CONV && warp == 0 && col ? gn.w[c] : 0.0f, zi0 = 0.0f;
    cuda_pdl_entry();
    if (CONV && warp == 0 && col) zi0 = gn.z[(int64_t)h * dv + c];
    float xq = 0.0f, xk = 0.0f, xv = 0.0f, gt = 0.0f, bt = 0.0f; /* CONV's token */
    /* the state's stores: at the end, or EARLY as soon as it is final */
    auto store_state = [&]() {
#pragma unroll
        for (int j = 0; j < R; j++)
            if (KEEP && DV)
                st_keep(Sr + j * DV, S[j], pol);
            else if (DV)
                Sr[j * DV] = S[j];
            else if (col && r0 + j < dk)
                Sg[(int64_t)(r0 + j) * dv + c] = S[j];
    };
    for (int t = 0; t < n; t++) {
        if constexpr (CONV) { /* n = 1: conv_gdn_prep's arithmetic (cuda_ops_fused.cu) */
            xq = cv.x[chq], xk = cv.x[chk], xv = warp == 0 && col ? cv.x[chv] : 0.0f;
            float ga = cv.a[h], gb = cv.b[h];
            float qo = conv_sum(eq, xq, cv.K), ko = conv_sum(ek, xk, cv.K);
            cuda_trace_at(4); /* block traces: the token's channels in, convolved */
            if (warp == 0) vs[lane] = col ? conv_sum(ev, xv, cv.K) : 0.0f;
            double ss[2] = {(double)qo * qo, (double)ko * ko};
            row_sum_blocks<2>(ss);
            float iq = 1.0f / sqrtf((float)ss[0] + cv.eps),
                  ik = 1.0f / sqrtf((float)ss[1] + cv.eps);
            qs[tid] = (qo * iq) * cv.q_scale;
            ks[tid] = (ko * ik) * 1.0f;
            cuda_gdn_gate(ga, gb, cv.neg_exp_a[h], cv.dt_bias[h], &gt, &bt);
        } else {
            for (int i = threadIdx.x; i < GDN_WARPS * R; i += blockDim.x) {
                qs[i] = i < dk ? q[t * ldqk + (int64_t)kh * dk + i] : 0.0f;
                ks[i] = i < dk ? k[t * ldqk + (int64_t)kh * dk + i] : 0.0f;
            }
        }
        __syncthreads();
        float decay = expf(CONV ? gt : g[t * Hv + h]), b = CONV ? bt : beta[t * Hv + h];
        float m = 0.0f;
#pragma unroll
        for (int j = 0; j < R; j++) {
            S[j] *= decay;
            m += S[j] * ks[r0 + j];
        }
        red[0][warp][lane] = m;
        __syncthreads();
        m = 0.0f;
#pragma unroll
        for (int w = 0; w < GDN_WARPS; w++)
            m += red[0][w][lane];
        float delta = b * ((CONV ? vs[lane] : col ? v[t * ldv + (int64_t)h * dv + c] : 0.0f) - m);
        float o = 0.0f;
#pragma unroll
        for (int j = 0; j < R; j++) {
            S[j] += ks[r0 + j] * delta;
            o += S[j] * qs[r0 + j];
        }
        if constexpr (EARLY) { /* one token: the state final now, its stores drain meanwhile */
            store_state();
            if (warp == 0 && col) conv_shift(ev, xv, cv.C, cv.K, cv.state, chv);
        }
        red[1][warp][lane] = o;
        __syncthreads(); /* also: every thread is done with this token's qs and ks */
        int64_t at = (int64_t)t * Hv * dv + (int64_t)h * dv + c;
        if constexpr (CL > 0) {
            float sum = 0.0f;
            if (warp == 0) {
#pragma unroll
                for (int w = 0; w < GDN_WARPS; w++)
                    sum += red[1][w][lane];
                float sq = cuda_warp_sum(col ? sum * sum : 0.0f);
                if (lane == 0) ssq[t & 1] = sq;
            }
            cg::cluster_group cl = cg::this_cluster();
            if (CONV) cuda_trace_at(5); /* the rule done */
            cl.sync(); /* every block's share of token t is in its shared memory */
            if (CONV) cuda_trace_at(6);
            if (EARLY && blockIdx.x == 0) { /* past every block's early read (the sync) */
                conv_shift(eq, xq, cv.C, cv.K, cv.state, chq);
                conv_shift(ek, xk, cv.C, cv.K, cv.state, chk);
            }
            if (warp == 0 && col) {
                float total = 0.0f;
#pragma unroll
                for (int r = 0; r < CL; r++)
                    total += cl.map_shared_rank(ssq, r)[t & 1];
                float inv = 1.0f / sqrtf(total / dv + gn.eps), zi = CONV ? zi0 : gn.z[at];
                out[at] = (CONV ? gw : gn.w[c]) * (sum * inv) * (zi / (1.0f + expf(-zi)));
            }
        } else if (warp == 0 && col) {
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < GDN_WARPS; w++)
                sum += red[1][w][lane];
            out[at] = sum;
        }
    }
    if constexpr (!EARLY) store_state();
    if constexpr (CONV && !EARLY) { /* the token's cluster barrier is behind every early read */
        if (blockIdx.x == 0) {
            conv_shift(eq, xq, cv.C, cv.K, cv.state, chq);
            conv_shift(ek, xk, cv.C, cv.K, cv.state, chk);
        }
        if (warp == 0 && col) conv_shift(ev, xv, cv.C, cv.K, cv.state, chv);
    }
    /* the cluster's blocks read each other's shared memory until their last token */
    if (CONV) cuda_trace_at(7);
    if constexpr (CL > 0) cg::this_cluster().sync();
    if (CONV) cuda_trace_end();
}

template <int R, int DV>
__global__ static void k_gdn_reg(const float *q, const float *k, int64_t ldqk, const float *v,
                                 int64_t ldv, const float *g, const float *beta, int n,
                                 ts_gdn_dims d, float *state, float *out, const ts_seq_run *runs) {
    gdn_reg<R, 0, DV>(q, k, ldqk, v, ldv, g, beta, n, d, state, out, runs, ts_gated_norm{});
}

template <int R, int CL, int DV>
__global__ static void __cluster_dims__(CL, 1, 1)
    k_gdn_reg_norm(const float *q, const float *k, int64_t ldqk, const float *v, int64_t ldv,
                   const float *g, const float *beta, int n, ts_gdn_dims d, float *state,
                   float *out, const ts_seq_run *runs, ts_gated_norm gn) {
    gdn_reg<R, CL, DV>(q, k, ldqk, v, ldv, g, beta, n, d, state, out, runs, gn);
}

/* One sequence's decode step from the input projection on (gdn_reg's CONV): the Qwen3.5 heads
 * (d_k = d_v = 128: a cluster of the head's 4 column blocks), one v-head a k-head. */
template <bool KEEP, bool EARLY>
__global__ static void __cluster_dims__(4, 1, 1)
    k_gdn_conv_step(ts_gdn_dims d, float *state, float *out, ts_gated_norm gn, gdn_conv_in cv) {
    gdn_reg<32, 4, 128, true, KEEP, EARLY>(NULL, NULL, 0, NULL, 0, NULL, NULL, 1, d, state, out,
                                           NULL, gn, cv);
}

/* One block per v-head, thread c owns column c of the head's [d_k][d_v] state; per token the
 * reference's order: decay, predict, correct, read. */
__global__ static void k_gdn(const float *q, const float *k, int64_t ldqk, const float *v,
                             int64_t ldv, const float *g, const float *beta, int n, ts_gdn_dims d,
                             float *state, float *out, bool smem_state) {
    cuda_pdl_entry();
    extern __shared__ float sm[];
    int dk = d.d_k, dv = d.d_v, Hv = d.n_v_heads, h = blockIdx.x, c = threadIdx.x;
    int kh = h / (d.n_v_heads / d.n_k_heads);
    float *qs = sm, *ks = sm + dk;
    float *Sg = state + (int64_t)h * dk * dv;
    float *S = smem_state ? sm + 2 * dk : Sg;
    if (smem_state)
        for (int i = 0; i < dk; i++)
            S[i * dv + c] = Sg[i * dv + c];
    for (int t = 0; t < n; t++) {
        __syncthreads(); /* the previous token's q and k are no longer read */
        for (int i = c; i < dk; i += blockDim.x) {
            qs[i] = q[t * ldqk + (int64_t)kh * dk + i];
            ks[i] = k[t * ldqk + (int64_t)kh * dk + i];
        }
        __syncthreads();
        float decay = expf(g[t * Hv + h]), b = beta[t * Hv + h];
        float m = 0.0f;
        for (int i = 0; i < dk; i++) {
            float s = S[i * dv + c] * decay;
            S[i * dv + c] = s;
            m += s * ks[i];
        }
        float delta = b * (v[t * ldv + (int64_t)h * dv + c] - m);
        float o = 0.0f;
        for (int i = 0; i < dk; i++) {
            float s = S[i * dv + c] + ks[i] * delta;
            S[i * dv + c] = s;
            o += s * qs[i];
        }
        out[(int64_t)t * Hv * dv + (int64_t)h * dv + c] = o;
    }
    if (smem_state)
        for (int i = 0; i < dk; i++)
            Sg[i * dv + c] = S[i * dv + c];
}

/* One launcher for the single-sequence and the runs forms (runs NULL: one run of n tokens on
 * state; else the kernels read each run's length and state from the table); chunk_len: the
 * longest run that may take the chunked form (0: none may). False when no kernel takes these heads
 * in one launch (d_k over 256 and no room for the chunked kernel): the caller goes run by run. */
/* The Qwen3.5 heads (d_k = d_v = 128), which take gdn_reg's form with a constant row stride (DV)
 * unless TESSERA_CUDA_GDN_DV=0 - and with it the fused decode step (k_gdn_conv_step) */
static bool gdn_heads_dv128(const cuda_ctx *c, const ts_gdn_dims *d) {
    return d->d_k == 128 && d->d_v == 128 && c->gdn_dv_const;
}

static bool gdn_launch(cuda_ctx *c, const float *q, const float *k, int64_t ldqk, const float *v,
                       int64_t ldv, const float *g, const float *beta, int n,
                       const ts_gdn_dims *dims, float *state, float *out, const ts_seq_run *runs,
                       int nr, int chunk_len, const ts_gated_norm *gn = NULL, bool *normed = NULL) {
    int dk = dims->d_k;
    if (normed) *normed = false;
    if (chunk_len >= c->gdn_chunk_min && cuda_gdn_chunked_fits(c, dk)) {
        cuda_gdn_chunked_launch(c, q, k, ldqk, v, ldv, g, beta, n, chunk_len, dims, state, out,
                                runs, nr);
        return true;
    }
    if (dk > 4 * 64) return false;
    int cols = (dims->d_v + 31) / 32;
    dim3 grid((unsigned)cols, (unsigned)dims->n_v_heads, (unsigned)nr);
    /* the gated norm in the kernel for one sequence, when a head's column blocks make a cluster
     * of 1, 2 or 4. (With many sequences the clusters cost more than the launch they save: the
     * 0.8B on an H200, 64 sequences 15180 -> 14233-14353 t/s, 8 sequences -1%; one +1.3%.) */
    int cl = gn && nr == 1 && (cols == 1 || cols == 2 || cols == 4) ? cols : 0;
    if (normed) *normed = cl > 0;
#define REG_CL(R, CL, DV)                                                                          \
    cuda_launch(c, "gdn_norm", k_gdn_reg_norm<R, CL, DV>, grid, 32 * GDN_WARPS, 0, q, k, ldqk, v,  \
                ldv, g, beta, n, *dims, state, out, runs, *gn)
#define REG(R, DV)                                                                                 \
    do {                                                                                           \
        if (cl == 1)                                                                               \
            REG_CL(R, 1, DV);                                                                      \
        else if (cl == 2)                                                                          \
            REG_CL(R, 2, DV);                                                                      \
        else if (cl == 4)                                                                          \
            REG_CL(R, 4, DV);                                                                      \
        else                                                                                       \
            cuda_launch(c, "gdn", k_gdn_reg<R, DV>, grid, 32 * GDN_WARPS, 0, q, k, ldqk, v, ldv,   \
                        g, beta, n, *dims, state, out, runs);                                      \
    } while (0)
    if (dk <= 4 * 8)
        REG(8, 0);
    else if (dk <= 4 * 16)
        REG(16, 0);
    else if (gdn_heads_dv128(c, dims)) /* dk == 4 * 32 */
        REG(32, 128);
    else if (dk <= 4 * 32)
        REG(32, 0);
    else
        REG(64, 0);
#undef REG
#undef REG_CL
    return true;
}

void cuda_op_gdn(ts_backend *be, const float *q, const float *k, int64_t ldqk, const float *v,
                 int64_t ldv, const float *g, const float *beta, int n, const ts_gdn_dims *dims,
                 float *state, float *out, bool chunked) {
    cuda_ctx *c = cuda_of(be);
    cuda_l2_keep(c, false); /* not the single-sequence step: no set-aside */
    if (n <= 0) return;
    if (dims->d_v > 1024 || dims->d_v < 1) {
        cuda_check(c, cudaErrorInvalidValue, "gdn: d_v over 1024");
        return;
    }
    /* the chunked request may take either kernel (same function); decode stays recurrent */
    if (gdn_launch(c, q, k, ldqk, v, ldv, g, beta, n, dims, state, out, NULL, 1, chunked ? n : 0))
        return;
    /* larger heads: the state does not fit in registers; a block per head, state in shared
     * memory when it fits, else in global memory */
    int dk = dims->d_k;
    size_t base = 2 * (size_t)dk * sizeof(float);
    size_t with_state = base + (size_t)dk * dims->d_v * sizeof(float);
    int max_smem = c->smem_optin;
    bool smem_state = with_state <= (size_t)max_smem;
    size_t bytes = smem_state ? with_state : base;
    if (bytes > 48 * 1024 &&
        !cuda_check(
            c, cudaFuncSetAttribute(k_gdn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
            "gdn smem"))
        return;
    cuda_launch(c, "gdn", k_gdn, dims->n_v_heads, dims->d_v, bytes, q, k, ldqk, v, ldv, g, beta, n,
                *dims, state, out, smem_state);
}

/* ---- all runs of a batch in one launch ------------------------------------------------------ */

void cuda_op_conv1d_silu_runs(ts_backend *be, const float *x, int64_t ldx, int C, int K,
                              const float *w, const ts_seq_run *runs, int nr, float *out,
                              int64_t ldo) {
    cuda_ctx *c = cuda_of(be);
    if (nr <= 0 || C <= 0) return;
    const ts_seq_run *dr = (const ts_seq_run *)cuda_table(c, runs, (size_t)nr * sizeof *runs);
    if (!dr) return;
    int longest = 0;
    for (int i = 0; i < nr; i++) longest = runs[i].len > longest ? runs[i].len : longest;
    dim3 grid(cuda_blocks(C, 128), conv_lanes(longest), (unsigned)nr);
    cuda_launch(c, "conv1d_silu", k_conv1d_silu, grid, 128, 0, x, ldx, 0, C, K, w, (float *)NULL,
                out, ldo, dr);
}

void cuda_op_gdn_runs(ts_backend *be, const float *q, const float *k, int64_t ldqk, const float *v,
                      int64_t ldv, const float *g, const float *beta, const ts_gdn_dims *dims,
                      const ts_seq_run *runs, int nr, const ts_gated_norm *gn, float *out) {
    cuda_ctx *c = cuda_of(be);
    cuda_l2_keep(c, false); /* not the single-sequence step: no set-aside */
    if (nr <= 0) return;
    if (dims->d_v > 1024 || dims->d_v < 1) {
        cuda_check(c, cudaErrorInvalidValue, "gdn: d_v over 1024");
        return;
    }
    int Hv = dims->n_v_heads, dv = dims->d_v, maxlen = 0;
    for (int r = 0; r < nr; r++)
        maxlen = runs[r].len > maxlen ? runs[r].len : maxlen;
    bool normed = false;
    if (nr == 1) { /* one run: its pointers as arguments, no table */
        int64_t s = runs[0].start;
        ts_gated_norm g1 = gn ? *gn : ts_gated_norm{};
        g1.z = gn ? gn->z + s * Hv * dv : NULL;
        if (!gdn_launch(c, q + s * ldqk, k + s * ldqk, ldqk, v + s * ldv, ldv, g + s * Hv,
                        beta + s * Hv, runs[0].len, dims, runs[0].a, out + s * Hv * dv, NULL, 1,
                        runs[0].len > 1 ? runs[0].len : 0, gn ? &g1 : NULL, &normed))
            cuda_op_gdn(be, q + s * ldqk, k + s * ldqk, ldqk, v + s * ldv, ldv, g + s * Hv,
                        beta + s * Hv, runs[0].len, dims, runs[0].a, out + s * Hv * dv,
                        runs[0].len > 1);
    } else {
        const ts_seq_run *dr = (const ts_seq_run *)cuda_table(c, runs, (size_t)nr * sizeof *runs);
        if (!dr) return;
        if (!gdn_launch(c, q, k, ldqk, v, ldv, g, beta, 0, dims, NULL, out, dr, nr, maxlen, gn,
                        &normed))
            for (int r = 0; r < nr; r++) { /* no kernel for all runs at once: run by run */
                int64_t s = runs[r].start;
                cuda_op_gdn(be, q + s * ldqk, k + s * ldqk, ldqk, v + s * ldv, ldv, g + s * Hv,
                            beta + s * Hv, runs[r].len, dims, runs[r].a, out + s * Hv * dv,
                            runs[r].len > 1);
            }
    }
    if (gn && !normed) {
        int n = runs[nr - 1].start + runs[nr - 1].len;
        cuda_op_gated_rmsnorm(be, out, gn->z, n, Hv, dv, gn->w, gn->eps, out);
    }
}

/* Row i of run r's new keys and values to its cache row pos0 + i (rows blockIdx.y, + gridDim.y,
 * ...: a grid's y is at most 65535, a run may be longer). */
__global__ static void k_kv_store(const float *k, const float *v, int kvw, const ts_seq_run *runs) {
    cuda_pdl_entry();
    ts_seq_run r = runs[blockIdx.z];
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= kvw) return;
    for (int i = blockIdx.y; i < r.len; i += gridDim.y) {
        int64_t src = (int64_t)(r.start + i) * kvw + col, dst = (int64_t)(r.pos0 + i) * kvw + col;
        r.a[dst] = k[src];
        r.b[dst] = v[src];
    }
}

/* One sequence's n new keys and values to its cache rows *pos0 + i (rows as above). */
__global__ static void k_kv_store_at(const float *k, const float *v, int kvw, int n, float *kc,
                                     float *vc, const int32_t *pos0) {
    cuda_pdl_entry();
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= kvw) return;
    for (int i = blockIdx.y; i < n; i += gridDim.y) {
        int64_t src = (int64_t)i * kvw + col, dst = (int64_t)(*pos0 + i) * kvw + col;
        kc[dst] = k[src];
        vc[dst] = v[src];
    }
}

static unsigned kv_store_rows(int n) { return (unsigned)(n < 65535 ? n : 65535); }

/* Where the kernels read a single run's cache position. A decode step's attention layers all
 * pass the same position, so it is staged once a submission (and again if it changes within
 * one) and the kernels take its address, which stays the same from one step to the next: the
 * step's graph replays with no node updated. (With the position as a kernel argument, every
 * attention layer's K/V stores and attention kernel were updated one by one before each
 * replay; a table per layer would put a copy into the chain of kernels per layer.) */
static const int32_t *cuda_kv_pos(cuda_ctx *c, int pos0) {
    if (c->kv_pos_epoch == cq_epoch(c) + 1 && c->kv_pos_host == pos0) return c->kv_pos_at;
    /* zero_copy: the kernels read it where the host stages it (pinned and mapped, the same
     * address on the device; the arena stays as it is until the submission has run), before
     * their programmatic wait where they can - no copy node at the head of the step's graph,
     * where the first kernel waited for the copy engine */
    int32_t *st = c->zero_copy ? (int32_t *)cq_stage(c, sizeof(int32_t)) : NULL;
    if (st) {
        *(int32_t *)cq_stage_fill(c, st) = pos0;
        c->kv_pos_at = st;
    } else {
        if (!c->kv_pos_dev && !cuda_check(c, cudaMalloc((void **)&c->kv_pos_dev, sizeof(int32_t)),
                                          "attention position"))
            return NULL;
        int32_t p = pos0;
        cuda_upload_fresh(c, c->kv_pos_dev, &p, sizeof p, "attention position");
        c->kv_pos_at = c->kv_pos_dev;
    }
    c->kv_pos_host = pos0;
    c->kv_pos_epoch = cq_epoch(c) + 1;
    return c->kv_pos_at;
}

/* The longest of nr runs and the most keys a query of theirs sees (runs of no queries left
 * out: their position is no key of anyone's) */
static void runs_extent(const ts_seq_run *runs, int nr, int *maxlen, int *max_keys) {
    *maxlen = *max_keys = 0;
    for (int r = 0; r < nr; r++) {
        if (runs[r].len <= 0) continue;
        *maxlen = runs[r].len > *maxlen ? runs[r].len : *maxlen;
        *max_keys = runs[r].pos0 + runs[r].len > *max_keys ? runs[r].pos0 + runs[r].len : *max_keys;
    }
}

void cuda_op_attention_runs(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride,
                            const float *k, const float *v, const ts_attn_dims *dims,
                            const ts_seq_run *runs, int nr, float *out, int64_t ldo) {
    cuda_ctx *c = cuda_of(be);
    if (nr <= 0) return;
    int hd = dims->head_dim;
    if (hd > MAX_HEAD_DIM || hd < 1) {
        cuda_check(c, cudaErrorInvalidValue, "attention: head_dim over 512");
        return;
    }
    if (nr == 1) { /* one sequence: no run table; its position on the device */
        const ts_seq_run *r = &runs[0];
        const int32_t *pd = r->len > 0 ? cuda_kv_pos(c, r->pos0) : NULL;
        if (!pd) return;
        int kvw = dims->n_kv_heads * hd;
        int64_t s = r->start;
        cuda_launch(c, "kv_store", k_kv_store_at, dim3(cuda_blocks(kvw, 256), kv_store_rows(r->len)),
                    256, 0, k + s * kvw, v + s * kvw, kvw, r->len, r->a, r->b, pd);
        attention_launch(c, q + s * ldq, ldq, q_head_stride, r->len, r->pos0, r->a, r->b, dims,
                         out + s * ldo, ldo, NULL, 1, r->pos0 + r->len, pd);
        return;
    }
    int maxlen, max_keys;
    runs_extent(runs, nr, &maxlen, &max_keys);
    const ts_seq_run *dr = (const ts_seq_run *)cuda_table(c, runs, (size_t)nr * sizeof *runs);
    if (!dr || maxlen <= 0) return;
    int kvw = dims->n_kv_heads * hd;
    dim3 sgrid(cuda_blocks(kvw, 256), kv_store_rows(maxlen), (unsigned)nr);
    cuda_launch(c, "kv_store", k_kv_store, sgrid, 256, 0, k, v, kvw, dr);
    /* prompts of CUDA_ATTN_MMA_MIN queries or more on the tensor cores, run by run; the rest
     * (decode tokens, short prompts) in one launch of the fp32 kernels, over a table with the
     * runs taken left out (length 0); a batch of decode tokens alone allocates nothing */
    ts_seq_run *rest = NULL;
    if (maxlen >= CUDA_ATTN_MMA_MIN && (rest = (ts_seq_run *)malloc((size_t)nr * sizeof *rest)) &&
        cuda_attention_mma_runs(c, q, ldq, q_head_stride, runs, nr, dims, out, ldo, rest)) {
        runs_extent(rest, nr, &maxlen, &max_keys);
        dr = maxlen > 0 ? (const ts_seq_run *)cuda_table(c, rest, (size_t)nr * sizeof *rest) : NULL;
    }
    free(rest);
    if (dr && maxlen > 0)
        attention_launch(c, q, ldq, q_head_stride, maxlen, 0, NULL, NULL, dims, out, ldo, dr, nr,
                         max_keys, NULL);
}

/* The set-aside is made when single-sequence steps start and given back (its lines reset to
 * normal, its size 0) when another delta-rule path runs (batches, prompts): held while 64
 * sequences of the 0.8B decoded, it cost them 12% on an H200 - with its lines reset to normal
 * as well, so it is the set-aside itself, which normal lines do not get back in full. Each
 * change is a call on the context, made as ops are queued: only where the kind of step
 * changes. */
bool cuda_l2_keep(cuda_ctx *c, bool on) {
    if (on == c->l2_keep_on || (on && !c->l2_keep_want)) return c->l2_keep_on;
    if (on) {
        c->l2_keep_on =
            cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, c->l2_keep_want) == cudaSuccess;
        if (!c->l2_keep_on) c->l2_keep_want = 0; /* refused (MIG, MPS): never ask again */
    } else {
        cudaCtxResetPersistingL2Cache();
        cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0);
        c->l2_keep_on = false;
    }
    cudaGetLastError(); /* a refusal is not the device's failure */
    return c->l2_keep_on;
}

bool cuda_op_conv_gdn_step(ts_backend *be, const float *x, int C, int K, const float *w,
                           const ts_seq_run *runs, int nr, const ts_gdn_prep_args *p,
                           const ts_gdn_dims *dims, const ts_gated_norm *gn, float *out) {
    cuda_ctx *c = cuda_of(be);
    int H = dims->n_k_heads;
    /* k_gdn_conv_step's shapes: its block's threads are d_k, its cluster the 4 column blocks of
     * d_v, one v-head a k-head (the q and k conv state shifted by one cluster); many sequences'
     * kernel takes the same (cuda_gdn_step_runs.cu) */
    if (!c->gdn_step || !gn || nr < 1 || p->n != nr || K < 1 || K > PREP_KMAX ||
        !gdn_heads_dv128(c, dims) || dims->n_v_heads != H || p->Hk != H || p->Hv != H ||
        p->dk != 128 || C != 3 * H * 128)
        return false;
    if (nr > 1) {
        cuda_l2_keep(c, false); /* not the single-sequence step: no set-aside */
        return cuda_gdn_step_runs(c, x, C, K, w, runs, nr, p, H, gn, out);
    }
    /* the run's row (0 where the model calls it) */
    int64_t s0 = runs[0].start;
    ts_gated_norm g1 = *gn;
    x += s0 * C, out += s0 * H * 128, g1.z += s0 * H * 128;
    float *rec_state = runs[0].b;
    gdn_conv_in cv = {
        x,          w,      runs[0].a, C, K, p->a + s0 * p->ldab, p->b + s0 * p->ldab, p->neg_exp_a,
        p->dt_bias, p->eps, p->q_scale};
    bool keep = cuda_l2_keep(c, true);
    c->gdn_keep_launches += keep;
    auto k = c->gdn_early_store
                 ? (keep ? k_gdn_conv_step<true, true> : k_gdn_conv_step<false, true>)
                 : (keep ? k_gdn_conv_step<true, false> : k_gdn_conv_step<false, false>);
    cuda_launch(c, "gdn_conv_step", k, dim3(4, (unsigned)H), 32 * GDN_WARPS, 0, *dims, rec_state,
                out, g1, cv);
    return true;
}

bool cuda_op_attention_step(ts_backend *be, const float *q, int64_t ldq, int64_t q_head_stride,
                            const float *wq, const float *k, const float *wk, const float *v,
                            float eps, int rot_dim, float theta, const ts_attn_dims *dims,
                            const ts_seq_run *runs, int nr, const float *gate, float *out,
                            int64_t ldo) {
    cuda_ctx *c = cuda_of(be);
    int hd = dims->head_dim;
    /* the block does qk_norm_rope's sums as its ROW_THREADS block does them, for heads within
     * both kernels' limits (MAX_HEAD_DIM is below qk_norm_rope's) */
    static_assert(32 * ATTN_WARPS == ROW_THREADS, "attention_step: qk_norm_rope's block");
    if (!c->attn_step || nr < 1 || (nr > 1 && nr > c->attn_step_runs) || hd < 1 ||
        hd > MAX_HEAD_DIM || rot_dim < 0 || rot_dim > hd || dims->n_kv_heads < 1 ||
        dims->n_heads % dims->n_kv_heads)
        return false;
    int max_keys = 0;
    for (int r = 0; r < nr; r++) {
        if (runs[r].len != 1) return false;
        max_keys = runs[r].pos0 + 1 > max_keys ? runs[r].pos0 + 1 : max_keys;
    }
    attn_step_in st = {wq, wk, k, v, eps, theta, rot_dim, runs[0].rope_shift, gate};
    if (nr > 1) { /* many sequences: the run table gives each its rows, caches and position */
        const ts_seq_run *dr = (const ts_seq_run *)cuda_table(c, runs, (size_t)nr * sizeof *runs);
        if (!dr) return true; /* recorded as failed */
        attention_launch(c, q, ldq, q_head_stride, 1, 0, NULL, NULL, dims, out, ldo, dr, nr,
                         max_keys, NULL, &st);
        return true;
    }
    const ts_seq_run *run = &runs[0];
    const int32_t *pd = cuda_kv_pos(c, run->pos0);
    if (!pd) return true; /* recorded as failed */
    int64_t s = run->start, kvw = (int64_t)dims->n_kv_heads * hd;
    st.k += s * kvw, st.v += s * kvw;
    if (st.gate) st.gate += s * ldq;
    attention_launch(c, q + s * ldq, 0, q_head_stride, 1, run->pos0, run->a, run->b, dims,
                     out + s * ldo, 0, NULL, 1, run->pos0 + 1, pd, &st);
    return true;
}
