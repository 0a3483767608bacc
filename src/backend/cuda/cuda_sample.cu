/* Sampling where the logits are (ts_backend_ops.sample): a decode step then moves a token id to
 * the host instead of a vocabulary of floats (248k of them: 1 MB, and 0.3-0.5 ms of host work
 * a token, half a decode step of a 0.8B model on an H200).
 *
 * First the rows' logit adjustments (penalties: ts_logit_adjust), in place; then, after a
 * kernel that zeroes the rows' headers (and histograms), per row, four kernels:
 *   max      the largest candidate logit (NaN and -inf are none) and the plain argmax, as
 *            64-bit keys merged with atomicMax (cuda_argmax_key: value, then the lower index);
 *   weights  w = exp(l / T - max / T) for every candidate (0 for the others, and under min-p
 *            for those below min_p), written out, with one sum per chunk of SMP_CHUNK; with
 *            top-k / top-p, a histogram of the weights' float bits (count and mass of each of
 *            2048 buckets: the top 12 bits, monotone in the value, as the host's top-p uses);
 *   select   one block a row: greedy rows take the argmax; a plain draw (no top-k / top-p)
 *            finds the chunk and then the token where the running sum of the weights, in
 *            vocabulary order, first exceeds u times their total - the host sampler's draw;
 *            top-k / top-p rows instead find the lowest bucket the filter can reach (counts for
 *            top-k; mass for top-p, with a bucket of margin against rounding);
 *   compact  top-k / top-p rows: every token of a bucket at or above that one, logit and id, to
 *            a list (for a top-p row the device ends: its last bucket's tokens, weight and id,
 *            and the weights above it summed per chunk);
 *   finish   where the device ends every row (smp_device_ends): one block a row draws a top-k
 *            or top-p row from its list as the host sampler does, and every row's id goes out
 *            as a key (cuda_keys_to_host): no copy, and the step can be decoded ahead.
 * Otherwise (a top-k over SMP_TOPK_DEVICE, a request for the list itself) the headers and the
 * lists come back through the staging arena with the step, inside a replayed graph too, and the
 * host puts a list in vocabulary order and finishes it with the sampler's own code - a few
 * hundred tokens for a peaked distribution where the host would have scanned 248k; a list
 * longer than SMP_LIST_CAP entries costs one more copy.
 * Rows that are all greedy or plain draws without min-p (the default request) take instead one
 * kernel, k_smp_draw, that does the max, weights and select in one pass of the logits. */
#include <limits.h>
#include <math.h>

#include "backend/cuda/cuda_int.cuh"

#define SMP_CHUNK 1024
#define SMP_BUCKETS 2048
/* candidates of a top-k / top-p row that come back with the step itself (8 bytes each) */
#define SMP_LIST_CAP 2048

/* A row's results on the device (zeroed before each call). */
typedef struct {
    unsigned long long key_cand, key_all;
    double total;
    int bucket; /* compaction threshold: tokens whose weight's bucket is >= it */
    int count;  /* tokens in the compacted list */
    int id;     /* the drawn token, or -1: the list is the answer */
    int pad;
} smp_row;

/* The row's kind of work: greedy, a plain draw, or a list for the host. */
__host__ __device__ static inline bool smp_greedy(const ts_sample_req &r) {
    return !(r.temperature > 0);
}
__host__ __device__ static inline bool smp_listed(const ts_sample_req &r) {
    return r.top_k > 0 || r.top_p < 1.0f;
}

/* Zeroes the headers and histograms. A kernel, not a memset node: the scratch buffer moves
 * when it grows, and a graph's memset node re-pointed from a freed buffer crashed the driver's
 * graph launch (CUDA 13), where kernel nodes take new arguments fine. */
__global__ static void k_smp_zero(uint4 *p, size_t n) {
    cuda_pdl_entry();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = make_uint4(0, 0, 0, 0);
}

/* A row's share of the adjustments (ts_logit_adjust) uploaded for a call. */
typedef struct {
    int off, n;
} smp_adj_row;

/* The adjustments, in place: the same float operations as ts_logit_adjust_apply on the host. */
__global__ static void k_smp_adjust(float *x, int64_t ldx, int n_cols, const smp_adj_row *rows,
                                    const ts_logit_adjust *adj) {
    cuda_pdl_entry();
    const smp_adj_row h = rows[blockIdx.y];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < h.n; i += gridDim.x * blockDim.x) {
        const ts_logit_adjust a = adj[h.off + i];
        if (a.id < 0 || a.id >= n_cols) continue;
        float *l = x + blockIdx.y * ldx + a.id;
        float v = __fadd_rn(*l, a.bias);
        if (a.rep != 1.0f && a.rep > 0.0f && isfinite(a.rep))
            v = v > 0 ? __fdiv_rn(v, a.rep) : __fmul_rn(v, a.rep);
        *l = __fsub_rn(v, a.sub);
    }
}

/* The entries of a row's adjustments that are used: distinct ids, so no more than a row holds. */
static int smp_adj_count(const ts_sample_req *q, int n_cols) {
    return q->n_adjust <= 0 ? 0 : q->n_adjust < n_cols ? q->n_adjust : n_cols;
}

/* The rows' adjustments packed, row after row, into entries and their headers into rows; the
 * number of entries returned */
static size_t smp_adj_pack(const ts_sample_req *req, int n_rows, int n_cols,
                           ts_logit_adjust *entries, smp_adj_row *rows) {
    int off = 0;
    for (int r = 0; r < n_rows; r++) {
        int n = smp_adj_count(&req[r], n_cols);
        rows[r] = (smp_adj_row){off, n};
        if (n) memcpy(entries + off, req[r].adjust, (size_t)n * sizeof *entries);
        off += n;
    }
    return (size_t)off;
}

/* Queues the rows' adjustments (none: nothing). The entries go up in a copy padded to a power
 * of two, so that a decode step's graph keeps its shape while the list grows by a token, and
 * the kernel reads each row's count from its header, not from its arguments. In a held step
 * (decoding ahead) the place of both in the host bytes its launch copies up is kept
 * (c->held_adj): the engine rewrites them at the launch with the lists as they are then. */
void cuda_sample_adjust(cuda_ctx *c, float *x, int64_t ldx, int n_rows, int n_cols,
                        const ts_sample_req *req) {
    size_t total = 0;
    for (int r = 0; r < n_rows; r++)
        total += (size_t)smp_adj_count(&req[r], n_cols);
    if (!total) return;
    size_t room = (size_t)n_rows * n_cols, cap = 256;
    while (cap < total) cap *= 2;
    if (cap > room) cap = room;
    ts_logit_adjust *h = (ts_logit_adjust *)calloc(cap, sizeof *h);
    smp_adj_row *hr = (smp_adj_row *)calloc((size_t)n_rows, sizeof *hr);
    ts_logit_adjust *d = (ts_logit_adjust *)cuda_scratch(c, 6, room * sizeof *d);
    if (!h || !hr || !d) {
        free(h), free(hr);
        cuda_check(c, cudaErrorMemoryAllocation, "sample adjust");
        return;
    }
    smp_adj_pack(req, n_rows, n_cols, h, hr);
    const smp_adj_row *dr = (const smp_adj_row *)cuda_table(c, hr, (size_t)n_rows * sizeof *hr);
    void *st = cq_holding(c) ? cq_stage(c, cap * sizeof *h) : nullptr;
    if (st) { /* held: staged by hand, to know where its bytes lie */
        memcpy(cq_stage_fill(c, st), h, cap * sizeof *h);
        cuda_copy_async(c, d, st, cap * sizeof *h, cudaMemcpyHostToDevice, "sample adjust");
        void *rows = dr ? cq_held_table_fill(c, (void *)dr) : nullptr;
        if (rows) c->held_adj = {true, cq_stage_fill(c, st), rows, cap, n_rows, n_cols};
    } else {
        cuda_upload_async(c, d, h, cap * sizeof *h, "sample adjust");
    }
    if (dr)
        cuda_launch(c, "sample adjust", k_smp_adjust, dim3(8, (unsigned)n_rows), 256, 0, x, ldx,
                    n_cols, dr, (const ts_logit_adjust *)d);
    free(h), free(hr);
}

bool cuda_sample_held_adjust(cuda_ctx *c, const ts_sample_req *req, int n_rows) {
    const auto &a = c->held_adj;
    if (!a.on) { /* no adjustments were queued: right only without */
        for (int r = 0; r < n_rows; r++)
            if (req[r].n_adjust > 0) return false;
        return true;
    }
    size_t total = 0;
    for (int r = 0; r < n_rows; r++)
        total += (size_t)smp_adj_count(&req[r], a.n_cols);
    if (n_rows != a.n_rows || total > a.cap) return false;
    smp_adj_pack(req, n_rows, a.n_cols, (ts_logit_adjust *)a.entries, (smp_adj_row *)a.rows);
    return true;
}

__global__ static void k_smp_max(const float *x, int64_t ldx, int n_cols, smp_row *hdr) {
    cuda_pdl_entry();
    __shared__ unsigned long long part[2][32];
    const float *row = x + blockIdx.y * ldx;
    int j0 = blockIdx.x * SMP_CHUNK, j1 = min(n_cols, j0 + SMP_CHUNK);
    unsigned long long cand = 0, all = 0;
    for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        float v = row[j];
        if (v == v) all = max(all, cuda_argmax_key(v, j));
        if (cuda_logit_candidate(v)) cand = max(cand, cuda_argmax_key(v, j));
    }
    for (int off = 16; off > 0; off >>= 1) {
        cand = max(cand, __shfl_xor_sync(0xffffffffu, cand, off));
        all = max(all, __shfl_xor_sync(0xffffffffu, all, off));
    }
    if ((threadIdx.x & 31) == 0) part[0][threadIdx.x >> 5] = cand, part[1][threadIdx.x >> 5] = all;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            cand = max(cand, part[0][w]), all = max(all, part[1][w]);
        if (cand) atomicMax(&hdr[blockIdx.y].key_cand, cand);
        if (all) atomicMax(&hdr[blockIdx.y].key_all, all);
    }
}

__global__ static void k_smp_weights(const float *x, int64_t ldx, int n_cols,
                                     const ts_sample_req *req, const smp_row *hdr, float *W,
                                     float *chunk_sum, int n_chunks, unsigned *hcount,
                                     double *hmass) {
    __shared__ unsigned s_count[SMP_BUCKETS];
    __shared__ double s_mass[SMP_BUCKETS];
    __shared__ float part[32];
    const int r = blockIdx.y;
    const ts_sample_req q = req[r]; /* the host's: read under the previous kernel */
    cuda_pdl_entry();
    const unsigned long long kc = hdr[r].key_cand;
    if (smp_greedy(q) || !kc) return; /* the whole block: nothing to weigh */
    const bool listed = smp_listed(q);
    const float t = q.temperature, top = cuda_argmax_key_value(kc) / t;
    /* min-p removes weights before a plain draw; with top-k / top-p the host applies it after
     * them, so the list and the histogram see every weight */
    const float floor_w = listed ? 0.0f : q.min_p;
    if (listed) {
        for (int b = threadIdx.x; b < SMP_BUCKETS; b += blockDim.x) s_count[b] = 0, s_mass[b] = 0;
        __syncthreads();
    }
    const float *row = x + r * ldx;
    float *wr = W + (size_t)r * n_cols;
    int j0 = blockIdx.x * SMP_CHUNK, j1 = min(n_cols, j0 + SMP_CHUNK);
    float sum = 0;
    for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        float l = row[j], w = 0;
        if (cuda_logit_candidate(l)) w = expf(l / t - top);
        if (w < floor_w) w = 0;
        wr[j] = w;
        sum += w;
        if (listed && w > 0) {
            int b = (int)(__float_as_uint(w) >> 20);
            atomicAdd(&s_count[b], 1u);
            atomicAdd(&s_mass[b], (double)w);
        }
    }
    sum = cuda_warp_sum(sum);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) sum += part[w];
        chunk_sum[(size_t)r * n_chunks + blockIdx.x] = sum;
    }
    if (listed)
        for (int b = threadIdx.x; b < SMP_BUCKETS; b += blockDim.x)
            if (s_count[b]) {
                atomicAdd(&hcount[(size_t)r * SMP_BUCKETS + b], s_count[b]);
                atomicAdd(&hmass[(size_t)r * SMP_BUCKETS + b], s_mass[b]);
            }
}

/* A weight that counts for a draw over the buckets above low (-1: every weight), at or above
 * floor (min-p after a top-p cut; 0: none). */
__device__ static inline bool smp_above(float w, int low, float floor) {
    return w > 0 && (int)(__float_as_uint(w) >> 20) > low && w >= floor;
}

/* An inclusive scan of v over the block's 1024 threads (thread order); the block total in
 * *total. Every thread must call it. */
template <typename T> __device__ static T smp_block_scan(T v, T *total) {
    __shared__ T warp_tot[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int off = 1; off < 32; off <<= 1) {
        T o = __shfl_up_sync(0xffffffffu, v, off);
        if (lane >= off) v += o;
    }
    if (lane == 31) warp_tot[w] = v;
    __syncthreads();
    if (w == 0) {
        T s = lane < (int)(blockDim.x >> 5) ? warp_tot[lane] : (T)0;
        for (int off = 1; off < 32; off <<= 1) {
            T o = __shfl_up_sync(0xffffffffu, s, off);
            if (lane >= off) s += o;
        }
        warp_tot[lane] = s;
    }
    __syncthreads();
    if (w > 0) v += warp_tot[w - 1];
    *total = warp_tot[(blockDim.x >> 5) - 1];
    __syncthreads(); /* warp_tot is reused by the next call */
    return v;
}

/* The first token, in vocabulary order, where the running sum of the weights wr of buckets above
 * low (all weights: -1) and at or above floor exceeds target, given their sums per chunk of
 * SMP_CHUNK (cs); one block of SMP_CHUNK threads. The chunk: one thread adds the chunk sums in
 * order (a few hundred); then the block scans that chunk's weights. The chunk sums' rounding may
 * put the crossing a chunk later than the scan of its weights does, so the scan walks on until a
 * token crosses; none (u * total not below the sum): the last weight. */
__device__ static int smp_vocab_draw(const float *cs, int n_chunks, const float *wr, int n_cols,
                                     double target, int low, float floor) {
    __shared__ int s_chunk, s_hit;
    __shared__ double s_before;
    const int tid = threadIdx.x;
    if (tid == 0) {
        double acc = 0;
        int c = 0;
        for (; c < n_chunks - 1; c++) {
            double next = acc + (double)cs[c];
            if (next > target) break;
            acc = next;
        }
        s_chunk = c, s_before = acc;
    }
    __syncthreads();
    int found = -1;
    double acc = s_before;
    for (int c = s_chunk; c < n_chunks; c++) {
        int j = c * SMP_CHUNK + tid;
        float wf = j < n_cols ? wr[j] : 0.0f;
        double w = smp_above(wf, low, floor) ? (double)wf : 0.0, ctot;
        double run = acc + smp_block_scan(w, &ctot);
        if (tid == 0) s_hit = INT_MAX;
        __syncthreads();
        if (w > 0 && run > target) atomicMin(&s_hit, j);
        __syncthreads();
        found = s_hit == INT_MAX ? -1 : s_hit;
        acc += ctot;
        __syncthreads(); /* everyone has read s_hit */
        if (found >= 0) break;
    }
    if (found < 0) {
        if (tid == 0) s_hit = -1;
        __syncthreads();
        for (int c = n_chunks - 1; c >= 0 && found < 0; c--) {
            int j = c * SMP_CHUNK + tid;
            if (j < n_cols && smp_above(wr[j], low, floor)) atomicMax(&s_hit, j);
            __syncthreads();
            found = s_hit;
            __syncthreads();
        }
        found = max(found, 0);
    }
    return found;
}

/* One block of 1024 threads per row. */
__global__ static void k_smp_select(const ts_sample_req *req, smp_row *hdr, const float *W,
                                    int n_cols, const float *chunk_sum, int n_chunks,
                                    const unsigned *hcount, const double *hmass, bool exact) {
    __shared__ int s_hit;
    const int r = blockIdx.x, tid = threadIdx.x;
    const ts_sample_req q = req[r]; /* the host's: read under the previous kernel */
    cuda_pdl_entry();
    smp_row *h = &hdr[r];
    if (smp_greedy(q) || !h->key_cand) { /* greedy, or nothing to draw from: the argmax */
        if (tid == 0) h->id = cuda_argmax_key_index(h->key_all);
        return;
    }
    const float *cs = chunk_sum + (size_t)r * n_chunks;
    /* the total in a fixed order: each thread's chunks, then the block's tree */
    double part = 0, total;
    for (int c = tid; c < n_chunks; c += blockDim.x) part += cs[c];
    smp_block_scan(part, &total);
    if (smp_listed(q)) { /* the lowest bucket the filter can reach */
        const unsigned *hc = hcount + (size_t)r * SMP_BUCKETS;
        const double *hm = hmass + (size_t)r * SMP_BUCKETS;
        /* thread t holds buckets 2047 - 2t and 2046 - 2t: a scan in thread order sums from
         * the top bucket down */
        int b0 = SMP_BUCKETS - 1 - 2 * tid;
        unsigned cnt = hc[b0] + hc[b0 - 1], ctot;
        double mass = hm[b0] + hm[b0 - 1], mtot;
        unsigned ccum = smp_block_scan(cnt, &ctot);
        double mcum = smp_block_scan(mass, &mtot);
        if (tid == 0) s_hit = 0; /* bucket 0: everything */
        __syncthreads();
        if (q.top_k > 0) {
            /* the k-th largest weight lies in the first bucket where the count from the top
             * reaches k */
            unsigned k = (unsigned)q.top_k;
            if (ccum >= k) atomicMax(&s_hit, ccum - cnt + hc[b0] >= k ? b0 : b0 - 1);
        } else if (exact) { /* the device ends the draw: the host sampler's bucket */
            double target = (double)q.top_p * total;
            if (mcum >= target) atomicMax(&s_hit, mcum - mass + hm[b0] >= target ? b0 : b0 - 1);
        } else {
            /* mass from the top reaching top_p of the total (less a little, for the sums'
             * different order), then one bucket more */
            double target = (double)q.top_p * total * (1.0 - 1e-6);
            if (mcum >= target) atomicMax(&s_hit, (mcum - mass + hm[b0] >= target ? b0 : b0 - 1) - 1);
        }
        __syncthreads();
        if (tid == 0) h->bucket = max(s_hit, 0), h->total = total, h->id = -1;
        return;
    }
    /* a plain draw: the first token where the running sum exceeds u * total */
    int found = smp_vocab_draw(cs, n_chunks, W + (size_t)r * n_cols, n_cols, q.u * total, -1, 0.0f);
    if (tid == 0) h->id = found;
}

/* A plain draw in one kernel (rows greedy or drawn without top-k, top-p or min-p: what a
 * request asks for by default). The max, weights and select kernels above take three kernel
 * boundaries after the output head, a write and a read of the weights, and the header's copy
 * back; here each block reduces its 1024-token parts of the row to a part (its largest logit
 * and the sum of its weights against that, which the row's maximum rescales later: the weights
 * need no maximum known before them), and the row's last block to finish (a ticket a row, as
 * the argmax's) adds the rescaled parts in order, finds the part where the running sum passes
 * u times the total, and scans that part's weights, recomputed as the select kernel has them,
 * for the token. The id goes out as a key (cuda_id_key), to the host's staging memory where the
 * wait looks for it, and to fed for a held step's embedding rows. */
typedef struct {
    unsigned long long key_cand, key_all; /* cuda_argmax_key maxima: candidates; all non-NaN */
    float top;                            /* the largest candidate logit / T (-inf: none) */
    float sum;                            /* of exp(l / T - top) over the candidates */
} smp_part;
#define SMP_PART_WORDS   (sizeof(smp_part) / sizeof(unsigned long long))
#define SMP_DRAW_THREADS (SMP_CHUNK / 4) /* 4 tokens a thread */

/* The largest of the block's a and of its b, in every thread. */
__device__ static void smp_block_max2(unsigned long long *a, unsigned long long *b) {
    __shared__ unsigned long long part[2][32];
    for (int off = 16; off > 0; off >>= 1) {
        *a = max(*a, __shfl_xor_sync(0xffffffffu, *a, off));
        *b = max(*b, __shfl_xor_sync(0xffffffffu, *b, off));
    }
    if ((threadIdx.x & 31) == 0) part[0][threadIdx.x >> 5] = *a, part[1][threadIdx.x >> 5] = *b;
    __syncthreads();
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        *a = max(*a, part[0][w]), *b = max(*b, part[1][w]);
    __syncthreads(); /* part[] read before anyone writes it again */
}

/* Thread threadIdx.x's 4 tokens of part p (NaN past the row's end). */
__device__ static inline void smp_load4(const float *row, int p, int n_cols, bool vec, float v[4]) {
    int j = p * SMP_CHUNK + 4 * (int)threadIdx.x;
    if (vec && j + 3 < n_cols) {
        float4 q = *(const float4 *)(row + j);
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] = j + k < n_cols ? row[j + k] : NAN;
    }
}

/* Part p's weight against the row's top (both logit / T): its sum rescaled, in float64. */
__device__ static inline double smp_part_mass(const smp_part *rp, int p, float top) {
    float sum = __ldcg(&rp[p].sum);
    return sum > 0 ? (double)sum * exp((double)__ldcg(&rp[p].top) - (double)top) : 0.0;
}

__global__ static void __launch_bounds__(SMP_DRAW_THREADS)
    k_smp_draw(const float *x, int64_t ldx, int n_cols, int per_block, const ts_sample_req *req,
               smp_part *parts, unsigned *tickets, unsigned long long *keys,
               unsigned long long *host) {
    __shared__ float s_t;
    __shared__ double s_u, s_before;
    __shared__ int s_hit;
    const int r = blockIdx.y, tid = threadIdx.x;
    /* the request is the host's, staged before the launch: read under the previous kernel */
    if (tid == 0) s_t = req[r].temperature, s_u = req[r].u;
    cuda_pdl_entry();
    __syncthreads();
    const float t = s_t;
    const bool draw = t > 0;
    const float *row = x + (int64_t)r * ldx;
    const bool vec = ((ldx & 3) | ((uintptr_t)x & 15)) == 0;
    const int n_parts = (n_cols + SMP_CHUNK - 1) / SMP_CHUNK;
    smp_part *rp = parts + (size_t)r * n_parts;
    const int p_end = min(n_parts, (int)(blockIdx.x + 1) * per_block);
    for (int p = blockIdx.x * per_block; p < p_end; p++) {
        float v[4];
        smp_load4(row, p, n_cols, vec, v);
        unsigned long long kc = 0, ka = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int j = p * SMP_CHUNK + 4 * tid + k;
            if (v[k] == v[k]) ka = max(ka, cuda_argmax_key(v[k], j));
            if (cuda_logit_candidate(v[k])) kc = max(kc, cuda_argmax_key(v[k], j));
        }
        smp_block_max2(&kc, &ka);
        float top = kc ? cuda_argmax_key_value(kc) / t : -INFINITY, sum = 0, tot = 0;
        if (draw && kc) { /* block-uniform */
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (cuda_logit_candidate(v[k])) sum += expf(v[k] / t - top);
            smp_block_scan(sum, &tot);
        }
        if (tid == 0) rp[p] = (smp_part){kc, ka, top, tot};
    }
    if (!cuda_last_block(tickets + r)) return;
    /* thread tid's parts: [q0, q1), in order */
    const int per = (n_parts + (int)blockDim.x - 1) / (int)blockDim.x;
    const int q0 = min(n_parts, tid * per), q1 = min(n_parts, q0 + per);
    unsigned long long kc = 0, ka = 0;
    for (int p = q0; p < q1; p++)
        kc = max(kc, __ldcg(&rp[p].key_cand)), ka = max(ka, __ldcg(&rp[p].key_all));
    smp_block_max2(&kc, &ka);
    int found = -1;
    if (!draw || !kc) { /* greedy, or nothing to draw from: the argmax */
        found = cuda_argmax_key_index(ka);
    } else {
        const float top = cuda_argmax_key_value(kc) / t;
        double mine = 0, total;
        for (int p = q0; p < q1; p++)
            mine += smp_part_mass(rp, p, top);
        const double start = smp_block_scan(mine, &total) - mine, target = s_u * total;
        /* the first part where the running sum exceeds the target (the last part where the
         * sum does not reach it: rounding), then the sum before it, from its owner */
        if (tid == 0) s_hit = n_parts - 1;
        __syncthreads();
        double acc = start;
        for (int p = q0; p < q1; p++) {
            double m = smp_part_mass(rp, p, top);
            if (acc + m > target) {
                atomicMin(&s_hit, p);
                break;
            }
            acc += m;
        }
        __syncthreads();
        const int first = s_hit;
        if (first >= q0 && first < q1) {
            acc = start;
            for (int p = q0; p < first; p++)
                acc += smp_part_mass(rp, p, top);
            s_before = acc;
        }
        __syncthreads();
        /* the part's tokens, weights as the select kernel has them; the parts' rounding may
         * put the crossing a part later than the tokens' own sums do: walk on until one does */
        acc = s_before;
        for (int p = first; p < n_parts && found < 0; p++) {
            float v[4];
            double w[4], sum = 0, ptot;
            smp_load4(row, p, n_cols, vec, v);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                w[k] = cuda_logit_candidate(v[k]) ? (double)expf(v[k] / t - top) : 0.0;
                sum += w[k];
            }
            double run = acc + smp_block_scan(sum, &ptot) - sum;
            if (tid == 0) s_hit = INT_MAX;
            __syncthreads();
#pragma unroll
            for (int k = 0; k < 4; k++) {
                run += w[k];
                if (w[k] > 0 && run > target) {
                    atomicMin(&s_hit, p * SMP_CHUNK + 4 * tid + k);
                    break;
                }
            }
            __syncthreads();
            found = s_hit == INT_MAX ? -1 : s_hit;
            acc += ptot;
            __syncthreads(); /* everyone has read s_hit */
        }
        /* u * total not below the sum (rounding): the last token with a weight */
        for (int p = n_parts - 1; p >= 0 && found < 0; p--) {
            float v[4];
            smp_load4(row, p, n_cols, vec, v);
            if (tid == 0) s_hit = -1;
            __syncthreads();
            for (int k = 3; k >= 0; k--)
                if (cuda_logit_candidate(v[k]) && expf(v[k] / t - top) > 0) {
                    atomicMax(&s_hit, p * SMP_CHUNK + 4 * tid + k);
                    break;
                }
            __syncthreads();
            found = s_hit;
            __syncthreads();
        }
    }
    if (tid == 0) {
        unsigned long long key = cuda_id_key(found < 0 ? 0 : found);
        keys[r] = key;
        if (host) host[r] = key;
    }
}

/* The candidate lists: tokens of a bucket at or above the select's, logit and id. With exact
 * (the device ends every row), a top-p row without top-k lists instead its last bucket's
 * tokens (the one the select found), weight and id, and sums the weights above that bucket per
 * chunk into cs (the select has read the plain sums), and those of them at or above min_p into
 * cs_floor. */
__global__ static void k_smp_compact(const float *x, int64_t ldx, int n_cols,
                                     const ts_sample_req *req, smp_row *hdr, const float *W,
                                     float *out_logit, int32_t *out_tok, bool exact, float *cs,
                                     float *cs_floor, int n_chunks) {
    __shared__ float part[2][32];
    const int r = blockIdx.y;
    const ts_sample_req q = req[r]; /* the host's: read under the previous kernel */
    cuda_pdl_entry();
    smp_row *h = &hdr[r];
    if (smp_greedy(q) || !smp_listed(q) || h->id >= 0) return;
    const bool nucleus = exact && q.top_k <= 0;
    const int bucket = h->bucket, lane = threadIdx.x & 31;
    const float *row = x + r * ldx, *wr = W + (size_t)r * n_cols;
    int j0 = blockIdx.x * SMP_CHUNK, j1 = min(n_cols, j0 + SMP_CHUNK);
    float upper = 0, upper_floor = 0; /* the weights above the bucket; of them those >= min_p */
    for (int jb = j0; jb < j1; jb += blockDim.x) {
        int j = jb + threadIdx.x;
        float w = j < j1 ? wr[j] : 0.0f;
        int b = (int)(__float_as_uint(w) >> 20);
        bool keep = w > 0 && (nucleus ? b == bucket : b >= bucket);
        if (nucleus && w > 0 && b > bucket) {
            upper += w;
            if (w >= q.min_p) upper_floor += w;
        }
        /* one atomic a warp */
        unsigned m = __ballot_sync(0xffffffffu, keep);
        int base = 0;
        if (lane == 0 && m) base = atomicAdd(&h->count, __popc(m));
        base = __shfl_sync(0xffffffffu, base, 0);
        if (keep) {
            int at = base + __popc(m & ((1u << lane) - 1));
            out_logit[(size_t)r * n_cols + at] = nucleus ? w : row[j];
            out_tok[(size_t)r * n_cols + at] = j;
        }
    }
    if (!nucleus) return;
    upper = cuda_warp_sum(upper), upper_floor = cuda_warp_sum(upper_floor);
    if (lane == 0) part[0][threadIdx.x >> 5] = upper, part[1][threadIdx.x >> 5] = upper_floor;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            upper += part[0][w], upper_floor += part[1][w];
        cs[(size_t)r * n_chunks + blockIdx.x] = upper;
        cs_floor[(size_t)r * n_chunks + blockIdx.x] = upper_floor;
    }
}

/* Top-k rows finished on the device (k_smp_finish): the largest k a row may ask for (a thread a
 * candidate); a larger k hands the host its list. */
#define SMP_TOPK_DEVICE 1024
/* list entries put in order in shared memory at once; a longer list is narrowed to its k best
 * by a radix select first */
#define SMP_SORT_CAP 2048

/* Whether the device ends a row's draw itself (keys, no list for the host). */
__host__ __device__ static inline bool smp_device_ends(const ts_sample_req &r, int n_cols) {
    if (!(r.temperature > 0)) return true;
    if (r.list) return false;            /* the caller wants the candidates */
    if (r.top_k >= n_cols) return false; /* the host's "no top-k" with a list: rare */
    return r.top_k <= SMP_TOPK_DEVICE;
}

/* a[0 .. N) (N a power of two) in descending order: a bitonic sort, the whole block calling. */
__device__ static void smp_sort_desc(unsigned long long *a, int N) {
    for (int size = 2; size <= N; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < N / 2; t += blockDim.x) {
                int lo = 2 * stride * (t / stride) + t % stride, hi = lo + stride;
                bool up = (lo & size) != 0; /* this run ascending: the last merge descends */
                unsigned long long x = a[lo], y = a[hi];
                if ((x > y) == up) a[lo] = y, a[hi] = x;
            }
            __syncthreads();
        }
}

/* The first of a list's n entries (value lg[i], id tk[i]; keys cuda_argmax_key(value, id), all
 * distinct), in descending order, whose running sum of weights reaches x (strict: exceeds x) -
 * the weight of an entry its value (a running mass), or with unit 1 (x = k: the k-th largest) -
 * a byte of the key at a time from the top: each pass a histogram of the next byte's weight
 * among the keys that match so far, and the byte where the running sum crosses. Its key, and
 * in *before the weight of the keys above it; where none reaches x (rounding), the last. The
 * whole block calls it. */
__device__ static unsigned long long smp_radix_key(const float *lg, const int32_t *tk, int n,
                                                   bool unit, double x, bool strict,
                                                   double *before) {
    __shared__ double mass[256];
    __shared__ unsigned long long s_prefix;
    __shared__ double s_acc;
    unsigned long long prefix = 0, mask = 0;
    double acc = 0; /* the mass of the keys above those that match */
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x)
            mass[b] = 0;
        __syncthreads();
        /* the lanes of a warp that add to one byte add once: in the first passes most keys
         * share a few bytes (a bucket's weights share their top 12 bits), and the atomics on
         * one address queue (a flat 248k-token row's top-p step on an H200: 1071 -> 863 us) */
        for (int base = 0; base < n; base += blockDim.x) {
            const int i = base + threadIdx.x;
            int byte = -1;
            double v = 0;
            if (i < n) {
                unsigned long long key = cuda_argmax_key(lg[i], tk[i]);
                if ((key & mask) == prefix)
                    byte = (int)((key >> shift) & 255), v = unit ? 1.0 : (double)lg[i];
            }
            const unsigned peers = __match_any_sync(0xffffffffu, byte);
            double sum = 0;
            for (int l = 0; l < 32; l++) {
                double o = __shfl_sync(0xffffffffu, v, l);
                if ((peers >> l) & 1) sum += o;
            }
            if (byte >= 0 && (int)(threadIdx.x & 31) == __ffs(peers) - 1)
                atomicAdd(&mass[byte], sum);
        }
        __syncthreads();
        if (threadIdx.x < 32) { /* lane l: bytes 255 - 8l down to 248 - 8l */
            const int lane = threadIdx.x, top = 255 - 8 * lane;
            double mine = 0;
            for (int j = 0; j < 8; j++)
                mine += mass[top - j];
            double incl = mine;
            for (int off = 1; off < 32; off <<= 1) {
                double o = __shfl_up_sync(0xffffffffu, incl, off);
                if (lane >= off) incl += o;
            }
            const double hi = acc + incl;
            unsigned cross = __ballot_sync(0xffffffffu, strict ? hi > x : hi >= x);
            unsigned full = __ballot_sync(0xffffffffu, mine > 0);
            int at = cross ? __ffs(cross) - 1 : 31 - __clz(full); /* none: the last byte */
            if (lane == at) {
                double a = hi - mine, a_last = a;
                int d = top, d_last = top;
                for (int j = 0; j < 8; j++) {
                    int b = top - j;
                    if (mass[b] > 0) d_last = b, a_last = a;
                    if (cross && (strict ? a + mass[b] > x : a + mass[b] >= x)) {
                        d = b;
                        break;
                    }
                    a += mass[b];
                    d = -1;
                }
                if (d < 0) d = d_last, a = a_last; /* rounding within the lane: its last */
                s_prefix = prefix | ((unsigned long long)d << shift);
                s_acc = a;
            }
        }
        __syncthreads();
        prefix = s_prefix, acc = s_acc;
        mask |= 255ull << shift;
    }
    *before = acc;
    return prefix;
}

/* One block of 1024 threads a row, after the select (and the list): each row's id as a key into
 * keys (device: a held step's fed keys, or scratch) and host (staging; null without zero_copy).
 * Greedy and plain rows have theirs from the select; a top-k row (k <= SMP_TOPK_DEVICE) is
 * drawn here as the host sampler draws it (sampler.c, pick): its k best candidates by logit,
 * the lower id first among equals; those ordered by logit / T, then id; weights exp(l / T -
 * best / T); top-p keeps the first of them whose running sum reaches top_p times their total,
 * min-p those at or above min_p; the draw walks what is kept in that order to u times its
 * sum. */
__global__ static void __launch_bounds__(1024)
    k_smp_finish(const ts_sample_req *req, const smp_row *hdr, const float *lg, const int32_t *tk,
                 const float *W, const float *cs, const float *cs_floor, int n_chunks, int n_cols,
                 unsigned long long *keys, unsigned long long *host) {
    __shared__ unsigned long long s_key[SMP_SORT_CAP];
    __shared__ int s_n, s_hit;
    const int r = blockIdx.x, tid = threadIdx.x;
    const ts_sample_req q = req[r]; /* the host's: read under the previous kernel */
    cuda_pdl_entry();
    int id = hdr[r].id;
    if (id < 0 && q.top_k <= 0) { /* top-p without top-k: the host sampler's nucleus (sampler.c) */
        /* every token of a bucket above the last one the mass needs, in vocabulary order,
         * then the last bucket's (the list, weight and id) in descending order until the
         * running sum reaches top_p of the total; min-p then keeps those at or above min_p
         * (of the last bucket's, a shorter run from the top); the draw walks them in that
         * order */
        __shared__ unsigned long long s_floor_key;
        const float *rl = lg + (size_t)r * n_cols, *wr = W + (size_t)r * n_cols;
        const int32_t *rt = tk + (size_t)r * n_cols;
        const float *rcs = cs + (size_t)r * n_chunks; /* the weights above it, by chunk */
        const float *rcf = cs_floor + (size_t)r * n_chunks; /* of them, those >= min_p */
        const int n = hdr[r].count, low = hdr[r].bucket;
        const float floor = q.min_p > 0.0f ? q.min_p : 0.0f;
        double part = 0, part_f = 0, above, above_f, before;
        for (int c = tid; c < n_chunks; c += blockDim.x)
            part += rcs[c], part_f += rcf[c];
        smp_block_scan(part, &above);
        smp_block_scan(part_f, &above_f);
        /* the last bucket's entries at or above the floor: their mass and their last key */
        if (tid == 0) s_floor_key = ~0ull;
        __syncthreads();
        double mine = 0, floor_mass;
        unsigned long long low_key = ~0ull;
        for (int i = tid; i < n; i += blockDim.x)
            if (rl[i] >= floor)
                mine += rl[i], low_key = min(low_key, cuda_argmax_key(rl[i], rt[i]));
        smp_block_scan(mine, &floor_mass);
        if (low_key != ~0ull) atomicMin(&s_floor_key, low_key);
        __syncthreads();
        const double target = (double)q.top_p * hdr[r].total;
        unsigned long long last = ~0ull; /* the last key kept of the last bucket's run */
        double kept = above_f;
        if (n > 0) {
            last = smp_radix_key(rl, rt, n, false, target - above, false, &before);
            double cut = before + (double)cuda_argmax_key_value(last);
            if (floor_mass < cut) /* min-p ends the run first (none of it: ~0) */
                last = s_floor_key, cut = floor_mass;
            kept += cut;
        }
        const double at = q.u * kept;
        if (last == ~0ull || at < above_f) {
            id = smp_vocab_draw(rcf, n_chunks, wr, n_cols, at, low, floor);
        } else {
            unsigned long long key = smp_radix_key(rl, rt, n, false, at - above_f, true, &before);
            id = cuda_argmax_key_index(key < last ? last : key); /* not past the last kept */
        }
    } else if (id < 0) { /* a top-k row: its list holds every candidate that can be among the k */
        const float *rl = lg + (size_t)r * n_cols;
        const int32_t *rt = tk + (size_t)r * n_cols;
        const int n = hdr[r].count, k = min(q.top_k, n);
        int m = n; /* keys in s_key, the k best among them */
        if (n <= SMP_SORT_CAP) {
            for (int i = tid; i < SMP_SORT_CAP; i += blockDim.x)
                s_key[i] = i < n ? cuda_argmax_key(rl[i], rt[i]) : 0;
        } else { /* narrowed to the k best first */
            double above_kth;
            const unsigned long long kth = smp_radix_key(rl, rt, n, true, k, false, &above_kth);
            for (int i = tid; i < SMP_SORT_CAP; i += blockDim.x)
                s_key[i] = 0;
            if (tid == 0) s_n = 0;
            __syncthreads();
            for (int i = tid; i < n; i += blockDim.x) {
                unsigned long long key = cuda_argmax_key(rl[i], rt[i]);
                if (key >= kth) s_key[atomicAdd(&s_n, 1)] = key;
            }
            m = k;
        }
        __syncthreads();
        int size = 1;
        while (size < m)
            size <<= 1;
        smp_sort_desc(s_key, size);
        /* the k best again by logit / T (the host divides, then orders: two logits may meet) */
        const float t = q.temperature;
        unsigned long long mine = 0;
        if (tid < k)
            mine = cuda_argmax_key(cuda_argmax_key_value(s_key[tid]) / t,
                                   cuda_argmax_key_index(s_key[tid]));
        __syncthreads();
        s_key[tid] = mine; /* 0 past k: last in order */
        __syncthreads();
        size = 1;
        while (size < k)
            size <<= 1;
        smp_sort_desc(s_key, size);
        const float top = cuda_argmax_key_value(s_key[0]);
        float w = tid < k ? expf(cuda_argmax_key_value(s_key[tid]) - top) : 0.0f;
        double total, run = smp_block_scan((double)w, &total);
        int keep = k; /* top-p: the first keep of them */
        if (q.top_p < 1.0f) {
            if (tid == 0) s_hit = k - 1;
            __syncthreads();
            if (tid < k && run >= (double)q.top_p * total) atomicMin(&s_hit, tid);
            __syncthreads();
            keep = s_hit + 1;
        }
        /* min-p: those kept at or above min_p (the best, weight 1, always) */
        const bool kept = tid < keep && !(q.min_p > 0.0f && w < q.min_p);
        const double wk = kept ? (double)w : 0.0;
        double sum, at = smp_block_scan(wk, &sum);
        const double target = q.u * sum;
        if (tid == 0) s_hit = INT_MAX;
        __syncthreads();
        if (kept && at > target) atomicMin(&s_hit, tid);
        __syncthreads();
        int pick = s_hit;
        if (pick == INT_MAX) { /* u * sum not below the sum (rounding): the last one kept */
            __syncthreads();
            if (tid == 0) s_hit = 0;
            __syncthreads();
            if (kept) atomicMax(&s_hit, tid);
            __syncthreads();
            pick = s_hit;
        }
        id = cuda_argmax_key_index(s_key[pick]);
    }
    if (tid == 0) {
        unsigned long long key = cuda_id_key(id);
        keys[r] = key;
        if (host) host[r] = key;
    }
}

/* A sampling call's staging: out_bytes for its results (read by the host after the step) and,
 * with zero_copy, the requests after them, which the kernels read there (else from a table, in
 * *dreq too). Null where the arena has no room. Called after whatever may flush the queue
 * (scratch, parts), since a flush empties the staging arena. */
static unsigned char *smp_stage(cuda_ctx *c, const ts_sample_req *req, int n_rows, size_t out_bytes,
                                const ts_sample_req **dreq) {
    const size_t rb = (size_t)n_rows * sizeof *req;
    *dreq = c->zero_copy ? nullptr : (const ts_sample_req *)cuda_table(c, req, rb);
    if (!c->zero_copy && !*dreq) return nullptr;
    const size_t bytes = out_bytes + (c->zero_copy ? rb : 0);
    unsigned char *st = (unsigned char *)cq_stage(c, bytes);
    if (!st) { /* the staging arena is full: run what is queued, which empties it */
        cq_flush(c);
        st = (unsigned char *)cq_stage(c, bytes);
    }
    if (st && c->zero_copy) {
        memcpy(cq_stage_fill(c, st + out_bytes), req, rb);
        *dreq = (const ts_sample_req *)(st + out_bytes);
    }
    return st;
}

/* The sampling kernels for n_rows rows with a draw among them, queued. Where the device ends
 * every row (finish; smp_device_ends), k_smp_finish writes the ids as keys into keys (null:
 * scratch) and the staging memory at h (cuda_keys_to_host). Else the copies of their answers
 * into the staging arena: the headers (smp_row) at h, then with lists (any_list) each row's
 * first list_cap logits and ids. With zero_copy the kernels read the requests where they are
 * staged. */
typedef struct {
    bool ok;
    unsigned char *h;
    size_t hdr_bytes, list_bytes, list_cap;
    float *lg; /* the lists on the device, rows of n_cols */
    int32_t *tk;
} smp_queued;

static smp_queued smp_queue(cuda_ctx *c, const float *x, int64_t ldx, int n_rows, int n_cols,
                            const ts_sample_req *req, bool any_list, bool finish,
                            unsigned long long *keys) {
    const int n_chunks = (n_cols + SMP_CHUNK - 1) / SMP_CHUNK;
    /* one scratch buffer, carved in pieces of 256-byte multiples */
    size_t off = 0;
    auto piece = [&](size_t bytes) {
        size_t at = off;
        off += (bytes + 255) & ~(size_t)255;
        return at;
    };
    /* the same layout whatever the rows ask for, so that the buffer does not move between a
     * plain draw and a list of the same shape (a graph then keeps its pointers) */
    size_t o_hdr = piece((size_t)n_rows * sizeof(smp_row));
    size_t o_hist_c = piece((size_t)n_rows * SMP_BUCKETS * sizeof(unsigned));
    size_t o_hist_m = piece((size_t)n_rows * SMP_BUCKETS * sizeof(double));
    size_t zero_end = any_list ? off : o_hist_c; /* header (and histograms) start at zero */
    size_t o_w = piece((size_t)n_rows * n_cols * sizeof(float));
    size_t o_cs = piece((size_t)n_rows * n_chunks * sizeof(float));
    size_t o_csf = piece((size_t)n_rows * n_chunks * sizeof(float));
    size_t o_lg = piece((size_t)n_rows * n_cols * sizeof(float));
    size_t o_tk = piece((size_t)n_rows * n_cols * sizeof(int32_t));
    smp_queued r;
    r.hdr_bytes = finish ? (size_t)n_rows * sizeof *keys : (size_t)n_rows * sizeof(smp_row);
    r.list_cap = any_list && !finish ? (size_t)(n_cols < SMP_LIST_CAP ? n_cols : SMP_LIST_CAP) : 0;
    r.list_bytes = (size_t)n_rows * r.list_cap * sizeof(float);
    /* each of these may flush the queue, which empties the staging arena: before staging */
    unsigned char *base = (unsigned char *)cuda_scratch(c, 5, off);
    if (finish && !keys) keys = (unsigned long long *)cuda_scratch(c, 2, r.hdr_bytes);
    const ts_sample_req *dreq;
    r.h = smp_stage(c, req, n_rows, r.hdr_bytes + 2 * r.list_bytes, &dreq);
    r.ok = base && r.h && (!finish || keys);
    smp_row *hdr = (smp_row *)(base + o_hdr);
    float *W = (float *)(base + o_w), *cs = (float *)(base + o_cs), *csf = (float *)(base + o_csf);
    unsigned *hc = (unsigned *)(base + o_hist_c);
    double *hm = (double *)(base + o_hist_m);
    r.lg = (float *)(base + o_lg);
    r.tk = (int32_t *)(base + o_tk);
    if (!r.ok) return r;
    size_t n16 = zero_end / 16;
    cuda_launch(c, "sample zero", k_smp_zero,
                dim3(cuda_blocks((int64_t)n16, 256) < 64 ? cuda_blocks((int64_t)n16, 256) : 64),
                256, 0, (uint4 *)base, n16);
    dim3 grid((unsigned)n_chunks, (unsigned)n_rows);
    cuda_launch(c, "sample max", k_smp_max, grid, 256, 0, x, ldx, n_cols, hdr);
    cuda_launch(c, "sample weights", k_smp_weights, grid, 256, 0, x, ldx, n_cols, dreq, hdr, W, cs,
                n_chunks, hc, hm);
    cuda_launch(c, "sample select", k_smp_select, dim3((unsigned)n_rows), SMP_CHUNK, 0, dreq, hdr,
                W, n_cols, cs, n_chunks, hc, hm, finish);
    if (any_list)
        cuda_launch(c, "sample list", k_smp_compact, grid, 256, 0, x, ldx, n_cols, dreq, hdr, W,
                    r.lg, r.tk, finish, cs, csf, n_chunks);
    if (finish) {
        unsigned long long *host = (unsigned long long *)r.h;
        cuda_launch(c, "sample finish", k_smp_finish, dim3((unsigned)n_rows), 1024, 0, dreq, hdr,
                    (const float *)r.lg, (const int32_t *)r.tk, (const float *)W, (const float *)cs,
                    (const float *)csf, n_chunks, n_cols, keys, c->zero_copy ? host : nullptr);
        cuda_keys_to_host(c, keys, host, n_rows);
        return r;
    }
    cuda_copy_async(c, r.h, hdr, r.hdr_bytes, cudaMemcpyDeviceToHost, "sample download");
    for (int i = 0; i < n_rows && any_list; i++) {
        size_t b = r.list_cap * sizeof(float);
        cuda_copy_async(c, r.h + r.hdr_bytes + i * b, r.lg + (size_t)i * n_cols, b,
                        cudaMemcpyDeviceToHost, "sample list download");
        cuda_copy_async(c, r.h + r.hdr_bytes + r.list_bytes + i * b, r.tk + (size_t)i * n_cols, b,
                        cudaMemcpyDeviceToHost, "sample list download");
    }
    return r;
}

bool cuda_sample_ends(const cuda_ctx *c, const ts_sample_req *r, int n_cols) {
    return smp_device_ends(*r, n_cols) && (c->sample_end || smp_greedy(*r) || !smp_listed(*r));
}

/* Whether any row hands the kernels a list to make (a top-k or top-p draw). */
static bool smp_any_list(const ts_sample_req *req, int n_rows) {
    for (int r = 0; r < n_rows; r++)
        if (!smp_greedy(req[r]) && smp_listed(req[r])) return true;
    return false;
}

bool cuda_sample_all_end(const cuda_ctx *c, const ts_sample_req *req, int n_rows, int n_cols) {
    for (int r = 0; r < n_rows; r++)
        if (!cuda_sample_ends(c, &req[r], n_cols)) return false;
    return true;
}

/* Whether k_smp_draw serves every row: greedy ones, and draws without top-k, top-p or min-p. */
static bool smp_one_kernel(const cuda_ctx *c, const ts_sample_req *req, int n_rows) {
    if (!c->sample_one) return false;
    for (int r = 0; r < n_rows; r++)
        if (req[r].temperature > 0 &&
            (req[r].top_k > 0 || req[r].top_p < 1.0f || req[r].min_p > 0.0f))
            return false;
    return true;
}

/* Queues k_smp_draw for n_rows rows: the drawn ids as keys into keys (device; null: scratch)
 * and the staging memory it returns (null where buffers could not be had). With zero_copy the
 * kernel reads the requests where they are staged and writes the keys there too: the step has
 * no copy for its draw, and its wait may end on the keys (cuda_keys_to_host). */
static unsigned long long *smp_draw_queue(cuda_ctx *c, const float *x, int64_t ldx, int n_rows,
                                          int n_cols, const ts_sample_req *req,
                                          unsigned long long *keys) {
    const int n_parts = (n_cols + SMP_CHUNK - 1) / SMP_CHUNK;
    /* many rows (batched decode): up to 8 parts a block, keeping the grid near two waves */
    int64_t m = (int64_t)n_parts * n_rows / ((int64_t)c->sm_count * 16);
    int per_block = (int)(m < 1 ? 1 : m > 8 ? 8 : m);
    dim3 grid((unsigned)((n_parts + per_block - 1) / per_block), (unsigned)n_rows);
    size_t kb = (size_t)n_rows * sizeof *keys;
    /* each of these may flush the queue, which empties the staging arena: before staging */
    if (!cuda_parts_ready(c, (int64_t)SMP_PART_WORDS * n_parts * n_rows, n_rows)) return NULL;
    if (!keys) keys = (unsigned long long *)cuda_scratch(c, 2, kb);
    if (!keys) return NULL;
    const ts_sample_req *dreq;
    unsigned long long *host = (unsigned long long *)smp_stage(c, req, n_rows, kb, &dreq);
    if (!host) {
        if (!cq_broken(c)) cuda_check(c, cudaErrorMemoryAllocation, "sample staging");
        return NULL;
    }
    cuda_launch(c, "sample draw", k_smp_draw, grid, SMP_DRAW_THREADS, 0, x, ldx, n_cols, per_block,
                dreq, (smp_part *)c->argmax_parts, c->argmax_tickets, keys,
                c->zero_copy ? host : nullptr);
    cuda_keys_to_host(c, keys, host, n_rows);
    return host;
}

/* Queues the draws of rows the device ends every one of (cuda_sample_all_end): the ids as keys into
 * keys (device; null: scratch) and the staging memory it returns (null on failure) - one kernel
 * for plain rows, else the sampling kernels with k_smp_finish. */
static unsigned long long *smp_queue_keys(cuda_ctx *c, const float *x, int64_t ldx, int n_rows,
                                          int n_cols, const ts_sample_req *req,
                                          unsigned long long *keys) {
    if (smp_one_kernel(c, req, n_rows)) return smp_draw_queue(c, x, ldx, n_rows, n_cols, req, keys);
    smp_queued sq =
        smp_queue(c, x, ldx, n_rows, n_cols, req, smp_any_list(req, n_rows), true, keys);
    return sq.ok ? (unsigned long long *)sq.h : nullptr;
}

unsigned long long *cuda_sample_queue_ids(cuda_ctx *c, float *x, int64_t ldx, int n_rows,
                                          int n_cols, const ts_sample_req *req,
                                          unsigned long long *keys) {
    cuda_sample_adjust(c, x, ldx, n_rows, n_cols, req);
    return smp_queue_keys(c, x, ldx, n_rows, n_cols, req, keys);
}

void cuda_op_sample(ts_backend *be, float *x, int64_t ldx, int n_rows, int n_cols,
                    const ts_sample_req *req, ts_sample_res *res) {
    cuda_ctx *c = cuda_of(be);
    if (n_rows <= 0) return;
    cuda_sample_adjust(c, x, ldx, n_rows, n_cols, req);
    bool any_draw = false;
    for (int r = 0; r < n_rows; r++)
        any_draw |= !smp_greedy(req[r]);
    if (!any_draw) { /* greedy rows only: the argmax op's two kernels */
        int32_t *ids = (int32_t *)malloc((size_t)n_rows * sizeof *ids);
        if (ids) cuda_op_argmax(be, x, ldx, n_rows, n_cols, ids);
        for (int r = 0; r < n_rows; r++)
            res[r].id = ids ? ids[r] : -1, res[r].n = 0;
        free(ids);
        return;
    }
    if (cuda_sample_all_end(c, req, n_rows, n_cols)) { /* the ids as keys */
        unsigned long long *h = smp_queue_keys(c, x, ldx, n_rows, n_cols, req, nullptr);
        cq_flush(c);
        cuda_keys_drawn(h, n_rows, h && !c->failed, res);
        return;
    }
    smp_queued sq =
        smp_queue(c, x, ldx, n_rows, n_cols, req, smp_any_list(req, n_rows), false, nullptr);
    cq_flush(c);
    bool ok = sq.ok && !c->failed;
    const smp_row *hh = (const smp_row *)sq.h;
    for (int r = 0; r < n_rows; r++) {
        ts_sample_res *o = &res[r];
        o->n = 0;
        o->total = 0;
        if (!ok) {
            o->id = -1; /* with n 0: the engine reports the failure */
            continue;
        }
        o->id = hh[r].id;
        if (o->id >= 0) continue;
        int n = hh[r].count;
        o->n = n;
        o->total = hh[r].total;
        size_t b = sq.list_cap * sizeof(float);
        size_t first = (size_t)n < sq.list_cap ? (size_t)n : sq.list_cap;
        memcpy(o->logit, sq.h + sq.hdr_bytes + r * b, first * sizeof(float));
        memcpy(o->tok, sq.h + sq.hdr_bytes + sq.list_bytes + r * b, first * sizeof(int32_t));
        if ((size_t)n > first) { /* the rest straight from the device: the step is done */
            size_t rest = (size_t)n - first;
            ok = cuda_check(c,
                            cudaMemcpy(o->logit + first, sq.lg + (size_t)r * n_cols + first,
                                       rest * sizeof(float), cudaMemcpyDeviceToHost),
                            "sample list download") &&
                 cuda_check(c,
                            cudaMemcpy(o->tok + first, sq.tk + (size_t)r * n_cols + first,
                                       rest * sizeof(int32_t), cudaMemcpyDeviceToHost),
                            "sample list download");
            if (!ok) o->n = 0;
        }
    }
}

bool cuda_sample_held(cuda_ctx *c, const float *x, int64_t ldx, int n_rows, int n_cols,
                      const ts_sample_req *req, unsigned long long *fed, int32_t *out_ids) {
    if (!cuda_sample_all_end(c, req, n_rows, n_cols)) return false; /* a list for the host */
    unsigned long long *h = smp_queue_keys(c, x, ldx, n_rows, n_cols, req, fed);
    if (!h) return false;
    cq_defer d = {cuda_keys_done, h, out_ids, n_rows, nullptr};
    cq_defer_add(c, &d);
    return true;
}
